//! The executor's cache (SCHEDULER.md §6.6): handlers keep expensive things (connections,
//! lookups) across actions. An entry expires after a time since its last use or since its
//! creation, or when the model version changes (per-version entries); its on-expiry hook
//! (e.g. closing a connection) runs exactly once, also when the executor stops.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an entry lives.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Evict this long after the last use.
    pub after_last_use: Option<Duration>,
    /// Evict this long after creation.
    pub after_creation: Option<Duration>,
    /// Evict when an action of another model version starts.
    pub per_version: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            after_last_use: Some(Duration::from_secs(60)),
            after_creation: None,
            per_version: false,
        }
    }
}

type Hook = Box<dyn FnOnce(Arc<dyn Any + Send + Sync>) + Send>;

struct Entry {
    value: Arc<dyn Any + Send + Sync>,
    created: Instant,
    last_use: Instant,
    version: i32,
    policy: Policy,
    on_expiry: Option<Hook>,
}

impl Entry {
    fn expired(&self, now: Instant, version: i32) -> bool {
        self.policy
            .after_last_use
            .is_some_and(|d| now.duration_since(self.last_use) > d)
            || self
                .policy
                .after_creation
                .is_some_and(|d| now.duration_since(self.created) > d)
            || (self.policy.per_version && self.version != version)
    }
}

#[derive(Default)]
pub struct Cache {
    entries: HashMap<String, Entry>,
    version: i32,
}

impl Cache {
    /// Called at the start of every action: expire what is due.
    pub fn tick(&mut self, version: i32) {
        self.version = version;
        let now = Instant::now();
        let due: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.expired(now, version))
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.evict(&k);
        }
    }

    fn evict(&mut self, key: &str) {
        if let Some(mut e) = self.entries.remove(key)
            && let Some(hook) = e.on_expiry.take()
        {
            hook(e.value.clone());
        }
    }

    /// The cached value of `key`, or compute, store and return it. A computation that fails
    /// stores nothing.
    pub fn get_or_try_insert<T, E>(
        &mut self,
        key: &str,
        policy: Policy,
        on_expiry: Option<Hook>,
        compute: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E>
    where
        T: Any + Send + Sync,
    {
        let now = Instant::now();
        if let Some(e) = self.entries.get_mut(key) {
            if !e.expired(now, self.version)
                && let Ok(v) = e.value.clone().downcast::<T>()
            {
                e.last_use = now;
                return Ok(v);
            }
            self.evict(key);
        }
        let v = Arc::new(compute()?);
        self.entries.insert(
            key.to_string(),
            Entry {
                value: v.clone(),
                created: now,
                last_use: now,
                version: self.version,
                policy,
                on_expiry,
            },
        );
        Ok(v)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Evict everything (the executor stops).
    pub fn clear(&mut self) {
        let keys: Vec<String> = self.entries.keys().cloned().collect();
        for k in keys {
            self.evict(&k);
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn expiry_and_hooks() {
        static CLOSED: AtomicU32 = AtomicU32::new(0);
        let mut c = Cache::default();
        c.tick(1);
        let hook: Hook = Box::new(|_| {
            CLOSED.fetch_add(1, Ordering::SeqCst);
        });
        let p = Policy {
            after_last_use: None,
            after_creation: None,
            per_version: true,
        };
        let v = c
            .get_or_try_insert::<u32, ()>("conn", p, Some(hook), || Ok(7))
            .unwrap();
        assert_eq!(*v, 7);
        // cached: the closure is not called
        let v = c
            .get_or_try_insert::<u32, ()>("conn", p, None, || panic!("recomputed"))
            .unwrap();
        assert_eq!(*v, 7);
        c.tick(1);
        assert_eq!(c.len(), 1);
        c.tick(2);
        assert_eq!(c.len(), 0);
        assert_eq!(CLOSED.load(Ordering::SeqCst), 1);
        let short = Policy {
            after_last_use: Some(Duration::from_millis(1)),
            after_creation: None,
            per_version: false,
        };
        c.get_or_try_insert::<u32, ()>("x", short, None, || Ok(1))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        c.tick(2);
        assert!(c.is_empty());
        assert!(
            c.get_or_try_insert::<u32, &str>("y", short, None, || Err("no"))
                .is_err()
        );
        assert!(c.is_empty());
    }
}
