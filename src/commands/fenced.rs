//! `fencecron put`, `get` and `stale`.

use std::io::Read;

use base64::Engine as _;
use serde_json::json;

use crate::cli::{Cli, GetArgs, PutArgs, StaleArgs};
use crate::domain::{self, StaleReason};
use crate::error::{Error, Exit, Result};
use crate::fence;
use crate::guard::GuardDb;
use crate::names::Name;
use crate::output::{self, Align, Out, Table};
use crate::store::{OpenOptions, OwnerId, PutOutcome, PutRequest, RejectReason, StoreTime, Token};

use super::{owner_id_arg, print_json, Context};

/// The resource from `--resource` or the job's environment.
fn resource(flag: &Option<String>) -> Result<Name> {
    let r = flag.as_deref().ok_or_else(|| {
        Error::Usage(
            "no resource given; pass --resource R or run inside a fencecron job (FENCECRON_RESOURCE)"
                .to_string(),
        )
    })?;
    Name::parse("resource", r).map_err(Error::Usage)
}

/// The owner id from `--owner-id` or the job's environment: required.
fn owner_id(flag: &Option<String>) -> Result<OwnerId> {
    let o = flag.as_deref().ok_or_else(|| {
        Error::Usage(
            "no owner id given; pass --owner-id O with the owner_id that `fencecron lease acquire` printed with the token, or run inside a fencecron job ($FENCECRON_OWNER_ID)"
                .to_string(),
        )
    })?;
    owner_id_arg(o)
}

pub async fn put(cli: &Cli, args: &PutArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let resource = resource(&args.resource)?;
    let key = Name::parse("key", &args.key).map_err(Error::Usage)?;
    let token = args.token.ok_or_else(|| {
        Error::Usage(
            "no token given; pass --token T or run inside a fencecron job (FENCECRON_TOKEN)"
                .to_string(),
        )
    })?;
    if token < Token::new(1) {
        return Err(Error::Usage(format!(
            "token {token} is not a fencing token; tokens start at 1"
        )));
    }
    let owner = owner_id(&args.owner_id)?;
    let stage = Name::parse("stage", &args.stage).map_err(Error::Usage)?;
    let (value, from) = match (&args.value, &args.file) {
        (Some(v), _) => (v.clone().into_bytes(), "--value".to_string()),
        (None, Some(f)) => (
            std::fs::File::open(f)
                .and_then(read_capped)
                .map_err(|e| Error::Usage(format!("cannot read --file {}: {e}", f.display())))?,
            format!("--file {}", f.display()),
        ),
        (None, None) => (
            read_capped(std::io::stdin().lock())
                .map_err(|e| Error::Runtime(format!("cannot read the value from stdin: {e}")))?,
            "stdin".to_string(),
        ),
    };
    if value.len() > fence::MAX_VALUE_BYTES {
        return Err(Error::Usage(format!(
            "the value from {from} is larger than {} bytes (8 MiB), the most fencecron stores under one key; keep large data elsewhere and put a reference to it (a path, a URL, a checksum) under the fence",
            fence::MAX_VALUE_BYTES
        )));
    }
    let job = std::env::var("FENCECRON_JOB").ok();
    let store = ctx.store(&OpenOptions::default()).await?;
    let req = PutRequest {
        resource: &resource,
        key: &key,
        value: &value,
        token,
        owner_id: owner,
        once: args.once,
        node: &ctx.node,
        job: job.as_deref(),
        // The job's own label; one that spells a stage of fencecron's reads
        // back as that stage (the column holds the text only).
        stage: domain::stored(stage.as_str()),
        operation_id: uuid::Uuid::new_v4(),
    };
    match fence::put(store.as_ref(), &req).await? {
        PutOutcome::Accepted { written_at } => {
            writeln!(
                Out::stdout(),
                "accepted: {resource}/{key} token={token} written_at={written_at}"
            )?;
            Ok(Exit::Success)
        }
        PutOutcome::AlreadyApplied => {
            writeln!(
                Out::stdout(),
                "already applied: {resource}/{key} token={token}; nothing changed"
            )?;
            Ok(Exit::Success)
        }
        PutOutcome::Rejected(rec) => {
            if job.is_some() {
                // Inside a job: hand the rejection to the daemon's log.
                if let Some(line) = fence::job_report_line(&rec) {
                    output::error_line_raw(&line);
                }
            }
            let why = match rec.reason {
                StaleReason::Rejected(RejectReason::Forged) => format!(
                    "token {token} is larger than any token ever issued for {resource} (forged); use the token of a lease you acquired"
                ),
                StaleReason::Rejected(RejectReason::WrongOwner) => format!(
                    "token {token} of {resource} was issued to another owner, not to {owner} (wrong owner); write with the owner id and token of your own lease of {resource}, not another resource's (tokens count per resource)"
                ),
                _ => format!(
                    "{} has been issued for {resource} since, so token {token} is stale; this owner has been replaced and must stop",
                    rec.accepted_token
                        .map_or_else(|| "a newer token".to_string(), |t| format!("token {t}"))
                ),
            };
            Err(Error::Stale(format!(
                "write to {resource}/{key} rejected: {why} (operation {})",
                rec.operation_id
            )))
        }
    }
}

/// Reads at most one byte more than [`fence::MAX_VALUE_BYTES`]: enough to
/// tell that a value is too large without holding all of it in memory.
fn read_capped(r: impl Read) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.take(fence::MAX_VALUE_BYTES as u64 + 1)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

pub async fn get(cli: &Cli, args: &GetArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let resource = resource(&args.resource)?;
    let key = Name::parse("key", &args.key).map_err(Error::Usage)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let Some(v) = store.get(&resource, &key).await? else {
        return Err(Error::Missing(format!(
            "no value is stored for key {key} of resource {resource}; check the names or write it with fencecron put"
        )));
    };
    if args.json {
        let mut obj = json!({
            "resource": v.resource,
            "key": v.key,
            "token": v.token,
            "owner_id": v.owner_id,
            "written_at": v.written_at,
        });
        match String::from_utf8(v.value) {
            Ok(text) => obj["value"] = json!(text),
            Err(e) => {
                obj["value_base64"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(e.as_bytes()))
            }
        }
        print_json(&obj)?;
    } else {
        let mut out = Out::stdout();
        out.write_all(&v.value)?;
        out.flush()?;
    }
    Ok(Exit::Success)
}

pub async fn stale(cli: &Cli, args: &StaleArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let since = match args.since {
        Some(d) => {
            let now = store.now().await?;
            Some(StoreTime(now.0 - crate::store::millis(d)))
        }
        None => None,
    };
    let mut records = store.stale(since).await?;
    for raw in &args.guard {
        let url = super::guard::db_url("--guard", raw)?;
        let guard = GuardDb::open(&url)?;
        let rows = guard.rejections(since.map_or(i64::MIN, |s| s.0)).await;
        guard.close().await;
        records.extend(rows?);
    }
    if !args.guard.is_empty() {
        // Stable: each source's own order stays for equal times.
        records.sort_by_key(|r| r.at.0);
    }
    if args.limit > 0 && records.len() > args.limit {
        records.drain(..records.len() - args.limit);
    }
    if args.json {
        print_json(&records)?;
    } else {
        let now = chrono::Utc::now();
        let mut table = Table::new(&[
            ("AT", Align::Left),
            ("", Align::Left),
            ("KIND", Align::Left),
            ("REASON", Align::Left),
            ("RESOURCE", Align::Left),
            ("KEY", Align::Left),
            ("TOKEN", Align::Right),
            ("ACCEPTED", Align::Right),
            ("NODE", Align::Left),
            ("STAGE", Align::Left),
        ]);
        for r in records {
            table.row(vec![
                r.at.to_string(),
                output::relative(now, r.at.to_utc()),
                r.kind.as_str().to_string(),
                r.reason.to_string(),
                r.resource,
                r.key.unwrap_or_else(|| "-".to_string()),
                r.token.to_string(),
                r.accepted_token
                    .map_or_else(|| "-".to_string(), |t| t.to_string()),
                r.node,
                r.stage.to_string(),
            ]);
        }
        table.print(&mut Out::stdout())?;
    }
    Ok(Exit::Success)
}
