//! Requests only an environment's owner can serve (docs/replicas.md): a deploy or repair
//! trigger, a pause or halt that must be in effect when the call returns, the scheduler's
//! live status, a dry-run start, a git trigger or hint, and external agents' sessions.
//!
//! Handlers call the functions here instead of the scheduler or the git sources directly.
//! Without replicas they run in this process. With replicas, a call for an environment
//! another replica owns goes to that replica's internal endpoint (authenticated by the
//! secret replicas share in the database), and comes back with its answer or its error;
//! while the environment is moving (no replica holds it for a moment), the call waits for
//! the new owner, up to [`MOVE_WAIT`], and then fails with 503. Nothing is accepted and
//! dropped: the caller always hears what the owner said.

use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::replicas::Location;
use crate::scheduler::agents::{Hello, Poll, PollReply, SessionView};
use crate::scheduler::{SchedulerError, Status};
use crate::sources::Triggered;

/// How long a call waits for an environment that is moving between replicas.
pub const MOVE_WAIT: Duration = Duration::from_secs(15);
/// The header carrying the replicas' shared secret.
pub const SECRET_HEADER: &str = "x-steward-replica-secret";

/// One owner-only request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum OwnerCall {
    Trigger {
        repair: bool,
        agent: Option<String>,
        resource: Option<String>,
    },
    Pause {
        agent: String,
        paused: bool,
    },
    Halt {
        halted: bool,
    },
    Status,
    Sessions,
    Dryrun {
        id: Uuid,
        version: i32,
    },
    SourceTrigger {
        kind: String,
        commit: Option<String>,
    },
    SourceHint {
        kind: String,
    },
    SourceRestart,
    SourceStop,
    AgentOpen {
        token: Option<Uuid>,
        allowed: Option<Vec<String>>,
        hello: Hello,
    },
    AgentPoll {
        instance: Uuid,
        token: Option<Uuid>,
        poll: Poll,
    },
    AgentClose {
        instance: Uuid,
        token: Option<Uuid>,
    },
}

/// An error as it crosses between replicas.
#[derive(Serialize, Deserialize)]
struct WireError {
    status: u16,
    error: String,
    message: String,
}

const NOT_HERE: &str = "not_owner";

fn not_here(env: Uuid) -> ApiError {
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        NOT_HERE,
        format!("environment {env} is not owned by this replica"),
    )
}

/// The error kinds a replica may answer with, as `'static` names.
fn kind_of(name: &str) -> &'static str {
    const KINDS: &[&str] = &[
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "conflict",
        "invalid",
        "too_large",
        "unsupported_media_type",
        "method_not_allowed",
        "no_scheduler",
        "no_git",
        "unavailable",
        "internal",
        "auth_failed",
        "git_error",
        "fenced",
        "unknown_session",
        NOT_HERE,
    ];
    KINDS
        .iter()
        .find(|k| **k == name)
        .copied()
        .unwrap_or("internal")
}

fn scheduler_error(env: Uuid, e: SchedulerError) -> ApiError {
    match e {
        SchedulerError::NotHere(_) => not_here(env),
        e => e.into(),
    }
}

fn no_scheduler() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "no_scheduler",
        "this server runs without a scheduler (--no-scheduler): it does not deploy",
    )
}

fn no_git() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "no_git",
        "this server does not follow git repositories",
    )
}

fn json<T: Serialize>(v: T) -> ApiResult<Value> {
    serde_json::to_value(v).map_err(|e| ApiError::internal(e.to_string()))
}

/// Serve a call in this process (this replica owns the environment, or there are no
/// replicas).
async fn local(state: &AppState, env: Uuid, call: OwnerCall) -> ApiResult<Value> {
    if let Some(r) = &state.replica
        && r.owns(env).is_none()
    {
        return Err(not_here(env));
    }
    let sched = || state.schedulers.as_ref().ok_or_else(no_scheduler);
    let git = || state.sources.as_ref().ok_or_else(no_git);
    let serr = |e| scheduler_error(env, e);
    match call {
        OwnerCall::Trigger {
            repair,
            agent,
            resource,
        } => json(
            sched()?
                .trigger(env, repair, agent, resource)
                .await
                .map_err(serr)?,
        ),
        OwnerCall::Pause { agent, paused } => {
            json(sched()?.pause(env, agent, paused).await.map_err(serr)?)
        }
        OwnerCall::Halt { halted } => json(sched()?.halt(env, halted).await.map_err(serr)?),
        OwnerCall::Status => json(sched()?.status(env).await.map_err(serr)?),
        OwnerCall::Sessions => json(sched()?.hub().sessions(env)),
        OwnerCall::Dryrun { id, version } => json(sched()?.dryrun(env, id, version).map_err(serr)?),
        OwnerCall::SourceTrigger { kind, commit } => json(
            git()?
                .trigger(env, &kind, commit)
                .await
                .map_err(ApiError::from)?,
        ),
        OwnerCall::SourceHint { kind } => {
            git()?.hint(env, &kind);
            json(())
        }
        OwnerCall::SourceRestart => {
            git()?.restart(env);
            json(())
        }
        OwnerCall::SourceStop => {
            git()?.stop(env);
            json(())
        }
        OwnerCall::AgentOpen {
            token,
            allowed,
            hello,
        } => {
            let hub = sched()?.hub();
            json(hub.open(env, token, allowed.as_deref(), hello).await?)
        }
        OwnerCall::AgentPoll {
            instance,
            token,
            poll,
        } => json(sched()?.hub().poll(env, instance, token, poll).await?),
        OwnerCall::AgentClose { instance, token } => {
            json(sched()?.hub().close(env, instance, token).await?)
        }
    }
}

/// Serve a call wherever the environment's owner is.
pub async fn call(state: &AppState, env: Uuid, call: OwnerCall) -> ApiResult<Value> {
    let Some(replica) = &state.replica else {
        return local(state, env, call).await;
    };
    let started = Instant::now();
    loop {
        let attempt = match replica.locate(env).await? {
            Location::Here(_) => Some(local(state, env, call.clone()).await),
            Location::There { url, replica: id } => {
                match remote(state, &url, replica.secret(), env, &call).await {
                    Ok(r) => Some(r),
                    Err(e) => {
                        // the owner is going away: its lease expires or moves soon
                        tracing::debug!(environment = %env, owner = %id, error = %e, "owner not reachable; waiting for the environment to move");
                        None
                    }
                }
            }
            Location::Nowhere => None,
        };
        match attempt {
            Some(Err(e)) if e.kind == NOT_HERE => {}
            Some(r) => return r,
            None => {}
        }
        if started.elapsed() > MOVE_WAIT {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!(
                    "no replica owns environment {env} right now (it is moving between replicas); try again"
                ),
            ));
        }
        replica.wake();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Send a call to the owner: its answer, or its error as an [`ApiError`]; Err(text) when it
/// could not be reached at all.
async fn remote(
    state: &AppState,
    url: &str,
    secret: &str,
    env: Uuid,
    call: &OwnerCall,
) -> Result<ApiResult<Value>, String> {
    let endpoint = format!(
        "{}/api/v1/internal/environments/{env}/owner-call",
        url.trim_end_matches('/')
    );
    let resp = state
        .http
        .post(&endpoint)
        .header(SECRET_HEADER, secret)
        .json(call)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        return Ok(Ok(body));
    }
    let wire: WireError = serde_json::from_value(body).map_err(|e| e.to_string())?;
    Ok(Err(ApiError::new(
        StatusCode::from_u16(wire.status).unwrap_or(StatusCode::BAD_GATEWAY),
        kind_of(&wire.error),
        wire.message,
    )))
}

/// The internal endpoint: another replica forwards a call for an environment it believes
/// this one owns. Answers the call's result, or the error with its status inside
/// (`{"status", "error", "message"}`), or 421 `not_owner`.
#[utoipa::path(post, operation_id = "owner_call", path = "/api/v1/internal/environments/{env}/owner-call", tag = "replicas",
    params(("env" = Uuid, Path, description = "The environment's id")),
    request_body = Object, security(()),
    responses((status = 200, description = "The owner's answer", body = Object),
              (status = 401, description = "Not a replica of this cluster"),
              (status = 421, description = "Not the owner (any more)")))]
pub async fn owner_call(
    State(state): State<AppState>,
    Path(env): Path<Uuid>,
    headers: HeaderMap,
    Json(call): Json<OwnerCall>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    let wire = |e: ApiError| {
        (
            e.status,
            Json(
                serde_json::json!({"status": e.status.as_u16(), "error": e.kind, "message": e.message}),
            ),
        )
    };
    let Some(replica) = &state.replica else {
        return Err(wire(not_here(env)));
    };
    let given = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !bool::from(given.as_bytes().ct_eq(replica.secret().as_bytes())) {
        return Err(wire(ApiError::unauthorized(
            "owner calls are for replicas of this cluster",
        )));
    }
    local(&state, env, call).await.map(Json).map_err(wire)
}

// ---------------------------------------------------------------- typed helpers

fn typed<T: serde::de::DeserializeOwned>(v: Value) -> ApiResult<T> {
    serde_json::from_value(v).map_err(|e| {
        ApiError::internal(format!(
            "the owner's answer could not be read (replicas of different versions?): {e}"
        ))
    })
}

pub async fn trigger(
    state: &AppState,
    env: Uuid,
    repair: bool,
    agent: Option<String>,
    resource: Option<String>,
) -> ApiResult<usize> {
    let c = OwnerCall::Trigger {
        repair,
        agent,
        resource,
    };
    typed(call(state, env, c).await?)
}

pub async fn pause(state: &AppState, env: Uuid, agent: String, paused: bool) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::Pause { agent, paused }).await?)
}

pub async fn halt(state: &AppState, env: Uuid, halted: bool) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::Halt { halted }).await?)
}

pub async fn status(state: &AppState, env: Uuid) -> ApiResult<Status> {
    typed(call(state, env, OwnerCall::Status).await?)
}

pub async fn sessions(state: &AppState, env: Uuid) -> ApiResult<Vec<SessionView>> {
    typed(call(state, env, OwnerCall::Sessions).await?)
}

pub async fn dryrun(state: &AppState, env: Uuid, id: Uuid, version: i32) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::Dryrun { id, version }).await?)
}

pub async fn source_trigger(
    state: &AppState,
    env: Uuid,
    kind: &str,
    commit: Option<String>,
) -> ApiResult<Triggered> {
    let c = OwnerCall::SourceTrigger {
        kind: kind.into(),
        commit,
    };
    typed(call(state, env, c).await?)
}

pub async fn source_hint(state: &AppState, env: Uuid, kind: &str) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::SourceHint { kind: kind.into() }).await?)
}

pub async fn source_restart(state: &AppState, env: Uuid) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::SourceRestart).await?)
}

pub async fn source_stop(state: &AppState, env: Uuid) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::SourceStop).await?)
}

pub async fn agent_open(
    state: &AppState,
    env: Uuid,
    token: Option<Uuid>,
    allowed: Option<Vec<String>>,
    hello: Hello,
) -> ApiResult<PollReply> {
    let c = OwnerCall::AgentOpen {
        token,
        allowed,
        hello,
    };
    typed(call(state, env, c).await?)
}

pub async fn agent_poll(
    state: &AppState,
    env: Uuid,
    instance: Uuid,
    token: Option<Uuid>,
    poll: Poll,
) -> ApiResult<PollReply> {
    let c = OwnerCall::AgentPoll {
        instance,
        token,
        poll,
    };
    typed(call(state, env, c).await?)
}

pub async fn agent_close(
    state: &AppState,
    env: Uuid,
    instance: Uuid,
    token: Option<Uuid>,
) -> ApiResult<()> {
    typed(call(state, env, OwnerCall::AgentClose { instance, token }).await?)
}
