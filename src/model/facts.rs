//! The environment's parameters and facts as a compile sees them (`std::getfact`).
//!
//! A compile gets them whole, before it starts, from whoever runs it: the server writes them
//! into a file for its git compiles (`steward compile --facts FILE`), `steward export` and
//! `steward deploy` fetch them with one list call. Lookups are by resource id (without
//! version; `""` for an environment parameter) and name, in a hash map: a compile asking for
//! thousands of facts pays a hash lookup for each, not a call.
//!
//! The file is JSON: `{"parameters": [{"resource_id": "…", "name": "…", "value": "…"}, …]}`,
//! the rows of the server's parameter list (other fields of a row, such as `source` or
//! `updated`, are ignored), or the bare array of rows. Values are strings, as the server
//! stores them. A later row for the same resource and name replaces an earlier one.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Parameters and facts by resource id (without version, `""` for the environment's own
/// parameters) and name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    by_resource: HashMap<String, HashMap<String, String>>,
    len: usize,
}

/// One row of the `--facts` file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactRow {
    #[serde(default)]
    pub resource_id: String,
    pub name: String,
    pub value: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FactsFile {
    Object { parameters: Vec<FactRow> },
    Rows(Vec<FactRow>),
}

#[derive(Serialize)]
struct FactsFileOut<'a> {
    parameters: Vec<FactRowRef<'a>>,
}

#[derive(Serialize)]
struct FactRowRef<'a> {
    resource_id: &'a str,
    name: &'a str,
    value: &'a str,
}

impl Facts {
    pub fn new() -> Facts {
        Facts::default()
    }

    /// Set fact `name` of `resource_id` (`""`: an environment parameter).
    pub fn insert(
        &mut self,
        resource_id: impl Into<String>,
        name: impl Into<String>,
        value: impl Into<String>,
    ) {
        let old = self
            .by_resource
            .entry(resource_id.into())
            .or_default()
            .insert(name.into(), value.into());
        if old.is_none() {
            self.len += 1;
        }
    }

    /// The value of fact `name` of `resource_id`, if the environment has it.
    pub fn get(&self, resource_id: &str, name: &str) -> Option<&str> {
        self.by_resource
            .get(resource_id)?
            .get(name)
            .map(String::as_str)
    }

    /// How many (resource, name) pairs have a value.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every (resource id, name, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.by_resource.iter().flat_map(|(r, names)| {
            names
                .iter()
                .map(move |(n, v)| (r.as_str(), n.as_str(), v.as_str()))
        })
    }

    /// Read the `--facts` file format (see the module documentation).
    pub fn from_json(text: &str) -> Result<Facts, serde_json::Error> {
        let rows = match serde_json::from_str::<FactsFile>(text)? {
            FactsFile::Object { parameters } => parameters,
            FactsFile::Rows(rows) => rows,
        };
        Ok(rows.into_iter().collect())
    }

    /// Write the `--facts` file format, rows sorted by resource id and name.
    pub fn to_json(&self) -> String {
        let mut parameters: Vec<FactRowRef> = self
            .iter()
            .map(|(resource_id, name, value)| FactRowRef {
                resource_id,
                name,
                value,
            })
            .collect();
        parameters.sort_by(|a, b| (a.resource_id, a.name).cmp(&(b.resource_id, b.name)));
        serde_json::to_string_pretty(&FactsFileOut { parameters }).expect("strings serialize")
    }
}

impl FromIterator<FactRow> for Facts {
    fn from_iter<I: IntoIterator<Item = FactRow>>(rows: I) -> Facts {
        let mut f = Facts::new();
        for r in rows {
            f.insert(r.resource_id, r.name, r.value);
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_reads_rows_of_the_parameter_list_and_writes_them_back() {
        let text = r#"{"parameters": [
            {"resource_id": "", "name": "region", "value": "eu", "source": "user"},
            {"resource_id": "std::testing::NullResource[a,name=x]", "name": "ip", "value": "10.0.0.1",
             "source": "fact", "metadata": {}, "updated": "2026-01-01T00:00:00Z", "expires": true},
            {"resource_id": "std::testing::NullResource[a,name=x]", "name": "ip", "value": "10.0.0.2"}
        ]}"#;
        let f = Facts::from_json(text).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f.get("", "region"), Some("eu"));
        // the later row wins
        assert_eq!(
            f.get("std::testing::NullResource[a,name=x]", "ip"),
            Some("10.0.0.2")
        );
        assert_eq!(f.get("std::testing::NullResource[a,name=x]", "mac"), None);
        assert_eq!(f.get("other", "ip"), None);
        assert_eq!(Facts::from_json(&f.to_json()).unwrap(), f);
        let bare = Facts::from_json(r#"[{"name": "region", "value": "eu"}]"#).unwrap();
        assert_eq!(bare.get("", "region"), Some("eu"));
        assert!(Facts::from_json(r#"{"parameters": [{"name": "n", "value": 1}]}"#).is_err());
        assert!(Facts::from_json("{}").is_err());
    }
}
