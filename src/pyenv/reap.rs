//! Removing caches nobody uses: Python environments (a commit's, a handler's) and shipped
//! handler code, on the server, on external agents' machines and on SSH targets.
//!
//! Each cache entry is a directory with two companions: a *lock file* (`<dir>.lock`, beside
//! it) that whoever uses the entry holds shared ([`hold`]) and its maker holds exclusive, and
//! a *stamp* (`<dir>/.steward-last-used`) whose time says when it was last used ([`touch`]).
//! A pass ([`reap`]) removes, never touching an entry someone holds:
//! - entries its caller does not keep that were not used for the grace period;
//! - then, while the total is over the cap, the least recently used entries, kept or not
//!   (an environment is made again when it is needed), but none used in the last seconds.
//!
//! An entry is first renamed out of the way under its exclusive lock, so nobody sees one
//! half-removed; its lock file goes too (a maker that opened the old one notices: see
//! [`lock_file`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The stamp inside an entry whose modification time is its last use.
pub const STAMP: &str = ".steward-last-used";
/// The size of a complete environment, written once when it is made (it never changes).
pub const SIZE: &str = ".steward-size";
/// An entry used this recently is never removed, even over the cap: looked at again once its
/// lock is taken, so a maker turning its exclusive lock into a user's shared one (it marks
/// the entry used first; the conversion is not atomic) never loses it in between.
const MIN_AGE: Duration = Duration::from_secs(5);

/// The lock file of the entry at `dir`.
pub fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}

/// Open and lock the lock file of `dir` (shared or exclusive), created if needed. If a
/// reaper removed the file while we waited for it, the lock we got is on a file nobody else
/// sees: it is opened again until the lock is on the one at the path.
pub fn lock_file(dir: &Path, exclusive: bool) -> io::Result<File> {
    let path = lock_path(dir);
    loop {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        if exclusive {
            f.lock()?;
        } else {
            f.lock_shared()?;
        }
        let held = f.metadata()?;
        match std::fs::metadata(&path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(f),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Held while an entry is in use (a compile in its environment, a handler process in its
/// code or environment): reapers leave it alone.
#[derive(Debug)]
pub struct InUse {
    _lock: File,
}

impl InUse {
    /// A shared lock from [`lock_file`] as the guard.
    pub fn from_lock(lock: File) -> InUse {
        InUse { _lock: lock }
    }
}

/// Mark `dir` in use (until the returned guard is dropped) and used now.
pub fn hold(dir: &Path) -> io::Result<InUse> {
    let lock = lock_file(dir, false)?;
    touch(dir);
    Ok(InUse { _lock: lock })
}

/// Turn a maker's exclusive lock on `dir` (from [`lock_file`]) into the shared lock of a
/// user: the entry is marked used first, so that the moment in between (the conversion is
/// not atomic) is no chance for a reaper, which leaves entries used in the last seconds alone.
pub fn keep_using(dir: &Path, lock: File) -> io::Result<InUse> {
    touch(dir);
    lock.lock_shared()?;
    Ok(InUse { _lock: lock })
}

/// Say that `dir` was used now. Best effort: an entry whose stamp can not be written (one
/// made read-only for the compiles that use it) is dated by its directory.
pub fn touch(dir: &Path) {
    let stamp = dir.join(STAMP);
    let now = SystemTime::now();
    let done = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&stamp)
        .and_then(|f| f.set_modified(now));
    if done.is_err() {
        let _ = File::open(dir).and_then(|f| f.set_modified(now));
    }
}

/// When `dir` was last used.
pub fn last_used(dir: &Path) -> Option<SystemTime> {
    let stamp = std::fs::metadata(dir.join(STAMP)).and_then(|m| m.modified());
    let dir_time = std::fs::metadata(dir).and_then(|m| m.modified());
    match (stamp, dir_time) {
        (Ok(a), Ok(b)) => Some(a.max(b)),
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Some(a),
        _ => None,
    }
}

/// The disk space a tree takes (blocks, not lengths), not following links.
pub fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for e in entries.flatten() {
            total += disk_usage(&e.path());
        }
    }
    total
}

/// Write the size of a complete entry into it, so passes need not walk it again.
pub fn record_size(dir: &Path) -> u64 {
    let size = disk_usage(dir);
    let _ = std::fs::write(dir.join(SIZE), size.to_string());
    size
}

/// The size of an entry: the recorded one, or measured.
fn size_of(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join(SIZE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| disk_usage(dir))
}

/// How long unused entries stay, and how much all of them may take.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub grace: Duration,
    /// None: no cap.
    pub max_bytes: Option<u64>,
}

/// One entry found by [`entries`].
#[derive(Clone, Debug)]
pub struct Entry {
    pub dir: PathBuf,
    pub last_used: SystemTime,
    pub size: u64,
}

/// The cache entries directly under `root`: its directories, except hidden ones and those
/// whose name starts with `_` (`_lib`, `_venv`, which callers list as roots of their own).
pub fn entries(root: &Path) -> Vec<Entry> {
    let Ok(list) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in list.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let dir = e.path();
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let Some(last_used) = last_used(&dir) else {
            continue;
        };
        let size = size_of(&dir);
        out.push(Entry {
            dir,
            last_used,
            size,
        });
    }
    out
}

/// What a pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Entries removed, and the bytes they took.
    pub removed: Vec<PathBuf>,
    pub freed: u64,
    /// What the entries left take.
    pub left: u64,
    /// Entries over the cap that could not go (in use, or used in the last seconds).
    pub over_cap_kept: usize,
}

/// One pass over `entries` (see the module's documentation); `keep` says which entries
/// are still wanted (a stored version uses them).
pub fn reap(mut entries: Vec<Entry>, keep: &dyn Fn(&Path) -> bool, policy: Policy) -> Reaped {
    let now = SystemTime::now();
    let age = |e: &Entry| now.duration_since(e.last_used).unwrap_or_default();
    let mut reaped = Reaped::default();
    // least recently used first
    entries.sort_by_key(|e| e.last_used);
    let mut left: Vec<Entry> = Vec::new();
    for e in entries {
        if !keep(&e.dir) && age(&e) >= policy.grace && remove(&e.dir) {
            reaped.freed += e.size;
            reaped.removed.push(e.dir);
        } else {
            left.push(e);
        }
    }
    let mut total: u64 = left.iter().map(|e| e.size).sum();
    if let Some(max) = policy.max_bytes {
        for e in &left {
            if total <= max {
                break;
            }
            if remove(&e.dir) {
                total -= e.size;
                reaped.freed += e.size;
                reaped.removed.push(e.dir.clone());
            } else {
                reaped.over_cap_kept += 1;
            }
        }
    }
    reaped.left = total;
    reaped
}

/// Remove the entry at `dir` unless someone holds it or used it in the last seconds;
/// whether it was removed.
pub fn remove(dir: &Path) -> bool {
    remove_if_idle(dir, MIN_AGE)
}

/// Remove the entry at `dir` unless someone holds it (its caller decided it is unused by
/// its own rule); whether it was removed.
pub fn remove_unless_held(dir: &Path) -> bool {
    remove_if_idle(dir, Duration::ZERO)
}

fn remove_if_idle(dir: &Path, min_age: Duration) -> bool {
    let path = lock_path(dir);
    let Ok(lock) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    else {
        return false;
    };
    if lock.try_lock().is_err() {
        return false;
    }
    let fresh = last_used(dir)
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_none_or(|a| a < min_age);
    if fresh {
        return false;
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let doomed = parent.join(format!(".reap-{name}-{}", uuid::Uuid::new_v4().simple()));
    if std::fs::rename(dir, &doomed).is_err() {
        return false;
    }
    // the lock file goes while we hold it: a maker waiting on it opens the new one
    let _ = std::fs::remove_file(&path);
    drop(lock);
    // a read-only tree (what a compile's environment is made) is made writable to go
    make_writable(&doomed);
    let _ = std::fs::remove_dir_all(&doomed);
    true
}

fn make_writable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let mode = meta.permissions().mode();
        if mode & 0o700 != 0o700 {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o700));
        }
        if let Ok(list) = std::fs::read_dir(path) {
            for e in list.flatten() {
                make_writable(&e.path());
            }
        }
    }
}

/// Leftovers of passes or makers that crashed (`.reap-*`, `.tmp-*`) under `root`, older than
/// `age`: removed.
pub fn remove_leftovers(root: &Path, age: Duration) -> usize {
    let Ok(list) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut n = 0;
    for e in list.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !(name.starts_with(".reap-") || name.starts_with(".tmp-")) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|a| a >= age);
        if old {
            make_writable(&e.path());
            if std::fs::remove_dir_all(e.path()).is_ok() {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(root: &Path, name: &str, bytes: usize, used_ago: Duration) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data"), vec![1u8; bytes]).unwrap();
        record_size(&dir);
        touch(&dir);
        let t = SystemTime::now() - used_ago;
        File::options()
            .write(true)
            .open(dir.join(STAMP))
            .unwrap()
            .set_modified(t)
            .unwrap();
        File::open(&dir).unwrap().set_modified(t).unwrap();
        dir
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn unused_entries_go_after_the_grace_and_kept_ones_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let old = entry(tmp.path(), "old", 10_000, 2 * HOUR);
        let fresh = entry(tmp.path(), "fresh", 10_000, Duration::from_secs(10));
        let kept = entry(tmp.path(), "kept", 10_000, 5 * HOUR);
        let r = reap(
            entries(tmp.path()),
            &|d| d == kept,
            Policy {
                grace: HOUR,
                max_bytes: None,
            },
        );
        assert_eq!(r.removed, vec![old.clone()]);
        assert!(!old.exists() && fresh.exists() && kept.exists());
        assert!(!lock_path(&old).exists());
    }

    #[test]
    fn over_the_cap_the_least_recently_used_go_but_none_in_use() {
        let tmp = tempfile::tempdir().unwrap();
        let a = entry(tmp.path(), "a", 100_000, 4 * HOUR);
        let b = entry(tmp.path(), "b", 100_000, 3 * HOUR);
        let c = entry(tmp.path(), "c", 100_000, 2 * HOUR);
        let d = entry(tmp.path(), "d", 100_000, Duration::from_secs(1));
        // a is in use: it stays, and the next ones go instead
        let using = lock_file(&a, false).unwrap();
        let r = reap(
            entries(tmp.path()),
            &|_| true,
            Policy {
                grace: HOUR,
                max_bytes: Some(220_000),
            },
        );
        assert!(a.exists() && d.exists(), "{r:?}");
        assert!(!b.exists() && !c.exists(), "{r:?}");
        assert!(r.left <= 240_000, "{r:?}");
        drop(using);
        // and a maker waiting for a lock the reaper removed gets the new file's
        let again = lock_file(&b, true).unwrap();
        assert!(lock_path(&b).exists());
        drop(again);
    }
}
