//! Run-time state: result variables, instances, scopes and tasks, all in arenas.
//!
//! A *result variable* (RV) is any storage location (LANGUAGE.md §12.1): a block variable, an
//! instance attribute, or an index key pseudo-variable that a waiting lookup blocks on. RVs are
//! 40 bytes; the extra state of relation ends (elements, providers, listeners, freeze
//! bookkeeping) lives in a side table only those RVs use, so the common single-valued
//! attribute stays small.

use std::rc::Rc;

use crate::compiler::ids::{BlockId, EntityId, ExprId, RuleId, StmtId, Sym};
use crate::compiler::value::{InstId, Value};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RvId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ScopeId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskId(pub u32);

pub const NONE: u32 = u32::MAX;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RvKind {
    /// A block variable (or an index-key pseudo variable).
    Var,
    /// Plain attribute or `[1]` relation end.
    Single,
    /// `[0:1]` relation end.
    Optional,
    /// Multi-valued relation end.
    List,
}

#[derive(Clone, Debug)]
pub enum RvState {
    Unset,
    Set(Value),
    /// An optional relation frozen without value (or assigned null).
    FrozenNull,
}

pub struct Rv {
    pub state: RvState,
    /// Index into `Runtime::waiters` (0: nobody waits).
    pub waiters: u32,
    /// Index into `Runtime::delayed` for optional/list RVs.
    pub ext: u32,
    /// Owning instance (attributes) or NONE.
    pub owner: u32,
    pub slot: u16,
    pub kind: RvKind,
    /// The expression whose evaluation set the value (for "set at" in messages).
    pub set_by: u32,
    /// What happened to the value besides its first set ([`READ`], [`SET_AGAIN`]): the
    /// incremental compile patches only literals whose value nothing but the export read.
    /// A cell: reads go through `&Runtime`.
    pub marks: std::cell::Cell<u8>,
}

/// [`Rv::marks`]: model code (or a plugin, or the export beyond a resource's own plain
/// field) read the value.
pub const READ: u8 = 1;
/// [`Rv::marks`]: a second assignment gave the value again (equal, so no error).
pub const SET_AGAIN: u8 = 2;

impl Rv {
    pub fn mark(&self, what: u8) {
        self.marks.set(self.marks.get() | what);
    }

    pub fn is_marked(&self, what: u8) -> bool {
        self.marks.get() & what != 0
    }
}

// one per attribute of every instance and per block variable, the largest arena of a
// compile: a value of 16 bytes ([`crate::compiler::value::Text`]) keeps it at 40
const _: () = assert!(std::mem::size_of::<Rv>() <= 40);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Needs the complete value (counts as progress potential on optional/list RVs).
    Complete,
    /// Wakes on the first element or on freeze (`is defined`); counts as potential.
    FirstValue,
    /// Needs completeness but only forwards elements gradually: no progress potential.
    Gradual,
}

#[derive(Copy, Clone, Debug)]
pub struct Waiter {
    pub task: TaskId,
    pub mode: WaitMode,
}

/// What to do with each element added to a relation.
#[derive(Clone, Debug)]
pub enum Listener {
    /// Emit a `for` body for the element.
    ForBody { body: BlockId, scope: ScopeId },
    /// Add the element to another relation (`a.r = b.r`).
    Forward { target: RvId, site: ExprId },
    /// Evaluate a comprehension value for the element into a relation.
    Comprehension {
        target: RvId,
        comp: ExprId,
        scope: ScopeId,
        env: Rc<[Value]>,
        site: ExprId,
    },
}

/// Extra state of optional and list RVs (the reference's DelayedResultVariable).
#[derive(Default)]
pub struct Delayed {
    pub items: Vec<InstId>,
    /// Membership index for large relations (built past a few dozen elements).
    pub item_set: Option<Box<foldhash::HashSet<InstId>>>,
    pub low: u32,
    pub high: Option<u32>,
    pub frozen: bool,
    /// Statements that may still add values (promises handed out, not fulfilled).
    pub providers: u32,
    /// Waiters blocked on completeness (not counting purely gradual ones).
    pub potential: u32,
    /// Gradual listeners; boxed because most relations never get one, and one `Delayed`
    /// exists per optional or list relation of every instance (913,000 at gen_model
    /// N=20,000: 80 -> 64 bytes each).
    pub listeners: Option<Box<Vec<Listener>>>,
    pub queued: bool,
    pub parked: bool,
}

// one per optional or list relation of every instance: keep it at a cache line
const _: () = assert!(std::mem::size_of::<Delayed>() <= 64);

impl Delayed {
    pub fn contains(&self, i: InstId) -> bool {
        match &self.item_set {
            Some(set) => set.contains(&i),
            None => self.items.contains(&i),
        }
    }

    pub fn listeners(&self) -> &[Listener] {
        self.listeners.as_deref().map_or(&[], |l| l.as_slice())
    }

    pub fn add_listener(&mut self, l: Listener) {
        self.listeners.get_or_insert_with(Default::default).push(l);
    }

    pub fn push(&mut self, i: InstId) {
        self.items.push(i);
        match &mut self.item_set {
            Some(set) => {
                set.insert(i);
            }
            None if self.items.len() >= 32 => {
                self.item_set = Some(Box::new(self.items.iter().copied().collect()));
            }
            None => {}
        }
    }
}

pub struct Instance {
    pub entity: EntityId,
    pub rv_base: u32,
    /// The constructor expression that created it (location of messages).
    pub site: ExprId,
    /// Number of implementations applied (0 at the end: "Unable to select implementation").
    pub impl_count: u32,
    /// Further constructor sites that returned this instance through an index.
    pub extra_sites: Vec<ExprId>,
}

pub struct Scope {
    pub parent: u32,
    /// The block whose variables live here (NONE for an instance-only scope).
    pub block: u32,
    pub rv_base: u32,
    /// The instance in scope (implementation bodies) or NONE.
    pub inst: u32,
}

#[derive(Clone, Debug)]
pub enum TaskKind {
    /// Execute a statement of a block.
    Stmt(StmtId),
    /// A constructor's deferred attribute value.
    CtorAttr {
        inst: InstId,
        slot: u16,
        value: ExprId,
        site: ExprId,
    },
    /// A constructor's deferred default value.
    CtorDefault {
        inst: InstId,
        slot: u16,
        site: ExprId,
    },
    /// Evaluate an implement rule for an instance.
    Rule { inst: InstId, rule: RuleId },
    /// Acquire an eager promise for the statement `owner`.
    Promise {
        owner: TaskId,
        instance: ExprId,
        sym: Sym,
    },
    /// One element of a gradual comprehension into a relation.
    CompElem {
        target: RvId,
        comp: ExprId,
        element: Value,
        site: ExprId,
    },
}

/// One recorded side effect of a task.
#[derive(Clone, Debug)]
pub enum Memo {
    /// The result of a constructor or plugin call.
    Value(Value),
    /// A gradual registration (listener) was made at this point.
    Marker,
}

/// Per-task state that survives re-execution after a block.
#[derive(Default)]
pub struct TaskExtra {
    /// Results of side-effecting evaluations (constructors, plugin calls, listener
    /// registrations), replayed in order when the task re-runs.
    pub memo: Vec<Memo>,
    /// RVs this task holds a provider promise on.
    pub held: Vec<RvId>,
    /// Promise acquirer tasks spawned for this statement.
    pub acquirers: Vec<TaskId>,
    /// Comprehension environment captured at creation.
    pub env: Option<Rc<[Value]>>,
    /// Target RV resolved by an attribute assignment.
    pub target: Option<RvId>,
}

pub struct Task {
    pub kind: TaskKind,
    pub scope: ScopeId,
    pub extra: Option<Box<TaskExtra>>,
    pub done: bool,
    /// Blocked on an RV (for the wait-cycle search and the final "not executed" check).
    pub blocked_on: u32,
}

impl Task {
    pub fn extra(&mut self) -> &mut TaskExtra {
        self.extra.get_or_insert_with(Default::default)
    }
}
