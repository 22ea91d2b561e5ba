//! `MemoryStore`'s leases: the single acquire and the batch claim (one
//! takeable rule, [`acquire`]), renew, release, give back, preempt.

use super::*;

/// `acquire` on the state, as the SQL statements do it.
fn acquire(s: &mut State, now: i64, req: &OwnedAcquire) -> AcquireOutcome {
    let occ = req.occurrence.map(|o| o.0);
    let next = req.next_occurrence.map(|o| o.0);
    let floor = first_token_of(s.epoch);
    let due = occ.is_none_or(|o| o <= now) && next.is_none_or(|n| n > now);
    let honours_pause = |by: &StartedBy| occ.is_some() || *by == StartedBy::Retry;
    if let Some((job, _, _)) = req.run.as_ref().filter(|(_, by, _)| honours_pause(by)) {
        if let Some((pause, last_skipped)) = s.pauses.get_mut(job) {
            if pause.until.is_none_or(|u| u.0 > now) {
                let first = occ.is_some_and(|occ| due && last_skipped.is_none_or(|l| l < occ));
                if first {
                    *last_skipped = occ;
                }
                let seen = PauseSeen {
                    note: pause.note.clone(),
                    until: pause.until.map(|u| u.0),
                    first,
                };
                return classify_paused(seen, &req.borrowed(), now);
            }
        }
    }
    let out = acquire_lease(s, now, req, floor, due);
    if let (AcquireOutcome::Acquired(lease), Some((job, by, at))) = (&out, &req.run) {
        let exists = s
            .runs
            .iter()
            .any(|r| r.resource == req.resource && r.token == lease.token);
        if !exists {
            let started_at = s.leases.get(&req.resource).map_or(now, |r| r.acquired_at);
            s.runs.push(RunInfo {
                job: job.clone(),
                resource: req.resource.clone(),
                scheduled_at: *at,
                trigger: by.as_str().to_string(),
                node: req.node.clone(),
                owner_id: req.owner_id,
                token: lease.token,
                started_at: StoreTime(started_at),
                finished_at: None,
                // Until it ends, `runs` says whether it still runs.
                outcome: RunState::Unknown,
                exit_code: None,
                signal: None,
                duration_ms: None,
                output: None,
            });
        }
    }
    out
}

/// The lease part of `acquire`.
fn acquire_lease(
    s: &mut State,
    now: i64,
    req: &OwnedAcquire,
    floor: Token,
    due: bool,
) -> AcquireOutcome {
    let owner = req.owner_id;
    let occ = req.occurrence.map(|o| o.0);
    let next = req.next_occurrence.map(|o| o.0);
    let lease = millis(req.lease);
    let Some(row) = s.leases.get_mut(&req.resource) else {
        if occ.is_some_and(|o| o > now) {
            return AcquireOutcome::NotYetDue {
                store_now: StoreTime(now),
            };
        }
        if next.is_some_and(|n| n <= now) {
            return AcquireOutcome::Superseded {
                store_now: StoreTime(now),
            };
        }
        let row = Row {
            fence: floor,
            owner_id: owner,
            node: req.node.clone(),
            acquired_at: now,
            expires_at: now + lease,
            last_occurrence: occ,
            released: false,
            prev: None,
        };
        let lease = lease_of(req, &row);
        s.leases.insert(req.resource.clone(), row);
        return AcquireOutcome::Acquired(lease);
    };
    let adopt =
        occ.is_some() && row.owner_id == owner && row.last_occurrence == occ && !row.released;
    let free = row.expires_at <= now
        && (occ.is_none() || row.last_occurrence.is_none_or(|l| Some(l) < occ));
    if !((free || adopt) && due) {
        return classify_loss(row.loss(now), &req.borrowed());
    }
    if adopt {
        row.expires_at = row.expires_at.max(now + lease);
    } else {
        row.prev = (!row.released).then(|| Takeover {
            owner_id: row.owner_id,
            node: row.node.clone(),
            token: row.fence,
            expired_at: StoreTime(row.expires_at),
        });
        row.fence = row.fence.next().max(floor);
        row.acquired_at = now;
        row.expires_at = now + lease;
    }
    row.owner_id = owner;
    row.node = req.node.clone();
    row.released = false;
    row.last_occurrence = occ.or(row.last_occurrence);
    AcquireOutcome::Acquired(lease_of(req, row))
}

fn lease_of(req: &OwnedAcquire, row: &Row) -> Lease {
    Lease {
        resource: req.resource.clone(),
        owner_id: req.owner_id,
        token: row.fence,
        expires_at: StoreTime(row.expires_at),
        taken_over: row.prev.clone(),
    }
}

/// An [`AcquireRequest`] that a late statement can own.
struct OwnedAcquire {
    resource: String,
    name: Name,
    lease: Duration,
    node: String,
    owner_id: OwnerId,
    occurrence: Option<StoreTime>,
    next_occurrence: Option<StoreTime>,
    run: Option<(String, StartedBy, Option<StoreTime>)>,
}

impl OwnedAcquire {
    fn of(req: &AcquireRequest<'_>) -> OwnedAcquire {
        OwnedAcquire {
            resource: req.resource.to_string(),
            name: req.resource.clone(),
            lease: req.lease,
            node: req.node.to_string(),
            owner_id: req.owner_id,
            occurrence: req.occurrence,
            next_occurrence: req.next_occurrence,
            run: req
                .run
                .map(|r| (r.job.to_string(), r.started_by, r.scheduled_at)),
        }
    }

    fn borrowed(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            resource: &self.name,
            lease: self.lease,
            node: &self.node,
            owner_id: self.owner_id,
            occurrence: self.occurrence,
            next_occurrence: self.next_occurrence,
            run: self.run.as_ref().map(|(job, by, at)| RunStart {
                job,
                started_by: *by,
                scheduled_at: *at,
            }),
        }
    }
}

fn describe_acquire(out: &AcquireOutcome, adopted: bool) -> String {
    match out {
        AcquireOutcome::Acquired(l) if adopted => format!("adopted {}", l.token),
        AcquireOutcome::Acquired(l) => format!("acquired {}", l.token),
        AcquireOutcome::Held { .. } | AcquireOutcome::LostRace => "held".to_string(),
        AcquireOutcome::OccurrenceTaken { .. } => "taken".to_string(),
        AcquireOutcome::NotYetDue { .. } => "not_yet_due".to_string(),
        AcquireOutcome::Superseded { .. } => "superseded".to_string(),
        AcquireOutcome::Paused { first: true, .. } => "paused first".to_string(),
        AcquireOutcome::Paused { .. } => "paused".to_string(),
    }
}

fn refusal_row(s: &State, resource: &str) -> Option<LeaseRow> {
    s.leases.get(resource).map(|r| LeaseRow {
        owner_id: r.owner_id,
        fence: r.fence,
        expires_at: r.expires_at,
    })
}

#[async_trait]
impl Leases for MemoryStore {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let req = OwnedAcquire::of(req);
        self.call(Op::Acquire, move |s, now| {
            let before = s.leases.get(&req.resource).cloned();
            let out = acquire(s, now, &req);
            let adopted = matches!(&out, AcquireOutcome::Acquired(l)
                if before.as_ref().is_some_and(|b| b.fence == l.token));
            s.note(Op::Acquire, describe_acquire(&out, adopted));
            out
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let node = req.node.to_string();
        let items: Vec<OwnedAcquire> = req
            .items
            .iter()
            .map(|i| OwnedAcquire::of(&i.as_acquire(req.node)))
            .collect();
        let (limit, share) = (req.limit, req.share);
        let ask = {
            let mut s = self.lock();
            let q = s.faults.get_mut(&Op::Claim);
            if q.as_ref()
                .is_some_and(|q| matches!(q.front(), Some(Fault::Ask)))
            {
                q.and_then(VecDeque::pop_front);
                s.note(Op::Claim, "asked");
                true
            } else {
                false
            }
        };
        if ask {
            return Ok(ClaimOutcome {
                items: vec![Claimed::Ask; items.len()],
                limit,
            });
        }
        self.call(Op::Claim, move |s, now| {
            let others = s
                .nodes
                .values()
                .filter(|n| n.node != node && n.live(StoreTime(now)))
                .count();
            mark(s, &node, now);
            let limit = if share {
                limit.min(items.len().div_ceil(others + 1) + 1)
            } else {
                limit
            };
            let mut won = 0;
            let mut out = Vec::with_capacity(items.len());
            for req in &items {
                let job = req.run.as_ref().map(|(j, _, _)| j.as_str()).unwrap_or("");
                let paused = s
                    .pauses
                    .get(job)
                    .is_some_and(|(p, _)| p.until.is_none_or(|u| u.0 > now));
                let (occ, next) = (
                    req.occurrence.map_or(0, |o| o.0),
                    req.next_occurrence.map(|n| n.0),
                );
                let due = occ <= now && next.is_none_or(|n| n > now);
                if paused {
                    out.push(Claimed::Ask);
                    continue;
                }
                // Never leased: created and won as the first acquisition
                // would (within the limit), or left to the single acquire
                // while not due.
                let row = s.leases.get(&req.resource);
                let takeable = row.is_none_or(|row| {
                    row.expires_at <= now && row.last_occurrence.is_none_or(|l| l < occ)
                }) && due;
                if row.is_none() && !takeable {
                    out.push(Claimed::Ask);
                    continue;
                }
                let loss = row.filter(|_| !takeable).map(|row| row.loss(now));
                out.push(if takeable && won < limit {
                    won += 1;
                    match acquire(s, now, req) {
                        AcquireOutcome::Acquired(l) => Claimed::Won(l),
                        other => Claimed::from_loss(other),
                    }
                } else if let Some(loss) = loss {
                    Claimed::from_loss(classify_loss(loss, &req.borrowed()))
                } else {
                    Claimed::Skipped
                });
            }
            let what: Vec<String> = out
                .iter()
                .map(|c| match c {
                    Claimed::Won(l) => format!("won {}", l.token),
                    Claimed::Lost(_) => "lost".to_string(),
                    Claimed::Skipped => "skipped".to_string(),
                    Claimed::Ask => "ask".to_string(),
                })
                .collect();
            s.note(Op::Claim, format!("limit {limit}: {}", what.join(", ")));
            s.claims.push(ClaimSeen {
                at: Instant::now(),
                node: node.clone(),
                resources: items.iter().map(|i| i.resource.to_string()).collect(),
                share,
            });
            ClaimOutcome { items: out, limit }
        })
        .await
    }

    async fn renew(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let resource = resource.to_string();
        let refuse = {
            let mut s = self.lock();
            let q = s.faults.get_mut(&Op::Renew);
            if q.as_ref()
                .is_some_and(|q| matches!(q.front(), Some(Fault::Refuse)))
            {
                q.and_then(VecDeque::pop_front);
                s.note(Op::Renew, "refused");
                true
            } else {
                false
            }
        };
        if refuse {
            return Ok(self.refused_renewal(&resource));
        }
        self.call(Op::Renew, move |s, now| {
            let out = match s.leases.get_mut(&resource) {
                Some(r) if owner_id == r.owner_id && r.fence == token && r.expires_at > now => {
                    r.expires_at = now + millis(lease);
                    RenewOutcome::Renewed {
                        expires_at: StoreTime(r.expires_at),
                    }
                }
                _ => RenewOutcome::Refused(classify_refusal(
                    refusal_row(s, &resource),
                    owner_id,
                    token,
                )),
            };
            let what = match &out {
                RenewOutcome::Renewed { .. } => "renewed",
                RenewOutcome::Refused(_) => "refused",
            };
            s.note(Op::Renew, what);
            out
        })
        .await
    }

    async fn release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, StoreError> {
        let resource = resource.to_string();
        self.call(Op::Release, move |s, now| {
            let out = match s.leases.get_mut(&resource) {
                Some(r) if owner_id == r.owner_id && r.fence == token => {
                    r.expires_at = r.expires_at.min(now);
                    r.released = true;
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::Refused(classify_refusal(
                    refusal_row(s, &resource),
                    owner_id,
                    token,
                )),
            };
            let what = match &out {
                ReleaseOutcome::Released => format!("released {token}"),
                ReleaseOutcome::Refused(_) => "refused".to_string(),
            };
            s.note(Op::Release, what);
            out
        })
        .await
    }

    async fn give_back_unseen(&self, items: &[Unseen<'_>]) -> Result<Vec<bool>, StoreError> {
        let n = items.len();
        self.call(Op::Sweep, move |s, _| s.note(Op::Sweep, n.to_string()))
            .await?;
        crate::store::give_back_each(self, items).await
    }

    async fn give_back(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: StoreTime,
    ) -> Result<ReleaseOutcome, StoreError> {
        let resource = resource.to_string();
        let occ = occurrence.0;
        self.call(Op::GiveBack, move |s, now| {
            let out = match s.leases.get_mut(&resource) {
                Some(r)
                    if owner_id == r.owner_id
                        && (Some(r.fence) == token
                            || (token.is_none()
                                && !r.released
                                && r.last_occurrence == Some(occ))) =>
                {
                    r.expires_at = r.expires_at.min(now);
                    r.released = true;
                    if r.last_occurrence == Some(occ) {
                        r.last_occurrence = Some(occ - 1);
                    }
                    s.runs.retain(|run| {
                        !(run.resource == resource
                            && owner_id == run.owner_id
                            && run.finished_at.is_none())
                    });
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::Refused(classify_refusal(
                    refusal_row(s, &resource),
                    owner_id,
                    token.unwrap_or_default(),
                )),
            };
            let what = match (&out, token) {
                (ReleaseOutcome::Released, Some(t)) => format!("given_back {t}"),
                (ReleaseOutcome::Released, None) => "given_back".to_string(),
                (ReleaseOutcome::Refused(_), _) => "refused".to_string(),
            };
            s.note(Op::GiveBack, what);
            out
        })
        .await
    }

    async fn preempt(
        &self,
        resource: &Name,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, StoreError> {
        let resource = resource.to_string();
        let occ = occurrence.0;
        self.call(Op::Preempt, move |s, _| {
            let ended = match s.leases.get_mut(&resource) {
                Some(r)
                    if r.fence == token
                        && !r.released
                        && r.expires_at > r.acquired_at
                        && r.last_occurrence.is_none_or(|last| last < occ) =>
                {
                    r.expires_at = r.acquired_at;
                    true
                }
                _ => false,
            };
            s.note(
                Op::Preempt,
                if ended {
                    format!("preempted {token}")
                } else {
                    "refused".to_string()
                },
            );
            ended
        })
        .await
    }
}
