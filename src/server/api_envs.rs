//! Projects, environments and environment settings.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment};
use super::openapi::{ENVIRONMENTS, EnvPath, ProjectPath};
use super::{AppState, Event};
use crate::model::settings::EnvSettings;
use crate::store::environments::{Environment, Project};
use crate::store::{self, audit};

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NameBody {
    /// 1-100 letters, digits, '-', '_' or '.', not starting with '-' or '.'
    #[schema(pattern = "^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")]
    pub name: String,
}

async fn project_by_key(state: &AppState, key: &str) -> ApiResult<store::environments::Project> {
    Ok(match uuid::Uuid::parse_str(key) {
        Ok(id) => store::environments::get_project(&state.pool, id).await?,
        Err(_) => store::environments::find_project(&state.pool, key).await?,
    })
}

/// The projects (a token of an environment sees its own project only).
#[utoipa::path(get, path = "/api/v1/projects", tag = ENVIRONMENTS,
    responses((status = 200, description = "The projects", body = Vec<Project>)))]
pub async fn list_projects(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<serde_json::Value>> {
    let mut projects = store::environments::list_projects(&state.pool).await?;
    if let Some(env) = caller.environment {
        let e = store::environments::get_environment(&state.pool, env).await?;
        projects.retain(|p| p.id == e.project_id);
    }
    Ok(Json(json!(projects)))
}

/// Create a project (global admin).
#[utoipa::path(post, path = "/api/v1/projects", tag = ENVIRONMENTS, request_body = NameBody,
    responses((status = 201, description = "Created", body = Project)))]
pub async fn create_project(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<NameBody>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    caller.require(Perm::Global, None)?;
    let p = store::environments::create_project(&state.pool, &body.name).await?;
    audit::record(
        &state.pool,
        &caller.name,
        None,
        "project.create",
        &p.name,
        json!({"id": p.id}),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(json!(p))))
}

/// A project with the environments the token sees.
#[derive(Serialize, ToSchema)]
pub struct ProjectDetail {
    pub id: uuid::Uuid,
    pub name: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub environments: Vec<Environment>,
}

/// A project and its environments.
#[utoipa::path(get, path = "/api/v1/projects/{project}", tag = ENVIRONMENTS, params(ProjectPath),
    responses((status = 200, description = "The project", body = ProjectDetail)))]
pub async fn get_project(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<ProjectDetail>> {
    let p = project_by_key(&state, &key).await?;
    let mut envs = store::environments::list_environments(&state.pool, Some(p.id)).await?;
    envs.retain(|e| caller.sees(e.id));
    if caller.environment.is_some() && envs.is_empty() {
        return Err(ApiError::forbidden("this token belongs to another project"));
    }
    Ok(Json(ProjectDetail {
        id: p.id,
        name: p.name,
        created_at: p.created_at,
        environments: envs,
    }))
}

/// Rename a project (global admin).
#[utoipa::path(patch, path = "/api/v1/projects/{project}", tag = ENVIRONMENTS, params(ProjectPath), request_body = NameBody,
    responses((status = 200, description = "Renamed", body = Project)))]
pub async fn rename_project(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(body): ApiJson<NameBody>,
) -> ApiResult<Json<serde_json::Value>> {
    caller.require(Perm::Global, None)?;
    let p = project_by_key(&state, &key).await?;
    let renamed = store::environments::rename_project(&state.pool, p.id, &body.name).await?;
    audit::record(
        &state.pool,
        &caller.name,
        None,
        "project.rename",
        &renamed.name,
        json!({"from": p.name}),
    )
    .await?;
    Ok(Json(json!(renamed)))
}

/// Delete a project with its environments (global admin).
#[utoipa::path(delete, path = "/api/v1/projects/{project}", tag = ENVIRONMENTS, params(ProjectPath),
    responses((status = 204, description = "Deleted")))]
pub async fn delete_project(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Perm::Global, None)?;
    let p = project_by_key(&state, &key).await?;
    let envs = store::environments::list_environments(&state.pool, Some(p.id)).await?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    store::environments::delete_project(&mut tx, p.id).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        None,
        "project.delete",
        &p.name,
        json!({"id": p.id}),
    )
    .await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    for e in envs {
        state.notifier.send(Event::Deleted { environment: e.id });
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The environments the token sees.
#[utoipa::path(get, path = "/api/v1/environments", tag = ENVIRONMENTS,
    responses((status = 200, description = "The environments", body = Vec<Environment>)))]
pub async fn list_environments(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<serde_json::Value>> {
    let mut envs = store::environments::list_environments(&state.pool, None).await?;
    envs.retain(|e| caller.sees(e.id));
    Ok(Json(json!(envs)))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEnvironment {
    /// project name or id
    #[schema(pattern = "^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")]
    pub project: String,
    /// 1-100 letters, digits, '-', '_' or '.', not starting with '-' or '.'
    #[schema(pattern = "^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")]
    pub name: String,
    /// settings that differ from the defaults
    #[serde(default)]
    #[schema(value_type = Option<SettingsPatch>)]
    pub settings: Option<serde_json::Value>,
    /// create the project when it does not exist
    #[serde(default)]
    pub create_project: bool,
}

/// A change of settings: only the keys given change (see `EnvSettings` for what they mean);
/// the result is validated as a whole. Only for the reference: the handlers patch JSON.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct SettingsPatch {
    #[serde(default)]
    auto_release: bool,
    /// seconds (0 disables), or a 5-field cron schedule (UTC)
    #[schema(value_type = Interval)]
    #[serde(default)]
    deploy_interval: serde_json::Value,
    /// seconds (0 disables), or a 5-field cron schedule (UTC)
    #[schema(value_type = Interval)]
    #[serde(default)]
    repair_interval: serde_json::Value,
    #[serde(default)]
    retry_backoff: crate::model::settings::RetryBackoff,
    #[serde(default)]
    protected: bool,
    #[schema(value_type = crate::model::settings::SourceKind)]
    #[serde(default)]
    source: serde_json::Value,
    #[schema(minimum = 1, maximum = 256)]
    #[serde(default)]
    agent_parallelism: u32,
    #[schema(minimum = 1)]
    #[serde(default)]
    handler_timeout: u64,
    // the whole u32 range (utoipa would say int32, which ends at 2^31 - 1)
    #[schema(value_type = i64, minimum = 1, maximum = 4294967295_i64)]
    #[serde(default)]
    version_retention: u32,
    #[serde(default)]
    delete_removed_resources: bool,
    /// only the keys given change
    #[serde(default)]
    retention: crate::model::settings::Retention,
    /// seconds a fact stays valid
    #[schema(minimum = 1)]
    #[serde(default)]
    fact_expire: u64,
    /// seconds after which a fact is renewed; null: a third of fact_expire
    #[schema(minimum = 1)]
    #[serde(default)]
    fact_renew: Option<u64>,
    /// seconds between two requests for the missing facts of one resource
    #[schema(minimum = 1)]
    #[serde(default)]
    fact_resource_block: u64,
    /// seconds between a value resolving an unknown and the recompile
    #[schema(minimum = 0, maximum = 3600)]
    #[serde(default)]
    recompile_backoff: f64,
}

/// An interval in a settings change: seconds, or a cron schedule.
pub struct Interval;

impl utoipa::PartialSchema for Interval {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Integer))
            .item(ObjectBuilder::new().schema_type(Type::String))
            .description(Some(
                "seconds (0 or less disables), or a 5-field cron schedule (UTC)",
            ))
            .into()
    }
}

impl ToSchema for Interval {}

/// Create an environment (global admin), and its project with `create_project`.
#[utoipa::path(post, path = "/api/v1/environments", tag = ENVIRONMENTS, request_body = CreateEnvironment,
    responses((status = 201, description = "Created", body = Environment)))]
pub async fn create_environment(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateEnvironment>,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    caller.require(Perm::Global, None)?;
    let settings = match &body.settings {
        Some(p) => EnvSettings::default()
            .patched(p)
            .map_err(ApiError::bad_request)?,
        None => EnvSettings::default(),
    };
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    let project = match uuid::Uuid::parse_str(&body.project) {
        Ok(id) => store::environments::get_project(&mut *tx, id).await?,
        Err(_) => match store::environments::find_project(&mut *tx, &body.project).await {
            Ok(p) => p,
            Err(store::StoreError::NotFound(_)) if body.create_project => {
                let p = store::environments::create_project(&mut *tx, &body.project).await?;
                audit::record(
                    &mut *tx,
                    &caller.name,
                    None,
                    "project.create",
                    &p.name,
                    json!({"id": p.id}),
                )
                .await?;
                p
            }
            Err(e) => return Err(e.into()),
        },
    };
    let id = store::environments::create_environment(&mut *tx, project.id, &body.name, &settings)
        .await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(id),
        "environment.create",
        &format!("{}/{}", project.name, body.name),
        json!({"settings": settings}),
    )
    .await?;
    let env = store::environments::get_environment(&mut *tx, id).await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    state.notifier.send(Event::Created { environment: id });
    Ok((StatusCode::CREATED, Json(json!(env))))
}

/// An environment with its active version.
#[derive(Serialize, ToSchema)]
pub struct EnvironmentDetail {
    #[serde(flatten)]
    pub environment: Environment,
    /// The released version being deployed; null before the first release.
    pub active_version: Option<i32>,
}

/// An environment.
#[utoipa::path(get, path = "/api/v1/environments/{env}", tag = ENVIRONMENTS, params(EnvPath),
    responses((status = 200, description = "The environment", body = EnvironmentDetail)))]
pub async fn get_environment(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<EnvironmentDetail>> {
    let env = environment(&state, &caller, &key).await?;
    let active = store::versions::active(&state.pool, env.id).await?;
    Ok(Json(EnvironmentDetail {
        environment: env,
        active_version: active,
    }))
}

/// Rename an environment (admin).
#[utoipa::path(patch, path = "/api/v1/environments/{env}", tag = ENVIRONMENTS, params(EnvPath), request_body = NameBody,
    responses((status = 200, description = "Renamed", body = Environment)))]
pub async fn rename_environment(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(body): ApiJson<NameBody>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    store::environments::rename_environment(&state.pool, env.id, &body.name).await?;
    audit::record(
        &state.pool,
        &caller.name,
        Some(env.id),
        "environment.rename",
        &body.name,
        json!({"from": env.name}),
    )
    .await?;
    Ok(Json(json!(
        store::environments::get_environment(&state.pool, env.id).await?
    )))
}

/// Delete an environment (global admin; refused while its settings say `protected`).
#[utoipa::path(delete, path = "/api/v1/environments/{env}", tag = ENVIRONMENTS, params(EnvPath),
    responses((status = 204, description = "Deleted")))]
pub async fn delete_environment(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<StatusCode> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Global, None)?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    store::environments::delete_environment(&mut tx, env.id).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        None,
        "environment.delete",
        &format!("{}/{}", env.project, env.name),
        json!({"id": env.id}),
    )
    .await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    state.notifier.send(Event::Deleted {
        environment: env.id,
    });
    Ok(StatusCode::NO_CONTENT)
}

/// An environment's settings.
#[utoipa::path(get, path = "/api/v1/environments/{env}/settings", tag = ENVIRONMENTS, params(EnvPath),
    responses((status = 200, description = "The settings", body = EnvSettings)))]
pub async fn get_settings(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    Ok(Json(json!(env.settings)))
}

/// Change settings (admin): only the given keys change; the result is validated as a whole.
#[utoipa::path(patch, path = "/api/v1/environments/{env}/settings", tag = ENVIRONMENTS, params(EnvPath),
    request_body = SettingsPatch,
    responses((status = 200, description = "The new settings", body = EnvSettings)))]
pub async fn update_settings(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(patch): ApiJson<serde_json::Value>,
) -> ApiResult<Json<serde_json::Value>> {
    let env = environment(&state, &caller, &key).await?;
    caller.require(Perm::Manage, Some(env.id))?;
    let mut tx = state.pool.begin().await.map_err(store::StoreError::from)?;
    let locked = store::environments::lock(&mut tx, env.id).await?;
    let new = locked
        .settings
        .patched(&patch)
        .map_err(ApiError::bad_request)?;
    if !caller.is_global() {
        ssh_choices_of_a_scoped_admin(&patch, &new)?;
    }
    store::environments::set_settings(&mut *tx, env.id, &new).await?;
    audit::record(
        &mut *tx,
        &caller.name,
        Some(env.id),
        "environment.settings",
        &env.name,
        json!({"changed": patch}),
    )
    .await?;
    tx.commit().await.map_err(store::StoreError::from)?;
    state.notifier.send(Event::Settings {
        environment: env.id,
    });
    Ok(Json(json!(new)))
}

/// Which SSH targets and keys an environment uses is a server administrator's choice (they
/// pick which machines the server's keys log in to): an environment's own admin may not
/// change `ssh_allowed`, nor set an `ssh.identity` or an `ssh://` agent outside it.
fn ssh_choices_of_a_scoped_admin(patch: &serde_json::Value, new: &EnvSettings) -> ApiResult<()> {
    if patch.get("ssh_allowed").is_some() {
        return Err(ApiError::forbidden(
            "ssh_allowed (the SSH targets and keys of the environment) can only be changed with a global admin token",
        ));
    }
    let allowed = &new.ssh_allowed;
    // null (the default keys) included: that needs 'default' in the list
    if patch.pointer("/ssh/identity").is_some()
        && !allowed.allows_identity(new.ssh.identity.as_deref())
    {
        return Err(ApiError::forbidden(format!(
            "ssh.identity {} is not in ssh_allowed.identities, which only a global admin can change",
            new.ssh.identity.as_deref().unwrap_or("(the default keys)")
        )));
    }
    if let Some(serde_json::Value::Object(map)) = patch.get("agent_map") {
        for (agent, uri) in map {
            let Some(uri) = uri.as_str() else { continue };
            if let Ok(crate::model::placement::Placement::Ssh(uri)) =
                crate::model::placement::Placement::parse(uri)
            {
                let ok = crate::scheduler::ssh::SshTarget::parse(&uri)
                    .is_ok_and(|t| allowed.allows_target(t.user.as_deref(), &t.host, t.port));
                if !ok {
                    return Err(ApiError::forbidden(format!(
                        "agent_map: agent '{agent}': {uri} is not in ssh_allowed.targets, which only a global admin can change"
                    )));
                }
            }
        }
    }
    Ok(())
}
