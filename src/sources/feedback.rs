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

/// Where a commit status goes, if the source asks for one.
fn status_url(src: &SourceRow, commit: &str) -> Option<String> {
    let repo = src.status_repo.as_deref()?.trim_matches('/');
    match src.status_kind.as_str() {
        "github" => {
            let api = src
                .status_api_url
                .as_deref()
                .unwrap_or("https://api.github.com")
                .trim_end_matches('/');
            Some(format!("{api}/repos/{repo}/statuses/{commit}"))
        }
        "gitea" => {
            let base = src.status_api_url.as_deref()?.trim_end_matches('/');
            let api = if base.ends_with("/api/v1") {
                base.to_string()
            } else {
                format!("{base}/api/v1")
            };
            Some(format!("{api}/repos/{repo}/statuses/{commit}"))
        }
        _ => None,
    }
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
        let what = if row.kind == "status" {
            "commit status"
        } else {
            "notification webhook"
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
                let auth = match (src.status_kind.as_str(), &src.status_token) {
                    ("github", Some(t)) => format!("Bearer {t}"),
                    ("gitea", Some(t)) => format!("token {t}"),
                    _ => {
                        return Err(Undelivered::Refused(
                            "the source has no status token any more".into(),
                        ));
                    }
                };
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
