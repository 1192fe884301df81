//! How the compiler's plugin host starts with a project pinning the real `std`.
//!
//! One interpreter per compile: the host, started when loading the modules asks for the
//! interpreter's `sys.path`, answers it as `python -I` would and then runs the plugins.
//!
//! std's Python is imported only when something needs it (`compiler::plugins::pyhost::
//! deferrable`): not at all for a compile that needs nothing of it, and, when something does,
//! as the reference has it: another module's code importing it, a call of one of its plugins
//! that runs in Python, module code reading the plugin or resource registries, an export (its
//! resource classes and dependency managers). A failure of its import is reported as a failure
//! at the host's start is, with its file and line. The std for these is the real std 8.1.0
//! (from the test virtualenv of `python_plugins`) copied into a virtualenv of its own with a
//! few lines added: one that records each import of its package in `imported.log` beside it, a
//! plugin Steward does not have built in, a dependency manager; or a line that fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use steward::compiler::{CompileOptions, compile};
use steward::model::ExportFile;

use crate::support::{copy_dir, run_ok};

/// What the tests add to std's `__init__.py`.
const STD_ADDITIONS: &str = r#"

# --- added by Steward's tests
import os as _os


def _record_import():
    with open(_os.path.join(_os.path.dirname(__file__), "imported.log"), "a") as f:
        f.write("imported\n")


_record_import()


@plugin
def steward_probe() -> "string":
    return "std's Python ran"


@dependency_manager
def steward_item_order(model, resources):
    """The item named `second` requires the one named `first`."""
    by_name = {r.name: r for r in resources.values() if r.id.get_entity_type() == "user::Item"}
    if "first" in by_name and "second" in by_name:
        by_name["second"].requires.add(by_name["first"].id)
"#;

const USER_CF: &str = r#"
entity Item:
    string name
    string agent = "a"
end
implement Item using std::none
"#;

const USER_PY: &str = r#"
import sys

from inmanta.plugins import Context, plugin
from inmanta.resources import Resource, resource, to_id


@plugin
def inc(n: "int") -> "int":
    return n + 1


@plugin
def uses_std() -> "string":
    import inmanta_plugins.std as std

    return f"{std.__file__} {'inmanta_plugins.std.resources' in sys.modules} {std.steward_probe()}"


@plugin
def reads_registries(ctx: Context, thing: "std::testing::NullResource") -> "string":
    return f"{'std::unique_file' in ctx.get_compiler().get_plugins()} {to_id(thing)}"


@resource("user::Item", agent="agent", id_attribute="name")
class Item(Resource):
    fields = ("name",)
"#;

/// A virtualenv whose site-packages holds the real std with `additions` appended to its
/// `__init__.py` (the rest, jinja2, pydantic, ..., from the test virtualenv through a `.pth`
/// file): (its directory, its interpreter, std's `__init__.py`).
fn std_env(additions: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let base = crate::python_plugins::venv();
    let base_site = site_packages(base.parent().unwrap().parent().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let env = dir.path().join("venv");
    run_ok(
        Command::new("python3")
            .args(["-m", "venv", "--without-pip"])
            .arg(&env),
    );
    let site = site_packages(&env);
    std::fs::write(
        site.join("steward-test-base.pth"),
        format!("{}\n", base_site.display()),
    )
    .unwrap();
    let std_dir = site.join("inmanta_plugins/std");
    copy_dir(&base_site.join("inmanta_plugins/std"), &std_dir);
    let init = std_dir.join("__init__.py");
    let mut text = std::fs::read_to_string(&init).unwrap();
    text.push_str(additions);
    std::fs::write(&init, text).unwrap();
    (dir, env.join("bin/python3"), init)
}

fn site_packages(env: &Path) -> PathBuf {
    let lib = env.join("lib");
    let version = std::fs::read_dir(&lib)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .unwrap();
    lib.join(version.file_name()).join("site-packages")
}

/// The 1-based line of `needle` in `file`.
fn line_of(file: &Path, needle: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .position(|l| l.contains(needle))
        .unwrap()
        + 1
}

/// A project pinning std with the V1 module `user` (its `__init__.py` is `user_py`).
fn project(main: &str, user_py: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("project.yml", "name: deferred\nmodulepath: libs\n"),
        ("requirements.txt", "inmanta-module-std==8.1.0\n"),
        ("main.cf", main),
        ("libs/user/module.yml", "name: user\nversion: 1.0.0\n"),
        ("libs/user/model/_init.cf", USER_CF),
        ("libs/user/plugins/__init__.py", user_py),
    ];
    for (rel, text) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

/// Compile (and export): what it printed, the export or the errors as text.
fn run(
    dir: &Path,
    python: &Path,
    export: bool,
) -> (Vec<String>, Result<Option<ExportFile>, String>) {
    let opts = CompileOptions {
        project_dir: dir.to_path_buf(),
        export,
        python: Some(python.to_path_buf()),
        ..Default::default()
    };
    let mut printed = Vec::new();
    let outcome = compile(&opts, &mut |l| printed.push(l.to_string()));
    let result = outcome.result.map_err(|errors| {
        errors
            .iter()
            .map(|d| format!("{}\n{:?}", d.message, d.resolve(&outcome.sources)))
            .collect::<Vec<_>>()
            .join("\n")
    });
    (printed, result)
}

/// How often std's package was imported since the last call (and start counting again).
fn imports_of_std(init: &Path) -> usize {
    let log = init.with_file_name("imported.log");
    let n = std::fs::read_to_string(&log)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    let _ = std::fs::remove_file(log);
    n
}

#[test]
fn a_pinned_std_is_imported_when_something_needs_it_and_only_then() {
    let (_env, python, init) = std_env(STD_ADDITIONS);

    // a Python plugin of another module that needs nothing of std: std's Python is not run
    let dir = project("import user\nstd::print(user::inc(1))\n", USER_PY);
    let (printed, result) = run(dir.path(), &python, false);
    result.unwrap();
    assert_eq!(printed, ["2"]);
    assert_eq!(imports_of_std(&init), 0);

    // another module's code imports it: the real package, with its submodules, once
    let dir = project("import user\nstd::print(user::uses_std())\n", USER_PY);
    let (printed, result) = run(dir.path(), &python, false);
    result.unwrap();
    assert_eq!(
        printed,
        [format!("{} True std's Python ran", init.display())]
    );
    assert_eq!(imports_of_std(&init), 1);

    // a plugin of std that runs in Python (Steward has no built-in one of that name)
    let dir = project("import user\nstd::print(std::steward_probe())\n", USER_PY);
    let (printed, result) = run(dir.path(), &python, false);
    result.unwrap();
    assert_eq!(printed, ["std's Python ran"]);
    assert_eq!(imports_of_std(&init), 1);

    // module code reading the registries std fills sees what it registers, as in the
    // reference (which imported it at the start): its plugins, its resource classes
    let dir = project(
        "import user\nimport std::testing\nn = std::testing::NullResource(name=\"n\", agentname=\"a\")\n\
         std::print(user::reads_registries(n))\n",
        USER_PY,
    );
    let (printed, result) = run(dir.path(), &python, false);
    result.unwrap();
    assert_eq!(printed, ["True std::testing::NullResource[a,name=n]"]);
    assert_eq!(imports_of_std(&init), 1);
}

#[test]
fn a_deferred_std_takes_part_in_the_export() {
    let (_env, python, init) = std_env(STD_ADDITIONS);
    // only the user module's resources are defined in Python, and nothing else needed std:
    // its dependency manager still runs on them at export
    let dir = project(
        "import user\nuser::Item(name=\"first\")\nuser::Item(name=\"second\")\n",
        USER_PY,
    );
    let (_, result) = run(dir.path(), &python, true);
    let x = result.unwrap().unwrap();
    let second = x
        .resources
        .iter()
        .find(|r| r.id.0 == "user::Item[a,name=second]")
        .unwrap();
    assert_eq!(second.requires.len(), 1, "{:?}", second.requires);
    assert_eq!(second.requires[0].0, "user::Item[a,name=first]");
    assert_eq!(imports_of_std(&init), 1);

    // std's own resource classes build its resources
    let dir = project(
        "import user\nimport std::testing\nstd::testing::NullResource(name=\"n\", agentname=\"a\")\n",
        USER_PY,
    );
    let (_, result) = run(dir.path(), &python, true);
    let x = result.unwrap().unwrap();
    let ids: Vec<&str> = x.resources.iter().map(|r| r.id.0.as_str()).collect();
    assert_eq!(ids, ["std::testing::NullResource[a,name=n]"]);
    assert_eq!(imports_of_std(&init), 1);
}

#[test]
fn an_import_error_of_a_deferred_std_is_reported_with_its_file_and_line() {
    let (_env, python, init) = std_env(&format!(
        "{STD_ADDITIONS}\nraise RuntimeError(\"this std is broken\")\n"
    ));
    let line = line_of(&init, "this std is broken");
    let at = format!("{}\", line {line}", init.display());
    let failed = "loading the modules' Python failed: importing inmanta_plugins.std failed: \
         RuntimeError: this std is broken";

    // needed by a plugin call: that call fails as a failure at the host's start fails it
    let dir = project("import user\nstd::print(user::uses_std())\n", USER_PY);
    let e = run(dir.path(), &python, false).1.unwrap_err();
    assert!(e.contains("Exception in plugin user::uses_std"), "{e}");
    assert!(e.contains(failed), "{e}");
    assert!(e.contains(&at), "{e}");

    // by a module whose own import imports it, at the host's start
    let importing = format!("import inmanta_plugins.std\n{USER_PY}");
    let dir = project("import user\nstd::print(user::inc(1))\n", &importing);
    let e = run(dir.path(), &python, false).1.unwrap_err();
    assert!(e.contains("Exception in plugin user::inc"), "{e}");
    assert!(e.contains(failed), "{e}");
    assert!(e.contains(&at), "{e}");

    // by an export of resources defined in Python
    let dir = project("import user\nuser::Item(name=\"first\")\n", USER_PY);
    let e = run(dir.path(), &python, true).1.unwrap_err();
    assert!(
        e.contains(&format!(
            "the Python resource definitions can not run: {failed}"
        )),
        "{e}"
    );
    assert!(e.contains(&at), "{e}");

    // a part of inmanta-core Steward does not have: the one actionable diagnostic
    let (_env, python, init) = std_env("\nfrom inmanta.references import Reference\n");
    let line = line_of(&init, "from inmanta.references import Reference");
    let dir = project("import user\nstd::print(user::uses_std())\n", USER_PY);
    let e = run(dir.path(), &python, false).1.unwrap_err();
    assert!(
        e.contains(&format!(
            "{}:{line}: `from inmanta.references import Reference`: the std module needs \
             `inmanta.references`",
            init.display()
        )),
        "{e}"
    );
    assert!(!e.contains("Traceback"), "{e}");
}

/// An interpreter that records each start in `starts.log` beside it, then runs `python`.
fn counting_interpreter(dir: &Path, python: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("python3");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\necho started >> '{}'\nexec '{}' \"$@\"\n",
            dir.join("starts.log").display(),
            python.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn starts(dir: &Path) -> usize {
    let log = dir.join("starts.log");
    let n = std::fs::read_to_string(&log)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    let _ = std::fs::remove_file(log);
    n
}

#[test]
fn one_interpreter_per_compile_answers_sys_path_and_runs_the_plugins() {
    let venv_python = crate::python_plugins::venv();
    let bin = tempfile::tempdir().unwrap();
    let python = counting_interpreter(bin.path(), venv_python);

    // a Python plugin called: the interpreter that found the pinned std runs it
    let dir = project("import user\nstd::print(user::inc(1))\n", USER_PY);
    let (printed, result) = run(dir.path(), &python, false);
    result.unwrap();
    assert_eq!(printed, ["2"]);
    assert_eq!(starts(bin.path()), 1);
    // none called: the same one start as asking for sys.path alone
    let dir = project("import user\nstd::print(\"no plugin\")\n", USER_PY);
    let (printed, result) = run(dir.path(), &python, true);
    result.unwrap();
    assert_eq!(printed, ["no plugin"]);
    assert_eq!(starts(bin.path()), 1);

    // what it answers is what `python -I` says, without Steward's own directory
    let mut host =
        steward::compiler::plugins::pyhost::PyHost::boot(venv_python, dir.path()).unwrap();
    let answered = host.sys_path().unwrap();
    let isolated: Vec<PathBuf> =
        serde_json::from_str::<Vec<String>>(&run_ok(Command::new(venv_python).args([
            "-I",
            "-c",
            "import sys, json; print(json.dumps(sys.path))",
        ])))
        .unwrap()
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect();
    assert_eq!(answered, isolated);
}

/// The project's interpreter can not run: the error of asking it for its `sys.path` (it was
/// a panic of the compiler thread).
#[test]
fn a_pinned_std_without_its_interpreter_is_an_error() {
    let dir = project("import user\nstd::print(user::inc(1))\n", USER_PY);
    let e = run(dir.path(), Path::new("/nonexistent/python3"), false)
        .1
        .unwrap_err();
    assert!(
        e.contains(
            "module std is pinned in requirements.txt but the Python environment can not be read: \
             can not run /nonexistent/python3"
        ),
        "{e}"
    );
}
