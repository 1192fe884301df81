//! Resources of the active version with their state, one resource's history, action logs.

use axum::Json;
use axum::extract::FromRequest;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment};
use super::openapi::{EnvPath, RESOURCES, ResourcePath};
use crate::model::Role;
use crate::store::actions::ActionRecord;
use crate::store::{self, StoreError, versions};

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// a version number (default: the active version)
    #[serde(default)]
    pub version: Option<i32>,
    /// only this agent's resources
    #[serde(default)]
    pub agent: Option<String>,
    /// only resources with this status
    #[serde(default)]
    pub status: Option<String>,
    /// only resources of this type (`fs::File`)
    #[serde(default, rename = "type")]
    pub resource_type: Option<String>,
    /// only resources whose id contains this text (case-insensitive)
    #[serde(default)]
    pub q: Option<String>,
    /// sort by id (default), type, agent, status or deployed (end of the last run; never
    /// deployed last)
    #[serde(default)]
    pub sort: Option<String>,
    /// asc (default) or desc
    #[serde(default)]
    pub order: Option<String>,
    /// skip this many (default 0)
    #[serde(default)]
    pub offset: Option<i64>,
    /// at most this many (default: all)
    #[serde(default)]
    pub limit: Option<i64>,
}

impl ListQuery {
    /// The store's page request for `version`, or why the query is refused.
    pub fn page_request(&self, version: i32) -> Result<store::state::PageRequest, ApiError> {
        let sort = match self.sort.as_deref() {
            None | Some("") => store::state::SortKey::Id,
            Some(s) => store::state::SortKey::parse(s).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "sort must be one of {}",
                    store::state::SortKey::ALL.map(|k| k.as_str()).join(", ")
                ))
            })?,
        };
        let desc = match self.order.as_deref() {
            None | Some("") | Some("asc") => false,
            Some("desc") => true,
            Some(_) => return Err(ApiError::bad_request("order must be asc or desc")),
        };
        if self.offset.is_some_and(|o| o < 0) || self.limit.is_some_and(|l| l < 0) {
            return Err(ApiError::bad_request(
                "offset and limit must not be negative",
            ));
        }
        Ok(store::state::PageRequest {
            version,
            filter: store::state::Filter {
                status: self.status.clone(),
                agent: self.agent.clone(),
                resource_type: self.resource_type.clone(),
                text: self.q.clone(),
            },
            sort,
            desc,
            offset: self.offset.unwrap_or(0),
            limit: self.limit,
        })
    }
}

/// The resources of a version (default: the active one) with their deploy state; filtered,
/// sorted and paged in the database.
#[utoipa::path(get, operation_id = "list_resources", path = "/api/v1/environments/{env}/resources", tag = RESOURCES, params(EnvPath, ListQuery),
    responses((status = 200, description = "The resources; `version` is null (and the list empty) before the first release; `total` counts those matching the filter", body = store::state::ResourceList),
        (status = 400, description = "An unknown sort or order, or a negative offset or limit")))]
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
                q.page_request(0)?;
                return Ok(Json(store::state::ResourceList {
                    version: None,
                    resources: vec![],
                    total: Some(0),
                }));
            }
        },
    };
    let req = q.page_request(version)?;
    let page = store::state::page(&state.pool, &state.facets, env.id, &req).await?;
    // serialized straight from the rows: 10,000 resources are a few MB
    Ok(Json(store::state::ResourceList {
        version: Some(version),
        resources: page.rows,
        total: Some(page.total),
    }))
}

/// One resource: as it is in the active version (else the newest holding it), its state, its
/// history and recent actions.
#[utoipa::path(get, operation_id = "get_resource", path = "/api/v1/environments/{env}/resources/{*id}", tag = RESOURCES, params(ResourcePath),
    responses((status = 200, description = "The resource: `resource` (a stored resource), `state`, `versions`, `changes`, `recent_actions`", body = Object)))]
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
    let state_row = store::state::one(&state.pool, env.id, shown, &id).await?;
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

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ActionQuery {
    /// only this resource's actions
    #[serde(default)]
    pub resource_id: Option<String>,
    /// only this kind: deploy, dryrun, repair, delete (ignored with `resource_id`)
    #[serde(default)]
    pub action: Option<String>,
    /// at most this many, newest first (default 100, at most 10,000)
    #[serde(default)]
    pub limit: Option<i64>,
}

/// The action log, newest first.
#[utoipa::path(get, path = "/api/v1/environments/{env}/actions", tag = RESOURCES, params(EnvPath, ActionQuery),
    responses((status = 200, description = "The actions", body = Vec<ActionRecord>)))]
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

/// Report an action record (admin tokens): inserted at start, completed at end.
/// `environment_id` is taken from the path. Agent tokens report through their agent
/// sessions, which check the agent, the primary's term and the owner's lease; they are
/// refused here (this route has none of those checks).
#[utoipa::path(post, path = "/api/v1/environments/{env}/actions", tag = RESOURCES, params(EnvPath), request_body = ActionRecord,
    responses((status = 204, description = "Recorded")))]
pub async fn report_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<StatusCode> {
    // who may report is settled before the body is read
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Report, Some(env.id))?;
    if caller.role == Role::Agent {
        return Err(ApiError::forbidden(
            "agent tokens report results through their agent sessions",
        ));
    }
    let ApiJson(mut record) = ApiJson::<ActionRecord>::from_request(request, &state).await?;
    record.environment_id = env.id;
    // the limits of what an executor may report hold for a pushed record too
    if let Ok(mut lines) =
        serde_json::from_value::<Vec<crate::executor::protocol::LogLine>>(record.messages.clone())
    {
        crate::executor::limits::bound_messages(&mut lines);
        record.messages = serde_json::to_value(lines).unwrap_or_default();
    }
    versions::get(&state.pool, env.id, record.version).await?;
    store::actions::upsert(&state.pool, &record)
        .await
        .map_err(|e| match e {
            StoreError::Invalid(m) => ApiError::bad_request(m),
            other => other.into(),
        })?;
    Ok(StatusCode::NO_CONTENT)
}
