//! A handler's calls to the server (`get_client()`, see [`crate::executor::calls`]),
//! answered by the environment's scheduler from the store, with an agent token's rights: it
//! reads the environment's parameters and its agent's resources' facts, and writes those
//! facts. A write goes out as the API's writes do ([`Event::facts`](crate::events::Event)),
//! so a fact that resolves an unknown recompiles the model. Each call is answered in a task
//! of its own: a slow database holds up the calling handler only.

use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use super::EnvScheduler;
use crate::executor::calls::{self, Ask, CallAnswer, ServerCall};
use crate::scheduler::executors::{PoolEvent, ProcId};
use crate::store::{self, facts};

impl EnvScheduler {
    /// A handler running on executor `proc` calls the server: answer it (later, through
    /// [`PoolEvent::Answer`]).
    pub(super) fn on_call(&mut self, proc: ProcId, call: ServerCall) {
        let agent = self
            .running
            .iter()
            .find(|(_, r)| r.action_id == call.action_id && r.proc == proc)
            .map(|(k, _)| k.resource())
            .and_then(|rid| {
                self.model
                    .get(rid)
                    .map(|i| self.model.intents[i].agent.clone())
            });
        let events = self.executors.events();
        let Some(agent) = agent else {
            let a = calls::refusal(call.call_id, 409, "the action that made this call is over");
            let _ = events.send(PoolEvent::Answer(proc, a));
            return;
        };
        let (pool, notifier, env) = (self.pool.clone(), self.notifier.clone(), self.env);
        tokio::spawn(async move {
            let a = answer(&pool, &notifier, env, &agent, &call).await;
            if a.code >= 400 {
                tracing::info!(environment = %env, agent, method = call.method, code = a.code, "a handler's call was refused: {}", a.result["message"]);
            }
            let _ = events.send(PoolEvent::Answer(proc, a));
        });
    }
}

/// The answer to `call`, made by a handler of `agent` in `env`.
pub async fn answer(
    pool: &PgPool,
    notifier: &crate::events::Notifier,
    env: Uuid,
    agent: &str,
    call: &ServerCall,
) -> CallAnswer {
    let id = call.call_id;
    let ask = match calls::parse(env, &call.method, &call.args) {
        Ok(a) => a,
        Err((code, msg)) => return calls::refusal(id, code, msg),
    };
    if let Err((code, msg)) = calls::authorize(agent, &ask) {
        return calls::refusal(id, code, msg);
    }
    match run(pool, notifier, env, ask).await {
        Ok(v) => calls::answer(id, v),
        Err((code, msg)) => calls::refusal(id, code, msg),
    }
}

fn store_error(e: store::StoreError) -> (u16, String) {
    match e {
        store::StoreError::Invalid(m) => (400, m),
        store::StoreError::NotFound(m) => (404, m),
        store::StoreError::Unavailable(m) => (503, format!("the database is unavailable: {m}")),
        e => (500, e.to_string()),
    }
}

async fn run(
    pool: &PgPool,
    notifier: &crate::events::Notifier,
    env: Uuid,
    ask: Ask,
) -> Result<Value, (u16, String)> {
    let environment = store::environments::get_environment(pool, env)
        .await
        .map_err(store_error)?;
    let shown = |mut rows: Vec<facts::Param>| {
        facts::mark_expired(
            &mut rows,
            environment.settings.fact_expire,
            chrono::Utc::now(),
        );
        rows
    };
    match ask {
        Ask::Get {
            resource_id,
            name,
            shape,
        } => {
            let p = facts::get(pool, env, &resource_id, &name)
                .await
                .map_err(store_error)?
                .ok_or_else(|| {
                    (
                        404,
                        if resource_id.is_empty() {
                            format!("there is no parameter '{name}'")
                        } else {
                            format!("there is no fact '{name}' of {resource_id}")
                        },
                    )
                })?;
            Ok(shape.wrap(json!(shown(vec![p]).remove(0))))
        }
        Ask::List { resource_id, shape } => {
            // without a resource: the environment's parameters (not other agents' facts)
            let rows = facts::list(pool, env, Some(resource_id.as_deref().unwrap_or("")))
                .await
                .map_err(store_error)?;
            Ok(shape.wrap(json!(shown(rows))))
        }
        Ask::Set {
            items,
            recompile,
            one,
            shape,
        } => {
            let new: Vec<facts::NewParam> = items
                .iter()
                .map(|w| facts::NewParam {
                    name: w.name.clone(),
                    resource_id: w.resource_id.clone(),
                    value: w.value.clone(),
                    source: w.source.clone(),
                    metadata: w.metadata.clone(),
                    expires: w.expires,
                })
                .collect();
            let mut c = pool.acquire().await.map_err(|e| store_error(e.into()))?;
            let out = facts::set_many(&mut c, env, &new)
                .await
                .map_err(store_error)?;
            if !out.changed.is_empty() || !out.resolved_versions.is_empty() {
                notifier.send(crate::events::Event::facts(
                    env,
                    out.resolved_versions.clone(),
                    out.changed.clone(),
                    recompile && !out.changed.is_empty(),
                ));
            }
            if !one {
                return Ok(json!({}));
            }
            let w = &items[0];
            let p = facts::get(pool, env, &w.resource_id, &w.name)
                .await
                .map_err(store_error)?;
            Ok(shape.wrap(json!(p.map(|p| shown(vec![p]).remove(0)))))
        }
        Ask::Environment { shape } => Ok(shape.wrap(calls::environment_view(
            environment.id,
            &environment.name,
            environment.project_id,
            &environment.project,
        ))),
    }
}
