//! Timers: per-resource repair and retry times, global cron schedules, retry backoff.
//! Pure: the caller supplies `now`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};

use crate::model::settings::RetryBackoff;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerKind {
    /// verify a good resource (self-healing)
    Repair,
    /// retry a failed resource (backoff lane)
    Retry,
}

/// (due, generation, resource, kind), earliest first.
type Entry = Reverse<(DateTime<Utc>, u64, String, TimerKind)>;

#[derive(Default)]
pub struct Timers {
    heap: BinaryHeap<Entry>,
    generation: HashMap<String, u64>,
    next_gen: u64,
}

impl Timers {
    /// (Re)arm the timer of a resource; it replaces any earlier one.
    pub fn set(&mut self, rid: &str, at: DateTime<Utc>, kind: TimerKind) {
        self.next_gen += 1;
        self.generation.insert(rid.to_string(), self.next_gen);
        self.heap
            .push(Reverse((at, self.next_gen, rid.to_string(), kind)));
        // re-arming leaves dead entries behind: drop them before they pile up
        if self.heap.len() > 4 * self.generation.len() + 1024 {
            let generation = &self.generation;
            self.heap
                .retain(|Reverse((_, g, rid, _))| generation.get(rid) == Some(g));
        }
    }

    pub fn cancel(&mut self, rid: &str) {
        self.generation.remove(rid);
    }

    /// Timers that are due at `now`.
    pub fn pop_due(&mut self, now: DateTime<Utc>) -> Vec<(String, TimerKind)> {
        let mut out = Vec::new();
        while self.heap.peek().is_some_and(|Reverse((at, ..))| *at <= now) {
            let Reverse((_, g, rid, kind)) = self.heap.pop().expect("peeked");
            if self.generation.get(&rid) == Some(&g) {
                self.generation.remove(&rid);
                out.push((rid, kind));
            }
        }
        out
    }

    /// When the next live timer is due.
    pub fn next_due(&mut self) -> Option<DateTime<Utc>> {
        while let Some(Reverse((at, g, rid, _))) = self.heap.peek() {
            if self.generation.get(rid) == Some(g) {
                return Some(*at);
            }
            self.heap.pop();
        }
        None
    }
}

/// Delay before retry number `failures` (1 = first retry): initial × factor^(n-1), capped at
/// max. Exact, so schedules can be reasoned about; see [`jittered`] for what is armed.
pub fn backoff(b: &RetryBackoff, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(40) as i32;
    let secs = (b.initial as f64) * b.factor.powi(exp);
    Duration::milliseconds((secs.min(b.max as f64) * 1000.0) as i64)
}

/// Share of a retry delay that is random: failures that started together (a host down, a
/// bad release) spread out instead of retrying in lockstep.
pub const JITTER: f64 = 0.1;

/// The backoff delay less up to [`JITTER`] of it, at random: never later than the schedule
/// (the cap stays a cap), never earlier than 90 % of it.
pub fn jittered(b: &RetryBackoff, failures: u32) -> Duration {
    let exact = backoff(b, failures);
    // 16 random bits are plenty here: no extra dependency for a random number
    let bits = uuid::Uuid::new_v4().as_u128() as u16;
    let share = JITTER * (bits as f64 / u16::MAX as f64);
    exact - Duration::milliseconds((exact.num_milliseconds() as f64 * share) as i64)
}

/// A 5-field cron schedule (minute hour day-of-month month day-of-week), in UTC.
#[derive(Clone, Debug)]
pub struct Cron {
    minutes: Vec<bool>,
    hours: Vec<bool>,
    dom: Vec<bool>,
    months: Vec<bool>,
    dow: Vec<bool>,
    dom_any: bool,
    dow_any: bool,
}

fn field(spec: &str, lo: u32, hi: u32, names: &[&str]) -> Result<(Vec<bool>, bool), String> {
    let mut set = vec![false; hi as usize + 1];
    let any = spec == "*";
    let value = |s: &str| -> Result<u32, String> {
        if let Ok(v) = s.parse::<u32>() {
            return Ok(v);
        }
        names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(s))
            .map(|p| p as u32 + if names.len() == 12 { 1 } else { 0 })
            .ok_or_else(|| format!("invalid cron value '{s}'"))
    };
    for part in spec.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .map_err(|_| format!("invalid step in '{part}'"))?,
            ),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("invalid step in '{part}'"));
        }
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            (v, if part.contains('/') { hi } else { v })
        };
        if a < lo || b > hi || a > b {
            return Err(format!("cron field '{part}' out of range {lo}-{hi}"));
        }
        let mut v = a;
        while v <= b {
            set[v as usize] = true;
            v += step;
        }
    }
    Ok((set, any))
}

impl Cron {
    pub fn parse(expr: &str) -> Result<Cron, String> {
        let f: Vec<&str> = expr.split_whitespace().collect();
        if f.len() != 5 {
            return Err(format!("'{expr}' is not a 5-field cron expression"));
        }
        let days = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
        let months = [
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ];
        let (minutes, _) = field(f[0], 0, 59, &[])?;
        let (hours, _) = field(f[1], 0, 23, &[])?;
        let (dom, dom_any) = field(f[2], 1, 31, &[])?;
        let (months, _) = field(f[3], 1, 12, &months)?;
        let (mut dow, dow_any) = field(f[4], 0, 7, &days)?;
        if dow[7] {
            dow[0] = true;
        }
        Ok(Cron {
            minutes,
            hours,
            dom,
            months,
            dow,
            dom_any,
            dow_any,
        })
    }

    fn day_matches(&self, t: &DateTime<Utc>) -> bool {
        let dom = self.dom[t.day() as usize];
        let dow = self.dow[t.weekday().num_days_from_sunday() as usize];
        match (self.dom_any, self.dow_any) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            (false, false) => dom || dow,
        }
    }

    /// The first time strictly after `after` that matches.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut t = Utc
            .with_ymd_and_hms(
                after.year(),
                after.month(),
                after.day(),
                after.hour(),
                after.minute(),
                0,
            )
            .single()?
            + Duration::minutes(1);
        let limit = after + Duration::days(366 * 5);
        while t <= limit {
            if !self.months[t.month() as usize] {
                let (y, m) = if t.month() == 12 {
                    (t.year() + 1, 1)
                } else {
                    (t.year(), t.month() + 1)
                };
                t = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()?;
                continue;
            }
            if !self.day_matches(&t) {
                t = Utc
                    .with_ymd_and_hms(t.year(), t.month(), t.day(), 0, 0, 0)
                    .single()?
                    + Duration::days(1);
                continue;
            }
            if !self.hours[t.hour() as usize] {
                t = Utc
                    .with_ymd_and_hms(t.year(), t.month(), t.day(), t.hour(), 0, 0)
                    .single()?
                    + Duration::hours(1);
                continue;
            }
            if !self.minutes[t.minute() as usize] {
                t += Duration::minutes(1);
                continue;
            }
            return Some(t);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn cron_next() {
        let c = Cron::parse("*/15 * * * *").unwrap();
        assert_eq!(
            c.next_after(at("2026-01-01T10:07:30Z")).unwrap(),
            at("2026-01-01T10:15:00Z")
        );
        let c = Cron::parse("0 3 * * *").unwrap();
        assert_eq!(
            c.next_after(at("2026-01-01T10:07:30Z")).unwrap(),
            at("2026-01-02T03:00:00Z")
        );
        let c = Cron::parse("30 6 * * mon").unwrap();
        // 2026-01-01 is a Thursday
        assert_eq!(
            c.next_after(at("2026-01-01T00:00:00Z")).unwrap(),
            at("2026-01-05T06:30:00Z")
        );
        let c = Cron::parse("0 0 29 2 *").unwrap();
        assert_eq!(
            c.next_after(at("2026-03-01T00:00:00Z")).unwrap(),
            at("2028-02-29T00:00:00Z")
        );
        assert!(Cron::parse("61 * * * *").is_err());
    }

    #[test]
    fn timers_replace_and_pop() {
        let mut t = Timers::default();
        let now = at("2026-01-01T00:00:00Z");
        t.set("a", now + Duration::seconds(10), TimerKind::Repair);
        t.set("b", now + Duration::seconds(5), TimerKind::Retry);
        t.set("a", now + Duration::seconds(20), TimerKind::Repair);
        assert_eq!(t.next_due(), Some(now + Duration::seconds(5)));
        assert_eq!(
            t.pop_due(now + Duration::seconds(15)),
            vec![("b".to_string(), TimerKind::Retry)]
        );
        assert_eq!(t.next_due(), Some(now + Duration::seconds(20)));
        t.cancel("a");
        assert_eq!(t.next_due(), None);
    }

    #[test]
    fn exponential_backoff() {
        let b = RetryBackoff {
            initial: 10,
            factor: 2.0,
            max: 60,
        };
        assert_eq!(backoff(&b, 1).num_seconds(), 10);
        assert_eq!(backoff(&b, 2).num_seconds(), 20);
        assert_eq!(backoff(&b, 3).num_seconds(), 40);
        assert_eq!(backoff(&b, 9).num_seconds(), 60);
        for n in 1..12 {
            let j = jittered(&b, n);
            assert!(j <= backoff(&b, n), "jitter never delays past the schedule");
            assert!(j.num_milliseconds() as f64 >= 0.9 * backoff(&b, n).num_milliseconds() as f64);
        }
    }
}
