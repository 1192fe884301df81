//! A private PostgreSQL cluster: `initdb` + `pg_ctl`, listening only on a unix socket in its
//! own directory.
//!
//! Layout under the cluster root: `data/` (the cluster), `run/` (the socket), `postgres.log`.
//! As root, the cluster runs as the `postgres` user (PostgreSQL refuses to run as root); the
//! root then belongs to that user. Starting is idempotent: a cluster left running by a killed
//! server is reused (its socket answers), one that is down is started.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
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

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError + '_ {
    move |source| EmbeddedError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Where the PostgreSQL server binaries live.
fn find_bin_dir() -> Result<PathBuf, EmbeddedError> {
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
    let needed = ["initdb", "pg_ctl", "createdb", "psql"];
    for c in candidates {
        if needed.iter().all(|b| c.join(b).is_file()) {
            return Ok(c);
        }
    }
    Err(EmbeddedError::MissingBinaries(needed.join(", ")))
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
fn relocate_if_unreachable(root: &Path, user: (u32, u32)) -> Result<(), EmbeddedError> {
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
        return Err(EmbeddedError::Command {
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

pub struct PgCluster {
    root: PathBuf,
    bin: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
}

impl PgCluster {
    /// A cluster rooted at `root` (created on first start).
    pub fn new(root: &Path) -> Result<PgCluster, EmbeddedError> {
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
        })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    pub fn log_file(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    /// `postgres://postgres@/<db>?host=<socket dir>&port=5432`
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@localhost/{db}?host={}&port={}",
            self.socket_dir().display(),
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
            .env_remove("PGPORT");
        c
    }

    fn run(&self, what: &str, mut c: Command) -> Result<String, EmbeddedError> {
        let out = c.output().map_err(|e| EmbeddedError::Command {
            what: what.into(),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(EmbeddedError::Command {
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

    fn chown_tree(&self, path: &Path) -> Result<(), EmbeddedError> {
        let Some((uid, gid)) = self.run_as else {
            return Ok(());
        };
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io_err(path))?;
        if path.is_dir() {
            for e in std::fs::read_dir(path).map_err(io_err(path))? {
                let e = e.map_err(io_err(path))?;
                self.chown_tree(&e.path())?;
            }
        }
        Ok(())
    }

    /// Make the directories the postgres user needs; as root, hand them over.
    fn prepare(&self) -> Result<(), EmbeddedError> {
        for d in [self.root.clone(), self.socket_dir()] {
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
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
        self.data_dir().join("PG_VERSION").is_file()
    }

    /// Is the server of this cluster running (pid file and a live process)?
    pub fn is_running(&self) -> bool {
        let mut c = self.command("pg_ctl");
        c.arg("status").arg("-D").arg(self.data_dir());
        c.stdout(Stdio::null()).stderr(Stdio::null());
        c.status().map(|s| s.success()).unwrap_or(false)
    }

    /// Initialize if needed and start (or reuse a running server). `durable = false` turns
    /// off fsync: for test clusters only.
    pub fn start(&self, durable: bool) -> Result<(), EmbeddedError> {
        self.prepare()?;
        if !self.is_initialized() {
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
        if self.is_running() {
            return Ok(());
        }
        // a stale pid file after a crash is handled by pg_ctl itself
        let mut opts = format!(
            "-c listen_addresses='' -k {} -p {} -c max_connections=200 -c shared_buffers=64MB",
            self.socket_dir().display(),
            self.port
        );
        if !durable {
            opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        let mut c = self.command("pg_ctl");
        c.arg("start")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_file())
            .args(["-w", "-t", "60", "-o"])
            .arg(opts);
        // pg_ctl must not keep our stdout/stderr open: the server it starts outlives it
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let out = c.output().map_err(|e| EmbeddedError::Command {
            what: "pg_ctl start".into(),
            detail: e.to_string(),
        })?;
        if !out.status.success() {
            let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            return Err(EmbeddedError::Command {
                what: "pg_ctl start".into(),
                detail: format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ),
            });
        }
        self.wait_for_socket(Duration::from_secs(30))
    }

    fn wait_for_socket(&self, limit: Duration) -> Result<(), EmbeddedError> {
        let sock = self.socket_dir().join(format!(".s.PGSQL.{}", self.port));
        let start = Instant::now();
        while start.elapsed() < limit {
            if sock.exists() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(EmbeddedError::Command {
            what: "PostgreSQL start".into(),
            detail: format!("socket {} did not appear", sock.display()),
        })
    }

    /// Stop the server (fast shutdown: sessions are cut, data is safe).
    pub fn stop(&self) -> Result<(), EmbeddedError> {
        if !self.is_running() {
            return Ok(());
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
    pub fn ensure_database(&self, name: &str) -> Result<(), EmbeddedError> {
        let mut c = self.command("psql");
        c.args([
            "-X", "-q", "-A", "-t", "-d", "postgres", "-U", "postgres", "-h",
        ])
        .arg(self.socket_dir())
        .args(["-p", &self.port.to_string(), "-c"])
        .arg(format!(
            "SELECT 1 FROM pg_database WHERE datname = '{}'",
            name.replace('\'', "''")
        ));
        let exists = self.run("psql", c)?.trim() == "1";
        if !exists {
            let mut c = self.command("createdb");
            c.args(["-U", "postgres", "-h"])
                .arg(self.socket_dir())
                .args(["-p", &self.port.to_string(), name]);
            self.run("createdb", c)?;
        }
        Ok(())
    }

    /// A shell command line that stops this cluster (`mode`: fast or immediate), for
    /// watchdogs: run as root, it drops to the postgres user for pg_ctl.
    pub fn stop_command_line(&self, mode: &str) -> String {
        let mut pg_ctl = self.bin.join("pg_ctl").display().to_string();
        if let Some((uid, gid)) = self.run_as {
            pg_ctl = format!("setpriv --reuid={uid} --regid={gid} --clear-groups {pg_ctl}");
        }
        format!("{pg_ctl} stop -D '{}' -m {mode}", self.data_dir().display())
    }

    /// A process that stops this cluster and removes its directory once `pid` (normally
    /// ours) has exited, however it ends: test clusters must not outlive their test binary.
    pub fn remove_when_process_exits(&self, pid: u32) -> Result<(), EmbeddedError> {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {} >/dev/null 2>&1; rm -rf '{}'",
            self.stop_command_line("immediate"),
            self.root.display()
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| EmbeddedError::Command {
                what: "watchdog".into(),
                detail: e.to_string(),
            })?;
        Ok(())
    }
}
