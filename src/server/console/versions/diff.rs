//! A version's page (provenance, decisions, its diff against its predecessor) and the diff of
//! any two versions, both attribute by attribute: the API's `get` and `diff_between` answers,
//! whose updated entries carry `{attribute: {current, desired}}` (the old and the new value).
//! Long diffs are paged by resource.

use axum::extract::{Path, Query, State};
use minijinja::{Value, context};
use serde::Deserialize;

use super::{offers, offers_ctx, origin, when};
use crate::server::AppState;
use crate::server::api_versions;
use crate::server::console::envs::env_context;
use crate::server::console::render::Page;
use crate::server::console::session::Visitor;
use crate::server::error::ApiError;
use crate::server::extract::parse_number;
use crate::store::versions::{self, DiffEntry};

/// Changed resources shown on one page of a diff.
const PER_PAGE: usize = 200;

/// A value as the diff shows it: strings as they are (file contents keep their lines), null
/// marked as such, anything else as JSON.
fn shown(v: &serde_json::Value) -> Value {
    let (text, kind) = match v {
        serde_json::Value::Null => ("null".to_string(), "null"),
        serde_json::Value::String(s) if s.is_empty() => ("\"\"".to_string(), "json"),
        serde_json::Value::String(s) => (s.clone(), "string"),
        other => (
            serde_json::to_string_pretty(other).unwrap_or_default(),
            "json",
        ),
    };
    context! { text => text, kind => kind }
}

/// One changed resource with its changed attributes (old and new value).
fn entry(e: &DiffEntry) -> Value {
    let attrs: Vec<Value> = e
        .attributes
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(name, ch)| {
                    context! {
                        name => name.clone(),
                        old => shown(&ch["current"]),
                        new => shown(&ch["desired"]),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    context! {
        resource_id => e.resource_id.clone(),
        change => e.change.clone(),
        attrs => attrs,
    }
}

/// One page of a diff's entries, and the pager's numbers.
fn page_of(entries: &[DiffEntry], page: usize) -> (Vec<Value>, Value) {
    paged(entries, page, entry)
}

/// One page of a pull-request preview's changes (as a version diff's, with the kinds only a
/// preview has and the requires that changed), and the pager's numbers.
pub(in crate::server::console) fn preview_page_of(
    changes: &[crate::store::previews::PreviewChange],
    page: usize,
) -> (Vec<Value>, Value) {
    paged(changes, page, |c| {
        let e = entry(&DiffEntry {
            resource_id: c.resource_id.clone(),
            change: c.change.clone(),
            attributes: c.attributes.clone(),
        });
        let list = |k: &str| -> Vec<String> {
            c.requires[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect()
        };
        context! { requires_added => list("added"), requires_removed => list("removed"), ..e }
    })
}

fn paged<T>(entries: &[T], page: usize, each: impl Fn(&T) -> Value) -> (Vec<Value>, Value) {
    let pages = entries.len().div_ceil(PER_PAGE).max(1);
    let page = page.clamp(1, pages);
    let shown: Vec<Value> = entries
        .iter()
        .skip((page - 1) * PER_PAGE)
        .take(PER_PAGE)
        .map(each)
        .collect();
    let pager = context! {
        page => page,
        pages => pages,
        first => (page - 1) * PER_PAGE + 1,
        last => ((page - 1) * PER_PAGE + shown.len()),
        total => entries.len(),
    };
    (shown, pager)
}

fn count(entries: &[DiffEntry], kind: &str) -> usize {
    entries.iter().filter(|e| e.change == kind).count()
}

#[derive(Deserialize)]
pub struct PageQuery {
    page: Option<usize>,
}

pub async fn version_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path((key, n)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let n = parse_number(&n)?;
    let axum::Json(d) = api_versions::get(
        State(state.clone()),
        visitor.caller.clone(),
        Path((env.id.to_string(), n.to_string())),
    )
    .await?;
    let v = &d.version;
    let active = versions::active(&state.pool, env.id)
        .await
        .map_err(ApiError::from)?;
    let o = offers(&state, &visitor, &env, v, active);
    let provenance: Vec<Value> = v
        .provenance
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, val)| context! { key => k.clone(), value => shown(val) })
                .collect()
        })
        .unwrap_or_default();
    let approvals: Vec<Value> = d
        .approvals
        .iter()
        .map(|a| {
            context! {
                decision => a.decision.clone(),
                approver => a.approver.clone(),
                at => when(&a.at),
                at_iso => a.at.to_rfc3339(),
                comment => a.comment.clone(),
                hash => a.content_hash.chars().take(12).collect::<String>(),
            }
        })
        .collect();
    let (changes, pager) = page_of(&d.diff, q.page.unwrap_or(1));
    Ok(Page::render(
        "version.html",
        context! {
            title => format!("Version {n} of {}", env.name),
            me => visitor.context(),
            env => env_ctx,
            v => context! {
                number => n,
                status => v.status.clone(),
                active => d.active,
                origin => origin(v),
                uploader => v.uploader.clone(),
                created => when(&v.created_at),
                created_iso => v.created_at.to_rfc3339(),
                released => v.released_at.as_ref().map(when),
                resources => v.resource_count,
                content_hash => v.content_hash.clone(),
                base => v.diff_base,
            },
            provenance => provenance,
            approvals => approvals,
            offers => offers_ctx(&o),
            summary => context! {
                new => count(&d.diff, "new"),
                updated => count(&d.diff, "updated"),
                deleted => count(&d.diff, "deleted"),
            },
            changes => changes,
            pager => pager,
            page_url => format!("/console/env/{}/versions/{n}", env.id),
            from => v.diff_base,
            to => n,
        },
    ))
}

#[derive(Deserialize)]
pub struct DiffQuery {
    from: Option<String>,
    to: Option<String>,
    page: Option<usize>,
}

/// The diff of any two versions (`from` → `to`); without both, the form alone.
pub async fn diff_page(
    State(state): State<AppState>,
    visitor: Visitor,
    Path(key): Path<String>,
    Query(q): Query<DiffQuery>,
) -> Result<Page, Page> {
    let (env, env_ctx) = env_context(&state, &visitor, &key).await?;
    let title = format!("Compare versions of {}", env.name);
    let (Some(from), Some(to)) = (
        q.from.as_deref().filter(|s| !s.trim().is_empty()),
        q.to.as_deref().filter(|s| !s.trim().is_empty()),
    ) else {
        return Ok(Page::render(
            "diff.html",
            context! { title => title, me => visitor.context(), env => env_ctx },
        ));
    };
    let (from, to) = (from.trim(), to.trim());
    let axum::Json(d) = api_versions::diff_between(
        State(state.clone()),
        visitor.caller.clone(),
        Path(env.id.to_string()),
        Query(api_versions::DiffQuery {
            from: from.to_string(),
            to: to.to_string(),
        }),
    )
    .await?;
    let (changes, pager) = page_of(&d.changes, q.page.unwrap_or(1));
    Ok(Page::render(
        "diff.html",
        context! {
            title => format!("Version {} against {} of {}", d.to, d.from, env.name),
            me => visitor.context(),
            env => env_ctx,
            from => d.from,
            to => d.to,
            compared => true,
            summary => context! {
                new => d.summary.new, updated => d.summary.updated, deleted => d.summary.deleted,
            },
            changes => changes,
            pager => pager,
            page_url => format!("/console/env/{}/diff?from={}&to={}", env.id, d.from, d.to),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn e(id: &str) -> DiffEntry {
        DiffEntry {
            resource_id: id.into(),
            change: "updated".into(),
            attributes: json!({"content": {"current": "a\n", "desired": "b\n"}, "mode": {"current": null, "desired": 644}}),
        }
    }

    #[test]
    fn values_keep_strings_and_mark_null() {
        let v = entry(&e("x"));
        let attrs = v.get_attr("attrs").unwrap();
        let content = attrs.get_item(&Value::from(0)).unwrap();
        assert_eq!(content.get_attr("name").unwrap().to_string(), "content");
        let old = content.get_attr("old").unwrap();
        assert_eq!(old.get_attr("text").unwrap().to_string(), "a\n");
        let mode = attrs.get_item(&Value::from(1)).unwrap();
        let old = mode.get_attr("old").unwrap();
        assert_eq!(old.get_attr("kind").unwrap().to_string(), "null");
        assert_eq!(
            mode.get_attr("new")
                .unwrap()
                .get_attr("text")
                .unwrap()
                .to_string(),
            "644"
        );
    }

    #[test]
    fn pages_of_a_long_diff() {
        let entries: Vec<DiffEntry> = (0..450).map(|i| e(&format!("r{i}"))).collect();
        let (shown, pager) = page_of(&entries, 3);
        assert_eq!(shown.len(), 50);
        assert_eq!(pager.get_attr("first").unwrap().as_usize(), Some(401));
        assert_eq!(pager.get_attr("pages").unwrap().as_usize(), Some(3));
        // past the end: the last page
        let (_, pager) = page_of(&entries, 9);
        assert_eq!(pager.get_attr("page").unwrap().as_usize(), Some(3));
        let (shown, pager) = page_of(&[], 1);
        assert!(shown.is_empty());
        assert_eq!(pager.get_attr("total").unwrap().as_usize(), Some(0));
    }
}
