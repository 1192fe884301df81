//! `steward compile` and `steward export`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use crate::compiler::incremental::Compiled;
use crate::compiler::{self, CompileOptions, CompileOutcome};
use crate::model::Facts;

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// Project directory (holding project.yml and main.cf).
    #[arg(long, short = 'p', default_value = ".", env = "STEWARD_PROJECT")]
    pub project: PathBuf,
    /// Entry file of the model, relative to the project.
    #[arg(long, short = 'f', default_value = "main.cf")]
    pub file: String,
    /// Print diagnostics as JSON on stderr (for tools) instead of rendered text.
    #[arg(long)]
    pub json: bool,
    /// Also export the resources to this file (JSON, DESIGN.md §3).
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
    /// Recompile on every change to the project's files and print the result.
    #[arg(long)]
    pub watch: bool,
    /// The environment's parameters and facts for `std::getfact`, from this JSON file
    /// (`{"parameters": [{"resource_id": …, "name": …, "value": …}, …]}`). Without it the
    /// compile knows no facts: every one is unknown (or the call's default).
    #[arg(long, value_name = "FILE")]
    pub facts: Option<PathBuf>,
    /// With --export: also write to FILE what a later compile needs to patch this export
    /// when only literals of the main file change (its sites; the server's compiles use it).
    /// Written only when the compile read nothing such a patch could not check (no Python
    /// ran, no facts, files or variables were read, no warning).
    #[arg(long, value_name = "FILE", requires = "export")]
    pub remember: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Project directory (holding project.yml and main.cf).
    #[arg(long, short = 'p', default_value = ".", env = "STEWARD_PROJECT")]
    pub project: PathBuf,
    /// Entry file of the model, relative to the project.
    #[arg(long, short = 'f', default_value = "main.cf")]
    pub file: String,
    /// Write the export to this file instead of uploading it to a server.
    #[arg(short = 'j', long = "json-file", value_name = "FILE")]
    pub json_file: Option<PathBuf>,
    /// After uploading, release the version (when the environment did not release it already).
    #[arg(short = 'd', long = "deploy")]
    pub deploy: bool,
    /// Comment recorded with the release (-d).
    #[arg(long, short = 'm', default_value = "")]
    pub comment: String,
    /// Compile the whole model. Without it, when the last export of this project changed
    /// only in literals since (a string or number given to a constructor, whose value no
    /// code reads), that export is patched instead of compiling again; the memory for this
    /// is PROJECT/.steward/compile/.
    #[arg(long)]
    pub full: bool,
    #[command(flatten)]
    pub remote: super::remote::RemoteArgs,
}

/// Run one compile, printing std::print output to stdout and diagnostics to stderr.
/// `facts`: the environment's parameters and facts, `None` when no server is known.
/// `process_ends_after`: the command exits after this compile (see
/// [`CompileOptions::process_ends_after`]).
pub(super) fn compile_once(
    project: &Path,
    file: &str,
    export: bool,
    json: bool,
    facts: Option<Facts>,
    process_ends_after: bool,
) -> CompileOutcome {
    if process_ends_after {
        crate::alloc::tune_for_a_one_shot_compile();
    }
    let opts = CompileOptions {
        project_dir: project.to_path_buf(),
        main_file: Some(file.to_string()),
        export,
        facts,
        process_ends_after,
        ..Default::default()
    };
    compile_with(&opts, json)
}

/// Compile with `opts`, printing std::print output to stdout and diagnostics to stderr.
fn compile_with(opts: &CompileOptions, json: bool) -> CompileOutcome {
    let outcome = with_prints_to_stdout(|print| compiler::compile(opts, print));
    report(&outcome, json);
    outcome
}

/// The compile of `steward export` and `steward deploy`: the last export patched when only
/// literals changed, else a full compile ([`compiler::incremental::compile_or_patch`]).
pub(super) fn compile_or_patch(
    project: &Path,
    file: &str,
    json: bool,
    facts: Option<Facts>,
    full: bool,
    process_ends_after: bool,
) -> (Compiled, compiler::incremental::Pending) {
    let (opts, memory) = remembering(project, file, facts, process_ends_after, full);
    let (compiled, pending) = with_prints_to_stdout(|print| {
        compiler::incremental::compile_or_patch(&opts, &memory, print)
    });
    if let Compiled::Full(outcome) = &compiled {
        report(outcome, json);
    }
    (compiled, pending)
}

/// The options of an export compiled through the memory, and where the memory is (removed
/// first when `full`).
fn remembering(
    project: &Path,
    file: &str,
    facts: Option<Facts>,
    process_ends_after: bool,
    full: bool,
) -> (CompileOptions, PathBuf) {
    if process_ends_after {
        crate::alloc::tune_for_a_one_shot_compile();
    }
    let memory = compiler::incremental::cache::path(project, file);
    if full {
        let _ = std::fs::remove_file(&memory);
    }
    let opts = CompileOptions {
        project_dir: project.to_path_buf(),
        main_file: Some(file.to_string()),
        export: true,
        facts,
        process_ends_after,
        ..Default::default()
    };
    (opts, memory)
}

/// Run `compile` with its `std::print` lines going to stdout.
fn with_prints_to_stdout<R>(compile: impl FnOnce(&mut (dyn FnMut(&str) + Send)) -> R) -> R {
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let result = compile(&mut |line| {
        let _ = writeln!(out, "{line}");
    });
    let _ = out.flush();
    result
}

/// Diagnostics (and warnings) a `--json` report lists at most: the report is one line that
/// the server keeps in full only when it is under its output cap (256 KiB); the rest are
/// counted.
const MAX_JSON_DIAGNOSTICS: usize = 200;

fn report(outcome: &CompileOutcome, json: bool) {
    if json {
        let errors = outcome.errors();
        let doc = serde_json::json!({
            "success": outcome.is_ok(),
            "diagnostics": errors.iter().take(MAX_JSON_DIAGNOSTICS).map(|d| d.resolve(&outcome.sources)).collect::<Vec<_>>(),
            "diagnostics_omitted": errors.len().saturating_sub(MAX_JSON_DIAGNOSTICS),
            "warnings": outcome.warnings.iter().take(MAX_JSON_DIAGNOSTICS).map(|d| d.resolve(&outcome.sources)).collect::<Vec<_>>(),
            "warnings_omitted": outcome.warnings.len().saturating_sub(MAX_JSON_DIAGNOSTICS),
            "stats": {
                "files": outcome.stats.files,
                "instances": outcome.stats.instances,
                "resources": outcome.stats.resources,
            },
        });
        eprintln!("{doc}");
        return;
    }
    super::render::emit_all(&outcome.sources, &outcome.warnings);
    let errors = outcome.errors();
    if !errors.is_empty() {
        super::render::emit_all(&outcome.sources, errors);
        if errors.len() > 1 {
            eprintln!(
                "error: compilation failed: reported {} errors",
                errors.len()
            );
        } else {
            eprintln!("error: compilation failed");
        }
    }
}

fn write_export(outcome: &CompileOutcome, path: &Path) -> anyhow::Result<()> {
    if let Ok(Some(export)) = &outcome.result {
        // one resource per line (model/export_lines.rs): a server that compiled the
        // previous commit parses only the lines that changed
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            crate::model::export_lines::write(export, &mut w)?;
            w.write_all(b"\n")?;
            w.flush()
        });
        written.with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `--remember`: the sites file of this compile ([`compiler::incremental::cache::save`] with
/// no export: the export is written beside it), when the compile can be patched later.
fn write_sites(
    project: &Path,
    file: &str,
    outcome: &mut CompileOutcome,
    path: &Path,
) -> anyhow::Result<()> {
    use compiler::incremental::cache;
    let (Some(remembered), Ok(Some(_))) = (outcome.memory.take(), &outcome.result) else {
        return Ok(());
    };
    let project = project
        .canonicalize()
        .unwrap_or_else(|_| project.to_path_buf());
    let memory = cache::Memory {
        generation: cache::new_generation(),
        key: cache::Key::new(&project, file, &Default::default(), None),
        inputs: remembered.inputs,
        main: remembered.main_text.as_bytes(),
        sites: &remembered.sites,
        export: &[],
    };
    cache::save(path, &memory).with_context(|| format!("writing {}", path.display()))
}

/// The `--facts` file.
fn read_facts(path: &Path) -> anyhow::Result<Facts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Facts::from_json(&text).with_context(|| format!("{}: not a facts file", path.display()))
}

pub fn run_compile(args: CompileArgs) -> anyhow::Result<ExitCode> {
    if args.watch {
        return watch(&args);
    }
    let facts = args.facts.as_deref().map(read_facts).transpose()?;
    let mut outcome = match &args.remember {
        None => compile_once(
            &args.project,
            &args.file,
            args.export.is_some(),
            args.json,
            facts,
            true,
        ),
        Some(sites) => {
            // a file left from before would describe another compile
            let _ = std::fs::remove_file(sites);
            crate::alloc::tune_for_a_one_shot_compile();
            let opts = CompileOptions {
                project_dir: args.project.clone(),
                main_file: Some(args.file.clone()),
                export: true,
                remember: true,
                facts,
                process_ends_after: true,
                ..Default::default()
            };
            compile_with(&opts, args.json)
        }
    };
    if let Some(path) = &args.export {
        write_export(&outcome, path)?;
    }
    if let Some(path) = &args.remember {
        write_sites(&args.project, &args.file, &mut outcome, path)?;
    }
    let code = if outcome.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    // the process ends now: its memory goes with it, without 10,000 resources freed one
    // by one first (~5 ms at 10,000)
    std::mem::forget(outcome);
    Ok(code)
}

pub fn run_export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    // the environment's parameters and facts, in one list call to the server the export
    // goes to; an export to a file with no environment configured knows none (the compile
    // says so once when the model asks for one)
    let remote = super::remote::connect(&args.remote, Some(&args.project))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let facts = match remote.environment.clone() {
        Some(env) => match rt.block_on(environment_facts(&remote.client, &env)) {
            Ok(facts) => Some(facts),
            Err(e) if args.json_file.is_some() => {
                eprintln!(
                    "warning: the parameters and facts of {env} could not be read ({e:#}); they are unknown in this export"
                );
                None
            }
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("reading the parameters and facts of {env}"));
            }
        },
        None => None,
    };
    // what this machine stored there last, read while compiling (100,000 resources: 14 MB)
    let remembered = remote
        .environment
        .clone()
        .filter(|_| args.json_file.is_none())
        .map(|env| {
            let server = remote.client.base_url().to_string();
            std::thread::spawn(move || {
                crate::client::memory_path(&server, &env)
                    .and_then(|p| crate::client::LastUpload::load(&p))
            })
        });
    let (compiled, memory) = compile_or_patch(
        &args.project,
        &args.file,
        args.remote.json,
        facts,
        args.full,
        true,
    );
    let generation = memory.generation();
    let made = match &compiled {
        Compiled::Full(outcome) => Made::Full(outcome),
        Compiled::Patched(patched) => {
            if args.remote.json {
                eprintln!(
                    "{}",
                    serde_json::json!({"success": true, "diagnostics": [], "warnings": [],
                        "patched": patched.changed.len()})
                );
            }
            Made::Patched(patched)
        }
    };
    // the memory is written while the export is written or uploaded
    let done = std::thread::scope(|s| {
        let export = match &compiled {
            Compiled::Full(outcome) => outcome.result.as_ref().ok().and_then(Option::as_ref),
            Compiled::Patched(_) => None,
        };
        let ok = matches!(&compiled, Compiled::Patched(_)) || export.is_some();
        let writing = ok.then(|| s.spawn(move || memory.detach(export).write()));
        let last = remembered.and_then(|r| r.join().ok().flatten());
        let done = export_or_upload(&args, made, generation, last, &rt, &remote);
        if let Some(w) = writing {
            let _ = w.join();
        }
        done
    });
    // the compile's outcome or patch (tens of MB at 100,000 resources) is left to the exit
    std::mem::forget(compiled);
    done
}

/// What `steward export` sends: a compile's outcome, or the last export patched.
#[derive(Clone, Copy)]
enum Made<'a> {
    Full(&'a CompileOutcome),
    Patched(&'a compiler::incremental::cache::Patched),
}

/// The rest of `steward export`: the export to its file, or to the server.
fn export_or_upload(
    args: &ExportArgs,
    made: Made,
    generation: Option<u64>,
    last: Option<crate::client::LastUpload>,
    rt: &tokio::runtime::Runtime,
    remote: &super::remote::Remote,
) -> anyhow::Result<ExitCode> {
    let outcome = match made {
        Made::Full(outcome) => outcome,
        Made::Patched(patched) => {
            return upload_patched(args, patched, generation, last, rt, remote);
        }
    };
    if let Some(path) = &args.json_file {
        write_export(outcome, path)?;
        if outcome.is_ok() {
            eprintln!(
                "exported {} resources to {}",
                outcome.stats.resources,
                path.display()
            );
        }
        return Ok(if outcome.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let Ok(Some(export)) = &outcome.result else {
        return Ok(ExitCode::from(1));
    };
    let env = remote.env()?.to_string();
    let provenance = git_provenance(&args.project);
    rt.block_on(async {
        // sent as its changes against what this machine stored there last, when it still is
        // the newest version (the server checks; else the whole export goes)
        let memory = crate::client::memory_path(remote.client.base_url(), &env);
        let sent = remote
            .client
            .upload_changes(&env, export, provenance, last)
            .await?;
        uploaded(args, remote, &env, generation, &sent);
        after_upload(args, remote, &env, memory, sent).await
    })
}

/// Remember beside the compile's memory that the server holds its export (or forget).
fn uploaded(
    args: &ExportArgs,
    remote: &super::remote::Remote,
    env: &str,
    generation: Option<u64>,
    sent: &crate::client::Sent,
) {
    use compiler::incremental::cache;
    let compile_memory = cache::path(&args.project, &args.file);
    match (generation, &sent.last) {
        (Some(generation), Some(last)) => cache::Uploaded {
            generation,
            server: remote.client.base_url().to_string(),
            environment: env.to_string(),
            content_hash: last.content_hash.clone(),
        }
        .save(&compile_memory),
        _ => cache::Uploaded::forget(&compile_memory),
    }
}

/// `steward export` of a patched export: to its file, or to the server as the resources the
/// patch changed when the server holds the export it patched (else as any export).
fn upload_patched(
    args: &ExportArgs,
    patched: &compiler::incremental::cache::Patched,
    generation: Option<u64>,
    mut last: Option<crate::client::LastUpload>,
    rt: &tokio::runtime::Runtime,
    remote: &super::remote::Remote,
) -> anyhow::Result<ExitCode> {
    use compiler::incremental::cache;
    let resources = || patched.resources();
    if let Some(path) = &args.json_file {
        let written = std::fs::File::create(path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            patched.write_lines(&mut w)?;
            w.write_all(b"\n")?;
            w.flush()
        });
        written.with_context(|| format!("writing {}", path.display()))?;
        eprintln!("exported {} resources to {}", resources(), path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let env = remote.env()?.to_string();
    let provenance = git_provenance(&args.project);
    rt.block_on(async {
        let memory = crate::client::memory_path(remote.client.base_url(), &env);
        let record = cache::Uploaded::load(&cache::path(&args.project, &args.file));
        let fits = match (&last, &record) {
            (Some(l), Some(r)) => {
                r.generation == patched.base_generation
                    && r.server == remote.client.base_url()
                    && r.environment == env
                    && r.content_hash == l.content_hash
            }
            _ => false,
        };
        let mut sent = None;
        if fits && let Some(l) = last.take() {
            let rest = patched.rest().map_err(anyhow::Error::msg)?;
            let upload = crate::client::PatchedUpload {
                rest: &rest,
                changed: patched.changed.iter().map(|(_, r)| r).collect(),
            };
            match remote
                .client
                .upload_patch(&env, &upload, provenance.clone(), l)
                .await?
            {
                Ok(s) => sent = Some(s),
                Err(back) => last = Some(back),
            }
        }
        let sent = match sent {
            Some(s) => s,
            None => {
                let export = patched.export().map_err(anyhow::Error::msg)?;
                remote
                    .client
                    .upload_changes(&env, &export, provenance, last)
                    .await?
            }
        };
        uploaded(args, remote, &env, generation, &sent);
        after_upload(args, remote, &env, memory, sent).await
    })
}

/// The end of `steward export` after an upload: remember it, say what was stored, release.
async fn after_upload(
    args: &ExportArgs,
    remote: &super::remote::Remote,
    env: &str,
    memory: Option<PathBuf>,
    sent: crate::client::Sent,
) -> anyhow::Result<ExitCode> {
    if let (Some(path), Some(last)) = (&memory, &sent.last)
        && let Err(e) = last.save(path)
    {
        eprintln!(
            "warning: could not remember this upload in {} ({e}); the next one is sent whole",
            path.display()
        );
    }
    // left to the exit, which comes next: freed one by one, a memory of 100,000 resources
    // took milliseconds of a one-change upload
    std::mem::forget(sent.last);
    let v = sent.answer;
    let number = v["number"].as_i64().unwrap_or(0) as i32;
    let diff = &v["diff_summary"];
    eprintln!(
        "uploaded version {number} to {env}: {} resources (+{} ~{} -{}){}",
        v["resource_count"],
        diff["new"],
        diff["updated"],
        diff["deleted"],
        if sent.as_changes {
            ", sent as its changes"
        } else {
            ""
        }
    );
    if v["auto_released"] == true {
        eprintln!("version {number} was released automatically");
    } else if args.deploy {
        let r = remote.client.release(env, number, &args.comment).await?;
        eprintln!(
            "released version {} (content hash {})",
            r.number, r.content_hash
        );
    } else {
        eprintln!("version {number} waits for release: steward version release {number}");
    }
    if remote.json {
        super::remote::print_json(&v);
    }
    Ok(ExitCode::SUCCESS)
}

/// An environment's parameters and facts as a compile reads them, in one list call.
pub(super) async fn environment_facts(
    c: &crate::client::Client,
    env: &str,
) -> Result<Facts, crate::client::ClientError> {
    let mut facts = Facts::new();
    for r in c.list_parameters(env, None).await? {
        facts.insert(r.resource_id, r.name, r.value);
    }
    Ok(facts)
}

/// The project's git commit, when it is a git checkout: recorded as provenance.
pub(super) fn git_provenance(project: &Path) -> serde_json::Value {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(project)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let mut p = serde_json::json!({});
    if let Some(commit) = git(&["rev-parse", "HEAD"]) {
        p["commit"] = serde_json::json!(commit);
        if let Some(branch) = git(&["rev-parse", "--abbrev-ref", "HEAD"]) {
            p["branch"] = serde_json::json!(branch);
        }
        let dirty = git(&["status", "--porcelain"])
            .map(|s| !s.is_empty())
            .unwrap_or(false);
        p["dirty"] = serde_json::json!(dirty);
    }
    p
}

/// Is this a change that can affect the compile?
fn relevant(path: &Path) -> bool {
    let ignored = path.components().any(|c| {
        matches!(
            c.as_os_str().to_str(),
            Some(".git" | "target" | "data" | ".cfcache")
        )
    });
    if ignored {
        return false;
    }
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("cf" | "yml" | "yaml" | "j2" | "tmpl") | None
    ) || path
        .components()
        .any(|c| c.as_os_str() == "files" || c.as_os_str() == "templates")
}

fn watch(args: &CompileArgs) -> anyhow::Result<ExitCode> {
    use notify::{RecursiveMode, Watcher};
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res
            && ev.paths.iter().any(|p| relevant(p))
        {
            let _ = tx.send(());
        }
    })?;
    watcher
        .watch(&args.project, RecursiveMode::Recursive)
        .with_context(|| format!("watching {}", args.project.display()))?;
    eprintln!("watching {} (Ctrl-C to stop)", args.project.display());
    loop {
        let start = Instant::now();
        // the file is read again each time: it may change between compiles as the project does
        let facts = match args.facts.as_deref().map(read_facts).transpose() {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: {e:#}");
                None
            }
        };
        let outcome = compile_once(
            &args.project,
            &args.file,
            args.export.is_some(),
            args.json,
            facts,
            false,
        );
        if let Some(path) = &args.export
            && let Err(e) = write_export(&outcome, path)
        {
            eprintln!("error: {e:#}");
        }
        if outcome.is_ok() {
            eprintln!(
                "compiled in {} ms: {} instances{}",
                start.elapsed().as_millis(),
                outcome.stats.instances,
                if args.export.is_some() {
                    format!(", {} resources", outcome.stats.resources)
                } else {
                    String::new()
                }
            );
        }
        // wait for a change, then let a burst of saves settle
        if rx.recv().is_err() {
            return Ok(ExitCode::SUCCESS);
        }
        while rx.recv_timeout(Duration::from_millis(150)).is_ok() {}
        eprintln!("--- change detected, recompiling");
    }
}
