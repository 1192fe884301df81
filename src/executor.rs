//! Executors: the processes that run handlers (`steward executor`).
//!
//! The scheduler starts them and talks JSON lines over stdin/stdout ([`protocol`]): a work
//! item in, a result out, one at a time. A handler that panics fails its action and the
//! executor goes on; one that hangs is the scheduler's to kill (a process can be killed, a
//! thread cannot), so a hung or crashed handler never takes the server down. The executor
//! keeps its [`cache`] across actions.

pub mod cache;
pub mod calls;
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
    // what external agents and SSH targets keep of shipped code and handler environments
    "STEWARD_CACHE_GRACE",
    "STEWARD_CACHE_MAX_SIZE",
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

/// How long shipped code and handler environments nobody used stay on an agent's machine
/// or an SSH target (`STEWARD_CACHE_GRACE`, seconds), and how much they may take
/// (`STEWARD_CACHE_MAX_SIZE`, bytes; 0: no cap).
pub const TARGET_CACHE_GRACE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
pub const TARGET_CACHE_MAX_SIZE: u64 = 5 << 30;

/// On a target (an external agent's machine, an SSH target), nothing knows which versions
/// are stored: what this machine was shipped (code directories by digest, and the handler
/// environments under `_venv/`) is removed once unused for the grace period, least recently
/// used first past the cap, never while a handler process uses it. At most one pass an hour
/// per code root, whichever executor gets there first.
fn reap_target_caches(root: &std::path::Path) {
    use crate::pyenv::reap;
    const EVERY: std::time::Duration = std::time::Duration::from_secs(3600);
    let stamp = root.join(".steward-last-reap");
    let due = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
        .is_none_or(|age| age >= EVERY);
    if !due {
        return;
    }
    // one executor does it; the others see the fresh stamp
    let Ok(lock) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&stamp)
    else {
        return;
    };
    if lock.try_lock().is_err() {
        return;
    }
    let _ = lock.set_modified(std::time::SystemTime::now());
    let env_secs = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let policy = reap::Policy {
        grace: env_secs("STEWARD_CACHE_GRACE")
            .map(std::time::Duration::from_secs)
            .unwrap_or(TARGET_CACHE_GRACE),
        max_bytes: match env_secs("STEWARD_CACHE_MAX_SIZE") {
            Some(0) => None,
            Some(n) => Some(n),
            None => Some(TARGET_CACHE_MAX_SIZE),
        },
    };
    reap::remove_leftovers(root, std::time::Duration::from_secs(600));
    let venvs = root.join("_venv");
    reap::remove_leftovers(&venvs, std::time::Duration::from_secs(600));
    let mut entries = reap::entries(root);
    entries.retain(|e| {
        // code directories are named by their digest
        e.dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().bytes().all(|b| b.is_ascii_hexdigit()))
    });
    entries.extend(reap::entries(&venvs));
    let r = reap::reap(entries, &|_| false, policy);
    if !r.removed.is_empty() {
        eprintln!(
            "executor: removed {} unused cache entries ({} MiB) under {}",
            r.removed.len(),
            r.freed >> 20,
            root.display()
        );
    }
}

/// Run one work item: with the module's handler process when it ships one, else with the
/// built-in handler of its type.
/// `calls` answers what a module's handler asks the server meanwhile ([`calls`]).
pub fn execute(
    cache: &mut Cache,
    external: &mut external::ExternalPool,
    item: &WorkItem,
    calls: external::Calls<'_>,
) -> WorkResult {
    let started_at = Utc::now();
    cache.tick(item.version);
    // asked for facts, a handler reads and changes nothing either
    let dry_run = item.kind != ActionKind::Deploy;
    let mut ctx = Context::new(
        &item.resource.id.0,
        dry_run,
        item.reload,
        item.version,
        cache,
    );
    ctx.want_facts = item.want_facts;
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
        (Some(h), _) => {
            if item.at_target {
                // on an agent's machine or an SSH target, what this executor was shipped is
                // kept by last use (see `reap_target_caches`)
                crate::pyenv::reap::touch(&h.dir);
                if let Some(root) = h.dir.parent() {
                    reap_target_caches(root);
                }
            }
            external.execute(&mut ctx, item, h, calls)
        }
        (None, None) => {
            ctx.error(
                format!("no handler for resource type {}", item.resource.type_name),
                &[("type", serde_json::json!(item.resource.type_name))],
            );
            Outcome::Unavailable
        }
        (None, Some(h)) => match std::panic::catch_unwind(AssertUnwindSafe(|| {
            if item.kind == ActionKind::Facts {
                h.facts(&mut ctx, &item.resource.attributes)
            } else {
                h.execute(&mut ctx, &item.resource.attributes)
            }
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
    let (messages, changes, change, facts) = ctx.into_parts();
    WorkResult {
        action_id: item.action_id,
        outcome,
        change,
        changes,
        messages,
        started_at,
        finished_at: Utc::now(),
        state: None,
        facts,
    }
}

/// The executor's side of its link to the scheduler: requests in, replies out.
///
/// The scheduler sends the next actions while one runs; before one of those starts, what
/// came in meanwhile is read without waiting, so that a withdrawal of it is seen
/// ([`Upstream::withdrawn`]). While a handler waits for the answer to a call, requests that
/// come first (work sent ahead, a version done) wait here in order.
struct Upstream<W> {
    input: std::io::BufReader<std::fs::File>,
    out: W,
    pending: std::collections::VecDeque<Request>,
}

impl<W: Write> Upstream<W> {
    fn new(input: std::fs::File, out: W) -> Self {
        Upstream {
            input: std::io::BufReader::with_capacity(64 << 10, input),
            out,
            pending: Default::default(),
        }
    }

    /// The next request; `None` once the input closed.
    fn next(&mut self) -> std::io::Result<Option<Request>> {
        if let Some(r) = self.pending.pop_front() {
            return Ok(Some(r));
        }
        self.read()
    }

    fn read(&mut self) -> std::io::Result<Option<Request>> {
        loop {
            let line = match limits::read_line_bounded(&mut self.input, limits::MAX_WORK_LINE)? {
                limits::Line::End => return Ok(None),
                limits::Line::Text(line) => line,
                limits::Line::TooLong(n) => {
                    eprintln!("executor: a request line of {n} bytes is over the limit; ignored");
                    continue;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str(&line) {
                Ok(r) => return Ok(Some(r)),
                Err(e) => eprintln!("executor: bad request line: {e}"),
            }
        }
    }

    /// Is there input to read without waiting for the scheduler: bytes read already, or
    /// bytes in the pipe? (The rest of a line that has begun may take a moment more.)
    fn input_ready(&self) -> bool {
        use std::os::fd::AsRawFd;
        if !self.input.buffer().is_empty() {
            return true;
        }
        let mut fd = libc::pollfd {
            fd: self.input.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of a descriptor this link owns, no timeout
        let n = unsafe { libc::poll(&mut fd, 1, 0) };
        n > 0 && fd.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }

    /// Was `action_id` withdrawn? Reads what came in so far (not waiting for more); a
    /// withdrawal found is used up. A link that failed or closed meanwhile is seen by the
    /// next [`Upstream::next`].
    fn withdrawn(&mut self, action_id: uuid::Uuid) -> bool {
        while self.input_ready() {
            match self.read() {
                Ok(Some(r)) => self.pending.push_back(r),
                Ok(None) | Err(_) => break,
            }
        }
        let found = self
            .pending
            .iter()
            .position(|r| matches!(r, Request::Withdraw { action_id: a } if *a == action_id));
        found.map(|i| self.pending.remove(i)).is_some()
    }

    fn send(&mut self, reply: &Reply) -> std::io::Result<()> {
        writeln!(self.out, "{}", serde_json::to_string(reply).expect("json"))?;
        self.out.flush()
    }

    /// Pass a handler's call to the scheduler and wait for its answer.
    fn ask(&mut self, call: calls::ServerCall) -> calls::CallAnswer {
        let call_id = call.call_id;
        if let Err(e) = self.send(&Reply::Call(Box::new(call))) {
            return calls::refusal(call_id, 503, format!("the executor could not ask: {e}"));
        }
        loop {
            match self.read() {
                Ok(Some(Request::Answer(a))) if a.call_id == call_id => return a,
                // an answer to a call given up on
                Ok(Some(Request::Answer(_))) => {}
                Ok(Some(other)) => self.pending.push_back(other),
                Ok(None) => {
                    return calls::refusal(
                        call_id,
                        503,
                        "the executor's link to the server closed",
                    );
                }
                Err(e) => {
                    return calls::refusal(
                        call_id,
                        503,
                        format!("the executor's link failed: {e}"),
                    );
                }
            }
        }
    }
}

/// `steward executor`: serve work items on stdin until it closes.
pub fn main_loop() -> std::io::Result<()> {
    // a panic message would otherwise go to stderr in the middle of our protocol logs
    std::panic::set_hook(Box::new(|_| {}));
    let stdout = std::io::stdout();
    // stdin's own descriptor, read here only: the link looks at what is buffered and what
    // is in the pipe ([`Upstream::withdrawn`]), which `Stdin`'s buffer would hide
    let input =
        std::fs::File::from(std::os::fd::AsFd::as_fd(&std::io::stdin()).try_clone_to_owned()?);
    let mut link = Upstream::new(input, std::io::BufWriter::new(stdout.lock()));
    let mut cache = Cache::default();
    let mut external = external::ExternalPool::default();
    link.send(&Reply::Ready {
        pid: std::process::id(),
    })?;
    while let Some(req) = link.next()? {
        match req {
            Request::Shutdown => break,
            Request::VersionDone { version } => {
                external.version_done(version);
            }
            // a late answer, to a call whose action ended
            Request::Answer(_) => {}
            // of an action that ran before its withdrawal came (or was never sent here)
            Request::Withdraw { .. } => {}
            // sent ahead, and withdrawn while the action before it ran: it never starts
            Request::Work(item) if link.withdrawn(item.action_id) => {
                link.send(&Reply::Withdrawn {
                    action_id: item.action_id,
                })?;
            }
            Request::Work(item) => {
                let mut result = execute(&mut cache, &mut external, &item, &mut |c| link.ask(c));
                // what goes back is bounded here already: the server bounds it again
                result.sanitize();
                link.send(&Reply::Result(Box::new(result)))?;
            }
        }
    }
    external.shutdown();
    cache.clear();
    Ok(())
}

#[cfg(test)]
mod target_cache_tests {
    use std::time::{Duration, SystemTime};

    fn entry(dir: &std::path::Path, days_ago: u64) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("f"), "x").unwrap();
        crate::pyenv::reap::touch(dir);
        let t = SystemTime::now() - Duration::from_secs(days_ago * 86400);
        let stamp = dir.join(crate::pyenv::reap::STAMP);
        std::fs::File::options()
            .write(true)
            .open(stamp)
            .unwrap()
            .set_modified(t)
            .unwrap();
        std::fs::File::open(dir).unwrap().set_modified(t).unwrap();
    }

    #[test]
    fn a_target_keeps_what_it_used_lately_and_what_runs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let (old, fresh, running) = (r.join("aa11"), r.join("bb22"), r.join("cc33"));
        let (old_env, lib) = (r.join("_venv/0123"), r.join("_lib"));
        entry(&old, 3);
        entry(&fresh, 0);
        entry(&running, 3);
        entry(&old_env, 2);
        entry(&lib, 9);
        let held = crate::pyenv::reap::lock_file(&running, false).unwrap();
        super::reap_target_caches(r);
        assert!(!old.exists() && !old_env.exists());
        assert!(fresh.exists() && running.exists() && lib.exists());
        // at most once an hour
        entry(&old, 3);
        super::reap_target_caches(r);
        assert!(old.exists());
        drop(held);
    }
}

#[cfg(test)]
mod upstream_tests {
    use std::io::Write;
    use std::os::fd::FromRawFd;

    use super::Upstream;
    use super::protocol::{Request, WorkItem};

    fn pipe() -> (std::fs::File, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills two descriptors, each owned by one File from here on
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    fn work(action_id: uuid::Uuid) -> String {
        let item: WorkItem = serde_json::from_value(serde_json::json!({
            "action_id": action_id, "version": 1, "kind": "deploy", "reload": false,
            "resource": {"id": "fs::File[a,path=/x]", "type": "fs::File", "agent": "a",
                          "attributes": {}, "requires": []},
        }))
        .expect("a work item");
        serde_json::to_string(&Request::Work(Box::new(item))).unwrap() + "\n"
    }

    fn withdraw(action_id: uuid::Uuid) -> String {
        serde_json::to_string(&Request::Withdraw { action_id }).unwrap() + "\n"
    }

    /// What the executor's main loop does: take the next request, and before it starts a work
    /// item, look (without waiting) for a withdrawal of it among what came in meanwhile.
    #[test]
    fn a_withdrawal_that_came_in_meanwhile_is_seen_without_waiting_for_more() {
        let (r, mut w) = pipe();
        let mut link = Upstream::new(r, Vec::new());
        let (a, b, c) = (
            uuid::Uuid::now_v7(),
            uuid::Uuid::now_v7(),
            uuid::Uuid::now_v7(),
        );
        // a runs while b and c wait; then b is withdrawn (and an action never sent)
        let sent = work(a) + &work(b) + &work(c) + &withdraw(b) + &withdraw(uuid::Uuid::nil());
        w.write_all(sent.as_bytes()).unwrap();
        let first = link.next().unwrap().unwrap();
        assert!(matches!(first, Request::Work(i) if i.action_id == a));
        // nothing withdrew a; the pipe stays open, so a look that waited would hang here
        assert!(!link.withdrawn(a));
        let second = link.next().unwrap().unwrap();
        assert!(matches!(second, Request::Work(i) if i.action_id == b));
        assert!(link.withdrawn(b), "b's withdrawal came in while a ran");
        // used up: the next request is c, then the withdrawal of what was never here
        let third = link.next().unwrap().unwrap();
        assert!(matches!(third, Request::Work(i) if i.action_id == c));
        assert!(!link.withdrawn(c));
        assert!(matches!(
            link.next().unwrap().unwrap(),
            Request::Withdraw { action_id } if action_id.is_nil()
        ));
        // the scheduler closed the link
        drop(w);
        assert!(link.next().unwrap().is_none());
    }
}
