//! Plugins: functions callable from the model as `namespace::name(...)`.
//!
//! Steward implements std's plugins (and those of the built-in fs/exec modules) natively. Each
//! plugin declares a Python-like signature; a call binds positional, keyword and `**dict`
//! arguments to it with the reference's error messages, type-checks them against the declared
//! DSL types, and returns unknown without calling when an argument is unknown (unless the
//! plugin accepts unknowns). Effects go through the [`Host`]: printing, module files.

mod json;
mod net;
mod std_lib;
mod template;

use std::rc::Rc;

use super::diagnostics::Diagnostic;
use super::eval::expr::Cx;
use super::eval::{Eval, Runtime, Stop, err};
use super::ids::ExprId;
use super::ir::Call;
use super::source::Span;
use super::types::{BaseType, Prim, TypeRef};
use super::value::Value;

/// What the compiler needs from its surroundings while evaluating.
pub trait Host {
    /// One `std::print` line (may contain newlines).
    fn print(&mut self, text: &str);
    /// A file shipped with a module: `dir` is `templates` or `files`.
    fn module_file(&self, module: &str, dir: &str, path: &str) -> Result<(String, String), String>;
    /// An environment variable.
    fn env_var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Default {
    Null,
    Int(i64),
    Bool(bool),
    Str(&'static str),
}

pub struct Param {
    pub name: &'static str,
    /// A DSL type: `any`, `string`, `int`, `string[]`, `std::Entity`, `std::port`, …
    pub ty: &'static str,
    pub default: Option<Default>,
}

pub const fn req(name: &'static str, ty: &'static str) -> Param {
    Param {
        name,
        ty,
        default: None,
    }
}

pub const fn opt(name: &'static str, ty: &'static str, d: Default) -> Param {
    Param {
        name,
        ty,
        default: Some(d),
    }
}

pub struct Args {
    pub values: Vec<Value>,
    /// `**kwargs` beyond the declared parameters.
    pub extra: Vec<(Rc<str>, Value)>,
    pub span: Span,
    pub site: ExprId,
}

pub type PluginFn = fn(&mut Runtime, &mut Cx, &mut Args) -> Eval<Value>;

pub struct PluginDef {
    pub namespace: &'static str,
    pub name: &'static str,
    pub params: Vec<Param>,
    pub var_kwargs: bool,
    pub allow_unknown: bool,
    /// Type of the result, validated like an argument ("any" / "null" skip the check).
    pub returns: &'static str,
    pub func: PluginFn,
}

impl PluginDef {
    pub fn full_name(&self) -> String {
        format!("{}::{}", self.namespace, self.name)
    }
}

static ALL: std::sync::OnceLock<Vec<PluginDef>> = std::sync::OnceLock::new();

pub fn all() -> &'static [PluginDef] {
    ALL.get_or_init(|| {
        let mut v = Vec::new();
        v.extend(std_lib::plugins());
        v.extend(net::plugins());
        v.extend(json::plugins());
        v.extend(template::plugins());
        v
    })
}

/// An exception raised inside a plugin.
pub fn fail(args: &Args, def_name: &str, msg: impl Into<String>) -> Stop {
    err(
        "plugin",
        format!("Exception in plugin {def_name}\ncaused by: {}", msg.into()),
        args.span,
    )
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

impl Runtime<'_> {
    /// Evaluate the arguments, bind them to the signature, call.
    pub fn call_plugin(&mut self, cx: &mut Cx, call: &Call, site: ExprId) -> Eval<Value> {
        let def = &all()[call.plugin.0 as usize];
        let span = self.p.ir.expr(site).span;
        let mut positional = Vec::with_capacity(call.args.len());
        for a in &call.args {
            positional.push(self.eval(cx, *a)?);
        }
        let mut kwargs: Vec<(Rc<str>, Value)> = Vec::with_capacity(call.kwargs.len());
        for (k, v) in &call.kwargs {
            kwargs.push((k.clone(), self.eval(cx, *v)?));
        }
        for s in &call.splats {
            match self.eval(cx, *s)? {
                Value::Dict(d) => kwargs.extend(d.iter().map(|(k, v)| (k.clone(), v.clone()))),
                Value::Unknown => return Ok(Value::Unknown),
                other => {
                    return Err(err(
                        "kwargs",
                        format!(
                            "** can only be applied to a dict, got {}",
                            self.value_str(&other)
                        ),
                        span,
                    ));
                }
            }
        }
        let full = def.full_name();
        // bind
        let n = def.params.len();
        if positional.len() > n {
            return Err(err(
                "plugin-args",
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
                        return Err(err(
                            "plugin-args",
                            format!("{full}() got multiple values for argument '{k}'"),
                            span,
                        ));
                    }
                    bound[i] = Some(v);
                }
                None if def.var_kwargs => extra.push((k, v)),
                None => {
                    return Err(err(
                        "plugin-args",
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
            return Err(err(
                "plugin-args",
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
            return Ok(Value::Unknown);
        }
        for (p, v) in def.params.iter().zip(values.iter()) {
            // a defaulted null is always fine
            if v.is_null() && matches!(p.default, Some(Default::Null)) {
                continue;
            }
            if let Err(msg) = self.check_dsl_type(v, p.ty) {
                return Err(err("plugin-args", msg, span));
            }
        }
        if let Some(v) = self.memo_get(cx) {
            return Ok(v);
        }
        let mut args = Args {
            values,
            extra,
            span,
            site,
        };
        let result = (def.func)(self, cx, &mut args)?;
        if !result.is_unknown()
            && !result.is_null()
            && let Err(msg) = self.check_dsl_type(&result, def.returns)
        {
            return Err(fail(&args, &full, format!("return value: {msg}")));
        }
        self.memo_put(cx, result.clone());
        Ok(result)
    }

    /// Validate a value against a DSL type named in a plugin signature.
    pub fn check_dsl_type(&mut self, v: &Value, ty: &str) -> Result<(), String> {
        if matches!(ty, "any" | "null" | "expression") || v.is_unknown() {
            return Ok(());
        }
        // plugin lists may hold anything, instances included
        if ty == "list" {
            return match v {
                Value::List(_) => Ok(()),
                other => Err(format!(
                    "Invalid value '{}', expected list",
                    self.value_str(other)
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
                let found = self
                    .p
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
        let vt = super::types::ValueType {
            base: base_ty,
            list,
            nullable: false,
        };
        self.validate(v, &vt)
    }
}

/// Plugins resolve by namespace: is there one with this name?
pub fn find(namespace: &str, name: &str) -> Option<usize> {
    all()
        .iter()
        .position(|p| p.namespace == namespace && p.name == name)
}

#[allow(dead_code)]
fn _diag(_: Diagnostic) {}
