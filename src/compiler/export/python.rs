//! Resources defined in Python (`@resource` classes of Inmanta modules), and the handler code
//! of types with an `@provider` handler.
//!
//! All instances of the types the modules' Python defines resources for go to the plugin host
//! in one request, with their attributes; the host builds each resource with
//! `Resource.create_from_model` (running the `get_<field>` mappers, `ManagedResource`,
//! `IgnoreResourceException`) and runs the registered dependency managers. Nothing starts
//! when the model has no instance of such a type.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::eval::Runtime;
use crate::compiler::ids::EntityId;
use crate::compiler::plugins::pyhost::{Answer, PyModel, Reply};
use crate::compiler::plugins::python::ModulePython;
use crate::compiler::program::Program;
use crate::compiler::project::ModuleInfo;
use crate::compiler::value::{InstId, Value};
use crate::model::{CodeFile, HandlerCode, InmantaCode};
// what inmanta-core brings that module code imports: a handler environment gets those its
// code imports (inmanta-core itself would cost seconds per import)
use crate::pyenv::FROM_INMANTA_CORE;

/// A resource built by a Python class.
pub struct PyResource {
    pub inst: InstId,
    pub type_name: String,
    pub agent: String,
    pub attribute: String,
    pub value: String,
    pub fields: serde_json::Map<String, Json>,
    /// A field is unknown.
    pub undefined: bool,
    /// Requires the dependency managers set (resource ids without version).
    pub requires: Option<Vec<String>>,
}

/// What the Python resource classes made of the model.
#[derive(Default)]
pub struct PyExport {
    pub resources: Vec<PyResource>,
    /// Instances a Python class handles (built, ignored or unknown): not exported otherwise.
    pub handled: HashSet<InstId>,
    /// Files the mappers uploaded (`exporter.upload_file`): SHA-1 hex -> content. They ship
    /// with the handler code as `_files/<sha1>`, where the handlers' `get_file` finds them.
    pub files: BTreeMap<String, Vec<u8>>,
}

struct ExportModel<'a, 'p> {
    rt: &'a Runtime<'p>,
}

impl PyModel for ExportModel<'_, '_> {
    fn program(&self) -> &Program {
        self.rt.p
    }

    fn entity_of(&self, inst: InstId) -> EntityId {
        self.rt.inst_entity(inst)
    }

    fn frozen(&self, inst: InstId) -> Vec<(String, Value)> {
        let ent = self.rt.p.entity(self.rt.inst_entity(inst));
        let mut out = Vec::with_capacity(ent.slots.len());
        for (slot, aid) in ent.slots.iter().enumerate() {
            // an empty optional relation is asked for: reading it raises in Python
            if self.rt.is_empty_relation(inst, slot as u16) {
                continue;
            }
            if let Some(v) = self.rt.frozen_attr(inst, slot as u16) {
                out.push((self.rt.p.attr(*aid).name.clone(), v));
            }
        }
        out
    }

    fn read(&mut self, inst: InstId, attr: &str) -> Answer {
        let p = self.rt.p;
        let e = self.rt.inst_entity(inst);
        let Some(slot) = p.syms.get(attr).and_then(|s| p.entity(e).slot(s)) else {
            return Answer::Missing(format!(
                "'{}' has no attribute '{attr}'",
                p.entity(e).full_name
            ));
        };
        if self.rt.is_empty_relation(inst, slot) {
            return Answer::Empty;
        }
        match self.rt.frozen_attr(inst, slot) {
            Some(v) => Answer::Value(v),
            None => Answer::Unset,
        }
    }

    fn file(&mut self, dir: &str, path: &str) -> Result<(String, String), String> {
        let path = path.trim_start_matches('/');
        let (module, rest) = path.split_once('/').unwrap_or(("", path));
        self.rt.host.module_file(module, dir, rest)
    }
}

/// Build the resources of the Python resource classes.
pub fn build(
    rt: &mut Runtime,
    python: &BTreeMap<String, ModulePython>,
) -> Result<PyExport, Vec<Diagnostic>> {
    let p = rt.p;
    let mut types: HashSet<EntityId> = HashSet::new();
    for m in python.values() {
        for t in &m.resources {
            let (ns, name) = t.rsplit_once("::").unwrap_or(("", t));
            if let Some(nsd) = p.namespaces.iter().find(|n| n.name == ns)
                && let Some(crate::compiler::types::TypeRef::Entity(e)) = nsd.types.get(name)
            {
                types.insert(*e);
            }
        }
    }
    if types.is_empty() {
        return Ok(PyExport::default());
    }
    let is_resource =
        |e: EntityId| types.contains(&e) || p.entity(e).ancestors.iter().any(|a| types.contains(a));
    let insts: Vec<InstId> = (0..rt.instances.len())
        .map(|i| InstId(i as u32))
        .filter(|i| is_resource(rt.inst_entity(*i)))
        .collect();
    if insts.is_empty() {
        return Ok(PyExport::default());
    }
    let cannot_run = |e: String| {
        vec![Diagnostic::error(
            "export",
            format!("the Python resource definitions can not run: {e}"),
        )]
    };
    let mut host = rt.host.take_python().map_err(cannot_run)?;
    // every module's resource classes and dependency managers take part, also those of a
    // module whose Python the host has not needed so far
    let loaded = host.load_deferred(&mut ExportModel { rt: &*rt });
    if let Err(e) = loaded {
        rt.host.put_python(host);
        return Err(cannot_run(e));
    }
    let reply = {
        let mut model = ExportModel { rt: &*rt };
        let items: Vec<Json> = insts
            .iter()
            .map(|i| host.encode(&Value::Instance(*i), &model, true))
            .collect();
        host.request(&json!({"op": "export", "items": items}), &mut model)
    };
    rt.host.put_python(host);
    let fail = |m: String| vec![Diagnostic::error("export", m)];
    let (results, uploaded) = match reply.map_err(fail)? {
        Reply::Ok(Json::Object(mut r)) => match (r.remove("resources"), r.remove("files")) {
            (Some(Json::Array(resources)), Some(Json::Object(files))) => (resources, files),
            _ => {
                return Err(fail(
                    "unexpected reply from the Python resource export".into(),
                ));
            }
        },
        Reply::Ok(_) | Reply::Unset | Reply::Unknown => {
            return Err(fail(
                "unexpected reply from the Python resource export".into(),
            ));
        }
        Reply::Error {
            kind,
            message,
            traceback,
        } => {
            return Err(fail(format!(
                "exporting the resources defined in Python failed: {kind}: {message}\n{}",
                traceback.trim_end()
            )));
        }
    };
    let mut out = PyExport::default();
    for (hash, content) in uploaded {
        let content = content
            .as_str()
            .and_then(|c| hex::decode(c).ok())
            .ok_or_else(|| fail(format!("the uploaded file {hash} is not hex")))?;
        out.files.insert(hash, content);
    }
    for r in results {
        let h = r.get("h").and_then(Json::as_u64).unwrap_or(u64::MAX);
        if h >= rt.instances.len() as u64 {
            continue;
        }
        let inst = InstId(h as u32);
        if r.get("none").is_some() {
            continue;
        }
        out.handled.insert(inst);
        if r.get("ignored").is_some() || r.get("unknown").is_some() {
            continue;
        }
        let text = |k: &str| r.get(k).and_then(Json::as_str).unwrap_or("").to_string();
        let mut undefined = false;
        let mut fields = serde_json::Map::with_capacity(match r.get("fields") {
            Some(Json::Object(f)) => f.len(),
            _ => 0,
        });
        if let Some(Json::Object(f)) = r.get("fields") {
            for (k, v) in f {
                fields.insert(k.clone(), plain(v, &mut undefined));
            }
        }
        let requires = r.get("requires").and_then(Json::as_array).map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        });
        out.resources.push(PyResource {
            inst,
            type_name: text("type"),
            agent: text("agent"),
            attribute: text("attr"),
            value: text("value"),
            fields,
            undefined,
            requires,
        });
    }
    Ok(out)
}

/// A field value from the host as exported JSON: unknowns become null and mark the resource
/// undefined, instances their handle's text, escaped dicts plain.
fn plain(v: &Json, undefined: &mut bool) -> Json {
    match v {
        Json::Array(items) => Json::Array(items.iter().map(|x| plain(x, undefined)).collect()),
        Json::Object(m) => {
            if m.contains_key("$u") {
                *undefined = true;
                return Json::Null;
            }
            if let Some(h) = m.get("$e") {
                return Json::String(format!("instance {h}"));
            }
            let m = match m.get("$d") {
                Some(Json::Object(inner)) => inner,
                _ => m,
            };
            Json::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), plain(x, undefined)))
                    .collect(),
            )
        }
        other => other.clone(),
    }
}

/// The package a requirement names, normalised (`Inmanta_Core>=14` -> `inmanta-core`).
fn requirement_name(req: &str) -> String {
    req.trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect::<String>()
        .to_ascii_lowercase()
        .replace('_', "-")
}

/// A requirement that names a package Steward provides itself (the core, Inmanta modules).
fn provided(req: &str) -> bool {
    let name = requirement_name(req);
    name == "inmanta-core" || name == "inmanta" || name.starts_with("inmanta-module-")
}

/// The requirements of [`FROM_INMANTA_CORE`] that Python source imports (`import yaml`,
/// `from pydantic import ...`, also inside functions).
fn core_packages_imported(source: &[u8]) -> Vec<&'static str> {
    let text = String::from_utf8_lossy(source);
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        let modules: Vec<&str> = if let Some(rest) = line.strip_prefix("import ") {
            rest.split(',').collect()
        } else if let Some(rest) = line.strip_prefix("from ") {
            rest.split_whitespace().take(1).collect()
        } else {
            continue;
        };
        for m in modules {
            let top = m.trim().split(['.', ' ']).next().unwrap_or("");
            if let Some((_, req)) = FROM_INMANTA_CORE.iter().find(|(name, _)| *name == top) {
                found.push(*req);
            }
        }
    }
    found
}

/// The Python requirements of a module's handler environment, from its own.
fn handler_requirements(own: &[String]) -> impl Iterator<Item = String> + '_ {
    own.iter()
        .filter(|r| !provided(r))
        .map(|r| r.trim().to_string())
}

/// The installed packages of the modules the shipped Python requires but which are built in
/// here (so have no Python of their own in this compile): the real fs module's handlers import
/// `inmanta_plugins.mitogen`. Not `std`: the compatibility package has its helpers.
fn companions(
    modules: &BTreeMap<String, ModuleInfo>,
    python: &BTreeMap<String, ModulePython>,
) -> Vec<ModuleInfo> {
    let mut seen: BTreeSet<String> = python.keys().cloned().collect();
    seen.insert("std".into());
    let mut todo: Vec<ModuleInfo> = python
        .keys()
        .filter_map(|n| modules.get(n).cloned())
        .collect();
    let mut found = Vec::new();
    while let Some(m) = todo.pop() {
        for r in &m.requirements {
            let Some(dep) = crate::compiler::project::module_of_requirement(r) else {
                continue;
            };
            if seen.insert(dep.clone())
                && let Some(c) = m.installed_beside(&dep)
            {
                todo.push(c.clone());
                found.push(c);
            }
        }
    }
    found
}

/// Resource type -> its handler code.
type Handlers = BTreeMap<String, HandlerCode>;
/// Content hash -> file content (hex).
type Code = BTreeMap<String, String>;

/// The handler code of the modules' Python, for the resource types in `used` that have an
/// `@provider` handler: every module's Python files (handlers import each other's modules),
/// their requirements, and the packages to import. One `HandlerCode` shared by those types.
pub fn handlers(
    used: &BTreeSet<&str>,
    modules: &BTreeMap<String, ModuleInfo>,
    python: &BTreeMap<String, ModulePython>,
    uploaded: &BTreeMap<String, Vec<u8>>,
) -> Result<(Handlers, Code), String> {
    let typed: Vec<(&str, &str)> = python
        .iter()
        .flat_map(|(m, mp)| mp.providers.iter().map(move |t| (m.as_str(), t.as_str())))
        .filter(|(_, t)| used.contains(t))
        .collect();
    if typed.is_empty() {
        return Ok(Default::default());
    }
    let mut files = BTreeMap::new();
    let mut code = BTreeMap::new();
    let mut requirements = BTreeSet::new();
    let mut imports = Vec::new();
    let mut core_imports = BTreeSet::new();
    let mut ship = |path: String, content: &[u8]| {
        if path.ends_with(".py") {
            core_imports.extend(core_packages_imported(content));
        }
        let hash = hex::encode(Sha256::digest(content));
        files.insert(
            path,
            CodeFile {
                hash: hash.clone(),
                executable: false,
            },
        );
        code.insert(hash, hex::encode(content));
    };
    let read =
        |abs: &std::path::Path| std::fs::read(abs).map_err(|e| format!("{}: {e}", abs.display()));
    for (name, mp) in python {
        for (rel, abs) in &mp.files {
            ship(format!("inmanta_plugins/{name}/{rel}"), &read(abs)?);
        }
        imports.extend(mp.python_modules.iter().cloned());
        if let Some(m) = modules.get(name) {
            for (rel, abs) in &m.extra_python {
                ship(rel.clone(), &read(abs)?);
            }
            requirements.extend(handler_requirements(&m.requirements));
        }
    }
    for m in companions(modules, python) {
        let Some(dir) = &m.python else { continue };
        for (rel, abs) in &crate::compiler::plugins::python::scan_module(&m.name, dir).files {
            ship(format!("inmanta_plugins/{}/{rel}", m.name), &read(abs)?);
        }
        for (rel, abs) in &m.extra_python {
            ship(rel.clone(), &read(abs)?);
        }
        requirements.extend(handler_requirements(&m.requirements));
    }
    for (sha1, content) in uploaded {
        ship(format!("_files/{sha1}"), content);
    }
    // what inmanta-core would have brought, unless a module asks for the package itself
    for req in core_imports {
        let name = requirement_name(req);
        if !requirements.iter().any(|r| requirement_name(r) == name) {
            requirements.insert(req.to_string());
        }
    }
    let entry = files.keys().next().cloned().unwrap_or_default();
    let inmanta = InmantaCode {
        requirements: requirements.into_iter().collect(),
        imports,
    };
    let mut shared = HandlerCode {
        module: String::new(),
        entry,
        files,
        digest: String::new(),
        inmanta: Some(inmanta),
    };
    shared.digest = shared.expected_digest();
    let mut out = BTreeMap::new();
    for (module, t) in typed {
        out.insert(
            t.to_string(),
            HandlerCode {
                module: module.to_string(),
                ..shared.clone()
            },
        );
    }
    Ok((out, code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_of_what_inmanta_core_brings_are_found() {
        let src = br#"
import os, yaml
from ruamel.yaml import YAML
import pydantic.v1 as p1

def f():
    from dateutil import parser  # inside a function too
    import typing_inspect
# import jinja2 (a comment is no import)
x = "import toml"
"#;
        assert_eq!(
            core_packages_imported(src),
            [
                "pyyaml~=6.0",
                "ruamel.yaml~=0.17",
                "pydantic~=2.5",
                "python-dateutil~=2.0",
                "typing-inspect~=0.9"
            ]
        );
    }

    #[test]
    fn requirement_names_are_normalised() {
        assert_eq!(requirement_name("PyYAML>=5"), "pyyaml");
        assert_eq!(requirement_name("Inmanta_Core ~= 14.0"), "inmanta-core");
        assert!(provided("inmanta-module-std"));
        assert!(!provided("mitogen"));
    }
}
