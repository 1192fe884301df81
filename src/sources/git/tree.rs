//! A commit's project directory as the server's incremental compile compares it: without a
//! checkout, from the mirror's objects.
//!
//! Two commits whose project directories have the same entries but for the main file's
//! blob compile alike but for what that file says: the trees of everything else are the
//! same objects. That is what lets the server patch a compile's export from the last one
//! ([`crate::sources::compile`]) without checking the commit out or running the compiler.

use super::*;

/// The top-level entries of a commit's project directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectTree {
    /// The directory's tree.
    pub id: gix::ObjectId,
    /// The main file's blob, when it is a plain file (not a link, not executable).
    pub main: Option<gix::ObjectId>,
    /// Every other entry: name, mode and object.
    others: Vec<(BString, gix::objs::tree::EntryMode, gix::ObjectId)>,
}

impl ProjectTree {
    /// Is `other` this directory with at most another main file (a plain file in both)?
    pub fn differs_only_in_main(&self, other: &ProjectTree) -> bool {
        self.main.is_some() && other.main.is_some() && self.others == other.others
    }
}

/// The project directory (`subpath`, or the root) of `commit_hex` in the mirror, with
/// `main_file` (a name at its top) told apart.
pub fn project_tree(
    mirror_dir: &Path,
    commit_hex: &str,
    subpath: Option<&str>,
    main_file: &str,
) -> Result<ProjectTree, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let commit = parse_commit_id(commit_hex)?;
    let id = subtree_id(&repo, commit, subpath)?.ok_or_else(|| {
        GitError::NotFound(format!(
            "path {:?} not found in commit {commit}",
            subpath.unwrap_or_default()
        ))
    })?;
    let tree = repo
        .find_tree(id)
        .map_err(other(format_args!("cannot read tree {id}")))?;
    let mut main = None;
    let mut others = Vec::new();
    for entry in tree.iter() {
        let entry = entry.map_err(other(format_args!("cannot decode tree {id}")))?;
        let name = entry.filename();
        // a link or an executable main file is compared as any other entry
        if name == main_file.as_bytes() && entry.mode().kind() == EntryKind::Blob {
            main = Some(entry.object_id());
            continue;
        }
        others.push((name.to_owned(), entry.mode(), entry.object_id()));
    }
    Ok(ProjectTree { id, main, others })
}

/// The blob `id` of the mirror, when it is at most `max` bytes.
pub fn read_blob(mirror_dir: &Path, id: gix::ObjectId, max: usize) -> Result<Vec<u8>, GitError> {
    let repo = open_mirror(mirror_dir)?;
    let header = repo
        .find_header(id)
        .map_err(other(format_args!("cannot read {id}")))?;
    if header.size() > max as u64 {
        return Err(GitError::Other(format!(
            "{id} is {} bytes, over the {max} bytes read",
            header.size()
        )));
    }
    let mut blob = repo
        .find_blob(id)
        .map_err(other(format_args!("cannot read {id}")))?;
    Ok(blob.take_data())
}

/// Why the tree `id` could make a compile depend on more than its own objects and the
/// compiler, if it could: code a compile may run (Python's files, pip's requirements, a
/// native library), or a symbolic link (a file that is another file). `None`: it holds
/// only plain files and directories that no compile runs.
pub fn could_run_code(mirror_dir: &Path, id: gix::ObjectId) -> Result<Option<String>, GitError> {
    /// Names pip or Python act on.
    const PYTHON_FILES: &[&str] = &[
        "requirements.txt",
        "setup.py",
        "setup.cfg",
        "pyproject.toml",
    ];
    /// Endings of what Python imports or runs.
    const PYTHON_ENDINGS: &[&str] = &[
        ".py", ".pyc", ".pyo", ".pyd", ".pyw", ".so", ".pth", ".zip", ".egg", ".whl",
    ];
    let repo = open_mirror(mirror_dir)?;
    let mut stack: Vec<(gix::ObjectId, String)> = vec![(id, String::new())];
    let mut seen = 0usize;
    while let Some((tree_id, dir)) = stack.pop() {
        let tree = repo
            .find_tree(tree_id)
            .map_err(other(format_args!("cannot read tree {tree_id}")))?;
        for entry in tree.iter() {
            let entry = entry.map_err(other(format_args!("cannot decode tree {tree_id}")))?;
            seen += 1;
            if seen > MAX_ENTRIES {
                return Ok(Some(format!("more than {MAX_ENTRIES} files")));
            }
            let name = entry.filename().to_str_lossy();
            let path = format!("{dir}{name}");
            match entry.mode().kind() {
                EntryKind::Tree => stack.push((entry.object_id(), format!("{path}/"))),
                EntryKind::Link => return Ok(Some(format!("{path} is a symbolic link"))),
                EntryKind::Commit => {}
                EntryKind::Blob | EntryKind::BlobExecutable => {
                    let lower = name.to_ascii_lowercase();
                    if PYTHON_FILES.contains(&lower.as_str())
                        || PYTHON_ENDINGS.iter().any(|e| lower.ends_with(e))
                    {
                        return Ok(Some(format!("{path} is code a compile may run")));
                    }
                }
            }
        }
    }
    Ok(None)
}

/// Entries [`could_run_code`] looks at most (a larger project is not patched).
const MAX_ENTRIES: usize = 100_000;
