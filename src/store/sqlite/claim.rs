//! The batch claim on SQLite: one `BEGIN IMMEDIATE` transaction that
//! tries the items in order and wins at most the claim's limit.

use super::*;

impl Lite {
    /// One write transaction for the instant's items, in order: each
    /// within the limit goes through the single acquire's `UPDATE` (and
    /// its run row), or its `CREATE` for a resource never leased (the
    /// acquire's rule for a first acquisition, [`uncreatable`]; a paused
    /// job's is left to the single acquire, which notes the skip), each
    /// past it is only read. One host, one writer at a
    /// time: nothing is locked by another claimer, so nothing is skipped
    /// for that, and there is no share (the daemons of one host share one
    /// writer; `fencecron_nodes` is only their registry). What
    /// it saves is a transaction, and so a commit, per occurrence.
    pub(super) async fn claim_leases(
        &self,
        db: &Db<Sqlite>,
        req: &ClaimRequest<'_>,
    ) -> Sql<ClaimOutcome> {
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        let mut won = 0;
        let mut out = Vec::with_capacity(req.items.len());
        for item in req.items {
            let acquire = item.as_acquire(req.node);
            let (occ, next) = (item.occurrence.0, item.next_occurrence.map(|n| n.0));
            let existing = loss_row(&mut tx, item.resource, now, Some(occ), next).await?;
            let paused = sqlx::query(PAUSED)
                .bind(item.job)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            if paused.is_some() {
                // The single acquire decides, and notes the skip.
                out.push(Claimed::Ask);
                continue;
            }
            let present = existing.is_some();
            match existing {
                Some((loss, false)) => {
                    out.push(Claimed::from_loss(classify_loss(loss, &acquire)));
                    continue;
                }
                // Not yet due or superseded: the single acquire decides.
                None if uncreatable(now, Some(occ), next).is_some() => {
                    out.push(Claimed::Ask);
                    continue;
                }
                _ => {}
            }
            if won >= req.limit {
                out.push(Claimed::Skipped);
                continue;
            }
            let owner = item.owner_id.to_string();
            // The acquire's `UPDATE` of a free row, or its first
            // acquisition's `INSERT` (one writer: no one else creates it).
            let mut q = sqlx::query(if present { ACQUIRE } else { CREATE })
                .bind(item.resource.as_str())
                .bind(&owner)
                .bind(req.node)
                .bind(now)
                .bind(millis(item.lease))
                .bind(occ);
            if present {
                q = q.bind(next);
            }
            let row = q.fetch_one(&mut *tx).await?;
            let token: Token = row.try_get("fence")?;
            sqlx::query(INSERT_RUN)
                .bind(item.job)
                .bind(item.resource.as_str())
                .bind(occ)
                .bind(StartedBy::Schedule.as_str())
                .bind(req.node)
                .bind(&owner)
                .bind(token)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            won += 1;
            out.push(Claimed::Won(Lease {
                resource: item.resource.to_string(),
                owner_id: item.owner_id,
                token,
                expires_at: StoreTime(row.try_get("expires_at_ms")?),
                taken_over: rows::takeover(&row, rows::PREV)?,
            }));
        }
        tx.commit().await?;
        Ok(ClaimOutcome {
            items: out,
            limit: req.limit,
        })
    }
}
