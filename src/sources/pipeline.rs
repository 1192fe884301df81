//! Deploy feedback of commits, derived from persisted state: a version's release, its
//! replacement by a newer release, and the outcome of its deploy are read from the database
//! and written to the commit's timeline and the outbox in one transaction. Nothing is held
//! in memory that a crash could lose: after a restart the first look finds what is missing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use uuid::Uuid;

use super::GitSources;
use super::feedback::{Outgoing, State};
use crate::store::sources::SourceRow;
use crate::store::{self, StoreError};

/// What the deploy reporter last found in an environment.
struct Look {
    active: i32,
    /// the active version's outcome is in its commit's timeline (or it has no commit)
    settled: bool,
}

impl GitSources {
    /// Report deploys for ever: woken by releases, and every second while deploys settle.
    pub(super) async fn report_deploys(self, wake: Arc<Notify>) {
        // environment -> what the last look found (nothing at start: look at all)
        let mut seen: HashMap<Uuid, Look> = HashMap::new();
        loop {
            match store::sources::list_sources(&self.0.pool).await {
                Ok(list) => {
                    for src in list {
                        // with replicas, the owner of the environment reports its deploys
                        if !self.follows(src.environment_id) {
                            seen.remove(&src.environment_id);
                            continue;
                        }
                        if let Err(e) = self.report_environment(&src, &mut seen).await {
                            tracing::warn!(environment = %src.environment_id, error = %e, "deploy feedback failed; retrying");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "deploy feedback: listing sources failed; retrying")
                }
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
        }
    }

    async fn report_environment(
        &self,
        src: &SourceRow,
        seen: &mut HashMap<Uuid, Look>,
    ) -> Result<(), StoreError> {
        let pool = &self.0.pool;
        let env = src.environment_id;
        let Some(active) = store::versions::active(pool, env).await? else {
            return Ok(());
        };
        match seen.get(&env) {
            // nothing left to report until another version is released
            Some(l) if l.active == active && l.settled => return Ok(()),
            Some(l) if l.active == active => {}
            _ => {
                self.report_releases(src, active).await?;
                seen.insert(
                    env,
                    Look {
                        active,
                        settled: false,
                    },
                );
            }
        }
        let settle = |seen: &mut HashMap<Uuid, Look>| {
            if let Some(l) = seen.get_mut(&env) {
                l.settled = true;
            }
        };
        let info = store::versions::get(pool, env, active).await?;
        let Some(commit) = info.provenance["commit"].as_str() else {
            settle(seen);
            return Ok(());
        };
        let done = store::sources::version_events(pool, env, commit, active).await?;
        if done.iter().any(|e| e == "deployed" || e == "deploy_failed") {
            settle(seen);
            return Ok(());
        }
        let known = match self.0.known_counts.get() {
            Some(counts) => counts(env, active).await,
            None => None,
        };
        let (summary, counted_by) =
            store::state::summary_known_or_counted(pool, env, active, known, info.resource_count)
                .await?;
        if summary.pending > 0 || summary.total == 0 && info.resource_count > 0 {
            return Ok(());
        }
        let (failed, total, by_status) = (summary.failed, summary.total, summary.by_status);
        let ok = failed == 0;
        let event = if ok { "deployed" } else { "deploy_failed" };
        let text = if ok {
            format!("version {active} deployed: {total} resources")
        } else {
            format!("version {active}: {failed} of {total} resources failed")
        };
        let mut out = Outgoing::default();
        let state = if ok { State::Success } else { State::Failure };
        out.status(src, commit, "steward/deploy", state, &text);
        let detail = json!({"version": active, "by_status": by_status});
        out.notify(
            src,
            event,
            json!({"commit": commit, "version": active, "by_status": detail["by_status"]}),
        );
        self.record(src, &[(commit, event, detail)], out).await?;
        settle(seen);
        tracing::info!(environment = %env, commit, version = active, event, counted_by, "commit deploy settled");
        Ok(())
    }

    /// Releases not in their commit's timeline yet, and earlier releases that a newer one
    /// replaced before their deploy settled.
    async fn report_releases(&self, src: &SourceRow, active: i32) -> Result<(), StoreError> {
        let pool = &self.0.pool;
        let env = src.environment_id;
        let mut events = Vec::new();
        let mut out = Outgoing::default();
        for (version, commit) in store::sources::unreported_releases(pool, env).await? {
            out.notify(
                src,
                "released",
                json!({"commit": commit, "version": version}),
            );
            out.status(
                src,
                &commit,
                "steward/deploy",
                State::Pending,
                &format!("version {version} released: deploying"),
            );
            events.push((commit, "released", json!({"version": version})));
        }
        let unsettled = store::sources::unsettled_releases(pool, env, active).await?;
        let just_released = events
            .iter()
            .filter(|(_, _, d)| d["version"] != json!(active))
            .map(|(c, _, d)| (d["version"].as_i64().unwrap_or(0) as i32, c.clone()))
            .collect::<Vec<_>>();
        for (version, commit) in unsettled.into_iter().chain(just_released) {
            let text = format!("replaced by version {active} before its deploy finished");
            out.notify(
                src,
                "replaced",
                json!({"commit": commit, "version": version, "by_version": active}),
            );
            out.status(src, &commit, "steward/deploy", State::Error, &text);
            events.push((
                commit,
                "replaced",
                json!({"version": version, "by_version": active}),
            ));
        }
        if events.is_empty() {
            return Ok(());
        }
        let refs: Vec<(&str, &str, serde_json::Value)> = events
            .iter()
            .map(|(c, e, d)| (c.as_str(), *e, d.clone()))
            .collect();
        self.record(src, &refs, out).await
    }

    /// Write timeline events and the messages they cause in one transaction.
    pub(super) async fn record(
        &self,
        src: &SourceRow,
        events: &[(&str, &str, serde_json::Value)],
        out: Outgoing,
    ) -> Result<(), StoreError> {
        let env = src.environment_id;
        let mut tx = self.0.pool.begin().await?;
        self.check_fence(env, &mut tx).await?;
        for (commit, event, detail) in events {
            store::sources::add_event(&mut *tx, env, commit, event, detail.clone()).await?;
        }
        let queued = out.write(&mut tx, env).await?;
        tx.commit().await?;
        if queued {
            self.0.feedback.wake();
        }
        Ok(())
    }
}
