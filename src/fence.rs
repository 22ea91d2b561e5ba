//! The write boundary: fenced writes and stale-owner records.
//!
//! A lease only chooses a worker; the fence protects the data. Every
//! rejection is recorded in the store (in the same transaction as the
//! refusal, for `put`) *and* logged as a stale-owner event here, so log
//! monitoring and `fencecron stale` see the same facts.

use crate::events;
use crate::store::{NewStaleRecord, PutOutcome, PutRequest, StaleRecord, Store, StoreError};

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
