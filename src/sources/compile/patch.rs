//! The server's incremental compile: a commit whose project differs from the last compiled
//! one only inside literals of its main file (a file's content, a port, a version) is not
//! checked out nor compiled: the last compile's export is patched where those literals went
//! ([`crate::compiler::incremental`]), and stored as its changes.
//!
//! What the patch is made from must be the server's own knowledge, never the commit's word:
//! a commit able to forge it could make a later commit (a revert, say) keep what the forgery
//! says. So:
//! - The compiler (a child in the compile's sandbox) writes the *sites* of a compile, its
//!   main file and what else it read (`steward compile --remember`), and only when the
//!   compile read nothing a patch could not check: no Python ran, no fact, data file or
//!   variable was read. The server keeps them ([`keep`]) only when the commit's project
//!   holds no code a compile could run (Python's files, pip's requirements: nothing but our
//!   compiler ran in the child, so what it wrote is our compiler's) and no symbolic link,
//!   every path it read is inside the project, and its main file is the commit's.
//! - A later commit is patched ([`patch`]) when its project directory is the same tree but
//!   for the main file's blob, from the same source and with the same compiler binary. The
//!   server reads that blob itself from its mirror: no checkout, no child, no sandbox.
//!
//! The memory lives in the environment's compile task, in this process; a restart compiles
//! the next commit in full.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::super::git;
use super::{Memory, begin, memory, stage};
use crate::compiler::incremental::cache;
use crate::store::sources::{CompileRow, SourceRow};

/// The main file of a project the server compiles (`steward compile`'s default).
const MAIN_FILE: &str = "main.cf";

/// Largest sites file, or main file, read back.
const MAX_READ: usize = super::MAX_EXPORT as usize;

/// What the environment's last compile left for the next one to be patched from.
#[derive(Clone)]
pub struct Sites {
    held: cache::Held,
    /// The export it holds, as read ([`memory::Read::id`]).
    export_id: u64,
    /// The commit it was made from, and that commit's project directory.
    commit: String,
    tree: git::ProjectTree,
    /// What must be as it was: the source's repository and path, the compiler's binary.
    url: String,
    path: String,
    compiler: Option<cache::Stamp>,
}

/// The project directory of `commit`, when a compile of it can leave sites the server
/// trusts: it holds no code a compile may run (then nothing but our compiler runs in the
/// child, and what it writes is the compiler's) and no symbolic link, and its main file is a
/// plain file. Asked before the compile: a compile of any other project is not asked for
/// its sites. `Err` says why not.
pub(super) fn trusted_tree(
    mirror: &Path,
    source: &SourceRow,
    commit: &str,
) -> Result<git::ProjectTree, String> {
    let tree =
        git::project_tree(mirror, commit, subpath(source), MAIN_FILE).map_err(|e| e.to_string())?;
    if let Some(why) = git::could_run_code(mirror, tree.id).map_err(|e| e.to_string())? {
        return Err(why);
    }
    if tree.main.is_none() {
        return Err(format!("{MAIN_FILE} is not a plain file"));
    }
    Ok(tree)
}

/// The sites of the compile of `commit`, whose project is `tree` ([`trusted_tree`]): the
/// sites file `sites_file` the compiler wrote for the checkout `project`, beside the export
/// `export`, when the compile read nothing outside the project and its main file was the
/// commit's; `Err` says why not.
#[allow(clippy::too_many_arguments)]
pub(super) fn keep(
    mirror: &Path,
    source: &SourceRow,
    commit: &str,
    tree: git::ProjectTree,
    compiler: &Path,
    project: &Path,
    sites_file: &Path,
    export: Arc<Vec<u8>>,
    export_id: u64,
) -> Result<Sites, String> {
    let Some(main) = tree.main else {
        return Err(format!("{MAIN_FILE} is not a plain file"));
    };
    let bytes = read_bounded(sites_file)?;
    let held = cache::Held::new(bytes, export)?;
    let inputs = held.inputs();
    if inputs.overflow {
        return Err("the compile read too many files".into());
    }
    if let Some((name, _)) = inputs.env_reads.first() {
        return Err(format!("the compile read ${name}"));
    }
    let project = project
        .canonicalize()
        .map_err(|e| format!("{}: {e}", project.display()))?;
    if let Some((path, _)) = inputs.paths.iter().find(|(p, _)| !p.starts_with(&project)) {
        return Err(format!("the compile read {}", path.display()));
    }
    // the main file the compile read is the commit's
    if git::read_blob(mirror, main, MAX_READ).map_err(|e| e.to_string())? != held.main() {
        return Err(format!("the compile read another {MAIN_FILE}"));
    }
    Ok(Sites {
        held,
        export_id,
        commit: commit.to_string(),
        tree,
        url: source.url.clone(),
        path: source.path.clone(),
        compiler: cache::Stamp::of(compiler),
    })
}

/// A commit's export, patched from the last compile's.
pub(super) struct Patched {
    /// The export, one resource per line.
    pub lines: Arc<Vec<u8>>,
    /// The places (among the export's resources) of those the patch changed.
    pub changed: Vec<usize>,
    /// The export it was patched from ([`memory::Read::id`]).
    pub from_export: u64,
    /// What the model printed.
    pub prints: Vec<String>,
    /// The commit it was patched from.
    pub from: String,
    /// The memory for the commit after it.
    pub next: Sites,
    /// How long reading the main file took, and patching the export.
    pub read_ms: f64,
    pub patch_ms: f64,
}

/// The export of `commit` patched from `sites`, when its project is the one `sites` was
/// made from but for literals of its main file (from the same source, with the same
/// compiler); `Err` says why not (the commit is then compiled in full).
pub(super) fn patch(
    sites: Sites,
    mirror: &Path,
    source: &SourceRow,
    commit: &str,
    compiler: &Path,
) -> Result<Patched, String> {
    if sites.url != source.url || sites.path != source.path {
        return Err("the source changed".into());
    }
    if sites.compiler.is_none() || cache::Stamp::of(compiler) != sites.compiler {
        return Err("the compiler changed".into());
    }
    let started = std::time::Instant::now();
    let tree =
        git::project_tree(mirror, commit, subpath(source), MAIN_FILE).map_err(|e| e.to_string())?;
    let new_main = if tree.id == sites.tree.id {
        sites.held.main().to_vec()
    } else if sites.tree.differs_only_in_main(&tree) {
        let main = tree.main.expect("differs only in a plain main file");
        git::read_blob(mirror, main, MAX_READ).map_err(|e| e.to_string())?
    } else {
        return Err(format!(
            "more than {MAIN_FILE} changed since {}",
            short(&sites.commit)
        ));
    };
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    let Sites {
        held,
        export_id,
        commit: from,
        url,
        path,
        compiler,
        ..
    } = sites;
    let (patched, held) = held.patch(new_main)?;
    Ok(Patched {
        read_ms,
        patch_ms: started.elapsed().as_secs_f64() * 1e3 - read_ms,
        lines: patched.lines(),
        changed: patched.changed.iter().map(|c| c.0).collect(),
        from_export: export_id,
        prints: patched.prints.clone(),
        from,
        next: Sites {
            held,
            // made known when it is read
            export_id: 0,
            commit: commit.to_string(),
            tree,
            url,
            path,
            compiler,
        },
    })
}

/// The export of `job`'s commit patched from the last compile's `sites`, read against the
/// memory of what was stored (`stored`, taken when the patch is made): the export, the
/// compile's stage, and what to keep (the memory to patch the next commit from, what the
/// model printed). `Err`: why it was not patched.
pub(super) async fn patched(
    job: &CompileRow,
    source: &SourceRow,
    mirror: &Path,
    steward_bin: &Path,
    sites: Sites,
    stored: &mut Option<Memory>,
) -> Result<(memory::Read, Value, (Sites, String)), String> {
    let at = begin();
    let env = job.environment_id;
    let (mirror, source, commit, bin) = (
        mirror.to_path_buf(),
        source.clone(),
        job.commit.clone(),
        steward_bin.to_path_buf(),
    );
    let patched =
        tokio::task::spawn_blocking(move || patch(sites, &mirror, &source, &commit, &bin))
            .await
            .unwrap_or_else(|e| Err(format!("crashed: {e}")))?;
    let (lines, stored) = (patched.lines.clone(), stored.take());
    let compared = std::time::Instant::now();
    let (from, changed) = (patched.from_export, patched.changed.clone());
    let read = tokio::task::spawn_blocking(move || {
        memory::read_patched(stored, env, lines, from, &changed)
    })
    .await
    .unwrap_or_else(|e| Err(format!("crashed: {e}")))
    .map_err(|e| format!("the patched export does not read ({e})"))?;
    let mut patched = patched;
    patched.next.export_id = read.id;
    let detail = format!(
        "{} resources, {} changed: patched from the compile of {} (only literals of the main file changed) in {} ms ({MAIN_FILE} read in {:.0} ms, the export patched in {:.0}, compared with the last one in {:.0}); no checkout, no compiler run",
        read.resources,
        patched.changed.len(),
        short(&patched.from),
        at.1.elapsed().as_millis(),
        patched.read_ms,
        patched.patch_ms,
        compared.elapsed().as_secs_f64() * 1e3,
    );
    let stage = stage("compile", at.0, at.1.elapsed(), true, &detail);
    let mut prints = patched.prints.join("\n");
    if !prints.is_empty() {
        prints.push('\n');
    }
    Ok((read, stage, (patched.next, prints)))
}

fn subpath(source: &SourceRow) -> Option<&str> {
    (!source.path.is_empty()).then_some(source.path.as_str())
}

/// A commit as people read it.
fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // the compile's own file, not one it points at
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("no sites file ({e})"))?;
    let mut bytes = Vec::new();
    f.take(MAX_READ as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() > MAX_READ {
        return Err(format!("a sites file over {} MiB", MAX_READ >> 20));
    }
    Ok(bytes)
}
