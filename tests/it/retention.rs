//! Retention: what grows with time is pruned to the environment's `retention` settings, and
//! a resource that fails for a long time costs a bounded number of rows.

use std::time::{Duration, Instant};

use serde_json::json;
use steward::model::settings::Retention;
use steward::store::retention::{prune_all, prune_environment};

use crate::deploy::{deploy_actions, deploying_env, state_of, upload};
use crate::support::fs_file;

async fn count(pool: &sqlx::PgPool, sql: &str, env: uuid::Uuid) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(env)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn old_records_are_pruned_and_what_is_in_use_is_kept() {
    let (srv, _c, env, _dir) = deploying_env("prune", json!({})).await;
    let id: uuid::Uuid = env.parse().unwrap();
    let pool = &srv.pool;
    // 300 finished actions of one resource in the last hour, 20 from 40 days ago, one
    // open action from 40 days ago
    sqlx::query(
        "INSERT INTO resource_actions (id, environment_id, version, resource_id, action, started_at, finished_at, status) \
         SELECT gen_random_uuid(), $1, 1, 'r[a,k=v]', 'deploy', now() - make_interval(secs => g), now() - make_interval(secs => g), 'failed' \
         FROM generate_series(1, 300) g",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO resource_actions (id, environment_id, version, resource_id, action, started_at, finished_at, status) \
         SELECT gen_random_uuid(), $1, 1, 'other[a,k=v]', 'deploy', now() - interval '40 days', \
                CASE WHEN g = 0 THEN NULL ELSE now() - interval '40 days' END, 'deployed' \
         FROM generate_series(0, 20) g",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    // old and new compile reports, a commit timeline of old events, old audit records,
    // dry-runs beyond the count, an old webhook delivery, a delivered old message
    for (age_days, n) in [(40, 5), (0, 3)] {
        for i in 0..n {
            sqlx::query(
                "INSERT INTO compiles (id, environment_id, commit, branch, trigger, status, requested_at, finished_at) \
                 VALUES (gen_random_uuid(), $1, $2, 'main', 'poll', 'failed', now() - make_interval(days => $3), now())",
            )
            .bind(id)
            .bind(format!("{age_days:02}{i:038}"))
            .bind(age_days)
            .execute(pool)
            .await
            .unwrap();
        }
    }
    sqlx::query(
        "INSERT INTO compiles (id, environment_id, commit, branch, trigger, status, requested_at) \
         VALUES (gen_random_uuid(), $1, 'queued0000', 'main', 'poll', 'queued', now() - interval '90 days')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO commit_events (environment_id, commit, event, at) VALUES \
         ($1, 'old1', 'received', now() - interval '50 days'), ($1, 'old1', 'compile_failed', now() - interval '45 days'), \
         ($1, 'mixed', 'received', now() - interval '50 days'), ($1, 'mixed', 'deployed', now())",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (actor, environment_id, action, at) VALUES \
         ('t', $1, 'old', now() - interval '400 days'), ('t', $1, 'new', now())",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO dryruns (id, environment_id, version, total, requested_by, created_at) \
         SELECT gen_random_uuid(), $1, 1, 0, 't', now() - make_interval(secs => g) FROM generate_series(1, 60) g",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO webhook_deliveries (environment_id, delivery_id, received_at) VALUES \
         ($1, 'old', now() - interval '8 days'), ($1, 'new', now())",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox (environment_id, kind, payload, created_at, delivered_at) VALUES \
         ($1, 'notify', '{}', now() - interval '40 days', now() - interval '40 days'), \
         ($1, 'notify', '{}', now() - interval '40 days', NULL)",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();

    let p = prune_environment(pool, id, &Retention::default(), None)
        .await
        .unwrap();
    assert_eq!(p.actions, 100 + 20, "{p:?}");
    assert_eq!(
        count(pool, "SELECT count(*) FROM resource_actions WHERE environment_id = $1 AND resource_id = 'r[a,k=v]'", id).await,
        200
    );
    assert_eq!(
        count(pool, "SELECT count(*) FROM resource_actions WHERE environment_id = $1 AND finished_at IS NULL", id).await,
        1,
        "an open action is never pruned"
    );
    assert_eq!(p.compiles, 5, "{p:?}");
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM compiles WHERE environment_id = $1 AND status = 'queued'",
            id
        )
        .await,
        1,
        "a queued compile is never pruned"
    );
    assert_eq!(
        p.commit_events, 2,
        "the old timeline goes whole, the mixed one stays: {p:?}"
    );
    assert_eq!(p.audit, 1);
    assert_eq!(p.dryruns, 10);
    assert_eq!(p.webhook_deliveries, 1);
    assert_eq!(p.outbox, 1, "an undelivered message is kept");
    // a second pass finds nothing
    let again = prune_all(pool, None).await.unwrap();
    assert_eq!(again.total(), 0, "{again:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_failing_for_a_long_time_costs_bounded_rows() {
    let (srv, c, env, dir) = deploying_env(
        "bounded",
        json!({
            "retry_backoff": {"initial": 1, "factor": 1, "max": 1},
            "retention": {"actions_per_resource": 10},
        }),
    )
    .await;
    let pruner = tokio::spawn(steward::store::retention::run(
        srv.pool.clone(),
        Duration::from_secs(1),
    ));
    let file = fs_file(
        "localhost",
        &dir.path().join("no/such/dir/f").display().to_string(),
        "x",
        &[],
    );
    let rid = file.id.0.clone();
    upload(&c, &env, vec![file]).await;
    let started = Instant::now();
    let mut most = 0;
    while started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rows = deploy_actions(&c, &env, &rid).await.len();
        most = most.max(rows);
    }
    pruner.abort();
    let s = state_of(&c, &env, &rid).await;
    // about one attempt a second for 20 s, but never more than the limit and what one
    // pruning interval adds
    assert!(
        s.failure_count >= 12,
        "it kept failing: {}",
        s.failure_count
    );
    assert!(
        most <= 10 + 3,
        "{most} action rows for one resource (limit 10)"
    );
}

/// Closed previews beyond `retention.previews` or older than `retention.days` go with their
/// runs; open ones stay, with their newest runs only.
#[tokio::test(flavor = "multi_thread")]
async fn closed_previews_are_pruned_and_open_ones_keep_their_newest_runs() {
    let (srv, _c, env, _dir) = deploying_env("prune-previews", json!({})).await;
    let id: uuid::Uuid = env.parse().unwrap();
    let pool = &srv.pool;
    // 5 closed previews (one closed 40 days ago), and an open one with 15 finished runs
    sqlx::query(
        "INSERT INTO previews (id, environment_id, ref, number, base_branch, state, closed_at) \
         SELECT gen_random_uuid(), $1, 'refs/pull/' || g || '/head', g, 'main', 'closed', \
           CASE WHEN g = 1 THEN now() - interval '40 days' ELSE now() - make_interval(secs => g) END \
         FROM generate_series(1, 5) g",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    let open = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO previews (id, environment_id, ref, number, base_branch, state) \
         VALUES ($2, $1, 'refs/pull/99/head', 99, 'main', 'open')",
    )
    .bind(id)
    .bind(open)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO preview_runs (id, preview_id, environment_id, head, trigger, status, requested_at) \
         SELECT gen_random_uuid(), $2, $1, md5(g::text), 'webhook', 'success', now() - make_interval(secs => g) \
         FROM generate_series(1, 15) g",
    )
    .bind(id)
    .bind(open)
    .execute(pool)
    .await
    .unwrap();
    let r = steward::model::settings::Retention {
        previews: 3,
        ..Default::default()
    };
    let p = steward::store::retention::prune_environment(pool, id, &r, None)
        .await
        .unwrap();
    let closed = count(
        pool,
        "SELECT count(*) FROM previews WHERE environment_id = $1 AND state <> 'open'",
        id,
    )
    .await;
    assert_eq!(
        closed, 3,
        "the newest 3 closed previews stay (the 40-day-old one goes anyway)"
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM previews WHERE environment_id = $1 AND state = 'open'",
            id
        )
        .await,
        1
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM preview_runs WHERE environment_id = $1",
            id
        )
        .await,
        steward::store::previews::RUNS_KEPT
    );
    assert_eq!(p.previews, 2 + 5, "{p:?}");
}
