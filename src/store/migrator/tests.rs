use std::borrow::Cow;

use sqlx::migrate::MigrationType;

use super::*;

fn migration(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        Cow::Borrowed(description),
        MigrationType::Simple,
        Cow::Borrowed(sql),
        false,
    )
}

fn row(m: &Migration) -> Applied {
    Applied {
        version: m.version,
        description: m.description.to_string(),
        checksum: m.checksum.to_vec(),
        success: true,
    }
}

fn known() -> Vec<Migration> {
    vec![
        migration(1, "init", "CREATE TABLE a (x INT);"),
        migration(2, "more", "CREATE TABLE b (x INT);"),
        migration(3, "most", "CREATE TABLE c (x INT);"),
    ]
}

#[test]
fn a_fresh_database_applies_everything() {
    let p = plan(&known(), &[], &[]).unwrap();
    assert_eq!(p.apply, vec![1, 2, 3]);
    assert!(p.adopt.is_empty() && p.forget.is_empty());
}

#[test]
fn legacy_rows_are_adopted_not_applied_and_foreign_rows_untouched() {
    let k = known();
    let app = Applied {
        version: 20240101000000,
        description: "users".into(),
        checksum: vec![7; 48],
        success: true,
    };
    // An application's version 2 with its own description and SQL.
    let app_two = Applied {
        version: 2,
        description: "app two".into(),
        checksum: vec![9; 48],
        success: true,
    };
    let p = plan(&k, &[], &[row(&k[0]), app.clone()]).unwrap();
    assert_eq!(p.adopt, vec![(1, k[0].checksum.to_vec())]);
    assert_eq!(p.apply, vec![2, 3]);
    let p = plan(&k, &[row(&k[0])], &[app_two, app]).unwrap();
    assert!(p.adopt.is_empty() && p.forget.is_empty(), "{p:?}");
    assert_eq!(p.apply, vec![2, 3]);
    // An application's own `0001_init.sql`, before fencecron's first
    // start: same version and description, other SQL.
    let app_init = Applied {
        version: 1,
        description: "init".into(),
        checksum: vec![5; 48],
        success: true,
    };
    let p = plan(&k, &[], &[app_init]).unwrap();
    assert!(p.adopt.is_empty() && p.forget.is_empty(), "{p:?}");
    assert_eq!(p.apply, vec![1, 2, 3]);
}

#[test]
fn rows_an_older_binary_recorded_again_are_forgotten() {
    let k = known();
    let mut dirty = row(&k[1]);
    dirty.success = false;
    let p = plan(&k, &[row(&k[0]), row(&k[1])], &[row(&k[0]), dirty]).unwrap();
    assert_eq!(
        p.forget,
        vec![(1, k[0].checksum.to_vec()), (2, k[1].checksum.to_vec())]
    );
    assert_eq!(p.apply, vec![3]);
}

#[test]
fn refusals() {
    let k = known();
    let mut changed = row(&k[1]);
    changed.checksum = vec![0; 48];
    assert!(matches!(
        plan(&k, &[row(&k[0]), changed.clone()], &[]),
        Err(MigrateError::VersionMismatch(2))
    ));
    // The same in the legacy table: same description, other checksum.
    assert!(matches!(
        plan(&k, &[], &[row(&k[0]), changed]),
        Err(MigrateError::VersionMismatch(2))
    ));
    let newer = Applied {
        version: 4,
        description: "future".into(),
        checksum: vec![1; 48],
        success: true,
    };
    assert!(matches!(
        plan(&k, &[row(&k[0]), newer], &[]),
        Err(MigrateError::VersionMissing(4))
    ));
    let mut partial = row(&k[2]);
    partial.success = false;
    assert!(matches!(
        plan(&k, &[row(&k[0]), partial.clone()], &[]),
        Err(MigrateError::Dirty(3))
    ));
    assert!(matches!(
        plan(&k, &[], &[row(&k[0]), partial]),
        Err(MigrateError::Dirty(3))
    ));
}

/// Records the notices a store tells its hook.
#[derive(Default)]
struct Heard(std::sync::Mutex<Vec<(String, String)>>);

impl super::super::StoreHook for Heard {
    fn called(&self, _: &'static str, _: std::time::Duration, _: super::super::CallEnd) {}

    fn noticed(&self, notice: Notice<'_>) {
        if let Notice::MigrationGuardFailed { guard, error } = notice {
            self.0
                .lock()
                .unwrap()
                .push((guard.to_string(), error.to_string()));
        }
    }
}

/// A guard that cannot be put on `_sqlx_migrations` (here: a database
/// this connection may not write) is not an error of the migration:
/// the store tells its hook, whose owner logs `migration_guard_failed`.
#[tokio::test]
async fn a_guard_that_cannot_be_created_is_told_to_the_hook() {
    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::ConnectOptions;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legacy.db");
    let mut rw = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .connect()
        .await
        .unwrap();
    sqlx::query("CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY)")
        .execute(&mut rw)
        .await
        .unwrap();
    rw.close().await.unwrap();
    let mut ro = SqliteConnectOptions::new()
        .filename(&path)
        .read_only(true)
        .connect()
        .await
        .unwrap();
    let heard = std::sync::Arc::new(Heard::default());
    let hook: Hook = Some(heard.clone());
    guard_legacy::<sqlx::Sqlite>(&mut ro, Backend::Sqlite, &[], &hook).await;
    let told = heard.0.lock().unwrap().clone();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, GUARD);
    assert!(told[0].1.contains("readonly"), "{told:?}");
}
