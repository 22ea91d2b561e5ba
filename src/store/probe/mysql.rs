//! What `check --connect` reads on MySQL/MariaDB: the grants (parsed from
//! `SHOW GRANTS`), the clock, the migrations.

use super::*;

// MySQL --------------------------------------------------------------------

/// The privileges a user needs to apply fencecron's MySQL migrations:
/// tables and their indexes, changed tables, and the stored procedures
/// (each migration drops the procedure it replaces).
pub(super) const MY_MIGRATE: [&str; 5] = [
    "CREATE",
    "ALTER",
    "INDEX",
    "CREATE ROUTINE",
    "ALTER ROUTINE",
];

pub(super) async fn mysql(pool: &sqlx::MySqlPool, url: &StoreUrl) -> Result<Probe, StoreError> {
    let err = |e| unavailable(url, e);
    let start = Instant::now();
    let mut conn = first_connection(pool).await.map_err(err)?;
    let connect_time = start.elapsed();
    let (version, user, database): (String, String, Option<String>) =
        sqlx::query_as("SELECT VERSION(), CURRENT_USER(), DATABASE()")
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
    let database = database.unwrap_or_default();

    let migrator = sqlx::migrate!("migrations/mysql");
    let status = migrator::status::<MySql>(&mut conn, Backend::MySql, &migrator).await;
    let mut migrations = migrations(Backend::MySql, url, &migrator, status)?;

    // `SHOW GRANTS` lists the grants of the user and of its active roles.
    let lines: Vec<String> = sqlx::query_scalar("SHOW GRANTS")
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let grants: Vec<Grant> = lines.iter().filter_map(|l| Grant::parse(l)).collect();
    let holds = |privilege: &str, object: Option<&str>| {
        grants
            .iter()
            .any(|g| g.grants(privilege, &database, object))
    };

    // The tables and procedures are those the migrations create: a user
    // without privileges on a table does not see it in information_schema.
    let (tables, procedures) = objects(&migrator);
    let mut rows = Vec::new();
    rows.push((
        "CREATE".to_string(),
        format!(
            "{} (every start of the daemon runs CREATE TABLE IF NOT EXISTS)",
            migrator::TABLE
        ),
        holds("CREATE", Some(migrator::TABLE)),
    ));
    for table in std::iter::once(migrator::TABLE.to_string()).chain(tables.iter().cloned()) {
        for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            rows.push((
                privilege.to_string(),
                table.clone(),
                holds(privilege, Some(&table)),
            ));
        }
    }
    for procedure in &procedures {
        rows.push((
            "EXECUTE".to_string(),
            format!("procedure {procedure}"),
            holds("EXECUTE", Some(procedure)),
        ));
    }
    let missing = lacking(&rows);
    if !migrations.pending.is_empty() {
        migrations.cannot_apply = MY_MIGRATE
            .iter()
            .filter(|p| !holds(p, None))
            .map(|p| format!("{p} on database {database}"))
            .collect();
    }

    let clock = measure!(
        conn,
        "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)"
    )
    .map_err(err)?;
    let _ = conn.detach().close().await;

    Ok(Probe {
        backend: Backend::MySql,
        answered: format!(
            "MySQL {version} at {}, database {database}, user {user}",
            host_port(&url.to_string(), Backend::MySql)
        ),
        user,
        connect_time: Some(connect_time),
        migrations,
        missing,
        checked: format!(
            "SELECT, INSERT, UPDATE, DELETE on {} fencecron tables; EXECUTE on {} procedures",
            tables.len() + 1,
            procedures.len()
        ),
        clock,
        read_only: None,
    })
}

/// One line of MySQL's `SHOW GRANTS`: `GRANT privileges ON target TO …`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Grant {
    /// Upper case; `ALL` for `ALL PRIVILEGES`. Column privileges
    /// (`SELECT (a, b)`) are left out: they do not cover a whole table.
    privileges: Vec<String>,
    target: Target,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Target {
    /// `*.*`
    Global,
    /// `db`.*, a pattern (`_` and `%` are wildcards, `\_` a literal `_`).
    Database(String),
    /// `db`.`table`, or `PROCEDURE db`.`name`.
    Object(String, String),
}

impl Grant {
    fn parse(line: &str) -> Option<Grant> {
        let rest = line.strip_prefix("GRANT ")?;
        let on = rest.find(" ON ")?;
        let (privs, rest) = (&rest[..on], &rest[on + 4..]);
        let to = rest.rfind(" TO ")?;
        let target = rest[..to].trim();
        let target = ["PROCEDURE ", "FUNCTION ", "PACKAGE BODY ", "PACKAGE "]
            .iter()
            .find_map(|p| target.strip_prefix(p))
            .unwrap_or(target);
        let (db, object) = split_target(target)?;
        let target = match (db.as_str(), object.as_str()) {
            ("*", "*") => Target::Global,
            (_, "*") => Target::Database(db),
            _ => Target::Object(db, object),
        };
        let mut privileges = Vec::new();
        let mut depth = 0;
        let mut current = String::new();
        for c in privs.chars().chain(std::iter::once(',')) {
            match c {
                '(' => {
                    depth += 1;
                    current.push(c);
                }
                ')' => {
                    depth -= 1;
                    current.push(c);
                }
                ',' if depth == 0 => {
                    let p = current.trim().to_ascii_uppercase();
                    if !p.contains('(') && !p.is_empty() {
                        privileges.push(if p == "ALL PRIVILEGES" {
                            "ALL".into()
                        } else {
                            p
                        });
                    }
                    current.clear();
                }
                _ => current.push(c),
            }
        }
        Some(Grant { privileges, target })
    }

    /// Whether this grant gives `privilege` on `object` (a table or
    /// procedure of `database`), or on the whole database when `object` is
    /// `None`.
    fn grants(&self, privilege: &str, database: &str, object: Option<&str>) -> bool {
        if !self.privileges.iter().any(|p| p == privilege || p == "ALL") {
            return false;
        }
        match &self.target {
            Target::Global => true,
            Target::Database(pattern) => like(pattern, database),
            Target::Object(db, name) => {
                db == database && object.is_some_and(|o| o.eq_ignore_ascii_case(name))
            }
        }
    }
}

/// `db`.`object` (backquoted, with doubled backquotes inside, or bare).
pub(super) fn split_target(target: &str) -> Option<(String, String)> {
    let mut parts = Vec::new();
    let mut chars = target.chars().peekable();
    while parts.len() < 2 {
        let mut part = String::new();
        if chars.peek() == Some(&'`') {
            chars.next();
            loop {
                match chars.next()? {
                    '`' if chars.peek() == Some(&'`') => {
                        chars.next();
                        part.push('`');
                    }
                    '`' => break,
                    c => part.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                part.push(c);
                chars.next();
            }
        }
        parts.push(part);
        if parts.len() < 2 && chars.next() != Some('.') {
            return None;
        }
    }
    let object = parts.pop()?;
    Some((parts.pop()?, object))
}

/// SQL `LIKE` with `\` as the escape, as MySQL matches a database-level
/// grant's name.
pub(super) fn like(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('%') => (0..=t.len()).any(|i| go(&p[1..], &t[i..])),
            Some('_') => !t.is_empty() && go(&p[1..], &t[1..]),
            Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && go(&p[2..], &t[1..]),
            Some(c) => t.first() == Some(c) && go(&p[1..], &t[1..]),
        }
    }
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    go(&p, &t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_read_from_show_grants() {
        let g = Grant::parse("GRANT SELECT, INSERT, UPDATE (`a`, `b`) ON `wt\\_x`.* TO `u`@`%`")
            .unwrap();
        assert_eq!(g.privileges, ["SELECT", "INSERT"]);
        assert_eq!(g.target, Target::Database("wt\\_x".into()));
        assert!(g.grants("SELECT", "wt_x", Some("fencecron_leases")));
        assert!(!g.grants("UPDATE", "wt_x", Some("fencecron_leases")));
        assert!(!g.grants("SELECT", "wtax", None));
        let all = Grant::parse(
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` IDENTIFIED BY PASSWORD '*AB' WITH GRANT OPTION",
        )
        .unwrap();
        assert!(all.grants("CREATE ROUTINE", "any", None));
        let table = Grant::parse("GRANT DELETE ON `db`.`fencecron_leases` TO `r`").unwrap();
        assert!(table.grants("DELETE", "db", Some("fencecron_leases")));
        assert!(!table.grants("DELETE", "db", Some("fencecron_values")));
        assert!(!table.grants("DELETE", "db", None));
        let proc_ = Grant::parse(
            "GRANT EXECUTE, ALTER ROUTINE ON PROCEDURE `db`.`fencecron_claim_v1` TO `u`@`%`",
        )
        .unwrap();
        assert!(proc_.grants("EXECUTE", "db", Some("fencecron_claim_v1")));
        assert_eq!(Grant::parse("GRANT `role` TO `u`@`%`"), None);
        // Wildcards in a database-level grant.
        assert!(like("wt%", "wt_connect") && like("w_", "wt") && !like("w\\_", "wt"));
    }
}
