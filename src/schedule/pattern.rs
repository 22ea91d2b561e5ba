//! A cron pattern as a few bit sets, and the search for its next match.
//!
//! croner parses the expression (its syntax and its error messages are
//! fencecron's); what it parsed is then copied into [`Pattern`], about 50
//! bytes, and croner's `Cron` is dropped. A `Cron` holds a byte per year
//! from 1 to 5000 besides its other fields (about 5 KB), and parsing `*`
//! for the year sets those 5,000 bits one by one: at 10,000 jobs that was
//! 50 MB held by an idle daemon and a third of the CPU of loading the
//! config. fencecron's patterns have no year field (5 or 6 fields: every
//! year matches), so croner is handed the pattern with a year field of one
//! value, which it parses at once, and its year bits are never read.
//!
//! [`Pattern::next_after`] is croner's own rule over the same bits: the
//! first whole second after the given wall-clock time whose month, day
//! (day of month and day of week, with `L`, `W`, `#` and the `+` that asks
//! for both), hour, minute and second match. The day rule
//! ([`Pattern::day_matches`]) follows croner's `CronPattern::day_match`
//! (croner 3.0, MIT) line by line; `tests::agrees_with_croner` compares the
//! two searches on thousands of generated patterns and instants.

use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Weekday};
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};

// croner's flag bits per value (croner 3.0's `component` module, private
// there): `tests::agrees_with_croner` fails if they ever change.
const ALL: u8 = 1;
const NTH: [u8; 5] = [1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5];
const LAST: u8 = 1 << 6;
const CLOSEST_WEEKDAY: u8 = 1 << 7;

/// How far ahead a match is looked for. Every rule of a pattern without a
/// year field repeats with the Gregorian calendar's 400-year cycle, so a
/// pattern with no match in 401 years has none at all.
const SEARCH_YEARS: i32 = 401;

/// A parsed cron pattern (5 or 6 fields, no year).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pattern {
    seconds: u64,
    minutes: u64,
    hours: u32,
    /// Bit d: day of month d (1..=31).
    days: u32,
    /// Bit d: `dW`, the weekday nearest to day d.
    nearest_weekday: u32,
    /// `L` in the day of month: its last day.
    last_day: bool,
    /// Bit m: month m (1..=12).
    months: u16,
    /// croner's flags per day of week, Sunday first: [`ALL`], `#n`
    /// ([`NTH`]), `nL` ([`LAST`]).
    weekdays: [u8; 7],
    /// The day of month is `*` (or `?`).
    star_dom: bool,
    /// The day of week is `*` (or `?`).
    star_dow: bool,
    /// The day of week starts with `+`: both day fields must match, not
    /// either.
    dom_and_dow: bool,
}

impl Pattern {
    /// Parses a 5- or 6-field pattern (the caller checked the count) as
    /// croner does; croner's error when it refuses it.
    pub(super) fn parse(pattern: &str) -> Result<Pattern, CronError> {
        let fields: Vec<&str> = pattern.split_whitespace().collect();
        // croner's own normalisation: seconds "0" when omitted.
        let mut full: Vec<&str> = Vec::with_capacity(7);
        if fields.len() == 5 {
            full.push("0");
        }
        full.extend(&fields);
        let parser = |year| {
            CronParser::builder()
                .seconds(Seconds::Optional)
                .year(year)
                .build()
        };
        // A single year instead of croner's implicit `*` (see the module
        // comment); any refusal is croner's answer to the text as written.
        let with_year = format!("{} 2000", full.join(" "));
        let cron = match parser(Year::Optional).parse(&with_year) {
            Ok(cron) => cron,
            Err(_) => {
                parser(Year::Optional).parse(pattern)?;
                // Refused with a year field, accepted without one: no
                // pattern croner parses does this, but the answer must be
                // what the text means.
                return Err(CronError::InvalidPattern(format!(
                    "`{pattern}` could not be read without its year"
                )));
            }
        };
        let p = &cron.pattern;
        let bits = |n: std::ops::RangeInclusive<u16>, set: &dyn Fn(u16) -> bool| {
            n.filter(|&v| set(v)).fold(0u64, |acc, v| acc | 1 << v)
        };
        let ok = |r: Result<bool, CronError>| r.unwrap_or(false);
        let mut weekdays = [0u8; 7];
        for (day, flags) in weekdays.iter_mut().enumerate() {
            for flag in [ALL, NTH[0], NTH[1], NTH[2], NTH[3], NTH[4], LAST] {
                if ok(p.days_of_week.is_bit_set(day as u16, flag)) {
                    *flags |= flag;
                }
            }
        }
        // What croner decides from the text itself (`?` is `*`; a leading
        // `+` in the day of week asks for both day fields).
        let dom = full[3].replace('?', "*");
        let dow = full[5].replace('?', "*");
        let dom_and_dow = dow.starts_with('+');
        let dow = dow.strip_prefix('+').unwrap_or(&dow);
        Ok(Pattern {
            seconds: bits(0..=59, &|v| ok(p.seconds.is_bit_set(v, ALL))),
            minutes: bits(0..=59, &|v| ok(p.minutes.is_bit_set(v, ALL))),
            hours: bits(0..=23, &|v| ok(p.hours.is_bit_set(v, ALL))) as u32,
            days: bits(1..=31, &|v| ok(p.days.is_bit_set(v, ALL))) as u32,
            nearest_weekday: bits(1..=31, &|v| ok(p.days.is_bit_set(v, CLOSEST_WEEKDAY))) as u32,
            last_day: p.days.is_feature_enabled(LAST),
            months: bits(1..=12, &|v| ok(p.months.is_bit_set(v, ALL))) as u16,
            weekdays,
            star_dom: dom == "*",
            star_dow: dow == "*",
            dom_and_dow,
        })
    }

    /// The first whole second strictly after `t` (a wall-clock time) that
    /// matches; `None` when none does within [`SEARCH_YEARS`] (never) or
    /// before the calendar's end.
    pub(super) fn next_after(&self, t: NaiveDateTime) -> Option<NaiveDateTime> {
        let mut date = t.date();
        let mut from = t.time().num_seconds_from_midnight() + 1;
        let until = date.year().checked_add(SEARCH_YEARS)?;
        loop {
            if from >= 86_400 {
                date = date.succ_opt()?;
                from = 0;
            }
            if date.year() > until {
                return None;
            }
            if self.months & (1 << date.month()) == 0 {
                let (y, m) = match date.month() {
                    12 => (date.year().checked_add(1)?, 1),
                    m => (date.year(), m + 1),
                };
                date = NaiveDate::from_ymd_opt(y, m, 1)?;
                from = 0;
                continue;
            }
            if self.day_matches(date) {
                if let Some(s) = self.second_of_day(from) {
                    let time = NaiveTime::from_num_seconds_from_midnight_opt(s, 0)?;
                    return Some(date.and_time(time));
                }
            }
            date = date.succ_opt()?;
            from = 0;
        }
    }

    /// The first second of a day at or after `from` (seconds since
    /// midnight) whose hour, minute and second match.
    fn second_of_day(&self, from: u32) -> Option<u32> {
        let (h0, m0, s0) = (from / 3600, from / 60 % 60, from % 60);
        let mut hour = next_bit(u64::from(self.hours), h0);
        while let Some(h) = hour {
            let mut minute = next_bit(self.minutes, if h == h0 { m0 } else { 0 });
            while let Some(m) = minute {
                let first = if h == h0 && m == m0 { s0 } else { 0 };
                if let Some(s) = next_bit(self.seconds, first) {
                    return Some(h * 3600 + m * 60 + s);
                }
                minute = next_bit(self.minutes, m + 1);
            }
            hour = next_bit(u64::from(self.hours), h + 1);
        }
        None
    }

    /// croner's `day_match`: the day of month (its number, `L`, `W`) and
    /// the day of week (its number, `#n`, `nL`), either or both as the
    /// fields say.
    fn day_matches(&self, date: NaiveDate) -> bool {
        let day = date.day();
        let last = days_in_month(date);
        let day_matches = self.days & (1 << day) != 0
            || (self.last_day && day == last)
            || self.nearest_weekday_is(date, last);
        let flags = self.weekdays[date.weekday().num_days_from_sunday() as usize];
        let nth = (day - 1) / 7;
        let dow_matches = flags & NTH[nth as usize] != 0
            || (flags & LAST != 0 && day + 7 > last)
            || flags & ALL != 0;
        if (day_matches && self.star_dow) || (dow_matches && self.star_dom) {
            true
        } else if !self.star_dom && !self.star_dow {
            if self.dom_and_dow {
                day_matches && dow_matches
            } else {
                day_matches || dow_matches
            }
        } else {
            false
        }
    }

    /// Whether `date` is the weekday nearest to a `dW` day of its month:
    /// that day itself on Monday to Friday; the Friday before a Saturday
    /// (the Monday after when the Saturday is the 1st); the Monday after a
    /// Sunday (the Friday before when the Sunday is the month's last day).
    fn nearest_weekday_is(&self, date: NaiveDate, last: u32) -> bool {
        if self.nearest_weekday == 0 {
            return false;
        }
        let day = date.day();
        (1..=last)
            .filter(|d| self.nearest_weekday & (1 << d) != 0)
            .any(|d| {
                let Some(at) = date.with_day(d) else {
                    return false;
                };
                let target = match at.weekday() {
                    Weekday::Sat if d == 1 => d + 2,
                    Weekday::Sat => d - 1,
                    Weekday::Sun if d == last => d - 2,
                    Weekday::Sun => d + 1,
                    _ => d,
                };
                target == day
            })
    }
}

/// The lowest set bit of `mask` at or above `from`.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    if from >= 64 {
        return None;
    }
    let rest = mask >> from;
    (rest != 0).then(|| from + rest.trailing_zeros())
}

/// The number of days of `date`'s month.
fn days_in_month(date: NaiveDate) -> u32 {
    let (y, m) = match date.month() {
        12 => (date.year() + 1, 1),
        m => (date.year(), m + 1),
    };
    NaiveDate::from_ymd_opt(y, m, 1)
        .and_then(|first| first.pred_opt())
        .map_or(31, |d| d.day())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use croner::Cron;

    /// A small deterministic generator (xorshift64*), so that a failure
    /// names a pattern that fails again.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len() as u64) as usize]
        }
    }

    /// One field of `min..=max`: `*`, a value, a range, a step, a list,
    /// or one of `extra` (the field's own forms).
    fn field(rng: &mut Rng, min: u64, max: u64, extra: &[String]) -> String {
        let span = max - min + 1;
        let value = |rng: &mut Rng| min + rng.below(span);
        match rng.below(8 + extra.len() as u64) {
            0 | 1 => "*".to_string(),
            2 => value(rng).to_string(),
            3 => {
                let (a, b) = (value(rng), value(rng));
                format!("{}-{}", a.min(b), a.max(b))
            }
            4 => format!("*/{}", 1 + rng.below(span.min(20))),
            5 => {
                let (a, b) = (value(rng), value(rng));
                format!("{}-{}/{}", a.min(b), a.max(b), 1 + rng.below(7))
            }
            6 => format!("{}/{}", value(rng), 1 + rng.below(13)),
            7 => (0..2 + rng.below(3))
                .map(|_| value(rng).to_string())
                .collect::<Vec<_>>()
                .join(","),
            n => extra[n as usize - 8].clone(),
        }
    }

    fn generated(rng: &mut Rng) -> String {
        let dom_extra: Vec<String> = vec![
            "L".into(),
            "?".into(),
            format!("{}W", 1 + rng.below(31)),
            format!("{}W,{}", 1 + rng.below(31), 1 + rng.below(31)),
            format!("L,{}", 1 + rng.below(28)),
        ];
        let dow_extra: Vec<String> = vec![
            "?".into(),
            format!("{}#{}", rng.below(7), 1 + rng.below(5)),
            format!("{}L", rng.below(8)),
            format!("+{}", rng.below(7)),
            format!("+{}-{}", rng.below(3), 3 + rng.below(4)),
            rng.pick(&["MON-FRI", "SUN", "sat,sun", "+FRI#2", "7"])
                .to_string(),
            format!("{}#{},{}", rng.below(7), 1 + rng.below(5), rng.below(7)),
        ];
        let month_extra: Vec<String> = vec![rng.pick(&["JAN", "feb-apr", "DEC,6"]).to_string()];
        let mut fields = vec![
            field(rng, 0, 59, &[]),
            field(rng, 0, 23, &[]),
            field(rng, 1, 31, &dom_extra),
            field(rng, 1, 12, &month_extra),
            field(rng, 0, 7, &dow_extra),
        ];
        if rng.below(2) == 0 {
            fields.insert(0, field(rng, 0, 59, &[]));
        }
        // One pattern in ten has a field croner refuses.
        if rng.below(10) == 0 {
            let bad = [
                "60", "24", "0", "13", "5-2", "*/0", "1#6", "L", "32W", "x", "1-",
            ];
            let at = rng.below(fields.len() as u64) as usize;
            fields[at] = rng.pick(&bad).to_string();
        }
        fields.join(" ")
    }

    fn croner(pattern: &str) -> Option<Cron> {
        CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(pattern)
            .ok()
    }

    /// Generated patterns (steps, ranges, lists, `L`, `W`, `#`, `?`, `+`,
    /// names) and instants from 1970 to 2400: every pattern croner accepts
    /// is accepted, every one it refuses is refused, and each next match
    /// (five in a row from each instant) is croner's, or neither finds one.
    #[test]
    fn agrees_with_croner() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut compared, mut refused, mut never) = (0, 0, 0);
        for _ in 0..1000 {
            let text = generated(&mut rng);
            let theirs = croner(&text);
            let ours = Pattern::parse(&text);
            let Some(theirs) = theirs else {
                assert!(ours.is_err(), "croner refuses `{text}`, we accept it");
                refused += 1;
                continue;
            };
            let ours = ours.unwrap_or_else(|e| panic!("`{text}`: croner accepts it, we say {e}"));
            for _ in 0..3 {
                let start = rng.below(430 * 365 * 86_400) as i64;
                let mut t = Utc.timestamp_opt(start, 0).unwrap();
                for _ in 0..5 {
                    let got = ours
                        .next_after(t.naive_utc())
                        .map(|n| Utc.from_utc_datetime(&n));
                    if got.is_none() {
                        // croner says so only after searching to the year
                        // 5000 (seconds in a debug build): three are asked.
                        never += 1;
                        if never > 3 {
                            break;
                        }
                    }
                    let expected = theirs.find_next_occurrence(&t, false).ok();
                    assert_eq!(got, expected, "`{text}` after {t}");
                    compared += 1;
                    match expected {
                        Some(next) => t = next,
                        // Never (croner searches to the year 5000 first).
                        None => break,
                    }
                }
            }
        }
        // The generator must exercise both sides.
        assert!(
            compared > 10_000 && refused > 50 && never > 2,
            "{compared} {refused} {never}"
        );
    }

    /// Patterns that never match are found to (croner: at year 5000).
    #[test]
    fn a_pattern_that_never_matches_has_no_next() {
        let t = NaiveDate::from_ymd_opt(2026, 12, 7)
            .unwrap()
            .and_hms_opt(12, 0, 0)
            .unwrap();
        for text in ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 0 31 2 +1"] {
            assert_eq!(Pattern::parse(text).unwrap().next_after(t), None, "{text}");
        }
        // Rare but real: the 29th of February on a Monday (2044).
        let leap_monday = Pattern::parse("0 0 29 2 +1").unwrap().next_after(t);
        assert_eq!(leap_monday.map(|n| n.year()), Some(2044));
    }
}
