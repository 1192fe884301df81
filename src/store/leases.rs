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
use sqlx::{PgConnection, PgExecutor};

use super::{Result, StoreError};

/// What a lease is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseKind {
    /// the primary process of an agent; key `<environment id>/<agent name>`
    AgentPrimary,
    /// the server replica doing an environment's active work; key: the environment id
    Environment,
}

impl LeaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::AgentPrimary => "agent",
            LeaseKind::Environment => "environment",
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

/// [`acquire`] for many keys of one kind in one statement: the keys taken or renewed, with
/// their terms (the others are held by someone else). Keys are taken in sorted order, so
/// two holders asking for overlapping sets never wait for each other in a cycle.
pub async fn acquire_many(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    keys: &[String],
    holder: &str,
    ttl_ms: i64,
) -> Result<Vec<(String, i64)>> {
    let mut keys = keys.to_vec();
    keys.sort();
    keys.dedup();
    Ok(sqlx::query_as(
        "INSERT INTO leases (kind, key, holder, term, expires_at) \
         SELECT $1, k, $3, 1, now() + make_interval(secs => $4::float8 / 1000) \
         FROM unnest($2::text[]) AS k ORDER BY k \
         ON CONFLICT (kind, key) DO UPDATE SET \
           term = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.term ELSE leases.term + 1 END, \
           acquired_at = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.acquired_at ELSE now() END, \
           holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, renewed_at = now() \
         WHERE leases.holder = EXCLUDED.holder OR leases.expires_at < now() \
         RETURNING key, term",
    )
    .bind(kind.as_str())
    .bind(&keys)
    .bind(holder)
    .bind(ttl_ms)
    .fetch_all(e)
    .await?)
}

/// Give back the agent-primary leases `holder` has for `agents` of `env` (a process that
/// stops), in two statements: those of agents a stored version uses expire now (a standby
/// takes them, the term counts on); those of agents nobody deploys to are forgotten.
pub async fn release_agents(
    c: &mut PgConnection,
    env: uuid::Uuid,
    agents: &[String],
    holder: &str,
) -> Result<()> {
    let keys: Vec<String> = agents.iter().map(|a| format!("{env}/{a}")).collect();
    sqlx::query(
        "UPDATE leases SET expires_at = now() - interval '1 millisecond' \
         WHERE kind = 'agent' AND key = ANY($1) AND holder = $2",
    )
    .bind(&keys)
    .bind(holder)
    .execute(&mut *c)
    .await?;
    sqlx::query(
        "DELETE FROM leases WHERE kind = 'agent' AND key = ANY($1) AND holder = $2 \
         AND expires_at < now() AND substr(key, 38) NOT IN \
           (SELECT DISTINCT agent FROM resource_spans WHERE environment_id = $3)",
    )
    .bind(&keys)
    .bind(holder)
    .bind(env)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// Forget the agent-primary leases that expired more than `after_secs` ago and name an agent
/// no stored version of its environment uses (an agent process that named agents nobody
/// deploys to leaves nothing behind). Terms of agents in use are kept, so fencing goes on
/// counting up for them. Rows deleted.
pub async fn prune_unused_agent_leases(e: impl PgExecutor<'_>, after_secs: i64) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM leases l WHERE l.ctid IN (SELECT l2.ctid FROM leases l2 \
           WHERE l2.kind = 'agent' \
           AND l2.expires_at < now() - make_interval(secs => $1::float8) \
           AND NOT EXISTS (SELECT 1 FROM resource_spans r \
             WHERE r.environment_id::text = split_part(l2.key, '/', 1) \
             AND r.agent = substr(l2.key, length(split_part(l2.key, '/', 1)) + 2)) \
           LIMIT 5000)",
    )
    .bind(after_secs as f64)
    .execute(e)
    .await?
    .rows_affected())
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

/// One tenure of a lease, carried by the writes its holder makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub kind: LeaseKind,
    pub key: String,
    pub holder: String,
    pub term: i64,
}

impl Fence {
    /// Refuse the surrounding transaction's writes unless the tenure is still current. The
    /// lease row stays share-locked until the transaction ends, so a successor can not take
    /// the lease between this check and the commit.
    pub async fn check(&self, c: &mut PgConnection) -> Result<()> {
        let held: Option<bool> = sqlx::query_scalar(
            "SELECT holder = $3 AND term = $4 AND expires_at >= now() FROM leases \
             WHERE kind = $1 AND key = $2 FOR SHARE",
        )
        .bind(self.kind.as_str())
        .bind(&self.key)
        .bind(&self.holder)
        .bind(self.term)
        .fetch_optional(&mut *c)
        .await?;
        if held == Some(true) {
            Ok(())
        } else {
            Err(StoreError::Fenced(format!(
                "{} lease {} is no longer held by {} under term {}",
                self.kind.as_str(),
                self.key,
                self.holder,
                self.term
            )))
        }
    }
}

/// What a renewal of all of a holder's leases found.
#[derive(Debug, Default)]
pub struct Renewal {
    /// Renewed for the lease time from now: (key, term).
    pub renewed: Vec<(String, i64)>,
    /// Still held (not expired) but not renewed this time: a transaction that writes under
    /// the lease has its row locked (`Fence::check` takes it `FOR SHARE`). Tried again at
    /// the next renewal; such a lease lapses only if its writer holds it past the lease time.
    pub busy: Vec<(String, i64)>,
}

/// Renew every lease of `holder` that has not expired. A lease whose row a writing
/// transaction holds is skipped rather than waited for: one environment's stuck writer
/// must not hold up the renewal of all the others (they would all expire behind it).
pub async fn renew_all(
    c: &mut PgConnection,
    kind: LeaseKind,
    holder: &str,
    ttl_ms: i64,
) -> Result<Renewal> {
    let renewed: Vec<(String, i64)> = sqlx::query_as(
        "UPDATE leases l SET expires_at = now() + make_interval(secs => $3::float8 / 1000), \
         renewed_at = now() \
         FROM (SELECT kind, key FROM leases WHERE kind = $1 AND holder = $2 AND expires_at >= now() \
               FOR NO KEY UPDATE SKIP LOCKED) free \
         WHERE l.kind = free.kind AND l.key = free.key \
         RETURNING l.key, l.term",
    )
    .bind(kind.as_str())
    .bind(holder)
    .bind(ttl_ms)
    .fetch_all(&mut *c)
    .await?;
    let held = held_by(&mut *c, kind, holder).await?;
    let done: std::collections::HashSet<&str> = renewed.iter().map(|(k, _)| k.as_str()).collect();
    let busy = held
        .into_iter()
        .filter(|(k, _)| !done.contains(k.as_str()))
        .collect();
    Ok(Renewal { renewed, busy })
}

/// Take back a lease of `holder` that lapsed under `term` while nobody took it (the
/// database was away for longer than the lease time): it keeps its term, as if renewed in
/// time. None when someone else took it meanwhile, or a writer holds its row (never waits).
pub async fn revive(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    key: &str,
    holder: &str,
    term: i64,
    ttl_ms: i64,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "UPDATE leases l SET expires_at = now() + make_interval(secs => $5::float8 / 1000), \
         renewed_at = now() \
         FROM (SELECT kind, key FROM leases WHERE kind = $1 AND key = $2 AND holder = $3 \
               AND term = $4 FOR NO KEY UPDATE SKIP LOCKED) mine \
         WHERE l.kind = mine.kind AND l.key = mine.key \
         RETURNING l.term",
    )
    .bind(kind.as_str())
    .bind(key)
    .bind(holder)
    .bind(term)
    .bind(ttl_ms)
    .fetch_optional(e)
    .await?)
}

/// The leases of a kind `holder` holds right now (not expired): (key, term). Never waits
/// for a lock.
pub async fn held_by(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    holder: &str,
) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT key, term FROM leases WHERE kind = $1 AND holder = $2 AND expires_at >= now() ORDER BY key",
    )
    .bind(kind.as_str())
    .bind(holder)
    .fetch_all(e)
    .await?)
}

/// Keys of the leases of a kind that someone holds right now (by the database's clock).
pub async fn current_keys(e: impl PgExecutor<'_>, kind: LeaseKind) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT key FROM leases WHERE kind = $1 AND expires_at >= now() ORDER BY key",
    )
    .bind(kind.as_str())
    .fetch_all(e)
    .await?)
}

/// Forget leases whose key is gone (an environment deleted).
pub async fn remove(e: impl PgExecutor<'_>, kind: LeaseKind, key: &str) -> Result<()> {
    sqlx::query("DELETE FROM leases WHERE kind = $1 AND key = $2")
        .bind(kind.as_str())
        .bind(key)
        .execute(e)
        .await?;
    Ok(())
}

/// How many current leases of a kind each holder has.
pub async fn holder_counts(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
) -> Result<std::collections::HashMap<String, usize>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT holder, count(*) FROM leases WHERE kind = $1 AND expires_at >= now() GROUP BY holder",
    )
    .bind(kind.as_str())
    .fetch_all(e)
    .await?;
    Ok(rows.into_iter().map(|(h, n)| (h, n as usize)).collect())
}

/// Keys of the expired leases of a kind whose last holder was `holder` (nobody took them).
pub async fn lapsed_keys(
    e: impl PgExecutor<'_>,
    kind: LeaseKind,
    holder: &str,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT key FROM leases WHERE kind = $1 AND holder = $2 AND expires_at < now() ORDER BY key",
    )
    .bind(kind.as_str())
    .bind(holder)
    .fetch_all(e)
    .await?)
}
