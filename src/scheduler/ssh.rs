//! Agentless targets: executors of an `ssh://user@host:port` agent run on that host, started
//! and spoken to through SSH (issue 13). The executor protocol is unchanged: the scheduler
//! writes work lines to an `ssh` process's stdin and reads replies from its stdout, exactly as
//! with a local `steward executor`, and the remote end of that channel is the same `steward`
//! binary, shipped once by content hash (mitogen-style: nothing is installed on the target).
//!
//! **Implementation: the system OpenSSH client, driven directly.** One [`SshLink`] per target
//! owns one master connection, `ssh -M -N` with a private control socket, as a child of the
//! server; every remote command (an executor's channel, a shipment, a kill) is an `ssh -S
//! <socket>` multiplexing client on it, so after the first TCP connect, key exchange and
//! authentication each of them costs one session open, not a new connection. OpenSSH does all
//! of SSH: known_hosts and keys as the server user's OpenSSH uses them (`~/.ssh/config`,
//! `~/.ssh/known_hosts`, default keys, the agent), unless [`SshOptions`] overrides them.
//! The `openssh` crate was considered and not used: its master is `ssh -f` with
//! `ControlPersist`, a daemon that outlives a killed server (here the master dies with it, like
//! executors, through the parent-death signal), that inherits the server's whole environment
//! (here it gets [`SSH_ENVIRONMENT`] only) and that a timed-out connect can not kill; its drop
//! runs a blocking `ssh -O exit` inside async code; and its `Child` type wraps the process the
//! scheduler's pool needs as a plain [`tokio::process::Command`], so the channels would be
//! built by hand anyway. What remained for it is the argument list below. A pure-Rust SSH
//! implementation would have to re-create OpenSSH's config, known_hosts and key handling to
//! behave "as OpenSSH does".
//!
//! **Security.** Host keys are always checked strictly (`StrictHostKeyChecking=yes`: an unknown
//! or changed key is refused before anything runs on the target, and `UpdateHostKeys=no`: the
//! known_hosts file is only read), nothing prompts (`BatchMode`), only keys authenticate, and
//! nothing is forwarded (no agent: code on the target must not reach the server's keys). A
//! known_hosts file given in the options is the only one trusted (the system-wide one is not
//! read then). Control sockets live in a private directory (mode 700, checked). Only targets
//! and key files on the environment's allow-list ([`SshOptions::allowed`], set by a global
//! admin) are connected to; anything else is refused before `ssh` runs. The shipped executor
//! is trusted by its content: checked by sha256 at every start, from directories only the
//! SSH user can write (see `START_EXECUTOR` and `ship.rs`).
//!
//! **On the target**, under `$HOME/.cache/steward/`: `bin/steward-<first 16 hex of the
//! sha256>` (written to a temporary name, size and sha256 checked, started once with
//! `--version`, then renamed: a name that exists is a complete, working binary, so the next
//! check is one round trip and uploads nothing), and `code/<digest>/` plus `code/_lib/` as
//! `scheduler/code.rs` lays them out on the server (a directory is renamed into place with
//! its `.complete` marker; `_lib/.complete` holds the hash of what `_lib` has). The target
//! needs: the executor's architecture and a glibc at least as new as the one it was built
//! against (the binary links only libc, libm and libgcc_s dynamically; a build on Debian 12
//! needs glibc ≥ 2.34: Debian 12, Ubuntu 22.04 or newer), a POSIX login shell that prints
//! nothing when not interactive, `/bin/sh`, coreutils (`mkdir`, `mv -T`, `chmod`, `cat`, `wc`,
//! `mktemp`, `stat -c`, `id`; and `sha256sum`, else `shasum` or `openssl`: without one the
//! executor can not be verified and is refused), `tar`, `/proc`, `setsid` (util-linux; used only
//! where sshd does not start commands as session leaders), an executable `$HOME` (not mounted
//! noexec), and `python3` only for Python module handlers. All of these are on a stock Debian
//! or Ubuntu.
//!
//! **Processes.** A remote executor is exec'd as the session's first process, which sshd made
//! a session leader (else it runs under `setsid -w`): its `Ready` pid leads its own process
//! group, so [`SshLink::kill_remote`] kills it and whatever its handler started (the commands
//! of `exec::Run` die with it through their parent-death signal). Dropping the last clone of a link ends its master and with it every channel on
//! it; a remote executor then reads end-of-file and exits once its current action is done.
//! One connection carries at most the target sshd's `MaxSessions` (10 by default) channels at
//! once. The scheduler's pool gives each remote executor up to `SSH_DEPTH` actions at once
//! (`scheduler/executors.rs`): they wait in the channel while it works on one, so the round
//! trips overlap the work.

/// Shell functions every remote script that touches the cache starts with. `refuse` ends the
/// script with exit status 4 (an [`SshError::Untrusted`]); `check PATH KIND [root-ok]` refuses
/// a path that is not a KIND (`directory`, `regular file`; a symbolic link is neither), not
/// owned by this user (or root, with `root-ok`), or writable by group or others; `private
/// ROOT SUB` makes (mode 700) and checks `$HOME`, `$HOME/.cache`, ROOT and ROOT/SUB, each
/// before the next is made; `sha256` prints the sha256 of its stdin with the first of
/// `sha256sum`, `shasum` or `openssl` found (status 2 when there is none).
macro_rules! remote_prelude {
    () => {
        r#"me=$(id -u) || exit 1
refuse() { echo "steward-refused $*"; echo "$*" >&2; exit 4; }
check() {
  s=$(stat -c '%u %a %F' -- "$1" 2>/dev/null) || refuse "can not read $1"
  u=${s%% *}; r=${s#* }; a=${r%% *}; k=${r#* }
  [ "$k" = "$2" ] || refuse "$1 is a $k, not a $2"
  if [ "$u" != "$me" ] && { [ "${3-}" != root-ok ] || [ "$u" != 0 ]; }; then refuse "$1 is owned by uid $u, not by this user (uid $me)"; fi
  [ $(( 0$a & 022 )) -eq 0 ] || refuse "$1 has mode $a: others can write to it"
}
private() {
  h=${1%/*}; h=${h%/*}
  check "$h" directory root-ok
  for p in "${1%/*}" "$1" "$1/$2"; do
    if [ ! -e "$p" ] && [ ! -L "$p" ]; then mkdir -m 700 "$p" 2>/dev/null || [ -d "$p" ] || refuse "can not create $p"; fi
    if [ "$p" = "${1%/*}" ]; then check "$p" directory root-ok; else check "$p" directory; fi
  done
}
sha256() {
  if command -v sha256sum > /dev/null 2>&1; then x=$(sha256sum) || return 1
  elif command -v shasum > /dev/null 2>&1; then x=$(shasum -a 256) || return 1
  elif command -v openssl > /dev/null 2>&1; then x=$(openssl dgst -sha256 -r) || return 1
  else return 2; fi
  printf '%s\n' "${x%% *}"
}
nohash="none of sha256sum, shasum or openssl is on the PATH there, so the executor can not be verified"
"#
    };
}

mod error;
mod ship;
mod target;

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::lines;

pub use crate::model::settings::SshAllowed;
pub use error::SshError;
pub use target::SshTarget;

/// The environment of the `ssh` processes: what OpenSSH needs to find the user's files, keys
/// and agent, and a locale; nothing of the server's own (database URL, tokens).
pub const SSH_ENVIRONMENT: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "SSH_AUTH_SOCK",
];

/// Where shipped files live on a target, under its `$HOME`.
const REMOTE_CACHE: &str = ".cache/steward";

/// How to connect; the defaults are what the server user's OpenSSH does.
#[derive(Clone, Debug)]
pub struct SshOptions {
    /// The known_hosts file to trust instead of `~/.ssh/known_hosts` (and the system's).
    pub known_hosts: Option<PathBuf>,
    /// The only private key to offer instead of OpenSSH's default keys and the agent.
    pub identity: Option<PathBuf>,
    /// How long reaching the host may take (TCP connect, key exchange, authentication); the
    /// first command on the new connection gets as long again.
    pub connect_timeout: Duration,
    /// A private directory for the control sockets. Keep its path short: a socket path must
    /// fit in 108 bytes, and OpenSSH needs room for a temporary name beside it.
    pub control_dir: PathBuf,
    /// The targets and key files a connection may use (the environment's `ssh_allowed`,
    /// chosen by a server administrator); the default allows nothing.
    pub allowed: SshAllowed,
}

impl Default for SshOptions {
    fn default() -> SshOptions {
        // SAFETY: geteuid(2) can not fail and touches no memory
        let uid = unsafe { libc::geteuid() };
        SshOptions {
            known_hosts: None,
            identity: None,
            connect_timeout: Duration::from_secs(5),
            control_dir: std::env::temp_dir().join(format!("steward-ssh-{uid}")),
            allowed: SshAllowed::default(),
        }
    }
}

/// What [`SshLink::ensure_executor`] and [`SshLink::ensure_code`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shipped {
    /// Where it is on the target (absolute).
    pub remote_path: String,
    /// 0 when the target had it already.
    pub bytes_uploaded: u64,
}

/// What the first command on a new connection found out about the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteInfo {
    pub home: String,
    /// `uname -s`, `uname -m`
    pub os: String,
    pub arch: String,
}

/// One connection to one target, shared by everything that runs there (cheap to clone; the
/// connection closes when the last clone is dropped).
#[derive(Clone)]
pub struct SshLink(Arc<Link>);

struct Link {
    target: SshTarget,
    opts: SshOptions,
    control: PathBuf,
    master: Mutex<Child>,
    master_log: Arc<Mutex<String>>,
    remote: RemoteInfo,
    /// The sha256 of each executor [`SshLink::ensure_executor`] shipped or found, by remote
    /// path: what [`SshLink::executor_command`] checks the file against before running it.
    executors: Mutex<std::collections::HashMap<String, String>>,
}

impl std::fmt::Debug for SshLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshLink")
            .field("target", &self.0.target.to_string())
            .field("control", &self.0.control)
            .finish()
    }
}

static NEXT_LINK: AtomicU64 = AtomicU64::new(1);

/// The longest control socket path accepted: 108 bytes of `sun_path`, less the NUL and the
/// `.` + 16 characters OpenSSH appends while it creates the socket.
const MAX_CONTROL_PATH: usize = 90;

const PROBE: &str = r#"printf 'steward-probe\t%s\t%s\t%s\n' "$HOME" "$(uname -s)" "$(uname -m)""#;

/// `$1 executor --agent $2`, after checking that `$1` is the file shipped with sha256 `$3`,
/// in a directory only this user can write: it is opened once, hashed through that open
/// file, and that same file is executed (`/proc/self/fd/3`), so a file swapped in after the
/// check is not what runs. It leads its own process group: sshd makes the session's first
/// process a session leader, which the exec keeps; when it did not, `setsid` does.
const START_EXECUTOR: &str = concat!(
    remote_prelude!(),
    r#"[ -n "$3" ] || refuse "$1 was not shipped over this connection, so its hash is not known"
d=${1%/*}; root=${d%/*}
case "$d" in */bin) ;; *) refuse "$1 is not in a bin directory of the cache" ;; esac
private "$root" bin
check "$1" "regular file"
[ -r "$1" ] || refuse "can not read $1"
exec 3< "$1"
s=$(sha256 <&3); st=$?
[ "$st" -ne 2 ] || refuse "$nohash"
[ "$st" -eq 0 ] || refuse "can not hash $1"
[ "$s" = "$3" ] || refuse "$1 is not the executor shipped there (its sha256 is $s, not $3): refusing to run it"
read -r _ _ _ _ group _ < /proc/$$/stat
if [ "$group" = "$$" ]; then exec /proc/self/fd/3 executor --agent "$2"; fi
exec setsid -w /proc/self/fd/3 executor --agent "$2""#
);

/// `kill -9` of a process group that exists (pid > 1 checked by the caller).
const KILL: &str = r#"if kill -0 "-$1" 2>/dev/null; then kill -9 "-$1"; fi"#;

impl SshLink {
    /// Connect to `target` and check the channel is usable: within `connect_timeout`, with
    /// the host key checked against known_hosts (never learned), never prompting.
    /// A target or key that `opts.allowed` does not list is refused before anything runs.
    pub async fn connect(target: &SshTarget, opts: &SshOptions) -> Result<SshLink, SshError> {
        check_allowed(target, opts)?;
        for (what, p) in [
            ("the control directory", Some(&opts.control_dir)),
            ("the known_hosts file", opts.known_hosts.as_ref()),
            ("the identity file", opts.identity.as_ref()),
        ] {
            if let Some(p) = p
                && p.to_str().is_none_or(|s| s.contains(['"', '\n']))
            {
                return Err(SshError::Local {
                    what: format!("{what} must be a UTF-8 path without '\"' or newlines:"),
                    path: p.display().to_string(),
                    detail: "unusable in an OpenSSH option".into(),
                });
            }
        }
        prepare_control_dir(&opts.control_dir)?;
        let control = opts.control_dir.join(format!(
            "{}-{}-{}",
            &ship::sha256_hex(target.to_string().as_bytes())[..8],
            std::process::id(),
            NEXT_LINK.fetch_add(1, Ordering::Relaxed)
        ));
        if control.as_os_str().len() > MAX_CONTROL_PATH {
            return Err(SshError::Local {
                what: format!(
                    "the control directory is too long for a socket path (at most {} bytes for the directory):",
                    MAX_CONTROL_PATH - 30
                ),
                path: opts.control_dir.display().to_string(),
                detail: "choose a shorter control_dir".into(),
            });
        }
        // a leftover of an earlier process that had our pid
        let _ = std::fs::remove_file(&control);

        let mut cmd = base_command(target, opts, &control);
        cmd.args(["-M", "-N", "-o", "ControlPersist=no", "--"])
            .arg(&target.host)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // it dies with the server, like executors do (see scheduler/executors.rs)
        // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut master = cmd.spawn().map_err(|e| SshError::Local {
            what: "can not run".into(),
            path: "ssh (the OpenSSH client, Debian package openssh-client)".into(),
            detail: e.to_string(),
        })?;
        let master_log = Arc::new(Mutex::new(String::new()));
        let reader = tokio::spawn(collect(
            master.stderr.take().expect("piped stderr"),
            master_log.clone(),
        ));
        let failed = |log: &str| {
            error::classify(
                log,
                error::Failed {
                    host: target.address(),
                    user: target
                        .user
                        .clone()
                        .unwrap_or_else(|| "the default user".into()),
                    known_hosts: known_hosts_shown(opts),
                    identity: match &opts.identity {
                        Some(p) => format!("key {}", p.display()),
                        None => "the default keys and agent".into(),
                    },
                    secs: opts.connect_timeout.as_secs_f64(),
                    target: &target.to_string(),
                },
            )
        };
        let deadline = tokio::time::Instant::now() + opts.connect_timeout;
        // the master creates its socket (atomically, by rename) once it is authenticated
        loop {
            if std::fs::symlink_metadata(&control).is_ok_and(|m| m.file_type().is_socket()) {
                break;
            }
            if let Ok(Some(_)) = master.try_wait() {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
                let log = master_log.lock().expect("log").clone();
                return Err(failed(&log));
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = master.start_kill();
                let _ = master.wait().await;
                let _ = std::fs::remove_file(&control);
                return Err(SshError::Timeout {
                    host: target.address(),
                    secs: opts.connect_timeout.as_secs_f64(),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut link = Link {
            target: target.clone(),
            opts: opts.clone(),
            control,
            master: Mutex::new(master),
            master_log,
            remote: RemoteInfo::default(),
            executors: Mutex::new(Default::default()),
        };
        link.remote = link.probe().await?;
        Ok(SshLink(Arc::new(link)))
    }

    pub fn target(&self) -> &SshTarget {
        &self.0.target
    }

    pub fn remote(&self) -> &RemoteInfo {
        &self.0.remote
    }

    /// Whether the master connection is still up. When it is not, connect again: commands on
    /// this link still work, but each makes a connection of its own (as strictly checked).
    pub fn is_alive(&self) -> bool {
        matches!(self.0.master.lock().expect("master").try_wait(), Ok(None))
    }

    /// What the master connection said on stderr (why it ended, when it did).
    pub fn master_log(&self) -> String {
        self.0.master_log.lock().expect("log").clone()
    }

    /// `$HOME/.cache/steward` on the target.
    pub fn remote_cache(&self) -> String {
        format!(
            "{}/{REMOTE_CACHE}",
            self.0.remote.home.trim_end_matches('/')
        )
    }

    /// Where [`SshLink::ensure_code`] puts the code of `digest` (for `WorkItem.handler.dir`).
    pub fn remote_dir_for_code(&self, digest: &str) -> String {
        format!("{}/code/{digest}", self.remote_cache())
    }

    /// The command running `<remote_binary> executor --agent <agent>` on the target over this
    /// connection: its stdin and stdout are the executor protocol's channel, its stderr is
    /// inherited. The remote executor leads its own process group (see
    /// [`SshLink::kill_remote`]). Its environment is already [`SSH_ENVIRONMENT`]: add to it,
    /// don't clear it.
    ///
    /// `remote_binary` must be what [`SshLink::ensure_executor`] returned on this link: the
    /// file is checked against that sha256 (and its directory for who can write to it) right
    /// before it runs, and one that changed is refused: the command then prints
    /// `steward-refused <why>` instead of the executor's `Ready` and exits.
    pub fn executor_command(&self, remote_binary: &str, agent: &str) -> Command {
        let sha = self
            .0
            .executors
            .lock()
            .expect("executors")
            .get(remote_binary)
            .cloned()
            .unwrap_or_default();
        let mut c = self.0.script(START_EXECUTOR, &[remote_binary, agent, &sha]);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        c
    }

    /// Kill the remote process group `pid` (an executor's `Ready` pid) with SIGKILL: a hung
    /// handler and what it started. A group that is gone already is not an error.
    pub async fn kill_remote(&self, pid: u32) -> Result<(), SshError> {
        if pid <= 1 || pid > i32::MAX as u32 {
            return Err(SshError::Remote {
                target: self.0.target.to_string(),
                what: "killing a process group".into(),
                detail: format!("{pid} is not an executor's pid"),
            });
        }
        let timeout = self.0.opts.connect_timeout + Duration::from_secs(10);
        let out = self.0.run(KILL, &[&pid.to_string()], timeout).await?;
        if out.status.success() {
            Ok(())
        } else {
            Err(self.0.failure("killing a process group", &out))
        }
    }

    /// Make the executor binary `local_binary` available on the target, uploading it only
    /// when the target does not have that exact content yet.
    pub async fn ensure_executor(&self, local_binary: &Path) -> Result<Shipped, SshError> {
        ship::ensure_executor(&self.0, local_binary).await
    }

    /// Make the handler code `<local_dir>/<digest>/` (and the helper library
    /// `<local_dir>/_lib/`, as `scheduler/code.rs` writes them) available on the target at
    /// [`SshLink::remote_dir_for_code`], uploading only what the target lacks.
    pub async fn ensure_code(&self, local_dir: &Path, digest: &str) -> Result<Shipped, SshError> {
        ship::ensure_code(&self.0, local_dir, digest).await
    }
}

impl Link {
    /// A command on the target through the master: `line` is read by the user's login shell.
    fn command(&self, line: &str) -> Command {
        let mut c = base_command(&self.target, &self.opts, &self.control);
        c.args(["-o", "ControlMaster=no", "-T", "--"])
            .arg(&self.target.host)
            .arg(line);
        c
    }

    /// `script` run by `/bin/sh` on the target with `args` as `$1`…
    fn script(&self, script: &str, args: &[&str]) -> Command {
        let mut line = format!("exec /bin/sh -c {} steward", ship::sh_quote(script));
        for a in args {
            line.push(' ');
            line.push_str(&ship::sh_quote(a));
        }
        self.command(&line)
    }

    async fn run(
        &self,
        script: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<std::process::Output, SshError> {
        let mut c = self.script(script, args);
        c.stdin(Stdio::null()).kill_on_drop(true);
        // the answers of these scripts are a few lines; a noisy login shell is cut short
        match tokio::time::timeout(timeout, lines::output_bounded(c, 1024 * 1024)).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(SshError::Local {
                what: "can not run".into(),
                path: "ssh".into(),
                detail: e.to_string(),
            }),
            Err(_) => Err(SshError::Timeout {
                host: self.target.address(),
                secs: timeout.as_secs_f64(),
            }),
        }
    }

    /// The first command on a new connection: where `$HOME` is, which system it is, and
    /// whether the shell keeps quiet.
    async fn probe(&self) -> Result<RemoteInfo, SshError> {
        let out = self.run(PROBE, &[], self.opts.connect_timeout).await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let Some((noise, found)) = text.split_once("steward-probe\t") else {
            return Err(self.failure("the first command", &out));
        };
        if !noise.trim().is_empty() {
            return Err(SshError::NoisyShell {
                target: self.target.to_string(),
                noise: noise.chars().take(200).collect(),
            });
        }
        let mut parts = found.trim_end_matches('\n').split('\t');
        let (home, os, arch) = (parts.next(), parts.next(), parts.next());
        match (home, os, arch) {
            (Some(home), Some(os), Some(arch)) if home.starts_with('/') => Ok(RemoteInfo {
                home: home.into(),
                os: os.into(),
                arch: arch.into(),
            }),
            _ => Err(SshError::Remote {
                target: self.target.to_string(),
                what: "the first command".into(),
                detail: format!("unexpected answer {found:?} (is $HOME set there?)"),
            }),
        }
    }

    /// The error of a remote command that did not do its job.
    fn failure(&self, what: &str, out: &std::process::Output) -> SshError {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let detail = match (out.status.code(), stderr.is_empty()) {
            (_, false) => stderr,
            (Some(c), true) => format!("exit status {c}"),
            (None, true) => "killed by a signal".into(),
        };
        if out.status.code() == Some(255) {
            // ssh itself failed: the connection
            SshError::Ssh {
                target: self.target.to_string(),
                detail,
            }
        } else {
            SshError::Remote {
                target: self.target.to_string(),
                what: what.into(),
                detail,
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: the master then closes its sessions and removes its socket
        let master = self.master.get_mut().expect("master");
        if let (Ok(None), Some(pid)) = (master.try_wait(), master.id()) {
            // SAFETY: kill(2) of our own child, not reaped yet (so the pid is still ours)
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        let _ = std::fs::remove_file(&self.control);
    }
}

/// The target and the key must be on the allow-list a server administrator gave.
fn check_allowed(target: &SshTarget, opts: &SshOptions) -> Result<(), SshError> {
    let a = &opts.allowed;
    if !a.allows_target(target.user.as_deref(), &target.host, target.port) {
        return Err(SshError::NotAllowed {
            target: target.to_string(),
            detail: format!(
                "it is not in this environment's ssh_allowed.targets ({}), which only a global admin can change",
                shown(&a.targets)
            ),
        });
    }
    let identity = opts.identity.as_ref().map(|p| p.to_string_lossy());
    if !a.allows_identity(identity.as_deref()) {
        return Err(SshError::NotAllowed {
            target: target.to_string(),
            detail: format!(
                "{} is not in this environment's ssh_allowed.identities ({}), which only a global admin can change",
                match &identity {
                    Some(p) => format!("the key file {p}"),
                    None => "the server's default keys ('default')".into(),
                },
                shown(&a.identities)
            ),
        });
    }
    Ok(())
}

fn shown(list: &[String]) -> String {
    if list.is_empty() {
        "empty".into()
    } else {
        list.join(", ")
    }
}

/// `ssh` with everything every invocation shares: the control socket, strict host keys, no
/// prompts, key authentication only, no forwarding, the chosen files.
fn base_command(target: &SshTarget, opts: &SshOptions, control: &Path) -> Command {
    let mut c = Command::new("ssh");
    c.env_clear().envs(
        SSH_ENVIRONMENT
            .iter()
            .filter_map(|k| std::env::var_os(k).map(|v| (k, v))),
    );
    c.arg("-S").arg(ssh_path(control));
    for o in [
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        "UpdateHostKeys=no",
        "PasswordAuthentication=no",
        "KbdInteractiveAuthentication=no",
        "ForwardAgent=no",
        "ForwardX11=no",
        "ClearAllForwardings=yes",
        "PermitLocalCommand=no",
        "RemoteCommand=none",
        "RequestTTY=no",
        "LogLevel=ERROR",
        "ServerAliveInterval=15",
        "ServerAliveCountMax=3",
    ] {
        c.arg("-o").arg(o);
    }
    let secs = opts.connect_timeout.as_secs_f64().ceil().max(1.0) as u64;
    c.arg("-o").arg(format!("ConnectTimeout={secs}"));
    if let Some(k) = &opts.known_hosts {
        c.arg("-o")
            .arg(format!("UserKnownHostsFile=\"{}\"", ssh_path(k)))
            .arg("-o")
            .arg("GlobalKnownHostsFile=/dev/null");
    }
    if let Some(i) = &opts.identity {
        c.arg("-i")
            .arg(ssh_path(i))
            .arg("-o")
            .arg("IdentitiesOnly=yes");
    }
    c.arg("-p").arg(target.port.to_string());
    if let Some(u) = &target.user {
        c.arg("-l").arg(u);
    }
    c
}

/// A path as an OpenSSH option value: `%` and a leading `~` would be expanded.
fn ssh_path(p: &Path) -> String {
    let s = p.to_string_lossy().replace('%', "%%");
    if s.starts_with('~') {
        format!("./{s}")
    } else {
        s
    }
}

/// The home directory OpenSSH expands `~` to: the password database's, whatever `$HOME`
/// says (a service's `HOME` is often somewhere else); `$HOME` only for a uid without an
/// entry.
fn openssh_home() -> PathBuf {
    // SAFETY: getuid can not fail
    let uid = unsafe { libc::getuid() };
    crate::sandbox::home_of(uid)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()))
}

fn known_hosts_shown(opts: &SshOptions) -> String {
    known_hosts_shown_in(opts, &openssh_home())
}

/// The known_hosts files `ssh` reads with `opts`, for an error message, `home` being the
/// user's home.
fn known_hosts_shown_in(opts: &SshOptions, home: &Path) -> String {
    let (path, own) = match &opts.known_hosts {
        Some(p) => (p.clone(), true),
        None => (home.join(".ssh/known_hosts"), false),
    };
    let mut shown = path.display().to_string();
    if !path.exists() {
        shown.push_str(", which does not exist");
    }
    if !own {
        shown.push_str(", and /etc/ssh/ssh_known_hosts");
    }
    shown
}

/// Create the control directory, or check the one there: a directory of ours that nobody
/// else can enter (whoever can connect to a control socket can run commands on the target).
fn prepare_control_dir(dir: &Path) -> Result<(), SshError> {
    let local = |what: &str, detail: String| SshError::Local {
        what: what.into(),
        path: dir.display().to_string(),
        detail,
    };
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) => return Err(local("creating the control directory", e.to_string())),
    }
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| local("reading the control directory", e.to_string()))?;
    // SAFETY: geteuid(2) can not fail and touches no memory
    let uid = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o077 != 0 {
        return Err(local(
            "the control directory must be a directory of this user with mode 700:",
            format!(
                "it is {} owned by uid {} with mode {:o}",
                if m.is_dir() {
                    "a directory"
                } else {
                    "not a directory"
                },
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Keep what a process says on `stderr` (the last 64 KiB).
async fn collect(mut stderr: tokio::process::ChildStderr, into: Arc<Mutex<String>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let mut s = into.lock().expect("log");
        s.push_str(&String::from_utf8_lossy(&buf[..n]));
        if s.len() > 65536 {
            let cut = s.ceil_char_boundary(s.len() - 65536);
            s.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_hosts_errors_name_the_file_openssh_reads() {
        // OpenSSH takes `~` from the password database, not from $HOME
        // SAFETY: getuid can not fail
        let uid = unsafe { libc::getuid() };
        let passwd = crate::sandbox::home_of(uid).expect("this user has a password entry");
        assert_eq!(openssh_home(), passwd);
        let home = tempfile::tempdir().unwrap();
        let shown = known_hosts_shown_in(&SshOptions::default(), home.path());
        assert!(
            shown.starts_with(&format!("{}/.ssh/known_hosts", home.path().display())),
            "{shown}"
        );
        assert!(shown.contains("which does not exist"), "{shown}");
        assert!(shown.ends_with("and /etc/ssh/ssh_known_hosts"), "{shown}");
        let own = SshOptions {
            known_hosts: Some(home.path().join("kh")),
            ..Default::default()
        };
        std::fs::write(home.path().join("kh"), "").unwrap();
        assert_eq!(
            known_hosts_shown_in(&own, Path::new("/nowhere")),
            home.path().join("kh").display().to_string()
        );
    }
}
