//! Calls a handler makes to the server while its action runs: what Inmanta handlers reach
//! through `self.get_client()` (a client scoped to the agent's environment).
//!
//! The handler host sends `{"call": METHOD, "args": {...}, "call_id": N}` in the middle of an
//! action; the executor passes it up as [`Reply::Call`](super::protocol::Reply::Call) and
//! hands the [`CallAnswer`] that comes down back to the host. Whoever runs the executor
//! answers: the server's scheduler from its store, an external agent through the REST API
//! with its own token. Both read the call with [`parse`], so a handler sees the same answers
//! wherever it runs, and both answer with the rights of an agent token: the environment's
//! parameters and the facts of the action's agent's resources, read; facts of those
//! resources, written; nothing else.
//!
//! The methods are Inmanta's names with Inmanta's arguments (v1: `get_param`, `set_param`,
//! `set_parameters`, `list_params`, `get_environment`; v2: `get_facts`, `get_fact`,
//! `set_fact`, `get_parameters`, `environment_get`), so handler code runs unchanged. Any other
//! method answers 501 with the list of those offered.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

/// A handler's call, as the executor passes it up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerCall {
    /// The action the call was made in (its resource's agent bounds what it may touch).
    pub action_id: Uuid,
    pub call_id: u64,
    pub method: String,
    #[serde(default)]
    pub args: Value,
}

/// The answer to a [`ServerCall`]: an HTTP-like code and a result, as Inmanta's `Result`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallAnswer {
    pub call_id: u64,
    pub code: u16,
    #[serde(default)]
    pub result: Value,
}

/// At most this many values in one `set_parameters` call (the API's bound).
pub const MAX_VALUES: usize = 1000;

/// The methods offered, for the 501 answer.
pub const OFFERED: &[&str] = &[
    "get_param",
    "set_param",
    "set_parameters",
    "list_params",
    "get_environment",
    "get_facts",
    "get_fact",
    "set_fact",
    "get_parameters",
    "environment_get",
];

/// How the answer is shaped: Inmanta's v1 methods answer `{KEY: ...}`, v2 ones `{"data": ...}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    V1(&'static str),
    V2,
}

impl Shape {
    pub fn wrap(self, v: Value) -> Value {
        match self {
            Shape::V1(key) => json!({ key: v }),
            Shape::V2 => json!({ "data": v }),
        }
    }
}

/// A value to write, as the call gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub name: String,
    /// `''`: a parameter of the environment (refused: handlers write facts).
    pub resource_id: String,
    pub value: String,
    pub source: String,
    pub metadata: Value,
    /// Facts expire unless the call says otherwise.
    pub expires: bool,
}

/// What a call asks, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Ask {
    /// One parameter (`resource_id` empty) or fact.
    Get {
        resource_id: String,
        name: String,
        shape: Shape,
    },
    /// The environment's parameters (`resource_id` None) or one resource's facts.
    List {
        resource_id: Option<String>,
        shape: Shape,
    },
    /// Facts to write; `one`: answer the stored value (else an empty result).
    Set {
        items: Vec<Write>,
        recompile: bool,
        one: bool,
        shape: Shape,
    },
    /// The environment itself.
    Environment { shape: Shape },
}

/// A refusal: the code and the message of Inmanta's error results.
pub fn refusal(call_id: u64, code: u16, message: impl Into<String>) -> CallAnswer {
    CallAnswer {
        call_id,
        code,
        result: json!({ "message": message.into() }),
    }
}

/// At most this much JSON in one answer: a handler that lists more (thousands of large
/// parameters) gets a 413 telling it to ask for less, and nothing past the bound is held in
/// memory on its way down.
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// A successful answer, or a 413 when `result` is over [`MAX_ANSWER`].
pub fn answer(call_id: u64, result: Value) -> CallAnswer {
    let size = serde_json::to_vec(&result).map(|v| v.len()).unwrap_or(0);
    if size > MAX_ANSWER {
        return refusal(
            call_id,
            413,
            format!(
                "the answer is {size} bytes, over the {} MiB a handler's call may get: ask for one value or one resource's facts",
                MAX_ANSWER >> 20
            ),
        );
    }
    CallAnswer {
        call_id,
        code: 200,
        result,
    }
}

fn text(args: &Value, key: &str) -> Option<String> {
    match args.get(key)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn required(args: &Value, key: &str, method: &str) -> Result<String, (u16, String)> {
    text(args, key).ok_or_else(|| (400, format!("{method}: the argument '{key}' is missing")))
}

/// A value as Inmanta stores it: text (anything else as its JSON).
fn value_text(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

fn write_of(p: &Value, name_key: &str, method: &str) -> Result<Write, (u16, String)> {
    Ok(Write {
        name: required(p, name_key, method)?,
        resource_id: text(p, "resource_id").unwrap_or_default(),
        value: value_text(p.get("value")),
        source: text(p, "source").unwrap_or_else(|| "fact".into()),
        metadata: match p.get("metadata") {
            None | Some(Value::Null) => json!({}),
            Some(m) => m.clone(),
        },
        expires: p.get("expires").and_then(Value::as_bool).unwrap_or(true),
    })
}

/// Read `method(args)` for environment `env`: what it asks, or (code, message) to refuse it
/// with. The environment a call names (`tid`, or `id` for the environment) must be `env`.
pub fn parse(env: Uuid, method: &str, args: &Value) -> Result<Ask, (u16, String)> {
    if !OFFERED.contains(&method) {
        return Err((
            501,
            format!(
                "Steward does not offer '{method}' to handlers; their client offers {}",
                OFFERED.join(", ")
            ),
        ));
    }
    if !args.is_object() && !args.is_null() {
        return Err((400, format!("{method}: the arguments are not an object")));
    }
    let scope_key = if matches!(method, "get_environment" | "environment_get") {
        "id"
    } else {
        "tid"
    };
    match text(args, scope_key) {
        Some(named) if named.parse::<Uuid>().ok() == Some(env) => {}
        Some(named) => {
            return Err((
                403,
                format!(
                    "{method}: this handler's client is scoped to its environment {env}, not {named}"
                ),
            ));
        }
        None => {
            return Err((
                400,
                format!("{method}: the argument '{scope_key}' is missing"),
            ));
        }
    }
    let rid = |key: &str| text(args, key).filter(|r| !r.is_empty());
    Ok(match method {
        "get_param" => Ask::Get {
            resource_id: rid("resource_id").unwrap_or_default(),
            name: required(args, "id", method)?,
            shape: Shape::V1("parameter"),
        },
        "get_fact" => Ask::Get {
            resource_id: required(args, "rid", method)?,
            name: required(args, "id", method)?,
            shape: Shape::V2,
        },
        "list_params" => Ask::List {
            resource_id: args
                .get("query")
                .and_then(|q| q.get("resource_id"))
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty())
                .map(String::from),
            shape: Shape::V1("parameters"),
        },
        "get_facts" => Ask::List {
            resource_id: Some(required(args, "rid", method)?),
            shape: Shape::V2,
        },
        "get_parameters" => Ask::List {
            resource_id: None,
            shape: Shape::V2,
        },
        "set_param" => Ask::Set {
            items: vec![write_of(args, "id", method)?],
            recompile: args
                .get("recompile")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            one: true,
            shape: Shape::V1("parameter"),
        },
        "set_fact" => Ask::Set {
            items: vec![write_of(args, "name", method)?],
            recompile: args
                .get("recompile")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            one: true,
            shape: Shape::V2,
        },
        "set_parameters" => {
            let list = args
                .get("parameters")
                .and_then(Value::as_array)
                .ok_or((400, format!("{method}: 'parameters' is not a list")))?;
            if list.len() > MAX_VALUES {
                return Err((
                    400,
                    format!(
                        "{method}: {} values in one call, at most {MAX_VALUES}",
                        list.len()
                    ),
                ));
            }
            Ask::Set {
                items: list
                    .iter()
                    .map(|p| write_of(p, "id", method))
                    .collect::<Result<_, _>>()?,
                recompile: false,
                one: false,
                shape: Shape::V1("parameters"),
            }
        }
        _ => Ask::Environment {
            shape: if method == "environment_get" {
                Shape::V2
            } else {
                Shape::V1("environment")
            },
        },
    })
}

/// May a handler of `agent` touch `resource_id`'s facts? (A resource id names its agent:
/// `type[agent,attr=value]`.)
pub fn agent_of(resource_id: &str) -> Option<&str> {
    let inner = resource_id.split_once('[')?.1;
    Some(inner.split([',', ']']).next().unwrap_or(""))
}

/// A write a handler may not make, with why: parameters, and facts of another agent's
/// resources.
pub fn check_writes(agent: &str, items: &[Write]) -> Result<(), (u16, String)> {
    for w in items {
        if w.resource_id.is_empty() {
            return Err((
                403,
                format!(
                    "a handler writes facts of its agent's resources, not the parameter '{}'",
                    w.name
                ),
            ));
        }
        check_resource(agent, &w.resource_id)?;
    }
    Ok(())
}

/// May a handler of `agent` ask `ask`? Both answerers check this before anything else.
pub fn authorize(agent: &str, ask: &Ask) -> Result<(), (u16, String)> {
    match ask {
        Ask::Get { resource_id, .. } if !resource_id.is_empty() => {
            check_resource(agent, resource_id)
        }
        Ask::List {
            resource_id: Some(r),
            ..
        } => check_resource(agent, r),
        Ask::Set { items, .. } => check_writes(agent, items),
        _ => Ok(()),
    }
}

/// The environment as `get_environment` answers it.
pub fn environment_view(id: Uuid, name: &str, project_id: Uuid, project: &str) -> Value {
    json!({"id": id, "name": name, "project": project_id, "project_name": project})
}

/// The facts of `resource_id` belong to `agent`, or a 403 saying whose they are.
pub fn check_resource(agent: &str, resource_id: &str) -> Result<(), (u16, String)> {
    match agent_of(resource_id) {
        Some(a) if a == agent => Ok(()),
        Some(a) => Err((
            403,
            format!(
                "the facts of {resource_id} belong to agent '{a}'; this handler runs for agent '{agent}'"
            ),
        )),
        None => Err((400, format!("'{resource_id}' is not a resource id"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_read_as_inmanta_names_them_and_scoped_to_the_environment() {
        let env = Uuid::new_v4();
        let tid = env.to_string();
        let a = parse(
            env,
            "get_param",
            &json!({"tid": tid, "id": "ip", "resource_id": "a::B[x,n=1]"}),
        )
        .unwrap();
        assert_eq!(
            a,
            Ask::Get {
                resource_id: "a::B[x,n=1]".into(),
                name: "ip".into(),
                shape: Shape::V1("parameter")
            }
        );
        let other = Uuid::new_v4().to_string();
        assert_eq!(
            parse(env, "get_param", &json!({"tid": other, "id": "ip"}))
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            parse(env, "delete_param", &json!({"tid": tid}))
                .unwrap_err()
                .0,
            501
        );
        assert_eq!(
            parse(env, "get_param", &json!({"id": "ip"})).unwrap_err().0,
            400
        );
        let Ask::Set { items, .. } = parse(
            env,
            "set_param",
            &json!({"tid": tid, "id": "n", "source": "fact", "value": 3, "resource_id": "a::B[x,n=1]"}),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(items[0].value, "3");
        assert!(check_writes("x", &items).is_ok());
        assert_eq!(check_writes("y", &items).unwrap_err().0, 403);
        let mut param = items.clone();
        param[0].resource_id.clear();
        assert_eq!(check_writes("x", &param).unwrap_err().0, 403);
        assert!(matches!(
            parse(env, "environment_get", &json!({"id": tid})).unwrap(),
            Ask::Environment { shape: Shape::V2 }
        ));
        // an answer has a bound
        let big = json!({"parameters": vec!["x".repeat(64 * 1024); 100]});
        let a = answer(7, big);
        assert_eq!((a.call_id, a.code), (7, 413), "{}", a.result);
        assert_eq!(answer(8, json!({"ok": 1})).code, 200);
    }
}
