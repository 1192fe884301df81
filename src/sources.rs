//! Git sources: environments that follow a branch (GITOPS.md §5, §6).
//!
//! Per environment with a source, a *fetcher* task turns triggers (webhooks, polls with
//! jitter, the API, hooks/post-receive, a filesystem watch of file:// repositories) into
//! queued compiles: it fetches the repository into its bare mirror, resolves the branch
//! itself (a trigger is only a hint), and queues the tip — or the commit the API named, once
//! it is known to be on the branch. A newer commit supersedes queued older ones (recorded);
//! a commit compiled before is not compiled again. A *compiler* task runs the queue one at a
//! time, never while the environment is halted. Versions from commits are released by the
//! environment's policy; a deploy watcher reports the deploy of each released commit.
//! Everything is in PostgreSQL: a restart re-queues interrupted compiles.

pub mod compile;
mod compiler;
mod facts;
pub mod feedback;
mod fetcher;
pub mod git;
mod pipeline;
pub mod previews;
pub mod webhook;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::{Notify, broadcast, mpsc, oneshot};
use uuid::Uuid;

use crate::events::{Event, Notifier};
use crate::replicas::{Tenure, Worker};
use crate::store::leases::Fence;
use crate::store::sources::SourceRow;
use crate::store::{self, StoreError};
use feedback::{Feedback, Outgoing, State};

#[derive(Clone, Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Git(#[from] git::GitError),
    #[error("this environment follows no git repository")]
    NoSource,
    #[error("branch '{0}' does not exist in the repository")]
    NoBranch(String),
    #[error("commit {commit} is not on branch '{branch}'")]
    NotOnBranch { commit: String, branch: String },
    #[error("the git worker of this environment is not answering; try again")]
    Unavailable,
}

/// What a trigger led to.
#[derive(Clone, Debug, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Triggered {
    pub commit: String,
    /// queued | already_compiled
    pub status: String,
    pub compile: Uuid,
    pub superseded: Vec<Uuid>,
}

enum Msg {
    Trigger {
        kind: String,
        commit: Option<String>,
        reply: Option<oneshot::Sender<Result<Triggered, SourceError>>>,
    },
    /// Facts arrived (after their backoff): compile the commit that needs them again.
    Recompile(facts::PendingFacts),
}

struct EnvWorker {
    tx: mpsc::UnboundedSender<Msg>,
    /// wakes the previewer (a preview was queued)
    previews: Arc<Notify>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for EnvWorker {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

struct Inner {
    pool: PgPool,
    data_dir: PathBuf,
    steward_bin: PathBuf,
    notifier: Notifier,
    feedback: Feedback,
    /// wakes the deploy reporter (a version was released)
    released: Arc<Notify>,
    workers: Mutex<HashMap<Uuid, EnvWorker>>,
    mirror_locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
    /// With replicas: the environments this replica owns (only their sources are followed
    /// here). None: this process follows every source.
    tenures: Option<Mutex<HashMap<Uuid, Tenure>>>,
    /// Fetch from repositories on this machine's disk (`file://`, absolute paths): off
    /// unless the operator allows it (`steward server --allow-local-git-sources`); the API
    /// refuses such sources too, this also stops ones stored before that rule.
    allow_local: std::sync::atomic::AtomicBool,
    /// Where pip finds the packages commits' requirements name (the operator's choice).
    pip_sources: Mutex<compile::PipSources>,
    /// Told when a compile made a new Python environment (the reaper looks at the disk).
    envs_made: Arc<Notify>,
    /// Facts that arrived, by environment, waiting out the recompile backoff.
    fact_waits: Mutex<HashMap<Uuid, facts::PendingFacts>>,
    /// Where the deploy reporter gets a version's counts per status without the database's
    /// count (the server's schedulers), if anywhere.
    known_counts: std::sync::OnceLock<KnownCounts>,
}

/// A version's counts per status (environment, version) from somewhere quicker than a count
/// in the database; None: count there.
pub type KnownCounts = Arc<
    dyn Fn(Uuid, i32) -> futures_util::future::BoxFuture<'static, Option<Vec<(String, i64)>>>
        + Send
        + Sync,
>;

/// Handle on the git side of a server (cheap to clone).
#[derive(Clone)]
pub struct GitSources(Arc<Inner>);

impl GitSources {
    /// Start workers for every environment with a source and follow `notifier`.
    pub async fn start(
        pool: PgPool,
        data_dir: PathBuf,
        steward_bin: PathBuf,
        notifier: &Notifier,
    ) -> GitSources {
        Self::start_with(pool, data_dir, steward_bin, notifier, false).await
    }

    /// For a replica: follow only the sources of the environments it adopts ([`Worker`]).
    pub async fn start_replica(
        pool: PgPool,
        data_dir: PathBuf,
        steward_bin: PathBuf,
        notifier: &Notifier,
    ) -> GitSources {
        Self::start_with(pool, data_dir, steward_bin, notifier, true).await
    }

    async fn start_with(
        pool: PgPool,
        data_dir: PathBuf,
        steward_bin: PathBuf,
        notifier: &Notifier,
        replica: bool,
    ) -> GitSources {
        let s = GitSources(Arc::new(Inner {
            pool,
            data_dir,
            steward_bin,
            notifier: notifier.clone(),
            feedback: Feedback::default(),
            released: Arc::new(Notify::new()),
            workers: Mutex::new(HashMap::new()),
            mirror_locks: Mutex::new(HashMap::new()),
            tenures: replica.then(|| Mutex::new(HashMap::new())),
            allow_local: std::sync::atomic::AtomicBool::new(false),
            pip_sources: Mutex::new(compile::PipSources::default()),
            envs_made: Arc::new(Notify::new()),
            fact_waits: Mutex::new(HashMap::new()),
            known_counts: std::sync::OnceLock::new(),
        }));
        let events = notifier.subscribe();
        if replica {
            // an environment's interrupted compiles are queued again by the replica that
            // adopts it; outbox deliveries are claimed row by row, so every replica helps
            tokio::spawn(s.clone().follow(events));
            tokio::spawn(s.0.feedback.clone().deliver(s.0.pool.clone()));
            tokio::spawn(s.clone().report_deploys(s.0.released.clone()));
            return s;
        }
        let requeued = async {
            let mut tx = s.0.pool.begin().await?;
            let settled = s.settle_stored(&mut tx, None).await?;
            let n = store::sources::requeue_interrupted(&mut *tx).await?;
            tx.commit().await?;
            Ok::<_, StoreError>((settled, n))
        }
        .await;
        if let Ok((true, _)) = &requeued {
            s.0.feedback.wake();
        }
        match requeued.map(|(_, n)| n) {
            Ok(n) if n > 0 => tracing::info!(
                compiles = n,
                "compiles interrupted by a stop are queued again"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "re-queueing interrupted compiles failed"),
        }
        match store::sources::list_sources(&s.0.pool).await {
            Ok(list) => {
                for src in list {
                    // a source stored before credentials were kept out of URLs
                    let (url, secret) = crate::model::urls::split_credentials(&src.url);
                    if url != src.url && !url.starts_with("ssh://") {
                        let token = src.token.clone().or(secret);
                        match store::sources::move_url_credentials(
                            &s.0.pool,
                            src.environment_id,
                            &url,
                            token.as_deref(),
                        )
                        .await
                        {
                            Ok(()) => {
                                tracing::info!(environment = %src.environment_id, "credentials moved out of the source URL")
                            }
                            Err(e) => {
                                tracing::warn!(environment = %src.environment_id, error = %e, "moving credentials out of the source URL failed")
                            }
                        }
                    }
                    s.restart(src.environment_id);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "listing git sources failed; they start when next changed")
            }
        }
        tokio::spawn(s.clone().follow(events));
        tokio::spawn(s.0.feedback.clone().deliver(s.0.pool.clone()));
        tokio::spawn(s.clone().report_deploys(s.0.released.clone()));
        s
    }

    /// The bare mirror of environment `env`'s repository. One per environment, never shared
    /// by URL: two environments following the same URL each fetch into their own, so one
    /// environment's credentials, refs or a poisoned object never serve another.
    pub fn mirror_of(&self, env: Uuid, url: &str) -> PathBuf {
        use sha2::Digest;
        let digest = hex::encode(
            sha2::Sha256::new()
                .chain_update(env.as_bytes())
                .chain_update(url.as_bytes())
                .finalize(),
        );
        self.0
            .data_dir
            .join("git")
            .join(format!("{}.git", &digest[..16]))
    }

    /// Take a version's counts per status from `counts` when it has them (the server's
    /// schedulers: a count of their model, not of every stored state) when reporting deploys.
    pub fn count_with(&self, counts: KnownCounts) {
        let _ = self.0.known_counts.set(counts);
    }

    /// Allow (or not) sources on this machine's disk.
    pub fn set_allow_local(&self, allow: bool) {
        self.0
            .allow_local
            .store(allow, std::sync::atomic::Ordering::Relaxed);
    }

    /// Where pip finds packages for commits' requirements (`--pip-index-url`,
    /// `--pip-find-links`); without them, pip's own configuration of the server's user.
    pub fn set_pip_sources(&self, pip: compile::PipSources) {
        *self.0.pip_sources.lock().unwrap() = pip;
    }

    /// Notified each time a compile made a new Python environment.
    pub fn envs_made(&self) -> Arc<Notify> {
        self.0.envs_made.clone()
    }

    /// Why `url` is not fetched here, if it is not.
    fn refused(&self, url: &str) -> Option<git::GitError> {
        let local = url.starts_with("file://") || url.starts_with('/');
        (local && !self.0.allow_local.load(std::sync::atomic::Ordering::Relaxed)).then(|| {
            git::GitError::Other(format!(
                "'{url}' is a repository on the server's own disk: this server does not follow local repositories (its operator can allow them with --allow-local-git-sources)"
            ))
        })
    }

    fn mirror_lock(&self, mirror: &Path) -> Arc<tokio::sync::Mutex<()>> {
        self.0
            .mirror_locks
            .lock()
            .expect("locks")
            .entry(mirror.to_path_buf())
            .or_default()
            .clone()
    }

    /// With replicas: this replica's lease fence on `env` (what its writes carry).
    fn fence(&self, env: Uuid) -> Option<Fence> {
        self.0.tenures.as_ref().and_then(|t| {
            t.lock()
                .expect("tenures")
                .get(&env)
                .map(|t| t.fence().clone())
        })
    }

    /// Does this process follow `env`'s source? (Always, without replicas.)
    pub fn follows(&self, env: Uuid) -> bool {
        match &self.0.tenures {
            Some(t) => t.lock().expect("tenures").contains_key(&env),
            None => true,
        }
    }

    /// Check the fence of `env` in a transaction (nothing to check without replicas).
    pub(super) async fn check_fence(
        &self,
        env: Uuid,
        c: &mut sqlx::PgConnection,
    ) -> Result<(), StoreError> {
        match self.fence(env) {
            Some(f) => f.check(c).await,
            None if self.0.tenures.is_some() => Err(StoreError::Fenced(format!(
                "environment {env} is not owned by this replica"
            ))),
            None => Ok(()),
        }
    }

    /// (Re)start the workers of an environment from its stored source (none: stop them), and
    /// look at the branch now. With replicas, only on the replica that owns it.
    pub fn restart(&self, env: Uuid) {
        if !self.follows(env) {
            return;
        }
        // the old workers stop first (a compile they were running is killed with its task;
        // the new compiler queues it again)
        self.stop(env);
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(Notify::new());
        let previews = Arc::new(Notify::new());
        let tasks = vec![
            tokio::spawn(self.clone().fetcher(env, rx, queued.clone())),
            tokio::spawn(self.clone().compiler(env, queued)),
            tokio::spawn(self.clone().previewer(env, previews.clone())),
        ];
        let _ = tx.send(Msg::Trigger {
            kind: "startup".into(),
            commit: None,
            reply: None,
        });
        self.0.workers.lock().expect("workers").insert(
            env,
            EnvWorker {
                tx,
                previews,
                tasks,
            },
        );
    }

    pub fn stop(&self, env: Uuid) {
        self.0.workers.lock().expect("workers").remove(&env);
    }

    /// A trigger without an answer (webhooks, hooks): queued for the fetcher.
    pub fn hint(&self, env: Uuid, kind: &str) {
        let tx = self
            .0
            .workers
            .lock()
            .expect("workers")
            .get(&env)
            .map(|w| w.tx.clone());
        if let Some(tx) = tx {
            let _ = tx.send(Msg::Trigger {
                kind: kind.into(),
                commit: None,
                reply: None,
            });
        }
    }

    /// A trigger that waits for the fetch: which commit was queued (or was compiled before).
    pub async fn trigger(
        &self,
        env: Uuid,
        kind: &str,
        commit: Option<String>,
    ) -> Result<Triggered, SourceError> {
        let tx = self
            .0
            .workers
            .lock()
            .expect("workers")
            .get(&env)
            .map(|w| w.tx.clone())
            .ok_or(SourceError::NoSource)?;
        let (reply, rx) = oneshot::channel();
        tx.send(Msg::Trigger {
            kind: kind.into(),
            commit,
            reply: Some(reply),
        })
        .map_err(|_| SourceError::Unavailable)?;
        tokio::time::timeout(Duration::from_secs(300), rx)
            .await
            .map_err(|_| SourceError::Unavailable)?
            .map_err(|_| SourceError::Unavailable)?
    }

    async fn follow(self, mut events: broadcast::Receiver<Event>) {
        loop {
            match events.recv().await {
                Ok(Event::Released { .. }) | Ok(Event::Resync) => self.0.released.notify_one(),
                Ok(Event::Deleted { environment }) => self.stop(environment),
                Ok(Event::Facts {
                    environment,
                    resolved_versions,
                    changed,
                    recompile,
                }) if self.follows(environment) => {
                    self.facts_arrived(environment, resolved_versions, changed, recompile)
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "git sources fell behind on server events")
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    }
}

/// Least time between two fetches caused by hints (webhooks, hooks, watches) of one source.
const MIN_HINT_INTERVAL: Duration = Duration::from_secs(1);

/// The next poll: the interval ± 10 % (so many sources do not poll in step); none at 0.
fn next_poll_at(interval: i32) -> Option<Instant> {
    if interval <= 0 {
        return None;
    }
    let base = interval as f64;
    // jitter from the clock's nanoseconds: cheap, and different per source and per poll
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = (nanos as f64 / 1e9 - 0.5) * 0.2 * base;
    Some(Instant::now() + Duration::from_secs_f64((base + jitter).max(1.0)))
}

/// For a repository on this machine (file:// or a path), watch its refs: a push shows up as a
/// ref update. Returns the watcher, which must be kept alive.
fn watch_local_repository(
    url: &str,
    tx: mpsc::UnboundedSender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let path = match url.strip_prefix("file://") {
        Some(p) => PathBuf::from(p),
        None if url.starts_with('/') => PathBuf::from(url),
        None => return None,
    };
    let git_dir = if path.join(".git").is_dir() {
        path.join(".git")
    } else {
        path
    };
    if !git_dir.join("refs").is_dir() {
        return None;
    }
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res
            && (ev.kind.is_create() || ev.kind.is_modify() || ev.kind.is_remove())
        {
            let _ = tx.send(());
        }
    })
    .ok()?;
    watcher
        .watch(&git_dir.join("refs"), RecursiveMode::Recursive)
        .ok()?;
    // packed refs are rewritten in place of loose ones (git gc, some pushes)
    let _ = watcher.watch(&git_dir, RecursiveMode::NonRecursive);
    Some(watcher)
}

impl Worker for GitSources {
    fn adopt(&self, env: Uuid, tenure: Tenure) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(tenures) = &self.0.tenures else {
                return;
            };
            tenures.lock().expect("tenures").insert(env, tenure);
            let pool = &self.0.pool;
            // the compiler it starts queues again what the previous owner was compiling
            let found = store::sources::get_source(pool, env).await;
            // workers running now were started under this tenure (losing it stops them): a
            // source set while it was looked up started them. Started again, they would kill
            // the compile they run, and the memory its task holds for the next commit.
            if self.0.workers.lock().expect("workers").contains_key(&env) {
                self.0.released.notify_one();
                return;
            }
            match found {
                Ok(Some(_)) => self.restart(env),
                Ok(None) => {}
                // the fetcher loads the source itself and says why it can not
                Err(_) => self.restart(env),
            }
            self.0.released.notify_one();
        })
    }

    fn release(&self, env: Uuid) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(t) = &self.0.tenures {
                t.lock().expect("tenures").remove(&env);
            }
            // aborting the tasks drops a running compile's process (killed on drop)
            self.stop(env);
        })
    }
}
