//! The project's Python environment: its interpreter, the V2 modules installed in it, and
//! what `requirements.txt` and installed distributions say about modules.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The Python interpreter of a project and, once asked, its `sys.path`.
#[derive(Clone, Debug)]
pub struct PythonEnv {
    pub interpreter: PathBuf,
    sys_path: std::sync::Arc<std::sync::OnceLock<Result<Vec<PathBuf>, String>>>,
}

impl PythonEnv {
    /// The interpreter: `explicit` > `$VIRTUAL_ENV/bin/python3` >
    /// `<project>/.steward/venv/bin/python3` when it exists > `python3` on `PATH`.
    pub fn choose(explicit: Option<&Path>, project_dir: &Path) -> PythonEnv {
        let interpreter = explicit
            .map(Path::to_path_buf)
            .or_else(|| {
                std::env::var_os("VIRTUAL_ENV")
                    .filter(|v| !v.is_empty())
                    .map(|v| PathBuf::from(v).join("bin").join("python3"))
            })
            .or_else(|| {
                let p = project_dir.join(".steward/venv/bin/python3");
                p.exists().then_some(p)
            })
            .unwrap_or_else(|| PathBuf::from("python3"));
        PythonEnv {
            interpreter,
            sys_path: Default::default(),
        }
    }

    /// Take `paths` as the interpreter's `sys.path` rather than asking it (the compiler's
    /// plugin host, started to answer this, runs that interpreter already).
    pub fn set_sys_path(&self, paths: Vec<PathBuf>) {
        let _ = self.sys_path.set(Ok(paths));
    }

    /// The interpreter's `sys.path` (asked once).
    pub fn sys_path(&self) -> Result<&[PathBuf], String> {
        self.sys_path
            .get_or_init(|| {
                let out = std::process::Command::new(&self.interpreter)
                    .args(["-I", "-c", "import sys, json; print(json.dumps(sys.path))"])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| format!("can not run {}: {e}", self.interpreter.display()))?;
                if !out.status.success() {
                    return Err(format!(
                        "{} failed: {}",
                        self.interpreter.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                }
                let paths: Vec<String> = serde_json::from_slice(&out.stdout).map_err(|e| {
                    format!("{}: unexpected sys.path: {e}", self.interpreter.display())
                })?;
                Ok(paths
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
                    .collect())
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// The directory of an installed V2 module: `<entry>/inmanta_plugins/<name>` holding a
    /// model.
    pub fn find_v2(&self, name: &str) -> Result<Option<PathBuf>, String> {
        for entry in self.sys_path()? {
            let dir = entry.join("inmanta_plugins").join(name);
            if dir.join("model").join("_init.cf").is_file() || dir.join("setup.cfg").is_file() {
                return Ok(Some(dir));
            }
        }
        Ok(None)
    }
}

/// Module names pinned by `requirements.txt`: `inmanta-module-<name>` lines.
pub(super) fn pinned_modules(dir: &Path) -> HashSet<String> {
    let Ok(text) = std::fs::read_to_string(dir.join("requirements.txt")) else {
        return HashSet::new();
    };
    text.lines().filter_map(module_of_requirement).collect()
}

/// The module a requirement line names (`inmanta-module-foo-bar>=1.0` -> `foo_bar`), if any.
pub fn module_of_requirement(line: &str) -> Option<String> {
    let l = line
        .split('#')
        .next()?
        .trim()
        .to_ascii_lowercase()
        .replace('_', "-");
    let rest = l.strip_prefix("inmanta-module-")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or(rest.len());
    let name = rest[..end].replace('-', "_");
    (!name.is_empty()).then_some(name)
}

/// Requirement lines of a `requirements.txt` (comments, options and blanks left out).
pub(super) fn requirement_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with('-'))
        .map(str::to_string)
        .collect()
}

/// What the installed distribution `inmanta-module-<name>` says of itself.
#[derive(Default)]
pub(super) struct DistInfo {
    pub version: String,
    /// `Requires-Dist` (extras-only requirements left out).
    pub requires: Vec<String>,
    /// Python files the distribution installs outside `inmanta_plugins/` (from its `RECORD`),
    /// such as the mitogen module's `inmanta_mitogen` package: (path under site-packages,
    /// absolute path). Its handlers import them, so they ship with the handler code.
    pub extra_python: Vec<(String, std::path::PathBuf)>,
}

/// [`DistInfo`] of `inmanta-module-<name>`, from its `.dist-info` next to `inmanta_plugins/`
/// (version `0.0.0` and nothing else when not found).
pub(super) fn dist_metadata(pkg_dir: &Path, name: &str) -> DistInfo {
    let unknown = || DistInfo {
        version: "0.0.0".into(),
        ..Default::default()
    };
    let Some(site) = pkg_dir.parent().and_then(Path::parent) else {
        return unknown();
    };
    let prefix = format!("inmanta_module_{name}-");
    let found = std::fs::read_dir(site).ok().and_then(|entries| {
        entries.flatten().find(|e| {
            let n = e.file_name().to_string_lossy().to_ascii_lowercase();
            n.starts_with(&prefix) && n.ends_with(".dist-info")
        })
    });
    let Some(dist) = found.map(|e| e.path()) else {
        return unknown();
    };
    let Ok(meta) = std::fs::read_to_string(dist.join("METADATA")) else {
        return unknown();
    };
    let extra_python = std::fs::read_to_string(dist.join("RECORD"))
        .map(|record| extra_python_files(site, &record))
        .unwrap_or_default();
    let mut version = "0.0.0".to_string();
    let mut requires = Vec::new();
    for line in meta.lines() {
        if line.is_empty() {
            break; // the body follows the headers
        }
        if let Some(v) = line.strip_prefix("Version:") {
            version = v.trim().to_string();
        } else if let Some(r) = line.strip_prefix("Requires-Dist:") {
            let r = r.trim();
            // extras-only requirements are not needed to run
            if !r.contains("extra ==") {
                requires.push(r.to_string());
            }
        }
    }
    DistInfo {
        version,
        requires,
        extra_python,
    }
}

/// The `.py` files a `RECORD` lists outside `inmanta_plugins/`, the `.dist-info` and anything
/// installed outside site-packages (scripts: `../../bin/…`), that exist.
fn extra_python_files(site: &Path, record: &str) -> Vec<(String, std::path::PathBuf)> {
    let mut out: Vec<(String, std::path::PathBuf)> = record
        .lines()
        .filter_map(|line| line.split(',').next())
        .filter(|path| {
            path.ends_with(".py")
                && !path.starts_with("inmanta_plugins/")
                && !path.starts_with("..")
                && !path.starts_with('/')
                && !path
                    .split('/')
                    .any(|c| c.ends_with(".dist-info") || c == "__pycache__")
        })
        .map(|path| (path.to_string(), site.join(path)))
        .filter(|(_, abs)| abs.is_file())
        .collect();
    out.sort();
    out
}
