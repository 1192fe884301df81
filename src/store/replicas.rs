//! Server replicas sharing one database: who is alive (a heartbeat row each), where they
//! are reached, and which of them owns which environment (leases of kind `environment`,
//! see [`super::leases`]).

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::Result;

/// A replica as the others see it.
#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ReplicaRow {
    pub id: String,
    pub advertise_url: String,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub stopping: bool,
    pub version: String,
    /// seconds since its last heartbeat, by the database's clock
    pub heartbeat_age_s: f64,
}

/// Say "alive" (and where to be reached); the first beat registers the replica.
pub async fn heartbeat(
    e: impl PgExecutor<'_>,
    id: &str,
    advertise_url: &str,
    version: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO replicas (id, advertise_url, version) VALUES ($1, $2, $3) \
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopping = false, \
         advertise_url = EXCLUDED.advertise_url, version = EXCLUDED.version",
    )
    .bind(id)
    .bind(advertise_url)
    .bind(version)
    .execute(e)
    .await?;
    Ok(())
}

/// A replica starting a graceful stop: the others stop counting it from now on.
pub async fn mark_stopping(e: impl PgExecutor<'_>, id: &str) -> Result<()> {
    sqlx::query("UPDATE replicas SET stopping = true WHERE id = $1")
        .bind(id)
        .execute(e)
        .await?;
    Ok(())
}

/// A replica gone for good (stopped gracefully).
pub async fn remove(e: impl PgExecutor<'_>, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM replicas WHERE id = $1")
        .bind(id)
        .execute(e)
        .await?;
    Ok(())
}

/// Every registered replica, the ones not heard of for a while included.
pub async fn list(e: impl PgExecutor<'_>) -> Result<Vec<ReplicaRow>> {
    Ok(sqlx::query_as(
        "SELECT id, advertise_url, started_at, heartbeat_at, stopping, version, \
         extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s \
         FROM replicas ORDER BY started_at, id",
    )
    .fetch_all(e)
    .await?)
}

/// Ids of the replicas that count for sharing: heard of within `ttl_ms`, not stopping.
pub async fn live(e: impl PgExecutor<'_>, ttl_ms: i64) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM replicas WHERE NOT stopping \
         AND heartbeat_at >= now() - make_interval(secs => $1::float8 / 1000) ORDER BY id",
    )
    .bind(ttl_ms)
    .fetch_all(e)
    .await?)
}

/// Forget replicas not heard of for `older_than_s` (kill -9'd long ago).
pub async fn forget_silent(e: impl PgExecutor<'_>, older_than_s: f64) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM replicas WHERE heartbeat_at < now() - make_interval(secs => $1) \
         AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.kind = 'environment' \
                         AND l.holder = replicas.id AND l.expires_at >= now())",
    )
    .bind(older_than_s)
    .execute(e)
    .await?
    .rows_affected())
}

/// Where the current owner of `env` is reached: (replica id, advertise URL), if a live
/// lease names one.
pub async fn owner_of(e: impl PgExecutor<'_>, env: Uuid) -> Result<Option<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT r.id, r.advertise_url FROM leases l JOIN replicas r ON r.id = l.holder \
         WHERE l.kind = 'environment' AND l.key = $1 AND l.expires_at >= now()",
    )
    .bind(env.to_string())
    .fetch_optional(e)
    .await?)
}

/// Ids of every environment (the work to spread).
pub async fn environment_ids(e: impl PgExecutor<'_>) -> Result<Vec<Uuid>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM environments ORDER BY id")
            .fetch_all(e)
            .await?,
    )
}

/// The secret replicas show each other now (the current one), made by the first replica
/// that asks. Read on every call a replica sends, so a rotation takes effect at once.
pub async fn secret(e: &sqlx::PgPool) -> Result<String> {
    let fresh = crate::store::tokens::new_secret();
    // one current secret (a unique index): two replicas racing here make one
    sqlx::query(
        "INSERT INTO replica_secrets (secret) SELECT $1 \
         WHERE NOT EXISTS (SELECT 1 FROM replica_secrets WHERE retire_at IS NULL) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&fresh)
    .execute(e)
    .await?;
    // replicas of the previous release read this table
    sqlx::query("INSERT INTO replica_secret (secret) VALUES ($1) ON CONFLICT (id) DO NOTHING")
        .bind(&fresh)
        .execute(e)
        .await?;
    Ok(
        sqlx::query_scalar("SELECT secret FROM replica_secrets WHERE retire_at IS NULL")
            .fetch_one(e)
            .await?,
    )
}

/// The current secret (made when there is none).
pub async fn current_secret(e: &sqlx::PgPool) -> Result<String> {
    let current: Option<String> =
        sqlx::query_scalar("SELECT secret FROM replica_secrets WHERE retire_at IS NULL")
            .fetch_optional(e)
            .await?;
    match current {
        Some(s) => Ok(s),
        None => secret(e).await,
    }
}

/// The secrets a replica accepts now: the current one and those still in their grace period.
pub async fn accepted_secrets(e: impl PgExecutor<'_>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT secret FROM replica_secrets WHERE retire_at IS NULL OR retire_at > now()",
    )
    .fetch_all(e)
    .await?)
}

/// Make a new current secret; the old one is accepted for `grace` more, then refused.
/// Secrets retired for over a day are forgotten.
pub async fn rotate_secret(e: &sqlx::PgPool, grace: std::time::Duration) -> Result<()> {
    let fresh = crate::store::tokens::new_secret();
    let mut tx = e.begin().await?;
    sqlx::query(
        "UPDATE replica_secrets SET retire_at = now() + make_interval(secs => $1) \
         WHERE retire_at IS NULL",
    )
    .bind(grace.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO replica_secrets (secret) VALUES ($1)")
        .bind(&fresh)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO replica_secret (secret) VALUES ($1) \
         ON CONFLICT (id) DO UPDATE SET secret = EXCLUDED.secret",
    )
    .bind(&fresh)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM replica_secrets WHERE retire_at < now() - interval '1 day'")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// One environment's lease as `steward server status` shows it.
#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct OwnershipRow {
    pub environment_id: Uuid,
    /// `project/environment`
    pub name: String,
    pub holder: String,
    pub term: i64,
    pub acquired_at: DateTime<Utc>,
    /// seconds since the holder last renewed it
    pub renewed_age_s: f64,
    /// seconds until it expires (negative: expired, nobody holds it)
    pub expires_in_s: f64,
}

/// Every environment's lease (environments never owned have none).
pub async fn ownership(e: impl PgExecutor<'_>) -> Result<Vec<OwnershipRow>> {
    Ok(sqlx::query_as(
        "SELECT en.id AS environment_id, p.name || '/' || en.name AS name, l.holder, l.term, \
         l.acquired_at, extract(epoch FROM now() - l.renewed_at)::float8 AS renewed_age_s, \
         extract(epoch FROM l.expires_at - now())::float8 AS expires_in_s \
         FROM leases l JOIN environments en ON en.id::text = l.key \
         JOIN projects p ON p.id = en.project_id \
         WHERE l.kind = 'environment' ORDER BY l.holder, name",
    )
    .fetch_all(e)
    .await?)
}

/// A replica and the environments it owns.
#[derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ReplicaView {
    #[serde(flatten)]
    pub replica: ReplicaRow,
    /// counts for sharing the work: heard of within the lease time and not stopping
    pub live: bool,
    pub environments: Vec<OwnershipRow>,
}

/// The replicas on this database and who owns what.
#[derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Replicas {
    /// the replica that answered (None: it runs without replicas, e.g. `--no-scheduler`)
    pub this: Option<String>,
    pub replicas: Vec<ReplicaView>,
    /// environments whose lease no live replica holds right now (moving, or never owned)
    pub unowned: Vec<OwnershipRow>,
    /// how the replica that answered isolates compiles and handlers (absent from older
    /// replicas)
    #[serde(default)]
    pub isolation: Option<crate::sandbox::Isolation>,
}
