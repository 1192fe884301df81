//! Requests held open until something happens (`…/progress?wait_ms=`), kept within bounds
//! per environment.
//!
//! A held request costs little alone (it asks the scheduler from memory, and counts states at
//! a growing interval), but each one costs that again. Any caller who may read an environment
//! may hold them, so without a bound one tenant's loop could keep this server's scheduler and
//! its PostgreSQL busy for everyone. [`Waits::enter`] hands out at most
//! [`Waits::PER_ENVIRONMENT`] slots per environment; a request beyond them is refused (429)
//! and asked to come back, instead of being held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// The held requests of this server, by environment.
#[derive(Clone, Default)]
pub struct Waits {
    held: Arc<Mutex<HashMap<Uuid, usize>>>,
}

/// One held request; its slot is given back when it is dropped (answered or cancelled: a
/// client that goes away drops the handler's future, and with it this).
pub struct WaitSlot {
    held: Arc<Mutex<HashMap<Uuid, usize>>>,
    environment: Uuid,
}

impl Waits {
    /// Requests one environment may hold at once on this server. `steward deploy`,
    /// `steward version progress --wait` and a console page hold one each.
    pub const PER_ENVIRONMENT: usize = 8;

    /// A slot for one more held request on `environment`, or None when it holds
    /// [`Self::PER_ENVIRONMENT`] already.
    pub fn enter(&self, environment: Uuid) -> Option<WaitSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(environment).or_default();
        if *n >= Self::PER_ENVIRONMENT {
            return None;
        }
        *n += 1;
        Some(WaitSlot {
            held: self.held.clone(),
            environment,
        })
    }

    /// How many requests `environment` holds now.
    pub fn held(&self, environment: Uuid) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&environment).copied().unwrap_or(0)
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.environment) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.environment);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_per_environment_and_given_back_when_dropped() {
        let waits = Waits::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut slots: Vec<WaitSlot> = (0..Waits::PER_ENVIRONMENT)
            .map(|_| waits.enter(a).expect("a slot below the bound"))
            .collect();
        assert!(waits.enter(a).is_none(), "one past the bound");
        // another environment is not affected
        let other = waits.enter(b).expect("another environment's slot");
        assert_eq!(waits.held(a), Waits::PER_ENVIRONMENT);
        slots.pop();
        assert_eq!(waits.held(a), Waits::PER_ENVIRONMENT - 1);
        slots.push(waits.enter(a).expect("a slot given back is free again"));
        drop(slots);
        drop(other);
        assert_eq!(waits.held(a), 0);
        assert_eq!(waits.held(b), 0);
        assert!(
            waits.held.lock().unwrap().is_empty(),
            "no entry left behind"
        );
    }
}
