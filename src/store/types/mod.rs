//! What the store is asked and what it answers: tokens, store time, the
//! requests, outcomes and records every backend shares.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

// Why a write was refused is a stored word too: it lives with the others.
pub(crate) use crate::domain::RejectReason;
use crate::domain::{NodeState, RunOutcome, RunState, Stage, StaleReason, TriggerState};
use crate::names::Name;

mod fence;
mod fleet;
mod lease;
mod runs;

pub use fence::*;
pub use fleet::*;
pub use lease::*;
pub use runs::*;

/// Shortest lease the store accepts.
pub(crate) const MIN_LEASE: Duration = Duration::from_secs(5);
/// Longest lease the store accepts.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(300);

/// A fencing token: the fence value of one ownership generation.
///
/// A newtype so that a token is never confused with another number (an
/// epoch, a time, a count); it is the same `i64` everywhere it leaves the
/// process: decimal text in `FENCECRON_TOKEN`, a number in JSON and in log
/// fields, a `BIGINT` in every store (`sqlx(transparent)`). The default,
/// 0, is below every token a store issues: "no token yet".
#[derive(
    Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, sqlx::Type,
)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct Token(i64);

impl Token {
    /// The token with this fence value.
    pub const fn new(value: i64) -> Token {
        Token(value)
    }

    /// The fence value, as the store, the logs and the job see it.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// The token the next acquisition of the same resource gets within an
    /// epoch (saturating: no resource reaches `i64::MAX`). The stores count
    /// in SQL; the `MemoryStore` and the tests count here.
    #[cfg(test)]
    pub(crate) const fn next(self) -> Token {
        Token(self.0.saturating_add(1))
    }
}

/// The decimal number, as every output shows a token.
impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The bare number too, so a `{:?}` of a token (or of a value holding one)
/// reads as it did when a token was an `i64`.
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Decimal text, as `FENCECRON_TOKEN`, `--token` and the `Fencing-Token`
/// header carry it; the errors are `i64`'s.
impl std::str::FromStr for Token {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Token, Self::Err> {
        s.parse().map(Token)
    }
}

/// Tokens are `epoch << EPOCH_SHIFT | counter`. With epoch 0 (a database
/// that never failed over and never had its epoch advanced) tokens are
/// 1, 2, 3, …; a later epoch's tokens are above every token of an earlier
/// one, whatever the counter of a resource reached (up to 2^32 − 1
/// acquisitions of one resource per epoch).
pub(crate) const EPOCH_SHIFT: u32 = 32;

/// On PostgreSQL the effective epoch is `stored epoch + (timeline − 1) ×
/// TIMELINE_WEIGHT`. A promotion moves a standby to a later timeline, which
/// lifts the epoch by at least this much: above the old primary's epoch even
/// when the standby also missed up to `TIMELINE_WEIGHT − 1` epoch advances
/// (a plain `max(stored, timeline − 1)` would not move at all once the
/// stored epoch is above the timeline). 1024 keeps tokens below 2^53 (exact
/// in a JSON double) up to timeline 2048.
pub(crate) const TIMELINE_WEIGHT: i64 = 1024;

/// The lowest token an epoch can issue: `(epoch << 32) + 1`.
pub(crate) fn first_token_of(epoch: i64) -> Token {
    Token(epoch.saturating_mul(1 << EPOCH_SHIFT).saturating_add(1))
}

/// A point in time as milliseconds since the Unix epoch, as read from the
/// store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreTime(pub i64);

impl StoreTime {
    /// The time as a UTC date-time (saturating at the representable range).
    pub(crate) fn to_utc(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// RFC 3339 UTC with millisecond precision, the format of every time
    /// fencecron prints.
    pub(crate) fn rfc3339(self) -> String {
        rfc3339(self.to_utc())
    }

    /// From a UTC date-time.
    pub(crate) fn from_utc(t: DateTime<Utc>) -> Self {
        StoreTime(t.timestamp_millis())
    }
}

impl fmt::Display for StoreTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rfc3339())
    }
}

impl Serialize for StoreTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.rfc3339())
    }
}

/// The RFC 3339 text [`Serialize`] writes (any offset is taken).
impl<'de> serde::Deserialize<'de> for StoreTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        text.parse::<DateTime<Utc>>()
            .map(StoreTime::from_utc)
            .map_err(serde::de::Error::custom)
    }
}

/// RFC 3339 in UTC with milliseconds and a `Z` suffix.
pub(crate) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Lease length in whole milliseconds, as the SQL takes it.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The store-wide epoch of fencing tokens, as `fencecron epoch` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EpochInfo {
    /// The epoch stored in `fencecron_epoch` (raised by `epoch advance`).
    pub(crate) stored: i64,
    /// PostgreSQL's current timeline; `None` on other backends.
    pub(crate) timeline: Option<i64>,
    /// The epoch acquisitions use now: `stored` on SQLite and MySQL,
    /// `stored + (timeline − 1) × 1024` on PostgreSQL.
    pub(crate) effective: i64,
    /// The lowest token an acquisition can issue now: `(effective << 32) + 1`
    /// (a resource whose fence is already higher continues from its fence).
    pub(crate) lowest_token: Token,
    /// The highest token ever issued for any resource, if any.
    pub(crate) highest_token: Option<Token>,
}

impl EpochInfo {
    pub(crate) fn new(stored: i64, timeline: Option<i64>, highest_token: Option<Token>) -> Self {
        let effective = match timeline {
            Some(tl) => stored + (tl - 1) * TIMELINE_WEIGHT,
            None => stored,
        };
        EpochInfo {
            stored,
            timeline,
            effective,
            lowest_token: first_token_of(effective),
            highest_token,
        }
    }
}

/// The id of one ownership: who a token was issued to. Every owner id the
/// store records is a random UUID, written lowercase and hyphenated; renew,
/// release, give-back and fenced writes match it together with the token.
/// A string that is not a UUID is refused where it enters (a flag, the job's
/// environment), never sent to the store as an owner that cannot exist.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId {
    /// The UUID, lowercase and hyphenated: what the store binds and compares.
    text: [u8; 36],
}

impl OwnerId {
    /// A new owner id for one acquisition (or one occurrence on one node).
    pub fn fresh() -> OwnerId {
        OwnerId::from_uuid(Uuid::new_v4())
    }

    fn from_uuid(uuid: Uuid) -> OwnerId {
        let mut text = [0u8; 36];
        uuid.hyphenated().encode_lower(&mut text);
        OwnerId { text }
    }

    /// The id as the store binds and compares it.
    pub(crate) fn as_str(&self) -> &str {
        // A hyphenated UUID is ASCII.
        std::str::from_utf8(&self.text).unwrap_or_default()
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({})", self.as_str())
    }
}

impl Serialize for OwnerId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for OwnerId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OwnerId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl PartialEq<String> for OwnerId {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

/// An owner id column reads as an `OwnerId` wherever it reads as text, so
/// every row decodes straight into one; a stored value that is not a UUID
/// (no fencecron ever wrote one) fails the row's decoding with an error
/// that names it ([`BadOwnerId`]) instead of passing on as an owner that
/// cannot exist.
impl<DB: sqlx::Database> sqlx::Type<DB> for OwnerId
where
    String: sqlx::Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <String as sqlx::Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <String as sqlx::Type<DB>>::compatible(ty)
    }
}

impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for OwnerId
where
    String: sqlx::Decode<'r, DB>,
{
    fn decode(value: DB::ValueRef<'r>) -> Result<OwnerId, sqlx::error::BoxDynError> {
        let text = <String as sqlx::Decode<'r, DB>>::decode(value)?;
        Ok(text.parse::<OwnerId>()?)
    }
}

/// An owner id that is not a UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadOwnerId(pub String);

impl fmt::Display for BadOwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "owner id {:?} is not a UUID", self.0)
    }
}

impl std::error::Error for BadOwnerId {}

impl std::str::FromStr for OwnerId {
    type Err = BadOwnerId;

    fn from_str(s: &str) -> Result<OwnerId, BadOwnerId> {
        Uuid::parse_str(s.trim())
            .map(OwnerId::from_uuid)
            .map_err(|_| BadOwnerId(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    /// A token is its number wherever it leaves the process: decimal text
    /// (`FENCECRON_TOKEN`, headers, `{:?}` in messages), a JSON number, a
    /// store integer; text parses as an `i64` does, with `i64`'s errors.
    #[tokio::test]
    async fn a_token_is_its_number_in_every_format() {
        let t = Token::new(4_294_967_297);
        assert_eq!(
            (t.to_string(), format!("{t:?}")),
            ("4294967297".into(), "4294967297".into())
        );
        assert_eq!(format!("{:?}", Some(t)), "Some(4294967297)");
        assert_eq!(serde_json::to_string(&t).unwrap(), "4294967297");
        assert_eq!(serde_json::from_str::<Token>("4294967297").unwrap(), t);
        assert_eq!("4294967297".parse::<Token>(), Ok(t));
        for bad in ["x", "", "99999999999999999999"] {
            assert_eq!(
                bad.parse::<Token>().unwrap_err(),
                bad.parse::<i64>().unwrap_err()
            );
        }
        assert!(Token::new(1) < Token::new(2) && Token::default() < Token::new(1));
        let db = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let row = sqlx::query("SELECT ?1 AS t, ?1 + 1 AS n, NULL AS none")
            .bind(t)
            .fetch_one(&db)
            .await
            .unwrap();
        assert_eq!(row.try_get::<Token, _>("t").unwrap(), t);
        assert_eq!(row.try_get::<i64, _>("n").unwrap(), 4_294_967_298);
        assert_eq!(row.try_get::<Option<Token>, _>("none").unwrap(), None);
    }

    /// An owner id column decodes into an `OwnerId`; one that is not a UUID
    /// fails its row by name instead of passing on as an owner.
    #[tokio::test]
    async fn an_owner_id_column_decodes_only_a_uuid_and_names_what_it_refuses() {
        let db = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let id = OwnerId::fresh();
        let row = sqlx::query("SELECT ?1 AS owner_id, NULL AS none, 'not-a-uuid' AS bad")
            .bind(id.as_str())
            .fetch_one(&db)
            .await
            .unwrap();
        assert_eq!(row.try_get::<OwnerId, _>("owner_id").unwrap(), id);
        assert_eq!(row.try_get::<Option<OwnerId>, _>("none").unwrap(), None);
        let err = row.try_get::<OwnerId, _>("bad").unwrap_err().to_string();
        assert!(err.contains("\"not-a-uuid\" is not a UUID"), "{err}");
    }
}
