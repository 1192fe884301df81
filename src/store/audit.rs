//! The audit log: every mutation, who did it and when.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::Result;

#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub environment_id: Option<Uuid>,
    pub action: String,
    pub target: String,
    pub details: serde_json::Value,
}

pub async fn record(
    e: impl PgExecutor<'_>,
    actor: &str,
    environment: Option<Uuid>,
    action: &str,
    target: &str,
    details: serde_json::Value,
) -> Result<()> {
    sqlx::query("INSERT INTO audit_log (actor, environment_id, action, target, details) VALUES ($1, $2, $3, $4, $5)")
        .bind(actor)
        .bind(environment)
        .bind(action)
        .bind(target)
        .bind(details)
        .execute(e)
        .await?;
    Ok(())
}

/// Which entries a listing takes (all by default).
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    /// Only entries older than this id (the next page after an entry).
    pub before: Option<i64>,
    /// Only this action (e.g. `source.set`).
    pub action: Option<String>,
}

/// Newest first; `environment` None lists everything.
pub async fn list(
    e: impl PgExecutor<'_>,
    environment: Option<Uuid>,
    filter: &AuditFilter,
    limit: i64,
) -> Result<Vec<AuditEntry>> {
    Ok(sqlx::query_as::<_, AuditEntry>(
        "SELECT id, at, actor, environment_id, action, target, details FROM audit_log \
         WHERE ($1::uuid IS NULL OR environment_id = $1) AND ($2::bigint IS NULL OR id < $2) \
         AND ($3::text IS NULL OR action = $3) ORDER BY id DESC LIMIT $4",
    )
    .bind(environment)
    .bind(filter.before)
    .bind(filter.action.as_deref())
    .bind(limit)
    .fetch_all(e)
    .await?)
}

/// The actions an environment's log holds (to filter by), in order.
pub async fn actions(e: impl PgExecutor<'_>, environment: Uuid) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT action FROM audit_log WHERE environment_id = $1 ORDER BY action",
    )
    .bind(environment)
    .fetch_all(e)
    .await?)
}
