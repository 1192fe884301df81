//! Work sent ahead to an executor does not start once its agent is paused or the environment
//! halted. An executor is given a few actions at once (the one it runs, the next ones waiting
//! in its input: `LOCAL_DEPTH`, `SSH_DEPTH`); a pause that came while they waited used to let
//! them run all the same. Each test keeps an executor busy with a slow command while files
//! wait behind it, pauses (or halts), and checks that no file is written until the agent may
//! run again: on this machine, over SSH, and in an external agent process (which holds what
//! the server handed out ahead).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::deploy::{deploy_actions, deploying_env, upload};
use crate::ssh_support::Sshd;
use crate::support::{eventually, exec_run, fs_file, steward_bin, wait_deployed};

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

/// The slow command (it touches `started`, then `ended` 2 s later) first, then the files.
fn slow_command_then_files(agent: &str, d: &str) -> Vec<steward::model::Resource> {
    let mut model = vec![exec_run(
        agent,
        &format!("sh -c 'touch {d}/started; sleep 2; touch {d}/ended'"),
        json!({}),
        &[],
    )];
    model.extend((0..FILES).map(|i| fs_file(agent, &format!("{d}/f{i}"), "content\n", &[])));
    model
}

/// Wait (at most `secs`) for the slow command's marker file `name`.
async fn marker(d: &str, name: &str, secs: u64, what: &str) {
    let path = format!("{d}/{name}");
    eventually(secs, what, || async {
        std::path::Path::new(&path).exists().then_some(())
    })
    .await;
}

/// The slow command first, then the files (the order they are queued in): with one action
/// at a time, the files are sent to the executor while the command runs.
async fn sent_ahead_work_waits_for_the_agent(
    c: &steward::client::Client,
    env: &str,
    agent: &str,
    d: &str,
    stop: Stop,
) -> usize {
    let model = slow_command_then_files(agent, d);
    let v = upload(c, env, model).await;
    marker(d, "started", 60, "the slow command to start").await;
    match stop {
        Stop::Pause => c.set_paused(env, agent, true).await.unwrap(),
        Stop::Halt => c.set_halted(env, true).await.unwrap(),
    };
    let before = written(d);
    assert!(
        before.len() < FILES,
        "every file was written before the slow command started: nothing waited behind it, so this run shows nothing"
    );
    marker(d, "ended", 30, "the slow command to end").await;
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
    // each file was deployed once, and no action of it stays "deploying": a withdrawn
    // action left no record, or (handed to an external agent, where it was recorded as
    // started) one that says it was withdrawn
    let mut cancelled = 0;
    for i in 0..FILES {
        let rid = format!("fs::File[{agent},path={d}/f{i}]");
        let actions = deploy_actions(c, env, &rid).await;
        let count = |s: &str| actions.iter().filter(|a| a.status == s).count();
        assert_eq!(count("deployed"), 1, "{rid}: {actions:?}");
        assert_eq!(
            count("deployed") + count("cancelled"),
            actions.len(),
            "{rid}: {actions:?}"
        );
        cancelled += count("cancelled");
    }
    cancelled
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_agent_starts_nothing_that_waited_in_its_executor() {
    let (_srv, c, env, dir) = deploying_env("withdraw-pause", json!({})).await;
    let d = dir.path().display().to_string();
    let cancelled = sent_ahead_work_waits_for_the_agent(&c, &env, AGENT, &d, Stop::Pause).await;
    assert_eq!(cancelled, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_halted_environment_starts_nothing_that_waited_in_an_executor() {
    let (_srv, c, env, dir) = deploying_env("withdraw-halt", json!({})).await;
    let d = dir.path().display().to_string();
    let cancelled = sent_ahead_work_waits_for_the_agent(&c, &env, AGENT, &d, Stop::Halt).await;
    assert_eq!(cancelled, 0);
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
    let cancelled = sent_ahead_work_waits_for_the_agent(&c, &env, agent, &d, Stop::Pause).await;
    assert_eq!(cancelled, 0);
}

/// `steward agent run` hosting `agent`, once it is the agent's primary.
async fn agent_process(
    url: &str,
    c: &steward::client::Client,
    env: &str,
    agent: &str,
    work: &std::path::Path,
) -> crate::support::AgentProc {
    let t = c
        .create_agent_token("agent", env, &[agent.to_string()])
        .await
        .unwrap();
    let process = crate::support::AgentProc(
        std::process::Command::new(steward_bin())
            .args(["agent", "run", "--name", agent])
            .env("STEWARD_SERVER", url)
            .env("STEWARD_TOKEN", t["secret"].as_str().unwrap())
            .env("STEWARD_ENV", env)
            .env("STEWARD_AGENT_DIR", work)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    eventually(30, "the agent process to be primary", || async {
        let a = c.agents(env).await.ok()?;
        a["agents"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == agent)?["primary"]
            .as_str()
            .map(|_| ())
    })
    .await;
    process
}

/// An external agent process holds up to `AHEAD` actions beyond what it runs: those are
/// given back too.
async fn external_agent_holds_nothing_back(stop: Stop) {
    let agent = "web";
    let (srv, c, env, dir) = deploying_env(
        "withdraw-external",
        json!({"agent_map": {agent: "external"}}),
    )
    .await;
    let d = dir.path().join("files");
    std::fs::create_dir(&d).unwrap();
    let d = d.display().to_string();
    let _process = agent_process(&srv.url, &c, &env, agent, &dir.path().join("work")).await;
    let cancelled = sent_ahead_work_waits_for_the_agent(&c, &env, agent, &d, stop).await;
    assert!(
        cancelled > 0,
        "no action handed out ahead was given back: the files were not held by the process"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_external_agent_gives_back_what_it_held() {
    external_agent_holds_nothing_back(Stop::Pause).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_halted_environment_takes_back_what_an_external_agent_held() {
    external_agent_holds_nothing_back(Stop::Halt).await;
}

/// A process that went silent (stopped, cut off) past its session while it held actions, which
/// the server withdrew meanwhile, starts none of them when it comes back: it drops what it
/// held when it opens its session again, and the server hands out what is still its own.
#[tokio::test(flavor = "multi_thread")]
async fn an_external_agent_back_from_silence_starts_nothing_withdrawn_meanwhile() {
    let agent = "web";
    let (srv, c, env, dir) =
        deploying_env("withdraw-silent", json!({"agent_map": {agent: "external"}})).await;
    let d = dir.path().join("files");
    std::fs::create_dir(&d).unwrap();
    let d = d.display().to_string();
    let process = agent_process(&srv.url, &c, &env, agent, &dir.path().join("work")).await;
    let pid = process.id() as libc::pid_t;
    let model = slow_command_then_files(agent, &d);
    let v = upload(&c, &env, model).await;
    marker(&d, "started", 60, "the slow command to start").await;
    // the process holds the files; it stops answering until the server forgets its session
    // SAFETY: signals to the agent process this test started
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    eventually(30, "the server to drop the silent session", || async {
        let a = c.agents(&env).await.ok()?;
        let web = a["agents"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == agent)?;
        web["processes"].as_array()?.is_empty().then_some(())
    })
    .await;
    c.set_paused(&env, agent, true).await.unwrap();
    let before = written(&d);
    assert!(
        before.len() < FILES,
        "every file was written before the stop"
    );
    // SAFETY: as above
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    // back: it opens its session again (its result of the command goes in)
    eventually(30, "the process to be back", || async {
        let a = c.agents(&env).await.ok()?;
        let web = a["agents"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == agent)?;
        (!web["processes"].as_array()?.is_empty()).then_some(())
    })
    .await;
    marker(&d, "ended", 30, "the slow command to end").await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        written(&d),
        before,
        "a process back from silence ran actions withdrawn while it was away"
    );
    c.set_paused(&env, agent, false).await.unwrap();
    let p = wait_deployed(&c, &env, v, 60).await;
    assert_eq!(p["by_status"]["deployed"], (FILES + 1) as i64, "{p}");
    assert_eq!(written(&d).len(), FILES);
}
