//! Python environments made from a project's `requirements.txt`: where Inmanta projects keep
//! their modules (V2 modules are `inmanta-module-<name>` packages) and their plugins' Python
//! dependencies.
//!
//! An environment is a virtualenv created with `python3 -m venv` and filled with
//! `pip install -r`. It is marked, once complete, with the key of what it was made from (the
//! requirements' text and the base interpreter's version), so the same requirements reuse it
//! and changed ones rebuild it; a half-made one (a crash, a failed install) is never used.
//! Two processes making the same environment wait for each other (a lock file beside it).
//!
//! Used by `steward project install` (`<project>/.steward/venv`) and by the git-following
//! server, which keeps one environment per key under its data directory so that commits with
//! the same requirements share it.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// The marker inside a complete environment: the key it was made for.
const MARKER: &str = ".steward-requirements";

#[derive(Debug, thiserror::Error)]
pub enum PyEnvError {
    #[error("can not run {python}: {error} (is Python 3 installed? --python names another)")]
    NoPython { python: String, error: String },
    #[error("{what} failed (exit status {code:?}):\n{output}")]
    Failed {
        what: String,
        code: Option<i32>,
        output: String,
    },
    #[error("{what} {}: {error}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PyEnvError {
    let path = path.to_path_buf();
    move |error| PyEnvError::Io { what, path, error }
}

/// How to make an environment.
#[derive(Clone, Debug)]
pub struct InstallOptions {
    /// The interpreter the environment is made with.
    pub base_python: String,
    /// Install wheels only (`--only-binary :all:`): installing then runs no code from the
    /// packages (an sdist's build would). The server always asks for it.
    pub only_binary: bool,
}

impl Default for InstallOptions {
    fn default() -> Self {
        InstallOptions {
            base_python: "python3".into(),
            only_binary: false,
        }
    }
}

/// What [`ensure`] did.
#[derive(Debug)]
pub struct Ensured {
    /// The environment's directory (`bin/python3` inside).
    pub dir: PathBuf,
    /// Made now (false: it was there, complete, for the same key).
    pub created: bool,
    /// What venv and pip printed.
    pub output: String,
    pub key: String,
}

impl Ensured {
    pub fn python(&self) -> PathBuf {
        python_of(&self.dir)
    }
}

/// The interpreter of the environment at `dir`.
pub fn python_of(dir: &Path) -> PathBuf {
    dir.join("bin").join("python3")
}

/// The version line of an interpreter (`Python 3.11.7`), asked once per process.
pub fn python_version(python: &str) -> Result<String, PyEnvError> {
    static SEEN: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);
    if let Some(v) = SEEN.lock().unwrap().as_ref().and_then(|m| m.get(python)) {
        return Ok(v.clone());
    }
    let v = ask_version(python)?;
    SEEN.lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(python.to_string(), v.clone());
    Ok(v)
}

fn ask_version(python: &str) -> Result<String, PyEnvError> {
    let out = Command::new(python)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| PyEnvError::NoPython {
            python: python.into(),
            error: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(PyEnvError::NoPython {
            python: python.into(),
            error: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    Ok(text.trim().to_string())
}

/// The key of an environment made from `requirements` (its text, line endings and blank
/// lines aside) with an interpreter of `python_version`, hex.
pub fn key(requirements: &str, python_version: &str) -> String {
    let mut h = Sha256::new();
    h.update(python_version.as_bytes());
    h.update([0]);
    for line in requirements
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        h.update(line.as_bytes());
        h.update([b'\n']);
    }
    hex::encode(h.finalize())
}

/// Make (or reuse) the environment for `requirements` under `envs`, named by its key: what
/// a server does, so that every commit with the same requirements shares one.
pub fn ensure_shared(
    envs: &Path,
    requirements: &str,
    base: &Path,
    opts: &InstallOptions,
) -> Result<Ensured, PyEnvError> {
    let version = python_version(&opts.base_python)?;
    let name = &key(requirements, &version)[..24];
    ensure(&envs.join(name), requirements, base, opts)
}

/// Whether the environment at `dir` is complete for `key`.
pub fn is_ready(dir: &Path, key: &str) -> bool {
    std::fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m.trim() == key)
        && python_of(dir).exists()
}

/// Make (or reuse) the environment at `dir` for `requirements` (the text of a
/// requirements file; `base` is the directory its relative paths are read from).
pub fn ensure(
    dir: &Path,
    requirements: &str,
    base: &Path,
    opts: &InstallOptions,
) -> Result<Ensured, PyEnvError> {
    let version = python_version(&opts.base_python)?;
    let key = key(requirements, &version);
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
    let lock_path = dir.with_extension("lock");
    let lock = std::fs::File::create(&lock_path).map_err(io("creating", &lock_path))?;
    // another process making it: wait, then use what it made
    lock.lock().map_err(io("locking", &lock_path))?;
    if is_ready(dir, &key) {
        return Ok(Ensured {
            dir: dir.to_path_buf(),
            created: false,
            output: String::new(),
            key,
        });
    }
    if dir.exists() {
        // made for other requirements, or left half-made
        std::fs::remove_dir_all(dir).map_err(io("removing", dir))?;
    }
    let mut output = String::new();
    run(
        Command::new(&opts.base_python)
            .arg("-m")
            .arg("venv")
            .arg(dir),
        &format!("{} -m venv {}", opts.base_python, dir.display()),
        &mut output,
    )?;
    let req_file = dir.join("requirements.txt");
    std::fs::write(&req_file, requirements).map_err(io("writing", &req_file))?;
    let mut pip = Command::new(python_of(dir));
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
    ]);
    if opts.only_binary {
        pip.args(["--only-binary", ":all:"]);
    }
    pip.arg("-r").arg(&req_file).current_dir(base);
    run(&mut pip, "pip install -r requirements.txt", &mut output)?;
    let marker = dir.join(MARKER);
    let mut f = std::fs::File::create(&marker).map_err(io("writing", &marker))?;
    f.write_all(key.as_bytes())
        .map_err(io("writing", &marker))?;
    Ok(Ensured {
        dir: dir.to_path_buf(),
        created: true,
        output,
        key,
    })
}

fn run(cmd: &mut Command, what: &str, output: &mut String) -> Result<(), PyEnvError> {
    let out = cmd
        .stdin(Stdio::null())
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .output()
        .map_err(|e| PyEnvError::Failed {
            what: what.into(),
            code: None,
            output: e.to_string(),
        })?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    output.push_str(&format!("$ {what}\n{text}"));
    if !out.status.success() {
        return Err(PyEnvError::Failed {
            what: what.into(),
            code: out.status.code(),
            output: text,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_ignore_blank_lines_and_follow_the_python_version() {
        let a = key("pyyaml==6.0.2\n\ninmanta-module-yaml\n", "Python 3.11.7");
        assert_eq!(
            a,
            key("  pyyaml==6.0.2\r\ninmanta-module-yaml", "Python 3.11.7")
        );
        assert_ne!(
            a,
            key("pyyaml==6.0.1\ninmanta-module-yaml", "Python 3.11.7")
        );
        assert_ne!(
            a,
            key("pyyaml==6.0.2\ninmanta-module-yaml", "Python 3.12.1")
        );
    }

    #[test]
    fn a_missing_interpreter_is_named() {
        let e = python_version("/nonexistent/python3").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/python3"), "{e}");
    }

    #[test]
    fn an_environment_is_made_once_and_remade_for_other_requirements() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        let opts = InstallOptions::default();
        // nothing to install: no network needed
        let first = ensure(&venv, "# nothing\n", dir.path(), &opts).unwrap();
        assert!(first.created && first.python().exists());
        let again = ensure(&venv, "# nothing\n\n", dir.path(), &opts).unwrap();
        assert!(!again.created);
        // a failed install leaves no usable environment
        let bad = ensure(&venv, "-r does-not-exist.txt\n", dir.path(), &opts).unwrap_err();
        assert!(bad.to_string().contains("does-not-exist.txt"), "{bad}");
        assert!(!is_ready(&venv, &first.key));
        let remade = ensure(&venv, "# nothing\n", dir.path(), &opts).unwrap();
        assert!(remade.created);
    }
}
