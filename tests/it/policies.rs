//! Job policies through the real binary (issue 11) that need more than one
//! store server of their own: time-zone changes, on a PostgreSQL server and
//! daemons whose clocks `faketime` moves to the night of a change.
//! (`overlap`, retries and hooks are in `fleet.rs`; the schedule's own
//! arithmetic is unit-tested in `src/schedule.rs`.)
//!
//! Needs root (to run the server as `postgres`), PostgreSQL's server
//! binaries and `faketime`. Without them it prints a loud
//! `*** SKIPPED … ***`; under `CI=true` it fails instead.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::common::daemon::{job_toml, secs, sh, str_field, write_config, Daemon, DaemonOpts};
use crate::common::harness::{code, describe, fencecron, run};
use crate::common::pg::{skip_unless_available, standalone};
use crate::common::unique;

const TEST: &str = "policies::dst_gap_and_fold_run_once_in_berlin";

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{e}: {s}"))
        .to_utc()
}

/// The instant of an event or a run.
fn instant(e: &Value) -> DateTime<Utc> {
    utc(str_field(e, "scheduled_at").unwrap_or_else(|| panic!("no scheduled_at: {e}")))
}

/// The `faketime -f` offset that makes a clock read `target` now.
fn offset_to(target: &str) -> String {
    format!("{}s", (utc(target) - Utc::now()).num_seconds())
}

/// Every run of `job` in the history.
fn history(dir: &Path, store: &str, config: &Path, job: &str) -> Vec<DateTime<Utc>> {
    let mut cmd = fencecron(dir);
    cmd.args(["--store", store, "--config"])
        .arg(config)
        .args(["runs", job, "--json"]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("runs --json");
    let mut at: Vec<_> = runs.iter().map(instant).collect();
    at.sort();
    at
}

/// A job at 02:30 in Europe/Berlin, on one store across three nights' worth
/// of clocks (the server restarted under each; the daemon under the same
/// offset, so they agree):
/// - spring forward (2026-03-29, 02:00 CET -> 03:00 CEST): 02:30 does not
///   exist that night; the job runs once, at 03:00 CEST (01:00:00Z);
/// - fall back (2026-10-25, 03:00 CEST -> 02:00 CET): 02:30 occurs twice;
///   the job runs at the first (00:30:00Z), and a daemon whose clock is in
///   the repeated hour does not run it at the second (01:30:00Z), which a
///   job ticking every second on it proves its clock passed.
#[test]
fn dst_gap_and_fold_run_once_in_berlin() {
    if skip_unless_available(TEST) {
        return;
    }
    let (_pg_dir, pg) = standalone("dst");
    let url = pg.url("postgres");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("dst");
    let tick = unique("tick");
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[
            job_toml(
                &job,
                "0 30 2 * * *",
                &sh("true"),
                "timezone = \"Europe/Berlin\"",
            ),
            job_toml(&tick, "* * * * * *", &sh("true"), ""),
        ],
    );
    // Starts the server and a daemon with their clocks at `start`, waits
    // until the daemon ran a tick at or after `past`, stops both, and
    // returns the instants the job started at on that daemon.
    let night = |node: &str, start: &str, past: &str| -> Vec<DateTime<Utc>> {
        let offset = offset_to(start);
        pg.start_under(Some(&offset));
        let mut d = Daemon::spawn(DaemonOpts::new(node, &config, &url).faketime(&offset));
        let past = utc(past);
        d.expect(
            &format!("a tick at or after {past}"),
            |e| {
                str_field(e, "event") == Some("job_started")
                    && str_field(e, "job") == Some(tick.as_str())
                    && instant(e) >= past
            },
            secs(60),
        );
        assert!(
            d.stop(secs(30)).is_some_and(|s| s.success()),
            "{}",
            d.summary()
        );
        pg.stop();
        d.events("job_started")
            .iter()
            .filter(|e| str_field(e, "job") == Some(job.as_str()))
            .map(instant)
            .collect()
    };

    assert_eq!(
        night("dst-spring", "2026-03-29T00:59:50Z", "2026-03-29T01:00:05Z"),
        [utc("2026-03-29T01:00:00Z")],
        "02:30 in the gap runs once, at 03:00 CEST"
    );
    assert_eq!(
        night("dst-fall", "2026-10-25T00:29:50Z", "2026-10-25T00:30:05Z"),
        [utc("2026-10-25T00:30:00Z")],
        "the first 02:30 (CEST) runs"
    );
    assert_eq!(
        night(
            "dst-fall-again",
            "2026-10-25T01:29:50Z",
            "2026-10-25T01:30:05Z"
        ),
        Vec::<DateTime<Utc>>::new(),
        "the second 02:30 (CET) does not run"
    );

    let offset = offset_to("2026-10-25T01:31:00Z");
    pg.start_under(Some(&offset));
    let runs = history(dir.path(), &url, &config, &job);
    pg.stop();
    assert_eq!(
        runs,
        [utc("2026-03-29T01:00:00Z"), utc("2026-10-25T00:30:00Z")],
        "the history: once per night"
    );
}
