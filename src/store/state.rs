//! Per-resource deploy state joined with the active version, for people and tools.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::Result;

mod facet_cache;
mod page;
pub use facet_cache::FacetCache;
pub use page::{Filter, PageRequest, ResourcePage, SortKey, one, page, required_by};

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ResourceWithState {
    pub resource_id: String,
    pub resource_type: String,
    pub agent: String,
    pub hash: String,
    pub undefined: bool,
    pub requires: Vec<String>,
    /// One word for people (SCHEDULER.md §2.4): orphaned, deploying, undefined,
    /// skipped_for_undefined, available, or the last handler result.
    pub status: String,
    pub compliance: String,
    pub last_run: String,
    pub last_result: Option<String>,
    pub last_message: Option<String>,
    pub blocked: String,
    pub blocked_reason: Option<String>,
    pub last_attempt: Option<DateTime<Utc>>,
    pub last_deployed: Option<DateTime<Utc>>,
    pub last_success: Option<DateTime<Utc>>,
    pub failure_count: i32,
    pub next_retry: Option<DateTime<Utc>>,
}

/// The resources of a version with their state, as the API lists them.
#[derive(Clone, Debug, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ResourceList {
    pub version: Option<i32>,
    pub resources: Vec<ResourceWithState>,
    /// How many resources match the filter (more than `resources` holds when paged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<i64>,
}

/// The REST status, first match wins. A resource blocked for the intent of an earlier
/// version (undefined then, defined in this one) is not settled until the scheduler merged
/// this one: a release is not `done` before its first look at it.
pub const STATUS_SQL: &str = "CASE \
    WHEN s.orphaned_after IS NOT NULL THEN 'orphaned' \
    WHEN s.deploying_since IS NOT NULL THEN 'deploying' \
    WHEN vr.undefined THEN 'undefined' \
    WHEN s.blocked = 'blocked' AND s.intent_hash IS NOT DISTINCT FROM vr.hash THEN 'skipped_for_undefined' \
    WHEN s.last_result IS NULL THEN 'available' \
    WHEN s.last_run_hash IS DISTINCT FROM vr.hash THEN 'available' \
    ELSE s.last_result END";

/// The fields of a state row [`STATUS_SQL`] reads.
#[derive(Clone, Copy, Debug)]
pub struct StatusFields<'a> {
    pub orphaned: bool,
    pub deploying: bool,
    pub blocked: &'a str,
    pub intent_hash: Option<&'a str>,
    pub last_result: Option<&'a str>,
    pub last_run_hash: Option<&'a str>,
}

/// [`STATUS_SQL`] in Rust: the status of a resource of a version (its `hash`, whether it is
/// `undefined`) with the state row `state` (None: it has none yet). For a scheduler that
/// counts from what it knows the database holds; a test holds the two to each other.
pub fn status_of<'a>(state: Option<&StatusFields<'a>>, hash: &str, undefined: bool) -> &'a str {
    let Some(s) = state else {
        return if undefined { "undefined" } else { "available" };
    };
    if s.orphaned {
        "orphaned"
    } else if s.deploying {
        "deploying"
    } else if undefined {
        "undefined"
    } else if s.blocked == "blocked" && s.intent_hash == Some(hash) {
        "skipped_for_undefined"
    } else {
        match s.last_result {
            None => "available",
            Some(_) if s.last_run_hash != Some(hash) => "available",
            Some(result) => result,
        }
    }
}

/// Resources of `version` with their state, in id order.
pub async fn list(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
) -> Result<Vec<ResourceWithState>> {
    let sql = format!(
        "SELECT vr.resource_id, vr.resource_type, vr.agent, vr.hash, vr.undefined, vr.requires, {STATUS_SQL} AS status, \
         COALESCE(s.compliance, CASE WHEN vr.undefined THEN 'undefined' ELSE 'has_update' END) AS compliance, \
         COALESCE(s.last_run, 'new') AS last_run, s.last_result, s.last_message, \
         COALESCE(s.blocked, CASE WHEN vr.undefined THEN 'blocked' ELSE 'not_blocked' END) AS blocked, \
         s.blocked_reason, s.last_attempt, s.last_deployed, s.last_success, COALESCE(s.failure_count, 0) AS failure_count, \
         s.next_retry \
         FROM resource_spans vr LEFT JOIN resource_state s \
           ON s.environment_id = vr.environment_id AND s.resource_id = vr.resource_id \
         WHERE vr.environment_id = $1 AND vr.first_version <= $2 AND vr.last_version >= $2 \
         ORDER BY vr.resource_id"
    );
    Ok(
        sqlx::query_as::<_, ResourceWithState>(sqlx::AssertSqlSafe(sql))
            .persistent(false)
            .bind(env)
            .bind(version)
            .fetch_all(e)
            .await?,
    )
}

/// Counts of resources per status in `version` (for summaries and metrics).
pub async fn status_counts(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
) -> Result<Vec<(String, i64)>> {
    let sql = format!(
        "SELECT {STATUS_SQL} AS status, count(*) FROM resource_spans vr LEFT JOIN resource_state s \
           ON s.environment_id = vr.environment_id AND s.resource_id = vr.resource_id \
         WHERE vr.environment_id = $1 AND vr.first_version <= $2 AND vr.last_version >= $2 \
         GROUP BY 1 ORDER BY 1"
    );
    // planned for each call, not kept prepared: a generic plan made while the first deploy
    // of 100,000 resources had written few states (a nested loop over them) would stay in
    // use as they grow. A progress call timed out after 300 s twice in six runs of
    // examples/bench_deploy.rs at 100,000; this is the suspected cause (none in the runs
    // since)
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .persistent(false)
        .bind(env)
        .bind(version)
        .fetch_all(e)
        .await?)
}

/// Resources of `version` being deployed now, the longest running first.
pub async fn deploying_now(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
    limit: i64,
) -> Result<Vec<String>> {
    // driven from the few rows being deployed (partial index), not from the version
    Ok(sqlx::query_scalar(
        "SELECT s.resource_id FROM resource_state s JOIN resource_spans vr \
           ON vr.environment_id = s.environment_id AND vr.resource_id = s.resource_id \
           AND vr.first_version <= $2 AND vr.last_version >= $2 \
         WHERE s.environment_id = $1 AND s.deploying_since IS NOT NULL AND s.orphaned_after IS NULL \
         ORDER BY s.deploying_since, s.resource_id LIMIT $3",
    )
    .bind(env)
    .bind(version)
    .bind(limit)
    .fetch_all(e)
    .await?)
}

/// Statuses of resources whose deploy is still to come or under way.
pub const PENDING: [&str; 2] = ["available", "deploying"];

/// Statuses that make a deploy unsuccessful.
pub const FAILED: [&str; 5] = [
    "failed",
    "unavailable",
    "timed_out",
    "skipped",
    "skipped_for_dependency",
];

/// Where the deploy of a version stands.
#[derive(Clone, Debug, Default)]
pub struct DeploySummary {
    pub total: i64,
    pub pending: i64,
    pub failed: i64,
    pub by_status: serde_json::Map<String, serde_json::Value>,
}

/// The summary of `version`: from `known` counts (a scheduler's, see
/// `Schedulers::stored_status_counts`) when they add up to its `resources`, else counted in
/// the database; and which of the two (`scheduler` or `database`).
pub async fn summary_known_or_counted(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
    known: Option<Vec<(String, i64)>>,
    resources: i32,
) -> Result<(DeploySummary, &'static str)> {
    let (counts, counted_by) = counts_known_or_counted(e, env, version, known, resources).await?;
    Ok((DeploySummary::of(counts), counted_by))
}

/// The counts per status of `version` ([`status_counts`]): `known` ones when they add up
/// to its `resources`, else counted in the database; and which of the two.
pub async fn counts_known_or_counted(
    e: impl PgExecutor<'_>,
    env: Uuid,
    version: i32,
    known: Option<Vec<(String, i64)>>,
    resources: i32,
) -> Result<(Vec<(String, i64)>, &'static str)> {
    match known {
        Some(counts) if counts.iter().map(|c| c.1).sum::<i64>() == i64::from(resources) => {
            Ok((counts, "scheduler"))
        }
        _ => Ok((status_counts(e, env, version).await?, "database")),
    }
}

impl DeploySummary {
    /// The summary of counts per status (in status order, as [`status_counts`] gives them).
    pub fn of(counts: Vec<(String, i64)>) -> DeploySummary {
        let mut s = DeploySummary::default();
        for (status, n) in counts {
            s.total += n;
            if PENDING.contains(&status.as_str()) {
                s.pending += n;
            }
            if FAILED.contains(&status.as_str()) {
                s.failed += n;
            }
            s.by_status.insert(status, serde_json::json!(n));
        }
        s
    }
}
