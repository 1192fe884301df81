//! Tokens (created and revoked by admins) and the audit log.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment, parse_uuid};
use crate::model::Role;
use crate::store::{audit, tokens};

#[derive(Deserialize)]
pub struct TokenQuery {
    #[serde(default)]
    pub environment: Option<String>,
    /// without an environment: every token, scoped ones included (default: global ones)
    #[serde(default)]
    pub all: bool,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<TokenQuery>,
) -> ApiResult<Json<serde_json::Value>> {
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
    Ok(Json(json!(tokens::list(&state.pool, scope).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub name: String,
    pub role: String,
    /// environment name or id; absent: a global (admin) token
    #[serde(default)]
    pub environment: Option<String>,
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
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
    let (token, secret) =
        tokens::create(&state.pool, &body.name, role, env, &caller.name, None).await?;
    audit::record(
        &state.pool,
        &caller.name,
        env,
        "token.create",
        &token.name,
        json!({"id": token.id, "role": role.as_str()}),
    )
    .await?;
    let mut v = json!(token);
    v["secret"] = json!(secret);
    Ok((StatusCode::CREATED, Json(v)))
}

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

#[derive(Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    pub limit: Option<i64>,
}

pub async fn audit(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    Ok(Json(json!(
        audit::list(
            &state.pool,
            Some(env.id),
            q.limit.unwrap_or(100).clamp(1, 10_000)
        )
        .await?
    )))
}

pub async fn audit_all(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    caller.require(Perm::Global, None)?;
    Ok(Json(json!(
        audit::list(&state.pool, None, q.limit.unwrap_or(100).clamp(1, 10_000)).await?
    )))
}
