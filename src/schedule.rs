//! Cron schedules and the instants they fire at.
//!
//! An occurrence is identified by its scheduled instant, never by when a host
//! noticed it: two hosts whose clocks disagree by seconds still name the
//! same occurrence the same way, and the store lets each instant be taken
//! once (see `store::AcquireRequest::occurrence`).
//!
//! Cron expressions are parsed by `croner`, the parser tokio-cron-scheduler
//! uses; the timer is ours (see docs/design.md for why).

use std::fmt;

use chrono::offset::LocalResult;
use chrono::{DateTime, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

mod pattern;

use pattern::Pattern;

/// The cron macros, as Vixie cron, cronie and systemd's cron generators
/// read them, and the 5-field pattern each stands for (evaluated in the
/// job's `timezone`, like any other pattern). `@reboot` has no instant and
/// is refused.
pub const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// The pattern a macro stands for (case-insensitive, as in cron).
fn macro_pattern(name: &str) -> Result<&'static str, String> {
    MACROS
        .iter()
        .find(|(m, _)| m.eq_ignore_ascii_case(name))
        .map(|(_, pattern)| *pattern)
        .ok_or_else(|| {
            let known: Vec<&str> = MACROS.iter().map(|(m, _)| *m).collect();
            format!(
                "`{name}` is not a cron macro fencecron knows (an occurrence needs an instant, so `@reboot` has none); write one of {} or a 5- or 6-field expression",
                known.join(", ")
            )
        })
}

/// A parsed cron schedule in a time zone: about 100 bytes and the
/// expression's text (see [`pattern`] for why not croner's `Cron`).
#[derive(Clone)]
pub struct Schedule {
    cron: Pattern,
    tz: Tz,
    text: String,
    /// Every instant is shifted this much later (`jitter`): the same on
    /// every host, since it is derived from the job's name only.
    offset: chrono::Duration,
}

impl Schedule {
    /// Parses a 5-field (minute precision) or 6-field (with seconds) cron
    /// expression, or one of the macros every cron accepts (`@hourly`,
    /// `@daily`, …, see [`MACROS`]), evaluated in `tz`.
    pub fn parse(expr: &str, tz: Tz) -> Result<Schedule, String> {
        let pattern = match expr.trim() {
            m if m.starts_with('@') => macro_pattern(m)?,
            _ => expr,
        };
        let fields = pattern.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "`{expr}` has {fields} fields; write 5 (min hour day month weekday) or 6 (with seconds first)"
            ));
        }
        let cron = Pattern::parse(pattern)
            .map_err(|e| format!("`{expr}` is not a valid cron expression: {e}"))?;
        // A pattern that can never match (e.g. 30 February) is an error too.
        let probe = Utc::now().with_timezone(&tz).naive_local();
        if cron.next_after(probe).is_none() {
            return Err(format!(
                "`{expr}` never fires: {}",
                croner::errors::CronError::TimeSearchLimitExceeded
            ));
        }
        Ok(Schedule {
            cron,
            tz,
            text: expr.to_string(),
            offset: chrono::Duration::zero(),
        })
    }

    /// Shifts every instant by a fixed offset in `[0, jitter)`, in whole
    /// seconds, derived from `key` (the job's name) with a hash that is the
    /// same on every host and every version: all hosts name the same
    /// shifted instant, so an occurrence is still taken once fleet-wide.
    pub fn with_jitter(mut self, key: &str, jitter: std::time::Duration) -> Schedule {
        let span = jitter.as_secs();
        let offset = if span == 0 {
            0
        } else {
            fnv1a(key.as_bytes()) % span
        };
        self.offset = chrono::Duration::seconds(offset as i64);
        self
    }

    /// Shifts every instant by `offset` (whole seconds): the shift
    /// `with_jitter` chose, as a node published it.
    pub fn with_offset(mut self, offset: std::time::Duration) -> Schedule {
        self.offset = chrono::Duration::seconds(offset.as_secs() as i64);
        self
    }

    /// The fixed shift `with_jitter` chose (zero without jitter).
    pub fn jitter_offset(&self) -> std::time::Duration {
        self.offset.to_std().unwrap_or_default()
    }

    /// Parses a time zone name such as `UTC` or `Europe/Berlin`.
    pub fn parse_tz(name: &str) -> Result<Tz, String> {
        name.parse::<Tz>().map_err(|_| {
            format!(
                "`{name}` is not a known time zone; use an IANA name such as UTC or Europe/Berlin"
            )
        })
    }

    /// The first instant strictly after `t`. Instants are whole seconds:
    /// the sub-second part of `t` is dropped before searching (croner would
    /// otherwise carry it into the result), so every host names an
    /// occurrence by exactly the same instant.
    ///
    /// The expression is matched against the zone's wall clock, and daylight
    /// saving changes resolve the way docs/configuration.md states: a wall-clock time
    /// that does not exist (in the spring-forward gap) fires once, at the
    /// first instant after the gap; one that occurs twice (fall-back) fires
    /// once, at its first occurrence.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let whole = t.with_nanosecond(0).unwrap_or(t) - self.offset;
        self.next_unshifted(whole).map(|at| at + self.offset)
    }

    /// `next_after` for the cron expression itself, before the jitter.
    fn next_unshifted(&self, whole: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // The wall clock at `t`, as a zone-less time.
        let mut wall = whole.with_timezone(&self.tz).naive_local();
        // Bounded: a fold repeats at most a few hours, and a match inside it
        // that was already passed is skipped once per repeated wall time.
        for _ in 0..100_000 {
            let next = self.cron.next_after(wall)?;
            let at = self.resolve(next)?;
            if at > whole {
                return at.with_nanosecond(0);
            }
            wall = next;
        }
        None
    }

    /// The instant a wall-clock time of the zone names: the earlier one when
    /// it occurs twice, the end of the gap when it does not occur at all.
    fn resolve(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.tz.from_local_datetime(&wall) {
            LocalResult::Single(at) => Some(at.with_timezone(&Utc)),
            LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
            LocalResult::None => {
                // The first instant whose wall clock is at or past `wall`:
                // the moment the clocks jumped over it. Search the seconds
                // between a wall time safely before the gap and one after.
                let mut lo = self.earliest_before(wall)?.timestamp();
                let mut hi = lo + 2 * 86_400;
                while lo + 1 < hi {
                    let mid = lo + (hi - lo) / 2;
                    let local = DateTime::from_timestamp(mid, 0)?
                        .with_timezone(&self.tz)
                        .naive_local();
                    if local >= wall {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                DateTime::from_timestamp(hi, 0)
            }
        }
    }

    /// An instant whose wall clock is before `wall` (a day earlier, which
    /// no gap spans).
    fn earliest_before(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        let day_before = wall - chrono::Duration::days(1);
        match self.tz.from_local_datetime(&day_before) {
            LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => Some(at.with_timezone(&Utc)),
            LocalResult::None => self
                .tz
                .from_local_datetime(&(day_before - chrono::Duration::hours(3)))
                .earliest()
                .map(|at| at.with_timezone(&Utc)),
        }
    }

    /// The next `n` instants strictly after `t`.
    pub fn upcoming(&self, t: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut at = t;
        while out.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    out.push(next);
                    at = next;
                }
                None => break,
            }
        }
        out
    }

    /// The expression as written.
    pub fn expr(&self) -> &str {
        &self.text
    }

    /// The time zone it is evaluated in.
    pub fn tz(&self) -> Tz {
        self.tz
    }
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.tz == other.tz && self.offset == other.offset
    }
}

/// 64-bit FNV-1a: fixed by its specification, unlike std's hashers, so
/// every host and every fencecron version derive the same jitter.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Eq for Schedule {}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({:?} in {}", self.text, self.tz)?;
        if !self.offset.is_zero() {
            write!(f, " +{}s", self.offset.num_seconds())?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::time::Duration;

    #[test]
    fn five_and_six_fields() {
        let s = Schedule::parse("*/2 * * * * *", Tz::UTC).unwrap();
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 1).unwrap();
        assert_eq!(
            s.upcoming(t, 3),
            vec![
                Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 2).unwrap(),
                Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 4).unwrap(),
                Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 6).unwrap(),
            ]
        );
        let m = Schedule::parse("0 2 * * *", Tz::UTC).unwrap();
        assert_eq!(
            m.next_after(t),
            Some(Utc.with_ymd_and_hms(2026, 1, 2, 2, 0, 0).unwrap())
        );
    }

    #[test]
    fn macros_stand_for_their_patterns() {
        let t = Utc.with_ymd_and_hms(2026, 3, 14, 10, 30, 0).unwrap();
        for (name, pattern) in MACROS {
            let by_macro = Schedule::parse(name, Tz::UTC).unwrap();
            let by_pattern = Schedule::parse(pattern, Tz::UTC).unwrap();
            assert_eq!(by_macro.upcoming(t, 3), by_pattern.upcoming(t, 3), "{name}");
            // As in cron, case does not matter; the text shown is the job's.
            let upper = Schedule::parse(&name.to_uppercase(), Tz::UTC).unwrap();
            assert_eq!(upper.upcoming(t, 1), by_pattern.upcoming(t, 1));
            assert_eq!(by_macro.expr(), name);
        }
        let daily = Schedule::parse("@daily", Tz::UTC).unwrap();
        assert_eq!(
            daily.next_after(t),
            Some(Utc.with_ymd_and_hms(2026, 3, 15, 0, 0, 0).unwrap())
        );
        let berlin = Schedule::parse_tz("Europe/Berlin").unwrap();
        let daily = Schedule::parse("@daily", berlin).unwrap();
        assert_eq!(
            daily.next_after(t),
            Some(Utc.with_ymd_and_hms(2026, 3, 14, 23, 0, 0).unwrap())
        );
        for bad in ["@reboot", "@never", "@daily *"] {
            let e = Schedule::parse(bad, Tz::UTC).unwrap_err();
            assert!(e.contains("@hourly") || e.contains("cron"), "{bad}: {e}");
        }
    }

    #[test]
    fn instants_are_whole_seconds() {
        let s = Schedule::parse("*/2 * * * * *", Tz::UTC).unwrap();
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 1).unwrap()
            + chrono::Duration::milliseconds(217);
        assert_eq!(
            s.next_after(t),
            Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 2).unwrap())
        );
        let exact = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 2).unwrap();
        assert_eq!(
            s.next_after(exact),
            Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 4).unwrap())
        );
    }

    #[test]
    fn time_zones() {
        let tz = Schedule::parse_tz("Europe/Berlin").unwrap();
        let s = Schedule::parse("0 0 2 * * *", tz).unwrap();
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(
            s.next_after(t),
            Some(Utc.with_ymd_and_hms(2026, 1, 1, 1, 0, 0).unwrap())
        );
        assert!(Schedule::parse_tz("Mars/Olympus").is_err());
    }

    #[test]
    fn errors() {
        assert!(Schedule::parse("* * *", Tz::UTC)
            .unwrap_err()
            .contains("3 fields"));
        assert!(Schedule::parse("99 * * * *", Tz::UTC).is_err());
        assert!(Schedule::parse("0 0 30 2 *", Tz::UTC).is_err());
    }

    fn berlin(expr: &str) -> Schedule {
        Schedule::parse(expr, Schedule::parse_tz("Europe/Berlin").unwrap()).unwrap()
    }

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
    }

    /// Spring forward in Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST
    /// (01:00 UTC). A wall time in the gap fires once, at 03:00 CEST.
    #[test]
    fn a_time_in_the_spring_gap_fires_once_at_the_end_of_the_gap() {
        let night = utc(2026, 3, 28, 22, 0, 0);
        assert_eq!(
            berlin("0 30 2 * * *").upcoming(night, 2),
            vec![utc(2026, 3, 29, 1, 0, 0), utc(2026, 3, 30, 0, 30, 0)]
        );
        // A range across the gap: 01:30 CET, 02:30 (gap -> 03:00 CEST), 03:30 CEST.
        assert_eq!(
            berlin("0 30 1-3 * * *").upcoming(night, 3),
            vec![
                utc(2026, 3, 29, 0, 30, 0),
                utc(2026, 3, 29, 1, 0, 0),
                utc(2026, 3, 29, 1, 30, 0)
            ]
        );
        // Every half hour: 02:00 and 02:30 do not exist; 03:00 CEST fires once.
        assert_eq!(
            berlin("0 */30 * * * *").upcoming(utc(2026, 3, 29, 0, 15, 0), 3),
            vec![
                utc(2026, 3, 29, 0, 30, 0),
                utc(2026, 3, 29, 1, 0, 0),
                utc(2026, 3, 29, 1, 30, 0)
            ]
        );
    }

    /// Fall back in Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET
    /// (01:00 UTC); 02:00-02:59 happen twice. Each wall time fires once, the
    /// first time, also for a host that starts during the second pass.
    #[test]
    fn a_time_that_occurs_twice_at_fall_back_fires_once() {
        let night = utc(2026, 10, 24, 22, 0, 0);
        assert_eq!(
            berlin("0 30 2 * * *").upcoming(night, 2),
            vec![utc(2026, 10, 25, 0, 30, 0), utc(2026, 10, 26, 1, 30, 0)]
        );
        assert_eq!(
            berlin("0 0 * * * *").upcoming(utc(2026, 10, 24, 23, 30, 0), 4),
            vec![
                utc(2026, 10, 25, 0, 0, 0), // 02:00 CEST
                utc(2026, 10, 25, 2, 0, 0), // 03:00 CET (02:00 CET already ran)
                utc(2026, 10, 25, 3, 0, 0),
                utc(2026, 10, 25, 4, 0, 0)
            ]
        );
        // Asked during the second pass (02:10 CET): 02:30 already ran.
        assert_eq!(
            berlin("0 30 2 * * *").next_after(utc(2026, 10, 25, 1, 10, 0)),
            Some(utc(2026, 10, 26, 1, 30, 0))
        );
    }

    #[test]
    fn jitter_shifts_every_instant_by_the_same_offset_from_the_name() {
        let plain = Schedule::parse("0 */5 * * * *", Tz::UTC).unwrap();
        let a = plain
            .clone()
            .with_jitter("nightly-report", Duration::from_secs(300));
        let again = plain
            .clone()
            .with_jitter("nightly-report", Duration::from_secs(300));
        let other = plain
            .clone()
            .with_jitter("cleanup", Duration::from_secs(300));
        let off = a.jitter_offset();
        assert!(off < Duration::from_secs(300));
        assert_eq!(a, again, "the same name gives the same schedule");
        assert_ne!(off, other.jitter_offset(), "names spread over the window");
        // Pinned: a change here would move every jittered job in a fleet
        // that upgrades host by host.
        // (FNV-1a 64 reference vectors.)
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let t = utc(2026, 1, 1, 10, 0, 0);
        let shifted = a.upcoming(t, 3);
        let unshifted = plain.upcoming(t - chrono::Duration::from_std(off).unwrap(), 3);
        for (s, u) in shifted.iter().zip(&unshifted) {
            assert_eq!(*s - *u, chrono::Duration::from_std(off).unwrap());
        }
        assert!(shifted[0] > t);
        // Asked exactly at a shifted instant: the next one.
        assert_eq!(a.next_after(shifted[0]), Some(shifted[1]));
        assert_eq!(
            Schedule::parse("* * * * * *", Tz::UTC)
                .unwrap()
                .with_jitter("x", Duration::ZERO)
                .jitter_offset(),
            Duration::ZERO
        );
    }
}
