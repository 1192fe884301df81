//! The sticky comment of a pull request: one per pull request and editing token, a section
//! per environment previewing it, rendered when it is delivered (so queued updates coalesce
//! into the newest state) and edited in place on every push.

use std::fmt::Write as _;

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::store::previews::{self as store_previews, Preview, PreviewChange, Run};
use crate::store::sources::SourceRow;
use crate::store::{self, StoreError};

/// Longest body posted (GitHub takes 65,536 characters).
const MAX_BODY: usize = 60_000;
/// Resources listed per environment; the rest is counted.
const MAX_LISTED: usize = 40;
/// Longest value shown.
const MAX_VALUE: usize = 300;

/// The comment's first line: which installation's comment it is (two never edit each
/// other's).
pub fn marker(installation: Uuid) -> String {
    format!("<!-- steward:preview installation={installation} -->")
}

/// Where a source's comments go: (host, repo, digest of the token), or none without a
/// status API and token.
pub fn comment_key(src: &SourceRow) -> Option<(String, String, String)> {
    use sha2::Digest;
    let api = super::super::feedback::api_base(src)?;
    let repo = src.status_repo.as_deref()?.trim_matches('/').to_string();
    let token = src.status_token.as_deref()?;
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    Some((format!("{} {api}", src.status_kind), repo, digest))
}

/// One environment's part of the comment.
pub struct Section {
    pub environment: String,
    pub preview: Preview,
    pub run: Option<Run>,
    pub changes: Vec<PreviewChange>,
    /// Values to hide (the environment's secret ones).
    pub secrets: Vec<String>,
    /// The console page of the preview, when the server knows its public address.
    pub link: Option<String>,
}

/// Everything the comment of pull request `number` shows for the sources sharing `src`'s
/// comment key.
pub async fn sections(
    pool: &PgPool,
    src: &SourceRow,
    number: i32,
) -> Result<Vec<Section>, StoreError> {
    let Some(key) = comment_key(src) else {
        return Ok(Vec::new());
    };
    let sources = store::sources::list_sources(pool).await?;
    let envs: Vec<Uuid> = sources
        .iter()
        .filter(|s| comment_key(s).as_ref() == Some(&key))
        .map(|s| s.environment_id)
        .collect();
    let previews = store_previews::of_pull_request(pool, &envs, number).await?;
    let ids: Vec<Uuid> = previews.iter().map(|p| p.id).collect();
    let mut runs = store_previews::newest_runs(pool, &ids).await?;
    let mut out = Vec::new();
    for p in previews {
        let env = store::environments::get_environment(pool, p.environment_id).await?;
        let run = runs.remove(&p.id);
        let changes = match &run {
            Some(r) if r.status == "success" => {
                store_previews::changes(pool, r.id, MAX_LISTED as i64 + 1).await?
            }
            _ => Vec::new(),
        };
        out.push(Section {
            environment: format!("{}/{}", env.project, env.name),
            secrets: store::facts::secret_values(pool, p.environment_id).await?,
            link: None,
            preview: p,
            run,
            changes,
        });
    }
    Ok(out)
}

/// Counts of a run's summary: (+, ~, −).
pub fn counts(summary: &Value) -> (i64, i64, i64) {
    let n = |k: &str| summary[k].as_i64().unwrap_or(0);
    (
        n("new"),
        n("updated") + n("undefined") + n("withheld") + n("requires"),
        n("deleted"),
    )
}

/// The counts as every place shows them: `+1 ~2 −0`.
pub fn counts_text(summary: &Value) -> String {
    let (a, c, d) = counts(summary);
    format!("+{a} ~{c} −{d}")
}

/// What a preview was diffed against, in words.
pub fn against(base: Option<i32>) -> String {
    base.map_or("no active version".into(), |b| format!("version {b}"))
}

fn short(c: &str) -> &str {
    &c[..c.len().min(7)]
}

/// A value as an inline code span: cut, without backticks or table bars, hidden when it
/// holds a secret value.
fn shown(v: &Value, secrets: &[String]) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Null => "(none)".to_string(),
        other => other.to_string(),
    };
    if secrets
        .iter()
        .any(|s| s.len() >= 4 && text.contains(s.as_str()))
    {
        return "(hidden: contains a secret value)".into();
    }
    let mut cut: String = text.chars().take(MAX_VALUE).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    let clean = cut
        .replace('`', "'")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ");
    format!("`{clean}`")
}

/// Plain text from the host or a commit, safe in Markdown and HTML.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('|', "\\|")
        .replace(['\n', '\r'], " ")
}

fn state_of(p: &Preview, run: Option<&Run>) -> String {
    match p.state.as_str() {
        "merged" => return "closed (merged)".into(),
        "closed" => return "closed".into(),
        _ => {}
    }
    match run.map(|r| r.status.as_str()) {
        Some("success") => "✅ compiles".into(),
        Some("failed") => "❌ fails".into(),
        Some("queued") => "⏳ queued".into(),
        Some("running") => "⏳ previewing".into(),
        Some("skipped") => "not previewed".into(),
        Some("superseded") => "superseded".into(),
        _ => "—".into(),
    }
}

/// The comment's body.
pub fn render(installation: Uuid, sections: &[Section]) -> String {
    let mut b = String::new();
    let _ = writeln!(b, "{}", marker(installation));
    let _ = writeln!(b, "### Steward preview\n");
    let _ = writeln!(
        b,
        "What merging this pull request would change, per environment.\n"
    );
    let _ = writeln!(b, "| environment | commit | result | + | ~ | − |");
    let _ = writeln!(b, "|---|---|---|---|---|---|");
    for s in sections {
        let run = s.run.as_ref();
        let (a, c, d) = match run {
            Some(r) if r.status == "success" => {
                let (a, c, d) = counts(&r.summary);
                (a.to_string(), c.to_string(), d.to_string())
            }
            _ => ("".into(), "".into(), "".into()),
        };
        let _ = writeln!(
            b,
            "| {} | {} | {} | {a} | {c} | {d} |",
            escape(&s.environment),
            run.map_or(String::new(), |r| format!("`{}`", short(&r.head))),
            state_of(&s.preview, run),
        );
    }
    for s in sections {
        let mut part = String::new();
        section(&mut part, s);
        if b.len() + part.len() > MAX_BODY {
            let _ = writeln!(
                b,
                "\n**{}**: too long to show here{}",
                escape(&s.environment),
                s.link
                    .as_ref()
                    .map_or(String::new(), |l| format!(": [the preview]({l})"))
            );
            continue;
        }
        b.push_str(&part);
    }
    b
}

fn section(b: &mut String, s: &Section) {
    let Some(run) = &s.run else {
        return;
    };
    let env = escape(&s.environment);
    match run.status.as_str() {
        "success" => {
            let (a, c, d) = counts(&run.summary);
            let against = match run.diff_base {
                Some(v) => format!("against active version {v}"),
                None => "against no active version".into(),
            };
            let _ = writeln!(
                b,
                "\n<details open><summary><b>{env}</b>: +{a} ~{c} −{d} {against}</summary>\n"
            );
            if s.changes.is_empty() {
                let _ = writeln!(b, "No resource changes.");
            }
            for ch in s.changes.iter().take(MAX_LISTED) {
                change(b, ch, &s.secrets);
            }
            let total = a + c + d;
            if s.changes.len() > MAX_LISTED || total as usize > MAX_LISTED {
                let _ = writeln!(
                    b,
                    "\n… and {} more{}",
                    (total as usize).saturating_sub(MAX_LISTED),
                    s.link
                        .as_ref()
                        .map_or(String::new(), |l| format!(": [all changes]({l})"))
                );
            }
            if let Some(types) = run.summary["handler_code"].as_array()
                && !types.is_empty()
            {
                let names: Vec<String> = types
                    .iter()
                    .filter_map(|t| t.as_str())
                    .map(|t| format!("`{}`", escape(t)))
                    .collect();
                let _ = writeln!(b, "\nHandler code changes for {}.", names.join(", "));
            }
            if let Some(d) = run.summary.get("dryrun").filter(|d| d.is_object()) {
                let _ = writeln!(
                    b,
                    "\nA dry-run of the {} added or changed resources runs on the agents with \
                     the handler code of active version {}, not this pull request's: \
                     `steward dryrun show {}`.",
                    d["total"],
                    d["version"],
                    d["id"].as_str().unwrap_or_default()
                );
            }
            if run.summary["withheld_values"].as_i64().unwrap_or(0) > 0 {
                let _ = writeln!(
                    b,
                    "\n{} secret value(s) were not given to this preview.",
                    run.summary["withheld_values"]
                );
            }
            let _ = writeln!(b, "\n</details>");
        }
        "failed" => {
            let _ = writeln!(
                b,
                "\n<details open><summary><b>{env}</b>: fails</summary>\n\n{}\n",
                escape(run.error.as_deref().unwrap_or("failed"))
            );
            diagnostics(b, run);
            let _ = writeln!(b, "</details>");
        }
        "skipped" => {
            let _ = writeln!(
                b,
                "\n**{env}**: {}",
                escape(run.error.as_deref().unwrap_or("not previewed"))
            );
        }
        _ => {}
    }
}

fn change(b: &mut String, ch: &PreviewChange, secrets: &[String]) {
    let what = match ch.change.as_str() {
        "new" => "added",
        "deleted" => "removed",
        "undefined" => "would become undefined",
        "withheld" => "not previewed: depends on a secret value",
        "requires" => "requires changed",
        _ => "changed",
    };
    let _ = writeln!(b, "- `{}` {what}", ch.resource_id.replace('`', "'"));
    if let Some(attrs) = ch.attributes.as_object() {
        for (name, c) in attrs {
            let _ = writeln!(
                b,
                "  - `{}`: {} → {}",
                name.replace('`', "'"),
                shown(&c["current"], secrets),
                shown(&c["desired"], secrets)
            );
        }
    }
    for (k, sign) in [("added", "+"), ("removed", "−")] {
        for r in ch.requires[k].as_array().into_iter().flatten() {
            let _ = writeln!(
                b,
                "  - requires {sign} `{}`",
                r.as_str().unwrap_or_default().replace('`', "'")
            );
        }
    }
}

fn diagnostics(b: &mut String, run: &Run) {
    let lines: Vec<crate::sources::compile::SourceLine> =
        serde_json::from_value(run.source_lines.clone()).unwrap_or_default();
    for d in run.diagnostics.as_array().into_iter().flatten().take(5) {
        let p = &d["primary"];
        let (file, line) = (p["file"].as_str(), p["line"].as_u64());
        let _ = writeln!(
            b,
            "- `{}:{}:{}`: {}",
            file.unwrap_or("?").replace('`', "'"),
            line.unwrap_or(0),
            p["column"].as_u64().unwrap_or(0),
            escape(d["message"].as_str().unwrap_or_default())
        );
        if let (Some(f), Some(l)) = (file, line)
            && let Some(src) = lines.iter().find(|s| s.file == f && s.line as u64 == l)
        {
            let _ = writeln!(b, "  ```\n  {}\n  ```", src.text.replace("```", "'''"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn preview() -> Preview {
        Preview {
            id: Uuid::nil(),
            environment_id: Uuid::nil(),
            reference: "refs/pull/7/head".into(),
            number: Some(7),
            base_branch: "main".into(),
            head_repo: None,
            fork: false,
            title: "t".into(),
            url: None,
            author: None,
            state: "open".into(),
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
            closed_at: None,
        }
    }

    fn run(status: &str) -> Run {
        Run {
            id: Uuid::nil(),
            preview_id: Uuid::nil(),
            environment_id: Uuid::nil(),
            head: "abcdef1234567890".into(),
            base: None,
            merge: None,
            merge_source: None,
            trigger: "webhook".into(),
            status: status.into(),
            diff_base: Some(4),
            summary: json!({"new": 0, "updated": 2, "deleted": 0}),
            stages: json!([]),
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            diagnostics: json!([]),
            source_lines: json!([]),
            error: None,
            requested_at: chrono::Utc::now(),
            started_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn values_are_cut_escaped_and_secrets_hidden() {
        let ch = PreviewChange {
            resource_id: "std::File[h,path=/a]".into(),
            change: "updated".into(),
            attributes: json!({
                "content": {"current": "a`b|c", "desired": "x".repeat(400)},
                "password": {"current": "old", "desired": "pw=hunter22"},
            }),
            requires: json!({}),
        };
        let s = Section {
            environment: "p/prod".into(),
            preview: preview(),
            run: Some(run("success")),
            changes: vec![ch],
            secrets: vec!["hunter22".into()],
            link: None,
        };
        let body = render(Uuid::nil(), &[s]);
        assert!(body.starts_with(&marker(Uuid::nil())));
        assert!(body.contains("+0 ~2 −0 against active version 4"), "{body}");
        assert!(body.contains("`a'b\\|c`"), "{body}");
        assert!(body.contains(&format!("`{}…`", "x".repeat(300))));
        assert!(body.contains("(hidden: contains a secret value)"));
        assert!(!body.contains("hunter22"));
    }
}
