//! `steward agent run`: the process on a managed machine that hosts agents of an environment.
//!
//! It connects out to the server (no port is opened here), opens a session for the agents it
//! names, and polls (`scheduler::agents` is the server's side). Work it gets runs in local
//! `steward executor` children, exactly as on the server: same handlers, same read → diff →
//! apply, same logs, dry-runs and timeouts. Handler code of module resources comes from the
//! server by digest, is checked against the digest, and is cached under the work dir.
//!
//! Results wait in memory until a poll takes them: a dropped connection is retried with
//! backoff, and the results are sent when it is back. A process that learns it was deposed
//! (409: another process is primary now) drops them: the new primary runs those actions
//! again. It starts no action once its lease may have run out without a renewal.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::client::{Client, ClientError};
use crate::executor::protocol::{Outcome, Reply, WorkResult};
use crate::model::{CodeFile, HandlerCode};
use crate::scheduler::agents::{Assignment, Hello, Poll, PollReply, Report};
use crate::scheduler::executors::{Pool, PoolEvent, ProcId};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the server refused this process: {0}")]
    Refused(String),
    #[error("{0}")]
    Setup(String),
}

pub struct AgentOptions {
    /// The environment (id or name).
    pub environment: String,
    /// The agents to host.
    pub names: Vec<String>,
    /// Cached handler code lives here.
    pub work_dir: PathBuf,
    /// The program started as `steward executor`.
    pub executor_bin: PathBuf,
}

/// Reconnect delays: 0.5 s doubling up to 5 s.
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A lease is taken to end this much before the server says, to allow for clock rates and
/// the time the answer took.
const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// Poll at least this often while actions run (the heartbeat that renews the leases).
const HEARTBEAT: Duration = Duration::from_millis(1000);

struct Running {
    agent: String,
    term: i64,
    proc: ProcId,
    /// the handler timeout, enforced here: an action may have waited for its slot
    deadline: Option<(Instant, u64)>,
}

struct Agent {
    client: Client,
    opts: AgentOptions,
    instance: Uuid,
    pool: Pool,
    running: HashMap<Uuid, Running>,
    /// handed out ahead, waiting for a slot of their agent
    waiting: VecDeque<Assignment>,
    /// finished actions not yet taken by the server
    results: Vec<Report>,
    primary: BTreeMap<String, i64>,
    lease_until: Instant,
    code: HashMap<String, PathBuf>,
}

/// Run until `shutdown` resolves (then close the session) or the server refuses us.
pub async fn run(
    client: Client,
    opts: AgentOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    std::fs::create_dir_all(opts.work_dir.join("code"))
        .map_err(|e| AgentError::Setup(format!("creating {}: {e}", opts.work_dir.display())))?;
    let (pool, mut events) = Pool::new(opts.executor_bin.clone(), 64);
    let mut a = Agent {
        client,
        opts,
        instance: Uuid::new_v4(),
        pool,
        running: HashMap::new(),
        waiting: VecDeque::new(),
        results: Vec::new(),
        primary: BTreeMap::new(),
        lease_until: Instant::now(),
        code: HashMap::new(),
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let outcome = tokio::select! {
        r = a.serve(&mut events) => r,
        _ = &mut shutdown => Ok(()),
    };
    a.pool.shutdown();
    let _ = a.client.agent_close(&a.opts.environment, a.instance).await;
    tracing::info!(instance = %a.instance, "agent process stopped");
    outcome
}

impl Agent {
    async fn serve(
        &mut self,
        events: &mut tokio::sync::mpsc::UnboundedReceiver<PoolEvent>,
    ) -> Result<(), AgentError> {
        let mut backoff = BACKOFF_START;
        let mut open = false;
        let mut last_poll = Instant::now();
        loop {
            // while actions run: wait for one to end, for the next heartbeat, or for a
            // handler's timeout
            if !self.running.is_empty() {
                let mut wake = last_poll + HEARTBEAT;
                if let Some(d) = self
                    .running
                    .values()
                    .filter_map(|r| r.deadline)
                    .map(|d| d.0)
                    .min()
                {
                    wake = wake.min(d);
                }
                tokio::select! {
                    Some(ev) = events.recv() => self.on_event(ev),
                    _ = tokio::time::sleep_until(wake.into()) => {},
                }
                while let Ok(ev) = events.try_recv() {
                    self.on_event(ev);
                }
                self.expire();
                // a slot freed: what was handed out ahead starts now, before the round trip
                self.start_waiting().await;
            }
            let answer = if open {
                // idle: wait up to a second for work. Busy with nothing handed out ahead: wait
                // a little for the next action (the server hands it out as soon as it has our
                // last result), so it is here when a slot frees. Work waiting: report at once.
                let wait_ms = match (self.running.is_empty(), self.waiting.is_empty()) {
                    (true, true) => 1000,
                    (false, true) => 50,
                    _ => 0,
                };
                let poll = Poll {
                    results: self.results.clone(),
                    wait_ms,
                };
                let r = self
                    .client
                    .agent_poll(&self.opts.environment, self.instance, &poll)
                    .await;
                if r.is_ok() {
                    // taken (each once, by action id)
                    self.results.drain(..poll.results.len());
                }
                r
            } else {
                self.client
                    .agent_open(&self.opts.environment, &self.hello())
                    .await
            };
            last_poll = Instant::now();
            match answer {
                Ok(reply) => {
                    if !open {
                        tracing::info!(instance = %self.instance, agents = ?self.opts.names, "connected to the server");
                    }
                    open = true;
                    backoff = BACKOFF_START;
                    self.on_reply(reply).await;
                }
                Err(e) => match e.status() {
                    Some(401) | Some(403) => return Err(AgentError::Refused(e.to_string())),
                    Some(404) if open => {
                        tracing::warn!(instance = %self.instance, "the server forgot this session; opening a new one");
                        open = false;
                    }
                    Some(409) => {
                        // deposed: another process is primary; what we ran is run again there
                        tracing::warn!(instance = %self.instance, dropped = self.results.len(), "{e}");
                        self.results.clear();
                        self.primary.clear();
                    }
                    _ => {
                        tracing::warn!(instance = %self.instance, retry_in_ms = backoff.as_millis() as u64, "{e}");
                        if matches!(e, ClientError::Connect { .. }) {
                            // the server may have restarted and forgotten us
                            open = false;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                },
            }
        }
    }

    fn hello(&self) -> Hello {
        Hello {
            instance: self.instance,
            agents: self.opts.names.clone(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    fn on_event(&mut self, ev: PoolEvent) {
        match ev {
            PoolEvent::Reply(proc, Reply::Result(result)) => {
                self.pool.release(proc);
                self.finished(*result);
            }
            // an agent process places nothing over SSH
            PoolEvent::Reply(_, Reply::Ready { .. }) | PoolEvent::SshConnected(..) => {}
            PoolEvent::Exited(proc, why) => {
                self.pool.forget(proc);
                let action = self
                    .running
                    .iter()
                    .find(|(_, r)| r.proc == proc)
                    .map(|(a, _)| *a);
                if let Some(action_id) = action {
                    let now = chrono::Utc::now();
                    self.finished(unavailable(
                        action_id,
                        &format!("the executor crashed ({why})"),
                        now,
                    ));
                }
            }
        }
    }

    fn finished(&mut self, result: WorkResult) {
        if let Some(r) = self.running.remove(&result.action_id) {
            self.results.push(Report {
                agent: r.agent,
                term: r.term,
                result,
            });
        }
    }

    async fn on_reply(&mut self, reply: PollReply) {
        let lease = Duration::from_millis(reply.lease_ms.max(0) as u64);
        self.lease_until = Instant::now() + lease.saturating_sub(LEASE_MARGIN);
        if reply.primary != self.primary {
            tracing::info!(instance = %self.instance, primary = ?reply.primary, "primary of");
            self.primary = reply.primary;
        }
        for action in reply.cancel {
            self.waiting.retain(|a| a.item.action_id != action);
            if let Some(r) = self.running.remove(&action) {
                tracing::warn!(instance = %self.instance, action = %action, "action abandoned by the server (timeout): killing its executor");
                self.pool.kill(r.proc);
            }
        }
        for a in reply.work {
            let id = a.item.action_id;
            if !self.running.contains_key(&id)
                && !self.waiting.iter().any(|w| w.item.action_id == id)
            {
                self.waiting.push_back(a);
            }
        }
        self.start_waiting().await;
    }

    /// Start what waits, in order, while its agent has a free slot.
    async fn start_waiting(&mut self) {
        // deposed: what was handed out under a term we no longer hold goes to the new primary
        let primary = self.primary.clone();
        self.waiting
            .retain(|a| primary.get(&a.agent) == Some(&a.term));
        let mut i = 0;
        while i < self.waiting.len() {
            // never start under a lease that may have run out (a code fetch takes time):
            // what waits stays for after the next poll, never dropped while still ours
            if Instant::now() >= self.lease_until {
                return;
            }
            let a = &self.waiting[i];
            let busy = self.running.values().filter(|r| r.agent == a.agent).count();
            if busy < a.run_at_most.max(1) {
                let a = self.waiting.remove(i).expect("index in range");
                self.start(a).await;
            } else {
                i += 1;
            }
        }
    }

    /// Handlers past their timeout: kill their executor (and what it started) and report.
    fn expire(&mut self) {
        let now = Instant::now();
        let late: Vec<Uuid> = self
            .running
            .iter()
            .filter(|(_, r)| r.deadline.is_some_and(|(d, _)| d <= now))
            .map(|(a, _)| *a)
            .collect();
        for action_id in late {
            let Some(r) = self.running.remove(&action_id) else {
                continue;
            };
            self.pool.kill(r.proc);
            let secs = r.deadline.map(|(_, s)| s).unwrap_or(0);
            let mut result = unavailable(
                action_id,
                &format!("the handler did not finish within {secs} s: its executor was killed"),
                chrono::Utc::now(),
            );
            result.outcome = Outcome::TimedOut;
            self.results.push(Report {
                agent: r.agent,
                term: r.term,
                result,
            });
        }
    }

    async fn start(&mut self, a: Assignment) {
        let Assignment {
            agent,
            term,
            mut item,
            ..
        } = a;
        let action_id = item.action_id;
        if self.running.contains_key(&action_id) {
            return;
        }
        let started = chrono::Utc::now();
        if let Some(h) = &mut item.handler {
            match self.code_dir(&h.digest).await {
                Ok(dir) => h.dir = dir,
                Err(e) => {
                    self.results.push(Report {
                        agent,
                        term,
                        result: unavailable(action_id, &e, started),
                    });
                    return;
                }
            }
        }
        let deadline = item
            .timeout
            .map(|t| (Instant::now() + Duration::from_secs(t), t));
        let sent = match self.pool.acquire(&agent).await {
            Ok(proc) => {
                self.running.insert(
                    action_id,
                    Running {
                        agent: agent.clone(),
                        term,
                        proc,
                        deadline,
                    },
                );
                self.pool.send(proc, item).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            self.running.remove(&action_id);
            self.results.push(Report {
                agent,
                term,
                result: unavailable(action_id, &format!("no executor: {e}"), started),
            });
        }
    }

    /// The local directory of handler code `digest`, fetched and checked when not cached.
    async fn code_dir(&mut self, digest: &str) -> Result<PathBuf, String> {
        if let Some(d) = self.code.get(digest) {
            return Ok(d.clone());
        }
        let dir = self.opts.work_dir.join("code");
        if dir.join(digest).join(".complete").is_file() {
            let d = dir.join(digest);
            self.code.insert(digest.to_string(), d.clone());
            return Ok(d);
        }
        let bundle = self
            .client
            .handler_code(&self.opts.environment, digest)
            .await
            .map_err(|e| format!("fetching handler code {digest}: {e}"))?;
        let (code, blobs) = verified_code(&bundle, digest)?;
        let d = tokio::task::spawn_blocking(move || {
            crate::scheduler::code::materialize(&dir, &code, &blobs)
        })
        .await
        .map_err(|e| format!("writing handler code crashed: {e}"))??;
        self.code.insert(digest.to_string(), d.clone());
        Ok(d)
    }
}

/// The code of a bundle from the server, after checking every file against its hash and the
/// whole against the digest asked for.
fn verified_code(
    bundle: &serde_json::Value,
    digest: &str,
) -> Result<(HandlerCode, HashMap<String, Vec<u8>>), String> {
    use sha2::{Digest, Sha256};
    let code: HandlerCode = serde_json::from_value(bundle["code"].clone())
        .map_err(|e| format!("handler code {digest}: unreadable: {e}"))?;
    let files: &BTreeMap<String, CodeFile> = &code.files;
    if code.digest != digest || HandlerCode::compute_digest(&code.entry, files) != digest {
        return Err(format!(
            "handler code {digest}: the server sent code with another digest"
        ));
    }
    let mut blobs = HashMap::new();
    for (path, f) in files {
        let content = bundle["contents"][path]
            .as_str()
            .and_then(|h| hex::decode(h).ok())
            .ok_or_else(|| format!("handler code {digest}: {path} is missing"))?;
        if hex::encode(Sha256::digest(&content)) != f.hash {
            return Err(format!(
                "handler code {digest}: {path} does not match its hash"
            ));
        }
        blobs.insert(f.hash.clone(), content);
    }
    Ok((code, blobs))
}

fn unavailable(
    action_id: Uuid,
    message: &str,
    started: chrono::DateTime<chrono::Utc>,
) -> WorkResult {
    WorkResult {
        action_id,
        outcome: Outcome::Unavailable,
        change: Default::default(),
        changes: Default::default(),
        messages: vec![crate::executor::protocol::LogLine {
            level: "error".into(),
            message: message.to_string(),
            fields: Default::default(),
            at: chrono::Utc::now(),
        }],
        started_at: started,
        finished_at: chrono::Utc::now(),
        state: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn bundle(content: &[u8], sent: &[u8]) -> (serde_json::Value, String) {
        let mut files = BTreeMap::new();
        files.insert(
            "handler.py".to_string(),
            CodeFile {
                hash: hex::encode(Sha256::digest(content)),
                executable: false,
            },
        );
        let digest = HandlerCode::compute_digest("handler.py", &files);
        let code = HandlerCode {
            module: "m".into(),
            entry: "handler.py".into(),
            files,
            digest: digest.clone(),
        };
        let b = serde_json::json!({"code": code, "contents": {"handler.py": hex::encode(sent)}});
        (b, digest)
    }

    #[test]
    fn fetched_code_is_checked_against_its_digest_and_hashes() {
        let (b, digest) = bundle(b"print(1)", b"print(1)");
        let (code, blobs) = verified_code(&b, &digest).unwrap();
        assert_eq!(code.digest, digest);
        assert_eq!(blobs.len(), 1);
        // a file changed on the way
        let (b, digest) = bundle(b"print(1)", b"print(2)");
        assert!(
            verified_code(&b, &digest)
                .unwrap_err()
                .contains("does not match its hash")
        );
        // other code than asked for
        let (b, _) = bundle(b"print(1)", b"print(1)");
        assert!(
            verified_code(&b, "0000")
                .unwrap_err()
                .contains("another digest")
        );
    }
}
