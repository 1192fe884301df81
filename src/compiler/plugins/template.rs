//! `std::template(path, **kwargs)`: render a Jinja template from a module's `templates/` with
//! minijinja.
//!
//! Without keyword arguments the template sees the variables in scope at the call (`::` is
//! written `.`). The variables the template uses are resolved through the caller first — a
//! value that does not exist yet makes the call wait, as any plugin argument would — and then
//! handed to minijinja; instances become maps of their attributes.

use std::collections::BTreeMap;

use super::files::resolve_module_path;
use super::{Args, Caller, Outcome, PluginDef, Stop, fail, req};
use crate::compiler::value::{InstId, Value};

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
        Value::Dict(d) => {
            let m: BTreeMap<String, minijinja::Value> = d
                .iter()
                .map(|(k, x)| (k.to_string(), to_jinja(c, x, depth)))
                .collect();
            minijinja::Value::from(m)
        }
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
