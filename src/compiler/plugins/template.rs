//! `std::template(path, **kwargs)`: render a Jinja template from a module's `templates/` with
//! minijinja.
//!
//! Without keyword arguments the template sees the variables in scope at the call (`::` is
//! written `.`), resolved through the caller first (a value that does not exist yet makes the
//! call wait, as any plugin argument would). Dicts keep the model's order. As in Jinja2, dicts,
//! lists and strings have Python's methods (`d.get(k, default)`, `d.items()`, `d.keys()`,
//! `d.values()`, `s.upper()`, … through minijinja-contrib's pycompat), and `{{ value }}` shows
//! what the reference shows: Python's `str()` (`None`, `True`, and the model's lists and dicts
//! as `@[…]`/`@{…}`).
//!
//! Instances behave as the reference's proxies: an attribute is read when the template reads
//! it, waiting for its complete value. std's template reaches the variables in scope through
//! its Jinja proxy, where an optional relation left empty, or an attribute the entity does not
//! have, is undefined (`is defined` is false: the files module's systemd unit template relies
//! on it); keyword arguments, list items and dict values are plain proxies, as plugin
//! arguments are: a missing attribute is undefined there too (the proxy raises an
//! `AttributeError`), but reading an empty optional relation fails as it does in the model. Every plugin is a filter too, as the reference registers
//! them: `ns::name` written `ns.name`, called with the piped value first
//! (`{{ keys | std.key_sort("name") }}`). Both need the caller, which minijinja can not hold
//! during a render, so a render notes the attributes and filter calls it has no value for yet
//! (using a placeholder in their place), the call reads and calls them, and the template
//! renders again, until a render needs nothing new. Its text is the last render's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use indexmap::IndexMap;
use minijinja::value::{Object, ObjectRepr, Rest};

use super::files::resolve_module_path;
use super::{Args, Caller, Outcome, PluginDef, Stop, fail, req};
use crate::compiler::types::TypeRef;
use crate::compiler::value::{InstId, Value, pyfmt};

/// Renders a template may take to get the values it reads (each render adds at least one; a
/// chain such as `a.b.c | f` takes one per link).
const MAX_RENDERS: usize = 64;

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
    let shared = Shared::default();
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    // Python's methods on dicts, lists and strings (`d.get(k)`, `d.items()`, `s.upper()`, …)
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    for dotted in plugin_filters(c, &source) {
        let shared = shared.clone();
        let name = dotted.clone();
        env.add_filter(dotted, move |args: Rest<minijinja::Value>| {
            shared.filter(&name, args.0)
        });
    }
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
            ctx.insert(k.to_string(), to_jinja(c, v, &shared, Proxy::Plain));
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
                    m.insert(inner, to_jinja(c, &v, &shared, Proxy::Jinja));
                    ctx.insert(key, minijinja::Value::from(m));
                } else {
                    ctx.insert(key, to_jinja(c, &v, &shared, Proxy::Jinja));
                }
            }
        }
    }
    let ctx = minijinja::Value::from(ctx);
    for _ in 0..MAX_RENDERS {
        let rendered = tmpl.render(&ctx);
        let (attributes, filters) = shared.take_wanted();
        if attributes.is_empty() && filters.is_empty() {
            return match rendered {
                Ok(s) => Ok(Value::string(s)),
                Err(e) => Err(fail(a, "std::template", format!("{e}"))),
            };
        }
        for (inst, name, proxy) in attributes {
            let value = match read_attribute(c, inst, &name)? {
                Read::Value(v) => Some(to_jinja(c, &v, &shared, proxy)),
                // both proxies raise an AttributeError, which Jinja makes undefined
                Read::NoSuchAttribute => None,
                Read::Empty if proxy == Proxy::Jinja => None,
                // a plain proxy reads as the model does: the model's own error
                Read::Empty => {
                    let sym = c.program().syms.get(&name).expect("an attribute's name");
                    c.read_attr(&Value::Instance(inst), sym, "value")?;
                    unreachable!("reading an empty optional relation fails")
                }
            };
            shared.lock().attributes.insert((inst, name, proxy), value);
        }
        for (key, name, args) in filters {
            let args = args
                .iter()
                .map(|v| from_jinja(v, &mut HashMap::new()))
                .collect();
            // std's filters return their result through its Jinja proxy
            let result =
                call_filter(c, a, &name, args)?.map(|v| to_jinja(c, &v, &shared, Proxy::Jinja));
            shared.lock().filters.insert(key, result);
        }
    }
    Err(fail(
        a,
        "std::template",
        format!("the template still reads new values after {MAX_RENDERS} renders"),
    ))
}

/// What a template's renders share with the call: the attribute values and filter results
/// read so far, and those the last render asked for and did not have yet.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Resolved>>);

/// Which of the reference's proxies holds an instance in a template: std's Jinja proxy (the
/// variables in scope, and what their attributes lead to) or the plain one (keyword
/// arguments, list items, dict values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Proxy {
    Jinja,
    Plain,
}

#[derive(Default)]
struct Resolved {
    /// By instance, attribute name and proxy; `None`: undefined in the template.
    attributes: HashMap<(InstId, String, Proxy), Option<minijinja::Value>>,
    /// By filter name and arguments: the result, or the plugin's failure.
    filters: HashMap<String, Result<minijinja::Value, String>>,
    wanted_attributes: Vec<(InstId, String, Proxy)>,
    wanted_filters: Vec<FilterCall>,
}

/// A filter call a render made: its key (name and arguments), the filter, its arguments.
type FilterCall = (String, String, Vec<minijinja::Value>);

/// What a render uses in place of a value it does not have yet (its text is thrown away).
fn placeholder() -> minijinja::Value {
    minijinja::Value::from_object(Pending)
}

/// The placeholder's value: recognisable, so that no plugin is ever called with it.
#[derive(Debug)]
struct Pending;

impl Object for Pending {}

/// Does a value hold a placeholder (itself, or in a list or dict it holds)?
fn is_pending(v: &minijinja::Value) -> bool {
    use minijinja::value::ValueKind;
    if v.downcast_object_ref::<Pending>().is_some() {
        return true;
    }
    match v.kind() {
        ValueKind::Seq | ValueKind::Map
            if v.downcast_object_ref::<TemplateInstance>().is_none() =>
        {
            v.try_iter().is_ok_and(|mut items| {
                items.any(|k| is_pending(&k) || v.get_item(&k).is_ok_and(|x| is_pending(&x)))
            })
        }
        _ => false,
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Resolved> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_wanted(&self) -> (Vec<(InstId, String, Proxy)>, Vec<FilterCall>) {
        let mut r = self.lock();
        let mut attributes = std::mem::take(&mut r.wanted_attributes);
        attributes.sort();
        attributes.dedup();
        let mut filters = std::mem::take(&mut r.wanted_filters);
        filters.sort_by(|x, y| x.0.cmp(&y.0));
        filters.dedup_by(|x, y| x.0 == y.0);
        (attributes, filters)
    }

    fn attribute(&self, inst: InstId, name: &str, proxy: Proxy) -> Option<minijinja::Value> {
        let mut r = self.lock();
        match r.attributes.get(&(inst, name.to_string(), proxy)) {
            Some(v) => v.clone(),
            None => {
                r.wanted_attributes.push((inst, name.to_string(), proxy));
                Some(placeholder())
            }
        }
    }

    fn filter(
        &self,
        name: &str,
        args: Vec<minijinja::Value>,
    ) -> Result<minijinja::Value, minijinja::Error> {
        // a call on a value the render does not have yet waits for the next render, where it
        // is made with the real value: a plugin never runs on a stand-in
        if args.iter().any(is_pending) {
            return Ok(placeholder());
        }
        let mut r = self.lock();
        let key = format!("{name}{args:?}");
        match r.filters.get(&key) {
            Some(Ok(result)) => Ok(result.clone()),
            Some(Err(message)) => Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message.clone(),
            )),
            None => {
                r.wanted_filters.push((key, name.to_string(), args));
                Ok(placeholder())
            }
        }
    }
}

/// What a template reads of an instance's attribute.
enum Read {
    Value(Value),
    /// An optional relation left empty (or assigned null).
    Empty,
    NoSuchAttribute,
}

/// An attribute a template reads, as the model reads it (waiting for its complete value).
fn read_attribute(c: &mut dyn Caller, inst: InstId, name: &str) -> Outcome<Read> {
    let Some(sym) = c.program().syms.get(name) else {
        return Ok(Read::NoSuchAttribute);
    };
    let entity = c.instance_entity(inst);
    if c.program().entity(entity).slot(sym).is_none() {
        return Ok(Read::NoSuchAttribute);
    }
    Ok(
        match c.read_attr_or_empty(&Value::Instance(inst), sym, "value")? {
            Some(v) => Read::Value(v),
            None => Read::Empty,
        },
    )
}

/// The plugins a template may use as filters: those of the compile's namespaces whose dotted
/// name (`std.key_sort`, `mymod.sub.f`) the source mentions.
fn plugin_filters(c: &dyn Caller, source: &str) -> Vec<String> {
    let mut names = Vec::new();
    for ns in &c.program().namespaces {
        let prefix = ns.name.replace("::", ".");
        if !source.contains(&format!("{prefix}.")) {
            continue;
        }
        for (name, t) in &ns.types {
            let dotted = format!("{prefix}.{name}");
            if matches!(t, TypeRef::Plugin(_)) && source.contains(&dotted) {
                names.push(dotted);
            }
        }
    }
    names
}

/// Call the plugin a filter names with the piped value and the filter's arguments. The inner
/// `Err` is the plugin's failure as the template shows it.
fn call_filter(
    c: &mut dyn Caller,
    a: &Args,
    dotted: &str,
    args: Vec<Value>,
) -> Outcome<Result<Value, String>> {
    let (ns, name) = dotted.rsplit_once('.').unwrap_or(("", dotted));
    let ns = ns.replace('.', "::");
    let id = c
        .program()
        .namespaces
        .iter()
        .find(|n| n.name == ns)
        .and_then(|n| match n.types.get(name) {
            Some(TypeRef::Plugin(id)) => Some(id.0 as usize),
            _ => None,
        });
    let Some(id) = id else {
        return Ok(Err(format!("no plugin {ns}::{name}")));
    };
    match super::call(c, id, args, Vec::new(), a.span) {
        Ok(v) => Ok(Ok(v)),
        Err(Stop::Err(d)) => Ok(Err(d.message.clone())),
        Err(wait) => Err(wait),
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

/// A value for a template, held by `proxy` when it is an instance (a list's items and a
/// dict's values are always plain, as the reference's sequence and dict proxies make them).
fn to_jinja(c: &dyn Caller, v: &Value, shared: &Shared, proxy: Proxy) -> minijinja::Value {
    match v {
        Value::Null | Value::Unknown => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Int(i) => minijinja::Value::from(*i),
        Value::BigInt(b) => minijinja::Value::from(b.to_string()),
        Value::Float(f) => minijinja::Value::from(*f),
        Value::Str(s) => minijinja::Value::from(s.to_string()),
        Value::List(l) => minijinja::Value::from(
            l.iter()
                .map(|x| to_jinja(c, x, shared, Proxy::Plain))
                .collect::<Vec<_>>(),
        ),
        // in the model's order, as a Python dict iterates
        Value::Dict(d) => minijinja::Value::from(
            d.iter()
                .map(|(k, x)| {
                    (
                        minijinja::Value::from(&**k),
                        to_jinja(c, x, shared, Proxy::Plain),
                    )
                })
                .collect::<IndexMap<_, _>>(),
        ),
        Value::Instance(i) => minijinja::Value::from_object(TemplateInstance {
            inst: *i,
            text: c.names().inst_str(*i),
            shared: shared.clone(),
            proxy,
        }),
    }
}

/// An instance in a template, as the reference's proxy: its attributes are read when the
/// template reads them (the render asks the call for those it does not have yet), it shows
/// as the instance's `str()`, and a plugin used as a filter gets the instance itself.
struct TemplateInstance {
    inst: InstId,
    text: String,
    shared: Shared,
    proxy: Proxy,
}

impl std::fmt::Debug for TemplateInstance {
    // the key of a filter call: which instance, not what has been read of it
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "instance {}", self.inst.0)
    }
}

impl Object for TemplateInstance {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn get_value(self: &Arc<Self>, key: &minijinja::Value) -> Option<minijinja::Value> {
        self.shared.attribute(self.inst, key.as_str()?, self.proxy)
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
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
        None => {
            let mut texts = HashMap::new();
            let v = from_jinja(value, &mut texts);
            pyfmt::print_text(&v, &InstanceTexts(texts))
        }
    };
    out.write_str(&text)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::WriteFailure, e.to_string()))
}

/// A template value back as a model value (to pass to a plugin, or show as Python would),
/// noting the text of each instance in it.
fn from_jinja(v: &minijinja::Value, texts: &mut HashMap<InstId, String>) -> Value {
    use minijinja::value::ValueKind;
    if let Some(i) = v.downcast_object_ref::<TemplateInstance>() {
        texts.insert(i.inst, i.text.clone());
        return Value::Instance(i.inst);
    }
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
                    d.insert(key.into(), from_jinja(&item, texts));
                }
            }
            Value::Dict(std::rc::Rc::new(d))
        }
        ValueKind::Seq | ValueKind::Iterable => Value::list(
            v.try_iter()
                .map(|it| it.map(|x| from_jinja(&x, texts)).collect())
                .unwrap_or_default(),
        ),
        _ => Value::string(v.to_string()),
    }
}

/// The text of the instances in a value shown by a template.
struct InstanceTexts(HashMap<InstId, String>);

impl pyfmt::InstanceText for InstanceTexts {
    fn inst_repr(&self, inst: InstId) -> String {
        self.inst_str(inst)
    }
    fn inst_str(&self, inst: InstId) -> String {
        self.0.get(&inst).cloned().unwrap_or_default()
    }
}
