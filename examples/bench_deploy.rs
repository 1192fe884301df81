//! Deploy benchmark: `cargo run --release --example bench_deploy [-- N]`
//!
//! A private PostgreSQL cluster (temporary, durable settings), a server with its scheduler on
//! 127.0.0.1 and real executor processes writing N fs::File resources (one agent, default
//! settings: one action at a time) into a temp dir. Measures, end to end through the API:
//!   1. release of an N-file version -> every file written and its state stored;
//!   2. a user repair with nothing to change -> every resource verified;
//!   3. a version changing one file -> that file rewritten and the version done.
//!
//! Files go to a temp dir, or under $BENCH_DIR (e.g. /dev/shm, to separate the disk's cost
//! of creating files from the orchestrator's).
//!
//! The executors are this program itself (`bench_deploy executor`), which runs the same
//! library code as `steward executor`, so the benchmark needs no other binary built.

use std::path::Path;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;

use serde_json::json;
use steward::client::Client;
use steward::model::*;

fn export(dir: &Path, n: usize, changed: Option<usize>) -> ExportFile {
    let resources = (0..n)
        .map(|i| {
            let path = format!("{}/f{i:06}", dir.display());
            let content = if Some(i) == changed {
                format!("file {i} changed\n")
            } else {
                format!("file {i}\n")
            };
            // the attributes the compiler exports for fs::File
            let attributes = json!({
                "path": path, "owner": null, "group": null, "permissions": 644, "content": content,
                "purged": false, "purge_on_delete": false, "send_event": true, "receive_events": true,
            });
            Resource {
                id: ResourceId::new("fs::File", "localhost", "path", &path),
                type_name: "fs::File".into(),
                agent: "localhost".into(),
                attributes: attributes.as_object().unwrap().clone(),
                requires: vec![],
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

async fn wait_done(c: &Client, env: &str, version: i32) {
    loop {
        let p = c.progress(env, version).await.expect("progress");
        if p["done"] == true {
            assert_eq!(
                p["by_status"]["deployed"], p["total"],
                "not all deployed: {p}"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn run(n: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    // BENCH_DIR: where the files go (default: the temp dir), e.g. /dev/shm to take the
    // disk's file-creation cost out of the figures
    let files_parent = std::env::var_os("BENCH_DIR").map(std::path::PathBuf::from);
    let files_tmp = match &files_parent {
        Some(p) => tempfile::tempdir_in(p).expect("BENCH_DIR"),
        None => tempfile::tempdir().expect("temp dir"),
    };
    let files = files_tmp.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let (cluster, pool) = common::database(tmp.path(), 16).await;
    let me = std::env::current_exe().expect("own path");
    let state =
        steward::server::start::app_state_with_schedulers(pool.clone(), true, me, tmp.path()).await;
    let schedulers = state.schedulers.clone().unwrap();
    let url = common::serve(state).await;
    let c = Client::new(&url, None);
    let env = c
        .create_environment("bench", "deploy", None)
        .await
        .unwrap()
        .id
        .to_string();
    let env_id = uuid::Uuid::parse_str(&env).unwrap();

    // 1. first deploy
    let e = export(&files, n, None);
    let start = Instant::now();
    let v = c.upload(&env, &e, json!({})).await.expect("upload");
    let uploaded = start.elapsed().as_secs_f64();
    wait_done(&c, &env, v["number"].as_i64().unwrap() as i32).await;
    let first = start.elapsed().as_secs_f64();
    assert_eq!(
        std::fs::read_to_string(files.join(format!("f{:06}", n - 1))).unwrap(),
        format!("file {}\n", n - 1)
    );
    println!(
        "first deploy of {n} files: {first:.3} s (upload and store {uploaded:.3} s), {:.0} resources/s",
        n as f64 / first
    );

    // 2. repair with nothing to change
    let mut repairs = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let r = c.trigger(&env, true, None, None).await.expect("repair");
        assert_eq!(r["scheduled"], n);
        loop {
            let s = schedulers.status(env_id).await.expect("status");
            if s.queued == 0 && s.running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        repairs.push(start.elapsed().as_secs_f64());
    }
    let repair = repairs.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "no-change repair of {n} files: {:.3} s (best of 3: {repairs:.3?})",
        repair
    );

    // 3. change one
    let mut changes = Vec::new();
    for round in 0..3 {
        let which = n / 2 + round;
        let e = export(&files, n, Some(which));
        let start = Instant::now();
        let v = c.upload(&env, &e, json!({})).await.expect("upload");
        let stored = start.elapsed().as_secs_f64();
        wait_done(&c, &env, v["number"].as_i64().unwrap() as i32).await;
        let t = start.elapsed().as_secs_f64();
        println!("  change one: upload and store {stored:.3} s, total {t:.3} s");
        assert_eq!(
            std::fs::read_to_string(files.join(format!("f{which:06}"))).unwrap(),
            format!("file {which} changed\n")
        );
        changes.push(t);
    }
    let change = changes.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "change one of {n} files (upload, store, diff, release, deploy, state stored): {change:.3} s (best of 3: {changes:.3?})"
    );
    println!("---");
    println!("targets at N=10000: first deploy < 5 s, no-change repair < 2 s, change-one < 0.5 s");
    println!(
        "reference (this machine, from the issue): ~35 resources/s; 1,000 files 31 s first deploy, 24 s repair; change one of 5,000: 12 s"
    );
    schedulers.stop_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}

fn main() {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        // the scheduler starts us as its executor
        Some("executor") => {
            steward::executor::main_loop().expect("executor");
        }
        other => {
            if let Ok(filter) = std::env::var("STEWARD_LOG") {
                tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .init();
            }
            let n = other.and_then(|a| a.parse().ok()).unwrap_or(10_000);
            tokio::runtime::Runtime::new().unwrap().block_on(run(n));
        }
    }
}
