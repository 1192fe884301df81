//! Store benchmark: `cargo run --release --example bench_store [-- N]`
//!
//! Starts a private PostgreSQL cluster (temporary, durable settings) and a server on
//! 127.0.0.1, then measures: storing an N-resource version with its diff (N=10,000 by
//! default; first version, then one with 1% changed), listing N resources with their state
//! through the API, simple reads per second over HTTP with 16 concurrent clients, and how
//! long another environment's reads wait while versions of N are uploaded whole.

use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;

use serde_json::json;
use steward::model::*;

fn export(n: usize, tag: &str, changed_every: usize) -> ExportFile {
    let resources = (0..n)
        .map(|i| {
            let path = format!("/srv/bench/f{i:06}");
            let mut attributes = serde_json::Map::new();
            attributes.insert("path".into(), json!(path));
            let content = if changed_every > 0 && i % changed_every == 0 {
                format!("file {i} {tag} changed")
            } else {
                format!("file {i} v1")
            };
            attributes.insert("content".into(), json!(content));
            attributes.insert("permissions".into(), json!(644));
            attributes.insert("owner".into(), json!(null));
            attributes.insert("group".into(), json!(null));
            attributes.insert("purged".into(), json!(false));
            attributes.insert("send_event".into(), json!(true));
            Resource {
                id: ResourceId::new("fs::File", "localhost", "path", &path),
                type_name: "fs::File".into(),
                agent: "localhost".into(),
                attributes,
                requires: if i > 0 {
                    vec![ResourceId::new(
                        "fs::File",
                        "localhost",
                        "path",
                        "/srv/bench/f000000",
                    )]
                } else {
                    vec![]
                },
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    // STEWARD_LOG=steward=debug: the stages of each store
    if let Ok(filter) = std::env::var("STEWARD_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .init();
    }
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let (cluster, pool) = common::database(dir.path(), 32).await;
    let state = steward::server::start::app_state(pool.clone(), true);
    let url = common::serve(state).await;
    let client = steward::client::Client::new(&url, None);
    let env = client
        .create_environment("bench", "store", None)
        .await
        .unwrap()
        .id
        .to_string();

    // storing versions (through the API: JSON upload, validation, hashing, diff, release),
    // sent as their changes (as `steward export` and `steward deploy` send them) and whole
    let mut store_times = Vec::new();
    let mut whole_times = Vec::new();
    let mut last = None;
    for (i, tag) in ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
        .iter()
        .enumerate()
    {
        let e = export(n, tag, if i == 0 { 0 } else { 100 });
        let as_changes = i % 2 == 1;
        let start = Instant::now();
        let sent = client
            .upload_changes(
                &env,
                &e,
                json!({}),
                if as_changes { last.take() } else { None },
            )
            .await
            .expect("upload");
        let t = start.elapsed().as_secs_f64();
        assert_eq!(sent.as_changes, as_changes);
        last = sent.last;
        let v = sent.answer;
        println!(
            "store version {} ({n} resources, diff {}, {}): {:.3} s",
            v["number"],
            v["diff_summary"],
            if as_changes {
                "sent as changes"
            } else {
                "sent whole"
            },
            t
        );
        if as_changes {
            store_times.push(t);
        } else if i > 0 {
            whole_times.push(t);
        }
    }

    // listing resources with state
    let mut list_times = Vec::new();
    for _ in 0..9 {
        let start = Instant::now();
        let (_, rows) = client.resources(&env).await.expect("list");
        list_times.push(start.elapsed().as_secs_f64());
        assert_eq!(rows.len(), n);
    }
    let mut db_times = Vec::new();
    let active = steward::store::versions::active(&pool, uuid::Uuid::parse_str(&env).unwrap())
        .await
        .unwrap()
        .unwrap();
    for _ in 0..9 {
        let start = Instant::now();
        let rows = steward::store::state::list(&pool, uuid::Uuid::parse_str(&env).unwrap(), active)
            .await
            .unwrap();
        db_times.push(start.elapsed().as_secs_f64());
        assert_eq!(rows.len(), n);
    }

    // simple reads per second
    let duration = Duration::from_secs(3);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let c = client.clone();
        let env = env.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < duration {
                c.environment(&env).await.expect("read");
                n += 1;
            }
            n
        }));
    }
    let mut reads = 0;
    for t in tasks {
        reads += t.await.unwrap();
    }
    let rate = reads as f64 / start.elapsed().as_secs_f64();

    // another environment's reads while this one receives whole versions of N resources
    // (the body made beforehand, so that only the server's work overlaps the reads): how long
    // the slowest read waited
    let other = client
        .create_environment("bench", "other", None)
        .await
        .unwrap()
        .id
        .to_string();
    let mut body = serde_json::to_value(export(n, "j", 100)).unwrap();
    body["provenance"] = json!({});
    let body = serde_json::to_vec(&body).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (c, other, done) = (client.clone(), other.clone(), done.clone());
        tokio::spawn(async move {
            let mut waits = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let start = Instant::now();
                c.environment(&other).await.expect("read");
                waits.push(start.elapsed().as_secs_f64());
            }
            waits
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let http = reqwest::Client::new();
    for _ in 0..3 {
        let status = http
            .post(format!("{url}/api/v1/environments/{env}/versions"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("upload")
            .status();
        assert_eq!(status.as_u16(), 201);
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut waits = reader.await.unwrap();
    waits.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let slowest = waits.last().copied().unwrap_or(0.0);
    let p99 = waits[(waits.len() * 99 / 100).min(waits.len() - 1)];

    println!("---");
    println!(
        "store {n}-resource version with diff (median of 4, 1% changed), sent as changes: {:.3} s",
        median(store_times)
    );
    println!(
        "store {n}-resource version with diff (median of 4, 1% changed), sent whole: {:.3} s",
        median(whole_times)
    );
    println!(
        "list {n} resources with state over HTTP (median of 9): {:.1} ms",
        median(list_times) * 1000.0
    );
    println!(
        "list {n} resources with state from the store (median of 9): {:.1} ms",
        median(db_times) * 1000.0
    );
    println!("simple reads (GET environment, 16 clients, 3 s): {rate:.0} reads/s");
    println!(
        "reads of another environment while 3 versions of {n} are uploaded whole: {} reads, slowest {:.1} ms, p99 {:.1} ms",
        waits.len(),
        slowest * 1000.0,
        p99 * 1000.0
    );
    let (pg_max, pg_sum) = common::pg_peak_rss_mib(&cluster);
    println!(
        "peak RSS: this process (server and client) {:.0} MiB; PostgreSQL largest process {pg_max:.0} MiB, all its processes {pg_sum:.0} MiB",
        common::own_peak_rss_mib()
    );
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}
