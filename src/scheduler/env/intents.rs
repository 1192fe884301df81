//! A version's intents, built in one place, and merging a released version into the model.

use std::collections::HashSet;

use super::EnvScheduler;
use crate::scheduler::model::{Attributes, Blocked, Intent, Model};
use crate::scheduler::queue::{Priority, TaskKey};
use crate::store;

impl EnvScheduler {
    /// The intents of `version`: the one place they are built (restart, release, dry-run).
    /// Attributes the model already holds (same hash) are taken over instead of being read
    /// again, moved out of the model when `take` (it is about to be replaced by this
    /// version) and copied otherwise: a release that changes one resource of 10,000 reads
    /// one attribute set.
    pub(super) async fn load_intents(
        &mut self,
        version: i32,
        take: bool,
    ) -> Result<Vec<Intent>, store::StoreError> {
        self.load_intents_reading(version, take, true).await
    }

    /// [`Self::load_intents`], with the attributes the model does not hold left unread when
    /// not `read` (a scheduler starting: see [`Self::read_unread_later`]).
    pub(super) async fn load_intents_reading(
        &mut self,
        version: i32,
        take: bool,
        read: bool,
    ) -> Result<Vec<Intent>, store::StoreError> {
        let t0 = std::time::Instant::now();
        let rows =
            store::versions::resource_digests_held_or_read(&self.pool, self.env, version).await?;
        let t_digests = t0.elapsed();
        let intents = self.intents_of(rows, take, read).await?;
        tracing::debug!(
            environment = %self.env, version, resources = intents.len(),
            digests_ms = t_digests.as_secs_f64() * 1e3, total_ms = t0.elapsed().as_secs_f64() * 1e3,
            "intents loaded"
        );
        Ok(intents)
    }

    /// The intents of `rows` (a version's resources, or the changed ones of a newer
    /// version): attributes the model holds under the same hash are taken from it (moved
    /// out when `take`, copied otherwise; unread ones are only moved), the others read by
    /// hash, once per hash, or left unread when not `read`.
    pub(super) async fn intents_of(
        &mut self,
        rows: Vec<store::versions::ResourceDigestRow>,
        take: bool,
        read: bool,
    ) -> Result<Vec<Intent>, store::StoreError> {
        let held = |m: &Model, r: &store::versions::ResourceDigestRow| -> Option<usize> {
            m.get(&r.resource_id).filter(|&i| {
                m.intents[i].hash == r.hash && (take || !m.intents[i].attributes.is_unread())
            })
        };
        let mut missing: Vec<String> = if read {
            rows.iter()
                .filter(|r| held(&self.model, r).is_none())
                .map(|r| r.hash.clone())
                .collect()
        } else {
            Vec::new()
        };
        missing.sort_unstable();
        missing.dedup();
        let mut blobs = store::versions::take_attributes(&self.pool, missing).await?;
        let mut intents = Vec::with_capacity(rows.len());
        for r in rows {
            let attributes = match held(&self.model, &r) {
                Some(i) if take => std::mem::take(&mut self.model.intents[i].attributes),
                Some(i) => self.model.intents[i].attributes.clone(),
                None if !read => Attributes::unread(),
                // a hash covers the resource's id: no two rows share one
                None => match blobs.remove(&r.hash) {
                    Some(store::versions::StoredAttributes::Map(a)) => Attributes::parsed(a),
                    Some(store::versions::StoredAttributes::Text(t)) => Attributes::stored(t),
                    None => Attributes::default(),
                },
            };
            intents.push(Intent::of_row(r, attributes));
        }
        Ok(intents)
    }

    /// Take a released version into the model: new and changed resources are scheduled,
    /// removed ones become orphans (or are deleted on their target), and what changed is
    /// written back.
    pub(super) async fn merge_version(&mut self, version: i32) -> Result<(), store::StoreError> {
        if self.model.version.is_some_and(|v| v >= version) {
            return Ok(());
        }
        if self.settings.delete_removed_resources {
            // a removed resource is deleted on its target with the attributes it had: read
            // before the model changes (an error after it would leave the merge half done)
            self.settle_unread().await;
        }
        let t0 = std::time::Instant::now();
        // newer than the model's version: read only what changed between them
        let changes = match self.model.version {
            Some(old) => {
                store::versions::changes_between(&self.pool, self.env, old, version).await?
            }
            None => None,
        };
        let new_handlers = store::code::handlers_of(&self.pool, self.env, version).await?;
        let old_handlers = std::mem::replace(&mut self.handlers, new_handlers);
        let old_version = self.model.version;
        // a newer version is taken in place by what it changed; the whole version is read
        // only when the model holds none, or the changes were not made against it
        let merged = match changes {
            Some((opened, closed)) => {
                let opened_ids: HashSet<&str> =
                    opened.iter().map(|r| r.resource_id.as_str()).collect();
                let removed: Vec<String> = closed
                    .into_iter()
                    .filter(|id| !opened_ids.contains(id.as_str()))
                    .collect();
                // copied: if the changes can not be taken in place, the whole version is
                // loaded from the model as it was
                let upserts = self.intents_of(opened, false, true).await?;
                match self.model.apply_in_place(version, upserts, removed) {
                    Some(merged) => merged,
                    None => {
                        let intents = self.load_intents(version, true).await?;
                        self.model.merge(version, intents)
                    }
                }
            }
            None => {
                let intents = self.load_intents(version, true).await?;
                self.model.merge(version, intents)
            }
        };
        for &r in &merged.new {
            self.stored_rows.added(&self.model.intents[r].id);
        }
        let t_merged = t0.elapsed();
        self.load_wanted_facts().await;
        let agents: Vec<String> = self.model.agents.keys().cloned().collect();
        let _ = store::deploy::ensure_agents(
            &self.pool,
            self.env,
            &agents.into_iter().collect::<Vec<_>>(),
        )
        .await;
        // removed resources: orphans, or deleted on their target when the environment says so
        for gone in &merged.deleted {
            self.queue.drop_deploy(&gone.id);
            self.queue.mark_stale(&gone.id);
            self.timers.cancel(&gone.id);
            let after = old_version.unwrap_or(version);
            // one that never had a row gets an orphan's, so that its versions show it so
            if self.stored_rows.removed(&gone.id) {
                self.batch
                    .states
                    .push(super::persist::orphan_row(gone, after));
            }
            self.orphan(gone, old_handlers.get(&gone.type_name), after);
        }
        for &r in &merged.newly_blocked {
            let id = self.model.intents[r].id.clone();
            self.queue.drop_deploy(&id);
            self.timers.cancel(&id);
        }
        for &r in &merged.updated {
            let id = self.model.intents[r].id.clone();
            self.queue.mark_stale(&id);
        }
        // new intent pre-empts a repair sweep, which starts over afterwards
        let dropped = self.queue.drop_priority(Priority::IntervalRepair);
        if !dropped.is_empty() {
            self.repair_pending = true;
        }
        // back before its removal's delete started: the delete is not needed
        for &r in &merged.new {
            let id = self.model.intents[r].id.clone();
            self.unbury(&id);
        }
        let affected: Vec<usize> = merged
            .new
            .iter()
            .chain(merged.updated.iter())
            .chain(merged.unblocked.iter())
            .copied()
            .collect();
        for &r in &affected {
            self.schedule(r, Priority::NewVersion, "a new version was released", false);
        }
        // persist what the merge changed; untouched resources keep their row (its
        // intent_version is then the version that last changed their intent), so a release
        // that changes one resource of 10,000 writes a handful of rows, not 10,000; blocked
        // ones are written again only when the blocking may have changed
        let blocked = (!merged.blocking_unchanged)
            .then(|| {
                (0..self.model.len())
                    .filter(|&r| self.model.states[r].blocked != Blocked::NotBlocked)
            })
            .into_iter()
            .flatten();
        let touched: Vec<usize> = affected
            .iter()
            .chain(merged.newly_blocked.iter())
            .copied()
            .chain(blocked)
            .collect();
        for r in touched {
            self.mark_state(r);
        }
        // agents placed by a std::AgentConfig: only one that came, changed or went can move
        // them (the walk over every intent is not made for a version without one)
        let agent_config = |i: &Intent| i.type_name == "std::AgentConfig";
        if merged.deleted.iter().any(agent_config)
            || merged
                .new
                .iter()
                .chain(&merged.updated)
                .any(|&r| agent_config(&self.model.intents[r]))
        {
            if let Err(e) = self.read_agent_configs().await {
                tracing::warn!(environment = %self.env, error = %e, "the agents' configurations could not be read");
            }
            self.refresh_placements();
        }
        self.batch.progress = Some(version);
        tracing::info!(
            environment = %self.env, version, new = merged.new.len(), updated = merged.updated.len(),
            deleted = merged.deleted.len(), read_and_merged_ms = t_merged.as_secs_f64() * 1e3,
            total_ms = t0.elapsed().as_secs_f64() * 1e3, "version merged"
        );
        Ok(())
    }
}

/// Read the attributes `intents` hold unread, in one query.
async fn read_unread<'a>(
    pool: &sqlx::PgPool,
    intents: impl Iterator<Item = &'a mut Intent>,
) -> Result<(), store::StoreError> {
    let mut unread: Vec<&mut Intent> = intents.filter(|i| i.attributes.is_unread()).collect();
    if unread.is_empty() {
        return Ok(());
    }
    let hashes = unread.iter().map(|i| i.hash.clone()).collect();
    let mut blobs = store::versions::take_attributes(pool, hashes).await?;
    for i in &mut unread {
        install(i, &mut blobs);
    }
    Ok(())
}

/// `intent`'s attributes from `blobs` (by its hash), when it holds them unread.
fn install(
    intent: &mut Intent,
    blobs: &mut std::collections::HashMap<String, store::versions::StoredAttributes>,
) {
    if !intent.attributes.is_unread() {
        return;
    }
    intent.attributes = match blobs.remove(&intent.hash) {
        Some(store::versions::StoredAttributes::Map(a)) => Attributes::parsed(a),
        Some(store::versions::StoredAttributes::Text(t)) => Attributes::stored(t),
        // as a version whose blob is gone reads (see `intents_of`)
        None => Attributes::default(),
    };
}

impl EnvScheduler {
    /// Read the attributes of the resources `rs` the model holds unread.
    pub(super) async fn read_attributes_of(
        &mut self,
        rs: &[usize],
    ) -> Result<(), store::StoreError> {
        let unread: Vec<usize> = rs
            .iter()
            .copied()
            .filter(|&r| {
                self.model
                    .intents
                    .get(r)
                    .is_some_and(|i| i.attributes.is_unread())
            })
            .collect();
        if unread.is_empty() {
            return Ok(());
        }
        let hashes = unread
            .iter()
            .map(|&r| self.model.intents[r].hash.clone())
            .collect();
        let mut blobs = store::versions::take_attributes(&self.pool, hashes).await?;
        for r in unread {
            install(&mut self.model.intents[r], &mut blobs);
        }
        Ok(())
    }

    /// Read the attributes of every `std::AgentConfig` (agents are placed by them).
    pub(super) async fn read_agent_configs(&mut self) -> Result<(), store::StoreError> {
        let intents = self
            .model
            .intents
            .iter_mut()
            .filter(|i| i.type_name == "std::AgentConfig");
        read_unread(&self.pool, intents).await
    }

    /// Read the attributes the model holds unread on another connection, while the
    /// scheduler already works: a scheduler starting with 100,000 resources read them all
    /// before it merged the new version, and a `steward deploy` changing one waited for it.
    /// [`Self::settle_unread`] puts them in.
    pub(super) fn read_unread_later(&mut self) {
        self.unread_later = None;
        let hashes: Vec<String> = self
            .model
            .intents
            .iter()
            .filter(|i| i.attributes.is_unread())
            .map(|i| i.hash.clone())
            .collect();
        if hashes.is_empty() {
            return;
        }
        let pool = self.pool.clone();
        self.unread = Some(tokio::spawn(async move {
            store::versions::take_attributes(&pool, hashes).await
        }));
    }

    /// Before `events` are taken in: what finishing their actions reads (the flags of the
    /// resources each sends events to) is read, all of it once the read after the start
    /// is done, else only those resources'.
    pub(super) async fn read_for_results(
        &mut self,
        events: &[crate::scheduler::executors::PoolEvent],
    ) {
        use crate::executor::protocol::Reply;
        use crate::scheduler::executors::PoolEvent;
        if self.unread.as_ref().is_some_and(|r| r.is_finished()) {
            self.settle_unread().await;
        }
        if self.unread.is_none() && self.unread_later.is_none() {
            return;
        }
        let mut finished = Vec::new();
        for ev in events {
            let (proc, action) = match ev {
                PoolEvent::Reply(proc, Reply::Result(res)) => (*proc, Some(res.action_id)),
                // every action it had ends
                PoolEvent::Exited(proc, _) => (*proc, None),
                _ => continue,
            };
            for (key, run) in &self.running {
                if run.proc == proc
                    && action.is_none_or(|a| a == run.action_id)
                    && let TaskKey::Deploy(id) = key
                    && let Some(r) = self.model.get(id)
                {
                    finished.push(r);
                }
            }
        }
        self.read_dependents_of(&finished).await;
    }

    /// Read the attributes of the resources `finished` send events to (their flags).
    pub(super) async fn read_dependents_of(&mut self, finished: &[usize]) {
        let dependents: Vec<usize> = finished
            .iter()
            .filter_map(|&r| self.model.provides.get(r))
            .flatten()
            .copied()
            .collect();
        if let Err(e) = self.read_attributes_of(&dependents).await {
            tracing::warn!(environment = %self.env, error = %e, "the attributes of the resources a result sends events to could not be read");
        }
    }

    /// Put in what [`Self::read_unread_later`] read (waiting for it); read what is still
    /// unread (its read failed) now. Before anything reads an attribute other than a
    /// deploy's own (events read their dependents' flags).
    pub(super) async fn settle_unread(&mut self) {
        let later = self.unread_later.take().is_some();
        let Some(reading) = self.unread.take() else {
            // not begun yet: what is unread is read below
            if later && let Err(e) = read_unread(&self.pool, self.model.intents.iter_mut()).await {
                tracing::warn!(environment = %self.env, error = %e, "the attributes of some resources could not be read; they are read when they deploy");
            }
            return;
        };
        let read = match reading.await {
            Ok(read) => read.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match read {
            Ok(mut blobs) => {
                for intent in &mut self.model.intents {
                    install(intent, &mut blobs);
                }
            }
            Err(e) => {
                tracing::warn!(environment = %self.env, error = %e, "reading the attributes after the start failed; reading them again")
            }
        }
        if let Err(e) = read_unread(&self.pool, self.model.intents.iter_mut()).await {
            tracing::warn!(environment = %self.env, error = %e, "the attributes of some resources could not be read; they are read when they deploy");
        }
    }
}
