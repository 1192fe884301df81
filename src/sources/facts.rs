//! Recompiles for facts: a fact or parameter that resolves an unknown value a version met
//! (or a parameter changed with `recompile`, or deleted) makes the server compile the
//! **same commit** again, after the environment's `recompile_backoff`, facts arriving
//! together making one compile. The new version says why in its provenance
//! (`trigger: fact`, `facts`), the commit's timeline gets a `recompile` event.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use super::feedback::{Outgoing, State};
use super::{GitSources, Msg, SourceError};
use crate::store::{self, StoreError};

/// At most this many changed values named in a recompile's reason (the rest are counted).
const NAMED_FACTS: usize = 20;

/// Facts that arrived for an environment and wait for their recompile.
#[derive(Debug, Default)]
pub(super) struct PendingFacts {
    /// Versions whose unknowns they resolved.
    versions: BTreeSet<i32>,
    /// (resource id, name) of the values that changed, in arrival order, bounded.
    changed: Vec<(String, String)>,
    /// How many changed values there were in all.
    changed_count: usize,
    /// A parameter asked for a recompile (set with `recompile`, deleted).
    recompile: bool,
}

impl PendingFacts {
    fn merge(&mut self, versions: Vec<i32>, changed: Vec<(String, String)>, recompile: bool) {
        self.versions.extend(versions);
        self.changed_count += changed.len();
        for c in changed {
            if self.changed.len() < NAMED_FACTS && !self.changed.contains(&c) {
                self.changed.push(c);
            }
        }
        self.recompile |= recompile;
    }

    /// The reason, as the provenance and the timeline show it.
    fn why(&self) -> serde_json::Value {
        json!({
            "resolves": self.versions,
            "changed": self.changed.iter().map(|(r, n)| json!({"resource_id": r, "name": n})).collect::<Vec<_>>(),
            "changed_count": self.changed_count,
            "recompile": self.recompile,
        })
    }

    fn describe(&self) -> String {
        let names: Vec<String> = self
            .changed
            .iter()
            .map(|(r, n)| {
                if r.is_empty() {
                    format!("parameter {n}")
                } else {
                    format!("{n} of {r}")
                }
            })
            .collect();
        let more = self.changed_count.saturating_sub(self.changed.len());
        let mut s = if names.is_empty() {
            "parameters changed".to_string()
        } else {
            names.join(", ")
        };
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
        if !self.versions.is_empty() {
            let v: Vec<String> = self.versions.iter().map(|v| v.to_string()).collect();
            s.push_str(&format!(" (unknown in version {})", v.join(", ")));
        }
        s
    }
}

impl GitSources {
    /// Facts arrived for `env` (an [`crate::events::Event::Facts`]): after the environment's
    /// backoff, one recompile for all that arrived meanwhile.
    pub(super) fn facts_arrived(
        &self,
        env: Uuid,
        versions: Vec<i32>,
        changed: Vec<(String, String)>,
        recompile: bool,
    ) {
        if versions.is_empty() && !recompile {
            return;
        }
        let first = {
            let mut waits = self.0.fact_waits.lock().expect("fact waits");
            let first = !waits.contains_key(&env);
            waits
                .entry(env)
                .or_default()
                .merge(versions, changed, recompile);
            first
        };
        if !first {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let backoff = match store::environments::get_environment(&me.0.pool, env).await {
                Ok(e) => e.settings.recompile_backoff,
                Err(_) => crate::model::settings::EnvSettings::default().recompile_backoff,
            };
            tokio::time::sleep(Duration::from_secs_f64(backoff.clamp(0.0, 3600.0))).await;
            let Some(pending) = me.0.fact_waits.lock().expect("fact waits").remove(&env) else {
                return;
            };
            let tx =
                me.0.workers
                    .lock()
                    .expect("workers")
                    .get(&env)
                    .map(|w| w.tx.clone());
            match tx {
                Some(tx) => {
                    let _ = tx.send(Msg::Recompile(pending));
                }
                None => {
                    tracing::debug!(environment = %env, "facts arrived for an environment without a followed source")
                }
            }
        });
    }

    /// Queue the recompile of `pending` (in the environment's fetcher, so that it is
    /// ordered with the commits it queues). True when a compile was queued.
    pub(super) async fn queue_recompile(
        &self,
        env: Uuid,
        src: &store::sources::SourceRow,
        pending: &PendingFacts,
    ) -> Result<bool, SourceError> {
        let pool = &self.0.pool;
        // the commit whose model met the unknowns (or that a parameter change concerns):
        // a compile that has not started reads the new values anyway; one that is running
        // may have read the old ones, so its commit is compiled again after it
        let (commit, branch) = match store::sources::pending_compile(pool, env).await? {
            Some((status, _, _)) if status == "queued" => {
                tracing::info!(environment = %env, "facts arrived; the queued compile reads them");
                return Ok(false);
            }
            Some((_, commit, branch)) => (commit, branch),
            None => {
                let Some(latest) = store::versions::list(pool, env, 1, None).await?.pop() else {
                    return Ok(false);
                };
                if !pending.recompile && !pending.versions.contains(&latest.number) {
                    tracing::info!(environment = %env, version = latest.number, "facts arrived for older versions only; the newest does not need them");
                    return Ok(false);
                }
                match (
                    latest.provenance["commit"].as_str(),
                    latest.provenance["branch"].as_str(),
                ) {
                    (Some(c), Some(b)) => (c.to_string(), b.to_string()),
                    // uploaded, not compiled here: `steward export` makes it again
                    _ => {
                        tracing::info!(environment = %env, version = latest.number, "facts arrived for a version that was not compiled from the source; it waits for the next export");
                        return Ok(false);
                    }
                }
            }
        };
        let why = pending.why();
        let now = chrono::Utc::now();
        let mut stage = super::compile::stage(
            "facts arrived",
            now,
            Duration::ZERO,
            true,
            &pending.describe(),
        );
        stage["why"] = why.clone();
        let mut out = Outgoing::default();
        let mut tx = pool.begin().await.map_err(StoreError::from)?;
        self.check_fence(env, &mut tx).await?;
        let (id, superseded) =
            store::sources::enqueue(&mut tx, env, &commit, &branch, "fact", stage).await?;
        store::sources::add_event(
            &mut *tx,
            env,
            &commit,
            "recompile",
            json!({"trigger": "fact", "compile": id, "facts": why}),
        )
        .await?;
        out.status(
            src,
            &commit,
            "steward/compile",
            State::Pending,
            "queued for compile (facts arrived)",
        );
        let queued = out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        if queued {
            self.0.feedback.wake();
        }
        tracing::info!(environment = %env, commit = %commit, compile = %id, superseded = superseded.len(), facts = %pending.describe(), "facts arrived: the commit is compiled again");
        Ok(true)
    }
}
