//! `steward deploy` end to end: the real binary on a copy of examples/quickstart (and small
//! projects of its own), with its private PostgreSQL under a temp dir.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use crate::support::{copy_dir, steward_bin};

/// A copy of the quickstart in a temp dir.
fn quickstart() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("quickstart");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart"),
        &dir,
    );
    (tmp, dir)
}

fn deploy(dir: &Path, extra: &[&str]) -> Output {
    Command::new(steward_bin())
        .arg("deploy")
        .arg("-p")
        .arg(dir)
        .args(extra)
        .env_remove("QUICKSTART_ROOT")
        .output()
        .expect("run steward deploy")
}

fn text(o: &Output) -> String {
    crate::support::output_text(o)
}

fn mtime(p: &Path) -> SystemTime {
    std::fs::symlink_metadata(p).unwrap().modified().unwrap()
}

#[test]
fn quickstart_deploys_then_changes_only_what_changed() {
    let (_tmp, dir) = quickstart();
    let site = dir.join("data/quickstart");

    let first = deploy(&dir, &[]);
    assert!(first.status.success(), "{}", text(&first));
    // ten made, two commands run (an exec::Run that runs reports an update)
    assert!(
        text(&first).contains("12 deployed (10 created, 2 updated, 0 deleted)"),
        "{}",
        text(&first)
    );
    let conf = std::fs::read_to_string(site.join("shop/site.conf")).unwrap();
    assert!(conf.contains("listen 8081"), "{conf}");
    assert_eq!(
        std::fs::read_to_string(site.join("blog/www/index.html")).unwrap(),
        "<h1>Hello from steward</h1>\n"
    );
    assert_eq!(
        std::fs::read_link(site.join("blog/current")).unwrap(),
        site.join("blog/www")
    );
    assert!(
        site.join("shop/reloaded").exists(),
        "the reload command ran on the first deploy"
    );

    // twice: nothing changes on disk
    let before: Vec<SystemTime> = ["shop/site.conf", "blog/www/index.html", "shop/reloaded"]
        .iter()
        .map(|f| mtime(&site.join(f)))
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    let second = deploy(&dir, &[]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(text(&second).contains("no changes"), "{}", text(&second));
    let after: Vec<SystemTime> = ["shop/site.conf", "blog/www/index.html", "shop/reloaded"]
        .iter()
        .map(|f| mtime(&site.join(f)))
        .collect();
    assert_eq!(before, after);

    // a dry-run of an edit shows it and changes nothing
    let main = dir.join("main.cf");
    let model = std::fs::read_to_string(&main).unwrap();
    std::fs::write(&main, model.replace("port=8081", "port=9090")).unwrap();
    let dry = deploy(&dir, &["--dry-run"]);
    assert!(dry.status.success(), "{}", text(&dry));
    assert!(
        text(&dry).contains("1 would change") && text(&dry).contains("listen 9090"),
        "{}",
        text(&dry)
    );
    assert!(
        std::fs::read_to_string(site.join("shop/site.conf"))
            .unwrap()
            .contains("listen 8081")
    );

    // the edit applies: only the shop's config, and its reload runs
    let reloaded = mtime(&site.join("shop/reloaded"));
    let blog = mtime(&site.join("blog/site.conf"));
    std::thread::sleep(Duration::from_millis(20));
    let third = deploy(&dir, &[]);
    assert!(third.status.success(), "{}", text(&third));
    assert!(
        text(&third).contains("(0 created, 2 updated, 0 deleted)")
            && text(&third).contains("updated fs::File[localhost,path="),
        "{}",
        text(&third)
    );
    assert!(
        std::fs::read_to_string(site.join("shop/site.conf"))
            .unwrap()
            .contains("listen 9090")
    );
    assert!(
        mtime(&site.join("shop/reloaded")) > reloaded,
        "the reload did not run"
    );
    assert_eq!(mtime(&site.join("blog/site.conf")), blog);

    // a broken model: a diagnostic with file:line:col, nothing changed
    std::fs::write(&main, model.replace("port=8081", "port=8081,,")).unwrap();
    let broken = deploy(&dir, &[]);
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    let err = String::from_utf8_lossy(&broken.stderr);
    assert!(
        err.contains("main.cf:") && err.contains("nothing was deployed"),
        "{err}"
    );
    // the private server started while the model compiled (its cluster existed): stopped
    // again, nothing of it left running
    let left = processes_naming(&dir);
    assert!(
        left.is_empty(),
        "still running after a failed compile: {left:#?}"
    );
    assert!(
        std::fs::read_to_string(site.join("shop/site.conf"))
            .unwrap()
            .contains("listen 9090")
    );
}

/// Processes with an argument under `dir` (pid and command line), other than this one.
fn processes_naming(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        // a process may end while it is read: nothing to report then
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| Path::new(a).starts_with(dir)) {
            found.push(format!("{pid}: {}", args.join(" ")));
        }
    }
    found
}

/// A run that ends normally stops its cluster and ends the watchdog it started for a killed
/// run: nothing of it is left running. (Left alone, the watchdog woke within a second, took
/// the data dir's lock, creating the lock file again in a data dir that may be being deleted
/// by then, and stopped a stopped cluster; test runs left such directories behind in /tmp.)
#[test]
fn nothing_of_a_finished_run_outlives_it() {
    let (_tmp, dir) = quickstart();
    let first = deploy(&dir, &[]);
    assert!(first.status.success(), "{}", text(&first));
    let left = processes_naming(&dir);
    assert!(
        left.is_empty(),
        "still running after `steward deploy` ended: {left:#?}"
    );
}

#[test]
fn failures_give_a_nonzero_exit_with_their_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("project.yml"), "name: failing\nmodulepath: libs\n").unwrap();
    let out = dir.join("out");
    std::fs::write(
        dir.join("main.cf"),
        format!(
            r#"import fs
import exec
host = std::Host(name="localhost", os=std::linux)
bad = exec::Run(host=host, command="sh -c 'echo broken >&2; exit 3'")
fs::File(host=host, path="{out}/after", content="x", requires=bad)
fs::File(host=host, path="{out}/fine", content="y")
"#,
            out = out.display()
        ),
    )
    .unwrap();
    std::fs::create_dir(&out).unwrap();
    let o = deploy(dir, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("failed exec::Run[localhost,command=sh -c 'echo broken >&2; exit 3']"),
        "{t}"
    );
    assert!(t.contains("skipped_for_dependency fs::File"), "{t}");
    assert!(out.join("fine").exists() && !out.join("after").exists());
}

#[test]
fn a_killed_run_is_picked_up_by_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("project.yml"), "name: slow\nmodulepath: libs\n").unwrap();
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let mut model =
        String::from("import exec\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
    for i in 0..8 {
        let req = if i > 0 {
            format!(", requires=s{}", i - 1)
        } else {
            String::new()
        };
        model.push_str(&format!(
            "s{i} = exec::Run(host=host, command=\"sh -c 'sleep 0.3; echo {i} >> {}/steps'\"{req})\n",
            out.display()
        ));
    }
    std::fs::write(dir.join("main.cf"), model).unwrap();
    let mut child = Command::new(steward_bin())
        .args(["deploy", "-p"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let steps = || {
        std::fs::read_to_string(out.join("steps"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while steps() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first run did not start deploying"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // a killed run leaves no snapshot of its scheduler: the next one reads the database
    assert!(!dir.join("data/deploy/warm").exists());
    let again = deploy(dir, &[]);
    assert!(again.status.success(), "{}", text(&again));
    let all = std::fs::read_to_string(out.join("steps")).unwrap();
    for i in 0..8 {
        assert!(
            all.lines().any(|l| l == i.to_string()),
            "step {i} missing: {all}"
        );
    }
    // the database stops with the run
    std::thread::sleep(Duration::from_secs(3));
    let pg = dir.join("data/deploy/pg/data/postmaster.pid");
    assert!(!pg.exists(), "PostgreSQL still runs after the run ended");
}

/// A temp dir the postgres user can enter (as root, the cluster then stays in the project
/// instead of moving to /var/lib/steward), and a project dir under it whose path a shell
/// would misread: a space, a quote and a `$(touch …)` that must never run.
fn hostile_project() -> (tempfile::TempDir, PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pwned = crate::pg_security::marker();
    let dir = crate::pg_security::hostile_dir(tmp.path(), &pwned).join("project");
    (tmp, dir, pwned)
}

#[test]
fn deploy_works_in_a_path_a_shell_would_misread() {
    let (tmp, dir, pwned) = hostile_project();
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/quickstart"),
        &dir,
    );
    // the site goes to a plain path: the model's own commands are not under test here
    let site = tmp.path().join("site");
    let run = || {
        Command::new(steward_bin())
            .arg("deploy")
            .arg("-p")
            .arg(&dir)
            .env("QUICKSTART_ROOT", &site)
            .output()
            .expect("run steward deploy")
    };
    let first = run();
    assert!(first.status.success(), "{}", text(&first));
    assert!(text(&first).contains("12 deployed"), "{}", text(&first));
    assert!(site.join("shop/site.conf").exists());
    let second = run();
    assert!(second.status.success(), "{}", text(&second));
    assert!(text(&second).contains("no changes"), "{}", text(&second));
    // the cluster lives in the project (not moved), and is stopped with the run
    let pg = dir.join("data/deploy/pg/data");
    assert!(pg.join("PG_VERSION").is_file());
    assert!(!pg.join("postmaster.pid").exists(), "PostgreSQL still runs");
    assert!(!pwned.exists(), "a path was run by a shell");
}

#[test]
fn the_deploy_watchdog_stops_the_cluster_of_a_killed_run_in_a_hostile_path() {
    let (tmp, dir, pwned) = hostile_project();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("project.yml"), "name: slow\nmodulepath: libs\n").unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(
        dir.join("main.cf"),
        format!(
            "import exec\nhost = std::Host(name=\"localhost\", os=std::linux)\nexec::Run(host=host, command=\"sh -c 'touch {}/started; sleep 20'\")\n",
            out.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(steward_bin())
        .args(["deploy", "-p"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !out.join("started").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not start deploying"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid_file = dir.join("data/deploy/pg/data/postmaster.pid");
    assert!(pid_file.exists(), "PostgreSQL runs during the run");
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pid_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the watchdog did not stop PostgreSQL after the run was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!pwned.exists(), "a path was run by a shell");
}
