//! The `via` field of the resources of the fs and exec modules, as inmanta-module-mitogen
//! 0.2.5 exports it (`get_resource_context`): the mitogen context the resource is reached
//! through, serialized to a tree of dicts.
//!
//! 1. the resource's own `via` relation, when set;
//! 2. else its host's `via`, when set;
//! 3. else, for a host with an `ip`, an ssh context built from the host (wrapped in a sudo
//!    context when `remote_user` is not root).
//!
//! Where the reference raises (no host, or a host with neither `via` nor `ip`), Steward exports
//! `via: null`: its executors act on the agent's own machine, which is what such a model means
//! to Steward.

use std::collections::HashMap;

use super::{AttrPath, Read, ResourceIds, entity_named, read_attr_path, read_path, to_json};
use crate::compiler::eval::Runtime;
use crate::compiler::types::AttrKind;
use crate::compiler::value::{InstId, Value};

/// A value the context depends on is unknown.
struct Unknown;

/// An optional relation: `None` when empty (or not declared on the instance's entity).
fn optional(rt: &Runtime, inst: InstId, rel: &str) -> Result<Option<InstId>, Unknown> {
    relation_target(read_path(rt, inst, rel))
}

fn relation_target(read: Read) -> Result<Option<InstId>, Unknown> {
    match read {
        Read::Value(Value::Instance(i)) => Ok(Some(i)),
        Read::Value(Value::List(l)) => match l.first() {
            Some(Value::Instance(i)) => Ok(Some(*i)),
            _ => Ok(None),
        },
        Read::Value(_) | Read::Missing(_) => Ok(None),
        Read::Unknown => Err(Unknown),
    }
}

fn value(rt: &Runtime, inst: InstId, path: &str) -> Result<Value, Unknown> {
    match read_path(rt, inst, path) {
        Read::Value(v) => Ok(v),
        Read::Missing(_) => Ok(Value::Null),
        Read::Unknown => Err(Unknown),
    }
}

fn json(rt: &Runtime, v: &Value) -> Result<serde_json::Value, Unknown> {
    to_json(rt, v, &ResourceIds::new(0)).ok_or(Unknown)
}

/// The `via` of the resources of one export. Every file of a host has the context of that
/// host (unless it has a `via` of its own), so each host's is made once: made per resource,
/// it was a tenth of the export of 100,000 files.
pub(super) struct Vias<'r, 'p> {
    rt: &'r Runtime<'p>,
    via: AttrPath<'static>,
    host: AttrPath<'static>,
    host_entity: Option<crate::compiler::ids::EntityId>,
    of_host: HashMap<InstId, Option<serde_json::Value>>,
}

impl<'r, 'p> Vias<'r, 'p> {
    pub(super) fn new(rt: &'r Runtime<'p>) -> Vias<'r, 'p> {
        Vias {
            rt,
            via: AttrPath::new(rt, "via"),
            host: AttrPath::new(rt, "host"),
            host_entity: entity_named(rt, "std", "Host"),
            of_host: HashMap::new(),
        }
    }

    /// The `via` of a resource instance; `None` when it depends on an unknown.
    pub(super) fn via(&mut self, inst: InstId) -> Option<serde_json::Value> {
        let rt = self.rt;
        let own = match optional_at(rt, inst, &self.via) {
            Ok(own) => own,
            Err(Unknown) => return None,
        };
        if let Some(ctx) = own {
            return serialize(rt, ctx).ok();
        }
        let host = match optional_at(rt, inst, &self.host) {
            Ok(Some(host)) => host,
            Ok(None) => return Some(serde_json::Value::Null),
            Err(Unknown) => return None,
        };
        let is_host = self
            .host_entity
            .is_some_and(|h| rt.p.is_subtype(rt.inst_entity(host), h));
        if !is_host {
            return Some(serde_json::Value::Null);
        }
        self.of_host
            .entry(host)
            .or_insert_with(|| {
                host_context(rt, host)
                    .map(|c| c.unwrap_or(serde_json::Value::Null))
                    .ok()
            })
            .clone()
    }
}

/// [`optional`] of a path resolved once.
fn optional_at(rt: &Runtime, inst: InstId, rel: &AttrPath) -> Result<Option<InstId>, Unknown> {
    relation_target(read_attr_path(rt, inst, rel))
}

/// The context of a resource without a `via` of its own, on `host` (a `std::Host`).
fn host_context(rt: &Runtime, host: InstId) -> Result<Option<serde_json::Value>, Unknown> {
    if let Some(ctx) = optional(rt, host, "via")? {
        return serialize(rt, ctx).map(Some);
    }
    let ip = value(rt, host, "ip")?;
    if ip.is_null() {
        return Ok(None);
    }
    let remote_user = value(rt, host, "remote_user")?;
    let python = match value(rt, host, "os.python_cmd")? {
        Value::Null => serde_json::json!(["python3"]),
        cmd => serde_json::Value::Array(vec![json(rt, &cmd)?]),
    };
    let ssh = serde_json::json!({
        "method_name": "ssh",
        "name": json(rt, &value(rt, host, "name")?)?,
        "hostname": json(rt, &ip)?,
        "username": json(rt, &remote_user)?,
        "port": json(rt, &value(rt, host, "remote_port")?)?,
        "check_host_keys": "ignore",
        "ssh_args": ["-o", "UserKnownHostsFile=/dev/null", "-o", "PasswordAuthentication=no"],
        "python_path": python,
    });
    if remote_user.as_str() == Some("root") {
        Ok(Some(ssh))
    } else {
        Ok(Some(serde_json::json!({
            "method_name": "sudo",
            "name": "",
            "via": ssh,
        })))
    }
}

/// A `mitogen::Context` instance: every attribute that is not a relation and not null, and
/// the context it is reached through under `via`.
fn serialize(rt: &Runtime, ctx: InstId) -> Result<serde_json::Value, Unknown> {
    let e = rt.p.entity(rt.inst_entity(ctx));
    let mut out = serde_json::Map::new();
    for &a in &e.slots {
        let attr = rt.p.attr(a);
        if matches!(attr.kind, AttrKind::Relation { .. }) {
            continue;
        }
        let v = value(rt, ctx, &attr.name)?;
        if !v.is_null() {
            out.insert(attr.name.clone(), json(rt, &v)?);
        }
    }
    if let Some(parent) = optional(rt, ctx, "via")? {
        out.insert("via".into(), serialize(rt, parent)?);
    }
    Ok(serde_json::Value::Object(out))
}
