//! External agents: real `steward agent run` processes connected to a real server, deploying
//! real files; agent tokens, the election of a primary, takeover after kill -9, fencing of a
//! stopped primary, and revocation.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use steward::client::Client;

use crate::deploy::{deploy_actions, deploying_env, upload};
use crate::support::{TestServer, eventually, exec_run, fs_file, steward_bin, wait_deployed};

const WEB: &str = "web";

/// A `steward agent run` process hosting `names`, its log in `log`.
pub fn spawn_agent(
    srv: &TestServer,
    token: &str,
    env: &str,
    names: &[&str],
    dir: &Path,
    log: &str,
) -> crate::support::AgentProc {
    let mut cmd = Command::new(steward_bin());
    cmd.args(["agent", "run"]);
    for n in names {
        cmd.args(["--name", n]);
    }
    cmd.env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", token)
        .env("STEWARD_ENV", env)
        .env("STEWARD_AGENT_DIR", dir.join(format!("{log}.work")))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{log}.log"))).unwrap())
        .spawn()
        .map(crate::support::AgentProc)
        .expect("spawn steward agent run")
}

fn log_of(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

async fn agent_token(c: &Client, env: &str, agents: &[&str]) -> String {
    let names: Vec<String> = agents.iter().map(|s| s.to_string()).collect();
    let t = c.create_agent_token("agent", env, &names).await.unwrap();
    t["secret"].as_str().unwrap().to_string()
}

/// Wait for the agent to have a primary; its instance id.
async fn wait_primary(c: &Client, env: &str) -> String {
    eventually(20, "a primary", || async {
        agent_view(c, env, WEB).await["primary"]
            .as_str()
            .map(str::to_string)
    })
    .await
}

/// Wait for `n` processes hosting the agent.
async fn wait_processes(c: &Client, env: &str, n: usize) {
    eventually(20, "the agent processes to connect", || async {
        (agent_view(c, env, WEB).await["processes"].as_array()?.len() == n).then_some(())
    })
    .await
}

/// The agent as `GET …/agents` shows it.
async fn agent_view(c: &Client, env: &str, name: &str) -> serde_json::Value {
    let a = c.agents(env).await.unwrap();
    a["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_external_agent_deploys_what_waited_for_it() {
    let (srv, c, env, dir) = deploying_env("ext", json!({"agent_map": {WEB: "external"}})).await;
    let d = dir.path().display().to_string();
    let files: Vec<_> = (0..3)
        .map(|i| fs_file(WEB, &format!("{d}/f{i}"), &format!("content {i}"), &[]))
        .collect();
    let v = upload(&c, &env, files).await;
    // no process yet: the agent is down and its resources wait, they do not fail
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = c.progress(&env, v).await.unwrap();
    assert_eq!(p["by_status"]["available"], 3, "{p}");
    assert_eq!(p["failed"], 0, "{p}");
    let a = agent_view(&c, &env, WEB).await;
    assert_eq!(a["state"], "down", "{a}");
    assert_eq!(a["placement"], "external", "{a}");
    assert!(!Path::new(&format!("{d}/f0")).exists());

    let token = agent_token(&c, &env, &[WEB]).await;
    let mut agent = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a1");
    wait_deployed(&c, &env, v, 30).await;
    for i in 0..3 {
        assert_eq!(
            std::fs::read_to_string(format!("{d}/f{i}")).unwrap(),
            format!("content {i}")
        );
    }
    // the action log came back through the API, as from a local executor
    let rid = format!("fs::File[{WEB},path={d}/f0]");
    let acts = deploy_actions(&c, &env, &rid).await;
    assert_eq!(acts.len(), 1, "{acts:?}");
    assert_eq!(acts[0].status, "deployed");
    assert_eq!(acts[0].change, "created");
    let a = agent_view(&c, &env, WEB).await;
    assert_eq!(a["processes"].as_array().unwrap().len(), 1, "{a}");
    assert_eq!(a["primary"], a["processes"][0]["instance"], "{a}");
    assert_eq!(a["last_result"], "deployed", "{a}");
    assert_eq!(a["processes"][0]["version"], env!("CARGO_PKG_VERSION"));
    // the CLI shows the same
    let out = Command::new(steward_bin())
        .args(["agent", "list"])
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .env("STEWARD_ENV", &env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("external") && text.contains('*'), "{text}");
    // drift is repaired through the agent too
    std::fs::write(format!("{d}/f1"), "drifted").unwrap();
    c.trigger(&env, true, None, None).await.unwrap();
    eventually(20, "the repair through the agent", || async {
        (std::fs::read_to_string(format!("{d}/f1")).ok()? == "content 1").then_some(())
    })
    .await;
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_tokens_host_only_their_agents_of_their_environment() {
    let (srv, c, env, dir) = deploying_env("tok", json!({"agent_map": {WEB: "external"}})).await;
    let other = crate::deploy::env_with(&c, "tok-other", json!({})).await;
    let token = agent_token(&c, &env, &[WEB]).await;
    // another agent of the same environment: refused
    let mut a = spawn_agent(&srv, &token, &env, &["db"], dir.path(), "db");
    let status = tokio::task::spawn_blocking(move || a.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(
        log_of(dir.path(), "db").contains("may not host agent 'db'"),
        "{}",
        log_of(dir.path(), "db")
    );
    // its agent in another environment: refused
    let mut b = spawn_agent(&srv, &token, &other, &[WEB], dir.path(), "other");
    let status = tokio::task::spawn_blocking(move || b.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "{}", log_of(dir.path(), "other"));
    // a viewer token hosts nothing
    let viewer = c.create_token("v", "viewer", Some(&env)).await.unwrap();
    let mut v = spawn_agent(
        &srv,
        viewer["secret"].as_str().unwrap(),
        &env,
        &[WEB],
        dir.path(),
        "viewer",
    );
    let status = tokio::task::spawn_blocking(move || v.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "{}", log_of(dir.path(), "viewer"));
}

/// Slow commands: each notes that it ran in `runs<i>`, then (after `secs[i]`) writes `out<i>`,
/// unless `out<i>` exists (the guard a re-run checks first).
fn slow_commands(d: &str, secs: &[f64]) -> Vec<steward::model::Resource> {
    secs.iter()
        .enumerate()
        .map(|(i, s)| {
            exec_run(
                WEB,
                &format!("sh -c 'echo run >> {d}/runs{i}; sleep {s}; echo done >> {d}/out{i}'"),
                json!({"unless": format!("test -f {d}/out{i}")}),
                &[],
            )
        })
        .collect()
}

/// Lines in `<prefix><i>` for each i.
fn lines(d: &str, prefix: &str, n: usize) -> Vec<usize> {
    (0..n)
        .map(|i| {
            std::fs::read_to_string(format!("{d}/{prefix}{i}"))
                .map(|t| t.lines().count())
                .unwrap_or(0)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_takes_over_when_the_primary_is_killed_mid_deploy() {
    let (srv, c, env, dir) = deploying_env("elect", json!({"agent_map": {WEB: "external"}})).await;
    let d = dir.path().display().to_string();
    let token = agent_token(&c, &env, &[WEB]).await;
    let mut a1 = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a1");
    wait_primary(&c, &env).await;
    let mut a2 = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a2");
    wait_processes(&c, &env, 2).await;
    let a = agent_view(&c, &env, WEB).await;
    let primary = a["primary"].as_str().unwrap().to_string();
    let n = 20;
    let v = upload(&c, &env, slow_commands(&d, &[0.25; 20])).await;
    // a few done: kill -9 the primary in the middle of the deploy
    eventually(30, "some commands to run", || async {
        (lines(&d, "out", n).iter().filter(|&&l| l > 0).count() >= 4).then_some(())
    })
    .await;
    // which process is primary: its log names its instance
    let (primary_child, standby_child) = if log_of(dir.path(), "a1").contains(&primary) {
        (&mut a1, &mut a2)
    } else {
        (&mut a2, &mut a1)
    };
    signal(primary_child, "-9");
    primary_child.wait().unwrap();
    let killed = Instant::now();
    // the standby takes the lease over and finishes
    let new_primary = eventually(10, "the standby to become primary", || async {
        let p = agent_view(&c, &env, WEB).await["primary"]
            .as_str()?
            .to_string();
        (p != primary).then_some(p)
    })
    .await;
    let takeover = killed.elapsed();
    println!("takeover after kill -9 of the primary: {takeover:?}");
    assert!(
        takeover < Duration::from_secs(5),
        "takeover took {takeover:?}"
    );
    wait_deployed(&c, &env, v, 60).await;
    // every command completed exactly once: nothing twice, nothing lost; only the one the
    // kill interrupted may have started twice (its first run died with the primary)
    assert_eq!(
        lines(&d, "out", n),
        vec![1; n],
        "one completion per command"
    );
    let runs = lines(&d, "runs", n);
    assert!(
        runs.iter().all(|&r| (1..=2).contains(&r)) && runs.iter().filter(|&&r| r > 1).count() <= 1,
        "runs per command: {runs:?}"
    );
    let p = c.progress(&env, v).await.unwrap();
    assert_eq!(p["by_status"]["deployed"], n, "{p}");
    assert_ne!(new_primary, primary);
    standby_child.kill().unwrap();
    standby_child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_primary_is_fenced_when_it_comes_back() {
    let (srv, c, env, dir) = deploying_env("fence", json!({"agent_map": {WEB: "external"}})).await;
    let d = dir.path().display().to_string();
    let token = agent_token(&c, &env, &[WEB]).await;
    let mut a1 = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a1");
    wait_primary(&c, &env).await;
    let first = agent_view(&c, &env, WEB).await["primary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(log_of(dir.path(), "a1").contains(&first), "a1 is primary");
    let mut a2 = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a2");
    wait_processes(&c, &env, 2).await;
    // the first command is slow: the primary is stopped while its executor runs it
    let mut secs = vec![0.1; 8];
    secs[0] = 2.0;
    let n = secs.len();
    let v = upload(&c, &env, slow_commands(&d, &secs)).await;
    eventually(30, "the slow command to start", || async {
        (lines(&d, "runs", n)[0] == 1).then_some(())
    })
    .await;
    signal(&a1, "-STOP");
    eventually(15, "the standby to take over", || async {
        let p = agent_view(&c, &env, WEB).await["primary"]
            .as_str()?
            .to_string();
        (p != first).then_some(())
    })
    .await;
    wait_deployed(&c, &env, v, 60).await;
    // the stopped primary comes back with the result of the slow command
    signal(&a1, "-CONT");
    eventually(15, "the old primary to be refused", || async {
        log_of(dir.path(), "a1")
            .contains("no longer held")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // it started nothing after it came back: every command ran once, by one process
    assert_eq!(
        lines(&d, "out", n),
        vec![1; n],
        "one completion per command"
    );
    assert_eq!(lines(&d, "runs", n), vec![1; n], "one run per command");
    let slow = format!(
        "exec::Run[{WEB},command=sh -c 'echo run >> {d}/runs0; sleep 2; echo done >> {d}/out0']"
    );
    let acts = deploy_actions(&c, &env, &slow).await;
    assert!(
        acts.iter().all(|a| a.status != "deploying"),
        "the slow command's actions are settled: {acts:?}"
    );
    for child in [&mut a1, &mut a2] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_disconnects_its_process_within_a_second() {
    let (srv, c, env, dir) = deploying_env("revoke", json!({"agent_map": {WEB: "external"}})).await;
    let token = agent_token(&c, &env, &[WEB]).await;
    let mut a = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a");
    wait_primary(&c, &env).await;
    let id = c
        .tokens(Some(&env), false)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.role == steward::model::Role::Agent)
        .unwrap()
        .id;
    let revoked = Instant::now();
    c.revoke_token(&id.to_string()).await.unwrap();
    let status = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(s) = a.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = a.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    let took = revoked.elapsed();
    println!("revoked token: its process ended {took:?} after the revocation");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "{}",
        log_of(dir.path(), "a")
    );
    assert!(
        took < Duration::from_millis(1500),
        "disconnected after {took:?}"
    );
    let view = agent_view(&c, &env, WEB).await;
    assert_eq!(
        view["processes"].as_array().map(|p| p.len()),
        Some(0),
        "{view}"
    );
    // and it is refused if it comes back
    let mut again = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "again");
    let status = tokio::task::spawn_blocking(move || again.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(log_of(dir.path(), "again").contains("unknown or revoked token"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_process_reconnects_after_the_server_restarts() {
    let admin = "stw_agents_restart_admin";
    let mut srv = crate::support::Spawned::start(admin).await;
    let c = srv.client.clone();
    let env = crate::deploy::env_with(&c, "restart", json!({"agent_map": {WEB: "external"}})).await;
    let token = agent_token(&c, &env, &[WEB]).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let mut cmd = Command::new(steward_bin());
    cmd.args(["agent", "run", "--name", WEB])
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", &token)
        .env("STEWARD_ENV", &env)
        .env("STEWARD_AGENT_DIR", dir.path().join("work"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("a.log")).unwrap());
    let mut agent = crate::support::AgentProc(cmd.spawn().unwrap());
    let v1 = upload(&c, &env, vec![fs_file(WEB, &format!("{d}/one"), "1", &[])]).await;
    wait_deployed(&c, &env, v1, 30).await;
    // the server dies and comes back: the process reconnects by itself
    srv.restart().await;
    let v2 = upload(
        &c,
        &env,
        vec![
            fs_file(WEB, &format!("{d}/one"), "1", &[]),
            fs_file(WEB, &format!("{d}/two"), "2", &[]),
        ],
    )
    .await;
    wait_deployed(&c, &env, v2, 60).await;
    assert_eq!(std::fs::read_to_string(format!("{d}/two")).unwrap(), "2");
    let log = log_of(dir.path(), "a");
    assert!(
        log.matches("connected to the server").count() >= 2,
        "it reconnected: {log}"
    );
    assert!(agent.try_wait().unwrap().is_none(), "it kept running");
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_action_on_an_external_agent_times_out_and_is_killed_there() {
    let (srv, c, env, dir) = deploying_env(
        "ext-timeout",
        json!({"agent_map": {WEB: "external"}, "handler_timeout": 2,
               "retry_backoff": {"initial": 600, "factor": 1.0, "max": 600}}),
    )
    .await;
    let token = agent_token(&c, &env, &[WEB]).await;
    let mut agent = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a");
    let marker = format!("{}/hung-marker", dir.path().display());
    let run = exec_run(
        WEB,
        &format!("sh -c 'sleep 600 # {marker}'"),
        json!({}),
        &[],
    );
    let rid = run.id.0.clone();
    upload(&c, &env, vec![run]).await;
    let acts = eventually(30, "the action to time out", || async {
        let acts = deploy_actions(&c, &env, &rid).await;
        acts.iter().any(|a| a.status == "timed_out").then_some(acts)
    })
    .await;
    assert!(
        serde_json::to_string(&acts)
            .unwrap()
            .contains("did not finish within 2 s"),
        "{acts:?}"
    );
    // the agent killed its executor and the command it ran
    eventually(
        10,
        "the hung command to be killed on the agent's machine",
        || async {
            crate::ssh_support::pids_with_cmdline(marker.as_bytes())
                .is_empty()
                .then_some(())
        },
    )
    .await;
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agents_stay_consistent_and_bounded_while_primaries_keep_dying() {
    let (srv, c, env, dir) = deploying_env("churn", json!({"agent_map": {WEB: "external"}})).await;
    let d = dir.path().display().to_string();
    let token = agent_token(&c, &env, &[WEB]).await;
    let mut procs: Vec<(String, crate::support::AgentProc)> = Vec::new();
    for name in ["p0", "p1"] {
        procs.push((
            name.into(),
            spawn_agent(&srv, &token, &env, &[WEB], dir.path(), name),
        ));
    }
    wait_processes(&c, &env, 2).await;
    let n = 40;
    let v = upload(&c, &env, slow_commands(&d, &[0.15; 40])).await;
    let mut kills = 0;
    // for about 20 s: kill -9 whichever process is primary, start a new one
    for round in 0..4 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let primary = eventually(15, "a primary", || async {
            agent_view(&c, &env, WEB).await["primary"]
                .as_str()
                .map(str::to_string)
        })
        .await;
        let Some(pos) = procs
            .iter()
            .position(|(name, _)| log_of(dir.path(), name).contains(&primary))
        else {
            continue;
        };
        let (_, mut child) = procs.remove(pos);
        signal(&child, "-9");
        child.wait().unwrap();
        kills += 1;
        let name = format!("p{}", round + 2);
        let fresh = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), &name);
        procs.push((name, fresh));
    }
    wait_deployed(&c, &env, v, 90).await;
    // every command completed once; the agent runs one action at a time, so each kill
    // cut at most one command short, which then started again: one extra start per kill at
    // most (two kills can hit the same command, when the second primary is killed right
    // after it took that command over)
    assert_eq!(
        lines(&d, "out", n),
        vec![1; n],
        "one completion per command"
    );
    let runs = lines(&d, "runs", n);
    let extra: usize = runs.iter().map(|&r| r.saturating_sub(1)).sum();
    assert!(
        runs.iter().all(|&r| r >= 1) && extra <= kills,
        "{extra} extra starts for {kills} kills: {runs:?}"
    );
    // bounded: one lease row for the agent, and only live processes listed
    let leases: i64 = sqlx::query_scalar("SELECT count(*) FROM leases")
        .fetch_one(&srv.pool)
        .await
        .unwrap();
    assert_eq!(leases, 1);
    eventually(15, "dead processes to be dropped", || async {
        (agent_view(&c, &env, WEB).await["processes"]
            .as_array()?
            .len()
            == 2)
            .then_some(())
    })
    .await;
    for (_, mut child) in procs {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_backs_off_while_the_server_is_away_and_comes_back_quickly() {
    let admin = "stw_agents_backoff_admin";
    let mut srv = crate::support::Spawned::start(admin).await;
    let c = srv.client.clone();
    let env = crate::deploy::env_with(&c, "away", json!({"agent_map": {WEB: "external"}})).await;
    let token = agent_token(&c, &env, &[WEB]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = crate::support::AgentProc(
        Command::new(steward_bin())
            .args(["agent", "run", "--name", WEB])
            .env("STEWARD_SERVER", &srv.url)
            .env("STEWARD_TOKEN", &token)
            .env("STEWARD_ENV", &env)
            .env("STEWARD_AGENT_DIR", dir.path().join("work"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("a.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    eventually(20, "connected", || async {
        log_of(dir.path(), "a")
            .contains("connected to the server")
            .then_some(())
    })
    .await;
    // the server is away for 15 s: retries back off (0.5, 1, 2, 4, 5, 5 … s), not a storm
    srv.kill9();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let attempts = log_of(dir.path(), "a")
        .matches("can not reach the server")
        .count();
    assert!(
        (4..=9).contains(&attempts),
        "{attempts} attempts in 15 s: {}",
        log_of(dir.path(), "a")
    );
    // back: reconnected within the longest backoff, and it deploys
    let back = Instant::now();
    srv.restart().await;
    eventually(10, "reconnected", || async {
        (log_of(dir.path(), "a")
            .matches("connected to the server")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    assert!(
        back.elapsed() < Duration::from_secs(8),
        "{:?}",
        back.elapsed()
    );
    let d = dir.path().display().to_string();
    let v = upload(
        &c,
        &env,
        vec![fs_file(WEB, &format!("{d}/after"), "x", &[])],
    )
    .await;
    wait_deployed(&c, &env, v, 30).await;
    assert!(agent.try_wait().unwrap().is_none());
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_places_an_agent_with_std_agent_config_and_the_setting_wins() {
    let (srv, c, env, dir) = deploying_env("model-placed", json!({})).await;
    let d = dir.path().display().to_string();
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("project.yml"), "name: placed\n").unwrap();
    std::fs::write(
        project.join("main.cf"),
        format!(
            "import fs\n\
             std::AgentConfig(agentname=\"{WEB}\", uri=\"external\", autostart=true)\n\
             web = std::Host(name=\"{WEB}\", os=std::linux)\n\
             fs::File(host=web, path=\"{d}/placed\", content=\"by the model\", mode=644, owner=null, group=null)\n"
        ),
    )
    .unwrap();
    let out = Command::new(steward_bin())
        .args(["export", "-d"])
        .current_dir(&project)
        .env("XDG_CACHE_HOME", srv.client_cache())
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .env("STEWARD_ENV", &env)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = eventually(20, "the agent to be placed", || async {
        let a = agent_view(&c, &env, WEB).await;
        (a["placement"] == "external").then_some(a)
    })
    .await;
    assert_eq!(a["state"], "down", "waits for its process: {a}");
    let token = agent_token(&c, &env, &[WEB]).await;
    let mut agent = spawn_agent(&srv, &token, &env, &[WEB], dir.path(), "a");
    let v = c.versions(&env).await.unwrap()[0]["number"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&c, &env, v, 30).await;
    assert_eq!(
        std::fs::read_to_string(format!("{d}/placed")).unwrap(),
        "by the model"
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
    // the setting wins over the model
    c.update_settings(&env, &json!({"agent_map": {WEB: "local:"}}))
        .await
        .unwrap();
    eventually(20, "the setting to win", || async {
        (agent_view(&c, &env, WEB).await["placement"] == "local:").then_some(())
    })
    .await;
}

/// A restarted server places the agents its model's `std::AgentConfig` places, as before
/// (a scheduler reads most attributes after it starts, but these before it places agents:
/// an external agent's actions must never run on the server meanwhile).
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_the_model_places_stays_placed_after_a_restart() {
    let mut srv = crate::support::Spawned::start("stw_agents_placed_restart_admin").await;
    let c = srv.client.clone();
    let env = crate::deploy::env_with(&c, "placed-restart", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let config = steward::model::Resource {
        id: steward::model::ResourceId(format!("std::AgentConfig[internal,agentname={WEB}]")),
        type_name: "std::AgentConfig".into(),
        agent: "internal".into(),
        attributes: json!({"agentname": WEB, "uri": "external", "autostart": true,
            "purged": false, "send_event": false, "receive_events": true})
        .as_object()
        .unwrap()
        .clone(),
        requires: Vec::new(),
    };
    let file = fs_file(WEB, &format!("{d}/placed"), "placed", &[]);
    upload(&c, &env, vec![config.clone(), file.clone()]).await;
    eventually(20, "the agent to be placed", || async {
        (agent_view(&c, &env, WEB).await["placement"] == "external").then_some(())
    })
    .await;
    srv.restart().await;
    let a = eventually(20, "the restarted scheduler to answer", || async {
        let a = c.agents(&env).await.ok()?;
        a["agents"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == WEB)
            .cloned()
    })
    .await;
    assert_eq!(a["placement"], "external", "{a}");
    // and nothing ran on the server in its place meanwhile
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!dir.path().join("placed").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn module_handler_code_reaches_an_external_agent_by_digest() {
    // examples/integration: an INI file managed by a module's own Python handler, on agent
    // "localhost", here placed external
    let (srv, c, env, dir) =
        deploying_env("ext-code", json!({"agent_map": {"localhost": "external"}})).await;
    let ex = crate::integration::example();
    let x = ex.export();
    assert!(!x.handlers.is_empty(), "the example ships handler code");
    let v = c.upload(&env, &x, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let token = agent_token(&c, &env, &["localhost"]).await;
    let mut agent = spawn_agent(&srv, &token, &env, &["localhost"], dir.path(), "a");
    wait_deployed(&c, &env, v, 60).await;
    assert!(ex.ini().contains("db.internal"), "{}", ex.ini());
    // fetched from the server, checked, and cached under the agent's work dir by digest
    let digest = &x.handlers.values().next().unwrap().digest;
    let cached = dir.path().join("a.work/code").join(digest);
    assert!(cached.join(".complete").is_file(), "{}", cached.display());
    agent.kill().unwrap();
    agent.wait().unwrap();
}

/// An agent process may not make the server keep a lease row per name it can think of
/// (issue 28, defect 4): 50,000 names, a 900 KB name, a name with a bidirectional override
/// or twice the same name are refused with 422 and a reason, before anything is stored; a
/// session of 1000 agents works; the leases and list entries of agents no version uses go
/// once their process is gone, while those of agents in use stay.
#[tokio::test(flavor = "multi_thread")]
async fn agent_sessions_are_bounded_and_unused_agents_leave_no_rows_behind() {
    let (srv, c, env, tmp) =
        deploying_env("bounded", json!({"agent_map": {WEB: "external"}})).await;
    // one agent in use: a version deploys to it (through an external process)
    let v = upload(
        &c,
        &env,
        vec![fs_file(
            WEB,
            tmp.path().join("f").to_str().unwrap(),
            "x",
            &[],
        )],
    )
    .await;
    let _ = v;
    let hello = |agents: Vec<String>| steward::scheduler::agents::Hello {
        instance: uuid::Uuid::new_v4(),
        agents,
        host: "test".into(),
        version: "test".into(),
    };
    let leases = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM leases WHERE kind = 'agent'")
            .fetch_one(&srv.pool)
            .await
            .unwrap()
    };
    let refused = |r: steward::client::Result<steward::scheduler::agents::PollReply>| {
        let e = r.expect_err("refused");
        assert_eq!(e.status(), Some(422), "{e}");
        e.to_string()
    };
    let many: Vec<String> = (0..50_000).map(|i| format!("a{i}")).collect();
    let started = Instant::now();
    let e = refused(c.agent_open(&env, &hello(many)).await);
    assert!(e.contains("at most 1000 agents"), "{e}");
    eprintln!("50,000 names refused in {:?}", started.elapsed());
    let e = refused(c.agent_open(&env, &hello(vec!["x".repeat(900_000)])).await);
    assert!(e.contains("1 to 255 characters"), "{e}");
    let e = refused(
        c.agent_open(&env, &hello(vec!["web\u{202e}bad".into()]))
            .await,
    );
    assert!(e.contains("U+202E"), "{e}");
    let e = refused(
        c.agent_open(&env, &hello(vec!["a".into(), "a".into()]))
            .await,
    );
    assert!(e.contains("named twice"), "{e}");
    assert_eq!(leases().await, 0, "nothing stored for refused sessions");

    // 1000 agents, WEB among them: one statement renews them all
    let mut names: Vec<String> = (0..999).map(|i| format!("spare-{i}")).collect();
    names.push(WEB.into());
    let h = hello(names);
    let instance = h.instance;
    let started = Instant::now();
    let reply = c.agent_open(&env, &h).await.unwrap();
    eprintln!("a session of 1000 agents opened in {:?}", started.elapsed());
    assert_eq!(reply.primary.len(), 1000, "{:?}", reply.primary.len());
    assert_eq!(leases().await, 1000);
    c.agent_close(&env, instance).await.unwrap();
    // a process that stops gives its leases back: those of agents nobody deploys to go
    assert_eq!(
        leases().await,
        1,
        "only the lease of the agent in use stays"
    );
    // one that vanishes (its session times out) leaves them to lapse; once they lapsed long
    // enough, retention forgets the unused ones
    let spares: Vec<String> = (0..50).map(|i| format!("spare-{i}")).collect();
    c.agent_open(&env, &hello(spares)).await.unwrap();
    assert_eq!(leases().await, 51);
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 hour' WHERE kind = 'agent'")
        .execute(&srv.pool)
        .await
        .unwrap();
    let pruned = steward::store::retention::prune_all(&srv.pool, None)
        .await
        .unwrap();
    assert!(pruned.agent_leases >= 50, "{pruned:?}");
    let left: Vec<String> =
        sqlx::query_scalar("SELECT key FROM leases WHERE kind = 'agent' ORDER BY key")
            .fetch_all(&srv.pool)
            .await
            .unwrap();
    assert_eq!(
        left,
        vec![format!("{env}/{WEB}")],
        "the term of an agent in use stays"
    );
    let listed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agents WHERE environment_id = $1::uuid AND name LIKE 'spare-%'",
    )
    .bind(&env)
    .fetch_one(&srv.pool)
    .await
    .unwrap();
    assert_eq!(listed, 0, "unused agents stay listed");
}
