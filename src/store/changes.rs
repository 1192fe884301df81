//! "Something in environment X changed": PostgreSQL NOTIFY on one channel, sent in the
//! transaction that writes the change (so it is seen only once the change is), and one
//! listener per server process that fans it out to whoever follows environments live (the
//! web console's server-sent events). Through PostgreSQL rather than in memory, so that a
//! page open on one server sees the deploy state another one writes.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::Result;

/// The channel (also bound by the few UPDATE … RETURNING pg_notify(…) statements that
/// notify in the statement that changes).
pub const CHANNEL: &str = "steward_changes";

/// Tell listeners that `env` changed, when the surrounding transaction commits.
pub async fn notify(e: impl sqlx::PgExecutor<'_>, env: Uuid) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(env.to_string())
        .execute(e)
        .await?;
    Ok(())
}

/// What a follower hears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Something in this environment changed.
    Environment(Uuid),
    /// The listener (re)connected: changes made while it was not listening were missed, so
    /// re-read what you show.
    Listening,
    /// The listening connection was lost: until `Listening`, changes are not heard.
    Lost,
}

/// Changed environments as they are notified; a subscriber that falls behind gets `Lagged`
/// and should re-read what it shows. The listener (one connection) starts with the first
/// subscriber, so a server nobody watches holds no connection for it.
#[derive(Clone)]
pub struct Changes {
    pool: PgPool,
    sender: Arc<OnceLock<broadcast::Sender<Change>>>,
}

impl Changes {
    pub fn new(pool: PgPool) -> Changes {
        Changes {
            pool,
            sender: Arc::new(OnceLock::new()),
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.sender
            .get_or_init(|| {
                let (tx, _) = broadcast::channel(1024);
                tokio::spawn(listen(self.pool.clone(), tx.clone()));
                tx
            })
            .subscribe()
    }
}

/// Listen for ever, reconnecting with backoff (from the start again once a connection held).
async fn listen(pool: PgPool, tx: broadcast::Sender<Change>) {
    let mut delay = Duration::from_millis(200);
    loop {
        let mut listening = false;
        let followed = follow(&pool, &tx, &mut listening).await;
        if pool.is_closed() {
            // the server is stopping
            let _ = tx.send(Change::Lost);
            return;
        }
        if let Err(e) = followed {
            tracing::warn!(error = %e, "listening for changes failed; trying again");
        }
        if listening {
            let _ = tx.send(Change::Lost);
            delay = Duration::from_millis(200);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Listen on one connection until it is lost.
async fn follow(pool: &PgPool, tx: &broadcast::Sender<Change>, listening: &mut bool) -> Result<()> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    *listening = true;
    let _ = tx.send(Change::Listening);
    // `try_recv` (unlike `recv`) says when the connection is lost instead of reconnecting
    // silently: then start over, so followers hear `Lost` and later `Listening`
    while let Some(n) = listener.try_recv().await? {
        if let Ok(env) = n.payload().parse::<Uuid>() {
            // nobody following is fine
            let _ = tx.send(Change::Environment(env));
        }
    }
    Ok(())
}
