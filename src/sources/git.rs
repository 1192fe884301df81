//! Blocking git operations for Steward, implemented with gitoxide (`gix`).
//!
//! Every function here blocks (network, disk); call them from `tokio::task::spawn_blocking`.
//! Callers should serialise `ensure_mirror` calls per mirror directory.
//!
//! Design notes:
//! * Mirrors are bare repositories whose `refs/heads/*` mirror the remote's branches
//!   (refspec `+refs/heads/*:refs/heads/*`, no tags). Branches deleted upstream are pruned.
//! * Repositories are opened "isolated": no system/user git config and no `GIT_*` environment
//!   variables are read, so behaviour does not depend on the host's git setup.
//! * Never interactive: credentials come only from [`Auth`]; the credential callback fails instead
//!   of prompting, and ssh runs with `BatchMode=yes`.
//! * Local (`file://` or plain path) remotes are served by spawning `git-upload-pack`, so the `git`
//!   binary must be installed for those. ssh remotes spawn the `ssh` binary.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use gix::bstr::{BString, ByteSlice};
use gix::objs::tree::EntryKind;
use gix::remote::Direction;

/// Fetch refspec of a mirror: every remote branch, force-updated, under the same name.
pub const FETCH_REFSPEC: &str = "+refs/heads/*:refs/heads/*";
/// User name sent with [`Auth::Token`] (GitHub convention; GitLab and Gitea accept any user name).
pub const TOKEN_USERNAME: &str = "x-access-token";
/// Name of the remote written into the mirror's config.
pub const REMOTE_NAME: &str = "origin";

/// How to authenticate against the remote.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// No credentials (public https, local paths, or ssh using the process's own ssh setup).
    None,
    /// https token, sent as HTTP basic auth `x-access-token:<token>` when the server asks (401).
    Token(String),
    /// ssh private key (OpenSSH format) and known_hosts content (host-key checking is strict).
    Ssh {
        private_key: String,
        known_hosts: String,
    },
}

impl std::fmt::Debug for Auth {
    // Never print secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("Auth::None"),
            Auth::Token(_) => f.write_str("Auth::Token(<redacted>)"),
            Auth::Ssh { .. } => f.write_str("Auth::Ssh { <redacted> }"),
        }
    }
}

impl Auth {
    /// The credentials a source carries: an SSH key (with its known_hosts), else a token.
    pub fn of(src: &crate::store::sources::SourceRow) -> Auth {
        match (&src.ssh_key, &src.known_hosts, &src.token) {
            (Some(key), Some(kh), _) => Auth::Ssh {
                private_key: key.clone(),
                known_hosts: kh.clone(),
            },
            (_, _, Some(t)) => Auth::Token(t.clone()),
            _ => Auth::None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitError {
    /// The repository, branch, commit or path does not exist (or is not visible to us).
    #[error("not found: {0}")]
    NotFound(String),
    /// Credentials are missing or were rejected (includes ssh host-key verification failures).
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("git error: {0}")]
    Other(String),
}

impl GitError {
    /// The error kind an API answer carries.
    pub fn kind(&self) -> &'static str {
        match self {
            GitError::NotFound(_) => "not_found",
            GitError::Auth(_) => "auth_failed",
            GitError::Other(_) => "git_error",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ensure_mirror
// ---------------------------------------------------------------------------------------------

/// Create the bare mirror at `mirror_dir` if needed and fetch all branches of `url` into it.
pub fn ensure_mirror(mirror_dir: &Path, url: &str, auth: &Auth) -> Result<(), GitError> {
    with_remote(mirror_dir, url, auth, |repo, parsed, token| {
        fetch_into(repo, url, parsed, token, &[FETCH_REFSPEC], true).map(|_| ())
    })
}

/// Open (or create) the mirror, set up credentials for `url`, and run `f` with it; a failure
/// of `f` is classified as a fetch error (authentication, not found, other).
fn with_remote<T>(
    mirror_dir: &Path,
    url: &str,
    auth: &Auth,
    f: impl FnOnce(&gix::Repository, &gix::Url, Option<String>) -> Result<T, gix::Error>,
) -> Result<T, GitError> {
    let parsed = gix::url::parse(url.as_bytes().as_bstr())
        .map_err(|e| GitError::Other(format!("invalid repository url {url:?}: {e}")))?;
    let scheme = parsed.scheme.clone();
    let shown_url = redact_url(&parsed);
    let token = match (auth, &scheme) {
        (Auth::None, _) => None,
        (Auth::Token(t), gix::url::Scheme::Https | gix::url::Scheme::Http) => Some(t.clone()),
        (Auth::Ssh { .. }, gix::url::Scheme::Ssh) => None,
        (auth, scheme) => {
            return Err(GitError::Other(format!(
                "{auth:?} cannot be used with a {} url ({shown_url})",
                scheme.as_str()
            )));
        }
    };

    if !mirror_dir.join("HEAD").is_file() {
        create_mirror(mirror_dir, url)?;
    }

    // For ssh we always go through a generated wrapper script: it pins the options
    // (BatchMode, key, known_hosts, timeouts) and captures ssh's stderr so we can classify errors.
    let ssh = if scheme == gix::url::Scheme::Ssh {
        Some(SshSetup::new(auth)?)
    } else {
        None
    };
    let mut overrides: Vec<String> = Vec::new();
    if let Some(ssh) = &ssh {
        let cmd = ssh.wrapper.to_str().ok_or_else(|| {
            GitError::Other(format!("temporary path {:?} is not UTF-8", ssh.wrapper))
        })?;
        overrides.push(format!("core.sshCommand={cmd}"));
        overrides.push("ssh.variant=ssh".into());
    }
    let repo = open_mirror_with(mirror_dir, overrides)?;
    update_remote_config_if_needed(&repo, mirror_dir, url)?;

    f(&repo, &parsed, token).map_err(|err| {
        let stderr = ssh.as_ref().map(|s| s.stderr()).unwrap_or_default();
        classify_fetch_error(&shown_url, &err, &stderr)
    })
}

/// The remote at `url`, fetching `refspecs` and no tags.
fn fetch_remote<'r>(
    repo: &'r gix::Repository,
    url: &str,
    refspecs: &[&str],
) -> Result<gix::Remote<'r>, gix::Error> {
    Ok(repo
        .remote_at(url)?
        .with_refspecs(refspecs.iter().copied(), Direction::Fetch)?
        .with_fetch_tags(gix::remote::fetch::Tags::None))
}

/// The credentials callback of a connection to `parsed`: the token, to its host only.
fn token_credentials(
    parsed: &gix::Url,
    token: Option<String>,
) -> impl FnMut(
    gix::credentials::helper::Action,
) -> gix::Result<Option<gix::credentials::protocol::Outcome>>
+ 'static {
    let expected_host = parsed.host().map(str::to_owned);
    move |action| credentials(action, token.as_deref(), expected_host.as_deref())
}

/// Fetch `refspecs`; `prune`: delete local branches the remote no longer has (only for the
/// branch refspec, which maps every branch).
fn fetch_into(
    repo: &gix::Repository,
    url: &str,
    parsed: &gix::Url,
    token: Option<String>,
    refspecs: &[&str],
    prune: bool,
) -> Result<(), gix::Error> {
    let remote = fetch_remote(repo, url, refspecs)?;
    let outcome = remote
        .connect(Direction::Fetch)?
        .with_credentials(token_credentials(parsed, token))
        .prepare_fetch(gix::progress::Discard, Default::default())?
        .receive(gix::progress::Discard, &AtomicBool::new(false))?;
    if prune {
        prune_stale_branches(repo, &outcome.ref_map)?;
    }
    Ok(())
}

/// Credential callback: hand out the token once (on a 401) and never prompt.
fn credentials(
    action: gix::credentials::helper::Action,
    token: Option<&str>,
    expected_host: Option<&str>,
) -> gix::Result<Option<gix::credentials::protocol::Outcome>> {
    use gix::credentials::helper::Action;
    match action {
        Action::Get(ctx) => {
            let Some(token) = token else {
                return Err(gix::Error::from_error(gix::error::unauthenticated(
                    "the remote requires authentication, but no credentials are configured \
                     (interactive prompting is disabled)",
                )));
            };
            // Don't leak the token to another host (e.g. after a cross-host redirect).
            let ctx_host = ctx.host.clone().or_else(|| {
                ctx.url
                    .as_ref()
                    .and_then(|u| gix::url::parse(u.as_bstr()).ok())
                    .and_then(|u| u.host().map(str::to_owned))
            });
            if let (Some(want), Some(got)) = (expected_host, ctx_host.as_deref())
                && !got.eq_ignore_ascii_case(want)
            {
                return Err(gix::Error::from_error(gix::error::unauthenticated(
                    format!(
                        "refusing to send the token to host {got:?} (configured host is {want:?})"
                    ),
                )));
            }
            Ok(Some(gix::credentials::protocol::Outcome {
                identity: gix::sec::identity::Account {
                    username: TOKEN_USERNAME.into(),
                    password: token.into(),
                    oauth_refresh_token: None,
                },
                next: ctx.into(),
            }))
        }
        // Store/Erase: nothing is persisted anywhere.
        Action::Store(_) | Action::Erase(_) => Ok(None),
    }
}

/// Delete local branches that the remote no longer advertises (like `git fetch --prune`).
fn prune_stale_branches(
    repo: &gix::Repository,
    ref_map: &gix::remote::fetch::RefMap,
) -> Result<(), gix::Error> {
    use gix::refs::transaction::{Change, PreviousValue, RefEdit, RefLog};
    let wanted: HashSet<&BString> = ref_map
        .mappings
        .iter()
        .filter_map(|m| m.local.as_ref())
        .collect();
    let mut edits = Vec::new();
    for reference in repo.references()?.local_branches()? {
        let reference = reference?;
        if !wanted.contains(&reference.name().as_bstr().to_owned()) {
            edits.push(RefEdit {
                change: Change::Delete {
                    expected: PreviousValue::MustExistAndMatch(reference.target().into_owned()),
                    log: RefLog::AndReference,
                },
                name: reference.name().to_owned(),
                deref: false,
            });
        }
    }
    if !edits.is_empty() {
        repo.edit_references(edits)?;
    }
    Ok(())
}

/// Initialise the bare repository in a sibling temp dir and move it into place atomically, so a
/// crash never leaves a half-initialised mirror behind.
fn create_mirror(mirror_dir: &Path, url: &str) -> Result<(), GitError> {
    if mirror_dir.exists() {
        let empty = std::fs::read_dir(mirror_dir)
            .map_err(|e| GitError::Other(format!("cannot read {}: {e}", mirror_dir.display())))?
            .next()
            .is_none();
        if !empty {
            return Err(GitError::Other(format!(
                "{} exists but is not a git repository",
                mirror_dir.display()
            )));
        }
    }
    let parent = mirror_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .map_err(|e| GitError::Other(format!("cannot create {}: {e}", parent.display())))?;
    let tmp = tempfile::Builder::new()
        .prefix(".mirror-init-")
        .tempdir_in(parent)
        .map_err(|e| {
            GitError::Other(format!(
                "cannot create temp dir in {}: {e}",
                parent.display()
            ))
        })?;
    gix::init_bare(tmp.path())
        .map_err(|e| GitError::Other(format!("cannot init bare repository: {}", describe(&e))))?;
    write_remote_config(tmp.path(), url)?;
    // rename(2) onto a missing or empty directory succeeds atomically.
    let tmp_path = tmp.keep();
    std::fs::rename(&tmp_path, mirror_dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp_path);
        GitError::Other(format!(
            "cannot move new mirror into {}: {e}",
            mirror_dir.display()
        ))
    })
}

/// Write `remote.origin.url` / `remote.origin.fetch` into the repository's own config file
/// (purely informational for humans and the git CLI: fetching always uses the `url` argument).
fn write_remote_config(git_dir: &Path, url: &str) -> Result<(), GitError> {
    let path = git_dir.join("config");
    let err = |e: &dyn std::fmt::Display| {
        GitError::Other(format!("cannot update {}: {e}", path.display()))
    };
    let mut config =
        gix::config::File::from_path_no_includes(path.clone(), gix::config::Source::Local)
            .map_err(|e| err(&e))?;
    config
        .set_raw_value(&format!("remote.{REMOTE_NAME}.url"), url)
        .map_err(|e| err(&e))?;
    config
        .set_raw_value(&format!("remote.{REMOTE_NAME}.fetch"), FETCH_REFSPEC)
        .map_err(|e| err(&e))?;
    let mut out = Vec::new();
    config.write_to(&mut out).map_err(|e| err(&e))?;
    let tmp = git_dir.join("config.steward-tmp");
    std::fs::write(&tmp, out).map_err(|e| err(&e))?;
    std::fs::rename(&tmp, &path).map_err(|e| err(&e))
}

fn update_remote_config_if_needed(
    repo: &gix::Repository,
    git_dir: &Path,
    url: &str,
) -> Result<(), GitError> {
    let config = repo.config_snapshot();
    let current_url = config.string(format!("remote.{REMOTE_NAME}.url").as_str());
    let current_fetch = config.string(format!("remote.{REMOTE_NAME}.fetch").as_str());
    if current_url.as_deref().map(|u| u.as_bytes()) != Some(url.as_bytes())
        || current_fetch.as_deref().map(|f| f.as_bytes()) != Some(FETCH_REFSPEC.as_bytes())
    {
        write_remote_config(git_dir, url)?;
    }
    Ok(())
}

/// Temporary ssh setup: key, known_hosts, a wrapper script and a file capturing ssh's stderr.
/// Everything lives in a 0700 temp dir that is deleted on drop.
struct SshSetup {
    dir: tempfile::TempDir,
    wrapper: PathBuf,
}

impl SshSetup {
    fn new(auth: &Auth) -> Result<Self, GitError> {
        let io = |what: &str, e: std::io::Error| {
            GitError::Other(format!("ssh setup: cannot {what}: {e}"))
        };
        // tempfile creates the directory with mode 0700.
        let dir = tempfile::Builder::new()
            .prefix("steward-ssh-")
            .tempdir()
            .map_err(|e| io("create temp dir", e))?;
        let stderr_path = dir.path().join("stderr");
        let mut args: Vec<String> = Vec::new();
        if let Auth::Ssh {
            private_key,
            known_hosts,
        } = auth
        {
            let key_path = dir.path().join("id");
            let mut key = private_key.clone();
            if !key.ends_with('\n') {
                key.push('\n'); // OpenSSH rejects key files without a final newline
            }
            write_file(&key_path, key.as_bytes(), 0o600).map_err(|e| io("write key", e))?;
            let kh_path = dir.path().join("known_hosts");
            write_file(&kh_path, known_hosts.as_bytes(), 0o600)
                .map_err(|e| io("write known_hosts", e))?;
            args.extend([
                "-i".into(),
                shell_quote(&key_path),
                "-o".into(),
                "IdentitiesOnly=yes".into(),
                "-o".into(),
                format!("UserKnownHostsFile={}", shell_quote(&kh_path)),
                "-o".into(),
                "GlobalKnownHostsFile=/dev/null".into(),
            ]);
        }
        args.extend(
            [
                "StrictHostKeyChecking=yes",
                "BatchMode=yes",
                "ConnectTimeout=30",
                "ServerAliveInterval=15",
                "ServerAliveCountMax=4",
            ]
            .iter()
            .flat_map(|o| ["-o".to_string(), o.to_string()]),
        );
        let script = format!(
            "#!/bin/sh\nexec ssh {} \"$@\" 2>>{}\n",
            args.join(" "),
            shell_quote(&stderr_path)
        );
        let wrapper = dir.path().join("ssh");
        write_file(&wrapper, script.as_bytes(), 0o700).map_err(|e| io("write ssh wrapper", e))?;
        Ok(SshSetup { dir, wrapper })
    }

    /// What ssh and the remote side printed on stderr (last 2000 bytes at most).
    fn stderr(&self) -> String {
        let bytes = std::fs::read(self.dir.path().join("stderr")).unwrap_or_default();
        let tail = &bytes[bytes.len().saturating_sub(2000)..];
        String::from_utf8_lossy(tail).trim().to_string()
    }
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"))
}

fn redact_url(url: &gix::Url) -> String {
    let mut url = url.clone();
    url.set_password(None);
    url.to_bstring().to_string()
}

/// Map a fetch failure to NotFound / Auth / Other. `ssh_stderr` is what ssh (and the remote
/// `git-upload-pack`) printed, if the transport was ssh.
fn classify_fetch_error(url: &str, err: &gix::Error, ssh_stderr: &str) -> GitError {
    let chain = describe(err);
    let mut msg = format!("fetching {url}: {chain}");
    if !ssh_stderr.is_empty() {
        msg.push_str(&format!(" (ssh: {})", ssh_stderr.replace('\n', " | ")));
    }
    let chain_lc = chain.to_lowercase();
    let ssh_lc = ssh_stderr.to_lowercase();
    let any = |needles: &[&str]| {
        needles
            .iter()
            .any(|n| chain_lc.contains(n) || ssh_lc.contains(n))
    };

    if err.is_unauthenticated()
        || err.is_permission_denied()
        || any(&[
            "permission denied",
            "host key verification failed",
            "no matching host key",
            "remote host identification has changed",
            "load key",
            "authentication failed",
            "invalid credentials",
        ])
    {
        return GitError::Auth(msg);
    }
    if any(&[
        "http status 404",
        "repository not found",
        "does not appear to be a git repository",
        "could not verify that",
        "project you were looking for could not be found",
        "no such repository",
    ]) {
        return GitError::NotFound(msg);
    }
    GitError::Other(msg)
}

// ---------------------------------------------------------------------------------------------
// Read-only queries
// ---------------------------------------------------------------------------------------------

fn open_mirror(mirror_dir: &Path) -> Result<gix::Repository, GitError> {
    open_mirror_with(mirror_dir, Vec::new())
}

fn open_mirror_with(
    mirror_dir: &Path,
    overrides: Vec<String>,
) -> Result<gix::Repository, GitError> {
    if !mirror_dir.exists() {
        return Err(GitError::NotFound(format!(
            "mirror {} does not exist",
            mirror_dir.display()
        )));
    }
    let opts = gix::open::Options::isolated().config_overrides(overrides);
    gix::open_opts(mirror_dir, opts).map_err(|e| {
        GitError::Other(format!(
            "cannot open mirror {}: {}",
            mirror_dir.display(),
            describe(&e)
        ))
    })
}

fn branch_ref_name(branch: &str) -> Result<String, GitError> {
    let full = if branch.starts_with("refs/heads/") {
        branch.to_string()
    } else {
        format!("refs/heads/{branch}")
    };
    gix::validate::reference::name(full.as_bytes().as_bstr())
        .map_err(|e| GitError::Other(format!("invalid branch name {branch:?}: {e}")))?;
    Ok(full)
}

fn parse_commit_id(commit_hex: &str) -> Result<gix::ObjectId, GitError> {
    gix::ObjectId::from_hex(commit_hex.trim().as_bytes()).map_err(|e| {
        GitError::Other(format!(
            "invalid commit id {commit_hex:?} (need full hex): {e}"
        ))
    })
}

fn other(context: impl std::fmt::Display) -> impl FnOnce(gix::Error) -> GitError {
    move |e| GitError::Other(format!("{context}: {}", describe(&e)))
}

/// One-line description of a gix error including all its causes ("a: b: c").
fn describe(err: &gix::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for e in err.iter_errors() {
        let s = e.to_string();
        if s.is_empty() || parts.iter().any(|p| p.contains(&s)) {
            continue;
        }
        parts.push(s);
    }
    parts.join(": ")
}

mod checkout;
mod history;
mod merge;
mod pulls;
#[cfg(test)]
mod test_git;
mod tree;
pub use checkout::checkout;
use history::project_dir_id;
pub use history::{
    commit_on_branch, commits_between, has_commit, is_ancestor_or_equal, read_file, resolve_branch,
    subtree_changed,
};
pub use merge::{Merge, merge_for_preview, parents};
pub use pulls::{PullRefs, drop_pull, fetch_pull, list_pull_heads};
pub use tree::{ProjectTree, could_run_code, project_tree, read_blob};
