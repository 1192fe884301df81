//! The facts loops under a database outage, over time (issue 29): a recompile for a fact
//! that was due while PostgreSQL was down is made once it is back (once, not once per
//! attempt), the refresh goes on asking at its pace afterwards, and no row is written twice.
//! The outage lasts 20 s; the whole test about 45 s.

use std::time::Duration;

use serde_json::json;
use steward::store::cluster::PgCluster;

use crate::gitops_support::{Repo, compiled, git_ok, read};
use crate::support::{TestServer, eventually};

const MAIN: &str = r#"import fs

host = std::Host(name="localhost", os=std::linux)
conf = fs::File(host=host, path="OUT/app.conf", content="port 8080\n", mode=644)
sum = std::getfact(conf, "sha256")
fs::File(host=host, path="OUT/report.txt", content="sum {{sum}}\n", mode=644)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_fact_recompile_due_during_a_database_outage_is_made_once_when_it_returns() {
    // a cluster of its own: this test stops it
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pg");
    let cluster = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&root).unwrap();
        c.start(false).unwrap();
        c.remove_when_process_exits(std::process::id()).unwrap();
        c.ensure_database("facts_outage").unwrap();
        c
    })
    .await
    .unwrap();
    let cluster = std::sync::Arc::new(cluster);
    let srv = TestServer::start_with(cluster.url("facts_outage"), false, true).await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let out = repo.out.display().to_string();
    let commit = repo.commit(&MAIN.replace("OUT", &out), "a file and its hash");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    // the store looked at every second, a resource asked at most every 2 s, a recompile
    // 2 s after its value arrives (so that it falls into the outage)
    let env = c
        .create_environment(
            "facts",
            "outage",
            Some(json!({"fact_renew": 3, "fact_resource_block": 2, "recompile_backoff": 2.0})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    c.set_source(
        &env,
        &json!({"url": repo.url(), "branch": "main", "webhook_secret": "s", "poll_interval": 0}),
    )
    .await
    .unwrap();
    c.trigger_compile(&env, None).await.unwrap();
    assert_eq!(compiled(&c, &env, &commit, 60).await["status"], "success");
    let report = repo.out.join("report.txt");
    eventually(90, "the report with the hash", || async {
        read(&report).filter(|r| r.starts_with("sum ") && r.len() > 60)
    })
    .await;
    let compiles = || async {
        c.compiles(&env, 100)
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let before = compiles().await.len();

    // the hash is deleted (a recompile is due in 2 s), and the database goes away for 20 s
    let conf_id = format!("fs::File[localhost,path={out}/app.conf]");
    c.delete_parameter(&env, "sha256", Some(&conf_id))
        .await
        .unwrap();
    let stopper = cluster.clone();
    tokio::task::spawn_blocking(move || stopper.stop().unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(c.compiles(&env, 1).await.is_err(), "the database is away");
    let back = std::time::Instant::now();
    let starter = cluster.clone();
    tokio::task::spawn_blocking(move || starter.start(false).unwrap())
        .await
        .unwrap();

    // the recompile for the deletion is made once the database is back, then the hash is
    // asked of the file's handler again (at the refresh's pace) and the model has it again
    let hash = eventually(60, "the hash read again after the outage", || async {
        c.get_parameter(&env, "sha256", Some(&conf_id)).await.ok()
    })
    .await;
    let took = back.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the refresh took {took:?} to ask again after the outage"
    );
    eventually(60, "the recompiles settled", || async {
        let all = compiles().await;
        let finished = all
            .iter()
            .all(|r| r["status"] == "success" || r["status"] == "failed");
        (finished && all.len() > before).then_some(())
    })
    .await;
    // settle: nothing more comes (a retry that made a compile per attempt would show here)
    tokio::time::sleep(Duration::from_secs(8)).await;
    let all = compiles().await;
    // one recompile for the deletion, and one for the hash's return unless the hash was
    // back before the deletion's recompile ran
    assert!(
        (before + 1..=before + 2).contains(&all.len()),
        "{} compiles after {before}: {all:#?}",
        all.len()
    );
    assert!(
        all.iter()
            .take(all.len() - before)
            .all(|r| r["status"] == "success" && r["trigger"] == "fact"),
        "{all:#?}"
    );
    assert_eq!(
        read(&report).unwrap(),
        format!("sum {}\n", hash.value),
        "the report deployed with the hash"
    );
    // one row per fact, whatever was retried
    let facts = c.list_facts(&env, None).await.unwrap();
    let conf_facts = facts.iter().filter(|f| f.resource_id == conf_id).count();
    assert_eq!(conf_facts, 2, "sha256 and size, once each: {facts:?}");
    assert!(
        facts.iter().all(|f| f.resource_id == conf_id),
        "only the file the model reads has facts: {facts:?}"
    );
}
