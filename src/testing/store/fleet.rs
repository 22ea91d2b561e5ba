//! `MemoryStore`'s fleet: pauses, triggers, nodes and published jobs.

use super::*;

#[async_trait]
impl Fleet for MemoryStore {
    async fn pause(
        &self,
        pause: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, StoreError> {
        let pause = pause.clone();
        self.call(Op::Fleet, move |s, _| {
            let old = s.pauses.get(&pause.job);
            if let Some((p, _)) = old {
                let ended = p.until.is_some_and(|u| u <= pause.since);
                if !replace && !ended {
                    return Some(p.clone());
                }
            }
            let last = old.and_then(|p| p.1);
            s.pauses.insert(pause.job.clone(), (pause, last));
            None
        })
        .await
    }

    async fn resume(&self, job: &str) -> Result<bool, StoreError> {
        let job = job.to_string();
        self.call(Op::Fleet, move |s, _| s.pauses.remove(&job).is_some())
            .await
    }

    async fn pauses(&self, now: StoreTime) -> Result<Vec<PauseInfo>, StoreError> {
        self.call(Op::Fleet, move |s, _| {
            s.note(Op::Fleet, "pauses");
            s.pauses
                .values()
                .filter(|(p, _)| p.until.is_none_or(|u| u > now))
                .map(|(p, _)| p.clone())
                .collect()
        })
        .await
    }

    async fn request_trigger(&self, trigger: &TriggerInfo) -> Result<(), StoreError> {
        let trigger = trigger.clone();
        self.call(Op::Fleet, move |s, _| s.triggers.push(trigger))
            .await
    }

    async fn trigger(&self, id: &str) -> Result<Option<TriggerInfo>, StoreError> {
        let id = id.to_string();
        self.call(Op::Fleet, move |s, _| {
            s.triggers.iter().find(|t| t.id == id).cloned()
        })
        .await
    }

    async fn pending_triggers(&self) -> Result<Vec<TriggerInfo>, StoreError> {
        self.call(Op::Fleet, |s, _| {
            s.note(Op::Fleet, "pending_triggers");
            s.triggers
                .iter()
                .filter(|t| t.state == TriggerState::Pending)
                .cloned()
                .collect()
        })
        .await
    }

    async fn claim_trigger(&self, id: &str, node: &str) -> Result<bool, StoreError> {
        let (id, node) = (id.to_string(), node.to_string());
        self.call(Op::Fleet, move |s, _| {
            match s
                .triggers
                .iter_mut()
                .find(|t| t.id == id && t.state == TriggerState::Pending)
            {
                Some(t) => {
                    t.state = TriggerState::Claimed;
                    t.node = Some(node);
                    true
                }
                None => false,
            }
        })
        .await
    }

    async fn settle_trigger(
        &self,
        id: &str,
        state: crate::domain::TriggerState,
        token: Option<Token>,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let detail = detail.map(str::to_string);
        self.call(Op::Fleet, move |s, _| {
            if let Some(t) = s.triggers.iter_mut().find(|t| t.id == id) {
                t.state = state;
                t.token = token;
                t.detail = detail;
            }
        })
        .await
    }

    async fn cancel_trigger(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.call(Op::Fleet, move |s, _| {
            let before = s.triggers.len();
            s.triggers
                .retain(|t| !(t.id == id && t.state == TriggerState::Pending));
            s.triggers.len() < before
        })
        .await
    }

    async fn beat(&self, beat: &NodeBeat<'_>) -> Result<BeatAnswer, StoreError> {
        let row = NodeInfo {
            node: beat.node.to_string(),
            hostname: beat.hostname.to_string(),
            pid: i64::from(beat.pid),
            version: beat.version.to_string(),
            config_digest: beat.config_digest.to_string(),
            started_at: beat.started_at.unwrap_or(StoreTime(0)),
            last_seen: StoreTime(0),
            state: beat.state.clone(),
            running: i64::from(beat.running),
        };
        let started = beat.started_at;
        self.call(Op::Nodes, move |s, now| {
            let now = StoreTime(now);
            let row = NodeInfo {
                started_at: started.unwrap_or(now),
                last_seen: now,
                ..row
            };
            s.nodes.insert(row.node.clone(), row);
            let live = s.nodes.values().filter(|n| n.live(now)).cloned().collect();
            BeatAnswer { now, live }
        })
        .await
    }

    async fn nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        self.call(Op::Nodes, |s, _| s.nodes.values().cloned().collect())
            .await
    }

    async fn publish_jobs(
        &self,
        node: &str,
        jobs: &[crate::store::Definition<'_>],
    ) -> Result<(), StoreError> {
        let node = node.to_string();
        let jobs: Vec<(String, String, String)> = jobs
            .iter()
            .map(|(j, d, def)| (j.to_string(), d.to_string(), def.to_string()))
            .collect();
        self.call(Op::Nodes, move |s, _| {
            s.node_jobs.retain(|(n, _), _| *n != node);
            for (job, digest, def) in jobs {
                s.node_jobs.insert((node.clone(), job), (digest, def));
            }
        })
        .await
    }

    async fn published_jobs(
        &self,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, StoreError> {
        let node = node.to_string();
        self.call(Op::Nodes, move |s, _| {
            s.node_jobs
                .iter()
                .filter(|((n, _), _)| *n == node)
                .map(|((n, job), (digest, def))| PublishedJob {
                    node: n.clone(),
                    job: job.clone(),
                    digest: digest.clone(),
                    definition: definitions.then(|| def.clone()),
                })
                .collect()
        })
        .await
    }
}
