//! The scheduler of one environment: a task that owns the model, the work queue, the timers
//! and the executor pool, and reacts to releases, user requests, executor results and time.
//! State is rebuilt from PostgreSQL when it starts; every change it makes is written back in
//! batches by a writer task that retries until the database takes them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

mod control;
mod persist;

use super::code::CodeCache;
use super::executors::{Pool, PoolEvent, ProcId};
use super::model::{Blocked, Compliance, Intent, Model};
use super::queue::{Priority, Queue, TaskKey};
use super::timers::{TimerKind, Timers, jittered};
use crate::executor::protocol::{
    ActionKind, ExternalHandler, Outcome, Reply, WorkItem, WorkResult,
};
use crate::model::settings::{EnvSettings, Interval};
use crate::model::{HandlerCode, Resource, ResourceId};
use crate::store::deploy::Batch;
use crate::store::{self, actions::ActionRecord};
use persist::{action_record, intent_of, state_from_row, synthetic, writer};

/// What the rest of the server asks of a scheduler.
pub enum Control {
    Released(i32),
    Settings,
    /// deploy (dirty ∩ filter) or repair (all unblocked ∩ filter); answers the number scheduled
    Trigger {
        repair: bool,
        agent: Option<String>,
        resource: Option<String>,
        ack: oneshot::Sender<usize>,
    },
    Dryrun {
        id: Uuid,
        version: i32,
    },
    /// answers once no new action of the agent can start
    Pause {
        agent: String,
        paused: bool,
        ack: oneshot::Sender<()>,
    },
    Halt {
        halted: bool,
        ack: oneshot::Sender<()>,
    },
    Status(oneshot::Sender<Status>),
    Stop,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct AgentStatus {
    pub name: String,
    pub paused: bool,
    pub queued: usize,
    pub running: usize,
    pub executors: Vec<u32>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    pub version: Option<i32>,
    pub halted: bool,
    pub agents: Vec<AgentStatus>,
    pub dirty: usize,
    pub queued: usize,
    pub running: usize,
}

struct RunInfo {
    proc: ProcId,
    action_id: Uuid,
    started: DateTime<Utc>,
    deadline: tokio::time::Instant,
    version: i32,
    kind: ActionKind,
    /// what the action log calls it: deploy, repair, delete or dryrun
    label: &'static str,
}

struct DryrunCtx {
    version: i32,
    intents: HashMap<String, Intent>,
    handlers: BTreeMap<String, HandlerCode>,
}

pub struct EnvScheduler {
    env: Uuid,
    pool: PgPool,
    settings: EnvSettings,
    model: Model,
    queue: Queue,
    timers: Timers,
    executors: Pool,
    running: HashMap<TaskKey, RunInfo>,
    paused: HashSet<String>,
    halted: bool,
    batch: Batch,
    dirty_states: HashSet<String>,
    writer: mpsc::UnboundedSender<Batch>,
    dryruns: HashMap<Uuid, DryrunCtx>,
    /// removed resources to delete on their target (opt-in), by id, with the handler code
    /// of the version they were in
    tombstones: HashMap<String, (Intent, Option<HandlerCode>)>,
    /// resource type -> module handler code, for the model's version
    handlers: BTreeMap<String, HandlerCode>,
    code: CodeCache,
    next_deploy_sweep: Option<DateTime<Utc>>,
    next_repair_sweep: Option<DateTime<Utc>>,
    /// a repair sweep was pre-empted by new intent: run it again once that deployed
    repair_pending: bool,
}

impl EnvScheduler {
    /// Rebuild from the database and run until stopped.
    pub async fn run(
        env: Uuid,
        pool: PgPool,
        executor_bin: PathBuf,
        code_dir: PathBuf,
        mut control: mpsc::UnboundedReceiver<Control>,
    ) {
        let (exec_pool, mut pool_rx) = Pool::new(executor_bin, 64);
        let (wtx, wrx) = mpsc::unbounded_channel();
        tokio::spawn(writer(pool.clone(), env, wrx));
        let mut s = EnvScheduler {
            env,
            pool,
            settings: EnvSettings::default(),
            model: Model::default(),
            queue: Queue::default(),
            timers: Timers::default(),
            executors: exec_pool,
            running: HashMap::new(),
            paused: HashSet::new(),
            halted: false,
            batch: Batch::default(),
            dirty_states: HashSet::new(),
            writer: wtx,
            dryruns: HashMap::new(),
            tombstones: HashMap::new(),
            handlers: BTreeMap::new(),
            code: CodeCache::new(code_dir),
            next_deploy_sweep: None,
            next_repair_sweep: None,
            repair_pending: false,
        };
        // the database may be away at start: keep trying
        let mut delay = Duration::from_millis(200);
        loop {
            match s.restore().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "scheduler start failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        let mut flush_tick = tokio::time::interval(Duration::from_millis(25));
        flush_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reap_tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            let wake = s.next_wake();
            tokio::select! {
                c = control.recv() => match c {
                    None | Some(Control::Stop) => break,
                    Some(c) => s.on_control(c).await,
                },
                Some(ev) = pool_rx.recv() => s.on_pool_event(ev),
                _ = tokio::time::sleep_until(wake) => {},
                _ = flush_tick.tick() => {},
                _ = reap_tick.tick() => s.executors.reap(Duration::from_secs(60)),
            }
            s.on_time(Utc::now());
            s.dispatch().await;
            s.flush();
        }
        s.executors.shutdown();
        s.flush();
    }

    fn next_wake(&mut self) -> tokio::time::Instant {
        let now_i = tokio::time::Instant::now();
        let now = Utc::now();
        let mut wake = now_i + Duration::from_secs(60);
        let mut consider = |t: Option<DateTime<Utc>>| {
            if let Some(t) = t {
                let d = (t - now).to_std().unwrap_or(Duration::ZERO);
                wake = wake.min(now_i + d);
            }
        };
        consider(self.timers.next_due());
        consider(self.next_deploy_sweep);
        consider(self.next_repair_sweep);
        for r in self.running.values() {
            wake = wake.min(r.deadline);
        }
        wake
    }

    async fn restore(&mut self) -> Result<(), store::StoreError> {
        let env = store::environments::get_environment(&self.pool, self.env).await?;
        self.settings = env.settings.clone();
        self.halted = env.halted;
        self.paused = store::deploy::agents(&self.pool, self.env)
            .await?
            .into_iter()
            .filter(|a| a.paused)
            .map(|a| a.name)
            .collect();
        store::deploy::clear_leases(&self.pool, self.env).await?;
        let processed = store::deploy::load_progress(&self.pool, self.env).await?;
        if let Some(v) = processed {
            let resources = match store::versions::resources(&self.pool, self.env, v).await {
                Ok(r) => r,
                Err(store::StoreError::NotFound(_)) => Vec::new(),
                Err(e) => return Err(e),
            };
            let rows = store::deploy::load_states(&self.pool, self.env).await?;
            let states = rows
                .iter()
                .map(|(k, r)| (k.clone(), state_from_row(r)))
                .collect();
            self.model = Model::restore(v, resources.iter().map(intent_of).collect(), states);
            self.handlers = store::code::handlers_of(&self.pool, self.env, v).await?;
        }
        self.arm_sweeps(Utc::now());
        let active = store::versions::active(&self.pool, self.env).await?;
        if let Some(a) = active
            && Some(a) != processed
        {
            self.merge_version(a).await?;
        }
        // what was not done when we stopped
        let dirty: Vec<usize> = self.model.dirty.iter().copied().collect();
        for r in dirty {
            self.schedule(r, Priority::IntervalDeploy, "the scheduler started", false);
        }
        let now = Utc::now();
        for r in 0..self.model.len() {
            self.arm_timer(r, now);
        }
        // dry-runs that were under way when we stopped run again
        for d in store::deploy::dryruns(&self.pool, self.env).await? {
            if d.finished_at.is_none() {
                self.start_dryrun(d.id, d.version).await;
            }
        }
        tracing::info!(environment = %self.env, version = ?self.model.version, resources = self.model.len(), "scheduler started");
        Ok(())
    }

    fn arm_sweeps(&mut self, now: DateTime<Utc>) {
        self.next_deploy_sweep = match &self.settings.deploy_interval {
            Interval::Disabled => None,
            Interval::Seconds(n) => Some(now + chrono::Duration::seconds(*n as i64)),
            Interval::Cron(c) => c.next_after(now),
        };
        self.next_repair_sweep = match &self.settings.repair_interval {
            Interval::Cron(c) => c.next_after(now),
            // seconds: per-resource timers
            _ => None,
        };
    }

    /// Per-resource timers: a repair for good resources (seconds mode), a retry with backoff
    /// for failed ones.
    fn arm_timer(&mut self, r: usize, now: DateTime<Utc>) {
        let id = self.model.intents[r].id.clone();
        let s = &self.model.states[r];
        if s.blocked == Blocked::Blocked || self.queue.deploy_pending(&id) {
            self.timers.cancel(&id);
            return;
        }
        if s.compliance == Compliance::NonCompliant && s.blocked == Blocked::NotBlocked {
            // a persisted retry time (from before a restart) is kept; a finished attempt
            // clears it, so every failure moves the next retry one step up the schedule
            let at = match s.next_retry {
                Some(at) => at,
                None => {
                    let failures = s.failure_count.max(1);
                    let at = s.last_deployed.unwrap_or(now)
                        + jittered(&self.settings.retry_backoff, failures);
                    tracing::info!(
                        environment = %self.env, resource = %id, failures,
                        retry_in_s = (at - now).num_milliseconds() as f64 / 1000.0,
                        "not deployed; retry scheduled"
                    );
                    at
                }
            };
            self.model.states[r].next_retry = Some(at);
            self.timers.set(&id, at, TimerKind::Retry);
            return;
        }
        if let Interval::Seconds(n) = self.settings.repair_interval
            && (s.compliance == Compliance::Compliant || s.blocked == Blocked::Temporarily)
        {
            let at = s.last_deployed.unwrap_or(now) + chrono::Duration::seconds(n as i64);
            self.timers.set(&id, at, TimerKind::Repair);
            return;
        }
        self.timers.cancel(&id);
    }

    /// The intents of `version`. Attributes the model already holds (same hash) are moved
    /// over instead of being read again: a release that changes one resource of 10,000 reads
    /// one attribute set.
    async fn load_intents(&mut self, version: i32) -> Result<Vec<Intent>, store::StoreError> {
        let rows = store::versions::resource_digests(&self.pool, self.env, version).await?;
        fn held(m: &Model, r: &store::versions::ResourceDigestRow) -> Option<usize> {
            m.get(&r.resource_id)
                .filter(|&i| m.intents[i].hash == r.hash)
        }
        let mut missing: Vec<String> = rows
            .iter()
            .filter(|r| held(&self.model, r).is_none())
            .map(|r| r.hash.clone())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        let blobs = store::versions::attributes_by_hash(&self.pool, &missing).await?;
        let mut intents = Vec::with_capacity(rows.len());
        for r in rows {
            let attributes = match held(&self.model, &r) {
                Some(i) => std::mem::take(&mut self.model.intents[i].attributes),
                None => blobs
                    .get(&r.hash)
                    .and_then(|v| v.as_object().cloned())
                    .unwrap_or_default(),
            };
            intents.push(Intent {
                id: r.resource_id,
                type_name: r.resource_type,
                agent: r.agent,
                hash: r.hash,
                attributes,
                requires: r.requires,
                undefined: r.undefined,
            });
        }
        Ok(intents)
    }

    async fn merge_version(&mut self, version: i32) -> Result<(), store::StoreError> {
        if self.model.version.is_some_and(|v| v >= version) {
            return Ok(());
        }
        let intents = self.load_intents(version).await?;
        let new_handlers = store::code::handlers_of(&self.pool, self.env, version).await?;
        let old_handlers = std::mem::replace(&mut self.handlers, new_handlers);
        let old_version = self.model.version;
        let merged = self.model.merge(version, intents);
        let agents: HashSet<String> = self.model.intents.iter().map(|i| i.agent.clone()).collect();
        let _ = store::deploy::ensure_agents(
            &self.pool,
            self.env,
            &agents.into_iter().collect::<Vec<_>>(),
        )
        .await;
        // removed resources: orphans, or deleted on their target when the environment says so
        for gone in &merged.deleted {
            self.queue.drop_deploy(&gone.id);
            self.queue.mark_stale(&gone.id);
            self.timers.cancel(&gone.id);
            self.batch
                .orphaned
                .push((gone.id.clone(), old_version.unwrap_or(version)));
            if self.settings.delete_removed_resources {
                let mut t = gone.clone();
                t.attributes
                    .insert("purged".into(), serde_json::Value::Bool(true));
                t.requires.clear();
                let code = old_handlers.get(&t.type_name).cloned();
                self.tombstones.insert(t.id.clone(), (t.clone(), code));
                self.queue.schedule(
                    TaskKey::Deploy(t.id.clone()),
                    &t.agent,
                    Priority::NewVersion,
                    "removed from the model: deleting it on its target",
                    &[],
                    &[],
                    false,
                );
            }
        }
        for &r in &merged.newly_blocked {
            let id = self.model.intents[r].id.clone();
            self.queue.drop_deploy(&id);
            self.timers.cancel(&id);
        }
        for &r in &merged.updated {
            let id = self.model.intents[r].id.clone();
            self.queue.mark_stale(&id);
        }
        // new intent pre-empts a repair sweep, which starts over afterwards
        let dropped = self.queue.drop_priority(Priority::IntervalRepair);
        if !dropped.is_empty() {
            self.repair_pending = true;
        }
        let affected: Vec<usize> = merged
            .new
            .iter()
            .chain(merged.updated.iter())
            .chain(merged.unblocked.iter())
            .copied()
            .collect();
        for &r in &affected {
            self.schedule(r, Priority::NewVersion, "a new version was released", false);
        }
        // persist what the merge changed; untouched resources keep their row (its
        // intent_version is then the version that last changed their intent), so a release
        // that changes one resource of 10,000 writes a handful of rows, not 10,000
        let touched: Vec<usize> = affected
            .iter()
            .chain(merged.newly_blocked.iter())
            .copied()
            .chain(
                (0..self.model.len())
                    .filter(|&r| self.model.states[r].blocked != Blocked::NotBlocked),
            )
            .collect();
        for r in touched {
            self.mark_state(r);
        }
        self.batch.progress = Some(version);
        tracing::info!(
            environment = %self.env, version, new = merged.new.len(), updated = merged.updated.len(),
            deleted = merged.deleted.len(), "version merged"
        );
        Ok(())
    }

    /// Queue a deploy of resource `r`.
    fn schedule(&mut self, r: usize, priority: Priority, reason: &str, force: bool) {
        if self.model.states[r].blocked == Blocked::Blocked {
            return;
        }
        let id = self.model.intents[r].id.clone();
        let requires: Vec<String> = self.model.requires[r]
            .iter()
            .map(|&q| self.model.intents[q].id.clone())
            .collect();
        let dependents: Vec<String> = self.model.provides[r]
            .iter()
            .map(|&d| self.model.intents[d].id.clone())
            .collect();
        let agent = self.model.intents[r].agent.clone();
        self.queue.schedule(
            TaskKey::Deploy(id.clone()),
            &agent,
            priority,
            reason,
            &requires,
            &dependents,
            force,
        );
        self.timers.cancel(&id);
    }

    fn on_time(&mut self, now: DateTime<Utc>) {
        for (id, kind) in self.timers.pop_due(now) {
            let Some(r) = self.model.get(&id) else {
                continue;
            };
            match kind {
                TimerKind::Repair => {
                    self.schedule(r, Priority::IntervalRepair, "periodic repair", false)
                }
                TimerKind::Retry => {
                    let n = self.model.states[r].failure_count;
                    self.schedule(
                        r,
                        Priority::Retry,
                        &format!("retry after {n} failed attempt(s)"),
                        false,
                    )
                }
            }
        }
        if self.next_deploy_sweep.is_some_and(|t| t <= now) {
            let dirty: Vec<usize> = self.model.dirty.iter().copied().collect();
            for r in dirty {
                self.schedule(r, Priority::IntervalDeploy, "periodic deploy", false);
            }
            self.arm_sweeps(now);
        }
        if self.next_repair_sweep.is_some_and(|t| t <= now) {
            self.repair_sweep();
            self.arm_sweeps(now);
        }
        // a pre-empted repair sweep starts over once the new intent is out
        if self.repair_pending && !self.queue_has_new_intent() {
            self.repair_pending = false;
            self.repair_sweep();
        }
        // hung handlers: kill their executor, report, go on
        let late: Vec<TaskKey> = self
            .running
            .iter()
            .filter(|(_, r)| r.deadline <= tokio::time::Instant::now())
            .map(|(k, _)| k.clone())
            .collect();
        for key in late {
            if let Some(info) = self.running.get(&key) {
                let proc = info.proc;
                let started = info.started;
                let action_id = info.action_id;
                self.executors.kill(proc);
                let msg = format!(
                    "the handler did not finish within {} s: its executor was killed",
                    self.settings.handler_timeout
                );
                self.finish(key, synthetic(action_id, Outcome::TimedOut, &msg, started));
            }
        }
    }

    fn queue_has_new_intent(&self) -> bool {
        self.running.keys().any(|k| matches!(k, TaskKey::Deploy(_)))
            && self
                .queue
                .running
                .values()
                .any(|r| r.priority <= Priority::NewVersion)
            || !self.queue.is_empty()
                && (0..self.model.len()).any(|r| {
                    self.queue
                        .queued_reason(&TaskKey::Deploy(self.model.intents[r].id.clone()))
                        .is_some_and(|q| q.priority <= Priority::NewVersion)
                })
    }

    fn repair_sweep(&mut self) {
        for r in 0..self.model.len() {
            if self.model.states[r].blocked != Blocked::Blocked {
                self.schedule(r, Priority::IntervalRepair, "periodic repair", false);
            }
        }
    }

    async fn dispatch(&mut self) {
        if self.halted {
            return;
        }
        for agent in self.queue.agents_with_ready() {
            if self.paused.contains(&agent) {
                continue;
            }
            while self.queue.running_count(&agent) < self.settings.agent_parallelism as usize {
                let Some((key, run)) = self.queue.pop(&agent) else {
                    break;
                };
                self.start(key, &agent, run.reason, run.priority).await;
            }
        }
    }

    async fn start(&mut self, key: TaskKey, agent: &str, reason: String, priority: Priority) {
        let now = Utc::now();
        let label = match &key {
            TaskKey::Dryrun(..) => "dryrun",
            TaskKey::Deploy(id) if self.tombstones.contains_key(id) => "delete",
            _ if matches!(priority, Priority::UserRepair | Priority::IntervalRepair) => "repair",
            _ => "deploy",
        };
        let (kind, intent, version, r, code) = match &key {
            TaskKey::Deploy(id) => match (self.model.get(id), self.tombstones.get(id)) {
                (Some(r), _) => {
                    let intent = self.model.intents[r].clone();
                    let code = self.handlers.get(&intent.type_name).cloned();
                    (
                        ActionKind::Deploy,
                        intent,
                        self.model.version.unwrap_or(0),
                        Some(r),
                        code,
                    )
                }
                (None, Some((t, code))) => (
                    ActionKind::Deploy,
                    t.clone(),
                    self.model.version.unwrap_or(0),
                    None,
                    code.clone(),
                ),
                (None, None) => {
                    self.queue.finish(&key);
                    return;
                }
            },
            TaskKey::Dryrun(id, rid) => match self.dryruns.get(id).and_then(|d| {
                d.intents
                    .get(rid)
                    .map(|i| (d.version, i.clone(), d.handlers.get(&i.type_name).cloned()))
            }) {
                Some((v, i, code)) => (ActionKind::Dryrun, i, v, None, code),
                None => {
                    self.queue.finish(&key);
                    return;
                }
            },
        };
        let action_id = Uuid::new_v4();
        if let (ActionKind::Deploy, Some(r)) = (kind, r) {
            if self.model.states[r].blocked == Blocked::Blocked {
                self.queue.finish(&key);
                return;
            }
            // dependency failure: skip, without bothering an executor
            if let Some(q) = self.model.failing_requirement(r) {
                let qi = &self.model.intents[q];
                let msg = format!(
                    "skipped: requirement {} is not deployed ({})",
                    qi.id,
                    self.model.states[q]
                        .last_result
                        .map(|o| o.as_str())
                        .unwrap_or("not deployed yet")
                );
                self.model.states[r].blocked_reason = Some(msg.clone());
                self.finish_at_once(
                    key,
                    action_id,
                    version,
                    (kind, label),
                    Outcome::SkippedForDependency,
                    &msg,
                );
                return;
            }
        }
        let reload = r.is_some_and(|r| self.model.needs_reload(r));
        // module handler code: on disk for the executor, as this version has it
        let handler = match &code {
            None => None,
            Some(c) => match self.code.ensure(&self.pool, c).await {
                Ok(dir) => Some(ExternalHandler {
                    dir,
                    entry: c.entry.clone(),
                    digest: c.digest.clone(),
                }),
                Err(e) => {
                    let msg = format!(
                        "the handler code of module {} is not available: {e}",
                        c.module
                    );
                    tracing::warn!(environment = %self.env, resource = %intent.id, "{msg}");
                    self.finish_at_once(
                        key,
                        action_id,
                        version,
                        (kind, label),
                        Outcome::Unavailable,
                        &msg,
                    );
                    return;
                }
            },
        };
        let item = WorkItem {
            action_id,
            kind,
            resource: Resource {
                id: ResourceId(intent.id.clone()),
                type_name: intent.type_name.clone(),
                agent: intent.agent.clone(),
                attributes: intent.attributes.clone(),
                requires: intent
                    .requires
                    .iter()
                    .map(|q| ResourceId(q.clone()))
                    .collect(),
            },
            version,
            reload,
            handler,
            timeout: Some(self.settings.handler_timeout),
        };
        let proc = match self.executors.acquire(agent) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(environment = %self.env, error = %e, "no executor");
                self.finish_at_once(
                    key,
                    action_id,
                    version,
                    (kind, label),
                    Outcome::Unavailable,
                    &format!("no executor: {e}"),
                );
                return;
            }
        };
        let deadline =
            tokio::time::Instant::now() + Duration::from_secs(self.settings.handler_timeout);
        self.running.insert(
            key.clone(),
            RunInfo {
                proc,
                action_id,
                started: now,
                deadline,
                version,
                kind,
                label,
            },
        );
        if kind == ActionKind::Deploy {
            self.batch.actions.push(ActionRecord {
                id: action_id,
                environment_id: self.env,
                version,
                resource_id: intent.id.clone(),
                action: label.into(),
                started_at: now,
                finished_at: None,
                status: "deploying".into(),
                change: "nochange".into(),
                changes: serde_json::json!({}),
                messages: serde_json::json!([{
                    "level": "debug", "message": format!("{label} started on agent {agent} because {reason}"),
                    "fields": {"reason": reason}, "at": now
                }]),
            });
            if let Some(r) = r {
                self.mark_state(r);
            }
        }
        if let Err(e) = self.executors.send(proc, item).await {
            let res = synthetic(
                action_id,
                Outcome::Unavailable,
                &format!("executor failed: {e}"),
                now,
            );
            self.finish(key, res);
        }
    }

    /// End an action that never reached an executor (skipped for a dependency, no code, no
    /// executor): recorded like any other.
    fn finish_at_once(
        &mut self,
        key: TaskKey,
        action_id: Uuid,
        version: i32,
        (kind, label): (ActionKind, &'static str),
        outcome: Outcome,
        message: &str,
    ) {
        let now = Utc::now();
        let res = synthetic(action_id, outcome, message, now);
        self.running.insert(
            key.clone(),
            RunInfo {
                proc: 0,
                action_id,
                started: now,
                deadline: tokio::time::Instant::now(),
                version,
                kind,
                label,
            },
        );
        self.finish(key, res);
    }

    fn on_pool_event(&mut self, ev: PoolEvent) {
        match ev {
            PoolEvent::Reply(proc, Reply::Result(mut res)) => {
                self.executors.release(proc);
                // the protocol boundary: what a handler printed must be storable
                res.sanitize();
                let key = self
                    .running
                    .iter()
                    .find(|(_, r)| r.action_id == res.action_id && r.proc == proc)
                    .map(|(k, _)| k.clone());
                if let Some(key) = key {
                    self.finish(key, *res);
                }
            }
            PoolEvent::Reply(_, Reply::Ready { .. }) => {}
            PoolEvent::Exited(proc, why) => {
                self.executors.forget(proc);
                let key = self
                    .running
                    .iter()
                    .find(|(_, r)| r.proc == proc)
                    .map(|(k, _)| k.clone());
                if let Some(key) = key {
                    let info = &self.running[&key];
                    let (action_id, started) = (info.action_id, info.started);
                    tracing::warn!(environment = %self.env, resource = key.resource(), "executor crashed: {why}");
                    let res = synthetic(
                        action_id,
                        Outcome::Unavailable,
                        &format!("the executor crashed ({why}); it will be restarted"),
                        started,
                    );
                    self.finish(key, res);
                }
            }
        }
    }

    /// An action ended: update state, log, send events, arm timers, release the queue.
    fn finish(&mut self, key: TaskKey, res: WorkResult) {
        let Some(info) = self.running.remove(&key) else {
            return;
        };
        let run = self.queue.finish(&key);
        let now = Utc::now();
        match &key {
            TaskKey::Dryrun(id, rid) => {
                self.batch.dryrun_results.push((
                    *id,
                    rid.clone(),
                    res.outcome.as_str().into(),
                    serde_json::to_value(&res.changes).unwrap_or_default(),
                    serde_json::to_value(&res.messages).unwrap_or_default(),
                ));
                if let Some(d) = self.dryruns.get_mut(id) {
                    d.intents.remove(rid);
                    if d.intents.is_empty() {
                        self.dryruns.remove(id);
                    }
                }
                // a dry-run is logged in the action log too
                self.batch
                    .actions
                    .push(action_record(self.env, info.version, rid, "dryrun", &res));
            }
            TaskKey::Deploy(rid) => {
                self.batch.actions.push(action_record(
                    self.env,
                    info.version,
                    rid,
                    info.label,
                    &res,
                ));
                if self.tombstones.remove(rid).is_some() {
                    return;
                }
                let stale = run.as_ref().is_some_and(|r| r.stale);
                let Some(r) = self.model.get(rid) else { return };
                let message = res
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.level == "error")
                    .or_else(|| res.messages.last())
                    .map(|m| m.message.clone());
                if stale {
                    // the intent changed while it ran: only the timestamps count
                    self.model.states[r].last_attempt = Some(info.started);
                    self.model.states[r].last_deployed = Some(now);
                } else {
                    let fin =
                        self.model
                            .finish(r, res.outcome, res.change, message, info.started, now);
                    let prio = run
                        .as_ref()
                        .map(|x| x.priority)
                        .unwrap_or(Priority::NewVersion);
                    let sender = rid.clone();
                    for d in fin.events {
                        self.schedule(
                            d,
                            prio,
                            &format!("an event was received from {sender}"),
                            true,
                        );
                    }
                    for d in fin.recovered {
                        self.schedule(d, prio, &format!("requirement {sender} recovered"), false);
                    }
                }
                if let Some(run) = &run
                    && let Some((p, reason)) = &run.follow_up
                {
                    self.schedule(r, *p, reason, false);
                }
                self.arm_timer(r, now);
                self.mark_state(r);
            }
        }
    }
}
