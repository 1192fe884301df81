//! Work: queueing a resource's deploy, starting queued actions on executors (or ending them
//! at once when they cannot run), and taking their results back into the model.

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::persist::{action_record, synthetic};
use super::{EnvScheduler, RunInfo};
use crate::executor::protocol::{
    ActionKind, ExternalHandler, Outcome, Reply, WorkItem, WorkResult,
};
use crate::model::{Resource, ResourceId};
use crate::scheduler::executors::PoolEvent;
use crate::scheduler::model::Blocked;
use crate::scheduler::queue::{Priority, TaskKey};
use crate::store::actions::ActionRecord;

impl EnvScheduler {
    /// Queue a deploy of resource `r`.
    pub(super) fn schedule(&mut self, r: usize, priority: Priority, reason: &str, force: bool) {
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

    pub(super) async fn dispatch(&mut self) {
        if self.halted {
            return;
        }
        // a replica not sure of its lease (it could not renew it, or it was paused past
        // it) starts nothing: another replica may own the environment already
        if self.tenure.as_ref().is_some_and(|t| !t.valid()) {
            return;
        }
        for agent in self.queue.agents_with_ready() {
            // a paused agent, or an external one with no process connected: its work waits
            if self.paused.contains(&agent) || !self.executors.make_ready(&agent) {
                continue;
            }
            while self.queue.running_count(&agent) < self.executors.max_out(&agent)
                // an SSH target whose error was just reported connects again first
                && self.executors.make_ready(&agent)
            {
                let Some((key, run)) = self.queue.pop(&agent) else {
                    break;
                };
                self.start(key, &agent, run.reason, run.priority).await;
            }
        }
        self.close_done_versions().await;
    }

    /// Tell the executors about versions whose deploy is done: none of their deploys runs,
    /// and none waits (what waits deploys the model's version).
    async fn close_done_versions(&mut self) {
        if self.open_versions.is_empty() {
            return;
        }
        let busy: std::collections::HashSet<i32> = self
            .running
            .values()
            .filter(|r| r.kind == ActionKind::Deploy)
            .map(|r| r.version)
            .collect();
        let current = self.model.version;
        let waiting = !self.queue.is_empty();
        let done: Vec<i32> = self
            .open_versions
            .iter()
            .copied()
            .filter(|v| !(busy.contains(v) || waiting && Some(*v) == current))
            .collect();
        for v in done {
            self.open_versions.remove(&v);
            self.executors.version_done(v).await;
        }
    }

    pub(super) async fn start(
        &mut self,
        key: TaskKey,
        agent: &str,
        reason: String,
        priority: Priority,
    ) {
        let now = Utc::now();
        let label = match &key {
            TaskKey::Dryrun(..) => "dryrun",
            TaskKey::Facts(..) => "getfact",
            TaskKey::Deploy(id) if self.tombstones.contains_key(id) => super::DELETE_LABEL,
            _ if matches!(priority, Priority::UserRepair | Priority::IntervalRepair) => "repair",
            _ => "deploy",
        };
        // a resource whose attributes a scheduler that just started has not read yet
        if let TaskKey::Deploy(id) | TaskKey::Facts(id) = &key
            && let Some(r) = self.model.get(id)
            && self.model.intents[r].attributes.is_unread()
            && let Err(e) = self.read_attributes_of(&[r]).await
        {
            tracing::warn!(environment = %self.env, resource = %id, error = %e, "the resource's attributes could not be read");
        }
        let (kind, mut intent, version, r, code) = match &key {
            TaskKey::Deploy(id) => match (self.model.get(id), self.tombstones.get(id)) {
                (Some(r), _) => {
                    self.model.intents[r].attributes.settle();
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
                (None, Some(t)) => (
                    ActionKind::Deploy,
                    t.intent.clone(),
                    self.model.version.unwrap_or(0),
                    None,
                    t.code.clone(),
                ),
                (None, None) => {
                    self.queue.finish(&key);
                    return;
                }
            },
            // facts of the resource as the model has it now; gone from the model: dropped
            TaskKey::Facts(id) => match self.model.get(id) {
                Some(r) => {
                    self.model.intents[r].attributes.settle();
                    let intent = self.model.intents[r].clone();
                    let code = self.handlers.get(&intent.type_name).cloned();
                    let v = self.model.version.unwrap_or(0);
                    (ActionKind::Facts, intent, v, None, code)
                }
                None => {
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
        // time-ordered: the action log's primary key grows at its end, where a random id
        // wrote into a page anywhere in an index of millions of rows
        let action_id = Uuid::now_v7();
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
                // (finishing reads the flags of the resources it sends events to)
                self.read_dependents_of(&[r]).await;
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
        // what the executor needs besides the intent: the module's handler code on disk, as
        // this version has it, and the attributes read (a resource whose stored attributes do
        // not read is never sent with others in their place)
        let handler = match &code {
            None => Ok(None),
            Some(c) => self
                .code
                .ensure(&self.pool, c)
                .await
                .map(|dir| {
                    Some(ExternalHandler {
                        dir,
                        entry: c.entry.clone(),
                        digest: c.digest.clone(),
                        inmanta: c.inmanta.clone(),
                    })
                })
                .map_err(|e| {
                    format!(
                        "the handler code of module {} is not available: {e}",
                        c.module
                    )
                }),
        };
        // the intent is this action's own copy: its attributes are moved, not copied again
        let attributes = std::mem::take(&mut intent.attributes).into_map();
        let prepared = handler.and_then(|handler| match attributes {
            Ok(a) => Ok((handler, a)),
            Err(e) => Err(format!("resource {} can not be deployed: {e}", intent.id)),
        });
        let (handler, attributes) = match prepared {
            Ok(p) => p,
            Err(msg) => {
                tracing::warn!(environment = %self.env, resource = %intent.id, "{msg}");
                self.read_dependents_of(r.as_slice()).await;
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
        };
        let item = WorkItem {
            action_id,
            kind,
            resource: Resource {
                id: ResourceId(intent.id.clone()),
                type_name: intent.type_name.clone(),
                agent: intent.agent.clone(),
                attributes,
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
            at_target: false,
            environment: Some(self.env),
            want_facts: self.facts.wanted.contains(&intent.id),
        };
        let proc = match self.executors.acquire(agent).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(environment = %self.env, error = %e, "no executor");
                self.read_dependents_of(r.as_slice()).await;
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
        let timeout = Duration::from_secs(self.settings.handler_timeout);
        // an external agent process enforces the timeout itself, from when it starts the
        // action (one may wait for a slot there): here only a backstop. An action sent to an
        // SSH executor busy with another starts when that one ends (by its deadline).
        let behind = self
            .running
            .values()
            .filter(|r| r.proc == proc && proc != 0)
            .map(|r| r.deadline)
            .max();
        let deadline = match self.executors.placement(agent) {
            crate::model::placement::Placement::External => {
                tokio::time::Instant::now()
                    + crate::scheduler::agents::backstop(timeout, self.executors.parallelism())
            }
            _ => {
                behind
                    .unwrap_or_else(tokio::time::Instant::now)
                    .max(tokio::time::Instant::now())
                    + timeout
            }
        };
        // an executor busy with the action before this one starts it when that one ends
        let waiting = behind.is_some();
        let mut start_record = (kind == ActionKind::Deploy).then(|| {
            self.open_versions.insert(version);
            Box::new(ActionRecord {
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
            })
        });
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
                waiting,
                withdrawing: false,
                start_record: if waiting { start_record.take() } else { None },
            },
        );
        if !waiting && let Some(record) = start_record {
            self.batch.actions.push(*record);
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
    pub(super) fn finish_at_once(
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
                waiting: false,
                withdrawing: false,
                start_record: None,
            },
        );
        self.finish(key, res);
    }

    pub(super) fn on_pool_event(&mut self, ev: PoolEvent) {
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
                // the executor goes on with the next action it was given: that one starts
                // now, and so does its timeout
                self.start_next_on(proc);
            }
            PoolEvent::Reply(proc, Reply::Withdrawn { action_id }) => {
                self.on_withdrawn(proc, action_id)
            }
            PoolEvent::Reply(_, Reply::Ready { .. }) => {}
            PoolEvent::Reply(proc, Reply::Call(call)) => self.on_call(proc, *call),
            PoolEvent::Answer(proc, a) => self.executors.queue_answer(proc, a),
            PoolEvent::SshConnected(uri, outcome) => self.executors.ssh_connected(uri, outcome),
            PoolEvent::Exited(proc, why) => {
                self.executors.forget(proc);
                // every action it had: the one it worked on ends here; those waiting behind
                // it never started, and go back to the queue
                let keys: Vec<TaskKey> = self
                    .running
                    .iter()
                    .filter(|(_, r)| r.proc == proc)
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in keys {
                    if self.running[&key].waiting && self.requeue_unstarted(&key) {
                        continue;
                    }
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

    /// The executor `proc` finished an action: the next one it was given (if any) starts
    /// now. Its timeout runs from now, and its "started" record and deploying state are
    /// written now.
    fn start_next_on(&mut self, proc: crate::scheduler::executors::ProcId) {
        let timeout = Duration::from_secs(self.settings.handler_timeout);
        let Some((key, next)) = self
            .running
            .iter_mut()
            .filter(|(_, r)| r.proc == proc)
            .min_by_key(|(_, r)| r.deadline)
        else {
            return;
        };
        // asked back: it starts now only if the executor took it before the withdrawal came,
        // which its result will say (its "started" record is then written with the end)
        if next.withdrawing {
            return;
        }
        next.deadline = tokio::time::Instant::now() + timeout;
        if !next.waiting {
            return;
        }
        next.waiting = false;
        let now = Utc::now();
        next.started = now;
        if let Some(mut record) = next.start_record.take() {
            record.started_at = now;
            if let Some(m) = record.messages.get_mut(0) {
                m["at"] = serde_json::json!(now);
            }
            self.batch.actions.push(*record);
            // only deploys have a start record
            if let Some(r) = self.model.get(key.resource()) {
                self.mark_state(r);
            }
        }
    }

    /// Ask back what waits in executors' inputs for `agent` (every agent: `None`), after a
    /// pause or a halt: what was sent ahead does not start. The action each executor works on
    /// ends as usual.
    pub(super) async fn withdraw_waiting(&mut self, agent: Option<&str>) {
        let asked: Vec<(TaskKey, crate::scheduler::executors::ProcId, Uuid)> = self
            .running
            .iter()
            .filter(|(_, r)| !r.withdrawing)
            .filter_map(|(k, r)| {
                let of = &self.queue.running.get(k)?.agent;
                if agent.is_some_and(|a| a != of) {
                    return None;
                }
                // what waits in an executor's input; an external agent's process holds what
                // it was handed out ahead, and says itself whether it started it
                let held = r.waiting
                    || self.executors.placement(of) == crate::model::placement::Placement::External;
                held.then(|| (k.clone(), r.proc, r.action_id))
            })
            .collect();
        for (key, proc, action_id) in asked {
            if self.executors.withdraw(proc, action_id).await
                && let Some(r) = self.running.get_mut(&key)
            {
                r.withdrawing = true;
            }
        }
    }

    /// The executor `proc` gave `action_id` back unstarted: it goes back to the queue as it
    /// was asked for, and starts when its agent may run again.
    fn on_withdrawn(&mut self, proc: crate::scheduler::executors::ProcId, action_id: Uuid) {
        self.executors.release(proc);
        let Some((key, info)) = self
            .running
            .iter()
            .find(|(_, r)| r.action_id == action_id && r.proc == proc)
        else {
            return;
        };
        let key = key.clone();
        // an action handed to an external agent was recorded as started when it was handed
        // out: its record says it was withdrawn instead
        if !info.waiting && info.kind == ActionKind::Deploy {
            let now = Utc::now();
            let message = format!(
                "{} withdrawn before it started (its agent was paused, or the environment halted): it is queued again",
                info.label
            );
            self.batch.actions.push(ActionRecord {
                id: action_id,
                environment_id: self.env,
                version: info.version,
                resource_id: key.resource().to_string(),
                action: info.label.into(),
                started_at: info.started,
                finished_at: Some(now),
                status: "cancelled".into(),
                change: "nochange".into(),
                changes: serde_json::json!({}),
                messages: serde_json::json!([{"level": "info", "message": message, "fields": {}, "at": now}]),
            });
        }
        if self.requeue_unstarted(&key) {
            // no longer deploying
            if let Some(r) = self.model.get(key.resource()) {
                self.mark_state(r);
            }
        } else {
            // a delete, a dry-run or a facts refresh: queued again as it was; a deploy of a
            // resource that left the model meanwhile: dropped, as its queued deploys were
            self.running.remove(&key);
            let gone = matches!(&key, TaskKey::Deploy(rid) if !self.tombstones.contains_key(rid));
            if gone {
                self.queue.finish(&key);
            } else if let Some(run) = self.queue.unrun(&key) {
                self.queue
                    .schedule(key, &run.agent, run.priority, &run.reason, &[], &[], false);
            }
        }
        // the executor reads its next action once it gave this one back: with none running
        // before it, that one starts now (its result came before this answer otherwise)
        if !self.running.values().any(|r| r.proc == proc && !r.waiting) {
            self.start_next_on(proc);
        }
    }

    /// A deploy that its executor never started (the executor died, or was killed for the
    /// action before it) goes back to the queue as it was asked for, with any follow-up it
    /// got meanwhile. Nothing ran, so nothing is recorded. False when it can not be
    /// queued again (a delete of a resource still out of the model, or a resource no longer
    /// in it): it then ends like the action before it.
    fn requeue_unstarted(&mut self, key: &TaskKey) -> bool {
        let TaskKey::Deploy(rid) = key else {
            return false;
        };
        let Some(r) = self.model.get(rid) else {
            return false;
        };
        if self.tombstones.contains_key(rid) {
            // a delete that never started, of a resource back in the model meanwhile: it is
            // not needed any more (it would run as a "delete" of the model's intent, and the
            // resource deploy again after it); the resource deploys, as one back before its
            // delete started does
            self.tombstones.remove(rid);
            self.timers.cancel(rid);
            self.running.remove(key);
            self.queue.unrun(key);
            self.schedule(
                r,
                Priority::NewVersion,
                "back in the model before its delete started",
                false,
            );
            // blocked: it is not queued, and what waited for it waits no more
            if !self.queue.deploy_pending(rid) {
                self.queue.drop_deploy(rid);
            }
            return true;
        }
        self.running.remove(key);
        let rid = rid.clone();
        if let Some(run) = self.queue.unrun(key) {
            self.schedule(r, run.priority, &run.reason, false);
            if let Some((p, reason)) = run.follow_up {
                self.schedule(r, p, &reason, false);
            }
        }
        // blocked meanwhile: it is not queued, and what waited for it waits no more
        if !self.queue.deploy_pending(&rid) {
            self.queue.drop_deploy(&rid);
        }
        true
    }

    /// An action ended: update state, log, send events, arm timers, release the queue.
    pub(super) fn finish(&mut self, key: TaskKey, res: WorkResult) {
        let Some(info) = self.running.remove(&key) else {
            return;
        };
        let run = self.queue.finish(&key);
        let now = Utc::now();
        match &key {
            TaskKey::Facts(rid) => {
                self.take_facts(rid, &res);
                // a refresh that worked leaves no record (thousands of them would bury the
                // log); one that failed says why
                if !matches!(res.outcome, Outcome::Dry | Outcome::Deployed) {
                    self.batch.actions.push(action_record(
                        self.env,
                        info.version,
                        rid,
                        "getfact",
                        &res,
                    ));
                }
            }
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
                self.take_facts(rid, &res);
                self.batch.actions.push(action_record(
                    self.env,
                    info.version,
                    rid,
                    info.label,
                    &res,
                ));
                if info.is_delete() {
                    self.delete_ended(rid, res.outcome);
                    return;
                }
                if let Some(t) = self.tombstones.get(rid) {
                    // removed while this deploy ran: the delete waited for it, and runs now
                    let agent = t.intent.agent.clone();
                    let (p, reason) = run.and_then(|r| r.follow_up).unwrap_or((
                        Priority::NewVersion,
                        super::deletes::DELETE_REASON.to_string(),
                    ));
                    self.queue
                        .schedule(key.clone(), &agent, p, &reason, &[], &[], false);
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

    /// The facts a handler reported for `rid`, for the parameter store: what the store
    /// would refuse (a name too long, an id it can not read) is dropped here, with a warning,
    /// so that it can not cost the batch it travels in.
    pub(super) fn take_facts(&mut self, rid: &str, res: &WorkResult) {
        for f in &res.facts {
            let p = crate::store::facts::NewParam {
                name: f.name.clone(),
                resource_id: rid.to_string(),
                value: f.value.clone(),
                source: "fact".into(),
                metadata: serde_json::json!({}),
                expires: f.expires,
            };
            match crate::store::facts::validate(std::slice::from_ref(&p)) {
                Ok(mut ok) => self.batch.facts.append(&mut ok),
                Err(e) => {
                    tracing::warn!(environment = %self.env, resource = rid, fact = %f.name, error = %e, "a fact the handler reported is not stored")
                }
            }
        }
    }
}
