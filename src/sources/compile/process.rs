//! Running the compiler as a child process: its jail and limits, the clean environment it
//! gets, its output (kept to its head and tail), the export it writes, and the Python
//! environments its requirements need. What a compile of a commit or a preview shares.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::{COMPILE_FILE_SIZE, COMPILE_MEMORY, COMPILE_OPEN_FILES, KEEP_OUTPUT, MAX_EXPORT};
use crate::sandbox;

/// The text of the export the compiler wrote, refused over [`MAX_EXPORT`].
pub(super) fn read_export(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len > MAX_EXPORT {
        return Err(format!(
            "it is {} MiB, over the {} MiB limit",
            len >> 20,
            MAX_EXPORT >> 20
        ));
    }
    let mut b = Vec::with_capacity(len as usize);
    f.take(MAX_EXPORT + 1)
        .read_to_end(&mut b)
        .map_err(|e| e.to_string())?;
    if b.len() as u64 > MAX_EXPORT {
        return Err(format!("it is over the {} MiB limit", MAX_EXPORT >> 20));
    }
    Ok(b)
}

pub(super) struct Ran {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A stream read to its end keeping only its first and last `keep` bytes: the memory a
/// compile's output takes in the server is bounded whatever the model prints.
pub(super) async fn read_capped(mut r: impl tokio::io::AsyncRead + Unpin, keep: usize) -> String {
    let mut head: Vec<u8> = Vec::new();
    let mut tail: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut total: u64 = 0;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        total += n as u64;
        let mut chunk = &buf[..n];
        if head.len() < keep {
            let take = chunk.len().min(keep - head.len());
            head.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
        }
        tail.extend(chunk);
        if tail.len() > keep {
            tail.drain(..tail.len() - keep);
        }
    }
    let cut = total - head.len() as u64 - tail.len() as u64;
    let mut s = String::from_utf8_lossy(&head).into_owned();
    if cut > 0 {
        s.push_str(&format!(
            "\n… (output cut: {cut} of {total} bytes left out, the first and last {} KiB kept) …\n",
            keep >> 10
        ));
    }
    s.push_str(&String::from_utf8_lossy(tail.make_contiguous()));
    s
}

/// The jail of the compiles of environment `env`: its compile identity,
/// a PID namespace where the kernel gives one, and the limits of docs/isolation.md.
pub(super) fn compile_jail(
    env: uuid::Uuid,
    role: sandbox::Role,
    timeout: Duration,
    data_dir: Option<&Path>,
) -> Result<sandbox::Jail, sandbox::SandboxError> {
    let cpu = timeout.as_secs().max(1);
    let jail = sandbox::Jail::for_environment(env, role)?;
    // a server that is not root: compiles share its uid, so its files are hidden instead
    let jail = match data_dir {
        Some(d) => jail.hide_server_files(d),
        None => jail,
    };
    Ok(jail
        .limit(libc::RLIMIT_CPU, cpu, cpu + 5)
        .limit(libc::RLIMIT_AS, COMPILE_MEMORY, COMPILE_MEMORY)
        .limit(libc::RLIMIT_FSIZE, COMPILE_FILE_SIZE, COMPILE_FILE_SIZE)
        .limit(libc::RLIMIT_NOFILE, COMPILE_OPEN_FILES, COMPILE_OPEN_FILES)
        .limit(libc::RLIMIT_CORE, 0, 0))
}

/// Largest requirements.txt the server reads.
const MAX_REQUIREMENTS: u64 = 1 << 20;

pub(super) fn read_requirements(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| format!("can not read requirements.txt: {e}"))?;
    if !meta.is_file() {
        return Err("requirements.txt is not a regular file".into());
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_REQUIREMENTS + 1).read_to_string(&mut text))
        .map_err(|e| format!("can not read requirements.txt: {e}"))?;
    if text.len() as u64 > MAX_REQUIREMENTS {
        return Err(format!(
            "requirements.txt is over {} KiB",
            MAX_REQUIREMENTS >> 10
        ));
    }
    Ok(text)
}

/// The directory of the Python environments of environment `env` (`<python-envs>/<env>/`): reachable by its compiles only (group of `identity`), never
/// by another environment's.
pub(super) fn environment_envs(
    envs: &Path,
    env: uuid::Uuid,
    identity: Option<sandbox::Identity>,
) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    // (the data directory, `envs` included, was opened to compiles when this one began)
    let own = envs.join(env.to_string());
    let io = |e: std::io::Error| format!("can not make {}: {e}", own.display());
    std::fs::create_dir_all(&own).map_err(io)?;
    if let Some(id) = identity {
        std::os::unix::fs::lchown(&own, Some(0), Some(id.gid)).map_err(io)?;
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o750)).map_err(io)?;
    } else {
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(own)
}

/// The interpreter environments are made with: `python3` from `PATH`, unless compiles run as
/// another user who could not run it (an interpreter under the server user's home, such as
/// a pyenv shim): then the first system one that user can run.
pub(super) fn base_python(other_user: bool) -> String {
    use std::os::unix::fs::PermissionsExt;
    if !other_user {
        return "python3".into();
    }
    // every directory on the way and the file itself open to others
    let open_to_others = |p: &Path| {
        let Ok(real) = p.canonicalize() else {
            return false;
        };
        real.ancestors()
            .all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
    };
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("python3"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/bin/python3".into(), "/usr/local/bin/python3".into()])
        .find(|p: &PathBuf| p.is_file() && open_to_others(p))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "python3".into())
}

/// `steward compile --json --export FILE -p DIR`, isolated from the server and from every
/// other compile by `jail` (its identity, namespaces and limits: see docs/isolation.md), with
/// a clean environment and a private TMPDIR inside `workdir`.
/// The files a compile reads and writes besides its project.
pub(super) struct Files<'a> {
    /// Where it writes the export.
    pub export: &'a Path,
    /// The environment's parameters and facts (`--facts`).
    pub facts: &'a Path,
    /// Where it writes what a later compile can be patched from (`--remember`), if asked.
    pub remember: Option<&'a Path>,
}

pub(super) async fn run_compiler(
    bin: &Path,
    jail: &sandbox::Jail,
    workdir: &Path,
    project: &Path,
    files: Files<'_>,
    timeout: Duration,
    virtual_env: Option<&Path>,
) -> Result<Ran, String> {
    let tmp = workdir.join("tmp");
    std::fs::create_dir(&tmp).map_err(|e| format!("can not make {}: {e}", tmp.display()))?;
    if let Some(id) = jail.identity {
        sandbox::chown_tree(workdir, id)
            .map_err(|e| format!("can not hand the workdir to the compile's user: {e}"))?;
    }
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("compile")
        .arg("--json")
        .arg("--export")
        .arg(files.export)
        .arg("--facts")
        .arg(files.facts)
        .args(
            files
                .remember
                .map(|f| [std::ffi::OsStr::new("--remember"), f.as_os_str()])
                .into_iter()
                .flatten(),
        )
        .arg("-p")
        .arg(project)
        .current_dir(project)
        // the model sees none of the server's secrets or settings
        .env_clear()
        .envs(crate::executor::passed_environment())
        .env("HOME", project)
        .env("TMPDIR", &tmp)
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(id) = jail.identity {
        let name = format!("steward-{}", id.uid);
        cmd.env("USER", &name).env("LOGNAME", &name);
    }
    if let Some(venv) = virtual_env {
        // the compiler finds V2 modules and runs plugins in the project's environment
        cmd.env("VIRTUAL_ENV", venv);
    }
    jail.apply(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("can not start the compiler {}: {e}", bin.display()))?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let waited = tokio::time::timeout(timeout, async {
        tokio::join!(
            read_capped(out, KEEP_OUTPUT),
            read_capped(err, KEEP_OUTPUT),
            child.wait()
        )
    })
    .await;
    match waited {
        Ok((o, e, status)) => {
            use std::os::unix::process::ExitStatusExt;
            let status = status.ok();
            Ok(Ran {
                code: status.and_then(|s| s.code()),
                signal: status.and_then(|s| s.signal()),
                stdout: o,
                stderr: e,
            })
        }
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
    use super::*;

    #[tokio::test]
    async fn output_keeps_its_head_and_tail_and_says_what_was_cut() {
        let mut big = Vec::new();
        for i in 0..100_000 {
            big.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        let total = big.len();
        let kept = read_capped(&big[..], 1024).await;
        assert!(kept.starts_with("line 0\nline 1\n"));
        assert!(kept.ends_with("line 99999\n"));
        assert!(
            kept.contains(&format!(
                "output cut: {} of {total} bytes left out",
                total - 2048
            )),
            "{kept}"
        );
        assert!(kept.len() < 2048 + 200);
        // short output is kept whole, without a note
        assert_eq!(read_capped(&b"short\n"[..], 1024).await, "short\n");
        let exact = vec![b'x'; 2048];
        assert_eq!(read_capped(&exact[..], 1024).await.len(), 2048);
    }

    #[test]
    fn an_export_over_the_limit_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("export.json");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_EXPORT + 1).unwrap(); // sparse: no disk used
        let err = read_export(&path).err().unwrap();
        assert!(err.contains("over the 256 MiB limit"), "{err}");
    }

    /// The compiler's process as the server starts it: a stand-in reporting what it sees.
    #[tokio::test]
    async fn the_compiler_runs_limited_with_its_own_tmpdir() {
        use std::os::unix::fs::PermissionsExt;
        let work = tempfile::Builder::new()
            .prefix("steward-compile-")
            .tempdir()
            .unwrap();
        let project = work.path().join("project");
        std::fs::create_dir(&project).unwrap();
        let bin = work.path().join("fake-steward");
        std::fs::write(
            &bin,
            "#!/bin/sh\necho uid=$(id -u) tmp=$TMPDIR cpu=$(ulimit -t) mem=$(ulimit -v) \\\n  files=$(ulimit -n) fsize=$(ulimit -f) core=$(ulimit -c) home=$HOME\n",
        )
        .unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = uuid::Uuid::new_v4();
        let jail = compile_jail(env, sandbox::Role::Compile, Duration::from_secs(7), None).unwrap();
        let ran = run_compiler(
            &bin,
            &jail,
            work.path(),
            &project,
            Files {
                export: &work.path().join("export.json"),
                facts: &work.path().join("facts.json"),
                remember: None,
            },
            Duration::from_secs(7),
            None,
        )
        .await
        .unwrap();
        assert_eq!(ran.code, Some(0), "{}", ran.stderr);
        let tmp = work.path().join("tmp");
        let root = unsafe { libc::geteuid() } == 0;
        let uid = if root {
            sandbox::identity(env, sandbox::Role::Compile)
                .unwrap()
                .unwrap()
                .uid
        } else {
            unsafe { libc::geteuid() }
        };
        assert_eq!(
            ran.stdout.trim(),
            format!(
                "uid={uid} tmp={} cpu=7 mem={} files={COMPILE_OPEN_FILES} fsize={} core=0 home={}",
                tmp.display(),
                COMPILE_MEMORY >> 10,
                COMPILE_FILE_SIZE / 512,
                project.display()
            )
        );
        if root {
            assert_ne!(uid, 0);
            use std::os::unix::fs::MetadataExt;
            assert_eq!(std::fs::metadata(&tmp).unwrap().uid(), uid);
        }
    }
}
