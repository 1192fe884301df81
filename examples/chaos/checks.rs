//! The checks at the end of a run, and the summary.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Connection;

use super::follow::{Follow, last_good};
use super::procs;
use super::{
    Api, Config, Figures, HANDLER_TIMEOUT, Pushed, RETRY_FACTOR, RETRY_INITIAL, RETRY_MAX, Run,
};

pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn pass(name: &str, detail: String) -> Check {
        Check {
            name: name.into(),
            ok: true,
            detail,
        }
    }

    pub fn fail(name: &str, detail: String) -> Check {
        Check {
            name: name.into(),
            ok: false,
            detail,
        }
    }

    fn new(name: &str, ok: bool, detail: String) -> Check {
        Check {
            name: name.into(),
            ok,
            detail,
        }
    }
}

pub struct Report {
    pub figures: Figures,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn ok(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.ok)
    }

    #[allow(dead_code)] // the test suite asks for single checks
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The summary: figures, then one line per check.
    pub fn render(&self) -> String {
        let f = &self.figures;
        let mib = |b: Option<i64>| {
            b.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
                .unwrap_or_else(|| "?".into())
        };
        let mut s = String::new();
        s.push_str("=== chaos run ===\n");
        s.push_str(&format!(
            "seed {}  duration {:.0} s (load {:.0} s, quiet {:.0} s)\n",
            f.seed, f.total_secs, f.load_secs, f.quiet_secs
        ));
        s.push_str(&format!(
            "commits pushed {} ({} broken)  manual releases {}  requests {} ({} failed, mostly while the server was down)\n",
            f.commits, f.broken_commits, f.releases, f.requests, f.failed_requests
        ));
        s.push_str(&format!(
            "injections: server kill -9 {}  executor kill -9 {} (+{} found none)  pg_ctl restart {}  PostgreSQL kill -9 {}  server+PostgreSQL kill -9 {}  server starts {}  slowest recovery {:.1} s\n",
            f.server_kills,
            f.executor_kills,
            f.executor_kills_skipped,
            f.pg_restarts,
            f.pg_kills,
            f.both_kills,
            f.server_starts,
            f.max_recovery_secs
        ));
        let growth = match (f.db_start_bytes, f.db_end_bytes) {
            (Some(a), Some(b)) => format!("{:+.1} MiB", (b - a) as f64 / 1048576.0),
            _ => "?".into(),
        };
        s.push_str(&format!(
            "database {} -> {} ({growth})  server RSS {} (peak {}, up {:.0} s)\n",
            mib(f.db_start_bytes),
            mib(f.db_end_bytes),
            f.rss_kib
                .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "?".into()),
            f.hwm_kib
                .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "?".into()),
            f.uptime_secs,
        ));
        if !f.samples.is_empty() {
            let show = |v: Option<f64>| v.map(|v| format!("{v:.0}")).unwrap_or("?".into());
            s.push_str("over time (s: server RSS MiB / database MiB):");
            for (t, rss, db) in &f.samples {
                s.push_str(&format!(
                    " {t:.0}: {}/{}",
                    show(rss.map(|k| k as f64 / 1024.0)),
                    show(db.map(|b| b as f64 / 1048576.0))
                ));
            }
            s.push('\n');
        }
        if !f.left_behind.is_empty() {
            s.push_str(&format!(
                "still running a second after the server stopped (killed): {}\n",
                f.left_behind.join("; ")
            ));
        }
        if let Some(w) = &f.workdir {
            s.push_str(&format!(
                "kept: {} (server.log, server/, repositories)\n",
                w.display()
            ));
        }
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
        s.push_str(&format!("{:<width$}  result  detail\n", "check"));
        for c in &self.checks {
            let mut lines = c.detail.lines();
            s.push_str(&format!(
                "{:<width$}  {}    {}\n",
                c.name,
                if c.ok { "PASS" } else { "FAIL" },
                lines.next().unwrap_or("")
            ));
            for l in lines.take(12) {
                s.push_str(&format!("{:<width$}          {l}\n", ""));
            }
        }
        s.push_str(if self.ok() {
            "=== all checks passed ===\n"
        } else {
            "=== SOME CHECKS FAILED ===\n"
        });
        s
    }
}

async fn connect(url: &str) -> Result<sqlx::PgConnection, String> {
    match tokio::time::timeout(Duration::from_secs(15), sqlx::PgConnection::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("connecting to the database timed out".into()),
    }
}

pub async fn database_size(url: &str) -> Result<i64, String> {
    let mut c = connect(url).await?;
    let n: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&mut c)
        .await
        .map_err(|e| e.to_string())?;
    let _ = c.close().await;
    Ok(n)
}

/// Most attempts the retry schedule allows in `secs` (the first attempt included).
pub fn attempts_allowed(secs: f64) -> u64 {
    let mut n = 1;
    let mut t = 0.0;
    let mut delay = RETRY_INITIAL as f64;
    loop {
        t += delay.min(RETRY_MAX as f64);
        if t > secs {
            return n;
        }
        n += 1;
        delay *= RETRY_FACTOR;
    }
}

/// The default `deploy_interval` (the fault environments keep it): every period, resources
/// not known to be good are deployed once more.
const DEPLOY_INTERVAL_SECS: f64 = 600.0;

/// The bound for attempts started at `first` until `end`: the schedule starts over at every
/// server kill (as if timers were lost), plus one attempt per other fault, one per periodic
/// deploy and 2 of slack.
pub fn attempts_bound(
    first: DateTime<Utc>,
    end: DateTime<Utc>,
    kills: &[DateTime<Utc>],
    other_faults: u64,
) -> u64 {
    let mut cuts: Vec<DateTime<Utc>> = kills
        .iter()
        .copied()
        .filter(|k| *k > first && *k < end)
        .collect();
    cuts.sort();
    let mut from = first;
    let mut total = 0;
    for cut in cuts.into_iter().chain(std::iter::once(end)) {
        total += attempts_allowed((cut - from).num_milliseconds() as f64 / 1000.0);
        from = cut;
    }
    let periodic = ((end - first).num_seconds() as f64 / DEPLOY_INTERVAL_SECS).ceil() as u64;
    total + other_faults + periodic + 2
}

const TERMINAL: [&str; 5] = [
    "superseded",
    "deployed",
    "deploy_failed",
    "compile_failed",
    // released, then a newer release came before its deploy settled
    "replaced",
];

pub async fn check_all(
    cfg: &Config,
    run: &mut Run,
    figures: &mut Figures,
    checks: &mut Vec<Check>,
) {
    // (a) the last released version converged, (b) every commit's timeline reached its
    // last state
    for f in &run.follows {
        checks.push(converged(&run.api, f, &run.pushed).await);
        checks.push(timelines(&run.api, f, &run.pushed).await);
    }
    checks.push(faults_converged(run).await);

    // (c), (d), (e): from the database
    match connect(&run.db_url).await {
        Ok(mut db) => {
            db_checks(cfg, run, figures, checks, &mut db).await;
            let _ = db.close().await;
        }
        Err(e) => checks.push(Check::fail("database", e)),
    }

    // the server survived what it was not killed for, and came back from what it was
    checks.push(Check::new(
        "server recovers",
        figures.unexpected_exits == 0 && figures.pg_reconnect_failures == 0,
        format!(
            "{} unexpected exits; answers {:.1} s at most after a kill -9; reads the database {:.1} s at most after a PostgreSQL restart ({} of {} restarts not within 60 s)",
            figures.unexpected_exits,
            figures.max_recovery_secs,
            figures.max_pg_reconnect_secs,
            figures.pg_reconnect_failures,
            figures.pg_restarts
        ),
    ));

    // (f) the server's memory
    match run.server.pid().and_then(procs::rss_kib) {
        Some((rss, hwm)) => {
            figures.rss_kib = Some(rss);
            figures.hwm_kib = Some(hwm);
            figures.uptime_secs = run
                .server
                .started_at
                .map(|t| t.elapsed().as_secs_f64())
                .unwrap_or(0.0);
            let mib = rss as f64 / 1024.0;
            // a kill restarts the count: the samples taken over the run count too
            let sampled = figures
                .samples
                .iter()
                .filter_map(|(_, rss, _)| *rss)
                .max()
                .unwrap_or(0) as f64
                / 1024.0;
            checks.push(Check::new(
                "server RSS",
                mib.max(sampled) <= cfg.max_rss_mib,
                format!(
                    "{mib:.1} MiB (peak {:.1} MiB) after {:.0} s since its last start; highest sampled during the run {sampled:.1} MiB; limit {} MiB",
                    hwm as f64 / 1024.0,
                    figures.uptime_secs,
                    cfg.max_rss_mib
                ),
            ));
        }
        None => checks.push(Check::fail(
            "server RSS",
            "no server process to measure".into(),
        )),
    }
}

async fn db_checks(
    cfg: &Config,
    run: &Run,
    figures: &mut Figures,
    checks: &mut Vec<Check>,
    db: &mut sqlx::PgConnection,
) {
    let followers: Result<Vec<uuid::Uuid>, _> = run
        .follows
        .iter()
        .map(|f| f.env.parse::<uuid::Uuid>())
        .collect();
    let (Ok(followers), Ok(failing), Ok(hanging)) = (
        followers,
        run.failing_env.parse::<uuid::Uuid>(),
        run.hanging_env.parse::<uuid::Uuid>(),
    ) else {
        checks.push(Check::fail(
            "database",
            "environment ids are not UUIDs".into(),
        ));
        return;
    };

    // (c) no action left open: none in the settled followers; in the fault environments none
    // older than a handler timeout (their resources are retried all the time)
    let open: Result<Vec<(String, String, DateTime<Utc>)>, _> = sqlx::query_as(
        "SELECT e.name, a.resource_id, a.started_at FROM resource_actions a \
         JOIN environments e ON e.id = a.environment_id \
         WHERE a.finished_at IS NULL AND (a.environment_id = ANY($1) OR \
         (a.environment_id IN ($2, $3) AND a.started_at < now() - make_interval(secs => $4))) \
         ORDER BY a.started_at",
    )
    .bind(&followers)
    .bind(failing)
    .bind(hanging)
    .bind((HANDLER_TIMEOUT + 20) as f64)
    .fetch_all(&mut *db)
    .await;
    let total: Result<i64, _> = sqlx::query_scalar(
        "SELECT count(*) FROM resource_actions WHERE environment_id = ANY($1) OR environment_id IN ($2, $3)",
    )
    .bind(&followers)
    .bind(failing)
    .bind(hanging)
    .fetch_one(&mut *db)
    .await;
    checks.push(match open {
        Ok(rows) if rows.is_empty() => Check::pass(
            "no open action",
            format!(
                "{} actions recorded, none left open",
                total
                    .map(|n| n.to_string())
                    .unwrap_or_else(|e| e.to_string())
            ),
        ),
        Ok(rows) => Check::fail(
            "no open action",
            rows.iter()
                .map(|(env, r, at)| format!("{env}: {r} open since {at}"))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Err(e) => Check::fail("no open action", e.to_string()),
    });

    // (d) attempts of the failing resources within the backoff schedule
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *db)
        .await
        .unwrap_or_else(|_| Utc::now());
    let other_faults = (figures.executor_kills + figures.pg_restarts) as u64;
    let failing_pattern = format!("%{}%", run.failing_path.display());
    let hanging_pattern = format!("%sleep {}%", super::HANG_SECS);
    let mut lines = Vec::new();
    let mut ok = true;
    for (what, env, pattern) in [
        ("failing file", failing, &failing_pattern),
        ("hanging command", hanging, &hanging_pattern),
    ] {
        let starts: Result<Vec<DateTime<Utc>>, _> = sqlx::query_scalar(
            "SELECT started_at FROM resource_actions WHERE environment_id = $1 \
             AND resource_id LIKE $2 AND action = 'deploy' ORDER BY started_at",
        )
        .bind(env)
        .bind(pattern)
        .fetch_all(&mut *db)
        .await;
        match starts {
            Ok(s) if s.is_empty() => {
                ok = false;
                lines.push(format!("{what}: never attempted"));
            }
            Ok(s) => {
                let bound = attempts_bound(s[0], now, &figures.kills_at, other_faults);
                let secs = (now - s[0]).num_milliseconds() as f64 / 1000.0;
                let within = s.len() as u64 <= bound;
                ok &= within;
                let mut gaps: Vec<f64> = s
                    .windows(2)
                    .map(|w| (w[1] - w[0]).num_milliseconds() as f64 / 1000.0)
                    .collect();
                let first: Vec<String> = gaps.iter().take(16).map(|g| format!("{g:.1}")).collect();
                gaps.sort_by(|a, b| a.total_cmp(b));
                let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0);
                let longest = gaps.last().copied().unwrap_or(0.0);
                lines.push(format!(
                    "{what}: {} attempts in {secs:.0} s, the schedule ({RETRY_INITIAL} s x{RETRY_FACTOR} up to {RETRY_MAX} s, restarted at each of {} server kills, +{other_faults} other faults, +1 per {DEPLOY_INTERVAL_SECS} s, +2) allows {bound}{}",
                    s.len(),
                    figures.kills_at.len(),
                    if within { "" } else { "  <-- too many" }
                ));
                let statuses: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT status, count(*) FROM resource_actions WHERE environment_id = $1 \
                     AND resource_id LIKE $2 AND action = 'deploy' GROUP BY 1 ORDER BY 2 DESC",
                )
                .bind(env)
                .bind(pattern)
                .fetch_all(&mut *db)
                .await
                .unwrap_or_default();
                lines.push(format!(
                    "  seconds between attempts: {} …; median {median:.1}, longest {longest:.1}; outcomes: {}",
                    first.join(" "),
                    statuses
                        .iter()
                        .map(|(s, n)| format!("{s} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            Err(e) => {
                ok = false;
                lines.push(format!("{what}: {e}"));
            }
        }
    }
    checks.push(Check::new("retry backoff", ok, lines.join("\n")));

    // (e) database growth
    let end: Result<i64, _> = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(&mut *db)
        .await;
    match (figures.db_start_bytes, end) {
        (Some(start), Ok(end)) => {
            figures.db_end_bytes = Some(end);
            let growth = (end - start) as f64 / 1048576.0;
            let rows: Vec<(String, i64)> = sqlx::query_as(
                "SELECT relname::text, n_live_tup FROM pg_stat_user_tables \
                 WHERE n_live_tup > 0 ORDER BY n_live_tup DESC LIMIT 4",
            )
            .fetch_all(&mut *db)
            .await
            .unwrap_or_default();
            checks.push(Check::new(
                "database growth",
                growth <= cfg.max_db_growth_mib,
                format!(
                    "{:.1} MiB -> {:.1} MiB ({growth:+.1} MiB, limit {} MiB); most rows: {}",
                    start as f64 / 1048576.0,
                    end as f64 / 1048576.0,
                    cfg.max_db_growth_mib,
                    rows.iter()
                        .map(|(t, n)| format!("{t} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        (None, _) => checks.push(Check::fail(
            "database growth",
            "the size at the start is unknown".into(),
        )),
        (_, Err(e)) => checks.push(Check::fail("database growth", e.to_string())),
    }
}

/// The files on disk hold the last commit that compiles, its version is the active one and
/// every resource of it is deployed.
async fn converged(api: &Api, f: &Follow, pushed: &[Pushed]) -> Check {
    let name = format!("converged: {}", f.name);
    let Some(last) = last_good(pushed) else {
        return Check::fail(&name, "no commit that compiles".into());
    };
    let mut problems = Vec::new();
    let wrong = f.wrong_files(last.round);
    if let Some(first) = wrong.first() {
        problems.push(format!(
            "{} of {} files do not hold round {} (first: f{first:03})",
            wrong.len(),
            f.files,
            last.round
        ));
    }
    let mut summary = String::new();
    let active = match api.req(api.c.resources(&f.env)).await {
        Ok((Some(v), _)) => {
            match api.req(api.c.progress(&f.env, v)).await {
                Ok(p) => {
                    let deployed = p["by_status"]["deployed"].as_i64().unwrap_or(0);
                    let total = p["total"].as_i64().unwrap_or(-1);
                    summary = format!("version {v}: {deployed} of {total} deployed");
                    if deployed != total || p["done"] != true {
                        problems.push(format!(
                            "{summary}, done={} ({})",
                            p["done"], p["by_status"]
                        ));
                    }
                }
                Err(e) => problems.push(format!("progress: {e}")),
            }
            Some(v)
        }
        Ok((None, _)) => {
            problems.push("no active version".into());
            None
        }
        Err(e) => {
            problems.push(format!("resources: {e}"));
            None
        }
    };
    // the active version is the last good commit's
    match api.req(api.c.commit_timeline(&f.env, &last.sha)).await {
        Ok(t) => {
            let made = t["events"].as_array().and_then(|evs| {
                evs.iter()
                    .rev()
                    .find(|e| e["event"] == "version")
                    .and_then(|e| e["detail"]["version"].as_i64())
            });
            if made.map(|v| v as i32) != active {
                problems.push(format!(
                    "round {} made version {made:?}, the active one is {active:?}",
                    last.round
                ));
            }
        }
        Err(e) => problems.push(format!("timeline of round {}: {e}", last.round)),
    }
    if problems.is_empty() {
        Check::pass(
            &name,
            format!("{} files hold round {}; {summary}", f.files, last.round),
        )
    } else {
        Check::fail(&name, problems.join("\n"))
    }
}

/// Every commit's timeline ends in a final state: the last one that compiles deployed, the
/// broken ones failed, the others superseded, deployed, or taken over by a newer release
/// (or, with manual releases, left waiting for an approval that a newer version got).
async fn timelines(api: &Api, f: &Follow, pushed: &[Pushed]) -> Check {
    let last = last_good(pushed).map(|p| p.sha.clone());
    let mut unseen = 0;
    let mut by_state: std::collections::BTreeMap<String, u32> = Default::default();
    let mut bad = Vec::new();
    for p in pushed {
        let is_last = Some(&p.sha) == last.as_ref();
        match api.req(api.c.commit_timeline(&f.env, &p.sha)).await {
            Ok(t) => {
                let state = t["state"].as_str().unwrap_or("?").to_string();
                *by_state.entry(state.clone()).or_default() += 1;
                let ok = if is_last {
                    state == "deployed"
                } else if p.broken {
                    state == "compile_failed" || state == "superseded"
                } else {
                    TERMINAL.contains(&state.as_str())
                        || (f.manual && state == "waiting_for_approval")
                };
                if !ok {
                    // what the compile queue says of it
                    let compiles = match api.req(api.c.compiles(&f.env, 1000)).await {
                        Ok(list) => list
                            .as_array()
                            .map(|l| {
                                l.iter()
                                    .filter(|c| c["commit"] == p.sha.as_str())
                                    .map(|c| {
                                        format!(
                                            "{} ({})",
                                            c["status"].as_str().unwrap_or("?"),
                                            c["error"].as_str().unwrap_or("")
                                        )
                                    })
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            })
                            .unwrap_or_default(),
                        Err(e) => e,
                    };
                    bad.push(format!(
                        "round {} ({}){}: stuck at '{state}'; its compiles: {compiles}",
                        p.round,
                        &p.sha[..10],
                        if is_last {
                            ", the last that compiles"
                        } else {
                            ""
                        }
                    ));
                }
            }
            // pushed while the server was down or between two fetches: never seen, the
            // server follows the branch tip
            Err(e) if e.contains("HTTP 404") && !is_last => unseen += 1,
            Err(e) => bad.push(format!("round {} ({}): {e}", p.round, &p.sha[..10])),
        }
    }
    let states = by_state
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let summary = format!(
        "{} commits: {states}; {unseen} never seen (pushed between fetches)",
        pushed.len()
    );
    let name = format!("timelines: {}", f.name);
    if bad.is_empty() {
        Check::pass(&name, summary)
    } else {
        bad.insert(0, summary);
        Check::fail(&name, bad.join("\n"))
    }
}

/// The fault environments: everything deployed but the failing file or the hanging command.
async fn faults_converged(run: &Run) -> Check {
    let api = &run.api;
    let mut problems = Vec::new();
    let mut details = Vec::new();
    for (name, env) in [("failing", &run.failing_env), ("hanging", &run.hanging_env)] {
        match api.req(api.c.resources(env)).await {
            Ok((Some(v), _)) => match api.req(api.c.progress(env, v)).await {
                Ok(p) => {
                    let deployed = p["by_status"]["deployed"].as_i64().unwrap_or(0);
                    let total = p["total"].as_i64().unwrap_or(-1);
                    details.push(format!("{name} version {v}: {}", p["by_status"]));
                    if deployed != total - 1 {
                        problems.push(format!(
                            "{name} version {v}: {deployed} of {total} deployed, expected {} ({})",
                            total - 1,
                            p["by_status"]
                        ));
                    }
                }
                Err(e) => problems.push(format!("{name} progress: {e}")),
            },
            Ok((None, _)) => problems.push(format!("{name} has no active version")),
            Err(e) => problems.push(format!("{name} resources: {e}")),
        }
    }
    if problems.is_empty() {
        Check::pass("converged: faults", details.join("; "))
    } else {
        Check::fail("converged: faults", problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule() {
        // 2, 4, 8, 16, 16 …: attempts at 0, 2, 6, 14, 30, 46
        assert_eq!(attempts_allowed(0.0), 1);
        assert_eq!(attempts_allowed(5.9), 2);
        assert_eq!(attempts_allowed(6.0), 3);
        assert_eq!(attempts_allowed(46.0), 6);
    }
}
