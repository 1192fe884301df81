//! Operations: `/health`, `/metrics` (Prometheus text), request accounting, 404s.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::store;
pub use crate::store::replicas::{ReplicaView, Replicas};

#[derive(Default)]
pub struct Metrics {
    /// (method, status) -> count
    requests: Mutex<BTreeMap<(String, u16), u64>>,
}

impl Metrics {
    fn count(&self, method: &str, status: u16) {
        // labels from a closed set: a client sending made-up methods must not grow the map
        let method = match method {
            "GET" | "POST" | "PUT" | "PATCH" | "DELETE" | "HEAD" | "OPTIONS" => method,
            _ => "OTHER",
        };
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((method.to_string(), status)).or_default() += 1;
    }
}

/// Environments with series of their own in `/metrics`, at most: the label set stays
/// bounded on a server with very many environments (the rest have none).
pub const METRICS_ENVIRONMENTS: usize = 100;

/// How long a scrape waits for the schedulers' counts of stored states before the database
/// counts instead (a scrape should answer well within Prometheus' default 10 s timeout).
const METRICS_COUNTS_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Count every request by method and status.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().as_str().to_string();
    let resp = next.run(req).await;
    state.metrics.count(&method, resp.status().as_u16());
    resp
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this endpoint does not accept that method",
    )
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint (the API lives under /api/v1)")
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` when the database does not answer
    pub status: String,
    /// `ok` or `unavailable`
    pub database: String,
}

/// Liveness and database reachability.
#[utoipa::path(
    get,
    path = "/health",
    tag = super::openapi::OPS,
    security(()),
    responses(
        (status = 200, description = "The server and its database answer", body = Health),
        (status = 503, description = "The database does not answer", body = Health),
    )
)]
pub async fn health(State(state): State<AppState>) -> Response {
    let up = store::ping(&state.pool).await;
    let mut body = if up {
        json!({"status": "ok", "database": "ok"})
    } else {
        json!({"status": "degraded", "database": "unavailable"})
    };
    if let Some(r) = &state.replica {
        let live = if up {
            store::replicas::live(&state.pool, r.config().lease_ttl.as_millis() as i64)
                .await
                .map(|l| l.len())
                .ok()
        } else {
            None
        };
        body["replica"] = json!({
            "id": r.id(),
            "advertise_url": r.config().advertise_url,
            "environments_owned": r.owned().len(),
            "live_replicas": live,
            "stopping": r.is_stopping(),
        });
    }
    let status = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The server replicas sharing this database, the environments each owns with their lease
/// terms and ages, and where each is reached: global admin tokens only.
#[utoipa::path(get, operation_id = "list_replicas", path = "/api/v1/replicas", tag = super::openapi::OPS,
    responses((status = 200, description = "Replicas and ownership", body = Replicas),
              (status = 403, description = "Not a global admin token")))]
pub async fn replicas(
    State(state): State<AppState>,
    caller: super::auth::Caller,
) -> Result<Json<Replicas>, ApiError> {
    // internal URLs and the layout of the cluster are the operator's business
    caller.require(super::auth::Perm::Global, None)?;
    let ttl_s = state
        .replica
        .as_ref()
        .map(|r| r.config().lease_ttl.as_secs_f64())
        .unwrap_or(crate::replicas::ReplicaConfig::DEFAULT_LEASE_TTL.as_secs_f64());
    let rows = store::replicas::list(&state.pool).await?;
    let mut leases = store::replicas::ownership(&state.pool).await?;
    leases.retain(|l| caller.sees(l.environment_id));
    let mut unowned: Vec<store::replicas::OwnershipRow> = Vec::new();
    let mut views: Vec<ReplicaView> = rows
        .into_iter()
        .map(|r| ReplicaView {
            live: !r.stopping && r.heartbeat_age_s <= ttl_s,
            replica: r,
            environments: Vec::new(),
        })
        .collect();
    for l in leases {
        match views
            .iter_mut()
            .find(|v| v.replica.id == l.holder && l.expires_in_s >= 0.0)
        {
            Some(v) => v.environments.push(l),
            None => unowned.push(l),
        }
    }
    Ok(Json(Replicas {
        this: state.replica.as_ref().map(|r| r.id().to_string()),
        replicas: views,
        unowned,
        isolation: Some(crate::sandbox::describe()),
    }))
}

fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Prometheus metrics: requests by method and status, database reachability, versions and
/// resource statuses per environment. Needs a token (they name environments): a global
/// token sees every environment, a scoped one its own.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = super::openapi::OPS,
    responses((status = 200, description = "Prometheus text exposition format", content_type = "text/plain", body = String))
)]
pub async fn metrics(State(state): State<AppState>, caller: super::auth::Caller) -> Response {
    let mut out = String::new();
    out.push_str(
        "# HELP steward_http_requests_total HTTP requests served, by method and status.\n",
    );
    out.push_str("# TYPE steward_http_requests_total counter\n");
    {
        let m = state
            .metrics
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for ((method, status), n) in m.iter() {
            let _ = writeln!(
                out,
                "steward_http_requests_total{{method=\"{method}\",status=\"{status}\"}} {n}"
            );
        }
    }
    out.push_str("# HELP steward_deploy_state_unstored_rows_total Deploy-state rows the database refused (replaced by a record of the refusal, or lost).\n# TYPE steward_deploy_state_unstored_rows_total counter\n");
    let _ = writeln!(
        out,
        "steward_deploy_state_unstored_rows_total {}",
        store::deploy::UNSTORED_ROWS.load(std::sync::atomic::Ordering::Relaxed)
    );
    let db_up = store::ping(&state.pool).await;
    out.push_str("# HELP steward_database_up Whether the database answers.\n# TYPE steward_database_up gauge\n");
    let _ = writeln!(out, "steward_database_up {}", db_up as u8);
    if let Some(r) = &state.replica {
        out.push_str("# HELP steward_replica_environments_owned Environments this replica owns.\n# TYPE steward_replica_environments_owned gauge\n");
        let _ = writeln!(
            out,
            "steward_replica_environments_owned{{replica=\"{}\"}} {}",
            label(r.id()),
            r.owned().len()
        );
        if db_up && let Ok(rows) = store::replicas::list(&state.pool).await {
            let ttl = r.config().lease_ttl.as_secs_f64();
            out.push_str("# HELP steward_replicas_live Replicas sharing the work (recent heartbeat, not stopping).\n# TYPE steward_replicas_live gauge\n");
            let live = rows
                .iter()
                .filter(|x| !x.stopping && x.heartbeat_age_s <= ttl)
                .count();
            let _ = writeln!(out, "steward_replicas_live {live}");
            out.push_str("# HELP steward_replica_heartbeat_age_seconds Seconds since each replica's last heartbeat.\n# TYPE steward_replica_heartbeat_age_seconds gauge\n");
            for x in &rows {
                let _ = writeln!(
                    out,
                    "steward_replica_heartbeat_age_seconds{{replica=\"{}\"}} {:.3}",
                    label(&x.id),
                    x.heartbeat_age_s
                );
            }
        }
        if db_up && let Ok(leases) = store::replicas::ownership(&state.pool).await {
            out.push_str("# HELP steward_environment_lease_age_seconds Seconds since the owner last renewed each environment's lease.\n# TYPE steward_environment_lease_age_seconds gauge\n");
            for l in leases
                .iter()
                .filter(|l| caller.sees(l.environment_id))
                .take(METRICS_ENVIRONMENTS)
            {
                let _ = writeln!(
                    out,
                    "steward_environment_lease_age_seconds{{environment=\"{}\",replica=\"{}\",term=\"{}\"}} {:.3}",
                    label(&l.name),
                    label(&l.holder),
                    l.term,
                    l.renewed_age_s
                );
            }
        }
    }
    if db_up && let Ok(mut envs) = store::environments::list_environments(&state.pool, None).await {
        envs.retain(|e| caller.sees(e.id));
        envs.truncate(METRICS_ENVIRONMENTS);
        let names: BTreeMap<uuid::Uuid, String> = envs
            .iter()
            .map(|e| (e.id, format!("{}/{}", e.project, e.name)))
            .collect();
        out.push_str("# HELP steward_versions Versions stored, per environment.\n# TYPE steward_versions gauge\n");
        if let Ok(counts) = store::versions::counts(&state.pool).await {
            for (env, n) in counts {
                let Some(name) = names.get(&env).cloned() else {
                    continue;
                };
                let _ = writeln!(
                    out,
                    "steward_versions{{environment=\"{}\"}} {n}",
                    label(&name)
                );
            }
        }
        out.push_str(
                "# HELP steward_resources Resources of the active version, per environment and status.\n# TYPE steward_resources gauge\n",
            );
        let mut actives = Vec::new();
        for e in &envs {
            if let Ok(Some(active)) = store::versions::active(&state.pool, e.id).await
                && let Ok(info) = store::versions::get(&state.pool, e.id, active).await
            {
                actives.push((e.id, active, info.resource_count));
            }
        }
        // the schedulers running here count what they stored (all asked at once, each
        // waited for until the same deadline); the database counts the others' resources
        let deadline = tokio::time::Instant::now() + METRICS_COUNTS_WAIT;
        let known = futures_util::future::join_all(actives.iter().map(|&(env, version, _)| {
            let schedulers = state.schedulers.clone();
            async move {
                match schedulers {
                    Some(s) => s.stored_status_counts_until(env, version, deadline).await,
                    None => None,
                }
            }
        }))
        .await;
        for ((env, active, resources), known) in actives.into_iter().zip(known) {
            let counted =
                store::state::counts_known_or_counted(&state.pool, env, active, known, resources)
                    .await;
            if let Ok((rows, _)) = counted {
                for (status, n) in rows {
                    let _ = writeln!(
                        out,
                        "steward_resources{{environment=\"{}\",status=\"{}\"}} {n}",
                        label(&names[&env]),
                        label(&status)
                    );
                }
            }
        }
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
        .into_response()
}
