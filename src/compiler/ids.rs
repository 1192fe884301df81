//! The ids by which the parts of a compiled program refer to each other.
//!
//! The type system ([`types`](super::types)) and the code ([`ir`](super::ir)) point at each
//! other: an implementation names its body block, a constructor names its entity. They do so
//! only by index into the arenas of the [`Program`](super::program::Program), so the ids live
//! here, below both, and neither needs the other to name a thing.

// ------------------------------------------------------------------ the type system

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NsId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttrId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TypedefId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImplId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuleId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct PluginId(pub u32);
/// An interned attribute name.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sym(pub u32);

// ------------------------------------------------------------------ the code

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExprId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct StmtId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockId(pub u32);
