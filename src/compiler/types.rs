//! The type system of a compiled model: namespaces, entities, attributes and relations,
//! typedefs, implementations, implement rules and indexes.
//!
//! Built once by `define` from the syntax trees, then immutable: part of the
//! [`Program`](super::program::Program) the evaluator reads through shared references. Code is
//! referred to by id only ([`super::ids`]). Attribute names are interned ([`Sym`]) and every
//! entity has a dense slot table, so `instance.attr` is two array reads at run time.

use std::collections::HashMap;

use super::ids::*;
use super::source::Span;
use super::value::Value;

pub const NO_SLOT: u16 = u16::MAX;

#[derive(Default)]
pub struct Syms {
    names: Vec<String>,
    /// foldhash: every attribute name read by name (the export reads each field of each
    /// resource this way) is hashed here, and SipHash was a few percent of a compile
    by_name: foldhash::HashMap<String, Sym>,
}

impl Syms {
    pub fn intern(&mut self, name: &str) -> Sym {
        if let Some(s) = self.by_name.get(name) {
            return *s;
        }
        let s = Sym(self.names.len() as u32);
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), s);
        s
    }

    pub fn get(&self, name: &str) -> Option<Sym> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, s: Sym) -> &str {
        &self.names[s.0 as usize]
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// Primitive types (LANGUAGE.md §5.2).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Prim {
    String,
    Int,
    Float,
    Number,
    Bool,
    List,
    Dict,
}

impl Prim {
    pub fn from_name(name: &str) -> Option<Prim> {
        Some(match name {
            "string" => Prim::String,
            "int" => Prim::Int,
            "float" => Prim::Float,
            "number" => Prim::Number,
            "bool" => Prim::Bool,
            "list" => Prim::List,
            "dict" => Prim::Dict,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Prim::String => "string",
            Prim::Int => "int",
            Prim::Float => "float",
            Prim::Number => "number",
            Prim::Bool => "bool",
            Prim::List => "list",
            Prim::Dict => "dict",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BaseType {
    Prim(Prim),
    Typedef(TypedefId),
    Entity(EntityId),
}

/// The declared type of a plain attribute: `T`, `T[]`, `T?`, `T[]?`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ValueType {
    pub base: BaseType,
    pub list: bool,
    pub nullable: bool,
}

#[derive(Clone, Debug)]
pub enum DefaultDecl {
    None,
    Value(Value),
    /// `= undef`: erases an inherited default.
    Undef,
}

#[derive(Clone, Debug)]
pub enum AttrKind {
    Value {
        ty: ValueType,
        default: DefaultDecl,
    },
    Relation {
        target: EntityId,
        low: u32,
        high: Option<u32>,
        reverse: Option<AttrId>,
    },
}

#[derive(Clone, Debug)]
pub struct Attribute {
    pub name: String,
    pub sym: Sym,
    pub owner: EntityId,
    pub kind: AttrKind,
    pub span: Span,
}

/// How an attribute stores its value at run time (LANGUAGE.md §12.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    /// plain attributes and `[1]` relations
    Single,
    /// `[0:1]` relations
    Optional,
    /// every other relation
    List,
}

impl Attribute {
    pub fn storage(&self) -> Storage {
        match &self.kind {
            AttrKind::Value { .. } => Storage::Single,
            AttrKind::Relation { low, high, .. } => match (low, high) {
                (1, Some(1)) => Storage::Single,
                (0, Some(1)) => Storage::Optional,
                _ => Storage::List,
            },
        }
    }

    pub fn is_relation(&self) -> bool {
        matches!(self.kind, AttrKind::Relation { .. })
    }

    /// Multi-valued relation (`+=` allowed, gradual assignment).
    pub fn is_multi(&self) -> bool {
        matches!(self.kind, AttrKind::Relation { high, .. } if high != Some(1))
    }
}

pub struct Entity {
    pub name: String,
    pub full_name: String,
    pub ns: NsId,
    pub span: Span,
    pub parents: Vec<EntityId>,
    /// Attributes (and relation ends) declared on this entity itself.
    pub own_attrs: Vec<AttrId>,
    /// Every attribute of the entity, inherited ones included, in slot order.
    pub slots: Vec<AttrId>,
    /// Dense `Sym -> slot` table (`NO_SLOT` when absent).
    pub slot_of: Vec<u16>,
    /// Effective default per slot (own > leftmost parent > … > rightmost parent).
    pub defaults: Vec<Option<Value>>,
    /// Indexes that apply to this entity (own and inherited), with their slots.
    pub indexes: Vec<(IndexId, Vec<u16>)>,
    /// Per slot: part of some index (must be known before the instance exists).
    pub index_slot: Vec<bool>,
    /// Implement rules written for this entity.
    pub rules: Vec<RuleId>,
    /// Rules that apply to instances of exactly this type (own, plus parents' via `parents`).
    pub effective_rules: Vec<RuleId>,
    /// All strict ancestors.
    pub ancestors: Vec<EntityId>,
    /// All strict descendants.
    pub descendants: Vec<EntityId>,
}

impl Entity {
    pub fn slot(&self, sym: Sym) -> Option<u16> {
        match self.slot_of.get(sym.0 as usize) {
            Some(&s) if s != NO_SLOT => Some(s),
            _ => None,
        }
    }
}

pub enum Constraint {
    /// Python `re.match` semantics: anchored at the start only.
    Regex {
        source: String,
        /// Compiled when a value is first checked against it: most typedefs of the
        /// modules a project imports (std's among them) never are. The lexer compiled the
        /// pattern once already to report a bad one with its span, or it is built in.
        regex: std::sync::OnceLock<Result<fancy_regex::Regex, String>>,
    },
    /// An expression over `self` (environment slot 0).
    Expr { expr: ExprId, text: String },
}

impl Constraint {
    /// A constraint on the text of the values: `source` is the pattern between the slashes.
    pub fn regex(source: String) -> Constraint {
        Constraint::Regex {
            source,
            regex: std::sync::OnceLock::new(),
        }
    }
}

/// The compiled form of a typedef's `matching /source/`, anchored at the start like
/// Python's `re.match`.
pub fn compiled_regex<'c>(
    source: &str,
    cell: &'c std::sync::OnceLock<Result<fancy_regex::Regex, String>>,
) -> Result<&'c fancy_regex::Regex, String> {
    cell.get_or_init(|| {
        fancy_regex::Regex::new(&format!("^(?:{source})"))
            .map_err(|e| format!("Regex error in /{source}/: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

pub struct Typedef {
    pub name: String,
    pub full_name: String,
    pub ns: NsId,
    pub span: Span,
    pub base: BaseType,
    pub constraint: Constraint,
}

pub struct Implementation {
    pub name: String,
    pub full_name: String,
    pub ns: NsId,
    pub entity: EntityId,
    pub body: BlockId,
    pub span: Span,
}

pub struct ImplementRule {
    pub entity: EntityId,
    pub implementations: Vec<ImplId>,
    pub uses_parents: bool,
    /// `when` condition, evaluated with the instance in scope.
    pub condition: Option<ExprId>,
    pub ns: NsId,
    pub span: Span,
}

pub struct IndexDef {
    pub entity: EntityId,
    pub attrs: Vec<String>,
    pub span: Span,
}

/// A named type visible in a namespace.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TypeRef {
    Entity(EntityId),
    Typedef(TypedefId),
    Implementation(ImplId),
    Plugin(PluginId),
}

pub struct Namespace {
    /// `__config__`, `std`, `fs`, `mymod::sub`
    pub name: String,
    pub module: String,
    /// The file defining this namespace.
    pub file: Option<super::source::FileId>,
    pub parent: Option<NsId>,
    /// Namespaces usable as `prefix::` in this file: itself, std, imports (by name or alias).
    pub visible: HashMap<String, NsId>,
    pub types: HashMap<String, TypeRef>,
    /// Span of each type definition (for "already defined" messages).
    pub type_spans: HashMap<String, Span>,
    /// Lowered top-level statements.
    pub top_block: Option<BlockId>,
    /// Top-level variable names -> slot in the top block.
    pub top_vars: HashMap<String, u16>,
}
