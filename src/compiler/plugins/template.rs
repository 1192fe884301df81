//! `std::template(path, **kwargs)`: render a Jinja template from a module's `templates/` with
//! minijinja.
//!
//! Without keyword arguments the template sees the variables in scope at the call (`::` is
//! written `.`). The variables the template uses are resolved through the caller first — a
//! value that does not exist yet makes the call wait, as any plugin argument would — and then
//! handed to minijinja; instances become maps of their attributes, dicts keep the model's
//! order. As in Jinja2, dicts, lists and strings have Python's methods (`d.get(k, default)`,
//! `d.items()`, `d.keys()`, `d.values()`, `s.upper()`, … through minijinja-contrib's pycompat),
//! and `{{ value }}` shows what the reference shows: Python's `str()` (`None`, `True`, and the
//! model's lists and dicts as `@[…]`/`@{…}`).

use std::collections::BTreeMap;

use indexmap::IndexMap;

use super::files::resolve_module_path;
use super::{Args, Caller, Outcome, PluginDef, Stop, fail, req};
use crate::compiler::value::{InstId, Value, pyfmt};

pub fn plugins() -> Vec<PluginDef> {
    vec![PluginDef {
        namespace: "std",
        name: "template",
        params: vec![req("path", "string")],
        var_kwargs: true,
        allow_unknown: false,
        returns: "string",
        func: render,
    }]
}

fn render(c: &mut dyn Caller, a: &mut Args) -> Outcome<Value> {
    let path = a.values[0].as_str().unwrap_or("").to_string();
    let (module, rest) = resolve_module_path(c, &path, a, "std::template")?;
    let source = match c.host().module_file(&module, "templates", &rest) {
        Ok((s, _)) => s,
        Err(e) => return Err(fail(a, "std::template", e)),
    };
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    // Python's methods on dicts, lists and strings (`d.get(k)`, `d.items()`, `s.upper()`, …)
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    if let Err(e) = env.add_template("t", &source) {
        return Err(fail(
            a,
            "std::template",
            format!("TemplateSyntaxError: {e}"),
        ));
    }
    let tmpl = env.get_template("t").expect("template added");
    let mut ctx: BTreeMap<String, minijinja::Value> = BTreeMap::new();
    if !a.extra.is_empty() {
        for (k, v) in &a.extra {
            ctx.insert(k.to_string(), to_jinja(c, v, 3));
        }
    } else {
        let mut names: Vec<String> = tmpl.undeclared_variables(true).into_iter().collect();
        names.sort();
        for path in names {
            let parts: Vec<&str> = path.split('.').collect();
            // walk the whole dotted path so every value it needs exists before rendering
            let Some((root_name, value)) = lookup_path(c, &parts)? else {
                continue;
            };
            let _ = value;
            let root_value = c.lookup(&root_name)?;
            if let Some(v) = root_value {
                let key = root_name
                    .split("::")
                    .next()
                    .unwrap_or(&root_name)
                    .to_string();
                if root_name.contains("::") {
                    // `std::linux` written `std.linux`: nest under the namespace name
                    let inner = root_name.split("::").nth(1).unwrap_or("").to_string();
                    let mut m = BTreeMap::new();
                    m.insert(inner, to_jinja(c, &v, 3));
                    ctx.insert(key, minijinja::Value::from(m));
                } else {
                    ctx.insert(key, to_jinja(c, &v, 3));
                }
            }
        }
    }
    match tmpl.render(minijinja::Value::from(ctx)) {
        Ok(s) => Ok(Value::string(s)),
        Err(e) => Err(fail(a, "std::template", format!("{e}"))),
    }
}

/// Walk a dotted path (`host.os.name`, or `std.linux` for `std::linux`).
fn lookup_path(c: &mut dyn Caller, parts: &[&str]) -> Outcome<Option<(String, Value)>> {
    let mut root = parts[0].to_string();
    let mut rest = &parts[1..];
    let mut v = c.lookup(&root)?;
    if v.is_none() && !rest.is_empty() {
        let candidate = format!("{}::{}", parts[0], parts[1]);
        if let Some(found) = c.lookup(&candidate)? {
            root = candidate;
            rest = &parts[2..];
            v = Some(found);
        }
    }
    let Some(mut cur) = v else { return Ok(None) };
    for p in rest {
        let Value::Instance(_) = cur else { break };
        let Some(sym) = c.program().syms.get(p) else {
            break;
        };
        // an attribute for a template: an optional relation left empty reads as None
        cur = match c.read_attr_or_empty(&cur, sym, "value") {
            Ok(v) => v.unwrap_or(Value::Null),
            Err(Stop::Err(_)) => break,
            Err(b) => return Err(b),
        };
    }
    Ok(Some((root, cur)))
}

fn to_jinja(c: &dyn Caller, v: &Value, depth: u32) -> minijinja::Value {
    match v {
        Value::Null | Value::Unknown => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Int(i) => minijinja::Value::from(*i),
        Value::BigInt(b) => minijinja::Value::from(b.to_string()),
        Value::Float(f) => minijinja::Value::from(*f),
        Value::Str(s) => minijinja::Value::from(s.to_string()),
        Value::List(l) => {
            minijinja::Value::from(l.iter().map(|x| to_jinja(c, x, depth)).collect::<Vec<_>>())
        }
        // in the model's order, as a Python dict iterates
        Value::Dict(d) => minijinja::Value::from(
            d.iter()
                .map(|(k, x)| (minijinja::Value::from(&**k), to_jinja(c, x, depth)))
                .collect::<IndexMap<_, _>>(),
        ),
        Value::Instance(i) => instance_map(c, *i, depth),
    }
}

fn instance_map(c: &dyn Caller, inst: InstId, depth: u32) -> minijinja::Value {
    if depth == 0 {
        return minijinja::Value::from(c.names().inst_str(inst));
    }
    let mut m: BTreeMap<String, minijinja::Value> = BTreeMap::new();
    for (name, v) in c.attributes_so_far(inst) {
        m.insert(name, to_jinja(c, &v, depth - 1));
    }
    minijinja::Value::from(m)
}

/// `{{ value }}` as Jinja2 shows the reference's values: `str()` of the value, which for the
/// model's lists and dicts is the proxy's `@[…]` / `@{…}` (LANGUAGE.md §15.4, `std::print`).
fn python_formatter(
    out: &mut minijinja::Output,
    _: &mut minijinja::State,
    value: &minijinja::Value,
) -> Result<(), minijinja::Error> {
    let text = match value.as_str() {
        Some(s) => s.to_string(),
        None => pyfmt::print_text(&from_jinja(value), &NoInstances),
    };
    out.write_str(&text)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::WriteFailure, e.to_string()))
}

/// A template value back as a model value, to show it as Python would.
fn from_jinja(v: &minijinja::Value) -> Value {
    use minijinja::value::ValueKind;
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => Value::Null,
        ValueKind::Bool => Value::Bool(v.is_true()),
        ValueKind::Number if v.is_integer() => match v.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::string(v.to_string()),
        },
        ValueKind::Number => Value::Float(f64::try_from(v.clone()).unwrap_or(f64::NAN)),
        ValueKind::String => Value::string(v.as_str().unwrap_or("").to_string()),
        ValueKind::Map => {
            let mut d = crate::compiler::value::Dict::default();
            if let Ok(keys) = v.try_iter() {
                for k in keys {
                    let item = v.get_item(&k).unwrap_or_default();
                    let key = k
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| k.to_string());
                    d.insert(key.into(), from_jinja(&item));
                }
            }
            Value::Dict(std::rc::Rc::new(d))
        }
        ValueKind::Seq | ValueKind::Iterable => Value::list(
            v.try_iter()
                .map(|it| it.map(|x| from_jinja(&x)).collect())
                .unwrap_or_default(),
        ),
        _ => Value::string(v.to_string()),
    }
}

/// Template values hold no instances (they became maps of their attributes).
struct NoInstances;

impl pyfmt::InstanceText for NoInstances {
    fn inst_repr(&self, _: InstId) -> String {
        String::new()
    }
    fn inst_str(&self, _: InstId) -> String {
        String::new()
    }
}
