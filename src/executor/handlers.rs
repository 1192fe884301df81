//! The built-in handlers, by resource type.

mod accounts;
pub mod exec;
pub mod fs;

use serde_json::Value;

use super::context::{Attrs, Context};
use super::handler::{Crud, Handler};
use super::protocol::Outcome;

/// std::testing::NullResource: does nothing; `fail=true` makes it fail (for tests).
pub struct NullHandler;

impl Handler for NullHandler {
    fn execute(&self, ctx: &mut Context, a: &Attrs) -> Outcome {
        if a.get("fail").and_then(Value::as_bool).unwrap_or(false) {
            ctx.error("failing as asked (fail=true)", &[]);
            return Outcome::Failed;
        }
        if ctx.dry_run {
            Outcome::Dry
        } else {
            Outcome::Deployed
        }
    }
}

/// std::AgentConfig: agents are managed by the scheduler; nothing to do on a target.
pub struct NoopHandler;

impl Handler for NoopHandler {
    fn execute(&self, ctx: &mut Context, _a: &Attrs) -> Outcome {
        if ctx.dry_run {
            Outcome::Dry
        } else {
            Outcome::Deployed
        }
    }
}

static FILE: Crud<fs::FileHandler> = Crud(fs::FileHandler);
static DIRECTORY: Crud<fs::DirectoryHandler> = Crud(fs::DirectoryHandler);
static SYMLINK: Crud<fs::SymlinkHandler> = Crud(fs::SymlinkHandler);
static RUN: exec::RunHandler = exec::RunHandler;
static NULL: NullHandler = NullHandler;
static NOOP: NoopHandler = NoopHandler;

/// The handler of a resource type, if steward has one built in.
pub fn builtin(type_name: &str) -> Option<&'static dyn Handler> {
    Some(match type_name {
        "fs::File" => &FILE,
        "fs::Directory" => &DIRECTORY,
        "fs::Symlink" => &SYMLINK,
        "exec::Run" => &RUN,
        "std::testing::NullResource" => &NULL,
        "std::AgentConfig" => &NOOP,
        _ => return None,
    })
}
