//! Request extraction with JSON errors: a body that is not the expected JSON, a number that
//! is not a number, an environment that does not exist — all answer `{"error","message"}`.

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, ApiResult};
use crate::store;
use crate::store::environments::Environment;

/// `Json<T>` whose rejections are API errors.
pub struct ApiJson<T>(pub T);

/// A body this large is parsed on a blocking thread: an export of 100,000 resources takes a
/// few hundred ms to parse, and on a runtime worker that would stall every other request
/// (of every environment) that worker serves.
const PARSE_INLINE_MAX: usize = 1 << 20;

impl<T: DeserializeOwned + Send + 'static> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        if !json_content_type(req.headers()) {
            return Err(rejected(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        // the body limit applies here (413)
        let body = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rej| rejected(rej.status(), rej.body_text()))?;
        let small = body.len() <= PARSE_INLINE_MAX;
        let parse = move || match axum::Json::<T>::from_bytes(&body) {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rej) => Err(rejected(rej.status(), rej.body_text())),
        };
        if small {
            return parse();
        }
        tokio::task::spawn_blocking(parse)
            .await
            .unwrap_or_else(|e| Err(ApiError::internal(format!("parsing the body failed: {e}"))))
    }
}

/// `application/json` or `application/…+json`, parameters aside (what `axum::Json` takes).
fn json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.split_once('/') {
        Some(("application", subtype)) => subtype == "json" || subtype.ends_with("+json"),
        _ => false,
    }
}

/// An axum body rejection as an API error: over the limit is `too_large` (413), JSON that
/// does not fit the type a bad request (400, not axum's 422).
fn rejected(status: StatusCode, text: String) -> ApiError {
    let kind = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "bad_request",
    };
    let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
        StatusCode::BAD_REQUEST
    } else {
        status
    };
    ApiError::new(status, kind, text)
}

pub fn parse_number(s: &str) -> ApiResult<i32> {
    s.parse::<i32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::bad_request(format!("'{s}' is not a version number")))
}

pub fn parse_uuid(what: &str, s: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(s).map_err(|_| ApiError::bad_request(format!("'{s}' is not a {what} id")))
}

/// Resolve an environment given by id or by name (`name` or `project/name`), as the caller
/// may see it. A token of another environment learns nothing about this one.
pub async fn environment(state: &AppState, caller: &Caller, key: &str) -> ApiResult<Environment> {
    let env = if let Ok(id) = Uuid::parse_str(key) {
        store::environments::get_environment(&state.pool, id).await?
    } else {
        let mut found = store::environments::find_environments(&state.pool, key).await?;
        found.retain(|e| caller.sees(e.id));
        match found.len() {
            0 => {
                return Err(ApiError::not_found(format!(
                    "environment '{key}' not found"
                )));
            }
            1 => found.remove(0),
            _ => {
                return Err(ApiError::conflict(format!(
                    "several projects have an environment named '{key}': use project/name or its id"
                )));
            }
        }
    };
    if !caller.sees(env.id) {
        return Err(ApiError::forbidden(
            "this token belongs to another environment",
        ));
    }
    Ok(env)
}

/// An optional JSON body: empty (or `null`) means `T::default()`.
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rej| rejected(rej.status(), rej.body_text()))?;
        // `null` too: the reference documents these bodies as optional, `T` or null
        if bytes.iter().all(|b| b.is_ascii_whitespace()) || bytes.trim_ascii() == b"null" {
            return Ok(OptionalJson(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(OptionalJson)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}
