//! Removed resources deleted on their target (`delete_removed_resources`): their tombstones,
//! the mark that keeps a decided delete in the database until it ran, the retries of one
//! that failed, and a start taking up the deletes an earlier scheduler left undone.
//!
//! A delete is decided when a version removes the resource. From then on its orphan mark
//! says `delete_pending` (written with the merge's other rows), and it says so until the
//! delete succeeded or the resource came back into the model (its row is then written
//! over). A scheduler that starts, after a crash, a kill or a handover to another replica,
//! queues the delete of every marked row with the intent of the version it was orphaned
//! after, which version retention keeps meanwhile. A failed delete is retried with the
//! environment's `retry_backoff`, in memory and across restarts alike.

use std::collections::BTreeMap;

use chrono::Utc;

use super::EnvScheduler;
use crate::executor::protocol::Outcome;
use crate::model::HandlerCode;
use crate::scheduler::model::{Attributes, Intent};
use crate::scheduler::queue::{Priority, TaskKey};
use crate::scheduler::timers::{TimerKind, jittered};
use crate::store;
use crate::store::deploy::OrphanMark;

/// Why a removed resource's delete is queued.
pub(super) const DELETE_REASON: &str = "removed from the model: deleting it on its target";

/// A removed resource to delete on its target.
pub(super) struct Tombstone {
    /// Its last intent, with `purged` set and no requirements.
    pub intent: Intent,
    /// The handler code of the version it was last in.
    pub code: Option<HandlerCode>,
    /// The last version that held it (its orphan mark's).
    pub after: i32,
    /// Deletes of it that failed in a row.
    pub failures: u32,
}

impl EnvScheduler {
    /// `gone` left the model; the last version that held it is `after`. Its orphan mark is
    /// written, and with `delete_removed_resources` its delete is queued and the mark says
    /// so until the delete ran.
    pub(super) fn orphan(&mut self, gone: &Intent, code: Option<&HandlerCode>, after: i32) {
        let delete = self.settings.delete_removed_resources;
        let readable = !gone.attributes.is_unread();
        self.batch.orphaned.push(OrphanMark {
            resource_id: gone.id.clone(),
            after,
            delete_pending: delete && readable,
        });
        if !delete {
            return;
        }
        if !readable {
            tracing::error!(environment = %self.env, resource = %gone.id, "removed from the model, but not deleted on its target: its attributes could not be read (the database was away)");
            return;
        }
        self.bury(gone.clone(), code.cloned(), after, DELETE_REASON);
    }

    /// Queue the delete of `intent` (as it was in version `after`).
    fn bury(&mut self, mut intent: Intent, code: Option<HandlerCode>, after: i32, reason: &str) {
        intent
            .attributes
            .make_mut()
            .insert("purged".into(), serde_json::Value::Bool(true));
        intent.requires.clear();
        let (key, agent) = (TaskKey::Deploy(intent.id.clone()), intent.agent.clone());
        self.tombstones.insert(
            intent.id.clone(),
            Tombstone {
                intent,
                code,
                after,
                failures: 0,
            },
        );
        self.queue
            .schedule(key, &agent, Priority::NewVersion, reason, &[], &[], false);
    }

    /// `id` is back in the model before its delete started: the delete is not needed. One
    /// that runs (or waits in its executor) ends first; its end deploys the resource again.
    pub(super) fn unbury(&mut self, id: &str) {
        let key = TaskKey::Deploy(id.to_string());
        if !self.tombstones.contains_key(id)
            || self.running.get(&key).is_some_and(|run| run.is_delete())
        {
            return;
        }
        self.tombstones.remove(id);
        self.queue.drop_deploy(id);
        // a retry's timer would fire for the resource as it is now
        self.timers.cancel(id);
        // the old intent's deploy still running: the delete waiting for it is not made
        self.queue.forget_follow_up(&key);
    }

    /// The delete of `rid` ended with `outcome`. Done: its mark says so. Failed: retried
    /// after the environment's backoff. Back in the model meanwhile: deployed again.
    pub(super) fn delete_ended(&mut self, rid: &str, outcome: Outcome) {
        if let Some(r) = self.model.get(rid) {
            self.tombstones.remove(rid);
            self.schedule(
                r,
                Priority::NewVersion,
                "back in the model while it was being deleted",
                false,
            );
            self.mark_state(r);
            return;
        }
        let Some(t) = self.tombstones.get_mut(rid) else {
            return;
        };
        if outcome == Outcome::Deployed {
            let after = t.after;
            self.tombstones.remove(rid);
            self.batch.orphaned.push(OrphanMark {
                resource_id: rid.to_string(),
                after,
                delete_pending: false,
            });
            return;
        }
        t.failures += 1;
        let wait = jittered(&self.settings.retry_backoff, t.failures);
        tracing::info!(
            environment = %self.env, resource = rid, outcome = outcome.as_str(), failures = t.failures,
            retry_in_s = wait.num_milliseconds() as f64 / 1e3,
            "the delete of a removed resource did not succeed; it is retried"
        );
        self.timers.set(rid, Utc::now() + wait, TimerKind::Retry);
    }

    /// A retry timer of `id` fired while it is not in the model: its delete again, if it
    /// still waits for one.
    pub(super) fn retry_delete(&mut self, id: &str) {
        let Some(t) = self.tombstones.get(id) else {
            return;
        };
        let reason = format!("retry after {} failed delete(s)", t.failures);
        let agent = t.intent.agent.clone();
        self.queue.schedule(
            TaskKey::Deploy(id.to_string()),
            &agent,
            Priority::Retry,
            &reason,
            &[],
            &[],
            false,
        );
    }

    /// At a start: the deletes an earlier scheduler decided and did not see through (it
    /// crashed, was killed, or its replica handed the environment over) are queued again,
    /// each with the intent and handler code of the version its resource was orphaned
    /// after. One that can not be made any more (that version is gone, or the environment
    /// no longer deletes removed resources) is logged, and its mark cleared.
    pub(super) async fn take_up_pending_deletes(&mut self) -> Result<(), store::StoreError> {
        let pending = store::deploy::pending_deletes(&self.pool, self.env).await?;
        if pending.is_empty() {
            return Ok(());
        }
        let mut digests = Vec::new();
        let mut code_of: BTreeMap<i32, BTreeMap<String, HandlerCode>> = BTreeMap::new();
        for p in pending {
            let give_up = |why: String| {
                tracing::warn!(environment = %self.env, resource = %p.resource_id, version = p.after, "a removed resource's pending delete is dropped: {why}");
            };
            if self.model.get(&p.resource_id).is_some()
                || self.tombstones.contains_key(&p.resource_id)
            {
                continue;
            }
            let clear = |s: &mut Self| {
                s.batch.orphaned.push(OrphanMark {
                    resource_id: p.resource_id.clone(),
                    after: p.after,
                    delete_pending: false,
                })
            };
            if !self.settings.delete_removed_resources {
                give_up("the environment no longer deletes removed resources (delete_removed_resources is off)".into());
                clear(self);
                continue;
            }
            let Some(row) = p.resource else {
                give_up(format!("version {} that held it is gone", p.after));
                tracing::error!(environment = %self.env, resource = %p.resource_id, "removed from the model, but not deleted on its target: the version it was last in is gone");
                clear(self);
                continue;
            };
            if let std::collections::btree_map::Entry::Vacant(e) = code_of.entry(p.after) {
                e.insert(store::code::handlers_of(&self.pool, self.env, p.after).await?);
            }
            digests.push((p.after, row));
        }
        if digests.is_empty() {
            return Ok(());
        }
        let mut hashes: Vec<String> = digests.iter().map(|(_, r)| r.hash.clone()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        let mut blobs = store::versions::take_attributes(&self.pool, hashes).await?;
        let n = digests.len();
        for (after, r) in digests {
            let attributes = match blobs.remove(&r.hash) {
                Some(store::versions::StoredAttributes::Map(a)) => Attributes::parsed(a),
                Some(store::versions::StoredAttributes::Text(t)) => Attributes::stored(t),
                None => {
                    tracing::error!(environment = %self.env, resource = %r.resource_id, "removed from the model, but not deleted on its target: its attributes are gone");
                    self.batch.orphaned.push(OrphanMark {
                        resource_id: r.resource_id.clone(),
                        after,
                        delete_pending: false,
                    });
                    continue;
                }
            };
            let code = code_of
                .get(&after)
                .and_then(|handlers| handlers.get(&r.resource_type))
                .cloned();
            self.bury(
                Intent::of_row(r, attributes),
                code,
                after,
                "removed from the model before the scheduler stopped: deleting it on its target",
            );
        }
        tracing::info!(environment = %self.env, deletes = n, "deletes left pending by the last scheduler are queued");
        Ok(())
    }
}
