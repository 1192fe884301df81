//! `steward source set|show|remove|trigger|timeline` and `steward compile-report list|show`:
//! an environment that follows a git branch, and what happened to its commits.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use serde_json::{Value, json};

use super::remote::{Remote, print_json, table};

// parsed once per run: the size of the biggest variant costs nothing
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum SourceCmd {
    /// Follow a git branch: only committed models reach the environment from then on.
    /// On a source that exists, only the options given change; the others keep their values.
    Set {
        /// Repository: file:///path, /path, https://host/repo.git, ssh://git@host/repo.git
        url: String,
        /// Branch to follow (default main).
        #[arg(long)]
        branch: Option<String>,
        /// Sub-directory holding the project (monorepos; default the repository root).
        #[arg(long)]
        path: Option<String>,
        /// HTTPS token (read from this file; never shown again).
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// SSH private key (read from this file); needs --known-hosts.
        #[arg(long, value_name = "FILE")]
        ssh_key_file: Option<PathBuf>,
        /// known_hosts lines for the SSH host (read from this file).
        #[arg(long, value_name = "FILE")]
        known_hosts: Option<PathBuf>,
        /// Secret that webhooks must be signed with (omit: webhooks are refused).
        #[arg(long, env = "STEWARD_WEBHOOK_SECRET", hide_env_values = true)]
        webhook_secret: Option<String>,
        /// Seconds between polls of the branch (0: no polling; default 60).
        #[arg(long)]
        poll_interval: Option<i32>,
        /// Do not watch a repository on this machine for pushes (file:// and paths).
        #[arg(long, conflicts_with = "watch")]
        no_watch: bool,
        /// Watch a repository on this machine for pushes again (the default).
        #[arg(long)]
        watch: bool,
        /// Seconds a compile may take (default 600).
        #[arg(long)]
        compile_timeout: Option<i32>,
        /// Commit status on the git host: github or gitea.
        #[arg(long, requires_all = ["status_repo", "status_token_file"])]
        status_kind: Option<String>,
        /// API base URL of the git host (Gitea: its URL; GitHub: default api.github.com).
        #[arg(long)]
        status_api_url: Option<String>,
        /// owner/name of the repository on the git host.
        #[arg(long)]
        status_repo: Option<String>,
        /// Token for the status API (read from this file).
        #[arg(long, value_name = "FILE")]
        status_token_file: Option<PathBuf>,
        /// URL receiving signed pipeline events (received, compiled, released, deployed …).
        #[arg(long)]
        notify_url: Option<String>,
        /// Secret the events are signed with (X-Steward-Signature: sha256=HMAC).
        #[arg(long, env = "STEWARD_NOTIFY_SECRET", hide_env_values = true)]
        notify_secret: Option<String>,
    },
    /// Show the source (secrets show only as set or not).
    Show,
    /// Stop following git: the environment takes pushed versions again.
    Remove,
    /// Fetch now and compile the branch tip, or a commit on the branch.
    Trigger { commit: Option<String> },
    /// What happened to a commit: received, compiled, version, released, deployed.
    Timeline { commit: String },
}

#[derive(Subcommand, Debug)]
pub enum CompileReportCmd {
    /// Recent compiles of the environment, newest first.
    List {
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// One compile: stages with timings, output and diagnostics.
    Show { id: String },
}

fn read_secret(path: &Option<PathBuf>) -> anyhow::Result<Option<String>> {
    path.as_ref()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))
                .map(|s| s.trim_end().to_string())
        })
        .transpose()
}

fn short(c: &Value) -> String {
    c.as_str()
        .map(|s| s.chars().take(10).collect())
        .unwrap_or_default()
}

pub async fn run_source(remote: Remote, cmd: SourceCmd) -> anyhow::Result<ExitCode> {
    let env = remote.env()?.to_string();
    let c = &remote.client;
    match cmd {
        SourceCmd::Set {
            url,
            branch,
            path,
            token_file,
            ssh_key_file,
            known_hosts,
            webhook_secret,
            poll_interval,
            no_watch,
            watch,
            compile_timeout,
            status_kind,
            status_api_url,
            status_repo,
            status_token_file,
            notify_url,
            notify_secret,
        } => {
            // only what is given changes: an update keeps the other options as they are
            let mut body = serde_json::Map::new();
            let mut put = |k: &str, v: serde_json::Value| {
                if !v.is_null() {
                    body.insert(k.into(), v);
                }
            };
            put("url", json!(url));
            put("branch", json!(branch));
            put("path", json!(path));
            put("poll_interval", json!(poll_interval));
            put("compile_timeout", json!(compile_timeout));
            put(
                "watch",
                if no_watch {
                    json!(false)
                } else if watch {
                    json!(true)
                } else {
                    json!(null)
                },
            );
            put("token", json!(read_secret(&token_file)?));
            put("ssh_key", json!(read_secret(&ssh_key_file)?));
            put("known_hosts", json!(read_secret(&known_hosts)?));
            put("webhook_secret", json!(webhook_secret));
            put("notify_url", json!(notify_url));
            put("notify_secret", json!(notify_secret));
            if let Some(kind) = status_kind {
                put(
                    "status",
                    json!({
                        "kind": kind, "api_url": status_api_url, "repo": status_repo,
                        "token": read_secret(&status_token_file)?.unwrap_or_default(),
                    }),
                );
            }
            let s = c
                .patch_source(&env, &serde_json::Value::Object(body))
                .await?;
            if remote.json {
                print_json(&s);
            } else {
                println!(
                    "{env} follows {} branch {}; uploads are refused from now on",
                    s["url"].as_str().unwrap_or(""),
                    s["branch"].as_str().unwrap_or("")
                );
                println!(
                    "webhook URL: {}/api/v1/environments/{}/source/webhook",
                    c.base(),
                    s["environment_id"].as_str().unwrap_or("")
                );
            }
        }
        SourceCmd::Show => {
            let s = c.source(&env).await?;
            if remote.json {
                print_json(&s);
            } else {
                for (k, v) in s.as_object().into_iter().flatten() {
                    println!(
                        "{k:18} {}",
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string())
                    );
                }
            }
        }
        SourceCmd::Remove => {
            c.delete_source(&env).await?;
            println!("{env} no longer follows git");
        }
        SourceCmd::Trigger { commit } => {
            let t = c.trigger_compile(&env, commit.as_deref()).await?;
            if remote.json {
                print_json(&t);
            } else if t["status"] == "already_compiled" {
                println!(
                    "commit {} was compiled before (compile {})",
                    short(&t["commit"]),
                    t["compile"].as_str().unwrap_or("")
                );
            } else {
                println!(
                    "commit {} queued for compile {}",
                    short(&t["commit"]),
                    t["compile"].as_str().unwrap_or("")
                );
            }
        }
        SourceCmd::Timeline { commit } => {
            let t = c.commit_timeline(&env, &commit).await?;
            if remote.json {
                print_json(&t);
                return Ok(ExitCode::SUCCESS);
            }
            println!("commit {}", t["commit"].as_str().unwrap_or(""));
            let rows = t["events"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    vec![
                        e["at"].as_str().unwrap_or("").chars().take(23).collect(),
                        e["event"].as_str().unwrap_or("").to_string(),
                        e["detail"].to_string(),
                    ]
                })
                .collect();
            print!("{}", table(&["at", "event", "detail"], rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run_report(remote: Remote, cmd: CompileReportCmd) -> anyhow::Result<ExitCode> {
    let env = remote.env()?.to_string();
    let c = &remote.client;
    match cmd {
        CompileReportCmd::List { limit } => {
            let l = c.compiles(&env, limit).await?;
            if remote.json {
                print_json(&l);
                return Ok(ExitCode::SUCCESS);
            }
            let rows = l
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    vec![
                        r["id"].as_str().unwrap_or("").to_string(),
                        short(&r["commit"]),
                        r["trigger"].as_str().unwrap_or("").to_string(),
                        r["status"].as_str().unwrap_or("").to_string(),
                        r["requested_at"]
                            .as_str()
                            .unwrap_or("")
                            .chars()
                            .take(19)
                            .collect(),
                        r["version"]
                            .as_i64()
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r["error"].as_str().unwrap_or("").chars().take(60).collect(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "id",
                        "commit",
                        "trigger",
                        "status",
                        "requested",
                        "version",
                        "error"
                    ],
                    rows
                )
            );
        }
        CompileReportCmd::Show { id } => {
            let r = c.compile_report(&env, &id).await?;
            if remote.json {
                print_json(&r);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "compile {} of commit {} ({}, {})",
                r["id"].as_str().unwrap_or(""),
                r["commit"].as_str().unwrap_or(""),
                r["branch"].as_str().unwrap_or(""),
                r["trigger"].as_str().unwrap_or("")
            );
            println!(
                "status:  {}{}",
                r["status"].as_str().unwrap_or(""),
                r["version"]
                    .as_i64()
                    .map(|v| format!(" → version {v}"))
                    .unwrap_or_default()
            );
            if let Some(e) = r["error"].as_str() {
                println!("error:   {e}");
            }
            for s in r["stages"].as_array().into_iter().flatten() {
                println!(
                    "  {:9} {:>6} ms  {}  {}",
                    s["name"].as_str().unwrap_or(""),
                    s["ms"],
                    if s["ok"] == true { "ok    " } else { "FAILED" },
                    s["detail"].as_str().unwrap_or("")
                );
            }
            for d in r["diagnostics"].as_array().into_iter().flatten() {
                let p = &d["primary"];
                match p["file"].as_str() {
                    Some(file) => {
                        println!(
                            "{file}:{}:{}: {}",
                            p["line"],
                            p["column"],
                            d["message"].as_str().unwrap_or("")
                        );
                        // the model's line, as the commit has it, with a caret under the column
                        let text = r["source_lines"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|l| l["file"].as_str() == Some(file) && l["line"] == p["line"]);
                        if let Some(text) = text.and_then(|l| l["text"].as_str()) {
                            let col = p["column"].as_u64().unwrap_or(1).max(1) as usize;
                            let pad: String = text
                                .chars()
                                .take(col - 1)
                                .map(|c| if c == '\t' { '\t' } else { ' ' })
                                .collect();
                            println!("  | {text}\n  | {pad}^");
                        }
                    }
                    None => println!("{}", d["message"].as_str().unwrap_or("")),
                }
            }
            let out = r["stdout"].as_str().unwrap_or("");
            if !out.is_empty() {
                println!("--- output\n{out}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
