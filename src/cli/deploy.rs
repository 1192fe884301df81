//! `steward deploy`: the whole pipeline on this machine, in one command. Compile the project,
//! start a private PostgreSQL (under the project's data/deploy, kept between runs), the server
//! and the scheduler in this process, store the version, release it, follow the deploy with
//! a progress bar, print a summary, and stop everything. A second run deploys only what
//! changed; a run that was killed is picked up by the next one.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};

use crate::client::Client;
use crate::compiler;
use crate::compiler::incremental::Compiled;
use crate::embedded::deploy::Runtime;
use crate::model::ExportFile;
use crate::scheduler::Schedulers;

#[derive(Args, Debug)]
#[command(
    after_long_help = "Environment:\n  STEWARD_HUGE_PAGES=off  no transparent huge pages for the run's memory (by default it \
asks for them: reading what the last run left fills ~100 MB at 100,000 resources; with 2 MiB \
pages a run faults ~18,000 pages instead of ~96,000)"
)]
pub struct DeployArgs {
    /// Project directory (holding project.yml and main.cf).
    #[arg(long, short = 'p', default_value = ".", env = "STEWARD_PROJECT")]
    pub project: PathBuf,
    /// Entry file of the model, relative to the project.
    #[arg(long, short = 'f', default_value = "main.cf")]
    pub file: String,
    /// Show what a deploy would change (the handlers read, nothing is changed).
    #[arg(long)]
    pub dry_run: bool,
    /// Also verify every resource and restore what drifted (not only what changed).
    #[arg(long)]
    pub repair: bool,
    /// Where the run keeps its state [default: PROJECT/data/deploy].
    #[arg(long, env = "STEWARD_DEPLOY_DATA")]
    pub data_dir: Option<PathBuf>,
    /// Compile the whole model. Without it, when the model changed only in literals since
    /// the last compile (a string or number given to a constructor, whose value no code
    /// reads), the last export is patched instead of compiling again; the memory for this
    /// is PROJECT/.steward/compile/.
    #[arg(long)]
    pub full: bool,
}

use crate::store::state::FAILED;

/// The statuses of resources not deployed for unknown values.
const UNDEFINED: [&str; 2] = ["undefined", "skipped_for_undefined"];

pub fn run(args: DeployArgs) -> anyhow::Result<ExitCode> {
    // most of a run's memory is fresh: what the last run left, decoded (see the function)
    crate::alloc::huge_pages_for_this_process();
    // one user configuring their own machine: handlers run as that user, not in a sandbox
    // uid (compiles here are this process's own)
    crate::sandbox::configure(crate::sandbox::Config {
        executor_user: crate::sandbox::ExecutorUser::Server,
        ..Default::default()
    });
    let project = args
        .project
        .canonicalize()
        .with_context(|| format!("project directory {}", args.project.display()))?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| project.join("data").join("deploy"));
    let rt = tokio::runtime::Runtime::new()?;
    // The private server (its database, and the scheduler reading what it deployed last)
    // starts while the model compiles, on the other core, when its cluster exists. A first
    // run compiles first, so a model that does not compile never makes a database.
    let early = Runtime::holds_cluster(&data_dir).then(|| {
        let dir = data_dir.clone();
        rt.spawn(async move { Runtime::start(&dir, Schedulers::default_executor_bin()).await })
    });
    // what the last run uploaded (100,000 resources: 14 MB), read while compiling
    let memory = data_dir.join("last-upload");
    let remembered = {
        let path = memory.clone();
        std::thread::spawn(move || crate::client::LastUpload::load(&path))
    };
    // and the commit the project is at (a `git` process)
    let provenance = {
        let project = project.clone();
        std::thread::spawn(move || super::compile::git_provenance(&project))
    };
    let started = Instant::now();
    // without facts first: a model that asks for no fact is compiled once
    let (compiled, compile_memory) = super::compile::compile_or_patch(
        &project,
        &args.file,
        false,
        Some(crate::model::Facts::new()),
        args.full,
        false,
    );
    let generation = compile_memory.generation();
    let (first, resources, patched) = match compiled {
        Compiled::Full(outcome) => match outcome.result {
            Ok(Some(export)) => {
                let n = export.resources.len();
                (First::Whole(export), n, None)
            }
            _ => {
                if let Some(starting) = early
                    && let Ok(Ok(runtime)) = rt.block_on(starting)
                {
                    rt.block_on(runtime.stop());
                }
                eprintln!("nothing was deployed");
                return Ok(ExitCode::from(1));
            }
        },
        Compiled::Patched(p) => {
            let (n, changed) = (p.resources(), p.changed.len());
            (First::Patched(Box::new(p)), n, Some(changed))
        }
    };
    eprintln!(
        "compiled {} in {} ms: {resources} resources{}",
        project.display(),
        started.elapsed().as_millis(),
        match patched {
            Some(0) => " (as the last compile: the model did not change)".to_string(),
            Some(n) => format!(" (the last compile's export, {n} patched)"),
            None => String::new(),
        }
    );
    // the compile's memory is written once the version deployed, while the private runtime
    // stops: written beside the deploy it took a core from it (100,000 resources: 44 MB,
    // ~25 ms of CPU). A run killed before costs the next one a compare, not a patch.
    let compile_memory = compile_memory.detach(match &first {
        First::Whole(export) => Some(export),
        First::Patched(_) => None,
    });
    let waiting = Instant::now();
    let remembered = remembered.join().unwrap_or(None);
    tracing::debug!(
        waited_ms = waiting.elapsed().as_secs_f64() * 1e3,
        "what the last run uploaded is read"
    );
    let record = Record {
        memory: compiler::incremental::cache::path(&project, &args.file),
        server: format!("steward deploy {}", data_dir.display()),
        generation,
    };
    // a whole export is compared with what the last run uploaded while the private server
    // starts (a model that asks for facts is compiled again with them first); a patched
    // one needs no compare when the last upload was the export it patched
    let (first, loaded) = match first {
        First::Whole(export) if export.unknowns.is_empty() => {
            let compared = crate::client::Compared::new(&export, None, remembered);
            (Ready::Compared(export, Box::new(compared)), None)
        }
        First::Whole(export) => (Ready::Whole(export), Some(remembered)),
        First::Patched(p) => (Ready::Patched(p), Some(remembered)),
    };
    rt.block_on(async move {
        let runtime = match early {
            Some(starting) => starting.await.context("starting the private server")?,
            None => Runtime::start(&data_dir, Schedulers::default_executor_bin()).await,
        }
        .with_context(|| format!("starting the private server under {}", data_dir.display()))?;
        let provenance = provenance.join().unwrap_or_else(|_| json!({}));
        let mut memory = Memory {
            path: memory,
            loaded,
            saving: None,
        };
        let result = tokio::select! {
            r = deploy(&runtime.client, &args, &project, first, &record, provenance, &mut memory) => r,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("\ninterrupted: stopping; the next `steward deploy` picks up where this one stopped");
                Ok(ExitCode::from(130))
            }
        };
        let compile_memory = std::thread::spawn(move || compile_memory.write());
        memory.saved().await;
        runtime.stop().await;
        let _ = compile_memory.join();
        result
    })
}

/// The first compile's result.
enum First {
    Whole(ExportFile),
    Patched(Box<compiler::incremental::cache::Patched>),
}

/// The first compile's result, ready to upload.
enum Ready {
    /// compared with the last upload already
    Compared(ExportFile, Box<crate::client::Compared>),
    Whole(ExportFile),
    /// the last compile's export, patched: sent as the resources the patch changed when the
    /// last upload was that export
    Patched(Box<compiler::incremental::cache::Patched>),
}

/// What `steward deploy` records beside the compile's memory after an upload
/// ([`compiler::incremental::cache::Uploaded`]): the next run's patch of that memory goes as
/// its changed resources. The private server is named by its data dir (its port changes
/// every run).
struct Record {
    memory: PathBuf,
    server: String,
    generation: Option<u64>,
}

impl Record {
    /// Whether the patch `p` was made from the memory whose export `last` remembers, for
    /// `env` of this private server.
    fn fits(
        &self,
        p: &compiler::incremental::cache::Patched,
        env: &str,
        last: &crate::client::LastUpload,
    ) -> bool {
        compiler::incremental::cache::Uploaded::load(&self.memory).is_some_and(|r| {
            r.generation == p.base_generation
                && r.server == self.server
                && r.environment == env
                && r.content_hash == last.content_hash
        })
    }

    /// After an upload of the first compile's export (`sent`), or of another (`None`).
    fn uploaded(&self, env: &str, sent: Option<&crate::client::Sent>) {
        use compiler::incremental::cache::Uploaded;
        match (self.generation, sent.and_then(|s| s.last.as_ref())) {
            (Some(generation), Some(last)) => Uploaded {
                generation,
                server: self.server.clone(),
                environment: env.to_string(),
                content_hash: last.content_hash.clone(),
            }
            .save(&self.memory),
            _ => Uploaded::forget(&self.memory),
        }
    }
}

/// What was uploaded last (`data_dir/last-upload`): the next upload is sent as its changes
/// against it.
struct Memory {
    path: PathBuf,
    /// read already (while compiling), not yet used
    loaded: Option<Option<crate::client::LastUpload>>,
    /// being written while the version deploys
    saving: Option<tokio::task::JoinHandle<()>>,
}

impl Memory {
    async fn take(&mut self) -> Option<crate::client::LastUpload> {
        match self.loaded.take() {
            Some(l) => l,
            None => {
                self.saved().await;
                crate::client::LastUpload::load(&self.path)
            }
        }
    }

    /// Remember `last` (or forget: the next upload is whole), written in the background.
    fn keep(&mut self, last: Option<crate::client::LastUpload>) {
        let path = self.path.clone();
        self.saving = Some(tokio::task::spawn_blocking(move || match last {
            Some(l) => {
                if let Err(e) = l.save(&path) {
                    eprintln!("warning: could not write {} ({e})", path.display());
                }
            }
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }));
    }

    /// Wait until what `keep` was given is on disk.
    async fn saved(&mut self) {
        if let Some(s) = self.saving.take() {
            let _ = s.await;
        }
    }
}

/// Rounds of compile and deploy one run makes at most while facts the deploy brings make
/// unknown values known (a VM made in round 1 reports the address round 2 needs).
const FACT_ROUNDS: usize = 5;

async fn deploy(
    c: &Client,
    args: &DeployArgs,
    project: &std::path::Path,
    first: Ready,
    record: &Record,
    mut provenance: Value,
    memory: &mut Memory,
) -> anyhow::Result<ExitCode> {
    // (a patched export's resources are parsed only when it has to go whole)
    let rest = match &first {
        Ready::Patched(p) => Some(p.rest().map_err(anyhow::Error::msg)?),
        _ => None,
    };
    let (project_name, asks_facts) = match (&first, &rest) {
        (Ready::Compared(x, _) | Ready::Whole(x), _) | (_, Some(x)) => {
            (x.metadata.project.clone(), !x.unknowns.is_empty())
        }
        (Ready::Patched(_), None) => unreachable!("its rest was read above"),
    };
    let env = environment(c, &project_name).await?;
    tracing::debug!(environment = %env, "the environment is known");
    provenance["source"] = json!("steward deploy");
    provenance["project_dir"] = json!(project.display().to_string());
    // the model asks for facts: compile again with what earlier runs' handlers reported
    let mut first = Some(first);
    let mut export = None;
    if asks_facts {
        first = None;
        match compile_with_facts(c, &env, args, project).await? {
            Some(x) => export = Some(x),
            None => return Ok(ExitCode::from(1)),
        }
    }
    let mut round = 1;
    loop {
        // as its changes against the last run's version, when that is still the newest
        let sent = match first.take() {
            Some(Ready::Compared(x, compared)) => {
                let sent = c
                    .upload_compared(&env, &x, *compared, provenance.clone())
                    .await?;
                record.uploaded(&env, Some(&sent));
                sent
            }
            Some(Ready::Whole(x)) => {
                let last = memory.take().await;
                let sent = c.upload_changes(&env, &x, provenance.clone(), last).await?;
                record.uploaded(&env, Some(&sent));
                sent
            }
            Some(Ready::Patched(p)) => {
                let sent =
                    upload_patched(c, &env, &p, rest.as_ref(), record, &provenance, memory).await?;
                record.uploaded(&env, Some(&sent));
                sent
            }
            None => {
                let last = memory.take().await;
                let x = export.as_ref().expect("compiled with facts");
                let sent = c.upload_changes(&env, x, provenance.clone(), last).await?;
                record.uploaded(&env, None);
                sent
            }
        };
        memory.keep(sent.last);
        let sent_as_changes = sent.as_changes;
        let v = sent.answer;
        let number = v["number"].as_i64().unwrap_or(0) as i32;
        let d = &v["diff_summary"];
        if args.dry_run {
            return dry_run(c, &env, number).await;
        }
        eprintln!(
            "version {number}: {} new, {} changed, {} removed, {} unchanged{}",
            d["new"],
            d["updated"],
            d["deleted"],
            d["unchanged"],
            if sent_as_changes {
                " (sent as its changes)"
            } else {
                ""
            }
        );
        c.release(&env, number, "steward deploy").await?;
        if args.repair {
            let r = c.trigger(&env, true, None, None).await?;
            eprintln!("repair: verifying {} resources", r["scheduled"]);
        }
        let started = Instant::now();
        let mut progress = follow(c, &env, number).await?;
        if args.repair {
            // the version is settled as soon as its resources are deployed, which unchanged
            // ones are before the repair has run: wait for the agents to have nothing left
            wait_idle(c, &env).await?;
            progress = follow(c, &env, number).await?;
        }
        // what the handlers reported may be what the model waited for: compile again
        let known = c.version(&env, number).await?["unknowns"]["known_now"]
            .as_u64()
            .unwrap_or(0);
        if known == 0 || round >= FACT_ROUNDS {
            if known > 0 {
                eprintln!(
                    "{known} unknown values are known now, but this run made {FACT_ROUNDS} rounds already: run `steward deploy` again"
                );
            }
            return summary(c, &env, number, &progress, started.elapsed()).await;
        }
        eprintln!("facts arrived for {known} unknown values: compiling again");
        export = match compile_with_facts(c, &env, args, project).await? {
            Some(x) => Some(x),
            None => return Ok(ExitCode::from(1)),
        };
        round += 1;
    }
}

/// Upload a patched export as the resources its patch changed, when the last upload was the
/// export it patched (else whole or as its changes, parsed).
async fn upload_patched(
    c: &Client,
    env: &str,
    p: &compiler::incremental::cache::Patched,
    rest: Option<&ExportFile>,
    record: &Record,
    provenance: &Value,
    memory: &mut Memory,
) -> anyhow::Result<crate::client::Sent> {
    let mut last = memory.take().await;
    if let (Some(rest), Some(l)) = (rest, last.take()) {
        let fits = record.fits(p, env, &l);
        tracing::debug!(fits, "the last upload was the export patched?");
        if fits {
            let upload = crate::client::PatchedUpload {
                rest,
                changed: p.changed.iter().map(|(_, r)| r).collect(),
            };
            match c.upload_patch(env, &upload, provenance.clone(), l).await? {
                Ok(sent) => return Ok(sent),
                Err(back) => last = Some(back),
            }
        } else {
            last = Some(l);
        }
    }
    let export = p.export().map_err(anyhow::Error::msg)?;
    Ok(c.upload_changes(env, &export, provenance.clone(), last)
        .await?)
}

/// Compile the project with the environment's parameters and facts (one list call); None
/// when it does not compile (the diagnostics are printed).
async fn compile_with_facts(
    c: &Client,
    env: &str,
    args: &DeployArgs,
    project: &std::path::Path,
) -> anyhow::Result<Option<ExportFile>> {
    let facts = super::compile::environment_facts(c, env).await?;
    let (project, file) = (project.to_path_buf(), args.file.clone());
    let outcome = tokio::task::spawn_blocking(move || {
        super::compile::compile_once(&project, &file, true, false, Some(facts), false)
    })
    .await?;
    match outcome.result {
        Ok(Some(export)) => Ok(Some(export)),
        _ => {
            eprintln!("nothing more was deployed");
            Ok(None)
        }
    }
}

/// Wait until no agent of the environment has work queued or running.
async fn wait_idle(c: &Client, env: &str) -> anyhow::Result<()> {
    loop {
        let agents = c.agents(env).await?;
        let busy = agents["agents"].as_array().is_some_and(|list| {
            list.iter().any(|a| {
                a["queued"].as_u64().unwrap_or(0) > 0 || a["running"].as_u64().unwrap_or(0) > 0
            })
        });
        if !busy {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// The environment of this project in the private server (created on first use).
async fn environment(c: &Client, project: &str) -> anyhow::Result<String> {
    let project = if project.is_empty() {
        "project"
    } else {
        project
    };
    // the user running `steward deploy` is the operator of this private server: the SSH
    // targets and keys their model names are theirs to use (a shared server's environments
    // get an allow-list from its administrator instead)
    let ssh_allowed = json!({"targets": ["*@*:*", "*:*"], "identities": ["default", "/**"]});
    let envs = c.environments().await?;
    if let Some(e) = envs
        .iter()
        .find(|e| e.project == project && e.name == "local")
    {
        let id = e.id.to_string();
        if serde_json::to_value(&e.settings.ssh_allowed)? != ssh_allowed {
            c.update_settings(&id, &json!({"ssh_allowed": ssh_allowed}))
                .await?;
        }
        return Ok(id);
    }
    // released by this command (never by upload), so a dry-run can look at a version first
    let settings = json!({"auto_release": false, "ssh_allowed": ssh_allowed});
    Ok(c.create_environment(project, "local", Some(settings))
        .await?
        .id
        .to_string())
}

async fn dry_run(c: &Client, env: &str, number: i32) -> anyhow::Result<ExitCode> {
    let started = c.start_dryrun(env, Some(number)).await?;
    let id = started["id"].as_str().unwrap_or("").to_string();
    let report = super::control::wait_dryrun(c, env, &id).await?;
    super::control::print_dryrun(&report);
    // kept (not released), so the report stays next to the version it describes
    eprintln!("version {number} was stored for this dry-run and not released");
    let failed = report["results"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter(|x| {
                    matches!(
                        x["outcome"].as_str(),
                        Some("failed" | "unavailable" | "timed_out")
                    )
                })
                .count()
        })
        .unwrap_or(0);
    if report["changed"] == 0 && failed == 0 {
        println!("nothing would change");
    }
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Follow the deploy of `number` until it is done, showing its progress.
async fn follow(c: &Client, env: &str, number: i32) -> anyhow::Result<Value> {
    let mut shown = super::progress::DeployProgress::new(false);
    // the server answers as soon as the version is done (a change to a few resources: in
    // milliseconds), else after a moment with where it is, to show
    loop {
        let p = c
            .progress_when_done(env, number, Duration::from_millis(500))
            .await?;
        shown.update(&p);
        if p["done"] == true {
            shown.finish();
            return Ok(p);
        }
    }
}

async fn summary(
    c: &Client,
    env: &str,
    number: i32,
    progress: &Value,
    took: Duration,
) -> anyhow::Result<ExitCode> {
    /// changed resources named; the rest are counted
    const NAMED: i64 = 20;
    /// failed or undeployable resources listed per status; the rest are counted
    const LISTED: i64 = 100;
    // counted in the database: a run that changed 100,000 resources reads a few rows
    let made = c.changes_made(env, number, NAMED).await?;
    let count = |s: &str| progress["by_status"][s].as_u64().unwrap_or(0);
    let failed: u64 = FAILED.iter().map(|s| count(s)).sum();
    let undefined: u64 = UNDEFINED.iter().map(|s| count(s)).sum();
    let changes = if made.created + made.updated + made.purged == 0 {
        "no changes".to_string()
    } else {
        format!(
            "{} created, {} updated, {} deleted",
            made.created, made.updated, made.purged
        )
    };
    println!(
        "version {number}: {} resources in {:.1} s — {} deployed ({changes}), {failed} failed or skipped{}",
        progress["total"],
        took.as_secs_f64(),
        count("deployed"),
        if undefined == 0 {
            String::new()
        } else {
            format!(", {undefined} not deployable (unknown values)")
        }
    );
    for (id, change) in &made.first {
        println!("  {change} {id}");
    }
    let unnamed = made.created + made.updated + made.purged - made.first.len() as i64;
    if unnamed > 0 {
        println!("  … and {unnamed} more");
    }
    // only the statuses the progress counted: a run where all went well asks nothing more
    for status in FAILED.iter().chain(UNDEFINED.iter()) {
        if count(status) == 0 {
            continue;
        }
        let (rows, total) = c.resources_with_status(env, number, status, LISTED).await?;
        for r in &rows {
            let why = if FAILED.contains(status) {
                r.last_message.clone().or(r.blocked_reason.clone())
            } else {
                r.blocked_reason.clone()
            };
            let why = why.unwrap_or_default();
            println!(
                "  {} {}: {}",
                r.status,
                r.resource_id,
                why.lines().next().unwrap_or("")
            );
        }
        if total > rows.len() as i64 {
            println!("  … and {} more {status}", total - rows.len() as i64);
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
