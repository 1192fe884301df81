//! Inmanta modules' `@provider` handlers in an executor.
//!
//! Their code (`inmanta_plugins/<module>/…`, shipped per version like any handler code) runs
//! in Steward's handler host (`python/steward_handler_host.py`), with the `inmanta`
//! compatibility package (`pycompat::materialize`) first on `sys.path` and the code directory
//! after it, in a Python environment holding the modules' requirements: one virtualenv per
//! requirement set and Python version under `<code dir>/_venv/<hash>/`, created once (under a
//! file lock, so executors starting together wait for the first) and shared by every code
//! version with the same requirements. Requirements that name Inmanta modules
//! (`inmanta-module-*`) or inmanta-core are not installed: module code comes with the version,
//! and `inmanta` is the compatibility package.
//!
//! The host runs the handler's own action logic (`deploy`/`execute`, CRUD, `pre`/`post`,
//! reload) and answers one `execute` request per action with its status, change, attribute
//! changes and log records (docs/integrations.md, "Inmanta handlers").

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::context::Context;
use super::protocol::{ExternalHandler, Outcome};
use crate::model::InmantaCode;
use crate::model::diff::AttributeChange;

/// The handler host, under the materialized `python/` tree.
pub const HOST: &str = "steward_handler_host.py";

/// How to start a handler process.
pub struct Launch {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub pythonpath: OsString,
    /// Added to the `hello` request.
    pub hello: Value,
    /// Held while the process runs: the code directory and Python environment it uses stay
    /// (see [`crate::pyenv::reap`]).
    pub in_use: Vec<crate::pyenv::reap::InUse>,
}

/// How to start the handler host for `code` (creating its Python environment if needed).
pub fn launch(h: &ExternalHandler, code: &InmantaCode) -> Result<Launch, String> {
    let base = h
        .dir
        .parent()
        .ok_or_else(|| format!("the handler code {} has no parent", h.dir.display()))?;
    let tree = crate::pycompat::materialize(base).map_err(|e| {
        format!(
            "writing Steward's Python package under {}: {e}",
            base.display()
        )
    })?;
    let (python, env_in_use) = python_for(base, &code.requirements)?;
    let pythonpath = std::env::join_paths([tree.as_path(), h.dir.as_path()])
        .map_err(|e| format!("a path that can not be on PYTHONPATH: {e}"))?;
    Ok(Launch {
        program: python.into_os_string(),
        args: vec!["-u".into(), tree.join(HOST).into_os_string()],
        pythonpath,
        hello: json!({"imports": code.imports}),
        in_use: env_in_use.into_iter().collect(),
    })
}

/// The name of a pip requirement, normalized (`Foo_Bar[x]>=1` -> `foo-bar`).
fn requirement_name(r: &str) -> String {
    let end = r
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(r.len());
    r[..end].to_ascii_lowercase().replace(['_', '.'], "-")
}

/// The requirements an executor installs: not the Inmanta modules themselves (their code
/// comes with the version) nor inmanta-core (the compatibility package stands in for it).
pub fn installable(requirements: &[String]) -> Vec<String> {
    let mut out: Vec<String> = requirements
        .iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty() && !r.starts_with('#'))
        .filter(|r| {
            let n = requirement_name(r);
            !(n.starts_with("inmanta-module-") || n == "inmanta-core" || n == "inmanta")
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn base_python() -> String {
    std::env::var("STEWARD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The Python interpreter to run handlers needing `requirements`: the base one when nothing is
/// to be installed, else that of the virtualenv for this requirement set under
/// `<base>/_venv/` (made once, see [`crate::pyenv`]).
pub fn python_for(
    base: &Path,
    requirements: &[String],
) -> Result<(PathBuf, Option<crate::pyenv::reap::InUse>), String> {
    let python = base_python();
    let reqs = installable(requirements);
    if reqs.is_empty() {
        return Ok((PathBuf::from(python), None));
    }
    let opts = crate::pyenv::InstallOptions {
        base_python: python,
        only_binary: false,
        // the executor runs in its environment's sandbox already
        sandbox: None,
        // inmanta-core and the modules are never among what it installs (`installable`)
        provide_core: false,
    };
    let made = crate::pyenv::ensure_shared(&base.join("_venv"), &reqs.join("\n"), base, &opts)
        .map_err(|e| {
            format!(
                "installing the handlers' Python requirements ({}) failed: {e}",
                reqs.join(", ")
            )
        })?;
    Ok((made.python(), Some(made.in_use)))
}

/// Report the host's answer to `execute` into `ctx`: logs, changes, what was done, and the
/// outcome.
pub fn apply_answer(ctx: &mut Context, answer: &Value) -> Outcome {
    super::external::log_records(ctx, answer);
    take_facts(ctx, answer);
    if answer.get("ok") != Some(&Value::Bool(true)) {
        let msg = answer
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the handler host reported a failure without a message");
        let mut fields = vec![];
        if let Some(tb) = answer.get("traceback") {
            fields.push(("traceback", tb.clone()));
        }
        ctx.error(format!("failed: {msg}"), &fields);
        return Outcome::Failed;
    }
    if let Some(changes) = answer.get("changes").and_then(Value::as_object) {
        let parsed = changes
            .iter()
            .map(|(k, c)| {
                (
                    k.clone(),
                    AttributeChange {
                        current: c.get("current").cloned().unwrap_or(Value::Null),
                        desired: c.get("desired").cloned().unwrap_or(Value::Null),
                    },
                )
            })
            .collect();
        ctx.set_changes(parsed);
    }
    match answer.get("change").and_then(Value::as_str) {
        Some("created") => ctx.set_created(),
        Some("updated") => ctx.set_updated(),
        Some("purged") => ctx.set_purged(),
        _ => {}
    }
    match answer.get("status").and_then(Value::as_str) {
        Some("deployed") => Outcome::Deployed,
        Some("dry") => Outcome::Dry,
        Some("skipped") => Outcome::Skipped,
        Some("unavailable") => Outcome::Unavailable,
        Some("failed") => Outcome::Failed,
        other => {
            ctx.error(
                format!(
                    "the handler ended in a state Steward does not know: {}",
                    other.unwrap_or("none")
                ),
                &[],
            );
            Outcome::Failed
        }
    }
}

/// The facts of an answer (`"facts": [{"id"|"name", "value", "expires"}]`): values that are
/// not strings are stored as their JSON text, as Inmanta stores what is not a string as its
/// text.
pub fn take_facts(ctx: &mut Context, answer: &Value) {
    let Some(list) = answer.get("facts").and_then(Value::as_array) else {
        return;
    };
    for f in list {
        let name = f
            .get("id")
            .or_else(|| f.get("name"))
            .and_then(Value::as_str);
        let Some(name) = name else { continue };
        let value = match f.get("value") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => continue,
            Some(v) => v.to_string(),
        };
        let expires = f.get("expires").and_then(Value::as_bool).unwrap_or(true);
        ctx.set_fact(name, value, expires);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_packages_and_core_are_not_installed() {
        let reqs: Vec<String> = [
            "inmanta-module-std>=8",
            "Inmanta_Module_Mitogen",
            "inmanta-core~=14.0",
            "mitogen>=0.3",
            "PyYAML",
            "mitogen>=0.3",
            "# a comment",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(installable(&reqs), vec!["PyYAML", "mitogen>=0.3"]);
        assert_eq!(requirement_name("Foo_Bar[x]>=1"), "foo-bar");
    }
}
