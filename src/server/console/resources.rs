//! Resources: the table of a version's resources with their state (filtered, sorted and
//! paged in PostgreSQL by [`store::state::page`], the store function the REST list uses
//! too), and one resource's page: attributes, neighbours, state, why it is blocked, its
//! deploy history, its facts, and its actions with the handler's log lines (from the API's
//! handlers).

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::routing::get;
use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use serde::Deserialize;
use serde_json::json;

use super::envs::env_context;
use super::render::{Page, url_component, val};
use super::session::Visitor;
use crate::server::error::ApiError;
use crate::server::{AppState, api_resources};
use crate::store::state::{Filter, PageRequest, SortKey};
use crate::store::{self, versions};

/// This module's templates (registered by [`super::render`]).
pub const TEMPLATES: &[(&str, &str)] = &[
    ("resources.html", include_str!("templates/resources.html")),
    ("resource.html", include_str!("templates/resource.html")),
];

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/env/{env}/resources", get(list))
        .route("/console/env/{env}/resource", get(resource))
}

/// Rows per page of the table.
pub const PAGE_SIZE: i64 = 50;

/// More agents than this are typed, not chosen from a list (the page stays small).
const AGENT_CHOICES: usize = 200;

/// Dependants listed on a resource page.
const PROVIDES_SHOWN: i64 = 200;

/// Actions listed on a resource page.
const ACTIONS_SHOWN: i64 = 50;

/// The table's query: every value as typed (a bad number is read as the default, not
/// refused: these are links and a form, not an API).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ListParams {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default, rename = "type")]
    rtype: Option<String>,
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    sort: Option<String>,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    page: Option<String>,
}

fn given(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl ListParams {
    fn sort(&self) -> SortKey {
        self.sort
            .as_deref()
            .and_then(SortKey::parse)
            .unwrap_or_default()
    }

    fn desc(&self) -> bool {
        self.order.as_deref() == Some("desc")
    }

    fn page(&self) -> i64 {
        self.page
            .as_deref()
            .and_then(|p| p.trim().parse::<i64>().ok())
            .filter(|p| *p >= 1)
            .unwrap_or(1)
    }

    fn version(&self) -> Option<i32> {
        self.version.as_deref().and_then(|v| v.trim().parse().ok())
    }

    /// This table's address with some values changed (`None` removes one); values that are
    /// their default are left out.
    fn href(&self, env: &str, changes: &[(&str, Option<String>)]) -> String {
        let mut pairs: Vec<(&str, Option<String>)> = vec![
            ("version", given(&self.version)),
            ("state", given(&self.state)),
            ("agent", given(&self.agent)),
            ("type", given(&self.rtype)),
            ("q", given(&self.q)),
            (
                "sort",
                Some(self.sort())
                    .filter(|s| *s != SortKey::Id)
                    .map(|s| s.as_str().into()),
            ),
            ("order", self.desc().then(|| "desc".into())),
            (
                "page",
                Some(self.page()).filter(|p| *p > 1).map(|p| p.to_string()),
            ),
        ];
        for (k, v) in changes {
            if let Some(p) = pairs.iter_mut().find(|(pk, _)| pk == k) {
                p.1 = v.clone();
            }
        }
        let query: Vec<String> = pairs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={}", url_component(&v))))
            .collect();
        let base = format!("/console/env/{env}/resources");
        if query.is_empty() {
            base
        } else {
            format!("{base}?{}", query.join("&"))
        }
    }
}

/// A time as people read it (UTC, to the second).
pub(super) fn when(t: Option<DateTime<Utc>>) -> Option<String> {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

/// One column header: its sort link (the other direction when it is the current sort) and
/// its `aria-sort`.
fn column(p: &ListParams, env: &str, key: SortKey, label: &str) -> Value {
    let current = p.sort() == key;
    let desc_next = current && !p.desc();
    let href = p.href(
        env,
        &[
            ("sort", Some(key.as_str().into())),
            ("order", desc_next.then(|| "desc".into())),
            ("page", None),
        ],
    );
    let aria = match (current, p.desc()) {
        (false, _) => "none",
        (true, false) => "ascending",
        (true, true) => "descending",
    };
    context! { key => key.as_str(), label => label, href => href, current => current, aria_sort => aria }
}

async fn list(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(p): Query<ListParams>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let id = env.id.to_string();
    let version = match p.version() {
        Some(v) => {
            // an unknown version is a wrong link: say so
            versions::get(&state.pool, env.id, v)
                .await
                .map_err(ApiError::from)?;
            Some(v)
        }
        None => versions::active(&state.pool, env.id)
            .await
            .map_err(ApiError::from)?,
    };
    let title = format!("Resources of {}", env.name);
    let Some(version) = version else {
        return Ok(Page::render(
            "resources.html",
            context! { title => title, me => visitor.context(), env => env_ctx, version => () },
        ));
    };
    let page_no = p.page();
    let req = PageRequest {
        version,
        filter: Filter {
            status: given(&p.state),
            agent: given(&p.agent),
            resource_type: given(&p.rtype),
            text: given(&p.q),
        },
        sort: p.sort(),
        desc: p.desc(),
        offset: (page_no - 1) * PAGE_SIZE,
        limit: Some(PAGE_SIZE),
    };
    let page = store::state::page(&state.pool, &state.facets, env.id, &req)
        .await
        .map_err(ApiError::from)?;
    let pages = ((page.total + PAGE_SIZE - 1) / PAGE_SIZE).max(1);
    let rows: Vec<Value> = page
        .rows
        .iter()
        .map(|r| {
            context! {
                id => &r.resource_id,
                href => format!("/console/env/{id}/resource?id={}", url_component(&r.resource_id)),
                rtype => &r.resource_type,
                agent => &r.agent,
                status => &r.status,
                deployed => when(r.last_deployed),
                message => r.last_message.as_deref().or(r.blocked_reason.as_deref()).map(|m| {
                    // one line of it; the resource page has the rest
                    let line = m.lines().next().unwrap_or("");
                    if line.chars().count() > 120 {
                        format!("{}…", line.chars().take(120).collect::<String>())
                    } else {
                        line.to_string()
                    }
                }),
            }
        })
        .collect();
    let all_count: i64 = page.by_status.values().sum();
    let mut chips = vec![context! {
        label => "all", count => all_count, current => given(&p.state).is_none(),
        href => p.href(&id, &[("state", None), ("page", None)]),
    }];
    for (s, n) in &page.by_status {
        chips.push(context! {
            label => s, count => n, current => given(&p.state).as_deref() == Some(s.as_str()),
            href => p.href(&id, &[("state", Some(s.clone())), ("page", None)]),
        });
    }
    // the states offered: those present, and the one asked for even when none match
    let mut states: Vec<String> = page.by_status.keys().cloned().collect();
    if let Some(s) = given(&p.state)
        && !states.contains(&s)
    {
        states.push(s);
    }
    let columns = vec![
        column(&p, &id, SortKey::Id, "Resource"),
        column(&p, &id, SortKey::Type, "Type"),
        column(&p, &id, SortKey::Agent, "Agent"),
        column(&p, &id, SortKey::Status, "State"),
        column(&p, &id, SortKey::Deployed, "Last deploy"),
    ];
    let nav = |n: i64| {
        (n >= 1 && n <= pages && n != page_no)
            .then(|| p.href(&id, &[("page", Some(n.to_string()))]))
    };
    let first_row = if page.total == 0 { 0 } else { req.offset + 1 };
    Ok(Page::render(
        "resources.html",
        context! {
            title => title,
            me => visitor.context(),
            env => env_ctx,
            version => version,
            explicit_version => p.version(),
            rows => rows,
            total => page.total,
            chips => chips,
            columns => columns,
            states => states,
            agents => val(&page.agents),
            agent_choices => page.agents.len() <= AGENT_CHOICES,
            types => val(&page.types),
            f => context! {
                state => given(&p.state), agent => given(&p.agent), rtype => given(&p.rtype),
                q => given(&p.q), sort => p.sort().as_str(), order => p.desc().then_some("desc"),
            },
            paging => context! {
                page => page_no, pages => pages, first_row => first_row,
                last_row => req.offset + page.rows.len() as i64,
                first => nav(1), prev => nav(page_no - 1), next => nav(page_no + 1), last => nav(pages),
            },
            clear => p.href(&id, &[("state", None), ("agent", None), ("type", None), ("q", None), ("page", None)]),
        },
    ))
}

#[derive(Deserialize)]
pub struct ResourceParams {
    #[serde(default)]
    id: Option<String>,
}

/// An attribute's value as shown: text as it is, anything else as pretty JSON.
fn shown(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

async fn resource(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<ResourceParams>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let Some(rid) = given(&q.id) else {
        return Err(ApiError::bad_request("Which resource? The address has no id.").into());
    };
    let axum::Json(detail) = api_resources::get(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), rid.clone())),
    )
    .await?;
    let axum::Json(actions) = api_resources::list_actions(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        Query(api_resources::ActionQuery {
            resource_id: Some(rid.clone()),
            action: None,
            limit: Some(ACTIONS_SHOWN),
        }),
    )
    .await?;
    let shown_version = detail["version"].as_i64().unwrap_or_default() as i32;
    let provides =
        store::state::required_by(&state.pool, env.id, shown_version, &rid, PROVIDES_SHOWN)
            .await
            .map_err(ApiError::from)?;
    let id = env.id.to_string();
    let link = |r: &str| {
        context! { id => r, href => format!("/console/env/{id}/resource?id={}", url_component(r)) }
    };
    let res = &detail["resource"];
    let attributes: Vec<Value> = res["attributes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| context! { key => k, value => shown(v), text => v.is_string() })
                .collect()
        })
        .unwrap_or_default();
    let requires: Vec<Value> = res["requires"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r.as_str()).map(link).collect())
        .unwrap_or_default();
    let provides: Vec<Value> = provides.iter().map(|r| link(r)).collect();
    let actions: Vec<Value> = actions
        .as_array()
        .map(|a| {
            a.iter()
                .map(|a| {
                    let lines: Vec<Value> = a["messages"]
                        .as_array()
                        .map(|m| {
                            m.iter()
                                .map(|l| {
                                    let fields: Vec<Value> = l["fields"]
                                        .as_object()
                                        .map(|f| {
                                            f.iter()
                                                .map(|(k, v)| context! { key => k, value => shown(v) })
                                                .collect()
                                        })
                                        .unwrap_or_default();
                                    context! {
                                        level => l["level"].as_str().unwrap_or(""),
                                        message => l["message"].as_str().unwrap_or(""),
                                        at => l["at"].as_str().map(short_time),
                                        fields => fields,
                                    }
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    context! {
                        action => a["action"].as_str(),
                        status => a["status"].as_str(),
                        change => a["change"].as_str(),
                        version => a["version"].as_i64(),
                        started => a["started_at"].as_str().map(short_time),
                        finished => a["finished_at"].as_str().map(short_time),
                        changes => (a["changes"].as_object().is_some_and(|c| !c.is_empty()))
                            .then(|| serde_json::to_string_pretty(&a["changes"]).unwrap_or_default()),
                        lines => lines,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let provides_capped = provides.len() as i64 >= PROVIDES_SHOWN;
    let actions_capped = actions.len() as i64 >= ACTIONS_SHOWN;
    let st = &detail["state"];
    let state_ctx = (!st.is_null()).then(|| {
        let t = |k: &str| st[k].as_str().map(short_time);
        val(json!({
            "status": st["status"], "last_result": st["last_result"], "last_message": st["last_message"],
            "blocked": st["blocked"], "blocked_reason": st["blocked_reason"], "compliance": st["compliance"],
            "last_attempt": t("last_attempt"), "last_deployed": t("last_deployed"),
            "last_success": t("last_success"), "failure_count": st["failure_count"],
            "next_retry": t("next_retry"),
        }))
    });
    let facts = super::parameters::resource_facts(&state, &visitor, &env, &rid).await?;
    Ok(Page::render(
        "resource.html",
        context! {
            title => rid.clone(),
            me => visitor.context(),
            env => env_ctx,
            rid => rid,
            version => shown_version,
            in_active => detail["in_active_version"].as_bool().unwrap_or(false),
            rtype => res["resource_type"].as_str(),
            agent => res["agent"].as_str(),
            undefined => res["undefined"].as_bool().unwrap_or(false),
            attributes => attributes,
            requires => requires,
            provides => provides,
            provides_capped => provides_capped,
            state => state_ctx,
            changes => val(&detail["changes"]),
            versions => val(&detail["versions"]),
            actions => actions,
            actions_capped => actions_capped,
            facts => facts,
        },
    ))
}

/// An RFC 3339 time from the API, as people read it.
fn short_time(s: &str) -> String {
    DateTime::parse_from_rfc3339(s)
        .map(|t| when(Some(t.with_timezone(&Utc))).unwrap_or_default())
        .unwrap_or_else(|_| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_keep_the_filter_and_drop_defaults() {
        let p = ListParams {
            state: Some("failed".into()),
            q: Some("a b".into()),
            page: Some("3".into()),
            ..Default::default()
        };
        assert_eq!(
            p.href("e", &[]),
            "/console/env/e/resources?state=failed&q=a%20b&page=3"
        );
        assert_eq!(
            p.href("e", &[("page", None), ("sort", Some("agent".into()))]),
            "/console/env/e/resources?state=failed&q=a%20b&sort=agent"
        );
        assert_eq!(
            ListParams::default().href("e", &[]),
            "/console/env/e/resources"
        );
    }

    #[test]
    fn bad_numbers_read_as_defaults() {
        let p = ListParams {
            page: Some("x".into()),
            sort: Some("nope".into()),
            order: Some("sideways".into()),
            ..Default::default()
        };
        assert_eq!((p.page(), p.sort(), p.desc()), (1, SortKey::Id, false));
    }

    #[test]
    fn sorting_by_the_current_column_flips_it() {
        let p = ListParams {
            sort: Some("agent".into()),
            ..Default::default()
        };
        let c = column(&p, "e", SortKey::Agent, "Agent");
        assert_eq!(
            c.get_attr("href").unwrap().to_string(),
            "/console/env/e/resources?sort=agent&order=desc"
        );
        assert_eq!(c.get_attr("aria_sort").unwrap().to_string(), "ascending");
    }
}
