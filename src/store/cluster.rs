//! A private PostgreSQL cluster: `initdb` + `postgres`, listening only on a unix socket in its
//! own directory, with password (SCRAM) authentication.
//!
//! Layout under the cluster root: `data/` (the cluster), `run/` (the socket), `postgres.log`,
//! `secret` (the password of the `postgres` role). As root, the cluster runs as the `postgres`
//! user (PostgreSQL refuses to run as root); the root then belongs to that user. Starting is
//! idempotent: a cluster left running by a killed server is reused (its socket answers), one
//! that is down is started.
//!
//! Who can get in (see SECURITY.md, "The private PostgreSQL"): the root and the socket
//! directory are mode 0700 (owned by the server's user, or by `postgres` when the server runs
//! as root; root passes anyway), the socket itself is 0700, there is no TCP listener, and
//! `pg_hba.conf` allows only `local` connections with `scram-sha-256`. The password is
//! generated once (32 random bytes, hex) into `secret` (0600, owned by the server's user) and
//! is reused on every start; it travels only in the database URL of [`PgCluster::url`] and in
//! the environment of our own `psql`/`createdb` children, never on a command line.
//!
//! A cluster made by an older version (trust authentication) is upgraded on start: the server
//! is stopped if it runs, the password is set in single-user mode (`postgres --single`, no
//! socket, the statement on its stdin), then `pg_hba.conf` is replaced and the server started.
//!
//! No shell ever sees a path: `postgres` is started directly (not through `pg_ctl start`,
//! which runs its command line through `/bin/sh`), and the watchdogs are a fixed `sh` script
//! that gets the paths as positional parameters.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The first line of a `pg_hba.conf` written by us: a cluster without it still has the trust
/// authentication of older versions and is upgraded on start.
const HBA_MARKER: &str = "# steward: password (scram-sha-256) logins on the unix socket only";

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "PostgreSQL binaries not found: {0} (install the PostgreSQL server package, or give a database URL)"
    )]
    MissingBinaries(String),
    #[error("{what} failed: {detail}")]
    Command { what: String, detail: String },
    #[error("io error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ClusterError + '_ {
    move |source| ClusterError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Where the PostgreSQL server binaries live.
fn find_bin_dir() -> Result<PathBuf, ClusterError> {
    if let Ok(dir) = std::env::var("STEWARD_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(path) = std::env::var("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .collect();
        versions.sort();
        versions.reverse();
        candidates.extend(versions);
    }
    candidates.push(PathBuf::from("/usr/local/pgsql/bin"));
    let needed = ["initdb", "pg_ctl", "postgres", "createdb", "psql"];
    for c in candidates {
        if needed.iter().all(|b| c.join(b).is_file()) {
            return Ok(c);
        }
    }
    Err(ClusterError::MissingBinaries(needed.join(", ")))
}

/// The uid/gid to run PostgreSQL as when we are root.
fn postgres_user() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.first() == Some(&"postgres") && f.len() > 3 {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        } else {
            None
        }
    })
}

fn is_root() -> bool {
    // the effective uid of this process: /proc/self/status "Uid: real effective …"
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Can the postgres user walk down to `path` (search permission on every directory above)?
fn reachable_by(path: &Path, (uid, gid): (u32, u32)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(abs) = path.canonicalize() else {
        return false;
    };
    abs.ancestors().skip(1).all(|dir| {
        let Ok(m) = std::fs::metadata(dir) else {
            return false;
        };
        let mode = m.mode();
        if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        }
    })
}

/// As root, a cluster under a directory the postgres user can not enter (a checkout in
/// /root, say) lives in /var/lib/steward/clusters instead, and `root` becomes a link to it:
/// the data stays where the user expects to find it, and PostgreSQL can reach it.
fn relocate_if_unreachable(root: &Path, user: (u32, u32)) -> Result<(), ClusterError> {
    if root.is_symlink() || reachable_by(root, user) {
        return Ok(());
    }
    use sha2::Digest;
    let abs = root.canonicalize().map_err(io_err(root))?;
    let digest = hex::encode(sha2::Sha256::digest(abs.display().to_string().as_bytes()));
    let home = Path::new("/var/lib/steward/clusters").join(&digest[..16]);
    std::fs::create_dir_all(&home).map_err(io_err(&home))?;
    if std::fs::read_dir(root)
        .map_err(io_err(root))?
        .next()
        .is_some()
    {
        return Err(ClusterError::Command {
            what: "placing the PostgreSQL cluster".into(),
            detail: format!(
                "{} is not reachable by the postgres user and is not empty; make its parent directories searchable (chmod o+x) or move the project",
                root.display()
            ),
        });
    }
    std::fs::remove_dir(root).map_err(io_err(root))?;
    std::os::unix::fs::symlink(&home, root).map_err(io_err(root))?;
    tracing::info!(link = %root.display(), cluster = %home.display(), "the postgres user can not reach the data dir: the cluster lives elsewhere");
    Ok(())
}

/// The effective uid of this process.
fn euid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions
    unsafe { libc::geteuid() }
}

/// `s` percent-encoded for a URL query value (everything but unreserved characters and `/`).
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A fresh password: 32 bytes from the kernel's random source, in hex.
fn generate_secret() -> Result<String, ClusterError> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: getrandom(2) writes at most len bytes into the buffer we own
        let n = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ClusterError::Command {
                what: "generating the database password".into(),
                detail: e.to_string(),
            });
        }
        filled += n as usize;
    }
    Ok(hex::encode(bytes))
}

/// `path` as one entry of `unix_socket_directories`: double-quoted, quotes doubled.
fn socket_dir_setting(path: &Path) -> String {
    format!("\"{}\"", path.display().to_string().replace('"', "\"\""))
}

mod process;
mod standby;

pub use process::Supervisor;

pub struct PgCluster {
    root: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    /// The password of the `postgres` role, read or generated on start. No Debug, no Display:
    /// it must not end up in a log.
    secret: std::sync::OnceLock<String>,
    /// The secret was generated by this process and is not the role's password yet.
    password_pending: std::sync::atomic::AtomicBool,
    /// Set by [`PgCluster::stop`]: the supervisor must not start it again.
    stopping: std::sync::atomic::AtomicBool,
    /// Held while starting or stopping: the supervisor and the owner take turns.
    lifecycle: std::sync::Mutex<()>,
    /// The server's `max_connections` ([`PgCluster::with_max_connections`]).
    max_connections: u32,
}

/// `max_connections` of a cluster's server unless set otherwise.
const DEFAULT_MAX_CONNECTIONS: u32 = 200;

impl PgCluster {
    /// A cluster rooted at `root` (created on first start).
    pub fn new(root: &Path) -> Result<PgCluster, ClusterError> {
        std::fs::create_dir_all(root).map_err(io_err(root))?;
        let run_as = postgres_user();
        if let Some(user) = run_as {
            relocate_if_unreachable(root, user)?;
        }
        let root = root.canonicalize().map_err(io_err(root))?;
        Ok(PgCluster {
            root,
            bin: find_bin_dir()?,
            run_as,
            port: 5432,
            secret: std::sync::OnceLock::new(),
            password_pending: std::sync::atomic::AtomicBool::new(false),
            stopping: std::sync::atomic::AtomicBool::new(false),
            lifecycle: std::sync::Mutex::new(()),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        })
    }

    /// The same cluster, its server started with at most `n` connections (the default,
    /// 200, is for a server and its replicas' pools). PostgreSQL sizes its shared memory
    /// (lock tables, process slots) by it and sets it up on every start: a private
    /// `steward deploy` cluster, which one process with a pool of 8 uses, starts 2-8 ms
    /// sooner with 40.
    pub fn with_max_connections(mut self, n: u32) -> PgCluster {
        self.max_connections = n;
        self
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A digest of the cluster's control file (`global/pg_control`). PostgreSQL rewrites it
    /// on every start (its state becomes "in production") and on every stop (a new shutdown
    /// checkpoint, always written, at a later WAL position): the same digest after a stop
    /// and before the next start means nobody ran this cluster in between, so its data is
    /// as that stop left it. None when it can not be read.
    pub fn control_stamp(&self) -> Option<[u8; 32]> {
        use sha2::Digest;
        let bytes = std::fs::read(self.data_dir().join("global").join("pg_control")).ok()?;
        Some(sha2::Sha256::digest(&bytes).into())
    }

    /// Whether a cluster rooted at `root` was made already (its data dir is initialized).
    pub fn exists_at(root: &Path) -> bool {
        root.join("data").join("PG_VERSION").is_file()
    }

    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    pub fn log_file(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    /// Where the password of the `postgres` role lives (0600, owned by the server's user).
    pub fn secret_file(&self) -> PathBuf {
        self.root.join("secret")
    }

    /// The password of the `postgres` role: read from [`Self::secret_file`], generated there
    /// on first use (then the next start sets it as the role's password).
    fn load_or_create_secret(&self) -> Result<String, ClusterError> {
        if let Some(s) = self.secret.get() {
            return Ok(s.clone());
        }
        let path = self.secret_file();
        let secret = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => {
                let m = f.metadata().map_err(io_err(&path))?;
                if !m.is_file() || m.uid() != euid() {
                    return Err(ClusterError::Command {
                        what: "reading the database password".into(),
                        detail: format!(
                            "{} is not a regular file owned by this user",
                            path.display()
                        ),
                    });
                }
                if m.mode() & 0o077 != 0 {
                    f.set_permissions(std::fs::Permissions::from_mode(0o600))
                        .map_err(io_err(&path))?;
                }
                let text = std::io::read_to_string(f).map_err(io_err(&path))?;
                let secret = text.trim().to_string();
                if secret.is_empty() {
                    return Err(ClusterError::Command {
                        what: "reading the database password".into(),
                        detail: format!("{} is empty", path.display()),
                    });
                }
                secret
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let secret = generate_secret()?;
                // written under another name and renamed: a crash leaves no half secret
                let tmp = self.root.join(".secret.tmp");
                let _ = std::fs::remove_file(&tmp);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&tmp)
                    .map_err(io_err(&tmp))?;
                f.write_all(format!("{secret}\n").as_bytes())
                    .and_then(|_| f.sync_all())
                    .map_err(io_err(&tmp))?;
                std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
                self.password_pending
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                secret
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let _ = self.secret.set(secret.clone());
        Ok(secret)
    }

    /// `postgres://postgres:<password>@localhost/<db>?host=<socket dir>&port=5432`: it holds
    /// the password, never log it. Valid once the cluster was started.
    pub fn url(&self, db: &str) -> String {
        let secret = self.load_or_create_secret().unwrap_or_default();
        format!(
            "postgres://postgres:{secret}@localhost/{}?host={}&port={}",
            url_encode(db),
            url_encode(&self.socket_dir().display().to_string()),
            self.port
        )
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.stdin(Stdio::null());
        // its own process group: a Ctrl-C meant for us must not shut the database down
        // under a run that is still writing its state
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        if let Some((uid, gid)) = self.run_as {
            use std::os::unix::process::CommandExt;
            c.uid(uid).gid(gid);
            c.env("HOME", &self.root);
        }
        // never inherit a PGDATA/PGHOST meant for another cluster
        c.env_remove("PGDATA")
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGPASSWORD")
            .env_remove("PGPASSFILE");
        c
    }

    /// A client program (`psql`, `createdb`) that logs in with the password: it gets it in
    /// its environment (readable only by its own user), never on its command line.
    fn client_command(&self, program: &str) -> Result<Command, ClusterError> {
        let secret = self.load_or_create_secret()?;
        let mut c = self.command(program);
        c.env("PGPASSWORD", secret);
        Ok(c)
    }

    fn run(&self, what: &str, mut c: Command) -> Result<String, ClusterError> {
        let out = c.output().map_err(|e| ClusterError::Command {
            what: what.into(),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(ClusterError::Command {
                what: what.into(),
                detail: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    String::from_utf8_lossy(&out.stdout).trim()
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    fn chown_tree(&self, path: &Path) -> Result<(), ClusterError> {
        let Some((uid, gid)) = self.run_as else {
            return Ok(());
        };
        // never through a symbolic link: the postgres user could point one anywhere
        std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io_err(path))?;
        let meta = std::fs::symlink_metadata(path).map_err(io_err(path))?;
        if meta.is_dir() {
            for e in std::fs::read_dir(path).map_err(io_err(path))? {
                let e = e.map_err(io_err(path))?;
                self.chown_tree(&e.path())?;
            }
        }
        Ok(())
    }

    /// Make the directories the postgres user needs, reachable by nobody else (0700); as
    /// root, hand them over.
    fn prepare(&self) -> Result<(), ClusterError> {
        for d in [self.root.clone(), self.socket_dir()] {
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
            if std::fs::symlink_metadata(&d)
                .map_err(io_err(&d))?
                .is_symlink()
            {
                return Err(ClusterError::Command {
                    what: "preparing the PostgreSQL cluster".into(),
                    detail: format!("{} is a symbolic link", d.display()),
                });
            }
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err(&d))?;
        }
        if self.run_as.is_some() {
            std::os::unix::fs::chown(
                &self.root,
                self.run_as.map(|x| x.0),
                self.run_as.map(|x| x.1),
            )
            .map_err(io_err(&self.root))?;
            self.chown_tree(&self.socket_dir())?;
            if self.log_file().exists() {
                self.chown_tree(&self.log_file())?;
            }
        }
        Ok(())
    }

    pub fn is_initialized(&self) -> bool {
        Self::exists_at(&self.root)
    }

    fn is_secured(&self) -> bool {
        std::fs::read_to_string(self.data_dir().join("pg_hba.conf"))
            .map(|t| t.starts_with(HBA_MARKER))
            .unwrap_or(false)
    }

    /// Set the password of the `postgres` role in single-user mode (the server must be
    /// down): no socket is opened, the statement goes in on stdin.
    fn set_password_offline(&self, secret: &str) -> Result<(), ClusterError> {
        let mut c = self.command("postgres");
        c.arg("--single")
            .arg("-D")
            .arg(self.data_dir())
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "password_encryption=scram-sha-256",
                // a failing statement must not be echoed to the log with the password in it
                "-c",
                "log_min_error_statement=panic",
                "postgres",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| ClusterError::Command {
            what: "postgres --single".into(),
            detail: e.to_string(),
        })?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let written =
            stdin.write_all(format!("ALTER ROLE postgres PASSWORD '{secret}'\n").as_bytes());
        drop(stdin);
        let out = child
            .wait_with_output()
            .map_err(|e| ClusterError::Command {
                what: "postgres --single".into(),
                detail: e.to_string(),
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr).replace(secret, "<password>");
        if written.is_err() || !out.status.success() || stderr.contains("ERROR") {
            return Err(ClusterError::Command {
                what: "setting the database password (postgres --single)".into(),
                detail: stderr.trim().to_string(),
            });
        }
        Ok(())
    }

    /// Only password (SCRAM) logins, only on the unix socket; written last, once the role
    /// has its password.
    fn write_hba(&self) -> Result<(), ClusterError> {
        let path = self.data_dir().join("pg_hba.conf");
        let tmp = self.data_dir().join("pg_hba.conf.steward");
        let _ = std::fs::remove_file(&tmp);
        let text = format!(
            "{HBA_MARKER}\n# (written by steward on start; see SECURITY.md)\n# TYPE  DATABASE  USER  METHOD\nlocal   all       all   scram-sha-256\n"
        );
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(io_err(&tmp))?;
        self.chown_tree(&tmp)?;
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        Ok(())
    }

    /// Initialize if needed and start (or reuse a running server once it takes
    /// connections). `durable = false` turns off fsync: for test clusters only. A start that
    /// fails leaves no server it started running.
    pub fn start(&self, durable: bool) -> Result<(), ClusterError> {
        let _turn = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        self.stopping
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.prepare()?;
        let secret = self.load_or_create_secret()?;
        if !self.is_initialized() {
            // trust only until the password is set below, with no server running: nobody
            // can connect in between
            let mut c = self.command("initdb");
            c.arg("-D").arg(self.data_dir()).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
            ]);
            if !durable {
                c.arg("--no-sync");
            }
            self.run("initdb", c)?;
        }
        // one we can not connect to (started by hand on this data dir) is never waited for,
        // nor stopped
        if let Some(foreign) = self.foreign_postmaster() {
            return Err(ClusterError::Command {
                what: "PostgreSQL start".into(),
                detail: foreign,
            });
        }
        let pending = &self.password_pending;
        if !self.is_secured() || pending.load(std::sync::atomic::Ordering::SeqCst) {
            // a cluster of an older version (trust authentication), or one whose secret was
            // lost: set the password with the server down, then switch to scram
            if self.is_running() {
                tracing::info!(cluster = %self.root.display(), "restarting the private PostgreSQL cluster to turn on password authentication");
                self.stop_server()?;
            }
            self.set_password_offline(&secret)?;
            self.write_hba()?;
            pending.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        if self.is_running() {
            // left running by an owner that was killed, or still recovering from a crash:
            // ready once it takes a real connection
            match self.wait_for_connections() {
                Ok(()) => return Ok(()),
                Err(e) if self.is_running() => return Err(e),
                // it was dying as we looked (killed together with its owner a moment
                // ago): start one of our own
                Err(_) => {
                    tracing::info!(cluster = %self.root.display(), "the PostgreSQL that was running is gone (killed as this start looked at it); starting it");
                }
            }
        }
        self.start_server(durable)
    }

    /// Stop the server (fast shutdown: sessions are cut, data is safe), and its supervisor.
    pub fn stop(&self) -> Result<(), ClusterError> {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let _turn = self.lifecycle.lock().unwrap_or_else(|e| e.into_inner());
        self.stop_server()
    }

    fn stop_server(&self) -> Result<(), ClusterError> {
        if !self.is_running() {
            return Ok(());
        }
        if let Some(stopped) = self.fast_shutdown(std::time::Duration::from_secs(60)) {
            return stopped;
        }
        let mut c = self.command("pg_ctl");
        c.arg("stop")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "fast", "-w", "-t", "60"]);
        c.stdout(Stdio::null());
        self.run("pg_ctl stop", c).map(|_| ())
    }

    /// Create a database unless it exists.
    pub fn ensure_database(&self, name: &str) -> Result<(), ClusterError> {
        let mut c = self.client_command("psql")?;
        c.args([
            "-X", "-w", "-q", "-A", "-t", "-d", "postgres", "-U", "postgres", "-h",
        ])
        .arg(self.socket_dir())
        .args(["-p", &self.port.to_string(), "-c"])
        .arg(format!(
            "SELECT 1 FROM pg_database WHERE datname = '{}'",
            name.replace('\'', "''")
        ));
        let exists = self.run("psql", c)?.trim() == "1";
        if !exists {
            let mut c = self.client_command("createdb")?;
            c.args(["-w", "-U", "postgres", "-h"])
                .arg(self.socket_dir())
                .args(["-p", &self.port.to_string(), "--", name]);
            self.run("createdb", c)?;
        }
        Ok(())
    }

    /// The command (program and arguments, for exec, never for a shell) that stops this
    /// cluster (`mode`: fast or immediate), for watchdogs: run as root, it drops to the
    /// postgres user for pg_ctl.
    pub fn stop_command(&self, mode: &str) -> Vec<OsString> {
        let mut argv: Vec<OsString> = Vec::new();
        if let Some((uid, gid)) = self.run_as {
            argv.extend([
                "setpriv".into(),
                format!("--reuid={uid}").into(),
                format!("--regid={gid}").into(),
                "--clear-groups".into(),
            ]);
        }
        argv.push(self.bin.join("pg_ctl").into_os_string());
        argv.extend(["stop".into(), "-D".into()]);
        argv.push(self.data_dir().into_os_string());
        argv.extend(["-m".into(), mode.into()]);
        argv
    }

    /// A process that stops this cluster and removes its directory once `pid` (normally
    /// ours) has exited, however it ends: test clusters must not outlive their test binary.
    pub fn remove_when_process_exits(&self, pid: u32) -> Result<(), ClusterError> {
        // a fixed script: the pid, the root and the stop command are positional parameters,
        // so no path is ever parsed by the shell
        const SCRIPT: &str = r#"pid=$1; root=$2; shift 2
while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
"$@" >/dev/null 2>&1
rm -rf -- "$root""#;
        Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("steward-pg-watchdog")
            .arg(pid.to_string())
            .arg(&self.root)
            .args(self.stop_command("immediate"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ClusterError::Command {
                what: "watchdog".into(),
                detail: e.to_string(),
            })?;
        Ok(())
    }
}
