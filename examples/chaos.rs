//! Fault/soak harness: `cargo run --release --example chaos -- --minutes M`
//!
//! Runs a real `steward server` (this program, as `chaos server …`: it is also its own
//! compiler and executor) with its private PostgreSQL cluster in a temp dir, on 127.0.0.1
//! only, keeps pushing commits while it kills the server, kills executors and restarts
//! PostgreSQL, then checks that everything converged. Exits non-zero when a check fails.
//!
//! Options: `--minutes M` (default 5, fractions allowed), `--max-requests N` (50,000),
//! `--seed S`, `--files N` (files in the model, 20), `--quiet-secs S` (how long the quiet
//! period may wait for convergence, 120), `--max-db-growth-mib X` (256), `--max-rss-mib X`
//! (512), `--keep` (keep the temp dir: data dir, repositories, server.log), `-q` (no
//! progress lines).

#[path = "chaos/mod.rs"]
mod chaos;

use std::process::ExitCode;

fn usage(e: &str) -> ExitCode {
    eprintln!(
        "{e}\nusage: chaos [--minutes M] [--max-requests N] [--seed S] [--files N] [--quiet-secs S] [--max-db-growth-mib X] [--max-rss-mib X] [--keep] [-q]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // the harness runs us as `… server`, and the server as `… compile` / `… executor`
    if matches!(
        args.first().map(String::as_str),
        Some("server" | "compile" | "executor")
    ) {
        return steward::cli::main();
    }
    let me = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return usage(&format!("own path: {e}")),
    };
    let mut cfg = chaos::Config::new(me, 5.0);
    cfg.verbose = true;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<String, ExitCode> {
            it.next()
                .cloned()
                .ok_or_else(|| usage(&format!("{name} needs a value")))
        };
        macro_rules! parse {
            ($name:expr) => {
                match value($name).map(|v| v.parse()) {
                    Ok(Ok(v)) => v,
                    Ok(Err(_)) => return usage(&format!("{} needs a number", $name)),
                    Err(code) => return code,
                }
            };
        }
        match a.as_str() {
            "--minutes" => cfg.minutes = parse!("--minutes"),
            "--max-requests" => cfg.max_requests = parse!("--max-requests"),
            "--seed" => cfg.seed = parse!("--seed"),
            "--files" => cfg.files = parse!("--files"),
            "--quiet-secs" => cfg.quiet_secs = parse!("--quiet-secs"),
            "--max-db-growth-mib" => cfg.max_db_growth_mib = parse!("--max-db-growth-mib"),
            "--max-rss-mib" => cfg.max_rss_mib = parse!("--max-rss-mib"),
            "--keep" => cfg.keep = true,
            "-q" | "--quiet" => cfg.verbose = false,
            "-h" | "--help" => return usage("chaos: fault/soak harness of the steward server"),
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    if !(cfg.minutes.is_finite() && cfg.minutes > 0.0 && cfg.files > 0) {
        return usage("--minutes must be positive and --files at least 1");
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return usage(&format!("tokio runtime: {e}")),
    };
    // Ctrl-C drops the run: its guards kill the server, stop its cluster and remove the
    // temp dir
    let report = rt.block_on(async {
        tokio::select! {
            r = chaos::run(&cfg) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    let Some(report) = report else {
        eprintln!("interrupted: the server is stopped and the temp dir removed");
        return ExitCode::from(130);
    };
    print!("{}", report.render());
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
