//! Console benchmark: `cargo run --release --example bench_console [-- N...]`
//!
//! Starts a private PostgreSQL cluster (temporary, durable settings) and a server on
//! 127.0.0.1 with authentication, stores an environment of each size N (default 10,000 and
//! 100,000 resources; two versions each, the second changing 1%, so the table holds more
//! than one version), gives 80% of the resources a deploy state (deployed, 5% failed, 5%
//! skipped, some deployed for an older intent), signs in to the console as a viewer and
//! times the resources page server-side: from the request to the last byte of the body over
//! loopback, median and slowest of 25 requests, for the first page, filtered pages, sorted
//! pages and a late page, with the size of each; then the median of 9 requests that each
//! follow a change of the environment (the counts the server keeps between views of an
//! unchanged environment are dropped, so each of these counts the version again). Targets,
//! on the slower of the two medians: < 200 ms and < 150 KB.

use std::time::Instant;

#[path = "common/mod.rs"]
mod common;

use serde_json::json;
use steward::model::*;
use steward::store::deploy::{Batch, StateRow};

const AGENTS: usize = 40;

fn export(n: usize, tag: &str) -> ExportFile {
    let resources = (0..n)
        .map(|i| {
            let agent = format!("host{:03}", i % AGENTS);
            let (rtype, key, value) = match i % 4 {
                0 | 1 => ("fs::File", "path", format!("/srv/site{}/f{i:06}", i % 50)),
                2 => ("exec::Run", "command", format!("reload service{i:06}")),
                _ => ("std::Package", "name", format!("pkg{i:06}")),
            };
            let mut attributes = serde_json::Map::new();
            attributes.insert(key.into(), json!(value));
            // 1% of the resources change in the second version
            let v = if i % 100 == 0 { tag } else { "a" };
            attributes.insert("content".into(), json!(format!("resource {i} version {v}")));
            attributes.insert("purged".into(), json!(false));
            let id = ResourceId::new(rtype, &agent, key, &value);
            // each requires the first resource of its agent
            let requires = if i >= AGENTS && i % 4 == 0 {
                let j = i % AGENTS;
                let first = match j % 4 {
                    0 | 1 => ResourceId::new(
                        "fs::File",
                        &agent,
                        "path",
                        &format!("/srv/site{}/f{j:06}", j % 50),
                    ),
                    2 => ResourceId::new(
                        "exec::Run",
                        &agent,
                        "command",
                        &format!("reload service{j:06}"),
                    ),
                    _ => ResourceId::new("std::Package", &agent, "name", &format!("pkg{j:06}")),
                };
                vec![first]
            } else {
                vec![]
            };
            Resource {
                id,
                type_name: rtype.into(),
                agent,
                attributes,
                requires,
            }
        })
        .collect();
    ExportFile {
        format: EXPORT_FORMAT,
        resources,
        undefined: vec![],
        metadata: ExportMetadata::default(),
        ..Default::default()
    }
}

/// Deploy states for 80% of the version's resources, written as the scheduler writes them.
async fn give_states(pool: &sqlx::PgPool, env: uuid::Uuid, version: i32) {
    let rows = steward::store::versions::resource_digests(pool, env, version)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    let mut batch = Batch::default();
    for (i, r) in rows.iter().enumerate() {
        let (result, hash, message) = match i % 20 {
            0..=3 => continue,
            4 => (
                "failed",
                r.hash.clone(),
                Some("it broke: no such directory"),
            ),
            5 => (
                "skipped_for_dependency",
                r.hash.clone(),
                Some("a dependency failed"),
            ),
            6 => ("deployed", "an older intent".into(), None),
            _ => ("deployed", r.hash.clone(), None),
        };
        batch.states.push(StateRow {
            resource_id: r.resource_id.clone(),
            agent: r.agent.clone(),
            intent_version: Some(version),
            intent_hash: Some(r.hash.clone()),
            compliance: "compliant".into(),
            last_run: if result == "deployed" {
                "successful".into()
            } else {
                "failed".into()
            },
            last_result: Some(result.into()),
            last_message: message.map(str::to_string),
            blocked: "not_blocked".into(),
            last_run_hash: Some(hash),
            last_attempt: Some(now - chrono::Duration::seconds(i as i64)),
            last_deployed: Some(now - chrono::Duration::seconds(i as i64)),
            ..Default::default()
        });
    }
    let mut c = pool.acquire().await.unwrap();
    for chunk in batch.states.chunks(5_000) {
        let b = Batch {
            states: chunk.to_vec(),
            ..Default::default()
        };
        steward::store::deploy::write_batch(&mut c, env, &b)
            .await
            .unwrap();
    }
    sqlx::query("ANALYZE").execute(pool).await.unwrap();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Time `path` over `runs` requests: (median ms, slowest ms, body bytes, rows shown).
/// Median and slowest time of `runs` requests of `path`, the body's size and its rows. With
/// `changed`, each request follows a change of the environment (a notification on the
/// channel deploy writes notify on), so the page's counts are not kept from the one before.
async fn time_page(
    http: &reqwest::Client,
    base: &str,
    cookie: &str,
    path: &str,
    runs: usize,
    changed: Option<(&sqlx::PgPool, uuid::Uuid)>,
) -> (f64, f64, usize, usize) {
    let mut times = Vec::new();
    let mut size = 0;
    let mut rows = 0;
    // one untimed request first (connection, caches)
    for i in 0..=runs {
        if let Some((pool, env)) = changed {
            steward::store::changes::notify(pool, env).await.unwrap();
            // the server hears it within a few ms
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        let start = Instant::now();
        let r = http
            .get(format!("{base}{path}"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let body = r.bytes().await.unwrap();
        let t = start.elapsed().as_secs_f64() * 1000.0;
        if i > 0 {
            times.push(t);
        }
        size = body.len();
        rows = String::from_utf8_lossy(&body)
            .matches("class=\"resource-row\"")
            .count();
    }
    let slowest = times.iter().cloned().fold(0.0, f64::max);
    (median(&mut times), slowest, size, rows)
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = {
        let v: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if v.is_empty() {
            vec![10_000, 100_000]
        } else {
            v
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (cluster, pool) = common::database(dir.path(), 32).await;
    let (_, admin) = steward::store::tokens::create(
        &pool,
        "bench admin",
        steward::model::Role::Admin,
        None,
        "bench",
        None,
    )
    .await
    .unwrap();
    let state = steward::server::start::app_state(pool.clone(), false);
    let url = common::serve(state).await;
    let client = steward::client::Client::new(&url, Some(admin));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut report = Vec::new();
    for &n in &sizes {
        let env = client
            .create_environment("bench", &format!("r{n}"), None)
            .await
            .unwrap();
        let env_id = env.id;
        let env = env.id.to_string();
        let start = Instant::now();
        let mut version = 0;
        for tag in ["a", "b"] {
            let v = client
                .upload(&env, &export(n, tag), json!({}))
                .await
                .expect("upload");
            version = v["number"].as_i64().unwrap() as i32;
        }
        give_states(&pool, env_id, version).await;
        println!(
            "{n} resources: two versions stored and deploy states written in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        let viewer = client
            .create_token("viewer", "viewer", Some(&env))
            .await
            .unwrap();
        let r = http
            .post(format!("{url}/console/sign-in"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={}", viewer["secret"].as_str().unwrap()))
            .send()
            .await
            .unwrap();
        let cookie = r
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .expect("a session cookie")
            .to_string();
        let last = n.div_ceil(50);
        let base = format!("/console/env/{env}/resources");
        let cases = [
            ("first page", base.clone()),
            ("filtered: failed", format!("{base}?state=failed")),
            ("filtered: deployed", format!("{base}?state=deployed")),
            (
                "filtered: agent + type",
                format!("{base}?agent=host006&type=exec%3A%3ARun"),
            ),
            ("text search", format!("{base}?q=site7%2Ff0")),
            (
                "sorted: last deploy desc",
                format!("{base}?sort=deployed&order=desc"),
            ),
            ("sorted: state", format!("{base}?sort=status")),
            (
                "sorted: agent desc",
                format!("{base}?sort=agent&order=desc"),
            ),
            ("late page", format!("{base}?page={last}")),
            (
                "late page sorted by type",
                format!("{base}?sort=type&page={}", last - 1),
            ),
            (
                "resource page",
                format!(
                    "/console/env/{env}/resource?id=fs%3A%3AFile%5Bhost000%2Cpath%3D%2Fsrv%2Fsite0%2Ff000000%5D"
                ),
            ),
        ];
        for (what, path) in cases {
            let (med, max, size, rows) = time_page(&http, &url, &cookie, &path, 25, None).await;
            let (cold, cold_max, _, _) =
                time_page(&http, &url, &cookie, &path, 9, Some((&pool, env_id))).await;
            println!(
                "  {n:>7} {what:<26} median {med:6.1} ms  slowest {max:6.1} ms  \
                 after a change {cold:6.1} ms (slowest {cold_max:6.1})  {:6.1} KB  {rows} rows",
                size as f64 / 1024.0
            );
            report.push((n, what, med.max(cold), size));
        }
    }
    println!("---");
    let mut ok = true;
    for (n, what, med, size) in &report {
        let pass = *med < 200.0 && *size < 150 * 1024;
        ok &= pass;
        println!(
            "{n:>7} {what:<26} {med:6.1} ms {:6.1} KB {}",
            *size as f64 / 1024.0,
            if pass { "ok" } else { "OVER TARGET" }
        );
    }
    println!(
        "targets (< 200 ms, < 150 KB): {}",
        if ok { "met" } else { "NOT met" }
    );
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}
