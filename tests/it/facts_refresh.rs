//! Facts kept fresh (issue 29), with a real Python handler whose `facts()` writes a line to a
//! journal each time the server asks it: facts are renewed once older than `fact_renew`;
//! `expires=false` facts are never asked for again; a fact the model misses is asked for at
//! most once per `fact_resource_block`; a resource that left the model is no longer asked
//! and its fact expires; and thousands of facts due together are asked at no more than each
//! agent's rate, for tens of seconds, without the rows growing.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use steward::model::{ExportFile, Resource, UnknownRecord};

use crate::deploy::deploying_env;
use crate::python_handlers::{inmanta_code, resource, upload, with_code};
use crate::support::wait_deployed;

const PROBE: &str = r#"
import time

from inmanta.agent.handler import CRUDHandler, provider
from inmanta.resources import PurgeableResource, resource


@resource("probe::Box", agent="agent", id_attribute="name")
class Box(PurgeableResource):
    fields = ("name", "agent", "journal", "mode")


def note(resource, what):
    with open(resource.journal, "a") as f:
        f.write(f"{resource.agent} {resource.name} {what} {time.time()}\n")


@provider("probe::Box", name="box")
class BoxHandler(CRUDHandler):
    def read_resource(self, ctx, resource):
        # it exists as it is; what it learned when deployed
        if resource.mode == "pinned":
            ctx.set_fact("seen", "forever", expires=False)
        elif resource.mode != "silent":
            ctx.set_fact("seen", str(time.time()))

    def facts(self, ctx, resource):
        note(resource, "facts")
        if resource.mode == "silent":
            return {}
        return {"seen": str(time.time())}
"#;

fn code() -> (
    steward::model::HandlerCode,
    std::collections::BTreeMap<String, String>,
) {
    inmanta_code(
        "probe",
        &[("inmanta_plugins/probe/__init__.py", PROBE)],
        &["inmanta-module-std"],
        &["inmanta_plugins.probe"],
    )
}

fn probe(agent: &str, name: &str, journal: &Path, mode: &str) -> Resource {
    let mut r = resource(
        "probe::Box",
        "name",
        name,
        json!({"agent": agent, "journal": journal.to_str().unwrap(), "mode": mode}),
        &[],
    );
    r.agent = agent.into();
    r.id = steward::model::ResourceId::new("probe::Box", agent, "name", name);
    r
}

/// (agent, name, seconds since the epoch) of each time the handler was asked for facts.
fn asked(journal: &Path) -> Vec<(String, String, f64)> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 4 && f[2] == "facts")
                .then(|| (f[0].into(), f[1].into(), f[3].parse().unwrap()))
        })
        .collect()
}

fn times_for(journal: &Path, name: &str) -> Vec<f64> {
    asked(journal)
        .into_iter()
        .filter(|(_, n, _)| n == name)
        .map(|(_, _, t)| t)
        .collect()
}

/// The 3 s block is kept when the scheduler sends a request; the journal shows when the
/// handler ran it, which a loaded machine delays by up to a second. So one interval may look
/// as short as 2 s (a late run, then one on time), but lateness does not add up: on average
/// the runs are at least the block apart. Without the block they would come with each scan of
/// the store, a second apart.
fn assert_spaced_by_the_block(times: &[f64], longest: f64, what: &str) {
    for w in times.windows(2) {
        assert!(
            (2.0..longest).contains(&(w[1] - w[0])),
            "{what}: asked within its block or off its schedule: {times:?}"
        );
    }
    if times.len() >= 3 {
        let mean = (times[times.len() - 1] - times[0]) / (times.len() - 1) as f64;
        assert!(
            mean >= 2.8,
            "{what}: asked every {mean:.2} s on average with a 3 s block: {times:?}"
        );
    }
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread")]
async fn facts_are_renewed_missing_ones_throttled_pinned_ones_left_and_removed_ones_dropped() {
    let (srv, c, env, dir) = deploying_env(
        "refresh",
        json!({"fact_expire": 6, "fact_renew": 1, "fact_resource_block": 3}),
    )
    .await;
    let j = dir.path().join("journal");
    let code = code();
    let all = vec![
        probe("a1", "renewed", &j, "normal"),
        probe("a1", "pinned", &j, "pinned"),
        probe("a1", "silent", &j, "silent"),
        probe("a1", "removed", &j, "normal"),
    ];
    let mut x: ExportFile = with_code(all.clone(), &code);
    // the model asked for a fact of `silent` that nobody has: it is asked for
    x.unknowns = vec![UnknownRecord {
        resource_id: "probe::Box[a1,name=silent]".into(),
        name: "ip".into(),
        source: "fact".into(),
    }];
    let v1 = upload(&c, &env, &x).await;
    let p = wait_deployed(&c, &env, v1, 60).await;
    assert_eq!(p["by_status"]["deployed"], 4, "{p}");
    tokio::time::sleep(Duration::from_secs(6)).await;

    // v2 leaves `removed` out (the unknown stays: the model still misses that fact)
    let mut x2 = with_code(all[..3].to_vec(), &code);
    x2.unknowns = x.unknowns.clone();
    let v2 = upload(&c, &env, &x2).await;
    wait_deployed(&c, &env, v2, 60).await;
    // v2 is deployed, so the scheduler works on it
    let removed_at = now_secs();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let end = now_secs();

    // A resource is asked at most once per `fact_resource_block` (3 s) whatever the reason,
    // and the store is looked at each second: a fact older than `fact_renew` (1 s) is asked
    // for every 3 to 4 s (give or take when the handler gets to run it), never sooner, and
    // never so late that it expires (6 s).
    let renewed = times_for(&j, "renewed");
    assert!(
        renewed.len() >= 3,
        "a fact older than fact_renew is renewed: asked {} times in 16 s: {renewed:?}",
        renewed.len()
    );
    assert_spaced_by_the_block(&renewed, 5.9, "renewed");
    assert!(
        end - renewed.last().unwrap() < 5.5,
        "renewal stopped: {renewed:?}, end {end}"
    );
    assert!(
        times_for(&j, "pinned").is_empty(),
        "an expires=false fact was asked for again"
    );
    // asked because the model misses its fact, at most once per block of 3 s
    let silent = times_for(&j, "silent");
    assert!(
        (2..=7).contains(&silent.len()),
        "a missing fact asked {} times in 16 s with a 3 s block: {silent:?}",
        silent.len()
    );
    assert_spaced_by_the_block(&silent, 8.0, "silent");
    // gone from the model: at most a request already under way (sent before v2, run up to
    // a second late), then none
    let after: Vec<f64> = times_for(&j, "removed")
        .into_iter()
        .filter(|t| *t > removed_at + 1.5)
        .collect();
    assert!(
        after.is_empty(),
        "a removed resource was still asked: {after:?} (removed at {removed_at}, end {end})"
    );

    // the facts as the API shows them: renewed ones fresh, the removed one's expired
    let facts = c.list_facts(&env, None).await.unwrap();
    let by: HashMap<&str, &steward::store::facts::Param> =
        facts.iter().map(|f| (f.resource_id.as_str(), f)).collect();
    let fresh = by["probe::Box[a1,name=renewed]"];
    assert!(!fresh.expired, "{fresh:?}");
    let pinned = by["probe::Box[a1,name=pinned]"];
    assert!(!pinned.expires && !pinned.expired, "{pinned:?}");
    let gone = by["probe::Box[a1,name=removed]"];
    assert!(gone.expired, "a fact nobody renews expires: {gone:?}");
    assert!(!by.contains_key("probe::Box[a1,name=silent]"));
    drop(srv);
}

/// 5,000 facts on 4 agents, due together and again and again (renewal after 2 s, expiry
/// after 6 s): for 30 s each agent is asked at most its rate (a burst of 40, then 20 a
/// second, so at most 60 in any second),
/// the asking keeps up with that rate, and the facts stay one row each.
#[tokio::test(flavor = "multi_thread")]
async fn five_thousand_facts_are_renewed_at_each_agents_rate_for_thirty_seconds() {
    const N: usize = 5000;
    const AGENTS: usize = 4;
    const SECS: f64 = 30.0;
    let (srv, c, env, dir) = deploying_env(
        "refresh-soak",
        json!({"fact_expire": 6, "fact_renew": 2, "fact_resource_block": 5}),
    )
    .await;
    let j = dir.path().join("journal");
    let boxes: Vec<Resource> = (0..N)
        .map(|i| probe(&format!("a{}", i % AGENTS), &format!("b{i}"), &j, "normal"))
        .collect();
    let v = upload(&c, &env, &with_code(boxes, &code())).await;
    let p = wait_deployed(&c, &env, v, 300).await;
    assert_eq!(p["by_status"]["deployed"], N as i64, "{p}");
    let env_id: uuid::Uuid = env.parse().unwrap();
    let rows = |sql: &'static str| {
        let pool = srv.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(env_id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let params_sql = "SELECT count(*) FROM parameters WHERE environment_id = $1";
    let actions_sql = "SELECT count(*) FROM resource_actions WHERE environment_id = $1";
    assert_eq!(rows(params_sql).await, N as i64);
    let actions_before = rows(actions_sql).await;

    let start = now_secs();
    let started = Instant::now();
    let mut max_params = 0;
    while started.elapsed().as_secs_f64() < SECS {
        tokio::time::sleep(Duration::from_secs(3)).await;
        max_params = max_params.max(rows(params_sql).await);
    }
    let end = now_secs();
    let calls: Vec<(String, String, f64)> = asked(&j)
        .into_iter()
        .filter(|(_, _, t)| *t >= start && *t <= end)
        .collect();
    let mut per_agent: HashMap<String, Vec<f64>> = HashMap::new();
    for (a, _, t) in &calls {
        per_agent.entry(a.clone()).or_default().push(*t);
    }
    let span = end - start;
    let mut report = Vec::new();
    for a in 0..AGENTS {
        let times = per_agent.remove(&format!("a{a}")).unwrap_or_default();
        // at most the burst plus the rate over the span (and a second of slack for
        // requests already queued when the window opened)
        let most = 40.0 + 20.0 * (span + 1.0);
        assert!(
            (times.len() as f64) <= most,
            "agent a{a} was asked {} times in {span:.0} s (at most {most:.0})",
            times.len()
        );
        // the busiest second: the burst and a second's rate at most
        let mut sorted = times.clone();
        sorted.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let busiest = sorted
            .iter()
            .enumerate()
            .map(|(i, t)| sorted[i..].iter().take_while(|u| **u < t + 1.0).count())
            .max()
            .unwrap_or(0);
        // (an agent has at most 20 requests waiting: a second can hold those late ones, the
        // burst and the second's rate)
        assert!(
            busiest <= 60,
            "agent a{a}: {busiest} requests within one second"
        );
        // and it keeps up: 5,000 due facts are a backlog the whole time
        assert!(
            times.len() as f64 >= 0.6 * 20.0 * span,
            "agent a{a} was asked only {} times in {span:.0} s",
            times.len()
        );
        report.push(format!("a{a}: {} (busiest second {busiest})", times.len()));
    }
    eprintln!("requests in {span:.0} s: {}", report.join(", "));
    assert_eq!(max_params, N as i64, "fact rows grew");
    assert_eq!(rows(params_sql).await, N as i64);
    assert_eq!(
        rows(actions_sql).await,
        actions_before,
        "fact refreshes that succeed leave no action rows"
    );
}
