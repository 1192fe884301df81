//! Merging a pull request's head onto its base in the mirror, for a preview (issue 30,
//! docs/design/previews.md §3.2): the commit a preview compiles when the host offers no
//! usable merge commit of its own.
//!
//! The merge is made by `git merge-tree --write-tree` (git 2.38 or later) in the server's
//! mirror, and none of the pull request's code runs: a merge driver is configuration named
//! by attributes, and neither comes from the pull request. The command reads no
//! configuration but the mirror's own, which is Steward's (its environment is cleared,
//! system and global configuration are off, `HOME` points nowhere), and in the bare mirror
//! no attributes are read from the pull request's tree (a test shows that a merge taking
//! them from there would run the driver they name). The merge commit has fixed author, committer and time, so the same base and
//! head always give the same commit id.

use std::path::Path;
use std::process::{Command, Stdio};

use super::{GitError, open_mirror, parse_commit_id};

/// What merging head onto base gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Merge {
    /// The merge commit (parents: base, head).
    Clean(String),
    /// The files that conflict (nothing was written).
    Conflict(Vec<String>),
}

/// The parents of `commit_hex` in the mirror, in order. A host's merge commit is used for a
/// preview only when its parents are exactly the base tip and the head (hosts compute it
/// lazily, so it may be stale).
pub fn parents(mirror_dir: &Path, commit_hex: &str) -> Result<Vec<String>, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let id = parse_commit_id(commit_hex)?;
    let commit = repo
        .find_object(id)
        .map_err(|e| GitError::NotFound(format!("commit {commit_hex}: {e}")))?
        .try_into_commit()
        .map_err(|e| GitError::Other(format!("{commit_hex} is not a commit: {e}")))?;
    Ok(commit.parent_ids().map(|p| p.to_string()).collect())
}

/// A git command on the mirror that reads no configuration but the mirror's own and no
/// variable of the server's environment.
pub(super) fn git(mirror_dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("LC_ALL", "C")
        .arg(format!("--git-dir={}", mirror_dir.display()))
        .stdin(Stdio::null());
    c
}

fn run(mut c: Command, what: &str) -> Result<std::process::Output, GitError> {
    c.output()
        .map_err(|e| GitError::Other(format!("{what}: can not run git: {e}")))
}

fn hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Merge `head` onto `base` (full commit ids, both in the mirror) and keep the merge commit
/// under `refs/steward/preview/<name>` (`name`: letters, digits, `-` and `_`).
pub fn merge_for_preview(
    mirror_dir: &Path,
    base: &str,
    head: &str,
    name: &str,
) -> Result<Merge, GitError> {
    if !hex(base) || !hex(head) {
        return Err(GitError::Other(format!(
            "merge_for_preview needs full commit ids, not {base:?} and {head:?}"
        )));
    }
    if name.is_empty()
        || name.len() > 100
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(GitError::Other(format!(
            "{name:?} can not name a preview's merge"
        )));
    }
    let mut c = git(mirror_dir);
    c.args([
        "merge-tree",
        "--write-tree",
        "--name-only",
        "--no-messages",
        "-z",
        base,
        head,
    ]);
    let out = run(c, "merge-tree")?;
    // 0: clean, 1: conflicts; anything else is an error (an unknown commit, an old git)
    let conflicted = match out.status.code() {
        Some(0) => false,
        Some(1) => true,
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(
                if err.contains("unknown option") || err.contains("usage:") {
                    GitError::Other(
                    "merging for a preview needs git 2.38 or later (git merge-tree --write-tree)"
                        .into(),
                )
                } else {
                    GitError::Other(format!("merging {head} onto {base} failed: {}", err.trim()))
                },
            );
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split('\0');
    let tree = fields.next().unwrap_or_default().trim().to_string();
    if conflicted {
        let mut files: Vec<String> = fields
            .take_while(|f| !f.is_empty())
            .map(String::from)
            .collect();
        files.sort();
        files.dedup();
        return Ok(Merge::Conflict(files));
    }
    if !hex(&tree) {
        return Err(GitError::Other(format!(
            "git merge-tree answered no tree: {text:?}"
        )));
    }
    // fixed identity and time: the same base and head give the same commit
    let mut c = git(mirror_dir);
    for (k, v) in [
        ("GIT_AUTHOR_NAME", "Steward"),
        ("GIT_AUTHOR_EMAIL", "steward@localhost"),
        ("GIT_AUTHOR_DATE", "946684800 +0000"),
        ("GIT_COMMITTER_NAME", "Steward"),
        ("GIT_COMMITTER_EMAIL", "steward@localhost"),
        ("GIT_COMMITTER_DATE", "946684800 +0000"),
    ] {
        c.env(k, v);
    }
    c.args(["commit-tree", &tree, "-p", base, "-p", head, "-m"])
        .arg(format!("Preview: merge {head} onto {base}"));
    let out = run(c, "commit-tree")?;
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || !hex(&commit) {
        return Err(GitError::Other(format!(
            "writing the merge commit failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut c = git(mirror_dir);
    c.args([
        "update-ref",
        &format!("refs/steward/preview/{name}"),
        &commit,
    ]);
    let out = run(c, "update-ref")?;
    if !out.status.success() {
        return Err(GitError::Other(format!(
            "keeping the merge commit failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(Merge::Clean(commit))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A work repository and a bare mirror of it, made with the git CLI.
    struct Repos {
        _dir: tempfile::TempDir,
        work: std::path::PathBuf,
        mirror: std::path::PathBuf,
    }

    use super::super::test_git::sh;

    fn commit(r: &Repos, file: &str, text: &str) -> String {
        std::fs::write(r.work.join(file), text).unwrap();
        sh(&r.work, &["add", "-A"]);
        sh(&r.work, &["commit", "-q", "-m", file]);
        sh(&r.work, &["rev-parse", "HEAD"])
    }

    /// main with main.cf; a branch `pr` from it; returns (base tip, head) after `change`.
    fn repos(change: impl Fn(&Repos) -> (String, String)) -> (Repos, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let mirror = dir.path().join("mirror.git");
        std::fs::create_dir_all(&work).unwrap();
        sh(&work, &["init", "-q", "-b", "main"]);
        let r = Repos {
            _dir: dir,
            work,
            mirror,
        };
        commit(&r, "main.cf", "a = 1\nb = 2\n");
        let (base, head) = change(&r);
        sh(
            r.work.parent().unwrap(),
            &["clone", "-q", "--mirror", "work", "mirror.git"],
        );
        (r, base, head)
    }

    #[test]
    fn a_clean_merge_is_one_commit_of_base_and_head_with_both_changes_and_the_same_id_again() {
        let (r, base, head) = repos(|r| {
            sh(&r.work, &["checkout", "-q", "-b", "pr"]);
            let head = commit(r, "web.cf", "w = 1\n");
            sh(&r.work, &["checkout", "-q", "main"]);
            let base = commit(r, "db.cf", "d = 1\n");
            (base, head)
        });
        let Merge::Clean(m) = merge_for_preview(&r.mirror, &base, &head, "7").unwrap() else {
            panic!("a clean merge")
        };
        assert_eq!(
            parents(&r.mirror, &m).unwrap(),
            vec![base.clone(), head.clone()]
        );
        let files = sh(
            &r.mirror,
            &["ls-tree", "--name-only", "refs/steward/preview/7"],
        );
        assert_eq!(files, "db.cf\nmain.cf\nweb.cf");
        // the same inputs, the same commit
        assert_eq!(
            merge_for_preview(&r.mirror, &base, &head, "7").unwrap(),
            Merge::Clean(m)
        );
    }

    #[test]
    fn a_conflict_names_its_files_and_writes_no_ref() {
        let (r, base, head) = repos(|r| {
            sh(&r.work, &["checkout", "-q", "-b", "pr"]);
            let head = commit(r, "main.cf", "a = 10\nb = 2\n");
            sh(&r.work, &["checkout", "-q", "main"]);
            let base = commit(r, "main.cf", "a = 20\nb = 2\n");
            (base, head)
        });
        assert_eq!(
            merge_for_preview(&r.mirror, &base, &head, "8").unwrap(),
            Merge::Conflict(vec!["main.cf".into()])
        );
        let refs = sh(&r.mirror, &["for-each-ref", "refs/steward/"]);
        assert!(refs.is_empty(), "{refs}");
    }

    #[test]
    fn a_merge_driver_named_by_the_pull_request_does_not_run() {
        // a driver the server knows (defined in the mirror's configuration): the pull
        // request's own .gitattributes names it for the file it changes
        let (r, base, head) = repos(|r| {
            sh(&r.work, &["checkout", "-q", "-b", "pr"]);
            std::fs::write(r.work.join(".gitattributes"), "*.cf merge=evil\n").unwrap();
            let head = commit(r, "main.cf", "a = 10\nb = 2\n");
            sh(&r.work, &["checkout", "-q", "main"]);
            let base = commit(r, "main.cf", "a = 20\nb = 2\n");
            (base, head)
        });
        let marker = r.work.parent().unwrap().join("driver-ran");
        let driver = format!("touch {} && false", marker.display());
        sh(&r.mirror, &["config", "merge.evil.driver", &driver]);
        assert_eq!(
            merge_for_preview(&r.mirror, &base, &head, "9").unwrap(),
            Merge::Conflict(vec!["main.cf".into()])
        );
        assert!(
            !marker.exists(),
            "the pull request chose a merge driver that ran"
        );

        // the control: a merge that takes its attributes from the pull request's tree
        // (`--attr-source`) runs that driver, so the attack above is a real one
        let out = Command::new("git")
            .arg(format!("--attr-source={head}"))
            .arg(format!("--git-dir={}", r.mirror.display()))
            .args(["merge-tree", "--write-tree", &base, &head])
            .output()
            .unwrap();
        assert!(marker.exists(), "the control: {out:?}");
    }
}
