//! Timers: per-resource repair and retry times, retry backoff. (Cron schedules are
//! `model::cron`, shared with the settings that validate them.)
//! Pure: the caller supplies `now`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use chrono::{DateTime, Duration, Utc};

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

    /// [`Self::set`] of many at once (a start arms every resource's, a part at a time): the
    /// heap takes them in one go, not one push each, and is swept of what they replaced
    /// only when they replaced something.
    pub fn set_all(&mut self, armed: Vec<(String, DateTime<Utc>, TimerKind)>) {
        let mut replaced = false;
        let mut entries = Vec::with_capacity(armed.len());
        for (rid, at, kind) in armed {
            self.next_gen += 1;
            replaced |= self.generation.insert(rid.clone(), self.next_gen).is_some();
            entries.push(Reverse((at, self.next_gen, rid, kind)));
        }
        if replaced {
            let generation = &self.generation;
            self.heap
                .retain(|Reverse((_, g, rid, _))| generation.get(rid) == Some(g));
        }
        self.heap.extend(entries);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
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
    fn timers_set_all_at_once_pop_as_set_one_by_one() {
        let now = at("2026-01-01T00:00:00Z");
        let mut armed: Vec<(String, DateTime<Utc>, TimerKind)> = (0..200)
            .map(|i| {
                let kind = if i % 3 == 0 {
                    TimerKind::Retry
                } else {
                    TimerKind::Repair
                };
                (
                    format!("r{}", i % 150),
                    now + Duration::seconds((i * 37) % 101),
                    kind,
                )
            })
            .collect();
        let (mut one, mut all) = (Timers::default(), Timers::default());
        // an earlier timer of r1, replaced by both
        one.set("r1", now, TimerKind::Repair);
        all.set("r1", now, TimerKind::Repair);
        for (rid, at, kind) in &armed {
            one.set(rid, *at, *kind);
        }
        // in two parts, the second replacing some of the first's
        let second = armed.split_off(120);
        all.set_all(armed);
        all.set_all(second);
        for s in (0..=105).step_by(7) {
            let mut a = one.pop_due(now + Duration::seconds(s));
            let mut b = all.pop_due(now + Duration::seconds(s));
            a.sort();
            b.sort();
            assert_eq!(a, b, "due at {s}");
            assert_eq!(one.next_due(), all.next_due());
        }
        assert_eq!(all.next_due(), None);
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
