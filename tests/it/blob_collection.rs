//! Attributes (blobs) are shared by content between versions and environments, and the
//! spans that refer to them have no foreign key (migration 0021: it cost half of a first
//! version's span inserts). These tests race a store that refers to an existing blob against
//! the collector that deletes blobs nobody refers to, in both orders, on real PostgreSQL
//! with two connections, and check that a deleted environment or project takes its spans
//! and its own blobs along and leaves the shared ones.

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;
use steward::model::settings::EnvSettings;
use steward::model::*;
use steward::store::{environments, versions};
use uuid::Uuid;

use crate::support::*;

async fn database() -> PgPool {
    migrated_pool(4).await
}

async fn environment(pool: &PgPool, project: &str, name: &str) -> Uuid {
    let settings = EnvSettings {
        auto_release: false,
        ..Default::default()
    };
    environment_in(pool, project, name, &settings).await
}

/// One file resource with `content`.
fn export(content: &str) -> ExportFile {
    let id = ResourceId::new("fs::File", "a", "path", "/f");
    ExportFile {
        format: EXPORT_FORMAT,
        resources: vec![Resource {
            id,
            type_name: "fs::File".into(),
            agent: "a".into(),
            attributes: json!({"path": "/f", "content": content})
                .as_object()
                .unwrap()
                .clone(),
            requires: vec![],
        }],
        ..Default::default()
    }
}

async fn store(c: &mut sqlx::PgConnection, env: Uuid, content: &str) -> i32 {
    versions::store(
        c,
        env,
        versions::NewVersion {
            export: &export(content),
            uploader: "test",
            origin: "push",
            provenance: json!({}),
            attributes_beside: None,
        },
    )
    .await
    .unwrap()
    .info
    .number
}

fn hash_of(content: &str) -> String {
    export(content).resources[0].hash()
}

async fn blob_exists(pool: &PgPool, hash: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM resource_blobs WHERE hash = $1)")
        .bind(hash)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every span of every environment refers to a blob that exists.
async fn assert_no_span_without_its_blob(pool: &PgPool) {
    let dangling: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM resource_spans s WHERE NOT EXISTS \
         (SELECT 1 FROM resource_blobs b WHERE b.hash = s.hash)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(dangling, 0, "spans refer to attributes that are not there");
}

/// Every span refers to a blob that exists, and the version reads back with its attributes.
async fn assert_readable(pool: &PgPool, env: Uuid, number: i32, content: &str) {
    assert_no_span_without_its_blob(pool).await;
    let read = versions::resources(pool, env, number).await.unwrap();
    assert_eq!(read.len(), 1, "version {number} lost its resource");
    assert_eq!(read[0].attributes["content"], content);
}

/// A store refers to a blob another environment is about to collect: the collector leaves
/// the blob alone (without waiting for the store) and the stored version keeps its
/// attributes.
#[tokio::test(flavor = "multi_thread")]
async fn the_collector_keeps_a_blob_that_a_store_in_progress_refers_to() {
    let pool = database().await;
    let a = environment(&pool, "p", "a").await;
    let b = environment(&pool, "p", "b").await;
    let mut c = pool.acquire().await.unwrap();
    // a's version 1 is the only one that refers to "shared"
    store(&mut c, a, "shared").await;
    store(&mut c, a, "a two").await;
    store(&mut c, b, "b one").await;
    drop(c);

    // b stores "shared" again and has not committed yet
    let mut tx_b = pool.begin().await.unwrap();
    let number = store(&mut tx_b, b, "shared").await;
    // a deletes its version 1: as far as committed spans go, nothing refers to "shared"
    let mut tx_a = pool.begin().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), versions::delete(&mut tx_a, a, 1))
        .await
        .expect("the collector does not wait for the store")
        .unwrap();
    tx_a.commit().await.unwrap();
    tx_b.commit().await.unwrap();
    assert!(
        blob_exists(&pool, &hash_of("shared")).await,
        "the collector deleted attributes a store in progress refers to"
    );
    assert_readable(&pool, b, number, "shared").await;
}

/// The collector deleted a blob and has not committed when a store refers to it: the store
/// waits and writes the blob again.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_after_the_collector_writes_the_blob_again() {
    let pool = database().await;
    let a = environment(&pool, "p", "a").await;
    let b = environment(&pool, "p", "b").await;
    let mut c = pool.acquire().await.unwrap();
    store(&mut c, a, "shared").await;
    store(&mut c, a, "a two").await;
    store(&mut c, b, "b one").await;
    drop(c);

    let mut tx_a = pool.begin().await.unwrap();
    versions::delete(&mut tx_a, a, 1).await.unwrap();
    let pool_b = pool.clone();
    let storer = tokio::spawn(async move {
        let mut tx_b = pool_b.begin().await.unwrap();
        let n = store(&mut tx_b, b, "shared").await;
        tx_b.commit().await.unwrap();
        n
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx_a.commit().await.unwrap();
    let number = tokio::time::timeout(Duration::from_secs(10), storer)
        .await
        .expect("the store goes on once the collector committed")
        .unwrap();
    assert!(blob_exists(&pool, &hash_of("shared")).await);
    assert_readable(&pool, b, number, "shared").await;
}

/// Two environments each store what the other is collecting, crosswise: neither collector
/// waits for the other's store, so they can not deadlock (with the spans' foreign key, or
/// a collector that waited, one of the two failed with a deadlock after a second).
#[tokio::test(flavor = "multi_thread")]
async fn crosswise_stores_and_collections_do_not_deadlock() {
    let pool = database().await;
    let a = environment(&pool, "p", "a").await;
    let b = environment(&pool, "p", "b").await;
    let mut c = pool.acquire().await.unwrap();
    store(&mut c, a, "y").await;
    store(&mut c, a, "a two").await;
    store(&mut c, b, "x").await;
    store(&mut c, b, "b two").await;
    drop(c);

    let mut tx_a = pool.begin().await.unwrap();
    let mut tx_b = pool.begin().await.unwrap();
    let in_a = store(&mut tx_a, a, "x").await;
    let in_b = store(&mut tx_b, b, "y").await;
    let (da, db) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            versions::delete(&mut tx_a, a, 1),
            versions::delete(&mut tx_b, b, 1)
        )
    })
    .await
    .expect("the collectors do not wait for each other's stores");
    da.expect("a's collection");
    db.expect("b's collection");
    tx_a.commit().await.unwrap();
    tx_b.commit().await.unwrap();
    assert_readable(&pool, a, in_a, "x").await;
    assert_readable(&pool, b, in_b, "y").await;
}

/// Many stores and deletions of versions that share attributes, in two environments at
/// once: no span is ever left without its blob, and nothing fails.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_stores_and_collections_leave_no_span_without_its_blob() {
    let pool = database().await;
    let envs = [
        environment(&pool, "p", "a").await,
        environment(&pool, "p", "b").await,
    ];
    let mut tasks = Vec::new();
    for (i, env) in envs.into_iter().enumerate() {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..60 {
                // both environments cycle through the same three contents, out of step
                let content = format!("content {}", (round + i) % 3);
                let mut tx = pool.begin().await.unwrap();
                let n = store(&mut tx, env, &content).await;
                if n > 1 {
                    versions::delete(&mut tx, env, n - 1).await.unwrap();
                }
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for env in envs {
        let newest: i32 =
            sqlx::query_scalar("SELECT max(number) FROM versions WHERE environment_id = $1")
                .bind(env)
                .fetch_one(&pool)
                .await
                .unwrap();
        let content = format!("content {}", (59 + usize::from(env != envs[0])) % 3);
        assert_readable(&pool, env, newest, &content).await;
    }
    // what no version refers to was collected
    let blobs: i64 = sqlx::query_scalar("SELECT count(*) FROM resource_blobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        blobs <= 2,
        "{blobs} blobs kept for 2 versions of one resource"
    );
}

/// A deleted environment takes its spans and the blobs only it used; the blobs another
/// environment shares stay. The same through a deleted project.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_environment_or_project_takes_its_spans_and_own_blobs() {
    let pool = database().await;
    let a = environment(&pool, "p", "a").await;
    let b = environment(&pool, "p", "b").await;
    let other = environment(&pool, "q", "c").await;
    let mut c = pool.acquire().await.unwrap();
    store(&mut c, a, "only a").await;
    store(&mut c, a, "shared").await;
    store(&mut c, b, "only b").await;
    store(&mut c, other, "shared").await;

    let spans_of = |env: Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM resource_spans WHERE environment_id = $1",
            )
            .bind(env)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(spans_of(a).await, 2);
    environments::delete_environment(&mut c, a).await.unwrap();
    assert_eq!(spans_of(a).await, 0, "the environment's spans stayed");
    assert!(!blob_exists(&pool, &hash_of("only a")).await);
    assert!(blob_exists(&pool, &hash_of("shared")).await);

    let project: Uuid = sqlx::query_scalar("SELECT id FROM projects WHERE name = 'p'")
        .fetch_one(&pool)
        .await
        .unwrap();
    environments::delete_project(&mut c, project).await.unwrap();
    assert_eq!(
        spans_of(b).await,
        0,
        "the project's environment's spans stayed"
    );
    assert!(!blob_exists(&pool, &hash_of("only b")).await);
    assert!(blob_exists(&pool, &hash_of("shared")).await);
    assert_readable(&pool, other, 1, "shared").await;
}

/// The retention pass collects attributes no span refers to (those a collector skipped for
/// a store that then rolled back, and those of environments deleted before environments
/// took their blobs along), and keeps one that a store in progress holds.
#[tokio::test(flavor = "multi_thread")]
async fn the_retention_pass_collects_attributes_nothing_refers_to() {
    let pool = database().await;
    let a = environment(&pool, "p", "a").await;
    let b = environment(&pool, "p", "b").await;
    let mut c = pool.acquire().await.unwrap();
    store(&mut c, a, "kept").await;
    drop(c);
    let orphan = |content: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query("INSERT INTO resource_blobs (hash, attributes) VALUES ($1, $2)")
                .bind(hash_of(content))
                .bind(json!({"path": "/f", "content": content}))
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    orphan("left behind").await;
    orphan("held").await;
    // a store in progress refers to "held", which exists but no span refers to yet
    let mut tx_b = pool.begin().await.unwrap();
    let number = store(&mut tx_b, b, "held").await;
    let pruned = tokio::time::timeout(
        Duration::from_secs(10),
        steward::store::retention::prune_global(&pool, 90),
    )
    .await
    .expect("the pass does not wait for the store")
    .unwrap();
    assert_eq!(pruned.resource_blobs, 1, "{pruned:?}");
    assert!(!blob_exists(&pool, &hash_of("left behind")).await);
    assert!(blob_exists(&pool, &hash_of("held")).await);
    assert!(blob_exists(&pool, &hash_of("kept")).await);
    tx_b.commit().await.unwrap();
    assert_readable(&pool, b, number, "held").await;
    let again = steward::store::retention::prune_global(&pool, 90)
        .await
        .unwrap();
    assert_eq!(again.resource_blobs, 0, "{again:?}");
    assert_readable(&pool, a, 1, "kept").await;
}

/// The retention pass (every 200 ms) and two environments that store a version every few
/// ms and keep only their newest two, sharing their contents, for 20 s: every kept version
/// reads back whole, no span is left without its blob, and the blobs kept stay within what
/// the kept versions refer to, all along.
#[tokio::test(flavor = "multi_thread")]
async fn stores_retention_and_the_pass_over_twenty_seconds_keep_exactly_what_versions_use() {
    let pool = database().await;
    let settings = EnvSettings {
        auto_release: false,
        version_retention: 2,
        ..Default::default()
    };
    let p = environments::create_project(&pool, "p").await.unwrap().id;
    let mut envs = Vec::new();
    for name in ["a", "b"] {
        envs.push(
            environments::create_environment(&pool, p, name, &settings)
                .await
                .unwrap(),
        );
    }
    let pruner = tokio::spawn(steward::store::retention::run(
        pool.clone(),
        Duration::from_millis(200),
    ));
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let mut writers = Vec::new();
    for (i, env) in envs.iter().copied().enumerate() {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            let mut round = 0usize;
            let mut c = pool.acquire().await.unwrap();
            while std::time::Instant::now() < until {
                // a new content each round, the same sequence in both environments, one
                // apart: without collection the blobs grow by one per round
                store(&mut c, env, &format!("content {}", round + i)).await;
                round += 1;
            }
            round
        }));
    }
    let mut most_blobs = 0;
    while std::time::Instant::now() < until {
        let blobs: i64 = sqlx::query_scalar("SELECT count(*) FROM resource_blobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        most_blobs = most_blobs.max(blobs);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rounds = 0;
    for w in writers {
        rounds += w.await.unwrap();
    }
    pruner.abort();
    assert!(rounds > 100, "only {rounds} versions stored in 20 s");
    // two environments keep two versions of one resource each: at most 4 contents in use,
    // and what a store in progress adds or a collector skipped for a moment
    assert!(
        most_blobs <= 10,
        "{most_blobs} blobs at once ({rounds} versions stored)"
    );
    for env in envs {
        let kept: Vec<i32> =
            sqlx::query_scalar("SELECT number FROM versions WHERE environment_id = $1")
                .bind(env)
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(kept.len(), 2, "{kept:?}");
        for n in kept {
            let read = versions::resources(&pool, env, n).await.unwrap();
            assert_eq!(read.len(), 1, "version {n} lost its resource");
            assert!(read[0].attributes["content"].is_string());
        }
    }
    let dangling: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM resource_spans s WHERE NOT EXISTS \
         (SELECT 1 FROM resource_blobs b WHERE b.hash = s.hash)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dangling, 0);
}

/// A version of `n` files whose contents are `tag` and their number.
fn large_export(n: usize, tag: &str) -> ExportFile {
    ExportFile {
        format: EXPORT_FORMAT,
        resources: (0..n)
            .map(|i| {
                let path = format!("/f{i}");
                Resource {
                    id: ResourceId::new("fs::File", "a", "path", &path),
                    type_name: "fs::File".into(),
                    agent: "a".into(),
                    attributes: json!({"path": path, "content": format!("{tag} {i}")})
                        .as_object()
                        .unwrap()
                        .clone(),
                    requires: vec![],
                }
            })
            .collect(),
        ..Default::default()
    }
}

/// Store `export` as the next version of `env`, its attributes written beside its
/// transaction when there are enough of them; its number.
async fn store_beside(pool: &PgPool, env: Uuid, export: &ExportFile) -> i32 {
    let mut tx = pool.begin().await.unwrap();
    let stored = versions::store(
        &mut tx,
        env,
        versions::NewVersion {
            export,
            uploader: "test",
            origin: "push",
            provenance: json!({}),
            attributes_beside: Some(pool),
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    stored.info.number
}

/// Every resource of version `number` of `env` has the attributes of `export`.
async fn assert_stored_as(pool: &PgPool, env: Uuid, number: i32, export: &ExportFile) {
    assert_no_span_without_its_blob(pool).await;
    let mut read = versions::resources(pool, env, number).await.unwrap();
    read.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
    let mut sent: Vec<&Resource> = export.resources.iter().collect();
    sent.sort_by(|a, b| a.id.0.cmp(&b.id.0));
    assert_eq!(read.len(), sent.len(), "version {number} lost resources");
    for (r, s) in read.iter().zip(sent) {
        assert_eq!(r.resource_id, s.id.0);
        assert_eq!(
            r.attributes,
            serde_json::Value::Object(s.attributes.clone()),
            "{}",
            r.resource_id
        );
    }
}

/// A large version's attributes are written from a second connection, each statement
/// committed, while its transaction writes its spans (`attributes_beside`). Until that
/// transaction commits nothing refers to them, and a collector that runs then takes them:
/// the transaction must write them again. The test stops the transaction at its spans (a
/// lock on their table), lets the attributes arrive beside it, runs the retention pass,
/// which takes every one of them, and then lets the version be stored.
#[tokio::test(flavor = "multi_thread")]
async fn attributes_written_beside_a_version_and_collected_meanwhile_are_written_again() {
    let pool = migrated_pool(8).await;
    let env = environment(&pool, "p", "large").await;
    // enough resources for the version's attributes to be written beside it, in several
    // statements
    let n = 12_000;
    let export = large_export(n, "first");
    // the store writes beside its transaction only on a connection it gets within 100 ms;
    // a busy machine can take longer to open one (a backend forked, a login), and the
    // store then writes them itself, which is not what this test is about: connections
    // opened now are idle in the pool when the store asks
    let opened = futures_util::future::join_all((0..4).map(|_| pool.acquire())).await;
    drop(opened);

    let mut holder = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE resource_spans IN SHARE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let storing = tokio::spawn({
        let (pool, export) = (pool.clone(), export.clone());
        async move { store_beside(&pool, env, &export).await }
    });
    // the attributes arrive beside the transaction, which waits for the spans' table
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let blobs: i64 = sqlx::query_scalar("SELECT count(*) FROM resource_blobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        if blobs == n as i64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the attributes were not written beside the version's transaction ({blobs} of {n})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !storing.is_finished(),
        "the version was stored before its spans' table was free"
    );
    // nothing refers to them yet: the collector takes them all
    let pruned = steward::store::retention::prune_global(&pool, 90)
        .await
        .unwrap();
    assert_eq!(pruned.resource_blobs, n as u64, "{pruned:?}");
    holder.commit().await.unwrap();
    let number = tokio::time::timeout(Duration::from_secs(60), storing)
        .await
        .expect("the version to be stored")
        .unwrap();
    assert_stored_as(&pool, env, number, &export).await;

    // undisturbed, the next version (every content changed) is stored the same way
    let next = large_export(n, "second");
    let second = store_beside(&pool, env, &next).await;
    assert_stored_as(&pool, env, second, &next).await;
    assert_stored_as(&pool, env, number, &export).await;

    // one changed, sent whole: one new blob, held by the transaction alone (a version that
    // changes a few has nothing worth a second connection)
    let mut third = next.clone();
    third.resources[n - 1].attributes["content"] = json!("changed");
    let third_number =
        tokio::time::timeout(Duration::from_secs(60), store_beside(&pool, env, &third))
            .await
            .expect("a version changing one of many, sent whole, to be stored");
    assert_stored_as(&pool, env, third_number, &third).await;
}
