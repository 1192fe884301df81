//! External agent processes (`steward agent run`): sessions, polls, handler code. See
//! `scheduler::agents` for the protocol and the election of a primary.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment, parse_uuid};
use super::openapi::{AGENTS, EnvIdPath, EnvPath};
use super::owner;
use crate::model::{HandlerCode, Role};
use crate::scheduler::agents::{AgentHub, Hello, HubError, Poll, PollReply};
use crate::store;

impl From<HubError> for ApiError {
    fn from(e: HubError) -> ApiError {
        match e {
            HubError::UnknownSession(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_session", e.to_string())
            }
            HubError::Fenced { .. } => ApiError::new(StatusCode::CONFLICT, "fenced", e.to_string()),
            HubError::Forbidden(m) => ApiError::forbidden(m),
            HubError::Invalid(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m),
            HubError::Store(s) => s.into(),
        }
    }
}

/// Only agent tokens (and admins) host agents.
fn hub_for<'a>(state: &'a AppState, caller: &Caller, env: uuid::Uuid) -> ApiResult<&'a AgentHub> {
    caller.require(Perm::Report, Some(env))?;
    if !matches!(caller.role, Role::Agent | Role::Admin) {
        return Err(ApiError::forbidden("only agent tokens host agents"));
    }
    state
        .schedulers
        .as_ref()
        .map(|s| s.hub())
        .ok_or_else(|| ApiError::conflict("this server does not deploy (--no-scheduler)"))
}

/// Open a session: a process announces the agents it hosts and gets its first work. The
/// reply says which of them it is primary of.
#[utoipa::path(post, operation_id = "open_agent_session", path = "/api/v1/environments/{env}/agent-sessions", tag = AGENTS,
    params(EnvPath), request_body = Hello,
    responses((status = 200, description = "Connected", body = PollReply),
              (status = 403, description = "The token may not host one of these agents"),
              (status = 422, description = "More than 1000 agents, a name that is not 1 to 255 readable characters, or a name given twice")))]
pub async fn open(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(hello): ApiJson<Hello>,
) -> ApiResult<Json<PollReply>> {
    let env = environment(&state, &caller, &key).await?;
    hub_for(&state, &caller, env.id)?;
    let agents: Vec<String> = hello.agents.clone();
    let mut reply = owner::agent_open(&state, &caller, env.id, hello).await?;
    store::deploy::ensure_agents(&state.pool, env.id, &agents).await?;
    reply.environment = Some(crate::scheduler::agents::EnvIdentity {
        id: env.id,
        name: env.name,
        project_id: env.project_id,
        project: env.project,
    });
    Ok(Json(reply))
}

/// Report finished actions and wait (up to 1 s) for work. Every result carries the term
/// its agent's lease had when the action was handed out: a process that is no longer
/// primary gets 409 and none of its results is taken.
#[utoipa::path(post, operation_id = "poll_agent_session", path = "/api/v1/environments/{env}/agent-sessions/{id}/poll", tag = AGENTS,
    params(EnvIdPath), request_body = Poll,
    responses((status = 200, description = "Results taken; work, if any", body = PollReply),
              (status = 404, description = "Unknown session: open a new one"),
              (status = 409, description = "Fenced: this process was deposed")))]
pub async fn poll(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
    ApiJson(mut poll): ApiJson<Poll>,
) -> ApiResult<Json<PollReply>> {
    let instance = parse_uuid("session", &id)?;
    // the hot path of every action: an environment given by id whose session exists needs no
    // lookup (the session was opened after one, and every call checks the caller again)
    let env_id = match uuid::Uuid::parse_str(&key) {
        Ok(id)
            if caller.sees(id)
                && state
                    .schedulers
                    .as_ref()
                    .is_some_and(|s| s.hub().has_session(id, instance)) =>
        {
            id
        }
        _ => environment(&state, &caller, &key).await?.id,
    };
    hub_for(&state, &caller, env_id)?;
    for r in &mut poll.results {
        // the protocol boundary: what a handler printed must be storable
        r.result.sanitize();
    }
    Ok(Json(
        owner::agent_poll(&state, &caller, env_id, instance, poll).await?,
    ))
}

/// Close a session: its leases go to a standby at once.
#[utoipa::path(delete, operation_id = "close_agent_session", path = "/api/v1/environments/{env}/agent-sessions/{id}", tag = AGENTS,
    params(EnvIdPath), responses((status = 204, description = "Closed")))]
pub async fn close(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let env = environment(&state, &caller, &key).await?;
    hub_for(&state, &caller, env.id)?;
    let instance = parse_uuid("session", &id)?;
    owner::agent_close(&state, &caller, env.id, instance).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A module's handler code with its files, hex-encoded: what an agent process runs.
#[derive(Serialize, ToSchema)]
pub struct CodeBundle {
    #[schema(value_type = Object)]
    pub code: HandlerCode,
    /// path -> content, hex
    pub contents: std::collections::BTreeMap<String, String>,
}

/// Handler code by digest (an agent process checks it against the digest and caches it).
#[utoipa::path(get, operation_id = "handler_code", path = "/api/v1/environments/{env}/code/{digest}", tag = AGENTS,
    params(("env" = String, Path, description = "The environment"), ("digest" = String, Path, description = "The code's digest")),
    responses((status = 200, description = "The code", body = CodeBundle)))]
pub async fn code(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, digest)): Path<(String, String)>,
) -> ApiResult<Json<CodeBundle>> {
    let env = environment(&state, &caller, &key).await?;
    if caller.role == Role::Agent {
        caller.require(Perm::Report, Some(env.id))?;
        // an agent token naming its agents gets the code of their resources only
        if let Some(agents) = &caller.agents
            && !store::code::used_by_agents(&state.pool, env.id, &digest, agents).await?
        {
            return Err(ApiError::forbidden(
                "this handler code serves no resource of the agents this token hosts",
            ));
        }
    } else {
        caller.require(Perm::Read, Some(env.id))?;
    }
    let code = store::code::by_digest(&state.pool, env.id, &digest).await?;
    let hashes: Vec<String> = code.files.values().map(|f| f.hash.clone()).collect();
    let blobs = store::code::blobs(&state.pool, &hashes).await?;
    let contents = code
        .files
        .iter()
        .filter_map(|(p, f)| blobs.get(&f.hash).map(|b| (p.clone(), hex::encode(b))))
        .collect();
    Ok(Json(CodeBundle { code, contents }))
}
