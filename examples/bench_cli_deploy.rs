//! `steward deploy` from the command line: `cargo run --release --example bench_cli_deploy [-- N]`
//!
//! The all-in-one command as a user runs it: a project with N fs::File resources (default
//! 10,000), `steward deploy -p PROJECT --data-dir DIR` as a child process (its private
//! PostgreSQL cluster, server, scheduler and executor), run again after each edit. Measures:
//!   1. the first run (N files written);
//!   2. a run after changing one file in `main.cf`: from the start of the command to the new
//!      content on disk, and to the command's exit (state stored, summary printed, cluster
//!      stopped);
//!   3. a run with nothing changed.
//!
//! Files go to a temp dir, or under $BENCH_DIR (e.g. /dev/shm). The program is also the
//! command it measures (`bench_cli_deploy deploy|executor …` runs steward's command line), so
//! no other binary needs to be built; $STEWARD_BIN runs another build instead (to compare
//! two of them in one hour).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

// (with the allocator of `steward` itself: the benchmark measures the command users run)
#[path = "common/mod.rs"]
mod common;

const ROUNDS: usize = 7;

/// The `steward` measured: $STEWARD_BIN, else this program.
fn steward_bin() -> PathBuf {
    std::env::var_os("STEWARD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_exe().expect("own path"))
}

struct Run {
    /// start of the command to the awaited content on disk (None: not awaited)
    on_disk: Option<Duration>,
    /// start of the command to its exit
    exit: Duration,
    stdout: String,
    stderr: String,
}

/// Run `steward deploy` (this program) on the project; with `watch`, also note when `path`
/// holds `content`.
fn deploy(project: &Path, data: &Path, watch: Option<(&Path, &str)>) -> Run {
    let started = Instant::now();
    let child = Command::new(steward_bin())
        .args(["deploy", "-p"])
        .arg(project)
        .arg("--data-dir")
        .arg(data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("steward deploy");
    let mut on_disk = None;
    if let Some((path, content)) = watch {
        let deadline = started + Duration::from_secs(120);
        while Instant::now() < deadline {
            if std::fs::read(path).is_ok_and(|b| b == content.as_bytes()) {
                on_disk = Some(started.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        assert!(
            on_disk.is_some(),
            "{} never held {content:?}",
            path.display()
        );
    }
    let out = child.wait_with_output().expect("steward deploy");
    let exit = started.elapsed();
    let run = Run {
        on_disk,
        exit,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "steward deploy failed:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    run
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn range(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    format!(
        "median {:.3} s (best {lo:.3}, worst {hi:.3})",
        median(v.to_vec())
    )
}

/// The compile time the command reports ("compiled … in N ms").
fn compile_ms(stderr: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.starts_with("compiled "))?;
    let (_, rest) = line.rsplit_once(" in ")?;
    rest.split_whitespace().next()?.parse().ok()
}

fn run(n: usize) {
    let base: PathBuf = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("bench-cli-deploy-")
        .tempdir_in(&base)
        .expect("temp dir");
    let (project, files, data) = (
        tmp.path().join("project"),
        tmp.path().join("files"),
        tmp.path().join("data"),
    );
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&files).unwrap();
    // a root run starts its cluster as postgres, which must reach the data dir
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        project.join("project.yml"),
        "name: bench\nmodulepath: libs\n",
    )
    .unwrap();
    std::fs::write(
        project.join("main.cf"),
        common::fs_files_model(n, &files, None),
    )
    .unwrap();
    println!(
        "{} deploy, {n} fs::File resources, files under {}",
        steward_bin().display(),
        files.display()
    );

    let first = deploy(&project, &data, None);
    println!(
        "1. first run: {:.3} s (compile {} ms)",
        first.exit.as_secs_f64(),
        compile_ms(&first.stderr).unwrap_or(0)
    );

    let (mut disk, mut exit, mut compile) = (vec![], vec![], vec![]);
    for round in 1..=ROUNDS {
        // the same file each round, with new content: one change against the last run
        let which = n / 2;
        std::fs::write(
            project.join("main.cf"),
            common::fs_files_model(n, &files, Some((which, round))),
        )
        .unwrap();
        let path = files.join(format!("f{which:06}"));
        let content = format!("file {which} round {round}");
        let r = deploy(&project, &data, Some((&path, &content)));
        assert!(
            r.stdout.contains("1 updated") && r.stderr.contains("1 changed"),
            "round {round}: one change expected:\n{}\n{}",
            r.stdout,
            r.stderr
        );
        disk.push(r.on_disk.unwrap().as_secs_f64());
        exit.push(r.exit.as_secs_f64());
        compile.push(compile_ms(&r.stderr).unwrap_or(0) as f64 / 1000.0);
    }
    println!("2. change one file ({ROUNDS} rounds):");
    println!("   command start -> new content on disk: {}", range(&disk));
    println!("   command start -> exit:                {}", range(&exit));
    println!(
        "   of which the compile:                 {}",
        range(&compile)
    );

    let mut same = vec![];
    for _ in 0..3 {
        let r = deploy(&project, &data, None);
        assert!(r.stdout.contains("no changes"), "{}", r.stdout);
        same.push(r.exit.as_secs_f64());
    }
    println!("3. nothing changed, start -> exit: {}", range(&same));
}

fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        // the scheduler starts us as its executor, the benchmark as `steward deploy`
        Some("executor") => {
            steward::executor::main_loop().expect("executor");
        }
        Some("deploy") => return steward::cli::main(),
        other => {
            let n = other.and_then(|a| a.parse().ok()).unwrap_or(10_000);
            run(n);
        }
    }
    std::process::ExitCode::SUCCESS
}
