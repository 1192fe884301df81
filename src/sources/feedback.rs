//! Telling the outside what happened to a commit: a commit status on the git host (GitHub or
//! Gitea/Forgejo status API, with the source's token) and an HMAC-signed webhook to the
//! environment's notification URL.
//!
//! Nothing is sent directly: messages are written to the outbox (`store::outbox`) in the
//! transaction that records the event they report, and [`Feedback::deliver`] sends them at
//! least once, retrying with backoff, also after a crash or restart. A receiver can tell a
//! repeat by its `X-Steward-Delivery` id, which stays the same across attempts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::store::outbox::OutboxRow;
use crate::store::sources::SourceRow;
use crate::store::{self, StoreError};

/// Commit status states common to GitHub and Gitea.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Pending,
    Success,
    Failure,
    /// neither passed nor failed: replaced before it finished
    Error,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
            State::Error => "error",
        }
    }
}

/// Attempts before a message is given up (about an hour of retries).
const MAX_ATTEMPTS: i32 = 20;
/// Longest wait between two attempts.
const MAX_RETRY_S: f64 = 300.0;

/// Messages to send, gathered while an event is recorded and written with it.
#[derive(Clone, Default)]
pub struct Outgoing {
    messages: Vec<(&'static str, Value)>,
}

impl Outgoing {
    /// A commit status (`context` e.g. "steward/compile"), if the source posts them.
    pub fn status(
        &mut self,
        src: &SourceRow,
        commit: &str,
        context: &str,
        state: State,
        description: &str,
    ) {
        if status_url(src, commit).is_none() || src.status_token.is_none() {
            return;
        }
        // descriptions are capped at 140 characters by GitHub
        let description: String = description.chars().take(140).collect();
        self.messages.push((
            "status",
            json!({"commit": commit, "state": state.as_str(), "context": context, "description": description}),
        ));
    }

    /// The sticky comment of pull request `number` is to be brought up to date (rendered
    /// when it is delivered), if the source has a status API and token.
    pub fn preview_comment(&mut self, src: &SourceRow, number: i32) {
        if super::previews::comment::comment_key(src).is_none() {
            return;
        }
        self.messages.push(("comment", json!({"number": number})));
    }

    /// A signed pipeline event, if the source has a notification URL.
    pub fn notify(&mut self, src: &SourceRow, event: &str, mut payload: Value) {
        if src.notify_url.is_none() {
            return;
        }
        payload["event"] = json!(event);
        payload["environment"] = json!(src.environment_id);
        payload["at"] = json!(chrono::Utc::now());
        // one id for every attempt: receivers deduplicate by it
        payload["delivery"] = json!(Uuid::new_v4());
        self.messages.push(("notify", payload));
    }

    /// Write the messages to the outbox (in the caller's transaction).
    pub async fn write(self, c: &mut PgConnection, env: Uuid) -> Result<bool, StoreError> {
        let any = !self.messages.is_empty();
        for (kind, payload) in self.messages {
            store::outbox::enqueue(&mut *c, env, kind, &payload).await?;
        }
        Ok(any)
    }
}

#[derive(Clone)]
pub struct Feedback {
    http: reqwest::Client,
    /// wakes the deliverer when something was queued
    queued: Arc<Notify>,
}

impl Default for Feedback {
    fn default() -> Self {
        Feedback {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .user_agent(concat!("steward/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("http client"),
            queued: Arc::new(Notify::new()),
        }
    }
}

/// The REST API of the source's host (GitHub's, or a Gitea's `/api/v1`), if it posts
/// statuses.
pub(super) fn api_base(src: &SourceRow) -> Option<String> {
    match src.status_kind.as_str() {
        "github" => Some(
            src.status_api_url
                .as_deref()
                .unwrap_or("https://api.github.com")
                .trim_end_matches('/')
                .to_string(),
        ),
        "gitea" => {
            let base = src.status_api_url.as_deref()?.trim_end_matches('/');
            Some(if base.ends_with("/api/v1") {
                base.to_string()
            } else {
                format!("{base}/api/v1")
            })
        }
        _ => None,
    }
}

/// `{api}/repos/{repo}`, if the source posts to a host.
fn repo_url(src: &SourceRow) -> Option<String> {
    let repo = src.status_repo.as_deref()?.trim_matches('/');
    Some(format!("{}/repos/{repo}", api_base(src)?))
}

/// The Authorization header for the host's API.
fn host_auth(src: &SourceRow) -> Option<String> {
    match (src.status_kind.as_str(), &src.status_token) {
        ("github", Some(t)) => Some(format!("Bearer {t}")),
        ("gitea", Some(t)) => Some(format!("token {t}")),
        _ => None,
    }
}

/// Where a commit status goes, if the source asks for one.
fn status_url(src: &SourceRow, commit: &str) -> Option<String> {
    Some(format!("{}/statuses/{commit}", repo_url(src)?))
}

/// Why one attempt did not deliver.
enum Undelivered {
    /// will not change on retry (a 4xx, no destination)
    Refused(String),
    Failed(String),
}

impl Feedback {
    /// Something was written to the outbox: deliver it now rather than at the next look.
    pub fn wake(&self) {
        self.queued.notify_one();
    }

    /// Deliver the outbox, for ever: woken when something is queued, and every second for
    /// retries that became due.
    pub async fn deliver(self, pool: PgPool) {
        loop {
            match store::outbox::claim_due(&pool, 32, 60.0).await {
                Ok(rows) if !rows.is_empty() => {
                    for row in rows {
                        self.deliver_one(&pool, row).await;
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reading the outbox failed; retrying"),
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), self.queued.notified()).await;
        }
    }

    async fn deliver_one(&self, pool: &PgPool, row: OutboxRow) {
        let result = match store::sources::get_source(pool, row.environment_id).await {
            Ok(Some(src)) if row.kind == "comment" => self.send_comment(pool, &src, &row).await,
            Ok(Some(src)) => self.send(&src, &row).await,
            Ok(None) => Err(Undelivered::Refused(
                "the environment has no git source any more".into(),
            )),
            // the lease makes it due again
            Err(e) => return tracing::warn!(error = %e, "outbox: loading the source failed"),
        };
        let attempts = row.attempts + 1;
        let (error, retry) = match result {
            Ok(()) => {
                if let Err(e) = store::outbox::delivered(pool, row.id).await {
                    tracing::warn!(error = %e, "outbox: recording a delivery failed; it may be sent again");
                }
                return;
            }
            Err(Undelivered::Refused(e)) => (e, None),
            Err(Undelivered::Failed(e)) if attempts >= MAX_ATTEMPTS => (e, None),
            Err(Undelivered::Failed(e)) => {
                let wait = 2f64.powi(attempts.min(20)).min(MAX_RETRY_S);
                (e, Some(wait))
            }
        };
        let what = match row.kind.as_str() {
            "status" => "commit status",
            "comment" => "pull request comment",
            _ => "notification webhook",
        };
        match retry {
            Some(s) => {
                tracing::warn!(environment = %row.environment_id, attempts, retry_in_s = s, error = %error, "{what} not delivered; will retry")
            }
            None => {
                tracing::warn!(environment = %row.environment_id, attempts, error = %error, "{what} not delivered; given up")
            }
        }
        if let Err(e) = store::outbox::failed(pool, row.id, &error, retry).await {
            tracing::warn!(error = %e, "outbox: recording a failed delivery failed");
        }
    }

    async fn send(&self, src: &SourceRow, row: &OutboxRow) -> Result<(), Undelivered> {
        let p = &row.payload;
        match row.kind.as_str() {
            "status" => {
                let commit = p["commit"].as_str().unwrap_or_default();
                let url = status_url(src, commit).ok_or_else(|| {
                    Undelivered::Refused("the source posts no commit statuses any more".into())
                })?;
                let auth = host_auth(src).ok_or_else(|| {
                    Undelivered::Refused("the source has no status token any more".into())
                })?;
                let body = json!({"state": p["state"], "context": p["context"], "description": p["description"]});
                let body = serde_json::to_vec(&body).expect("json");
                self.post(
                    &url,
                    body,
                    &[
                        ("Authorization", auth.as_str()),
                        ("Accept", "application/json"),
                    ],
                )
                .await
            }
            _ => {
                let url = src.notify_url.clone().ok_or_else(|| {
                    Undelivered::Refused("the source has no notification URL any more".into())
                })?;
                let body = serde_json::to_vec(p).expect("json");
                let event = p["event"].as_str().unwrap_or_default();
                let delivery = p["delivery"].as_str().unwrap_or_default();
                let signature = src
                    .notify_secret
                    .as_ref()
                    .map(|s| format!("sha256={}", super::webhook::sign(s, &body)));
                let mut headers =
                    vec![("X-Steward-Event", event), ("X-Steward-Delivery", delivery)];
                if let Some(sig) = &signature {
                    headers.push(("X-Steward-Signature", sig.as_str()));
                }
                self.post(&url, body, &headers).await
            }
        }
    }

    /// Bring the sticky comment of a pull request up to date: render it from the newest
    /// runs, then edit the comment (found by its id, else by its marker) or make it. The
    /// comment's row stays locked across the calls, so two deliverers never both make one.
    async fn send_comment(
        &self,
        pool: &PgPool,
        src: &SourceRow,
        row: &OutboxRow,
    ) -> Result<(), Undelivered> {
        use super::previews::comment;
        let failed = |e: StoreError| Undelivered::Failed(format!("reading the previews: {e}"));
        let number = row.payload["number"].as_i64().unwrap_or(0) as i32;
        let (Some((host, repo, token_digest)), Some(base), Some(auth)) =
            (comment::comment_key(src), repo_url(src), host_auth(src))
        else {
            return Err(Undelivered::Refused(
                "the source posts to no host any more".into(),
            ));
        };
        let installation = store::previews::installation(pool).await.map_err(failed)?;
        let sections = comment::sections(pool, src, number).await.map_err(failed)?;
        if sections.is_empty() {
            return Ok(());
        }
        let body = comment::render(installation, &sections);
        let digest = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(body.as_bytes()))
        };
        let key = store::previews::CommentKey {
            host: &host,
            repo: &repo,
            number,
            token_digest: &token_digest,
        };
        let mut tx = pool.begin().await.map_err(|e| failed(e.into()))?;
        let (id, last) = store::previews::lock_comment(&mut tx, &key)
            .await
            .map_err(failed)?;
        if id.is_some() && last.as_deref() == Some(digest.as_str()) {
            return Ok(());
        }
        let headers = [
            ("Authorization", auth.as_str()),
            ("Accept", "application/json"),
        ];
        let text = serde_json::to_vec(&json!({"body": body})).expect("json");
        let mut id = id;
        if let Some(known) = id {
            let url = format!("{base}/issues/comments/{known}");
            match self
                .call(reqwest::Method::PATCH, &url, text.clone(), &headers)
                .await
            {
                Ok(_) => {}
                // deleted on the host: made again below
                Err(Undelivered::Refused(e)) if e.contains("404") => id = None,
                Err(e) => return Err(e),
            }
        }
        if id.is_none() {
            id = self
                .find_comment(&base, number, &comment::marker(installation), &headers)
                .await?;
            match id {
                Some(found) => {
                    let url = format!("{base}/issues/comments/{found}");
                    self.call(reqwest::Method::PATCH, &url, text, &headers)
                        .await?;
                }
                None => {
                    let url = format!("{base}/issues/{number}/comments");
                    let made = self
                        .call(reqwest::Method::POST, &url, text, &headers)
                        .await?;
                    id = made["id"].as_i64();
                }
            }
        }
        store::previews::set_comment(&mut tx, &key, id, Some(&digest))
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(|e| failed(e.into()))?;
        Ok(())
    }

    /// What the host says of pull request `number` (`GET …/pulls/{n}`), for the poll: the
    /// git protocol tells neither its base branch nor whether it comes from a fork.
    pub async fn get_pull(&self, src: &SourceRow, number: i64) -> Result<Value, String> {
        let (Some(base), Some(auth)) = (repo_url(src), host_auth(src)) else {
            return Err("the source has no status API and token".into());
        };
        let headers = [
            ("Authorization", auth.as_str()),
            ("Accept", "application/json"),
        ];
        self.call(
            reqwest::Method::GET,
            &format!("{base}/pulls/{number}"),
            Vec::new(),
            &headers,
        )
        .await
        .map_err(|e| match e {
            Undelivered::Refused(m) | Undelivered::Failed(m) => m,
        })
    }

    /// The id of this installation's comment on pull request `number`, if the host has one.
    async fn find_comment(
        &self,
        base: &str,
        number: i32,
        marker: &str,
        headers: &[(&str, &str)],
    ) -> Result<Option<i64>, Undelivered> {
        for page in 1..=10 {
            let url = format!("{base}/issues/{number}/comments?per_page=100&limit=50&page={page}");
            let list = self
                .call(reqwest::Method::GET, &url, Vec::new(), headers)
                .await?;
            let Some(items) = list.as_array() else {
                return Ok(None);
            };
            if let Some(c) = items
                .iter()
                .find(|c| c["body"].as_str().is_some_and(|b| b.starts_with(marker)))
            {
                return Ok(c["id"].as_i64());
            }
            if items.is_empty() {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// One call to a host's API; its JSON answer (bounded).
    async fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<Value, Undelivered> {
        let mut req = self.http.request(method, url);
        if !body.is_empty() {
            req = req.header("Content-Type", "application/json").body(body);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req
            .send()
            .await
            .map_err(|e| Undelivered::Failed(e.without_url().to_string()))?;
        let status = r.status();
        if !status.is_success() {
            // a rate limit (403 with nothing left, 429) is worth a retry; other refusals not
            let limited = status.as_u16() == 403
                && (r.headers().contains_key("retry-after")
                    || r.headers()
                        .get("x-ratelimit-remaining")
                        .is_some_and(|v| v == "0"));
            return Err(
                if status.is_client_error()
                    && !limited
                    && !matches!(status.as_u16(), 408 | 425 | 429)
                {
                    Undelivered::Refused(format!("refused with {status}"))
                } else {
                    Undelivered::Failed(format!("answered {status}"))
                },
            );
        }
        let mut body = Vec::new();
        let mut r = r;
        while let Some(chunk) = r
            .chunk()
            .await
            .map_err(|e| Undelivered::Failed(e.without_url().to_string()))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > 8 << 20 {
                return Err(Undelivered::Failed(
                    "the host's answer is over 8 MiB".into(),
                ));
            }
        }
        Ok(serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    async fn post(
        &self,
        url: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<(), Undelivered> {
        let mut req = self
            .http
            .post(url)
            .header("Content-Type", "application/json")
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            // a refusal will not change on retry (but a rate limit or a timeout may)
            Ok(r)
                if r.status().is_client_error()
                    && !matches!(r.status().as_u16(), 408 | 425 | 429) =>
            {
                Err(Undelivered::Refused(format!("refused with {}", r.status())))
            }
            Ok(r) => Err(Undelivered::Failed(format!("answered {}", r.status()))),
            // the URL may carry credentials: not in the log
            Err(e) => Err(Undelivered::Failed(e.without_url().to_string())),
        }
    }
}
