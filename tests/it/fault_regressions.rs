//! Regressions of the fault campaign (issue 11): a failing resource backs off and stays
//! small in the database, progress tells a version waiting for approval from one being
//! deployed, a rollback's hold on automatic release shows and lifts, repairs are logged as
//! repairs, and the CLI's edges (unknown resources, piped output, token scopes).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::deploy::{deploy_actions, deploying_env, state_of, upload};
use crate::deploy_cli::{cli, ok};
use crate::support::{eventually, exec_run, fs_file, null_export, wait_deployed};

const AGENT: &str = "localhost";

async fn database_size(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Attempts the schedule initial × factor^n allows in `secs` (jitter only makes a retry
/// up to 10 % earlier): the first one, and each retry that falls due.
fn attempts_allowed(initial: f64, factor: f64, max: f64, secs: f64) -> usize {
    let (mut t, mut n, mut delay) = (0.0, 1, initial);
    loop {
        t += 0.9 * delay.min(max);
        if t > secs {
            return n;
        }
        n += 1;
        delay *= factor;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_resource_backs_off_and_stays_small() {
    let (srv, c, env, dir) = deploying_env(
        "backoff",
        json!({"retry_backoff": {"initial": 2, "factor": 2, "max": 600}}),
    )
    .await;
    // its parent directory does not exist: it fails on every attempt
    let path = dir.path().join("missing/dir/file");
    let file = fs_file(AGENT, &path.display().to_string(), "x", &[]);
    let rid = file.id.0.clone();
    let size_before = database_size(&srv.pool).await;
    let started = Instant::now();
    upload(&c, &env, vec![file]).await;
    // watch it for over 30 s, checking the schedule as it goes
    let mut last_next_retry = None;
    let mut advanced = 0;
    while started.elapsed() < Duration::from_secs(32) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = state_of(&c, &env, &rid).await;
        if s.next_retry.is_some() && s.next_retry != last_next_retry {
            advanced += 1;
            last_next_retry = s.next_retry;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let attempts = deploy_actions(&c, &env, &rid).await.len();
    let allowed = attempts_allowed(2.0, 2.0, 600.0, elapsed);
    // 0, 2, 6, 14, 30 s: five attempts (the tight loop made tens of thousands)
    assert!(
        (3..=allowed).contains(&attempts),
        "{attempts} attempts in {elapsed:.1} s; the schedule allows {allowed}"
    );
    let s = state_of(&c, &env, &rid).await;
    assert_eq!(
        s.failure_count as usize, attempts,
        "one failure per attempt"
    );
    assert!(
        advanced >= 3,
        "next_retry moved {advanced} times: it must advance with every failure"
    );
    let next = s.next_retry.expect("a retry is scheduled");
    let since_last = next - s.last_deployed.unwrap();
    assert!(
        since_last.num_milliseconds() as f64 >= 0.9 * 2f64.powi(attempts as i32 - 1) * 1000.0,
        "the next retry is {since_last} after the last attempt, not on the schedule"
    );
    let growth = database_size(&srv.pool).await - size_before;
    assert!(
        growth < 4 << 20,
        "the database grew by {growth} bytes while one resource failed"
    );
    // a user deploy still retries at once
    let r = c.trigger(&env, false, None, None).await.unwrap();
    assert!(r["scheduled"].as_u64().unwrap_or(0) >= 1, "{r}");
    eventually(5, "the user's deploy to run", || async {
        (deploy_actions(&c, &env, &rid).await.len() > attempts).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_tells_waiting_for_approval_from_deploying() {
    let (srv, c, env, dir) = deploying_env("approval", json!({"auto_release": false})).await;
    let d = dir.path().display().to_string();
    let v = upload(&c, &env, vec![fs_file(AGENT, &format!("{d}/a"), "a", &[])]).await;
    let p = c.progress(&env, v).await.unwrap();
    assert_eq!(p["phase"], "waiting_for_approval", "{p}");
    assert_eq!(p["done"], false);
    let out = ok(&cli(&srv, &env, &["version", "progress", &v.to_string()]));
    assert!(out.contains("waiting for approval"), "{out}");
    // --wait waits through the approval, then for the deploy
    let mut waiter = std::process::Command::new(crate::support::steward_bin())
        .args(["version", "progress", &v.to_string(), "--wait"])
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .env("STEWARD_ENV", &env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "--wait returned while the version waits for approval"
    );
    c.release(&env, v, "ok").await.unwrap();
    let out = tokio::task::spawn_blocking(move || waiter.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("waits for approval"), "{stderr}");
    assert!(stdout.contains("deploy done"), "{stdout}");
    // not a terminal: progress comes as plain lines on stderr, the last one settled
    assert!(stderr.contains("progress: 0/1: "), "{stderr}");
    assert!(
        stderr.contains("progress: 1/1: 1 deployed · 0 failed · 0 deploying · 0 waiting"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\r'),
        "no terminal control in plain mode: {stderr}"
    );
    // a rejected version: --wait ends, and not with success
    let v2 = upload(&c, &env, vec![fs_file(AGENT, &format!("{d}/a"), "b", &[])]).await;
    c.reject(&env, v2, "no").await.unwrap();
    let o = cli(
        &srv,
        &env,
        &["version", "progress", &v2.to_string(), "--wait"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("rejected"));
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_names_the_resource_being_worked_on() {
    let (_srv, c, env, dir) = deploying_env("working", json!({})).await;
    let d = dir.path().display().to_string();
    let run = exec_run(
        AGENT,
        &format!("sh -c 'sleep 2; touch {d}/slow'"),
        json!({}),
        &[],
    );
    let rid = run.id.0.clone();
    let v = upload(&c, &env, vec![run]).await;
    let p = eventually(20, "the slow command to be worked on", || async {
        let p = c.progress(&env, v).await.unwrap();
        (p["by_status"]["deploying"] == 1).then_some(p)
    })
    .await;
    assert_eq!(p["working_on"], json!([rid]), "{p}");
    let p = wait_deployed(&c, &env, v, 30).await;
    assert_eq!(p["working_on"], json!([]), "{p}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollback_hold_shows_and_lifts() {
    let (srv, c, env, dir) = deploying_env("hold", json!({})).await;
    let d = dir.path().display().to_string();
    let v1 = upload(&c, &env, vec![fs_file(AGENT, &format!("{d}/a"), "1", &[])]).await;
    wait_deployed(&c, &env, v1, 30).await;
    let v2 = upload(&c, &env, vec![fs_file(AGENT, &format!("{d}/a"), "2", &[])]).await;
    wait_deployed(&c, &env, v2, 30).await;
    let out = ok(&cli(&srv, &env, &["version", "rollback", &v1.to_string()]));
    assert!(
        out.contains("held"),
        "the rollback does not say it holds auto-release: {out}"
    );
    let list = ok(&cli(&srv, &env, &["env", "list"]));
    assert!(list.contains("held"), "env list hides the hold: {list}");
    let settings = ok(&cli(&srv, &env, &["env", "settings"]));
    assert!(settings.contains("held"), "{settings}");
    // while held, a new version waits
    let v4 = upload(&c, &env, vec![fs_file(AGENT, &format!("{d}/a"), "4", &[])]).await;
    assert_eq!(
        c.progress(&env, v4).await.unwrap()["phase"],
        "waiting_for_approval"
    );
    let out = ok(&cli(&srv, &env, &["env", "resume-auto-release"]));
    assert!(out.contains("resumed"), "{out}");
    let list = ok(&cli(&srv, &env, &["env", "list"]));
    assert!(!list.contains("held"), "{list}");
    // released as they arrive again
    let v5 = upload(&c, &env, vec![fs_file(AGENT, &format!("{d}/a"), "5", &[])]).await;
    wait_deployed(&c, &env, v5, 30).await;
    assert_eq!(std::fs::read_to_string(format!("{d}/a")).unwrap(), "5");
}

#[tokio::test(flavor = "multi_thread")]
async fn repairs_are_logged_as_repairs_and_cli_edges_hold() {
    let (srv, c, env, dir) = deploying_env("edges", json!({})).await;
    let d = dir.path().display().to_string();
    let f = fs_file(AGENT, &format!("{d}/a"), "a", &[]);
    let rid = f.id.0.clone();
    let v = upload(&c, &env, vec![f]).await;
    wait_deployed(&c, &env, v, 30).await;
    c.trigger(&env, true, None, None).await.unwrap();
    let acts = eventually(10, "the repair in the log", || async {
        let acts = c.actions(&env, Some(&rid), 100).await.unwrap();
        acts.iter()
            .any(|a| a.action == "repair" && a.finished_at.is_some())
            .then_some(acts)
    })
    .await;
    assert_eq!(
        acts.iter().filter(|a| a.action == "deploy").count(),
        1,
        "{acts:?}"
    );

    // an unknown resource is an error, as in `resource show`
    let o = cli(
        &srv,
        &env,
        &["resource", "logs", "fs::File[localhost,path=/nope]"],
    );
    assert!(
        !o.status.success(),
        "resource logs of an unknown resource succeeded"
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("no version"));

    // scoped tokens are not listed as global ones
    ok(&cli(
        &srv,
        &env,
        &[
            "token",
            "create",
            "--name",
            "scoped-viewer",
            "--role",
            "viewer",
        ],
    ));
    let global = std::process::Command::new(crate::support::steward_bin())
        .args(["token", "list"])
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .output()
        .unwrap();
    let global = ok(&global);
    assert!(!global.contains("scoped-viewer"), "{global}");
    let all = std::process::Command::new(crate::support::steward_bin())
        .args(["token", "list", "--all"])
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .output()
        .unwrap();
    let all = ok(&all);
    let line = all
        .lines()
        .find(|l| l.contains("scoped-viewer"))
        .expect("listed with --all");
    assert!(
        line.contains("deploy/edges"),
        "its environment is named: {line}"
    );

    // output piped into a reader that stops early: no panic
    c.upload(&env, &null_export(3000, None), json!({}))
        .await
        .unwrap();
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' resource list | head -1 >/dev/null",
            crate::support::steward_bin().display()
        ))
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .env("STEWARD_ENV", &env)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("error"),
        "{stderr}"
    );
}
