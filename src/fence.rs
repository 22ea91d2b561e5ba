//! The write boundary: fenced writes and stale-owner records.
//!
//! A lease only chooses a worker; the fence protects the data. Every
//! rejection is recorded in the store (in the same transaction as the
//! refusal, for `put`) *and* logged as a stale-owner event here, so log
//! monitoring and `fencecron stale` see the same facts.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::domain::{self, Stage, StaleReason};
use crate::events;
use crate::store::{
    Lease, NewStaleRecord, OwnerId, PutOutcome, PutRequest, StaleKind, StaleRecord, Store,
    StoreError, StoreTime, Token,
};

/// The largest value `fencecron put` stores under one key: 8 MiB. A fenced
/// value is a result, a marker or a reference, not bulk data, and this is a
/// size every supported server takes with its default settings (MariaDB's
/// `max_allowed_packet` is 16 MiB, MySQL 8's 64 MiB; PostgreSQL and SQLite
/// take about 1 GB), so a value that fits works on every backend. It also
/// bounds the memory `put` needs, since the value is read whole before it
/// is sent. A MySQL server configured below that still refuses with an
/// error naming `max_allowed_packet`.
pub const MAX_VALUE_BYTES: usize = 8 * 1024 * 1024;

/// Sends a fenced write; a rejection is logged as `stale_write_rejected`.
pub(crate) async fn put(store: &dyn Store, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError> {
    let outcome = store.put(req).await?;
    if let PutOutcome::Rejected(rec) = &outcome {
        events::stale_write_rejected(rec);
    }
    Ok(outcome)
}

/// The prefix of the line a `fencecron put` run inside a job writes to its
/// stderr when its write is rejected, followed by the stored record as JSON
/// (the shape `fencecron stale --json` prints). The daemon that runs the job
/// turns that line into its own top-level `stale_write_rejected` event, so an
/// alert on that event sees rejections inside jobs too, not only as text in
/// a `job_output` line.
pub(crate) const JOB_REPORT_PREFIX: &str = "FENCECRON_STALE_WRITE ";

/// The line [`JOB_REPORT_PREFIX`] introduces, for `rec`.
pub(crate) fn job_report_line(rec: &StaleRecord) -> Option<String> {
    serde_json::to_string(rec)
        .ok()
        .map(|json| format!("{JOB_REPORT_PREFIX}{json}"))
}

/// The rejection a job's output line reports, if it is such a line from
/// the job named `job`. The record in the store is the authority; this line
/// only carries it to the daemon's log.
pub(crate) fn parse_job_report(line: &str, job: &str) -> Option<StaleRecord> {
    let r: JobReport = serde_json::from_str(line.strip_prefix(JOB_REPORT_PREFIX)?).ok()?;
    (r.job.as_deref() == Some(job)).then_some(StaleRecord {
        at: r.at,
        kind: StaleKind::WriteRejected,
        reason: domain::stored(&r.reason),
        resource: r.resource,
        key: r.key,
        // A job's line: an owner id that is not one is not shown as one.
        owner_id: r.owner_id.and_then(|o| o.parse().ok()),
        token: r.token,
        accepted_token: r.accepted_token,
        node: r.node,
        job: r.job,
        stage: domain::stored(&r.stage),
        operation_id: r.operation_id,
    })
}

/// What [`parse_job_report`] reads of a [`StaleRecord`]'s JSON: every field
/// but `kind` (a job reports only rejected writes); other fields are
/// ignored.
#[derive(serde::Deserialize)]
struct JobReport {
    at: StoreTime,
    reason: String,
    resource: String,
    key: Option<String>,
    owner_id: Option<String>,
    token: Token,
    accepted_token: Option<Token>,
    node: String,
    job: Option<String>,
    stage: String,
    operation_id: String,
}

/// Stores a stale-owner record that happened outside `put` (a lost lease, a
/// rejection a job reports from its own storage). A failure to store it is
/// logged; the caller has already logged the event itself.
pub(crate) async fn record(store: &dyn Store, rec: &NewStaleRecord<'_>) -> Option<StaleRecord> {
    match store.record_stale(rec).await {
        Ok(r) => Some(r),
        Err(e) => {
            events::stale_record_failed(rec.resource, &e.to_string());
            None
        }
    }
}

/// A stale-owner record to store from a background task (owned, so it can
/// outlive its caller). The operation id is made up when it is stored.
#[derive(Debug, Clone)]
pub(crate) struct PendingRecord {
    pub(crate) kind: StaleKind,
    pub(crate) reason: StaleReason,
    pub(crate) resource: String,
    pub(crate) owner_id: OwnerId,
    pub(crate) token: Token,
    pub(crate) accepted_token: Option<Token>,
    pub(crate) node: String,
    pub(crate) job: Option<String>,
    pub(crate) stage: Stage,
}

/// How long [`record_in_background`] keeps trying before giving up: 6 h.
/// The outages that keep a record out are the ones an operator has to fix
/// (a full disk, a database that is down), so the window must cover the
/// time it takes someone to be paged and act, not a blip: a window of a few
/// minutes (it was 10 attempts, about 150 s) lost the very `lease_lost`
/// records a full disk produced. A pending record costs a small task and
/// one `store_unavailable` line a minute; records are lost anyway when the
/// daemon stops before the store is back (the event itself is logged).
const RECORD_WINDOW: Duration = Duration::from_secs(6 * 60 * 60);

/// The longest pause between two attempts to store a record.
const RECORD_MAX_DELAY: Duration = Duration::from_secs(60);

/// Stores a stale-owner record without making the caller wait: a background
/// task keeps trying for up to [`RECORD_WINDOW`], backing off from 1 s to
/// 60 s while the store fails (each failure logged as `store_unavailable`,
/// giving up as `stale_record_failed`). The caller has already logged the
/// event itself. The task is returned so a short-lived command can let it
/// finish before it exits; the daemon lets it run.
pub(crate) fn record_in_background(store: Arc<dyn Store>, rec: PendingRecord) -> JoinHandle<()> {
    tokio::spawn(async move {
        let op = uuid::Uuid::new_v4().to_string();
        let new = NewStaleRecord {
            kind: rec.kind,
            reason: rec.reason.clone(),
            resource: &rec.resource,
            key: None,
            owner_id: Some(rec.owner_id),
            token: rec.token,
            accepted_token: rec.accepted_token,
            node: &rec.node,
            job: rec.job.as_deref(),
            stage: rec.stage.clone(),
            operation_id: &op,
        };
        let mut backoff = Backoff::new(Duration::from_secs(1), RECORD_MAX_DELAY)
            .until(tokio::time::Instant::now() + RECORD_WINDOW);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let e = match store.record_stale(&new).await {
                Ok(_) => {
                    match rec.job.as_deref() {
                        Some(job) => events::store_answered(store.outages(), job),
                        None => events::store_answered_all(store.outages()),
                    }
                    return;
                }
                Err(e) => e,
            };
            let retry = backoff.next();
            events::store_unavailable(
                store.outages(),
                "record_stale",
                rec.job.as_deref(),
                &e.to_string(),
                retry,
            );
            let Some(delay) = retry else {
                break;
            };
            tokio::time::sleep(delay).await;
        }
        events::stale_record_failed(
            &rec.resource,
            &format!(
                "gave up after {attempts} attempts in {}",
                humantime::format_duration(RECORD_WINDOW)
            ),
        );
    })
}

/// After a winning acquire: when it took over a lease that expired without
/// being released, logs `lease_taken_over` and stores a `lease_taken_over`
/// stale-owner record (the vanished owner's id, token and node; the new
/// token as `accepted_token`) in the background. Returns the recording
/// task, if there is one.
pub(crate) fn taken_over(
    store: &Arc<dyn Store>,
    job: Option<&str>,
    lease: &Lease,
    node: &str,
) -> Option<JoinHandle<()>> {
    let previous = lease.taken_over.as_ref()?;
    events::lease_taken_over(job, lease, previous, node);
    Some(record_in_background(
        store.clone(),
        PendingRecord {
            kind: StaleKind::LeaseTakenOver,
            reason: StaleReason::ExpiredUnreleased,
            resource: lease.resource.clone(),
            owner_id: previous.owner_id,
            token: previous.token,
            accepted_token: Some(lease.token),
            node: previous.node.clone(),
            job: job.map(str::to_string),
            stage: Stage::Acquire,
        },
    ))
}

/// Lets a recording task of a command that is about to exit finish, for at
/// most `limit`; a record still not stored then is reported as failed.
pub(crate) async fn finish_recording(
    task: Option<JoinHandle<()>>,
    resource: &str,
    limit: Duration,
) {
    if let Some(task) = task {
        if tokio::time::timeout(limit, task).await.is_err() {
            events::stale_record_failed(
                resource,
                "the store did not take the record before the command exited",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_report_line_carries_the_record_and_only_for_its_job() {
        let rec = StaleRecord {
            at: StoreTime(1_764_000_000_123),
            kind: StaleKind::WriteRejected,
            reason: crate::store::RejectReason::Stale.into(),
            resource: "r".into(),
            key: Some("k".into()),
            owner_id: Some(OwnerId::fresh()),
            token: Token::new(4),
            accepted_token: Some(Token::new(5)),
            node: "n".into(),
            job: Some("j".into()),
            stage: Stage::Label("publish".into()),
            operation_id: "op".into(),
        };
        let line = job_report_line(&rec).unwrap();
        assert!(line.starts_with(JOB_REPORT_PREFIX));
        assert_eq!(parse_job_report(&line, "j"), Some(rec.clone()));
        assert_eq!(parse_job_report(&line, "other"), None);
        assert_eq!(parse_job_report("FENCECRON_STALE_WRITE {}", "j"), None);
        assert_eq!(parse_job_report(&line[1..], "j"), None);
        assert_eq!(
            parse_job_report("FENCECRON_STALE_WRITE not json", "j"),
            None
        );
        // `kind` is not read (a job reports rejected writes only) and
        // fields this version does not know are ignored.
        let other = line
            .replace("\"write_rejected\"", "\"lease_lost\"")
            .replace("\"stage\":", "\"added_later\":1,\"stage\":");
        assert_ne!(other, line);
        assert_eq!(parse_job_report(&other, "j"), Some(rec.clone()));
        // A required field missing, or of the wrong type, is no report.
        let no_token = line.replace("\"token\":4,", "");
        assert_ne!(no_token, line);
        assert_eq!(parse_job_report(&no_token, "j"), None);
        assert_eq!(
            parse_job_report(&line.replace("\"token\":4", "\"token\":\"4\""), "j"),
            None
        );
        assert_eq!(
            parse_job_report(&line.replace("\"at\":\"", "\"at\":\"x"), "j"),
            None
        );
    }
}
