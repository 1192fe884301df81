//! What inmanta-module-fs 1.1.2 adds to the export of its resources: the content of an
//! `fs::File` (its prefix and suffix blocks joined in, a file marker of `fs::file` replaced by
//! the file's text), and the `dir_before_file` requires edges from everything in a directory
//! to that `fs::Directory`.

use super::{AttrPath, Read, read_attr_path, read_own_field, read_path};
use crate::compiler::eval::Runtime;
use crate::compiler::value::{InstId, Value};

/// The paths [`content`] reads, resolved once per export.
pub(super) struct ContentPaths {
    content: AttrPath<'static>,
    separator: AttrPath<'static>,
    prefix: AttrPath<'static>,
    suffix: AttrPath<'static>,
    value: AttrPath<'static>,
    sorting_key: AttrPath<'static>,
}

impl ContentPaths {
    pub(super) fn new(rt: &Runtime) -> ContentPaths {
        ContentPaths {
            content: AttrPath::new(rt, "content"),
            separator: AttrPath::new(rt, "content_separator"),
            prefix: AttrPath::new(rt, "prefix_content"),
            suffix: AttrPath::new(rt, "suffix_content"),
            value: AttrPath::new(rt, "value"),
            sorting_key: AttrPath::new(rt, "sorting_key"),
        }
    }
}

/// `fs::File` content, as the reference's `store_file`: the content (the module file's text
/// when it is a marker made by `fs::file`/`std::file`), after the sorted prefix blocks and
/// before the sorted suffix blocks, joined by `content_separator`. With it, the slot of
/// `content` when the content is that attribute's string as it is (no marker, no blocks):
/// then it is read for this field only, and not marked read.
pub(super) fn content(rt: &Runtime, inst: InstId, paths: &ContentPaths) -> (Read, Option<u16>) {
    let mut plain = false;
    let content = match read_own_field(rt, inst, &paths.content) {
        Read::Value(Value::Str(s)) => match rt.host.remembered_file(&s) {
            Some(text) => Value::string(text),
            None => {
                plain = true;
                Value::Str(s)
            }
        },
        Read::Value(_) => Value::string(String::new()),
        other => return (mark(rt, inst, &paths.content, other), None),
    };
    let (read, as_is) = content_around(rt, inst, paths, content);
    // the slot, when its value went into the field as it is; else it counts as read
    let own = if plain && as_is {
        paths
            .content
            .parts
            .first()
            .and_then(|p| p.1)
            .and_then(|sym| rt.p.entity(rt.inst_entity(inst)).slot(sym))
    } else {
        None
    };
    if own.is_none() {
        mark(rt, inst, &paths.content, Read::Unknown);
    }
    (read, own)
}

/// Mark `path` of `inst` read (the content went into something else than the field as it
/// is); gives `read` back.
fn mark(rt: &Runtime, inst: InstId, path: &AttrPath, read: Read) -> Read {
    let _ = read_attr_path(rt, inst, path);
    read
}

/// The content with the blocks around it; true when there are none (the content as it is).
fn content_around(
    rt: &Runtime,
    inst: InstId,
    paths: &ContentPaths,
    content: Value,
) -> (Read, bool) {
    let sep = match read_attr_path(rt, inst, &paths.separator) {
        Read::Value(Value::Str(s)) => Some(s),
        Read::Unknown => return (Read::Unknown, false),
        _ => None,
    };
    let sep = sep.as_deref().unwrap_or("\n");
    // the blocks of a relation, joined; None when one is unknown
    let blocks = |rel: &AttrPath| -> Option<Option<String>> {
        let Read::Value(Value::List(items)) = read_attr_path(rt, inst, rel) else {
            return Some(None);
        };
        if items.is_empty() {
            return Some(None);
        }
        let mut parts: Vec<(String, String)> = Vec::new();
        for i in items.iter() {
            let Value::Instance(b) = i else { continue };
            let value = match read_attr_path(rt, *b, &paths.value) {
                Read::Value(Value::Str(s)) => s.to_string(),
                _ => return None,
            };
            let key = match read_attr_path(rt, *b, &paths.sorting_key) {
                Read::Value(Value::Str(s)) => s.to_string(),
                Read::Value(Value::Null) => value.clone(),
                _ => return None,
            };
            parts.push((key, value));
        }
        // Python's sorted is stable and compares the keys only
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Some(
            parts
                .into_iter()
                .map(|(_, v)| v)
                .collect::<Vec<_>>()
                .join(sep),
        ))
    };
    let (Some(prefix), Some(suffix)) = (blocks(&paths.prefix), blocks(&paths.suffix)) else {
        return (Read::Unknown, false);
    };
    // most files have no blocks: their content is exported as it is, without a copy
    if prefix.is_none() && suffix.is_none() {
        return (Read::Value(content), true);
    }
    let content = content.as_str().unwrap_or_default();
    let mut out = String::new();
    if let Some(prefix) = prefix {
        out.push_str(&prefix);
        out.push_str(sep);
    }
    out.push_str(content);
    if let Some(suffix) = suffix {
        out.push_str(sep);
        out.push_str(&suffix);
    }
    (Read::Value(Value::string(out)), false)
}

/// Python's `os.path.normpath` on a POSIX path (`posixpath.normpath`, step by step).
fn normpath(path: &str) -> String {
    if path.is_empty() {
        return ".".into();
    }
    // exactly two leading slashes are kept; three or more fold into one
    let initial = match (
        path.starts_with('/'),
        path.starts_with("//"),
        path.starts_with("///"),
    ) {
        (false, ..) => 0,
        (true, true, false) => 2,
        _ => 1,
    };
    let mut comps: Vec<&str> = Vec::new();
    for comp in path.split('/') {
        if comp.is_empty() || comp == "." {
            continue;
        }
        if comp != ".." || (initial == 0 && comps.is_empty()) || comps.last() == Some(&"..") {
            comps.push(comp);
        } else {
            comps.pop();
        }
    }
    let out = "/".repeat(initial) + &comps.join("/");
    if out.is_empty() { ".".into() } else { out }
}

/// inmanta-module-fs 1.1.2's `dir_before_file`: every `fs::File`, `fs::Directory` and
/// `fs::Symlink` (by its `src` and by its `dst`) inside an `fs::Directory` of the same host
/// requires that directory, ancestors included. Inside a purged directory a purged resource
/// is required by it instead (it goes first), and one that is not purged is an error.
pub(super) fn dir_before_file(
    rt: &Runtime,
    resources: &mut [crate::model::Resource],
    instances: &[InstId],
) -> Result<(), String> {
    let text = |r: &crate::model::Resource, k: &str| -> Option<String> {
        r.attributes.get(k)?.as_str().map(str::to_string)
    };
    let purged = |r: &crate::model::Resource| {
        r.attributes
            .get("purged")
            .and_then(serde_json::Value::as_bool)
            == Some(true)
    };
    // the directories, with a trailing '/': without one (most models) nothing is inside one
    let host_of = |inst: InstId| match read_path(rt, inst, "host") {
        Read::Value(Value::Instance(host)) => Some(host),
        _ => None,
    };
    let mut dirs: Vec<(InstId, String, usize)> = Vec::new();
    for (i, (r, inst)) in resources.iter().zip(instances).enumerate() {
        if r.type_name == "fs::Directory"
            && let Some(host) = host_of(*inst)
            && let Some(p) = text(r, "path")
        {
            dirs.push((host, normpath(&p) + "/", i));
        }
    }
    if dirs.is_empty() {
        return Ok(());
    }
    // each path looks up its own prefixes (each ending in '/') instead of being compared
    // with every directory: files × directories comparisons made a compile of 100,000 files
    // in 10,000 directories take 2.85 s instead of 1.15 s
    let mut by_prefix: std::collections::HashMap<(InstId, &str), Vec<usize>> =
        std::collections::HashMap::new();
    for (k, (host, prefix, _)) in dirs.iter().enumerate() {
        by_prefix
            .entry((*host, prefix.as_str()))
            .or_default()
            .push(k);
    }
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let mut inside: Vec<usize> = Vec::new();
    for (file, (r, inst)) in resources.iter().zip(instances).enumerate() {
        let keys: &[&str] = match r.type_name.as_str() {
            "fs::File" | "fs::Directory" | "fs::JsonFile" => &["path"],
            "fs::Symlink" => &["src", "dst"],
            _ => continue,
        };
        let Some(host) = host_of(*inst) else {
            continue;
        };
        for k in keys {
            let Some(p) = text(r, k) else {
                continue;
            };
            let path = normpath(&p);
            // in the order of the directories, as comparing with each in turn gave them
            inside.clear();
            for (at, _) in path.match_indices('/') {
                if let Some(found) = by_prefix.get(&(host, &path[..=at])) {
                    inside.extend(found);
                }
            }
            inside.sort_unstable();
            for &k in &inside {
                let dir = dirs[k].2;
                match (purged(&resources[dir]), purged(&resources[file])) {
                    (true, true) => edges.push((dir, file)),
                    (true, false) => {
                        return Err(format!(
                            "Directory {} is purged but a resource is trying to deploy something in it: {}",
                            resources[dir].id, resources[file].id
                        ));
                    }
                    _ => edges.push((file, dir)),
                }
            }
        }
    }
    let mut gained = Vec::with_capacity(edges.len());
    for (from, to) in edges {
        let id = resources[to].id.clone();
        resources[from].requires.push(id);
        gained.push(from);
    }
    for from in gained {
        let r = &mut resources[from];
        r.requires.sort();
        r.requires.dedup();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::normpath;

    #[test]
    fn normpath_is_pythons() {
        // each pair checked against Python 3.11's os.path.normpath
        for (input, expected) in [
            ("", "."),
            ("/", "/"),
            ("//", "//"),
            ("///", "/"),
            ("/srv/", "/srv"),
            ("/srv/www/../data", "/srv/data"),
            ("/srv/data//x", "/srv/data/x"),
            ("/../a", "/a"),
            ("a/../..", ".."),
            ("../../a", "../../a"),
            ("./a/./b/", "a/b"),
            ("//a//b", "//a/b"),
            ("///a", "/a"),
        ] {
            assert_eq!(normpath(input), expected, "{input}");
        }
    }
}
