//! The run watchdog: a small process of its own between the daemon (or
//! `fencecron exec`) and each job, so that a job is dead before its lease can
//! expire even when the daemon is killed, aborts, or stalls (docs/guarantee.md,
//! "The guarantee, exactly", point 1), and so is everything the job started
//! (point 5).
//!
//! The daemon starts `fencecron __shim TERM_AT KILL_AT GRACE_MS [CGROUP] --
//! CMD…` (the same binary; `main` hands it to [`main`] before any runtime or
//! log set-up; `CGROUP`: the run's own cgroup, which the job moves into
//! before it execs). The shim starts the job in a process group of its own
//! and then only waits, on its own monotonic clock:
//!
//! * at `TERM_AT` it sends SIGTERM to the job's tree, at `KILL_AT` SIGKILL.
//!   Both are absolute `CLOCK_MONOTONIC` nanoseconds, read with a raw system
//!   call so that a faked libc clock (libfaketime) cannot shift them; every
//!   renewal the daemon confirms moves them later through the control pipe
//!   (fd 3, lines `D TERM_AT KILL_AT`). When the daemon terminates the job
//!   itself it says so first (`T`: SIGTERM sent; `K`: SIGKILL sent). After
//!   a `K` the shim kills at once too; after a `T` it SIGKILLs one grace
//!   after the daemon's own SIGKILL is due (never after `KILL_AT`), so a
//!   daemon that is alive kills first and logs it, and the shim stays the
//!   backstop should the daemon stall;
//! * when the control pipe reaches end-of-file, its daemon is gone (crash,
//!   SIGKILL, OOM kill, abort): SIGTERM at once, SIGKILL after the grace but
//!   never after `KILL_AT`;
//! * SIGTERM, SIGINT or SIGHUP sent to the shim itself is handled the same
//!   way instead of leaving the job behind;
//! * when the job's leader exits, whatever is left of its tree is SIGKILLed
//!   and the shim exits the way the job did (same code, or the same signal),
//!   so its parent sees the job's status.
//!
//! Every signal goes to the job's whole tree ([`crate::proctree`]): its
//! process group and every descendant in any session or group. The shim is
//! a child subreaper, so a helper the job daemonised (double fork, `setsid`)
//! is re-parented to it and still found; it exits only once it has no child
//! left, so its parent, which releases the lease after the shim's exit,
//! never releases it while part of the job still runs.
//!
//! A stopped daemon (SIGSTOP, a blocked runtime) confirms no renewal, so the
//! deadlines it last sent fire here. The job's leader also gets
//! `PR_SET_PDEATHSIG = SIGKILL`, a backstop should the shim itself be killed.
//! The shim reports on its status pipe (fd 4) `P PID` once the job runs, or
//! `E MESSAGE` when it could not be started (then it exits 127).
//!
//! It is synchronous and small on purpose: no async runtime, no store, no
//! logging; one `poll` over the control pipe and a signalfd.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::proctree::RunCgroup;

mod spawner;
pub(crate) use spawner::{Request, FDS as SPAWN_FDS, MAX_REQUEST, SOCKET_FD as SPAWNER_FD};

/// Whether descriptor `fd` is open and of this type (`S_IFIFO`, ...).
fn is_open_as(fd: RawFd, kind: libc::mode_t) -> bool {
    // SAFETY: fstat into a zeroed, live stat struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == kind
    }
}

/// A close-on-exec duplicate of `fd` numbered at least `min`.
pub(crate) fn dup_above(fd: &impl AsRawFd, min: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) returns a new descriptor we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `n` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// The first argument that selects the shim.
pub const SHIM_ARG: &str = "__shim";
/// The name the shim shows in `ps`.
pub(crate) const SHIM_NAME: &str = "fencecron-shim";
/// The first argument that selects the spawner ([`spawner`]).
pub(crate) const SPAWNER_ARG: &str = "--spawner";
/// The control pipe's read end in the shim.
pub(crate) const CTL_FD: RawFd = 3;
/// The status pipe's write end in the shim.
pub(crate) const STATUS_FD: RawFd = 4;

/// `CLOCK_MONOTONIC` in nanoseconds, read without libc (rustix: the vDSO
/// or the system call): a libc-level clock fake (libfaketime) in one
/// process must not move the deadlines that two processes share.
pub(crate) fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// The shim's deadlines and what it has done about them.
struct Deadlines {
    term_at: u64,
    kill_at: u64,
    grace_ns: u64,
    term_sent: bool,
    kill_sent: bool,
}

impl Deadlines {
    /// A newer confirmation from the daemon. Once a termination is under
    /// way, deadlines only move earlier.
    fn confirm(&mut self, term_at: u64, kill_at: u64) {
        if self.term_sent {
            self.kill_at = self.kill_at.min(kill_at);
        } else {
            self.term_at = term_at;
            self.kill_at = kill_at;
        }
    }

    /// Terminate now: SIGTERM at once, SIGKILL after the grace, never later
    /// than the lease deadline.
    fn terminate_now(&mut self, now: u64) {
        self.term_at = self.term_at.min(now);
        self.kill_at = self.kill_at.min(now.saturating_add(self.grace_ns));
    }

    /// The daemon has sent SIGTERM to the job's tree itself (a timeout, a
    /// lost lease, a shutdown): the termination is under way, and the rest
    /// of the tree keeps its grace should the leader exit first. The daemon
    /// SIGKILLs after the grace and logs it; the shim's own SIGKILL is the
    /// backstop, one grace later (never after the lease deadline): were it
    /// due at the same point, the two would race and a healthy daemon's
    /// `job_cancelled` SIGKILL would go missing whenever the shim won. A
    /// daemon that dies meanwhile closes the pipe, which brings the SIGKILL
    /// back to one grace from then ([`Deadlines::terminate_now`]).
    fn terminating(&mut self, now: u64) {
        self.term_sent = true;
        let backstop = self.grace_ns.saturating_mul(2);
        self.kill_at = self.kill_at.min(now.saturating_add(backstop));
    }

    /// The daemon has sent SIGKILL to the job's tree: so does the shim, now,
    /// and it then waits for the whole tree to be gone.
    fn kill_now(&mut self, now: u64) {
        self.term_sent = true;
        self.kill_at = self.kill_at.min(now);
    }

    /// Sends whatever signal is due to the job's tree; returns milliseconds
    /// until the next deadline (`-1`: none left).
    fn fire(&mut self, pgid: Pid, now: u64) -> i32 {
        if !self.kill_sent && now >= self.kill_at {
            signal_tree(pgid, Signal::SIGKILL);
            self.kill_sent = true;
            self.term_sent = true;
        } else if !self.term_sent && now >= self.term_at {
            signal_tree(pgid, Signal::SIGTERM);
            self.term_sent = true;
        }
        let next = if self.kill_sent {
            return -1;
        } else if self.term_sent {
            self.kill_at
        } else {
            self.term_at
        };
        let ms = next.saturating_sub(now).div_ceil(1_000_000);
        i32::try_from(ms).unwrap_or(i32::MAX)
    }
}

/// Reports a start-up failure on the status pipe and exits 127.
fn fail(status: &mut std::fs::File, msg: &str) -> ! {
    let _ = writeln!(status, "E {}", msg.replace('\n', " "));
    std::process::exit(127);
}

/// What the daemon asks of the shim.
struct Args {
    term_at: u64,
    kill_at: u64,
    grace_ms: u64,
    /// The run's cgroup, created by the daemon, where it has one.
    cgroup: Option<std::path::PathBuf>,
    argv: Vec<OsString>,
    /// The job's working directory, entered before it starts; `None`: the
    /// shim's own (the daemon started it there).
    workdir: Option<std::path::PathBuf>,
    /// The job's whole environment; `None`: the shim's own.
    env: Option<Vec<(OsString, OsString)>>,
    /// Forked by the spawner rather than started by the daemon.
    spawned: bool,
}

/// Parses `TERM_AT KILL_AT GRACE_MS [CGROUP] -- CMD ARGS…`.
fn parse(args: &[OsString]) -> Option<Args> {
    let num = |a: &OsString| a.to_str()?.parse::<u64>().ok();
    let term_at = num(args.first()?)?;
    let kill_at = num(args.get(1)?)?;
    let grace_ms = num(args.get(2)?)?;
    let (cgroup, rest) = match args.get(3)? {
        a if a == "--" => (None, 4),
        a => (Some(std::path::PathBuf::from(a)), 5),
    };
    if args.get(rest - 1)? != "--" || args.len() <= rest {
        return None;
    }
    Some(Args {
        term_at,
        kill_at,
        grace_ms,
        cgroup,
        argv: args[rest..].to_vec(),
        workdir: None,
        env: None,
        spawned: false,
    })
}

/// The run's cgroup, when the daemon gave one: signalled with the rest of
/// the tree, and emptied before the shim exits.
static CGROUP: std::sync::OnceLock<RunCgroup> = std::sync::OnceLock::new();

/// The shim's entry point; `args` are those after [`SHIM_ARG`]. Never
/// returns: it exits the way the job did. With [`SPAWNER_ARG`] first it is
/// the daemon's spawner instead ([`spawner`]), which forks a watchdog per
/// run without an `exec`.
pub fn main(args: Vec<OsString>) -> ! {
    if args.first().is_some_and(|a| a == SPAWNER_ARG) {
        spawner::serve();
    }
    // Both pipes must be there: were either descriptor closed, the signalfd
    // created below would take its number and be misread as a pipe.
    for fd in [CTL_FD, STATUS_FD] {
        if !is_open_as(fd, libc::S_IFIFO) {
            crate::output::error_line(
                "__shim is for internal use only (descriptors 3 and 4 must be pipes)",
            );
            std::process::exit(127);
        }
    }
    // SAFETY: fd 4 was set up by the daemon for this process alone; if it
    // is not open, writes fail and are ignored.
    let mut status = unsafe { std::fs::File::from_raw_fd(STATUS_FD) };
    let Some(args) = parse(&args) else {
        fail(
            &mut status,
            "fencecron __shim: internal use only (TERM_AT KILL_AT GRACE_MS -- CMD…)",
        );
    };
    watch(args, status)
}

/// Runs the job and watches it until it and its whole tree are gone, then
/// exits the way the job did. The control pipe is on [`CTL_FD`], the status
/// pipe is `status` (on [`STATUS_FD`]).
fn watch(args: Args, mut status: std::fs::File) -> ! {
    // The pipes from the daemon must not reach the job.
    for fd in [CTL_FD, STATUS_FD] {
        // SAFETY: fcntl on a descriptor number; fails harmlessly if closed.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let Args {
        term_at,
        kill_at,
        grace_ms,
        cgroup,
        argv,
        workdir,
        env,
        spawned,
    } = args;
    if let Some(dir) = &workdir {
        if let Err(e) = std::env::set_current_dir(dir) {
            fail(
                &mut status,
                &format!("cannot enter the job's workdir {}: {e}", dir.display()),
            );
        }
    }

    // Every signal the shim acts on arrives through a signalfd, so it is
    // blocked before the job exists (no SIGCHLD can be lost); the job gets
    // an empty mask back before it execs.
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    if let Err(e) = mask.thread_block() {
        fail(&mut status, &format!("cannot block signals: {e}"));
    }
    let sfd = match SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC) {
        Ok(s) => s,
        Err(e) => fail(&mut status, &format!("cannot create a signalfd: {e}")),
    };

    // Orphaned descendants (a daemonising double fork) come back to the
    // shim instead of PID 1, so none is out of its reach.
    // SAFETY: prctl with integer arguments on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        fail(
            &mut status,
            &format!("cannot become the job's subreaper (prctl PR_SET_CHILD_SUBREAPER): {e}; allow prctl to the daemon"),
        );
    }

    // The job moves itself into the run's cgroup before it execs (the
    // path is made ready here: nothing may allocate after the fork).
    let procs = match &cgroup {
        Some(dir) => {
            let run = RunCgroup::at(dir.clone());
            let procs = std::ffi::CString::new(run.procs_file().as_os_str().as_bytes());
            let _ = CGROUP.set(run);
            match procs {
                Ok(p) => Some(p),
                Err(_) => fail(&mut status, "the run's cgroup path holds a NUL byte"),
            }
        }
        None => None,
    };

    // A start that comes too late does not happen: the daemon stops waiting
    // for it by the kill deadline and may then give the lease back, and a
    // request the spawner took up only after that (it was stopped or
    // starved meanwhile) must not run the job without the lease.
    if monotonic_ns() >= term_at {
        fail(
            &mut status,
            "the run's deadline passed before its watchdog could start the job",
        );
    }
    let shim_pid = std::process::id() as i32;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).process_group(0);
    if let Some(env) = &env {
        cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    }
    // SAFETY: the closure only makes async-signal-safe system calls.
    unsafe {
        cmd.pre_exec(move || {
            // The job starts with no signal blocked: the shim's mask would
            // make it deaf to SIGTERM.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The shim died between fork and prctl: do not run unwatched.
            if libc::getppid() != shim_pid {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(procs) = &procs {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => fail(&mut status, &e.to_string()),
    };
    let pid = Pid::from_raw(child.id() as i32);
    // Started by the spawner, the daemon is not this process's parent: it
    // learns the watchdog's pid here and how the job ended from the last
    // line ([`Exit::line`]), and the end of the pipe is this exit.
    let mut status = if spawned {
        let _ = writeln!(status, "P {pid} {}", std::process::id());
        Some(status)
    } else {
        let _ = writeln!(status, "P {pid}");
        None
    };

    let mut deadlines = Deadlines {
        term_at,
        kill_at,
        grace_ns: grace_ms.saturating_mul(1_000_000),
        term_sent: false,
        kill_sent: false,
    };
    // SAFETY: fd 3 was set up by the daemon for this process alone.
    let mut ctl: Option<OwnedFd> = Some(unsafe { OwnedFd::from_raw_fd(CTL_FD) });
    let mut pending = Vec::<u8>::new();
    // The leader's status once it has exited; the shim may still wait for
    // the rest of the tree (see below).
    let mut leader: Option<Exit> = None;
    let mut children_left = true;
    let exit = loop {
        let timeout = deadlines.fire(pid, monotonic_ns());
        if let Some(e) = leader.take() {
            // The leader exited on its own: nothing else of the job may
            // outlive it. During a termination the rest of the tree has its
            // grace (SIGTERM went to all of it), until it is gone or the
            // SIGKILL point.
            if !deadlines.term_sent || deadlines.kill_sent || !children_left {
                break e;
            }
            leader = Some(e);
        }
        let mut fds = vec![libc::pollfd {
            fd: sfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if let Some(c) = &ctl {
            fds.push(libc::pollfd {
                fd: c.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a live array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            continue; // EINTR
        }
        if fds.len() > 1 && fds[1].revents != 0 {
            let fd = ctl.as_ref().map(|c| c.as_raw_fd()).unwrap_or(-1);
            if read_control(fd, &mut pending, &mut deadlines) {
                // The daemon is gone: nobody can confirm the lease any more.
                ctl = None;
                deadlines.terminate_now(monotonic_ns());
            }
        }
        if fds[0].revents != 0 {
            while let Ok(Some(info)) = sfd.read_signal() {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGCHLD) => {
                        let (e, left) = reap(pid);
                        children_left = left;
                        if e.is_some() {
                            leader = e;
                        } else if !left && leader.is_none() {
                            // No child left and the leader's status never
                            // seen: should not happen, but do not spin.
                            leader = Some(Exit::Code(1));
                        }
                    }
                    Ok(_) => deadlines.terminate_now(monotonic_ns()),
                    Err(_) => {}
                }
            }
        }
    };
    // The shim's exit (after which the lease is released) waits for all of
    // the job's tree to be gone.
    kill_tree_until_empty(pid, &sfd);
    drop(child);
    if let Some(status) = status.as_mut() {
        let _ = status.write_all(exit.line().as_bytes());
    }
    exit_like(exit)
}

/// Sends `sig` to the job's group and to every descendant of the shim.
fn signal_tree(pgid: Pid, sig: Signal) {
    crate::proctree::signal_tree(std::process::id() as i32, pgid.as_raw(), CGROUP.get(), sig);
}

/// SIGKILLs the job's group, every descendant of the shim and its cgroup,
/// again and again, reaping as they die, until the shim has no child left
/// and the cgroup is empty: a process can fork between one walk of the
/// tree and its kill, and a killed parent's children come back to the shim
/// (the subreaper) only once it is dead. A job that left nothing behind
/// costs no walk of `/proc`: every live descendant of the subreaper is its
/// child or below one.
fn kill_tree_until_empty(pgid: Pid, sfd: &SignalFd) {
    let _ = nix::sys::signal::killpg(pgid, Signal::SIGKILL);
    loop {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                // ECHILD: no descendant left; the cgroup may still hold a
                // process someone else moved there.
                Err(_) if CGROUP.get().is_none_or(RunCgroup::is_empty) => return,
                Err(_) => break,
            }
        }
        signal_tree(pgid, Signal::SIGKILL);
        // Wait for the next child to die (SIGCHLD), or walk again soon.
        while let Ok(Some(_)) = sfd.read_signal() {}
        let mut fds = [libc::pollfd {
            fd: sfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: `fds` is a live array of one pollfd.
        unsafe { libc::poll(fds.as_mut_ptr(), 1, 20) };
    }
}

/// Reads what the control pipe holds and applies every complete line.
/// Returns whether the pipe reached end-of-file (or failed).
fn read_control(fd: RawFd, pending: &mut Vec<u8>, deadlines: &mut Deadlines) -> bool {
    let mut buf = [0u8; 512];
    // SAFETY: reading into a live buffer of the given length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n == 0 {
        return true;
    }
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return !matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN));
    }
    pending.extend_from_slice(&buf[..n as usize]);
    while let Some(end) = pending.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = pending.drain(..=end).collect();
        let line = String::from_utf8_lossy(&line);
        let mut f = line.split_whitespace();
        match f.next() {
            Some("D") => {
                let term = f.next().and_then(|v| v.parse().ok());
                let kill = f.next().and_then(|v| v.parse().ok());
                if let (Some(t), Some(k)) = (term, kill) {
                    deadlines.confirm(t, k);
                }
            }
            Some("T") => deadlines.terminating(monotonic_ns()),
            Some("K") => deadlines.kill_now(monotonic_ns()),
            _ => {}
        }
    }
    false
}

/// How the job ended, once its leader has exited.
#[derive(Debug, PartialEq)]
enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    /// The status pipe's last line from a spawned watchdog: `X C CODE` or
    /// `X S SIGNAL`, read by [`exit_status`].
    fn line(&self) -> String {
        match self {
            Exit::Code(c) => format!("X C {c}\n"),
            Exit::Signal(s) => format!("X S {s}\n"),
        }
    }
}

/// The exit status a spawned watchdog reported on its last line; `None`
/// when there is none (the watchdog itself was killed).
pub(crate) fn exit_status(line: &str) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let mut f = line.split_whitespace();
    let (Some("X"), Some(kind), Some(n), None) = (f.next(), f.next(), f.next(), f.next()) else {
        return None;
    };
    let n: i32 = n.parse().ok()?;
    match kind {
        "C" => Some(std::process::ExitStatus::from_raw((n & 0xff) << 8)),
        "S" => Some(std::process::ExitStatus::from_raw(n & 0x7f)),
        _ => None,
    }
}

/// Reaps every child that has exited: the job's leader (its status, if it
/// is among them) and descendants re-parented to the shim. Also says
/// whether the shim has any child left.
fn reap(pid: Pid) -> (Option<Exit>, bool) {
    let mut leader = None;
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, code)) if p == pid => leader = Some(Exit::Code(code)),
            Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => {
                leader = Some(Exit::Signal(sig as i32))
            }
            Ok(WaitStatus::StillAlive) => return (leader, true),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            // ECHILD: no child left.
            Err(_) => return (leader, false),
        }
    }
}

/// Exits with the job's code, or dies of the job's signal (without a core
/// file), so the parent's `wait` sees what the job did.
fn exit_like(exit: Exit) -> ! {
    match exit {
        Exit::Code(c) => std::process::exit(c),
        Exit::Signal(sig) => {
            // SAFETY: plain system calls on this process.
            unsafe {
                let no_core = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                libc::signal(sig, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(sig);
            }
            std::process::exit(128 + sig)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> Deadlines {
        Deadlines {
            term_at: 1_000,
            kill_at: 2_000,
            grace_ns: 500,
            term_sent: false,
            kill_sent: false,
        }
    }

    #[test]
    fn orphaned_terminates_within_the_lease_deadline() {
        let mut x = d();
        x.terminate_now(1_800);
        assert_eq!((x.term_at, x.kill_at), (1_000, 2_000));
        let mut x = d();
        x.terminate_now(100);
        assert_eq!((x.term_at, x.kill_at), (100, 600));
    }

    #[test]
    fn confirmations_only_move_earlier_once_terminating() {
        let mut x = d();
        x.confirm(5_000, 6_000);
        assert_eq!((x.term_at, x.kill_at), (5_000, 6_000));
        x.term_sent = true;
        x.confirm(9_000, 9_500);
        assert_eq!(x.kill_at, 6_000);
        x.confirm(3_000, 4_000);
        assert_eq!(x.kill_at, 4_000);
    }

    #[test]
    fn the_daemons_termination_keeps_the_grace_and_the_lease_deadline() {
        // SIGTERM sent by the daemon: the daemon SIGKILLs after the grace,
        // the shim one grace later...
        let mut x = d();
        x.terminating(100);
        assert!(x.term_sent && !x.kill_sent);
        assert_eq!(x.kill_at, 1_100);
        // ...or one grace after the daemon is gone, if that is earlier...
        x.terminate_now(200);
        assert_eq!(x.kill_at, 700);
        // ...but never after the lease deadline.
        let mut x = d();
        x.terminating(1_800);
        assert_eq!(x.kill_at, 2_000);
        // SIGKILL sent by the daemon: the shim's is due at once.
        let mut x = d();
        x.kill_now(300);
        assert_eq!(x.kill_at, 300);
        assert!(x.term_sent);
    }

    #[test]
    fn a_spawned_watchdogs_last_line_is_the_jobs_status() {
        use std::os::unix::process::ExitStatusExt;
        for exit in [
            Exit::Code(0),
            Exit::Code(7),
            Exit::Code(255),
            Exit::Signal(9),
            Exit::Signal(10),
        ] {
            let status = exit_status(exit.line().trim_end()).expect("read back");
            match exit {
                Exit::Code(c) => assert_eq!((status.code(), status.signal()), (Some(c), None)),
                Exit::Signal(s) => assert_eq!((status.code(), status.signal()), (None, Some(s))),
            }
        }
        for bad in ["", "P 12 13", "X C", "X C x", "X Q 1", "X C 1 2"] {
            assert!(exit_status(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn parses_its_arguments() {
        let a: Vec<OsString> = ["1", "2", "3", "--", "true"]
            .iter()
            .map(Into::into)
            .collect();
        let p = parse(&a).expect("parsed");
        assert_eq!(
            (p.term_at, p.kill_at, p.grace_ms, p.argv.len()),
            (1, 2, 3, 1)
        );
        assert!(p.cgroup.is_none());
        let a: Vec<OsString> = ["1", "2", "3", "/cg/run", "--", "true", "x"]
            .iter()
            .map(Into::into)
            .collect();
        let p = parse(&a).expect("parsed");
        assert_eq!(p.cgroup.as_deref(), Some(std::path::Path::new("/cg/run")));
        assert_eq!(p.argv.len(), 2);
        for bad in [
            &["1", "2", "3", "--"][..],
            &["1", "2", "3", "/cg", "true"][..],
        ] {
            let a: Vec<OsString> = bad.iter().map(Into::into).collect();
            assert!(parse(&a).is_none(), "{bad:?}");
        }
    }
}
