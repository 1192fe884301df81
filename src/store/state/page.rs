//! One page of a version's resources with their state: filtered (status, agent, type, text in
//! the id), sorted and cut in PostgreSQL, with the counts a filter bar shows. Built to stay
//! fast at 100,000 resources (`examples/bench_console.rs` measures it):
//!
//! - The status is a CASE over the version's row and the state row ([`STATUS_SQL`]), so
//!   counting by status joins every resource of the version once. That one pass (grouping
//!   sets) gives the counts by status under the other filters, the agents and the types.
//! - The page itself, when it neither filters nor sorts by status or deploy time, is cut from
//!   `version_resources` alone (its primary key is in id order) and only its rows are joined
//!   with their state.
//! - A status filter is written on the underlying columns as well (a result is
//!   `last_result = X`), so the planner sees how selective it is and can start from the few
//!   failed rows rather than from the whole version.
//! - The statements are not kept prepared: a generic plan of these optional filters is poor
//!   (measured: a nested loop over the whole version), so each is planned for its values.
//! - Both queries run at once, on two connections.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::{ResourceWithState, STATUS_SQL};
use crate::store::Result;

/// What to show: every field narrows the list (`None`: no condition).
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// one status word, as [`STATUS_SQL`] computes it
    pub status: Option<String>,
    pub agent: Option<String>,
    pub resource_type: Option<String>,
    /// text the resource id contains (case-insensitive)
    pub text: Option<String>,
}

/// The column a page is sorted by (the resource id breaks ties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortKey {
    #[default]
    Id,
    Type,
    Agent,
    Status,
    /// end of the last run (never deployed last, in both directions)
    Deployed,
}

impl SortKey {
    pub const ALL: [SortKey; 5] = [
        SortKey::Id,
        SortKey::Type,
        SortKey::Agent,
        SortKey::Status,
        SortKey::Deployed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::Id => "id",
            SortKey::Type => "type",
            SortKey::Agent => "agent",
            SortKey::Status => "status",
            SortKey::Deployed => "deployed",
        }
    }

    pub fn parse(s: &str) -> Option<SortKey> {
        SortKey::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether sorting needs the state row of every resource (not only the page's).
    fn needs_state(self) -> bool {
        matches!(self, SortKey::Status | SortKey::Deployed)
    }

    fn order_by(self, desc: bool) -> String {
        let d = if desc { " DESC" } else { "" };
        match self {
            SortKey::Id => format!("vr.resource_id{d}"),
            SortKey::Type => format!("vr.resource_type{d}, vr.resource_id{d}"),
            SortKey::Agent => format!("vr.agent{d}, vr.resource_id{d}"),
            SortKey::Status => format!("status{d}, vr.resource_id{d}"),
            SortKey::Deployed => format!("s.last_deployed{d} NULLS LAST, vr.resource_id{d}"),
        }
    }
}

/// Which page: of which version, filtered and sorted how, from where and how many (`limit`
/// None: all from `offset`).
#[derive(Clone, Debug, Default)]
pub struct PageRequest {
    pub version: i32,
    pub filter: Filter,
    pub sort: SortKey,
    pub desc: bool,
    pub offset: i64,
    pub limit: Option<i64>,
}

/// A page of resources and what a filter bar needs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResourcePage {
    pub rows: Vec<ResourceWithState>,
    /// resources matching the whole filter
    pub total: i64,
    /// resources by status, under every filter but the status one
    pub by_status: BTreeMap<String, i64>,
    /// every agent and every type of the version (for the filter's choices)
    pub agents: Vec<String>,
    pub types: Vec<String>,
}

const ROW_COLUMNS: &str =
    "vr.resource_id, vr.resource_type, vr.agent, vr.hash, vr.undefined, vr.requires";

fn state_columns() -> String {
    format!(
        "{STATUS_SQL} AS status, \
         COALESCE(s.compliance, CASE WHEN vr.undefined THEN 'undefined' ELSE 'has_update' END) AS compliance, \
         COALESCE(s.last_run, 'new') AS last_run, s.last_result, s.last_message, \
         COALESCE(s.blocked, CASE WHEN vr.undefined THEN 'blocked' ELSE 'not_blocked' END) AS blocked, \
         s.blocked_reason, s.last_attempt, s.last_deployed, s.last_success, COALESCE(s.failure_count, 0) AS failure_count, \
         s.next_retry"
    )
}

const JOIN_STATE: &str = "LEFT JOIN resource_state s ON s.environment_id = vr.environment_id AND s.resource_id = vr.resource_id";

/// The conditions on the version's own columns: $1 env, $2 version, $3 agent, $4 type,
/// $5 pattern.
const ROW_FILTER: &str = "vr.environment_id = $1 AND vr.version = $2 \
    AND ($3::text IS NULL OR vr.agent = $3) AND ($4::text IS NULL OR vr.resource_type = $4) \
    AND ($5::text IS NULL OR vr.resource_id ILIKE $5 ESCAPE '\\')";

/// A status filter ($6) on the columns the status is computed from: the CASE of
/// [`STATUS_SQL`] branch by branch (tests check that filtered totals match the counts,
/// which use the CASE itself).
fn status_filter(status: &str) -> String {
    let settled = "s.orphaned_after IS NULL AND s.deploying_since IS NULL";
    let usable = "NOT vr.undefined AND s.blocked IS DISTINCT FROM 'blocked'";
    match status {
        "orphaned" => "s.orphaned_after IS NOT NULL".to_string(),
        "deploying" => "s.orphaned_after IS NULL AND s.deploying_since IS NOT NULL".to_string(),
        "undefined" => format!("{settled} AND vr.undefined"),
        "skipped_for_undefined" => {
            format!("{settled} AND NOT vr.undefined AND s.blocked = 'blocked'")
        }
        "available" => format!(
            "{settled} AND {usable} AND (s.last_result IS NULL OR s.last_run_hash IS DISTINCT FROM vr.hash)"
        ),
        // a handler's result: its state row says so, for this very intent
        _ => format!("s.last_result = $6 AND {settled} AND {usable} AND s.last_run_hash = vr.hash"),
    }
}

/// A transaction whose joins of a whole version (100,000 state rows hashed) fit in
/// memory: with the default 4 MB they spill to temporary files (measured ~15% slower).
async fn roomy(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL work_mem = '32MB'")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// `%text%` for ILIKE, with its wildcards taken literally.
fn pattern(text: &str) -> String {
    let mut p = String::with_capacity(text.len() + 2);
    p.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

fn nonempty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The rows of one page.
pub async fn rows(pool: &PgPool, env: Uuid, req: &PageRequest) -> Result<Vec<ResourceWithState>> {
    let PageRequest {
        version,
        ref filter,
        sort,
        desc,
        offset,
        limit,
    } = *req;
    let status = nonempty(&filter.status);
    let order = sort.order_by(desc);
    let cut = format!(
        "OFFSET {} {}",
        offset.max(0),
        limit
            .map(|l| format!("LIMIT {}", l.max(0)))
            .unwrap_or_default()
    );
    let state_cols = state_columns();
    // $6 is always in the statement (typed), whether it filters or not
    let by_status = match status {
        Some(s) => format!("AND {}", status_filter(s)),
        None => "AND $6::text IS NULL".to_string(),
    };
    let sql = if status.is_none() && !sort.needs_state() {
        // cut the page from the version's ids (an index-only scan in the order of the sort),
        // then fetch those rows and their state only
        format!(
            "SELECT {ROW_COLUMNS}, {state_cols} FROM \
               (SELECT vr.resource_id FROM version_resources vr \
                WHERE {ROW_FILTER} {by_status} ORDER BY {order} {cut}) p \
             JOIN version_resources vr ON vr.environment_id = $1 AND vr.version = $2 \
               AND vr.resource_id = p.resource_id \
             {JOIN_STATE} ORDER BY {order}"
        )
    } else {
        format!(
            "SELECT {ROW_COLUMNS}, {state_cols} FROM version_resources vr {JOIN_STATE} \
             WHERE {ROW_FILTER} {by_status} ORDER BY {order} {cut}"
        )
    };
    let text = nonempty(&filter.text).map(pattern);
    let mut tx = roomy(pool).await?;
    let rows = sqlx::query_as::<_, ResourceWithState>(sqlx::AssertSqlSafe(sql))
        .persistent(false)
        .bind(env)
        .bind(version)
        .bind(nonempty(&filter.agent))
        .bind(nonempty(&filter.resource_type))
        .bind(text)
        .bind(status)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// One pass over the version: counts by status under the agent, type and text filters, and
/// the version's agents and types.
async fn facets(
    pool: &PgPool,
    env: Uuid,
    version: i32,
    filter: &Filter,
) -> Result<(BTreeMap<String, i64>, Vec<String>, Vec<String>)> {
    let sql = format!(
        "SELECT {STATUS_SQL} AS status, vr.agent, vr.resource_type, \
           count(*) FILTER (WHERE ($3::text IS NULL OR vr.agent = $3) \
             AND ($4::text IS NULL OR vr.resource_type = $4) \
             AND ($5::text IS NULL OR vr.resource_id ILIKE $5 ESCAPE '\\')) \
         FROM version_resources vr {JOIN_STATE} \
         WHERE vr.environment_id = $1 AND vr.version = $2 \
         GROUP BY GROUPING SETS ((1), (2), (3))"
    );
    let mut tx = roomy(pool).await?;
    // (status, agent, type, count): one of the three is set, by grouping set
    type Group = (Option<String>, Option<String>, Option<String>, i64);
    let groups: Vec<Group> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .persistent(false)
        .bind(env)
        .bind(version)
        .bind(nonempty(&filter.agent))
        .bind(nonempty(&filter.resource_type))
        .bind(nonempty(&filter.text).map(pattern))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let (mut by_status, mut agents, mut types) = (BTreeMap::new(), Vec::new(), Vec::new());
    for (status, agent, rtype, n) in groups {
        match (status, agent, rtype) {
            (Some(s), None, None) if n > 0 => {
                by_status.insert(s, n);
            }
            (None, Some(a), None) => agents.push(a),
            (None, None, Some(t)) => types.push(t),
            _ => {}
        }
    }
    agents.sort();
    types.sort();
    Ok((by_status, agents, types))
}

/// A page of resources with the total matching its filter and the filter bar's counts and
/// choices.
pub async fn page(pool: &PgPool, env: Uuid, req: &PageRequest) -> Result<ResourcePage> {
    let (rows, (by_status, agents, types)) = tokio::try_join!(
        rows(pool, env, req),
        facets(pool, env, req.version, &req.filter)
    )?;
    let total = match nonempty(&req.filter.status) {
        Some(s) => by_status.get(s).copied().unwrap_or(0),
        None => by_status.values().sum(),
    };
    Ok(ResourcePage {
        rows,
        total,
        by_status,
        agents,
        types,
    })
}

/// One resource of `version` with its state (None: not in that version).
pub async fn one(
    e: impl sqlx::PgExecutor<'_>,
    env: Uuid,
    version: i32,
    resource_id: &str,
) -> Result<Option<ResourceWithState>> {
    let sql = format!(
        "SELECT {ROW_COLUMNS}, {} FROM version_resources vr {JOIN_STATE} \
         WHERE vr.environment_id = $1 AND vr.version = $2 AND vr.resource_id = $3",
        state_columns()
    );
    Ok(
        sqlx::query_as::<_, ResourceWithState>(sqlx::AssertSqlSafe(sql))
            .bind(env)
            .bind(version)
            .bind(resource_id)
            .fetch_optional(e)
            .await?,
    )
}

/// The resources of `version` that require `resource_id`, in id order (at most `limit`).
pub async fn required_by(
    e: impl sqlx::PgExecutor<'_>,
    env: Uuid,
    version: i32,
    resource_id: &str,
    limit: i64,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT resource_id FROM version_resources \
         WHERE environment_id = $1 AND version = $2 AND $3 = ANY(requires) \
         ORDER BY resource_id LIMIT $4",
    )
    .bind(env)
    .bind(version)
    .bind(resource_id)
    .bind(limit)
    .fetch_all(e)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_take_wildcards_literally() {
        assert_eq!(pattern("a_b%c\\"), "%a\\_b\\%c\\\\%");
        assert_eq!(pattern("File["), "%File[%");
    }

    #[test]
    fn sort_keys_round_trip() {
        for k in SortKey::ALL {
            assert_eq!(SortKey::parse(k.as_str()), Some(k));
        }
        assert_eq!(SortKey::parse("nope"), None);
    }
}
