//! The write boundary: fenced writes and stale-owner records.
//!
//! A lease only chooses a worker; the fence protects the data. Every
//! rejection is recorded in the store (in the same transaction as the
//! refusal, for `put`) *and* logged as a stale-owner event here, so log
//! monitoring and `fencecron stale` see the same facts.

use crate::events;
use crate::store::{NewStaleRecord, PutOutcome, PutRequest, StaleRecord, Store, StoreError};

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
pub async fn put(store: &dyn Store, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError> {
    let outcome = store.put(req).await?;
    if let PutOutcome::Rejected(rec) = &outcome {
        events::stale_write_rejected(rec);
    }
    Ok(outcome)
}

/// Stores a stale-owner record that happened outside `put` (a lost lease, a
/// rejection a job reports from its own storage). A failure to store it is
/// logged; the caller has already logged the event itself.
pub async fn record(store: &dyn Store, rec: &NewStaleRecord<'_>) -> Option<StaleRecord> {
    match store.record_stale(rec).await {
        Ok(r) => Some(r),
        Err(e) => {
            events::stale_record_failed(rec.resource, &e.to_string());
            None
        }
    }
}
