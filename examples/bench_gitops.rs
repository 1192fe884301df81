//! Git-to-disk latency: `cargo run --release --example bench_gitops [-- N]`
//!
//! A private PostgreSQL cluster (temporary, durable settings) and a server following a bare
//! repository on this machine, with `hooks/post-receive` installed for real. The model has N
//! fs::File resources (default 1,000). Each round changes one file in the model, commits, and
//! measures from `git push` returning to the new content being on disk: hook → webhook →
//! fetch → checkout → compile (a child process) → store → release → deploy.
//!
//! This program is also its own compiler and executor (`bench_gitops compile|executor …` runs
//! steward's command line), so the benchmark needs no other binary built.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "common/mod.rs"]
mod common;

use serde_json::json;
use steward::client::Client;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.com")
        .env("GIT_COMMITTER_NAME", "Bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.com")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn model(out: &Path, n: usize, changed: Option<(usize, usize)>) -> String {
    common::fs_files_model(n, out, changed)
}

async fn run(n: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (cluster, pool) = common::database(tmp.path(), 16).await;
    let me = std::env::current_exe().expect("own path");
    let mut state = steward::server::start::app_state_with_schedulers(
        pool.clone(),
        true,
        me.clone(),
        tmp.path(),
    )
    .await;
    steward::server::start::enable_git(&mut state, tmp.path().join("server"), me).await;
    // the benchmark's repository is local (file://)
    state.allow_local_git_sources = true;
    if let Some(g) = &state.sources {
        g.set_allow_local(true);
    }
    let url = common::serve(state).await;
    let c = Client::new(&url, None);

    // the repository, as on a git host, with the hook installed
    let origin = tmp.path().join("origin.git");
    let work = tmp.path().join("work");
    let out = tmp.path().join("files");
    std::fs::create_dir(&out).unwrap();
    git(
        tmp.path(),
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            origin.to_str().unwrap(),
            work.to_str().unwrap(),
        ],
    );
    git(&work, &["checkout", "-q", "-b", "main"]);
    std::fs::write(work.join("project.yml"), "name: bench\nmodulepath: libs\n").unwrap();
    std::fs::write(work.join("main.cf"), model(&out, n, None)).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "initial"]);
    git(&work, &["push", "-q", "origin", "main"]);

    let env = c
        .create_environment("bench", "gitops", None)
        .await
        .unwrap()
        .id
        .to_string();
    // the files are the environment's to write: as an operator gives a directory to the
    // environment's executor user (a uid of its own when the server runs as root)
    if let Some(id) =
        steward::sandbox::identity(env.parse().unwrap(), steward::sandbox::Role::Executor).unwrap()
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        std::os::unix::fs::chown(&out, Some(id.uid), Some(id.gid)).unwrap();
    }
    c.set_source(
        &env,
        &json!({"url": format!("file://{}", origin.display()), "branch": "main",
        "webhook_secret": "bench-secret", "poll_interval": 0, "watch": false}),
    )
    .await
    .unwrap();
    let hook = origin.join("hooks/post-receive");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/post-receive"),
        &hook,
    )
    .unwrap();
    git(
        &origin,
        &[
            "config",
            "steward.url",
            &format!("{url}/api/v1/environments/{env}/source/webhook"),
        ],
    );
    git(&origin, &["config", "steward.secret", "bench-secret"]);

    // the first version: compiled on following, deployed
    let start = Instant::now();
    let last = out.join(format!("f{:06}", n - 1));
    while std::fs::read_to_string(&last).ok().as_deref() != Some(&format!("file {}", n - 1)) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the first version did not deploy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "first version of {n} files compiled and deployed in {:.2} s",
        start.elapsed().as_secs_f64()
    );

    let mut times = Vec::new();
    for round in 1..=7 {
        let which = (round * 137) % n;
        std::fs::write(work.join("main.cf"), model(&out, n, Some((which, round)))).unwrap();
        git(&work, &["commit", "-q", "-am", &format!("round {round}")]);
        let target = out.join(format!("f{which:06}"));
        let want = format!("file {which} round {round}");
        git(&work, &["push", "-q", "origin", "main"]);
        // from the moment `git push` returned
        let start = Instant::now();
        while std::fs::read_to_string(&target).ok().as_deref() != Some(want.as_str()) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "round {round} did not reach the disk"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let t = start.elapsed().as_secs_f64();
        println!(
            "round {round}: git push returned -> file on disk in {:.0} ms",
            t * 1000.0
        );
        times.push(t);
        // a source takes at most one hinted fetch a second (a flood of hints must not become
        // a flood of fetches): space the pushes as people do, so each round measures one
        // push's latency and not the rate limit
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let list = c.compiles(&env, 1).await.unwrap();
    let id = list[0]["id"].as_str().unwrap().to_string();
    let report = c.compile_report(&env, &id).await.unwrap();
    let stages: Vec<String> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| match s["name"].as_str().unwrap() {
            // what the compile stage was made of
            "compile" => format!(
                "compile {} ms: {}",
                s["ms"],
                s["detail"].as_str().unwrap_or("")
            ),
            name => format!("{name} {} ms", s["ms"]),
        })
        .collect();
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("---");
    println!(
        "push -> changed file on disk, {n}-resource model: median {:.0} ms, best {:.0} ms, worst {:.0} ms (target < 1000 ms)",
        times[times.len() / 2] * 1000.0,
        times[0] * 1000.0,
        times[times.len() - 1] * 1000.0
    );
    println!(
        "stages of the last compile ({} trigger): {}",
        report["trigger"].as_str().unwrap_or("?"),
        stages.join(", ")
    );
    drop(pool);
    let _ = tokio::task::spawn_blocking(move || cluster.stop()).await;
}

fn main() -> std::process::ExitCode {
    match std::env::args().nth(1).as_deref() {
        // the server runs us as `steward compile …` and `steward executor`
        Some("compile") | Some("executor") => steward::cli::main(),
        other => {
            let n = other.and_then(|a| a.parse().ok()).unwrap_or(1000);
            tokio::runtime::Runtime::new().unwrap().block_on(run(n));
            std::process::ExitCode::SUCCESS
        }
    }
}
