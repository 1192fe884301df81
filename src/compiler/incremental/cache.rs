//! The incremental compile's memory: one file per project and main file, holding the last
//! full (or patched) compile's export, its main file, its [`PatchSites`], and what else it
//! read, so that the next compile can tell whether only a site changed.
//!
//! ```text
//! steward-compile-cache 1
//! {header: key, input stamps, prints, environment variables read, lengths}
//! <the main file's bytes><the sites, binary><the export, one resource per line>
//! ```
//!
//! The file is replaced whole (written beside, renamed), so a reader sees one compile's
//! memory or another's, never a mix. It is a cache: any doubt (another binary, options,
//! a module's file touched, a project file that appeared) and the compile runs in full.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{PatchSites, SiteType, Target};
use crate::model::{ExportFile, export_lines};

mod patch;
mod spliced;
pub use patch::patch;
use patch::patch_loaded;
use spliced::Export;

const MAGIC: &[u8] = b"steward-compile-cache 1\n";

/// Fixed size of a site's record: start, end, type and padding, first target, targets.
const SITE_RECORD: usize = 20;
const TARGET_RECORD: usize = 8;

/// What must be the same for a memory to be used: the compiler and how it was asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// This program's version and its file's size and time (another build: another key).
    pub compiler: String,
    pub project_dir: PathBuf,
    pub main_file: String,
    /// The variables given to the compile (`CompileOptions::env`), as `name=value`.
    pub env: Vec<String>,
    pub python: Option<PathBuf>,
}

impl Key {
    /// The key of a compile of `main_file` in `project_dir` with these options.
    pub fn new(
        project_dir: &Path,
        main_file: &str,
        env: &std::collections::BTreeMap<String, String>,
        python: Option<&Path>,
    ) -> Key {
        let exe = std::env::current_exe()
            .ok()
            .and_then(|p| Stamp::of(&p))
            .map(|s| format!("{}.{}.{}", s.len, s.mtime_ns, s.ino))
            .unwrap_or_default();
        Key {
            compiler: format!("steward {} {exe}", env!("CARGO_PKG_VERSION")),
            project_dir: project_dir.to_path_buf(),
            main_file: main_file.to_string(),
            env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            python: python.map(Path::to_path_buf),
        }
    }
}

/// A file or directory as `stat` saw it (a directory's time changes when an entry is added,
/// removed or renamed in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub len: u64,
    pub mtime_ns: i128,
    pub ino: u64,
}

impl Stamp {
    pub fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            len: if m.is_dir() { 0 } else { m.len() },
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ino: m.ino(),
        })
    }
}

/// What a compile read besides its main file, for the next one to check: each file and
/// directory with its stamp (`None`: it did not exist), the environment variables the model
/// asked for, and what it printed (printed again when the memory is used).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Inputs {
    pub paths: Vec<(PathBuf, Option<Stamp>)>,
    pub env_reads: Vec<(String, Option<String>)>,
    pub prints: Vec<String>,
    /// More than [`MAX_INPUTS`] paths to stamp: not checked, so never used.
    #[serde(default)]
    pub overflow: bool,
}

/// The paths a memory stamps at most (a module of more files than this is compiled in full
/// every time rather than stat-ed file by file).
pub const MAX_INPUTS: usize = 20_000;

impl Inputs {
    /// Stamp `path` (and, for a directory, everything under it but Python's caches and
    /// git's; a symbolic link is stamped as what it points to, and not followed into).
    /// Past [`MAX_INPUTS`] paths nothing more is stamped, and the memory is not used.
    pub fn add_tree(&mut self, path: &Path) {
        if self.paths.len() >= MAX_INPUTS {
            self.overflow = true;
            return;
        }
        let stamp = Stamp::of(path);
        self.paths.push((path.to_path_buf(), stamp));
        let is_dir = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir());
        if stamp.is_some() && is_dir {
            let Ok(entries) = std::fs::read_dir(path) else {
                return;
            };
            let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            entries.sort();
            for e in entries {
                if e.file_name()
                    .is_some_and(|n| n == "__pycache__" || n == ".git")
                {
                    continue;
                }
                self.add_tree(&e);
            }
        }
    }

    /// Stamp `path` only.
    pub fn add(&mut self, path: &Path) {
        self.paths.push((path.to_path_buf(), Stamp::of(path)));
    }

    /// Is every input as it was?
    fn unchanged(&self) -> Result<(), String> {
        if self.overflow {
            return Err(format!("the compile read more than {MAX_INPUTS} files"));
        }
        for (path, stamp) in &self.paths {
            if Stamp::of(path) != *stamp {
                return Err(format!("{} changed", path.display()));
            }
        }
        for (name, value) in &self.env_reads {
            if std::env::var(name).ok() != *value {
                return Err(format!("${name} changed"));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Serialize, Deserialize)]
struct Header {
    key: Key,
    inputs: Inputs,
    /// The field names targets refer to.
    fields: Vec<String>,
    main_len: usize,
    sites_len: usize,
    export_len: usize,
    /// Which memory this is (each one written has its own): an upload of its export is
    /// recorded under it ([`Uploaded`]).
    #[serde(default)]
    generation: u64,
}

/// A compile to remember: its key, inputs, main file, sites and export.
pub struct Memory<'a> {
    pub generation: u64,
    pub key: Key,
    pub inputs: Inputs,
    pub main: &'a [u8],
    pub sites: &'a PatchSites,
    /// The export in [`export_lines`]' layout.
    pub export: &'a [u8],
}

/// Where the memory of compiles of `main_file` in `project_dir` lives.
pub fn path(project_dir: &Path, main_file: &str) -> PathBuf {
    let name: String = main_file
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    project_dir
        .join(".steward")
        .join("compile")
        .join(format!("{name}.memory"))
}

/// The sites in the memory's binary layout: the count, a record per site, then the targets.
fn encode_sites(sites: &PatchSites) -> Vec<u8> {
    let mut records = Vec::with_capacity(4 + sites.sites.len() * SITE_RECORD);
    let mut target_records = Vec::new();
    let mut ntargets: u32 = 0;
    records.extend_from_slice(&(sites.sites.len() as u32).to_le_bytes());
    for site in &sites.sites {
        records.extend_from_slice(&site.start.to_le_bytes());
        records.extend_from_slice(&site.end.to_le_bytes());
        records.extend_from_slice(&[site.ty as u8, 0, 0, 0]);
        records.extend_from_slice(&ntargets.to_le_bytes());
        records.extend_from_slice(&(site.targets.len() as u32).to_le_bytes());
        for t in &site.targets {
            target_records.extend_from_slice(&t.resource.to_le_bytes());
            target_records.extend_from_slice(&t.field.to_le_bytes());
            ntargets += 1;
        }
    }
    records.extend_from_slice(&target_records);
    records
}

/// Write `memory` to `path` (replaced whole). A memory written with an empty export is a
/// *sites file*: the export goes beside it ([`Held::new`]).
pub fn save(path: &Path, memory: &Memory) -> std::io::Result<()> {
    let header = Header {
        key: memory.key.clone(),
        inputs: memory.inputs.clone(),
        fields: memory.sites.fields.clone(),
        main_len: 0,
        sites_len: 0,
        export_len: 0,
        generation: memory.generation,
    };
    write_file(
        path,
        header,
        memory.main,
        &encode_sites(memory.sites),
        memory.export.len(),
        |w| w.write_all(memory.export),
    )
}

/// Write a memory's parts to `path` (replaced whole), its header saying their lengths.
fn write_file(
    path: &Path,
    header: Header,
    main: &[u8],
    sites: &[u8],
    export_len: usize,
    write_export: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let header = Header {
        main_len: main.len(),
        sites_len: sites.len(),
        export_len,
        ..header
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        w.write_all(MAGIC)?;
        serde_json::to_writer(&mut w, &header)?;
        w.write_all(b"\n")?;
        w.write_all(main)?;
        w.write_all(sites)?;
        write_export(&mut w)?;
        w.flush()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The record that a memory's export was uploaded: the server then holds exactly it, and
/// an export patched from that memory can go as the resources the patch changed
/// (`PATH.uploaded` beside the memory at PATH).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uploaded {
    pub generation: u64,
    pub server: String,
    pub environment: String,
    /// The content hash the server stored it with.
    pub content_hash: String,
}

impl Uploaded {
    fn path(memory: &Path) -> PathBuf {
        let mut p = memory.as_os_str().to_owned();
        p.push(".uploaded");
        PathBuf::from(p)
    }

    /// The record beside the memory at `memory`, if any.
    pub fn load(memory: &Path) -> Option<Uploaded> {
        serde_json::from_slice(&std::fs::read(Self::path(memory)).ok()?).ok()
    }

    /// Remove the record (what the server holds is not known).
    pub fn forget(memory: &Path) {
        let _ = std::fs::remove_file(Self::path(memory));
    }

    /// Record it (replaced whole); a failure only costs the next upload a parse.
    pub fn save(&self, memory: &Path) {
        let path = Self::path(memory);
        let written = path
            .parent()
            .map(|dir| {
                // the memory beside it may be still being written
                std::fs::create_dir_all(dir)?;
                tempfile::NamedTempFile::new_in(dir)
            })
            .transpose()
            .and_then(|tmp| {
                let Some(mut tmp) = tmp else { return Ok(()) };
                tmp.write_all(&serde_json::to_vec(self).unwrap_or_default())?;
                tmp.persist(&path).map(|_| ()).map_err(|e| e.error)
            });
        if let Err(e) = written {
            tracing::debug!("{} not written: {e}", path.display());
        }
    }
}

/// The buffer a memory's parts share: read or made in this process, or the memory file
/// mapped (a file of 100,000 resources is 47 MB: read whole, that was 40-160 ms).
#[derive(Clone)]
enum Shared {
    Owned(std::sync::Arc<Vec<u8>>),
    Mapped(std::sync::Arc<crate::model::mapped::Mapped>),
}

impl std::ops::Deref for Shared {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Shared::Owned(b) => b,
            Shared::Mapped(m) => m,
        }
    }
}

/// Bytes of a memory: a range of a buffer it shares (the file, mapped once; or an export
/// held beside its sites).
#[derive(Clone)]
struct Part {
    buf: Shared,
    at: usize,
    len: usize,
}

impl Part {
    fn whole(buf: std::sync::Arc<Vec<u8>>) -> Part {
        let len = buf.len();
        Part {
            buf: Shared::Owned(buf),
            at: 0,
            len,
        }
    }

    /// The bytes, to change in place: copied first unless they are the whole of a buffer
    /// of this process that nothing else holds. The part is what the buffer holds after.
    fn make_mut(&mut self) -> &mut Vec<u8> {
        let whole = self.at == 0 && self.len == self.buf.len();
        let alone = match &mut self.buf {
            Shared::Owned(b) => std::sync::Arc::get_mut(b).is_some(),
            Shared::Mapped(_) => false,
        };
        if !whole || !alone {
            self.buf = Shared::Owned(std::sync::Arc::new(self.to_vec()));
            self.at = 0;
        }
        // the caller may change its length: the part follows it (see `fit`)
        match &mut self.buf {
            Shared::Owned(b) => std::sync::Arc::get_mut(b).expect("held by this part only"),
            Shared::Mapped(_) => unreachable!("copied above"),
        }
    }

    /// Whether [`Part::make_mut`] changes it where it is (it is the whole of a buffer of
    /// this process that nothing else holds), without a copy.
    fn is_alone(&self) -> bool {
        self.at == 0
            && self.len == self.buf.len()
            && match &self.buf {
                Shared::Owned(b) => std::sync::Arc::strong_count(b) == 1,
                Shared::Mapped(_) => false,
            }
    }

    /// After [`Part::make_mut`]: the part is the whole buffer again.
    fn fit(&mut self) {
        self.at = 0;
        self.len = self.buf.len();
    }

    /// The bytes as a buffer of their own (shared when they are the whole buffer).
    fn to_arc(&self) -> std::sync::Arc<Vec<u8>> {
        match &self.buf {
            Shared::Owned(b) if self.at == 0 && self.len == b.len() => b.clone(),
            _ => std::sync::Arc::new(self.to_vec()),
        }
    }
}

impl std::ops::Deref for Part {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// A memory read back.
#[derive(Clone)]
struct Loaded {
    header: Header,
    main: Part,
    sites: Part,
    export: Export,
}

impl Loaded {
    fn main(&self) -> &[u8] {
        &self.main
    }

    fn sites(&self) -> &[u8] {
        &self.sites
    }

    fn site_count(&self) -> usize {
        u32_at(self.sites(), 0) as usize
    }

    fn site(&self, i: usize) -> (u32, u32, u8, u32, u32) {
        let s = &self.sites()[4 + i * SITE_RECORD..];
        (
            u32_at(s, 0),
            u32_at(s, 4),
            s[8],
            u32_at(s, 12),
            u32_at(s, 16),
        )
    }

    fn targets(&self, first: u32, n: u32) -> Vec<Target> {
        let at = 4 + self.site_count() * SITE_RECORD;
        let t = &self.sites()[at..];
        (first..first + n)
            .map(|i| {
                let r = &t[i as usize * TARGET_RECORD..];
                Target {
                    resource: u32_at(r, 0),
                    field: u32_at(r, 4),
                }
            })
            .collect()
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn load(path: &Path) -> Result<Loaded, String> {
    let mapped =
        crate::model::mapped::Mapped::open(path).map_err(|e| format!("no memory ({e})"))?;
    parse_memory(Shared::Mapped(std::sync::Arc::new(mapped)))
}

/// A memory from its bytes, checked: its parts are where its header says, and its sites
/// point inside its main file and its targets.
fn parse_memory(bytes: Shared) -> Result<Loaded, String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("a memory of another format")?;
    let line = rest
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("a memory cut short")?;
    let header: Header = serde_json::from_slice(&rest[..line])
        .map_err(|e| format!("a memory that does not read ({e})"))?;
    let main_at = MAGIC.len() + line + 1;
    if bytes.len() != main_at + header.main_len + header.sites_len + header.export_len {
        return Err("a memory of the wrong length".into());
    }
    let part = |at: usize, len: usize| Part {
        buf: bytes.clone(),
        at,
        len,
    };
    let loaded = Loaded {
        main: part(main_at, header.main_len),
        sites: part(main_at + header.main_len, header.sites_len),
        export: Export::whole(part(
            main_at + header.main_len + header.sites_len,
            header.export_len,
        )),
        header,
    };
    let sites = loaded.sites();
    if sites.len() < 4 {
        return Err("a memory cut short".into());
    }
    let n = loaded.site_count();
    let targets_at = 4 + n * SITE_RECORD;
    if sites.len() < targets_at || !(sites.len() - targets_at).is_multiple_of(TARGET_RECORD) {
        return Err("a memory with broken sites".into());
    }
    let ntargets = (sites.len() - targets_at) / TARGET_RECORD;
    for i in 0..n {
        let (start, end, _, first, count) = loaded.site(i);
        if start >= end
            || end as usize > loaded.header.main_len
            || first as usize + count as usize > ntargets
        {
            return Err("a memory with broken sites".into());
        }
    }
    Ok(loaded)
}

/// A memory kept by a process instead of a file (the server keeps one per environment): a
/// compile's *sites file* ([`save`] with an empty export) and the export it was written
/// with, held beside. Whether it may be used for a project is the holder's to decide: it
/// checks no stamps.
#[derive(Clone)]
pub struct Held(Loaded);

impl Held {
    /// The memory of the sites file `sites_file` and `export` (the export of the same
    /// compile, in [`export_lines`]' layout). `Err`: the file is not a sites file.
    pub fn new(sites_file: Vec<u8>, export: std::sync::Arc<Vec<u8>>) -> Result<Held, String> {
        let mut loaded = parse_memory(Shared::Owned(std::sync::Arc::new(sites_file)))?;
        if loaded.header.export_len != 0 {
            return Err("a memory with an export of its own".into());
        }
        loaded.header.export_len = export.len();
        loaded.export = Export::whole(Part::whole(export));
        Ok(Held(loaded))
    }

    /// What the compile remembered reading besides its main file.
    pub fn inputs(&self) -> &Inputs {
        &self.0.header.inputs
    }

    /// The main file as the compile read it.
    pub fn main(&self) -> &[u8] {
        self.0.main()
    }

    /// How many literals a next compile may patch.
    pub fn sites(&self) -> usize {
        self.0.site_count()
    }

    /// The export of the main file `new_main` (the rest of the project being as the
    /// compile read it), and the memory to keep after it. `Err` says why it can not be
    /// patched (the memory is gone then: the caller compiles in full, and keeps that
    /// compile's). Taken by value, so that the export can be changed in place when nothing
    /// else holds it.
    pub fn patch(self, new_main: Vec<u8>) -> Result<(Patched, Held), String> {
        if new_main == self.0.main() {
            let patched = Patched {
                lines: self.0.export.clone(),
                changed: Vec::new(),
                prints: self.0.header.inputs.prints.clone(),
                base_generation: self.0.header.generation,
                next: None,
                count: None,
            };
            return Ok((patched, self));
        }
        let mut patched = patch_loaded(self.0, new_main)?;
        match patched.take_next().and_then(|n| n.0) {
            Some(loaded) => Ok((patched, Held(loaded))),
            None => Err("the patch left no memory".into()),
        }
    }
}

/// What the memory gives for the current project: its export (in lines, parsed when
/// asked for), and the resources the patch changed.
pub struct Patched {
    /// The export, one resource per line ([`export_lines`]): shared with the memory written
    /// for the next compile (32 MB at 100,000 resources), and put together in one buffer
    /// only when asked for ([`Patched::lines`]).
    lines: Export,
    /// The resources whose fields changed, with their place in the export.
    pub changed: Vec<(usize, crate::model::Resource)>,
    /// What the model printed (the same as in the compile remembered).
    pub prints: Vec<String>,
    /// The memory this was patched from ([`Uploaded::generation`]).
    pub base_generation: u64,
    next: Option<NextMemory>,
    /// How many resources `lines` holds, when the patch counted them (else counted when
    /// asked: 32 MB read at 100,000 resources)
    count: Option<usize>,
}

impl Patched {
    /// How many resources the export holds (a line each, between its first and last).
    pub fn resources(&self) -> usize {
        if let Some(n) = self.count {
            return n;
        }
        memchr::memchr_iter(b'\n', &self.lines())
            .count()
            .saturating_sub(1)
    }

    /// The export in [`export_lines`]' layout, in one buffer.
    pub fn lines(&self) -> std::sync::Arc<Vec<u8>> {
        self.lines.to_arc()
    }

    /// Write the export in [`export_lines`]' layout (without putting it in one buffer).
    pub fn write_lines(&self, w: &mut dyn Write) -> std::io::Result<()> {
        self.lines.write_to(w)
    }

    /// The whole export (every resource parsed).
    pub fn export(&self) -> Result<ExportFile, String> {
        parse(&self.lines())
    }

    /// The export without its resources (handlers, code, metadata, undefined ids, unknowns).
    pub fn rest(&self) -> Result<ExportFile, String> {
        // a patch swaps resources' lines only: the first and last lines are the base's
        match export_lines::rest(self.lines.base()) {
            Some(Ok(rest)) => Ok(rest),
            _ => Err("the memory's export does not read".into()),
        }
    }

    /// The memory for the next compile (taken once; the generation stays known).
    pub fn take_next(&mut self) -> Option<NextMemory> {
        self.next.take()
    }
}

/// The memory after a patch, to be written with [`NextMemory::save`] (nothing when the
/// project was as remembered).
pub struct NextMemory(Option<Loaded>, u64);

/// A memory's generation: any number no earlier memory had (time and a counter suffice:
/// a record of another generation only costs a parse).
pub fn new_generation() -> u64 {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    now ^ (COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 48)
        ^ std::process::id() as u64
}

impl NextMemory {
    /// The memory of a full compile.
    pub fn new(
        generation: u64,
        key: Key,
        inputs: Inputs,
        main: Vec<u8>,
        sites: PatchSites,
        export: Vec<u8>,
    ) -> NextMemory {
        let records = encode_sites(&sites);
        let header = Header {
            key,
            inputs,
            fields: sites.fields,
            main_len: 0,
            sites_len: 0,
            export_len: 0,
            generation: 0,
        };
        let loaded = Loaded {
            header,
            main: Part::whole(main.into()),
            sites: Part::whole(records.into()),
            export: Export::whole(Part::whole(export.into())),
        };
        NextMemory(Some(loaded), generation)
    }

    /// The generation it is written with (that of the memory itself when nothing changed).
    pub fn generation(&self) -> u64 {
        self.1
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let Some(loaded) = &self.0 else {
            return Ok(());
        };
        let header = Header {
            generation: self.1,
            ..loaded.header.clone()
        };
        write_file(
            path,
            header,
            loaded.main(),
            loaded.sites(),
            loaded.export.len(),
            |w| loaded.export.write_to(w),
        )
    }
}

fn parse(export_lines: &[u8]) -> Result<ExportFile, String> {
    match export_lines::split(export_lines) {
        Some(Ok(lines)) => lines
            .parse_all()
            .map_err(|e| format!("the memory's export does not read ({e})")),
        _ => Err("the memory's export does not read".into()),
    }
}
