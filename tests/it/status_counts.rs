//! A scheduler answers a version's counts per status from its model (the progress endpoint
//! asks it instead of joining every resource with its state): `store::state::status_of`,
//! the Rust twin of the SQL that gives each resource its status, must give every state row
//! the status the database gives it. Random rows of every kind (none, orphaned, deploying,
//! blocked for this intent or another, results of this hash or another) are written with
//! the scheduler's own batch writer and read back through the resource list and the counts.

use std::collections::BTreeMap;

use chrono::Utc;
use serde_json::json;
use steward::model::*;
use steward::store::deploy::{self, Batch, StateRow};
use steward::store::state::{self, StatusFields};
use steward::store::versions;

use crate::support::*;

const RESULTS: [Option<&str>; 7] = [
    None,
    Some("deployed"),
    Some("failed"),
    Some("skipped"),
    Some("skipped_for_dependency"),
    Some("unavailable"),
    Some("timed_out"),
];

fn pick<T: Copy>(rng: &mut Rng, from: &[T]) -> T {
    from[rng.below(from.len())]
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_status_of_every_kind_of_row_is_the_databases() {
    let pool = migrated_pool(2).await;
    let env = environment_in(&pool, "twin", "twin", &Default::default()).await;
    let n = 600;
    let resources: Vec<Resource> = (0..n)
        .map(|i| Resource {
            id: ResourceId(format!("t::R[a,n=r{i:03}]")),
            type_name: "t::R".into(),
            agent: "a".into(),
            attributes: json!({"n": i}).as_object().unwrap().clone(),
            requires: vec![],
        })
        .collect();
    let export = ExportFile {
        format: EXPORT_FORMAT,
        undefined: (0..n).step_by(9).map(|i| resources[i].id.clone()).collect(),
        resources,
        ..Default::default()
    };
    let mut c = pool.acquire().await.unwrap();
    let number = versions::store(
        &mut c,
        env,
        versions::NewVersion {
            export: &export,
            uploader: "test",
            origin: "push",
            provenance: json!({}),
            attributes_beside: None,
        },
    )
    .await
    .unwrap()
    .info
    .number;
    let digests = versions::resource_digests(&pool, env, number)
        .await
        .unwrap();
    assert_eq!(digests.len(), n);

    let mut rng = Rng(0x5747_0c0d);
    let mut rows = Vec::new();
    for d in &digests {
        // a fifth has no state row at all
        if rng.below(5) == 0 {
            continue;
        }
        let hash = |rng: &mut Rng| match rng.below(3) {
            0 => None,
            1 => Some(d.hash.clone()),
            _ => Some("another".repeat(8)),
        };
        rows.push(StateRow {
            resource_id: d.resource_id.clone(),
            agent: d.agent.clone(),
            intent_version: Some(number),
            intent_hash: hash(&mut rng),
            undefined: d.undefined,
            compliance: "has_update".into(),
            last_run: "new".into(),
            last_result: pick(&mut rng, &RESULTS).map(str::to_string),
            blocked: pick(&mut rng, &["blocked", "not_blocked", "temporarily_blocked"]).into(),
            last_run_hash: hash(&mut rng),
            deploying_since: (rng.below(8) == 0).then(Utc::now),
            orphaned_after: (rng.below(10) == 0).then_some(number),
            ..Default::default()
        });
    }
    deploy::write_batch(
        &mut c,
        env,
        &Batch {
            states: rows.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();

    let by_id: BTreeMap<&str, &StateRow> =
        rows.iter().map(|r| (r.resource_id.as_str(), r)).collect();
    let mut twin_counts: BTreeMap<String, i64> = BTreeMap::new();
    for listed in state::list(&pool, env, number).await.unwrap() {
        let fields = by_id
            .get(listed.resource_id.as_str())
            .map(|r| StatusFields {
                orphaned: r.orphaned_after.is_some(),
                deploying: r.deploying_since.is_some(),
                blocked: &r.blocked,
                intent_hash: r.intent_hash.as_deref(),
                last_result: r.last_result.as_deref(),
                last_run_hash: r.last_run_hash.as_deref(),
            });
        let twin = state::status_of(fields.as_ref(), &listed.hash, listed.undefined);
        assert_eq!(
            twin,
            listed.status,
            "{}: {:?} (hash {}, undefined {})",
            listed.resource_id,
            by_id.get(listed.resource_id.as_str()),
            listed.hash,
            listed.undefined
        );
        *twin_counts.entry(twin.to_string()).or_default() += 1;
    }
    let counted: BTreeMap<String, i64> = state::status_counts(&pool, env, number)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(twin_counts, counted);
    // every status the SQL knows came up, so no branch went unchecked
    for status in [
        "orphaned",
        "deploying",
        "undefined",
        "skipped_for_undefined",
        "available",
        "deployed",
        "failed",
        "skipped",
        "skipped_for_dependency",
        "unavailable",
        "timed_out",
    ] {
        assert!(counted.contains_key(status), "no {status} in {counted:?}");
    }
}

/// The scheduler's counts are given only once the database holds the states they were
/// counted from: while a transaction holds the row each of its writer's batches locks, a
/// version deployed in the scheduler's memory (one resource failing) is not reported done;
/// let go, it is, counted by the scheduler, with the database's counts. Counts answered
/// without waiting for the writer would say done while the database says otherwise.
#[tokio::test(flavor = "multi_thread")]
async fn the_schedulers_counts_wait_until_their_states_are_stored() {
    use sqlx::Connection;

    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c.create_environment("twin", "held", None).await.unwrap().id;
    let env_key = env.to_string();
    c.upload(&env_key, &null_export(4, None), json!({}))
        .await
        .unwrap();
    wait_deployed(&c, &env_key, 1, 60).await;
    let p = c.progress(&env_key, 1).await.unwrap();
    assert_eq!(p["counted_by"], "scheduler", "{p}");

    // every batch of the writer takes this row FOR SHARE: held, nothing is written
    let mut conn = sqlx::PgConnection::connect(&srv.db_url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT epoch FROM scheduler_progress WHERE environment_id = $1 FOR UPDATE")
        .bind(env)
        .execute(&mut *tx)
        .await
        .unwrap();
    c.upload(&env_key, &null_export(5, Some(1)), json!({}))
        .await
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut checked_at = Utc::now();
    while std::time::Instant::now() < until {
        checked_at = Utc::now();
        let p = c.progress(&env_key, 2).await.unwrap();
        assert_eq!(p["done"], false, "done while no state of it is stored: {p}");
        assert_eq!(p["counted_by"], "database", "{p}");
    }
    // a metrics scrape does not show what the held writer has not stored
    let scraped = resource_metrics(&srv, "twin/held").await;
    let stored: BTreeMap<String, i64> = state::status_counts(&srv.pool, env, 2)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(scraped, stored, "the scrape did not show what is stored");
    tx.rollback().await.unwrap();

    let p = c
        .progress_when_done(&env_key, 2, std::time::Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(p["done"], true, "{p}");
    assert_eq!(p["counted_by"], "scheduler", "{p}");
    assert_eq!(p["by_status"], json!({"deployed": 4, "failed": 1}), "{p}");
    let counted: BTreeMap<String, i64> = state::status_counts(&srv.pool, env, 2)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(p["by_status"], json!(counted));
    assert_eq!(resource_metrics(&srv, "twin/held").await, counted);
    // the deploys of the two resources of new intent (r1 changed and failing, r4 new; the
    // others are unchanged) had ended in the scheduler's memory before the last check that
    // found the version not done: that check is what counts answered unstored would have
    // failed (the failing one is retried later: its first end counts)
    let (ended,): (i64,) = sqlx::query_as(
        "SELECT count(DISTINCT resource_id) FROM resource_actions \
         WHERE environment_id = $1 AND version = 2 AND finished_at < $2",
    )
    .bind(env)
    .bind(checked_at)
    .fetch_one(&srv.pool)
    .await
    .unwrap();
    assert_eq!(
        ended, 2,
        "not every deploy had ended before the last check at {checked_at}: nothing was tested"
    );
}

/// The `steward_resources` gauges of `/metrics` for `environment` (project/name), by status.
async fn resource_metrics(srv: &TestServer, environment: &str) -> BTreeMap<String, i64> {
    let text = metrics_text(&srv.url, srv.admin.as_deref().unwrap()).await;
    let prefix = format!("steward_resources{{environment=\"{environment}\",status=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            let (status, n) = rest.split_once("\"} ").expect("a gauge line");
            (status.to_string(), n.parse().expect("a count"))
        })
        .collect()
}
