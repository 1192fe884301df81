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
    /// Lift the hold a rollback puts on automatic release: new versions are released as they
    /// arrive again (when `auto_release` is on).
    ResumeAutoRelease,
}

/// How automatic release is shown: on, off, or on but held by a rollback.
fn auto_release_shown(on: bool, held: bool) -> String {
    match (on, held) {
        (false, _) => "off".into(),
        (true, false) => "on".into(),
        (true, true) => "held (rollback; steward env resume-auto-release)".into(),
    }
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
                            auto_release_shown(e.settings.auto_release, e.auto_release_held),
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
                let held = c.environment(env).await?["auto_release_held"] == true;
                let rows = obj
                    .iter()
                    .map(|(k, v)| {
                        let shown = match (k.as_str(), v) {
                            ("auto_release", serde_json::Value::Bool(on)) => {
                                auto_release_shown(*on, held)
                            }
                            _ => v.to_string(),
                        };
                        vec![k.clone(), shown]
                    })
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
        EnvCmd::ResumeAutoRelease => {
            let env = remote.env()?;
            let r = c.resume_auto_release(env).await?;
            if remote.json {
                print_json(&r);
            } else if r["was_held"] != true {
                println!("automatic release was not held");
            } else if r["auto_release"] == true {
                println!("automatic release resumed: new versions are released as they arrive");
            } else {
                println!("hold lifted (auto_release is off: versions still wait for a release)");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
