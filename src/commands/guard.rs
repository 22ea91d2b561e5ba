//! `fencecron guard install|ddl|record`: the SQL guard in a job's own
//! database (see [`crate::guard`]). None of these touches
//! fencecron's store or needs a config: the database is named by `--db`.

use crate::cli::{GuardBackend, GuardCommand};
use crate::error::{Error, Exit, Result};
use crate::events;
use crate::fence;
use crate::guard::{self, GuardDb, GuardReport, Recorded};
use crate::names::Name;
use crate::output::{self, Out};
use crate::store::{Backend, StoreUrl, Token};

use super::print_json;

pub async fn run(cmd: &GuardCommand) -> Result<Exit> {
    match cmd {
        GuardCommand::Install { db } => install(&db.url).await,
        GuardCommand::Ddl { backend } => {
            Out::stdout().write_all(guard::script(backend_of(*backend)).as_bytes())?;
            Ok(Exit::Success)
        }
        GuardCommand::Trigger {
            backend,
            table,
            column,
            resource,
        } => {
            let resource = Name::parse("resource", resource).map_err(Error::Usage)?;
            let ddl = guard::trigger_script(backend_of(*backend), table, column, &resource)
                .map_err(Error::Usage)?;
            Out::stdout().write_all(ddl.as_bytes())?;
            Ok(Exit::Success)
        }
        GuardCommand::Record {
            db,
            resource,
            token,
            json,
        } => record(&db.url, resource.as_deref(), *token, *json).await,
    }
}

fn backend_of(b: GuardBackend) -> Backend {
    match b {
        GuardBackend::Postgres => Backend::Postgres,
        GuardBackend::Mysql => Backend::MySql,
        GuardBackend::Sqlite => Backend::Sqlite,
    }
}

/// `--db URL` (or `--guard URL`) parsed as a store URL; the message never
/// shows its password.
/// A SQLite file must exist: the guard goes into the job's existing
/// database, and a typo must not create an empty one that guards nothing.
pub(super) fn db_url(flag: &str, raw: &str) -> Result<StoreUrl> {
    let url = StoreUrl::parse(raw)
        .map(StoreUrl::absolutize)
        .map_err(|m| Error::Usage(format!("{flag}: {m}")))?;
    if url.backend() == Backend::Sqlite {
        let rest = url.expose().trim_start_matches("sqlite:");
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or(rest);
        let in_memory = path == ":memory:" || rest.contains("mode=memory");
        if !in_memory && !std::path::Path::new(path).exists() {
            return Err(Error::Usage(format!(
                "{flag}: the SQLite database {path} does not exist; name the job's existing database file (fencecron does not create one for the guard)"
            )));
        }
    }
    Ok(url)
}

async fn install(db: &str) -> Result<Exit> {
    let url = db_url("--db", db)?;
    let guard = GuardDb::open(&url)?;
    let done = guard.install().await;
    guard.close().await;
    done?;
    let check = match url.backend() {
        Backend::Postgres => "SELECT fencecron_guard($1, $2)",
        Backend::MySql => "CALL fencecron_guard(?, ?)",
        Backend::Sqlite => "INSERT INTO fencecron_guard_check (resource, token) VALUES (?, ?)",
    };
    writeln!(
        Out::stdout(),
        "installed the SQL guard in {url}: tables fencecron_guard and fencecron_guard_rejections; in each transaction a job runs, with FENCECRON_RESOURCE and FENCECRON_TOKEN: {check}"
    )?;
    Ok(Exit::Success)
}

async fn record(
    db: &str,
    resource: Option<&str>,
    token: Option<Token>,
    json: bool,
) -> Result<Exit> {
    let url = db_url("--db", db)?;
    let resource = resource.ok_or_else(|| {
        Error::Usage(
            "no resource given; pass --resource R or run inside a fencecron job (FENCECRON_RESOURCE)"
                .to_string(),
        )
    })?;
    let resource = Name::parse("resource", resource).map_err(Error::Usage)?;
    let token = token.ok_or_else(|| {
        Error::Usage(
            "no token given; pass --token T or run inside a fencecron job (FENCECRON_TOKEN)"
                .to_string(),
        )
    })?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (node, job, owner) = (
        env("FENCECRON_NODE").unwrap_or_else(super::hostname),
        env("FENCECRON_JOB"),
        // Set by fencecron for its jobs; anything else is not an owner id
        // it issued and is not recorded as one.
        env("FENCECRON_OWNER_ID").and_then(|o| o.parse().ok()),
    );
    let guard = GuardDb::open(&url)?;
    let found = guard
        .record(&GuardReport {
            resource: &resource,
            token,
            node: Some(&node),
            job: job.as_deref(),
            owner_id: owner,
        })
        .await;
    guard.close().await;
    match found? {
        Recorded::NotStale { highest } => Err(Error::Runtime(format!(
            "the guard in {url} did not refuse token {token} of {resource} ({}): nothing recorded; the transaction failed for another reason, see the job's own error",
            highest.map_or_else(
                || "it has accepted no token for it".to_string(),
                |h| format!("the highest it accepted is {h}")
            )
        ))),
        Recorded::Rejection { record, new } => {
            events::stale_write_rejected(&record);
            if job.is_some() {
                // Inside a job: hand the rejection to the daemon's log, as
                // `fencecron put` does.
                if let Some(line) = fence::job_report_line(&record) {
                    output::error_line_raw(&line);
                }
            }
            if json {
                print_json(&record)?;
            } else {
                writeln!(
                    Out::stdout(),
                    "{}: token {token} of {resource} refused by the guard in {url}, which has accepted token {} (operation {})",
                    if new { "recorded" } else { "already recorded" },
                    record.accepted_token.unwrap_or_default(),
                    record.operation_id
                )?;
            }
            Ok(Exit::Success)
        }
    }
}
