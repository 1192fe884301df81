//! Uploading a version as its changes: the client remembers what it last stored in an
//! environment ([`LastUpload`]: the version's number, content hash, and each resource's
//! attribute hash and requires) and sends the next export as the resources that are new or
//! changed, the ids that went, and the content hash the whole must have. The server checks
//! that its newest version is still that base and that the result has that content hash;
//! otherwise it answers `409 base_moved` and the whole export is sent, so a wrong or stale
//! memory costs one upload, never a wrong version.
//!
//! What changed is found by each resource's [`fingerprint`] (a keyed hash of its attributes
//! as they are), so only new and changed resources are given their attribute hash; and the
//! memory holds the [`ContentTree`] of what was stored, so the content hash of the next
//! version costs what changed, not the whole export.

// ids are the client's own export's: a fast hash (100,000 lookups per upload) is safe here;
// each entry has a place, so an id met twice in an export is seen
mod file;

type Entries = indexmap::IndexMap<String, Remembered, foldhash::fast::RandomState>;
use std::path::Path;

use serde::Serialize;

use super::fingerprint::{self, Key};
use super::{Client, ClientError, Result};
use crate::model::content::{self, ContentTree};
use crate::model::{
    DeltaBase, ExportFile, ExportMetadata, HandlerCode, Resource, ResourceId, UnknownRecord,
};

/// What a client stored last in an environment.
#[derive(Clone, Debug)]
pub struct LastUpload {
    /// The server it was stored in (for people reading the file; callers keep one memory
    /// per server, and the server's checks make any other harmless).
    pub server: String,
    /// The environment it was stored in: a memory of another is not used.
    pub environment: String,
    pub version: i32,
    pub content_hash: String,
    /// each resource's entry; of a memory read from its file and not parsed whole yet
    /// (`lines`), only those changed since its base file was written
    entries: Entries,
    /// the base file's lines, until they are parsed ([`LastUpload::parse`]): `entries` then
    /// holds all
    lines: Option<file::Lines>,
    /// the key of the entries' fingerprints
    key: Key,
    /// the content tree of `entries`, changed with them: a memory read from its file has it
    /// as the file's seals (a change then hashes only the buckets it touches), or made from
    /// the entries when first needed (a file without seals)
    tree: Option<ContentTree>,
    /// the file it was read from, and what changed since (`None`: written whole next)
    on_disk: Option<file::OnDisk>,
}

/// What the memory holds of one resource: what its line in the content hash is made of.
#[derive(Clone, Debug, PartialEq)]
struct Remembered {
    hash: String,
    /// [`fingerprint::of`] the resource (attributes and requires) under the memory's key
    fingerprint: u64,
    requires: Vec<String>,
    undefined: bool,
    /// the id's bucket in the content tree ([`content::bucket`])
    bucket: u16,
}

impl PartialEq for LastUpload {
    /// The same memory: the tree is made from the entries, so it is not compared.
    fn eq(&self, other: &Self) -> bool {
        self.server == other.server
            && self.environment == other.environment
            && self.version == other.version
            && self.content_hash == other.content_hash
            && self.key == other.key
            && self.all_entries() == other.all_entries()
    }
}

impl LastUpload {
    /// How many resources it remembers.
    fn len(&self) -> usize {
        // (the changes read with the lines are of resources the lines hold)
        self.lines.as_ref().map_or(self.entries.len(), |l| l.len())
    }

    /// Every entry, in the order of the export it was made from (`None`: the file's lines
    /// do not parse).
    fn all_entries(&self) -> Option<std::borrow::Cow<'_, Entries>> {
        let Some(lines) = &self.lines else {
            return Some(std::borrow::Cow::Borrowed(&self.entries));
        };
        let mut all = lines.parse()?;
        for (id, e) in &self.entries {
            all.insert(id.clone(), e.clone());
        }
        Some(std::borrow::Cow::Owned(all))
    }

    /// Parse the file's lines into `entries`, when not yet done (`false`: they do not
    /// parse, and the memory is of no use).
    fn parse(&mut self) -> bool {
        if self.lines.is_none() {
            return true;
        }
        match self.all_entries().map(std::borrow::Cow::into_owned) {
            Some(all) => {
                self.entries = all;
                self.lines = None;
                true
            }
            None => false,
        }
    }

    /// The entries of `ids` (those it holds), in one pass over the file's lines when they
    /// are not parsed (`None`: a line met does not parse).
    fn entries_of(&self, ids: &[&str]) -> Option<std::collections::HashMap<String, Remembered>> {
        let mut found: std::collections::HashMap<String, Remembered> = ids
            .iter()
            .filter_map(|id| self.entries.get(*id).map(|e| (id.to_string(), e.clone())))
            .collect();
        if let Some(lines) = &self.lines {
            let rest: std::collections::HashSet<&str> = ids
                .iter()
                .copied()
                .filter(|id| !found.contains_key(*id))
                .collect();
            if !rest.is_empty() {
                found.extend(lines.pick(&rest)?);
            }
        }
        Some(found)
    }
}

impl LastUpload {
    /// The content tree of what the server holds, ready for changes to the resources
    /// `touched`: the one kept from the last upload, or made from the file's seals, with the
    /// sealed buckets `touched` falls in opened; else made from every entry (`None`: the
    /// file's lines, needed for it, do not parse).
    fn take_tree<'a>(&mut self, touched: impl Iterator<Item = &'a str>) -> Option<ContentTree> {
        let touched: Vec<&str> = touched.collect();
        fn line<'e>(
            (id, e): (&'e String, &'e Remembered),
        ) -> (&'e str, &'e str, &'e [String], bool) {
            (
                id.as_str(),
                e.hash.as_str(),
                e.requires.as_slice(),
                e.undefined,
            )
        }
        if let Some(mut tree) = self.tree.take() {
            // of lines not parsed yet, those of the touched buckets (~100 each at 100,000)
            let unparsed: Entries = match &self.lines {
                Some(lines) => {
                    // (those open already are not read again)
                    let mut touched_buckets = vec![false; content::BUCKETS];
                    for id in touched.iter().filter(|id| tree.is_sealed(id)) {
                        touched_buckets[usize::from(content::bucket(id))] = true;
                    }
                    lines
                        .in_buckets(&touched_buckets, &self.entries)?
                        .into_iter()
                        .collect()
                }
                None => Entries::default(),
            };
            let entries = &self.entries;
            let opened = tree.open_touched(touched.iter().copied(), |wanted| {
                entries
                    .iter()
                    .chain(&unparsed)
                    .filter(move |(_, e)| wanted[usize::from(e.bucket)])
                    .map(line)
            });
            if opened {
                return Some(tree);
            }
            tracing::debug!("the last upload's seals do not fit its entries: hashing them all");
        }
        if !self.parse() {
            return None;
        }
        Some(ContentTree::of(self.entries.iter().map(line)))
    }
}

/// How an upload went.
pub struct Sent {
    /// The server's answer (the stored version).
    pub answer: serde_json::Value,
    /// What to remember for the next upload (`None` when the server's content hash was not
    /// the one computed here: the next upload is whole).
    pub last: Option<LastUpload>,
    /// Whether it went as changes (else whole).
    pub as_changes: bool,
}

#[derive(Serialize)]
struct ChangesBody<'a> {
    format: u32,
    resources: Vec<&'a Resource>,
    undefined: &'a [ResourceId],
    metadata: &'a ExportMetadata,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    handlers: &'a std::collections::BTreeMap<String, HandlerCode>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    code: &'a std::collections::BTreeMap<String, String>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    unknowns: &'a [UnknownRecord],
    provenance: &'a serde_json::Value,
    base: DeltaBase,
    removed: Vec<&'a ResourceId>,
    content_hash: &'a str,
}

impl<'a> ChangesBody<'a> {
    /// The body sending `resources` (new or changed) and `removed` of `export` against
    /// the version `base` remembers, which makes one of `content_hash`.
    fn new(
        export: &'a ExportFile,
        resources: Vec<&'a Resource>,
        provenance: &'a serde_json::Value,
        base: &LastUpload,
        removed: Vec<&'a ResourceId>,
        content_hash: &'a str,
    ) -> ChangesBody<'a> {
        ChangesBody {
            format: export.format,
            resources,
            undefined: &export.undefined,
            metadata: &export.metadata,
            handlers: &export.handlers,
            code: &export.code,
            unknowns: &export.unknowns,
            provenance,
            base: DeltaBase {
                version: base.version,
                content_hash: base.content_hash.clone(),
            },
            removed,
            content_hash,
        }
    }
}

/// Where `steward export` remembers its last upload to `server`'s `environment`: the user's
/// cache directory (`$XDG_CACHE_HOME` or `~/.cache`), `None` when there is none.
pub fn memory_path(server: &str, environment: &str) -> Option<std::path::PathBuf> {
    use sha2::Digest;
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    let key = hex::encode(sha2::Sha256::digest(format!("{server}\n{environment}")));
    Some(cache.join("steward").join("uploads").join(&key[..32]))
}

/// What an export changes against a memory.
struct Delta {
    /// new and changed resources: index in the export, attribute hash
    changed: Vec<(usize, String)>,
    /// resources as remembered whose fingerprint is not (their attributes came in another
    /// order): index in the export
    restamped: Vec<usize>,
    removed: Vec<ResourceId>,
}

impl Delta {
    /// The ids of the resources whose entries the upload writes: the changed ones and the
    /// restamped ones.
    fn rewritten<'e>(&'e self, export: &'e ExportFile) -> impl Iterator<Item = &'e str> {
        self.changed
            .iter()
            .map(|(i, _)| *i)
            .chain(self.restamped.iter().copied())
            .map(|i| export.resources[i].id.0.as_str())
    }
}

impl LastUpload {
    /// What `export` changes against this memory; `fingerprints` are its resources', under
    /// this memory's key. `None` when the export names a remembered resource twice: it is
    /// then sent whole, and refused as a whole export with a duplicate is (as changes, the
    /// second mention would hide a resource the export dropped).
    fn delta(
        &self,
        export: &ExportFile,
        fingerprints: &[u64],
        is_undefined: &(dyn Fn(&str) -> bool + Sync),
    ) -> Option<Delta> {
        let mut seen = vec![false; self.entries.len()];
        let mut twice = false;
        // the resources not as remembered: new, or another fingerprint or undefined flag
        let candidates: Vec<usize> = (0..export.resources.len())
            .filter(|&i| {
                let r = &export.resources[i];
                // a memory keeps the order of the export it was made from, and a compile
                // gives the same order again: looked up by position first (no id hashed)
                let held = match self.entries.get_index(i) {
                    Some((id, e)) if *id == r.id.0 => Some((i, e)),
                    _ => self.entries.get_full(&r.id.0).map(|(at, _, e)| (at, e)),
                };
                match held {
                    Some((at, e)) => {
                        twice |= std::mem::replace(&mut seen[at], true);
                        e.fingerprint != fingerprints[i] || e.undefined != is_undefined(&r.id.0)
                    }
                    None => true,
                }
            })
            .collect();
        if twice {
            return None;
        }
        let hashes = crate::model::par_map(&candidates, |&i| export.resources[i].hash());
        let (mut changed, mut restamped) = (Vec::new(), Vec::new());
        for (i, hash) in candidates.into_iter().zip(hashes) {
            let r = &export.resources[i];
            match self.entries.get(&r.id.0) {
                Some(e)
                    if e.hash == hash
                        && crate::model::same_requires(&e.requires, &r.requires)
                        && e.undefined == is_undefined(&r.id.0) =>
                {
                    restamped.push(i)
                }
                _ => changed.push((i, hash)),
            }
        }
        // the remembered ids not seen again went (a new id given twice is the server's to
        // refuse: it checks the resources it is sent)
        let removed = if !seen.contains(&false) {
            Vec::new()
        } else {
            self.entries
                .keys()
                .zip(&seen)
                .filter(|(_, seen)| !**seen)
                .map(|(id, _)| ResourceId(id.clone()))
                .collect()
        };
        Some(Delta {
            changed,
            restamped,
            removed,
        })
    }
}

/// An export that is the one `last` remembers with some resources changed (their ids,
/// `requires` and undefined flags as they were): an incremental compile's patch of an
/// export that was uploaded.
pub struct PatchedUpload<'a> {
    /// The export without its resources (handlers, code, metadata, undefined, unknowns).
    pub rest: &'a ExportFile,
    /// The resources whose attributes changed.
    pub changed: Vec<&'a Resource>,
}

impl Client {
    /// Upload `patch` as its changes against `last`, which must remember the export it
    /// patches. `Ok(Err(last))`: it did not fit (`last` is of another environment, does not
    /// hold a changed resource as it was, or the server's newest version is not its base);
    /// the caller then uploads the export with [`Client::upload_changes`] and `last`.
    pub async fn upload_patch(
        &self,
        env: &str,
        patch: &PatchedUpload<'_>,
        provenance: serde_json::Value,
        last: LastUpload,
    ) -> Result<std::result::Result<Sent, LastUpload>> {
        let mut memory = last;
        if memory.environment != env {
            return Ok(Err(memory));
        }
        let export = patch.rest;
        let ids: Vec<&str> = patch.changed.iter().map(|r| r.id.0.as_str()).collect();
        let Some(held) = memory.entries_of(&ids) else {
            return Ok(Err(memory));
        };
        let mut changed = Vec::with_capacity(patch.changed.len());
        for r in &patch.changed {
            let Some(e) = held.get(&r.id.0) else {
                return Ok(Err(memory));
            };
            if !crate::model::same_requires(&e.requires, &r.requires) {
                return Ok(Err(memory));
            }
            changed.push((*r, r.hash(), fingerprint::of(memory.key, r), e.undefined));
        }
        let Some(mut tree) = memory.take_tree(changed.iter().map(|(r, ..)| r.id.0.as_str())) else {
            return Ok(Err(memory));
        };
        for (r, hash, _, undefined) in &changed {
            tree.insert(&r.id.0, hash, &r.requires, *undefined);
        }
        let expected = content::with_handlers(tree.root(), &export.handlers);
        let body = ChangesBody::new(
            export,
            patch.changed.clone(),
            &provenance,
            &memory,
            Vec::new(),
            &expected,
        );
        let answer = match self
            .call::<serde_json::Value>(
                reqwest::Method::POST,
                &format!("{}/versions", Self::env(env)),
                Some(&body),
            )
            .await
        {
            Ok(answer) => answer,
            Err(ClientError::Api {
                status: 409,
                kind,
                message,
            }) if kind == "base_moved" => {
                tracing::debug!(%message, "the server refused the patched export's changes: sending the export whole");
                // the tree has the patch in it: made again from the entries when needed
                memory.tree = None;
                return Ok(Err(memory));
            }
            Err(e) => return Err(e),
        };
        tracing::debug!(
            changed = changed.len(),
            version = answer["number"].as_i64(),
            "uploaded the changes of a patched export"
        );
        let last = (answer["content_hash"] == expected.as_str()).then(|| {
            for (r, hash, fingerprint, undefined) in changed {
                memory.entries.insert(
                    r.id.0.clone(),
                    Remembered {
                        hash,
                        fingerprint,
                        requires: r.requires.iter().map(|q| q.0.clone()).collect(),
                        undefined,
                        bucket: content::bucket(&r.id.0),
                    },
                );
            }
            memory.server = self.base.clone();
            memory.version = answer["number"].as_i64().unwrap_or(0) as i32;
            memory.content_hash = expected;
            memory.tree = Some(tree);
            if let Some(d) = &mut memory.on_disk {
                d.changed(patch.changed.iter().map(|r| r.id.0.as_str()));
            }
            memory
        });
        Ok(Ok(Sent {
            answer,
            last,
            as_changes: true,
        }))
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Upload `export` as the environment's next version: as its changes against `last` when
    /// that is a memory of this environment, whole otherwise or when the server says the
    /// base moved. The memory comes back updated by what changed (or made anew after a
    /// whole upload).
    pub async fn upload_changes(
        &self,
        env: &str,
        export: &ExportFile,
        provenance: serde_json::Value,
        last: Option<LastUpload>,
    ) -> Result<Sent> {
        let compared = Compared::new(export, Some(env), last);
        self.upload_compared(env, export, compared, provenance)
            .await
    }

    /// [`Client::upload_changes`] of an export compared already ([`Compared::new`] with
    /// this `export`); compared for another environment, it goes whole.
    pub async fn upload_compared(
        &self,
        env: &str,
        export: &ExportFile,
        compared: Compared,
        provenance: serde_json::Value,
    ) -> Result<Sent> {
        let compared = if compared.resources == export.resources.len()
            && (compared.changes.is_none() || compared.environment == env)
        {
            compared
        } else {
            Compared::new(export, Some(env), None)
        };
        let Compared {
            key,
            fingerprints,
            changes,
            ..
        } = compared;
        let undefined: std::collections::HashSet<&str> =
            export.undefined.iter().map(|u| u.0.as_str()).collect();
        let is_undefined = |id: &str| !undefined.is_empty() && undefined.contains(id);
        let remembered = |i: usize, hash: String| {
            let r = &export.resources[i];
            Remembered {
                hash,
                fingerprint: fingerprints[i],
                requires: r.requires.iter().map(|q| q.0.clone()).collect(),
                undefined: is_undefined(&r.id.0),
                bucket: content::bucket(&r.id.0),
            }
        };
        if let Some((mut memory, delta, tree, expected)) = changes {
            let body = ChangesBody::new(
                export,
                delta
                    .changed
                    .iter()
                    .map(|(i, _)| &export.resources[*i])
                    .collect(),
                &provenance,
                &memory,
                delta.removed.iter().collect(),
                &expected,
            );
            match self
                .call::<serde_json::Value>(
                    reqwest::Method::POST,
                    &format!("{}/versions", Self::env(env)),
                    Some(&body),
                )
                .await
            {
                Ok(answer) => {
                    // what the server holds now: the memory with the changes applied (none
                    // when the server's content hash is not ours: the next upload is whole)
                    let last = (answer["content_hash"] == expected.as_str()).then(|| {
                        // the file keeps the changes apart while none came or went
                        let mut kept = delta.removed.is_empty();
                        for id in &delta.removed {
                            memory.entries.swap_remove(&id.0);
                        }
                        for &(i, ref hash) in &delta.changed {
                            let id = export.resources[i].id.0.clone();
                            let came = memory
                                .entries
                                .insert(id, remembered(i, hash.clone()))
                                .is_none();
                            kept &= !came;
                        }
                        for &i in &delta.restamped {
                            if let Some(e) = memory.entries.get_mut(&export.resources[i].id.0) {
                                e.fingerprint = fingerprints[i];
                            }
                        }
                        match &mut memory.on_disk {
                            Some(d) if kept => d.changed(delta.rewritten(export)),
                            _ => memory.on_disk = None,
                        }
                        memory.server = self.base.clone();
                        memory.version = answer["number"].as_i64().unwrap_or(0) as i32;
                        memory.content_hash = expected;
                        memory.tree = Some(tree);
                        memory
                    });
                    return Ok(Sent {
                        answer,
                        last,
                        as_changes: true,
                    });
                }
                Err(ClientError::Api {
                    status: 409,
                    kind,
                    message,
                }) if kind == "base_moved" => {
                    tracing::debug!(%message, "the server refused the export's changes: sending it whole");
                }
                Err(e) => return Err(e),
            }
        }
        // whole: every resource hashed, and a memory made anew
        let hashes: Vec<String> = crate::model::hash_all(&export.resources);
        let mut tree = ContentTree::of(export.resources.iter().enumerate().map(|(i, r)| {
            (
                r.id.0.as_str(),
                hashes[i].as_str(),
                r.requires.as_slice(),
                is_undefined(&r.id.0),
            )
        }));
        let expected = content::with_handlers(tree.root(), &export.handlers);
        let answer = self.upload(env, export, provenance).await?;
        let last = (answer["content_hash"] == expected.as_str()).then(|| LastUpload {
            server: self.base.clone(),
            environment: env.to_string(),
            version: answer["number"].as_i64().unwrap_or(0) as i32,
            content_hash: expected,
            key,
            entries: hashes
                .into_iter()
                .enumerate()
                .map(|(i, h)| (export.resources[i].id.0.clone(), remembered(i, h)))
                .collect(),
            lines: None,
            tree: Some(tree),
            on_disk: None,
        });
        Ok(Sent {
            answer,
            last,
            as_changes: false,
        })
    }
}

/// An export compared with the memory of the last upload, which needs no server: what an
/// upload of it as changes sends, and the content hash the server must answer with.
/// `steward deploy` makes it while its private server starts.
pub struct Compared {
    /// the environment of the memory compared with ("" without one)
    environment: String,
    /// the export's resources (an upload of another export compares again)
    resources: usize,
    /// the fingerprints' key (the memory's, or a new one)
    key: Key,
    fingerprints: Vec<u64>,
    /// the memory, what the export changes against it, the memory's content tree with the
    /// changes in it, and the content hash that tree makes
    changes: Option<(LastUpload, Delta, ContentTree, String)>,
}

impl Compared {
    /// Compare `export` with `last` when that is a memory of `env` (any environment's, when
    /// `env` is not known yet: the upload checks).
    pub fn new(export: &ExportFile, env: Option<&str>, last: Option<LastUpload>) -> Compared {
        let started = std::time::Instant::now();
        let undefined: std::collections::HashSet<&str> =
            export.undefined.iter().map(|u| u.0.as_str()).collect();
        let is_undefined = |id: &str| !undefined.is_empty() && undefined.contains(id);
        let memory = last.filter(|l| env.is_none_or(|e| l.environment == e));
        let environment = memory
            .as_ref()
            .map(|m| m.environment.clone())
            .unwrap_or_default();
        let key = memory.as_ref().map_or_else(fingerprint::new_key, |m| m.key);
        let fingerprints = crate::model::par_map(&export.resources, |r| fingerprint::of(key, r));
        let fingerprinted = started.elapsed();
        let changes = memory.and_then(|mut memory| {
            // compared entry by entry: parsed whole
            if !memory.parse() {
                return None;
            }
            let delta = memory.delta(export, &fingerprints, &is_undefined)?;
            // the memory's tree with the changes is the export's (what was not compared
            // field by field has the fingerprint it had): its root is the content hash the
            // export must have
            // the buckets of restamped resources are opened too, though their lines stay:
            // an entry that is not what its bucket's seal was made from is then found, and
            // the tree made from the entries, as a tree without seals is
            let touched = delta
                .removed
                .iter()
                .map(|id| id.0.as_str())
                .chain(delta.rewritten(export));
            let mut tree = memory.take_tree(touched)?;
            for id in &delta.removed {
                tree.remove(&id.0);
            }
            for (i, hash) in &delta.changed {
                let r = &export.resources[*i];
                tree.insert(&r.id.0, hash, &r.requires, is_undefined(&r.id.0));
            }
            let expected = content::with_handlers(tree.root(), &export.handlers);
            tracing::debug!(
                resources = export.resources.len(),
                changed = delta.changed.len(),
                removed = delta.removed.len(),
                fingerprinted_ms = fingerprinted.as_secs_f64() * 1e3,
                compared_ms = started.elapsed().as_secs_f64() * 1e3,
                "export compared with the last upload"
            );
            Some((memory, delta, tree, expected))
        });
        Compared {
            environment,
            resources: export.resources.len(),
            key,
            fingerprints,
            changes,
        }
    }
}
