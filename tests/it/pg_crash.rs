//! Crashes of the private PostgreSQL (issue 28, defect 1): after a `kill -9` of the server and
//! of its postmaster (the OOM killer, a power cut), the next `steward server` on the same
//! data dir starts the first time and converges; a postmaster killed under a running server
//! is started again by it; a start that fails leaves no PostgreSQL behind; `steward deploy`
//! killed with its database is finished by the next run; a PostgreSQL started by hand on the
//! cluster is named at once, not waited for.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use steward::client::Client;

use crate::support::{free_port, null_export, output_text, steward_bin, wait_deployed};

/// A `steward server` of a test. When the test fails (panics) it is killed, and the
/// PostgreSQL its data dir names with it: a failing test otherwise left both running, with
/// the test process's file descriptors (a build lock among them). A test that passes stops
/// them itself and checks that nothing is left.
struct Server {
    child: Child,
    data: PathBuf,
}

impl std::ops::Deref for Server {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if let Some(pg) = postmaster(&self.data).filter(|p| alive(*p)) {
                kill9(pg);
            }
        }
    }
}

/// A `steward server` with its private cluster under `data` (not under /tmp: an operator's
/// data dir is not there), on `port`.
fn spawn(data: &Path, port: u16, admin: &str) -> Server {
    let child = Command::new(steward_bin())
        .args(["server", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data)
        .env_remove("STEWARD_DATABASE_URL")
        .env("STEWARD_EXECUTOR_USER", "server")
        .env("STEWARD_ADMIN_TOKEN", admin)
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(data.with_extension("log"))
                .unwrap(),
        )
        .spawn()
        .unwrap();
    Server {
        child,
        data: data.to_path_buf(),
    }
}

fn log_of(data: &Path) -> String {
    std::fs::read_to_string(data.with_extension("log")).unwrap_or_default()
}

/// The postmaster's pid from the cluster's pid file.
fn postmaster(data: &Path) -> Option<i32> {
    std::fs::read_to_string(data.join("pg/data/postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists
    let exists = unsafe { libc::kill(pid, 0) == 0 };
    exists
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
}

fn kill9(pid: i32) {
    // SAFETY: a signal to a process of this test
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Wait until /health says the database answers; fail with the server's log.
async fn healthy(c: &Client, child: &mut Child, data: &Path, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server exited ({status}):\n{}", log_of(data));
        }
        if let Ok(h) = c.health().await
            && h["database"] == "ok"
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not answer with its database within {secs} s:\n{}",
            log_of(data)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A data dir the postgres user can reach when the tests run as root.
fn data_dir() -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = base.path().join("data");
    (base, data)
}

/// Stop the server gracefully and check that it took its PostgreSQL along.
fn stop_and_check_nothing_left(child: &mut Child, data: &Path) {
    let pg = postmaster(data);
    // SAFETY: a signal to our own child
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(pid) = pg {
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL ({pid}) outlived the server that stopped"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_with_its_postgresql_starts_again_the_first_time_and_converges() {
    let (_base, data) = data_dir();
    let port = free_port();
    let admin = "stw_test_admin_pg_crash_both";
    let url = format!("http://127.0.0.1:{port}");
    let c = Client::new(&url, Some(admin.into()));
    let mut child = spawn(&data, port, admin);
    healthy(&c, &mut child, &data, 120).await;
    let env = c
        .create_environment("crash", "both", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&env, &null_export(20, None), json!({}))
        .await
        .unwrap();
    wait_deployed(&c, &env, 1, 60).await;

    for round in 0..3 {
        // both at once, as a power cut of the machine does: the pid file says `ready` and
        // the socket file stays
        let pg = postmaster(&data).expect("a running postmaster");
        kill9(child.id() as i32);
        kill9(pg);
        let _ = child.wait();
        assert!(data.join("pg/data/postmaster.pid").exists());
        // one start, and it must work
        child = spawn(&data, port, admin);
        healthy(&c, &mut child, &data, 120).await;
        let (active, rows) = c.resources(&env).await.unwrap();
        assert_eq!(active, Some(1 + round), "round {round}");
        assert_eq!(rows.len(), 20 + round as usize);
        // and it goes on: a new version deploys
        let v = c
            .upload(&env, &null_export(20 + round as usize + 1, None), json!({}))
            .await
            .unwrap()["number"]
            .as_i64()
            .unwrap() as i32;
        let progress = wait_deployed(&c, &env, v, 60).await;
        assert_eq!(progress["done"], true);
        assert_ne!(
            postmaster(&data),
            Some(pg),
            "the old postmaster is still named"
        );
    }
    assert!(
        !log_of(&data).contains("psql failed"),
        "a start failed:\n{}",
        log_of(&data)
    );
    stop_and_check_nothing_left(&mut child, &data);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postmaster_killed_under_a_running_server_is_started_again() {
    let (_base, data) = data_dir();
    let port = free_port();
    let admin = "stw_test_admin_pg_crash_pg_only";
    let c = Client::new(&format!("http://127.0.0.1:{port}"), Some(admin.into()));
    let mut child = spawn(&data, port, admin);
    healthy(&c, &mut child, &data, 120).await;
    let env = c
        .create_environment("crash", "pg-only", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&env, &null_export(5, None), json!({}))
        .await
        .unwrap();
    wait_deployed(&c, &env, 1, 60).await;
    for round in 0..2 {
        let pg = postmaster(&data).unwrap();
        kill9(pg);
        let killed = Instant::now();
        // the server notices, starts it again, and its pool reconnects
        let deadline = killed + Duration::from_secs(60);
        let v = loop {
            if let Ok(v) = c
                .upload(&env, &null_export(6 + round, None), json!({}))
                .await
            {
                break v["number"].as_i64().unwrap() as i32;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not get its database back:\n{}",
                log_of(&data)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!(
            "round {round}: an upload worked {:.1} s after the kill",
            killed.elapsed().as_secs_f64()
        );
        wait_deployed(&c, &env, v, 60).await;
        assert!(child.try_wait().unwrap().is_none(), "the server exited");
        let again = postmaster(&data).unwrap();
        assert!(again != pg && alive(again));
    }
    assert!(
        log_of(&data).contains("the private PostgreSQL runs again"),
        "{}",
        log_of(&data)
    );
    stop_and_check_nothing_left(&mut child, &data);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_that_fails_leaves_no_postgresql_running() {
    let (_base, data) = data_dir();
    // the port is taken: the server starts its cluster, then can not listen
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut child = spawn(&data, port, "stw_test_admin_pg_crash_fail");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the server did not give up");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success());
    assert!(
        log_of(&data).contains("can not listen"),
        "{}",
        log_of(&data)
    );
    // it had started its cluster (the pid file names the postmaster it ran)...
    assert!(data.join("pg/data/PG_VERSION").exists());
    // ...and stopped it again
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(pid) = postmaster(&data).filter(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL {pid} keeps running after the failed start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn steward_deploy_killed_with_its_postgresql_is_finished_by_the_next_run() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("project.yml"), "name: crash\nmodulepath: libs\n").unwrap();
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    let mut model =
        String::from("import exec\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
    for i in 0..6 {
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
    let run = || {
        Command::new(steward_bin())
            .args(["deploy", "-p"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let steps = || {
        std::fs::read_to_string(out.join("steps"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let mut child = run();
    let deadline = Instant::now() + Duration::from_secs(120);
    while steps() < 2 {
        assert!(Instant::now() < deadline, "the first run did not deploy");
        std::thread::sleep(Duration::from_millis(50));
    }
    let data = dir.join("data/deploy");
    let pg = postmaster(&data).expect("its postmaster");
    kill9(child.id() as i32);
    kill9(pg);
    let _ = child.wait();
    let again = Command::new(steward_bin())
        .args(["deploy", "-p"])
        .arg(dir)
        .output()
        .unwrap();
    let text = output_text(&again);
    assert!(again.status.success(), "the next run failed:\n{text}");
    let all = std::fs::read_to_string(out.join("steps")).unwrap();
    for i in 0..6 {
        assert!(
            all.lines().any(|l| l == i.to_string()),
            "step {i} missing: {all}"
        );
    }
}

/// The database is not up yet when the server starts (a boot where PostgreSQL comes later,
/// a restart after a crash that took both, a failover): the server waits for it, saying
/// so, instead of exiting, and serves once it is there.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_started_before_its_database_waits_for_it() {
    let (_base, data) = data_dir();
    let pg_root = data.with_extension("pg");
    let cluster = steward::store::cluster::PgCluster::new(&pg_root).unwrap();
    cluster.start(true).unwrap();
    cluster.ensure_database("steward").unwrap();
    let url = cluster.url("steward");
    cluster.stop().unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let port = free_port();
    let admin = "stw_test_admin_pg_crash_waits";
    let c = Client::new(&format!("http://127.0.0.1:{port}"), Some(admin.into()));
    let mut child = crate::support::AgentProc(
        Command::new(steward_bin())
            .args(["server", "--bind", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data)
            .env("STEWARD_DATABASE_URL", &url)
            .env("STEWARD_EXECUTOR_USER", "server")
            .env("STEWARD_ADMIN_TOKEN", admin)
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(data.with_extension("log"))
                    .unwrap(),
            )
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the server exited while its database was not up yet:\n{}",
        log_of(&data)
    );
    assert!(
        log_of(&data).contains("the database is not available yet; waiting for it"),
        "{}",
        log_of(&data)
    );
    let started = Instant::now();
    cluster.start(true).unwrap();
    healthy(&c, &mut child, &data, 60).await;
    eprintln!(
        "served {:.1} s after its database came up",
        started.elapsed().as_secs_f64()
    );
    let env = c
        .create_environment("late", "db", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&env, &null_export(3, None), json!({}))
        .await
        .unwrap();
    wait_deployed(&c, &env, 1, 60).await;
    // SAFETY: a signal to our own child
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    cluster.stop().unwrap();
}

/// The postmaster named by the pid file dies while the start waits for it to take
/// connections (it was killed together with its server a moment before the restart, as the
/// chaos run did: `psql failed … Connection refused`, exit status 2): the start notices it is
/// gone and starts one of its own.
#[test]
fn a_postmaster_that_dies_while_the_start_waits_for_it_is_started_again() {
    let (_base, data) = data_dir();
    let cluster = steward::store::cluster::PgCluster::new(&data.join("pg")).unwrap();
    cluster.start(true).unwrap();
    let data_dir = data.join("pg/data");
    // where the real one listened (port, socket directory): a dying one of ours says the same
    let real = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let listens: Vec<&str> = real.lines().skip(3).take(2).collect();
    let (port, sockets) = (listens[0].to_string(), listens[1].to_string());
    cluster.stop().unwrap();
    // a process working in the data dir, named ready by the pid file: what a postmaster
    // killed a moment ago looks like until it is gone
    let mut dying = Command::new("sleep")
        .arg("1.5")
        .current_dir(&data_dir)
        .spawn()
        .unwrap();
    let pid_file = format!(
        "{}\n{}\n0\n{port}\n{sockets}\n\n0 0\nready\n",
        dying.id(),
        data_dir.display()
    );
    std::fs::write(data_dir.join("postmaster.pid"), pid_file).unwrap();
    let reaper = std::thread::spawn(move || dying.wait());
    cluster
        .start(true)
        .expect("the start notices the postmaster is gone and starts one");
    let started = postmaster(&data).expect("a pid file");
    assert!(alive(started));
    reaper.join().unwrap().unwrap();
    assert!(cluster.is_running());
    cluster.stop().unwrap();
}

/// What a start makes of a pid file naming a live process in the data dir, by what it says
/// about where that postmaster listens: one of ours that is just starting (its socket line
/// still empty, no status yet) is waited for, never refused; one that is up and listens
/// elsewhere (another port, or no Unix socket) is refused at once.
#[test]
fn a_start_tells_a_postmaster_just_starting_from_one_listening_elsewhere() {
    let (_base, data) = data_dir();
    let cluster = steward::store::cluster::PgCluster::new(&data.join("pg")).unwrap();
    cluster.start(true).unwrap();
    let data_dir = data.join("pg/data");
    let real = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let lines: Vec<&str> = real.lines().collect();
    let (port, sockets) = (lines[3].to_string(), lines[4].to_string());
    cluster.stop().unwrap();
    let holder = |secs: &str| {
        Command::new("sleep")
            .arg(secs)
            .current_dir(&data_dir)
            .spawn()
            .unwrap()
    };
    let write_pid_file = |pid: u32, rest: &str| {
        let text = format!("{pid}\n{}\n0\n{rest}", data_dir.display());
        std::fs::write(data_dir.join("postmaster.pid"), text).unwrap();
    };

    // up, and listening where we can not reach it: refused at once, left running
    for (what, rest) in [
        ("another port", format!("54998\n{sockets}\n\n0 0\nready\n")),
        ("no Unix socket", format!("{port}\n\n\n0 0\nready\n")),
    ] {
        let mut other = holder("30");
        write_pid_file(other.id(), &rest);
        let started = Instant::now();
        let err = cluster
            .start(true)
            .expect_err(&format!("a start beside a postmaster with {what} worked"));
        assert!(
            started.elapsed() < Duration::from_secs(5)
                && err.to_string().contains("did not start")
                && err.to_string().contains(&format!("pid {}", other.id())),
            "{what}: after {:?}: {err}",
            started.elapsed()
        );
        assert!(
            other.try_wait().unwrap().is_none(),
            "{what}: the start stopped it"
        );
        other.kill().unwrap();
        other.wait().unwrap();
    }

    // one of ours in its first moments: our port, the socket line not written yet, no
    // status. Waited for (here it never takes connections and goes away), then ours starts
    let mut starting = holder("1.5");
    write_pid_file(starting.id(), &format!("{port}\n\n"));
    let reaper = std::thread::spawn(move || starting.wait());
    cluster
        .start(true)
        .expect("a postmaster just starting is waited for, not refused");
    reaper.join().unwrap().unwrap();
    assert!(cluster.is_running());
    cluster.stop().unwrap();
}

/// Someone started a PostgreSQL by hand on `steward deploy`'s cluster (to look inside it),
/// on another port and socket directory. The run can not connect to it and must not stop
/// it: it says so at once, naming the process, instead of waiting a minute in silence; once
/// that server is stopped, the next run works.
#[test]
fn steward_deploy_says_at_once_when_a_postgresql_it_did_not_start_holds_its_cluster() {
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().join("project");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("project.yml"), "name: held\nmodulepath: libs\n").unwrap();
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(
        dir.join("main.cf"),
        format!(
            "import exec\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             exec::Run(host=host, command=\"sh -c 'echo ran >> {}/steps'\")\n",
            out.display()
        ),
    )
    .unwrap();
    let deploy = || {
        let started = Instant::now();
        let o = Command::new(steward_bin())
            .args(["deploy", "-p"])
            .arg(&dir)
            .output()
            .unwrap();
        (o.status.success(), output_text(&o), started.elapsed())
    };
    let (ok, text, _) = deploy();
    assert!(ok, "the first run failed:\n{text}");
    let data = dir.join("data/deploy");
    let pid_file = data.join("pg/data/postmaster.pid");
    let deadline = Instant::now() + Duration::from_secs(15);
    while pid_file.exists() {
        assert!(
            Instant::now() < deadline,
            "the first run left its PostgreSQL running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // the operator's server: the cluster's own binaries, as the user that owns the cluster
    let Some(bin) = std::fs::read_dir("/usr/lib/postgresql").ok().and_then(|d| {
        let mut v: Vec<PathBuf> = d
            .filter_map(|e| e.ok().map(|e| e.path().join("bin/postgres")))
            .filter(|p| p.is_file())
            .collect();
        v.sort();
        v.pop()
    }) else {
        eprintln!("SKIPPED: no /usr/lib/postgresql/*/bin/postgres to start by hand");
        return;
    };
    let sockets = tmp.path().join("sockets");
    std::fs::create_dir(&sockets).unwrap();
    let cluster_data = data.join("pg/data").canonicalize().unwrap();
    let owner = {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&cluster_data).unwrap();
        (m.uid(), m.gid())
    };
    std::os::unix::fs::chown(&sockets, Some(owner.0), Some(owner.1)).unwrap();
    let mut by_hand = Command::new(bin);
    by_hand
        .arg("-D")
        .arg(&cluster_data)
        .args(["-p", "54999", "-c", "listen_addresses="])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", sockets.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: geteuid(2) has no preconditions
    if unsafe { libc::geteuid() } == 0 {
        by_hand.uid(owner.0).gid(owner.1);
    }
    struct Reaped(Child);
    impl Drop for Reaped {
        fn drop(&mut self) {
            // SAFETY: SIGINT (fast shutdown) to the postmaster this test started
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
            let _ = self.0.wait();
        }
    }
    let mut by_hand = Reaped(by_hand.spawn().unwrap());
    let pid = by_hand.0.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&pid_file)
        .is_ok_and(|t| t.lines().next() == Some(&pid.to_string()) && t.contains("ready"))
    {
        assert!(
            by_hand.0.try_wait().unwrap().is_none(),
            "the PostgreSQL started by hand exited"
        );
        assert!(
            Instant::now() < deadline,
            "the PostgreSQL started by hand is not ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let (ok, text, took) = deploy();
    assert!(
        !ok,
        "the run succeeded beside a PostgreSQL it can not reach:\n{text}"
    );
    assert!(
        took < Duration::from_secs(15),
        "the run took {took:?} to fail:\n{text}"
    );
    assert!(
        text.contains("did not start") && text.contains(&format!("pid {pid}")),
        "the error does not say which PostgreSQL holds the cluster:\n{text}"
    );
    eprintln!("the refusal, after {took:?}:\n{text}");
    assert!(
        by_hand.0.try_wait().unwrap().is_none() && alive(pid),
        "the run stopped a PostgreSQL it did not start"
    );

    drop(by_hand);
    let (ok, text, _) = deploy();
    assert!(
        ok,
        "the run after the hand-started server stopped failed:\n{text}"
    );
    let steps = std::fs::read_to_string(out.join("steps")).unwrap();
    assert!(steps.lines().count() >= 1, "{steps}");
}
