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
}

pub fn run(args: ServerArgs) -> anyhow::Result<ExitCode> {
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
