//! A scheduler writes a resource's state row when it has something to say: a new resource
//! released and not yet run reads the same with no row (available, has_update, new), so
//! its row comes with its first deploy. An orphan that comes back still has its old row
//! (orphaned, with the results of its earlier life), which must be written over: after the
//! scheduler saw it go, and after a restart in between (then the scheduler learns of it from
//! the rows it reads at its start).

use serde_json::json;
use steward::client::Client;
use uuid::Uuid;

use crate::deploy::{state_of, upload};
use crate::support::*;

const AGENT: &str = "localhost";

async fn processed(pool: &sqlx::PgPool, env: Uuid) -> Option<i32> {
    steward::store::deploy::load_progress(pool, env)
        .await
        .unwrap()
}

async fn wait_processed(pool: &sqlx::PgPool, env: Uuid, version: i32) {
    eventually(30, &format!("version {version} merged"), || async {
        (processed(pool, env).await >= Some(version)).then_some(())
    })
    .await;
}

/// The state row of `rid`: (whether it exists, whether it is an orphan's).
async fn row(pool: &sqlx::PgPool, env: Uuid, rid: &str) -> (bool, bool) {
    let r: Option<Option<i32>> = sqlx::query_scalar(
        "SELECT orphaned_after FROM resource_state WHERE environment_id = $1 AND resource_id = $2",
    )
    .bind(env)
    .bind(rid)
    .fetch_optional(pool)
    .await
    .unwrap();
    (r.is_some(), r.flatten().is_some())
}

/// The sequence, on a server that `restart` restarts (or does not) once `y` is an orphan.
async fn rows_follow_what_they_say<R, F>(c: &Client, pool: &sqlx::PgPool, env: &str, restart: R)
where
    R: FnOnce() -> F,
    F: std::future::Future<Output = ()>,
{
    let env_id: Uuid = env.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let file = |name: &str| fs_file(AGENT, &format!("{d}/{name}"), name, &[]);
    let (x, y, z) = (file("x"), file("y"), file("z"));
    let (xid, yid, zid) = (x.id.0.clone(), y.id.0.clone(), z.id.0.clone());

    // released while halted: merged, nothing runs, nothing to say
    c.set_halted(env, true).await.unwrap();
    let v1 = upload(c, env, vec![x.clone(), y.clone()]).await;
    wait_processed(pool, env_id, v1).await;
    for rid in [&xid, &yid] {
        assert_eq!(
            row(pool, env_id, rid).await,
            (false, false),
            "{rid} has a row before it ran"
        );
        let s = state_of(c, env, rid).await;
        assert_eq!(
            (
                s.status.as_str(),
                s.compliance.as_str(),
                s.last_run.as_str(),
                s.blocked.as_str()
            ),
            ("available", "has_update", "new", "not_blocked"),
            "{rid}"
        );
    }
    let p = c.progress(env, v1).await.unwrap();
    assert_eq!(p["done"], false, "{p}");
    assert_eq!(p["by_status"], json!({"available": 2}), "{p}");

    c.set_halted(env, false).await.unwrap();
    wait_deployed(c, env, v1, 60).await;
    for rid in [&xid, &yid] {
        assert_eq!(
            row(pool, env_id, rid).await,
            (true, false),
            "{rid} ran without a row"
        );
        assert_eq!(state_of(c, env, rid).await.status, "deployed");
    }

    // y goes: its row stays, an orphan's
    let v2 = upload(c, env, vec![x.clone()]).await;
    wait_deployed(c, env, v2, 60).await;
    eventually(30, "y's row orphaned", || async {
        (row(pool, env_id, &yid).await == (true, true)).then_some(())
    })
    .await;

    restart().await;

    // y comes back (the same intent, the same hash) with a new z, while halted: y's old row
    // must not make it an orphan, nor deployed
    c.set_halted(env, true).await.unwrap();
    let v3 = upload(c, env, vec![x.clone(), y.clone(), z.clone()]).await;
    wait_processed(pool, env_id, v3).await;
    eventually(30, "y's row written over", || async {
        (row(pool, env_id, &yid).await == (true, false)).then_some(())
    })
    .await;
    let s = state_of(c, env, &yid).await;
    assert_eq!(
        (
            s.status.as_str(),
            s.compliance.as_str(),
            s.last_result.as_deref()
        ),
        ("available", "has_update", None),
        "y came back as its old self"
    );
    assert_eq!(
        row(pool, env_id, &zid).await,
        (false, false),
        "z has a row before it ran"
    );
    let p = c.progress(env, v3).await.unwrap();
    assert_eq!(p["done"], false, "{p}");
    assert_eq!(
        p["by_status"],
        json!({"available": 2, "deployed": 1}),
        "{p}"
    );

    c.set_halted(env, false).await.unwrap();
    let p = wait_deployed(c, env, v3, 60).await;
    assert_eq!(p["by_status"], json!({"deployed": 3}), "{p}");
    for rid in [&xid, &yid, &zid] {
        assert_eq!(row(pool, env_id, rid).await, (true, false), "{rid}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_resource_has_no_row_until_it_runs_and_a_returning_orphan_is_written_over() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("rows", "in-process", None)
        .await
        .unwrap()
        .id
        .to_string();
    rows_follow_what_they_say(&c, &srv.pool, &env, || async {}).await;
}

/// The same across a restart (kill -9) once y is an orphan: the new scheduler knows of y's
/// row only from what it reads at its start.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_scheduler_finds_the_orphans_rows_it_must_write_over() {
    let mut server = Spawned::start("stw_test_admin_secret_state_rows").await;
    let pool = steward::store::connect(&server.db, 2).await.unwrap();
    let c = server.client.clone();
    let env = c
        .create_environment("rows", "restarted", None)
        .await
        .unwrap()
        .id
        .to_string();
    let server = &mut server;
    rows_follow_what_they_say(&c, &pool, &env, move || server.restart()).await;
}
