//! Pull-request previews (docs/previews.md): what merging a pull request would change in
//! each environment that follows its base branch. A hint (a signed `pull_request` webhook, or
//! `steward preview run`) queues a run; the environment's previewer fetches the pull request,
//! merges it onto the base branch (the host's merge commit when it is current, else one made
//! here), compiles the merge as a preview — its own identity, no secret values — and diffs the
//! export against the active version. The export is then dropped: a preview is never a
//! version (nothing here calls `versions::store`, a release or an approval).

pub mod comment;
mod run;

pub use run::HIDDEN;

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
}
