//! A compiled program: the type system and the lowered code, with the ids that join them.
//!
//! Built by `define` (types) and `lower` (code), then immutable: the evaluator reads it through
//! shared references.

use super::ids::{AttrId, EntityId, NsId, TypedefId};
use super::ir::Ir;
use super::types::{
    Attribute, BaseType, Entity, ImplementRule, Implementation, IndexDef, Namespace, Syms, Typedef,
    ValueType,
};

/// Everything the evaluator needs: the type system and the lowered code.
pub struct Program {
    pub syms: Syms,
    pub namespaces: Vec<Namespace>,
    pub entities: Vec<Entity>,
    pub attributes: Vec<Attribute>,
    pub typedefs: Vec<Typedef>,
    pub implementations: Vec<Implementation>,
    pub rules: Vec<ImplementRule>,
    pub indexes: Vec<IndexDef>,
    pub ir: Ir,
    /// `std::Entity`, the root of every entity.
    pub root_entity: EntityId,
    /// Namespaces in load order: their top-level blocks run in this order.
    pub load_order: Vec<NsId>,
    /// The Python plugins of the modules: `PluginId(n + i)` is the `i`th, where `n` is the
    /// number of built-in plugins.
    pub python_plugins: Vec<PyPlugin>,
}

impl Program {
    pub fn entity(&self, id: EntityId) -> &Entity {
        &self.entities[id.0 as usize]
    }

    pub fn attr(&self, id: AttrId) -> &Attribute {
        &self.attributes[id.0 as usize]
    }

    /// The attribute in `slot` of instances of `entity`.
    pub fn slot_attr(&self, entity: EntityId, slot: u16) -> &Attribute {
        self.attr(self.entity(entity).slots[slot as usize])
    }

    pub fn typedef(&self, id: TypedefId) -> &Typedef {
        &self.typedefs[id.0 as usize]
    }

    pub fn ns(&self, id: NsId) -> &Namespace {
        &self.namespaces[id.0 as usize]
    }

    /// `sub` is `sup` or one of its descendants.
    pub fn is_subtype(&self, sub: EntityId, sup: EntityId) -> bool {
        sub == sup || self.entity(sub).ancestors.contains(&sup)
    }

    pub fn base_type_name(&self, b: BaseType) -> String {
        match b {
            BaseType::Prim(p) => p.name().to_string(),
            BaseType::Typedef(t) => self.typedef(t).full_name.clone(),
            BaseType::Entity(e) => self.entity(e).full_name.clone(),
        }
    }

    pub fn value_type_name(&self, t: &ValueType) -> String {
        let mut s = self.base_type_name(t.base);
        if t.list {
            s.push_str("[]");
        }
        if t.nullable {
            s.push('?');
        }
        s
    }
}

/// A parameter of a Python plugin, as its source declares it.
#[derive(Clone, Debug)]
pub struct PyParam {
    pub name: String,
    /// DSL type (`string`, `std::Entity`, `int[]`, `any`, …).
    pub ty: String,
    pub nullable: bool,
    pub has_default: bool,
    /// Keyword-only (after `*` or `*args`).
    pub kw_only: bool,
}

#[derive(Clone, Debug)]
pub struct PyPlugin {
    pub namespace: String,
    pub name: String,
    /// The Python module registering it (`inmanta_plugins.mymod`).
    pub module: String,
    /// Parameters, the `Context` one left out.
    pub params: Vec<PyParam>,
    /// Names of all parameters before `*args`, `Context` included, in order.
    pub positional_names: Vec<String>,
    pub var_args: bool,
    pub var_kwargs: bool,
    /// The parameter that receives the `Context`.
    pub context: Option<String>,
    pub allow_unknown: bool,
    pub returns: String,
    pub returns_nullable: bool,
}

impl PyPlugin {
    pub fn full_name(&self) -> String {
        format!("{}::{}", self.namespace, self.name)
    }
}
