//! API tokens: stored as the SHA-256 of their secret, shown once at creation.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{Result, StoreError};
use crate::model::Role;

#[derive(Clone, Debug, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Token {
    pub id: Uuid,
    pub name: String,
    pub role: Role,
    /// None: a global token.
    pub environment_id: Option<Uuid>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    /// An agent token hosts only these agents of its environment; absent: any of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
}

#[derive(sqlx::FromRow)]
struct TokenRow {
    id: Uuid,
    name: String,
    role: String,
    environment_id: Option<Uuid>,
    created_by: String,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
    last_used_at: Option<DateTime<Utc>>,
    agents: Option<Vec<String>>,
}

impl From<TokenRow> for Token {
    fn from(r: TokenRow) -> Token {
        Token {
            id: r.id,
            name: r.name,
            role: Role::parse(&r.role).unwrap_or(Role::Viewer),
            environment_id: r.environment_id,
            created_by: r.created_by,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
            last_used_at: r.last_used_at,
            agents: r.agents,
        }
    }
}

const COLUMNS: &str =
    "id, name, role, environment_id, created_by, created_at, revoked_at, last_used_at, agents";

/// A new random secret: `stw_` + 64 hex digits (256 bits from the OS random source).
pub fn new_secret() -> String {
    let mut bytes = Vec::with_capacity(32);
    // v4 UUIDs come from the OS CSPRNG; hashing three of them gives 256 well-mixed bits
    let mut h = Sha256::new();
    for _ in 0..3 {
        h.update(Uuid::new_v4().as_bytes());
    }
    bytes.extend_from_slice(&h.finalize());
    format!("stw_{}", hex::encode(bytes))
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Create a token; returns it with its secret (the only time the secret exists).
pub async fn create(
    e: impl PgExecutor<'_>,
    name: &str,
    role: Role,
    environment_id: Option<Uuid>,
    created_by: &str,
    secret: Option<&str>,
) -> Result<(Token, String)> {
    create_for_agents(e, name, role, environment_id, created_by, secret, None).await
}

/// Longest token name, in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// Most agents an agent token may name.
pub const MAX_TOKEN_AGENTS: usize = 1000;
/// Longest agent name, in characters.
pub const MAX_AGENT_NAME_CHARS: usize = 255;

/// A name people read (in lists, logs, the console): 1 to `max` characters, not blank, no
/// control character (NUL among them, which PostgreSQL can not store) and no bidirectional
/// override, which would make it read as something else.
pub fn check_label(kind: &str, value: &str, max: usize) -> Result<()> {
    let bad = value
        .chars()
        .find(|c| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'));
    if let Some(c) = bad {
        return Err(StoreError::Invalid(format!(
            "the {kind} holds the character U+{:04X}: control and bidirectional-override characters are not allowed",
            c as u32
        )));
    }
    let chars = value.chars().count();
    if value.trim().is_empty() || chars > max {
        return Err(StoreError::Invalid(format!(
            "a {kind} needs 1 to {max} characters, not blank ({chars} given)"
        )));
    }
    Ok(())
}
/// [`create`], for an agent token limited to the agents named (None: any agent).
pub async fn create_for_agents(
    e: impl PgExecutor<'_>,
    name: &str,
    role: Role,
    environment_id: Option<Uuid>,
    created_by: &str,
    secret: Option<&str>,
    agents: Option<&[String]>,
) -> Result<(Token, String)> {
    if agents.is_some() && role != Role::Agent {
        return Err(StoreError::Invalid(
            "only agent tokens are limited to agents".into(),
        ));
    }
    check_label("token name", name, MAX_NAME_CHARS)?;
    if let Some(agents) = agents {
        if agents.is_empty() || agents.len() > MAX_TOKEN_AGENTS {
            return Err(StoreError::Invalid(format!(
                "an agent token names 1 to {MAX_TOKEN_AGENTS} agents, not {}",
                agents.len()
            )));
        }
        for a in agents {
            check_label("agent name", a, MAX_AGENT_NAME_CHARS)?;
        }
    }
    if environment_id.is_none() && role != Role::Admin {
        return Err(StoreError::Invalid(
            "only admin tokens can be global: give the environment of the token".into(),
        ));
    }
    let secret = secret.map(str::to_string).unwrap_or_else(new_secret);
    let sql = format!(
        "INSERT INTO tokens (id, name, secret_hash, role, environment_id, created_by, agents) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
    );
    let row = sqlx::query_as::<_, TokenRow>(sqlx::AssertSqlSafe(sql))
        .bind(Uuid::new_v4())
        .bind(name)
        .bind(hash_secret(&secret))
        .bind(role.as_str())
        .bind(environment_id)
        .bind(created_by)
        .bind(agents)
        .fetch_one(e)
        .await
        .map_err(|err| match StoreError::from(err) {
            StoreError::Invalid(_) => StoreError::NotFound(format!(
                "environment {}",
                environment_id.unwrap_or_default()
            )),
            StoreError::Conflict(_) => StoreError::Conflict("this secret is in use already".into()),
            other => other,
        })?;
    Ok((row.into(), secret))
}

/// The live (not revoked) token with this secret.
pub async fn authenticate(e: impl PgExecutor<'_>, secret: &str) -> Result<Option<Token>> {
    // `last_used_at` is kept to the minute: a request (an agent polls for every action) must
    // not cost a database write
    let sql = format!(
        "WITH t AS (SELECT {COLUMNS} FROM tokens WHERE secret_hash = $1 AND revoked_at IS NULL), \
         touched AS (UPDATE tokens SET last_used_at = now() WHERE id IN (SELECT id FROM t) \
           AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')) \
         SELECT {COLUMNS} FROM t"
    );
    Ok(sqlx::query_as::<_, TokenRow>(sqlx::AssertSqlSafe(sql))
        .bind(hash_secret(secret))
        .fetch_optional(e)
        .await?
        .map(Token::from))
}

/// Which tokens a listing shows.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    /// global tokens only
    Global,
    Environment(Uuid),
    /// every token, scoped ones included
    All,
}

pub async fn list(e: impl PgExecutor<'_>, scope: Scope) -> Result<Vec<Token>> {
    let (env, all) = match scope {
        Scope::Global => (None, false),
        Scope::Environment(id) => (Some(id), false),
        Scope::All => (None, true),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM tokens WHERE $2 OR environment_id IS NOT DISTINCT FROM $1 ORDER BY created_at"
    );
    Ok(sqlx::query_as::<_, TokenRow>(sqlx::AssertSqlSafe(sql))
        .bind(env)
        .bind(all)
        .fetch_all(e)
        .await?
        .into_iter()
        .map(Token::from)
        .collect())
}

pub async fn get(e: impl PgExecutor<'_>, id: Uuid) -> Result<Token> {
    let sql = format!("SELECT {COLUMNS} FROM tokens WHERE id = $1");
    sqlx::query_as::<_, TokenRow>(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_optional(e)
        .await?
        .map(Token::from)
        .ok_or_else(|| StoreError::NotFound(format!("token {id}")))
}

pub async fn revoke(e: impl PgExecutor<'_>, id: Uuid) -> Result<()> {
    let r =
        sqlx::query("UPDATE tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .execute(e)
            .await?;
    if r.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("live token {id}")));
    }
    Ok(())
}

/// Number of live global admin tokens (none at first start).
pub async fn count_global_admins(e: impl PgExecutor<'_>) -> Result<i64> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM tokens WHERE role = 'admin' AND environment_id IS NULL AND revoked_at IS NULL",
    )
    .fetch_one(e)
    .await?;
    Ok(n)
}

/// Has this secret ever been registered (used or revoked)?
pub async fn secret_known(e: impl PgExecutor<'_>, secret: &str) -> Result<bool> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM tokens WHERE secret_hash = $1")
        .bind(hash_secret(secret))
        .fetch_one(e)
        .await?;
    Ok(n > 0)
}
