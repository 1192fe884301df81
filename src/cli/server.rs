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
    #[arg(long, env = "STEWARD_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Directory for the server's own data (the private PostgreSQL cluster, git mirrors, …).
    #[arg(long, env = "STEWARD_DATA_DIR", default_value = "data/server")]
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
    #[command(subcommand)]
    pub action: Option<ServerAction>,
}

#[derive(clap::Subcommand, Debug)]
pub enum ServerAction {
    /// Show the replicas on the server's database, the environments each owns, and the age
    /// of their heartbeats and leases (through the REST API: --url/STEWARD_URL and a token).
    Status(super::remote::RemoteArgs),
}

pub fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
    if let Some(ServerAction::Status(remote)) = args.action {
        return status(remote);
    }
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
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(crate::server::tls::TlsFiles { cert, key }),
            // clap requires both or neither
            _ => None,
        },
        advertise_url: args.advertise_url,
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
    Ok(ExitCode::SUCCESS)
}
