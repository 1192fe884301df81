//! Dry-run reports: the list (the API's `list_dryruns`) and one report (`get_dryrun`): per
//! resource what a deploy would change, attribute by attribute (current value on the target →
//! desired value), which resources could not be read, and which were not run at all.
//! Starting one is the versions page's `dryrun` action.

use axum::extract::{Path, State};
use minijinja::{Value, context};

use super::when;
use crate::server::AppState;
use crate::server::api_deploy;
use crate::server::console::envs::env_context;
use crate::server::console::render::Page;
use crate::server::console::session::Visitor;
use crate::store::deploy::DryrunResult;

pub async fn list(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let axum::Json(rows) = api_deploy::list_dryruns(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
    )
    .await?;
    let rows: Vec<Value> = rows
        .iter()
        .map(|d| {
            context! {
                id => d.id.to_string(),
                version => d.version,
                created => when(&d.created_at),
                created_iso => d.created_at.to_rfc3339(),
                finished => d.finished_at.as_ref().map(when),
                done => d.done,
                total => d.total,
                requested_by => d.requested_by.clone(),
            }
        })
        .collect();
    Ok(Page::render(
        "dryruns.html",
        context! {
            title => format!("Dry runs of {}", env.name),
            me => visitor.context(),
            env => env_ctx,
            dryruns => rows,
        },
    ))
}

/// Outcomes of resources that were read but could not be: the handler failed or timed out,
/// or there was none.
const FAILED: &[&str] = &["failed", "unavailable", "timed_out"];

/// A value as the report shows it (strings as they are, anything else as JSON).
fn text(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => {
            context! { text => s.clone(), kind => "string" }
        }
        serde_json::Value::Null => context! { text => "null", kind => "null" },
        other => context! {
            text => serde_json::to_string_pretty(other).unwrap_or_default(),
            kind => "json",
        },
    }
}

fn result(r: &DryrunResult) -> Value {
    let changes: Vec<Value> = r
        .changes
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(name, ch)| {
                    context! {
                        name => name.clone(),
                        current => text(&ch["current"]),
                        desired => text(&ch["desired"]),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let messages: Vec<Value> = r
        .messages
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    context! {
                        level => m["level"].as_str().unwrap_or("info").to_string(),
                        message => m["message"].as_str().unwrap_or("").to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    context! {
        resource_id => r.resource_id.clone(),
        outcome => r.outcome.clone(),
        changes => changes,
        messages => messages,
    }
}

pub async fn report(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, id)): Path<(String, String)>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let axum::Json(r) = api_deploy::get_dryrun(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), id)),
    )
    .await?;
    let is_change = |x: &&DryrunResult| {
        x.outcome == "dry" && x.changes.as_object().is_some_and(|m| !m.is_empty())
    };
    let changed: Vec<Value> = r.results.iter().filter(is_change).map(result).collect();
    let failed: Vec<Value> = r
        .results
        .iter()
        .filter(|x| FAILED.contains(&x.outcome.as_str()))
        .map(result)
        .collect();
    let not_run: Vec<Value> = r
        .results
        .iter()
        .filter(|x| x.outcome != "dry" && !FAILED.contains(&x.outcome.as_str()))
        .map(result)
        .collect();
    let unchanged = r
        .results
        .iter()
        .filter(|x| x.outcome == "dry" && !is_change(x))
        .count();
    let d = &r.dryrun;
    Ok(Page::render(
        "dryrun.html",
        context! {
            title => format!("Dry run of version {} of {}", d.version, env.name),
            me => visitor.context(),
            env => env_ctx,
            d => context! {
                id => d.id.to_string(),
                version => d.version,
                created => when(&d.created_at),
                created_iso => d.created_at.to_rfc3339(),
                finished => d.finished_at.as_ref().map(when),
                done => d.done,
                total => d.total,
                requested_by => d.requested_by.clone(),
            },
            complete => r.complete,
            changed => changed,
            failed => failed,
            not_run => not_run,
            unchanged => unchanged,
        },
    ))
}
