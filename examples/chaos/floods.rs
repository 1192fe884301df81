//! The floods of issue 28 in the harness: an environment whose module handler logs a huge
//! value and thousands of records at every repair (every few seconds), an agent process that
//! keeps opening sessions naming a thousand agents nobody deploys to (and one of 50,000 now
//! and then, which must be refused), and the checks that none of it cost the server its
//! memory, its database or another environment's lease.

use std::path::Path;

use chrono::{DateTime, Utc};

use super::checks::Check;
use super::{Api, Run};

/// What the flooding handler logs at every run, besides 20,000 small records.
pub const FLOOD_BYTES: usize = 50_000_000;
/// How often the flood environment repairs (and so floods), seconds.
pub const FLOOD_REPAIR_SECS: u64 = 5;
/// Agents named by each session of the agent flood.
pub const SESSION_AGENTS: usize = 1000;

/// The flooding project under `flood/` of the faults repository: its files (path, text).
pub fn flood_project() -> Vec<(&'static str, String)> {
    vec![
        (
            "flood/libs/flood/module.yml",
            "name: flood\nversion: 1.0.0\n".into(),
        ),
        (
            "flood/libs/flood/model/_init.cf",
            "entity Blob extends std::PurgeableResource:\n    string name\n    int size\nend\n\
             Blob.host [1] -- std::Host\nimplement Blob using std::none\n"
                .into(),
        ),
        (
            "flood/libs/flood/plugins/__init__.py",
            r#"from inmanta.agent.handler import CRUDHandler, provider
from inmanta.resources import PurgeableResource, resource


@resource("flood::Blob", agent="host.name", id_attribute="name")
class Blob(PurgeableResource):
    fields = ("name", "size")


@provider("flood::Blob", name="blob")
class BlobHandler(CRUDHandler):
    def read_resource(self, ctx, resource):
        ctx.info("%(blob)s", blob="x" * resource.size)
        for i in range(20000):
            ctx.debug("line %(i)s", i=i, pad="p" * 100)

    def create_resource(self, ctx, resource):
        ctx.set_created()
"#
            .into(),
        ),
        (
            "flood/main.cf",
            format!(
                "import flood\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
                 flood::Blob(host=host, name=\"blob\", size={FLOOD_BYTES})\n"
            ),
        ),
        (
            "flood/project.yml",
            "name: flood\nmodulepath: libs\n".into(),
        ),
    ]
}

/// Write `files` under `work` (a repository's working clone).
pub fn write_files(work: &Path, files: &[(&str, String)]) -> Result<(), String> {
    for (path, text) in files {
        let p = work.join(path);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

/// An agent process that names agents nobody deploys to.
#[derive(Default)]
pub struct AgentFlood {
    pub env: String,
    pub sessions: u32,
    pub refused_huge: u32,
    pub failed: u32,
    pub round: u64,
}

impl AgentFlood {
    /// One session: open with [`SESSION_AGENTS`] fresh names, poll, close; every fourth
    /// round also a session of 50,000 names, which must be refused with 422.
    pub async fn step(&mut self, api: &Api) {
        self.round += 1;
        let hello = |n: usize, round: u64| steward::scheduler::agents::Hello {
            instance: uuid::Uuid::new_v4(),
            agents: (0..n).map(|i| format!("flood-{round}-{i}")).collect(),
            host: "chaos".into(),
            version: "chaos".into(),
        };
        if self.round.is_multiple_of(4) {
            match api
                .c
                .agent_open(&self.env, &hello(50_000, self.round))
                .await
            {
                Err(e) if e.status() == Some(422) => self.refused_huge += 1,
                // the server may be down right now: not a refusal, not a failure
                Err(e) if e.status().is_none() => {}
                _ => self.failed += 1,
            }
        }
        let h = hello(SESSION_AGENTS, self.round);
        let instance = h.instance;
        if api.req(api.c.agent_open(&self.env, &h)).await.is_ok() {
            let poll = steward::scheduler::agents::Poll::default();
            let _ = api.req(api.c.agent_poll(&self.env, instance, &poll)).await;
            let _ = api.req(api.c.agent_close(&self.env, instance)).await;
            self.sessions += 1;
        }
    }
}

/// The checks of the floods, from the database and the server's log.
pub async fn checks(
    run: &Run,
    flood_env: &str,
    agents: &AgentFlood,
    db_faults_at: &[DateTime<Utc>],
    db: &mut sqlx::PgConnection,
) -> Vec<Check> {
    let mut out = Vec::new();
    // the flooding handler's actions: recorded, each cut to its limits
    let flood: Result<(i64, Option<i64>, Option<i32>), _> = sqlx::query_as(
        "SELECT count(*), max(length(messages::text))::bigint, max(jsonb_array_length(messages)) \
         FROM resource_actions WHERE environment_id = $1::uuid AND finished_at IS NOT NULL",
    )
    .bind(flood_env)
    .fetch_one(&mut *db)
    .await;
    out.push(match flood {
        Ok((n, Some(bytes), records)) if n > 0 && bytes <= (1 << 20) + (64 << 10) => Check::pass(
            "flooding handler",
            format!(
                "{n} actions of a handler logging {} MB and 20,000 records each time: at most {:.2} MiB and {} records kept per action",
                FLOOD_BYTES / 1_000_000,
                bytes as f64 / 1048576.0,
                records.unwrap_or(0)
            ),
        ),
        Ok((n, bytes, _)) => Check::fail(
            "flooding handler",
            format!("{n} actions, the largest log {bytes:?} bytes (limit 1 MiB)"),
        ),
        Err(e) => Check::fail("flooding handler", e.to_string()),
    });
    // the agent flood: sessions worked, the huge one was refused, no lease row is left of
    // agents nobody deploys to
    let rows: Result<i64, _> =
        sqlx::query_scalar("SELECT count(*) FROM leases WHERE kind = 'agent' AND key LIKE $1")
            .bind(format!("{}/flood-%", agents.env))
            .fetch_one(&mut *db)
            .await;
    out.push(match rows {
        Ok(rows)
            if agents.failed == 0
                && agents.sessions > 0
                && rows <= SESSION_AGENTS as i64 * (1 + run.server.starts as i64) =>
        {
            Check::pass(
                "agent sessions",
                format!(
                    "{} sessions of {SESSION_AGENTS} agents nobody deploys to, {} of 50,000 refused; {rows} lease rows left of them (sessions a kill cut off leave theirs until retention)",
                    agents.sessions, agents.refused_huge
                ),
            )
        }
        Ok(rows) => Check::fail(
            "agent sessions",
            format!(
                "{} sessions, {} huge ones refused, {} answered otherwise; {rows} lease rows left",
                agents.sessions, agents.refused_huge, agents.failed
            ),
        ),
        Err(e) => Check::fail("agent sessions", e.to_string()),
    });
    // no lease lost by an environment that was not faulted itself, outside database outages
    let log = std::fs::read_to_string(&run.server.log).unwrap_or_default();
    let calm: Vec<&str> = run.follows.iter().map(|f| f.env.as_str()).collect();
    let mut lost = Vec::new();
    for line in log
        .lines()
        .filter(|l| l.contains("lease of environment lost"))
    {
        let Some(env) = calm.iter().find(|e| line.contains(*e)) else {
            continue;
        };
        let at = line
            .split_whitespace()
            .next()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc));
        let in_outage = at.is_some_and(|t| {
            db_faults_at
                .iter()
                .any(|f| t >= *f && (t - *f).num_seconds() <= 30)
        });
        if !in_outage {
            lost.push(format!("{env}: {line}"));
        }
    }
    out.push(if lost.is_empty() {
        Check::pass(
            "leases kept",
            format!(
                "no environment that was not faulted lost its lease outside the {} database outages",
                db_faults_at.len()
            ),
        )
    } else {
        Check::fail("leases kept", lost.join("\n"))
    });
    out
}
