//! The newest versions' manifests, kept in memory between stores, and handed from a process
//! that stops cleanly to the next one (`steward deploy`, whose private database nobody
//! changes in between: `embedded::warm` checks that).
//!
//! Invariants: an entry is used only for the version number and content hash the database
//! says are the environment's newest ([`cached`], under the environment's row lock), so a
//! store by another replica, a deletion, or a manifest from an earlier process that does not
//! fit is never used; the cache is bounded by the resources it holds.

use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::spans::Entry;
use super::write::Manifest;
use crate::model::codec::{CodecError, Reader, Writer};
use crate::model::content::{self, ContentTree, Seal};

// Bounded by resources held, so a few large environments do not hold the memory of many.
const CACHE_RESOURCES: usize = 1_000_000;

struct CachedManifest {
    env: Uuid,
    number: i32,
    content_hash: String,
    manifest: Arc<Manifest>,
    /// its content tree (taken by the store that reads it: the next version's is made from it)
    tree: TreeSlot,
}

/// A cached manifest's content tree, as a store finds it.
#[derive(Default)]
pub(super) enum TreeSlot {
    Ready(ContentTree),
    /// taken by a store, or never made
    #[default]
    None,
}

impl TreeSlot {
    /// The tree (`None`: the store makes its own).
    pub(super) fn take(self) -> Option<ContentTree> {
        match self {
            TreeSlot::Ready(tree) => Some(tree),
            TreeSlot::None => None,
        }
    }
}

static CACHE: Mutex<Vec<CachedManifest>> = Mutex::new(Vec::new());

pub(super) fn cached(
    env: Uuid,
    number: i32,
    content_hash: &str,
) -> Option<(Arc<Manifest>, TreeSlot)> {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .iter_mut()
        .find(|m| m.env == env && m.number == number && m.content_hash == content_hash)
        .map(|m| (m.manifest.clone(), std::mem::take(&mut m.tree)))
}

/// The manifest of `env`'s version `number` with `content_hash`, if the cache holds it (a
/// reader: its content tree stays for the next store).
pub(super) fn manifest_of(env: Uuid, number: i32, content_hash: &str) -> Option<Arc<Manifest>> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .iter()
        .find(|m| m.env == env && m.number == number && m.content_hash == content_hash)
        .map(|m| m.manifest.clone())
}

/// Drop the environment's manifest from the cache (it is being made the next version's).
pub(super) fn forget_cached(env: Uuid) {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|m| m.env != env);
}

pub(super) fn remember(
    env: Uuid,
    number: i32,
    content_hash: &str,
    manifest: Arc<Manifest>,
    tree: ContentTree,
) {
    remember_with(env, number, content_hash, manifest, TreeSlot::Ready(tree));
}

fn remember_with(
    env: Uuid,
    number: i32,
    content_hash: &str,
    manifest: Arc<Manifest>,
    tree: TreeSlot,
) {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|m| m.env != env);
    if manifest.len() > CACHE_RESOURCES {
        return;
    }
    cache.push(CachedManifest {
        env,
        number,
        content_hash: content_hash.to_string(),
        manifest,
        tree,
    });
    // oldest first out
    while cache.iter().map(|m| m.manifest.len()).sum::<usize>() > CACHE_RESOURCES {
        cache.remove(0);
    }
}

/// `tree` (the content tree of the base version, whose resources `base` gives) ready for
/// changes to the resources `touched`: the buckets it knows by their seals only that
/// `touched` falls in are opened with the base's lines. `None` when those lines do not hash
/// to their seals (the store then makes the new version's tree from every line).
/// `base` is handed the buckets wanted and gives (at least) the base's resources in them.
pub(super) fn ready_for<'a, 'b, I>(
    mut tree: ContentTree,
    base: impl FnOnce(Wanted) -> I,
    touched: impl Iterator<Item = &'a str>,
) -> Option<ContentTree>
where
    I: Iterator<Item = (&'b str, &'b Entry)>,
{
    let opened = tree.open_touched(touched, |wanted| {
        base(Wanted::of(&wanted))
            .map(|(id, e)| (id, e.hash.as_str(), e.requires.as_slice(), e.undefined))
    });
    opened.then_some(tree)
}

/// Which content buckets a store opens: a copy for each filter that asks.
#[derive(Clone, Copy)]
pub(super) struct Wanted([u64; content::BUCKETS / 64]);

impl Wanted {
    fn of(flags: &[bool]) -> Wanted {
        let mut bits = [0u64; content::BUCKETS / 64];
        for (b, _) in flags.iter().enumerate().filter(|(_, w)| **w) {
            bits[b / 64] |= 1 << (b % 64);
        }
        Wanted(bits)
    }

    /// Whether `e` is in a wanted bucket (by the bucket it carries).
    pub(super) fn holds(&self, e: &Entry) -> bool {
        let b = usize::from(e.bucket);
        self.0.get(b / 64).is_some_and(|w| w & (1 << (b % 64)) != 0)
    }
}

/// The content tree of a manifest (what a store makes when the cache has none).
pub(super) fn tree_of(manifest: &Manifest) -> ContentTree {
    ContentTree::of(manifest.iter().map(|(id, e)| {
        (
            id.as_str(),
            e.hash.as_str(),
            e.requires.as_slice(),
            e.undefined,
        )
    }))
}

/// An environment's newest manifest as the store held it.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldManifest {
    pub env: Uuid,
    pub number: i32,
    pub content_hash: String,
    manifest: Arc<Manifest>,
    /// Its content tree's seals, when the store held its tree: the next process makes the
    /// tree from them (1,024 digests) instead of hashing every line (100,000 resources:
    /// ~50-70 ms beside the compile, on every `steward deploy`).
    seals: Option<Vec<Seal>>,
}

/// The manifests the store holds now (for a process that stops: see the module's note).
pub fn held_manifests() -> Vec<HeldManifest> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .iter()
        .map(|m| HeldManifest {
            env: m.env,
            number: m.number,
            content_hash: m.content_hash.clone(),
            manifest: m.manifest.clone(),
            seals: match &m.tree {
                TreeSlot::Ready(tree) if tree.len() == m.manifest.len() => Some(tree.seals()),
                _ => None,
            },
        })
        .collect()
}

/// A held manifest with its content tree made (from its seals, or from every line: 100,000
/// resources ~50-70 ms), on the thread that decoded it from what a stopped process left
/// ([`HeldManifest::with_tree`]).
pub struct ReadyManifest(HeldManifest, ContentTree);

impl ReadyManifest {
    pub fn resources(&self) -> usize {
        self.0.resources()
    }
}

/// Take what a stopped process held, for a database nobody changed since: the first store
/// of each environment finds its newest manifest and that manifest's content tree.
pub fn offer_manifests(held: Vec<ReadyManifest>) {
    for ReadyManifest(h, tree) in held {
        remember_with(
            h.env,
            h.number,
            &h.content_hash,
            h.manifest,
            TreeSlot::Ready(tree),
        );
    }
}

impl HeldManifest {
    pub fn resources(&self) -> usize {
        self.manifest.len()
    }

    /// This manifest with its content tree made (the store takes both: [`offer_manifests`]):
    /// from its seals when it has them (a store opens the buckets it changes, checking their
    /// lines against the seals: [`ready_for`]), else from every line.
    pub fn with_tree(self) -> ReadyManifest {
        let tree = match self.seals.as_deref().and_then(ContentTree::from_seals) {
            Some(tree) if tree.len() == self.manifest.len() => tree,
            _ => tree_of(&self.manifest),
        };
        ReadyManifest(self, tree)
    }

    /// How this manifest differs from the environment's newest version in `pool` (empty:
    /// a store would read the same). For tests, and for anyone who doubts one.
    pub async fn differences_from_database(
        &self,
        pool: &sqlx::PgPool,
    ) -> crate::store::Result<Vec<String>> {
        let newest: Option<(i32, String)> = sqlx::query_as(
            "SELECT number, content_hash FROM versions WHERE environment_id = $1 ORDER BY number DESC LIMIT 1",
        )
        .bind(self.env)
        .fetch_optional(pool)
        .await?;
        let mut found = Vec::new();
        if newest != Some((self.number, self.content_hash.clone())) {
            found.push(format!(
                "newest version {newest:?}, held {} {}",
                self.number, self.content_hash
            ));
        }
        let stored = super::resource_digests(pool, self.env, self.number).await?;
        if stored.len() != self.manifest.len() {
            found.push(format!(
                "{} resources stored, {} held",
                stored.len(),
                self.manifest.len()
            ));
        }
        if let Some(seals) = &self.seals
            && *seals != tree_of(&self.manifest).seals()
        {
            found.push("the held content tree's seals are not its lines'".to_string());
        }
        for r in stored {
            let same = self.manifest.get(&r.resource_id).is_some_and(|e| {
                e.resource_type == r.resource_type
                    && e.agent == r.agent
                    && e.hash == r.hash
                    && e.requires == r.requires
                    && e.undefined == r.undefined
            });
            if !same {
                found.push(format!("resource {} differs", r.resource_id));
            }
        }
        Ok(found)
    }

    pub fn encode(&self, w: &mut Writer) {
        w.bytes(self.env.as_bytes());
        w.i64(self.number as i64);
        w.str(&self.content_hash);
        w.u32(self.manifest.len() as u32);
        for (id, e) in self.manifest.iter() {
            w.str(id);
            w.str(&e.resource_type);
            w.str(&e.agent);
            w.str(&e.hash);
            w.strs(&e.requires);
            w.u8(e.undefined as u8);
            w.u32(u32::from(e.bucket));
        }
        match &self.seals {
            Some(seals) => {
                w.u32(seals.len() as u32);
                for (digest, lines) in seals {
                    w.bytes(digest);
                    w.u32(*lines);
                }
            }
            None => w.u32(0),
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<HeldManifest, CodecError> {
        let env = Uuid::from_slice(r.take(16)?).map_err(|_| CodecError::Invalid)?;
        let number = i32::try_from(r.i64()?).map_err(|_| CodecError::Invalid)?;
        let content_hash = r.string()?;
        let n = r.count()?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.string()?;
            let entry = Entry {
                resource_type: r.string()?,
                agent: r.string()?,
                hash: r.string()?,
                requires: r.strings()?,
                undefined: r.u8()? != 0,
                bucket: u16::try_from(r.u32()?).map_err(|_| CodecError::Invalid)?,
            };
            entries.push((id, entry));
        }
        // written in the map's order: built in one pass, not by 100,000 inserts (a map
        // from entries out of order, or with an id twice, is the same as by inserts)
        let manifest: Manifest = entries.into_iter().collect();
        let count = r.count()?;
        let seals = if count == 0 {
            None
        } else {
            let mut seals = Vec::with_capacity(count);
            for _ in 0..count {
                let digest: [u8; 32] = r.take(32)?.try_into().map_err(|_| CodecError::Invalid)?;
                seals.push((digest, r.u32()?));
            }
            Some(seals)
        };
        Ok(HeldManifest {
            env,
            number,
            content_hash,
            manifest: Arc::new(manifest),
            seals,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` files, file `i` requiring the `chain(i)` files before it; the last undefined
    /// when `last_undefined`.
    fn files(n: usize, chain: impl Fn(usize) -> usize, last_undefined: bool) -> Manifest {
        (0..n)
            .map(|i| {
                let entry = Entry {
                    resource_type: "fs::File".into(),
                    agent: "a".into(),
                    hash: format!("h{i}"),
                    requires: (i - chain(i)..i)
                        .map(|q| format!("fs::File[a,path=/f{q}]"))
                        .collect(),
                    undefined: last_undefined && i == n - 1,
                    bucket: content::bucket(&format!("fs::File[a,path=/f{i}]")),
                };
                (format!("fs::File[a,path=/f{i}]"), entry)
            })
            .collect()
    }

    #[test]
    fn a_held_manifest_reads_back_and_a_cut_one_never_does() {
        let manifest = files(3, |i| i, true);
        let held = HeldManifest {
            env: Uuid::new_v4(),
            number: 12,
            content_hash: "c".repeat(64),
            manifest: Arc::new(manifest),
            seals: None,
        };
        let mut w = Writer::default();
        held.encode(&mut w);
        let mut r = Reader(&w.0);
        assert_eq!(HeldManifest::decode(&mut r).unwrap(), held);
        assert!(r.is_empty());
        for cut in 0..w.0.len() {
            assert!(
                HeldManifest::decode(&mut Reader(&w.0[..cut])).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn an_offered_manifests_tree_is_handed_to_the_first_store_only() {
        let manifest = files(20_000, |i| i.min(1), false);
        let expected = tree_of(&manifest).root();
        let env = Uuid::new_v4();
        let hash = "d".repeat(64);
        offer_manifests(vec![
            HeldManifest {
                env,
                number: 3,
                content_hash: hash.clone(),
                manifest: Arc::new(manifest),
                seals: None,
            }
            .with_tree(),
        ]);
        let (held, tree) = cached(env, 3, &hash).expect("offered manifest cached");
        assert_eq!(held.len(), 20_000);
        let mut tree = tree.take().expect("the offered tree");
        assert_eq!(tree.root(), expected);
        // taken: a second look (another version's store) gets the manifest without a tree
        let (_, again) = cached(env, 3, &hash).expect("still cached");
        assert!(again.take().is_none());
        assert!(cached(env, 4, &hash).is_none());
        forget_cached(env);
    }

    #[test]
    fn a_tree_made_from_its_seals_gives_the_content_hash_of_every_line_after_changes() {
        let base = files(5_000, |i| i.min(2), false);
        let mut whole = tree_of(&base);
        whole.root();
        let held = HeldManifest {
            env: Uuid::new_v4(),
            number: 4,
            content_hash: "e".repeat(64),
            manifest: Arc::new(base.clone()),
            seals: Some(whole.seals()),
        };
        // through the file's encoding, as the next process reads it
        let mut w = Writer::default();
        held.encode(&mut w);
        let held = HeldManifest::decode(&mut Reader(&w.0)).unwrap();
        let ReadyManifest(held, sealed) = held.with_tree();
        assert!(sealed.is_sealed("fs::File[a,path=/f10]"));
        let mut next = base.clone();
        let changed = "fs::File[a,path=/f10]".to_string();
        next.get_mut(&changed).unwrap().hash = "changed".into();
        let gone = "fs::File[a,path=/f11]".to_string();
        next.remove(&gone);
        let new = "fs::File[a,path=/new]".to_string();
        let made = Entry {
            bucket: content::bucket(&new),
            ..next[&changed].clone()
        };
        next.insert(new.clone(), made);
        let touched = [changed.as_str(), gone.as_str(), new.as_str()];
        let lines = |_| held.manifest.iter().map(|(id, e)| (id.as_str(), e));
        let mut tree = ready_for(sealed, lines, touched.into_iter()).expect("opens");
        tree.remove(&gone);
        tree.remove(&changed);
        for id in [&changed, &new] {
            let e = &next[id];
            tree.insert(id, &e.hash, &e.requires, e.undefined);
        }
        assert_eq!(tree.root(), tree_of(&next).root());
        // a seal its lines do not hash to is found out when its bucket opens
        let mut bad = whole.seals();
        let b = usize::from(content::bucket(&changed));
        bad[b].0[0] ^= 1;
        let bad = ContentTree::from_seals(&bad).unwrap();
        let lines = |_| base.iter().map(|(id, e)| (id.as_str(), e));
        assert!(ready_for(bad, lines, [changed.as_str()].into_iter()).is_none());
        // a base without the bucket's lines does not open it
        let sealed = ContentTree::from_seals(&whole.seals()).unwrap();
        assert!(
            ready_for(
                sealed,
                |_| std::iter::empty(),
                [changed.as_str()].into_iter()
            )
            .is_none()
        );
        // nor does one whose entries carry the wrong bucket (the right lines filtered by it)
        let sealed = ContentTree::from_seals(&whole.seals()).unwrap();
        let misfiled: Manifest = base
            .iter()
            .map(|(id, e)| {
                let bucket = if *id == changed {
                    e.bucket ^ 1
                } else {
                    e.bucket
                };
                (
                    id.clone(),
                    Entry {
                        bucket,
                        ..e.clone()
                    },
                )
            })
            .collect();
        let lines = |wanted: Wanted| {
            misfiled
                .iter()
                .filter(move |(_, e)| wanted.holds(e))
                .map(|(id, e)| (id.as_str(), e))
        };
        assert!(ready_for(sealed, lines, [changed.as_str()].into_iter()).is_none());
    }
}
