//! A real OpenSSH server for the SSH transport tests: Debian's `/usr/sbin/sshd` on a free
//! 127.0.0.1 port, as the user running the tests (root or not), with a temporary host key,
//! one authorised client key, and its own `$HOME` for the sessions (so what the transport
//! ships lands in a temporary directory, and a test sees exactly what it touched). Nothing is
//! skipped: without sshd the tests fail and say how to get it (`scripts/test` installs it).

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use steward::scheduler::ssh::{SshAllowed, SshOptions, SshTarget};

const SSHD: &str = "/usr/sbin/sshd";

pub struct Sshd {
    pub port: u16,
    /// The sessions' `$HOME` on the "target".
    pub home: PathBuf,
    /// A known_hosts file with this server's host key.
    pub known_hosts: PathBuf,
    /// The authorised client key.
    pub client_key: PathBuf,
    pub user: String,
    pub dir: tempfile::TempDir,
    child: Child,
}

/// Run a program, panic with its output when it fails.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A new ed25519 key pair at `path` (+ `.pub`); returns the public key's `type base64`.
pub fn keygen(path: &Path) -> String {
    run(
        "ssh-keygen",
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "",
            "-f",
            path.to_str().unwrap(),
        ],
    );
    let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
    public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

impl Sshd {
    pub fn start() -> Sshd {
        Sshd::start_with_path(None)
    }

    /// An sshd whose sessions get `PATH=<path>` (what a target with fewer tools looks like).
    pub fn start_with_path(path: Option<&Path>) -> Sshd {
        assert!(
            Path::new(SSHD).is_file(),
            "{SSHD} is missing: the SSH tests need Debian's openssh-server; run scripts/test, which installs it"
        );
        let dir = tempfile::Builder::new().prefix("sshd").tempdir().unwrap();
        let d = dir.path();
        let host_key = keygen(&d.join("host_key"));
        let client = keygen(&d.join("client_key"));
        std::fs::write(d.join("authorized_keys"), format!("{client}\n")).unwrap();
        let home = d.join("home");
        std::fs::create_dir(&home).unwrap();
        let user = run("id", &["-un"]);
        // SAFETY: geteuid(2) can not fail
        if unsafe { libc::geteuid() } == 0 {
            // sshd running as root wants its privilege separation directory (made by the
            // service manager on a booted system, missing in containers)
            std::fs::create_dir_all("/run/sshd").unwrap();
        }
        for _attempt in 0..5 {
            let port = super::support::free_port();
            let config = d.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile {pid}\n\
                     AuthorizedKeysFile {ak}\nUsePAM no\nPermitRootLogin prohibit-password\n\
                     StrictModes no\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nAuthenticationMethods publickey\n\
                     X11Forwarding no\nPrintMotd no\nAcceptEnv LANG LC_*\n\
                     SetEnv HOME={home}{path}\nLogLevel DEBUG1\n",
                    hk = d.join("host_key").display(),
                    pid = d.join("sshd.pid").display(),
                    ak = d.join("authorized_keys").display(),
                    home = home.display(),
                    path = path
                        .map(|p| format!(" PATH={}", p.display()))
                        .unwrap_or_default(),
                ),
            )
            .unwrap();
            let log = d.join("sshd.log");
            let _ = std::fs::remove_file(&log);
            // -E, not -e: with -e, a session's own debug lines would go down its channel
            let mut child = Command::new(SSHD)
                .arg("-D")
                .arg("-E")
                .arg(&log)
                .arg("-f")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {SSHD}: {e}"));
            let started = Instant::now();
            let up = loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break false;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    break true;
                }
                if started.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let log = std::fs::read_to_string(d.join("sshd.log")).unwrap_or_default();
            if !up {
                if log.contains("Address already in use") {
                    continue;
                }
                panic!("{SSHD} did not start: {log}");
            }
            let known_hosts = d.join("known_hosts");
            std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_key}\n")).unwrap();
            return Sshd {
                port,
                home,
                known_hosts,
                client_key: d.join("client_key"),

                user,
                dir,
                child,
            };
        }
        panic!("no free port for sshd");
    }

    pub fn target(&self) -> SshTarget {
        SshTarget::parse(&format!("ssh://{}@127.0.0.1:{}", self.user, self.port)).unwrap()
    }

    /// Options trusting this server's key and authenticating with the authorised key, with
    /// the allow-list an operator would give: this user on 127.0.0.1, the keys in the
    /// temporary directory.
    pub fn options(&self) -> SshOptions {
        SshOptions {
            known_hosts: Some(self.known_hosts.clone()),
            identity: Some(self.client_key.clone()),
            control_dir: self.dir.path().join("ctl"),
            allowed: self.allowed(),
            ..SshOptions::default()
        }
    }

    /// The `ssh_allowed` setting for this server: its user on 127.0.0.1 (any port: the tests
    /// also point at closed and silent ports there), the key files in its directory.
    pub fn allowed(&self) -> SshAllowed {
        SshAllowed {
            targets: vec![format!("{}@127.0.0.1:*", self.user)],
            identities: vec![format!("{}/*", self.dir.path().display())],
        }
    }

    /// A known_hosts file (in the temp dir) with this content.
    pub fn known_hosts_file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Successful logins so far (each one a new SSH connection).
    pub fn logins(&self) -> usize {
        self.log().matches("Accepted publickey for").count()
    }

    /// Sessions opened so far (each remote command or executor is one).
    pub fn sessions(&self) -> usize {
        self.log().matches("ctype session").count()
    }

    /// Every path under the sessions' `$HOME`.
    pub fn files_in_home(&self) -> Vec<PathBuf> {
        fn walk(p: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                out.push(e.path());
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        let mut v = Vec::new();
        walk(&self.home, &mut v);
        v.sort();
        v
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP listener on 127.0.0.1 that accepts connections and never says a word: a host that
/// is there but never answers SSH (what a firewall dropping packets looks like to ssh after
/// its connect, and the only kind of black hole a test may use: no traffic leaves loopback).
pub struct Silent {
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Silent {
    pub fn start() -> Silent {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        l.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((c, _)) = l.accept() {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Silent { port, stop }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A port on 127.0.0.1 where nothing listens.
pub fn closed_port() -> u16 {
    super::support::free_port()
}

/// The pids of processes whose command line contains `needle` (as NUL-separated words).
pub fn pids_with_cmdline(needle: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let mut cmd = Vec::new();
        if std::fs::File::open(e.path().join("cmdline"))
            .and_then(|mut f| f.read_to_end(&mut cmd))
            .is_ok()
            && cmd.windows(needle.len()).any(|w| w == needle)
        {
            out.push(pid);
        }
    }
    out
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start())
                .unwrap_or("");
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}
