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

use std::collections::HashSet;
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
    /// not read (the next upload is then whole). Its lines are checked (their SHA-256, their
    /// number) but parsed only when first needed ([`Lines`]): a patched upload at 100,000
    /// resources needs a few of them, and parsing all into a map was ~50 ms of CPU beside
    /// the compile and the private server's start.
    pub fn load(path: &Path) -> Option<LastUpload> {
        // mapped, not read into a buffer of its own (14 MB at 100,000 resources): the file
        // is only ever replaced by a rename, never changed in place
        let text = crate::model::mapped::Mapped::open(path).ok()?;
        let (header, body) = split::<Header>(&text, MAGIC, |h| &h.body)?;
        let start = text.len() - body.len();
        let lines = Lines::new(std::sync::Arc::new(text), start, header.entries)?;
        let mut memory = LastUpload {
            server: header.server,
            environment: header.environment,
            version: header.version,
            content_hash: header.content_hash,
            key: header.fingerprint_key,
            entries: Entries::default(),
            lines: None,
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
            let ids: HashSet<&str> = changed.iter().map(|(id, _)| id.as_str()).collect();
            if ids.len() == changed.len() && lines.pick(&ids)?.len() == ids.len() {
                for (id, e) in changed {
                    on_disk.changed.push(id.clone());
                    memory.entries.insert(id, e);
                }
                memory.version = changes.version;
                memory.content_hash = changes.content_hash;
                memory.tree = sealed_tree(&changes.seals);
            }
        }
        memory.lines = Some(lines);
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
            && on_disk.changed.len() <= changes_limit(self.len())
        {
            let mut ids: Vec<&str> = on_disk.changed.iter().map(String::as_str).collect();
            ids.sort_unstable();
            ids.dedup();
            let mut body = Vec::new();
            let mut entries = 0;
            // (a memory read from its file holds what changed since among its parsed
            // entries: its lines are not read for them)
            let held = self.entries_of(&ids).ok_or_else(unreadable)?;
            for id in ids {
                if let Some(e) = held.get(id) {
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
        let all = self.all_entries().ok_or_else(unreadable)?;
        let mut body = Vec::with_capacity(all.len() * 160);
        for (id, e) in all.iter() {
            write_entry(&mut body, id, e)?;
        }
        let header = Header {
            server: self.server.clone(),
            environment: self.environment.clone(),
            version: self.version,
            content_hash: self.content_hash.clone(),
            fingerprint_key: self.key,
            entries: all.len(),
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

/// A memory read from its file whose lines do not parse (its SHA-256 was right: written so).
fn unreadable() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "the memory read from its file does not parse",
    )
}

/// The lines of a base file, checked (their SHA-256 and number) but not parsed: parsed
/// all ([`Lines::parse`]) when an export is compared with them, or only those of some ids
/// or buckets ([`Lines::pick`], [`Lines::in_buckets`]) for a patched upload, found by an
/// index of the lines by content bucket that reading makes (one pass, no allocation per
/// line). A line that does not parse makes the memory unusable where it is met (the next
/// upload goes whole).
#[derive(Clone, Debug)]
pub(super) struct Lines {
    text: std::sync::Arc<crate::model::mapped::Mapped>,
    /// where each line starts in `text` and ends (before its newline), by bucket: those of
    /// bucket `b` are `spans[firsts[b]..firsts[b + 1]]`
    spans: Vec<(u32, u32)>,
    firsts: Vec<u32>,
}

impl Lines {
    /// The first `count` lines of `text[start..]`, which must hold as many, each with a
    /// bucket field.
    fn new(
        text: std::sync::Arc<crate::model::mapped::Mapped>,
        start: usize,
        count: usize,
    ) -> Option<Lines> {
        u32::try_from(text.len()).ok()?;
        let mut places: Vec<(u16, u32, u32)> = Vec::with_capacity(count);
        let mut at = start;
        for _ in 0..count {
            let end = at + memchr::memchr(b'\n', &text[at..])?;
            let bucket = bucket_of_line(&text[at..end])?;
            if usize::from(bucket) >= content::BUCKETS {
                return None;
            }
            places.push((bucket, at as u32, end as u32));
            at = end + 1;
        }
        let mut firsts = vec![0u32; content::BUCKETS + 1];
        for &(b, ..) in &places {
            firsts[usize::from(b) + 1] += 1;
        }
        for b in 0..content::BUCKETS {
            firsts[b + 1] += firsts[b];
        }
        let mut next = firsts.clone();
        let mut spans = vec![(0u32, 0u32); places.len()];
        for (b, from, to) in places {
            let slot = &mut next[usize::from(b)];
            spans[*slot as usize] = (from, to);
            *slot += 1;
        }
        Some(Lines {
            text,
            spans,
            firsts,
        })
    }

    /// How many resources they hold.
    pub(super) fn len(&self) -> usize {
        self.spans.len()
    }

    fn line(&self, (from, to): (u32, u32)) -> &[u8] {
        &self.text[from as usize..to as usize]
    }

    fn bucket(&self, b: usize) -> impl Iterator<Item = &[u8]> {
        let (first, end) = (self.firsts[b] as usize, self.firsts[b + 1] as usize);
        self.spans[first..end].iter().map(|&s| self.line(s))
    }

    /// Every entry, in the file's order (`None`: a line does not parse, or an id is there
    /// twice).
    pub(super) fn parse(&self) -> Option<Entries> {
        let mut spans = self.spans.clone();
        spans.sort_unstable_by_key(|s| s.0);
        let mut entries = Entries::with_capacity_and_hasher(spans.len(), Default::default());
        for s in spans {
            let (id, e) = entry(self.line(s))?;
            entries.insert(id, e);
        }
        (entries.len() == self.spans.len()).then_some(entries)
    }

    /// The entries of `ids` that the lines hold (each id's bucket read).
    pub(super) fn pick(&self, ids: &HashSet<&str>) -> Option<Vec<(String, Remembered)>> {
        let mut buckets: Vec<usize> = ids
            .iter()
            .map(|id| usize::from(content::bucket(id)))
            .collect();
        buckets.sort_unstable();
        buckets.dedup();
        let mut found = Vec::with_capacity(ids.len());
        for b in buckets {
            for line in self.bucket(b) {
                if ids.contains(id_of_line(line)?) {
                    found.push(entry(line)?);
                }
            }
        }
        Some(found)
    }

    /// The entries in the content buckets `wanted` (one flag per bucket), but those of
    /// `except`.
    pub(super) fn in_buckets(
        &self,
        wanted: &[bool],
        except: &Entries,
    ) -> Option<Vec<(String, Remembered)>> {
        let mut found = Vec::new();
        for b in (0..content::BUCKETS).filter(|&b| wanted.get(b).copied().unwrap_or(false)) {
            for line in self.bucket(b) {
                if !except.contains_key(id_of_line(line)?) {
                    found.push(entry(line)?);
                }
            }
        }
        Some(found)
    }
}

/// The fields of a line before its id: hash, fingerprint, flag, bucket.
const FIELDS_BEFORE_ID: usize = 4;

/// Where the `n`th field of `line` starts (fields part at tabs).
fn field_start(line: &[u8], n: usize) -> Option<usize> {
    let mut at = 0;
    for _ in 0..n {
        at += memchr::memchr(b'\t', &line[at..])? + 1;
    }
    Some(at)
}

/// A line's bucket, read without the rest ([`entry`] reads it all).
fn bucket_of_line(line: &[u8]) -> Option<u16> {
    let from = field_start(line, FIELDS_BEFORE_ID - 1)?;
    let len = memchr::memchr(b'\t', &line[from..])?;
    u16::from_str_radix(std::str::from_utf8(&line[from..from + len]).ok()?, 16).ok()
}

/// A line's id, read without the rest.
fn id_of_line(line: &[u8]) -> Option<&str> {
    let from = field_start(line, FIELDS_BEFORE_ID)?;
    let len = memchr::memchr(b'\t', &line[from..]).unwrap_or(line.len() - from);
    std::str::from_utf8(&line[from..from + len]).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory of `n` resources: some with requires, some undefined.
    fn memory(n: usize) -> LastUpload {
        let entries: Entries = (0..n)
            .map(|i| {
                let id = format!("fs::File[h{},path=/srv/f{i:05}]", i % 7);
                let e = Remembered {
                    hash: format!("{:064x}", i * 7919),
                    fingerprint: (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    requires: (0..i % 3)
                        .map(|k| format!("fs::File[h0,path=/srv/r{k}]"))
                        .collect(),
                    undefined: i % 11 == 0,
                    bucket: content::bucket(&id),
                };
                (id, e)
            })
            .collect();
        let tree = ContentTree::of(entries.iter().map(|(id, e)| {
            (
                id.as_str(),
                e.hash.as_str(),
                e.requires.as_slice(),
                e.undefined,
            )
        }));
        LastUpload {
            server: "http://127.0.0.1:1".into(),
            environment: "env".into(),
            version: 4,
            content_hash: "ch".into(),
            entries,
            lines: None,
            key: crate::client::fingerprint::new_key(),
            tree: Some(tree),
            on_disk: None,
        }
    }

    fn root_of(entries: &Entries) -> String {
        ContentTree::of(entries.iter().map(|(id, e)| {
            (
                id.as_str(),
                e.hash.as_str(),
                e.requires.as_slice(),
                e.undefined,
            )
        }))
        .root()
    }

    #[test]
    fn a_memory_read_without_parsing_its_lines_answers_as_the_parsed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last-upload");
        let whole = memory(3000);
        whole.save(&path).unwrap();
        let mut read = LastUpload::load(&path).unwrap();
        assert!(read.lines.is_some(), "the lines are not parsed when read");
        assert_eq!(read.len(), 3000);
        assert!(read == whole, "the same entries, in the same order");

        // some ids' entries, found through their buckets; an id it does not hold has none
        let ids: Vec<String> = [5usize, 999, 2998]
            .iter()
            .map(|&i| whole.entries.get_index(i).unwrap().0.clone())
            .chain(["fs::File[h0,path=/nowhere]".to_string()])
            .collect();
        let wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
        let found = read.entries_of(&wanted).unwrap();
        assert_eq!(found.len(), 3);
        for id in &wanted[..3] {
            assert_eq!(found[*id], whole.entries[*id]);
        }

        // a change to two of them: the tree opened from the lines of their buckets makes
        // the root of every entry with the change
        let mut expected = whole.entries.clone();
        let mut tree = read.take_tree(wanted[..2].iter().copied()).unwrap();
        assert!(
            read.lines.is_some(),
            "opening the touched buckets parses nothing else"
        );
        for id in &wanted[..2] {
            let e = expected.get_mut(*id).unwrap();
            e.hash = format!("{:064x}", 1);
            tree.insert(id, &e.hash, &e.requires, e.undefined);
            read.entries.insert(id.to_string(), e.clone());
        }
        assert_eq!(tree.root(), root_of(&expected));

        // written as its changes, read back: the base's lines with the changes over them
        read.tree = Some(tree);
        read.version = 5;
        read.on_disk
            .as_mut()
            .unwrap()
            .changed(wanted[..2].iter().copied());
        read.save(&path).unwrap();
        assert!(changes_path(&path).exists());
        let mut again = LastUpload::load(&path).unwrap();
        assert_eq!(again.version, 5);
        assert!(again.all_entries().unwrap().as_ref() == &expected);
        assert!(again.parse());
        assert!(again.lines.is_none());
        assert!(again.entries == expected);
    }

    #[test]
    fn a_line_that_does_not_parse_makes_the_memory_useless_where_it_is_met() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last-upload");
        let whole = memory(500);
        whole.save(&path).unwrap();
        // one line's fingerprint is not hex, and the body's hash is made again (a memory
        // written wrong, as a bug would): its bucket still reads, so the memory loads
        let text = std::fs::read(&path).unwrap();
        let rest = text
            .strip_prefix(MAGIC.as_bytes())
            .unwrap()
            .strip_prefix(b"\n")
            .unwrap();
        let end = memchr::memchr(b'\n', rest).unwrap();
        let mut header: Header = serde_json::from_slice(&rest[..end]).unwrap();
        let body = String::from_utf8(rest[end + 1..].to_vec()).unwrap();
        let mut lines: Vec<String> = body.lines().map(str::to_string).collect();
        let bad_id = whole.entries.get_index(42).unwrap().0.clone();
        let at = lines.iter().position(|l| l.contains(&bad_id)).unwrap();
        let mut fields: Vec<&str> = lines[at].split('\t').collect();
        fields[1] = "not-hex";
        lines[at] = fields.join("\t");
        let body = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        header.body = body_hash(body.as_bytes());
        write_replacing(&path, MAGIC, &header, body.as_bytes()).unwrap();

        let mut read = LastUpload::load(&path).unwrap();
        // other buckets are of use
        let other = whole
            .entries
            .iter()
            .find(|(_, e)| e.bucket != content::bucket(&bad_id))
            .unwrap()
            .0
            .clone();
        assert_eq!(read.entries_of(&[other.as_str()]).unwrap().len(), 1);
        // its own bucket, and the whole, are not
        assert!(read.entries_of(&[bad_id.as_str()]).is_none());
        assert!(read.take_tree([bad_id.as_str()].into_iter()).is_none());
        assert!(!read.parse());
        assert!(read.all_entries().is_none());
        // a bucket field that does not read: the memory is not read at all
        fields = lines[at].split('\t').collect();
        fields[3] = "zzz";
        lines[at] = fields.join("\t");
        let body = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        header.body = body_hash(body.as_bytes());
        write_replacing(&path, MAGIC, &header, body.as_bytes()).unwrap();
        assert!(LastUpload::load(&path).is_none());
    }
}
