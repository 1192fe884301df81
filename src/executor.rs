//! Executors: the processes that run handlers (`steward executor`).
//!
//! The scheduler starts them and talks JSON lines over stdin/stdout ([`protocol`]): a work
//! item in, a result out, one at a time. A handler that panics fails its action and the
//! executor goes on; one that hangs is the scheduler's to kill (a process can be killed, a
//! thread cannot), so a hung or crashed handler never takes the server down. The executor
//! keeps its [`cache`] across actions.

pub mod cache;
pub mod context;
pub mod external;
pub mod handler;
pub mod handlers;
pub mod inmanta;
pub mod limits;
pub mod protocol;

use std::io::Write;
use std::panic::AssertUnwindSafe;

use chrono::Utc;

use cache::Cache;
use context::Context;
use protocol::{ActionKind, Outcome, Reply, Request, WorkItem, WorkResult};

/// Variables a process started for model-controlled code (executors, the handlers they run,
/// the commands of `exec::Run`, compiles) may see: enough to find programs and speak a
/// locale, and nothing of the server's own (tokens, database URL, secrets). Everything else
/// a handler needs comes through the protocol, never through the environment.
pub const PASSED_ENVIRONMENT: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "USER",
    "LOGNAME",
    "TMPDIR",
    "STEWARD_PYTHON",
    // pip, for the Python requirements of Inmanta modules' handlers
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_CACHE_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// The minimal environment of [`PASSED_ENVIRONMENT`], as this process has it.
pub fn passed_environment() -> Vec<(String, std::ffi::OsString)> {
    PASSED_ENVIRONMENT
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (k.to_string(), v)))
        .collect()
}

/// Where a resource is meant to run when that is not here: its route from the export, or,
/// for a `std::AgentConfig`, its own remote URI (it would start an agent elsewhere).
fn remote_target(item: &WorkItem) -> Option<String> {
    let a = &item.resource.attributes;
    if let Some(t) = a
        .get(crate::model::ROUTE_ATTRIBUTE)
        .and_then(|v| v.as_str())
    {
        return Some(t.to_string());
    }
    if item.resource.type_name == "std::AgentConfig" {
        let uri = a.get("uri").and_then(|v| v.as_str()).unwrap_or("local:");
        return (!uri.starts_with("local:")).then(|| uri.to_string());
    }
    None
}

/// Run one work item: with the module's handler process when it ships one, else with the
/// built-in handler of its type.
pub fn execute(
    cache: &mut Cache,
    external: &mut external::ExternalPool,
    item: &WorkItem,
) -> WorkResult {
    let started_at = Utc::now();
    cache.tick(item.version);
    let dry_run = item.kind == ActionKind::Dryrun;
    let mut ctx = Context::new(
        &item.resource.id.0,
        dry_run,
        item.reload,
        item.version,
        cache,
    );
    // an action of a newer version: older ones are done here (what the scheduler says
    // explicitly to its own executors, an agent process's executors learn this way)
    external.newer_version(item.version);
    let builtin = handlers::builtin(&item.resource.type_name);
    let remote = remote_target(item).filter(|_| !item.at_target);
    let outcome = match (&item.handler, builtin) {
        // meant for another machine: never done here
        _ if remote.is_some() => {
            let target = remote.unwrap_or_default();
            ctx.error(
                format!(
                    "this resource is meant for {target} (routed there by the model: a mitogen context or the agent's std::AgentConfig); remote execution is not available yet, so it is not applied on this machine"
                ),
                &[("remote_target", serde_json::json!(target))],
            );
            Outcome::Unavailable
        }
        (Some(h), _) => external.execute(&mut ctx, item, h),
        (None, None) => {
            ctx.error(
                format!("no handler for resource type {}", item.resource.type_name),
                &[("type", serde_json::json!(item.resource.type_name))],
            );
            Outcome::Unavailable
        }
        (None, Some(h)) => match std::panic::catch_unwind(AssertUnwindSafe(|| {
            h.execute(&mut ctx, &item.resource.attributes)
        })) {
            Ok(o) => o,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "handler panicked".into());
                ctx.error(format!("handler crashed: {msg}"), &[]);
                Outcome::Failed
            }
        },
    };
    let (messages, changes, change) = ctx.into_parts();
    WorkResult {
        action_id: item.action_id,
        outcome,
        change,
        changes,
        messages,
        started_at,
        finished_at: Utc::now(),
        state: None,
    }
}

/// `steward executor`: serve work items on stdin until it closes.
pub fn main_loop() -> std::io::Result<()> {
    // a panic message would otherwise go to stderr in the middle of our protocol logs
    std::panic::set_hook(Box::new(|_| {}));
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut cache = Cache::default();
    let mut external = external::ExternalPool::default();
    writeln!(
        out,
        "{}",
        serde_json::to_string(&Reply::Ready {
            pid: std::process::id()
        })
        .expect("json")
    )?;
    out.flush()?;
    let mut input = stdin.lock();
    loop {
        let line = match limits::read_line_bounded(&mut input, limits::MAX_WORK_LINE)? {
            limits::Line::End => break,
            limits::Line::Text(line) => line,
            limits::Line::TooLong(n) => {
                eprintln!("executor: a request line of {n} bytes is over the limit; ignored");
                continue;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("executor: bad request line: {e}");
                continue;
            }
        };
        match req {
            Request::Shutdown => break,
            Request::VersionDone { version } => {
                external.version_done(version);
            }
            Request::Work(item) => {
                let mut result = execute(&mut cache, &mut external, &item);
                // what goes back is bounded here already: the server bounds it again
                result.sanitize();
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&Reply::Result(Box::new(result))).expect("json")
                )?;
                out.flush()?;
            }
        }
    }
    external.shutdown();
    cache.clear();
    Ok(())
}
