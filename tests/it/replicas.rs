//! Several `steward server` replicas on one PostgreSQL (docs/replicas.md): environments are
//! spread and rebalanced, a killed owner's environments are taken over and finish, a
//! graceful stop hands over at once, a paused owner cannot write after losing its lease,
//! and owner-only requests sent to any replica reach the owner.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::deploy::{env_with, upload};
use crate::gitops_support::{Repo, compiled, follow, timeline, webhook_url};
use crate::replicas_support::{ADMIN, ReplicaSet};
use crate::support::{eventually, exec_run, fs_file, steward_bin, wait_deployed};

const AGENT: &str = "localhost";

/// environment -> (owner, term)
fn terms(s: &steward::store::replicas::Replicas) -> BTreeMap<String, (String, i64)> {
    s.replicas
        .iter()
        .flat_map(|r| {
            r.environments
                .iter()
                .map(|e| (e.environment_id.to_string(), (e.holder.clone(), e.term)))
        })
        .collect()
}

fn shares(own: &BTreeMap<String, Vec<String>>) -> Vec<usize> {
    let mut v: Vec<usize> = own.values().map(Vec::len).collect();
    v.sort();
    v
}

fn moved(before: &BTreeMap<String, Vec<String>>, after: &BTreeMap<String, Vec<String>>) -> usize {
    let owner = |m: &BTreeMap<String, Vec<String>>, e: &str| {
        m.iter()
            .find(|(_, v)| v.iter().any(|x| x == e))
            .map(|(k, _)| k.clone())
    };
    before
        .values()
        .flatten()
        .filter(|e| owner(before, e) != owner(after, e))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn environments_spread_rebalance_when_a_replica_joins_and_move_at_once_on_a_clean_stop() {
    // a long lease: a handover that is fast here is the clean stop's, not an expiry
    let mut set = ReplicaSet::start(3, 20.0, 1.0).await;
    let c = set.client(0);
    let mut envs = Vec::new();
    for i in 0..9 {
        envs.push(env_with(&c, &format!("spread{i}"), json!({})).await);
    }
    let (own, took) = set.settled(&envs, 3, 20).await;
    assert_eq!(shares(&own), vec![3, 3, 3], "{own:#?}");
    eprintln!("9 environments spread over 3 replicas in {took:?}");

    // `steward server status` shows it, through any replica
    let out = std::process::Command::new(steward_bin())
        .args(["server", "status", "--server", set.url(2), "--token", ADMIN])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in own.keys() {
        assert!(text.contains(id.as_str()), "{id} missing from:\n{text}");
    }
    assert_eq!(text.matches(" live ").count(), 3, "{text}");
    assert!(text.contains("deploy/spread0"), "{text}");
    // and /metrics
    let metrics = crate::support::metrics_text(set.url(1), ADMIN).await;
    assert!(metrics.contains("steward_replicas_live 3"), "{metrics}");
    assert!(
        metrics.contains("steward_replica_environments_owned{replica=\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("steward_environment_lease_age_seconds{environment=\"deploy/spread0\"")
    );

    // a fourth replica: the work evens out, moving no more than it must
    set.add().await;
    let (own4, _) = set.settled(&envs, 4, 20).await;
    let s4 = shares(&own4);
    assert!(*s4.last().unwrap() <= 3 && s4.len() == 4, "{own4:#?}");
    let moves = moved(&own, &own4);
    assert!(
        moves <= 9usize.div_ceil(4) + 1,
        "{moves} moves: {own:#?} -> {own4:#?}"
    );
    assert!(moves >= 1, "the new replica got nothing: {own4:#?}");

    // a clean stop: its environments are owned again well within the 20 s lease
    let busiest = set
        .index_of(own4.iter().max_by_key(|(_, v)| v.len()).unwrap().0)
        .await
        .unwrap();
    let t = Instant::now();
    set.terminate(busiest);
    let (own3, _) = set.settled(&envs, 3, 10).await;
    let handover = t.elapsed();
    eprintln!("clean stop handed over in {handover:?} (including the process exit)");
    assert!(
        handover < Duration::from_secs(5),
        "the handover waited for the lease: {handover:?}"
    );
    assert_eq!(shares(&own3), vec![3, 3, 3], "{own3:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_owner_mid_deploy_is_taken_over_and_the_deploy_finishes_without_overlap() {
    let mut set = ReplicaSet::start(3, 3.0, 0.5).await;
    let c = set.client(0);
    let env = env_with(&c, "takeover", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    // slow steps in a chain; each holds a lock while it runs, and says so if another run
    // of the same step holds it (a step run twice at the same time)
    let mut resources = Vec::new();
    let mut prev: Option<String> = None;
    for i in 0..8 {
        let cmd = format!(
            "sh -c 'flock -n {d}/lock{i} -c \"sleep 0.4; echo {i} >> {d}/steps\" || echo {i} >> {d}/overlaps'"
        );
        let r = exec_run(
            AGENT,
            &cmd,
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
    for i in 0..50 {
        resources.push(fs_file(
            AGENT,
            &format!("{d}/file{i}"),
            &format!("{i}\n"),
            &[&last],
        ));
    }
    let (old, _) = set.owner_of(&env, None, 20).await;
    let v = upload(&c, &env, resources).await;
    eventually(20, "the deploy to be under way", || async {
        let n = std::fs::read_to_string(format!("{d}/steps"))
            .map(|s| s.lines().count())
            .unwrap_or(0);
        (n >= 2).then_some(())
    })
    .await;
    let victim = set.index_of(&old).await.unwrap();
    let t = Instant::now();
    set.kill9(victim);
    let (new, _) = set.owner_of(&env, Some(&old), 20).await;
    let takeover = t.elapsed();
    eprintln!("owner {old} killed; {new} owns the environment after {takeover:?}");
    assert!(takeover < Duration::from_secs(10), "{takeover:?}");

    let c = set.any_client();
    let p = wait_deployed(&c, &env, v, 60).await;
    assert_eq!(p["by_status"]["deployed"], 58, "{p}");
    for i in 0..50 {
        assert_eq!(
            std::fs::read_to_string(format!("{d}/file{i}")).unwrap(),
            format!("{i}\n")
        );
    }
    let steps = std::fs::read_to_string(format!("{d}/steps")).unwrap();
    for i in 0..8 {
        assert!(
            steps.lines().any(|l| l == i.to_string()),
            "step {i} never ran: {steps}"
        );
    }
    assert!(
        !std::path::Path::new(&format!("{d}/overlaps")).exists(),
        "a step ran twice at the same time: {:?}",
        std::fs::read_to_string(format!("{d}/overlaps"))
    );
    let all = c.actions(&env, None, 10_000).await.unwrap();
    assert!(
        all.iter().all(|a| a.finished_at.is_some()),
        "an action was left open"
    );
    // nothing lost: the version is there once, released and done
    let versions = c.versions(&env).await.unwrap();
    assert_eq!(versions.len(), 1, "{versions:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_owner_cannot_write_after_losing_its_lease() {
    let mut set = ReplicaSet::start(2, 2.0, 0.5).await;
    let c = set.client(0);
    let env = env_with(&c, "paused", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let first = exec_run(
        AGENT,
        &format!("sh -c 'touch {d}/started; sleep 0.3; echo run >> {d}/first'"),
        json!({}),
        &[],
    );
    let first_id = first.id.0.clone();
    let resources = vec![
        first,
        fs_file(AGENT, &format!("{d}/after"), "after\n", &[&first_id]),
    ];
    let (old, _) = set.owner_of(&env, None, 20).await;
    let paused = set.index_of(&old).await.unwrap();
    let other = 1 - paused;
    let v = upload(&set.client(other), &env, resources).await;
    eventually(20, "the first action to start", || async {
        std::path::Path::new(&format!("{d}/started"))
            .exists()
            .then_some(())
    })
    .await;
    // the owner stops (its executor finishes the action meanwhile: the result waits in its
    // pipe); the other replica takes over after the lease and deploys everything again
    set.pause(paused, true);
    let oc = set.client(other);
    let (new, _) = set.owner_of(&env, Some(&old), 20).await;
    assert_ne!(new, old);
    wait_deployed(&oc, &env, v, 30).await;
    let before_actions: Vec<_> = oc
        .actions(&env, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|a| serde_json::to_value(a).unwrap())
        .collect();
    let (_, before_states) = oc.resources(&env).await.unwrap();
    let paused_at = chrono::Utc::now();

    // it wakes up: it must notice it lost the lease, and write nothing
    set.pause(paused, false);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_actions: Vec<_> = oc
        .actions(&env, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|a| serde_json::to_value(a).unwrap())
        .collect();
    let (_, after_states) = oc.resources(&env).await.unwrap();
    assert_eq!(
        before_actions, after_actions,
        "the deposed owner changed the action log"
    );
    assert_eq!(
        serde_json::to_value(&before_states).unwrap(),
        serde_json::to_value(&after_states).unwrap(),
        "the deposed owner changed resource states"
    );
    let log = std::fs::read_to_string(
        set.replicas[paused]
            .as_ref()
            .unwrap()
            .data
            .path()
            .join("server.log"),
    )
    .unwrap();
    assert!(
        log.contains("lease of environment lost"),
        "the paused replica did not notice: {log}"
    );
    // and the environment stays with the new owner
    let own = set.ownership().await;
    assert!(own[&new].contains(&env), "{own:#?} after {paused_at}");
}

#[tokio::test(flavor = "multi_thread")]
async fn owner_only_requests_sent_to_any_replica_reach_the_owner() {
    let set = ReplicaSet::start(2, 3.0, 0.5).await;
    let c = set.client(0);
    let repo = Repo::new();
    let c1 = repo.commit(&repo.model(&[("w", "1")], ""), "one");
    repo.push_ok();
    let env = follow(&c, "reach", &repo, json!({"watch": false})).await;
    assert_eq!(
        compiled_or_logs(&set, &c, &env, &c1).await["status"],
        "success"
    );
    let (owner, _) = set.owner_of(&env, None, 20).await;
    let away = 1 - set.index_of(&owner).await.unwrap();
    let ac = set.client(away);

    // a signed webhook to the replica that does not own the environment compiles there
    let c2 = repo.commit(&repo.model(&[("w", "2")], ""), "two");
    repo.push_ok();
    let body = json!({"ref": "refs/heads/main"}).to_string();
    let sig = format!(
        "sha256={}",
        steward::sources::webhook::sign("s3cret", body.as_bytes())
    );
    let r = reqwest::Client::new()
        .post(webhook_url(set.url(away), &env))
        .header("Content-Type", "application/json")
        .header("X-Hub-Signature-256", sig)
        .header("X-GitHub-Delivery", "r1")
        .header("X-GitHub-Event", "push")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().await.unwrap());
    let report = compiled_or_logs(&set, &ac, &env, &c2).await;
    assert_eq!(report["status"], "success", "{report:#}");
    assert_eq!(report["trigger"], "webhook");
    // a badly signed one, to either replica, triggers nothing
    let c3 = repo.commit(&repo.model(&[("w", "3")], ""), "three");
    repo.push_ok();
    for i in [0, 1] {
        let r = reqwest::Client::new()
            .post(webhook_url(set.url(i), &env))
            .header("Content-Type", "application/json")
            .header("X-Hub-Signature-256", "sha256=00")
            .header("X-GitHub-Event", "push")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let list = ac.compiles(&env, 100).await.unwrap();
    assert!(
        !list.as_array().unwrap().iter().any(|x| x["commit"] == c3),
        "a rejected webhook compiled: {list:#}"
    );
    // the API trigger answers with the owner's result
    let t = ac.trigger_compile(&env, None).await.unwrap();
    assert_eq!(t["commit"], c3, "{t}");
    assert_eq!(
        compiled_or_logs(&set, &ac, &env, &c3).await["status"],
        "success"
    );

    // a pause through the non-owner is in effect when it returns, and the owner's live
    // status is visible there
    let paused = ac.set_paused(&env, AGENT, true).await.unwrap();
    assert_eq!(paused["paused"], true, "{paused}");
    let agents = ac.agents(&env).await.unwrap();
    let a = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == AGENT)
        .cloned()
        .unwrap();
    assert_eq!(a["paused"], true, "{agents:#}");
    // executors are known only to the owner's scheduler
    assert!(
        !a["executors"].as_array().unwrap().is_empty(),
        "the owner's live status was not fetched: {agents:#}"
    );
    ac.set_paused(&env, AGENT, false).await.unwrap();
    let d = ac.trigger(&env, false, None, None).await.unwrap();
    assert!(d["scheduled"].is_number(), "{d}");

    // the internal endpoint wants the replicas' secret
    let r = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/internal/environments/{env}/owner-call",
            set.url(away)
        ))
        .header("x-steward-replica-secret", "guess")
        .json(&json!({"call": "halt", "halted": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let e = ac.environment(&env).await.unwrap();
    assert_eq!(e["halted"], false, "{e}");

    // every commit's timeline is complete, and each commit made one version
    let versions = ac.versions(&env).await.unwrap();
    let commits: Vec<String> = versions
        .iter()
        .filter_map(|v| v["provenance"]["commit"].as_str().map(str::to_string))
        .collect();
    let unique: HashSet<&String> = commits.iter().collect();
    assert_eq!(
        unique.len(),
        commits.len(),
        "a commit compiled twice: {commits:?}"
    );
    assert_eq!(unique.len(), 3, "{commits:?}");
}

/// The finished compile of `commit`; on a timeout, the replicas' logs.
async fn compiled_or_logs(
    set: &ReplicaSet,
    c: &steward::client::Client,
    env: &str,
    commit: &str,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let list = c.compiles(env, 100).await.unwrap();
        if let Some(hit) = list.as_array().unwrap().iter().find(|r| {
            r["commit"] == commit && (r["status"] == "success" || r["status"] == "failed")
        }) {
            return c
                .compile_report(env, hit["id"].as_str().unwrap())
                .await
                .unwrap();
        }
        if started.elapsed() > Duration::from_secs(60) {
            panic!(
                "no finished compile of {commit} in 60 s: {list:#}\n{}",
                set.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_owner_mid_compile_is_compiled_once_by_the_next_owner() {
    let mut set = ReplicaSet::start(2, 2.0, 0.5).await;
    let c = set.client(0);
    let repo = Repo::new();
    // a requirements.txt makes the compile build a Python environment first: a compile
    // long enough to be killed in the middle of
    std::fs::write(repo.work.join("requirements.txt"), "# nothing to install\n").unwrap();
    let commit = repo.commit(&repo.model(&[("m", "1")], ""), "slow compile");
    repo.push_ok();
    let env = follow(&c, "midcompile", &repo, json!({"watch": false})).await;
    let running = eventually(30, "the compile to be running", || async {
        let list = c.compiles(&env, 10).await.ok()?;
        list.as_array()?
            .iter()
            .find(|r| r["commit"] == commit && r["status"] == "running")
            .cloned()
    })
    .await;
    let (old, _) = set.owner_of(&env, None, 10).await;
    let victim = set.index_of(&old).await.unwrap();
    set.kill9(victim);
    let c = set.any_client();
    let report = compiled(&c, &env, &commit, 60).await;
    assert_eq!(report["status"], "success", "{report:#}");
    assert_eq!(
        report["id"], running["id"],
        "the interrupted compile was not the one resumed"
    );
    let (new, _) = set.owner_of(&env, Some(&old), 10).await;
    assert_ne!(new, old);
    let events = eventually(60, "deployed in the timeline", || async {
        let t = timeline(&c, &env, &commit).await;
        t.contains(&"deployed".to_string()).then_some(t)
    })
    .await;
    for (event, times) in [
        ("received", 1),
        ("compiled", 1),
        ("version", 1),
        ("released", 1),
        ("deployed", 1),
    ] {
        assert_eq!(
            events.iter().filter(|e| *e == event).count(),
            times,
            "{event}: {events:?}"
        );
    }
    assert!(
        events.iter().filter(|e| *e == "compile_started").count() >= 1,
        "{events:?}"
    );
    let versions = c.versions(&env).await.unwrap();
    assert_eq!(versions.len(), 1, "one commit, one version: {versions:#?}");
    assert_eq!(
        std::fs::read_to_string(repo.out.join("m")).unwrap().trim(),
        "1"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_of_an_older_release_starts_on_a_schema_migrated_further() {
    // a newer replica applied a migration this binary does not know
    let db = crate::support::new_database();
    let pool = steward::store::connect(&db, 2).await.unwrap();
    steward::store::migrate(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99999, 'from a newer release', true, '\\x00', 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    steward::store::migrate(&pool)
        .await
        .expect("an older replica refused a schema migrated further");
}

/// Every 2 s for 20 s, every connection the replicas hold is cut
/// (`pg_terminate_backend`): their heartbeats, renewals and event links reconnect, nobody
/// loses an environment, terms do not move, rows do not grow, and a release made during it
/// still reaches the owner and deploys.
#[tokio::test(flavor = "multi_thread")]
async fn replicas_keep_their_environments_and_rows_while_their_connections_keep_dying() {
    let set = ReplicaSet::start(3, 3.0, 0.5).await;
    let c = set.client(0);
    let mut envs = Vec::new();
    for i in 0..6 {
        envs.push(env_with(&c, &format!("churn{i}"), json!({})).await);
    }
    let (_, _) = set.settled(&envs, 3, 20).await;
    let before = terms(&set.status().await);
    assert_eq!(before.len(), 6);
    let pool = steward::store::connect(&set.db, 2).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let started = Instant::now();
    let mut cuts = 0;
    let mut released = None;
    let mut worst_heartbeat = 0.0f64;
    while started.elapsed() < Duration::from_secs(20) {
        let cut: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(cut > 0, "the replicas hold no connection?");
        cuts += 1;
        if cuts == 5 {
            // a release in the middle of it, through another replica than the owner's
            let v = upload(
                &set.client(2),
                &envs[0],
                vec![fs_file(AGENT, &format!("{d}/during"), "x\n", &[])],
            )
            .await;
            released = Some(v);
        }
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let rows: (i64, i64) = sqlx::query_as(
                "SELECT (SELECT count(*) FROM replicas), \
                 (SELECT count(*) FROM leases WHERE kind = 'environment')",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(rows, (3, 6), "replica or lease rows grew");
            let age: f64 = sqlx::query_scalar(
                "SELECT extract(epoch FROM now() - min(heartbeat_at))::float8 FROM replicas",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            worst_heartbeat = worst_heartbeat.max(age);
        }
    }
    eprintln!("{cuts} cuts in 20 s; oldest heartbeat seen {worst_heartbeat:.2} s");
    assert!(
        worst_heartbeat < 3.0,
        "a heartbeat fell behind the lease time: {worst_heartbeat:.2} s\n{}",
        set.logs()
    );
    let after = terms(&set.status().await);
    assert_eq!(before, after, "ownership moved while only connections died");
    let v = released.unwrap();
    wait_deployed(&set.client(1), &envs[0], v, 30).await;
    assert_eq!(
        std::fs::read_to_string(format!("{d}/during")).unwrap(),
        "x\n"
    );
}

/// The database refuses every connection for longer than the lease time: the replicas start
/// nothing meanwhile, and when it is back each takes its own environments again, under the
/// same terms (nobody else held them), and deploys go on.
#[tokio::test(flavor = "multi_thread")]
async fn after_a_database_outage_longer_than_the_lease_each_replica_resumes_its_own() {
    let set = ReplicaSet::start(2, 2.0, 0.5).await;
    let c = set.client(0);
    let mut envs = Vec::new();
    for i in 0..4 {
        envs.push(env_with(&c, &format!("outage{i}"), json!({})).await);
    }
    set.settled(&envs, 2, 20).await;
    let before = terms(&set.status().await);
    let db_name: String = {
        let p = steward::store::connect(&set.db, 1).await.unwrap();
        let name = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&p)
            .await
            .unwrap();
        p.close().await;
        name
    };
    let admin = steward::store::connect(&crate::support::cluster().url("postgres"), 1)
        .await
        .unwrap();
    // the name is ours (made by the test harness): safe to splice
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{db_name}\" ALLOW_CONNECTIONS false"
    )))
    .execute(&admin)
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&db_name)
        .execute(&admin)
        .await
        .unwrap();
    // twice the lease time and more
    tokio::time::sleep(Duration::from_secs(5)).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{db_name}\" ALLOW_CONNECTIONS true"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let (_, took) = set.settled(&envs, 2, 30).await;
    eprintln!("owned again {took:?} after the database came back");
    let after = terms(&set.status().await);
    if before != after {
        for r in set.replicas.iter().flatten() {
            let log = std::fs::read_to_string(r.data.path().join("server.log")).unwrap_or_default();
            eprintln!("--- replica log ---");
            for l in log
                .lines()
                .filter(|l| l.contains("lease") || l.contains("owned here"))
            {
                eprintln!("{l}");
            }
        }
    }
    assert_eq!(
        before, after,
        "environments moved or changed terms after the outage"
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let v = upload(
        &c,
        &envs[1],
        vec![fs_file(AGENT, &format!("{d}/after"), "y\n", &[])],
    )
    .await;
    wait_deployed(&c, &envs[1], v, 30).await;
}

/// A signed `pull_request` webhook to the replica that does not own the environment is
/// queued there and previewed by the owner (the only one whose previewer follows it).
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_webhook_to_any_replica_is_previewed_by_the_owner() {
    let set = ReplicaSet::start(2, 3.0, 0.5).await;
    let c = set.client(0);
    let repo = Repo::new();
    let main = repo.commit(&repo.model(&[("w", "1")], ""), "one");
    repo.push_ok();
    let env = follow(&c, "previewed", &repo, json!({"watch": false})).await;
    c.update_settings(&env, &json!({"previews": {"enabled": true}}))
        .await
        .unwrap();
    assert_eq!(
        compiled_or_logs(&set, &c, &env, &main).await["status"],
        "success"
    );
    let (owner, _) = set.owner_of(&env, None, 20).await;
    let away = 1 - set.index_of(&owner).await.unwrap();
    let ac = set.client(away);
    crate::gitops_support::git_ok(&repo.work, &["checkout", "-q", "-b", "change"]);
    let head = repo.commit(&repo.model(&[("w", "2")], ""), "change");
    crate::gitops_support::git_ok(
        &repo.work,
        &["push", "-q", "origin", "HEAD:refs/pull/3/head"],
    );
    // the repository's name as the source shows it (no status settings here)
    let name = steward::model::urls::repo_name(&repo.url());
    let body = json!({"action": "opened", "number": 3,
        "pull_request": {"number": 3, "title": "t",
            "base": {"ref": "main", "repo": {"full_name": name}},
            "head": {"sha": head, "repo": {"full_name": name}}}})
    .to_string();
    let sig = steward::sources::webhook::sign("s3cret", body.as_bytes());
    let r = reqwest::Client::new()
        .post(webhook_url(set.url(away), &env))
        .header("Content-Type", "application/json")
        .header("X-Hub-Signature-256", format!("sha256={sig}"))
        .header("X-GitHub-Event", "pull_request")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{}", r.text().await.unwrap());
    let p = crate::support::eventually(60, "the owner's preview", || async {
        let p = ac.preview(&env, "3").await.ok()?;
        (p["run"]["status"] == "success").then_some(p)
    })
    .await;
    assert_eq!(p["changes"].as_array().unwrap().len(), 1, "{p:#}");
    assert!(
        set.logs().contains("preview done"),
        "no replica says it previewed"
    );
}
