//! Persistence of a scheduler: rows from and to the database, the writer task that applies
//! batches in order (retrying while the database is away), and synthetic results.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use super::EnvScheduler;
use crate::executor::protocol::{Change, Outcome, WorkResult};
use crate::scheduler::model::{Blocked, Compliance, RState};
use crate::scheduler::queue::TaskKey;
use crate::store::deploy::{Batch, StateRow};
use crate::store::leases::Fence;
use crate::store::{self, actions::ActionRecord};

/// A stored outcome (its `as_str`); None for one this build does not know.
pub(in crate::scheduler) fn parse_outcome(s: &str) -> Option<Outcome> {
    [
        Outcome::Deployed,
        Outcome::Failed,
        Outcome::Skipped,
        Outcome::SkippedForDependency,
        Outcome::Unavailable,
        Outcome::TimedOut,
        Outcome::Dry,
    ]
    .into_iter()
    .find(|o| o.as_str() == s)
}

/// The state a stored row says (its text moved, not copied: a start takes 100,000).
pub(in crate::scheduler) fn state_from_row(row: StateRow) -> RState {
    RState {
        compliance: Compliance::parse(&row.compliance),
        last_run: crate::scheduler::model::LastRun::parse(&row.last_run),
        last_result: row.last_result.as_deref().and_then(parse_outcome),
        last_message: row.last_message,
        blocked: Blocked::parse(&row.blocked),
        blocked_reason: row.blocked_reason,
        last_run_hash: row.last_run_hash,
        last_attempt: row.last_attempt,
        last_deployed: row.last_deployed,
        last_success: row.last_success,
        last_produced_events: row.last_produced_events,
        last_change: None,
        failure_count: row.failure_count.max(0) as u32,
        next_retry: row.next_retry,
    }
}

/// Which resources have a `resource_state` row, as far as the scheduler knows: where none
/// exists, a row that says nothing a missing one does not ([`StateRow::reads_as_missing`]:
/// a new, defined resource that did not run) is not written. A release of 10,000 new
/// resources then writes each one's row once, when its deploy starts or ends, instead of
/// also at the release (the release's 10,000 upserts were a quarter of a first deploy's
/// writes). Rows appear only through this scheduler's writer while it holds the
/// environment, so what it saw at its start and what it wrote since is the whole story.
#[derive(Debug, Default)]
pub(in crate::scheduler) struct StoredRows {
    /// Resources of the model that have no row.
    missing: HashSet<String>,
    /// Resources outside the model that have one (orphans), when known. One that comes
    /// back finds its old row (orphaned, with its old results) and must write over it.
    /// None (a start from a snapshot, which holds only the model's rows): not known, and
    /// every resource that comes is written as before.
    orphans: Option<HashSet<String>>,
}

impl StoredRows {
    pub(in crate::scheduler) fn known(
        missing: HashSet<String>,
        orphans: Option<HashSet<String>>,
    ) -> Self {
        StoredRows { missing, orphans }
    }

    /// `id` left the model: its row stays as an orphan's. True when it had none: the caller
    /// writes one ([`orphan_row`]), so that the versions it was in show it orphaned, as
    /// they show every removed resource.
    pub(super) fn removed(&mut self, id: &str) -> bool {
        let had_none = self.missing.remove(id);
        if let Some(o) = &mut self.orphans {
            o.insert(id.to_string());
        }
        had_none
    }

    /// `id` came into the model.
    pub(super) fn added(&mut self, id: &str) {
        if let Some(o) = &mut self.orphans
            && !o.remove(id)
        {
            self.missing.insert(id.to_string());
        }
    }

    pub(super) fn is_missing(&self, id: &str) -> bool {
        self.missing.contains(id)
    }

    /// Whether `row` is to be written; once it is, its resource has a row.
    fn worth_writing(&mut self, row: &StateRow) -> bool {
        if self.missing.contains(&row.resource_id) {
            if row.reads_as_missing() {
                return false;
            }
            self.missing.remove(&row.resource_id);
        }
        true
    }
}

/// The row of `gone`, which leaves the model without one: never run, orphaned after
/// version `after` (the last it was in).
pub(super) fn orphan_row(gone: &crate::scheduler::model::Intent, after: i32) -> StateRow {
    StateRow {
        resource_id: gone.id.clone(),
        agent: gone.agent.clone(),
        intent_version: Some(after),
        intent_hash: Some(gone.hash.clone()),
        undefined: gone.undefined,
        compliance: Compliance::HasUpdate.as_str().into(),
        last_run: crate::scheduler::model::LastRun::New.as_str().into(),
        blocked: Blocked::NotBlocked.as_str().into(),
        orphaned_after: Some(after),
        ..Default::default()
    }
}

/// How far a scheduler's writer got: the batches it wrote (counted as they were handed to
/// it), and whether each was written as it was handed over (not row by row after a refusal,
/// not after another scheduler took over). What the scheduler knew when it had handed over
/// its `n`th batch is what the database holds once `batches >= n` while `exact` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::scheduler) struct Written {
    pub batches: u64,
    pub exact: bool,
}

impl Default for Written {
    fn default() -> Written {
        Written {
            batches: 0,
            exact: true,
        }
    }
}

/// Write batches in order; retry while the database is away (nothing is dropped). How far
/// it got, and whether every batch was written as it was handed over, it tells on `written`.
pub(super) async fn writer(
    pool: PgPool,
    env: Uuid,
    mut rx: mpsc::UnboundedReceiver<Batch>,
    fence: Option<Fence>,
    notifier: crate::events::Notifier,
    written: watch::Sender<Written>,
) {
    let fence = fence.as_ref();
    // this scheduler's epoch: from now on, an older scheduler of the environment (one that
    // outlived its server) can no longer write
    let mut delay = Duration::from_millis(200);
    let epoch = loop {
        match store::deploy::claim_epoch(&pool, env).await {
            Ok(e) => break e,
            Err(e) => {
                tracing::warn!(environment = %env, error = %e, "claiming the scheduler epoch failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    };
    while let Some(mut batch) = rx.recv().await {
        let mut handed = 1;
        // merge what queued up meanwhile into one transaction
        while let Ok(more) = rx.try_recv() {
            handed += 1;
            // a later batch's row is of a resource back in the model: it clears an earlier
            // batch's orphan mark, which would win otherwise (the marks are written after
            // the rows; a later mark after an earlier row wins, as it should)
            if !batch.orphaned.is_empty() && !more.states.is_empty() {
                let back: HashSet<&str> =
                    more.states.iter().map(|s| s.resource_id.as_str()).collect();
                batch
                    .orphaned
                    .retain(|m| !back.contains(m.resource_id.as_str()));
            }
            batch.states.extend(more.states);
            batch.actions.extend(more.actions);
            batch.orphaned.extend(more.orphaned);
            batch.dryrun_results.extend(more.dryrun_results);
            batch.facts.extend(more.facts);
            if more.progress.is_some() {
                batch.progress = more.progress;
            }
        }
        // later rows win: one row per resource, per action (start then end), per dry-run result
        let mut seen = HashSet::new();
        batch.states.reverse();
        batch.states.retain(|s| seen.insert(s.resource_id.clone()));
        let mut seen = HashSet::new();
        batch.actions.reverse();
        batch.actions.retain(|a| seen.insert(a.id));
        let mut seen = HashSet::new();
        batch.dryrun_results.reverse();
        batch
            .dryrun_results
            .retain(|r| seen.insert((r.0, r.1.clone())));
        let mut delay = Duration::from_millis(200);
        let mut refused = 0;
        loop {
            let began = std::time::Instant::now();
            let r = write_fenced(&pool, env, epoch, fence, &batch).await;
            match r {
                Ok(facts) => {
                    tracing::debug!(environment = %env, states = batch.states.len(), actions = batch.actions.len(), took_ms = began.elapsed().as_secs_f64() * 1000.0, "deploy state written");
                    written.send_modify(|w| w.batches += handed);
                    // facts are told once stored: a recompile may follow them
                    if !facts.changed.is_empty() || !facts.resolved_versions.is_empty() {
                        notifier.send(crate::events::Event::facts(
                            env,
                            facts.resolved_versions,
                            facts.changed,
                            false,
                        ));
                    }
                    break;
                }
                Err(Fenced::Out) => {
                    tracing::error!(
                        environment = %env, epoch,
                        "another scheduler took over this environment; this one writes no more"
                    );
                    written.send_modify(|w| w.exact = false);
                    return;
                }
                Err(Fenced::Store(e)) => match e {
                    // the database is away: wait for it, however long it takes
                    e @ store::StoreError::Unavailable(_) => {
                        tracing::warn!(environment = %env, error = %e, "writing deploy state failed; retrying");
                    }
                    // the database refuses the batch (a row it cannot take, the environment
                    // deleted, a full disk): a few tries, then row by row, so that one bad row
                    // costs that row and not the whole batch
                    e => {
                        refused += 1;
                        if refused >= 5 {
                            tracing::error!(
                                environment = %env, error = %e, states = batch.states.len(), actions = batch.actions.len(),
                                "the database refuses this deploy state; writing it row by row"
                            );
                            let facts = write_row_by_row(&pool, env, epoch, fence, batch).await;
                            written.send_modify(|w| {
                                w.batches += handed;
                                w.exact = false;
                            });
                            // the facts that were stored are told, as after a batch
                            if !facts.changed.is_empty() || !facts.resolved_versions.is_empty() {
                                notifier.send(crate::events::Event::facts(
                                    env,
                                    facts.resolved_versions,
                                    facts.changed,
                                    false,
                                ));
                            }
                            break;
                        }
                        tracing::warn!(environment = %env, error = %e, "writing deploy state failed; retrying");
                    }
                },
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

/// One row per transaction: what can be written is; a refused action is written again as a
/// record of the refusal, a refused state row with the refusal as its message; what is
/// refused even then is counted and alarmed. Returns what the facts that were stored changed.
async fn write_row_by_row(
    pool: &PgPool,
    env: Uuid,
    epoch: i64,
    fence: Option<&Fence>,
    batch: Batch,
) -> store::facts::SetOutcome {
    async fn one(
        pool: &PgPool,
        env: Uuid,
        epoch: i64,
        fence: Option<&Fence>,
        b: &Batch,
    ) -> Result<store::facts::SetOutcome, store::StoreError> {
        match write_fenced(pool, env, epoch, fence, b).await {
            Ok(facts) => Ok(facts),
            Err(Fenced::Out) => Err(store::StoreError::Conflict(
                "fenced: another scheduler took over".into(),
            )),
            Err(Fenced::Store(e)) => Err(e),
        }
    }
    let lost = |what: &str, id: &str, e: &store::StoreError| {
        store::deploy::UNSTORED_ROWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(environment = %env, id, error = %e, "a {what} could not be stored at all");
    };
    for mut state in batch.states {
        let b = Batch {
            states: vec![state.clone()],
            ..Default::default()
        };
        if let Err(e) = one(pool, env, epoch, fence, &b).await {
            state.last_message = Some(format!(
                "the deploy state could not be stored as reported: {e}"
            ));
            state.blocked_reason = None;
            let b = Batch {
                states: vec![state.clone()],
                ..Default::default()
            };
            if let Err(e) = one(pool, env, epoch, fence, &b).await {
                lost("deploy state", &state.resource_id, &e);
            }
        }
    }
    for mut action in batch.actions {
        let b = Batch {
            actions: vec![action.clone()],
            ..Default::default()
        };
        if let Err(e) = one(pool, env, epoch, fence, &b).await {
            store::deploy::UNSTORED_ROWS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            action.changes = serde_json::json!({});
            action.messages = serde_json::json!([{
                "level": "error", "at": Utc::now(), "fields": {},
                "message": format!("the handler's report could not be stored: {e}"),
            }]);
            let b = Batch {
                actions: vec![action.clone()],
                ..Default::default()
            };
            if let Err(e) = one(pool, env, epoch, fence, &b).await {
                lost("resource action", &action.id.to_string(), &e);
            }
        }
    }
    for result in batch.dryrun_results {
        let id = result.1.clone();
        let b = Batch {
            dryrun_results: vec![result],
            ..Default::default()
        };
        if let Err(e) = one(pool, env, epoch, fence, &b).await {
            lost("dry-run result", &id, &e);
        }
    }
    let mut stored = store::facts::SetOutcome::default();
    for fact in batch.facts {
        let id = format!("{} {}", fact.resource_id, fact.name);
        let b = Batch {
            facts: vec![fact],
            ..Default::default()
        };
        match one(pool, env, epoch, fence, &b).await {
            Ok(out) => {
                stored.changed.extend(out.changed);
                stored.resolved_versions.extend(out.resolved_versions);
            }
            Err(e) => lost("fact", &id, &e),
        }
    }
    let rest = Batch {
        orphaned: batch.orphaned,
        progress: batch.progress,
        ..Default::default()
    };
    if !rest.is_empty()
        && let Err(e) = one(pool, env, epoch, fence, &rest).await
    {
        lost("progress marker", "", &e);
    }
    stored
}

enum Fenced {
    /// a newer scheduler holds the environment
    Out,
    Store(store::StoreError),
}

/// Write a batch in one transaction, if this scheduler still holds the environment: its
/// epoch, and (with replicas) its replica's lease tenure.
async fn write_fenced(
    pool: &PgPool,
    env: Uuid,
    epoch: i64,
    fence: Option<&Fence>,
    batch: &Batch,
) -> Result<store::facts::SetOutcome, Fenced> {
    let mut tx = pool.begin().await.map_err(|e| Fenced::Store(e.into()))?;
    if let Some(f) = fence {
        match f.check(&mut tx).await {
            Ok(()) => {}
            Err(store::StoreError::Fenced(_)) => return Err(Fenced::Out),
            Err(e) => return Err(Fenced::Store(e)),
        }
    }
    if !store::deploy::holds_epoch(&mut tx, env, epoch)
        .await
        .map_err(Fenced::Store)?
    {
        return Err(Fenced::Out);
    }
    let facts = store::deploy::write_batch(&mut tx, env, batch)
        .await
        .map_err(Fenced::Store)?;
    tx.commit().await.map_err(|e| Fenced::Store(e.into()))?;
    Ok(facts)
}

pub(super) fn synthetic(
    action_id: Uuid,
    outcome: Outcome,
    message: &str,
    started: DateTime<Utc>,
) -> WorkResult {
    let now = Utc::now();
    WorkResult {
        action_id,
        outcome,
        change: Change::Nochange,
        changes: Default::default(),
        messages: vec![crate::executor::protocol::LogLine {
            level: if matches!(outcome, Outcome::SkippedForDependency) {
                "info".into()
            } else {
                "error".into()
            },
            message: message.to_string(),
            fields: Default::default(),
            at: now,
        }],
        started_at: started,
        finished_at: now,
        state: None,
        facts: Vec::new(),
    }
}

pub(super) fn action_record(
    env: Uuid,
    version: i32,
    rid: &str,
    action: &str,
    res: &WorkResult,
) -> ActionRecord {
    ActionRecord {
        id: res.action_id,
        environment_id: env,
        version,
        resource_id: rid.to_string(),
        action: action.into(),
        started_at: res.started_at,
        finished_at: Some(res.finished_at),
        status: res.outcome.as_str().into(),
        change: res.change.as_str().into(),
        changes: serde_json::to_value(&res.changes).unwrap_or_default(),
        messages: serde_json::to_value(&res.messages).unwrap_or_default(),
    }
}

impl EnvScheduler {
    /// Remember to persist the state of resource `r`.
    pub(super) fn mark_state(&mut self, r: usize) {
        self.dirty_states.insert(self.model.intents[r].id.clone());
    }

    pub(super) fn state_row(&self, r: usize) -> StateRow {
        let i = &self.model.intents[r];
        let s = &self.model.states[r];
        let deploying = self
            .running
            .get(&TaskKey::Deploy(i.id.clone()))
            .filter(|x| x.deploys_now())
            .map(|x| x.started);
        StateRow {
            resource_id: i.id.clone(),
            agent: i.agent.clone(),
            intent_version: self.model.version,
            intent_hash: Some(i.hash.clone()),
            undefined: i.undefined,
            compliance: s.compliance.as_str().into(),
            last_run: s.last_run.as_str().into(),
            last_result: s.last_result.map(|o| o.as_str().to_string()),
            last_message: s.last_message.clone(),
            blocked: s.blocked.as_str().into(),
            blocked_reason: s.blocked_reason.clone(),
            last_run_hash: s.last_run_hash.clone(),
            last_attempt: s.last_attempt,
            last_deployed: s.last_deployed,
            last_success: s.last_success,
            last_produced_events: s.last_produced_events,
            failure_count: s.failure_count as i32,
            next_retry: s.next_retry,
            deploying_since: deploying,
            orphaned_after: None,
        }
    }

    /// Hand pending writes to the writer.
    pub(super) fn flush(&mut self) {
        let ids: Vec<String> = self.dirty_states.drain().collect();
        for id in ids {
            if let Some(r) = self.model.get(&id) {
                let row = self.state_row(r);
                if self.stored_rows.worth_writing(&row) {
                    self.batch.states.push(row);
                }
            }
        }
        if !self.batch.is_empty() {
            let b = std::mem::take(&mut self.batch);
            if self.writer.send(b).is_ok() {
                self.handed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank(id: &str) -> StateRow {
        StateRow {
            resource_id: id.into(),
            agent: "a".into(),
            intent_version: Some(3),
            intent_hash: Some("h".into()),
            compliance: "has_update".into(),
            last_run: "new".into(),
            blocked: "not_blocked".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_fresh_defined_state_reads_as_no_row_and_anything_more_does_not() {
        let row = blank("r");
        assert!(row.reads_as_missing());
        // a start given no row takes a fresh state: the same as it takes from this row
        assert_eq!(state_from_row(row.clone()), RState::fresh(false));
        let now = Utc::now();
        let changed: Vec<(&str, StateRow)> = vec![
            (
                "undefined",
                StateRow {
                    undefined: true,
                    ..row.clone()
                },
            ),
            (
                "compliance",
                StateRow {
                    compliance: "compliant".into(),
                    ..row.clone()
                },
            ),
            (
                "last_run",
                StateRow {
                    last_run: "success".into(),
                    ..row.clone()
                },
            ),
            (
                "blocked",
                StateRow {
                    blocked: "blocked".into(),
                    ..row.clone()
                },
            ),
            (
                "failure_count",
                StateRow {
                    failure_count: 1,
                    ..row.clone()
                },
            ),
            (
                "last_result",
                StateRow {
                    last_result: Some("deployed".into()),
                    ..row.clone()
                },
            ),
            (
                "last_message",
                StateRow {
                    last_message: Some("m".into()),
                    ..row.clone()
                },
            ),
            (
                "blocked_reason",
                StateRow {
                    blocked_reason: Some("b".into()),
                    ..row.clone()
                },
            ),
            (
                "last_run_hash",
                StateRow {
                    last_run_hash: Some("h".into()),
                    ..row.clone()
                },
            ),
            (
                "last_attempt",
                StateRow {
                    last_attempt: Some(now),
                    ..row.clone()
                },
            ),
            (
                "last_deployed",
                StateRow {
                    last_deployed: Some(now),
                    ..row.clone()
                },
            ),
            (
                "last_success",
                StateRow {
                    last_success: Some(now),
                    ..row.clone()
                },
            ),
            (
                "last_produced_events",
                StateRow {
                    last_produced_events: Some(now),
                    ..row.clone()
                },
            ),
            (
                "next_retry",
                StateRow {
                    next_retry: Some(now),
                    ..row.clone()
                },
            ),
            (
                "deploying_since",
                StateRow {
                    deploying_since: Some(now),
                    ..row.clone()
                },
            ),
            (
                "orphaned_after",
                StateRow {
                    orphaned_after: Some(2),
                    ..row.clone()
                },
            ),
        ];
        for (field, r) in changed {
            assert!(
                !r.reads_as_missing(),
                "a row with {field} set reads as no row"
            );
        }
    }

    #[test]
    fn only_a_resource_known_to_have_no_row_skips_a_blank_one() {
        // started from the database: "kept" has a row, "old" is an orphan's
        let mut rows =
            StoredRows::known(["new".to_string()].into(), Some(["old".to_string()].into()));
        assert!(!rows.worth_writing(&blank("new")), "no row, nothing to say");
        assert!(
            rows.worth_writing(&blank("kept")),
            "a row exists: written over"
        );
        // an orphan that comes back must write over its old row
        rows.added("old");
        assert!(rows.worth_writing(&blank("old")));
        // a resource that never had a row comes and goes (its orphan row is written: the
        // caller is told) and comes again: it then has a row to write over
        rows.added("fresh");
        assert!(!rows.worth_writing(&blank("fresh")));
        assert!(
            rows.removed("fresh"),
            "a rowless resource left without its orphan row"
        );
        rows.added("fresh");
        assert!(rows.worth_writing(&blank("fresh")));
        // once something is written, it has a row: a blank one later is written too
        let started = StateRow {
            deploying_since: Some(Utc::now()),
            ..blank("new")
        };
        assert!(rows.worth_writing(&started));
        assert!(rows.worth_writing(&blank("new")));
        // leaving with a row makes it an orphan
        assert!(!rows.removed("new"));
        rows.added("new");
        assert!(rows.worth_writing(&blank("new")));
        // where orphans are not known (a start from a snapshot), whatever comes is written
        let mut unknown = StoredRows::known(Default::default(), None);
        unknown.added("x");
        assert!(unknown.worth_writing(&blank("x")));
    }
}
