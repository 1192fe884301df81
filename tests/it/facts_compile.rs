//! `std::getfact` in a compile: the environment's facts handed to `steward compile --facts
//! FILE`, the value of a fact it has, unknown (or the call's default) for one it has not, and
//! every fact asked for and not found in the export's `unknowns`, once each and sorted.
//!
//! The cases of `tests/facts/` (hits and misses, ids waiting for attributes set later, ids
//! through a resource class's mappers and of subtypes, Python plugins calling
//! `inmanta_plugins.std.getfact`) carry what the reference did with the same facts
//! (`expected.json`, recorded by `tests/facts/record.py` with inmanta-core 14.0.0 and std 8.1.0):
//! Steward prints the same and its `unknowns` are the reference's `unknown_parameters` without
//! repeats. The language cases 416 to 419 cover the errors and unknown arguments.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use steward::compiler::{CompileOptions, compile};
use steward::model::{ExportFile, Facts, UnknownRecord};

use crate::python_real_modules::user_env;
use crate::support::copy_dir;

fn cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/facts")
}

/// A copy of case `name` as a project.
fn project(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&cases().join(name), dir.path());
    std::fs::write(
        dir.path().join("project.yml"),
        "name: facts\nmodulepath: libs\ndownloadpath: libs\ninstall_mode: release\n",
    )
    .unwrap();
    dir
}

/// `steward compile ARGS --export export.json` in `dir`; `venv`: the active virtualenv.
fn steward_compile(dir: &Path, args: &[&str], venv: Option<&Path>) -> (Output, Option<ExportFile>) {
    let export = dir.join("export.json");
    let _ = std::fs::remove_file(&export);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_steward"));
    cmd.arg("compile")
        .args(args)
        .arg("--export")
        .arg(&export)
        .current_dir(dir)
        .env_remove("VIRTUAL_ENV");
    if let Some(v) = venv {
        cmd.env("VIRTUAL_ENV", v);
    }
    let out = cmd.output().unwrap();
    let file = std::fs::read_to_string(&export)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap());
    (out, file)
}

/// The reference's `unknown_parameters` as Steward exports them: without repeats, sorted.
fn as_exported(reference: &Value) -> Vec<UnknownRecord> {
    let mut out: Vec<UnknownRecord> = reference
        .as_array()
        .unwrap()
        .iter()
        .map(|u| UnknownRecord {
            resource_id: u["resource"].as_str().unwrap().to_string(),
            name: u["parameter"].as_str().unwrap().to_string(),
            source: u["source"].as_str().unwrap().to_string(),
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.resource_id, &a.name, &a.source).cmp(&(&b.resource_id, &b.name, &b.source))
    });
    out.dedup();
    out
}

/// Compile case `name` with its facts as the reference did, in `venv` if given.
fn check_case(name: &str, venv: Option<&Path>, requirements: Option<&str>) {
    let p = project(name);
    if let Some(r) = requirements {
        std::fs::write(p.path().join("requirements.txt"), r).unwrap();
    }
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(cases().join(name).join("expected.json")).unwrap(),
    )
    .unwrap();
    let (out, export) = steward_compile(p.path(), &["--facts", "facts.json"], venv);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: {stderr}");
    // facts were given: nothing to warn about
    assert!(!stderr.contains("warning[facts]"), "{name}: {stderr}");
    let printed: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    let want: Vec<&str> = expected["printed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(printed, want, "{name}: printed");
    assert_eq!(
        export.unwrap().unknowns,
        as_exported(&expected["unknowns"]),
        "{name}: unknowns"
    );
}

#[test]
fn getfact_with_built_in_std_does_what_the_reference_does() {
    for name in [
        "01-hit-miss-default",
        "02-resource-ids",
        "03-python-plugins",
    ] {
        check_case(name, None, None);
    }
}

/// The real std pinned: its `getfact` asks `context.get_client()`, which Steward's compiler
/// has none of; a module's plugin calling it gets the built-in one, and ids of std's resource
/// types come from std's own Python classes.
#[test]
fn getfact_from_python_with_the_real_std_pinned() {
    const REQUIREMENTS: &str = "inmanta-module-std==8.1.0\n";
    let p = project("03-python-plugins");
    std::fs::write(p.path().join("requirements.txt"), REQUIREMENTS).unwrap();
    let python = user_env(p.path());
    let venv = python.parent().unwrap().parent().unwrap().to_path_buf();
    check_case("03-python-plugins", Some(&venv), Some(REQUIREMENTS));
    check_case("02-resource-ids", Some(&venv), Some(REQUIREMENTS));
}

/// Without `--facts` the compile knows no server: one warning at the first call asking (not
/// one per call), every fact unknown or its default, and all of them recorded.
#[test]
fn without_facts_a_compile_warns_once_and_records_every_fact() {
    let p = project("01-hit-miss-default");
    let (out, export) = steward_compile(p.path(), &[], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("facts are not known without a server")
            .count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("main.cf:4:7"),
        "at the first call: {stderr}"
    );
    // `hit` is unknown now: the print of a string made with it does not happen
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let unknowns: Vec<(String, String)> = export
        .unwrap()
        .unknowns
        .into_iter()
        .map(|u| {
            assert_eq!(u.source, "fact");
            (u.resource_id, u.name)
        })
        .collect();
    let a = "std::testing::NullResource[internal,name=a]";
    let b = "std::testing::NullResource[other,name=b]";
    assert_eq!(
        unknowns,
        [(a, "ip"), (a, "region"), (b, "ip"), (b, "mac")]
            .map(|(r, n)| (r.to_string(), n.to_string()))
    );

    // for tools: the warning with its place
    let out = Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["compile", "--json"])
        .current_dir(p.path())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stderr).unwrap();
    let warnings = doc["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{doc}");
    assert_eq!(warnings[0]["code"], "facts");
    assert_eq!(warnings[0]["primary"]["line"], 4);

    // a model that asks for no fact is not told about them
    std::fs::write(p.path().join("main.cf"), "std::print(\"no facts\")\n").unwrap();
    let (out, _) = steward_compile(p.path(), &[], None);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn a_facts_file_that_is_not_one_fails_the_compile_with_its_name() {
    let p = project("01-hit-miss-default");
    std::fs::write(
        p.path().join("bad.json"),
        r#"{"parameters": [{"name": 1}]}"#,
    )
    .unwrap();
    let (out, export) = steward_compile(p.path(), &["--facts", "bad.json"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("bad.json: not a facts file"), "{stderr}");
    assert!(export.is_none());
    let (out, _) = steward_compile(p.path(), &["--facts", "missing.json"], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reading missing.json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The library's interface, as the server's and `steward deploy`'s compiles use it: the facts
/// in `CompileOptions`, the export's `unknowns`, no warning.
#[test]
fn compile_options_carry_the_facts() {
    let p = project("01-hit-miss-default");
    let mut facts = Facts::new();
    facts.insert(
        "std::testing::NullResource[internal,name=a]",
        "ip",
        "10.1.1.1",
    );
    facts.insert("std::testing::NullResource[other,name=b]", "mac", "ff");
    let mut printed = Vec::new();
    let outcome = compile(
        &CompileOptions {
            project_dir: p.path().to_path_buf(),
            export: true,
            python: Some("python3".into()),
            facts: Some(facts),
            ..Default::default()
        },
        &mut |l| printed.push(l.to_string()),
    );
    assert!(outcome.warnings.is_empty());
    let export = outcome.result.unwrap().unwrap();
    assert_eq!(printed, ["10.1.1.1 10.1.1.1 True fallback ff none"]);
    let names: Vec<(&str, &str)> = export
        .unknowns
        .iter()
        .map(|u| (u.resource_id.as_str(), u.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("std::testing::NullResource[internal,name=a]", "region"),
            ("std::testing::NullResource[other,name=b]", "ip"),
        ]
    );
    // the export file keeps them; one without any leaves the field out
    let text = serde_json::to_string(&export).unwrap();
    assert!(text.contains(r#""unknowns":[{"resource_id":"#), "{text}");
    let mut none = export.clone();
    none.unknowns.clear();
    assert!(!serde_json::to_string(&none).unwrap().contains("unknowns"));
}
