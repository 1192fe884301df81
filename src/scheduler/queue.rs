//! The work queue (SCHEDULER.md §3, §4.2): at most one queued task per identity, per-agent
//! ready queues ordered by (priority, request order), a waiting set of tasks whose direct
//! requirements still have deploy work scheduled or running, and the running set. Tasks
//! carry no intent: the intent is read when a task starts. Pure bookkeeping.

use std::collections::{BTreeSet, HashMap, HashSet};

use uuid::Uuid;

/// Lower runs first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    UserDeploy = 0,
    NewVersion = 1,
    UserRepair = 2,
    Dryrun = 3,
    IntervalDeploy = 4,
    /// retries of failures: their own lane, after new intent
    Retry = 5,
    IntervalRepair = 6,
    /// asking a handler for its resource's facts: last, it changes nothing
    Facts = 7,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskKey {
    Deploy(String),
    Dryrun(Uuid, String),
    /// Ask the handler for the resource's facts (a refresh).
    Facts(String),
}

impl TaskKey {
    pub fn resource(&self) -> &str {
        match self {
            TaskKey::Deploy(r) | TaskKey::Dryrun(_, r) | TaskKey::Facts(r) => r,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Queued {
    pub agent: String,
    pub priority: Priority,
    pub seq: u64,
    pub reason: String,
}

#[derive(Clone, Debug)]
pub struct Running {
    pub agent: String,
    pub priority: Priority,
    pub reason: String,
    /// The intent changed (or the resource went away) while it ran.
    pub stale: bool,
    /// Run again after this one (an event arrived, or it went stale).
    pub follow_up: Option<(Priority, String)>,
}

#[derive(Default)]
pub struct Queue {
    seq: u64,
    queued: HashMap<TaskKey, Queued>,
    /// how many of `queued` each agent has: status asks for it on every call, and counting
    /// 100,000 queued tasks each time cost the scheduler most of a repair
    queued_by_agent: HashMap<String, usize>,
    ready: HashMap<String, BTreeSet<(Priority, u64, TaskKey)>>,
    /// waiting task -> requirements (resource ids) it waits for
    waiting: HashMap<TaskKey, HashSet<String>>,
    /// requirement -> tasks waiting for it
    waiters: HashMap<String, HashSet<TaskKey>>,
    pub running: HashMap<TaskKey, Running>,
}

impl Queue {
    /// Has this resource deploy work queued, waiting or running?
    pub fn deploy_pending(&self, rid: &str) -> bool {
        let k = TaskKey::Deploy(rid.to_string());
        self.queued.contains_key(&k) || self.running.contains_key(&k)
    }

    pub fn is_queued(&self, key: &TaskKey) -> bool {
        self.queued.contains_key(key)
    }

    pub fn queued_count(&self, agent: &str) -> usize {
        self.queued_by_agent.get(agent).copied().unwrap_or(0)
    }

    pub fn running_count(&self, agent: &str) -> usize {
        self.running.values().filter(|r| r.agent == agent).count()
    }

    pub fn len(&self) -> usize {
        self.queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    pub fn agents_with_ready(&self) -> Vec<String> {
        self.ready
            .iter()
            .filter(|(_, s)| !s.is_empty())
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// Request a task. `requires`: the resource's direct requirements; `dependents`: its
    /// direct dependents (queued ones are deferred behind it). `force`: run again even if it
    /// is running now (events).
    #[allow(clippy::too_many_arguments)] // one call per trigger kind; a struct would only rename them
    pub fn schedule(
        &mut self,
        key: TaskKey,
        agent: &str,
        priority: Priority,
        reason: &str,
        requires: &[String],
        dependents: &[String],
        force: bool,
    ) {
        if let Some(run) = self.running.get_mut(&key) {
            if force || run.stale {
                let better = run.follow_up.as_ref().is_none_or(|(p, _)| priority < *p);
                if better {
                    run.follow_up = Some((priority, reason.to_string()));
                }
                return;
            }
            if priority < run.priority {
                run.priority = priority;
            }
            // a run of the latest intent is in progress: that is the requested deploy
            if !self.queued.contains_key(&key) {
                return;
            }
        }
        if let Some(q) = self.queued.get_mut(&key) {
            if priority < q.priority {
                let old = (q.priority, q.seq, key.clone());
                self.seq += 1;
                q.priority = priority;
                q.seq = self.seq;
                q.reason = reason.to_string();
                let new = (q.priority, q.seq, key.clone());
                if let Some(set) = self.ready.get_mut(&q.agent)
                    && set.remove(&old)
                {
                    set.insert(new);
                }
            }
            return;
        }
        self.seq += 1;
        let is_deploy = matches!(key, TaskKey::Deploy(_));
        let blocked_on: HashSet<String> = if is_deploy {
            requires
                .iter()
                .filter(|q| self.deploy_pending(q))
                .cloned()
                .collect()
        } else {
            HashSet::new()
        };
        match self.queued_by_agent.get_mut(agent) {
            Some(n) => *n += 1,
            None => {
                self.queued_by_agent.insert(agent.to_string(), 1);
            }
        }
        self.queued.insert(
            key.clone(),
            Queued {
                agent: agent.to_string(),
                priority,
                seq: self.seq,
                reason: reason.to_string(),
            },
        );
        if blocked_on.is_empty() {
            self.ready.entry(agent.to_string()).or_default().insert((
                priority,
                self.seq,
                key.clone(),
            ));
        } else {
            for q in &blocked_on {
                self.waiters
                    .entry(q.clone())
                    .or_default()
                    .insert(key.clone());
            }
            self.waiting.insert(key.clone(), blocked_on);
        }
        if is_deploy {
            // dependents already waiting in a ready queue now wait for this one
            let me = key.resource().to_string();
            for d in dependents {
                let dk = TaskKey::Deploy(d.clone());
                if self.waiting.contains_key(&dk) {
                    if let Some(set) = self.waiting.get_mut(&dk) {
                        set.insert(me.clone());
                    }
                    self.waiters.entry(me.clone()).or_default().insert(dk);
                    continue;
                }
                let Some(q) = self.queued.get(&dk) else {
                    continue;
                };
                let entry = (q.priority, q.seq, dk.clone());
                if let Some(set) = self.ready.get_mut(&q.agent)
                    && set.remove(&entry)
                {
                    self.waiting.insert(dk.clone(), [me.clone()].into());
                    self.waiters.entry(me.clone()).or_default().insert(dk);
                }
            }
        }
    }

    /// The best ready task of an agent, now running.
    pub fn pop(&mut self, agent: &str) -> Option<(TaskKey, Running)> {
        let set = self.ready.get_mut(agent)?;
        let first = set.iter().next().cloned()?;
        set.remove(&first);
        let key = first.2;
        let q = self.queued.remove(&key).expect("ready task is queued");
        self.count_unqueued(&q.agent);
        let run = Running {
            agent: q.agent,
            priority: q.priority,
            reason: q.reason,
            stale: false,
            follow_up: None,
        };
        self.running.insert(key.clone(), run.clone());
        Some((key, run))
    }

    /// A running task ended. Returns it (with a follow-up request, if any).
    pub fn finish(&mut self, key: &TaskKey) -> Option<Running> {
        let run = self.running.remove(key)?;
        if matches!(key, TaskKey::Deploy(_))
            && !self.queued.contains_key(key)
            && run.follow_up.is_none()
        {
            self.release_waiters(key.resource());
        }
        Some(run)
    }

    /// A running task that never started (its executor died first): no longer running,
    /// and what waits for it still waits, for the caller to queue it again.
    pub fn unrun(&mut self, key: &TaskKey) -> Option<Running> {
        self.running.remove(key)
    }

    fn release_waiters(&mut self, rid: &str) {
        let Some(ws) = self.waiters.remove(rid) else {
            return;
        };
        for w in ws {
            let empty = match self.waiting.get_mut(&w) {
                Some(set) => {
                    set.remove(rid);
                    set.is_empty()
                }
                None => false,
            };
            if empty {
                self.waiting.remove(&w);
                if let Some(q) = self.queued.get(&w) {
                    self.ready.entry(q.agent.clone()).or_default().insert((
                        q.priority,
                        q.seq,
                        w.clone(),
                    ));
                }
            }
        }
    }

    fn count_unqueued(&mut self, agent: &str) {
        if let Some(n) = self.queued_by_agent.get_mut(agent) {
            *n -= 1;
            if *n == 0 {
                self.queued_by_agent.remove(agent);
            }
        }
    }

    /// Drop queued work for a resource (deleted, blocked); dry-runs stay.
    pub fn drop_deploy(&mut self, rid: &str) {
        let key = TaskKey::Deploy(rid.to_string());
        if let Some(q) = self.queued.remove(&key) {
            self.count_unqueued(&q.agent);
            if let Some(set) = self.ready.get_mut(&q.agent) {
                set.remove(&(q.priority, q.seq, key.clone()));
            }
            if let Some(on) = self.waiting.remove(&key) {
                for r in on {
                    if let Some(ws) = self.waiters.get_mut(&r) {
                        ws.remove(&key);
                    }
                }
            }
        }
        if !self.running.contains_key(&key) {
            self.release_waiters(rid);
        }
    }

    /// Queued tasks at or below `priority` (e.g. a repair sweep) are dropped.
    pub fn drop_priority(&mut self, priority: Priority) -> Vec<String> {
        let keys: Vec<TaskKey> = self
            .queued
            .iter()
            .filter(|(k, q)| q.priority == priority && matches!(k, TaskKey::Deploy(_)))
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .map(|k| {
                self.drop_deploy(k.resource());
                k.resource().to_string()
            })
            .collect()
    }

    /// A running task is not to run again when it ends (what asked for it is void).
    pub fn forget_follow_up(&mut self, key: &TaskKey) {
        if let Some(r) = self.running.get_mut(key) {
            r.follow_up = None;
        }
    }

    pub fn mark_stale(&mut self, rid: &str) {
        if let Some(r) = self.running.get_mut(&TaskKey::Deploy(rid.to_string())) {
            r.stale = true;
        }
    }

    pub fn queued_reason(&self, key: &TaskKey) -> Option<&Queued> {
        self.queued.get(key)
    }

    /// Is a deploy of `priority` or more urgent queued (ready or waiting)? It looks at the
    /// queued tasks only (a pre-empted repair's were dropped), and stops at the first one.
    pub fn has_queued_deploy_of(&self, priority: Priority) -> bool {
        self.queued
            .iter()
            .any(|(k, q)| matches!(k, TaskKey::Deploy(_)) && q.priority <= priority)
    }

    /// Is this queued task waiting for requirements (and which)?
    pub fn waiting_on(&self, key: &TaskKey) -> Option<&HashSet<String>> {
        self.waiting.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> TaskKey {
        TaskKey::Deploy(s.into())
    }

    /// What a pre-empted repair waits for: queued deploys of new intent, ready or waiting
    /// for a requirement; not those that run, not a repair, not a facts refresh.
    #[test]
    fn new_intent_is_found_among_the_queued_deploys() {
        let mut q = Queue::default();
        let urgent = |q: &Queue| q.has_queued_deploy_of(Priority::NewVersion);
        q.schedule(
            d("r"),
            "x",
            Priority::IntervalRepair,
            "repair",
            &[],
            &[],
            false,
        );
        q.schedule(
            TaskKey::Facts("f".into()),
            "x",
            Priority::Facts,
            "facts",
            &[],
            &[],
            false,
        );
        assert!(!urgent(&q));
        q.schedule(d("a"), "x", Priority::NewVersion, "new", &[], &[], false);
        q.schedule(
            d("b"),
            "x",
            Priority::NewVersion,
            "new",
            &["a".into()],
            &[],
            false,
        );
        assert!(urgent(&q));
        // a runs: b still waits for it, queued
        let (k, _) = q.pop("x").unwrap();
        assert_eq!(k, d("a"));
        assert!(urgent(&q), "b waits, queued");
        q.finish(&d("a"));
        let (k, _) = q.pop("x").unwrap();
        assert_eq!(k, d("b"));
        assert!(!urgent(&q), "b runs: nothing of new intent is queued");
        // a repair raised to new intent counts
        q.schedule(d("r"), "x", Priority::NewVersion, "new", &[], &[], false);
        assert!(urgent(&q));
    }

    #[test]
    fn ordering_by_direct_requirements() {
        let mut q = Queue::default();
        q.schedule(
            d("a"),
            "x",
            Priority::NewVersion,
            "new",
            &[],
            &["b".into()],
            false,
        );
        q.schedule(
            d("b"),
            "y",
            Priority::NewVersion,
            "new",
            &["a".into()],
            &[],
            false,
        );
        assert!(q.pop("y").is_none(), "b waits for a (other agent)");
        let (k, _) = q.pop("x").unwrap();
        assert_eq!(k, d("a"));
        q.finish(&k);
        assert_eq!(q.pop("y").unwrap().0, d("b"));
    }

    #[test]
    fn dependents_are_deferred_and_priorities_bump() {
        let mut q = Queue::default();
        q.schedule(
            d("b"),
            "x",
            Priority::IntervalRepair,
            "repair",
            &["a".into()],
            &[],
            false,
        );
        q.schedule(
            d("c"),
            "x",
            Priority::IntervalRepair,
            "repair",
            &[],
            &[],
            false,
        );
        // a scheduled later: b (ready) must now wait for it
        q.schedule(
            d("a"),
            "x",
            Priority::NewVersion,
            "new",
            &[],
            &["b".into()],
            false,
        );
        assert_eq!(q.pop("x").unwrap().0, d("a"));
        assert_eq!(q.pop("x").unwrap().0, d("c"), "b waits for a");
        q.finish(&d("a"));
        q.schedule(
            d("b"),
            "x",
            Priority::UserDeploy,
            "user",
            &["a".into()],
            &[],
            false,
        );
        assert_eq!(
            q.queued_reason(&d("b")).unwrap().priority,
            Priority::UserDeploy
        );
        assert_eq!(q.pop("x").unwrap().0, d("b"));
    }

    #[test]
    fn queued_counts_follow_the_queue() {
        let mut q = Queue::default();
        let brute = |q: &Queue, agent: &str| q.queued.values().filter(|x| x.agent == agent).count();
        for i in 0..20 {
            let agent = if i % 3 == 0 { "x" } else { "y" };
            let requires = if i > 0 && i % 4 == 0 {
                vec![format!("r{}", i - 1)]
            } else {
                vec![]
            };
            q.schedule(
                d(&format!("r{i}")),
                agent,
                Priority::NewVersion,
                "new",
                &requires,
                &[],
                false,
            );
        }
        // a second request for a queued task is not a second task
        q.schedule(d("r1"), "y", Priority::UserDeploy, "user", &[], &[], false);
        let (k, _) = q.pop("x").unwrap();
        q.finish(&k);
        q.drop_deploy("r2");
        q.drop_deploy("r2");
        q.drop_priority(Priority::NewVersion);
        q.schedule(d("r5"), "x", Priority::NewVersion, "new", &[], &[], false);
        for agent in ["x", "y", "z"] {
            assert_eq!(q.queued_count(agent), brute(&q, agent), "agent {agent}");
        }
        assert_eq!(q.queued_count("x"), 1);
        assert_eq!(q.queued_count("y"), 1, "r1 was bumped to a user deploy");
    }

    #[test]
    fn running_tasks_get_follow_ups_only_when_forced() {
        let mut q = Queue::default();
        q.schedule(d("a"), "x", Priority::NewVersion, "new", &[], &[], false);
        let (k, _) = q.pop("x").unwrap();
        q.schedule(
            d("a"),
            "x",
            Priority::IntervalRepair,
            "repair",
            &[],
            &[],
            false,
        );
        assert!(q.is_empty());
        q.schedule(d("a"), "x", Priority::NewVersion, "event", &[], &[], true);
        let run = q.finish(&k).unwrap();
        assert_eq!(run.follow_up.unwrap().1, "event");
    }
}
