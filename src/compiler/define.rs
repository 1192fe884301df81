//! The define stage (LANGUAGE.md §1 stage 2): turn the syntax trees of all loaded files into
//! the type system of a [`Program`].
//!
//! Order mirrors the reference: register every type name, then typedefs, entities (parents
//! first), relations, slot layouts and defaults, indexes, implementations and implement rules.
//! Lowering of code (implementation bodies, conditions, top-level statements) follows in
//! `lower.rs`, once every type is known. Errors are collected; a failing stage stops the
//! pipeline before evaluation.

use std::collections::{HashMap, HashSet};

use super::ast;
use super::diagnostics::Diagnostic;
use super::ids::*;
use super::ir::Ir;
use super::lexer::IntLit;
use super::lower::Lowerer;
use super::names::{ResolvedType, hyphen_error, resolve_entity, resolve_type};
use super::plugins;
use super::program::Program;
use super::source::{FileId, Span};
use super::types::*;
use super::value::Value;

/// One parsed file and the namespace it defines.
pub struct LoadedFile {
    pub ns_name: String,
    pub module: String,
    pub file: FileId,
    pub ast: ast::File,
    /// `import` statements resolved by the loader: (visible name, namespace name).
    pub imports: Vec<(String, String, Span)>,
}

struct Definer {
    pub p: Program,
    pub errors: Vec<Diagnostic>,
    /// Per namespace: its file's syntax tree.
    pub files: Vec<Option<ast::File>>,
    /// Relation ends declared per entity, in declaration order (before layout).
    attr_names: HashMap<EntityId, HashSet<String>>,
}

pub fn define(files: Vec<LoadedFile>) -> Result<Program, Vec<Diagnostic>> {
    define_with(files, Vec::new())
}

/// [`define`] with the Python plugins of the modules.
pub fn define_with(
    files: Vec<LoadedFile>,
    python_plugins: Vec<plugins::python::PyPlugin>,
) -> Result<Program, Vec<Diagnostic>> {
    let mut d = Definer {
        p: Program {
            syms: Syms::default(),
            namespaces: Vec::new(),
            entities: Vec::new(),
            attributes: Vec::new(),
            typedefs: Vec::new(),
            implementations: Vec::new(),
            rules: Vec::new(),
            indexes: Vec::new(),
            ir: Ir::default(),
            root_entity: EntityId(0),
            load_order: Vec::new(),
            python_plugins,
        },
        errors: Vec::new(),
        files: Vec::new(),
        attr_names: HashMap::new(),
    };
    d.create_namespaces(files);
    d.register_types();
    if !d.errors.is_empty() {
        return Err(d.errors);
    }
    d.define_typedefs();
    d.check_typedef_cycles();
    d.define_entities();
    if !d.errors.is_empty() {
        return Err(d.errors);
    }
    d.define_relations();
    d.compute_layouts();
    d.define_indexes();
    if !d.errors.is_empty() {
        return Err(d.errors);
    }
    d.define_implementations();
    d.define_rules();
    if !d.errors.is_empty() {
        return Err(d.errors);
    }
    d.compute_effective_rules();
    Lowerer::new(&mut d.p, &mut d.files, &mut d.errors).lower_all();
    if !d.errors.is_empty() {
        return Err(d.errors);
    }
    Ok(d.p)
}

/// The module whose plugins run built in even when its real package is loaded.
const BUILT_IN_FIRST: &str = "std";

impl Definer {
    fn create_namespaces(&mut self, files: Vec<LoadedFile>) {
        let mut by_name: HashMap<String, NsId> = HashMap::new();
        let mut imports = Vec::new();
        for f in files {
            let id = NsId(self.p.namespaces.len() as u32);
            by_name.insert(f.ns_name.clone(), id);
            let mut visible = HashMap::new();
            visible.insert(f.ns_name.clone(), id);
            self.p.namespaces.push(Namespace {
                name: f.ns_name,
                module: f.module,
                file: Some(f.file),
                parent: None,
                visible,
                types: HashMap::new(),
                type_spans: HashMap::new(),
                top_block: None,
                top_vars: HashMap::new(),
            });
            self.files.push(Some(f.ast));
            imports.push(f.imports);
            self.p.load_order.push(id);
        }
        let std = by_name.get("std").copied();
        #[allow(clippy::needless_range_loop)] // namespaces are mutated while imports are read
        for i in 0..self.p.namespaces.len() {
            let name = self.p.namespaces[i].name.clone();
            if let Some((parent, _)) = name.rsplit_once("::") {
                self.p.namespaces[i].parent = by_name.get(parent).copied();
            }
            if let Some(std) = std {
                self.p.namespaces[i].visible.insert("std".into(), std);
            }
            for (alias, target, span) in &imports[i] {
                if let Some(t) = by_name.get(target) {
                    let ns = &mut self.p.namespaces[i];
                    if let Some(prev) = ns.visible.get(alias)
                        && *prev != *t
                        && alias != "std"
                    {
                        self.errors.push(
                            Diagnostic::error(
                                "duplicate",
                                format!("Two import statements have the same name {alias}"),
                            )
                            .at(*span),
                        );
                    }
                    ns.visible.insert(alias.clone(), *t);
                }
            }
        }
        // std::Entity is built in: every entity derives from it.
        if let Some(std) = std {
            let span = Span::default();
            let root = self.new_entity("Entity", std, span);
            self.p.root_entity = root;
            self.p.namespaces[std.0 as usize]
                .types
                .insert("Entity".into(), TypeRef::Entity(root));
        }
    }

    fn new_entity(&mut self, name: &str, ns: NsId, span: Span) -> EntityId {
        let full_name = format!("{}::{}", self.p.ns(ns).name, name);
        let id = EntityId(self.p.entities.len() as u32);
        self.p.entities.push(Entity {
            name: name.to_string(),
            full_name,
            ns,
            span,
            parents: Vec::new(),
            own_attrs: Vec::new(),
            slots: Vec::new(),
            slot_of: Vec::new(),
            defaults: Vec::new(),
            indexes: Vec::new(),
            index_slot: Vec::new(),
            rules: Vec::new(),
            effective_rules: Vec::new(),
            ancestors: Vec::new(),
            descendants: Vec::new(),
        });
        id
    }

    fn define_type_name(&mut self, ns: NsId, name: &ast::Name, t: TypeRef, what: &str) {
        let nsd = &mut self.p.namespaces[ns.0 as usize];
        if let Some(prev) = nsd.type_spans.get(&name.text) {
            let full = format!("{}::{}", nsd.name, name.text);
            let msg = match what {
                "entity" => format!("Entity {full} is already defined"),
                "implementation" => format!("Implementation {full} is already defined"),
                _ => format!("Type {full} is already defined"),
            };
            let prev = *prev;
            self.errors.push(
                Diagnostic::error("duplicate", msg)
                    .at(name.span)
                    .with_label(prev, "first defined here"),
            );
            return;
        }
        nsd.type_spans.insert(name.text.clone(), name.span);
        nsd.types.insert(name.text.clone(), t);
    }

    fn register_types(&mut self) {
        // A module whose real package is loaded (std pinned in requirements.txt) has the
        // plugins its Python defines, no more. For std, those Steward has built in run built
        // in (the same results, checked against the reference's exports, without a round
        // trip to Python); the others, and every other module's, run in Python.
        let python_namespaces: HashSet<&str> = self
            .p
            .python_plugins
            .iter()
            .map(|pd| pd.namespace.as_str())
            .collect();
        let python_names: HashSet<(&str, &str)> = self
            .p
            .python_plugins
            .iter()
            .map(|pd| (pd.namespace.as_str(), pd.name.as_str()))
            .collect();
        let builtin_names: HashSet<(&str, &str)> = plugins::all()
            .iter()
            .map(|pd| (pd.namespace, pd.name))
            .collect();
        let mut registered: Vec<(String, String, PluginId)> = Vec::new();
        for (i, pd) in plugins::all().iter().enumerate() {
            if python_namespaces.contains(pd.namespace)
                && !python_names.contains(&(pd.namespace, pd.name))
            {
                continue;
            }
            registered.push((
                pd.namespace.to_string(),
                pd.name.to_string(),
                PluginId(i as u32),
            ));
        }
        let builtin = plugins::all().len();
        for (i, pd) in self.p.python_plugins.iter().enumerate() {
            let kept_built_in = pd.namespace == BUILT_IN_FIRST
                && builtin_names.contains(&(pd.namespace.as_str(), pd.name.as_str()));
            if !kept_built_in {
                registered.push((
                    pd.namespace.clone(),
                    pd.name.clone(),
                    PluginId((builtin + i) as u32),
                ));
            }
        }
        for (namespace, name, id) in registered {
            for ns in &mut self.p.namespaces {
                if ns.name == namespace {
                    ns.types.insert(name.clone(), TypeRef::Plugin(id));
                }
            }
        }
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().unwrap_or_default();
            for item in &file.items {
                match item {
                    ast::TopItem::Entity(e) => {
                        if let Some(err) = hyphen_error(&e.name) {
                            self.errors.push(err);
                        }
                        let id = self.new_entity(&e.name.text, ns, e.name.span);
                        self.define_type_name(ns, &e.name, TypeRef::Entity(id), "entity");
                    }
                    ast::TopItem::Typedef(t) => {
                        if let Some(err) = hyphen_error(&t.name) {
                            self.errors.push(err);
                        }
                        let id = TypedefId(self.p.typedefs.len() as u32);
                        self.p.typedefs.push(Typedef {
                            name: t.name.text.clone(),
                            full_name: format!("{}::{}", self.p.ns(ns).name, t.name.text),
                            ns,
                            span: t.name.span,
                            base: BaseType::Prim(Prim::String),
                            // a placeholder, replaced when the typedef is resolved
                            constraint: Constraint::regex(String::new()),
                        });
                        if Prim::from_name(&t.name.text).is_some() {
                            // redefining a primitive name only warns in the reference
                            continue;
                        }
                        self.define_type_name(ns, &t.name, TypeRef::Typedef(id), "typedef");
                    }
                    ast::TopItem::Implementation(im) => {
                        if let Some(err) = hyphen_error(&im.name) {
                            self.errors.push(err);
                        }
                        let id = ImplId(self.p.implementations.len() as u32);
                        self.p.implementations.push(Implementation {
                            name: im.name.text.clone(),
                            full_name: format!("{}::{}", self.p.ns(ns).name, im.name.text),
                            ns,
                            entity: EntityId(0),
                            body: BlockId(0),
                            span: im.name.span,
                        });
                        self.define_type_name(
                            ns,
                            &im.name,
                            TypeRef::Implementation(id),
                            "implementation",
                        );
                    }
                    _ => {}
                }
            }
            self.files[nsi] = Some(file);
        }
    }

    fn resolve_base_type(&self, ns: NsId, q: &ast::QName) -> Result<BaseType, Diagnostic> {
        match resolve_type(&self.p, ns, q)? {
            ResolvedType::Prim(p) => Ok(BaseType::Prim(p)),
            ResolvedType::Named(TypeRef::Typedef(t)) => Ok(BaseType::Typedef(t)),
            ResolvedType::Named(TypeRef::Entity(e)) => Ok(BaseType::Entity(e)),
            _ => Err(Diagnostic::error(
                "unknown-type",
                format!(
                    "could not find type {} in namespace {}",
                    q.full(),
                    self.p.ns(ns).name
                ),
            )
            .at(q.span)),
        }
    }

    fn define_typedefs(&mut self) {
        let mut next = 0usize;
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().unwrap_or_default();
            for item in &file.items {
                let ast::TopItem::Typedef(t) = item else {
                    continue;
                };
                let id = TypedefId(next as u32);
                next += 1;
                match self.resolve_base_type(ns, &t.base) {
                    Ok(BaseType::Entity(_)) => self.errors.push(
                        Diagnostic::error(
                            "typedef",
                            format!(
                                "can not use an entity as the base of typedef {}",
                                t.name.text
                            ),
                        )
                        .at(t.base.span),
                    ),
                    Ok(b) => self.p.typedefs[id.0 as usize].base = b,
                    Err(e) => self.errors.push(e),
                }
                match &t.constraint {
                    ast::TypedefConstraint::Regex(src, _) => {
                        self.p.typedefs[id.0 as usize].constraint = Constraint::regex(src.clone())
                    }
                    ast::TypedefConstraint::Expr(e) => {
                        if !mentions_self_or(e, &t.name.text) {
                            self.errors.push(
                                Diagnostic::error(
                                    "typedef",
                                    format!(
                                        "typedef expressions should reference the self variable ({})",
                                        t.name.text
                                    ),
                                )
                                .at(t.name.span),
                            );
                            continue;
                        }
                        let text = ast::pretty(e);
                        match Lowerer::new(&mut self.p, &mut self.files, &mut self.errors)
                            .lower_typedef_expr(ns, e, &t.name.text)
                        {
                            Ok(expr) => {
                                self.p.typedefs[id.0 as usize].constraint =
                                    Constraint::Expr { expr, text }
                            }
                            Err(err) => self.errors.push(err),
                        }
                    }
                }
            }
            self.files[nsi] = Some(file);
        }
    }

    /// A typedef whose base chain comes back to itself can not validate anything.
    fn check_typedef_cycles(&mut self) {
        for i in 0..self.p.typedefs.len() {
            let mut seen = vec![i];
            let mut cur = self.p.typedefs[i].base;
            while let BaseType::Typedef(t) = cur {
                if seen.contains(&(t.0 as usize)) {
                    let td = &self.p.typedefs[i];
                    self.errors.push(
                        Diagnostic::error(
                            "typedef",
                            format!("typedef {} is defined in terms of itself", td.full_name),
                        )
                        .at(td.span),
                    );
                    return;
                }
                seen.push(t.0 as usize);
                cur = self.p.typedefs[t.0 as usize].base;
            }
        }
    }

    fn define_entities(&mut self) {
        // map entity definitions to ids in registration order
        let mut next = self.p.root_entity.0 as usize + 1;
        let mut defs: Vec<(EntityId, NsId, usize)> = Vec::new();
        for nsi in 0..self.files.len() {
            let file = self.files[nsi].as_ref().expect("file present");
            for (idx, item) in file.items.iter().enumerate() {
                if let ast::TopItem::Entity(_) = item {
                    defs.push((EntityId(next as u32), NsId(nsi as u32), idx));
                    next += 1;
                }
            }
        }
        let root = self.p.root_entity;
        // parents
        for &(id, ns, idx) in &defs {
            let file = self.files[ns.0 as usize].take().expect("file present");
            let ast::TopItem::Entity(e) = &file.items[idx] else {
                unreachable!()
            };
            let mut parents = Vec::new();
            for pq in &e.parents {
                match resolve_type(&self.p, ns, pq) {
                    Ok(ResolvedType::Named(TypeRef::Entity(pe))) => {
                        if parents.contains(&pe) {
                            self.errors.push(
                                Diagnostic::error(
                                    "inheritance",
                                    format!(
                                        "same parent defined twice: {} extends {} twice",
                                        self.p.entity(id).full_name,
                                        self.p.entity(pe).full_name
                                    ),
                                )
                                .at(pq.span),
                            );
                        }
                        parents.push(pe)
                    }
                    Ok(_) => self.errors.push(
                        Diagnostic::error(
                            "inheritance",
                            format!(
                                "Entity can only inherit from other entities, {} is not an entity",
                                pq.full()
                            ),
                        )
                        .at(pq.span),
                    ),
                    Err(err) => self.errors.push(err),
                }
            }
            if parents.is_empty() && id != root {
                parents.push(root);
            }
            self.p.entities[id.0 as usize].parents = parents;
            self.files[ns.0 as usize] = Some(file);
        }
        // inheritance cycles, found as the reference's parents-first sort finds them: walking
        // from each entity in definition order, the entity whose parent is on the walk stack
        // is reported
        let mut state: HashMap<EntityId, u8> = HashMap::new();
        for &(id, _, _) in &defs {
            if self.errors.is_empty() && !state.contains_key(&id) {
                let mut stack = Vec::new();
                self.find_cycle(id, &mut state, &mut stack);
            }
        }
        if !self.errors.is_empty() {
            return;
        }
        for &(id, _, _) in &defs {
            let mut seen = Vec::new();
            let mut stack = self.p.entity(id).parents.clone();
            while let Some(x) = stack.pop() {
                if !seen.contains(&x) {
                    seen.push(x);
                    stack.extend(self.p.entity(x).parents.iter().copied());
                }
            }
            self.p.entities[id.0 as usize].ancestors = seen;
        }
        if !self.errors.is_empty() {
            return;
        }
        for i in 0..self.p.entities.len() {
            let id = EntityId(i as u32);
            for a in self.p.entities[i].ancestors.clone() {
                self.p.entities[a.0 as usize].descendants.push(id);
            }
        }
        // root relations: std::Entity.requires [0:] -- std::Entity.provides [0:]
        if !self.p.namespaces.is_empty() {
            let span = Span::default();
            let req = self.add_attr(
                root,
                "requires",
                span,
                AttrKind::Relation {
                    target: root,
                    low: 0,
                    high: None,
                    reverse: None,
                },
            );
            let prov = self.add_attr(
                root,
                "provides",
                span,
                AttrKind::Relation {
                    target: root,
                    low: 0,
                    high: None,
                    reverse: Some(req),
                },
            );
            if let AttrKind::Relation { reverse, .. } = &mut self.p.attributes[req.0 as usize].kind
            {
                *reverse = Some(prov);
            }
        }
        // attributes
        for &(id, ns, idx) in &defs {
            let file = self.files[ns.0 as usize].take().expect("file present");
            let ast::TopItem::Entity(e) = &file.items[idx] else {
                unreachable!()
            };
            for a in &e.attributes {
                self.define_attribute(id, ns, a);
            }
            self.files[ns.0 as usize] = Some(file);
        }
    }

    fn find_cycle(
        &mut self,
        e: EntityId,
        state: &mut HashMap<EntityId, u8>,
        stack: &mut Vec<EntityId>,
    ) {
        state.insert(e, 1);
        stack.push(e);
        for p in self.p.entity(e).parents.clone() {
            if !self.errors.is_empty() {
                return;
            }
            match state.get(&p).copied() {
                Some(1) => {
                    let pos = stack.iter().position(|x| *x == p).unwrap_or(0);
                    let names: Vec<String> = stack[pos..]
                        .iter()
                        .rev()
                        .map(|x| self.p.entity(*x).full_name.clone())
                        .collect();
                    self.errors.push(
                        Diagnostic::error(
                            "inheritance",
                            format!("Entity can not be its own parent ({})", names.join(",")),
                        )
                        .at(self.p.entity(e).span),
                    );
                    return;
                }
                Some(_) => {}
                None => self.find_cycle(p, state, stack),
            }
        }
        stack.pop();
        state.insert(e, 2);
    }

    fn add_attr(&mut self, owner: EntityId, name: &str, span: Span, kind: AttrKind) -> AttrId {
        let sym = self.p.syms.intern(name);
        let id = AttrId(self.p.attributes.len() as u32);
        self.p.attributes.push(Attribute {
            name: name.to_string(),
            sym,
            owner,
            kind,
            span,
        });
        self.p.entities[owner.0 as usize].own_attrs.push(id);
        self.attr_names
            .entry(owner)
            .or_default()
            .insert(name.to_string());
        id
    }

    fn define_attribute(&mut self, owner: EntityId, ns: NsId, a: &ast::AttributeDef) {
        if let Some(err) = hyphen_error(&a.name) {
            self.errors.push(err);
            return;
        }
        if self
            .attr_names
            .get(&owner)
            .is_some_and(|s| s.contains(&a.name.text))
        {
            self.errors.push(
                Diagnostic::error(
                    "duplicate",
                    format!(
                        "attribute '{}' already exists on entity '{}'",
                        a.name.text,
                        self.p.entity(owner).name
                    ),
                )
                .at(a.name.span),
            );
            return;
        }
        let ty = match &a.ty {
            ast::TypeRef::Dict { nullable, .. } => ValueType {
                base: BaseType::Prim(Prim::Dict),
                list: false,
                nullable: *nullable,
            },
            ast::TypeRef::Named {
                name,
                list,
                nullable,
            } => match self.resolve_base_type(ns, name) {
                Ok(BaseType::Entity(_)) => {
                    self.errors.push(
                        Diagnostic::error(
                            "attribute-type",
                            format!(
                                "Invalid type for attribute {}: entities can not be used as attribute types, use a relation",
                                a.name.text
                            ),
                        )
                        .at(name.span),
                    );
                    return;
                }
                Ok(base) => ValueType {
                    base,
                    list: *list,
                    nullable: *nullable,
                },
                Err(e) => {
                    self.errors.push(e);
                    return;
                }
            },
        };
        let default = match &a.default {
            None => DefaultDecl::None,
            Some(ast::DefaultValue::Undef(_)) => DefaultDecl::Undef,
            Some(ast::DefaultValue::Value(e)) => match const_value(e) {
                Some(v) => DefaultDecl::Value(v),
                None => {
                    self.errors.push(
                        Diagnostic::error(
                            "syntax",
                            "Syntax error: default values must be constants",
                        )
                        .at(e.span),
                    );
                    return;
                }
            },
        };
        // redeclaring an inherited attribute is fine with the same type; an inherited relation
        // end is shadowed (the reference compares attributes before any relation exists, so
        // files::systemd_unit::Unit may declare `string[] requires` over std::Entity.requires)
        let ancestors = self.p.entity(owner).ancestors.clone();
        for anc in ancestors {
            for &aid in &self.p.entity(anc).own_attrs {
                let pa = self.p.attr(aid);
                if pa.name != a.name.text {
                    continue;
                }
                let AttrKind::Value { ty: parent_ty, .. } = &pa.kind else {
                    continue;
                };
                if *parent_ty != ty {
                    self.errors.push(
                        Diagnostic::error(
                            "inheritance",
                            format!(
                                "Incompatible attributes: {}.{} ({}) and {}.{} ({})",
                                self.p.entity(owner).full_name,
                                a.name.text,
                                self.p.value_type_name(&ty),
                                self.p.entity(anc).full_name,
                                pa.name,
                                self.p.value_type_name(parent_ty),
                            ),
                        )
                        .at(a.name.span),
                    );
                    return;
                }
            }
        }
        self.add_attr(
            owner,
            &a.name.text,
            a.name.span,
            AttrKind::Value { ty, default },
        );
    }

    /// Does `entity` or an ancestor declare `name`? Returns the declaring entity.
    fn declared_in(&self, entity: EntityId, name: &str) -> Option<EntityId> {
        if self
            .attr_names
            .get(&entity)
            .is_some_and(|s| s.contains(name))
        {
            return Some(entity);
        }
        self.p
            .entity(entity)
            .ancestors
            .iter()
            .copied()
            .find(|a| self.attr_names.get(a).is_some_and(|s| s.contains(name)))
    }

    fn define_relations(&mut self) {
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().expect("file present");
            for item in &file.items {
                let ast::TopItem::Relation(r) = item else {
                    continue;
                };
                self.define_relation(ns, r);
            }
            self.files[nsi] = Some(file);
        }
    }

    fn define_relation(&mut self, ns: NsId, r: &ast::RelationDef) {
        let left = match resolve_entity(&self.p, ns, &r.left.entity) {
            Ok(e) => e,
            Err(e) => return self.errors.push(e),
        };
        let right = match resolve_entity(&self.p, ns, &r.right_entity) {
            Ok(e) => e,
            Err(e) => return self.errors.push(e),
        };
        let check = |d: &mut Definer, ent: EntityId, name: &ast::Name| -> bool {
            if let Some(err) = hyphen_error(name) {
                d.errors.push(err);
                return false;
            }
            if let Some(owner) = d.declared_in(ent, &name.text) {
                let msg = if owner == ent {
                    format!(
                        "attribute '{}' already exists on entity '{}'",
                        name.text,
                        d.p.entity(ent).name
                    )
                } else {
                    format!(
                        "Attribute name {} is already defined in {}, unable to define relationship",
                        name.text,
                        d.p.entity(owner).name
                    )
                };
                d.errors
                    .push(Diagnostic::error("duplicate", msg).at(name.span));
                return false;
            }
            true
        };
        if !check(self, left, &r.left.name) {
            return;
        }
        let m = r.left.multiplicity;
        let left_attr = self.add_attr(
            left,
            &r.left.name.text,
            r.left.name.span,
            AttrKind::Relation {
                target: right,
                low: m.low,
                high: m.high,
                reverse: None,
            },
        );
        if let Some((rname, rm)) = &r.right {
            let self_inverse = left == right && rname.text == r.left.name.text;
            if self_inverse {
                if let AttrKind::Relation { reverse, .. } =
                    &mut self.p.attributes[left_attr.0 as usize].kind
                {
                    *reverse = Some(left_attr);
                }
                return;
            }
            if !check(self, right, rname) {
                return;
            }
            let right_attr = self.add_attr(
                right,
                &rname.text,
                rname.span,
                AttrKind::Relation {
                    target: left,
                    low: rm.low,
                    high: rm.high,
                    reverse: Some(left_attr),
                },
            );
            if let AttrKind::Relation { reverse, .. } =
                &mut self.p.attributes[left_attr.0 as usize].kind
            {
                *reverse = Some(right_attr);
            }
        }
    }

    fn compute_layouts(&mut self) {
        // parents before children: sort by number of ancestors
        let mut order: Vec<usize> = (0..self.p.entities.len()).collect();
        order.sort_by_key(|&i| self.p.entities[i].ancestors.len());
        let nsyms = self.p.syms.len();
        for i in order {
            let own = self.p.entities[i].own_attrs.clone();
            let parents = self.p.entities[i].parents.clone();
            let mut slots: Vec<AttrId> = Vec::new();
            let mut names: HashMap<String, usize> = HashMap::new();
            for a in own {
                names.insert(self.p.attr(a).name.clone(), slots.len());
                slots.push(a);
            }
            for p in &parents {
                for &a in &self.p.entities[p.0 as usize].slots {
                    let n = &self.p.attr(a).name;
                    if !names.contains_key(n) {
                        names.insert(n.clone(), slots.len());
                        slots.push(a);
                    }
                }
            }
            let mut slot_of = vec![NO_SLOT; nsyms];
            for (s, a) in slots.iter().enumerate() {
                slot_of[self.p.attr(*a).sym.0 as usize] = s as u16;
            }
            // defaults: rightmost parent first, leftmost overrides, own overrides
            let mut defaults: HashMap<String, Option<Value>> = HashMap::new();
            for p in parents.iter().rev() {
                let pe = &self.p.entities[p.0 as usize];
                for (s, a) in pe.slots.iter().enumerate() {
                    if let Some(v) = &pe.defaults[s] {
                        defaults.insert(self.p.attr(*a).name.clone(), Some(v.clone()));
                    }
                }
            }
            for &a in &self.p.entities[i].own_attrs {
                let at = self.p.attr(a);
                if let AttrKind::Value { default, .. } = &at.kind {
                    match default {
                        DefaultDecl::None => {}
                        DefaultDecl::Value(v) => {
                            defaults.insert(at.name.clone(), Some(v.clone()));
                        }
                        DefaultDecl::Undef => {
                            defaults.insert(at.name.clone(), None);
                        }
                    }
                }
            }
            let defaults = slots
                .iter()
                .map(|a| defaults.get(&self.p.attr(*a).name).cloned().flatten())
                .collect();
            let e = &mut self.p.entities[i];
            e.index_slot = vec![false; slots.len()];
            e.slots = slots;
            e.slot_of = slot_of;
            e.defaults = defaults;
        }
    }

    fn define_indexes(&mut self) {
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().expect("file present");
            for item in &file.items {
                let ast::TopItem::Index(ix) = item else {
                    continue;
                };
                let entity = match resolve_entity(&self.p, ns, &ix.entity) {
                    Ok(e) => e,
                    Err(e) => {
                        self.errors.push(e);
                        continue;
                    }
                };
                let mut ok = true;
                let mut attrs = Vec::new();
                for n in &ix.attributes {
                    let Some(sym) = self.p.syms.get(&n.text) else {
                        self.errors.push(not_in_index(
                            &n.text,
                            &self.p.entity(entity).full_name,
                            n.span,
                        ));
                        ok = false;
                        continue;
                    };
                    let Some(slot) = self.p.entity(entity).slot(sym) else {
                        self.errors.push(not_in_index(
                            &n.text,
                            &self.p.entity(entity).full_name,
                            n.span,
                        ));
                        ok = false;
                        continue;
                    };
                    let at = self.p.slot_attr(entity, slot);
                    let bad = match &at.kind {
                        AttrKind::Value { ty, .. } if ty.list => {
                            Some("Index can not contain list attributes")
                        }
                        AttrKind::Relation { high, .. } if *high != Some(1) => {
                            Some("Index can not contain list attributes")
                        }
                        AttrKind::Relation { low: 0, .. } => {
                            Some("Index can not contain optional relations")
                        }
                        _ => None,
                    };
                    if let Some(msg) = bad {
                        self.errors.push(Diagnostic::error("index", msg).at(n.span));
                        ok = false;
                    }
                    attrs.push(n.text.clone());
                }
                if !ok {
                    continue;
                }
                // identical duplicates (also inherited ones) are ignored
                let mut sorted = attrs.clone();
                sorted.sort();
                let dup = self.p.entity(entity).indexes.iter().any(|(id, _)| {
                    let mut o = self.p.indexes[id.0 as usize].attrs.clone();
                    o.sort();
                    o == sorted
                });
                if dup {
                    continue;
                }
                let id = IndexId(self.p.indexes.len() as u32);
                self.p.indexes.push(IndexDef {
                    entity,
                    attrs: attrs.clone(),
                    span: ix.span,
                });
                let mut targets = vec![entity];
                targets.extend(self.p.entity(entity).descendants.iter().copied());
                for t in targets {
                    let slots: Vec<u16> = attrs
                        .iter()
                        .map(|a| {
                            self.p
                                .entity(t)
                                .slot(self.p.syms.get(a).expect("interned"))
                                .expect("inherited attribute")
                        })
                        .collect();
                    let e = &mut self.p.entities[t.0 as usize];
                    for &s in &slots {
                        e.index_slot[s as usize] = true;
                    }
                    e.indexes.push((id, slots));
                }
            }
            self.files[nsi] = Some(file);
        }
    }

    fn define_implementations(&mut self) {
        let mut next = 0usize;
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().expect("file present");
            for item in &file.items {
                let ast::TopItem::Implementation(im) = item else {
                    continue;
                };
                let id = ImplId(next as u32);
                next += 1;
                match resolve_entity(&self.p, ns, &im.entity) {
                    Ok(e) => self.p.implementations[id.0 as usize].entity = e,
                    Err(e) => self.errors.push(e),
                }
            }
            self.files[nsi] = Some(file);
        }
    }

    fn define_rules(&mut self) {
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().expect("file present");
            for item in &file.items {
                let ast::TopItem::Implement(r) = item else {
                    continue;
                };
                let entity = match resolve_entity(&self.p, ns, &r.entity) {
                    Ok(e) => e,
                    Err(e) => {
                        self.errors.push(e);
                        continue;
                    }
                };
                let mut impls = Vec::new();
                let mut uses_parents = false;
                for ir in &r.implementations {
                    match ir {
                        ast::ImplRef::Parents(_) => uses_parents = true,
                        ast::ImplRef::Named(q) => match resolve_type(&self.p, ns, q) {
                            Ok(ResolvedType::Named(TypeRef::Implementation(i))) => {
                                let ie = self.p.implementations[i.0 as usize].entity;
                                if !self.p.is_subtype(entity, ie) {
                                    self.errors.push(
                                        Diagnostic::error(
                                            "type-mismatch",
                                            format!(
                                                "Type mismatch: cannot use {} as implementation for {} because its implementing type is {}",
                                                self.p.implementations[i.0 as usize].name,
                                                self.p.entity(entity).full_name,
                                                self.p.entity(ie).full_name
                                            ),
                                        )
                                        .at(q.span),
                                    );
                                }
                                impls.push(i)
                            }
                            Ok(_) => self.errors.push(
                                Diagnostic::error(
                                    "unknown-type",
                                    format!("{} is not an implementation", q.full()),
                                )
                                .at(q.span),
                            ),
                            Err(e) => self.errors.push(e),
                        },
                    }
                }
                if uses_parents
                    && let Some(w) = &r.when
                    && !matches!(w.kind, ast::ExprKind::Bool(true))
                {
                    self.errors.push(
                        Diagnostic::error(
                            "implement",
                            "Conditional implementation with parents not allowed",
                        )
                        .at(r.span),
                    );
                    continue;
                }
                let id = RuleId(self.p.rules.len() as u32);
                self.p.rules.push(ImplementRule {
                    entity,
                    implementations: impls,
                    uses_parents,
                    condition: None,
                    ns,
                    span: r.span,
                });
                self.p.entities[entity.0 as usize].rules.push(id);
            }
            self.files[nsi] = Some(file);
        }
    }

    fn compute_effective_rules(&mut self) {
        fn collect(p: &Program, e: EntityId, out: &mut Vec<RuleId>, seen: &mut HashSet<EntityId>) {
            if !seen.insert(e) {
                return;
            }
            let ent = p.entity(e);
            out.extend(ent.rules.iter().copied());
            if ent.rules.iter().any(|r| p.rules[r.0 as usize].uses_parents) {
                for par in &ent.parents {
                    collect(p, *par, out, seen);
                }
            }
        }
        for i in 0..self.p.entities.len() {
            let mut out = Vec::new();
            collect(&self.p, EntityId(i as u32), &mut out, &mut HashSet::new());
            self.p.entities[i].effective_rules = out;
        }
    }
}

fn not_in_index(attr: &str, entity: &str, span: Span) -> Diagnostic {
    Diagnostic::error(
        "index",
        format!("Attribute '{attr}' referenced in index is not defined in entity {entity}"),
    )
    .at(span)
}

/// The value of a constant expression (defaults): literals, lists of them, `{…}` dicts.
pub(crate) fn const_value(e: &ast::Expr) -> Option<Value> {
    Some(match &e.kind {
        ast::ExprKind::Null => Value::Null,
        ast::ExprKind::Bool(b) => Value::Bool(*b),
        ast::ExprKind::Int(IntLit::Small(i)) => Value::Int(*i),
        ast::ExprKind::Int(IntLit::Big(b)) => Value::from_bigint(b.clone()),
        ast::ExprKind::Float(f) => Value::Float(*f),
        ast::ExprKind::Str(s) => Value::str(s),
        // interpolation in a default is kept as text, as the reference does
        ast::ExprKind::Interpolated(parts) => {
            let mut s = String::new();
            for p in parts {
                match p {
                    ast::InterpPart::Text(t) => s.push_str(t),
                    ast::InterpPart::Ref(path) => {
                        s.push_str("{{");
                        s.push_str(
                            &path
                                .iter()
                                .map(|n| n.text.as_str())
                                .collect::<Vec<_>>()
                                .join("."),
                        );
                        s.push_str("}}");
                    }
                }
            }
            Value::string(s)
        }
        ast::ExprKind::List(items) => {
            let mut out = Vec::new();
            for i in items {
                match const_value(i)? {
                    Value::List(l) => out.extend(l.iter().cloned()),
                    v => out.push(v),
                }
            }
            Value::list(out)
        }
        ast::ExprKind::Dict(pairs) => {
            let mut d = super::value::Dict::new();
            for (k, v) in pairs {
                d.insert(k.as_str().into(), const_value(v)?);
            }
            Value::Dict(std::rc::Rc::new(d))
        }
        _ => return None,
    })
}

/// A typedef expression must mention `self` (or the typedef's own name).
fn mentions_self_or(e: &ast::Expr, name: &str) -> bool {
    use ast::ExprKind::*;
    let sub = |x: &ast::Expr| mentions_self_or(x, name);
    match &e.kind {
        Var(q) => q.parts.len() == 1 && (q.parts[0].text == "self" || q.parts[0].text == name),
        Attr(b, _) => sub(b),
        Binary(_, a, b) => sub(a) || sub(b),
        Not(a) | IsDefined(a) => sub(a),
        Conditional(a, b, c) => sub(a) || sub(b) || sub(c),
        List(items) => items.iter().any(sub),
        Dict(pairs) => pairs.iter().any(|(_, v)| sub(v)),
        MapLookup(a, b) => sub(a) || sub(b),
        Call { args, .. } | Constructor { args, .. } | IndexLookup { args, .. } => args.iter().any(|a| match a {
            ast::Arg::Positional(x) | ast::Arg::Keyword(_, x) | ast::Arg::Splat(x) => sub(x),
        }),
        Comprehension { value, fors, guards } => {
            sub(value) || fors.iter().any(|(_, x)| sub(x)) || guards.iter().any(sub)
        }
        Interpolated(parts) => parts.iter().any(|p| {
            matches!(p, ast::InterpPart::Ref(path) if path.first().is_some_and(|n| n.text == "self"))
        }),
        _ => false,
    }
}
