//! The handler context: structured logging with key-value fields, recorded attribute
//! changes, the kind of change made, and the executor's cache.

use std::collections::BTreeMap;

use chrono::Utc;
use serde_json::Value;

use super::cache::Cache;
use super::protocol::{Change, FactReport, LogLine};
use crate::model::diff::AttributeChange;

pub type Attrs = serde_json::Map<String, Value>;

pub struct Context<'a> {
    pub resource_id: String,
    pub dry_run: bool,
    /// A requirement changed since our last successful deploy (events/reload).
    pub reload: bool,
    pub version: i32,
    pub cache: &'a mut Cache,
    messages: Vec<LogLine>,
    changes: BTreeMap<String, AttributeChange>,
    change: Change,
    facts: Vec<FactReport>,
    /// Data passed from `read` to create/update/delete.
    pub scratch: serde_json::Map<String, Value>,
    /// The model waits for a fact of this resource: built-in handlers report theirs with the
    /// deploy (otherwise only when asked, so that facts nobody reads cost no writes).
    pub want_facts: bool,
}

impl<'a> Context<'a> {
    pub fn new(
        resource_id: &str,
        dry_run: bool,
        reload: bool,
        version: i32,
        cache: &'a mut Cache,
    ) -> Context<'a> {
        Context {
            resource_id: resource_id.to_string(),
            dry_run,
            reload,
            version,
            cache,
            messages: Vec::new(),
            changes: BTreeMap::new(),
            change: Change::Nochange,
            facts: Vec::new(),
            scratch: serde_json::Map::new(),
            want_facts: false,
        }
    }

    pub fn log(&mut self, level: &str, message: impl Into<String>, fields: &[(&str, Value)]) {
        let mut f = serde_json::Map::new();
        for (k, v) in fields {
            f.insert((*k).to_string(), v.clone());
        }
        self.messages.push(LogLine {
            level: level.into(),
            message: message.into(),
            fields: f,
            at: Utc::now(),
        });
    }

    pub fn debug(&mut self, message: impl Into<String>, fields: &[(&str, Value)]) {
        self.log("debug", message, fields)
    }

    pub fn info(&mut self, message: impl Into<String>, fields: &[(&str, Value)]) {
        self.log("info", message, fields)
    }

    pub fn warning(&mut self, message: impl Into<String>, fields: &[(&str, Value)]) {
        self.log("warning", message, fields)
    }

    pub fn error(&mut self, message: impl Into<String>, fields: &[(&str, Value)]) {
        self.log("error", message, fields)
    }

    pub fn add_change(&mut self, attribute: &str, current: Value, desired: Value) {
        self.changes
            .insert(attribute.to_string(), AttributeChange { current, desired });
    }

    pub fn set_changes(&mut self, changes: BTreeMap<String, AttributeChange>) {
        self.changes = changes;
    }

    pub fn changes(&self) -> &BTreeMap<String, AttributeChange> {
        &self.changes
    }

    pub fn set_created(&mut self) {
        self.change = Change::Created;
    }

    pub fn set_updated(&mut self) {
        self.change = Change::Updated;
    }

    pub fn set_purged(&mut self) {
        self.change = Change::Purged;
    }

    pub fn change(&self) -> Change {
        self.change
    }

    /// A fact about the resource, for the server's parameter store.
    pub fn set_fact(&mut self, name: impl Into<String>, value: impl Into<String>, expires: bool) {
        let name = name.into();
        self.facts.retain(|f| f.name != name);
        self.facts.push(FactReport {
            name,
            value: value.into(),
            expires,
        });
    }

    pub fn into_parts(
        self,
    ) -> (
        Vec<LogLine>,
        BTreeMap<String, AttributeChange>,
        Change,
        Vec<FactReport>,
    ) {
        (self.messages, self.changes, self.change, self.facts)
    }
}
