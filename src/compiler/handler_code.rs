//! Handler code of a module: the directory holding a resource type's handler entry point,
//! every file in it (recursively), hashed. It is exported with the version, so executors run
//! the code of the version they deploy.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

use sha2::{Digest, Sha256};

use super::project::{ModuleInfo, ModuleRoot};
use crate::model::{CodeFile, HandlerCode};

/// Largest handler package exported (all files of the handler's directory).
const MAX_CODE: u64 = 16 << 20;

/// Collect the handler of `module` whose entry point is `entry` (a path inside the module):
/// its description and the file contents by hash (hex).
pub fn collect(
    module: &ModuleInfo,
    entry: &str,
) -> Result<(HandlerCode, BTreeMap<String, String>), String> {
    let ModuleRoot::Dir(root) = &module.root else {
        return Err("built-in modules can not ship handler code".into());
    };
    let rel = Path::new(entry);
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err("the handler must be a relative path inside the module".into());
    }
    let entry_path = root.join(rel);
    if !entry_path.is_file() {
        return Err(format!("{} does not exist", entry_path.display()));
    }
    // the entry's directory is the handler package (the module root itself is too much)
    let package = rel.parent().filter(|p| !p.as_os_str().is_empty());
    let mut files = BTreeMap::new();
    let mut code = BTreeMap::new();
    let mut total = 0u64;
    let real_root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    let mut add = |path: &Path| -> Result<(), String> {
        // nothing outside the module, even through a symlink
        super::project::confined(&real_root, path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        total += meta.len();
        if total > MAX_CODE {
            return Err(format!("the handler's files exceed {} MB", MAX_CODE >> 20));
        }
        let content = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let hash = hex::encode(Sha256::digest(&content));
        let inside = path
            .strip_prefix(root)
            .map_err(|_| "a handler file outside the module".to_string())?;
        files.insert(
            inside.to_string_lossy().into_owned(),
            CodeFile {
                hash: hash.clone(),
                executable: meta.permissions().mode() & 0o111 != 0,
            },
        );
        code.insert(hash, hex::encode(&content));
        Ok(())
    };
    match package {
        None => add(&entry_path)?,
        Some(dir) => walk(&root.join(dir), &mut add)?,
    }
    let digest = HandlerCode::compute_digest(entry, &files);
    Ok((
        HandlerCode {
            module: module.name.clone(),
            entry: entry.to_string(),
            files,
            digest,
            inmanta: None,
        },
        code,
    ))
}

/// Every regular file under `dir`, in name order, skipping caches and hidden files.
fn walk(dir: &Path, add: &mut impl FnMut(&Path) -> Result<(), String>) -> Result<(), String> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "__pycache__" || name.ends_with(".pyc") {
            continue;
        }
        let ft = e
            .file_type()
            .map_err(|err| format!("{}: {err}", e.path().display()))?;
        if ft.is_dir() {
            walk(&e.path(), add)?;
        } else if ft.is_file() || (ft.is_symlink() && e.path().is_file()) {
            // a symlink to a file counts as that file: `add` refuses it unless it stays
            // inside the module
            add(&e.path())?;
        }
    }
    Ok(())
}
