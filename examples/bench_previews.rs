//! Pull-request preview latency: `cargo run --release --example bench_previews [-- N] [--rounds R]`
//!
//! A private PostgreSQL cluster (temporary) and a server following a bare repository on this
//! machine whose main branch holds a model of N `std::testing::NullResource`s (default
//! 10,000), compiled, released and deployed first. A local stand-in of the GitHub and Gitea
//! APIs records commit statuses and keeps comments. Each round changes one resource on the
//! pull request's branch, pushes it to `refs/pull/1/head` (GitHub mode: also a real merge
//! commit to `refs/pull/1/merge`; Gitea mode: none, so Steward merges), sends a signed
//! `pull_request` webhook, and measures until the stand-in holds the final status for that
//! head and a comment naming it: webhook → fetch → merge → checkout → compile → diff →
//! status and comment posted. Target on a 2-core machine: < 5 s median, < 10 s p95.
//!
//! This program is also its own compiler and executor.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use serde_json::{Value, json};
use steward::client::Client;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.com")
        .env("GIT_COMMITTER_NAME", "Bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.com")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn model(n: usize, changed: Option<usize>) -> String {
    let mut m = String::from("import std::testing\n");
    for i in 0..n {
        // the changed one: an attribute differs (the preview only diffs it, nothing deploys it)
        let fail = if changed == Some(i) { "true" } else { "false" };
        m.push_str(&format!(
            "std::testing::NullResource(name=\"n{i}\", agentname=\"bench\", fail={fail})\n"
        ));
    }
    m
}

/// One call the stand-in host got: when, method, path, body.
type Call = (Instant, Method, String, Value);

/// What the stand-in host was sent, and its comments.
#[derive(Clone, Default)]
struct Host {
    calls: Arc<Mutex<Vec<Call>>>,
    comments: Arc<Mutex<BTreeMap<i64, String>>>,
}

async fn serve(
    State(h): State<Host>,
    method: Method,
    UrlPath(path): UrlPath<String>,
    body: Bytes,
) -> axum::response::Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = format!("/{path}");
    h.calls
        .lock()
        .unwrap()
        .push((Instant::now(), method.clone(), path.clone(), v.clone()));
    let mut comments = h.comments.lock().unwrap();
    let parts: Vec<&str> = path.split('/').collect();
    if path.contains("/statuses/") {
        return (StatusCode::CREATED, axum::Json(json!({}))).into_response();
    }
    if let Some(i) = parts.iter().position(|p| *p == "comments")
        && parts[i - 1] == "issues"
        && let Some(id) = parts.get(i + 1).and_then(|s| s.parse::<i64>().ok())
    {
        if let Some(c) = comments.get_mut(&id) {
            *c = v["body"].as_str().unwrap_or("").into();
            return axum::Json(json!({"id": id})).into_response();
        }
        return StatusCode::NOT_FOUND.into_response();
    }
    if method == Method::POST {
        let id = comments.len() as i64 + 1;
        comments.insert(id, v["body"].as_str().unwrap_or("").into());
        return (StatusCode::CREATED, axum::Json(json!({"id": id}))).into_response();
    }
    let list: Vec<Value> = comments
        .iter()
        .map(|(id, b)| json!({"id": id, "body": b}))
        .collect();
    axum::Json(json!(list)).into_response()
}

async fn run(n: usize, rounds: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (cluster, pool) = common::database(tmp.path(), 16).await;
    let me = std::env::current_exe().expect("own path");
    let mut state = steward::server::start::app_state_with_schedulers(
        pool.clone(),
        true,
        me.clone(),
        tmp.path(),
    )
    .await;
    steward::server::start::enable_git(&mut state, tmp.path().join("server"), me).await;
    state.allow_local_git_sources = true;
    if let Some(g) = &state.sources {
        g.set_allow_local(true);
    }
    let url = common::serve(state).await;
    let c = Client::new(&url, None);

    let host = Host::default();
    let app = Router::new()
        .route("/{*path}", any(serve))
        .with_state(host.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host_url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });

    let origin = tmp.path().join("origin.git");
    let work = tmp.path().join("work");
    let o = origin.to_str().unwrap();
    git(tmp.path(), &["init", "-q", "--bare", "-b", "main", o]);
    git(tmp.path(), &["clone", "-q", o, work.to_str().unwrap()]);
    git(&work, &["checkout", "-q", "-b", "main"]);
    std::fs::write(work.join("project.yml"), "name: bench\nmodulepath: libs\n").unwrap();
    std::fs::write(work.join("main.cf"), model(n, None)).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "initial"]);
    git(&work, &["push", "-q", "origin", "main"]);
    let main = git(&work, &["rev-parse", "HEAD"]);

    let mut report = Vec::new();
    for (i, kind) in ["github", "gitea"].iter().enumerate() {
        let env = c
            .create_environment("bench", kind, None)
            .await
            .unwrap()
            .id
            .to_string();
        c.set_source(
            &env,
            &json!({"url": format!("file://{}", origin.display()), "branch": "main",
                "webhook_secret": format!("secret-{kind}"), "poll_interval": 0, "watch": false,
                "status": {"kind": kind, "api_url": host_url, "repo": format!("org/{kind}"), "token": "t"}}),
        )
        .await
        .unwrap();
        c.update_settings(&env, &json!({"previews": {"enabled": true}}))
            .await
            .unwrap();
        let start = Instant::now();
        loop {
            let list = c.compiles(&env, 1).await.unwrap();
            if list[0]["status"] == "success" {
                break;
            }
            assert!(list[0]["status"] != "failed", "{list:#}");
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "main did not compile"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        println!(
            "[{kind}] main with {n} resources compiled and released in {:.2} s",
            start.elapsed().as_secs_f64()
        );
        let number = (i + 1) as u64;
        let mut times = Vec::new();
        let mut stage_ms: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for round in 1..=rounds {
            git(&work, &["checkout", "-q", "-B", "change", &main]);
            std::fs::write(work.join("main.cf"), model(n, Some((round * 137) % n))).unwrap();
            git(&work, &["commit", "-q", "-am", &format!("round {round}")]);
            let head = git(&work, &["rev-parse", "HEAD"]);
            git(
                &work,
                &[
                    "push",
                    "-q",
                    "-f",
                    "origin",
                    &format!("HEAD:refs/pull/{number}/head"),
                ],
            );
            if *kind == "github" {
                // the host's test merge, as GitHub computes it
                git(&work, &["checkout", "-q", "-B", "merge", &main]);
                git(&work, &["merge", "-q", "--no-ff", "-m", "merge", "change"]);
                git(
                    &work,
                    &[
                        "push",
                        "-q",
                        "-f",
                        "origin",
                        &format!("HEAD:refs/pull/{number}/merge"),
                    ],
                );
            }
            let body = serde_json::to_vec(&json!({
                "action": if *kind == "github" { "synchronize" } else { "synchronized" },
                "number": number,
                "pull_request": {"number": number, "title": "bench",
                    "base": {"ref": "main", "repo": {"full_name": format!("org/{kind}")}},
                    "head": {"sha": head, "repo": {"full_name": format!("org/{kind}")}}},
            }))
            .unwrap();
            let sig = steward::sources::webhook::sign(&format!("secret-{kind}"), &body);
            let req = reqwest::Client::new()
                .post(format!("{url}/api/v1/environments/{env}/source/webhook"))
                .header("Content-Type", "application/json");
            let req = if *kind == "github" {
                req.header("X-GitHub-Event", "pull_request")
                    .header("X-Hub-Signature-256", format!("sha256={sig}"))
            } else {
                req.header("X-Gitea-Event", "pull_request")
                    .header("X-Gitea-Signature", sig)
            };
            let sent = Instant::now();
            let r = req.body(body).send().await.unwrap();
            assert!(r.status().is_success(), "{}", r.status());
            let short = &head[..7];
            loop {
                let done = {
                    let calls = host.calls.lock().unwrap();
                    let status = calls.iter().any(|(_, m, p, v)| {
                        *m == Method::POST
                            && p.ends_with(&format!("/statuses/{head}"))
                            && (v["state"] == "success" || v["state"] == "failure")
                    });
                    let comment = host.comments.lock().unwrap().values().any(|b| {
                        b.contains(short) && (b.contains("compiles") || b.contains("fails"))
                    });
                    status && comment
                };
                if done {
                    break;
                }
                assert!(
                    sent.elapsed() < Duration::from_secs(120),
                    "round {round} never posted"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let t = sent.elapsed().as_secs_f64();
            let p = c.preview(&env, &number.to_string()).await.unwrap();
            assert_eq!(p["run"]["status"], "success", "{p:#}");
            for s in p["run"]["stages"].as_array().unwrap() {
                stage_ms
                    .entry(s["name"].as_str().unwrap().to_string())
                    .or_default()
                    .push(s["ms"].as_u64().unwrap_or(0));
            }
            println!(
                "[{kind}] round {round}: webhook -> status and comment posted in {:.0} ms ({} merge)",
                t * 1000.0,
                p["run"]["merge_source"].as_str().unwrap_or("?")
            );
            times.push(t);
            // one hint a second per source is what the fetcher takes
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let pct = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize] * 1000.0;
        let stages: Vec<String> = stage_ms
            .iter_mut()
            .map(|(k, v)| {
                v.sort();
                format!("{k} {} ms", v[v.len() / 2])
            })
            .collect();
        report.push(format!(
            "[{kind}] {n} resources, {rounds} rounds: median {:.0} ms, p95 {:.0} ms, max {:.0} ms (target < 5000 / < 10000); median stages: {}",
            pct(0.5),
            pct(0.95),
            pct(1.0),
            stages.join(", ")
        ));
    }
    println!("---");
    for r in report {
        println!("{r}");
    }
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("compile") | Some("executor") => steward::cli::main(),
        _ => {
            let n = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
            let rounds = args
                .iter()
                .position(|a| a == "--rounds")
                .and_then(|i| args.get(i + 1))
                .and_then(|r| r.parse().ok())
                .unwrap_or(20);
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(run(n, rounds));
            std::process::ExitCode::SUCCESS
        }
    }
}
