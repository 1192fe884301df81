//! Per-commit Python environments stay within the server's cap (issue 28, defect 3): a soak
//! of 50 commits with 50 different requirement sets, in 5 environments compiling at once, on
//! a real `steward server` with `--max-python-envs-size`. Without the reaper each commit
//! leaves about 26 MB behind for ever (1.3 GB here); with it, `python-envs/` stays within the
//! cap plus what running compiles use, and every compile still works (no environment is
//! removed under one).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use steward::client::Client;

use crate::gitops_support::{Repo, compiled};
use crate::support::{free_port, new_database, spawn_server_with, wait_healthy};

const ENVIRONMENTS: usize = 5;
const COMMITS_EACH: usize = 10;
const CAP_MIB: u64 = 100;

/// Versions 1.0.0 … 1.0.(n-1) of a tiny V2 module `inmanta-module-demo`, in a wheel
/// directory compiles may read.
fn wheels(n: usize) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for i in 0..n {
        let w = crate::python_envs::demo_wheel(dir.path(), &format!("1.0.{i}"));
        std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    dir
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_requirement_sets_stay_within_the_cap_and_every_compile_works() {
    let wheels = wheels(ENVIRONMENTS * COMMITS_EACH);
    let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
    let port = free_port();
    let admin = "stw_test_admin_env_reaper";
    let wheels_arg = wheels.path().as_os_str().to_owned();
    let cap = format!("{CAP_MIB}MiB");
    // killed when the test ends, also when it fails
    let mut child = crate::support::AgentProc(spawn_server_with(
        &new_database(),
        port,
        admin,
        data.path(),
        &[
            "--pip-find-links".as_ref(),
            wheels_arg.as_os_str(),
            "--max-python-envs-size".as_ref(),
            cap.as_ref(),
            "--prune-interval".as_ref(),
            "5".as_ref(),
        ],
    ));
    let url = format!("http://127.0.0.1:{port}");
    wait_healthy(&url).await;
    let c = Client::new(&url, Some(admin.into()));
    let envs_dir = data.path().join("python-envs");

    let mut repos = Vec::new();
    for e in 0..ENVIRONMENTS {
        let repo = Repo::new();
        let env = crate::gitops_support::follow(&c, &format!("soak-{e}"), &repo, json!({})).await;
        repos.push((env, repo));
    }
    let started = Instant::now();
    let mut peak = 0u64;
    let mut biggest_env = 0u64;
    let mut done = 0;
    for round in 0..COMMITS_EACH {
        let mut commits = Vec::new();
        for (e, (env, repo)) in repos.iter().enumerate() {
            let version = e * COMMITS_EACH + round;
            std::fs::write(
                repo.work.join("requirements.txt"),
                format!("inmanta-module-demo==1.0.{version}\n"),
            )
            .unwrap();
            let commit = repo.commit(
                &format!("import demo\ndemo::Greeter(name=\"{version}\")\n"),
                &format!("requirements set {version}"),
            );
            repo.push_ok();
            c.trigger_compile(env, Some(&commit)).await.unwrap();
            commits.push((env.clone(), commit));
        }
        for (env, commit) in commits {
            let r = compiled(&c, &env, &commit, 300).await;
            assert_eq!(r["status"], "success", "{r:#}");
            done += 1;
            let used = steward::pyenv::reap::disk_usage(&envs_dir);
            peak = peak.max(used);
            for e in std::fs::read_dir(envs_dir.join(&env)).unwrap().flatten() {
                if e.path().is_dir() && !e.file_name().to_string_lossy().starts_with('.') {
                    biggest_env = biggest_env.max(steward::pyenv::reap::disk_usage(&e.path()));
                }
            }
        }
        eprintln!(
            "round {round}: {done} compiles in {:.0} s, python-envs/ {:.0} MiB (peak {:.0} MiB)",
            started.elapsed().as_secs_f64(),
            mib(steward::pyenv::reap::disk_usage(&envs_dir)),
            mib(peak)
        );
    }
    // at most the cap, plus the environments compiles were using at that moment (one per
    // environment) and pip's caches
    let allowed = (CAP_MIB << 20) + ENVIRONMENTS as u64 * biggest_env + (20 << 20);
    assert!(
        peak <= allowed,
        "python-envs/ reached {:.0} MiB (cap {CAP_MIB} MiB, each environment {:.0} MiB)",
        mib(peak),
        mib(biggest_env)
    );
    // once nothing runs, a pass brings it under the cap
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let used = steward::pyenv::reap::disk_usage(&envs_dir);
        if used <= CAP_MIB << 20 {
            eprintln!(
                "settled at {:.0} MiB; peak {:.0} MiB; without the reaper about {:.0} MiB",
                mib(used),
                mib(peak),
                mib(biggest_env * (ENVIRONMENTS * COMMITS_EACH) as u64)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "python-envs/ stays at {:.0} MiB, over the {CAP_MIB} MiB cap",
            mib(used)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = std::fs::read_to_string(data.path().join("server.log")).unwrap();
    assert!(log.contains("unused Python environments removed"), "{log}");
    left_nothing_half_removed(&envs_dir);
    let _ = child.kill();
    let _ = child.wait();
}

/// No `.reap-*` directory is left once passes are done. A pass may be in the middle of
/// removing one when the total drops under the cap (the bytes go file by file, the renamed
/// directory last), so a few seconds are given for it to finish; one left by a pass that
/// failed stays and fails the test.
fn left_nothing_half_removed(dir: &Path) {
    let half_removed = || {
        let mut found = Vec::new();
        for env in std::fs::read_dir(dir).unwrap().flatten() {
            for e in std::fs::read_dir(env.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if e.file_name().to_string_lossy().starts_with(".reap-") {
                    found.push(e.path());
                }
            }
        }
        found
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = half_removed();
        if found.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{found:?} left for 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}
