//! What `check --connect` reads on PostgreSQL: privileges, ownership, the
//! clock, the migrations.

use super::*;

// PostgreSQL ---------------------------------------------------------------

/// Every fencecron table and sequence in the schema unqualified names find,
/// with each privilege the daemon uses on it and whether the user has it.
pub(super) const PG_TABLE_PRIVILEGES: &str = "SELECT p.priv, c.relname::text,
        CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(c.oid, p.priv)
             ELSE has_table_privilege(c.oid, p.priv) END
   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  CROSS JOIN LATERAL unnest(CASE WHEN c.relkind = 'S' THEN ARRAY['USAGE']
                                 ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END)
        WITH ORDINALITY AS p(priv, n)
  WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S')
    AND c.relname LIKE 'fencecron\\_%'
  ORDER BY c.relname, p.n";

/// fencecron's functions in that schema, and whether the user may call them.
pub(super) const PG_FUNCTION_PRIVILEGES: &str = "SELECT 'EXECUTE', p.proname::text || '()',
        has_function_privilege(p.oid, 'EXECUTE')
   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = current_schema() AND p.proname LIKE 'fencecron\\_%'
  ORDER BY p.proname";

/// fencecron's tables and functions the user does not own (as owner or
/// member of the owning role): a migration that alters or replaces one
/// fails.
pub(super) const PG_NOT_OWNED: &str = "SELECT c.relname::text FROM pg_class c
   JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
    AND c.relname LIKE 'fencecron\\_%' AND NOT pg_has_role(c.relowner, 'USAGE')
  UNION ALL
 SELECT p.proname::text || '()' FROM pg_proc p
   JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = current_schema() AND p.proname LIKE 'fencecron\\_%'
    AND NOT pg_has_role(p.proowner, 'USAGE')
  ORDER BY 1";

pub(super) async fn postgres(
    pool: &sqlx::PgPool,
    hosts: Option<&Hosts>,
    url: &StoreUrl,
) -> Result<Probe, StoreError> {
    let err = |e| unavailable(url, e);
    let start = Instant::now();
    let mut conn = pg_first_connection(hosts, pool).await.map_err(err)?;
    let connect_time = start.elapsed();
    let row = sqlx::query(
        "SELECT current_setting('server_version'), current_user::text, current_database()::text,
                current_schema()::text,
                COALESCE(has_schema_privilege(current_schema(), 'CREATE'), FALSE),
                pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(err)?;
    let (version, user, database): (String, String, String) = (
        row.try_get(0).map_err(err)?,
        row.try_get(1).map_err(err)?,
        row.try_get(2).map_err(err)?,
    );
    let schema: Option<String> = row.try_get(3).map_err(err)?;
    let can_create: bool = row.try_get(4).map_err(err)?;
    let (standby, read_only): (bool, bool) =
        (row.try_get(5).map_err(err)?, row.try_get(6).map_err(err)?);
    let read_only = match (standby, read_only) {
        (true, _) => Some("a standby (in recovery)".to_string()),
        (false, true) => Some("read-only (default_transaction_read_only is on)".to_string()),
        (false, false) => None,
    };

    let migrator = sqlx::migrate!("migrations/postgres");
    let status = migrator::status::<Postgres>(&mut conn, Backend::Postgres, &migrator).await;
    let mut migrations = migrations(Backend::Postgres, url, &migrator, status)?;

    // Every start runs `CREATE TABLE IF NOT EXISTS fencecron_migrations`,
    // which PostgreSQL refuses without CREATE on the schema even when the
    // table exists.
    let create = match &schema {
        Some(s) => format!("CREATE on schema {s}"),
        None => "a schema to create tables in (none of the search_path exists)".to_string(),
    };
    let mut missing = Vec::new();
    if !can_create {
        missing.push(format!(
            "{create} (every start of the daemon runs CREATE TABLE IF NOT EXISTS {})",
            migrator::TABLE
        ));
    }
    let mut rows: Vec<(String, String, bool)> = sqlx::query_as(PG_TABLE_PRIVILEGES)
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let tables = rows.iter().filter(|r| r.0 == "SELECT").count();
    let functions: Vec<(String, String, bool)> = sqlx::query_as(PG_FUNCTION_PRIVILEGES)
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let function_count = functions.len();
    rows.extend(functions);
    missing.extend(lacking(&rows));

    if !migrations.pending.is_empty() {
        if !can_create {
            migrations.cannot_apply.push(create.clone());
        }
        let not_owned: Vec<String> = sqlx::query_scalar(PG_NOT_OWNED)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?;
        migrations
            .cannot_apply
            .extend(not_owned.into_iter().map(|o| format!("ownership of {o}")));
    }

    let clock = measure!(
        conn,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    )
    .map_err(err)?;
    // Not pooled again: the pool is closed after this look anyway.
    let _ = conn.detach().close().await;

    Ok(Probe {
        backend: Backend::Postgres,
        answered: format!(
            "PostgreSQL {version} at {}, database {database}, user {user}",
            match hosts {
                // The host the walk chose, of the URL's several.
                Some(h) => h.current().to_string(),
                None => host_port(&url.to_string(), Backend::Postgres),
            }
        ),
        user,
        connect_time: Some(connect_time),
        migrations,
        missing,
        checked: if tables == 0 {
            format!("{create}; no fencecron tables yet")
        } else {
            format!(
                "{create}; SELECT, INSERT, UPDATE, DELETE on {tables} fencecron tables; EXECUTE on {function_count} fencecron functions"
            )
        },
        clock,
        read_only,
    })
}
