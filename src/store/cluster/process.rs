//! The postmaster of a private cluster: starting it so that "ready" means that *the server
//! we started* accepts connections, recognizing what a crash left behind, stopping what a
//! failed start started, and keeping it running while its owner lives.
//!
//! A `kill -9` of the postmaster (the OOM killer, a power cut of a container) leaves
//! `postmaster.pid` saying `ready` and the socket file behind. Readiness is therefore never
//! read from those files alone: the pid file must name the process we spawned. A pid file
//! whose process is gone, or whose pid now belongs to some other process, is stale and
//! removed (PostgreSQL would refuse to start on the second kind, not knowing it is not a
//! postmaster of this cluster). The backends of a killed postmaster keep its shared memory
//! for a moment; a start refused for that is tried again until they are gone.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{ClusterError, PgCluster, io_err, socket_dir_setting};

/// How long a start may take, crash recovery and waiting for a killed server's backends
/// included.
const START_LIMIT: Duration = Duration::from_secs(60);

/// How often the supervisor looks at the postmaster.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// Why one attempt to start did not give a ready server.
enum Attempt {
    /// The postmaster exited; its log lines (this process's only).
    Exited { status: String, log: String },
    /// Not ready within the limit.
    TimedOut,
}

/// Texts of a postmaster that refused to start because the last one's processes still hold
/// the cluster: they go once they notice their postmaster died, so it is tried again.
const STILL_HELD: &[&str] = &[
    "pre-existing shared memory block",
    "already exists",
    "could not create lock file",
];

/// Is `pid` a process that is alive (not a zombie)?
fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks existence and permission
    let r = unsafe { libc::kill(pid, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    // a zombie (our own child, not reaped yet) is not a running server
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z"),
        Err(_) => true,
    }
}

/// What `postmaster.pid` says: the pid, the port, the first socket directory and the state
/// (lines 1, 4, 5 and 8). A postmaster writes the first five lines at once, the socket
/// directory empty until its sockets exist, and its state after them.
struct PidFile {
    pid: i32,
    port: String,
    sockets: String,
    /// `starting`, `ready`, `standby`, `stopping`; empty before the postmaster wrote it
    state: String,
}

impl PgCluster {
    fn read_pid_file(&self) -> Option<PidFile> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let line = |i: usize| lines.get(i).copied().unwrap_or_default().to_string();
        Some(PidFile {
            pid: lines.first()?.parse().ok()?,
            port: line(3),
            sockets: line(4),
            state: line(7),
        })
    }

    /// The postmaster's pid and state (`ready`, `standby`, `starting`, `stopping`) from
    /// `postmaster.pid`.
    pub(super) fn pid_file(&self) -> Option<(i32, String)> {
        self.read_pid_file().map(|f| (f.pid, f.state))
    }

    /// A live postmaster of this data directory that listens where this cluster does not
    /// (another port, other socket directories): started by hand or by another tool, not by
    /// us. It holds the data directory, and we can not connect to it. Described for the
    /// error, so that a start says so at once instead of waiting for connections that can
    /// not come.
    pub(super) fn foreign_postmaster(&self) -> Option<String> {
        let PidFile {
            pid,
            port,
            sockets,
            state,
        } = self.read_pid_file()?;
        if !self.is_our_postmaster(pid) {
            return None;
        }
        let ours = self.socket_dir();
        let same_port = port == self.port.to_string();
        // without a state its sockets are not known yet (one of ours just starting)
        if same_port && state.is_empty() {
            return None;
        }
        let same_sockets = !sockets.is_empty()
            && (std::path::Path::new(&sockets) == ours
                || std::fs::canonicalize(&sockets)
                    .is_ok_and(|s| ours.canonicalize().is_ok_and(|o| o == s)));
        if same_port && same_sockets {
            return None;
        }
        let sockets = if sockets.is_empty() {
            "no Unix socket".to_string()
        } else {
            format!("sockets in {sockets}")
        };
        Some(format!(
            "a PostgreSQL that Steward did not start runs on this cluster's data directory \
             (pid {pid}, port {port}, {sockets}; Steward's cluster uses port {} with sockets in \
             {}); stop it (pg_ctl stop -D {}) and run again",
            self.port,
            ours.display(),
            self.data_dir().display()
        ))
    }

    /// Is `pid` a live postmaster of this cluster? A postmaster works in its data
    /// directory; where its working directory can not be read (another user's process
    /// behind `hidepid`), a live process is taken for it.
    fn is_our_postmaster(&self, pid: i32) -> bool {
        if !alive(pid) {
            return false;
        }
        match std::fs::read_link(format!("/proc/{pid}/cwd")) {
            Ok(cwd) => {
                let ours = self.data_dir();
                cwd == ours || ours.canonicalize().is_ok_and(|c| c == cwd)
            }
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        }
    }

    /// A fast shutdown, as `pg_ctl stop -m fast` makes it: SIGINT to the postmaster, then
    /// wait until its pid file is gone. Checked every 5 ms, where pg_ctl sleeps 100 ms at a
    /// time: a one-shot `steward deploy` ends that much sooner. None when the postmaster may
    /// not be signalled from here (it is another user's): pg_ctl, run as that user, does it.
    pub(super) fn fast_shutdown(&self, within: Duration) -> Option<Result<(), ClusterError>> {
        let (pid, _) = self.pid_file()?;
        if !self.is_our_postmaster(pid) {
            return Some(Ok(()));
        }
        // SAFETY: kill(2) on the pid the pid file names, just checked to be our postmaster
        if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
            return None;
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if !self.is_running() {
                return Some(Ok(()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(Err(ClusterError::Command {
            what: "stopping PostgreSQL".into(),
            detail: format!("it did not stop within {} s", within.as_secs()),
        }))
    }

    /// Is the server of this cluster running (its pid file names a live postmaster of this
    /// data directory)?
    pub fn is_running(&self) -> bool {
        self.pid_file()
            .is_some_and(|(pid, _)| self.is_our_postmaster(pid))
    }

    /// Remove the pid file and the socket's lock file when they name no postmaster of ours.
    fn clear_stale_lock_files(&self) {
        let Some((pid, _)) = self.pid_file() else {
            return;
        };
        if self.is_our_postmaster(pid) {
            return;
        }
        tracing::info!(cluster = %self.root.display(), pid, "removing the lock files of a PostgreSQL that is gone (it crashed or was killed)");
        let _ = std::fs::remove_file(self.data_dir().join("postmaster.pid"));
        let lock = self
            .socket_dir()
            .join(format!(".s.PGSQL.{}.lock", self.port));
        let _ = std::fs::remove_file(lock);
    }

    /// Start the postmaster on an initialized data dir; ready once the pid file names it
    /// and says it accepts connections (a standby: read-only ones). Whatever the outcome,
    /// nothing it started is left running when this fails.
    pub(super) fn start_server(&self, durable: bool) -> Result<(), ClusterError> {
        let deadline = Instant::now() + START_LIMIT;
        let mut waited_for_old = false;
        loop {
            self.clear_stale_lock_files();
            let mut child = self.spawn_postmaster(durable)?;
            match self.wait_until_ready(&mut child, deadline) {
                Ok(()) => {
                    // reap it when it ends (while we live), so that no zombie looks like a
                    // live server
                    std::thread::spawn(move || {
                        let _ = child.wait();
                    });
                    return Ok(());
                }
                Err(Attempt::Exited { log, .. })
                    if Instant::now() < deadline && STILL_HELD.iter().any(|t| log.contains(t)) =>
                {
                    if !waited_for_old {
                        waited_for_old = true;
                        tracing::info!(cluster = %self.root.display(), "the processes of a PostgreSQL that died still hold the cluster; starting again once they are gone");
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(Attempt::Exited { status, log }) => {
                    return Err(ClusterError::Command {
                        what: "postgres start".into(),
                        detail: format!("postgres exited ({status})\n{log}"),
                    });
                }
                Err(Attempt::TimedOut) => {
                    self.kill_postmaster(&mut child);
                    return Err(ClusterError::Command {
                        what: "PostgreSQL start".into(),
                        detail: format!(
                            "not ready after {} s (stopped again); the end of {}:\n{}",
                            START_LIMIT.as_secs(),
                            self.log_file().display(),
                            self.log_tail(0, 8)
                        ),
                    });
                }
            }
        }
    }

    fn spawn_postmaster(&self, durable: bool) -> Result<Child, ClusterError> {
        // started directly, not with `pg_ctl start`: that one runs its command line (with
        // the data dir and log paths in it) through /bin/sh
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.log_file())
            .map_err(io_err(&self.log_file()))?;
        self.chown_tree(&self.log_file())?;
        let log2 = log.try_clone().map_err(io_err(&self.log_file()))?;
        let mut c = self.command("postgres");
        c.arg("-D")
            .arg(self.data_dir())
            .args(["-c", "listen_addresses="])
            .arg("-c")
            .arg(format!(
                "unix_socket_directories={}",
                socket_dir_setting(&self.socket_dir())
            ))
            .args(["-c", "unix_socket_permissions=0700"])
            .args(["-c", "password_encryption=scram-sha-256"])
            .args(["-p", &self.port.to_string()])
            .arg("-c")
            .arg(format!("max_connections={}", self.max_connections))
            .args(["-c", "shared_buffers=64MB"]);
        if !durable {
            c.args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                // a test run makes hundreds of databases, each written to the WAL whole:
                // the default 1 GB of WAL kept between checkpoints is disk CI may not have
                "-c",
                "max_wal_size=256MB",
            ]);
        }
        // the server outlives us; it must not keep our stdout/stderr open
        c.stdout(log).stderr(log2);
        c.spawn().map_err(|e| ClusterError::Command {
            what: "starting postgres".into(),
            detail: e.to_string(),
        })
    }

    /// Wait until the pid file names `child` and says it accepts connections, and the
    /// socket is there.
    fn wait_until_ready(&self, child: &mut Child, deadline: Instant) -> Result<(), Attempt> {
        let sock = self.socket_dir().join(format!(".s.PGSQL.{}", self.port));
        let pid = child.id() as i32;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(Attempt::Exited {
                    status: status.to_string(),
                    log: self.log_tail(pid, 8),
                });
            }
            let ready = self.pid_file().is_some_and(|(p, state)| {
                p == pid && matches!(state.as_str(), "ready" | "standby")
            });
            if ready && sock.exists() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Attempt::TimedOut);
            }
            // a postmaster is ready 25-40 ms after its start: looked at every 5 ms (a read
            // of a small file), `steward deploy` and a server start waste little of it
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stop a postmaster we started and must not leave behind: immediate shutdown (it takes
    /// its backends along), then SIGKILL.
    fn kill_postmaster(&self, child: &mut Child) {
        let pid = child.id() as i32;
        // SAFETY: kill(2) on the pid of our own child, not reaped yet
        unsafe { libc::kill(pid, libc::SIGQUIT) };
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The last `lines` lines of the log; of one process only when `pid` is not 0 (the
    /// default prefix has `[pid]`).
    fn log_tail(&self, pid: i32, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        let marker = format!("[{pid}]");
        let mine: Vec<&str> = log
            .lines()
            .filter(|l| pid == 0 || l.contains(&marker))
            .collect();
        mine[mine.len().saturating_sub(lines)..].join("\n")
    }

    /// Wait until a server that runs already (left by a killed owner, or in crash recovery)
    /// takes a real connection.
    pub(super) fn wait_for_connections(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let mut c = self.client_command("psql")?;
            c.args([
                "-X", "-w", "-q", "-A", "-t", "-d", "postgres", "-U", "postgres", "-h",
            ])
            .arg(self.socket_dir())
            .args(["-p", &self.port.to_string(), "-c", "SELECT 1"])
            .env("PGCONNECT_TIMEOUT", "5");
            match self.run("psql", c) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline || !self.is_running() => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Keep the server running while the returned guard lives: a postmaster that died
    /// (the OOM killer, `kill -9`) is started again, with a growing pause after failed
    /// starts. It is looked at every second and started only after it was seen down twice,
    /// so a `pg_ctl restart` by an operator is not raced. [`PgCluster::stop`] ends it.
    pub fn supervise(self: &Arc<Self>, durable: bool) -> Supervisor {
        let cluster = Arc::downgrade(self);
        let thread = std::thread::Builder::new()
            .name("pg-supervisor".into())
            .spawn(move || {
                let mut down_since: Option<Instant> = None;
                let mut pause = SUPERVISE_EVERY;
                loop {
                    std::thread::sleep(pause);
                    let Some(c) = cluster.upgrade() else { return };
                    if c.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    if c.is_running() {
                        down_since = None;
                        pause = SUPERVISE_EVERY;
                        continue;
                    }
                    let Some(since) = down_since else {
                        down_since = Some(Instant::now());
                        continue;
                    };
                    tracing::warn!(cluster = %c.root.display(), "the private PostgreSQL is not running (its postmaster died); starting it again");
                    match c.restart_unless_stopping(durable) {
                        Ok(()) => {
                            tracing::info!(cluster = %c.root.display(), down_secs = since.elapsed().as_secs_f64(), "the private PostgreSQL runs again");
                            down_since = None;
                            pause = SUPERVISE_EVERY;
                        }
                        Err(e) => {
                            pause = (pause * 2).min(Duration::from_secs(30));
                            tracing::error!(cluster = %c.root.display(), error = %e, retry_in_secs = pause.as_secs(), "starting the private PostgreSQL again failed");
                        }
                    }
                }
            })
            .ok();
        Supervisor { _thread: thread }
    }

    fn restart_unless_stopping(&self, durable: bool) -> Result<(), ClusterError> {
        let _turn = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopping.load(Ordering::SeqCst) || self.is_running() {
            return Ok(());
        }
        // the directories may have been changed meanwhile (an operator's chmod)
        for d in [self.root.clone(), self.socket_dir()] {
            let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
        }
        self.start_server(durable)
    }
}

/// The supervisor of [`PgCluster::supervise`]; it ends with the cluster's last owner or
/// its stop.
pub struct Supervisor {
    _thread: Option<std::thread::JoinHandle<()>>,
}
