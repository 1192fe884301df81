//! Versions: upload, list, inspect, diff, release, reject, roll back, delete.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, OptionalJson, environment, parse_number};
use super::{AppState, Event};
use crate::model::ExportFile;
use crate::model::settings::SourceKind;
use crate::store::{StoreError, audit, versions};

/// An uploaded export, with optional provenance (commit, branch, message …).
#[derive(Deserialize)]
pub struct Upload {
    #[serde(flatten)]
    pub export: ExportFile,
    #[serde(default)]
    pub provenance: Option<serde_json::Value>,
}

pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(body): ApiJson<Upload>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Upload, Some(env.id))?;
    if env.settings.source == SourceKind::Git {
        return Err(ApiError::conflict(
            "this environment follows a git repository: only committed models reach it (push to the repository instead)",
        ));
    }
    let mut provenance = body.provenance.unwrap_or_else(|| json!({}));
    if !provenance.is_object() {
        return Err(ApiError::bad_request("provenance must be an object"));
    }
    provenance["uploaded_by"] = json!(caller.name);
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let stored = versions::store(
        &mut tx,
        env.id,
        versions::NewVersion {
            export: &body.export,
            uploader: &caller.name,
            origin: "push",
            provenance,
        },
    )
    .await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "version.upload",
        &stored.info.number.to_string(),
        json!({"resources": stored.info.resource_count, "content_hash": stored.info.content_hash, "auto_released": stored.auto_released}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    if stored.auto_released {
        state.notifier.send(Event::Released {
            environment: env.id,
            version: stored.info.number,
        });
    }
    let mut v = json!(stored.info);
    v["auto_released"] = json!(stored.auto_released);
    Ok((StatusCode::CREATED, Json(v)))
}

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    pub limit: Option<i64>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let list = versions::list(&state.pool, env.id, limit).await?;
    let active = versions::active(&state.pool, env.id).await?;
    let items: Vec<serde_json::Value> = list
        .into_iter()
        .map(|v| {
            let mut j = json!(v);
            j["active"] = json!(Some(v.number) == active);
            j
        })
        .collect();
    Ok(Json(json!(items)))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    let info = versions::get(&state.pool, env.id, n).await?;
    let active = versions::active(&state.pool, env.id).await?;
    let approvals = versions::approvals(&state.pool, env.id, n).await?;
    let diff = versions::stored_diff(&state.pool, env.id, n).await?;
    let mut j = json!(info);
    j["active"] = json!(active == Some(n));
    j["approvals"] = json!(approvals);
    j["diff"] = json!(diff);
    Ok(Json(j))
}

pub async fn resources(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    versions::get(&state.pool, env.id, n).await?;
    Ok(Json(json!(
        versions::resources(&state.pool, env.id, n).await?
    )))
}

pub async fn export(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<ExportFile>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    let mut c = state.pool.acquire().await.map_err(StoreError::from)?;
    Ok(Json(versions::export_of(&mut c, env.id, n).await?))
}

pub async fn diff(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    let info = versions::get(&state.pool, env.id, n).await?;
    let d = versions::stored_diff(&state.pool, env.id, n).await?;
    Ok(Json(
        json!({"from": info.diff_base, "to": n, "summary": info.diff_summary, "changes": d}),
    ))
}

#[derive(Deserialize)]
pub struct DiffQuery {
    pub from: String,
    pub to: String,
}

pub async fn diff_between(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let (from, to) = (parse_number(&q.from)?, parse_number(&q.to)?);
    let mut c = state.pool.acquire().await.map_err(StoreError::from)?;
    let d = versions::diff_between(&mut c, env.id, from, to).await?;
    let count = |k: &str| d.iter().filter(|e| e.change == k).count();
    Ok(Json(json!({
        "from": from,
        "to": to,
        "summary": {"new": count("new"), "updated": count("updated"), "deleted": count("deleted")},
        "changes": d,
    })))
}

pub async fn approvals(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    versions::get(&state.pool, env.id, n).await?;
    Ok(Json(json!(
        versions::approvals(&state.pool, env.id, n).await?
    )))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    #[serde(default)]
    pub comment: String,
    /// The content hash the approver reviewed; the release is refused if it differs.
    #[serde(default)]
    pub content_hash: Option<String>,
}

pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
    OptionalJson(d): OptionalJson<Decision>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Release, Some(env.id))?;
    let n = parse_number(&number)?;
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let info = versions::release(
        &mut tx,
        env.id,
        n,
        &caller.name,
        &d.comment,
        d.content_hash.as_deref(),
    )
    .await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "version.release",
        &n.to_string(),
        json!({"comment": d.comment, "content_hash": info.content_hash}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    state.notifier.send(Event::Released {
        environment: env.id,
        version: n,
    });
    Ok(Json(json!(info)))
}

pub async fn reject(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
    OptionalJson(d): OptionalJson<Decision>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Release, Some(env.id))?;
    let n = parse_number(&number)?;
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let info = versions::reject(&mut tx, env.id, n, &caller.name, &d.comment).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "version.reject",
        &n.to_string(),
        json!({"comment": d.comment}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Json(json!(info)))
}

pub async fn rollback(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
    OptionalJson(d): OptionalJson<Decision>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Release, Some(env.id))?;
    let n = parse_number(&number)?;
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let comment = if d.comment.is_empty() {
        format!("rollback to version {n}")
    } else {
        d.comment.clone()
    };
    let info = versions::rollback(&mut tx, env.id, n, &caller.name, &comment).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "version.rollback",
        &info.number.to_string(),
        json!({"rollback_of": n, "comment": comment}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    state.notifier.send(Event::Released {
        environment: env.id,
        version: info.number,
    });
    let mut body = json!(info);
    // the hold is easy to miss: say it where the rollback is answered
    body["auto_release_held"] = json!(true);
    body["note"] = json!(
        "automatic release is held: newer versions wait for an explicit release until the hold is lifted (POST .../auto-release/resume) or a version is released by hand"
    );
    Ok((StatusCode::CREATED, Json(body)))
}

/// Lift the hold a rollback put on automatic release: new versions are released as they
/// arrive again (if `auto_release` is on).
pub async fn resume_auto_release(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Release, Some(env.id))?;
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    crate::store::environments::set_auto_release_held(&mut *tx, env.id, false).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "environment.resume_auto_release",
        "",
        json!({"was_held": env.auto_release_held}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Json(json!({
        "auto_release": env.settings.auto_release,
        "auto_release_held": false,
        "was_held": env.auto_release_held,
    })))
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let n = parse_number(&number)?;
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    versions::delete(&mut tx, env.id, n).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "version.delete",
        &n.to_string(),
        json!({}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(StatusCode::NO_CONTENT)
}
