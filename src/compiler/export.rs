//! Export: entity instances to resources (LANGUAGE.md §14, DESIGN.md §3).
//!
//! Modules declare their resource types in `module.yml`. Every instance of such a type, or of a
//! subtype, becomes a resource of the declared type: id from the agent path and id attribute,
//! attributes from the declared fields (an attribute of the same name, or a mapping),
//! `requires` from the instance's `requires` relation restricted to resources. Unknown field
//! values mark the resource undefined; an unknown agent or id skips it. Duplicate ids and
//! dependency cycles are errors.
//!
//! As the reference's exporter: a `std::ManagedResource` exporting `managed` is left out when
//! it is false; the built-in mappings `@fs_content` and `@mitogen_via` compute a file's content
//! and a resource's mitogen context ([`fs`], [`mitogen`]); and fs's `dir_before_file` adds the
//! requires edges of files and directories to the directories they are in.

mod fs;
mod mitogen;
mod python;

use std::collections::{BTreeMap, HashMap};

use super::diagnostics::Diagnostic;
use super::eval::Runtime;
use super::eval::state::RvState;
use super::ids::EntityId;
use super::project::{ModuleInfo, ResourceDef};
use super::value::{InstId, Value};
use crate::model::{EXPORT_FORMAT, ExportFile, ExportMetadata, Resource, ResourceId};

enum Read {
    Value(Value),
    Unknown,
    Missing(String),
}

/// The resource id of each exported instance, by instance number (dense: every instance is
/// looked up, for its own resource and for each `requires` edge, and a hash map of 100,000
/// ids was rehashed as it grew).
struct ResourceIds(Vec<Option<ResourceId>>);

impl ResourceIds {
    fn new(instances: usize) -> ResourceIds {
        ResourceIds(vec![None; instances])
    }

    fn get(&self, inst: &InstId) -> Option<&ResourceId> {
        self.0.get(inst.0 as usize).and_then(Option::as_ref)
    }

    fn insert(&mut self, inst: InstId, id: ResourceId) {
        if let Some(slot) = self.0.get_mut(inst.0 as usize) {
            *slot = Some(id);
        }
    }
}

/// A dotted attribute path with each name interned once. The export reads the same few
/// paths of every resource (agent, id, each field, `requires`, `via`): looked up by name,
/// that was some twenty hash lookups per resource.
pub(super) struct AttrPath<'a> {
    text: &'a str,
    parts: Vec<(&'a str, Option<super::ids::Sym>)>,
}

impl<'a> AttrPath<'a> {
    pub(super) fn new(rt: &Runtime, text: &'a str) -> AttrPath<'a> {
        AttrPath {
            text,
            parts: text
                .split('.')
                .map(|part| (part, rt.p.syms.get(part)))
                .collect(),
        }
    }
}

/// The value at a dotted attribute path of an instance.
fn read_path(rt: &Runtime, inst: InstId, path: &str) -> Read {
    read_attr_path(rt, inst, &AttrPath::new(rt, path))
}

/// [`read_path`] of a path resolved once. Each value read on the way is marked read (see
/// [`read_own_field`]).
fn read_attr_path(rt: &Runtime, inst: InstId, path: &AttrPath) -> Read {
    read_attr_path_marking(rt, inst, path, true)
}

/// A resource's field that is one of its own attributes, as [`read_attr_path`] but not
/// marked read: the value goes into this field and nowhere else, so an incremental compile
/// may patch it there (`super::incremental`). Every other read of the export marks.
fn read_own_field(rt: &Runtime, inst: InstId, path: &AttrPath) -> Read {
    read_attr_path_marking(rt, inst, path, path.parts.len() > 1)
}

fn read_attr_path_marking(rt: &Runtime, inst: InstId, path: &AttrPath, mark: bool) -> Read {
    let mut cur = Value::Instance(inst);
    for &(part, sym) in &path.parts {
        let Value::Instance(i) = cur else {
            return Read::Missing(format!(
                "{}: {part} is not reached through an entity",
                path.text
            ));
        };
        let e = rt.inst_entity(i);
        let Some(slot) = sym.and_then(|sym| rt.p.entity(e).slot(sym)) else {
            return Read::Missing(format!(
                "no attribute {part} on {}",
                rt.p.entity(e).full_name
            ));
        };
        let rv = rt.attr_rv(i, slot);
        if mark {
            rt.rvs[rv.0 as usize].mark(super::eval::state::READ);
        }
        cur = match &rt.rvs[rv.0 as usize].state {
            RvState::Set(v) => v.clone(),
            RvState::FrozenNull => Value::Null,
            RvState::Unset => return Read::Unknown,
        };
        if cur.is_unknown() {
            return Read::Unknown;
        }
    }
    Read::Value(cur)
}

fn to_json(rt: &Runtime, v: &Value, ids: &ResourceIds) -> Option<serde_json::Value> {
    Some(match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Int(i) => serde_json::Value::from(*i),
        Value::BigInt(b) => {
            use num_traits::ToPrimitive;
            serde_json::Value::from(b.to_f64().unwrap_or(f64::NAN))
        }
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Value::Str(s) => serde_json::Value::String(s.to_string()),
        Value::List(l) => {
            let mut out = Vec::with_capacity(l.len());
            for x in l.iter() {
                out.push(to_json(rt, x, ids)?);
            }
            serde_json::Value::Array(out)
        }
        Value::Dict(d) => {
            let mut m = serde_json::Map::with_capacity(d.len());
            for (k, x) in d.iter() {
                m.insert(k.to_string(), to_json(rt, x, ids)?);
            }
            serde_json::Value::Object(m)
        }
        Value::Instance(i) => match ids.get(i) {
            Some(id) => serde_json::Value::String(id.0.clone()),
            None => serde_json::Value::String(rt.inst_site_text(*i)),
        },
        Value::Unknown => return None,
    })
}

/// The route of each resource of one export: the context its instance (or the instance's
/// host) is reached through, when that is not local. Each context's route is made once.
struct Routes<'r, 'p> {
    rt: &'r Runtime<'p>,
    via: AttrPath<'static>,
    host_via: AttrPath<'static>,
    of_context: HashMap<InstId, Option<String>>,
}

impl<'r, 'p> Routes<'r, 'p> {
    fn new(rt: &'r Runtime<'p>) -> Routes<'r, 'p> {
        Routes {
            rt,
            via: AttrPath::new(rt, "via"),
            host_via: AttrPath::new(rt, "host.via"),
            of_context: HashMap::new(),
        }
    }

    fn route(&mut self, inst: InstId) -> Option<String> {
        let rt = self.rt;
        let ctx = [&self.via, &self.host_via].iter().find_map(|path| {
            match read_attr_path(rt, inst, path) {
                Read::Value(Value::Instance(c)) => Some(c),
                _ => None,
            }
        })?;
        self.of_context
            .entry(ctx)
            .or_insert_with(|| context_route(rt, ctx))
            .clone()
    }
}

/// The route of a context instance (`None`: local).
fn context_route(rt: &Runtime, ctx: InstId) -> Option<String> {
    let text = |path: &str| match read_path(rt, ctx, path) {
        Read::Value(Value::Str(s)) => Some(s.to_string()),
        _ => None,
    };
    let method = text("method_name").unwrap_or_else(|| "local".into());
    if method == "local" {
        return None;
    }
    Some(match method.as_str() {
        "ssh" => format!(
            "ssh://{}{}",
            text("username")
                .map(|u| format!("{u}@"))
                .unwrap_or_default(),
            text("hostname").unwrap_or_default()
        ),
        other => format!(
            "{other}:{}",
            text("username")
                .or_else(|| text("hostname"))
                .unwrap_or_default()
        ),
    })
}

/// Resources on an agent whose `std::AgentConfig` points elsewhere (`host.remote_agent`)
/// get that URI as their route.
fn mark_remote_agents(resources: &mut [Resource]) {
    let remote: HashMap<String, String> = resources
        .iter()
        .filter(|r| r.type_name == "std::AgentConfig")
        .filter_map(|r| {
            let uri = r.attributes.get("uri")?.as_str()?;
            let name = r.attributes.get("agentname")?.as_str()?;
            (!uri.starts_with("local:")).then(|| (name.to_string(), uri.to_string()))
        })
        .collect();
    for r in resources.iter_mut() {
        if r.type_name == "std::AgentConfig" {
            continue;
        }
        if let Some(uri) = remote.get(&r.agent) {
            r.attributes
                .entry(crate::model::ROUTE_ATTRIBUTE)
                .or_insert_with(|| serde_json::Value::String(uri.clone()));
        }
    }
}

fn used_types(resources: &[Resource]) -> std::collections::BTreeSet<&str> {
    resources.iter().map(|r| r.type_name.as_str()).collect()
}

/// The entity `ns::name`, when the program has it.
fn entity_named(rt: &Runtime, ns: &str, name: &str) -> Option<EntityId> {
    match rt
        .p
        .namespaces
        .iter()
        .find(|n| n.name == ns)?
        .types
        .get(name)
    {
        Some(super::types::TypeRef::Entity(e)) => Some(*e),
        _ => None,
    }
}

fn value_text(rt: &Runtime, v: &Value) -> String {
    match v {
        Value::Str(s) => s.to_string(),
        other => rt.value_str(other),
    }
}

/// A resource type as the export reads it: its declaration in `module.yml`, with every
/// path in it resolved once.
struct Declared<'m> {
    type_name: &'m str,
    def: &'m ResourceDef,
    agent: AttrPath<'m>,
    id: AttrPath<'m>,
    skip_unless: Option<AttrPath<'m>>,
    /// It exports `managed` (see [`export`]: false leaves a `std::ManagedResource` out).
    exports_managed: bool,
    fields: Vec<(&'m str, FieldRead<'m>)>,
}

/// How one exported field is read.
enum FieldRead<'m> {
    /// `@fs_content`: [`fs::content`].
    FsContent,
    /// `@mitogen_via`: [`mitogen::Vias`].
    MitogenVia,
    /// An attribute path: the field's own name, or the one `map` gives it.
    Path(AttrPath<'m>),
}

impl<'m> Declared<'m> {
    fn new(rt: &Runtime, type_name: &'m str, def: &'m ResourceDef) -> Declared<'m> {
        Declared {
            type_name,
            def,
            agent: AttrPath::new(rt, &def.agent),
            id: AttrPath::new(rt, &def.id),
            skip_unless: def.skip_unless.as_deref().map(|f| AttrPath::new(rt, f)),
            exports_managed: def.fields.iter().any(|f| f == "managed"),
            fields: def
                .fields
                .iter()
                .map(|field| {
                    let how = match def.map.get(field).map(String::as_str) {
                        Some("@fs_content") => FieldRead::FsContent,
                        Some("@mitogen_via") => FieldRead::MitogenVia,
                        Some(path) => FieldRead::Path(AttrPath::new(rt, path)),
                        None => FieldRead::Path(AttrPath::new(rt, field)),
                    };
                    (field.as_str(), how)
                })
                .collect(),
        }
    }
}

/// A field of an exported resource that is exactly one attribute of its instance, read
/// for this field only (the incremental compile's candidates, `super::incremental`).
pub struct ExportedField<'m> {
    /// The resource's place in the export's resources.
    pub resource: u32,
    pub field: &'m str,
    pub inst: InstId,
    pub slot: u16,
}

impl<'m> ExportedField<'m> {
    /// List the field of the resource at `resource` when its value is a constant the
    /// constructor was given (a resource has about ten fields; most are not).
    fn list(
        out: &mut Vec<ExportedField<'m>>,
        rt: &Runtime,
        resource: usize,
        field: &'m str,
        inst: InstId,
        slot: u16,
    ) {
        if from_constructor_constant(rt, inst, slot) {
            out.push(ExportedField {
                resource: resource as u32,
                field,
                inst,
                slot,
            });
        }
    }
}

/// Is the value of `slot` of `inst` a constant its constructor was given?
fn from_constructor_constant(rt: &Runtime, inst: InstId, slot: u16) -> bool {
    let instance = &rt.instances[inst.0 as usize];
    if rt.rvs[(instance.rv_base + slot as u32) as usize].set_by != instance.site.0 {
        return false;
    }
    let super::ir::ExprKind::Construct(c) = &rt.p.ir.expr(instance.site).kind else {
        return false;
    };
    c.args.iter().any(|a| {
        a.slot == slot && matches!(rt.p.ir.expr(a.value).kind, super::ir::ExprKind::Const(_))
    })
}

/// Export the evaluated model. With `fields`, also list the fields that are plain
/// attributes of their instance ([`ExportedField`]).
pub fn export<'m>(
    rt: &mut Runtime,
    modules: &'m BTreeMap<String, ModuleInfo>,
    project: &str,
    python: &BTreeMap<String, super::plugins::python::ModulePython>,
    mut fields: Option<&mut Vec<ExportedField<'m>>>,
) -> Result<ExportFile, Vec<Diagnostic>> {
    let py = python::build(rt, python)?;
    let rt = &*rt;
    let p = rt.p;
    // resource type of every entity: its own declaration or the nearest ancestor's
    let mut declared: HashMap<EntityId, Declared> = HashMap::new();
    let mut module_of_type: HashMap<String, &ModuleInfo> = HashMap::new();
    for m in modules.values() {
        for (type_name, def) in &m.yml.resources {
            module_of_type.insert(type_name.clone(), m);
            let (ns, name) = type_name.rsplit_once("::").unwrap_or(("", type_name));
            if let Some(nsd) = p.namespaces.iter().find(|n| n.name == ns)
                && let Some(super::types::TypeRef::Entity(e)) = nsd.types.get(name)
            {
                declared.insert(*e, Declared::new(rt, type_name, def));
            }
        }
    }
    let resource_of = |e: EntityId| -> Option<&Declared> {
        declared
            .get(&e)
            .or_else(|| p.entity(e).ancestors.iter().find_map(|a| declared.get(a)))
    };
    let managed_resource = entity_named(rt, "std", "ManagedResource");
    let managed_path = AttrPath::new(rt, "managed");
    let requires_path = AttrPath::new(rt, "requires");
    let mut errors = Vec::new();
    let mut ids = ResourceIds::new(rt.instances.len());
    let mut seen_ids: foldhash::HashSet<ResourceId> =
        foldhash::HashSet::with_capacity_and_hasher(rt.instances.len(), Default::default());
    // the resource type and its definition borrowed: a clone of each per resource was 5 %
    // of a compile of 10,000
    let mut order: Vec<(InstId, &Declared, String)> = Vec::new();
    for i in 0..rt.instances.len() {
        let inst = InstId(i as u32);
        if py.handled.contains(&inst) {
            continue;
        }
        let Some(declared) = resource_of(rt.inst_entity(inst)) else {
            continue;
        };
        let (type_name, def) = (declared.type_name, declared.def);
        let span = p.ir.expr(rt.instances[i].site).span;
        if let Some(flag) = &declared.skip_unless
            && !matches!(
                read_attr_path(rt, inst, flag),
                Read::Value(Value::Bool(true))
            )
        {
            continue;
        }
        // std::ManagedResource with managed=false: not exported, as the reference's
        // `ManagedResource.get_managed` ignores it (an unknown `managed` is exported undefined)
        if let Some(m) = managed_resource
            && declared.exports_managed
            && p.is_subtype(rt.inst_entity(inst), m)
            && matches!(
                read_attr_path(rt, inst, &managed_path),
                Read::Value(Value::Bool(false))
            )
        {
            continue;
        }
        let agent = match read_attr_path(rt, inst, &declared.agent) {
            Read::Value(Value::Str(s)) => s.to_string(),
            Read::Value(other) => {
                errors.push(
                    Diagnostic::error(
                        "export",
                        format!(
                            "The agent of resource type {type_name} ({}) must be a string, got {}",
                            def.agent,
                            rt.value_repr(&other)
                        ),
                    )
                    .at(span),
                );
                continue;
            }
            Read::Unknown => continue,
            Read::Missing(m) => {
                errors.push(
                    Diagnostic::error("export", format!("resource type {type_name}: {m}")).at(span),
                );
                continue;
            }
        };
        let idv = match read_attr_path(rt, inst, &declared.id) {
            Read::Value(v) => value_text(rt, &v),
            Read::Unknown => continue,
            Read::Missing(m) => {
                errors.push(
                    Diagnostic::error("export", format!("resource type {type_name}: {m}")).at(span),
                );
                continue;
            }
        };
        let id = ResourceId::new(type_name, &agent, &def.id, &idv);
        if !seen_ids.insert(id.clone()) {
            errors.push(
                Diagnostic::error(
                    "duplicate-resource",
                    format!("Resource {id} exists more than once in the configuration model"),
                )
                .at(span),
            );
            continue;
        }
        ids.insert(inst, id.clone());
        order.push((inst, declared, agent));
    }
    for r in &py.resources {
        let id = ResourceId::new(&r.type_name, &r.agent, &r.attribute, &r.value);
        if !seen_ids.insert(id.clone()) {
            let span = p.ir.expr(rt.instances[r.inst.0 as usize].site).span;
            errors.push(
                Diagnostic::error(
                    "duplicate-resource",
                    format!("Resource {id} exists more than once in the configuration model"),
                )
                .at(span),
            );
            continue;
        }
        ids.insert(r.inst, id);
    }
    let mut resources = Vec::with_capacity(order.len() + py.resources.len());
    let mut undefined = Vec::new();
    let mut vias = mitogen::Vias::new(rt);
    let content_paths = fs::ContentPaths::new(rt);
    let mut routes = Routes::new(rt);
    for (inst, declared, agent) in &order {
        let (type_name, def) = (declared.type_name, declared.def);
        let Some(id) = ids.get(inst).cloned() else {
            continue;
        };
        let span = p.ir.expr(rt.instances[inst.0 as usize].site).span;
        // sized at once: grown insert by insert, the map (an IndexMap) was reallocated and
        // rehashed about 4 times for 9 attributes (4 % of a compile of 10,000 files)
        let mut attributes = serde_json::Map::with_capacity(def.fields.len() + 1);
        let mut is_undefined = false;
        for (field, how) in &declared.fields {
            let read = match how {
                FieldRead::FsContent => {
                    let (read, own) = fs::content(rt, *inst, &content_paths);
                    if let (Some(out), Some(slot)) = (fields.as_deref_mut(), own) {
                        ExportedField::list(out, rt, resources.len(), field, *inst, slot);
                    }
                    read
                }
                FieldRead::MitogenVia => match vias.via(*inst) {
                    Some(j) => {
                        attributes.insert(field.to_string(), j);
                        continue;
                    }
                    None => Read::Unknown,
                },
                FieldRead::Path(path) => {
                    if let (Some(out), [(_, Some(sym))]) = (fields.as_deref_mut(), &path.parts[..])
                        && let Some(slot) = p.entity(rt.inst_entity(*inst)).slot(*sym)
                    {
                        ExportedField::list(out, rt, resources.len(), field, *inst, slot);
                    }
                    read_own_field(rt, *inst, path)
                }
            };
            let json = match read {
                Read::Value(v) => match to_json(rt, &v, &ids) {
                    Some(j) => j,
                    None => {
                        is_undefined = true;
                        serde_json::Value::Null
                    }
                },
                Read::Unknown => {
                    is_undefined = true;
                    serde_json::Value::Null
                }
                Read::Missing(m) => {
                    errors.push(
                        Diagnostic::error(
                            "export",
                            format!("resource type {type_name}: field {field}: {m}"),
                        )
                        .at(span),
                    );
                    continue;
                }
            };
            attributes.insert(field.to_string(), json);
        }
        let mut requires: Vec<ResourceId> = match read_attr_path(rt, *inst, &requires_path) {
            Read::Value(Value::List(items)) => items
                .iter()
                .filter_map(|v| v.as_instance().and_then(|i| ids.get(&i).cloned()))
                .collect(),
            _ => Vec::new(),
        };
        requires.sort();
        requires.dedup();
        if is_undefined {
            undefined.push(id.clone());
        }
        if let Some(route) = routes.route(*inst) {
            attributes.insert(
                crate::model::ROUTE_ATTRIBUTE.into(),
                serde_json::Value::String(route),
            );
        }
        resources.push(Resource {
            id,
            type_name: type_name.to_string(),
            agent: agent.clone(),
            attributes,
            requires,
        });
    }
    for r in &py.resources {
        let Some(id) = ids.get(&r.inst).cloned() else {
            continue;
        };
        let mut requires: Vec<ResourceId> = match read_attr_path(rt, r.inst, &requires_path) {
            Read::Value(Value::List(items)) => items
                .iter()
                .filter_map(|v| v.as_instance().and_then(|i| ids.get(&i).cloned()))
                .collect(),
            _ => Vec::new(),
        };
        if let Some(extra) = &r.requires {
            requires.extend(extra.iter().map(|s| ResourceId(s.clone())));
        }
        requires.sort();
        requires.dedup();
        if r.undefined {
            undefined.push(id.clone());
        }
        resources.push(Resource {
            id,
            type_name: r.type_name.clone(),
            agent: r.agent.clone(),
            attributes: r.fields.clone(),
            requires,
        });
    }
    let instances: Vec<InstId> = order.iter().map(|o| o.0).collect();
    if let Err(message) = fs::dir_before_file(rt, &mut resources, &instances) {
        errors.push(Diagnostic::error("export", message));
    }
    mark_remote_agents(&mut resources);
    if let Some(cycle) = crate::model::find_cycle(&resources) {
        errors.push(Diagnostic::error(
            "dependency-cycle",
            format!(
                "Dependency cycle between resources: {}",
                cycle
                    .iter()
                    .map(|r| r.0.as_str())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            ),
        ));
    }
    // the code of the handlers the exported resource types use travels with the version
    let mut handlers = BTreeMap::new();
    let mut code = BTreeMap::new();
    let used: std::collections::BTreeSet<&str> =
        resources.iter().map(|r| r.type_name.as_str()).collect();
    for type_name in used {
        let Some(m) = module_of_type.get(type_name) else {
            continue;
        };
        let Some(entry) = m
            .yml
            .resources
            .get(type_name)
            .and_then(|d| d.handler.as_deref())
        else {
            continue;
        };
        match super::handler_code::collect(m, entry) {
            Ok((h, files)) => {
                code.extend(files);
                handlers.insert(type_name.to_string(), h);
            }
            Err(message) => errors.push(Diagnostic::error(
                "handler",
                format!(
                    "module {} declares handler '{entry}' for {type_name}: {message}",
                    m.name
                ),
            )),
        }
    }
    match python::handlers(&used_types(&resources), modules, python, &py.files) {
        Ok((h, files)) => {
            for (t, code_of) in h {
                handlers.entry(t).or_insert(code_of);
            }
            code.extend(files);
        }
        Err(message) => errors.push(Diagnostic::error(
            "handler",
            format!("the Python handlers can not be exported: {message}"),
        )),
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    match fields {
        // the fields name resources by place: each moves with its resource
        Some(fields) => {
            let mut order: Vec<u32> = (0..resources.len() as u32).collect();
            order.sort_by(|a, b| resources[*a as usize].id.cmp(&resources[*b as usize].id));
            let mut place = vec![0u32; resources.len()];
            for (new, old) in order.iter().enumerate() {
                place[*old as usize] = new as u32;
            }
            for f in fields.iter_mut() {
                f.resource = place[f.resource as usize];
            }
            let mut taken: Vec<Option<Resource>> = resources.into_iter().map(Some).collect();
            resources = order
                .iter()
                .map(|old| taken[*old as usize].take().expect("each place once"))
                .collect();
        }
        None => resources.sort_by(|a, b| a.id.cmp(&b.id)),
    }
    undefined.sort();
    Ok(ExportFile {
        unknowns: rt.host.unknowns(),
        handlers,
        code,
        format: EXPORT_FORMAT,
        resources,
        undefined,
        metadata: ExportMetadata {
            project: project.to_string(),
            compiler: format!("steward {}", env!("CARGO_PKG_VERSION")),
            modules: modules
                .iter()
                .map(|(k, m)| (k.clone(), m.version.clone()))
                .collect(),
        },
    })
}
