//! The outbox: messages to the outside world (pipeline notifications, commit statuses),
//! written with the event they report and delivered at least once from here.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::Result;

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub environment_id: Uuid,
    pub kind: String,
    pub payload: Value,
    pub created_at: DateTime<Utc>,
    pub attempts: i32,
}

/// Queue a message (`kind`: notify | status).
pub async fn enqueue(e: impl PgExecutor<'_>, env: Uuid, kind: &str, payload: &Value) -> Result<()> {
    sqlx::query("INSERT INTO outbox (environment_id, kind, payload) VALUES ($1, $2, $3)")
        .bind(env)
        .bind(kind)
        .bind(payload)
        .execute(e)
        .await?;
    Ok(())
}

/// Claim up to `limit` messages that are due, oldest first. A claim is a lease of
/// `lease_s` seconds: if this process dies while delivering, the message is due again then.
pub async fn claim_due(e: impl PgExecutor<'_>, limit: i64, lease_s: f64) -> Result<Vec<OutboxRow>> {
    Ok(sqlx::query_as::<_, OutboxRow>(
        "UPDATE outbox SET next_attempt_at = now() + make_interval(secs => $2) \
         WHERE id IN (SELECT id FROM outbox WHERE delivered_at IS NULL AND abandoned_at IS NULL \
                      AND next_attempt_at <= now() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING id, environment_id, kind, payload, created_at, attempts",
    )
    .bind(limit)
    .bind(lease_s)
    .fetch_all(e)
    .await?)
}

pub async fn delivered(e: impl PgExecutor<'_>, id: i64) -> Result<()> {
    sqlx::query(
        "UPDATE outbox SET delivered_at = now(), attempts = attempts + 1, last_error = NULL WHERE id = $1",
    )
    .bind(id)
    .execute(e)
    .await?;
    Ok(())
}

/// A failed attempt: try again after `retry_in_s` seconds, or give up (None).
pub async fn failed(
    e: impl PgExecutor<'_>,
    id: i64,
    error: &str,
    retry_in_s: Option<f64>,
) -> Result<()> {
    sqlx::query(
        "UPDATE outbox SET attempts = attempts + 1, last_error = $2, \
         next_attempt_at = now() + make_interval(secs => COALESCE($3, 0)), \
         abandoned_at = CASE WHEN $3 IS NULL THEN now() END WHERE id = $1",
    )
    .bind(id)
    .bind(error)
    .bind(retry_in_s)
    .execute(e)
    .await?;
    Ok(())
}

/// Messages of an environment that are still to be delivered.
pub async fn pending_count(e: impl PgExecutor<'_>, env: Uuid) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE environment_id = $1 AND delivered_at IS NULL AND abandoned_at IS NULL",
    )
    .bind(env)
    .fetch_one(e)
    .await?)
}
