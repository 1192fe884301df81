//! Facts benchmark (issue 29): `cargo run --release --example bench_facts [-- ROUNDS]`
//!
//! 1. **set_fact → next version released.** A private PostgreSQL cluster and a server
//!    following a bare git repository (auto-release on, the default `recompile_backoff` of
//!    0.1 s). The project has a project-local module `vm` whose `@provider` CRUD handler
//!    makes a file standing for a VM and reports `ip_address` with `ctx.set_fact`, writing the
//!    `time.time()` of that call to a journal file. The model has 1,000 `fs::File`s; each
//!    round (20 by default) adds `vm::Host` `vm{i}` and a file whose content is
//!    `std::getfact(vm{i}, "ip_address")`, commits, pushes and triggers a compile. The VM
//!    deploys, its fact arrives, the same commit is compiled again (`trigger: fact`), and
//!    that version is released: latency = its `released_at` minus the journal's time (and
//!    the moment this program, polling every 5 ms, saw it released).
//! 2. **The cost of 5,000 facts in one compile.** 5,000 facts stored in an environment
//!    through the REST API; read back with the one list query the server makes for a
//!    compile (`store::facts::list`, timed) and written as the server writes its `--facts`
//!    file; a model of 5,000 `std::testing::NullResource`s and 5,000 files each taking
//!    `std::getfact` of one of them, compiled with `steward compile --facts FILE` (a child
//!    process, as the server runs it), against the same model with the values written in.
//!
//! This program is also its own compiler and executor (`bench_facts compile|executor …` runs
//! steward's command line), so the benchmark needs no other binary built.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "common/mod.rs"]
mod common;

use serde_json::json;
use steward::client::Client;
use steward::store::facts::ParameterItem;

/// Files in the model besides the VMs and the files that wait for their addresses.
const FILES: usize = 1000;
/// Resources asking for a fact in part 2.
const FACTS: usize = 5000;
/// Compiles per variant in part 2 (the median is shown).
const RUNS: usize = 5;

const VM_CF: &str = r#"
entity Host extends std::PurgeableResource:
    """A machine the module makes (a file here), which learns its address when made."""
    string name
    string path
end

Host.host [1] -- std::Host

implement Host using std::none
"#;

const VM_PY: &str = r#"
import os
import time

from inmanta.agent.handler import CRUDHandler, HandlerContext, ResourcePurged, provider
from inmanta.resources import PurgeableResource, resource


def address(name: str) -> str:
    n = int(name[2:])
    return "10.0.%d.%d" % (n // 250, n % 250 + 1)


@resource("vm::Host", agent="host.name", id_attribute="name")
class Host(PurgeableResource):
    fields = ("name", "path")


@provider("vm::Host", name="vm")
class HostHandler(CRUDHandler[Host]):
    def read_resource(self, ctx: HandlerContext, resource: Host) -> None:
        if not os.path.exists(resource.path):
            raise ResourcePurged()

    def create_resource(self, ctx: HandlerContext, resource: Host) -> None:
        ip = address(resource.name)
        with open(resource.path, "w") as f:
            f.write(ip + "\n")
        ctx.set_created()
        # the journal: when the handler reported what the made thing learned
        t = time.time()
        ctx.set_fact("ip_address", ip)
        with open(resource.path + ".set_fact", "w") as f:
            f.write(repr(t))

    def update_resource(self, ctx: HandlerContext, changes: dict, resource: Host) -> None:
        ctx.set_updated()

    def delete_resource(self, ctx: HandlerContext, resource: Host) -> None:
        os.remove(resource.path)
        ctx.set_purged()

    def facts(self, ctx: HandlerContext, resource: Host) -> dict:
        with open(resource.path) as f:
            return {"ip_address": f.read().strip()}
"#;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.com")
        .env("GIT_COMMITTER_NAME", "Bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.com")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The address the handler gives VM `i` (as `address()` in the module).
fn address(i: usize) -> String {
    format!("10.0.{}.{}", i / 250, i % 250 + 1)
}

/// The model of round `vms`: the files, and VMs 1..=vms each with a file naming its address.
fn model(out: &Path, vms: usize) -> String {
    let out = out.display();
    let mut m = String::from(
        "import vm\nimport fs\n\nhost = std::Host(name=\"localhost\", os=std::linux)\n",
    );
    for i in 0..FILES {
        m.push_str(&format!(
            "fs::File(host=host, path=\"{out}/f{i:04}\", content=\"file {i}\", mode=644)\n"
        ));
    }
    for i in 1..=vms {
        m.push_str(&format!(
            "vm{i} = vm::Host(host=host, name=\"vm{i}\", path=\"{out}/vm{i}\")\n\
             ip{i} = std::getfact(vm{i}, \"ip_address\")\n\
             fs::File(host=host, path=\"{out}/web{i}.conf\", content=\"backend {{{{ip{i}}}}}\\n\", mode=644)\n"
        ));
    }
    m
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}

/// Nearest-rank percentile.
fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1]
}

async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One round's figures, in seconds.
struct Round {
    /// set_fact → the fact stored (its `updated`).
    stored: f64,
    /// set_fact → the version's `released_at`.
    released: f64,
    /// set_fact → this program saw the version released.
    seen: f64,
}

/// Part 1: `rounds` rounds of set_fact → released, on a 1,000-resource model.
async fn latency(c: &Client, pool: &sqlx::PgPool, dir: &Path, rounds: usize) -> Vec<Round> {
    let origin = dir.join("origin.git");
    let work = dir.join("work");
    let out = dir.join("files");
    std::fs::create_dir(&out).unwrap();
    git(
        dir,
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
        dir,
        &[
            "clone",
            "-q",
            origin.to_str().unwrap(),
            work.to_str().unwrap(),
        ],
    );
    git(&work, &["checkout", "-q", "-b", "main"]);
    let lib = work.join("libs/vm");
    std::fs::create_dir_all(lib.join("model")).unwrap();
    std::fs::create_dir_all(lib.join("plugins")).unwrap();
    std::fs::write(lib.join("module.yml"), "name: vm\nversion: 1.0.0\n").unwrap();
    std::fs::write(lib.join("model/_init.cf"), VM_CF).unwrap();
    std::fs::write(lib.join("plugins/__init__.py"), VM_PY).unwrap();
    std::fs::write(work.join("project.yml"), "name: bench\nmodulepath: libs\n").unwrap();
    std::fs::write(work.join("main.cf"), model(&out, 0)).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "initial"]);
    git(&work, &["push", "-q", "origin", "main"]);

    // the defaults: auto_release on, recompile_backoff 0.1 s
    let env = c
        .create_environment("bench", "facts", None)
        .await
        .unwrap()
        .id
        .to_string();
    let env_id: uuid::Uuid = env.parse().unwrap();
    let settings = steward::store::environments::get_environment(pool, env_id)
        .await
        .unwrap()
        .settings;
    assert!(settings.auto_release);
    println!(
        "environment settings: auto_release {}, recompile_backoff {} s",
        settings.auto_release, settings.recompile_backoff
    );
    // the files are the environment's to write (its executor's uid when we run as root)
    if let Some(id) = steward::sandbox::identity(env_id, steward::sandbox::Role::Executor).unwrap()
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        std::os::unix::fs::chown(&out, Some(id.uid), Some(id.gid)).unwrap();
    }
    c.set_source(
        &env,
        &json!({"url": format!("file://{}", origin.display()), "branch": "main",
        "webhook_secret": "bench-secret", "poll_interval": 0, "watch": false}),
    )
    .await
    .unwrap();

    let start = Instant::now();
    let last = out.join(format!("f{:04}", FILES - 1));
    let want = format!("file {}", FILES - 1);
    wait_for(180, "the first version deployed", || {
        let ok = std::fs::read_to_string(&last).ok().as_deref() == Some(want.as_str());
        async move { ok.then_some(()) }
    })
    .await;
    println!(
        "first version of {FILES} files compiled and deployed in {:.2} s",
        start.elapsed().as_secs_f64()
    );

    let mut figures = Vec::new();
    for i in 1..=rounds {
        std::fs::write(work.join("main.cf"), model(&out, i)).unwrap();
        git(
            &work,
            &["commit", "-q", "-am", &format!("round {i}: vm{i}")],
        );
        let commit = git(&work, &["rev-parse", "HEAD"]);
        git(&work, &["push", "-q", "origin", "main"]);
        let pushed = Instant::now();
        c.trigger_compile(&env, None).await.unwrap();

        // the version compiled again for vm{i}'s fact, released
        let version = wait_for(
            120,
            &format!("round {i}'s fact version released"),
            || async {
                let list = steward::store::versions::list(pool, env_id, 4, None)
                    .await
                    .ok()?;
                list.into_iter().find(|v| {
                    v.status == "released"
                        && v.provenance["trigger"] == "fact"
                        && v.provenance["commit"] == commit.as_str()
                })
            },
        )
        .await;
        let seen = epoch(SystemTime::now());
        let journal = std::fs::read_to_string(out.join(format!("vm{i}.set_fact")))
            .expect("the handler's journal");
        let t_fact: f64 = journal.trim().parse().expect("a time in the journal");
        let released_at = version.released_at.expect("released");
        let released = released_at.timestamp_micros() as f64 / 1e6 - t_fact;
        let rid = format!("vm::Host[localhost,name=vm{i}]");
        let fact = steward::store::facts::get(pool, env_id, &rid, "ip_address")
            .await
            .unwrap()
            .expect("the fact stored");
        assert_eq!(fact.value, address(i));
        let stored = fact.updated.timestamp_micros() as f64 / 1e6 - t_fact;
        // the version holds the file with the value
        let resources = c.version_resources(&env, version.number).await.unwrap();
        let web = resources
            .iter()
            .find(|r| r.resource_id.ends_with(&format!("/web{i}.conf]")))
            .expect("the file in the version");
        assert!(!web.undefined, "{web:?}");
        assert_eq!(
            web.attributes["content"],
            format!("backend {}\n", address(i)),
        );
        // where the time went: the fact compile's stages
        let list = c.compiles(&env, 5).await.unwrap();
        let stages = list
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["trigger"] == "fact" && r["commit"] == commit.as_str())
            .map(|r| r["id"].as_str().unwrap().to_string());
        let stages = match stages {
            Some(id) => {
                let report = c.compile_report(&env, &id).await.unwrap();
                report["stages"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|s| format!("{} {}", s["name"].as_str().unwrap_or("?"), s["ms"]))
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default()
            }
            None => String::from("?"),
        };
        println!(
            "round {i:2}: v{} ({} resources): set_fact -> stored {:4.0} ms, released {:4.0} ms, seen {:4.0} ms; compile stages (ms): {stages}",
            version.number,
            version.resource_count,
            stored * 1000.0,
            released * 1000.0,
            (seen - t_fact) * 1000.0
        );
        figures.push(Round {
            stored,
            released,
            seen: seen - t_fact,
        });
        // the file deployed before the next round, and pushes spaced as people make them
        // (a source takes at most one hinted fetch a second)
        let target = out.join(format!("web{i}.conf"));
        let want = format!("backend {}\n", address(i));
        wait_for(120, &format!("web{i}.conf deployed"), || {
            let ok = std::fs::read_to_string(&target).ok().as_deref() == Some(want.as_str());
            async move { ok.then_some(()) }
        })
        .await;
        let spent = pushed.elapsed();
        if spent < Duration::from_millis(1100) {
            tokio::time::sleep(Duration::from_millis(1100) - spent).await;
        }
    }
    figures
}

/// Part 2's figures, in seconds.
struct Cost {
    list: f64,
    rows: usize,
    with_getfact: f64,
    plain_with_file: f64,
    plain: f64,
}

/// Compile `project` RUNS times as the server does (a child process): the median.
fn compile_median(me: &Path, project: &Path, facts: Option<&Path>, check: &str) -> f64 {
    let export = project.join("export.json");
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let mut cmd = Command::new(me);
        cmd.arg("compile")
            .arg("--json")
            .arg("--export")
            .arg(&export);
        if let Some(f) = facts {
            cmd.arg("--facts").arg(f);
        }
        cmd.arg("-p").arg(project);
        let start = Instant::now();
        let out = cmd.output().expect("compile");
        times.push(start.elapsed().as_secs_f64());
        assert!(
            out.status.success(),
            "compile of {}: {}",
            project.display(),
            String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(2000)])
        );
    }
    // every file has its value (none undefined)
    let text = std::fs::read_to_string(&export).unwrap();
    assert!(text.contains(check), "{check} not in the export");
    median(&times)
}

/// Part 2: 5,000 facts in one compile.
async fn facts_cost(c: &Client, pool: &sqlx::PgPool, dir: &Path, me: &Path) -> Cost {
    let env = c
        .create_environment("bench", "facts-cost", None)
        .await
        .unwrap()
        .id
        .to_string();
    let env_id: uuid::Uuid = env.parse().unwrap();
    let rid = |i: usize| format!("std::testing::NullResource[bench,name=n{i}]");
    let value = |i: usize| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
    let items: Vec<ParameterItem> = (0..FACTS)
        .map(|i| ParameterItem {
            name: "ip".into(),
            resource_id: rid(i),
            value: value(i),
            source: Some("fact".into()),
            ..Default::default()
        })
        .collect();
    let start = Instant::now();
    for batch in items.chunks(steward::store::facts::MAX_ITEMS) {
        c.set_parameters(&env, batch, false).await.unwrap();
    }
    println!(
        "{FACTS} facts stored through the REST API ({} batches) in {:.0} ms",
        FACTS.div_ceil(steward::store::facts::MAX_ITEMS),
        start.elapsed().as_secs_f64() * 1000.0
    );

    // what the server does before a compile: one list query, written as the --facts file
    let mut lists = Vec::new();
    let mut rows = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        rows = steward::store::facts::list(pool, env_id, None)
            .await
            .unwrap();
        lists.push(start.elapsed().as_secs_f64());
    }
    let mut facts = steward::model::facts::Facts::new();
    for r in &rows {
        facts.insert(r.resource_id.clone(), r.name.clone(), r.value.clone());
    }
    let facts_file = dir.join("facts.json");
    std::fs::write(&facts_file, facts.to_json()).unwrap();

    let out = dir.join("cost-files");
    let project = |name: &str, getfact: bool| {
        let p = dir.join(name);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("project.yml"), format!("name: {name}\n")).unwrap();
        let mut m = String::from(
            "import fs\nimport std::testing\n\nhost = std::Host(name=\"localhost\", os=std::linux)\n",
        );
        for i in 0..FACTS {
            let content = if getfact {
                format!("std::getfact(n{i}, \"ip\")")
            } else {
                format!("\"{}\"", value(i))
            };
            m.push_str(&format!(
                "n{i} = std::testing::NullResource(name=\"n{i}\", agentname=\"bench\")\n\
                 fs::File(host=host, path=\"{}/g{i}\", content={content}, mode=644)\n",
                out.display()
            ));
        }
        std::fs::write(p.join("main.cf"), m).unwrap();
        p
    };
    let with = project("with_getfact", true);
    let plain = project("plain", false);
    let check = format!("\"{}\"", value(FACTS - 1));
    let with_getfact = compile_median(me, &with, Some(&facts_file), &check);
    let plain_with_file = compile_median(me, &plain, Some(&facts_file), &check);
    let plain_t = compile_median(me, &plain, None, &check);
    Cost {
        list: median(&lists),
        rows: rows.len(),
        with_getfact,
        plain_with_file,
        plain: plain_t,
    }
}

async fn run(rounds: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (cluster, pool) = common::database(tmp.path(), 16).await;
    let me = std::env::current_exe().expect("own path");
    let mut state = steward::server::start::app_state_with_schedulers(
        pool.clone(),
        true,
        me.clone(),
        tmp.path(),
    )
    .await;
    steward::server::start::enable_git(&mut state, tmp.path().join("server"), me.clone()).await;
    // the benchmark's repository is local (file://)
    state.allow_local_git_sources = true;
    if let Some(g) = &state.sources {
        g.set_allow_local(true);
    }
    let url = common::serve(state).await;
    let c = Client::new(&url, None);

    let figures = latency(&c, &pool, tmp.path(), rounds).await;
    let cost = facts_cost(&c, &pool, tmp.path(), &me).await;

    let ms = |s: f64| format!("{:.0} ms", s * 1000.0);
    let col = |f: fn(&Round) -> f64| figures.iter().map(f).collect::<Vec<f64>>();
    let (stored, released, seen) = (col(|r| r.stored), col(|r| r.released), col(|r| r.seen));
    println!("---");
    println!(
        "set_fact -> next version released, {FILES}-resource model, {rounds} rounds (target p95 < 1 s):"
    );
    println!("  {:<44} {:>8} {:>8} {:>8}", "", "median", "p95", "max");
    for (name, v) in [
        ("set_fact -> fact stored", &stored),
        ("set_fact -> version released_at", &released),
        ("set_fact -> seen released (5 ms polling)", &seen),
    ] {
        println!(
            "  {name:<44} {:>8} {:>8} {:>8}",
            ms(median(v)),
            ms(pct(v, 0.95)),
            ms(pct(v, 1.0))
        );
    }
    println!(
        "cost of {FACTS} facts in one compile ({} resources, median of {RUNS}, `steward compile --facts`):",
        2 * FACTS
    );
    println!(
        "  {:<44} {:>8.1} ms ({} rows, one query)",
        "store::facts::list (the server's read)",
        cost.list * 1000.0,
        cost.rows
    );
    println!(
        "  {:<44} {:>8}",
        "model with 5,000 std::getfact",
        ms(cost.with_getfact)
    );
    println!(
        "  {:<44} {:>8}",
        "values written in, same --facts file",
        ms(cost.plain_with_file)
    );
    println!(
        "  {:<44} {:>8}",
        "values written in, no --facts file",
        ms(cost.plain)
    );
    println!(
        "  {:<44} {:>8.1} µs (reading the {}-row file: {:+.0} ms in all)",
        "per getfact call",
        (cost.with_getfact - cost.plain_with_file) / FACTS as f64 * 1e6,
        cost.rows,
        (cost.plain_with_file - cost.plain) * 1000.0
    );
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}

fn main() -> std::process::ExitCode {
    match std::env::args().nth(1).as_deref() {
        // the server runs us as `steward compile …` and `steward executor`
        Some("compile") | Some("executor") => steward::cli::main(),
        other => {
            // the handlers run as the environment's own uid when we are root: an interpreter
            // under root's home (a pyenv shim) is not theirs to run
            if std::env::var_os("STEWARD_PYTHON").is_none()
                && steward::sandbox::is_root()
                && Path::new("/usr/bin/python3").exists()
            {
                // SAFETY: no other thread runs yet
                unsafe { std::env::set_var("STEWARD_PYTHON", "/usr/bin/python3") };
            }
            let rounds = other.and_then(|a| a.parse().ok()).unwrap_or(20);
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(run(rounds));
            std::process::ExitCode::SUCCESS
        }
    }
}
