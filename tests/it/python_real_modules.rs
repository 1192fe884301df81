//! The real public `fs`, `exec` and `mitogen` Inmanta modules, unchanged, from start to end:
//! a project pins them in its `requirements.txt`, they are installed with pip (and their
//! dependencies: the real `std`, inmanta-core, mitogen) into a virtualenv, Steward compiles the
//! project with their `.cf` files, Python plugins and `@resource` classes, and the export is
//! what the reference exports (`tests/python/real_fs/expected.json`, written by `inmanta
//! export -j` of inmanta-core 14.0.0 with `REAL_FS_ROOT=/srv/real-fs`). Then `steward deploy`
//! deploys it through the modules' own handlers (mitogen's local context) in executors.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use steward::compiler::{CompileOptions, compile};
use steward::model::ExportFile;

use crate::python_plugins::venv;
use crate::support::{copy_dir, steward_bin};

/// The root the expected export was made with.
const REFERENCE_ROOT: &str = "/srv/real-fs";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/real_fs")
}

/// A reference export (`inmanta export -j`) by resource id without version: each resource's
/// fields plus `requires`.
pub(crate) fn reference_export(text: &str) -> BTreeMap<String, Value> {
    let list: Vec<Value> = serde_json::from_str(text).unwrap();
    list.into_iter()
        .map(|r| {
            let mut m = r.as_object().unwrap().clone();
            let id = m.remove("id").unwrap();
            let id = id
                .as_str()
                .unwrap()
                .rsplit_once(",v=")
                .unwrap()
                .0
                .to_string();
            m.remove("version");
            (id, Value::Object(m))
        })
        .collect()
}

/// Steward's export in the shape of [`reference_export`].
pub(crate) fn as_the_reference_writes(x: &ExportFile) -> BTreeMap<String, Value> {
    x.resources
        .iter()
        .map(|r| {
            let mut m = r.attributes.clone();
            m.insert("requires".into(), serde_json::json!(r.requires));
            (r.id.0.clone(), Value::Object(m))
        })
        .collect()
}

/// The reference's export of the fixture, with its root moved to `root`.
fn expected(root: &str) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(fixture().join("expected.json"))
        .unwrap()
        .replace(REFERENCE_ROOT, root);
    reference_export(&text)
}

fn steward_deploy(project: &Path, root: &Path) -> String {
    let python = venv();
    let o = Command::new(steward_bin())
        .arg("deploy")
        .arg("-p")
        .arg(project)
        .env("VIRTUAL_ENV", python.parent().unwrap().parent().unwrap())
        .env("REAL_FS_ROOT", root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    text
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn real_fs_exec_and_mitogen_modules_export_as_the_reference_and_deploy() {
    let python = venv();
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&fixture().join("project"), &project);

    // the export, made where the reference made it
    let opts = CompileOptions {
        project_dir: project.clone(),
        export: true,
        python: Some(python.to_path_buf()),
        env: [("REAL_FS_ROOT".to_string(), REFERENCE_ROOT.to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let outcome = compile(&opts, &mut |_| {});
    let x = match outcome.result {
        Ok(Some(x)) => x,
        Ok(None) => panic!("no export"),
        Err(e) => panic!(
            "{}",
            e.iter()
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    eprintln!(
        "real fs/exec/mitogen: compile + export in {:?}",
        started.elapsed()
    );
    assert_eq!(as_the_reference_writes(&x), expected(REFERENCE_ROOT));
    assert_eq!(x.metadata.modules["fs"], "1.1.2");
    assert_eq!(x.metadata.modules["exec"], "2.1.1");
    assert_eq!(x.metadata.modules["mitogen"], "0.2.5");
    // the handler code: the modules' Python, what the mitogen distribution installs beside
    // it, and the files the hash mappers uploaded
    let h = &x.handlers["fs::File"];
    let inm = h.inmanta.as_ref().unwrap();
    assert_eq!(inm.requirements, ["mitogen"]);
    for f in [
        "inmanta_plugins/fs/resources.py",
        "inmanta_plugins/exec/__init__.py",
        "inmanta_plugins/mitogen/abc.py",
        "inmanta_mitogen/__init__.py",
        // sha1 of files/etc/motd, which fs::file names
        "_files/a8b5339efd1cf927f2bc8042d4f66f2a7655ceaa",
    ] {
        assert!(
            h.files.contains_key(f),
            "{f} not shipped: {:?}",
            h.files.keys()
        );
    }
    assert_eq!(x.handlers["exec::Run"].digest, h.digest);

    // deployed by the modules' own handlers
    let root = tmp.path().join("out");
    let first = steward_deploy(&project, &root);
    assert!(first.contains("8 deployed (8 created"), "{first}");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    assert_eq!(read("hello.txt"), "hello world\n");
    assert_eq!(mode(&root.join("hello.txt")), 0o644);
    assert_eq!(read("motd"), "motd from a file\n");
    assert_eq!(mode(&root.join("motd")), 0o600);
    assert_eq!(read("source.txt"), "listed\n");
    assert_eq!(read("listing.json"), "[\"a.txt\"]");
    assert_eq!(read("ran"), "ran\n");
    assert!(root.join("has space").is_file());
    assert_eq!(mode(&root), 0o755);
    assert_eq!(
        std::fs::read_link(root.join("link")).unwrap(),
        root.join("hello.txt")
    );

    // nothing changed: nothing to do
    let second = steward_deploy(&project, &root);
    assert!(second.contains("8 deployed (no changes)"), "{second}");

    // the file fs::file names changes: its hash changes and the real handler rewrites it
    std::fs::write(project.join("files/etc/motd"), "a new motd\n").unwrap();
    std::fs::set_permissions(root.join("motd"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let third = steward_deploy(&project, &root);
    assert!(third.contains("1 updated"), "{third}");
    assert_eq!(read("motd"), "a new motd\n");
    assert_eq!(mode(&root.join("motd")), 0o600);
}
