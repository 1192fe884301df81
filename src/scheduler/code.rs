//! Handler code on disk for the executors: each code digest of a module's handler is written
//! once, from the database, into `<code dir>/<digest>/` (atomically: a temp dir renamed into
//! place, marked complete), next to `_lib/` holding steward's Python helper. Directories are
//! named by content, so a version deploys with exactly its own code, and versions that share
//! code share the directory.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use sqlx::PgPool;

use crate::executor::external::PYTHON_HELPER;
use crate::model::HandlerCode;
use crate::store;

const COMPLETE: &str = ".complete";

pub struct CodeCache {
    dir: PathBuf,
    ready: HashSet<String>,
    helper_written: bool,
}

impl CodeCache {
    pub fn new(dir: PathBuf) -> CodeCache {
        CodeCache {
            dir,
            ready: HashSet::new(),
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
            self.helper_written = true;
        }
        if self.ready.contains(&code.digest) || target.join(COMPLETE).is_file() {
            self.ready.insert(code.digest.clone());
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
        self.ready.insert(code.digest.clone());
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
