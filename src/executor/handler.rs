//! The handler interface (SCHEDULER.md §6.2, §6.3).
//!
//! A [`CrudHandler`] reads the current state of a resource, and creates, updates or deletes
//! it; [`run_crud`] drives it with the reference's algorithm: read a copy of the desired
//! state with `purged=false`, diff (attributes whose desired value is null are "don't care"),
//! then create / update / delete according to the purge table, or only report in a dry-run.
//! Handlers that do not fit that shape implement [`Handler`] directly.

use std::collections::BTreeMap;

use serde_json::Value;

use super::context::{Attrs, Context};
use super::protocol::Outcome;
use crate::model::diff::AttributeChange;

#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error("{0}")]
    Failed(String),
    /// Skip this resource (retried like a failure).
    #[error("skipped: {0}")]
    Skip(String),
    /// Skip until the dependencies succeed.
    #[error("skipped for dependencies: {0}")]
    SkipForDependencies(String),
}

impl From<std::io::Error> for HandlerError {
    fn from(e: std::io::Error) -> HandlerError {
        HandlerError::Failed(e.to_string())
    }
}

pub type HResult<T> = Result<T, HandlerError>;

/// Any handler: run one action and say how it ended.
pub trait Handler: Send + Sync {
    fn execute(&self, ctx: &mut Context, desired: &Attrs) -> Outcome;

    /// Report the resource's facts (`ctx.set_fact`) when the server asks for them, changing
    /// nothing. Most built-in handlers know none.
    fn facts(&self, ctx: &mut Context, desired: &Attrs) -> Outcome {
        let _ = (ctx, desired);
        Outcome::Dry
    }
}

pub trait CrudHandler: Send + Sync {
    /// Make `current` (a copy of the desired attributes with `purged=false`) describe reality.
    /// Return false when the resource does not exist.
    fn read(&self, ctx: &mut Context, current: &mut Attrs) -> HResult<bool>;

    /// The attribute changes between reality and intent.
    fn diff(
        &self,
        ctx: &mut Context,
        current: &Attrs,
        desired: &Attrs,
    ) -> BTreeMap<String, AttributeChange> {
        let _ = ctx;
        default_diff(current, desired)
    }

    fn create(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()>;
    fn update(
        &self,
        ctx: &mut Context,
        changes: &BTreeMap<String, AttributeChange>,
        desired: &Attrs,
    ) -> HResult<()>;
    fn delete(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()>;

    /// Called after a deploy when a requirement changed (events), for handlers that reload.
    fn reload(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let _ = (ctx, desired);
        Ok(())
    }

    fn can_reload(&self) -> bool {
        false
    }

    /// What the resource's facts are now (`ctx.set_fact`), read only; see [`Handler::facts`].
    fn facts(&self, ctx: &mut Context, desired: &Attrs) -> HResult<()> {
        let _ = (ctx, desired);
        Ok(())
    }
}

/// Attributes never compared: bookkeeping of the orchestrator, not of the target.
pub const META_ATTRIBUTES: [&str; 4] =
    ["send_event", "receive_events", "purge_on_delete", "managed"];

/// Every attribute whose desired value is not null and differs from the current one.
pub fn default_diff(current: &Attrs, desired: &Attrs) -> BTreeMap<String, AttributeChange> {
    let mut out = BTreeMap::new();
    for (k, d) in desired {
        if d.is_null() || META_ATTRIBUTES.contains(&k.as_str()) {
            continue;
        }
        let c = current.get(k).cloned().unwrap_or(Value::Null);
        if &c != d {
            out.insert(
                k.clone(),
                AttributeChange {
                    current: c,
                    desired: d.clone(),
                },
            );
        }
    }
    out
}

fn purged(a: &Attrs) -> bool {
    a.get("purged").and_then(Value::as_bool).unwrap_or(false)
}

/// The CRUD algorithm of SCHEDULER.md §6.3.
pub fn run_crud<H: CrudHandler + ?Sized>(h: &H, ctx: &mut Context, desired: &Attrs) -> Outcome {
    match crud_steps(h, ctx, desired) {
        Ok(outcome) => outcome,
        Err(HandlerError::Skip(m)) => {
            ctx.info(format!("skipped: {m}"), &[]);
            Outcome::Skipped
        }
        Err(HandlerError::SkipForDependencies(m)) => {
            ctx.info(format!("skipped for dependencies: {m}"), &[]);
            Outcome::SkippedForDependency
        }
        Err(HandlerError::Failed(m)) => {
            ctx.error(
                format!("failed: {m}"),
                &[("error", Value::String(m.clone()))],
            );
            Outcome::Failed
        }
    }
}

fn crud_steps<H: CrudHandler + ?Sized>(
    h: &H,
    ctx: &mut Context,
    desired: &Attrs,
) -> HResult<Outcome> {
    let mut current = desired.clone();
    current.insert("purged".into(), Value::Bool(false));
    let exists = h.read(ctx, &mut current)?;
    let want_purged = purged(desired);
    let changes = if exists {
        h.diff(ctx, &current, desired)
    } else if !want_purged {
        [(
            "purged".to_string(),
            AttributeChange {
                current: Value::Bool(true),
                desired: Value::Bool(false),
            },
        )]
        .into()
    } else {
        BTreeMap::new()
    };
    ctx.set_changes(changes.clone());
    if ctx.dry_run {
        if !changes.is_empty() {
            ctx.info(
                "a deploy would change this resource",
                &[(
                    "changes",
                    serde_json::to_value(&changes).unwrap_or_default(),
                )],
            );
        }
        return Ok(Outcome::Dry);
    }
    // what was done, unless the handler said more precisely
    let unset = |ctx: &Context| ctx.change() == super::protocol::Change::Nochange;
    if changes.contains_key("purged") {
        if want_purged {
            h.delete(ctx, desired)?;
            if unset(ctx) {
                ctx.set_purged();
            }
        } else {
            h.create(ctx, desired)?;
            if unset(ctx) {
                ctx.set_created();
            }
        }
    } else if !want_purged && !changes.is_empty() {
        h.update(ctx, &changes, desired)?;
        if unset(ctx) {
            ctx.set_updated();
        }
    }
    if ctx.reload && h.can_reload() && !want_purged {
        ctx.info("a requirement changed: reloading", &[]);
        h.reload(ctx, desired)?;
    }
    Ok(Outcome::Deployed)
}

/// A [`CrudHandler`] is a [`Handler`].
pub struct Crud<H>(pub H);

impl<H: CrudHandler> Handler for Crud<H> {
    fn execute(&self, ctx: &mut Context, desired: &Attrs) -> Outcome {
        run_crud(&self.0, ctx, desired)
    }

    fn facts(&self, ctx: &mut Context, desired: &Attrs) -> Outcome {
        match self.0.facts(ctx, desired) {
            Ok(()) => Outcome::Dry,
            Err(e) => {
                ctx.error(format!("reading facts failed: {e}"), &[]);
                Outcome::Failed
            }
        }
    }
}
