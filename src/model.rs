//! Shared vocabulary of all parts (DESIGN.md §3): resource ids, resources, export files.
//!
//! A resource's *hash* is SHA-256 over the canonical JSON (keys sorted, no whitespace) of its
//! id and attributes; `requires` is not part of it. Same id string ⇒ same resource across
//! versions.

pub mod codec;
pub mod content;
pub mod cron;
pub mod diff;
pub mod export_lines;
pub mod facts;
pub mod mapped;
pub mod placement;
pub mod settings;
pub mod urls;

pub use facts::Facts;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `type[agent,attr=value]`
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(transparent)]
pub struct ResourceId(pub String);

impl AsRef<str> for ResourceId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl ResourceId {
    pub fn new(type_name: &str, agent: &str, attr: &str, value: &str) -> ResourceId {
        // sized once and appended, not `format!`: every exported resource makes its id
        let mut id =
            String::with_capacity(type_name.len() + agent.len() + attr.len() + value.len() + 4);
        for part in [type_name, "[", agent, ",", attr, "=", value, "]"] {
            id.push_str(part);
        }
        ResourceId(id)
    }

    /// Split into (type, agent, attribute, value).
    pub fn parse(&self) -> Option<(&str, &str, &str, &str)> {
        let s = self.0.as_str();
        let open = s.find('[')?;
        let body = s[open + 1..].strip_suffix(']')?;
        let (agent, rest) = body.split_once(',')?;
        let (attr, value) = rest.split_once('=')?;
        Some((&s[..open], agent, attr, value))
    }

    pub fn type_name(&self) -> &str {
        self.parse().map(|p| p.0).unwrap_or("")
    }

    pub fn agent(&self) -> &str {
        self.parse().map(|p| p.1).unwrap_or("")
    }
}

impl std::fmt::Display for ResourceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Resource {
    pub id: ResourceId,
    #[serde(rename = "type")]
    pub type_name: String,
    pub agent: String,
    #[schema(value_type = Object)]
    pub attributes: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub requires: Vec<ResourceId>,
}

impl Resource {
    /// SHA-256 (hex) of the canonical JSON of id + attributes.
    pub fn hash(&self) -> String {
        // one buffer per thread: a client hashes 100,000 resources per upload
        thread_local! {
            static CANON: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
        }
        CANON.with_borrow_mut(|canon| {
            canon.clear();
            canon.extend_from_slice(b"{\"attributes\":");
            write_canonical_map(&self.attributes, canon);
            canon.extend_from_slice(b",\"id\":");
            write_json_string(&self.id.0, canon);
            canon.push(b'}');
            let digest = Sha256::digest(&canon[..]);
            // a buffer of a very large resource is not kept for the thread's life
            if canon.capacity() > 1 << 20 {
                *canon = Vec::with_capacity(1024);
            }
            hex_lower(&digest)
        })
    }
}

/// Lower-case hex of `bytes` (what `hex::encode` gives, without its per-character iterator:
/// a tenth of a client's hashing went there).
pub fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = vec![0u8; bytes.len() * 2];
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
    // hex digits are ASCII
    String::from_utf8(out).unwrap_or_default()
}

/// Whether requires remembered as strings (`held`) are `now`'s, in the same order.
pub fn same_requires(held: &[String], now: &[ResourceId]) -> bool {
    held.len() == now.len() && held.iter().zip(now).all(|(a, b)| *a == b.0)
}

/// [`Resource::hash`] of each resource, on every core for a large export (hashing is most of
/// what a client sending changes does: 100,000 resources take ~0.1 s on one core).
pub fn hash_all(resources: &[Resource]) -> Vec<String> {
    par_map(resources, Resource::hash)
}

/// `f` of each item, in order: on every core when there are 4,096 items or more (fewer are
/// not worth a thread).
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 || items.len() < 4096 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(cores);
    let f = &f;
    std::thread::scope(|scope| {
        let parts: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<_>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|p| {
                p.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// JSON with object keys sorted and no insignificant whitespace.
pub fn canonical_json(v: &serde_json::Value, out: &mut String) {
    let mut buf = std::mem::take(out).into_bytes();
    write_canonical(v, &mut buf);
    // serde_json writes UTF-8 only
    *out = String::from_utf8(buf).unwrap_or_default();
}

fn write_canonical(v: &serde_json::Value, out: &mut Vec<u8>) {
    match v {
        serde_json::Value::Object(m) => write_canonical_map(m, out),
        serde_json::Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(x, out);
            }
            out.push(b']');
        }
        serde_json::Value::String(s) => write_json_string(s, out),
        // numbers, booleans and null: serde_json's own text, written in place
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

fn write_canonical_map(m: &serde_json::Map<String, serde_json::Value>, out: &mut Vec<u8>) {
    // sorted as pairs (looking each value up again by its key would hash every key), on the
    // stack for the usual small object: an allocation per object was a tenth of hashing
    const ON_STACK: usize = 24;
    static NULL: serde_json::Value = serde_json::Value::Null;
    let mut small = [("", &NULL); ON_STACK];
    let mut large = Vec::new();
    let entries: &mut [(&str, &serde_json::Value)] = if m.len() <= ON_STACK {
        for (slot, (k, v)) in small.iter_mut().zip(m) {
            *slot = (k.as_str(), v);
        }
        &mut small[..m.len()]
    } else {
        large.extend(m.iter().map(|(k, v)| (k.as_str(), v)));
        &mut large
    };
    // keys mostly differ in their first byte: compared there before memcmp is called (the
    // same order as comparing the strings)
    entries.sort_unstable_by(|a, b| {
        let (x, y) = (a.0.as_bytes(), b.0.as_bytes());
        match (x.first(), y.first()) {
            (Some(p), Some(q)) if p != q => p.cmp(q),
            _ => x.cmp(y),
        }
    });
    out.push(b'{');
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json_string(k, out);
        out.push(b':');
        write_canonical(v, out);
    }
    out.push(b'}');
}

pub(crate) fn write_json_string(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes only control characters, quotes and backslashes: a string without
    // them is written as it is (most ids, paths and hashes; a fifth of hashing was
    // serde_json's escaping loop). The check has no early exit, so it is vectorized.
    let plain = !s.bytes().fold(false, |bad, b| {
        bad | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExportMetadata {
    pub project: String,
    pub compiler: String,
    /// module name -> version
    #[serde(default)]
    pub modules: BTreeMap<String, String>,
}

/// One file of a module's handler code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CodeFile {
    /// SHA-256 of the content, hex.
    pub hash: String,
    #[serde(default)]
    pub executable: bool,
}

/// The handler a module ships for a resource type: its files (paths inside the module) and
/// the entry point that runs. `digest` names this exact code (entry + files): executors keep
/// one handler process per agent and digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HandlerCode {
    pub module: String,
    pub entry: String,
    pub files: BTreeMap<String, CodeFile>,
    pub digest: String,
    /// Set for an Inmanta module's Python (`@provider` handlers): the executor runs it with
    /// the `inmanta` compatibility package (`python/`) in a Python environment holding
    /// `requirements`. `files` are then paths under a `sys.path` root
    /// (`inmanta_plugins/<module>/…`) and `entry` is unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inmanta: Option<InmantaCode>,
}

/// What an executor needs, beyond the files, to run an Inmanta module's handlers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InmantaCode {
    /// The modules' Python requirements (pip requirement strings), sorted, deduplicated.
    pub requirements: Vec<String>,
    /// Python packages to import so that their `@provider` classes register, e.g.
    /// `inmanta_plugins.fs`.
    pub imports: Vec<String>,
}

impl HandlerCode {
    /// The digest of an entry and its files.
    pub fn compute_digest(entry: &str, files: &BTreeMap<String, CodeFile>) -> String {
        let mut h = Sha256::new();
        h.update(entry.as_bytes());
        h.update([0]);
        for (path, f) in files {
            h.update(path.as_bytes());
            h.update([0]);
            h.update(f.hash.as_bytes());
            h.update([u8::from(f.executable), b'\n']);
        }
        hex::encode(h.finalize())
    }

    /// The digest this code must carry: [`HandlerCode::compute_digest`] of its entry and
    /// files, and for Inmanta code also over its requirements and imports (an executor's
    /// Python environment and the packages it imports are part of what runs).
    pub fn expected_digest(&self) -> String {
        let base = Self::compute_digest(&self.entry, &self.files);
        let Some(i) = &self.inmanta else {
            return base;
        };
        let mut h = Sha256::new();
        h.update(base.as_bytes());
        h.update(b"\0inmanta\0");
        for r in &i.requirements {
            h.update(r.as_bytes());
            h.update(b"\n");
        }
        h.update([0]);
        for m in &i.imports {
            h.update(m.as_bytes());
            h.update(b"\n");
        }
        hex::encode(h.finalize())
    }
}

/// What `steward compile --export FILE` writes and the server stores as a version.
///
/// Beyond DESIGN.md §3: `handlers` (resource type -> the module code handling it) and `code`
/// (content hash -> file content, hex): handler code travels with the version it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExportFile {
    #[schema(minimum = 1, maximum = 1)]
    pub format: u32,
    pub resources: Vec<Resource>,
    /// Resources carrying unknown values: stored, never deployed.
    #[serde(default)]
    pub undefined: Vec<ResourceId>,
    pub metadata: ExportMetadata,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub handlers: BTreeMap<String, HandlerCode>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub code: BTreeMap<String, String>,
    /// The unknown values the compile could not resolve (facts and parameters it asked for
    /// that were not there): recorded with the version, so that the value arriving later
    /// triggers a recompile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknowns: Vec<UnknownRecord>,
}

/// The version an export sent as its changes was made against: the newest version, as its
/// number and content hash (a server answers `409 base_moved` when it is no longer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeltaBase {
    pub version: i32,
    pub content_hash: String,
}

/// An unknown value a compile met: which fact (of which resource) or parameter it was.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UnknownRecord {
    /// The resource's id without version (`vm::Host[agent,name=x]`); `''` for a parameter.
    pub resource_id: String,
    /// The fact's or parameter's name.
    pub name: String,
    /// What asked for it: `fact`, `parameter` or `plugin`.
    pub source: String,
}

pub const EXPORT_FORMAT: u32 = 1;

/// What a token may do (DESIGN.md §3): checked by the server on every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// everything in its environment; a global admin manages projects, environments, tokens
    Admin,
    /// read, release and reject versions
    Approver,
    /// read, upload versions, trigger compiles
    Compiler,
    /// read, report deploy results and action logs (executors)
    Agent,
    /// read only
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Approver => "approver",
            Role::Compiler => "compiler",
            Role::Agent => "agent",
            Role::Viewer => "viewer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "admin" => Role::Admin,
            "approver" => Role::Approver,
            "compiler" => Role::Compiler,
            "agent" => Role::Agent,
            "viewer" => Role::Viewer,
            _ => return None,
        })
    }

    pub const ALL: [Role; 5] = [
        Role::Admin,
        Role::Approver,
        Role::Compiler,
        Role::Agent,
        Role::Viewer,
    ];
}

/// Attribute set on a resource that the model routes to another machine (a
/// `mitogen::Ssh`/`Sudo` context, or an agent whose `std::AgentConfig` has a remote URI):
/// where it should run. Executors refuse such resources until remote execution exists, so a
/// file meant for `web1` is never written on the server. Absent for local resources (their
/// hash does not change).
pub const ROUTE_ATTRIBUTE: &str = "remote_target";

/// A dependency cycle (first found), as the list of ids around it.
pub fn find_cycle(resources: &[Resource]) -> Option<Vec<ResourceId>> {
    let index: std::collections::HashMap<&ResourceId, usize> = resources
        .iter()
        .enumerate()
        .map(|(i, r)| (&r.id, i))
        .collect();
    let edges: Vec<Vec<usize>> = resources
        .iter()
        .map(|r| {
            r.requires
                .iter()
                .filter_map(|q| index.get(q).copied())
                .collect()
        })
        .collect();
    find_cycle_in(&edges).map(|c| c.into_iter().map(|n| resources[n].id.clone()).collect())
}

/// A cycle (first found) in a graph given as each node's successors, as the nodes around
/// it, the first repeated at the end.
pub fn find_cycle_in(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    // 0 = new, 1 = on stack, 2 = done
    let mut state = vec![0u8; edges.len()];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut path: Vec<usize> = Vec::new();
    for start in 0..edges.len() {
        if state[start] != 0 {
            continue;
        }
        stack.push((start, 0));
        state[start] = 1;
        path.push(start);
        while let Some((node, next)) = stack.pop() {
            let reqs = &edges[node];
            if next < reqs.len() {
                stack.push((node, next + 1));
                let dep = reqs[next];
                match state[dep] {
                    0 => {
                        state[dep] = 1;
                        path.push(dep);
                        stack.push((dep, 0));
                    }
                    1 => {
                        let pos = path.iter().position(|&n| n == dep).unwrap_or(0);
                        let mut cycle = path[pos..].to_vec();
                        cycle.push(dep);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                state[node] = 2;
                path.pop();
            }
        }
    }
    None
}

/// A cycle through one of `starts`, given each node's successors, as the nodes around it,
/// the first repeated at the end. Only what the starts reach is walked: when a graph without
/// cycles gains edges, a new cycle passes through a node that gained one, so a version that
/// changes what one resource requires is checked around that resource, not over 100,000.
pub fn find_cycle_from<'a, I>(
    starts: impl IntoIterator<Item = &'a str>,
    successors: impl Fn(&'a str) -> I,
) -> Option<Vec<&'a str>>
where
    I: Iterator<Item = &'a str>,
{
    // absent = new, true = on the path, false = done
    let mut on_path: std::collections::HashMap<&'a str, bool> = std::collections::HashMap::new();
    for start in starts {
        if on_path.contains_key(start) {
            continue;
        }
        on_path.insert(start, true);
        let mut path: Vec<(&'a str, I)> = vec![(start, successors(start))];
        while let Some((_, next)) = path.last_mut() {
            match next.next() {
                Some(dep) => match on_path.get(dep) {
                    None => {
                        on_path.insert(dep, true);
                        path.push((dep, successors(dep)));
                    }
                    Some(true) => {
                        let pos = path.iter().position(|(n, _)| *n == dep).unwrap_or(0);
                        let mut cycle: Vec<&str> = path[pos..].iter().map(|(n, _)| *n).collect();
                        cycle.push(dep);
                        return Some(cycle);
                    }
                    Some(false) => {}
                },
                None => {
                    let (done, _) = path.pop().expect("the path is not empty");
                    on_path.insert(done, false);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_through_the_starts() {
        let graph = |edges: &'static [(&'static str, &'static str)]| {
            move |n: &'static str| {
                edges
                    .iter()
                    .filter(move |(from, _)| *from == n)
                    .map(|(_, to)| *to)
            }
        };
        let chain = graph(&[("a", "b"), ("b", "c"), ("x", "y"), ("y", "x")]);
        assert_eq!(
            find_cycle_from(["a"], chain),
            None,
            "x-y is not reached from a"
        );
        assert_eq!(
            find_cycle_from(["y", "a"], chain),
            Some(vec!["y", "x", "y"])
        );
        let closed = graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]);
        assert_eq!(
            find_cycle_from(["d"], closed),
            Some(vec!["a", "b", "c", "a"])
        );
        assert_eq!(
            find_cycle_from(["s"], graph(&[("s", "s")])),
            Some(vec!["s", "s"])
        );
        // a diamond is not a cycle
        let diamond = graph(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]);
        assert_eq!(find_cycle_from(["a", "b", "c", "d"], diamond), None);
    }

    #[test]
    fn id_parts() {
        let id = ResourceId::new("fs::File", "web1", "path", "/etc/motd");
        assert_eq!(id.0, "fs::File[web1,path=/etc/motd]");
        assert_eq!(id.parse(), Some(("fs::File", "web1", "path", "/etc/motd")));
    }

    /// Stored versions are addressed by these hashes: the canonical text must never change
    /// (the expected value is Python's `json.dumps(sort_keys=True, separators=(',', ':'),
    /// ensure_ascii=False)` of the same resource).
    #[test]
    fn hash_is_stable() {
        let attributes = serde_json::json!({
            "path": "/etc/motd", "content": "héllo \"w\"\n\t", "mode": 644, "n": null, "b": true,
            "list": [3, {"z": 1, "a": []}], "nested": {"y": "1", "x": 2}
        });
        let r = Resource {
            id: ResourceId("std::File[h,path=/etc/motd]".into()),
            type_name: "std::File".into(),
            agent: "h".into(),
            attributes: attributes.as_object().unwrap().clone(),
            requires: vec![],
        };
        assert_eq!(
            r.hash(),
            "55875f62e7ee02aa4cd9ec8841e442c6a3dbf18a3cf8aa37bafac3b5f8e636f7"
        );
        let mut canon = String::new();
        canonical_json(&attributes, &mut canon);
        assert!(
            canon.starts_with("{\"b\":true,\"content\":\"héllo \\\"w\\\"\\n\\t\","),
            "{canon}"
        );
    }

    #[test]
    fn hash_ignores_key_order_and_requires() {
        let mut a = serde_json::Map::new();
        a.insert("b".into(), 1.into());
        a.insert("a".into(), 2.into());
        let mut b = serde_json::Map::new();
        b.insert("a".into(), 2.into());
        b.insert("b".into(), 1.into());
        let id = ResourceId("t[a,x=1]".into());
        let r1 = Resource {
            id: id.clone(),
            type_name: "t".into(),
            agent: "a".into(),
            attributes: a,
            requires: vec![],
        };
        let r2 = Resource {
            id,
            type_name: "t".into(),
            agent: "a".into(),
            attributes: b,
            requires: vec![ResourceId("x".into())],
        };
        assert_eq!(r1.hash(), r2.hash());
    }

    /// The fast paths of the canonical text (strings written as they are, keys compared at
    /// their first byte first, hex) give exactly what serde_json, a plain sort and the hex
    /// crate give: every stored hash depends on it.
    #[test]
    fn canonical_fast_paths_are_byte_identical() {
        let mut strings: Vec<String> = (0u32..0x80)
            .filter_map(char::from_u32)
            .map(|c| format!("a{c}b"))
            .collect();
        strings.extend(
            [
                "",
                "é",
                "日本",
                "\u{7f}",
                "\u{2028}",
                "tab\tq\"s\\",
                "\u{0}",
                "fs::File[h,path=/x]",
            ]
            .map(String::from),
        );
        for s in &strings {
            let mut ours = Vec::new();
            write_json_string(s, &mut ours);
            assert_eq!(ours, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
        // a map with keys that share prefixes, differ only in length, are empty or not ASCII
        let keys = [
            "b", "", "ab", "a", "abc", "aB", "B", "é", "z", "zz", "_x", "0", "purge", "purged",
        ];
        let mut m = serde_json::Map::new();
        for (i, k) in keys.iter().enumerate() {
            m.insert((*k).to_string(), i.into());
        }
        let mut ours = Vec::new();
        write_canonical_map(&m, &mut ours);
        let mut sorted: Vec<&&str> = keys.iter().collect();
        sorted.sort();
        let plain: String = sorted
            .iter()
            .map(|k| format!("{}:{}", serde_json::to_string(k).unwrap(), m[**k]))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(String::from_utf8(ours).unwrap(), format!("{{{plain}}}"));
        let digest = Sha256::digest(b"x");
        assert_eq!(hex_lower(&digest), hex::encode(digest));
        assert_eq!(hex_lower(&[0x00, 0x0f, 0xf0, 0xff]), "000ff0ff");
    }
}
