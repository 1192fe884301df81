//! Command-line interface: clap types and one module per subcommand. `anyhow` is allowed here
//! (and only here): this is the edge where errors become messages and exit codes.

mod compile;
mod control;
mod deploy;
mod env;
mod param;
mod preview;
mod progress;
mod project;
pub mod remote;
pub mod render;
mod resource;
mod server;
mod source;
mod token;
mod version;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "steward",
    version,
    about = "Intent-based orchestration for the Inmanta modelling language",
    long_about = "Steward compiles Inmanta-language models into resources and makes them happen.\n\n\
                  In a project directory (project.yml + main.cf):\n  \
                  steward compile              compile, print std::print output, report errors\n  \
                  steward export -j out.json   compile and write the resources to a file\n  \
                  steward export [-d]          compile and upload to a server (-d: also release)\n  \
                  steward deploy [--dry-run]   compile and deploy on this machine (all in one)\n\n\
                  Against a server (--server, --env, --token, or STEWARD_* variables, or .steward.toml):\n  \
                  steward server               run the server\n  \
                  steward env|version|resource|token|agent|dryrun|source|compile-report …\n  \
                  steward param|fact …         parameters and facts compiles read\n  \
                  steward env deploy|repair|halt|resume   deploy control of an environment"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "STEWARD_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

// parsed once per run: the size of the biggest variant costs nothing
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compile the project in the current directory (or --project).
    Compile(compile::CompileArgs),
    /// Compile and export the resources: to a file (-j) or to a server (-d also releases).
    Export(compile::ExportArgs),
    /// Compile the project, deploy it on this machine (private server and database under
    /// data/deploy), show progress and a summary; --dry-run shows what would change.
    Deploy(deploy::DeployArgs),
    /// Run the server (REST API over PostgreSQL).
    Server(server::ServerArgs),
    /// The project's Python environment: `project install` makes it from requirements.txt.
    #[command(subcommand)]
    Project(project::ProjectCmd),
    /// Environments: create, list, settings, delete.
    Env(Remote<env::EnvCmd>),
    /// Versions of an environment: list, show, diff, release, reject, rollback, delete.
    Version(Remote<version::VersionCmd>),
    /// Resources of an environment: list, show, logs.
    Resource(Remote<resource::ResourceCmd>),
    /// API tokens: create, list, revoke.
    Token(Remote<token::TokenCmd>),
    /// The git repository an environment follows: set, show, remove, trigger, timeline.
    Source(Remote<source::SourceCmd>),
    /// Compiles of commits of a git-following environment: list, show.
    CompileReport(Remote<source::CompileReportCmd>),
    /// Pull-request previews: what merging a pull request would change in an environment
    /// (list, show, run one by hand). A preview is never a version.
    Preview(Remote<preview::PreviewCmd>),
    /// Agents of an environment: list, pause, unpause; `agent run` hosts agents on this
    /// machine (an external agent process).
    Agent(Remote<control::AgentCmd>),
    /// Dry-runs: what a deploy of a version would change, without changing anything.
    Dryrun(Remote<control::DryrunCmd>),
    /// Parameters of an environment: values its model reads with std::getfact (list, get,
    /// set, delete); setting one the last compile missed compiles the model again.
    Param(Remote<param::ParamCmd>),
    /// Facts: values handlers report about resources (an IP address a VM got), which the
    /// model reads with std::getfact; list them.
    Fact(Remote<param::FactCmd>),
    /// Run handlers for a scheduler (started by the server; speaks JSON lines on stdin/stdout).
    #[command(hide = true)]
    Executor {
        /// The agent it works for (shown in process lists).
        #[arg(long)]
        agent: Option<String>,
    },
}

/// A command against a server: connection options and the subcommand.
#[derive(clap::Args, Debug)]
pub struct Remote<C: Subcommand> {
    #[command(flatten)]
    remote: remote::RemoteArgs,
    #[command(subcommand)]
    cmd: C,
}

fn init_tracing(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STEWARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

fn remote_command<F, C>(args: remote::RemoteArgs, cmd: C, run: F) -> anyhow::Result<ExitCode>
where
    F: AsyncFnOnce(remote::Remote, C) -> anyhow::Result<ExitCode>,
{
    let remote = remote::connect(&args, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(remote, cmd))
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let long_running = match &cli.command {
        Command::Server(_) => true,
        Command::Agent(r) => matches!(r.cmd, control::AgentCmd::Run { .. }),
        _ => false,
    };
    let level = if long_running {
        "info"
    } else {
        // a certificate that does not verify is the command's error, said once and with
        // what to do (client.rs), not also a log line of the verifier
        "warn,rustls_platform_verifier=off"
    };
    init_tracing(cli.log_format, level);
    // A command whose output goes to `head` or a closed pager ends quietly, as Unix tools do,
    // instead of panicking in println!. Long-running processes keep Rust's default (ignore
    // SIGPIPE, get EPIPE): a server must never die because a client or a log reader went away.
    if !long_running && !matches!(cli.command, Command::Executor { .. } | Command::Deploy(_)) {
        // SAFETY: restoring the default disposition of one signal before any thread starts
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Compile(args) => compile::run_compile(args),
        Command::Export(args) => compile::run_export(args),
        Command::Deploy(args) => deploy::run(args),
        Command::Project(cmd) => project::run(cmd),
        Command::Server(args) => server::run(args),
        Command::Env(r) => remote_command(r.remote, r.cmd, env::run),
        Command::Version(r) => remote_command(r.remote, r.cmd, version::run),
        Command::Resource(r) => remote_command(r.remote, r.cmd, resource::run),
        Command::Token(r) => remote_command(r.remote, r.cmd, token::run),
        Command::Source(r) => remote_command(r.remote, r.cmd, source::run_source),
        Command::CompileReport(r) => remote_command(r.remote, r.cmd, source::run_report),
        Command::Preview(r) => remote_command(r.remote, r.cmd, preview::run),
        Command::Agent(r) => remote_command(r.remote, r.cmd, control::run_agent),
        Command::Dryrun(r) => remote_command(r.remote, r.cmd, control::run_dryrun),
        Command::Param(r) => remote_command(r.remote, r.cmd, param::run_param),
        Command::Fact(r) => remote_command(r.remote, r.cmd, param::run_fact),
        Command::Executor { .. } => server::run_executor(),
    };
    match result {
        Ok(code) => code,
        // the reader went away (`| head`): nothing left to say to anyone
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
