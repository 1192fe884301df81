//! Diffs between versions (the content hash of a version is in [`super::content`]).
//!
//! A resource is NEW, UPDATED (attribute hash differs, or its undefined flag flipped), DELETED
//! or unchanged; `requires` changes alone do not make it updated (SCHEDULER.md §1.5). An
//! update lists its attribute-level changes as `{attribute: {current, desired}}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
