//! Replica fault run: `cargo run --release --example bench_replicas [-- ENVIRONMENTS]`
//!
//! A private PostgreSQL cluster and three `steward server` replicas on it (this program in
//! its `server` mode, with the default heartbeat and lease time), ENVIRONMENTS (default
//! 100) environments with small models (five files each; every tenth follows a git
//! repository on disk, the others take uploads), all deployed. Then:
//!   1. balance: the busiest replica owns at most 1.25× the least busy;
//!   2. a fourth replica joins: environments moved (target ≤ ⌈E/N⌉ + 1);
//!   3. new versions go out everywhere (uploads, and pushes to the repositories), and the
//!      busiest replica is killed with -9 in the middle of it: the time until each of its
//!      environments is owned again, and until its newest version is deployed (target
//!      < 10 s), and the environments moved (target ≤ ⌈E/N⌉ + 1);
//!   4. another replica is stopped with SIGTERM: the time until its environments are owned
//!      by the others (target < 1 s);
//!   5. nothing lost, nothing run twice: every version stored once and deployed, every
//!      action closed, no two actions of one resource overlapping in time, every pushed
//!      commit's timeline complete (received → compiled → released → deployed).
//!
//! The figures of a run are in docs/replicas.md.

#[path = "common/mod.rs"]
#[allow(dead_code)] // this benchmark serves through real replica processes, not `serve`
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use steward::client::Client;
use steward::model::*;

const ADMIN: &str = "stw_bench_replicas_admin_secret_0123456789";
const AGENT: &str = "bench";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        // the replicas (this program as `steward server`), their executors and compiles
        Some("server") | Some("executor") | Some("compile") => steward::cli::main(),
        other => {
            let n = other.and_then(|a| a.parse().ok()).unwrap_or(100);
            let ok = tokio::runtime::Runtime::new().unwrap().block_on(run(n));
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

struct Replica {
    child: Child,
    url: String,
    _data: tempfile::TempDir,
}

impl Drop for Replica {
    /// a run that fails half-way must not leave replicas behind
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_replica(db: &str) -> Replica {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let data = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(data.path().join("server.log")).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["server", "--bind", &format!("127.0.0.1:{port}")])
        .args(["--database-url", db, "--advertise-url", &url])
        // the benchmark's repositories are local (file://)
        .arg("--allow-local-git-sources")
        .arg("--data-dir")
        .arg(data.path())
        .env("STEWARD_ADMIN_TOKEN", ADMIN)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Replica {
        child,
        url,
        _data: data,
    }
}

async fn healthy(r: &Replica) {
    let c = Client::new(&r.url, None);
    for _ in 0..1200 {
        if c.health().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let log = std::fs::read_to_string(r._data.path().join("server.log")).unwrap_or_default();
    panic!("replica {} did not start in 30 s:\n{log}", r.url);
}

/// Five files, and from version 2 on a two-second command (so that a deploy is under way
/// when a replica is killed).
fn files(dir: &Path, version: usize) -> ExportFile {
    let mut resources: Vec<Resource> = (0..5)
        .map(|i| {
            let path = format!("{}/f{i}", dir.display());
            let attributes = json!({
                "path": path, "owner": null, "group": null, "permissions": 644,
                "content": format!("v{version} {i}\n"), "purged": false, "purge_on_delete": false,
                "send_event": true, "receive_events": true,
            });
            Resource {
                id: ResourceId::new("fs::File", AGENT, "path", &path),
                type_name: "fs::File".into(),
                agent: AGENT.into(),
                attributes: attributes.as_object().unwrap().clone(),
                requires: vec![],
            }
        })
        .collect();
    if version >= 2 {
        let command = format!("sh -c 'sleep 2' # {} v{version}", dir.display());
        let attributes = json!({
            "command": command, "creates": "", "cwd": "", "environment": {}, "onlyif": "",
            "path": "", "reload": "", "reload_only": false, "returns": [0], "timeout": 300,
            "unless": "", "skip_on_fail": false, "purged": false, "purge_on_delete": false,
            "send_event": true, "receive_events": true,
        });
        resources.push(Resource {
            id: ResourceId::new("exec::Run", AGENT, "command", &command),
            type_name: "exec::Run".into(),
            agent: AGENT.into(),
            attributes: attributes.as_object().unwrap().clone(),
            requires: vec![],
        });
    }
    ExportFile {
        format: EXPORT_FORMAT,
        resources,
        ..Default::default()
    }
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.com")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository on disk (a bare origin and a work tree) whose model deploys five files.
struct Repo {
    origin: PathBuf,
    work: PathBuf,
    out: PathBuf,
}

impl Repo {
    fn new(root: &Path) -> Repo {
        let origin = root.join("origin.git");
        let work = root.join("work");
        let out = root.join("out");
        std::fs::create_dir_all(&out).unwrap();
        git(
            root,
            &[
                "init",
                "-q",
                "--bare",
                "-b",
                "main",
                origin.to_str().unwrap(),
            ],
        );
        git(
            root,
            &[
                "clone",
                "-q",
                origin.to_str().unwrap(),
                work.to_str().unwrap(),
            ],
        );
        git(&work, &["checkout", "-q", "-b", "main"]);
        Repo { origin, work, out }
    }

    fn commit_and_push(&self, version: usize) -> String {
        let mut m = String::from("import fs\nhost = std::Host(name=\"bench\", os=std::linux)\n");
        for i in 0..5 {
            m.push_str(&format!(
                "fs::File(host=host, path=\"{}/f{i}\", content=\"v{version} {i}\", mode=644)\n",
                self.out.display()
            ));
        }
        std::fs::write(self.work.join("project.yml"), "name: site\n").unwrap();
        std::fs::write(self.work.join("main.cf"), m).unwrap();
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-q", "-m", &format!("v{version}")]);
        git(&self.work, &["push", "-q", "origin", "HEAD:main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }
}

struct Env {
    id: String,
    dir: PathBuf,
    repo: Option<Repo>,
    commits: Vec<String>,
}

/// replica id -> environments it owns (live replicas).
async fn ownership(c: &Client) -> BTreeMap<String, BTreeSet<String>> {
    let r = c.replicas().await.unwrap();
    r.replicas
        .iter()
        .filter(|v| v.live)
        .map(|v| {
            (
                v.replica.id.clone(),
                v.environments
                    .iter()
                    .map(|e| e.environment_id.to_string())
                    .collect(),
            )
        })
        .collect()
}

fn owner(own: &BTreeMap<String, BTreeSet<String>>, env: &str) -> Option<String> {
    own.iter()
        .find(|(_, v)| v.contains(env))
        .map(|(k, _)| k.clone())
}

fn moves(a: &BTreeMap<String, BTreeSet<String>>, b: &BTreeMap<String, BTreeSet<String>>) -> usize {
    a.values()
        .flatten()
        .filter(|e| owner(a, e) != owner(b, e))
        .count()
}

/// Wait until `n` live replicas own every environment with shares one apart at most.
async fn balanced(c: &Client, envs: usize, n: usize) -> BTreeMap<String, BTreeSet<String>> {
    let started = Instant::now();
    loop {
        let own = ownership(c).await;
        let sizes: Vec<usize> = own.values().map(BTreeSet::len).collect();
        let total: usize = sizes.iter().sum();
        if own.len() == n
            && total == envs
            && sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1
        {
            return own;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not balanced: {sizes:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn newest_deployed(c: &Client, env: &Env) -> bool {
    let Ok(versions) = c.versions(&env.id).await else {
        return false;
    };
    let Some(newest) = versions.first() else {
        return false;
    };
    let n = newest["number"].as_i64().unwrap() as i32;
    if let Some(commit) = env.commits.last()
        && newest["provenance"]["commit"].as_str() != Some(commit.as_str())
    {
        return false;
    }
    c.progress(&env.id, n)
        .await
        .map(|p| p["done"] == true && p["by_status"]["deployed"] == p["total"])
        .unwrap_or(false)
}

/// The replica owning the most environments, and those.
fn busiest(own: &BTreeMap<String, BTreeSet<String>>) -> (String, BTreeSet<String>) {
    own.iter()
        .max_by_key(|(_, v)| v.len())
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap()
}

/// Which of our processes is the replica `id` (asked through its /health).
async fn index_of(replicas: &[Option<Replica>], id: &str) -> usize {
    for (i, r) in replicas.iter().enumerate() {
        if let Some(r) = r {
            let h = Client::new(&r.url, None).health().await.unwrap();
            if h["replica"]["id"] == id {
                return i;
            }
        }
    }
    panic!("no running replica {id}");
}

fn check(ok: &mut bool, pass: bool, what: &str) {
    println!("  {} {what}", if pass { "PASS" } else { "FAIL" });
    *ok &= pass;
}

async fn run(n_envs: usize) -> bool {
    let base = std::env::var("BENCH_DIR").unwrap_or_else(|_| "/tmp".into());
    let tmp = tempfile::tempdir_in(base).unwrap();
    let (cluster, pool) = common::database(tmp.path(), 4).await;
    let db = cluster.url("bench");
    let mut replicas: Vec<Option<Replica>> = (0..3).map(|_| Some(spawn_replica(&db))).collect();
    for r in replicas.iter().flatten() {
        healthy(r).await;
    }
    let c = Client::new(&replicas[0].as_ref().unwrap().url, Some(ADMIN.into()));
    let mut ok = true;

    // environments, first versions, all deployed
    let t = Instant::now();
    let mut envs: Vec<Env> = Vec::new();
    for i in 0..n_envs {
        let id = c
            .create_environment("bench", &format!("e{i:03}"), None)
            .await
            .unwrap()
            .id
            .to_string();
        let dir = tmp.path().join(format!("e{i:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut env = Env {
            id,
            dir: dir.clone(),
            repo: None,
            commits: Vec::new(),
        };
        if i % 10 == 9 {
            let repo = Repo::new(&dir);
            env.commits.push(repo.commit_and_push(1));
            c.set_source(
                &env.id,
                &json!({"url": format!("file://{}", repo.origin.display()), "branch": "main", "poll_interval": 0}),
            )
            .await
            .unwrap();
            env.repo = Some(repo);
        } else {
            c.upload(&env.id, &files(&dir, 1), json!({})).await.unwrap();
        }
        envs.push(env);
    }
    for e in &envs {
        while !newest_deployed(&c, e).await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    println!(
        "{n_envs} environments ({} following git) created and deployed over 3 replicas in {:.1} s",
        envs.iter().filter(|e| e.repo.is_some()).count(),
        t.elapsed().as_secs_f64()
    );

    // 1. balance
    let own3 = balanced(&c, n_envs, 3).await;
    let sizes: Vec<usize> = own3.values().map(BTreeSet::len).collect();
    let ratio = *sizes.iter().max().unwrap() as f64 / (*sizes.iter().min().unwrap()).max(1) as f64;
    println!("balance over 3 replicas: {sizes:?} (busiest/least {ratio:.2})");
    check(&mut ok, ratio <= 1.25, "busiest ≤ 1.25× least busy");

    // 2. a replica joins
    let t = Instant::now();
    replicas.push(Some(spawn_replica(&db)));
    healthy(replicas[3].as_ref().unwrap()).await;
    let own4 = balanced(&c, n_envs, 4).await;
    let joined = moves(&own3, &own4);
    let bound = n_envs.div_ceil(4) + 1;
    println!(
        "a fourth replica joined: balanced in {:.2} s, {joined} environments moved, shares {:?}",
        t.elapsed().as_secs_f64(),
        own4.values().map(BTreeSet::len).collect::<Vec<_>>()
    );
    check(
        &mut ok,
        joined <= bound,
        &format!("moves on join ≤ ⌈E/N⌉ + 1 = {bound}"),
    );

    // 3. new versions everywhere, and the busiest replica killed in the middle of it
    let (victim_id, victim_envs) = busiest(&own4);
    let victim = index_of(&replicas, &victim_id).await;
    let survivor = (0..replicas.len()).find(|i| *i != victim).unwrap();
    let c = Client::new(
        &replicas[survivor].as_ref().unwrap().url,
        Some(ADMIN.into()),
    );
    for e in envs.iter_mut() {
        match &e.repo {
            Some(r) => e.commits.push(r.commit_and_push(2)),
            None => {
                c.upload(&e.id, &files(&e.dir, 2), json!({})).await.unwrap();
            }
        }
    }
    // kill when the victim's deploys are under way: its two-second commands running
    let victim_pushed: Vec<sqlx::types::Uuid> = envs
        .iter()
        .filter(|e| e.repo.is_none() && victim_envs.contains(&e.id))
        .map(|e| e.id.parse().unwrap())
        .collect();
    let waiting = Instant::now();
    loop {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT environment_id) FROM resource_actions \
             WHERE finished_at IS NULL AND starts_with(resource_id, 'exec::Run') \
             AND environment_id = ANY($1)",
        )
        .bind(&victim_pushed)
        .fetch_one(&pool)
        .await
        .unwrap();
        if running as usize == victim_pushed.len() || waiting.elapsed() > Duration::from_secs(20) {
            println!(
                "killing with deploys under way in {running} of its {} upload environments",
                victim_pushed.len()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = Instant::now();
    let killed_db: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut v = replicas[victim].take().unwrap();
    let _ = Command::new("kill")
        .args(["-9", &v.child.id().to_string()])
        .status();
    let _ = v.child.wait();
    let mut owned_after: Option<Duration> = None;
    let mut deployed: BTreeMap<String, Duration> = BTreeMap::new();
    // an action started after the kill: the environment is deploying again
    let mut again: BTreeMap<String, f64> = BTreeMap::new();
    loop {
        for e in envs.iter().filter(|e| victim_envs.contains(&e.id)) {
            if again.contains_key(&e.id) {
                continue;
            }
            let first: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
                "SELECT min(started_at) FROM resource_actions WHERE environment_id = $1 AND started_at > $2",
            )
            .bind(e.id.parse::<sqlx::types::Uuid>().unwrap())
            .bind(killed_db)
            .fetch_one(&pool)
            .await
            .unwrap();
            if let Some(t) = first {
                again.insert(
                    e.id.clone(),
                    (t - killed_db).num_milliseconds() as f64 / 1000.0,
                );
            }
        }
        if owned_after.is_none() {
            let own = ownership(&c).await;
            if victim_envs
                .iter()
                .all(|e| owner(&own, e).is_some_and(|o| o != victim_id))
            {
                owned_after = Some(killed_at.elapsed());
            }
        }
        for e in envs.iter().filter(|e| victim_envs.contains(&e.id)) {
            if !deployed.contains_key(&e.id) && newest_deployed(&c, e).await {
                deployed.insert(e.id.clone(), killed_at.elapsed());
            }
        }
        if owned_after.is_some()
            && deployed.len() == victim_envs.len()
            && again.len() == victim_pushed.len()
        {
            break;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(90), "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let own_left = balanced(&c, n_envs, 3).await;
    let left = moves(&own4, &own_left);
    let owned_s = owned_after.unwrap().as_secs_f64();
    let slowest = deployed.values().max().unwrap().as_secs_f64();
    let again_max = again.values().copied().fold(0.0, f64::max);
    println!(
        "kill -9 of {victim_id} ({} environments) mid-deploy: all owned again after {owned_s:.2} s, \
         deploying again (an action started) after {again_max:.2} s at most, newest versions \
         deployed after {slowest:.2} s at most (median {:.2} s); {left} environments moved",
        victim_envs.len(),
        {
            let mut d: Vec<f64> = deployed.values().map(Duration::as_secs_f64).collect();
            d.sort_by(f64::total_cmp);
            d[d.len() / 2]
        }
    );
    check(
        &mut ok,
        owned_s < 10.0 && again_max < 10.0,
        "killed replica's environments owned and deploying again < 10 s",
    );
    let bound = n_envs.div_ceil(4) + 1;
    check(
        &mut ok,
        left <= bound,
        &format!("moves on leave ≤ ⌈E/N⌉ + 1 = {bound}"),
    );

    // 4. a clean stop
    let (stop_id, stop_envs) = busiest(&own_left);
    let stop = index_of(&replicas, &stop_id).await;
    let asker = (0..replicas.len())
        .find(|i| *i != stop && replicas[*i].is_some())
        .unwrap();
    let c = Client::new(&replicas[asker].as_ref().unwrap().url, Some(ADMIN.into()));
    let mut s = replicas[stop].take().unwrap();
    let t = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status();
    let handover = loop {
        let own = ownership(&c).await;
        if stop_envs
            .iter()
            .all(|e| owner(&own, e).is_some_and(|o| o != stop_id))
        {
            break t.elapsed();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no handover");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let _ = s.child.wait();
    println!(
        "SIGTERM of {stop_id} ({} environments): all owned by the others after {:.3} s",
        stop_envs.len(),
        handover.as_secs_f64()
    );
    check(
        &mut ok,
        handover < Duration::from_secs(1),
        "clean stop hands over < 1 s",
    );

    // 5. nothing lost, nothing run twice
    for e in &envs {
        while !newest_deployed(&c, e).await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut lost_versions = 0;
    let mut broken_timelines = 0;
    let mut wrong_files = 0;
    for e in &envs {
        let versions = c.versions(&e.id).await.unwrap();
        match &e.repo {
            None => lost_versions += 2usize.abs_diff(versions.len()),
            Some(r) => {
                let commits: BTreeSet<&str> = versions
                    .iter()
                    .filter_map(|v| v["provenance"]["commit"].as_str())
                    .collect();
                lost_versions += e.commits.len().abs_diff(commits.len());
                lost_versions += versions.len().abs_diff(commits.len());
                for commit in &e.commits {
                    let tl = c.commit_timeline(&e.id, commit).await.unwrap();
                    let events: BTreeSet<String> = tl["events"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|x| x["event"].as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default();
                    let complete = ["received", "compiled", "released", "deployed"]
                        .iter()
                        .all(|x| events.contains(*x));
                    if !complete {
                        broken_timelines += 1;
                        println!("  timeline of {commit}: {events:?}");
                    }
                }
                let _ = r;
            }
        }
        let dir = e
            .repo
            .as_ref()
            .map(|r| r.out.clone())
            .unwrap_or(e.dir.clone());
        for i in 0..5 {
            let want = if e.repo.is_some() {
                format!("v2 {i}")
            } else {
                format!("v2 {i}\n")
            };
            if std::fs::read_to_string(dir.join(format!("f{i}"))).ok() != Some(want) {
                wrong_files += 1;
            }
        }
    }
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM resource_actions WHERE finished_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    let overlapping: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM resource_actions a JOIN resource_actions b \
         ON a.environment_id = b.environment_id AND a.resource_id = b.resource_id AND a.id < b.id \
         AND a.action <> 'dryrun' AND b.action <> 'dryrun' \
         AND a.started_at < COALESCE(b.finished_at, 'infinity') \
         AND b.started_at < COALESCE(a.finished_at, 'infinity')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let actions: i64 = sqlx::query_scalar("SELECT count(*) FROM resource_actions")
        .fetch_one(&pool)
        .await
        .unwrap();
    println!(
        "after the faults: {lost_versions} versions lost or doubled, {broken_timelines} incomplete commit timelines, \
         {wrong_files} files not as the newest version says, {open} of {actions} actions left open, \
         {overlapping} pairs of actions of one resource overlapping in time"
    );
    check(&mut ok, lost_versions == 0, "0 lost versions");
    check(&mut ok, broken_timelines == 0, "0 lost timeline entries");
    check(&mut ok, wrong_files == 0 && open == 0, "0 lost actions");
    check(&mut ok, overlapping == 0, "0 double execution");

    for r in replicas.iter_mut().flatten() {
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
    ok
}
