//! Pull-request previews (docs/previews.md): what merging a pull request would change in
//! each environment that follows its base branch. A hint (a signed `pull_request` webhook, or
//! `steward preview run`) queues a run; the environment's previewer fetches the pull request,
//! merges it onto the base branch (the host's merge commit when it is current, else one made
//! here), compiles the merge as a preview — its own identity, no secret values — and diffs the
//! export against the active version. The export is then dropped: a preview is never a
//! version (nothing here calls `versions::store`, a release or an approval).

pub mod comment;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};
use uuid::Uuid;

use super::feedback::{Outgoing, State};
use super::webhook::{PullAction, PullHint};
use super::{GitSources, SourceError, compile, git};
use crate::model::settings::PreviewSettings;
use crate::store::previews::{self as store_previews, OpenPreview, Preview, Run, RunEnd};
use crate::store::sources::SourceRow;
use crate::store::{self, StoreError};

/// Previews running at once on this server (so they can not starve branch compiles).
fn preview_slots() -> &'static Semaphore {
    static SLOTS: std::sync::OnceLock<Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Semaphore::new((cores / 2).max(1))
    })
}

/// What a hint led to.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct PreviewQueued {
    /// `queued`, `unchanged` (the newest run is for this head), `skipped` (a fork, not
    /// previewed here), `closed` or `ignored`.
    pub status: String,
    pub reason: Option<String>,
    pub preview: Option<Uuid>,
    pub run: Option<Uuid>,
}

impl PreviewQueued {
    fn ignored(reason: String) -> PreviewQueued {
        PreviewQueued {
            status: "ignored".into(),
            reason: Some(reason),
            preview: None,
            run: None,
        }
    }
}

/// Calls to the host's API in one poll at most.
const MAX_POLL_CALLS: usize = 20;

/// The poll's state in the previewer.
#[derive(Default)]
struct Poll {
    next: Option<Instant>,
    backoff: Option<Duration>,
    /// listed once since the previewer started (an empty `pull_refs` is a baseline only
    /// the first time)
    listed: bool,
    /// when each open preview was last asked about
    checked: std::collections::HashMap<i32, Instant>,
}

/// The context of an environment's preview statuses.
pub fn status_context(env_name: &str) -> String {
    format!("steward/preview: {env_name}")
}

/// The ref of pull request `n`.
pub fn pull_ref(n: u64) -> String {
    format!("refs/pull/{n}/head")
}

impl GitSources {
    /// Take a pull-request hint for `env` (its signature was checked against `env`'s
    /// secret): open, queue, skip or close its preview, then wake the previewer.
    pub async fn preview_hint(
        &self,
        env: Uuid,
        hint: &PullHint,
        trigger: &str,
    ) -> Result<PreviewQueued, SourceError> {
        let pool = &self.0.pool;
        let src = store::sources::get_source(pool, env)
            .await?
            .ok_or(SourceError::NoSource)?;
        let e = store::environments::get_environment(pool, env).await?;
        let settings = &e.settings.previews;
        if !settings.enabled {
            return Ok(PreviewQueued::ignored(
                "previews are off in this environment (setting previews.enabled)".into(),
            ));
        }
        let reference = pull_ref(hint.number);
        let closing = match &hint.action {
            PullAction::Closed { merged } => Some((*merged, "closed".to_string())),
            PullAction::Edited if hint.base_ref != src.branch => {
                Some((false, format!("base changed to {}", hint.base_ref)))
            }
            _ => None,
        };
        if let Some((merged, why)) = closing {
            return self.close_preview(&src, &reference, merged, &why).await;
        }
        if hint.base_ref != src.branch {
            return Ok(PreviewQueued::ignored(format!(
                "a pull request to {}, not {}",
                hint.base_ref, src.branch
            )));
        }
        let skip = (hint.is_fork() && !settings.forks)
            .then_some("pull requests from forks are not previewed here (setting previews.forks)");
        let open = OpenPreview {
            env,
            reference: &reference,
            number: Some(hint.number as i32),
            base_branch: &hint.base_ref,
            head_repo: hint.head_repo.as_deref(),
            fork: hint.is_fork(),
            title: &hint.title,
            url: hint.html_url.as_deref(),
            author: hint.author.as_deref(),
        };
        self.queue_preview(&src, &e.name, &open, &hint.head_sha, trigger, skip)
            .await
    }

    /// A preview by hand (`steward preview run`): `reference` is `refs/pull/N/head`, a
    /// branch (`refs/heads/x`) or a commit id.
    pub async fn preview(
        &self,
        env: Uuid,
        reference: &str,
        number: Option<i32>,
    ) -> Result<PreviewQueued, SourceError> {
        let pool = &self.0.pool;
        let src = store::sources::get_source(pool, env)
            .await?
            .ok_or(SourceError::NoSource)?;
        let e = store::environments::get_environment(pool, env).await?;
        let number = number.or_else(|| {
            reference
                .strip_prefix("refs/pull/")
                .and_then(|r| r.strip_suffix("/head"))
                .and_then(|n| n.parse().ok())
        });
        let head = self.resolve_for_preview(&src, reference, number).await?;
        let open = OpenPreview {
            env,
            reference,
            number,
            base_branch: &src.branch,
            head_repo: None,
            fork: false,
            title: "",
            url: None,
            author: None,
        };
        self.queue_preview(&src, &e.name, &open, &head, "api", None)
            .await
    }

    /// Fetch what a preview by hand names; its commit.
    async fn resolve_for_preview(
        &self,
        src: &SourceRow,
        reference: &str,
        number: Option<i32>,
    ) -> Result<String, SourceError> {
        if let Some(e) = self.refused(&src.url) {
            return Err(e.into());
        }
        let mirror = self.mirror_of(src.environment_id, &src.url);
        let guard = self.mirror_lock(&mirror).lock_owned().await;
        let (url, auth, reference) = (src.url.clone(), git::Auth::of(src), reference.to_string());
        let pull = reference.starts_with("refs/pull/");
        tokio::task::spawn_blocking(move || -> Result<String, git::GitError> {
            let _guard = guard;
            if let (true, Some(n)) = (pull, number) {
                return Ok(git::fetch_pull(&mirror, &url, &auth, n as u64)?.head);
            }
            git::ensure_mirror(&mirror, &url, &auth)?;
            if let Some(branch) = reference.strip_prefix("refs/heads/") {
                return git::resolve_branch(&mirror, branch)?
                    .ok_or_else(|| git::GitError::NotFound(format!("branch {branch}")));
            }
            if reference.len() == 40
                && reference.bytes().all(|b| b.is_ascii_hexdigit())
                && git::has_commit(&mirror, &reference)
            {
                return Ok(reference.to_ascii_lowercase());
            }
            Err(git::GitError::NotFound(format!(
                "{reference}: neither refs/pull/N/head, refs/heads/BRANCH nor a full commit id of the repository"
            )))
        })
        .await
        .map_err(|e| git::GitError::Other(format!("fetch crashed: {e}")))?
        .map_err(SourceError::from)
    }

    async fn queue_preview(
        &self,
        src: &SourceRow,
        env_name: &str,
        open: &OpenPreview<'_>,
        head: &str,
        trigger: &str,
        skip: Option<&str>,
    ) -> Result<PreviewQueued, SourceError> {
        let env = src.environment_id;
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        let preview = store_previews::upsert_open(&mut *tx, open).await?;
        let q = store_previews::queue_run(&mut tx, &preview, head, trigger, skip).await?;
        let mut out = Outgoing::default();
        let context = status_context(env_name);
        for (_, old_head) in &q.superseded {
            out.status(
                src,
                old_head,
                &context,
                State::Error,
                "superseded by a newer commit",
            );
        }
        if q.new && skip.is_none() {
            out.status(src, head, &context, State::Pending, "queued");
        }
        let any = out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        if any {
            self.0.feedback.wake();
        }
        let status = match (q.new, skip) {
            (false, _) => "unchanged",
            (true, Some(_)) => "skipped",
            (true, None) => "queued",
        };
        if status == "queued" {
            tracing::info!(environment = %env, preview = %preview.id, reference = %preview.reference, head, trigger, "preview queued");
            self.wake_previewer(env);
        }
        Ok(PreviewQueued {
            status: status.into(),
            reason: skip.map(str::to_string),
            preview: Some(preview.id),
            run: Some(q.run),
        })
    }

    async fn close_preview(
        &self,
        src: &SourceRow,
        reference: &str,
        merged: bool,
        why: &str,
    ) -> Result<PreviewQueued, SourceError> {
        let env = src.environment_id;
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        let closed = store_previews::close(&mut tx, env, reference, merged).await?;
        let Some(p) = closed else {
            return Ok(PreviewQueued::ignored(format!(
                "no open preview of {reference}"
            )));
        };
        let mut out = Outgoing::default();
        if let Some(n) = p.number {
            out.preview_comment(src, n);
        }
        let any = out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        if any {
            self.0.feedback.wake();
        }
        tracing::info!(environment = %env, preview = %p.id, reference, merged, why, "preview closed");
        // its refs and merge go; the objects with the mirror's next repack
        if let Some(n) = p.number {
            let mirror = self.mirror_of(env, &src.url);
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let _ = tokio::task::spawn_blocking(move || {
                let _guard = guard;
                git::drop_pull(&mirror, n as u64)
            })
            .await;
        }
        Ok(PreviewQueued {
            status: "closed".into(),
            reason: Some(why.into()),
            preview: Some(p.id),
            run: None,
        })
    }

    fn wake_previewer(&self, env: Uuid) {
        if let Some(w) = self.0.workers.lock().expect("workers").get(&env) {
            w.previews.notify_one();
        }
    }

    /// The previewer of `env`: runs its queued previews one at a time, woken by a hint and
    /// every two seconds (a hint taken by another replica).
    pub(super) async fn previewer(self, env: Uuid, wake: Arc<Notify>) {
        let mut delay = Duration::from_millis(200);
        loop {
            let requeued = async {
                let mut tx = self.0.pool.begin().await?;
                self.check_fence(env, &mut tx).await?;
                let n = store_previews::requeue_interrupted_of(&mut *tx, env).await?;
                tx.commit().await?;
                Ok::<u64, StoreError>(n)
            }
            .await;
            match requeued {
                Ok(_) => break,
                Err(StoreError::Fenced(_)) => return,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "re-queueing interrupted previews failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        let mut poll = Poll::default();
        loop {
            if poll.next.is_none_or(|t| t <= Instant::now()) {
                let wait = match self.poll_pulls(env, &mut poll).await {
                    Ok(interval) => {
                        poll.backoff = None;
                        interval
                    }
                    Err(e) => {
                        let d = poll.backoff.map_or(Duration::from_secs(1), |d| {
                            (d * 2).min(Duration::from_secs(30))
                        });
                        poll.backoff = Some(d);
                        tracing::warn!(environment = %env, error = %e, retry_in_s = d.as_secs(), "polling pull requests failed; trying again");
                        d
                    }
                };
                poll.next = Some(Instant::now() + wait);
            }
            match self.preview_next(env).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "running the preview queue failed; retrying")
                }
            }
            let until_poll = poll.next.map_or(Duration::from_secs(2), |t| {
                t.saturating_duration_since(Instant::now())
            });
            let _ =
                tokio::time::timeout(until_poll.min(Duration::from_secs(2)), wake.notified()).await;
        }
    }

    /// Look for pull requests without webhooks (a source that polls, with a host API): list
    /// `refs/pull/*/head` (nothing is fetched), and ask the host about each new or moved head
    /// (the git protocol tells neither the base branch nor the fork) and, now and then, about
    /// open previews (closed without a webhook?). The first listing is a baseline: pull
    /// requests already there are not previewed. At most [`MAX_POLL_CALLS`] calls a poll.
    /// When to look again.
    async fn poll_pulls(&self, env: Uuid, poll: &mut Poll) -> Result<Duration, String> {
        // not polled now: look at the settings again soon (they may change)
        let idle = Duration::from_secs(5);
        let pool = &self.0.pool;
        let src = match store::sources::get_source(pool, env).await {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(idle),
            Err(e) => return Err(e.to_string()),
        };
        let e = store::environments::get_environment(pool, env)
            .await
            .map_err(|e| e.to_string())?;
        let has_api = src.status_repo.is_some()
            && src.status_token.is_some()
            && super::feedback::api_base(&src).is_some();
        if !e.settings.previews.enabled || src.poll_interval <= 0 || !has_api {
            return Ok(idle);
        }
        let interval = Duration::from_secs(src.poll_interval as u64);
        if let Some(e) = self.refused(&src.url) {
            return Err(e.to_string());
        }
        let mirror = self.mirror_of(env, &src.url);
        let heads = {
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let (url, auth) = (src.url.clone(), git::Auth::of(&src));
            tokio::task::spawn_blocking(move || {
                let _guard = guard;
                git::list_pull_heads(&mirror, &url, &auth)
            })
            .await
            .map_err(|e| format!("listing crashed: {e}"))?
            .map_err(|e| format!("listing the pull requests failed: {e}"))?
        };
        let known = store_previews::pull_refs(pool, env)
            .await
            .map_err(|e| e.to_string())?;
        let baseline = known.is_empty() && !poll.listed;
        poll.listed = true;
        let mut seen: Vec<(i32, String)> = Vec::new();
        let mut calls = 0;
        let mut failure = None;
        for (n, head) in heads {
            let n = n as i32;
            if baseline || known.get(&n) == Some(&head) {
                seen.push((n, head));
                continue;
            }
            if calls >= MAX_POLL_CALLS || failure.is_some() {
                // left for the next poll: recorded as it was
                if let Some(old) = known.get(&n) {
                    seen.push((n, old.clone()));
                }
                continue;
            }
            calls += 1;
            match self.pull_from_host(&src, n).await {
                Ok(hint) => {
                    if let Err(e) = self.preview_hint(env, &hint, "poll").await {
                        failure = Some(e.to_string());
                        continue;
                    }
                    seen.push((n, head));
                }
                Err(e) => failure = Some(e),
            }
        }
        // open previews: closed or merged without a webhook? (each at most every five polls)
        let recheck = (interval * 5).max(Duration::from_secs(5));
        if failure.is_none() {
            let open = store_previews::list(pool, env, Some("open"), 200)
                .await
                .map_err(|e| e.to_string())?;
            for p in open {
                let Some(n) = p.number else { continue };
                if calls >= MAX_POLL_CALLS {
                    break;
                }
                if poll.checked.get(&n).is_some_and(|t| t.elapsed() < recheck) {
                    continue;
                }
                poll.checked.insert(n, Instant::now());
                calls += 1;
                match self.pull_from_host(&src, n).await {
                    Ok(hint) if matches!(hint.action, PullAction::Closed { .. }) => {
                        self.preview_hint(env, &hint, "poll")
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
        store_previews::set_pull_refs(&mut tx, env, &seen)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        match failure {
            Some(e) => Err(e),
            None => Ok(interval),
        }
    }

    /// What the host says of pull request `n`, as a hint.
    async fn pull_from_host(&self, src: &SourceRow, n: i32) -> Result<PullHint, String> {
        let pr = self.0.feedback.get_pull(src, n as i64).await?;
        // read as the webhook of that state would be (`merged` is in the pull request)
        let action = if pr["state"] == "closed" {
            "closed"
        } else {
            "synchronize"
        };
        let body = json!({"action": action, "number": n, "pull_request": pr});
        super::webhook::pull_hint(&serde_json::to_vec(&body).unwrap_or_default())
            .map_err(|e| format!("pull request {n} as the host shows it: {e}"))
    }

    /// Run the next queued preview; false when there is none (or the environment is halted).
    async fn preview_next(&self, env: Uuid) -> Result<bool, SourceError> {
        let pool = &self.0.pool;
        let Some(run) = store_previews::next_queued(pool, env).await? else {
            return Ok(false);
        };
        let e = store::environments::get_environment(pool, env).await?;
        if e.halted {
            return Ok(false);
        }
        let Some(src) = store::sources::get_source(pool, env).await? else {
            return Ok(false);
        };
        let _slot = preview_slots()
            .acquire()
            .await
            .map_err(|_| SourceError::Unavailable)?;
        {
            let mut tx = pool.begin().await.map_err(StoreError::from)?;
            self.check_fence(env, &mut tx).await?;
            if !store_previews::start_run(&mut *tx, run.id).await? {
                return Ok(true);
            }
            tx.commit().await.map_err(StoreError::from)?;
        }
        let preview = store_previews::get(pool, env, run.preview_id).await?;
        let mut out = Outgoing::default();
        out.status(
            &src,
            &run.head,
            &status_context(&e.name),
            State::Pending,
            "previewing",
        );
        if let Some(n) = preview.number {
            out.preview_comment(&src, n);
        }
        let mut tx = pool.begin().await.map_err(StoreError::from)?;
        out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.0.feedback.wake();

        let t = Instant::now();
        let done = self
            .run_preview(&src, &preview, &run, &e.settings.previews)
            .await;
        let ended = self
            .finish_preview(&src, &e.name, &preview, &run, done)
            .await?;
        if ended {
            tracing::info!(environment = %env, preview = %preview.id, run = %run.id, ms = t.elapsed().as_millis() as u64, "preview done");
        } else {
            tracing::info!(environment = %env, preview = %preview.id, run = %run.id, "preview superseded while it ran; its result is dropped");
        }
        Ok(true)
    }

    /// Fetch, merge, compile and diff one run.
    async fn run_preview(
        &self,
        src: &SourceRow,
        preview: &Preview,
        run: &Run,
        settings: &PreviewSettings,
    ) -> Done {
        let mut done = Done::new(&run.head);
        let env = src.environment_id;
        let mirror = self.mirror_of(env, &src.url);
        // fetch: the pull request's refs and the branches, in one fetch
        let at = compile::begin();
        let fetched = {
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let (m, url, auth, branch) = (
                mirror.clone(),
                src.url.clone(),
                git::Auth::of(src),
                src.branch.clone(),
            );
            let (number, head) = (preview.number, run.head.clone());
            let refused = self.refused(&src.url);
            tokio::task::spawn_blocking(move || {
                let _guard = guard;
                if let Some(e) = refused {
                    return Err(e);
                }
                let (head, host_merge) = match number {
                    Some(n) => {
                        let refs = git::fetch_pull(&m, &url, &auth, n as u64)?;
                        (refs.head, refs.merge)
                    }
                    None => {
                        if !git::has_commit(&m, &head) {
                            git::ensure_mirror(&m, &url, &auth)?;
                        }
                        (head, None)
                    }
                };
                let base = git::resolve_branch(&m, &branch)?
                    .ok_or_else(|| git::GitError::NotFound(format!("branch {branch}")))?;
                Ok((head, host_merge, base))
            })
            .await
            .unwrap_or_else(|e| Err(git::GitError::Other(format!("fetch crashed: {e}"))))
        };
        let (head, host_merge, base) = match fetched {
            Ok(f) => f,
            Err(e) => return done.failed("fetch", at, format!("fetching failed: {e}")),
        };
        if head != run.head {
            // pushed again since the hint: the newest head is what merging would take
            done.stage(
                "fetch",
                at,
                true,
                &format!("head moved from {} to {}", short(&run.head), short(&head)),
            );
        } else {
            done.stage("fetch", at, true, &format!("head {}", short(&head)));
        }
        done.head = head.clone();
        done.base = Some(base.clone());

        // merge: the host's merge commit when it is of this base and head, else one made here
        let at = compile::begin();
        let name = match preview.number {
            Some(n) => n.to_string(),
            None => format!("hand-{}", preview.id.simple()),
        };
        let merged = {
            let guard = self.mirror_lock(&mirror).lock_owned().await;
            let m = mirror.clone();
            let (base, head) = (base.clone(), head.clone());
            tokio::task::spawn_blocking(move || {
                let _guard = guard;
                if let Some(hm) = host_merge
                    && git::parents(&m, &hm).is_ok_and(|p| p == [base.clone(), head.clone()])
                {
                    return Ok(("host", git::Merge::Clean(hm)));
                }
                git::merge_for_preview(&m, &base, &head, &name).map(|r| ("steward", r))
            })
            .await
            .unwrap_or_else(|e| Err(git::GitError::Other(format!("merge crashed: {e}"))))
        };
        let merge = match merged {
            Ok((source, git::Merge::Clean(c))) => {
                done.merge_source = Some(source);
                done.stage(
                    "merge",
                    at,
                    true,
                    &format!(
                        "{} onto {} at {}: {} ({source})",
                        short(&head),
                        src.branch,
                        short(&base),
                        short(&c)
                    ),
                );
                c
            }
            Ok((_, git::Merge::Conflict(paths))) => {
                let mut list = paths
                    .iter()
                    .take(20)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                if paths.len() > 20 {
                    list.push_str(&format!(" and {} more", paths.len() - 20));
                }
                return done.failed(
                    "merge",
                    at,
                    format!("does not merge cleanly into {}: {list}", src.branch),
                );
            }
            Err(e) => return done.failed("merge", at, format!("merging failed: {e}")),
        };
        done.merge = Some(merge.clone());
        // superseded meanwhile (a newer push, a close): the compile would be for nothing
        if !store_previews::still_running(&self.0.pool, run.id)
            .await
            .unwrap_or(true)
        {
            return done.failed("compile", compile::begin(), "superseded".into());
        }

        // compile, as a preview
        let pip_sources = self.0.pip_sources.lock().unwrap().clone();
        let spec = compile::BuildSpec {
            env,
            commit: &merge,
            stages: std::mem::take(&mut done.stages),
            source: src,
            mirror: &mirror,
            steward_bin: &self.0.steward_bin,
            python: compile::Python {
                envs: &self.0.data_dir.join("python-envs"),
                pip: &pip_sources,
                made: &self.0.envs_made,
            },
            preview: true,
        };
        let built = compile::build(&self.0.pool, spec).await;
        let (report, export, withheld) = match built {
            Ok(b) => (b.report, b.export, b.withheld),
            Err(failed) => {
                done.absorb(*failed);
                done.source_lines(&mirror, &merge, &src.path).await;
                return done;
            }
        };
        done.stages = report.stages;
        done.exit_code = report.result.exit_code;
        done.stdout = report.result.stdout;
        done.stderr = report.result.stderr;
        done.diagnostics = report.result.diagnostics;
        // its handler code is never stored nor run; only the resources are diffed
        let at = compile::begin();
        let diff = async {
            let mut c = self.0.pool.acquire().await?;
            store_previews::diff_export(&mut c, env, &export, &withheld).await
        }
        .await;
        match diff {
            Ok(mut d) => {
                // the active version may hold secret values (branch compiles read them): a
                // preview, shown to the pull request's author, never does
                match store::facts::secret_values(&self.0.pool, env).await {
                    Ok(secrets) => redact(&mut d.changes, &secrets),
                    Err(e) => {
                        return done.failed("diff", at, format!("reading secrets failed: {e}"));
                    }
                }
                let s = &d.summary;
                done.stage(
                    "diff",
                    at,
                    true,
                    &format!(
                        "{} against {}",
                        comment::counts_text(s),
                        comment::against(d.base)
                    ),
                );
                // the dry-run (opt in, never for a fork): the resources it adds or changes,
                // as the pull request wants them
                if settings.dry_run && !preview.fork && d.base.is_some() {
                    let wanted: std::collections::HashSet<&str> = d
                        .changes
                        .iter()
                        .filter(|c| c.change == "new" || c.change == "updated")
                        .map(|c| c.resource_id.as_str())
                        .collect();
                    done.dry = export
                        .resources
                        .iter()
                        .filter(|r| wanted.contains(r.id.0.as_str()))
                        .cloned()
                        .collect();
                }
                done.success = true;
                done.diff_base = d.base;
                done.summary = d.summary;
                done.changes = d.changes;
            }
            Err(e) => return done.failed("diff", at, format!("diffing failed: {e}")),
        }
        done
    }

    /// Record a run's end with its statuses and comment; false when it was superseded.
    async fn finish_preview(
        &self,
        src: &SourceRow,
        env_name: &str,
        preview: &Preview,
        run: &Run,
        done: Done,
    ) -> Result<bool, SourceError> {
        let env = src.environment_id;
        let mut done = done;
        let dryrun = match (done.dry.is_empty(), done.diff_base) {
            (false, Some(version)) => {
                let id = Uuid::new_v4();
                done.summary["dryrun"] =
                    json!({"id": id, "version": version, "total": done.dry.len()});
                Some((id, version))
            }
            _ => None,
        };
        let stages = json!(done.stages);
        let source_lines = json!(done.source_lines);
        let end = RunEnd {
            status: if done.success { "success" } else { "failed" },
            head: &done.head,
            base: done.base.as_deref(),
            merge: done.merge.as_deref(),
            merge_source: done.merge_source,
            diff_base: done.diff_base,
            summary: &done.summary,
            stages: &stages,
            exit_code: done.exit_code,
            stdout: &done.stdout,
            stderr: &done.stderr,
            diagnostics: &done.diagnostics,
            source_lines: &source_lines,
            error: done.error.as_deref(),
        };
        let mut out = Outgoing::default();
        let context = status_context(env_name);
        if done.success {
            out.status(
                src,
                &done.head,
                &context,
                State::Success,
                &format!(
                    "{} against {}",
                    comment::counts_text(&done.summary),
                    comment::against(done.diff_base)
                ),
            );
        } else {
            out.status(
                src,
                &done.head,
                &context,
                State::Failure,
                done.error.as_deref().unwrap_or("failed"),
            );
        }
        if let Some(n) = preview.number {
            out.preview_comment(src, n);
        }
        let mut tx = self.0.pool.begin().await.map_err(StoreError::from)?;
        self.check_fence(env, &mut tx).await?;
        if !store_previews::finish_run(&mut tx, run.id, &end).await? {
            return Ok(false);
        }
        store_previews::store_changes(&mut tx, run.id, &done.changes).await?;
        if let Some((id, version)) = dryrun {
            let resources: Vec<&crate::model::Resource> = done.dry.iter().collect();
            store_previews::create_dryrun(
                &mut tx,
                env,
                id,
                run.id,
                version,
                &resources,
                &format!("preview of {}", preview.reference),
            )
            .await?;
        }
        out.write(&mut tx, env).await?;
        tx.commit().await.map_err(StoreError::from)?;
        self.0.feedback.wake();
        if let Some((dryrun, _)) = dryrun {
            // the environment's scheduler runs it (on whichever replica owns it)
            self.0.notifier.send(crate::events::Event::PreviewDryrun {
                environment: env,
                dryrun,
            });
        }
        Ok(true)
    }
}

fn short(c: &str) -> &str {
    &c[..c.len().min(12)]
}

/// What a value holding one of `secrets` (4 characters or more) shows instead.
pub const HIDDEN: &str = "(hidden: contains a secret value)";

/// Hide every attribute value, old or new, that holds a secret value.
fn redact(changes: &mut [store_previews::PreviewChange], secrets: &[String]) {
    let secrets: Vec<&str> = secrets
        .iter()
        .map(String::as_str)
        .filter(|s| s.len() >= 4)
        .collect();
    if secrets.is_empty() {
        return;
    }
    let holds = |v: &Value| {
        let text = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        secrets.iter().any(|s| text.contains(s))
    };
    for ch in changes {
        if let Some(attrs) = ch.attributes.as_object_mut() {
            for c in attrs.values_mut() {
                for side in ["current", "desired"] {
                    if holds(&c[side]) {
                        c[side] = json!(HIDDEN);
                    }
                }
            }
        }
    }
}

/// A run as it goes.
struct Done {
    success: bool,
    head: String,
    base: Option<String>,
    merge: Option<String>,
    merge_source: Option<&'static str>,
    diff_base: Option<i32>,
    summary: Value,
    stages: Vec<Value>,
    exit_code: Option<i32>,
    stdout: String,
    stderr: String,
    diagnostics: Value,
    source_lines: Vec<compile::SourceLine>,
    error: Option<String>,
    changes: Vec<store_previews::PreviewChange>,
    /// What the dry-run runs, when there is one.
    dry: Vec<crate::model::Resource>,
}

impl Done {
    fn new(head: &str) -> Done {
        Done {
            success: false,
            head: head.into(),
            base: None,
            merge: None,
            merge_source: None,
            diff_base: None,
            summary: json!({}),
            stages: Vec::new(),
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            diagnostics: json!([]),
            source_lines: Vec::new(),
            error: None,
            changes: Vec::new(),
            dry: Vec::new(),
        }
    }

    fn stage(&mut self, name: &str, at: compile::Start, ok: bool, detail: &str) {
        self.stages
            .push(compile::stage(name, at.0, at.1.elapsed(), ok, detail));
    }

    fn failed(mut self, name: &str, at: compile::Start, error: String) -> Done {
        self.stage(name, at, false, &error);
        self.error = Some(error);
        self
    }

    /// A compile that failed: its report becomes the run's.
    fn absorb(&mut self, r: compile::CompileResult) {
        self.stages = r.stages.as_array().cloned().unwrap_or_default();
        self.exit_code = r.exit_code;
        self.stdout = r.stdout;
        self.stderr = r.stderr;
        self.diagnostics = r.diagnostics;
        self.error = r.error;
    }

    /// The lines the diagnostics point at, read from the merge (so a comment shows them
    /// wherever it is rendered).
    async fn source_lines(&mut self, mirror: &Path, merge: &str, path: &str) {
        let (m, c, p, d) = (
            mirror.to_path_buf(),
            merge.to_string(),
            path.to_string(),
            self.diagnostics.clone(),
        );
        self.source_lines =
            tokio::task::spawn_blocking(move || compile::source_lines(&m, &c, &p, &d))
                .await
                .unwrap_or_default();
    }
}
