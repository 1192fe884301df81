//! Plugin calls from the evaluator's side: evaluate the arguments, let [`plugins`] bind and
//! call, and replay a finished call's result from the task's memo. A plugin sees the
//! evaluator only through [`plugins::Caller`], implemented here for one call site.

use std::rc::Rc;

use super::expr::Cx;
use super::state::{NONE, RvId, RvState, WaitMode};
use super::{Eval, Runtime, Stop, err};
use crate::compiler::ids::{BlockId, EntityId, ExprId, Sym};
use crate::compiler::ir::Call;
use crate::compiler::plugins::{self, Caller, Host};
use crate::compiler::program::Program;
use crate::compiler::source::Span;
use crate::compiler::types::ValueType;
use crate::compiler::value::pyfmt::InstanceText;
use crate::compiler::value::{InstId, Value};

impl Runtime<'_> {
    /// Evaluate the arguments, bind them to the signature, call.
    pub fn call_plugin(&mut self, cx: &mut Cx, call: &Call, site: ExprId) -> Eval<Value> {
        let builtin = plugins::all();
        let python = (call.plugin.0 as usize)
            .checked_sub(builtin.len())
            .map(|i| &self.p.python_plugins[i]);
        let span = self.p.ir.expr(site).span;
        let mut positional = Vec::with_capacity(call.args.len());
        for a in &call.args {
            positional.push(self.eval(cx, *a)?);
        }
        let mut kwargs: Vec<(Rc<str>, Value)> = Vec::with_capacity(call.kwargs.len());
        for (k, v) in &call.kwargs {
            kwargs.push((k.clone(), self.eval(cx, *v)?));
        }
        for s in &call.splats {
            match self.eval(cx, *s)? {
                Value::Dict(d) => kwargs.extend(d.iter().map(|(k, v)| (Rc::from(&**k), v.clone()))),
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
        if let Some(def) = python {
            if let Some(v) = self.memo_get(cx) {
                return Ok(v);
            }
            let result = plugins::python::call(
                def,
                &mut PluginCall { rt: self, cx, span },
                positional,
                kwargs,
                span,
            )?;
            self.memo_put(cx, result.clone());
            return Ok(result);
        }
        let def = &builtin[call.plugin.0 as usize];
        let bound = plugins::bind(
            def,
            &mut PluginCall { rt: self, cx, span },
            positional,
            kwargs,
            span,
        )?;
        let Some(mut args) = bound else {
            return Ok(Value::Unknown);
        };
        if let Some(v) = self.memo_get(cx) {
            return Ok(v);
        }
        let result = plugins::invoke(def, &mut PluginCall { rt: self, cx, span }, &mut args)?;
        self.memo_put(cx, result.clone());
        Ok(result)
    }
}

/// The evaluator at one plugin call: the call's task and scope, and its place in the model.
struct PluginCall<'a, 'p> {
    rt: &'a mut Runtime<'p>,
    cx: &'a Cx,
    span: Span,
}

// A block travels through plugin code as a `plugins::Wait`: the RV in the high bits, the wait
// mode in the low byte.
impl From<plugins::Stop> for Stop {
    fn from(s: plugins::Stop) -> Stop {
        match s {
            plugins::Stop::Err(d) => Stop::Err(d),
            plugins::Stop::Wait(w) => {
                let mode = match w.0 & 0xff {
                    0 => WaitMode::Complete,
                    1 => WaitMode::FirstValue,
                    _ => WaitMode::Gradual,
                };
                Stop::Block(RvId((w.0 >> 8) as u32), mode)
            }
        }
    }
}

impl From<Stop> for plugins::Stop {
    fn from(s: Stop) -> plugins::Stop {
        match s {
            Stop::Err(d) => plugins::Stop::Err(d),
            Stop::Block(rv, mode) => {
                let mode = match mode {
                    WaitMode::Complete => 0,
                    WaitMode::FirstValue => 1,
                    WaitMode::Gradual => 2,
                };
                plugins::Stop::Wait(plugins::Wait(((rv.0 as u64) << 8) | mode))
            }
        }
    }
}

impl Caller for PluginCall<'_, '_> {
    fn program(&self) -> &Program {
        self.rt.p
    }

    fn host(&mut self) -> &mut dyn Host {
        &mut *self.rt.host
    }

    fn names(&self) -> &dyn InstanceText {
        &*self.rt
    }

    fn instance_entity(&self, inst: InstId) -> EntityId {
        self.rt.inst_entity(inst)
    }

    fn validate(&mut self, value: &Value, ty: &ValueType) -> Result<(), String> {
        self.rt.validate(value, ty)
    }

    fn read_attr(&mut self, obj: &Value, sym: Sym, base_text: &str) -> plugins::Outcome<Value> {
        Ok(self.rt.read_attr(obj, sym, self.span, base_text)?)
    }

    fn read_attr_or_empty(
        &mut self,
        obj: &Value,
        sym: Sym,
        base_text: &str,
    ) -> plugins::Outcome<Option<Value>> {
        Ok(self.rt.read_attr_or_empty(obj, sym, self.span, base_text)?)
    }

    fn lookup(&mut self, name: &str) -> plugins::Outcome<Option<Value>> {
        Ok(self.rt.lookup_name(self.cx, name, self.span)?)
    }

    fn attributes_so_far(&self, inst: InstId) -> Vec<(String, Value)> {
        let rt = &*self.rt;
        let ent = rt.p.entity(rt.inst_entity(inst));
        let mut out = Vec::with_capacity(ent.slots.len());
        for (slot, aid) in ent.slots.iter().enumerate() {
            let rv = rt.attr_rv(inst, slot as u16);
            rt.rvs[rv.0 as usize].mark(super::state::READ);
            let value = match &rt.rvs[rv.0 as usize].state {
                RvState::Set(v) => v.clone(),
                RvState::FrozenNull => Value::Null,
                RvState::Unset if rt.is_delayed(rv) && !rt.dl(rv).items.is_empty() => Value::list(
                    rt.dl(rv)
                        .items
                        .iter()
                        .map(|i| Value::Instance(*i))
                        .collect(),
                ),
                RvState::Unset => continue,
            };
            out.push((rt.p.attr(*aid).name.clone(), value));
        }
        out
    }

    fn frozen_attributes(&self, inst: InstId) -> Vec<(String, Value)> {
        let rt = &*self.rt;
        let ent = rt.p.entity(rt.inst_entity(inst));
        let mut out = Vec::with_capacity(ent.slots.len());
        for (slot, aid) in ent.slots.iter().enumerate() {
            // an empty optional relation is asked for: reading it raises in Python
            if rt.is_empty_relation(inst, slot as u16) {
                continue;
            }
            if let Some(v) = rt.frozen_attr(inst, slot as u16) {
                out.push((rt.p.attr(*aid).name.clone(), v));
            }
        }
        out
    }

    fn instance_count(&self) -> usize {
        self.rt.instances.len()
    }
}

impl Runtime<'_> {
    /// `obj.attr`, but `None` for an optional relation left empty (instead of an error).
    fn read_attr_or_empty(
        &self,
        obj: &Value,
        sym: Sym,
        span: Span,
        base_text: &str,
    ) -> Eval<Option<Value>> {
        match self.attr_rv_of(obj, sym, span, base_text)? {
            Some(rv) => match &self.rvs[rv.0 as usize].state {
                RvState::FrozenNull => Ok(None),
                _ => self.read_rv(rv, span).map(Some),
            },
            None => Ok(Some(Value::Unknown)),
        }
    }

    /// Resolve `name` as the model would at a call in `cx`: block variables, the instance's
    /// attributes, then the top-level variables of the calling file's namespace (`ns::name`
    /// names another namespace's).
    fn lookup_name(&self, cx: &Cx, name: &str, span: Span) -> Eval<Option<Value>> {
        if let Some((ns, var)) = name.split_once("::") {
            let Some(nsd) = self.p.namespaces.iter().position(|n| n.name == ns) else {
                return Ok(None);
            };
            let Some(&slot) = self.p.namespaces[nsd].top_vars.get(var) else {
                return Ok(None);
            };
            let scope = self.ns_scopes[nsd];
            let rv = RvId(self.scopes[scope.0 as usize].rv_base + slot as u32);
            return self.read_rv(rv, span).map(Some);
        }
        let mut s = cx.scope.0;
        while s != NONE {
            let sc = &self.scopes[s as usize];
            if sc.block != NONE {
                let block = self.p.ir.block(BlockId(sc.block));
                if let Some(i) = block.names.iter().position(|n| &**n == name) {
                    let rv = RvId(sc.rv_base + i as u32);
                    return self.read_rv(rv, span).map(Some);
                }
            }
            s = sc.parent;
        }
        if let Some(inst) = self.scope_inst(cx.scope) {
            if name == "self" {
                return Ok(Some(Value::Instance(inst)));
            }
            if let Some(sym) = self.p.syms.get(name) {
                let e = self.inst_entity(inst);
                if self.p.entity(e).slot(sym).is_some() {
                    // an optional relation left empty is missing, as std's template resolver
                    // makes it (its `OptionalValueException` becomes Jinja's `missing`)
                    return self.read_attr_or_empty(&Value::Instance(inst), sym, span, "value");
                }
            }
        }
        let file = span.file;
        if let Some(nsi) = self.p.namespaces.iter().position(|n| n.file == Some(file))
            && let Some(&slot) = self.p.namespaces[nsi].top_vars.get(name)
        {
            let scope = self.ns_scopes[nsi];
            let rv = RvId(self.scopes[scope.0 as usize].rv_base + slot as u32);
            return self.read_rv(rv, span).map(Some);
        }
        Ok(None)
    }
}
