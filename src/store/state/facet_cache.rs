//! The counts and choices of a resources filter bar ([`super::page`]'s facets), kept in memory
//! between page views while the environment does not change.
//!
//! Counting a version by status joins every one of its resources with its state: ~130 ms at
//! 100,000 resources, most of the cost of a page (`examples/bench_console.rs`). People page,
//! sort and filter a table that changes far less often than they click, so the facets of
//! (environment, version, filters) are kept until PostgreSQL notifies a change of that
//! environment ([`crate::store::changes`], sent in the transaction of every deploy write).
//!
//! Never stale for long: an entry is only stored if no change of its environment was seen
//! while it was computed (a generation per environment); everything is dropped when the
//! listener (re)connects or falls behind, since notifications may have been missed; and an
//! entry lives at most [`MAX_AGE`] in any case. Until the listener is connected nothing is
//! kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

use super::page::Filter;
use crate::store::changes::{Change, Changes};

/// The longest an entry is used, even without a notification.
pub const MAX_AGE: Duration = Duration::from_secs(10);
/// Entries kept at most (the oldest go first).
const CAPACITY: usize = 512;

/// Counts by status under the other filters.
pub type Counts = BTreeMap<String, i64>;
/// A version's agents and its types (a version never changes: kept until pushed out).
pub type Choices = (Vec<String>, Vec<String>);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    env: Uuid,
    version: i32,
    agent: Option<String>,
    resource_type: Option<String>,
    text: Option<String>,
}

#[derive(Default)]
struct Inner {
    /// the listener is connected: notifications reach us
    live: bool,
    /// changes seen per environment (and for all, on reconnects)
    generations: HashMap<Uuid, u64>,
    epoch: u64,
    entries: HashMap<Key, (Instant, Arc<Counts>)>,
    choices: HashMap<(Uuid, i32), Arc<Choices>>,
}

/// Where an entry computed now may be stored, if nothing changed meanwhile.
pub struct Ticket {
    key: Key,
    generation: (u64, u64),
}

#[derive(Clone)]
pub struct FacetCache {
    changes: Changes,
    inner: Arc<Mutex<Inner>>,
    following: Arc<OnceLock<()>>,
}

impl FacetCache {
    pub fn new(changes: Changes) -> FacetCache {
        FacetCache {
            changes,
            inner: Arc::default(),
            following: Arc::default(),
        }
    }

    /// The counts of `filter` on `version`, if kept; otherwise a ticket to store them.
    pub fn get(&self, env: Uuid, version: i32, filter: &Filter) -> Result<Arc<Counts>, Ticket> {
        self.follow();
        let key = Key {
            env,
            version,
            agent: filter.agent.clone(),
            resource_type: filter.resource_type.clone(),
            text: filter.text.clone(),
        };
        let inner = self.inner.lock().unwrap();
        if let Some((at, facets)) = inner.entries.get(&key)
            && at.elapsed() < MAX_AGE
        {
            return Ok(facets.clone());
        }
        let generation = (
            inner.epoch,
            inner.generations.get(&env).copied().unwrap_or(0),
        );
        Err(Ticket { key, generation })
    }

    /// The agents and types of a version, if kept.
    pub fn choices(&self, env: Uuid, version: i32) -> Option<Arc<Choices>> {
        self.inner
            .lock()
            .unwrap()
            .choices
            .get(&(env, version))
            .cloned()
    }

    pub fn put_choices(&self, env: Uuid, version: i32, choices: Arc<Choices>) {
        let mut inner = self.inner.lock().unwrap();
        if inner.choices.len() >= CAPACITY {
            inner.choices.clear();
        }
        inner.choices.insert((env, version), choices);
    }

    /// Keep `counts`, computed after `ticket` was handed out, unless the environment changed
    /// since (or the listener is not connected).
    pub fn put(&self, ticket: Ticket, facets: Arc<Counts>) {
        let mut inner = self.inner.lock().unwrap();
        let now = (
            inner.epoch,
            inner.generations.get(&ticket.key.env).copied().unwrap_or(0),
        );
        if !inner.live || now != ticket.generation {
            return;
        }
        if inner.entries.len() >= CAPACITY {
            inner.entries.retain(|_, (at, _)| at.elapsed() < MAX_AGE);
            if inner.entries.len() >= CAPACITY {
                let oldest = inner
                    .entries
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    inner.entries.remove(&k);
                }
            }
        }
        inner.entries.insert(ticket.key, (Instant::now(), facets));
    }

    /// Start following changes (once).
    fn follow(&self) {
        self.following.get_or_init(|| {
            let mut changes = self.changes.subscribe();
            let inner = self.inner.clone();
            tokio::spawn(async move {
                loop {
                    let seen = changes.recv().await;
                    let mut inner = inner.lock().unwrap();
                    match seen {
                        // the listener (re)connected: whatever happened before is unknown
                        Ok(Change::Listening) => {
                            inner.live = true;
                            inner.epoch += 1;
                            inner.entries.clear();
                        }
                        Ok(Change::Lost) => {
                            inner.live = false;
                            inner.epoch += 1;
                            inner.entries.clear();
                        }
                        Ok(Change::Environment(env)) => {
                            *inner.generations.entry(env).or_default() += 1;
                            inner.entries.retain(|k, _| k.env != env);
                        }
                        Err(RecvError::Lagged(_)) => {
                            inner.epoch += 1;
                            inner.entries.clear();
                        }
                        Err(RecvError::Closed) => {
                            inner.live = false;
                            inner.entries.clear();
                            return;
                        }
                    }
                }
            });
        });
    }
}
