//! Who is calling, and may they? Bearer tokens scoped to one environment (or global admin)
//! with a role; see the permission table in [`allowed`].

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::model::Role;
use crate::store;

/// What an action needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Perm {
    /// read anything in the environment
    Read,
    /// upload versions, trigger compiles
    Upload,
    /// release, reject, roll back
    Release,
    /// report deploy results and action logs
    Report,
    /// settings, deletions, tokens, deploy/repair triggers, pause/halt of the environment
    Manage,
    /// projects and environments themselves, global tokens
    Global,
}

/// The permission table: role × permission.
pub fn allowed(role: Role, global: bool, perm: Perm) -> bool {
    match perm {
        Perm::Global => role == Role::Admin && global,
        Perm::Read => true,
        Perm::Upload => matches!(role, Role::Admin | Role::Compiler),
        Perm::Release => matches!(role, Role::Admin | Role::Approver),
        Perm::Report => matches!(role, Role::Admin | Role::Agent),
        Perm::Manage => role == Role::Admin,
    }
}

/// The only routes an agent token reaches: what `steward agent run` calls, and the writes of
/// facts (Steward's and Inmanta's routes). Everything an agent process needs (its work, the
/// handler code, where to report) comes through its sessions, which hand out only the agents
/// the token names; every other route (resource lists, attributes, action logs and the older
/// action report) is refused, so a token for `web1` can neither read nor report `db1`'s
/// resources. The fact routes refuse an agent token everything but writing facts of its
/// agents' resources (`server::api_facts`).
pub const AGENT_ROUTES: [&str; 10] = [
    "/api/v1/environments/{env}/agent-sessions",
    "/api/v1/environments/{env}/agent-sessions/{id}/poll",
    "/api/v1/environments/{env}/agent-sessions/{id}",
    "/api/v1/environments/{env}/code/{digest}",
    "/api/v1/environments/{env}/parameters",
    "/api/v1/environments/{env}/parameters/{name}",
    "/api/v1/environments/{env}/facts",
    "/api/v1/parameters",
    "/api/v1/parameter/{id}",
    "/api/v2/facts/{name}",
];

/// What a caller showed to be let in, kept so that an owner-only call forwarded to another
/// replica can carry it: the owner authenticates and authorizes it again, exactly as a direct
/// call, so the replicas' shared secret alone grants nothing (`server::owner`).
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Credential {
    /// an API token's secret (`Authorization: Bearer`)
    Bearer { secret: String },
    /// a console session's cookie
    Session { secret: String },
    /// a signed webhook: the headers and the body (hex) its signature covers
    Webhook {
        headers: Vec<(String, String)>,
        body: String,
    },
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::Bearer { .. } => "Bearer(…)",
            Credential::Session { .. } => "Session(…)",
            Credential::Webhook { .. } => "Webhook(…)",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Caller {
    pub token_id: Option<Uuid>,
    /// For the audit log.
    pub name: String,
    pub role: Role,
    /// None: global.
    pub environment: Option<Uuid>,
    /// An agent token's agents (None: any agent).
    pub agents: Option<Vec<String>>,
    /// What it showed (None: `--no-auth`).
    pub credential: Option<Credential>,
}

impl Caller {
    pub fn local() -> Caller {
        Caller {
            token_id: None,
            name: "local (--no-auth)".into(),
            role: Role::Admin,
            environment: None,
            agents: None,
            credential: None,
        }
    }

    /// The caller a token's secret authenticates as, with no route restriction (the owner of
    /// an environment checks a forwarded call with this).
    pub async fn of_token(state: &AppState, secret: &str) -> ApiResult<Caller> {
        let token = store::tokens::authenticate(&state.pool, secret)
            .await?
            .ok_or_else(|| ApiError::unauthorized("unknown or revoked token"))?;
        Ok(Caller {
            token_id: Some(token.id),
            name: token.name,
            role: token.role,
            environment: token.environment_id,
            agents: token.agents,
            credential: Some(Credential::Bearer {
                secret: secret.to_string(),
            }),
        })
    }

    /// A signed webhook for `env` (it may only hint the owner's fetcher to look).
    pub fn webhook(env: Uuid, headers: Vec<(String, String)>, body: &[u8]) -> Caller {
        Caller {
            token_id: None,
            name: "webhook".into(),
            role: Role::Viewer,
            environment: Some(env),
            agents: Some(Vec::new()),
            credential: Some(Credential::Webhook {
                headers,
                body: hex::encode(body),
            }),
        }
    }

    pub fn is_global(&self) -> bool {
        self.environment.is_none()
    }

    /// May this caller do `perm` in environment `env` (None: not environment-specific)?
    pub fn require(&self, perm: Perm, env: Option<Uuid>) -> ApiResult<()> {
        if let (Some(mine), Some(target)) = (self.environment, env)
            && mine != target
        {
            return Err(ApiError::forbidden(
                "this token belongs to another environment",
            ));
        }
        if self.environment.is_some() && env.is_none() && perm != Perm::Read {
            return Err(ApiError::forbidden("this needs a global admin token"));
        }
        if allowed(self.role, self.is_global(), perm) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "a {} token may not {}",
                self.role.as_str(),
                match perm {
                    Perm::Read => "read",
                    Perm::Upload => "upload versions",
                    Perm::Release => "release or reject versions",
                    Perm::Report => "report deploy results",
                    Perm::Manage => "manage this environment",
                    Perm::Global => "manage projects, environments or global tokens",
                }
            )))
        }
    }

    /// May this caller see environment `env` at all?
    pub fn sees(&self, env: Uuid) -> bool {
        self.environment.is_none_or(|e| e == env)
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        if state.no_auth {
            return Ok(Caller::local());
        }
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .ok_or_else(|| {
                ApiError::unauthorized("missing Authorization: Bearer <token> header")
            })?;
        let secret = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                ApiError::unauthorized("the Authorization header must be 'Bearer <token>'")
            })?;
        let caller = Caller::of_token(state, secret).await?;
        if caller.role == Role::Agent {
            let route = parts
                .extensions
                .get::<axum::extract::MatchedPath>()
                .map(|m| m.as_str());
            if !route.is_some_and(|r| AGENT_ROUTES.contains(&r)) {
                return Err(ApiError::forbidden(
                    "an agent token only hosts its agents (agent sessions and handler code); it reads and reports nothing else",
                ));
            }
        }
        Ok(caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        assert!(allowed(Role::Viewer, false, Perm::Read));
        assert!(!allowed(Role::Viewer, false, Perm::Upload));
        assert!(allowed(Role::Compiler, false, Perm::Upload));
        assert!(!allowed(Role::Compiler, false, Perm::Release));
        assert!(allowed(Role::Approver, false, Perm::Release));
        assert!(allowed(Role::Agent, false, Perm::Report));
        assert!(!allowed(Role::Admin, false, Perm::Global));
        assert!(allowed(Role::Admin, true, Perm::Global));
    }
}
