//! What the scheduler persists: per-resource deploy state, its progress through versions,
//! agents, dry-runs. Writes come in batches (one transaction, array parameters).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::Result;
use super::actions::ActionRecord;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct StateRow {
    pub resource_id: String,
    pub agent: String,
    pub intent_version: Option<i32>,
    pub intent_hash: Option<String>,
    pub undefined: bool,
    pub compliance: String,
    pub last_run: String,
    pub last_result: Option<String>,
    pub last_message: Option<String>,
    pub blocked: String,
    pub blocked_reason: Option<String>,
    pub last_run_hash: Option<String>,
    pub last_attempt: Option<DateTime<Utc>>,
    pub last_deployed: Option<DateTime<Utc>>,
    pub last_success: Option<DateTime<Utc>>,
    pub last_produced_events: Option<DateTime<Utc>>,
    pub failure_count: i32,
    pub next_retry: Option<DateTime<Utc>>,
    pub deploying_since: Option<DateTime<Utc>>,
    pub orphaned_after: Option<i32>,
}

impl StateRow {
    /// Whether every reader of `resource_state` reads this row as it reads no row at all
    /// (the defaults of [`super::state`]'s COALESCEs and of a scheduler's start: a fresh
    /// state): a defined resource that never ran, is not blocked, not deploying, not
    /// orphaned. The columns only the scheduler reads back for a blocked row (`agent`,
    /// `intent_*`) do not count. A scheduler need not write such a row where none exists.
    pub fn reads_as_missing(&self) -> bool {
        !self.undefined
            && self.compliance == "has_update"
            && self.last_run == "new"
            && self.blocked == "not_blocked"
            && self.failure_count == 0
            && self.last_result.is_none()
            && self.last_message.is_none()
            && self.blocked_reason.is_none()
            && self.last_run_hash.is_none()
            && self.last_attempt.is_none()
            && self.last_deployed.is_none()
            && self.last_success.is_none()
            && self.last_produced_events.is_none()
            && self.next_retry.is_none()
            && self.deploying_since.is_none()
            && self.orphaned_after.is_none()
    }
}

const STATE_COLUMNS: &str = "resource_id, agent, intent_version, intent_hash, undefined, compliance, last_run, last_result, \
     last_message, blocked, blocked_reason, last_run_hash, last_attempt, last_deployed, last_success, \
     last_produced_events, failure_count, next_retry, deploying_since, orphaned_after";

pub async fn load_states(e: impl PgExecutor<'_>, env: Uuid) -> Result<HashMap<String, StateRow>> {
    let sql = format!("SELECT {STATE_COLUMNS} FROM resource_state WHERE environment_id = $1");
    let rows = sqlx::query_as::<_, StateRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .fetch_all(e)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.resource_id.clone(), r))
        .collect())
}

/// The resources of `env` that have a state row.
pub async fn state_ids(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT resource_id FROM resource_state WHERE environment_id = $1")
            .bind(env)
            .fetch_all(e)
            .await?,
    )
}

pub async fn load_progress(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<i32>> {
    let v: Option<Option<i32>> = sqlx::query_scalar(
        "SELECT processed_version FROM scheduler_progress WHERE environment_id = $1",
    )
    .bind(env)
    .fetch_optional(e)
    .await?;
    Ok(v.flatten())
}

/// A removed resource whose delete on its target (`delete_removed_resources`) was decided
/// and has not run: its orphan mark says so ([`OrphanMark::delete_pending`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PendingDelete {
    pub resource_id: String,
    /// The last version that held it: the intent its delete is made with.
    pub after: i32,
    /// The resource as that version has it; None when the version is gone (a span of an
    /// older version may still cover it, but not that version's handler code).
    pub resource: Option<super::versions::ResourceDigestRow>,
}

/// The resources of `env` whose delete is pending, each with the resource as the version
/// it was orphaned after holds it.
pub async fn pending_deletes(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<PendingDelete>> {
    type Row = (
        String,
        i32,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<Vec<String>>,
        Option<bool>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT s.resource_id, s.orphaned_after, r.resource_type, r.agent, r.hash, r.requires, r.undefined \
         FROM resource_state s LEFT JOIN resource_spans r ON r.environment_id = s.environment_id \
         AND r.resource_id = s.resource_id AND r.first_version <= s.orphaned_after AND r.last_version >= s.orphaned_after \
         AND EXISTS (SELECT 1 FROM versions v WHERE v.environment_id = s.environment_id AND v.number = s.orphaned_after) \
         WHERE s.environment_id = $1 AND s.delete_pending AND s.orphaned_after IS NOT NULL \
         ORDER BY s.resource_id",
    )
    .bind(env)
    .fetch_all(e)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(resource_id, after, rtype, agent, hash, requires, undefined)| {
                let resource = match (rtype, agent, hash) {
                    (Some(resource_type), Some(agent), Some(hash)) => {
                        Some(super::versions::ResourceDigestRow {
                            resource_id: resource_id.clone(),
                            resource_type,
                            agent,
                            hash,
                            requires: requires.unwrap_or_default(),
                            undefined: undefined.unwrap_or(false),
                        })
                    }
                    _ => None,
                };
                PendingDelete {
                    resource_id,
                    after,
                    resource,
                }
            },
        )
        .collect())
}

/// The versions that pending deletes of `env` take their intent from: kept while they wait.
pub async fn versions_pending_deletes_need(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<i32>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT orphaned_after FROM resource_state \
         WHERE environment_id = $1 AND delete_pending AND orphaned_after IS NOT NULL ORDER BY 1",
    )
    .bind(env)
    .fetch_all(e)
    .await?)
}

/// Deploys in flight when the scheduler stopped are forgotten (their resources redeploy) and
/// their open action records are closed as interrupted, so the log tells what happened.
pub async fn clear_leases(pool: &sqlx::PgPool, env: Uuid) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let r = sqlx::query("UPDATE resource_state SET deploying_since = NULL WHERE environment_id = $1 AND deploying_since IS NOT NULL")
        .bind(env)
        .execute(&mut *tx)
        .await?;
    super::changes::notify(&mut *tx, env).await?;
    let note = serde_json::json!([{
        "level": "warning",
        "message": "the scheduler stopped while this action ran; the resource is deployed again",
        "fields": {}, "at": Utc::now()
    }]);
    sqlx::query(
        "UPDATE resource_actions SET finished_at = now(), status = 'interrupted', messages = messages || $2 \
         WHERE environment_id = $1 AND finished_at IS NULL",
    )
    .bind(env)
    .bind(note)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(r.rows_affected())
}

/// Deploy-state rows the database refused even one by one (they were replaced by a record
/// of the refusal, or, if that failed too, lost): shown in `/metrics`, alarmed in the log.
pub static UNSTORED_ROWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A resource removed from the model: its row says `orphaned_after`, the last version
/// that held it, and whether its delete on its target (`delete_removed_resources`) is still
/// to be done. The mark is written again, not pending, once that delete ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanMark {
    pub resource_id: String,
    pub after: i32,
    pub delete_pending: bool,
}

/// Everything the scheduler has to write, applied in one transaction.
#[derive(Debug, Default)]
pub struct Batch {
    pub states: Vec<StateRow>,
    pub actions: Vec<ActionRecord>,
    /// Resources removed from the model, in the order they were marked (a later mark of a
    /// resource wins).
    pub orphaned: Vec<OrphanMark>,
    pub progress: Option<i32>,
    pub dryrun_results: Vec<(Uuid, String, String, serde_json::Value, serde_json::Value)>,
    /// Facts handlers reported (`ctx.set_fact`, a refresh).
    pub facts: Vec<super::facts::NewParam>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
            && self.facts.is_empty()
            && self.actions.is_empty()
            && self.orphaned.is_empty()
            && self.progress.is_none()
            && self.dryrun_results.is_empty()
    }
}

/// Take a new epoch for the scheduler of `env` (fencing out any earlier one).
pub async fn claim_epoch(e: impl PgExecutor<'_>, env: Uuid) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "INSERT INTO scheduler_progress (environment_id, epoch) VALUES ($1, 1) \
         ON CONFLICT (environment_id) DO UPDATE SET epoch = scheduler_progress.epoch + 1 RETURNING epoch",
    )
    .bind(env)
    .fetch_one(e)
    .await?)
}

/// Is `epoch` still the epoch of `env`'s scheduler? Locks the row until the transaction
/// ends, so no newer scheduler can take over halfway through a batch.
pub async fn holds_epoch(c: &mut PgConnection, env: Uuid, epoch: i64) -> Result<bool> {
    let current: Option<i64> = sqlx::query_scalar(
        "SELECT epoch FROM scheduler_progress WHERE environment_id = $1 FOR SHARE",
    )
    .bind(env)
    .fetch_optional(&mut *c)
    .await?;
    Ok(current == Some(epoch))
}

/// Write a batch; what its facts changed (to tell, once committed).
pub async fn write_batch(
    c: &mut PgConnection,
    env: Uuid,
    b: &Batch,
) -> Result<super::facts::SetOutcome> {
    // followers (console pages) re-read once this commits
    super::changes::notify(&mut *c, env).await?;
    let rows = super::ROWS_PER_STATEMENT;
    for states in b.states.chunks(rows) {
        write_states(&mut *c, env, states).await?;
    }
    for actions in b.actions.chunks(rows) {
        write_actions(&mut *c, env, actions).await?;
    }
    if !b.orphaned.is_empty() {
        // one mark per resource, the last: an UPDATE joined with two rows of one id takes
        // either of them
        let mut seen = std::collections::HashSet::new();
        let marks: Vec<&OrphanMark> = b
            .orphaned
            .iter()
            .rev()
            .filter(|m| seen.insert(m.resource_id.as_str()))
            .collect();
        let ids: Vec<&str> = marks.iter().map(|m| m.resource_id.as_str()).collect();
        let after: Vec<i32> = marks.iter().map(|m| m.after).collect();
        let pending: Vec<bool> = marks.iter().map(|m| m.delete_pending).collect();
        sqlx::query(
            "UPDATE resource_state s SET orphaned_after = u.after, delete_pending = u.pending, deploying_since = NULL, \
             updated_at = now() FROM unnest($2::text[], $3::int[], $4::bool[]) AS u(rid, after, pending) \
             WHERE s.environment_id = $1 AND s.resource_id = u.rid",
        )
        .bind(env)
        .bind(&ids)
        .bind(&after)
        .bind(&pending)
        .execute(&mut *c)
        .await?;
    }
    if !b.dryrun_results.is_empty() {
        let ids: Vec<Uuid> = b.dryrun_results.iter().map(|r| r.0).collect();
        let rids: Vec<&str> = b.dryrun_results.iter().map(|r| r.1.as_str()).collect();
        let outcomes: Vec<&str> = b.dryrun_results.iter().map(|r| r.2.as_str()).collect();
        let changes: Vec<&serde_json::Value> = b.dryrun_results.iter().map(|r| &r.3).collect();
        let messages: Vec<&serde_json::Value> = b.dryrun_results.iter().map(|r| &r.4).collect();
        sqlx::query(
            "INSERT INTO dryrun_results (dryrun_id, resource_id, outcome, changes, messages) \
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[]) \
             ON CONFLICT (dryrun_id, resource_id) DO UPDATE SET outcome = EXCLUDED.outcome, changes = EXCLUDED.changes, \
             messages = EXCLUDED.messages",
        )
        .bind(&ids)
        .bind(&rids)
        .bind(&outcomes)
        .bind(&changes)
        .bind(&messages)
        .execute(&mut *c)
        .await?;
        sqlx::query(
            "UPDATE dryruns d SET done = (SELECT count(*) FROM dryrun_results r WHERE r.dryrun_id = d.id), \
             finished_at = CASE WHEN (SELECT count(*) FROM dryrun_results r WHERE r.dryrun_id = d.id) >= d.total THEN now() ELSE NULL END \
             WHERE d.id = ANY($1)",
        )
        .bind(&ids)
        .execute(&mut *c)
        .await?;
    }
    if let Some(v) = b.progress {
        sqlx::query(
            "INSERT INTO scheduler_progress (environment_id, processed_version) VALUES ($1, $2) \
             ON CONFLICT (environment_id) DO UPDATE SET processed_version = EXCLUDED.processed_version, updated_at = now()",
        )
        .bind(env)
        .bind(v)
        .execute(&mut *c)
        .await?;
    }
    if b.facts.is_empty() {
        return Ok(super::facts::SetOutcome::default());
    }
    super::facts::set_many(&mut *c, env, &b.facts).await
}

/// Insert or update resource states.
async fn write_states(c: &mut PgConnection, env: Uuid, states: &[StateRow]) -> Result<()> {
    let col = |f: &dyn Fn(&StateRow) -> Option<String>| -> Vec<Option<String>> {
        states.iter().map(f).collect()
    };
    let ids: Vec<&str> = states.iter().map(|s| s.resource_id.as_str()).collect();
    let agents: Vec<&str> = states.iter().map(|s| s.agent.as_str()).collect();
    let iv: Vec<Option<i32>> = states.iter().map(|s| s.intent_version).collect();
    let ih = col(&|s| s.intent_hash.clone());
    let undef: Vec<bool> = states.iter().map(|s| s.undefined).collect();
    let compliance: Vec<&str> = states.iter().map(|s| s.compliance.as_str()).collect();
    let last_run: Vec<&str> = states.iter().map(|s| s.last_run.as_str()).collect();
    let last_result = col(&|s| s.last_result.clone());
    let last_message = col(&|s| s.last_message.clone());
    let blocked: Vec<&str> = states.iter().map(|s| s.blocked.as_str()).collect();
    let blocked_reason = col(&|s| s.blocked_reason.clone());
    let last_run_hash = col(&|s| s.last_run_hash.clone());
    let ts = |f: &dyn Fn(&StateRow) -> Option<DateTime<Utc>>| -> Vec<Option<DateTime<Utc>>> {
        states.iter().map(f).collect()
    };
    let failures: Vec<i32> = states.iter().map(|s| s.failure_count).collect();
    let orphaned: Vec<Option<i32>> = states.iter().map(|s| s.orphaned_after).collect();
    sqlx::query(
        "INSERT INTO resource_state (environment_id, resource_id, agent, intent_version, intent_hash, undefined, compliance, \
         last_run, last_result, last_message, blocked, blocked_reason, last_run_hash, last_attempt, last_deployed, last_success, \
         last_produced_events, failure_count, next_retry, deploying_since, orphaned_after, updated_at) \
         SELECT $1, * , now() FROM unnest($2::text[], $3::text[], $4::int[], $5::text[], $6::bool[], $7::text[], $8::text[], \
         $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::timestamptz[], $15::timestamptz[], \
         $16::timestamptz[], $17::timestamptz[], $18::int[], $19::timestamptz[], $20::timestamptz[], $21::int[]) \
         ON CONFLICT (environment_id, resource_id) DO UPDATE SET agent = EXCLUDED.agent, intent_version = EXCLUDED.intent_version, \
         intent_hash = EXCLUDED.intent_hash, undefined = EXCLUDED.undefined, compliance = EXCLUDED.compliance, \
         last_run = EXCLUDED.last_run, last_result = EXCLUDED.last_result, last_message = EXCLUDED.last_message, \
         blocked = EXCLUDED.blocked, blocked_reason = EXCLUDED.blocked_reason, last_run_hash = EXCLUDED.last_run_hash, \
         last_attempt = EXCLUDED.last_attempt, last_deployed = EXCLUDED.last_deployed, last_success = EXCLUDED.last_success, \
         last_produced_events = EXCLUDED.last_produced_events, failure_count = EXCLUDED.failure_count, \
         next_retry = EXCLUDED.next_retry, deploying_since = EXCLUDED.deploying_since, \
         orphaned_after = EXCLUDED.orphaned_after, delete_pending = false, updated_at = now()",
    )
    .bind(env)
    .bind(&ids)
    .bind(&agents)
    .bind(&iv)
    .bind(&ih)
    .bind(&undef)
    .bind(&compliance)
    .bind(&last_run)
    .bind(&last_result)
    .bind(&last_message)
    .bind(&blocked)
    .bind(&blocked_reason)
    .bind(&last_run_hash)
    .bind(ts(&|s| s.last_attempt))
    .bind(ts(&|s| s.last_deployed))
    .bind(ts(&|s| s.last_success))
    .bind(ts(&|s| s.last_produced_events))
    .bind(&failures)
    .bind(ts(&|s| s.next_retry))
    .bind(ts(&|s| s.deploying_since))
    .bind(&orphaned)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Insert action records, or complete those already written.
async fn write_actions(c: &mut PgConnection, env: Uuid, actions: &[ActionRecord]) -> Result<()> {
    let a = actions;
    let ids: Vec<Uuid> = a.iter().map(|x| x.id).collect();
    let versions: Vec<i32> = a.iter().map(|x| x.version).collect();
    let rids: Vec<&str> = a.iter().map(|x| x.resource_id.as_str()).collect();
    let kinds: Vec<&str> = a.iter().map(|x| x.action.as_str()).collect();
    let started: Vec<DateTime<Utc>> = a.iter().map(|x| x.started_at).collect();
    let finished: Vec<Option<DateTime<Utc>>> = a.iter().map(|x| x.finished_at).collect();
    let status: Vec<&str> = a.iter().map(|x| x.status.as_str()).collect();
    let change: Vec<&str> = a.iter().map(|x| x.change.as_str()).collect();
    let changes: Vec<&serde_json::Value> = a.iter().map(|x| &x.changes).collect();
    let messages: Vec<&serde_json::Value> = a.iter().map(|x| &x.messages).collect();
    sqlx::query(
        "INSERT INTO resource_actions (environment_id, id, version, resource_id, action, started_at, finished_at, status, \
         change, changes, messages) SELECT $1, * FROM unnest($2::uuid[], $3::int[], $4::text[], $5::text[], \
         $6::timestamptz[], $7::timestamptz[], $8::text[], $9::text[], $10::jsonb[], $11::jsonb[]) \
         ON CONFLICT (id) DO UPDATE SET finished_at = EXCLUDED.finished_at, status = EXCLUDED.status, \
         change = EXCLUDED.change, changes = EXCLUDED.changes, messages = EXCLUDED.messages",
    )
    .bind(env)
    .bind(&ids)
    .bind(&versions)
    .bind(&rids)
    .bind(&kinds)
    .bind(&started)
    .bind(&finished)
    .bind(&status)
    .bind(&change)
    .bind(&changes)
    .bind(&messages)
    .execute(&mut *c)
    .await?;
    Ok(())
}

// ------------------------------------------------------------------------ agents

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
pub struct AgentRow {
    pub name: String,
    pub paused: bool,
    pub unpause_on_resume: bool,
    pub last_seen: Option<DateTime<Utc>>,
}

pub async fn agents(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<AgentRow>> {
    Ok(sqlx::query_as::<_, AgentRow>(
        "SELECT name, paused, unpause_on_resume, last_seen FROM agents WHERE environment_id = $1 ORDER BY name",
    )
    .bind(env)
    .fetch_all(e)
    .await?)
}

pub async fn ensure_agents(e: impl PgExecutor<'_>, env: Uuid, names: &[String]) -> Result<()> {
    sqlx::query("INSERT INTO agents (environment_id, name) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING")
        .bind(env)
        .bind(names)
        .execute(e)
        .await?;
    Ok(())
}

/// Each agent's last finished action result (`deployed`, `failed`, …).
pub async fn last_results_by_agent(
    e: impl PgExecutor<'_>,
    env: Uuid,
) -> Result<std::collections::HashMap<String, String>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT ON (agent) agent, last_result FROM resource_state \
         WHERE environment_id = $1 AND last_result IS NOT NULL AND last_attempt IS NOT NULL \
         ORDER BY agent, last_attempt DESC",
    )
    .bind(env)
    .fetch_all(e)
    .await?;
    Ok(rows.into_iter().collect())
}

pub async fn set_paused(e: impl PgExecutor<'_>, env: Uuid, name: &str, paused: bool) -> Result<()> {
    sqlx::query(
        "INSERT INTO agents (environment_id, name, paused) VALUES ($1, $2, $3) \
         ON CONFLICT (environment_id, name) DO UPDATE SET paused = EXCLUDED.paused \
         RETURNING pg_notify($4, environment_id::text)",
    )
    .bind(env)
    .bind(name)
    .bind(paused)
    .bind(super::changes::CHANNEL)
    .execute(e)
    .await?;
    Ok(())
}

// ------------------------------------------------------------------------ dry-runs

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DryrunRow {
    pub id: Uuid,
    pub version: i32,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub total: i32,
    pub done: i32,
    pub requested_by: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DryrunResult {
    pub resource_id: String,
    pub outcome: String,
    pub changes: serde_json::Value,
    pub messages: serde_json::Value,
}

pub async fn create_dryrun(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
    total: i32,
    by: &str,
) -> Result<Uuid> {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO dryruns (id, environment_id, version, total, requested_by, finished_at) \
         VALUES ($1, $2, $3, $4, $5, CASE WHEN $4 = 0 THEN now() END)",
    )
    .bind(id)
    .bind(env)
    .bind(version)
    .bind(total)
    .bind(by)
    .execute(e)
    .await?;
    Ok(id)
}

pub async fn dryrun(e: impl PgExecutor<'_>, env: Uuid, id: Uuid) -> Result<DryrunRow> {
    sqlx::query_as::<_, DryrunRow>(
        "SELECT id, version, created_at, finished_at, total, done, requested_by FROM dryruns WHERE environment_id = $1 AND id = $2",
    )
    .bind(env)
    .bind(id)
    .fetch_optional(e)
    .await?
    .ok_or_else(|| super::StoreError::NotFound(format!("dry-run {id}")))
}

pub async fn dryrun_results(e: impl PgExecutor<'_>, id: Uuid) -> Result<Vec<DryrunResult>> {
    Ok(sqlx::query_as::<_, DryrunResult>(
        "SELECT resource_id, outcome, changes, messages FROM dryrun_results WHERE dryrun_id = $1 ORDER BY resource_id",
    )
    .bind(id)
    .fetch_all(e)
    .await?)
}

pub async fn dryruns(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<DryrunRow>> {
    Ok(sqlx::query_as::<_, DryrunRow>(
        "SELECT id, version, created_at, finished_at, total, done, requested_by FROM dryruns WHERE environment_id = $1 \
         ORDER BY created_at DESC LIMIT 100",
    )
    .bind(env)
    .fetch_all(e)
    .await?)
}

/// Environments that have a released version (their schedulers start with the server).
pub async fn environments_with_releases(e: impl PgExecutor<'_>) -> Result<Vec<Uuid>> {
    Ok(
        sqlx::query_scalar(
            "SELECT DISTINCT environment_id FROM versions WHERE status = 'released'",
        )
        .fetch_all(e)
        .await?,
    )
}
