//! The Python Steward ships, embedded in the binary: the `inmanta` compatibility package that
//! real Inmanta modules import (plugins, resources, handlers), Steward's Python hosts (the
//! compiler's plugin host, the executor's handler host) and `steward_handler.py`. All of it
//! lives under `python/` in the repository; `build.rs` lists the files.
//!
//! [`materialize`] writes the tree once per content digest into a directory that is put first
//! on `sys.path`, so a compile or an executor imports exactly the package of its own binary.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// (path under `python/`, content).
pub static FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/python_files.rs"));

const COMPLETE: &str = ".complete";

/// SHA-256 over every embedded path and content, hex: names the tree on disk.
pub fn digest() -> &'static str {
    static DIGEST: OnceLock<String> = OnceLock::new();
    DIGEST.get_or_init(|| {
        let mut h = Sha256::new();
        for (path, content) in FILES {
            h.update(path.as_bytes());
            h.update([0]);
            h.update(content.as_bytes());
            h.update([0]);
        }
        hex::encode(h.finalize())
    })
}

/// The name of this binary's tree in a base directory: `steward-python-<digest prefix>`.
pub fn dir_name() -> String {
    format!("steward-python-{}", &digest()[..16])
}

/// The embedded tree under `base/steward-python-<digest>/` (written atomically if absent):
/// the directory to put first on `sys.path`.
pub fn materialize(base: &Path) -> std::io::Result<PathBuf> {
    let target = base.join(dir_name());
    if target.join(COMPLETE).is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(base)?;
    let tmp = base.join(format!(".steward-python-{}", uuid::Uuid::new_v4()));
    let written = (|| {
        for (rel, content) in FILES {
            let path = tmp.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, content)?;
        }
        std::fs::write(tmp.join(COMPLETE), digest())?;
        if target.exists() && !target.join(COMPLETE).is_file() {
            // left half-written by a crash
            let _ = std::fs::remove_dir_all(&target);
        }
        match std::fs::rename(&tmp, &target) {
            Ok(()) => Ok(()),
            // written meanwhile by another process: same content, keep theirs
            Err(_) if target.join(COMPLETE).is_file() => Ok(()),
            Err(e) => Err(e),
        }
    })();
    if tmp.exists() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written.map(|()| target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn materializes_every_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = materialize(dir.path()).unwrap();
        assert!(first.join("steward_handler.py").is_file());
        assert_eq!(
            std::fs::read_to_string(first.join("steward_handler.py")).unwrap(),
            FILES
                .iter()
                .find(|(p, _)| *p == "steward_handler.py")
                .unwrap()
                .1
        );
        let again = materialize(dir.path()).unwrap();
        assert_eq!(first, again);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
