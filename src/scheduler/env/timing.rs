//! Time in the scheduler: per-resource repair and retry timers, deploy and repair sweeps
//! (seconds or cron), and handlers that overran their timeout.

use chrono::{DateTime, Utc};

use super::EnvScheduler;
use super::persist::synthetic;
use crate::executor::protocol::Outcome;
use crate::model::settings::Interval;
use crate::scheduler::model::{Blocked, Compliance};
use crate::scheduler::queue::{Priority, TaskKey};
use crate::scheduler::timers::{TimerKind, jittered};

impl EnvScheduler {
    /// Where each agent's executor runs: the `agent_map` setting, else the model's
    /// `std::AgentConfig(agentname, uri)`, else on this server.
    pub(super) fn refresh_placements(&mut self) {
        use crate::model::placement::Placement;
        let mut placements = std::collections::HashMap::new();
        // in id order, so that of two configs for one agent the same one wins whatever the
        // model's order (changes taken in place do not keep id order)
        let mut configs: Vec<&crate::scheduler::model::Intent> = self
            .model
            .intents
            .iter()
            .filter(|i| i.type_name == "std::AgentConfig")
            .collect();
        configs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        if configs.iter().any(|i| i.attributes.is_unread()) {
            // (their read after the start failed) an agent they place elsewhere must not
            // run here meanwhile: the placements stay as they were
            tracing::warn!(environment = %self.env, "the agents' configurations are not read yet: their placements stay as they were");
            return;
        }
        for i in configs {
            let name = i.attributes.get("agentname").and_then(|v| v.as_str());
            let uri = i.attributes.get("uri").and_then(|v| v.as_str());
            if let (Some(name), Some(uri)) = (name, uri) {
                match Placement::parse(uri) {
                    Ok(p) => {
                        placements.insert(name.to_string(), p);
                    }
                    Err(e) => tracing::warn!(environment = %self.env, agent = name,
                        "std::AgentConfig: {e}; the agent runs on this server"),
                }
            }
        }
        for (agent, uri) in &self.settings.agent_map {
            if let Ok(p) = Placement::parse(uri) {
                placements.insert(agent.clone(), p);
            }
        }
        placements.retain(|_, p| !p.is_local());
        self.executors.set_placements(placements);
        self.executors
            .set_parallelism(self.settings.agent_parallelism as usize);
        let ssh = &self.settings.ssh;
        self.executors
            .set_ssh_options(crate::scheduler::ssh::SshOptions {
                known_hosts: ssh.known_hosts.as_ref().map(Into::into),
                identity: ssh.identity.as_ref().map(Into::into),
                connect_timeout: std::time::Duration::from_secs(ssh.connect_timeout),
                allowed: self.settings.ssh_allowed.clone(),
                ..Default::default()
            });
    }

    pub(super) fn arm_sweeps(&mut self, now: DateTime<Utc>) {
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
    pub(super) fn arm_timer(&mut self, r: usize, now: DateTime<Utc>) {
        match self.timer_of(r, now) {
            Some((at, kind)) => self.timers.set(&self.model.intents[r].id, at, kind),
            None => self.timers.cancel(&self.model.intents[r].id),
        }
    }

    /// One turn's part of a start's arming of its timers (see [`super::Arming`]).
    pub(super) async fn arm_timers_part(&mut self, arming: super::Arming) -> super::Arming {
        use super::Arming;
        let (from, began) = match arming {
            Arming::Done => return Arming::Done,
            Arming::Later(idle, at) => {
                let now = tokio::time::Instant::now();
                if now < at && (!self.running.is_empty() || now < idle) {
                    return arming;
                }
                // the writer was just handed the deploys' states: it starts writing them
                // before this task is busy (a task woken from here would wait for it)
                tokio::task::yield_now().await;
                (0, std::time::Instant::now())
            }
            Arming::From {
                next,
                version,
                began,
            } => (
                if version == self.model.version {
                    next
                } else {
                    0
                },
                began,
            ),
        };
        let next = self.arm_timers(from, super::TIMERS_PER_TURN, Utc::now());
        if next < self.model.len() {
            return Arming::From {
                next,
                version: self.model.version,
                began,
            };
        }
        tracing::debug!(environment = %self.env, resources = self.model.len(), ms = began.elapsed().as_secs_f64() * 1e3, "timers armed");
        Arming::Done
    }

    /// [`Self::arm_timer`] of up to `count` resources from the `from`th on (a start arms
    /// them all, a part per turn of its loop); returns where the next part begins. The
    /// timers' heap takes each part at once, not one push per resource.
    pub(super) fn arm_timers(&mut self, from: usize, count: usize, now: DateTime<Utc>) -> usize {
        let to = from.saturating_add(count).min(self.model.len());
        let mut armed = Vec::with_capacity(to.saturating_sub(from));
        for r in from..to {
            match self.timer_of(r, now) {
                Some((at, kind)) => armed.push((self.model.intents[r].id.clone(), at, kind)),
                None => self.timers.cancel(&self.model.intents[r].id),
            }
        }
        self.timers.set_all(armed);
        to
    }

    /// The timer resource `r` should have now (None: none); a retry's time is kept in its
    /// state.
    fn timer_of(&mut self, r: usize, now: DateTime<Utc>) -> Option<(DateTime<Utc>, TimerKind)> {
        let id = &self.model.intents[r].id;
        let s = &self.model.states[r];
        if s.blocked == Blocked::Blocked || self.queue.deploy_pending(id) {
            return None;
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
            return Some((at, TimerKind::Retry));
        }
        if let Interval::Seconds(n) = self.settings.repair_interval
            && (s.compliance == Compliance::Compliant || s.blocked == Blocked::Temporarily)
        {
            let at = s.last_deployed.unwrap_or(now) + chrono::Duration::seconds(n as i64);
            return Some((at, TimerKind::Repair));
        }
        None
    }

    pub(super) async fn on_time(&mut self, now: DateTime<Utc>) {
        for (id, kind) in self.timers.pop_due(now) {
            let Some(r) = self.model.get(&id) else {
                // a removed resource whose delete failed
                if kind == TimerKind::Retry {
                    self.retry_delete(&id);
                }
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
        // an action whose external agent is down waits for it: its timeout starts over
        let timeout = std::time::Duration::from_secs(self.settings.handler_timeout);
        for r in self.running.values_mut() {
            if self.executors.is_waiting(r.proc) {
                r.deadline = tokio::time::Instant::now() + timeout;
            }
        }
        // hung handlers: kill their executor, report, go on
        let late: Vec<TaskKey> = self
            .running
            .iter()
            .filter(|(_, r)| r.deadline <= tokio::time::Instant::now())
            .map(|(k, _)| k.clone())
            .collect();
        // (their ends send events: the flags of the resources they go to are read first)
        let timed_out: Vec<usize> = late
            .iter()
            .filter_map(|k| match k {
                TaskKey::Deploy(id) => self.model.get(id),
                _ => None,
            })
            .collect();
        if !timed_out.is_empty() {
            self.read_dependents_of(&timed_out).await;
        }
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

    pub(super) fn queue_has_new_intent(&self) -> bool {
        self.running.keys().any(|k| matches!(k, TaskKey::Deploy(_)))
            && self
                .queue
                .running
                .values()
                .any(|r| r.priority <= Priority::NewVersion)
            // (asked of the queue: walking the model made a key per resource, 100,000 of
            // them on every tick while a pre-empted repair waited)
            || self.queue.has_queued_deploy_of(Priority::NewVersion)
    }

    pub(super) fn repair_sweep(&mut self) {
        for r in 0..self.model.len() {
            if self.model.states[r].blocked != Blocked::Blocked {
                self.schedule(r, Priority::IntervalRepair, "periodic repair", false);
            }
        }
    }
}
