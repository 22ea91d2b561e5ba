//! A run's whole process tree: a job is not only its leader and its process
//! group. Whatever it starts, in any session or process group (`setsid`, a
//! double fork that daemonises a helper), stops with it on lease loss,
//! timeout, replace, shutdown and when the daemon dies.
//!
//! Two mechanisms, the second on top of the first where it is available:
//!
//! * **subreaper** (always): the run's watchdog ([`crate::shim`]) is a
//!   child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant orphaned by
//!   its parent's exit (the daemonising double fork) is re-parented to the
//!   watchdog, not to PID 1, so every process the job started stays a
//!   descendant of the watchdog for as long as the watchdog lives. To stop
//!   the tree, the job's process group is signalled as before and so is
//!   every descendant found by walking `/proc` (each process's parent pid);
//!   SIGKILL is repeated until the watchdog has no child left, since a
//!   process can fork between one walk and its kill.
//! * **cgroup**: where the daemon runs in a cgroup v2 that was delegated to
//!   it ([`Cgroups::detect`]: systemd marks a `Delegate=yes` unit's cgroup
//!   with the `trusted.delegate` or `user.delegate` attribute, and it must
//!   be writable), each run gets a cgroup of its own below it, the job is
//!   moved into it before it execs, every process in it is signalled too,
//!   SIGKILL goes through `cgroup.kill` (kernel 5.14; else each pid in
//!   `cgroup.procs`, until none is left), and the daemon kills and removes
//!   it after the watchdog exited, before the release. A descendant
//!   re-parented past a watchdog killed with SIGKILL is still in it.
//!
//! What escapes: a process not started *by* the job but on its behalf by
//! another service (`systemd-run`, `at`, `ssh localhost`, a D-Bus
//! activation) is neither a descendant nor in the run's cgroup; with the
//! subreaper alone, should the watchdog itself be SIGKILLed, descendants
//! outside the job's group are re-parented past it and are no longer found
//! (the job's leader still dies with it, through `PR_SET_PDEATHSIG`); with
//! the cgroup, a process that both moves itself to another cgroup (it needs
//! write access there) and is re-parented past a dead watchdog.

use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// The parent pid of `pid`, from `/proc/PID/stat` (the field after the
/// state, which follows the last `)`: the command name may hold spaces
/// and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// Every live descendant of `root` (not `root` itself), found by one walk
/// over `/proc`. A process started during the walk may be missed: callers
/// that must leave nothing behind walk again until nothing is left.
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(i32, i32)> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && *pid != root)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Sends `sig` to the job's process group `pgid`, to every descendant of
/// `root` (the run's watchdog), whatever its session or group, and to
/// every process in the run's cgroup, if it has one.
pub(crate) fn signal_tree(root: i32, pgid: i32, cgroup: Option<&RunCgroup>, sig: Signal) {
    let _ = killpg(Pid::from_raw(pgid), sig);
    for pid in descendants(root) {
        let _ = kill(Pid::from_raw(pid), sig);
    }
    if let Some(cg) = cgroup {
        cg.signal(sig);
    }
}

/// The name of the mechanism in use, as `daemon_started` reports it.
pub(crate) fn mechanism(cgroups: Option<&Cgroups>) -> &'static str {
    match cgroups {
        Some(_) => "cgroup",
        None => "subreaper",
    }
}

/// The cgroup v2 delegated to this process, under which each run gets one
/// of its own.
#[derive(Debug, Clone)]
pub struct Cgroups {
    base: PathBuf,
}

impl Cgroups {
    /// This process's cgroup, if it is a cgroup v2 delegated to it: the
    /// unified hierarchy's line of `/proc/self/cgroup` (`0::/PATH`) under
    /// the `cgroup2` mount of `/proc/self/mountinfo`, marked delegated
    /// (systemd sets `trusted.delegate` or `user.delegate` to `1` on a
    /// `Delegate=yes` unit's cgroup) and writable by us. An undelegated
    /// cgroup belongs to whoever manages it (systemd, a container runtime):
    /// nothing is created there even when root could.
    pub fn detect() -> Option<Cgroups> {
        let base = own_cgroup_dir()?;
        let delegated = ["trusted.delegate", "user.delegate"]
            .iter()
            .any(|name| xattr_is_one(&base, name));
        (delegated && writable(&base) && writable(&base.join("cgroup.procs")))
            .then_some(Cgroups { base })
    }

    /// The delegated cgroup runs are created under.
    pub(crate) fn base(&self) -> &Path {
        &self.base
    }

    /// Creates the cgroup of the run named `name` (unique per run).
    pub(crate) fn create(&self, name: &str) -> std::io::Result<RunCgroup> {
        let path = self.base.join(format!("fencecron-{name}"));
        std::fs::create_dir(&path)?;
        Ok(RunCgroup { path })
    }
}

/// This process's cgroup v2 directory: its unified-hierarchy path
/// (`0::/PATH` in `/proc/self/cgroup`) under the `cgroup2` mount of
/// `/proc/self/mountinfo`. `None` without a cgroup v2.
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        let (root, point) = (*f.get(3)?, *f.get(4)?);
        let rel = path.strip_prefix(root)?.trim_start_matches('/');
        Some(Path::new(point).join(rel))
    })
}

/// Whether the extended attribute `name` of `path` reads `1`.
fn xattr_is_one(path: &Path, name: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(p), Ok(n)) = (
        std::ffi::CString::new(path.as_os_str().as_bytes()),
        std::ffi::CString::new(name),
    ) else {
        return false;
    };
    let mut buf = [0u8; 8];
    // SAFETY: both names are NUL-terminated; the buffer is live and its
    // length is passed.
    let n = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    n > 0 && buf[0] == b'1'
}

fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(p) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path.
    unsafe { libc::access(p.as_ptr(), libc::W_OK) == 0 }
}

/// One run's cgroup: the job is moved into it before it execs, so all it
/// starts is in it too, unless moved out.
#[derive(Debug, Clone)]
pub(crate) struct RunCgroup {
    path: PathBuf,
}

impl RunCgroup {
    /// A run's cgroup the daemon created (the watchdog gets its path).
    pub(crate) fn at(path: PathBuf) -> RunCgroup {
        RunCgroup { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs`, which the job writes `0` to to move itself in.
    pub(crate) fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The pids in the cgroup (none once it is gone).
    pub(crate) fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Sends `sig` to every process in the cgroup; SIGKILL through
    /// `cgroup.kill` where the kernel has it (it also reaches a process
    /// forked meanwhile).
    pub(crate) fn signal(&self, sig: Signal) {
        if sig == Signal::SIGKILL && std::fs::write(self.path.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }

    /// Whether no process is left in it (exited ones, zombies too, leave
    /// a cgroup v2 at once).
    pub(crate) fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Removes the (empty) cgroup.
    pub(crate) fn remove(&self) -> std::io::Result<()> {
        std::fs::remove_dir(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grandchild in a session of its own is still found; the test's
    /// own process is the root.
    #[test]
    fn a_setsid_grandchild_is_a_descendant() {
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let found = descendants(me);
        assert!(found.contains(&(child.id() as i32)), "{found:?}");
        assert!(found.contains(&grandchild), "{grandchild} in {found:?}");
        assert!(!found.contains(&me));
        signal_tree(child.id() as i32, child.id() as i32, None, Signal::SIGKILL);
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }
}
