//! What the benchmarks share: a private PostgreSQL cluster with durable settings (as a real
//! server has), migrated, and a server on 127.0.0.1 serving a given state.

use std::path::Path;

// the allocator the `steward` binary runs with (src/main.rs), so that what a benchmark
// measures is what the server does
#[global_allocator]
static ALLOCATOR: steward::alloc::Allocator = steward::alloc::Allocator;

use steward::store::cluster::PgCluster;

/// Start a cluster under `dir/pg` and connect to a migrated database in it.
#[allow(dead_code)]
pub async fn database(dir: &Path, connections: u32) -> (PgCluster, sqlx::PgPool) {
    let root = dir.join("pg");
    let cluster = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&root).expect("cluster");
        c.start(true).expect("start PostgreSQL");
        c.ensure_database("bench").expect("database");
        c
    })
    .await
    .unwrap();
    let pool = steward::store::connect(&cluster.url("bench"), connections)
        .await
        .expect("connect");
    steward::store::migrate(&pool).await.expect("migrate");
    (cluster, pool)
}

/// Serve `state` on 127.0.0.1 (a free port); its base URL.
#[allow(dead_code)]
pub async fn serve(state: steward::server::AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // the server's own serving loop (as `steward server` runs it: TCP_NODELAY, timeouts)
    tokio::spawn(async move {
        let app = steward::server::router(state);
        let _ = steward::server::listen::serve(listener, app, std::future::pending()).await;
    });
    url
}

/// Peak resident memory (VmHWM) of this process, in MiB.
#[allow(dead_code)]
pub fn own_peak_rss_mib() -> f64 {
    peak_rss_kib(std::process::id()) as f64 / 1024.0
}

/// Peak resident memory of the cluster's processes (postmaster and its children): the largest
/// one's, and their sum, in MiB. Shared buffers count in each process that touched them, so
/// the sum overstates what the cluster holds.
#[allow(dead_code)]
pub fn pg_peak_rss_mib(cluster: &PgCluster) -> (f64, f64) {
    let Some(postmaster) = std::fs::read_to_string(cluster.data_dir().join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
    else {
        return (0.0, 0.0);
    };
    let mut pids = vec![postmaster];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // the parent pid is the second field after the parenthesised command
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
    }
    let peaks: Vec<u64> = pids.iter().map(|&p| peak_rss_kib(p)).collect();
    let max = peaks.iter().copied().max().unwrap_or(0) as f64 / 1024.0;
    let sum = peaks.iter().sum::<u64>() as f64 / 1024.0;
    (max, sum)
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A project's `main.cf` with `n` fs::File resources under `files` (`files/f000042`, holding
/// "file 42"); `changed` = (which, round) gives that one "file {which} round {round}".
#[allow(dead_code)]
pub fn fs_files_model(n: usize, files: &Path, changed: Option<(usize, usize)>) -> String {
    let mut m = String::from("import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
    for i in 0..n {
        let content = match changed {
            Some((which, round)) if which == i => format!("file {i} round {round}"),
            _ => format!("file {i}"),
        };
        m.push_str(&format!(
            "fs::File(host=host, path=\"{}/f{i:06}\", content=\"{content}\", mode=644)\n",
            files.display()
        ));
    }
    m
}
