//! Row decoding shared by every backend: each backend's SELECTs name their
//! columns the same way, so one function per row shape serves all three.

use sqlx::{ColumnIndex, Database, Decode, Row, Type};

use super::{
    classify_loss, classify_rejection, ClaimOutcome, ClaimRequest, Claimed, Lease, LeaseInfo,
    LossRow, OwnerId, PutRequest, Rejection, StaleKind, StaleRecord, StoreError, StoreTime,
    StoredValue, Takeover, Token,
};

fn get<'r, R, T>(r: &'r R, col: &'static str) -> Result<T, sqlx::Error>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database>,
{
    r.try_get(col)
}

/// A `lease list` row: resource, owner_id, node, fence, expires_at_ms,
/// last_occurrence_ms; `now` is the store's clock.
pub(crate) fn lease_info<'r, R, DB>(r: &'r R, now: i64) -> Result<LeaseInfo, sqlx::Error>
where
    DB: Database,
    R: Row<Database = DB>,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, DB> + Type<DB>,
    Option<i64>: Decode<'r, DB> + Type<DB>,
    String: Decode<'r, DB> + Type<DB>,
{
    let expires_at: i64 = get(r, "expires_at_ms")?;
    Ok(LeaseInfo {
        resource: get(r, "resource")?,
        owner_id: get(r, "owner_id")?,
        node: get(r, "node")?,
        token: get(r, "fence")?,
        expires_at: StoreTime(expires_at),
        held: expires_at > now,
        last_occurrence: get::<_, Option<i64>>(r, "last_occurrence_ms")?.map(StoreTime),
    })
}

/// A `stale` row.
pub(crate) fn stale_record<'r, R, DB>(r: &'r R) -> Result<StaleRecord, sqlx::Error>
where
    DB: Database,
    R: Row<Database = DB>,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, DB> + Type<DB>,
    Option<i64>: Decode<'r, DB> + Type<DB>,
    String: Decode<'r, DB> + Type<DB>,
    Option<String>: Decode<'r, DB> + Type<DB>,
{
    let kind: String = get(r, "kind")?;
    Ok(StaleRecord {
        at: StoreTime(get(r, "at_ms")?),
        kind: StaleKind::parse(&kind),
        reason: crate::domain::stored(&get::<_, String>(r, "reason")?),
        resource: get(r, "resource")?,
        key: get(r, "key")?,
        // A stale record's owner is what the refused writer claimed (a job's
        // own report, before releases that checked it), not an owner the
        // store issued: one that is not a UUID lists as none rather than
        // making the whole listing unreadable.
        owner_id: get::<_, Option<String>>(r, "owner_id")?.and_then(|s| s.parse().ok()),
        token: get(r, "token")?,
        accepted_token: get(r, "accepted_token")?,
        node: get(r, "node")?,
        job: get(r, "job")?,
        stage: crate::domain::stored(&get::<_, String>(r, "stage")?),
        operation_id: get(r, "operation_id")?,
    })
}

/// A `get` row (value, token, owner_id, written_at_ms) for a known
/// resource and key.
pub(crate) fn stored_value<'r, R, DB>(
    r: &'r R,
    resource: &str,
    key: &str,
) -> Result<StoredValue, sqlx::Error>
where
    DB: Database,
    R: Row<Database = DB>,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, DB> + Type<DB>,
    Vec<u8>: Decode<'r, DB> + Type<DB>,
    Option<String>: Decode<'r, DB> + Type<DB>,
    String: Decode<'r, DB> + Type<DB>,
{
    Ok(StoredValue {
        resource: resource.to_string(),
        key: key.to_string(),
        value: get(r, "value")?,
        token: get(r, "token")?,
        owner_id: get(r, "owner_id")?,
        written_at: StoreTime(get(r, "written_at_ms")?),
    })
}

/// What a refused write's transaction reads back: the key's accepted token
/// (`accepted`) and the lease row's fence and owner (`issued`,
/// `issued_to`), as [`super::classify_rejection`] takes them.
pub(crate) struct PutState {
    pub accepted: Option<Token>,
    pub lease: Option<(Token, OwnerId)>,
}

impl PutState {
    /// Why `req` was refused; `None` if it was already applied
    /// ([`super::classify_rejection`]).
    pub(crate) fn rejection(&self, req: &PutRequest<'_>) -> Option<Rejection> {
        classify_rejection(req.token, req.owner_id, req.once, self.accepted, self.lease)
    }
}

/// A [`PutState`] row.
pub(crate) fn put_state<'r, R, DB>(r: &'r R) -> Result<PutState, sqlx::Error>
where
    DB: Database,
    R: Row<Database = DB>,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, DB> + Type<DB>,
    Option<String>: Decode<'r, DB> + Type<DB>,
    String: Decode<'r, DB> + Type<DB>,
{
    let issued: Option<Token> = get(r, "issued")?;
    let issued_to: Option<OwnerId> = get(r, "issued_to")?;
    Ok(PutState {
        accepted: get(r, "accepted")?,
        lease: issued.zip(issued_to),
    })
}

/// The `prev_*` columns of a winning acquire (owner id, node, fence,
/// expiry), by name or by position: the vanished owner of a takeover.
pub(crate) fn takeover<'r, R, DB, I>(
    r: &'r R,
    cols: [I; 4],
) -> Result<Option<Takeover>, sqlx::Error>
where
    DB: Database,
    R: Row<Database = DB>,
    I: ColumnIndex<R>,
    i64: Decode<'r, DB> + Type<DB>,
    Option<String>: Decode<'r, DB> + Type<DB>,
    String: Decode<'r, DB> + Type<DB>,
{
    let [owner_id, node, fence, expired_at] = cols;
    Ok(Takeover::from_columns(
        r.try_get(owner_id)?,
        r.try_get(node)?,
        r.try_get(fence)?,
        r.try_get(expired_at)?,
    ))
}

/// The prev_* columns by name, for [`takeover`].
pub(crate) const PREV: [&str; 4] = [
    "prev_owner_id",
    "prev_node",
    "prev_fence",
    "prev_expires_at_ms",
];

/// A batch claim's answer, one row per item in the request's order, read
/// by position (sqlx describes a MySQL `CALL` without its column names):
/// won, won fence, won expiry, the takeover's four `prev_*`, present,
/// fence, expiry, owner id, node, last occurrence, paused, the store's
/// clock, the claim's limit, skipped (no row, one the claim could have
/// created had it not stopped at its limit). Flags are 0 or 1.
/// PostgreSQL's `CLAIM` and MySQL's `fencecron_claim_v1` answer in this
/// shape.
pub(super) fn claim_outcome<'r, R, DB>(
    rows: &'r [R],
    req: &ClaimRequest<'_>,
    url: &super::StoreUrl,
) -> super::error::Sql<ClaimOutcome>
where
    DB: Database,
    R: Row<Database = DB>,
    usize: ColumnIndex<R>,
    i64: Decode<'r, DB> + Type<DB>,
    Option<i64>: Decode<'r, DB> + Type<DB>,
    Option<String>: Decode<'r, DB> + Type<DB>,
    String: Decode<'r, DB> + Type<DB>,
{
    let items = req.items;
    if rows.len() != items.len() {
        return Err(StoreError::Corrupt {
            url: url.to_string(),
            detail: format!(
                "a claim of {} items answered {} rows",
                items.len(),
                rows.len()
            ),
        }
        .into());
    }
    let mut limit = req.limit;
    let mut out = Vec::with_capacity(items.len());
    for (row, item) in rows.iter().zip(items) {
        limit = usize::try_from(row.try_get::<i64, _>(15)?).unwrap_or(0);
        let (won, fence, expires_at): (i64, Option<Token>, Option<i64>) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        if let (1, Some(token), Some(expires_at)) = (won, fence, expires_at) {
            out.push(Claimed::Won(Lease {
                resource: item.resource.to_string(),
                owner_id: item.owner_id,
                token,
                expires_at: StoreTime(expires_at),
                taken_over: takeover(row, [3, 4, 5, 6])?,
            }));
            continue;
        }
        let present: i64 = row.try_get(7)?;
        let paused: i64 = row.try_get(13)?;
        let (fence, expires_at, owner_id, node) = (
            row.try_get::<Option<Token>, _>(8)?,
            row.try_get::<Option<i64>, _>(9)?,
            row.try_get::<Option<OwnerId>, _>(10)?,
            row.try_get::<Option<String>, _>(11)?,
        );
        let (1, 0, Some(fence), Some(expires_at), Some(owner_id), Some(node)) =
            (present, paused, fence, expires_at, owner_id, node)
        else {
            // A new row past the limit is left for another look, as a free
            // row is; paused, or no row the claim could create (not yet
            // due, superseded, or created by another caller meanwhile):
            // the single acquire decides.
            let skipped = present == 0 && paused == 0 && row.try_get::<i64, _>(16)? == 1;
            out.push(if skipped {
                Claimed::Skipped
            } else {
                Claimed::Ask
            });
            continue;
        };
        let loss = LossRow {
            fence,
            expires_at,
            owner_id,
            node,
            last_occurrence: row.try_get(12)?,
            now: row.try_get(14)?,
        };
        out.push(Claimed::from_loss(classify_loss(
            loss,
            &item.as_acquire(req.node),
        )));
    }
    Ok(ClaimOutcome { items: out, limit })
}

/// How many rows a statement changed: each driver's result type has the
/// method, but sqlx names it in no trait.
pub(crate) trait Affected {
    fn rows_affected(&self) -> u64;
}

impl Affected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl Affected for sqlx::mysql::MySqlQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl Affected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}
