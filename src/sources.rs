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
mod facts;
pub mod feedback;
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
}

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
        if let Ok((settled, _)) = &requeued {
            if *settled {
                s.0.feedback.wake();
            }
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

    // ------------------------------------------------------------------ fetcher

    async fn fetcher(self, env: Uuid, mut rx: mpsc::UnboundedReceiver<Msg>, queued: Arc<Notify>) {
        // the database may be busy or away: keep trying (triggers wait in the channel)
        let mut delay = Duration::from_millis(100);
        let source = loop {
            match store::sources::get_source(&self.0.pool, env).await {
                Ok(Some(s)) => break s,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "loading the git source failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        let (watch_tx, mut watch_rx) = mpsc::unbounded_channel();
        let _watcher = if source.watch {
            watch_local_repository(&source.url, watch_tx)
        } else {
            None
        };
        let mut next_poll = next_poll_at(source.poll_interval);
        let mut pending: std::collections::VecDeque<Msg> = std::collections::VecDeque::new();
        let mut last_hint_fetch: Option<Instant> = None;
        let mut retry_delay: Option<Duration> = None;
        loop {
            let sleep = next_poll
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_secs(3600));
            let msg = match pending.pop_front() {
                Some(m) => m,
                None => tokio::select! {
                    m = rx.recv() => match m {
                        Some(m) => m,
                        None => return,
                    },
                    Some(()) = watch_rx.recv() => {
                        // a burst of ref updates is one push
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        while watch_rx.try_recv().is_ok() {}
                        Msg::Trigger { kind: "watch".into(), commit: None, reply: None }
                    }
                    _ = tokio::time::sleep(sleep) => {
                        next_poll = next_poll_at(source.poll_interval);
                        Msg::Trigger { kind: "poll".into(), commit: None, reply: None }
                    }
                },
            };
            let (kind, commit, reply) = match msg {
                Msg::Trigger {
                    kind,
                    commit,
                    reply,
                } => (kind, commit, reply),
                Msg::Recompile(facts) => {
                    match self.queue_recompile(env, &source, &facts).await {
                        Ok(true) => queued.notify_one(),
                        Ok(false) => {}
                        // the database is away: the facts stay pending and are tried again
                        Err(SourceError::Store(e @ StoreError::Unavailable(_))) => {
                            tracing::warn!(environment = %env, error = %e, "queueing the recompile for facts failed; trying again");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            pending.push_back(Msg::Recompile(facts));
                        }
                        Err(e) => {
                            tracing::warn!(environment = %env, error = %e, "queueing the recompile for facts failed")
                        }
                    }
                    continue;
                }
            };
            // triggers for the tip that arrived meanwhile are answered by this one fetch;
            // one naming a commit waits its turn
            let mut replies: Vec<oneshot::Sender<Result<Triggered, SourceError>>> =
                reply.into_iter().collect();
            let mut kind = kind;
            if commit.is_none() {
                while let Ok(m) = rx.try_recv() {
                    match m {
                        Msg::Trigger {
                            kind: k,
                            commit: None,
                            reply,
                        } => {
                            if kind == "poll" || kind == "startup" {
                                kind = k;
                            }
                            replies.extend(reply);
                        }
                        named => pending.push_back(named),
                    }
                }
            }
            // hints (webhooks, hooks, watches) are rate-limited per source: a flood of them,
            // replayed or not, costs one fetch a second at most
            if matches!(kind.as_str(), "webhook" | "hook" | "watch")
                && let Some(last) = last_hint_fetch
            {
                let wait = MIN_HINT_INTERVAL.saturating_sub(Instant::now().duration_since(last));
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            Msg::Trigger {
                                commit: None,
                                reply,
                                ..
                            } => replies.extend(reply),
                            named => pending.push_back(named),
                        }
                    }
                }
            }
            if matches!(kind.as_str(), "webhook" | "hook" | "watch") {
                last_hint_fetch = Some(Instant::now());
            }
            let r = self.fetch_and_queue(&source, &kind, commit).await;
            if let Ok(t) = &r
                && t.status == "queued"
            {
                queued.notify_one();
            }
            if let Err(e) = &r
                && (!matches!(kind.as_str(), "poll" | "startup")
                    || !matches!(e, SourceError::Git(_)))
            {
                tracing::warn!(environment = %env, trigger = %kind, error = %e, "git trigger failed");
            }
            // a failed look at the branch on its own (at start, or a poll) is tried again
            // with backoff, also when polling is off: nothing else may come to look
            match (&r, kind.as_str()) {
                (Err(e), "poll" | "startup") => {
                    let d = retry_delay
                        .map(|d: Duration| (d * 2).min(Duration::from_secs(30)))
                        .unwrap_or(Duration::from_secs(1));
                    retry_delay = Some(d);
                    let retry = Instant::now() + d;
                    next_poll = Some(next_poll.map_or(retry, |p| p.min(retry)));
                    tracing::info!(environment = %env, trigger = %kind, error = %e, retry_in_s = d.as_secs(), "looking at the branch failed; trying again");
                }
                (Ok(_), _) => retry_delay = None,
                _ => {}
            }
            for reply in replies {
                let _ = reply.send(match &r {
                    Ok(t) => Ok(t.clone()),
                    Err(e) => Err(e.clone()),
                });
            }
        }
    }

    /// Make sure the mirror holds `commit`, fetching when it does not.
    async fn fetch_commit(
        &self,
        src: &SourceRow,
        mirror: &Path,
        commit: &str,
    ) -> Result<(), git::GitError> {
        if let Some(e) = self.refused(&src.url) {
            return Err(e);
        }
        let guard = self.mirror_lock(mirror).lock_owned().await;
        let (mirror, url, auth, commit) = (
            mirror.to_path_buf(),
            src.url.clone(),
            git::Auth::of(src),
            commit.to_string(),
        );
        tokio::task::spawn_blocking(move || {
            let _guard = guard;
            if git::has_commit(&mirror, &commit) {
                return Ok(());
            }
            git::ensure_mirror(&mirror, &url, &auth)
        })
        .await
        .map_err(|e| git::GitError::Other(format!("fetch crashed: {e}")))?
    }

    /// Fetch, resolve, and queue the commit to compile.
    async fn fetch_and_queue(
        &self,
        src: &SourceRow,
        kind: &str,
        commit: Option<String>,
    ) -> Result<Triggered, SourceError> {
        let env = src.environment_id;
        let mirror = self.mirror_of(src.environment_id, &src.url);
        let started = Utc::now();
        let t = Instant::now();
        let fetched = {
            // the guard goes into the blocking fetch: if this task is aborted (the workers
            // restart), the fetch still runs to its end before another may start
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let (mirror, url, auth, branch) = (
                mirror.clone(),
                src.url.clone(),
                git::Auth::of(src),
                src.branch.clone(),
            );
            let refused = self.refused(&url);
            tokio::task::spawn_blocking(move || -> Result<Option<String>, git::GitError> {
                let _guard = guard;
                if let Some(e) = refused {
                    return Err(e);
                }
                git::ensure_mirror(&mirror, &url, &auth)?;
                git::resolve_branch(&mirror, &branch)
            })
            .await
            .map_err(|e| git::GitError::Other(format!("fetch crashed: {e}")))?
        };
        let tip = match fetched {
            Ok(Some(tip)) => tip,
            Ok(None) => {
                let e = SourceError::NoBranch(src.branch.clone());
                let _ = store::sources::record_fetch(&self.0.pool, env, None, Some(&e.to_string()))
                    .await;
                return Err(e);
            }
            Err(e) => {
                let _ = store::sources::record_fetch(&self.0.pool, env, None, Some(&e.to_string()))
                    .await;
                return Err(e.into());
            }
        };
        store::sources::record_fetch(&self.0.pool, env, Some(&tip), None).await?;
        let fetch_ms = t.elapsed();
        let commit_named = commit.is_some();
        let target = match commit {
            None => tip.clone(),
            Some(c) => {
                let (mirror, branch, c2) = (mirror.clone(), src.branch.clone(), c.clone());
                let resolved = tokio::task::spawn_blocking(move || {
                    git::commit_on_branch(&mirror, &c2, &branch)
                })
                .await
                .map_err(|e| git::GitError::Other(format!("lookup crashed: {e}")))??;
                match resolved {
                    Some(full) => full,
                    None => {
                        return Err(SourceError::NotOnBranch {
                            commit: c,
                            branch: src.branch.clone(),
                        });
                    }
                }
            }
        };
        // only someone naming a commit may compile a failed one again
        if let Some(done) =
            store::sources::existing_compile(&self.0.pool, env, &target, commit_named).await?
        {
            return Ok(Triggered {
                commit: target,
                status: "already_compiled".into(),
                compile: done.id,
                superseded: vec![],
            });
        }
        let fetch_stage = compile::stage(
            "fetch",
            started,
            fetch_ms,
            true,
            &format!("{} at {}", src.branch, &tip[..tip.len().min(12)]),
        );
        // commits that reached the branch with this one (two quick pushes, a push of
        // several commits) are not compiled, but each leaves a trace
        let skipped = if commit_named {
            Vec::new()
        } else {
            match store::sources::last_compiled_commit(&self.0.pool, env).await? {
                Some(last) if last != target => {
                    let (mirror, tip, last) = (mirror.clone(), target.clone(), last.clone());
                    tokio::task::spawn_blocking(move || {
                        git::commits_between(&mirror, &tip, &last, 100)
                    })
                    .await
                    .map_err(|e| git::GitError::Other(format!("history walk crashed: {e}")))?
                    .unwrap_or_default()
                }
                _ => Vec::new(),
            }
        };
        let mut out = Outgoing::default();
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        self.check_fence(env, &mut tx).await?;
        let (id, mut superseded) =
            store::sources::enqueue(&mut tx, env, &target, &src.branch, kind, fetch_stage).await?;
        let skipped_ids =
            store::sources::record_skipped(&mut tx, env, &skipped, &src.branch, kind, id).await?;
        superseded.extend(skipped_ids.into_iter().zip(skipped));
        store::sources::add_event(
            &mut *tx,
            env,
            &target,
            "received",
            json!({"trigger": kind, "compile": id}),
        )
        .await?;
        out.status(
            src,
            &target,
            "steward/compile",
            State::Pending,
            "queued for compile",
        );
        out.notify(
            src,
            "received",
            json!({"commit": target, "compile": id, "trigger": kind}),
        );
        for (old, old_commit) in &superseded {
            store::sources::add_event(
                &mut *tx,
                env,
                old_commit,
                "superseded",
                json!({"compile": old, "by": id, "by_commit": target}),
            )
            .await?;
            out.status(
                src,
                old_commit,
                "steward/compile",
                State::Error,
                "superseded by a newer commit before it compiled",
            );
            out.notify(
                src,
                "superseded",
                json!({"commit": old_commit, "compile": old, "by_commit": target}),
            );
        }
        let queued = out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        if queued {
            self.0.feedback.wake();
        }
        tracing::info!(environment = %env, commit = %target, trigger = kind, superseded = superseded.len(), "commit queued for compile");
        Ok(Triggered {
            commit: target,
            status: "queued".into(),
            compile: id,
            superseded: superseded.into_iter().map(|(i, _)| i).collect(),
        })
    }

    // ------------------------------------------------------------------ compiler

    /// The end of a compile, its timeline events and the messages they cause, in one
    /// transaction; while the database is away it is tried again (the compile itself is not
    /// repeated), so a restart of PostgreSQL never leaves a commit at `compile_started`.
    async fn finish_compile(
        &self,
        id: Uuid,
        end: &store::sources::CompileEnd<'_>,
        src: &SourceRow,
        events: &[(&str, &str, serde_json::Value)],
        out: Outgoing,
    ) -> Result<(), StoreError> {
        let env = src.environment_id;
        let mut delay = Duration::from_millis(200);
        loop {
            let attempt = async {
                let mut tx = self.0.pool.begin().await?;
                self.check_fence(env, &mut tx).await?;
                store::sources::finish_compile(&mut *tx, id, end).await?;
                for (commit, event, detail) in events {
                    store::sources::add_event(&mut *tx, env, commit, event, detail.clone()).await?;
                }
                let queued = out.clone().write(&mut tx, env).await?;
                tx.commit().await?;
                Ok::<bool, StoreError>(queued)
            }
            .await;
            match attempt {
                Ok(queued) => {
                    if queued {
                        self.0.feedback.wake();
                    }
                    return Ok(());
                }
                Err(e @ StoreError::Unavailable(_)) => {
                    tracing::warn!(environment = %env, error = %e, "recording a finished compile failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// End the compiles left running whose version was stored (the server stopped, or this
    /// replica's predecessor lost the environment, between storing the version and recording
    /// the end): they are not compiled again, which would make a second version of the same
    /// commit. Their timeline and the commit status say they compiled. True when feedback
    /// was queued.
    async fn settle_stored(
        &self,
        tx: &mut sqlx::PgConnection,
        env: Option<Uuid>,
    ) -> Result<bool, StoreError> {
        let settled = store::sources::settle_stored(&mut *tx, env).await?;
        let mut queued = false;
        for c in settled {
            tracing::warn!(environment = %c.environment_id, commit = %c.commit, version = c.version, compile = %c.id, "a compile's version was stored but its end was not recorded: recorded now, not compiled again");
            let detail = json!({"compile": c.id, "version": c.version});
            store::sources::add_event(&mut *tx, c.environment_id, &c.commit, "compiled", detail)
                .await?;
            let mut out = Outgoing::default();
            if let Some(src) = store::sources::get_source(&mut *tx, c.environment_id).await? {
                out.status(
                    &src,
                    &c.commit,
                    "steward/compile",
                    State::Success,
                    &format!("compiled into version {}", c.version),
                );
                out.notify(
                    &src,
                    "compiled",
                    json!({"commit": c.commit, "compile": c.id, "version": c.version}),
                );
            }
            queued |= out.write(&mut *tx, c.environment_id).await?;
        }
        Ok(queued)
    }

    async fn compiler(self, env: Uuid, queued: Arc<Notify>) {
        // a compile left `running` by the workers this one replaces (a source changed), by
        // a stop, or by the replica that owned the environment before: it runs again here
        let mut delay = Duration::from_millis(200);
        loop {
            let requeued = async {
                let mut tx = self.0.pool.begin().await?;
                self.check_fence(env, &mut tx).await?;
                let settled = self.settle_stored(&mut tx, Some(env)).await?;
                let n = store::sources::requeue_interrupted_of(&mut *tx, env).await?;
                tx.commit().await?;
                Ok::<(bool, u64), StoreError>((settled, n))
            }
            .await;
            match requeued {
                Ok((settled, n)) => {
                    if settled {
                        self.0.feedback.wake();
                    }
                    if n > 0 {
                        tracing::info!(environment = %env, compiles = n, "interrupted compiles are queued again");
                    }
                    break;
                }
                Err(StoreError::Fenced(_)) => return,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "re-queueing interrupted compiles failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        loop {
            let ran = self.compile_next(env).await;
            match ran {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "running the compile queue failed; retrying")
                }
            }
            // woken by a queued commit, or look again (a halted environment resumed, the
            // database came back)
            let _ = tokio::time::timeout(Duration::from_secs(1), queued.notified()).await;
        }
    }

    /// Run the next queued compile; false when there is none (or the environment is halted).
    async fn compile_next(&self, env: Uuid) -> Result<bool, SourceError> {
        let pool = &self.0.pool;
        let Some(job) = store::sources::next_queued(pool, env).await? else {
            return Ok(false);
        };
        if store::environments::get_environment(pool, env)
            .await?
            .halted
        {
            return Ok(false);
        }
        let Some(src) = store::sources::get_source(pool, env).await? else {
            return Ok(false);
        };
        // started and said so, or neither: a compile is never left running unannounced
        {
            let mut tx = pool.begin().await.map_err(StoreError::from)?;
            self.check_fence(env, &mut tx).await?;
            if !store::sources::start_compile(&mut *tx, job.id).await? {
                return Ok(true);
            }
            store::sources::add_event(
                &mut *tx,
                env,
                &job.commit,
                "compile_started",
                json!({"compile": job.id}),
            )
            .await?;
            tx.commit().await.map_err(StoreError::from)?;
        }
        let mirror = self.mirror_of(src.environment_id, &src.url);
        // a compile queued by another replica (which fetched into its own mirror) or
        // before this data dir was new: fetch here first
        if let Err(e) = self.fetch_commit(&src, &mirror, &job.commit).await {
            tracing::warn!(environment = %env, commit = %job.commit, error = %e, "fetching the commit to compile failed; the compile reports it");
        }
        let pip_sources = self.0.pip_sources.lock().unwrap().clone();
        let r = compile::run(
            pool,
            &job,
            &src,
            &mirror,
            &self.0.steward_bin,
            compile::Python {
                envs: &self.0.data_dir.join("python-envs"),
                pip: &pip_sources,
                made: &self.0.envs_made,
            },
            self.fence(env).as_ref(),
        )
        .await;
        let end = store::sources::CompileEnd {
            success: r.success,
            stages: &r.stages,
            exit_code: r.exit_code,
            stdout: &r.stdout,
            stderr: &r.stderr,
            diagnostics: &r.diagnostics,
            error: r.error.as_deref(),
            version: r.version,
            python_env: r.python_env.as_deref(),
        };
        let mut out = Outgoing::default();
        let mut events: Vec<(&str, &str, serde_json::Value)> = Vec::new();
        if r.success {
            let v = r.version.unwrap_or(0);
            events.push((
                &job.commit,
                "compiled",
                json!({"compile": job.id, "version": v}),
            ));
            events.push((
                &job.commit,
                "version",
                json!({"version": v, "auto_released": r.auto_released}),
            ));
            out.status(
                &src,
                &job.commit,
                "steward/compile",
                State::Success,
                &format!("compiled into version {v}"),
            );
            out.notify(&src, "compiled", json!({"commit": job.commit, "compile": job.id, "version": v, "auto_released": r.auto_released}));
            if !r.auto_released {
                events.push((&job.commit, "waiting_for_approval", json!({"version": v})));
                out.status(
                    &src,
                    &job.commit,
                    "steward/deploy",
                    State::Pending,
                    &format!("version {v} waits for approval"),
                );
            }
            self.finish_compile(job.id, &end, &src, &events, out)
                .await?;
            tracing::info!(environment = %env, commit = %job.commit, version = v, auto_released = r.auto_released, "commit compiled");
            if r.resolved_meanwhile {
                tracing::info!(environment = %env, commit = %job.commit, version = v, "values the compile missed arrived while it ran: compiling again");
                self.facts_arrived(env, vec![v], Vec::new(), false);
            }
            if r.auto_released {
                self.0.notifier.send(Event::Released {
                    environment: env,
                    version: v,
                });
            }
        } else {
            let error = r.error.clone().unwrap_or_default();
            events.push((
                &job.commit,
                "compile_failed",
                json!({"compile": job.id, "error": error}),
            ));
            out.status(&src, &job.commit, "steward/compile", State::Failure, &error);
            out.notify(&src, "compile_failed", json!({"commit": job.commit, "compile": job.id, "error": error, "diagnostics": r.diagnostics}));
            self.finish_compile(job.id, &end, &src, &events, out)
                .await?;
            tracing::warn!(environment = %env, commit = %job.commit, error = %error, "commit did not compile; the active version stays");
        }
        Ok(true)
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
            match store::sources::get_source(pool, env).await {
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
