//! What the scheduler and an executor process say to each other: one JSON document per line
//! on the executor's stdin (work) and stdout (results).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::model::Resource;
use crate::model::diff::AttributeChange;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// Make reality match the intent.
    Deploy,
    /// Report what a deploy would change, change nothing.
    Dryrun,
    /// Report the resource's facts (an Inmanta handler's `facts()`), change nothing.
    Facts,
}

/// What a handler run ended in (SCHEDULER.md §2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Deployed,
    Failed,
    Skipped,
    SkippedForDependency,
    /// no handler, crashed executor, unreadable resource
    Unavailable,
    /// the handler did not finish in time and its executor was killed
    TimedOut,
    /// a dry-run finished
    Dry,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Deployed => "deployed",
            Outcome::Failed => "failed",
            Outcome::Skipped => "skipped",
            Outcome::SkippedForDependency => "skipped_for_dependency",
            Outcome::Unavailable => "unavailable",
            Outcome::TimedOut => "timed_out",
            Outcome::Dry => "dry",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    #[default]
    Nochange,
    Created,
    Updated,
    Purged,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Nochange => "nochange",
            Change::Created => "created",
            Change::Updated => "updated",
            Change::Purged => "purged",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    pub level: String,
    pub message: String,
    #[serde(default)]
    pub fields: serde_json::Map<String, serde_json::Value>,
    pub at: DateTime<Utc>,
}

/// A fact a handler learned about its resource: `ctx.set_fact(name, value, expires)` during an
/// action, or what its `facts()` answered when asked. The value as Inmanta stores it: a
/// string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactReport {
    pub name: String,
    pub value: String,
    /// Renewed and expiring (`fact_expire`); false: kept until the resource is gone.
    #[serde(default = "default_true")]
    pub expires: bool,
}

fn default_true() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkItem {
    pub action_id: Uuid,
    pub kind: ActionKind,
    pub resource: Resource,
    /// The model version the action belongs to (drives per-version cache expiry).
    pub version: i32,
    /// A requirement with events changed since this resource last deployed successfully.
    #[serde(default)]
    pub reload: bool,
    /// The module code handling this resource type, when it is not built in.
    #[serde(default)]
    pub handler: Option<ExternalHandler>,
    /// Seconds the action may take (the environment's handler timeout).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// The executor runs where the model routes the resource's agent (an external agent
    /// process, or over SSH): its route attribute is satisfied. A server-side executor
    /// refuses routed resources.
    #[serde(default)]
    pub at_target: bool,
    /// The environment the resource belongs to: what a handler's client is scoped to
    /// (`self._agent.environment` of an Inmanta handler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Uuid>,
    /// The model waits for a fact of this resource (an unresolved unknown of its version):
    /// built-in handlers report their facts with the deploy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub want_facts: bool,
}

/// Handler code shipped by a module, materialized on this machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExternalHandler {
    /// Directory holding the module's handler files (one per code digest).
    pub dir: std::path::PathBuf,
    /// The entry point, relative to `dir`.
    pub entry: String,
    pub digest: String,
    /// An Inmanta module's Python (`@provider` handlers): run by the handler host
    /// (`python/steward_handler_host.py`) in a Python environment holding the requirements,
    /// rather than by starting `entry`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inmanta: Option<crate::model::InmantaCode>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkResult {
    pub action_id: Uuid,
    pub outcome: Outcome,
    pub change: Change,
    #[serde(default)]
    pub changes: BTreeMap<String, AttributeChange>,
    #[serde(default)]
    pub messages: Vec<LogLine>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// The resource as the handler last saw it (after the action), when it reads state.
    #[serde(default)]
    pub state: Option<serde_json::Map<String, serde_json::Value>>,
    /// Facts the handler reported about the resource.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub facts: Vec<FactReport>,
}

/// Scheduler -> executor.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Work(Box<WorkItem>),
    /// The deploy of this model version is done (no answer): handlers drop what they cached
    /// for it (`@cache(for_version=True)` of Inmanta handlers).
    VersionDone {
        version: i32,
    },
    /// The answer to a handler's [`Reply::Call`].
    Answer(super::calls::CallAnswer),
    /// Do not start this action if it has not started (its agent was paused, or the
    /// environment halted, while it waited in the executor's input behind another): the
    /// executor answers [`Reply::Withdrawn`]. One already running or done is not affected
    /// (its result comes as usual), and neither is an executor too old to know this request
    /// (it logs a bad line and goes on).
    Withdraw {
        action_id: Uuid,
    },
    Shutdown,
}

/// Executor -> scheduler.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ready {
        pid: u32,
    },
    Result(Box<WorkResult>),
    /// A handler calls the server in the middle of its action (Inmanta's `get_client()`):
    /// the executor waits for the [`Request::Answer`] (see [`super::calls`]).
    Call(Box<super::calls::ServerCall>),
    /// The action was withdrawn ([`Request::Withdraw`]) before it started: nothing of it ran.
    Withdrawn {
        action_id: Uuid,
    },
}

/// Text PostgreSQL cannot store (a NUL byte, in `text` or `jsonb`), replaced by U+FFFD.
fn clean_text(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\u{FFFD}");
    }
}

/// [`clean_text`] over every string of a JSON value, keys included.
pub fn clean_json(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => clean_text(s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(clean_json),
        serde_json::Value::Object(m) => clean_map(m),
        _ => {}
    }
}

fn clean_map(m: &mut serde_json::Map<String, serde_json::Value>) {
    if m.keys().any(|k| k.contains('\0')) {
        let old = std::mem::take(m);
        for (mut k, v) in old {
            clean_text(&mut k);
            m.insert(k, v);
        }
    }
    m.values_mut().for_each(clean_json);
}

impl WorkResult {
    /// Make what a handler reported storable: its output is whatever the handler (or the
    /// command it ran) printed, and one NUL byte must not cost the resource its state, nor
    /// one flood of output the server its memory ([`super::limits`]).
    pub fn sanitize(&mut self) {
        super::limits::bound_result(self);
        for line in &mut self.messages {
            clean_text(&mut line.level);
            clean_text(&mut line.message);
            clean_map(&mut line.fields);
        }
        let changes = std::mem::take(&mut self.changes);
        for (mut k, mut c) in changes {
            clean_text(&mut k);
            clean_json(&mut c.current);
            clean_json(&mut c.desired);
            self.changes.insert(k, c);
        }
        if let Some(state) = &mut self.state {
            clean_map(state);
        }
        for f in &mut self.facts {
            clean_text(&mut f.name);
            clean_text(&mut f.value);
        }
    }
}

#[cfg(test)]
mod sanitize_tests {
    use super::*;

    #[test]
    fn nul_bytes_are_replaced_everywhere() {
        let mut v = serde_json::json!({"a\u{0}": ["x\u{0}y", {"k": "\u{0}"}], "n": 1});
        clean_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a\u{FFFD}": ["x\u{FFFD}y", {"k": "\u{FFFD}"}], "n": 1})
        );
    }
}
