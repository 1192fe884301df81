//! Questions asked of a mirror without changing it: a branch's tip, whether one commit
//! descends from another, the commits between two, whether a sub-directory changed, and a
//! file's content at a commit.

use super::*;

fn branch_tip(repo: &gix::Repository, branch: &str) -> Result<Option<gix::ObjectId>, GitError> {
    let name = branch_ref_name(branch)?;
    let reference = repo
        .try_find_reference(name.as_str())
        .map_err(other(format_args!("cannot read branch {branch}")))?;
    match reference {
        None => Ok(None),
        Some(mut r) => Ok(Some(
            r.peel_to_id()
                .map_err(other(format_args!("cannot resolve branch {branch}")))?
                .detach(),
        )),
    }
}

/// The commit (hex) that `branch` points at in the mirror, or `None` if there is no such branch.
pub fn resolve_branch(mirror_dir: &Path, branch: &str) -> Result<Option<String>, GitError> {
    let repo = open_mirror(mirror_dir)?;
    Ok(branch_tip(&repo, branch)?.map(|id| id.to_string()))
}

/// Is `commit_hex` reachable from the tip of `branch` (or equal to it)?
/// Unknown commits give `Ok(false)`; a missing branch gives `GitError::NotFound`.
pub fn is_ancestor_or_equal(
    mirror_dir: &Path,
    commit_hex: &str,
    branch: &str,
) -> Result<bool, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let id = parse_commit_id(commit_hex)?;
    let tip = branch_tip(&repo, branch)?
        .ok_or_else(|| GitError::NotFound(format!("branch {branch} not found in mirror")))?;
    if id == tip {
        return Ok(true);
    }
    match repo
        .try_find_object(id)
        .map_err(other(format_args!("cannot read {id}")))?
    {
        None => return Ok(false),
        Some(obj) if obj.kind != gix::object::Kind::Commit => return Ok(false),
        Some(_) => {}
    }
    let base = repo.merge_base(id, tip).map_err(other(format_args!(
        "cannot compute merge-base of {id} and {branch}"
    )))?;
    Ok(base.is_some_and(|b| b.detach() == id))
}

/// The commits after `since` up to `tip` (both exclusive), oldest first, following first
/// parents (the commits a push brought to the branch, as the branch saw them). Empty when
/// `since` is not among the `limit` first-parent ancestors of `tip` (a force push, or a
/// branch that moved far): then there is no "in between" to speak of.
pub fn commits_between(
    mirror_dir: &Path,
    tip: &str,
    since: &str,
    limit: usize,
) -> Result<Vec<String>, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let since = Some(parse_commit_id(since)?);
    let mut at = parse_commit_id(tip)?;
    let mut between = Vec::new();
    loop {
        let commit = match repo
            .try_find_object(at)
            .map_err(other(format_args!("cannot read {at}")))?
        {
            Some(obj) => obj
                .try_into_commit()
                .map_err(other(format_args!("{at} is not a commit")))?,
            None => break,
        };
        let Some(parent) = commit.parent_ids().next().map(|p| p.detach()) else {
            break;
        };
        if Some(parent) == since {
            between.reverse();
            return Ok(between);
        }
        if between.len() >= limit {
            break;
        }
        between.push(parent.to_string());
        at = parent;
    }
    Ok(Vec::new())
}

/// Does the mirror hold `commit` (full hex)? False when the mirror does not exist yet.
pub fn has_commit(mirror_dir: &Path, commit_hex: &str) -> bool {
    let Ok(repo) = open_mirror(mirror_dir) else {
        return false;
    };
    let Ok(id) = parse_commit_id(commit_hex) else {
        return false;
    };
    matches!(repo.try_find_object(id), Ok(Some(_)))
}

/// Resolve a full or abbreviated commit id and check it is on `branch`: its full id, or
/// `None` when it is unknown or not reachable from the branch tip.
pub fn commit_on_branch(
    mirror_dir: &Path,
    commit: &str,
    branch: &str,
) -> Result<Option<String>, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let full = match gix::ObjectId::from_hex(commit.trim().as_bytes()) {
        Ok(id) => id,
        Err(_) => match repo.rev_parse_single(commit.trim()) {
            Ok(id) => id.detach(),
            Err(_) => return Ok(None),
        },
    };
    drop(repo);
    Ok(is_ancestor_or_equal(mirror_dir, &full.to_string(), branch)?.then(|| full.to_string()))
}

/// Tree id at `subpath` (or the root tree) of `commit`; `None` if the path does not exist.
/// Errors if the path exists but is not a directory.
/// The tree of the project directory `subpath` (or the root) of `commit`; not found when
/// the commit has no such directory.
pub(super) fn project_dir_id(
    repo: &gix::Repository,
    commit: gix::ObjectId,
    subpath: Option<&str>,
) -> Result<gix::ObjectId, GitError> {
    subtree_id(repo, commit, subpath)?.ok_or_else(|| {
        GitError::NotFound(format!(
            "path {:?} not found in commit {commit}",
            subpath.unwrap_or_default()
        ))
    })
}

fn subtree_id(
    repo: &gix::Repository,
    commit: gix::ObjectId,
    subpath: Option<&str>,
) -> Result<Option<gix::ObjectId>, GitError> {
    let commit = match repo
        .try_find_object(commit)
        .map_err(other(format_args!("cannot read {commit}")))?
    {
        None => {
            return Err(GitError::NotFound(format!(
                "commit {commit} not found in mirror"
            )));
        }
        Some(obj) => obj
            .try_into_commit()
            .map_err(other(format_args!("{commit} is not a commit")))?,
    };
    let tree = commit.tree().map_err(other("cannot read commit tree"))?;
    let components = normalize_subpath(subpath)?;
    if components.is_empty() {
        return Ok(Some(tree.id));
    }
    let entry = tree
        .lookup_entry(components.iter().map(|c| c.as_bytes()))
        .map_err(other(format_args!("cannot look up {subpath:?}")))?;
    match entry {
        None => Ok(None),
        Some(e) if e.mode().is_tree() => Ok(Some(e.object_id())),
        Some(_) => Err(GitError::Other(format!(
            "subpath {subpath:?} is not a directory"
        ))),
    }
}

fn normalize_subpath(subpath: Option<&str>) -> Result<Vec<&str>, GitError> {
    let mut out = Vec::new();
    for c in subpath.unwrap_or("").split('/') {
        match c {
            "" | "." => {}
            ".." => {
                return Err(GitError::Other(format!(
                    "subpath {subpath:?} must not contain '..'"
                )));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// Did anything below `subpath` (or anywhere, if `None`) change between two commits?
/// Compares tree ids, so it is O(depth of subpath). A subpath missing in both commits is "unchanged".
pub fn subtree_changed(
    mirror_dir: &Path,
    from_hex: &str,
    to_hex: &str,
    subpath: Option<&str>,
) -> Result<bool, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let from = subtree_id(&repo, parse_commit_id(from_hex)?, subpath)?;
    let to = subtree_id(&repo, parse_commit_id(to_hex)?, subpath)?;
    Ok(from != to)
}

/// The content of the file at `path` (slash-separated, inside the repository) in `commit_hex`:
/// `None` when there is no such file, or it is not a plain file, or it is over `max` bytes.
pub fn read_file(
    mirror_dir: &Path,
    commit_hex: &str,
    path: &str,
    max: u64,
) -> Result<Option<Vec<u8>>, GitError> {
    let components = normalize_subpath(Some(path))?;
    let Some((name, dirs)) = components.split_last() else {
        return Ok(None);
    };
    let repo = open_mirror(mirror_dir)?;
    let dir = (!dirs.is_empty()).then(|| dirs.join("/"));
    let Some(tree) = subtree_id(&repo, parse_commit_id(commit_hex)?, dir.as_deref()).or_else(
        // a directory on the way that is a file: no such file
        |e| match e {
            GitError::Other(_) => Ok(None),
            e => Err(e),
        },
    )?
    else {
        return Ok(None);
    };
    let tree = repo
        .find_tree(tree)
        .map_err(other(format_args!("cannot read tree {tree}")))?;
    let Some(entry) = tree
        .iter()
        .filter_map(Result::ok)
        .find(|e| e.filename().as_bytes() == name.as_bytes())
    else {
        return Ok(None);
    };
    if !matches!(
        entry.mode().kind(),
        EntryKind::Blob | EntryKind::BlobExecutable
    ) {
        return Ok(None);
    }
    let header = repo
        .find_header(entry.object_id())
        .map_err(other(format_args!("cannot read {path}")))?;
    if header.size() > max {
        return Ok(None);
    }
    let blob = repo
        .find_blob(entry.object_id())
        .map_err(other(format_args!("cannot read {path}")))?;
    Ok(Some(blob.data.clone()))
}
