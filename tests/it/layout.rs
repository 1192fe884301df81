//! The shape of the code: no cycles between the top-level modules (the parts are layers,
//! docs/architecture.md), checked by `scripts/check-module-graph` on every test run.

use std::process::Command;

#[test]
fn top_level_modules_form_no_cycle() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/scripts/check-module-graph"))
        .output()
        .expect("python3 runs scripts/check-module-graph");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("no cycles"), "{stdout}");
}

#[test]
fn the_module_graph_check_finds_a_cycle() {
    // the checker itself: a copy of src/ with one upward edge added must fail
    let root = env!("CARGO_MANIFEST_DIR");
    let tmp = tempfile::tempdir().unwrap();
    crate::support::copy_dir(
        &std::path::Path::new(root).join("src"),
        &tmp.path().join("src"),
    );
    std::fs::create_dir_all(tmp.path().join("scripts")).unwrap();
    std::fs::copy(
        format!("{root}/scripts/check-module-graph"),
        tmp.path().join("scripts/check-module-graph"),
    )
    .unwrap();
    let events = tmp.path().join("src/events.rs");
    let mut text = std::fs::read_to_string(&events).unwrap();
    text.push_str("\n#[allow(unused_imports)]\nuse crate::server::AppState;\n");
    std::fs::write(&events, text).unwrap();
    let out = Command::new("python3")
        .arg(tmp.path().join("scripts/check-module-graph"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cycle among"), "{stderr}");
    assert!(stderr.contains("events -> server"), "{stderr}");
}

#[test]
fn compiler_submodules_form_no_cycle() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/scripts/module-edges"))
        .arg("--check")
        .output()
        .expect("python3 runs scripts/module-edges");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
}
