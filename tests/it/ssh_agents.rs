//! Agentless over SSH through the scheduler: an environment whose agent is placed
//! `ssh://user@127.0.0.1:PORT` deploys, repairs and dry-runs files on the "target" (a real
//! sshd on a loopback port) through the executor the server ships there; a host key that is
//! not known, or a host that does not answer, fails the actions with a clear error and
//! touches nothing.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::deploy::{deploy_actions, deploying_env, upload};
use crate::ssh_support::{Sshd, closed_port};
use crate::support::{eventually, fs_file, wait_deployed};

const WEB: &str = "web1";

fn settings(uri: &str, sshd: &Sshd, known_hosts: &std::path::Path) -> serde_json::Value {
    json!({
        "agent_map": {WEB: uri},
        "ssh": {"known_hosts": known_hosts, "identity": sshd.client_key},
        // as an operator allows them, with a global admin token
        "ssh_allowed": sshd.allowed(),
        "retry_backoff": {"initial": 60, "factor": 1.0, "max": 60},
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ssh_agent_deploys_repairs_and_dry_runs_on_its_target() {
    let sshd = Sshd::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let (_srv, c, env, dir) = deploying_env("ssh", settings(&uri, &sshd, &sshd.known_hosts)).await;
    let d = dir.path().display().to_string();
    let files: Vec<_> = (0..3)
        .map(|i| fs_file(WEB, &format!("{d}/f{i}"), &format!("remote {i}\n"), &[]))
        .collect();
    let v = upload(&c, &env, files.clone()).await;
    wait_deployed(&c, &env, v, 120).await;
    for i in 0..3 {
        assert_eq!(
            std::fs::read_to_string(format!("{d}/f{i}")).unwrap(),
            format!("remote {i}\n")
        );
    }
    // it ran on the target: the executor shipped there by hash
    let shipped: Vec<_> = sshd
        .files_in_home()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".cache/steward/bin/steward-"))
        .collect();
    assert_eq!(shipped.len(), 1, "{shipped:?}");
    let a = c.agents(&env).await.unwrap();
    let web = a["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == WEB)
        .unwrap();
    assert_eq!(web["placement"], uri.as_str(), "{a}");
    // one connection for everything so far
    let logins = sshd.logins();
    // drift is repaired over the same connection
    std::fs::write(format!("{d}/f1"), "drifted").unwrap();
    c.trigger(&env, true, None, None).await.unwrap();
    eventually(30, "the repair over SSH", || async {
        (std::fs::read_to_string(format!("{d}/f1")).ok()? == "remote 1\n").then_some(())
    })
    .await;
    assert_eq!(sshd.logins(), logins, "the connection is reused");
    // a dry-run of a change reads on the target and changes nothing
    c.update_settings(&env, &json!({"auto_release": false}))
        .await
        .unwrap();
    let mut changed = files.clone();
    changed[2] = fs_file(WEB, &format!("{d}/f2"), "new\n", &[]);
    let v2 = upload(&c, &env, changed).await;
    let started = c.start_dryrun(&env, Some(v2)).await.unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    let report = eventually(30, "the dry-run", || async {
        let r = c.dryrun(&env, &id).await.unwrap();
        (r["complete"] == true).then_some(r)
    })
    .await;
    let f2 = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resource_id"].as_str().unwrap().ends_with("/f2]"))
        .unwrap()
        .clone();
    assert_eq!(
        f2["changes"]["content"]["current"], "remote 2\n",
        "{report:#}"
    );
    assert_eq!(f2["changes"]["content"]["desired"], "new\n");
    assert_eq!(
        std::fs::read_to_string(format!("{d}/f2")).unwrap(),
        "remote 2\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ssh_agent_with_an_unknown_host_key_touches_nothing() {
    let sshd = Sshd::start();
    let empty = sshd.known_hosts_file("empty", "");
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let (_srv, c, env, dir) = deploying_env("ssh-unknown", settings(&uri, &sshd, &empty)).await;
    let path = format!("{}/never", dir.path().display());
    let f = fs_file(WEB, &path, "x", &[]);
    let rid = f.id.0.clone();
    upload(&c, &env, vec![f]).await;
    let acts = eventually(30, "the action to fail", || async {
        let acts = deploy_actions(&c, &env, &rid).await;
        acts.iter()
            .any(|a| a.status == "unavailable")
            .then_some(acts)
    })
    .await;
    let text = serde_json::to_string(&acts[0].messages).unwrap();
    assert!(text.contains("host key of 127.0.0.1"), "{text}");
    assert!(text.contains("is not known"), "{text}");
    assert!(!std::path::Path::new(&path).exists());
    assert!(sshd.files_in_home().is_empty(), "nothing shipped");
    assert_eq!(sshd.logins(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_ssh_agent_fails_within_the_connect_timeout() {
    let sshd = Sshd::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, closed_port());
    let (_srv, c, env, dir) =
        deploying_env("ssh-down", settings(&uri, &sshd, &sshd.known_hosts)).await;
    let f = fs_file(WEB, &format!("{}/never", dir.path().display()), "x", &[]);
    let rid = f.id.0.clone();
    let started = Instant::now();
    upload(&c, &env, vec![f]).await;
    let acts = eventually(30, "the action to fail", || async {
        let acts = deploy_actions(&c, &env, &rid).await;
        acts.iter()
            .any(|a| a.status == "unavailable")
            .then_some(acts)
    })
    .await;
    let took = started.elapsed();
    let text = serde_json::to_string(&acts[0].messages).unwrap();
    assert!(text.contains("can not reach 127.0.0.1"), "{text}");
    assert!(took < Duration::from_secs(6), "failed after {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_ssh_host_holds_up_only_its_own_agent() {
    let sshd = Sshd::start();
    let silent = crate::ssh_support::Silent::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, silent.port);
    let (_srv, c, env, dir) =
        deploying_env("ssh-silent", settings(&uri, &sshd, &sshd.known_hosts)).await;
    let d = dir.path().display().to_string();
    let remote = fs_file(WEB, &format!("{d}/remote"), "x", &[]);
    let rid = remote.id.0.clone();
    let local = fs_file("localhost", &format!("{d}/local"), "here", &[]);
    let started = Instant::now();
    upload(&c, &env, vec![remote, local]).await;
    // the local agent does not wait for the SSH host's connect timeout (5 s)
    eventually(10, "the local file", || async {
        std::fs::read_to_string(format!("{d}/local")).ok()
    })
    .await;
    let local_took = started.elapsed();
    assert!(
        local_took < Duration::from_secs(3),
        "local took {local_took:?}"
    );
    let acts = eventually(30, "the SSH action to fail", || async {
        let acts = deploy_actions(&c, &env, &rid).await;
        acts.iter()
            .any(|a| a.status == "unavailable")
            .then_some(acts)
    })
    .await;
    let text = serde_json::to_string(&acts[0].messages).unwrap();
    assert!(text.contains("within 5 s"), "{text}");
}

/// Over SSH an executor gets its next actions while it works on one: still one handler at a
/// time (agent_parallelism 1), a hung one is killed at its own timeout, and what waited
/// behind it in the same executor is run again, not lost.
#[tokio::test(flavor = "multi_thread")]
async fn an_ssh_executor_runs_what_it_was_given_ahead_one_at_a_time_and_loses_nothing() {
    let sshd = Sshd::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let mut s = settings(&uri, &sshd, &sshd.known_hosts);
    s["handler_timeout"] = json!(2);
    s["retry_backoff"] = json!({"initial": 1, "factor": 1.0, "max": 1});
    let (_srv, c, env, dir) = deploying_env("ssh-ahead", s).await;
    let d = dir.path().display().to_string();
    // the others log when they start and end; the first run of "hang" hangs (its timeout
    // kills it), the next one passes. It comes last: it may wait behind others in the
    // executor, and its timeout runs from when it starts
    let n = 6;
    let mut resources = Vec::new();
    for i in 0..n {
        resources.push(crate::support::exec_run(
            WEB,
            &format!(
                "sh -c 'echo \"$(date +%s%N) 1 {i}\" >> {d}/log; sleep 0.1; echo \"$(date +%s%N) -1 {i}\" >> {d}/log; touch {d}/done{i}'"
            ),
            json!({"unless": format!("test -f {d}/done{i}")}),
            &[],
        ));
    }
    resources.push(crate::support::exec_run(
        WEB,
        &format!(
            "sh -c 'if [ ! -f {d}/hung ]; then echo \"$(date +%s%N) hang\" >> {d}/log; touch {d}/hung; sleep 30; fi; touch {d}/hang.done'"
        ),
        json!({"unless": format!("test -f {d}/hang.done")}),
        &[],
    ));
    let hang_id = resources[n].id.0.clone();
    let v = upload(&c, &env, resources).await;
    eventually(60, "everything deployed", || async {
        let p = c.progress(&env, v).await.ok()?;
        (p["by_status"]["deployed"] == n + 1).then_some(())
    })
    .await;
    for i in 0..n {
        assert!(std::path::Path::new(&format!("{d}/done{i}")).exists());
    }
    let acts = deploy_actions(&c, &env, &hang_id).await;
    let timed_out = acts
        .iter()
        .find(|a| a.status == "timed_out")
        .unwrap_or_else(|| panic!("the hung handler timed out: {acts:?}"));
    // one handler at a time: none of the others ran while the hung one did
    let log = std::fs::read_to_string(format!("{d}/log")).unwrap();
    // (time, "1"/"-1"/"hang", resource)
    let mut events: Vec<(u128, &str, &str)> = log
        .lines()
        .map(|l| {
            let mut f = l.split(' ');
            let t = f.next().unwrap().parse().unwrap();
            (t, f.next().unwrap(), f.next().unwrap_or(""))
        })
        .collect();
    events.sort();
    let hung_at = events.iter().find(|e| e.1 == "hang").unwrap().0;
    let killed_at = timed_out
        .finished_at
        .unwrap()
        .timestamp_nanos_opt()
        .unwrap() as u128;
    assert!(
        killed_at < hung_at + 4_000_000_000,
        "killed {} ms after it started (timeout 2 s)",
        (killed_at - hung_at) / 1_000_000
    );
    // the runs that ended (a run its timeout killed under load logs no end: it ended before
    // whatever started next, which the executor does not start before)
    let mut runs: Vec<(u128, u128)> = Vec::new();
    for (i, (t, e, r)) in events.iter().enumerate() {
        if *e != "1" {
            continue;
        }
        assert!(
            *t < hung_at || *t > hung_at + 1_900_000_000,
            "an action started while the hung one ran:\n{log}"
        );
        let end = events[i + 1..]
            .iter()
            .find(|(_, e2, r2)| r2 == r && (*e2 == "-1" || *e2 == "1"))
            .filter(|(_, e2, _)| *e2 == "-1");
        if let Some((end, _, _)) = end {
            runs.push((*t, *end));
        }
    }
    assert!(runs.len() >= n, "every action ran to its end once:\n{log}");
    // one at a time: no action started while another ran
    for (start, end) in &runs {
        let inside: Vec<_> = events
            .iter()
            .filter(|(t, e, _)| *e == "1" && t > start && t < end)
            .collect();
        assert!(
            inside.is_empty(),
            "one at a time: {inside:?} in a run:\n{log}"
        );
    }
}
