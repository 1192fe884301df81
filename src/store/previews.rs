//! Pull-request previews (docs/previews.md): a preview per environment and pull request, a
//! run per head commit, and each run's diff against the environment's active version. A
//! preview is never a version: nothing here writes `versions` or anything a scheduler, a
//! release or an approval reads.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::Result;
use super::facts::ParamKey;
use crate::model::ExportFile;
use crate::model::diff::ResourceDigest;

/// Runs kept per open preview (older ones go with retention).
pub const RUNS_KEPT: i64 = 10;

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Preview {
    pub id: Uuid,
    pub environment_id: Uuid,
    /// `refs/pull/7/head`, or the ref previewed by hand.
    #[sqlx(rename = "ref")]
    #[serde(rename = "ref")]
    pub reference: String,
    /// The pull request (none for a ref previewed by hand).
    pub number: Option<i32>,
    pub base_branch: String,
    pub head_repo: Option<String>,
    /// From another repository than the base's.
    pub fork: bool,
    /// As the host said (shown only).
    pub title: String,
    pub url: Option<String>,
    pub author: Option<String>,
    /// `open`, `closed` or `merged`.
    pub state: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Run {
    pub id: Uuid,
    pub preview_id: Uuid,
    pub environment_id: Uuid,
    /// The pull request's head commit.
    pub head: String,
    /// The base branch's commit it was merged onto.
    pub base: Option<String>,
    /// The commit compiled: the host's merge commit or one Steward made.
    pub merge: Option<String>,
    /// `host` or `steward`.
    pub merge_source: Option<String>,
    /// `webhook` or `api`.
    pub trigger: String,
    /// `queued`, `running`, `success`, `failed`, `superseded` or `skipped`.
    pub status: String,
    /// The active version it was diffed against.
    pub diff_base: Option<i32>,
    /// Counts (`new`, `updated`, `deleted`, `undefined`, `withheld`, `requires`,
    /// `unchanged`), `handler_code` and `withheld_values`.
    #[schema(value_type = Object)]
    pub summary: Value,
    #[schema(value_type = Object)]
    pub stages: Value,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    #[schema(value_type = Object)]
    pub diagnostics: Value,
    #[schema(value_type = Object)]
    pub source_lines: Value,
    pub error: Option<String>,
    pub requested_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// One resource a preview would change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct PreviewChange {
    pub resource_id: String,
    /// `new`, `updated`, `deleted`, `undefined` (it would become undefined), `withheld`
    /// (undefined because the compile asked for a secret value) or `requires` (only its
    /// requires differ).
    pub change: String,
    /// `{attribute: {current, desired}}`
    #[schema(value_type = Object)]
    pub attributes: Value,
    /// `{added: [...], removed: [...]}` when its requires differ.
    #[schema(value_type = Object)]
    pub requires: Value,
}

/// What the host says of a pull request when it is opened or pushed to.
pub struct OpenPreview<'a> {
    pub env: Uuid,
    pub reference: &'a str,
    pub number: Option<i32>,
    pub base_branch: &'a str,
    pub head_repo: Option<&'a str>,
    pub fork: bool,
    pub title: &'a str,
    pub url: Option<&'a str>,
    pub author: Option<&'a str>,
}

const PREVIEW_COLUMNS: &str = "id, environment_id, ref, number, base_branch, head_repo, fork, \
     title, url, author, state, created_at, updated_at, closed_at";
const RUN_COLUMNS: &str = "id, preview_id, environment_id, head, base, merge, merge_source, \
     trigger, status, diff_base, summary, stages, exit_code, stdout, stderr, diagnostics, \
     source_lines, error, requested_at, started_at, finished_at";

/// The preview of `p.reference`, opened (again) with what the host says now.
pub async fn upsert_open(e: impl PgExecutor<'_>, p: &OpenPreview<'_>) -> Result<Preview> {
    let sql = format!(
        "INSERT INTO previews (id, environment_id, ref, number, base_branch, head_repo, fork, title, url, author, state) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'open') \
         ON CONFLICT (environment_id, ref) DO UPDATE SET base_branch = EXCLUDED.base_branch, \
           head_repo = EXCLUDED.head_repo, fork = EXCLUDED.fork, title = EXCLUDED.title, \
           url = COALESCE(EXCLUDED.url, previews.url), author = COALESCE(EXCLUDED.author, previews.author), \
           state = 'open', closed_at = NULL, updated_at = now() \
         RETURNING {PREVIEW_COLUMNS}"
    );
    Ok(sqlx::query_as::<_, Preview>(sqlx::AssertSqlSafe(sql))
        .bind(Uuid::new_v4())
        .bind(p.env)
        .bind(p.reference)
        .bind(p.number)
        .bind(p.base_branch)
        .bind(p.head_repo)
        .bind(p.fork)
        .bind(p.title)
        .bind(p.url)
        .bind(p.author)
        .fetch_one(e)
        .await?)
}

/// What queueing a head did.
pub struct Queued {
    pub run: Uuid,
    /// False: the newest run is for this head already (a repeated event).
    pub new: bool,
    /// Runs of the preview that were queued or running and are superseded now, with heads.
    pub superseded: Vec<(Uuid, String)>,
}

/// Queue a run for `head` (or record it `skipped` with `skip` as its error), unless the
/// preview's newest run is for that head. Older queued or running runs are superseded.
pub async fn queue_run(
    c: &mut PgConnection,
    preview: &Preview,
    head: &str,
    trigger: &str,
    skip: Option<&str>,
) -> Result<Queued> {
    // one writer per preview at a time: two events for it queue one after the other
    sqlx::query("SELECT id FROM previews WHERE id = $1 FOR UPDATE")
        .bind(preview.id)
        .execute(&mut *c)
        .await?;
    let newest: Option<(Uuid, String, String)> = sqlx::query_as(
        "SELECT id, head, status FROM preview_runs WHERE preview_id = $1 \
         ORDER BY requested_at DESC LIMIT 1",
    )
    .bind(preview.id)
    .fetch_optional(&mut *c)
    .await?;
    // the same head again is nothing new, unless it was superseded, or skipped and now
    // previewed (forks allowed since)
    if let Some((id, h, status)) = &newest
        && h == head
        && status != "superseded"
        && !(status == "skipped" && skip.is_none())
    {
        return Ok(Queued {
            run: *id,
            new: false,
            superseded: Vec::new(),
        });
    }
    let superseded: Vec<(Uuid, String)> = sqlx::query_as(
        "UPDATE preview_runs SET status = 'superseded', finished_at = now(), \
           error = 'superseded by a newer commit' \
         WHERE preview_id = $1 AND status IN ('queued', 'running') RETURNING id, head",
    )
    .bind(preview.id)
    .fetch_all(&mut *c)
    .await?;
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO preview_runs (id, preview_id, environment_id, head, trigger, status, error, finished_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, CASE WHEN $7::text IS NULL THEN NULL ELSE now() END)",
    )
    .bind(id)
    .bind(preview.id)
    .bind(preview.environment_id)
    .bind(head)
    .bind(trigger)
    .bind(if skip.is_some() { "skipped" } else { "queued" })
    .bind(skip)
    .execute(&mut *c)
    .await?;
    Ok(Queued {
        run: id,
        new: true,
        superseded,
    })
}

/// The oldest queued run of the environment.
pub async fn next_queued(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<Run>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM preview_runs WHERE environment_id = $1 AND status = 'queued' \
         ORDER BY requested_at LIMIT 1"
    );
    Ok(sqlx::query_as::<_, Run>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .fetch_optional(e)
        .await?)
}

/// Mark a queued run running; false if it is not queued any more.
pub async fn start_run(e: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let n = sqlx::query(
        "UPDATE preview_runs SET status = 'running', started_at = now() WHERE id = $1 AND status = 'queued'",
    )
    .bind(id)
    .execute(e)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Whether a run is still running (a newer push or a close supersedes it meanwhile).
pub async fn still_running(e: impl PgExecutor<'_>, id: Uuid) -> Result<bool> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM preview_runs WHERE id = $1")
            .bind(id)
            .fetch_optional(e)
            .await?;
    Ok(status.as_deref() == Some("running"))
}

/// Runs a stopped process left running: queued again.
pub async fn requeue_interrupted_of(e: impl PgExecutor<'_>, env: Uuid) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE preview_runs SET status = 'queued', started_at = NULL \
         WHERE environment_id = $1 AND status = 'running'",
    )
    .bind(env)
    .execute(e)
    .await?
    .rows_affected())
}

/// How a run ended.
pub struct RunEnd<'a> {
    /// `success`, `failed` (or `skipped`).
    pub status: &'a str,
    pub head: &'a str,
    pub base: Option<&'a str>,
    pub merge: Option<&'a str>,
    pub merge_source: Option<&'a str>,
    pub diff_base: Option<i32>,
    pub summary: &'a Value,
    pub stages: &'a Value,
    pub exit_code: Option<i32>,
    pub stdout: &'a str,
    pub stderr: &'a str,
    pub diagnostics: &'a Value,
    pub source_lines: &'a Value,
    pub error: Option<&'a str>,
}

/// Record the end of a run that is still running (false: it was superseded meanwhile, and
/// nothing is recorded).
pub async fn finish_run(c: &mut PgConnection, id: Uuid, end: &RunEnd<'_>) -> Result<bool> {
    let n = sqlx::query(
        "UPDATE preview_runs SET status = $2, head = $3, base = $4, merge = $5, merge_source = $6, \
           diff_base = $7, summary = $8, stages = $9, exit_code = $10, stdout = $11, stderr = $12, \
           diagnostics = $13, source_lines = $14, error = $15, finished_at = now() \
         WHERE id = $1 AND status = 'running'",
    )
    .bind(id)
    .bind(end.status)
    .bind(end.head)
    .bind(end.base)
    .bind(end.merge)
    .bind(end.merge_source)
    .bind(end.diff_base)
    .bind(end.summary)
    .bind(end.stages)
    .bind(end.exit_code)
    .bind(end.stdout)
    .bind(end.stderr)
    .bind(end.diagnostics)
    .bind(end.source_lines)
    .bind(end.error)
    .execute(&mut *c)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Store a run's changes.
pub async fn store_changes(
    c: &mut PgConnection,
    run: Uuid,
    changes: &[PreviewChange],
) -> Result<()> {
    let ids: Vec<&str> = changes.iter().map(|e| e.resource_id.as_str()).collect();
    let kinds: Vec<&str> = changes.iter().map(|e| e.change.as_str()).collect();
    let attrs: Vec<&Value> = changes.iter().map(|e| &e.attributes).collect();
    let reqs: Vec<&Value> = changes.iter().map(|e| &e.requires).collect();
    sqlx::query(
        "INSERT INTO preview_diffs (run_id, resource_id, change, attributes, requires) \
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::jsonb[])",
    )
    .bind(run)
    .bind(&ids)
    .bind(&kinds)
    .bind(&attrs)
    .bind(&reqs)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Close the preview of `reference` (`merged` or `closed`); its queued and running runs are
/// superseded. None: there is no open one.
pub async fn close(
    c: &mut PgConnection,
    env: Uuid,
    reference: &str,
    merged: bool,
) -> Result<Option<Preview>> {
    let sql = format!(
        "UPDATE previews SET state = $3, closed_at = now(), updated_at = now() \
         WHERE environment_id = $1 AND ref = $2 AND state = 'open' RETURNING {PREVIEW_COLUMNS}"
    );
    let p = sqlx::query_as::<_, Preview>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(reference)
        .bind(if merged { "merged" } else { "closed" })
        .fetch_optional(&mut *c)
        .await?;
    if let Some(p) = &p {
        sqlx::query(
            "UPDATE preview_runs SET status = 'superseded', finished_at = now(), \
               error = 'the pull request was closed' \
             WHERE preview_id = $1 AND status IN ('queued', 'running')",
        )
        .bind(p.id)
        .execute(&mut *c)
        .await?;
    }
    Ok(p)
}

pub async fn get(e: impl PgExecutor<'_>, env: Uuid, id: Uuid) -> Result<Preview> {
    let sql =
        format!("SELECT {PREVIEW_COLUMNS} FROM previews WHERE environment_id = $1 AND id = $2");
    sqlx::query_as::<_, Preview>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(id)
        .fetch_optional(e)
        .await?
        .ok_or_else(|| super::StoreError::NotFound(format!("preview {id}")))
}

/// The preview of pull request `number`, if any.
pub async fn by_number(e: impl PgExecutor<'_>, env: Uuid, number: i32) -> Result<Option<Preview>> {
    let sql = format!(
        "SELECT {PREVIEW_COLUMNS} FROM previews WHERE environment_id = $1 AND number = $2 \
         ORDER BY updated_at DESC LIMIT 1"
    );
    Ok(sqlx::query_as::<_, Preview>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(number)
        .fetch_optional(e)
        .await?)
}

/// Previews of the environment, open ones first, then the newest (`state`: `open`, `closed`
/// (closed or merged) or none for all).
pub async fn list(
    e: impl PgExecutor<'_>,
    env: Uuid,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<Preview>> {
    let sql = format!(
        "SELECT {PREVIEW_COLUMNS} FROM previews WHERE environment_id = $1 \
         AND ($2::text IS NULL OR ($2 = 'open' AND state = 'open') OR ($2 = 'closed' AND state <> 'open')) \
         ORDER BY state = 'open' DESC, updated_at DESC LIMIT $3"
    );
    Ok(sqlx::query_as::<_, Preview>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(state)
        .bind(limit)
        .fetch_all(e)
        .await?)
}

/// The runs of a preview, newest first.
pub async fn runs(e: impl PgExecutor<'_>, preview: Uuid, limit: i64) -> Result<Vec<Run>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM preview_runs WHERE preview_id = $1 ORDER BY requested_at DESC LIMIT $2"
    );
    Ok(sqlx::query_as::<_, Run>(sqlx::AssertSqlSafe(sql))
        .bind(preview)
        .bind(limit)
        .fetch_all(e)
        .await?)
}

/// The newest run of each preview given.
pub async fn newest_runs(e: impl PgExecutor<'_>, previews: &[Uuid]) -> Result<HashMap<Uuid, Run>> {
    let sql = format!(
        "SELECT DISTINCT ON (preview_id) {RUN_COLUMNS} FROM preview_runs WHERE preview_id = ANY($1) \
         ORDER BY preview_id, requested_at DESC"
    );
    let rows = sqlx::query_as::<_, Run>(sqlx::AssertSqlSafe(sql))
        .bind(previews)
        .fetch_all(e)
        .await?;
    Ok(rows.into_iter().map(|r| (r.preview_id, r)).collect())
}

pub async fn get_run(e: impl PgExecutor<'_>, env: Uuid, id: Uuid) -> Result<Run> {
    let sql =
        format!("SELECT {RUN_COLUMNS} FROM preview_runs WHERE environment_id = $1 AND id = $2");
    sqlx::query_as::<_, Run>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(id)
        .fetch_optional(e)
        .await?
        .ok_or_else(|| super::StoreError::NotFound(format!("preview run {id}")))
}

/// A run's changes, by resource id (at most `limit`).
pub async fn changes(e: impl PgExecutor<'_>, run: Uuid, limit: i64) -> Result<Vec<PreviewChange>> {
    Ok(sqlx::query_as::<_, PreviewChange>(
        "SELECT resource_id, change, attributes, requires FROM preview_diffs WHERE run_id = $1 \
         ORDER BY resource_id LIMIT $2",
    )
    .bind(run)
    .bind(limit)
    .fetch_all(e)
    .await?)
}

/// The previews of pull request `number` in the environments given (for the comment).
pub async fn of_pull_request(
    e: impl PgExecutor<'_>,
    envs: &[Uuid],
    number: i32,
) -> Result<Vec<Preview>> {
    let sql = format!(
        "SELECT {PREVIEW_COLUMNS} FROM previews WHERE environment_id = ANY($1) AND number = $2 \
         ORDER BY environment_id"
    );
    Ok(sqlx::query_as::<_, Preview>(sqlx::AssertSqlSafe(sql))
        .bind(envs)
        .bind(number)
        .fetch_all(e)
        .await?)
}

/// The heads the poll saw last: (number, head). Empty: the environment was never polled.
pub async fn pull_refs(e: impl PgExecutor<'_>, env: Uuid) -> Result<HashMap<i32, String>> {
    let rows: Vec<(i32, String)> =
        sqlx::query_as("SELECT number, head FROM pull_refs WHERE environment_id = $1")
            .bind(env)
            .fetch_all(e)
            .await?;
    Ok(rows.into_iter().collect())
}

/// Record what the poll saw (heads gone from the listing are forgotten).
pub async fn set_pull_refs(c: &mut PgConnection, env: Uuid, heads: &[(i32, String)]) -> Result<()> {
    let numbers: Vec<i32> = heads.iter().map(|h| h.0).collect();
    let commits: Vec<&str> = heads.iter().map(|h| h.1.as_str()).collect();
    sqlx::query("DELETE FROM pull_refs WHERE environment_id = $1 AND NOT (number = ANY($2))")
        .bind(env)
        .bind(&numbers)
        .execute(&mut *c)
        .await?;
    sqlx::query(
        "INSERT INTO pull_refs (environment_id, number, head) SELECT $1, * FROM unnest($2::int[], $3::text[]) \
         ON CONFLICT (environment_id, number) DO UPDATE SET head = EXCLUDED.head",
    )
    .bind(env)
    .bind(&numbers)
    .bind(&commits)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// A resource a preview's dry-run runs.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct DryrunResource {
    pub resource_id: String,
    pub resource_type: String,
    pub agent: String,
    pub attributes: Value,
}

/// Record a preview's dry-run `id` of `resources` (the preview's desired state) against
/// `version`, the active version whose handler code runs them.
pub async fn create_dryrun(
    c: &mut PgConnection,
    env: Uuid,
    id: Uuid,
    run: Uuid,
    version: i32,
    resources: &[&crate::model::Resource],
    by: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO dryruns (id, environment_id, version, total, requested_by, preview_run) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(env)
    .bind(version)
    .bind(resources.len() as i32)
    .bind(by)
    .bind(run)
    .execute(&mut *c)
    .await?;
    let ids: Vec<&str> = resources.iter().map(|r| r.id.0.as_str()).collect();
    let types: Vec<&str> = resources.iter().map(|r| r.type_name.as_str()).collect();
    let agents: Vec<&str> = resources.iter().map(|r| r.agent.as_str()).collect();
    let attrs: Vec<Value> = resources
        .iter()
        .map(|r| Value::Object(r.attributes.clone()))
        .collect();
    sqlx::query(
        "INSERT INTO preview_dryrun_resources (dryrun_id, resource_id, resource_type, agent, attributes) \
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::jsonb[])",
    )
    .bind(id)
    .bind(&ids)
    .bind(&types)
    .bind(&agents)
    .bind(&attrs)
    .execute(&mut *c)
    .await?;
    Ok(())
}

pub async fn dryrun_resources(e: impl PgExecutor<'_>, dryrun: Uuid) -> Result<Vec<DryrunResource>> {
    Ok(sqlx::query_as::<_, DryrunResource>(
        "SELECT resource_id, resource_type, agent, attributes FROM preview_dryrun_resources \
         WHERE dryrun_id = $1 ORDER BY resource_id",
    )
    .bind(dryrun)
    .fetch_all(e)
    .await?)
}

/// This installation's id (its comments carry it).
pub async fn installation(e: impl PgExecutor<'_>) -> Result<Uuid> {
    Ok(sqlx::query_scalar("SELECT id FROM installation")
        .fetch_one(e)
        .await?)
}

/// The sticky comment of a pull request for one editing token.
pub struct CommentKey<'a> {
    pub host: &'a str,
    pub repo: &'a str,
    pub number: i32,
    pub token_digest: &'a str,
}

/// Lock the comment's row (made if missing) until `c`'s transaction ends: (comment id, digest
/// of the body last posted).
pub async fn lock_comment(
    c: &mut PgConnection,
    k: &CommentKey<'_>,
) -> Result<(Option<i64>, Option<String>)> {
    sqlx::query(
        "INSERT INTO preview_comments (host, repo, number, token_digest) VALUES ($1, $2, $3, $4) \
         ON CONFLICT DO NOTHING",
    )
    .bind(k.host)
    .bind(k.repo)
    .bind(k.number)
    .bind(k.token_digest)
    .execute(&mut *c)
    .await?;
    Ok(sqlx::query_as(
        "SELECT comment_id, body_digest FROM preview_comments \
         WHERE host = $1 AND repo = $2 AND number = $3 AND token_digest = $4 FOR UPDATE",
    )
    .bind(k.host)
    .bind(k.repo)
    .bind(k.number)
    .bind(k.token_digest)
    .fetch_one(&mut *c)
    .await?)
}

pub async fn set_comment(
    c: &mut PgConnection,
    k: &CommentKey<'_>,
    id: Option<i64>,
    body_digest: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE preview_comments SET comment_id = $5, body_digest = $6, updated_at = now() \
         WHERE host = $1 AND repo = $2 AND number = $3 AND token_digest = $4",
    )
    .bind(k.host)
    .bind(k.repo)
    .bind(k.number)
    .bind(k.token_digest)
    .bind(id)
    .bind(body_digest)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Previews of closed pull requests beyond the newest `keep` or closed before `before` go
/// (with their runs and changes); an open one keeps its newest [`RUNS_KEPT`] finished runs.
pub async fn prune(
    c: &mut PgConnection,
    env: Uuid,
    keep: i64,
    before: DateTime<Utc>,
) -> Result<u64> {
    let gone = sqlx::query(
        "DELETE FROM previews WHERE id IN (SELECT id FROM previews WHERE environment_id = $1 \
           AND state <> 'open' ORDER BY closed_at DESC NULLS LAST OFFSET $2) \
         OR (environment_id = $1 AND state <> 'open' AND closed_at < $3)",
    )
    .bind(env)
    .bind(keep)
    .bind(before)
    .execute(&mut *c)
    .await?
    .rows_affected();
    let runs = sqlx::query(
        "DELETE FROM preview_runs r USING (SELECT id, row_number() OVER (PARTITION BY preview_id \
           ORDER BY requested_at DESC) AS n FROM preview_runs WHERE environment_id = $1 \
           AND status NOT IN ('queued', 'running')) old \
         WHERE r.id = old.id AND old.n > $2",
    )
    .bind(env)
    .bind(RUNS_KEPT)
    .execute(&mut *c)
    .await?
    .rows_affected();
    Ok(gone + runs)
}

/// What a preview's export would change against the active version.
pub struct PreviewDiff {
    pub base: Option<i32>,
    pub changes: Vec<PreviewChange>,
    /// Counts by kind, `unchanged`, `handler_code` (resource types whose handler code
    /// differs) and `withheld_values`.
    pub summary: Value,
}

/// Diff `export` against the environment's active version (none: everything is new), as a
/// version's diff is computed, plus resources that would become undefined (`withheld` when
/// the compile asked for one of `withheld`), and requires that differ.
pub async fn diff_export(
    c: &mut PgConnection,
    env: Uuid,
    export: &ExportFile,
    withheld: &[ParamKey],
) -> Result<PreviewDiff> {
    let base = super::versions::active(&mut *c, env).await?;
    let (old, old_requires) = match base {
        Some(b) => {
            let rows = super::versions::resource_digests(&mut *c, env, b).await?;
            let mut digests = BTreeMap::new();
            let mut requires = HashMap::new();
            for r in rows {
                requires.insert(r.resource_id.clone(), r.requires);
                digests.insert(
                    r.resource_id,
                    ResourceDigest {
                        hash: r.hash,
                        undefined: r.undefined,
                    },
                );
            }
            (digests, requires)
        }
        None => (BTreeMap::new(), HashMap::new()),
    };
    let undefined: BTreeSet<&str> = export.undefined.iter().map(|u| u.0.as_str()).collect();
    let by_id: HashMap<&str, &crate::model::Resource> = export
        .resources
        .iter()
        .map(|r| (r.id.0.as_str(), r))
        .collect();
    let new: BTreeMap<String, ResourceDigest> = export
        .resources
        .iter()
        .map(|r| {
            (
                r.id.0.clone(),
                ResourceDigest {
                    hash: r.hash(),
                    undefined: undefined.contains(r.id.0.as_str()),
                },
            )
        })
        .collect();
    let entries = super::versions::compute_diff(&mut *c, &old, &new, |id| {
        by_id.get(id).map(|r| r.attributes.clone())
    })
    .await?;
    // a resource the compile could not finish because a value was withheld from it
    let withheld_set: BTreeSet<(&str, &str)> = withheld
        .iter()
        .map(|k| (k.resource_id.as_str(), k.name.as_str()))
        .collect();
    // (the value asked for may be another resource's: every resource that becomes undefined
    // in such a compile is counted withheld, which may hide one undefined for another reason)
    let any_withheld_asked = export
        .unknowns
        .iter()
        .any(|u| withheld_set.contains(&(u.resource_id.as_str(), u.name.as_str())));
    let requires_of = |id: &str| -> Value {
        let (Some(old), Some(new)) = (old_requires.get(id), by_id.get(id)) else {
            return json!({});
        };
        let old: BTreeSet<&str> = old.iter().map(String::as_str).collect();
        let new: BTreeSet<&str> = new.requires.iter().map(|r| r.0.as_str()).collect();
        if old == new {
            return json!({});
        }
        json!({
            "added": new.difference(&old).collect::<Vec<_>>(),
            "removed": old.difference(&new).collect::<Vec<_>>(),
        })
    };
    let mut changes = Vec::new();
    let mut seen = BTreeSet::new();
    for e in entries {
        seen.insert(e.resource_id.clone());
        let becomes_undefined = undefined.contains(e.resource_id.as_str())
            && !old.get(&e.resource_id).is_some_and(|d| d.undefined);
        let change = if e.change != "deleted" && becomes_undefined {
            if any_withheld_asked {
                "withheld".to_string()
            } else {
                "undefined".to_string()
            }
        } else {
            e.change.clone()
        };
        changes.push(PreviewChange {
            requires: requires_of(&e.resource_id),
            resource_id: e.resource_id,
            change,
            attributes: e.attributes,
        });
    }
    // same attributes, other requires
    for r in &export.resources {
        if seen.contains(&r.id.0) || !old.contains_key(&r.id.0) {
            continue;
        }
        let requires = requires_of(&r.id.0);
        if requires != json!({}) {
            changes.push(PreviewChange {
                resource_id: r.id.0.clone(),
                change: "requires".into(),
                attributes: json!({}),
                requires,
            });
        }
    }
    changes.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
    let mut counts: BTreeMap<&str, i64> = [
        ("new", 0),
        ("updated", 0),
        ("deleted", 0),
        ("undefined", 0),
        ("withheld", 0),
        ("requires", 0),
    ]
    .into();
    for ch in &changes {
        *counts.entry(ch.change.as_str()).or_default() += 1;
    }
    let changed_present = changes.iter().filter(|c| c.change != "deleted").count() as i64;
    // handler code that differs from the active version's, by resource type
    let handler_code: Vec<String> = match base {
        Some(b) => {
            let active = super::code::handlers_of(&mut *c, env, b).await?;
            export
                .handlers
                .iter()
                .filter(|(ty, h)| active.get(*ty).is_none_or(|a| a.digest != h.digest))
                .map(|(ty, _)| ty.clone())
                .collect()
        }
        None => export.handlers.keys().cloned().collect(),
    };
    let mut summary = json!(counts);
    summary["unchanged"] = json!(new.len() as i64 - changed_present);
    summary["handler_code"] = json!(handler_code);
    summary["withheld_values"] = json!(withheld.len());
    summary["resources"] = json!(export.resources.len());
    Ok(PreviewDiff {
        base,
        changes,
        summary,
    })
}
