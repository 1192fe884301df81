//! `std::template(path, **kwargs)`: render a Jinja template from a module's `templates/` with
//! minijinja.
//!
//! Without keyword arguments the template sees the variables in scope at the call (`::` is
//! written `.`). The variables the template uses are resolved through the runtime first — a
//! value that does not exist yet makes the call wait, as any plugin argument would — and then
//! handed to minijinja; instances become maps of their attributes.

use std::collections::BTreeMap;

use super::std_lib::resolve_module_path;
use super::{Args, PluginDef, fail, req};
use crate::compiler::eval::expr::Cx;
use crate::compiler::eval::state::{NONE, RvState};
use crate::compiler::eval::{Eval, Runtime, Stop};
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

fn render(rt: &mut Runtime, cx: &mut Cx, a: &mut Args) -> Eval<Value> {
    let path = a.values[0].as_str().unwrap_or("").to_string();
    let (module, rest) = resolve_module_path(rt, cx, &path, a, "std::template")?;
    let source = match rt.host.module_file(&module, "templates", &rest) {
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
            ctx.insert(k.to_string(), to_jinja(rt, v, 3));
        }
    } else {
        let mut names: Vec<String> = tmpl.undeclared_variables(true).into_iter().collect();
        names.sort();
        for path in names {
            let parts: Vec<&str> = path.split('.').collect();
            // walk the whole dotted path so every value it needs exists before rendering
            let Some((root_name, value)) = lookup_path(rt, cx, &parts, a)? else {
                continue;
            };
            let _ = value;
            let root_value = lookup_root(rt, cx, &root_name, a)?;
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
                    m.insert(inner, to_jinja(rt, &v, 3));
                    ctx.insert(key, minijinja::Value::from(m));
                } else {
                    ctx.insert(key, to_jinja(rt, &v, 3));
                }
            }
        }
    }
    match tmpl.render(minijinja::Value::from(ctx)) {
        Ok(s) => Ok(Value::string(s)),
        Err(e) => Err(fail(a, "std::template", format!("{e}"))),
    }
}

/// Resolve `name` as the model would at the call site: block variables, the instance's
/// attributes, then the namespace's top-level variables.
fn lookup_root(rt: &mut Runtime, cx: &Cx, name: &str, a: &Args) -> Eval<Option<Value>> {
    if let Some((ns, var)) = name.split_once("::") {
        let Some(nsd) = rt.p.namespaces.iter().position(|n| n.name == ns) else {
            return Ok(None);
        };
        let Some(&slot) = rt.p.namespaces[nsd].top_vars.get(var) else {
            return Ok(None);
        };
        let scope = rt.ns_scopes[nsd];
        let rv =
            crate::compiler::eval::state::RvId(rt.scopes[scope.0 as usize].rv_base + slot as u32);
        return rt.read_rv(rv, a.span).map(Some);
    }
    let mut s = cx.scope.0;
    while s != NONE {
        let sc = &rt.scopes[s as usize];
        if sc.block != NONE {
            let block = rt.p.ir.block(crate::compiler::ids::BlockId(sc.block));
            if let Some(i) = block.names.iter().position(|n| &**n == name) {
                let rv = crate::compiler::eval::state::RvId(sc.rv_base + i as u32);
                return rt.read_rv(rv, a.span).map(Some);
            }
        }
        s = sc.parent;
    }
    if let Some(inst) = rt.scope_inst(cx.scope) {
        if name == "self" {
            return Ok(Some(Value::Instance(inst)));
        }
        if let Some(sym) = rt.p.syms.get(name) {
            let e = rt.inst_entity(inst);
            if rt.p.entity(e).slot(sym).is_some() {
                return read_lenient(rt, &Value::Instance(inst), sym, a).map(Some);
            }
        }
    }
    let file = rt.p.ir.expr(a.site).span.file;
    if let Some(nsi) = rt.p.namespaces.iter().position(|n| n.file == Some(file))
        && let Some(&slot) = rt.p.namespaces[nsi].top_vars.get(name)
    {
        let scope = rt.ns_scopes[nsi];
        let rv =
            crate::compiler::eval::state::RvId(rt.scopes[scope.0 as usize].rv_base + slot as u32);
        return rt.read_rv(rv, a.span).map(Some);
    }
    Ok(None)
}

/// An attribute for a template: an optional relation frozen empty reads as None.
fn read_lenient(
    rt: &mut Runtime,
    base: &Value,
    sym: crate::compiler::ids::Sym,
    a: &Args,
) -> Eval<Value> {
    match rt.attr_rv_of(base, sym, a.span, "value")? {
        Some(rv) => match &rt.rvs[rv.0 as usize].state {
            RvState::FrozenNull => Ok(Value::Null),
            _ => rt.read_rv(rv, a.span),
        },
        None => Ok(Value::Unknown),
    }
}

/// Walk a dotted path (`host.os.name`, or `std.linux` for `std::linux`).
fn lookup_path(
    rt: &mut Runtime,
    cx: &Cx,
    parts: &[&str],
    a: &Args,
) -> Eval<Option<(String, Value)>> {
    let mut root = parts[0].to_string();
    let mut rest = &parts[1..];
    let mut v = lookup_root(rt, cx, &root, a)?;
    if v.is_none() && !rest.is_empty() {
        let candidate = format!("{}::{}", parts[0], parts[1]);
        if let Some(found) = lookup_root(rt, cx, &candidate, a)? {
            root = candidate;
            rest = &parts[2..];
            v = Some(found);
        }
    }
    let Some(mut cur) = v else { return Ok(None) };
    for p in rest {
        let Value::Instance(_) = cur else { break };
        let Some(sym) = rt.p.syms.get(p) else { break };
        cur = match read_lenient(rt, &cur, sym, a) {
            Ok(v) => v,
            Err(Stop::Err(_)) => break,
            Err(b) => return Err(b),
        };
    }
    Ok(Some((root, cur)))
}

fn to_jinja(rt: &Runtime, v: &Value, depth: u32) -> minijinja::Value {
    match v {
        Value::Null | Value::Unknown => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Int(i) => minijinja::Value::from(*i),
        Value::BigInt(b) => minijinja::Value::from(b.to_string()),
        Value::Float(f) => minijinja::Value::from(*f),
        Value::Str(s) => minijinja::Value::from(s.to_string()),
        Value::List(l) => {
            minijinja::Value::from(l.iter().map(|x| to_jinja(rt, x, depth)).collect::<Vec<_>>())
        }
        Value::Dict(d) => {
            let m: BTreeMap<String, minijinja::Value> = d
                .iter()
                .map(|(k, x)| (k.to_string(), to_jinja(rt, x, depth)))
                .collect();
            minijinja::Value::from(m)
        }
        Value::Instance(i) => instance_map(rt, *i, depth),
    }
}

fn instance_map(rt: &Runtime, inst: InstId, depth: u32) -> minijinja::Value {
    if depth == 0 {
        return minijinja::Value::from(rt.inst_site_text(inst));
    }
    let e = rt.inst_entity(inst);
    let ent = rt.p.entity(e);
    let mut m: BTreeMap<String, minijinja::Value> = BTreeMap::new();
    for (slot, aid) in ent.slots.iter().enumerate() {
        let rv = rt.attr_rv(inst, slot as u16);
        let name = rt.p.attr(*aid).name.clone();
        match &rt.rvs[rv.0 as usize].state {
            RvState::Set(v) => {
                m.insert(name, to_jinja(rt, v, depth - 1));
            }
            RvState::FrozenNull => {
                m.insert(name, minijinja::Value::from(()));
            }
            RvState::Unset => {
                if rt.is_delayed(rv) && !rt.dl(rv).items.is_empty() {
                    let items: Vec<minijinja::Value> = rt
                        .dl(rv)
                        .items
                        .iter()
                        .map(|i| instance_map(rt, *i, depth - 1))
                        .collect();
                    m.insert(name, minijinja::Value::from(items));
                }
            }
        }
    }
    minijinja::Value::from(m)
}
