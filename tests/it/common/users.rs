//! Users and roles a test creates on the shared servers, dropped when the
//! guard is dropped, whether the test passed or not.

use sqlx::Executor;

/// Drops a MySQL user (`'user'@'%'`) when dropped.
pub struct DropUser {
    pub admin_url: String,
    pub user: String,
}

/// Drops a PostgreSQL role when dropped (after any database holding
/// grants to it is gone).
pub struct DropRole {
    pub admin_url: String,
    pub role: String,
}

/// Runs one admin statement on a thread of its own: the test's runtime may
/// be unwinding.
fn admin(what: &str, url: String, statement: String, postgres: bool) {
    let dropped = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            if postgres {
                let admin = sqlx::PgPool::connect(&url).await?;
                admin.execute(statement.as_str()).await?;
                admin.close().await;
            } else {
                let admin = sqlx::MySqlPool::connect(&url).await?;
                admin.execute(statement.as_str()).await?;
                admin.close().await;
            }
            Ok::<_, sqlx::Error>(())
        })
    })
    .join();
    if !matches!(dropped, Ok(Ok(()))) {
        eprintln!("could not drop the test's {what}: {dropped:?}");
    }
}

impl Drop for DropUser {
    fn drop(&mut self) {
        admin(
            &format!("user {}", self.user),
            self.admin_url.clone(),
            format!("DROP USER IF EXISTS '{}'@'%'", self.user),
            false,
        );
    }
}

impl Drop for DropRole {
    fn drop(&mut self) {
        admin(
            &format!("role {}", self.role),
            self.admin_url.clone(),
            format!("DROP ROLE IF EXISTS {}", self.role),
            true,
        );
    }
}
