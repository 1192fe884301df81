//! Plugins: functions callable from the model as `namespace::name(...)`.
//!
//! Steward implements std's plugins (and those of the built-in fs/exec modules) natively. Each
//! plugin declares a Python-like signature; a call binds positional, keyword and `**dict`
//! arguments to it with the reference's error messages, type-checks them against the declared
//! DSL types, and returns unknown without calling when an argument is unknown (unless the
//! plugin accepts unknowns) — see [`bind`].
//!
//! This module owns the interface between plugins and the compiler: a plugin sees its caller
//! only through [`Caller`] (values, the type system, attribute reads that may have to wait) and
//! reaches the world only through the [`Host`] (printing, module files, the environment). The
//! evaluator implements [`Caller`]; nothing here knows its state.

mod bind;
mod exec;
mod facts;
mod files;
mod json;
mod net;
pub mod pyhost;
pub mod python;
mod std_lib;
mod template;

use std::rc::Rc;

pub(crate) use bind::check_dsl_type;
pub use bind::{bind, invoke};

use super::diagnostics::Diagnostic;
use super::ids::{EntityId, Sym};
use super::program::Program;
use super::source::Span;
use super::types::ValueType;
use super::value::pyfmt::{self, InstanceText};
use super::value::{InstId, Value};

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
    /// Keep the content of a module file handed to the model as a file marker (`fs::file`,
    /// `std::file`: `imp-module-source:file://<path>`), for the export to put in its place.
    fn remember_file(&mut self, marker: &str, content: &str) {
        let _ = (marker, content);
    }
    /// The content kept for a file marker, when the string is one this compile made.
    fn remembered_file(&self, marker: &str) -> Option<String> {
        let _ = marker;
        None
    }
    /// The names of the files in a directory of a module (`dir` is `files`), sorted.
    fn list_module_files(
        &self,
        module: &str,
        dir: &str,
        path: &str,
    ) -> Result<Vec<String>, String> {
        let _ = (module, dir, path);
        Err("this compile reads no module directories".into())
    }
    /// A file of the project's data directory for the plugins of `namespace`
    /// (`data/<namespace>/<name>`, as the reference's `Context.get_data_dir`); `None` when it
    /// does not exist.
    fn read_data_file(&self, namespace: &str, name: &str) -> Result<Option<String>, String> {
        let _ = (namespace, name);
        Ok(None)
    }
    /// The Python plugin host of this compile, started on first use, taken out while a
    /// request runs (give it back with [`Host::put_python`]).
    fn take_python(&mut self) -> Result<pyhost::PyHost, String> {
        Err("this compile runs no Python".into())
    }
    /// Give back the host taken with [`Host::take_python`].
    fn put_python(&mut self, host: pyhost::PyHost) {
        drop(host);
    }
    /// Write (replace) a file of the project's data directory.
    fn write_data_file(&mut self, namespace: &str, name: &str, text: &str) -> Result<(), String> {
        let _ = (namespace, name, text);
        Err("this compile has no data directory".into())
    }
    /// Fact `name` of resource `resource_id` (without version) in the environment
    /// (`std::getfact`); `None` when the environment has no such fact, or when the compile
    /// knows no environment (`span` is the call asking, for saying so).
    fn fact(&mut self, resource_id: &str, name: &str, span: Span) -> Option<String> {
        let _ = (resource_id, name, span);
        None
    }
    /// A fact the model asked for and did not get: the export lists it, so the server
    /// compiles again when it arrives.
    fn record_unknown(&mut self, resource_id: &str, name: &str) {
        let _ = (resource_id, name);
    }
    /// The facts recorded with [`Host::record_unknown`], once each, sorted.
    fn unknowns(&self) -> Vec<crate::model::UnknownRecord> {
        Vec::new()
    }
    /// How instances of an entity become resources at export: `names` are the entity's full
    /// name and its ancestors', nearest first. `None`: they are no resources.
    fn resource_type(&self, names: &[&str]) -> Option<ResourceType> {
        let _ = names;
        None
    }
    /// The resource id of an instance computed before (ids of Python resource classes are
    /// computed in Python, at the call that needed them).
    fn known_resource_id(&self, inst: InstId) -> Option<String> {
        let _ = inst;
        None
    }
    /// Keep the resource id of an instance (it can not change: its attributes are final).
    fn remember_resource_id(&mut self, inst: InstId, id: String) {
        let _ = (inst, id);
    }
}

/// How the instances of a resource type get their id (`type[agent,attribute=value]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceType {
    /// Declared in a `module.yml`: the agent at a dotted attribute path, the id attribute.
    Declared {
        type_name: String,
        agent: String,
        id: String,
    },
    /// An `@resource` class of a module's Python: the class computes it
    /// (`inmanta.resources.to_id`, with its `get_<field>` mappers).
    Python,
}

/// What a plugin may ask of the evaluator calling it, at one call site.
///
/// Reads that need a value the model does not have yet stop with [`Stop::Wait`]: the plugin
/// passes it on (`?`), and the evaluator calls the plugin again once the value exists.
pub trait Caller {
    /// The compiled program: namespaces and their types, entities, attribute names.
    fn program(&self) -> &Program;
    /// The compiler's surroundings.
    fn host(&mut self) -> &mut dyn Host;
    /// How instances show in text (for [`pyfmt`]).
    fn names(&self) -> &dyn InstanceText;
    /// The entity an instance is of.
    fn instance_entity(&self, inst: InstId) -> EntityId;
    /// Check a value against a type (LANGUAGE.md §5.2, §5.3); `Err` is the message.
    fn validate(&mut self, value: &Value, ty: &ValueType) -> Result<(), String>;
    /// `obj.attr` as the model reads it: waits for the complete value; an error when `obj` is
    /// not an instance (`base_text` names it in the message) or has no such attribute, or the
    /// attribute is an optional relation left empty. Unknown when `obj` is unknown.
    fn read_attr(&mut self, obj: &Value, sym: Sym, base_text: &str) -> Outcome<Value>;
    /// As [`Caller::read_attr`], but `None` for an optional relation left empty.
    fn read_attr_or_empty(
        &mut self,
        obj: &Value,
        sym: Sym,
        base_text: &str,
    ) -> Outcome<Option<Value>>;
    /// A name as the model would resolve it at the call site: block variables, the instance's
    /// attributes, then top-level variables (`ns::name`, or of the calling file's namespace).
    /// `None` when nothing has that name, or when it is the instance's optional relation left
    /// empty (missing for a template, as for the reference's).
    fn lookup(&mut self, name: &str) -> Outcome<Option<Value>>;
    /// The attributes of an instance that have a value so far, by name, without waiting: a
    /// relation still growing gives the instances it has; attributes without one are left out.
    fn attributes_so_far(&self, inst: InstId) -> Vec<(String, Value)>;
    /// The attributes of an instance whose value is final (frozen), by name, without waiting.
    fn frozen_attributes(&self, inst: InstId) -> Vec<(String, Value)> {
        let _ = inst;
        Vec::new()
    }
    /// How many instances the model has (bounds the handles a plugin may return).
    fn instance_count(&self) -> usize {
        usize::MAX
    }
}

impl dyn Caller + '_ {
    /// Python `str` of a value.
    pub fn value_str(&self, v: &Value) -> String {
        pyfmt::to_str(v, self.names())
    }

    /// Python `repr` of a value.
    pub fn value_repr(&self, v: &Value) -> String {
        pyfmt::repr(v, self.names())
    }
}

/// Why a plugin call stopped without a value.
pub enum Stop {
    /// A value the call needs does not exist yet: the caller runs the call again later.
    Wait(Wait),
    /// A compile error: the compile aborts.
    Err(Box<Diagnostic>),
}

/// What a stopped call waits for. The caller makes it and reads it back; to a plugin it is
/// opaque, to be passed on unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait(pub u64);

impl From<Diagnostic> for Stop {
    fn from(d: Diagnostic) -> Stop {
        Stop::Err(Box::new(d))
    }
}

pub type Outcome<T> = Result<T, Stop>;

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

/// The arguments of one call, bound to the plugin's parameters.
pub struct Args {
    /// One value per declared parameter (defaults filled in).
    pub values: Vec<Value>,
    /// `**kwargs` beyond the declared parameters.
    pub extra: Vec<(Rc<str>, Value)>,
    /// The call in the model.
    pub span: Span,
}

pub type PluginFn = fn(&mut dyn Caller, &mut Args) -> Outcome<Value>;

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
        v.push(facts::getfact());
        v.extend(files::plugins());
        v.extend(exec::plugins());
        v.extend(net::plugins());
        v.extend(json::plugins());
        v.extend(template::plugins());
        v
    })
}

/// An exception raised inside a plugin.
pub fn fail(args: &Args, def_name: &str, msg: impl Into<String>) -> Stop {
    Diagnostic::error(
        "plugin",
        format!("Exception in plugin {def_name}\ncaused by: {}", msg.into()),
    )
    .at(args.span)
    .into()
}

/// Call plugin `id` (numbered as [`crate::compiler::types::TypeRef::Plugin`] does: the
/// built-in ones, then the compile's Python plugins) with these arguments, bound and checked as
/// a call in the model is. For calls made by plugin code (template filters, Python calling a
/// built-in plugin); the evaluator's own calls also replay results from its memo.
pub fn call(
    c: &mut dyn Caller,
    id: usize,
    positional: Vec<Value>,
    kwargs: Vec<(Rc<str>, Value)>,
    span: Span,
) -> Outcome<Value> {
    let builtin = all();
    match id.checked_sub(builtin.len()) {
        Some(i) => {
            let def = c.program().python_plugins[i].clone();
            python::call(&def, c, positional, kwargs, span)
        }
        None => {
            let def = &builtin[id];
            match bind(def, c, positional, kwargs, span)? {
                Some(mut args) => invoke(def, c, &mut args),
                None => Ok(Value::Unknown),
            }
        }
    }
}

/// Plugins resolve by namespace: is there one with this name?
pub fn find(namespace: &str, name: &str) -> Option<usize> {
    all()
        .iter()
        .position(|p| p.namespace == namespace && p.name == name)
}
