//! Steward: an intent-based orchestrator for the Inmanta modelling language.
//!
//! The crate is one package with a library (every part lives here) and a thin binary
//! (`src/main.rs`). See `docs/architecture.md` for the parts and how they fit; each module
//! opens with a paragraph on its job and invariants. Section references in comments, such as
//! `(SCHEDULER.md §6.3)`, are to the design contracts in `docs/design/`.

pub mod agent;
pub mod alloc;
pub mod cli;
pub mod client;
// Diagnostics carry spans, notes and labels, so they are large; they travel only on the
// error path, once per error, where boxing them would buy nothing but noise.
#[allow(clippy::result_large_err)]
pub mod compiler;
pub mod embedded;
pub mod events;
pub mod executor;
pub mod model;
pub mod pycompat;
pub mod pyenv;
pub mod replicas;
pub mod sandbox;
pub mod scheduler;
pub mod server;
pub mod sources;
pub mod store;
