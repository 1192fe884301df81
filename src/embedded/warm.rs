//! What `steward deploy` keeps between runs beside its database, in `DATA/warm`: the
//! snapshots its schedulers left when they stopped (`scheduler::snapshot`) and the store's
//! newest manifests (`store::versions::HeldManifest`), so the next run's scheduler builds
//! its model from one file, and its first store finds the newest version's manifest,
//! instead of reading every resource and state from a database that just started.
//!
//! Invariants:
//! - The file is written only after the private cluster stopped cleanly, with the digest of
//!   the cluster's control file then ([`PgCluster::control_stamp`]). It is used only when
//!   the digest is the same before the next start: PostgreSQL changes that file on every
//!   start and stop, so nobody (no other run, no `psql`, no server on the same data) can
//!   have changed the database in between. A run killed before its cluster stopped leaves
//!   no file; one killed after leaves a file whose digest no longer matches once anyone
//!   starts the cluster.
//! - It is taken (removed) when read: a snapshot is used by one start at most.
//! - A file that is cut short, altered or of another format (its checksum, its structure)
//!   is dropped, and the start reads the database as it always did.

use std::path::{Path, PathBuf};

use crate::model::codec::{Reader, Writer};
use crate::scheduler::snapshot::{Coming, Snapshot};
use crate::store::cluster::PgCluster;
use crate::store::versions::{HeldManifest, ReadyManifest};

const MAGIC: &[u8; 8] = b"STWWRM5\n";

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("warm")
}

/// What a run leaves for the next: its schedulers' snapshots and the store's newest
/// manifests.
#[derive(Debug, Default, PartialEq)]
pub struct Warm {
    pub snapshots: Vec<Snapshot>,
    pub manifests: Vec<HeldManifest>,
}

impl Warm {
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty() && self.manifests.is_empty()
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.snapshots.len() as u32);
        for s in &self.snapshots {
            let bytes = s.encode();
            w.i64(bytes.len() as i64);
            w.bytes(&bytes);
        }
        w.u32(self.manifests.len() as u32);
        for m in &self.manifests {
            m.encode(&mut w);
        }
        w.0
    }
}

/// What the last run left ([`take_prepared`]): each snapshot on its way to the model its
/// scheduler starts from, the manifests with their content trees.
#[derive(Default)]
pub struct Taken {
    pub prepared: Vec<Coming>,
    pub manifests: Vec<ReadyManifest>,
}

/// The snapshots and the manifests, decoded on two threads (at 100,000 resources each is
/// ~100 ms of allocation, on the way of every `steward deploy` that finds them), each
/// manifest made into what `each_manifest` makes of it on its thread (its content tree,
/// from its seals; else ~50-70 ms): beside the compile and the cluster's start.
fn decode_with<M: Send>(
    body: &[u8],
    each_manifest: impl Fn(HeldManifest) -> M + Send,
) -> Result<(Vec<Snapshot>, Vec<M>), &'static str> {
    let (ranges, mut r) = snapshot_ranges(body)?;
    let encoded: Vec<&[u8]> = ranges.into_iter().map(|at| &body[at]).collect();
    std::thread::scope(|scope| {
        let began = std::time::Instant::now();
        let manifests = scope.spawn(move || manifests(&mut r, each_manifest));
        // all decoded before any is made into a model: a file that does not decode to its
        // end is not used at all
        let snapshots = encoded
            .into_iter()
            .map(|bytes| Snapshot::decode(bytes).map_err(|_| "a snapshot does not decode"))
            .collect::<Result<Vec<_>, _>>();
        tracing::debug!(
            decoded_ms = began.elapsed().as_secs_f64() * 1e3,
            "the snapshots left are read"
        );
        let manifests = manifests
            .join()
            .unwrap_or(Err("decoding the manifests failed"))?;
        Ok((snapshots?, manifests))
    })
}

/// Where each encoded snapshot is in `body`, and the reader after the last one.
fn snapshot_ranges(body: &[u8]) -> Result<(Vec<std::ops::Range<usize>>, Reader<'_>), &'static str> {
    let mut r = Reader(body);
    let cut = |_| "the file is cut short";
    let count = r.count().map_err(cut)?;
    let mut ranges = Vec::with_capacity(count);
    for _ in 0..count {
        let len = usize::try_from(r.i64().map_err(cut)?).map_err(|_| "a length is negative")?;
        let at = body.len() - r.0.len();
        r.take(len).map_err(cut)?;
        ranges.push(at..at + len);
    }
    Ok((ranges, r))
}

/// The manifests at `r`, the rest of the file, each made into what `each_manifest` makes of
/// it.
fn manifests<M>(
    r: &mut Reader<'_>,
    each_manifest: impl Fn(HeldManifest) -> M,
) -> Result<Vec<M>, &'static str> {
    let began = std::time::Instant::now();
    let count = r.count().map_err(|_| "the file is cut short")?;
    let mut manifests = Vec::with_capacity(count);
    for _ in 0..count {
        manifests.push(HeldManifest::decode(r).map_err(|_| "a manifest does not decode")?);
    }
    if !r.is_empty() {
        return Err("bytes after the last manifest");
    }
    let decoded_ms = began.elapsed().as_secs_f64() * 1e3;
    let made = manifests.into_iter().map(each_manifest).collect();
    tracing::debug!(
        decoded_ms,
        made_ms = began.elapsed().as_secs_f64() * 1e3,
        "the manifests left are read"
    );
    Ok(made)
}

/// What the last run left, when the cluster is as it left it (call before the cluster
/// starts). The file is removed whatever it held.
pub fn take(data_dir: &Path, cluster: &PgCluster) -> Warm {
    take_stamped(data_dir, cluster.control_stamp())
}

/// [`take`], with the cluster's control stamp read before it started (`steward deploy`
/// decodes the file while its cluster starts), for a start: each snapshot is decoded and
/// made into its scheduler's model on a thread of its own, started first (the scheduler's
/// merge waits for it); the manifests are decoded here (the first store waits for them),
/// with their content trees. Returns once the manifests are read, while the snapshots still
/// decode. A file whose header, checksum, snapshot headers or manifests do not read is not
/// used at all; a snapshot whose body does not decode leaves its start to the database.
pub fn take_prepared(data_dir: &Path, stamp: Option<[u8; 32]>) -> Taken {
    let path = path(data_dir);
    let began = std::time::Instant::now();
    let Some(file) = taken(&path) else {
        return Taken::default();
    };
    let read_ms = began.elapsed().as_secs_f64() * 1000.0;
    let bytes = file.len();
    match prepared(std::sync::Arc::new(file), stamp) {
        Ok(taken) => {
            tracing::debug!(
                bytes,
                read_ms,
                decoded_ms = began.elapsed().as_secs_f64() * 1000.0,
                "what the last run left is read (its snapshots decode on)"
            );
            taken
        }
        Err(why) => {
            tracing::info!(file = %path.display(), why, "what the last run left is not used: the database is read");
            Taken::default()
        }
    }
}

fn prepared(
    file: std::sync::Arc<crate::model::mapped::Mapped>,
    stamp: Option<[u8; 32]>,
) -> Result<Taken, &'static str> {
    let body = body(&file, stamp)?;
    let body_at = file.len() - body.len();
    let (ranges, mut r) = snapshot_ranges(body)?;
    let ranges = ranges
        .into_iter()
        .map(|at| body_at + at.start..body_at + at.end)
        .collect();
    let prepared = Snapshot::decode_later(file.clone(), ranges)
        .map_err(|_| "a snapshot's header does not decode")?;
    let manifests = manifests(&mut r, HeldManifest::with_tree)?;
    Ok(Taken {
        prepared,
        manifests,
    })
}

/// The file at `path`, mapped (not read into a buffer of its own: 55 MB at 100,000
/// resources), and removed at once (the mapping keeps its bytes).
fn taken(path: &Path) -> Option<crate::model::mapped::Mapped> {
    let bytes = crate::model::mapped::Mapped::open(path).ok()?;
    let _ = std::fs::remove_file(path);
    Some(bytes)
}

fn take_stamped(data_dir: &Path, stamp: Option<[u8; 32]>) -> Warm {
    match take_with(data_dir, stamp, |m| m) {
        Some((snapshots, manifests)) => Warm {
            snapshots,
            manifests,
        },
        None => Warm::default(),
    }
}

fn take_with<M: Send>(
    data_dir: &Path,
    stamp: Option<[u8; 32]>,
    each_manifest: impl Fn(HeldManifest) -> M + Send,
) -> Option<(Vec<Snapshot>, Vec<M>)> {
    let path = path(data_dir);
    let began = std::time::Instant::now();
    let bytes = taken(&path)?;
    let read_ms = began.elapsed().as_secs_f64() * 1000.0;
    match body(&bytes, stamp).and_then(|body| decode_with(body, each_manifest)) {
        Ok(decoded) => {
            tracing::debug!(
                bytes = bytes.len(),
                read_ms,
                decoded_ms = began.elapsed().as_secs_f64() * 1000.0,
                "what the last run left is read"
            );
            Some(decoded)
        }
        Err(why) => {
            tracing::info!(file = %path.display(), why, "what the last run left is not used: the database is read");
            None
        }
    }
}

/// Keep `warm` for the next run (call after the cluster stopped).
pub fn keep(data_dir: &Path, cluster: &PgCluster, warm: &Warm) {
    let path = path(data_dir);
    let _ = std::fs::remove_file(&path);
    if warm.is_empty() {
        return;
    }
    let Some(stamp) = cluster.control_stamp() else {
        return;
    };
    let file = encode(warm, stamp);
    let tmp = data_dir.join(".warm.tmp");
    let written = std::fs::write(&tmp, &file).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!(file = %path.display(), error = %e, "what this run leaves for the next could not be written: the next run reads the database");
    }
}

fn encode(warm: &Warm, stamp: [u8; 32]) -> Vec<u8> {
    let body = warm.encode();
    let mut file = Vec::with_capacity(body.len() + 48);
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&stamp);
    file.extend_from_slice(&checksum(&body).to_le_bytes());
    file.extend_from_slice(&body);
    file
}

#[cfg(test)]
fn decode(bytes: &[u8], stamp: Option<[u8; 32]>) -> Result<Warm, &'static str> {
    let (snapshots, manifests) = decode_with(body(bytes, stamp)?, |m| m)?;
    Ok(Warm {
        snapshots,
        manifests,
    })
}

/// The body of a file whose header fits the cluster's control stamp and whose checksum is
/// right.
fn body(bytes: &[u8], stamp: Option<[u8; 32]>) -> Result<&[u8], &'static str> {
    let header = MAGIC.len() + 32 + 8;
    if bytes.len() < header || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a file of this version");
    }
    let Some(stamp) = stamp else {
        return Err("the database's control file can not be read");
    };
    if bytes[MAGIC.len()..MAGIC.len() + 32] != stamp {
        return Err("the database changed since it was written");
    }
    let sum = u64::from_le_bytes(bytes[MAGIC.len() + 32..header].try_into().expect("8"));
    let body = &bytes[header..];
    if checksum(body) != sum {
        return Err("its checksum does not match (the file is damaged)");
    }
    Ok(body)
}

/// A fast checksum against a damaged file (a crash after the rename, a cut copy), not
/// against a forger: whoever can write the data dir can write the database too. Four lanes
/// of 8 bytes each, folded at the end: one lane is a chain of multiplies, each waiting for
/// the last (55 MB at 100,000 resources: ~15 ms on the way of every start; four: ~4 ms).
fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(K).rotate_left(29);
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8"));
    let mut lanes = [0u64, 1, 2, 3].map(|i| bytes.len() as u64 ^ K.wrapping_mul(i + 1));
    let mut blocks = bytes.chunks_exact(32);
    for b in &mut blocks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = mix(*lane, word(&b[i * 8..i * 8 + 8]));
        }
    }
    let mut h = lanes.into_iter().fold(K, mix);
    let mut rest = blocks.remainder().chunks_exact(8);
    for c in &mut rest {
        h = mix(h, word(c));
    }
    for &b in rest.remainder() {
        h = mix(h, b as u64);
    }
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_foreign_file_is_never_used() {
        let warm = Warm {
            snapshots: vec![Snapshot {
                env: uuid::Uuid::new_v4(),
                version: 3,
                resources: Vec::new(),
                states: Vec::new(),
            }],
            manifests: Vec::new(),
        };
        let stamp = [7u8; 32];
        let file = encode(&warm, stamp);
        assert_eq!(decode(&file, Some(stamp)).unwrap(), warm);
        // another state of the database
        assert!(decode(&file, Some([8u8; 32])).is_err());
        assert!(decode(&file, None).is_err());
        // any byte of the body changed, or the file cut anywhere
        for at in MAGIC.len() + 32..file.len() {
            let mut bad = file.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, Some(stamp)).is_err(), "byte {at} changed");
        }
        for cut in 0..file.len() {
            assert!(decode(&file[..cut], Some(stamp)).is_err(), "cut at {cut}");
        }
    }
}
