//! Leases with terms (DESIGN.md §9): one mechanism for everything that must have exactly one
//! holder at a time — the primary process of an agent today, the replica owning an
//! environment later.
//!
//! A lease is taken and renewed by one statement: it goes to the caller if nobody holds it,
//! if the caller already holds it, or if the holder let it expire. The term grows by one
//! each time the holder changes, never otherwise, so `(holder, term)` names one tenure.
//! Whoever acts for the holder carries its term, and [`holds`] checks it where the action
//! is accepted: a holder that lost the lease (stopped, partitioned) is refused, even if it
//! does not know yet that it lost it.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::Result;

/// What a lease is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseKind {
    /// the primary process of an agent; key `<environment id>/<agent name>`
    AgentPrimary,
}

impl LeaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::AgentPrimary => "agent",
        }
    }
}

/// A lease as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Lease {
    pub key: String,
    pub holder: String,
    pub term: i64,
    pub expires_at: DateTime<Utc>,
    pub acquired_at: DateTime<Utc>,
    pub renewed_at: DateTime<Utc>,
}

/// Take or renew the lease for `ttl_ms` from now. Returns the term held, or None when
/// another holder has it and it has not expired.
pub async fn acquire(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    key: &str,
    holder: &str,
    ttl_ms: i64,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "INSERT INTO leases (kind, key, holder, term, expires_at) \
         VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4::float8 / 1000)) \
         ON CONFLICT (kind, key) DO UPDATE SET \
           term = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.term ELSE leases.term + 1 END, \
           acquired_at = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.acquired_at ELSE now() END, \
           holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, renewed_at = now() \
         WHERE leases.holder = EXCLUDED.holder OR leases.expires_at < now() \
         RETURNING term",
    )
    .bind(kind.as_str())
    .bind(key)
    .bind(holder)
    .bind(ttl_ms)
    .fetch_optional(e)
    .await?)
}

/// Does `holder` hold the lease under `term`, unexpired? The fencing check.
pub async fn holds(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    key: &str,
    holder: &str,
    term: i64,
) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM leases WHERE kind = $1 AND key = $2 AND holder = $3 \
         AND term = $4 AND expires_at >= now())",
    )
    .bind(kind.as_str())
    .bind(key)
    .bind(holder)
    .bind(term)
    .fetch_one(e)
    .await?)
}

/// Give the lease up at once (a graceful stop, a revoked token), so a successor need not
/// wait for it to expire. The term stays: the next holder takes term + 1.
pub async fn release(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    key: &str,
    holder: &str,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE leases SET expires_at = now() - interval '1 millisecond' \
         WHERE kind = $1 AND key = $2 AND holder = $3",
    )
    .bind(kind.as_str())
    .bind(key)
    .bind(holder)
    .execute(e)
    .await?
    .rows_affected()
        > 0)
}

/// The leases of a kind whose key starts with `prefix`.
pub async fn list(e: impl PgExecutor<'_>, kind: LeaseKind, prefix: &str) -> Result<Vec<Lease>> {
    Ok(sqlx::query_as(
        "SELECT key, holder, term, expires_at, acquired_at, renewed_at FROM leases \
         WHERE kind = $1 AND starts_with(key, $2) ORDER BY key",
    )
    .bind(kind.as_str())
    .bind(prefix)
    .fetch_all(e)
    .await?)
}
