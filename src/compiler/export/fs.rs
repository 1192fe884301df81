//! What inmanta-module-fs 1.1.2 adds to the export of its resources: the content of an
//! `fs::File` (its prefix and suffix blocks joined in, a file marker of `fs::file` replaced by
//! the file's text), and the `dir_before_file` requires edges from everything in a directory
//! to that `fs::Directory`.

use super::{Read, read_path};
use crate::compiler::eval::Runtime;
use crate::compiler::value::{InstId, Value};

/// `fs::File` content, as the reference's `store_file`: the content (the module file's text
/// when it is a marker made by `fs::file`/`std::file`), after the sorted prefix blocks and
/// before the sorted suffix blocks, joined by `content_separator`.
pub(super) fn content(rt: &Runtime, inst: InstId) -> Read {
    let content = match read_path(rt, inst, "content") {
        Read::Value(Value::Str(s)) => rt.host.remembered_file(&s).unwrap_or_else(|| s.to_string()),
        Read::Value(_) => String::new(),
        other => return other,
    };
    let sep = match read_path(rt, inst, "content_separator") {
        Read::Value(Value::Str(s)) => s.to_string(),
        Read::Unknown => return Read::Unknown,
        _ => "\n".into(),
    };
    // the blocks of a relation, joined; None when one is unknown
    let blocks = |rel: &str| -> Option<Option<String>> {
        let Read::Value(Value::List(items)) = read_path(rt, inst, rel) else {
            return Some(None);
        };
        if items.is_empty() {
            return Some(None);
        }
        let mut parts: Vec<(String, String)> = Vec::new();
        for i in items.iter() {
            let Value::Instance(b) = i else { continue };
            let value = match read_path(rt, *b, "value") {
                Read::Value(Value::Str(s)) => s.to_string(),
                _ => return None,
            };
            let key = match read_path(rt, *b, "sorting_key") {
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
                .join(&sep),
        ))
    };
    let (Some(prefix), Some(suffix)) = (blocks("prefix_content"), blocks("suffix_content")) else {
        return Read::Unknown;
    };
    let mut out = String::new();
    if let Some(prefix) = prefix {
        out.push_str(&prefix);
        out.push_str(&sep);
    }
    out.push_str(&content);
    if let Some(suffix) = suffix {
        out.push_str(&sep);
        out.push_str(&suffix);
    }
    Read::Value(Value::string(out))
}
