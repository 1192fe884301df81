//! What the rest of the server asks of a scheduler: releases, settings, user deploys and
//! repairs, dry-runs, pauses, halts, status.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::Utc;
use uuid::Uuid;

use super::{AgentStatus, Control, DryrunCtx, EnvScheduler, SettledCounts, Status};
use crate::scheduler::model::{Blocked, Model};
use crate::scheduler::queue::{Priority, TaskKey};
use crate::store;

impl EnvScheduler {
    pub(super) async fn on_control(&mut self, c: Control) {
        match c {
            Control::Released(v) => {
                if let Err(e) = self.merge_version(v).await {
                    tracing::error!(environment = %self.env, version = v, error = %e, "merging a released version failed");
                }
            }
            Control::Settings => {
                if let Ok(env) = store::environments::get_environment(&self.pool, self.env).await {
                    self.settings = env.settings;
                    if let Err(e) = self.read_agent_configs().await {
                        tracing::warn!(environment = %self.env, error = %e, "the agents' configurations could not be read");
                    }
                    self.refresh_placements();
                    let now = Utc::now();
                    self.arm_sweeps(now);
                    for r in 0..self.model.len() {
                        self.arm_timer(r, now);
                    }
                }
            }
            Control::Trigger {
                repair,
                agent,
                resource,
                ack,
            } => {
                let n = self.trigger(repair, agent.as_deref(), resource.as_deref());
                let _ = ack.send(n);
            }
            Control::Dryrun { id, version } => self.start_dryrun(id, version).await,
            Control::DryrunPreview { id } => self.start_preview_dryrun(id).await,
            Control::Pause { agent, paused, ack } => {
                // (withdrawn actions finish, which reads flags)
                self.settle_unread().await;
                if paused {
                    self.withdraw_waiting(Some(&agent)).await;
                    self.paused.insert(agent);
                } else {
                    self.paused.remove(&agent);
                }
                let _ = ack.send(());
            }
            Control::Halt { halted, ack } => {
                self.settle_unread().await;
                if halted {
                    self.withdraw_waiting(None).await;
                }
                self.halted = halted;
                let _ = ack.send(());
            }
            Control::Status(ack) => {
                let _ = ack.send(self.status());
            }
            Control::Counts { version, ack } => {
                let _ = ack.send(self.settled_counts(version));
            }
            Control::Stop | Control::StopWithSnapshot => {}
        }
    }

    pub(super) fn status(&self) -> Status {
        let mut agents: HashMap<String, AgentStatus> = HashMap::new();
        for p in self.model.agents.keys().chain(&self.paused) {
            agents.entry(p.clone()).or_insert_with(|| AgentStatus {
                name: p.clone(),
                ..Default::default()
            });
        }
        for (name, a) in agents.iter_mut() {
            a.paused = self.paused.contains(name);
            a.queued = self.queue.queued_count(name);
            a.running = self.queue.running_count(name);
            a.executors = self.executors.pids(name);
            a.placement = self.executors.placement(name).to_string();
            a.ready = self.executors.is_ready(name);
        }
        let mut agents: Vec<AgentStatus> = agents.into_values().collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Status {
            version: self.model.version,
            halted: self.halted,
            agents,
            dirty: self.model.dirty.len(),
            queued: self.queue.len(),
            running: self.running.len(),
            fact_requests: self.facts.requested,
        }
    }

    /// What `store::state::status_counts` will count for `version` once the writer wrote
    /// every state handed to it until now (everything recorded is handed over first). Each
    /// resource's status is taken from the fields its state row is written with
    /// ([`EnvScheduler::state_row`]), by the twin of the SQL that counts them.
    fn settled_counts(&mut self, version: i32) -> Option<SettledCounts> {
        if self.model.version != Some(version) {
            return None;
        }
        self.flush();
        // as `state_row` says: a deploy started and not waiting in its executor's input
        let deploying: HashSet<usize> = self
            .running
            .iter()
            .filter(|(_, x)| x.deploys_now())
            .filter_map(|(key, _)| match key {
                TaskKey::Deploy(id) => self.model.get(id),
                _ => None,
            })
            .collect();
        let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
        for (r, (i, s)) in self
            .model
            .intents
            .iter()
            .zip(&self.model.states)
            .enumerate()
        {
            let fields = store::state::StatusFields {
                orphaned: false,
                deploying: deploying.contains(&r),
                blocked: s.blocked.as_str(),
                intent_hash: Some(&i.hash),
                last_result: s.last_result.map(|o| o.as_str()),
                last_run_hash: s.last_run_hash.as_deref(),
            };
            *counts
                .entry(store::state::status_of(Some(&fields), &i.hash, i.undefined))
                .or_default() += 1;
        }
        Some(SettledCounts {
            counts: counts
                .into_iter()
                .map(|(status, n)| (status.to_string(), n))
                .collect(),
            handed: self.handed,
            written: self.written.clone(),
        })
    }

    pub(super) fn trigger(
        &mut self,
        repair: bool,
        agent: Option<&str>,
        resource: Option<&str>,
    ) -> usize {
        let picked: Vec<usize> = (0..self.model.len())
            .filter(|&r| agent.is_none_or(|a| self.model.intents[r].agent == a))
            .filter(|&r| resource.is_none_or(|id| self.model.intents[r].id == id))
            .filter(|&r| self.model.states[r].blocked != Blocked::Blocked)
            .filter(|&r| repair || self.model.dirty.contains(&r))
            .collect();
        for &r in &picked {
            if repair {
                if self.model.states[r].blocked == Blocked::Temporarily {
                    self.model.states[r].blocked = Blocked::NotBlocked;
                }
                self.schedule(r, Priority::UserRepair, "user requested a repair", false);
            } else {
                self.schedule(r, Priority::UserDeploy, "user requested a deploy", false);
            }
        }
        picked.len()
    }

    pub(super) async fn start_dryrun(&mut self, id: Uuid, version: i32) {
        let intents = match self.load_intents(version, false).await {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(environment = %self.env, error = %e, "dry-run: loading the version failed");
                return;
            }
        };
        // blocked resources of that version are reported without running anything
        let mut m = Model::default();
        m.merge(version, intents);
        let mut runnable = Vec::new();
        for r in 0..m.len() {
            let i = m.intents[r].clone();
            if m.states[r].blocked == Blocked::Blocked {
                let outcome = if i.undefined {
                    "undefined"
                } else {
                    "skipped_for_undefined"
                };
                let msg = serde_json::json!([{"level": "info", "message": m.states[r].blocked_reason, "fields": {}, "at": Utc::now()}]);
                self.batch.dryrun_results.push((
                    id,
                    i.id.clone(),
                    outcome.into(),
                    serde_json::json!({}),
                    msg,
                ));
                continue;
            }
            runnable.push(i);
        }
        self.dryrun_these(id, version, runnable).await;
    }

    /// A pull-request preview's dry-run: its resources (the preview's desired attributes) as
    /// the database holds them, through the handler code of the version it was diffed
    /// against (the active one), never the pull request's.
    pub(super) async fn start_preview_dryrun(&mut self, id: Uuid) {
        let loaded = async {
            let row = store::deploy::dryrun(&self.pool, self.env, id).await?;
            let resources = store::previews::dryrun_resources(&self.pool, id).await?;
            Ok::<_, store::StoreError>((row.version, resources))
        }
        .await;
        let (version, resources) = match loaded {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(environment = %self.env, dryrun = %id, error = %e, "preview dry-run: loading it failed");
                return;
            }
        };
        let intents = resources
            .into_iter()
            .map(|r| crate::scheduler::model::Intent {
                id: r.resource_id,
                type_name: r.resource_type,
                agent: r.agent,
                hash: String::new(),
                attributes: r.attributes.as_object().cloned().unwrap_or_default().into(),
                requires: Vec::new(),
                undefined: false,
            })
            .collect();
        self.dryrun_these(id, version, intents).await;
    }

    /// Dry-run `runnable` (those of paused agents are reported without running) with the
    /// handler code of `version`.
    async fn dryrun_these(
        &mut self,
        id: Uuid,
        version: i32,
        runnable: Vec<crate::scheduler::model::Intent>,
    ) {
        let mut intents = HashMap::new();
        for i in runnable {
            if self.paused.contains(&i.agent) {
                let msg = serde_json::json!([{"level": "info", "message": "the agent is paused", "fields": {}, "at": Utc::now()}]);
                self.batch.dryrun_results.push((
                    id,
                    i.id.clone(),
                    "agent_paused".into(),
                    serde_json::json!({}),
                    msg,
                ));
                continue;
            }
            self.queue.schedule(
                TaskKey::Dryrun(id, i.id.clone()),
                &i.agent,
                Priority::Dryrun,
                "dry-run",
                &[],
                &[],
                false,
            );
            intents.insert(i.id.clone(), i);
        }
        let handlers = match store::code::handlers_of(&self.pool, self.env, version).await {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(environment = %self.env, error = %e, "dry-run: loading the handler code failed");
                BTreeMap::new()
            }
        };
        self.dryruns.insert(
            id,
            DryrunCtx {
                version,
                intents,
                handlers,
            },
        );
    }
}
