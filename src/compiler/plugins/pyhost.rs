//! The plugin host process: one CPython per compile running `python/steward_plugin_host.py`
//! with the `inmanta` compatibility package, started on first need.
//!
//! A compile that loads a module pinned in `requirements.txt` starts it ([`PyHost::boot`]) to
//! ask the interpreter's `sys.path`, and keeps it for the plugins: one interpreter per compile.
//! It imports the modules' Python when it is initialised, except a module [`deferrable`] (the
//! real std), which it imports when something needs it ([`Imports::deferred`]); a failure of
//! that import fails the request that needed it and every later one, as a failure at the
//! start.
//!
//! JSON lines over stdin/stdout (the protocol is described in the Python file). While a request
//! runs, the host may ask questions (an attribute of an instance, a module file); a
//! [`PyModel`] answers them. Values travel as JSON with `{"$e": handle, ...}` for instances,
//! `{"$u": 1}` for unknowns and `{"$d": {...}}` for dicts with `$` keys.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::rc::Rc;

use serde_json::{Map, Value as Json, json};

use crate::compiler::ids::EntityId;
use crate::compiler::program::Program;
use crate::compiler::types::AttrKind;
use crate::compiler::value::{Dict, InstId, Value};

/// How to start the host for a compile.
#[derive(Clone, Debug, Default)]
pub struct PyConfig {
    pub interpreter: PathBuf,
    /// Module name -> the directory of its package `inmanta_plugins.<name>`.
    pub modules: BTreeMap<String, PathBuf>,
    /// The modules among `modules` that are V2 (installed packages).
    pub v2: BTreeSet<String>,
    pub project_dir: PathBuf,
    /// `Context.get_environment_id()`.
    pub environment: Option<String>,
}

/// What the compiler answers when the host asks.
pub enum Answer {
    Value(Value),
    /// Not frozen yet: the request will be made again later.
    Unset,
    /// No such attribute (Python gets an `AttributeError`).
    Missing(String),
    /// An optional relation left empty: Python gets inmanta-core's `OptionalValueException`,
    /// which module code catches (the openstack module's mappers do).
    Empty,
    Err(String),
}

/// The model side of a request: answers the host's questions.
pub trait PyModel {
    fn program(&self) -> &Program;
    fn entity_of(&self, inst: InstId) -> EntityId;
    /// The attributes of an instance that are final already (sent along with it).
    fn frozen(&self, inst: InstId) -> Vec<(String, Value)>;
    /// `inst.attr` for Python.
    fn read(&mut self, inst: InstId, attr: &str) -> Answer;
    /// A module file (`dir` is `files` or `templates`, `path` is `<module>/<name>`):
    /// (content, absolute path).
    fn file(&mut self, dir: &str, path: &str) -> Result<(String, String), String>;
    /// A built-in (Rust) plugin called from Python (`inmanta_plugins.std.getfact(...)` when
    /// `std` is built in), with the arguments as the host sent them.
    fn builtin(&mut self, plugin: &str, args: &Json, kwargs: &Json) -> Answer {
        let _ = (args, kwargs);
        Answer::Err(format!("{plugin} can not be called from Python here"))
    }
    /// The resource id Python computed for an instance a built-in call is about to need
    /// (`std::getfact` on an instance of an `@resource` class): the plugin host is busy with
    /// the call, so the compiler could not ask it.
    fn remember_resource_id(&mut self, inst: InstId, id: String) {
        let _ = (inst, id);
    }
}

/// The final reply to a request.
pub enum Reply {
    Ok(Json),
    /// The request read an attribute that is not frozen yet.
    Unset,
    /// The result is unknown (module code read an unknown value).
    Unknown,
    /// Module code raised: (kind, message, traceback).
    Error {
        kind: String,
        message: String,
        traceback: String,
    },
}

pub struct PyHost {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The init request was sent.
    init_sent: bool,
    /// The init request was answered.
    initialised: bool,
    /// Modules whose Python the host imports on first need may not be imported yet.
    deferred: bool,
    /// A module's Python failed to import after init (the host fails every request alike).
    failed: Option<String>,
    types_sent: HashSet<EntityId>,
    /// How many frozen attributes of an instance the host has already: sent again only when
    /// more are frozen (the host keeps what it got for the whole compile).
    attrs_sent: HashMap<InstId, usize>,
    /// Requests made (calls and exports), for statistics.
    pub requests: u64,
}

impl Drop for PyHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the embedded Python tree is written: a per-user cache directory.
fn python_base() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("steward");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("steward");
    }
    std::env::temp_dir().join(format!("steward-{}", unsafe { libc::getuid() }))
}

/// Whether the host imports module `name`'s Python only when something needs it (see
/// [`Imports::deferred`]). Only the real `std`: its import registers plugins, resource
/// classes, handlers and a dependency manager and has no other effect; it costs most of the
/// host's start (jinja2 and pydantic, about 60 ms), and Steward runs the std plugins a model
/// calls built in, so most compiles never need it. Another module's import may do anything
/// (print, write files) and runs at the start, as in the reference.
pub fn deferrable(name: &str) -> bool {
    name == "std"
}

/// The Python modules the host imports.
#[derive(Clone, Debug, Default)]
pub struct Imports {
    /// Imported when the host starts, in this order (every module's package, then its
    /// submodules).
    pub eager: Vec<String>,
    /// Module name -> its Python modules (package first), imported all at once when something
    /// needs the module: a Python import of its package (by another module's code, or for a
    /// call of one of its plugins), module code reading a registry (plugins, resource classes,
    /// dependency managers), or an export of resources defined in Python. A failure then fails
    /// that request and every later one, as a failure at the start does.
    pub deferred: BTreeMap<String, Vec<String>>,
}

fn load_failed(message: &str, traceback: &str) -> String {
    format!("loading the modules' Python failed: {message}\n{traceback}")
}

impl PyHost {
    /// Start the host and initialise it (import the modules' packages in `imports`).
    pub fn start(config: &PyConfig, imports: &Imports) -> Result<PyHost, String> {
        let mut host = PyHost::spawn(config, imports)?;
        host.ready()?;
        Ok(host)
    }

    /// Start the host and send it the init request without waiting for it: the interpreter
    /// starts and imports the modules while the compiler goes on. [`PyHost::ready`] waits.
    pub fn spawn(config: &PyConfig, imports: &Imports) -> Result<PyHost, String> {
        let mut host = PyHost::boot(&config.interpreter, &config.project_dir)?;
        host.init(config, imports)?;
        Ok(host)
    }

    /// Start the interpreter of `interpreter` with the host, not initialised: until
    /// [`PyHost::init`] it can answer [`PyHost::sys_path`] and imports nothing.
    pub fn boot(interpreter: &Path, project_dir: &Path) -> Result<PyHost, String> {
        let base = python_base();
        let compat = crate::pycompat::materialize(&base).map_err(|e| {
            format!(
                "can not write Steward's Python into {}: {e}",
                base.display()
            )
        })?;
        let script = compat.join("steward_plugin_host.py");
        let mut child = Command::new(interpreter)
            .arg("-u")
            .arg("-X")
            .arg(format!("pycache_prefix={}", base.join("pycache").display()))
            .arg(&script)
            .env("PYTHONPATH", &compat)
            // the bytecode goes to Steward's own cache (pycache_prefix), never next to the
            // user's sources, which is what this variable is set to prevent; without it every
            // compile would compile the modules' Python (std, jinja2, pydantic, …) again
            .env_remove("PYTHONDONTWRITEBYTECODE")
            .current_dir(project_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                format!(
                    "can not start the Python plugin host with {}: {e}",
                    interpreter.display()
                )
            })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(PyHost {
            child,
            stdin,
            stdout,
            init_sent: false,
            initialised: false,
            deferred: false,
            failed: None,
            types_sent: HashSet::new(),
            attrs_sent: HashMap::new(),
            requests: 0,
        })
    }

    /// The interpreter's `sys.path` as `python -I` gives it (asked before [`PyHost::init`]).
    pub fn sys_path(&mut self) -> Result<Vec<PathBuf>, String> {
        debug_assert!(!self.init_sent, "the host answers paths only before init");
        self.send(&json!({"op": "paths"}))?;
        let reply = self.receive()?;
        let paths: Vec<String> = reply
            .get("ok")
            .cloned()
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or_else(|| format!("unexpected sys.path from the Python plugin host: {reply}"))?;
        Ok(paths
            .into_iter()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect())
    }

    /// Send the init request (the host imports the modules' Python): [`PyHost::ready`] waits
    /// for its answer.
    pub fn init(&mut self, config: &PyConfig, imports: &Imports) -> Result<(), String> {
        self.init_sent = true;
        self.deferred = !imports.deferred.is_empty();
        let modules: Map<String, Json> = config
            .modules
            .iter()
            .map(|(k, v)| (k.clone(), Json::String(v.display().to_string())))
            .collect();
        let v2: Map<String, Json> = config
            .v2
            .iter()
            .map(|k| (k.clone(), Json::Bool(true)))
            .collect();
        let init = json!({
            "op": "init",
            "modules": modules,
            "v2": v2,
            "imports": imports.eager,
            "deferred": imports.deferred,
            "project_dir": config.project_dir.display().to_string(),
            "environment": config.environment,
        });
        self.send(&init)
    }

    /// Wait for the reply to the init request.
    pub fn ready(&mut self) -> Result<(), String> {
        if self.initialised {
            return Ok(());
        }
        let reply = self.receive()?;
        match final_reply(reply) {
            Reply::Ok(_) => {
                self.initialised = true;
                Ok(())
            }
            Reply::Error {
                message, traceback, ..
            } => Err(load_failed(&message, &traceback)),
            _ => Err("loading the modules' Python failed".into()),
        }
    }

    /// Import the deferred modules' Python now (an export needs every module's resource
    /// classes and dependency managers).
    pub fn load_deferred(&mut self, model: &mut dyn PyModel) -> Result<(), String> {
        if !self.deferred {
            return Ok(());
        }
        match self.request(&json!({"op": "load"}), model)? {
            Reply::Ok(_) => {
                self.deferred = false;
                Ok(())
            }
            Reply::Error {
                message, traceback, ..
            } => Err(load_failed(&message, &traceback)),
            Reply::Unset | Reply::Unknown => Err("loading the modules' Python failed".into()),
        }
    }

    fn send(&mut self, msg: &Json) -> Result<(), String> {
        let mut line = serde_json::to_string(msg).map_err(|e| e.to_string())?;
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|_| self.stdin.flush())
            .map_err(|e| format!("the Python plugin host is gone: {e}"))
    }

    fn receive(&mut self) -> Result<Json, String> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| format!("the Python plugin host is gone: {e}"))?;
        if n == 0 {
            let status = self.child.wait().ok();
            return Err(format!(
                "the Python plugin host exited ({})",
                status.map(|s| s.to_string()).unwrap_or_default()
            ));
        }
        serde_json::from_str(&line)
            .map_err(|e| format!("bad reply from the Python plugin host: {e}"))
    }

    /// Send a request and answer the host's questions until its final reply.
    pub fn request(&mut self, msg: &Json, model: &mut dyn PyModel) -> Result<Reply, String> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.requests += 1;
        self.send(msg)?;
        loop {
            let reply = self.receive()?;
            let Some(q) = reply.get("q").and_then(Json::as_str) else {
                let load = reply.get("load").is_some();
                let reply = final_reply(reply);
                if let (
                    true,
                    Reply::Error {
                        message, traceback, ..
                    },
                ) = (load, &reply)
                {
                    // a deferred module's Python failed to import: reported as a failure at
                    // the start is, for this request and every later one
                    let failed = load_failed(message, traceback);
                    self.failed = Some(failed.clone());
                    return Err(failed);
                }
                return Ok(reply);
            };
            let answer = match q {
                "attr" => {
                    let h = reply.get("h").and_then(Json::as_u64).unwrap_or(u64::MAX);
                    let a = reply.get("a").and_then(Json::as_str).unwrap_or("");
                    if h >= u32::MAX as u64 {
                        json!({"err": "no such instance"})
                    } else {
                        let inst = InstId(h as u32);
                        match model.read(inst, a) {
                            Answer::Value(v) => {
                                // with the instance's other frozen attributes: the next reads
                                // of this instance cost no round trip
                                let v = self.encode(&v, model, false);
                                let all = self.encode(&Value::Instance(inst), model, true);
                                json!({"v": v, "i": all})
                            }
                            Answer::Unset => json!({"unset": true}),
                            Answer::Missing(m) => json!({"missing": m}),
                            Answer::Empty => json!({"empty": true}),
                            Answer::Err(m) => json!({"err": m}),
                        }
                    }
                }
                "file" | "path" => {
                    let dir = reply.get("dir").and_then(Json::as_str).unwrap_or("files");
                    let path = reply.get("path").and_then(Json::as_str).unwrap_or("");
                    match model.file(dir, path) {
                        Ok((content, abs)) if q == "file" => {
                            let _ = abs;
                            json!({"v": content})
                        }
                        Ok((_, abs)) => json!({"v": abs}),
                        Err(e) => json!({"err": e}),
                    }
                }
                "builtin" => {
                    if let Some([h, Json::String(id)]) =
                        reply.get("rid").and_then(Json::as_array).map(Vec::as_slice)
                        && let Some(h) = h.as_u64().filter(|h| *h < u32::MAX as u64)
                    {
                        model.remember_resource_id(InstId(h as u32), id.clone());
                    }
                    let plugin = reply.get("plugin").and_then(Json::as_str).unwrap_or("");
                    let none = Json::Null;
                    let args = reply.get("args").unwrap_or(&none);
                    let kwargs = reply.get("kwargs").unwrap_or(&none);
                    match model.builtin(plugin, args, kwargs) {
                        Answer::Value(v) => json!({"v": self.encode(&v, model, false)}),
                        Answer::Unset => json!({"unset": true}),
                        Answer::Missing(m) | Answer::Err(m) => json!({"err": m}),
                        Answer::Empty => json!({"err": "no value"}),
                    }
                }
                other => json!({"err": format!("unknown question {other}")}),
            };
            self.send(&answer)?;
        }
    }

    /// A model value as the host reads it; `attrs`: send an instance's frozen attributes.
    pub fn encode(&mut self, v: &Value, model: &dyn PyModel, attrs: bool) -> Json {
        match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => Json::from(*i),
            Value::BigInt(b) => {
                use num_traits::ToPrimitive;
                Json::from(b.to_f64().unwrap_or(f64::NAN))
            }
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(Json::Number)
                .unwrap_or(Json::Null),
            Value::Str(s) => Json::String(s.to_string()),
            Value::List(l) => Json::Array(l.iter().map(|x| self.encode(x, model, false)).collect()),
            Value::Dict(d) => {
                let mut escape = false;
                let mut m = Map::new();
                for (k, x) in d.iter() {
                    escape |= k.starts_with('$');
                    m.insert(k.to_string(), self.encode(x, model, false));
                }
                if escape {
                    json!({ "$d": m })
                } else {
                    Json::Object(m)
                }
            }
            Value::Unknown => json!({"$u": 1}),
            Value::Instance(i) => {
                let e = model.entity_of(*i);
                let p = model.program();
                let ent = p.entity(e);
                let mut m = Map::new();
                m.insert("$e".into(), Json::from(i.0));
                m.insert("t".into(), Json::String(ent.full_name.clone()));
                if self.types_sent.insert(e) {
                    let parents: Vec<Json> = ent
                        .ancestors
                        .iter()
                        .map(|a| Json::String(p.entity(*a).full_name.clone()))
                        .collect();
                    m.insert("p".into(), Json::Array(parents));
                    // the attribute schema, for module code that walks `_type()`
                    // (mitogen serializes a context's non-relation attributes)
                    let fields: Vec<Json> = ent
                        .slots
                        .iter()
                        .map(|a| {
                            let a = p.attr(*a);
                            match &a.kind {
                                AttrKind::Relation { low, high, .. } => {
                                    json!([a.name, 1, low, high])
                                }
                                AttrKind::Value { .. } => json!([a.name, 0]),
                            }
                        })
                        .collect();
                    m.insert("f".into(), Json::Array(fields));
                }
                if attrs {
                    let frozen = model.frozen(*i);
                    let known = self.attrs_sent.entry(*i).or_insert(0);
                    if *known == frozen.len() {
                        return Json::Object(m);
                    }
                    *known = frozen.len();
                    let mut a = Map::new();
                    for (name, val) in frozen {
                        let j = self.encode(&val, model, false);
                        a.insert(name, j);
                    }
                    m.insert("a".into(), Json::Object(a));
                }
                Json::Object(m)
            }
        }
    }
}

fn final_reply(reply: Json) -> Reply {
    if let Some(v) = reply.get("ok") {
        return Reply::Ok(v.clone());
    }
    if reply.get("unset").is_some() {
        return Reply::Unset;
    }
    if reply.get("unknown").is_some() {
        return Reply::Unknown;
    }
    let e = reply.get("error").cloned().unwrap_or(Json::Null);
    let text = |k: &str| e.get(k).and_then(Json::as_str).unwrap_or("").to_string();
    Reply::Error {
        kind: text("kind"),
        message: text("message"),
        traceback: text("traceback"),
    }
}

/// A value from the host into the model; `instances` bounds the handles.
pub fn decode(j: &Json, instances: usize) -> Result<Value, String> {
    Ok(match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::from_bigint(u.into())
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::str(s),
        Json::Array(items) => Value::list(
            items
                .iter()
                .map(|x| decode(x, instances))
                .collect::<Result<_, _>>()?,
        ),
        Json::Object(m) => {
            if let Some(h) = m.get("$e") {
                let h = h.as_u64().unwrap_or(u64::MAX);
                if h >= instances as u64 {
                    return Err("a plugin returned an instance the model does not have".into());
                }
                return Ok(Value::Instance(InstId(h as u32)));
            }
            if m.contains_key("$u") {
                return Ok(Value::Unknown);
            }
            let m = match m.get("$d") {
                Some(Json::Object(inner)) => inner,
                _ => m,
            };
            let mut d = Dict::new();
            for (k, x) in m {
                d.insert(k.as_str().into(), decode(x, instances)?);
            }
            Value::Dict(Rc::new(d))
        }
    })
}

/// The plugin host of one compile: started on first use, kept for the compile.
#[derive(Default)]
pub struct PySession {
    pub config: PyConfig,
    /// The modules' Python: imported when the host starts, or on first need.
    pub imports: Imports,
    host: Option<PyHost>,
    failed: Option<String>,
    /// Requests made by hosts already dropped.
    pub started: bool,
}

impl PySession {
    pub fn new(config: PyConfig, imports: Imports) -> PySession {
        PySession {
            config,
            imports,
            ..Default::default()
        }
    }

    /// Use `host`, started with [`PyHost::boot`] (to ask its `sys.path`) and not initialised,
    /// when the compile needs one: no second interpreter starts.
    pub fn adopt(&mut self, host: PyHost) {
        if self.host.is_none() && self.failed.is_none() {
            self.host = Some(host);
        }
    }

    /// Start the host now without waiting for it (the compile will call Python plugins):
    /// the interpreter starts while the compiler works.
    pub fn prestart(&mut self) {
        if self.failed.is_some() {
            return;
        }
        self.started = true;
        let started = match self.host.take() {
            Some(mut h) if !h.init_sent => h.init(&self.config, &self.imports).map(|()| h),
            Some(h) => Ok(h),
            None => PyHost::spawn(&self.config, &self.imports),
        };
        match started {
            Ok(h) => self.host = Some(h),
            Err(e) => self.failed = Some(e),
        }
    }

    /// The host, started if needed; a start that failed fails every later request alike.
    pub fn take(&mut self) -> Result<PyHost, String> {
        if self.host.as_ref().is_some_and(|h| !h.init_sent) {
            self.prestart();
        }
        if let Some(mut h) = self.host.take() {
            if let Err(e) = h.ready() {
                self.failed = Some(e.clone());
                return Err(e);
            }
            return Ok(h);
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.started = true;
        match PyHost::start(&self.config, &self.imports) {
            Ok(h) => Ok(h),
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    pub fn put(&mut self, host: PyHost) {
        match &host.failed {
            Some(e) => self.failed = Some(e.clone()),
            None => self.host = Some(host),
        }
    }

    /// Requests made so far by the running host.
    pub fn requests(&self) -> u64 {
        self.host.as_ref().map_or(0, |h| h.requests)
    }
}
