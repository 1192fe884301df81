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
use uuid::Uuid;

use super::AppState;
use super::auth::{Caller, Credential, Perm};
use super::error::{ApiError, ApiResult};
use crate::model::Role;
use crate::replicas::Location;
use crate::scheduler::agents::{Hello, Poll, PollReply, SessionView};
use crate::scheduler::{SchedulerError, Status};
use crate::sources::Triggered;
use crate::store;

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
    // the token and the agents it may host are the caller's, as the owner authenticated it:
    // never taken from the call
    AgentOpen {
        hello: Hello,
    },
    AgentPoll {
        instance: Uuid,
        poll: Poll,
    },
    AgentClose {
        instance: Uuid,
    },
}

/// What one replica sends the owner: the call and the credential of whoever asked for it
/// (None only from a `--no-auth` server). The owner authenticates and authorizes that
/// credential exactly as if the call had come to it directly.
#[derive(Serialize, Deserialize)]
pub struct OwnerRequest {
    pub caller: Option<Credential>,
    pub call: OwnerCall,
}

/// Largest forwarded call: an agent's poll (its results' logs) or a webhook (its body, in hex).
const OWNER_BODY: usize = 3 * super::ACTION_BODY;

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
async fn local(state: &AppState, env: Uuid, call: OwnerCall, caller: &Caller) -> ApiResult<Value> {
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
        OwnerCall::AgentOpen { hello } => {
            let hub = sched()?.hub();
            json(
                hub.open(env, caller.token_id, caller.agents.as_deref(), hello)
                    .await?,
            )
        }
        OwnerCall::AgentPoll { instance, poll } => json(
            sched()?
                .hub()
                .poll(env, instance, caller.token_id, poll)
                .await?,
        ),
        OwnerCall::AgentClose { instance } => {
            json(sched()?.hub().close(env, instance, caller.token_id).await?)
        }
    }
}

/// Serve a call wherever the environment's owner is.
pub async fn call(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    call: OwnerCall,
) -> ApiResult<Value> {
    let Some(replica) = &state.replica else {
        return local(state, env, call, caller).await;
    };
    let request = OwnerRequest {
        caller: caller.credential.clone(),
        call,
    };
    let started = Instant::now();
    loop {
        let attempt = match replica.locate(env).await? {
            Location::Here(_) => Some(local(state, env, request.call.clone(), caller).await),
            Location::There { url, replica: id } if !replica.may_send_secret_to(&url) => {
                tracing::error!(environment = %env, owner = %id, url = %url, "refusing to send the replica secret over plain http:// to an address that is not a loopback one; serve the replicas with TLS or start them with --allow-plain-http-replica-links");
                Some(Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!(
                        "the replica owning environment {env} is advertised at {url}: this replica does not send the replica secret over plain http:// to an address that is not a loopback one (serve the replicas with TLS, or start them with --allow-plain-http-replica-links on a network you trust)"
                    ),
                )))
            }
            Location::There { url, replica: id } => {
                let secret = replica.secret().await?;
                match remote(state, &url, &secret, env, &request).await {
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
    request: &OwnerRequest,
) -> Result<ApiResult<Value>, String> {
    let endpoint = format!(
        "{}/api/v1/internal/environments/{env}/owner-call",
        url.trim_end_matches('/')
    );
    let resp = state
        .replica_http()
        .post(&endpoint)
        .header(SECRET_HEADER, secret)
        .json(request)
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
/// this one owns. The replicas' secret says the sender is a replica; the caller's credential
/// inside says who asked, and is checked here as on a direct call (a call without one is
/// refused: the secret is not a key to the environments). Answers the call's result, or the
/// error with its status inside (`{"status", "error", "message"}`), or 421 `not_owner`.
#[utoipa::path(post, operation_id = "owner_call", path = "/api/v1/internal/environments/{env}/owner-call", tag = "replicas",
    params(("env" = Uuid, Path, description = "The environment's id")),
    request_body = Object, security(()),
    responses((status = 200, description = "The owner's answer", body = Object),
              (status = 401, description = "Not a replica of this cluster, or no valid caller credential"),
              (status = 403, description = "The caller may not do this"),
              (status = 421, description = "Not the owner (any more)")))]
pub async fn owner_call(
    State(state): State<AppState>,
    Path(env): Path<Uuid>,
    headers: HeaderMap,
    request: axum::extract::Request,
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
    // the sender first: nothing of the body is read for a stranger
    let given = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let known = replica
        .accepts(given)
        .await
        .map_err(|e| wire(ApiError::from(e)))?;
    if !known {
        return Err(wire(ApiError::unauthorized(
            "owner calls are for replicas of this cluster",
        )));
    }
    let body = axum::body::to_bytes(request.into_body(), OWNER_BODY)
        .await
        .map_err(|e| wire(ApiError::bad_request(format!("owner call: {e}"))))?;
    let OwnerRequest { caller, call } = serde_json::from_slice(&body).map_err(|e| {
        wire(ApiError::bad_request(format!(
            "an owner call this replica cannot read (replicas of different versions?): {e}"
        )))
    })?;
    let caller = authenticate(&state, env, caller).await.map_err(wire)?;
    authorize(&caller, env, &call).map_err(wire)?;
    local(&state, env, call, &caller)
        .await
        .map(Json)
        .map_err(wire)
}

/// Who a forwarded credential is, checked as a direct call would check it.
async fn authenticate(state: &AppState, env: Uuid, cred: Option<Credential>) -> ApiResult<Caller> {
    if state.no_auth {
        return Ok(Caller::local());
    }
    match cred {
        None => Err(ApiError::unauthorized(
            "an owner call must carry the credential of whoever asked for it",
        )),
        Some(Credential::Bearer { secret }) => Caller::of_token(state, &secret).await,
        Some(Credential::Session { secret }) => {
            let mut c = state
                .pool
                .acquire()
                .await
                .map_err(store::StoreError::from)?;
            let token = store::sessions::find(&mut c, &secret)
                .await?
                .and_then(|s| s.token)
                .ok_or_else(|| ApiError::unauthorized("unknown or ended session"))?;
            Ok(Caller {
                token_id: Some(token.id),
                name: token.name,
                role: token.role,
                environment: token.environment_id,
                agents: token.agents,
                credential: Some(Credential::Session { secret }),
            })
        }
        Some(Credential::Webhook { headers, body }) => {
            let body = hex::decode(&body)
                .map_err(|_| ApiError::bad_request("a forwarded webhook body is hex"))?;
            super::api_sources::verify_signed(state, env, &headers, &body).await?;
            Ok(Caller::webhook(env, headers, &body))
        }
    }
}

/// May `caller` make `call` on `env`? The same permissions as the routes that make it.
fn authorize(caller: &Caller, env: Uuid, call: &OwnerCall) -> ApiResult<()> {
    let agent_call = matches!(
        call,
        OwnerCall::AgentOpen { .. } | OwnerCall::AgentPoll { .. } | OwnerCall::AgentClose { .. }
    );
    if let Some(Credential::Webhook { .. }) = caller.credential {
        // a signed webhook is a hint to fetch, nothing more
        return match call {
            OwnerCall::SourceHint { .. } if caller.sees(env) => Ok(()),
            _ => Err(ApiError::forbidden("a webhook only asks for a fetch")),
        };
    }
    if caller.role == Role::Agent && !agent_call {
        return Err(ApiError::forbidden("an agent token only hosts its agents"));
    }
    let perm = match call {
        OwnerCall::Status | OwnerCall::Sessions => Perm::Read,
        OwnerCall::SourceTrigger { .. } => Perm::Upload,
        OwnerCall::AgentOpen { .. }
        | OwnerCall::AgentPoll { .. }
        | OwnerCall::AgentClose { .. } => Perm::Report,
        OwnerCall::Trigger { .. }
        | OwnerCall::Pause { .. }
        | OwnerCall::Halt { .. }
        | OwnerCall::Dryrun { .. }
        | OwnerCall::SourceHint { .. }
        | OwnerCall::SourceRestart
        | OwnerCall::SourceStop => Perm::Manage,
    };
    caller.require(perm, Some(env))?;
    if agent_call && !matches!(caller.role, Role::Agent | Role::Admin) {
        return Err(ApiError::forbidden("only agent tokens host agents"));
    }
    Ok(())
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
    caller: &Caller,
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
    typed(call(state, caller, env, c).await?)
}

pub async fn pause(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    agent: String,
    paused: bool,
) -> ApiResult<()> {
    typed(call(state, caller, env, OwnerCall::Pause { agent, paused }).await?)
}

pub async fn halt(state: &AppState, caller: &Caller, env: Uuid, halted: bool) -> ApiResult<()> {
    typed(call(state, caller, env, OwnerCall::Halt { halted }).await?)
}

pub async fn status(state: &AppState, caller: &Caller, env: Uuid) -> ApiResult<Status> {
    typed(call(state, caller, env, OwnerCall::Status).await?)
}

pub async fn sessions(state: &AppState, caller: &Caller, env: Uuid) -> ApiResult<Vec<SessionView>> {
    typed(call(state, caller, env, OwnerCall::Sessions).await?)
}

pub async fn dryrun(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    id: Uuid,
    version: i32,
) -> ApiResult<()> {
    typed(call(state, caller, env, OwnerCall::Dryrun { id, version }).await?)
}

pub async fn source_trigger(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    kind: &str,
    commit: Option<String>,
) -> ApiResult<Triggered> {
    let c = OwnerCall::SourceTrigger {
        kind: kind.into(),
        commit,
    };
    typed(call(state, caller, env, c).await?)
}

pub async fn source_hint(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    kind: &str,
) -> ApiResult<()> {
    typed(
        call(
            state,
            caller,
            env,
            OwnerCall::SourceHint { kind: kind.into() },
        )
        .await?,
    )
}

pub async fn source_restart(state: &AppState, caller: &Caller, env: Uuid) -> ApiResult<()> {
    typed(call(state, caller, env, OwnerCall::SourceRestart).await?)
}

pub async fn source_stop(state: &AppState, caller: &Caller, env: Uuid) -> ApiResult<()> {
    typed(call(state, caller, env, OwnerCall::SourceStop).await?)
}

pub async fn agent_open(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    hello: Hello,
) -> ApiResult<PollReply> {
    let c = OwnerCall::AgentOpen { hello };
    typed(call(state, caller, env, c).await?)
}

pub async fn agent_poll(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    instance: Uuid,
    poll: Poll,
) -> ApiResult<PollReply> {
    let c = OwnerCall::AgentPoll { instance, poll };
    typed(call(state, caller, env, c).await?)
}

pub async fn agent_close(
    state: &AppState,
    caller: &Caller,
    env: Uuid,
    instance: Uuid,
) -> ApiResult<()> {
    typed(call(state, caller, env, OwnerCall::AgentClose { instance }).await?)
}
