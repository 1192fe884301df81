//! Work sent ahead to an executor does not start once its agent is paused or the environment
//! halted. An executor is given a few actions at once (the one it runs, the next ones waiting
//! in its input: `LOCAL_DEPTH`, `SSH_DEPTH`); a pause that came while they waited used to let
//! them run all the same. Each test keeps an executor busy with a slow command while files
//! wait behind it, pauses (or halts), and checks that no file is written until the agent may
//! run again, on this machine and over SSH.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::deploy::{deploy_actions, deploying_env, upload};
use crate::ssh_support::Sshd;
use crate::support::{eventually, exec_run, fs_file, wait_deployed};

const FILES: usize = 5;
const AGENT: &str = "localhost";

#[derive(Clone, Copy)]
enum Stop {
    Pause,
    Halt,
}

fn written(d: &str) -> BTreeSet<usize> {
    (0..FILES)
        .filter(|i| std::path::Path::new(&format!("{d}/f{i}")).exists())
        .collect()
}

/// The slow command first, then the files (the order they are queued in): with one action
/// at a time, the files are sent to the executor while the command runs.
async fn sent_ahead_work_waits_for_the_agent(
    c: &steward::client::Client,
    env: &str,
    agent: &str,
    d: &str,
    stop: Stop,
) {
    let mut model = vec![exec_run(
        agent,
        &format!("sh -c 'touch {d}/started; sleep 2; touch {d}/ended'"),
        json!({}),
        &[],
    )];
    model.extend((0..FILES).map(|i| fs_file(agent, &format!("{d}/f{i}"), "content\n", &[])));
    let v = upload(c, env, model).await;
    eventually(60, "the slow command to start", || async {
        std::path::Path::new(&format!("{d}/started"))
            .exists()
            .then_some(())
    })
    .await;
    match stop {
        Stop::Pause => c.set_paused(env, agent, true).await.unwrap(),
        Stop::Halt => c.set_halted(env, true).await.unwrap(),
    };
    let before = written(d);
    assert!(
        before.len() < FILES,
        "every file was written before the slow command started: nothing waited behind it, so this run shows nothing"
    );
    eventually(30, "the slow command to end", || async {
        std::path::Path::new(&format!("{d}/ended"))
            .exists()
            .then_some(())
    })
    .await;
    // what waited behind it would start within milliseconds if it were not withdrawn
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        written(d),
        before,
        "work that waited in the executor ran after the agent was stopped"
    );
    let p = c.progress(env, v).await.unwrap();
    assert_eq!(p["done"], false, "{p}");
    match stop {
        Stop::Pause => c.set_paused(env, agent, false).await.unwrap(),
        Stop::Halt => c.set_halted(env, false).await.unwrap(),
    };
    let p = wait_deployed(c, env, v, 60).await;
    assert_eq!(p["by_status"]["deployed"], (FILES + 1) as i64, "{p}");
    assert_eq!(written(d).len(), FILES);
    // a withdrawn action left no record: each file was deployed once, and no action of
    // it stays "deploying"
    for i in 0..FILES {
        let rid = format!("fs::File[{agent},path={d}/f{i}]");
        let actions = deploy_actions(c, env, &rid).await;
        assert_eq!(actions.len(), 1, "{rid}: {actions:?}");
        assert_eq!(actions[0].status, "deployed", "{rid}: {actions:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_agent_starts_nothing_that_waited_in_its_executor() {
    let (_srv, c, env, dir) = deploying_env("withdraw-pause", json!({})).await;
    let d = dir.path().display().to_string();
    sent_ahead_work_waits_for_the_agent(&c, &env, AGENT, &d, Stop::Pause).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_halted_environment_starts_nothing_that_waited_in_an_executor() {
    let (_srv, c, env, dir) = deploying_env("withdraw-halt", json!({})).await;
    let d = dir.path().display().to_string();
    sent_ahead_work_waits_for_the_agent(&c, &env, AGENT, &d, Stop::Halt).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_ssh_agent_starts_nothing_that_waited_on_its_target() {
    let sshd = Sshd::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let agent = "web1";
    let settings = json!({
        "agent_map": {agent: uri},
        "ssh": {"known_hosts": sshd.known_hosts, "identity": sshd.client_key},
        "ssh_allowed": sshd.allowed(),
    });
    let (_srv, c, env, dir) = deploying_env("withdraw-ssh", settings).await;
    let d = dir.path().display().to_string();
    sent_ahead_work_waits_for_the_agent(&c, &env, agent, &d, Stop::Pause).await;
}
