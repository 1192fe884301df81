//! The scheduler of one environment: a task that owns the model, the work queue, the timers
//! and the executor pool, and reacts to releases, user requests, executor results and time.
//! State is rebuilt from PostgreSQL when it starts; every change it makes is written back in
//! batches by a writer task that retries until the database takes them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot, watch};
use uuid::Uuid;

mod calls;
mod control;
mod deletes;
mod dispatch;
mod facts;
mod intents;
mod isolation;
mod persist;
mod timing;

use super::code::CodeCache;
use super::executors::{Pool, ProcId};
use super::model::{Intent, Model, RState};
use super::queue::{Priority, Queue, TaskKey};
use super::snapshot::{Coming, Snapshot};
use super::timers::Timers;
use crate::executor::protocol::ActionKind;
use crate::model::HandlerCode;
use crate::model::settings::EnvSettings;
use crate::replicas::Tenure;
use crate::store;
use crate::store::actions::ActionRecord;
use crate::store::deploy::Batch;
pub(super) use persist::StoredRows;
use persist::{Written, writer};
pub(super) use persist::{parse_outcome, state_from_row};

/// A start arms the resources' timers once its first deploys ended, and at the latest this
/// long after it (a long first deploy does not hold up a due retry for long).
const TIMERS_AT_THE_LATEST: Duration = Duration::from_secs(2);

/// How long after its start a scheduler reads the attributes its start left unread, all
/// at once (a repair sweep of 100,000 resources would read them one by one).
const UNREAD_AFTER: Duration = Duration::from_secs(5);

/// The action-log label of a removed resource's delete (`delete_removed_resources`).
const DELETE_LABEL: &str = "delete";

/// A start that dispatched nothing arms its timers no sooner than this: the version it was
/// started for usually comes right after (`steward deploy` releases its upload ~50 ms after
/// the runtime serves), and at 100,000 resources arming took 80-240 ms beside its deploy.
const TIMERS_WHEN_IDLE: Duration = Duration::from_millis(300);

/// How many resources' timers a turn of the loop arms (100,000 resources: ~14 ms a part).
const TIMERS_PER_TURN: usize = 10_000;

/// Where a start is in arming its resources' timers.
#[derive(Clone, Copy, Debug)]
enum Arming {
    /// not yet: once nothing runs (and not before the first of these times), or at the
    /// second
    Later(tokio::time::Instant, tokio::time::Instant),
    /// the next part begins at this resource of the model of this version (another
    /// version's model begins again at the first: its resources moved)
    From {
        next: usize,
        version: Option<i32>,
        began: std::time::Instant,
    },
    Done,
}

/// The stored states a start builds its model with: as read from the database (rows by
/// resource), or from a snapshot (each already read, at its resource's place).
pub(super) enum StoredStates {
    ById(HashMap<String, store::deploy::StateRow>),
    Read(Vec<Option<RState>>),
}

/// What the rest of the server asks of a scheduler.
pub enum Control {
    Released(i32),
    Settings,
    /// deploy (dirty ∩ filter) or repair (all unblocked ∩ filter); answers the number scheduled
    Trigger {
        repair: bool,
        agent: Option<String>,
        resource: Option<String>,
        ack: oneshot::Sender<usize>,
    },
    Dryrun {
        id: Uuid,
        version: i32,
    },
    /// a pull-request preview's dry-run (its resources are in the database)
    DryrunPreview {
        id: Uuid,
    },
    /// answers once no new action of the agent can start
    Pause {
        agent: String,
        paused: bool,
        ack: oneshot::Sender<()>,
    },
    Halt {
        halted: bool,
        ack: oneshot::Sender<()>,
    },
    Status(oneshot::Sender<Status>),
    /// The counts per status of the resources of a version (answers None when the model is
    /// of another version): see [`SettledCounts`].
    Counts {
        version: i32,
        ack: oneshot::Sender<Option<SettledCounts>>,
    },
    Stop,
    /// Stop, and answer with what the next start may read instead of the database
    /// ([`Snapshot`]), when this stop leaves one (see [`EnvScheduler::run`]).
    StopWithSnapshot,
}

/// What a scheduler counted of its version's resources per status (as
/// `store::state::status_counts` would count its rows), with how far its writer must get for
/// the database to hold what was counted.
pub struct SettledCounts {
    counts: Vec<(String, i64)>,
    handed: u64,
    written: watch::Receiver<Written>,
}

impl SettledCounts {
    /// The counts, once the database holds the states they were counted from (before
    /// `deadline`; None if it did not, or a batch was not written as it was handed over).
    pub async fn stored_by(mut self, deadline: tokio::time::Instant) -> Option<Vec<(String, i64)>> {
        let handed = self.handed;
        let reached = tokio::time::timeout_at(
            deadline,
            self.written.wait_for(|w| !w.exact || w.batches >= handed),
        )
        .await
        .ok()?
        .ok()
        .map(|w| *w)?;
        (reached.exact && reached.batches >= handed).then_some(self.counts)
    }
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct AgentStatus {
    pub name: String,
    pub paused: bool,
    pub queued: usize,
    pub running: usize,
    pub executors: Vec<u32>,
    /// where its executor runs: local:, external or ssh://…
    pub placement: String,
    /// it can take work (an external agent needs a connected primary)
    pub ready: bool,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Status {
    pub version: Option<i32>,
    pub halted: bool,
    pub agents: Vec<AgentStatus>,
    pub dirty: usize,
    pub queued: usize,
    pub running: usize,
    /// Handlers asked for facts since the scheduler started (renewals, missing facts).
    #[serde(default)]
    pub fact_requests: u64,
}

struct RunInfo {
    proc: ProcId,
    action_id: Uuid,
    started: DateTime<Utc>,
    deadline: tokio::time::Instant,
    version: i32,
    kind: ActionKind,
    /// what the action log calls it: deploy, repair, delete or dryrun
    label: &'static str,
    /// Sent to an executor still busy with an action before it: it waits in the
    /// executor's input, and starts when the one before it ends. Until then it is not
    /// deploying, and if the executor dies first it never ran (it is queued again).
    waiting: bool,
    /// Asked back from its executor while it waited (its agent was paused, or the
    /// environment halted): whether it starts anyway (it had already) or comes back
    /// unstarted ([`crate::executor::protocol::Reply::Withdrawn`]) is the executor's to say.
    withdrawing: bool,
    /// A deploy's "started" record, written when it starts (a waiting one's, later).
    start_record: Option<Box<ActionRecord>>,
}

impl RunInfo {
    /// A deploy that has started on its target (what a state row's `deploying_since` says).
    fn deploys_now(&self) -> bool {
        self.kind == ActionKind::Deploy && !self.waiting
    }

    /// Whether this is the delete of a resource removed from the model (its label says so
    /// in the action log too).
    fn is_delete(&self) -> bool {
        self.label == DELETE_LABEL
    }
}

struct DryrunCtx {
    version: i32,
    intents: HashMap<String, Intent>,
    handlers: BTreeMap<String, HandlerCode>,
}

pub struct EnvScheduler {
    env: Uuid,
    pool: PgPool,
    settings: EnvSettings,
    model: Model,
    queue: Queue,
    timers: Timers,
    executors: Pool,
    running: HashMap<TaskKey, RunInfo>,
    paused: HashSet<String>,
    halted: bool,
    batch: Batch,
    dirty_states: HashSet<String>,
    /// which resources have a state row (rows that say nothing are not written where none is)
    stored_rows: StoredRows,
    writer: mpsc::UnboundedSender<Batch>,
    /// batches handed to the writer so far
    handed: u64,
    /// how far the writer got
    written: watch::Receiver<Written>,
    dryruns: HashMap<Uuid, DryrunCtx>,
    /// removed resources to delete on their target (`delete_removed_resources`), by id
    tombstones: HashMap<String, deletes::Tombstone>,
    /// resource type -> module handler code, for the model's version
    handlers: BTreeMap<String, HandlerCode>,
    code: CodeCache,
    /// Where every environment's handler code goes (this one's is a directory in it).
    code_root: PathBuf,
    /// The executors' sandbox is prepared ([`EnvScheduler::prepare_sandbox`]).
    sandboxed: bool,
    next_deploy_sweep: Option<DateTime<Utc>>,
    next_repair_sweep: Option<DateTime<Utc>>,
    /// a repair sweep was pre-empted by new intent: run it again once that deployed
    repair_pending: bool,
    /// versions with deploys started and not all done: when one is, the executors hear of it
    /// (handlers drop what they cached for that version)
    open_versions: std::collections::BTreeSet<i32>,
    /// this replica's lease on the environment (None: the process owns everything)
    tenure: Option<Tenure>,
    /// what keeps the model's facts fresh
    facts: facts::FactRefresh,
    /// the server's events (facts a handler's call wrote go out on it)
    notifier: crate::events::Notifier,
    /// the attributes of the model's resources being read after the start, by hash
    /// ([`EnvScheduler::read_unread_later`])
    unread: Option<UnreadAttributes>,
    /// The model's attributes are still to be read after the start, in one read that
    /// begins then ([`EnvScheduler::read_unread_later`]; until it arrives, what needs
    /// attributes reads its own).
    unread_later: Option<tokio::time::Instant>,
    /// What the last scheduler of the environment left when it stopped, for the start to
    /// read instead of the database (taken by [`EnvScheduler::restore`]).
    warm: Option<Coming>,
}

type UnreadAttributes = tokio::task::JoinHandle<
    Result<std::collections::HashMap<String, store::versions::StoredAttributes>, store::StoreError>,
>;

/// What an environment's scheduler uses that the whole server shares.
pub struct Links {
    /// The `steward executor` binary.
    pub executor_bin: PathBuf,
    /// Where handler code is unpacked.
    pub code_dir: PathBuf,
    /// The external agents' connections.
    pub hub: super::agents::AgentHub,
    /// The server's events (facts that arrived go out on it).
    pub notifier: crate::events::Notifier,
}

/// The model of version `v` from its intents and the stored states (rows of resources
/// outside the model are orphans'; a snapshot holds none), and what is known of the rows.
pub(super) fn build_model(v: i32, intents: Vec<Intent>, rows: StoredStates) -> (Model, StoredRows) {
    let (states, orphans): (Vec<Option<RState>>, _) = match rows {
        StoredStates::Read(states) => (states, None),
        StoredStates::ById(mut rows) => {
            let states = intents
                .iter()
                .map(|i| rows.remove(&i.id).map(state_from_row))
                .collect();
            (states, Some(rows.into_keys().collect()))
        }
    };
    let missing = intents
        .iter()
        .zip(&states)
        .filter(|(_, s)| s.is_none())
        .map(|(i, _)| i.id.clone())
        .collect();
    (
        Model::restore(v, intents, states),
        StoredRows::known(missing, orphans),
    )
}

impl EnvScheduler {
    /// Rebuild from the database (or from `warm`, what the last scheduler of the
    /// environment left, when it holds the version the database says was processed) and run
    /// until stopped. A stop asked with [`Control::StopWithSnapshot`] answers with a
    /// [`Snapshot`] when the database holds exactly what it says: nothing was running,
    /// no dry-run open, every state handed to the writer written as it was, and no lease
    /// (a replica's environment is another's next).
    pub async fn run(
        env: Uuid,
        pool: PgPool,
        links: Links,
        mut control: mpsc::UnboundedReceiver<Control>,
        tenure: Option<Tenure>,
        warm: Option<Coming>,
    ) -> Option<Snapshot> {
        let Links {
            executor_bin,
            code_dir,
            hub,
            notifier,
        } = links;
        let (exec_pool, mut pool_rx) = Pool::new(executor_bin, 64);
        let exec_pool = exec_pool.with_hub(env, hub);
        let (wtx, wrx) = mpsc::unbounded_channel();
        let (progress_tx, progress_rx) = watch::channel(Written::default());
        let written = tokio::spawn(writer(
            pool.clone(),
            env,
            wrx,
            tenure.as_ref().map(|t| t.fence().clone()),
            notifier.clone(),
            progress_tx,
        ));
        let mut s = EnvScheduler {
            env,
            pool,
            settings: EnvSettings::default(),
            model: Model::default(),
            queue: Queue::default(),
            timers: Timers::default(),
            executors: exec_pool,
            running: HashMap::new(),
            paused: HashSet::new(),
            halted: false,
            batch: Batch::default(),
            dirty_states: HashSet::new(),
            stored_rows: StoredRows::default(),
            writer: wtx,
            handed: 0,
            written: progress_rx,
            dryruns: HashMap::new(),
            tombstones: HashMap::new(),
            handlers: BTreeMap::new(),
            code: CodeCache::new(code_dir.clone()),
            code_root: code_dir,
            sandboxed: false,
            next_deploy_sweep: None,
            next_repair_sweep: None,
            repair_pending: false,
            open_versions: Default::default(),
            tenure,
            facts: Default::default(),
            notifier,
            unread: None,
            unread_later: None,
            warm,
        };
        // the database may be away at start: keep trying
        // (and the executors' sandbox must be ready before any of them starts)
        let mut delay = Duration::from_millis(200);
        loop {
            let started = match s.prepare_sandbox().await {
                Ok(()) => s.restore().await.map_err(|e| e.to_string()),
                Err(e) => Err(format!("preparing the executors' sandbox: {e}")),
            };
            match started {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(environment = %env, error = %e, "scheduler start failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        let mut flush_tick = tokio::time::interval(Duration::from_millis(25));
        flush_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reap_tick = tokio::time::interval(Duration::from_secs(30));
        let mut snapshot_wanted = false;
        // every resource's repair or retry timer is armed once what the start dispatched has
        // ended and its state is handed to the writer (or after TIMERS_AT_THE_LATEST), a
        // part per turn of the loop: a start that merged a new version (`steward deploy`
        // after an edit) deploys and stores it first, and answers meanwhile (100,000
        // resources: arming takes 115-140 ms, which stood before the changed file was
        // written, then before its state was and the progress was answered). A deploy
        // queued or running gets no timer either way; due ones fire in the loop's next turn
        let now = tokio::time::Instant::now();
        let mut arming = Arming::Later(now + TIMERS_WHEN_IDLE, now + TIMERS_AT_THE_LATEST);
        loop {
            let wake = s.next_wake();
            tokio::select! {
                c = control.recv() => match c {
                    None | Some(Control::Stop) => break,
                    Some(Control::StopWithSnapshot) => {
                        snapshot_wanted = true;
                        break;
                    }
                    Some(c) => s.on_control(c).await,
                },
                Some(ev) = pool_rx.recv() => {
                    // all that came in together (an agent's poll brings several results),
                    // then one dispatch
                    let mut events = vec![ev];
                    while let Ok(ev) = pool_rx.try_recv() {
                        events.push(ev);
                    }
                    // (a result's events read other resources' flags)
                    s.read_for_results(&events).await;
                    for ev in events {
                        s.on_pool_event(ev);
                    }
                }
                _ = tokio::time::sleep_until(wake) => {},
                _ = flush_tick.tick() => {},
                _ = reap_tick.tick() => s.executors.reap(Duration::from_secs(60)),
                // the next part of the timers, after what else waits
                _ = tokio::task::yield_now(), if matches!(arming, Arming::From { .. }) => {},
            }
            s.on_time(Utc::now()).await;
            s.refresh_facts().await;
            s.dispatch().await;
            s.executors.send_answers().await;
            s.executors.wake_agents();
            s.flush();
            arming = s.arm_timers_part(arming).await;
            if s.unread_later
                .is_some_and(|at| at <= tokio::time::Instant::now())
            {
                s.read_unread_later();
            }
        }
        // a read of every attribute still under way is of no use any more
        if let Some(reading) = s.unread.take() {
            reading.abort();
        }
        if s.tenure.is_none() {
            s.executors.shutdown();
        } else {
            // the environment moves to another replica: nothing of ours may still run or
            // write when it starts there, so executors get a moment to finish, then are
            // killed, and what was recorded is written (still under our lease) before we say
            // we stopped
            s.executors
                .shutdown_and_wait(Duration::from_millis(500))
                .await;
        }
        // what was recorded is written before the task ends: whoever waits for it (a
        // handover, `steward deploy` stopping its database) finds it stored
        s.flush();
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut s.writer, closed));
        let all_written = match tokio::time::timeout(Duration::from_secs(3), written).await {
            Ok(Ok(())) => s.written.borrow().exact,
            Ok(Err(_)) => false,
            Err(_) => {
                tracing::warn!(environment = %env, "the last deploy state was not written in time; the next scheduler of the environment redoes what it misses");
                false
            }
        };
        if !snapshot_wanted {
            return None;
        }
        let why_not = if !all_written {
            Some("not every state was written as it was handed over")
        } else if !s.running.is_empty() {
            Some("actions were running")
        } else if !s.dryruns.is_empty() {
            Some("a dry-run was open")
        } else if s.tenure.is_some() {
            Some("the environment is leased")
        } else if s.model.version.is_none() {
            Some("no version was merged")
        } else {
            None
        };
        match why_not {
            Some(why) => {
                tracing::debug!(environment = %env, why, "no snapshot of the scheduler");
                None
            }
            None => Some(s.snapshot()),
        }
    }

    /// The rows the next start would read (see [`Snapshot`]).
    fn snapshot(&self) -> Snapshot {
        let resources = self
            .model
            .intents
            .iter()
            .map(|i| Intent {
                id: i.id.clone(),
                type_name: i.type_name.clone(),
                agent: i.agent.clone(),
                hash: i.hash.clone(),
                // a start reads them after it, as a start from the database does
                attributes: super::model::Attributes::unread(),
                requires: i.requires.clone(),
                undefined: i.undefined,
            })
            .collect();
        // what a start reads from the rows the database holds: none for a resource that
        // has none
        let states = (0..self.model.len())
            .map(|r| {
                (!self.stored_rows.is_missing(&self.model.intents[r].id))
                    .then(|| Snapshot::read_state(self.state_row(r)))
            })
            .collect();
        Snapshot {
            env: self.env,
            version: self.model.version.unwrap_or_default(),
            resources,
            states,
        }
    }

    fn next_wake(&mut self) -> tokio::time::Instant {
        let now_i = tokio::time::Instant::now();
        let now = Utc::now();
        let mut wake = now_i + Duration::from_secs(60);
        let mut consider = |t: Option<DateTime<Utc>>| {
            if let Some(t) = t {
                let d = (t - now).to_std().unwrap_or(Duration::ZERO);
                wake = wake.min(now_i + d);
            }
        };
        consider(self.timers.next_due());
        consider(self.next_deploy_sweep);
        consider(self.next_repair_sweep);
        for r in self.running.values() {
            wake = wake.min(r.deadline);
        }
        wake
    }

    /// Who this environment's executors run as, and where their code goes
    /// ([`isolation::prepare`]); once per scheduler.
    async fn prepare_sandbox(&mut self) -> Result<(), String> {
        if self.sandboxed {
            return Ok(());
        }
        let (root, env) = (self.code_root.clone(), self.env);
        let sb = tokio::task::spawn_blocking(move || isolation::prepare(&root, env))
            .await
            .map_err(|e| format!("crashed: {e}"))??;
        if sb.killed_rounds > 0 {
            tracing::warn!(environment = %self.env, "processes left by earlier executors of this environment were killed");
        }
        self.code = CodeCache::new(sb.code_dir);
        self.executors.set_sandbox(sb.jail, sb.home);
        self.sandboxed = true;
        Ok(())
    }

    /// A start from the snapshot `steward deploy` left is followed by that run's version:
    /// each agent's executor (of the first few agents, not paused) is started now, while the
    /// version is uploaded and released.
    async fn prestart_executors(&mut self) {
        const AGENTS: usize = 4;
        let agents: Vec<String> = self
            .model
            .agents
            .keys()
            .filter(|a| !self.paused.contains(*a))
            .take(AGENTS)
            .cloned()
            .collect();
        for agent in agents {
            if let Err(e) = self.executors.prestart(&agent).await {
                tracing::debug!(environment = %self.env, %agent, error = %e, "an executor was not started ahead");
            }
        }
    }

    async fn restore(&mut self) -> Result<(), store::StoreError> {
        // from nothing, also when an earlier attempt failed half way: a model it merged
        // would make the merge below a no-op, and what is known of the stored rows would
        // no longer describe the model
        self.model = Model::default();
        self.stored_rows = StoredRows::default();
        self.unread_later = None;
        let t0 = std::time::Instant::now();
        let mut phases: Vec<(&str, f64)> = Vec::new();
        let mark = |what: &'static str, phases: &mut Vec<(&str, f64)>| {
            phases.push((what, t0.elapsed().as_secs_f64() * 1e3));
        };
        let env = store::environments::get_environment(&self.pool, self.env).await?;
        self.settings = env.settings.clone();
        self.halted = env.halted;
        self.paused = store::deploy::agents(&self.pool, self.env)
            .await?
            .into_iter()
            .filter(|a| a.paused)
            .map(|a| a.name)
            .collect();
        let processed = store::deploy::load_progress(&self.pool, self.env).await?;
        let warm = match self.warm.take() {
            // built meanwhile (the settings and the progress were read beside it)
            Some(w) if w.env == self.env && Some(w.version) == processed => {
                let ready = w.ready().await;
                if ready.is_none() {
                    tracing::warn!(environment = %self.env, "the scheduler's snapshot was not made into a model: reading the database");
                }
                ready
            }
            Some(w) => {
                tracing::info!(environment = %self.env, snapshot = w.version, processed = ?processed, "the scheduler's snapshot is not of the processed version: reading the database");
                None
            }
            None => None,
        };
        let from_snapshot = warm.is_some();
        // a snapshot is made with nothing running: no deploy was left open
        if warm.is_none() {
            store::deploy::clear_leases(&self.pool, self.env).await?;
        }
        if let Some(v) = processed {
            mark("settings", &mut phases);
            let (intents, rows, built) = match warm {
                // the model of the rows the last scheduler left (as the database holds
                // them), built while the runtime started
                Some(w) => (
                    Vec::new(),
                    StoredStates::ById(HashMap::new()),
                    Some(w.into_model()),
                ),
                None => {
                    // the intents and the states are read at once, on two connections:
                    // PostgreSQL works on both while this task decodes whichever comes
                    // first
                    let (pool, env) = (self.pool.clone(), self.env);
                    let (intents, rows) = tokio::join!(
                        // the attributes are read after the start (read_unread_later)
                        self.load_intents_reading(v, true, false),
                        store::deploy::load_states(&pool, env)
                    );
                    (intents?, StoredStates::ById(rows?), None)
                }
            };
            mark("intents and states read", &mut phases);
            // Built on a thread of its own: at 100,000 resources this is 200 ms of work
            // without a wait in it, and on a runtime worker it held up the other tasks there
            // (`steward deploy`'s first request to its private server waited for it)
            let (model, stored_rows) = match built {
                Some(built) => built,
                None => tokio::task::spawn_blocking(move || build_model(v, intents, rows))
                    .await
                    .map_err(|e| match e.try_into_panic() {
                        Ok(panic) => std::panic::resume_unwind(panic),
                        // the runtime is shutting down
                        Err(e) => store::StoreError::Database(format!("building the model: {e}")),
                    })?,
            };
            self.model = model;
            self.stored_rows = stored_rows;
            mark("model", &mut phases);
            // read a while after the start: beside the first deploys, a read of every
            // attribute set slowed them (100,000 resources: ~240 ms of PostgreSQL's work on
            // the two cores `steward deploy`'s change-one needs, which then stops before)
            self.unread_later = Some(tokio::time::Instant::now() + UNREAD_AFTER);
            self.load_wanted_facts().await;
            self.handlers = store::code::handlers_of(&self.pool, self.env, v).await?;
            mark("facts and handlers", &mut phases);
        } else {
            // no version merged yet: whatever rows the environment has are orphans'
            let ids = store::deploy::state_ids(&self.pool, self.env).await?;
            self.stored_rows = StoredRows::known(HashSet::new(), Some(ids.into_iter().collect()));
        }
        self.read_agent_configs().await?;
        self.refresh_placements();
        // (a halted environment starts nothing)
        if from_snapshot && !self.halted {
            self.prestart_executors().await;
        }
        self.arm_sweeps(Utc::now());
        self.tombstones.clear();
        self.take_up_pending_deletes().await?;
        mark("pending deletes", &mut phases);
        // the marks it cleared go before the merge's rows: a resource back in the model
        // must not have its row orphaned by a mark written after it
        self.flush();
        let active = store::versions::active(&self.pool, self.env).await?;
        if let Some(a) = active
            && Some(a) != processed
        {
            self.merge_version(a).await?;
        }
        // what was not done when we stopped
        let dirty: Vec<usize> = self.model.dirty.iter().copied().collect();
        for r in dirty {
            self.schedule(r, Priority::IntervalDeploy, "the scheduler started", false);
        }
        mark("merged", &mut phases);
        // dry-runs that were under way when we stopped run again
        for d in store::deploy::dryruns(&self.pool, self.env).await? {
            if d.finished_at.is_none() {
                self.start_dryrun(d.id, d.version).await;
            }
        }
        mark("dry-runs", &mut phases);
        // what the start recorded (the merge's marks and rows among it) is written before
        // anything the loop records: a version released meanwhile and merged in its first
        // turn would otherwise share a batch with it, and a resource it brings back have its
        // row written before the earlier removal's mark
        self.flush();
        let phases: Vec<String> = phases
            .iter()
            .map(|(what, ms)| format!("{what} {ms:.0}"))
            .collect();
        tracing::info!(environment = %self.env, version = ?self.model.version, resources = self.model.len(), from_snapshot, ms_since_start = %phases.join(", "), "scheduler started");
        Ok(())
    }
}
