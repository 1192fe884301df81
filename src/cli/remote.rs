//! Talking to a server: where it is, which environment, which token, which CA to trust —
//! from flags, STEWARD_* variables or a `.steward.toml` in the project directory (in that
//! order) — and printing answers as tables or JSON.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde::Deserialize;

use crate::client::{Client, ClientOptions};

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8888";

#[derive(Args, Debug, Clone, Default)]
pub struct RemoteArgs {
    /// Server URL [default: http://127.0.0.1:8888]
    #[arg(long, env = "STEWARD_SERVER", global = true)]
    pub server: Option<String>,
    /// Environment (id, name, or project/name)
    #[arg(long = "env", short = 'e', env = "STEWARD_ENV", global = true)]
    pub environment: Option<String>,
    /// API token
    #[arg(long, env = "STEWARD_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file of the CA that signed an https server's certificate (a private CA). Trusted
    /// in addition to the system's roots; not needed for a publicly trusted certificate.
    #[arg(long, env = "STEWARD_CA_CERT", global = true, value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,
    /// Print JSON instead of tables
    #[arg(long, global = true)]
    pub json: bool,
}

/// `.steward.toml`: `server`, `environment`, `token`, `ca_cert`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectConfig {
    pub server: Option<String>,
    pub environment: Option<String>,
    pub token: Option<String>,
    /// A relative path is relative to the directory of the `.steward.toml`.
    pub ca_cert: Option<PathBuf>,
}

pub fn load_project_config(dir: &Path) -> anyhow::Result<ProjectConfig> {
    let path = dir.join(".steward.toml");
    if !path.is_file() {
        return Ok(ProjectConfig::default());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut cfg: ProjectConfig =
        toml::from_str(&text).with_context(|| format!("invalid {}", path.display()))?;
    cfg.ca_cert = cfg.ca_cert.map(|ca| dir.join(ca));
    Ok(cfg)
}

pub struct Remote {
    pub client: Client,
    pub environment: Option<String>,
    pub json: bool,
}

impl Remote {
    pub fn env(&self) -> anyhow::Result<&str> {
        match &self.environment {
            Some(e) => Ok(e),
            None => bail!(
                "no environment: give --env, set STEWARD_ENV, or put environment = \"…\" in .steward.toml"
            ),
        }
    }
}

pub fn connect(args: &RemoteArgs, project_dir: Option<&PathBuf>) -> anyhow::Result<Remote> {
    let cwd = PathBuf::from(".");
    let cfg = load_project_config(project_dir.unwrap_or(&cwd))?;
    let server = args
        .server
        .clone()
        .or(cfg.server)
        .unwrap_or_else(|| DEFAULT_SERVER.to_string());
    let token = args.token.clone().or(cfg.token);
    let options = ClientOptions {
        ca_cert: args.ca_cert.clone().or(cfg.ca_cert),
    };
    Ok(Remote {
        client: Client::with_options(&server, token, &options)?,
        environment: args.environment.clone().or(cfg.environment),
        json: args.json,
    })
}

/// A plain text table: a header row and aligned columns.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let n = cells.len();
        for (i, c) in cells.into_iter().enumerate() {
            if i + 1 == n {
                out.push_str(&c);
            } else {
                out.push_str(&format!("{:<w$}  ", c, w = widths[i]));
            }
        }
        out.push('\n');
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect(), &mut out);
    for r in rows {
        line(r, &mut out);
    }
    out
}

pub fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// A short text for an optional time.
pub fn when(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}
