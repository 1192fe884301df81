//! The public Inmanta modules of the survey (docs/inmanta-modules.md), each in a small project
//! that uses its main entities and plugins, set up as its users set it up: a virtualenv and
//! `pip install -r requirements.txt` pinning `inmanta-module-std==8.1.0` and the module (all
//! dependencies, inmanta-core among them). Steward's export of each equals what inmanta-core
//! 14.0.0 exports for the same project (`tests/python/real_<module>/expected.json`, made once
//! with `inmanta export -j`; the reference is not needed here). Resources that need a cloud, a
//! router, ansible or a REST API (kubernetes, openstack, aws, vyos, ansible, rest) are compared
//! at export only; the user module's deploy is in `python_real_modules`.

use std::path::{Path, PathBuf};
use std::process::Command;

use steward::model::ExportFile;

use crate::python_real_modules::{as_the_reference_writes, export_with, reference_export};
use crate::support::run_ok;

/// A copy of the fixture's project (all of it: the ssh project keeps its key in `data/`).
fn project_copy(fixture: &str, tmp: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(fixture)
        .join("project");
    let project = tmp.join("project");
    run_ok(Command::new("cp").arg("-r").arg(&source).arg(&project));
    project
}

/// Export the fixture's project in its user environment with `vars` set, assert that it is
/// the reference's export and that the pinned `versions` of the modules were the ones
/// compiled; the export.
fn assert_exports_as_the_reference(
    fixture: &str,
    vars: &[(&str, &str)],
    versions: &[(&str, &str)],
) -> ExportFile {
    let tmp = tempfile::tempdir().unwrap();
    let project = project_copy(fixture, tmp.path());
    let x = export_with(&project, vars);
    let expected = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/python")
            .join(fixture)
            .join("expected.json"),
    )
    .unwrap();
    let expected = reference_export(&expected);
    assert!(!expected.is_empty(), "{fixture}: an empty reference export");
    assert_eq!(as_the_reference_writes(&x), expected, "{fixture}");
    for (module, version) in versions {
        assert_eq!(
            x.metadata.modules.get(*module).map(String::as_str),
            Some(*version),
            "{fixture}: {module}"
        );
    }
    x
}

/// The resource types of an export that have handler code, i.e. the module's own Python
/// resources and handlers.
fn types_with_handler_code(x: &ExportFile) -> Vec<&str> {
    let mut types: Vec<&str> = x.handlers.keys().map(String::as_str).collect();
    types.sort();
    types
}

#[test]
fn the_apt_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference(
        "real_apt",
        &[],
        &[("apt", "1.1.0"), ("fs", "1.1.2"), ("std", "8.1.0")],
    );
    // its own mitogen-based resource, with its handler, and fs's files for the repositories
    assert!(
        types_with_handler_code(&x).contains(&"apt::Package"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_ssh_module_exports_as_the_reference() {
    // the authorized keys hold the key its plugin reads from the project's data directory
    // (data/ssh/deploy.pub), sorted by std's key_sort filter in its template
    let x = assert_exports_as_the_reference("real_ssh", &[], &[("ssh", "1.0.5"), ("fs", "1.1.2")]);
    assert!(
        types_with_handler_code(&x).contains(&"fs::File"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_user_module_exports_as_the_reference() {
    assert_exports_as_the_reference(
        "real_user",
        &[("REAL_USER_NAME", "stwref")],
        &[("user", "0.1.23"), ("std", "8.1.0")],
    );
}

#[test]
fn the_graph_module_exports_as_the_reference() {
    assert_exports_as_the_reference("real_graph", &[], &[("graph", "1.0.1")]);
}

#[test]
fn the_config_module_plugins_give_what_the_reference_gives() {
    assert_exports_as_the_reference("real_config", &[], &[("config", "0.8.0")]);
}

#[test]
fn the_podman_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference(
        "real_podman",
        &[],
        &[("podman", "1.3.0"), ("files", "2.1.1"), ("std", "8.1.0")],
    );
    let types = types_with_handler_code(&x);
    for t in [
        "podman::Network",
        "podman::ImageFromRegistry",
        "files::SystemdUnitFile",
    ] {
        assert!(types.contains(&t), "{t}: {types:?}");
    }
}

#[test]
fn the_kubernetes_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference("real_kubernetes", &[], &[("kubernetes", "0.0.5")]);
    assert!(
        types_with_handler_code(&x).contains(&"kubernetes::resources::Deployment"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_openstack_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference(
        "real_openstack",
        &[],
        &[("openstack", "6.1.2"), ("ssh", "1.0.5")],
    );
    assert!(
        types_with_handler_code(&x).contains(&"openstack::VirtualMachine"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_aws_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference("real_aws", &[], &[("aws", "4.0.6")]);
    assert!(
        types_with_handler_code(&x).contains(&"aws::VirtualMachine"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_vyos_module_exports_as_the_reference() {
    let x =
        assert_exports_as_the_reference("real_vyos", &[], &[("vyos", "4.0.0"), ("std", "8.1.0")]);
    assert!(
        types_with_handler_code(&x).contains(&"vyos::Config"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_ansible_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference("real_ansible", &[], &[("ansible", "0.2.1")]);
    assert!(
        types_with_handler_code(&x).contains(&"ansible::Task"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_dummy_module_exports_as_the_reference() {
    assert_exports_as_the_reference(
        "real_dummy_module",
        &[],
        &[("dummy_module", "2.1.0"), ("std", "8.1.0")],
    );
}

#[test]
fn the_rest_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference("real_rest", &[], &[("rest", "1.0.1")]);
    assert!(
        types_with_handler_code(&x).contains(&"rest::RESTCall"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_web_module_model_exports_as_the_reference() {
    // a model-only module (its entities extend the ip module's): what the model holds is
    // exported as resource names
    assert_exports_as_the_reference(
        "real_web",
        &[],
        &[("web", "0.3.20"), ("ip", "2.0.3"), ("std", "8.1.0")],
    );
}

#[test]
fn the_yum_module_exports_as_the_reference() {
    let x = assert_exports_as_the_reference("real_yum", &[], &[("yum", "2.1.1"), ("fs", "1.1.2")]);
    assert!(
        types_with_handler_code(&x).contains(&"yum::Package"),
        "{:?}",
        x.handlers.keys()
    );
}

#[test]
fn the_ubuntu_module_exports_as_the_reference() {
    assert_exports_as_the_reference(
        "real_ubuntu",
        &[],
        &[("ubuntu", "0.4.21"), ("apt", "1.1.0"), ("fs", "1.1.2")],
    );
}
