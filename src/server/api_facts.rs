//! Parameters and facts of an environment (issue 29): list, read, write, delete.
//!
//! Who may do what: every role that reads reads them; admins and compilers write and delete
//! (parameters and facts); an agent token writes facts only, of resources whose agent it
//! hosts (any resource of its environment when it names no agents), and reads nothing. A
//! write is one transaction ([`store::facts::set_many`]) with its audit record; after the
//! commit, what it changed and which versions' unknowns it resolved go out as
//! [`Event::Facts`], which the git sources turn into a recompile. Inmanta's own routes for
//! the same (`server/api_inmanta.rs`) go through [`write`] too.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::auth::{Caller, Perm};
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, environment};
use super::openapi::{EnvPath, FACTS};
use super::{AppState, Event};
use crate::model::{ResourceId, Role};
use crate::store::environments::Environment;
use crate::store::facts::{
    self, NewParam, Param, ParamKey, ParameterItem, SetOutcome, WriteResult,
};
use crate::store::{self, StoreError, audit};

/// May this caller read all the parameters and facts of `env`? Agent tokens may not (they
/// read what [`authorize_read_of`] allows them).
pub fn authorize_read(caller: &Caller, env: uuid::Uuid) -> ApiResult<()> {
    authorize_read_of(caller, env, None)
}

/// May this caller read `what` of `env`: everything (`None`), the parameters (`Some("")`)
/// or one resource's facts? Every role that reads may; an agent token (what its handlers'
/// `get_client()` calls go through) reads the environment's parameters and the facts of its
/// agents' resources.
pub fn authorize_read_of(caller: &Caller, env: uuid::Uuid, what: Option<&str>) -> ApiResult<()> {
    if caller.role != Role::Agent {
        return caller.require(Perm::Read, Some(env));
    }
    caller.require(Perm::Report, Some(env))?;
    match what {
        None => Err(ApiError::forbidden(
            "an agent token reads the environment's parameters and the facts of its agents' resources, one resource at a time; not all of them",
        )),
        Some("") => Ok(()),
        Some(rid) => agent_hosts(caller, rid, "read the facts of"),
    }
}

/// An agent token touches only the facts of resources whose agent it hosts (any resource of
/// its environment when it names no agents).
fn agent_hosts(caller: &Caller, resource_id: &str, doing: &str) -> ApiResult<()> {
    let rid = facts::normalize_resource_id(resource_id)?;
    let agent = ResourceId(rid.clone()).agent().to_string();
    if let Some(mine) = &caller.agents
        && !mine.contains(&agent)
    {
        return Err(ApiError::forbidden(format!(
            "this agent token can not {doing} {rid}: it hosts {}, not agent '{agent}'",
            if mine.is_empty() {
                "no agent".to_string()
            } else {
                mine.join(", ")
            }
        )));
    }
    Ok(())
}

/// May this caller write (or delete) `p` in `env`? See the module doc.
pub fn authorize_write(caller: &Caller, env: uuid::Uuid, p: &NewParam) -> ApiResult<()> {
    if caller.role != Role::Agent {
        caller.require(Perm::Read, Some(env))?;
        if !matches!(caller.role, Role::Admin | Role::Compiler) {
            return Err(ApiError::forbidden(format!(
                "a {} token may not write parameters or facts (admins and compilers write them, agent tokens the facts of their agents' resources)",
                caller.role.as_str()
            )));
        }
        return Ok(());
    }
    caller.require(Perm::Report, Some(env))?;
    if p.resource_id.is_empty() {
        return Err(ApiError::forbidden(format!(
            "an agent token writes facts only (with a resource_id), not the parameter '{}'",
            p.name
        )));
    }
    agent_hosts(
        caller,
        &p.resource_id,
        &format!("write fact '{}' of", p.name),
    )
}

/// At most this many names in an audit record of a write.
const AUDITED_NAMES: usize = 20;

/// Write values for `caller` (checked here), record the write in the audit log, and tell the
/// recompile trigger what changed. A renewal by an agent that changed nothing and resolved
/// nothing is not audited (agents renew their facts every `fact_renew`).
pub async fn write(
    state: &AppState,
    caller: &Caller,
    env: &Environment,
    items: Vec<NewParam>,
    recompile: bool,
) -> ApiResult<SetOutcome> {
    write_marked(state, caller, env, items, recompile, &[]).await
}

/// [`write`], marking the values of `secret` secret (true) or not (false) in the same
/// transaction: only people and compilers may (an agent's facts keep their mark).
pub async fn write_marked(
    state: &AppState,
    caller: &Caller,
    env: &Environment,
    items: Vec<NewParam>,
    recompile: bool,
    secret: &[(ParamKey, bool)],
) -> ApiResult<SetOutcome> {
    for p in &items {
        authorize_write(caller, env.id, p)?;
    }
    if !secret.is_empty() && caller.role == Role::Agent {
        return Err(ApiError::forbidden(
            "an agent token can not mark values secret",
        ));
    }
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let out = facts::set_many(&mut tx, env.id, &items).await?;
    for flag in [true, false] {
        let keys: Vec<ParamKey> = secret
            .iter()
            .filter(|(_, s)| *s == flag)
            .map(|(k, _)| k.clone())
            .collect();
        if !keys.is_empty() {
            facts::mark_secret(&mut *tx, env.id, &keys, flag).await?;
        }
    }
    let quiet =
        caller.role == Role::Agent && out.changed.is_empty() && out.resolved_versions.is_empty();
    if !quiet && !items.is_empty() {
        let names: Vec<String> = items
            .iter()
            .take(AUDITED_NAMES)
            .map(|p| key_text(&p.resource_id, &p.name))
            .collect();
        audit::record(
            &mut *tx,
            &caller.name,
            Some(env.id),
            "parameters.set",
            &names.join(", "),
            json!({
                "count": items.len(),
                "changed": out.changed.iter().take(AUDITED_NAMES).map(|(r, n)| key_text(r, n)).collect::<Vec<_>>(),
                "changed_count": out.changed.len(),
                "resolved_versions": out.resolved_versions,
                "recompile": recompile,
            }),
        )
        .await?;
    }
    tx.commit().await.map_err(StoreError::from)?;
    if !out.changed.is_empty() || !out.resolved_versions.is_empty() {
        state.notifier.send(Event::facts(
            env.id,
            out.resolved_versions.clone(),
            out.changed.clone(),
            recompile && !out.changed.is_empty(),
        ));
    }
    Ok(out)
}

/// Delete one value for `caller` (checked here), audited; a deletion asks for a recompile
/// (the model may have used the value).
pub async fn remove(
    state: &AppState,
    caller: &Caller,
    env: &Environment,
    resource_id: &str,
    name: &str,
) -> ApiResult<bool> {
    if caller.role == Role::Agent {
        return Err(ApiError::forbidden(
            "an agent token writes facts; it deletes nothing",
        ));
    }
    let probe = NewParam {
        name: name.to_string(),
        resource_id: resource_id.to_string(),
        value: String::new(),
        source: "user".into(),
        metadata: json!({}),
        expires: false,
    };
    authorize_write(caller, env.id, &probe)?;
    let rid = facts::normalize_resource_id(resource_id)?;
    let mut tx = state.pool.begin().await.map_err(StoreError::from)?;
    let gone = facts::delete(&mut *tx, env.id, &rid, name).await?;
    if gone {
        audit::record(
            &mut *tx,
            &caller.name,
            Some(env.id),
            "parameter.delete",
            &key_text(&rid, name),
            json!({"resource_id": rid, "name": name}),
        )
        .await?;
    }
    tx.commit().await.map_err(StoreError::from)?;
    if gone {
        state.notifier.send(Event::facts(
            env.id,
            Vec::new(),
            vec![(rid, name.to_string())],
            true,
        ));
    }
    Ok(gone)
}

/// `name` (a parameter) or `name of resource` (a fact), for people.
fn key_text(resource_id: &str, name: &str) -> String {
    if resource_id.is_empty() {
        name.to_string()
    } else {
        format!("{name} of {resource_id}")
    }
}

fn not_found(resource_id: &str, name: &str) -> ApiError {
    if resource_id.is_empty() {
        ApiError::not_found(format!("parameter '{name}' not found"))
    } else {
        ApiError::not_found(format!("fact '{name}' of {resource_id} not found"))
    }
}

/// Rows as answered: each fact marked expired or not by the environment's `fact_expire`.
pub fn answered(env: &Environment, mut rows: Vec<Param>) -> Vec<Param> {
    facts::mark_expired(&mut rows, env.settings.fact_expire, chrono::Utc::now());
    rows
}

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ResourceQuery {
    /// A resource's id (`type[agent,attribute=value]`, a `,v=N` suffix is ignored): its facts
    /// only. Empty: the environment's parameters only.
    #[serde(default)]
    pub resource_id: Option<String>,
}

/// The parameters and facts of an environment (or of one resource).
#[utoipa::path(get, path = "/api/v1/environments/{env}/parameters", tag = FACTS, params(EnvPath, ResourceQuery),
    responses((status = 200, description = "By resource (parameters, whose resource_id is '', first) and name; `expired` says whether a fact is older than the environment's `fact_expire`", body = Vec<Param>)))]
pub async fn list_parameters(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ResourceQuery>,
) -> ApiResult<Json<Vec<Param>>> {
    let env = environment(&state, &caller, &key).await?;
    authorize_read_of(&caller, env.id, q.resource_id.as_deref())?;
    let rows = facts::list(&state.pool, env.id, q.resource_id.as_deref()).await?;
    Ok(Json(answered(&env, rows)))
}

/// The facts of an environment (or of one resource), without its parameters.
#[utoipa::path(get, path = "/api/v1/environments/{env}/facts", tag = FACTS, params(EnvPath, ResourceQuery),
    responses((status = 200, description = "By resource and name", body = Vec<Param>)))]
pub async fn list_facts(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<ResourceQuery>,
) -> ApiResult<Json<Vec<Param>>> {
    let env = environment(&state, &caller, &key).await?;
    authorize_read_of(
        &caller,
        env.id,
        q.resource_id.as_deref().filter(|r| !r.is_empty()),
    )?;
    let rows = match q.resource_id.as_deref() {
        None | Some("") => facts::list_facts(&state.pool, env.id).await?,
        Some(r) => facts::list(&state.pool, env.id, Some(r)).await?,
    };
    Ok(Json(answered(&env, rows)))
}

/// A parameter or fact in a path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ParamPath {
    /// The environment: its id, `project/name`, or its name.
    pub env: String,
    /// The parameter's or fact's name.
    pub name: String,
}

/// One parameter (or, with `resource_id`, one fact).
#[utoipa::path(get, path = "/api/v1/environments/{env}/parameters/{name}", tag = FACTS, params(ParamPath, ResourceQuery),
    responses((status = 200, description = "The parameter or fact", body = Param),
        (status = 404, description = "There is none")))]
pub async fn get_parameter(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, name)): Path<(String, String)>,
    Query(q): Query<ResourceQuery>,
) -> ApiResult<Json<Param>> {
    let env = environment(&state, &caller, &key).await?;
    let rid = q.resource_id.unwrap_or_default();
    authorize_read_of(&caller, env.id, Some(&rid))?;
    let p = facts::get(&state.pool, env.id, &rid, &name)
        .await?
        .ok_or_else(|| not_found(&rid, &name))?;
    Ok(Json(answered(&env, vec![p]).remove(0)))
}

/// A value to write at a name.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetParameterBody {
    /// The value (text, at most 64 KiB).
    pub value: String,
    /// `user` (the default for people and CI), `fact` (the default for agent tokens),
    /// `plugin` or `report`.
    #[serde(default)]
    pub source: Option<String>,
    /// Anything, as JSON (at most 64 KiB).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// Whether a fact expires (default: facts do, parameters never).
    #[serde(default)]
    pub expires: Option<bool>,
    /// Keep the value from pull-request previews (it still reaches the branch's compiles);
    /// absent: as it was.
    #[serde(default)]
    pub secret: Option<bool>,
    /// Recompile the environment's model when the value changed (a value that resolves an
    /// unknown of a version always does).
    #[serde(default)]
    pub recompile: bool,
}

fn default_source(caller: &Caller) -> String {
    if caller.role == Role::Agent {
        "fact".into()
    } else {
        "user".into()
    }
}

/// Set a parameter (or, with `resource_id`, a fact). Admins and compilers; agent tokens set
/// facts of their agents' resources.
#[utoipa::path(put, path = "/api/v1/environments/{env}/parameters/{name}", tag = FACTS, params(ParamPath, ResourceQuery),
    request_body = SetParameterBody,
    responses((status = 200, description = "The parameter or fact as stored", body = Param),
        (status = 422, description = "A name, resource id, value or metadata out of bounds, or an expiring parameter")))]
pub async fn set_parameter(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, name)): Path<(String, String)>,
    Query(q): Query<ResourceQuery>,
    ApiJson(body): ApiJson<SetParameterBody>,
) -> ApiResult<Json<Param>> {
    let env = environment(&state, &caller, &key).await?;
    let rid = q.resource_id.unwrap_or_default();
    let marks: Vec<(ParamKey, bool)> = body
        .secret
        .map(|s| {
            (
                ParamKey {
                    resource_id: rid.clone(),
                    name: name.clone(),
                },
                s,
            )
        })
        .into_iter()
        .collect();
    let item = NewParam {
        expires: body.expires.unwrap_or(!rid.is_empty()),
        name: name.clone(),
        resource_id: rid.clone(),
        value: body.value,
        source: body.source.unwrap_or_else(|| default_source(&caller)),
        metadata: body.metadata.unwrap_or_else(|| json!({})),
    };
    write_marked(&state, &caller, &env, vec![item], body.recompile, &marks).await?;
    let p = facts::get(&state.pool, env.id, &rid, &name)
        .await?
        .ok_or_else(|| not_found(&rid, &name))?;
    Ok(Json(answered(&env, vec![p]).remove(0)))
}

/// Delete a parameter (or, with `resource_id`, a fact): admins and compilers. The model is
/// compiled again (it may have used the value).
#[utoipa::path(delete, path = "/api/v1/environments/{env}/parameters/{name}", tag = FACTS, params(ParamPath, ResourceQuery),
    responses((status = 204, description = "Deleted"), (status = 404, description = "There is none")))]
pub async fn delete_parameter(
    State(state): State<AppState>,
    caller: Caller,
    Path((key, name)): Path<(String, String)>,
    Query(q): Query<ResourceQuery>,
) -> ApiResult<StatusCode> {
    let env = environment(&state, &caller, &key).await?;
    let rid = q.resource_id.unwrap_or_default();
    if remove(&state, &caller, &env, &rid, &name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found(&rid, &name))
    }
}

/// Several values at once (at most 1000).
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetParametersBody {
    pub parameters: Vec<ParameterItem>,
    /// Recompile when a value changed.
    #[serde(default)]
    pub recompile: bool,
}

/// Set several parameters and facts in one transaction.
#[utoipa::path(put, path = "/api/v1/environments/{env}/parameters", tag = FACTS, params(EnvPath),
    request_body = SetParametersBody,
    responses((status = 200, description = "What changed", body = WriteResult),
        (status = 422, description = "More than 1000 values, or one out of bounds (the message names it); nothing was written")))]
pub async fn set_parameters(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    ApiJson(body): ApiJson<SetParametersBody>,
) -> ApiResult<Json<WriteResult>> {
    let env = environment(&state, &caller, &key).await?;
    let marks: Vec<(ParamKey, bool)> = body
        .parameters
        .iter()
        .filter_map(|p| {
            let key = ParamKey {
                resource_id: facts::normalize_resource_id(&p.resource_id).ok()?,
                name: p.name.clone(),
            };
            Some((key, p.secret?))
        })
        .collect();
    let items = body
        .parameters
        .into_iter()
        .map(|p| NewParam {
            expires: p.expires.unwrap_or(!p.resource_id.is_empty()),
            source: p.source.unwrap_or_else(|| default_source(&caller)),
            metadata: p.metadata.unwrap_or_else(|| json!({})),
            name: p.name,
            resource_id: p.resource_id,
            value: p.value,
        })
        .collect();
    let out = write_marked(&state, &caller, &env, items, body.recompile, &marks).await?;
    Ok(Json(out.into()))
}

/// Whether a resource is in some stored version of the environment (a fact of it may still
/// come).
pub async fn resource_known(state: &AppState, env: uuid::Uuid, rid: &str) -> ApiResult<bool> {
    Ok(!store::versions::resource_history(&state.pool, env, rid)
        .await?
        .is_empty())
}
