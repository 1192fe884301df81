//! The content hash of a version, kept as a tree so that a change costs what it changes.
//!
//! A version's content hash covers each of its resources' *line*: the canonical JSON of
//! `[id, attribute hash, sorted requires, undefined]`. Approvals are bound to it; the server
//! computes it at every store; a client sending changes computes it to show that the version
//! the server makes from them is the one it has. One SHA-256 over all the lines in id order
//! (the first format) made every change cost the whole version: 61 ms for the client and
//! ~15 ms for the server at 100,000 resources, to change one.
//!
//! So the lines are grouped in [`BUCKETS`] buckets by a fixed hash of the id (64-bit
//! FNV-1a). A line's SHA-256 is its *leaf*; a bucket's digest is the SHA-256 of its leaves in
//! id order; the content hash is the SHA-256 of [`TAG`] followed by, for each bucket that
//! holds a line, its number (two bytes, big-endian) and its digest. A [`ContentTree`] keeps
//! the leaves and digests: changing one resource hashes its line, its bucket's leaves
//! (1/1024 of the version) and the bucket digests (32 KiB at most).
//!
//! Every input is bound under SHA-256 (the ids are inside the lines, the order is id order
//! in a bucket and bucket order at the root), so two versions share a content hash only if
//! SHA-256 collides. The bucket function is not secret: a sender that puts all of its ids in
//! one bucket makes its own changes cost a hash over 32 bytes per resource, no more.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Buckets of a [`ContentTree`].
pub const BUCKETS: usize = 1024;

/// What the root hash starts with (names the format: the first one had no tree).
pub const TAG: &[u8] = b"steward content hash 2\n";

/// The lines of a version's resources by bucket, with each bucket's digest when it is known.
#[derive(Clone, Debug, Default)]
pub struct ContentTree {
    /// empty until the first line; then [`BUCKETS`] of them
    buckets: Vec<Bucket>,
    len: usize,
}

#[derive(Clone, Debug, Default)]
struct Bucket {
    leaves: BTreeMap<Box<str>, [u8; 32]>,
    /// `None`: changed since it was last hashed
    digest: Option<[u8; 32]>,
    /// Lines it holds that are not in `leaves`: a bucket known by its [`Seal`] only (its
    /// digest is then known, and `leaves` is empty).
    sealed: u32,
}

/// What a tree needs of a bucket it was not given the lines of: its digest and how many
/// lines it holds ([`ContentTree::seals`]).
pub type Seal = ([u8; 32], u32);

impl ContentTree {
    /// A tree of `entries`: `(id, attribute hash, requires, undefined)`. Each leaf is
    /// hashed once (on every core for a large version) and each bucket is built from its
    /// sorted leaves.
    pub fn of<'a, Q: AsRef<str> + Sync + 'a>(
        entries: impl Iterator<Item = (&'a str, &'a str, &'a [Q], bool)>,
    ) -> ContentTree {
        let entries: Vec<_> = entries.collect();
        let leaves = super::par_map(&entries, |&(id, hash, requires, undefined)| {
            let mut line = Vec::with_capacity(256);
            write_line(id, hash, requires, undefined, &mut line);
            let leaf: [u8; 32] = Sha256::digest(&line[..]).into();
            (bucket_of(id) as u16, id, leaf)
        });
        // by bucket first (one pass), then each bucket by id: ids share long prefixes, and
        // sorting 100 of them 1,000 times is a third of the comparisons of sorting 100,000
        let mut by_bucket: Vec<Vec<(&str, [u8; 32])>> = vec![Vec::new(); BUCKETS];
        for (number, id, leaf) in leaves {
            by_bucket[usize::from(number)].push((id, leaf));
        }
        let mut tree = ContentTree {
            buckets: vec![Bucket::default(); BUCKETS],
            len: 0,
        };
        for (bucket, mut leaves) in tree.buckets.iter_mut().zip(by_bucket) {
            leaves.sort_unstable_by(|a, b| a.0.cmp(b.0));
            // sorted: the map is built in one pass (an id given twice is held once; a store
            // refuses such a version)
            bucket.leaves = leaves
                .into_iter()
                .map(|(id, leaf)| (id.into(), leaf))
                .collect();
            tree.len += bucket.leaves.len();
        }
        tree
    }

    /// A tree that knows each bucket by its [`Seal`] only (from [`ContentTree::seals`] of
    /// a tree holding the same lines). A bucket must be [`ContentTree::open`]ed before a
    /// line in it changes: a change to one resource of 100,000 then hashes the hundred
    /// lines of its bucket, not 100,000. `None`: not [`BUCKETS`] seals.
    pub fn from_seals(seals: &[Seal]) -> Option<ContentTree> {
        if seals.len() != BUCKETS {
            return None;
        }
        Some(ContentTree {
            buckets: seals
                .iter()
                .map(|&(digest, sealed)| Bucket {
                    leaves: BTreeMap::new(),
                    digest: (sealed > 0).then_some(digest),
                    sealed,
                })
                .collect(),
            len: seals.iter().map(|&(_, n)| n as usize).sum(),
        })
    }

    /// Whether the bucket `id` falls in is known by its seal only.
    pub fn is_sealed(&self, id: &str) -> bool {
        self.buckets
            .get(bucket_of(id))
            .is_some_and(|b| b.sealed > 0)
    }

    /// Give sealed buckets their lines: every line of each bucket opened, which must hash
    /// to its seal. `false` (the tree is then of no use): a line of a bucket that is not
    /// sealed, or lines that are not what a seal says.
    #[must_use]
    pub fn open<'a, Q: AsRef<str> + 'a>(
        &mut self,
        lines: impl Iterator<Item = (&'a str, &'a str, &'a [Q], bool)>,
    ) -> bool {
        let mut opened = vec![false; self.buckets.len()];
        for (id, hash, requires, undefined) in lines {
            let number = bucket_of(id);
            let Some(bucket) = self.buckets.get_mut(number) else {
                return false;
            };
            if bucket.sealed == 0 {
                return false;
            }
            opened[number] = true;
            let mut line = Vec::with_capacity(256);
            write_line(id, hash, requires, undefined, &mut line);
            bucket
                .leaves
                .insert(id.into(), Sha256::digest(&line[..]).into());
        }
        for (bucket, _) in self.buckets.iter_mut().zip(opened).filter(|(_, o)| *o) {
            if bucket.leaves.len() != bucket.sealed as usize
                || bucket.digest != Some(digest_of(&bucket.leaves))
            {
                return false;
            }
            bucket.sealed = 0;
        }
        true
    }

    /// Ready for changes to the lines of `touched`: the buckets known by their seals only
    /// that `touched` falls in are [`ContentTree::open`]ed with the lines `lines` gives for
    /// them (it is handed which buckets are wanted, one flag per bucket, and may give more).
    /// `false` (the tree is then of no use): those lines do not hash to their seals, or a
    /// touched bucket was given none and stays sealed.
    #[must_use]
    pub fn open_touched<'a, 'b, Q, I>(
        &mut self,
        touched: impl Iterator<Item = &'a str>,
        lines: impl FnOnce(Vec<bool>) -> I,
    ) -> bool
    where
        Q: AsRef<str> + 'b,
        I: Iterator<Item = (&'b str, &'b str, &'b [Q], bool)>,
    {
        let mut wanted = vec![false; BUCKETS];
        let mut ids = Vec::new();
        for id in touched.filter(|id| self.is_sealed(id)) {
            wanted[bucket_of(id)] = true;
            ids.push(id);
        }
        if ids.is_empty() {
            return true;
        }
        self.open(lines(wanted)) && !ids.iter().any(|id| self.is_sealed(id))
    }

    /// Each bucket's [`Seal`] (an empty tree has none), to make the tree again with
    /// [`ContentTree::from_seals`] without hashing every line.
    pub fn seals(&self) -> Vec<Seal> {
        self.buckets
            .iter()
            .map(|b| {
                let digest = b.digest.unwrap_or_else(|| digest_of(&b.leaves));
                (digest, b.sealed + b.leaves.len() as u32)
            })
            .collect()
    }

    /// How many resources it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Set the line of `id` (adding it, or replacing what it was).
    pub fn insert<Q: AsRef<str>>(&mut self, id: &str, hash: &str, requires: &[Q], undefined: bool) {
        let mut line = Vec::with_capacity(256);
        write_line(id, hash, requires, undefined, &mut line);
        let leaf: [u8; 32] = Sha256::digest(&line[..]).into();
        if self.buckets.is_empty() {
            self.buckets = vec![Bucket::default(); BUCKETS];
        }
        let bucket = &mut self.buckets[bucket_of(id)];
        debug_assert_eq!(bucket.sealed, 0, "a change to a bucket known by its seal");
        bucket.digest = None;
        if bucket.leaves.insert(id.into(), leaf).is_none() {
            self.len += 1;
        }
    }

    /// Take `id` out (nothing when it is not there).
    pub fn remove(&mut self, id: &str) {
        if self.buckets.is_empty() {
            return;
        }
        let bucket = &mut self.buckets[bucket_of(id)];
        debug_assert_eq!(bucket.sealed, 0, "a change to a bucket known by its seal");
        if bucket.leaves.remove(id).is_some() {
            bucket.digest = None;
            self.len -= 1;
        }
    }

    /// The content hash of what it holds (lower-case hex), hashing only the buckets changed
    /// since the last call.
    pub fn root(&mut self) -> String {
        let mut h = Sha256::new();
        h.update(TAG);
        for (number, bucket) in self.buckets.iter_mut().enumerate() {
            if bucket.leaves.is_empty() && bucket.sealed == 0 {
                continue;
            }
            let digest = *bucket
                .digest
                .get_or_insert_with(|| digest_of(&bucket.leaves));
            // BUCKETS fits two bytes
            h.update((number as u16).to_be_bytes());
            h.update(digest);
        }
        super::hex_lower(&h.finalize())
    }
}

/// A bucket's digest: the SHA-256 of its leaves in id order.
fn digest_of(leaves: &BTreeMap<Box<str>, [u8; 32]>) -> [u8; 32] {
    let mut b = Sha256::new();
    for leaf in leaves.values() {
        b.update(leaf);
    }
    b.finalize().into()
}

/// The bucket `id` falls in (see [`ContentTree::from_seals`]).
pub fn bucket(id: &str) -> u16 {
    bucket_of(id) as u16
}

/// The bucket of an id: 64-bit FNV-1a of its bytes (fixed: it is part of the format).
fn bucket_of(id: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % BUCKETS as u64) as usize
}

/// A resource's line: the canonical JSON of `[id, hash, sorted requires, undefined]` and a
/// newline, written straight into `out` (the text `canonical_json` gives; tested below).
fn write_line<Q: AsRef<str>>(
    id: &str,
    hash: &str,
    requires: &[Q],
    undefined: bool,
    out: &mut Vec<u8>,
) {
    out.push(b'[');
    super::write_json_string(id, out);
    out.push(b',');
    super::write_json_string(hash, out);
    out.extend_from_slice(b",[");
    let mut req: Vec<&str> = requires.iter().map(AsRef::as_ref).collect();
    req.sort_unstable();
    for (i, r) in req.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        super::write_json_string(r, out);
    }
    out.extend_from_slice(if undefined {
        b"],true]\n"
    } else {
        b"],false]\n"
    });
}

/// The content hash of a version's resources, computed whole (see [`ContentTree`]).
pub fn content_hash<'a, Q: AsRef<str> + Sync + 'a>(
    entries: impl Iterator<Item = (&'a str, &'a str, &'a [Q], bool)>,
) -> String {
    ContentTree::of(entries).root()
}

/// The content hash of a version: the content hash of its resources (`resources_hash`, a
/// [`ContentTree::root`]), then its handler code (an approval covers the code too: other
/// code, another content hash).
pub fn with_handlers(
    resources_hash: String,
    handlers: &BTreeMap<String, super::HandlerCode>,
) -> String {
    if handlers.is_empty() {
        return resources_hash;
    }
    let mut h = Sha256::new();
    h.update(resources_hash.as_bytes());
    for (ty, code) in handlers {
        h.update(format!("\n{ty}={}", code.digest).as_bytes());
    }
    hex::encode(h.finalize())
}

/// [`with_handlers`] of the [`content_hash`] of `entries`.
pub fn version_hash<'a, Q: AsRef<str> + Sync + 'a>(
    entries: impl Iterator<Item = (&'a str, &'a str, &'a [Q], bool)>,
    handlers: &BTreeMap<String, super::HandlerCode>,
) -> String {
    with_handlers(content_hash(entries), handlers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::canonical_json;

    /// The format, written out the long way: canonical JSON lines, leaves, buckets by
    /// FNV-1a, the tagged root.
    #[test]
    fn content_hash_is_the_documented_tree() {
        let req = vec!["b\"q".to_string(), "a".to_string()];
        let none: Vec<String> = vec![];
        let entries = [
            ("t[x,n=2]", "h2", none.as_slice(), true),
            ("t[x,n=1]", "h1", req.as_slice(), false),
            ("u[y,n=1]", "h3", none.as_slice(), false),
        ];
        let mut buckets: BTreeMap<u16, BTreeMap<&str, Vec<u8>>> = BTreeMap::new();
        for (id, hash, requires, undefined) in entries {
            let mut sorted: Vec<&String> = requires.iter().collect();
            sorted.sort();
            let mut text = String::new();
            canonical_json(&serde_json::json!([id, hash, sorted, undefined]), &mut text);
            text.push('\n');
            let fnv = id.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
            });
            buckets
                .entry((fnv % 1024) as u16)
                .or_default()
                .insert(id, Sha256::digest(text.as_bytes()).to_vec());
        }
        let mut root = Sha256::new();
        root.update(b"steward content hash 2\n");
        for (number, leaves) in &buckets {
            let mut b = Sha256::new();
            for leaf in leaves.values() {
                b.update(leaf);
            }
            root.update(number.to_be_bytes());
            root.update(b.finalize());
        }
        assert_eq!(
            content_hash(entries.iter().copied()),
            hex::encode(root.finalize())
        );
    }

    #[test]
    fn content_hash_is_order_independent() {
        let e = |id: &'static str| (id, "h", &[] as &[String], false);
        let a = content_hash([e("a"), e("b"), e("c")].into_iter());
        let b = content_hash([e("c"), e("a"), e("b")].into_iter());
        assert_eq!(a, b);
        assert_ne!(a, content_hash([e("a"), e("b")].into_iter()));
    }

    /// Inserting, replacing and removing in any order gives the hash of what is held, and
    /// every input of a line counts.
    #[test]
    fn updates_give_the_hash_of_the_whole() {
        let req = vec!["x".to_string()];
        let none: Vec<String> = vec![];
        let ids: Vec<String> = (0..5000).map(|i| format!("f[h,path=/f{i}]")).collect();
        let mut tree = ContentTree::of(ids.iter().map(|i| (i.as_str(), "h", &none[..], false)));
        let before = tree.root();
        assert_eq!(tree.len(), 5000);
        tree.insert(&ids[7], "h2", &none, false);
        let changed = tree.root();
        assert_ne!(changed, before);
        tree.insert(&ids[7], "h", &none, false);
        assert_eq!(tree.root(), before, "back to what it was");
        for (hash, requires, undefined) in [("h", &req, false), ("h", &none, true)] {
            tree.insert(&ids[9], hash, requires, undefined);
            assert_ne!(tree.root(), before);
            tree.insert(&ids[9], "h", &none, false);
        }
        tree.remove(&ids[3]);
        tree.remove("not there");
        tree.insert("new[h,n=1]", "h", &req, false);
        let whole = content_hash(
            ids.iter()
                .filter(|i| **i != ids[3])
                .map(|i| (i.as_str(), "h", &none[..], false))
                .chain([("new[h,n=1]", "h", &req[..], false)]),
        );
        assert_eq!(tree.root(), whole);
        assert_eq!(tree.len(), 5000);
        assert_eq!(
            ContentTree::default().root(),
            hex::encode(Sha256::digest(TAG))
        );
    }

    /// A tree made from seals and the buckets a change touches gives the hash the whole
    /// tree gives after the same change; lines that are not what a seal says are refused.
    #[test]
    fn a_tree_from_seals_changes_like_the_whole() {
        let none: Vec<String> = vec![];
        let ids: Vec<String> = (0..5000).map(|i| format!("f[h,path=/f{i}]")).collect();
        fn line(i: &str) -> (&str, &str, &[String], bool) {
            (i, "h", &[], false)
        }
        let mut whole = ContentTree::of(ids.iter().map(|i| line(i)));
        let seals = whole.seals();
        let touched = [bucket(&ids[7]), bucket(&ids[8]), bucket("new[h,n=1]")];
        let opened = || {
            ids.iter()
                .filter(|i| touched.contains(&bucket(i)))
                .map(|i| line(i))
        };
        let mut part = ContentTree::from_seals(&seals).expect("a seal per bucket");
        assert!(part.is_sealed(&ids[7]));
        assert_eq!(part.root(), whole.root());
        assert!(part.open(opened()), "the lines fit their seals");
        assert!(!part.is_sealed(&ids[7]) && !part.is_sealed("new[h,n=1]"));
        assert_eq!(part.len(), 5000);
        assert_eq!(part.root(), whole.root());
        for t in [&mut whole, &mut part] {
            t.insert(&ids[7], "h2", &none, false);
            t.remove(&ids[8]);
            t.insert("new[h,n=1]", "h", &none, false);
        }
        assert_eq!(part.root(), whole.root());
        assert_eq!(part.len(), whole.len());
        let again = ContentTree::from_seals(&part.seals()).expect("seals of a tree from seals");
        assert_eq!(again.seals(), whole.seals());
        // a bucket opened with a line missing, with another line, or twice: refused
        let fresh = || ContentTree::from_seals(&seals).unwrap();
        assert!(!fresh().open(opened().skip(1)));
        assert!(!fresh().open(opened().map(|(id, _, r, u)| (id, "other", r, u))));
        let mut twice = fresh();
        assert!(twice.open(opened()));
        assert!(!twice.open(opened()));
        assert!(ContentTree::from_seals(&seals[1..]).is_none());
    }
}
