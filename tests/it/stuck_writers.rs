//! One environment's trouble costs the others nothing (issue 28, defect 2): while a write
//! transaction of one environment hangs holding that environment's lease row (as every write
//! under a lease holds it, `FOR SHARE`, until it commits), the other environments on the
//! same server keep their leases and go on deploying.

use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Connection;

use crate::support::{Spawned, null_export, wait_deployed};

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_stuck_under_one_lease_does_not_hold_up_the_renewal_of_the_others() {
    let mut srv = Spawned::start("stw_test_admin_stuck_writer").await;
    let c = srv.client.clone();
    let mut envs = Vec::new();
    for name in ["stuck", "calm-1", "calm-2"] {
        let env = c
            .create_environment("stuck", name, None)
            .await
            .unwrap()
            .id
            .to_string();
        c.upload(&env, &null_export(3, None), json!({}))
            .await
            .unwrap();
        wait_deployed(&c, &env, 1, 60).await;
        envs.push(env);
    }
    let (stuck, calm) = (envs[0].clone(), envs[1..].to_vec());

    // a write transaction of the stuck environment that does not end: it holds the lease
    // row as `Fence::check` does
    let mut conn = sqlx::PgConnection::connect(&srv.db).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let held: Option<i64> = sqlx::query_scalar(
        "SELECT term FROM leases WHERE kind = 'environment' AND key = $1 FOR SHARE",
    )
    .bind(&stuck)
    .fetch_optional(&mut *tx)
    .await
    .unwrap();
    assert!(held.is_some(), "the environment has a lease");

    // 15 s, three times the lease time: the others deploy new versions all along
    let until = Instant::now() + Duration::from_secs(15);
    let mut version = 1;
    while Instant::now() < until {
        version += 1;
        for env in &calm {
            c.upload(env, &null_export(3 + version as usize, None), json!({}))
                .await
                .unwrap();
        }
        for env in &calm {
            wait_deployed(&c, env, version, 10).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tx.rollback().await.unwrap();

    let log = std::fs::read_to_string(srv.data.path().join("server.log")).unwrap();
    for env in &calm {
        assert!(
            !log.lines()
                .any(|l| l.contains("lease of environment lost") && l.contains(env.as_str())),
            "{env} lost its lease behind another environment's writer:\n{log}"
        );
    }
    // the stuck one carries on once its writer is done
    let v = c
        .upload(&stuck, &null_export(4, None), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&c, &stuck, v, 60).await;
    srv.kill9();
}
