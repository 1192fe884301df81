//! The `steward compile` / `steward export` contract, through the real binary.

use std::path::Path;
use std::process::Command;

fn project(main: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("project.yml"),
        "name: t\nmodulepath: libs\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("main.cf"), main).unwrap();
    dir
}

fn steward(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn stdout_carries_only_print_output() {
    let p = project("x = 1\nstd::print(\"hello {{x}}\")\n");
    let out = steward(p.path(), &["compile"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello 1\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn errors_go_to_stderr_with_location_and_caret() {
    let p = project("a = 1\nb = nope + 1\n");
    let out = steward(p.path(), &["compile"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("main.cf:2:5"), "{err}");
    assert!(err.contains("variable nope not found"), "{err}");
    assert!(err.contains("b = nope + 1"), "source line shown: {err}");
    assert!(err.contains('^'), "caret shown: {err}");
}

#[test]
fn json_diagnostics_for_tools() {
    let p = project("entity a:\nend\n");
    let out = steward(p.path(), &["compile", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(doc["success"], false);
    let d = &doc["diagnostics"][0];
    assert_eq!(d["primary"]["file"], "main.cf");
    assert_eq!(d["primary"]["line"], 1);
    assert!(d["message"].as_str().unwrap().contains("capital"));
}

/// Thousands of errors: the one-line JSON report lists the first 200 and counts the rest, so
/// it stays under what a server keeps of a compile's output (a cut report would lose every
/// diagnostic).
#[test]
fn json_diagnostics_are_capped_and_counted() {
    let main: String = (0..3000)
        .map(|i| format!("x{i} = nope::Thing()\n"))
        .collect();
    let d = project(&main);
    let out = steward(d.path(), &["compile", "--json"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(doc["diagnostics"].as_array().unwrap().len(), 200);
    assert_eq!(doc["diagnostics_omitted"], 2800);
    assert!(stderr.len() < 256 << 10, "{} bytes", stderr.len());
}

#[test]
fn export_writes_resources() {
    let p = project(
        "import std::testing\n\
         a = std::testing::NullResource(name=\"a\")\n\
         b = std::testing::NullResource(name=\"b\", requires=a)\n",
    );
    let out = steward(p.path(), &["export", "-j", "out.json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.path().join("out.json")).unwrap()).unwrap();
    assert_eq!(doc["format"], 1);
    let res = doc["resources"].as_array().unwrap();
    assert_eq!(res.len(), 2);
    assert_eq!(res[0]["id"], "std::testing::NullResource[internal,name=a]");
    assert_eq!(
        res[1]["requires"][0],
        "std::testing::NullResource[internal,name=a]"
    );
    assert_eq!(res[1]["attributes"]["fail"], false);
}

#[test]
fn missing_project_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = steward(dir.path(), &["compile"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("project.yml"));
}
