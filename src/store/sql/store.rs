//! The SQL backends' one implementation of each store trait ([`Admin`],
//! [`Leases`], [`Fences`], [`Runs`], [`Fleet`], together the `Store`): each operation
//! under its time limit and heard by the opener's hook ([`SqlStore::call`]),
//! through its dialect or the shared statements.

use super::*;

impl<D: Dialect> SqlStore<D> {
    /// Runs the store operation `operation` as one statement (or one
    /// transaction) under the per-call time limit, names its error and
    /// tells the hook ([`SqlStore::observe`]).
    pub(in crate::store) async fn call<T: Send>(
        &self,
        operation: &'static str,
        op: impl std::future::Future<Output = Sql<T>> + Send,
    ) -> Result<T, StoreError> {
        self.observe(operation, self.limited(op)).await
    }

    /// One statement (or transaction) of an operation under the per-call
    /// time limit, its error named; the operation as a whole is observed.
    pub(in crate::store) async fn limited<T: Send>(
        &self,
        op: impl std::future::Future<Output = Sql<T>> + Send,
    ) -> Result<T, StoreError> {
        timed(&self.db.url, self.db.call_timeout, async {
            self.dialect
                .watch(&self.db, op)
                .await
                .map_err(|f| self.failed(f))
        })
        .await
    }

    /// The one place every [`Store`] operation of a SQL store passes:
    /// tells the opener's hook ([`OpenOptions::hook`]) its name, how long
    /// it took, and how it ended.
    async fn observe<T>(
        &self,
        operation: &'static str,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        hook::observe(&self.db.hook, operation, op).await
    }
}

#[async_trait]
impl<D: Dialect> Admin for SqlStore<D> {
    fn backend(&self) -> Backend {
        D::BACKEND
    }

    fn url(&self) -> &StoreUrl {
        &self.db.url
    }

    fn outages(&self) -> &Outages {
        &self.outages
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.observe("migrate", self.dialect.migrate(&self.db))
            .await
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>, StoreError> {
        self.call("list", self.dialect.list(&self.db)).await
    }

    async fn now(&self) -> Result<StoreTime, StoreError> {
        self.call("now", self.dialect.now(&self.db)).await
    }

    async fn epoch(&self) -> Result<EpochInfo, StoreError> {
        self.call("epoch", self.dialect.epoch(&self.db)).await
    }

    async fn advance_epoch(&self) -> Result<EpochInfo, StoreError> {
        self.call("advance_epoch", self.dialect.advance_epoch(&self.db))
            .await
    }

    async fn prune_runs(&self, keep: u32, before: StoreTime) -> Result<u64, StoreError> {
        self.call("prune_runs", async {
            Ok(D::DB::prune_runs(&self.db.pool, &self.fleet, keep, before).await?)
        })
        .await
    }

    async fn prune_fleet(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call("prune_fleet", async {
            Ok(D::DB::prune_fleet(&self.db.pool, &self.fleet, before).await?)
        })
        .await
    }

    async fn forget(&self, resource: &Name, now: StoreTime) -> Result<Option<bool>, StoreError> {
        self.call("forget", async {
            Ok(D::DB::forget(&self.db.pool, &self.fleet, resource.as_str(), now).await?)
        })
        .await
    }

    async fn prune_stale(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call("prune_stale", async {
            Ok(D::DB::prune_kept(&self.db.pool, &self.fleet, false, before).await?)
        })
        .await
    }

    async fn prune_values(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call("prune_values", async {
            Ok(D::DB::prune_kept(&self.db.pool, &self.fleet, true, before).await?)
        })
        .await
    }

    async fn prune_nodes(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call("prune_nodes", async {
            Ok(D::DB::prune_nodes(&self.db.pool, &self.fleet, before).await?)
        })
        .await
    }
}

#[async_trait]
impl<D: Dialect> Leases for SqlStore<D> {
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        self.call("acquire", self.dialect.acquire(&self.db, req))
            .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.call("claim", self.dialect.claim(&self.db, req)).await
    }

    async fn renew(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.call(
            "renew",
            self.dialect
                .renew(&self.db, resource, owner_id, token, lease),
        )
        .await
    }

    async fn release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.call(
            "release",
            self.dialect
                .release(&self.db, resource, owner_id, Some(token), None),
        )
        .await
    }

    async fn give_back(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: StoreTime,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.observe("give_back", async {
            let outcome = self
                .limited(self.dialect.release(
                    &self.db,
                    resource,
                    owner_id,
                    token,
                    Some(occurrence),
                ))
                .await?;
            if outcome == ReleaseOutcome::Released {
                // Nothing ran under the lease: its run row goes too. Rare (a
                // win whose answer came too late), so a statement of its own.
                self.limited(async {
                    Ok(
                        D::DB::forget_unrun(
                            &self.db.pool,
                            &self.fleet,
                            resource.as_str(),
                            owner_id,
                        )
                        .await?,
                    )
                })
                .await?;
            }
            Ok(outcome)
        })
        .await
    }

    async fn give_back_unseen(&self, items: &[Unseen<'_>]) -> Result<Vec<bool>, StoreError> {
        self.observe("give_back_unseen", async {
            let given = self
                .limited(self.dialect.give_back_unseen(&self.db, items))
                .await?;
            for (item, _) in items.iter().zip(&given).filter(|(_, g)| **g) {
                // Nothing ran under these leases: their run rows go too
                // (rare).
                self.limited(async {
                    Ok(D::DB::forget_unrun(
                        &self.db.pool,
                        &self.fleet,
                        item.resource.as_str(),
                        item.owner_id,
                    )
                    .await?)
                })
                .await?;
            }
            Ok(given)
        })
        .await
    }

    async fn preempt(
        &self,
        resource: &Name,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, StoreError> {
        self.call("preempt", async {
            Ok(D::DB::preempt(
                &self.db.pool,
                &self.fleet,
                resource.as_str(),
                token,
                occurrence,
            )
            .await?)
        })
        .await
    }
}

#[async_trait]
impl<D: Dialect> Fences for SqlStore<D> {
    async fn put(&self, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError> {
        self.observe("put", async {
            match self.limited(self.put_tx(req)).await {
                Err(StoreError::Unavailable { source, .. }) => Err(self
                    .dialect
                    .put_failed(&self.db, source, req.value.len())
                    .await),
                other => other,
            }
        })
        .await
    }

    async fn get(&self, resource: &Name, key: &Name) -> Result<Option<StoredValue>, StoreError> {
        self.call("get", async {
            Ok(D::DB::get(&self.db.pool, D::GET, resource, key).await?)
        })
        .await
    }

    /// One read; a token newer than the highest admitted adds the raise
    /// and a second read (at most once per resource and token). No
    /// transaction: each statement is atomic, and the decision is the last
    /// read's (highest, fence only ever grow), so an admission holds as of
    /// that read.
    async fn admit(&self, req: &AdmitRequest<'_>) -> Result<AdmitOutcome, StoreError> {
        self.observe("admit", async {
            let mut raised = false;
            loop {
                let (highest, issued) = self
                    .limited(async {
                        Ok(D::DB::admit_state(&self.db.pool, D::ADMIT_STATE, req.resource).await?)
                    })
                    .await?;
                match classify_admission(req.token, highest, issued, raised) {
                    Admission::Admit => return Ok(AdmitOutcome::Admitted),
                    Admission::Raise => {
                        self.limited(async {
                            Ok(D::DB::admit_raise(
                                &self.db.pool,
                                D::ADMIT_RAISE,
                                req.resource,
                                req.token,
                            )
                            .await?)
                        })
                        .await?;
                        raised = true;
                    }
                    Admission::Refuse(reason, accepted) => {
                        let op = req.operation_id.to_string();
                        let rec = req.record(reason, accepted, &op);
                        let stored = self
                            .limited(self.dialect.record_stale(&self.db, &rec))
                            .await?;
                        return Ok(AdmitOutcome::Refused(Box::new(stored)));
                    }
                }
            }
        })
        .await
    }

    async fn record_stale(&self, rec: &NewStaleRecord<'_>) -> Result<StaleRecord, StoreError> {
        self.call("record_stale", self.dialect.record_stale(&self.db, rec))
            .await
    }

    async fn stale(&self, since: Option<StoreTime>) -> Result<Vec<StaleRecord>, StoreError> {
        let since = since.map_or(i64::MIN, |s| s.0);
        self.call("stale", async {
            Ok(D::DB::stale(&self.db.pool, D::STALE, since).await?)
        })
        .await
    }

    async fn latest_stale(
        &self,
        since: StoreTime,
        limit: u32,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        self.call("latest_stale", async {
            Ok(
                D::DB::latest_stale(&self.db.pool, D::LATEST_STALE, since.0, i64::from(limit))
                    .await?,
            )
        })
        .await
    }
}

#[async_trait]
impl<D: Dialect> Runs for SqlStore<D> {
    async fn finish_and_release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        end: &RunEnd<'_>,
    ) -> Result<(bool, ReleaseOutcome), StoreError> {
        self.observe("finish_and_release", async {
            let one = self
                .limited(
                    self.dialect
                        .finish_and_release(&self.db, resource, owner_id, end),
                )
                .await?;
            match one {
                Some(done) => Ok(done),
                None => {
                    let finished = self
                        .limited(async {
                            Ok(D::DB::finish_run(&self.db.pool, &self.fleet, end).await?)
                        })
                        .await?;
                    let released = self
                        .limited(self.dialect.release(
                            &self.db,
                            resource,
                            owner_id,
                            Some(end.token),
                            None,
                        ))
                        .await?;
                    Ok((finished, released))
                }
            }
        })
        .await
    }

    async fn finish_run(&self, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        self.call("finish_run", async {
            Ok(D::DB::finish_run(&self.db.pool, &self.fleet, end).await?)
        })
        .await
    }

    async fn runs(&self, q: &RunQuery<'_>) -> Result<Vec<RunInfo>, StoreError> {
        self.observe("runs", async {
            let now = self.limited(self.dialect.now(&self.db)).await?;
            self.limited(async { Ok(D::DB::runs(&self.db.pool, &self.fleet, q, now).await?) })
                .await
        })
        .await
    }
}

#[async_trait]
impl<D: Dialect> Fleet for SqlStore<D> {
    async fn pause(
        &self,
        pause: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, StoreError> {
        self.call("pause", async {
            Ok(D::DB::pause(&self.db.pool, &self.fleet, pause, replace).await?)
        })
        .await
    }

    async fn resume(&self, job: &str) -> Result<bool, StoreError> {
        self.call("resume", async {
            Ok(D::DB::resume(&self.db.pool, &self.fleet, job).await?)
        })
        .await
    }

    async fn pauses(&self, now: StoreTime) -> Result<Vec<PauseInfo>, StoreError> {
        self.call("pauses", async {
            Ok(D::DB::pauses(&self.db.pool, &self.fleet, now).await?)
        })
        .await
    }

    async fn request_trigger(&self, trigger: &TriggerInfo) -> Result<(), StoreError> {
        self.call("request_trigger", async {
            Ok(D::DB::request_trigger(&self.db.pool, &self.fleet, trigger).await?)
        })
        .await
    }

    async fn trigger(&self, id: &str) -> Result<Option<TriggerInfo>, StoreError> {
        self.call("trigger", async {
            Ok(D::DB::trigger(&self.db.pool, &self.fleet, id).await?)
        })
        .await
    }

    async fn pending_triggers(&self) -> Result<Vec<TriggerInfo>, StoreError> {
        self.call("pending_triggers", async {
            Ok(D::DB::pending_triggers(&self.db.pool, &self.fleet).await?)
        })
        .await
    }

    async fn claim_trigger(&self, id: &str, node: &str) -> Result<bool, StoreError> {
        self.call("claim_trigger", async {
            Ok(D::DB::claim_trigger(&self.db.pool, &self.fleet, id, node).await?)
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
        self.call("settle_trigger", async {
            Ok(D::DB::settle_trigger(&self.db.pool, &self.fleet, id, state, token, detail).await?)
        })
        .await
    }

    async fn cancel_trigger(&self, id: &str) -> Result<bool, StoreError> {
        self.call("cancel_trigger", async {
            Ok(D::DB::cancel_trigger(&self.db.pool, &self.fleet, id).await?)
        })
        .await
    }

    async fn beat(&self, beat: &NodeBeat<'_>) -> Result<crate::store::BeatAnswer, StoreError> {
        self.call("beat", self.dialect.beat(&self.db, &self.fleet, beat))
            .await
    }

    async fn nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        self.call("nodes", async {
            Ok(D::DB::nodes(&self.db.pool, &self.fleet).await?)
        })
        .await
    }

    async fn publish_jobs(
        &self,
        node: &str,
        jobs: &[crate::store::Definition<'_>],
    ) -> Result<(), StoreError> {
        self.call("publish_jobs", async {
            let mut tx = self.dialect.begin(&self.db).await?;
            D::DB::publish(&mut tx, &self.fleet, node, jobs).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn published_jobs(
        &self,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, StoreError> {
        self.call("published_jobs", async {
            Ok(D::DB::published(&self.db.pool, &self.fleet, node, definitions).await?)
        })
        .await
    }
}
