//! Test infrastructure: one private PostgreSQL cluster per test binary (stopped and removed
//! when the binary exits, however it exits), a fresh database per test, and servers on
//! 127.0.0.1:0 — in process, or as a real `steward server` child process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use steward::client::Client;
use steward::embedded::postgres::PgCluster;
use steward::server;

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

/// A server in this process on 127.0.0.1:0, with a migrated database of its own.
#[allow(dead_code)]
pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub db_url: String,
    pub pool: sqlx::PgPool,
    /// Secret of a global admin token (unless --no-auth).
    pub admin: Option<String>,
}

impl TestServer {
    pub async fn start(no_auth: bool) -> TestServer {
        let db_url = new_database();
        Self::start_on(db_url, no_auth).await
    }

    pub async fn start_on(db_url: String, no_auth: bool) -> TestServer {
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
        let state = server::start::app_state(pool.clone(), no_auth);
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
        }
    }

    pub fn client(&self, token: Option<&str>) -> Client {
        Client::new(&self.url, token.map(str::to_string))
    }

    pub fn admin_client(&self) -> Client {
        self.client(self.admin.as_deref())
    }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    }
}
