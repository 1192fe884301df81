//! The resource action log, written by executors (through the scheduler or the API).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{Result, StoreError};

/// One log line of an action, with structured fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    pub level: String,
    pub message: String,
    #[serde(default)]
    pub fields: serde_json::Map<String, serde_json::Value>,
    pub at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ActionRecord {
    pub id: Uuid,
    pub environment_id: Uuid,
    pub version: i32,
    pub resource_id: String,
    pub action: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub status: String,
    pub change: String,
    pub changes: serde_json::Value,
    pub messages: serde_json::Value,
}

pub const ACTIONS: [&str; 4] = ["deploy", "dryrun", "repair", "delete"];
pub const CHANGES: [&str; 4] = ["nochange", "created", "updated", "purged"];

pub fn validate(r: &ActionRecord) -> Result<()> {
    if !ACTIONS.contains(&r.action.as_str()) {
        return Err(StoreError::Invalid(format!(
            "action must be one of {}",
            ACTIONS.join(", ")
        )));
    }
    if !CHANGES.contains(&r.change.as_str()) {
        return Err(StoreError::Invalid(format!(
            "change must be one of {}",
            CHANGES.join(", ")
        )));
    }
    if !r.messages.is_array() || !r.changes.is_object() {
        return Err(StoreError::Invalid(
            "messages must be a list and changes an object".into(),
        ));
    }
    Ok(())
}

/// Insert or complete an action record (the same id is written at start and at the end).
pub async fn upsert(e: impl PgExecutor<'_>, r: &ActionRecord) -> Result<()> {
    validate(r)?;
    // the environment's row locked as a foreign key would (resource_actions has none: see
    // migrations/0022): a deleted environment gets no record, one being deleted waits
    let done = sqlx::query(
        "INSERT INTO resource_actions (id, environment_id, version, resource_id, action, started_at, finished_at, \
         status, change, changes, messages) \
         SELECT $1, e.id, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM environments e WHERE e.id = $2 FOR KEY SHARE \
         ON CONFLICT (id) DO UPDATE SET finished_at = EXCLUDED.finished_at, status = EXCLUDED.status, \
         change = EXCLUDED.change, changes = EXCLUDED.changes, messages = EXCLUDED.messages \
         WHERE resource_actions.environment_id = EXCLUDED.environment_id \
         AND resource_actions.resource_id = EXCLUDED.resource_id",
    )
    .bind(r.id)
    .bind(r.environment_id)
    .bind(r.version)
    .bind(&r.resource_id)
    .bind(&r.action)
    .bind(r.started_at)
    .bind(r.finished_at)
    .bind(&r.status)
    .bind(&r.change)
    .bind(&r.changes)
    .bind(&r.messages)
    .execute(e)
    .await?;
    // an id of another environment's (or resource's) action: never overwritten (or the
    // environment was deleted since the caller looked it up)
    if done.rows_affected() == 0 {
        return Err(StoreError::Conflict(format!(
            "action {} belongs to another environment or resource",
            r.id
        )));
    }
    Ok(())
}

const COLUMNS: &str = "id, environment_id, version, resource_id, action, started_at, finished_at, status, change, changes, messages";

/// Newest first.
pub async fn for_resource(
    e: impl PgExecutor<'_>,
    env: Uuid,
    resource_id: &str,
    limit: i64,
) -> Result<Vec<ActionRecord>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM resource_actions WHERE environment_id = $1 AND resource_id = $2 \
         ORDER BY started_at DESC LIMIT $3"
    );
    Ok(sqlx::query_as::<_, ActionRecord>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(resource_id)
        .bind(limit)
        .fetch_all(e)
        .await?)
}

/// Newest first, optionally one action kind.
pub async fn for_environment(
    e: impl PgExecutor<'_>,
    env: Uuid,
    action: Option<&str>,
    limit: i64,
) -> Result<Vec<ActionRecord>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM resource_actions WHERE environment_id = $1 AND ($2::text IS NULL OR action = $2) \
         ORDER BY started_at DESC LIMIT $3"
    );
    Ok(sqlx::query_as::<_, ActionRecord>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(action)
        .bind(limit)
        .fetch_all(e)
        .await?)
}

/// What deploying a version changed: resources counted once, by the change of their last
/// action that changed something (dry-runs aside), and the first `limit` of them by id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChangesMade {
    pub created: i64,
    pub updated: i64,
    pub purged: i64,
    /// `[resource id, change]`, by id
    pub first: Vec<(String, String)>,
}

/// Read from the environment's actions since the version was released: they are found by
/// the time index, and the action log gets no index of its own for this (each action is
/// written twice, and every index of the table twice with it). The minute before the release
/// covers a scheduler whose clock is behind the database's.
pub async fn changes_made(
    pool: &sqlx::PgPool,
    env: Uuid,
    version: i32,
    limit: i64,
) -> Result<ChangesMade> {
    const CHANGED: &str = "SELECT DISTINCT ON (a.resource_id) a.resource_id, a.change \
         FROM versions v JOIN resource_actions a ON a.environment_id = v.environment_id \
           AND a.started_at >= v.released_at - interval '1 minute' AND a.version = v.number \
         WHERE v.environment_id = $1 AND v.number = $2 \
           AND a.action <> 'dryrun' AND a.change <> 'nochange' \
         ORDER BY a.resource_id, a.started_at DESC";
    let counts: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT change, count(*) FROM ({CHANGED}) c GROUP BY change"
    )))
    .bind(env)
    .bind(version)
    .fetch_all(pool)
    .await?;
    let first: Vec<(String, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("{CHANGED} LIMIT $3")))
            .bind(env)
            .bind(version)
            .bind(limit)
            .fetch_all(pool)
            .await?;
    let mut made = ChangesMade {
        first,
        ..Default::default()
    };
    for (change, n) in counts {
        match change.as_str() {
            "created" => made.created = n,
            "updated" => made.updated = n,
            "purged" => made.purged = n,
            _ => {}
        }
    }
    Ok(made)
}
