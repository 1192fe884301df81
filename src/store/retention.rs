//! Retention: the records that grow with time are pruned to what each environment's
//! `retention` settings keep. Deletes go in bounded batches so a large backlog never holds
//! long locks; what is still in use (open actions, queued or running compiles, reports of
//! versions that exist, undelivered messages) is never pruned.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::Result;
use crate::model::settings::Retention;

/// Rows deleted by one statement at most.
const BATCH: i64 = 5_000;

/// What one pass deleted, by table.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Pruned {
    pub actions: u64,
    pub compiles: u64,
    pub commit_events: u64,
    pub dryruns: u64,
    pub webhook_deliveries: u64,
    pub outbox: u64,
    pub audit: u64,
    pub code_blobs: u64,
    /// Resource attributes no version refers to (left by a store that rolled back after
    /// the collector skipped them, or by environments deleted before blobs were collected).
    pub resource_blobs: u64,
    pub console_sessions: u64,
    /// Leases and list entries of agents no version uses.
    pub agent_leases: u64,
    /// Facts of resources that are in no stored version any more.
    pub facts: u64,
    /// Closed pull-request previews, and old runs of open ones.
    pub previews: u64,
}

impl Pruned {
    pub fn total(&self) -> u64 {
        self.actions
            + self.compiles
            + self.commit_events
            + self.dryruns
            + self.webhook_deliveries
            + self.outbox
            + self.audit
            + self.code_blobs
            + self.resource_blobs
            + self.console_sessions
            + self.agent_leases
            + self.facts
            + self.previews
    }
}

/// Run `sql` (which deletes at most BATCH rows, binding the environment as $1 and then
/// `bind`) until it deletes fewer.
async fn drain<'q, F>(pool: &PgPool, sql: &'static str, bind: F) -> Result<u64>
where
    F: Fn(
        sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
{
    let mut total = 0;
    loop {
        let n = bind(sqlx::query(sql)).execute(pool).await?.rows_affected();
        total += n;
        if n < BATCH as u64 {
            return Ok(total);
        }
    }
}

/// Prune one environment. `since`: actions written after it are the ones whose resources
/// may be over the per-resource limit (None: look at all of them).
pub async fn prune_environment(
    pool: &PgPool,
    env: Uuid,
    r: &Retention,
    since: Option<DateTime<Utc>>,
) -> Result<Pruned> {
    let mut p = Pruned::default();
    p.actions += drain(
        pool,
        "DELETE FROM resource_actions WHERE id IN (SELECT id FROM resource_actions \
         WHERE environment_id = $1 AND finished_at IS NOT NULL \
         AND started_at < now() - make_interval(days => $2::int) LIMIT 5000)",
        |q| q.bind(env).bind(r.days as i32),
    )
    .await?;
    // resources over their per-resource limit: only those that got actions lately
    let busy: Vec<String> = sqlx::query_scalar(
        "SELECT resource_id FROM resource_actions WHERE environment_id = $1 \
         AND started_at >= COALESCE($2, '-infinity'::timestamptz) \
         GROUP BY resource_id",
    )
    .bind(env)
    .bind(since)
    .fetch_all(pool)
    .await?;
    for chunk in busy.chunks(500) {
        let chunk = chunk.to_vec();
        p.actions += drain(
            pool,
            "DELETE FROM resource_actions WHERE id IN (SELECT id FROM ( \
               SELECT id, finished_at, row_number() OVER (PARTITION BY resource_id ORDER BY started_at DESC) AS n \
               FROM resource_actions WHERE environment_id = $1 AND resource_id = ANY($2)) x \
             WHERE n > $3 AND finished_at IS NOT NULL LIMIT 5000)",
            |q| q.bind(env).bind(chunk.clone()).bind(r.actions_per_resource as i64),
        )
        .await?;
    }
    // compile reports: those of versions that exist are kept (they tell where a version
    // came from); of the rest, the newest `compile_reports` and those younger than `days`
    p.compiles += drain(
        pool,
        "DELETE FROM compiles WHERE id IN (SELECT id FROM ( \
           SELECT c.id, c.requested_at, row_number() OVER (ORDER BY c.requested_at DESC) AS n \
           FROM compiles c WHERE c.environment_id = $1 AND c.status NOT IN ('queued', 'running') \
           AND NOT EXISTS (SELECT 1 FROM versions v WHERE v.environment_id = c.environment_id AND v.number = c.version)) x \
         WHERE n > $2 OR requested_at < now() - make_interval(days => $3::int) LIMIT 5000)",
        |q| q.bind(env).bind(r.compile_reports as i64).bind(r.days as i32),
    )
    .await?;
    // previews of closed pull requests beyond the newest `previews` or older than `days`
    // go whole (runs and changes cascade); an open one keeps its newest runs
    {
        let mut c = pool.acquire().await?;
        p.previews += super::previews::prune(
            &mut c,
            env,
            r.previews as i64,
            Utc::now() - chrono::Duration::days(r.days as i64),
        )
        .await?;
    }
    // a commit's timeline goes whole, once its last event is old
    p.commit_events += drain(
        pool,
        "DELETE FROM commit_events WHERE id IN (SELECT e.id FROM commit_events e \
         WHERE e.environment_id = $1 AND e.commit IN (SELECT commit FROM commit_events \
           WHERE environment_id = $1 GROUP BY commit HAVING max(at) < now() - make_interval(days => $2::int)) \
         LIMIT 5000)",
        |q| q.bind(env).bind(r.days as i32),
    )
    .await?;
    p.dryruns += drain(
        pool,
        "DELETE FROM dryruns WHERE id IN (SELECT id FROM ( \
           SELECT id, created_at, row_number() OVER (ORDER BY created_at DESC) AS n \
           FROM dryruns WHERE environment_id = $1) x \
         WHERE n > $2 OR created_at < now() - make_interval(days => $3::int) LIMIT 5000)",
        |q| q.bind(env).bind(r.dryruns as i64).bind(r.days as i32),
    )
    .await?;
    // deliveries only guard against replays of recent webhooks
    p.webhook_deliveries += drain(
        pool,
        "DELETE FROM webhook_deliveries WHERE (environment_id, delivery_id) IN ( \
           SELECT environment_id, delivery_id FROM webhook_deliveries WHERE environment_id = $1 \
           AND received_at < now() - make_interval(days => $2::int) LIMIT 5000)",
        |q| q.bind(env).bind(r.days.min(7) as i32),
    )
    .await?;
    p.outbox += drain(
        pool,
        "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE environment_id = $1 \
         AND (delivered_at IS NOT NULL OR abandoned_at IS NOT NULL) \
         AND created_at < now() - make_interval(days => $2::int) LIMIT 5000)",
        |q| q.bind(env).bind(r.days as i32),
    )
    .await?;
    p.audit += drain(
        pool,
        "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE environment_id = $1 \
         AND at < now() - make_interval(days => $2::int) LIMIT 5000)",
        |q| q.bind(env).bind(r.audit_days as i32),
    )
    .await?;
    // facts of resources no stored version holds (an hour's grace: a fact may be set for a
    // resource whose version is being stored); the environment's parameters never go
    p.facts += drain(
        pool,
        "DELETE FROM parameters WHERE id IN (SELECT p.id FROM parameters p \
         WHERE p.environment_id = $1 AND p.resource_id <> '' AND p.updated < now() - interval '1 hour' \
         AND NOT EXISTS (SELECT 1 FROM resource_spans vr \
           WHERE vr.environment_id = p.environment_id AND vr.resource_id = p.resource_id) \
         LIMIT 5000)",
        |q| q.bind(env),
    )
    .await?;
    Ok(p)
}

/// Prune what belongs to no environment: global audit records older than `audit_days`, and
/// handler code that no version refers to (after an hour's grace: a version being stored
/// may be about to).
pub async fn prune_global(pool: &PgPool, audit_days: u32) -> Result<Pruned> {
    let mut p = Pruned::default();
    p.audit += drain(
        pool,
        "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log WHERE environment_id IS NULL \
         AND at < now() - make_interval(days => $1::int) LIMIT 5000)",
        |q| q.bind(audit_days as i32),
    )
    .await?;
    p.code_blobs += drain(
        pool,
        "DELETE FROM code_blobs WHERE hash IN (SELECT b.hash FROM code_blobs b \
         WHERE b.created_at < now() - interval '1 hour' AND NOT EXISTS ( \
           SELECT 1 FROM version_handlers h, jsonb_each(h.files) f WHERE f.value->>'hash' = b.hash) \
         LIMIT 5000)",
        |q| q,
    )
    .await?;
    p.resource_blobs += prune_resource_blobs(pool).await?;
    p.console_sessions += drain(
        pool,
        "DELETE FROM console_sessions WHERE secret_hash IN (SELECT secret_hash FROM console_sessions \
         WHERE expires_at < now() LIMIT 5000)",
        |q| q,
    )
    .await?;
    // leases of agents nobody deploys to, ten minutes after their process let them go
    loop {
        let n = super::leases::prune_unused_agent_leases(pool, 600).await?;
        p.agent_leases += n;
        if n < BATCH as u64 {
            break;
        }
    }
    // and their rows in the agents list, once their lease is gone (a paused one stays: the
    // pause is an operator's decision)
    p.agent_leases += drain(
        pool,
        "DELETE FROM agents WHERE (environment_id, name) IN (SELECT a.environment_id, a.name FROM agents a \
         WHERE NOT a.paused AND NOT a.unpause_on_resume \
         AND NOT EXISTS (SELECT 1 FROM resource_spans r WHERE r.environment_id = a.environment_id AND r.agent = a.name) \
         AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.kind = 'agent' AND l.key = a.environment_id::text || '/' || a.name) \
         LIMIT 5000)",
        |q| q,
    )
    .await?;
    Ok(p)
}

/// Resource attributes no span refers to: found without locks, then collected as a
/// version deletion collects them (each locked first, skipping one a store in progress
/// holds, and deleted only if no span refers to it in a snapshot taken after the lock).
async fn prune_resource_blobs(pool: &PgPool) -> Result<u64> {
    let mut total = 0;
    loop {
        let unused: Vec<String> = sqlx::query_scalar(
            "SELECT b.hash FROM resource_blobs b \
             WHERE NOT EXISTS (SELECT 1 FROM resource_spans s WHERE s.hash = b.hash) LIMIT $1",
        )
        .bind(BATCH)
        .fetch_all(pool)
        .await?;
        if unused.is_empty() {
            return Ok(total);
        }
        let mut tx = pool.begin().await?;
        let n = super::versions::collect_blobs(&mut tx, &unused).await?;
        tx.commit().await?;
        total += n;
        // what is left was held by stores: their spans refer to it now, or the next pass
        // finds it again
        if (unused.len() as i64) < BATCH || n == 0 {
            return Ok(total);
        }
    }
}

/// Prune every environment and the global tables, every `every`, for ever. A failed pass
/// (the database away) is logged and tried again at the next one.
pub async fn run(pool: PgPool, every: std::time::Duration) {
    let mut last_pass: Option<DateTime<Utc>> = None;
    loop {
        let started = Utc::now();
        match prune_all(&pool, last_pass).await {
            Ok(p) if p.total() > 0 => tracing::info!(pruned = ?p, "retention: old records pruned"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention pass failed; trying again later"),
        }
        // a minute's overlap: actions written while the last pass ran are looked at again
        last_pass = Some(started - chrono::Duration::minutes(1));
        tokio::time::sleep(every).await;
    }
}

/// One pass over everything.
pub async fn prune_all(pool: &PgPool, since: Option<DateTime<Utc>>) -> Result<Pruned> {
    let mut total = prune_global(pool, Retention::default().audit_days).await?;
    for env in super::environments::list_environments(pool, None).await? {
        let p = prune_environment(pool, env.id, &env.settings.retention, since).await?;
        total.actions += p.actions;
        total.compiles += p.compiles;
        total.commit_events += p.commit_events;
        total.dryruns += p.dryruns;
        total.webhook_deliveries += p.webhook_deliveries;
        total.outbox += p.outbox;
        total.audit += p.audit;
        total.facts += p.facts;
    }
    Ok(total)
}
