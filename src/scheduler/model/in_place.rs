//! Taking a newer version into the model by what changed: the resources it adds, replaces
//! and removes. The result is that of [`Model::merge`] with the whole version, but a change
//! to one resource of 100,000 touches that resource and its neighbours, not every intent: a
//! removed resource's slot is taken by the last one, an added one is appended, and edges
//! change only around them. The model's order is then no longer id order; nothing relies on
//! it (indices are only held within one call into the scheduler).

use std::collections::HashSet;

use super::{Blocked, Compliance, Intent, Merged, Model, RState};

impl Model {
    /// Take `version` given as the intents it adds or replaces (`upserts`) and the ids it
    /// removes. `None`, with the model untouched, when a removed id is not held or an id is
    /// named twice: the changes were not made against this model, and the caller merges the
    /// whole version instead.
    pub fn apply_in_place(
        &mut self,
        version: i32,
        upserts: Vec<Intent>,
        removed: Vec<String>,
    ) -> Option<Merged> {
        if removed
            .iter()
            .any(|id| !self.index.contains(&self.intents, id))
        {
            return None;
        }
        let mut named = HashSet::with_capacity(upserts.len() + removed.len());
        if !removed
            .iter()
            .chain(upserts.iter().map(|i| &i.id))
            .all(|id| named.insert(id.as_str()))
        {
            return None;
        }
        drop(named);
        let mut merged = Merged::default();
        // blocked is the closure of the undefined intents over the edges: it is walked again
        // only when a change can move it (10-15 ms at 100,000)
        let mut blocking_may_change = false;
        for id in removed {
            let Some(r) = self.index.get(&self.intents, &id) else {
                unreachable!("checked above: every removed id is held")
            };
            // its dependents may have been blocked through it
            blocking_may_change |= self.states[r].blocked == Blocked::Blocked;
            merged.deleted.push(self.take_out(r));
        }
        let mut added = Vec::new();
        for i in upserts {
            match self.index.get(&self.intents, &i.id) {
                Some(r) => {
                    let (changed, moves_blocking) = self.replace(r, i);
                    blocking_may_change |= moves_blocking;
                    if changed {
                        merged.updated.push(r);
                    }
                }
                None => added.push(self.append(i)),
            }
        }
        for &r in &added {
            // an added resource is blocked if it is undefined or follows a blocked one (its
            // dependents, found waiting for its id, are not blocked by it otherwise)
            blocking_may_change |= self.intents[r].undefined
                || self.requires[r]
                    .iter()
                    .any(|&q| self.states[q].blocked == Blocked::Blocked);
        }
        merged.new = added;
        // in model order, as a whole merge reports them
        merged.updated.sort_unstable();
        self.version = Some(version);
        if blocking_may_change {
            let (newly, freed) = self.recompute_blocked();
            merged.newly_blocked = newly;
            merged.unblocked = freed;
        } else {
            merged.blocking_unchanged = true;
        }
        for &r in merged
            .new
            .iter()
            .chain(merged.updated.iter())
            .chain(merged.unblocked.iter())
        {
            if self.states[r].blocked == Blocked::NotBlocked {
                self.dirty.insert(r);
            }
        }
        Some(merged)
    }

    /// Replace the intent of `r`; its state is reset as a whole merge resets it. Returns
    /// whether it changed (hash or undefined flag) and whether the change can move the
    /// blocked set (an undefined flag flipped, or its requires changed).
    fn replace(&mut self, r: usize, i: Intent) -> (bool, bool) {
        let old = &self.intents[r];
        let requires_changed = old.requires != i.requires;
        let flipped = old.undefined != i.undefined;
        let changed = old.hash != i.hash || flipped;
        if changed {
            let s = &mut self.states[r];
            s.compliance = if i.undefined {
                Compliance::Undefined
            } else {
                Compliance::HasUpdate
            };
            if s.blocked == Blocked::Temporarily {
                // give it another chance
                s.blocked = Blocked::NotBlocked;
                s.blocked_reason = None;
            }
            s.failure_count = 0;
            s.next_retry = None;
        }
        if old.agent != i.agent {
            let old_agent = old.agent.clone();
            self.count_agent(&old_agent, false);
            self.count_agent(&i.agent, true);
        }
        if requires_changed {
            // unlinked by the requires it had, linked by the new ones
            self.unlink(r);
            self.intents[r] = i;
            self.link(r);
        } else {
            self.intents[r] = i;
        }
        (changed, requires_changed || flipped)
    }

    /// Append a resource the model does not hold, with a fresh state; the resources that
    /// required it while it was absent get their edge now.
    fn append(&mut self, i: Intent) -> usize {
        let r = self.len();
        self.count_agent(&i.agent, true);
        self.states.push(RState::fresh(i.undefined));
        self.requires.push(Vec::new());
        self.provides.push(Vec::new());
        let waiting = self.dangling.remove(&i.id).unwrap_or_default();
        self.intents.push(i);
        self.index.insert(&self.intents, r);
        self.link(r);
        for d in waiting {
            self.requires[d].push(r);
            self.provides[r].push(d);
        }
        r
    }

    /// Remove resource `r` and give its slot to the last one. Its dependents keep waiting
    /// for its id (a later version may add it again).
    fn take_out(&mut self, r: usize) -> Intent {
        self.unlink(r);
        let id = self.intents[r].id.clone();
        for d in std::mem::take(&mut self.provides[r]) {
            self.requires[d].retain(|&x| x != r);
            self.dangling.entry(id.clone()).or_default().push(d);
        }
        self.index.remove(&self.intents, &id);
        self.dirty.remove(&r);
        let last = self.len() - 1;
        if r != last {
            // the last resource moves to `r`: every list that names it follows
            let renumber = |list: &mut Vec<usize>| {
                for x in list.iter_mut().filter(|x| **x == last) {
                    *x = r;
                }
            };
            // copies: with an edge to itself, the last one's own lists are among those
            // renumbered
            let (requires, provides) = (self.requires[last].clone(), self.provides[last].clone());
            for q in requires {
                renumber(&mut self.provides[q]);
            }
            for d in provides {
                renumber(&mut self.requires[d]);
            }
            for required in &self.intents[last].requires {
                if !self.index.contains(&self.intents, required)
                    && let Some(waiting) = self.dangling.get_mut(required)
                {
                    renumber(waiting);
                }
            }
            if self.dirty.remove(&last) {
                self.dirty.insert(r);
            }
            self.index.moving(&self.intents, last, r);
        }
        self.requires.swap_remove(r);
        self.provides.swap_remove(r);
        self.states.swap_remove(r);
        let gone = self.intents.swap_remove(r);
        self.count_agent(&gone.agent, false);
        gone
    }

    /// Make the edges of `r` from its intent's requires: to the resources held, and a wait
    /// for those that are not.
    pub(super) fn link(&mut self, r: usize) {
        let mut requires = Vec::with_capacity(self.intents[r].requires.len());
        for id in &self.intents[r].requires {
            match self.index.get(&self.intents, id) {
                Some(q) => {
                    requires.push(q);
                    self.provides[q].push(r);
                }
                None => self.dangling.entry(id.clone()).or_default().push(r),
            }
        }
        self.requires[r] = requires;
    }

    /// Undo [`Self::link`] (with the intent `r` was linked by).
    fn unlink(&mut self, r: usize) {
        for q in std::mem::take(&mut self.requires[r]) {
            self.provides[q].retain(|&x| x != r);
        }
        for id in &self.intents[r].requires {
            if self.index.contains(&self.intents, id) {
                continue;
            }
            if let Some(waiting) = self.dangling.get_mut(id) {
                waiting.retain(|&x| x != r);
                if waiting.is_empty() {
                    self.dangling.remove(id);
                }
            }
        }
    }

    fn count_agent(&mut self, agent: &str, add: bool) {
        match (self.agents.get_mut(agent), add) {
            (Some(n), true) => *n += 1,
            (None, true) => {
                self.agents.insert(agent.to_string(), 1);
            }
            (Some(n), false) if *n > 1 => *n -= 1,
            (Some(_), false) => {
                self.agents.remove(agent);
            }
            (None, false) => {}
        }
    }
}

#[cfg(test)]
mod tests;
