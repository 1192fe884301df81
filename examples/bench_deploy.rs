//! Deploy benchmark: `cargo run --release --example bench_deploy [-- N]`
//!
//! A private PostgreSQL cluster (temporary, durable settings), a server with its scheduler on
//! 127.0.0.1 and real executor processes writing N fs::File resources (one agent, default
//! settings: one action at a time) into a temp dir. Measures, end to end through the API:
//!   1. release of an N-file version -> every file written and its state stored;
//!   2. a user repair with nothing to change -> every resource verified;
//!   3. a version changing one file -> that file rewritten and the version done;
//!   4. a version adding one file -> that file written; one removing it -> the version merged.
//!
//! Files go to a temp dir, or under $BENCH_DIR (e.g. /dev/shm, to separate the disk's cost
//! of creating files from the orchestrator's). BENCH_FIRST_ONLY=1 stops after step 1 (to
//! profile it alone); BENCH_PG_STATS=1 prints what PostgreSQL wrote to the deploy tables.
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

/// The attribute hash a resource last deployed and how that went (`None` before its first).
async fn last_run(pool: &sqlx::PgPool, env: uuid::Uuid, id: &str) -> Option<(String, String)> {
    let row: Option<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT last_run_hash, last_result FROM resource_state WHERE environment_id = $1 AND resource_id = $2",
    )
    .bind(env)
    .bind(id)
    .fetch_optional(pool)
    .await
    .unwrap();
    match row {
        Some((Some(h), Some(r))) => Some((h, r)),
        _ => None,
    }
}

/// Wait until version `version` is deployed and every state is stored. The scheduler's own
/// status says when its work is done (cheap to ask every few ms); the progress endpoint then
/// says when the states are in the database. Asking only the progress endpoint every 50 ms,
/// as this did before, kept PostgreSQL busy counting 100,000 states while it was also
/// storing them (the CLI's `progress --wait` asks every 250 ms).
async fn wait_done(
    c: &Client,
    schedulers: &steward::scheduler::Schedulers,
    env_id: uuid::Uuid,
    env: &str,
    version: i32,
) {
    loop {
        let s = schedulers.status(env_id).await.expect("status");
        if s.version == Some(version) && s.queued == 0 && s.running == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    loop {
        let p = c.progress(env, version).await.expect("progress");
        if p["done"] == true {
            if p["by_status"]["deployed"] != p["total"] {
                let actions = c.actions(env, None, 2).await;
                eprintln!("last actions: {actions:#?}");
            }
            assert_eq!(
                p["by_status"]["deployed"], p["total"],
                "not all deployed: {p}"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With BENCH_PG_STATS set: what PostgreSQL did to the deploy tables so far (rows written,
/// how many updates were HOT, i.e. touched no index, and the tables' sizes), to see where
/// its share of a deploy goes.
/// Peak resident memory so far, of this process and of the PostgreSQL processes.
fn print_peaks(cluster: &steward::store::cluster::PgCluster, after: &str) {
    let (pg_max, pg_sum) = common::pg_peak_rss_mib(cluster);
    println!(
        "  peak RSS after {after}: this process {:.0} MiB; PostgreSQL largest process {pg_max:.0} MiB, all {pg_sum:.0} MiB",
        common::own_peak_rss_mib()
    );
}

async fn print_table_stats(pool: &sqlx::PgPool, after: &str) {
    if std::env::var_os("BENCH_PG_STATS").is_none() {
        return;
    }
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, pg_total_relation_size(relid) \
         FROM pg_stat_user_tables WHERE relname IN ('resource_state', 'resource_actions') ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for (table, ins, upd, hot, size) in rows {
        println!(
            "  PostgreSQL after {after}: {table}: {ins} inserted, {upd} updated ({hot} HOT), {} MiB",
            size >> 20
        );
    }
}

fn monotonic_secs() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

async fn run(n: usize) {
    // handlers run as this user, as under `steward deploy` (a root server would give the
    // executors a uid of their own, which can not write into this process's temp dir)
    steward::sandbox::configure(steward::sandbox::Config {
        executor_user: steward::sandbox::ExecutorUser::Server,
        ..Default::default()
    });
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
    let mono_start = monotonic_secs();
    let start = Instant::now();
    let v = c.upload(&env, &e, json!({})).await.expect("upload");
    let uploaded = start.elapsed().as_secs_f64();
    drop(e);
    wait_done(
        &c,
        &schedulers,
        env_id,
        &env,
        v["number"].as_i64().unwrap() as i32,
    )
    .await;
    let first = start.elapsed().as_secs_f64();
    assert_eq!(
        std::fs::read_to_string(files.join(format!("f{:06}", n - 1))).unwrap(),
        format!("file {}\n", n - 1)
    );
    println!(
        "first deploy of {n} files: {first:.3} s (upload and store {uploaded:.3} s), {:.0} resources/s",
        n as f64 / first
    );
    print_table_stats(&pool, "the first deploy").await;
    print_peaks(&cluster, "the first deploy");
    // BENCH_FIRST_ONLY: stop here (to profile the first deploy alone: `perf record -k mono`,
    // then `perf report --time` with the window printed here)
    if std::env::var_os("BENCH_FIRST_ONLY").is_some() {
        println!(
            "first deploy on CLOCK_MONOTONIC: {mono_start:.6},{:.6}",
            monotonic_secs()
        );
        let (pg_max, pg_sum) = common::pg_peak_rss_mib(&cluster);
        println!(
            "peak RSS after the first deploy: this process {:.0} MiB; PostgreSQL largest process {pg_max:.0} MiB, all {pg_sum:.0} MiB",
            common::own_peak_rss_mib()
        );
        schedulers.stop_all();
        drop(pool);
        let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
        return;
    }

    // 2. repair with nothing to change
    let mut repairs = Vec::new();
    for _ in 0..3 {
        let start = Instant::now();
        let mono_start = monotonic_secs();
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
        // the window of each repair, for `perf report --time` of a `perf record -k mono`
        if std::env::var_os("BENCH_FIRST_ONLY").is_none()
            && std::env::var_os("BENCH_MONO").is_some()
        {
            println!(
                "  repair on CLOCK_MONOTONIC: {mono_start:.6},{:.6}",
                monotonic_secs()
            );
        }
    }
    let repair = repairs.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "no-change repair of {n} files: {:.3} s (best of 3: {repairs:.3?})",
        repair
    );
    // (the stats lag the writes by up to a second: the repair's last rows may be missing)
    tokio::time::sleep(Duration::from_millis(1500)).await;
    print_table_stats(&pool, "three repairs").await;
    print_peaks(&cluster, "three repairs");

    // 3. change one: the file rewritten and its state stored, sent as its changes (as
    // `steward export` and `steward deploy` send it) and, for comparison, whole
    let mut last = None;
    let mut by_mode: Vec<(bool, Vec<f64>, Vec<f64>)> =
        vec![(true, vec![], vec![]), (false, vec![], vec![])];
    for round in 0..10 {
        let as_changes = round % 2 == 0;
        let which = n / 2 + round;
        let e = export(&files, n, Some(which));
        let id = e.resources[which].id.0.clone();
        let hash = e.resources[which].hash();
        let had_memory = as_changes && last.is_some();
        let start = Instant::now();
        let sent = c
            .upload_changes(
                &env,
                &e,
                json!({}),
                if as_changes { last.take() } else { None },
            )
            .await
            .expect("upload");
        assert_eq!(sent.as_changes, had_memory);
        last = sent.last;
        let stored = start.elapsed().as_secs_f64();
        let path = files.join(format!("f{which:06}"));
        let want = format!("file {which} changed\n");
        loop {
            if std::fs::read_to_string(&path).ok().as_deref() == Some(want.as_str())
                && let Some((h, r)) = last_run(&pool, env_id, &id).await
                && h == hash
                && r == "deployed"
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = start.elapsed().as_secs_f64();
        println!(
            "  change one ({}): upload and store {stored:.3} s, total {t:.3} s",
            if as_changes {
                "sent as changes"
            } else {
                "sent whole"
            }
        );
        let m = by_mode.iter_mut().find(|m| m.0 == as_changes).unwrap();
        m.1.push(stored);
        m.2.push(t);
    }
    for (as_changes, stored, total) in &by_mode {
        let best = |v: &Vec<f64>| v.iter().cloned().fold(f64::MAX, f64::min);
        println!(
            "change one of {n} files, {} (upload, store, diff, release, deploy, state stored): {:.3} s (best of {}: {total:.3?}; upload and store best {:.3} s)",
            if *as_changes {
                "sent as changes"
            } else {
                "sent whole"
            },
            best(total),
            total.len(),
            best(stored)
        );
    }
    print_peaks(&cluster, "ten versions changing one");
    // 4. a resource added, then removed again, sent as changes: the scheduler merges such a
    // version whole (`Model::merge`), not in place. Added: its file written and its state
    // stored; removed: the version merged and nothing left to do (it becomes an orphan).
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    let new_path = files.join(format!("f{n:06}"));
    for round in 0..6 {
        let add = round % 2 == 0;
        let e = export(&files, if add { n + 1 } else { n }, None);
        let start = Instant::now();
        let sent = c
            .upload_changes(&env, &e, json!({}), last.take())
            .await
            .expect("upload");
        assert!(sent.as_changes, "sent as changes");
        last = sent.last;
        let number = sent.answer["number"].as_i64().unwrap() as i32;
        if add {
            let id = e.resources[n].id.0.clone();
            let hash = e.resources[n].hash();
            loop {
                if std::fs::read_to_string(&new_path).ok().as_deref()
                    == Some(format!("file {n}\n").as_str())
                    && let Some((h, r)) = last_run(&pool, env_id, &id).await
                    && h == hash
                    && r == "deployed"
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            added.push(start.elapsed().as_secs_f64());
            // the next round adds it again: its file goes, so "written" means written again
            std::fs::remove_file(&new_path).unwrap();
        } else {
            loop {
                let s = schedulers.status(env_id).await.expect("status");
                if s.version == Some(number) && s.queued == 0 && s.running == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            removed.push(start.elapsed().as_secs_f64());
        }
    }
    let best = |v: &Vec<f64>| v.iter().cloned().fold(f64::MAX, f64::min);
    println!(
        "add one of {n} files, sent as changes (file written, state stored): {:.3} s (best of {}: {added:.3?})",
        best(&added),
        added.len()
    );
    println!(
        "remove one of {n} files, sent as changes (version merged, nothing queued): {:.3} s (best of {}: {removed:.3?})",
        best(&removed),
        removed.len()
    );
    print_peaks(&cluster, "an addition and a removal");
    // 5. change one through the command line: `steward export -d` (this program runs as
    // it), a process that compiles the project and sends the export as its changes against
    // its memory of the last upload
    let project = files_tmp.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("project.yml"),
        "name: bench\nmodulepath: libs\n",
    )
    .unwrap();
    let model = |changed| common::fs_files_model(n, &files, changed);
    let cache = files_tmp.path().join("cache");
    let me_again = std::env::current_exe().expect("own path");
    let export_d = || {
        let out = std::process::Command::new(&me_again)
            .args(["export", "-d", "-p"])
            .arg(&project)
            .args(["--server", &url, "-e", &env])
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("steward export");
        assert!(
            out.status.success(),
            "steward export -d: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // the first: no memory yet, sent whole
    std::fs::write(project.join("main.cf"), model(None)).unwrap();
    export_d();
    // and all it deploys done (the compiler's attributes may differ from this program's)
    let mut idle = 0;
    while idle < 5 {
        let s = schedulers.status(env_id).await.expect("status");
        idle = if s.queued == 0 && s.running == 0 {
            idle + 1
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut by_cli = Vec::new();
    for round in 1..=5 {
        let which = (round * 137) % n;
        std::fs::write(project.join("main.cf"), model(Some((which, round)))).unwrap();
        let path = files.join(format!("f{which:06}"));
        let want = format!("file {which} round {round}");
        let id = format!("fs::File[localhost,path={}]", path.display());
        let before = last_run(&pool, env_id, &id).await;
        let start = Instant::now();
        export_d();
        let exported = start.elapsed().as_secs_f64();
        while std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // and its state stored (the hash it last deployed is no longer the one before)
        loop {
            if last_run(&pool, env_id, &id)
                .await
                .is_some_and(|(h, r)| Some(&h) != before.as_ref().map(|b| &b.0) && r == "deployed")
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = start.elapsed().as_secs_f64();
        println!(
            "  change one through `steward export -d`: the command {exported:.3} s, total {t:.3} s"
        );
        by_cli.push(t);
    }
    by_cli.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "change one of {n} files through `steward export -d` (compile, upload as changes, release, deploy, state stored): median {:.3} s, best {:.3} s",
        by_cli[by_cli.len() / 2],
        by_cli[0]
    );
    let (pg_max, pg_sum) = common::pg_peak_rss_mib(&cluster);
    println!(
        "peak RSS: this process (server, scheduler, client) {:.0} MiB; PostgreSQL largest process {pg_max:.0} MiB, all its processes {pg_sum:.0} MiB",
        common::own_peak_rss_mib()
    );
    println!("---");
    println!(
        "targets (issue 31): first deploy 10,000 < 1 s, 100,000 < 10 s; no-change repair 10,000 < 0.5 s, 100,000 < 5 s; change one < 0.15 s at 10,000 and 100,000, within 1.5x of 1,000"
    );
    schedulers.stop_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        // the scheduler starts us as its executor
        Some("executor") => {
            steward::executor::main_loop().expect("executor");
        }
        // and the benchmark as `steward export`
        Some("export") => return steward::cli::main(),
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
    std::process::ExitCode::SUCCESS
}
