//! `steward env create|list|settings|delete|deploy|repair|halt|resume`.

use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;

use super::remote::{Remote, print_json, table};

#[derive(Subcommand, Debug)]
pub enum EnvCmd {
    /// Create an environment: `steward env create PROJECT/NAME` (the project is created too).
    Create {
        /// PROJECT/NAME
        name: String,
        /// Initial settings, KEY=VALUE (repeatable); see `steward env settings`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// List the environments this token can see.
    List,
    /// Show the settings of the environment (--env), or change them with --set KEY=VALUE.
    Settings {
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Delete the environment (--env) and everything in it.
    Delete,
    /// Deploy what is not deployed yet in the environment (--env), now.
    Deploy(super::control::TriggerArgs),
    /// Verify every resource of the environment (--env) and restore drift, now.
    Repair(super::control::TriggerArgs),
    /// Halt the environment: no new deploy action starts until `resume`.
    Halt,
    /// Resume a halted environment.
    Resume,
}

/// `key=value` pairs into a JSON object; values are JSON when they parse as JSON.
pub fn settings_patch(pairs: &[String]) -> anyhow::Result<serde_json::Value> {
    let mut m = serde_json::Map::new();
    for p in pairs {
        let Some((k, v)) = p.split_once('=') else {
            bail!("'{p}' is not KEY=VALUE");
        };
        let value =
            serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()));
        m.insert(k.trim().to_string(), value);
    }
    Ok(serde_json::Value::Object(m))
}

pub async fn run(remote: Remote, cmd: EnvCmd) -> anyhow::Result<ExitCode> {
    let c = &remote.client;
    match cmd {
        EnvCmd::Create { name, set } => {
            let Some((project, env)) = name.split_once('/') else {
                bail!("give the environment as PROJECT/NAME");
            };
            let settings = if set.is_empty() {
                None
            } else {
                Some(settings_patch(&set)?)
            };
            let e = c.create_environment(project, env, settings).await?;
            if remote.json {
                print_json(&e);
            } else {
                println!("created environment {}/{} ({})", e.project, e.name, e.id);
            }
        }
        EnvCmd::List => {
            let envs = c.environments().await?;
            if remote.json {
                print_json(&envs);
            } else {
                let rows = envs
                    .iter()
                    .map(|e| {
                        vec![
                            e.id.to_string(),
                            e.project.clone(),
                            e.name.clone(),
                            format!("{:?}", e.settings.source).to_lowercase(),
                            e.settings.auto_release.to_string(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["id", "project", "name", "source", "auto_release"], rows)
                );
            }
        }
        EnvCmd::Settings { set } => {
            let env = remote.env()?;
            let s = if set.is_empty() {
                c.settings(env).await?
            } else {
                c.update_settings(env, &settings_patch(&set)?).await?
            };
            if remote.json {
                print_json(&s);
            } else if let Some(obj) = s.as_object() {
                let rows = obj
                    .iter()
                    .map(|(k, v)| vec![k.clone(), v.to_string()])
                    .collect();
                print!("{}", table(&["setting", "value"], rows));
            }
        }
        EnvCmd::Delete => {
            let env = remote.env()?;
            c.delete_environment(env).await?;
            println!("deleted environment {env}");
        }
        EnvCmd::Deploy(args) => return super::control::trigger(&remote, false, args).await,
        EnvCmd::Repair(args) => return super::control::trigger(&remote, true, args).await,
        EnvCmd::Halt => return super::control::set_halted(&remote, true).await,
        EnvCmd::Resume => return super::control::set_halted(&remote, false).await,
    }
    Ok(ExitCode::SUCCESS)
}
