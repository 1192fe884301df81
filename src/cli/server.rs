//! `steward server`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::server::ServerConfig;

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "STEWARD_BIND", default_value = "127.0.0.1:8888")]
    pub bind: SocketAddr,
    /// PostgreSQL URL; without it the server runs its own private cluster under the data dir.
    #[arg(
        long,
        env = "STEWARD_DATABASE_URL",
        hide_env_values = true,
        global = true
    )]
    pub database_url: Option<String>,
    /// Directory for the server's own data (the private PostgreSQL cluster, git mirrors, …).
    #[arg(
        long,
        env = "STEWARD_DATA_DIR",
        default_value = "data/server",
        global = true
    )]
    pub data_dir: PathBuf,
    /// Accept every request without a token (local development only).
    #[arg(long, env = "STEWARD_NO_AUTH")]
    pub no_auth: bool,
    /// Secret of the first admin token (otherwise one is generated and printed once).
    #[arg(long, env = "STEWARD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Only store and serve versions; do not deploy them (no scheduler, no executors).
    #[arg(long, env = "STEWARD_NO_SCHEDULER")]
    pub no_scheduler: bool,
    /// Seconds between retention passes, which prune old actions, compile reports, commit
    /// timelines, dry-runs, deliveries and audit records (see the `retention` setting).
    #[arg(long, env = "STEWARD_PRUNE_INTERVAL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub prune_interval: u64,
    /// The most disk the Python environments may take together: those made for commits'
    /// requirements (`python-envs/`, with pip's caches) and for handlers (`code/…/_venv`).
    /// Past it the least recently used go (they are made again when needed); none in use.
    /// `500MiB`, `20GiB`, … ; `0`: no cap.
    #[arg(long, env = "STEWARD_MAX_PYTHON_ENVS_SIZE", default_value = "20GiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_python_envs_size: u64,
    /// Seconds an unused Python environment that no stored version needs is kept after its
    /// last use.
    #[arg(long, env = "STEWARD_PYTHON_ENV_GRACE", default_value_t = 3600)]
    pub python_env_grace: u64,
    /// Serve HTTPS: PEM file with the server's certificate, then any intermediate CA
    /// certificates (the full chain). Needs --tls-key. Without both, plain HTTP.
    #[arg(
        long,
        env = "STEWARD_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM file with the private key of --tls-cert (PKCS#8, RSA or EC). Read once at startup:
    /// restart the server after renewing the certificate.
    #[arg(
        long,
        env = "STEWARD_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Where the other replicas on the same database reach this one (its URL as seen from
    /// them), e.g. `http://10.0.0.5:8888`. Default: the bound address (with the host name
    /// when bound to all interfaces).
    #[arg(long, env = "STEWARD_ADVERTISE_URL", value_name = "URL")]
    pub advertise_url: Option<String>,
    /// Seconds between a replica's heartbeats (which renew its environments' leases).
    #[arg(
        long,
        env = "STEWARD_HEARTBEAT",
        default_value_t = 1.0,
        value_name = "SECONDS"
    )]
    pub heartbeat: f64,
    /// Seconds a replica's lease on an environment lasts without a heartbeat: when a replica
    /// dies, its environments move to the others after about this long.
    #[arg(
        long,
        env = "STEWARD_LEASE_TIME",
        default_value_t = 5.0,
        value_name = "SECONDS"
    )]
    pub lease_time: f64,
    /// Send the replica secret to other replicas over plain http:// even when their
    /// --advertise-url is not a loopback address (by default such owner-only calls are
    /// refused: the secret would cross the network in clear). Prefer TLS.
    #[arg(long, env = "STEWARD_ALLOW_PLAIN_HTTP_REPLICA_LINKS")]
    pub allow_plain_http_replica_links: bool,
    /// Accept git sources that are repositories on this server's own disk (`file://` URLs,
    /// absolute paths). Off by default: an environment admin could otherwise point a source
    /// at any repository the server can read, other environments' mirrors included.
    #[arg(long, env = "STEWARD_ALLOW_LOCAL_GIT_SOURCES")]
    pub allow_local_git_sources: bool,
    /// The package index pip installs commits' requirements from (default: pip's own
    /// configuration of the server's user, or PyPI). A commit can not choose another one.
    #[arg(long, env = "STEWARD_PIP_INDEX_URL", value_name = "URL")]
    pub pip_index_url: Option<String>,
    /// A directory or URL of wheels pip may also install commits' requirements from
    /// (repeatable). A directory must be readable by compiles (others may read it).
    #[arg(
        long,
        env = "STEWARD_PIP_FIND_LINKS",
        value_name = "DIR|URL",
        value_delimiter = ' '
    )]
    pub pip_find_links: Vec<String>,
    /// Who the executors of `local:` agents (module handlers, `exec::Run` commands) run as
    /// when the server runs as root: by default a uid of each environment's own (see
    /// docs/isolation.md); the name of an account to run all of them as that account; or
    /// `server` to run them as the server's own user, which lets every released model read
    /// the server's data directory and secrets (said at start and in `steward server
    /// status`). A server that is not root runs them as its own user in namespaces that hide
    /// its data directory and home, unless this is `server` (unconfined).
    #[arg(long, env = "STEWARD_EXECUTOR_USER", value_name = "NAME")]
    pub executor_user: Option<String>,
    /// First uid of the range the sandbox gives environments' compiles and executors (two
    /// uids per environment). Pick a range no account or container uses.
    #[arg(long, env = "STEWARD_SANDBOX_UID_BASE", default_value_t = crate::sandbox::DEFAULT_UID_BASE, value_name = "UID")]
    pub sandbox_uid_base: u32,
    #[command(subcommand)]
    pub action: Option<ServerAction>,
}

#[derive(clap::Subcommand, Debug)]
pub enum ServerAction {
    /// Show the replicas on the server's database, the environments each owns, and the age
    /// of their heartbeats and leases (through the REST API: --url/STEWARD_URL and a token).
    Status(super::remote::RemoteArgs),
    /// Make a new secret for the replicas of the server's database (--database-url, or the
    /// private cluster under --data-dir). The old one is still accepted for --grace seconds,
    /// then refused; running replicas use the new one at once.
    RotateReplicaSecret {
        /// Seconds the old secret is still accepted.
        #[arg(long, default_value_t = 600.0, value_name = "SECONDS")]
        grace: f64,
    },
}

/// Variables and flags that carry the server's secrets in.
const SECRET_VARIABLES: &[&str] = &[
    "STEWARD_ADMIN_TOKEN",
    "STEWARD_DATABASE_URL",
    "STEWARD_TOKEN",
];
const SECRET_FLAGS: &[&str] = &["--admin-token", "--database-url"];
/// Set on the re-executed server: the descriptor its secrets arrive on.
const SECRETS_FD: &str = "STEWARD_SECRETS_FD";

#[derive(serde::Serialize, serde::Deserialize)]
struct HandedSecrets {
    admin_token: Option<String>,
    database_url: Option<String>,
}

/// Keep the server's secrets out of everything another process can read of it. A variable
/// removed with `remove_var` is still in the kernel's copy of the initial environment
/// (`/proc/<pid>/environ`), and a flag stays in `/proc/<pid>/cmdline` for every local user:
/// so a server given a secret either way runs itself again, with neither, and receives the
/// secrets through a pipe. The server is also made non-dumpable: its `/proc` files then belong
/// to root and no process of its user can trace it or read its memory.
fn hide_secrets(args: &mut ServerArgs) -> anyhow::Result<()> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    if let Ok(fd) = std::env::var(SECRETS_FD) {
        let fd: i32 = fd
            .parse()
            .map_err(|_| anyhow::anyhow!("bad {SECRETS_FD}"))?;
        // SAFETY: the descriptor was left open for us by our own re-exec, and is read once
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut text = String::new();
        f.by_ref().take(1 << 20).read_to_string(&mut text)?;
        let handed: HandedSecrets = serde_json::from_str(&text)?;
        args.admin_token = args.admin_token.take().or(handed.admin_token);
        args.database_url = args.database_url.take().or(handed.database_url);
        // SAFETY: no other thread runs yet
        unsafe { std::env::remove_var(SECRETS_FD) };
    } else {
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let in_flags = argv.iter().any(|a| {
            let a = a.to_string_lossy();
            SECRET_FLAGS
                .iter()
                .any(|f| a == *f || a.starts_with(&format!("{f}=")))
        });
        let in_env = SECRET_VARIABLES
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        if in_flags || in_env {
            return reexec_without_secrets(args, &argv);
        }
    }
    // SAFETY: prctl(2) on this process
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    Ok(())
}

/// Run this program again with the same arguments minus the secret flags, the same
/// environment minus the secret variables, and the secrets on an inherited pipe. Returns
/// only when that fails.
fn reexec_without_secrets(args: &ServerArgs, argv: &[std::ffi::OsString]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    use std::os::unix::process::CommandExt;
    let mut kept = Vec::new();
    let mut skip_value = false;
    for a in argv.iter().skip(1) {
        if skip_value {
            skip_value = false;
            continue;
        }
        let s = a.to_string_lossy();
        if SECRET_FLAGS.contains(&s.as_ref()) {
            skip_value = true;
            continue;
        }
        if SECRET_FLAGS.iter().any(|f| s.starts_with(&format!("{f}="))) {
            continue;
        }
        kept.push(a.clone());
    }
    let secrets = serde_json::to_vec(&HandedSecrets {
        admin_token: args.admin_token.clone(),
        database_url: args.database_url.clone(),
    })?;
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) into an array we own; the read end stays open across exec
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: fds[1] is the write end we just made; the File closes it
    let mut w = unsafe { std::fs::File::from_raw_fd(fds[1]) };
    // far below a pipe's buffer: the write does not wait for the reader
    anyhow::ensure!(secrets.len() < 60_000, "the secrets given are too long");
    w.write_all(&secrets)?;
    drop(w);
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0(&argv[0])
        .args(kept)
        .env(SECRETS_FD, fds[0].to_string());
    for v in SECRET_VARIABLES {
        cmd.env_remove(v);
    }
    let e = cmd.exec();
    Err(anyhow::anyhow!(
        "running the server again without its secrets in view failed: {e}"
    ))
}

pub fn run(mut args: ServerArgs) -> anyhow::Result<ExitCode> {
    if args.action.is_none() {
        hide_secrets(&mut args)?;
    }
    crate::sandbox::configure(crate::sandbox::Config {
        uid_base: args.sandbox_uid_base,
        executor_user: match &args.executor_user {
            Some(user) => crate::sandbox::executor_user(user)?,
            None => crate::sandbox::ExecutorUser::PerEnvironment,
        },
        ..Default::default()
    });
    let rotate = match args.action {
        Some(ServerAction::Status(remote)) => return status(remote),
        Some(ServerAction::RotateReplicaSecret { grace }) => {
            if !(grace.is_finite() && grace >= 0.0) {
                anyhow::bail!("--grace must be a number of seconds, 0 or more");
            }
            Some(std::time::Duration::from_secs_f64(grace))
        }
        None => None,
    };
    if !(args.heartbeat > 0.0 && args.lease_time >= 2.0 * args.heartbeat) {
        anyhow::bail!(
            "--lease-time ({}) must be at least twice --heartbeat ({}), and both above 0: a lease must outlive a missed heartbeat",
            args.lease_time,
            args.heartbeat
        );
    }
    if let Some(u) = &args.advertise_url
        && !(u.starts_with("http://") || u.starts_with("https://"))
    {
        anyhow::bail!("--advertise-url must be an http:// or https:// URL, not '{u}'");
    }
    let config = ServerConfig {
        bind: args.bind,
        database_url: args.database_url,
        data_dir: args.data_dir,
        no_auth: args.no_auth,
        admin_token: args.admin_token,
        scheduler: !args.no_scheduler,
        executor_bin: crate::scheduler::Schedulers::default_executor_bin(),
        prune_interval: std::time::Duration::from_secs(args.prune_interval),
        python_envs: crate::server::caches::CachePolicy {
            grace: std::time::Duration::from_secs(args.python_env_grace),
            max_bytes: (args.max_python_envs_size > 0).then_some(args.max_python_envs_size),
        },
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(crate::server::tls::TlsFiles { cert, key }),
            // clap requires both or neither
            _ => None,
        },
        advertise_url: args.advertise_url,
        allow_plain_http_replica_links: args.allow_plain_http_replica_links,
        allow_local_git_sources: args.allow_local_git_sources,
        pip_sources: crate::sources::compile::PipSources {
            index_url: args.pip_index_url,
            find_links: args.pip_find_links,
        },
        heartbeat: std::time::Duration::from_secs_f64(args.heartbeat),
        lease_time: std::time::Duration::from_secs_f64(args.lease_time),
    };
    // Secrets read from the environment are not kept there: nothing started later (a
    // compile, an executor, a handler) can inherit them, even by mistake.
    for secret in [
        "STEWARD_ADMIN_TOKEN",
        "STEWARD_DATABASE_URL",
        "STEWARD_TOKEN",
    ] {
        // SAFETY: no other thread runs yet (the runtime starts below)
        unsafe { std::env::remove_var(secret) };
    }
    let rt = tokio::runtime::Runtime::new()?;
    if let Some(grace) = rotate {
        rt.block_on(crate::server::start::rotate_replica_secret(&config, grace))?;
        println!(
            "new replica secret made; the old one is accepted for {} s more",
            grace.as_secs_f64()
        );
        return Ok(ExitCode::SUCCESS);
    }
    rt.block_on(crate::server::start::run(config))?;
    Ok(ExitCode::SUCCESS)
}

/// `steward executor`: serve handler work from a scheduler on stdin/stdout.
pub fn run_executor() -> anyhow::Result<ExitCode> {
    crate::executor::main_loop()?;
    Ok(ExitCode::SUCCESS)
}

/// `steward server status`: replicas, what each owns, heartbeat and lease ages.
fn status(args: super::remote::RemoteArgs) -> anyhow::Result<ExitCode> {
    let remote = super::remote::connect(&args, None)?;
    let rt = tokio::runtime::Runtime::new()?;
    let r = rt.block_on(remote.client.replicas())?;
    if remote.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows = r
        .replicas
        .iter()
        .map(|v| {
            let state = if v.replica.stopping {
                "stopping"
            } else if v.live {
                "live"
            } else {
                "silent"
            };
            let this = if r.this.as_deref() == Some(v.replica.id.as_str()) {
                " (this)"
            } else {
                ""
            };
            vec![
                format!("{}{this}", v.replica.id),
                state.to_string(),
                v.replica.advertise_url.clone(),
                format!("{:.1}s", v.replica.heartbeat_age_s),
                v.environments.len().to_string(),
                v.replica.version.clone(),
            ]
        })
        .collect();
    println!(
        "{}",
        super::remote::table(
            &[
                "REPLICA",
                "STATE",
                "URL",
                "HEARTBEAT",
                "ENVIRONMENTS",
                "VERSION"
            ],
            rows
        )
    );
    let mut leases: Vec<Vec<String>> = Vec::new();
    for v in &r.replicas {
        for l in &v.environments {
            leases.push(vec![
                l.name.clone(),
                v.replica.id.clone(),
                l.term.to_string(),
                format!("{:.1}s", l.renewed_age_s),
                format!("{:.1}s", l.expires_in_s),
            ]);
        }
    }
    for l in &r.unowned {
        leases.push(vec![
            l.name.clone(),
            format!("none (last {})", l.holder),
            l.term.to_string(),
            format!("{:.1}s", l.renewed_age_s),
            "expired".into(),
        ]);
    }
    if !leases.is_empty() {
        println!();
        println!(
            "{}",
            super::remote::table(
                &["ENVIRONMENT", "OWNER", "TERM", "RENEWED", "EXPIRES IN"],
                leases
            )
        );
    }
    if let Some(i) = &r.isolation {
        println!();
        println!(
            "isolation (this replica): compiles: {}, handlers of local: agents: {}, namespaces: {}",
            i.compiles,
            i.executors,
            if i.namespaces { "on" } else { "off" }
        );
        for w in &i.warnings {
            println!("warning: {w}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A size: a number of bytes with an optional unit (`KB`, `MB`, `GB`, `TB` powers of 1000;
/// `KiB`, `MiB`, `GiB`, `TiB` powers of 1024; `B`).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let n: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (a number with KiB, MiB, GiB, MB, GB, …)"))?;
    let factor: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1048576.0,
        "gib" => 1073741824.0,
        "tib" => 1099511627776.0,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ));
        }
    };
    Ok((n * factor) as u64)
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("500MiB"), Ok(500 << 20));
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("lots").is_err());
    }
}
