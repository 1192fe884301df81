//! `steward project install`: the project's Python environment, made from its
//! `requirements.txt` (where Inmanta projects name their `inmanta-module-*` packages).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use crate::pyenv::{self, InstallOptions};

/// Where `project install` makes the environment, relative to the project; the compiler
/// uses it when no virtualenv is active.
pub const PROJECT_VENV: &str = ".steward/venv";

#[derive(Subcommand, Debug)]
pub enum ProjectCmd {
    /// Make the project's Python environment (.steward/venv) from its requirements.txt:
    /// the V2 modules (inmanta-module-* packages) and the Python its modules' plugins need.
    /// Compiles use it unless a virtualenv is active (VIRTUAL_ENV). Nothing is done when the
    /// environment already holds the same requirements.
    Install(InstallArgs),
}

#[derive(Args, Debug)]
pub struct InstallArgs {
    /// Project directory (holding project.yml and requirements.txt).
    #[arg(long, short = 'p', default_value = ".", env = "STEWARD_PROJECT")]
    pub project: PathBuf,
    /// The Python interpreter the environment is made with.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Install wheels only: no package's build code runs (as the server installs).
    #[arg(long)]
    pub only_binary: bool,
    /// Print what venv and pip printed.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

pub fn run(cmd: ProjectCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        ProjectCmd::Install(args) => install(args),
    }
}

fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let project = args
        .project
        .canonicalize()
        .with_context(|| format!("no project at {}", args.project.display()))?;
    if !project.join("project.yml").is_file() {
        bail!("{} holds no project.yml", project.display());
    }
    let req_path = project.join("requirements.txt");
    let requirements = match std::fs::read_to_string(&req_path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "{} does not exist: list the project's modules there (for example \
                 inmanta-module-yaml), one pip requirement per line",
                req_path.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", req_path.display())),
    };
    let dir = project.join(PROJECT_VENV);
    let opts = InstallOptions {
        base_python: args.python,
        only_binary: args.only_binary,
        // the user's own machine and project: pip runs as they run it
        sandbox: None,
        // wheels only can not install inmanta-core (its `crontab` has no wheel): Steward
        // stands in for it, as it does on the server
        provide_core: args.only_binary,
    };
    eprintln!("installing {} into {}", req_path.display(), dir.display());
    let started = std::time::Instant::now();
    let done = pyenv::ensure(&dir, &requirements, &project, &opts)?;
    if args.verbose {
        eprint!("{}", done.output);
    }
    if done.created {
        eprintln!(
            "made {} in {:.1} s; compiles of this project use it",
            dir.display(),
            started.elapsed().as_secs_f64()
        );
    } else {
        eprintln!("{} already holds these requirements", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}
