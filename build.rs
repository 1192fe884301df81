// The migrations are embedded by `sqlx::migrate!`, which cannot see a new file being added:
// rebuild when the folder changes. The Python files under `python/` (the `inmanta`
// compatibility package and Steward's Python hosts) are embedded too: list them for
// `src/pycompat.rs`.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=python");
    // read at run time: a build script binary compiled for another checkout (a worktree sharing
    // the target directory) would otherwise list that checkout's files, or none once it is gone
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest_dir).join("python");
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    assert!(
        !files.is_empty(),
        "no Python files found under {}",
        root.display()
    );
    files.sort();
    let mut out = String::from("&[\n");
    for rel in &files {
        let abs = root.join(rel);
        println!("cargo:rerun-if-changed={}", abs.display());
        out.push_str(&format!(
            "    ({rel:?}, include_str!({:?})),\n",
            abs.display().to_string()
        ));
    }
    out.push_str("]\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("python_files.rs");
    std::fs::write(dest, out).unwrap();
}

/// Every `.py` file under `dir` (paths relative to `root`, `/`-separated), skipping caches.
fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "__pycache__" {
            continue;
        }
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            collect(root, &path, out);
        } else if name.ends_with(".py") || name.ends_with(".pyi") || name == "py.typed" {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.push(rel);
        }
    }
}
