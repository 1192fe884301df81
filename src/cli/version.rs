//! `steward version list|show|diff|release|reject|rollback|delete`.

use std::process::ExitCode;

use clap::Subcommand;

use super::remote::{Remote, print_json, table};

#[derive(Subcommand, Debug)]
pub enum VersionCmd {
    /// List the versions of the environment (newest first).
    List,
    /// Show one version: provenance, approvals, its changes.
    Show { number: i32 },
    /// Changes of version N against its predecessor, or between FROM and TO.
    Diff {
        /// N, or FROM when TO is given
        number: i32,
        to: Option<i32>,
    },
    /// Release (approve) a version.
    Release {
        number: i32,
        #[arg(long, short = 'm', default_value = "")]
        comment: String,
    },
    /// Reject a version (it can not be released afterwards).
    Reject {
        number: i32,
        #[arg(long, short = 'm', default_value = "")]
        comment: String,
    },
    /// Roll back: a new version with the content of version N, released at once.
    Rollback {
        number: i32,
        #[arg(long, short = 'm', default_value = "")]
        comment: String,
    },
    /// Delete a version (never the active one).
    Delete { number: i32 },
    /// Deploy progress of a version: resources by state (exit 1 when some failed).
    Progress {
        number: i32,
        /// Wait until the deploy of the version is done (also while it waits for approval
        /// or the environment is halted; exit 1 if it is rejected or replaced meanwhile).
        #[arg(long)]
        wait: bool,
    },
}

fn print_changes(changes: &serde_json::Value) {
    let Some(list) = changes.as_array() else {
        return;
    };
    if list.is_empty() {
        println!("no changes");
        return;
    }
    for c in list {
        let kind = c["change"].as_str().unwrap_or("");
        let mark = match kind {
            "new" => "+",
            "deleted" => "-",
            _ => "~",
        };
        println!("{mark} {}", c["resource_id"].as_str().unwrap_or(""));
        if let Some(attrs) = c["attributes"].as_object() {
            for (a, ch) in attrs {
                println!("    {a}: {} -> {}", ch["current"], ch["desired"]);
            }
        }
    }
}

pub async fn run(remote: Remote, cmd: VersionCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    let env = remote.env()?.to_string();
    match cmd {
        VersionCmd::List => {
            let vs = c.versions(&env).await?;
            if remote.json {
                print_json(&vs);
                return Ok(ExitCode::SUCCESS);
            }
            let rows = vs
                .iter()
                .map(|v| {
                    let s = &v["diff_summary"];
                    vec![
                        format!(
                            "{}{}",
                            v["number"],
                            if v["active"] == true { "*" } else { "" }
                        ),
                        v["status"].as_str().unwrap_or("").into(),
                        v["created_at"]
                            .as_str()
                            .unwrap_or("")
                            .chars()
                            .take(19)
                            .collect(),
                        v["uploader"].as_str().unwrap_or("").into(),
                        v["resource_count"].to_string(),
                        format!("+{} ~{} -{}", s["new"], s["updated"], s["deleted"]),
                        v["provenance"]["commit"]
                            .as_str()
                            .map(|c| c.chars().take(10).collect())
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "version",
                        "status",
                        "created",
                        "by",
                        "resources",
                        "changes",
                        "commit"
                    ],
                    rows
                )
            );
        }
        VersionCmd::Show { number } => {
            let v = c.version(&env, number).await?;
            if remote.json {
                print_json(&v);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "version {}{}",
                v["number"],
                if v["active"] == true { " (active)" } else { "" }
            );
            println!("status:       {}", v["status"].as_str().unwrap_or(""));
            println!(
                "created:      {} by {}",
                v["created_at"].as_str().unwrap_or(""),
                v["uploader"].as_str().unwrap_or("")
            );
            println!("origin:       {}", v["origin"].as_str().unwrap_or(""));
            println!("resources:    {}", v["resource_count"]);
            println!("content hash: {}", v["content_hash"].as_str().unwrap_or(""));
            println!("provenance:   {}", v["provenance"]);
            let u = &v["unknowns"];
            if u["total"].as_u64().unwrap_or(0) > 0 {
                println!(
                    "unknowns:     {} ({} known now)",
                    u["total"], u["known_now"]
                );
                if u["waiting_for_export"] == true {
                    println!(
                        "waiting for facts: {} of its unknown values are known now; run `steward export` again to make a version that uses them",
                        u["known_now"]
                    );
                }
            }
            if let Some(approvals) = v["approvals"].as_array() {
                for a in approvals {
                    println!(
                        "{}:      {} by {} at {} {}",
                        a["decision"].as_str().unwrap_or(""),
                        a["content_hash"]
                            .as_str()
                            .unwrap_or("")
                            .chars()
                            .take(12)
                            .collect::<String>(),
                        a["approver"].as_str().unwrap_or(""),
                        a["at"].as_str().unwrap_or(""),
                        a["comment"]
                            .as_str()
                            .map(|c| format!("({c})"))
                            .unwrap_or_default()
                    );
                }
            }
            println!("changes against version {}:", v["diff_base"]);
            print_changes(&v["diff"]);
        }
        VersionCmd::Diff { number, to } => {
            let d = match to {
                Some(to) => c.diff(&env, number, to).await?,
                None => {
                    let v = c.version(&env, number).await?;
                    serde_json::json!({"from": v["diff_base"], "to": number, "changes": v["diff"]})
                }
            };
            if remote.json {
                print_json(&d);
            } else {
                println!("version {} -> {}", d["from"], d["to"]);
                print_changes(&d["changes"]);
            }
        }
        VersionCmd::Release { number, comment } => {
            let v = c.release(&env, number, &comment).await?;
            if remote.json {
                print_json(&v);
            } else {
                println!(
                    "released version {} (content hash {})",
                    v.number, v.content_hash
                );
            }
        }
        VersionCmd::Reject { number, comment } => {
            let v = c.reject(&env, number, &comment).await?;
            if remote.json {
                print_json(&v);
            } else {
                println!("rejected version {}", v.number);
            }
        }
        VersionCmd::Rollback { number, comment } => {
            let v = c.rollback(&env, number, &comment).await?;
            if remote.json {
                print_json(&v);
            } else {
                println!(
                    "rolled back: version {} has the content of version {number} and is released; automatic release is now held: new versions wait for `steward version release N` until `steward env resume-auto-release`",
                    v.number
                );
            }
        }
        VersionCmd::Delete { number } => {
            c.delete_version(&env, number).await?;
            println!("deleted version {number}");
        }
        VersionCmd::Progress { number, wait } => {
            return super::control::progress(&remote, number, wait).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}
