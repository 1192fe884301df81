//! One page of a version's resources with their state: filtered (status, agent, type, text in
//! the id), sorted and cut in PostgreSQL, with the counts a filter bar shows. Built to stay
//! fast at 100,000 resources (`examples/bench_console.rs` measures it):
//!
//! - The status is a CASE over the version's row and the state row ([`STATUS_SQL`]), so
//!   counting by status joins every resource of the version once. That one pass (grouping
//!   sets) gives the counts by status under the other filters, the agents and the types.
//! - The page itself, when it neither filters nor sorts by status or deploy time, is cut from
//!   `resource_spans` alone (its primary key is in id order) and only its rows are joined
//!   with their state.
//! - A status filter is written on the underlying columns as well (a result is
//!   `last_result = X`), so the planner sees how selective it is and can start from the few
//!   failed rows rather than from the whole version.
//! - The statements are not kept prepared: a generic plan of these optional filters is poor
//!   (measured: a nested loop over the whole version), so each is planned for its values.
//! - Both queries run at once, on two connections; the facets are kept between views while
//!   the environment does not change ([`FacetCache`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::facet_cache::{Choices, Counts, FacetCache};
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
            SortKey::Status => format!("status COLLATE \"C\"{d}, vr.resource_id{d}"),
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
const ROW_FILTER: &str = "vr.environment_id = $1 AND vr.first_version <= $2 AND vr.last_version >= $2 \
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

/// The rows of one page, as the planner sees fit, or (`walk`) by walking the version in the
/// order of the sort and looking each resource's state up until the page is full: far
/// cheaper when many resources match a status filter, which the planner can not know (it
/// estimates such a filter to match almost nothing).
async fn rows(
    pool: &PgPool,
    env: Uuid,
    req: &PageRequest,
    walk: bool,
) -> Result<Vec<ResourceWithState>> {
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
               (SELECT vr.resource_id FROM resource_spans vr \
                WHERE {ROW_FILTER} {by_status} ORDER BY {order} {cut}) p \
             JOIN resource_spans vr ON vr.environment_id = $1 AND vr.resource_id = p.resource_id \
               AND vr.first_version <= $2 AND vr.last_version >= $2 \
             {JOIN_STATE} ORDER BY {order}"
        )
    } else {
        format!(
            "SELECT {ROW_COLUMNS}, {state_cols} FROM resource_spans vr {JOIN_STATE} \
             WHERE {ROW_FILTER} {by_status} ORDER BY {order} {cut}"
        )
    };
    let text = nonempty(&filter.text).map(pattern);
    let mut tx = roomy(pool).await?;
    if walk {
        sqlx::raw_sql(
            "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; \
             SET LOCAL enable_sort = off",
        )
        .execute(&mut *tx)
        .await?;
    }
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

/// Counts by status under the agent, type and text filters (one pass over the resources
/// they leave).
async fn counts(pool: &PgPool, env: Uuid, version: i32, filter: &Filter) -> Result<Counts> {
    let sql = format!(
        "SELECT {STATUS_SQL} AS status, count(*) FROM resource_spans vr {JOIN_STATE} \
         WHERE {ROW_FILTER} GROUP BY 1"
    );
    let mut tx = roomy(pool).await?;
    let counts: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .persistent(false)
        .bind(env)
        .bind(version)
        .bind(nonempty(&filter.agent))
        .bind(nonempty(&filter.resource_type))
        .bind(nonempty(&filter.text).map(pattern))
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(counts.into_iter().filter(|(_, n)| *n > 0).collect())
}

/// The agents and the types of a version, sorted (from its indexes on both).
async fn choices(pool: &PgPool, env: Uuid, version: i32) -> Result<Choices> {
    let rows: Vec<(bool, String)> = sqlx::query_as(
        "SELECT true, agent FROM (SELECT DISTINCT agent FROM resource_spans \
           WHERE environment_id = $1 AND first_version <= $2 AND last_version >= $2) a \
         UNION ALL SELECT false, resource_type FROM (SELECT DISTINCT resource_type FROM resource_spans \
           WHERE environment_id = $1 AND first_version <= $2 AND last_version >= $2) t",
    )
    .bind(env)
    .bind(version)
    .fetch_all(pool)
    .await?;
    let (mut agents, mut types) = (Vec::new(), Vec::new());
    for (is_agent, name) in rows {
        if is_agent {
            agents.push(name)
        } else {
            types.push(name)
        }
    }
    agents.sort();
    types.sort();
    Ok((agents, types))
}

/// The counts under `filter` and the version's choices, from the cache or PostgreSQL (both
/// queries at once).
async fn facets(
    pool: &PgPool,
    cache: &FacetCache,
    env: Uuid,
    version: i32,
    filter: &Filter,
) -> Result<(Arc<Counts>, Arc<Choices>)> {
    let kept_counts = cache.get(env, version, filter);
    let counted = async {
        match kept_counts {
            Ok(c) => Ok(c),
            Err(ticket) => {
                let c = Arc::new(counts(pool, env, version, filter).await?);
                cache.put(ticket, c.clone());
                Ok(c)
            }
        }
    };
    tokio::try_join!(counted, kept_choices(pool, cache, env, version))
}

async fn kept_choices(
    pool: &PgPool,
    cache: &FacetCache,
    env: Uuid,
    version: i32,
) -> Result<Arc<Choices>> {
    if let Some(c) = cache.choices(env, version) {
        return Ok(c);
    }
    let c = Arc::new(choices(pool, env, version).await?);
    cache.put_choices(env, version, c.clone());
    Ok(c)
}

/// A page sorted by deploy time and the counts by status, from one join of the version with
/// its state (both need every resource's state: joining once halves the work).
async fn by_deploy_time_with_counts(
    pool: &PgPool,
    env: Uuid,
    req: &PageRequest,
) -> Result<(Counts, Vec<ResourceWithState>)> {
    let filter = &req.filter;
    let d = if req.desc { " DESC" } else { "" };
    let cut = format!(
        "OFFSET {} {}",
        req.offset.max(0),
        req.limit
            .map(|l| format!("LIMIT {}", l.max(0)))
            .unwrap_or_default()
    );
    let sql = format!(
        "WITH j AS MATERIALIZED (SELECT vr.resource_id, {STATUS_SQL} AS status, s.last_deployed \
           FROM resource_spans vr {JOIN_STATE} WHERE {ROW_FILTER}) \
         SELECT status, count(*), NULL::integer FROM j GROUP BY status \
         UNION ALL SELECT resource_id, 0, (row_number() OVER ())::integer FROM \
           (SELECT resource_id FROM j WHERE $6::text IS NULL OR status = $6 \
            ORDER BY last_deployed{d} NULLS LAST, resource_id{d} {cut}) p"
    );
    let mut tx = roomy(pool).await?;
    // (status, count, None) or (resource id, 0, its place on the page)
    let got: Vec<(String, i64, Option<i32>)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .persistent(false)
        .bind(env)
        .bind(req.version)
        .bind(nonempty(&filter.agent))
        .bind(nonempty(&filter.resource_type))
        .bind(nonempty(&filter.text).map(pattern))
        .bind(nonempty(&filter.status))
        .fetch_all(&mut *tx)
        .await?;
    let (mut counts, mut ids) = (Counts::new(), Vec::new());
    for (key, n, place) in got {
        match place {
            Some(p) => ids.push((p, key)),
            None if n > 0 => {
                counts.insert(key, n);
            }
            None => {}
        }
    }
    ids.sort();
    let ids: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
    let sql = format!(
        "SELECT {ROW_COLUMNS}, {} FROM resource_spans vr {JOIN_STATE} \
         WHERE vr.environment_id = $1 AND vr.first_version <= $2 AND vr.last_version >= $2 \
         AND vr.resource_id = ANY($3)",
        state_columns()
    );
    let mut rows: Vec<ResourceWithState> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(req.version)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let place: std::collections::HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    rows.sort_by_key(|r| place.get(r.resource_id.as_str()).copied());
    Ok((counts, rows))
}

/// A page of resources with the total matching its filter and the filter bar's counts and
/// choices. The facets come from `cache` while the environment has not changed since they
/// were counted ([`FacetCache`]); otherwise both queries run at once.
pub async fn page(
    pool: &PgPool,
    cache: &FacetCache,
    env: Uuid,
    req: &PageRequest,
) -> Result<ResourcePage> {
    let filter = Filter {
        status: nonempty(&req.filter.status).map(str::to_string),
        agent: nonempty(&req.filter.agent).map(str::to_string),
        resource_type: nonempty(&req.filter.resource_type).map(str::to_string),
        text: nonempty(&req.filter.text).map(str::to_string),
    };
    if req.sort == SortKey::Deployed
        && let Err(ticket) = cache.get(env, req.version, &filter)
    {
        let ((counts, rows), choices) = tokio::try_join!(
            by_deploy_time_with_counts(pool, env, req),
            kept_choices(pool, cache, env, req.version)
        )?;
        let counts = Arc::new(counts);
        cache.put(ticket, counts.clone());
        return Ok(assemble(rows, &filter, (counts, choices)));
    }
    if filter.status.is_none() && req.sort != SortKey::Status {
        // the rows need no counts: both at once
        let (rows, facets) = tokio::try_join!(
            rows(pool, env, req, false),
            facets(pool, cache, env, req.version, &filter)
        )?;
        return Ok(assemble(rows, &filter, facets));
    }
    let facets = facets(pool, cache, env, req.version, &filter).await?;
    let rows = counted_rows(pool, env, req, &facets.0).await?;
    Ok(assemble(rows, &filter, facets))
}

/// Resources a walk may visit to fill a page (beyond, the planner's own plan is cheaper).
const WALK_LIMIT: i64 = 20_000;

/// The rows of a page, planned with the counts by status (under the other filters): a page
/// sorted by status is cut into pages filtered by one status each, in the order of the
/// statuses; a status filter that many resources match is walked.
async fn counted_rows(
    pool: &PgPool,
    env: Uuid,
    req: &PageRequest,
    by_status: &BTreeMap<String, i64>,
) -> Result<Vec<ResourceWithState>> {
    let all: i64 = by_status.values().sum();
    // visiting (offset + limit) * all / matching resources fills the page
    let walkable = |matching: i64, req: &PageRequest| {
        let wanted = req.offset.max(0) + req.limit.unwrap_or(i64::MAX / 4).max(0);
        matching > 0
            && matches!(req.sort, SortKey::Id | SortKey::Type | SortKey::Agent)
            && (wanted as i128) * (all as i128) / (matching as i128) <= WALK_LIMIT as i128
    };
    if req.sort != SortKey::Status {
        let walk = match nonempty(&req.filter.status) {
            Some(s) => walkable(by_status.get(s).copied().unwrap_or(0), req),
            None => false,
        };
        return rows(pool, env, req, walk).await;
    }
    // sorted by status (byte order, as the SQL sorts it), then id: each status is a run
    let mut statuses: Vec<(&String, i64)> = match nonempty(&req.filter.status) {
        Some(s) => by_status
            .get_key_value(s)
            .map(|(k, n)| vec![(k, *n)])
            .unwrap_or_default(),
        None => by_status.iter().map(|(k, n)| (k, *n)).collect(),
    };
    if req.desc {
        statuses.reverse();
    }
    let (mut skip, mut room) = (req.offset.max(0), req.limit.unwrap_or(i64::MAX));
    let mut out = Vec::new();
    for (status, n) in statuses {
        if room <= 0 {
            break;
        }
        if skip >= n {
            skip -= n;
            continue;
        }
        let part = PageRequest {
            version: req.version,
            filter: Filter {
                status: Some(status.clone()),
                ..req.filter.clone()
            },
            sort: SortKey::Id,
            desc: req.desc,
            offset: skip,
            limit: Some(room.min(n - skip)),
        };
        let walk = walkable(n, &part);
        let got = rows(pool, env, &part, walk).await?;
        room -= got.len() as i64;
        out.extend(got);
        skip = 0;
    }
    Ok(out)
}

fn assemble(
    rows: Vec<ResourceWithState>,
    filter: &Filter,
    (counts, choices): (Arc<Counts>, Arc<Choices>),
) -> ResourcePage {
    let total = match &filter.status {
        Some(s) => counts.get(s).copied().unwrap_or(0),
        None => counts.values().sum(),
    };
    ResourcePage {
        rows,
        total,
        by_status: counts.as_ref().clone(),
        agents: choices.0.clone(),
        types: choices.1.clone(),
    }
}

/// One resource of `version` with its state (None: not in that version).
pub async fn one(
    e: impl sqlx::PgExecutor<'_>,
    env: Uuid,
    version: i32,
    resource_id: &str,
) -> Result<Option<ResourceWithState>> {
    let sql = format!(
        "SELECT {ROW_COLUMNS}, {} FROM resource_spans vr {JOIN_STATE} \
         WHERE vr.environment_id = $1 AND vr.resource_id = $3 \
         AND vr.first_version <= $2 AND vr.last_version >= $2",
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
        "SELECT resource_id FROM resource_spans \
         WHERE environment_id = $1 AND first_version <= $2 AND last_version >= $2 AND $3 = ANY(requires) \
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
