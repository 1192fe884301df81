//! `steward param list|get|set|delete` and `steward fact list`: the parameters of an
//! environment (values compiles read with `std::getfact`, set by people or CI) and the facts
//! handlers report about resources.

use std::io::Read;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;

use super::remote::{Remote, print_json, table, when};
use crate::store::facts::{Param, ParameterItem};

#[derive(Subcommand, Debug)]
pub enum ParamCmd {
    /// The environment's parameters (with --resource: that resource's facts).
    List {
        /// A resource id (`type[agent,attribute=value]`): its facts instead.
        #[arg(long, value_name = "ID")]
        resource: Option<String>,
    },
    /// Print a parameter's value (with --json: the whole record).
    Get {
        name: String,
        /// A fact of this resource instead of a parameter.
        #[arg(long, value_name = "ID")]
        resource: Option<String>,
    },
    /// Set a parameter. When its value changes and --recompile is given, or when a version
    /// waited for it (a compile met it as unknown), the model is compiled again.
    Set {
        name: String,
        /// The value (text, at most 64 KiB); `-` reads it from stdin.
        value: String,
        /// Compile the model again if the value changed.
        #[arg(long)]
        recompile: bool,
        /// A fact of this resource instead of a parameter (facts expire unless --no-expire).
        #[arg(long, value_name = "ID")]
        resource: Option<String>,
        /// A fact that never expires.
        #[arg(long, requires = "resource")]
        no_expire: bool,
        /// Keep the value from pull-request previews (branch compiles still read it; a
        /// preview that asks for it finds it unknown). `--secret=false` clears the mark;
        /// without the flag the mark stays as it was.
        #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
        secret: Option<bool>,
    },
    /// Delete a parameter (the model is compiled again: it may have used the value).
    Delete {
        name: String,
        /// A fact of this resource instead of a parameter.
        #[arg(long, value_name = "ID")]
        resource: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum FactCmd {
    /// Facts handlers reported, by resource (an expired one is renewed from its agent).
    List {
        /// Only this resource's facts.
        #[arg(long, value_name = "ID")]
        resource: Option<String>,
    },
}

/// A value on one line of a table: its first line, at most 60 characters.
fn short(value: &str) -> String {
    let line = value.lines().next().unwrap_or("");
    let cut: String = line.chars().take(60).collect();
    if cut.len() < value.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

fn expiry(p: &Param) -> &'static str {
    match (p.expires, p.expired) {
        (false, _) => "never",
        (true, false) => "yes",
        (true, true) => "expired",
    }
}

pub async fn run_param(remote: Remote, cmd: ParamCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    let env = remote.env()?.to_string();
    match cmd {
        ParamCmd::List { resource } => {
            let rows = c
                .list_parameters(&env, Some(resource.as_deref().unwrap_or("")))
                .await?;
            if remote.json {
                print_json(&rows);
                return Ok(ExitCode::SUCCESS);
            }
            if rows.is_empty() {
                println!(
                    "{}",
                    match &resource {
                        Some(r) => format!("no facts of {r}"),
                        None => "no parameters".into(),
                    }
                );
                return Ok(ExitCode::SUCCESS);
            }
            let lines = rows
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        p.source.clone(),
                        when(Some(p.updated)),
                        expiry(p).into(),
                        short(&p.value),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(&["name", "source", "updated", "expires", "value"], lines)
            );
        }
        ParamCmd::Get { name, resource } => {
            let p = c.get_parameter(&env, &name, resource.as_deref()).await?;
            if remote.json {
                print_json(&p);
            } else {
                println!("{}", p.value);
                if p.expired {
                    eprintln!("note: this fact has expired; its agent is asked for it again");
                }
            }
        }
        ParamCmd::Set {
            name,
            value,
            recompile,
            resource,
            no_expire,
            secret,
        } => {
            let value = if value == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .context("reading the value from stdin")?;
                s
            } else {
                value
            };
            let item = ParameterItem {
                name: name.clone(),
                resource_id: resource.clone().unwrap_or_default(),
                value,
                expires: no_expire.then_some(false),
                secret,
                ..ParameterItem::default()
            };
            let out = c.set_parameters(&env, &[item], recompile).await?;
            if remote.json {
                print_json(&out);
                return Ok(ExitCode::SUCCESS);
            }
            let what = match &resource {
                Some(r) => format!("fact {name} of {r}"),
                None => format!("parameter {name}"),
            };
            if out.changed.is_empty() {
                println!("{what}: unchanged");
            } else {
                println!("{what}: set");
            }
            if !out.resolved_versions.is_empty() {
                println!(
                    "it was unknown to version(s) {}: the model is compiled again",
                    out.resolved_versions
                        .iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            } else if recompile && !out.changed.is_empty() {
                println!("the model is compiled again");
            }
        }
        ParamCmd::Delete { name, resource } => {
            c.delete_parameter(&env, &name, resource.as_deref()).await?;
            if remote.json {
                print_json(&serde_json::json!({"deleted": name, "resource_id": resource}));
            } else {
                match &resource {
                    Some(r) => println!("fact {name} of {r} deleted"),
                    None => println!("parameter {name} deleted"),
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run_fact(remote: Remote, cmd: FactCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    let env = remote.env()?.to_string();
    let FactCmd::List { resource } = cmd;
    if resource.as_deref() == Some("") {
        bail!("--resource needs a resource id");
    }
    let rows = c.list_facts(&env, resource.as_deref()).await?;
    if remote.json {
        print_json(&rows);
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        println!("no facts");
        return Ok(ExitCode::SUCCESS);
    }
    let lines = rows
        .iter()
        .map(|p| {
            vec![
                p.resource_id.clone(),
                p.name.clone(),
                p.source.clone(),
                when(Some(p.updated)),
                expiry(p).into(),
                short(&p.value),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["resource", "name", "source", "updated", "expires", "value"],
            lines
        )
    );
    Ok(ExitCode::SUCCESS)
}
