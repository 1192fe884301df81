//! What `steward deploy` keeps between runs beside its database: the snapshots its
//! schedulers left when they stopped (`scheduler::snapshot`), in `DATA/warm`, so the next
//! run's scheduler builds its model from one file instead of reading every resource and
//! state from a database that just started.
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

use crate::scheduler::snapshot::Snapshot;
use crate::store::cluster::PgCluster;

const MAGIC: &[u8; 8] = b"STWWARM\n";

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("warm")
}

/// The snapshots the last run left, when the cluster is as it left it (call before the
/// cluster starts). The file is removed whatever it held.
pub fn take(data_dir: &Path, cluster: &PgCluster) -> Vec<Snapshot> {
    take_stamped(data_dir, cluster.control_stamp())
}

/// [`take`], with the cluster's control stamp read before it started (`steward deploy`
/// decodes the file while its cluster starts).
pub fn take_stamped(data_dir: &Path, stamp: Option<[u8; 32]>) -> Vec<Snapshot> {
    let path = path(data_dir);
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    let _ = std::fs::remove_file(&path);
    match decode(&bytes, stamp) {
        Ok(snapshots) => snapshots,
        Err(why) => {
            tracing::info!(file = %path.display(), why, "the schedulers' snapshot is not used: they read the database");
            Vec::new()
        }
    }
}

/// Keep `snapshots` for the next run (call after the cluster stopped).
pub fn keep(data_dir: &Path, cluster: &PgCluster, snapshots: &[Snapshot]) {
    let path = path(data_dir);
    let _ = std::fs::remove_file(&path);
    if snapshots.is_empty() {
        return;
    }
    let Some(stamp) = cluster.control_stamp() else {
        return;
    };
    let mut body = Vec::new();
    body.extend_from_slice(&(snapshots.len() as u32).to_le_bytes());
    for s in snapshots {
        let bytes = s.encode();
        body.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        body.extend_from_slice(&bytes);
    }
    let mut file = Vec::with_capacity(body.len() + 48);
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&stamp);
    file.extend_from_slice(&checksum(&body).to_le_bytes());
    file.extend_from_slice(&body);
    let tmp = data_dir.join(".warm.tmp");
    let written = std::fs::write(&tmp, &file).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!(file = %path.display(), error = %e, "the schedulers' snapshot could not be written: the next run reads the database");
    }
}

fn decode(bytes: &[u8], stamp: Option<[u8; 32]>) -> Result<Vec<Snapshot>, &'static str> {
    let header = MAGIC.len() + 32 + 8;
    if bytes.len() < header || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a snapshot file");
    }
    let Some(stamp) = stamp else {
        return Err("the database's control file can not be read");
    };
    if bytes[MAGIC.len()..MAGIC.len() + 32] != stamp {
        return Err("the database changed since it was written");
    }
    let sum = u64::from_le_bytes(bytes[MAGIC.len() + 32..header].try_into().expect("8"));
    let mut body = &bytes[header..];
    if checksum(body) != sum {
        return Err("its checksum does not match (the file is damaged)");
    }
    let mut take = |n: usize| -> Result<&[u8], &'static str> {
        if body.len() < n {
            return Err("the file is cut short");
        }
        let (head, rest) = body.split_at(n);
        body = rest;
        Ok(head)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4"));
    let mut snapshots = Vec::new();
    for _ in 0..count {
        let len = u64::from_le_bytes(take(8)?.try_into().expect("8"));
        let bytes = take(usize::try_from(len).map_err(|_| "the file is cut short")?)?;
        snapshots.push(Snapshot::decode(bytes).map_err(|_| "a snapshot does not decode")?);
    }
    if !body.is_empty() {
        return Err("bytes after the last snapshot");
    }
    Ok(snapshots)
}

/// A fast checksum against a damaged file (a crash after the rename, a cut copy), not
/// against a forger: whoever can write the data dir can write the database too.
fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = bytes.len() as u64 ^ K;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8"));
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(K).rotate_left(29);
    }
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_foreign_file_is_never_used() {
        let snapshot = Snapshot {
            env: uuid::Uuid::new_v4(),
            version: 3,
            resources: Vec::new(),
            states: Vec::new(),
        };
        let stamp = [7u8; 32];
        let mut body = Vec::new();
        body.extend_from_slice(&1u32.to_le_bytes());
        let enc = snapshot.encode();
        body.extend_from_slice(&(enc.len() as u64).to_le_bytes());
        body.extend_from_slice(&enc);
        let mut file = MAGIC.to_vec();
        file.extend_from_slice(&stamp);
        file.extend_from_slice(&checksum(&body).to_le_bytes());
        file.extend_from_slice(&body);
        assert_eq!(decode(&file, Some(stamp)).unwrap(), vec![snapshot]);
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
