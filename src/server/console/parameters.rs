//! Parameters and facts (issue 29): an environment's Parameters page (its parameters, how
//! many facts each resource has, and for admins and compilers a form to set and delete
//! parameters), the full value of one parameter or fact, and the facts shown on a resource's
//! page.
//!
//! Changes go through the REST API's handlers (`api_facts::set_parameter` and
//! `delete_parameter`), so the console writes, audits and notifies (the recompile trigger
//! follows `Event::Facts`) exactly as the API does, with the same role rules. Lists are read
//! from the store with a bound ([`ROWS_SHOWN`]); values are shortened in lists, and the full
//! value (at most the store's 64 KiB) has its own page, so a list page stays small even when
//! every value is large.

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use minijinja::{Value, context};
use serde::Deserialize;

use super::envs::env_context;
use super::render::{Page, url_component};
use super::resources::when;
use super::session::Visitor;
use crate::server::AppState;
use crate::server::api_facts::{self, ResourceQuery, SetParameterBody};
use crate::server::error::ApiError;
use crate::server::extract::ApiJson;
use crate::store::StoreError;
use crate::store::environments::Environment;
use crate::store::facts::{self as store_facts, NewParam, Param};

/// This module's templates (registered by [`super::render`]).
pub const TEMPLATES: &[(&str, &str)] = &[
    ("parameters.html", include_str!("templates/parameters.html")),
    (
        "parameter_value.html",
        include_str!("templates/parameter_value.html"),
    ),
];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/console/env/{env}/parameters",
            get(parameters_page).post(set_parameter),
        )
        .route(
            "/console/env/{env}/parameters/delete",
            post(delete_parameter),
        )
        .route("/console/env/{env}/parameters/value", get(value_page))
}

/// Most rows of one list (parameters, a resource's facts, resources with facts) on a page.
pub const ROWS_SHOWN: i64 = 1000;

/// Characters of a value a list shows (its first line); the rest is on the value's page.
const SHORT_VALUE: usize = 80;

/// A value as a list shows it: its first line, at most [`SHORT_VALUE`] characters, and
/// whether that is less than the whole value.
fn short_value(v: &str) -> (String, bool) {
    let line = v.lines().next().unwrap_or("");
    let short: String = line.chars().take(SHORT_VALUE).collect();
    let cut = short.len() < v.len();
    (short, cut)
}

/// The address of the page with a parameter's or fact's full value.
fn value_href(env: &str, resource_id: &str, name: &str) -> String {
    let mut href = format!(
        "/console/env/{env}/parameters/value?name={}",
        url_component(name)
    );
    if !resource_id.is_empty() {
        href.push_str(&format!("&resource_id={}", url_component(resource_id)));
    }
    href
}

/// One parameter or fact as the lists show it.
fn row(env: &str, p: &Param) -> Value {
    let (value, cut) = short_value(&p.value);
    context! {
        name => &p.name,
        value => value,
        cut => cut,
        full_href => value_href(env, &p.resource_id, &p.name),
        source => &p.source,
        updated => when(Some(p.updated)),
        expires => p.expires,
        expired => p.expired,
    }
}

/// At most [`ROWS_SHOWN`] rows, and whether there were more (`rows` holds one more than
/// shown when there were).
fn capped<T>(mut rows: Vec<T>) -> (Vec<T>, bool) {
    let more = rows.len() as i64 > ROWS_SHOWN;
    rows.truncate(ROWS_SHOWN as usize);
    (rows, more)
}

/// The facts of a resource for its page: `rows`, and `capped` when there are more than shown.
pub async fn resource_facts(
    state: &AppState,
    visitor: &Visitor,
    env: &Environment,
    resource_id: &str,
) -> Result<Value, Page> {
    api_facts::authorize_read(&visitor.caller, env.id)?;
    let rows = match store_facts::list_first(&state.pool, env.id, resource_id, ROWS_SHOWN + 1).await
    {
        Ok(r) => r,
        // an id the fact store does not take (too long, say) has no facts
        Err(StoreError::Invalid(_)) => Vec::new(),
        Err(e) => return Err(ApiError::from(e).into()),
    };
    let (rows, more) = capped(rows);
    let id = env.id.to_string();
    let rows: Vec<Value> = api_facts::answered(env, rows)
        .iter()
        .map(|p| row(&id, p))
        .collect();
    Ok(context! { rows => rows, capped => more })
}

/// What the set form had in it (shown again when it is refused).
#[derive(Default, Deserialize)]
pub struct SetForm {
    csrf: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
    /// A checkbox: sent (as `true`) only when ticked.
    #[serde(default)]
    recompile: Option<String>,
}

#[derive(Deserialize)]
pub struct DoneQuery {
    done: Option<String>,
}

async fn parameters_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<DoneQuery>,
) -> Result<Page, Page> {
    // only the words this module redirects with are said back
    let done = q.done.filter(|d| matches!(d.as_str(), "set" | "deleted"));
    render_page(&state, &visitor, &key, done, None, &SetForm::default()).await
}

/// The Parameters page; after a refused form, with `error` and what was typed.
async fn render_page(
    state: &AppState,
    visitor: &Visitor,
    key: &str,
    done: Option<String>,
    error: Option<(StatusCode, String)>,
    entered: &SetForm,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(state, visitor, key).await?;
    api_facts::authorize_read(&visitor.caller, env.id)?;
    let id = env.id.to_string();
    let (param_total, fact_total) = store_facts::counts(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?;
    let params = store_facts::list_first(&state.pool, env.id, "", ROWS_SHOWN + 1)
        .await
        .map_err(ApiError::from)?;
    let (params, params_capped) = capped(params);
    let params: Vec<Value> = api_facts::answered(&env, params)
        .iter()
        .map(|p| row(&id, p))
        .collect();
    let by_resource = store_facts::fact_counts_by_resource(&state.pool, env.id, ROWS_SHOWN + 1)
        .await
        .map_err(ApiError::from)?;
    let (by_resource, resources_capped) = capped(by_resource);
    let by_resource: Vec<Value> = by_resource
        .iter()
        .map(|(rid, n)| {
            context! {
                id => rid,
                href => format!("/console/env/{id}/resource?id={}#facts", url_component(rid)),
                count => n,
            }
        })
        .collect();
    // the API's own rule for a parameter write, so the form shows only where it would work
    let probe = NewParam {
        name: "probe".into(),
        resource_id: String::new(),
        value: String::new(),
        source: "user".into(),
        metadata: serde_json::json!({}),
        expires: false,
    };
    let can_write = api_facts::authorize_write(&visitor.caller, env.id, &probe).is_ok();
    let (status, error) = match error {
        Some((s, m)) => (s, Some(m)),
        None => (StatusCode::OK, None),
    };
    Ok(Page::with_status(
        status,
        "parameters.html",
        context! {
            title => format!("Parameters of {}", env.name),
            me => visitor.context(),
            env => env_ctx,
            params => params,
            params_capped => params_capped,
            param_total => param_total,
            fact_total => fact_total,
            by_resource => by_resource,
            resources_capped => resources_capped,
            shown => ROWS_SHOWN,
            can_write => can_write,
            done => done,
            error => error,
            entered => context! {
                name => &entered.name,
                value => &entered.value,
                recompile => entered.recompile.is_some(),
            },
        },
    ))
}

/// Set a parameter through the API's handler; a value it refuses shows the form again with
/// the API's reason.
async fn set_parameter(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Form(mut form): Form<SetForm>,
) -> Result<Response, Page> {
    visitor.check_csrf(form.csrf.as_deref())?;
    let (env, _) = env_context(&state, &visitor, &key).await?;
    form.name = form.name.trim().to_string();
    // browsers send a textarea's line ends as CRLF; the value is what was typed
    form.value = form.value.replace("\r\n", "\n");
    let result = api_facts::set_parameter(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), form.name.clone())),
        Query(ResourceQuery::default()),
        ApiJson(SetParameterBody {
            value: form.value.clone(),
            source: None,
            metadata: None,
            expires: None,
            secret: None,
            recompile: form.recompile.is_some(),
        }),
    )
    .await;
    match result {
        Ok(_) => Ok(
            Redirect::to(&format!("/console/env/{}/parameters?done=set", env.id)).into_response(),
        ),
        Err(e)
            if matches!(
                e.status,
                StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY
            ) =>
        {
            let page = render_page(
                &state,
                &visitor,
                &key,
                None,
                Some((e.status, e.message)),
                &form,
            )
            .await?;
            Ok(page.into_response())
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
pub struct DeleteForm {
    csrf: Option<String>,
    #[serde(default)]
    name: String,
}

/// Delete a parameter through the API's handler (which also asks for a recompile).
async fn delete_parameter(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Form(form): Form<DeleteForm>,
) -> Result<Response, Page> {
    visitor.check_csrf(form.csrf.as_deref())?;
    let (env, _) = env_context(&state, &visitor, &key).await?;
    api_facts::delete_parameter(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), form.name)),
        Query(ResourceQuery::default()),
    )
    .await?;
    Ok(Redirect::to(&format!("/console/env/{}/parameters?done=deleted", env.id)).into_response())
}

#[derive(Deserialize)]
pub struct ValueQuery {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    resource_id: Option<String>,
}

/// One parameter's or fact's whole value (read through the API's handler).
async fn value_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<ValueQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let Some(name) = q.name.filter(|n| !n.is_empty()) else {
        return Err(ApiError::bad_request("Which value? The address has no name.").into());
    };
    let resource_id = q.resource_id.unwrap_or_default();
    let axum::Json(p) = api_facts::get_parameter(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), name)),
        Query(ResourceQuery {
            resource_id: Some(resource_id.clone()),
        }),
    )
    .await?;
    let id = env.id.to_string();
    let resource_href = (!p.resource_id.is_empty()).then(|| {
        format!(
            "/console/env/{id}/resource?id={}#facts",
            url_component(&p.resource_id)
        )
    });
    Ok(Page::render(
        "parameter_value.html",
        context! {
            title => p.name.clone(),
            me => visitor.context(),
            env => env_ctx,
            p => context! {
                name => &p.name,
                resource_id => &p.resource_id,
                value => &p.value,
                source => &p.source,
                updated => when(Some(p.updated)),
                expires => p.expires,
                expired => p.expired,
                metadata => serde_json::to_string_pretty(&p.metadata).unwrap_or_default(),
            },
            resource_href => resource_href,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_show_the_first_line_shortened() {
        assert_eq!(short_value("10.0.0.1"), ("10.0.0.1".into(), false));
        assert_eq!(short_value(""), (String::new(), false));
        assert_eq!(short_value("a\nb"), ("a".into(), true));
        let long = "é".repeat(SHORT_VALUE + 1);
        let (short, cut) = short_value(&long);
        assert_eq!((short.chars().count(), cut), (SHORT_VALUE, true));
    }

    #[test]
    fn value_links_name_the_resource_of_a_fact_only() {
        assert_eq!(
            value_href("e", "", "db pass"),
            "/console/env/e/parameters/value?name=db%20pass"
        );
        assert_eq!(
            value_href("e", "vm::Host[a,name=x]", "ip"),
            "/console/env/e/parameters/value?name=ip&resource_id=vm%3A%3AHost%5Ba%2Cname%3Dx%5D"
        );
    }

    #[test]
    fn lists_are_cut_at_the_bound() {
        let (rows, more) = capped(vec![0; ROWS_SHOWN as usize + 1]);
        assert_eq!((rows.len() as i64, more), (ROWS_SHOWN, true));
        let (rows, more) = capped(vec![0; 3]);
        assert_eq!((rows.len(), more), (3, false));
    }
}
