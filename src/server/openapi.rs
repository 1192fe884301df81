//! The OpenAPI 3 reference of the REST API, generated from the code: handlers carry
//! `#[utoipa::path]`, the types they take and answer derive `ToSchema`, and [`super::api`]
//! builds the router and the document from one list. Served at `GET /api/v1/openapi.json`.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{self, RefOr, ResponseBuilder};

use super::error::ErrorBody;

/// Tags group the operations in viewers.
pub const OPS: &str = "operations";
pub const ENVIRONMENTS: &str = "projects and environments";
pub const VERSIONS: &str = "versions";
pub const RESOURCES: &str = "resources";
pub const SOURCES: &str = "git sources";
pub const DEPLOY: &str = "deploy control";
pub const TOKENS: &str = "tokens and audit";
pub const AGENTS: &str = "agent processes";
pub const FACTS: &str = "parameters and facts";
pub const INMANTA: &str = "Inmanta-compatible";
pub const PREVIEWS: &str = "pull-request previews";

/// The name of the security scheme: `Authorization: Bearer <token>`.
pub const BEARER: &str = "bearer";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Steward REST API",
        description = "The REST API of `steward server`. Every endpoint under `/api/v1` except \
            this document and the webhook needs `Authorization: Bearer <token>`; what a token \
            may do depends on its role and on whether it is global or belongs to one \
            environment (see docs/api.md). Every error answers `{\"error\", \"message\"}` \
            (`ErrorBody`). An environment in a path is its id, its name when that is unique \
            among the environments the token sees, or `project/name` (URL-encoded)."
    ),
    components(schemas(ErrorBody)),
    security(("bearer" = [])),
    modifiers(&Bearer),
    tags(
        (name = OPS, description = "Health, metrics and this document: no token needed."),
        (name = ENVIRONMENTS, description = "Projects, environments and their settings."),
        (name = VERSIONS, description = "Versions of an environment's model: upload, inspect, diff, release, reject, roll back."),
        (name = RESOURCES, description = "Resources with their deploy state, and the action log."),
        (name = SOURCES, description = "Git sources: the repository an environment follows, compiles, webhooks, commit timelines."),
        (name = DEPLOY, description = "Deploy and repair triggers, dry-runs, agents, halt and resume, deploy progress."),
        (name = TOKENS, description = "API tokens and the audit log."),
        (name = AGENTS, description = "External agent processes (`steward agent run`): sessions, polls with results and work, handler code."),
        (name = FACTS, description = "Parameters (values of the environment) and facts (values handlers report about resources) that compiles read; a value that resolves an unknown of a version makes its model compile again."),
        (name = PREVIEWS, description = "What merging a pull request would change in an environment: compiled in isolation without secret values, diffed against the active version, never a version (nothing releases, approves or deploys a preview)."),
        (name = INMANTA, description = "Inmanta's routes for parameters and facts, as inmanta-core's client calls them: the environment in the `X-Inmanta-tid` header, Inmanta's answer shapes."),
    )
)]
struct Base;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, doc: &mut openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token's secret (`steward token create`; the first admin token \
                         is printed when the server starts, or given with --admin-token)",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document's top (info, security scheme, tags) before the routes add their paths.
pub fn base() -> openapi::OpenApi {
    let mut doc = Base::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// The finished document: every route of [`super::api`], tidied for clients.
pub fn build() -> openapi::OpenApi {
    let (_, mut doc) = super::api().split_for_parts();
    finish(&mut doc);
    doc
}

/// What the annotations leave to be said once for all operations.
fn finish(doc: &mut openapi::OpenApi) {
    // axum's catch-all `{*id}` is `{id}` in OpenAPI (the value may hold slashes)
    let paths = std::mem::take(&mut doc.paths.paths);
    for (path, item) in paths {
        doc.paths.paths.insert(path.replace("{*", "{"), item);
    }
    let error = || -> RefOr<openapi::Response> {
        ResponseBuilder::new()
            .description("An error: `{\"error\": kind, \"message\": text}`")
            .content(
                "application/json",
                openapi::ContentBuilder::new()
                    .schema(Some(openapi::Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
            .into()
    };
    for item in doc.paths.paths.values_mut() {
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            let public = op
                .security
                .as_ref()
                .is_some_and(|s| s.iter().all(|r| *r == Default::default()));
            if !public {
                for (code, what) in [
                    ("401", "No token, or an unknown or revoked one"),
                    ("403", "The token's role or environment does not allow this"),
                ] {
                    op.responses
                        .responses
                        .entry(code.to_string())
                        .or_insert_with(|| {
                            let RefOr::T(mut r) = error() else {
                                unreachable!()
                            };
                            r.description = what.to_string();
                            RefOr::T(r)
                        });
                }
            }
            // every status an operation does not list is an error with the error body
            // (400 bad input, 404, 409, 413 body over the limit, 422, 503 …)
            op.responses
                .responses
                .entry("default".to_string())
                .or_insert_with(error);
        }
    }
}

/// The document, as served (built once: it depends on the code only).
pub fn json() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| build().to_pretty_json().expect("the document serializes"))
}

/// This document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = OPS,
    security(()),
    responses((status = 200, description = "The OpenAPI document of this API", content_type = "application/json", body = Object))
)]
pub async fn document() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json()).into_response()
}

// ------------------------------------------------------------------- path parameters

/// A project in a path.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProjectPath {
    /// The project: its id or its name.
    pub project: String,
}

/// An environment in a path.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EnvPath {
    /// The environment: its id, `project/name`, or its name when that is unique among the
    /// environments the token sees.
    pub env: String,
}

/// A version of an environment.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct VersionPath {
    /// The environment: its id, `project/name`, or its name.
    pub env: String,
    /// The version number.
    #[param(minimum = 1)]
    pub number: i32,
}

/// Something of an environment with an id (a dry-run, a compile).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EnvIdPath {
    /// The environment: its id, `project/name`, or its name.
    pub env: String,
    pub id: uuid::Uuid,
}

/// A resource of an environment.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ResourcePath {
    /// The environment: its id, `project/name`, or its name.
    pub env: String,
    /// The resource id, `type[agent,attribute=value]` (it may hold slashes).
    pub id: String,
}

/// An agent of an environment.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AgentPath {
    /// The environment: its id, `project/name`, or its name.
    pub env: String,
    /// The agent's name.
    pub agent: String,
}

/// A commit of an environment's git source.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CommitPath {
    /// The environment: its id, `project/name`, or its name.
    pub env: String,
    /// A commit id or an unambiguous prefix of at least 4 hex digits.
    #[param(pattern = "^[0-9a-fA-F]{4,}$")]
    pub commit: String,
}

/// A token.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TokenPath {
    pub id: uuid::Uuid,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `{name}` in a path is a declared path parameter, and every operation answers
    /// errors with the error body.
    #[test]
    fn document_is_consistent() {
        let doc: serde_json::Value = serde_json::from_str(json()).unwrap();
        if std::env::var_os("STEWARD_PRINT_OPENAPI").is_some() {
            println!("{}", json());
        }
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let paths = doc["paths"].as_object().unwrap();
        assert!(paths.len() > 30);
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in paths {
            let names: Vec<&str> = path
                .split('{')
                .skip(1)
                .map(|p| p.split('}').next().unwrap())
                .collect();
            for (method, op) in item.as_object().unwrap() {
                let declared: Vec<&str> = op["parameters"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .filter(|p| p["in"] == "path")
                            .map(|p| p["name"].as_str().unwrap())
                            .collect()
                    })
                    .unwrap_or_default();
                assert_eq!(names, declared, "{method} {path}");
                let id = op["operationId"].as_str().unwrap();
                assert!(ids.insert(id.to_string()), "operationId {id} twice");
                assert!(
                    op["responses"]["default"].is_object(),
                    "{method} {path} has no error answer"
                );
            }
        }
    }
}
