//! Expression evaluation.
//!
//! `eval` returns the value or stops: `Stop::Block(rv)` when a needed value does not exist
//! yet (the task re-runs later), `Stop::Err` on a compile error. Side-effecting evaluations
//! (constructors, plugin calls) record their results in the task's memo so a re-run replays
//! them instead of repeating them.

use std::collections::hash_map::Entry;
use std::rc::Rc;

use super::state::*;
use super::{Eval, IndexKey, KeyPart, Runtime, Stop, err};
use crate::compiler::ast::BinOp;
use crate::compiler::ids::*;
use crate::compiler::ir::*;
use crate::compiler::source::Span;
use crate::compiler::types::{AttrKind, BaseType, Prim};
use crate::compiler::value::pyfmt;
use crate::compiler::value::{Dict, InstId, Value, py_eq};

/// The dynamic context of one evaluation.
pub struct Cx {
    pub task: TaskId,
    pub scope: ScopeId,
    /// Comprehension variables (and a typedef constraint's `self`).
    pub env: Vec<Value>,
    pub memo_pos: usize,
    /// The relation the value is assigned to: a constructor may take its reverse end as an
    /// index attribute.
    pub lhs: Option<(InstId, Sym)>,
}

impl Cx {
    pub fn new(task: TaskId, scope: ScopeId) -> Cx {
        Cx {
            task,
            scope,
            env: Vec::new(),
            memo_pos: 0,
            lhs: None,
        }
    }
}

impl Runtime<'_> {
    // ------------------------------------------------------------------ memo

    pub fn memo_get(&mut self, cx: &mut Cx) -> Option<Value> {
        if cx.task.0 == NONE {
            return None;
        }
        let extra = self.tasks[cx.task.0 as usize].extra.as_ref()?;
        match extra.memo.get(cx.memo_pos)? {
            Memo::Value(v) => {
                let v = v.clone();
                cx.memo_pos += 1;
                Some(v)
            }
            Memo::Marker => None,
        }
    }

    pub fn memo_put(&mut self, cx: &mut Cx, v: Value) {
        if cx.task.0 == NONE {
            return;
        }
        self.tasks[cx.task.0 as usize]
            .extra()
            .memo
            .push(Memo::Value(v));
        cx.memo_pos += 1;
    }

    /// Was a gradual registration recorded at this point of an earlier run?
    pub fn memo_marker(&mut self, cx: &mut Cx) -> bool {
        if cx.task.0 == NONE {
            return false;
        }
        let Some(extra) = self.tasks[cx.task.0 as usize].extra.as_ref() else {
            return false;
        };
        if matches!(extra.memo.get(cx.memo_pos), Some(Memo::Marker)) {
            cx.memo_pos += 1;
            true
        } else {
            false
        }
    }

    pub fn memo_put_marker(&mut self, cx: &mut Cx) {
        if cx.task.0 == NONE {
            return;
        }
        self.tasks[cx.task.0 as usize]
            .extra()
            .memo
            .push(Memo::Marker);
        cx.memo_pos += 1;
    }

    // ------------------------------------------------------------------ variables

    pub fn scope_inst(&self, scope: ScopeId) -> Option<InstId> {
        let i = self.scopes[scope.0 as usize].inst;
        if i == NONE { None } else { Some(InstId(i)) }
    }

    /// The RV a variable reference names, when it is stored in one.
    pub fn var_rv(&self, cx: &Cx, r: &VarRef) -> Option<RvId> {
        match r {
            VarRef::Local { up, slot } => {
                let mut s = cx.scope.0;
                for _ in 0..*up {
                    s = self.scopes[s as usize].parent;
                }
                Some(RvId(self.scopes[s as usize].rv_base + *slot as u32))
            }
            VarRef::NsVar { ns, slot } => {
                let scope = self.ns_scopes[ns.0 as usize];
                Some(RvId(self.scopes[scope.0 as usize].rv_base + *slot as u32))
            }
            _ => None,
        }
    }

    /// Read the complete value of an RV, or block.
    pub fn read_rv(&self, rv: RvId, span: Span) -> Eval<Value> {
        let r = &self.rvs[rv.0 as usize];
        match &r.state {
            RvState::Set(v) => Ok(v.clone()),
            RvState::FrozenNull => Err(self.optional_error(rv, span)),
            RvState::Unset => Err(Stop::Block(rv, WaitMode::Complete)),
        }
    }

    fn optional_error(&self, rv: RvId, span: Span) -> Stop {
        let r = &self.rvs[rv.0 as usize];
        let inst = InstId(r.owner);
        let e = self.inst_entity(inst);
        let attr = self.p.slot_attr(e, r.slot);
        err(
            "optional-empty",
            format!(
                "Optional variable accessed that has no value (attribute `{}.{}` of `{}`)",
                self.p.entity(attr.owner).full_name,
                attr.name,
                self.inst_site_text(inst)
            ),
            span,
        )
    }

    fn read_var(&mut self, cx: &mut Cx, r: &VarRef, span: Span) -> Eval<Value> {
        match r {
            VarRef::Local { .. } | VarRef::NsVar { .. } => {
                let rv = self.var_rv(cx, r).expect("stored variable");
                self.read_rv(rv, span)
            }
            VarRef::SelfRef => match self.scope_inst(cx.scope) {
                Some(i) => Ok(Value::Instance(i)),
                None => Err(err("not-found", "variable self not found", span)),
            },
            VarRef::SelfAttr(sym) => {
                let inst = self.scope_inst(cx.scope).expect("instance scope");
                self.read_attr(&Value::Instance(inst), *sym, span, "self")
            }
            VarRef::Env(i) => Ok(cx.env.get(*i as usize).cloned().unwrap_or(Value::Null)),
            VarRef::NotFound(name) => {
                Err(err("not-found", format!("variable {name} not found"), span))
            }
        }
    }

    /// The RV behind an attribute of an instance value.
    pub fn attr_rv_of(
        &self,
        base: &Value,
        sym: Sym,
        span: Span,
        base_text: &str,
    ) -> Eval<Option<RvId>> {
        let inst = match base {
            Value::Instance(i) => *i,
            Value::Unknown => return Ok(None),
            other => {
                return Err(err(
                    "not-entity",
                    format!(
                        "can not get attribute {}, {} is not an entity but a {} with value '{}'",
                        self.p.syms.name(sym),
                        base_text,
                        other.py_type_name(),
                        self.value_str(other)
                    ),
                    span,
                ));
            }
        };
        let e = self.inst_entity(inst);
        match self.p.entity(e).slot(sym) {
            Some(slot) => {
                // every read by name (and every assignment through one): conservatively a read
                let rv = self.attr_rv(inst, slot);
                self.rvs[rv.0 as usize].mark(super::state::READ);
                Ok(Some(rv))
            }
            None => Err(err(
                "unknown-attribute",
                format!(
                    "could not find attribute with name: {} in type {}",
                    self.p.syms.name(sym),
                    self.p.entity(e).full_name
                ),
                span,
            )),
        }
    }

    pub fn read_attr(&self, base: &Value, sym: Sym, span: Span, base_text: &str) -> Eval<Value> {
        match self.attr_rv_of(base, sym, span, base_text)? {
            Some(rv) => self.read_rv(rv, span),
            None => Ok(Value::Unknown),
        }
    }

    fn expr_text(&self, id: ExprId) -> String {
        let e = self.p.ir.expr(id);
        match &e.kind {
            ExprKind::Var(VarRef::SelfRef) => "self".into(),
            ExprKind::Attr { base, sym } => {
                format!("{}.{}", self.expr_text(*base), self.p.syms.name(*sym))
            }
            _ => self.sources.snippet(e.span).to_string(),
        }
    }

    /// For a variable or attribute reference: the RV it names (without reading it).
    pub fn ref_rv(&mut self, cx: &mut Cx, id: ExprId) -> Eval<Option<RvId>> {
        let p = self.p;
        let e = p.ir.expr(id);
        match &e.kind {
            ExprKind::Var(VarRef::SelfAttr(sym)) => {
                let inst = self.scope_inst(cx.scope).expect("instance scope");
                self.attr_rv_of(&Value::Instance(inst), *sym, e.span, "self")
            }
            ExprKind::Var(r) => Ok(self.var_rv(cx, r)),
            ExprKind::Attr { base, sym } => {
                let b = self.eval(cx, *base)?;
                let text = self.expr_text(*base);
                self.attr_rv_of(&b, *sym, e.span, &text)
            }
            _ => Ok(None),
        }
    }

    // ------------------------------------------------------------------ eval

    pub fn eval(&mut self, cx: &mut Cx, id: ExprId) -> Eval<Value> {
        let p = self.p;
        let e = p.ir.expr(id);
        let span = e.span;
        match &e.kind {
            ExprKind::Const(v) => Ok(v.clone()),
            ExprKind::Var(r) => self.read_var(cx, r, span),
            ExprKind::Attr { base, sym } => {
                let b = self.eval(cx, *base)?;
                if let Value::Instance(_) = b {
                    self.read_attr(&b, *sym, span, "")
                } else {
                    let text = self.expr_text(*base);
                    self.read_attr(&b, *sym, span, &text)
                }
            }
            ExprKind::Construct(c) => self.construct(cx, c, id),
            ExprKind::Call(c) => self.call_plugin(cx, c, id),
            ExprKind::Cast { prim, arg } => {
                let v = self.eval(cx, *arg)?;
                super::ops::cast(self, *prim, v, span)
            }
            ExprKind::IndexLookup {
                entity,
                args,
                splats,
            } => {
                let mut values = Vec::new();
                for (sym, v) in args {
                    values.push((*sym, self.eval(cx, *v)?));
                }
                self.splat_args(cx, splats, &mut values, span)?;
                self.index_lookup(*entity, values, span)
            }
            ExprKind::ShortIndexLookup {
                base,
                rel,
                args,
                splats,
            } => {
                let b = self.eval(cx, *base)?;
                let Value::Instance(inst) = b else {
                    if b.is_unknown() {
                        return Ok(Value::Unknown);
                    }
                    let text = self.expr_text(*base);
                    return Err(err(
                        "not-entity",
                        format!(
                            "can not get attribute {}, {} is not an entity but a {} with value '{}'",
                            p.syms.name(*rel),
                            text,
                            b.py_type_name(),
                            self.value_str(&b)
                        ),
                        span,
                    ));
                };
                let ent = self.inst_entity(inst);
                let Some(slot) = p.entity(ent).slot(*rel) else {
                    return Err(err(
                        "unknown-attribute",
                        format!(
                            "could not find attribute with name: {} in type {}",
                            p.syms.name(*rel),
                            p.entity(ent).full_name
                        ),
                        span,
                    ));
                };
                let attr = p.slot_attr(ent, slot);
                let (target, reverse) = match &attr.kind {
                    AttrKind::Relation {
                        target,
                        reverse: Some(r),
                        ..
                    } => (*target, *r),
                    _ => {
                        return Err(err(
                            "index",
                            format!(
                                "short index lookup is only possible on bidirectional relations, {} is not one",
                                attr.name
                            ),
                            span,
                        ));
                    }
                };
                let mut values = vec![(p.attr(reverse).sym, Value::Instance(inst))];
                for (sym, v) in args {
                    values.push((*sym, self.eval(cx, *v)?));
                }
                self.splat_args(cx, splats, &mut values, span)?;
                self.index_lookup(target, values, span)
            }
            ExprKind::MapLookup { map, key } => {
                let m = self.eval(cx, *map)?;
                let k = self.eval(cx, *key)?;
                if m.is_unknown() || k.is_unknown() {
                    return Ok(Value::Unknown);
                }
                let Value::Dict(d) = &m else {
                    let text = self.expr_text(*map);
                    return Err(err(
                        "dict",
                        format!(
                            "dict lookup is only possible on dicts, {} is not an object but a {} with value {}",
                            text,
                            m.py_type_name(),
                            self.value_str(&m)
                        ),
                        span,
                    ));
                };
                let Value::Str(ks) = &k else {
                    return Err(err(
                        "dict",
                        format!("dict keys must be string, got {}", self.value_repr(&k)),
                        span,
                    ));
                };
                match d.get(ks) {
                    Some(v) => Ok(v.clone()),
                    None => Err(err(
                        "dict",
                        format!(
                            "key {} not found in dict, options are [{}]",
                            ks,
                            d.keys()
                                .map(|k| k.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        span,
                    )),
                }
            }
            ExprKind::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for i in items {
                    match self.eval(cx, *i)? {
                        Value::List(l) => out.extend(l.iter().cloned()),
                        v => out.push(v),
                    }
                }
                Ok(Value::list(out))
            }
            ExprKind::Dict(pairs) => {
                let mut d = Dict::with_capacity(pairs.len());
                for (k, v) in pairs {
                    let v = self.eval(cx, *v)?;
                    d.insert(k.clone(), v);
                }
                Ok(Value::Dict(Rc::new(d)))
            }
            ExprKind::Comprehension {
                value,
                env_slot,
                iter,
                guard,
            } => {
                let it = self.eval(cx, *iter)?;
                let items = match it {
                    Value::List(l) => l,
                    Value::Unknown => return Ok(Value::Unknown),
                    other => {
                        return Err(err(
                            "comprehension",
                            format!(
                                "A list comprehension can only be applied to lists and relations, got {}",
                                other.py_type_name()
                            ),
                            span,
                        ));
                    }
                };
                let mut out = Vec::new();
                let saved = cx.env.len();
                for item in items.iter() {
                    if item.is_unknown() {
                        continue;
                    }
                    cx.env.truncate(*env_slot as usize);
                    cx.env.push(item.clone());
                    let keep = match guard {
                        Some(g) => self.guard(cx, *g)?,
                        None => true,
                    };
                    if keep {
                        match self.eval(cx, *value)? {
                            Value::List(l) => out.extend(l.iter().cloned()),
                            v => out.push(v),
                        }
                    }
                }
                cx.env.truncate(saved.min(*env_slot as usize));
                Ok(Value::list(out))
            }
            ExprKind::Binary { op, a, b } => self.binary(cx, *op, *a, *b, span),
            ExprKind::Not(a) => match self.eval(cx, *a)? {
                Value::Bool(b) => Ok(Value::Bool(!b)),
                Value::Unknown => Ok(Value::Unknown),
                other => Err(err(
                    "not-bool",
                    format!(
                        "Invalid value `{}`: `not` expects a boolean",
                        self.value_str(&other)
                    ),
                    span,
                )),
            },
            ExprKind::Conditional {
                cond,
                then,
                otherwise,
            } => match self.eval(cx, *cond)? {
                Value::Bool(true) => self.eval(cx, *then),
                Value::Bool(false) => self.eval(cx, *otherwise),
                Value::Unknown => Ok(Value::Unknown),
                other => Err(err(
                    "not-bool",
                    format!(
                        "Invalid value `{}`: the condition for a conditional expression must be a boolean expression",
                        self.value_str(&other)
                    ),
                    span,
                )),
            },
            ExprKind::IsDefined(target) => self.is_defined(cx, *target, span),
            ExprKind::Interpolate(pieces) => {
                let mut s = String::new();
                for piece in pieces {
                    match piece {
                        InterpPiece::Text(t) => s.push_str(t),
                        InterpPiece::Value(v) => {
                            let v = self.eval(cx, *v)?;
                            if v.is_unknown() {
                                return Ok(Value::Unknown);
                            }
                            s.push_str(&pyfmt::interp_str(&v, self));
                        }
                    }
                }
                Ok(Value::string(s))
            }
            ExprKind::FString(pieces) => {
                let mut s = String::new();
                match self.fstring(cx, pieces, &mut s, span)? {
                    true => Ok(Value::string(s)),
                    false => Ok(Value::Unknown),
                }
            }
            ExprKind::Error(d) => Err(Stop::Err(d.clone())),
        }
    }

    /// A comprehension guard: must be a boolean (reported as a conditional expression, as
    /// the reference compiles guards to `guard ? value : skip`).
    fn guard(&mut self, cx: &mut Cx, g: ExprId) -> Eval<bool> {
        let span = self.p.ir.expr(g).span;
        match self.eval(cx, g)? {
            Value::Bool(b) => Ok(b),
            Value::Unknown => Ok(false),
            other => Err(err(
                "not-bool",
                format!(
                    "Invalid value `{}`: the condition for a conditional expression must be a boolean expression",
                    self.value_str(&other)
                ),
                span,
            )),
        }
    }

    fn fstring(
        &mut self,
        cx: &mut Cx,
        pieces: &[FPiece],
        out: &mut String,
        span: Span,
    ) -> Eval<bool> {
        for piece in pieces {
            match piece {
                FPiece::Text(t) => out.push_str(t),
                FPiece::Field {
                    value,
                    conversion,
                    spec,
                } => {
                    let mut v = self.eval(cx, *value)?;
                    if v.is_unknown() {
                        return Ok(false);
                    }
                    if let Value::Float(f) = v
                        && f.is_finite()
                        && f.fract() == 0.0
                    {
                        v = Value::from_bigint(
                            num_traits::FromPrimitive::from_f64(f).unwrap_or_default(),
                        );
                    }
                    let mut spec_text = String::new();
                    if !self.fstring(cx, spec, &mut spec_text, span)? {
                        return Ok(false);
                    }
                    let v = match conversion {
                        None => v,
                        Some('r') | Some('a') => Value::string(pyfmt::repr(&v, self)),
                        Some('s') => Value::string(pyfmt::to_str(&v, self)),
                        Some(c) => {
                            return Err(err(
                                "fstring",
                                format!("Invalid f-string: Unknown conversion specifier {c}"),
                                span,
                            ));
                        }
                    };
                    let text = super::format::format_value(&v, &spec_text, self)
                        .map_err(|m| err("fstring", format!("Invalid f-string: {m}"), span))?;
                    out.push_str(&text);
                }
            }
        }
        Ok(true)
    }

    fn is_defined(&mut self, cx: &mut Cx, target: ExprId, span: Span) -> Eval<Value> {
        let p = self.p;
        let te = p.ir.expr(target);
        let rv = match &te.kind {
            ExprKind::Var(VarRef::SelfRef) | ExprKind::Var(VarRef::Env(_)) => {
                let v = self.eval(cx, target)?;
                return Ok(Value::Bool(defined_value(&v)));
            }
            ExprKind::Var(VarRef::NotFound(name)) => {
                return Err(err("not-found", format!("variable {name} not found"), span));
            }
            _ => match self.ref_rv(cx, target)? {
                Some(rv) => rv,
                None => return Ok(Value::Unknown),
            },
        };
        let r = &self.rvs[rv.0 as usize];
        match r.kind {
            RvKind::List => {
                let d = self.dl(rv);
                if !d.items.is_empty() {
                    return Ok(Value::Bool(true));
                }
                if d.frozen {
                    return Ok(Value::Bool(false));
                }
                Err(Stop::Block(rv, WaitMode::FirstValue))
            }
            RvKind::Optional => match &r.state {
                RvState::Set(v) => Ok(Value::Bool(defined_value(v))),
                RvState::FrozenNull => Ok(Value::Bool(false)),
                RvState::Unset => Err(Stop::Block(rv, WaitMode::FirstValue)),
            },
            _ => match &r.state {
                RvState::Set(v) => {
                    if v.is_unknown() {
                        Ok(Value::Unknown)
                    } else {
                        Ok(Value::Bool(defined_value(v)))
                    }
                }
                RvState::FrozenNull => Ok(Value::Bool(false)),
                RvState::Unset => Err(Stop::Block(rv, WaitMode::Complete)),
            },
        }
    }

    fn binary(&mut self, cx: &mut Cx, op: BinOp, a: ExprId, b: ExprId, span: Span) -> Eval<Value> {
        match op {
            BinOp::And | BinOp::Or => {
                let name = if op == BinOp::And { "and" } else { "or" };
                let l = self.eval(cx, a)?;
                let lb = match l {
                    Value::Bool(x) => x,
                    Value::Unknown => return Ok(Value::Unknown),
                    other => {
                        return Err(err(
                            "not-bool",
                            format!(
                                "Invalid left hand value `{}`: `{name}` expects a boolean",
                                self.value_str(&other)
                            ),
                            span,
                        ));
                    }
                };
                if (op == BinOp::And && !lb) || (op == BinOp::Or && lb) {
                    return Ok(Value::Bool(lb));
                }
                let r = self.eval(cx, b)?;
                match r {
                    Value::Bool(_) | Value::Unknown => Ok(r),
                    other => Err(err(
                        "not-bool",
                        format!(
                            "Invalid right hand value `{}`: `{name}` expects a boolean (Invalid value '{}', expected bool)",
                            self.value_str(&other),
                            self.value_str(&other)
                        ),
                        span,
                    )),
                }
            }
            BinOp::In | BinOp::NotIn => {
                let x = self.eval(cx, a)?;
                let coll = self.eval(cx, b)?;
                let r = self.contains(&x, &coll, span)?;
                Ok(match (r, op) {
                    (Value::Bool(v), BinOp::NotIn) => Value::Bool(!v),
                    (r, _) => r,
                })
            }
            _ => {
                let x = self.eval(cx, a)?;
                let y = self.eval(cx, b)?;
                super::ops::binary(self, op, &x, &y, span)
            }
        }
    }

    fn contains(&self, x: &Value, coll: &Value, span: Span) -> Eval<Value> {
        if x.is_unknown() || coll.is_unknown() {
            return Ok(Value::Unknown);
        }
        match coll {
            Value::List(items) => {
                if items.iter().any(|i| py_eq(i, x)) {
                    Ok(Value::Bool(true))
                } else if items.iter().any(Value::is_unknown) {
                    Ok(Value::Unknown)
                } else {
                    Ok(Value::Bool(false))
                }
            }
            Value::Dict(d) => Ok(Value::Bool(match x {
                Value::Str(s) => d.contains_key(s),
                _ => false,
            })),
            other => Err(err(
                "in",
                format!(
                    "Operand two of 'in' can only be a list or dict ({})",
                    self.value_str(other)
                ),
                span,
            )),
        }
    }

    fn splat_args(
        &mut self,
        cx: &mut Cx,
        splats: &[ExprId],
        out: &mut Vec<(Sym, Value)>,
        span: Span,
    ) -> Eval<()> {
        for s in splats {
            match self.eval(cx, *s)? {
                Value::Dict(d) => {
                    for (k, v) in d.iter() {
                        match self.p.syms.get(k) {
                            Some(sym) => out.push((sym, v.clone())),
                            None => {
                                return Err(err(
                                    "index",
                                    format!("No index defined with attribute {k} for this lookup"),
                                    span,
                                ));
                            }
                        }
                    }
                }
                other => {
                    return Err(err(
                        "kwargs",
                        format!(
                            "** can only be applied to a dict, got {}",
                            self.value_str(&other)
                        ),
                        span,
                    ));
                }
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ indexes

    pub fn key_part(v: &Value) -> KeyPart {
        match v {
            Value::Null => KeyPart::Null,
            Value::Bool(b) => KeyPart::Bool(*b),
            Value::Int(i) => KeyPart::Int(*i),
            Value::BigInt(b) => KeyPart::Big(b.to_string()),
            Value::Float(f) => KeyPart::Float(f.to_bits()),
            Value::Str(s) => KeyPart::Str(s.clone()),
            Value::Instance(i) => KeyPart::Inst(*i),
            other => KeyPart::Other(format!("{other:?}")),
        }
    }

    fn key_text(&self, entity: EntityId, attrs: &[String], key: &IndexKey) -> String {
        let _ = entity;
        attrs
            .iter()
            .zip(key.iter())
            .map(|(a, k)| {
                let v = match k {
                    KeyPart::Null => "null".to_string(),
                    KeyPart::Bool(b) => if *b { "True" } else { "False" }.to_string(),
                    KeyPart::Int(i) => i.to_string(),
                    KeyPart::Big(b) => b.clone(),
                    KeyPart::Float(f) => pyfmt::float_repr(f64::from_bits(*f)),
                    KeyPart::Str(s) => pyfmt::str_repr(s),
                    KeyPart::Inst(i) => pyfmt::InstanceText::inst_repr(self, *i),
                    KeyPart::Other(o) => o.clone(),
                };
                format!("{a}={v}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn index_lookup(
        &mut self,
        entity: EntityId,
        values: Vec<(Sym, Value)>,
        span: Span,
    ) -> Eval<Value> {
        let p = self.p;
        let ent = p.entity(entity);
        let mut names: Vec<&str> = Vec::new();
        for (s, _) in &values {
            let n = p.syms.name(*s);
            if names.contains(&n) {
                return Err(err(
                    "index",
                    format!("Attribute {n} provided twice in index lookup"),
                    span,
                ));
            }
            names.push(n);
        }
        if values.iter().any(|(_, v)| v.is_unknown()) {
            return Ok(Value::Unknown);
        }
        let mut sorted: Vec<&str> = names.clone();
        sorted.sort();
        let found = ent.indexes.iter().enumerate().find(|(_, (id, _))| {
            let mut a: Vec<&str> = p.indexes[id.0 as usize]
                .attrs
                .iter()
                .map(|s| s.as_str())
                .collect();
            a.sort();
            a == sorted
        });
        let Some((pos, (idx, _))) = found else {
            let params = values
                .iter()
                .map(|(s, v)| format!("('{}', {})", p.syms.name(*s), self.value_repr(v)))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(err(
                "index",
                format!(
                    "No index defined on {} for this lookup: [{params}]",
                    ent.full_name
                ),
                span,
            ));
        };
        let attrs = &p.indexes[idx.0 as usize].attrs;
        let mut key = Vec::with_capacity(attrs.len());
        for a in attrs {
            let (_, v) = values
                .iter()
                .find(|(s, _)| p.syms.name(*s) == a)
                .expect("index attribute present");
            // lookups convert ints to floats for float-typed attributes
            let slot = ent
                .slot(p.syms.get(a).expect("interned"))
                .expect("index slot");
            let v = match (&p.slot_attr(entity, slot).kind, v) {
                (
                    AttrKind::Value {
                        ty:
                            crate::compiler::types::ValueType {
                                base: BaseType::Prim(Prim::Float),
                                ..
                            },
                        ..
                    },
                    Value::Int(i),
                ) => Value::Float(*i as f64),
                _ => v.clone(),
            };
            key.push(Self::key_part(&v));
        }
        if let Some(inst) = self.index_maps[entity.0 as usize][pos].get(&key) {
            return Ok(Value::Instance(*inst));
        }
        let k = (entity, pos, key);
        if let Some((rv, _)) = self.pending_lookups.get(&k) {
            return Err(Stop::Block(*rv, WaitMode::Complete));
        }
        let rv = RvId(self.new_var_rvs(1));
        self.pending_lookups.insert(k, (rv, span));
        Err(Stop::Block(rv, WaitMode::Complete))
    }

    /// Register a new instance in the indexes of its type and all ancestors.
    pub fn register_in_indexes(
        &mut self,
        inst: InstId,
        values: &[(u16, Value)],
        span: Span,
    ) -> Eval<()> {
        let p = self.p;
        let entity = self.inst_entity(inst);
        let ent = p.entity(entity);
        // the instance goes into the maps of its entity and of each ancestor, for each index
        // that type has; every one of those indexes is also in `ent.indexes`, with the slots
        // of the attributes in this entity (no name lookups per instance)
        for t in std::iter::once(entity).chain(ent.ancestors.iter().copied()) {
            for (pos, (idx, _)) in p.entity(t).indexes.iter().enumerate() {
                let Some((_, slots)) = ent.indexes.iter().find(|(own, _)| own == idx) else {
                    continue;
                };
                let mut key = Vec::with_capacity(slots.len());
                for slot in slots {
                    match values.iter().find(|(s, _)| s == slot) {
                        Some((_, v)) => key.push(Self::key_part(v)),
                        None => break,
                    }
                }
                if key.len() != slots.len() || key.is_empty() {
                    continue;
                }
                // one hash of the key: the entry, and the waiting lookup only if there are any
                let waiting = !self.pending_lookups.is_empty();
                match self.index_maps[t.0 as usize][pos].entry(key) {
                    Entry::Occupied(o) => {
                        if *o.get() != inst {
                            let key = o.key().clone();
                            let attrs = &p.indexes[idx.0 as usize].attrs;
                            let text = self.key_text(t, attrs, &key);
                            return Err(err(
                                "index",
                                format!("Duplicate key in index. {text}"),
                                span,
                            ));
                        }
                    }
                    Entry::Vacant(v) => {
                        let key = waiting.then(|| v.key().clone());
                        v.insert(inst);
                        if let Some(key) = key
                            && let Some((rv, _)) = self.pending_lookups.remove(&(t, pos, key))
                        {
                            self.rvs[rv.0 as usize].state = RvState::Set(Value::Instance(inst));
                            self.wake(rv, false);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Find existing instances with the index keys of a constructor call.
    pub fn find_in_indexes(&self, entity: EntityId, values: &[(u16, Value)]) -> Vec<InstId> {
        let p = self.p;
        let ent = p.entity(entity);
        let mut out = Vec::new();
        for (pos, (_, slots)) in ent.indexes.iter().enumerate() {
            let mut key = Vec::with_capacity(slots.len());
            for s in slots {
                match values.iter().find(|(slot, _)| slot == s) {
                    Some((_, v)) => key.push(Self::key_part(v)),
                    None => break,
                }
            }
            if key.len() != slots.len() {
                continue;
            }
            if let Some(i) = self.index_maps[entity.0 as usize][pos].get(&key) {
                out.push(*i);
            }
        }
        out
    }
}

/// `is defined` on a value: false for null and the empty list.
fn defined_value(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::List(l) => !l.is_empty(),
        _ => true,
    }
}
