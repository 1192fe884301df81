//! Pull requests' refs, for previews (issue 30, docs/design/previews.md §1.3, §3.2): which
//! pull requests a repository has (`refs/pull/<n>/head`, as GitHub and Gitea publish them),
//! read without fetching anything, and one pull request's head (and the host's merge commit,
//! where it has one) fetched into the mirror under `refs/steward/pull/<n>/`, away from the
//! branches a mirror follows (a fetch of these never prunes them).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use gix::bstr::ByteSlice;

use gix::remote::Direction;

use super::{Auth, GitError, fetch_remote, open_mirror, token_credentials, with_remote};

/// A pull request's refs as fetched: its head, and the host's merge commit when it has one
/// (GitHub's `refs/pull/<n>/merge`; it may be stale, see [`super::parents`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullRefs {
    pub head: String,
    pub merge: Option<String>,
}

/// At most this many pull requests are listed (a poll looks at the newest first).
pub const MAX_PULLS: usize = 10_000;

/// The number in `refs/pull/<n>/head`.
fn pull_number(name: &[u8]) -> Option<u64> {
    let rest = name.strip_prefix(b"refs/pull/")?.strip_suffix(b"/head")?;
    if rest.is_empty() || rest.len() > 12 || !rest.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(rest).ok()?.parse().ok()
}

/// The open pull requests' heads of the repository at `url` (number, commit), highest number
/// first, at most [`MAX_PULLS`]; nothing is fetched.
pub fn list_pull_heads(
    mirror_dir: &Path,
    url: &str,
    auth: &Auth,
) -> Result<Vec<(u64, String)>, GitError> {
    with_remote(mirror_dir, url, auth, |repo, parsed, token| {
        let remote = fetch_remote(repo, url, &["+refs/pull/*/head:refs/steward/pull/*/head"])?;
        let (map, _) = remote
            .connect(Direction::Fetch)?
            .with_credentials(token_credentials(parsed, token))
            .ref_map(gix::progress::Discard, Default::default())?;
        let mut heads: Vec<(u64, String)> = map
            .mappings
            .iter()
            .filter_map(|m| {
                let n = pull_number(m.remote.as_name()?.as_bytes())?;
                Some((n, m.remote.as_id()?.to_string()))
            })
            .collect();
        heads.sort_by_key(|h| std::cmp::Reverse(h.0));
        heads.dedup_by_key(|h| h.0);
        heads.truncate(MAX_PULLS);
        Ok(heads)
    })
}

/// Fetch pull request `number`'s head (and merge commit, where the host has one) into the
/// mirror, with the branches in the same fetch (so the base is current); a pull request the
/// host does not have is [`GitError::NotFound`].
pub fn fetch_pull(
    mirror_dir: &Path,
    url: &str,
    auth: &Auth,
    number: u64,
) -> Result<PullRefs, GitError> {
    let spec = format!("+refs/pull/{number}/*:refs/steward/pull/{number}/*");
    with_remote(mirror_dir, url, auth, |repo, parsed, token| {
        let remote = fetch_remote(repo, url, &[super::FETCH_REFSPEC, spec.as_str()])?;
        let outcome = remote
            .connect(Direction::Fetch)?
            .with_credentials(token_credentials(parsed, token))
            .prepare_fetch(gix::progress::Discard, Default::default())?
            .receive(gix::progress::Discard, &AtomicBool::new(false))?;
        // the branch refspec maps every branch: pruning is as safe as in `ensure_mirror`
        super::prune_stale_branches(repo, &outcome.ref_map)?;
        Ok(())
    })?;
    let repo = open_mirror(mirror_dir)?;
    let tip = |name: &str| -> Option<String> {
        let mut r = repo.find_reference(name).ok()?;
        Some(r.peel_to_id().ok()?.to_string())
    };
    let head = tip(&format!("refs/steward/pull/{number}/head")).ok_or_else(|| {
        GitError::NotFound(format!("pull request {number} (refs/pull/{number}/head)"))
    })?;
    Ok(PullRefs {
        head,
        merge: tip(&format!("refs/steward/pull/{number}/merge")),
    })
}

/// Forget pull request `number` (its preview closed): its fetched refs and the merge made
/// for it. Their objects go with the mirror's next repack.
pub fn drop_pull(mirror_dir: &Path, number: u64) -> Result<(), GitError> {
    let mut names = vec![format!("refs/steward/preview/{number}")];
    for what in ["head", "merge"] {
        names.push(format!("refs/steward/pull/{number}/{what}"));
    }
    for name in names {
        let mut c = super::merge::git(mirror_dir);
        c.args(["update-ref", "-d", &name]);
        let out = c
            .output()
            .map_err(|e| GitError::Other(format!("can not run git: {e}")))?;
        if !out.status.success() {
            return Err(GitError::Other(format!(
                "deleting {name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::test_git::sh;

    #[test]
    fn pull_requests_are_listed_without_a_fetch_and_fetched_beside_the_branches() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (work, origin, mirror) = (d.join("work"), d.join("origin.git"), d.join("mirror"));
        std::fs::create_dir_all(&work).unwrap();
        sh(&work, &["init", "-q", "-b", "main"]);
        std::fs::write(work.join("main.cf"), "a = 1\n").unwrap();
        sh(&work, &["add", "-A"]);
        sh(&work, &["commit", "-q", "-m", "main"]);
        sh(d, &["init", "-q", "--bare", "origin.git"]);
        let url = format!("file://{}", origin.display());
        sh(&work, &["push", "-q", &url, "main"]);
        // two pull requests, as a host publishes them; the second has a merge commit
        let mut heads = Vec::new();
        for n in [3, 12] {
            sh(&work, &["checkout", "-q", "-b", &format!("pr{n}"), "main"]);
            std::fs::write(work.join(format!("pr{n}.cf")), "b = 1\n").unwrap();
            sh(&work, &["add", "-A"]);
            sh(&work, &["commit", "-q", "-m", &format!("pr {n}")]);
            let head = sh(&work, &["rev-parse", "HEAD"]);
            sh(
                &work,
                &["push", "-q", &url, &format!("HEAD:refs/pull/{n}/head")],
            );
            heads.push((n, head));
        }
        sh(&work, &["checkout", "-q", "main"]);
        sh(&work, &["merge", "-q", "--no-ff", "-m", "merge 12", "pr12"]);
        let merge12 = sh(&work, &["rev-parse", "HEAD"]);
        sh(&work, &["push", "-q", &url, "HEAD:refs/pull/12/merge"]);

        super::super::ensure_mirror(&mirror, &url, &Auth::None).unwrap();
        let listed = list_pull_heads(&mirror, &url, &Auth::None).unwrap();
        assert_eq!(
            listed,
            vec![(12, heads[1].1.clone()), (3, heads[0].1.clone())]
        );
        // listing fetched nothing
        assert!(!super::super::has_commit(&mirror, &heads[0].1));

        let p3 = fetch_pull(&mirror, &url, &Auth::None, 3).unwrap();
        assert_eq!(
            p3,
            PullRefs {
                head: heads[0].1.clone(),
                merge: None
            }
        );
        assert!(super::super::has_commit(&mirror, &heads[0].1));
        let p12 = fetch_pull(&mirror, &url, &Auth::None, 12).unwrap();
        assert_eq!(p12.head, heads[1].1);
        assert_eq!(p12.merge.as_deref(), Some(merge12.as_str()));
        // the branches the mirror follows are untouched (a pull fetch never prunes)
        assert!(
            super::super::resolve_branch(&mirror, "main")
                .unwrap()
                .is_some()
        );
        assert!(matches!(
            fetch_pull(&mirror, &url, &Auth::None, 99),
            Err(GitError::NotFound(_))
        ));
        // the branch moved since: the pull request's fetch brings it too
        std::fs::write(work.join("later.cf"), "c = 1\n").unwrap();
        sh(&work, &["add", "-A"]);
        sh(&work, &["commit", "-q", "-m", "later"]);
        let later = sh(&work, &["rev-parse", "HEAD"]);
        sh(&work, &["push", "-q", &url, "main"]);
        fetch_pull(&mirror, &url, &Auth::None, 3).unwrap();
        assert_eq!(
            super::super::resolve_branch(&mirror, "main").unwrap(),
            Some(later)
        );
        // closed: its refs are gone from the mirror, the other pull request's stay
        drop_pull(&mirror, 3).unwrap();
        let refs = sh(
            &mirror,
            &["for-each-ref", "--format=%(refname)", "refs/steward/"],
        );
        assert_eq!(
            refs,
            "refs/steward/pull/12/head\nrefs/steward/pull/12/merge"
        );
    }
}
