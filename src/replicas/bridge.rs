//! Replicas hear each other through PostgreSQL: events sent on one replica (a release, a
//! settings change, a new environment) reach the others on the channel `steward_events`,
//! and "look at the leases now" on [`super::WAKE_CHANNEL`]. A notification is delivered
//! only to listening connections, so when the listening connection comes back after a loss
//! everyone hears [`Event::Resync`] and re-reads what it may have missed.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::mpsc;

use super::{Replica, WAKE_CHANNEL};
use crate::events::{Event, Notifier};
use crate::store::StoreError;

/// The channel events travel on between replicas.
pub const EVENTS_CHANNEL: &str = "steward_events";

#[derive(Serialize, Deserialize)]
struct Envelope {
    from: String,
    #[serde(flatten)]
    event: Event,
}

/// Tell the other replicas to look at the leases now.
pub async fn wake_others(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(WAKE_CHANNEL)
        .execute(pool)
        .await?;
    Ok(())
}

/// Send this replica's events to the others and theirs to this one, for ever.
pub fn start(pool: PgPool, notifier: &Notifier, replica: Replica) {
    let (tx, rx) = mpsc::unbounded_channel();
    notifier.publish_to(tx);
    tokio::spawn(publish(pool.clone(), replica.id().to_string(), rx));
    tokio::spawn(listen(pool, notifier.clone(), replica));
}

async fn publish(pool: PgPool, from: String, mut rx: mpsc::UnboundedReceiver<Event>) {
    while let Some(event) = rx.recv().await {
        let payload = match serde_json::to_string(&Envelope {
            from: from.clone(),
            event,
        }) {
            Ok(p) => p,
            Err(_) => continue,
        };
        // the event follows a committed change: try a while, then leave it to the
        // periodic re-reads (the owner's scheduler and git loop look again on their own)
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=5 {
            match sqlx::query("SELECT pg_notify($1, $2)")
                .bind(EVENTS_CHANNEL)
                .bind(&payload)
                .execute(&pool)
                .await
            {
                Ok(_) => break,
                Err(e) if attempt == 5 => {
                    tracing::warn!(error = %e, "telling the other replicas failed; they catch up on their next look");
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
            if pool.is_closed() {
                return;
            }
        }
    }
}

async fn listen(pool: PgPool, notifier: Notifier, replica: Replica) {
    let mut delay = Duration::from_millis(200);
    let mut heard_before = false;
    loop {
        if pool.is_closed() || replica.is_stopping() {
            return;
        }
        match follow(&pool, &notifier, &replica, &mut heard_before).await {
            Ok(()) => {}
            Err(e) => {
                if pool.is_closed() {
                    return;
                }
                tracing::warn!(error = %e, "listening to the other replicas failed; trying again");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn follow(
    pool: &PgPool,
    notifier: &Notifier,
    replica: &Replica,
    heard_before: &mut bool,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all([EVENTS_CHANNEL, WAKE_CHANNEL]).await?;
    if *heard_before {
        // notifications sent while we were not listening are lost: re-read
        tracing::info!(
            "listening to the other replicas again; re-reading what may have been missed"
        );
        notifier.deliver(Event::Resync);
        replica.wake();
    }
    *heard_before = true;
    while let Some(n) = listener.try_recv().await? {
        if n.channel() == WAKE_CHANNEL {
            replica.wake();
            continue;
        }
        let Ok(env) = serde_json::from_str::<Envelope>(n.payload()) else {
            continue;
        };
        if matches!(env.event, Event::Created { .. } | Event::Deleted { .. }) {
            replica.wake();
        }
        if env.from != replica.id() {
            notifier.deliver(env.event);
        }
    }
    Ok(())
}
