//! A handler's calls to the server (`get_client()`, see [`crate::executor::calls`]) from an
//! external agent process: answered through the REST API with the agent's own token, so the
//! server checks them again with that token's rights (its environment's parameters, the facts
//! of its agents' resources). Each call is answered in a task of its own.

use serde_json::{Value, json};
use uuid::Uuid;

use crate::client::{Client, ClientError};
use crate::executor::calls::{self, Ask, CallAnswer, ServerCall};
use crate::scheduler::agents::EnvIdentity;
use crate::store::facts::ParameterItem;

fn client_error(e: ClientError) -> (u16, String) {
    match e {
        ClientError::Api {
            status, message, ..
        } => (status, message),
        e @ (ClientError::Connect { .. } | ClientError::Certificate { .. }) => (503, e.to_string()),
        e => (500, e.to_string()),
    }
}

/// What an agent process answers with.
pub struct Link {
    pub client: Client,
    /// how this process names its environment to the server
    pub env_key: String,
    pub env: Uuid,
    /// the environment as the server said when the session opened
    pub identity: Option<EnvIdentity>,
}

/// The answer to `call`, made by a handler of `agent`.
pub async fn answer(link: &Link, agent: &str, call: &ServerCall) -> CallAnswer {
    let id = call.call_id;
    let ask = match calls::parse(link.env, &call.method, &call.args) {
        Ok(a) => a,
        Err((code, msg)) => return calls::refusal(id, code, msg),
    };
    if let Err((code, msg)) = calls::authorize(agent, &ask) {
        return calls::refusal(id, code, msg);
    }
    if let Ask::Environment { shape } = ask {
        return match &link.identity {
            Some(e) => calls::answer(
                id,
                shape.wrap(calls::environment_view(
                    e.id,
                    &e.name,
                    e.project_id,
                    &e.project,
                )),
            ),
            None => calls::refusal(
                id,
                503,
                "the agent has not heard its environment's name yet",
            ),
        };
    }
    match run(&link.client, &link.env_key, ask).await {
        Ok(v) => calls::answer(id, v),
        Err((code, msg)) => calls::refusal(id, code, msg),
    }
}

async fn run(client: &Client, env: &str, ask: Ask) -> Result<Value, (u16, String)> {
    match ask {
        Ask::Get {
            resource_id,
            name,
            shape,
        } => {
            let rid = Some(resource_id.as_str()).filter(|r| !r.is_empty());
            let p = client
                .get_parameter(env, &name, rid)
                .await
                .map_err(client_error)?;
            Ok(shape.wrap(json!(p)))
        }
        Ask::List { resource_id, shape } => {
            let rows = client
                .list_parameters(env, Some(resource_id.as_deref().unwrap_or("")))
                .await
                .map_err(client_error)?;
            Ok(shape.wrap(json!(rows)))
        }
        Ask::Set {
            items,
            recompile,
            one,
            shape,
        } => {
            if one {
                let w = &items[0];
                let body = json!({
                    "value": w.value, "source": w.source, "metadata": w.metadata,
                    "expires": w.expires, "recompile": recompile,
                });
                let p = client
                    .set_parameter(env, &w.name, Some(&w.resource_id), &body)
                    .await
                    .map_err(client_error)?;
                return Ok(shape.wrap(json!(p)));
            }
            let list: Vec<ParameterItem> = items
                .into_iter()
                .map(|w| ParameterItem {
                    name: w.name,
                    resource_id: w.resource_id,
                    value: w.value,
                    source: Some(w.source),
                    metadata: Some(w.metadata),
                    expires: Some(w.expires),
                    secret: None,
                })
                .collect();
            client
                .set_parameters(env, &list, recompile)
                .await
                .map_err(client_error)?;
            Ok(json!({}))
        }
        // answered from what the session's opening said (see `answer`)
        Ask::Environment { .. } => Err((500, "unreachable".into())),
    }
}
