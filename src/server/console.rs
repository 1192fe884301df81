//! The web console: server-rendered pages under `/console/` for watching and steering
//! environments from a browser. Every page and every button calls the same handler as the
//! REST API with the signed-in token's [`Caller`](super::auth::Caller), so the console can
//! neither see nor do more than that token can through the API.
//!
//! - Sign-in with an API token opens a session ([`session`]): an HttpOnly, SameSite=Strict
//!   cookie; every change is a POST form carrying the session's CSRF value.
//! - Pages are minijinja templates ([`render`]); the only script is our own small
//!   `console.js` (no inline script: the Content-Security-Policy forbids it), which follows
//!   server-sent events for live progress.
//! - Static assets are embedded in the binary.

mod envs;
mod git;
mod parameters;
mod previews;
mod render;
mod resources;
mod session;
mod versions;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::AppState;

pub use render::Page;
pub use session::Visitor;

/// The console's routes (mounted beside the API by [`super::router`]).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console/") }))
        .route("/console", get(|| async { Redirect::to("/console/") }))
        .route(
            "/console/sign-in",
            get(session::sign_in_page).post(session::sign_in),
        )
        .route("/console/sign-out", post(session::sign_out))
        .route("/console/static/{name}", get(static_asset))
        .merge(envs::routes())
        .merge(versions::routes())
        .merge(resources::routes())
        .merge(git::routes())
        .merge(parameters::routes())
        .merge(previews::routes())
        // the API's fallback answers JSON; a mistyped console address gets a page
        .route("/console/{*rest}", get(render::not_found))
        .layer(axum::middleware::from_fn(security_headers))
}

/// What every console answer carries: no script but our own file, no framing, no sniffing,
/// no referrer leaving the site, and pages not cached (they show live state and a CSRF value).
async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

/// The embedded static files, by name.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("console/static/console.css"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("console/static/console.js"),
    ),
];

async fn static_asset(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, kind, body)) => (
            [
                (header::CONTENT_TYPE, *kind),
                // the binary's version is in the URL the pages use, so a day's caching is safe
                (header::CACHE_CONTROL, "public, max-age=86400"),
            ],
            *body,
        )
            .into_response(),
        None => render::not_found().await.into_response(),
    }
}
