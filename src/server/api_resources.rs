//! Resources of the active version with their state, one resource's history, action logs.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment};
use crate::store::actions::ActionRecord;
use crate::store::{self, StoreError, versions};

#[derive(Deserialize, Default)]
pub struct ListQuery {
    /// a version number (default: the active version)
    #[serde(default)]
    pub version: Option<i32>,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<store::state::ResourceList>> {
    let env = environment(&state, &caller, &key).await?;
    let version = match q.version {
        Some(v) => v,
        None => match versions::active(&state.pool, env.id).await? {
            Some(v) => v,
            None => {
                return Ok(Json(store::state::ResourceList {
                    version: None,
                    resources: vec![],
                }));
            }
        },
    };
    let mut rows = store::state::list(&state.pool, env.id, version).await?;
    if let Some(a) = &q.agent {
        rows.retain(|r| &r.agent == a);
    }
    if let Some(s) = &q.status {
        rows.retain(|r| &r.status == s);
    }
    // serialized straight from the rows: 10,000 resources are a few MB
    Ok(Json(store::state::ResourceList {
        version: Some(version),
        resources: rows,
    }))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let id = id.trim_start_matches('/').to_string();
    let history = versions::resource_history(&state.pool, env.id, &id).await?;
    let Some((latest, _, _)) = history.first() else {
        return Err(ApiError::not_found(format!(
            "resource {id} is in no version of this environment"
        )));
    };
    let active = versions::active(&state.pool, env.id).await?;
    // the resource as it is in the active version, else in the newest one holding it
    let shown = match active {
        Some(a) if history.iter().any(|(v, _, _)| *v == a) => a,
        _ => *latest,
    };
    let current = versions::resource_in(&state.pool, env.id, shown, &id).await?;
    let state_row = store::state::list(&state.pool, env.id, shown)
        .await?
        .into_iter()
        .find(|r| r.resource_id == id);
    // changes along its history: a new hash starts a new entry
    let mut changes = Vec::new();
    for w in history.windows(2) {
        if w[0].1 != w[1].1 || w[0].2 != w[1].2 {
            changes.push(json!({"version": w[0].0, "hash": w[0].1, "undefined": w[0].2}));
        }
    }
    if let Some(first) = history.last() {
        changes.push(json!({"version": first.0, "hash": first.1, "undefined": first.2}));
    }
    let actions = store::actions::for_resource(&state.pool, env.id, &id, 20).await?;
    Ok(Json(json!({
        "resource_id": id,
        "version": shown,
        "in_active_version": active == Some(shown),
        "resource": current,
        "state": state_row,
        "versions": history.iter().map(|(v, _, _)| v).collect::<Vec<_>>(),
        "changes": changes,
        "recent_actions": actions,
    })))
}

#[derive(Deserialize)]
pub struct ActionQuery {
    #[serde(default)]
    pub resource_id: Option<String>,
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub limit: Option<i64>,
}

pub async fn list_actions(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ActionQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let rows = match &q.resource_id {
        Some(rid) => {
            let rows = store::actions::for_resource(&state.pool, env.id, rid, limit).await?;
            // no history and in no version: a typo, not a quiet resource
            if rows.is_empty()
                && versions::resource_history(&state.pool, env.id, rid)
                    .await?
                    .is_empty()
            {
                return Err(ApiError::not_found(format!(
                    "resource {rid} is in no version of this environment"
                )));
            }
            rows
        }
        None => {
            store::actions::for_environment(&state.pool, env.id, q.action.as_deref(), limit).await?
        }
    };
    Ok(Json(json!(rows)))
}

/// An executor (agent token) reports an action record: inserted at start, completed at end.
pub async fn report_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(mut record): ApiJson<ActionRecord>,
) -> ApiResult<StatusCode> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Report, Some(env.id))?;
    record.environment_id = env.id;
    versions::get(&state.pool, env.id, record.version).await?;
    store::actions::upsert(&state.pool, &record)
        .await
        .map_err(|e| match e {
            StoreError::Invalid(m) => ApiError::bad_request(m),
            other => other.into(),
        })?;
    Ok(StatusCode::NO_CONTENT)
}
