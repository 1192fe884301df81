//! `steward deploy`'s scheduler snapshot (`embedded::warm`, `scheduler::snapshot`): what a
//! run's scheduler leaves for the next run's must be exactly what the database holds, and a
//! database that changed in between must never be read through it. The real binary, its
//! private PostgreSQL, real files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use steward::embedded::warm;
use steward::store::cluster::PgCluster;

use crate::support::steward_bin;

/// A run of `steward deploy`, killed (and the test failed) when it takes over two minutes: a
/// scheduler that believed a stale snapshot waits for a deploy it never starts.
fn deploy(dir: &Path) -> Output {
    let child = Command::new(steward_bin())
        .arg("deploy")
        .arg("-p")
        .arg(dir)
        .env("STEWARD_LOG", "info,sqlx=warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run steward deploy");
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if waited
            .recv_timeout(std::time::Duration::from_secs(120))
            .is_err()
        {
            // SAFETY: kill(2) on our child, not yet reaped (wait_with_output holds it)
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
        }
    });
    let out = child.wait_with_output().expect("wait for steward deploy");
    let finished = done.send(()).is_ok();
    assert!(
        finished,
        "steward deploy did not finish in two minutes (stopped):\n{}",
        text(&out)
    );
    out
}

fn text(o: &Output) -> String {
    crate::support::output_text(o)
}

/// Whether the run's scheduler started from the last run's snapshot (its log says).
fn started_from_snapshot(o: &Output) -> bool {
    let t = text(o);
    let line = t
        .lines()
        .find(|l| l.contains("scheduler started"))
        .unwrap_or_else(|| panic!("no scheduler start in the log:\n{t}"));
    line.contains("from_snapshot=true")
}

/// A model of files under `out`, each requiring the directory; `broken` adds one whose
/// parent is a plain file (it fails, and is retried later).
fn write_model(dir: &Path, out: &Path, files: &[(String, String)], broken: bool) {
    let mut m = String::from(
        "import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
         d = fs::Directory(host=host, path=\"OUT\", mode=755)\n",
    );
    for (name, content) in files {
        m.push_str(&format!(
            "fs::File(host=host, path=\"OUT/{name}\", content=\"{content}\", mode=644, requires=d)\n"
        ));
    }
    if broken {
        m.push_str(
            "fs::File(host=host, path=\"OUT/plain/inside\", content=\"x\", mode=644, requires=d)\n",
        );
    }
    std::fs::write(
        dir.join("main.cf"),
        m.replace("OUT", &out.display().to_string()),
    )
    .unwrap();
}

fn project() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("project.yml"), "name: snap\nmodulepath: libs\n").unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("plain"), "a file, not a directory").unwrap();
    (tmp, dir, out)
}

/// Start the run's cluster (taking the snapshot file first, as a run does), and hand both
/// to `check`; the cluster is stopped cleanly after.
async fn with_database<T>(
    dir: &Path,
    check: impl AsyncFnOnce(warm::Warm, &sqlx::PgPool) -> T,
) -> T {
    let data = dir.join("data/deploy");
    let cluster = PgCluster::new(&data.join("pg")).unwrap();
    let snapshots = warm::take(&data, &cluster);
    cluster.start(true).unwrap();
    let pool = steward::store::connect(&cluster.url("steward"), 2)
        .await
        .unwrap();
    let r = check(snapshots, &pool).await;
    pool.close().await;
    cluster.stop().unwrap();
    r
}

/// Random runs (content edits, files added and removed, a resource that fails and comes
/// back): after every third, what the run left (the scheduler's snapshot, the store's newest
/// manifest) is compared with the database row by row; the runs between start from it and
/// still deploy what the model says.
#[tokio::test(flavor = "multi_thread")]
async fn a_runs_snapshot_holds_what_its_database_holds_over_random_runs() {
    let (_tmp, dir, out) = project();
    let mut rng = 0x5eed_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut files: Vec<(String, String)> = (0..12)
        .map(|i| (format!("f{i}"), format!("content {i}")))
        .collect();
    let mut broken = false;
    let mut counter = 100;
    let mut expect_warm = false;
    let mut compared = 0;
    let mut warm_runs = 0;
    let mut stored_before = false;
    for round in 0..12 {
        // edit: a few contents, maybe a file more or less, maybe the broken one toggled
        for _ in 0..=next(3) {
            let i = next(files.len() as u64) as usize;
            counter += 1;
            files[i].1 = format!("content {counter}");
        }
        match next(4) {
            0 => {
                counter += 1;
                files.push((format!("n{counter}"), format!("new {counter}")));
            }
            1 if files.len() > 4 => {
                files.remove(next(files.len() as u64) as usize);
            }
            2 => broken = !broken,
            _ => {}
        }
        write_model(&dir, &out, &files, broken);
        let run = deploy(&dir);
        assert_eq!(
            run.status.success(),
            !broken,
            "round {round}: exit {:?}\n{}",
            run.status,
            text(&run)
        );
        assert_eq!(
            started_from_snapshot(&run),
            expect_warm,
            "round {round}\n{}",
            text(&run)
        );
        // the server takes every run's changes against what it holds, from the snapshot's
        // manifest (its content tree made from seals) as from the database: none is refused
        // and sent again whole
        if stored_before && !broken {
            assert!(
                text(&run).contains("sent as its changes"),
                "round {round}: not stored as its changes\n{}",
                text(&run)
            );
        }
        stored_before |= !broken;
        warm_runs += expect_warm as usize;
        for (name, content) in &files {
            assert_eq!(
                std::fs::read_to_string(out.join(name)).ok().as_deref(),
                Some(content.as_str()),
                "round {round}: {name}\n{}",
                text(&run)
            );
        }
        if round % 3 == 2 {
            let (warm, differences) = with_database(&dir, async |warm, pool| {
                let mut differences = Vec::new();
                for s in &warm.snapshots {
                    differences.extend(s.differences_from_database(pool).await.unwrap());
                }
                for m in &warm.manifests {
                    differences.extend(m.differences_from_database(pool).await.unwrap());
                }
                (warm, differences)
            })
            .await;
            let snapshots = warm.snapshots;
            assert_eq!(snapshots.len(), 1, "round {round}: one environment");
            assert_eq!(warm.manifests.len(), 1, "round {round}: one manifest");
            assert_eq!(
                warm.manifests[0].resources(),
                snapshots[0].resources(),
                "round {round}"
            );
            // the directory, the files, and the broken one when there
            assert_eq!(
                snapshots[0].resources(),
                files.len() + 1 + broken as usize,
                "round {round}"
            );
            assert!(
                differences.is_empty(),
                "round {round}: the snapshot differs from the database:\n{}",
                differences.join("\n")
            );
            compared += 1;
            // taken by the comparison: the next run reads the database
            expect_warm = false;
        } else {
            expect_warm = true;
        }
    }
    assert_eq!(compared, 4);
    assert!(warm_runs >= 6, "{warm_runs} runs started from a snapshot");
}

/// The attack on the snapshot: between two runs, the database is changed (here: a
/// resource's state says it must deploy again, and its file is gone). A run that read the
/// stale snapshot would believe it deployed and leave the file missing.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_changed_between_runs_is_read_and_not_its_snapshot() {
    let (_tmp, dir, out) = project();
    let files: Vec<(String, String)> = (0..3)
        .map(|i| (format!("f{i}"), format!("content {i}")))
        .collect();
    write_model(&dir, &out, &files, false);
    let first = deploy(&dir);
    assert!(first.status.success(), "{}", text(&first));
    // a run of nothing: it starts from the first one's snapshot
    let second = deploy(&dir);
    assert!(second.status.success(), "{}", text(&second));
    assert!(started_from_snapshot(&second), "{}", text(&second));
    assert!(dir.join("data/deploy/warm").exists());

    // someone changes the database while no run is on (the snapshot file stays in place:
    // the cluster is started and stopped around it)
    let data = dir.join("data/deploy");
    let kept = std::fs::read(data.join("warm")).unwrap();
    let cluster = PgCluster::new(&data.join("pg")).unwrap();
    cluster.start(true).unwrap();
    let pool = steward::store::connect(&cluster.url("steward"), 2)
        .await
        .unwrap();
    let changed = sqlx::query(
        "UPDATE resource_state SET last_run_hash = 'someone else''s', compliance = 'non_compliant' \
         WHERE resource_id LIKE '%/f1]'",
    )
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(changed, 1);
    pool.close().await;
    cluster.stop().unwrap();
    std::fs::write(data.join("warm"), &kept).unwrap();
    std::fs::remove_file(out.join("f1")).unwrap();

    let third = deploy(&dir);
    assert!(third.status.success(), "{}", text(&third));
    assert!(
        !started_from_snapshot(&third),
        "the snapshot of a changed database was used:\n{}",
        text(&third)
    );
    assert!(
        text(&third).contains("the database changed since it was written"),
        "{}",
        text(&third)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("f1")).ok().as_deref(),
        Some("content 1"),
        "the resource the database said to deploy again was not\n{}",
        text(&third)
    );
}
