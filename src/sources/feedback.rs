//! Telling the outside what happened to a commit: a commit status on the git host (GitHub or
//! Gitea/Forgejo status API, with the source's token) and an HMAC-signed webhook to the
//! environment's notification URL. Best effort: a few retries, then a warning in the log;
//! the pipeline never waits on them.

use std::time::Duration;

use serde_json::{Value, json};

use crate::store::sources::SourceRow;

/// Commit status states common to GitHub and Gitea.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Pending,
    Success,
    Failure,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
        }
    }
}

#[derive(Clone)]
pub struct Feedback {
    http: reqwest::Client,
}

impl Default for Feedback {
    fn default() -> Self {
        Feedback {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .user_agent(concat!("steward/", env!("CARGO_PKG_VERSION")))
                .build()
                .expect("http client"),
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

impl Feedback {
    /// Post a commit status (`context` e.g. "steward/compile") in the background.
    pub fn commit_status(
        &self,
        src: &SourceRow,
        commit: &str,
        context: &str,
        state: State,
        description: &str,
    ) {
        let Some(url) = status_url(src, commit) else {
            return;
        };
        let auth = match (src.status_kind.as_str(), &src.status_token) {
            ("github", Some(t)) => format!("Bearer {t}"),
            ("gitea", Some(t)) => format!("token {t}"),
            _ => return,
        };
        // descriptions are capped at 140 characters by GitHub
        let description: String = description.chars().take(140).collect();
        let body = json!({"state": state.as_str(), "context": context, "description": description});
        let http = self.http.clone();
        tokio::spawn(async move {
            send_with_retries(
                &http,
                &url,
                &body,
                &[
                    ("Authorization", auth.as_str()),
                    ("Accept", "application/json"),
                ],
                "commit status",
            )
            .await;
        });
    }

    /// Post a signed pipeline event to the environment's notification URL in the background.
    pub fn notify(&self, src: &SourceRow, event: &str, mut payload: Value) {
        let Some(url) = src.notify_url.clone() else {
            return;
        };
        payload["event"] = json!(event);
        payload["environment"] = json!(src.environment_id);
        payload["at"] = json!(chrono::Utc::now());
        let secret = src.notify_secret.clone();
        let event = event.to_string();
        let http = self.http.clone();
        tokio::spawn(async move {
            let body = serde_json::to_vec(&payload).expect("json");
            let delivery = uuid::Uuid::new_v4().to_string();
            let signature = secret.map(|s| format!("sha256={}", super::webhook::sign(&s, &body)));
            let mut headers = vec![
                ("X-Steward-Event", event.as_str()),
                ("X-Steward-Delivery", delivery.as_str()),
            ];
            if let Some(sig) = &signature {
                headers.push(("X-Steward-Signature", sig.as_str()));
            }
            send_raw_with_retries(&http, &url, body, &headers, "notification webhook").await;
        });
    }
}

async fn send_with_retries(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
    what: &str,
) {
    send_raw_with_retries(
        http,
        url,
        serde_json::to_vec(body).expect("json"),
        headers,
        what,
    )
    .await
}

async fn send_raw_with_retries(
    http: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
    what: &str,
) {
    let mut delay = Duration::from_millis(500);
    for attempt in 1..=3 {
        let mut req = http
            .post(url)
            .header("Content-Type", "application/json")
            .body(body.clone());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => return,
            Ok(r) if r.status().is_client_error() => {
                // a refusal will not change on retry
                tracing::warn!(%url, status = %r.status(), "{what} refused");
                return;
            }
            Ok(r) => tracing::warn!(%url, status = %r.status(), attempt, "{what} failed"),
            Err(e) => tracing::warn!(%url, error = %e, attempt, "{what} failed"),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
}
