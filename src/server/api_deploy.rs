//! Deploy control: user deploy and repair, dry-runs, agents (pause), halt/resume, and the
//! per-version deploy progress. The scheduler does the work; these endpoints persist what
//! must survive a restart (pauses, halt, dry-run requests) and then wait for the scheduler
//! to acknowledge, so "paused" in an answer means nothing new starts.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{OptionalJson, environment, parse_number, parse_uuid};
use super::openapi::{AgentPath, DEPLOY, EnvIdPath, EnvPath, VersionPath};
use super::owner;
use crate::scheduler::{SchedulerError, Schedulers};
use crate::store::deploy::{DryrunResult, DryrunRow};
use crate::store::{self, audit, versions};

impl From<SchedulerError> for ApiError {
    fn from(e: SchedulerError) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            e.to_string(),
        )
    }
}

fn schedulers(state: &AppState) -> ApiResult<&Schedulers> {
    state.schedulers.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_scheduler",
            "this server runs without a scheduler (--no-scheduler): it does not deploy",
        )
    })
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = DeployTrigger)]
pub struct TriggerBody {
    /// only resources of this agent
    #[serde(default)]
    pub agent: Option<String>,
    /// only this resource (its id)
    #[serde(default)]
    pub resource: Option<String>,
}

/// What a deploy or repair request scheduled.
#[derive(Serialize, ToSchema)]
pub struct Scheduled {
    /// deploy or repair
    pub action: &'static str,
    /// Resources scheduled.
    pub scheduled: usize,
    /// The environment is halted: nothing runs until it is resumed.
    pub halted: bool,
}

async fn trigger(
    state: AppState,
    caller: Caller,
    key: String,
    body: TriggerBody,
    repair: bool,
) -> ApiResult<Json<Scheduled>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    schedulers(&state)?;
    let Some(active) = versions::active(&state.pool, env.id).await? else {
        return Err(ApiError::conflict(
            "no version of this environment is released yet: nothing to deploy",
        ));
    };
    if let Some(rid) = &body.resource {
        versions::resource_in(&state.pool, env.id, active, rid)
            .await
            .map_err(|_| {
                ApiError::not_found(format!("resource {rid} is not in the active version"))
            })?;
    }
    let kind = if repair { "repair" } else { "deploy" };
    let n = owner::trigger(
        &state,
        &caller,
        env.id,
        repair,
        body.agent.clone(),
        body.resource.clone(),
    )
    .await?;
    audit::record(
        &state.pool,
        &caller.name,
        Some(env.id),
        &format!("environment.{kind}"),
        &env.name,
        json!({"agent": body.agent, "resource": body.resource, "scheduled": n}),
    )
    .await?;
    Ok(Json(Scheduled {
        action: kind,
        scheduled: n,
        halted: env.halted,
    }))
}

/// Deploy now (admin): resources not known to be good, optionally of one agent or one resource.
#[utoipa::path(post, path = "/api/v1/environments/{env}/deploy", tag = DEPLOY, params(EnvPath),
    request_body(content = Option<TriggerBody>, description = "Optional (an empty body means everything)"),
    responses((status = 200, description = "Scheduled", body = Scheduled)))]
pub async fn deploy(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<TriggerBody>,
) -> ApiResult<Json<Scheduled>> {
    trigger(state, caller, key, body, false).await
}

/// Repair now (admin): verify resources and restore drift.
#[utoipa::path(post, path = "/api/v1/environments/{env}/repair", tag = DEPLOY, params(EnvPath),
    request_body(content = Option<TriggerBody>, description = "Optional (an empty body means everything)"),
    responses((status = 200, description = "Scheduled", body = Scheduled)))]
pub async fn repair(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<TriggerBody>,
) -> ApiResult<Json<Scheduled>> {
    trigger(state, caller, key, body, true).await
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DryrunBody {
    /// default: the newest version
    #[serde(default)]
    pub version: Option<i32>,
}

/// A dry-run that was started.
#[derive(Serialize, ToSchema)]
pub struct DryrunStarted {
    pub id: uuid::Uuid,
    pub version: i32,
    /// Resources to dry-run.
    pub total: i32,
}

/// Start a dry-run of a version (admin): what deploying it would change.
#[utoipa::path(post, path = "/api/v1/environments/{env}/dryruns", tag = DEPLOY, params(EnvPath),
    request_body(content = Option<DryrunBody>, description = "Optional (an empty body: the newest version)"),
    responses((status = 202, description = "Started", body = DryrunStarted)))]
pub async fn start_dryrun(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<DryrunBody>,
) -> ApiResult<(StatusCode, Json<DryrunStarted>)> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    schedulers(&state)?;
    let version = match body.version {
        Some(v) => v,
        None => versions::list(&state.pool, env.id, 1, None)
            .await?
            .first()
            .map(|v| v.number)
            .ok_or_else(|| ApiError::conflict("this environment has no versions to dry-run"))?,
    };
    let info = versions::get(&state.pool, env.id, version).await?;
    let id = store::deploy::create_dryrun(
        &state.pool,
        env.id,
        version,
        info.resource_count,
        &caller.name,
    )
    .await?;
    owner::dryrun(&state, &caller, env.id, id, version).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(DryrunStarted {
            id,
            version,
            total: info.resource_count,
        }),
    ))
}

/// The dry-runs.
#[utoipa::path(get, path = "/api/v1/environments/{env}/dryruns", tag = DEPLOY, params(EnvPath),
    responses((status = 200, description = "The dry-runs", body = Vec<DryrunRow>)))]
pub async fn list_dryruns(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<Vec<DryrunRow>>> {
    let env = environment(&state, &caller, &key).await?;
    Ok(Json(store::deploy::dryruns(&state.pool, env.id).await?))
}

/// A dry-run with its results so far.
#[derive(Serialize, ToSchema)]
pub struct DryrunReport {
    pub dryrun: DryrunRow,
    pub complete: bool,
    /// Resources that would change.
    pub changed: usize,
    pub results: Vec<DryrunResult>,
}

/// A dry-run with its results.
#[utoipa::path(get, path = "/api/v1/environments/{env}/dryruns/{id}", tag = DEPLOY, params(EnvIdPath),
    responses((status = 200, description = "The dry-run", body = DryrunReport)))]
pub async fn get_dryrun(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
) -> ApiResult<Json<DryrunReport>> {
    let env = environment(&state, &caller, &key).await?;
    let id = parse_uuid("dry-run", &id)?;
    let row = store::deploy::dryrun(&state.pool, env.id, id).await?;
    let results = store::deploy::dryrun_results(&state.pool, id).await?;
    let changed = results
        .iter()
        .filter(|r| r.changes.as_object().is_some_and(|m| !m.is_empty()))
        .count();
    Ok(Json(DryrunReport {
        complete: row.finished_at.is_some(),
        dryrun: row,
        changed,
        results,
    }))
}

/// An agent and what it is doing.
#[derive(Serialize, ToSchema)]
pub struct Agent {
    pub name: String,
    pub paused: bool,
    /// Resources waiting to deploy.
    pub queued: usize,
    /// Resources deploying now.
    pub running: usize,
    /// Process ids of its executors on this server.
    pub executors: Vec<u32>,
    /// Where its executor runs: `local:`, `external` or `ssh://…`.
    pub placement: String,
    /// External processes hosting it (host, version, connected since, last heartbeat).
    pub processes: Vec<crate::scheduler::agents::SessionView>,
    /// The process that is its primary (of `processes`), if any.
    pub primary: Option<uuid::Uuid>,
    /// The result of its last finished action.
    pub last_result: Option<String>,
    /// halted, paused, down (external, no process connected), deploying or idle
    pub state: &'static str,
}

/// The agents of an environment.
#[derive(Serialize, ToSchema)]
pub struct Agents {
    pub halted: bool,
    pub agents: Vec<Agent>,
}

/// The agents with their live figures (when the scheduler runs).
#[utoipa::path(get, path = "/api/v1/environments/{env}/agents", tag = DEPLOY, params(EnvPath),
    responses((status = 200, description = "The agents", body = Agents)))]
pub async fn list_agents(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<Agents>> {
    let env = environment(&state, &caller, &key).await?;
    let rows = store::deploy::agents(&state.pool, env.id).await?;
    // live figures from the scheduler when it runs; the stored flags otherwise
    let live = match &state.schedulers {
        Some(_) if versions::active(&state.pool, env.id).await?.is_some() => {
            owner::status(&state, &caller, env.id).await.ok()
        }
        _ => None,
    };
    let sessions = match &state.schedulers {
        Some(_) => owner::sessions(&state, &caller, env.id)
            .await
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let last_results = store::deploy::last_results_by_agent(&state.pool, env.id).await?;
    let agents = rows
        .iter()
        .map(|a| {
            let l = live
                .as_ref()
                .and_then(|l| l.agents.iter().find(|x| x.name == a.name));
            let processes: Vec<_> = sessions
                .iter()
                .filter(|s| s.agents.contains(&a.name))
                .cloned()
                .collect();
            let primary = processes
                .iter()
                .find(|s| s.primary.contains_key(&a.name))
                .map(|s| s.instance);
            Agent {
                name: a.name.clone(),
                paused: a.paused,
                queued: l.map(|l| l.queued).unwrap_or(0),
                running: l.map(|l| l.running).unwrap_or(0),
                executors: l.map(|l| l.executors.clone()).unwrap_or_default(),
                placement: l
                    .map(|l| l.placement.clone())
                    .unwrap_or_else(|| "local:".into()),
                primary,
                processes,
                last_result: last_results.get(&a.name).cloned(),
                state: if env.halted {
                    "halted"
                } else if a.paused {
                    "paused"
                } else if l.is_some_and(|l| !l.ready) {
                    "down"
                } else if l.is_some_and(|l| l.running > 0) {
                    "deploying"
                } else {
                    "idle"
                },
            }
        })
        .collect();
    Ok(Json(Agents {
        halted: env.halted,
        agents,
    }))
}

/// An agent's pause flag.
#[derive(Serialize, ToSchema)]
pub struct Paused {
    pub name: String,
    pub paused: bool,
}

async fn set_pause(
    state: AppState,
    caller: Caller,
    key: String,
    agent: String,
    paused: bool,
) -> ApiResult<Json<Paused>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let known = store::deploy::agents(&state.pool, env.id).await?;
    if !known.iter().any(|a| a.name == agent) {
        return Err(ApiError::not_found(format!(
            "agent '{agent}' is not an agent of this environment"
        )));
    }
    store::deploy::set_paused(&state.pool, env.id, &agent, paused).await?;
    if state.schedulers.is_some() {
        owner::pause(&state, &caller, env.id, agent.clone(), paused).await?;
    }
    let what = if paused {
        "agent.pause"
    } else {
        "agent.unpause"
    };
    audit::record(
        &state.pool,
        &caller.name,
        Some(env.id),
        what,
        &agent,
        json!({}),
    )
    .await?;
    Ok(Json(Paused {
        name: agent,
        paused,
    }))
}

/// Pause an agent (admin): nothing new starts on it.
#[utoipa::path(post, path = "/api/v1/environments/{env}/agents/{agent}/pause", tag = DEPLOY, params(AgentPath),
    responses((status = 200, description = "Paused", body = Paused)))]
pub async fn pause_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, agent)): Path<(String, String)>,
) -> ApiResult<Json<Paused>> {
    set_pause(state, caller, key, agent, true).await
}

/// Unpause an agent (admin).
#[utoipa::path(post, path = "/api/v1/environments/{env}/agents/{agent}/unpause", tag = DEPLOY, params(AgentPath),
    responses((status = 200, description = "Unpaused", body = Paused)))]
pub async fn unpause_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, agent)): Path<(String, String)>,
) -> ApiResult<Json<Paused>> {
    set_pause(state, caller, key, agent, false).await
}

/// An environment's halt flag.
#[derive(Serialize, ToSchema)]
pub struct Halted {
    pub environment: uuid::Uuid,
    pub halted: bool,
}

async fn set_halt(
    state: AppState,
    caller: Caller,
    key: String,
    halted: bool,
) -> ApiResult<Json<Halted>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    store::environments::set_halted(&state.pool, env.id, halted).await?;
    if state.schedulers.is_some() && versions::active(&state.pool, env.id).await?.is_some() {
        owner::halt(&state, &caller, env.id, halted).await?;
    }
    let what = if halted {
        "environment.halt"
    } else {
        "environment.resume"
    };
    audit::record(
        &state.pool,
        &caller.name,
        Some(env.id),
        what,
        &env.name,
        json!({}),
    )
    .await?;
    Ok(Json(Halted {
        environment: env.id,
        halted,
    }))
}

/// Halt the environment (admin): nothing new starts until it is resumed.
#[utoipa::path(post, path = "/api/v1/environments/{env}/halt", tag = DEPLOY, params(EnvPath),
    responses((status = 200, description = "Halted", body = Halted)))]
pub async fn halt(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<Halted>> {
    set_halt(state, caller, key, true).await
}

/// Resume a halted environment (admin).
#[utoipa::path(post, path = "/api/v1/environments/{env}/resume", tag = DEPLOY, params(EnvPath),
    responses((status = 200, description = "Resumed", body = Halted)))]
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<Halted>> {
    set_halt(state, caller, key, false).await
}

/// Where the deploy of a version stands.
#[derive(Serialize, ToSchema)]
pub struct Progress {
    pub version: i32,
    /// The version's status (new, released, rejected, …).
    pub status: String,
    /// It is the released version being deployed.
    pub active: bool,
    /// The environment's active version, if any.
    pub active_version: Option<i32>,
    /// Where the version is, in one word: waiting_for_approval, rejected, replaced (a newer
    /// version is active), halted, deploying, failed or deployed.
    pub phase: String,
    /// Its resources.
    pub total: i64,
    /// Resources still to be deployed (new intent, deploying).
    pub pending: i64,
    /// Resources whose last deploy failed.
    pub failed: i64,
    /// Resources by status (see the resource list).
    #[schema(value_type = std::collections::BTreeMap<String, i64>)]
    pub by_status: serde_json::Map<String, serde_json::Value>,
    /// Settled: it is active, nothing waits for a first or new deploy, nothing runs.
    pub done: bool,
    /// Resources being deployed right now, the longest running first (at most 5).
    pub working_on: Vec<String>,
    /// Who counted the resources per status: `scheduler` (the environment's scheduler on
    /// this server, from its model, once the database held the states it counted) or
    /// `database` (a count of the stored states). Both count the same.
    pub counted_by: String,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProgressQuery {
    /// Wait up to this many milliseconds (at most 30,000) for the version to be done before
    /// answering; the answer comes as soon as it is. Default 0: answer at once.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// Deploy progress of a version; with `wait_ms`, once it is done (or the wait is over).
#[utoipa::path(get, operation_id = "version_progress", path = "/api/v1/environments/{env}/versions/{number}/progress", tag = DEPLOY, params(VersionPath, ProgressQuery),
    responses((status = 200, description = "The progress", body = Progress),
        (status = 429, description = "The environment holds as many waits as it may at once (Retry-After says when to ask again)")))]
pub async fn progress(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
    axum::extract::Query(q): axum::extract::Query<ProgressQuery>,
) -> ApiResult<Json<Progress>> {
    let env = environment(&state, &caller, &key).await?;
    let number = parse_number(&number)?;
    let wait = std::time::Duration::from_millis(q.wait_ms.unwrap_or(0).min(30_000));
    // a held request is bounded per environment; one past the bound is asked to come back
    let _slot = if wait.is_zero() {
        None
    } else {
        Some(state.waits.enter(env.id).ok_or_else(|| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_waits",
                format!(
                    "environment {} already has {} progress requests waiting on this server; ask again in a second, or without wait_ms",
                    env.name,
                    crate::server::waits::Waits::PER_ENVIRONMENT
                ),
            )
        })?)
    };
    let deadline = tokio::time::Instant::now() + wait;
    // Counting the states by status reads every resource of the version (100,000: about
    // 0.1 s). While the scheduler still has work for the active version they can not be
    // settled, and it says so from memory: it is asked first, and the states are counted
    // once it has none (again, less often each time, while its last states are written).
    let mut gap = std::time::Duration::ZERO;
    let mut counted: Option<tokio::time::Instant> = None;
    loop {
        if tokio::time::Instant::now() < deadline
            && !env.halted
            && versions::active(&state.pool, env.id).await? == Some(number)
        {
            // Here the scheduler answers from memory in microseconds: ask every 5 ms. When
            // another replica owns the environment each question is an HTTP call to it: ask
            // every 50 ms, so that the waits it may hold (Waits::PER_ENVIRONMENT per
            // replica) keep its load small. (Not by how long a call took: a scheduler still
            // restoring its model answers late, and that wait is not its load.)
            let every = match &state.replica {
                Some(r) if r.owns(env.id).is_none() => std::time::Duration::from_millis(50),
                _ => std::time::Duration::from_millis(5),
            };
            while tokio::time::Instant::now() < deadline {
                let idle = match owner::status(&state, &caller, env.id).await {
                    Ok(s) => s.version == Some(number) && s.queued == 0 && s.running == 0,
                    // no scheduler to ask (not running here, not reachable): count
                    Err(_) => true,
                };
                if idle {
                    break;
                }
                tokio::time::sleep(every).await;
            }
        }
        if let Some(at) = counted {
            tokio::time::sleep_until(deadline.min(at + gap)).await;
            gap = (gap * 2).clamp(
                std::time::Duration::from_millis(20),
                std::time::Duration::from_secs(1),
            );
        }
        counted = Some(tokio::time::Instant::now());
        let p = progress_now(&state, env.id, number).await?;
        tracing::debug!(environment = %env.id, version = number, done = p.done, pending = p.pending, phase = %p.phase, gap_ms = gap.as_millis() as u64, "progress counted");
        if p.done || p.phase != "deploying" || tokio::time::Instant::now() >= deadline {
            return Ok(Json(p));
        }
    }
}

/// Where the deploy of version `number` of `env` stands now (the caller has been checked).
pub async fn progress_now(state: &AppState, env: uuid::Uuid, number: i32) -> ApiResult<Progress> {
    // read each time: a wait sees a halt that came meanwhile
    let env = store::environments::get_environment(&state.pool, env).await?;
    let info = versions::get(&state.pool, env.id, number).await?;
    // the scheduler running here knows every state it wrote: asking it is a few milliseconds
    // where the database joins every resource with its state (100,000: ~0.25 s)
    let known = match &state.schedulers {
        Some(s) => s.stored_status_counts(env.id, number).await,
        None => None,
    };
    let (summary, counted_by) = store::state::summary_known_or_counted(
        &state.pool,
        env.id,
        number,
        known,
        info.resource_count,
    )
    .await?;
    let active = versions::active(&state.pool, env.id).await?;
    let is_active = active == Some(number);
    let done = is_active && summary.pending == 0;
    let working_on = if summary.by_status.contains_key("deploying") {
        store::state::deploying_now(&state.pool, env.id, number, 5).await?
    } else {
        Vec::new()
    };
    // one word for where the version is, so a client need not combine the fields
    let phase = match info.status.as_str() {
        "new" => "waiting_for_approval",
        "rejected" => "rejected",
        _ if !is_active => "replaced",
        _ if !done && env.halted => "halted",
        _ if !done => "deploying",
        _ if summary.failed > 0 => "failed",
        _ => "deployed",
    };
    Ok(Progress {
        version: number,
        status: info.status,
        active: is_active,
        active_version: active,
        phase: phase.into(),
        total: summary.total,
        pending: summary.pending,
        failed: summary.failed,
        by_status: summary.by_status,
        // settled: nothing waiting for a first or new deploy, nothing running
        done,
        working_on,
        counted_by: counted_by.into(),
    })
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReportQuery {
    /// how many changed resources to name (default 20, at most 1,000)
    #[serde(default)]
    pub limit: Option<i64>,
}

/// What deploying a version changed, from its actions (dry-runs aside): how many resources
/// were created, updated and purged (each counted once, by its last change), and the first
/// `limit` of them by id.
#[utoipa::path(get, operation_id = "version_report", path = "/api/v1/environments/{env}/versions/{number}/report", tag = DEPLOY, params(VersionPath, ReportQuery),
    responses((status = 200, description = "The changes made so far", body = store::actions::ChangesMade),
        (status = 404, description = "No such version")))]
pub async fn report(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
    axum::extract::Query(q): axum::extract::Query<ReportQuery>,
) -> ApiResult<Json<store::actions::ChangesMade>> {
    let env = environment(&state, &caller, &key).await?;
    let number = parse_number(&number)?;
    versions::get(&state.pool, env.id, number).await?;
    let limit = q.limit.unwrap_or(20).clamp(0, 1_000);
    Ok(Json(
        store::actions::changes_made(&state.pool, env.id, number, limit).await?,
    ))
}
