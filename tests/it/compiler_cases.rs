//! Runs every case under tests/cases/: a project body (main.cf, optional libs/) with either
//! expected.out (exact std::print output) or expected.err (`line N` of main.cf the error must
//! point at, and optionally a keyword of the message). Same format as the shared conformance
//! cases; expectations were produced with the reference compiler.

use std::path::{Path, PathBuf};

use steward::compiler::{self, CompileOptions};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if matches!(
            name.to_str(),
            Some("expected.out" | "expected.err" | "tags")
        ) {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn normalise(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(|l| l.trim_end()).collect();
    let mut end = lines.len();
    while end > 0 && lines[end - 1].is_empty() {
        end -= 1;
    }
    lines[..end].join("\n")
}

/// Run one case; Err(reason) when it fails.
fn run_case(dir: &Path) -> Result<(), String> {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(dir, tmp.path());
    if !tmp.path().join("project.yml").exists() {
        std::fs::write(
            tmp.path().join("project.yml"),
            "name: case\nmodulepath: libs\ndownloadpath: libs\ninstall_mode: release\n",
        )
        .unwrap();
    }
    let mut printed = String::new();
    let outcome = compiler::compile(
        &CompileOptions {
            project_dir: tmp.path().to_path_buf(),
            main_file: None,
            export: true,
            ..Default::default()
        },
        &mut |line| {
            printed.push_str(line);
            printed.push('\n');
        },
    );
    // the whole diagnostic text, as a user would see it
    let mut text = String::new();
    for d in outcome.errors() {
        let r = d.resolve(&outcome.sources);
        text.push_str(&r.message);
        for l in r.primary.iter().chain(r.secondary.iter()) {
            text.push_str(&format!(" ({}:{}:{})", l.file, l.line, l.column));
        }
        text.push('\n');
    }
    if let Ok(want) = std::fs::read_to_string(dir.join("expected.out")) {
        if !outcome.is_ok() {
            return Err(format!("expected success, got errors:\n{text}"));
        }
        if normalise(&printed) != normalise(&want) {
            return Err(format!(
                "output differs\n--- want\n{}\n--- got\n{}",
                normalise(&want),
                normalise(&printed)
            ));
        }
        return Ok(());
    }
    let want = std::fs::read_to_string(dir.join("expected.err"))
        .map_err(|_| "no expectation".to_string())?;
    let mut lines = want.lines();
    let line: usize = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("line"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or("malformed expected.err")?;
    let keyword = lines.next().map(str::trim).unwrap_or("");
    if outcome.is_ok() {
        return Err(format!(
            "expected an error at line {line}, compile succeeded"
        ));
    }
    let all = format!("{printed}{text}");
    let needle = format!("main.cf:{line}:");
    let needle2 = format!("main.cf:{line}\n");
    let needle3 = format!("main.cf:{line})");
    if !(all.contains(&needle) || all.contains(&needle2) || all.contains(&needle3)) {
        return Err(format!("error does not point at main.cf:{line}:\n{text}"));
    }
    if !keyword.is_empty() && !all.to_lowercase().contains(&keyword.to_lowercase()) {
        return Err(format!("error lacks keyword '{keyword}':\n{text}"));
    }
    Ok(())
}

fn case_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("main.cf").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn run_all(root: &Path) {
    let filter = std::env::var("CASE_FILTER").unwrap_or_default();
    let mut failures = Vec::new();
    let mut count = 0;
    for dir in case_dirs(root) {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        if !name.contains(&filter) {
            continue;
        }
        count += 1;
        if let Err(reason) = run_case(&dir) {
            failures.push(format!("{name}: {reason}"));
        }
    }
    assert!(count > 0, "no cases found under {}", root.display());
    if !failures.is_empty() {
        panic!(
            "{} of {count} cases failed:\n\n{}",
            failures.len(),
            failures.join("\n\n")
        );
    }
}

#[test]
fn language_cases() {
    run_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases"));
}
