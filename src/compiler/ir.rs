//! The lowered, name-resolved program the evaluator runs.
//!
//! Lowering (see `lower.rs`) resolves every name statically: variables become scope slots,
//! types become ids, attribute names become interned symbols. Expressions, statements and
//! blocks live in arenas and are referenced by index ([`super::ids`]), so run-time tasks can
//! point at them cheaply.

use std::rc::Rc;

use super::ast::BinOp;
use super::diagnostics::Diagnostic;
use super::ids::{BlockId, EntityId, ExprId, NsId, PluginId, StmtId, Sym};
use super::source::Span;
use super::types::Prim;
use super::value::Value;

/// Where a variable lives, decided statically (LANGUAGE.md §2.4, §8.3, §12.4).
#[derive(Clone, Debug)]
pub enum VarRef {
    /// A variable of an enclosing block: `up` scopes outward, then `slot`.
    Local { up: u16, slot: u16 },
    /// A top-level variable of a namespace.
    NsVar { ns: NsId, slot: u16 },
    /// `self` in an implementation body or `when` condition.
    SelfRef,
    /// A bare attribute name of the instance (`name` ≡ `self.name`).
    SelfAttr(Sym),
    /// A comprehension variable (or `self` of a typedef constraint).
    Env(u16),
    /// Not resolvable: an error when (and only when) evaluated.
    NotFound(Rc<str>),
}

#[derive(Clone, Debug)]
pub struct CtorArg {
    pub sym: Sym,
    pub slot: u16,
    pub value: ExprId,
    /// Index attribute: evaluated before the instance exists.
    pub direct: bool,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Construct {
    pub entity: EntityId,
    pub args: Vec<CtorArg>,
    pub splats: Vec<ExprId>,
    /// Index slots that neither an argument nor a default provides: must come from a
    /// `**dict` or the reverse end of the relation the constructor is assigned to.
    pub missing_index_slots: Vec<u16>,
}

#[derive(Clone, Debug)]
pub struct Call {
    pub plugin: PluginId,
    pub args: Vec<ExprId>,
    pub kwargs: Vec<(Rc<str>, ExprId)>,
    pub splats: Vec<ExprId>,
}

#[derive(Clone, Debug)]
pub enum InterpPiece {
    Text(Rc<str>),
    Value(ExprId),
}

#[derive(Clone, Debug)]
pub enum FPiece {
    Text(Rc<str>),
    Field {
        value: ExprId,
        conversion: Option<char>,
        spec: Vec<FPiece>,
    },
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Const(Value),
    Var(VarRef),
    Attr {
        base: ExprId,
        sym: Sym,
    },
    Construct(Box<Construct>),
    Call(Box<Call>),
    Cast {
        prim: Prim,
        arg: ExprId,
    },
    IndexLookup {
        entity: EntityId,
        args: Vec<(Sym, ExprId)>,
        splats: Vec<ExprId>,
    },
    /// `base.rel[args]`: base evaluates to the instance owning `rel`.
    ShortIndexLookup {
        base: ExprId,
        rel: Sym,
        args: Vec<(Sym, ExprId)>,
        splats: Vec<ExprId>,
    },
    MapLookup {
        map: ExprId,
        key: ExprId,
    },
    List(Vec<ExprId>),
    Dict(Vec<(crate::compiler::value::Text, ExprId)>),
    /// `[value for env[slot] in iter if guard]` (nested `for`s are nested comprehensions).
    Comprehension {
        value: ExprId,
        env_slot: u16,
        iter: ExprId,
        guard: Option<ExprId>,
    },
    Binary {
        op: BinOp,
        a: ExprId,
        b: ExprId,
    },
    Not(ExprId),
    Conditional {
        cond: ExprId,
        then: ExprId,
        otherwise: ExprId,
    },
    /// `ref is defined`, where `target` is a variable or attribute reference.
    IsDefined(ExprId),
    Interpolate(Vec<InterpPiece>),
    FString(Vec<FPiece>),
    /// A statically detected error that only matters if this expression runs.
    Error(Box<Diagnostic>),
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// An eager promise (LANGUAGE.md §12.3 point 4): `instance.attr` may still be assigned by a
/// nested block of the statement holding it.
#[derive(Clone, Debug)]
pub struct Promise {
    pub instance: ExprId,
    pub sym: Sym,
}

#[derive(Clone, Debug)]
pub enum Stmt {
    AssignVar {
        slot: u16,
        value: ExprId,
        span: Span,
    },
    AssignAttr {
        target: ExprId,
        sym: Sym,
        value: ExprId,
        extend: bool,
        span: Span,
    },
    Eval(ExprId),
    If {
        cond: ExprId,
        then_block: BlockId,
        else_block: Option<BlockId>,
        promises: Vec<Promise>,
        span: Span,
    },
    /// The loop variable is slot 0 of the body block.
    For {
        iterable: ExprId,
        body: BlockId,
        promises: Vec<Promise>,
        span: Span,
    },
}

#[derive(Clone, Debug, Default)]
pub struct Block {
    pub names: Vec<Rc<str>>,
    pub stmts: Vec<StmtId>,
}

pub struct Ir {
    pub exprs: Vec<Expr>,
    pub stmts: Vec<Stmt>,
    pub blocks: Vec<Block>,
    /// Populated fronts of `exprs` and `stmts` (see [`crate::alloc::Ahead`]).
    exprs_ahead: crate::alloc::Ahead,
    stmts_ahead: crate::alloc::Ahead,
}

impl Default for Ir {
    /// Expressions and statements are the two large arenas of lowering (tens of thousands
    /// of each at gen_model N=1,000): reserved, so that they grow without copies.
    fn default() -> Ir {
        Ir {
            exprs: crate::alloc::reserved(),
            stmts: crate::alloc::reserved(),
            blocks: Vec::new(),
            exprs_ahead: Default::default(),
            stmts_ahead: Default::default(),
        }
    }
}

impl Ir {
    pub fn add_expr(&mut self, kind: ExprKind, span: Span) -> ExprId {
        self.exprs.push(Expr { kind, span });
        self.exprs_ahead.after_push(&self.exprs);
        ExprId(self.exprs.len() as u32 - 1)
    }

    pub fn add_stmt(&mut self, stmt: Stmt) -> StmtId {
        self.stmts.push(stmt);
        self.stmts_ahead.after_push(&self.stmts);
        StmtId(self.stmts.len() as u32 - 1)
    }

    pub fn add_block(&mut self, block: Block) -> BlockId {
        self.blocks.push(block);
        BlockId(self.blocks.len() as u32 - 1)
    }

    pub fn expr(&self, id: ExprId) -> &Expr {
        &self.exprs[id.0 as usize]
    }

    pub fn stmt(&self, id: StmtId) -> &Stmt {
        &self.stmts[id.0 as usize]
    }

    pub fn block(&self, id: BlockId) -> &Block {
        &self.blocks[id.0 as usize]
    }
}
