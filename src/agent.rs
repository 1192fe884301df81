//! `steward agent run`: the process on a managed machine that hosts agents of an environment.
//!
//! It connects out to the server (no port is opened here), opens a session for the agents it
//! names, and polls (`scheduler::agents` is the server's side). Work it gets runs in local
//! `steward executor` children, exactly as on the server: same handlers, same read → diff →
//! apply, same logs, dry-runs and timeouts. Handler code of module resources comes from the
//! server by digest, is checked against the digest, and is cached under the work dir.
//!
//! One poll always waits for work (it is the heartbeat too); results go on a second poll
//! that does not wait, at most one at a time: at once when little is left to start, else
//! gathered for up to [`REPORT_DELAY`], so one request carries many when actions are short.
//! The server hands out more actions than the agent's parallelism: they wait here for a
//! slot, so the round trips overlap the work. Results wait in memory until a poll takes
//! them: a dropped connection is retried with backoff, the session is opened again (the
//! server then hands out again what is in flight for us: what we run or have a result for
//! is skipped, what we held unstarted is dropped and taken again from that answer) and the
//! results are sent. A process that learns it was deposed (409:
//! another process is primary now) opens its session again and drops the results of the
//! agents it lost: the new primary runs those actions again. It starts no action once its
//! lease may have run out without a renewal, counted from when it sent the request whose
//! answer renewed it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use uuid::Uuid;

mod calls;

use crate::client::{Client, ClientError};
use crate::executor::protocol::{Outcome, Reply, WorkResult};
use crate::model::{CodeFile, HandlerCode};
use crate::scheduler::agents::{Assignment, Hello, Poll, PollReply, Report, Withdrawal};
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
    /// How long fetched code and handler environments nobody used stay (None: the
    /// executor's default, a day), and how much they may take (None: 5 GiB; 0: no cap).
    pub cache_grace: Option<Duration>,
    pub cache_max_size: Option<u64>,
}

/// Reconnect delays: 0.5 s doubling up to 5 s.
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A lease is taken to end this much before the server says, to allow for clock rates and
/// the time the answer took.
const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// What one poll carries of results at most, as JSON: under the server's limit on a poll's
/// body (`server::ACTION_BODY`, 8 MiB), so that results of actions that logged a lot go in
/// several polls rather than in one the server refuses again and again.
const MAX_REPORT_BYTES: usize = 6 * 1024 * 1024;

/// The first of `results` whose JSON fits in `max` bytes (at least one: a single result is
/// bounded far below it), taken out of `results`.
fn take_within(results: &mut Vec<Report>, max: usize) -> Vec<Report> {
    let mut used = 0;
    let mut n = 0;
    for r in results.iter() {
        let size = serde_json::to_vec(r).map(|b| b.len()).unwrap_or(max);
        if n > 0 && used + size > max {
            break;
        }
        used += size;
        n += 1;
    }
    results.drain(..n).collect()
}

/// How long a poll waits for work (the server answers within a second, so it is also the
/// heartbeat that renews the leases).
const MAX_WAIT: Duration = Duration::from_millis(1000);

/// Results are sent at once when at most this many actions wait to start (or none runs):
/// else they gather for up to [`REPORT_DELAY`] (one request for many).
const REPORT_WHEN_WAITING: usize = 8;
const REPORT_DELAY: Duration = Duration::from_millis(5);

/// Why an answer ends the loop or holds the next request.
enum Answer {
    Refused(AgentError),
    Retry,
}

struct Running {
    agent: String,
    term: i64,
    proc: ProcId,
    /// the handler timeout, enforced here: an action may have waited for its slot
    deadline: Option<(Instant, u64)>,
    /// the environment's id, as the server gave it with the work (what a handler's calls
    /// are scoped to)
    environment: Option<Uuid>,
}

struct Agent {
    client: Client,
    opts: AgentOptions,
    instance: Uuid,
    pool: Pool,
    running: HashMap<Uuid, Running>,
    /// handed out ahead, waiting for a slot of their agent
    waiting: VecDeque<Assignment>,
    /// finished actions not yet sent to the server
    results: Vec<Report>,
    /// when the oldest of `results` finished
    results_since: Option<Instant>,
    /// finished actions on their way to the server
    sending: Vec<Report>,
    /// actions handed out ahead that the server withdrew before they started, to give back
    withdrawn: Vec<Withdrawal>,
    /// ... and those on their way
    withdrawn_sending: Vec<Withdrawal>,
    primary: BTreeMap<String, i64>,
    lease_until: Instant,
    /// when the request whose answer last set `primary` and `lease_until` was sent (answers
    /// of requests sent earlier are older news)
    applied: Option<Instant>,
    /// the session is open
    open: bool,
    /// the environment, as the server said when the session opened
    environment: Option<crate::scheduler::agents::EnvIdentity>,
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
    let (mut pool, mut events) = Pool::new(opts.executor_bin.clone(), 64);
    // what the server handed out ahead waits here for a slot, and each action's timeout
    // runs from when it is sent: an executor gets one at a time
    pool.one_action_per_executor();
    let mut cache_env = Vec::new();
    if let Some(g) = opts.cache_grace {
        cache_env.push(("STEWARD_CACHE_GRACE".to_string(), g.as_secs().to_string()));
    }
    if let Some(m) = opts.cache_max_size {
        cache_env.push(("STEWARD_CACHE_MAX_SIZE".to_string(), m.to_string()));
    }
    pool.set_extra_env(cache_env);
    let mut a = Agent {
        client,
        opts,
        instance: Uuid::new_v4(),
        pool,
        running: HashMap::new(),
        waiting: VecDeque::new(),
        results: Vec::new(),
        sending: Vec::new(),
        withdrawn: Vec::new(),
        withdrawn_sending: Vec::new(),
        results_since: None,
        primary: BTreeMap::new(),
        lease_until: Instant::now(),
        applied: None,
        open: false,
        environment: None,
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

/// A request to the server on its way: what it is, when it was sent, and its answer.
type Pending = std::pin::Pin<Box<dyn Future<Output = (Sent, Result<PollReply, ClientError>)>>>;

#[derive(Clone, Copy, Debug)]
struct Sent {
    at: Instant,
    kind: Request,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// opening the session
    Open,
    /// results in (`Agent::sending`), without waiting for work
    Report,
    /// waiting for work (the heartbeat)
    Wait,
}

/// The answer of a request on its way, or never.
async fn answer(p: &mut Option<Pending>) -> (Sent, Result<PollReply, ClientError>) {
    match p {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

impl Agent {
    async fn serve(
        &mut self,
        events: &mut tokio::sync::mpsc::UnboundedReceiver<PoolEvent>,
    ) -> Result<(), AgentError> {
        let mut backoff = BACKOFF_START;
        // no request before this (after a failed one)
        let mut hold_until = Instant::now();
        // the session opens alone; then one poll always waits for work, and results go on
        // a second one as soon as there are any (those that finish meanwhile go on the next)
        let mut opener: Option<Pending> = None;
        let mut report: Option<Pending> = None;
        let mut waiter: Option<Pending> = None;
        loop {
            let now = Instant::now();
            if now >= hold_until {
                if !self.open {
                    if opener.is_none() && report.is_none() && waiter.is_none() {
                        opener = Some(self.request(Request::Open));
                    }
                } else {
                    if report.is_none() && self.report_due() {
                        report = Some(self.request(Request::Report));
                    }
                    if waiter.is_none() {
                        waiter = Some(self.request(Request::Wait));
                    }
                }
            }
            // a handler's timeout, or the end of a hold
            let mut wake = self
                .running
                .values()
                .filter_map(|r| r.deadline)
                .map(|d| d.0)
                .min();
            if now < hold_until {
                wake = Some(wake.map_or(hold_until, |w| w.min(hold_until)));
            }
            if report.is_none()
                && !self.results.is_empty()
                && let Some(t) = self.results_since
            {
                let due = t + REPORT_DELAY;
                wake = Some(wake.map_or(due, |w| w.min(due)));
            }
            let sleep = async {
                match wake {
                    Some(w) => tokio::time::sleep_until(w.into()).await,
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                Some(ev) = events.recv() => {
                    self.on_event(ev);
                    while let Ok(ev) = events.try_recv() {
                        self.on_event(ev);
                    }
                    None
                }
                a = answer(&mut opener) => { opener = None; Some(a) }
                a = answer(&mut report) => { report = None; Some(a) }
                a = answer(&mut waiter) => { waiter = None; Some(a) }
                _ = sleep => None,
            };
            if let Some((sent, r)) = outcome {
                match self.on_answer(sent, r) {
                    Ok(()) => backoff = BACKOFF_START,
                    Err(Answer::Refused(e)) => return Err(e),
                    Err(Answer::Retry) => {
                        hold_until = Instant::now() + backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
            }
            self.expire();
            // what was handed out ahead starts as soon as a slot frees
            self.start_waiting().await;
            self.pool.send_answers().await;
        }
    }

    /// Send a request; its answer comes back through the returned future.
    fn request(&mut self, kind: Request) -> Pending {
        let client = self.client.clone();
        let env = self.opts.environment.clone();
        let instance = self.instance;
        let sent = Sent {
            at: Instant::now(),
            kind,
        };
        match kind {
            Request::Open => {
                let hello = self.hello();
                Box::pin(async move { (sent, client.agent_open(&env, &hello).await) })
            }
            Request::Report => {
                self.sending = take_within(&mut self.results, MAX_REPORT_BYTES);
                self.results_since = (!self.results.is_empty()).then(Instant::now);
                self.withdrawn_sending = std::mem::take(&mut self.withdrawn);
                let poll = Poll {
                    results: self.sending.clone(),
                    withdrawn: self.withdrawn_sending.clone(),
                    wait_ms: 0,
                };
                Box::pin(async move { (sent, client.agent_poll(&env, instance, &poll).await) })
            }
            Request::Wait => {
                let poll = Poll {
                    wait_ms: MAX_WAIT.as_millis() as u64,
                    ..Poll::default()
                };
                Box::pin(async move { (sent, client.agent_poll(&env, instance, &poll).await) })
            }
        }
    }

    /// Take an answer in: its work, its news about leases, and what it says about results.
    fn on_answer(
        &mut self,
        sent: Sent,
        answer: Result<PollReply, ClientError>,
    ) -> Result<(), Answer> {
        if sent.kind == Request::Report && answer.is_err() {
            // not taken (or not known to be): they go again, first
            let mut again = std::mem::take(&mut self.sending);
            again.append(&mut self.results);
            self.results = again;
            self.results_since = Some(Instant::now());
            let mut again = std::mem::take(&mut self.withdrawn_sending);
            again.append(&mut self.withdrawn);
            self.withdrawn = again;
        }
        match answer {
            Ok(reply) => {
                match sent.kind {
                    Request::Open => {
                        tracing::info!(instance = %self.instance, agents = ?self.opts.names, "connected to the server");
                        self.open = true;
                        // what we held and had not started is handed out again in this answer
                        // if it is still ours; what the server took back meanwhile (withdrawn
                        // while our session was gone) is not, and must not start
                        if !self.waiting.is_empty() {
                            tracing::info!(instance = %self.instance, held = self.waiting.len(), "session opened again: held actions dropped, the server hands out again what is still ours");
                            self.waiting.clear();
                        }
                        if reply.environment.is_some() {
                            self.environment = reply.environment.clone();
                        }
                    }
                    // taken (each once, by action id)
                    Request::Report => {
                        self.sending.clear();
                        self.withdrawn_sending.clear();
                    }
                    Request::Wait => {}
                }
                self.on_reply(sent, reply);
                Ok(())
            }
            Err(e) => match e.status() {
                Some(401) | Some(403) => Err(Answer::Refused(AgentError::Refused(e.to_string()))),
                Some(404) => {
                    if self.open {
                        tracing::warn!(instance = %self.instance, "the server forgot this session; opening a new one");
                    }
                    self.open = false;
                    Ok(())
                }
                Some(409) => {
                    // deposed from (at least) one agent: start nothing until the session is
                    // open again, which says what we still hold; results under terms we lost
                    // are dropped then (their actions run again at the new primary), the
                    // others are reported again
                    tracing::warn!(instance = %self.instance, "{e}");
                    self.primary.clear();
                    self.applied = Some(sent.at.max(self.applied.unwrap_or(sent.at)));
                    self.open = false;
                    Ok(())
                }
                _ => {
                    tracing::warn!(instance = %self.instance, "{e}");
                    // the server may have restarted and forgotten us, or an answer (and the
                    // work in it) was lost: open again, which hands us what is ours again
                    self.open = false;
                    Err(Answer::Retry)
                }
            },
        }
    }

    fn push_result(&mut self, mut r: Report) {
        // bounded here already (the executor did, the server does again): a report must
        // fit the server's limit on a poll's body
        r.result.sanitize();
        if self.results.is_empty() {
            self.results_since = Some(Instant::now());
        }
        self.results.push(r);
    }

    /// Is it time to send the results we have? At once when nothing else runs or little is
    /// left to start (the server hands out more when it has them, and dependents may wait
    /// for them); else they gather for up to [`REPORT_DELAY`], so that one request carries
    /// many.
    fn report_due(&self) -> bool {
        // given back at once: the server queues them again
        !self.withdrawn.is_empty()
            || !self.results.is_empty()
                && (self.running.is_empty()
                    || self.waiting.len() <= REPORT_WHEN_WAITING
                    || self
                        .results_since
                        .is_none_or(|t| t.elapsed() >= REPORT_DELAY))
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
            // its executors are given one action at a time: nothing waits there to withdraw
            PoolEvent::Reply(_, Reply::Ready { .. } | Reply::Withdrawn { .. })
            | PoolEvent::SshConnected(..) => {}
            PoolEvent::Reply(proc, Reply::Call(call)) => self.on_call(proc, *call),
            PoolEvent::Answer(proc, a) => self.pool.queue_answer(proc, a),
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

    /// A handler calls the server: answered through the API in a task of its own, the answer
    /// coming back as a [`PoolEvent::Answer`].
    fn on_call(&mut self, proc: ProcId, call: crate::executor::calls::ServerCall) {
        let events = self.pool.events();
        let running = self.running.get(&call.action_id).filter(|r| r.proc == proc);
        let Some((agent, Some(env))) = running.map(|r| (r.agent.clone(), r.environment)) else {
            let a = crate::executor::calls::refusal(
                call.call_id,
                409,
                "the action that made this call is over (or its server did not say its environment)",
            );
            let _ = events.send(PoolEvent::Answer(proc, a));
            return;
        };
        let link = calls::Link {
            client: self.client.clone(),
            env_key: self.opts.environment.clone(),
            env,
            identity: self.environment.clone(),
        };
        tokio::spawn(async move {
            let a = calls::answer(&link, &agent, &call).await;
            let _ = events.send(PoolEvent::Answer(proc, a));
        });
    }

    fn finished(&mut self, result: WorkResult) {
        if let Some(r) = self.running.remove(&result.action_id) {
            self.push_result(Report {
                agent: r.agent,
                term: r.term,
                result,
            });
        }
    }

    fn on_reply(&mut self, sent: Sent, reply: PollReply) {
        // the leases as the server saw them when it answered, counted from when we asked
        // (the lease can only have been renewed after that); older news is ignored
        if self.applied.is_none_or(|a| sent.at >= a) {
            self.applied = Some(sent.at);
            let lease = Duration::from_millis(reply.lease_ms.max(0) as u64);
            self.lease_until = sent.at + lease.saturating_sub(LEASE_MARGIN);
            if reply.primary != self.primary {
                tracing::info!(instance = %self.instance, primary = ?reply.primary, "primary of");
                self.primary = reply.primary;
            }
            // results under a term we no longer hold would be refused: their actions run
            // again at the new primary
            let primary = &self.primary;
            let before = self.results.len();
            self.results
                .retain(|r| primary.get(&r.agent) == Some(&r.term));
            if self.results.len() < before {
                tracing::warn!(instance = %self.instance, dropped = before - self.results.len(), "results of actions of a term no longer held dropped");
            }
            // so are actions given back (the new primary holds them now)
            self.withdrawn
                .retain(|w| primary.get(&w.agent) == Some(&w.term));
        }
        for action in reply.cancel {
            self.waiting.retain(|a| a.item.action_id != action);
            if let Some(r) = self.running.remove(&action) {
                tracing::warn!(instance = %self.instance, action = %action, "action abandoned by the server (timeout): killing its executor");
                self.pool.kill(r.proc);
            }
        }
        for a in reply.work {
            // handed out again (after we opened the session again): what we run, hold or
            // have a result for is not started twice
            let id = a.item.action_id;
            let known = self.running.contains_key(&id)
                || self.waiting.iter().any(|w| w.item.action_id == id)
                || self.results.iter().any(|r| r.result.action_id == id)
                || self.sending.iter().any(|r| r.result.action_id == id);
            if !known {
                self.waiting.push_back(a);
            }
        }
        // withdrawn by the server (the agent was paused, the environment halted): what has
        // not started goes back; what runs or ran reports as usual
        for action in reply.withdraw {
            if let Some(i) = self.waiting.iter().position(|a| a.item.action_id == action) {
                let a = self.waiting.remove(i).expect("index in range");
                tracing::info!(instance = %self.instance, action = %action, agent = %a.agent, "action withdrawn by the server before it started");
                self.withdrawn.push(Withdrawal {
                    agent: a.agent,
                    term: a.term,
                    action_id: action,
                });
            }
        }
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
            self.push_result(Report {
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
                    self.push_result(Report {
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
                        environment: item.environment,
                    },
                );
                self.pool.send(proc, item).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = sent {
            self.running.remove(&action_id);
            self.push_result(Report {
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
    if code.digest != digest || code.expected_digest() != digest {
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
        facts: Vec::new(),
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
            inmanta: None,
        };
        let b = serde_json::json!({"code": code, "contents": {"handler.py": hex::encode(sent)}});
        (b, digest)
    }

    #[test]
    fn fetched_inmanta_code_is_checked_with_its_requirements_and_imports() {
        let (mut b, _) = bundle(b"import os", b"import os");
        let mut code: HandlerCode = serde_json::from_value(b["code"].clone()).unwrap();
        code.inmanta = Some(crate::model::InmantaCode {
            requirements: vec!["mitogen".into()],
            imports: vec!["inmanta_plugins.m".into()],
        });
        code.digest = code.expected_digest();
        let digest = code.digest.clone();
        b["code"] = serde_json::to_value(&code).unwrap();
        let (got, _) = verified_code(&b, &digest).unwrap();
        assert_eq!(got.inmanta, code.inmanta);
        // requirements changed on the way: another digest
        b["code"]["inmanta"]["requirements"] = serde_json::json!(["evil"]);
        assert!(
            verified_code(&b, &digest)
                .unwrap_err()
                .contains("another digest")
        );
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
