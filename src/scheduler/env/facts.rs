//! Facts kept fresh (issue 29): expiring facts of the model's resources are asked of their
//! handlers again (`facts()`) once older than `fact_renew`, and a fact a compile of the
//! model's version missed (an unresolved unknown) is asked for. Each resource is asked at
//! most once per `fact_resource_block`, each agent at most [`PER_AGENT_PER_SEC`] times a
//! second (a burst of [`BURST`]), so that thousands of facts expiring together never make a
//! load spike; a resource that left the model is never asked (its queued request is dropped
//! when it would start). Facts written with `expires=false` are never renewed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::EnvScheduler;
use crate::scheduler::queue::{Priority, TaskKey};
use crate::store;

/// Requests for facts one agent gets at most, per second, after its burst.
pub const PER_AGENT_PER_SEC: f64 = 20.0;
pub const BURST: f64 = 40.0;
/// Resources looked at per scan, at most.
const SCAN_LIMIT: i64 = 2000;

/// The refresh's memory: when each resource was last asked, and each agent's budget.
#[derive(Default)]
pub struct FactRefresh {
    next_scan: Option<tokio::time::Instant>,
    asked: HashMap<String, Instant>,
    /// agent -> (tokens, when counted)
    budget: HashMap<String, (f64, Instant)>,
    /// Requests queued or running: (resource, agent). An agent has at most
    /// [`PER_AGENT_PER_SEC`] of them, so requests that waited behind a busy executor never
    /// run together with a new burst as a bigger one.
    outstanding: Vec<(String, String)>,
    /// Requests made since the scheduler started (for tests and status).
    pub requested: u64,
    /// Resources of the model's version with a fact the model waits for (an unresolved
    /// unknown): their deploys carry `want_facts`, so built-in handlers report theirs.
    pub wanted: std::collections::HashSet<String>,
}

impl FactRefresh {
    /// May `agent` be asked once more now? Takes a token if so.
    fn take(&mut self, agent: &str, now: Instant) -> bool {
        let (tokens, at) = self.budget.entry(agent.to_string()).or_insert((BURST, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * PER_AGENT_PER_SEC).min(BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl EnvScheduler {
    /// The resources whose facts the model's version waits for, from the store (an error
    /// keeps what was known; the next scan tries again).
    pub(super) async fn load_wanted_facts(&mut self) {
        let Some(version) = self.model.version else {
            self.facts.wanted.clear();
            return;
        };
        match store::facts::unknowns_of(&self.pool, self.env, version).await {
            Ok(u) => self.facts.wanted = waited_for(u).into_iter().collect(),
            Err(e) => {
                tracing::warn!(environment = %self.env, error = %e, "looking for missing facts failed; trying again later")
            }
        }
    }

    /// How often the store is looked at: a third of the renewal period, between 1 and 10 s.
    fn fact_scan_every(&self) -> Duration {
        let renew = self.settings.fact_renew_secs();
        Duration::from_secs_f64((renew as f64 / 3.0).clamp(1.0, 10.0))
    }

    /// Ask for the facts that are due (when a scan is due). Errors of the store are logged
    /// and the scan is tried again at the next one.
    pub(super) async fn refresh_facts(&mut self) {
        let now_t = tokio::time::Instant::now();
        if self.facts.next_scan.is_some_and(|t| now_t < t) || self.halted {
            return;
        }
        self.facts.next_scan = Some(now_t + self.fact_scan_every());
        let Some(version) = self.model.version else {
            return;
        };
        let renew = self.settings.fact_renew_secs();
        let before = chrono::Utc::now() - chrono::Duration::seconds(renew as i64);
        let due = match store::facts::due_for_renewal(&self.pool, self.env, before, SCAN_LIMIT)
            .await
        {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(environment = %self.env, error = %e, "looking for facts to renew failed; trying again later");
                return;
            }
        };
        let missing: Vec<String> = match store::facts::unknowns_of(&self.pool, self.env, version)
            .await
        {
            Ok(u) => {
                let missing = waited_for(u);
                self.facts.wanted = missing.iter().cloned().collect();
                missing
            }
            Err(e) => {
                tracing::warn!(environment = %self.env, error = %e, "looking for missing facts failed; trying again later");
                Vec::new()
            }
        };
        let block = Duration::from_secs(self.settings.fact_resource_block);
        let now = Instant::now();
        self.facts
            .asked
            .retain(|_, at| now.duration_since(*at) < block);
        let mut wanted: Vec<(String, &str)> = missing
            .into_iter()
            .map(|r| (r, "a fact the model needs is missing"))
            .collect();
        wanted.extend(
            due.into_iter()
                .map(|r| (r, "its facts are due for renewal")),
        );
        // what is still queued or running, per agent
        let (queue, running) = (&self.queue, &self.running);
        self.facts.outstanding.retain(|(rid, _)| {
            let key = TaskKey::Facts(rid.clone());
            queue.is_queued(&key) || running.contains_key(&key)
        });
        let mut waiting: HashMap<String, usize> = HashMap::new();
        for (_, agent) in &self.facts.outstanding {
            *waiting.entry(agent.clone()).or_default() += 1;
        }
        let mut held_back = false;
        for (rid, why) in wanted {
            if self.facts.asked.contains_key(&rid) {
                continue;
            }
            // gone from the model: nobody asks for it any more
            let Some(r) = self.model.get(&rid) else {
                continue;
            };
            let agent = self.model.intents[r].agent.clone();
            let queued = waiting.entry(agent.clone()).or_default();
            if *queued >= PER_AGENT_PER_SEC as usize || !self.facts.take(&agent, now) {
                held_back = true;
                continue;
            }
            *queued += 1;
            self.facts.outstanding.push((rid.clone(), agent.clone()));
            self.facts.asked.insert(rid.clone(), now);
            self.facts.requested += 1;
            self.queue.schedule(
                TaskKey::Facts(rid),
                &agent,
                Priority::Facts,
                why,
                &[],
                &[],
                false,
            );
        }
        // an agent's budget ran out: look again as soon as it has refilled a little, so a
        // backlog drains at the agent's rate rather than a burst per scan
        if held_back {
            let soon = now_t + Duration::from_secs(1);
            self.facts.next_scan = Some(self.facts.next_scan.map_or(soon, |t| t.min(soon)));
        }
    }
}

/// The resources of unresolved fact unknowns.
fn waited_for(unknowns: Vec<(crate::model::UnknownRecord, bool)>) -> Vec<String> {
    unknowns
        .into_iter()
        .filter(|(u, resolved)| !resolved && u.source == "fact" && !u.resource_id.is_empty())
        .map(|(u, _)| u.resource_id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_is_asked_at_most_its_rate_after_a_burst() {
        let mut f = FactRefresh::default();
        let t0 = Instant::now();
        let first = (0..1000).filter(|_| f.take("a", t0)).count();
        assert_eq!(first, BURST as usize);
        // another agent has its own budget
        assert!(f.take("b", t0));
        let later = t0 + Duration::from_secs(2);
        let more = (0..1000).filter(|_| f.take("a", later)).count();
        assert_eq!(more, (2.0 * PER_AGENT_PER_SEC) as usize);
    }
}
