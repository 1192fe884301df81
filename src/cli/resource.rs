//! `steward resource list|show|logs`.

use std::process::ExitCode;

use clap::Subcommand;

use super::remote::{Remote, print_json, table, when};

#[derive(Subcommand, Debug)]
pub enum ResourceCmd {
    /// Resources of the active version with their state.
    List {
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        status: Option<String>,
    },
    /// One resource: attributes, state, history across versions.
    Show { id: String },
    /// The action log of a resource (newest first).
    Logs {
        id: String,
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
}

pub async fn run(remote: Remote, cmd: ResourceCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    let env = remote.env()?.to_string();
    match cmd {
        ResourceCmd::List { agent, status } => {
            let (version, mut rows) = c.resources(&env).await?;
            rows.retain(|r| agent.as_ref().is_none_or(|a| &r.agent == a));
            rows.retain(|r| status.as_ref().is_none_or(|s| &r.status == s));
            if remote.json {
                print_json(&serde_json::json!({"version": version, "resources": rows}));
                return Ok(ExitCode::SUCCESS);
            }
            match version {
                None => println!("no version is active yet"),
                Some(v) => {
                    let lines = rows
                        .iter()
                        .map(|r| {
                            vec![
                                r.resource_id.clone(),
                                r.status.clone(),
                                when(r.last_deployed),
                                r.blocked_reason
                                    .clone()
                                    .or(r.last_message.clone())
                                    .unwrap_or_default(),
                            ]
                        })
                        .collect();
                    println!("version {v}:");
                    print!(
                        "{}",
                        table(&["resource", "status", "last deploy", "detail"], lines)
                    );
                }
            }
        }
        ResourceCmd::Show { id } => {
            let r = c.resource(&env, &id).await?;
            if remote.json {
                print_json(&r);
                return Ok(ExitCode::SUCCESS);
            }
            println!("{}", r["resource_id"].as_str().unwrap_or(""));
            println!(
                "version:  {}{}",
                r["version"],
                if r["in_active_version"] == true {
                    " (active)"
                } else {
                    ""
                }
            );
            let s = &r["state"];
            if !s.is_null() {
                println!("status:   {}", s["status"].as_str().unwrap_or(""));
                println!(
                    "last run: {} ({})",
                    s["last_run"].as_str().unwrap_or(""),
                    s["last_result"].as_str().unwrap_or("-")
                );
                if let Some(reason) = s["blocked_reason"].as_str() {
                    println!("blocked:  {reason}");
                }
            }
            println!("attributes:");
            if let Some(attrs) = r["resource"]["attributes"].as_object() {
                for (k, v) in attrs {
                    println!("  {k} = {v}");
                }
            }
            println!("requires: {}", r["resource"]["requires"]);
            println!("in versions: {}", r["versions"]);
            // what the handler said last time, with the structured fields of its log records
            if let Some(a) = c.actions(&env, Some(&id), 1).await?.into_iter().next() {
                println!("last action:");
                print_action(&a);
            }
        }
        ResourceCmd::Logs { id, limit } => {
            let actions = c.actions(&env, Some(&id), limit).await?;
            if remote.json {
                print_json(&actions);
                return Ok(ExitCode::SUCCESS);
            }
            for a in actions {
                print_action(&a);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One action of the log: when, what, how it ended, and its log records with their fields.
fn print_action(a: &crate::store::actions::ActionRecord) {
    println!(
        "{} {} v{} {} {}",
        when(Some(a.started_at)),
        a.action,
        a.version,
        a.status,
        if a.change == "nochange" {
            String::new()
        } else {
            a.change.clone()
        }
    );
    if let Some(lines) = a.messages.as_array() {
        for l in lines {
            let fields = l["fields"]
                .as_object()
                .filter(|f| !f.is_empty())
                .map(|f| format!(" {}", serde_json::Value::Object(f.clone())))
                .unwrap_or_default();
            println!(
                "    {} {}{fields}",
                l["level"].as_str().unwrap_or(""),
                l["message"].as_str().unwrap_or("")
            );
        }
    }
}
