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
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host))
                if !rest.split('/').next().unwrap_or("").is_empty()
                    && rest.find('@') < rest.find('/') =>
            {
                format!("{scheme}://{host}")
            }
            _ => url.to_string(),
        },
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

/// Run the compile of `job` (a queued compile that was just marked running).
pub async fn run(
    pool: &sqlx::PgPool,
    job: &CompileRow,
    source: &SourceRow,
    mirror: &Path,
    steward_bin: &Path,
) -> CompileResult {
    let mut stages: Vec<Value> = job.stages.as_array().cloned().unwrap_or_default();
    let mut result = CompileResult {
        success: false,
        stages: Value::Null,
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        diagnostics: json!([]),
        error: None,
        version: None,
        auto_released: false,
    };

    // checkout
    let started = Utc::now();
    let t = Instant::now();
    let workdir = match tempfile::Builder::new()
        .prefix("steward-compile-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => {
            result.error = Some(format!("can not make a workdir: {e}"));
            stages.push(stage(
                "checkout",
                started,
                t.elapsed(),
                false,
                result.error.as_deref().unwrap_or(""),
            ));
            result.stages = json!(stages);
            return result;
        }
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
        Ok(Ok(())) => stages.push(stage(
            "checkout",
            started,
            t.elapsed(),
            true,
            &format!("commit {}", job.commit),
        )),
        Ok(Err(e)) => {
            result.error = Some(format!("checkout of {} failed: {e}", job.commit));
            stages.push(stage(
                "checkout",
                started,
                t.elapsed(),
                false,
                result.error.as_deref().unwrap_or(""),
            ));
            result.stages = json!(stages);
            return result;
        }
        Err(e) => {
            result.error = Some(format!("checkout crashed: {e}"));
            stages.push(stage(
                "checkout",
                started,
                t.elapsed(),
                false,
                result.error.as_deref().unwrap_or(""),
            ));
            result.stages = json!(stages);
            return result;
        }
    }

    // compile, in a child process
    let started = Utc::now();
    let t = Instant::now();
    let export_file = workdir.path().join("export.json");
    let timeout = Duration::from_secs(source.compile_timeout.max(1) as u64);
    let ran = run_compiler(steward_bin, &project, &export_file, timeout).await;
    let export = match ran {
        Err(e) => {
            result.error = Some(e);
            stages.push(stage(
                "compile",
                started,
                t.elapsed(),
                false,
                result.error.as_deref().unwrap_or(""),
            ));
            result.stages = json!(stages);
            return result;
        }
        Ok(out) => {
            result.exit_code = out.code;
            result.stdout = cap(out.stdout);
            result.stderr = cap(out.stderr.clone());
            // `compile --json` reports on stderr as one JSON document
            let report = out.stderr.lines().rev().find_map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(|v| v.get("diagnostics").is_some())
            });
            if let Some(r) = &report {
                result.diagnostics = r["diagnostics"].clone();
            }
            if out.code != Some(0) {
                let first = result.diagnostics[0]["message"]
                    .as_str()
                    .map(str::to_string);
                result.error = Some(match first {
                    Some(m) => format!("the model does not compile: {m}"),
                    None => format!("the compiler failed (exit status {:?})", out.code),
                });
                stages.push(stage(
                    "compile",
                    started,
                    t.elapsed(),
                    false,
                    result.error.as_deref().unwrap_or(""),
                ));
                result.stages = json!(stages);
                return result;
            }
            let read = std::fs::read(&export_file)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<ExportFile>(&b).map_err(|e| e.to_string()));
            match read {
                Ok(x) => {
                    stages.push(stage(
                        "compile",
                        started,
                        t.elapsed(),
                        true,
                        &format!("{} resources", x.resources.len()),
                    ));
                    x
                }
                Err(e) => {
                    result.error = Some(format!("the compiler's export is unreadable: {e}"));
                    stages.push(stage(
                        "compile",
                        started,
                        t.elapsed(),
                        false,
                        result.error.as_deref().unwrap_or(""),
                    ));
                    result.stages = json!(stages);
                    return result;
                }
            }
        }
    };
    drop(workdir);

    // store as a version
    let started = Utc::now();
    let t = Instant::now();
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
            stages.push(stage(
                "store",
                started,
                t.elapsed(),
                true,
                &format!("version {}", s.info.number),
            ));
            result.success = true;
            result.version = Some(s.info.number);
            result.auto_released = s.auto_released;
        }
        Err(e) => {
            result.error = Some(format!("storing the version failed: {e}"));
            stages.push(stage(
                "store",
                started,
                t.elapsed(),
                false,
                result.error.as_deref().unwrap_or(""),
            ));
        }
    }
    result.stages = json!(stages);
    result
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
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
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
    }
}
