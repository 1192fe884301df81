//! What the last compile of a branch stored, kept by the environment's compile task, so that
//! the next compile is stored as its changes (`versions::store_delta`) and not whole.
//!
//! The compiler writes its export one resource per line (`model::export_lines`). A resource
//! that did not change is the same line, byte for byte: each line is given a keyed hash, and
//! only the lines that the memory does not hold are parsed and given their attribute hash.
//! At 10,000 resources that is ~1 ms instead of ~25 ms to parse the export and ~8 ms to
//! hash it, and the store compares only what changed instead of the whole manifest.
//!
//! The memory is only ever a guess: the store checks that its newest version is the memory's
//! (number and content hash) and that the changes give the content hash computed here, and
//! else refuses them; the version is then stored whole and the memory made anew. A wrong
//! memory costs a whole store, never a wrong version.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use indexmap::IndexMap;

use crate::model::content::{self, ContentTree};
use crate::model::export_lines::{self, Lines};
use crate::model::{DeltaBase, ExportFile, Resource, ResourceId};

/// Keyed hashes of lines (SipHash with keys of this process's choosing): a commit can not
/// make a changed line collide with the one it replaces.
type LineHasher = std::hash::RandomState;

/// The memory of one environment's last stored compile.
pub struct Memory {
    env: uuid::Uuid,
    version: i32,
    content_hash: String,
    lines: LineHasher,
    /// by id, in the order of the export they were made from (a compile gives the same
    /// order again: lines are looked up by position first)
    entries: IndexMap<String, Entry>,
    tree: ContentTree,
    /// The export ([`Read::id`]) whose lines the entries are, one for one and in order:
    /// the lines a patch did not change need not be hashed again ([`read_patched`]).
    lines_of: Option<u64>,
}

/// What the memory holds of one resource.
struct Entry {
    /// the keyed hash of its line
    line: u64,
    /// its attribute hash
    hash: String,
    requires: Vec<String>,
    undefined: bool,
}

/// A compile's export as read: whole, or as its changes against the memory.
pub struct Read {
    /// The whole export, or (with `changes`) only its new and changed resources and the
    /// rest of it.
    pub export: ExportFile,
    /// How many resources the export has.
    pub resources: usize,
    pub changes: Option<Changes>,
    /// The keyed hashes of the export's lines, when it had one resource per line: what a
    /// memory of it is made from after a whole store.
    lines: Option<(LineHasher, Vec<u64>)>,
    /// The export as the compiler wrote it: read again whole when its changes are refused.
    text: std::sync::Arc<Vec<u8>>,
    /// Which export this is (unique in this process).
    pub id: u64,
}

/// An export as the changes against a memory: what `versions::store_delta` takes.
pub struct Changes {
    pub base: DeltaBase,
    pub removed: Vec<ResourceId>,
    /// The content hash the new version must have.
    pub content_hash: String,
    /// The memory with the changes applied, for when they are stored.
    memory: Memory,
}

impl Changes {
    /// The memory of the version these changes were stored as (with `content_hash`).
    pub fn stored_as(self, version: i32) -> Memory {
        let mut m = self.memory;
        m.version = version;
        m.content_hash = self.content_hash;
        m
    }
}

/// Read the export the compiler wrote (`text`): as its changes against `memory` when that
/// is a memory of `env` and the export is in the compiler's layout, else whole. `Err`: it
/// does not parse.
pub fn read(
    memory: Option<Memory>,
    env: uuid::Uuid,
    text: std::sync::Arc<Vec<u8>>,
) -> Result<Read, String> {
    read_hinted(memory, env, text, None)
}

/// [`read`] of an export patched from the export `from` ([`Read::id`]): only the lines at
/// `changed` (their places among the resources) differ from it. When the memory's entries
/// are that export's lines, only those lines are hashed.
pub fn read_patched(
    memory: Option<Memory>,
    env: uuid::Uuid,
    text: std::sync::Arc<Vec<u8>>,
    from: u64,
    changed: &[usize],
) -> Result<Read, String> {
    read_hinted(memory, env, text, Some((from, changed)))
}

/// A new export's [`Read::id`].
pub fn new_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn read_hinted(
    memory: Option<Memory>,
    env: uuid::Uuid,
    text: std::sync::Arc<Vec<u8>>,
    patched: Option<(u64, &[usize])>,
) -> Result<Read, String> {
    let id = new_id();
    let Some(lines) = export_lines::split(&text) else {
        // not written by this compiler (or with no resource): parsed whole, no memory
        let export: ExportFile = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
        return Ok(Read {
            resources: export.resources.len(),
            export,
            changes: None,
            lines: None,
            text,
            id,
        });
    };
    let lines = lines.map_err(|e| e.to_string())?;
    let hasher = memory
        .as_ref()
        .map_or_else(LineHasher::new, |m| m.lines.clone());
    let memory = memory.filter(|m| m.env == env);
    let hashes = match (&memory, patched) {
        (Some(m), Some((from, changed)))
            if m.lines_of == Some(from)
                && m.entries.len() == lines.resources.len()
                && changed.iter().all(|&i| i < lines.resources.len()) =>
        {
            let mut hashes: Vec<u64> = m.entries.values().map(|e| e.line).collect();
            for &i in changed {
                hashes[i] = hasher.hash_one(lines.resources[i]);
            }
            hashes
        }
        _ => crate::model::par_map(&lines.resources, |l| hasher.hash_one(l)),
    };
    if let Some(memory) = memory
        && let Some(changes) = memory.compare(&lines, &hashes, id)
    {
        let (changes, export) = changes?;
        let resources = lines.resources.len();
        return Ok(Read {
            export,
            resources,
            changes: Some(changes),
            lines: None,
            text,
            id,
        });
    }
    let resources = lines.resources.len();
    let export = lines.parse_all().map_err(|e| e.to_string())?;
    Ok(Read {
        export,
        resources,
        changes: None,
        lines: Some((hasher, hashes)),
        text,
        id,
    })
}

impl Read {
    /// The same export, whole (its changes were refused).
    pub fn whole(self, env: uuid::Uuid) -> Result<Read, String> {
        let id = self.id;
        let mut whole = read(None, env, self.text)?;
        whole.id = id;
        Ok(whole)
    }

    /// The memory of this export, stored whole as `version` with `content_hash`, its
    /// resources' attribute hashes being `attribute_hashes` (`None` when it was not in the
    /// compiler's layout, or the content hash computed here is not the store's). Before the
    /// attributes are handed over to the scheduler.
    pub fn memory(
        &mut self,
        env: uuid::Uuid,
        version: i32,
        content_hash: &str,
        attribute_hashes: Vec<String>,
    ) -> Option<Memory> {
        let (lines, hashes) = self.lines.take()?;
        let export = &self.export;
        if self.changes.is_some()
            || hashes.len() != export.resources.len()
            || attribute_hashes.len() != export.resources.len()
        {
            return None;
        }
        let undefined: HashSet<&str> = export.undefined.iter().map(|u| u.0.as_str()).collect();
        let mut tree = ContentTree::of(export.resources.iter().zip(&attribute_hashes).map(
            |(r, h)| {
                (
                    r.id.0.as_str(),
                    h.as_str(),
                    r.requires.as_slice(),
                    undefined.contains(r.id.0.as_str()),
                )
            },
        ));
        if content::with_handlers(tree.root(), &export.handlers) != content_hash {
            return None;
        }
        let entries = export
            .resources
            .iter()
            .zip(attribute_hashes)
            .zip(hashes)
            .map(|((r, hash), line)| {
                let entry = Entry {
                    line,
                    hash,
                    requires: r.requires.iter().map(|q| q.0.clone()).collect(),
                    undefined: undefined.contains(r.id.0.as_str()),
                };
                (r.id.0.clone(), entry)
            })
            .collect();
        Some(Memory {
            env,
            version,
            content_hash: content_hash.to_string(),
            lines,
            entries,
            tree,
            lines_of: Some(self.id),
        })
    }
}

impl Memory {
    /// The export of `lines` (their keyed hashes `hashes`) as its changes against this
    /// memory, with the export to store (its new and changed resources, and the rest).
    /// `None` when the export names a remembered resource twice (stored whole, it is
    /// refused as such); `Some(Err)` when a line that changed does not parse.
    fn compare(
        mut self,
        lines: &Lines<'_>,
        hashes: &[u64],
        id: u64,
    ) -> Option<Result<(Changes, ExportFile), String>> {
        let rest = &lines.rest;
        let undefined: HashSet<&str> = rest.undefined.iter().map(|u| u.0.as_str()).collect();
        let is_undefined = |id: &str| !undefined.is_empty() && undefined.contains(id);
        let mut seen = vec![false; self.entries.len()];
        let mut by_line: Option<HashMap<u64, usize>> = None;
        // lines to parse: the memory does not hold them, or their undefined flag changed
        let mut unheld = Vec::new();
        let mut flipped = Vec::new();
        for (i, line) in hashes.iter().enumerate() {
            let at = match self.entries.get_index(i) {
                Some((_, e)) if e.line == *line => Some(i),
                _ => by_line
                    .get_or_insert_with(|| {
                        self.entries
                            .values()
                            .enumerate()
                            .map(|(at, e)| (e.line, at))
                            .collect()
                    })
                    .get(line)
                    .copied(),
            };
            match at {
                Some(at) => {
                    if std::mem::replace(&mut seen[at], true) {
                        return None;
                    }
                    let (id, e) = self.entries.get_index(at).expect("an index of entries");
                    if e.undefined != is_undefined(id) {
                        flipped.push(i);
                    }
                }
                None => unheld.push(i),
            }
        }
        let parse = |is: &[usize]| -> Result<Vec<(usize, Resource, String)>, String> {
            crate::model::par_map(is, |&i| {
                let r = Lines::resource(lines.resources[i]).map_err(|e| e.to_string())?;
                let hash = r.hash();
                Ok((i, r, hash))
            })
            .into_iter()
            .collect()
        };
        let (unheld, flipped) = match (parse(&unheld), parse(&flipped)) {
            (Ok(u), Ok(f)) => (u, f),
            (Err(e), _) | (_, Err(e)) => return Some(Err(e)),
        };
        // unheld lines of remembered resources: changed, or the same resource written
        // otherwise (its line is remembered anew)
        let mut changed: Vec<(usize, Resource, String)> = flipped;
        let mut relined: Vec<(usize, usize)> = Vec::new();
        for (i, r, hash) in unheld {
            match self.entries.get_full(&r.id.0) {
                Some((at, _, e)) => {
                    if std::mem::replace(&mut seen[at], true) {
                        return None;
                    }
                    if e.hash == hash
                        && crate::model::same_requires(&e.requires, &r.requires)
                        && e.undefined == is_undefined(&r.id.0)
                    {
                        relined.push((at, i));
                    } else {
                        changed.push((i, r, hash));
                    }
                }
                None => changed.push((i, r, hash)),
            }
        }
        let removed: Vec<ResourceId> = self
            .entries
            .keys()
            .zip(&seen)
            .filter(|(_, seen)| !**seen)
            .map(|(id, _)| ResourceId(id.clone()))
            .collect();
        let base = DeltaBase {
            version: self.version,
            content_hash: std::mem::take(&mut self.content_hash),
        };
        // the memory becomes the export's
        for (at, i) in relined {
            if let Some((_, e)) = self.entries.get_index_mut(at) {
                e.line = hashes[i];
            }
        }
        for id in &removed {
            self.tree.remove(&id.0);
            self.entries.swap_remove(&id.0);
        }
        let mut resources = Vec::with_capacity(changed.len());
        for (i, r, hash) in changed {
            let undefined = is_undefined(&r.id.0);
            self.tree.insert(&r.id.0, &hash, &r.requires, undefined);
            let entry = Entry {
                line: hashes[i],
                hash,
                requires: r.requires.iter().map(|q| q.0.clone()).collect(),
                undefined,
            };
            self.entries.insert(r.id.0.clone(), entry);
            resources.push(r);
        }
        let content_hash = content::with_handlers(self.tree.root(), &rest.handlers);
        // the entries are this export's lines when each line's entry is at its place
        let in_order = self.entries.len() == hashes.len()
            && self.entries.values().zip(hashes).all(|(e, h)| e.line == *h);
        self.lines_of = in_order.then_some(id);
        let export = ExportFile {
            format: rest.format,
            resources,
            undefined: rest.undefined.clone(),
            metadata: rest.metadata.clone(),
            handlers: rest.handlers.clone(),
            code: rest.code.clone(),
            unknowns: rest.unknowns.clone(),
        };
        Some(Ok((
            Changes {
                base,
                removed,
                content_hash,
                memory: self,
            },
            export,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ExportMetadata;

    /// A small generator (xorshift): the same sequence for a seed.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    #[derive(Clone)]
    struct Spec {
        id: usize,
        content: u64,
        requires: Vec<usize>,
        undefined: bool,
        /// the attributes written in the other order (same resource, another line)
        reordered: bool,
    }

    fn id(i: usize) -> String {
        format!("fs::File[h,path=/f{i}]")
    }

    fn export_of(specs: &[Spec]) -> ExportFile {
        let resources = specs
            .iter()
            .map(|s| {
                let mut attributes = serde_json::Map::new();
                let pairs = [
                    ("path", serde_json::json!(format!("/f{}", s.id))),
                    ("content", serde_json::json!(format!("c{}\n", s.content))),
                ];
                if s.reordered {
                    for (k, v) in pairs.into_iter().rev() {
                        attributes.insert(k.into(), v);
                    }
                } else {
                    for (k, v) in pairs {
                        attributes.insert(k.into(), v);
                    }
                }
                Resource {
                    id: ResourceId(id(s.id)),
                    type_name: "fs::File".into(),
                    agent: "h".into(),
                    attributes,
                    requires: s.requires.iter().map(|&q| ResourceId(id(q))).collect(),
                }
            })
            .collect();
        ExportFile {
            format: 1,
            resources,
            undefined: specs
                .iter()
                .filter(|s| s.undefined)
                .map(|s| ResourceId(id(s.id)))
                .collect(),
            metadata: ExportMetadata::default(),
            handlers: Default::default(),
            code: Default::default(),
            unknowns: vec![],
        }
    }

    fn text_of(export: &ExportFile) -> std::sync::Arc<Vec<u8>> {
        let mut text = Vec::new();
        export_lines::write(export, &mut text).unwrap();
        text.push(b'\n');
        text.into()
    }

    fn whole_hash(export: &ExportFile) -> String {
        let hashes = crate::model::hash_all(&export.resources);
        let undefined: HashSet<&str> = export.undefined.iter().map(|u| u.0.as_str()).collect();
        content::version_hash(
            export.resources.iter().zip(&hashes).map(|(r, h)| {
                (
                    r.id.0.as_str(),
                    h.as_str(),
                    r.requires.as_slice(),
                    undefined.contains(r.id.0.as_str()),
                )
            }),
            &export.handlers,
        )
    }

    /// What a version holds, by id: (attribute hash, requires, undefined).
    fn held(
        export: &ExportFile,
    ) -> std::collections::BTreeMap<String, (String, Vec<String>, bool)> {
        let undefined: HashSet<&str> = export.undefined.iter().map(|u| u.0.as_str()).collect();
        export
            .resources
            .iter()
            .map(|r| {
                (
                    r.id.0.clone(),
                    (
                        r.hash(),
                        r.requires.iter().map(|q| q.0.clone()).collect(),
                        undefined.contains(r.id.0.as_str()),
                    ),
                )
            })
            .collect()
    }

    /// The memory of a whole store of `export` as `version`.
    fn remembered(env: uuid::Uuid, export: &ExportFile, version: i32) -> Memory {
        let mut read = read(None, env, text_of(export)).unwrap();
        assert!(read.changes.is_none());
        let hashes = crate::model::hash_all(&read.export.resources);
        read.memory(env, version, &whole_hash(export), hashes)
            .expect("a memory of the whole export")
    }

    /// Random sequences of compiles: each read against the memory of the one before gives
    /// exactly what changed (new and changed resources in full, the removed ids) and the
    /// content hash of the whole export; the memory it leaves is as good as one made whole.
    #[test]
    fn changes_against_the_memory_are_the_whole_export() {
        let env = uuid::Uuid::new_v4();
        for seed in 1..=30u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut specs: Vec<Spec> = (0..12)
                .map(|i| Spec {
                    id: i,
                    content: 0,
                    requires: if i > 0 { vec![i - 1] } else { vec![] },
                    undefined: false,
                    reordered: false,
                })
                .collect();
            let mut previous = export_of(&specs);
            let mut memory = Some(remembered(env, &previous, 1));
            let mut next_id = 12;
            for step in 0..40 {
                for _ in 0..=rng.below(3) {
                    let n = specs.len() as u64;
                    match rng.below(7) {
                        0 => specs[rng.below(n) as usize].content += 1,
                        1 if n > 2 => {
                            specs.remove(rng.below(n) as usize);
                        }
                        2 => {
                            let at = rng.below(n + 1) as usize;
                            specs.insert(
                                at,
                                Spec {
                                    id: next_id,
                                    content: 0,
                                    requires: vec![],
                                    undefined: false,
                                    reordered: false,
                                },
                            );
                            next_id += 1;
                        }
                        3 => {
                            let s = &mut specs[rng.below(n) as usize];
                            s.undefined = !s.undefined;
                        }
                        4 => {
                            let s = &mut specs[rng.below(n) as usize];
                            s.reordered = !s.reordered;
                        }
                        5 => {
                            let a = rng.below(n) as usize;
                            let b = rng.below(n) as usize;
                            specs.swap(a, b);
                        }
                        _ => {
                            let s = &mut specs[rng.below(n) as usize];
                            s.requires = if s.requires.is_empty() {
                                vec![next_id + 1000]
                            } else {
                                vec![]
                            };
                        }
                    }
                }
                let export = export_of(&specs);
                let read = read(memory.take(), env, text_of(&export)).unwrap();
                let changes = read.changes.expect("read as changes");
                assert_eq!(read.resources, specs.len());
                assert_eq!(
                    changes.content_hash,
                    whole_hash(&export),
                    "seed {seed} step {step}"
                );
                // exactly what changed: given in full, as the export has them
                let (before, now) = (held(&previous), held(&export));
                let given: std::collections::BTreeMap<String, String> = read
                    .export
                    .resources
                    .iter()
                    .map(|r| (r.id.0.clone(), serde_json::to_string(r).unwrap()))
                    .collect();
                let expected: std::collections::BTreeMap<String, String> = export
                    .resources
                    .iter()
                    .filter(|r| before.get(&r.id.0) != now.get(&r.id.0))
                    .map(|r| (r.id.0.clone(), serde_json::to_string(r).unwrap()))
                    .collect();
                assert_eq!(given, expected, "seed {seed} step {step}");
                let mut removed: Vec<&str> = changes.removed.iter().map(|r| r.0.as_str()).collect();
                removed.sort();
                let mut gone: Vec<&str> = before
                    .keys()
                    .filter(|id| !now.contains_key(*id))
                    .map(String::as_str)
                    .collect();
                gone.sort();
                assert_eq!(removed, gone, "seed {seed} step {step}");
                assert_eq!(read.export.undefined, export.undefined);
                assert_eq!(changes.base.version, step + 1);
                let m = changes.stored_as(step + 2);
                assert_eq!(m.entries.len(), specs.len());
                memory = Some(m);
                previous = export;
            }
        }
    }

    /// A patched export read with its hint gives what it gives read without one, hashing
    /// only the changed lines, and only when the memory's entries are the hinted export's
    /// lines; the memory after it is the new export's lines again, for the next patch.
    #[test]
    fn a_patched_export_reads_alike_with_and_without_its_hint() {
        let env = uuid::Uuid::new_v4();
        let mut specs: Vec<Spec> = (0..50)
            .map(|id| Spec {
                id,
                content: 0,
                requires: vec![],
                undefined: false,
                reordered: false,
            })
            .collect();
        let first = export_of(&specs);
        let memory_of_first = || {
            let mut r = read(None, env, text_of(&first)).unwrap();
            let hashes = crate::model::hash_all(&r.export.resources);
            let from = r.id;
            let m = r.memory(env, 1, &whole_hash(&first), hashes).unwrap();
            assert_eq!(m.lines_of, Some(from));
            (m, from)
        };
        let mut changed = vec![3, 17, 49];
        for &i in &changed {
            specs[i].content = 1;
        }
        let second = export_of(&specs);
        let outcome = |r: Read| {
            let c = r.changes.expect("read as changes");
            let ids: Vec<String> = r.export.resources.iter().map(|x| x.id.0.clone()).collect();
            (c.content_hash.clone(), ids, c.memory.lines_of.is_some())
        };
        let (plain, _) = memory_of_first();
        let without = outcome(read(Some(plain), env, text_of(&second)).unwrap());
        let (hinted, from) = memory_of_first();
        let with = read_patched(Some(hinted), env, text_of(&second), from, &changed).unwrap();
        let next_from = with.id;
        let with = outcome(with);
        assert_eq!(with, without);
        assert_eq!(with.0, whole_hash(&second));
        assert_eq!(with.1.len(), 3);
        // the memory after it holds the new export's lines: the next patch hints again
        assert!(with.2);
        // a hint of another export is not taken: the same outcome, every line hashed
        let (other, _) = memory_of_first();
        let wrong = read_patched(Some(other), env, text_of(&second), from + 1000, &[]).unwrap();
        assert_eq!(outcome(wrong), without);
        // a chain of patches: the memory a patched read leaves takes the next hint
        let (m, from) = memory_of_first();
        let r = read_patched(Some(m), env, text_of(&second), from, &changed).unwrap();
        let second_id = r.id;
        let m = r.changes.unwrap().stored_as(2);
        assert_eq!(m.lines_of, Some(second_id));
        changed = vec![0];
        specs[0].content = 2;
        let third = export_of(&specs);
        let r = read_patched(Some(m), env, text_of(&third), second_id, &changed).unwrap();
        assert_eq!(r.changes.unwrap().content_hash, whole_hash(&third));
        assert_ne!(next_from, second_id);
    }

    #[test]
    fn what_can_not_be_read_as_changes_is_read_whole() {
        let env = uuid::Uuid::new_v4();
        let specs: Vec<Spec> = (0..5)
            .map(|i| Spec {
                id: i,
                content: 0,
                requires: vec![],
                undefined: false,
                reordered: false,
            })
            .collect();
        let export = export_of(&specs);
        // a resource named twice: whole (and refused there as such)
        let mut twice = specs.clone();
        twice.push(specs[1].clone());
        let r = read(
            Some(remembered(env, &export, 1)),
            env,
            text_of(&export_of(&twice)),
        )
        .unwrap();
        assert!(r.changes.is_none());
        assert_eq!(r.export.resources.len(), 6);
        // a memory of another environment
        let other = uuid::Uuid::new_v4();
        let r = read(Some(remembered(other, &export, 1)), env, text_of(&export)).unwrap();
        assert!(r.changes.is_none());
        // another layout (an older compiler): whole, and no memory made of it
        let mut r = read(
            Some(remembered(env, &export, 1)),
            env,
            serde_json::to_vec_pretty(&export).unwrap().into(),
        )
        .unwrap();
        assert!(r.changes.is_none());
        let hashes = crate::model::hash_all(&r.export.resources);
        assert!(r.memory(env, 2, &whole_hash(&export), hashes).is_none());
        // a memory is not made when the store's content hash is another
        let mut r = read(None, env, text_of(&export)).unwrap();
        let hashes = crate::model::hash_all(&r.export.resources);
        assert!(r.memory(env, 2, "another", hashes).is_none());
        // a changed line that does not parse is the compile's error
        let text = String::from_utf8(text_of(&export).to_vec()).unwrap();
        let broken = text.replacen("\"path\":\"/f3\"", "\"path\":/f3", 1);
        let err = read(
            Some(remembered(env, &export, 1)),
            env,
            broken.into_bytes().into(),
        )
        .err()
        .unwrap();
        assert!(err.contains("expected value"), "{err}");
        // refused changes: the same export read again whole
        let changed = export_of(&specs[1..]);
        let r = read(Some(remembered(env, &export, 1)), env, text_of(&changed)).unwrap();
        assert_eq!(r.changes.as_ref().unwrap().removed.len(), 1);
        let whole = r.whole(env).unwrap();
        assert!(whole.changes.is_none());
        assert_eq!(whole.export.resources.len(), 4);
    }
}
