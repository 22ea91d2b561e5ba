//! The daemon under faults, through the real binary and real stores: a store
//! that is unreachable at start-up, a renewal refused because another owner
//! took the lease, a job timeout, a SQLite write lock held longer than the
//! lease, systemd notifications, and job output.
//!
//! Every assertion compares facts — the order of events, tokens, the store's
//! clock against the moment a pid was seen dead — never how fast something
//! happened. Time limits only bound how long a test waits before it fails.

use crate::common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use serde_json::Value;

use common::daemon::{
    ev, ev_token, group_alive, i64_field, is, job_toml, long_cmd, pid_alive, pid_of, read_pid_file,
    read_runs, record_cmd, secs, str_field, token_of, wait_pid_gone, write_config, Daemon,
    DaemonOpts,
};
use common::harness::run;
use common::proxy::Proxy;
use common::{unique, Backend, TestStore};

/// Milliseconds since the Unix epoch by this host's real-time clock — the
/// clock the SQLite store reads (`clock_gettime(CLOCK_REALTIME)` without
/// libc, through rustix).
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// `fencecron stale --json --store URL`, parsed.
fn stale_records(store: &str, cwd: &Path) -> Vec<Value> {
    let out = run(
        common::harness::fencecron(cwd)
            .args(["stale", "--json", "--since", "10m", "--store", store]),
        None,
    );
    assert!(
        out.status.success(),
        "fencecron stale failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Array(a)) => a,
        other => panic!("stale --json is not an array: {other:?}"),
    }
}

/// The index of the first event at `start` or later matching `pred`, or a
/// panic naming `what`.
fn index_of(all: &[Value], start: usize, what: &str, pred: impl Fn(&Value) -> bool) -> usize {
    all.iter()
        .skip(start)
        .position(pred)
        .map(|i| i + start)
        .unwrap_or_else(|| panic!("no {what} in the log"))
}

// ---------------------------------------------------------------------------
// Direct database access (never through the daemon or the proxy)

enum Conn {
    Pg(sqlx::PgConnection),
    Sqlite(sqlx::SqliteConnection),
}

/// A direct connection to the test's store, to play "another owner" and to
/// read the stored expiry (also used by `process_tree`).
pub(crate) struct Db {
    rt: tokio::runtime::Runtime,
    conn: Conn,
}

impl Db {
    pub(crate) fn connect(store: &TestStore) -> Db {
        use sqlx::Connection;
        use std::str::FromStr;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let conn = match store.backend {
            Backend::Postgres => Conn::Pg(
                rt.block_on(sqlx::PgConnection::connect(&store.url))
                    .expect("direct PostgreSQL connection"),
            ),
            Backend::Sqlite => {
                // Leaves the journal mode alone (the daemon sets WAL).
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&store.url)
                    .expect("sqlite URL")
                    .busy_timeout(secs(30));
                Conn::Sqlite(
                    rt.block_on(sqlx::SqliteConnection::connect_with(&opts))
                        .expect("direct SQLite connection"),
                )
            }
            Backend::MySql => unimplemented!("not needed here"),
        };
        Db { rt, conn }
    }

    /// Another owner takes the lease: new owner id (a UUID, as every owner
    /// id the store holds: a row with anything else does not decode), next
    /// fence, same expiry. Returns the number of rows changed.
    pub(crate) fn intrude(&mut self, resource: &str) -> u64 {
        let rt = &self.rt;
        match &mut self.conn {
            Conn::Pg(c) => rt
                .block_on(
                    sqlx::query(
                        "UPDATE fencecron_leases SET owner_id = '00000000-0000-4000-8000-00000000beef', fence = fence + 1 \
                         WHERE resource = $1",
                    )
                    .bind(resource)
                    .execute(c),
                )
                .expect("intruder update")
                .rows_affected(),
            Conn::Sqlite(c) => rt
                .block_on(
                    sqlx::query(
                        "UPDATE fencecron_leases SET owner_id = '00000000-0000-4000-8000-00000000beef', fence = fence + 1 \
                         WHERE resource = ?1",
                    )
                    .bind(resource)
                    .execute(c),
                )
                .expect("intruder update")
                .rows_affected(),
        }
    }

    /// (fence, owner_id, expires_at_ms) of a resource.
    fn lease(&mut self, resource: &str) -> (i64, String, i64) {
        let rt = &self.rt;
        match &mut self.conn {
            Conn::Pg(c) => rt.block_on(
                sqlx::query_as(
                    "SELECT fence, owner_id, expires_at_ms FROM fencecron_leases \
                     WHERE resource = $1",
                )
                .bind(resource)
                .fetch_one(c),
            ),
            Conn::Sqlite(c) => rt.block_on(
                sqlx::query_as(
                    "SELECT fence, owner_id, expires_at_ms FROM fencecron_leases \
                     WHERE resource = ?1",
                )
                .bind(resource)
                .fetch_one(c),
            ),
        }
        .expect("read the lease row")
    }
}

// ---------------------------------------------------------------------------
// 1. Store unreachable at start-up

#[test]
fn store_unreachable_at_startup_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "store_unreachable_at_startup_postgres")
    else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    // Unreachable before the daemon ever talks to it: no migration, no
    // connection in the pool.
    proxy.blackhole();
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("startdown");
    let runs_file = dir.path().join("runs");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &record_cmd(&runs_file),
            "lease = \"5s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("startdown", &config, &proxied));
    d.expect("daemon_started", ev("daemon_started"), secs(30));
    let unavailable = d.expect(
        "store_unavailable for migrate or acquire",
        |e| {
            is(e, "store_unavailable")
                && matches!(str_field(e, "operation"), Some("migrate" | "acquire"))
        },
        secs(30),
    );
    eprintln!("while unreachable: {unavailable}");
    let skipped = d.expect(
        "occurrence_skipped with reason store_unavailable",
        |e| {
            is(e, "occurrence_skipped")
                && str_field(e, "job") == Some(job.as_str())
                && str_field(e, "reason") == Some("store_unavailable")
        },
        secs(30),
    );
    assert!(
        str_field(&skipped, "scheduled_at").is_some(),
        "occurrence_skipped without scheduled_at: {skipped}"
    );
    assert!(
        d.is_running(),
        "the daemon exited because the store was unreachable at start-up: {}",
        d.summary()
    );
    assert!(
        d.events("lease_acquired").is_empty() && d.events("job_started").is_empty(),
        "a lease was taken or a job started while the store was unreachable: {}",
        d.summary()
    );
    assert!(
        read_runs(&runs_file).is_empty(),
        "the job ran while black-holed"
    );

    let cut = d.len();
    proxy.restore();
    // Scheduling resumes without a restart. (The first lease_acquired may be
    // an attempt given up while the store was away that won once it
    // answered: that lease is released unused, so look for a run.)
    let (i_start, started) = d.expect_from(
        cut,
        "job_started after the store came back",
        |e| is(e, "job_started") && str_field(e, "job") == Some(job.as_str()),
        secs(60),
    );
    let token = token_of(&started);
    assert!(token >= 1, "{started}");
    let (i_acq, acquired) = d.expect_from(
        cut,
        "lease_acquired for the started token",
        ev_token("lease_acquired", token),
        secs(1),
    );
    assert!(i_acq < i_start, "job_started before lease_acquired");
    assert!(
        str_field(&acquired, "owner_id").is_some_and(|o| !o.is_empty()),
        "lease_acquired without an owner_id: {acquired}"
    );
    let (_, finished) = d.expect_from(
        i_start,
        "job_finished",
        ev_token("job_finished", token),
        secs(15),
    );
    assert_eq!(i64_field(&finished, "exit_code"), Some(0), "{finished}");
    assert!(
        read_runs(&runs_file).iter().any(|r| r.token == token),
        "the job did not record a run with token {token}: {:?}",
        read_runs(&runs_file)
    );
    assert!(d.is_running());
    let st = d.stop(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
}

// ---------------------------------------------------------------------------
// 2. Renewal refused

/// A job ignoring SIGTERM (its `sleep`s inherit the ignored disposition) is
/// running when another owner takes its lease in the store. The next renewal
/// is refused: `lease_lost` (renew_refused), SIGTERM to the group at once,
/// SIGKILL after kill_grace, no release, and a stored `lease_lost` record.
fn renewal_refused(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("refused");
    let argv: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        r#"trap '' TERM; echo $$ > "$1/pid"; while :; do sleep 1; done"#.into(),
        "sh".into(),
        dir.path().display().to_string(),
    ];
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &argv,
            "lease = \"6s\"\nrenew_every = \"2s\"\nkill_grace = \"1s\"",
        )],
    );
    let node = format!("refused-{}", format!("{backend:?}").to_lowercase());
    let mut d = Daemon::spawn(DaemonOpts::new(&node, &config, &store.url).debug());
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let t1 = token_of(&started);
    let pgid = pid_of(&started);
    let owner = str_field(
        &d.expect("lease_acquired", ev_token("lease_acquired", t1), secs(5)),
        "owner_id",
    )
    .expect("owner_id")
    .to_string();
    // The trap is installed once the pid file exists.
    assert_eq!(read_pid_file(&dir.path().join("pid"), secs(10)), pgid);
    // After the daemon created the database (SQLite).
    let mut db = Db::connect(&store);

    let cut = d.len();
    assert_eq!(
        db.intrude(&job),
        1,
        "the lease row of {job} was not updated"
    );
    eprintln!("intruder took {job} (was token {t1}, owner {owner})");

    let (_, lost) = d.expect_from(cut, "lease_lost", ev_token("lease_lost", t1), secs(20));
    d.expect_from(
        cut,
        "job_finished after SIGKILL",
        ev_token("job_finished", t1),
        secs(20),
    );
    assert_eq!(str_field(&lost, "reason"), Some("renew_refused"), "{lost}");
    assert_eq!(str_field(&lost, "owner_id"), Some(owner.as_str()), "{lost}");
    assert_eq!(str_field(&lost, "job"), Some(job.as_str()), "{lost}");
    assert_eq!(str_field(&lost, "node"), Some(node.as_str()), "{lost}");

    let all = d.all();
    assert!(
        !all[..cut].iter().any(ev_token("job_cancelled", t1)),
        "the job was cancelled before the intrusion"
    );
    let i_lost = index_of(&all, cut, "lease_lost", ev_token("lease_lost", t1));
    let i_term = index_of(&all, cut, "job_cancelled", ev_token("job_cancelled", t1));
    let i_kill = index_of(
        &all,
        i_term + 1,
        "a second job_cancelled",
        ev_token("job_cancelled", t1),
    );
    let i_fin = index_of(&all, cut, "job_finished", ev_token("job_finished", t1));
    for (i, sig) in [(i_term, "SIGTERM"), (i_kill, "SIGKILL")] {
        assert_eq!(
            str_field(&all[i], "reason"),
            Some("lease_lost"),
            "{}",
            all[i]
        );
        assert_eq!(str_field(&all[i], "signal"), Some(sig), "{}", all[i]);
    }
    assert!(
        i_lost < i_term && i_term < i_kill && i_kill < i_fin,
        "order: lease_lost@{i_lost} job_cancelled(SIGTERM)@{i_term} \
         job_cancelled(SIGKILL)@{i_kill} job_finished@{i_fin}"
    );
    assert_eq!(
        str_field(&all[i_fin], "signal"),
        Some("SIGKILL"),
        "{}",
        all[i_fin]
    );
    assert_eq!(
        str_field(&all[i_fin], "outcome"),
        Some("lease_lost"),
        "{}",
        all[i_fin]
    );
    eprintln!(
        "SIGTERM at {}, SIGKILL at {} (kill_grace 1s)",
        str_field(&all[i_term], "timestamp").unwrap_or("?"),
        str_field(&all[i_kill], "timestamp").unwrap_or("?")
    );
    assert!(
        wait_pid_gone(pgid, secs(10)),
        "the job (pid {pgid}) survived SIGKILL"
    );
    assert!(
        !group_alive(pgid),
        "something of the job's process group {pgid} survived"
    );
    // The refused token is never renewed again.
    assert!(
        !all[i_lost..].iter().any(ev_token("lease_renewed", t1)),
        "token {t1} was renewed after lease_lost"
    );

    // The loss is stored for `fencecron stale` on every host (written in the
    // background: poll for it).
    let deadline = Instant::now() + secs(20);
    let record = loop {
        let found = stale_records(&store.url, dir.path()).into_iter().find(|r| {
            str_field(r, "kind") == Some("lease_lost")
                && str_field(r, "resource") == Some(job.as_str())
                && i64_field(r, "token") == Some(t1)
        });
        if let Some(r) = found {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no stored lease_lost record for {job} token {t1}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        str_field(&record, "owner_id"),
        Some(owner.as_str()),
        "{record}"
    );
    assert_eq!(str_field(&record, "node"), Some(node.as_str()), "{record}");
    assert_eq!(str_field(&record, "job"), Some(job.as_str()), "{record}");

    let st = d.stop(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
    // Only now is the log complete: the lost lease was never released (a
    // release of the lost token would be refused anyway, or worse, hit a
    // later owner with the same id — impossible, but not attempted either).
    assert!(
        !d.all().iter().any(ev_token("lease_released", t1)),
        "lease_released for the lost token {t1}"
    );
}

#[test]
fn renewal_refused_kills_sqlite() {
    renewal_refused(Backend::Sqlite, "renewal_refused_kills_sqlite");
}

#[test]
fn renewal_refused_kills_postgres() {
    renewal_refused(Backend::Postgres, "renewal_refused_kills_postgres");
}

// ---------------------------------------------------------------------------
// 3. Timeout

#[test]
fn timeout_terminates_and_releases_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "timeout").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("timeout");
    let argv: Vec<String> = vec!["sleep".into(), "30".into()];
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &argv,
            "lease = \"5s\"\ntimeout = \"2s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("timeout", &config, &store.url));
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let token = token_of(&started);
    let pid = pid_of(&started);
    let (i_rel, _) = d.expect_from(
        0,
        "lease_released",
        ev_token("lease_released", token),
        secs(20),
    );
    let all = d.all();
    let i_start = index_of(&all, 0, "job_started", ev_token("job_started", token));
    let i_cancel = index_of(&all, 0, "job_cancelled", ev_token("job_cancelled", token));
    let i_fin = index_of(&all, 0, "job_finished", ev_token("job_finished", token));
    assert_eq!(
        str_field(&all[i_cancel], "reason"),
        Some("timeout"),
        "{}",
        all[i_cancel]
    );
    assert_eq!(
        str_field(&all[i_cancel], "signal"),
        Some("SIGTERM"),
        "{}",
        all[i_cancel]
    );
    assert_eq!(
        str_field(&all[i_fin], "signal"),
        Some("SIGTERM"),
        "{}",
        all[i_fin]
    );
    assert_eq!(
        str_field(&all[i_fin], "outcome"),
        Some("timed_out"),
        "{}",
        all[i_fin]
    );
    assert!(
        i64_field(&all[i_fin], "exit_code").is_none(),
        "{}",
        all[i_fin]
    );
    assert!(
        i_start < i_cancel && i_cancel < i_fin && i_fin < i_rel,
        "order: job_started@{i_start} job_cancelled@{i_cancel} job_finished@{i_fin} \
         lease_released@{i_rel}"
    );
    assert_eq!(
        all.iter()
            .filter(|e| ev_token("job_cancelled", token)(e))
            .count(),
        1,
        "sleep dies on SIGTERM: no SIGKILL needed"
    );
    assert!(
        !all.iter().any(ev_token("lease_lost", token)),
        "a timeout is not a lost lease"
    );
    assert!(!pid_alive(pid), "the job (pid {pid}) is still running");
    assert!(d.is_running());
}

// ---------------------------------------------------------------------------
// 4. SQLite write lock held longer than the lease

/// Another connection holding the SQLite write lock until it is released;
/// rolled back (which also ends the lock) when dropped.
struct Locker {
    rt: tokio::runtime::Runtime,
    conn: Option<sqlx::SqliteConnection>,
}

impl Locker {
    /// Takes the write lock on the store at `url` (`BEGIN IMMEDIATE`);
    /// returns once the lock is held.
    fn start(url: &str) -> Locker {
        use sqlx::{Connection, Executor};
        use std::str::FromStr;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .expect("sqlite URL")
            .busy_timeout(secs(30));
        let conn = rt.block_on(async {
            let mut conn = sqlx::SqliteConnection::connect_with(&opts)
                .await
                .expect("the locker's SQLite connection");
            conn.execute("BEGIN IMMEDIATE")
                .await
                .expect("the locker takes the write lock");
            conn
        });
        Locker {
            rt,
            conn: Some(conn),
        }
    }

    /// Commits, which ends the lock.
    fn release(&mut self) {
        use sqlx::{Connection, Executor};
        let mut conn = self.conn.take().expect("the lock is held");
        self.rt.block_on(async {
            conn.execute("COMMIT").await.expect("the locker commits");
            conn.close().await.expect("close the locker's connection");
        });
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Closing the connection rolls the transaction back.
            let _ = self.rt.block_on(sqlx::Connection::close(conn));
        }
    }
}

/// The test holds a write lock on the SQLite store from mid-run until past
/// the lease's stored expiry, and checks each step while the lock is still
/// held (so nothing can have changed the lease meanwhile): the job dies
/// before that expiry, the lease row is untouched, and the daemon reports
/// the lease as unconfirmed and lost. Once the lock is gone, the job runs
/// again under a higher token.
#[test]
fn sqlite_write_lock_longer_than_the_lease() {
    let store = TestStore::new(Backend::Sqlite, "sqlite_lock").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("locked");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &long_cmd(dir.path()),
            "lease = \"5s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("sqlite-lock", &config, &store.url).debug());
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let t1 = token_of(&started);
    let pid = pid_of(&started);
    assert_eq!(
        read_pid_file(&dir.path().join(format!("pid.{t1}")), secs(10)),
        pid,
        "job_started.pid is not the job's pid"
    );
    // Mid-run: a renewal went through.
    d.expect("lease_renewed", ev_token("lease_renewed", t1), secs(15));
    let mut db = Db::connect(&store);

    let cut = d.len();
    let mut locker = Locker::start(&store.url);
    // Nothing can commit while the lock is held: this is the expiry the
    // store will compare against.
    let (fence, _, expires_at_ms) = db.lease(&job);
    assert_eq!(fence, t1, "someone else holds the lease");
    eprintln!("write lock held; stored expiry {expires_at_ms} for token {t1}");

    let deadline = Instant::now() + secs(20);
    while pid_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the job (pid {pid}) is still running 20 s into the lock, with a 5 s lease"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let dead_at_ms = wall_ms();
    let (fence_after, _, expires_after) = db.lease(&job);
    eprintln!(
        "job pid {pid} first seen dead at {dead_at_ms}, {} ms before the stored expiry \
         {expires_at_ms}",
        expires_at_ms - dead_at_ms
    );
    assert_eq!(
        (fence_after, expires_after),
        (t1, expires_at_ms),
        "the lease changed while the job was dying: the lock did not stall the store"
    );
    assert!(
        dead_at_ms < expires_at_ms,
        "the job was first seen dead at {dead_at_ms}, {} ms after the stored expiry \
         {expires_at_ms}: it outlived its lease",
        dead_at_ms - expires_at_ms
    );
    // The stored expiry is one the daemon reported.
    let all = d.all();
    assert!(
        all.iter()
            .any(|e| (is(e, "lease_renewed") || is(e, "lease_acquired"))
                && token_of(e) == t1
                && str_field(e, "expires_at")
                    .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                    .map(|t| t.timestamp_millis())
                    == Some(expires_at_ms)),
        "no lease_acquired/lease_renewed reported the stored expiry {expires_at_ms}"
    );

    let (_, cancelled) = d.expect_from(
        cut,
        "job_cancelled",
        ev_token("job_cancelled", t1),
        secs(10),
    );
    assert_eq!(
        str_field(&cancelled, "reason"),
        Some("lease_unconfirmed"),
        "{cancelled}"
    );
    let (_, lost) = d.expect_from(cut, "lease_lost", ev_token("lease_lost", t1), secs(10));
    assert_eq!(
        str_field(&lost, "reason"),
        Some("deadline_passed"),
        "{lost}"
    );
    d.expect_from(
        cut,
        "store_unavailable for a stalled renewal",
        |e| is(e, "store_unavailable") && str_field(e, "operation") == Some("renew"),
        secs(15),
    );
    // Still under the lock: no other token was issued.
    assert!(
        !d.all().iter().skip(cut).any(|e| is(e, "job_started")),
        "a job started while the store was locked"
    );

    // Longer than the lease: the lease expires under the lock.
    let deadline = Instant::now() + secs(20);
    while wall_ms() <= expires_at_ms {
        assert!(
            Instant::now() < deadline,
            "the stored expiry {expires_at_ms} did not pass"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let released = d.len();
    locker.release();
    assert!(d.is_running(), "the daemon exited during the lock");
    let again = d.expect_from(
        released,
        "job_started after the lock was released",
        |e| is(e, "job_started") && token_of(e) > t1,
        secs(30),
    );
    eprintln!("ran again with token {}", token_of(&again.1));
    assert!(d.is_running());
    let st = d.stop(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
    assert!(
        !d.all().iter().any(ev_token("lease_released", t1)),
        "the unconfirmed lease {t1} was released"
    );
}

// ---------------------------------------------------------------------------
// 5. systemd notify

/// Datagrams received on `sock` until one contains the line `want`: all of
/// them, in order (the last one contains `want`).
fn recv_until(sock: &UnixDatagram, want: &str, timeout: Duration) -> Vec<String> {
    recv_until_line(sock, |l| l == want, timeout)
}

#[test]
fn systemd_notify_ready_reloading_stopping() {
    let store = TestStore::new(Backend::Sqlite, "notify").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let job = unique("notify");
    // Once a year: nothing runs during the test.
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "0 0 0 1 1 *",
            &record_cmd(&dir.path().join("runs")),
            "lease = \"5s\"",
        )],
    );
    let mut opts = DaemonOpts::new("notify", &config, &store.url);
    opts.env
        .push(("NOTIFY_SOCKET".into(), sock_path.display().to_string()));
    let mut d = Daemon::spawn(opts);

    let first = recv_until(&sock, "READY=1", secs(30));
    assert!(
        first
            .iter()
            .flat_map(|m| m.lines())
            .any(|l| l.starts_with("STATUS=") && l.len() > "STATUS=".len()),
        "no STATUS= with READY=1: {first:?}"
    );
    d.expect("daemon_started", ev("daemon_started"), secs(5));

    let cut = d.len();
    d.signal(Signal::SIGHUP);
    let reload = recv_until(&sock, "RELOADING=1", secs(15));
    assert!(
        !reload
            .iter()
            .flat_map(|m| m.lines())
            .any(|l| l == "READY=1"),
        "READY=1 before RELOADING=1 on SIGHUP: {reload:?}"
    );
    let after = recv_until(&sock, "READY=1", secs(15));
    eprintln!("after RELOADING=1: {after:?}");
    d.expect_from(cut, "config_reloaded", ev("config_reloaded"), secs(5));

    d.signal(Signal::SIGTERM);
    let stopping = recv_until(&sock, "STOPPING=1", secs(15));
    eprintln!("on SIGTERM: {stopping:?}");
    let st = d.wait_exit(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
    assert!(
        d.events("daemon_stopped").len() == 1,
        "no daemon_stopped: {}",
        d.summary()
    );
}

/// READY=1 waits for the store: while it does not answer, systemd hears
/// only STATUS= lines saying what the daemon waits for (and the watchdog
/// pings of a scheduler loop that keeps turning); once it answers, READY=1.
#[test]
fn systemd_ready_waits_for_the_store_and_the_watchdog_is_pinged_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "notify_ready_postgres") else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    proxy.blackhole();
    let dir = tempfile::tempdir().expect("temp dir");
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let job = unique("ready");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(&job, "0 0 0 1 1 *", &["true".to_string()], "")],
    );
    let mut opts = DaemonOpts::new("ready", &config, &proxied);
    opts.env
        .push(("NOTIFY_SOCKET".into(), sock_path.display().to_string()));
    // 2 s: pings are due every second. No WATCHDOG_PID: it applies to the
    // process that reads it, as sd_watchdog_enabled(3) has it.
    opts.env.push(("WATCHDOG_USEC".into(), "2000000".into()));
    let mut d = Daemon::spawn(opts);

    let lines = |msgs: &[String]| -> Vec<String> {
        msgs.iter()
            .flat_map(|m| m.lines().map(str::to_string))
            .collect()
    };
    // The rate is measured from the first ping, so a slow start of the
    // process on a loaded machine does not count as missing pings.
    let mut seen = lines(&recv_until_line(&sock, |l| l == "WATCHDOG=1", secs(60)));
    let first_ping = Instant::now();
    let waiting = recv_until_line(
        &sock,
        |l| l.starts_with("STATUS=waiting for the store:"),
        secs(60),
    );
    let elapsed = first_ping.elapsed();
    seen.extend(lines(&waiting));
    assert!(
        !seen.iter().any(|l| l == "READY=1"),
        "READY=1 while the store does not answer: {seen:?}"
    );
    let pings = seen.iter().filter(|l| *l == "WATCHDOG=1").count() as u64;
    assert!(
        pings + 2 >= elapsed.as_secs(),
        "{pings} watchdog pings in {elapsed:?} (one a second expected): {seen:?}"
    );

    proxy.restore();
    let ready = lines(&recv_until_line(&sock, |l| l == "READY=1", secs(60)));
    assert!(
        ready
            .iter()
            .any(|l| l.starts_with("STATUS=scheduling 1 job(s)")),
        "no STATUS= with READY=1: {ready:?}"
    );
    let st = d.stop(secs(30));
    assert!(st.is_some_and(|s| s.code() == Some(0)), "exit: {st:?}");
}

/// Datagrams on `sock` until a line of one matches `want`: all of them.
pub(crate) fn recv_until_line(
    sock: &UnixDatagram,
    want: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        assert!(
            Instant::now() < deadline,
            "no matching notification within {timeout:?}; got {got:?}"
        );
        match sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                eprintln!("[notify] {msg:?}");
                let done = msg.lines().any(&want);
                got.push(msg);
                if done {
                    return got;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Job output

#[test]
fn job_output_is_logged_per_line_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "job_output").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("output");
    let argv: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        r#"echo "first out $FENCECRON_TOKEN"; echo "only err" >&2; echo "second  out""#.into(),
    ];
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(&job, "*/2 * * * * *", &argv, "lease = \"5s\"")],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("output", &config, &store.url));
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let token = token_of(&started);
    let (i_fin, finished) =
        d.expect_from(0, "job_finished", ev_token("job_finished", token), secs(15));
    assert_eq!(i64_field(&finished, "exit_code"), Some(0), "{finished}");
    let all = d.all();
    let outputs: Vec<(usize, &Value)> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| ev_token("job_output", token)(e))
        .collect();
    for (i, e) in &outputs {
        assert_eq!(str_field(e, "job"), Some(job.as_str()), "{e}");
        assert!(
            *i < i_fin,
            "job_output after job_finished: {e} (job_finished at {i_fin})"
        );
    }
    let lines = |stream: &str| -> Vec<String> {
        outputs
            .iter()
            .filter(|(_, e)| str_field(e, "stream") == Some(stream))
            .map(|(_, e)| {
                str_field(e, "line")
                    .unwrap_or_else(|| panic!("no line: {e}"))
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        lines("stdout"),
        vec![format!("first out {token}"), "second  out".to_string()],
        "stdout lines, in order, without their newline"
    );
    assert_eq!(lines("stderr"), vec!["only err".to_string()]);
    assert_eq!(
        outputs.len(),
        3,
        "unexpected job_output events: {outputs:?}"
    );
    assert!(d.is_running());
}

// ---------------------------------------------------------------------------
// 7. A store that answers after the occurrence was given up

/// A daemon on PostgreSQL through a [`Proxy`], with one job every 10 s
/// and one pool connection (an acquire queues behind a held one instead of
/// racing it on a second connection, so the held statement is the first
/// the store executes when the traffic flows again), after its first run.
struct ProxiedJob {
    proxy: Proxy,
    daemon: Daemon,
    job: String,
    first_token: i64,
    _dir: tempfile::TempDir,
}

impl ProxiedJob {
    fn start(url: &str, node: &str, lease: &str) -> ProxiedJob {
        let (proxy, proxied) = Proxy::for_url(url, 5432);
        let dir = tempfile::tempdir().expect("temp dir");
        let job = unique(node);
        let config = dir.path().join("jobs.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nmax_connections = 1\n\n{}",
                job_toml(
                    &job,
                    "*/10 * * * * *",
                    &record_cmd(&dir.path().join("runs")),
                    &format!("lease = \"{lease}\""),
                )
            ),
        )
        .expect("write jobs.toml");
        let daemon = Daemon::spawn(DaemonOpts::new(node, &config, &proxied).debug());
        let (i_fin, first) =
            daemon.expect_from(0, "a first job_finished", ev("job_finished"), secs(40));
        daemon.expect_from(i_fin, "its lease_released", ev("lease_released"), secs(10));
        ProxiedJob {
            proxy,
            daemon,
            job,
            first_token: token_of(&first),
            _dir: dir,
        }
    }
}

/// Holds the proxy's traffic across the job's next instant (every
/// `period_ms`, at least 1.5 s away), from 1 s before it, with no other
/// call in flight then: one the daemon sends meanwhile (a trigger poll, a
/// heartbeat: on one connection it would hold it, and the instant's
/// acquire would wait for the pool instead of reaching the store) is let
/// through and answered, as the proxy sees, before the hold resumes. What
/// the test waits for is the wall clock, the one the daemon's schedule
/// fires on: the instant is a time the product fixes, not a guess at how
/// long the daemon takes; that the hold was on, with nothing else in
/// flight, when the instant came is checked, not assumed (else the next
/// instant is tried). Returns the daemon's log position then, the instant
/// as `scheduled_at` spells it, and the instant in ms.
fn hold_before_next_instant(proxy: &Proxy, d: &Daemon, period_ms: i64) -> (usize, String, i64) {
    let until = Instant::now() + secs(60);
    let ms = Duration::from_millis;
    loop {
        let now = wall_ms();
        let mut instant = (now / period_ms + 1) * period_ms;
        if instant - now < 1_500 {
            instant += period_ms;
        }
        while wall_ms() < instant - 1_000 {
            assert!(
                Instant::now() < until,
                "the wall clock never reached {instant} - 1 s"
            );
            std::thread::sleep(ms(10));
        }
        let cut = d.len();
        proxy.hold();
        let mut held_at = wall_ms();
        while wall_ms() < instant {
            if !proxy.idle() {
                proxy.release();
                while !proxy.idle() {
                    assert!(
                        Instant::now() < until,
                        "a call through the proxy was never answered"
                    );
                    std::thread::sleep(ms(1));
                }
                proxy.hold();
                held_at = wall_ms();
            }
            std::thread::sleep(ms(1));
        }
        let before = UNIX_EPOCH + ms(instant as u64);
        if held_at < instant && !proxy.held_requests().iter().any(|t| *t < before) {
            let at = chrono::DateTime::from_timestamp_millis(instant)
                .expect("instant")
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            return (cut, at, instant);
        }
        proxy.release();
        eprintln!(
            "the hold did not begin clear of other calls before {instant}; trying the next instant"
        );
    }
}

/// [`hold_before_next_instant`] for the 10-second jobs of [`ProxiedJob`].
fn hold_across_next_instant(proxy: &Proxy, d: &Daemon) -> (usize, String) {
    let (cut, at, _) = hold_before_next_instant(proxy, d, 10_000);
    (cut, at)
}

/// The store holds an acquire past the occurrence's give-up (a lease after
/// the instant, here before the next instant), then answers: the acquire
/// wins in the store, but nothing may run under it. The daemon gives the
/// lease back at once, and the occurrence with it: the store no longer
/// counts the instant as taken, and the lease is free long before it would
/// have expired (5 s here), so the next instant runs. Whether the daemon
/// sees the late answer (`lease_acquired` then `lease_released`) or only
/// learns of the win by sweeping after the call timed out
/// (`occurrence_given_back`) depends on which limit fires first; both are
/// the same 5 s here.
#[test]
fn late_win_after_give_up_is_given_back_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "late_win_after_give_up_is_given_back")
    else {
        return;
    };
    let p = ProxiedJob::start(&store.url, "latewin", "5s");
    let (proxy, mut d, job, first_token) = (&p.proxy, p.daemon, p.job, p.first_token);
    // Hold the store's traffic from just before the next instant until the
    // daemon has given that occurrence up (5 s after it). The held call must
    // be the acquire: when a trigger poll or a heartbeat took the node's one
    // connection (`max_connections = 1`) just before the hold, the acquire
    // waited for the pool and never reached the store, and there is no late
    // win to give back; the log says so (that call's own store_unavailable),
    // and the next instant is tried.
    let mut attempts = 0;
    let (cut, at) = loop {
        attempts += 1;
        let (cut, at) = hold_across_next_instant(proxy, &d);
        let (i, given_up) = d.expect_from(
            cut,
            "occurrence_skipped store_unavailable while held",
            |e| {
                is(e, "occurrence_skipped")
                    && str_field(e, "reason") == Some("store_unavailable")
                    && str_field(e, "scheduled_at") == Some(at.as_str())
            },
            secs(15),
        );
        let crowded: Vec<Value> = d.all()[cut..i]
            .iter()
            .filter(|e| is(e, "store_unavailable") && str_field(e, "operation") != Some("acquire"))
            .cloned()
            .collect();
        // The held statements reach the store once the traffic flows again:
        // at once, the event being the proof that the occurrence stopped
        // waiting (it is logged after the late answer was handed to the
        // give-back, in the same poll: `Occurrence::unanswered`,
        // `claim::round`), so whatever the store answers now is late.
        proxy.release();
        eprintln!("given up: {given_up}");
        if crowded.is_empty() {
            break (cut, at);
        }
        eprintln!("another call held the connection, trying the next instant: {crowded:?}");
        assert!(
            attempts < 4,
            "{attempts} instants in a row found the connection taken"
        );
        let n = d.len();
        d.expect_from(n, "the store answers again", ev("lease_released"), secs(25));
    };

    // The late win is given back with no job under it.
    let (_, back) = d.expect_from(
        cut,
        "the late win given back (lease_released or occurrence_given_back)",
        |e| {
            (is(e, "lease_released") && token_of(e) > first_token)
                || (is(e, "occurrence_given_back")
                    && str_field(e, "scheduled_at") == Some(at.as_str()))
        },
        secs(10),
    );
    eprintln!("given back: {back}");
    let lease = common::daemon::lease_list(&store.url)
        .into_iter()
        .find(|l| str_field(l, "resource") == Some(job.as_str()))
        .expect("the job's lease row");
    assert_eq!(
        lease["held"], false,
        "still held after the give-back: {lease}"
    );
    let late_token = i64_field(&lease, "token").expect("token");
    assert!(
        late_token > first_token,
        "the held acquire never won: {lease}"
    );
    assert_ne!(
        str_field(&lease, "last_occurrence"),
        Some(at.as_str()),
        "the given-up instant still counts as taken: {lease}"
    );
    // The next instant runs, with a larger token; none ran under the late
    // one, nor for the given-up instant.
    let (_, next) = d.expect_from(
        cut,
        "a later job_started",
        |e| is(e, "job_started") && token_of(e) > late_token,
        secs(15),
    );
    assert!(
        d.events("job_started")
            .iter()
            .all(|e| token_of(e) != late_token && str_field(e, "scheduled_at") != Some(at.as_str())),
        "a job ran under the lease won after its occurrence was given up: {}",
        d.summary()
    );
    eprintln!("next run: {next}");
    let st = d.stop(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
}

/// A store that hangs across an instant for longer than one call's time
/// limit (5 s): the first acquire gives up here, but its statement is still
/// delivered and commits once the traffic flows again, so the store names
/// this node's owner id as the occurrence's winner. The retry, sent under
/// the same owner id, adopts that win and runs the occurrence, instead of
/// finding its own occurrence "taken" and leaving the instant to nobody (a
/// ghost owner, with only a debug line to show for it).
#[test]
fn hung_store_across_an_instant_still_runs_it_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "hung_store_across_an_instant") else {
        return;
    };
    let p = ProxiedJob::start(&store.url, "hung", "30s");
    let (proxy, mut d, first_token) = (&p.proxy, p.daemon, p.first_token);
    // Hang the store from just before the next instant until the first
    // acquire for it has timed out.
    let (cut, at) = hold_across_next_instant(proxy, &d);
    let (_, timed_out) = d.expect_from(
        cut,
        "store_unavailable for the held acquire, with a retry",
        |e| {
            is(e, "store_unavailable")
                && str_field(e, "operation") == Some("acquire")
                && i64_field(e, "retry_in_ms").is_some()
        },
        secs(15),
    );
    proxy.release();
    eprintln!("timed out: {timed_out}");
    let (_, started) = d.expect_from(
        cut,
        "job_started for the instant the store hung across",
        |e| is(e, "job_started") && str_field(e, "scheduled_at") == Some(at.as_str()),
        secs(15),
    );
    assert!(token_of(&started) > first_token, "{started}");
    assert!(
        d.events("occurrence_taken")
            .iter()
            .chain(d.events("occurrence_skipped").iter())
            .all(|e| str_field(e, "scheduled_at") != Some(at.as_str())),
        "the instant was also reported as taken or skipped: {}",
        d.summary()
    );
    let st = d.stop(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
}

/// A stop (SIGINT) while an acquire is in flight: the daemon stops waiting
/// for it, but should the acquire still win once the store answers, that
/// lease is released before the daemon exits, so the other nodes are not
/// locked out of the job for a lease. (A drain, SIGTERM, waits for the
/// answer instead and runs a win: `tests/it/drain.rs`.)
#[test]
fn shutdown_releases_an_acquire_in_flight_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "shutdown_releases_an_acquire_in_flight")
    else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("stopinflight");
    let runs_file = dir.path().join("runs");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nmax_connections = 2\n\n{}",
            job_toml(
                &job,
                "*/2 * * * * *",
                &record_cmd(&runs_file),
                "lease = \"30s\"",
            )
        ),
    )
    .expect("write jobs.toml");
    // Debug: `occurrence_abandoned` says when the daemon stopped waiting.
    let mut d = Daemon::spawn(DaemonOpts::new("stopinflight", &config, &proxied).debug());
    let (i_fin, _) = d.expect_from(0, "a first job_finished", ev("job_finished"), secs(30));
    let (_, released) = d.expect_from(i_fin, "its lease_released", ev("lease_released"), secs(10));
    let first_token = token_of(&released);

    // Hold the store's traffic across the next instant until the claim
    // the daemon sends at the instant is seen waiting in the proxy: a call
    // in flight, unanswered. Two connections: the trigger poll (every 2 s,
    // as the job) or a heartbeat sent before the instant holds one, and
    // the claim still reaches the store on the other.
    let mut attempts = 0;
    let (cut, at) = loop {
        attempts += 1;
        let (cut, at, instant_ms) = hold_before_next_instant(&proxy, &d, 2_000);
        let instant = UNIX_EPOCH + Duration::from_millis(instant_ms as u64);
        let deadline = Instant::now() + secs(10);
        while !proxy.held_requests().iter().any(|t| *t >= instant) {
            if wall_ms() > instant_ms + 3_000 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the wall clock never passed {at} + 3 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if proxy.held_requests().iter().any(|t| *t >= instant) {
            break (cut, at);
        }
        eprintln!(
            "no call reached the store after {at} (held: {:?}); trying the next instant",
            proxy.held_requests()
        );
        proxy.release();
        assert!(
            attempts < 4,
            "{attempts} instants in a row sent nothing the proxy saw"
        );
    };
    d.signal(Signal::SIGINT);
    d.expect_from(cut, "daemon_stopping", ev("daemon_stopping"), secs(5));
    // The answer is let through only once the daemon has stopped waiting
    // for it, as it says: a win it brings is late.
    d.expect_from(
        cut,
        "occurrence_abandoned for the instant in flight",
        |e| is(e, "occurrence_abandoned") && str_field(e, "scheduled_at") == Some(at.as_str()),
        secs(5),
    );
    proxy.release();

    let st = d.wait_exit(secs(20));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}; {}",
        d.summary()
    );
    let (i_late, late) = d.expect_from(
        cut,
        "lease_acquired of the acquire that was in flight",
        ev("lease_acquired"),
        secs(0),
    );
    let late_token = token_of(&late);
    assert!(late_token > first_token, "{late}");
    d.expect_from(
        i_late,
        "lease_released of it before exiting",
        ev_token("lease_released", late_token),
        secs(0),
    );
    assert!(
        d.events("job_started")
            .iter()
            .all(|e| token_of(e) != late_token),
        "a job started during shutdown: {}",
        d.summary()
    );
    let lease = common::daemon::lease_list(&store.url)
        .into_iter()
        .find(|l| str_field(l, "resource") == Some(job.as_str()))
        .expect("the job's lease row");
    assert_eq!(i64_field(&lease, "token"), Some(late_token), "{lease}");
    assert_eq!(lease["held"], false, "left held after shutdown: {lease}");
}

// ---------------------------------------------------------------------------
// 8. One WARN per job per outage

/// The store is black-holed for a few seconds while two jobs run every
/// second: each job logs one WARN `store_unavailable` (the first failure
/// of the outage), the later ones at DEBUG, and when the store answers
/// again one `store_available` that counts them.
#[test]
fn an_outage_warns_once_per_job_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "an_outage_warns_once_per_job_postgres")
    else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    let dir = tempfile::tempdir().expect("temp dir");
    let jobs = [unique("outage-a"), unique("outage-b")];
    let config = write_config(
        dir.path(),
        "",
        &jobs
            .iter()
            .map(|job| {
                job_toml(
                    job,
                    "* * * * * *",
                    &record_cmd(&dir.path().join(job.as_str())),
                    "lease = \"5s\"",
                )
            })
            .collect::<Vec<_>>(),
    );
    let mut d = Daemon::spawn(DaemonOpts::new("outage", &config, &proxied).debug());
    for job in &jobs {
        d.expect(
            "a first run of each job",
            |e| is(e, "job_finished") && str_field(e, "job") == Some(job.as_str()),
            secs(40),
        );
    }
    let cut = d.len();
    proxy.blackhole();
    let failed_after = |d: &Daemon, job: &str, from: usize| -> Vec<(usize, Value)> {
        d.all()
            .into_iter()
            .enumerate()
            .skip(from)
            .filter(|(_, e)| is(e, "store_unavailable") && str_field(e, "job") == Some(job))
            .collect()
    };
    // A few seconds of failures for both jobs (each instant's acquire gives
    // up at the next instant).
    common::daemon::wait_until(
        secs(60),
        || jobs.iter().all(|job| failed_after(&d, job, cut).len() >= 4),
        || format!("four failures per job while black-holed: {}", d.summary()),
    );
    proxy.restore();
    let mut ended = Vec::new();
    for job in &jobs {
        let (i, available) = d.expect_from(
            cut,
            "store_available once the store answers",
            |e| is(e, "store_available") && str_field(e, "job") == Some(job.as_str()),
            secs(60),
        );
        ended.push((job.clone(), i, available));
    }
    assert!(d.is_running(), "{}", d.summary());
    d.stop(secs(30));
    for (job, i, available) in ended {
        let before: Vec<_> = failed_after(&d, &job, cut)
            .into_iter()
            .filter(|(j, _)| *j < i)
            .map(|(_, e)| e)
            .collect();
        let levels: Vec<_> = before.iter().map(|e| str_field(e, "level")).collect();
        assert_eq!(levels[0], Some("WARN"), "{job}: the first failure warns");
        assert!(
            levels[1..].iter().all(|l| *l == Some("DEBUG")),
            "{job}: the later failures of the outage are DEBUG: {levels:?}"
        );
        assert_eq!(str_field(&available, "level"), Some("INFO"), "{available}");
        let failures = i64_field(&available, "failures").expect("failures");
        let after_cut = i64::try_from(failed_after(&d, &job, cut).len()).unwrap();
        assert!(
            failures >= 4
                && failures >= i64::try_from(before.len()).unwrap()
                && failures <= after_cut,
            "{job}: {failures} failures counted, {} logged before {available}",
            before.len()
        );
    }
}
