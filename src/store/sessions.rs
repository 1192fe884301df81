//! Web console sessions. The browser holds a random secret in an HttpOnly cookie; only its
//! SHA-256 is stored, with the token the session was opened with and the CSRF value its forms
//! carry. A session lives `SESSION_HOURS` after its last use, and ends with its token.

use sqlx::PgExecutor;
use uuid::Uuid;

use super::Result;
use super::tokens::{Token, hash_secret, new_secret};

/// A session is forgotten this long after it was last used.
pub const SESSION_HOURS: i32 = 12;

/// An open session: the token behind it (None: a `--no-auth` server) and its CSRF value.
#[derive(Clone, Debug)]
pub struct Session {
    pub token: Option<Token>,
    pub csrf: String,
}

/// Open a session for `token` (None: `--no-auth`); returns the cookie secret and the session.
pub async fn open(e: impl PgExecutor<'_>, token: Option<Token>) -> Result<(String, Session)> {
    let secret = new_secret();
    let csrf = new_secret();
    sqlx::query(
        "INSERT INTO console_sessions (secret_hash, token_id, csrf, expires_at) \
         VALUES ($1, $2, $3, now() + make_interval(hours => $4))",
    )
    .bind(hash_secret(&secret))
    .bind(token.as_ref().map(|t| t.id))
    .bind(&csrf)
    .bind(SESSION_HOURS)
    .execute(e)
    .await?;
    Ok((secret, Session { token, csrf }))
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    token_id: Option<Uuid>,
    csrf: String,
}

/// The live session behind a cookie secret, extending its life (at most once a minute, so
/// that page views do not each cost a write). None: unknown, expired, or its token revoked.
pub async fn find(c: &mut sqlx::PgConnection, secret: &str) -> Result<Option<Session>> {
    let row: Option<SessionRow> = sqlx::query_as(
        "UPDATE console_sessions SET last_seen_at = now(), \
           expires_at = now() + make_interval(hours => $2) \
         WHERE secret_hash = $1 AND expires_at > now() \
           AND last_seen_at < now() - interval '1 minute' \
         RETURNING token_id, csrf",
    )
    .bind(hash_secret(secret))
    .bind(SESSION_HOURS)
    .fetch_optional(&mut *c)
    .await?;
    let row = match row {
        Some(r) => Some(r),
        None => {
            sqlx::query_as(
                "SELECT token_id, csrf FROM console_sessions \
                 WHERE secret_hash = $1 AND expires_at > now()",
            )
            .bind(hash_secret(secret))
            .fetch_optional(&mut *c)
            .await?
        }
    };
    let Some(row) = row else { return Ok(None) };
    let token = match row.token_id {
        None => None,
        Some(id) => match super::tokens::get(&mut *c, id).await {
            Ok(t) if t.revoked_at.is_none() => Some(t),
            // revoked: the session ends with its token
            Ok(_) | Err(super::StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        },
    };
    Ok(Some(Session {
        token,
        csrf: row.csrf,
    }))
}

/// End a session (sign-out).
pub async fn close(e: impl PgExecutor<'_>, secret: &str) -> Result<()> {
    sqlx::query("DELETE FROM console_sessions WHERE secret_hash = $1")
        .bind(hash_secret(secret))
        .execute(e)
        .await?;
    Ok(())
}
