//! Diffs between versions and the content hash of a version.
//!
//! A resource is NEW, UPDATED (attribute hash differs, or its undefined flag flipped), DELETED
//! or unchanged; `requires` changes alone do not make it updated (SCHEDULER.md §1.5). An
//! update lists its attribute-level changes as `{attribute: {current, desired}}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    New,
    Updated,
    Deleted,
    Unchanged,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::New => "new",
            ChangeKind::Updated => "updated",
            ChangeKind::Deleted => "deleted",
            ChangeKind::Unchanged => "unchanged",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttributeChange {
    pub current: serde_json::Value,
    pub desired: serde_json::Value,
}

/// `{attribute: {current, desired}}` for the attributes that differ.
pub fn attribute_changes(
    old: &serde_json::Map<String, serde_json::Value>,
    new: &serde_json::Map<String, serde_json::Value>,
) -> BTreeMap<String, AttributeChange> {
    let mut out = BTreeMap::new();
    for (k, v) in new {
        match old.get(k) {
            Some(o) if o == v => {}
            Some(o) => {
                out.insert(
                    k.clone(),
                    AttributeChange {
                        current: o.clone(),
                        desired: v.clone(),
                    },
                );
            }
            None => {
                out.insert(
                    k.clone(),
                    AttributeChange {
                        current: serde_json::Value::Null,
                        desired: v.clone(),
                    },
                );
            }
        }
    }
    for (k, o) in old {
        if !new.contains_key(k) {
            out.insert(
                k.clone(),
                AttributeChange {
                    current: o.clone(),
                    desired: serde_json::Value::Null,
                },
            );
        }
    }
    out
}

/// What the diff needs to know of a resource in a version.
#[derive(Clone, Debug)]
pub struct ResourceDigest {
    pub hash: String,
    pub undefined: bool,
}

/// Classify every resource id of `new` (and the deleted ones of `old`).
pub fn classify<'a>(
    old: &'a BTreeMap<String, ResourceDigest>,
    new: &'a BTreeMap<String, ResourceDigest>,
) -> Vec<(&'a str, ChangeKind)> {
    let mut out = Vec::with_capacity(new.len());
    for (id, n) in new {
        let kind = match old.get(id) {
            None => ChangeKind::New,
            Some(o) if o.hash != n.hash || o.undefined != n.undefined => ChangeKind::Updated,
            Some(_) => ChangeKind::Unchanged,
        };
        out.push((id.as_str(), kind));
    }
    for id in old.keys() {
        if !new.contains_key(id) {
            out.push((id.as_str(), ChangeKind::Deleted));
        }
    }
    out
}

/// Content hash of a version: its resources (id, attribute hash, requires, undefined flag),
/// in id order. Approvals are bound to it.
pub fn content_hash<'a, Q: AsRef<str> + 'a>(
    entries: impl Iterator<Item = (&'a str, &'a str, &'a [Q], bool)>,
) -> String {
    let mut sorted: Vec<_> = entries.collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut h = Sha256::new();
    // each line is the canonical JSON of [id, hash, sorted requires, undefined], written
    // straight into one buffer (the same text `canonical_json` gives; tested below)
    let mut line = Vec::with_capacity(256);
    let mut req: Vec<&str> = Vec::new();
    for (id, hash, requires, undefined) in sorted {
        line.clear();
        line.push(b'[');
        super::write_json_string(id, &mut line);
        line.push(b',');
        super::write_json_string(hash, &mut line);
        line.extend_from_slice(b",[");
        req.clear();
        req.extend(requires.iter().map(AsRef::as_ref));
        req.sort_unstable();
        for (i, r) in req.iter().enumerate() {
            if i > 0 {
                line.push(b',');
            }
            super::write_json_string(r, &mut line);
        }
        line.extend_from_slice(if undefined {
            b"],true]\n"
        } else {
            b"],false]\n"
        });
        h.update(&line);
    }
    super::hex_lower(&h.finalize())
}

/// The content hash of a version: [`content_hash`] of its resources, then the handler code
/// (an approval covers the code too: other code, another content hash). The server computes
/// it when it stores a version; a client sending only changes computes it too, so the server
/// stores exactly the version the client has.
pub fn version_hash<'a, Q: AsRef<str> + 'a>(
    entries: impl Iterator<Item = (&'a str, &'a str, &'a [Q], bool)>,
    handlers: &BTreeMap<String, super::HandlerCode>,
) -> String {
    let hash = content_hash(entries);
    if handlers.is_empty() {
        return hash;
    }
    let mut h = Sha256::new();
    h.update(hash.as_bytes());
    for (ty, code) in handlers {
        h.update(format!("\n{ty}={}", code.digest).as_bytes());
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::canonical_json;

    /// The content hash approvals are bound to: the same text, line by line, as the
    /// canonical JSON of `[id, hash, sorted requires, undefined]` (how it was first written).
    #[test]
    fn content_hash_is_the_canonical_text() {
        let req = vec!["b\"q".to_string(), "a".to_string()];
        let none: Vec<String> = vec![];
        let entries = [
            ("t[x,n=2]", "h2", none.as_slice(), true),
            ("t[x,n=1]", "h1", req.as_slice(), false),
        ];
        let mut text = String::new();
        for (id, hash, requires, undefined) in [entries[1], entries[0]] {
            let mut sorted: Vec<&String> = requires.iter().collect();
            sorted.sort();
            canonical_json(&serde_json::json!([id, hash, sorted, undefined]), &mut text);
            text.push('\n');
        }
        assert_eq!(
            content_hash(entries.iter().copied()),
            hex::encode(Sha256::digest(text.as_bytes()))
        );
    }

    #[test]
    fn changes_by_attribute() {
        let old = serde_json::json!({"a": 1, "b": 2, "c": 3});
        let new = serde_json::json!({"a": 1, "b": 5, "d": 4});
        let ch = attribute_changes(old.as_object().unwrap(), new.as_object().unwrap());
        assert_eq!(ch.len(), 3);
        assert_eq!(ch["b"].current, 2);
        assert_eq!(ch["b"].desired, 5);
        assert_eq!(ch["c"].desired, serde_json::Value::Null);
    }

    #[test]
    fn classification() {
        let d = |h: &str| ResourceDigest {
            hash: h.into(),
            undefined: false,
        };
        let old: BTreeMap<String, ResourceDigest> =
            [("x".into(), d("1")), ("y".into(), d("2"))].into();
        let new: BTreeMap<String, ResourceDigest> = [
            ("x".into(), d("1")),
            ("z".into(), d("3")),
            ("y".into(), d("9")),
        ]
        .into();
        let c = classify(&old, &new);
        assert!(c.contains(&("x", ChangeKind::Unchanged)));
        assert!(c.contains(&("y", ChangeKind::Updated)));
        assert!(c.contains(&("z", ChangeKind::New)));
    }

    #[test]
    fn content_hash_is_order_independent() {
        let r1 = vec!["b".to_string(), "a".to_string()];
        let r2 = vec!["a".to_string(), "b".to_string()];
        let h1 = content_hash(
            [
                ("x", "h1", r1.as_slice(), false),
                ("y", "h2", &[][..], false),
            ]
            .into_iter(),
        );
        let h2 = content_hash(
            [
                ("y", "h2", &[][..], false),
                ("x", "h1", r2.as_slice(), false),
            ]
            .into_iter(),
        );
        assert_eq!(h1, h2);
    }
}
