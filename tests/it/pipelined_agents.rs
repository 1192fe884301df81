//! External agents with work handed out ahead: a process holds more actions than its
//! `agent_parallelism` but runs no more than that at once; a process that opens its session
//! again gets what was in flight for it again (an answer may have been lost) and what it
//! reports is taken once; leases are reported as what is left of them.

use std::time::Duration;

use serde_json::json;
use steward::executor::protocol::{Change, Outcome, WorkResult};
use steward::scheduler::agents::{Hello, Poll, Report};

use crate::deploy::{deploying_env, upload};
use crate::support::{eventually, exec_run, fs_file, steward_bin, wait_deployed};

const WEB: &str = "web";

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_holds_work_ahead_and_runs_at_most_its_parallelism() {
    let (srv, c, env, dir) = deploying_env(
        "ahead",
        json!({"agent_map": {WEB: "external"}, "agent_parallelism": 2}),
    )
    .await;
    let d = dir.path().display().to_string();
    let t = c
        .create_agent_token("agent", &env, &[WEB.to_string()])
        .await
        .unwrap();
    let token = t["secret"].as_str().unwrap().to_string();
    let mut agent = crate::support::AgentProc(
        std::process::Command::new(steward_bin())
            .args(["agent", "run", "--name", WEB])
            .env("STEWARD_SERVER", &srv.url)
            .env("STEWARD_TOKEN", &token)
            .env("STEWARD_ENV", &env)
            .env("STEWARD_AGENT_DIR", dir.path().join("work"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let n = 8;
    // each command logs when it starts and ends (nanoseconds)
    let resources = (0..n)
        .map(|i| {
            exec_run(
                WEB,
                &format!(
                    "sh -c 'echo \"$(date +%s%N) 1\" >> {d}/log; sleep 0.4; echo \"$(date +%s%N) -1\" >> {d}/log; touch {d}/done{i}'"
                ),
                json!({"unless": format!("test -f {d}/done{i}")}),
                &[],
            )
        })
        .collect();
    eventually(20, "the agent to be primary", || async {
        let a = c.agents(&env).await.ok()?;
        a["agents"].as_array()?.iter().find(|x| x["name"] == WEB)?["primary"]
            .as_str()
            .map(|_| ())
    })
    .await;
    let v = upload(&c, &env, resources).await;
    // the server hands the process more than it may run at once
    let held = eventually(20, "actions handed out ahead", || async {
        let a = c.agents(&env).await.ok()?;
        let p =
            a["agents"].as_array()?.iter().find(|x| x["name"] == WEB)?["processes"][0]["in_flight"]
                .as_u64()?;
        (p > 3).then_some(p)
    })
    .await;
    assert!(held <= n as u64, "{held}");
    wait_deployed(&c, &env, v, 60).await;
    // … and it ran at most 2 at once (and did use both slots)
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    let mut events: Vec<(u128, i32)> = log
        .lines()
        .map(|l| {
            let (t, e) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), e.parse().unwrap())
        })
        .collect();
    assert_eq!(events.len(), 2 * n, "{log}");
    events.sort();
    let (mut now, mut most) = (0, 0);
    for (_, e) in events {
        now += e;
        most = most.max(now);
    }
    assert_eq!(
        most, 2,
        "at most agent_parallelism at once, and both used:\n{log}"
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_that_opens_its_session_again_gets_its_work_again_and_reports_once() {
    let (srv, c, env, dir) = deploying_env("reopen", json!({"agent_map": {WEB: "external"}})).await;
    let t = c
        .create_agent_token("agent", &env, &[WEB.to_string()])
        .await
        .unwrap();
    let agent = srv.client(t["secret"].as_str());
    let hello = Hello {
        instance: uuid::Uuid::new_v4(),
        agents: vec![WEB.into()],
        host: "test".into(),
        version: "test".into(),
    };
    let first = agent.agent_open(&env, &hello).await.unwrap();
    let term = first.primary[WEB];
    assert!(
        first.lease_ms > 0 && first.lease_ms <= 3000,
        "{}",
        first.lease_ms
    );
    let path = dir.path().join("f").display().to_string();
    let file = fs_file(WEB, &path, "x\n", &[]);
    let rid = file.id.0.clone();
    let v = upload(&c, &env, vec![file]).await;
    let wait = Poll {
        results: vec![],
        wait_ms: 1000,
        ..Poll::default()
    };
    let work = eventually(20, "the action", || async {
        let r = agent.agent_poll(&env, hello.instance, &wait).await.unwrap();
        r.work.into_iter().next()
    })
    .await;
    assert_eq!(work.term, term);
    // the answer that carried it "was lost": the process opens its session again
    let again = agent.agent_open(&env, &hello).await.unwrap();
    assert_eq!(again.primary[WEB], term, "still primary, same term");
    let ids: Vec<_> = again.work.iter().map(|a| a.item.action_id).collect();
    assert_eq!(ids, vec![work.item.action_id], "handed out again, once");
    // a poll that uses an earlier renewal of the lease says what is left of it
    tokio::time::sleep(Duration::from_millis(400)).await;
    let quiet = Poll {
        results: vec![],
        wait_ms: 0,
        ..Poll::default()
    };
    let r = agent
        .agent_poll(&env, hello.instance, &quiet)
        .await
        .unwrap();
    assert!(r.work.is_empty(), "nothing twice: {:?}", r.work);
    assert!(
        r.lease_ms <= 2700,
        "what is left of the lease: {}",
        r.lease_ms
    );
    // the result is taken once
    let now = chrono::Utc::now();
    let report = Report {
        agent: WEB.into(),
        term,
        result: WorkResult {
            action_id: work.item.action_id,
            outcome: Outcome::Deployed,
            change: Change::Nochange,
            changes: Default::default(),
            messages: vec![],
            started_at: now,
            finished_at: now,
            state: None,
            facts: vec![],
        },
    };
    let twice = Poll {
        results: vec![report.clone(), report],
        wait_ms: 0,
        ..Poll::default()
    };
    agent
        .agent_poll(&env, hello.instance, &twice)
        .await
        .unwrap();
    let p = wait_deployed(&c, &env, v, 20).await;
    assert_eq!(p["by_status"]["deployed"], 1, "{p}");
    let acts = crate::deploy::deploy_actions(&c, &env, &rid).await;
    assert_eq!(
        acts.iter().filter(|a| a.status == "deployed").count(),
        1,
        "{acts:?}"
    );
}
