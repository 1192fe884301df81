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

mod child;

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
    /// Compiles of pull requests' previews (and their pip runs): an identity apart from the
    /// branch's compiles, so that a pull request's code can not enter a running branch
    /// compile (whose facts hold secret values, and whose project becomes a version).
    Preview,
}

/// The key a preview of environment `env` takes its identity and Python environments under:
/// a UUID derived from the environment's, never an environment's own.
pub fn preview_key(env: uuid::Uuid) -> uuid::Uuid {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"steward-preview");
    h.update(env.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    uuid::Builder::from_random_bytes(b).into_uuid()
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
    // a preview takes a slot of its own in the same registry, with a compile's offset
    let key = if role == Role::Preview {
        preview_key(env)
    } else {
        env
    };
    let slot = slot_of(&c.registry, key)?;
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
    /// Who compiles run as: `per-environment` (a uid of each environment's own),
    /// `namespaced` (the server's user, in namespaces that hide its files) or `server`
    /// (the server's own user, unconfined).
    pub compiles: String,
    /// Who executors of `local:` agents run as: `per-environment`, `user <name>`,
    /// `namespaced` or `server`.
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
        (ExecutorUser::Server, _) => "server".to_string(),
        (_, false) if namespaces => "namespaced".to_string(),
        (_, false) => "server".to_string(),
        (ExecutorUser::PerEnvironment, true) => "per-environment".to_string(),
        (ExecutorUser::Named { name, .. }, true) => format!("user {name}"),
    };
    let compiles = match (root, namespaces) {
        (true, _) => "per-environment",
        (false, true) => "namespaced",
        (false, false) => "server",
    };
    if !root && namespaces {
        warnings.push(format!(
            "the server does not run as root: compiles and the handlers of local: agents run \
             as its own user ({me}), each in namespaces of their own in which its data \
             directory and home are hidden. They still share that uid, so what they leave \
             elsewhere on the machine is each other's; run the server as root for a uid of \
             each environment's own"
        ));
    } else if !root {
        warnings.push(format!(
            "the server does not run as root and this kernel gives it no user namespaces, so \
             compiles and the handlers of local: agents run as its own user ({me}) and see \
             what it sees: its data directory, the private database's password among it. Run \
             the server as root (they then get a uid of each environment's own), or give \
             untrusted committers only external or SSH agents"
        ));
    }
    if config().executor_user == ExecutorUser::Server && (root || namespaces) {
        warnings.push(
            "--executor-user server: the handlers of local: agents run as the server's own \
             user, unconfined, so every released model can read the server's secrets and data"
                .to_string(),
        );
    } else if let (ExecutorUser::Named { name, .. }, true) = (&config().executor_user, root) {
        warnings.push(format!(
            "--executor-user {name}: the handlers of every environment's local: agents share \
             one account and can reach each other's processes and files"
        ));
    }
    if root && !namespaces {
        warnings.push(
            "this kernel gives Steward no PID namespaces: compiles and handlers see the \
             machine's process list (not the environments of other users' processes), and a \
             compile's leftovers are ended by uid only"
                .to_string(),
        );
    }
    Isolation {
        compiles: compiles.to_string(),
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
    /// With `namespaces`: directories covered by an empty file system, so that nothing in
    /// them can be seen (a server that is not root hides its data directory and its home
    /// this way, [`server_private_dirs`]).
    pub hide: Vec<PathBuf>,
    /// Directories under the private or hidden ones (a compile's workdir and Python
    /// environment, the environment's handler code) that stay visible, bound back in place
    /// (at most [`MAX_KEPT`]).
    pub keep_visible: Vec<PathBuf>,
}

/// How many directories a jail can keep visible under its private or hidden ones.
pub const MAX_KEPT: usize = 12;

/// Size of each private temporary file system of a jail.
pub const PRIVATE_TMP_SIZE: &str = "256m";

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
            hide: Vec::new(),
            keep_visible: Vec::new(),
        })
    }

    /// For a server that is not root (its jails share its uid): hide its private
    /// directories ([`server_private_dirs`] of `data_dir`), keeping visible the server's
    /// binary and the Python interpreter, which may live in them. No-op when root: jails
    /// then run as other users, whom file permissions keep out.
    pub fn hide_server_files(mut self, data_dir: &Path) -> Jail {
        if is_root() || !self.namespaces {
            return self;
        }
        self.hide = server_private_dirs(data_dir);
        self.keep_visible.extend(tool_dirs());
        self
    }

    pub fn limit(mut self, resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Jail {
        self.limits.push((resource, soft, hard));
        self
    }

    /// Apply to a tokio command (set everything else on it first; call before spawn).
    pub fn apply(&self, cmd: &mut tokio::process::Command) {
        let p = child::Prepared::new(self);
        // SAFETY: `in_child` makes only async-signal-safe system calls on prepared values
        unsafe {
            cmd.pre_exec(move || child::in_child(&p));
        }
    }

    /// Apply to a std command.
    pub fn apply_std(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let p = child::Prepared::new(self);
        // SAFETY: as in `apply`
        unsafe {
            cmd.pre_exec(move || child::in_child(&p));
        }
    }
}

/// What a jail of a server that is not root must not see: the server's data directory (its
/// private database and its password, git mirrors with their credentials, every
/// environment's compiles, Python environments and handler code) and its user's home (SSH
/// keys, `.pgpass`, …: the one from the password database and `$HOME`). Never `/` or a
/// directory the system itself lives in.
pub fn server_private_dirs(data_dir: &Path) -> Vec<PathBuf> {
    // SAFETY: getuid can not fail
    let uid = unsafe { libc::getuid() };
    let mut dirs: Vec<PathBuf> = [
        Some(data_dir.to_path_buf()),
        home_of(uid),
        std::env::var_os("HOME").map(PathBuf::from),
    ]
    .into_iter()
    .flatten()
    .filter_map(|d| d.canonicalize().ok())
    .filter(|d| {
        const SYSTEM: &[&str] = &[
            "/", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/var", "/opt", "/tmp", "/dev",
            "/proc", "/sys", "/run",
        ];
        !SYSTEM.iter().any(|s| d == Path::new(s))
    })
    .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The home directory of `uid` in the password database.
pub fn home_of(uid: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    // SAFETY: getpwuid_r with buffers we own, of the sizes given
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 << 10];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found);
        if rc != 0 || found.is_null() || pw.pw_dir.is_null() {
            return None;
        }
        let dir = std::ffi::CStr::from_ptr(pw.pw_dir).to_bytes().to_vec();
        (!dir.is_empty()).then(|| PathBuf::from(std::ffi::OsString::from_vec(dir)))
    }
}

/// Where this process's binary and the `python3` on `PATH` really live (their directories,
/// and the interpreter's prefix for its standard library): what a jail keeps visible
/// wherever it hides.
fn tool_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|b| b.parent().map(Path::to_path_buf))
    {
        dirs.push(dir);
    }
    let python = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("python3"))
            .find(|f| f.is_file())
    });
    if let Some(prefix) = python
        .and_then(|p| p.canonicalize().ok())
        .and_then(|p| p.parent()?.parent().map(Path::to_path_buf))
    {
        dirs.push(prefix);
    }
    dirs
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
        unsafe { child::wait_for(pid) };
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
mod tests;
