//! Compiling one commit: check it out into a fresh temp workdir, run `steward compile` there as
//! a child process (its own process group, a clean environment, a timeout), and store the
//! export as a version with the commit's provenance. Every stage is timed into the report;
//! the workdir is removed however it ends.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{Value, json};

mod memory;
mod patch;
mod process;
mod store_version;

pub use memory::Memory;

use super::git;
use crate::sandbox;
use crate::store;
use crate::store::sources::{CompileRow, SourceRow};
use process::{
    Files, base_python, compile_jail, environment_envs, read_export, read_requirements,
    run_compiler,
};
use store_version::store_version;

/// Output kept per stream in a report: its first and its last this many bytes.
pub(super) const KEEP_OUTPUT: usize = 256 << 10;
/// Largest export read back from the compiler.
pub(super) const MAX_EXPORT: u64 = 256 << 20;
/// Limits of the compiler process (`setrlimit`): address space, size of a file it writes,
/// open files. Its CPU time is limited to the source's compile_timeout.
pub(super) const COMPILE_MEMORY: u64 = 4 << 30;
pub(super) const COMPILE_FILE_SIZE: u64 = 512 << 20;
pub(super) const COMPILE_OPEN_FILES: u64 = 256;

/// Where pip finds the packages that commits' requirements name: the operator's choice
/// (`steward server --pip-index-url`, `--pip-find-links`), never the commit's. Unset, pip
/// uses what the server's own environment says (`PIP_INDEX_URL`, …) or its default index.
#[derive(Clone, Debug, Default)]
pub struct PipSources {
    pub index_url: Option<String>,
    /// Directories or URLs of wheels (a directory must be readable by compiles).
    pub find_links: Vec<String>,
}

impl PipSources {
    fn add_to(&self, env: &mut Vec<(String, std::ffi::OsString)>) {
        if let Some(url) = &self.index_url {
            env.retain(|(k, _)| k != "PIP_INDEX_URL");
            env.push(("PIP_INDEX_URL".into(), url.into()));
        }
        if !self.find_links.is_empty() {
            env.retain(|(k, _)| k != "PIP_FIND_LINKS");
            env.push(("PIP_FIND_LINKS".into(), self.find_links.join(" ").into()));
        }
    }
}

/// Where commits' Python environments go, and where pip finds what they name.
#[derive(Clone, Copy)]
pub struct Python<'a> {
    /// `<data dir>/python-envs`
    pub envs: &'a Path,
    pub pip: &'a PipSources,
    /// Notified when an environment was made.
    pub made: &'a tokio::sync::Notify,
}

pub struct CompileResult {
    pub success: bool,
    pub stages: Value,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub diagnostics: Value,
    pub error: Option<String>,
    pub version: Option<i32>,
    pub auto_released: bool,
    /// The Python environment it used, `<environment id>/<name>` under python-envs/.
    pub python_env: Option<String>,
    /// Values the compile missed arrived while it ran (the version's unknowns they answer
    /// are marked resolved): the version needs a recompile as much as one whose facts come
    /// later.
    pub resolved_meanwhile: bool,
}

/// A stage record: name, start, duration, outcome, detail.
pub fn stage(
    name: &str,
    started: chrono::DateTime<Utc>,
    took: Duration,
    ok: bool,
    detail: &str,
) -> Value {
    json!({"name": name, "started_at": started, "ms": took.as_millis() as u64, "ok": ok, "detail": detail})
}

/// The report of a compile as it goes: timed stages, then the result.
pub(super) struct Report {
    pub stages: Vec<Value>,
    pub result: CompileResult,
}

/// When a stage started: wall clock for the report, monotonic for its duration.
pub(super) type Start = (chrono::DateTime<Utc>, Instant);

pub(super) fn begin() -> Start {
    (Utc::now(), Instant::now())
}

impl Report {
    pub(super) fn passed(&mut self, name: &str, at: Start, detail: &str) {
        self.stages
            .push(stage(name, at.0, at.1.elapsed(), true, detail));
    }

    /// The stage failed: the compile ends here.
    /// [`Report::failed`], as the end of a build.
    fn fail(self, name: &str, at: Start, error: String) -> Result<Built, Box<CompileResult>> {
        Err(Box::new(self.failed(name, at, error)))
    }

    pub(super) fn failed(mut self, name: &str, at: Start, error: String) -> CompileResult {
        self.stages
            .push(stage(name, at.0, at.1.elapsed(), false, &error));
        self.result.error = Some(error);
        self.done()
    }

    pub(super) fn done(mut self) -> CompileResult {
        self.result.stages = json!(self.stages);
        self.result
    }
}

/// What an environment's compile task keeps from one compile to the next.
#[derive(Default)]
pub struct Memories {
    /// What the last compile stored: the next one is stored as its changes.
    pub stored: Option<Memory>,
    /// What the last compile left to patch the next one from.
    sites: Option<patch::Sites>,
}

/// What to compile, for whom: a commit of the branch (its export becomes a version) or a
/// pull request's preview (its own identity and Python environments, no secret values).
pub(super) struct BuildSpec<'a> {
    pub env: uuid::Uuid,
    pub commit: &'a str,
    /// Stages already done (the fetch).
    pub stages: Vec<Value>,
    pub source: &'a SourceRow,
    pub mirror: &'a Path,
    pub steward_bin: &'a Path,
    pub python: Python<'a>,
    pub preview: bool,
    /// What the environment's last compile stored: the export is read as its changes
    /// against it (`None` for a preview, which stores no version). Taken only when there
    /// is an export to read: a compile that fails leaves it for the next one.
    pub memory: Option<&'a mut Option<Memory>>,
    /// Keep what a later commit can be patched from ([`patch::keep`]), and why the last
    /// one's could not be used for this commit.
    pub sites: Option<Option<String>>,
}

/// A compile that produced an export: its report so far, the export, and the keys of the
/// values withheld from it (secret ones, for a preview).
pub(super) struct Built {
    pub report: Report,
    /// The export: whole, or (read against a memory) as its changes.
    pub export: memory::Read,
    pub withheld: Vec<store::facts::ParamKey>,
    /// What a later commit can be patched from (asked for with [`BuildSpec::sites`]).
    pub sites: Option<patch::Sites>,
}

/// Run the compile of `job` (a queued compile that was just marked running). `memory`: what
/// the environment's last compile left, taken, and given back as what this one left.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    pool: &sqlx::PgPool,
    job: &CompileRow,
    source: &SourceRow,
    mirror: &Path,
    steward_bin: &Path,
    python: Python<'_>,
    fence: Option<&crate::store::leases::Fence>,
    memory: &mut Memories,
) -> CompileResult {
    let started = chrono::Utc::now();
    let stages = job.stages.as_array().cloned().unwrap_or_default();
    let mut not_patched = None;
    if let Some(sites) = memory.sites.take() {
        match patch::patched(job, source, mirror, steward_bin, sites, &mut memory.stored).await {
            Ok((read, stage, next)) => {
                let mut report = new_report(stages);
                report.stages.push(stage);
                report.result.stdout = next.1;
                let (result, remembered) =
                    store_version(pool, job, source, fence, started, report, read).await;
                memory.stored = remembered;
                memory.sites = Some(next.0);
                return result;
            }
            Err(why) => {
                tracing::debug!(environment = %job.environment_id, commit = %job.commit, %why, "compiling in full");
                not_patched = Some(why);
            }
        }
    }
    let spec = BuildSpec {
        env: job.environment_id,
        commit: &job.commit,
        stages,
        source,
        mirror,
        steward_bin,
        python,
        preview: false,
        memory: Some(&mut memory.stored),
        sites: Some(not_patched),
    };
    match build(pool, spec).await {
        Ok(b) => {
            let (result, remembered) =
                store_version(pool, job, source, fence, started, b.report, b.export).await;
            memory.stored = remembered;
            memory.sites = b.sites;
            result
        }
        Err(failed) => *failed,
    }
}

/// The report of a compile that has done `stages` so far.
fn new_report(stages: Vec<Value>) -> Report {
    Report {
        stages,
        result: CompileResult {
            success: false,
            stages: Value::Null,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            diagnostics: json!([]),
            error: None,
            version: None,
            auto_released: false,
            python_env: None,
            resolved_meanwhile: false,
        },
    }
}

/// Check out, install, and compile `spec.commit`; the failed report when it does not give an
/// export.
pub(super) async fn build(
    pool: &sqlx::PgPool,
    spec: BuildSpec<'_>,
) -> Result<Built, Box<CompileResult>> {
    let (python_envs, pip_sources, envs_made) =
        (spec.python.envs, spec.python.pip, spec.python.made);
    let (source, mirror, steward_bin) = (spec.source, spec.mirror, spec.steward_bin);
    let commit = spec.commit.to_string();
    let role = if spec.preview {
        sandbox::Role::Preview
    } else {
        sandbox::Role::Compile
    };
    // a preview's Python environments are apart from the branch's
    let envs_key = if spec.preview {
        sandbox::preview_key(spec.env)
    } else {
        spec.env
    };
    let mut report = new_report(spec.stages);
    // checkout
    let at = begin();
    // who the compile runs as: a uid of the environment's own when the server is root
    let timeout = Duration::from_secs(source.compile_timeout.max(1) as u64);
    let env_id = spec.env;
    let data_dir = python_envs.parent().map(Path::to_path_buf);
    let jail = match tokio::task::spawn_blocking(move || {
        compile_jail(env_id, role, timeout, data_dir.as_deref())
    })
    .await
    {
        Ok(Ok(j)) => j,
        Ok(Err(e)) => {
            return report.fail("checkout", at, format!("no sandbox for the compile: {e}"));
        }
        Err(e) => return report.fail("checkout", at, format!("no sandbox for the compile: {e}")),
    };
    // under the data directory (`compiles/`), not the machine's /tmp: the compile gets a
    // /tmp of its own, empty, gone with it
    let compiles = python_envs
        .parent()
        .map(|d| d.join("compiles"))
        .unwrap_or_else(std::env::temp_dir);
    let prepared = match python_envs.parent() {
        Some(data_dir) if sandbox::is_root() => sandbox::open_data_dir(data_dir),
        _ => std::fs::create_dir_all(&compiles),
    };
    if let Err(e) = prepared {
        return report.fail("checkout", at, format!("can not make a workdir: {e}"));
    }
    let mut jail = jail;
    jail.private_tmp = true;
    let workdir = match tempfile::Builder::new()
        .prefix(if spec.preview {
            "steward-preview-"
        } else {
            "steward-compile-"
        })
        .tempdir_in(&compiles)
    {
        Ok(d) => d,
        Err(e) => return report.fail("checkout", at, format!("can not make a workdir: {e}")),
    };
    // private to the compile: no other environment's compile (nor anyone else) can enter it
    if let Err(e) = sandbox::private_dir(workdir.path(), None) {
        return report.fail("checkout", at, format!("can not make a workdir: {e}"));
    }
    // a data directory under /tmp (or hidden): the workdir stays visible
    jail.keep_visible.insert(0, workdir.path().to_path_buf());
    // the compiler's own binary, should it live under /tmp (a build in a temporary clone)
    if let Some(dir) = steward_bin.parent() {
        jail.keep_visible.push(dir.to_path_buf());
    }
    let project = workdir.path().join("project");
    let subpath = (!source.path.is_empty()).then(|| source.path.clone());
    let checkout = {
        let (mirror, commit, project) = (mirror.to_path_buf(), commit.clone(), project.clone());
        tokio::task::spawn_blocking(move || {
            git::checkout(&mirror, &commit, &project, subpath.as_deref())
        })
        .await
    };
    match checkout {
        Ok(Ok(refused)) if refused.is_empty() => {
            report.passed("checkout", at, &format!("commit {}", commit))
        }
        Ok(Ok(refused)) => report.passed(
            "checkout",
            at,
            &format!(
                "commit {}; symlinks pointing outside the checkout were not written: {}",
                commit,
                refused.join(", ")
            ),
        ),
        Ok(Err(e)) => {
            return report.fail(
                "checkout",
                at,
                format!("checkout of {} failed: {e}", commit),
            );
        }
        Err(e) => return report.fail("checkout", at, format!("checkout crashed: {e}")),
    }

    // the project's Python environment (V2 modules, plugins' dependencies), shared by the
    // environment's commits with the same requirements
    let mut virtual_env = None;
    // held until the compile ends: the reaper leaves an environment in use alone
    let mut _env_in_use = None;
    let requirements = project.join("requirements.txt");
    if requirements.is_file() {
        let at = begin();
        let (envs, project2, mut jail2) =
            (python_envs.to_path_buf(), project.clone(), jail.clone());
        // pip reads the operator's --pip-find-links directories, wherever they are
        jail2.private_tmp = false;
        let pip_sources = pip_sources.clone();
        let tmp = workdir.path().join("pip-tmp");
        let made = tokio::task::spawn_blocking(move || {
            let text = read_requirements(&project2.join("requirements.txt"))?;
            // before pip runs: nothing but plain requirements
            crate::pyenv::check_plain(&text).map_err(|e| e.to_string())?;
            let envs = environment_envs(&envs, envs_key, jail2.identity)?;
            // where pip writes, and the operator's wheel directories, stay visible where
            // the server's files are hidden
            jail2.keep_visible.push(envs.clone());
            jail2.keep_visible.extend(
                pip_sources
                    .find_links
                    .iter()
                    .map(PathBuf::from)
                    .filter(|d| d.is_absolute() && d.is_dir()),
            );
            sandbox::private_dir(&tmp, jail2.identity).map_err(|e| e.to_string())?;
            let cache = envs.join(".pip-cache");
            sandbox::private_dir(&cache, jail2.identity).map_err(|e| e.to_string())?;
            // pip's cache is not removed under pip
            let _cache_in_use = crate::pyenv::reap::hold(&cache);
            let mut env = crate::executor::passed_environment();
            // the environment's own cache: a cache shared between environments would let
            // one place files another installs
            env.retain(|(k, _)| k != "PIP_CACHE_DIR" && k != "HOME" && k != "TMPDIR");
            env.extend([
                ("HOME".to_string(), tmp.clone().into_os_string()),
                ("TMPDIR".to_string(), tmp.into_os_string()),
                ("PIP_CACHE_DIR".to_string(), cache.into_os_string()),
                ("LANG".to_string(), "C.UTF-8".into()),
                ("PIP_NO_INPUT".to_string(), "1".into()),
            ]);
            pip_sources.add_to(&mut env);
            let opts = crate::pyenv::InstallOptions {
                // wheels only: installing runs no code the commit chose
                only_binary: true,
                base_python: base_python(jail2.identity.is_some()),
                sandbox: Some(crate::pyenv::Sandboxed {
                    identity: jail2.identity,
                    jail: jail2,
                    env,
                }),
                // Steward's `inmanta` package stands in for inmanta-core (whose server and
                // its dependencies, some without wheels, compiles do not need)
                provide_core: true,
            };
            crate::pyenv::ensure_shared(&envs, &text, &project2, &opts).map_err(|e| e.to_string())
        })
        .await;
        match made {
            Ok(Ok(env)) => {
                if env.created {
                    envs_made.notify_one();
                }
                report.passed(
                    "python environment",
                    at,
                    &if env.created {
                        format!("made for requirements.txt\n{}", env.output)
                    } else {
                        "made before for the same requirements".to_string()
                    },
                );
                // under a private /tmp too, when the data directory is there
                jail.keep_visible.push(env.dir.clone());
                report.result.python_env = env
                    .dir
                    .strip_prefix(python_envs)
                    .ok()
                    .map(|p| p.display().to_string());
                virtual_env = Some(env.dir);
                _env_in_use = Some(env.in_use);
            }
            Ok(Err(e)) => {
                return report.fail(
                    "python environment",
                    at,
                    format!("installing requirements.txt failed: {e}"),
                );
            }
            Err(e) => {
                return report.fail("python environment", at, format!("crashed: {e}"));
            }
        }
    }

    // the environment's parameters and facts, for std::getfact: one read, handed to the
    // compile as a file (it reaches no database)
    let at = begin();
    let facts_file = workdir.path().join("facts.json");
    let mut withheld = Vec::new();
    match write_facts_file(pool, env_id, &facts_file, spec.preview).await {
        Ok((n, w)) if spec.preview => {
            report.passed(
                "facts",
                at,
                &format!("{n} parameters and facts; {} secret withheld", w.len()),
            );
            withheld = w;
        }
        Ok((n, _)) => report.passed("facts", at, &format!("{n} parameters and facts")),
        Err(e) => return report.fail("facts", at, e),
    }

    // compile, in a child process; asked for its sites only when the server could trust them
    let at = begin();
    let trusted = if spec.sites.is_some() {
        let (mirror, source, of) = (mirror.to_path_buf(), source.clone(), commit.clone());
        tokio::task::spawn_blocking(move || patch::trusted_tree(&mirror, &source, &of))
            .await
            .unwrap_or_else(|e| Err(format!("crashed: {e}")))
            .inspect_err(|why| tracing::debug!(environment = %env_id, %commit, %why, "a next commit can not be patched from this compile"))
            .ok()
    } else {
        None
    };
    let export_file = workdir.path().join("export.json");
    let sites_file = workdir.path().join("sites");
    let ran = run_compiler(
        steward_bin,
        &jail,
        workdir.path(),
        &project,
        Files {
            export: &export_file,
            facts: &facts_file,
            remember: trusted.is_some().then_some(sites_file.as_path()),
        },
        timeout,
        virtual_env.as_deref(),
    )
    .await;
    // nothing the compile started outlives it, whatever session or group it moved to
    if let Some(id) = jail.identity {
        let _ = tokio::task::spawn_blocking(move || sandbox::kill_all(id.uid)).await;
    }
    let out = match ran {
        Ok(out) => out,
        Err(e) => return report.fail("compile", at, e),
    };
    report.result.exit_code = out.code;
    report.result.stdout = out.stdout;
    report.result.stderr = out.stderr.clone();
    // `compile --json` reports on stderr as one JSON document
    let doc = out.stderr.lines().rev().find_map(|l| {
        serde_json::from_str::<Value>(l)
            .ok()
            .filter(|v| v.get("diagnostics").is_some())
    });
    if let Some(d) = &doc {
        report.result.diagnostics = d["diagnostics"].clone();
    }
    if out.code != Some(0) {
        let first = &report.result.diagnostics[0];
        let error = match (first["message"].as_str(), first["primary"]["file"].as_str()) {
            (Some(m), Some(file)) => {
                format!(
                    "the model does not compile: {file}:{}:{}: {m}",
                    first["primary"]["line"], first["primary"]["column"]
                )
            }
            (Some(m), None) => format!("the model does not compile: {m}"),
            _ => match out.signal {
                Some(libc::SIGXCPU) => format!(
                    "the compiler used more than its {} s of CPU time and was stopped",
                    timeout.as_secs()
                ),
                Some(libc::SIGXFSZ) => format!(
                    "the compiler wrote a file over the {} MiB limit and was stopped",
                    COMPILE_FILE_SIZE >> 20
                ),
                Some(sig) => format!(
                    "the compiler was killed by signal {sig} (its limits: {} MiB of memory, {} s of CPU)",
                    COMPILE_MEMORY >> 20,
                    timeout.as_secs()
                ),
                None => format!("the compiler failed (exit status {:?})", out.code),
            },
        };
        return report.fail("compile", at, error);
    }
    let ran_ms = at.1.elapsed().as_millis();
    let read_at = Instant::now();
    let memory = spec.memory.and_then(Option::take);
    let not_patched = spec.sites.clone().flatten();
    let keep = trusted.map(|tree| {
        (
            mirror.to_path_buf(),
            source.clone(),
            commit.clone(),
            tree,
            steward_bin.to_path_buf(),
            project.clone(),
        )
    });
    let read = tokio::task::spawn_blocking(move || {
        let text = std::sync::Arc::new(read_export(&export_file)?);
        let read = memory::read(memory, env_id, text.clone())?;
        let sites = keep.map(|(mirror, source, commit, tree, bin, project)| {
            patch::keep(
                &mirror,
                &source,
                &commit,
                tree,
                &bin,
                &project,
                &sites_file,
                text,
                read.id,
            )
        });
        Ok::<_, String>((read, sites))
    })
    .await
    .unwrap_or_else(|e| Err(format!("crashed: {e}")));
    let (export, sites) = match read {
        Ok(x) => x,
        Err(e) => {
            return report.fail(
                "compile",
                at,
                format!("the compiler's export is unreadable: {e}"),
            );
        }
    };
    let sites = match sites {
        Some(Ok(s)) => Some(s),
        Some(Err(why)) => {
            tracing::debug!(environment = %env_id, %commit, %why, "a next commit can not be patched from this compile");
            None
        }
        None => None,
    };
    let changed = match &export.changes {
        Some(c) => format!(
            " ({} new or changed, {} removed)",
            export.export.resources.len(),
            c.removed.len()
        ),
        None => String::new(),
    };
    let not_patched = not_patched
        .map(|why| format!(" (not patched from the last compile: {why})"))
        .unwrap_or_default();
    report.passed(
        "compile",
        at,
        &format!(
            "{} resources{changed}; the compiler ran {ran_ms} ms, its export was read in {} ms{not_patched}",
            export.resources,
            read_at.elapsed().as_millis(),
        ),
    );
    drop(workdir);
    Ok(Built {
        report,
        export,
        withheld,
        sites,
    })
}

/// A line of the model that a diagnostic of a compile report points at, as its commit has it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct SourceLine {
    /// The file as the diagnostic names it (relative to the project).
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// The line without its end (cut after 2,000 characters).
    pub text: String,
}

/// Bounds of [`source_lines`]: lines looked up per report, characters kept per line, and
/// the largest file read.
const MAX_SOURCE_LINES: usize = 100;
const MAX_LINE_CHARS: usize = 2000;
const MAX_SOURCE_FILE: u64 = 4 << 20;

/// The lines the diagnostics of a report point at (their primary and secondary labels), read
/// from `commit` in the mirror. Only files of the project (under `project_path` in the
/// repository) can be found; lines of other files (built-in modules) are left out, and so
/// is everything when the mirror no longer has the commit. Blocking.
pub fn source_lines(
    mirror: &Path,
    commit: &str,
    project_path: &str,
    diagnostics: &Value,
) -> Vec<SourceLine> {
    let mut wanted: std::collections::BTreeMap<&str, std::collections::BTreeSet<usize>> =
        Default::default();
    let mut count = 0;
    for d in diagnostics.as_array().into_iter().flatten() {
        let labels =
            std::iter::once(&d["primary"]).chain(d["secondary"].as_array().into_iter().flatten());
        for l in labels {
            if let (Some(file), Some(line)) = (l["file"].as_str(), l["line"].as_u64())
                && count < MAX_SOURCE_LINES
                && wanted.entry(file).or_default().insert(line as usize)
            {
                count += 1;
            }
        }
    }
    let mut out = Vec::new();
    for (file, lines) in wanted {
        if file.starts_with('/') || file.split('/').any(|p| p == "..") {
            continue;
        }
        let path = if project_path.is_empty() {
            file.to_string()
        } else {
            format!("{}/{file}", project_path.trim_matches('/'))
        };
        let Ok(Some(bytes)) = git::read_file(mirror, commit, &path, MAX_SOURCE_FILE) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = text.lines().collect();
        for line in lines {
            // the line after the last one is where the file ends ("unexpected end of file")
            let text = match line.checked_sub(1).map(|i| all.get(i)) {
                Some(Some(t)) => t.chars().take(MAX_LINE_CHARS).collect(),
                Some(None) if line == all.len() + 1 => String::new(),
                _ => continue,
            };
            out.push(SourceLine {
                file: file.to_string(),
                line,
                text,
            });
        }
    }
    out
}

/// Write the environment's parameters and facts as a `--facts` file (for a preview, those
/// not secret); how many there are, and the keys withheld.
async fn write_facts_file(
    pool: &sqlx::PgPool,
    env: uuid::Uuid,
    path: &Path,
    preview: bool,
) -> Result<(usize, Vec<store::facts::ParamKey>), String> {
    let read = if preview {
        store::facts::list_for_preview(pool, env).await
    } else {
        store::facts::list(pool, env, None)
            .await
            .map(|rows| (rows, Vec::new()))
    };
    let (rows, withheld) =
        read.map_err(|e| format!("reading the environment's facts failed: {e}"))?;
    let mut facts = crate::model::facts::Facts::new();
    for r in &rows {
        facts.insert(r.resource_id.clone(), r.name.clone(), r.value.clone());
    }
    let text = facts.to_json();
    std::fs::write(path, text).map_err(|e| format!("can not write {}: {e}", path.display()))?;
    Ok((rows.len(), withheld))
}
