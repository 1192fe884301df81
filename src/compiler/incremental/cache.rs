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

use super::{PatchSites, Site, SiteType, Target, field_json};
use crate::model::{ExportFile, export_lines};

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

#[derive(Serialize, Deserialize)]
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

/// Write `memory` to `path` (replaced whole).
pub fn save(path: &Path, memory: &Memory) -> std::io::Result<()> {
    let mut records = Vec::with_capacity(4 + memory.sites.sites.len() * SITE_RECORD);
    let mut target_records = Vec::new();
    let mut ntargets: u32 = 0;
    records.extend_from_slice(&(memory.sites.sites.len() as u32).to_le_bytes());
    for site in &memory.sites.sites {
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
    let header = Header {
        key: memory.key.clone(),
        inputs: memory.inputs.clone(),
        fields: memory.sites.fields.clone(),
        main_len: memory.main.len(),
        sites_len: records.len(),
        export_len: memory.export.len(),
        generation: memory.generation,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file_mut());
        w.write_all(MAGIC)?;
        serde_json::to_writer(&mut w, &header)?;
        w.write_all(b"\n")?;
        w.write_all(memory.main)?;
        w.write_all(&records)?;
        w.write_all(memory.export)?;
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

/// A memory read back.
struct Loaded {
    header: Header,
    bytes: Vec<u8>,
    main_at: usize,
}

impl Loaded {
    fn main(&self) -> &[u8] {
        &self.bytes[self.main_at..self.main_at + self.header.main_len]
    }

    fn sites(&self) -> &[u8] {
        let at = self.main_at + self.header.main_len;
        &self.bytes[at..at + self.header.sites_len]
    }

    fn export(&self) -> &[u8] {
        let at = self.main_at + self.header.main_len + self.header.sites_len;
        &self.bytes[at..at + self.header.export_len]
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

    /// Every site, decoded (the memory written after a patch).
    fn all_sites(&self) -> PatchSites {
        PatchSites {
            sites: (0..self.site_count())
                .filter_map(|i| {
                    let (start, end, ty, first, n) = self.site(i);
                    Some(Site {
                        start,
                        end,
                        ty: SiteType::from_u8(ty)?,
                        targets: self.targets(first, n),
                    })
                })
                .collect(),
            fields: self.header.fields.clone(),
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn load(path: &Path) -> Result<Loaded, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("no memory ({e})"))?;
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
    let loaded = Loaded {
        header,
        bytes,
        main_at,
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

/// What the memory gives for the current project: its export (in lines, parsed when
/// asked for), and the resources the patch changed.
pub struct Patched {
    /// The export, one resource per line ([`export_lines`]).
    /// (Shared with the memory written for the next compile: 32 MB at 100,000 resources.)
    pub lines: std::sync::Arc<Vec<u8>>,
    /// The resources whose fields changed, with their place in the export.
    pub changed: Vec<(usize, crate::model::Resource)>,
    /// What the model printed (the same as in the compile remembered).
    pub prints: Vec<String>,
    /// The memory this was patched from ([`Uploaded::generation`]).
    pub base_generation: u64,
    next: Option<NextMemory>,
}

impl Patched {
    /// The whole export (every resource parsed).
    pub fn export(&self) -> Result<ExportFile, String> {
        parse(&self.lines)
    }

    /// The export without its resources (handlers, code, metadata, undefined ids, unknowns).
    pub fn rest(&self) -> Result<ExportFile, String> {
        match export_lines::rest(&self.lines) {
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
pub struct NextMemory(Option<MemoryParts>, u64);

/// What a memory file holds: its header, main file, sites and export.
type MemoryParts = (Header, Vec<u8>, PatchSites, std::sync::Arc<Vec<u8>>);

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
        let header = Header {
            key,
            inputs,
            fields: Vec::new(),
            main_len: 0,
            sites_len: 0,
            export_len: 0,
            generation: 0,
        };
        NextMemory(Some((header, main, sites, export.into())), generation)
    }

    fn new_from(
        header: Header,
        main: Vec<u8>,
        sites: PatchSites,
        export: std::sync::Arc<Vec<u8>>,
    ) -> NextMemory {
        NextMemory(Some((header, main, sites, export)), new_generation())
    }

    /// The generation it is written with (that of the memory itself when nothing changed).
    pub fn generation(&self) -> u64 {
        self.1
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let Some((header, main, sites, export)) = &self.0 else {
            return Ok(());
        };
        save(
            path,
            &Memory {
                generation: self.1,
                key: header.key.clone(),
                inputs: header.inputs.clone(),
                main,
                sites,
                export,
            },
        )
    }
}

/// The export of the project's current state from the memory at `path`, when the compile
/// it remembers was made with `key` and the project differs from it at most inside one
/// site. `Err` says why not (the caller compiles in full).
pub fn patch(path: &Path, key: &Key, main_path: &Path) -> Result<Patched, String> {
    let started = std::time::Instant::now();
    let loaded = load(path)?;
    let read = started.elapsed();
    if loaded.header.key != *key {
        return Err("the memory is of another compiler or other options".into());
    }
    loaded.header.inputs.unchanged()?;
    let new_main = std::fs::read(main_path).map_err(|e| format!("{}: {e}", main_path.display()))?;
    let old_main = loaded.main();
    if new_main == old_main {
        let generation = loaded.header.generation;
        return Ok(Patched {
            prints: loaded.header.inputs.prints.clone(),
            lines: loaded.bytes
                [loaded.main_at + loaded.header.main_len + loaded.header.sites_len..]
                .to_vec()
                .into(),
            changed: Vec::new(),
            base_generation: generation,
            next: Some(NextMemory(None, generation)),
        });
    }
    let edits = edits(&loaded, old_main, &new_main)?;
    // the export with the targets' fields set
    let lines = match export_lines::split(loaded.export()) {
        Some(Ok(lines)) => lines,
        _ => return Err("the memory's export does not read".into()),
    };
    let mut replaced: std::collections::HashMap<usize, (Vec<u8>, crate::model::Resource)> =
        Default::default();
    for (t, json) in edits.iter().flat_map(|e| {
        let (.., first, count) = loaded.site(e.site);
        let json = field_json(&e.value);
        loaded
            .targets(first, count)
            .into_iter()
            .map(move |t| (t, json.clone()))
    }) {
        let at = t.resource as usize;
        let line = lines
            .resources
            .get(at)
            .ok_or("the memory's sites name a resource it does not have")?;
        let mut resource = match replaced.remove(&at) {
            Some((_, r)) => r,
            None => export_lines::Lines::resource(line)
                .map_err(|e| format!("the memory's export does not read ({e})"))?,
        };
        let field = loaded
            .header
            .fields
            .get(t.field as usize)
            .ok_or("a memory with broken sites")?;
        match resource.attributes.get_mut(field) {
            Some(v) => *v = json.clone(),
            None => return Err("the memory's sites name a field the resource has not".into()),
        }
        let line = serde_json::to_vec(&resource).map_err(|e| e.to_string())?;
        replaced.insert(at, (line, resource));
    }
    let mut export_lines = Vec::with_capacity(loaded.export().len() + 64);
    rebuild(
        loaded.export(),
        &lines.resources,
        &replaced,
        &mut export_lines,
    );
    let export_lines = std::sync::Arc::new(export_lines);
    drop(lines);
    tracing::debug!(
        read_ms = read.as_secs_f64() * 1e3,
        patched_ms = started.elapsed().as_secs_f64() * 1e3,
        "memory patched"
    );
    // each site moved with the edits before it; an edited one has its new extent
    let mut sites = loaded.all_sites();
    let mut delta: isize = 0;
    let mut next_edit = edits.iter().peekable();
    for (i, s) in sites.sites.iter_mut().enumerate() {
        let old_end = s.end as isize;
        s.start = (s.start as isize + delta) as u32;
        match next_edit.next_if(|e| e.site == i) {
            Some(e) => {
                s.end = e.new_end as u32;
                delta = e.new_end as isize - old_end;
            }
            None => s.end = (old_end + delta) as u32,
        }
    }
    let prints = loaded.header.inputs.prints.clone();
    let Loaded { header, .. } = loaded;
    let base_generation = header.generation;
    let mut changed: Vec<(usize, crate::model::Resource)> =
        replaced.into_iter().map(|(at, (_, r))| (at, r)).collect();
    changed.sort_by_key(|c| c.0);
    Ok(Patched {
        lines: export_lines.clone(),
        changed,
        prints,
        base_generation,
        next: Some(NextMemory::new_from(header, new_main, sites, export_lines)),
    })
}

/// A site whose literal is another one in the new main file.
struct SiteEdit {
    site: usize,
    /// The end of the new literal in the new file.
    new_end: usize,
    value: crate::compiler::value::Value,
}

/// How far a literal's token may reach past the site's start (a token longer than this is
/// compiled in full).
const LITERAL_WINDOW: usize = 1 << 16;

/// The edits that make `new` of `old`, when each difference is inside a site and the new
/// text there is one literal the site's attributes take; `Err` says why not.
fn edits(loaded: &Loaded, old: &[u8], new: &[u8]) -> Result<Vec<SiteEdit>, String> {
    let not_inside = || "the change is not inside a literal that can be patched".to_string();
    let mut edits: Vec<SiteEdit> = Vec::new();
    let (mut i, mut j) = (0usize, 0usize);
    loop {
        let same = common_prefix(&old[i..], &new[j..]);
        i += same;
        j += same;
        if i == old.len() && j == new.len() {
            return Ok(edits);
        }
        // the site at or before the difference, after the last one edited
        let site = last_site_at_or_before(loaded, i).ok_or_else(not_inside)?;
        if edits.last().is_some_and(|e| e.site >= site) {
            return Err(not_inside());
        }
        let (start, end, ty, ..) = loaded.site(site);
        let (start, end) = (start as usize, end as usize);
        if i > end {
            return Err(not_inside());
        }
        // where the site starts in the new file: everything between it and the last edit
        // is the same
        let new_start = j - (i - start);
        // the first byte decides where the token before it ends: the same, or a digit for a
        // digit
        if old[start] != new[new_start]
            && !(old[start].is_ascii_digit() && new[new_start].is_ascii_digit())
        {
            return Err(not_inside());
        }
        let window = &new[new_start..new.len().min(new_start + LITERAL_WINDOW)];
        let text = match std::str::from_utf8(window) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(&window[..e.valid_up_to()]).expect("valid up to"),
        };
        let token = crate::compiler::lexer::first_token(text)
            .filter(|t| t.span.start == 0 && (t.span.end as usize) < text.len())
            .ok_or("the change is not a literal any more")?;
        let value = super::token_value(&token.tok).ok_or("the change is not a literal any more")?;
        let ty = SiteType::from_u8(ty).ok_or("a memory with broken sites")?;
        if !ty.accepts(&value) {
            return Err("the new value is not of the attribute's type".into());
        }
        let new_end = new_start + token.span.end as usize;
        edits.push(SiteEdit {
            site,
            new_end,
            value,
        });
        // from the literals' ends on, the texts must be the same again
        i = end;
        j = new_end;
    }
}

/// How many bytes `a` and `b` begin with alike (compared a block at a time).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 4096;
    let n = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= n && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + a[at..n]
        .iter()
        .zip(&b[at..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The last site starting at or before byte `at` of the old main file.
fn last_site_at_or_before(loaded: &Loaded, at: usize) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, loaded.site_count());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if loaded.site(mid).0 as usize <= at {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.checked_sub(1)
}

fn parse(export_lines: &[u8]) -> Result<ExportFile, String> {
    match export_lines::split(export_lines) {
        Some(Ok(lines)) => lines
            .parse_all()
            .map_err(|e| format!("the memory's export does not read ({e})")),
        _ => Err("the memory's export does not read".into()),
    }
}

/// `original` (an export in lines) with the resources' lines in `replaced` swapped.
fn rebuild(
    original: &[u8],
    lines: &[&[u8]],
    replaced: &std::collections::HashMap<usize, (Vec<u8>, crate::model::Resource)>,
    out: &mut Vec<u8>,
) {
    let base = original.as_ptr() as usize;
    let mut copied = 0;
    let mut order: Vec<&usize> = replaced.keys().collect();
    order.sort();
    for &at in order {
        let line = lines[at];
        let from = line.as_ptr() as usize - base;
        out.extend_from_slice(&original[copied..from]);
        out.extend_from_slice(&replaced[&at].0);
        copied = from + line.len();
    }
    out.extend_from_slice(&original[copied..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_compares_whole_blocks_and_the_rest() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert_eq!(common_prefix(&a, &b), 10_000);
        b[9_000] = 8;
        assert_eq!(common_prefix(&a, &b), 9_000);
        assert_eq!(common_prefix(&a[..5], &b), 5);
        assert_eq!(common_prefix(b"", b"x"), 0);
    }
}
