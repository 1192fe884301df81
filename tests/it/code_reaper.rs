//! The handler code reaper over time: while versions with new handler code keep deploying and
//! old versions are deleted, the code directories of the executors stay bounded to the code
//! the stored versions use (plus what is within its grace), crash leftovers go, and code that
//! comes back after its directory was reaped is written again and deploys.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::python_handlers::{DEMO, inmanta_code, resource, upload, with_code};
use crate::support::{TestServer, wait_deployed};

/// The code directories (named by digest) under `dir` and its environments' directories
/// (`env-<uuid>/`, where schedulers write their environment's code).
fn code_dirs(dir: &Path) -> HashSet<String> {
    let mut found = HashSet::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("env-") {
            found.extend(code_dirs(&e.path()));
        } else if name.bytes().all(|b| b.is_ascii_hexdigit()) {
            found.insert(name);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn unused_code_directories_are_reaped_while_new_code_keeps_deploying() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("reaper", "code", None)
        .await
        .unwrap()
        .id
        .to_string();
    let code_dir = srv.data_dir().join("code");
    std::fs::create_dir_all(&code_dir).unwrap();
    // what crashes leave: a temporary directory and one never completed
    std::fs::create_dir_all(code_dir.join(".tmp-deadbeef-1/inmanta_plugins")).unwrap();
    std::fs::create_dir_all(code_dir.join("0badc0de")).unwrap();
    // and an older binary's copy of Steward's Python
    let older = code_dir.join("steward-python-0000000000000000");
    std::fs::create_dir_all(&older).unwrap();
    std::fs::write(older.join(".complete"), "old").unwrap();
    let grace = Duration::from_secs(2);
    let every = Duration::from_millis(500);
    let reaper = tokio::spawn(steward::scheduler::code::run_reaper(
        srv.pool.clone(),
        code_dir.clone(),
        every,
        grace,
    ));

    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("f");
    let journal = out.path().join("journal");
    let code_of = |round: usize| {
        let text = format!("{DEMO}\n# code of round {round}\n");
        inmanta_code(
            "demo",
            &[("inmanta_plugins/demo/__init__.py", text.as_str())],
            &["inmanta-module-std"],
            &["inmanta_plugins.demo"],
        )
    };
    let first_digest = code_of(0).0.digest.clone();
    // (version, its code's digest), oldest first
    let mut versions: Vec<(i32, String)> = Vec::new();
    // when each digest stopped being used by a stored version
    let mut unused_since: std::collections::HashMap<String, Instant> = Default::default();
    let mut most_dirs = 0;
    let mut latest_removal = Duration::ZERO;
    let mut reverted_after_reap = 0;
    // a directory unused for longer than this must be gone: the grace, a pass interval, and
    // slack for a pass that is under way
    let deadline = grace + every + Duration::from_millis(1500);
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(25) {
        // once the first round's code is reaped, a version goes back to it
        let code = if round > 0 && !code_dirs(&code_dir).contains(&first_digest) {
            reverted_after_reap += 1;
            code_of(0)
        } else {
            code_of(round)
        };
        unused_since.remove(&code.0.digest);
        let r = resource(
            "demo::File",
            "path",
            target.to_str().unwrap(),
            json!({"content": format!("round {round}"), "journal": journal.to_str().unwrap()}),
            &[],
        );
        let v = upload(&c, &env, &with_code(vec![r], &code)).await;
        let p = wait_deployed(&c, &env, v, 60).await;
        if p["by_status"]["deployed"] != 1 {
            let id = format!("demo::File[localhost,path={}]", target.display());
            let actions = crate::deploy::deploy_actions(&c, &env, &id).await;
            panic!("round {round}: {p}\n{:#}", actions[0].messages);
        }
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            format!("round {round}")
        );
        versions.push((v, code.0.digest.clone()));
        // keep the newest two versions
        while versions.len() > 2 {
            let (old, digest) = versions.remove(0);
            c.delete_version(&env, old).await.unwrap();
            if !versions.iter().any(|(_, d)| *d == digest) {
                unused_since.entry(digest).or_insert_with(Instant::now);
            }
        }
        let live = steward::store::code::live_digests(&srv.pool).await.unwrap();
        assert!(live.len() <= 2, "{live:?}");
        let dirs = code_dirs(&code_dir);
        most_dirs = most_dirs.max(dirs.len());
        // the stored versions' code is always there; unused code goes on schedule
        for d in &live {
            assert!(dirs.contains(d), "round {round}: {d} missing from {dirs:?}");
        }
        for d in &dirs {
            if let Some(since) = unused_since.get(d) {
                latest_removal = latest_removal.max(since.elapsed());
                assert!(
                    since.elapsed() < deadline,
                    "round {round}: {d} unused for {:?} and still there",
                    since.elapsed()
                );
            }
        }
        round += 1;
    }
    assert!(round >= 8, "only {round} rounds in 25 s");
    assert!(
        reverted_after_reap >= 1,
        "code never came back after being reaped ({round} rounds)"
    );
    // once the grace is over, only the code of the stored versions is left
    tokio::time::sleep(grace + every * 3).await;
    let live = steward::store::code::live_digests(&srv.pool).await.unwrap();
    assert_eq!(code_dirs(&code_dir), live);
    assert!(!code_dir.join(".tmp-deadbeef-1").exists());
    assert!(!code_dir.join("0badc0de").exists());
    assert!(!older.exists());
    // the environment's own directory keeps its helper
    assert!(code_dir.join(format!("env-{env}/_lib")).is_dir());
    assert!(
        code_dir
            .join(format!("env-{env}"))
            .join(steward::pycompat::dir_name())
            .is_dir()
    );
    eprintln!(
        "{round} rounds, at most {most_dirs} code directories, unused ones seen for up to {latest_removal:?}, {reverted_after_reap} reverts to reaped code"
    );
    reaper.abort();
}

/// Passes on their own: a directory goes after `grace` of being unused without a break,
/// whatever its age; `_venv` and `_lib` stay.
#[test]
fn a_directory_goes_after_being_unused_for_the_grace() {
    use steward::scheduler::code::{Reaped, Reaper};
    let dir = tempfile::tempdir().unwrap();
    let mk = |name: &str| {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
        std::fs::write(dir.path().join(name).join(".complete"), name).unwrap();
    };
    for name in ["a1", "b2", "_venv", "_lib"] {
        mk(name);
    }
    let names = || -> HashSet<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect()
    };
    let grace = Duration::from_millis(300);
    let mut reaper = Reaper::new(dir.path().to_path_buf(), grace);
    let only_a: HashSet<String> = ["a1".to_string()].into();
    let only_b: HashSet<String> = ["b2".to_string()].into();
    // b2 is unused from now on: not yet gone
    assert_eq!(reaper.pass(&only_a).unwrap(), Reaped::default());
    std::thread::sleep(grace / 2);
    // used again before the grace is over: its clock starts over
    assert_eq!(reaper.pass(&only_b).unwrap(), Reaped::default());
    assert_eq!(reaper.pass(&only_a).unwrap(), Reaped::default());
    std::thread::sleep(grace / 2 + Duration::from_millis(50));
    assert_eq!(reaper.pass(&only_a).unwrap(), Reaped::default());
    assert!(names().contains("b2"));
    std::thread::sleep(grace / 2 + Duration::from_millis(50));
    assert_eq!(
        reaper.pass(&only_a).unwrap(),
        Reaped {
            unused: 1,
            leftovers: 0
        }
    );
    assert_eq!(names(), ["a1", "_venv", "_lib"].map(String::from).into());
    // a directory that is not there is no error
    let mut gone = Reaper::new(dir.path().join("missing"), Duration::ZERO);
    assert_eq!(gone.pass(&only_a).unwrap(), Reaped::default());
}
