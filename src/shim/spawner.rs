//! The spawner: one long-lived, single-threaded process per daemon that
//! forks a run's watchdog on request, so a job start costs neither a `fork`
//! of the daemon (a multi-threaded process with a large address space) nor
//! an `exec` of the watchdog binary (its dynamic loading and start-up):
//! together about half of the CPU a run cost, two thirds for a daemon of
//! 10,000 jobs (BENCHMARKS.md, "The spawner").
//!
//! The daemon starts `fencecron-shim --spawner` (or `fencecron __shim
//! --spawner`) with one end of a `SOCK_SEQPACKET` socket pair on
//! descriptor 3. Each request is one message, a [`Request`] with four
//! descriptors attached (`SCM_RIGHTS`): the control pipe's read end, the
//! status pipe's write end and the job's stdout and stderr pipes. The
//! spawner forks; the child puts them on 3, 4, 1 and 2, stdin on
//! `/dev/null`, and becomes the run's watchdog ([`super::watch`]): from
//! there on it is the same code as a watchdog the daemon executes itself,
//! and it reports on the status pipe as that one does, plus its own pid
//! (`P JOB WATCHDOG`) and, last, how the job ended (`X C CODE`, `X S SIG`),
//! since the daemon is not its parent. The spawner reaps its children and
//! answers nothing: a request it cannot carry out closes the status pipe
//! (after an `E` line where it can), which the daemon reads as a failed
//! start.
//!
//! It exits when the daemon's end of the socket closes (the daemon exited,
//! was killed or dropped it); the watchdogs it forked live on, each bound
//! to its daemon by its own control pipe.

use std::ffi::{OsStr, OsString};
use std::io::{IoSliceMut, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::{Args, CTL_FD, STATUS_FD};

/// The spawner's socket.
pub(crate) const SOCKET_FD: RawFd = 3;
/// What a request starts with: the format's name and version.
const MAGIC: &[u8] = b"fencecron-spawn-1";
/// The largest request the spawner reads; the daemon executes the watchdog
/// itself for a larger one (an environment or command line of hundreds of
/// kilobytes).
pub(crate) const MAX_REQUEST: usize = 192 * 1024;
/// The descriptors attached to a request, in this order.
pub(crate) const FDS: usize = 4;
/// The name the spawner shows in `ps` (at most 15 bytes).
const SPAWNER_COMM: &[u8] = b"fencecron-spawn\0";
/// The name each watchdog it forks shows, as one the daemon executes.
const WATCHDOG_COMM: &[u8] = b"fencecron-shim\0";

/// One run for the spawner: what the daemon otherwise puts on the
/// watchdog's command line, plus the job's working directory and whole
/// environment (a forked watchdog inherits the spawner's, not the run's).
pub(crate) struct Request<'a> {
    pub(crate) term_at: u64,
    pub(crate) kill_at: u64,
    pub(crate) grace_ms: u64,
    pub(crate) cgroup: Option<&'a Path>,
    pub(crate) workdir: Option<&'a Path>,
    pub(crate) argv: &'a [String],
    pub(crate) env: &'a [(OsString, OsString)],
}

impl Request<'_> {
    /// The message: NUL-terminated fields (no argument, path or variable
    /// can hold a NUL): the magic, the three numbers, the cgroup and the
    /// workdir (empty: none), the argument count and arguments, the
    /// variable count and `NAME=VALUE` pairs.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(1024);
        let mut field = |b: &[u8]| {
            m.extend_from_slice(b);
            m.push(0);
        };
        field(MAGIC);
        for n in [self.term_at, self.kill_at, self.grace_ms] {
            field(n.to_string().as_bytes());
        }
        for p in [self.cgroup, self.workdir] {
            field(p.map(|p| p.as_os_str().as_bytes()).unwrap_or_default());
        }
        field(self.argv.len().to_string().as_bytes());
        for a in self.argv {
            field(a.as_bytes());
        }
        field(self.env.len().to_string().as_bytes());
        for (k, v) in self.env {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            field(&kv);
        }
        m
    }
}

/// Reads a request back into the watchdog's arguments; `None` if it is
/// not one.
fn decode(msg: &[u8]) -> Option<Args> {
    let mut f = msg.strip_suffix(&[0])?.split(|b| *b == 0);
    if f.next()? != MAGIC {
        return None;
    }
    let mut num = || -> Option<u64> { std::str::from_utf8(f.next()?).ok()?.parse().ok() };
    let (term_at, kill_at, grace_ms) = (num()?, num()?, num()?);
    let mut path = || -> Option<Option<PathBuf>> {
        let p = f.next()?;
        Some((!p.is_empty()).then(|| PathBuf::from(OsStr::from_bytes(p))))
    };
    let (cgroup, workdir) = (path()?, path()?);
    let mut count = || -> Option<usize> { std::str::from_utf8(f.next()?).ok()?.parse().ok() };
    let argc = count()?;
    let argv: Vec<OsString> = (0..argc)
        .map(|_| f.next().map(|a| OsString::from_vec(a.to_vec())))
        .collect::<Option<_>>()?;
    let envc = std::str::from_utf8(f.next()?).ok()?.parse::<usize>().ok()?;
    let env: Vec<(OsString, OsString)> = (0..envc)
        .map(|_| {
            let kv = f.next()?;
            let eq = kv.iter().position(|b| *b == b'=')?;
            Some((
                OsString::from_vec(kv[..eq].to_vec()),
                OsString::from_vec(kv[eq + 1..].to_vec()),
            ))
        })
        .collect::<Option<_>>()?;
    if argv.is_empty() || f.next().is_some() {
        return None;
    }
    Some(Args {
        term_at,
        kill_at,
        grace_ms,
        cgroup,
        argv,
        workdir,
        env: Some(env),
        spawned: true,
    })
}

/// Sets this process's name as `ps` and `/proc/PID/comm` show it.
fn set_comm(name: &[u8]) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
}

/// The spawner's loop; exits when the daemon's end of the socket closes.
pub(super) fn serve() -> ! {
    if !super::is_open_as(SOCKET_FD, libc::S_IFSOCK) {
        crate::output::error_line(
            "__shim --spawner is for internal use only (descriptor 3 must be a socket)",
        );
        std::process::exit(127);
    }
    // SAFETY: descriptor 3 was set up by the daemon for this process alone.
    let sock = unsafe { OwnedFd::from_raw_fd(SOCKET_FD) };
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(sock.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    set_comm(SPAWNER_COMM);
    // Its children (the watchdogs) are reaped as they exit.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if mask.thread_block().is_err() {
        std::process::exit(127);
    }
    let Ok(sfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
    else {
        std::process::exit(127);
    };
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfd structs.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            while let Ok(Some(_)) = sfd.read_signal() {}
            reap_all();
        }
        if fds[0].revents != 0 {
            match receive(&sock, &mut buf) {
                Received::Closed => std::process::exit(0),
                Received::Nothing => {}
                Received::Request(len, passed) => spawn(&buf[..len], passed, &sock, &sfd),
            }
        }
    }
}

/// Reaps every exited child.
fn reap_all() {
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => return,
            Ok(_) | Err(_) => continue,
        }
    }
}

/// What one read of the socket brought.
enum Received {
    /// The daemon's end is closed.
    Closed,
    /// Nothing usable (an interrupted read, a message without its pipes).
    Nothing,
    /// A message of this length and the descriptors attached to it.
    Request(usize, Vec<OwnedFd>),
}

fn receive(sock: &OwnedFd, buf: &mut [u8]) -> Received {
    let mut cmsg = nix::cmsg_space!([RawFd; FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = match recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    ) {
        Ok(m) => m,
        Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => return Received::Nothing,
        Err(_) => return Received::Closed,
    };
    let mut passed = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(fds) = c {
                // SAFETY: the kernel installed these descriptors for us.
                passed.extend(
                    fds.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
    }
    let (len, truncated) = (
        msg.bytes,
        msg.flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC),
    );
    if len == 0 && passed.is_empty() {
        return Received::Closed;
    }
    if truncated {
        // Unreadable: closing the pipes tells the daemon the start failed.
        return Received::Nothing;
    }
    Received::Request(len, passed)
}

/// Forks the watchdog of one request. The spawner keeps none of the run's
/// descriptors: they are closed here once the child has its copies.
fn spawn(msg: &[u8], passed: Vec<OwnedFd>, sock: &OwnedFd, sfd: &SignalFd) {
    let Ok(passed) = <[OwnedFd; FDS]>::try_from(passed) else {
        return;
    };
    let [ctl, status, out, err] = passed;
    let mut status_pipe = std::fs::File::from(status);
    let Some(args) = decode(msg) else {
        let _ = writeln!(
            status_pipe,
            "E the spawner could not read the run's request"
        );
        return;
    };
    // SAFETY: this process is single-threaded, so the child may allocate
    // and run ordinary code.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let status = OwnedFd::from(status_pipe);
            become_watchdog(args, [ctl, status, out, err], sock, sfd)
        }
        Ok(ForkResult::Parent { .. }) => {}
        Err(e) => {
            let _ = writeln!(status_pipe, "E cannot start the run watchdog: {e}");
        }
    }
}

/// In the forked child: puts the run's descriptors in place and runs the
/// watchdog. Never returns.
fn become_watchdog(args: Args, fds: [OwnedFd; FDS], sock: &OwnedFd, sfd: &SignalFd) -> ! {
    set_comm(WATCHDOG_COMM);
    // Its own process group, as one the daemon starts: a signal meant for
    // the daemon's group does not reach it.
    // SAFETY: plain system call on this process.
    unsafe { libc::setpgid(0, 0) };
    let Ok(null) = std::fs::File::open("/dev/null") else {
        std::process::exit(127);
    };
    // Every source first above every target, so that no move below
    // overwrites another source.
    let high: Vec<OwnedFd> = fds
        .iter()
        .chain([&OwnedFd::from(null)])
        .filter_map(|fd| super::dup_above(fd, 10).ok())
        .collect();
    drop(fds);
    if high.len() != FDS + 1 {
        std::process::exit(127);
    }
    // The spawner's own descriptors are not the run's.
    // SAFETY: closing descriptors this (forked) process owns copies of; the
    // objects that own them in the spawner are never used or dropped here.
    unsafe {
        libc::close(sock.as_raw_fd());
        libc::close(sfd.as_raw_fd());
    }
    for (fd, target) in high.iter().zip([CTL_FD, STATUS_FD, 1, 2, 0]) {
        // SAFETY: dup2 onto a descriptor number this process controls.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            std::process::exit(127);
        }
    }
    drop(high);
    // SAFETY: descriptor 4 is the run's status pipe, put there above.
    let status = unsafe { std::fs::File::from_raw_fd(STATUS_FD) };
    super::watch(args, status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_as_it_was_written() {
        let argv = vec![
            "sh".to_string(),
            "-c".to_string(),
            "echo a=b; exit 3".to_string(),
        ];
        let env = vec![
            (OsString::from("A"), OsString::from("1=2")),
            (OsString::from("EMPTY"), OsString::new()),
            (OsString::from("RAW"), OsString::from_vec(vec![0xff, b'x'])),
        ];
        let cg = PathBuf::from("/sys/fs/cgroup/x/run");
        let req = Request {
            term_at: 5,
            kill_at: 7,
            grace_ms: 1_000,
            cgroup: Some(&cg),
            workdir: None,
            argv: &argv,
            env: &env,
        };
        let a = decode(&req.encode()).expect("decoded");
        assert_eq!((a.term_at, a.kill_at, a.grace_ms), (5, 7, 1_000));
        assert_eq!(a.cgroup.as_deref(), Some(cg.as_path()));
        assert_eq!(a.workdir, None);
        assert_eq!(a.argv, argv.iter().map(OsString::from).collect::<Vec<_>>());
        assert_eq!(a.env.as_deref(), Some(&env[..]));
        assert!(a.spawned);
    }

    #[test]
    fn a_damaged_request_is_refused() {
        let argv = vec!["true".to_string()];
        let req = Request {
            term_at: 1,
            kill_at: 2,
            grace_ms: 3,
            cgroup: None,
            workdir: Some(Path::new("/tmp")),
            argv: &argv,
            env: &[],
        };
        let good = req.encode();
        assert!(decode(&good).is_some());
        // Cut short, a field too many, another format, no command.
        assert!(decode(&good[..good.len() - 3]).is_none());
        let mut longer = good.clone();
        longer.extend_from_slice(b"x\0");
        assert!(decode(&longer).is_none());
        assert!(decode(b"fencecron-spawn-0\x001\x00").is_none());
        let none: Vec<String> = Vec::new();
        let empty = Request { argv: &none, ..req };
        assert!(decode(&empty.encode()).is_none());
    }
}
