//! Inmanta's own routes for parameters and facts, as inmanta-core 14's client calls them
//! (`inmanta.protocol.methods` and `methods_v2`), so that handler and module code written
//! for Inmanta works unchanged: the environment is the `X-Inmanta-tid` header, the token the
//! usual `Authorization: Bearer`, and the answers have Inmanta's shapes (`{"parameter": …}`
//! in v1, `{"data": …}` in v2). The rules are those of `api_facts` (whose [`write`] and
//! [`remove`] they call): the same roles, bounds, audit and recompile events.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::api_facts::{answered, authorize_read, remove, resource_known, write};
use super::auth::Caller;
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, OptionalJson, environment};
use super::openapi::INMANTA;
use crate::model::Role;
use crate::store::environments::Environment;
use crate::store::facts::{self, NewParam, Param};

/// The header Inmanta's client names the environment with.
pub const TID_HEADER: &str = "x-inmanta-tid";

/// The environment of an Inmanta call (its `X-Inmanta-tid` header), as the caller sees it.
async fn tid_environment(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
) -> ApiResult<Environment> {
    let tid = headers
        .get(TID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "this Inmanta call needs the environment id in the X-Inmanta-tid header",
            )
        })?;
    let id = uuid::Uuid::parse_str(tid).map_err(|_| {
        ApiError::bad_request(format!("X-Inmanta-tid '{tid}' is not an environment id"))
    })?;
    environment(state, caller, &id.to_string()).await
}

/// The `X-Inmanta-tid` header, for the reference.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub struct TidHeader {
    /// The environment's id.
    #[param(rename = "X-Inmanta-tid")]
    pub tid: uuid::Uuid,
}

/// A parameter as Inmanta's v1 API and v2 `Fact` give it.
fn inmanta_json(p: &Param) -> Value {
    json!({
        "id": p.id,
        "name": p.name,
        "value": p.value,
        "environment": p.environment_id,
        "source": p.source,
        "resource_id": p.resource_id,
        "updated": p.updated,
        "metadata": p.metadata,
        "expires": p.expires,
    })
}

/// A value as Inmanta stores it: text (Python's `str()` of what was sent).
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

fn source_of(caller: &Caller, given: Option<String>) -> String {
    given.unwrap_or_else(|| {
        if caller.role == Role::Agent {
            "fact".into()
        } else {
            "user".into()
        }
    })
}

/// One parameter of `set_parameters`: Inmanta names it `id`.
#[derive(Deserialize, ToSchema)]
pub struct InmantaParameter {
    /// The name.
    pub id: String,
    #[schema(value_type = String)]
    pub value: Value,
    /// `fact`, `user`, `plugin` or `report` (default: `fact` for agent tokens, else `user`).
    #[serde(default)]
    pub source: Option<String>,
    /// A fact's resource (a versioned id is taken without its version); absent: a parameter.
    #[serde(default)]
    pub resource_id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Default: facts expire, parameters never.
    #[serde(default)]
    pub expires: Option<bool>,
}

impl InmantaParameter {
    fn into_new(self, caller: &Caller) -> NewParam {
        let resource_id = self.resource_id.unwrap_or_default();
        NewParam {
            expires: self.expires.unwrap_or(!resource_id.is_empty()),
            source: source_of(caller, self.source),
            metadata: self.metadata.unwrap_or_else(|| json!({})),
            value: text_of(&self.value),
            name: self.id,
            resource_id,
        }
    }
}

/// Inmanta's `set_parameters` body.
#[derive(Deserialize, ToSchema)]
pub struct InmantaSetParameters {
    pub parameters: Vec<InmantaParameter>,
}

/// Inmanta's `set_parameters`: what an agent sends after a deploy (`ctx.set_fact`) and after
/// a handler's `facts()`; one transaction.
#[utoipa::path(put, operation_id = "inmanta_set_parameters", path = "/api/v1/parameters", tag = INMANTA, params(TidHeader),
    request_body = InmantaSetParameters,
    responses((status = 200, description = "Stored: `{}`", body = Object),
        (status = 422, description = "More than 1000 values, or one out of bounds; nothing was written")))]
pub async fn set_parameters(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<InmantaSetParameters>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    let items = body
        .parameters
        .into_iter()
        .map(|p| p.into_new(&caller))
        .collect();
    write(&state, &caller, &env, items, false).await?;
    Ok(Json(json!({})))
}

/// A parameter in an Inmanta path (`/parameter/<id>`).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct InmantaParamPath {
    /// The parameter's or fact's name.
    pub id: String,
}

#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InmantaResourceQuery {
    /// A fact's resource; absent: a parameter of the environment.
    #[serde(default)]
    pub resource_id: Option<String>,
}

/// Inmanta's `get_param`: a parameter, or a fact of a resource. A fact that is missing or
/// expired answers 503 while its resource is in a version of the environment (its agent is
/// asked for it by the fact refresh), 404 when the resource is unknown.
#[utoipa::path(get, operation_id = "inmanta_get_param", path = "/api/v1/parameter/{id}", tag = INMANTA, params(InmantaParamPath, InmantaResourceQuery, TidHeader),
    responses((status = 200, description = "`{\"parameter\": {id, name, value, environment, source, resource_id, updated, metadata, expires}}`", body = Object),
        (status = 404, description = "No such parameter, or a fact of a resource this environment does not know"),
        (status = 503, description = "The fact is missing or expired; it is asked from the resource's agent")))]
pub async fn get_param(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<InmantaResourceQuery>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    authorize_read(&caller, env.id)?;
    let rid = q.resource_id.unwrap_or_default();
    let found = facts::get(&state.pool, env.id, &rid, &name).await?;
    let found = found.map(|p| answered(&env, vec![p]).remove(0));
    match found {
        Some(p) if !p.expired => Ok(Json(json!({"parameter": inmanta_json(&p)}))),
        _ if rid.is_empty() => Err(ApiError::not_found(format!("parameter '{name}' not found"))),
        expired => {
            let rid = facts::normalize_resource_id(&rid)?;
            if resource_known(&state, env.id, &rid).await? {
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!(
                        "fact '{name}' of {rid} is {}; it is asked from the resource's agent",
                        if expired.is_some() {
                            "expired"
                        } else {
                            "not known yet"
                        }
                    ),
                ))
            } else {
                Err(ApiError::not_found(format!(
                    "fact '{name}' of {rid} not found, and the resource is in no version of this environment"
                )))
            }
        }
    }
}

/// Inmanta's `set_param` body.
#[derive(Deserialize, ToSchema)]
pub struct InmantaSetParam {
    #[schema(value_type = String)]
    pub value: Value,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    pub resource_id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub recompile: bool,
    #[serde(default)]
    pub expires: Option<bool>,
}

/// Inmanta's `set_param`: one parameter or fact.
#[utoipa::path(put, operation_id = "inmanta_set_param", path = "/api/v1/parameter/{id}", tag = INMANTA, params(InmantaParamPath, TidHeader),
    request_body = InmantaSetParam,
    responses((status = 200, description = "`{\"parameter\": {…}}` as stored", body = Object)))]
pub async fn set_param(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<InmantaSetParam>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    let p = InmantaParameter {
        id: name,
        value: body.value,
        source: body.source,
        resource_id: body.resource_id,
        metadata: body.metadata,
        expires: body.expires,
    }
    .into_new(&caller);
    let stored = store_one(&state, &caller, &env, p, body.recompile).await?;
    Ok(Json(json!({"parameter": inmanta_json(&stored)})))
}

/// Write one value and read it back.
async fn store_one(
    state: &AppState,
    caller: &Caller,
    env: &Environment,
    p: NewParam,
    recompile: bool,
) -> ApiResult<Param> {
    let (rid, name) = (p.resource_id.clone(), p.name.clone());
    write(state, caller, env, vec![p], recompile).await?;
    facts::get(&state.pool, env.id, &rid, &name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("'{name}' not found")))
}

/// Inmanta's `delete_param`.
#[utoipa::path(delete, operation_id = "inmanta_delete_param", path = "/api/v1/parameter/{id}", tag = INMANTA, params(InmantaParamPath, InmantaResourceQuery, TidHeader),
    responses((status = 200, description = "Deleted: `{}`", body = Object), (status = 404, description = "There is none")))]
pub async fn delete_param(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<InmantaResourceQuery>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    let rid = q.resource_id.unwrap_or_default();
    if remove(&state, &caller, &env, &rid, &name).await? {
        Ok(Json(json!({})))
    } else {
        Err(ApiError::not_found(format!("'{name}' not found")))
    }
}

/// Inmanta's `list_params` body: metadata every listed value must have.
#[derive(Deserialize, Default, ToSchema)]
pub struct InmantaListParams {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub query: Option<serde_json::Map<String, Value>>,
}

/// Inmanta's `list_params`: the environment's parameters and facts whose metadata holds every
/// key and value of `query`, by name.
#[utoipa::path(post, operation_id = "inmanta_list_params", path = "/api/v1/parameter", tag = INMANTA, params(TidHeader),
    request_body = Option<InmantaListParams>,
    responses((status = 200, description = "`{\"parameters\": […], \"expire\": fact_expire, \"now\": time}`", body = Object)))]
pub async fn list_params(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    OptionalJson(body): OptionalJson<InmantaListParams>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    authorize_read(&caller, env.id)?;
    let query = body.query.unwrap_or_default();
    let mut rows = facts::list(&state.pool, env.id, None).await?;
    rows.retain(|p| query.iter().all(|(k, v)| p.metadata.get(k) == Some(v)));
    rows.sort_by(|a, b| a.name.cmp(&b.name).then(a.resource_id.cmp(&b.resource_id)));
    Ok(Json(json!({
        "parameters": rows.iter().map(inmanta_json).collect::<Vec<_>>(),
        "expire": env.settings.fact_expire,
        "now": chrono::Utc::now(),
    })))
}

/// A fact or parameter in an Inmanta v2 path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct InmantaNamePath {
    pub name: String,
}

/// Inmanta's v2 `set_fact` body.
#[derive(Deserialize, ToSchema)]
pub struct InmantaSetFact {
    #[schema(value_type = String)]
    pub value: Value,
    pub resource_id: String,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub recompile: bool,
    /// Default true.
    #[serde(default)]
    pub expires: Option<bool>,
}

/// Inmanta's v2 `set_fact`.
#[utoipa::path(put, operation_id = "inmanta_set_fact", path = "/api/v2/facts/{name}", tag = INMANTA, params(InmantaNamePath, TidHeader),
    request_body = InmantaSetFact,
    responses((status = 200, description = "`{\"data\": Fact}`", body = Object)))]
pub async fn set_fact(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<InmantaSetFact>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    if body.resource_id.is_empty() {
        return Err(ApiError::bad_request(
            "a fact needs a resource_id (set a parameter with PUT /api/v2/parameters/{name})",
        ));
    }
    let p = InmantaParameter {
        id: name,
        value: body.value,
        source: body.source,
        resource_id: Some(body.resource_id),
        metadata: body.metadata,
        expires: Some(body.expires.unwrap_or(true)),
    }
    .into_new(&caller);
    let stored = store_one(&state, &caller, &env, p, body.recompile).await?;
    Ok(Json(json!({"data": inmanta_json(&stored)})))
}

/// Inmanta's v2 `set_parameter` body.
#[derive(Deserialize, ToSchema)]
pub struct InmantaSetParameter {
    #[schema(value_type = String)]
    pub value: Value,
    #[serde(default)]
    pub source: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub recompile: bool,
}

/// Inmanta's v2 `set_parameter`.
#[utoipa::path(put, operation_id = "inmanta_set_parameter", path = "/api/v2/parameters/{name}", tag = INMANTA, params(InmantaNamePath, TidHeader),
    request_body = InmantaSetParameter,
    responses((status = 200, description = "`{\"data\": Parameter}`", body = Object)))]
pub async fn set_parameter(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<InmantaSetParameter>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    let p = InmantaParameter {
        id: name,
        value: body.value,
        source: body.source,
        resource_id: None,
        metadata: body.metadata,
        expires: Some(false),
    }
    .into_new(&caller);
    let stored = store_one(&state, &caller, &env, p, body.recompile).await?;
    let mut v = inmanta_json(&stored);
    if let Some(o) = v.as_object_mut() {
        o.remove("resource_id");
        o.remove("expires");
    }
    Ok(Json(json!({ "data": v })))
}

/// A resource in an Inmanta v2 path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct InmantaResourcePath {
    /// The resource id (URL-encoded).
    pub rid: String,
}

/// Inmanta's v2 `get_facts`: a resource's facts, by name.
#[utoipa::path(get, operation_id = "inmanta_get_facts", path = "/api/v2/resource/{rid}/facts", tag = INMANTA, params(InmantaResourcePath, TidHeader),
    responses((status = 200, description = "`{\"data\": [Fact]}`", body = Object)))]
pub async fn get_facts(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(rid): Path<String>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    authorize_read(&caller, env.id)?;
    if rid.is_empty() {
        return Err(ApiError::bad_request("a resource id is needed"));
    }
    let rows = facts::list(&state.pool, env.id, Some(&rid)).await?;
    Ok(Json(json!({
        "data": rows.iter().map(inmanta_json).collect::<Vec<_>>()
    })))
}

/// A fact of a resource by its id, in an Inmanta v2 path.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct InmantaFactPath {
    /// The resource id (URL-encoded).
    pub rid: String,
    /// The fact's id.
    pub id: uuid::Uuid,
}

/// Inmanta's v2 `get_fact`: one fact of a resource by its id.
#[utoipa::path(get, operation_id = "inmanta_get_fact", path = "/api/v2/resource/{rid}/facts/{id}", tag = INMANTA, params(InmantaFactPath, TidHeader),
    responses((status = 200, description = "`{\"data\": Fact}`", body = Object), (status = 404, description = "There is none")))]
pub async fn get_fact(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path((rid, id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let env = tid_environment(&state, &caller, &headers).await?;
    authorize_read(&caller, env.id)?;
    let id = super::extract::parse_uuid("fact", &id)?;
    let rid = facts::normalize_resource_id(&rid)?;
    match facts::get_by_id(&state.pool, env.id, id).await? {
        Some(p) if p.resource_id == rid && !rid.is_empty() => {
            Ok(Json(json!({"data": inmanta_json(&p)})))
        }
        _ => Err(ApiError::not_found(format!(
            "fact with id {id} does not exist"
        ))),
    }
}
