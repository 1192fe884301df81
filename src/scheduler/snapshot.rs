//! What a scheduler that stopped cleanly read from the database when it started, kept for
//! the next start: the rows of its version's resources (`resource_spans`: id, type, agent,
//! hash, requires, undefined) and the state of each (`resource_state`, the columns a start
//! reads). A start given a snapshot builds its model from these rows instead of reading them
//! (10,000 resources: two queries of 50-80 ms on a database that just started), through the
//! same code as a start from the database.
//!
//! Invariants:
//! - A snapshot is made only by a scheduler that stopped with nothing running, no dry-run
//!   open, and every batch its writer was handed written as it was (no fence lost, no row
//!   refused): the rows it holds are then the rows in the database, made by the same
//!   function the writer writes them with ([`super::env`]'s `state_row`). Timestamps are
//!   kept in microseconds, as PostgreSQL keeps them.
//! - A snapshot says nothing about the database it is used with. Whoever keeps it between
//!   processes must know the database did not change meanwhile (`steward deploy` checks its
//!   private cluster's control file, which every start of PostgreSQL changes), and the
//!   scheduler takes it only for the version its progress row says it processed.
//! - The encoding is ours and versioned ([`FORMAT`]); a file of another format, or one that
//!   does not decode to its end, is refused, never half used.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::model::{Attributes, Intent, Model, RState};
use crate::model::codec::{CodecError, Reader, Writer};
use crate::store::deploy::StateRow;
use crate::store::versions::ResourceDigestRow;

/// Bumped whenever the encoding changes.
const FORMAT: u32 = 1;
const MAGIC: &[u8; 8] = b"STWSNAP\n";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a scheduler snapshot of this version of steward")]
    Format,
    #[error("the snapshot has bytes after its end")]
    Trailing,
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// The rows a scheduler's start reads, as they were when it stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub env: Uuid,
    /// The version its model held: the environment's processed version.
    pub version: i32,
    pub(crate) resources: Vec<ResourceDigestRow>,
    /// One per resource of the version that has a stored state; only the columns a start
    /// reads are kept (the others are their defaults).
    pub(crate) states: Vec<StateRow>,
}

/// A snapshot made into the model a start takes from it ([`Snapshot::prepare`]).
pub struct Prepared {
    pub env: Uuid,
    /// The version of its model: the environment's processed version.
    pub version: i32,
    built: (Model, super::env::StoredRows),
}

impl Prepared {
    pub fn resources(&self) -> usize {
        self.built.0.len()
    }

    pub(super) fn into_model(self) -> (Model, super::env::StoredRows) {
        self.built
    }
}

impl Snapshot {
    pub fn resources(&self) -> usize {
        self.resources.len()
    }

    /// Only what a start reads of a state row ([`super::env`]'s `state_from_row`), with
    /// timestamps in microseconds.
    pub(crate) fn keep_state(row: StateRow) -> StateRow {
        StateRow {
            resource_id: row.resource_id,
            compliance: row.compliance,
            last_run: row.last_run,
            last_result: row.last_result,
            last_message: row.last_message,
            blocked: row.blocked,
            blocked_reason: row.blocked_reason,
            last_run_hash: row.last_run_hash,
            last_attempt: row.last_attempt.map(micros),
            last_deployed: row.last_deployed.map(micros),
            last_success: row.last_success.map(micros),
            last_produced_events: row.last_produced_events.map(micros),
            failure_count: row.failure_count,
            next_retry: row.next_retry.map(micros),
            ..Default::default()
        }
    }

    /// The resources, and the stored state of each at its place (None: no row).
    pub(crate) fn into_aligned(self) -> (Vec<ResourceDigestRow>, Vec<Option<StateRow>>) {
        // made in the model's order, one state per resource: then they pair by place
        let aligned = self.states.len() == self.resources.len()
            && self
                .states
                .iter()
                .zip(&self.resources)
                .all(|(s, r)| s.resource_id == r.resource_id);
        if aligned {
            return (self.resources, self.states.into_iter().map(Some).collect());
        }
        let mut by_id: HashMap<String, StateRow> = self
            .states
            .into_iter()
            .map(|s| (s.resource_id.clone(), s))
            .collect();
        let states = self
            .resources
            .iter()
            .map(|r| by_id.remove(&r.resource_id))
            .collect();
        (self.resources, states)
    }

    /// The model a start builds from this snapshot, built now (`steward deploy` does it on
    /// the thread that decoded the snapshot, while its runtime starts).
    pub fn prepare(self) -> Prepared {
        let (env, version) = (self.env, self.version);
        let (resources, states) = self.into_aligned();
        let intents = resources
            .into_iter()
            // read after the start, as a start from the database does
            .map(|r| Intent::of_row(r, Attributes::unread()))
            .collect();
        Prepared {
            env,
            version,
            built: super::env::build_model(
                version,
                intents,
                super::env::StoredStates::Aligned(states),
            ),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64 + self.resources.len() * 256));
        w.bytes(MAGIC);
        w.u32(FORMAT);
        w.bytes(self.env.as_bytes());
        w.i64(self.version as i64);
        w.u32(self.resources.len() as u32);
        for r in &self.resources {
            w.str(&r.resource_id);
            w.str(&r.resource_type);
            w.str(&r.agent);
            w.str(&r.hash);
            w.strs(&r.requires);
            w.u8(r.undefined as u8);
        }
        w.u32(self.states.len() as u32);
        for s in &self.states {
            w.str(&s.resource_id);
            w.str(&s.compliance);
            w.str(&s.last_run);
            w.opt_str(s.last_result.as_deref());
            w.opt_str(s.last_message.as_deref());
            w.str(&s.blocked);
            w.opt_str(s.blocked_reason.as_deref());
            w.opt_str(s.last_run_hash.as_deref());
            for t in [
                s.last_attempt,
                s.last_deployed,
                s.last_success,
                s.last_produced_events,
                s.next_retry,
            ] {
                w.opt_time(t);
            }
            w.i64(s.failure_count as i64);
        }
        w.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let mut r = Reader(bytes);
        if r.take(MAGIC.len())? != MAGIC || r.u32()? != FORMAT {
            return Err(SnapshotError::Format);
        }
        let env = Uuid::from_slice(r.take(16)?).map_err(|_| SnapshotError::Format)?;
        let version = r.i64()? as i32;
        let n = r.count()?;
        let mut resources = Vec::with_capacity(n);
        for _ in 0..n {
            let resource_id = r.string()?;
            let resource_type = r.string()?;
            let agent = r.string()?;
            let hash = r.string()?;
            let requires = r.strings()?;
            let undefined = r.u8()? != 0;
            resources.push(ResourceDigestRow {
                resource_id,
                resource_type,
                agent,
                hash,
                requires,
                undefined,
            });
        }
        let n = r.count()?;
        let mut states = Vec::with_capacity(n);
        for _ in 0..n {
            let resource_id = r.string()?;
            let compliance = r.string()?;
            let last_run = r.string()?;
            let last_result = r.opt_string()?;
            let last_message = r.opt_string()?;
            let blocked = r.string()?;
            let blocked_reason = r.opt_string()?;
            let last_run_hash = r.opt_string()?;
            let last_attempt = r.opt_time()?;
            let last_deployed = r.opt_time()?;
            let last_success = r.opt_time()?;
            let last_produced_events = r.opt_time()?;
            let next_retry = r.opt_time()?;
            let failure_count = r.i64()? as i32;
            states.push(StateRow {
                resource_id,
                compliance,
                last_run,
                last_result,
                last_message,
                blocked,
                blocked_reason,
                last_run_hash,
                last_attempt,
                last_deployed,
                last_success,
                last_produced_events,
                failure_count,
                next_retry,
                ..Default::default()
            });
        }
        if !r.is_empty() {
            return Err(SnapshotError::Trailing);
        }
        Ok(Snapshot {
            env,
            version,
            resources,
            states,
        })
    }

    /// How this snapshot differs from what a start would read from `pool` now (empty: it
    /// reads the same). For tests, and for anyone who doubts a snapshot.
    pub async fn differences_from_database(
        &self,
        pool: &sqlx::PgPool,
    ) -> Result<Vec<String>, crate::store::StoreError> {
        let mut found = Vec::new();
        let progress = crate::store::deploy::load_progress(pool, self.env).await?;
        if progress != Some(self.version) {
            found.push(format!(
                "processed version: {progress:?} stored, {} in the snapshot",
                self.version
            ));
        }
        let mut stored =
            crate::store::versions::resource_digests(pool, self.env, self.version).await?;
        let mut held = self.resources.clone();
        stored.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
        held.sort_by(|a, b| a.resource_id.cmp(&b.resource_id));
        if stored.len() != held.len() {
            found.push(format!(
                "{} resources stored, {} in the snapshot",
                stored.len(),
                held.len()
            ));
        }
        for (s, h) in stored.iter().zip(&held) {
            if s != h {
                found.push(format!(
                    "resource {}: stored {s:?}, held {h:?}",
                    s.resource_id
                ));
            }
        }
        let states = crate::store::deploy::load_states(pool, self.env).await?;
        let held: HashMap<&str, &StateRow> = self
            .states
            .iter()
            .map(|s| (s.resource_id.as_str(), s))
            .collect();
        for r in &stored {
            let id = r.resource_id.as_str();
            match (states.get(id), held.get(id)) {
                (Some(row), Some(h)) if Snapshot::keep_state(row.clone()) == **h => {}
                (Some(row), Some(h)) => {
                    found.push(format!("state of {id}: stored {row:?}, held {h:?}"))
                }
                (Some(_), None) => found.push(format!("state of {id}: stored, not held")),
                // a start without a stored row takes a fresh state: the held one must read so
                (None, Some(h))
                    if super::env::state_from_row((*h).clone()) == RState::fresh(r.undefined) => {}
                (None, Some(h)) => found.push(format!("state of {id}: none stored, held {h:?}")),
                (None, None) => {}
            }
        }
        Ok(found)
    }
}

/// `t` to the microsecond (toward the past), as PostgreSQL stores it.
fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        let now = Utc::now();
        Snapshot {
            env: Uuid::new_v4(),
            version: 7,
            resources: vec![
                ResourceDigestRow {
                    resource_id: "fs::File[a,path=/x]".into(),
                    resource_type: "fs::File".into(),
                    agent: "a".into(),
                    hash: "h1".into(),
                    requires: vec!["fs::Directory[a,path=/]".into()],
                    undefined: false,
                },
                ResourceDigestRow {
                    resource_id: "fs::Directory[a,path=/]".into(),
                    resource_type: "fs::Directory".into(),
                    agent: "a".into(),
                    hash: "h2".into(),
                    requires: vec![],
                    undefined: true,
                },
            ],
            states: vec![Snapshot::keep_state(StateRow {
                resource_id: "fs::File[a,path=/x]".into(),
                agent: "a".into(),
                intent_version: Some(7),
                compliance: "compliant".into(),
                last_run: "successful".into(),
                last_result: Some("deployed".into()),
                last_message: Some("ünïcode\nline".into()),
                blocked: "not_blocked".into(),
                last_run_hash: Some("h1".into()),
                last_attempt: Some(now),
                last_deployed: Some(now),
                failure_count: 3,
                ..Default::default()
            })],
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_it_was_written_and_nothing_else_reads() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
        // kept to the microsecond, what a read from PostgreSQL gives
        let t = s.states[0].last_attempt.unwrap();
        assert_eq!(t.timestamp_subsec_nanos() % 1000, 0);
        assert!(s.states[0].agent.is_empty() && s.states[0].intent_version.is_none());
        // every cut is refused, never half read
        for cut in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            Snapshot::decode(&longer),
            Err(SnapshotError::Trailing)
        ));
        let mut other = bytes.clone();
        other[8] ^= 1;
        assert!(matches!(
            Snapshot::decode(&other),
            Err(SnapshotError::Format)
        ));
        // a count larger than the file allocates nothing
        let mut huge = bytes[..36].to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(Snapshot::decode(&huge).is_err());
    }
}
