//! Deploy control against a server: `steward env deploy|repair|halt|resume`,
//! `steward agent list|pause|unpause`, `steward dryrun run|list|show`,
//! `steward version progress`. (`steward deploy` without a subcommand group is the embedded
//! all-in-one of a project directory; these act on a server's environment.)

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::remote::{Remote, print_json, table};

/// `--agent` / `--resource` narrowing of a user deploy or repair.
#[derive(Args, Debug, Clone, Default)]
pub struct TriggerArgs {
    /// Only the resources of this agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only this resource (its full id, e.g. 'fs::File[host,path=/etc/motd]').
    #[arg(long)]
    pub resource: Option<String>,
}

pub async fn trigger(remote: &Remote, repair: bool, args: TriggerArgs) -> anyhow::Result<ExitCode> {
    let env = remote.env()?;
    let r = remote
        .client
        .trigger(env, repair, args.agent.as_deref(), args.resource.as_deref())
        .await?;
    if remote.json {
        print_json(&r);
    } else {
        let what = if repair { "repair" } else { "deploy" };
        println!("{what}: {} resource(s) scheduled", r["scheduled"]);
        if r["halted"] == true {
            println!("note: the environment is halted; nothing runs until `steward env resume`");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn set_halted(remote: &Remote, halted: bool) -> anyhow::Result<ExitCode> {
    let env = remote.env()?;
    let r = remote.client.set_halted(env, halted).await?;
    if remote.json {
        print_json(&r);
    } else if halted {
        println!("halted: no new deploy action starts in this environment");
    } else {
        println!("resumed");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Subcommand, Debug)]
pub enum AgentCmd {
    /// The agents of the environment with their state and work.
    List,
    /// Pause an agent: once this returns, none of its actions starts (running ones finish).
    Pause { name: String },
    /// Let a paused agent work again.
    Unpause { name: String },
    /// Host agents of the environment on this machine: connect out to the server (nothing
    /// listens here) and run their actions in local executors. Needs an agent token of the
    /// environment (`steward token create --role agent --agent NAME`) and the agents placed
    /// `external` (setting agent_map, or std::AgentConfig(uri="external") in the model).
    /// Runs until interrupted; with several processes for one agent, one is primary and the
    /// others stand by.
    Run {
        /// An agent to host (repeat for several).
        #[arg(long = "name", required = true, value_name = "AGENT")]
        names: Vec<String>,
        /// Where fetched handler code is cached [default: $XDG_CACHE_HOME/steward/agent,
        /// or ~/.cache/steward/agent]
        #[arg(long, env = "STEWARD_AGENT_DIR", value_name = "DIR")]
        work_dir: Option<std::path::PathBuf>,
        /// Seconds fetched handler code and handler Python environments stay in the work
        /// dir after their last use [default: a day]. One in use never goes.
        #[arg(long, env = "STEWARD_CACHE_GRACE", value_name = "SECS")]
        cache_grace: Option<u64>,
        /// The most they may take together; past it the least recently used go
        /// (`500MiB`, `5GiB`, …; `0`: no cap) [default: 5GiB].
        #[arg(long, env = "STEWARD_CACHE_MAX_SIZE", value_name = "SIZE", value_parser = crate::cli::server::parse_size)]
        cache_max_size: Option<u64>,
    },
}

pub async fn run_agent(remote: Remote, cmd: AgentCmd) -> anyhow::Result<ExitCode> {
    let env = remote.env()?.to_string();
    let c = &remote.client;
    match cmd {
        AgentCmd::Run {
            names,
            work_dir,
            cache_grace,
            cache_max_size,
        } => {
            let work_dir = work_dir.unwrap_or_else(|| {
                std::env::var_os("XDG_CACHE_HOME")
                    .map(std::path::PathBuf::from)
                    .or_else(|| {
                        std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache"))
                    })
                    .unwrap_or_else(std::env::temp_dir)
                    .join("steward")
                    .join("agent")
            });
            let opts = crate::agent::AgentOptions {
                environment: env,
                names,
                work_dir,
                executor_bin: crate::scheduler::Schedulers::default_executor_bin(),
                cache_grace: cache_grace.map(std::time::Duration::from_secs),
                cache_max_size,
            };
            let stop = async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            };
            return match crate::agent::run(remote.client.clone(), opts, stop).await {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    eprintln!("error: {e}");
                    Ok(ExitCode::from(1))
                }
            };
        }
        AgentCmd::List => {
            let a = c.agents(&env).await?;
            if remote.json {
                print_json(&a);
                return Ok(ExitCode::SUCCESS);
            }
            if a["halted"] == true {
                println!("the environment is halted");
            }
            let rows = a["agents"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .map(|x| {
                            let primary = x["primary"].as_str().unwrap_or("");
                            let processes = x["processes"]
                                .as_array()
                                .map(|ps| {
                                    ps.iter()
                                        .map(|p| {
                                            let id = p["instance"].as_str().unwrap_or("");
                                            format!(
                                                "{}{} ({}, v{}, since {}, seen {})",
                                                if id == primary { "*" } else { "" },
                                                p["host"].as_str().unwrap_or("?"),
                                                &id[..id.len().min(8)],
                                                p["version"].as_str().unwrap_or("?"),
                                                short_time(&p["connected_at"]),
                                                short_time(&p["last_heartbeat"]),
                                            )
                                        })
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                })
                                .unwrap_or_default();
                            vec![
                                x["name"].as_str().unwrap_or("").to_string(),
                                x["state"].as_str().unwrap_or("").to_string(),
                                x["placement"].as_str().unwrap_or("local:").to_string(),
                                x["queued"].to_string(),
                                x["running"].to_string(),
                                x["last_result"].as_str().unwrap_or("-").to_string(),
                                if processes.is_empty() {
                                    "-".into()
                                } else {
                                    processes
                                },
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            print!(
                "{}",
                table(
                    &[
                        "agent",
                        "state",
                        "runs at",
                        "queued",
                        "running",
                        "last result",
                        "processes (* primary)"
                    ],
                    rows
                )
            );
        }
        AgentCmd::Pause { name } => {
            c.set_paused(&env, &name, true).await?;
            println!("agent {name} paused");
        }
        AgentCmd::Unpause { name } => {
            c.set_paused(&env, &name, false).await?;
            println!("agent {name} unpaused");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `2026-11-23T10:00:01.123Z` as `10:00:01`.
fn short_time(v: &serde_json::Value) -> String {
    v.as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.format("%H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

#[derive(Subcommand, Debug)]
pub enum DryrunCmd {
    /// Dry-run a version (default: the newest): what a deploy would change, changing nothing.
    Run {
        version: Option<i32>,
        /// Return at once with the dry-run's id instead of waiting for its report.
        #[arg(long)]
        no_wait: bool,
    },
    /// The recent dry-runs of the environment.
    List,
    /// The report of one dry-run.
    Show { id: String },
}

/// The report of dry-run `id`, once every resource of it is done.
pub(super) async fn wait_dryrun(
    c: &crate::client::Client,
    env: &str,
    id: &str,
) -> anyhow::Result<serde_json::Value> {
    loop {
        let d = c.dryrun(env, id).await?;
        if d["complete"] == true {
            return Ok(d);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) fn print_dryrun(d: &serde_json::Value) {
    let run = &d["dryrun"];
    println!(
        "dry-run {} of version {}: {}/{} resources{}; {} would change",
        run["id"].as_str().unwrap_or(""),
        run["version"],
        run["done"],
        run["total"],
        if d["complete"] == true {
            ""
        } else {
            " (still running)"
        },
        d["changed"]
    );
    for r in d["results"].as_array().into_iter().flatten() {
        let changes = r["changes"].as_object();
        let outcome = r["outcome"].as_str().unwrap_or("");
        let changed = changes.is_some_and(|c| !c.is_empty());
        if !changed && outcome == "dry" {
            continue;
        }
        let mark = if changed { "~" } else { "!" };
        println!(
            "{mark} {} ({outcome})",
            r["resource_id"].as_str().unwrap_or("")
        );
        for (a, ch) in changes.into_iter().flatten() {
            println!("    {a}: {} -> {}", ch["current"], ch["desired"]);
        }
        if outcome != "dry" {
            for m in r["messages"].as_array().into_iter().flatten() {
                println!("    {}", m["message"].as_str().unwrap_or(""));
            }
        }
    }
}

pub async fn run_dryrun(remote: Remote, cmd: DryrunCmd) -> anyhow::Result<ExitCode> {
    let env = remote.env()?.to_string();
    let c = &remote.client;
    match cmd {
        DryrunCmd::Run { version, no_wait } => {
            let started = c.start_dryrun(&env, version).await?;
            let id = started["id"].as_str().unwrap_or("").to_string();
            if no_wait {
                if remote.json {
                    print_json(&started);
                } else {
                    println!("dry-run {id} of version {} started", started["version"]);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let report = wait_dryrun(c, &env, &id).await?;
            if remote.json {
                print_json(&report);
            } else {
                print_dryrun(&report);
            }
        }
        DryrunCmd::List => {
            let l = c.dryruns(&env).await?;
            if remote.json {
                print_json(&l);
                return Ok(ExitCode::SUCCESS);
            }
            let rows = l
                .as_array()
                .map(|l| {
                    l.iter()
                        .map(|d| {
                            vec![
                                d["id"].as_str().unwrap_or("").to_string(),
                                d["version"].to_string(),
                                d["created_at"]
                                    .as_str()
                                    .unwrap_or("")
                                    .chars()
                                    .take(19)
                                    .collect(),
                                format!("{}/{}", d["done"], d["total"]),
                                d["requested_by"].as_str().unwrap_or("").to_string(),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            print!(
                "{}",
                table(&["id", "version", "created", "done", "by"], rows)
            );
        }
        DryrunCmd::Show { id } => {
            let d = c.dryrun(&env, &id).await?;
            if remote.json {
                print_json(&d);
            } else {
                print_dryrun(&d);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `steward version progress N [--wait]`.
pub async fn progress(remote: &Remote, version: i32, wait: bool) -> anyhow::Result<ExitCode> {
    let env = remote.env()?;
    let mut told = None;
    // only a wait shows progress: a single look prints its table below
    let mut shown = wait.then(|| super::progress::DeployProgress::new(remote.json));
    let p = loop {
        let p = if wait {
            // answered as soon as it is done, else after a moment with where it is
            remote
                .client
                .progress_when_done(env, version, Duration::from_millis(1000))
                .await?
        } else {
            remote.client.progress(env, version).await?
        };
        let phase = p["phase"].as_str().unwrap_or_default().to_string();
        // still moving: a deploy running, or a version that an approver may release
        let moving = matches!(
            phase.as_str(),
            "deploying" | "waiting_for_approval" | "halted"
        );
        if let Some(shown) = &mut shown {
            shown.update(&p);
        }
        if !wait || !moving {
            break p;
        }
        if told.as_deref() != Some(phase.as_str())
            && let Some(shown) = &shown
        {
            match phase.as_str() {
                "waiting_for_approval" => shown.note(&format!(
                    "version {version} waits for approval (steward version release {version}); waiting…"
                )),
                "halted" => shown.note("the environment is halted (steward env resume); waiting…"),
                _ => {}
            }
            told = Some(phase.clone());
        }
        // a deploy under way was waited for by the server; approval and halts are asked again
        if phase != "deploying" {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    if let Some(shown) = shown {
        shown.finish();
    }
    let phase = p["phase"].as_str().unwrap_or_default();
    // failures are what a person wants to see next
    let failed = p["by_status"]["failed"].as_i64().unwrap_or(0)
        + p["by_status"]["unavailable"].as_i64().unwrap_or(0);
    // a wait that ends without the version deployed did not succeed
    let not_deployed = wait && matches!(phase, "rejected" | "replaced");
    let code = if failed > 0 || not_deployed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if remote.json {
        print_json(&p);
        return Ok(code);
    }
    {
        let said = match phase {
            "waiting_for_approval" => {
                format!("waiting for approval (steward version release {version})")
            }
            "rejected" => "rejected: it will not be deployed".to_string(),
            "replaced" => format!("not deployed: version {} is active", p["active_version"]),
            "halted" => "deploy halted (steward env resume)".to_string(),
            "deploying" => "deploy in progress".to_string(),
            _ => "deploy done".to_string(),
        };
        println!(
            "version {} ({}{}): {} resources, {said}",
            p["version"],
            p["status"].as_str().unwrap_or(""),
            if p["active"] == true { ", active" } else { "" },
            p["total"],
        );
    }
    let rows = p["by_status"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| vec![k.clone(), v.to_string()])
                .collect()
        })
        .unwrap_or_default();
    print!("{}", table(&["status", "resources"], rows));
    Ok(code)
}
