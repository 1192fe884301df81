//! Recursive-descent parser (with precedence climbing for operators).
//!
//! Grammar (LANGUAGE.md §4; `x?` optional, `x*` repetition):
//!
//! ```text
//! file        := MLS? top*
//! top         := import | entity | implementation | implement | relation | typedef | index | stmt
//! import      := 'import' ns_ref ('as' ID)?
//! entity      := 'entity' CID ('extends' class_ref (',' class_ref)*)? ':' MLS? attr* 'end'
//! attr        := ns_ref ('[' ']')? '?'? ID ('=' (constant | '[' constants ']' | 'undef'))?
//!              | 'dict' '?'? ID ('=' (map | 'null'))?
//! implementation := 'implementation' ID 'for' class_ref ':' MLS? stmt* 'end'
//! implement   := 'implement' class_ref 'using' (ns_ref | 'parents') (',' …)* ('when' expr)? MLS?
//! relation    := class_ref '.' ID multi ('--' | expr (',' expr)*) class_ref ('.' ID multi)? MLS?
//! multi       := '[' INT ']' | '[' INT ':' ']' | '[' INT ':' INT ']' | '[' ':' INT ']'
//! typedef     := 'typedef' ID 'as' ns_ref ('matching' expr | REGEX) MLS?
//! index       := 'index' class_ref '(' ID (',' ID)* ')'
//! stmt        := var_ref ('=' | '+=') expr | 'for' ID 'in' expr ':' stmt* 'end'
//!              | 'if' expr ':' stmt* ('elif' expr ':' stmt*)* ('else' ':' stmt*)? 'end' | expr
//! expr        := expr '?' expr ':' expr | expr ('or'|'and'|CMP|'+'|'-'|'*'|'/'|'%'|'**'|'in'|'not' 'in') expr
//!              | 'not' expr | primary
//! primary     := literal | '(' expr ')' | list | comprehension | map | var_ref | call
//!              | constructor | index_lookup | map_lookup | ref 'is' 'defined'
//! ```
//!
//! Precedence, lowest first: `?:`, `or`, `and`, comparisons, `+ -`, `* / %`, `**` (left
//! associative), prefix `not`, `in`/`not in`. Statements have no terminator: an expression ends
//! at the first token that cannot continue it (so `x = 5 -1` is two statements, as in the
//! reference). Errors are reported at the first token that cannot be parsed.

use super::ast::*;
use super::diagnostics::Diagnostic;
use super::lexer::{IntLit, Kw, Tok, Token};
use super::source::Span;

pub fn parse(tokens: &[Token]) -> Result<File, Diagnostic> {
    let mut p = Parser {
        toks: tokens,
        pos: 0,
        depth: 0,
    };
    p.file()
}

struct Parser<'a> {
    toks: &'a [Token],
    pos: usize,
    /// Nesting of the tree being built: bounded so that no input can exhaust the stack of
    /// the parser or of the passes that walk the tree after it.
    depth: usize,
}

/// Deepest expression/statement nesting accepted.
const MAX_DEPTH: usize = 500;

type PResult<T> = Result<T, Diagnostic>;

// binding powers
const BP_COND: u8 = 1;
const BP_OR: u8 = 2;
const BP_AND: u8 = 3;
const BP_CMP: u8 = 4;
const BP_ADD: u8 = 5;
const BP_MUL: u8 = 6;
const BP_POW: u8 = 7;
const BP_IN: u8 = 9;

impl<'a> Parser<'a> {
    fn peek(&self) -> &'a Tok {
        &self.toks[self.pos.min(self.toks.len() - 1)].tok
    }

    fn peek_at(&self, n: usize) -> &'a Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].tok
    }

    fn span(&self) -> Span {
        self.toks[self.pos.min(self.toks.len() - 1)].span
    }

    fn bump(&mut self) -> &'a Token {
        let t = &self.toks[self.pos.min(self.toks.len() - 1)];
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn at(&self, tok: &Tok) -> bool {
        self.peek() == tok
    }

    fn at_kw(&self, kw: Kw) -> bool {
        matches!(self.peek(), Tok::Kw(k) if *k == kw)
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if self.at(tok) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn eat_kw(&mut self, kw: Kw) -> bool {
        if self.at_kw(kw) {
            self.bump();
            true
        } else {
            false
        }
    }

    /// The syntax error for the current token, worded like the reference.
    fn error(&self) -> Diagnostic {
        let t = &self.toks[self.pos.min(self.toks.len() - 1)];
        if t.tok == Tok::Eof {
            return Diagnostic::error("syntax", "Syntax error: Unexpected end of file").at(t.span);
        }
        if let Tok::Kw(k) = t.tok {
            return reserved(k, t.span);
        }
        if self.pos > 0 {
            let prev = &self.toks[self.pos - 1];
            if let Tok::Kw(k) = prev.tok {
                // keywords that complete a construct on their own are not the culprit
                if !matches!(
                    k,
                    Kw::True
                        | Kw::False
                        | Kw::Null
                        | Kw::End
                        | Kw::Defined
                        | Kw::Parents
                        | Kw::Undef
                ) {
                    return reserved(k, prev.span);
                }
            }
        }
        Diagnostic::error(
            "syntax",
            format!("Syntax error at token {}", t.tok.describe()),
        )
        .at(t.span)
    }

    fn expect(&mut self, tok: &Tok) -> PResult<Span> {
        if self.at(tok) {
            Ok(self.bump().span)
        } else {
            Err(self.error())
        }
    }

    fn expect_kw(&mut self, kw: Kw) -> PResult<Span> {
        if self.at_kw(kw) {
            Ok(self.bump().span)
        } else {
            Err(self.error())
        }
    }

    fn id(&mut self) -> PResult<Name> {
        match self.peek() {
            Tok::Id(s) => {
                let s = s.clone();
                let span = self.bump().span;
                Ok(Name { text: s, span })
            }
            _ => Err(self.error()),
        }
    }

    fn skip_doc(&mut self) -> Option<String> {
        if let Tok::Mls(s) = self.peek() {
            let s = s.clone();
            self.bump();
            Some(s)
        } else {
            None
        }
    }

    // ---------------------------------------------------------------- top level

    fn file(&mut self) -> PResult<File> {
        let mut file = File::default();
        self.skip_doc();
        while !self.at(&Tok::Eof) {
            let item = self.top_item()?;
            file.items.push(item);
        }
        Ok(file)
    }

    fn top_item(&mut self) -> PResult<TopItem> {
        match self.peek() {
            Tok::Kw(Kw::Import) => self.import().map(TopItem::Import),
            Tok::Kw(Kw::Entity) => self.entity().map(TopItem::Entity),
            Tok::Kw(Kw::Implementation) => self.implementation().map(TopItem::Implementation),
            Tok::Kw(Kw::Implement) => self.implement().map(TopItem::Implement),
            Tok::Kw(Kw::Typedef) => self.typedef().map(TopItem::Typedef),
            Tok::Kw(Kw::Index) => self.index().map(TopItem::Index),
            Tok::Cid(_) | Tok::Id(_) if self.starts_relation() => {
                self.relation().map(TopItem::Relation)
            }
            _ => self.stmt().map(TopItem::Stmt),
        }
    }

    /// A relation starts with `class_ref '.'`.
    fn starts_relation(&self) -> bool {
        let mut i = 0;
        loop {
            match self.peek_at(i) {
                Tok::Cid(_) => return self.peek_at(i + 1) == &Tok::Dot,
                Tok::Id(_) if self.peek_at(i + 1) == &Tok::Sep => i += 2,
                _ => return false,
            }
        }
    }

    fn import(&mut self) -> PResult<Import> {
        let start = self.expect_kw(Kw::Import)?;
        let module = self.ns_ref()?;
        let alias = if self.eat_kw(Kw::As) {
            Some(self.id()?)
        } else {
            None
        };
        Ok(Import {
            module,
            alias,
            span: start,
        })
    }

    fn ns_ref(&mut self) -> PResult<QName> {
        let first = self.id()?;
        let mut span = first.span;
        let mut parts = vec![first];
        while self.at(&Tok::Sep) && matches!(self.peek_at(1), Tok::Id(_)) {
            self.bump();
            let n = self.id()?;
            span = span.to(n.span);
            parts.push(n);
        }
        Ok(QName { parts, span })
    }

    /// `CID` or `ns_ref '::' CID`.
    fn class_ref(&mut self) -> PResult<QName> {
        let mut parts = Vec::new();
        let start = self.span();
        loop {
            match self.peek() {
                Tok::Cid(s) => {
                    let s = s.clone();
                    let span = self.bump().span;
                    parts.push(Name { text: s, span });
                    return Ok(QName {
                        parts,
                        span: start.to(span),
                    });
                }
                Tok::Id(s) if self.peek_at(1) == &Tok::Sep => {
                    let s = s.clone();
                    let span = self.bump().span;
                    parts.push(Name { text: s, span });
                    self.bump();
                }
                Tok::Id(s) if parts.is_empty() || !matches!(self.peek_at(1), Tok::Sep) => {
                    // a lowercase name where an entity is expected
                    let span = self.span();
                    let full = parts
                        .iter()
                        .map(|p| p.text.as_str())
                        .chain(std::iter::once(s.as_str()))
                        .collect::<Vec<_>>()
                        .join("::");
                    // the reference complains only once the whole reference is read
                    if matches!(self.peek_at(1), Tok::Comma | Tok::Colon) {
                        return Err(Diagnostic::error(
                            "invalid-name",
                            format!(
                                "Syntax error: Invalid identifier: Entity names must start with a capital ({full})"
                            ),
                        )
                        .at(span));
                    }
                    return Err(self.error());
                }
                _ => return Err(self.error()),
            }
        }
    }

    fn entity(&mut self) -> PResult<EntityDef> {
        let start = self.expect_kw(Kw::Entity)?;
        let name = match self.peek() {
            Tok::Cid(s) => {
                let s = s.clone();
                Name {
                    text: s,
                    span: self.bump().span,
                }
            }
            Tok::Id(s) => {
                return Err(Diagnostic::error(
                    "invalid-name",
                    format!("Syntax error: Invalid identifier: Entity names must start with a capital ({s})"),
                )
                .at(self.span()));
            }
            _ => return Err(self.error()),
        };
        let mut parents = Vec::new();
        if self.eat_kw(Kw::Extends) {
            loop {
                parents.push(self.class_ref()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::Colon)?;
        let doc = self.skip_doc();
        let mut attributes = Vec::new();
        while !self.at_kw(Kw::End) {
            attributes.push(self.attribute()?);
        }
        self.bump();
        Ok(EntityDef {
            name,
            parents,
            attributes,
            doc,
            span: start,
        })
    }

    fn attribute(&mut self) -> PResult<AttributeDef> {
        let ty = if self.at_kw(Kw::Dict) {
            let span = self.bump().span;
            let nullable = self.eat(&Tok::Question);
            TypeRef::Dict { nullable, span }
        } else {
            let name = self.ns_ref()?;
            let list = if self.at(&Tok::LBracket) && self.peek_at(1) == &Tok::RBracket {
                self.bump();
                self.bump();
                true
            } else {
                false
            };
            let nullable = self.eat(&Tok::Question);
            TypeRef::Named {
                name,
                list,
                nullable,
            }
        };
        let name = match self.peek() {
            Tok::Id(s) => {
                let s = s.clone();
                Name {
                    text: s,
                    span: self.bump().span,
                }
            }
            Tok::Cid(s) => {
                return Err(Diagnostic::error(
                    "invalid-name",
                    format!(
                        "Syntax error: Invalid identifier: attribute names must start with a lower case character ({s})"
                    ),
                )
                .at(self.span()));
            }
            _ => return Err(self.error()),
        };
        let mut default = None;
        if self.eat(&Tok::Assign) {
            if let TypeRef::Dict { nullable, .. } = ty {
                if self.at_kw(Kw::Null) {
                    let span = self.bump().span;
                    if !nullable {
                        return Err(Diagnostic::error(
                            "syntax",
                            format!(
                                "Syntax error: null can not be assigned to dict, did you mean \"dict? {} = null\"",
                                name.text
                            ),
                        )
                        .at(span));
                    }
                    default = Some(DefaultValue::Value(Expr {
                        kind: ExprKind::Null,
                        span,
                    }));
                } else if self.at(&Tok::LBrace) {
                    default = Some(DefaultValue::Value(self.primary()?));
                } else {
                    return Err(self.error());
                }
            } else if self.at_kw(Kw::Undef) {
                default = Some(DefaultValue::Undef(self.bump().span));
            } else if self.at(&Tok::LBracket) {
                let start = self.bump().span;
                let mut items = Vec::new();
                while !self.at(&Tok::RBracket) {
                    items.push(self.constant()?);
                    if !self.eat(&Tok::Comma) {
                        break;
                    }
                }
                let end = self.expect(&Tok::RBracket)?;
                default = Some(DefaultValue::Value(Expr {
                    kind: ExprKind::List(items),
                    span: start.to(end),
                }));
            } else {
                default = Some(DefaultValue::Value(self.constant()?));
            }
        }
        Ok(AttributeDef { ty, name, default })
    }

    /// `constant := INT | FLOAT | STRING | MLS | RSTRING | FSTRING | true | false | null`
    fn constant(&mut self) -> PResult<Expr> {
        match self.peek() {
            Tok::Int(_)
            | Tok::Float(_)
            | Tok::Str(_)
            | Tok::Mls(_)
            | Tok::RStr(_)
            | Tok::FStr(_)
            | Tok::Kw(Kw::True)
            | Tok::Kw(Kw::False)
            | Tok::Kw(Kw::Null) => self.primary(),
            _ => Err(self.error()),
        }
    }

    fn implementation(&mut self) -> PResult<ImplementationDef> {
        self.expect_kw(Kw::Implementation)?;
        let name = self.id()?;
        self.expect_kw(Kw::For)?;
        let entity = self.class_ref()?;
        self.expect(&Tok::Colon)?;
        self.skip_doc();
        let body = self.block()?;
        Ok(ImplementationDef {
            span: name.span,
            name,
            entity,
            body,
        })
    }

    /// Statements up to and including `end`.
    fn block(&mut self) -> PResult<Vec<Stmt>> {
        let mut stmts = Vec::new();
        while !self.at_kw(Kw::End) {
            if self.at(&Tok::Eof) {
                return Err(self.error());
            }
            stmts.push(self.stmt()?);
        }
        self.bump();
        Ok(stmts)
    }

    fn implement(&mut self) -> PResult<ImplementDef> {
        let start = self.expect_kw(Kw::Implement)?;
        let entity = self.class_ref()?;
        self.expect_kw(Kw::Using)?;
        let mut implementations = Vec::new();
        loop {
            if self.at_kw(Kw::Parents) {
                implementations.push(ImplRef::Parents(self.bump().span));
            } else {
                implementations.push(ImplRef::Named(self.ns_ref()?));
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        let when = if self.eat_kw(Kw::When) {
            Some(self.expr()?)
        } else {
            None
        };
        self.skip_doc();
        Ok(ImplementDef {
            entity,
            implementations,
            when,
            span: start,
        })
    }

    fn multiplicity(&mut self) -> PResult<Multiplicity> {
        self.expect(&Tok::LBracket)?;
        let int = |p: &mut Parser| -> PResult<u32> {
            match p.peek() {
                Tok::Int(IntLit::Small(v)) if *v >= 0 && *v <= u32::MAX as i64 => {
                    let v = *v as u32;
                    p.bump();
                    Ok(v)
                }
                _ => Err(p.error()),
            }
        };
        let m = if self.eat(&Tok::Colon) {
            let high = int(self)?;
            Multiplicity {
                low: 0,
                high: Some(high),
            }
        } else {
            let low = int(self)?;
            if self.eat(&Tok::Colon) {
                if self.at(&Tok::RBracket) {
                    Multiplicity { low, high: None }
                } else {
                    let high = int(self)?;
                    Multiplicity {
                        low,
                        high: Some(high),
                    }
                }
            } else {
                Multiplicity {
                    low,
                    high: Some(low),
                }
            }
        };
        self.expect(&Tok::RBracket)?;
        Ok(m)
    }

    fn relation(&mut self) -> PResult<RelationDef> {
        let left_entity = self.class_ref()?;
        let dot = self.expect(&Tok::Dot)?;
        let left_name = self.id()?;
        let left_mult = self.multiplicity()?;
        let mut annotations = Vec::new();
        if !self.eat(&Tok::Rel) {
            loop {
                annotations.push(self.expr()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        let right_entity = self.class_ref()?;
        let right = if self.at(&Tok::Dot) {
            self.bump();
            let name = self.id()?;
            let mult = self.multiplicity()?;
            Some((name, mult))
        } else {
            None
        };
        self.skip_doc();
        Ok(RelationDef {
            left: RelationEnd {
                entity: left_entity,
                name: left_name,
                multiplicity: left_mult,
            },
            right_entity,
            right,
            annotations,
            span: dot,
        })
    }

    fn typedef(&mut self) -> PResult<TypedefDef> {
        self.expect_kw(Kw::Typedef)?;
        if let Tok::Cid(_) = self.peek() {
            let span = self.span();
            return Err(Diagnostic::error(
                "syntax",
                "Syntax error: The use of default constructors is no longer supported",
            )
            .at(span));
        }
        let name = self.id()?;
        self.expect_kw(Kw::As)?;
        let base = self.ns_ref()?;
        let constraint = match self.peek() {
            Tok::Regex(r) => {
                let r = r.clone();
                let span = self.bump().span;
                TypedefConstraint::Regex(r, span)
            }
            Tok::Kw(Kw::Matching) => {
                self.bump();
                TypedefConstraint::Expr(self.expr()?)
            }
            _ => return Err(self.error()),
        };
        self.skip_doc();
        Ok(TypedefDef {
            span: name.span,
            name,
            base,
            constraint,
        })
    }

    fn index(&mut self) -> PResult<IndexDef> {
        let start = self.expect_kw(Kw::Index)?;
        let entity = self.class_ref()?;
        self.expect(&Tok::LParen)?;
        let mut attributes = vec![self.id()?];
        while self.eat(&Tok::Comma) {
            attributes.push(self.id()?);
        }
        self.expect(&Tok::RParen)?;
        Ok(IndexDef {
            entity,
            attributes,
            span: start,
        })
    }

    // ---------------------------------------------------------------- statements

    fn deeper(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Diagnostic::error(
                "syntax",
                format!("Syntax error: the model is nested too deeply here (more than {MAX_DEPTH} levels)"),
            )
            .at(self.span()));
        }
        Ok(())
    }

    fn stmt(&mut self) -> PResult<Stmt> {
        self.deeper()?;
        let r = self.stmt_inner();
        self.depth -= 1;
        r
    }

    fn stmt_inner(&mut self) -> PResult<Stmt> {
        match self.peek() {
            Tok::Kw(Kw::For) => {
                let span = self.bump().span;
                let var = self.id()?;
                self.expect_kw(Kw::In)?;
                let iterable = self.expr()?;
                self.expect(&Tok::Colon)?;
                let body = self.block()?;
                Ok(Stmt::For {
                    var,
                    iterable,
                    body,
                    span,
                })
            }
            Tok::Kw(Kw::If) => {
                let span = self.bump().span;
                let mut branches = Vec::new();
                let mut otherwise = None;
                let mut branch_span = span;
                loop {
                    let cond = self.expr()?;
                    self.expect(&Tok::Colon)?;
                    let mut body = Vec::new();
                    while !matches!(
                        self.peek(),
                        Tok::Kw(Kw::End) | Tok::Kw(Kw::Elif) | Tok::Kw(Kw::Else)
                    ) {
                        if self.at(&Tok::Eof) {
                            return Err(self.error());
                        }
                        body.push(self.stmt()?);
                    }
                    branches.push((cond, body, branch_span));
                    if self.at_kw(Kw::Elif) {
                        branch_span = self.bump().span;
                        continue;
                    }
                    if self.eat_kw(Kw::Else) {
                        self.expect(&Tok::Colon)?;
                        let mut body = Vec::new();
                        while !self.at_kw(Kw::End) {
                            if self.at(&Tok::Eof) {
                                return Err(self.error());
                            }
                            body.push(self.stmt()?);
                        }
                        otherwise = Some(body);
                    }
                    self.expect_kw(Kw::End)?;
                    break;
                }
                Ok(Stmt::If {
                    branches,
                    otherwise,
                    span,
                })
            }
            _ => {
                let e = self.expr()?;
                if matches!(self.peek(), Tok::Assign | Tok::PlusEq) {
                    if !e.is_var_ref() {
                        return Err(self.error());
                    }
                    let extend = self.at(&Tok::PlusEq);
                    let span = self.bump().span;
                    let value = self.expr()?;
                    return Ok(Stmt::Assign {
                        target: e,
                        value,
                        extend,
                        span,
                    });
                }
                Ok(Stmt::Expr(e))
            }
        }
    }

    // ---------------------------------------------------------------- expressions

    pub fn expr(&mut self) -> PResult<Expr> {
        self.expr_bp(0)
    }

    fn expr_bp(&mut self, min_bp: u8) -> PResult<Expr> {
        self.deeper()?;
        let start_depth = self.depth;
        let r = self.expr_bp_inner(min_bp);
        self.depth = start_depth - 1;
        r
    }

    fn expr_bp_inner(&mut self, min_bp: u8) -> PResult<Expr> {
        let mut lhs = if self.at_kw(Kw::Not) {
            let span = self.bump().span;
            let operand = self.expr_bp(BP_IN)?;
            Expr {
                span,
                kind: ExprKind::Not(Box::new(operand)),
            }
        } else {
            self.postfix()?
        };
        loop {
            let (op, bp) = match self.peek() {
                Tok::Question => {
                    if BP_COND < min_bp {
                        break;
                    }
                    self.deeper()?;
                    self.bump();
                    let then = self.expr_bp(0)?;
                    self.expect(&Tok::Colon)?;
                    let otherwise = self.expr_bp(BP_COND)?;
                    let span = lhs.span;
                    lhs = Expr {
                        span,
                        kind: ExprKind::Conditional(
                            Box::new(lhs),
                            Box::new(then),
                            Box::new(otherwise),
                        ),
                    };
                    continue;
                }
                Tok::Kw(Kw::Or) => (BinOp::Or, BP_OR),
                Tok::Kw(Kw::And) => (BinOp::And, BP_AND),
                Tok::Cmp(c) => (BinOp::Cmp(*c), BP_CMP),
                Tok::Plus => (BinOp::Add, BP_ADD),
                Tok::Minus => (BinOp::Sub, BP_ADD),
                Tok::Star => (BinOp::Mul, BP_MUL),
                Tok::Slash => (BinOp::Div, BP_MUL),
                Tok::Percent => (BinOp::Mod, BP_MUL),
                Tok::DoubleStar => (BinOp::Pow, BP_POW),
                Tok::Kw(Kw::In) => (BinOp::In, BP_IN),
                Tok::Kw(Kw::Not) if self.peek_at(1) == &Tok::Kw(Kw::In) => (BinOp::NotIn, BP_IN),
                _ => break,
            };
            // all binary operators are left associative: the right operand binds tighter
            if bp < min_bp {
                break;
            }
            self.deeper()?;
            let span = self.bump().span;
            if op == BinOp::NotIn {
                self.bump();
            }
            let rhs = self.expr_bp(bp + 1)?;
            lhs = Expr {
                span,
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
            };
        }
        Ok(lhs)
    }

    /// A primary expression followed by reference postfixes (`.x`, `[..]`, `(..)`, `is defined`).
    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.primary()?;
        let base_depth = self.depth;
        loop {
            if matches!(self.peek(), Tok::Dot | Tok::LBracket | Tok::Kw(Kw::Is)) {
                self.deeper()?;
            }
            match self.peek() {
                Tok::Dot if e.is_var_ref() => {
                    let dot = self.bump().span;
                    match self.peek() {
                        Tok::Id(_) => {
                            let name = self.id()?;
                            e = Expr {
                                span: dot,
                                kind: ExprKind::Attr(Box::new(e), name),
                            };
                        }
                        _ => return Err(self.error()),
                    }
                }
                Tok::LBracket if e.is_var_ref() || matches!(e.kind, ExprKind::MapLookup(..)) => {
                    let is_kwargs = matches!(
                        (self.peek_at(1), self.peek_at(2)),
                        (Tok::Id(_), Tok::Assign) | (Tok::DoubleStar, _) | (Tok::RBracket, _)
                    );
                    if is_kwargs {
                        if !matches!(e.kind, ExprKind::Attr(..)) {
                            self.bump();
                            return Err(self.error());
                        }
                        let open = self.bump().span;
                        let args = self.kwargs(&Tok::RBracket)?;
                        e = Expr {
                            span: open,
                            kind: ExprKind::ShortIndexLookup {
                                base: Box::new(e),
                                args,
                            },
                        };
                        // the result of a lookup cannot be dereferenced
                        break;
                    }
                    let open = self.bump().span;
                    let key = self.expr()?;
                    self.expect(&Tok::RBracket)?;
                    e = Expr {
                        span: e.span.to(open),
                        kind: ExprKind::MapLookup(Box::new(e), Box::new(key)),
                    };
                }
                Tok::LParen if matches!(e.kind, ExprKind::Attr(..)) => {
                    return Err(Diagnostic::error(
                        "syntax",
                        "Syntax error: function calls on attributes are not supported: call a plugin with its namespace, e.g. std::upper(x)",
                    )
                    .at(self.span()));
                }
                Tok::Kw(Kw::Is) if self.peek_at(1) == &Tok::Kw(Kw::Defined) => {
                    let ok = match &e.kind {
                        ExprKind::Var(q) => q.parts.len() == 1,
                        ExprKind::Attr(..) | ExprKind::MapLookup(..) => true,
                        _ => false,
                    };
                    if !ok {
                        return Err(self.error());
                    }
                    let span = self.bump().span;
                    self.bump();
                    e = Expr {
                        span,
                        kind: ExprKind::IsDefined(Box::new(e)),
                    };
                    break;
                }
                _ => break,
            }
        }
        self.depth = base_depth;
        Ok(e)
    }

    fn kwargs(&mut self, close: &Tok) -> PResult<Vec<Arg>> {
        let mut args = Vec::new();
        while !self.at(close) {
            if self.eat(&Tok::DoubleStar) {
                args.push(Arg::Splat(self.expr()?));
            } else {
                let name = self.id()?;
                self.expect(&Tok::Assign)?;
                args.push(Arg::Keyword(name, self.expr()?));
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(close)?;
        Ok(args)
    }

    fn call_args(&mut self) -> PResult<Vec<Arg>> {
        let mut args = Vec::new();
        while !self.at(&Tok::RParen) {
            if self.eat(&Tok::DoubleStar) {
                args.push(Arg::Splat(self.expr()?));
            } else if matches!(self.peek(), Tok::Id(_)) && self.peek_at(1) == &Tok::Assign {
                let name = self.id()?;
                self.bump();
                args.push(Arg::Keyword(name, self.expr()?));
            } else {
                args.push(Arg::Positional(self.expr()?));
            }
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RParen)?;
        Ok(args)
    }

    fn primary(&mut self) -> PResult<Expr> {
        let span = self.span();
        // matched by reference: a clone of the token copied every name and string once more
        let kind = match self.peek() {
            Tok::Int(i) => {
                self.bump();
                ExprKind::Int(i.clone())
            }
            Tok::Float(f) => {
                self.bump();
                ExprKind::Float(*f)
            }
            Tok::Kw(Kw::True) => {
                self.bump();
                ExprKind::Bool(true)
            }
            Tok::Kw(Kw::False) => {
                self.bump();
                ExprKind::Bool(false)
            }
            Tok::Kw(Kw::Null) => {
                self.bump();
                ExprKind::Null
            }
            Tok::Str(s) | Tok::Mls(s) => {
                self.bump();
                super::strings::interpolation(s, span)
            }
            Tok::RStr(s) => {
                self.bump();
                ExprKind::Str(s.clone())
            }
            Tok::FStr(s) => {
                self.bump();
                ExprKind::FString(super::strings::parse_fstring(s, span)?)
            }
            Tok::LParen => {
                self.bump();
                let e = self.expr()?;
                self.expect(&Tok::RParen)?;
                return Ok(e);
            }
            Tok::LBracket => return self.list(),
            Tok::LBrace => return self.map(),
            Tok::Cid(_) => return self.class_expr(),
            Tok::Id(_) => {
                if self.ref_is_class() {
                    return self.class_expr();
                }
                let q = self.ns_ref()?;
                if self.at(&Tok::LParen) {
                    self.bump();
                    let args = self.call_args()?;
                    return Ok(Expr {
                        span: q.span,
                        kind: ExprKind::Call { func: q, args },
                    });
                }
                return Ok(Expr {
                    span: q.span,
                    kind: ExprKind::Var(q),
                });
            }
            _ => return Err(self.error()),
        };
        Ok(Expr { kind, span })
    }

    /// Does the `a::b::…` at the cursor end in a class name?
    fn ref_is_class(&self) -> bool {
        let mut i = 0;
        loop {
            match (self.peek_at(i), self.peek_at(i + 1)) {
                (Tok::Id(_), Tok::Sep) => i += 2,
                (Tok::Cid(_), _) => return true,
                _ => return false,
            }
        }
    }

    fn class_expr(&mut self) -> PResult<Expr> {
        let class = self.class_ref()?;
        let span = class.last().span;
        match self.peek() {
            Tok::LParen => {
                self.bump();
                let args = self.kwargs(&Tok::RParen)?;
                Ok(Expr {
                    span,
                    kind: ExprKind::Constructor { class, args },
                })
            }
            Tok::LBracket => {
                let open = self.bump().span;
                let args = self.kwargs(&Tok::RBracket)?;
                Ok(Expr {
                    span: open,
                    kind: ExprKind::IndexLookup { class, args },
                })
            }
            _ => Err(self.error()),
        }
    }

    fn list(&mut self) -> PResult<Expr> {
        let open = self.expect(&Tok::LBracket)?;
        if self.eat(&Tok::RBracket) {
            return Ok(Expr {
                span: open,
                kind: ExprKind::List(Vec::new()),
            });
        }
        let first = self.expr()?;
        if self.at_kw(Kw::For) {
            let mut fors = Vec::new();
            while self.eat_kw(Kw::For) {
                let var = self.id()?;
                self.expect_kw(Kw::In)?;
                let it = self.expr()?;
                fors.push((var, it));
            }
            let mut guards = Vec::new();
            while self.eat_kw(Kw::If) {
                guards.push(self.expr()?);
            }
            self.expect(&Tok::RBracket)?;
            return Ok(Expr {
                span: open,
                kind: ExprKind::Comprehension {
                    value: Box::new(first),
                    fors,
                    guards,
                },
            });
        }
        let mut items = vec![first];
        while self.eat(&Tok::Comma) {
            if self.at(&Tok::RBracket) {
                break;
            }
            items.push(self.expr()?);
        }
        self.expect(&Tok::RBracket)?;
        Ok(Expr {
            span: open,
            kind: ExprKind::List(items),
        })
    }

    fn map(&mut self) -> PResult<Expr> {
        let open = self.expect(&Tok::LBrace)?;
        let mut pairs = Vec::new();
        while !self.at(&Tok::RBrace) {
            let key = match self.peek() {
                Tok::Str(s) => {
                    if super::strings::has_interpolation(s) {
                        return Err(Diagnostic::error(
                            "syntax",
                            "Syntax error: String interpolation is not supported in dictionary keys. Use raw string to use a key containing double curly brackets",
                        )
                        .at(self.span()));
                    }
                    s.clone()
                }
                Tok::RStr(s) => s.clone(),
                _ => return Err(self.error()),
            };
            self.bump();
            self.expect(&Tok::Colon)?;
            let value = self.expr()?;
            pairs.push((key, value));
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RBrace)?;
        Ok(Expr {
            span: open,
            kind: ExprKind::Dict(pairs),
        })
    }
}

fn reserved(k: Kw, span: Span) -> Diagnostic {
    Diagnostic::error(
        "syntax",
        format!(
            "Syntax error: invalid identifier, {} is a reserved keyword",
            k.as_str()
        ),
    )
    .at(span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::lexer::tokenize;
    use crate::compiler::source::FileId;

    fn parse_src(src: &str) -> PResult<File> {
        let mut w = Vec::new();
        let toks = tokenize(FileId(0), src, &mut w)?;
        parse(&toks)
    }

    fn expr_of(src: &str) -> Expr {
        let f = parse_src(&format!("x = {src}")).unwrap();
        match &f.items[0] {
            TopItem::Stmt(Stmt::Assign { value, .. }) => value.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn shape(e: &Expr) -> String {
        match &e.kind {
            ExprKind::Int(IntLit::Small(i)) => i.to_string(),
            ExprKind::Var(q) => q.full(),
            ExprKind::Binary(op, a, b) => format!("({} {:?} {})", shape(a), op, shape(b)),
            ExprKind::Not(a) => format!("(not {})", shape(a)),
            ExprKind::Conditional(c, a, b) => {
                format!("({} ? {} : {})", shape(c), shape(a), shape(b))
            }
            ExprKind::List(items) => format!(
                "[{}]",
                items.iter().map(shape).collect::<Vec<_>>().join(",")
            ),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn precedence() {
        assert_eq!(shape(&expr_of("2 ** 3 ** 2")), "((2 Pow 3) Pow 2)");
        assert_eq!(shape(&expr_of("not a == b")), "((not a) Cmp(Eq) b)");
        assert_eq!(shape(&expr_of("not a in b")), "(not (a In b))");
        assert_eq!(shape(&expr_of("1 + 1 in l")), "(1 Add (1 In l))");
        assert_eq!(
            shape(&expr_of("a ? b : c ? d : e")),
            "(a ? b : (c ? d : e))"
        );
        assert_eq!(shape(&expr_of("a or b and c")), "(a Or (b And c))");
        assert_eq!(shape(&expr_of("1 - 2 - 3")), "((1 Sub 2) Sub 3)");
        assert_eq!(shape(&expr_of("a not in b")), "(a NotIn b)");
    }

    #[test]
    fn statements_split_on_negative_literal() {
        let f = parse_src("x = 5-1").unwrap();
        assert_eq!(f.items.len(), 2);
    }

    #[test]
    fn errors() {
        let e = parse_src("x = (1 + 2\ny = 3").unwrap_err();
        assert!(
            e.message.contains("Syntax error at token y"),
            "{}",
            e.message
        );
        let e = parse_src("for = 1").unwrap_err();
        assert!(e.message.contains("reserved keyword"), "{}", e.message);
        let e = parse_src("x = A").unwrap_err();
        assert!(e.message.contains("end of file"), "{}", e.message);
        // like the reference, `f(1)[0]` is two statements: a call and a list
        assert!(parse_src("x = f(1)[0]").is_ok());
        assert!(
            parse_src("entity a:\nend")
                .unwrap_err()
                .message
                .contains("capital")
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        // the compiler runs on a large stack (see compiler::compile); so does this test
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(deep_nesting_cases)
            .unwrap()
            .join()
            .unwrap();
    }

    fn deep_nesting_cases() {
        let deep = format!("x = {}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(
            parse_src(&deep)
                .unwrap_err()
                .message
                .contains("nested too deeply")
        );
        let chain = format!("x = 1{}", " + 1".repeat(100_000));
        assert!(
            parse_src(&chain)
                .unwrap_err()
                .message
                .contains("nested too deeply")
        );
        let attrs = format!("x = a{}", ".b".repeat(100_000));
        assert!(
            parse_src(&attrs)
                .unwrap_err()
                .message
                .contains("nested too deeply")
        );
        let ifs = format!("{}{}", "if true:\n".repeat(5000), "end\n".repeat(5000));
        assert!(
            parse_src(&ifs)
                .unwrap_err()
                .message
                .contains("nested too deeply")
        );
        let ok = format!("x = {}", "1 + ".repeat(300) + "1");
        assert!(parse_src(&ok).is_ok());
    }

    #[test]
    fn items() {
        let f = parse_src(
            "entity A extends B:\n string x = \"a\"\n int[] l = [1,2,]\n dict? d = null\nend\nA.b [0:] -- B.a [1]\nimplement A using parents, x when true\ntypedef t as int matching self > 0\nindex A(x)\n",
        )
        .unwrap();
        assert_eq!(f.items.len(), 5);
    }
}
