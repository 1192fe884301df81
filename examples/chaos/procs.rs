//! The processes the harness drives: the `steward server` child (kill -9, restart on the
//! same data dir and port, graceful stop), its `steward executor` children, and the private
//! PostgreSQL cluster under `<data dir>/pg` (restarted under the running server).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use steward::store::cluster::PgCluster;

/// A `steward server` child process; killed (and its cluster stopped) when dropped, so a
/// panic or an early return leaves nothing running.
pub struct Server {
    bin: PathBuf,
    pub data_dir: PathBuf,
    pub port: u16,
    token: String,
    pub log: PathBuf,
    child: Option<Child>,
    /// How many times it was started.
    pub starts: u32,
    /// When it was last started.
    pub started_at: Option<Instant>,
    /// `CHAOS_RUN` in the environment of the server and of everything it starts (executors,
    /// compiles, the commands of handlers): how what it left behind is found.
    pub marker: String,
}

impl Server {
    pub fn new(bin: &Path, data_dir: &Path, port: u16, token: &str, log: &Path) -> Server {
        Server {
            bin: bin.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            port,
            token: token.to_string(),
            log: log.to_path_buf(),
            child: None,
            starts: 0,
            started_at: None,
            marker: format!("{}-{port}", std::process::id()),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Start it (its output appended to the log file).
    pub fn spawn(&mut self) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("server log {}: {e}", self.log.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        // it dies with us, even if we are killed: a harness must not leave a server behind.
        // (The signal comes when the spawning thread ends: the harness spawns from the thread
        // that runs its future, which lives as long as the run.)
        // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .arg("server")
            // the harness's repositories are local (file://)
            .arg("--allow-local-git-sources")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--bind")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--admin-token")
            .arg(&self.token)
            // retention (and so the pruning of agents nobody deploys to) within the run
            .arg("--prune-interval")
            .arg("30")
            // nothing from the caller's environment may point it elsewhere
            .env_remove("STEWARD_DATABASE_URL")
            .env_remove("STEWARD_NO_AUTH")
            .env_remove("STEWARD_NO_SCHEDULER")
            .env_remove("STEWARD_EXECUTOR_BIN")
            .env_remove("STEWARD_BIND")
            .env_remove("STEWARD_DATA_DIR")
            .env(MARKER, &self.marker)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {} server: {e}", self.bin.display()))?;
        self.child = Some(child);
        self.starts += 1;
        self.started_at = Some(Instant::now());
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Is the child still running (an exit is reaped and reported)?
    pub fn alive(&mut self) -> Result<bool, String> {
        let Some(c) = self.child.as_mut() else {
            return Ok(false);
        };
        match c.try_wait() {
            Ok(None) => Ok(true),
            Ok(Some(status)) => {
                self.child = None;
                Err(format!("the server exited on its own: {status}"))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill9(c.id());
            let _ = c.wait();
        }
    }

    /// SIGTERM (the server stops its cluster), SIGKILL after `limit`.
    pub fn stop(&mut self, limit: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        unsafe {
            libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
        }
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        kill9(c.id());
        let _ = c.wait();
        false
    }

    /// The private cluster, to stop it after a server that could not.
    pub fn cluster(&self) -> Option<PgCluster> {
        let root = self.data_dir.join("pg");
        if !root.exists() {
            return None;
        }
        PgCluster::new(&root).ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        for (pid, _) in marked(&self.marker) {
            kill9(pid);
        }
        if let Some(c) = self.cluster()
            && c.is_running()
        {
            let argv = c.stop_command("immediate");
            let _ = Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir("/")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

const MARKER: &str = "CHAOS_RUN";

/// The processes started by the server of this marker (however far they were reparented),
/// but not us: (pid, command line).
pub fn marked(marker: &str) -> Vec<(u32, String)> {
    let want = format!("{MARKER}={marker}");
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            if pid == me {
                return None;
            }
            let env = std::fs::read(e.path().join("environ")).ok()?;
            if !env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
                return None;
            }
            let cmd = std::fs::read(e.path().join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            Some((pid, cmd.trim().to_string()))
        })
        .collect()
}

pub fn kill9(pid: u32) {
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the server binds it right after).
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Children of `parent`: (pid, command line with NULs as spaces).
pub fn children_of(parent: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces and parentheses
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        out.push((pid, cmd));
    }
    out
}

/// The `… executor` processes the server started: its children, or, where the sandbox puts
/// go-betweens and a namespace's init in between (docs/isolation.md), their descendants.
pub fn executors_of(server: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut parents = vec![(server, 0)];
    while let Some((parent, depth)) = parents.pop() {
        for (pid, cmd) in children_of(parent) {
            if cmd.split_whitespace().nth(1) == Some("executor") {
                found.push(pid);
            } else if depth < 3 {
                parents.push((pid, depth + 1));
            }
        }
    }
    found
}

/// VmRSS and VmHWM of a process, in KiB.
pub fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// `pg_ctl restart -m fast` of the server's private cluster, run the way the server runs
/// pg_ctl (as the postgres user when we are root). Blocking; how long it took.
pub fn restart_postgres(data_dir: &Path) -> Result<Duration, String> {
    let c = PgCluster::new(&data_dir.join("pg")).map_err(|e| e.to_string())?;
    // the cluster's own stop command (pg_ctl, dropping to the postgres user as root), turned
    // into a restart that waits and keeps logging where the server logs
    let mut argv = c.stop_command("fast");
    let Some(verb) = argv.iter().position(|a| a == "stop") else {
        return Err(format!("unexpected pg_ctl command: {argv:?}"));
    };
    argv[verb] = "restart".into();
    argv.extend(["-w".into(), "-t".into(), "60".into(), "-l".into()]);
    argv.push(c.log_file().into_os_string());
    let line = format!("{argv:?}");
    let start = Instant::now();
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{line}: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    Ok(start.elapsed())
}

/// The pid of the private cluster's postmaster, from its pid file.
pub fn postmaster_of(data_dir: &Path) -> Option<u32> {
    std::fs::read_to_string(data_dir.join("pg/data/postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The server's database URL (its private cluster's `steward` database).
pub fn database_url(data_dir: &Path) -> Result<String, String> {
    PgCluster::new(&data_dir.join("pg"))
        .map(|c| c.url("steward"))
        .map_err(|e| e.to_string())
}

/// The last `n` lines of a file (the server log, for a failure).
/// Why a process that logs to `path` ended: its last `error` lines (what the CLI prints
/// before exit status 2, ERROR records), then the last `n` lines: the render of a check
/// shows only its first lines, and the reason must be among them.
pub fn exit_reason(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let errors: Vec<&str> = s
        .lines()
        .rev()
        .filter(|l| l.starts_with("error") || l.contains(" ERROR "))
        .take(3)
        .collect();
    let mut out: Vec<&str> = errors.into_iter().rev().collect();
    out.push("(last lines of its log:)");
    let lines: Vec<&str> = s.lines().collect();
    out.extend(&lines[lines.len().saturating_sub(n)..]);
    out.join("\n")
}

pub fn tail(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
