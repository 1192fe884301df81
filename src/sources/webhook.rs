//! Incoming webhooks: which git host sent it, is it signed with the source's secret, which
//! delivery is it, and what does it hint at. Verification is over the raw body bytes, before
//! any parsing, in constant time. A webhook is only a hint: the server fetches and resolves
//! the branch itself; the payload decides nothing but "look now".

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = hmac::Hmac<Sha256>;

/// Largest webhook body accepted (push payloads of big pushes are a few hundred KB).
pub const MAX_WEBHOOK_BODY: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    GitHub,
    Gitea,
    Forgejo,
    Gogs,
    GitLab,
    /// `X-Steward-Signature: sha256=<hex>` (also sent by hooks/post-receive)
    Generic,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::GitHub => "github",
            Provider::Gitea => "gitea",
            Provider::Forgejo => "forgejo",
            Provider::Gogs => "gogs",
            Provider::GitLab => "gitlab",
            Provider::Generic => "generic",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookError {
    #[error(
        "no signature: send X-Hub-Signature-256, X-Gitea-Signature, X-Forgejo-Signature, X-Gitlab-Token or X-Steward-Signature"
    )]
    Unsigned,
    #[error("the signature does not match this source's webhook secret")]
    BadSignature,
    #[error("this source has no webhook secret: webhooks are refused")]
    NoSecret,
}

/// A verified delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub provider: Provider,
    /// The sender's delivery id, or a digest of the body when it sends none.
    pub id: String,
    /// `push`, `ping`, … as the sender names it.
    pub event: Option<String>,
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

fn hmac_matches(secret: &str, body: &[u8], hex_sig: &str) -> bool {
    let Ok(expected) = hex::decode(hex_sig.trim()) else {
        return false;
    };
    let Ok(mut mac) = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes()) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

/// HMAC-SHA256 of `body` with `secret`, hex (for outbound webhooks and tests).
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// Check a delivery against the source's secret. `header` looks a request header up
/// (case-insensitively).
pub fn verify(
    header: impl Fn(&str) -> Option<String>,
    body: &[u8],
    secret: Option<&str>,
) -> Result<Delivery, WebhookError> {
    let secret = secret
        .filter(|s| !s.is_empty())
        .ok_or(WebhookError::NoSecret)?;
    // the first signature header present decides; Gitea sends several equal ones
    let signed: [(&str, Provider, Option<&str>); 5] = [
        ("x-forgejo-signature", Provider::Forgejo, None),
        ("x-gitea-signature", Provider::Gitea, None),
        ("x-gogs-signature", Provider::Gogs, None),
        ("x-hub-signature-256", Provider::GitHub, Some("sha256=")),
        ("x-steward-signature", Provider::Generic, Some("sha256=")),
    ];
    let mut provider = None;
    for (name, p, prefix) in signed {
        if let Some(v) = header(name) {
            let hex_sig = match prefix {
                Some(pre) => v
                    .strip_prefix(pre)
                    .ok_or(WebhookError::BadSignature)?
                    .to_string(),
                None => v,
            };
            if !hmac_matches(secret, body, &hex_sig) {
                return Err(WebhookError::BadSignature);
            }
            provider = Some(p);
            break;
        }
    }
    if provider.is_none()
        && let Some(token) = header("x-gitlab-token")
    {
        // GitLab sends the secret itself; compare digests of equal length in constant time,
        // so neither where they differ nor the secret's length shows in the time taken
        if !bool::from(sha256(token.as_bytes()).ct_eq(&sha256(secret.as_bytes()))) {
            return Err(WebhookError::BadSignature);
        }
        provider = Some(Provider::GitLab);
    }
    let provider = provider.ok_or(WebhookError::Unsigned)?;
    let id = [
        "x-forgejo-delivery",
        "x-gitea-delivery",
        "x-gogs-delivery",
        "x-github-delivery",
        "x-gitlab-event-uuid",
        "x-steward-delivery",
    ]
    .iter()
    .find_map(|h| header(h))
    .unwrap_or_else(|| format!("body-{}", hex::encode(Sha256::digest(body))));
    let event = [
        "x-forgejo-event",
        "x-gitea-event",
        "x-gogs-event",
        "x-github-event",
        "x-gitlab-event",
        "x-steward-event",
    ]
    .iter()
    .find_map(|h| header(h))
    .map(|e| e.to_lowercase());
    Ok(Delivery {
        provider,
        id,
        event,
    })
}

/// What a push payload says, as far as we look at it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushHint {
    /// The branch pushed to (`refs/heads/<branch>` in the payload).
    pub branch: Option<String>,
    /// The new tip it claims (checked against the fetched branch, never trusted).
    pub after: Option<String>,
}

pub fn push_hint(body: &[u8]) -> PushHint {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return PushHint::default();
    };
    PushHint {
        branch: v["ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("refs/heads/"))
            .map(str::to_string),
        after: v["after"]
            .as_str()
            .or(v["checkout_sha"].as_str())
            .map(str::to_string),
    }
}

/// Is this event one that can move a branch (a ping, an issue comment… is not)?
pub fn is_push(d: &Delivery) -> bool {
    match d.event.as_deref() {
        None => true,
        Some(e) => e == "push" || e == "push hook" || e.starts_with("push"),
    }
}

/// What a `pull_request` event asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullAction {
    /// opened, reopened, ready for review
    Open,
    /// new commits (GitHub `synchronize`, Gitea `synchronized`)
    Push,
    /// the title or the base branch may have changed
    Edited,
    Closed {
        merged: bool,
    },
}

/// A `pull_request` event, from GitHub or Gitea/Forgejo (the same fields in both). Only a
/// hint: the server fetches the pull request's refs itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullHint {
    pub action: PullAction,
    pub number: u64,
    pub base_ref: String,
    /// `owner/name` of the base repository.
    pub base_repo: String,
    pub head_sha: String,
    /// `owner/name` of the head repository; none when the fork was deleted.
    pub head_repo: Option<String>,
    /// Shown only, never trusted.
    pub title: String,
    pub html_url: Option<String>,
    pub author: Option<String>,
}

impl PullHint {
    /// From another repository than the base (or one that was deleted).
    pub fn is_fork(&self) -> bool {
        self.head_repo
            .as_deref()
            .is_none_or(|h| !h.eq_ignore_ascii_case(&self.base_repo))
    }
}

/// Is this a pull-request event?
pub fn is_pull_request(d: &Delivery) -> bool {
    d.event.as_deref() == Some("pull_request")
}

fn bounded(v: &serde_json::Value, max: usize) -> Option<String> {
    v.as_str()
        .filter(|s| !s.is_empty())
        .map(|s| s.chars().take(max).collect())
}

/// The hint of a `pull_request` body, or why it is none.
pub fn pull_hint(body: &[u8]) -> Result<PullHint, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let pr = &v["pull_request"];
    let action = match v["action"].as_str().unwrap_or_default() {
        "opened" | "reopened" | "ready_for_review" => PullAction::Open,
        "synchronize" | "synchronized" => PullAction::Push,
        "edited" => PullAction::Edited,
        "closed" => PullAction::Closed {
            merged: pr["merged"].as_bool().unwrap_or(false),
        },
        other => return Err(format!("action '{other}' changes nothing to preview")),
    };
    let number = v["number"]
        .as_u64()
        .or(pr["number"].as_u64())
        .filter(|n| *n > 0 && *n <= i32::MAX as u64)
        .ok_or("no pull request number")?;
    let base_ref = bounded(&pr["base"]["ref"], 255).ok_or("no base.ref")?;
    let head_sha = bounded(&pr["head"]["sha"], 64)
        .filter(|s| s.len() >= 40 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or("no head.sha (a commit id)")?;
    let base_repo = bounded(&pr["base"]["repo"]["full_name"], 255)
        .or_else(|| bounded(&v["repository"]["full_name"], 255))
        .ok_or("no base.repo.full_name")?;
    Ok(PullHint {
        action,
        number,
        base_ref: base_ref
            .strip_prefix("refs/heads/")
            .map(str::to_string)
            .unwrap_or(base_ref),
        base_repo,
        head_sha: head_sha.to_ascii_lowercase(),
        head_repo: bounded(&pr["head"]["repo"]["full_name"], 255),
        title: bounded(&pr["title"], 256).unwrap_or_default(),
        html_url: bounded(&pr["html_url"], 1024),
        author: bounded(&pr["user"]["login"], 255),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pr_body(action: &str, head_repo: serde_json::Value, merged: bool) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "action": action, "number": 7,
            "pull_request": {"number": 7, "title": "Bigger disks", "merged": merged,
                "html_url": "https://example.com/o/r/pull/7", "user": {"login": "ann"},
                "base": {"ref": "main", "repo": {"full_name": "Org/Site"}},
                "head": {"ref": "disks", "sha": "a".repeat(40), "repo": head_repo}},
            "repository": {"full_name": "Org/Site"}
        }))
        .unwrap()
    }

    #[test]
    fn pull_hints_of_both_hosts_forks_and_actions() {
        let same = serde_json::json!({"full_name": "org/site"});
        let h = pull_hint(&pr_body("synchronize", same.clone(), false)).unwrap();
        assert_eq!(h.action, PullAction::Push);
        assert_eq!((h.number, h.base_ref.as_str()), (7, "main"));
        assert!(!h.is_fork(), "the same repository, another case");
        // Gitea says synchronized
        let h = pull_hint(&pr_body("synchronized", same.clone(), false)).unwrap();
        assert_eq!(h.action, PullAction::Push);
        let h = pull_hint(&pr_body("closed", same.clone(), true)).unwrap();
        assert_eq!(h.action, PullAction::Closed { merged: true });
        let fork = pull_hint(&pr_body(
            "opened",
            serde_json::json!({"full_name": "eve/site"}),
            false,
        ))
        .unwrap();
        assert!(fork.is_fork());
        let deleted = pull_hint(&pr_body("opened", serde_json::Value::Null, false)).unwrap();
        assert!(deleted.is_fork(), "a deleted fork is a fork");
        assert!(pull_hint(&pr_body("labeled", same, false)).is_err());
        assert!(pull_hint(b"{\"action\": \"opened\"}").is_err());
    }

    fn headers<'a>(list: &'a [(&'a str, String)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            list.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn github_signature() {
        let body = br#"{"ref":"refs/heads/main","after":"abc"}"#;
        let sig = format!("sha256={}", sign("s3cret", body));
        let h = [
            ("X-Hub-Signature-256", sig),
            ("X-GitHub-Delivery", "d-1".to_string()),
            ("X-GitHub-Event", "push".into()),
        ];
        let d = verify(headers(&h), body, Some("s3cret")).unwrap();
        assert_eq!(d.provider, Provider::GitHub);
        assert_eq!(d.id, "d-1");
        assert!(is_push(&d));
        assert_eq!(
            verify(headers(&h), body, Some("other")),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(
            verify(headers(&h), b"tampered", Some("s3cret")),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(verify(headers(&h), body, None), Err(WebhookError::NoSecret));
        assert_eq!(
            push_hint(body),
            PushHint {
                branch: Some("main".into()),
                after: Some("abc".into())
            }
        );
    }

    #[test]
    fn gitea_forgejo_gitlab_generic() {
        let body = b"{}";
        let hexsig = sign("k", body);
        let d = verify(
            headers(&[
                ("X-Gitea-Signature", hexsig.clone()),
                ("X-Gitea-Delivery", "g".into()),
            ]),
            body,
            Some("k"),
        )
        .unwrap();
        assert_eq!((d.provider, d.id.as_str()), (Provider::Gitea, "g"));
        let d = verify(
            headers(&[("X-Forgejo-Signature", hexsig.clone())]),
            body,
            Some("k"),
        )
        .unwrap();
        assert_eq!(d.provider, Provider::Forgejo);
        assert!(d.id.starts_with("body-"));
        let d = verify(
            headers(&[
                ("X-Gitlab-Token", "k".into()),
                ("X-Gitlab-Event", "Push Hook".into()),
            ]),
            body,
            Some("k"),
        )
        .unwrap();
        assert_eq!(d.provider, Provider::GitLab);
        assert!(is_push(&d));
        assert_eq!(
            verify(headers(&[("X-Gitlab-Token", "K".into())]), body, Some("k")),
            Err(WebhookError::BadSignature)
        );
        let d = verify(
            headers(&[("X-Steward-Signature", format!("sha256={hexsig}"))]),
            body,
            Some("k"),
        )
        .unwrap();
        assert_eq!(d.provider, Provider::Generic);
        assert_eq!(
            verify(headers(&[]), body, Some("k")),
            Err(WebhookError::Unsigned)
        );
        let ping = verify(
            headers(&[
                ("X-Gitea-Signature", hexsig),
                ("X-Gitea-Event", "ping".into()),
            ]),
            body,
            Some("k"),
        )
        .unwrap();
        assert!(!is_push(&ping));
    }
}
