//! `steward server`: the REST API over PostgreSQL (DESIGN.md §1, §3).
//!
//! Only this module imports axum. Handlers are thin: authenticate ([`auth::Caller`]), check the
//! permission, call the store, record mutations in the audit log, answer JSON. Errors are
//! `{"error","message"}` with a fitting status ([`error::ApiError`]). Parts of the server that
//! act on their own (the scheduler, git sources) are told about changes through
//! [`Notifier`] and re-read the database.

pub mod api_deploy;
pub mod api_envs;
pub mod api_resources;
pub mod api_sources;
pub mod api_tokens;
pub mod api_versions;
pub mod auth;
pub mod error;
pub mod extract;
pub mod ops;
pub mod start;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use sqlx::PgPool;
use tokio::sync::broadcast;
use uuid::Uuid;

/// Something changed in an environment: parts that act on their own re-read it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A version was released (or rolled back to).
    Released { environment: Uuid, version: i32 },
    /// Settings changed.
    Settings { environment: Uuid },
    /// The environment was deleted.
    Deleted { environment: Uuid },
    /// A user asked for a deploy or repair, or a pause/halt changed.
    Control { environment: Uuid },
}

#[derive(Clone)]
pub struct Notifier(pub broadcast::Sender<Event>);

impl Notifier {
    pub fn new() -> Notifier {
        Notifier(broadcast::channel(1024).0)
    }

    pub fn send(&self, e: Event) {
        // nobody listening is fine
        let _ = self.0.send(e);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.0.subscribe()
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier::new()
    }
}

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub no_auth: bool,
    pub metrics: Arc<ops::Metrics>,
    pub notifier: Notifier,
    /// The deploy schedulers; None when the server runs without them (`--no-scheduler`).
    pub schedulers: Option<crate::scheduler::Schedulers>,
    /// Git sources; None when the server does not deploy.
    pub sources: Option<crate::sources::GitSources>,
}

/// Largest accepted request body (a 10,000-resource export is a few MB).
pub const MAX_BODY: usize = 64 << 20;

pub fn router(state: AppState) -> Router {
    let env = "/api/v1/environments/{env}";
    let api = Router::new()
        .route(
            "/api/v1/projects",
            get(api_envs::list_projects).post(api_envs::create_project),
        )
        .route(
            "/api/v1/projects/{project}",
            get(api_envs::get_project)
                .patch(api_envs::rename_project)
                .delete(api_envs::delete_project),
        )
        .route(
            "/api/v1/environments",
            get(api_envs::list_environments).post(api_envs::create_environment),
        )
        .route(
            env,
            get(api_envs::get_environment)
                .patch(api_envs::rename_environment)
                .delete(api_envs::delete_environment),
        )
        .route(
            &format!("{env}/settings"),
            get(api_envs::get_settings).patch(api_envs::update_settings),
        )
        .route(
            &format!("{env}/versions"),
            get(api_versions::list).post(api_versions::upload),
        )
        .route(
            &format!("{env}/versions/{{number}}"),
            get(api_versions::get).delete(api_versions::delete),
        )
        .route(
            &format!("{env}/versions/{{number}}/resources"),
            get(api_versions::resources),
        )
        .route(
            &format!("{env}/versions/{{number}}/export"),
            get(api_versions::export),
        )
        .route(
            &format!("{env}/versions/{{number}}/diff"),
            get(api_versions::diff),
        )
        .route(
            &format!("{env}/versions/{{number}}/approvals"),
            get(api_versions::approvals),
        )
        .route(
            &format!("{env}/versions/{{number}}/release"),
            post(api_versions::release),
        )
        .route(
            &format!("{env}/versions/{{number}}/reject"),
            post(api_versions::reject),
        )
        .route(
            &format!("{env}/versions/{{number}}/rollback"),
            post(api_versions::rollback),
        )
        .route(&format!("{env}/diff"), get(api_versions::diff_between))
        .route(
            &format!("{env}/auto-release/resume"),
            post(api_versions::resume_auto_release),
        )
        .route(&format!("{env}/resources"), get(api_resources::list))
        .route(&format!("{env}/resources/{{*id}}"), get(api_resources::get))
        .route(
            &format!("{env}/actions"),
            get(api_resources::list_actions).post(api_resources::report_action),
        )
        .route(&format!("{env}/audit"), get(api_tokens::audit))
        .route(
            &format!("{env}/source"),
            get(api_sources::get_source)
                .put(api_sources::set_source)
                .patch(api_sources::patch_source)
                .delete(api_sources::delete_source),
        )
        .route(&format!("{env}/source/trigger"), post(api_sources::trigger))
        .route(
            &format!("{env}/source/webhook"),
            post(api_sources::webhook).layer(DefaultBodyLimit::max(
                crate::sources::webhook::MAX_WEBHOOK_BODY,
            )),
        )
        .route(&format!("{env}/compiles"), get(api_sources::list_compiles))
        .route(
            &format!("{env}/compiles/{{id}}"),
            get(api_sources::get_compile),
        )
        .route(
            &format!("{env}/commits/{{commit}}"),
            get(api_sources::timeline),
        )
        .route(&format!("{env}/deploy"), post(api_deploy::deploy))
        .route(&format!("{env}/repair"), post(api_deploy::repair))
        .route(&format!("{env}/halt"), post(api_deploy::halt))
        .route(&format!("{env}/resume"), post(api_deploy::resume))
        .route(
            &format!("{env}/dryruns"),
            get(api_deploy::list_dryruns).post(api_deploy::start_dryrun),
        )
        .route(
            &format!("{env}/dryruns/{{id}}"),
            get(api_deploy::get_dryrun),
        )
        .route(&format!("{env}/agents"), get(api_deploy::list_agents))
        .route(
            &format!("{env}/agents/{{agent}}/pause"),
            post(api_deploy::pause_agent),
        )
        .route(
            &format!("{env}/agents/{{agent}}/unpause"),
            post(api_deploy::unpause_agent),
        )
        .route(
            &format!("{env}/versions/{{number}}/progress"),
            get(api_deploy::progress),
        )
        .route(
            "/api/v1/tokens",
            get(api_tokens::list).post(api_tokens::create),
        )
        .route(
            "/api/v1/tokens/{id}",
            axum::routing::delete(api_tokens::revoke),
        )
        .route("/api/v1/audit", get(api_tokens::audit_all));
    Router::new()
        .route("/health", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .merge(api)
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ops::track,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// How the server is started (`steward server` flags).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub bind: SocketAddr,
    /// None: run a private PostgreSQL cluster under `data_dir/pg`.
    pub database_url: Option<String>,
    pub data_dir: PathBuf,
    pub no_auth: bool,
    /// Secret of the first admin token (else one is generated and printed once).
    pub admin_token: Option<String>,
    /// Deploy released versions (off: the server only stores and serves them).
    pub scheduler: bool,
    /// The program started as `steward executor` for handlers.
    pub executor_bin: PathBuf,
    /// Time between retention passes.
    pub prune_interval: std::time::Duration,
}
