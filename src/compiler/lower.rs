//! Lowering (the reference's "normalize" stage): statements and expressions of every block
//! become IR with all names resolved.
//!
//! Variables resolve innermost-first: comprehension variables, enclosing block scopes, then —
//! inside implementations and `when` conditions — `self` and the instance's attributes, then
//! the top-level variables of the namespace the code is written in (LANGUAGE.md §2.4, §8.3).
//! Types, plugins and constructor keywords are checked here, so an unknown entity is reported
//! before anything executes. A variable that cannot be found is an error only if the
//! expression runs (an untaken `if` branch may name anything).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::ast::{self, BinOp};
use super::diagnostics::Diagnostic;
use super::ids::*;
use super::ir::*;
use super::lexer::IntLit;
use super::names::{ResolvedType, hyphen_error, resolve_entity, resolve_type};
use super::program::Program;
use super::types::*;
use super::value::Value;

/// The static context of the code being lowered.
struct Cx {
    ns: NsId,
    /// Block scopes, outermost first: variable name -> slot.
    frames: Vec<HashMap<String, u16>>,
    /// True when frames[0] is the namespace's top-level block.
    top_level: bool,
    /// The entity whose instance is in scope (implementation bodies, `when` conditions).
    entity: Option<EntityId>,
    /// Comprehension variables, outermost first.
    env: Vec<String>,
    /// Lowering a typedef constraint: only `self` may be referenced.
    typedef: Option<String>,
}

/// What the value of an expression is assigned to: drives nested-constructor type inference
/// and the index attribute implied by a relation's reverse end (LANGUAGE.md §7.1, §10).
#[derive(Clone, Copy)]
enum Hint {
    None,
    /// Assigned to an attribute (so a constructor may get its reverse end implicitly).
    Lhs,
    /// A constructor keyword whose attribute is a relation to this entity.
    Entity(EntityId),
    /// A constructor keyword whose attribute has a non-entity type.
    Value(BaseType),
}

impl Hint {
    fn lhs_possible(self) -> bool {
        !matches!(self, Hint::None)
    }
}

/// Names assigned directly in a block: its local variables, in order of first assignment.
fn declared_vars<'a>(stmts: impl IntoIterator<Item = &'a ast::Stmt>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // a set beside the list: a namespace may assign thousands of variables
    let mut seen: HashSet<&str> = HashSet::new();
    for s in stmts {
        if let ast::Stmt::Assign { target, .. } = s
            && let ast::ExprKind::Var(q) = &target.kind
            && q.parts.len() == 1
            && seen.insert(q.parts[0].text.as_str())
        {
            out.push(q.parts[0].text.clone());
        }
    }
    out
}

fn root_var(e: &ast::Expr) -> Option<String> {
    match &e.kind {
        ast::ExprKind::Var(q) => Some(q.full()),
        ast::ExprKind::Attr(b, _) => root_var(b),
        _ => None,
    }
}

/// Eager promises a statement hands to its parent block: attribute assignments inside its
/// nested blocks whose instance is not a variable of those blocks.
fn stmt_promises(s: &ast::Stmt) -> Vec<(ast::Expr, ast::Name)> {
    match s {
        ast::Stmt::Assign {
            target, extend: _, ..
        } => match &target.kind {
            ast::ExprKind::Attr(base, name) => vec![((**base).clone(), name.clone())],
            _ => Vec::new(),
        },
        ast::Stmt::If {
            branches,
            otherwise,
            ..
        } => {
            let mut out = Vec::new();
            for (_, body, _) in branches {
                out.extend(block_promises(body, &[]));
            }
            if let Some(o) = otherwise {
                out.extend(block_promises(o, &[]));
            }
            out
        }
        ast::Stmt::For { var, body, .. } => block_promises(body, std::slice::from_ref(&var.text)),
        ast::Stmt::Expr(_) => Vec::new(),
    }
}

fn block_promises(stmts: &[ast::Stmt], extra: &[String]) -> Vec<(ast::Expr, ast::Name)> {
    let mut declared: HashSet<String> = declared_vars(stmts).into_iter().collect();
    declared.extend(extra.iter().cloned());
    stmts
        .iter()
        .flat_map(stmt_promises)
        .filter(|(inst, _)| root_var(inst).is_none_or(|r| !declared.contains(&r)))
        .collect()
}

/// Lowers code into the program: the IR, the namespaces' top-level variables and the interned
/// attribute names. Runs once define has built the type system; errors go to define's list.
pub(crate) struct Lowerer<'a> {
    p: &'a mut Program,
    /// Per namespace: its file's syntax tree.
    files: &'a mut [Option<ast::File>],
    errors: &'a mut Vec<Diagnostic>,
}

impl<'a> Lowerer<'a> {
    pub(crate) fn new(
        p: &'a mut Program,
        files: &'a mut [Option<ast::File>],
        errors: &'a mut Vec<Diagnostic>,
    ) -> Lowerer<'a> {
        Lowerer { p, files, errors }
    }

    fn new_block(&mut self) -> BlockId {
        self.p.ir.add_block(Block::default())
    }

    pub(crate) fn lower_all(&mut self) {
        // every namespace's top-level variables first: implementations may read them
        for nsi in 0..self.files.len() {
            let file = self.files[nsi].as_ref().expect("file present");
            let vars = declared_vars(top_stmts(file));
            self.p.namespaces[nsi].top_vars = vars
                .into_iter()
                .enumerate()
                .map(|(i, v)| (v, i as u16))
                .collect();
        }
        // implementations
        let mut impl_idx = 0usize;
        let mut rule_idx = 0usize;
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let file = self.files[nsi].take().expect("file present");
            for item in &file.items {
                match item {
                    ast::TopItem::Implementation(im) => {
                        let id = impl_idx;
                        impl_idx += 1;
                        let entity = self.p.implementations[id].entity;
                        let mut cx = Cx {
                            ns,
                            frames: Vec::new(),
                            top_level: false,
                            entity: Some(entity),
                            env: Vec::new(),
                            typedef: None,
                        };
                        let body = self.lower_block(&mut cx, &im.body, None);
                        self.p.implementations[id].body = body;
                    }
                    ast::TopItem::Implement(r) => {
                        // rules failing definition were not recorded; keep indexes aligned
                        let Some(rule) = self.p.rules.get(rule_idx) else {
                            continue;
                        };
                        if rule.span != r.span {
                            continue;
                        }
                        rule_idx += 1;
                        if let Some(w) = &r.when {
                            let mut cx = Cx {
                                ns,
                                frames: Vec::new(),
                                top_level: false,
                                entity: Some(rule.entity),
                                env: Vec::new(),
                                typedef: None,
                            };
                            let c = self.lower_expr(&mut cx, w, Hint::None);
                            self.p.rules[rule_idx - 1].condition = Some(c);
                        }
                    }
                    _ => {}
                }
            }
            self.files[nsi] = Some(file);
        }
        // top-level statements
        for nsi in 0..self.files.len() {
            let ns = NsId(nsi as u32);
            let mut file = self.files[nsi].take().expect("file present");
            // moved out, not copied: this is the last use of a file's top-level statements
            // (the variables they declare were taken above)
            let mut stmts: Vec<ast::Stmt> = Vec::new();
            let mut rest = Vec::with_capacity(file.items.len());
            for item in std::mem::take(&mut file.items) {
                match item {
                    ast::TopItem::Stmt(s) => stmts.push(s),
                    other => rest.push(other),
                }
            }
            file.items = rest;
            let mut cx = Cx {
                ns,
                frames: Vec::new(),
                top_level: true,
                entity: None,
                env: Vec::new(),
                typedef: None,
            };
            let block = self.lower_block(&mut cx, &stmts, None);
            self.p.namespaces[nsi].top_block = Some(block);
            self.files[nsi] = Some(file);
        }
    }

    pub(crate) fn lower_typedef_expr(
        &mut self,
        ns: NsId,
        e: &ast::Expr,
        name: &str,
    ) -> Result<ExprId, Diagnostic> {
        let mut cx = Cx {
            ns,
            frames: Vec::new(),
            top_level: false,
            entity: None,
            env: vec!["self".to_string()],
            typedef: Some(name.to_string()),
        };
        // errors in a constraint surface when a value is validated against it
        let saved = std::mem::take(&mut *self.errors);
        let id = self.lower_expr(&mut cx, e, Hint::None);
        let found = std::mem::replace(&mut *self.errors, saved);
        match found.into_iter().next() {
            Some(d) => {
                let span = e.span;
                Ok(self.p.ir.add_expr(ExprKind::Error(Box::new(d)), span))
            }
            None => Ok(id),
        }
    }

    fn lower_block(&mut self, cx: &mut Cx, stmts: &[ast::Stmt], loop_var: Option<&str>) -> BlockId {
        let mut names: Vec<String> = Vec::new();
        if let Some(v) = loop_var {
            names.push(v.to_string());
        }
        // declared_vars has each once: only the loop variable can come again
        for v in declared_vars(stmts) {
            if Some(v.as_str()) != loop_var {
                names.push(v);
            }
        }
        let frame: HashMap<String, u16> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u16))
            .collect();
        let id = self.new_block();
        cx.frames.push(frame);
        let mut ids = Vec::with_capacity(stmts.len());
        for s in stmts {
            if let Some(sid) = self.lower_stmt(cx, s) {
                ids.push(sid);
            }
        }
        cx.frames.pop();
        self.p.ir.blocks[id.0 as usize] = Block {
            names: names.into_iter().map(|n| Rc::from(n.as_str())).collect(),
            stmts: ids,
        };
        id
    }

    fn lower_promises(&mut self, cx: &mut Cx, list: Vec<(ast::Expr, ast::Name)>) -> Vec<Promise> {
        // promises are best effort: their errors are reported by the assignments themselves
        let saved = std::mem::take(&mut *self.errors);
        let out = list
            .into_iter()
            .map(|(inst, name)| Promise {
                instance: self.lower_expr(cx, &inst, Hint::None),
                sym: self.p.syms.intern(&name.text),
            })
            .collect();
        *self.errors = saved;
        out
    }

    fn lower_stmt(&mut self, cx: &mut Cx, s: &ast::Stmt) -> Option<StmtId> {
        let stmt = match s {
            ast::Stmt::Assign {
                target,
                value,
                extend,
                span,
            } => {
                match &target.kind {
                    ast::ExprKind::Var(q) if q.parts.len() == 1 => {
                        if *extend {
                            self.errors.push(
                                Diagnostic::error(
                                    "plus-assign",
                                    format!("Can not perform += on variable {}", q.parts[0].text),
                                )
                                .at(*span),
                            );
                            return None;
                        }
                        if let Some(e) = hyphen_error(&q.parts[0]) {
                            self.errors.push(e);
                            return None;
                        }
                        let slot = *cx
                            .frames
                            .last()
                            .and_then(|f| f.get(&q.parts[0].text))
                            .expect("declared variable");
                        let value = self.lower_expr(cx, value, Hint::None);
                        Stmt::AssignVar {
                            slot,
                            value,
                            span: *span,
                        }
                    }
                    ast::ExprKind::Var(q) => {
                        self.errors.push(
                        Diagnostic::error(
                            "assign",
                            format!("Can not assign to {}: variables of other namespaces are read-only", q.full()),
                        )
                        .at(*span),
                    );
                        return None;
                    }
                    ast::ExprKind::Attr(base, name) => {
                        let target = self.lower_expr(cx, base, Hint::None);
                        let sym = self.p.syms.intern(&name.text);
                        let value = self.lower_expr(cx, value, Hint::Lhs);
                        Stmt::AssignAttr {
                            target,
                            sym,
                            value,
                            extend: *extend,
                            span: *span,
                        }
                    }
                    _ => unreachable!("parser only produces var_ref targets"),
                }
            }
            ast::Stmt::Expr(e) => Stmt::Eval(self.lower_expr(cx, e, Hint::None)),
            ast::Stmt::For {
                var,
                iterable,
                body,
                span,
            } => {
                if let Some(e) = hyphen_error(var) {
                    self.errors.push(e);
                    return None;
                }
                let promises = block_promises(body, std::slice::from_ref(&var.text));
                let promises = self.lower_promises(cx, promises);
                let iterable = self.lower_expr(cx, iterable, Hint::None);
                let body = self.lower_block(cx, body, Some(&var.text));
                Stmt::For {
                    iterable,
                    body,
                    promises,
                    span: *span,
                }
            }
            ast::Stmt::If {
                branches,
                otherwise,
                span,
            } => return Some(self.lower_if(cx, branches, otherwise.as_deref(), *span)),
        };
        Some(self.p.ir.add_stmt(stmt))
    }

    /// `if a: … elif b: … else: … end` is `if a: … else: (if b: … else: … end) end`.
    fn lower_if(
        &mut self,
        cx: &mut Cx,
        branches: &[(ast::Expr, Vec<ast::Stmt>, crate::compiler::source::Span)],
        otherwise: Option<&[ast::Stmt]>,
        span: crate::compiler::source::Span,
    ) -> StmtId {
        let (cond, body, _) = &branches[0];
        let rest_stmt;
        let else_stmts: Option<&[ast::Stmt]> = if branches.len() > 1 {
            rest_stmt = vec![ast::Stmt::If {
                branches: branches[1..].to_vec(),
                otherwise: otherwise.map(|o| o.to_vec()),
                span: branches[1].2,
            }];
            Some(&rest_stmt)
        } else {
            otherwise
        };
        let mut promises = block_promises(body, &[]);
        if let Some(e) = else_stmts {
            promises.extend(block_promises(e, &[]));
        }
        let promises = self.lower_promises(cx, promises);
        let cond = self.lower_expr(cx, cond, Hint::None);
        let then_block = self.lower_block(cx, body, None);
        let else_block = else_stmts.map(|e| self.lower_block(cx, e, None));
        self.p.ir.add_stmt(Stmt::If {
            cond,
            then_block,
            else_block,
            promises,
            span,
        })
    }

    fn resolve_var(&mut self, cx: &Cx, q: &ast::QName) -> Result<VarRef, Diagnostic> {
        if let Some(prefix) = q.prefix() {
            let nsd = self.p.ns(cx.ns);
            let Some(target) = nsd.visible.get(&prefix) else {
                return Err(Diagnostic::error(
                    "unknown-namespace",
                    format!(
                        "Namespace {prefix} not found.\nTry importing it with `import {prefix}`"
                    ),
                )
                .at(q.span));
            };
            let t = self.p.ns(*target);
            return Ok(match t.top_vars.get(&q.last().text) {
                Some(&slot) => VarRef::NsVar { ns: *target, slot },
                None => VarRef::NotFound(Rc::from(q.last().text.as_str())),
            });
        }
        let name = &q.parts[0].text;
        if let Some(i) = cx.env.iter().rposition(|v| v == name) {
            return Ok(VarRef::Env(i as u16));
        }
        if let Some(td) = &cx.typedef {
            if name == td {
                return Ok(VarRef::Env(0));
            }
            return Err(Diagnostic::error(
                "typedef",
                format!(
                    "Unable to resolve `{name}`: a type constraint can not reference variables."
                ),
            )
            .at(q.span));
        }
        for (depth, frame) in cx.frames.iter().rev().enumerate() {
            if let Some(&slot) = frame.get(name) {
                return Ok(VarRef::Local {
                    up: depth as u16,
                    slot,
                });
            }
        }
        if let Some(e) = cx.entity {
            if name == "self" {
                return Ok(VarRef::SelfRef);
            }
            if let Some(sym) = self.p.syms.get(name)
                && self.p.entity(e).slot(sym).is_some()
            {
                return Ok(VarRef::SelfAttr(sym));
            }
        }
        if !cx.top_level
            && let Some(&slot) = self.p.ns(cx.ns).top_vars.get(name)
        {
            return Ok(VarRef::NsVar { ns: cx.ns, slot });
        }
        Ok(VarRef::NotFound(Rc::from(name.as_str())))
    }

    fn error_expr(&mut self, d: Diagnostic) -> ExprId {
        let span = d.primary.as_ref().map(|l| l.span).unwrap_or_default();
        self.errors.push(d);
        self.p.ir.add_expr(ExprKind::Const(Value::Null), span)
    }

    fn lower_path(&mut self, cx: &mut Cx, path: &[ast::Name]) -> ExprId {
        let first = &path[0];
        let q = ast::QName {
            parts: vec![first.clone()],
            span: first.span,
        };
        let mut id = match self.resolve_var(cx, &q) {
            Ok(v) => self.p.ir.add_expr(ExprKind::Var(v), first.span),
            Err(d) => return self.error_expr(d),
        };
        for n in &path[1..] {
            let sym = self.p.syms.intern(&n.text);
            id = self.p.ir.add_expr(ExprKind::Attr { base: id, sym }, n.span);
        }
        id
    }

    fn lower_fpieces(
        &mut self,
        cx: &mut Cx,
        pieces: &[ast::FPiece],
        span: crate::compiler::source::Span,
    ) -> Vec<FPiece> {
        pieces
            .iter()
            .map(|p| match p {
                ast::FPiece::Text(t) => FPiece::Text(Rc::from(t.as_str())),
                ast::FPiece::Field(f) => {
                    let value = if f.unregistered && !f.path.is_empty() {
                        let key = f.path.iter().map(|n| n.text.as_str()).collect::<Vec<_>>().join(".");
                        self.p.ir.add_expr(
                            ExprKind::Error(Box::new(
                                Diagnostic::error("fstring", format!("Invalid key in f-string: ''{key}''")).at(span),
                            )),
                            span,
                        )
                    } else if f.path.is_empty() || f.path[0].text.chars().all(|c| c.is_ascii_digit()) {
                        self.p.ir.add_expr(
                            ExprKind::Error(Box::new(
                                Diagnostic::error(
                                    "fstring",
                                    "f-strings do not support positional substitutions via '{}', use variable or attribute keys instead",
                                )
                                .at(span),
                            )),
                            span,
                        )
                    } else {
                        self.lower_path(cx, &f.path)
                    };
                    FPiece::Field {
                        value,
                        conversion: f.conversion,
                        spec: self.lower_fpieces(cx, &f.spec, span),
                    }
                }
            })
            .collect()
    }

    fn lower_expr(&mut self, cx: &mut Cx, e: &ast::Expr, hint: Hint) -> ExprId {
        use ast::ExprKind as A;
        let span = e.span;
        let kind = match &e.kind {
            A::Null => ExprKind::Const(Value::Null),
            A::Bool(b) => ExprKind::Const(Value::Bool(*b)),
            A::Int(IntLit::Small(i)) => ExprKind::Const(Value::Int(*i)),
            A::Int(IntLit::Big(b)) => ExprKind::Const(Value::from_bigint(b.clone())),
            A::Float(f) => ExprKind::Const(Value::Float(*f)),
            A::Str(s) => ExprKind::Const(Value::str(s)),
            A::Interpolated(parts) => {
                let pieces = parts
                    .iter()
                    .map(|p| match p {
                        ast::InterpPart::Text(t) => InterpPiece::Text(Rc::from(t.as_str())),
                        ast::InterpPart::Ref(path) => InterpPiece::Value(self.lower_path(cx, path)),
                    })
                    .collect();
                ExprKind::Interpolate(pieces)
            }
            A::FString(pieces) => ExprKind::FString(self.lower_fpieces(cx, pieces, span)),
            A::Var(q) => match self.resolve_var(cx, q) {
                Ok(v) => ExprKind::Var(v),
                Err(d) => return self.error_expr(d),
            },
            A::Attr(base, name) => {
                let base = self.lower_expr(cx, base, Hint::None);
                ExprKind::Attr {
                    base,
                    sym: self.p.syms.intern(&name.text),
                }
            }
            A::Constructor { class, args } => {
                return self.lower_constructor(cx, class, args, hint, span);
            }
            A::Call { func, args } => return self.lower_call(cx, func, args, span),
            A::IndexLookup { class, args } => {
                let entity = match resolve_entity(self.p, cx.ns, class) {
                    Ok(e) => e,
                    Err(d) => return self.error_expr(d),
                };
                let (args, splats) = self.lower_kwargs(cx, args);
                ExprKind::IndexLookup {
                    entity,
                    args,
                    splats,
                }
            }
            A::ShortIndexLookup { base, args } => {
                let A::Attr(inst, rel) = &base.kind else {
                    unreachable!("parser only builds short lookups on attributes")
                };
                let inst = self.lower_expr(cx, inst, Hint::None);
                let rel = self.p.syms.intern(&rel.text);
                let (args, splats) = self.lower_kwargs(cx, args);
                ExprKind::ShortIndexLookup {
                    base: inst,
                    rel,
                    args,
                    splats,
                }
            }
            A::MapLookup(m, k) => ExprKind::MapLookup {
                map: self.lower_expr(cx, m, Hint::None),
                key: self.lower_expr(cx, k, Hint::None),
            },
            A::List(items) => {
                ExprKind::List(items.iter().map(|i| self.lower_expr(cx, i, hint)).collect())
            }
            A::Dict(pairs) => {
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                for (k, v) in pairs {
                    if !seen.insert(k.clone()) {
                        return self.error_expr(
                            Diagnostic::error(
                                "duplicate-key",
                                format!("duplicate key in dict {k}"),
                            )
                            .at(span),
                        );
                    }
                    out.push((k.as_str().into(), self.lower_expr(cx, v, Hint::None)));
                }
                ExprKind::Dict(out)
            }
            A::Comprehension {
                value,
                fors,
                guards,
            } => return self.lower_comprehension(cx, value, fors, guards, span),
            A::Binary(op, a, b) => ExprKind::Binary {
                op: *op,
                a: self.lower_expr(cx, a, Hint::None),
                b: self.lower_expr(cx, b, Hint::None),
            },
            A::Not(a) => ExprKind::Not(self.lower_expr(cx, a, Hint::None)),
            A::IsDefined(target) => match &target.kind {
                A::MapLookup(m, k) => return self.lower_dict_is_defined(cx, m, k, span),
                _ => ExprKind::IsDefined(self.lower_expr(cx, target, Hint::None)),
            },
            A::Conditional(c, a, b) => ExprKind::Conditional {
                cond: self.lower_expr(cx, c, Hint::None),
                then: self.lower_expr(cx, a, hint),
                otherwise: self.lower_expr(cx, b, hint),
            },
        };
        self.p.ir.add_expr(kind, span)
    }

    /// `d[k] is defined` ≡ `k in d and d[k] != null and d[k] != []`.
    fn lower_dict_is_defined(
        &mut self,
        cx: &mut Cx,
        m: &ast::Expr,
        k: &ast::Expr,
        span: crate::compiler::source::Span,
    ) -> ExprId {
        let key = self.lower_expr(cx, k, Hint::None);
        let map = self.lower_expr(cx, m, Hint::None);
        let lookup = self.p.ir.add_expr(ExprKind::MapLookup { map, key }, span);
        let null = self.p.ir.add_expr(ExprKind::Const(Value::Null), span);
        let empty = self
            .p
            .ir
            .add_expr(ExprKind::Const(Value::empty_list()), span);
        let has = self.p.ir.add_expr(
            ExprKind::Binary {
                op: BinOp::In,
                a: key,
                b: map,
            },
            span,
        );
        let ne = |d: &mut Lowerer, b| {
            d.p.ir.add_expr(
                ExprKind::Binary {
                    op: BinOp::Cmp(super::lexer::CmpOp::Ne),
                    a: lookup,
                    b,
                },
                span,
            )
        };
        let not_null = ne(self, null);
        let not_empty = ne(self, empty);
        let first = self.p.ir.add_expr(
            ExprKind::Binary {
                op: BinOp::And,
                a: has,
                b: not_null,
            },
            span,
        );
        self.p.ir.add_expr(
            ExprKind::Binary {
                op: BinOp::And,
                a: first,
                b: not_empty,
            },
            span,
        )
    }

    fn lower_comprehension(
        &mut self,
        cx: &mut Cx,
        value: &ast::Expr,
        fors: &[(ast::Name, ast::Expr)],
        guards: &[ast::Expr],
        span: crate::compiler::source::Span,
    ) -> ExprId {
        // lower iterables outermost first, each seeing the earlier loop variables
        let base = cx.env.len();
        let mut iters = Vec::new();
        for (var, it) in fors {
            iters.push(self.lower_expr(cx, it, Hint::None));
            cx.env.push(var.text.clone());
        }
        let mut inner = self.lower_expr(cx, value, Hint::None);
        let mut guard: Option<ExprId> = None;
        for g in guards {
            let ge = self.lower_expr(cx, g, Hint::None);
            guard = Some(match guard {
                None => ge,
                Some(prev) => self.p.ir.add_expr(
                    ExprKind::Binary {
                        op: BinOp::And,
                        a: prev,
                        b: ge,
                    },
                    g.span,
                ),
            });
        }
        cx.env.truncate(base);
        for (i, it) in iters.into_iter().enumerate().rev() {
            inner = self.p.ir.add_expr(
                ExprKind::Comprehension {
                    value: inner,
                    env_slot: (base + i) as u16,
                    iter: it,
                    guard: guard.take(),
                },
                span,
            );
        }
        inner
    }

    fn lower_kwargs(
        &mut self,
        cx: &mut Cx,
        args: &[ast::Arg],
    ) -> (Vec<(Sym, ExprId)>, Vec<ExprId>) {
        let mut kw = Vec::new();
        let mut splats = Vec::new();
        for a in args {
            match a {
                ast::Arg::Keyword(n, v) => kw.push((
                    self.p.syms.intern(&n.text),
                    self.lower_expr(cx, v, Hint::None),
                )),
                ast::Arg::Splat(v) => splats.push(self.lower_expr(cx, v, Hint::None)),
                ast::Arg::Positional(v) => splats.push(self.lower_expr(cx, v, Hint::None)),
            }
        }
        (kw, splats)
    }

    fn lower_call(
        &mut self,
        cx: &mut Cx,
        func: &ast::QName,
        args: &[ast::Arg],
        span: crate::compiler::source::Span,
    ) -> ExprId {
        let resolved = match resolve_type(self.p, cx.ns, func) {
            Ok(r) => r,
            Err(d) => return self.error_expr(d),
        };
        match resolved {
            ResolvedType::Named(TypeRef::Plugin(plugin)) => {
                let mut call = Call {
                    plugin,
                    args: Vec::new(),
                    kwargs: Vec::new(),
                    splats: Vec::new(),
                };
                for a in args {
                    match a {
                        ast::Arg::Positional(v) => {
                            call.args.push(self.lower_expr(cx, v, Hint::None))
                        }
                        ast::Arg::Keyword(n, v) => {
                            let v = self.lower_expr(cx, v, Hint::None);
                            call.kwargs.push((Rc::from(n.text.as_str()), v))
                        }
                        ast::Arg::Splat(v) => call.splats.push(self.lower_expr(cx, v, Hint::None)),
                    }
                }
                self.p.ir.add_expr(ExprKind::Call(Box::new(call)), span)
            }
            ResolvedType::Prim(prim) => {
                let positional: Vec<&ast::Expr> = args
                    .iter()
                    .filter_map(|a| match a {
                        ast::Arg::Positional(v) => Some(v),
                        _ => None,
                    })
                    .collect();
                if positional.len() != args.len() {
                    return self.p.ir.add_expr(
                        ExprKind::Error(Box::new(
                            Diagnostic::error(
                                "cast",
                                "Only positional arguments allowed in type cast",
                            )
                            .at(span),
                        )),
                        span,
                    );
                }
                if positional.len() != 1 {
                    let shown: Vec<String> = positional.iter().map(|a| ast::pretty(a)).collect();
                    return self.p.ir.add_expr(
                        ExprKind::Error(Box::new(
                            Diagnostic::error(
                                "cast",
                                format!(
                                    "Illegal arguments {}: type cast expects exactly 1 argument",
                                    shown.join(",")
                                ),
                            )
                            .at(span),
                        )),
                        span,
                    );
                }
                let arg = self.lower_expr(cx, positional[0], Hint::None);
                self.p.ir.add_expr(ExprKind::Cast { prim, arg }, span)
            }
            ResolvedType::Named(_) => self.error_expr(
                Diagnostic::error(
                    "unknown-type",
                    format!(
                        "could not find type {} in namespace {}: it is not a plugin",
                        func.full(),
                        self.p.ns(cx.ns).name
                    ),
                )
                .at(func.span),
            ),
        }
    }

    fn constructor_type(
        &mut self,
        cx: &Cx,
        class: &ast::QName,
        hint: Hint,
    ) -> Result<EntityId, Diagnostic> {
        let normal = resolve_entity(self.p, cx.ns, class);
        match hint {
            Hint::Value(b) => Err(Diagnostic::error(
                "type",
                format!(
                    "Can not assign a value of type {} to a variable of type {}",
                    match &normal {
                        Ok(e) => self.p.entity(*e).full_name.clone(),
                        Err(_) => class.full(),
                    },
                    self.p.base_type_name(b)
                ),
            )
            .at(class.span)),
            Hint::Entity(h) => match normal {
                Ok(e) => {
                    if !self.p.is_subtype(e, h) {
                        return Err(Diagnostic::error(
                            "type",
                            format!(
                                "Can not assign a value of type {} to a variable of type {}",
                                self.p.entity(e).full_name,
                                self.p.entity(h).full_name
                            ),
                        )
                        .at(class.span));
                    }
                    Ok(e)
                }
                Err(err) if class.parts.len() == 1 => {
                    let short = &class.parts[0].text;
                    let mut candidates: Vec<EntityId> = std::iter::once(h)
                        .chain(self.p.entity(h).descendants.iter().copied())
                        .filter(|c| &self.p.entity(*c).name == short)
                        .collect();
                    candidates.dedup();
                    match candidates.len() {
                        0 => Err(err),
                        1 => Ok(candidates[0]),
                        n => Err(Diagnostic::error(
                            "ambiguous-type",
                            format!(
                                "Could not determine namespace for type {short}. {n} possible candidates exists: [{}].",
                                candidates
                                    .iter()
                                    .map(|c| self.p.entity(*c).full_name.clone())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )
                        .at(class.span)),
                    }
                }
                Err(err) => Err(err),
            },
            _ => normal,
        }
    }

    fn lower_constructor(
        &mut self,
        cx: &mut Cx,
        class: &ast::QName,
        args: &[ast::Arg],
        hint: Hint,
        span: crate::compiler::source::Span,
    ) -> ExprId {
        let entity = match self.constructor_type(cx, class, hint) {
            Ok(e) => e,
            Err(d) => return self.error_expr(d),
        };
        let mut c = Construct {
            entity,
            args: Vec::new(),
            splats: Vec::new(),
            missing_index_slots: Vec::new(),
        };
        let mut seen: HashSet<u16> = HashSet::new();
        for a in args {
            match a {
                ast::Arg::Keyword(name, value) => {
                    let sym = self.p.syms.intern(&name.text);
                    let Some(slot) = self.p.entity(entity).slot(sym) else {
                        return self.error_expr(
                            Diagnostic::error(
                                "unknown-attribute",
                                format!(
                                    "no attribute {} on type {}",
                                    name.text,
                                    self.p.entity(entity).full_name
                                ),
                            )
                            .at(name.span),
                        );
                    };
                    if !seen.insert(slot) {
                        return self.error_expr(
                            Diagnostic::error(
                                "duplicate-keyword",
                                format!(
                                    "The attribute {} in the constructor call of {} is already set.",
                                    name.text,
                                    class.full()
                                ),
                            )
                            .at(name.span),
                        );
                    }
                    let attr = self.p.slot_attr(entity, slot);
                    let direct = self.p.entity(entity).index_slot[slot as usize];
                    let value_hint = if direct {
                        Hint::None
                    } else {
                        match &attr.kind {
                            AttrKind::Relation { target, .. } => Hint::Entity(*target),
                            AttrKind::Value { ty, .. } => Hint::Value(ty.base),
                        }
                    };
                    let value = self.lower_expr(cx, value, value_hint);
                    c.args.push(CtorArg {
                        sym,
                        slot,
                        value,
                        direct,
                        span: name.span,
                    });
                }
                ast::Arg::Splat(v) | ast::Arg::Positional(v) => {
                    let v = self.lower_expr(cx, v, Hint::None);
                    c.splats.push(v)
                }
            }
        }
        let ent = self.p.entity(entity);
        for (slot, is_index) in ent.index_slot.iter().enumerate() {
            let slot = slot as u16;
            if *is_index && !seen.contains(&slot) && ent.defaults[slot as usize].is_none() {
                c.missing_index_slots.push(slot);
            }
        }
        if !c.missing_index_slots.is_empty()
            && c.splats.is_empty()
            && (!hint.lhs_possible() || c.missing_index_slots.len() > 1)
        {
            let bullets: Vec<String> = c
                .missing_index_slots
                .iter()
                .map(|s| {
                    let a = self.p.slot_attr(entity, *s);
                    format!(
                        "* Missing attribute '{}'. The attribute {}.{} is part of an index.",
                        a.name,
                        self.p.entity(entity).full_name,
                        a.name
                    )
                })
                .collect();
            return self.error_expr(
                Diagnostic::error(
                    "index-attribute",
                    format!("Invalid Constructor call:\n{}", bullets.join("\n")),
                )
                .at(span),
            );
        }
        self.p.ir.add_expr(ExprKind::Construct(Box::new(c)), span)
    }
}

fn top_stmts(file: &ast::File) -> impl Iterator<Item = &ast::Stmt> {
    file.items.iter().filter_map(|i| match i {
        ast::TopItem::Stmt(s) => Some(s),
        _ => None,
    })
}
