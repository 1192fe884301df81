//! A scheduler writes a resource's state row when it has something to say: a new resource
//! released and not yet run reads the same with no row (available, has_update, new), so
//! its row comes with its first deploy (or, removed before that, as an orphan's). An orphan
//! that comes back still has its old row (orphaned, with the results of its earlier life),
//! which must be written over: after the scheduler saw it go, after a restart in between
//! (then the scheduler learns of it from the rows it reads at its start), and when its
//! removal and its return reach the writer in one write.

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
    let (x, y, z, w) = (file("x"), file("y"), file("z"), file("w"));
    let (xid, yid, zid, wid) = (
        x.id.0.clone(),
        y.id.0.clone(),
        z.id.0.clone(),
        w.id.0.clone(),
    );

    // released while halted: merged, nothing runs, nothing to say
    c.set_halted(env, true).await.unwrap();
    let v1 = upload(c, env, vec![x.clone(), y.clone(), w.clone()]).await;
    wait_processed(pool, env_id, v1).await;
    for rid in [&xid, &yid, &wid] {
        let stored: Option<serde_json::Value> = sqlx::query_scalar(
            "SELECT to_jsonb(s) FROM resource_state s WHERE environment_id = $1 AND resource_id = $2",
        )
        .bind(env_id)
        .bind(rid)
        .fetch_optional(pool)
        .await
        .unwrap();
        assert_eq!(stored, None, "{rid} has a row before it ran");
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
    assert_eq!(p["by_status"], json!({"available": 3}), "{p}");

    // w goes before it ran: it gets an orphan's row, so that the version it was in shows
    // it orphaned, as every removed resource
    let v2 = upload(c, env, vec![x.clone(), y.clone()]).await;
    wait_processed(pool, env_id, v2).await;
    eventually(30, "w's orphan row", || async {
        (row(pool, env_id, &wid).await == (true, true)).then_some(())
    })
    .await;
    let in_v1 = steward::store::state::list(pool, env_id, v1).await.unwrap();
    let w_in_v1 = in_v1.iter().find(|r| r.resource_id == wid).unwrap();
    assert_eq!(w_in_v1.status, "orphaned");
    assert_eq!(row(pool, env_id, &xid).await, (false, false));

    c.set_halted(env, false).await.unwrap();
    wait_deployed(c, env, v2, 60).await;
    for rid in [&xid, &yid] {
        assert_eq!(
            row(pool, env_id, rid).await,
            (true, false),
            "{rid} ran without a row"
        );
        assert_eq!(state_of(c, env, rid).await.status, "deployed");
    }

    // y goes: its row stays, an orphan's
    let v3 = upload(c, env, vec![x.clone()]).await;
    wait_deployed(c, env, v3, 60).await;
    eventually(30, "y's row orphaned", || async {
        (row(pool, env_id, &yid).await == (true, true)).then_some(())
    })
    .await;

    restart().await;

    // y comes back (the same intent, the same hash) with a new z, while halted: y's old row
    // must not make it an orphan, nor deployed
    c.set_halted(env, true).await.unwrap();
    let v4 = upload(c, env, vec![x.clone(), y.clone(), z.clone()]).await;
    wait_processed(pool, env_id, v4).await;
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
    let p = c.progress(env, v4).await.unwrap();
    assert_eq!(p["done"], false, "{p}");
    assert_eq!(
        p["by_status"],
        json!({"available": 2, "deployed": 1}),
        "{p}"
    );

    c.set_halted(env, false).await.unwrap();
    let p = wait_deployed(c, env, v4, 60).await;
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

/// Removed and back while the writer waits: the removal's orphan mark and the return's row
/// reach the writer in batches it merges into one write, and the return must win (the marks
/// are written after the rows).
#[tokio::test(flavor = "multi_thread")]
async fn a_resource_removed_and_back_in_one_write_is_not_left_an_orphan() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("rows", "merged-writes", None)
        .await
        .unwrap()
        .id
        .to_string();
    let env_id: Uuid = env.parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let x = |content: &str| fs_file(AGENT, &format!("{d}/x"), content, &[]);
    let y = fs_file(AGENT, &format!("{d}/y"), "y", &[]);
    let yid = y.id.0.clone();
    let v1 = upload(&c, &env, vec![x("1"), y.clone()]).await;
    wait_deployed(&c, &env, v1, 60).await;
    c.set_halted(&env, true).await.unwrap();

    // every writer batch takes this row: held, the writer waits in its first batch (v2's
    // merge) while the next two queue up behind it
    let mut hold = srv.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM scheduler_progress WHERE environment_id = $1 FOR UPDATE")
        .bind(env_id)
        .execute(&mut *hold)
        .await
        .unwrap();
    let pause = || tokio::time::sleep(std::time::Duration::from_secs(2));
    upload(&c, &env, vec![x("2"), y.clone()]).await;
    pause().await;
    upload(&c, &env, vec![x("3")]).await;
    pause().await;
    let v4 = upload(&c, &env, vec![x("4"), y.clone()]).await;
    pause().await;
    assert_eq!(
        processed(&srv.pool, env_id).await,
        Some(v1),
        "the writer was not held"
    );
    hold.rollback().await.unwrap();

    wait_processed(&srv.pool, env_id, v4).await;
    eventually(30, "y's row written over", || async {
        (row(&srv.pool, env_id, &yid).await == (true, false)).then_some(())
    })
    .await;
    assert_eq!(state_of(&c, &env, &yid).await.status, "available");
}

/// Orphan marks of one resource in one batch (the writer merges the batches that queued
/// while it wrote): the last one counts, whatever order PostgreSQL's join would take them
/// in; a row written over clears a pending delete.
#[tokio::test(flavor = "multi_thread")]
async fn the_last_orphan_mark_of_a_resource_in_a_write_wins() {
    use steward::store::deploy::{self, Batch, OrphanMark, StateRow};
    let pool = migrated_pool(2).await;
    let env = environment_in(&pool, "rows", "marks", &Default::default()).await;
    let ids: Vec<String> = (0..50).map(|i| format!("t::R[a,n={i}]")).collect();
    let rows = ids
        .iter()
        .map(|id| StateRow {
            resource_id: id.clone(),
            agent: "a".into(),
            compliance: "compliant".into(),
            last_run: "successful".into(),
            blocked: "not_blocked".into(),
            ..Default::default()
        })
        .collect();
    let mark = |id: &str, after, delete_pending| OrphanMark {
        resource_id: id.into(),
        after,
        delete_pending,
    };
    let mut c = pool.acquire().await.unwrap();
    let write = |b: Batch| {
        let pool = pool.clone();
        async move {
            let mut c = pool.acquire().await.unwrap();
            deploy::write_batch(&mut c, env, &b).await.unwrap();
        }
    };
    deploy::write_batch(
        &mut c,
        env,
        &Batch {
            states: rows,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // even ids: pending, then done; odd ids: done, then pending again (removed, back, gone)
    let orphaned = ids
        .iter()
        .enumerate()
        .flat_map(|(i, id)| {
            if i % 2 == 0 {
                [mark(id, 3, true), mark(id, 3, false)]
            } else {
                [mark(id, 3, false), mark(id, 5, true)]
            }
        })
        .collect();
    write(Batch {
        orphaned,
        ..Default::default()
    })
    .await;
    let marks: Vec<(String, Option<i32>, bool)> = sqlx::query_as(
        "SELECT resource_id, orphaned_after, delete_pending FROM resource_state \
         WHERE environment_id = $1",
    )
    .bind(env)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(marks.len(), ids.len());
    for (id, after, pending) in &marks {
        let i = ids.iter().position(|x| x == id).unwrap();
        let want = if i % 2 == 0 {
            (Some(3), false)
        } else {
            (Some(5), true)
        };
        assert_eq!((*after, *pending), want, "{id}");
    }
    let pending = deploy::pending_deletes(&pool, env).await.unwrap();
    assert_eq!(pending.len(), ids.len() / 2);
    assert!(pending.iter().all(|p| p.after == 5 && p.resource.is_none()));
    // back in the model: its row is written over and its delete is no longer pending
    write(Batch {
        states: vec![StateRow {
            resource_id: ids[1].clone(),
            agent: "a".into(),
            compliance: "has_update".into(),
            last_run: "new".into(),
            blocked: "not_blocked".into(),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await;
    let pending = deploy::pending_deletes(&pool, env).await.unwrap();
    assert_eq!(pending.len(), ids.len() / 2 - 1);
    assert!(pending.iter().all(|p| p.resource_id != ids[1]));
}
