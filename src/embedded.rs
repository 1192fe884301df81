//! The all-in-one `steward deploy`: a private server (its PostgreSQL cluster is
//! `store::cluster`, shared with `steward server`), its scheduler, and progress, in one run.

pub mod deploy;
pub mod warm;
