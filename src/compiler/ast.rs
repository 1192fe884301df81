//! Syntax tree of one `.cf` file, as written (names unresolved).
//!
//! Every node carries the span the reference compiler uses for its line in messages (e.g. the
//! `=` of an assignment, the class name of a constructor), so errors point where users expect.

use super::lexer::{CmpOp, IntLit};
use super::source::Span;
use super::value::pyfmt;

#[derive(Clone, Debug, PartialEq)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

/// `a::b::c` (ns_ref) or `a::b::C` (class_ref): the parts in order.
#[derive(Clone, Debug, PartialEq)]
pub struct QName {
    pub parts: Vec<Name>,
    pub span: Span,
}

impl QName {
    pub fn full(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                s.push_str("::");
            }
            s.push_str(&p.text);
        }
        s
    }

    pub fn last(&self) -> &Name {
        self.parts.last().expect("qualified name has parts")
    }

    /// The namespace prefix (`a::b` of `a::b::C`), if any.
    pub fn prefix(&self) -> Option<String> {
        if self.parts.len() < 2 {
            return None;
        }
        Some(
            self.parts[..self.parts.len() - 1]
                .iter()
                .map(|p| p.text.as_str())
                .collect::<Vec<_>>()
                .join("::"),
        )
    }
}

#[derive(Debug, Default)]
pub struct File {
    pub items: Vec<TopItem>,
}

#[derive(Debug)]
pub enum TopItem {
    Import(Import),
    Entity(EntityDef),
    Implementation(ImplementationDef),
    Implement(ImplementDef),
    Relation(RelationDef),
    Typedef(TypedefDef),
    Index(IndexDef),
    Stmt(Stmt),
}

#[derive(Debug)]
pub struct Import {
    pub module: QName,
    pub alias: Option<Name>,
    pub span: Span,
}

#[derive(Debug)]
pub struct EntityDef {
    pub name: Name,
    pub parents: Vec<QName>,
    pub attributes: Vec<AttributeDef>,
    pub doc: Option<String>,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub enum TypeRef {
    /// `string`, `std::port[]`, `int?` …
    Named {
        name: QName,
        list: bool,
        nullable: bool,
    },
    /// `dict` / `dict?`
    Dict { nullable: bool, span: Span },
}

impl TypeRef {
    pub fn span(&self) -> Span {
        match self {
            TypeRef::Named { name, .. } => name.span,
            TypeRef::Dict { span, .. } => *span,
        }
    }
}

#[derive(Debug, Clone)]
pub enum DefaultValue {
    Value(Expr),
    /// `= undef`: removes an inherited default.
    Undef(Span),
}

#[derive(Debug, Clone)]
pub struct AttributeDef {
    pub ty: TypeRef,
    pub name: Name,
    pub default: Option<DefaultValue>,
}

#[derive(Debug)]
pub struct ImplementationDef {
    pub name: Name,
    pub entity: QName,
    pub body: Vec<Stmt>,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub enum ImplRef {
    Named(QName),
    Parents(Span),
}

#[derive(Debug)]
pub struct ImplementDef {
    pub entity: QName,
    pub implementations: Vec<ImplRef>,
    pub when: Option<Expr>,
    pub span: Span,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Multiplicity {
    pub low: u32,
    pub high: Option<u32>,
}

#[derive(Debug)]
pub struct RelationEnd {
    pub entity: QName,
    pub name: Name,
    pub multiplicity: Multiplicity,
}

#[derive(Debug)]
pub struct RelationDef {
    /// `Left.attr [m]`: the attribute declared on the left entity (values: right entities).
    pub left: RelationEnd,
    /// `Right.attr [m]` for bidirectional relations; unidirectional ones name only the entity.
    pub right_entity: QName,
    pub right: Option<(Name, Multiplicity)>,
    pub annotations: Vec<Expr>,
    pub span: Span,
}

#[derive(Debug)]
pub enum TypedefConstraint {
    Expr(Expr),
    Regex(String, Span),
}

#[derive(Debug)]
pub struct TypedefDef {
    pub name: Name,
    pub base: QName,
    pub constraint: TypedefConstraint,
    pub span: Span,
}

#[derive(Debug)]
pub struct IndexDef {
    pub entity: QName,
    pub attributes: Vec<Name>,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub enum Stmt {
    /// `target = value` / `target += value`; target is a variable or attribute reference.
    Assign {
        target: Expr,
        value: Expr,
        extend: bool,
        span: Span,
    },
    For {
        var: Name,
        iterable: Expr,
        body: Vec<Stmt>,
        span: Span,
    },
    If {
        /// `if` and `elif` branches in order.
        branches: Vec<(Expr, Vec<Stmt>, Span)>,
        otherwise: Option<Vec<Stmt>>,
        span: Span,
    },
    Expr(Expr),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Cmp(CmpOp),
    And,
    Or,
    In,
    NotIn,
}

#[derive(Debug, Clone)]
pub enum Arg {
    Positional(Expr),
    Keyword(Name, Expr),
    /// `**dict`
    Splat(Expr),
}

/// A piece of an interpolated string `"a {{ x.y }} b"`.
#[derive(Debug, Clone)]
pub enum InterpPart {
    Text(String),
    /// The path `x.y`, with the exact `{{…}}` text it replaces.
    Ref(Vec<Name>),
}

/// One replacement field of an f-string: `{path!conv:spec}`.
#[derive(Debug, Clone)]
pub struct FField {
    pub path: Vec<Name>,
    /// The reference stops registering fields at the first `{{`/`}}` escape: later fields
    /// fail when the string is built ("Invalid key in f-string").
    pub unregistered: bool,
    pub conversion: Option<char>,
    /// The format spec, itself possibly containing nested fields.
    pub spec: Vec<FPiece>,
}

#[derive(Debug, Clone)]
pub enum FPiece {
    Text(String),
    Field(FField),
}

#[derive(Debug, Clone)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub enum ExprKind {
    Null,
    Bool(bool),
    Int(IntLit),
    Float(f64),
    Str(String),
    Interpolated(Vec<InterpPart>),
    FString(Vec<FPiece>),
    /// `x` or `mod::x`.
    Var(QName),
    /// `base.name`
    Attr(Box<Expr>, Name),
    Constructor {
        class: QName,
        args: Vec<Arg>,
    },
    Call {
        func: QName,
        args: Vec<Arg>,
    },
    IndexLookup {
        class: QName,
        args: Vec<Arg>,
    },
    /// `x.rel[attr=value]`: base is the `x.rel` attribute reference.
    ShortIndexLookup {
        base: Box<Expr>,
        args: Vec<Arg>,
    },
    MapLookup(Box<Expr>, Box<Expr>),
    List(Vec<Expr>),
    Dict(Vec<(String, Expr)>),
    /// `[value for v in it … if guard]`; `fors` outer first, guard applies to the innermost.
    Comprehension {
        value: Box<Expr>,
        fors: Vec<(Name, Expr)>,
        guards: Vec<Expr>,
    },
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    IsDefined(Box<Expr>),
    Conditional(Box<Expr>, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// True for `var_ref`: a plain name or an attribute chain (assignable).
    pub fn is_var_ref(&self) -> bool {
        match &self.kind {
            ExprKind::Var(_) => true,
            ExprKind::Attr(base, _) => base.is_var_ref(),
            _ => false,
        }
    }
}

/// The reference's pretty form of an expression, used in constraint messages.
pub fn pretty(e: &Expr) -> String {
    use ExprKind as A;
    match &e.kind {
        A::Null => "null".into(),
        A::Bool(b) => if *b { "true" } else { "false" }.into(),
        A::Int(IntLit::Small(i)) => i.to_string(),
        A::Int(IntLit::Big(b)) => b.to_string(),
        A::Float(f) => pyfmt::float_repr(*f),
        A::Str(s) => pyfmt::str_repr(s),
        A::Var(q) => q.full(),
        A::Attr(b, n) => format!("{}.{}", pretty(b), n.text),
        A::Binary(op, a, b) => {
            let o = match op {
                BinOp::Add => "+",
                BinOp::Sub => "-",
                BinOp::Mul => "*",
                BinOp::Div => "/",
                BinOp::Mod => "%",
                BinOp::Pow => "**",
                BinOp::Cmp(c) => c.as_str(),
                BinOp::And => "and",
                BinOp::Or => "or",
                BinOp::In => "in",
                BinOp::NotIn => "not in",
            };
            format!("({} {} {})", pretty(a), o, pretty(b))
        }
        A::Not(a) => format!("not {}", pretty(a)),
        A::List(items) => format!(
            "[{}]",
            items.iter().map(pretty).collect::<Vec<_>>().join(",")
        ),
        A::Call { func, args } => format!(
            "{}({})",
            func.full(),
            args.iter()
                .map(|a| match a {
                    Arg::Positional(v) => pretty(v),
                    Arg::Keyword(n, v) => format!("{}={}", n.text, pretty(v)),
                    Arg::Splat(v) => format!("**{}", pretty(v)),
                })
                .collect::<Vec<_>>()
                .join(",")
        ),
        _ => "<expression>".into(),
    }
}
