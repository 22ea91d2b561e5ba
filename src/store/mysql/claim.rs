//! The batch claim on MySQL/MariaDB: one call of the procedure of
//! migration 0011.

use super::*;

/// A batch claim (the procedure as migration 0011 redefined it: it also
/// creates never-leased rows): the items as JSON, node, limit, share, how
/// often the node's mark is refreshed and how long a mark counts.
pub(super) const CALL_CLAIM: &str = "CALL fencecron_claim_v1(?, ?, ?, ?, ?, ?)";

impl My {
    /// One `CALL fencecron_claim_v1(…)` (migration 0011): the claim's
    /// transaction (`FOR UPDATE SKIP LOCKED` over the items' rows in order,
    /// the new rows created after them) and the read of every item's row
    /// run on the server, in one round trip.
    pub(super) async fn claim_leases(
        &self,
        db: &Db<MySql>,
        req: &ClaimRequest<'_>,
    ) -> Sql<ClaimOutcome> {
        let items: Vec<serde_json::Value> = req
            .items
            .iter()
            .map(|i| {
                let mut item = serde_json::json!({
                    "r": i.resource.as_str(),
                    "o": i.owner_id.to_string(),
                    "j": i.job,
                    "q": i.occurrence.0,
                    "l": millis(i.lease),
                });
                if let Some(next) = i.next_occurrence {
                    item["n"] = next.0.into();
                }
                item
            })
            .collect();
        let rows = sqlx::query(CALL_CLAIM)
            .bind(serde_json::Value::Array(items).to_string())
            .bind(req.node)
            .bind(i64::try_from(req.limit).unwrap_or(i64::MAX))
            .bind(i32::from(req.share))
            .bind(millis(NODE_BEAT))
            .bind(millis(NODE_LIVE))
            .fetch_all(&db.pool)
            .await?;
        rows::claim_outcome(&rows, req, &db.url)
    }
}
