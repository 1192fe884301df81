//! Templates and answers: one minijinja environment with the templates embedded in the binary
//! (HTML auto-escaped), pages as [`Page`], errors as an error page with the API's message.

use std::sync::OnceLock;

use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use minijinja::{Environment, Value};

use crate::server::error::ApiError;

/// The shared templates, by name (each page module lists its own).
const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("sign_in.html", include_str!("templates/sign_in.html")),
    ("error.html", include_str!("templates/error.html")),
    ("confirm.html", include_str!("templates/confirm.html")),
];

/// Every template: the shared ones and each page module's.
fn all_templates() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    TEMPLATES
        .iter()
        .chain(super::envs::TEMPLATES)
        .chain(super::versions::TEMPLATES)
        .chain(super::resources::TEMPLATES)
        .chain(super::git::TEMPLATES)
        .chain(super::parameters::TEMPLATES)
        .chain(super::previews::TEMPLATES)
}

fn templates() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        // `.html` names are auto-escaped by minijinja's default callback
        for (name, source) in all_templates() {
            env.add_template(name, source)
                .unwrap_or_else(|e| panic!("console template {name}: {e}"));
        }
        env.add_global("version", env!("CARGO_PKG_VERSION"));
        env.add_filter("pct", |done: i64, total: i64| -> i64 {
            if total <= 0 { 100 } else { done * 100 / total }
        });
        env.add_filter("json", |v: Value| -> String {
            serde_json::to_string_pretty(&v).unwrap_or_default()
        });
        env.add_filter("urlencode_component", |s: String| -> String {
            url_component(&s)
        });
        env
    })
}

/// Anything serializable as a template value.
pub fn val<T: serde::Serialize>(v: T) -> Value {
    Value::from(minijinja::value::Serde(v))
}

/// Percent-encode a path segment or query value.
pub fn url_component(s: &str) -> String {
    crate::model::urls::encode_component(s)
}

/// A rendered page (or a rendering failure, which is logged and shown as a 500).
pub struct Page {
    status: StatusCode,
    body: Result<String, String>,
}

impl Page {
    pub fn render(template: &str, ctx: Value) -> Page {
        Page::with_status(StatusCode::OK, template, ctx)
    }

    pub fn with_status(status: StatusCode, template: &str, ctx: Value) -> Page {
        let body = templates()
            .get_template(template)
            .and_then(|t| t.render(ctx))
            .map_err(|e| {
                let mut text = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    text.push_str(&format!(": {s}"));
                    source = s.source();
                }
                text
            });
        Page { status, body }
    }

    /// An error page: the status and message the API would have answered.
    pub fn error(e: ApiError) -> Page {
        Page::with_status(
            e.status,
            "error.html",
            minijinja::context! {
                title => e.status.canonical_reason().unwrap_or("Error"),
                status => e.status.as_u16(),
                message => e.message,
            },
        )
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        match self.body {
            Ok(html) => (self.status, Html(html)).into_response(),
            Err(e) => {
                tracing::error!(error = %e, "rendering a console page failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    "<!doctype html><title>Error</title><p>This page could not be rendered; the server log says why.",
                )
                    .into_response()
            }
        }
    }
}

impl From<ApiError> for Page {
    fn from(e: ApiError) -> Page {
        Page::error(e)
    }
}

pub async fn not_found() -> Page {
    Page::error(ApiError::not_found("There is no such page in the console."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_parses() {
        let env = templates();
        for (name, _) in all_templates() {
            env.get_template(name).unwrap();
        }
    }

    #[test]
    fn html_is_escaped() {
        let p = Page::error(ApiError::bad_request("<script>alert(1)</script>"));
        let html = p.body.unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
    }

    #[test]
    fn url_components() {
        assert_eq!(
            url_component("fs::File[a,path=/x y]"),
            "fs%3A%3AFile%5Ba%2Cpath%3D%2Fx%20y%5D"
        );
    }
}
