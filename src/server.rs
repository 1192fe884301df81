//! `steward server`: the REST API over PostgreSQL (DESIGN.md §1, §3).
//!
//! Only this module imports axum. Handlers are thin: authenticate ([`auth::Caller`]), check the
//! permission, call the store, record mutations in the audit log, answer JSON. Errors are
//! `{"error","message"}` with a fitting status ([`error::ApiError`]). Parts of the server that
//! act on their own (the scheduler, git sources) are told about changes through
//! [`Notifier`] and re-read the database.

pub mod api_agents;
pub mod api_deploy;
pub mod api_envs;
pub mod api_facts;
pub mod api_inmanta;
pub mod api_previews;
pub mod api_resources;
pub mod api_sources;
pub mod api_tokens;
pub mod api_versions;
pub mod auth;
pub mod caches;
pub mod console;
pub mod error;
pub mod extract;
pub mod listen;
pub mod openapi;
pub mod ops;
pub mod owner;
pub mod start;
pub mod tls;
pub mod waits;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

// the event vocabulary lives below the server, the scheduler and the sources
pub use crate::events::{Event, Notifier};

#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub no_auth: bool,
    pub metrics: Arc<ops::Metrics>,
    pub notifier: Notifier,
    /// Environments changed, as PostgreSQL notifies them (for pages that follow them live).
    pub changes: crate::store::changes::Changes,
    /// The resources table's counts, kept while an environment does not change.
    pub facets: crate::store::state::FacetCache,
    /// The console's session cookie is marked `Secure` (the server speaks TLS).
    pub secure_cookies: bool,
    /// The deploy schedulers; None when the server runs without them (`--no-scheduler`).
    pub schedulers: Option<crate::scheduler::Schedulers>,
    /// Git sources; None when the server does not deploy.
    pub sources: Option<crate::sources::GitSources>,
    /// This server as one of several replicas on the database; None: it owns everything.
    pub replica: Option<crate::replicas::Replica>,
    /// For calls to other replicas: made at the first call ([`AppState::replica_http`]),
    /// since reading the system's CA roots costs milliseconds a server without replicas
    /// (`steward deploy`'s, on the way of every run) would spend for nothing.
    pub http: Arc<std::sync::OnceLock<reqwest::Client>>,
    /// Git sources may be local repositories (`file://`, an absolute path): off unless the
    /// operator starts the server with `--allow-local-git-sources`, since such a source
    /// reads the server's own disk (other environments' mirrors, any repository it can open).
    pub allow_local_git_sources: bool,
    /// Requests held open (`…/progress?wait_ms=`), bounded per environment.
    pub waits: waits::Waits,
}

impl AppState {
    /// The client for calls to other replicas, made at the first.
    pub fn replica_http(&self) -> &reqwest::Client {
        self.http.get_or_init(|| {
            reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(330))
                .build()
                .unwrap_or_default()
        })
    }
}

/// Largest accepted request body of most routes: settings, names, decisions, tokens.
pub const MAX_BODY: usize = 1 << 20;
/// Largest upload of a version (a 10,000-resource export is a few MB). Only the upload route
/// takes this much, and only from a caller allowed to upload (checked before it is read).
pub const UPLOAD_BODY: usize = 64 << 20;
/// Largest action report (an action's log lines).
pub const ACTION_BODY: usize = 8 << 20;

/// The API: every route with its OpenAPI description. The router and the document are built
/// from this one list ([`utoipa_axum::routes!`] takes a handler's path and method from its
/// `#[utoipa::path]`), so the reference cannot miss a route: add routes here, never with a
/// plain `.route()`.
pub fn api() -> OpenApiRouter<AppState> {
    use api_agents as a;
    use api_deploy as d;
    use api_envs as e;
    use api_facts as f;
    use api_inmanta as i;
    use api_resources as r;
    use api_sources as s;
    use api_tokens as t;
    use api_versions as v;
    // a webhook is signed JSON from a git host: a smaller body limit than uploads
    let webhook = OpenApiRouter::new()
        .routes(routes!(s::webhook))
        .layer(DefaultBodyLimit::max(
            crate::sources::webhook::MAX_WEBHOOK_BODY,
        ));
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(ops::health))
        .routes(routes!(ops::metrics))
        .routes(routes!(openapi::document))
        .routes(routes!(e::list_projects, e::create_project))
        .routes(routes!(
            e::get_project,
            e::rename_project,
            e::delete_project
        ))
        .routes(routes!(e::list_environments, e::create_environment))
        .routes(routes!(
            e::get_environment,
            e::rename_environment,
            e::delete_environment
        ))
        .routes(routes!(e::get_settings, e::update_settings))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(v::list, v::upload))
                .layer(DefaultBodyLimit::max(UPLOAD_BODY)),
        )
        .routes(routes!(v::get, v::delete))
        .routes(routes!(v::resources))
        .routes(routes!(v::export))
        .routes(routes!(v::diff))
        .routes(routes!(v::approvals))
        .routes(routes!(v::release))
        .routes(routes!(v::reject))
        .routes(routes!(v::rollback))
        .routes(routes!(v::diff_between))
        .routes(routes!(v::resume_auto_release))
        .routes(routes!(r::list))
        .routes(routes!(r::get))
        .merge(
            OpenApiRouter::new()
                .routes(routes!(r::list_actions, r::report_action))
                .layer(DefaultBodyLimit::max(ACTION_BODY)),
        )
        .routes(routes!(t::audit))
        .routes(routes!(
            s::get_source,
            s::set_source,
            s::patch_source,
            s::delete_source
        ))
        .routes(routes!(s::trigger))
        .merge(webhook)
        .routes(routes!(s::list_compiles))
        .routes(routes!(s::get_compile))
        .routes(routes!(api_previews::list, api_previews::run))
        .routes(routes!(api_previews::get))
        .routes(routes!(s::timeline))
        .routes(routes!(d::deploy))
        .routes(routes!(d::repair))
        .routes(routes!(d::halt))
        .routes(routes!(d::resume))
        .routes(routes!(d::list_dryruns, d::start_dryrun))
        .routes(routes!(d::get_dryrun))
        .routes(routes!(d::list_agents))
        .routes(routes!(a::open))
        .merge(
            // a poll carries the results of finished actions, log lines included
            OpenApiRouter::new()
                .routes(routes!(a::poll))
                .layer(DefaultBodyLimit::max(ACTION_BODY)),
        )
        .routes(routes!(a::close))
        .routes(routes!(a::code))
        .routes(routes!(d::pause_agent))
        .routes(routes!(d::unpause_agent))
        .routes(routes!(d::progress))
        .routes(routes!(d::report))
        .routes(routes!(t::list, t::create))
        .routes(routes!(t::revoke))
        .routes(routes!(t::audit_all))
        .routes(routes!(f::list_parameters, f::set_parameters))
        .routes(routes!(
            f::get_parameter,
            f::set_parameter,
            f::delete_parameter
        ))
        .routes(routes!(f::list_facts))
        .routes(routes!(i::set_parameters))
        .routes(routes!(i::get_param, i::set_param, i::delete_param))
        .routes(routes!(i::list_params))
        .routes(routes!(i::set_fact))
        .routes(routes!(i::set_parameter))
        .routes(routes!(i::get_facts))
        .routes(routes!(i::get_fact))
        .routes(routes!(ops::replicas))
        .routes(routes!(owner::owner_call))
}

pub fn router(state: AppState) -> Router {
    router_of(routes(), state)
}

/// Every route, without the state: most of the cost of [`router`] (the API's routes and
/// their OpenAPI description, 4-6 ms), so a server that starts may make it on another thread
/// while its database starts (`steward deploy`).
pub fn routes() -> Router<AppState> {
    let (api, _) = api().split_for_parts();
    api.merge(console::router())
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        // inside `track`, so the metrics count the status the client gets
        .layer(axum::middleware::from_fn(error::json_errors))
}

/// The server of [`routes`] with `state`: [`router`] in two steps.
pub fn router_of(routes: Router<AppState>, state: AppState) -> Router {
    routes
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
    /// How long unused Python environments stay and how much they may take.
    pub python_envs: caches::CachePolicy,
    /// Serve HTTPS with this certificate and key (None: plain HTTP).
    pub tls: Option<tls::TlsFiles>,
    /// Where the other replicas reach this one (None: from the bound address).
    pub advertise_url: Option<String>,
    /// Send the replica secret over plain http:// to replicas advertised at addresses that
    /// are not loopback ones.
    pub allow_plain_http_replica_links: bool,
    /// Accept git sources on the server's own disk (`file://`, absolute paths).
    pub allow_local_git_sources: bool,
    /// Where pip finds the packages commits' requirements name.
    pub pip_sources: crate::sources::compile::PipSources,
    /// Replicas: time between heartbeats, and how long a lease lasts without one.
    pub heartbeat: std::time::Duration,
    pub lease_time: std::time::Duration,
}
