//! Deploys survive faults: a crashed executor, a hung handler, a server killed with -9.

use std::time::Duration;

use serde_json::json;
use steward::client::Client;

use crate::deploy::{deploy_actions, deploying_env, env_with, state_of, upload};
use crate::support::{
    eventually, exec_run, free_port, fs_file, kill9, new_database, spawn_server, wait_deployed,
    wait_healthy,
};

const AGENT: &str = "localhost";

#[tokio::test(flavor = "multi_thread")]
async fn crashed_executor_is_reported_respawned_and_retried() {
    let (_srv, c, env, dir) = deploying_env(
        "crash",
        json!({"retry_backoff": {"initial": 1, "factor": 1.0, "max": 1}}),
    )
    .await;
    let d = dir.path().display().to_string();
    // two slow commands: the executor works on one, and is given the other to start next
    let runs: Vec<_> = (1..=2)
        .map(|n| {
            let cmd = format!("sh -c 'touch {d}/started-{n}; sleep 2; echo done >> {d}/out-{n}'");
            exec_run(AGENT, &cmd, json!({}), &[])
        })
        .collect();
    let rids: Vec<String> = runs.iter().map(|r| r.id.0.clone()).collect();
    let v = upload(&c, &env, runs).await;
    // the executor working on one of them, with the other handed to it to start next
    let pid = eventually(20, "a command to start", || async {
        let a = c.agents(&env).await.unwrap();
        let agent = a["agents"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == AGENT)?
            .clone();
        let started = (1..=2).any(|n| std::path::Path::new(&format!("{d}/started-{n}")).exists());
        (started && agent["running"] == 2)
            .then(|| agent["executors"][0].as_u64())
            .flatten()
    })
    .await;
    let first = (1..=2)
        .find(|n| std::path::Path::new(&format!("{d}/started-{n}")).exists())
        .unwrap();
    kill9(pid as u32);
    // the one it worked on: reported as unavailable, then retried on a new executor and
    // deployed
    let crashed_rid = &rids[first - 1];
    let acts = eventually(30, "a retry to deploy it", || async {
        let acts = deploy_actions(&c, &env, crashed_rid).await;
        acts.iter().any(|a| a.status == "deployed").then_some(acts)
    })
    .await;
    let crashed = acts
        .iter()
        .find(|a| a.status == "unavailable")
        .expect("the crash is in the log");
    assert!(
        crashed.messages.to_string().contains("crashed"),
        "{:?}",
        crashed.messages
    );
    wait_deployed(&c, &env, v, 30).await;
    // the one waiting behind it never started: queued again, not failed, run once
    let other_rid = &rids[2 - first];
    let other = deploy_actions(&c, &env, other_rid).await;
    assert_eq!(
        other.iter().map(|a| a.status.as_str()).collect::<Vec<_>>(),
        ["deployed"],
        "the action waiting behind the crashed one: {other:?}"
    );
    for n in 1..=2 {
        assert_eq!(
            std::fs::read_to_string(format!("{d}/out-{n}")).unwrap(),
            "done\n",
            "command {n} ran to its end once"
        );
    }
    let a = c.agents(&env).await.unwrap();
    let pids = a["agents"][0]["executors"].as_array().unwrap().clone();
    assert!(
        !pids.contains(&json!(pid)),
        "the dead executor is still listed: {pids:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hung_handler_times_out_and_the_agent_goes_on() {
    let (_srv, c, env, dir) = deploying_env(
        "hung",
        json!({"handler_timeout": 2, "retry_backoff": {"initial": 600, "factor": 1.0, "max": 600}}),
    )
    .await;
    let d = dir.path().display().to_string();
    let marker = format!("{d}/hung-started");
    let hang = exec_run(
        AGENT,
        &format!("sh -c 'touch {marker}; sleep 600'"),
        json!({}),
        &[],
    );
    let hid = hang.id.0.clone();
    // after the hung one in the queue: it only deploys if the agent keeps going
    let file = fs_file(AGENT, &format!("{d}/after"), "x", &[&hid]);
    let other = fs_file(AGENT, &format!("{d}/independent"), "y", &[]);
    let other_id = other.id.0.clone();
    let started = std::time::Instant::now();
    let v = upload(&c, &env, vec![hang, file, other]).await;
    let p = wait_deployed(&c, &env, v, 30).await;
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(p["by_status"]["timed_out"], 1, "{p}");
    assert_eq!(p["by_status"]["skipped_for_dependency"], 1, "{p}");
    assert_eq!(
        std::fs::read_to_string(format!("{d}/independent")).unwrap(),
        "y"
    );
    // the executor was given it to start after the hung one: it never started there, and
    // went back to the queue (not reported as failed) when that executor was killed
    let acts = deploy_actions(&c, &env, &other_id).await;
    assert_eq!(
        acts.iter().map(|a| a.status.as_str()).collect::<Vec<_>>(),
        ["deployed"],
        "{acts:?}"
    );
    let s = state_of(&c, &env, &hid).await;
    assert!(
        s.last_message
            .unwrap_or_default()
            .contains("did not finish within 2 s")
    );
    // the hung command was killed with its executor
    let out = std::process::Command::new("pgrep")
        .args(["-f", &format!("touch {marker}")])
        .output()
        .unwrap();
    assert!(
        out.stdout.is_empty(),
        "the hung command still runs: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn server_killed_mid_deploy_converges_after_restart() {
    let db = new_database();
    let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin = "stw_test_admin_secret_for_deploy_kill9";
    let mut child = spawn_server(&db, port, admin, data.path());
    wait_healthy(&url).await;
    let c = Client::new(&url, Some(admin.into()));
    let env = env_with(&c, "kill9", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    // slow steps in a chain, then many files after them
    let mut resources = Vec::new();
    let mut prev: Option<String> = None;
    for i in 0..6 {
        let r = exec_run(
            AGENT,
            &format!("sh -c 'sleep 0.4; echo {i} >> {d}/steps'"),
            json!({}),
            prev.as_slice()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice(),
        );
        prev = Some(r.id.0.clone());
        resources.push(r);
    }
    let last = prev.unwrap();
    for i in 0..200 {
        resources.push(fs_file(
            AGENT,
            &format!("{d}/file{i}"),
            &format!("{i}\n"),
            &[&last],
        ));
    }
    let v = upload(&c, &env, resources).await;
    eventually(20, "the deploy to be under way", || async {
        let n = std::fs::read_to_string(format!("{d}/steps"))
            .map(|s| s.lines().count())
            .unwrap_or(0);
        (n >= 2).then_some(())
    })
    .await;
    kill9(child.id());
    child.wait().unwrap();

    let mut child = spawn_server(&db, port, admin, data.path());
    wait_healthy(&url).await;
    let p = wait_deployed(&c, &env, v, 60).await;
    assert_eq!(p["by_status"]["deployed"], 206, "{p}");
    for i in 0..200 {
        assert_eq!(
            std::fs::read_to_string(format!("{d}/file{i}")).unwrap(),
            format!("{i}\n")
        );
    }
    // every step ran to completion at least once; an interrupted one is in the log as such
    let steps = std::fs::read_to_string(format!("{d}/steps")).unwrap();
    for i in 0..6 {
        assert!(
            steps.lines().any(|l| l == i.to_string()),
            "step {i} never completed: {steps}"
        );
    }
    let all = c.actions(&env, None, 10_000).await.unwrap();
    assert!(
        all.iter().all(|a| a.finished_at.is_some()),
        "an action was left open"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
