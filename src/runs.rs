//! Run records: what a daemon notes about each run in progress, so that the
//! daemon started after it crashed can tell which of its leases belong to
//! runs that are provably dead, and give them back instead of leaving the
//! job blocked fleet-wide for a whole lease.
//!
//! One small JSON file per run, written when the job has started and
//! removed when its lease is released (or known lost). They live in a
//! private directory (0700; files 0600) per node and store:
//! `$RUNTIME_DIRECTORY` (systemd's `RuntimeDirectory=`), else
//! `$XDG_RUNTIME_DIR/fencecron`, else `/tmp/fencecron-UID`, then
//! `runs/NODE-HASH`.
//!
//! A run counts as dead only when this host has rebooted since (its boot id
//! changed), or when both its watchdog process (matched by pid *and* start
//! time, so a reused pid is not mistaken for it) and every process of the
//! job's process group are gone. Anything else might still be alive: its
//! lease is left to expire by the store's clock. A restarted daemon never
//! releases a lease whose job might still run.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::events;
use crate::names::Name;
use crate::store::{Lease, OwnerId, ReleaseOutcome, Store, StoreUrl, Token};
use crate::timing::LeaseTiming;

/// One run in progress, as noted on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub job: String,
    pub resource: String,
    pub owner_id: OwnerId,
    pub token: Token,
    /// The watchdog process and its start time (clock ticks since boot).
    pub shim_pid: u32,
    pub shim_start: Option<u64>,
    /// The job's process group.
    pub pgid: u32,
    pub boot_id: String,
    /// How long the lease lasts and the job's grace, for how long to wait
    /// for a run that is still being terminated.
    pub lease_ms: u64,
    pub kill_grace_ms: u64,
}

impl RunRecord {
    /// The record as `run_recovered` logs it.
    pub fn left(&self) -> events::LeftRun<'_> {
        events::LeftRun {
            job: &self.job,
            resource: &self.resource,
            owner_id: self.owner_id,
            token: self.token,
            pid: self.pgid,
        }
    }

    /// The record of a run that has just started.
    pub fn new(
        job: &str,
        resource: &str,
        lease: &Lease,
        shim_pid: u32,
        pgid: u32,
        timing: LeaseTiming,
    ) -> RunRecord {
        RunRecord {
            job: job.to_string(),
            resource: resource.to_string(),
            owner_id: lease.owner_id,
            token: lease.token,
            shim_pid,
            shim_start: start_time(shim_pid),
            pgid,
            boot_id: boot_id(),
            lease_ms: u64::try_from(timing.lease.as_millis()).unwrap_or(u64::MAX),
            kill_grace_ms: u64::try_from(timing.kill_grace.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Whether anything of the run might still be running on this host.
    pub fn might_be_alive(&self) -> bool {
        if self.boot_id != boot_id() {
            return false;
        }
        let shim_alive = match (start_time(self.shim_pid), self.shim_start) {
            (Some(now), Some(then)) => now == then,
            // The start time was not known: a live pid must count.
            (Some(_), None) => true,
            (None, _) => false,
        };
        shim_alive || group_exists(self.pgid)
    }
}

/// The run records of one node and store.
#[derive(Debug)]
pub struct RunRecords {
    dir: PathBuf,
}

impl RunRecords {
    /// Opens (creating) the private directory for `node` on `store`.
    pub fn open(node: &str, store: &StoreUrl) -> std::io::Result<RunRecords> {
        let base = base_dir()?;
        let dir = base.join("runs").join(format!(
            "{}-{:016x}",
            sanitize(node),
            fnv1a(&[node.as_bytes(), b"\0", store.expose().as_bytes()])
        ));
        private_dir(&base.join("runs"))?;
        private_dir(&dir)?;
        Ok(RunRecords { dir })
    }

    /// Writes a record (readable by this user only); returns its path.
    pub fn write(&self, rec: &RunRecord) -> std::io::Result<PathBuf> {
        let path = self.dir.join(format!("{}.json", rec.owner_id));
        let tmp = self.dir.join(format!(".{}.tmp", rec.owner_id));
        let body = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&body)?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    /// Removes a record once its run no longer holds the lease.
    pub fn remove(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
    }

    /// Every record left in the directory (unreadable ones are removed).
    pub fn list(&self) -> Vec<(PathBuf, RunRecord)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<RunRecord>(&b).ok())
            {
                Some(rec) => out.push((path, rec)),
                None => self.remove(&path),
            }
        }
        out
    }
}

/// Gives back the leases of this node's runs that an earlier daemon process
/// left behind, once each is provably dead. Runs that might still be alive
/// are waited for (their watchdog terminates them by the lease deadline at
/// the latest); one still alive after a whole lease and grace is left to
/// expire by itself.
pub async fn recover(records: Arc<RunRecords>, store: Arc<dyn Store>, node: String) {
    let pending = records.list();
    let mut tasks = tokio::task::JoinSet::new();
    for (path, rec) in pending {
        let (records, store, node) = (records.clone(), store.clone(), node.clone());
        tasks.spawn(async move { recover_one(&records, store.as_ref(), &node, &path, rec).await });
    }
    while tasks.join_next().await.is_some() {}
}

async fn recover_one(
    records: &RunRecords,
    store: &dyn Store,
    node: &str,
    path: &Path,
    rec: RunRecord,
) {
    let wait_for = Duration::from_millis(rec.lease_ms.saturating_add(rec.kill_grace_ms));
    let give_up = tokio::time::Instant::now() + wait_for;
    while rec.might_be_alive() {
        if tokio::time::Instant::now() >= give_up {
            events::run_recovered(
                &rec.left(),
                node,
                "still_alive",
                "a run of an earlier daemon process is still alive after a whole lease; its lease is left to expire",
            );
            records.remove(path);
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Ok(resource) = Name::parse("resource", &rec.resource) else {
        records.remove(path);
        return;
    };
    // The lease cannot outlive its own length: retrying longer is pointless.
    let mut backoff =
        Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).until(give_up);
    loop {
        let released = store.release(&resource, rec.owner_id, rec.token).await;
        if released.is_ok() {
            events::store_answered(store.outages(), &rec.job);
        }
        match released {
            Ok(ReleaseOutcome::Released) => {
                events::run_recovered(
                    &rec.left(),
                    node,
                    "released",
                    "a run of an earlier daemon process on this node is dead; its lease was given back",
                );
                break;
            }
            Ok(ReleaseOutcome::Refused(r)) => {
                events::run_recovered(&rec.left(), node, "already_ended", &r.to_string());
                break;
            }
            Err(e) => {
                let retry = backoff.next();
                events::store_unavailable(
                    store.outages(),
                    "release",
                    Some(rec.job.as_str()),
                    &e.to_string(),
                    retry,
                );
                let Some(delay) = retry else {
                    break;
                };
                tokio::time::sleep(delay).await;
            }
        }
    }
    records.remove(path);
}

/// The base directory for this user's fencecron runtime state.
fn base_dir() -> std::io::Result<PathBuf> {
    let env_dir = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|d| d.split(':').next().map(str::to_string))
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env_dir("RUNTIME_DIRECTORY") {
        return Ok(d);
    }
    if let Some(d) = env_dir("XDG_RUNTIME_DIR") {
        let d = d.join("fencecron");
        private_dir(&d)?;
        return Ok(d);
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let d = std::env::temp_dir().join(format!("fencecron-{uid}"));
    private_dir(&d)?;
    Ok(d)
}

/// Creates `dir` (0700) if missing and checks that it is a real directory
/// owned by this user: in a shared place like /tmp, another user could have
/// created it first.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid {
        return Err(std::io::Error::other(format!(
            "{} is not a directory owned by this user",
            dir.display()
        )));
    }
    Ok(())
}

/// This boot's id: processes of an earlier boot are certainly gone. Read
/// once per process (it cannot change while the process lives), not once
/// per run.
fn boot_id() -> String {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .clone()
}

/// A process's start time (field 22 of /proc/PID/stat), `None` when there
/// is no such process (or only its zombie).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.first() == Some(&"Z") {
        return None;
    }
    // Field 3 (state) is f[0]; field 22 (starttime) is f[19].
    f.get(19)?.parse().ok()
}

/// Whether any process is in process group `pgid`.
fn group_exists(pgid: u32) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// A node name as a file name part.
fn sanitize(node: &str) -> String {
    node.chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// 64-bit FNV-1a: a stable name for (node, store) that needs no crate.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_an_old_boot_is_not() {
        let me = std::process::id();
        let mut rec = RunRecord {
            job: "j".into(),
            resource: "r".into(),
            owner_id: OwnerId::fresh(),
            token: Token::new(1),
            shim_pid: me,
            shim_start: start_time(me),
            pgid: u32::MAX / 2,
            boot_id: boot_id(),
            lease_ms: 5000,
            kill_grace_ms: 1000,
        };
        assert!(rec.might_be_alive());
        // The same pid with another start time is another process.
        rec.shim_start = rec.shim_start.map(|s| s + 1);
        assert!(!rec.might_be_alive());
        rec.shim_start = start_time(me);
        rec.boot_id = "another-boot".into();
        assert!(!rec.might_be_alive());
    }

    #[test]
    fn names_are_safe_and_stable() {
        assert_eq!(sanitize("host a/../b"), "host_a_.._b");
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
    }
}
