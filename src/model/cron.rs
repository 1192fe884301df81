//! Cron schedules of the environment settings (`deploy_interval`, `repair_interval`).
//!
//! One type, used both to validate a setting and to schedule it, so a value the API accepts
//! is exactly a value the scheduler can run. Parsing and evaluation are the `croner` crate's
//! (chosen over the `cron` crate, which wants a seconds field and counts weekdays Quartz-style
//! from 1 = Sunday, so `0 3 * * 1` would silently mean Sunday there).
//!
//! Accepted syntax: the classic 5 fields `minute hour day-of-month month day-of-week`, always
//! evaluated in UTC (no daylight-saving gaps or repeats). Each field takes `*`, numbers,
//! ranges `a-b`, lists `a,b`, steps `*/n` and `a-b/n`; months and weekdays also by name
//! (`jan`…`dec`, `sun`…`sat`, any case); Sunday is 0 or 7. As in Vixie cron, when both
//! day-of-month and day-of-week are restricted, a day matching either one matches.
//! `croner` also understands `L` (last), `#` (nth weekday), `W` (nearest weekday) and the
//! `@hourly`/`@daily`/`@weekly`/`@monthly`/`@yearly` shorthands; seconds and years are refused.

use std::fmt;

use chrono::{DateTime, Utc};
use croner::parser::{CronParser, Seconds, Year};

/// A parsed 5-field cron expression; compares and prints as the text it was parsed from.
#[derive(Clone)]
pub struct CronSchedule {
    text: String,
    // boxed: a parsed pattern is ~330 bytes, and settings hold two intervals
    cron: Box<croner::Cron>,
}

impl CronSchedule {
    pub fn parse(expr: &str) -> Result<CronSchedule, String> {
        let text = expr.trim();
        let fields = text.split_whitespace().count();
        if !text.starts_with('@') && fields != 5 {
            return Err(format!(
                "'{text}' is neither a number of seconds nor a 5-field cron expression \
                 (minute hour day-of-month month day-of-week, UTC); it has {fields} fields"
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(text)
            .map_err(|e| format!("invalid cron expression '{text}': {e}"))?;
        Ok(CronSchedule {
            text: text.to_string(),
            cron: Box::new(cron),
        })
    }

    /// The first matching minute strictly after `after`; `None` if there is none (a pattern
    /// such as `0 0 30 2 *`, which no calendar day matches).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&after, false).ok()
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for CronSchedule {}

impl fmt::Debug for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CronSchedule").field(&self.text).finish()
    }
}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn next(expr: &str, after: &str) -> String {
        CronSchedule::parse(expr)
            .unwrap()
            .next_after(at(after))
            .unwrap()
            .to_rfc3339()
    }

    #[test]
    fn steps_and_ranges() {
        assert_eq!(
            next("*/15 * * * *", "2026-01-01T10:07:30Z"),
            "2026-01-01T10:15:00+00:00"
        );
        // strictly after: a time on the schedule moves to the following one
        assert_eq!(
            next("*/15 * * * *", "2026-01-01T10:15:00Z"),
            "2026-01-01T10:30:00+00:00"
        );
        assert_eq!(
            next("10-20/5 * * * *", "2026-01-01T10:16:00Z"),
            "2026-01-01T10:20:00+00:00"
        );
        assert_eq!(
            next("10-20/5 * * * *", "2026-01-01T10:21:00Z"),
            "2026-01-01T11:10:00+00:00"
        );
        assert_eq!(
            next("0 9-17/4 * * *", "2026-01-01T13:01:00Z"),
            "2026-01-01T17:00:00+00:00"
        );
        assert_eq!(
            next("5,35 * * * *", "2026-01-01T10:06:00Z"),
            "2026-01-01T10:35:00+00:00"
        );
        assert_eq!(
            next("0 3 * * *", "2026-01-01T10:07:30Z"),
            "2026-01-02T03:00:00+00:00"
        );
    }

    #[test]
    fn weekday_and_month_names() {
        // 2026-01-01 is a Thursday
        assert_eq!(
            next("30 6 * * mon", "2026-01-01T00:00:00Z"),
            "2026-01-05T06:30:00+00:00"
        );
        assert_eq!(
            next("30 6 * * MON", "2026-01-01T00:00:00Z"),
            "2026-01-05T06:30:00+00:00"
        );
        assert_eq!(
            next("0 0 * * sat-sun", "2026-01-01T00:00:00Z"),
            "2026-01-03T00:00:00+00:00"
        );
        // Sunday is 0 and 7 alike (not Quartz's 1)
        assert_eq!(
            next("0 0 * * 0", "2026-01-01T00:00:00Z"),
            "2026-01-04T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 * * 7", "2026-01-01T00:00:00Z"),
            "2026-01-04T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 * * 1", "2026-01-01T00:00:00Z"),
            "2026-01-05T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 1 jun *", "2026-01-01T00:00:00Z"),
            "2026-06-01T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 1 Jun-Aug *", "2026-07-02T00:00:00Z"),
            "2026-08-01T00:00:00+00:00"
        );
    }

    #[test]
    fn day_of_month_or_day_of_week() {
        // both restricted: either matches (Vixie cron); the 13th is a Tuesday, Friday the 2nd
        assert_eq!(
            next("0 0 13 * fri", "2026-01-01T00:00:00Z"),
            "2026-01-02T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 13 * fri", "2026-01-10T00:00:00Z"),
            "2026-01-13T00:00:00+00:00"
        );
    }

    #[test]
    fn leap_days_and_utc() {
        assert_eq!(
            next("0 0 29 2 *", "2026-03-01T00:00:00Z"),
            "2028-02-29T00:00:00+00:00"
        );
        // the night Europe moves its clocks (2026-03-29): UTC has every hour exactly once
        assert_eq!(
            next("30 1 * * *", "2026-03-29T00:00:00Z"),
            "2026-03-29T01:30:00+00:00"
        );
        assert_eq!(
            next("30 2 * * *", "2026-03-29T00:00:00Z"),
            "2026-03-29T02:30:00+00:00"
        );
        assert_eq!(
            next("@daily", "2026-03-29T00:00:00Z"),
            "2026-03-30T00:00:00+00:00"
        );
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        for bad in [
            "61 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "* * * * 8",
            "*/0 * * * *",
            "5-1 * * * *",
            "* * * * funday",
            "0 * * * * *",
            "* * * *",
            "soon",
        ] {
            let err = CronSchedule::parse(bad).unwrap_err();
            assert!(err.contains(bad.trim()), "{bad}: {err}");
        }
        assert!(
            CronSchedule::parse("0 * * * * *")
                .unwrap_err()
                .contains("6 fields")
        );
    }

    #[test]
    fn compares_and_prints_as_its_text() {
        let a = CronSchedule::parse(" 0 3 * * * ").unwrap();
        assert_eq!(a, CronSchedule::parse("0 3 * * *").unwrap());
        assert_eq!(a.to_string(), "0 3 * * *");
        assert_eq!(format!("{a:?}"), "CronSchedule(\"0 3 * * *\")");
    }
}
