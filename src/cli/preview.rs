//! `steward preview list|show|run`: pull-request previews of an environment — what merging a
//! pull request would change there, compiled without secret values. Never a version.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde_json::Value;

use super::remote::{Remote, print_json, table};

#[derive(Subcommand, Debug)]
pub enum PreviewCmd {
    /// Previews of the environment, open ones first.
    List {
        /// Closed and merged ones too.
        #[arg(long)]
        all: bool,
    },
    /// A preview: its newest run's stages, diagnostics and changes, attribute by attribute.
    Show {
        /// The preview's id, or `#N` / `N` for pull request N.
        id: String,
    },
    /// Preview a ref by hand: merged onto the environment's branch and compiled, then diffed
    /// against the active version.
    Run {
        /// `refs/pull/N/head`, `refs/heads/BRANCH` or a full commit id.
        #[arg(long = "ref", value_name = "REF")]
        reference: String,
        /// The pull request it is (its commit status and comment are posted then).
        #[arg(long = "pr", value_name = "N")]
        number: Option<i32>,
        /// Wait for the run to finish and show it.
        #[arg(long)]
        wait: bool,
    },
}

use crate::sources::previews::comment::{against, counts_text as counts};

fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
}

pub async fn run(remote: Remote, cmd: PreviewCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    let env = remote.env()?.to_string();
    match cmd {
        PreviewCmd::List { all } => {
            let list = c.previews(&env, if all { "all" } else { "open" }).await?;
            if remote.json {
                print_json(&list);
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<Vec<String>> = list
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let run = &p["run"];
                    vec![
                        p["number"].as_i64().map_or_else(
                            || p["ref"].as_str().unwrap_or("").to_string(),
                            |n| format!("#{n}"),
                        ),
                        p["state"].as_str().unwrap_or("").into(),
                        run["status"].as_str().unwrap_or("-").into(),
                        short(run["head"].as_str().unwrap_or("")).into(),
                        if run["status"] == "success" {
                            counts(&run["summary"])
                        } else {
                            String::new()
                        },
                        p["title"].as_str().unwrap_or("").chars().take(50).collect(),
                    ]
                })
                .collect();
            if rows.is_empty() {
                println!("no previews");
            } else {
                print!(
                    "{}",
                    table(&["pr", "state", "status", "head", "changes", "title"], rows)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        PreviewCmd::Show { id } => {
            let p = c.preview(&env, id.trim_start_matches('#')).await?;
            if remote.json {
                print_json(&p);
                return Ok(ExitCode::SUCCESS);
            }
            Ok(show(&p))
        }
        PreviewCmd::Run {
            reference,
            number,
            wait,
        } => {
            let q = c.preview_run(&env, &reference, number).await?;
            if !wait {
                if remote.json {
                    print_json(&q);
                } else {
                    println!(
                        "{}: preview {} run {}",
                        q["status"].as_str().unwrap_or(""),
                        q["preview"].as_str().unwrap_or("-"),
                        q["run"].as_str().unwrap_or("-")
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            let (Some(preview), Some(run)) = (q["preview"].as_str(), q["run"].as_str()) else {
                anyhow::bail!("nothing was queued: {}", q["reason"].as_str().unwrap_or(""));
            };
            let started = Instant::now();
            loop {
                let p = c.preview(&env, preview).await?;
                let status = p["run"]["status"].as_str().unwrap_or("");
                let ours = p["run"]["id"].as_str() == Some(run);
                if !ours || !matches!(status, "queued" | "running") {
                    if remote.json {
                        print_json(&p);
                        return Ok(ExitCode::SUCCESS);
                    }
                    return Ok(show(&p));
                }
                if started.elapsed() > Duration::from_secs(900) {
                    anyhow::bail!("the preview did not finish in 15 minutes");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Print a preview report; failure when its run failed.
fn show(p: &Value) -> ExitCode {
    let pr = &p["preview"];
    let run = &p["run"];
    println!(
        "preview {} of {} ({}){}",
        pr["id"].as_str().unwrap_or(""),
        pr["ref"].as_str().unwrap_or(""),
        pr["state"].as_str().unwrap_or(""),
        pr["title"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map_or(String::new(), |t| format!(": {t}"))
    );
    if run.is_null() {
        println!("no run yet");
        return ExitCode::SUCCESS;
    }
    println!(
        "run {}: {} (head {}, merge {} by {})",
        run["id"].as_str().unwrap_or(""),
        run["status"].as_str().unwrap_or(""),
        short(run["head"].as_str().unwrap_or("")),
        short(run["merge"].as_str().unwrap_or("-")),
        run["merge_source"].as_str().unwrap_or("-"),
    );
    for s in run["stages"].as_array().into_iter().flatten() {
        println!(
            "  {:<18} {:>6} ms  {}{}",
            s["name"].as_str().unwrap_or(""),
            s["ms"],
            if s["ok"] == true { "" } else { "FAILED: " },
            s["detail"]
                .as_str()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    if let Some(e) = run["error"].as_str() {
        println!("error: {e}");
    }
    for d in run["diagnostics"].as_array().into_iter().flatten().take(10) {
        let at = &d["primary"];
        println!(
            "  {}:{}:{}: {}",
            at["file"].as_str().unwrap_or("?"),
            at["line"],
            at["column"],
            d["message"].as_str().unwrap_or("")
        );
    }
    if run["status"] == "success" {
        println!(
            "{} against {}",
            counts(&run["summary"]),
            against(run["diff_base"].as_i64().map(|v| v as i32))
        );
        for ch in p["changes"].as_array().into_iter().flatten() {
            println!(
                "{} {}",
                ch["change"].as_str().unwrap_or(""),
                ch["resource_id"].as_str().unwrap_or("")
            );
            for (name, v) in ch["attributes"].as_object().into_iter().flatten() {
                println!("    {name}: {} -> {}", v["current"], v["desired"]);
            }
            for (k, sign) in [("added", "+"), ("removed", "-")] {
                for r in ch["requires"][k].as_array().into_iter().flatten() {
                    println!("    requires {sign} {}", r.as_str().unwrap_or(""));
                }
            }
        }
    }
    if run["status"] == "failed" {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
