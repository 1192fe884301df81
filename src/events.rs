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
    /// Events may have been missed (the link to the other replicas was down): re-read
    /// everything.
    Resync,
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
