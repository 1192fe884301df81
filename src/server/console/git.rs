//! The git pages of an environment: its source (settings, last fetch and its error), the
//! compile reports and a commit's timeline, one compile report (stages, output, diagnostics
//! with the model's line and a caret under the column), compile-now through a confirmation,
//! and the environment's audit log (paged, filtered by action).
//!
//! Everything is read and done through the API's handlers with the visitor's token; the only
//! direct store read (the audit log's list of actions, for the filter) follows the API's
//! permission check of the same page.

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use serde::Deserialize;
use serde_json::Value as Json;

use super::envs::env_context;
use super::render::{Page, val};
use super::session::Visitor;
use crate::server::AppState;
use crate::server::api_sources::{self, CompileReport, ListQuery, TriggerBody};
use crate::server::api_tokens::{self, AuditQuery};
use crate::server::auth::Perm;
use crate::server::error::ApiError;
use crate::server::extract::OptionalJson;
use crate::sources::compile::SourceLine;
use crate::store;

/// This module's templates (registered by [`super::render`]).
pub const TEMPLATES: &[(&str, &str)] = &[
    ("git.html", include_str!("templates/git.html")),
    ("compile.html", include_str!("templates/compile.html")),
    ("audit.html", include_str!("templates/audit.html")),
    (
        "timeline_part.html",
        include_str!("templates/timeline_part.html"),
    ),
];

/// Compile reports on the source page, and audit entries on a page.
const COMPILES_SHOWN: i64 = 50;
const AUDIT_PAGE: i64 = 50;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/env/{env}/git", get(source_page))
        .route(
            "/console/env/{env}/git/trigger",
            get(confirm_trigger).post(trigger),
        )
        .route("/console/env/{env}/git/compiles/{id}", get(compile_page))
        .route("/console/env/{env}/audit", get(audit_page))
}

/// A moment as the pages show it (UTC, to the second).
pub(super) fn when(t: Option<DateTime<Utc>>) -> Option<String> {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

/// A duration as the pages show it: milliseconds under a second, else seconds with one
/// decimal (as the CLI prints them).
pub(super) fn took_ms(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

fn between(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Option<String> {
    Some(took_ms((to? - from?).num_milliseconds().max(0)))
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

#[derive(Deserialize)]
struct SourceQuery {
    /// the commit whose timeline is shown (default: the newest compile's)
    commit: Option<String>,
    /// after a compile-now: the compile it led to, and how
    queued: Option<String>,
    outcome: Option<String>,
}

async fn source_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<SourceQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let id = env.id.to_string();
    let source = match api_sources::get_source(
        State(state.clone()),
        visitor.caller.clone(),
        Path(id.clone()),
    )
    .await
    {
        Ok(axum::Json(s)) => Some(s),
        Err(e) if e.status == StatusCode::NOT_FOUND => None,
        Err(e) => return Err(e.into()),
    };
    let axum::Json(compiles) = api_sources::list_compiles(
        State(state.clone()),
        visitor.caller.clone(),
        Path(id.clone()),
        Query(ListQuery {
            limit: Some(COMPILES_SHOWN),
        }),
    )
    .await?;
    let rows: Vec<Value> = compiles
        .iter()
        .map(|c| {
            context! {
                id => c.id.to_string(),
                commit => c.commit.clone(),
                short => short(&c.commit),
                trigger => c.trigger.clone(),
                status => c.status.clone(),
                requested => when(Some(c.requested_at)),
                waited => between(Some(c.requested_at), c.started_at),
                took => between(c.started_at, c.finished_at),
                version => c.version,
                error => c.error.clone(),
            }
        })
        .collect();
    // the timeline of the commit asked for, else of the newest compile, else of the tip
    let commit = q
        .commit
        .clone()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| compiles.first().map(|c| c.commit.clone()))
        .or_else(|| {
            source
                .as_ref()
                .and_then(|s| s["last_tip"].as_str().map(str::to_string))
        });
    let (timeline, timeline_error) = match &commit {
        Some(c) => match commit_timeline(&state, &visitor, &id, c).await {
            Ok(t) => (Some(t), None),
            Err(e) => (None, Some(e.message)),
        },
        None => (None, None),
    };
    let queued = q.queued.as_deref().map(|qid| {
        let c = compiles.iter().find(|c| c.id.to_string() == qid);
        context! {
            id => qid,
            commit => c.map(|c| short(&c.commit).to_string()),
            outcome => q.outcome.clone(),
        }
    });
    let secrets: Vec<&str> = source
        .as_ref()
        .map(|s| {
            [
                ("has_token", "HTTPS token"),
                ("has_ssh_key", "SSH key"),
                ("has_known_hosts", "known hosts"),
                ("has_webhook_secret", "webhook secret"),
                ("has_status_token", "status token"),
                ("has_notify_secret", "notification secret"),
            ]
            .into_iter()
            .filter(|(k, _)| s[*k] == true)
            .map(|(_, name)| name)
            .collect()
        })
        .unwrap_or_default();
    let fetched = source.as_ref().and_then(|s| {
        s["last_fetch_at"]
            .as_str()
            .and_then(|t| t.parse::<DateTime<Utc>>().ok())
    });
    Ok(Page::render(
        "git.html",
        context! {
            title => format!("Git source of {}", env.name),
            me => visitor.context(),
            env => env_ctx,
            source => val(&source),
            fetched => when(fetched),
            secrets => secrets,
            git_enabled => state.sources.is_some(),
            compiles => rows,
            shown => COMPILES_SHOWN,
            commit => commit,
            timeline => timeline,
            timeline_error => timeline_error,
            queued => queued,
        },
    ))
}

/// A commit's timeline: each event with its time, the time since the first, and its
/// detail as words (compiles and versions as links).
async fn commit_timeline(
    state: &AppState,
    visitor: &Visitor,
    env: &str,
    commit: &str,
) -> Result<Value, ApiError> {
    let axum::Json(t) = api_sources::timeline(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.to_string(), commit.trim().to_string())),
    )
    .await?;
    let first = t.events.first().map(|e| e.at);
    let events: Vec<Value> = t
        .events
        .iter()
        .map(|e| {
            context! {
                event => e.event.clone(),
                at => when(Some(e.at)),
                since => between(first, Some(e.at)),
                detail => detail_items(&e.detail),
            }
        })
        .collect();
    Ok(context! {
        commit => t.commit.clone(),
        short => short(&t.commit),
        state => t.state,
        events => events,
    })
}

/// An event's detail as (key, text, kind) items; kind `compile` and `version` become links.
fn detail_items(detail: &Json) -> Vec<Value> {
    let Some(map) = detail.as_object() else {
        return Vec::new();
    };
    map.iter()
        .map(|(k, v)| {
            let text = match v {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            };
            let kind = match k.as_str() {
                "compile" | "by" if uuid::Uuid::parse_str(&text).is_ok() => "compile",
                "version" if v.is_number() => "version",
                _ => "text",
            };
            context! { key => k, text => text, kind => kind }
        })
        .collect()
}

#[derive(Deserialize)]
struct TriggerQuery {
    commit: Option<String>,
}

/// What compile-now will do, with the button that does it.
async fn confirm_trigger(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<TriggerQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    visitor.caller.require(Perm::Upload, Some(env.id))?;
    let axum::Json(source) = api_sources::get_source(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
    )
    .await?;
    let commit = q
        .commit
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty());
    let (url, branch) = (
        source["url"].as_str().unwrap_or_default(),
        source["branch"].as_str().unwrap_or_default(),
    );
    let mut explain = vec![format!("The server fetches {url} now.")];
    explain.push(match &commit {
        Some(c) => format!(
            "Then it compiles commit {c} (it must be on branch {branch}), even when an earlier compile of it failed."
        ),
        None => format!(
            "Then it compiles the tip of branch {branch}, unless that commit was compiled already."
        ),
    });
    explain.push(
        "The version it makes is released as the environment's settings say (auto_release), and the compile shows in the reports below the source."
            .into(),
    );
    let fields: Vec<Value> = commit
        .iter()
        .map(|c| context! { name => "commit", value => c })
        .collect();
    Ok(Page::render(
        "confirm.html",
        context! {
            title => "Compile now",
            me => visitor.context(),
            env => env_ctx,
            section => "git",
            heading => format!("Compile {} of {} now?", commit.as_deref().map(|c| format!("commit {c}")).unwrap_or_else(|| format!("the tip of {branch}")), env.name),
            explain => explain,
            action => format!("/console/env/{}/git/trigger", env.id),
            fields => fields,
            button => "Fetch and compile",
            back => format!("/console/env/{}/git", env.id),
            danger => false,
        },
    ))
}

#[derive(Deserialize)]
struct TriggerForm {
    csrf: Option<String>,
    commit: Option<String>,
}

/// Compile now (the API's trigger: admin or compiler).
async fn trigger(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Form(form): Form<TriggerForm>,
) -> Result<Response, Page> {
    visitor.check_csrf(form.csrf.as_deref())?;
    let (env, _) = env_context(&state, &visitor, &key).await?;
    let commit = form
        .commit
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty());
    let (_, axum::Json(t)) = api_sources::trigger(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        OptionalJson(TriggerBody { commit }),
    )
    .await?;
    tracing::info!(environment = %env.id, by = %visitor.caller.name, commit = %t["commit"], "compile triggered from the console");
    let queued = t["compile"].as_str().unwrap_or_default();
    let outcome = t["status"].as_str().unwrap_or_default();
    let commit = t["commit"].as_str().unwrap_or_default();
    Ok(Redirect::to(&format!(
        "/console/env/{}/git?queued={}&outcome={}&commit={}",
        env.id,
        super::render::url_component(queued),
        super::render::url_component(outcome),
        super::render::url_component(commit),
    ))
    .into_response())
}

async fn compile_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, compile)): Path<(String, String)>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let id = env.id.to_string();
    let axum::Json(CompileReport {
        report: r,
        source_lines,
    }) = api_sources::get_compile(
        State(state.clone()),
        visitor.caller.clone(),
        Path((id.clone(), compile)),
    )
    .await?;
    let stages: Vec<Value> = r
        .stages
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            context! {
                name => s["name"].as_str().unwrap_or("?"),
                started => s["started_at"].as_str().and_then(|t| t.parse::<DateTime<Utc>>().ok()).and_then(|t| when(Some(t))),
                took => s["ms"].as_i64().map(took_ms),
                ok => s["ok"].as_bool().unwrap_or(false),
                detail => s["detail"].as_str().unwrap_or(""),
            }
        })
        .collect();
    let mut missing_source = false;
    let diagnostics: Vec<Value> = r
        .diagnostics
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let labels: Vec<Value> = std::iter::once((&d["primary"], true))
                .chain(
                    d["secondary"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|l| (l, false)),
                )
                .filter(|(l, _)| l.is_object())
                .map(|(l, primary)| {
                    let shown = snippet(l, &source_lines);
                    missing_source |= shown.is_none();
                    context! {
                        primary => primary,
                        file => l["file"].as_str(),
                        line => l["line"].as_u64(),
                        column => l["column"].as_u64(),
                        message => l["message"].as_str().unwrap_or(""),
                        snippet => shown,
                    }
                })
                .collect();
            context! {
                severity => d["severity"].as_str().unwrap_or("error"),
                code => d["code"].as_str().unwrap_or(""),
                message => d["message"].as_str().unwrap_or(""),
                labels => labels,
                notes => val(&d["notes"]),
            }
        })
        .collect();
    let timeline = commit_timeline(&state, &visitor, &id, &r.commit).await.ok();
    Ok(Page::render(
        "compile.html",
        context! {
            title => format!("Compile of {}", short(&r.commit)),
            me => visitor.context(),
            env => env_ctx,
            c => context! {
                id => r.id.to_string(),
                commit => r.commit.clone(),
                short => short(&r.commit),
                branch => r.branch.clone(),
                trigger => r.trigger.clone(),
                status => r.status.clone(),
                requested => when(Some(r.requested_at)),
                started => when(r.started_at),
                finished => when(r.finished_at),
                waited => between(Some(r.requested_at), r.started_at),
                took => between(r.started_at, r.finished_at),
                version => r.version,
                error => r.error.clone(),
                exit_code => r.exit_code,
                superseded_by => r.superseded_by.map(|u| u.to_string()),
                stdout => r.stdout.clone(),
                stderr => r.stderr.clone(),
            },
            stages => stages,
            diagnostics => diagnostics,
            missing_source => missing_source,
            timeline => timeline,
        },
    ))
}

/// The model's line a label points at, with a gutter and a caret line under its column
/// (tabs kept, so the caret lines up however tabs are shown); None when the report's
/// commit does not give the line.
pub(super) fn snippet(label: &Json, lines: &[SourceLine]) -> Option<Value> {
    let (file, line) = (label["file"].as_str()?, label["line"].as_u64()? as usize);
    let text = &lines
        .iter()
        .find(|l| l.file == file && l.line == line)?
        .text;
    let column = label["column"].as_u64().unwrap_or(1).max(1) as usize;
    let pad: String = text
        .chars()
        .take(column - 1)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    let len = text.chars().count();
    let width = match (label["end_line"].as_u64(), label["end_column"].as_u64()) {
        (Some(el), Some(ec)) if el as usize == line && ec as usize > column => ec as usize - column,
        _ => 1,
    }
    .min(len.saturating_sub(column - 1).max(1));
    let number = line.to_string();
    Some(context! {
        gutter => format!("{number} | "),
        blank => format!("{} | ", " ".repeat(number.len())),
        text => text,
        pointer => format!("{pad}{}", "^".repeat(width)),
    })
}

#[derive(Deserialize)]
struct AuditPageQuery {
    action: Option<String>,
    before: Option<i64>,
}

async fn audit_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<AuditPageQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let action = q.action.filter(|a| !a.is_empty());
    let listed = api_tokens::audit(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        Query(AuditQuery {
            limit: Some(AUDIT_PAGE + 1),
            before: q.before,
            action: action.clone(),
        }),
    )
    .await;
    let title = format!("Audit log of {}", env.name);
    let mut entries = match listed {
        Ok(axum::Json(e)) => e,
        // not an administrator: the page says so, in the environment's pages
        Err(e) if e.status == StatusCode::FORBIDDEN => {
            return Ok(Page::with_status(
                StatusCode::FORBIDDEN,
                "audit.html",
                context! {
                    title => title,
                    me => visitor.context(),
                    env => env_ctx,
                    refused => e.message,
                },
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let more = entries.len() as i64 > AUDIT_PAGE;
    entries.truncate(AUDIT_PAGE as usize);
    let actions = store::audit::actions(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?;
    let rows: Vec<Value> = entries
        .iter()
        .map(|e| {
            let empty = e.details.as_object().is_some_and(|m| m.is_empty()) || e.details.is_null();
            context! {
                id => e.id,
                at => when(Some(e.at)),
                actor => e.actor.clone(),
                action => e.action.clone(),
                target => e.target.clone(),
                details => (!empty).then(|| serde_json::to_string_pretty(&e.details).unwrap_or_default()),
            }
        })
        .collect();
    Ok(Page::render(
        "audit.html",
        context! {
            title => title,
            me => visitor.context(),
            env => env_ctx,
            entries => rows,
            actions => actions,
            action => action,
            before => q.before,
            older => more.then(|| entries.last().map(|e| e.id)).flatten(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(text: &str) -> Vec<SourceLine> {
        vec![SourceLine {
            file: "main.cf".into(),
            line: 4,
            text: text.into(),
        }]
    }

    #[test]
    fn the_caret_stands_under_the_column() {
        let l = json!({"file": "main.cf", "line": 4, "column": 5, "end_line": 4, "end_column": 8});
        let s = snippet(&l, &line("x = foo(1)")).unwrap();
        assert_eq!(s.get_attr("pointer").unwrap().to_string(), "    ^^^");
        assert_eq!(s.get_attr("gutter").unwrap().to_string(), "4 | ");
        assert_eq!(s.get_attr("blank").unwrap().to_string(), "  | ");
        // tabs are kept so the caret lines up; a span over lines gets one caret
        let l = json!({"file": "main.cf", "line": 4, "column": 3, "end_line": 5, "end_column": 1});
        let s = snippet(&l, &line("\t\tx")).unwrap();
        assert_eq!(s.get_attr("pointer").unwrap().to_string(), "\t\t^");
        // past the end of the line (a missing token at its end): one caret after it
        let l = json!({"file": "main.cf", "line": 4, "column": 5});
        let s = snippet(&l, &line("x = ")).unwrap();
        assert_eq!(s.get_attr("pointer").unwrap().to_string(), "    ^");
        // another file, or a line the report does not give: nothing
        assert!(
            snippet(
                &json!({"file": "other.cf", "line": 4, "column": 1}),
                &line("x")
            )
            .is_none()
        );
    }

    #[test]
    fn durations_read_as_the_cli_prints_them() {
        assert_eq!(took_ms(12), "12 ms");
        assert_eq!(took_ms(1234), "1.2 s");
    }
}
