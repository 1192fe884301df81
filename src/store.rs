//! PostgreSQL: the only store. The pool, migrations, and one module per table group; this is
//! the only place with SQL (DESIGN.md §2, §4.6).
//!
//! Queries are runtime `sqlx::query_as` with `FromRow` rows (no database at build time). A
//! function running one query takes `impl PgExecutor` so callers pass a pool or a
//! transaction; one running several takes `&mut PgConnection`.

pub mod actions;
pub mod audit;
pub mod changes;
pub mod cluster;
pub mod code;
pub mod deploy;
pub mod environments;
pub mod facts;
pub mod failover;
pub mod leases;
pub mod outbox;
pub mod previews;
pub mod replicas;
pub mod retention;
pub mod sessions;
pub mod sources;
pub mod state;
pub mod tokens;
pub mod versions;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A write refused because its lease tenure ended (another replica or process holds it now).
    #[error("fenced: {0}")]
    Fenced(String),
    #[error("{0}")]
    Invalid(String),
    /// A version sent as its changes against a base that is no longer the newest version:
    /// the sender sends the whole version instead.
    #[error("{0}")]
    BaseMoved(String),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> StoreError {
        match &e {
            sqlx::Error::RowNotFound => StoreError::NotFound("row".into()),
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_) => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // unique_violation
                Some("23505") => StoreError::Conflict(db.message().to_string()),
                // foreign_key_violation, check_violation
                Some("23503") | Some("23514") => StoreError::Invalid(db.message().to_string()),
                // character_not_in_repertoire, untranslatable_character: a NUL character in
                // text or JSON (PostgreSQL can store neither) is the client's input, not a fault
                Some("22021") | Some("22P05") => StoreError::Invalid(format!(
                    "text can not hold this character: {}",
                    db.message()
                )),
                // admin shutdown, crash shutdown, cannot connect now; read-only transaction
                // (a connection that was on the primary when it was demoted to a standby)
                Some("57P01") | Some("57P02") | Some("57P03") | Some("25006") => {
                    StoreError::Unavailable(db.message().to_string())
                }
                _ => StoreError::Database(e.to_string()),
            },
            sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
                StoreError::Unavailable(e.to_string())
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> StoreError {
        use sqlx::migrate::MigrateError;
        match e {
            // the database went away while migrating: worth waiting for, like any query
            MigrateError::Execute(inner) | MigrateError::ExecuteMigration(inner, _) => {
                match StoreError::from(inner) {
                    StoreError::Unavailable(m) => {
                        StoreError::Unavailable(format!("migration interrupted: {m}"))
                    }
                    other => StoreError::Database(format!("migration failed: {other}")),
                }
            }
            e => StoreError::Database(format!("migration failed: {e}")),
        }
    }
}

/// Rows one multi-row statement writes at most. PostgreSQL keeps some memory per row of a
/// statement until it ends: one insert of 100,000 attribute sets grew a backend by 560 MB
/// (examples/bench_deploy.rs 100000); in statements of this many rows it stays near
/// a twentieth of that, at the same speed.
pub const ROWS_PER_STATEMENT: usize = 5_000;

pub type Result<T> = std::result::Result<T, StoreError>;

/// Connect a pool. Connections are established lazily and re-established when the database
/// comes back after an outage; a request waits at most a few seconds for one.
///
/// A URL naming several hosts (`postgres://u@db1,db2/steward`) follows the primary among
/// them ([`failover`]).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool> {
    if let Some(hosts) = failover::parse(url)? {
        return failover::connect(hosts, max_connections).await;
    }
    let opts: PgConnectOptions = url
        .parse::<PgConnectOptions>()
        .map_err(|e| StoreError::Invalid(format!("invalid database URL: {e}")))?
        .disable_statement_logging();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .idle_timeout(Duration::from_secs(300))
        .test_before_acquire(true)
        .connect_with(opts)
        .await?;
    Ok(pool)
}

/// Apply the migrations under `migrations/` that are not applied yet.
///
/// Migrations the database has and this binary does not know are ignored: during a rolling
/// upgrade a replica of the previous release restarts on a schema a newer one already
/// migrated (migrations are additive for that reason; docs/replicas.md).
pub async fn migrate(pool: &PgPool) -> Result<()> {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true);
    migrator.run(pool).await?;
    Ok(())
}

/// Is the database reachable right now?
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query("SELECT 1").execute(pool).await.is_ok()
}
