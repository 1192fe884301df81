//! Environments: the list with their health, one environment's live progress, agents and
//! controls (deploy, repair, halt, pause), its settings, and the live-update stream.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Path, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use minijinja::{Value, context};
use serde_json::json;

use super::render::{Page, val};
use super::session::Visitor;
use crate::server::api_deploy::{self, Progress};
use crate::server::auth::{Perm, allowed};
use crate::server::error::ApiError;
use crate::server::extract::{OptionalJson, environment};
use crate::server::{AppState, Event, api_envs};
use crate::store::changes::Change;
use crate::store::environments::Environment;
use crate::store::{self, versions};

/// This module's templates (registered by [`super::render`]).
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "environments.html",
        include_str!("templates/environments.html"),
    ),
    (
        "environment.html",
        include_str!("templates/environment.html"),
    ),
    ("settings.html", include_str!("templates/settings.html")),
];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/", get(list))
        .route("/console/env/{env}", get(overview))
        .route("/console/env/{env}/events", get(events))
        .route("/console/env/{env}/control/{what}", post(control))
        .route(
            "/console/env/{env}/agents/{agent}/{what}",
            post(agent_control),
        )
        .route(
            "/console/env/{env}/settings",
            get(settings_page).post(save_settings),
        )
}

/// What the templates of every environment page know: the environment, and what the
/// visitor may do there (the API's permission table, so buttons match what would succeed).
pub async fn env_context(
    state: &AppState,
    visitor: &Visitor,
    key: &str,
) -> Result<(Environment, Value), Page> {
    let env = environment(state, &visitor.caller, key).await?;
    let may = |perm| {
        visitor.caller.sees(env.id)
            && allowed(visitor.caller.role, visitor.caller.is_global(), perm)
    };
    let ctx = context! {
        id => env.id.to_string(),
        name => env.name.clone(),
        project => env.project.clone(),
        halted => env.halted,
        git => env.settings.source == crate::model::settings::SourceKind::Git,
        can_release => may(Perm::Release),
        can_manage => may(Perm::Manage),
        can_upload => may(Perm::Upload),
    };
    Ok((env, ctx))
}

/// The progress of the active version (None: nothing released yet); `env` is one the
/// visitor may see.
async fn active_progress(
    state: &AppState,
    env: &Environment,
) -> Result<Option<Progress>, ApiError> {
    let Some(active) = versions::active(&state.pool, env.id).await? else {
        return Ok(None);
    };
    Ok(Some(api_deploy::progress_now(state, env.id, active).await?))
}

/// The live document of an environment page (also what the event stream sends).
fn progress_json(p: Option<&Progress>, halted: bool, waiting: i64) -> serde_json::Value {
    match p {
        None => json!({"version": null, "phase": "nothing released", "percent": 0, "total": 0,
                       "pending": 0, "failed": 0, "by_status": {}, "working_on": [],
                       "halted": halted, "waiting": waiting, "health": "none"}),
        Some(p) => {
            let settled = p.total - p.pending;
            let percent = if p.total == 0 {
                100
            } else {
                settled * 100 / p.total
            };
            json!({
                "version": p.version, "phase": p.phase, "percent": percent, "total": p.total,
                "settled": settled, "pending": p.pending, "failed": p.failed,
                "by_status": p.by_status, "working_on": p.working_on, "halted": halted,
                "waiting": waiting, "health": health(Some(p), halted, waiting),
            })
        }
    }
}

/// One word for how an environment is doing (shown with its colour and as text).
fn health(p: Option<&Progress>, halted: bool, waiting: i64) -> &'static str {
    match p {
        None => "none",
        Some(p) if p.failed > 0 => "failing",
        Some(_) if halted => "halted",
        Some(p) if !p.done => "deploying",
        Some(_) if waiting > 0 => "waiting",
        Some(_) => "healthy",
    }
}

async fn list(State(state): State<AppState>, visitor: Visitor) -> Result<Page, Page> {
    let axum::Json(envs) =
        api_envs::list_environments(State(state.clone()), visitor.caller.clone()).await?;
    let envs: Vec<Environment> = serde_json::from_value(envs)
        .map_err(|e| ApiError::internal(format!("environment list: {e}")))?;
    let mut rows = Vec::new();
    for env in &envs {
        let progress = active_progress(&state, env).await?;
        let waiting = versions::waiting(&state.pool, env.id)
            .await
            .map_err(ApiError::from)?;
        let source = store::sources::get_source(&state.pool, env.id)
            .await
            .map_err(ApiError::from)?
            .map(|s| s.view());
        rows.push(context! {
            id => env.id.to_string(),
            project => env.project.clone(),
            name => env.name.clone(),
            live => val(progress_json(progress.as_ref(), env.halted, waiting)),
            source => val(source),
        });
    }
    Ok(Page::render(
        "environments.html",
        context! { title => "Environments", me => visitor.context(), envs => rows },
    ))
}

async fn overview(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let progress = active_progress(&state, &env).await?;
    let waiting = versions::waiting(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?;
    let axum::Json(agents) = api_deploy::list_agents(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
    )
    .await?;
    let source = store::sources::get_source(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?
        .map(|s| s.view());
    Ok(Page::render(
        "environment.html",
        context! {
            title => format!("{} / {}", env.project, env.name),
            me => visitor.context(),
            env => env_ctx,
            live => val(progress_json(progress.as_ref(), env.halted, waiting)),
            agents => val(&agents.agents),
            source => val(source),
            scheduler => state.schedulers.is_some(),
        },
    ))
}

/// Server-sent events: the environment's live document whenever it changes (the scheduler's
/// writes and releases notify through PostgreSQL; settings and controls through the
/// server's notifier). The page makes no request of its own while idle.
async fn events(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
) -> Result<Response, Page> {
    let env = environment(&state, &visitor.caller, &key).await?;
    let mut changes = state.changes.subscribe();
    let mut local = state.notifier.subscribe();
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(8);
    tokio::spawn(async move {
        let mut last = String::new();
        loop {
            if !visitor.still_signed_in(&state.pool).await {
                let _ = tx
                    .send(SseEvent::default().event("signed-out").data("{}"))
                    .await;
                return;
            }
            let env_now = match store::environments::get_environment(&state.pool, env.id).await {
                Ok(e) => e,
                // deleted: say so and end the stream
                Err(store::StoreError::NotFound(_)) => {
                    let _ = tx.send(SseEvent::default().event("gone").data("{}")).await;
                    return;
                }
                Err(_) => env.clone(),
            };
            let progress = active_progress(&state, &env_now).await.ok().flatten();
            let waiting = versions::waiting(&state.pool, env.id).await.unwrap_or(0);
            let doc = progress_json(progress.as_ref(), env_now.halted, waiting).to_string();
            if doc != last {
                if tx
                    .send(SseEvent::default().event("progress").data(&doc))
                    .await
                    .is_err()
                {
                    return; // the page was closed
                }
                last = doc;
            }
            // wait for a change of this environment (or a slow tick, in case a notification
            // was lost while the listener reconnected)
            let tick = tokio::time::sleep(Duration::from_secs(15));
            tokio::pin!(tick);
            loop {
                tokio::select! {
                    _ = &mut tick => break,
                    _ = tx.closed() => return,
                    c = changes.recv() => match c {
                        Ok(Change::Environment(id)) if id == env.id => break,
                        // listening again after a lost connection: changes may have been missed
                        Ok(Change::Listening) => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(_) => { tick.as_mut().await; break; }
                    },
                    e = local.recv() => match e {
                        Ok(Event::Released { environment, .. })
                        | Ok(Event::Settings { environment })
                        | Ok(Event::Control { environment })
                        | Ok(Event::Deleted { environment }) if environment == env.id => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(_) => { tick.as_mut().await; break; }
                    },
                }
            }
            // coalesce a burst of writes into one update (at most ~4 a second)
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(20)))
        .into_response())
}

#[derive(serde::Deserialize)]
struct CsrfOnly {
    csrf: Option<String>,
}

/// Deploy now, repair now, halt, resume.
async fn control(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, what)): Path<(String, String)>,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, Page> {
    visitor.check_csrf(form.csrf.as_deref())?;
    let (env, _) = env_context(&state, &visitor, &key).await?;
    let (s, c, k) = (
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
    );
    let done = match what.as_str() {
        "deploy" => api_deploy::deploy(s, c, k, OptionalJson(Default::default()))
            .await
            .map(|_| "deploy requested"),
        "repair" => api_deploy::repair(s, c, k, OptionalJson(Default::default()))
            .await
            .map(|_| "repair requested"),
        "halt" => api_deploy::halt(s, c, k).await.map(|_| "halted"),
        "resume" => api_deploy::resume(s, c, k).await.map(|_| "resumed"),
        other => Err(ApiError::not_found(format!("no control '{other}'"))),
    }?;
    tracing::info!(environment = %env.id, by = %visitor.caller.name, "{done} from the console");
    Ok(Redirect::to(&format!("/console/env/{}", env.id)).into_response())
}

/// Pause or unpause an agent.
async fn agent_control(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, agent, what)): Path<(String, String, String)>,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, Page> {
    visitor.check_csrf(form.csrf.as_deref())?;
    let (env, _) = env_context(&state, &visitor, &key).await?;
    let path = Path((env.id.to_string(), agent));
    let (s, c) = (State(state.clone()), visitor.caller.clone());
    match what.as_str() {
        "pause" => api_deploy::pause_agent(s, c, path).await.map(|_| ()),
        "unpause" => api_deploy::unpause_agent(s, c, path).await.map(|_| ()),
        other => Err(ApiError::not_found(format!("no agent control '{other}'"))),
    }?;
    Ok(Redirect::to(&format!("/console/env/{}", env.id)).into_response())
}

/// One row of the settings form: the key, its kind (how the form shows and reads it), and
/// the value as text.
fn setting_rows(settings: &serde_json::Value, entered: Option<&[(String, String)]>) -> Vec<Value> {
    let Some(map) = settings.as_object() else {
        return Vec::new();
    };
    map.iter()
        .map(|(k, v)| {
            let kind = match v {
                serde_json::Value::Bool(_) => "bool",
                serde_json::Value::Number(_) => "number",
                serde_json::Value::String(_) => "text",
                _ => "json",
            };
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Number(n) => n.to_string(),
                other => serde_json::to_string_pretty(other).unwrap_or_default(),
            };
            // what the person typed wins over the stored value (after a refusal)
            let text = entered
                .and_then(|e| e.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.clone()))
                .unwrap_or(text);
            let checked = text == "true";
            context! { key => k, kind => kind, value => text, checked => checked }
        })
        .collect()
}

#[derive(serde::Deserialize)]
struct SavedQuery {
    saved: Option<u8>,
}

async fn settings_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    axum::extract::Query(q): axum::extract::Query<SavedQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let axum::Json(settings) = api_envs::get_settings(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
    )
    .await?;
    Ok(Page::render(
        "settings.html",
        context! {
            title => format!("Settings of {}", env.name),
            me => visitor.context(),
            env => env_ctx,
            settings => setting_rows(&settings, None),
            saved => q.saved,
        },
    ))
}

/// The form's changed fields as a settings patch (the API validates it as a whole). A value
/// that does not read as its kind is refused with the key named.
fn settings_patch(
    current: &serde_json::Value,
    form: &[(String, String)],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut patch = serde_json::Map::new();
    let Some(map) = current.as_object() else {
        return Ok(patch);
    };
    for (k, old) in map {
        let sent = form.iter().find(|(fk, _)| fk == k).map(|(_, v)| v.trim());
        let new = match old {
            // an unchecked box is not sent at all
            serde_json::Value::Bool(_) => json!(sent == Some("true")),
            _ => {
                let Some(sent) = sent else { continue };
                match old {
                    serde_json::Value::Number(_) => {
                        if let Ok(n) = sent.parse::<i64>() {
                            json!(n)
                        } else if let Ok(f) = sent.parse::<f64>() {
                            json!(f)
                        } else {
                            return Err(format!("{k}: '{sent}' is not a number"));
                        }
                    }
                    serde_json::Value::String(_) => json!(sent),
                    _ => serde_json::from_str(sent)
                        .map_err(|e| format!("{k}: not valid JSON ({e})"))?,
                }
            }
        };
        if &new != old {
            patch.insert(k.clone(), new);
        }
    }
    Ok(patch)
}

async fn save_settings(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Form(form): Form<Vec<(String, String)>>,
) -> Result<Response, Page> {
    let csrf = form
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str());
    visitor.check_csrf(csrf)?;
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let current = json!(env.settings);
    let refused = |message: String| {
        Page::with_status(
            axum::http::StatusCode::BAD_REQUEST,
            "settings.html",
            context! {
                title => format!("Settings of {}", env.name),
                me => visitor.context(),
                env => env_ctx.clone(),
                settings => setting_rows(&current, Some(&form)),
                error => message,
            },
        )
    };
    let patch = match settings_patch(&current, &form) {
        Ok(p) => p,
        Err(m) => return Ok(refused(m).into_response()),
    };
    if patch.is_empty() {
        return Ok(
            Redirect::to(&format!("/console/env/{}/settings?saved=0", env.id)).into_response(),
        );
    }
    let result = api_envs::update_settings(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        crate::server::extract::ApiJson(serde_json::Value::Object(patch)),
    )
    .await;
    match result {
        Ok(_) => {
            Ok(Redirect::to(&format!("/console/env/{}/settings?saved=1", env.id)).into_response())
        }
        // a value the API refuses: the form again, with what was typed and why
        Err(e) if e.status == axum::http::StatusCode::BAD_REQUEST => {
            Ok(refused(e.message).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_holds_only_what_changed() {
        let current = json!({"auto_release": true, "agent_parallelism": 1, "name": "x", "map": {}});
        let form = vec![
            ("csrf".to_string(), "c".to_string()),
            ("agent_parallelism".into(), "4".into()),
            ("name".into(), "x".into()),
            ("map".into(), "{\"a\": \"local:\"}".into()),
        ];
        let p = settings_patch(&current, &form).unwrap();
        assert_eq!(
            serde_json::Value::Object(p),
            json!({"auto_release": false, "agent_parallelism": 4, "map": {"a": "local:"}})
        );
    }

    #[test]
    fn a_bad_number_names_its_key() {
        let current = json!({"agent_parallelism": 1});
        let form = vec![("agent_parallelism".to_string(), "many".to_string())];
        let e = settings_patch(&current, &form).unwrap_err();
        assert!(e.contains("agent_parallelism") && e.contains("many"), "{e}");
    }
}
