//! The server's Python environments kept within bounds: those made for commits
//! (`<data dir>/python-envs/<environment>/<name>`, with each environment's pip cache) and
//! those made for handlers (`<data dir>/code/[env-<id>/]_venv/<name>`).
//!
//! Every pass (at each retention interval, and after a compile made an environment) removes,
//! through [`crate::pyenv::reap`]: environments no stored version uses (no compile of a
//! stored version ran in it; no stored version ships handler code needing it) once unused
//! for the grace period; then, while all of them together take more than the cap, the least
//! recently used, whoever uses them (they are made again when needed). An environment in use
//! (a compile running in it, a handler process) is never touched.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::PgPool;

use crate::pyenv::reap::{self, Entry, Policy};
use crate::store;

/// What a server keeps.
#[derive(Clone, Copy, Debug)]
pub struct CachePolicy {
    /// How long an environment no stored version uses stays after its last use.
    pub grace: Duration,
    /// The most all environments may take (None: no cap).
    pub max_bytes: Option<u64>,
}

impl CachePolicy {
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);
    pub const DEFAULT_MAX_BYTES: u64 = 20 << 30;
}

/// The names (under their root) of what stored versions use: commit environments as
/// `<environment>/<name>`, handler environments as `<name>`.
struct Wanted {
    commits: HashSet<String>,
    handlers: HashSet<String>,
}

async fn wanted(pool: &PgPool) -> Result<Wanted, store::StoreError> {
    let commits = store::sources::python_envs_of_stored_versions(pool)
        .await?
        .into_iter()
        .collect();
    let python = std::env::var("STEWARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let version = tokio::task::spawn_blocking(move || crate::pyenv::python_version(&python))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let handlers = store::code::live_handler_requirements(pool)
        .await?
        .into_iter()
        .map(|r| crate::executor::inmanta::installable(&r))
        .filter(|r| !r.is_empty())
        .map(|r| crate::pyenv::key(&r.join("\n"), &version)[..24].to_string())
        .collect();
    Ok(Wanted { commits, handlers })
}

/// Every environment (and pip cache) under the data dir, each with whether a stored version
/// wants it.
fn all_entries(data_dir: &Path, wanted: &Wanted) -> Vec<(Entry, bool)> {
    let mut out = Vec::new();
    let commits = data_dir.join("python-envs");
    for env_dir in subdirs(&commits) {
        let env = env_dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        reap::remove_leftovers(&env_dir, Duration::from_secs(600));
        for e in reap::entries(&env_dir) {
            let name = e.dir.file_name().unwrap_or_default().to_string_lossy();
            let want = wanted.commits.contains(&format!("{env}/{name}"));
            out.push((e, want));
        }
        // pip's cache of the environment: never wanted for itself, held while pip runs
        let cache = env_dir.join(".pip-cache");
        if let Some(last_used) = reap::last_used(&cache) {
            out.push((
                Entry {
                    size: reap::disk_usage(&cache),
                    dir: cache,
                    last_used,
                },
                false,
            ));
        }
    }
    let code = data_dir.join("code");
    let mut venv_roots = vec![code.join("_venv")];
    venv_roots.extend(
        subdirs(&code)
            .into_iter()
            .filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("env-"))
            })
            .map(|d| d.join("_venv")),
    );
    for root in venv_roots {
        reap::remove_leftovers(&root, Duration::from_secs(600));
        for e in reap::entries(&root) {
            let name = e.dir.file_name().unwrap_or_default().to_string_lossy();
            let want = wanted.handlers.contains(name.as_ref());
            out.push((e, want));
        }
    }
    out
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|l| {
            l.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    !p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                        && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// One pass; what it removed.
pub async fn pass(
    pool: &PgPool,
    data_dir: &Path,
    policy: CachePolicy,
) -> Result<reap::Reaped, store::StoreError> {
    let wanted = wanted(pool).await?;
    let dir = data_dir.to_path_buf();
    let reaped = tokio::task::spawn_blocking(move || {
        let found = all_entries(&dir, &wanted);
        let keep: HashSet<PathBuf> = found
            .iter()
            .filter(|(_, w)| *w)
            .map(|(e, _)| e.dir.clone())
            .collect();
        let entries = found.into_iter().map(|(e, _)| e).collect();
        reap::reap(
            entries,
            &|d| keep.contains(d),
            Policy {
                grace: policy.grace,
                max_bytes: policy.max_bytes,
            },
        )
    })
    .await
    .map_err(|e| store::StoreError::Invalid(format!("the cache reaper crashed: {e}")))?;
    if !reaped.removed.is_empty() {
        tracing::info!(
            removed = reaped.removed.len(),
            freed_mib = reaped.freed / (1 << 20),
            left_mib = reaped.left / (1 << 20),
            "unused Python environments removed"
        );
    }
    if reaped.over_cap_kept > 0 {
        tracing::warn!(
            in_use = reaped.over_cap_kept,
            left_mib = reaped.left / (1 << 20),
            "Python environments take more than the cap, but those left are in use"
        );
    }
    Ok(reaped)
}

/// Pass every `every`, and whenever `wake` is notified (a compile made an environment).
pub async fn run(
    pool: PgPool,
    data_dir: PathBuf,
    policy: CachePolicy,
    every: Duration,
    wake: std::sync::Arc<tokio::sync::Notify>,
) {
    loop {
        if let Err(e) = pass(&pool, &data_dir, policy).await {
            tracing::warn!(error = %e, "removing unused Python environments failed; trying again later");
        }
        let _ = tokio::time::timeout(every, wake.notified()).await;
    }
}
