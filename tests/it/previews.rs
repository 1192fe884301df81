//! Pull-request previews (issue 30) end to end: real repositories with pull requests pushed
//! to `refs/pull/N/*`, signed `pull_request` webhooks, real `steward compile`, and a local
//! stand-in of the GitHub and Gitea APIs that records statuses and keeps comments.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use serde_json::{Value, json};

use crate::gitops_support::{Repo, compiled, follow, git_ok, webhook_url};
use crate::support::{TestServer, eventually, wait_deployed};

/// A stand-in git host: statuses recorded, comments kept (create, list, edit), and the next
/// calls failed with 502 on demand.
#[derive(Clone, Default)]
pub struct Host {
    pub calls: Arc<Mutex<Vec<(Method, String, Value)>>>,
    pub comments: Arc<Mutex<BTreeMap<i64, String>>>,
    pub fail_next: Arc<Mutex<u32>>,
    /// What `GET …/pulls/{n}` answers.
    pub pulls: Arc<Mutex<BTreeMap<u64, Value>>>,
}

impl Host {
    pub async fn start() -> (String, Host) {
        let h = Host::default();
        let app = Router::new()
            .route("/{*path}", any(serve))
            .with_state(h.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        (url, h)
    }

    /// The statuses posted for `commit`: (context, state, description).
    pub fn statuses(&self, commit: &str) -> Vec<(String, String, String)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, p, _)| *m == Method::POST && p.ends_with(&format!("/statuses/{commit}")))
            .map(|(_, _, v)| {
                (
                    v["context"].as_str().unwrap_or("").into(),
                    v["state"].as_str().unwrap_or("").into(),
                    v["description"].as_str().unwrap_or("").into(),
                )
            })
            .collect()
    }

    /// The last status of `context` on `commit`.
    pub fn last_status(&self, commit: &str, context: &str) -> Option<(String, String)> {
        self.statuses(commit)
            .into_iter()
            .rev()
            .find(|(c, _, _)| c == context)
            .map(|(_, s, d)| (s, d))
    }

    pub fn count(&self, method: Method, part: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, p, _)| *m == method && p.contains(part))
            .count()
    }

    /// The only comment (panics if there are several).
    pub fn comment(&self) -> Option<String> {
        let c = self.comments.lock().unwrap();
        assert!(c.len() <= 1, "more than one comment: {c:#?}");
        c.values().next().cloned()
    }
}

async fn serve(
    State(h): State<Host>,
    method: Method,
    Path(path): Path<String>,
    body: Bytes,
) -> axum::response::Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = format!("/{path}");
    h.calls
        .lock()
        .unwrap()
        .push((method.clone(), path.clone(), v.clone()));
    {
        let mut f = h.fail_next.lock().unwrap();
        if *f > 0 {
            *f -= 1;
            return (StatusCode::BAD_GATEWAY, "try again").into_response();
        }
    }
    let parts: Vec<&str> = path.split('/').collect();
    if let [.., "pulls", n] = parts.as_slice()
        && method == Method::GET
    {
        let found = n
            .parse::<u64>()
            .ok()
            .and_then(|n| h.pulls.lock().unwrap().get(&n).cloned());
        return match found {
            Some(v) => axum::Json(v).into_response(),
            None => (StatusCode::NOT_FOUND, "no such pull request").into_response(),
        };
    }
    let mut comments = h.comments.lock().unwrap();
    if path.contains("/statuses/") && method == Method::POST {
        return (StatusCode::CREATED, axum::Json(json!({}))).into_response();
    }
    // …/issues/comments/{id}
    if let Some(i) = parts.iter().position(|p| *p == "comments")
        && i >= 1
        && parts[i - 1] == "issues"
        && let Some(id) = parts.get(i + 1).and_then(|s| s.parse::<i64>().ok())
    {
        return match (method, comments.get_mut(&id)) {
            (Method::PATCH, Some(c)) => {
                *c = v["body"].as_str().unwrap_or("").to_string();
                axum::Json(json!({"id": id, "body": c})).into_response()
            }
            _ => (StatusCode::NOT_FOUND, "no such comment").into_response(),
        };
    }
    // …/issues/{n}/comments
    if path.contains("/issues/") && parts.last() == Some(&"comments") {
        if method == Method::POST {
            let id = comments.keys().max().copied().unwrap_or(1000) + 1;
            comments.insert(id, v["body"].as_str().unwrap_or("").to_string());
            return (StatusCode::CREATED, axum::Json(json!({"id": id}))).into_response();
        }
        let list: Vec<Value> = comments
            .iter()
            .map(|(id, b)| json!({"id": id, "body": b}))
            .collect();
        return axum::Json(json!(list)).into_response();
    }
    if path.contains("/issues/") && path.contains("/comments?") {
        return axum::Json(json!([])).into_response();
    }
    (StatusCode::NOT_FOUND, "not here").into_response()
}

/// A signed `pull_request` event as GitHub (or Gitea, `gitea: true`) sends it.
#[allow(clippy::too_many_arguments)]
pub async fn pull_request_event(
    server: &str,
    env: &str,
    secret: &str,
    gitea: bool,
    action: &str,
    number: u64,
    head: &str,
    head_repo: &str,
    merged: bool,
) -> Value {
    let body = serde_json::to_vec(&json!({
        "action": action, "number": number,
        "pull_request": {"number": number, "title": "Bigger files", "merged": merged,
            "html_url": format!("https://host/org/site/pull/{number}"), "user": {"login": "ann"},
            "base": {"ref": "main", "repo": {"full_name": "org/site"}},
            "head": {"ref": "change", "sha": head, "repo": {"full_name": head_repo}}},
        "repository": {"full_name": "org/site"},
    }))
    .unwrap();
    let sig = steward::sources::webhook::sign(secret, &body);
    let delivery = format!("{action}-{head}-{}", rand_id());
    let req = reqwest::Client::new()
        .post(webhook_url(server, env))
        .header("Content-Type", "application/json");
    let req = if gitea {
        req.header("X-Gitea-Event", "pull_request")
            .header("X-Gitea-Delivery", delivery)
            .header("X-Gitea-Signature", sig)
    } else {
        req.header("X-GitHub-Event", "pull_request")
            .header("X-GitHub-Delivery", delivery)
            .header("X-Hub-Signature-256", format!("sha256={sig}"))
    };
    let r = req.body(body).send().await.unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{status}: {v}");
    v
}

fn rand_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Push the work tree's HEAD to the pull request's head ref.
fn push_pull(repo: &Repo, number: u64) {
    git_ok(
        &repo.work,
        &[
            "push",
            "-q",
            "-f",
            "origin",
            &format!("HEAD:refs/pull/{number}/head"),
        ],
    );
}

/// The newest run of the preview of pull request `number`, once it is finished.
async fn finished(c: &steward::client::Client, env: &str, number: u64, head: &str) -> Value {
    eventually(120, &format!("a finished preview of {head}"), || async {
        let p = c.preview(env, &number.to_string()).await.ok()?;
        let run = &p["run"];
        (run["head"] == head && (run["status"] == "success" || run["status"] == "failed"))
            .then_some(p)
    })
    .await
}

async fn git_env(
    c: &steward::client::Client,
    name: &str,
    repo: &Repo,
    host: &str,
    kind: &str,
) -> String {
    let env = follow(
        c,
        name,
        repo,
        json!({"status": {"kind": kind, "api_url": host, "repo": "org/site", "token": "host-token"}}),
    )
    .await;
    c.update_settings(&env, &json!({"previews": {"enabled": true}}))
        .await
        .unwrap();
    env
}

/// Open a pull request changing two resources (comment "+0 ~2 −0" with both attribute
/// changes, status success, no new version); push again (the same comment edited); push a
/// broken commit (failure with its line); merge (the branch deploys as usual, the preview is
/// closed and the comment says so).
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_is_previewed_pushed_to_broken_and_merged() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (host_url, host) = Host::start().await;
    let repo = Repo::new();
    let main = repo.commit(
        &repo.model(&[("a", "one"), ("b", "two"), ("c", "three")], ""),
        "main",
    );
    repo.push_ok();
    let env = git_env(&c, "previewed", &repo, &host_url, "github").await;
    let v = compiled(&c, &env, &main, 60).await["version"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&c, &env, v, 60).await;
    let versions_before = c.versions(&env).await.unwrap().len();
    let context = "steward/preview: previewed";

    // the pull request: two files change
    git_ok(&repo.work, &["checkout", "-q", "-b", "change"]);
    let head1 = repo.commit(
        &repo.model(&[("a", "ONE"), ("b", "TWO"), ("c", "three")], ""),
        "bigger",
    );
    push_pull(&repo, 1);
    // GitHub's test merge, as the host computes it
    git_ok(&repo.work, &["checkout", "-q", "main"]);
    git_ok(
        &repo.work,
        &["merge", "-q", "--no-ff", "-m", "test merge", "change"],
    );
    git_ok(
        &repo.work,
        &["push", "-q", "-f", "origin", "HEAD:refs/pull/1/merge"],
    );
    git_ok(&repo.work, &["reset", "-q", "--hard", &main]);
    git_ok(&repo.work, &["checkout", "-q", "change"]);
    let a = pull_request_event(
        &srv.url, &env, "s3cret", false, "opened", 1, &head1, "org/site", false,
    )
    .await;
    assert_eq!(a["status"], "accepted", "{a}");
    let p = finished(&c, &env, 1, &head1).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");
    assert_eq!(p["run"]["merge_source"], "host", "{p:#}");
    assert_eq!(p["run"]["diff_base"], v);
    let changes = p["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2, "{p:#}");
    for ch in changes {
        assert_eq!(ch["change"], "updated");
        let content = &ch["attributes"]["content"];
        assert!(
            (content["current"] == "one" && content["desired"] == "ONE")
                || (content["current"] == "two" && content["desired"] == "TWO"),
            "{ch}"
        );
    }
    let body = eventually(30, "the comment", || async {
        host.comment()
            .filter(|b| b.contains(&head1[..7]) && b.contains("+0 ~2 −0"))
    })
    .await;
    assert!(
        body.contains("`one` → `ONE`") && body.contains("`two` → `TWO`"),
        "{body}"
    );
    assert!(body.contains("against active version"), "{body}");
    let st = eventually(30, "the success status", || async {
        host.last_status(&head1, context)
            .filter(|(s, _)| s == "success")
    })
    .await;
    assert!(st.1.contains("+0 ~2 −0"), "{st:?}");
    assert_eq!(
        c.versions(&env).await.unwrap().len(),
        versions_before,
        "a preview made a version"
    );

    // a second push: the same comment, edited
    let head2 = repo.commit(
        &repo.model(&[("a", "ONE"), ("b", "TWO"), ("c", "THREE")], ""),
        "more",
    );
    push_pull(&repo, 1);
    pull_request_event(
        &srv.url,
        &env,
        "s3cret",
        false,
        "synchronize",
        1,
        &head2,
        "org/site",
        false,
    )
    .await;
    let p = finished(&c, &env, 1, &head2).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");
    // the host's merge is of the first head: stale, so Steward merged
    assert_eq!(p["run"]["merge_source"], "steward", "{p:#}");
    eventually(30, "the comment edited for the second head", || async {
        host.comment()
            .filter(|b| b.contains(&head2[..7]) && b.contains("+0 ~3 −0"))
    })
    .await;
    assert_eq!(
        host.count(Method::POST, "/issues/1/comments"),
        1,
        "one comment made"
    );
    assert!(host.count(Method::PATCH, "/issues/comments/") >= 1);
    eventually(30, "the second success status", || async {
        host.last_status(&head2, context)
            .filter(|(s, _)| s == "success")
    })
    .await;

    // a broken commit: failure, with its line
    let broken = repo.model(&[("a", "ONE")], "x = std::Nope(a=1)\n");
    let head3 = repo.commit(&broken, "broken");
    push_pull(&repo, 1);
    pull_request_event(
        &srv.url,
        &env,
        "s3cret",
        false,
        "synchronize",
        1,
        &head3,
        "org/site",
        false,
    )
    .await;
    let p = finished(&c, &env, 1, &head3).await;
    assert_eq!(p["run"]["status"], "failed", "{p:#}");
    let st = eventually(30, "the failure status", || async {
        host.last_status(&head3, context)
            .filter(|(s, _)| s == "failure")
    })
    .await;
    assert!(st.1.contains("main.cf:"), "{st:?}");
    let body = eventually(30, "the comment with the diagnostic", || async {
        host.comment()
            .filter(|b| b.contains(&head3[..7]) && b.contains("main.cf:"))
    })
    .await;
    assert!(
        body.contains("std::Nope("),
        "the source line: {body}\n{p:#}"
    );
    assert_eq!(c.versions(&env).await.unwrap().len(), versions_before);

    // merged: the fixed branch lands on main and deploys; the preview is closed
    let fixed = repo.commit(
        &repo.model(&[("a", "ONE"), ("b", "TWO"), ("c", "THREE")], ""),
        "fixed",
    );
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    pull_request_event(
        &srv.url, &env, "s3cret", false, "closed", 1, &fixed, "org/site", true,
    )
    .await;
    let v2 = compiled(&c, &env, &fixed, 60).await["version"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&c, &env, v2, 60).await;
    assert_eq!(
        std::fs::read_to_string(repo.out.join("c")).unwrap(),
        "THREE"
    );
    let p = c.preview(&env, "1").await.unwrap();
    assert_eq!(p["preview"]["state"], "merged", "{p:#}");
    eventually(30, "the comment saying merged", || async {
        host.comment().filter(|b| b.contains("closed (merged)"))
    })
    .await;
    assert_eq!(
        host.count(Method::POST, "/issues/1/comments"),
        1,
        "still one comment"
    );
    // no route releases a preview
    let id = p["preview"]["id"].as_str().unwrap();
    let r = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/environments/{env}/previews/{id}/release",
            srv.url
        ))
        .bearer_auth(srv.admin.as_deref().unwrap())
        .send()
        .await
        .unwrap();
    assert!(r.status() == 404 || r.status() == 405, "{}", r.status());
}

/// Gitea has no merge ref: Steward makes the merge (parents: base, head); comment delivery
/// survives the host failing and the comment being deleted, and never makes two.
#[tokio::test(flavor = "multi_thread")]
async fn gitea_pull_requests_are_previewed_from_a_merge_steward_makes() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (host_url, host) = Host::start().await;
    let repo = Repo::new();
    let main = repo.commit(&repo.model(&[("a", "one")], ""), "main");
    repo.push_ok();
    let env = git_env(&c, "gitea", &repo, &host_url, "gitea").await;
    compiled(&c, &env, &main, 60).await;
    git_ok(&repo.work, &["checkout", "-q", "-b", "change"]);
    let head = repo.commit(&repo.model(&[("a", "one"), ("n", "new")], ""), "add");
    push_pull(&repo, 4);
    *host.fail_next.lock().unwrap() = 2;
    pull_request_event(
        &srv.url,
        &env,
        "s3cret",
        true,
        "synchronized",
        4,
        &head,
        "org/site",
        false,
    )
    .await;
    let p = finished(&c, &env, 4, &head).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");
    assert_eq!(p["run"]["merge_source"], "steward");
    let merge = p["run"]["merge"].as_str().unwrap();
    assert_eq!(p["changes"][0]["change"], "new", "{p:#}");
    // the merge is in the server's mirror, not the origin: check its parents there
    let mirror = srv
        .sources
        .as_ref()
        .unwrap()
        .mirror_of(env.parse().unwrap(), &repo.url());
    let parents = git_ok(
        &mirror,
        &[
            "--git-dir",
            mirror.to_str().unwrap(),
            "log",
            "-1",
            "--format=%P",
            merge,
        ],
    );
    assert_eq!(parents.trim(), format!("{main} {head}"));
    let body = eventually(60, "the comment, after the host failed twice", || async {
        host.comment().filter(|b| b.contains("+1 ~0 −0"))
    })
    .await;
    assert!(body.contains("gitea"), "{body}");
    assert!(host.count(Method::POST, "/api/v1/repos/org/site/issues/4/comments") >= 1);
    // deleted on the host: made again, once
    host.comments.lock().unwrap().clear();
    let head2 = repo.commit(&repo.model(&[("a", "two"), ("n", "new")], ""), "again");
    push_pull(&repo, 4);
    pull_request_event(
        &srv.url,
        &env,
        "s3cret",
        true,
        "synchronized",
        4,
        &head2,
        "org/site",
        false,
    )
    .await;
    eventually(60, "the comment made again", || async {
        host.comment().filter(|b| b.contains(&head2[..7]))
    })
    .await;
    assert_eq!(host.comments.lock().unwrap().len(), 1);
}

/// Fork pull requests run nothing unless enabled; another branch's or repository's pull
/// requests are ignored.
#[tokio::test(flavor = "multi_thread")]
async fn fork_pull_requests_run_nothing_by_default() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (host_url, host) = Host::start().await;
    let repo = Repo::new();
    let main = repo.commit(&repo.model(&[("a", "one")], ""), "main");
    repo.push_ok();
    let env = git_env(&c, "forks", &repo, &host_url, "github").await;
    compiled(&c, &env, &main, 60).await;
    git_ok(&repo.work, &["checkout", "-q", "-b", "change"]);
    let head = repo.commit(&repo.model(&[("a", "evil")], ""), "fork");
    push_pull(&repo, 9);
    let a = pull_request_event(
        &srv.url, &env, "s3cret", false, "opened", 9, &head, "eve/site", false,
    )
    .await;
    assert_eq!(a["status"], "accepted");
    let p = c.preview(&env, "9").await.unwrap();
    assert_eq!(p["run"]["status"], "skipped", "{p:#}");
    assert!(p["preview"]["fork"].as_bool().unwrap());
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(host.statuses(&head).is_empty(), "a fork got a status");
    assert!(host.comment().is_none(), "a fork got a comment");
    assert!(p["run"]["merge"].is_null());

    // enabled: it runs
    c.update_settings(&env, &json!({"previews": {"forks": true}}))
        .await
        .unwrap();
    pull_request_event(
        &srv.url, &env, "s3cret", false, "reopened", 9, &head, "eve/site", false,
    )
    .await;
    let p = finished(&c, &env, 9, &head).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");

    // another branch, another repository: ignored
    let body = serde_json::to_vec(&json!({"action": "opened", "number": 3,
        "pull_request": {"number": 3, "base": {"ref": "dev", "repo": {"full_name": "org/site"}},
            "head": {"sha": head, "repo": {"full_name": "org/site"}}}}))
    .unwrap();
    let sig = steward::sources::webhook::sign("s3cret", &body);
    let r: Value = reqwest::Client::new()
        .post(webhook_url(&srv.url, &env))
        .header("X-GitHub-Event", "pull_request")
        .header("X-Hub-Signature-256", format!("sha256={sig}"))
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["status"], "ignored", "{r}");
    assert!(r["reason"].as_str().unwrap().contains("dev"), "{r}");
    let body = serde_json::to_vec(&json!({"action": "opened", "number": 6,
        "pull_request": {"number": 6, "base": {"ref": "main", "repo": {"full_name": "eve/other"}},
            "head": {"sha": head, "repo": {"full_name": "eve/other"}}}}))
    .unwrap();
    let sig = steward::sources::webhook::sign("s3cret", &body);
    let r: Value = reqwest::Client::new()
        .post(webhook_url(&srv.url, &env))
        .header("X-GitHub-Event", "pull_request")
        .header("X-Hub-Signature-256", format!("sha256={sig}"))
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["status"], "ignored", "{r}");
    // a bad signature is a 401
    let r = reqwest::Client::new()
        .post(webhook_url(&srv.url, &env))
        .header("X-GitHub-Event", "pull_request")
        .header("X-Hub-Signature-256", "sha256=00")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

/// `steward preview run --wait`, `list` and `show` against a server.
#[tokio::test(flavor = "multi_thread")]
async fn steward_preview_run_list_and_show_by_hand() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (host_url, _host) = Host::start().await;
    let repo = Repo::new();
    let main = repo.commit(&repo.model(&[("a", "one")], ""), "main");
    repo.push_ok();
    let env = git_env(&c, "byhand", &repo, &host_url, "github").await;
    compiled(&c, &env, &main, 60).await;
    git_ok(&repo.work, &["checkout", "-q", "-b", "feature"]);
    repo.commit(&repo.model(&[("a", "two")], ""), "feature");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:feature"]);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .arg(args[0])
            .args([
                "--server",
                &srv.url,
                "--token",
                srv.admin.as_deref().unwrap(),
                "--env",
                &env,
            ])
            .args(&args[1..])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(&["preview", "run", "--ref", "refs/heads/feature", "--wait"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("+0 ~1 −0") && out.contains("\"one\" -> \"two\""),
        "{out}"
    );
    let (ok, out) = cli(&["preview", "list"]);
    assert!(
        ok && out.contains("refs/heads/feature") && out.contains("success"),
        "{out}"
    );
    let (ok, out) = cli(&["preview", "run", "--ref", "refs/heads/nope"]);
    assert!(!ok && out.contains("nope"), "{out}");
}

/// What `GET pulls/{n}` answers for an open (or closed) pull request of org/site to main.
fn pull(number: u64, head: &str, state: &str, merged: bool) -> Value {
    json!({"number": number, "state": state, "merged": merged, "title": format!("pr {number}"),
        "base": {"ref": "main", "repo": {"full_name": "org/site"}},
        "head": {"sha": head, "repo": {"full_name": "org/site"}}})
}

/// A source without webhooks: the poll lists `refs/pull/*/head` and asks the host about new
/// heads. Pull requests there before the first poll are not previewed; a new one is; closed
/// on the host, its preview closes; while the host answers 502 the poll backs off.
#[tokio::test(flavor = "multi_thread")]
async fn polling_finds_pull_requests_without_webhooks() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (host_url, host) = Host::start().await;
    let repo = Repo::new();
    let main = repo.commit(&repo.model(&[("a", "one")], ""), "main");
    repo.push_ok();
    // a pull request from before
    git_ok(&repo.work, &["checkout", "-q", "-b", "old"]);
    let old = repo.commit(&repo.model(&[("a", "old")], ""), "old");
    push_pull(&repo, 1);
    host.pulls
        .lock()
        .unwrap()
        .insert(1, pull(1, &old, "open", false));
    let env = follow(
        &c,
        "polled",
        &repo,
        json!({"poll_interval": 1, "webhook_secret": null,
            "status": {"kind": "github", "api_url": host_url, "repo": "org/site", "token": "host-token"}}),
    )
    .await;
    c.update_settings(&env, &json!({"previews": {"enabled": true}}))
        .await
        .unwrap();
    compiled(&c, &env, &main, 60).await;
    // the first listing is the baseline
    let env_id: uuid::Uuid = env.parse().unwrap();
    eventually(30, "the first poll", || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pull_refs WHERE environment_id = $1")
            .bind(env_id)
            .fetch_one(&srv.pool)
            .await
            .ok()?;
        (n == 1).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        c.preview(&env, "1").await.is_err(),
        "a pull request from before the first poll was previewed"
    );

    // a new pull request: previewed from the poll
    git_ok(&repo.work, &["checkout", "-q", "-b", "new", &main]);
    let head = repo.commit(&repo.model(&[("a", "two")], ""), "new");
    host.pulls
        .lock()
        .unwrap()
        .insert(2, pull(2, &head, "open", false));
    push_pull(&repo, 2);
    let p = finished(&c, &env, 2, &head).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");
    assert_eq!(p["run"]["trigger"], "poll");
    assert_eq!(p["preview"]["title"], "pr 2");

    // the host fails for a while: the poll backs off (1, 2, 4, 8 s), not once a second
    let gets = || host.count(Method::GET, "/pulls/");
    // a moved head makes the poll ask
    let head2 = repo.commit(&repo.model(&[("a", "three")], ""), "moved");
    *host.fail_next.lock().unwrap() = 1000;
    let before = gets();
    push_pull(&repo, 2);
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let during = gets() - before;
    *host.fail_next.lock().unwrap() = 0;
    assert!(
        (2..=6).contains(&during),
        "{during} calls in 12 s while the host failed (backing off from 1 s: about 4)"
    );
    host.pulls
        .lock()
        .unwrap()
        .insert(2, pull(2, &head2, "open", false));
    let p = finished(&c, &env, 2, &head2).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");

    // closed on the host (no webhook): the preview closes
    host.pulls
        .lock()
        .unwrap()
        .insert(2, pull(2, &head2, "closed", false));
    eventually(30, "the preview closed by the poll", || async {
        let p = c.preview(&env, "2").await.ok()?;
        (p["preview"]["state"] == "closed").then_some(())
    })
    .await;
    assert!(c.preview(&env, "1").await.is_err());
}

/// With `previews.dry_run`, the resources a preview changes are dry-run on the agents with
/// the active version's handler code (changing nothing); a fork's preview never dry-runs.
#[tokio::test(flavor = "multi_thread")]
async fn an_enabled_dry_run_runs_the_active_handlers_and_never_for_forks() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (host_url, host) = Host::start().await;
    let repo = Repo::new();
    let main = repo.commit(&repo.model(&[("a", "one"), ("b", "two")], ""), "main");
    repo.push_ok();
    let env = git_env(&c, "dry", &repo, &host_url, "github").await;
    c.update_settings(&env, &json!({"previews": {"dry_run": true, "forks": true}}))
        .await
        .unwrap();
    let v = compiled(&c, &env, &main, 60).await["version"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&c, &env, v, 60).await;

    git_ok(&repo.work, &["checkout", "-q", "-b", "change"]);
    let head = repo.commit(&repo.model(&[("a", "ONE"), ("b", "two")], ""), "bigger");
    push_pull(&repo, 5);
    pull_request_event(
        &srv.url, &env, "s3cret", false, "opened", 5, &head, "org/site", false,
    )
    .await;
    let p = finished(&c, &env, 5, &head).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");
    let d = &p["run"]["summary"]["dryrun"];
    assert_eq!(d["version"], v, "{p:#}");
    assert_eq!(d["total"], 1, "only the changed resource: {p:#}");
    let id = d["id"].as_str().unwrap().to_string();
    let report = eventually(60, "the preview's dry-run", || async {
        let r = c.dryrun(&env, &id).await.ok()?;
        (r["complete"] == true).then_some(r)
    })
    .await;
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{report:#}");
    assert!(
        results[0]["resource_id"].as_str().unwrap().contains("/a]"),
        "{report:#}"
    );
    assert_eq!(results[0]["outcome"], "dry", "{report:#}");
    assert!(
        report.to_string().contains("ONE"),
        "the change is shown: {report:#}"
    );
    // changing nothing
    assert_eq!(std::fs::read_to_string(repo.out.join("a")).unwrap(), "one");
    let body = eventually(30, "the comment naming the dry-run", || async {
        host.comment().filter(|b| b.contains(&id))
    })
    .await;
    assert!(body.contains(&format!("active version {v}")), "{body}");

    // a fork: previewed (forks are on), never dry-run
    let dryruns = c.dryruns(&env).await.unwrap().as_array().unwrap().len();
    let fork_head = repo.commit(&repo.model(&[("a", "FORK"), ("b", "two")], ""), "fork");
    push_pull(&repo, 6);
    pull_request_event(
        &srv.url, &env, "s3cret", false, "opened", 6, &fork_head, "eve/site", false,
    )
    .await;
    let p = finished(&c, &env, 6, &fork_head).await;
    assert_eq!(p["run"]["status"], "success", "{p:#}");
    assert!(p["run"]["summary"].get("dryrun").is_none(), "{p:#}");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        c.dryruns(&env).await.unwrap().as_array().unwrap().len(),
        dryruns
    );
}
