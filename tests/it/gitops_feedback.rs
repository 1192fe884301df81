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
