//! The scheduler: one task per environment that makes released versions happen on their
//! targets through executor processes (SCHEDULER.md, DESIGN.md §5).
//!
//! [`Schedulers`] owns the per-environment tasks: it starts one for every environment with a
//! released version when the server starts, one more whenever a first version is released,
//! and stops one when its environment is deleted. It follows the server's [`Notifier`] for
//! releases and settings, and is called directly for what needs an answer (a user deploy,
//! a pause that must be acknowledged, a status). A scheduler rebuilds everything from
//! PostgreSQL when it starts, so a task that died is simply started again.

pub mod agents;
pub mod code;
pub mod env;
pub mod executors;
pub mod lines;
pub mod model;
pub mod queue;
pub mod snapshot;
pub mod ssh;
pub mod timers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{broadcast, mpsc, oneshot};
use uuid::Uuid;

pub use env::{AgentStatus, Control, Status};

use crate::events::{Event, Notifier};
use crate::replicas::{Tenure, Worker};
use crate::store;

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The scheduler of the environment stopped while asked (it is restarted on next use).
    #[error("the scheduler of environment {0} is not answering; try again")]
    Unavailable(Uuid),
    /// With replicas: another replica owns the environment (or none does right now).
    #[error("environment {0} is not scheduled on this replica")]
    NotHere(Uuid),
}

struct Inner {
    pool: PgPool,
    executor_bin: PathBuf,
    /// Where handler code of versions is materialized for executors (one dir per digest).
    code_dir: PathBuf,
    running: Mutex<HashMap<Uuid, Running>>,
    /// external agent processes of all environments
    hub: agents::AgentHub,
    /// With replicas: the environments this replica owns (only they are scheduled here).
    /// None: this process schedules every environment.
    tenures: Option<Mutex<HashMap<Uuid, Tenure>>>,
    /// Facts handlers report are told here once stored (recompiles follow them).
    notifier: Notifier,
    /// What the last schedulers left ([`snapshot::Snapshot`]), by environment: the first
    /// start of each takes its own.
    warm: Mutex<HashMap<Uuid, snapshot::Coming>>,
}

struct Running {
    tx: mpsc::UnboundedSender<Control>,
    task: tokio::task::JoinHandle<Option<snapshot::Snapshot>>,
}

/// Handle on all environment schedulers of a server (cheap to clone).
#[derive(Clone)]
pub struct Schedulers(Arc<Inner>);

/// How long a caller waits for a scheduler to acknowledge a request.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

impl Schedulers {
    /// Start the schedulers of all environments with a released version and follow
    /// `notifier` from now on.
    pub async fn start(
        pool: PgPool,
        executor_bin: PathBuf,
        code_dir: PathBuf,
        notifier: &Notifier,
    ) -> Schedulers {
        Self::start_with(pool, executor_bin, code_dir, notifier, false).await
    }

    /// For a replica: schedule only the environments it adopts ([`Worker`]).
    pub async fn start_replica(
        pool: PgPool,
        executor_bin: PathBuf,
        code_dir: PathBuf,
        notifier: &Notifier,
    ) -> Schedulers {
        Self::start_with(pool, executor_bin, code_dir, notifier, true).await
    }

    async fn start_with(
        pool: PgPool,
        executor_bin: PathBuf,
        code_dir: PathBuf,
        notifier: &Notifier,
        replica: bool,
    ) -> Schedulers {
        Self::start_warm(pool, executor_bin, code_dir, notifier, replica, Vec::new()).await
    }

    /// [`Self::start`], with what the last schedulers left when they stopped
    /// ([`Self::stop_all_and_snapshot`]). Only for a database nobody changed since: each
    /// scheduler checks its snapshot is of the version it processed, nothing more.
    pub async fn start_warm(
        pool: PgPool,
        executor_bin: PathBuf,
        code_dir: PathBuf,
        notifier: &Notifier,
        replica: bool,
        warm: Vec<snapshot::Coming>,
    ) -> Schedulers {
        let s = Schedulers(Arc::new(Inner {
            hub: agents::AgentHub::new(pool.clone()),
            pool,
            executor_bin,
            code_dir,
            running: Mutex::new(HashMap::new()),
            tenures: replica.then(|| Mutex::new(HashMap::new())),
            notifier: notifier.clone(),
            warm: Mutex::new(warm.into_iter().map(|w| (w.env, w)).collect()),
        }));
        // subscribe before scanning, so no release falls between the two
        let events = notifier.subscribe();
        s.start_known().await;
        tokio::spawn(s.clone().follow(events));
        s
    }

    /// The external agent processes (`steward agent run`) of all environments.
    pub fn hub(&self) -> &agents::AgentHub {
        &self.0.hub
    }

    /// The executable started as `steward executor`: `STEWARD_EXECUTOR_BIN`, else this program.
    pub fn default_executor_bin() -> PathBuf {
        if let Some(p) = std::env::var_os("STEWARD_EXECUTOR_BIN") {
            return PathBuf::from(p);
        }
        std::env::current_exe().unwrap_or_else(|_| PathBuf::from("steward"))
    }

    async fn start_known(&self) {
        if let Some(tenures) = &self.0.tenures {
            let owned: Vec<Uuid> = tenures.lock().expect("tenures").keys().copied().collect();
            for env in owned {
                self.sender(env);
            }
            return;
        }
        let mut delay = Duration::from_millis(200);
        let envs = loop {
            match store::deploy::environments_with_releases(&self.0.pool).await {
                Ok(e) => break e,
                Err(e) => {
                    tracing::warn!(error = %e, "listing environments to schedule failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        for env in envs {
            self.sender(env);
        }
    }

    /// Whether `env`'s scheduler runs here (on a single server: always; among replicas:
    /// when this one holds the environment).
    pub fn owns(&self, env: Uuid) -> bool {
        match &self.0.tenures {
            Some(t) => t.lock().expect("tenures").contains_key(&env),
            None => true,
        }
    }

    /// The control channel of `env`'s scheduler, starting it when needed; None when
    /// another replica owns the environment.
    fn sender(&self, env: Uuid) -> Option<mpsc::UnboundedSender<Control>> {
        let tenure = match &self.0.tenures {
            Some(t) => Some(t.lock().expect("tenures").get(&env).cloned()?),
            None => None,
        };
        let mut running = self.0.running.lock().expect("scheduler map");
        if let Some(r) = running.get(&env) {
            if !r.tx.is_closed() {
                return Some(r.tx.clone());
            }
            tracing::warn!(environment = %env, "the scheduler had stopped; starting it again");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let links = env::Links {
            executor_bin: self.0.executor_bin.clone(),
            code_dir: self.0.code_dir.clone(),
            hub: self.0.hub.clone(),
            notifier: self.0.notifier.clone(),
        };
        let warm = self.0.warm.lock().expect("snapshots").remove(&env);
        let task = tokio::spawn(env::EnvScheduler::run(
            env,
            self.0.pool.clone(),
            links,
            rx,
            tenure,
            warm,
        ));
        running.insert(
            env,
            Running {
                tx: tx.clone(),
                task,
            },
        );
        Some(tx)
    }

    fn running_sender(&self, env: Uuid) -> Option<mpsc::UnboundedSender<Control>> {
        self.0
            .running
            .lock()
            .expect("scheduler map")
            .get(&env)
            .map(|r| r.tx.clone())
    }

    async fn follow(self, mut events: broadcast::Receiver<Event>) {
        loop {
            match events.recv().await {
                Ok(Event::Released {
                    environment,
                    version,
                }) => {
                    if let Some(tx) = self.sender(environment) {
                        let _ = tx.send(Control::Released(version));
                    }
                }
                Ok(Event::Settings { environment }) | Ok(Event::Control { environment }) => {
                    if let Some(tx) = self.running_sender(environment) {
                        let _ = tx.send(Control::Settings);
                    }
                }
                Ok(Event::PreviewDryrun {
                    environment,
                    dryrun,
                }) => {
                    if let Some(tx) = self.running_sender(environment) {
                        let _ = tx.send(Control::DryrunPreview { id: dryrun });
                    }
                }
                Ok(Event::Deleted { environment }) => self.stop(environment),
                Ok(Event::Resync) => self.resync().await,
                Ok(Event::Created { .. }) | Ok(Event::Facts { .. }) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // events were lost: every scheduler re-reads what it may have missed
                    tracing::warn!(
                        missed = n,
                        "scheduler fell behind on server events; resynchronising"
                    );
                    self.resync().await;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
    }

    async fn resync(&self) {
        self.start_known().await;
        let envs: Vec<(Uuid, mpsc::UnboundedSender<Control>)> = self
            .0
            .running
            .lock()
            .expect("scheduler map")
            .iter()
            .map(|(k, v)| (*k, v.tx.clone()))
            .collect();
        for (env, tx) in envs {
            let _ = tx.send(Control::Settings);
            if let Ok(Some(v)) = store::versions::active(&self.0.pool, env).await {
                let _ = tx.send(Control::Released(v));
            }
        }
    }

    /// Stop the scheduler of a deleted environment (its executors end with it).
    pub fn stop(&self, env: Uuid) {
        if let Some(r) = self.0.running.lock().expect("scheduler map").remove(&env) {
            let _ = r.tx.send(Control::Stop);
        }
    }

    /// Stop every scheduler (server shutdown).
    pub fn stop_all(&self) {
        for (_, r) in self.0.running.lock().expect("scheduler map").drain() {
            let _ = r.tx.send(Control::Stop);
        }
    }

    /// Stop every scheduler and wait, at most `within`, until each has ended (its executors
    /// told to stop, its last states written); answer what they left for their next start
    /// ([`snapshot::Snapshot`]: not every stop leaves one).
    pub async fn stop_all_and_snapshot(&self, within: Duration) -> Vec<snapshot::Snapshot> {
        let ending: Vec<_> = self
            .0
            .running
            .lock()
            .expect("scheduler map")
            .drain()
            .map(|(_, r)| {
                let _ = r.tx.send(Control::StopWithSnapshot);
                r.task
            })
            .collect();
        match tokio::time::timeout(within, futures_util::future::join_all(ending)).await {
            Ok(ended) => ended.into_iter().filter_map(|e| e.ok().flatten()).collect(),
            Err(_) => {
                tracing::warn!("a scheduler did not stop in time");
                Vec::new()
            }
        }
    }

    async fn ask<T>(
        &self,
        env: Uuid,
        make: impl FnOnce(oneshot::Sender<T>) -> Control,
    ) -> Result<T, SchedulerError> {
        let (ack, rx) = oneshot::channel();
        self.sender(env)
            .ok_or(SchedulerError::NotHere(env))?
            .send(make(ack))
            .map_err(|_| SchedulerError::Unavailable(env))?;
        match tokio::time::timeout(ACK_TIMEOUT, rx).await {
            Ok(Ok(v)) => Ok(v),
            _ => Err(SchedulerError::Unavailable(env)),
        }
    }

    /// A user deploy (what is not yet deployed) or repair (everything), optionally narrowed to
    /// one agent or resource. Answers how many resources were scheduled.
    pub async fn trigger(
        &self,
        env: Uuid,
        repair: bool,
        agent: Option<String>,
        resource: Option<String>,
    ) -> Result<usize, SchedulerError> {
        self.ask(env, |ack| Control::Trigger {
            repair,
            agent,
            resource,
            ack,
        })
        .await
    }

    /// Pause or unpause an agent; returns once no new action of it can start.
    pub async fn pause(
        &self,
        env: Uuid,
        agent: String,
        paused: bool,
    ) -> Result<(), SchedulerError> {
        self.ask(env, |ack| Control::Pause { agent, paused, ack })
            .await
    }

    /// Halt or resume the environment; returns once the scheduler applies it.
    pub async fn halt(&self, env: Uuid, halted: bool) -> Result<(), SchedulerError> {
        self.ask(env, |ack| Control::Halt { halted, ack }).await
    }

    pub async fn status(&self, env: Uuid) -> Result<Status, SchedulerError> {
        self.ask(env, Control::Status).await
    }

    /// The counts per status of `version`'s resources, from the model of the scheduler of
    /// `env` running here, once the database holds the states they were counted from: what
    /// `store::state::status_counts` would count then, without reading every resource and
    /// state (100,000 resources: a count of a few milliseconds instead of a join of hundreds).
    /// None (count in the database) when no scheduler of `env` runs here, it holds another
    /// version, or its writes are not confirmed within [`COUNTS_WAIT`].
    pub async fn stored_status_counts(
        &self,
        env: Uuid,
        version: i32,
    ) -> Option<Vec<(String, i64)>> {
        self.stored_status_counts_until(env, version, tokio::time::Instant::now() + COUNTS_WAIT)
            .await
    }

    /// [`Self::stored_status_counts`], waiting until `deadline` (a metrics scrape asks every
    /// environment at once and waits less).
    pub async fn stored_status_counts_until(
        &self,
        env: Uuid,
        version: i32,
        deadline: tokio::time::Instant,
    ) -> Option<Vec<(String, i64)>> {
        let (ack, rx) = oneshot::channel();
        self.running_sender(env)?
            .send(Control::Counts { version, ack })
            .ok()?;
        let settled = tokio::time::timeout_at(deadline, rx).await.ok()?.ok()??;
        settled.stored_by(deadline).await
    }

    /// Start a dry-run (already recorded in the database) of `version`.
    pub fn dryrun(&self, env: Uuid, id: Uuid, version: i32) -> Result<(), SchedulerError> {
        self.sender(env)
            .ok_or(SchedulerError::NotHere(env))?
            .send(Control::Dryrun { id, version })
            .map_err(|_| SchedulerError::Unavailable(env))
    }
}

/// How long a count waits for a busy scheduler to answer and for its writer to store what
/// it counted, before the database counts instead.
pub const COUNTS_WAIT: Duration = Duration::from_secs(1);

impl Worker for Schedulers {
    fn adopt(&self, env: Uuid, tenure: Tenure) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(t) = &self.0.tenures {
                t.lock().expect("tenures").insert(env, tenure);
            }
            // rebuilt from the database, as after a restart
            self.sender(env);
        })
    }

    fn release(&self, env: Uuid) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(t) = &self.0.tenures {
                t.lock().expect("tenures").remove(&env);
            }
            let running = self.0.running.lock().expect("scheduler map").remove(&env);
            if let Some(r) = running {
                let _ = r.tx.send(Control::Stop);
                if tokio::time::timeout(Duration::from_secs(10), r.task)
                    .await
                    .is_err()
                {
                    tracing::warn!(environment = %env, "the scheduler did not stop within 10 s");
                }
            }
            self.0.hub.drop_environment(env).await;
        })
    }
}
