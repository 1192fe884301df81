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
    let id = project_dir_id(&repo, commit, subpath)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::test_git::sh;

    /// Write `files` (path, text; `None` removes) in `work`, commit, and give the commit.
    fn commit(work: &Path, files: &[(&str, Option<&str>)]) -> String {
        for (path, text) in files {
            let p = work.join(path);
            match text {
                Some(t) => {
                    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                    std::fs::write(&p, t).unwrap();
                }
                None => std::fs::remove_file(&p).unwrap(),
            }
        }
        sh(work, &["add", "-A"]);
        sh(work, &["commit", "-q", "--allow-empty", "-m", "c"]);
        sh(work, &["rev-parse", "HEAD"])
    }

    #[test]
    fn a_project_tree_tells_a_main_file_edit_from_any_other_change() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        sh(&work, &["init", "-q", "-b", "main"]);
        let files = [
            ("site/main.cf", Some("a = 1\n")),
            ("site/project.yml", Some("name: site\n")),
            ("site/libs/m/model/_init.cf", Some("x = 1\n")),
            ("README", Some("hello\n")),
        ];
        let first = commit(&work, &files);
        let main_edit = commit(&work, &[("site/main.cf", Some("a = 2\n"))]);
        let outside = commit(&work, &[("README", Some("bye\n"))]);
        let module_edit = commit(&work, &[("site/libs/m/model/_init.cf", Some("x = 2\n"))]);
        let added = commit(&work, &[("site/files/f", Some("f\n"))]);
        let python = commit(&work, &[("site/libs/m/plugins/__init__.py", Some("\n"))]);
        let requirements = commit(
            &work,
            &[
                ("site/libs/m/plugins/__init__.py", None),
                ("site/requirements.txt", Some("inmanta-module-std\n")),
            ],
        );
        let plain = commit(&work, &[("site/requirements.txt", None)]);
        std::os::unix::fs::symlink("../main.cf", work.join("site/files/link")).unwrap();
        let link = commit(&work, &[]);
        std::fs::remove_file(work.join("site/files/link")).unwrap();
        std::fs::remove_file(work.join("site/main.cf")).unwrap();
        std::os::unix::fs::symlink("files/f", work.join("site/main.cf")).unwrap();
        let main_link = commit(&work, &[]);
        sh(
            dir.path(),
            &["clone", "-q", "--mirror", "work", "mirror.git"],
        );
        let mirror = dir.path().join("mirror.git");
        let tree = |c: &str| project_tree(&mirror, c, Some("site"), "main.cf").unwrap();

        let base = tree(&first);
        assert!(base.differs_only_in_main(&tree(&main_edit)));
        // a change outside the project: the same tree
        assert_eq!(tree(&main_edit), tree(&outside));
        assert!(!tree(&outside).differs_only_in_main(&tree(&module_edit)));
        assert!(!tree(&module_edit).differs_only_in_main(&tree(&added)));
        // a main file that is a link is not a main file that can be patched
        assert!(tree(&main_link).main.is_none());
        assert!(!tree(&plain).differs_only_in_main(&tree(&main_link)));
        let blob = read_blob(&mirror, tree(&main_edit).main.unwrap(), 100).unwrap();
        assert_eq!(blob, b"a = 2\n");
        assert!(read_blob(&mirror, tree(&main_edit).main.unwrap(), 3).is_err());

        let runs = |c: &str| could_run_code(&mirror, tree(c).id).unwrap();
        assert_eq!(runs(&first), None);
        assert_eq!(runs(&added), None);
        assert!(
            runs(&python).unwrap().contains("__init__.py"),
            "{:?}",
            runs(&python)
        );
        assert!(runs(&requirements).unwrap().contains("requirements.txt"));
        assert_eq!(runs(&plain), None);
        assert!(runs(&link).unwrap().contains("symbolic link"));
        assert!(runs(&main_link).unwrap().contains("symbolic link"));
    }
}
