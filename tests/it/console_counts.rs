//! The resources table's counts are kept between views while an environment does not change
//! (`store::state::FacetCache`): they must follow every deploy write at once, also while the
//! server's listening connection is cut again and again, and pages cut from them (sorted by
//! state, filtered by state) must hold exactly the rows a plain sort would.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use steward::store::deploy::{Batch, StateRow};

use crate::console::listener_pid;
use crate::console_resources::seeded;
use crate::console_support::http;
use crate::support::TestServer;

/// The REST list (the same store function as the console's table).
async fn list(s: &TestServer, token: &str, env: &str, query: &str) -> Value {
    http()
        .get(format!(
            "{}/api/v1/environments/{env}/resources?{query}",
            s.url
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn ids(v: &Value) -> Vec<String> {
    v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resource_id"].as_str().unwrap().to_string())
        .collect()
}

/// A state row saying `result` for the resource's current intent.
async fn set_result(s: &TestServer, env: uuid::Uuid, id: &str, result: &str) {
    let (agent, hash): (String, String) = sqlx::query_as(
        "SELECT agent, hash FROM resource_spans WHERE environment_id = $1 AND first_version = 1 \
         AND resource_id = $2",
    )
    .bind(env)
    .bind(id)
    .fetch_one(&s.pool)
    .await
    .unwrap();
    let batch = Batch {
        states: vec![StateRow {
            resource_id: id.into(),
            agent,
            intent_version: Some(1),
            intent_hash: Some(hash.clone()),
            compliance: "compliant".into(),
            last_run: "successful".into(),
            last_result: Some(result.into()),
            blocked: "not_blocked".into(),
            last_run_hash: Some(hash),
            last_deployed: Some(chrono::Utc::now()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut c = s.pool.acquire().await.unwrap();
    steward::store::deploy::write_batch(&mut c, env, &batch)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn kept_counts_follow_every_deploy_write_even_while_the_listener_is_cut() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let (env, all) = seeded(&s, &c).await;
    let env_id = uuid::Uuid::parse_str(&env).unwrap();
    let viewer = c
        .create_token("viewer", "viewer", Some(&env))
        .await
        .unwrap();
    let token = viewer["secret"].as_str().unwrap().to_string();
    // seeded: 13 failed, 13 deployed, 104 available
    let failed = |v: &Value| v["total"].as_i64().unwrap();
    assert_eq!(
        failed(&list(&s, &token, &env, "status=failed&limit=1").await),
        13
    );
    // kept now: views agree with each other
    assert_eq!(
        failed(&list(&s, &token, &env, "status=failed&limit=1").await),
        13
    );

    // 20 s of deploy writes, each followed by reads that must see it within a second; every
    // third round the listening connection is cut first (changes meanwhile are missed by
    // the listener: nothing may be kept across that)
    let started = Instant::now();
    let (mut expected, mut rounds, mut cuts, mut slowest) = (13i64, 0usize, 0usize, Duration::ZERO);
    let available: Vec<&String> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| !i.is_multiple_of(5))
        .map(|(_, id)| id)
        .collect();
    while started.elapsed() < Duration::from_secs(20) {
        if rounds % 3 == 2 {
            let pid = listener_pid(&s.pool).await.expect("a listener");
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&s.pool)
                .await
                .unwrap();
            cuts += 1;
        }
        // an available resource fails (counts +1); once all have, they succeed again (-1)
        let n = available.len();
        if (rounds / n).is_multiple_of(2) {
            set_result(&s, env_id, available[rounds % n], "failed").await;
            expected += 1;
        } else {
            set_result(&s, env_id, available[rounds % n], "deployed").await;
            expected -= 1;
        }
        let written = Instant::now();
        loop {
            let got = failed(&list(&s, &token, &env, "status=failed&limit=1").await);
            if got == expected {
                break;
            }
            assert!(
                written.elapsed() < Duration::from_secs(1),
                "round {rounds}: {got} failed shown, {expected} written {:?} ago",
                written.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        slowest = slowest.max(written.elapsed());
        // and it stays right (kept or not)
        for _ in 0..3 {
            assert_eq!(
                failed(&list(&s, &token, &env, "status=failed&limit=1").await),
                expected
            );
        }
        rounds += 1;
    }
    assert!(
        rounds >= 20 && cuts >= 6,
        "{rounds} rounds, {cuts} cuts in 20 s"
    );
    eprintln!(
        "{rounds} rounds ({cuts} with the listener cut); slowest to show a write: {slowest:?}"
    );

    // pages cut from the counts hold what a plain sort would: by state (byte order), then id,
    // in both directions and across the runs of each state
    let everything = list(&s, &token, &env, "limit=1000").await;
    let mut by_state: Vec<(String, String)> = everything["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["status"].as_str().unwrap().to_string(),
                r["resource_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    by_state.sort();
    let asc: Vec<String> = by_state.iter().map(|(_, id)| id.clone()).collect();
    let desc: Vec<String> = asc.iter().rev().cloned().collect();
    for (order, want) in [("asc", &asc), ("desc", &desc)] {
        let mut got = Vec::new();
        for offset in (0..130).step_by(7) {
            got.extend(ids(&list(
                &s,
                &token,
                &env,
                &format!("sort=status&order={order}&offset={offset}&limit=7"),
            )
            .await));
        }
        assert_eq!(&got, want, "sorted by status, {order}");
    }
    // a state filter, paged: the walk and the planner's plan give the same rows
    let failed_ids: Vec<String> = by_state
        .iter()
        .filter(|(st, _)| st == "failed")
        .map(|(_, id)| id.clone())
        .collect();
    let mut got = Vec::new();
    for offset in (0..failed_ids.len()).step_by(4) {
        got.extend(ids(&list(
            &s,
            &token,
            &env,
            &format!("status=failed&offset={offset}&limit=4"),
        )
        .await));
    }
    assert_eq!(got, failed_ids);
    // sorted by deploy time with the counts in one pass: the newest failures first
    let newest = list(
        &s,
        &token,
        &env,
        "status=failed&sort=deployed&order=desc&limit=3",
    )
    .await;
    assert_eq!(newest["total"], json!(expected));
    assert_eq!(ids(&newest).len(), 3);
}
