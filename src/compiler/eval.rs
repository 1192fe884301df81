//! The dataflow evaluator (LANGUAGE.md §12).
//!
//! Statements run as *tasks*. A task evaluates its expression; when it needs a value that does
//! not exist yet it *blocks* on that result variable and re-runs from the start when woken,
//! replaying the results of its side effects (constructors, plugin calls) from a memo so that
//! nothing happens twice. Relations that may still grow are only *frozen* when nothing else
//! can run, following the reference scheduler: candidates in queue order, skipping those that
//! nobody waits for (parked) or that still have providers; then parked ones that gained
//! waiters; then wait-cycle breaking; finally everything parked. The result of a correct model
//! does not depend on task order.

pub mod attrs;
pub mod calls;
pub mod exec;
pub mod expr;
pub mod finalize;
pub mod format;
pub mod ops;
pub mod state;

use std::collections::{HashSet, VecDeque};

use foldhash::HashMap;

use super::diagnostics::Diagnostic;
use super::ids::{BlockId, EntityId, ExprId};
use super::plugins::Host;
use super::program::Program;
use super::source::{SourceMap, Span};
use super::types::Storage;
use super::value::pyfmt;
use super::value::{InstId, Value};
use crate::alloc::{Ahead, reserved};
use state::*;

/// Why evaluation stopped early.
pub enum Stop {
    /// A value is missing: wait for this RV, then run the task again.
    Block(RvId, WaitMode),
    /// A compile error: the compile aborts.
    Err(Box<Diagnostic>),
}

impl From<Diagnostic> for Stop {
    fn from(d: Diagnostic) -> Stop {
        Stop::Err(Box::new(d))
    }
}

pub type Eval<T> = Result<T, Stop>;

/// Stop with a compile error at `span`.
pub fn err(code: &'static str, msg: impl Into<String>, span: Span) -> Stop {
    Stop::Err(Box::new(Diagnostic::error(code, msg).at(span)))
}

/// A runaway model (an implementation constructing instances without end) stops here.
pub const MAX_INSTANCES: usize = 5_000_000;

/// A part of an index key: values compare by their textual representation (LANGUAGE.md §10).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyPart {
    Null,
    Bool(bool),
    Int(i64),
    Big(String),
    Float(u64),
    Str(super::value::Text),
    Inst(InstId),
    Other(String),
}

pub type IndexKey = Vec<KeyPart>;

/// The finished model: instances and their attribute values, for export.
pub struct Model<'p> {
    pub rt: Runtime<'p>,
}

pub struct Runtime<'p> {
    pub p: &'p Program,
    pub sources: &'p SourceMap,
    pub host: &'p mut dyn Host,
    pub rvs: Vec<Rv>,
    pub delayed: Vec<Delayed>,
    waiter_lists: Vec<Vec<Waiter>>,
    free_waiter_lists: Vec<u32>,
    pub instances: Vec<Instance>,
    pub scopes: Vec<Scope>,
    pub tasks: Vec<Task>,
    free_tasks: Vec<u32>,
    pub runnable: VecDeque<TaskId>,
    candidates: VecDeque<RvId>,
    parked: Vec<RvId>,
    pub ns_scopes: Vec<ScopeId>,
    /// Per entity, per index of that entity: key -> instance.
    pub index_maps: Vec<Vec<HashMap<IndexKey, InstId>>>,
    /// Lookups waiting for a key: (entity, index position, key) -> pseudo RV.
    pub pending_lookups: HashMap<(EntityId, usize, IndexKey), (RvId, ExprIdSpan)>,
    pub applied_impls: foldhash::HashSet<(u32, u32)>,
    /// Entities whose effective rules list an implementation twice.
    pub needs_impl_dedup: Vec<bool>,
    /// Number of tasks currently blocked (cheap check at the end).
    pub blocked_tasks: usize,
    /// The populated fronts of the arenas that grow all through a compile.
    ahead: Fronts,
}

/// See [`crate::alloc::populate_ahead_for_this_process`].
#[derive(Default)]
struct Fronts {
    rvs: Ahead,
    delayed: Ahead,
    instances: Ahead,
    tasks: Ahead,
    scopes: Ahead,
}

/// The site of a waiting lookup (for "No match in index" messages).
pub type ExprIdSpan = Span;

impl<'p> Runtime<'p> {
    pub fn new(p: &'p Program, sources: &'p SourceMap, host: &'p mut dyn Host) -> Runtime<'p> {
        let index_maps = p
            .entities
            .iter()
            .map(|e| e.indexes.iter().map(|_| HashMap::default()).collect())
            .collect();
        let needs_impl_dedup = p
            .entities
            .iter()
            .map(|e| {
                let mut seen = HashSet::new();
                e.effective_rules
                    .iter()
                    .flat_map(|r| p.rules[r.0 as usize].implementations.iter())
                    .any(|i| !seen.insert(*i))
            })
            .collect();
        let mut delayed = reserved();
        delayed.push(Delayed::default());
        let mut waiter_lists = reserved();
        waiter_lists.push(Vec::new());
        Runtime {
            p,
            sources,
            host,
            rvs: reserved(),
            delayed,
            waiter_lists,
            free_waiter_lists: Vec::new(),
            instances: reserved(),
            scopes: reserved(),
            tasks: reserved(),
            free_tasks: Vec::new(),
            runnable: reserved().into(),
            candidates: VecDeque::new(),
            parked: Vec::new(),
            ns_scopes: Vec::new(),
            index_maps,
            pending_lookups: HashMap::default(),
            applied_impls: foldhash::HashSet::default(),
            needs_impl_dedup,
            blocked_tasks: 0,
            ahead: Fronts::default(),
        }
    }

    // ------------------------------------------------------------------ arenas

    pub fn new_var_rvs(&mut self, n: usize) -> u32 {
        let base = self.rvs.len() as u32;
        for _ in 0..n {
            self.rvs.push(Rv {
                state: RvState::Unset,
                waiters: 0,
                ext: 0,
                owner: NONE,
                slot: 0,
                kind: RvKind::Var,
                set_by: NONE,
                marks: Default::default(),
            });
        }
        self.ahead.rvs.after_push(&self.rvs);
        base
    }

    pub fn new_scope(
        &mut self,
        parent: Option<ScopeId>,
        block: Option<BlockId>,
        inst: Option<InstId>,
    ) -> ScopeId {
        let nvars = block.map(|b| self.p.ir.block(b).names.len()).unwrap_or(0);
        let rv_base = if nvars > 0 {
            self.new_var_rvs(nvars)
        } else {
            0
        };
        let inst = inst
            .map(|i| i.0)
            .or_else(|| parent.map(|p| self.scopes[p.0 as usize].inst))
            .unwrap_or(NONE);
        self.scopes.push(Scope {
            parent: parent.map(|p| p.0).unwrap_or(NONE),
            block: block.map(|b| b.0).unwrap_or(NONE),
            rv_base,
            inst,
        });
        self.ahead.scopes.after_push(&self.scopes);
        ScopeId(self.scopes.len() as u32 - 1)
    }

    /// Allocate the attribute RVs of a new instance.
    pub fn new_instance(&mut self, entity: EntityId, site: ExprId) -> InstId {
        let id = InstId(self.instances.len() as u32);
        let ent = self.p.entity(entity);
        let base = self.rvs.len() as u32;
        for (slot, &aid) in ent.slots.iter().enumerate() {
            let attr = self.p.attr(aid);
            let (kind, ext) = match attr.storage() {
                Storage::Single => (RvKind::Single, 0),
                Storage::Optional => (RvKind::Optional, self.new_delayed(0, Some(1))),
                Storage::List => {
                    let (low, high) = match &attr.kind {
                        super::types::AttrKind::Relation { low, high, .. } => (*low, *high),
                        _ => (0, None),
                    };
                    (RvKind::List, self.new_delayed(low, high))
                }
            };
            self.rvs.push(Rv {
                state: RvState::Unset,
                waiters: 0,
                ext,
                owner: id.0,
                slot: slot as u16,
                kind,
                set_by: NONE,
                marks: Default::default(),
            });
        }
        self.ahead.rvs.after_push(&self.rvs);
        self.instances.push(Instance {
            entity,
            rv_base: base,
            site,
            impl_count: 0,
            extra_sites: Vec::new(),
        });
        self.ahead.instances.after_push(&self.instances);
        self.ahead.delayed.after_push(&self.delayed);
        // optional and list relations may already be complete: they are freeze candidates
        for slot in 0..ent.slots.len() {
            let rv = RvId(base + slot as u32);
            if self.rvs[rv.0 as usize].ext != 0 && self.can_get(rv) {
                self.queue_candidate(rv);
            }
        }
        id
    }

    fn new_delayed(&mut self, low: u32, high: Option<u32>) -> u32 {
        self.delayed.push(Delayed {
            low,
            high,
            ..Default::default()
        });
        self.delayed.len() as u32 - 1
    }

    pub fn attr_rv(&self, inst: InstId, slot: u16) -> RvId {
        RvId(self.instances[inst.0 as usize].rv_base + slot as u32)
    }

    pub fn inst_entity(&self, inst: InstId) -> EntityId {
        self.instances[inst.0 as usize].entity
    }

    pub fn dl(&self, rv: RvId) -> &Delayed {
        &self.delayed[self.rvs[rv.0 as usize].ext as usize]
    }

    pub fn dl_mut(&mut self, rv: RvId) -> &mut Delayed {
        let ext = self.rvs[rv.0 as usize].ext as usize;
        &mut self.delayed[ext]
    }

    pub fn is_delayed(&self, rv: RvId) -> bool {
        self.rvs[rv.0 as usize].ext != 0
    }

    // ------------------------------------------------------------------ tasks

    pub fn spawn(
        &mut self,
        kind: TaskKind,
        scope: ScopeId,
        extra: Option<Box<TaskExtra>>,
    ) -> TaskId {
        let task = Task {
            kind,
            scope,
            extra,
            done: false,
            blocked_on: NONE,
        };
        let id = if let Some(i) = self.free_tasks.pop() {
            self.tasks[i as usize] = task;
            TaskId(i)
        } else {
            self.tasks.push(task);
            self.ahead.tasks.after_push(&self.tasks);
            TaskId(self.tasks.len() as u32 - 1)
        };
        self.runnable.push_back(id);
        id
    }

    pub fn finish_task(&mut self, t: TaskId) {
        let extra = {
            let task = &mut self.tasks[t.0 as usize];
            task.done = true;
            task.extra.take()
        };
        if let Some(extra) = extra {
            for rv in extra.held {
                self.release(rv);
            }
            // acquirers that did not run yet have nothing left to promise
            for a in extra.acquirers {
                if let TaskKind::Promise { owner, .. } = &mut self.tasks[a.0 as usize].kind
                    && *owner == t
                {
                    *owner = TaskId(NONE);
                }
            }
        }
        // tasks still referenced by a waiter list are recycled once woken
        if self.tasks[t.0 as usize].blocked_on == NONE {
            self.free_tasks.push(t.0);
        }
    }

    /// Take a provider promise on `rv` for task `t` (released when the task finishes).
    pub fn hold(&mut self, t: TaskId, rv: RvId) {
        if !self.is_delayed(rv) || self.dl(rv).frozen {
            return;
        }
        self.dl_mut(rv).providers += 1;
        self.tasks[t.0 as usize].extra().held.push(rv);
    }

    pub fn release(&mut self, rv: RvId) {
        let d = self.dl_mut(rv);
        if d.frozen {
            return;
        }
        d.providers = d.providers.saturating_sub(1);
        if self.can_get(rv) {
            self.queue_candidate(rv);
        }
    }

    pub fn can_get(&self, rv: RvId) -> bool {
        let r = &self.rvs[rv.0 as usize];
        let d = &self.delayed[r.ext as usize];
        match r.kind {
            RvKind::List => d.items.len() as u32 >= d.low && d.providers == 0,
            _ => d.providers == 0,
        }
    }

    pub fn queue_candidate(&mut self, rv: RvId) {
        let d = self.dl_mut(rv);
        if d.queued || d.frozen {
            return;
        }
        d.queued = true;
        self.candidates.push_back(rv);
    }

    // ------------------------------------------------------------------ waiting

    pub fn wait(&mut self, t: TaskId, rv: RvId, mode: WaitMode) {
        let r = &self.rvs[rv.0 as usize];
        let list = if r.waiters == 0 {
            let idx = match self.free_waiter_lists.pop() {
                Some(i) => i,
                None => {
                    self.waiter_lists.push(Vec::new());
                    self.waiter_lists.len() as u32 - 1
                }
            };
            self.rvs[rv.0 as usize].waiters = idx;
            idx
        } else {
            r.waiters
        };
        self.waiter_lists[list as usize].push(Waiter { task: t, mode });
        if mode != WaitMode::Gradual && self.is_delayed(rv) {
            self.dl_mut(rv).potential += 1;
        }
        self.tasks[t.0 as usize].blocked_on = rv.0;
        self.blocked_tasks += 1;
    }

    /// Wake waiters: all of them, or (`first_only`) only those waiting for a first value.
    pub fn wake(&mut self, rv: RvId, first_only: bool) {
        let list = self.rvs[rv.0 as usize].waiters;
        if list == 0 {
            return;
        }
        let waiters = std::mem::take(&mut self.waiter_lists[list as usize]);
        let mut keep = Vec::new();
        let delayed = self.is_delayed(rv);
        for w in waiters {
            if first_only && w.mode != WaitMode::FirstValue {
                keep.push(w);
                continue;
            }
            if w.mode != WaitMode::Gradual && delayed {
                let d = self.dl_mut(rv);
                d.potential = d.potential.saturating_sub(1);
            }
            self.tasks[w.task.0 as usize].blocked_on = NONE;
            self.blocked_tasks -= 1;
            if self.tasks[w.task.0 as usize].done {
                self.free_tasks.push(w.task.0);
            } else {
                self.runnable.push_back(w.task);
            }
        }
        if keep.is_empty() {
            self.rvs[rv.0 as usize].waiters = 0;
            self.free_waiter_lists.push(list);
        } else {
            self.waiter_lists[list as usize] = keep;
        }
    }

    pub fn waiters_of(&self, rv: RvId) -> &[Waiter] {
        &self.waiter_lists[self.rvs[rv.0 as usize].waiters as usize]
    }

    /// Freeze an optional or list RV: its value is final.
    pub fn freeze(&mut self, rv: RvId) {
        let r = &self.rvs[rv.0 as usize];
        let kind = r.kind;
        let d = &mut self.delayed[r.ext as usize];
        if d.frozen {
            return;
        }
        d.frozen = true;
        d.listeners = None;
        match kind {
            RvKind::List => {
                let value = if d.items.is_empty() {
                    Value::empty_list()
                } else {
                    Value::list(d.items.iter().map(|i| Value::Instance(*i)).collect())
                };
                self.rvs[rv.0 as usize].state = RvState::Set(value);
            }
            _ => {
                if matches!(self.rvs[rv.0 as usize].state, RvState::Unset) {
                    self.rvs[rv.0 as usize].state = RvState::FrozenNull;
                }
            }
        }
        self.wake(rv, false);
    }

    /// The value of an attribute when it is final (frozen), without waiting.
    pub fn frozen_attr(&self, inst: InstId, slot: u16) -> Option<Value> {
        let rv = self.attr_rv(inst, slot);
        let r = &self.rvs[rv.0 as usize];
        r.mark(state::READ);
        let frozen = match r.kind {
            RvKind::Var | RvKind::Single => true,
            RvKind::Optional | RvKind::List => self.dl(rv).frozen,
        };
        if !frozen {
            return None;
        }
        match &r.state {
            RvState::Set(v) => Some(v.clone()),
            RvState::FrozenNull => Some(Value::Null),
            RvState::Unset => None,
        }
    }

    /// Is the attribute an optional relation frozen without a value (or assigned null)?
    pub fn is_empty_relation(&self, inst: InstId, slot: u16) -> bool {
        let rv = self.attr_rv(inst, slot);
        self.rvs[rv.0 as usize].mark(state::READ);
        matches!(self.rvs[rv.0 as usize].state, RvState::FrozenNull)
    }

    pub fn is_frozen(&self, rv: RvId) -> bool {
        self.dl(rv).frozen
    }

    // ------------------------------------------------------------------ the loop

    /// Run all top-level statements and the scheduling loop to completion.
    pub fn run(&mut self) -> Result<(), Vec<Diagnostic>> {
        for &ns in &self.p.load_order {
            let block = self.p.ns(ns).top_block;
            let scope = self.new_scope(None, block, None);
            self.ns_scopes.push(scope);
        }
        for (i, &ns) in self.p.load_order.clone().iter().enumerate() {
            if let Some(block) = self.p.ns(ns).top_block {
                self.emit_block(block, self.ns_scopes[i]);
            }
        }
        loop {
            while let Some(t) = self.runnable.pop_front() {
                if let Err(d) = self.run_task(t) {
                    return Err(vec![d]);
                }
            }
            if !self.freeze_step() {
                break;
            }
        }
        let errors = self.final_checks();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// One freeze decision; false when nothing is left to do.
    fn freeze_step(&mut self) -> bool {
        // 2. candidates in queue order
        while let Some(rv) = self.candidates.pop_front() {
            if self.is_frozen(rv) || self.has_value(rv) {
                continue;
            }
            let d = self.dl(rv);
            if d.potential == 0 {
                if !d.parked {
                    self.dl_mut(rv).parked = true;
                    self.parked.push(rv);
                }
            } else if d.providers > 0 {
                self.dl_mut(rv).queued = false;
            } else {
                self.freeze(rv);
                return true;
            }
        }
        // 3. parked RVs that gained waiters
        let parked = std::mem::take(&mut self.parked);
        let mut retry = Vec::new();
        for rv in parked {
            if self.is_frozen(rv) || self.has_value(rv) {
                self.dl_mut(rv).parked = false;
                continue;
            }
            if self.dl(rv).potential > 0 {
                self.dl_mut(rv).parked = false;
                retry.push(rv);
            } else {
                self.parked.push(rv);
            }
        }
        let mut progress = false;
        for rv in retry {
            if progress {
                // keep the rest as candidates for the next round
                self.dl_mut(rv).queued = true;
                self.candidates.push_back(rv);
                continue;
            }
            if self.dl(rv).providers > 0 {
                self.dl_mut(rv).queued = false;
            } else {
                self.freeze(rv);
                progress = true;
            }
        }
        if progress {
            return true;
        }
        // 4. wait cycle: an RV blocked waiters need, that still has providers
        if self.break_wait_cycle() {
            return true;
        }
        // 5. nobody needs the parked ones: freeze them all
        if self.parked.is_empty() {
            return !self.runnable.is_empty();
        }
        while let Some(rv) = self.parked.pop() {
            self.dl_mut(rv).parked = false;
            self.freeze(rv);
        }
        true
    }

    fn has_value(&self, rv: RvId) -> bool {
        // an optional RV with a value is frozen when set; lists only by freezing
        matches!(
            self.rvs[rv.0 as usize].state,
            RvState::Set(_) | RvState::FrozenNull
        )
    }

    fn break_wait_cycle(&mut self) -> bool {
        if self.blocked_tasks == 0 {
            return false;
        }
        for i in 0..self.tasks.len() {
            let t = &self.tasks[i];
            if t.done || t.blocked_on == NONE {
                continue;
            }
            let rv = RvId(t.blocked_on);
            if !self.is_delayed(rv) || self.is_frozen(rv) || self.has_value(rv) {
                continue;
            }
            let d = self.dl(rv);
            if d.providers > 0 && d.potential > 0 {
                self.freeze(rv);
                return true;
            }
        }
        false
    }

    /// Emit every statement of a block as a task in `scope`.
    pub fn emit_block(&mut self, block: BlockId, scope: ScopeId) {
        let p = self.p;
        for &s in &p.ir.block(block).stmts {
            let t = self.spawn(TaskKind::Stmt(s), scope, None);
            self.spawn_promises(t, s, scope);
        }
    }

    // ------------------------------------------------------------------ text

    pub fn span_text(&self, span: Span) -> String {
        self.sources.short_location(span)
    }

    pub fn inst_site_text(&self, inst: InstId) -> String {
        let i = &self.instances[inst.0 as usize];
        let mut locs = vec![self.span_text(self.p.ir.expr(i.site).span)];
        for s in &i.extra_sites {
            locs.push(self.span_text(self.p.ir.expr(*s).span));
        }
        format!(
            "{} (instantiated at {})",
            self.p.entity(i.entity).full_name,
            locs.join(",")
        )
    }

    pub fn value_str(&self, v: &Value) -> String {
        pyfmt::to_str(v, self)
    }

    pub fn value_repr(&self, v: &Value) -> String {
        pyfmt::repr(v, self)
    }
}

impl pyfmt::InstanceText for Runtime<'_> {
    fn inst_repr(&self, id: InstId) -> String {
        let e = self.inst_entity(id);
        format!(
            "{} {:x}",
            self.p.entity(e).full_name,
            0x7f00_0000_0000u64 + id.0 as u64 * 0x40
        )
    }

    fn inst_str(&self, id: InstId) -> String {
        self.inst_site_text(id)
    }
}
