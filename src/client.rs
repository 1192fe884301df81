//! Typed REST client of the steward server, used by the CLI, the exporter and remote
//! executors. Every call returns the server's types; an API error keeps its kind and message.
//!
//! Over https the server's certificate is always verified: against the system's roots and,
//! with [`ClientOptions::ca_cert`], a private CA's certificate as well. There is no way to
//! turn verification off.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::model::ExportFile;
use crate::store::actions::ActionRecord;
use crate::store::environments::{Environment, Project};
use crate::store::facts::{Param, ParameterItem, WriteResult};
use crate::store::state::ResourceWithState;
use crate::store::tokens::Token;
use crate::store::versions::{StoredResource, VersionInfo};

mod changes;
mod fingerprint;
pub use changes::{Compared, LastUpload, PatchedUpload, Sent, memory_path};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("can not reach the server at {url}: {message}")]
    Connect { url: String, message: String },
    #[error("{message} ({kind}, HTTP {status})")]
    Api {
        status: u16,
        kind: String,
        message: String,
    },
    #[error("unexpected answer from the server: {0}")]
    Decode(String),
    #[error(
        "the TLS certificate of the server at {url} does not verify: {message}. If a private \
         CA signed it, give that CA's certificate (PEM) with --ca-cert, STEWARD_CA_CERT or \
         ca_cert in .steward.toml"
    )]
    Certificate { url: String, message: String },
    #[error("can not use the CA certificate file {}: {message}", path.display())]
    CaCert { path: PathBuf, message: String },
    #[error("can not set up the HTTP client: {0}")]
    Setup(String),
}

/// How a [`Client`] connects, beyond the URL and token.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// PEM file with one or more CA certificates to trust for https, in addition to the
    /// system's roots: the private CA that signed the server's certificate.
    pub ca_cert: Option<PathBuf>,
}

impl ClientError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// Percent-encode a path segment (resource ids contain `[`, `]`, `/`, `=` …).
pub fn encode_segment(s: &str) -> String {
    crate::model::urls::encode_component(s)
}

/// The certificates of a PEM file of CA certificates (at least one).
fn ca_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>> {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let fail = |message: String| ClientError::CaCert {
        path: path.to_path_buf(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if ders.is_empty() {
        return Err(fail(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        ));
    }
    ders.iter()
        .map(|d| reqwest::Certificate::from_der(d).map_err(|e| fail(e.to_string())))
        .collect()
}

/// The error of a request that got no answer: a certificate that does not verify gets its
/// own error (saying what to do), the rest says why the server could not be reached.
fn send_error(url: &str, e: &reqwest::Error) -> ClientError {
    use tokio_rustls::rustls;
    let mut messages: Vec<String> = Vec::new();
    let mut tls: Option<&rustls::Error> = None;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        // an io::Error shows its inner error but does not give it as its source: look inside
        // (rustls' error arrives wrapped in two of them)
        let mut inner = Some(err);
        while let Some(e) = inner {
            if let Some(t) = e.downcast_ref::<rustls::Error>() {
                tls = tls.or(Some(t));
            }
            inner = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|i| i as &(dyn std::error::Error + 'static));
        }
        let m = err.to_string();
        if !messages.iter().any(|seen| seen.contains(&m)) {
            messages.push(m);
        }
        cur = err.source();
    }
    match tls {
        Some(t @ rustls::Error::InvalidCertificate(_)) => ClientError::Certificate {
            url: url.to_string(),
            message: t.to_string(),
        },
        Some(t @ rustls::Error::InvalidMessage(_)) => ClientError::Connect {
            url: url.to_string(),
            message: format!("{t} (does the server speak plain HTTP? then use an http:// URL)"),
        },
        _ => ClientError::Connect {
            url: url.to_string(),
            message: messages.join(": "),
        },
    }
}

impl Client {
    /// A client of the server at `base` (http:// or https://, verified against the
    /// system's roots).
    pub fn new(base: &str, token: Option<String>) -> Client {
        Self::with_options(base, token, &ClientOptions::default())
            .expect("a client without options")
    }

    /// A client with options: a CA certificate to trust for https. Fails when the CA file
    /// can not be read or holds no certificate.
    pub fn with_options(
        base: &str,
        token: Option<String>,
        options: &ClientOptions,
    ) -> Result<Client> {
        let mut builder = Self::builder();
        if let Some(path) = &options.ca_cert {
            // added to the system's roots, not instead of them
            builder = builder.tls_certs_merge(ca_certificates(path)?);
        }
        let http = builder.build().map_err(|e| match &options.ca_cert {
            // the roots are checked when the client is built
            Some(path) => ClientError::CaCert {
                path: path.clone(),
                message: e.to_string(),
            },
            None => ClientError::Setup(e.to_string()),
        })?;
        Ok(Self::with_http(base, token, http))
    }

    /// The HTTP client's settings every client has.
    fn builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .connect_timeout(Duration::from_secs(10))
    }

    fn with_http(base: &str, token: Option<String>, http: reqwest::Client) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
        }
    }

    /// A client of a server on this machine over plain HTTP (`steward deploy`'s private
    /// one): it trusts no certificate at all, so the system's CA roots are not read (a few
    /// milliseconds on the way of every run), and a redirect to https would fail.
    pub fn loopback(base: &str, token: Option<String>) -> Client {
        let http = Self::builder()
            .tls_certs_only(std::iter::empty())
            .build()
            .expect("a client without certificates");
        Self::with_http(base, token, http)
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| send_error(&self.base, &e))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        if !status.is_success() {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            return Err(ClientError::Api {
                status: status.as_u16(),
                kind: v["error"].as_str().unwrap_or("error").to_string(),
                message: v["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).to_string()),
            });
        }
        let bytes = if bytes.is_empty() {
            b"null".as_slice().into()
        } else {
            bytes
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Decode(format!("{e}: {}", String::from_utf8_lossy(&bytes))))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(Method::GET, path, None::<&()>).await
    }

    fn env(env: &str) -> String {
        format!("/api/v1/environments/{}", encode_segment(env))
    }

    pub async fn health(&self) -> Result<serde_json::Value> {
        self.get("/health").await
    }

    /// The server replicas on the database and the environments each owns.
    pub async fn replicas(&self) -> Result<crate::store::replicas::Replicas> {
        self.get("/api/v1/replicas").await
    }

    // ---------------------------------------------------------------- projects, environments

    pub async fn projects(&self) -> Result<Vec<Project>> {
        self.get("/api/v1/projects").await
    }

    pub async fn create_environment(
        &self,
        project: &str,
        name: &str,
        settings: Option<serde_json::Value>,
    ) -> Result<Environment> {
        self.call(
            Method::POST,
            "/api/v1/environments",
            Some(&json!({"project": project, "name": name, "settings": settings, "create_project": true})),
        )
        .await
    }

    pub async fn environments(&self) -> Result<Vec<Environment>> {
        self.get("/api/v1/environments").await
    }

    pub async fn environment(&self, env: &str) -> Result<serde_json::Value> {
        self.get(&Self::env(env)).await
    }

    pub async fn delete_environment(&self, env: &str) -> Result<()> {
        self.call(Method::DELETE, &Self::env(env), None::<&()>)
            .await
    }

    pub async fn settings(&self, env: &str) -> Result<serde_json::Value> {
        self.get(&format!("{}/settings", Self::env(env))).await
    }

    pub async fn update_settings(
        &self,
        env: &str,
        patch: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        self.call(
            Method::PATCH,
            &format!("{}/settings", Self::env(env)),
            Some(patch),
        )
        .await
    }

    // ---------------------------------------------------------------- versions

    pub async fn upload(
        &self,
        env: &str,
        export: &ExportFile,
        provenance: serde_json::Value,
    ) -> Result<serde_json::Value> {
        let mut body =
            serde_json::to_value(export).map_err(|e| ClientError::Decode(e.to_string()))?;
        body["provenance"] = provenance;
        self.call(
            Method::POST,
            &format!("{}/versions", Self::env(env)),
            Some(&body),
        )
        .await
    }

    pub async fn versions(&self, env: &str) -> Result<Vec<serde_json::Value>> {
        self.get(&format!("{}/versions", Self::env(env))).await
    }

    pub async fn version(&self, env: &str, n: i32) -> Result<serde_json::Value> {
        self.get(&format!("{}/versions/{n}", Self::env(env))).await
    }

    pub async fn version_resources(&self, env: &str, n: i32) -> Result<Vec<StoredResource>> {
        self.get(&format!("{}/versions/{n}/resources", Self::env(env)))
            .await
    }

    pub async fn diff(&self, env: &str, from: i32, to: i32) -> Result<serde_json::Value> {
        self.get(&format!("{}/diff?from={from}&to={to}", Self::env(env)))
            .await
    }

    pub async fn release(&self, env: &str, n: i32, comment: &str) -> Result<VersionInfo> {
        self.call(
            Method::POST,
            &format!("{}/versions/{n}/release", Self::env(env)),
            Some(&json!({ "comment": comment })),
        )
        .await
    }

    pub async fn reject(&self, env: &str, n: i32, comment: &str) -> Result<VersionInfo> {
        self.call(
            Method::POST,
            &format!("{}/versions/{n}/reject", Self::env(env)),
            Some(&json!({ "comment": comment })),
        )
        .await
    }

    pub async fn rollback(&self, env: &str, n: i32, comment: &str) -> Result<VersionInfo> {
        self.call(
            Method::POST,
            &format!("{}/versions/{n}/rollback", Self::env(env)),
            Some(&json!({ "comment": comment })),
        )
        .await
    }

    /// Lift the hold a rollback put on automatic release.
    pub async fn resume_auto_release(&self, env: &str) -> Result<serde_json::Value> {
        self.call(
            Method::POST,
            &format!("{}/auto-release/resume", Self::env(env)),
            None::<&()>,
        )
        .await
    }

    pub async fn delete_version(&self, env: &str, n: i32) -> Result<()> {
        self.call(
            Method::DELETE,
            &format!("{}/versions/{n}", Self::env(env)),
            None::<&()>,
        )
        .await
    }

    // ---------------------------------------------------------------- resources

    pub async fn resources(&self, env: &str) -> Result<(Option<i32>, Vec<ResourceWithState>)> {
        let list: crate::store::state::ResourceList =
            self.get(&format!("{}/resources", Self::env(env))).await?;
        Ok((list.version, list.resources))
    }

    pub async fn resource(&self, env: &str, id: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/resources/{}",
            Self::env(env),
            encode_segment(id)
        ))
        .await
    }

    pub async fn actions(
        &self,
        env: &str,
        resource_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ActionRecord>> {
        let mut q = format!("{}/actions?limit={limit}", Self::env(env));
        if let Some(r) = resource_id {
            q.push_str(&format!("&resource_id={}", encode_segment(r)));
        }
        self.get(&q).await
    }

    pub async fn report_action(&self, env: &str, record: &ActionRecord) -> Result<()> {
        self.call(
            Method::POST,
            &format!("{}/actions", Self::env(env)),
            Some(record),
        )
        .await
    }

    // ---------------------------------------------------------------- parameters and facts

    /// `?resource_id=…` for a fact, nothing for a parameter.
    fn resource_query(resource_id: Option<&str>) -> String {
        match resource_id {
            Some(r) => format!("?resource_id={}", encode_segment(r)),
            None => String::new(),
        }
    }

    /// The parameters and facts of `env`: all (`None`), or one resource's facts (`Some("")`:
    /// the environment's parameters only). Facts older than `fact_expire` are marked
    /// `expired`.
    pub async fn list_parameters(
        &self,
        env: &str,
        resource_id: Option<&str>,
    ) -> Result<Vec<Param>> {
        self.get(&format!(
            "{}/parameters{}",
            Self::env(env),
            Self::resource_query(resource_id)
        ))
        .await
    }

    /// The facts of `env` (all, or one resource's), without its parameters.
    pub async fn list_facts(&self, env: &str, resource_id: Option<&str>) -> Result<Vec<Param>> {
        self.get(&format!(
            "{}/facts{}",
            Self::env(env),
            Self::resource_query(resource_id)
        ))
        .await
    }

    /// A parameter (`resource_id` None) or a fact; a 404 when there is none.
    pub async fn get_parameter(
        &self,
        env: &str,
        name: &str,
        resource_id: Option<&str>,
    ) -> Result<Param> {
        self.get(&format!(
            "{}/parameters/{}{}",
            Self::env(env),
            encode_segment(name),
            Self::resource_query(resource_id)
        ))
        .await
    }

    /// Set a parameter (`resource_id` None) or a fact. `body` is
    /// `{"value", "source"?, "metadata"?, "expires"?, "recompile"?}`; see
    /// the reference (`docs/api.md`).
    pub async fn set_parameter(
        &self,
        env: &str,
        name: &str,
        resource_id: Option<&str>,
        body: &serde_json::Value,
    ) -> Result<Param> {
        self.call(
            Method::PUT,
            &format!(
                "{}/parameters/{}{}",
                Self::env(env),
                encode_segment(name),
                Self::resource_query(resource_id)
            ),
            Some(body),
        )
        .await
    }

    /// Set several parameters and facts at once (at most 1000): what changed, and the
    /// versions whose unknowns they resolved.
    pub async fn set_parameters(
        &self,
        env: &str,
        parameters: &[ParameterItem],
        recompile: bool,
    ) -> Result<WriteResult> {
        self.call(
            Method::PUT,
            &format!("{}/parameters", Self::env(env)),
            Some(&json!({"parameters": parameters, "recompile": recompile})),
        )
        .await
    }

    pub async fn delete_parameter(
        &self,
        env: &str,
        name: &str,
        resource_id: Option<&str>,
    ) -> Result<()> {
        self.call(
            Method::DELETE,
            &format!(
                "{}/parameters/{}{}",
                Self::env(env),
                encode_segment(name),
                Self::resource_query(resource_id)
            ),
            None::<&()>,
        )
        .await
    }

    // ---------------------------------------------------------------- tokens

    pub async fn create_token(
        &self,
        name: &str,
        role: &str,
        env: Option<&str>,
    ) -> Result<serde_json::Value> {
        self.call(
            Method::POST,
            "/api/v1/tokens",
            Some(&json!({"name": name, "role": role, "environment": env})),
        )
        .await
    }

    /// An agent token of `env` that may host only `agents`.
    pub async fn create_agent_token(
        &self,
        name: &str,
        env: &str,
        agents: &[String],
    ) -> Result<serde_json::Value> {
        self.call(
            Method::POST,
            "/api/v1/tokens",
            Some(&json!({"name": name, "role": "agent", "environment": env, "agents": agents})),
        )
        .await
    }

    /// Tokens of `env`, or global ones, or (`all`) every token.
    pub async fn tokens(&self, env: Option<&str>, all: bool) -> Result<Vec<Token>> {
        match env {
            Some(e) => {
                self.get(&format!("/api/v1/tokens?environment={}", encode_segment(e)))
                    .await
            }
            None if all => self.get("/api/v1/tokens?all=true").await,
            None => self.get("/api/v1/tokens").await,
        }
    }

    pub async fn revoke_token(&self, id: &str) -> Result<()> {
        self.call(
            Method::DELETE,
            &format!("/api/v1/tokens/{}", encode_segment(id)),
            None::<&()>,
        )
        .await
    }

    // ---------------------------------------------------------------- deploy control

    /// A user deploy (`repair=false`) or repair, optionally of one agent or resource.
    pub async fn trigger(
        &self,
        env: &str,
        repair: bool,
        agent: Option<&str>,
        resource: Option<&str>,
    ) -> Result<serde_json::Value> {
        let what = if repair { "repair" } else { "deploy" };
        self.call(
            Method::POST,
            &format!("{}/{what}", Self::env(env)),
            Some(&json!({"agent": agent, "resource": resource})),
        )
        .await
    }

    pub async fn set_halted(&self, env: &str, halted: bool) -> Result<serde_json::Value> {
        let what = if halted { "halt" } else { "resume" };
        self.call(
            Method::POST,
            &format!("{}/{what}", Self::env(env)),
            None::<&()>,
        )
        .await
    }

    pub async fn agents(&self, env: &str) -> Result<serde_json::Value> {
        self.get(&format!("{}/agents", Self::env(env))).await
    }

    pub async fn set_paused(
        &self,
        env: &str,
        agent: &str,
        paused: bool,
    ) -> Result<serde_json::Value> {
        let what = if paused { "pause" } else { "unpause" };
        self.call(
            Method::POST,
            &format!("{}/agents/{}/{what}", Self::env(env), encode_segment(agent)),
            None::<&()>,
        )
        .await
    }

    /// Start a dry-run of `version` (default: the newest); answers its id.
    pub async fn start_dryrun(&self, env: &str, version: Option<i32>) -> Result<serde_json::Value> {
        self.call(
            Method::POST,
            &format!("{}/dryruns", Self::env(env)),
            Some(&json!({"version": version})),
        )
        .await
    }

    pub async fn dryruns(&self, env: &str) -> Result<serde_json::Value> {
        self.get(&format!("{}/dryruns", Self::env(env))).await
    }

    pub async fn dryrun(&self, env: &str, id: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/dryruns/{}",
            Self::env(env),
            encode_segment(id)
        ))
        .await
    }

    /// What deploying `version` changed so far, naming the first `limit` changed resources.
    pub async fn changes_made(
        &self,
        env: &str,
        version: i32,
        limit: i64,
    ) -> Result<crate::store::actions::ChangesMade> {
        self.get(&format!(
            "{}/versions/{version}/report?limit={limit}",
            Self::env(env)
        ))
        .await
    }

    /// The first `limit` resources of `version` whose status is `status`, by id, and how many
    /// have it.
    pub async fn resources_with_status(
        &self,
        env: &str,
        version: i32,
        status: &str,
        limit: i64,
    ) -> Result<(Vec<ResourceWithState>, i64)> {
        let list: crate::store::state::ResourceList = self
            .get(&format!(
                "{}/resources?version={version}&status={}&limit={limit}",
                Self::env(env),
                encode_segment(status)
            ))
            .await?;
        let total = list.total.unwrap_or(list.resources.len() as i64);
        Ok((list.resources, total))
    }

    pub async fn progress(&self, env: &str, version: i32) -> Result<serde_json::Value> {
        self.get(&format!("{}/versions/{version}/progress", Self::env(env)))
            .await
    }

    /// The progress once the version is done, or after `wait` (at most 30 s) if it is not.
    pub async fn progress_when_done(
        &self,
        env: &str,
        version: i32,
        wait: std::time::Duration,
    ) -> Result<serde_json::Value> {
        let held = self
            .get(&format!(
                "{}/versions/{version}/progress?wait_ms={}",
                Self::env(env),
                wait.as_millis()
            ))
            .await;
        match held {
            // the environment holds as many waits as the server allows: wait here instead
            // (the server asks for a second), then ask for the progress as it is
            Err(ClientError::Api { status: 429, .. }) => {
                tokio::time::sleep(wait.min(std::time::Duration::from_secs(1))).await;
                self.progress(env, version).await
            }
            other => other,
        }
    }

    // ---------------------------------------------------------------- git sources

    pub async fn set_source(
        &self,
        env: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        self.call(
            Method::PUT,
            &format!("{}/source", Self::env(env)),
            Some(body),
        )
        .await
    }

    /// Change only the given options of the source (attach it if there is none).
    pub async fn patch_source(
        &self,
        env: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        self.call(
            Method::PATCH,
            &format!("{}/source", Self::env(env)),
            Some(body),
        )
        .await
    }

    pub async fn source(&self, env: &str) -> Result<serde_json::Value> {
        self.get(&format!("{}/source", Self::env(env))).await
    }

    pub async fn delete_source(&self, env: &str) -> Result<()> {
        self.call(
            Method::DELETE,
            &format!("{}/source", Self::env(env)),
            None::<&()>,
        )
        .await
    }

    /// Fetch now and compile the branch tip or `commit`.
    pub async fn trigger_compile(
        &self,
        env: &str,
        commit: Option<&str>,
    ) -> Result<serde_json::Value> {
        self.call(
            Method::POST,
            &format!("{}/source/trigger", Self::env(env)),
            Some(&json!({"commit": commit})),
        )
        .await
    }

    pub async fn compiles(&self, env: &str, limit: i64) -> Result<serde_json::Value> {
        self.get(&format!("{}/compiles?limit={limit}", Self::env(env)))
            .await
    }

    /// Pull-request previews (`state`: open, closed or all).
    pub async fn previews(&self, env: &str, state: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/previews?state={}",
            Self::env(env),
            encode_segment(state)
        ))
        .await
    }

    /// A preview (its id, or `N` for pull request N) with its newest run and changes.
    pub async fn preview(&self, env: &str, id: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/previews/{}",
            Self::env(env),
            encode_segment(id)
        ))
        .await
    }

    /// Preview a ref by hand.
    pub async fn preview_run(
        &self,
        env: &str,
        reference: &str,
        number: Option<i32>,
    ) -> Result<serde_json::Value> {
        self.call(
            Method::POST,
            &format!("{}/previews", Self::env(env)),
            Some(&serde_json::json!({"ref": reference, "number": number})),
        )
        .await
    }

    pub async fn compile_report(&self, env: &str, id: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/compiles/{}",
            Self::env(env),
            encode_segment(id)
        ))
        .await
    }

    pub async fn commit_timeline(&self, env: &str, commit: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/commits/{}",
            Self::env(env),
            encode_segment(commit)
        ))
        .await
    }

    // ---------------------------------------------------------------- agent processes

    pub async fn agent_open(
        &self,
        env: &str,
        hello: &crate::scheduler::agents::Hello,
    ) -> Result<crate::scheduler::agents::PollReply> {
        self.call(
            Method::POST,
            &format!("{}/agent-sessions", Self::env(env)),
            Some(hello),
        )
        .await
    }

    pub async fn agent_poll(
        &self,
        env: &str,
        instance: uuid::Uuid,
        poll: &crate::scheduler::agents::Poll,
    ) -> Result<crate::scheduler::agents::PollReply> {
        self.call(
            Method::POST,
            &format!("{}/agent-sessions/{instance}/poll", Self::env(env)),
            Some(poll),
        )
        .await
    }

    pub async fn agent_close(&self, env: &str, instance: uuid::Uuid) -> Result<()> {
        self.call(
            Method::DELETE,
            &format!("{}/agent-sessions/{instance}", Self::env(env)),
            None::<&()>,
        )
        .await
    }

    /// Handler code by digest: the code and its files' contents (hex).
    pub async fn handler_code(&self, env: &str, digest: &str) -> Result<serde_json::Value> {
        self.get(&format!(
            "{}/code/{}",
            Self::env(env),
            encode_segment(digest)
        ))
        .await
    }
}
