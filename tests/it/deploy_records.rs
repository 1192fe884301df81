//! Deploy state and action records have no foreign key to their environment (migration
//! 0022: a trigger call and a row lock per row of every deploy). A deleted environment or
//! project still takes them along, and a scheduler writing while its environment is deleted
//! leaves nothing behind: these tests race the scheduler's writes (its epoch row held, as
//! `scheduler/env/persist.rs` does) against the delete on real PostgreSQL.

use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;
use steward::model::settings::EnvSettings;
use steward::store::actions::ActionRecord;
use steward::store::deploy::{self, Batch, StateRow};
use steward::store::environments;
use uuid::Uuid;

use crate::support::*;

async fn database() -> PgPool {
    migrated_pool(4).await
}

async fn environment(pool: &PgPool, project: &str, name: &str) -> Uuid {
    environment_in(pool, project, name, &EnvSettings::default()).await
}

/// What a scheduler writes after deploying `rid`.
fn batch(env: Uuid, rid: &str) -> Batch {
    Batch {
        states: vec![StateRow {
            resource_id: rid.into(),
            agent: "a".into(),
            compliance: "compliant".into(),
            last_run: "successful".into(),
            blocked: "not_blocked".into(),
            ..Default::default()
        }],
        actions: vec![ActionRecord {
            id: Uuid::now_v7(),
            environment_id: env,
            version: 1,
            resource_id: rid.into(),
            action: "deploy".into(),
            started_at: Utc::now(),
            finished_at: Some(Utc::now()),
            status: "deployed".into(),
            change: "created".into(),
            changes: serde_json::json!({}),
            messages: serde_json::json!([]),
        }],
        ..Default::default()
    }
}

/// Rows of `env` in resource_state and resource_actions.
async fn records(pool: &PgPool, env: Uuid) -> (i64, i64) {
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(env)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    (
        count("SELECT count(*) FROM resource_state WHERE environment_id = $1").await,
        count("SELECT count(*) FROM resource_actions WHERE environment_id = $1").await,
    )
}

/// One scheduler write, as `persist::write_fenced` does it: the epoch row held, then the
/// batch. `false`: the epoch was gone (the environment deleted), nothing written.
async fn write(pool: &PgPool, env: Uuid, epoch: i64, rid: &str) -> bool {
    let mut tx = pool.begin().await.unwrap();
    if !deploy::holds_epoch(&mut tx, env, epoch).await.unwrap() {
        return false;
    }
    deploy::write_batch(&mut tx, env, &batch(env, rid))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_environment_or_project_takes_its_deploy_records() {
    let pool = database().await;
    let a = environment(&pool, "p", "a").await;
    let b = environment(&pool, "p", "b").await;
    let other = environment(&pool, "q", "c").await;
    for env in [a, b, other] {
        let epoch = deploy::claim_epoch(&pool, env).await.unwrap();
        assert!(write(&pool, env, epoch, "r1").await);
        assert!(write(&pool, env, epoch, "r2").await);
        assert_eq!(records(&pool, env).await, (2, 2));
    }
    let mut c = pool.acquire().await.unwrap();
    environments::delete_environment(&mut c, a).await.unwrap();
    assert_eq!(
        records(&pool, a).await,
        (0, 0),
        "the environment's records stayed"
    );

    let project: Uuid = sqlx::query_scalar("SELECT id FROM projects WHERE name = 'p'")
        .fetch_one(&pool)
        .await
        .unwrap();
    environments::delete_project(&mut c, project).await.unwrap();
    assert_eq!(
        records(&pool, b).await,
        (0, 0),
        "the project's environment's records stayed"
    );
    assert_eq!(
        records(&pool, other).await,
        (2, 2),
        "another environment lost records"
    );
}

/// The scheduler holds its epoch row and is writing when the environment is deleted: the
/// delete waits for the write and then removes what it wrote too.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_waits_for_a_scheduler_write_in_progress_and_takes_it_along() {
    let pool = database().await;
    let env = environment(&pool, "p", "racing").await;
    let epoch = deploy::claim_epoch(&pool, env).await.unwrap();
    assert!(write(&pool, env, epoch, "before").await);

    // a write in progress: epoch held, rows written, not committed yet
    let mut writer = pool.begin().await.unwrap();
    assert!(deploy::holds_epoch(&mut writer, env, epoch).await.unwrap());
    deploy::write_batch(&mut writer, env, &batch(env, "during"))
        .await
        .unwrap();

    let deleting = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut c = pool.acquire().await.unwrap();
            environments::delete_environment(&mut c, env).await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !deleting.is_finished(),
        "the delete did not wait for the scheduler's write in progress"
    );
    writer.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), deleting)
        .await
        .expect("the delete to end")
        .unwrap();
    assert_eq!(
        records(&pool, env).await,
        (0, 0),
        "deploy records of a deleted environment were left behind"
    );
}

/// A scheduler write that begins while the environment's delete is not yet committed waits
/// for it, then finds no epoch and writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_scheduler_write_during_a_delete_writes_nothing() {
    let pool = database().await;
    let env = environment(&pool, "p", "racing").await;
    let epoch = deploy::claim_epoch(&pool, env).await.unwrap();

    let mut deleter = pool.begin().await.unwrap();
    environments::delete_environment(&mut deleter, env)
        .await
        .unwrap();
    let late = tokio::spawn({
        let pool = pool.clone();
        async move { write(&pool, env, epoch, "late").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !late.is_finished(),
        "the write did not wait for the delete in progress"
    );
    deleter.commit().await.unwrap();
    let wrote = tokio::time::timeout(Duration::from_secs(30), late)
        .await
        .expect("the write to end")
        .unwrap();
    assert!(!wrote, "the write found the epoch of a deleted environment");
    assert_eq!(records(&pool, env).await, (0, 0));
}

/// An action reported through the API for an environment deleted meanwhile is refused,
/// not stored without an environment.
#[tokio::test(flavor = "multi_thread")]
async fn an_action_reported_for_a_deleted_environment_is_not_stored() {
    let pool = database().await;
    let env = environment(&pool, "p", "gone").await;
    let mut c = pool.acquire().await.unwrap();
    environments::delete_environment(&mut c, env).await.unwrap();
    let record = batch(env, "r").actions.remove(0);
    let err = steward::store::actions::upsert(&pool, &record)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("belongs to another environment"),
        "{err}"
    );
    assert_eq!(records(&pool, env).await, (0, 0));
}
