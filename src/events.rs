//! What happened in an environment, and the channel that tells it: the vocabulary shared by
//! the server (which sends most events), the scheduler and the git sources (which act on
//! them). It lives below all three so that none of them needs another to speak it.

use tokio::sync::broadcast;
use uuid::Uuid;

/// Something changed in an environment: parts that act on their own re-read it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A version was released (or rolled back to).
    Released { environment: Uuid, version: i32 },
    /// Settings changed.
    Settings { environment: Uuid },
    /// The environment was deleted.
    Deleted { environment: Uuid },
    /// A user asked for a deploy or repair, or a pause/halt changed.
    Control { environment: Uuid },
}

#[derive(Clone)]
pub struct Notifier(pub broadcast::Sender<Event>);

impl Notifier {
    pub fn new() -> Notifier {
        Notifier(broadcast::channel(1024).0)
    }

    pub fn send(&self, e: Event) {
        // nobody listening is fine
        let _ = self.0.send(e);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.0.subscribe()
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier::new()
    }
}
