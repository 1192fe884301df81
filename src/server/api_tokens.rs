//! Tokens (created and revoked by admins) and the audit log.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment, parse_uuid};
use super::openapi::{EnvPath, TOKENS, TokenPath};
use crate::model::Role;
use crate::store::audit::AuditEntry;
use crate::store::tokens::Token;
use crate::store::{audit, tokens};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TokenQuery {
    /// the tokens of this environment (name or id); absent: the caller's environment's, or
    /// the global tokens for a global admin (all of them with `all`)
    #[serde(default)]
    pub environment: Option<String>,
    /// without an environment: every token, scoped ones included (default: global ones)
    #[serde(default)]
    pub all: bool,
}

/// Tokens (admin of the environment; global tokens: global admin). Secrets are never shown.
#[utoipa::path(get, operation_id = "list_tokens", path = "/api/v1/tokens", tag = TOKENS, params(TokenQuery),
    responses((status = 200, description = "The tokens", body = Vec<Token>)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<TokenQuery>,
) -> ApiResult<Json<Vec<Token>>> {
    let env = match &q.environment {
        Some(k) => Some(environment(&state, &caller, k).await?.id),
        None => caller.environment,
    };
    match env {
        Some(e) => caller.require(Perm::Manage, Some(e))?,
        None => caller.require(Perm::Global, None)?,
    }
    let scope = match (env, q.all) {
        (Some(e), _) => tokens::Scope::Environment(e),
        (None, true) => tokens::Scope::All,
        (None, false) => tokens::Scope::Global,
    };
    Ok(Json(tokens::list(&state.pool, scope).await?))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// 1-200 characters, not all blank
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub name: String,
    /// a global token (without `environment`) must be an admin token
    #[schema(value_type = Role)]
    pub role: String,
    /// environment name or id; absent: a global (admin) token
    #[serde(default)]
    pub environment: Option<String>,
    /// an agent token: the agents it may host (absent: any agent of its environment)
    #[serde(default)]
    pub agents: Option<Vec<String>>,
}

/// A new token with its secret (shown this once).
#[derive(Serialize, ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub token: Token,
    /// The bearer secret: only its hash is stored.
    pub secret: String,
}

/// Create a token: of an environment (its admin), or global (global admin).
#[utoipa::path(post, operation_id = "create_token", path = "/api/v1/tokens", tag = TOKENS, request_body = CreateToken,
    responses((status = 201, description = "Created; the secret is shown this once", body = CreatedToken)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    // before anything is looked up: a bad name is the caller's error, whatever else is wrong
    tokens::check_label("token name", &body.name, tokens::MAX_NAME_CHARS)?;
    let role = Role::parse(&body.role).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unknown role '{}' (one of admin, approver, compiler, agent, viewer)",
            body.role
        ))
    })?;
    let env = match &body.environment {
        Some(k) => Some(environment(&state, &caller, k).await?.id),
        None => None,
    };
    match env {
        Some(e) => caller.require(Perm::Manage, Some(e))?,
        None => caller.require(Perm::Global, None)?,
    }
    let (token, secret) = tokens::create_for_agents(
        &state.pool,
        &body.name,
        role,
        env,
        &caller.name,
        None,
        body.agents.as_deref(),
    )
    .await?;
    audit::record(
        &state.pool,
        &caller.name,
        env,
        "token.create",
        &token.name,
        json!({"id": token.id, "role": role.as_str(), "agents": token.agents}),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token, secret })))
}

/// Revoke a token.
#[utoipa::path(delete, operation_id = "revoke_token", path = "/api/v1/tokens/{id}", tag = TOKENS, params(TokenPath),
    responses((status = 204, description = "Revoked")))]
pub async fn revoke(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = parse_uuid("token", &id)?;
    let token = tokens::get(&state.pool, id).await?;
    match token.environment_id {
        Some(e) => {
            if !caller.sees(e) {
                return Err(ApiError::forbidden(
                    "this token belongs to another environment",
                ));
            }
            caller.require(Perm::Manage, Some(e))?
        }
        None => caller.require(Perm::Global, None)?,
    }
    tokens::revoke(&state.pool, id).await?;
    // its agent processes are disconnected now, not at their next request
    if let Some(s) = &state.schedulers {
        s.hub().revoke(id).await;
    }
    audit::record(
        &state.pool,
        &caller.name,
        token.environment_id,
        "token.revoke",
        &token.name,
        json!({"id": id}),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// at most this many, newest first (default 100, at most 10,000)
    #[serde(default)]
    pub limit: Option<i64>,
    /// only entries older than this entry id (the next page: the last id of this one)
    #[serde(default)]
    pub before: Option<i64>,
    /// only entries of this action (e.g. `source.set`, `version.release`)
    #[serde(default)]
    pub action: Option<String>,
}

impl AuditQuery {
    fn filter(&self) -> audit::AuditFilter {
        audit::AuditFilter {
            before: self.before,
            action: self.action.clone().filter(|a| !a.is_empty()),
        }
    }

    fn limit(&self) -> i64 {
        self.limit.unwrap_or(100).clamp(1, 10_000)
    }
}

/// The audit log of an environment, newest first (admin).
#[utoipa::path(get, operation_id = "environment_audit", path = "/api/v1/environments/{env}/audit", tag = TOKENS, params(EnvPath, AuditQuery),
    responses((status = 200, description = "The entries", body = Vec<AuditEntry>)))]
pub async fn audit(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    Ok(Json(
        audit::list(&state.pool, Some(env.id), &q.filter(), q.limit()).await?,
    ))
}

/// The whole audit log, newest first (global admin).
#[utoipa::path(get, operation_id = "audit", path = "/api/v1/audit", tag = TOKENS, params(AuditQuery),
    responses((status = 200, description = "The entries", body = Vec<AuditEntry>)))]
pub async fn audit_all(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    caller.require(Perm::Global, None)?;
    Ok(Json(
        audit::list(&state.pool, None, &q.filter(), q.limit()).await?,
    ))
}
