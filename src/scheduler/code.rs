//! Handler code on disk for the executors: each code digest of a module's handler is written
//! once, from the database, into `<code dir>/<digest>/` (atomically: a temp dir renamed into
//! place, marked complete), next to `_lib/` holding steward's Python helper. Directories are
//! named by content, so a version deploys with exactly its own code, and versions that share
//! code share the directory.
//!
//! [`run_reaper`] removes the directories of code no stored version uses any more (after a
//! grace period), and what a crash left half-written: without it every version with new code
//! (an `fs::File` whose content changed ships that content with its handler code) would leave
//! a directory behind for ever.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sqlx::PgPool;

use crate::executor::external::PYTHON_HELPER;
use crate::model::HandlerCode;
use crate::store;

const COMPLETE: &str = ".complete";

pub struct CodeCache {
    dir: PathBuf,
    helper_written: bool,
}

impl CodeCache {
    pub fn new(dir: PathBuf) -> CodeCache {
        CodeCache {
            dir,
            helper_written: false,
        }
    }

    /// The directory of `code`, written if it is not on disk yet.
    pub async fn ensure(&mut self, pool: &PgPool, code: &HandlerCode) -> Result<PathBuf, String> {
        let target = self.dir.join(&code.digest);
        if !self.helper_written {
            write_helper(&self.dir).map_err(|e| {
                format!(
                    "writing the Python helper under {}: {e}",
                    self.dir.display()
                )
            })?;
            // Steward's Python package too: executors that may not write here find it
            crate::pycompat::materialize(&self.dir).map_err(|e| {
                format!(
                    "writing Steward's Python package under {}: {e}",
                    self.dir.display()
                )
            })?;
            self.helper_written = true;
        }
        // looked at every time (one stat): the reaper may have removed a directory whose code
        // a later version uses again
        if target.join(COMPLETE).is_file() {
            return Ok(target);
        }
        let hashes: Vec<String> = code.files.values().map(|f| f.hash.clone()).collect();
        let blobs = store::code::blobs(pool, &hashes)
            .await
            .map_err(|e| format!("loading handler code: {e}"))?;
        let (dir, code2) = (self.dir.clone(), code.clone());
        let written = tokio::task::spawn_blocking(move || write_code(&dir, &code2, &blobs))
            .await
            .map_err(|e| format!("writing handler code crashed: {e}"))?;
        written?;
        Ok(target)
    }
}

/// Write `code` under `dir/<digest>/` (and the Python helper under `dir/_lib/`) from its
/// files' contents: what an agent process does with code it fetched from the server.
pub fn materialize(
    dir: &Path,
    code: &HandlerCode,
    blobs: &std::collections::HashMap<String, Vec<u8>>,
) -> Result<PathBuf, String> {
    write_helper(dir)
        .map_err(|e| format!("writing the Python helper under {}: {e}", dir.display()))?;
    let target = dir.join(&code.digest);
    if !target.join(COMPLETE).is_file() {
        write_code(dir, code, blobs)?;
    }
    Ok(target)
}

fn write_helper(dir: &Path) -> std::io::Result<()> {
    let lib = dir.join("_lib");
    std::fs::create_dir_all(&lib)?;
    let path = lib.join("steward_handler.py");
    if std::fs::read_to_string(&path).ok().as_deref() == Some(PYTHON_HELPER) {
        return Ok(());
    }
    let tmp = lib.join(format!(".steward_handler.py.{}", std::process::id()));
    std::fs::write(&tmp, PYTHON_HELPER)?;
    std::fs::rename(&tmp, &path)
}

fn write_code(
    dir: &Path,
    code: &HandlerCode,
    blobs: &std::collections::HashMap<String, Vec<u8>>,
) -> Result<(), String> {
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let target = dir.join(&code.digest);
    let tmp = dir.join(format!(".tmp-{}-{}", code.digest, uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&tmp).map_err(|e| io("creating", &tmp, e))?;
    let result = (|| {
        for (rel, f) in &code.files {
            let relp = Path::new(rel);
            if relp
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            {
                return Err(format!("refusing handler file path '{rel}'"));
            }
            let content = blobs
                .get(&f.hash)
                .ok_or_else(|| format!("handler file {rel} ({}) is not stored", f.hash))?;
            let path = tmp.join(relp);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
            }
            std::fs::write(&path, content).map_err(|e| io("writing", &path, e))?;
            let mode = if f.executable { 0o755 } else { 0o644 };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| io("setting the mode of", &path, e))?;
        }
        std::fs::write(tmp.join(COMPLETE), &code.digest).map_err(|e| io("writing", &tmp, e))?;
        if target.exists() && !target.join(COMPLETE).is_file() {
            // left half-written by a crash
            let _ = std::fs::remove_dir_all(&target);
        }
        match std::fs::rename(&tmp, &target) {
            Ok(()) => Ok(()),
            // written meanwhile by another scheduler: same content, keep theirs
            Err(_) if target.join(COMPLETE).is_file() => Ok(()),
            Err(e) => Err(io("placing", &target, e)),
        }
    })();
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// How long unused code stays on disk: a version being stored may be about to use it again
/// (the same grace the database's code blobs get).
pub const REAP_GRACE: Duration = Duration::from_secs(3600);

/// What one pass of the reaper removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Code directories no stored version uses.
    pub unused: usize,
    /// Temporary or half-written directories a crash left.
    pub leftovers: usize,
}

fn age(path: &Path) -> Option<Duration> {
    let modified = std::fs::symlink_metadata(path).ok()?.modified().ok()?;
    SystemTime::now().duration_since(modified).ok()
}

/// Removes what executors no longer need from a code directory, pass by pass. It remembers
/// since when it has seen each code directory unused, so a directory goes only after `grace`
/// of being unused without a break (however old it is): a version stored meanwhile with the
/// same code finds it still there.
pub struct Reaper {
    dir: PathBuf,
    grace: Duration,
    unused_since: HashMap<PathBuf, Instant>,
}

impl Reaper {
    pub fn new(dir: PathBuf, grace: Duration) -> Reaper {
        Reaper {
            dir,
            grace,
            unused_since: HashMap::new(),
        }
    }

    /// One pass: remove the code directories whose digest has not been in `live` for
    /// `grace`, temporary and never completed directories older than `grace`, and
    /// `steward-python-*` trees of other binaries older than `grace`. `_lib/`, the
    /// virtualenvs under `_venv/` (shared by requirement set, not by version) and anything
    /// else not named by a digest stay. A directory is first renamed out of the way, so an
    /// executor never sees one half-removed.
    pub fn pass(&mut self, live: &HashSet<String>) -> std::io::Result<Reaped> {
        let mut reaped = Reaped::default();
        let mut seen = HashSet::new();
        let root = self.dir.clone();
        self.pass_dir(&root, live, &mut reaped, &mut seen, true)?;
        // forget what is used again or gone
        self.unused_since.retain(|path, _| seen.contains(path));
        Ok(reaped)
    }

    /// One pass over `dir`: the code root (`top`), whose `env-<uuid>/` directories (each
    /// environment's code, see `env/isolation.rs`) are passed over the same way, or one of
    /// those.
    fn pass_dir(
        &mut self,
        dir: &Path,
        live: &HashSet<String>,
        reaped: &mut Reaped,
        seen: &mut HashSet<PathBuf>,
        top: bool,
    ) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        let grace = self.grace;
        let old = |p: &Path| age(p).is_some_and(|a| a > grace);
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let path = entry.path();
            if name.starts_with('_') || !path.is_dir() {
                continue;
            }
            if top && name.starts_with("env-") {
                self.pass_dir(&path, live, reaped, seen, false)?;
                continue;
            }
            let leftover = name.starts_with(".tmp-") || name.starts_with(".reap-");
            let digest = !name.is_empty() && name.bytes().all(|b| b.is_ascii_hexdigit());
            let kind = if leftover {
                old(&path).then_some(&mut reaped.leftovers)
            } else if name.starts_with("steward-python-") {
                // Steward's own Python, per binary: an older binary's copy is not used any more
                (name != crate::pycompat::dir_name() && old(&path.join(COMPLETE)))
                    .then_some(&mut reaped.unused)
            } else if !digest {
                None
            } else if !path.join(COMPLETE).is_file() {
                old(&path).then_some(&mut reaped.leftovers)
            } else if live.contains(&name) {
                None
            } else {
                seen.insert(path.clone());
                let since = *self.unused_since.entry(path.clone()).or_insert(now);
                (now.duration_since(since) >= grace).then_some(&mut reaped.unused)
            };
            let Some(count) = kind else { continue };
            if leftover {
                std::fs::remove_dir_all(&path)?;
            } else if crate::pyenv::reap::remove_unless_held(&path) {
                // (renamed out of the way first, with its lock file; one a handler process
                // still runs in is held and stays)
                self.unused_since.remove(&path);
            } else {
                continue;
            }
            *count += 1;
        }
        Ok(())
    }
}

/// Reap `dir` every `every`, for ever, against the digests the stored versions use. A pass
/// that fails (the database away, a file that can not be removed) is logged and tried again
/// at the next one.
pub async fn run_reaper(pool: PgPool, dir: PathBuf, every: Duration, grace: Duration) {
    let reaper = std::sync::Arc::new(std::sync::Mutex::new(Reaper::new(dir.clone(), grace)));
    loop {
        match store::code::live_digests(&pool).await {
            Ok(live) => {
                let r = reaper.clone();
                let pass = move || r.lock().unwrap_or_else(|e| e.into_inner()).pass(&live);
                match tokio::task::spawn_blocking(pass).await {
                    Ok(Ok(r)) if r != Reaped::default() => {
                        tracing::info!(unused = r.unused, leftovers = r.leftovers, dir = %dir.display(), "handler code directories removed")
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, dir = %dir.display(), "removing unused handler code failed; trying again later")
                    }
                    Err(e) => tracing::warn!(error = %e, "the handler code reaper crashed"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "listing the handler code in use failed; trying again later")
            }
        }
        tokio::time::sleep(every).await;
    }
}
