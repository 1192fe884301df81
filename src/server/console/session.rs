//! Signing in and out, and who is looking: the session cookie, its CSRF value, and the
//! [`Visitor`] every page takes (the [`Caller`] the API handlers check, built from the
//! session's token).

use axum::extract::{Form, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::context;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::render::Page;
use crate::model::Role;
use crate::server::AppState;
use crate::server::auth::Caller;
use crate::server::error::ApiError;
use crate::store::{self, sessions};

/// The session cookie's name.
pub const COOKIE: &str = "steward_session";

/// The signed-in person behind a console request.
#[derive(Clone, Debug)]
pub struct Visitor {
    /// What the API handlers check.
    pub caller: Caller,
    /// The value every form of this session carries.
    pub csrf: String,
    /// The cookie's secret (to end the session).
    secret: String,
}

impl Visitor {
    /// Refuse a change that does not carry this session's CSRF value.
    pub fn check_csrf(&self, sent: Option<&str>) -> Result<(), Page> {
        let ok = sent.is_some_and(|s| bool::from(s.as_bytes().ct_eq(self.csrf.as_bytes())));
        if ok {
            Ok(())
        } else {
            Err(Page::error(ApiError::forbidden(
                "This form is stale or did not come from the console (its CSRF value is missing or wrong). Reload the page and try again.",
            )))
        }
    }

    /// Is the session still open (not signed out, expired, or its token revoked)? Long-lived
    /// answers (the event stream) ask this before each update.
    pub async fn still_signed_in(&self, pool: &sqlx::PgPool) -> bool {
        match pool.acquire().await {
            Ok(mut c) => matches!(sessions::find(&mut c, &self.secret).await, Ok(Some(_))),
            // the database away: the stream sends nothing new anyway
            Err(_) => true,
        }
    }

    /// What the templates know about the visitor.
    pub fn context(&self) -> minijinja::Value {
        context! {
            name => self.caller.name.clone(),
            role => self.caller.role.as_str(),
            global => self.caller.is_global(),
            csrf => self.csrf.clone(),
        }
    }
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl FromRequestParts<AppState> for Visitor {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Visitor, Response> {
        let session = match cookie(&parts.headers, COOKIE) {
            Some(secret) if !secret.is_empty() => {
                let mut c =
                    state.pool.acquire().await.map_err(|e| {
                        Page::error(store::StoreError::from(e).into()).into_response()
                    })?;
                sessions::find(&mut c, secret)
                    .await
                    .map_err(|e| Page::error(e.into()).into_response())?
                    .map(|s| (secret.to_string(), s))
            }
            _ => None,
        };
        let Some((secret, session)) = session else {
            // a page view goes to the sign-in page (and back after); a change is refused
            return Err(if parts.method == Method::GET {
                let back = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str())
                    .unwrap_or("/console/");
                Redirect::to(&format!(
                    "/console/sign-in?next={}",
                    super::render::url_component(back)
                ))
                .into_response()
            } else {
                Page::error(ApiError::unauthorized(
                    "Your session has ended: sign in again.",
                ))
                .into_response()
            });
        };
        let caller = match (&session.token, state.no_auth) {
            (Some(t), _) => Caller {
                token_id: Some(t.id),
                name: t.name.clone(),
                role: t.role,
                environment: t.environment_id,
                agents: t.agents.clone(),
                credential: Some(crate::server::auth::Credential::Session {
                    secret: secret.clone(),
                }),
            },
            (None, true) => Caller::local(),
            // a --no-auth session presented to a server that now checks tokens
            (None, false) => {
                return Err(Redirect::to("/console/sign-in").into_response());
            }
        };
        Ok(Visitor {
            caller,
            csrf: session.csrf,
            secret,
        })
    }
}

#[derive(Deserialize)]
pub struct SignInQuery {
    next: Option<String>,
}

/// Only paths of the console itself are followed after sign-in (no open redirect), and only
/// as visible ASCII (a path is percent-encoded): anything else could not be a `Location`
/// header and would fail the sign-in after its session was made.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/console/")
                && !n.starts_with("//")
                && !n.contains('\\')
                && n.len() <= 2048
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n.to_string()
        }
        _ => "/console/".into(),
    }
}

pub async fn sign_in_page(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<SignInQuery>,
) -> Page {
    sign_in_form(&state, q.next.as_deref(), None, StatusCode::OK)
}

fn sign_in_form(
    state: &AppState,
    next: Option<&str>,
    error: Option<&str>,
    status: StatusCode,
) -> Page {
    Page::with_status(
        status,
        "sign_in.html",
        context! {
            title => "Sign in",
            no_auth => state.no_auth,
            next => safe_next(next),
            error => error,
        },
    )
}

#[derive(Deserialize)]
pub struct SignInForm {
    #[serde(default)]
    token: String,
    next: Option<String>,
}

/// A form posted from another site carries its Origin; the console's own carry ours.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        // browsers send Origin on every POST; a client without one is not a browser
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((origin_host, host), (Some(o), Some(h)) if o == h)
}

pub async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(form): Form<SignInForm>,
) -> Response {
    if !same_origin(&headers) {
        return Page::error(ApiError::forbidden(
            "Sign-in must come from the console's own page.",
        ))
        .into_response();
    }
    let token = if state.no_auth {
        None
    } else {
        let secret = form.token.trim();
        if secret.is_empty() {
            return sign_in_form(
                &state,
                form.next.as_deref(),
                Some("Enter an API token."),
                StatusCode::BAD_REQUEST,
            )
            .into_response();
        }
        match store::tokens::authenticate(&state.pool, secret).await {
            Ok(Some(t)) if t.role == Role::Agent => {
                return sign_in_form(
                    &state,
                    form.next.as_deref(),
                    Some("Agent tokens are for agent processes; sign in with a viewer, approver, compiler or admin token."),
                    StatusCode::FORBIDDEN,
                )
                .into_response();
            }
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                tracing::info!("console sign-in refused: unknown or revoked token");
                return sign_in_form(
                    &state,
                    form.next.as_deref(),
                    Some("This token is unknown or revoked."),
                    StatusCode::UNAUTHORIZED,
                )
                .into_response();
            }
            Err(e) => return Page::error(e.into()).into_response(),
        }
    };
    let who = token
        .as_ref()
        .map(|t| t.name.clone())
        .unwrap_or_else(|| "local".into());
    let (secret, _) = match sessions::open(&state.pool, token).await {
        Ok(s) => s,
        Err(e) => return Page::error(e.into()).into_response(),
    };
    tracing::info!(token = %who, "console session opened");
    let mut resp = Redirect::to(&safe_next(form.next.as_deref())).into_response();
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{COOKIE}={secret}; Path=/; HttpOnly; SameSite=Strict{secure}"
    )) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

#[derive(Deserialize)]
pub struct CsrfForm {
    csrf: Option<String>,
}

pub async fn sign_out(
    State(state): State<AppState>,
    visitor: Visitor,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(p) = visitor.check_csrf(form.csrf.as_deref()) {
        return p.into_response();
    }
    if let Err(e) = sessions::close(&state.pool, &visitor.secret).await {
        return Page::error(e.into()).into_response();
    }
    let mut resp = Redirect::to("/console/sign-in").into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("steward_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_in_the_console() {
        assert_eq!(safe_next(Some("/console/env/x")), "/console/env/x");
        assert_eq!(safe_next(Some("https://evil.example/")), "/console/");
        assert_eq!(safe_next(Some("//evil.example/console/")), "/console/");
        assert_eq!(safe_next(Some("/console/\\evil")), "/console/");
        assert_eq!(safe_next(None), "/console/");
        assert_eq!(safe_next(Some("/console/env/x\n")), "/console/");
        assert_eq!(safe_next(Some("/console/\u{1}")), "/console/");
        assert_eq!(safe_next(Some("/console/é")), "/console/");
        assert_eq!(safe_next(Some("/console/a b")), "/console/");
    }

    #[test]
    fn cookies_are_found() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; steward_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn origins() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8888"));
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8888"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&h));
    }
}
