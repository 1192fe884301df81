//! The private PostgreSQL (issue 12): another local user can not get in (the socket is out of
//! reach, and a login needs the generated password); a cluster of an older version (trust
//! authentication) is upgraded in place on start; no path reaches a shell.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use steward::store::cluster::PgCluster;

use crate::support::{cluster, new_database};

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions
    unsafe { libc::geteuid() == 0 }
}

fn text(o: &Output) -> String {
    crate::support::output_text(o)
}

/// `psql` on the cluster's socket, `as_user` (`None`: as ourselves), with `password` in its
/// environment if given; never prompts.
fn psql(socket_dir: &Path, as_user: Option<(&str, &str)>, password: Option<&str>) -> Output {
    let mut c = match as_user {
        Some((user, group)) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={user}"))
                .arg(format!("--regid={group}"))
                .args(["--clear-groups", "psql"]);
            c
        }
        None => Command::new("psql"),
    };
    c.args([
        "-X", "-w", "-A", "-t", "-U", "postgres", "-d", "postgres", "-h",
    ])
    .arg(socket_dir)
    .args(["-p", "5432", "-c", "SELECT count(*) FROM pg_database"])
    .current_dir("/")
    .env_remove("PGPASSWORD")
    .env_remove("PGPASSFILE")
    .env("HOME", "/nonexistent");
    if let Some(p) = password {
        c.env("PGPASSWORD", p);
    }
    c.output().expect("run psql")
}

fn password_of(url: &str) -> String {
    let rest = url
        .strip_prefix("postgres://postgres:")
        .expect("a password in the URL");
    rest[..rest.find('@').unwrap()].to_string()
}

async fn query_one(url: &str, sql: &'static str) -> String {
    let pool = steward::store::connect(url, 1)
        .await
        .expect("the server's own connection");
    let v: String = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
    pool.close().await;
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn another_local_user_can_not_get_into_the_private_postgres() {
    let db = new_database();
    let c = cluster();
    let sock = c.socket_dir();

    // the server's own connection works, and the cluster is configured as promised
    assert_eq!(
        query_one(&db, "SELECT current_setting('listen_addresses')").await,
        ""
    );
    assert_eq!(
        query_one(&db, "SELECT current_setting('unix_socket_permissions')").await,
        "0700"
    );
    assert_eq!(
        query_one(
            &db,
            "SELECT string_agg(DISTINCT type || ' ' || auth_method, ',') FROM pg_hba_file_rules"
        )
        .await,
        "local scram-sha-256"
    );
    assert_eq!(
        query_one(
            &db,
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'"
        )
        .await
        .split('$')
        .next()
        .unwrap(),
        "SCRAM-SHA-256"
    );

    // the secret: 0600, ours
    let m = std::fs::metadata(c.secret_file()).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    // SAFETY: geteuid(2) has no preconditions
    assert_eq!(m.uid(), unsafe { libc::geteuid() });
    // the socket directory and the cluster root: nobody else may enter
    assert_eq!(std::fs::metadata(&sock).unwrap().mode() & 0o777, 0o700);
    assert_eq!(
        std::fs::metadata(sock.parent().unwrap()).unwrap().mode() & 0o777,
        0o700
    );

    // even where the socket can be reached (here: as root, or as its owner), there is no
    // login without the password
    let no_password = psql(&sock, None, None);
    assert!(!no_password.status.success(), "{}", text(&no_password));
    assert!(
        text(&no_password).contains("no password supplied"),
        "{}",
        text(&no_password)
    );
    let wrong = psql(&sock, None, Some("guessed"));
    assert!(!wrong.status.success(), "{}", text(&wrong));
    assert!(
        text(&wrong).contains("password authentication failed"),
        "{}",
        text(&wrong)
    );
    let right = psql(&sock, None, Some(&password_of(&db)));
    assert!(right.status.success(), "{}", text(&right));

    if !is_root() {
        eprintln!("not root: the attack by another user (nobody) is not tried");
        return;
    }
    // the attack of the issue: another local user on the socket, without the password and
    // even with it, is refused before any login: the socket is out of its reach
    for password in [None, Some(password_of(&db))] {
        let attack = psql(&sock, Some(("nobody", "nogroup")), password.as_deref());
        assert!(!attack.status.success(), "{}", text(&attack));
        assert!(
            text(&attack).contains("Permission denied"),
            "{}",
            text(&attack)
        );
    }
}

/// As the postgres user when we are root.
fn as_cluster_user(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--clear-groups",
            program,
        ]);
        c
    } else {
        Command::new(program)
    }
}

fn chown_to_postgres(path: &Path) {
    if is_root() {
        let st = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trust_cluster_of_an_older_version_is_upgraded_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    // reachable by the postgres user: the cluster stays where it was made
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = tmp.path().join("pg");
    let data = root.join("data");
    let run = root.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    chown_to_postgres(&root);

    // what older versions made and ran: trust authentication, a socket anybody can use
    let init = as_cluster_user("initdb")
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", text(&init));
    let started = as_cluster_user("pg_ctl")
        .arg("start")
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(root.join("postgres.log"))
        .args(["-w", "-o"])
        .arg(format!(
            "-c listen_addresses='' -k {} -p 5432 -c fsync=off",
            run.display()
        ))
        .current_dir("/")
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", text(&started));
    let open = psql(&run, None, None);
    assert!(
        open.status.success(),
        "the old cluster lets anybody in: {}",
        text(&open)
    );
    if is_root() {
        // the attack of the issue, on what older versions made: it works
        let attack = psql(&run, Some(("nobody", "nogroup")), None);
        assert!(attack.status.success(), "{}", text(&attack));
    }

    // the new version starts it: upgraded in place, the data kept
    let r = root.clone();
    let c = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&r).unwrap();
        c.remove_when_process_exits(std::process::id()).unwrap();
        c.start(false).unwrap();
        c.ensure_database("kept").unwrap();
        c
    })
    .await
    .unwrap();
    let hba = std::fs::read_to_string(data.join("pg_hba.conf")).unwrap();
    assert!(
        hba.contains("local   all       all   scram-sha-256"),
        "{hba}"
    );
    assert!(!hba.contains("trust"), "{hba}");
    let refused = psql(&run, None, None);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        text(&refused).contains("no password supplied"),
        "{}",
        text(&refused)
    );
    assert_eq!(std::fs::metadata(&run).unwrap().mode() & 0o777, 0o700);
    if is_root() {
        // and now it is refused
        let attack = psql(&run, Some(("nobody", "nogroup")), None);
        assert!(!attack.status.success(), "{}", text(&attack));
        assert!(
            text(&attack).contains("Permission denied"),
            "{}",
            text(&attack)
        );
    }
    let url = c.url("kept");
    assert_eq!(
        query_one(&url, "SELECT current_database()::text").await,
        "kept"
    );
    let secret = std::fs::read_to_string(c.secret_file()).unwrap();

    // a restart (a new process, the same data dir) reuses the secret
    let r = root.clone();
    let again = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&r).unwrap();
        c.stop().unwrap();
        c.start(false).unwrap();
        c
    })
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(again.secret_file()).unwrap(),
        secret
    );
    assert_eq!(again.url("kept"), url);
    assert_eq!(
        query_one(&url, "SELECT current_database()::text").await,
        "kept"
    );
    tokio::task::spawn_blocking(move || again.stop().unwrap())
        .await
        .unwrap();
    drop(c);

    // a lost secret: the next start makes a new one and sets it; the old one is refused
    std::fs::remove_file(root.join("secret")).unwrap();
    let r = root.clone();
    let renewed = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&r).unwrap();
        c.start(false).unwrap();
        c
    })
    .await
    .unwrap();
    let new_url = renewed.url("kept");
    assert_ne!(new_url, url);
    assert_eq!(
        query_one(&new_url, "SELECT current_database()::text").await,
        "kept"
    );
    let old = psql(&run, None, Some(&password_of(&url)));
    assert!(
        text(&old).contains("password authentication failed"),
        "{}",
        text(&old)
    );
    // the password never went to the server's log
    let log = std::fs::read_to_string(root.join("postgres.log")).unwrap();
    assert!(!log.contains(&password_of(&url)) && !log.contains(&password_of(&new_url)));
    tokio::task::spawn_blocking(move || renewed.stop().unwrap())
        .await
        .unwrap();
}

/// A directory whose path a shell would misread: a space, a quote, and a command
/// substitution that would create `marker` if it ran.
pub fn hostile_dir(parent: &Path, marker: &Path) -> std::path::PathBuf {
    let dir = parent.join(format!("a b'c $(touch {})", marker.display()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A marker file name under /tmp that nothing else uses.
pub fn marker() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let p = std::env::temp_dir().join(format!(
        "pwned-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn a_test_cluster_watchdog_stops_and_removes_a_cluster_in_a_hostile_path() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pwned = marker();
    let root = hostile_dir(tmp.path(), &pwned).join("pg");
    let c = PgCluster::new(&root).unwrap();
    // not relocated: the cluster lives in the hostile path itself
    assert_eq!(c.data_dir(), root.canonicalize().unwrap().join("data"));
    c.start(false).unwrap();
    c.ensure_database("x").unwrap();
    assert!(c.is_running());
    let mut owner = Command::new("sleep").arg("600").spawn().unwrap();
    c.remove_when_process_exits(owner.id()).unwrap();
    owner.kill().unwrap();
    owner.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while root.exists() {
        assert!(
            Instant::now() < deadline,
            "the watchdog did not remove the cluster"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!c.is_running(), "the watchdog did not stop the cluster");
    assert!(!pwned.exists(), "a path was run by a shell");
}
