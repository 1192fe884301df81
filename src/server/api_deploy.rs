//! Deploy control: user deploy and repair, dry-runs, agents (pause), halt/resume, and the
//! per-version deploy progress. The scheduler does the work; these endpoints persist what
//! must survive a restart (pauses, halt, dry-run requests) and then wait for the scheduler
//! to acknowledge, so "paused" in an answer means nothing new starts.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{OptionalJson, environment, parse_number, parse_uuid};
use crate::scheduler::{SchedulerError, Schedulers};
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// only resources of this agent
    #[serde(default)]
    pub agent: Option<String>,
    /// only this resource (its id)
    #[serde(default)]
    pub resource: Option<String>,
}

async fn trigger(
    state: AppState,
    caller: Caller,
    key: String,
    body: TriggerBody,
    repair: bool,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let s = schedulers(&state)?;
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
    let n = s
        .trigger(env.id, repair, body.agent.clone(), body.resource.clone())
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
    Ok(Json(
        json!({"action": kind, "scheduled": n, "halted": env.halted}),
    ))
}

pub async fn deploy(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<TriggerBody>,
) -> ApiResult<Json<serde_json::Value>> {
    trigger(state, caller, key, body, false).await
}

pub async fn repair(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<TriggerBody>,
) -> ApiResult<Json<serde_json::Value>> {
    trigger(state, caller, key, body, true).await
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DryrunBody {
    /// default: the newest version
    #[serde(default)]
    pub version: Option<i32>,
}

pub async fn start_dryrun(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<DryrunBody>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let s = schedulers(&state)?;
    let version = match body.version {
        Some(v) => v,
        None => versions::list(&state.pool, env.id, 1)
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
    s.dryrun(env.id, id, version)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "version": version, "total": info.resource_count})),
    ))
}

pub async fn list_dryruns(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    Ok(Json(json!(
        store::deploy::dryruns(&state.pool, env.id).await?
    )))
}

pub async fn get_dryrun(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let id = parse_uuid("dry-run", &id)?;
    let row = store::deploy::dryrun(&state.pool, env.id, id).await?;
    let results = store::deploy::dryrun_results(&state.pool, id).await?;
    let changed = results
        .iter()
        .filter(|r| r.changes.as_object().is_some_and(|m| !m.is_empty()))
        .count();
    Ok(Json(json!({
        "dryrun": row,
        "complete": row.finished_at.is_some(),
        "changed": changed,
        "results": results,
    })))
}

pub async fn list_agents(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let rows = store::deploy::agents(&state.pool, env.id).await?;
    // live figures from the scheduler when it runs; the stored flags otherwise
    let live = match &state.schedulers {
        Some(s) if versions::active(&state.pool, env.id).await?.is_some() => {
            s.status(env.id).await.ok()
        }
        _ => None,
    };
    let agents: Vec<serde_json::Value> = rows
        .iter()
        .map(|a| {
            let l = live.as_ref().and_then(|l| l.agents.iter().find(|x| x.name == a.name));
            json!({
                "name": a.name,
                "paused": a.paused,
                "queued": l.map(|l| l.queued).unwrap_or(0),
                "running": l.map(|l| l.running).unwrap_or(0),
                "executors": l.map(|l| l.executors.clone()).unwrap_or_default(),
                "state": if env.halted { "halted" } else if a.paused { "paused" } else if l.is_some_and(|l| l.running > 0) { "deploying" } else { "idle" },
            })
        })
        .collect();
    Ok(Json(json!({"halted": env.halted, "agents": agents})))
}

async fn set_pause(
    state: AppState,
    caller: Caller,
    key: String,
    agent: String,
    paused: bool,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let known = store::deploy::agents(&state.pool, env.id).await?;
    if !known.iter().any(|a| a.name == agent) {
        return Err(ApiError::not_found(format!(
            "agent '{agent}' is not an agent of this environment"
        )));
    }
    store::deploy::set_paused(&state.pool, env.id, &agent, paused).await?;
    if let Some(s) = &state.schedulers {
        s.pause(env.id, agent.clone(), paused).await?;
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
    Ok(Json(json!({"name": agent, "paused": paused})))
}

pub async fn pause_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, agent)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    set_pause(state, caller, key, agent, true).await
}

pub async fn unpause_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, agent)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    set_pause(state, caller, key, agent, false).await
}

async fn set_halt(
    state: AppState,
    caller: Caller,
    key: String,
    halted: bool,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    store::environments::set_halted(&state.pool, env.id, halted).await?;
    if let Some(s) = &state.schedulers
        && versions::active(&state.pool, env.id).await?.is_some()
    {
        s.halt(env.id, halted).await?;
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
    Ok(Json(json!({"environment": env.id, "halted": halted})))
}

pub async fn halt(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    set_halt(state, caller, key, true).await
}

pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    set_halt(state, caller, key, false).await
}

/// Deploy summary of a version: counts by status, and whether it is done.
pub async fn progress(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let number = parse_number(&number)?;
    let info = versions::get(&state.pool, env.id, number).await?;
    let summary = store::state::deploy_summary(&state.pool, env.id, number).await?;
    let active = versions::active(&state.pool, env.id).await?;
    let is_active = active == Some(number);
    let done = is_active && summary.pending == 0;
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
    Ok(Json(json!({
        "version": number,
        "status": info.status,
        "active": is_active,
        "active_version": active,
        "phase": phase,
        "total": summary.total,
        "pending": summary.pending,
        "failed": summary.failed,
        "by_status": summary.by_status,
        // settled: nothing waiting for a first or new deploy, nothing running
        "done": done,
    })))
}
