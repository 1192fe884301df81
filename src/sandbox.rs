//! The sandbox: how Steward runs what a commit or a module supplies (compiles and their
//! plugins, pip, module handlers and the commands of `exec::Run` on the server's own agents).
//! Every such process is started through a [`Jail`], and this module is the only place that
//! decides who it runs as, what it can see and how it ends (docs/isolation.md, SECURITY.md).
//!
//! Invariants:
//! - **An identity per environment and role.** When the server runs as root, the compiles of
//!   an environment run as a uid of their own and its executors as another one, both taken
//!   from a range no account uses ([`Config::uid_base`] + 2 × the environment's slot, + 1 for
//!   executors). Slots are handed out by a registry file shared by every Steward process on
//!   the machine ([`Config::registry`], keyed by the environment's UUID, under a file lock),
//!   so two environments never share a uid, not even those of two servers on different
//!   databases; and code compiled for a commit never shares one with the code that is
//!   released and deployed.
//! - **A fresh PID namespace** (when the kernel lets us make one) for every compile and pip
//!   run: the process sees only its own descendants in `/proc`, not the server, its
//!   command line, its environment or another tenant's processes, and when the jailed
//!   process ends, the kernel kills everything it started (a `setsid` child included).
//! - **Kill by identity.** [`kill_all`] ends every process of a sandbox uid, whatever process
//!   group or session it moved to: after each compile, and when an environment's executors
//!   are (re)started, so nothing a previous run started survives into the next one.
//! - The pre-exec code only makes system calls on values prepared before the fork.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where sandbox uids start unless configured: far above the uids accounts and container
/// user namespaces are given (0–65535, 100000–165535 for subuids).
pub const DEFAULT_UID_BASE: u32 = 1_900_000_000;
/// Slots (environments) the default range holds: uids up to base + 2 × this.
pub const MAX_SLOTS: i64 = 100_000_000;

/// Who the executors of `local:` agents run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecutorUser {
    /// A uid of their own per environment (the default when the server runs as root).
    PerEnvironment,
    /// One named account for every environment (`--executor-user NAME`).
    Named { name: String, uid: u32, gid: u32 },
    /// The server's own user (`--executor-user server`): an operator's explicit choice, said
    /// at start and in `steward server status`, because handlers can then read the server's
    /// data directory and secrets.
    Server,
}

/// How the sandbox is set up, once per process ([`configure`]).
#[derive(Clone, Debug)]
pub struct Config {
    pub uid_base: u32,
    pub executor_user: ExecutorUser,
    /// The machine's registry of environment slots (one line per environment:
    /// `<uuid> <slot>`), mode 0600, root's.
    pub registry: PathBuf,
}

/// Where the registry of slots is, unless configured.
pub const DEFAULT_REGISTRY: &str = "/var/lib/steward/sandbox-slots";

impl Default for Config {
    fn default() -> Self {
        Config {
            uid_base: DEFAULT_UID_BASE,
            executor_user: ExecutorUser::PerEnvironment,
            registry: PathBuf::from(DEFAULT_REGISTRY),
        }
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Set the sandbox's configuration (the server does, at start). The first call wins.
pub fn configure(config: Config) {
    let _ = CONFIG.set(config);
}

pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::default)
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("no account named '{0}' (--executor-user)")]
    NoSuchUser(String),
    #[error("--executor-user {0} is root: handlers would run with every right on the server")]
    RootUser(String),
    #[error("environment sandbox slot {0} is outside the sandbox uid range")]
    SlotOutOfRange(i64),
    #[error("{what} {}: {error}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
}

/// A uid and gid (the gid of a sandbox identity is its uid: a group of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// What a sandboxed process of an environment does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Compiles of commits and the pip runs that make their Python environments.
    Compile,
    /// Executors of `local:` agents: module handlers and the commands they run.
    Executor,
}

pub fn is_root() -> bool {
    // SAFETY: geteuid(2) can not fail
    unsafe { libc::geteuid() == 0 }
}

/// The identity `role` of environment `env` runs as, or `None` when it runs as the server's
/// own user (the server is not root, or the operator chose [`ExecutorUser::Server`]).
/// Blocking: the first call for an environment may write the registry.
pub fn identity(env: uuid::Uuid, role: Role) -> Result<Option<Identity>, SandboxError> {
    if !is_root() {
        return Ok(None);
    }
    let c = config();
    if role == Role::Executor {
        match &c.executor_user {
            ExecutorUser::Server => return Ok(None),
            ExecutorUser::Named { uid, gid, .. } => {
                return Ok(Some(Identity {
                    uid: *uid,
                    gid: *gid,
                }));
            }
            ExecutorUser::PerEnvironment => {}
        }
    }
    let slot = slot_of(&c.registry, env)?;
    let uid = (slot as u64)
        .checked_mul(2)
        .and_then(|o| (c.uid_base as u64).checked_add(o + u64::from(role == Role::Executor)))
        .filter(|u| *u < u64::from(u32::MAX - 1))
        .ok_or(SandboxError::SlotOutOfRange(slot))? as u32;
    Ok(Some(Identity { uid, gid: uid }))
}

/// The slot of `env` in the registry at `path`, given one if it has none yet.
fn slot_of(path: &Path, env: uuid::Uuid) -> Result<i64, SandboxError> {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    static KNOWN: std::sync::Mutex<Option<std::collections::HashMap<uuid::Uuid, i64>>> =
        std::sync::Mutex::new(None);
    if let Some(slot) = KNOWN.lock().unwrap().as_ref().and_then(|m| m.get(&env)) {
        return Ok(*slot);
    }
    let io = |what, error| SandboxError::Io {
        what,
        path: path.to_path_buf(),
        error,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io("opening", e))?;
    // every Steward process of the machine hands out slots under this lock
    f.lock().map_err(|e| io("locking", e))?;
    let mut text = String::new();
    f.rewind().map_err(|e| io("reading", e))?;
    f.read_to_string(&mut text).map_err(|e| io("reading", e))?;
    let mut slots = std::collections::HashMap::new();
    let mut next = 1i64;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if let (Some(id), Some(slot)) = (words.next(), words.next())
            && let (Ok(id), Ok(slot)) = (id.parse::<uuid::Uuid>(), slot.parse::<i64>())
        {
            slots.insert(id, slot);
            next = next.max(slot + 1);
        }
    }
    let slot = match slots.get(&env) {
        Some(s) => *s,
        None => {
            if next >= MAX_SLOTS {
                return Err(SandboxError::SlotOutOfRange(next));
            }
            // a line that a crash cut short ends here, not in the middle of ours
            let sep = if text.is_empty() || text.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            f.write_all(format!("{sep}{env} {next}\n").as_bytes())
                .and_then(|()| f.sync_data())
                .map_err(|e| io("writing", e))?;
            slots.insert(env, next);
            next
        }
    };
    *KNOWN.lock().unwrap() = Some(slots);
    Ok(slot)
}

/// How this process isolates what it runs, for operators (`steward server status`, the log
/// at start).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Isolation {
    /// Who compiles run as: `per-environment` (a uid of each environment's own) or
    /// `server` (the server's own user).
    pub compiles: String,
    /// Who executors of `local:` agents run as: `per-environment`, `user <name>` or `server`.
    pub executors: String,
    /// PID and mount namespaces are in use.
    pub namespaces: bool,
    /// What an operator should know: the weaker settings this server runs with.
    pub warnings: Vec<String>,
}

/// This process's [`Isolation`].
pub fn describe() -> Isolation {
    let root = is_root();
    let me = std::env::var("USER").unwrap_or_else(|_| {
        // SAFETY: getuid can not fail
        format!("uid {}", unsafe { libc::getuid() })
    });
    let namespaces = namespaces_available();
    let mut warnings = Vec::new();
    let executors = match (&config().executor_user, root) {
        (_, false) => "server".to_string(),
        (ExecutorUser::PerEnvironment, true) => "per-environment".to_string(),
        (ExecutorUser::Named { name, .. }, true) => format!("user {name}"),
        (ExecutorUser::Server, true) => "server".to_string(),
    };
    if !root {
        warnings.push(format!(
            "the server does not run as root, so compiles and the handlers of local: agents run \
             as its own user ({me}): they can read its data directory, the private database's \
             password among it. Run the server as root (they then get a uid of each \
             environment's own), or give untrusted committers only external or SSH agents"
        ));
    } else if config().executor_user == ExecutorUser::Server {
        warnings.push(
            "--executor-user server: the handlers of local: agents run as the server's own \
             user (root), so every released model can read the server's secrets and data"
                .to_string(),
        );
    } else if let ExecutorUser::Named { name, .. } = &config().executor_user {
        warnings.push(format!(
            "--executor-user {name}: the handlers of every environment's local: agents share \
             one account and can reach each other's processes and files"
        ));
    }
    if !namespaces {
        warnings.push(if root {
            "this kernel gives Steward no PID namespaces: compiles and handlers see the \
             machine's process list (not the environments of other users' processes), and a \
             compile's leftovers are ended by uid only"
                .to_string()
        } else {
            "no PID namespaces for compiles (a server that is not root gets none here): they \
             see the machine's process list, and a process a compile moved out of its \
             process group outlives it"
                .to_string()
        });
    }
    Isolation {
        compiles: if root { "per-environment" } else { "server" }.to_string(),
        executors,
        namespaces,
        warnings,
    }
}

/// Parse `--executor-user`: `server`, or the name of an account (never root).
pub fn executor_user(name: &str) -> Result<ExecutorUser, SandboxError> {
    if name == "server" {
        return Ok(ExecutorUser::Server);
    }
    let (uid, gid) = lookup_user(name).ok_or_else(|| SandboxError::NoSuchUser(name.into()))?;
    if uid == 0 {
        return Err(SandboxError::RootUser(name.into()));
    }
    Ok(ExecutorUser::Named {
        name: name.into(),
        uid,
        gid,
    })
}

/// The uid and gid of the account `name`, from the password database.
pub fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    // SAFETY: getpwnam_r with buffers we own, of the sizes given
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 << 10];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        );
        (rc == 0 && !found.is_null()).then_some((pw.pw_uid, pw.pw_gid))
    }
}

/// Whether this kernel lets us make PID and mount namespaces (asked once: a container may
/// forbid them). Without them a jail still has its identity, limits and kill by uid.
pub fn namespaces_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let mut cmd = std::process::Command::new("/bin/true");
        let jail = Jail {
            namespaces: true,
            ..Jail::default()
        };
        jail.apply_std(&mut cmd);
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// How a process is confined: built by the caller, applied to its command before spawning.
#[derive(Clone, Debug, Default)]
pub struct Jail {
    /// Run as this identity (root only; `None` keeps the server's user).
    pub identity: Option<Identity>,
    /// `setrlimit` values: (resource, soft, hard).
    pub limits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// A PID namespace of its own with a fresh `/proc`, and a private mount namespace; the
    /// process is its namespace's first child, so when it ends, all it started ends too.
    pub namespaces: bool,
    /// Die when the server dies (`PR_SET_PDEATHSIG`).
    pub die_with_parent: bool,
    /// With `namespaces`: a private, empty `/tmp`, `/var/tmp` and `/dev/shm` (tmpfs of
    /// [`PRIVATE_TMP_SIZE`]), so nothing it writes there outlives it or reaches another
    /// process. Not for executors: handlers manage files where others see them.
    pub private_tmp: bool,
    /// With `private_tmp`: directories under the private ones (a compile's workdir and
    /// Python environment when the data directory is under /tmp) that stay visible, bound
    /// back in place (at most [`MAX_KEPT`]).
    pub keep_visible: Vec<PathBuf>,
}

/// How many directories a jail can keep visible under its private /tmp.
pub const MAX_KEPT: usize = 8;

/// Size of each private temporary file system of a jail.
pub const PRIVATE_TMP_SIZE: &str = "256m";

/// Everything the child needs, made before the fork: the pre-exec code allocates nothing.
struct Prepared {
    identity: Option<Identity>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    namespaces: bool,
    die_with_parent: bool,
    user_ns: bool,
    uid_map: CString,
    gid_map: CString,
    proc_path: CString,
    proc_type: CString,
    root_path: CString,
    setgroups_path: CString,
    uid_map_path: CString,
    gid_map_path: CString,
    deny: CString,
    tmp_dirs: Vec<CString>,
    tmpfs: CString,
    tmpfs_options: CString,
    /// `keep_visible`: the directory, then the directories to make inside the private tmpfs
    /// on the way to it (outermost first)
    keep: Vec<(CString, Vec<CString>)>,
    /// Where this process's command line and environment are in memory (from
    /// `/proc/self/stat`): the jail's init, a fork of the server, blanks them so that
    /// `/proc/1/cmdline` shows nothing of the server's.
    arg_area: Area,
    env_area: Area,
}

/// A range of this process's memory: start and end addresses.
type Area = Option<(usize, usize)>;

/// The command line and environment areas of this process (fields 48 to 51 of
/// `/proc/self/stat`).
fn own_memory_areas() -> (Area, Area) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (None, None);
    };
    // after "pid (comm)", fields are counted from 3
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return (None, None);
    };
    let fields: Vec<usize> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let area = |start: usize| {
        let (a, b) = (*fields.get(start - 3)?, *fields.get(start - 2)?);
        (a > 0 && b > a).then_some((a, b))
    };
    (area(48), area(50))
}

impl Jail {
    /// A jail for code of environment `env`, in `role`, with a PID namespace where the
    /// kernel allows one. Blocking (see [`identity`]).
    pub fn for_environment(env: uuid::Uuid, role: Role) -> Result<Jail, SandboxError> {
        Ok(Jail {
            identity: identity(env, role)?,
            limits: Vec::new(),
            namespaces: namespaces_available(),
            die_with_parent: true,
            private_tmp: false,
            keep_visible: Vec::new(),
        })
    }

    pub fn limit(mut self, resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Jail {
        self.limits.push((resource, soft, hard));
        self
    }

    fn prepare(&self) -> Prepared {
        // SAFETY: getuid/getgid can not fail
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (arg_area, env_area) = own_memory_areas();
        Prepared {
            identity: self.identity,
            limits: self
                .limits
                .iter()
                .map(|(r, soft, hard)| {
                    (
                        *r,
                        libc::rlimit {
                            rlim_cur: *soft as libc::rlim_t,
                            rlim_max: *hard as libc::rlim_t,
                        },
                    )
                })
                .collect(),
            namespaces: self.namespaces,
            die_with_parent: self.die_with_parent,
            // without root, the namespaces come with a user namespace of our own, in which
            // we keep our uid and gid
            user_ns: uid != 0,
            uid_map: c(&format!("{uid} {uid} 1")),
            gid_map: c(&format!("{gid} {gid} 1")),
            proc_path: c("/proc"),
            proc_type: c("proc"),
            root_path: c("/"),
            setgroups_path: c("/proc/self/setgroups"),
            uid_map_path: c("/proc/self/uid_map"),
            gid_map_path: c("/proc/self/gid_map"),
            deny: c("deny"),
            tmp_dirs: if self.private_tmp && self.namespaces {
                ["/tmp", "/var/tmp", "/dev/shm"]
                    .into_iter()
                    .filter(|d| Path::new(d).is_dir())
                    .map(c)
                    .collect()
            } else {
                Vec::new()
            },
            tmpfs: c("tmpfs"),
            tmpfs_options: c(&format!("mode=1777,size={PRIVATE_TMP_SIZE}")),
            keep: self
                .keep_visible
                .iter()
                .take(MAX_KEPT)
                .filter_map(|keep| {
                    let under = ["/tmp", "/var/tmp", "/dev/shm"]
                        .into_iter()
                        .find(|t| keep.starts_with(t))?;
                    let inside: Vec<CString> = keep
                        .ancestors()
                        .skip(1)
                        .take_while(|a| *a != Path::new(under))
                        .filter_map(c_path)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    Some((c_path(keep)?, inside))
                })
                .collect(),
            arg_area,
            env_area,
        }
    }

    /// Apply to a tokio command (set everything else on it first; call before spawn).
    pub fn apply(&self, cmd: &mut tokio::process::Command) {
        let p = self.prepare();
        // SAFETY: `in_child` makes only async-signal-safe system calls on prepared values
        unsafe {
            cmd.pre_exec(move || in_child(&p));
        }
    }

    /// Apply to a std command.
    pub fn apply_std(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let p = self.prepare();
        // SAFETY: as in `apply`
        unsafe {
            cmd.pre_exec(move || in_child(&p));
        }
    }
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Write `text` to the file at `path` (for /proc/self/*_map).
///
/// # Safety
/// Async-signal-safe: open, write, close.
unsafe fn write_file(path: &CString, text: &CString) -> std::io::Result<()> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd)?;
        let bytes = text.as_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        libc::close(fd);
        if n != bytes.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Close every descriptor but `keep` (standard streams included).
///
/// # Safety
/// Async-signal-safe: close_range, or close in a loop where the kernel has no close_range.
unsafe fn close_all_but(keep: libc::c_int) {
    unsafe {
        let range = |first: libc::c_uint, last: libc::c_uint| {
            libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) == 0
        };
        let keep = keep as libc::c_uint;
        let done = (keep == 0 || range(0, keep - 1)) && range(keep + 1, libc::c_uint::MAX);
        if !done {
            for fd in 0..65536 {
                if fd != keep as libc::c_int {
                    libc::close(fd);
                }
            }
        }
    }
}

/// Wait for `pid` and return its raw wait status.
///
/// # Safety
/// Async-signal-safe: waitpid only.
unsafe fn wait_for(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 127 << 8;
        }
    }
}

/// End this process the way the raw wait `status` says its child ended: the same exit code,
/// or the same signal (the caller then sees SIGXCPU or SIGKILL as if it had no go-between).
///
/// # Safety
/// Async-signal-safe: signal, kill, _exit.
unsafe fn end_like(status: libc::c_int) -> ! {
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// The pre-exec code. With namespaces the forked child becomes a go-between that waits:
///
/// ```text
/// server ─ go-between (old PID namespace: the pid the server waits for)
///            └─ init (pid 1 of a new namespace: mounts a fresh /proc, waits)
///                 └─ the program (exec'd here, after limits and the identity switch)
/// ```
///
/// When the program ends, init ends with its status, and the kernel kills whatever else is
/// left in the namespace; the go-between passes the status on (signals included). A kill of
/// the go-between's process group (a timeout) takes the others too, and each dies with its
/// parent.
fn in_child(p: &Prepared) -> std::io::Result<()> {
    // SAFETY: system calls only, on values prepared before the fork
    unsafe {
        if p.die_with_parent {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        if p.namespaces {
            let mut flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
            if p.user_ns {
                flags |= libc::CLONE_NEWUSER;
            }
            check(libc::unshare(flags))?;
            if p.user_ns {
                write_file(&p.setgroups_path, &p.deny)?;
                write_file(&p.uid_map_path, &p.uid_map)?;
                write_file(&p.gid_map_path, &p.gid_map)?;
            }
            // mounts made here stay here
            check(libc::mount(
                std::ptr::null(),
                p.root_path.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            // init tells the go-between how the program ended through a pipe: a pid 1
            // can not end itself by a signal to pass one on
            let mut status_pipe = [0 as libc::c_int; 2];
            check(libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC))?;
            let init = libc::fork();
            check(init)?;
            if init > 0 {
                // the go-between: it never execs, so it must let go of every descriptor it
                // inherited (the spawning side waits for its exec-error pipe to close, and
                // for the end of the output pipes)
                close_all_but(status_pipe[0]);
                let ended = wait_for(init);
                let mut status: libc::c_int = 0;
                let n = libc::read(
                    status_pipe[0],
                    (&mut status as *mut libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                end_like(if n == std::mem::size_of::<libc::c_int>() as isize {
                    status
                } else {
                    ended
                });
            }
            libc::close(status_pipe[0]);
            // init: pid 1 of the new namespace. It is a copy of the server that never execs:
            // its command line and environment would be the server's in /proc/1
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            for (start, end) in [p.arg_area, p.env_area].into_iter().flatten() {
                std::ptr::write_bytes(start as *mut u8, 0, end - start);
            }
            let title = b"steward-sandbox\0";
            if let Some((start, end)) = p.arg_area
                && end - start >= title.len()
            {
                std::ptr::copy_nonoverlapping(title.as_ptr(), start as *mut u8, title.len());
            }
            libc::prctl(libc::PR_SET_NAME, title.as_ptr());
            if libc::mount(
                p.proc_type.as_ptr(),
                p.proc_path.as_ptr(),
                p.proc_type.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) != 0
            {
                libc::_exit(126);
            }
            // directories to keep (opened before they are covered, bound back after)
            let mut kept = [-1 as libc::c_int; MAX_KEPT];
            for (fd, (path, _)) in kept.iter_mut().zip(&p.keep) {
                *fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
            }
            for dir in &p.tmp_dirs {
                if libc::mount(
                    p.tmpfs.as_ptr(),
                    dir.as_ptr(),
                    p.tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    p.tmpfs_options.as_ptr().cast(),
                ) != 0
                {
                    libc::_exit(126);
                }
            }
            for (&kept, (path, inside)) in kept.iter().zip(&p.keep) {
                if kept < 0 {
                    continue;
                }
                for d in inside {
                    // traversable, never listable: the way in shows nothing else
                    libc::mkdir(d.as_ptr(), 0o711);
                }
                libc::mkdir(path.as_ptr(), 0o700);
                // "/proc/self/fd/<kept>", written without allocating (procfs takes no
                // leading zeros)
                let mut source = [0u8; 32];
                source[..14].copy_from_slice(b"/proc/self/fd/");
                let mut digits = [0u8; 10];
                let (mut n, mut len) = (kept as u32, 0);
                loop {
                    digits[len] = b'0' + (n % 10) as u8;
                    len += 1;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                for i in 0..len {
                    source[14 + i] = digits[len - 1 - i];
                }
                if libc::mount(
                    source.as_ptr().cast(),
                    path.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    libc::_exit(126);
                }
                libc::close(kept);
            }
            let program = libc::fork();
            if program < 0 {
                libc::_exit(126);
            }
            if program > 0 {
                close_all_but(status_pipe[1]);
                let status = wait_for(program);
                libc::write(
                    status_pipe[1],
                    (&status as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                libc::_exit(0);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        for (resource, l) in &p.limits {
            check(libc::setrlimit(*resource, l))?;
        }
        if let Some(id) = p.identity {
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(id.gid))?;
            check(libc::setuid(id.uid))?;
            // changing credentials clears the death signal: set it again
            if p.die_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            }
        }
    }
    Ok(())
}

/// End every process running as `uid` (none may be left of a finished compile, or of an
/// environment's executors before new ones start). Needs root; a no-op for uid 0 and for
/// the server's own uid. Returns how many rounds of killing it took (0: there was nothing to
/// kill).
pub fn kill_all(uid: u32) -> usize {
    // SAFETY: getuid can not fail
    if uid == 0 || !is_root() || uid == unsafe { libc::getuid() } {
        return 0;
    }
    // a killer child that takes the uid can signal exactly that uid's processes; kill(-1)
    // reaches all of them but itself. (Its result says nothing: it is 0 as soon as the
    // machine has any other process. So look at /proc before each round.) Repeat until
    // nothing is left: a process may fork while a round runs.
    for round in 0..50 {
        if !any_process_of(uid) {
            return round;
        }
        // SAFETY: the child only makes system calls and exits
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                if libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setgid(uid) == 0
                    && libc::setuid(uid) == 0
                {
                    libc::kill(-1, libc::SIGKILL);
                }
                libc::_exit(0);
            }
        }
        if pid < 0 {
            return round;
        }
        // SAFETY: our own child
        unsafe { wait_for(pid) };
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    50
}

/// Whether a live process with real, effective or saved uid `uid` runs (read from
/// `/proc/<pid>/status`, which a process can not hide by making itself non-dumpable).
fn any_process_of(uid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    let wanted = uid.to_string();
    dir.flatten()
        .filter(|e| e.file_name().as_bytes().iter().all(u8::is_ascii_digit))
        .any(|e| {
            std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                // a zombie is dead already: only its parent's wait is missing
                let alive = s
                    .lines()
                    .find_map(|l| l.strip_prefix("State:"))
                    .is_some_and(|st| !matches!(st.trim_start().chars().next(), Some('Z' | 'X')));
                alive
                    && s.lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .is_some_and(|ids| ids.split_whitespace().take(3).any(|id| id == wanted))
            })
        })
}

/// Make `dir` (created if missing) private to `id`: owned by it, mode 0700. Without an
/// identity it is made 0700 for the server's own user.
pub fn private_dir(dir: &Path, id: Option<Identity>) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what, error| SandboxError::Io {
        what,
        path: dir.to_path_buf(),
        error,
    };
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("creating", e)),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("restricting", e))?;
    if let Some(id) = id {
        std::os::unix::fs::lchown(dir, Some(id.uid), Some(id.gid))
            .map_err(|e| io("handing over", e))?;
    }
    Ok(())
}

/// Hand `dir` and everything in it to `id` (symlinks themselves, not their targets).
pub fn chown_tree(dir: &Path, id: Identity) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(id.uid), Some(id.gid))?;
    if std::fs::symlink_metadata(dir)?.is_dir() {
        for e in std::fs::read_dir(dir)? {
            chown_tree(&e?.path(), id)?;
        }
    }
    Ok(())
}

/// Give `dir` and everything in it to root and the group of `id`, readable (and, where it was
/// executable, executable) by that group, closed to everyone else: what a sandboxed process
/// may use but not change (a compile's Python environment).
pub fn share_read_only(dir: &Path, id: Identity) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir)?;
    std::os::unix::fs::lchown(dir, Some(0), Some(id.gid))?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    let user = mode & 0o700;
    let group = (user >> 3) & 0o050 | 0o040;
    let group = if meta.is_dir() { group | 0o010 } else { group };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(user | group))?;
    if meta.is_dir() {
        for e in std::fs::read_dir(dir)? {
            share_read_only(&e?.path(), id)?;
        }
    }
    Ok(())
}

/// Entries of the server's data directory that sandboxed processes pass through (each
/// holds per-environment directories closed to all other environments).
pub const OPEN_DATA_ENTRIES: &[&str] = &["python-envs", "code", "compiles"];

/// Let sandboxed processes pass through `data_dir` to the [`OPEN_DATA_ENTRIES`] in it, and
/// reach nothing else there: the data directory and those entries become traversable by
/// others but never listable or writable, every other entry (the private cluster, git
/// mirrors, …) closed to others. Only done when the server is root (sandboxed processes are
/// then other users); idempotent.
pub fn open_data_dir(data_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        return Ok(());
    }
    let traversable = |p: &Path| -> std::io::Result<()> {
        let mode = std::fs::metadata(p)?.permissions().mode() & 0o7777;
        let wanted = (mode & !0o006) | 0o001;
        if wanted != mode {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(wanted))?;
        }
        Ok(())
    };
    std::fs::create_dir_all(data_dir)?;
    for name in OPEN_DATA_ENTRIES {
        let p = data_dir.join(name);
        std::fs::create_dir_all(&p)?;
        traversable(&p)?;
    }
    for entry in std::fs::read_dir(data_dir)? {
        let entry = entry?;
        if OPEN_DATA_ENTRIES.iter().any(|n| entry.file_name() == **n) {
            continue;
        }
        let meta = std::fs::symlink_metadata(entry.path())?;
        let mode = meta.permissions().mode();
        if !meta.file_type().is_symlink() && mode & 0o007 != 0 {
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode & !0o007))?;
        }
    }
    traversable(data_dir)
}

/// `path` as a C string (paths with a NUL byte can not be passed to the kernel anyway).
pub fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_bytes()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_gives_each_environment_its_own_slot_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let reg = dir.path().join("slots");
        let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let sa = slot_of(&reg, a).unwrap();
        let sb = slot_of(&reg, b).unwrap();
        assert_ne!(sa, sb);
        assert_eq!(slot_of(&reg, a).unwrap(), sa);
        // another process reading the file finds the same slots
        let text = std::fs::read_to_string(&reg).unwrap();
        assert!(text.contains(&format!("{a} {sa}\n")) && text.contains(&format!("{b} {sb}\n")));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&reg).unwrap().permissions().mode() & 0o777,
            0o600
        );
        if is_root() {
            let ca = identity(a, Role::Compile).unwrap().unwrap();
            let xa = identity(a, Role::Executor).unwrap().unwrap();
            let cb = identity(b, Role::Compile).unwrap().unwrap();
            assert!(ca != xa && ca != cb && xa != cb);
            assert!(ca.uid >= DEFAULT_UID_BASE);
        }
    }

    /// A jailed shell sees only its own processes, and a child it starts in a new session
    /// dies with it.
    #[test]
    fn a_jailed_process_sees_only_its_own_and_takes_them_along() {
        if !namespaces_available() {
            eprintln!(
                "SKIPPED a_jailed_process_sees_only_its_own_and_takes_them_along: this kernel \
                 makes no PID namespace for us"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("pid");
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!(
                "setsid sleep 30 & echo $! > {}; ls /proc | grep -c '^[0-9]'",
                marker.display()
            ))
            .stdout(std::process::Stdio::piped());
        Jail {
            namespaces: true,
            die_with_parent: true,
            ..Jail::default()
        }
        .apply_std(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        // init, the shell, sleep, ls, grep: a handful, not the machine's hundreds
        let seen: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(seen <= 6, "the jail saw {seen} processes");
        // the setsid child is gone with the jail (its pid in the namespace is not ours to
        // look up: look for any `sleep 30` that is a child of nothing we know)
        std::thread::sleep(std::time::Duration::from_millis(200));
        let ps = std::process::Command::new("sh")
            .arg("-c")
            .arg("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&ps.stdout);
        assert!(
            !text.lines().any(|l| l.trim() == "sleep 30"),
            "a setsid child outlived its jail"
        );
    }

    /// The spawning side gets the program's output as it comes (the go-betweens hold no
    /// pipe), so output larger than a pipe's buffer does not stall it.
    #[test]
    fn a_jailed_program_s_output_streams() {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg("head -c 1000000 /dev/zero");
        Jail {
            namespaces: namespaces_available(),
            die_with_parent: true,
            ..Jail::default()
        }
        .apply_std(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), 1_000_000);
    }

    /// What a jail with a private /tmp writes there is neither seen by others nor kept.
    #[test]
    fn a_private_tmp_is_the_jails_alone() {
        if !namespaces_available() {
            eprintln!("SKIPPED a_private_tmp_is_the_jails_alone: no namespaces");
            return;
        }
        let name = format!("steward-private-tmp-{}", uuid::Uuid::new_v4());
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("echo x > /tmp/{name} && ls /tmp | wc -l"));
        Jail {
            namespaces: true,
            private_tmp: true,
            ..Jail::default()
        }
        .apply_std(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // its /tmp held its own file only
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
        assert!(!Path::new("/tmp").join(&name).exists());
    }

    /// The jail's init is a copy of this process: /proc/1 inside shows none of our command
    /// line or environment; a directory under /tmp that must stay visible does.
    #[test]
    fn the_init_shows_nothing_of_the_server_and_kept_directories_stay() {
        if !namespaces_available() {
            eprintln!(
                "SKIPPED the_init_shows_nothing_of_the_server_and_kept_directories_stay: no namespaces"
            );
            return;
        }
        let kept = tempfile::Builder::new()
            .prefix("steward-kept-")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::write(kept.path().join("f"), "here").unwrap();
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(format!(
            "tr '\\0' ' ' < /proc/1/cmdline; echo; cat {}/f; echo; ls /tmp | wc -l",
            kept.path().display()
        ));
        Jail {
            namespaces: true,
            private_tmp: true,
            keep_visible: vec![kept.path().to_path_buf()],
            ..Jail::default()
        }
        .apply_std(&mut cmd);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = text.lines().collect();
        let me = std::env::args().next().unwrap();
        assert!(
            !lines[0].contains(&me),
            "init shows our command line: {text}"
        );
        assert!(lines[0].trim().starts_with("steward-sandbox"), "{text}");
        assert_eq!(lines[1], "here", "{text}");
        assert_eq!(
            lines[2].trim(),
            "1",
            "only the kept path's top directory: {text}"
        );
    }

    /// Kill by uid ends a process of the uid that left its session and group, and costs
    /// a look at /proc when nothing is left.
    #[test]
    fn kill_all_ends_every_process_of_the_uid() {
        if !is_root() {
            eprintln!("SKIPPED kill_all_ends_every_process_of_the_uid: needs root");
            return;
        }
        let uid = DEFAULT_UID_BASE - 7;
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $!");
        Jail {
            identity: Some(Identity { uid, gid: uid }),
            ..Jail::default()
        }
        .apply_std(&mut cmd);
        let out = cmd.output().unwrap();
        let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(any_process_of(uid));
        assert!(kill_all(uid) >= 1);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // gone (reaped by init, or a zombie no longer running as anything)
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert!(
            status.is_empty() || status.contains("State:\tZ"),
            "{status}"
        );
        assert!(!any_process_of(uid));
        assert_eq!(kill_all(uid), 0);
    }

    #[test]
    fn the_exit_signal_is_passed_through_the_go_betweens() {
        if !namespaces_available() {
            eprintln!("SKIPPED the_exit_signal_is_passed_through_the_go_betweens: no namespaces");
            return;
        }
        use std::os::unix::process::ExitStatusExt;
        for (script, code, signal) in [
            ("exit 3", Some(3), None),
            ("kill -XCPU $$", None, Some(libc::SIGXCPU)),
        ] {
            let mut cmd = std::process::Command::new("/bin/sh");
            cmd.arg("-c").arg(script);
            Jail {
                namespaces: true,
                ..Jail::default()
            }
            .apply_std(&mut cmd);
            let s = cmd.status().unwrap();
            assert_eq!((s.code(), s.signal()), (code, signal), "{script}");
        }
    }
}
