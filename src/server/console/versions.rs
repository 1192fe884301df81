//! Versions: the list of an environment's versions with what each role may do to them
//! (release or approve, reject, roll back, dry-run), each action behind a confirmation page
//! that says what it will do; a version's details and diffs ([`diff`]); dry-run reports
//! ([`dryruns`]). Every read and every change goes through the REST API's handlers with the
//! visitor's caller, so the console offers and does exactly what the token may.

mod diff;
pub(super) use diff::preview_page_of as preview_changes_page;
mod dryruns;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use serde::Deserialize;

use super::envs::env_context;
use super::render::Page;
use super::session::Visitor;
use crate::server::auth::Perm;
use crate::server::error::ApiError;
use crate::server::extract::{OptionalJson, parse_number};
use crate::server::{AppState, api_deploy, api_versions};
use crate::store::environments::Environment;
use crate::store::versions::{self, VersionInfo};

/// This module's templates (registered by [`super::render`]).
pub const TEMPLATES: &[(&str, &str)] = &[
    ("versions.html", include_str!("templates/versions.html")),
    ("version.html", include_str!("templates/version.html")),
    ("diff.html", include_str!("templates/diff.html")),
    (
        "diff_entries.html",
        include_str!("templates/diff_entries.html"),
    ),
    ("diff_form.html", include_str!("templates/diff_form.html")),
    (
        "version_origin.html",
        include_str!("templates/version_origin.html"),
    ),
    (
        "version_confirm.html",
        include_str!("templates/version_confirm.html"),
    ),
    ("dryruns.html", include_str!("templates/dryruns.html")),
    ("dryrun.html", include_str!("templates/dryrun.html")),
];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/env/{env}/versions", get(list))
        .route("/console/env/{env}/versions/{n}", get(diff::version_page))
        .route(
            "/console/env/{env}/versions/{n}/confirm/{action}",
            get(confirm),
        )
        .route("/console/env/{env}/versions/{n}/{action}", post(act))
        .route("/console/env/{env}/diff", get(diff::diff_page))
        .route("/console/env/{env}/dryruns", get(dryruns::list))
        .route("/console/env/{env}/dryruns/{id}", get(dryruns::report))
}

/// Versions shown on one page of the list.
const PAGE: i64 = 50;

/// A time as the pages show it (UTC, to the second).
pub(super) fn when(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `+new ~updated -deleted` of a diff summary (stored or computed).
fn summary_counts(s: &serde_json::Value) -> (i64, i64, i64) {
    let n = |k: &str| s[k].as_i64().unwrap_or(0);
    (n("new"), n("updated"), n("deleted"))
}

/// Where a version comes from, for people: push, a git commit (short sha, message) or a
/// rollback of an older version.
pub(super) fn origin(v: &VersionInfo) -> Value {
    let p = &v.provenance;
    let text = |k: &str| p[k].as_str().map(str::to_string);
    let commit = text("commit");
    context! {
        kind => v.origin.clone(),
        commit => commit.clone(),
        short => commit.map(|c| c.chars().take(10).collect::<String>()),
        message => text("message").map(|m| m.lines().next().unwrap_or("").to_string()),
        branch => text("branch"),
        rollback_of => p["rollback_of"].as_i64(),
    }
}

/// What may be done to a version, by whom (the API's permissions) and in which state (what
/// the API would accept): the links the list and the version page offer.
pub(super) struct Offers {
    pub release: bool,
    pub reject: bool,
    pub rollback: bool,
    pub dryrun: bool,
}

pub(super) fn offers(
    state: &AppState,
    visitor: &Visitor,
    env: &Environment,
    v: &VersionInfo,
    active: Option<i32>,
) -> Offers {
    let may = |perm| visitor.caller.require(perm, Some(env.id)).is_ok();
    let (release, manage) = (may(Perm::Release), may(Perm::Manage));
    let is_new = v.status == "new";
    Offers {
        // an older version than the active one is rolled back to, not released
        release: release && is_new && active.is_none_or(|a| v.number > a),
        reject: release && is_new,
        rollback: release && v.status == "released" && active != Some(v.number),
        dryrun: manage && state.schedulers.is_some() && v.status != "rejected",
    }
}

fn offers_ctx(o: &Offers) -> Value {
    context! { release => o.release, reject => o.reject, rollback => o.rollback, dryrun => o.dryrun }
}

#[derive(Deserialize)]
struct ListQuery {
    before: Option<String>,
    done: Option<String>,
    n: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let before = match q.before.as_deref() {
        None | Some("") => None,
        Some(b) => Some(parse_number(b)?),
    };
    let axum::Json(items) = api_versions::list(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        Query(api_versions::ListQuery {
            limit: Some(PAGE + 1),
            before,
        }),
    )
    .await?;
    let active = versions::active(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?;
    let more = items.len() as i64 > PAGE;
    let mut rows = Vec::new();
    let mut any_action = false;
    for item in items.iter().take(PAGE as usize) {
        let v = &item.version;
        let o = offers(&state, &visitor, &env, v, active);
        any_action |= o.release || o.reject || o.rollback || o.dryrun;
        let (new, updated, deleted) = summary_counts(&v.diff_summary);
        rows.push(context! {
            number => v.number,
            origin => origin(v),
            uploader => v.uploader.clone(),
            created => when(&v.created_at),
            created_iso => v.created_at.to_rfc3339(),
            released => v.released_at.as_ref().map(when),
            released_iso => v.released_at.as_ref().map(|t| t.to_rfc3339()),
            status => v.status.clone(),
            active => item.active,
            resources => v.resource_count,
            base => v.diff_base,
            new => new, updated => updated, deleted => deleted,
            approvals => item.approvals,
            offers => offers_ctx(&o),
        });
    }
    let older = more.then(|| items[PAGE as usize - 1].version.number);
    let done = done_message(q.done.as_deref(), q.n.as_deref());
    Ok(Page::render(
        "versions.html",
        context! {
            title => format!("Versions of {}", env.name),
            me => visitor.context(),
            env => env_ctx,
            versions => rows,
            any_action => any_action,
            approval => !env.settings.auto_release || env.auto_release_held,
            held => env.auto_release_held,
            older => older,
            paged => before.is_some(),
            done => done,
        },
    ))
}

/// The line the list shows after a change made from the console.
fn done_message(done: Option<&str>, n: Option<&str>) -> Option<String> {
    let n: i32 = n?.parse().ok()?;
    Some(match done? {
        "reject" => format!("Version {n} was rejected."),
        "rollback" => format!("Rolled back: version {n} is released and deploying."),
        _ => return None,
    })
}

/// What an action is, for the confirmation page and the form it posts.
#[derive(Clone, Copy, PartialEq)]
enum Action {
    Release,
    Reject,
    Rollback,
    Dryrun,
}

impl Action {
    fn parse(s: &str) -> Result<Action, Page> {
        Ok(match s {
            "release" => Action::Release,
            "reject" => Action::Reject,
            "rollback" => Action::Rollback,
            "dryrun" => Action::Dryrun,
            other => {
                return Err(ApiError::not_found(format!("no version action '{other}'")).into());
            }
        })
    }

    fn perm(self) -> Perm {
        match self {
            Action::Dryrun => Perm::Manage,
            _ => Perm::Release,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Action::Release => "release",
            Action::Reject => "reject",
            Action::Rollback => "rollback",
            Action::Dryrun => "dryrun",
        }
    }
}

/// What changes when the active version is replaced by `to`'s content: the API's diff
/// between the two (everything is new when nothing is released yet).
async fn change_against_active(
    state: &AppState,
    visitor: &Visitor,
    env: &Environment,
    active: Option<i32>,
    to: &VersionInfo,
) -> Result<(i64, i64, i64), Page> {
    let Some(a) = active else {
        return Ok((to.resource_count as i64, 0, 0));
    };
    let axum::Json(d) = api_versions::diff_between(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        Query(api_versions::DiffQuery {
            from: a.to_string(),
            to: to.number.to_string(),
        }),
    )
    .await?;
    Ok((
        d.summary.new as i64,
        d.summary.updated as i64,
        d.summary.deleted as i64,
    ))
}

/// Why an action can not be done to a version now.
fn not_offered(action: Action, v: &VersionInfo, active: Option<i32>, state: &AppState) -> String {
    let n = v.number;
    match action {
        Action::Dryrun if state.schedulers.is_none() => {
            "This server runs without schedulers: dry-runs do not run here.".into()
        }
        Action::Dryrun => format!("Version {n} was rejected: there is nothing to dry-run."),
        Action::Release if v.status == "new" => format!(
            "Version {n} is older than the active version {}: roll back to it instead.",
            active.unwrap_or(0)
        ),
        Action::Rollback if active == Some(n) => {
            format!("Version {n} is the active version already.")
        }
        Action::Rollback => format!("Version {n} was never released: release it instead."),
        _ => format!("Version {n} is {} already.", v.status),
    }
}

fn changes_text((n, u, d): (i64, i64, i64)) -> String {
    let total = n + u + d;
    let what = if total == 1 {
        "resource changes"
    } else {
        "resources change"
    };
    format!("{total} {what} (+{n} ~{u} -{d})")
}

/// The confirmation page of an action: exactly what it will do, and the form that does it.
async fn confirm(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, n, action)): Path<(String, String, String)>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let action = Action::parse(&action)?;
    visitor.caller.require(action.perm(), Some(env.id))?;
    let n = parse_number(&n)?;
    let axum::Json(detail) = api_versions::get(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), n.to_string())),
    )
    .await?;
    let v = &detail.version;
    let active = versions::active(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?;
    let o = offers(&state, &visitor, &env, v, active);
    let offered = match action {
        Action::Release => o.release,
        Action::Reject => o.reject,
        Action::Rollback => o.rollback,
        Action::Dryrun => o.dryrun,
    };
    if !offered {
        // say so now rather than after the button (the API would refuse it the same way)
        return Err(ApiError::conflict(not_offered(action, v, active, &state)).into());
    }
    let full = format!("{}/{}", env.project, env.name);
    let mut explain = Vec::new();
    let deploying = if state.schedulers.is_none() {
        "this server runs without schedulers, so nothing deploys here"
    } else if env.halted {
        "the environment is halted: deploying starts when it is resumed"
    } else {
        "the scheduler starts deploying at once"
    };
    let against = |a: Option<i32>| match a {
        Some(a) => format!("against the active version {a}"),
        None => "nothing is released yet".to_string(),
    };
    let mut hash = None;
    let (heading, button, danger) = match action {
        Action::Release => {
            let change = change_against_active(&state, &visitor, &env, active, v).await?;
            explain.push(format!(
                "Release version {n} of {full}: {} ({}); {deploying}.",
                changes_text(change),
                against(active)
            ));
            let needs_approval = !env.settings.auto_release || env.auto_release_held;
            explain.push(format!(
                "Your release is recorded as an approval by {} bound to the version's content hash {}: it is refused if version {n} is not exactly that content.",
                visitor.caller.name,
                &v.content_hash[..v.content_hash.len().min(12)]
            ));
            if env.auto_release_held {
                explain.push(
                    "Releasing by hand also lifts the hold a rollback put on automatic release."
                        .into(),
                );
            }
            hash = Some(v.content_hash.clone());
            if needs_approval {
                (
                    format!("Approve and release version {n}"),
                    "Approve and release",
                    false,
                )
            } else {
                (format!("Release version {n}"), "Release", false)
            }
        }
        Action::Reject => {
            explain.push(format!(
                "Reject version {n} of {full}: it is never deployed, and it can not be released afterwards."
            ));
            explain.push(match active {
                Some(a) => format!("The active version {a} stays as it is."),
                None => "Nothing is released in this environment yet.".into(),
            });
            (format!("Reject version {n}"), "Reject", true)
        }
        Action::Rollback => {
            let change = change_against_active(&state, &visitor, &env, active, v).await?;
            let newest = versions::list(&state.pool, env.id, 1, None)
                .await
                .map_err(ApiError::from)?
                .first()
                .map(|v| v.number)
                .unwrap_or(n);
            explain.push(format!(
                "Roll {full} back to version {n}: a new version {} with version {n}'s content ({} resources) is made and released at once; {} ({}); {deploying}.",
                newest + 1,
                v.resource_count,
                changes_text(change),
                against(active)
            ));
            explain.push("Automatic release is then held: newer versions wait for an explicit release until the hold is lifted.".into());
            (format!("Roll back to version {n}"), "Roll back", true)
        }
        Action::Dryrun => {
            explain.push(format!(
                "Dry-run version {n} of {full}: each of its {} resources is read on its target and compared with version {n}; nothing is changed and nothing is released.",
                v.resource_count
            ));
            explain.push(
                "The report opens when the dry-run starts and fills in as resources are read."
                    .into(),
            );
            (format!("Dry-run version {n}"), "Start the dry-run", false)
        }
    };
    Ok(Page::render(
        "version_confirm.html",
        context! {
            title => heading.clone(),
            me => visitor.context(),
            env => env_ctx,
            heading => heading,
            explain => explain,
            action => format!("/console/env/{}/versions/{n}/{}", env.id, action.name()),
            button => button,
            danger => danger,
            comment => action != Action::Dryrun,
            content_hash => hash,
            back => format!("/console/env/{}/versions", env.id),
        },
    ))
}

#[derive(Deserialize)]
struct ActForm {
    csrf: Option<String>,
    #[serde(default)]
    comment: String,
    content_hash: Option<String>,
}

/// Do an action (the form of its confirmation page), through the API's handler.
async fn act(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, n, action)): Path<(String, String, String)>,
    Form(form): Form<ActForm>,
) -> Result<Response, Page> {
    visitor.check_csrf(form.csrf.as_deref())?;
    let (env, _) = env_context(&state, &visitor, &key).await?;
    let action = Action::parse(&action)?;
    let (s, c) = (State(state.clone()), visitor.caller.clone());
    let path = Path((env.id.to_string(), n.clone()));
    let decision = || {
        OptionalJson(api_versions::Decision {
            comment: form.comment.trim().to_string(),
            content_hash: form.content_hash.clone().filter(|h| !h.is_empty()),
        })
    };
    let to = match action {
        Action::Release => {
            let _ = api_versions::release(s, c, path, decision()).await?;
            format!("/console/env/{}", env.id)
        }
        Action::Reject => {
            let _ = api_versions::reject(s, c, path, decision()).await?;
            format!("/console/env/{}/versions?done=reject&n={n}", env.id)
        }
        Action::Rollback => {
            let (_, axum::Json(made)) = api_versions::rollback(s, c, path, decision()).await?;
            format!(
                "/console/env/{}/versions?done=rollback&n={}",
                env.id, made.info.number
            )
        }
        Action::Dryrun => {
            let number = parse_number(&n)?;
            let (_, axum::Json(started)) = api_deploy::start_dryrun(
                s,
                c,
                Path(env.id.to_string()),
                OptionalJson(api_deploy::DryrunBody {
                    version: Some(number),
                }),
            )
            .await?;
            format!("/console/env/{}/dryruns/{}", env.id, started.id)
        }
    };
    tracing::info!(environment = %env.id, version = %n, by = %visitor.caller.name,
        "version {} from the console", action.name());
    Ok(Redirect::to(&to).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_lines() {
        assert_eq!(changes_text((1, 2, 0)), "3 resources change (+1 ~2 -0)");
        assert_eq!(changes_text((0, 1, 0)), "1 resource changes (+0 ~1 -0)");
    }

    #[test]
    fn done_lines() {
        assert_eq!(
            done_message(Some("reject"), Some("7")).as_deref(),
            Some("Version 7 was rejected.")
        );
        assert_eq!(done_message(Some("x"), Some("7")), None);
        assert_eq!(done_message(Some("reject"), Some("<b>")), None);
    }
}
