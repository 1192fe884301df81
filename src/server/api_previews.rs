//! Pull-request previews (docs/previews.md): list them, read one with its runs and changes,
//! and preview a ref by hand. No route releases, approves, deploys or deletes a preview: a
//! preview is never a version.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment, parse_uuid};
use super::openapi::{EnvPath, PREVIEWS};
use crate::sources::previews::PreviewQueued;
use crate::store::audit;
use crate::store::previews::{self as previews, Preview, PreviewChange, Run};

/// Changes a report lists at most.
const MAX_CHANGES: i64 = 10_000;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PreviewListQuery {
    /// `open`, `closed` or `all` (the default).
    pub state: Option<String>,
    /// At most this many (50 by default, up to 1000).
    pub limit: Option<i64>,
}

/// A preview with its newest run, without the run's output.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PreviewSummary {
    #[serde(flatten)]
    pub preview: Preview,
    pub run: Option<RunSummary>,
}

/// A run without its output.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct RunSummary {
    pub id: uuid::Uuid,
    pub head: String,
    pub status: String,
    pub diff_base: Option<i32>,
    #[schema(value_type = Object)]
    pub summary: serde_json::Value,
    pub error: Option<String>,
    pub requested_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<&Run> for RunSummary {
    fn from(r: &Run) -> RunSummary {
        RunSummary {
            id: r.id,
            head: r.head.clone(),
            status: r.status.clone(),
            diff_base: r.diff_base,
            summary: r.summary.clone(),
            error: r.error.clone(),
            requested_at: r.requested_at,
            finished_at: r.finished_at,
        }
    }
}

/// Previews of the environment, open ones first.
#[utoipa::path(get, path = "/api/v1/environments/{env}/previews", tag = PREVIEWS, params(EnvPath, PreviewListQuery),
    responses((status = 200, description = "The previews", body = Vec<PreviewSummary>)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<PreviewListQuery>,
) -> ApiResult<Json<Vec<PreviewSummary>>> {
    let env = environment(&state, &caller, &key).await?;
    let filter = match q.state.as_deref() {
        None | Some("all") => None,
        Some(s @ ("open" | "closed")) => Some(s),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "state '{other}': open, closed or all"
            )));
        }
    };
    let rows = previews::list(
        &state.pool,
        env.id,
        filter,
        q.limit.unwrap_or(50).clamp(1, 1000),
    )
    .await?;
    let ids: Vec<uuid::Uuid> = rows.iter().map(|p| p.id).collect();
    let mut runs = previews::newest_runs(&state.pool, &ids).await?;
    Ok(Json(
        rows.into_iter()
            .map(|p| PreviewSummary {
                run: runs.remove(&p.id).as_ref().map(RunSummary::from),
                preview: p,
            })
            .collect(),
    ))
}

#[derive(Deserialize, IntoParams)]
pub struct PreviewPath {
    /// The environment.
    pub env: String,
    /// The preview's id, or `#N` / `N` for pull request N.
    pub id: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Another run than the newest.
    pub run: Option<uuid::Uuid>,
}

/// A preview: its runs (newest first), and the report and changes of the newest run (or the
/// one asked for).
#[derive(Serialize, Deserialize, ToSchema)]
pub struct PreviewReport {
    pub preview: Preview,
    pub runs: Vec<RunSummary>,
    pub run: Option<Run>,
    pub changes: Vec<PreviewChange>,
}

/// One preview with its newest run's report and changes.
#[utoipa::path(get, path = "/api/v1/environments/{env}/previews/{id}", tag = PREVIEWS, params(PreviewPath, RunQuery),
    responses((status = 200, description = "The preview", body = PreviewReport),
        (status = 404, description = "No such preview")))]
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
    Query(q): Query<RunQuery>,
) -> ApiResult<Json<PreviewReport>> {
    let env = environment(&state, &caller, &key).await?;
    let preview = match id.trim_start_matches('#').parse::<i32>() {
        Ok(n) => previews::by_number(&state.pool, env.id, n)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("no preview of pull request {n}")))?,
        Err(_) => previews::get(&state.pool, env.id, parse_uuid("preview", &id)?).await?,
    };
    let runs = previews::runs(&state.pool, preview.id, 100).await?;
    let run = match q.run {
        Some(r) => {
            let run = previews::get_run(&state.pool, env.id, r).await?;
            if run.preview_id != preview.id {
                return Err(ApiError::not_found(format!(
                    "run {r} is not of this preview"
                )));
            }
            Some(run)
        }
        None => runs.first().cloned(),
    };
    let changes = match &run {
        Some(r) => previews::changes(&state.pool, r.id, MAX_CHANGES).await?,
        None => Vec::new(),
    };
    Ok(Json(PreviewReport {
        runs: runs.iter().map(RunSummary::from).collect(),
        preview,
        run,
        changes,
    }))
}

/// What to preview by hand.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRunBody {
    /// `refs/pull/N/head`, a branch `refs/heads/NAME`, or a full commit id.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The pull request it is (its status and comment are posted then).
    #[serde(default)]
    pub number: Option<i32>,
}

/// Preview a ref by hand (admins and compilers): merged onto the environment's branch,
/// compiled without secret values, diffed against the active version. Never a version.
#[utoipa::path(post, path = "/api/v1/environments/{env}/previews", tag = PREVIEWS, params(EnvPath),
    request_body = PreviewRunBody,
    responses((status = 202, description = "Queued (or the newest run is of this commit already)", body = PreviewQueued),
        (status = 404, description = "The ref is not in the repository")))]
pub async fn run(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(body): ApiJson<PreviewRunBody>,
) -> ApiResult<(StatusCode, Json<PreviewQueued>)> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Upload, Some(env.id))?;
    let sources = state.sources.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_git",
            "this server does not follow git repositories",
        )
    })?;
    let r = &body.reference;
    let plausible = r.len() <= 255
        && !r.contains("..")
        && r.bytes().all(|b| b.is_ascii_graphic())
        && (r.starts_with("refs/pull/") || r.starts_with("refs/heads/") || r.len() == 40);
    if !plausible {
        return Err(ApiError::bad_request(format!(
            "'{r}' is neither refs/pull/N/head, refs/heads/BRANCH nor a full commit id"
        )));
    }
    if body.number.is_some_and(|n| n <= 0) {
        return Err(ApiError::bad_request("a pull request number is positive"));
    }
    let q = sources
        .preview(env.id, r, body.number)
        .await
        .map_err(|e| match e {
            crate::sources::SourceError::Git(crate::sources::git::GitError::NotFound(m)) => {
                ApiError::not_found(m)
            }
            crate::sources::SourceError::NoSource => {
                ApiError::conflict("this environment follows no git repository")
            }
            other => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                other.to_string(),
            ),
        })?;
    audit::record(
        &state.pool,
        &caller.name,
        Some(env.id),
        "preview.run",
        r,
        json!({"status": q.status, "preview": q.preview, "run": q.run}),
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(q)))
}
