//! Starting and stopping the server: database (given or private), migrations, the first
//! admin token, listening, graceful shutdown on SIGINT/SIGTERM.

use std::sync::Arc;

use tokio::net::TcpListener;

use super::{AppState, Notifier, ServerConfig, ops, router};
use crate::model::Role;
use crate::store::cluster::{ClusterError, PgCluster};
use crate::store::{self, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("can not listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    #[error("{0}")]
    Identity(std::io::Error),
}

/// The URL other replicas use when none is given: the bound address, with this machine's
/// host name when bound to all interfaces.
fn default_advertise_url(scheme: &str, addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        format!("{scheme}://{host}:{}", addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
}

/// A running private cluster, kept running while the server runs (its supervisor starts
/// it again when its postmaster dies) and stopped when the server stops.
pub struct OwnedDatabase {
    pub cluster: Option<Arc<PgCluster>>,
    pub url: String,
    _supervisor: Option<crate::store::cluster::Supervisor>,
}

/// The database the server uses: the given URL, or a private cluster under the data dir.
pub async fn database(config: &ServerConfig) -> Result<OwnedDatabase, ServerError> {
    if let Some(url) = &config.database_url {
        return Ok(OwnedDatabase {
            cluster: None,
            url: url.clone(),
            _supervisor: None,
        });
    }
    let root = config.data_dir.join("pg");
    let cluster = tokio::task::spawn_blocking(move || start_private_cluster(&root))
        .await
        .expect("cluster start task")?;
    let url = cluster.url("steward");
    tracing::info!(data = %config.data_dir.join("pg").display(), "private PostgreSQL cluster running");
    let supervisor = cluster.supervise(true);
    Ok(OwnedDatabase {
        cluster: Some(cluster),
        url,
        _supervisor: Some(supervisor),
    })
}

/// Start (or reuse) the private cluster under `root` with the `steward` database; when
/// that fails after the server started, it is stopped again: a failed start leaves no
/// PostgreSQL running without its owner.
pub fn start_private_cluster(root: &std::path::Path) -> Result<Arc<PgCluster>, ClusterError> {
    let c = PgCluster::new(root)?;
    c.start(true)?;
    if let Err(e) = c.ensure_database("steward") {
        if let Err(stop) = c.stop() {
            tracing::warn!(error = %stop, "stopping the private PostgreSQL cluster after a failed start failed");
        }
        return Err(e);
    }
    Ok(Arc::new(c))
}

/// Make sure an admin can get in: the configured secret, or a generated one printed once.
/// Replicas starting together on one database do this one at a time (an advisory lock for
/// the transaction), so the configured secret is registered once and only one first admin
/// token is made.
pub async fn bootstrap_admin(
    pool: &sqlx::PgPool,
    configured: Option<&str>,
) -> Result<Option<String>, StoreError> {
    /// the advisory lock key of the bootstrap ("stwadmin" in ASCII)
    const BOOTSTRAP_LOCK: i64 = 0x7374_7761_646d_696e;
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(BOOTSTRAP_LOCK)
        .execute(&mut *tx)
        .await?;
    let made = if let Some(secret) = configured {
        if !store::tokens::secret_known(&mut *tx, secret).await? {
            store::tokens::create(
                &mut *tx,
                "admin (STEWARD_ADMIN_TOKEN)",
                Role::Admin,
                None,
                "server",
                Some(secret),
            )
            .await?;
            tracing::info!("admin token from STEWARD_ADMIN_TOKEN registered");
        }
        None
    } else if store::tokens::count_global_admins(&mut *tx).await? > 0 {
        None
    } else {
        let (_, secret) =
            store::tokens::create(&mut *tx, "first admin", Role::Admin, None, "server", None)
                .await?;
        Some(secret)
    };
    tx.commit().await?;
    Ok(made)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

/// The shared state of a server on this pool.
pub fn app_state(pool: sqlx::PgPool, no_auth: bool) -> AppState {
    let changes = crate::store::changes::Changes::new(pool.clone());
    AppState {
        pool: pool.clone(),
        no_auth,
        metrics: Arc::new(ops::Metrics::default()),
        notifier: Notifier::new(),
        facets: crate::store::state::FacetCache::new(changes.clone()),
        changes,
        secure_cookies: false,
        schedulers: None,
        sources: None,
        replica: None,
        http: Default::default(),
        allow_local_git_sources: false,
        waits: super::waits::Waits::default(),
    }
}

/// The shared state of a server that also deploys: schedulers follow its notifier.
/// Handler code of versions is materialized under `data_dir/code` for the executors.
pub async fn app_state_with_schedulers(
    pool: sqlx::PgPool,
    no_auth: bool,
    executor_bin: std::path::PathBuf,
    data_dir: &std::path::Path,
) -> AppState {
    app_state_with_warm_schedulers(pool, no_auth, executor_bin, data_dir, Vec::new()).await
}

/// [`app_state_with_schedulers`], the schedulers starting from what the last ones left
/// (`steward deploy`, on a database nobody touched since: see `embedded::warm`).
pub async fn app_state_with_warm_schedulers(
    pool: sqlx::PgPool,
    no_auth: bool,
    executor_bin: std::path::PathBuf,
    data_dir: &std::path::Path,
    warm: Vec<crate::scheduler::snapshot::Coming>,
) -> AppState {
    let mut state = app_state(pool, no_auth);
    let schedulers = crate::scheduler::Schedulers::start_warm(
        state.pool.clone(),
        executor_bin,
        data_dir.join("code"),
        &state.notifier,
        false,
        warm,
    )
    .await;
    state.schedulers = Some(schedulers);
    state
}

/// Let the server follow git repositories: bare mirrors under `data_dir/git`, compiles run
/// as `steward_bin compile` child processes.
pub async fn enable_git(
    state: &mut AppState,
    data_dir: std::path::PathBuf,
    steward_bin: std::path::PathBuf,
) {
    let sources = crate::sources::GitSources::start(
        state.pool.clone(),
        data_dir,
        steward_bin,
        &state.notifier,
    )
    .await;
    if let Some(schedulers) = &state.schedulers {
        sources.count_with(known_counts(schedulers));
    }
    state.sources = Some(sources);
}

/// The schedulers' counts of a version's resources per status, for the deploy reporter of
/// git sources (see `Schedulers::stored_status_counts`).
fn known_counts(schedulers: &crate::scheduler::Schedulers) -> crate::sources::KnownCounts {
    let schedulers = schedulers.clone();
    Arc::new(move |env, version| {
        let schedulers = schedulers.clone();
        Box::pin(async move { schedulers.stored_status_counts(env, version).await })
    })
}

/// Run the server until SIGINT/SIGTERM.
pub async fn run(config: ServerConfig) -> Result<(), ServerError> {
    let isolation = crate::sandbox::describe();
    tracing::info!(
        compiles = %isolation.compiles,
        executors = %isolation.executors,
        namespaces = isolation.namespaces,
        "isolation of compiles and handlers"
    );
    for w in &isolation.warnings {
        tracing::warn!("{w}");
    }
    // a certificate or key that can not be used stops the server before anything starts
    let tls = match &config.tls {
        Some(files) => Some(super::tls::server_config(files)?),
        None => None,
    };
    let db = database(&config).await?;
    let result = serve(&config, &db.url, tls).await;
    if let Some(cluster) = db.cluster {
        let stopped = tokio::task::spawn_blocking(move || cluster.stop()).await;
        if let Ok(Err(e)) = stopped {
            tracing::warn!(error = %e, "stopping the private PostgreSQL cluster failed");
        }
    }
    result
}

/// `steward server rotate-replica-secret`: a new replica secret in the server's database;
/// the old one is still accepted for `grace`, so replicas calling each other right now are
/// not cut off (each reads the current secret at every call).
pub async fn rotate_replica_secret(
    config: &ServerConfig,
    grace: std::time::Duration,
) -> Result<(), ServerError> {
    // a private cluster the server runs is reused and left running; one this command had to
    // start is stopped again
    let was_running = config.database_url.is_some()
        || PgCluster::new(&config.data_dir.join("pg")).is_ok_and(|c| c.is_running());
    let db = database(config).await?;
    let pool = store::connect(&db.url, 2).await?;
    store::migrate(&pool).await?;
    let rotated = store::replicas::rotate_secret(&pool, grace).await;
    pool.close().await;
    if let Some(cluster) = db.cluster
        && !was_running
    {
        let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
    }
    Ok(rotated?)
}

/// How long a starting server waits for a database that is not there yet (booting, being
/// restarted, a failover) before it gives up.
const DATABASE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Connect, migrate and make sure an admin can get in, waiting for a database that is
/// unavailable (with a warning each time) rather than exiting at once: a server restarted
/// together with its database after a crash must not die because PostgreSQL took a moment.
async fn prepare_database(
    config: &ServerConfig,
    url: &str,
) -> Result<(sqlx::PgPool, Option<String>), ServerError> {
    let deadline = std::time::Instant::now() + DATABASE_WAIT;
    let mut delay = std::time::Duration::from_millis(200);
    loop {
        let attempt = async {
            let pool = store::connect(url, 32).await?;
            store::migrate(&pool).await?;
            let admin = if config.no_auth {
                None
            } else {
                bootstrap_admin(&pool, config.admin_token.as_deref()).await?
            };
            Ok::<_, StoreError>((pool, admin))
        }
        .await;
        match attempt {
            Ok(ready) => return Ok(ready),
            Err(e @ StoreError::Unavailable(_)) if std::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "the database is not available yet; waiting for it");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn serve(
    config: &ServerConfig,
    url: &str,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
) -> Result<(), ServerError> {
    let (pool, first_admin) = prepare_database(config, url).await?;
    if let Some(secret) = first_admin {
        // printed once, on stdout, for the operator; never stored in clear
        println!("First admin token (shown only now, keep it safe): {secret}");
    }
    let listener = TcpListener::bind(config.bind)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.bind.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(ServerError::Serve)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut state = app_state(pool.clone(), config.no_auth);
    let mut replica = None;
    if config.scheduler {
        // a deploying server is a replica: it owns the environments the leases give it
        // (all of them when it is alone on the database)
        let (id, lock) =
            crate::replicas::identity(&config.data_dir).map_err(ServerError::Identity)?;
        let advertise_url = config
            .advertise_url
            .clone()
            .unwrap_or_else(|| default_advertise_url(scheme, addr));
        // heartbeats and lease renewals get connections of their own: work that fills the
        // main pool (or a writer stuck in it) must not make every lease lapse
        let lease_pool = store::connect(url, 2).await?;
        let r = crate::replicas::Replica::new(
            pool.clone(),
            lease_pool,
            crate::replicas::ReplicaConfig {
                id,
                advertise_url,
                heartbeat: config.heartbeat,
                lease_ttl: config.lease_time,
                allow_plain_http_links: config.allow_plain_http_replica_links,
            },
        )
        .await?;
        let schedulers = crate::scheduler::Schedulers::start_replica(
            pool.clone(),
            config.executor_bin.clone(),
            config.data_dir.join("code"),
            &state.notifier,
        )
        .await;
        let sources = crate::sources::GitSources::start_replica(
            pool.clone(),
            config.data_dir.clone(),
            config.executor_bin.clone(),
            &state.notifier,
        )
        .await;
        // before the replica adopts environments and their fetchers start
        sources.set_allow_local(config.allow_local_git_sources);
        sources.set_pip_sources(config.pip_sources.clone());
        sources.count_with(known_counts(&schedulers));
        r.add_worker(Arc::new(schedulers.clone()));
        r.add_worker(Arc::new(sources.clone()));
        crate::replicas::bridge::start(pool.clone(), &state.notifier, r.clone());
        state.schedulers = Some(schedulers);
        state.sources = Some(sources);
        state.replica = Some(r.clone());
        tracing::info!(replica = %r.id(), url = %r.config().advertise_url, "joining the replicas on this database");
        tokio::spawn(r.clone().run());
        replica = Some((r, lock));
    }
    // the console's cookie goes only over TLS when the server speaks it
    state.secure_cookies = tls.is_some();
    state.allow_local_git_sources = config.allow_local_git_sources;
    let schedulers = state.schedulers.clone();
    let pruner = tokio::spawn(store::retention::run(
        state.pool.clone(),
        config.prune_interval,
    ));
    // the handler code directories this server's executors use, pruned with the versions
    let reaper = state.schedulers.is_some().then(|| {
        tokio::spawn(crate::scheduler::code::run_reaper(
            state.pool.clone(),
            config.data_dir.join("code"),
            config.prune_interval,
            crate::scheduler::code::REAP_GRACE,
        ))
    });
    // the Python environments of commits and handlers, within their grace and cap
    let envs_reaper = state.sources.as_ref().map(|s| {
        tokio::spawn(super::caches::run(
            state.pool.clone(),
            config.data_dir.clone(),
            config.python_envs,
            config.prune_interval,
            s.envs_made(),
        ))
    });
    tracing::info!(%addr, %scheme, no_auth = config.no_auth, scheduler = config.scheduler, "steward server listening");
    eprintln!("steward server listening on {scheme}://{addr}");
    let handover = replica.as_ref().map(|(r, _)| r.clone());
    let stop = async move {
        shutdown_signal().await;
        // hand the environments over before draining requests: the other replicas take
        // them at once, and requests for them still arriving here are passed on
        if let Some(r) = handover {
            r.stop().await;
        }
    };
    let served = super::listen::serve_with(listener, router(state), tls, stop)
        .await
        .map_err(ServerError::Serve);
    pruner.abort();
    for r in [reaper, envs_reaper].into_iter().flatten() {
        r.abort();
    }
    if let Some(s) = schedulers {
        // executors finish their current action and exit when their input closes
        s.stop_all();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    served
}
