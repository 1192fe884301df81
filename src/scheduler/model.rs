//! The scheduler's picture of an environment: intent per resource (from the released
//! version it merged last), the dependency graph, and the state vector of every resource
//! (SCHEDULER.md §2). Pure: no I/O, time is a parameter.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::executor::protocol::{Change, Outcome};
use crate::model::diff::ChangeKind;

mod id_index;
mod in_place;

pub use id_index::IdIndex;

pub type Attrs = serde_json::Map<String, Value>;

/// A resource's attributes as the scheduler holds them: parsed, or (read back from the
/// database when the scheduler starts) the stored JSON text, parsed once on first use. A
/// restart reads every resource's attributes, and parsing 100,000 of them was about half of
/// its start (0.6 s of 1.4 s); most are not needed until they deploy again.
///
/// A scheduler that starts may also hold them *unread*: known by the intent's hash, read
/// from the database after it started (see `EnvScheduler::read_attributes`). Unread ones
/// never read as a map, so a resource is never deployed with attributes it does not have.
#[derive(Clone, Debug, Default)]
pub struct Attributes {
    text: Option<Box<str>>,
    parsed: std::sync::OnceLock<Result<Attrs, String>>,
    unread: bool,
}

impl Attributes {
    pub fn parsed(attrs: Attrs) -> Attributes {
        Attributes {
            text: None,
            parsed: std::sync::OnceLock::from(Ok(attrs)),
            unread: false,
        }
    }

    /// Attributes not read yet.
    pub fn unread() -> Attributes {
        Attributes {
            unread: true,
            ..Default::default()
        }
    }

    pub fn is_unread(&self) -> bool {
        self.unread
    }

    /// The stored JSON text of the attribute object, parsed when first read.
    pub fn stored(text: String) -> Attributes {
        Attributes {
            text: Some(text.into_boxed_str()),
            parsed: std::sync::OnceLock::new(),
            unread: false,
        }
    }

    /// The attributes; an error (the stored text is not a JSON object) says why, and a
    /// resource whose attributes can not be read is never deployed with others in their
    /// place.
    pub fn map(&self) -> Result<&Attrs, &str> {
        if self.unread {
            return Err("its attributes were not read from the database");
        }
        self.parsed
            .get_or_init(|| match &self.text {
                Some(text) => serde_json::from_str(text)
                    .map_err(|e| format!("its stored attributes do not read as an object: {e}")),
                None => Ok(Attrs::new()),
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// The attributes, moved out (an error says why they can not be read, as [`Self::map`]).
    pub fn into_map(self) -> Result<Attrs, String> {
        self.map().map_err(str::to_string)?;
        match self.parsed.into_inner() {
            Some(Ok(a)) => Ok(a),
            _ => unreachable!("read just above"),
        }
    }

    /// One attribute (None when absent, or when the attributes can not be read).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.map().ok()?.get(name)
    }

    /// The attributes to change; ones that can not be read become an empty map.
    pub fn make_mut(&mut self) -> &mut Attrs {
        if self.map().is_err() {
            self.parsed = std::sync::OnceLock::from(Ok(Attrs::new()));
        }
        self.text = None;
        self.unread = false;
        match self.parsed.get_mut() {
            Some(Ok(a)) => a,
            _ => unreachable!("read or set just above"),
        }
    }

    /// Parse the stored text now, and keep only the parsed attributes when they read: what
    /// is cloned from here on (each dispatch clones its intent) is the parsed map.
    pub fn settle(&mut self) {
        if self.map().is_ok() {
            self.text = None;
        }
    }

    /// Read already: parsed, or made from a map.
    #[cfg(test)]
    pub fn is_parsed(&self) -> bool {
        self.parsed.get().is_some()
    }
}

impl From<Attrs> for Attributes {
    fn from(attrs: Attrs) -> Attributes {
        Attributes::parsed(attrs)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compliance {
    Compliant,
    HasUpdate,
    NonCompliant,
    Undefined,
}

impl Compliance {
    pub fn as_str(self) -> &'static str {
        match self {
            Compliance::Compliant => "compliant",
            Compliance::HasUpdate => "has_update",
            Compliance::NonCompliant => "non_compliant",
            Compliance::Undefined => "undefined",
        }
    }

    pub fn parse(s: &str) -> Compliance {
        match s {
            "compliant" => Compliance::Compliant,
            "non_compliant" => Compliance::NonCompliant,
            "undefined" => Compliance::Undefined,
            _ => Compliance::HasUpdate,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LastRun {
    New,
    Successful,
    Failed,
    Skipped,
}

impl LastRun {
    pub fn as_str(self) -> &'static str {
        match self {
            LastRun::New => "new",
            LastRun::Successful => "successful",
            LastRun::Failed => "failed",
            LastRun::Skipped => "skipped",
        }
    }

    pub fn parse(s: &str) -> LastRun {
        match s {
            "successful" => LastRun::Successful,
            "failed" => LastRun::Failed,
            "skipped" => LastRun::Skipped,
            _ => LastRun::New,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Blocked {
    NotBlocked,
    /// undefined itself or depends (transitively) on an undefined resource
    Blocked,
    /// skipped because a requirement failed; waits for it to recover
    Temporarily,
}

impl Blocked {
    pub fn as_str(self) -> &'static str {
        match self {
            Blocked::NotBlocked => "not_blocked",
            Blocked::Blocked => "blocked",
            Blocked::Temporarily => "temporarily_blocked",
        }
    }

    pub fn parse(s: &str) -> Blocked {
        match s {
            "blocked" => Blocked::Blocked,
            "temporarily_blocked" => Blocked::Temporarily,
            _ => Blocked::NotBlocked,
        }
    }
}

/// The intent of a resource in the merged version.
#[derive(Clone, Debug)]
pub struct Intent {
    pub id: String,
    pub type_name: String,
    pub agent: String,
    pub hash: String,
    pub attributes: Attributes,
    pub requires: Vec<String>,
    pub undefined: bool,
}

impl Intent {
    /// The intent of a version's resource (its stored row), with these attributes.
    pub fn of_row(r: crate::store::versions::ResourceDigestRow, attributes: Attributes) -> Intent {
        Intent {
            id: r.resource_id,
            type_name: r.resource_type,
            agent: r.agent,
            hash: r.hash,
            attributes,
            requires: r.requires,
            undefined: r.undefined,
        }
    }

    pub fn flag(&self, name: &str, default: bool) -> bool {
        self.attributes
            .get(name)
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }
}

/// The state vector of one resource (persisted in `resource_state`).
#[derive(Clone, Debug, PartialEq)]
pub struct RState {
    pub compliance: Compliance,
    pub last_run: LastRun,
    pub last_result: Option<Outcome>,
    pub last_message: Option<String>,
    pub blocked: Blocked,
    pub blocked_reason: Option<String>,
    /// Hash of the intent of the last run.
    pub last_run_hash: Option<String>,
    pub last_attempt: Option<DateTime<Utc>>,
    pub last_deployed: Option<DateTime<Utc>>,
    pub last_success: Option<DateTime<Utc>>,
    pub last_produced_events: Option<DateTime<Utc>>,
    /// When a deploy last made a real change (drives reloads of dependents).
    pub last_change: Option<DateTime<Utc>>,
    pub failure_count: u32,
    pub next_retry: Option<DateTime<Utc>>,
}

impl RState {
    pub fn fresh(undefined: bool) -> RState {
        RState {
            compliance: if undefined {
                Compliance::Undefined
            } else {
                Compliance::HasUpdate
            },
            last_run: LastRun::New,
            last_result: None,
            last_message: None,
            blocked: if undefined {
                Blocked::Blocked
            } else {
                Blocked::NotBlocked
            },
            blocked_reason: if undefined {
                Some("its intent has unknown values".into())
            } else {
                None
            },
            last_run_hash: None,
            last_attempt: None,
            last_deployed: None,
            last_success: None,
            last_produced_events: None,
            last_change: None,
            failure_count: 0,
            next_retry: None,
        }
    }

    /// Known to be good: compliant and not blocked.
    pub fn good(&self) -> bool {
        self.compliance == Compliance::Compliant && self.blocked == Blocked::NotBlocked
    }
}

/// The net change of a merge.
#[derive(Debug, Default)]
pub struct Merged {
    pub new: Vec<usize>,
    pub updated: Vec<usize>,
    /// removed: their last intent (for an opt-in delete on the target)
    pub deleted: Vec<Intent>,
    pub newly_blocked: Vec<usize>,
    pub unblocked: Vec<usize>,
    /// Which resources are blocked by unknown values, and why, is as before: a change in
    /// place that could not move them (no undefined flag or `requires` changed, nothing
    /// blocked removed, nothing blocked added; a whole merge says `false`).
    pub blocking_unchanged: bool,
}

#[derive(Clone, Default)]
pub struct Model {
    pub version: Option<i32>,
    pub intents: Vec<Intent>,
    /// The agents the intents name, with how many name each (kept with them: status is asked
    /// often and must not walk 100,000 intents each time; an agent goes with its last intent).
    pub agents: BTreeMap<String, usize>,
    pub states: Vec<RState>,
    pub index: IdIndex,
    pub requires: Vec<Vec<usize>>,
    pub provides: Vec<Vec<usize>>,
    /// Resources believed to need a deploy.
    pub dirty: BTreeSet<usize>,
    /// Requirements naming a resource the model does not hold, by that id: who waits for it
    /// (an edge is made when a version adds it, without a walk over every intent).
    dangling: HashMap<String, Vec<usize>>,
}

impl Model {
    pub fn len(&self) -> usize {
        self.intents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.intents.is_empty()
    }

    pub fn get(&self, id: &str) -> Option<usize> {
        self.index.get(&self.intents, id)
    }

    /// Build from a version's intents and the stored state of each, at its place (missing
    /// states are fresh).
    pub fn restore(version: i32, intents: Vec<Intent>, states: Vec<Option<RState>>) -> Model {
        debug_assert_eq!(intents.len(), states.len());
        // the intents stay where they are (100,000 moved into a new vector were ~20 MB of
        // copies and page faults on a start's way)
        let mut index = IdIndex::with_capacity(intents.len());
        for r in 0..intents.len() {
            index.insert(&intents, r);
        }

        let states = states
            .into_iter()
            .zip(&intents)
            .map(|(s, i)| s.unwrap_or_else(|| RState::fresh(i.undefined)))
            .collect();
        let mut m = Model {
            version: Some(version),
            index,
            intents,
            states,
            ..Default::default()
        };
        m.rebuild_edges();
        m.recompute_agents();
        m.recompute_blocked();
        for r in 0..m.len() {
            let s = &mut m.states[r];
            // compliance follows the intent: never run, or run on another intent -> has_update
            if m.intents[r].undefined {
                s.compliance = Compliance::Undefined;
            } else if s.last_run_hash.as_deref() != Some(m.intents[r].hash.as_str())
                || s.last_run == LastRun::New
            {
                s.compliance = Compliance::HasUpdate;
            }
            // skip-for-dependencies is re-evaluated: such resources simply deploy again
            if s.blocked == Blocked::Temporarily {
                s.blocked = Blocked::NotBlocked;
            }
            if s.blocked == Blocked::NotBlocked && s.compliance != Compliance::Compliant {
                m.dirty.insert(r);
            }
        }
        m
    }

    fn push(&mut self, i: Intent, s: RState) {
        self.intents.push(i);
        self.index.insert(&self.intents, self.intents.len() - 1);
        self.states.push(s);
    }

    fn recompute_agents(&mut self) {
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for i in &self.intents {
            match count.get_mut(i.agent.as_str()) {
                Some(n) => *n += 1,
                None => {
                    count.insert(i.agent.clone(), 1);
                }
            }
        }
        self.agents = count;
    }

    fn rebuild_edges(&mut self) {
        let n = self.intents.len();
        self.requires = vec![Vec::new(); n];
        self.provides = vec![Vec::new(); n];
        self.dangling.clear();
        for r in 0..n {
            self.link(r);
        }
    }

    /// Undefined resources and everything downstream of them are blocked.
    pub fn recompute_blocked(&mut self) -> (Vec<usize>, Vec<usize>) {
        let n = self.len();
        let mut blocked = vec![false; n];
        let mut stack: Vec<usize> = (0..n).filter(|&r| self.intents[r].undefined).collect();
        for &r in &stack {
            blocked[r] = true;
        }
        while let Some(r) = stack.pop() {
            for &d in &self.provides[r] {
                if !blocked[d] {
                    blocked[d] = true;
                    stack.push(d);
                }
            }
        }
        let mut newly = Vec::new();
        let mut freed = Vec::new();
        for r in 0..n {
            let s = &mut self.states[r];
            if blocked[r] {
                if s.blocked != Blocked::Blocked {
                    newly.push(r);
                }
                s.blocked = Blocked::Blocked;
                s.blocked_reason = Some(if self.intents[r].undefined {
                    "its intent has unknown values".into()
                } else {
                    // the first in the intent's order (edges are in the order they were
                    // made, which differs between a whole merge and changes in place)
                    let culprit = self.intents[r]
                        .requires
                        .iter()
                        .find(|q| self.index.get(&self.intents, q).is_some_and(|q| blocked[q]))
                        .cloned()
                        .unwrap_or_default();
                    format!("depends on {culprit}, which can not be deployed (unknown values)")
                });
                self.dirty.remove(&r);
            } else if s.blocked == Blocked::Blocked {
                s.blocked = Blocked::NotBlocked;
                s.blocked_reason = None;
                freed.push(r);
            }
        }
        (newly, freed)
    }

    /// Merge a newer version (its intents): the net change against what we hold.
    pub fn merge(&mut self, version: i32, intents: Vec<Intent>) -> Merged {
        let mut merged = Merged::default();
        let old_intents = std::mem::take(&mut self.intents);
        let old_states = std::mem::take(&mut self.states);
        let old_index = std::mem::take(&mut self.index);
        let old_dirty = std::mem::take(&mut self.dirty);
        let mut seen = vec![false; old_intents.len()];
        for i in intents {
            match old_index.get(&old_intents, &i.id) {
                None => {
                    let r = self.len();
                    merged.new.push(r);
                    let s = RState::fresh(i.undefined);
                    self.push(i, s);
                }
                Some(o) => {
                    seen[o] = true;
                    let mut s = old_states[o].clone();
                    let changed =
                        old_intents[o].hash != i.hash || old_intents[o].undefined != i.undefined;
                    let r = self.len();
                    if changed {
                        merged.updated.push(r);
                        s.compliance = if i.undefined {
                            Compliance::Undefined
                        } else {
                            Compliance::HasUpdate
                        };
                        if s.blocked == Blocked::Temporarily {
                            // give it another chance
                            s.blocked = Blocked::NotBlocked;
                            s.blocked_reason = None;
                        }
                        s.failure_count = 0;
                        s.next_retry = None;
                    }
                    let was_dirty = old_dirty.contains(&o);
                    self.push(i, s);
                    if was_dirty {
                        self.dirty.insert(r);
                    }
                }
            }
        }
        for (o, i) in old_intents.into_iter().enumerate() {
            if !seen[o] {
                merged.deleted.push(i);
            }
        }
        self.version = Some(version);
        self.rebuild_edges();
        self.recompute_agents();
        let (newly, freed) = self.recompute_blocked();
        merged.newly_blocked = newly;
        merged.unblocked = freed;
        for &r in merged
            .new
            .iter()
            .chain(merged.updated.iter())
            .chain(merged.unblocked.iter())
        {
            if self.states[r].blocked == Blocked::NotBlocked {
                self.dirty.insert(r);
            }
        }
        merged
    }

    /// Why `r` may not run now: a requirement that did not deploy its current intent.
    pub fn failing_requirement(&self, r: usize) -> Option<usize> {
        self.requires[r]
            .iter()
            .copied()
            .find(|&q| self.states[q].compliance != Compliance::Compliant)
    }

    /// Record a finished run of the current intent of `r`; returns the dependents to notify
    /// (events and recoveries).
    pub fn finish(
        &mut self,
        r: usize,
        outcome: Outcome,
        change: Change,
        message: Option<String>,
        started: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Finished {
        let mut fin = Finished::default();
        let was_compliant = self.states[r].compliance == Compliance::Compliant;
        let hash = self.intents[r].hash.clone();
        let s = &mut self.states[r];
        s.last_result = Some(outcome);
        s.last_message = message;
        s.last_attempt = Some(started);
        s.last_deployed = Some(now);
        s.last_run_hash = Some(hash);
        match outcome {
            Outcome::Deployed => {
                s.last_run = LastRun::Successful;
                s.compliance = Compliance::Compliant;
                s.last_success = Some(started);
                s.failure_count = 0;
                s.next_retry = None;
                s.blocked = if s.blocked == Blocked::Temporarily {
                    Blocked::NotBlocked
                } else {
                    s.blocked
                };
                if s.blocked == Blocked::NotBlocked {
                    s.blocked_reason = None;
                }
                if change != Change::Nochange {
                    s.last_change = Some(now);
                }
                self.dirty.remove(&r);
            }
            Outcome::SkippedForDependency => {
                s.last_run = LastRun::Skipped;
                s.compliance = Compliance::NonCompliant;
                s.blocked = Blocked::Temporarily;
                self.dirty.remove(&r);
            }
            // a skip is retried like a failure, so it backs off like one
            Outcome::Skipped => {
                s.last_run = LastRun::Skipped;
                s.compliance = Compliance::NonCompliant;
                s.failure_count += 1;
                // the next retry is computed anew from this attempt (see arm_timer)
                s.next_retry = None;
                self.dirty.insert(r);
            }
            Outcome::Failed | Outcome::Unavailable | Outcome::TimedOut => {
                s.last_run = LastRun::Failed;
                s.compliance = Compliance::NonCompliant;
                s.failure_count += 1;
                s.next_retry = None;
                self.dirty.insert(r);
            }
            Outcome::Dry => {}
        }
        // events: every finished deploy of a send_event resource
        if self.intents[r].flag("send_event", false) && outcome != Outcome::Dry {
            self.states[r].last_produced_events = Some(now);
            for &d in &self.provides[r] {
                if self.intents[d].flag("receive_events", true)
                    && self.states[d].blocked != Blocked::Blocked
                {
                    fin.events.push(d);
                }
            }
        }
        // recovery: temporarily blocked dependents get another chance
        if outcome == Outcome::Deployed && !was_compliant {
            for &d in &self.provides[r] {
                if self.states[d].blocked == Blocked::Temporarily {
                    self.states[d].blocked = Blocked::NotBlocked;
                    self.states[d].blocked_reason = None;
                    self.dirty.insert(d);
                    fin.recovered.push(d);
                }
            }
        }
        fin
    }

    /// Should `r` reload: did a requirement change since `r` last deployed successfully?
    pub fn needs_reload(&self, r: usize) -> bool {
        let mine = self.states[r].last_success;
        self.requires[r]
            .iter()
            .any(|&q| match (self.states[q].last_change, mine) {
                (Some(c), Some(m)) => c > m,
                (Some(_), None) => true,
                _ => false,
            })
    }

    pub fn kind_of(&self, r: usize, merged: &Merged) -> ChangeKind {
        if merged.new.contains(&r) {
            ChangeKind::New
        } else if merged.updated.contains(&r) {
            ChangeKind::Updated
        } else {
            ChangeKind::Unchanged
        }
    }
}

#[derive(Debug, Default)]
pub struct Finished {
    /// Dependents that receive an event.
    pub events: Vec<usize>,
    /// Temporarily blocked dependents that recovered.
    pub recovered: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_attributes_are_read_when_first_used_and_once() {
        let text = r#"{"path": "/etc/motd", "send_event": true, "mode": 644}"#;
        let stored = Attributes::stored(text.to_string());
        assert!(!stored.is_parsed(), "nothing is parsed before it is read");
        let copy = stored.clone();
        assert_eq!(stored.get("send_event"), Some(&Value::Bool(true)));
        assert!(stored.is_parsed());
        // the same map as the whole object parsed at once, keys in the stored order
        let whole: Attrs = serde_json::from_str(text).unwrap();
        assert_eq!(stored.map().unwrap(), &whole);
        assert_eq!(
            stored.map().unwrap().keys().collect::<Vec<_>>(),
            ["path", "send_event", "mode"]
        );
        // a clone made before is read on its own
        assert!(!copy.is_parsed());
        let mut settled = copy;
        settled.settle();
        assert!(settled.is_parsed() && settled.text.is_none());
        assert_eq!(settled.map().unwrap(), &whole);
        let mut changed = Attributes::stored(text.to_string());
        changed
            .make_mut()
            .insert("purged".into(), Value::Bool(true));
        assert_eq!(changed.get("purged"), Some(&Value::Bool(true)));
        assert_eq!(changed.get("path"), Some(&Value::from("/etc/motd")));
        assert!(
            Intent {
                attributes: changed,
                ..intent("a", "h", &[], false)
            }
            .flag("send_event", false)
        );
    }

    #[test]
    fn stored_attributes_that_do_not_read_say_so_and_are_never_taken_as_empty() {
        for bad in ["[1, 2]", "{\"a\": ", "null"] {
            let stored = Attributes::stored(bad.to_string());
            let err = stored.map().expect_err(bad);
            assert!(err.contains("do not read as an object"), "{err}");
            assert_eq!(stored.get("send_event"), None);
            // a flag falls back to its default, as for an absent attribute
            let i = Intent {
                attributes: stored.clone(),
                ..intent("a", "h", &[], false)
            };
            assert!(!i.flag("send_event", false));
            let mut kept = stored;
            kept.settle();
            assert!(kept.map().is_err(), "settling keeps the error");
            // what a dispatch takes: the error, never an empty map
            let taken = kept.into_map().expect_err(bad);
            assert!(taken.contains("do not read as an object"), "{taken}");
        }
        let good = Attributes::stored("{\"send_event\": false}".into());
        assert_eq!(good.into_map().unwrap()["send_event"], Value::Bool(false));
    }

    fn intent(id: &str, hash: &str, requires: &[&str], undefined: bool) -> Intent {
        let mut attributes = Attrs::new();
        attributes.insert("send_event".into(), Value::Bool(true));
        Intent {
            id: id.into(),
            type_name: "t".into(),
            agent: "a".into(),
            hash: hash.into(),
            attributes: attributes.into(),
            requires: requires.iter().map(|s| s.to_string()).collect(),
            undefined,
        }
    }

    #[test]
    fn merge_new_updated_deleted_blocked() {
        let mut m = Model::default();
        let merged = m.merge(
            1,
            vec![
                intent("a", "1", &[], false),
                intent("b", "1", &["a"], false),
                intent("c", "1", &[], false),
            ],
        );
        assert_eq!(merged.new.len(), 3);
        assert_eq!(m.dirty.len(), 3);
        let now = Utc::now();
        for r in 0..3 {
            m.finish(r, Outcome::Deployed, Change::Created, None, now, now);
        }
        assert!(m.dirty.is_empty());
        // a changes, c goes away, d is new and undefined, e depends on d
        let merged = m.merge(
            2,
            vec![
                intent("a", "2", &[], false),
                intent("b", "1", &["a"], false),
                intent("d", "1", &[], true),
                intent("e", "1", &["d"], false),
            ],
        );
        assert_eq!(merged.updated, vec![m.get("a").unwrap()]);
        assert_eq!(merged.deleted.len(), 1);
        assert_eq!(merged.deleted[0].id, "c");
        let d = m.get("d").unwrap();
        let e = m.get("e").unwrap();
        assert_eq!(m.states[d].blocked, Blocked::Blocked);
        assert_eq!(m.states[e].blocked, Blocked::Blocked);
        assert!(
            m.states[e]
                .blocked_reason
                .as_ref()
                .unwrap()
                .contains("depends on d")
        );
        assert_eq!(
            m.dirty.iter().copied().collect::<Vec<_>>(),
            vec![m.get("a").unwrap()]
        );
        // d becomes defined: both unblock and become dirty
        let merged = m.merge(
            3,
            vec![
                intent("a", "2", &[], false),
                intent("b", "1", &["a"], false),
                intent("d", "2", &[], false),
                intent("e", "1", &["d"], false),
            ],
        );
        assert!(merged.unblocked.contains(&m.get("e").unwrap()));
        assert!(m.dirty.contains(&m.get("d").unwrap()) && m.dirty.contains(&m.get("e").unwrap()));
    }

    #[test]
    fn failures_skips_and_recovery() {
        let mut m = Model::default();
        m.merge(
            1,
            vec![
                intent("a", "1", &[], false),
                intent("b", "1", &["a"], false),
            ],
        );
        let now = Utc::now();
        let fin = m.finish(
            0,
            Outcome::Failed,
            Change::Nochange,
            Some("boom".into()),
            now,
            now,
        );
        assert_eq!(fin.events, vec![1], "events fire on failures too");
        assert_eq!(m.failing_requirement(1), Some(0));
        m.finish(
            1,
            Outcome::SkippedForDependency,
            Change::Nochange,
            None,
            now,
            now,
        );
        assert_eq!(m.states[1].blocked, Blocked::Temporarily);
        assert!(!m.dirty.contains(&1));
        assert_eq!(m.states[0].failure_count, 1);
        let fin = m.finish(0, Outcome::Deployed, Change::Updated, None, now, now);
        assert_eq!(fin.recovered, vec![1]);
        assert!(m.dirty.contains(&1));
        assert!(m.needs_reload(1));
    }
}
