//! Writing a commit's tree (or a sub-directory of it) out as plain files, for a compile's
//! workdir: the one place that turns repository content into files on disk, so the checks
//! that keep a commit's symlinks inside the workdir live here.

use super::*;

/// Write the tree of `commit_hex` (or only its sub-directory `subpath`) into `dest` as plain files.
/// `dest` must be missing or an empty directory. No `.git` is created. Executable bits and symlinks
/// are honoured; submodules become empty directories; no gitattributes filters (eol, LFS) are applied.
/// On error `dest` may be partially written; the caller should remove it.
pub fn checkout(
    mirror_dir: &Path,
    commit_hex: &str,
    dest: &Path,
    subpath: Option<&str>,
) -> Result<Vec<String>, GitError> {
    let mut repo = open_mirror(mirror_dir)?;
    repo.object_cache_size_if_unset(16 * 1024 * 1024);
    let commit = parse_commit_id(commit_hex)?;
    let tree = project_dir_id(&repo, commit, subpath)?;

    let io = |what: &str, p: &Path, e: std::io::Error| {
        GitError::Other(format!("cannot {what} {}: {e}", p.display()))
    };
    if dest.exists() {
        let mut entries = std::fs::read_dir(dest).map_err(|e| io("read", dest, e))?;
        if entries.next().is_some() {
            return Err(GitError::Other(format!(
                "checkout destination {} is not empty",
                dest.display()
            )));
        }
    } else {
        std::fs::create_dir_all(dest).map_err(|e| io("create", dest, e))?;
    }

    let no_protections = gix::validate::path::component::Options {
        protect_windows: false,
        protect_hfs: false,
        protect_ntfs: false,
    };
    // Symlinks written, and those refused (with why): a symlink may only point inside the
    // checkout, so that nothing read through the checkout is a file of the server.
    let mut links: Vec<PathBuf> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    // Depth-first with an explicit stack (no recursion limit issues).
    let mut stack: Vec<(gix::ObjectId, PathBuf)> = vec![(tree, dest.to_path_buf())];
    while let Some((tree_id, dir)) = stack.pop() {
        let tree = repo
            .find_tree(tree_id)
            .map_err(other(format_args!("cannot read tree {tree_id}")))?;
        for entry in tree.iter() {
            let entry = entry.map_err(other(format_args!("cannot decode tree {tree_id}")))?;
            let mode = entry.mode();
            let name = entry.filename();
            // Rejects "", ".", "..", names with '/', and ".git" (case-insensitive).
            gix::validate::path::component(
                name,
                mode.is_link()
                    .then_some(gix::validate::path::component::Mode::Symlink),
                no_protections,
            )
            .map_err(|e| {
                GitError::Other(format!(
                    "refusing unsafe path {name:?} in tree {tree_id}: {e}"
                ))
            })?;
            let path = dir.join(OsStr::from_bytes(name.as_bytes()));
            match mode.kind() {
                EntryKind::Tree => {
                    std::fs::create_dir(&path).map_err(|e| io("create directory", &path, e))?;
                    stack.push((entry.object_id(), path));
                }
                EntryKind::Blob | EntryKind::BlobExecutable => {
                    let blob = repo
                        .find_blob(entry.object_id())
                        .map_err(other(format_args!(
                            "cannot read blob for {}",
                            path.display()
                        )))?;
                    let perm = if mode.kind() == EntryKind::BlobExecutable {
                        0o755
                    } else {
                        0o644
                    };
                    // create_new => O_EXCL: never follows a pre-existing symlink.
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(perm)
                        .open(&path)
                        .map_err(|e| io("create file", &path, e))?;
                    f.write_all(&blob.data).map_err(|e| io("write", &path, e))?;
                }
                EntryKind::Link => {
                    let blob = repo
                        .find_blob(entry.object_id())
                        .map_err(other(format_args!(
                            "cannot read symlink target for {}",
                            path.display()
                        )))?;
                    let target = Path::new(OsStr::from_bytes(&blob.data));
                    let depth = path
                        .parent()
                        .and_then(|p| p.strip_prefix(dest).ok())
                        .map_or(0, |p| p.components().count());
                    if link_escapes(depth, target) {
                        refused.push(format!("{} -> {}", shown(dest, &path), target.display()));
                        continue;
                    }
                    std::os::unix::fs::symlink(target, &path)
                        .map_err(|e| io("create symlink", &path, e))?;
                    links.push(path);
                }
                EntryKind::Commit => {
                    // Submodule: like an uninitialised submodule in git, an empty directory.
                    std::fs::create_dir(&path).map_err(|e| io("create directory", &path, e))?;
                }
            }
        }
    }
    // Lexically inside is not enough (`a -> .` then `b -> a/../x`): every symlink that
    // resolves, once all are written, must resolve inside the checkout.
    let real_dest = dest.canonicalize().map_err(|e| io("resolve", dest, e))?;
    for link in links {
        if let Ok(real) = link.canonicalize()
            && !real.starts_with(&real_dest)
        {
            let target = std::fs::read_link(&link).unwrap_or_default();
            std::fs::remove_file(&link).map_err(|e| io("remove symlink", &link, e))?;
            refused.push(format!("{} -> {}", shown(dest, &link), target.display()));
        }
    }
    Ok(refused)
}

/// Whether a symlink `depth` directories below the checkout root, pointing to `target`,
/// leaves the checkout (absolute, or more `..` than directories above it).
fn link_escapes(depth: usize, target: &Path) -> bool {
    use std::path::Component;
    let mut depth = depth as isize;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            Component::RootDir | Component::Prefix(_) => return true,
        }
    }
    false
}

/// A path of the checkout as the repository names it.
fn shown(dest: &Path, path: &Path) -> String {
    path.strip_prefix(dest)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod link_tests {
    use super::link_escapes;
    use std::path::Path;

    #[test]
    fn symlinks_leaving_the_checkout_are_recognised() {
        assert!(link_escapes(0, Path::new("/etc/passwd")));
        assert!(link_escapes(0, Path::new("../secret")));
        assert!(link_escapes(1, Path::new("../../secret")));
        assert!(link_escapes(1, Path::new("a/../../../x")));
        assert!(!link_escapes(1, Path::new("../main.cf")));
        assert!(!link_escapes(0, Path::new("files/./x")));
        assert!(!link_escapes(2, Path::new("../../files/x")));
    }
}
