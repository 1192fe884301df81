//! Calling a plugin: bind evaluated arguments to its signature with Python's error messages,
//! check them against the declared DSL types, call, and check the result.

use std::rc::Rc;

use super::{Args, Caller, Default, Outcome, PluginDef, fail};
use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::source::Span;
use crate::compiler::types::{BaseType, Prim, TypeRef, ValueType};
use crate::compiler::value::Value;

fn args_error(msg: impl Into<String>, span: Span) -> super::Stop {
    Diagnostic::error("plugin-args", msg).at(span).into()
}

fn python_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match quoted.len() {
        0 => String::new(),
        1 => quoted[0].clone(),
        2 => format!("{} and {}", quoted[0], quoted[1]),
        n => format!("{}, and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

/// Bind the evaluated arguments of a call at `span` to `def`'s parameters and type-check them.
/// `None`: an argument is unknown and the plugin does not accept unknowns, so the call is
/// unknown without calling.
pub fn bind(
    def: &PluginDef,
    caller: &mut dyn Caller,
    positional: Vec<Value>,
    kwargs: Vec<(Rc<str>, Value)>,
    span: Span,
) -> Outcome<Option<Args>> {
    let full = def.full_name();
    let n = def.params.len();
    if positional.len() > n {
        return Err(args_error(
            format!(
                "{full}() takes {n} positional arguments but {} were given",
                positional.len()
            ),
            span,
        ));
    }
    let mut bound: Vec<Option<Value>> = vec![None; n];
    for (i, v) in positional.into_iter().enumerate() {
        bound[i] = Some(v);
    }
    let mut extra = Vec::new();
    for (k, v) in kwargs {
        match def.params.iter().position(|p| p.name == &*k) {
            Some(i) => {
                if bound[i].is_some() {
                    return Err(args_error(
                        format!("{full}() got multiple values for argument '{k}'"),
                        span,
                    ));
                }
                bound[i] = Some(v);
            }
            None if def.var_kwargs => extra.push((k, v)),
            None => {
                return Err(args_error(
                    format!("{full}() got an unexpected keyword argument '{k}'"),
                    span,
                ));
            }
        }
    }
    let missing: Vec<&str> = def
        .params
        .iter()
        .zip(bound.iter())
        .filter(|(p, b)| b.is_none() && p.default.is_none())
        .map(|(p, _)| p.name)
        .collect();
    if !missing.is_empty() {
        return Err(args_error(
            format!(
                "{full}() missing {} required positional argument{}: {}",
                missing.len(),
                if missing.len() == 1 { "" } else { "s" },
                python_list(&missing)
            ),
            span,
        ));
    }
    let values: Vec<Value> = def
        .params
        .iter()
        .zip(bound)
        .map(|(p, b)| {
            b.unwrap_or_else(|| match p.default.expect("checked") {
                Default::Null => Value::Null,
                Default::Int(i) => Value::Int(i),
                Default::Bool(b) => Value::Bool(b),
                Default::Str(s) => Value::str(s),
            })
        })
        .collect();
    if !def.allow_unknown
        && (values.iter().any(Value::contains_unknown)
            || extra.iter().any(|(_, v)| v.contains_unknown()))
    {
        return Ok(None);
    }
    for (p, v) in def.params.iter().zip(values.iter()) {
        // a defaulted null is always fine
        if v.is_null() && matches!(p.default, Some(Default::Null)) {
            continue;
        }
        if let Err(msg) = check_dsl_type(caller, v, p.ty) {
            return Err(args_error(msg, span));
        }
    }
    Ok(Some(Args {
        values,
        extra,
        span,
    }))
}

/// Call the plugin with bound arguments and check its result against the declared type.
pub fn invoke(def: &PluginDef, caller: &mut dyn Caller, args: &mut Args) -> Outcome<Value> {
    let result = (def.func)(caller, args)?;
    if !result.is_unknown()
        && !result.is_null()
        && let Err(msg) = check_dsl_type(caller, &result, def.returns)
    {
        return Err(fail(args, &def.full_name(), format!("return value: {msg}")));
    }
    Ok(result)
}

/// Validate a value against a DSL type named in a plugin signature.
pub(crate) fn check_dsl_type(caller: &mut dyn Caller, v: &Value, ty: &str) -> Result<(), String> {
    if matches!(ty, "any" | "null" | "expression") || v.is_unknown() {
        return Ok(());
    }
    // plugin lists may hold anything, instances included
    if ty == "list" {
        return match v {
            Value::List(_) => Ok(()),
            other => Err(format!(
                "Invalid value '{}', expected list",
                caller.value_str(other)
            )),
        };
    }
    let (base, list) = match ty.strip_suffix("[]") {
        Some(b) => (b, true),
        None => (ty, false),
    };
    let base_ty = match Prim::from_name(base) {
        Some(p) => BaseType::Prim(p),
        None => {
            let (ns, name) = base.rsplit_once("::").unwrap_or(("std", base));
            let found = caller
                .program()
                .namespaces
                .iter()
                .find(|n| n.name == ns)
                .and_then(|n| n.types.get(name).copied());
            match found {
                Some(TypeRef::Typedef(t)) => BaseType::Typedef(t),
                Some(TypeRef::Entity(e)) => BaseType::Entity(e),
                _ => return Ok(()),
            }
        }
    };
    let vt = ValueType {
        base: base_ty,
        list,
        nullable: false,
    };
    caller.validate(v, &vt)
}
