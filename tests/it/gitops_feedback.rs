//! Feedback to the git host and to a notification receiver: a local HTTP server that records
//! what it is sent and checks it (status API paths and tokens, HMAC signatures).

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};

use crate::gitops_support::{Repo, compiled, follow, webhook_url};
use crate::support::eventually;

#[derive(Clone, Default)]
pub struct Received(pub Arc<Mutex<Vec<(String, HeaderMap, Value)>>>);

async fn record(
    State(r): State<Received>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> &'static str {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    // the raw body is what the signature covers: keep it next to the parsed one
    let mut h = headers.clone();
    h.insert(
        "x-test-raw-body",
        String::from_utf8_lossy(&body).parse().unwrap(),
    );
    r.0.lock().unwrap().push((format!("/{path}"), h, v));
    "ok"
}

pub async fn receiver() -> (String, Received) {
    let r = Received::default();
    let app = Router::new()
        .route("/{*path}", post(record))
        .with_state(r.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, r)
}

#[tokio::test(flavor = "multi_thread")]
async fn commit_status_and_signed_events_follow_the_pipeline() {
    let srv = crate::support::TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (rx_url, rx) = receiver().await;
    let repo = Repo::new();
    let env = follow(
        &c,
        "feedback",
        &repo,
        json!({
            "status": {"kind": "gitea", "api_url": rx_url, "repo": "org/site", "token": "gitea-tok"},
            "notify_url": format!("{rx_url}/events"), "notify_secret": "n0tify",
        }),
    )
    .await;
    repo.install_post_receive(&webhook_url(&srv.url, &env), "s3cret");
    let commit = repo.commit(&repo.model(&[("f", "1")], ""), "one");
    repo.push_ok();
    compiled(&c, &env, &commit, 30).await;

    let status_path = format!("/api/v1/repos/org/site/statuses/{commit}");
    let statuses = eventually(30, "compile and deploy statuses", || async {
        let got: Vec<(String, HeaderMap, Value)> =
            rx.0.lock()
                .unwrap()
                .iter()
                .filter(|(p, _, _)| *p == status_path)
                .cloned()
                .collect();
        let deploy_done = got
            .iter()
            .any(|(_, _, b)| b["context"] == "steward/deploy" && b["state"] == "success");
        deploy_done.then_some(got)
    })
    .await;
    let seen: Vec<(String, String)> = statuses
        .iter()
        .map(|(_, _, b)| {
            (
                b["context"].as_str().unwrap().to_string(),
                b["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        seen.contains(&("steward/compile".into(), "pending".into())),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("steward/compile".into(), "success".into())),
        "{seen:?}"
    );
    for (_, h, _) in &statuses {
        assert_eq!(h["authorization"], "token gitea-tok");
    }

    // delivery is at least once, with retries: a message whose first attempt failed (a
    // loopback hiccup under load) arrives after later ones, so wait for all of them
    let pipeline = ["received", "compiled", "released", "deployed"];
    let events = eventually(30, "every pipeline event", || async {
        let got: Vec<(String, HeaderMap, Value)> =
            rx.0.lock()
                .unwrap()
                .iter()
                .filter(|(p, _, _)| p == "/events")
                .cloned()
                .collect();
        pipeline
            .iter()
            .all(|want| got.iter().any(|(_, _, b)| b["event"] == *want))
            .then_some(got)
    })
    .await;
    let names: Vec<&str> = events
        .iter()
        .map(|(_, _, b)| b["event"].as_str().unwrap())
        .collect();
    for want in pipeline {
        assert!(names.contains(&want), "{names:?}");
    }
    for (_, h, b) in &events {
        let raw = h["x-test-raw-body"].to_str().unwrap();
        let expect = format!(
            "sha256={}",
            steward::sources::webhook::sign("n0tify", raw.as_bytes())
        );
        assert_eq!(
            h["x-steward-signature"].to_str().unwrap(),
            expect,
            "bad signature on {b}"
        );
        assert_eq!(b["commit"], commit.as_str());
    }

    // a broken commit: failure status with the reason
    let broken = repo.commit(&repo.model(&[("f", "2")], "z = \n"), "broken");
    repo.push_ok();
    compiled(&c, &env, &broken, 30).await;
    let path = format!("/api/v1/repos/org/site/statuses/{broken}");
    let failure = eventually(30, "a failure status", || async {
        rx.0.lock()
            .unwrap()
            .iter()
            .find(|(p, _, b)| *p == path && b["state"] == "failure")
            .map(|(_, _, b)| b.clone())
    })
    .await;
    assert!(
        failure["description"]
            .as_str()
            .unwrap()
            .contains("does not compile"),
        "{failure}"
    );

    // GitHub: its API path and a bearer token
    c.set_source(
        &env,
        &json!({"url": repo.url(), "webhook_secret": "s3cret", "poll_interval": 0,
        "status": {"kind": "github", "api_url": rx_url, "repo": "org/site", "token": "gh-tok"}}),
    )
    .await
    .unwrap();
    let third = repo.commit(&repo.model(&[("f", "3")], ""), "three");
    repo.push_ok();
    compiled(&c, &env, &third, 30).await;
    let gh = format!("/repos/org/site/statuses/{third}");
    let h = eventually(30, "a github status", || async {
        rx.0.lock()
            .unwrap()
            .iter()
            .find(|(p, _, _)| *p == gh)
            .map(|(_, h, _)| h.clone())
    })
    .await;
    assert_eq!(h["authorization"], "Bearer gh-tok");
}

/// The statuses `rx` got for `commit` in `repo` (gitea's API path), as (context, state).
fn statuses_of(rx: &Received, repo: &str, commit: &str) -> Vec<(String, String)> {
    let path = format!("/api/v1/repos/{repo}/statuses/{commit}");
    rx.0.lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| *p == path)
        .map(|(_, _, b)| {
            let s = |k: &str| b[k].as_str().unwrap_or_default().to_string();
            (s("context"), s("state"))
        })
        .collect()
}

fn deploy_successes(rx: &Received, repo: &str, commit: &str) -> usize {
    statuses_of(rx, repo, commit)
        .iter()
        .filter(|(c, s)| c == "steward/deploy" && s == "success")
        .count()
}

/// The deploy reporter looks at every environment with a source once a second, asking the
/// scheduler for a version's counts (it waits up to a second for them to be stored) before
/// counting in the database. For 20 s one environment's scheduler can not store a state (a
/// transaction holds the row its writer takes with every batch) while its commit deployed
/// in memory: the reporter must not call that commit deployed, must go on reporting the other
/// environment's commit meanwhile, and must report the held one once, soon after the hold ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_deploy_is_reported_once_when_stored_and_others_are_reported_meanwhile() {
    let srv = crate::support::TestServer::start_deploying().await;
    let c = srv.admin_client();
    let (rx_url, rx) = receiver().await;
    let status = |repo: &str| json!({"status": {"kind": "gitea", "api_url": rx_url, "repo": repo, "token": "t"}});
    let (held, free) = (Repo::new(), Repo::new());
    let held_env = follow(&c, "held", &held, status("org/held")).await;
    let free_env = follow(&c, "free", &free, status("org/free")).await;
    held.install_post_receive(&webhook_url(&srv.url, &held_env), "s3cret");
    free.install_post_receive(&webhook_url(&srv.url, &free_env), "s3cret");

    // a first commit deploys and is reported: the scheduler's progress row exists
    let first = held.commit(&held.model(&[("f", "1")], ""), "one");
    held.push_ok();
    compiled(&c, &held_env, &first, 60).await;
    eventually(60, "the first commit reported deployed", || async {
        (deploy_successes(&rx, "org/held", &first) == 1).then_some(())
    })
    .await;

    // the held environment's writer can store nothing from here on
    let env_id: uuid::Uuid = held_env.parse().unwrap();
    let mut hold = srv.pool.begin().await.unwrap();
    let locked: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM scheduler_progress WHERE environment_id = $1 FOR UPDATE")
            .bind(env_id)
            .fetch_optional(&mut *hold)
            .await
            .unwrap();
    assert_eq!(locked, Some(1), "no progress row to hold");
    let held_since = std::time::Instant::now();
    let second = held.commit(&held.model(&[("f", "2")], ""), "two");
    held.push_ok();
    let other = free.commit(&free.model(&[("g", "1")], ""), "other");
    free.push_ok();

    let file = held.out.join("f");
    let mut deployed_in_memory = None;
    let mut other_reported = None;
    while held_since.elapsed() < std::time::Duration::from_secs(20) {
        if deployed_in_memory.is_none()
            && std::fs::read_to_string(&file).ok().as_deref() == Some("2")
        {
            deployed_in_memory = Some(held_since.elapsed());
        }
        if other_reported.is_none() && deploy_successes(&rx, "org/free", &other) == 1 {
            other_reported = Some(held_since.elapsed());
        }
        assert_eq!(
            deploy_successes(&rx, "org/held", &second),
            0,
            "the held commit was reported deployed while none of its states was stored"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let deployed_in_memory =
        deployed_in_memory.expect("the held commit never deployed: the test held nothing");
    let other_reported = other_reported
        .expect("the other environment's commit was not reported while one environment was held");
    assert!(
        deployed_in_memory < std::time::Duration::from_secs(15),
        "the held commit deployed only after {deployed_in_memory:?}: too late to be held 5 s"
    );
    hold.rollback().await.unwrap();
    let released = std::time::Instant::now();
    eventually(15, "the held commit reported deployed", || async {
        (deploy_successes(&rx, "org/held", &second) >= 1).then_some(())
    })
    .await;
    let reported_after = released.elapsed();
    // looks go on once a second: nothing is reported twice
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(deploy_successes(&rx, "org/held", &second), 1);
    assert_eq!(deploy_successes(&rx, "org/free", &other), 1);
    let t = crate::gitops_support::timeline(&c, &held_env, &second).await;
    assert_eq!(
        t.iter().filter(|e| *e == "deployed").count(),
        1,
        "the held commit's timeline: {t:?}"
    );
    eprintln!(
        "held commit deployed in memory after {deployed_in_memory:?}, other reported after \
         {other_reported:?}, held commit reported {reported_after:?} after the hold ended"
    );
}
