//! Test support compiled only for the crate's own tests (`cfg(test)`): an
//! in-memory [`store::MemoryStore`] with injected faults and a fake job
//! ([`job::FakeLauncher`]), and the events a test logged
//! ([`events::Captured`]), so that the supervisor's deadline loop and the
//! daemon's occurrence policy run in-process on tokio's paused clock; and a
//! global allocator that counts each thread's bytes ([`alloc::held_by`]).
//! None of it ships: the binary knows only the SQL backends and the
//! system's allocator.

pub(crate) mod alloc;
pub(crate) mod events;
pub(crate) mod job;
mod layering;
pub(crate) mod store;
mod store_faults;

use chrono::{DateTime, Utc};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// A fixed wall-clock start for tests: 2027-01-15T08:00:00Z, a whole minute.
pub(crate) fn epoch_wall() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).expect("a valid instant")
}
