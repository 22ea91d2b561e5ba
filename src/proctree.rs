//! A run's whole process tree: a job is not only its leader and its process
//! group. Whatever it starts, in any session or process group (`setsid`, a
//! double fork that daemonises a helper), stops with it on lease loss,
//! timeout, replace, shutdown and when the daemon dies.
//!
//! The run's watchdog ([`crate::shim`]) is a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`): a descendant orphaned by its parent's exit
//! (the daemonising double fork) is re-parented to the watchdog, not to
//! PID 1, so every process a job started stays a descendant of its
//! watchdog for as long as the watchdog lives. To stop the tree, the job's
//! process group is signalled as before and so is every descendant found
//! by walking `/proc` (each process's parent pid); SIGKILL is repeated
//! until the watchdog has no child left, since a process can fork between
//! one walk and its kill.
//!
//! What escapes: a process not started *by* the job but on its behalf by
//! another service (`systemd-run`, `at`, `ssh localhost`, a D-Bus
//! activation) was never a descendant; and should the watchdog itself be
//! SIGKILLed, descendants outside the job's group are re-parented past it
//! and are no longer found (the job's leader still dies with it, through
//! `PR_SET_PDEATHSIG`).

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
pub fn descendants(root: i32) -> Vec<i32> {
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

/// Sends `sig` to the job's process group `pgid` and to every descendant
/// of `root` (the run's watchdog), whatever its session or group.
pub fn signal_tree(root: i32, pgid: i32, sig: Signal) {
    let _ = killpg(Pid::from_raw(pgid), sig);
    for pid in descendants(root) {
        let _ = kill(Pid::from_raw(pid), sig);
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
        signal_tree(child.id() as i32, child.id() as i32, Signal::SIGKILL);
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }
}
