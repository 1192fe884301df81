//! Versions: upload, list, inspect, diff, release, reject, roll back, delete.

use axum::Json;
use axum::extract::FromRequest;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, OptionalJson, environment, parse_number};
use super::openapi::{EnvPath, VERSIONS, VersionPath};
use super::{AppState, Event};
use crate::model::ExportFile;
use crate::model::settings::SourceKind;
use crate::store::versions::{Approval, DiffEntry, StoredResource, VersionInfo};
use crate::store::{StoreError, audit, versions};

/// An uploaded export, with optional provenance (commit, branch, message …).
#[derive(Deserialize, ToSchema)]
pub struct Upload {
    #[serde(flatten)]
    pub export: ExportFile,
    /// where the version comes from (commit, branch, message …): a JSON object
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub provenance: Option<serde_json::Value>,
    /// Send the version as its changes against the newest version: `resources` are then the
    /// new and changed resources, `removed` the ids it no longer has, and `undefined` still
    /// the complete list. Answered `409 base_moved` when `base` is not the newest version
    /// (send the whole export then).
    #[serde(default)]
    pub base: Option<crate::model::DeltaBase>,
    /// With `base`: the ids of the resources the new version no longer has.
    #[serde(default)]
    pub removed: Vec<crate::model::ResourceId>,
    /// With `base`: the content hash the new version must have (the sender computes it from
    /// its whole export); refused with `409 base_moved` when the changes give another.
    #[serde(default)]
    pub content_hash: Option<String>,
}

/// A stored version, and whether it was released at once (`auto_release`).
#[derive(Serialize, ToSchema)]
pub struct Uploaded {
    #[serde(flatten)]
    pub version: VersionInfo,
    pub auto_released: bool,
}

/// Upload a version (an export of `steward compile --export`): admin or compiler token; refused
/// when the environment follows a git repository.
#[utoipa::path(post, operation_id = "upload_version", path = "/api/v1/environments/{env}/versions", tag = VERSIONS, params(EnvPath), request_body = Upload,
    responses((status = 201, description = "Stored", body = Uploaded)))]
pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    request: axum::extract::Request,
) -> ApiResult<(StatusCode, Json<Uploaded>)> {
    // who may upload is settled before the body (up to UPLOAD_BODY) is read
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Upload, Some(env.id))?;
    if env.settings.source == SourceKind::Git {
        return Err(ApiError::conflict(
            "this environment follows a git repository: only committed models reach it (push to the repository instead)",
        ));
    }
    let received = std::time::Instant::now();
    let ApiJson(mut body) = ApiJson::<Upload>::from_request(request, &state).await?;
    tracing::debug!(
        read_ms = received.elapsed().as_secs_f64() * 1e3,
        resources = body.export.resources.len(),
        "upload read"
    );
    let mut provenance = body.provenance.unwrap_or_else(|| json!({}));
    if !provenance.is_object() {
        return Err(ApiError::bad_request("provenance must be an object"));
    }
    provenance["uploaded_by"] = json!(caller.name);
    if body.base.is_none() && !body.removed.is_empty() {
        return Err(ApiError::bad_request(
            "removed is for a version sent as changes: it needs base",
        ));
    }
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let nv = versions::NewVersion {
        export: &body.export,
        uploader: &caller.name,
        origin: "push",
        provenance,
        attributes_beside: Some(&state.pool),
    };
    let mut stored = match &body.base {
        None => versions::store(&mut tx, env.id, nv).await?,
        Some(base) => {
            versions::store_delta(
                &mut tx,
                env.id,
                nv,
                base,
                &body.removed,
                body.content_hash.as_deref(),
            )
            .await?
        }
    };
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "version.upload",
        &stored.info.number.to_string(),
        json!({"resources": stored.info.resource_count, "content_hash": stored.info.content_hash, "auto_released": stored.auto_released,
               "sent": if body.base.is_some() { "changes" } else { "whole" }}),
    )
    .await?;
    tx.commit().await.map_err(StoreError::from)?;
    versions::refresh_statistics_after(&state.pool, &stored);
    tracing::debug!(
        committed_ms = received.elapsed().as_secs_f64() * 1e3,
        "upload stored"
    );
    if stored.auto_released {
        // the scheduler reads these attributes next: from memory, not the database
        if state.schedulers.as_ref().is_some_and(|s| s.owns(env.id)) {
            versions::hand_over(&mut stored, &mut body.export);
        }
        state.notifier.send(Event::Released {
            environment: env.id,
            version: stored.info.number,
        });
    }
    Ok((
        StatusCode::CREATED,
        Json(Uploaded {
            version: stored.info,
            auto_released: stored.auto_released,
        }),
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// at most this many, newest first (default 100, at most 10,000)
    #[serde(default)]
    pub limit: Option<i64>,
    /// only versions numbered below this one (the next page: the last number of this one)
    #[serde(default)]
    #[param(minimum = 1)]
    pub before: Option<i32>,
}

/// A version in a list.
#[derive(Serialize, ToSchema)]
pub struct VersionItem {
    #[serde(flatten)]
    pub version: VersionInfo,
    /// It is the released version being deployed.
    pub active: bool,
    /// How many decisions (releases, rejections) it has (`.../approvals` lists them).
    pub approvals: i64,
}

/// The versions, newest first.
#[utoipa::path(get, operation_id = "list_versions", path = "/api/v1/environments/{env}/versions", tag = VERSIONS, params(EnvPath, ListQuery),
    responses((status = 200, description = "The versions", body = Vec<VersionItem>)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<VersionItem>>> {
    let env = environment(&state, &caller, &key).await?;
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    let list = versions::list(&state.pool, env.id, limit, q.before).await?;
    let active = versions::active(&state.pool, env.id).await?;
    let numbers: Vec<i32> = list.iter().map(|v| v.number).collect();
    let decisions = versions::decision_counts(&state.pool, env.id, &numbers).await?;
    Ok(Json(
        list.into_iter()
            .map(|v| VersionItem {
                active: Some(v.number) == active,
                approvals: decisions.get(&v.number).copied().unwrap_or(0),
                version: v,
            })
            .collect(),
    ))
}

/// A version with its approvals and its diff against the version before it.
#[derive(Serialize, ToSchema)]
pub struct VersionDetail {
    #[serde(flatten)]
    pub version: VersionInfo,
    pub active: bool,
    pub approvals: Vec<Approval>,
    pub diff: Vec<DiffEntry>,
    /// The values its compile asked for and did not have (`std::getfact`).
    pub unknowns: UnknownsSummary,
}

/// A version's unknown values: how many, how many are known now, and whether the version
/// waits for someone to compile again (it was uploaded, so the server can not).
#[derive(Serialize, utoipa::ToSchema)]
pub struct UnknownsSummary {
    pub total: usize,
    /// Facts or parameters that arrived since.
    pub known_now: usize,
    /// Known values arrived for a version the server did not compile from a source: run
    /// `steward export` again to use them.
    pub waiting_for_export: bool,
}

/// A version.
#[utoipa::path(get, operation_id = "get_version", path = "/api/v1/environments/{env}/versions/{number}", tag = VERSIONS, params(VersionPath),
    responses((status = 200, description = "The version", body = VersionDetail)))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<VersionDetail>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    let info = versions::get(&state.pool, env.id, n).await?;
    let active = versions::active(&state.pool, env.id).await?;
    let approvals = versions::approvals(&state.pool, env.id, n).await?;
    let diff = versions::stored_diff(&state.pool, env.id, n).await?;
    let unknowns = crate::store::facts::unknowns_of(&state.pool, env.id, n).await?;
    let known_now = unknowns.iter().filter(|(_, resolved)| *resolved).count();
    let compiled_here = info.provenance["commit"].is_string()
        && info.provenance["compile"].is_string()
        && crate::store::sources::get_source(&state.pool, env.id)
            .await?
            .is_some();
    Ok(Json(VersionDetail {
        unknowns: UnknownsSummary {
            total: unknowns.len(),
            known_now,
            waiting_for_export: known_now > 0 && !compiled_here,
        },
        version: info,
        active: active == Some(n),
        approvals,
        diff,
    }))
}

/// The resources of a version, as stored.
#[utoipa::path(get, operation_id = "version_resources", path = "/api/v1/environments/{env}/versions/{number}/resources", tag = VERSIONS, params(VersionPath),
    responses((status = 200, description = "The resources", body = Vec<StoredResource>)))]
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

/// A version as the export it was made from.
#[utoipa::path(get, operation_id = "export_version", path = "/api/v1/environments/{env}/versions/{number}/export", tag = VERSIONS, params(VersionPath),
    responses((status = 200, description = "The export", body = ExportFile)))]
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

/// A version's stored diff against the version before it.
#[derive(Serialize, ToSchema)]
pub struct VersionDiff {
    /// The version compared against; null for the first version.
    pub from: Option<i32>,
    pub to: i32,
    /// Counts by change kind.
    #[schema(value_type = Object)]
    pub summary: serde_json::Value,
    pub changes: Vec<DiffEntry>,
}

/// A version's diff against the version before it.
#[utoipa::path(get, operation_id = "version_diff", path = "/api/v1/environments/{env}/versions/{number}/diff", tag = VERSIONS, params(VersionPath),
    responses((status = 200, description = "The diff", body = VersionDiff)))]
pub async fn diff(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
) -> ApiResult<Json<VersionDiff>> {
    let env = environment(&state, &caller, &key).await?;
    let n = parse_number(&number)?;
    let info = versions::get(&state.pool, env.id, n).await?;
    let d = versions::stored_diff(&state.pool, env.id, n).await?;
    Ok(Json(VersionDiff {
        from: info.diff_base,
        to: n,
        summary: info.diff_summary,
        changes: d,
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// a version number
    #[param(value_type = i32, minimum = 1)]
    pub from: String,
    /// a version number
    #[param(value_type = i32, minimum = 1)]
    pub to: String,
}

/// Counts of a diff by change kind.
#[derive(Serialize, ToSchema)]
pub struct DiffSummary {
    pub new: usize,
    pub updated: usize,
    pub deleted: usize,
}

/// The diff between two versions.
#[derive(Serialize, ToSchema)]
pub struct DiffBetween {
    pub from: i32,
    pub to: i32,
    pub summary: DiffSummary,
    pub changes: Vec<DiffEntry>,
}

/// The diff between two versions.
#[utoipa::path(get, path = "/api/v1/environments/{env}/diff", tag = VERSIONS, params(EnvPath, DiffQuery),
    responses((status = 200, description = "The diff", body = DiffBetween)))]
pub async fn diff_between(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<Json<DiffBetween>> {
    let env = environment(&state, &caller, &key).await?;
    let (from, to) = (parse_number(&q.from)?, parse_number(&q.to)?);
    let mut c = state.pool.acquire().await.map_err(StoreError::from)?;
    let d = versions::diff_between(&mut c, env.id, from, to).await?;
    let count = |k: &str| d.iter().filter(|e| e.change == k).count();
    Ok(Json(DiffBetween {
        from,
        to,
        summary: DiffSummary {
            new: count("new"),
            updated: count("updated"),
            deleted: count("deleted"),
        },
        changes: d,
    }))
}

/// Who released or rejected a version.
#[utoipa::path(get, operation_id = "version_approvals", path = "/api/v1/environments/{env}/versions/{number}/approvals", tag = VERSIONS, params(VersionPath),
    responses((status = 200, description = "The decisions", body = Vec<Approval>)))]
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

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    #[serde(default)]
    pub comment: String,
    /// The content hash the approver reviewed; the release is refused if it differs.
    #[serde(default)]
    pub content_hash: Option<String>,
}

/// Release a version (admin or approver): it becomes the active version.
#[utoipa::path(post, operation_id = "release_version", path = "/api/v1/environments/{env}/versions/{number}/release", tag = VERSIONS, params(VersionPath),
    request_body(content = Option<Decision>, description = "Optional (an empty body is fine)"),
    responses((status = 200, description = "Released", body = VersionInfo)))]
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

/// Reject a version (admin or approver).
#[utoipa::path(post, operation_id = "reject_version", path = "/api/v1/environments/{env}/versions/{number}/reject", tag = VERSIONS, params(VersionPath),
    request_body(content = Option<Decision>, description = "Optional (an empty body is fine)"),
    responses((status = 200, description = "Rejected", body = VersionInfo)))]
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

/// Roll back to a version (admin or approver): its content becomes a new, released version.
#[utoipa::path(post, operation_id = "rollback_version", path = "/api/v1/environments/{env}/versions/{number}/rollback", tag = VERSIONS, params(VersionPath),
    request_body(content = Option<Decision>, description = "Optional (an empty body is fine)"),
    responses((status = 201, description = "The new version", body = RolledBack)))]
pub async fn rollback(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, number)): Path<(String, String)>,
    OptionalJson(d): OptionalJson<Decision>,
) -> ApiResult<(StatusCode, Json<RolledBack>)> {
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
    // the hold is easy to miss: say it where the rollback is answered
    Ok((
        StatusCode::CREATED,
        Json(RolledBack {
            info,
            auto_release_held: true,
            note: "automatic release is held: newer versions wait for an explicit release until the hold is lifted (POST .../auto-release/resume) or a version is released by hand".into(),
        }),
    ))
}

/// The version a rollback made, and the hold it put on automatic release.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct RolledBack {
    #[serde(flatten)]
    pub info: versions::VersionInfo,
    /// Always true: newer versions wait for an explicit release.
    pub auto_release_held: bool,
    pub note: String,
}

/// Lift the hold a rollback put on automatic release: new versions are released as they
/// arrive again (if `auto_release` is on).
#[utoipa::path(post, operation_id = "resume_auto_release", path = "/api/v1/environments/{env}/auto-release/resume", tag = VERSIONS, params(EnvPath),
    responses((status = 200, description = "The hold is lifted", body = AutoReleaseResumed)))]
pub async fn resume_auto_release(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<AutoReleaseResumed>> {
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
    Ok(Json(AutoReleaseResumed {
        auto_release: env.settings.auto_release,
        auto_release_held: false,
        was_held: env.auto_release_held,
    }))
}

/// Automatic release after lifting a rollback's hold.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct AutoReleaseResumed {
    /// The `auto_release` setting.
    pub auto_release: bool,
    /// Always false now.
    pub auto_release_held: bool,
    /// Whether a hold was lifted.
    pub was_held: bool,
}

/// Delete a version (admin; never the active one).
#[utoipa::path(delete, operation_id = "delete_version", path = "/api/v1/environments/{env}/versions/{number}", tag = VERSIONS, params(VersionPath),
    responses((status = 204, description = "Deleted")))]
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
