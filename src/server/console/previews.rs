//! The pull-request previews of an environment: the list (open ones first, with their
//! newest run) and one preview (its runs, the newest run's stages and diagnostics with the
//! model's line, and its changes, paged like a version diff). Read through the API's
//! handlers with the visitor's token.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::get;
use minijinja::{Value, context};
use serde::Deserialize;

use super::envs::env_context;
use super::git::{snippet, took_ms, when};
use super::render::Page;
use super::session::Visitor;
use crate::server::AppState;
use crate::server::api_previews::{self, PreviewListQuery, PreviewReport, RunQuery};
use crate::sources::compile::SourceLine;

pub const TEMPLATES: &[(&str, &str)] = &[
    ("previews.html", include_str!("templates/previews.html")),
    ("preview.html", include_str!("templates/preview.html")),
];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/env/{env}/previews", get(list_page))
        .route("/console/env/{env}/previews/{id}", get(preview_page))
}

fn short(c: &str) -> &str {
    &c[..c.len().min(12)]
}

use crate::sources::previews::comment::counts_text as counts;

async fn list_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let axum::Json(list) = api_previews::list(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        Query(PreviewListQuery {
            state: None,
            limit: Some(200),
        }),
    )
    .await?;
    let rows: Vec<Value> = list
        .iter()
        .map(|p| {
            let run = p.run.as_ref();
            context! {
                id => p.preview.id.to_string(),
                number => p.preview.number,
                reference => p.preview.reference.clone(),
                title => p.preview.title.clone(),
                state => p.preview.state.clone(),
                fork => p.preview.fork,
                status => run.map(|r| r.status.clone()),
                head => run.map(|r| short(&r.head).to_string()),
                changes => run.filter(|r| r.status == "success").map(|r| counts(&r.summary)),
                finished => run.and_then(|r| when(r.finished_at)),
            }
        })
        .collect();
    let source = crate::store::sources::get_source(&state.pool, env.id)
        .await
        .ok()
        .flatten();
    Ok(Page::render(
        "previews.html",
        context! {
            title => "Previews",
            me => visitor.context(),
            env => env_ctx,
            previews => rows,
            enabled => env.settings.previews.enabled,
            forks => env.settings.previews.forks,
            posts => source.is_some_and(|s| s.status_repo.is_some() && s.status_token.is_some()),
        },
    ))
}

#[derive(Deserialize)]
struct PageQuery {
    run: Option<uuid::Uuid>,
    page: Option<usize>,
}

async fn preview_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, id)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let axum::Json(PreviewReport {
        preview,
        runs,
        run,
        changes,
    }) = api_previews::get(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), id)),
        Query(RunQuery { run: q.run }),
    )
    .await?;
    let run_ctx = run.as_ref().map(|r| {
        let lines: Vec<SourceLine> =
            serde_json::from_value(r.source_lines.clone()).unwrap_or_default();
        let stages: Vec<Value> = r
            .stages
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                context! {
                    name => s["name"].as_str().unwrap_or("?"),
                    took => s["ms"].as_i64().map(took_ms),
                    ok => s["ok"].as_bool().unwrap_or(false),
                    detail => s["detail"].as_str().unwrap_or(""),
                }
            })
            .collect();
        let diagnostics: Vec<Value> = r
            .diagnostics
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                let p = &d["primary"];
                context! {
                    message => d["message"].as_str().unwrap_or(""),
                    file => p["file"].as_str(),
                    line => p["line"].as_u64(),
                    column => p["column"].as_u64(),
                    snippet => snippet(p, &lines),
                }
            })
            .collect();
        context! {
            id => r.id.to_string(),
            status => r.status.clone(),
            head => r.head.clone(),
            base => r.base.clone(),
            merge => r.merge.clone(),
            merge_source => r.merge_source.clone(),
            trigger => r.trigger.clone(),
            diff_base => r.diff_base,
            counts => (r.status == "success").then(|| counts(&r.summary)),
            handler_code => r.summary["handler_code"].as_array().map(|a| a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect::<Vec<_>>()),
            withheld => r.summary["withheld_values"].as_i64().unwrap_or(0),
            error => r.error.clone(),
            requested => when(Some(r.requested_at)),
            finished => when(r.finished_at),
            stages => stages,
            diagnostics => diagnostics,
            stdout => r.stdout.clone(),
            stderr => r.stderr.clone(),
        }
    });
    let (shown, pager) = super::versions::preview_changes_page(&changes, q.page.unwrap_or(1));
    let run_list: Vec<Value> = runs
        .iter()
        .map(|r| {
            context! {
                id => r.id.to_string(),
                head => short(&r.head).to_string(),
                status => r.status.clone(),
                changes => (r.status == "success").then(|| counts(&r.summary)),
                requested => when(Some(r.requested_at)),
            }
        })
        .collect();
    let page_url = format!(
        "/console/env/{}/previews/{}{}",
        env.id,
        preview.id,
        q.run.map_or(String::new(), |r| format!("?run={r}"))
    );
    Ok(Page::render(
        "preview.html",
        context! {
            title => match preview.number { Some(n) => format!("Preview of pull request #{n}"), None => format!("Preview of {}", preview.reference) },
            me => visitor.context(),
            env => env_ctx,
            p => context! {
                id => preview.id.to_string(),
                number => preview.number,
                reference => preview.reference.clone(),
                title => preview.title.clone(),
                url => preview.url.clone().filter(|u| u.starts_with("https://") || u.starts_with("http://")),
                author => preview.author.clone(),
                state => preview.state.clone(),
                fork => preview.fork,
                base_branch => preview.base_branch.clone(),
            },
            run => run_ctx,
            runs => run_list,
            changes => shown,
            pager => pager,
            page_url => page_url,
        },
    ))
}
