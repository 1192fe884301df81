//! The attacker suite (issue 26): each test takes the part of someone the trust model in
//! SECURITY.md limits (a committer of environment A, a scoped token, an agent token, a
//! replica secret, a machine reached over SSH), performs the attack it is named after against
//! environment B or the server, and asserts it is refused. Each fails while its hole is open.
//!
//! A test that can not perform its attack where it runs (it needs root, say) prints
//! `SKIPPED <test>: <reason>` and returns; it never passes without having tried.

mod committer;
mod previews;
mod ssh;
mod tokens;
pub(crate) mod unprivileged;

/// Say that `test` could not try its attack here, and why (the caller returns after it).
pub fn skipped(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

/// Whether this process runs as root (the server in the tests then runs as root too).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) can not fail
    unsafe { libc::geteuid() == 0 }
}
