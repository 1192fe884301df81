//! Git sources of environments: set/show/remove the source, trigger a compile (optionally of a
//! named commit), receive webhooks, list compile reports, and the per-commit timeline.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiJson, OptionalJson, environment, parse_uuid};
use super::openapi::{CommitPath, EnvIdPath, EnvPath, SOURCES};
use super::{AppState, Event, owner};
use crate::model::settings::SourceKind;
use crate::sources::compile::{self, SourceLine};
use crate::sources::{GitSources, SourceError, Triggered, webhook};
use crate::store::sources::{CommitEvent, CompileRow, SourceSpec, SourceView};
use crate::store::{self, audit};

impl From<SourceError> for ApiError {
    fn from(e: SourceError) -> ApiError {
        match e {
            SourceError::Store(s) => s.into(),
            SourceError::NoSource => ApiError::not_found(e.to_string()),
            SourceError::NotOnBranch { .. } | SourceError::NoBranch(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e.to_string())
            }
            SourceError::Git(g) => ApiError::new(StatusCode::BAD_GATEWAY, g.kind(), g.to_string()),
            SourceError::Unavailable => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            ),
        }
    }
}

fn sources(state: &AppState) -> ApiResult<&GitSources> {
    state.sources.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "no_git",
            "this server does not follow git repositories (it runs without a scheduler)",
        )
    })
}

/// Where compile and deploy statuses of commits are reported.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusSpec {
    /// github | gitea
    pub kind: String,
    /// API base (github default https://api.github.com; gitea: the server's URL)
    #[serde(default)]
    pub api_url: Option<String>,
    /// owner/name on the git host
    pub repo: String,
    pub token: String,
}

/// The git repository an environment follows. Secrets are write-only: answers say only
/// whether one is set.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceBody {
    /// file://, https://, http://, ssh:// or an absolute path
    #[schema(pattern = "^(file://|https?://|ssh://|/)")]
    pub url: String,
    /// default main
    #[serde(default)]
    pub branch: Option<String>,
    /// the model's directory inside the repository (default: its root)
    #[serde(default)]
    pub path: Option<String>,
    /// HTTPS access token
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub ssh_key: Option<String>,
    /// needed with `ssh_key`
    #[serde(default)]
    pub known_hosts: Option<String>,
    #[serde(default)]
    pub webhook_secret: Option<String>,
    /// seconds between fetches (default 60; 0: no polling)
    #[serde(default)]
    pub poll_interval: Option<i32>,
    /// seconds (default 600)
    #[serde(default)]
    pub compile_timeout: Option<i32>,
    /// watch a repository on this machine for pushes (default true)
    #[serde(default)]
    pub watch: Option<bool>,
    #[serde(default)]
    pub status: Option<StatusSpec>,
    #[serde(default)]
    pub notify_url: Option<String>,
    #[serde(default)]
    pub notify_secret: Option<String>,
}

fn validate(mut b: SourceBody, allow_local: bool) -> ApiResult<SourceSpec> {
    let (url, secret) = crate::model::urls::split_credentials(b.url.trim());
    if let Some(secret) = secret {
        if url.starts_with("ssh://") {
            return Err(ApiError::bad_request(
                "an ssh:// URL with a password is not supported: give an SSH key (ssh_key, known_hosts)",
            ));
        }
        // an explicit token wins over one in the URL
        b.token = b.token.filter(|t| !t.is_empty()).or(Some(secret));
    }
    let known_scheme = ["file://", "https://", "http://", "ssh://"]
        .iter()
        .any(|s| url.starts_with(s))
        || url.starts_with('/');
    if !known_scheme {
        return Err(ApiError::bad_request(format!(
            "'{url}' is not a repository URL this server follows (file://, https://, http://, ssh://, or an absolute path)"
        )));
    }
    if !allow_local && (url.starts_with("file://") || url.starts_with('/')) {
        return Err(ApiError::bad_request(format!(
            "'{url}' is a repository on the server's own disk: this server does not follow local repositories (its operator can allow them with --allow-local-git-sources)"
        )));
    }
    let branch = b.branch.unwrap_or_else(|| "main".into()).trim().to_string();
    if branch.is_empty()
        || branch.contains("..")
        || branch.starts_with('-')
        || branch.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ApiError::bad_request(format!(
            "'{branch}' is not a branch name"
        )));
    }
    let path = b
        .path
        .unwrap_or_default()
        .trim()
        .trim_matches('/')
        .to_string();
    if path.split('/').any(|p| p == "..") {
        return Err(ApiError::bad_request(
            "path must stay inside the repository",
        ));
    }
    if b.ssh_key.is_some() && b.known_hosts.is_none() {
        return Err(ApiError::bad_request(
            "an SSH key needs known_hosts: the server never trusts a host key it was not given",
        ));
    }
    let poll_interval = b.poll_interval.unwrap_or(60);
    if poll_interval < 0 {
        return Err(ApiError::bad_request(
            "poll_interval is seconds (0 disables polling)",
        ));
    }
    let compile_timeout = b.compile_timeout.unwrap_or(600);
    if compile_timeout < 1 {
        return Err(ApiError::bad_request(
            "compile_timeout must be at least 1 second",
        ));
    }
    let (status_kind, status_api_url, status_repo, status_token) = match b.status {
        None => ("none".to_string(), None, None, None),
        Some(s) => {
            if s.kind != "github" && s.kind != "gitea" {
                return Err(ApiError::bad_request("status.kind is github or gitea"));
            }
            if s.kind == "gitea" && s.api_url.is_none() {
                return Err(ApiError::bad_request(
                    "a gitea status needs api_url (the Gitea server's URL)",
                ));
            }
            if !s.repo.contains('/') {
                return Err(ApiError::bad_request("status.repo is owner/name"));
            }
            (s.kind, s.api_url, Some(s.repo), Some(s.token))
        }
    };
    let empty_none = |s: Option<String>| s.filter(|x| !x.is_empty());
    Ok(SourceSpec {
        url,
        branch,
        path,
        token: empty_none(b.token),
        ssh_key: empty_none(b.ssh_key),
        known_hosts: empty_none(b.known_hosts),
        webhook_secret: empty_none(b.webhook_secret),
        poll_interval,
        watch: b.watch.unwrap_or(true),
        compile_timeout,
        status_kind,
        status_api_url,
        status_repo,
        status_token,
        notify_url: empty_none(b.notify_url),
        notify_secret: empty_none(b.notify_secret),
    })
}

/// Attach (or replace) the git source: the environment then takes versions only from it.
/// Attach or replace the git source (admin): the environment then takes versions only from it.
/// Options left out take their defaults (PATCH changes only what is given).
#[utoipa::path(put, path = "/api/v1/environments/{env}/source", tag = SOURCES, params(EnvPath), request_body = SourceBody,
    responses((status = 200, description = "The source", body = SourceView)))]
pub async fn set_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(body): ApiJson<SourceBody>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    store_source(&state, &caller, env, body).await
}

/// The stored source as a body, secrets included (they stay on the server).
fn body_of(row: &store::sources::SourceRow) -> serde_json::Value {
    let mut b = json!({
        "url": row.url, "branch": row.branch, "path": row.path, "token": row.token,
        "ssh_key": row.ssh_key, "known_hosts": row.known_hosts,
        "webhook_secret": row.webhook_secret, "poll_interval": row.poll_interval,
        "compile_timeout": row.compile_timeout, "watch": row.watch,
        "notify_url": row.notify_url, "notify_secret": row.notify_secret,
    });
    if row.status_kind != "none" {
        b["status"] = json!({
            "kind": row.status_kind, "api_url": row.status_api_url,
            "repo": row.status_repo, "token": row.status_token,
        });
    }
    b
}

/// Change only the options given (attach the source if there is none): a key set to null
/// or "" clears an optional one.
#[utoipa::path(patch, operation_id = "patch_source", path = "/api/v1/environments/{env}/source", tag = SOURCES, params(EnvPath),
    request_body(content = Object, description = "Any keys of the source body; the others keep their values"),
    responses((status = 200, description = "The source", body = SourceView)))]
pub async fn patch_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(patch): ApiJson<serde_json::Value>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let serde_json::Value::Object(patch) = patch else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    let mut merged = match store::sources::get_source(&state.pool, env.id).await? {
        Some(row) => body_of(&row),
        None => json!({}),
    };
    for (k, v) in patch {
        merged[k.as_str()] = v;
    }
    let body: SourceBody = serde_json::from_value(merged)
        .map_err(|e| ApiError::bad_request(format!("invalid source: {e}")))?;
    store_source(&state, &caller, env, body).await
}

async fn store_source(
    state: &AppState,
    caller: &Caller,
    env: store::environments::Environment,
    body: SourceBody,
) -> ApiResult<Json<serde_json::Value>> {
    sources(state)?;
    let spec = validate(body, state.allow_local_git_sources)?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    store::sources::upsert_source(&mut *tx, env.id, &spec).await?;
    let mut settings = env.settings.clone();
    settings.source = SourceKind::Git;
    store::environments::set_settings(&mut *tx, env.id, &settings).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "source.set",
        &crate::model::urls::public_url(&spec.url),
        json!({"branch": spec.branch, "path": spec.path, "poll_interval": spec.poll_interval}),
    )
    .await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    state.notifier.send(Event::Settings {
        environment: env.id,
    });
    owner::source_restart(state, caller, env.id).await?;
    let row = store::sources::get_source(&state.pool, env.id)
        .await?
        .ok_or_else(|| ApiError::internal("source vanished"))?;
    Ok(Json(json!(row.view())))
}

/// The git source (404 when the environment follows none).
#[utoipa::path(get, path = "/api/v1/environments/{env}/source", tag = SOURCES, params(EnvPath),
    responses((status = 200, description = "The source", body = SourceView)))]
pub async fn get_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    let row = store::sources::get_source(&state.pool, env.id)
        .await?
        .ok_or_else(|| ApiError::not_found("this environment follows no git repository"))?;
    Ok(Json(json!(row.view())))
}

/// Detach the source: the environment takes pushed versions again.
/// Detach the git source (admin): the environment takes uploaded versions again.
#[utoipa::path(delete, path = "/api/v1/environments/{env}/source", tag = SOURCES, params(EnvPath),
    responses((status = 204, description = "Detached")))]
pub async fn delete_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<StatusCode> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    store::sources::delete_source(&mut *tx, env.id).await?;
    let mut settings = env.settings.clone();
    settings.source = SourceKind::Push;
    store::environments::set_settings(&mut *tx, env.id, &settings).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "source.delete",
        &env.name,
        json!({}),
    )
    .await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    if state.sources.is_some() {
        owner::source_stop(&state, &caller, env.id).await?;
    }
    state.notifier.send(Event::Settings {
        environment: env.id,
    });
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CompileTrigger)]
pub struct TriggerBody {
    /// compile this commit (full or abbreviated SHA; it must be on the tracked branch)
    #[serde(default)]
    pub commit: Option<String>,
}

/// Fetch now and compile the branch tip, or the named commit.
/// Fetch now and compile the branch tip, or the named commit (admin or compiler).
#[utoipa::path(post, operation_id = "trigger_compile", path = "/api/v1/environments/{env}/source/trigger", tag = SOURCES, params(EnvPath),
    request_body(content = Option<TriggerBody>, description = "Optional (an empty body compiles the tip)"),
    responses((status = 202, description = "Queued (or compiled already)", body = Triggered)))]
pub async fn trigger(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    OptionalJson(body): OptionalJson<TriggerBody>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Upload, Some(env.id))?;
    sources(&state)?;
    if let Some(c) = &body.commit
        && (c.len() < 4 || c.len() > 64 || !c.chars().all(|x| x.is_ascii_hexdigit()))
    {
        return Err(ApiError::bad_request(format!(
            "'{c}' is not a commit id (4 to 64 hex digits)"
        )));
    }
    let t = owner::source_trigger(&state, &caller, env.id, "api", body.commit.clone()).await?;
    audit::record(
        &state.pool,
        &caller.name,
        Some(env.id),
        "source.trigger",
        &t.commit,
        json!({"status": t.status, "compile": t.compile}),
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(json!(t))))
}

/// What became of a webhook delivery.
#[derive(Serialize, ToSchema)]
pub struct WebhookAnswer {
    /// accepted (a fetch follows), duplicate (this delivery id was seen before) or ignored
    pub status: &'static str,
    /// the delivery id (the sender's, or a digest of the body)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
    /// accepted: github, gitea, forgejo, gogs, gitlab or generic
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<&'static str>,
    /// ignored: the event, when it is not a push
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// ignored: why (a push to another branch)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl WebhookAnswer {
    fn new(status: &'static str) -> WebhookAnswer {
        WebhookAnswer {
            status,
            delivery: None,
            provider: None,
            event: None,
            reason: None,
        }
    }
}

/// A git host (or hooks/post-receive) says the repository changed. No token: the body must
/// be signed with the source's webhook secret. Answers at once; the fetch follows.
/// A webhook from a git host or `hooks/post-receive`. No token: the body must be signed with
/// the source's webhook secret (`X-Hub-Signature-256`, `X-Gitea-Signature`,
/// `X-Forgejo-Signature`, `X-Gogs-Signature`, `X-Steward-Signature: sha256=<hex HMAC-SHA256>`,
/// or `X-Gitlab-Token: <secret>`). Bodies over 1 MiB are refused (413).
#[utoipa::path(post, path = "/api/v1/environments/{env}/source/webhook", tag = SOURCES, security(()),
    params(("env" = uuid::Uuid, Path, description = "The environment's id (webhooks address environments by id only)")),
    request_body(content = Object, description = "The git host's payload, as signed"),
    responses(
        (status = 202, description = "Accepted: a fetch follows", body = WebhookAnswer),
        (status = 200, description = "A duplicate delivery, or an event that is not a push to the tracked branch: nothing to do", body = WebhookAnswer),
        (status = 401, description = "Unsigned, a bad signature, not an environment id, or an environment without a webhook secret (one answer for all)", body = ErrorBody),
    ))]
pub async fn webhook(
    State(state): State<AppState>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<WebhookAnswer>)> {
    let unauthorized = |m: String| ApiError::unauthorized(m);
    let env_id = uuid::Uuid::parse_str(&key)
        .map_err(|_| unauthorized("webhooks address an environment by its id".into()))?;
    let Some(src) = store::sources::get_source(&state.pool, env_id).await? else {
        // the same answer as a bad signature: nothing to learn about which ids exist
        return Err(unauthorized("this environment takes no webhooks".into()));
    };
    if body.len() > webhook::MAX_WEBHOOK_BODY {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "webhook body over 1 MB",
        ));
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let delivery = webhook::verify(header, &body, src.webhook_secret.as_deref())
        .map_err(|e| unauthorized(e.to_string()))?;
    // a replay of a captured webhook under a new delivery id is the same signed body
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&body))
    };
    if !store::sources::record_delivery(&state.pool, env_id, &delivery.id).await?
        || !store::sources::record_body(&state.pool, env_id, &digest).await?
    {
        return Ok((
            StatusCode::OK,
            Json(WebhookAnswer {
                delivery: Some(delivery.id),
                ..WebhookAnswer::new("duplicate")
            }),
        ));
    }
    if webhook::is_pull_request(&delivery) {
        return preview_webhook(&state, &src, delivery, &body).await;
    }
    if !webhook::is_push(&delivery) {
        return Ok((
            StatusCode::OK,
            Json(WebhookAnswer {
                event: delivery.event,
                ..WebhookAnswer::new("ignored")
            }),
        ));
    }
    let hint = webhook::push_hint(&body);
    if let Some(b) = &hint.branch
        && b != &src.branch
    {
        return Ok((
            StatusCode::OK,
            Json(WebhookAnswer {
                reason: Some(format!("push to {b}, not {}", src.branch)),
                ..WebhookAnswer::new("ignored")
            }),
        ));
    }
    sources(&state)?;
    let kind = if delivery.provider == webhook::Provider::Generic {
        "hook"
    } else {
        "webhook"
    };
    // the owner's fetcher takes it (on another replica, the call goes there, with the signed
    // delivery for the owner to check again)
    let signed: Vec<(String, String)> = headers
        .iter()
        .filter(|(k, _)| {
            *k != axum::http::header::AUTHORIZATION && *k != axum::http::header::COOKIE
        })
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let caller = Caller::webhook(env_id, signed, &body);
    owner::source_hint(&state, &caller, env_id, kind).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(WebhookAnswer {
            delivery: Some(delivery.id),
            provider: Some(delivery.provider.as_str()),
            ..WebhookAnswer::new("accepted")
        }),
    ))
}

/// A signed `pull_request` event: a preview in every environment that follows the pull
/// request's base branch of this repository and shares this webhook's secret (the signature
/// vouches for the payload to exactly those), with previews enabled.
async fn preview_webhook(
    state: &AppState,
    src: &store::sources::SourceRow,
    delivery: webhook::Delivery,
    body: &[u8],
) -> ApiResult<(StatusCode, Json<WebhookAnswer>)> {
    let ignored = |reason: String| {
        Ok((
            StatusCode::OK,
            Json(WebhookAnswer {
                delivery: Some(delivery.id.clone()),
                event: delivery.event.clone(),
                reason: Some(reason),
                ..WebhookAnswer::new("ignored")
            }),
        ))
    };
    let hint = match webhook::pull_hint(body) {
        Ok(h) => h,
        Err(why) => return ignored(why),
    };
    let repo = |s: &store::sources::SourceRow| {
        s.status_repo
            .as_deref()
            .map(|r| r.trim_matches('/').to_lowercase())
            .unwrap_or_else(|| crate::model::urls::repo_name(&s.url))
    };
    if !hint.base_repo.eq_ignore_ascii_case(&repo(src)) {
        return ignored(format!(
            "a pull request of {}, not of {}",
            hint.base_repo,
            repo(src)
        ));
    }
    let sources = sources(state)?;
    let key = crate::model::urls::repo_key(&src.url);
    let mut targets: Vec<uuid::Uuid> = store::sources::list_sources(&state.pool)
        .await?
        .into_iter()
        .filter(|s| {
            s.environment_id == src.environment_id
                || (s.webhook_secret.is_some()
                    && s.webhook_secret == src.webhook_secret
                    && crate::model::urls::repo_key(&s.url) == key)
        })
        .map(|s| s.environment_id)
        .collect();
    targets.sort();
    let mut reasons = Vec::new();
    let mut taken = 0;
    for env in targets {
        match sources.preview_hint(env, &hint, "webhook").await {
            Ok(q) if q.status == "ignored" => {
                if env == src.environment_id {
                    reasons.extend(q.reason);
                }
            }
            Ok(_) => taken += 1,
            Err(e) => {
                tracing::warn!(environment = %env, error = %e, "a pull-request preview could not be queued");
                if env == src.environment_id {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        format!("the preview could not be queued: {e}"),
                    ));
                }
            }
        }
    }
    if taken == 0 {
        return ignored(reasons.join("; "));
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(WebhookAnswer {
            delivery: Some(delivery.id),
            provider: Some(delivery.provider.as_str()),
            event: delivery.event,
            ..WebhookAnswer::new("accepted")
        }),
    ))
}

/// Check a webhook forwarded by another replica against `env`'s source, as [`webhook`] did.
pub async fn verify_signed(
    state: &AppState,
    env: uuid::Uuid,
    headers: &[(String, String)],
    body: &[u8],
) -> ApiResult<()> {
    let unauthorized = || ApiError::unauthorized("a forwarded webhook that is not signed");
    let src = store::sources::get_source(&state.pool, env)
        .await?
        .ok_or_else(unauthorized)?;
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    webhook::verify(header, body, src.webhook_secret.as_deref()).map_err(|_| unauthorized())?;
    Ok(())
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// at most this many, newest first (default 50, at most 1000)
    #[serde(default)]
    pub limit: Option<i64>,
}

/// A compile in a list: a compile report without its bulky output.
#[derive(Serialize, ToSchema)]
pub struct CompileSummary {
    pub id: uuid::Uuid,
    pub commit: String,
    pub branch: String,
    pub trigger: String,
    pub status: String,
    pub superseded_by: Option<uuid::Uuid>,
    pub requested_at: chrono::DateTime<chrono::Utc>,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    pub version: Option<i32>,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
}

/// Compile reports, newest first, without their output.
#[utoipa::path(get, path = "/api/v1/environments/{env}/compiles", tag = SOURCES, params(EnvPath, ListQuery),
    responses((status = 200, description = "The compiles", body = Vec<CompileSummary>)))]
pub async fn list_compiles(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<CompileSummary>>> {
    let env = environment(&state, &caller, &key).await?;
    let rows =
        store::sources::list_compiles(&state.pool, env.id, q.limit.unwrap_or(50).clamp(1, 1000))
            .await?;
    // the list leaves the bulky output out
    Ok(Json(
        rows.into_iter()
            .map(|r| CompileSummary {
                id: r.id,
                commit: r.commit,
                branch: r.branch,
                trigger: r.trigger,
                status: r.status,
                superseded_by: r.superseded_by,
                requested_at: r.requested_at,
                started_at: r.started_at,
                finished_at: r.finished_at,
                version: r.version,
                error: r.error,
                exit_code: r.exit_code,
            })
            .collect(),
    ))
}

/// A compile report, and the lines of the model its diagnostics point at.
#[derive(Serialize, ToSchema)]
pub struct CompileReport {
    #[serde(flatten)]
    pub report: CompileRow,
    /// The lines the diagnostics point at, as the commit has them (read from the server's
    /// mirror of the repository: lines of files outside the project, such as built-in
    /// modules, and of commits the mirror no longer has, are missing).
    pub source_lines: Vec<SourceLine>,
}

/// A compile report with its output and diagnostics, and the source lines they point at.
#[utoipa::path(get, path = "/api/v1/environments/{env}/compiles/{id}", tag = SOURCES, params(EnvIdPath),
    responses((status = 200, description = "The compile", body = CompileReport)))]
pub async fn get_compile(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, id)): Path<(String, String)>,
) -> ApiResult<Json<CompileReport>> {
    let env = environment(&state, &caller, &key).await?;
    let id = parse_uuid("compile", &id)?;
    let report = store::sources::get_compile(&state.pool, env.id, id).await?;
    let source = store::sources::get_source(&state.pool, env.id).await?;
    let source_lines = match (&state.sources, source) {
        (Some(g), Some(src)) if report.diagnostics.as_array().is_some_and(|d| !d.is_empty()) => {
            let (mirror, commit, diagnostics) = (
                g.mirror_of(env.id, &src.url),
                report.commit.clone(),
                report.diagnostics.clone(),
            );
            tokio::task::spawn_blocking(move || {
                compile::source_lines(&mirror, &commit, &src.path, &diagnostics)
            })
            .await
            .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    Ok(Json(CompileReport {
        report,
        source_lines,
    }))
}

/// What happened to a commit: received → compiled → version → released → deployed.
/// What happened to a commit, oldest first.
#[derive(Serialize, ToSchema)]
pub struct Timeline {
    /// The full commit id.
    pub commit: String,
    /// The latest event.
    pub state: Option<String>,
    pub events: Vec<CommitEvent>,
}

/// What happened to a commit: received, compiled, version, released, deployed.
#[utoipa::path(get, path = "/api/v1/environments/{env}/commits/{commit}", tag = SOURCES, params(CommitPath),
    responses((status = 200, description = "The timeline", body = Timeline)))]
pub async fn timeline(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, commit)): Path<(String, String)>,
) -> ApiResult<Json<Timeline>> {
    let env = environment(&state, &caller, &key).await?;
    if commit.len() < 4 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(format!(
            "'{commit}' is not a commit id (at least 4 hex digits)"
        )));
    }
    let events = store::sources::events(&state.pool, env.id, &commit.to_lowercase()).await?;
    let commits: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e.commit.as_str()).collect();
    if commits.len() > 1 {
        return Err(ApiError::conflict(format!(
            "'{commit}' is ambiguous: {} commits start with it",
            commits.len()
        )));
    }
    let Some(full) = commits.into_iter().next() else {
        return Err(ApiError::not_found(format!(
            "nothing is known of commit {commit} in this environment"
        )));
    };
    let full = full.to_string();
    let last = events.last().map(|e| e.event.clone());
    Ok(Json(Timeline {
        commit: full,
        state: last,
        events,
    }))
}
