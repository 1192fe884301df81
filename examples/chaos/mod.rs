//! The fault/soak harness (issue 11): a real `steward server` child with its private
//! PostgreSQL cluster, following git repositories on this machine, loopback only.
//!
//! It keeps pushing commits to the "site" repository: every commit changes every file of two
//! projects in it (now and then a commit does not compile), followed by the environments
//! "site" (versions auto-released) and "manual" (the harness releases the newest version
//! through the API, as an approver would); see `follow.rs`. Meanwhile it injects faults:
//! kill -9 of the server shortly after a push (restarted on the same data dir and port),
//! kill -9 of an executor, `pg_ctl restart` of the cluster under the running server. Two more
//! environments follow a "faults" repository: "failing" holds a resource that always fails,
//! "hanging" a command that sleeps past a short `handler_timeout`; both have a short
//! `retry_backoff`. After a quiet period it checks convergence, commit timelines, open
//! actions, retry attempts against the backoff schedule, database growth and the server's
//! RSS (see `checks.rs`).
//!
//! Bounded: `minutes` of load, at most `max_requests` HTTP requests during it, every wait
//! has a limit, and every process started is killed when the harness returns, fails or
//! panics (`procs.rs`); the server also dies with the harness.

mod checks;
mod floods;
mod follow;
mod procs;
mod repo;

use std::cell::Cell;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::json;
use steward::client::Client;

pub use checks::{Check, Report};

/// The schedule of the failing resources (environment setting `retry_backoff`).
pub const RETRY_INITIAL: u64 = 2;
pub const RETRY_FACTOR: f64 = 2.0;
pub const RETRY_MAX: u64 = 16;
/// `handler_timeout` of the hanging environment, and how long its command sleeps.
pub const HANDLER_TIMEOUT: u64 = 3;
pub const HANG_SECS: u64 = 30;

pub struct Config {
    /// Minutes of load and injections (then a quiet period and the checks).
    pub minutes: f64,
    /// At most this many HTTP requests to the server.
    pub max_requests: u64,
    pub seed: u64,
    /// Files in the site model.
    pub files: usize,
    /// The program run as `… server`, `… compile`, `… executor`.
    pub steward_bin: PathBuf,
    /// Keep the temp dir (data dir, repositories, server log) for a post-mortem.
    pub keep: bool,
    /// How long the quiet period may wait for convergence.
    pub quiet_secs: u64,
    pub max_db_growth_mib: f64,
    pub max_rss_mib: f64,
    pub verbose: bool,
}

impl Config {
    pub fn new(steward_bin: PathBuf, minutes: f64) -> Config {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Config {
            minutes,
            max_requests: 50_000,
            seed,
            files: 20,
            steward_bin,
            keep: false,
            quiet_secs: 120,
            max_db_growth_mib: 256.0,
            max_rss_mib: 512.0,
            verbose: false,
        }
    }
}

/// What happened during the run.
#[derive(Default, Debug)]
pub struct Figures {
    pub seed: u64,
    pub commits: u32,
    /// Commits that do not compile.
    pub broken_commits: u32,
    /// Versions of the "manual" environment released through the API.
    pub releases: u32,
    pub server_kills: u32,
    pub executor_kills: u32,
    /// Executor kills that found no executor running.
    pub executor_kills_skipped: u32,
    pub pg_restarts: u32,
    /// kill -9 of the postmaster under the running server (its supervisor starts it again).
    pub pg_kills: u32,
    /// kill -9 of the server and of its postmaster at once, then one start.
    pub both_kills: u32,
    /// When the database was taken away (a restart, a kill): leases may lapse around then.
    pub db_faults_at: Vec<DateTime<Utc>>,
    pub requests: u64,
    pub failed_requests: u64,
    pub load_secs: f64,
    pub quiet_secs: f64,
    pub total_secs: f64,
    /// Longest time the server took to answer again after a kill.
    pub max_recovery_secs: f64,
    /// Longest time from a PostgreSQL restart to the server reading the database again.
    pub max_pg_reconnect_secs: f64,
    /// PostgreSQL restarts after which the server did not read the database within 60 s.
    pub pg_reconnect_failures: u32,
    /// The server exited without being killed.
    pub unexpected_exits: u32,
    /// (seconds into the load, server RSS KiB, database bytes), every few seconds.
    pub samples: Vec<(f64, Option<u64>, Option<i64>)>,
    /// Processes started by the server still running a second after it stopped.
    pub left_behind: Vec<String>,
    /// Seconds since the last start of the server, when its RSS was measured.
    pub uptime_secs: f64,
    pub server_starts: u32,
    pub db_start_bytes: Option<i64>,
    pub db_end_bytes: Option<i64>,
    pub rss_kib: Option<u64>,
    pub hwm_kib: Option<u64>,
    /// When the server was killed (timers may restart then).
    pub kills_at: Vec<DateTime<Utc>>,
    pub workdir: Option<PathBuf>,
}

/// A commit pushed to the site repository.
pub struct Pushed {
    pub sha: String,
    pub round: u32,
    /// Its models do not compile (the active versions stay).
    pub broken: bool,
}

/// xorshift64*: reproducible with `seed`, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo + 1))
    }
}

/// The REST client, counting requests, every call with a time limit.
pub struct Api {
    pub c: Client,
    requests: Cell<u64>,
    failed: Cell<u64>,
}

impl Api {
    fn new(url: &str, token: &str) -> Api {
        Api {
            c: Client::new(url, Some(token.to_string())),
            requests: Cell::new(0),
            failed: Cell::new(0),
        }
    }

    pub async fn req<T>(
        &self,
        f: impl Future<Output = steward::client::Result<T>>,
    ) -> Result<T, String> {
        self.requests.set(self.requests.get() + 1);
        let r = match tokio::time::timeout(Duration::from_secs(15), f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 15 s".to_string()),
        };
        if r.is_err() {
            self.failed.set(self.failed.get() + 1);
        }
        r
    }

    pub fn requests(&self) -> u64 {
        self.requests.get()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    KillServer,
    KillExecutor,
    RestartPostgres,
    KillPostgres,
    KillBoth,
}

/// Everything the checks look at.
pub struct Run {
    pub api: Api,
    pub server: procs::Server,
    pub follows: Vec<follow::Follow>,
    pub failing_env: String,
    pub hanging_env: String,
    pub failing_path: PathBuf,
    pub pushed: Vec<Pushed>,
    pub db_url: String,
    /// The environment whose handler floods its logs, and the agent process naming
    /// thousands of agents.
    pub flood_env: String,
    pub agent_flood: floods::AgentFlood,
}

/// Run the harness; the report says what passed.
pub async fn run(cfg: &Config) -> Report {
    let started = Instant::now();
    let mut figures = Figures {
        seed: cfg.seed,
        ..Figures::default()
    };
    let mut checks = Vec::new();
    let tmp = match tempfile::Builder::new().prefix("steward-chaos-").tempdir() {
        Ok(t) => t,
        Err(e) => {
            checks.push(Check::fail("harness", format!("temp dir: {e}")));
            return Report { figures, checks };
        }
    };
    if let Err(e) = drive(cfg, tmp.path(), &mut figures, &mut checks).await {
        checks.push(Check::fail("harness", e));
    }
    figures.total_secs = started.elapsed().as_secs_f64();
    if cfg.keep {
        figures.workdir = Some(tmp.keep());
    }
    Report { figures, checks }
}

fn say(cfg: &Config, started: Instant, what: &str) {
    if cfg.verbose {
        eprintln!("[chaos {:>6.1}s] {what}", started.elapsed().as_secs_f64());
    }
}

/// Wait until the server answers /health (or exits, or `limit` passes).
async fn healthy(api: &Api, server: &mut procs::Server, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Err(e) = server.alive() {
            return Err(format!("{e}\n{}", procs::tail(&server.log, 30)));
        }
        if api.req(api.c.health()).await.is_ok() {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "the server did not answer within {} s\n{}",
                limit.as_secs(),
                procs::tail(&server.log, 30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn drive(
    cfg: &Config,
    root: &Path,
    figures: &mut Figures,
    checks: &mut Vec<Check>,
) -> Result<(), String> {
    let started = Instant::now();
    let mut rng = Rng(cfg.seed.max(1));
    let mut follows = vec![
        follow::Follow::new("site", root, cfg.files, false),
        follow::Follow::new("manual", root, cfg.files.div_ceil(4), true),
    ];
    let faults_out = root.join("faults-out");
    for d in follows.iter().map(|f| &f.out).chain([&faults_out]) {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        // handlers run as their environment's own uid when the server runs as root (the
        // sandbox): the directories they write are open to them, as an operator would
        // give a directory to the environments that manage it
        open_to_handlers(root, d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let failing_path = faults_out.join("no-such-dir").join("never");
    let data_dir = root.join("server");
    let token = format!("chaos-admin-{:016x}", rng.next());
    let port = procs::free_port()?;
    let mut server = procs::Server::new(
        &cfg.steward_bin,
        &data_dir,
        port,
        &token,
        &root.join("server.log"),
    );
    let api = Api::new(&server.url(), &token);
    server.spawn()?;
    say(
        cfg,
        started,
        &format!("server starting on {}", server.url()),
    );
    healthy(&api, &mut server, Duration::from_secs(180)).await?;
    // a watchdog: the cluster must not outlive us, however we end (it also removes the
    // cluster's files, so not when they are to be kept)
    if !cfg.keep
        && let Some(c) = server.cluster()
    {
        let _ = c.remove_when_process_exits(std::process::id());
    }
    let db_url = procs::database_url(&data_dir)?;

    // the repositories, and the environments following them
    let site = repo::Repo::create(root, "site")?;
    let faults = repo::Repo::create(root, "faults")?;
    let mut round = 1;
    let mut pushed = vec![follow::commit_round(&site, &follows, round, false)?];
    floods::write_files(&faults.work, &floods::flood_project())?;
    faults.commit(
        &[
            (
                "failing",
                &repo::failing_model(&faults_out.join("good-1"), &failing_path),
            ),
            (
                "hanging",
                &repo::hanging_model(&faults_out.join("good-2"), HANG_SECS),
            ),
        ],
        "faults",
    )?;
    faults.push()?;
    for f in follows.iter_mut() {
        let settings = json!({"auto_release": !f.manual});
        f.env = api
            .req(api.c.create_environment("chaos", f.name, Some(settings)))
            .await?
            .id
            .to_string();
    }
    let backoff = json!({"initial": RETRY_INITIAL, "factor": RETRY_FACTOR, "max": RETRY_MAX});
    let failing_env = api
        .req(
            api.c
                .create_environment("chaos", "failing", Some(json!({"retry_backoff": backoff}))),
        )
        .await?
        .id
        .to_string();
    let hanging_env = api
        .req(api.c.create_environment(
            "chaos",
            "hanging",
            Some(json!({"retry_backoff": backoff, "handler_timeout": HANDLER_TIMEOUT})),
        ))
        .await?
        .id
        .to_string();
    let flood_env = api
        .req(api.c.create_environment(
            "chaos",
            "flood",
            Some(json!({"repair_interval": floods::FLOOD_REPAIR_SECS})),
        ))
        .await?
        .id
        .to_string();
    let mut agent_flood = floods::AgentFlood {
        env: api
            .req(api.c.create_environment("chaos", "agents", None))
            .await?
            .id
            .to_string(),
        ..Default::default()
    };
    let mut sources: Vec<(&str, &repo::Repo, &str)> = follows
        .iter()
        .map(|f| (f.env.as_str(), &site, f.name))
        .collect();
    sources.push((&failing_env, &faults, "failing"));
    sources.push((&hanging_env, &faults, "hanging"));
    sources.push((&flood_env, &faults, "flood"));
    for (env, r, path) in sources {
        // pushes are seen by watching the repository; polling catches what a crash missed
        api.req(api.c.set_source(
            env,
            &json!({"url": r.url(), "branch": "main", "path": path, "poll_interval": 5, "watch": true}),
        ))
        .await?;
    }
    // the first version on disk before the faults begin
    let first = Instant::now();
    while !follows.iter().all(|f| f.converged(round)) {
        if let Ok(Some(_)) = follows[1].release_newest(&api).await {
            figures.releases += 1;
        }
        if first.elapsed() > Duration::from_secs(180) {
            return Err(format!(
                "the first version did not reach the disk within 180 s\n{}",
                procs::tail(&server.log, 30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    say(
        cfg,
        started,
        "first version deployed; load and faults begin",
    );
    figures.db_start_bytes = checks::database_size(&db_url).await.ok();

    // ------------------------------------------------------------------ load and faults
    let load_start = Instant::now();
    let deadline = load_start + Duration::from_secs_f64(cfg.minutes.max(0.0) * 60.0);
    // every kind of fault at least once, in a random order, then at random
    let mut order = vec![
        Fault::KillExecutor,
        Fault::RestartPostgres,
        Fault::KillServer,
        Fault::KillPostgres,
        Fault::KillBoth,
    ];
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    order.reverse();
    let mut next_push = Instant::now() + rng.millis(1000, 3000);
    let mut next_fault = Instant::now() + rng.millis(3000, 6000);
    let mut next_poll = Instant::now();
    let mut down_since: Option<Instant> = None;
    // about ten samples of memory and database size over the run
    let sample_every = Duration::from_secs_f64((cfg.minutes * 6.0).clamp(10.0, 300.0));
    let mut next_sample = Instant::now();
    let mut next_agent_flood = Instant::now() + Duration::from_secs(2);
    // a server kill waits for the next push
    let mut kill_armed = false;
    let mut kill_at: Option<Instant> = None;
    while Instant::now() < deadline {
        if api.requests() >= cfg.max_requests {
            say(cfg, started, "request budget spent: load stops early");
            break;
        }
        if let Err(e) = server.alive() {
            figures.unexpected_exits += 1;
            // what it said last on the way out first: the report shows a few lines only
            let log = procs::tail(&server.log, 200);
            let said = log
                .lines()
                .rev()
                .find(|l| l.starts_with("error") || l.contains(" ERROR "))
                .unwrap_or("(no error line)")
                .to_string();
            say(
                cfg,
                started,
                &format!("the server exited on its own: {e}: {said}"),
            );
            checks.push(Check::fail(
                "server exit",
                format!("{e} (restarted)\n{}", procs::exit_reason(&server.log, 8)),
            ));
            server.spawn()?;
            down_since = Some(Instant::now());
        }
        let now = Instant::now();
        if now >= next_push {
            round += 1;
            // now and then a commit that does not compile
            let broken = rng.below(8) == 0;
            let p = follow::commit_round(&site, &follows, round, broken)?;
            figures.broken_commits += broken as u32;
            say(
                cfg,
                started,
                &format!(
                    "pushed round {round} ({}){}",
                    &p.sha[..10],
                    if broken { ", broken" } else { "" }
                ),
            );
            pushed.push(p);
            next_push = now + rng.millis(1500, 4000);
            // a kill that waits for a push lands while that commit is on its way: being
            // fetched, compiled, stored, released or deployed
            if kill_armed {
                kill_armed = false;
                kill_at = Some(now + rng.millis(50, 2500));
            }
        }
        if kill_at.is_some_and(|t| now >= t) && down_since.is_none() {
            kill_at = None;
            figures.kills_at.push(Utc::now());
            server.kill9();
            figures.server_kills += 1;
            server.spawn()?;
            down_since = Some(Instant::now());
            say(cfg, started, "kill -9 server; restarted");
        }
        if now >= next_fault && down_since.is_none() && !kill_armed && kill_at.is_none() {
            let fault = order.pop().unwrap_or(match rng.below(5) {
                0 => Fault::KillServer,
                1 => Fault::KillExecutor,
                2 => Fault::RestartPostgres,
                3 => Fault::KillPostgres,
                _ => Fault::KillBoth,
            });
            match fault {
                Fault::KillServer => kill_armed = true,
                Fault::KillExecutor => {
                    let pids = server.pid().map(procs::executors_of).unwrap_or_default();
                    if pids.is_empty() {
                        figures.executor_kills_skipped += 1;
                        say(cfg, started, "no executor running to kill");
                    } else {
                        let pid = pids[rng.below(pids.len())];
                        procs::kill9(pid);
                        figures.executor_kills += 1;
                        say(cfg, started, &format!("kill -9 executor {pid}"));
                    }
                }
                Fault::KillBoth => {
                    // a power cut: both at once, then one start that must work
                    let pg = procs::postmaster_of(&data_dir);
                    figures.kills_at.push(Utc::now());
                    figures.db_faults_at.push(Utc::now());
                    server.kill9();
                    if let Some(pg) = pg {
                        procs::kill9(pg);
                    }
                    figures.both_kills += 1;
                    server.spawn()?;
                    down_since = Some(Instant::now());
                    say(
                        cfg,
                        started,
                        "kill -9 server and PostgreSQL; restarted once",
                    );
                }
                Fault::KillPostgres => match procs::postmaster_of(&data_dir) {
                    Some(pg) => {
                        figures.db_faults_at.push(Utc::now());
                        procs::kill9(pg);
                        figures.pg_kills += 1;
                        // the server's supervisor starts it again; its pool reconnects
                        let t = Instant::now();
                        let limit = Duration::from_secs(60);
                        while api.req(api.c.resources(&follows[0].env)).await.is_err()
                            && t.elapsed() < limit
                        {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        let secs = t.elapsed().as_secs_f64();
                        figures.max_pg_reconnect_secs = figures.max_pg_reconnect_secs.max(secs);
                        if t.elapsed() >= limit {
                            figures.pg_reconnect_failures += 1;
                        }
                        say(
                            cfg,
                            started,
                            &format!(
                                "kill -9 PostgreSQL {pg}; the server read the database again {secs:.1} s later"
                            ),
                        );
                    }
                    None => say(cfg, started, "no postmaster to kill"),
                },
                Fault::RestartPostgres => {
                    figures.db_faults_at.push(Utc::now());
                    let d = data_dir.clone();
                    match tokio::task::spawn_blocking(move || procs::restart_postgres(&d)).await {
                        Ok(Ok(took)) => {
                            figures.pg_restarts += 1;
                            // the server must reconnect: a request that reads the database
                            let t = Instant::now();
                            let limit = Duration::from_secs(60);
                            while api.req(api.c.resources(&follows[0].env)).await.is_err()
                                && t.elapsed() < limit
                            {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            let secs = t.elapsed().as_secs_f64();
                            figures.max_pg_reconnect_secs = figures.max_pg_reconnect_secs.max(secs);
                            if t.elapsed() >= limit {
                                figures.pg_reconnect_failures += 1;
                            }
                            say(
                                cfg,
                                started,
                                &format!(
                                    "pg_ctl restart took {:.1} s; the server read the database again {secs:.1} s later",
                                    took.as_secs_f64()
                                ),
                            );
                        }
                        Ok(Err(e)) => checks.push(Check::fail("postgres restart", e)),
                        Err(e) => checks.push(Check::fail("postgres restart", e.to_string())),
                    }
                }
            }
            next_fault = Instant::now() + rng.millis(5000, 12000);
        }
        if now >= next_poll {
            next_poll = now + Duration::from_millis(1000);
            let up = api.req(api.c.health()).await.is_ok();
            if let (true, Some(t)) = (up, down_since) {
                let secs = t.elapsed().as_secs_f64();
                figures.max_recovery_secs = figures.max_recovery_secs.max(secs);
                down_since = None;
                say(
                    cfg,
                    started,
                    &format!("server answers again after {secs:.1} s"),
                );
            }
            if up {
                // the manual environment: its newest version released, as an operator would
                for f in follows.iter().filter(|f| f.manual) {
                    if let Ok(Some(v)) = f.release_newest(&api).await {
                        figures.releases += 1;
                        say(cfg, started, &format!("released {} version {v}", f.name));
                    }
                }
                // read load, as a UI would: the site's resources and the deploy progress
                let site = &follows[0].env;
                if let Ok((Some(v), _)) = api.req(api.c.resources(site)).await {
                    let _ = api.req(api.c.progress(site, v)).await;
                }
            }
        }
        if now >= next_agent_flood && down_since.is_none() {
            next_agent_flood = now + rng.millis(5000, 10000);
            agent_flood.step(&api).await;
        }
        if now >= next_sample {
            next_sample = now + sample_every;
            figures.samples.push((
                load_start.elapsed().as_secs_f64(),
                server.pid().and_then(procs::rss_kib).map(|(rss, _)| rss),
                checks::database_size(&db_url).await.ok(),
            ));
        }
        if let Some(t) = down_since
            && t.elapsed() > Duration::from_secs(120)
        {
            return Err(format!(
                "the server did not come back within 120 s of a restart\n{}",
                procs::tail(&server.log, 30)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    figures.load_secs = load_start.elapsed().as_secs_f64();
    figures.commits = pushed.len() as u32;

    // ------------------------------------------------------------------ quiet period
    say(cfg, started, "faults stop; waiting for convergence");
    let quiet_start = Instant::now();
    if server.alive().is_err() {
        server.spawn()?;
    }
    healthy(&api, &mut server, Duration::from_secs(120)).await?;
    let quiet_limit = Duration::from_secs(cfg.quiet_secs);
    loop {
        for f in follows.iter().filter(|f| f.manual) {
            if let Ok(Some(_)) = f.release_newest(&api).await {
                figures.releases += 1;
            }
        }
        let mut waiting = Vec::new();
        for f in &follows {
            if !f.settled(&api, &pushed).await {
                waiting.push(f.name);
            }
        }
        if waiting.is_empty() {
            break;
        }
        if quiet_start.elapsed() > quiet_limit {
            say(
                cfg,
                started,
                &format!(
                    "not settled after {} s: {}",
                    quiet_limit.as_secs(),
                    waiting.join(", ")
                ),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // a few retry periods more, so the failing resources show their schedule
    tokio::time::sleep(Duration::from_secs(RETRY_MAX.min(5))).await;
    figures.quiet_secs = quiet_start.elapsed().as_secs_f64();

    let mut run = Run {
        api,
        server,
        follows,
        failing_env,
        hanging_env,
        failing_path,
        pushed,
        db_url,
        flood_env,
        agent_flood,
    };
    checks::check_all(cfg, &mut run, figures, checks).await;
    match <sqlx::PgConnection as sqlx::Connection>::connect(&run.db_url).await {
        Ok(mut db) => {
            checks.extend(
                floods::checks(
                    &run,
                    &run.flood_env,
                    &run.agent_flood,
                    &figures.db_faults_at,
                    &mut db,
                )
                .await,
            );
            let _ = sqlx::Connection::close(db).await;
        }
        Err(e) => checks.push(Check::fail("floods", e.to_string())),
    }
    figures.requests = run.api.requests();
    figures.failed_requests = run.api.failed.get();
    figures.server_starts = run.server.starts;
    say(cfg, started, "checks done; stopping the server");
    if !run.server.stop(Duration::from_secs(60)) {
        checks.push(Check::fail(
            "graceful stop",
            "the server did not stop within 60 s of SIGTERM (killed)".to_string(),
        ));
    }
    // what outlived the server: reported, then killed
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (pid, cmd) in procs::marked(&run.server.marker) {
        say(cfg, started, &format!("left behind: {pid} {cmd}"));
        figures.left_behind.push(cmd);
        procs::kill9(pid);
    }
    Ok(())
}

/// Let the handlers' sandbox uids reach `dir` under `root`: every directory from `root` down
/// traversable by others, `dir` itself writable by all (sticky, as /tmp).
fn open_to_handlers(root: &std::path::Path, dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut at = Some(dir);
    while let Some(d) = at {
        let mode = std::fs::metadata(d)?.permissions().mode() & 0o7777;
        let wanted = if d == dir { 0o1777 } else { mode | 0o001 };
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(wanted))?;
        if d == root {
            break;
        }
        at = d.parent();
    }
    Ok(())
}
