//! Command-line interface: clap types and one module per subcommand. `anyhow` is allowed here
//! (and only here): this is the edge where errors become messages and exit codes.

mod compile;
pub mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "steward",
    version,
    about = "Intent-based orchestration for the Inmanta modelling language",
    long_about = "Steward compiles Inmanta-language models into resources and makes them happen.\n\n\
                  In a project directory (project.yml + main.cf):\n  \
                  steward compile            compile, print std::print output, report errors\n  \
                  steward export -j out.json compile and write the resources to a file"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Compile the project in the current directory (or --project).
    Compile(compile::CompileArgs),
    /// Compile and export the resources (to a file with -j).
    Export(compile::ExportArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compile(args) => compile::run_compile(args),
        Command::Export(args) => compile::run_export(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
