//! Cron schedules and the instants they fire at.
//!
//! An occurrence is identified by its scheduled instant, never by when a host
//! noticed it: two hosts whose clocks disagree by seconds still name the
//! same occurrence the same way, and the store lets each instant be taken
//! once (see `store::AcquireRequest::occurrence`).
//!
//! Cron expressions are parsed by `croner`, the parser tokio-cron-scheduler
//! uses; the timer is ours (see the README for why).

use std::fmt;

use chrono::{DateTime, Timelike, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

/// A parsed cron schedule in a time zone.
#[derive(Clone)]
pub struct Schedule {
    cron: Cron,
    tz: Tz,
    text: String,
}

impl Schedule {
    /// Parses a 5-field (minute precision) or 6-field (with seconds) cron
    /// expression, evaluated in `tz`.
    pub fn parse(expr: &str, tz: Tz) -> Result<Schedule, String> {
        let fields = expr.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "`{expr}` has {fields} fields; write 5 (min hour day month weekday) or 6 (with seconds first)"
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| format!("`{expr}` is not a valid cron expression: {e}"))?;
        // A pattern that can never match (e.g. 30 February) is an error too.
        let probe = Utc::now().with_timezone(&tz);
        cron.find_next_occurrence(&probe, false)
            .map_err(|e| format!("`{expr}` never fires: {e}"))?;
        Ok(Schedule {
            cron,
            tz,
            text: expr.to_string(),
        })
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
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let whole = t.with_nanosecond(0).unwrap_or(t);
        self.cron
            .find_next_occurrence(&whole.with_timezone(&self.tz), false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
            .and_then(|d| d.with_nanosecond(0))
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
        self.text == other.text && self.tz == other.tz
    }
}

impl Eq for Schedule {}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({:?} in {})", self.text, self.tz)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

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
}
