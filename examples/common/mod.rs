//! What the benchmarks share: a private PostgreSQL cluster with durable settings (as a real
//! server has), migrated, and a server on 127.0.0.1 serving a given state.

use std::path::Path;

use steward::store::cluster::PgCluster;

/// Start a cluster under `dir/pg` and connect to a migrated database in it.
pub async fn database(dir: &Path, connections: u32) -> (PgCluster, sqlx::PgPool) {
    let root = dir.join("pg");
    let cluster = tokio::task::spawn_blocking(move || {
        let c = PgCluster::new(&root).expect("cluster");
        c.start(true).expect("start PostgreSQL");
        c.ensure_database("bench").expect("database");
        c
    })
    .await
    .unwrap();
    let pool = steward::store::connect(&cluster.url("bench"), connections)
        .await
        .expect("connect");
    steward::store::migrate(&pool).await.expect("migrate");
    (cluster, pool)
}

/// Serve `state` on 127.0.0.1 (a free port); its base URL.
pub async fn serve(state: steward::server::AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // the server's own serving loop (as `steward server` runs it: TCP_NODELAY, timeouts)
    tokio::spawn(async move {
        let app = steward::server::router(state);
        let _ = steward::server::listen::serve(listener, app, std::future::pending()).await;
    });
    url
}
