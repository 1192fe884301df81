//! Assigning values: variables, plain attributes and relation ends, with type validation,
//! double-set detection, reverse ends and relation freezing (LANGUAGE.md §5.2, §7, §12.1).

use super::expr::Cx;
use super::state::*;
use super::{Eval, Runtime, Stop, err};
use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::ids::{AttrId, EntityId, ExprId};
use crate::compiler::source::Span;
use crate::compiler::types::{AttrKind, BaseType, Constraint, Prim, ValueType, compiled_regex};
use crate::compiler::value::pyfmt;
use crate::compiler::value::{InstId, Value, py_eq};

impl Runtime<'_> {
    fn site_span(&self, site: ExprId) -> Span {
        self.p.ir.expr(site).span
    }

    fn double_set(&self, old: &Value, old_site: u32, new: &Value, site: ExprId) -> String {
        let old_loc = if old_site == NONE {
            "<unknown>".to_string()
        } else {
            self.span_text(self.site_span(ExprId(old_site)))
        };
        format!(
            "value set twice:\n\told value: {}\n\t\tset at {}\n\tnew value: {}\n\t\tset at {}\n",
            self.value_str(old),
            old_loc,
            self.value_str(new),
            self.span_text(self.site_span(site))
        )
    }

    /// Assign a block variable.
    pub fn set_var(&mut self, rv: RvId, value: Value, site: ExprId, span: Span) -> Eval<()> {
        let r = &self.rvs[rv.0 as usize];
        match &r.state {
            RvState::Set(old) => {
                if py_eq(old, &value) {
                    return Ok(());
                }
                let msg = self.double_set(old, r.set_by, &value, site);
                Err(err("double-set", msg, span))
            }
            _ => {
                let r = &mut self.rvs[rv.0 as usize];
                r.state = RvState::Set(value);
                r.set_by = site.0;
                self.wake(rv, false);
                Ok(())
            }
        }
    }

    fn wrap(&self, inst: InstId, slot: u16, cause: String, span: Span) -> Stop {
        let e = self.inst_entity(inst);
        let attr = self.p.slot_attr(e, slot);
        err(
            "set-attribute",
            format!(
                "Could not set attribute `{}` on instance `{}`\ncaused by: {}",
                attr.name,
                self.inst_site_text(inst),
                cause
            ),
            span,
        )
    }

    /// Assign `value` to attribute `slot` of `inst` (relations: add / set, both ends).
    pub fn set_attr(
        &mut self,
        inst: InstId,
        slot: u16,
        value: Value,
        site: ExprId,
        recur: bool,
    ) -> Eval<()> {
        let span = self.site_span(site);
        match self.set_attr_inner(inst, slot, value, site, recur) {
            Ok(()) => Ok(()),
            Err(SetError::Plain(msg)) => Err(self.wrap(inst, slot, msg, span)),
            Err(SetError::Stop(s)) => Err(s),
        }
    }

    fn set_attr_inner(
        &mut self,
        inst: InstId,
        slot: u16,
        value: Value,
        site: ExprId,
        recur: bool,
    ) -> Result<(), SetError> {
        let p = self.p;
        let entity = self.inst_entity(inst);
        let attr = p.slot_attr(entity, slot);
        let rv = self.attr_rv(inst, slot);
        match &attr.kind {
            AttrKind::Value { ty, .. } => {
                self.validate(&value, ty).map_err(SetError::Plain)?;
                self.set_single(rv, value, site)
            }
            AttrKind::Relation {
                target, reverse, ..
            } => {
                let target = *target;
                let reverse = *reverse;
                match self.rvs[rv.0 as usize].kind {
                    RvKind::List => self.add_to_list(inst, rv, value, target, reverse, site, recur),
                    RvKind::Optional => {
                        let r = &self.rvs[rv.0 as usize];
                        match (&r.state, &value) {
                            (RvState::FrozenNull, Value::Null) => return Ok(()),
                            (RvState::FrozenNull, _) => {
                                return Err(SetError::Plain(
                                    self.modified_after_freeze(inst, slot, &value, site),
                                ));
                            }
                            (RvState::Set(old), _) => {
                                if py_eq(old, &value) {
                                    return Ok(());
                                }
                                let msg = self.double_set(old, r.set_by, &value, site);
                                return Err(SetError::Plain(msg));
                            }
                            (RvState::Unset, _) => {}
                        }
                        if value.is_null() {
                            self.freeze(rv);
                            return Ok(());
                        }
                        if value.is_unknown() {
                            self.rvs[rv.0 as usize].state = RvState::Set(value);
                            self.freeze(rv);
                            return Ok(());
                        }
                        let other = self
                            .check_instance(&value, target)
                            .map_err(SetError::Plain)?;
                        let r = &mut self.rvs[rv.0 as usize];
                        r.state = RvState::Set(value);
                        r.set_by = site.0;
                        if recur && let Some(rev) = reverse {
                            self.set_reverse(other, rev, inst, site)?;
                        }
                        self.freeze(rv);
                        Ok(())
                    }
                    _ => {
                        if value.is_unknown() {
                            return self.set_single(rv, value, site);
                        }
                        let other = self
                            .check_instance(&value, target)
                            .map_err(SetError::Plain)?;
                        let changed = matches!(self.rvs[rv.0 as usize].state, RvState::Unset);
                        self.set_single(rv, value, site)?;
                        if recur
                            && changed
                            && let Some(rev) = reverse
                        {
                            self.set_reverse(other, rev, inst, site)?;
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    fn set_reverse(
        &mut self,
        other: InstId,
        rev: AttrId,
        inst: InstId,
        site: ExprId,
    ) -> Result<(), SetError> {
        let sym = self.p.attr(rev).sym;
        let oe = self.inst_entity(other);
        let slot = self.p.entity(oe).slot(sym).expect("reverse end exists");
        match self.set_attr(other, slot, Value::Instance(inst), site, false) {
            Ok(()) => Ok(()),
            Err(s) => Err(SetError::Stop(s)),
        }
    }

    fn set_single(&mut self, rv: RvId, value: Value, site: ExprId) -> Result<(), SetError> {
        let r = &self.rvs[rv.0 as usize];
        if let RvState::Set(old) = &r.state {
            if py_eq(old, &value) {
                r.mark(super::state::SET_AGAIN);
                return Ok(());
            }
            return Err(SetError::Plain(
                self.double_set(old, r.set_by, &value, site),
            ));
        }
        let r = &mut self.rvs[rv.0 as usize];
        r.state = RvState::Set(value);
        r.set_by = site.0;
        self.wake(rv, false);
        Ok(())
    }

    fn modified_after_freeze(
        &self,
        inst: InstId,
        slot: u16,
        value: &Value,
        site: ExprId,
    ) -> String {
        let e = self.inst_entity(inst);
        let attr = self.p.slot_attr(e, slot);
        format!(
            "List modified after freeze: the compiler guessed that the relation '{}' on instance `{}` would never get a value assigned, but the value {} was assigned at {}",
            attr.name,
            self.inst_site_text(inst),
            self.value_str(value),
            self.span_text(self.site_span(site))
        )
    }

    fn check_instance(&self, value: &Value, target: EntityId) -> Result<InstId, String> {
        match value {
            Value::Instance(i) => {
                let e = self.inst_entity(*i);
                if self.p.is_subtype(e, target) {
                    Ok(*i)
                } else {
                    Err(format!(
                        "Invalid class type for {}, should be {}",
                        self.inst_site_text(*i),
                        self.p.entity(target).full_name
                    ))
                }
            }
            other => Err(format!(
                "Invalid type for value '{}', should be type {}",
                self.value_str(other),
                self.p.entity(target).full_name
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn add_to_list(
        &mut self,
        inst: InstId,
        rv: RvId,
        value: Value,
        target: EntityId,
        reverse: Option<AttrId>,
        site: ExprId,
        recur: bool,
    ) -> Result<(), SetError> {
        match value {
            Value::Null => {
                let d = self.dl(rv);
                if !d.items.is_empty() {
                    let e = self.inst_entity(inst);
                    let slot = self.rvs[rv.0 as usize].slot;
                    let attr = self.p.slot_attr(e, slot);
                    let vals: Vec<String> =
                        d.items.iter().map(|i| self.inst_site_text(*i)).collect();
                    return Err(SetError::Stop(err(
                        "null-relation",
                        format!(
                            "Trying to set relation attribute `{}` of instance `{}` to null but it has values `{}` assigned already",
                            attr.name,
                            self.inst_site_text(inst),
                            vals.join(", ")
                        ),
                        self.site_span(site),
                    )));
                }
                self.freeze(rv);
                Ok(())
            }
            Value::List(items) => {
                for v in items.iter() {
                    self.add_to_list(inst, rv, v.clone(), target, reverse, site, recur)?;
                }
                if items.is_empty() && self.can_get(rv) {
                    self.queue_candidate(rv);
                }
                Ok(())
            }
            Value::Unknown => Ok(()),
            value => {
                let other = self
                    .check_instance(&value, target)
                    .map_err(SetError::Plain)?;
                let d = self.dl(rv);
                if d.contains(other) {
                    return Ok(());
                }
                if d.frozen {
                    let slot = self.rvs[rv.0 as usize].slot;
                    if d.high == Some(d.items.len() as u32) {
                        let e = self.inst_entity(inst);
                        let attr = self.p.slot_attr(e, slot);
                        return Err(SetError::Stop(err(
                            "arity",
                            format!(
                                "Exceeded relation arity on attribute '{}' of instance '{}'",
                                attr.name,
                                self.inst_site_text(inst)
                            ),
                            self.site_span(site),
                        )));
                    }
                    return Err(SetError::Plain(
                        self.modified_after_freeze(inst, slot, &value, site),
                    ));
                }
                self.dl_mut(rv).push(other);
                self.notify_listeners(rv, other)?;
                self.wake(rv, true);
                if recur && let Some(rev) = reverse {
                    self.set_reverse(other, rev, inst, site)?;
                }
                let d = self.dl(rv);
                if d.high == Some(d.items.len() as u32) {
                    self.freeze(rv);
                } else if self.can_get(rv) {
                    self.queue_candidate(rv);
                }
                Ok(())
            }
        }
    }

    /// Run the gradual listeners of a relation for a new element.
    fn notify_listeners(&mut self, rv: RvId, item: InstId) -> Result<(), SetError> {
        // most relations have no listener: no copy of the empty list per element
        if self.dl(rv).listeners().is_empty() {
            return Ok(());
        }
        let listeners = self.dl(rv).listeners().to_vec();
        for l in listeners {
            self.deliver(&l, item).map_err(SetError::Stop)?;
        }
        Ok(())
    }

    pub fn deliver(&mut self, l: &Listener, item: InstId) -> Eval<()> {
        match l {
            Listener::ForBody { body, scope } => {
                self.emit_for_body(*body, *scope, Value::Instance(item));
                Ok(())
            }
            Listener::Forward { target, site } => {
                self.add_to_relation(*target, Value::Instance(item), *site)
            }
            Listener::Comprehension {
                target,
                comp,
                scope,
                env,
                site,
            } => {
                let extra = TaskExtra {
                    env: Some(env.clone()),
                    ..Default::default()
                };
                let t = self.spawn(
                    TaskKind::CompElem {
                        target: *target,
                        comp: *comp,
                        element: Value::Instance(item),
                        site: *site,
                    },
                    *scope,
                    Some(Box::new(extra)),
                );
                self.hold(t, *target);
                Ok(())
            }
        }
    }

    /// Add a value (instance, list of instances, null) to the relation stored in `rv`.
    pub fn add_to_relation(&mut self, rv: RvId, value: Value, site: ExprId) -> Eval<()> {
        let r = &self.rvs[rv.0 as usize];
        let inst = InstId(r.owner);
        let slot = r.slot;
        self.set_attr(inst, slot, value, site, true)
    }

    // ------------------------------------------------------------------ validation

    /// Check a value against a declared attribute type (LANGUAGE.md §5.2, §5.3).
    pub fn validate(&mut self, value: &Value, ty: &ValueType) -> Result<(), String> {
        if value.is_unknown() {
            return Ok(());
        }
        if value.is_null() {
            if ty.nullable {
                return Ok(());
            }
            return Err(format!(
                "Invalid value 'null', expected {}",
                self.p.value_type_name(ty)
            ));
        }
        if ty.list {
            let Value::List(items) = value else {
                return Err(format!(
                    "Invalid value '{}', expected {}",
                    self.value_str(value),
                    self.p.value_type_name(ty)
                ));
            };
            let elem = ValueType {
                base: ty.base,
                list: false,
                nullable: false,
            };
            for i in items.iter() {
                self.validate(i, &elem)?;
            }
            return Ok(());
        }
        self.validate_base(value, ty.base)
    }

    pub fn validate_base(&mut self, value: &Value, base: BaseType) -> Result<(), String> {
        if value.is_unknown() {
            return Ok(());
        }
        let expected = |rt: &Runtime, v: &Value, name: &str| -> Result<(), String> {
            Err(format!(
                "Invalid value '{}', expected {}",
                rt.value_str(v),
                name
            ))
        };
        match base {
            BaseType::Prim(p) => {
                let ok = match p {
                    Prim::String => matches!(value, Value::Str(_)),
                    Prim::Int => matches!(value, Value::Int(_) | Value::BigInt(_) | Value::Bool(_)),
                    Prim::Float => matches!(value, Value::Float(_)),
                    Prim::Number => value.is_number() || matches!(value, Value::Bool(_)),
                    Prim::Bool => matches!(value, Value::Bool(_)),
                    // list and dict hold literals only: no instances, at any depth
                    Prim::List | Prim::Dict => {
                        let elements: Vec<&Value> = match (p, value) {
                            (Prim::List, Value::List(items)) => items.iter().collect(),
                            (Prim::Dict, Value::Dict(d)) => d.values().collect(),
                            _ => return expected(self, value, p.name()),
                        };
                        if let Some(bad) = elements.into_iter().find(|v| !is_literal(v)) {
                            return Err(format!(
                                "Invalid value '{}', expected Literal",
                                self.value_str(bad)
                            ));
                        }
                        true
                    }
                };
                if ok {
                    Ok(())
                } else {
                    expected(self, value, p.name())
                }
            }
            BaseType::Typedef(t) => {
                let td = self.p.typedef(t);
                self.validate_base(value, td.base)?;
                let ok = match &td.constraint {
                    // a pattern that exceeds the backtracking limit does not match
                    Constraint::Regex { source, regex } => {
                        let regex = compiled_regex(source, regex)?;
                        match value {
                            Value::Str(s) => regex.is_match(&**s).unwrap_or(false),
                            other => regex.is_match(&self.value_str(other)).unwrap_or(false),
                        }
                    }
                    Constraint::Expr { expr, .. } => {
                        let mut cx = Cx::new(TaskId(NONE), ScopeId(0));
                        cx.env.push(value.clone());
                        match self.eval(&mut cx, *expr) {
                            Ok(Value::Bool(b)) => b,
                            Ok(Value::Unknown) => true,
                            Ok(_) => false,
                            Err(Stop::Err(d)) => return Err(d.message),
                            Err(Stop::Block(..)) => {
                                return Err("a type constraint can not reference variables".into());
                            }
                        }
                    }
                };
                if ok {
                    Ok(())
                } else {
                    let text = match &td.constraint {
                        Constraint::Regex { source, .. } => format!("/{source}/"),
                        Constraint::Expr { text, .. } => text.clone(),
                    };
                    Err(format!(
                        "Invalid value '{}', does not match constraint `{}`",
                        self.value_str(value),
                        text
                    ))
                }
            }
            BaseType::Entity(e) => match value {
                Value::Instance(i) if self.p.is_subtype(self.inst_entity(*i), e) => Ok(()),
                other => expected(self, other, &self.p.entity(e).full_name.clone()),
            },
        }
    }

    /// Validate every default value against its attribute type (done before execution).
    pub fn check_defaults(&mut self) -> Result<(), Diagnostic> {
        let p = self.p;
        for attr in &p.attributes {
            if let AttrKind::Value {
                ty,
                default: crate::compiler::types::DefaultDecl::Value(v),
            } = &attr.kind
                && let Err(msg) = self.validate(v, ty)
            {
                return Err(Diagnostic::error("default", msg).at(attr.span));
            }
        }
        Ok(())
    }

    /// Assign into a multi-valued relation, gradually: list literals element by element,
    /// other relations by forwarding each element as it arrives, comprehensions per element.
    pub fn assign_into(
        &mut self,
        cx: &mut Cx,
        target: RvId,
        expr: ExprId,
        site: ExprId,
    ) -> Eval<()> {
        let p = self.p;
        let e = p.ir.expr(expr);
        match &e.kind {
            crate::compiler::ir::ExprKind::List(items) => {
                let mut first_block = None;
                for i in items {
                    match self.assign_into(cx, target, *i, site) {
                        Ok(()) => {}
                        Err(Stop::Block(rv, m)) => {
                            if first_block.is_none() {
                                first_block = Some(Stop::Block(rv, m));
                            }
                        }
                        Err(other) => return Err(other),
                    }
                }
                match first_block {
                    Some(b) => Err(b),
                    None => Ok(()),
                }
            }
            crate::compiler::ir::ExprKind::Conditional {
                cond,
                then,
                otherwise,
            } => match self.eval(cx, *cond)? {
                Value::Bool(true) => self.assign_into(cx, target, *then, site),
                Value::Bool(false) => self.assign_into(cx, target, *otherwise, site),
                Value::Unknown => Ok(()),
                other => Err(err(
                    "not-bool",
                    format!(
                        "Invalid value `{}`: the condition for a conditional expression must be a boolean expression",
                        self.value_str(&other)
                    ),
                    e.span,
                )),
            },
            crate::compiler::ir::ExprKind::Var(_) | crate::compiler::ir::ExprKind::Attr { .. } => {
                match self.ref_rv(cx, expr)? {
                    Some(src) if self.rvs[src.0 as usize].kind == RvKind::List => {
                        self.forward(cx, src, target, site)
                    }
                    _ => {
                        let v = self.eval(cx, expr)?;
                        self.add_to_relation(target, v, site)
                    }
                }
            }
            crate::compiler::ir::ExprKind::Comprehension {
                iter,
                env_slot,
                guard,
                ..
            } => {
                let _ = guard;
                let src = match p.ir.expr(*iter).kind {
                    crate::compiler::ir::ExprKind::Var(_)
                    | crate::compiler::ir::ExprKind::Attr { .. } => self.ref_rv(cx, *iter)?,
                    _ => None,
                };
                // registered on an earlier run: the listener did the work
                if src.is_some_and(|s| self.rvs[s.0 as usize].kind == RvKind::List)
                    && self.memo_marker(cx)
                {
                    let src = src.expect("checked");
                    return if self.is_frozen(src) {
                        Ok(())
                    } else {
                        Err(Stop::Block(src, WaitMode::Gradual))
                    };
                }
                match src {
                    Some(src)
                        if self.rvs[src.0 as usize].kind == RvKind::List
                            && !self.is_frozen(src) =>
                    {
                        let mut env: Vec<Value> = cx.env.clone();
                        env.truncate(*env_slot as usize);
                        let listener = Listener::Comprehension {
                            target,
                            comp: expr,
                            scope: cx.scope,
                            env: env.into(),
                            site,
                        };
                        let existing = self.dl(src).items.clone();
                        self.memo_put_marker(cx);
                        self.dl_mut(src).add_listener(listener.clone());
                        for i in existing {
                            self.deliver(&listener, i)?;
                        }
                        Err(Stop::Block(src, WaitMode::Gradual))
                    }
                    _ => {
                        let v = self.eval(cx, expr)?;
                        self.add_to_relation(target, v, site)
                    }
                }
            }
            _ => {
                let v = self.eval(cx, expr)?;
                self.add_to_relation(target, v, site)
            }
        }
    }

    /// `a.r = b.r`: forward b.r's elements to a.r as they come; done when b.r is frozen.
    fn forward(&mut self, cx: &mut Cx, src: RvId, target: RvId, site: ExprId) -> Eval<()> {
        if self.memo_marker(cx) {
            return if self.is_frozen(src) {
                Ok(())
            } else {
                Err(Stop::Block(src, WaitMode::Gradual))
            };
        }
        let items = self.dl(src).items.clone();
        // the marker is recorded first: later side effects keep their memo positions
        self.memo_put_marker(cx);
        if !self.is_frozen(src) {
            self.dl_mut(src)
                .add_listener(Listener::Forward { target, site });
        }
        for i in items {
            self.add_to_relation(target, Value::Instance(i), site)?;
        }
        if self.is_frozen(src) {
            return Ok(());
        }
        Err(Stop::Block(src, WaitMode::Gradual))
    }

    /// A text for messages about a value (used by plugins as well).
    pub fn describe(&self, v: &Value) -> String {
        pyfmt::repr(v, self)
    }
}

/// A value built from primitives only (what `list` and `dict` attributes may hold).
fn is_literal(v: &Value) -> bool {
    match v {
        Value::Instance(_) => false,
        Value::List(l) => l.iter().all(is_literal),
        Value::Dict(d) => d.values().all(is_literal),
        _ => true,
    }
}

enum SetError {
    /// A message to wrap in "Could not set attribute …".
    Plain(String),
    Stop(Stop),
}

impl From<Stop> for SetError {
    fn from(s: Stop) -> SetError {
        SetError::Stop(s)
    }
}
