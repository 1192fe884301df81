//! Git sources of environments, their compiles (a queue in the database), webhook deliveries
//! and the per-commit event log.
//!
//! Secrets (tokens, SSH key, webhook and notification secrets) are stored here and only here;
//! [`SourceView`] is what the API shows: whether each is set, never its value.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::{Result, StoreError};

#[derive(Clone, sqlx::FromRow)]
pub struct SourceRow {
    pub environment_id: Uuid,
    pub url: String,
    pub branch: String,
    pub path: String,
    pub token: Option<String>,
    pub ssh_key: Option<String>,
    pub known_hosts: Option<String>,
    pub webhook_secret: Option<String>,
    pub poll_interval: i32,
    pub watch: bool,
    pub compile_timeout: i32,
    pub status_kind: String,
    pub status_api_url: Option<String>,
    pub status_repo: Option<String>,
    pub status_token: Option<String>,
    pub notify_url: Option<String>,
    pub notify_secret: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_fetch_at: Option<DateTime<Utc>>,
    pub last_fetch_error: Option<String>,
    pub last_tip: Option<String>,
}

// secrets stay out of logs
impl std::fmt::Debug for SourceRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceRow")
            .field("environment_id", &self.environment_id)
            .field("url", &self.url)
            .field("branch", &self.branch)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A source as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SourceView {
    pub environment_id: Uuid,
    pub url: String,
    pub branch: String,
    pub path: String,
    pub poll_interval: i32,
    pub watch: bool,
    pub compile_timeout: i32,
    pub has_token: bool,
    pub has_ssh_key: bool,
    pub has_known_hosts: bool,
    pub has_webhook_secret: bool,
    pub status_kind: String,
    pub status_api_url: Option<String>,
    pub status_repo: Option<String>,
    pub has_status_token: bool,
    pub notify_url: Option<String>,
    pub has_notify_secret: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub last_fetch_at: Option<DateTime<Utc>>,
    pub last_fetch_error: Option<String>,
    pub last_tip: Option<String>,
}

impl SourceRow {
    pub fn view(&self) -> SourceView {
        SourceView {
            environment_id: self.environment_id,
            // stored URLs carry no credentials; one from before that rule shows none either
            url: crate::model::urls::public_url(&self.url),
            branch: self.branch.clone(),
            path: self.path.clone(),
            poll_interval: self.poll_interval,
            watch: self.watch,
            compile_timeout: self.compile_timeout,
            has_token: self.token.is_some(),
            has_ssh_key: self.ssh_key.is_some(),
            has_known_hosts: self.known_hosts.is_some(),
            has_webhook_secret: self.webhook_secret.is_some(),
            status_kind: self.status_kind.clone(),
            status_api_url: self.status_api_url.clone(),
            status_repo: self.status_repo.clone(),
            has_status_token: self.status_token.is_some(),
            notify_url: self.notify_url.clone(),
            has_notify_secret: self.notify_secret.is_some(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_fetch_at: self.last_fetch_at,
            last_fetch_error: self.last_fetch_error.clone(),
            last_tip: self.last_tip.clone(),
        }
    }
}

/// What a user sets (validated by the API layer).
#[derive(Clone, Default)]
pub struct SourceSpec {
    pub url: String,
    pub branch: String,
    pub path: String,
    pub token: Option<String>,
    pub ssh_key: Option<String>,
    pub known_hosts: Option<String>,
    pub webhook_secret: Option<String>,
    pub poll_interval: i32,
    pub watch: bool,
    pub compile_timeout: i32,
    pub status_kind: String,
    pub status_api_url: Option<String>,
    pub status_repo: Option<String>,
    pub status_token: Option<String>,
    pub notify_url: Option<String>,
    pub notify_secret: Option<String>,
}

const SOURCE_COLUMNS: &str = "environment_id, url, branch, path, token, ssh_key, known_hosts, webhook_secret, \
    poll_interval, watch, compile_timeout, status_kind, status_api_url, status_repo, status_token, notify_url, notify_secret, \
    created_at, updated_at, last_fetch_at, last_fetch_error, last_tip";

pub async fn upsert_source(e: impl PgExecutor<'_>, env: Uuid, s: &SourceSpec) -> Result<()> {
    sqlx::query(
        "INSERT INTO git_sources (environment_id, url, branch, path, token, ssh_key, known_hosts, webhook_secret, \
         poll_interval, compile_timeout, status_kind, status_api_url, status_repo, status_token, notify_url, notify_secret, watch) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
         ON CONFLICT (environment_id) DO UPDATE SET url = EXCLUDED.url, branch = EXCLUDED.branch, path = EXCLUDED.path, \
         token = EXCLUDED.token, ssh_key = EXCLUDED.ssh_key, known_hosts = EXCLUDED.known_hosts, \
         webhook_secret = EXCLUDED.webhook_secret, poll_interval = EXCLUDED.poll_interval, \
         compile_timeout = EXCLUDED.compile_timeout, status_kind = EXCLUDED.status_kind, \
         status_api_url = EXCLUDED.status_api_url, status_repo = EXCLUDED.status_repo, status_token = EXCLUDED.status_token, \
         notify_url = EXCLUDED.notify_url, notify_secret = EXCLUDED.notify_secret, watch = EXCLUDED.watch, updated_at = now(), \
         last_fetch_error = NULL",
    )
    .bind(env)
    .bind(&s.url)
    .bind(&s.branch)
    .bind(&s.path)
    .bind(&s.token)
    .bind(&s.ssh_key)
    .bind(&s.known_hosts)
    .bind(&s.webhook_secret)
    .bind(s.poll_interval)
    .bind(s.compile_timeout)
    .bind(&s.status_kind)
    .bind(&s.status_api_url)
    .bind(&s.status_repo)
    .bind(&s.status_token)
    .bind(&s.notify_url)
    .bind(&s.notify_secret)
    .bind(s.watch)
    .execute(e)
    .await?;
    Ok(())
}

pub async fn get_source(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<SourceRow>> {
    let sql = format!("SELECT {SOURCE_COLUMNS} FROM git_sources WHERE environment_id = $1");
    Ok(sqlx::query_as::<_, SourceRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .fetch_optional(e)
        .await?)
}

pub async fn list_sources(e: impl PgExecutor<'_>) -> Result<Vec<SourceRow>> {
    let sql = format!("SELECT {SOURCE_COLUMNS} FROM git_sources ORDER BY environment_id");
    Ok(sqlx::query_as::<_, SourceRow>(sqlx::AssertSqlSafe(sql))
        .fetch_all(e)
        .await?)
}

pub async fn delete_source(e: impl PgExecutor<'_>, env: Uuid) -> Result<()> {
    let r = sqlx::query("DELETE FROM git_sources WHERE environment_id = $1")
        .bind(env)
        .execute(e)
        .await?;
    if r.rows_affected() == 0 {
        return Err(StoreError::NotFound("git source".into()));
    }
    Ok(())
}

/// The outcome of a fetch: the branch tip, or why it failed.
pub async fn record_fetch(
    e: impl PgExecutor<'_>,
    env: Uuid,
    tip: Option<&str>,
    error: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE git_sources SET last_fetch_at = now(), last_fetch_error = $3, last_tip = COALESCE($2, last_tip) \
         WHERE environment_id = $1",
    )
    .bind(env)
    .bind(tip)
    .bind(error)
    .execute(e)
    .await?;
    Ok(())
}

// ------------------------------------------------------------------------ compiles

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct CompileRow {
    pub id: Uuid,
    pub environment_id: Uuid,
    pub commit: String,
    pub branch: String,
    pub trigger: String,
    pub status: String,
    pub superseded_by: Option<Uuid>,
    pub requested_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub stages: serde_json::Value,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub diagnostics: serde_json::Value,
    pub error: Option<String>,
    pub version: Option<i32>,
}

const COMPILE_COLUMNS: &str = "id, environment_id, commit, branch, trigger, status, superseded_by, requested_at, started_at, \
    finished_at, stages, exit_code, stdout, stderr, diagnostics, error, version";

/// A compile of `commit` that makes another one pointless: queued, running or done well,
/// and, unless `retry_failed` (someone asked for this commit by name), failed too: a commit
/// is compiled once, and the same tree would fail the same way on every poll.
pub async fn existing_compile(
    e: impl PgExecutor<'_>,
    env: Uuid,
    commit: &str,
    retry_failed: bool,
) -> Result<Option<CompileRow>> {
    let sql = format!(
        "SELECT {COMPILE_COLUMNS} FROM compiles WHERE environment_id = $1 AND commit = $2 \
         AND (status IN ('queued', 'running', 'success') OR (status = 'failed' AND NOT $3)) \
         ORDER BY requested_at DESC LIMIT 1"
    );
    Ok(sqlx::query_as::<_, CompileRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(commit)
        .bind(retry_failed)
        .fetch_optional(e)
        .await?)
}

/// The commit of the newest compile of an environment (whatever became of it): where the
/// commits a fetch brings in start.
pub async fn last_compiled_commit(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT commit FROM compiles WHERE environment_id = $1 ORDER BY requested_at DESC LIMIT 1",
    )
    .bind(env)
    .fetch_optional(e)
    .await?)
}

/// Record commits that reached the branch together with a newer one and were never
/// compiled: each gets a finished compile row, `superseded` by `by`, so it leaves a trace.
pub async fn record_skipped(
    c: &mut PgConnection,
    env: Uuid,
    commits: &[String],
    branch: &str,
    trigger: &str,
    by: Uuid,
) -> Result<Vec<Uuid>> {
    let mut ids = Vec::with_capacity(commits.len());
    for commit in commits {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO compiles (id, environment_id, commit, branch, trigger, status, superseded_by, finished_at, error) \
             VALUES ($1, $2, $3, $4, $5, 'superseded', $6, now(), 'a newer commit arrived in the same push or fetch; only the newest is compiled')",
        )
        .bind(id)
        .bind(env)
        .bind(commit)
        .bind(branch)
        .bind(trigger)
        .bind(by)
        .execute(&mut *c)
        .await?;
        ids.push(id);
    }
    Ok(ids)
}

/// Queue a compile of `commit`; queued compiles of older commits are superseded by it (and
/// say so). `fetch_stage` is the fetch that found the commit. Returns its id and the ids it
/// superseded.
pub async fn enqueue(
    c: &mut PgConnection,
    env: Uuid,
    commit: &str,
    branch: &str,
    trigger: &str,
    fetch_stage: serde_json::Value,
) -> Result<(Uuid, Vec<(Uuid, String)>)> {
    let id = Uuid::new_v4();
    let superseded: Vec<(Uuid, String)> = sqlx::query_as(
        "UPDATE compiles SET status = 'superseded', superseded_by = $2, finished_at = now(), \
         error = 'superseded by a newer commit before it started' \
         WHERE environment_id = $1 AND status = 'queued' RETURNING id, commit",
    )
    .bind(env)
    .bind(id)
    .fetch_all(&mut *c)
    .await?;
    sqlx::query(
        "INSERT INTO compiles (id, environment_id, commit, branch, trigger, status, stages) VALUES ($1, $2, $3, $4, $5, 'queued', $6)",
    )
    .bind(id)
    .bind(env)
    .bind(commit)
    .bind(branch)
    .bind(trigger)
    .bind(serde_json::json!([fetch_stage]))
    .execute(&mut *c)
    .await?;
    Ok((id, superseded))
}

/// The oldest queued compile of an environment.
pub async fn next_queued(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<CompileRow>> {
    let sql = format!(
        "SELECT {COMPILE_COLUMNS} FROM compiles WHERE environment_id = $1 AND status = 'queued' ORDER BY requested_at LIMIT 1"
    );
    Ok(sqlx::query_as::<_, CompileRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .fetch_optional(e)
        .await?)
}

/// Mark a queued compile running (false when it is no longer queued: superseded meanwhile).
pub async fn start_compile(e: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let r = sqlx::query("UPDATE compiles SET status = 'running', started_at = now() WHERE id = $1 AND status = 'queued'")
        .bind(id)
        .execute(e)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// The Python environments (`<environment id>/<name>` under python-envs/) that compiles of
/// stored versions used.
pub async fn python_envs_of_stored_versions(e: impl PgExecutor<'_>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT c.python_env FROM compiles c JOIN versions v \
           ON v.environment_id = c.environment_id AND v.number = c.version \
         WHERE c.python_env IS NOT NULL",
    )
    .fetch_all(e)
    .await?)
}

/// How a compile ended.
pub struct CompileEnd<'a> {
    pub success: bool,
    pub stages: &'a serde_json::Value,
    pub exit_code: Option<i32>,
    pub stdout: &'a str,
    pub stderr: &'a str,
    pub diagnostics: &'a serde_json::Value,
    pub error: Option<&'a str>,
    pub version: Option<i32>,
    pub python_env: Option<&'a str>,
}

pub async fn finish_compile(e: impl PgExecutor<'_>, id: Uuid, end: &CompileEnd<'_>) -> Result<()> {
    sqlx::query(
        "UPDATE compiles SET status = $2, finished_at = now(), stages = $3, exit_code = $4, stdout = $5, stderr = $6, \
         diagnostics = $7, error = $8, version = $9, python_env = $10 WHERE id = $1",
    )
    .bind(id)
    .bind(if end.success { "success" } else { "failed" })
    .bind(end.stages)
    .bind(end.exit_code)
    .bind(end.stdout)
    .bind(end.stderr)
    .bind(end.diagnostics)
    .bind(end.error)
    .bind(end.version)
    .bind(end.python_env)
    .execute(e)
    .await?;
    Ok(())
}

/// Note on a running compile the version it stored, in the transaction that stores it. The
/// compile's end is recorded in a later transaction; if that never happens (the server
/// stopped in between, the replica lost the environment), the version is how whoever finds
/// the compile still running knows the commit must not be compiled again.
pub async fn set_compile_version(e: impl PgExecutor<'_>, id: Uuid, version: i32) -> Result<()> {
    sqlx::query("UPDATE compiles SET version = $2 WHERE id = $1")
        .bind(id)
        .bind(version)
        .execute(e)
        .await?;
    Ok(())
}

/// A running compile whose version was stored, ended `success` by [`settle_stored`].
#[derive(Debug, sqlx::FromRow)]
pub struct Settled {
    pub id: Uuid,
    pub environment_id: Uuid,
    pub commit: String,
    pub version: i32,
}

/// End the running compiles (of `env`, or all) whose version was stored but whose end was
/// never recorded: `success`, with a stage that says what happened. Their commits keep the
/// one version they made.
pub async fn settle_stored(c: &mut PgConnection, env: Option<Uuid>) -> Result<Vec<Settled>> {
    Ok(sqlx::query_as(
        "UPDATE compiles SET status = 'success', finished_at = now(), error = NULL, \
           stages = stages || jsonb_build_array(jsonb_build_object( \
             'name', 'recorded', 'started_at', now(), 'ms', 0, 'ok', true, \
             'detail', 'version ' || version || ' was stored; the server that compiled it stopped (or lost the environment) before it recorded the end')) \
         WHERE status = 'running' AND version IS NOT NULL AND ($1::uuid IS NULL OR environment_id = $1) \
         RETURNING id, environment_id, commit, version",
    )
    .bind(env)
    .fetch_all(&mut *c)
    .await?)
}

/// Compiles that were running when the server stopped run again (those whose version was
/// stored are [`settle_stored`] first).
pub async fn requeue_interrupted(e: impl PgExecutor<'_>) -> Result<u64> {
    let r = sqlx::query(
        "UPDATE compiles SET status = 'queued', started_at = NULL \
         WHERE status = 'running' AND version IS NULL",
    )
    .execute(e)
    .await?;
    Ok(r.rows_affected())
}

/// [`requeue_interrupted`] for one environment (its new owner adopting it).
pub async fn requeue_interrupted_of(e: impl PgExecutor<'_>, env: Uuid) -> Result<u64> {
    let r = sqlx::query(
        "UPDATE compiles SET status = 'queued', started_at = NULL \
         WHERE status = 'running' AND version IS NULL AND environment_id = $1",
    )
    .bind(env)
    .execute(e)
    .await?;
    Ok(r.rows_affected())
}

pub async fn list_compiles(
    e: impl PgExecutor<'_>,
    env: Uuid,
    limit: i64,
) -> Result<Vec<CompileRow>> {
    let sql = format!(
        "SELECT {COMPILE_COLUMNS} FROM compiles WHERE environment_id = $1 ORDER BY requested_at DESC LIMIT $2"
    );
    Ok(sqlx::query_as::<_, CompileRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(limit)
        .fetch_all(e)
        .await?)
}

pub async fn get_compile(e: impl PgExecutor<'_>, env: Uuid, id: Uuid) -> Result<CompileRow> {
    let sql =
        format!("SELECT {COMPILE_COLUMNS} FROM compiles WHERE environment_id = $1 AND id = $2");
    sqlx::query_as::<_, CompileRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(id)
        .fetch_optional(e)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("compile {id}")))
}

// ------------------------------------------------------------------------ webhooks and events

/// Remember a webhook delivery; false when it was seen before (a replay).
pub async fn record_delivery(e: impl PgExecutor<'_>, env: Uuid, delivery: &str) -> Result<bool> {
    let r = sqlx::query("INSERT INTO webhook_deliveries (environment_id, delivery_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(env)
        .bind(delivery)
        .execute(e)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// Remember a webhook body by its digest; false when the same body came within the last
/// hour (a replay under a new delivery id, or a sender's redelivery). An hour, not for ever:
/// a push can legitimately repeat a body (a branch moved back and forth).
pub async fn record_body(e: impl PgExecutor<'_>, env: Uuid, digest: &str) -> Result<bool> {
    let r = sqlx::query(
        "INSERT INTO webhook_deliveries (environment_id, delivery_id) VALUES ($1, $2) \
         ON CONFLICT (environment_id, delivery_id) DO UPDATE SET received_at = now() \
         WHERE webhook_deliveries.received_at < now() - interval '1 hour'",
    )
    .bind(env)
    .bind(format!("body:{digest}"))
    .execute(e)
    .await?;
    Ok(r.rows_affected() == 1)
}

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct CommitEvent {
    pub commit: String,
    pub at: DateTime<Utc>,
    pub event: String,
    pub detail: serde_json::Value,
}

pub async fn add_event(
    e: impl PgExecutor<'_>,
    env: Uuid,
    commit: &str,
    event: &str,
    detail: serde_json::Value,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO commit_events (environment_id, commit, event, detail) VALUES ($1, $2, $3, $4)",
    )
    .bind(env)
    .bind(commit)
    .bind(event)
    .bind(detail)
    .execute(e)
    .await?;
    Ok(())
}

/// Events of the commits starting with `prefix` (a full or abbreviated SHA), in order.
pub async fn events(e: impl PgExecutor<'_>, env: Uuid, prefix: &str) -> Result<Vec<CommitEvent>> {
    let pattern = format!("{}%", prefix.replace(['%', '_', '\\'], ""));
    Ok(sqlx::query_as::<_, CommitEvent>(
        "SELECT commit, at, event, detail FROM commit_events WHERE environment_id = $1 AND commit LIKE $2 ORDER BY id",
    )
    .bind(env)
    .bind(pattern)
    .fetch_all(e)
    .await?)
}

/// Names of the events of `commit` that concern `version` (their detail names it).
pub async fn version_events(
    e: impl PgExecutor<'_>,
    env: Uuid,
    commit: &str,
    version: i32,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT event FROM commit_events WHERE environment_id = $1 AND commit = $2 \
         AND detail->>'version' = $3::text",
    )
    .bind(env)
    .bind(commit)
    .bind(version)
    .fetch_all(e)
    .await?)
}

/// Versions made from a commit, released in the last day, whose release is not in their
/// commit's timeline yet (a crash, or two releases in quick succession): (version, commit).
pub async fn unreported_releases(e: impl PgExecutor<'_>, env: Uuid) -> Result<Vec<(i32, String)>> {
    Ok(sqlx::query_as(
        "SELECT v.number, v.provenance->>'commit' FROM versions v \
         WHERE v.environment_id = $1 AND v.status = 'released' AND v.provenance ? 'commit' \
         AND v.released_at > now() - interval '1 day' \
         AND NOT EXISTS (SELECT 1 FROM commit_events c WHERE c.environment_id = v.environment_id \
             AND c.commit = v.provenance->>'commit' AND c.event = 'released' \
             AND c.detail->>'version' = v.number::text) \
         ORDER BY v.number",
    )
    .bind(env)
    .fetch_all(e)
    .await?)
}

/// Released versions other than `active` whose deploy never settled (they were replaced by
/// a newer release first): (version, commit).
pub async fn unsettled_releases(
    e: impl PgExecutor<'_>,
    env: Uuid,
    active: i32,
) -> Result<Vec<(i32, String)>> {
    Ok(sqlx::query_as(
        "SELECT (r.detail->>'version')::int, r.commit FROM commit_events r \
         WHERE r.environment_id = $1 AND r.event = 'released' AND r.detail->>'version' <> $2::text \
         AND NOT EXISTS (SELECT 1 FROM commit_events t WHERE t.environment_id = r.environment_id \
             AND t.commit = r.commit AND t.event IN ('deployed', 'deploy_failed', 'replaced') \
             AND t.detail->>'version' = r.detail->>'version') \
         ORDER BY 1",
    )
    .bind(env)
    .bind(active)
    .fetch_all(e)
    .await?)
}

/// Replace a source's URL by one without credentials, keeping them as its token.
pub async fn move_url_credentials(
    e: impl PgExecutor<'_>,
    env: Uuid,
    url: &str,
    token: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE git_sources SET url = $2, token = $3, updated_at = now() WHERE environment_id = $1",
    )
    .bind(env)
    .bind(url)
    .bind(token)
    .execute(e)
    .await?;
    Ok(())
}

/// The compile of an environment that is queued or running, if any (the newest): its
/// status and commit.
pub async fn pending_compile(
    e: impl PgExecutor<'_>,
    env: Uuid,
) -> Result<Option<(String, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT status, commit, branch FROM compiles WHERE environment_id = $1 \
         AND status IN ('queued', 'running') ORDER BY (status = 'queued') DESC, requested_at DESC LIMIT 1",
    )
    .bind(env)
    .fetch_optional(e)
    .await?)
}
