//! Regressions of the fault campaign on the git side (issue 11): a failed commit is compiled
//! once, commits that arrive together leave a trace, pipeline events survive a kill -9 of
//! the server (outbox), notifications are retried until the receiver is back, and
//! `source set` changes only what it is given.

use std::time::Duration;

use serde_json::{Value, json};
use steward::client::Client;

use crate::gitops_feedback::receiver;
use crate::gitops_support::{Repo, compiled, follow, git_ok, timeline};
use crate::support::{TestServer, eventually, free_port, new_database, spawn_server, wait_healthy};

async fn compiles_of(c: &Client, env: &str, commit: &str) -> Vec<Value> {
    c.compiles(env, 1000)
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["commit"] == commit)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_commit_is_compiled_once_unless_named() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    // poll every second: each poll would compile it again
    let env = follow(&c, "failonce", &repo, json!({"poll_interval": 1})).await;
    let broken = repo.commit(&repo.model(&[("f", "1")], "x = \n"), "broken");
    repo.push_ok();
    let report = compiled(&c, &env, &broken, 30).await;
    assert_eq!(report["status"], "failed");
    tokio::time::sleep(Duration::from_secs(5)).await;
    c.trigger_compile(&env, None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        compiles_of(&c, &env, &broken).await.len(),
        1,
        "polls and a tip trigger compiled the failed commit again"
    );
    let failures = timeline(&c, &env, &broken)
        .await
        .iter()
        .filter(|e| *e == "compile_failed")
        .count();
    assert_eq!(failures, 1);
    // naming the commit compiles it again
    let t = c.trigger_compile(&env, Some(&broken)).await.unwrap();
    assert_eq!(t["status"], "queued", "{t}");
    eventually(30, "the second compile", || async {
        let n = compiles_of(&c, &env, &broken)
            .await
            .iter()
            .filter(|r| r["status"] == "failed")
            .count();
        (n == 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn commits_pushed_together_leave_a_trace() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let env = follow(&c, "together", &repo, json!({"watch": false})).await;
    let first = repo.commit(&repo.model(&[("f", "1")], ""), "one");
    repo.push_ok();
    c.trigger_compile(&env, None).await.unwrap();
    compiled(&c, &env, &first, 30).await;
    // two commits reach the branch before the server looks
    let middle = repo.commit(&repo.model(&[("f", "2")], ""), "two");
    let last = repo.commit(&repo.model(&[("f", "3")], ""), "three");
    repo.push_ok();
    c.trigger_compile(&env, None).await.unwrap();
    let report = compiled(&c, &env, &last, 30).await;
    assert_eq!(report["status"], "success");
    let skipped = compiles_of(&c, &env, &middle).await;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0]["status"], "superseded");
    assert_eq!(timeline(&c, &env, &middle).await, vec!["superseded"]);
    // a force push is no "in between": nothing invented
    git_ok(&repo.work, &["reset", "-q", "--hard", &first]);
    let forced = repo.commit(&repo.model(&[("f", "4")], ""), "forced");
    git_ok(&repo.work, &["push", "-q", "-f", "origin", "main"]);
    c.trigger_compile(&env, None).await.unwrap();
    compiled(&c, &env, &forced, 30).await;
    let all = c.compiles(&env, 100).await.unwrap();
    assert_eq!(all.as_array().unwrap().len(), 4, "{all}");
}

/// Events the receiver got, by name, for `commit`.
fn received(rx: &crate::gitops_feedback::Received, commit: &str) -> Vec<(String, String)> {
    rx.0.lock()
        .unwrap()
        .iter()
        .filter(|(p, _, b)| p == "/events" && b["commit"] == commit)
        .map(|(_, h, b)| {
            (
                b["event"].as_str().unwrap_or_default().to_string(),
                h["x-steward-delivery"].to_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pipeline_reaches_deployed_after_a_kill_9_mid_deploy() {
    let (rx_url, rx) = receiver().await;
    let db = new_database();
    let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin = "stw_test_admin_secret_for_pipeline_kill9";
    let mut child = spawn_server(&db, port, admin, data.path());
    wait_healthy(&url).await;
    let c = Client::new(&url, Some(admin.into()));
    let repo = Repo::new();
    let env = follow(
        &c,
        "pipekill",
        &repo,
        json!({"notify_url": format!("{rx_url}/events"), "notify_secret": "n"}),
    )
    .await;
    // a slow step, then files
    let marker = repo.out.join("steps");
    let extra = format!(
        "import exec\nexec::Run(host=host, command=\"/bin/sh -c 'sleep 3; echo done >> {}'\")\n",
        marker.display()
    );
    let commit = repo.commit(&repo.model(&[("a", "1"), ("b", "2")], &extra), "slow");
    repo.push_ok();
    c.trigger_compile(&env, None).await.unwrap();
    let report = compiled(&c, &env, &commit, 60).await;
    assert_eq!(report["status"], "success", "{report}");
    eventually(60, "the release", || async {
        timeline(&c, &env, &commit)
            .await
            .contains(&"released".to_string())
            .then_some(())
    })
    .await;
    // kill -9 while the slow step runs
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::process::Command::new("kill")
        .args(["-9", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    let mut child = spawn_server(&db, port, admin, data.path());
    wait_healthy(&url).await;
    let events = eventually(60, "deployed in the timeline", || async {
        let t = timeline(&c, &env, &commit).await;
        t.contains(&"deployed".to_string()).then_some(t)
    })
    .await;
    assert_eq!(
        events.iter().filter(|e| *e == "deployed").count(),
        1,
        "{events:?}"
    );
    let got = eventually(30, "the deployed notification", || async {
        let got = received(&rx, &commit);
        got.iter().any(|(e, _)| e == "deployed").then_some(got)
    })
    .await;
    for want in ["received", "compiled", "released", "deployed"] {
        assert!(
            got.iter().any(|(e, _)| e == want),
            "{want} missing: {got:?}"
        );
    }
    assert!(std::fs::read_to_string(&marker).unwrap().contains("done"));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn notifications_are_retried_until_the_receiver_is_back() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    // a port nobody listens on yet
    let port = free_port();
    let repo = Repo::new();
    let env = follow(
        &c,
        "retrynotify",
        &repo,
        json!({"notify_url": format!("http://127.0.0.1:{port}/events")}),
    )
    .await;
    let commit = repo.commit(&repo.model(&[("a", "1")], ""), "one");
    repo.push_ok();
    c.trigger_compile(&env, None).await.unwrap();
    compiled(&c, &env, &commit, 30).await;
    // the receiver is down for a while: attempts back off (2, 4, 8 s …), none is lost
    tokio::time::sleep(Duration::from_secs(15)).await;
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE delivered_at IS NULL AND abandoned_at IS NULL",
    )
    .fetch_one(&srv.pool)
    .await
    .unwrap();
    assert!(pending >= 3, "{pending} messages waiting");
    let max_attempts: i32 = sqlx::query_scalar("SELECT max(attempts) FROM outbox")
        .fetch_one(&srv.pool)
        .await
        .unwrap();
    // attempts at 0, 2, 6 and 14 s
    assert!(
        (3..=5).contains(&max_attempts),
        "{max_attempts} attempts in 15 s: not on the backoff schedule"
    );
    // the receiver comes up on that port
    let (rx, app_rx) = {
        let r = crate::gitops_feedback::Received::default();
        let app = axum::Router::new()
            .route(
                "/{*path}",
                axum::routing::post(
                    |axum::extract::State(r): axum::extract::State<
                        crate::gitops_feedback::Received,
                    >,
                     headers: axum::http::HeaderMap,
                     body: axum::body::Bytes| async move {
                        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        r.0.lock().unwrap().push(("/events".into(), headers, v));
                        "ok"
                    },
                ),
            )
            .with_state(r.clone());
        (r, app)
    };
    let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(l, app_rx).await.unwrap() });
    let got = eventually(40, "the queued events", || async {
        let got = received(&rx, &commit);
        let names: Vec<&str> = got.iter().map(|(e, _)| e.as_str()).collect();
        (names.contains(&"received") && names.contains(&"compiled") && names.contains(&"deployed"))
            .then_some(got)
    })
    .await;
    // at least once, and each message once here (no duplicate delivery ids)
    let mut ids: Vec<&str> = got.iter().map(|(_, d)| d.as_str()).collect();
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "a message was delivered twice: {got:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn source_set_changes_only_what_is_given() {
    let srv = TestServer::start_deploying().await;
    let repo = Repo::new();
    let env = srv
        .admin_client()
        .create_environment("git", "partial", None)
        .await
        .unwrap()
        .id
        .to_string();
    let run = |args: &[&str]| {
        std::process::Command::new(crate::support::steward_bin())
            .args(args)
            .env("XDG_CACHE_HOME", srv.client_cache())
            .env("STEWARD_SERVER", &srv.url)
            .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
            .env("STEWARD_ENV", &env)
            .output()
            .unwrap()
    };
    let url = repo.url();
    let o = run(&[
        "source",
        "set",
        &url,
        "--notify-url",
        "http://127.0.0.1:9/hook",
        "--poll-interval",
        "30",
        "--webhook-secret",
        "s",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["source", "set", &url, "--poll-interval", "5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = srv.admin_client().source(&env).await.unwrap();
    assert_eq!(s["poll_interval"], 5, "{s}");
    assert_eq!(
        s["notify_url"], "http://127.0.0.1:9/hook",
        "the notify URL was lost: {s}"
    );
    assert_eq!(s["has_webhook_secret"], true, "{s}");
    assert_eq!(s["branch"], "main");
}

/// A crash between storing a commit's version and recording the compile's end (two
/// transactions) left the compile `running`; the next start queued it again and the commit
/// made a second version. The end is made to fail here (a trigger refuses it, as a database
/// that goes away at that moment would), then the server is killed with -9 and started again.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_stored_before_a_crash_is_not_compiled_again() {
    let db = new_database();
    let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin = "stw_test_admin_secret_for_stored_crash";
    let mut child = spawn_server(&db, port, admin, data.path());
    wait_healthy(&url).await;
    let c = Client::new(&url, Some(admin.into()));
    let repo = Repo::new();
    let env = follow(&c, "storedcrash", &repo, json!({})).await;
    let pool = steward::store::connect(&db, 1).await.unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION test_refuse_compile_end() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF OLD.status = 'running' AND NEW.status <> 'running' THEN \
           RAISE EXCEPTION 'test: the end of this compile can not be recorded'; END IF; \
         RETURN NEW; END $$; \
         CREATE TRIGGER refuse_compile_end BEFORE UPDATE ON compiles \
           FOR EACH ROW EXECUTE FUNCTION test_refuse_compile_end();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let commit = repo.commit(&repo.model(&[("a", "1")], ""), "one");
    repo.push_ok();
    c.trigger_compile(&env, None).await.unwrap();
    // the version is stored, the compile stays running: its end was refused
    eventually(60, "version 1 stored while its compile runs", || async {
        let versions = c.versions(&env).await.unwrap();
        let list = compiles_of(&c, &env, &commit).await;
        (versions.len() == 1 && list.len() == 1 && list[0]["status"] == "running").then_some(())
    })
    .await;
    std::process::Command::new("kill")
        .args(["-9", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
    sqlx::raw_sql(
        "DROP TRIGGER refuse_compile_end ON compiles; DROP FUNCTION test_refuse_compile_end();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let mut child = spawn_server(&db, port, admin, data.path());
    wait_healthy(&url).await;
    let report = compiled(&c, &env, &commit, 60).await;
    assert_eq!(report["status"], "success", "{report:#}");
    assert_eq!(report["version"], 1, "{report:#}");
    // time for a compile queued again to run and store a second version
    tokio::time::sleep(Duration::from_secs(3)).await;
    let versions = c.versions(&env).await.unwrap();
    assert_eq!(
        versions.len(),
        1,
        "the commit compiled twice: {versions:#?}"
    );
    let list = compiles_of(&c, &env, &commit).await;
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0]["status"], "success", "{list:#?}");
    let events = timeline(&c, &env, &commit).await;
    assert_eq!(
        events.iter().filter(|e| *e == "compiled").count(),
        1,
        "{events:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
