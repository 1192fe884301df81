//! The all-in-one runtime of `steward deploy`: a private PostgreSQL cluster under the data
//! dir (kept between runs), the server with its scheduler in this process on a loopback
//! port, and a client on it. Everything the run does goes through the REST API, as it would
//! against a remote server.
//!
//! Invariants: one run per data dir at a time (an exclusive lock, released by the kernel
//! however the run ends); the cluster is stopped when the run stops, and by a watchdog when
//! the run is killed (unless a newer run holds the lock by then and uses the cluster). A run
//! that stops its cluster itself ends its watchdog too: nothing of it outlives the command.

use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use uuid::Uuid;

use crate::client::Client;
use crate::model::Role;
use crate::scheduler::Schedulers;
use crate::store::cluster::{ClusterError, PgCluster};
use crate::store::{self, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("another `steward deploy` is running on {0} (wait for it, or stop it)")]
    Busy(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// An exclusive lock on the data dir, held while the file stays open.
struct DirLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl DirLock {
    fn take(data_dir: &Path) -> Result<DirLock, DeployError> {
        let path = data_dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| DeployError::Io {
                what: "can not open",
                path: path.display().to_string(),
                source,
            })?;
        // a watchdog of a killed run holds it for a moment while it stops the cluster
        for _ in 0..100 {
            // SAFETY: flock(2) on a descriptor we own
            let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r == 0 {
                return Ok(DirLock { _file: file, path });
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(DeployError::Busy(data_dir.display().to_string()))
    }
}

/// Connections of the private server opened as it starts (see [`Runtime::start`]).
const WARM_CONNECTIONS: usize = 3;

/// The private server's pool: all the connections this process opens but a `psql` that
/// creates the database on the first run.
const POOL: u32 = 8;

/// The private cluster's `max_connections`: the pool, with room for that `psql` and for an
/// operator's own sessions (PostgreSQL keeps 3 more for superusers).
const MAX_CONNECTIONS: u32 = 40;

pub struct Runtime {
    cluster: std::sync::Arc<PgCluster>,
    _supervisor: crate::store::cluster::Supervisor,
    pub pool: sqlx::PgPool,
    pub client: Client,
    schedulers: Schedulers,
    token: Uuid,
    server: tokio::task::JoinHandle<()>,
    watchdog: Option<Watchdog>,
    data_dir: PathBuf,
    _lock: DirLock,
}

impl Runtime {
    /// Whether `data_dir` holds the private cluster of an earlier run.
    pub fn holds_cluster(data_dir: &Path) -> bool {
        PgCluster::exists_at(&data_dir.join("pg"))
    }

    /// Start everything under `data_dir` (created if needed).
    pub async fn start(data_dir: &Path, executor_bin: PathBuf) -> Result<Runtime, DeployError> {
        std::fs::create_dir_all(data_dir).map_err(|source| DeployError::Io {
            what: "can not create",
            path: data_dir.display().to_string(),
            source,
        })?;
        let began = std::time::Instant::now();
        let lock = DirLock::take(data_dir)?;
        // the server's routes are made while the cluster starts
        let routes = std::thread::spawn(crate::server::routes);
        let root = data_dir.join("pg");
        let lock_path = lock.path.clone();
        let dir = data_dir.to_path_buf();
        let (cluster, warm) = tokio::task::spawn_blocking(move || {
            let c = PgCluster::new(&root)?.with_max_connections(MAX_CONNECTIONS);
            // what the last run's schedulers left, checked against the cluster as that run
            // left it (this start changes it), and read while it starts
            let stamp = c.control_stamp();
            let reading = std::thread::spawn(move || super::warm::take_prepared(&dir, stamp));
            match c.start(true) {
                Ok(()) => Ok((std::sync::Arc::new(c), reading)),
                Err(e) => {
                    let _ = reading.join();
                    Err(e)
                }
            }
        })
        .await
        .expect("cluster start task")?;
        let cluster_ms = began.elapsed().as_secs_f64() * 1000.0;
        let watchdog = stop_cluster_when_gone(&cluster, std::process::id(), &lock_path);
        let supervisor = cluster.supervise(true);
        // the database is there after the first run: connecting says so, without the `psql`
        // process that would ask (30-40 ms of every run)
        let url = cluster.url("steward");
        let pool = match store::connect(&url, POOL).await {
            Ok(pool) => pool,
            Err(_) => {
                let c = cluster.clone();
                tokio::task::spawn_blocking(move || c.ensure_database("steward"))
                    .await
                    .expect("database creation task")?;
                store::connect(&url, POOL).await?
            }
        };
        let connected_ms = began.elapsed().as_secs_f64() * 1000.0;
        // The scheduler's start, the upload and the scheduler's writer each ask for a
        // connection within milliseconds of each other; one opened on demand is a backend
        // forked and a SCRAM login on both sides (~10 ms here). A few are opened now, at
        // once, while the migrations are checked and the server starts.
        {
            let pool = pool.clone();
            tokio::spawn(async move {
                let opened =
                    futures_util::future::join_all((0..WARM_CONNECTIONS).map(|_| pool.acquire()))
                        .await;
                drop(opened);
            });
        }
        store::migrate(&pool).await?;
        let migrated_ms = began.elapsed().as_secs_f64() * 1000.0;
        let (token, secret) = store::tokens::create(
            &pool,
            &format!("steward deploy (pid {})", std::process::id()),
            Role::Admin,
            None,
            "steward deploy",
            None,
        )
        .await?;
        // the file is decoded meanwhile (connecting and migrating do not need it); its
        // snapshots are made into models after, while the server serves (an upload and its
        // store need the manifests only; each scheduler waits for its model)
        let warm = tokio::task::spawn_blocking(move || warm.join().unwrap_or_default())
            .await
            .unwrap_or_default();
        let warm_ms = began.elapsed().as_secs_f64() * 1000.0;
        let warm_resources: usize = warm.prepared.iter().map(|w| w.resources()).sum();
        let warm_manifest: usize = warm.manifests.iter().map(|m| m.resources()).sum();
        // before the server takes an upload (the store checks each against the newest
        // version's number and content hash anyway)
        store::versions::offer_manifests(warm.manifests);
        let state = crate::server::start::app_state_with_warm_schedulers(
            pool.clone(),
            false,
            executor_bin,
            data_dir,
            warm.prepared,
        )
        .await;
        let schedulers = state.schedulers.clone().expect("schedulers");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|source| DeployError::Io {
                what: "can not listen on",
                path: "127.0.0.1".into(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| DeployError::Io {
            what: "can not listen on",
            path: "127.0.0.1".into(),
            source,
        })?;
        let routed = std::time::Instant::now();
        let routes = routes.join().unwrap_or_else(|_| crate::server::routes());
        let app = crate::server::router_of(routes, state);
        let router_ms = routed.elapsed().as_secs_f64() * 1000.0;
        let server = tokio::spawn(async move {
            // the server's own serving loop (its header and body timeouts); it runs until
            // `stop` aborts it
            let _ = crate::server::listen::serve(listener, app, std::future::pending()).await;
        });
        tracing::debug!(
            cluster_ms,
            connected_ms,
            migrated_ms,
            warm_ms,
            warm_resources,
            warm_manifest,
            router_ms,
            serving_ms = began.elapsed().as_secs_f64() * 1000.0,
            "the private runtime is up (times since its start)"
        );
        Ok(Runtime {
            cluster,
            _supervisor: supervisor,
            pool,
            client: Client::loopback(&format!("http://{addr}"), Some(secret)),
            schedulers,
            token: token.id,
            server,
            watchdog,
            data_dir: data_dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// Stop the scheduler (executors finish their action and exit), the server and the
    /// cluster. What was not done is done by the next run.
    pub async fn stop(self) {
        let began = std::time::Instant::now();
        // each scheduler ends its executors (their input closes, they exit), hands its
        // last states to the writer, and leaves what the next run's may read instead of
        // the database, when it can
        let snapshots = self
            .schedulers
            .stop_all_and_snapshot(std::time::Duration::from_secs(1))
            .await;
        let warm = super::warm::Warm {
            snapshots,
            manifests: store::versions::held_manifests(),
        };
        let schedulers_ms = began.elapsed().as_secs_f64() * 1000.0;
        let _ = store::tokens::revoke(&self.pool, self.token).await;
        self.server.abort();
        self.pool.close().await;
        let closed_ms = began.elapsed().as_secs_f64() * 1000.0;
        let (cluster, data_dir) = (self.cluster, self.data_dir);
        let stopped = tokio::task::spawn_blocking(move || {
            let stopped = cluster.stop();
            if stopped.is_ok() {
                super::warm::keep(&data_dir, &cluster, &warm);
            }
            stopped
        })
        .await;
        tracing::debug!(
            schedulers_ms,
            closed_ms,
            cluster_ms = began.elapsed().as_secs_f64() * 1000.0,
            "the private runtime stopped (times since the stop began)"
        );
        match stopped {
            // stopped: the watchdog has nothing left to do. Left alone it would wake within
            // a second, take the data dir's lock (creating the lock file again in a data
            // dir the user may be deleting by then) and stop a stopped cluster.
            Ok(Ok(())) => {
                if let Some(w) = self.watchdog {
                    w.end();
                }
            }
            // not stopped: the watchdog stops it once this process is gone
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "stopping the private PostgreSQL cluster failed")
            }
            Err(e) => tracing::warn!(error = %e, "stopping the private PostgreSQL cluster failed"),
        }
    }
}

/// The watchdog's shell, leader of a process group of its own (with the `sleep` it waits in).
struct Watchdog(std::process::Child);

impl Watchdog {
    fn end(mut self) {
        let pgid = self.0.id() as libc::pid_t;
        // SAFETY: kill(2) on the process group the watchdog leads (`process_group(0)`); it is
        // our child and not yet reaped, so the id is still its own
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// A watchdog: once `pid` is gone, stop the cluster, but only while no newer run holds the
/// data dir's lock (flock waits for it; the newer run stops the cluster itself).
fn stop_cluster_when_gone(cluster: &PgCluster, pid: u32, lock: &Path) -> Option<Watchdog> {
    // a fixed script: the pid, the lock file and the stop command are positional parameters,
    // so no path is ever parsed by the shell
    const SCRIPT: &str = r#"pid=$1; lock=$2; shift 2
while kill -0 "$pid" 2>/dev/null; do sleep 1; done
exec flock -- "$lock" "$@" >/dev/null 2>&1"#;
    let spawned = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("steward-deploy-watchdog")
        .arg(pid.to_string())
        .arg(lock)
        .args(cluster.stop_command("fast"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    match spawned {
        Ok(child) => Some(Watchdog(child)),
        Err(e) => {
            tracing::warn!(error = %e, "no watchdog for the private PostgreSQL cluster");
            None
        }
    }
}
