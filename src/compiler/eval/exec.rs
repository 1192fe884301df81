//! Tasks: statements, constructor attribute assignments, implement rules, eager promises.

use super::expr::Cx;
use super::state::*;
use super::{Eval, Runtime, Stop, err};
use crate::compiler::diagnostics::Diagnostic;
use crate::compiler::ids::*;
use crate::compiler::ir::*;
use crate::compiler::types::AttrKind;
use crate::compiler::value::{InstId, Value};

impl Runtime<'_> {
    /// Run a task until it completes or blocks. Errors abort the compile.
    pub fn run_task(&mut self, t: TaskId) -> Result<(), Diagnostic> {
        let task = &self.tasks[t.0 as usize];
        if task.done {
            return Ok(());
        }
        let kind = task.kind.clone();
        let scope = task.scope;
        let mut cx = Cx::new(t, scope);
        if let Some(env) = task.extra.as_ref().and_then(|e| e.env.as_ref()) {
            cx.env = env.to_vec();
        }
        let r = match kind {
            TaskKind::Stmt(s) => self.exec_stmt(&mut cx, s),
            TaskKind::CtorAttr {
                inst,
                slot,
                value,
                site,
            } => self.exec_ctor_attr(&mut cx, inst, slot, value, site),
            TaskKind::CtorDefault { inst, slot, site } => {
                let e = self.inst_entity(inst);
                let v = self.p.entity(e).defaults[slot as usize]
                    .clone()
                    .unwrap_or(Value::Null);
                self.set_attr(inst, slot, v, site, true)
            }
            TaskKind::Rule { inst, rule } => self.exec_rule(&mut cx, inst, rule),
            TaskKind::Promise {
                owner,
                instance,
                sym,
            } => self.exec_promise(&mut cx, owner, instance, sym),
            TaskKind::CompElem {
                target,
                comp,
                element,
                site,
            } => self.exec_comp_elem(&mut cx, target, comp, element, site),
        };
        match r {
            Ok(()) => {
                self.finish_task(t);
                Ok(())
            }
            Err(Stop::Block(rv, mode)) => {
                self.wait(t, rv, mode);
                Ok(())
            }
            Err(Stop::Err(d)) => Err(*d),
        }
    }

    fn exec_stmt(&mut self, cx: &mut Cx, s: StmtId) -> Eval<()> {
        let p = self.p;
        match p.ir.stmt(s) {
            Stmt::AssignVar { slot, value, span } => {
                let v = self.eval(cx, *value)?;
                let rv = RvId(self.scopes[cx.scope.0 as usize].rv_base + *slot as u32);
                self.set_var(rv, v, *value, *span)
            }
            Stmt::AssignAttr {
                target,
                sym,
                value,
                extend,
                span,
            } => {
                let (inst, slot, rv) = match self.tasks[cx.task.0 as usize]
                    .extra
                    .as_ref()
                    .and_then(|e| e.target)
                {
                    Some(rv) => {
                        let r = &self.rvs[rv.0 as usize];
                        (InstId(r.owner), r.slot, rv)
                    }
                    None => {
                        let tv = self.eval(cx, *target)?;
                        let inst = match tv {
                            Value::Instance(i) => i,
                            Value::Unknown => return Ok(()),
                            other => {
                                let text =
                                    self.sources.snippet(p.ir.expr(*target).span).to_string();
                                return Err(err(
                                    "not-entity",
                                    format!(
                                        "The object at {} is not an Entity but a <class '{}'> with value {}",
                                        text,
                                        other.py_type_name(),
                                        self.value_str(&other)
                                    ),
                                    *span,
                                ));
                            }
                        };
                        let e = self.inst_entity(inst);
                        let Some(slot) = p.entity(e).slot(*sym) else {
                            return Err(err(
                                "unknown-attribute",
                                format!(
                                    "could not find attribute with name: {} in type {}",
                                    p.syms.name(*sym),
                                    p.entity(e).full_name
                                ),
                                *span,
                            ));
                        };
                        let attr = p.slot_attr(e, slot);
                        if *extend && !attr.is_multi() {
                            return Err(err(
                                "plus-assign",
                                "Can not use += on relations with multiplicity 1",
                                *span,
                            ));
                        }
                        let rv = self.attr_rv(inst, slot);
                        self.tasks[cx.task.0 as usize].extra().target = Some(rv);
                        self.hold(cx.task, rv);
                        (inst, slot, rv)
                    }
                };
                // values are located at the assignment
                let site = *value;
                if self.rvs[rv.0 as usize].kind == RvKind::List {
                    cx.lhs = Some((inst, *sym));
                    self.assign_into(cx, rv, *value, site)
                } else {
                    cx.lhs = Some((inst, *sym));
                    let v = self.eval(cx, *value)?;
                    self.set_attr(inst, slot, v, site, true)
                }
            }
            Stmt::Eval(e) => self.eval(cx, *e).map(|_| ()),
            Stmt::If {
                cond,
                then_block,
                else_block,
                span,
                ..
            } => {
                let c = self.eval(cx, *cond)?;
                let branch = match c {
                    Value::Bool(true) => Some(*then_block),
                    Value::Bool(false) => *else_block,
                    Value::Unknown => None,
                    other => {
                        return Err(err(
                            "not-bool",
                            format!(
                                "Invalid value `{}`: the condition for an if statement can only be a boolean expression",
                                self.value_str(&other)
                            ),
                            *span,
                        ));
                    }
                };
                if let Some(b) = branch {
                    let scope = self.new_scope(Some(cx.scope), Some(b), None);
                    self.emit_block(b, scope);
                }
                Ok(())
            }
            Stmt::For {
                iterable,
                body,
                span,
                ..
            } => self.exec_for(cx, *iterable, *body, *span),
        }
    }

    fn exec_for(
        &mut self,
        cx: &mut Cx,
        iterable: ExprId,
        body: BlockId,
        span: crate::compiler::source::Span,
    ) -> Eval<()> {
        let p = self.p;
        let ie = p.ir.expr(iterable);
        // iterating a relation is gradual: the body runs for each element as it arrives
        if matches!(ie.kind, ExprKind::Var(_) | ExprKind::Attr { .. })
            && let Some(rv) = self.ref_rv(cx, iterable)?
            && self.rvs[rv.0 as usize].kind == RvKind::List
        {
            if self.memo_marker(cx) {
                return if self.is_frozen(rv) {
                    Ok(())
                } else {
                    Err(Stop::Block(rv, WaitMode::Gradual))
                };
            }
            if !self.is_frozen(rv) {
                self.memo_put_marker(cx);
                let listener = Listener::ForBody {
                    body,
                    scope: cx.scope,
                };
                let existing = self.dl(rv).items.clone();
                self.dl_mut(rv).add_listener(listener);
                for i in existing {
                    self.emit_for_body(body, cx.scope, Value::Instance(i));
                }
                return Err(Stop::Block(rv, WaitMode::Gradual));
            }
        }
        let v = self.eval(cx, iterable)?;
        match v {
            Value::List(items) => {
                for i in items.iter() {
                    if !i.is_unknown() {
                        self.emit_for_body(body, cx.scope, i.clone());
                    }
                }
                Ok(())
            }
            Value::Unknown => Ok(()),
            other => {
                let hint = match &ie.kind {
                    ExprKind::Var(_) | ExprKind::Attr { .. } => format!(
                        "Hint: '{}' resolves to '{}'.",
                        self.sources.snippet(ie.span),
                        self.value_str(&other)
                    ),
                    _ => format!("Hint: '{}' is not a list.", self.value_str(&other)),
                };
                Err(err(
                    "for",
                    format!("A for loop can only be applied to lists and relations. {hint}"),
                    span,
                ))
            }
        }
    }

    pub fn emit_for_body(&mut self, body: BlockId, parent: ScopeId, item: Value) {
        let scope = self.new_scope(Some(parent), Some(body), None);
        let rv = RvId(self.scopes[scope.0 as usize].rv_base);
        self.rvs[rv.0 as usize].state = RvState::Set(item);
        self.emit_block(body, scope);
    }

    /// Spawn the eager-promise acquirers of an `if`/`for` statement task.
    pub fn spawn_promises(&mut self, owner: TaskId, s: StmtId, scope: ScopeId) {
        let p = self.p;
        let promises = match p.ir.stmt(s) {
            Stmt::If { promises, .. } | Stmt::For { promises, .. } => promises,
            _ => return,
        };
        for pr in promises {
            let a = self.spawn(
                TaskKind::Promise {
                    owner,
                    instance: pr.instance,
                    sym: pr.sym,
                },
                scope,
                None,
            );
            self.tasks[owner.0 as usize].extra().acquirers.push(a);
        }
    }

    fn exec_promise(&mut self, cx: &mut Cx, owner: TaskId, instance: ExprId, sym: Sym) -> Eval<()> {
        if owner.0 == NONE {
            return Ok(());
        }
        let v = match self.eval(cx, instance) {
            Ok(v) => v,
            // the assignment itself will report the problem
            Err(Stop::Err(_)) => return Ok(()),
            Err(b) => return Err(b),
        };
        let Value::Instance(inst) = v else {
            return Ok(());
        };
        let e = self.inst_entity(inst);
        if let Some(slot) = self.p.entity(e).slot(sym) {
            let rv = self.attr_rv(inst, slot);
            // the owner may have finished while this acquirer waited
            if let TaskKind::Promise { owner: o, .. } = self.tasks[cx.task.0 as usize].kind
                && o.0 != NONE
                && !self.tasks[o.0 as usize].done
            {
                self.hold(o, rv);
            }
        }
        Ok(())
    }

    fn exec_ctor_attr(
        &mut self,
        cx: &mut Cx,
        inst: InstId,
        slot: u16,
        value: ExprId,
        site: ExprId,
    ) -> Eval<()> {
        let sym = {
            let e = self.inst_entity(inst);
            self.p.slot_attr(e, slot).sym
        };
        cx.lhs = Some((inst, sym));
        let rv = self.attr_rv(inst, slot);

        if self.rvs[rv.0 as usize].kind == RvKind::List {
            self.assign_into(cx, rv, value, site)
        } else {
            let v = self.eval(cx, value)?;
            self.set_attr(inst, slot, v, site, true)
        }
    }

    fn exec_comp_elem(
        &mut self,
        cx: &mut Cx,
        target: RvId,
        comp: ExprId,
        element: Value,
        site: ExprId,
    ) -> Eval<()> {
        let p = self.p;
        let ExprKind::Comprehension {
            value,
            env_slot,
            guard,
            ..
        } = &p.ir.expr(comp).kind
        else {
            unreachable!("comprehension element task")
        };
        cx.env.truncate(*env_slot as usize);
        cx.env.push(element);
        if let Some(g) = guard {
            let span = p.ir.expr(*g).span;
            match self.eval(cx, *g)? {
                Value::Bool(true) => {}
                Value::Bool(false) | Value::Unknown => return Ok(()),
                other => {
                    return Err(err(
                        "not-bool",
                        format!(
                            "Invalid value `{}`: the condition for a conditional expression must be a boolean expression",
                            self.value_str(&other)
                        ),
                        span,
                    ));
                }
            }
        }
        let r = &self.rvs[target.0 as usize];
        cx.lhs = Some((InstId(r.owner), {
            let e = self.inst_entity(InstId(r.owner));
            self.p.slot_attr(e, r.slot).sym
        }));
        self.assign_into(cx, target, *value, site)
    }

    fn exec_rule(&mut self, cx: &mut Cx, inst: InstId, rule: RuleId) -> Eval<()> {
        let p = self.p;
        let r = &p.rules[rule.0 as usize];
        let ok = match r.condition {
            None => true,
            Some(c) => match self.eval(cx, c)? {
                Value::Bool(b) => b,
                // the reference tests the condition's truth: an unknown selects
                Value::Unknown => true,
                other => {
                    return Err(err(
                        "not-bool",
                        format!(
                            "Invalid value `{}`: the condition for a conditional implementation can only be a boolean expression",
                            self.value_str(&other)
                        ),
                        p.ir.expr(c).span,
                    ));
                }
            },
        };
        if !ok {
            return Ok(());
        }
        let entity = self.inst_entity(inst);
        for &im in &r.implementations {
            if self.needs_impl_dedup[entity.0 as usize]
                && !self.applied_impls.insert((inst.0, im.0))
            {
                continue;
            }
            self.instances[inst.0 as usize].impl_count += 1;
            let body = p.implementations[im.0 as usize].body;
            let scope = self.new_scope(None, Some(body), Some(inst));
            self.emit_block(body, scope);
        }
        Ok(())
    }

    /// Evaluate a constructor call (LANGUAGE.md §7.1, §10, §12.2).
    pub fn construct(&mut self, cx: &mut Cx, c: &Construct, site: ExprId) -> Eval<Value> {
        let p = self.p;
        let span = p.ir.expr(site).span;
        let entity = c.entity;
        let ent = p.entity(entity);
        // values that must be known before the instance exists
        let mut direct: Vec<(u16, Value)> = Vec::new();
        for a in c.args.iter().filter(|a| a.direct) {
            let v = self.eval(cx, a.value)?;
            direct.push((a.slot, v));
        }
        let mut late: Vec<(u16, Value)> = Vec::new();
        for s in &c.splats {
            match self.eval(cx, *s)? {
                Value::Dict(d) => {
                    for (k, v) in d.iter() {
                        let slot = p.syms.get(k).and_then(|sym| ent.slot(sym));
                        let Some(slot) = slot else {
                            return Err(err(
                                "unknown-attribute",
                                format!("no attribute {k} on type {}", ent.full_name),
                                span,
                            ));
                        };
                        if c.args.iter().any(|a| a.slot == slot)
                            || late.iter().any(|(s, _)| *s == slot)
                        {
                            return Err(err(
                                "duplicate-keyword",
                                format!(
                                    "The attribute {k} is set twice in the constructor call of {}.",
                                    ent.name
                                ),
                                span,
                            ));
                        }
                        late.push((slot, v.clone()));
                    }
                }
                Value::Unknown => return Ok(Value::Unknown),
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
        if !c.missing_index_slots.is_empty() {
            // the reverse end of the relation this constructor is assigned to
            if let Some((lhs_inst, lhs_sym)) = cx.lhs {
                let le = self.inst_entity(lhs_inst);
                if let Some(ls) = p.entity(le).slot(lhs_sym)
                    && let AttrKind::Relation {
                        reverse: Some(rev), ..
                    } = &p.slot_attr(le, ls).kind
                {
                    let rev = p.attr(*rev);
                    if let Some(slot) = ent.slot(rev.sym)
                        && c.missing_index_slots.contains(&slot)
                        && !late.iter().any(|(s, _)| *s == slot)
                        && p.is_subtype(entity, rev.owner)
                    {
                        late.push((slot, Value::Instance(lhs_inst)));
                    }
                }
            }
            let missing: Vec<u16> = c
                .missing_index_slots
                .iter()
                .copied()
                .filter(|s| !late.iter().any(|(l, _)| l == s))
                .collect();
            if !missing.is_empty() {
                let bullets: Vec<String> = missing
                    .iter()
                    .map(|s| {
                        let a = p.slot_attr(entity, *s);
                        format!(
                            "* Missing attribute '{}'. The attribute {}.{} is part of an index.",
                            a.name, ent.full_name, a.name
                        )
                    })
                    .collect();
                return Err(err(
                    "index-attribute",
                    format!("Invalid Constructor call:\n{}", bullets.join("\n")),
                    span,
                ));
            }
        }
        if let Some(v) = self.memo_get(cx) {
            return Ok(v);
        }
        if direct
            .iter()
            .chain(late.iter())
            .any(|(_, v)| v.is_unknown())
            && !ent.indexes.is_empty()
        {
            // identity unknown: the instance can not exist in this compile
            self.memo_put(cx, Value::Unknown);
            return Ok(Value::Unknown);
        }
        // index attributes with defaults
        for (slot, is_index) in ent.index_slot.iter().enumerate() {
            let slot = slot as u16;
            if *is_index
                && !direct.iter().any(|(s, _)| *s == slot)
                && !late.iter().any(|(s, _)| *s == slot)
                && let Some(d) = &ent.defaults[slot as usize]
            {
                direct.push((slot, d.clone()));
            }
        }
        let given: Vec<(u16, Value)> = direct.iter().chain(late.iter()).cloned().collect();
        let found = self.find_in_indexes(entity, &given);
        let (inst, created) = if let Some(&first) = found.first() {
            for f in &found {
                if self.inst_entity(*f) != entity {
                    return Err(err(
                        "index",
                        format!(
                            "Type found in index is not an exact match: {} (found {})",
                            ent.full_name,
                            self.inst_site_text(*f)
                        ),
                        span,
                    ));
                }
                if *f != first {
                    return Err(err("index", "Inconsistent indexes detected!", span));
                }
            }
            self.instances[first.0 as usize].extra_sites.push(site);
            for (slot, v) in &given {
                self.set_attr(first, *slot, v.clone(), site, true)?;
            }
            (first, false)
        } else {
            if self.instances.len() >= super::MAX_INSTANCES {
                return Err(err(
                    "too-large",
                    format!(
                        "the model creates more than {} instances: is an implementation constructing instances without end?",
                        super::MAX_INSTANCES
                    ),
                    span,
                ));
            }
            let inst = self.new_instance(entity, site);
            for (slot, v) in &given {
                self.set_attr(inst, *slot, v.clone(), site, true)?;
            }
            self.register_in_indexes(inst, &given, span)?;
            (inst, true)
        };
        // deferred attribute values: explicit arguments, then defaults
        let env: Option<std::rc::Rc<[Value]>> = if cx.env.is_empty() {
            None
        } else {
            Some(cx.env.clone().into())
        };
        for a in c.args.iter().filter(|a| !a.direct) {
            if late.iter().any(|(s, _)| *s == a.slot) {
                continue;
            }
            let extra = env.as_ref().map(|e| {
                Box::new(TaskExtra {
                    env: Some(e.clone()),
                    ..Default::default()
                })
            });
            let t = self.spawn(
                TaskKind::CtorAttr {
                    inst,
                    slot: a.slot,
                    value: a.value,
                    site,
                },
                cx.scope,
                extra,
            );
            let rv = self.attr_rv(inst, a.slot);
            self.hold(t, rv);
        }
        for (slot, d) in ent.defaults.iter().enumerate() {
            let slot = slot as u16;
            if d.is_none()
                || ent.index_slot[slot as usize]
                || c.args.iter().any(|a| a.slot == slot)
                || late.iter().any(|(s, _)| *s == slot)
            {
                continue;
            }
            self.spawn(TaskKind::CtorDefault { inst, slot, site }, cx.scope, None);
        }
        if created {
            self.emit_rules(inst);
        }
        let v = Value::Instance(inst);
        self.memo_put(cx, v.clone());
        Ok(v)
    }

    fn emit_rules(&mut self, inst: InstId) {
        let p = self.p;
        let entity = self.inst_entity(inst);
        let rules = &p.entity(entity).effective_rules;
        if rules.is_empty() {
            return;
        }
        let needs_scope = rules
            .iter()
            .any(|r| p.rules[r.0 as usize].condition.is_some());
        let scope = if needs_scope {
            self.new_scope(None, None, Some(inst))
        } else {
            ScopeId(0)
        };
        for &r in rules {
            self.spawn(TaskKind::Rule { inst, rule: r }, scope, None);
        }
    }

    /// Tasks still blocked at the end: "not all statements executed".
    pub fn unexecuted(&self) -> Option<Diagnostic> {
        if self.blocked_tasks == 0 {
            return None;
        }
        for t in &self.tasks {
            if t.done || t.blocked_on == NONE {
                continue;
            }
            let span = match &t.kind {
                TaskKind::Stmt(s) => stmt_span(self, *s),
                TaskKind::CtorAttr { site, .. } | TaskKind::CtorDefault { site, .. } => {
                    self.p.ir.expr(*site).span
                }
                TaskKind::Rule { rule, .. } => self.p.rules[rule.0 as usize].span,
                TaskKind::CompElem { site, .. } => self.p.ir.expr(*site).span,
                TaskKind::Promise { .. } => continue,
            };
            return Some(
                Diagnostic::error(
                    "not-executed",
                    "not all statements executed: a statement waits for a value that never came",
                )
                .at(span),
            );
        }
        None
    }
}

fn stmt_span(rt: &Runtime, s: StmtId) -> crate::compiler::source::Span {
    match rt.p.ir.stmt(s) {
        Stmt::AssignVar { span, .. }
        | Stmt::AssignAttr { span, .. }
        | Stmt::If { span, .. }
        | Stmt::For { span, .. } => *span,
        Stmt::Eval(e) => rt.p.ir.expr(*e).span,
    }
}
