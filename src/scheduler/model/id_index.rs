//! The model's resources by id, each id held once: the index keeps places in the model's
//! intents and finds an id by comparing with the intent at a place, instead of a map with a
//! copy of every id as its key (100,000 ids copied, hashed and later dropped on every start:
//! ~10-20 ms and ~5 MB).
//!
//! Invariant: every place the index holds is a place of the model's intents, and the intent
//! there has the id it was indexed by. Callers index a place after the intent is there, and
//! move or remove a place before the intent leaves it.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::Intent;

// keyed by this process (ids come from commits: a commit must not choose collisions)
type Keys = std::hash::RandomState;

#[derive(Clone, Default)]
pub struct IdIndex {
    places: HashTable<usize>,
    keys: Keys,
}

impl IdIndex {
    pub fn with_capacity(n: usize) -> IdIndex {
        IdIndex {
            places: HashTable::with_capacity(n),
            keys: Keys::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.places.len()
    }

    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// The place of `id`.
    pub fn get(&self, intents: &[Intent], id: &str) -> Option<usize> {
        self.places
            .find(self.keys.hash_one(id), |&r| intents[r].id == id)
            .copied()
    }

    pub fn contains(&self, intents: &[Intent], id: &str) -> bool {
        self.get(intents, id).is_some()
    }

    /// Index the intent at place `r` (an id indexed already moves there, as a map's insert
    /// replaces).
    pub fn insert(&mut self, intents: &[Intent], r: usize) {
        let id = intents[r].id.as_str();
        let keys = &self.keys;
        match self.places.entry(
            keys.hash_one(id),
            |&x| intents[x].id == id,
            |&x| keys.hash_one(intents[x].id.as_str()),
        ) {
            Entry::Occupied(mut e) => *e.get_mut() = r,
            Entry::Vacant(e) => {
                e.insert(r);
            }
        }
    }

    /// Take `id` out; its place.
    pub fn remove(&mut self, intents: &[Intent], id: &str) -> Option<usize> {
        match self
            .places
            .find_entry(self.keys.hash_one(id), |&r| intents[r].id == id)
        {
            Ok(e) => Some(e.remove().0),
            Err(_) => None,
        }
    }

    /// The intent at `from` is to move to `to`: its id is found there from now on (call
    /// before it moves).
    pub fn moving(&mut self, intents: &[Intent], from: usize, to: usize) {
        let id = intents[from].id.as_str();
        if let Some(at) = self
            .places
            .find_mut(self.keys.hash_one(id), |&r| intents[r].id == id)
        {
            *at = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(id: &str) -> Intent {
        Intent {
            id: id.into(),
            type_name: "t".into(),
            agent: "a".into(),
            hash: "h".into(),
            attributes: super::super::Attributes::unread(),
            requires: Vec::new(),
            undefined: false,
        }
    }

    #[test]
    fn ids_are_found_at_their_places_through_growth_moves_and_removals() {
        let mut intents: Vec<Intent> = Vec::new();
        let mut index = IdIndex::default();
        for i in 0..5_000 {
            intents.push(intent(&format!("r{i}")));
            index.insert(&intents, i);
        }
        assert_eq!(index.len(), 5_000);
        assert!((0..5_000).all(|i| index.get(&intents, &format!("r{i}")) == Some(i)));
        assert_eq!(index.get(&intents, "r5000"), None);
        // a removal as the model makes it: the last intent moves into the gap
        assert_eq!(index.remove(&intents, "r10"), Some(10));
        index.moving(&intents, 4_999, 10);
        intents.swap_remove(10);
        assert_eq!(index.get(&intents, "r10"), None);
        assert_eq!(index.get(&intents, "r4999"), Some(10));
        assert_eq!(index.len(), 4_999);
        // an id indexed again at another place moves there
        intents.push(intent("r20"));
        index.insert(&intents, 4_999);
        assert_eq!(index.get(&intents, "r20"), Some(4_999));
        assert_eq!(index.len(), 4_999);
    }
}
