//! What happened in an environment, and the channel that tells it: the vocabulary shared by
//! the server (which sends most events), the scheduler and the git sources (which act on
//! them). It lives below all three so that none of them needs another to speak it.
//!
//! With several server replicas on one database, an event sent on one replica must reach the
//! one that owns the environment: [`Notifier::send`] delivers locally at once and hands the
//! event to a publisher (set by `crate::replicas`), which sends it to the other replicas
//! through PostgreSQL; what arrives from them comes back in through [`Notifier::deliver`].

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

/// Something changed in an environment: parts that act on their own re-read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A version was released (or rolled back to).
    Released { environment: Uuid, version: i32 },
    /// Settings changed (the git source too).
    Settings { environment: Uuid },
    /// The environment was created: a replica should own it.
    Created { environment: Uuid },
    /// The environment was deleted.
    Deleted { environment: Uuid },
    /// A user asked for a deploy or repair, or a pause/halt changed.
    Control { environment: Uuid },
    /// Parameters or facts were written or deleted (after the transaction committed): the
    /// git sources recompile when `resolved_versions` is not empty (those versions had an
    /// unknown value that is now known), or when `recompile` is set (the writer asked for it
    /// and a value changed, or a parameter was deleted). `changed` holds `(resource_id,
    /// name)` of the values that are new or different (`''` for a parameter); built with
    /// [`Event::facts`], which keeps it small enough to travel between replicas.
    Facts {
        environment: Uuid,
        resolved_versions: Vec<i32>,
        changed: Vec<(String, String)>,
        recompile: bool,
    },
    /// A pull-request preview asked for a dry-run (recorded in the database) of what it
    /// changes: the environment's scheduler runs it.
    PreviewDryrun { environment: Uuid, dryrun: Uuid },
    /// Events may have been missed (the link to the other replicas was down): re-read
    /// everything.
    Resync,
}

/// At most this many bytes of names in an [`Event::Facts`]: events travel between replicas
/// as PostgreSQL notifications, whose payload ends at 8000 bytes.
const FACTS_EVENT_NAMES: usize = 4000;
/// At most this many versions in an [`Event::Facts`] (the newest are kept).
const FACTS_EVENT_VERSIONS: usize = 100;

impl Event {
    /// An [`Event::Facts`] whose lists are bounded: the newest resolved versions, and the
    /// changed values while their names fit (the rest are left out; a recompile does not need
    /// them, they only say why).
    pub fn facts(
        environment: Uuid,
        mut resolved_versions: Vec<i32>,
        changed: Vec<(String, String)>,
        recompile: bool,
    ) -> Event {
        resolved_versions.sort_unstable();
        resolved_versions.dedup();
        if resolved_versions.len() > FACTS_EVENT_VERSIONS {
            resolved_versions.drain(..resolved_versions.len() - FACTS_EVENT_VERSIONS);
        }
        let mut size = 0;
        let changed = changed
            .into_iter()
            .take_while(|(r, n)| {
                size += r.len() + n.len() + 8;
                size <= FACTS_EVENT_NAMES
            })
            .collect();
        Event::Facts {
            environment,
            resolved_versions,
            changed,
            recompile,
        }
    }
}

#[derive(Clone)]
pub struct Notifier {
    local: broadcast::Sender<Event>,
    publish: Arc<OnceLock<mpsc::UnboundedSender<Event>>>,
}

impl Notifier {
    pub fn new() -> Notifier {
        Notifier {
            local: broadcast::channel(1024).0,
            publish: Arc::new(OnceLock::new()),
        }
    }

    /// Tell this process now, and the other replicas (when there are).
    pub fn send(&self, e: Event) {
        if let Some(p) = self.publish.get() {
            let _ = p.send(e.clone());
        }
        // nobody listening is fine
        let _ = self.local.send(e);
    }

    /// An event from another replica: told in this process only.
    pub fn deliver(&self, e: Event) {
        let _ = self.local.send(e);
    }

    /// From now on, every sent event also goes to `publisher` (once per process).
    pub fn publish_to(&self, publisher: mpsc::UnboundedSender<Event>) {
        let _ = self.publish.set(publisher);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.local.subscribe()
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_events_stay_small_enough_for_a_notification() {
        let env = Uuid::nil();
        let changed: Vec<(String, String)> = (0..1000)
            .map(|i| (format!("vm::Host[agent,name=host{i:04}]"), "ip".to_string()))
            .collect();
        let e = Event::facts(env, (1..=1000).rev().collect(), changed, true);
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.len() < 7000, "{}", json.len());
        let Event::Facts {
            resolved_versions,
            changed,
            recompile,
            ..
        } = e
        else {
            unreachable!()
        };
        assert_eq!(resolved_versions.len(), 100);
        assert_eq!(resolved_versions.first(), Some(&901), "the newest are kept");
        assert!(!changed.is_empty() && changed.len() < 1000);
        assert!(recompile);
        let back: Event = serde_json::from_str(&json).unwrap();
        assert!(matches!(back, Event::Facts { .. }));
    }
}
