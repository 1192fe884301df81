//! Python plugins of Inmanta modules (`@plugin` functions), and what else the compiler learns
//! from a module's Python without running it.
//!
//! The module's sources are read, not imported: the decorators `@plugin`, `@resource` and
//! `@provider` and the `def` lines under them give the plugins' names and signatures (type
//! strings or annotations), the resource types defined in Python and the types with a
//! Python handler. So the compiler knows every name at no cost, and the plugin host
//! ([`super::pyhost`]) starts only when a Python plugin is called or a Python resource is
//! exported. A call binds and type-checks its arguments here, with the reference's rules, then
//! runs in the host, which asks back for attributes of the instances it reads.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde_json::{Map, Value as Json, json};

use super::pyhost::{Answer, PyModel, Reply};
use super::{Caller, Outcome, Stop, Wait, check_dsl_type};
use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::ids::EntityId;
use crate::compiler::program::Program;
use crate::compiler::source::Span;
use crate::compiler::value::{InstId, Value};

pub use crate::compiler::program::{PyParam, PyPlugin};

/// What a module's Python defines.
#[derive(Clone, Debug, Default)]
pub struct ModulePython {
    pub plugins: Vec<PyPlugin>,
    /// Entity types with an `@resource` class.
    pub resources: Vec<String>,
    /// Entity types with an `@provider` handler.
    pub providers: Vec<String>,
    /// Every Python file of the package: (path relative to the package dir, absolute path).
    pub files: Vec<(String, PathBuf)>,
    /// The Python modules of those files (`inmanta_plugins.files`,
    /// `inmanta_plugins.files.directory`, …), the package first: as the reference, a compile
    /// and a handler host import all of them, so what a submodule registers is there even when
    /// the package's `__init__` does not import it.
    pub python_modules: Vec<String>,
}

/// Read the package of module `name` in `dir` (its `__init__.py` and submodules).
pub fn scan_module(name: &str, dir: &Path) -> ModulePython {
    let mut out = ModulePython::default();
    let mut files = Vec::new();
    collect_py(dir, dir, &mut files);
    files.sort();
    for (rel, abs) in files {
        let Ok(text) = std::fs::read_to_string(&abs) else {
            continue;
        };
        let mut parts: Vec<&str> = vec![name];
        let stem = rel.strip_suffix(".py").unwrap_or(&rel);
        for p in stem.split('/') {
            if p != "__init__" {
                parts.push(p);
            }
        }
        let module = format!("inmanta_plugins.{}", parts.join("."));
        let namespace = parts.join("::");
        scan_source(&text, &namespace, &module, &mut out);
        out.files.push((rel, abs));
        out.python_modules.push(module);
    }
    // the package itself first (its `__init__` may set up what the submodules use)
    let package = format!("inmanta_plugins.{name}");
    out.python_modules.sort_by_key(|m| *m != package);
    out.python_modules.dedup();
    out
}

fn collect_py(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "__pycache__" {
            continue;
        }
        let path = e.path();
        if path.is_dir() {
            // only packages (and not the model or data directories of a V2 module)
            if path.join("__init__.py").is_file() {
                collect_py(root, &path, out);
            }
        } else if name.ends_with(".py")
            && let Ok(rel) = path.strip_prefix(root)
        {
            out.push((rel.to_string_lossy().replace('\\', "/"), path.clone()));
        }
    }
}

/// Split `s` at top-level occurrences of `sep` (outside brackets and string literals).
fn split_top(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            cur.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => {
                quote = Some(c);
                cur.push(c);
            }
            '(' | '[' | '{' => {
                depth += 1;
                cur.push(c);
            }
            ')' | ']' | '}' => {
                depth -= 1;
                cur.push(c);
            }
            c if c == sep && depth == 0 => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// A line without its trailing comment (a `#` outside string literals), trimmed at the end:
/// `def f(x: "string") -> "string":  # type: ignore` ends with its colon.
fn code_part(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '#' => return line[..i].trim_end(),
            '"' | '\'' => quote = Some(c),
            _ => {}
        }
    }
    line.trim_end()
}

/// Bracket depth change of a line, ignoring strings and comments; `None` inside a string
/// that does not end on the line (triple quotes: treated as balanced).
fn depth_delta(line: &str) -> i32 {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == '\\' {
                chars.next();
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '#' => break,
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    depth
}

fn string_literal(s: &str) -> Option<String> {
    let s = s.trim();
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return Some(s[1..s.len() - 1].to_string());
        }
    }
    None
}

struct Decorator {
    name: String,
    args: Vec<String>,
}

impl Decorator {
    /// The entity type a `@resource`/`@provider` decorator names: its first argument when
    /// positional, else the one given as `keyword=`.
    fn type_argument(&self, keyword: &str) -> Option<String> {
        let first = self.args.first()?;
        if let Some(t) = string_literal(first) {
            return Some(t);
        }
        self.args.iter().find_map(|a| {
            let (k, v) = a.split_once('=')?;
            (k.trim() == keyword).then(|| string_literal(v.trim()))?
        })
    }
}

fn parse_decorator(text: &str) -> Decorator {
    let t = text.trim().trim_start_matches('@').trim();
    let (name, args) = match t.find('(') {
        Some(i) => {
            let inner = t[i + 1..].trim_end();
            let inner = inner.strip_suffix(')').unwrap_or(inner);
            (t[..i].trim(), split_top(inner, ','))
        }
        None => (t, Vec::new()),
    };
    let name = name.rsplit('.').next().unwrap_or(name).to_string();
    Decorator {
        name,
        args: args
            .into_iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect(),
    }
}

fn scan_source(text: &str, namespace: &str, module: &str, out: &mut ModulePython) {
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    let mut decorators: Vec<Decorator> = Vec::new();
    while i < lines.len() {
        let line = code_part(lines[i]);
        if line.starts_with('@') {
            let mut text = line.to_string();
            let mut depth = depth_delta(line);
            while depth > 0 && i + 1 < lines.len() {
                i += 1;
                text.push(' ');
                text.push_str(code_part(lines[i]).trim());
                depth += depth_delta(lines[i]);
            }
            decorators.push(parse_decorator(&text));
            i += 1;
            continue;
        }
        if (line.starts_with("def ") || line.starts_with("async def ")) && !decorators.is_empty() {
            let mut text = line.to_string();
            let mut depth = depth_delta(line);
            while (depth > 0 || !text.trim_end().ends_with(':')) && i + 1 < lines.len() {
                i += 1;
                text.push(' ');
                text.push_str(code_part(lines[i]).trim());
                depth += depth_delta(lines[i]);
                if depth <= 0 && text.trim_end().ends_with(':') {
                    break;
                }
            }
            for d in &decorators {
                if d.name == "plugin"
                    && let Some(p) = parse_def(&text, d, namespace, module)
                {
                    out.plugins.push(p);
                }
            }
            decorators.clear();
        } else if line.starts_with("class ") {
            for d in &decorators {
                // resource(name, id_attribute, agent) and provider(resource_type, name), the
                // type positional or by keyword (`@resource(name="files::Directory", ...)`)
                match d.name.as_str() {
                    "resource" => out.resources.extend(d.type_argument("name")),
                    "provider" => out.providers.extend(d.type_argument("resource_type")),
                    _ => {}
                }
            }
            decorators.clear();
        } else if !line.trim().is_empty() && !line.starts_with('#') && !line.starts_with(' ') {
            decorators.clear();
        }
        i += 1;
    }
}

/// A Python annotation as a DSL type: (type, nullable, is Context).
fn annotation_type(ann: &str) -> (String, bool, bool) {
    let ann = ann.trim();
    if let Some(s) = string_literal(ann) {
        if s == "Context" {
            return ("any".into(), false, true);
        }
        return match s.strip_suffix('?') {
            Some(base) => (base.to_string(), true, false),
            None => (s, false, false),
        };
    }
    if ann == "Context" || ann.ends_with(".Context") {
        return ("any".into(), false, true);
    }
    // X | None
    let alts = split_top(ann, '|');
    if alts.len() > 1 {
        let rest: Vec<&str> = alts
            .iter()
            .map(|a| a.trim())
            .filter(|a| *a != "None")
            .collect();
        if rest.len() == 1 {
            let (t, _, _) = annotation_type(rest[0]);
            return (t, true, false);
        }
        return ("any".into(), true, false);
    }
    let (head, inner) = match ann.find('[') {
        Some(i) if ann.ends_with(']') => (
            ann[..i].rsplit('.').next().unwrap_or(""),
            Some(&ann[i + 1..ann.len() - 1]),
        ),
        _ => (ann.rsplit('.').next().unwrap_or(ann), None),
    };
    let prim = |t: &str| -> Option<&'static str> {
        Some(match t.trim().rsplit('.').next().unwrap_or("") {
            "str" => "string",
            "int" => "int",
            "float" => "float",
            "bool" => "bool",
            _ => return None,
        })
    };
    match (head, inner) {
        ("Optional", Some(x)) => {
            let (t, _, _) = annotation_type(x);
            (t, true, false)
        }
        ("Annotated", Some(x)) => {
            let parts = split_top(x, ',');
            let model = parts.iter().skip(1).find_map(|p| {
                let p = p.trim();
                let i = p.find("ModelType[")?;
                string_literal(p[i + "ModelType[".len()..].trim_end_matches(']'))
            });
            match model {
                Some(m) => (m, false, false),
                None => annotation_type(&parts[0]),
            }
        }
        ("list" | "List" | "Sequence" | "MutableSequence", Some(x)) => match prim(x) {
            Some(p) => (format!("{p}[]"), false, false),
            None => ("list".into(), false, false),
        },
        ("list" | "List" | "Sequence" | "tuple" | "Tuple", None) => ("list".into(), false, false),
        ("dict" | "Dict" | "Mapping" | "MutableMapping", _) => ("dict".into(), false, false),
        ("None", None) => ("null".into(), false, false),
        (h, None) => match prim(h) {
            Some(p) => (p.into(), false, false),
            None => ("any".into(), false, false),
        },
        _ => ("any".into(), false, false),
    }
}

fn parse_def(text: &str, deco: &Decorator, namespace: &str, module: &str) -> Option<PyPlugin> {
    let t = text
        .trim_start_matches("async ")
        .trim_start_matches("def ")
        .trim();
    let open = t.find('(')?;
    let fname = t[..open].trim().to_string();
    // the matching parenthesis
    let mut depth = 0;
    let mut close = None;
    let mut quote: Option<char> = None;
    let mut prev = '\0';
    for (i, c) in t.char_indices().skip(open) {
        if let Some(q) = quote {
            if c == q && prev != '\\' {
                quote = None;
            }
            prev = c;
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(i);
                    break;
                }
            }
            _ => {}
        }
        prev = c;
    }
    let close = close?;
    let params_text = &t[open + 1..close];
    let after = t[close + 1..].trim();
    let (returns, returns_nullable) = match after.strip_prefix("->") {
        Some(r) => {
            let r = r.trim().trim_end_matches(':').trim();
            let (ty, nullable, _) = annotation_type(r);
            (ty, nullable)
        }
        None => ("any".to_string(), false),
    };
    let mut name = fname.clone();
    let mut allow_unknown = false;
    for a in &deco.args {
        if let Some(s) = string_literal(a) {
            name = s;
        } else if let Some((k, v)) = a.split_once('=') {
            let (k, v) = (k.trim(), v.trim());
            if k == "allow_unknown" {
                allow_unknown = v == "True";
            } else if k == "function"
                && let Some(s) = string_literal(v)
            {
                name = s;
            }
        }
    }
    let mut plugin = PyPlugin {
        namespace: namespace.to_string(),
        name,
        module: module.to_string(),
        params: Vec::new(),
        positional_names: Vec::new(),
        var_args: false,
        var_kwargs: false,
        context: None,
        allow_unknown,
        returns,
        returns_nullable,
    };
    let mut kw_only = false;
    for p in split_top(params_text, ',') {
        let p = p.trim();
        if p.is_empty() || p == "/" {
            continue;
        }
        if p == "*" {
            kw_only = true;
            continue;
        }
        if p.starts_with("**") {
            plugin.var_kwargs = true;
            continue;
        }
        if p.starts_with('*') {
            plugin.var_args = true;
            kw_only = true;
            continue;
        }
        let eq = split_top(p, '=');
        let has_default = eq.len() > 1;
        let decl = eq[0].trim();
        let (pname, ann) = match decl.split_once(':') {
            Some((n, a)) => (n.trim().to_string(), Some(a.trim().to_string())),
            None => (decl.to_string(), None),
        };
        let (ty, nullable, is_context) = match &ann {
            Some(a) => annotation_type(a),
            None => ("any".into(), false, false),
        };
        if !kw_only {
            plugin.positional_names.push(pname.clone());
        }
        if is_context {
            plugin.context = Some(pname);
            continue;
        }
        plugin.params.push(PyParam {
            name: pname,
            ty,
            nullable,
            has_default,
            kw_only,
        });
    }
    Some(plugin)
}

fn args_error(msg: impl Into<String>, span: Span) -> Stop {
    Diagnostic::error("plugin-args", msg).at(span).into()
}

/// The model as the plugin host sees it during one call.
struct CallModel<'a> {
    caller: &'a mut dyn Caller,
    /// The call site (of built-in plugins the Python code calls, too).
    span: Span,
    wait: Option<Wait>,
    err: Option<Stop>,
}

impl PyModel for CallModel<'_> {
    fn program(&self) -> &Program {
        self.caller.program()
    }

    fn entity_of(&self, inst: InstId) -> EntityId {
        self.caller.instance_entity(inst)
    }

    fn frozen(&self, inst: InstId) -> Vec<(String, Value)> {
        self.caller.frozen_attributes(inst)
    }

    fn read(&mut self, inst: InstId, attr: &str) -> Answer {
        let e = self.caller.instance_entity(inst);
        let p = self.caller.program();
        let Some(sym) = p.syms.get(attr).filter(|s| p.entity(e).slot(*s).is_some()) else {
            return Answer::Missing(format!(
                "'{}' has no attribute '{attr}'",
                p.entity(e).full_name
            ));
        };
        match self
            .caller
            .read_attr_or_empty(&Value::Instance(inst), sym, attr)
        {
            Ok(Some(v)) => Answer::Value(v),
            Ok(None) => Answer::Empty,
            Err(Stop::Wait(w)) => {
                self.wait = Some(w);
                Answer::Unset
            }
            Err(e @ Stop::Err(_)) => {
                let msg = match &e {
                    Stop::Err(d) => d.message.clone(),
                    Stop::Wait(_) => String::new(),
                };
                self.err = Some(e);
                Answer::Err(msg)
            }
        }
    }

    fn file(&mut self, dir: &str, path: &str) -> Result<(String, String), String> {
        let path = path.trim_start_matches('/');
        let (module, rest) = path.split_once('/').unwrap_or(("", path));
        self.caller.host().module_file(module, dir, rest)
    }

    fn remember_resource_id(&mut self, inst: InstId, id: String) {
        if (inst.0 as usize) < self.caller.instance_count() {
            self.caller.host().remember_resource_id(inst, id);
        }
    }

    fn builtin(&mut self, plugin: &str, args: &Json, kwargs: &Json) -> Answer {
        let (namespace, name) = plugin.rsplit_once("::").unwrap_or(("", plugin));
        let Some(id) = super::find(namespace, name) else {
            return Answer::Err(format!("module {namespace} has no plugin {name}"));
        };
        let instances = self.caller.instance_count();
        let decode = |j: &Json| super::pyhost::decode(j, instances);
        let positional = match args.as_array().map(|a| a.iter().map(decode).collect()) {
            Some(Ok(v)) => v,
            Some(Err(e)) => return Answer::Err(e),
            None => Vec::new(),
        };
        let mut named: Vec<(Rc<str>, Value)> = Vec::new();
        for (k, v) in kwargs.as_object().into_iter().flatten() {
            match decode(v) {
                Ok(v) => named.push((Rc::from(k.as_str()), v)),
                Err(e) => return Answer::Err(e),
            }
        }
        match super::call(self.caller, id, positional, named, self.span) {
            Ok(v) => Answer::Value(v),
            Err(Stop::Wait(w)) => {
                self.wait = Some(w);
                Answer::Unset
            }
            // Python gets the exception (and may handle it)
            Err(Stop::Err(d)) => Answer::Err(d.message),
        }
    }
}

/// Call a Python plugin: bind, check, run in the host, check the result.
pub fn call(
    def: &PyPlugin,
    caller: &mut dyn Caller,
    positional: Vec<Value>,
    kwargs: Vec<(Rc<str>, Value)>,
    span: Span,
) -> Outcome<Value> {
    let full = def.full_name();
    let n_pos = def.params.iter().filter(|p| !p.kw_only).count();
    if positional.len() > n_pos && !def.var_args {
        return Err(args_error(
            format!(
                "{full}() takes {n_pos} positional arguments but {} were given",
                positional.len()
            ),
            span,
        ));
    }
    let mut bound: Vec<Option<Value>> = vec![None; def.params.len()];
    let mut varargs = Vec::new();
    for (i, v) in positional.into_iter().enumerate() {
        if i < n_pos {
            bound[i] = Some(v);
        } else {
            varargs.push(v);
        }
    }
    let mut extra = Vec::new();
    for (k, v) in kwargs {
        match def.params.iter().position(|p| p.name == *k) {
            Some(i) if bound[i].is_some() => {
                return Err(args_error(
                    format!("{full}() got multiple values for argument '{k}'"),
                    span,
                ));
            }
            Some(i) => bound[i] = Some(v),
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
        .zip(&bound)
        .filter(|(p, b)| b.is_none() && !p.has_default)
        .map(|(p, _)| p.name.as_str())
        .collect();
    if !missing.is_empty() {
        let quoted: Vec<String> = missing.iter().map(|m| format!("'{m}'")).collect();
        return Err(args_error(
            format!(
                "{full}() missing {} required positional argument{}: {}",
                missing.len(),
                if missing.len() == 1 { "" } else { "s" },
                quoted.join(", ")
            ),
            span,
        ));
    }
    // as the reference: an unknown argument makes the call unknown, unless the plugin
    // accepts unknowns (unknowns deeper in a value reach the plugin)
    let unknown = bound.iter().flatten().any(Value::is_unknown)
        || varargs.iter().any(Value::is_unknown)
        || extra.iter().any(|(_, v)| v.is_unknown());
    if unknown && !def.allow_unknown {
        return Ok(Value::Unknown);
    }
    for (p, v) in def.params.iter().zip(&bound) {
        let Some(v) = v else { continue };
        if v.is_null() && (p.nullable || p.ty == "null") {
            continue;
        }
        if let Err(msg) = check_dsl_type(caller, v, &p.ty) {
            return Err(args_error(
                format!("{msg} (argument '{}' of {full})", p.name),
                span,
            ));
        }
    }
    let mut host = match caller.host().take_python() {
        Ok(h) => h,
        Err(e) => {
            return Err(Diagnostic::error(
                "plugin",
                format!("Exception in plugin {full}\ncaused by: {e}"),
            )
            .at(span)
            .into());
        }
    };
    let mut model = CallModel {
        caller,
        span,
        wait: None,
        err: None,
    };
    let mut kw = Map::new();
    for (p, v) in def.params.iter().zip(&bound) {
        if let Some(v) = v {
            kw.insert(p.name.clone(), host.encode(v, &model, true));
        }
    }
    for (k, v) in &extra {
        kw.insert(k.to_string(), host.encode(v, &model, true));
    }
    let mut msg = json!({
        "op": "call",
        "plugin": full,
        "module": def.module,
        "kwargs": kw,
        "context": def.context,
    });
    if !varargs.is_empty() {
        let va: Vec<Json> = varargs
            .iter()
            .map(|v| host.encode(v, &model, true))
            .collect();
        msg["varargs"] = Json::Array(va);
        msg["positional"] = json!(def.positional_names);
    }
    let reply = host.request(&msg, &mut model);
    let CallModel {
        caller, wait, err, ..
    } = model;
    caller.host().put_python(host);
    let fail = |text: String| -> Stop {
        Diagnostic::error(
            "plugin",
            format!("Exception in plugin {full}\ncaused by: {text}"),
        )
        .at(span)
        .into()
    };
    let reply = reply.map_err(&fail)?;
    match reply {
        Reply::Ok(j) => {
            let v = super::pyhost::decode(&j, caller.instance_count()).map_err(&fail)?;
            if !v.is_unknown()
                && !(v.is_null() && (def.returns_nullable || def.returns == "null"))
                && !matches!(def.returns.as_str(), "any" | "expression")
                && let Err(msg) = check_dsl_type(caller, &v, &def.returns)
            {
                return Err(fail(format!("return value: {msg}")));
            }
            Ok(v)
        }
        Reply::Unknown => Ok(Value::Unknown),
        Reply::Unset => match (err, wait) {
            (Some(e), _) => Err(e),
            (None, Some(w)) => Err(Stop::Wait(w)),
            (None, None) => Err(fail(
                "the plugin read an attribute that is not set (UnsetException)".into(),
            )),
        },
        Reply::Error {
            kind,
            message,
            traceback,
        } => {
            if let Some(e) = err {
                return Err(e);
            }
            let head = if kind == "PluginException" {
                format!("PluginException in plugin {full}\ncaused by: {message}")
            } else {
                format!("Exception in plugin {full}\ncaused by: {kind}: {message}")
            };
            Err(
                Diagnostic::error("plugin", format!("{head}\n{}", traceback.trim_end()))
                    .at(span)
                    .into(),
            )
        }
    }
}

/// The resource id of `inst`, an instance of a type an `@resource` class of a module's Python
/// defines, computed there (`inmanta.resources.to_id`: the agent path, the id attribute
/// through the class's mappers), for `plugin` calling at `span`. Waits as a Python plugin
/// reading the attributes would.
pub fn resource_id(
    caller: &mut dyn Caller,
    inst: InstId,
    plugin: &str,
    span: Span,
) -> Outcome<super::facts::Id> {
    use super::facts::Id;
    let fail = |text: String| -> Stop {
        Diagnostic::error(
            "plugin",
            format!("Exception in plugin {plugin}\ncaused by: {text}"),
        )
        .at(span)
        .into()
    };
    let mut host = caller.host().take_python().map_err(&fail)?;
    let mut model = CallModel {
        caller,
        span,
        wait: None,
        err: None,
    };
    let item = host.encode(&Value::Instance(inst), &model, true);
    let reply = host.request(&json!({"op": "to_id", "item": item}), &mut model);
    let CallModel {
        caller, wait, err, ..
    } = model;
    caller.host().put_python(host);
    match reply.map_err(&fail)? {
        Reply::Ok(Json::String(id)) => Ok(Id::Known(id)),
        Reply::Ok(_) => Ok(Id::NotAResource),
        Reply::Unknown => Ok(Id::Unknown),
        Reply::Unset => match (err, wait) {
            (Some(e), _) => Err(e),
            (None, Some(w)) => Err(Stop::Wait(w)),
            (None, None) => Err(fail(
                "the resource id needs an attribute that is not set (UnsetException)".into(),
            )),
        },
        Reply::Error {
            kind,
            message,
            traceback,
        } => {
            Err(err.unwrap_or_else(|| fail(format!("{kind}: {message}\n{}", traceback.trim_end()))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the real exec module writes it: a trailing comment after the colon of a plugin's
    /// `def` must not swallow the declarations that follow.
    #[test]
    fn trailing_comments_do_not_hide_what_follows() {
        let src = r#"
@inmanta.plugins.plugin()
def in_shell(command: "string") -> "string":  # type: ignore
    return command


@inmanta.resources.resource("exec::Run", agent="host.name", id_attribute="command")  # the run
class Run(ResourceABC):
    fields = ("command",)  # "quoted # not a comment"


@inmanta.agent.handler.provider("exec::Run", name="posix")
class PosixRunHandler(HandlerABC[Run]):
    pass
"#;
        let mut out = ModulePython::default();
        scan_source(src, "exec", "inmanta_plugins.exec", &mut out);
        assert_eq!(out.plugins.len(), 1);
        assert_eq!(out.resources, ["exec::Run"]);
        assert_eq!(out.providers, ["exec::Run"]);
        assert_eq!(code_part(r#"x = "a # b"  # c"#), r#"x = "a # b""#);
        assert_eq!(code_part(r"x = 'it\'s # here'"), r"x = 'it\'s # here'");
    }

    /// As the public files module writes them: the type given by keyword, over several lines.
    #[test]
    fn resource_and_provider_types_given_by_keyword() {
        let src = r#"
@inmanta.resources.resource(
    name="files::Directory",
    id_attribute="path",
    agent="host.name",
)
class DirectoryResource(BaseFileResource):
    fields = ("create_parents",)


@inmanta.agent.handler.provider(resource_type="files::Directory", name="")
class DirectoryHandler(BaseFileHandler[DirectoryResource]):
    pass
"#;
        let mut out = ModulePython::default();
        scan_source(src, "files", "inmanta_plugins.files.directory", &mut out);
        assert_eq!(out.resources, ["files::Directory"]);
        assert_eq!(out.providers, ["files::Directory"]);
    }
}
