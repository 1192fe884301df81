//! `std::getfact(resource, fact_name, default_value=null)`: a fact of a resource from the
//! environment, as std 8.1.0's plugin on inmanta-core 14.
//!
//! The resource's id is the one it gets at export (`inmanta.resources.to_id`): the type
//! declaring it a resource (its own or the nearest ancestor's), the agent at the declared
//! attribute path and the id attribute's value. Reading those waits for them as any read in a
//! plugin does; an unknown one makes the result unknown, and nothing is recorded (the
//! reference's `UnknownException` escapes the plugin). The types of `module.yml` are done
//! here; an `@resource` class of a module's Python computes the id in the plugin host, with
//! its mappers. A value the environment has is the result (a string). One it does not have
//! is recorded for the export's `unknowns`, and the result is `default_value`, or unknown when
//! that is null. An argument that is no resource is the reference's error.

use super::{Caller, Outcome, PluginDef, ResourceType, fail, opt, req};
use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::source::Span;
use crate::compiler::value::{InstId, Value};

const NAME: &str = "std::getfact";

pub fn getfact() -> PluginDef {
    PluginDef {
        namespace: "std",
        name: "getfact",
        params: vec![
            req("resource", "any"),
            req("fact_name", "string"),
            opt("default_value", "any", super::Default::Null),
        ],
        var_kwargs: false,
        allow_unknown: false,
        returns: "any",
        func: |c, a| {
            let inst = match &a.values[0] {
                Value::Instance(i) => *i,
                // what the reference's `to_id` raises on the proxy of a value that is no entity
                other => {
                    let (class, attr) = match other {
                        Value::Null => ("NoneType", "_type"),
                        Value::List(_) => ("list", "type"),
                        Value::Dict(_) => ("dict", "type"),
                        v => (v.py_type_name(), "_type"),
                    };
                    return Err(fail(
                        a,
                        NAME,
                        format!("AttributeError: '{class}' object has no attribute '{attr}'"),
                    ));
                }
            };
            let resource_id = match resource_id(c, inst, a.span)? {
                Id::Known(id) => id,
                Id::Unknown => return Ok(Value::Unknown),
                Id::NotAResource => {
                    // sic: the reference's message
                    return Err(fail(
                        a,
                        NAME,
                        "Exception: Facts can only be retreived from resources.",
                    ));
                }
            };
            let name = a.values[1].as_str().unwrap_or("");
            if let Some(value) = c.host().fact(&resource_id, name, a.span) {
                return Ok(Value::string(value));
            }
            c.host().record_unknown(&resource_id, name);
            Ok(if a.values[2].is_null() {
                Value::Unknown
            } else {
                a.values[2].clone()
            })
        },
    }
}

/// The resource id of an instance, as far as the model knows it.
pub enum Id {
    Known(String),
    /// The agent or the id attribute is unknown.
    Unknown,
    NotAResource,
}

/// The id `inst` has as a resource at export.
pub fn resource_id(c: &mut dyn Caller, inst: InstId, span: Span) -> Outcome<Id> {
    if let Some(id) = c.host().known_resource_id(inst) {
        return Ok(Id::Known(id));
    }
    let names: Vec<String> = {
        let p = c.program();
        let ent = p.entity(c.instance_entity(inst));
        std::iter::once(ent.full_name.clone())
            .chain(ent.ancestors.iter().map(|a| p.entity(*a).full_name.clone()))
            .collect()
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let kind = c.host().resource_type(&names);
    let id = match kind {
        None => return Ok(Id::NotAResource),
        Some(ResourceType::Python) => super::python::resource_id(c, inst, NAME, span)?,
        Some(ResourceType::Declared {
            type_name,
            agent,
            id,
        }) => declared_id(c, inst, &type_name, &agent, &id, span)?,
    };
    if let Id::Known(text) = &id {
        c.host().remember_resource_id(inst, text.clone());
    }
    Ok(id)
}

/// An exception of the plugin, as [`fail`] makes it, where no [`super::Args`] are at hand.
fn error(span: Span, msg: String) -> super::Stop {
    Diagnostic::error(
        "plugin",
        format!("Exception in plugin {NAME}\ncaused by: {msg}"),
    )
    .at(span)
    .into()
}

/// What a read along an attribute path found.
enum Step {
    Value(Value),
    Unknown,
}

/// The value at a dotted attribute path of `inst`, read as the reference's `object_to_id`
/// reads the agent path (the first element of a list stands for the list), waiting for each.
fn read_path(c: &mut dyn Caller, inst: InstId, path: &str, span: Span) -> Outcome<Step> {
    let mut cur = Value::Instance(inst);
    for part in path.split('.') {
        if let Value::List(items) = &cur {
            cur = items.first().cloned().unwrap_or(Value::Null);
        }
        let found = match &cur {
            Value::Instance(i) => {
                let p = c.program();
                p.syms
                    .get(part)
                    .filter(|s| p.entity(c.instance_entity(*i)).slot(*s).is_some())
            }
            _ => None,
        };
        let Some(sym) = found else {
            let owner = c.value_str(&Value::Instance(inst));
            return Err(error(
                span,
                format!(
                    "Exception: Unable to get the name of agent {owner} belongs to. In path {path}, '{part}' does not exist"
                ),
            ));
        };
        cur = c.read_attr(&cur, sym, part)?;
        if cur.is_unknown() {
            return Ok(Step::Unknown);
        }
    }
    Ok(Step::Value(cur))
}

fn declared_id(
    c: &mut dyn Caller,
    inst: InstId,
    type_name: &str,
    agent_path: &str,
    id_attr: &str,
    span: Span,
) -> Outcome<Id> {
    let agent = match read_path(c, inst, agent_path, span)? {
        Step::Value(Value::Str(s)) => s.to_string(),
        Step::Value(other) => {
            let text = c.value_str(&other);
            return Err(error(
                span,
                format!(
                    "ResourceException: The agent attribute should lead to a string, got {text} of type <class '{}'>",
                    other.py_type_name()
                ),
            ));
        }
        Step::Unknown => return Ok(Id::Unknown),
    };
    let value = match read_path(c, inst, id_attr, span)? {
        Step::Value(v) => c.value_str(&v),
        Step::Unknown => return Ok(Id::Unknown),
    };
    Ok(Id::Known(
        crate::model::ResourceId::new(type_name, &agent, id_attr, &value).0,
    ))
}
