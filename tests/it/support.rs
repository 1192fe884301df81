//! Test infrastructure: one private PostgreSQL cluster per test binary (stopped and removed
//! when the binary exits, however it exits), a fresh database per test, and servers on
//! 127.0.0.1:0 — in process, or as a real `steward server` child process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use steward::client::Client;
use steward::server;
use steward::store::cluster::PgCluster;

static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(1);

pub fn cluster() -> &'static PgCluster {
    CLUSTER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("steward-test-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = PgCluster::new(&dir).expect("cluster dir");
        c.start(false).expect("start test PostgreSQL");
        c.remove_when_process_exits(std::process::id())
            .expect("watchdog");
        c
    })
}

/// A directory of this test process's own (mode 0711: processes the tests run as other users
/// can pass through it), removed once the process has exited. Data dirs of servers go here:
/// work a server started (a git fetch in a blocking thread, an executor writing its code
/// dir's lock) may still write into one while the test's `TempDir` removes it, which then
/// fails half done; what is left goes with this directory.
#[allow(dead_code)]
pub fn scratch() -> &'static Path {
    static SCRATCH: OnceLock<PathBuf> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::Builder::new()
            .prefix(&format!("steward-it-{}-", std::process::id()))
            .tempdir()
            .unwrap()
            .keep();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
        remove_when_tests_exit(&dir);
        dir
    })
}

/// Removes `dir` once this test process has exited, however it exits (a `static` holding a
/// temporary directory is never dropped, and a killed run drops nothing).
#[allow(dead_code)]
pub fn remove_when_tests_exit(dir: &Path) {
    // a fixed script: the pid and the directory are positional parameters; the loop runs in
    // the background, so the shell waited for here ends at once and leaves no zombie
    const SCRIPT: &str = r#"(while kill -0 "$1" 2>/dev/null; do sleep 1; done; rm -rf -- "$2") &"#;
    let started = std::process::Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("steward-test-dir-watchdog")
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        started.success(),
        "the watchdog of {} did not start",
        dir.display()
    );
}

/// A new empty database; returns its URL.
pub fn new_database() -> String {
    let c = cluster();
    let name = format!(
        "t{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, Ordering::SeqCst)
    );
    c.ensure_database(&name).expect("create test database");
    c.url(&name)
}

/// A new database with the schema, through a pool of at most `connections`.
pub async fn migrated_pool(connections: u32) -> sqlx::PgPool {
    let pool = steward::store::connect(&new_database(), connections)
        .await
        .unwrap();
    steward::store::migrate(&pool).await.unwrap();
    pool
}

/// Environment `name` of project `project` (the project made if it is not there yet).
pub async fn environment_in(
    pool: &sqlx::PgPool,
    project: &str,
    name: &str,
    settings: &steward::model::settings::EnvSettings,
) -> uuid::Uuid {
    use steward::store::environments;
    let p = match environments::create_project(pool, project).await {
        Ok(p) => p.id,
        Err(_) => sqlx::query_scalar("SELECT id FROM projects WHERE name = $1")
            .bind(project)
            .fetch_one(pool)
            .await
            .unwrap(),
    };
    environments::create_environment(pool, p, name, settings)
        .await
        .unwrap()
}

/// A server in this process on 127.0.0.1:0, with a migrated database of its own.
#[allow(dead_code)]
pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub db_url: String,
    pub pool: sqlx::PgPool,
    /// Secret of a global admin token (unless --no-auth).
    pub admin: Option<String>,
    /// The git side, when the server deploys (to set what an operator sets by flags).
    pub sources: Option<steward::sources::GitSources>,
    /// The server's event channel (to watch what it tells the scheduler and the sources).
    pub notifier: steward::events::Notifier,
    /// The server's data dir (git mirrors).
    _data: tempfile::TempDir,
}

impl TestServer {
    /// Where `steward` commands run against this server keep what they cache
    /// (`XDG_CACHE_HOME`: the last-upload memories), gone with the server rather than left
    /// in the user's `~/.cache`.
    pub fn client_cache(&self) -> std::path::PathBuf {
        self._data.path().join("client-cache")
    }

    pub async fn start(no_auth: bool) -> TestServer {
        let db_url = new_database();
        Self::start_on(db_url, no_auth).await
    }

    /// A server that also deploys: schedulers with real `steward executor` processes.
    pub async fn start_deploying() -> TestServer {
        let db_url = new_database();
        Self::start_with(db_url, false, true).await
    }

    pub async fn start_on(db_url: String, no_auth: bool) -> TestServer {
        Self::start_with(db_url, no_auth, false).await
    }

    pub async fn start_with(db_url: String, no_auth: bool, deploying: bool) -> TestServer {
        // STEWARD_LOG=debug shows what the server did when a test fails
        if let Ok(filter) = std::env::var("STEWARD_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        // handlers of the in-process servers run as the test's own user, so that deploy tests
        // can write into the test's temp dirs; the isolation of executors (a uid per
        // environment) is tried against real `steward server` processes with the default
        // (tests/it/attacker/)
        steward::sandbox::configure(steward::sandbox::Config {
            executor_user: steward::sandbox::ExecutorUser::Server,
            ..Default::default()
        });
        let pool = steward::store::connect(&db_url, 8).await.expect("connect");
        steward::store::migrate(&pool).await.expect("migrate");
        let admin = if no_auth {
            None
        } else {
            let (_, secret) = steward::store::tokens::create(
                &pool,
                "test admin",
                steward::model::Role::Admin,
                None,
                "test",
                None,
            )
            .await
            .expect("admin token");
            Some(secret)
        };
        let data = tempfile::tempdir_in(scratch()).expect("server data dir");
        let mut state = if deploying {
            let mut s = server::start::app_state_with_schedulers(
                pool.clone(),
                no_auth,
                steward_bin(),
                data.path(),
            )
            .await;
            server::start::enable_git(&mut s, data.path().to_path_buf(), steward_bin()).await;
            s
        } else {
            server::start::app_state(pool.clone(), no_auth)
        };
        // the tests' repositories are local (file://)
        state.allow_local_git_sources = true;
        if let Some(g) = &state.sources {
            g.set_allow_local(true);
        }
        let sources = state.sources.clone();
        let notifier = state.notifier.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, server::router(state)).await;
        });
        TestServer {
            addr,
            url: format!("http://{addr}"),
            db_url,
            pool,
            admin,
            sources,
            notifier,
            _data: data,
        }
    }

    pub fn client(&self, token: Option<&str>) -> Client {
        Client::new(&self.url, token.map(str::to_string))
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &std::path::Path {
        self._data.path()
    }

    pub fn admin_client(&self) -> Client {
        self.client(self.admin.as_deref())
    }
}

/// `GET {url}/metrics` with `token`: the Prometheus text.
pub async fn metrics_text(url: &str, token: &str) -> String {
    reqwest::Client::new()
        .get(format!("{url}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A free TCP port on 127.0.0.1.
/// A port nothing listens on, for a server a test starts. Never the same twice in this
/// process, and below the kernel's ephemeral range (32768 up): a port `bind(0)` gave out and
/// released is handed out again by the kernel, so two servers starting at once could get the
/// same one, and one test's client then talk to another test's server.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    // test processes running at once start far apart
    let start = (std::process::id() % 500) * 24;
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(n < SPAN, "no free port left in {LOW}..{}", LOW + SPAN);
        let port = (LOW + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub fn steward_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_steward"))
}

/// Wait until `url`/health answers (a child server starting).
pub async fn wait_healthy(url: &str) {
    let c = Client::new(url, None);
    for _ in 0..200 {
        if c.health().await.is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("server at {url} did not become healthy");
}

/// A small export with `n` NullResources, resource `changed` (if any) with fail=true.
pub fn null_export(n: usize, changed: Option<usize>) -> steward::model::ExportFile {
    use steward::model::*;
    let resources = (0..n)
        .map(|i| {
            let id = ResourceId::new(
                "std::testing::NullResource",
                "internal",
                "name",
                &format!("r{i}"),
            );
            let mut attributes = serde_json::Map::new();
            attributes.insert("name".into(), format!("r{i}").into());
            attributes.insert("agentname".into(), "internal".into());
            attributes.insert("fail".into(), (Some(i) == changed).into());
            attributes.insert("purged".into(), false.into());
            Resource {
                id,
                type_name: "std::testing::NullResource".into(),
                agent: "internal".into(),
                attributes,
                requires: if i > 0 {
                    vec![ResourceId::new(
                        "std::testing::NullResource",
                        "internal",
                        "name",
                        "r0",
                    )]
                } else {
                    vec![]
                },
            }
        })
        .collect();
    ExportFile {
        format: EXPORT_FORMAT,
        resources,
        undefined: vec![],
        metadata: ExportMetadata {
            project: "test".into(),
            compiler: "test".into(),
            modules: Default::default(),
        },
        ..Default::default()
    }
}

/// An fs::File resource as the compiler exports it.
#[allow(dead_code)]
pub fn fs_file(
    agent: &str,
    path: &str,
    content: &str,
    requires: &[&str],
) -> steward::model::Resource {
    use steward::model::*;
    let attributes = serde_json::json!({
        "path": path, "owner": null, "group": null, "permissions": 644, "content": content,
        "purged": false, "purge_on_delete": false, "send_event": true, "receive_events": true,
    });
    Resource {
        id: ResourceId::new("fs::File", agent, "path", path),
        type_name: "fs::File".into(),
        agent: agent.into(),
        attributes: attributes.as_object().unwrap().clone(),
        requires: requires.iter().map(|r| ResourceId(r.to_string())).collect(),
    }
}

/// An exec::Run resource as the compiler exports it; `extra` overrides attributes.
#[allow(dead_code)]
pub fn exec_run(
    agent: &str,
    command: &str,
    extra: serde_json::Value,
    requires: &[&str],
) -> steward::model::Resource {
    use steward::model::*;
    let mut attributes = serde_json::json!({
        "command": command, "creates": "", "cwd": "", "environment": {}, "onlyif": "", "path": "",
        "reload": "", "reload_only": false, "returns": [0], "timeout": 300, "unless": "",
        "skip_on_fail": false, "purged": false, "purge_on_delete": false, "send_event": true,
        "receive_events": true,
    });
    for (k, v) in extra.as_object().unwrap() {
        attributes[k] = v.clone();
    }
    Resource {
        id: ResourceId::new("exec::Run", agent, "command", command),
        type_name: "exec::Run".into(),
        agent: agent.into(),
        attributes: attributes.as_object().unwrap().clone(),
        requires: requires.iter().map(|r| ResourceId(r.to_string())).collect(),
    }
}

/// An export of these resources.
#[allow(dead_code)]
pub fn export_of(resources: Vec<steward::model::Resource>) -> steward::model::ExportFile {
    use steward::model::*;
    ExportFile {
        format: EXPORT_FORMAT,
        resources,
        undefined: vec![],
        metadata: ExportMetadata {
            project: "test".into(),
            compiler: "test".into(),
            modules: Default::default(),
        },
        ..Default::default()
    }
}

/// Wait until the deploy of `version` is done (the progress endpoint says so); returns the
/// progress document. Panics with the last one after `secs`.
#[allow(dead_code)]
pub async fn wait_deployed(c: &Client, env: &str, version: i32, secs: u64) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let p = c.progress(env, version).await.expect("progress");
        if p["done"] == true {
            return p;
        }
        if std::time::Instant::now() > deadline {
            let (_, rows) = c.resources(env).await.unwrap();
            panic!("version {version} not deployed in {secs}s: {p}\n{rows:#?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Poll `check` every 50 ms until it returns Some, or panic after `secs` with `what`.
#[allow(dead_code)]
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if std::time::Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for: {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// [`eventually`], for a check that says what it saw each time it is not done yet: a
/// timeout then tells the last of it (where a pipeline stood), not only that it waited.
pub async fn eventually_or<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let seen = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if std::time::Instant::now() > deadline {
            panic!("timed out after {secs}s waiting for: {what}; last seen: {seen}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A real `steward server` child process on `port` (it deploys: schedulers and executors).
#[allow(dead_code)]
pub fn spawn_server(
    db_url: &str,
    port: u16,
    admin: &str,
    data: &std::path::Path,
) -> std::process::Child {
    spawn_server_with(db_url, port, admin, data, &[])
}

/// [`spawn_server`] with more flags (`--tls-cert …`).
#[allow(dead_code)]
pub fn spawn_server_with(
    db_url: &str,
    port: u16,
    admin: &str,
    data: &std::path::Path,
    extra: &[&std::ffi::OsStr],
) -> std::process::Child {
    std::process::Command::new(steward_bin())
        .args([
            "server",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            db_url,
        ])
        .arg("--data-dir")
        .arg(data)
        // the tests' repositories are local (file://)
        .arg("--allow-local-git-sources")
        // handlers write into the tests' temp dirs (the attacker tests start servers with the
        // default: a uid per environment)
        .env("STEWARD_EXECUTOR_USER", "server")
        .args(extra)
        .env("STEWARD_ADMIN_TOKEN", admin)
        .stdout(std::process::Stdio::null())
        // its log, for a failing test to show
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(data.join("server.log"))
                .expect("log file"),
        )
        .spawn()
        .expect("spawn steward server")
}

/// A real `steward server` child process with its own database, data dir and port, and an
/// admin client; killed when dropped. `restart` kills it with -9 and starts it again on
/// the same database, data dir and port.
#[allow(dead_code)]
/// `kill -9` of a process of the test's (an executor, say); it must have been there.
pub fn kill9(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -9 {pid}");
}

pub struct Spawned {
    pub child: std::process::Child,
    pub url: String,
    pub port: u16,
    pub db: String,
    pub admin: String,
    pub data: tempfile::TempDir,
    pub client: Client,
}

#[allow(dead_code)]
impl Spawned {
    pub async fn start(admin: &str) -> Spawned {
        let db = new_database();
        let data = tempfile::tempdir_in(scratch()).unwrap();
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let child = spawn_server(&db, port, admin, data.path());
        wait_healthy(&url).await;
        let client = Client::new(&url, Some(admin.into()));
        Spawned {
            child,
            url,
            port,
            db,
            admin: admin.into(),
            data,
            client,
        }
    }

    pub fn kill9(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    pub async fn restart(&mut self) {
        self.kill9();
        self.child = spawn_server(&self.db, self.port, &self.admin, self.data.path());
        wait_healthy(&self.url).await;
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copy a project directory (leaving out its data/).
#[allow(dead_code)]
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            if e.file_name() != "data" {
                copy_dir(&e.path(), &target);
            }
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A finished command's stdout and stderr together, as text.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run a command that must succeed; its stdout and stderr together (in the panic message
/// when it fails).
pub fn run_ok(command: &mut std::process::Command) -> String {
    let o = command.output().unwrap();
    let text = output_text(&o);
    assert!(o.status.success(), "{command:?} failed:\n{text}");
    text
}

/// A real `steward server` child started as an operator starts one (for the attacker tests):
/// its secrets in its environment (`STEWARD_ADMIN_TOKEN`, and `STEWARD_DATABASE_URL` unless
/// it runs its private PostgreSQL under the data dir), and the default sandbox — a uid of
/// each environment's own when it runs as root, never `STEWARD_EXECUTOR_USER=server`. Its log
/// goes to `log` (0600, outside the data dir); killed when dropped.
#[allow(dead_code)]
pub struct Operated {
    pub child: std::process::Child,
    pub url: String,
    pub port: u16,
    /// The database URL given in its environment (`None`: its private cluster).
    pub db: Option<String>,
    pub admin: String,
    pub data: tempfile::TempDir,
    _logs: tempfile::TempDir,
    pub log: PathBuf,
    pub client: Client,
    /// Run as an ordinary user: the directory holding its binary, home and data.
    pub base: Option<tempfile::TempDir>,
}

/// An ordinary account for a server that is not root ([`Operated::start_unprivileged`]).
#[derive(Clone, Copy, Debug)]
pub struct Account {
    pub uid: u32,
    pub gid: u32,
}

#[allow(dead_code)]
impl Operated {
    /// Start one on the test cluster's database `db` (or its private cluster with `None`),
    /// with more flags in `extra`.
    pub async fn start(admin: &str, db: Option<String>, extra: &[&str]) -> Operated {
        use std::os::unix::fs::OpenOptionsExt;
        // not under /tmp: an operator's data dir is not there, and sandboxed processes get
        // a /tmp of their own
        let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("server.log");
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = std::process::Command::new(steward_bin());
        cmd.args(["server", "--bind", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(data.path())
            .arg("--allow-local-git-sources")
            .args(extra)
            .env_remove("STEWARD_EXECUTOR_USER")
            .env("STEWARD_ADMIN_TOKEN", admin)
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(&log)
                    .expect("log file"),
            );
        match &db {
            Some(db) => cmd.env("STEWARD_DATABASE_URL", db),
            None => cmd.env_remove("STEWARD_DATABASE_URL"),
        };
        let child = cmd.spawn().expect("spawn steward server");
        let client = Client::new(&url, Some(admin.into()));
        let srv = Operated {
            child,
            url,
            port,
            db,
            admin: admin.into(),
            data,
            _logs: logs,
            log,
            client,
            base: None,
        };
        srv.healthy().await
    }

    /// Start one as the ordinary user `account` (the test must run as root), as an operator
    /// without root would: its binary, data directory (with its private PostgreSQL) and home
    /// (`<base>/home`, with `HOME` and the user's name set) its own, under
    /// `/var/lib/steward-tests`, which any user can reach. `{home}` in `extra` stands for
    /// that home.
    pub async fn start_unprivileged(admin: &str, account: Account, extra: &[&str]) -> Operated {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        use std::os::unix::process::CommandExt;
        // where an operator's service data is (not a temporary directory: those are
        // private to compiles anyway, which would hide what this must show)
        let parent = Path::new("/var/lib/steward-tests");
        std::fs::create_dir_all(parent).unwrap();
        let base = tempfile::Builder::new()
            .prefix("unprivileged-")
            .tempdir_in(parent)
            .unwrap();
        let open = std::fs::Permissions::from_mode(0o755);
        std::fs::set_permissions(base.path(), open.clone()).unwrap();
        let bin_dir = base.path().join("bin");
        std::fs::create_dir(&bin_dir).unwrap();
        std::fs::set_permissions(&bin_dir, open.clone()).unwrap();
        let bin = bin_dir.join("steward");
        std::fs::copy(steward_bin(), &bin).unwrap();
        std::fs::set_permissions(&bin, open).unwrap();
        let home = base.path().join("home");
        let data = tempfile::Builder::new()
            .prefix("data-")
            .tempdir_in(base.path())
            .unwrap();
        std::fs::create_dir(&home).unwrap();
        for d in [&home, &data.path().to_path_buf()] {
            std::os::unix::fs::chown(d, Some(account.uid), Some(account.gid)).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("server.log");
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let mut cmd = std::process::Command::new(&bin);
        cmd.args(["server", "--bind", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(data.path())
            .arg("--allow-local-git-sources")
            .args(
                extra
                    .iter()
                    .map(|a| a.replace("{home}", &home.display().to_string())),
            )
            .env_remove("STEWARD_EXECUTOR_USER")
            .env_remove("STEWARD_DATABASE_URL")
            .env("STEWARD_ADMIN_TOKEN", admin)
            .env("HOME", &home)
            .env("USER", "steward-operator")
            .env("LOGNAME", "steward-operator")
            .current_dir(&home)
            .uid(account.uid)
            .gid(account.gid)
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(&log)
                    .expect("log file"),
            );
        let child = cmd.spawn().expect("spawn steward server");
        let client = Client::new(&url, Some(admin.into()));
        let srv = Operated {
            child,
            url,
            port,
            db: None,
            admin: admin.into(),
            data,
            _logs: logs,
            log,
            client,
            base: Some(base),
        };
        srv.healthy().await
    }

    /// Wait until it answers (panics with its log if it does not within 30 s).
    async fn healthy(self) -> Operated {
        let srv = self;
        let c = Client::new(&srv.url, None);
        for _ in 0..600 {
            if c.health().await.is_ok() {
                return srv;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!(
            "server at {} did not become healthy: {}",
            srv.url,
            std::fs::read_to_string(&srv.log).unwrap_or_default()
        );
    }

    /// Its pid (the same after it re-executed itself without its secrets).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A client with a new token of `role` scoped to `env`.
    pub async fn scoped(&self, role: &str, env: &str) -> Client {
        let t = self
            .client
            .create_token(role, role, Some(env))
            .await
            .unwrap();
        Client::new(&self.url, Some(t["secret"].as_str().unwrap().into()))
    }
}

impl Drop for Operated {
    fn drop(&mut self) {
        // a failing test shows what the server said last (the harness prints a failing
        // test's output): a request that got no answer is otherwise a mystery
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(80)..];
            eprintln!(
                "--- the last {} lines of the server's log ({}):\n{}\n---",
                tail.len(),
                self.log.display(),
                tail.join("\n")
            );
        }
        // a server of its own user is asked to stop first: it then stops its private
        // PostgreSQL, which nobody else could (the test's root would leave it running)
        if self.base.is_some() {
            // SAFETY: a signal to our own child
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            for _ in 0..200 {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process (an agent, a server) that is killed when the test ends, also when it
/// fails (a leaked agent would keep its executors, and whatever file descriptors the test
/// process had, open).
pub struct AgentProc(pub std::process::Child);

impl std::ops::Deref for AgentProc {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for AgentProc {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small deterministic generator (xorshift), so a failing random sequence can be replayed.
#[allow(dead_code)]
pub struct Rng(pub u64);

#[allow(dead_code)]
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
