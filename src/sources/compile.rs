//! Compiling one commit: check it out into a fresh temp workdir, run `steward compile` there as
//! a child process (its own process group, a clean environment, a timeout), and store the
//! export as a version with the commit's provenance. Every stage is timed into the report;
//! the workdir is removed however it ends.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::git;
use crate::model::ExportFile;
use crate::store::sources::{CompileRow, SourceRow};
use crate::store::{self, versions};

/// Output kept per stream in a report.
const MAX_OUTPUT: usize = 256 << 10;

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

/// The repository URL without credentials, for provenance and logs.
pub fn public_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // credentials live in the authority: before the first '/'
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{host}{}", &rest[end..]),
        None => url.to_string(),
    }
}

fn cap(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        let mut end = MAX_OUTPUT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("\n… (output cut)");
    }
    s
}

/// The report of a compile as it goes: timed stages, then the result.
struct Report {
    stages: Vec<Value>,
    result: CompileResult,
}

/// When a stage started: wall clock for the report, monotonic for its duration.
type Start = (chrono::DateTime<Utc>, Instant);

fn begin() -> Start {
    (Utc::now(), Instant::now())
}

impl Report {
    fn passed(&mut self, name: &str, at: Start, detail: &str) {
        self.stages
            .push(stage(name, at.0, at.1.elapsed(), true, detail));
    }

    /// The stage failed: the compile ends here.
    fn failed(mut self, name: &str, at: Start, error: String) -> CompileResult {
        self.stages
            .push(stage(name, at.0, at.1.elapsed(), false, &error));
        self.result.error = Some(error);
        self.done()
    }

    fn done(mut self) -> CompileResult {
        self.result.stages = json!(self.stages);
        self.result
    }
}

/// Run the compile of `job` (a queued compile that was just marked running).
pub async fn run(
    pool: &sqlx::PgPool,
    job: &CompileRow,
    source: &SourceRow,
    mirror: &Path,
    steward_bin: &Path,
) -> CompileResult {
    let mut report = Report {
        stages: job.stages.as_array().cloned().unwrap_or_default(),
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
        },
    };

    // checkout
    let at = begin();
    let workdir = match tempfile::Builder::new()
        .prefix("steward-compile-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => return report.failed("checkout", at, format!("can not make a workdir: {e}")),
    };
    let project = workdir.path().join("project");
    let subpath = (!source.path.is_empty()).then(|| source.path.clone());
    let checkout = {
        let (mirror, commit, project) = (mirror.to_path_buf(), job.commit.clone(), project.clone());
        tokio::task::spawn_blocking(move || {
            git::checkout(&mirror, &commit, &project, subpath.as_deref())
        })
        .await
    };
    match checkout {
        Ok(Ok(())) => report.passed("checkout", at, &format!("commit {}", job.commit)),
        Ok(Err(e)) => {
            return report.failed(
                "checkout",
                at,
                format!("checkout of {} failed: {e}", job.commit),
            );
        }
        Err(e) => return report.failed("checkout", at, format!("checkout crashed: {e}")),
    }

    // compile, in a child process
    let at = begin();
    let export_file = workdir.path().join("export.json");
    let timeout = Duration::from_secs(source.compile_timeout.max(1) as u64);
    let out = match run_compiler(steward_bin, &project, &export_file, timeout).await {
        Ok(out) => out,
        Err(e) => return report.failed("compile", at, e),
    };
    report.result.exit_code = out.code;
    report.result.stdout = cap(out.stdout);
    report.result.stderr = cap(out.stderr.clone());
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
            _ => format!("the compiler failed (exit status {:?})", out.code),
        };
        return report.failed("compile", at, error);
    }
    let export = match std::fs::read(&export_file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<ExportFile>(&b).map_err(|e| e.to_string()))
    {
        Ok(x) => x,
        Err(e) => {
            return report.failed(
                "compile",
                at,
                format!("the compiler's export is unreadable: {e}"),
            );
        }
    };
    report.passed(
        "compile",
        at,
        &format!("{} resources", export.resources.len()),
    );
    drop(workdir);

    // store as a version
    let at = begin();
    let provenance = json!({
        "repository": public_url(&source.url),
        "branch": job.branch,
        "commit": job.commit,
        "path": source.path,
        "compile": job.id,
        "trigger": job.trigger,
    });
    let stored = async {
        let mut tx = pool.begin().await.map_err(store::StoreError::from)?;
        let s = versions::store(
            &mut tx,
            job.environment_id,
            versions::NewVersion {
                export: &export,
                uploader: "git",
                origin: "git",
                provenance,
            },
        )
        .await?;
        store::audit::record(
            &mut *tx,
            "git",
            Some(job.environment_id),
            "version.compile",
            &s.info.number.to_string(),
            json!({"commit": job.commit, "compile": job.id, "auto_released": s.auto_released}),
        )
        .await?;
        tx.commit().await.map_err(store::StoreError::from)?;
        Ok::<_, store::StoreError>(s)
    }
    .await;
    match stored {
        Ok(s) => {
            report.passed("store", at, &format!("version {}", s.info.number));
            report.result.success = true;
            report.result.version = Some(s.info.number);
            report.result.auto_released = s.auto_released;
            report.done()
        }
        Err(e) => report.failed("store", at, format!("storing the version failed: {e}")),
    }
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `steward compile --json --export FILE -p DIR`, isolated from the server's environment.
async fn run_compiler(
    bin: &Path,
    project: &Path,
    export: &PathBuf,
    timeout: Duration,
) -> Result<Ran, String> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("compile")
        .arg("--json")
        .arg("--export")
        .arg(export)
        .arg("-p")
        .arg(project)
        .current_dir(project)
        // the model sees none of the server's secrets or settings
        .env_clear()
        .envs(crate::executor::passed_environment())
        .env("HOME", project)
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("can not start the compiler {}: {e}", bin.display()))?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let read_out = async {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b).await;
        b
    };
    let read_err = async {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b).await;
        b
    };
    let waited = tokio::time::timeout(timeout, async {
        let (o, e, status) = tokio::join!(read_out, read_err, child.wait());
        (o, e, status)
    })
    .await;
    match waited {
        Ok((o, e, status)) => Ok(Ran {
            code: status.ok().and_then(|s| s.code()),
            stdout: String::from_utf8_lossy(&o).into_owned(),
            stderr: String::from_utf8_lossy(&e).into_owned(),
        }),
        Err(_) => {
            if let Some(pid) = child.id() {
                // SAFETY: kill(2) on the process group we created for the compiler
                unsafe {
                    libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
                }
            }
            let _ = child.kill().await;
            Err(format!(
                "the compile did not finish within {} s and was stopped",
                timeout.as_secs()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::public_url;

    #[test]
    fn credentials_never_leave() {
        assert_eq!(
            public_url("https://user:tok@git.example.com/a/b.git"),
            "https://git.example.com/a/b.git"
        );
        assert_eq!(public_url("ssh://git@host/repo.git"), "ssh://host/repo.git");
        assert_eq!(public_url("file:///srv/git/x.git"), "file:///srv/git/x.git");
        assert_eq!(public_url("https://host/a@b"), "https://host/a@b");
        assert_eq!(public_url("https://user:tok@host"), "https://host");
    }
}
