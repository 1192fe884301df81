//! Several `steward server` replicas on one PostgreSQL (docs/replicas.md).
//!
//! Every replica serves the whole API; the *active* work of an environment (its scheduler
//! and executors, its git source's fetch and compile loop, its timers) runs on exactly one
//! replica at a time: the holder of the environment's lease (kind `environment` in
//! [`crate::store::leases`]), taken and renewed in PostgreSQL, with a term that every write
//! of the owner carries ([`Tenure::fence`]). PostgreSQL is the only coordination engine.
//!
//! Each replica runs [`Replica::run`]: every heartbeat it says it is alive, renews the
//! leases it holds in one statement, and evens out the work: with E environments and N
//! live replicas, a replica holds at most ⌈E/N⌉ of them. It takes free (never held,
//! released or expired) leases up to that share, preferring the environments that hash
//! highest for it (so replicas rarely race for the same one), and gives back what is over
//! it. A replica that dies stops renewing: its leases expire after the lease time and the
//! others take them. A graceful stop gives every lease back at once and tells the others.
//!
//! The parts doing an environment's work register as [`Worker`]s: they are told to adopt an
//! environment (with its tenure) and to let it go; letting go returns only once the work
//! stopped, so the lease is given back only when nothing of the old owner runs any more.
//! A tenure also knows locally how long it is certainly valid ([`Tenure::valid`]): a
//! replica that was paused past its lease stops starting actions before it even hears
//! that it lost it.

pub mod bridge;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use sqlx::PgPool;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::store::leases::{self, Fence, LeaseKind};
use crate::store::{self, StoreError};

/// The channel on which replicas wake each other ("look at the leases now").
pub const WAKE_CHANNEL: &str = "steward_replicas";

/// How a replica takes part.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// Stable across restarts of the same replica (kept in its data dir), so a restarted
    /// replica picks its leases up again at once.
    pub id: String,
    /// Where the other replicas reach this one.
    pub advertise_url: String,
    /// Time between heartbeats (and lease renewals).
    pub heartbeat: Duration,
    /// How long a lease lasts without renewal: a dead replica's environments move after this.
    pub lease_ttl: Duration,
    /// Send the replica secret to other replicas over plain `http://` even when their
    /// advertised address is not a loopback one (off: such calls are refused, see
    /// [`Replica::may_send_secret_to`]).
    pub allow_plain_http_links: bool,
}

impl ReplicaConfig {
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

    fn ttl_ms(&self) -> i64 {
        self.lease_ttl.as_millis() as i64
    }

    /// How long after the start of a renewal this replica trusts its lease: less than the
    /// lease time, so it stops acting before the database lets anyone else in even if the
    /// clocks run slightly apart.
    fn trusted(&self) -> Duration {
        self.lease_ttl.mul_f64(0.8)
    }
}

/// One replica's tenure of one environment.
#[derive(Clone, Debug)]
pub struct Tenure(Arc<TenureInner>);

#[derive(Debug)]
struct TenureInner {
    fence: Fence,
    base: Instant,
    /// ms after `base` until which the lease is certainly ours (0: lost)
    valid_until_ms: AtomicU64,
}

impl Tenure {
    fn new(env: Uuid, holder: &str, term: i64, valid_until: Instant) -> Tenure {
        let t = Tenure(Arc::new(TenureInner {
            fence: Fence {
                kind: LeaseKind::Environment,
                key: env.to_string(),
                holder: holder.to_string(),
                term,
            },
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(0),
        }));
        t.extend(valid_until);
        t
    }

    fn extend(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.0.base).as_millis() as u64;
        self.0.valid_until_ms.store(ms.max(1), Ordering::Release);
    }

    fn end(&self) {
        self.0.valid_until_ms.store(0, Ordering::Release);
    }

    /// Is the lease certainly still ours right now? (Monotonic time: a replica paused
    /// past its lease sees it lapsed the moment it runs again.)
    pub fn valid(&self) -> bool {
        let now = self.0.base.elapsed().as_millis() as u64;
        now < self.0.valid_until_ms.load(Ordering::Acquire)
    }

    pub fn term(&self) -> i64 {
        self.0.fence.term
    }

    /// What the owner's writes carry: checked in their transaction.
    pub fn fence(&self) -> &Fence {
        &self.0.fence
    }
}

/// A part of the server that does environments' active work.
pub trait Worker: Send + Sync {
    /// Start the work of `env` (this replica owns it now).
    fn adopt(&self, env: Uuid, tenure: Tenure) -> BoxFuture<'_, ()>;
    /// Stop the work of `env`; resolves once nothing of it runs any more.
    fn release(&self, env: Uuid) -> BoxFuture<'_, ()>;
}

/// Where an environment's owner is.
#[derive(Clone, Debug)]
pub enum Location {
    Here(Tenure),
    There {
        replica: String,
        url: String,
    },
    /// No replica holds it right now (it is moving).
    Nowhere,
}

struct Inner {
    config: ReplicaConfig,
    pool: PgPool,
    /// Heartbeats and renewals only: a pool busy with other work (or held by a stuck
    /// writer) must not delay them.
    lease_pool: PgPool,
    /// Environments whose work is being stopped after their lease was lost: not taken again
    /// until that is done.
    releasing: Mutex<HashSet<Uuid>>,
    version: String,
    owned: Mutex<HashMap<Uuid, Tenure>>,
    workers: Mutex<Vec<Arc<dyn Worker>>>,
    wake: Notify,
    stopping: AtomicBool,
    /// serializes ticks and the graceful stop; holds when the last tick went through
    /// One balancing round at a time; what the last rounds saw of the database.
    turn: tokio::sync::Mutex<Rounds>,
}

/// This replica (cheap to clone).
#[derive(Clone)]
pub struct Replica(Arc<Inner>);

/// What the balancing rounds remember between them.
#[derive(Default)]
struct Rounds {
    /// When a round last reached the database.
    last_ok: Option<Instant>,
    /// Until when rounds only take back this replica's own lapsed leases (after an outage).
    recovering_until: Option<Instant>,
}

impl Replica {
    /// Join: make sure there is a shared secret (the first replica makes it). Workers are
    /// added next, then [`Replica::run`] starts taking environments.
    pub async fn new(
        pool: PgPool,
        lease_pool: PgPool,
        config: ReplicaConfig,
    ) -> Result<Replica, StoreError> {
        store::replicas::secret(&pool).await?;
        if !config.allow_plain_http_links && !may_carry_secret(&config.advertise_url) {
            tracing::warn!(url = %config.advertise_url, "this replica is advertised over plain http:// at an address that is not a loopback one: the other replicas will not send it owner-only calls (the replica secret would cross the network in clear); serve TLS, or start every replica with --allow-plain-http-replica-links on a network you trust");
        }
        Ok(Replica(Arc::new(Inner {
            config,
            pool,
            lease_pool,
            releasing: Mutex::new(HashSet::new()),
            version: env!("CARGO_PKG_VERSION").to_string(),
            owned: Mutex::new(HashMap::new()),
            workers: Mutex::new(Vec::new()),
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(Rounds::default()),
        })))
    }

    pub fn add_worker(&self, w: Arc<dyn Worker>) {
        self.0.workers.lock().expect("workers").push(w);
    }

    pub fn id(&self) -> &str {
        &self.0.config.id
    }

    pub fn config(&self) -> &ReplicaConfig {
        &self.0.config
    }

    /// The secret replicas show each other on owner-only calls: the current one, read at
    /// each call so that a rotation (`steward server rotate-replica-secret`) takes effect at
    /// once.
    pub async fn secret(&self) -> Result<String, StoreError> {
        store::replicas::current_secret(&self.0.pool).await
    }

    /// Whether `given` is a secret replicas accept now (the current one, or a rotated one in
    /// its grace period), compared in constant time.
    pub async fn accepts(&self, given: &str) -> Result<bool, StoreError> {
        use subtle::ConstantTimeEq;
        let accepted = store::replicas::accepted_secrets(&self.0.pool).await?;
        Ok(accepted.iter().fold(false, |ok, s| {
            ok | bool::from(s.as_bytes().ct_eq(given.as_bytes()))
        }))
    }

    /// May the secret be sent to a replica advertised at `url`? Over https, or to a loopback
    /// address, always; over plain http elsewhere only with `allow_plain_http_links`.
    pub fn may_send_secret_to(&self, url: &str) -> bool {
        self.0.config.allow_plain_http_links || may_carry_secret(url)
    }

    /// This replica's tenure of `env`, if it owns it.
    pub fn owns(&self, env: Uuid) -> Option<Tenure> {
        self.0.owned.lock().expect("owned").get(&env).cloned()
    }

    /// The environments this replica owns, with their terms.
    pub fn owned(&self) -> Vec<(Uuid, i64)> {
        let mut v: Vec<(Uuid, i64)> = self
            .0
            .owned
            .lock()
            .expect("owned")
            .iter()
            .map(|(e, t)| (*e, t.term()))
            .collect();
        v.sort();
        v
    }

    /// The tenures of the environments this replica works on, taken out of the lock.
    fn tenures(&self) -> Vec<(Uuid, Tenure)> {
        self.0
            .owned
            .lock()
            .expect("owned")
            .iter()
            .map(|(e, t)| (*e, t.clone()))
            .collect()
    }

    /// Look at the leases now (an environment was created, a replica stopped).
    pub fn wake(&self) {
        self.0.wake.notify_one();
    }

    /// Who owns `env` now.
    pub async fn locate(&self, env: Uuid) -> Result<Location, StoreError> {
        if let Some(t) = self.owns(env) {
            return Ok(Location::Here(t));
        }
        Ok(match store::replicas::owner_of(&self.0.pool, env).await? {
            // the database says ours but it is not adopted yet (or being let go)
            Some((id, _)) if id == self.0.config.id => Location::Nowhere,
            Some((replica, url)) => Location::There { replica, url },
            None => Location::Nowhere,
        })
    }

    fn workers(&self) -> Vec<Arc<dyn Worker>> {
        self.0.workers.lock().expect("workers").clone()
    }

    /// Heartbeat and renew (a task of its own), and balance, for ever (until
    /// [`Replica::stop`]). Renewal never waits for the work of environments: a lease found
    /// lost ends its tenure at once and its work is stopped in the background, and taking,
    /// adopting and handing over environments happen in the other loop.
    pub async fn run(self) {
        let renewer = self.clone();
        let renewing = tokio::spawn(async move { renewer.renew_loop().await });
        loop {
            if self.0.stopping.load(Ordering::Acquire) {
                break;
            }
            let started = Instant::now();
            let delay = match self.tick().await {
                Ok(()) => self.0.config.heartbeat,
                Err(e) => {
                    tracing::warn!(replica = %self.id(), error = %e, "replica heartbeat failed; trying again");
                    self.0.config.heartbeat.min(Duration::from_millis(500))
                }
            };
            let wait = delay.saturating_sub(started.elapsed());
            let _ = tokio::time::timeout(wait, self.0.wake.notified()).await;
        }
        let _ = renewing.await;
    }

    async fn renew_loop(&self) {
        loop {
            if self.0.stopping.load(Ordering::Acquire) {
                return;
            }
            let started = Instant::now();
            // a renewal that hangs (a connection to a database that went away) is given up
            // well before the leases run out, and tried again
            let limit = self.0.config.trusted() / 2;
            let delay = match tokio::time::timeout(limit, self.renew()).await {
                Ok(Ok(())) => self.0.config.heartbeat,
                Ok(Err(e)) => {
                    tracing::warn!(replica = %self.id(), error = %e, "renewing the leases failed; trying again");
                    self.0.config.heartbeat.min(Duration::from_millis(500))
                }
                Err(_) => {
                    tracing::warn!(replica = %self.id(), secs = limit.as_secs_f64(), "renewing the leases took too long; trying again");
                    Duration::ZERO
                }
            };
            tokio::time::sleep(delay.saturating_sub(started.elapsed())).await;
        }
    }

    /// Say this replica is alive and renew its leases; end the tenures it lost.
    async fn renew(&self) -> Result<(), StoreError> {
        let cfg = &self.0.config;
        let pool = &self.0.lease_pool;
        let started = Instant::now();
        store::replicas::heartbeat(pool, &cfg.id, &cfg.advertise_url, &self.0.version).await?;
        let mut c = pool.acquire().await?;
        let renewal =
            leases::renew_all(&mut c, LeaseKind::Environment, &cfg.id, cfg.ttl_ms()).await?;
        drop(c);
        let renewed: HashMap<String, i64> = renewal.renewed.into_iter().collect();
        let busy: HashMap<String, i64> = renewal.busy.into_iter().collect();
        let valid_until = started + cfg.trusted();
        for (env, tenure) in self.tenures() {
            let key = env.to_string();
            match (renewed.get(&key), busy.get(&key)) {
                (Some(term), _) if *term == tenure.term() => tenure.extend(valid_until),
                // its row is held by one of its own writes: still ours, renewed next time
                (_, Some(term)) if *term == tenure.term() => {
                    tracing::debug!(replica = %cfg.id, environment = %env, "lease busy (a write holds it); renewed next time");
                }
                // expired while we could not renew (the database was away), or taken over
                _ => self.lapsed(env, &tenure).await?,
            }
        }
        Ok(())
    }

    /// The lease of an environment this replica works on is not its own any more (by the
    /// database's clock). When nobody took it, it is kept under the same term, so that no
    /// other replica snatches it while this one restarts its work (adopted again here once
    /// the old work has stopped: it is held but not owned); otherwise it is lost. Either
    /// way the work under the old tenure stops.
    async fn lapsed(&self, env: Uuid, tenure: &Tenure) -> Result<(), StoreError> {
        let cfg = &self.0.config;
        let kept = leases::revive(
            &self.0.lease_pool,
            LeaseKind::Environment,
            &env.to_string(),
            &cfg.id,
            tenure.term(),
            cfg.ttl_ms(),
        )
        .await?;
        if kept.is_some() {
            tracing::warn!(replica = %cfg.id, environment = %env, term = tenure.term(), "lease of environment lapsed and nobody took it; its work restarts here under the same term");
        } else {
            tracing::warn!(replica = %cfg.id, environment = %env, term = tenure.term(), "lease of environment lost; its work stops here");
        }
        self.let_go_in_background(env);
        Ok(())
    }

    /// End the tenure of `env` now and stop its work without waiting for it; until that
    /// is done the environment is not taken again here.
    fn let_go_in_background(&self, env: Uuid) {
        let Some(tenure) = self.0.owned.lock().expect("owned").remove(&env) else {
            return;
        };
        tenure.end();
        self.0.releasing.lock().expect("releasing").insert(env);
        let me = self.clone();
        tokio::spawn(async move {
            for w in me.workers() {
                w.release(env).await;
            }
            me.0.releasing.lock().expect("releasing").remove(&env);
            me.wake();
        });
    }

    fn is_releasing(&self, env: Uuid) -> bool {
        self.0.releasing.lock().expect("releasing").contains(&env)
    }

    async fn tick(&self) -> Result<(), StoreError> {
        let mut rounds = self.0.turn.lock().await;
        // back after longer than the lease time without the database: the other replicas
        // may be too, and their heartbeats look stale until each has renewed once; for two
        // heartbeats (rounds woken early included) this replica only takes back its own
        // lapsed leases, and shares what is free after that
        let now = Instant::now();
        if rounds
            .last_ok
            .is_some_and(|t| now.duration_since(t) > self.0.config.lease_ttl)
        {
            rounds.recovering_until = Some(now + self.0.config.heartbeat * 2);
        }
        let recovering = rounds.recovering_until.is_some_and(|t| now < t);
        if self.0.stopping.load(Ordering::Acquire) {
            return Ok(());
        }
        let cfg = &self.0.config;
        let pool = &self.0.pool;
        let held: HashMap<String, i64> = leases::held_by(pool, LeaseKind::Environment, &cfg.id)
            .await?
            .into_iter()
            .collect();
        let t0 = Instant::now();
        let envs: Vec<Uuid> = store::replicas::environment_ids(pool).await?;
        let existing: HashSet<Uuid> = envs.iter().copied().collect();
        // held in the database but not adopted (this replica restarted with the same id)
        for (key, term) in &held {
            let Ok(env) = key.parse::<Uuid>() else {
                continue;
            };
            if !existing.contains(&env) || self.is_releasing(env) {
                continue;
            }
            if self.owns(env).is_none() {
                // renewed at most a heartbeat ago: trusted for that much less
                let until = t0 + cfg.trusted().saturating_sub(cfg.heartbeat);
                self.adopt(env, *term, until).await;
            }
        }
        // worked on here but not held by the database's clock (this replica was paused or
        // cut off past its lease): the renewal may not have run yet, and this round must
        // not count or hand over what is not its own
        for (env, tenure) in self.tenures() {
            if held.get(&env.to_string()) != Some(&tenure.term()) {
                self.lapsed(env, &tenure).await?;
            }
        }
        // environments deleted meanwhile
        for (env, _) in self.owned() {
            if !existing.contains(&env) {
                self.let_go(env).await;
                leases::remove(pool, LeaseKind::Environment, &env.to_string()).await?;
            }
        }
        let mut live = store::replicas::live(pool, cfg.ttl_ms()).await?;
        if !live.contains(&cfg.id) {
            live.push(cfg.id.clone());
        }
        let share = fair_share(
            envs.len(),
            &live,
            &leases::holder_counts(pool, LeaseKind::Environment).await?,
            &cfg.id,
        );
        let held = self.owned().len();
        if held > share {
            // give back what is over the share: the environments that hash lowest for us
            let mut mine: Vec<Uuid> = self.owned().into_iter().map(|(e, _)| e).collect();
            mine.sort_by_key(|e| score(&cfg.id, *e));
            let extra: Vec<Uuid> = mine.into_iter().take(held - share).collect();
            tracing::info!(replica = %cfg.id, count = extra.len(), share, "handing environments over to even out the replicas");
            self.hand_over(&extra).await?;
        } else if held < share {
            let taken: HashSet<String> = leases::current_keys(pool, LeaseKind::Environment)
                .await?
                .into_iter()
                .collect();
            let mut free: Vec<Uuid> = envs
                .iter()
                .copied()
                .filter(|e| {
                    !taken.contains(&e.to_string())
                        && self.owns(*e).is_none()
                        && !self.is_releasing(*e)
                })
                .collect();
            // first what this replica held before its leases lapsed (the database was away
            // longer than the lease time): nobody took them, so the same replica resumes
            // them under the same term instead of shuffling everything after an outage
            let lapsed: HashSet<String> =
                leases::lapsed_keys(pool, LeaseKind::Environment, &cfg.id)
                    .await?
                    .into_iter()
                    .collect();
            if recovering {
                free.retain(|e| lapsed.contains(&e.to_string()));
            }
            free.sort_by_key(|e| {
                (
                    !lapsed.contains(&e.to_string()),
                    std::cmp::Reverse(score(&cfg.id, *e)),
                )
            });
            let mut want = share - held;
            for env in free {
                if want == 0 {
                    break;
                }
                let t0 = Instant::now();
                if let Some(term) = leases::acquire(
                    pool,
                    LeaseKind::Environment,
                    &env.to_string(),
                    &cfg.id,
                    cfg.ttl_ms(),
                )
                .await?
                {
                    self.adopt(env, term, t0 + cfg.trusted()).await;
                    want -= 1;
                }
            }
        }
        let _ = store::replicas::forget_silent(pool, 3600.0).await;
        rounds.last_ok = Some(Instant::now());
        Ok(())
    }

    async fn adopt(&self, env: Uuid, term: i64, valid_until: Instant) {
        let tenure = Tenure::new(env, &self.0.config.id, term, valid_until);
        self.0
            .owned
            .lock()
            .expect("owned")
            .insert(env, tenure.clone());
        tracing::info!(replica = %self.id(), environment = %env, term, "environment owned here now");
        for w in self.workers() {
            w.adopt(env, tenure.clone()).await;
        }
    }

    /// Stop the work of `env` here (the lease itself is not touched).
    async fn let_go(&self, env: Uuid) {
        let tenure = self.0.owned.lock().expect("owned").remove(&env);
        if let Some(t) = tenure {
            t.end();
        }
        for w in self.workers() {
            w.release(env).await;
        }
    }

    /// Stop the work of these environments, then give their leases back and tell the
    /// other replicas, so one of them takes each at once.
    async fn hand_over(&self, envs: &[Uuid]) -> Result<(), StoreError> {
        futures_util::future::join_all(envs.iter().map(|e| self.let_go(*e))).await;
        for env in envs {
            leases::release(
                &self.0.pool,
                LeaseKind::Environment,
                &env.to_string(),
                &self.0.config.id,
            )
            .await?;
        }
        bridge::wake_others(&self.0.pool).await
    }

    /// A graceful stop: leave the share count, stop all work, give every lease back and
    /// tell the others, so they take over without waiting for the leases to expire.
    pub async fn stop(&self) {
        self.0.stopping.store(true, Ordering::Release);
        let _turn = self.0.turn.lock().await;
        let pool = &self.0.pool;
        let id = &self.0.config.id;
        let started = Instant::now();
        if let Err(e) = store::replicas::mark_stopping(pool, id).await {
            tracing::warn!(replica = %id, error = %e, "could not announce the stop");
        }
        let envs: Vec<Uuid> = self.owned().into_iter().map(|(e, _)| e).collect();
        let count = envs.len();
        if let Err(e) = self.hand_over(&envs).await {
            tracing::warn!(replica = %id, error = %e, "handing environments over failed; they move when their leases expire");
        }
        if let Err(e) = store::replicas::remove(pool, id).await {
            tracing::warn!(replica = %id, error = %e, "could not deregister");
        }
        tracing::info!(replica = %id, environments = count, ms = started.elapsed().as_millis() as u64, "environments handed over");
    }

    /// Is this replica stopping?
    pub fn is_stopping(&self) -> bool {
        self.0.stopping.load(Ordering::Acquire)
    }
}

/// How many of `environments` replica `me` should hold: ⌊E/N⌋ or ⌈E/N⌉. The ⌈E/N⌉ places
/// go to the replicas holding the most now (ties by id), so that evening out moves as few
/// environments as it can; every replica computes the same answer from the same leases.
fn fair_share(
    environments: usize,
    live: &[String],
    held: &HashMap<String, usize>,
    me: &str,
) -> usize {
    let n = live.len().max(1);
    let mut order: Vec<(usize, &str)> = live
        .iter()
        .map(|id| (held.get(id).copied().unwrap_or(0), id.as_str()))
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let place = order.iter().position(|(_, id)| *id == me).unwrap_or(n - 1);
    environments / n + usize::from(place < environments % n)
}

/// How much `replica` wants `env` (rendezvous hashing): replicas prefer different
/// environments, so they rarely race for one.
fn score(replica: &str, env: Uuid) -> u64 {
    use sha2::Digest;
    let d = sha2::Sha256::new()
        .chain_update(replica.as_bytes())
        .chain_update(env.as_bytes())
        .finalize();
    u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
}

/// Whether a URL keeps the replica secret off the open network: https, or plain http to a
/// loopback address (`localhost`, 127.0.0.0/8, ::1).
pub fn may_carry_secret(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return url.starts_with("https://");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The replica id kept in `data_dir` (made on first start), and a lock that keeps a second
/// server off the same data dir while this one runs.
pub fn identity(data_dir: &std::path::Path) -> std::io::Result<(String, std::fs::File)> {
    use std::io::{Read, Seek, Write};
    std::fs::create_dir_all(data_dir)?;
    let path = data_dir.join("replica-id");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)?;
    // SAFETY: flock on a descriptor we own
    if unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    } != 0
    {
        return Err(std::io::Error::other(format!(
            "another steward server uses the data directory {} (locked: {})",
            data_dir.display(),
            path.display()
        )));
    }
    let mut id = String::new();
    f.read_to_string(&mut id)?;
    let id = id.trim().to_string();
    if !id.is_empty() {
        return Ok((id, f));
    }
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let short = Uuid::new_v4().simple().to_string();
    let id = if host.is_empty() {
        format!("replica-{}", &short[..8])
    } else {
        format!("{host}-{}", &short[..8])
    };
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{id}")?;
    f.sync_all()?;
    Ok((id, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_goes_over_plain_http_only_to_loopback() {
        for ok in [
            "https://app1.internal:8888",
            "http://127.0.0.1:8888",
            "http://127.3.4.5",
            "http://localhost:1/",
            "http://[::1]:8888",
        ] {
            assert!(may_carry_secret(ok), "{ok}");
        }
        for no in [
            "http://app1.internal:8888",
            "http://10.0.0.5:8888",
            "http://[fe80::1]:8888",
            "http://127.0.0.1.evil.example:80",
            "http://localhost@10.0.0.5/",
            "ftp://127.0.0.1",
        ] {
            assert!(!may_carry_secret(no), "{no}");
        }
    }

    fn shares(e: usize, held: &[(&str, usize)]) -> Vec<usize> {
        let live: Vec<String> = held.iter().map(|(id, _)| id.to_string()).collect();
        let counts: HashMap<String, usize> =
            held.iter().map(|(id, n)| (id.to_string(), *n)).collect();
        live.iter()
            .map(|me| fair_share(e, &live, &counts, me))
            .collect()
    }

    #[test]
    fn shares_differ_by_at_most_one_and_favour_current_holders() {
        assert_eq!(shares(9, &[("a", 3), ("b", 3), ("c", 3)]), vec![3, 3, 3]);
        // a fourth joins: one keeps 3, the others give one each, it gets 2
        assert_eq!(
            shares(9, &[("a", 3), ("b", 3), ("c", 3), ("d", 0)]),
            vec![3, 2, 2, 2]
        );
        // the one holding most keeps the extra place, whatever its id
        assert_eq!(shares(10, &[("a", 3), ("b", 4), ("c", 3)]), vec![3, 4, 3]);
        assert_eq!(shares(100, &[("a", 50), ("b", 50)]), vec![50, 50]);
        assert_eq!(
            shares(100, &[("a", 34), ("b", 33), ("c", 33)]),
            vec![34, 33, 33]
        );
        assert_eq!(shares(0, &[("a", 0)]), vec![0]);
        for (e, n) in [(7usize, 3usize), (100, 7), (1, 4)] {
            let held: Vec<(String, usize)> = (0..n).map(|i| (format!("r{i}"), 0)).collect();
            let held: Vec<(&str, usize)> = held.iter().map(|(a, b)| (a.as_str(), *b)).collect();
            let s = shares(e, &held);
            assert_eq!(s.iter().sum::<usize>(), e);
            assert!(
                s.iter().max().unwrap() - s.iter().min().unwrap() <= 1,
                "{s:?}"
            );
        }
    }
}
