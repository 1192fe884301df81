//! API errors: every failure is `{"error": kind, "message": text}` with a fitting status.
//! Store errors map here once; internal errors are logged, not leaked.

use axum::Json;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;

/// The body of every error answer (documentation of [`ApiError`]'s JSON).
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What kind of error: `bad_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `conflict`, `base_moved` (a version sent as changes to a base that is no longer the
    /// newest), `fenced`, `invalid`, `too_large`, `unsupported_media_type`, `method_not_allowed`,
    /// `no_scheduler`, `no_git`, `unavailable`, `internal`, or from the git host
    /// `auth_failed` or `git_error`.
    pub error: String,
    /// For people.
    pub message: String,
    /// Compile diagnostics, for compile errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<serde_json::Value>,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    /// Compile diagnostics, for compile errors.
    pub diagnostics: Option<serde_json::Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            diagnostics: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound(what) => ApiError::not_found(format!("{what} not found")),
            StoreError::Conflict(m) => ApiError::conflict(m),
            StoreError::Fenced(m) => ApiError::new(StatusCode::CONFLICT, "fenced", m),
            StoreError::BaseMoved(m) => ApiError::new(StatusCode::CONFLICT, "base_moved", m),
            StoreError::Invalid(m) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m),
            StoreError::Unavailable(m) => {
                tracing::warn!(error = %m, "database unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the database is unavailable; try again shortly",
                )
            }
            StoreError::Database(m) => {
                tracing::error!(error = %m, "database error");
                ApiError::internal("internal error (logged on the server)")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({ "error": self.kind, "message": self.message });
        if let Some(d) = self.diagnostics {
            body["diagnostics"] = d;
        }
        let mut resp = (self.status, Json(body)).into_response();
        // a refusal for load says when to come back
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        resp
    }
}

/// Error answers that did not come from an [`ApiError`] (axum's own rejections: a body over
/// the limit, a query string that does not parse, a path segment that is not UTF-8) are plain
/// text; this gives them the JSON error body every client expects.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    // JSON already, or a console page (HTML for people)
    let is_json_or_page = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    if is_json_or_page {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    // rejection texts are a line; a larger body is not one of them, say only the status
    let text = axum::body::to_bytes(body, 4096)
        .await
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| {
            status
                .canonical_reason()
                .unwrap_or("request failed")
                .to_string()
        });
    let kind = match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "error",
    };
    // an axum rejection of 422 (JSON that does not fit the type) is a bad request here, as
    // in `ApiJson`
    let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
        StatusCode::BAD_REQUEST
    } else {
        status
    };
    let mut out = ApiError::new(status, kind, text).into_response();
    // keep what the client may need (Allow on a 405, Retry-After …), not the old body's type
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

pub type ApiResult<T> = Result<T, ApiError>;
