//! `MemoryStore`'s write boundary: put, admit, get, the stale-owner records.

use super::*;

#[async_trait]
impl Fences for MemoryStore {
    async fn put(&self, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError> {
        let resource = req.resource.to_string();
        let key = req.key.to_string();
        let value = req.value.to_vec();
        let (token, once) = (req.token, req.once);
        let owner_id = req.owner_id;
        let (node, job, stage) = (
            req.node.to_string(),
            req.job.map(str::to_string),
            req.stage.clone(),
        );
        let op = req.operation_id.to_string();
        self.call(Op::Put, move |s, now| {
            // The SQL write boundary: the resource's current token from the
            // owner it was issued to, and the key's rule.
            let lease = s.leases.get(&resource).map(|r| (r.fence, r.owner_id));
            let slot = (resource.clone(), key.clone());
            let accepted = s.values.get(&slot).map(|v| v.token);
            let writes = lease
                .as_ref()
                .is_some_and(|(fence, owner)| *fence == token && *owner == owner_id)
                && accepted.is_none_or(|a| a < token || (a == token && !once));
            if writes {
                s.values.insert(
                    slot,
                    StoredValue {
                        resource,
                        key,
                        value,
                        token,
                        owner_id: Some(owner_id),
                        written_at: StoreTime(now),
                    },
                );
                return PutOutcome::Accepted {
                    written_at: StoreTime(now),
                };
            }
            let Some(rejection) = classify_rejection(token, owner_id, once, accepted, lease) else {
                return PutOutcome::AlreadyApplied;
            };
            let rec = NewStaleRecord {
                kind: StaleKind::WriteRejected,
                reason: rejection.reason.into(),
                resource: &resource,
                key: Some(&key),
                owner_id: Some(owner_id),
                token,
                accepted_token: rejection.accepted_token,
                node: &node,
                job: job.as_deref(),
                stage,
                operation_id: &op,
            }
            .stored(now);
            s.stale.push(rec.clone());
            PutOutcome::Rejected(Box::new(rec))
        })
        .await
    }

    async fn admit(&self, req: &AdmitRequest<'_>) -> Result<AdmitOutcome, StoreError> {
        let name = req.resource.clone();
        let (token, node) = (req.token, req.node.to_string());
        let resource = name.to_string();
        let op = req.operation_id.to_string();
        let id = req.operation_id;
        self.call(Op::Admit, move |s, now| {
            let req = AdmitRequest {
                resource: &name,
                token,
                node: &node,
                operation_id: id,
            };
            let issued = s.leases.get(&resource).map(|r| r.fence);
            let mut raised = false;
            loop {
                let highest = s.proxy.get(&resource).copied();
                match classify_admission(req.token, highest, issued, raised) {
                    Admission::Admit => return AdmitOutcome::Admitted,
                    Admission::Raise => {
                        s.proxy.insert(resource.clone(), req.token);
                        raised = true;
                    }
                    Admission::Refuse(reason, accepted) => {
                        let rec = req.record(reason, accepted, &op).stored(now);
                        s.stale.push(rec.clone());
                        return AdmitOutcome::Refused(Box::new(rec));
                    }
                }
            }
        })
        .await
    }

    async fn get(&self, resource: &Name, key: &Name) -> Result<Option<StoredValue>, StoreError> {
        let slot = (resource.to_string(), key.to_string());
        Ok(self.lock().values.get(&slot).cloned())
    }

    async fn record_stale(&self, rec: &NewStaleRecord<'_>) -> Result<StaleRecord, StoreError> {
        let rec = rec.stored(0);
        self.call(Op::RecordStale, move |s, now| {
            let rec = StaleRecord {
                at: StoreTime(now),
                ..rec
            };
            s.stale.push(rec.clone());
            rec
        })
        .await
    }

    async fn stale(&self, since: Option<StoreTime>) -> Result<Vec<StaleRecord>, StoreError> {
        let s = self.lock();
        let mut out: Vec<StaleRecord> = s
            .stale
            .iter()
            .filter(|r| since.is_none_or(|t| r.at >= t))
            .cloned()
            .collect();
        // Stable: records of the same millisecond stay in insertion order.
        out.sort_by_key(|r| r.at);
        Ok(out)
    }

    async fn latest_stale(
        &self,
        since: StoreTime,
        limit: u32,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        let mut out = self.stale(Some(since)).await?;
        out.reverse();
        out.truncate(limit as usize);
        Ok(out)
    }
}
