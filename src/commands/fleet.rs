//! Operating the fleet from the store: `runs`, `status`, `trigger`, `pause`
//! and `resume`. Each reads or writes the shared store only; the daemons
//! act on what it says (see `daemon::fleet` and the acquire's pause check).

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use chrono::Utc;
use serde::Serialize;

use super::{hostname, print_json, Context};
use crate::cli::{Cli, PauseArgs, RunsArgs, RunsCommand, TriggerArgs};
use crate::config::Job;
use crate::daemon::current_drift;
use crate::domain::{RunOutcome, RunState, TriggerState};
use crate::error::{Error, Exit, Result};
use crate::fleet::{Drift, JobDef, JobFacts};
use crate::output::{self, Align, Out, Table};
use crate::schedule::Schedule;
use crate::store::{
    millis, rfc3339, NodeInfo, OpenOptions, PauseInfo, RunInfo, RunQuery, Store, StoreTime, Token,
    TriggerInfo,
};

/// Most runs one `runs` call lists.
const MAX_LIMIT: u32 = 1000;

/// How often `trigger` looks at its request and, with `--wait`, its run.
const POLL: Duration = Duration::from_millis(200);

/// `fencecron runs`.
pub async fn runs(cli: &Cli, args: &RunsArgs) -> Result<Exit> {
    if !(1..=MAX_LIMIT).contains(&args.limit) {
        return Err(Error::Usage(format!(
            "--limit {} is outside 1..={MAX_LIMIT}",
            args.limit
        )));
    }
    if let Some(job) = &args.job {
        // Any valid name: a job that left the config keeps its history.
        crate::names::Name::parse("job", job).map_err(Error::Usage)?;
    }
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    if let Some(RunsCommand::Show { run, json }) = &args.show {
        return show_run(store.as_ref(), run, *json).await;
    }
    let since = match args.since {
        Some(d) => Some(StoreTime(store.now().await?.0 - millis(d))),
        None => None,
    };
    let runs = store
        .runs(&RunQuery {
            job: args.job.as_deref(),
            outcome: args
                .outcome
                .as_deref()
                .map(RunOutcome::from_str)
                .transpose()
                .map_err(|e| Error::Usage(e.to_string()))?,
            since,
            node: args.node.as_deref(),
            owner_id: None,
            limit: args.limit,
        })
        .await?;
    if args.json {
        print_json(&runs)?;
        return Ok(Exit::Success);
    }
    if runs.is_empty() {
        if let Some(job) = &args.job {
            // No history: a name no daemon and no config knows is a typo,
            // refused as trigger and pause refuse it (exit 2).
            job_of(&ctx, store.as_ref(), job).await?;
        }
    }
    let now = store.now().await?.to_utc();
    let mut table = Table::new(&[
        ("STARTED", Align::Left),
        ("", Align::Left),
        ("JOB", Align::Left),
        ("TRIGGER", Align::Left),
        ("NODE", Align::Left),
        ("TOKEN", Align::Right),
        ("OUTCOME", Align::Left),
        ("EXIT", Align::Right),
        ("DURATION", Align::Right),
        ("SCHEDULED", Align::Left),
    ]);
    for r in &runs {
        table.row(vec![
            r.started_at.to_string(),
            output::relative(now, r.started_at.to_utc()),
            r.job.clone(),
            r.trigger.clone(),
            r.node.clone(),
            r.token.to_string(),
            r.outcome.to_string(),
            exit_text(r),
            r.duration_ms
                .map_or_else(|| "-".to_string(), |d| format!("{d}ms")),
            r.scheduled_at
                .map_or_else(|| "-".to_string(), |s| s.to_string()),
        ]);
    }
    table.print(&mut Out::stdout())?;
    Ok(Exit::Success)
}

/// `fencecron runs show RUN`: one run, its facts and its output's tail.
async fn show_run(store: &dyn Store, run: &str, json: bool) -> Result<Exit> {
    let owner = crate::store::OwnerId::from_str(run).map_err(|_| {
        Error::Usage(format!(
            "`{run}` is not a run's owner id (a UUID); `fencecron runs --json` lists them"
        ))
    })?;
    let found = store
        .runs(&RunQuery {
            owner_id: Some(owner),
            limit: 1,
            ..RunQuery::default()
        })
        .await?;
    let Some(r) = found.into_iter().next() else {
        return Err(Error::Missing(format!(
            "no run {run} in the history (it may have been pruned, see [history]); `fencecron runs` lists the runs kept"
        )));
    };
    if json {
        print_json(&r)?;
        return Ok(Exit::Success);
    }
    let mut out = Out::stdout();
    let opt = |t: Option<StoreTime>| t.map_or_else(|| "-".to_string(), |t| t.to_string());
    writeln!(out, "run:          {}", r.owner_id)?;
    writeln!(out, "job:          {}", r.job)?;
    writeln!(out, "resource:     {}", r.resource)?;
    writeln!(out, "trigger:      {}", r.trigger)?;
    writeln!(out, "scheduled_at: {}", opt(r.scheduled_at))?;
    writeln!(out, "node:         {}", r.node)?;
    writeln!(out, "token:        {}", r.token)?;
    writeln!(out, "started_at:   {}", r.started_at)?;
    writeln!(out, "finished_at:  {}", opt(r.finished_at))?;
    writeln!(out, "outcome:      {}", r.outcome)?;
    writeln!(out, "exit:         {}", exit_text(&r))?;
    writeln!(
        out,
        "duration:     {}",
        r.duration_ms
            .map_or_else(|| "-".to_string(), |d| format!("{d}ms"))
    )?;
    match r.output.as_deref() {
        Some(text) if !text.is_empty() => {
            writeln!(out, "output (the last bytes the history keeps):")?;
            for line in text.lines() {
                writeln!(out, "  {line}")?;
            }
        }
        _ => writeln!(out, "output:       (none kept)")?,
    }
    Ok(Exit::Success)
}

/// A run's exit code, or its signal's name, or `-`.
fn exit_text(r: &RunInfo) -> String {
    match (&r.exit_code, &r.signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => s.clone(),
        (None, None) => "-".to_string(),
    }
}

/// One job in `fencecron status`.
#[derive(Debug, Serialize)]
struct JobStatus {
    job: String,
    resource: String,
    schedule: String,
    timezone: String,
    next_at: Option<String>,
    /// The same instant on the job's own wall clock (`timezone`), with its
    /// offset: what `systemd-analyze calendar` shows beside UTC.
    next_at_local: Option<String>,
    paused: Option<PauseInfo>,
    running: Option<Running>,
    last_run: Option<LastRun>,
    last_success: Option<LastRun>,
    /// The live nodes that have the job (published it).
    live_nodes: Vec<String>,
    overdue: bool,
    /// Why it is overdue.
    overdue_reason: Option<String>,
    /// The live nodes disagree about it.
    config_drift: Option<Drift>,
}

#[derive(Debug, Serialize)]
struct Running {
    node: String,
    token: Token,
    trigger: String,
    since: StoreTime,
}

#[derive(Debug, Serialize)]
struct LastRun {
    outcome: RunState,
    at: StoreTime,
    node: String,
    token: Token,
}

impl LastRun {
    fn of(r: &RunInfo) -> LastRun {
        LastRun {
            outcome: r.outcome.clone(),
            at: r.finished_at.unwrap_or(r.started_at),
            node: r.node.clone(),
            token: r.token,
        }
    }
}

/// A job as the fleet commands see it: from the config, or without one
/// from the definitions the daemons published.
struct JobView {
    name: String,
    resource: String,
    schedule: Schedule,
}

impl JobView {
    fn of(job: &Job) -> JobView {
        JobView {
            name: job.name.to_string(),
            resource: job.resource.to_string(),
            schedule: job.schedule.clone(),
        }
    }
}

/// The config's jobs; without a config (only `--store`), the definitions
/// the live nodes published, or when none is live those of the nodes seen
/// most recently (a job is taken from the newest node that has it).
async fn fleet_jobs(ctx: &Context, store: &dyn Store) -> Result<Vec<JobView>> {
    if let Some(c) = &ctx.config {
        return Ok(c.jobs.iter().map(|job| JobView::of(job)).collect());
    }
    let now = store.now().await?;
    let mut nodes = store.nodes().await?;
    nodes.retain(|n| !n.config_digest.is_empty());
    if nodes.iter().any(|n| n.live(now)) {
        nodes.retain(|n| n.live(now));
    }
    nodes.sort_by_key(|n| std::cmp::Reverse(n.last_seen));
    let mut jobs: BTreeMap<String, JobView> = BTreeMap::new();
    for n in &nodes {
        for p in store.published_jobs(&n.node, true).await? {
            if jobs.contains_key(&p.job) {
                continue;
            }
            let def: JobDef = serde_json::from_str(p.definition.as_deref().unwrap_or_default())
                .map_err(|e| Error::Runtime(format!(
                    "the definition of {} that {} published cannot be read ({e}); run `fencecron status` with the config instead",
                    p.job, p.node
                )))?;
            let schedule = def.parsed_schedule().map_err(|e| Error::Runtime(format!(
                "the schedule of {} that {} published is not valid here ({e}); run `fencecron status` with the config instead",
                p.job, p.node
            )))?;
            jobs.insert(
                p.job.clone(),
                JobView {
                    name: def.name,
                    resource: def.resource,
                    schedule,
                },
            );
        }
    }
    Ok(jobs.into_values().collect())
}

/// `fencecron status`: exits [`Exit::Overdue`] when a job is overdue.
pub async fn status(cli: &Cli, json: bool) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let jobs = fleet_jobs(&ctx, store.as_ref()).await?;
    let (now, nodes, drift) = fleet_view(store.as_ref()).await?;
    // Which live node has which job, and since when it runs.
    let mut has: BTreeMap<String, Vec<(String, StoreTime)>> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.live(now)) {
        for p in store.published_jobs(&n.node, false).await? {
            has.entry(p.job)
                .or_default()
                .push((n.node.clone(), n.started_at));
        }
    }
    let pauses = store.pauses(now).await?;
    let store_now = now.to_utc();
    let mut all = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let name = job.name.as_str();
        let next = job.schedule.next_after(Utc::now());
        // The newest runs: one in progress, if any, then the last one that
        // ended (or whose node died).
        let recent = store
            .runs(&RunQuery {
                job: Some(name),
                limit: 2,
                ..RunQuery::default()
            })
            .await?;
        let running = recent.iter().find(|r| r.outcome == RunState::Running);
        let last = recent.iter().find(|r| r.outcome != RunState::Running);
        let success = store
            .runs(&RunQuery {
                job: Some(name),
                outcome: Some(RunOutcome::Succeeded),
                limit: 1,
                ..RunQuery::default()
            })
            .await?;
        let paused = pauses.iter().find(|p| p.job == name).cloned();
        let live = has.get(name).cloned().unwrap_or_default();
        let facts = JobFacts {
            live_since: live.iter().map(|(_, s)| s.to_utc()).min(),
            paused: paused.is_some(),
            running: running.is_some(),
            runs: recent
                .iter()
                .map(|r| (r.scheduled_at.map(StoreTime::to_utc), r.started_at.to_utc()))
                .collect(),
        };
        let reason = crate::fleet::overdue(&job.schedule, store_now, &facts);
        all.push(JobStatus {
            job: name.to_string(),
            resource: job.resource.clone(),
            schedule: job.schedule.expr().to_string(),
            timezone: job.schedule.tz().name().to_string(),
            next_at: next.map(rfc3339),
            next_at_local: next.map(|t| local_time(t, job.schedule.tz())),
            paused,
            running: running.map(|r| Running {
                node: r.node.clone(),
                token: r.token,
                trigger: r.trigger.clone(),
                since: r.started_at,
            }),
            last_run: last.map(LastRun::of),
            last_success: success.first().map(LastRun::of),
            live_nodes: live.into_iter().map(|(n, _)| n).collect(),
            overdue: reason.is_some(),
            overdue_reason: reason,
            config_drift: drift.get(name).cloned(),
        });
    }
    let exit = if all.iter().any(|s| s.overdue) {
        Exit::Overdue
    } else {
        Exit::Success
    };
    if json {
        print_json(&all)?;
        return Ok(exit);
    }
    let mut out = Out::stdout();
    let now = Utc::now();
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("SCHEDULE", Align::Left),
        ("NEXT (UTC)", Align::Left),
        ("NEXT (JOB'S ZONE)", Align::Left),
        ("STATE", Align::Left),
        ("NODES", Align::Right),
        ("LAST RUN", Align::Left),
        ("LAST SUCCESS", Align::Left),
    ]);
    let mut notes = Vec::new();
    for s in &all {
        let state = match (&s.paused, &s.running) {
            (_, Some(r)) => format!("running on {} (token {})", r.node, r.token),
            (Some(p), None) => match p.until {
                Some(u) => format!("paused until {u}"),
                None => "paused".to_string(),
            },
            (None, None) if s.overdue => "overdue".to_string(),
            (None, None) => "idle".to_string(),
        };
        let ago = |at: StoreTime| output::relative(now, at.to_utc());
        table.row(vec![
            s.job.clone(),
            format!("{} {}", s.schedule, s.timezone),
            s.next_at.clone().unwrap_or_else(|| "-".to_string()),
            s.next_at_local.clone().unwrap_or_else(|| "-".to_string()),
            state,
            if s.live_nodes.is_empty() {
                "none".to_string()
            } else {
                s.live_nodes.len().to_string()
            },
            s.last_run.as_ref().map_or_else(
                || "-".to_string(),
                |l| format!("{} {} ({})", l.outcome, l.at, ago(l.at)),
            ),
            s.last_success
                .as_ref()
                .map_or_else(|| "-".to_string(), |l| format!("{} ({})", l.at, ago(l.at))),
        ]);
        if let Some(note) = s.paused.as_ref().and_then(|p| p.note.as_deref()) {
            notes.push(format!("{}: paused: {note}", s.job));
        }
        if let Some(reason) = &s.overdue_reason {
            notes.push(format!("{}: overdue: {reason}", s.job));
        }
    }
    table.print(&mut out)?;
    for note in notes {
        writeln!(out, "{note}")?;
    }
    drift_lines(&mut out, &drift)?;
    Ok(exit)
}

/// The job named on the command line: from the config, or without one from
/// the definitions the daemons published.
async fn job_of(ctx: &Context, store: &dyn Store, name: &str) -> Result<JobView> {
    let jobs = fleet_jobs(ctx, store).await?;
    let known: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
    let from = match &ctx.config {
        Some(_) => ctx.config_path.display().to_string(),
        None => "the definitions the daemons published".to_string(),
    };
    let err = Error::Usage(format!(
        "there is no job `{name}` in {from} (its jobs: {}); name a job of the config the daemons run",
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    ));
    jobs.into_iter().find(|j| j.name == name).ok_or(err)
}

/// Who asked: `user@host`, for pauses and triggers.
fn requester() -> String {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| nix::unistd::getuid().to_string());
    format!("{user}@{}", hostname())
}

/// `fencecron pause`.
pub async fn pause(cli: &Cli, args: &PauseArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    if let Some(note) = &args.note {
        if note.len() > 1000 || note.chars().any(char::is_control) {
            return Err(Error::Usage(
                "--note must be one line of at most 1000 bytes".to_string(),
            ));
        }
    }
    let store = ctx.store(&OpenOptions::default()).await?;
    let job = job_of(&ctx, store.as_ref(), &args.job).await?;
    let now = store.now().await?;
    let pause = PauseInfo {
        job: job.name.to_string(),
        note: args.note.clone(),
        since: now,
        until: args.for_.map(|d| StoreTime(now.0 + millis(d))),
        paused_by: requester(),
    };
    // Refused in the store itself, atomically: of two CLIs pausing at
    // once, one pause is written and the other is told about it.
    if let Some(p) = store.pause(&pause, args.replace).await? {
        return Err(Error::Held(format!(
            "{} is already paused by {} {} ({}); pass --replace to replace it",
            pause.job,
            p.paused_by,
            match p.until {
                Some(u) => format!("until {u}"),
                None => "until `fencecron resume`".to_string(),
            },
            match &p.note {
                Some(n) => format!("note: {n}"),
                None => "no note".to_string(),
            },
        )));
    }
    crate::events::job_paused(&pause);
    let mut out = Out::stdout();
    match pause.until {
        Some(u) => writeln!(out, "paused {} fleet-wide until {u}", pause.job)?,
        None => writeln!(
            out,
            "paused {} fleet-wide; `fencecron resume {}` runs it again",
            pause.job, pause.job
        )?,
    }
    Ok(Exit::Success)
}

/// `fencecron resume`.
pub async fn resume(cli: &Cli, name: &str) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let job = job_of(&ctx, store.as_ref(), name).await?;
    let was = store.resume(job.name.as_str()).await?;
    crate::events::job_resumed(job.name.as_str(), was);
    let mut out = Out::stdout();
    if was {
        writeln!(out, "resumed {} fleet-wide", job.name)?;
    } else {
        writeln!(out, "{} was not paused", job.name)?;
    }
    Ok(Exit::Success)
}

/// `fencecron trigger`.
pub async fn trigger(cli: &Cli, args: &TriggerArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let job = job_of(&ctx, store.as_ref(), &args.job).await?;
    let job = &job;
    // Refused at once when the job holds its lease (the daemon that takes
    // the request checks again, atomically, with its acquire).
    if let Some(l) = store
        .list()
        .await?
        .into_iter()
        .find(|l| l.resource == job.resource && l.held)
    {
        return Err(Error::Held(format!(
            "{} is running: its lease is held by {} on {} with token {} until {}; trigger it again once it ended",
            job.name, l.owner_id, l.node, l.token, l.expires_at
        )));
    }
    let request = TriggerInfo {
        id: uuid::Uuid::new_v4().to_string(),
        job: job.name.to_string(),
        requested_at: store.now().await?,
        requested_by: requester(),
        state: TriggerState::Pending,
        node: None,
        token: None,
        detail: None,
    };
    store.request_trigger(&request).await?;
    let taken = await_taken(store.as_ref(), &request, args.timeout).await?;
    let (node, token) = (
        taken.node.clone().unwrap_or_default(),
        taken.token.unwrap_or_default(),
    );
    let mut out = Out::stdout();
    writeln!(
        out,
        "{} started on {node} with token {token} (trigger {})",
        job.name, request.id
    )?;
    if !args.wait {
        return Ok(Exit::Success);
    }
    let run = await_end(store.as_ref(), job, &taken).await?;
    // The last attempt's output tail, as the run history kept it.
    if let Some(output) = run.output.as_deref().filter(|o| !o.is_empty()) {
        write!(out, "{output}")?;
        if !output.ends_with('\n') {
            writeln!(out)?;
        }
    }
    let attempts = if run.token == token {
        String::new()
    } else {
        format!(" (its last attempt, token {})", run.token)
    };
    writeln!(
        out,
        "{} ended on {}{attempts}: {} (exit {})",
        job.name,
        run.node,
        run.outcome,
        exit_text(&run)
    )?;
    exit_of(&run)
}

/// Waits until a daemon took the request (started or refused). Nobody
/// claiming it within `timeout` withdraws it: no daemon is running the job.
async fn await_taken(
    store: &dyn Store,
    request: &TriggerInfo,
    timeout: Duration,
) -> Result<TriggerInfo> {
    let mut deadline = tokio::time::Instant::now() + timeout;
    let mut grace_given = false;
    loop {
        let now = store.trigger(&request.id).await?;
        let Some(t) = now else {
            return Err(Error::Runtime(format!(
                "the trigger {} vanished from the store before a daemon took it",
                request.id
            )));
        };
        match t.state {
            // Ended: started, and its run (and retries) already over.
            TriggerState::Started | TriggerState::Ended => return Ok(t),
            TriggerState::Refused => {
                return Err(Error::Held(format!(
                    "{} was not started by {}: {}",
                    request.job,
                    t.node.as_deref().unwrap_or("a daemon"),
                    t.detail.as_deref().unwrap_or("refused")
                )))
            }
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            if t.state == TriggerState::Pending && store.cancel_trigger(&request.id).await? {
                return Err(Error::Runtime(format!(
                    "no live daemon took the trigger of {} within {}; is `fencecron run` running with this job on some host? (the request was withdrawn)",
                    request.job,
                    humantime::format_duration(timeout)
                )));
            }
            // Claimed, but not started yet (or claimed just now): give the
            // daemon one more period to say how it went.
            if grace_given {
                return Err(Error::Runtime(format!(
                    "{} claimed the trigger of {} but did not say within {} whether it started; check its log and `fencecron runs {}`",
                    t.node.as_deref().unwrap_or("a daemon"),
                    request.job,
                    humantime::format_duration(timeout),
                    request.job
                )));
            }
            grace_given = true;
            deadline += timeout;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits for the triggered run's last attempt to end. A daemon retries a
/// failed manual run as the job's `retries` say, each attempt moving the
/// trigger's token to it, and says `ended` with the last attempt's token
/// only after that attempt's end is in the run history: so an ended run
/// under a trigger that still says `started` is not the last word (a retry
/// may be waiting out its back-off), and `ended` is, without a race. A
/// trigger that will never say `ended` is not waited on: the run's node died
/// (the run is `unknown`, or it ended and the node is no longer live), or a
/// daemon of an earlier release took it (no `attempt N of M` detail: it
/// never retries a manual run).
async fn await_end(store: &dyn Store, job: &JobView, taken: &TriggerInfo) -> Result<RunInfo> {
    let legacy = taken.detail.is_none();
    loop {
        let Some(t) = store.trigger(&taken.id).await? else {
            return Err(Error::Runtime(format!(
                "the trigger {} vanished from the store before its run ended; see `fencecron runs {}`",
                taken.id, job.name
            )));
        };
        let token = t.token.or(taken.token).unwrap_or_default();
        let runs = store
            .runs(&RunQuery {
                job: Some(job.name.as_str()),
                limit: 20,
                ..RunQuery::default()
            })
            .await?;
        let Some(r) = runs.into_iter().find(|r| r.token == token) else {
            return Err(Error::Runtime(format!(
                "the run of {} with token {token} is not in the run history",
                job.name
            )));
        };
        if r.outcome == RunState::Unknown {
            return Ok(r);
        }
        if r.outcome != RunState::Running {
            if t.state == TriggerState::Ended || legacy {
                return Ok(r);
            }
            let now = store.now().await?;
            let live = store
                .nodes()
                .await?
                .iter()
                .any(|n| n.node == r.node && n.live(now));
            if !live {
                return Ok(r);
            }
        }
        tokio::time::sleep(POLL * 2).await;
    }
}

/// `trigger --wait`'s exit: the job's exit code, or 128 + its signal; 127
/// when it could not be started; 1 when its node died and nobody knows.
fn exit_of(run: &RunInfo) -> Result<Exit> {
    if let Some(code) = run.exit_code {
        return Ok(Exit::Job(u8::try_from(code & 0xff).unwrap_or(1)));
    }
    if let Some(sig) = &run.signal {
        let n = nix::sys::signal::Signal::from_str(sig)
            .map(|s| s as i32)
            .ok()
            .or_else(|| sig.strip_prefix("SIG").and_then(|n| n.parse().ok()))
            .unwrap_or(0);
        return Ok(Exit::Job(u8::try_from(128 + n).unwrap_or(255)));
    }
    match &run.outcome {
        RunState::Ended(RunOutcome::SpawnFailed) => Ok(Exit::Job(crate::error::EXIT_CANNOT_START)),
        RunState::Unknown => Err(Error::Runtime(format!(
            "the run of {} with token {} has no known outcome: its node stopped answering mid-run",
            run.job, run.token
        ))),
        other => Err(Error::Runtime(format!(
            "the run of {} ended {other} without an exit code",
            run.job
        ))),
    }
}

/// One node in `fencecron nodes --json`.
#[derive(Debug, Serialize)]
struct NodeRow {
    node: String,
    hostname: String,
    pid: i64,
    version: String,
    config_digest: String,
    started_at: StoreTime,
    last_seen: StoreTime,
    state: String,
    running: i64,
    /// The jobs in config drift this live node takes part in (extra).
    config_drift: Vec<String>,
}

/// The node rows, the store's time, and the live nodes' drift.
async fn fleet_view(
    store: &dyn Store,
) -> Result<(StoreTime, Vec<NodeInfo>, BTreeMap<String, Drift>)> {
    let nodes = store.nodes().await?;
    let now = store.now().await?;
    let drift = current_drift(store, &nodes, now, &mut Default::default()).await?;
    Ok((now, nodes, drift))
}

/// `fencecron nodes`.
pub async fn nodes(cli: &Cli, json: bool) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let (now, nodes, drift) = fleet_view(store.as_ref()).await?;
    let rows: Vec<NodeRow> = nodes
        .into_iter()
        .map(|n| {
            let live = n.live(now);
            let in_drift = drift
                .values()
                .filter(|d| {
                    live && (d.nodes_without.contains(&n.node)
                        || d.nodes_with.values().any(|v| v.contains(&n.node)))
                })
                .map(|d| d.job.clone())
                .collect();
            NodeRow {
                state: n.shown_state(now).to_string(),
                node: n.node,
                hostname: n.hostname,
                pid: n.pid,
                version: n.version,
                config_digest: n.config_digest,
                started_at: n.started_at,
                last_seen: n.last_seen,
                running: n.running,
                config_drift: in_drift,
            }
        })
        .collect();
    if json {
        print_json(&rows)?;
        return Ok(Exit::Success);
    }
    let header = [
        "NODE",
        "HOSTNAME",
        "PID",
        "VERSION",
        "CONFIG",
        "STATE",
        "RUNNING",
        "STARTED",
        "LAST SEEN",
    ];
    let cells: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.node.clone(),
                r.hostname.clone(),
                r.pid.to_string(),
                r.version.clone(),
                crate::fleet::short(&r.config_digest).to_string(),
                r.state.clone(),
                r.running.to_string(),
                r.started_at.to_string(),
                r.last_seen.to_string(),
            ]
        })
        .collect();
    let mut out = Out::stdout();
    table(&mut out, &header, &cells)?;
    drift_lines(&mut out, &drift)?;
    Ok(Exit::Success)
}

/// A table whose columns fit their widest cell.
fn table<const N: usize>(out: &mut Out, header: &[&str; N], rows: &[[String; N]]) -> Result<()> {
    let mut widths = header.map(str::len);
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

/// One line per job in config drift.
fn drift_lines(out: &mut Out, drift: &BTreeMap<String, Drift>) -> Result<()> {
    for d in drift.values() {
        let without = if d.nodes_without.is_empty() {
            String::new()
        } else {
            format!("; missing on {}", d.nodes_without.join(","))
        };
        writeln!(out, "config drift: {}: {}{without}", d.job, d.with_text())?;
    }
    Ok(())
}

/// `t` on the wall clock of `tz`, e.g. `2026-12-07 04:00:00 CET`.
pub(crate) fn local_time(t: chrono::DateTime<Utc>, tz: chrono_tz::Tz) -> String {
    t.with_timezone(&tz)
        .format("%Y-%m-%d %H:%M:%S %Z")
        .to_string()
}
