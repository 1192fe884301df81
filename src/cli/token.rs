//! `steward token create|list|revoke`.

use std::process::ExitCode;

use clap::Subcommand;

use super::remote::{Remote, print_json, table, when};

#[derive(Subcommand, Debug)]
pub enum TokenCmd {
    /// Create a token; its secret is printed once. Without --env it is a global admin token.
    Create {
        #[arg(long)]
        name: String,
        /// admin, approver, compiler, agent or viewer
        #[arg(long)]
        role: String,
        /// An agent token may host only these agents (repeatable; default: any agent of
        /// the environment).
        #[arg(long = "agent", value_name = "NAME")]
        agents: Vec<String>,
    },
    /// List the tokens of the environment (--env), or the global ones; --all lists every
    /// token with the environment each belongs to.
    List {
        #[arg(long)]
        all: bool,
    },
    /// Revoke a token by id.
    Revoke { id: String },
}

pub async fn run(remote: Remote, cmd: TokenCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    match cmd {
        TokenCmd::Create { name, role, agents } => {
            let t = if agents.is_empty() {
                c.create_token(&name, &role, remote.environment.as_deref())
                    .await?
            } else {
                if role != "agent" {
                    anyhow::bail!("--agent limits agent tokens only (use --role agent)");
                }
                c.create_agent_token(&name, remote.env()?, &agents).await?
            };
            if remote.json {
                print_json(&t);
            } else {
                println!(
                    "token {} ({}) created; its secret, shown only now:",
                    t["name"].as_str().unwrap_or(""),
                    t["id"].as_str().unwrap_or("")
                );
                println!("{}", t["secret"].as_str().unwrap_or(""));
            }
        }
        TokenCmd::List { all } => {
            let ts = c.tokens(remote.environment.as_deref(), all).await?;
            // environments by name, so a scoped token says where it belongs
            let names: std::collections::HashMap<uuid::Uuid, String> = if all {
                c.environments()
                    .await?
                    .into_iter()
                    .map(|e| (e.id, format!("{}/{}", e.project, e.name)))
                    .collect()
            } else {
                Default::default()
            };
            if remote.json {
                print_json(&ts);
                return Ok(ExitCode::SUCCESS);
            }
            let rows = ts
                .iter()
                .map(|t| {
                    vec![
                        t.id.to_string(),
                        t.name.clone(),
                        t.role.as_str().to_string(),
                        t.environment_id
                            .map(|e| names.get(&e).cloned().unwrap_or_else(|| e.to_string()))
                            .unwrap_or_else(|| "global".into()),
                        if t.revoked_at.is_some() {
                            "revoked".into()
                        } else {
                            "live".into()
                        },
                        when(t.last_used_at),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &["id", "name", "role", "environment", "state", "last used"],
                    rows
                )
            );
        }
        TokenCmd::Revoke { id } => {
            c.revoke_token(&id).await?;
            println!("revoked token {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
