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

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rej) => Err(rejected(rej.status(), rej.body_text())),
        }
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
