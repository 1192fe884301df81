//! PostgreSQL fails over under two server replicas: a primary and a synchronous streaming
//! standby (`pg_basebackup`) on this machine, the replicas started with a URL naming both;
//! the standby is promoted and the old primary stopped as in a crash. The replicas carry on
//! within 15 s and nothing committed before the switch is lost.

use std::time::{Duration, Instant};

use serde_json::json;
use steward::store::cluster::PgCluster;

use crate::deploy::{env_with, upload};
use crate::replicas_support::ADMIN;
use crate::support::{free_port, fs_file, spawn_server_with, wait_deployed, wait_healthy};

const AGENT: &str = "localhost";

struct Clusters {
    primary: PgCluster,
    standby: PgCluster,
    _dir: tempfile::TempDir,
}

impl Drop for Clusters {
    fn drop(&mut self) {
        let _ = self.primary.stop_immediate();
        let _ = self.standby.stop_immediate();
    }
}

async fn action_ids(c: &steward::client::Client, env: &str) -> Vec<uuid::Uuid> {
    c.actions(env, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect()
}

/// A primary with a database, and a synchronous streaming standby of it.
fn primary_and_standby() -> Clusters {
    let dir = tempfile::tempdir().unwrap();
    let primary = PgCluster::new(&dir.path().join("primary")).unwrap();
    primary.start(true).unwrap();
    primary.ensure_database("steward").unwrap();
    primary.allow_local_replication().unwrap();
    let standby = primary.make_standby(&dir.path().join("standby")).unwrap();
    standby.start_standby().unwrap();
    primary.require_synchronous_standby().unwrap();
    Clusters {
        primary,
        standby,
        _dir: dir,
    }
}

/// One URL naming both servers (their socket directories), primary first.
fn two_host_url(c: &Clusters) -> String {
    let one = c.primary.url("steward");
    let other = c.standby.url("steward");
    let host_of = |u: &str| {
        u.split('&')
            .chain(u.split('?'))
            .find_map(|p| p.strip_prefix("host="))
            .unwrap()
            .split('&')
            .next()
            .unwrap()
            .to_string()
    };
    let (h1, h2) = (host_of(&one), host_of(&other));
    one.replace(&format!("host={h1}"), &format!("host={h1},{h2}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_carry_on_when_the_standby_is_promoted_and_nothing_is_lost() {
    let clusters = tokio::task::spawn_blocking(primary_and_standby)
        .await
        .unwrap();
    let url = two_host_url(&clusters);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let child = spawn_server_with(
            &url,
            port,
            ADMIN,
            data.path(),
            &[
                "--advertise-url".as_ref(),
                base.as_ref(),
                "--lease-time".as_ref(),
                "3".as_ref(),
                "--heartbeat".as_ref(),
                "0.5".as_ref(),
            ],
        );
        wait_healthy(&base).await;
        replicas.push((child, base, data));
    }
    let c = steward::client::Client::new(&replicas[0].1, Some(ADMIN.into()));
    let env = env_with(&c, "failover", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let v1 = upload(
        &c,
        &env,
        (0..10)
            .map(|i| fs_file(AGENT, &format!("{d}/one{i}"), "1\n", &[]))
            .collect(),
    )
    .await;
    wait_deployed(&c, &env, v1, 30).await;
    let actions_before = action_ids(&c, &env).await;
    assert_eq!(actions_before.len(), 10);

    // the primary's machine is lost: the standby takes over
    let switched = Instant::now();
    tokio::task::block_in_place(|| {
        clusters.standby.promote().unwrap();
        clusters.primary.stop_immediate().unwrap();
    });

    // both replicas answer with their database again, and a new version goes through
    let c2 = steward::client::Client::new(&replicas[1].1, Some(ADMIN.into()));
    let deadline = Instant::now() + Duration::from_secs(15);
    let v2 = loop {
        let attempt = c2
            .upload(
                &env,
                &crate::support::export_of(
                    (0..10)
                        .map(|i| fs_file(AGENT, &format!("{d}/two{i}"), "2\n", &[]))
                        .collect(),
                ),
                json!({}),
            )
            .await;
        match attempt {
            Ok(v) => break v["number"].as_i64().unwrap() as i32,
            Err(e) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = e;
            }
            Err(e) => panic!("no upload within 15 s of the switch: {e}"),
        }
    };
    let uploaded = switched.elapsed();
    wait_deployed(&c2, &env, v2, 30).await;
    let deployed = switched.elapsed();
    eprintln!("after the switch: an upload went through at {uploaded:?}, deployed at {deployed:?}");
    assert!(
        deployed < Duration::from_secs(15) + Duration::from_secs(5),
        "{deployed:?}"
    );
    // each replica finds the new primary by itself: the one that took the upload did, the
    // other may take a moment longer (its pool reconnects on its own schedule)
    for (_, base, _) in &replicas {
        let client = steward::client::Client::new(base, None);
        crate::support::eventually(
            15,
            &format!("{base} healthy on the new primary"),
            || async {
                let h = client.health().await.ok()?;
                (h["database"] == "ok").then_some(())
            },
        )
        .await;
    }
    for i in 0..10 {
        assert_eq!(
            std::fs::read_to_string(format!("{d}/two{i}")).unwrap(),
            "2\n"
        );
    }
    // nothing committed before the switch is lost
    let versions = c2.versions(&env).await.unwrap();
    assert_eq!(versions.len(), 2, "{versions:#?}");
    let actions_after = action_ids(&c2, &env).await;
    for a in &actions_before {
        assert!(actions_after.contains(a), "action {a} lost in the switch");
    }
    let status = c2.replicas().await.unwrap();
    assert_eq!(status.replicas.iter().filter(|r| r.live).count(), 2);
    assert!(
        status.replicas.iter().any(|r| r
            .environments
            .iter()
            .any(|e| e.environment_id.to_string() == env)),
        "{:#?}",
        status.replicas.len()
    );
    // and it was the switch that did it: each replica says so in its log
    for (_, _, data) in &replicas {
        let log = std::fs::read_to_string(data.path().join("server.log")).unwrap();
        assert!(log.contains("database primary moved"), "{log}");
    }
    for (mut child, _, _) in replicas {
        let _ = child.kill();
        let _ = child.wait();
    }
}
