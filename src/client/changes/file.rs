//! A [`LastUpload`] on disk: a *base* file holding every resource, and beside it a small
//! *changes* file holding the resources changed since the base was written.
//!
//! A one-change upload at 100,000 resources rewrote the whole base (14 MB) before: a fifth
//! of its time. Now it rewrites the changes file, which names the base it applies to (its
//! version and content hash) and holds the header the memory has after them. The base is
//! written again when the changes grow past [`changes_limit`], and after any upload that
//! adds or removes resources.
//!
//! Each header holds the SHA-256 of the lines after it. The entries are what an upload's
//! changes are found by, and the seals (the content tree's buckets) what the content hash it
//! promises is made from: a memory whose entries are not what its seals were made from would
//! promise the hash of what the server holds with the changes, not the export's. Bound
//! together, a file that reads is as it was written. A wrong memory (one the server moved
//! past, or wrong seals) costs one whole upload: the server checks the content hash.
//!
//! Nothing is synced: a file a crash cut short does not read, and a changes file of another
//! base is not used.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Entries, LastUpload, Remembered};
use crate::client::fingerprint::Key;
use crate::model::content::{self, ContentTree};

// 2: each line has the fingerprint (16 hex digits) and the undefined flag (`u` or `-`)
// after the hash; the header has the fingerprints' key
// 3: the id's content bucket (3 hex digits) after the flag; the header has the number of
// lines and the content tree's seals
const MAGIC: &str = "steward-last-upload 3";
const CHANGES_MAGIC: &str = "steward-last-upload-changes 1";

#[derive(Serialize, Deserialize)]
struct Header {
    server: String,
    environment: String,
    version: i32,
    content_hash: String,
    fingerprint_key: Key,
    /// how many lines follow (a file cut short is not read)
    entries: usize,
    /// each bucket's digest and line count, in hex (36 bytes each)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    seals: String,
    /// the SHA-256 of the lines after the header
    body: String,
}

#[derive(Serialize, Deserialize)]
struct ChangesHeader {
    /// the base file it applies to
    base_version: i32,
    base_content_hash: String,
    /// the memory after the changes
    version: i32,
    content_hash: String,
    entries: usize,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    seals: String,
    body: String,
}

/// The base file a memory was read from or written to, and the resources changed since.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct OnDisk {
    version: i32,
    content_hash: String,
    changed: Vec<String>,
}

impl OnDisk {
    /// `ids` changed (their entries are written to the changes file by the next save).
    pub(super) fn changed<'a>(&mut self, ids: impl Iterator<Item = &'a str>) {
        self.changed.extend(ids.map(str::to_string));
    }
}

/// How many changed resources go to a changes file before the base is written again: a
/// fiftieth of the memory, and at least a thousand.
fn changes_limit(entries: usize) -> usize {
    (entries / 50).max(1000)
}

fn changes_path(path: &Path) -> PathBuf {
    with_suffix(path, ".changes")
}

/// `path` with `suffix` after its name (which may hold dots: not an extension).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

impl LastUpload {
    /// Read a memory written by [`LastUpload::save`]; `None` when there is none or it does
    /// not read (the next upload is then whole).
    pub fn load(path: &Path) -> Option<LastUpload> {
        let text = std::fs::read(path).ok()?;
        let (header, body) = split::<Header>(&text, MAGIC, |h| &h.body)?;
        let lines = body.split(|&b| b == b'\n');
        let mut entries = Entries::with_capacity_and_hasher(header.entries, Default::default());
        for line in lines.take(header.entries) {
            let (id, e) = entry(line)?;
            entries.insert(id, e);
        }
        if entries.len() != header.entries {
            return None;
        }
        let mut memory = LastUpload {
            server: header.server,
            environment: header.environment,
            version: header.version,
            content_hash: header.content_hash,
            key: header.fingerprint_key,
            entries,
            tree: sealed_tree(&header.seals),
            on_disk: None,
        };
        let mut on_disk = OnDisk {
            version: memory.version,
            content_hash: memory.content_hash.clone(),
            changed: Vec::new(),
        };
        if let Some((changes, changed)) = read_changes(&changes_path(path), &on_disk) {
            // only resources the base holds change: a changes file naming another is not
            // of this base
            if changed
                .iter()
                .all(|(id, _)| memory.entries.contains_key(id))
            {
                for (id, e) in changed {
                    on_disk.changed.push(id.clone());
                    memory.entries.insert(id, e);
                }
                memory.version = changes.version;
                memory.content_hash = changes.content_hash;
                memory.tree = sealed_tree(&changes.seals);
            }
        }
        memory.on_disk = Some(on_disk);
        Some(memory)
    }

    /// Write it: its changes since the base file when they are few, else the whole base
    /// (to a temporary file renamed into place: a crash leaves the old or the new). Ids
    /// hold no control character (the server refuses them), so tabs and newlines part the
    /// fields.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let seals = self.tree.as_ref().map(hex_seals).unwrap_or_default();
        if let Some(on_disk) = &self.on_disk
            && on_disk.changed.len() <= changes_limit(self.entries.len())
        {
            let mut ids: Vec<&str> = on_disk.changed.iter().map(String::as_str).collect();
            ids.sort_unstable();
            ids.dedup();
            let mut body = Vec::new();
            let mut entries = 0;
            for id in ids {
                if let Some(e) = self.entries.get(id) {
                    write_entry(&mut body, id, e)?;
                    entries += 1;
                }
            }
            let header = ChangesHeader {
                base_version: on_disk.version,
                base_content_hash: on_disk.content_hash.clone(),
                version: self.version,
                content_hash: self.content_hash.clone(),
                entries,
                seals,
                body: body_hash(&body),
            };
            return write_replacing(&changes_path(path), CHANGES_MAGIC, &header, &body);
        }
        let mut body = Vec::with_capacity(self.entries.len() * 160);
        for (id, e) in &self.entries {
            write_entry(&mut body, id, e)?;
        }
        let header = Header {
            server: self.server.clone(),
            environment: self.environment.clone(),
            version: self.version,
            content_hash: self.content_hash.clone(),
            fingerprint_key: self.key,
            entries: self.entries.len(),
            seals,
            body: body_hash(&body),
        };
        write_replacing(path, MAGIC, &header, &body)?;
        // a changes file left is of another base: not used, but removed
        match std::fs::remove_file(changes_path(path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// The changes file at `path` when it is of `base`: its header and entries.
fn read_changes(path: &Path, base: &OnDisk) -> Option<(ChangesHeader, Vec<(String, Remembered)>)> {
    let text = std::fs::read(path).ok()?;
    let (header, body) = split::<ChangesHeader>(&text, CHANGES_MAGIC, |h| &h.body)?;
    let lines = body.split(|&b| b == b'\n');
    if header.base_version != base.version || header.base_content_hash != base.content_hash {
        return None;
    }
    let entries: Vec<(String, Remembered)> = lines
        .take(header.entries)
        .map(entry)
        .collect::<Option<_>>()?;
    (entries.len() == header.entries).then_some((header, entries))
}

/// One resource's line: hash, fingerprint, undefined flag, bucket, id, requires.
fn entry(line: &[u8]) -> Option<(String, Remembered)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split('\t');
    let hash = fields.next()?.to_string();
    let fingerprint = u64::from_str_radix(fields.next()?, 16).ok()?;
    let undefined = match fields.next()? {
        "u" => true,
        "-" => false,
        _ => return None,
    };
    let bucket = u16::from_str_radix(fields.next()?, 16).ok()?;
    let id = fields.next()?.to_string();
    let requires = fields.map(str::to_string).collect();
    Some((
        id,
        Remembered {
            hash,
            fingerprint,
            requires,
            undefined,
            bucket,
        },
    ))
}

fn write_entry(out: &mut impl Write, id: &str, e: &Remembered) -> std::io::Result<()> {
    let flag = if e.undefined { "u" } else { "-" };
    write!(
        out,
        "{}\t{:016x}\t{flag}\t{:03x}\t{id}",
        e.hash, e.fingerprint, e.bucket
    )?;
    for r in &e.requires {
        write!(out, "\t{r}")?;
    }
    writeln!(out)
}

/// A file's header and the lines after it, when it starts with `magic` and the lines are
/// what its header's `body` hash says.
fn split<'t, H: serde::de::DeserializeOwned>(
    text: &'t [u8],
    magic: &str,
    body: impl Fn(&H) -> &String,
) -> Option<(H, &'t [u8])> {
    let text = text.strip_prefix(magic.as_bytes())?.strip_prefix(b"\n")?;
    let end = memchr::memchr(b'\n', text)?;
    let header: H = serde_json::from_slice(&text[..end]).ok()?;
    let rest = &text[end + 1..];
    (*body(&header) == body_hash(rest)).then_some((header, rest))
}

fn body_hash(body: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body))
}

/// Write `path` anew through a temporary file renamed over it, readable by its owner only
/// (it holds the fingerprints' key; a temporary file a crash left is made anew, not reused
/// with its mode).
fn write_replacing(
    path: &Path,
    magic: &str,
    header: &impl Serialize,
    body: &[u8],
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = with_suffix(path, ".tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let mut head = format!("{magic}\n").into_bytes();
    serde_json::to_writer(&mut head, header)?;
    head.push(b'\n');
    file.write_all(&head)?;
    file.write_all(body)?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// A tree's seals in hex: each bucket's digest, then its line count (big-endian).
fn hex_seals(tree: &ContentTree) -> String {
    let seals = tree.seals();
    let mut bytes = Vec::with_capacity(seals.len() * 36);
    for (digest, count) in seals {
        bytes.extend_from_slice(&digest);
        bytes.extend_from_slice(&count.to_be_bytes());
    }
    hex::encode(bytes)
}

/// The tree [`hex_seals`] wrote, known by its seals.
fn sealed_tree(text: &str) -> Option<ContentTree> {
    let bytes = hex::decode(text).ok()?;
    if bytes.is_empty() || bytes.len() % 36 != 0 {
        return None;
    }
    let seals: Vec<content::Seal> = bytes
        .chunks_exact(36)
        .map(|c| {
            let digest: [u8; 32] = c[..32].try_into().expect("32 bytes");
            let count = u32::from_be_bytes(c[32..].try_into().expect("4 bytes"));
            (digest, count)
        })
        .collect();
    ContentTree::from_seals(&seals)
}
