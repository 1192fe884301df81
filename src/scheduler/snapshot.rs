//! What a scheduler that stopped cleanly read from the database when it started, kept for
//! the next start: the rows of its version's resources (`resource_spans`: id, type, agent,
//! hash, requires, undefined) and the state of each as a start reads it from its
//! `resource_state` row (`RState`, at its resource's place; none where no row exists). A
//! start given a snapshot builds its model from these instead of reading them (10,000
//! resources: two queries of 50-80 ms on a database that just started), through the same
//! code as a start from the database. The states are kept as the model holds them, not as
//! rows: a start from 100,000 rows made ~600,000 strings only to parse and drop them.
//!
//! Invariants:
//! - A snapshot is made only by a scheduler that stopped with nothing running, no dry-run
//!   open, and every batch its writer was handed written as it was (no fence lost, no row
//!   refused): the rows it holds are then the rows in the database, each state made from
//!   the row the writer writes ([`super::env`]'s `state_row`) as a start makes it from the
//!   stored row (`state_from_row`, timestamps in microseconds as PostgreSQL keeps them).
//! - A snapshot says nothing about the database it is used with. Whoever keeps it between
//!   processes must know the database did not change meanwhile (`steward deploy` checks its
//!   private cluster's control file, which every start of PostgreSQL changes), and the
//!   scheduler takes it only for the version its progress row says it processed.
//! - The encoding is ours and versioned ([`FORMAT`]); a file of another format, or one that
//!   does not decode to its end, is refused, never half used.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::model::{Attributes, Blocked, Compliance, Intent, LastRun, Model, RState};
use crate::model::codec::{CodecError, Reader, Writer};
use crate::store::deploy::StateRow;
use crate::store::versions::ResourceDigestRow;

/// Bumped whenever the encoding changes (2: states as the model holds them, aligned).
const FORMAT: u32 = 2;
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
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub env: Uuid,
    /// The version its model held: the environment's processed version.
    pub version: i32,
    /// Its version's resources (`resource_spans` rows) as the intents a start makes of
    /// them, attributes not read: decoded into the model's own form (into rows first, then
    /// moved into intents, was 10-16 ms of a 100,000-resource start).
    pub(crate) resources: Vec<Intent>,
    /// At each resource's place, its state as a start reads it from its stored row (`None`:
    /// it has no row).
    pub(crate) states: Vec<Option<RState>>,
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

/// A snapshot being made into its model on a thread of its own ([`Snapshot::prepare_later`]):
/// what it is of is known at once, the model when it is built. `steward deploy`'s server
/// serves meanwhile (an upload and its store do not need the scheduler's model), and the
/// scheduler waits for it where a start from the database reads its rows.
pub struct Coming {
    pub env: Uuid,
    pub version: i32,
    resources: usize,
    built: tokio::sync::oneshot::Receiver<Prepared>,
}

impl Coming {
    pub fn resources(&self) -> usize {
        self.resources
    }

    /// The model, once built (`None`: the thread building it is gone; the start reads the
    /// database).
    pub async fn ready(self) -> Option<Prepared> {
        self.built.await.ok()
    }
}

/// How a snapshot given to [`later`] is had: decoded there, or already.
type Decode = Box<dyn FnOnce() -> Result<Snapshot, SnapshotError> + Send>;

/// Each snapshot (what it is of: environment, version, resources) had and made into its
/// model, in order, on one thread of its own.
fn later(work: Vec<((Uuid, i32, usize), Decode)>) -> Vec<Coming> {
    let mut coming = Vec::with_capacity(work.len());
    let mut jobs = Vec::with_capacity(work.len());
    for ((env, version, resources), decode) in work {
        let (tx, rx) = tokio::sync::oneshot::channel();
        coming.push(Coming {
            env,
            version,
            resources,
            built: rx,
        });
        jobs.push((env, decode, tx));
    }
    if !jobs.is_empty() {
        std::thread::spawn(move || {
            for (env, decode, tx) in jobs {
                let began = std::time::Instant::now();
                // one that does not decode, or can not be built (a bug), leaves its start
                // to the database, not the others after it
                let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    decode().map(|s| {
                        let decoded_ms = began.elapsed().as_secs_f64() * 1e3;
                        (decoded_ms, s.prepare())
                    })
                }));
                let (decoded_ms, prepared) = match prepared {
                    Ok(Ok(done)) => done,
                    Ok(Err(e)) => {
                        tracing::warn!(environment = %env, error = %e, "a scheduler snapshot does not decode: its start reads the database");
                        continue;
                    }
                    Err(_) => {
                        tracing::warn!(environment = %env, "a scheduler snapshot could not be made into its model: its start reads the database");
                        continue;
                    }
                };
                tracing::debug!(
                    env = %prepared.env,
                    decoded_ms,
                    ms = began.elapsed().as_secs_f64() * 1e3,
                    "a snapshot is made into its model"
                );
                // a scheduler that stopped before it started takes none
                let _ = tx.send(prepared);
            }
        });
    }
    coming
}

impl PartialEq for Snapshot {
    /// The same rows and states (attributes are not read in either).
    fn eq(&self, other: &Self) -> bool {
        self.env == other.env
            && self.version == other.version
            && self.states == other.states
            && self.resources.len() == other.resources.len()
            && self
                .resources
                .iter()
                .zip(&other.resources)
                .all(|(a, b)| Snapshot::row_of(a) == Snapshot::row_of(b))
    }
}

impl Snapshot {
    /// The row of `resource_spans` an intent of a snapshot was made of.
    pub(crate) fn row_of(i: &Intent) -> ResourceDigestRow {
        ResourceDigestRow {
            resource_id: i.id.clone(),
            resource_type: i.type_name.clone(),
            agent: i.agent.clone(),
            hash: i.hash.clone(),
            requires: i.requires.clone(),
            undefined: i.undefined,
        }
    }

    /// The intent a start makes of a `resource_spans` row (attributes read after it).
    #[cfg(test)]
    pub(crate) fn intent_of(row: ResourceDigestRow) -> Intent {
        Intent::of_row(row, Attributes::unread())
    }

    /// Each snapshot made into its model ([`Snapshot::prepare`]) on one thread, in order.
    pub fn prepare_later(snapshots: Vec<Snapshot>) -> Vec<Coming> {
        later(
            snapshots
                .into_iter()
                .map(|s| {
                    let of = (s.env, s.version, s.resources());
                    let decode: Decode = Box::new(move || Ok(s));
                    (of, decode)
                })
                .collect(),
        )
    }

    /// The snapshots still encoded at `ranges` of `file`, each decoded and made into its
    /// model on one thread started now ([`Snapshot::prepare_later`], with the decode on that
    /// thread too: at 100,000 resources it is ~80 ms of allocation, which `steward deploy`'s
    /// server no longer waits for). What each is of is read at once from its header; an
    /// `Err` is a header that does not read. One whose body does not decode leaves its
    /// start to the database, as one whose model can not be built does.
    pub fn decode_later<B>(
        file: Arc<B>,
        ranges: Vec<Range<usize>>,
    ) -> Result<Vec<Coming>, SnapshotError>
    where
        B: std::ops::Deref<Target = [u8]> + Send + Sync + 'static,
    {
        let mut work = Vec::with_capacity(ranges.len());
        for range in ranges {
            let bytes = file.get(range.clone()).ok_or(CodecError::Truncated)?;
            let (env, version, resources) = Snapshot::header(&mut Reader(bytes))?;
            let file = file.clone();
            let decode: Decode = Box::new(move || Snapshot::decode(&file[range]));
            work.push(((env, version, resources), decode));
        }
        Ok(later(work))
    }

    pub fn resources(&self) -> usize {
        self.resources.len()
    }

    /// The state a start reads from `row` (as stored: timestamps in microseconds).
    pub(crate) fn read_state(row: StateRow) -> RState {
        super::env::state_from_row(Self::keep_state(row))
    }

    /// Only what a start reads of a state row ([`super::env`]'s `state_from_row`), with
    /// timestamps in microseconds.
    fn keep_state(row: StateRow) -> StateRow {
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

    /// The model a start builds from this snapshot, built now (`steward deploy` does it on
    /// the thread that decoded the snapshot, while its runtime starts).
    pub fn prepare(self) -> Prepared {
        let Snapshot {
            env,
            version,
            resources,
            states,
        } = self;
        Prepared {
            env,
            version,
            built: super::env::build_model(
                version,
                resources,
                super::env::StoredStates::Read(states),
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
            w.str(&r.id);
            w.str(&r.type_name);
            w.str(&r.agent);
            w.str(&r.hash);
            w.strs(&r.requires);
            w.u8(r.undefined as u8);
        }
        // one per resource, at its place (the count is the resources')
        for state in &self.states {
            let Some(s) = state else {
                w.u8(0);
                continue;
            };
            w.u8(1);
            w.str(s.compliance.as_str());
            w.str(s.last_run.as_str());
            w.opt_str(s.last_result.map(|o| o.as_str()));
            w.opt_str(s.last_message.as_deref());
            w.str(s.blocked.as_str());
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
            w.u32(s.failure_count);
        }
        w.0
    }

    /// What an encoded snapshot is of (environment, version, number of resources), read
    /// from its start; `r` is left at its first resource.
    fn header(r: &mut Reader<'_>) -> Result<(Uuid, i32, usize), SnapshotError> {
        if r.take(MAGIC.len())? != MAGIC || r.u32()? != FORMAT {
            return Err(SnapshotError::Format);
        }
        let env = Uuid::from_slice(r.take(16)?).map_err(|_| SnapshotError::Format)?;
        let version = r.i64()? as i32;
        let n = r.count()?;
        Ok((env, version, n))
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let mut r = Reader(bytes);
        let (env, version, n) = Snapshot::header(&mut r)?;
        let mut resources = Vec::with_capacity(n);
        for _ in 0..n {
            let resource_id = r.string()?;
            let resource_type = r.string()?;
            let agent = r.string()?;
            let hash = r.string()?;
            let requires = r.strings()?;
            let undefined = r.u8()? != 0;
            // attributes read after the start, as a start from the database does
            resources.push(Intent {
                id: resource_id,
                type_name: resource_type,
                agent,
                hash,
                attributes: Attributes::unread(),
                requires,
                undefined,
            });
        }
        let mut states = Vec::with_capacity(resources.len());
        for _ in 0..resources.len() {
            states.push(match r.u8()? {
                0 => None,
                1 => Some(decode_state(&mut r)?),
                _ => return Err(SnapshotError::Format),
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
        let mut held: Vec<ResourceDigestRow> =
            self.resources.iter().map(Snapshot::row_of).collect();
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
        let held: HashMap<&str, Option<&RState>> = self
            .resources
            .iter()
            .zip(&self.states)
            .map(|(r, s)| (r.id.as_str(), s.as_ref()))
            .collect();
        for r in &stored {
            let id = r.resource_id.as_str();
            match (states.get(id), held.get(id).copied().flatten()) {
                (Some(row), Some(h)) if Snapshot::read_state(row.clone()) == *h => {}
                (Some(row), Some(h)) => {
                    found.push(format!("state of {id}: stored {row:?}, held {h:?}"))
                }
                (Some(_), None) => found.push(format!("state of {id}: stored, not held")),
                // a start without a stored row takes a fresh state: the held one must be it
                (None, Some(h)) if *h == RState::fresh(r.undefined) => {}
                (None, Some(h)) => found.push(format!("state of {id}: none stored, held {h:?}")),
                (None, None) => {}
            }
        }
        Ok(found)
    }
}

/// A state as [`Snapshot::encode`] wrote it: its words read in place (none is allocated
/// but its message, reason and hash), and refused when they are not the ones it writes.
fn decode_state(r: &mut Reader<'_>) -> Result<RState, SnapshotError> {
    fn word<T: Copy>(
        r: &mut Reader<'_>,
        parse: fn(&str) -> T,
        name: fn(T) -> &'static str,
    ) -> Result<T, SnapshotError> {
        let s = r.str()?;
        let v = parse(s);
        if name(v) != s {
            return Err(SnapshotError::Format);
        }
        Ok(v)
    }
    let compliance = word(r, Compliance::parse, Compliance::as_str)?;
    let last_run = word(r, LastRun::parse, LastRun::as_str)?;
    let last_result = match r.u8()? {
        0 => None,
        1 => Some(super::env::parse_outcome(r.str()?).ok_or(SnapshotError::Format)?),
        _ => return Err(SnapshotError::Format),
    };
    let last_message = r.opt_string()?;
    let blocked = word(r, Blocked::parse, Blocked::as_str)?;
    let blocked_reason = r.opt_string()?;
    let last_run_hash = r.opt_string()?;
    let last_attempt = r.opt_time()?;
    let last_deployed = r.opt_time()?;
    let last_success = r.opt_time()?;
    let last_produced_events = r.opt_time()?;
    let next_retry = r.opt_time()?;
    let failure_count = r.u32()?;
    Ok(RState {
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
        // not stored: a start from the database has none either
        last_change: None,
        failure_count,
        next_retry,
    })
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
            resources: [
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
            ]
            .into_iter()
            .map(Snapshot::intent_of)
            .collect(),
            states: vec![
                Some(Snapshot::read_state(StateRow {
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
                })),
                None,
            ],
        }
    }

    #[test]
    fn a_snapshot_reads_back_as_it_was_written_and_nothing_else_reads() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
        // kept to the microsecond, what a read from PostgreSQL gives
        let held = s.states[0].as_ref().unwrap();
        let t = held.last_attempt.unwrap();
        assert_eq!(t.timestamp_subsec_nanos() % 1000, 0);
        assert_eq!(
            (
                held.compliance,
                held.last_run,
                held.blocked,
                held.failure_count
            ),
            (
                Compliance::Compliant,
                LastRun::Successful,
                Blocked::NotBlocked,
                3
            )
        );
        // a word it does not write is refused, not read as a default
        let mut other_word = s.clone();
        other_word.states[0].as_mut().unwrap().compliance = Compliance::HasUpdate;
        let mut bytes_of_other = other_word.encode();
        let at = bytes_of_other
            .windows(10)
            .position(|w| w == b"has_update")
            .unwrap();
        bytes_of_other[at..at + 10].copy_from_slice(b"has_upd8te");
        assert!(matches!(
            Snapshot::decode(&bytes_of_other),
            Err(SnapshotError::Format)
        ));
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

    #[tokio::test]
    async fn snapshots_decoded_later_are_known_at_once_and_one_that_does_not_decode_is_given_to_no_start()
     {
        let whole = sample();
        let (env, version) = (whole.env, whole.version);
        let good = whole.encode();
        // its header reads, its body is cut inside the resources
        let cut = good[..good.len() / 2].to_vec();
        let mut file = Vec::new();
        let mut ranges = Vec::new();
        for bytes in [&cut, &good] {
            ranges.push(file.len()..file.len() + bytes.len());
            file.extend_from_slice(bytes);
        }
        let file = Arc::new(file);
        let mut coming = Snapshot::decode_later(file.clone(), ranges).unwrap();
        let second = coming.pop().unwrap();
        let first = coming.pop().unwrap();
        // what each is of comes from its header, before any decodes
        assert_eq!(
            (first.env, first.version, first.resources()),
            (env, version, 2)
        );
        assert_eq!(
            (second.env, second.version, second.resources()),
            (env, version, 2)
        );
        assert!(first.ready().await.is_none());
        let built = second.ready().await.expect("the whole snapshot's model");
        assert_eq!(
            (built.env, built.version, built.resources()),
            (env, version, 2)
        );
        // a header that does not read refuses the whole set
        let bad = Arc::new(b"STWSNAP\n\0".to_vec());
        let one_range = |r: Range<usize>| std::iter::once(r).collect::<Vec<_>>();
        assert!(Snapshot::decode_later(bad, one_range(0..9)).is_err());
        let short = Arc::new(good.clone());
        assert!(Snapshot::decode_later(short, one_range(0..good.len() + 1)).is_err());
    }

    #[tokio::test]
    async fn a_snapshot_whose_model_can_not_be_built_is_given_to_no_start() {
        // one state fewer than resources: building its model panics on its thread
        let mut broken = sample();
        broken.states.pop();
        let whole = sample();
        let (env, version) = (whole.env, whole.version);
        let mut coming = Snapshot::prepare_later(vec![broken, whole]);
        assert_eq!(coming.len(), 2);
        let second = coming.pop().unwrap();
        let first = coming.pop().unwrap();
        // what it is of is known before its model
        assert_eq!(
            (second.env, second.version, second.resources()),
            (env, version, 2)
        );
        // the start waiting for it reads the database instead (EnvScheduler::restore)
        assert!(first.ready().await.is_none());
        // and the snapshots after it on the same thread are built all the same
        let built = second.ready().await.expect("the next snapshot's model");
        assert_eq!(
            (built.env, built.version, built.resources()),
            (env, version, 2)
        );
    }
}
