//! Nothing is lost across a kill -9 of the server; a database outage gives 503 and the server
//! recovers when the database returns.

use serde_json::json;
use steward::client::Client;
use steward::store::cluster::PgCluster;

use crate::support::{
    TestServer, free_port, new_database, null_export, spawn_server, wait_healthy,
};

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_and_restart_loses_nothing() {
    let db = new_database();
    let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin_secret = "stw_test_admin_secret_for_kill9";
    let mut child = spawn_server(&db, port, admin_secret, data.path());
    wait_healthy(&url).await;
    let c = Client::new(&url, Some(admin_secret.into()));
    let env = c
        .create_environment(
            "p",
            "prod",
            Some(json!({"auto_release": false, "repair_interval": "0 3 * * *"})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&env, &null_export(10, None), json!({"commit": "c1"}))
        .await
        .unwrap();
    c.release(&env, 1, "first").await.unwrap();
    c.upload(&env, &null_export(10, Some(4)), json!({"commit": "c2"}))
        .await
        .unwrap();
    let viewer = c
        .create_token("viewer", "viewer", Some(&env))
        .await
        .unwrap();
    let rec = steward::store::actions::ActionRecord {
        id: uuid::Uuid::new_v4(),
        environment_id: uuid::Uuid::nil(),
        version: 1,
        resource_id: "std::testing::NullResource[internal,name=r1]".into(),
        action: "deploy".into(),
        started_at: chrono::Utc::now(),
        finished_at: Some(chrono::Utc::now()),
        status: "deployed".into(),
        change: "created".into(),
        changes: json!({}),
        messages: json!([{"level": "info", "message": "done", "fields": {}, "at": chrono::Utc::now()}]),
    };
    c.report_action(&env, &rec).await.unwrap();

    // kill -9: no chance to clean up
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(c.health().await.is_err());

    let mut child = spawn_server(&db, port, admin_secret, data.path());
    wait_healthy(&url).await;
    let versions = c.versions(&env).await.unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[1]["status"], "released");
    assert_eq!(versions[0]["status"], "new");
    assert_eq!(versions[0]["provenance"]["commit"], "c2");
    let v1 = c.version(&env, 1).await.unwrap();
    assert_eq!(v1["approvals"][0]["comment"], "first");
    let settings = c.settings(&env).await.unwrap();
    assert_eq!(settings["repair_interval"], "0 3 * * *");
    assert_eq!(settings["auto_release"], false);
    let vc = Client::new(&url, Some(viewer["secret"].as_str().unwrap().into()));
    assert_eq!(vc.versions(&env).await.unwrap().len(), 2, "tokens survive");
    let log = c
        .actions(
            &env,
            Some("std::testing::NullResource[internal,name=r1]"),
            5,
        )
        .await
        .unwrap();
    // the reported record survives (the scheduler logs its own deploys next to it)
    assert!(log.iter().any(|a| a.id == rec.id), "{log:?}");
    let audit: serde_json::Value = reqwest::Client::new()
        .get(format!("{url}/api/v1/environments/{env}/audit"))
        .bearer_auth(admin_secret)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(audit.as_array().unwrap().len() >= 5, "{audit}");
    // and it keeps working
    c.release(&env, 2, "second").await.unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn database_outage_gives_503_then_recovers() {
    // a cluster of its own: this test stops it
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pg");
    let cluster = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&root).unwrap();
        c.start(false).unwrap();
        c.remove_when_process_exits(std::process::id()).unwrap();
        c.ensure_database("outage").unwrap();
        c
    })
    .await
    .unwrap();
    let s = TestServer::start_on(cluster.url("outage"), false).await;
    let c = s.admin_client();
    let env = c
        .create_environment("p", "e", None)
        .await
        .unwrap()
        .id
        .to_string();
    let cluster = std::sync::Arc::new(cluster);
    let stopper = cluster.clone();
    tokio::task::spawn_blocking(move || stopper.stop().unwrap())
        .await
        .unwrap();
    let e = c.versions(&env).await.unwrap_err();
    assert_eq!(e.status(), Some(503), "{e}");
    let h = reqwest::get(format!("{}/health", s.url)).await.unwrap();
    assert_eq!(h.status().as_u16(), 503);
    let starter = cluster.clone();
    tokio::task::spawn_blocking(move || starter.start(false).unwrap())
        .await
        .unwrap();
    let mut ok = false;
    for _ in 0..100 {
        if c.versions(&env).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ok, "the server reconnects when the database returns");
    c.upload(&env, &null_export(1, None), json!({}))
        .await
        .unwrap();
}
