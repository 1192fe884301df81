//! External agents: `steward agent run` processes on managed machines that connect to the
//! server and run the actions of the agents they host (DESIGN.md §9, the `external`
//! transport of the executor protocol).
//!
//! A process opens a *session* and then polls: a poll carries the results of the actions it
//! finished in and brings new work back (it waits up to [`MAX_POLL_WAIT`] for some). A
//! process keeps one poll waiting for work and sends its results on a second one that does
//! not wait, so results never wait behind a poll that waits for work, and results that finish
//! while one is on its way go together on the next. The server hands out up to [`AHEAD`]
//! actions more than the agent's `agent_parallelism`: the process runs at most
//! `agent_parallelism` at once and starts the next one it holds as soon as a slot frees, so
//! round trips overlap the work. Polls are the heartbeat. When several processes host the
//! same agent, the one holding the agent's lease in PostgreSQL (`store::leases`, renewed by
//! every poll, [`LEASE_MS`] long) is its primary and gets the work; the others are
//! standbys that take the lease over when the primary stops renewing it. Work is handed out
//! with the lease's term and comes back with it: a result whose term is no longer held (a
//! primary that was stopped past its lease, or cut off) is refused, and the action is run
//! again by the new primary. While an agent has no primary its actions wait: queued ones
//! are not started, and ones in flight are handed to whichever process becomes primary
//! (re-run: a handler reads before it changes anything, so a re-run of a finished action
//! changes nothing). A result is taken once, by action id. Actions handed out and not yet
//! started are in flight like running ones: they go to the new primary with the rest, and a
//! deposed process drops them (it starts nothing under a term it no longer holds, nor after
//! its lease may have run out). A process that opens its session again (after a lost
//! connection, or a refusal) gets everything in flight for it again, under its current term
//! (an answer may have been lost on the way); it skips what it runs or has results for, and
//! drops what it held unstarted before (what the server took back while the session was
//! gone, a withdrawal for instance, is not handed out again).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use super::executors::{PoolEvent, ProcId};
use crate::executor::protocol::{Reply, WorkItem, WorkResult};
use crate::store::{self, leases::LeaseKind};

/// How long an agent's primary lease lasts without a renewal (a poll).
pub const LEASE_MS: i64 = 3000;
/// How many actions of an agent are handed out beyond its `agent_parallelism`: they wait in
/// the process for a free slot, so it never waits for a round trip to the server between
/// two actions (results of many go back together). A handler timeout runs from when the
/// process starts the action; the server's backstop allows for the wait (see
/// [`backstop`]).
pub const AHEAD: usize = 16;

/// The server's own deadline for an action handed to an external agent, which enforces
/// `timeout` itself from when it starts it: it may first wait behind the actions ahead of it
/// (at most `AHEAD + parallelism - 1` of them, `parallelism` at a time, each within
/// `timeout`), and this is only a backstop for a process that lost it.
pub fn backstop(timeout: Duration, parallelism: usize) -> Duration {
    let p = parallelism.max(1);
    let rounds = (AHEAD + p - 1).div_ceil(p) as u32;
    timeout * (rounds + 1) + Duration::from_secs(30)
}
/// The longest a poll waits for work before it answers empty (it must come back well
/// within the lease to renew it).
pub const MAX_POLL_WAIT: Duration = Duration::from_millis(1000);
/// Leases are renewed in PostgreSQL at most this often per process (a poll in between uses
/// the terms of the last renewal, which stay ours until it expires): an action does not cost
/// a database write.
const RENEW_EVERY: Duration = Duration::from_millis(1000);
/// A session not heard from for this long is gone.
const SESSION_TIMEOUT: Duration = Duration::from_millis(LEASE_MS as u64 + 2000);

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The session is unknown (expired, or the server restarted): open a new one.
    #[error("unknown agent session {0}: open a new one")]
    UnknownSession(Uuid),
    /// A result's term is no longer held: the process was deposed.
    #[error(
        "agent {agent}: term {term} is no longer held by this process (another process is primary now); its results are refused"
    )]
    Fenced { agent: String, term: i64 },
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// What a process says when it opens a session.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Hello {
    /// The process's identity, stable across its reconnects (it holds leases under it).
    pub instance: Uuid,
    /// The agents it hosts.
    pub agents: Vec<String>,
    /// Its machine's name, for `steward agent list`.
    #[serde(default)]
    pub host: String,
    /// Its Steward version.
    #[serde(default)]
    pub version: String,
}

/// An action handed to a process, under the term of its agent's lease.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Assignment {
    pub agent: String,
    pub term: i64,
    /// At most this many actions of the agent run at once (its `agent_parallelism`): the
    /// server hands out up to [`AHEAD`] more, which the process starts when a slot frees, so
    /// round trips to the server overlap the work.
    #[serde(default = "one")]
    pub run_at_most: usize,
    #[schema(value_type = Object)]
    pub item: WorkItem,
}

fn one() -> usize {
    1
}

/// A finished action, reported with the term it was handed out under.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    pub agent: String,
    pub term: i64,
    #[schema(value_type = Object)]
    pub result: WorkResult,
}

/// An action handed out ahead that the process gives back unstarted: the server withdrew it
/// ([`PollReply::withdraw`]: its agent was paused, or the environment halted), under the
/// term it was handed out with.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Withdrawal {
    pub agent: String,
    pub term: i64,
    pub action_id: Uuid,
}

/// A poll: results in, work out.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Poll {
    #[serde(default)]
    pub results: Vec<Report>,
    /// Actions withdrawn before they started (each is queued again on the server).
    #[serde(default)]
    pub withdrawn: Vec<Withdrawal>,
    /// Milliseconds to wait for work when there is none (at most 1000).
    #[serde(default)]
    pub wait_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PollReply {
    pub work: Vec<Assignment>,
    /// Actions to abandon (their handler overran its timeout): kill their executor.
    pub cancel: Vec<Uuid>,
    /// Actions handed out that must not start if they have not yet: give them back
    /// ([`Poll::withdrawn`]). One already running or done is not affected.
    #[serde(default)]
    pub withdraw: Vec<Uuid>,
    /// The agents this process is primary of, with their terms.
    pub primary: BTreeMap<String, i64>,
    /// How long its leases last at least, in milliseconds from when this poll was sent:
    /// start no new action after that without a successful poll.
    pub lease_ms: i64,
    /// The environment, in the answer to a session's opening (what its handlers'
    /// `get_environment()` answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<EnvIdentity>,
}

/// Which environment an agent process serves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EnvIdentity {
    pub id: Uuid,
    pub name: String,
    pub project_id: Uuid,
    pub project: String,
}

/// A process as `steward agent list` shows it.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionView {
    pub instance: Uuid,
    pub host: String,
    pub version: String,
    pub agents: Vec<String>,
    pub primary: BTreeMap<String, i64>,
    pub connected_at: DateTime<Utc>,
    pub last_heartbeat: DateTime<Utc>,
    pub in_flight: usize,
}

struct Session {
    env: Uuid,
    token: Option<Uuid>,
    hello: Hello,
    primary: BTreeMap<String, i64>,
    connected_at: DateTime<Utc>,
    last_seen: Instant,
    last_seen_at: DateTime<Utc>,
    /// when the leases were last renewed (the renewal's start: the lease runs from then)
    renewed: Option<Instant>,
    outbox: Vec<Assignment>,
    cancels: Vec<Uuid>,
    withdraws: Vec<Uuid>,
    wake: Arc<Notify>,
}

struct InFlight {
    env: Uuid,
    agent: String,
    proc: ProcId,
    item: WorkItem,
    run_at_most: usize,
    /// the session and term it was handed to; None while the agent has no primary
    holder: Option<(Uuid, i64)>,
    /// withdrawn by the server: whoever holds it gives it back unless it started it
    withdrawing: bool,
}

#[derive(Default)]
struct State {
    sessions: HashMap<Uuid, Session>,
    inflight: HashMap<Uuid, InFlight>,
    /// each environment scheduler's executor events
    envs: HashMap<Uuid, mpsc::UnboundedSender<PoolEvent>>,
}

/// The server's side of all external agent sessions (cheap to clone).
#[derive(Clone)]
pub struct AgentHub {
    pool: PgPool,
    state: Arc<Mutex<State>>,
}

/// Most agents one agent process may host (one session): each is a lease renewed every
/// second.
pub const MAX_SESSION_AGENTS: usize = 1000;

/// The agents a process names: at most [`MAX_SESSION_AGENTS`], each a name people can read
/// (1 to 255 characters, no control or bidirectional-override character), none twice.
fn check_agent_names(agents: &[String]) -> Result<(), HubError> {
    if agents.len() > MAX_SESSION_AGENTS {
        return Err(HubError::Invalid(format!(
            "an agent process may host at most {MAX_SESSION_AGENTS} agents ({} named)",
            agents.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for a in agents {
        store::tokens::check_label("agent name", a, store::tokens::MAX_AGENT_NAME_CHARS).map_err(
            |e| match e {
                store::StoreError::Invalid(m) => HubError::Invalid(m),
                other => HubError::Store(other),
            },
        )?;
        if !seen.insert(a.as_str()) {
            return Err(HubError::Invalid(format!("agent '{a}' is named twice")));
        }
    }
    Ok(())
}

fn lease_key(env: Uuid, agent: &str) -> String {
    format!("{env}/{agent}")
}

impl AgentHub {
    pub fn new(pool: PgPool) -> AgentHub {
        let hub = AgentHub {
            pool,
            state: Arc::new(Mutex::new(State::default())),
        };
        let h = hub.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                h.drop_silent_sessions();
            }
        });
        hub
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An environment's scheduler receives its external results here.
    pub fn attach(&self, env: Uuid, events: mpsc::UnboundedSender<PoolEvent>) {
        self.lock().envs.insert(env, events);
    }

    /// Open (or reopen, after a reconnect) a session. `allowed`: the agents the caller's
    /// token may host (None: any).
    pub async fn open(
        &self,
        env: Uuid,
        token: Option<Uuid>,
        allowed: Option<&[String]>,
        hello: Hello,
    ) -> Result<PollReply, HubError> {
        if hello.agents.is_empty() {
            return Err(HubError::Invalid("name at least one agent to host".into()));
        }
        check_agent_names(&hello.agents)?;
        if let Some(allowed) = allowed
            && let Some(a) = hello.agents.iter().find(|a| !allowed.contains(a))
        {
            return Err(HubError::Forbidden(format!(
                "this token may not host agent '{a}' (it may host: {})",
                allowed.join(", ")
            )));
        }
        let instance = hello.instance;
        {
            let mut st = self.lock();
            if let Some(s) = st.sessions.get(&instance)
                && (s.env != env || s.token != token)
            {
                return Err(HubError::Forbidden(
                    "this instance id belongs to another environment or token".into(),
                ));
            }
            let now = Utc::now();
            let previous = st.sessions.remove(&instance);
            st.sessions.insert(
                instance,
                Session {
                    env,
                    token,
                    hello,
                    primary: previous
                        .as_ref()
                        .map(|p| p.primary.clone())
                        .unwrap_or_default(),
                    connected_at: now,
                    last_seen: Instant::now(),
                    last_seen_at: now,
                    renewed: None,
                    outbox: previous
                        .as_ref()
                        .map(|p| p.outbox.clone())
                        .unwrap_or_default(),
                    cancels: Vec::new(),
                    withdraws: Vec::new(),
                    wake: previous
                        .map(|p| p.wake)
                        .unwrap_or_else(|| Arc::new(Notify::new())),
                },
            );
        }
        {
            // everything in flight for this process is handed out again (to it, when it is
            // still primary under the same term: it skips what it has; an answer may have
            // been lost with the connection)
            let mut st = self.lock();
            for f in st.inflight.values_mut() {
                if f.env == env && f.holder.is_some_and(|(i, _)| i == instance) {
                    f.holder = None;
                }
            }
            if let Some(s) = st.sessions.get_mut(&instance) {
                s.outbox.clear();
            }
        }
        tracing::info!(environment = %env, instance = %instance, "agent process connected");
        self.poll(env, instance, token, Poll::default()).await
    }

    /// Take results, renew the leases, hand out work.
    pub async fn poll(
        &self,
        env: Uuid,
        instance: Uuid,
        token: Option<Uuid>,
        poll: Poll,
    ) -> Result<PollReply, HubError> {
        let (agents, cached) = {
            let mut st = self.lock();
            let s = st
                .sessions
                .get_mut(&instance)
                .filter(|s| s.env == env && s.token == token)
                .ok_or(HubError::UnknownSession(instance))?;
            s.last_seen = Instant::now();
            s.last_seen_at = Utc::now();
            let fresh = s.renewed.is_some_and(|t| t.elapsed() < RENEW_EVERY);
            (
                s.hello.agents.clone(),
                fresh.then(|| (s.primary.clone(), s.renewed)),
            )
        };
        // the heartbeat: renew or take every agent's lease in one statement (at most every
        // RENEW_EVERY)
        let renewing = Instant::now();
        let mut primary = BTreeMap::new();
        if cached.is_none() {
            let keys: Vec<String> = agents.iter().map(|a| lease_key(env, a)).collect();
            let held = store::leases::acquire_many(
                &self.pool,
                LeaseKind::AgentPrimary,
                &keys,
                &instance.to_string(),
                LEASE_MS,
            )
            .await?;
            let prefix = format!("{env}/");
            for (key, term) in held {
                if let Some(agent) = key.strip_prefix(&prefix) {
                    primary.insert(agent.to_string(), term);
                }
            }
        }
        let renewed = cached.is_none();
        // the leases run from the start of their last renewal: what is left of them now
        // (less than LEASE_MS when this poll uses an earlier renewal) is what the process,
        // counting from when it sent the poll, may use
        let since = match &cached {
            Some((_, Some(at))) => at.elapsed(),
            _ => renewing.elapsed(),
        };
        let lease_ms = (LEASE_MS - since.as_millis() as i64).max(0);
        if let Some((c, _)) = cached {
            primary = c;
        }
        // fencing: every result (and every action given back) must come under a term this
        // process holds now
        let reported = poll.results.iter().map(|r| (&r.agent, r.term));
        let given_back = poll.withdrawn.iter().map(|w| (&w.agent, w.term));
        for (agent, term) in reported.chain(given_back) {
            if !agents.contains(agent) {
                return Err(HubError::Forbidden(format!(
                    "this process does not host agent '{agent}'"
                )));
            }
            if primary.get(agent) != Some(&term) {
                tracing::warn!(environment = %env, instance = %instance, agent = %agent, term,
                    "results of a deposed agent process refused");
                return Err(HubError::Fenced {
                    agent: agent.clone(),
                    term,
                });
            }
        }
        let wake = {
            let mut st = self.lock();
            let Some(s) = st.sessions.get_mut(&instance) else {
                return Err(HubError::UnknownSession(instance));
            };
            let newly: Vec<(String, i64)> = primary
                .iter()
                .filter(|(a, t)| s.primary.get(*a) != Some(t))
                .map(|(a, t)| (a.clone(), *t))
                .collect();
            s.primary = primary.clone();
            if renewed {
                s.renewed = Some(renewing);
            }
            let wake = s.wake.clone();
            for r in poll.results {
                self.accept(&mut st, env, r);
            }
            for w in poll.withdrawn {
                Self::given_back(&mut st, env, &w.agent, w.action_id);
            }
            for (agent, term) in &newly {
                tracing::info!(environment = %env, instance = %instance, agent = %agent, term, "agent process is primary");
            }
            // the primary gets what is in flight for its agent under an older term (a
            // predecessor that died, was stopped or cut off) or with no holder yet
            let live: std::collections::HashSet<Uuid> = st.sessions.keys().copied().collect();
            for (agent, term) in primary.clone() {
                let mut withdrawn = Vec::new();
                let moved: Vec<Assignment> = st
                    .inflight
                    .values_mut()
                    .filter(|f| f.env == env && f.agent == agent)
                    .filter(|f| {
                        f.holder
                            .is_none_or(|(i, t)| t < term || (i != instance && !live.contains(&i)))
                    })
                    .map(|f| {
                        f.holder = Some((instance, term));
                        // withdrawn meanwhile (or the withdrawal was lost with a connection)
                        if f.withdrawing {
                            withdrawn.push(f.item.action_id);
                        }
                        Assignment {
                            agent: agent.clone(),
                            term,
                            run_at_most: f.run_at_most,
                            item: f.item.clone(),
                        }
                    })
                    .collect();
                if !moved.is_empty()
                    && let Some(s) = st.sessions.get_mut(&instance)
                {
                    tracing::info!(environment = %env, instance = %instance, agent = %agent, term, actions = moved.len(),
                        "actions in flight handed to the primary");
                    s.outbox.extend(moved);
                    s.withdraws.extend(withdrawn);
                }
            }
            wake
        };
        let deadline = Instant::now() + Duration::from_millis(poll.wait_ms).min(MAX_POLL_WAIT);
        loop {
            let notified = wake.notified();
            {
                let mut st = self.lock();
                let Some(s) = st.sessions.get_mut(&instance) else {
                    return Err(HubError::UnknownSession(instance));
                };
                // work only under a term this process holds now (a deposed process's
                // leftovers stay in flight and go to the new primary)
                let primary = s.primary.clone();
                s.outbox.retain(|a| primary.get(&a.agent) == Some(&a.term));
                if !s.outbox.is_empty()
                    || !s.cancels.is_empty()
                    || !s.withdraws.is_empty()
                    || Instant::now() >= deadline
                {
                    return Ok(PollReply {
                        work: std::mem::take(&mut s.outbox),
                        cancel: std::mem::take(&mut s.cancels),
                        withdraw: std::mem::take(&mut s.withdraws),
                        primary: s.primary.clone(),
                        lease_ms,
                        environment: None,
                    });
                }
            }
            let _ = tokio::time::timeout_at(deadline.into(), notified).await;
        }
    }

    /// A result, once: to the scheduler whose action it is.
    fn accept(&self, st: &mut State, env: Uuid, r: Report) {
        let Some(f) = st.inflight.get(&r.result.action_id) else {
            // reported already, abandoned, or from before a restart: never twice
            return;
        };
        if f.env != env || f.agent != r.agent {
            return;
        }
        let f = st.inflight.remove(&r.result.action_id).expect("present");
        if let Some(tx) = st.envs.get(&env) {
            let _ = tx.send(PoolEvent::Reply(f.proc, Reply::Result(Box::new(r.result))));
        }
    }

    /// An action given back unstarted, once: its scheduler queues it again.
    fn given_back(st: &mut State, env: Uuid, agent: &str, action_id: Uuid) {
        if !st
            .inflight
            .get(&action_id)
            .is_some_and(|f| f.env == env && f.agent == agent)
        {
            // reported already, abandoned, or from before a restart
            return;
        }
        let f = st.inflight.remove(&action_id).expect("present");
        if let Some(tx) = st.envs.get(&env) {
            let _ = tx.send(PoolEvent::Reply(f.proc, Reply::Withdrawn { action_id }));
        }
    }

    /// Withdraw an action handed out (its agent was paused, or the environment halted): one
    /// not delivered yet comes back at once; a process that holds it gives it back unless it
    /// started it (then its result comes as usual). False if it is not in flight.
    pub fn withdraw(&self, action_id: Uuid) -> bool {
        let mut st = self.lock();
        let Some(f) = st.inflight.get_mut(&action_id) else {
            return false;
        };
        f.withdrawing = true;
        let (env, agent, holder) = (f.env, f.agent.clone(), f.holder);
        let undelivered = match holder.and_then(|(i, _)| st.sessions.get_mut(&i)) {
            Some(s) => {
                let before = s.outbox.len();
                s.outbox.retain(|a| a.item.action_id != action_id);
                if s.outbox.len() == before {
                    s.withdraws.push(action_id);
                    s.wake.notify_waiters();
                    false
                } else {
                    true
                }
            }
            // no process holds it
            None => true,
        };
        if undelivered {
            Self::given_back(&mut st, env, &agent, action_id);
        }
        true
    }

    /// Close a session (a process that stops): its leases go at once to a standby.
    pub async fn close(
        &self,
        env: Uuid,
        instance: Uuid,
        token: Option<Uuid>,
    ) -> Result<(), HubError> {
        let agents = {
            let mut st = self.lock();
            match st.sessions.get(&instance) {
                Some(s) if s.env == env && s.token == token => {}
                _ => return Err(HubError::UnknownSession(instance)),
            }
            let s = st.sessions.remove(&instance).expect("present");
            s.wake.notify_waiters();
            s.hello.agents
        };
        self.release_leases(env, &agents, instance).await?;
        tracing::info!(environment = %env, instance = %instance, "agent process disconnected");
        Ok(())
    }

    /// Give back the leases of a process that stops (see [`store::leases::release_agents`]).
    async fn release_leases(
        &self,
        env: Uuid,
        agents: &[String],
        instance: Uuid,
    ) -> Result<(), HubError> {
        let mut c = self.pool.acquire().await.map_err(store::StoreError::from)?;
        store::leases::release_agents(&mut c, env, agents, &instance.to_string()).await?;
        Ok(())
    }

    /// A token was revoked: its processes are disconnected now and their leases freed.
    pub async fn revoke(&self, token: Uuid) {
        for (instance, env) in self.disconnect(|s| s.token == Some(token)).await {
            tracing::info!(environment = %env, instance = %instance, "agent process disconnected: its token was revoked");
        }
    }

    /// The environment moved to another replica: its processes are disconnected here (their
    /// next call reaches the new owner and opens a session there) and their leases freed.
    pub async fn drop_environment(&self, env: Uuid) {
        {
            let mut st = self.lock();
            st.envs.remove(&env);
            st.inflight.retain(|_, f| f.env != env);
        }
        self.disconnect(|s| s.env == env).await;
    }

    /// End the sessions `which` picks (their pollers wake and hear of it), then free their
    /// agents' leases; the (instance, environment) of each.
    async fn disconnect(&self, which: impl Fn(&Session) -> bool) -> Vec<(Uuid, Uuid)> {
        let gone: Vec<(Uuid, Uuid, Vec<String>)> = {
            let mut st = self.lock();
            let ids: Vec<Uuid> = st
                .sessions
                .iter()
                .filter(|(_, s)| which(s))
                .map(|(i, _)| *i)
                .collect();
            ids.into_iter()
                .filter_map(|i| st.sessions.remove(&i).map(|s| (i, s)))
                .map(|(i, s)| {
                    s.wake.notify_waiters();
                    (i, s.env, s.hello.agents)
                })
                .collect()
        };
        let mut ended = Vec::new();
        for (instance, env, agents) in gone {
            let _ = self.release_leases(env, &agents, instance).await;
            ended.push((instance, env));
        }
        ended
    }

    fn drop_silent_sessions(&self) {
        let mut st = self.lock();
        let silent: Vec<Uuid> = st
            .sessions
            .iter()
            .filter(|(_, s)| s.last_seen.elapsed() > SESSION_TIMEOUT)
            .map(|(i, _)| *i)
            .collect();
        for i in silent {
            if let Some(s) = st.sessions.remove(&i) {
                tracing::warn!(environment = %s.env, instance = %i, "agent process went silent: disconnected");
                s.wake.notify_waiters();
            }
        }
    }

    /// The live process that is primary of `agent`, if any: of the processes that think
    /// they are (one may not know yet that it was deposed), the one with the newest term.
    fn primary_of(st: &State, env: Uuid, agent: &str) -> Option<(Uuid, i64)> {
        st.sessions
            .iter()
            .filter(|(_, s)| {
                s.env == env && s.last_seen.elapsed() < Duration::from_millis(LEASE_MS as u64)
            })
            .filter_map(|(i, s)| s.primary.get(agent).map(|t| (*i, *t)))
            .max_by_key(|(_, t)| *t)
    }

    /// Is `instance` a session of `env`?
    pub fn has_session(&self, env: Uuid, instance: Uuid) -> bool {
        self.lock()
            .sessions
            .get(&instance)
            .is_some_and(|s| s.env == env)
    }

    /// Can `agent` take work now (it has a live primary)?
    pub fn is_up(&self, env: Uuid, agent: &str) -> bool {
        Self::primary_of(&self.lock(), env, agent).is_some()
    }

    /// Wake the polls of `env`'s processes that have work waiting: called once after a
    /// scheduler handed out what it could ([`AgentHub::assign`]), so that a poll takes it
    /// all at once rather than the first action alone.
    pub fn wake(&self, env: Uuid) {
        let st = self.lock();
        for s in st.sessions.values() {
            if s.env == env && !s.outbox.is_empty() {
                s.wake.notify_waiters();
            }
        }
    }

    /// Hand an action to the agent's primary (or hold it until there is one); the process
    /// hears of it at the next [`AgentHub::wake`].
    pub fn assign(&self, env: Uuid, agent: &str, proc: ProcId, item: WorkItem, run_at_most: usize) {
        let mut st = self.lock();
        let holder = Self::primary_of(&st, env, agent);
        let action_id = item.action_id;
        if let Some((instance, term)) = holder
            && let Some(s) = st.sessions.get_mut(&instance)
        {
            s.outbox.push(Assignment {
                agent: agent.to_string(),
                term,
                run_at_most,
                item: item.clone(),
            });
        }
        st.inflight.insert(
            action_id,
            InFlight {
                env,
                agent: agent.to_string(),
                proc,
                item,
                run_at_most,
                holder,
                withdrawing: false,
            },
        );
    }

    /// Abandon an action (its handler overran the timeout): the process kills its executor.
    pub fn cancel(&self, action_id: Uuid) {
        let mut st = self.lock();
        if let Some(f) = st.inflight.remove(&action_id)
            && let Some((instance, _)) = f.holder
            && let Some(s) = st.sessions.get_mut(&instance)
        {
            s.outbox.retain(|a| a.item.action_id != action_id);
            s.cancels.push(action_id);
            s.wake.notify_waiters();
        }
    }

    /// The processes connected for an environment.
    pub fn sessions(&self, env: Uuid) -> Vec<SessionView> {
        let st = self.lock();
        let mut v: Vec<SessionView> = st
            .sessions
            .iter()
            .filter(|(_, s)| s.env == env)
            .map(|(i, s)| SessionView {
                instance: *i,
                host: s.hello.host.clone(),
                version: s.hello.version.clone(),
                agents: s.hello.agents.clone(),
                // a process silent past its lease is primary of nothing, whatever it thinks
                primary: if s.last_seen.elapsed() < Duration::from_millis(LEASE_MS as u64) {
                    s.primary.clone()
                } else {
                    BTreeMap::new()
                },
                connected_at: s.connected_at,
                last_heartbeat: s.last_seen_at,
                in_flight: st
                    .inflight
                    .values()
                    .filter(|f| f.holder.is_some_and(|(h, _)| h == *i))
                    .count(),
            })
            .collect();
        v.sort_by_key(|s| s.connected_at);
        v
    }
}
