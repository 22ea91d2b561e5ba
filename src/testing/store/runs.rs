//! `MemoryStore`'s run history.

use super::*;

#[async_trait]
impl Runs for MemoryStore {
    async fn finish_run(&self, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        let (resource, token) = (end.resource.to_string(), end.token);
        let (outcome, signal) = (RunState::from(end.outcome), end.signal.map(str::to_string));
        let (exit_code, duration_ms) = (end.exit_code.map(i64::from), end.duration_ms);
        let (elapsed, output) = (end.elapsed_ms, end.output.to_string());
        self.call(Op::FinishRun, move |s, _| {
            let run = s
                .runs
                .iter_mut()
                .find(|r| r.resource == resource && r.token == token && r.finished_at.is_none());
            let Some(run) = run else { return false };
            run.finished_at = Some(StoreTime(run.started_at.0 + elapsed));
            run.outcome = outcome;
            run.exit_code = exit_code;
            run.signal = signal;
            run.duration_ms = Some(duration_ms);
            run.output = Some(output);
            s.note(Op::FinishRun, format!("finished {token}"));
            true
        })
        .await
    }

    async fn runs(&self, q: &RunQuery<'_>) -> Result<Vec<RunInfo>, StoreError> {
        let job = q.job.map(str::to_string);
        let outcome = q.outcome.map(RunState::Ended);
        let node = q.node.map(str::to_string);
        let owner_id = q.owner_id;
        let (since, limit) = (q.since.map_or(i64::MIN, |t| t.0), q.limit as usize);
        self.call(Op::Fleet, move |s, now| {
            let mut found: Vec<RunInfo> = s
                .runs
                .iter()
                .filter(|r| job.as_ref().is_none_or(|j| &r.job == j) && r.started_at.0 >= since)
                .filter(|r| outcome.as_ref().is_none_or(|o| &r.outcome == o))
                .filter(|r| node.as_ref().is_none_or(|n| &r.node == n))
                .filter(|r| owner_id.as_ref().is_none_or(|o| &r.owner_id == o))
                .cloned()
                .collect();
            found.reverse();
            found.sort_by_key(|r| std::cmp::Reverse(r.started_at));
            found.truncate(limit);
            for r in &mut found {
                if r.finished_at.is_none() {
                    let lease = s.leases.get(&r.resource);
                    let held = lease.is_some_and(|l| {
                        l.fence == r.token && l.owner_id == r.owner_id && l.expires_at > now
                    });
                    r.outcome = if held {
                        RunState::Running
                    } else {
                        RunState::Unknown
                    };
                }
            }
            found
        })
        .await
    }
}
