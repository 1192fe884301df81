//! Inmanta modules' Python in the compiler: V1 `plugins/`, V2 modules installed with pip into
//! a virtualenv, Python plugins (entities, `Context`, waiting on attributes not frozen yet,
//! errors with tracebacks, typedef constraints), `@resource` classes with mappers and exporter
//! hooks at export, handler code for `@provider` types, and the real public modules
//! `inmanta-module-yaml` and `inmanta-module-ip` exported as the reference exports them
//! (`tests/python/real_modules/expected.json`, from inmanta-core 14.0.0).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};
use steward::compiler::{CompileOptions, compile};
use steward::model::ExportFile;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

/// A project directory: `project.yml` with module path `libs`, `main.cf`, extra files.
fn project(main: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("project.yml"),
        "name: pyproj\nmodulepath: libs\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("main.cf"), main).unwrap();
    for (rel, text) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

struct Run {
    printed: Vec<String>,
    result: Result<Option<ExportFile>, String>,
}

fn run(dir: &Path, python: &Path, export: bool) -> Run {
    let opts = CompileOptions {
        project_dir: dir.to_path_buf(),
        export,
        python: Some(python.to_path_buf()),
        ..Default::default()
    };
    let mut printed = Vec::new();
    let outcome = compile(&opts, &mut |l| printed.push(l.to_string()));
    let result = match outcome.result {
        Ok(x) => Ok(x),
        Err(e) => Err(e
            .iter()
            .map(|d| {
                let r = d.resolve(&outcome.sources);
                format!("{}\n{r:?}", d.message)
            })
            .collect::<Vec<_>>()
            .join("\n")),
    };
    Run { printed, result }
}

fn system_python() -> PathBuf {
    PathBuf::from("python3")
}

/// One virtualenv per test process, with real public modules and their Python dependencies
/// installed from the package index as an Inmanta user installs them (the real `std`, and with
/// it inmanta-core, among them): yaml, ip (and net, which ip imports), fs, exec and mitogen,
/// and the test's own V2 module `v2demo` built into a wheel. Modules a project does not pin
/// in its `requirements.txt` stay Steward's built-ins (std, fs, exec, mitogen).
pub(crate) fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("steward-pyplugins-")
            .tempdir()
            .unwrap()
            .keep();
        crate::support::remove_when_tests_exit(&dir);
        let ok = |c: &mut Command| {
            let out = c.output().unwrap();
            assert!(
                out.status.success(),
                "{c:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let env = dir.join("venv");
        ok(Command::new("python3").arg("-m").arg("venv").arg(&env));
        let wheel = ok(Command::new("python3")
            .arg(data_dir().join("make_wheel.py"))
            .arg(data_dir().join("v2demo"))
            .arg(dir.join("dist"))
            .args([
                "inmanta-module-v2demo",
                "1.4.0",
                "inmanta-module-std",
                "inmanta-core>=14",
                "PyYAML>=5",
            ]));
        ok(Command::new(env.join("bin/pip")).args([
            "install",
            "-q",
            "--disable-pip-version-check",
            "inmanta-module-yaml==1.0.0",
            "inmanta-module-ip==2.0.3",
            "inmanta-module-net==1.1.3",
            "inmanta-module-fs==1.1.2",
            "inmanta-module-exec==2.1.1",
            "inmanta-module-mitogen==0.2.5",
            "inmanta-module-files==2.1.1",
            "inmanta-module-std==8.1.0",
            "inmanta-core==14.0.0",
            &wheel,
        ]));
        env.join("bin/python3")
    })
}

const MYMOD_CF: &str = r#"
entity Thing:
    string name
end
Thing.peers [0:] -- Thing
implement Thing using std::none

typedef even as int matching mymod::is_even(self)

entity Numbered:
    even n
end
implement Numbered using std::none
"#;

const MYMOD_PY: &str = r#"
from inmanta.plugins import plugin, Context, PluginException


@plugin
def greet(ctx: Context, thing: "mymod::Thing", greeting: "string" = "hello") -> "string":
    data = ctx.get_data_dir()
    return f"{greeting} {thing.name}: {sorted(p.name for p in thing.peers)} data={data.endswith('data/mymod')}"


@plugin
def is_even(n: "int") -> "bool":
    return n % 2 == 0


@plugin("fail")
def failing(x: "string") -> "string":
    raise PluginException(f"bad {x}")


@plugin
def crash(x: "string") -> "string":
    return helper(x)


def helper(x):
    return {}[x]


@plugin
def collect(items: "list", *args: "int", **kw: "any") -> "list":
    return [i * 2 for i in items] + list(args) + sorted(kw)


@plugin
def maybe(x: "string?" = None) -> "string?":
    return x


@plugin
def bad_return() -> "int":
    return "text"


@plugin(allow_unknown=True)
def sees_unknowns(x: "any") -> "string":
    from inmanta.execute.util import Unknown
    return "unknown" if isinstance(x, Unknown) else f"known {x}"


@plugin
def called(x: "any") -> "string":
    return "called"


@plugin
def through_std(ctx: Context, thing: "mymod::Thing", resource: "std::Entity") -> "list":
    # std's plugins called from Python, as modules do (`std` is built in: they run in the
    # compiler), the Context first where the reference's function declares one
    import inmanta_plugins.std as std

    fact = std.getfact(ctx, resource, "size")
    try:
        std.no_such_plugin(1)
        missing = "no error"
    except PluginException as e:
        missing = str(e)
    return [
        std.count(thing.peers),
        std.is_unknown(fact),
        std.getfact(ctx, resource, "size", default_value="none yet"),
        std.replace("a-b", "-", "+"),
        missing,
    ]
"#;

fn mymod(main: &str) -> tempfile::TempDir {
    project(
        main,
        &[
            ("libs/mymod/module.yml", "name: mymod\nversion: 1.0.0\n"),
            ("libs/mymod/model/_init.cf", MYMOD_CF),
            ("libs/mymod/plugins/__init__.py", MYMOD_PY),
        ],
    )
}

/// `inmanta.util.dict_path` of the compatibility package (used by the files and fs modules'
/// JSON handlers) against the table of cases recorded from inmanta-core 14.0.0.
#[test]
fn the_compatibility_dict_paths_behave_as_inmanta_core() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = crate::support::run_ok(
        Command::new("python3")
            .arg(root.join("tests/python/dict_path_check.py"))
            .env("PYTHONPATH", root.join("python")),
    );
    assert!(text.contains("dict_path cases pass"), "{text}");
}

#[test]
fn python_plugins_call_the_built_in_std_plugins() {
    // `through_std(a)` reads `a.peers` through std::count: the call waits for the relation
    let dir = mymod(
        r#"
import mymod
import std::testing
a = mymod::Thing(name="a")
std::print(mymod::through_std(a, std::testing::NullResource(name="n")))
a.peers += mymod::Thing(name="b")
a.peers += mymod::Thing(name="c")
"#,
    );
    let r = run(dir.path(), &system_python(), false);
    r.result.unwrap();
    assert_eq!(
        r.printed,
        ["@[2, True, 'none yet', 'a+b', 'module std has no plugin no_such_plugin']"]
    );
}

#[test]
fn python_plugins_take_entities_and_a_context_and_wait_for_frozen_relations() {
    // `greet(a)` runs before `a.peers` is complete: the plugin's read of `peers` makes the
    // call wait, and it runs again once the relation is frozen, seeing every peer
    let dir = mymod(
        r#"
import mymod
a = mymod::Thing(name="a")
b = mymod::Thing(name="b")
std::print(mymod::greet(a))
std::print(mymod::greet(thing=b, greeting="hi"))
a.peers += b
b.peers += mymod::Thing(name="late")
a.peers += mymod::Thing(name="later")
std::print(mymod::collect([1, 2], 3, 4, z=1, y=2))
std::print(mymod::maybe())
std::print(mymod::maybe("x"))
mymod::Numbered(n=4)
"#,
    );
    let r = run(dir.path(), &system_python(), false);
    r.result.unwrap();
    let mut printed = r.printed.clone();
    printed.sort();
    assert_eq!(
        printed,
        vec![
            "@[2, 4, 3, 4, 'y', 'z']",
            "None",
            "hello a: ['b', 'later'] data=True",
            "hi b: ['late'] data=True",
            "x",
        ],
        "{:?}",
        r.printed
    );
    assert!(dir.path().join("data/mymod").is_dir());
}

#[test]
fn python_plugin_errors_are_diagnostics_at_the_call_with_the_traceback() {
    let dir = mymod("import mymod\nx = mymod::fail(\"x\")\n");
    let e = run(dir.path(), &system_python(), false).result.unwrap_err();
    assert!(
        e.contains("PluginException in plugin mymod::fail\ncaused by: bad x"),
        "{e}"
    );
    assert!(e.contains("main.cf"), "{e}");
    assert!(e.contains("line: 2") || e.contains(":2:"), "{e}");

    let dir = mymod("import mymod\n\nx = mymod::crash(\"k\")\n");
    let e = run(dir.path(), &system_python(), false).result.unwrap_err();
    assert!(e.contains("Exception in plugin mymod::crash"), "{e}");
    assert!(e.contains("KeyError: 'k'"), "{e}");
    // the traceback names the plugin's file and lines, down to the helper that raised
    assert!(
        e.contains("plugins/__init__.py\", line 23, in crash"),
        "{e}"
    );
    assert!(
        e.contains("plugins/__init__.py\", line 27, in helper"),
        "{e}"
    );
    assert!(e.contains("file: \"main.cf\", line: 3, column: 5"), "{e}");

    for (main, expect) in [
        (
            "import mymod\nx = mymod::greet(1)\n",
            "Invalid value '1', expected mymod::Thing (argument 'thing' of mymod::greet)",
        ),
        (
            "import mymod\nx = mymod::is_even()\n",
            "mymod::is_even() missing 1 required positional argument: 'n'",
        ),
        (
            "import mymod\nx = mymod::is_even(1, 2)\n",
            "mymod::is_even() takes 1 positional arguments but 2 were given",
        ),
        (
            "import mymod\nx = mymod::is_even(m=2)\n",
            "mymod::is_even() got an unexpected keyword argument 'm'",
        ),
        (
            "import mymod\nx = mymod::bad_return()\n",
            "return value: Invalid value 'text', expected int",
        ),
        (
            // a typedef constraint calling a Python plugin
            "import mymod\nmymod::Numbered(n=3)\n",
            "Invalid value '3', does not match constraint `mymod::is_even(self)`",
        ),
    ] {
        let dir = mymod(main);
        let e = run(dir.path(), &system_python(), false).result.unwrap_err();
        assert!(e.contains(expect), "{main}: {e}");
    }

    // every file of a module is imported, as the reference does: one that fails is named
    let dir = project(
        "import mymod\nx = mymod::is_even(2)\n",
        &[
            ("libs/mymod/module.yml", "name: mymod\nversion: 1.0.0\n"),
            ("libs/mymod/model/_init.cf", MYMOD_CF),
            ("libs/mymod/plugins/__init__.py", MYMOD_PY),
            ("libs/mymod/plugins/extra.py", "import no_such_dependency\n"),
        ],
    );
    let e = run(dir.path(), &system_python(), false).result.unwrap_err();
    assert!(
        e.contains("importing inmanta_plugins.mymod.extra failed: ModuleNotFoundError: No module named 'no_such_dependency'"),
        "{e}"
    );
}

/// Inmanta's rule: a plugin gets an unknown argument only when it says `allow_unknown=True`;
/// otherwise it is not called and its result is unknown. Only the argument itself counts: a
/// list holding an unknown is passed (the reference prints the same five lines, in another
/// order).
#[test]
fn unknown_arguments_reach_only_plugins_that_allow_them() {
    let dir = mymod(
        r#"import mymod
u = std::get_env("STEWARD_SURELY_UNSET_VAR")
std::print(mymod::sees_unknowns(u))
std::print(mymod::sees_unknowns("x"))
std::print(std::is_unknown(mymod::called(u)))
std::print(std::is_unknown(mymod::called([1, u])))
std::print(mymod::called("y"))
"#,
    );
    let r = run(dir.path(), &system_python(), false);
    r.result.unwrap();
    assert_eq!(
        r.printed,
        vec!["unknown", "known x", "True", "False", "called"]
    );
}

#[test]
fn no_python_runs_unless_a_python_plugin_is_called() {
    // a module with Python plugins, none called: nothing waits for an interpreter (it does not
    // even exist here; the model has a call site, in a typedef constraint, so the compile
    // tried to start it ahead, and that failure stays silent until a call needs it)
    let dir = mymod("import mymod\nmymod::Thing(name=\"a\")\nstd::print(\"ok\")\n");
    let r = run(dir.path(), Path::new("/nonexistent/python3"), true);
    assert_eq!(r.printed, vec!["ok"]);
    r.result.unwrap();
    // called: the error says which interpreter could not start
    let dir = mymod("import mymod\nx = mymod::is_even(2)\n");
    let e = run(dir.path(), Path::new("/nonexistent/python3"), false)
        .result
        .unwrap_err();
    assert!(
        e.contains("can not start the Python plugin host with /nonexistent/python3"),
        "{e}"
    );
}

#[test]
fn a_v2_module_from_the_virtualenv_exports_python_resources_hooks_and_handler_code() {
    let python = venv();
    let dir = project(
        r#"
import v2demo
a = v2demo::Site(name="a")
b = v2demo::Site(name="b", site_requires=[a], greeting="hi")
v2demo::Site(name="c", managed=false)
v2demo::Site(name="ignored-d")
std::print(v2demo::banner(b))
"#,
        &[],
    );
    let r = run(dir.path(), python, true);
    assert_eq!(r.printed, vec!["welcome to b"]);
    let x = r.result.unwrap().unwrap();
    let ids: Vec<&str> = x.resources.iter().map(|r| r.id.0.as_str()).collect();
    // c is not managed, ignored-d raised IgnoreResourceException in its mapper
    assert_eq!(
        ids,
        ["v2demo::Site[web,name=a]", "v2demo::Site[web,name=b]"]
    );
    let b = &x.resources[1];
    assert_eq!(b.attributes["text"], "hi, b");
    assert_eq!(b.attributes["managed"], true);
    assert_eq!(b.attributes["purged"], false);
    // the dependency manager's edge
    assert_eq!(b.requires[0].0, "v2demo::Site[web,name=a]");
    assert_eq!(x.metadata.modules["v2demo"], "1.4.0");
    // the @provider type ships the module's Python with its requirements
    let h = &x.handlers["v2demo::Site"];
    let inm = h.inmanta.as_ref().unwrap();
    assert_eq!(inm.imports, ["inmanta_plugins.v2demo"]);
    assert_eq!(inm.requirements, ["PyYAML>=5"]);
    assert!(h.files.contains_key("inmanta_plugins/v2demo/__init__.py"));
    for f in h.files.values() {
        assert!(x.code.contains_key(&f.hash));
    }
}

#[test]
fn real_yaml_and_ip_modules_export_as_the_reference_does() {
    let src = data_dir().join("real_modules/project");
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src, tmp.path());
    // the environment its user makes: pip install -r requirements.txt (std pinned)
    let python = crate::python_real_modules::user_env(tmp.path());
    let started = std::time::Instant::now();
    let r = run(tmp.path(), &python, true);
    let x = r.result.unwrap().unwrap();
    eprintln!("real modules: compile + export in {:?}", started.elapsed());
    let expected = std::fs::read_to_string(data_dir().join("real_modules/expected.json")).unwrap();
    assert_eq!(
        crate::python_real_modules::as_the_reference_writes(&x),
        crate::python_real_modules::reference_export(&expected)
    );
    assert_eq!(x.metadata.modules["yaml"], "1.0.0");
    assert_eq!(x.metadata.modules["ip"], "2.0.3");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// A module whose Python needs a part of inmanta-core Steward does not provide (here
/// `inmanta.references`, which inmanta-module-fs 1.2 imports and inmanta-core 14.0.0 lacks):
/// one diagnostic naming the module file, its line, the import and what to pin, without a
/// traceback through the plugin host.
#[test]
fn a_module_importing_what_steward_does_not_provide_gets_one_actionable_diagnostic() {
    let dir = project(
        "import newer\nx = newer::f()\n",
        &[
            ("libs/newer/module.yml", "name: newer\nversion: 2.0.0\n"),
            ("libs/newer/model/_init.cf", ""),
            (
                "libs/newer/plugins/__init__.py",
                "from inmanta.plugins import plugin\nfrom . import refs\n\n\n@plugin\ndef f() -> \"string\":\n    return \"f\"\n",
            ),
            (
                "libs/newer/plugins/refs.py",
                "import os\n\nfrom inmanta.references import Reference\n",
            ),
        ],
    );
    let e = run(dir.path(), &system_python(), false).result.unwrap_err();
    assert!(
        e.contains("plugins/refs.py:3: `from inmanta.references import Reference`"),
        "{e}"
    );
    assert!(
        e.contains("the newer module needs `inmanta.references`"),
        "{e}"
    );
    assert!(e.contains("inmanta-module-newer"), "{e}");
    assert!(!e.contains("Traceback"), "{e}");

    // a name missing from a module Steward has
    std::fs::write(
        dir.path().join("libs/newer/plugins/refs.py"),
        "from inmanta.plugins import plugin\nfrom inmanta.execute.util import Unknown, Reference\n",
    )
    .unwrap();
    let e = run(dir.path(), &system_python(), false).result.unwrap_err();
    assert!(
        e.contains("refs.py:2: `from inmanta.execute.util import Unknown, Reference`"),
        "{e}"
    );
    assert!(e.contains("needs `inmanta.execute.util.Reference`"), "{e}");
}

const OPTMOD_CF: &str = r#"
entity Box extends std::Resource:
    string name
    string agent = "boxes"
end
entity Lid:
    string color
end
Box.lid [0:1] -- Lid
implement Box using std::none
implement Lid using std::none
"#;

const OPTMOD_PY: &str = r#"
from inmanta.ast import OptionalValueException
from inmanta.plugins import Context, plugin
from inmanta.resources import Resource, resource


def lid_color(box) -> str:
    try:
        return box.lid.color
    except OptionalValueException:
        return "no lid"


@plugin
def describe(box: "optmod::Box") -> "string":
    return f"{box.name}: {lid_color(box)}"


@plugin
def shout(ctx: Context, text: "string") -> "string":
    return text.upper() + "!"


@plugin
def through_registry(ctx: Context, text: "string") -> "string":
    # as the config module's Jinja filters call plugins: the registry's instances, with the
    # Context inserted at `_context`
    shout = ctx.get_compiler().get_plugins()["optmod::shout"]
    args = [text]
    if shout._context != -1:
        args.insert(shout._context, ctx)
    return f"{shout(*args)} ns={shout.ns.get_full_name()}"


@resource("optmod::Box", agent="agent", id_attribute="name")
class BoxResource(Resource):
    fields = ("name", "lid")

    @staticmethod
    def get_lid(exporter, box):
        return lid_color(box)
"#;

/// An optional relation left empty raises inmanta-core's `OptionalValueException` in Python,
/// in a plugin and in a resource mapper alike (the openstack module's mappers catch it), and
/// `Context.get_compiler().get_plugins()` gives callable plugins with `_context` and `ns`
/// (the config module calls them as Jinja filters).
#[test]
fn python_sees_an_empty_optional_relation_and_the_plugin_registry_as_inmanta_core_shows_them() {
    let dir = project(
        r#"
import optmod
a = optmod::Box(name="a", lid=optmod::Lid(color="red"))
b = optmod::Box(name="b")
c = optmod::Box(name="c", lid=null)
std::print([optmod::describe(a), optmod::describe(b), optmod::describe(c), optmod::through_registry("hi")])
"#,
        &[
            ("libs/optmod/module.yml", "name: optmod\nversion: 1.0.0\n"),
            ("libs/optmod/model/_init.cf", OPTMOD_CF),
            ("libs/optmod/plugins/__init__.py", OPTMOD_PY),
        ],
    );
    let r = run(dir.path(), &system_python(), true);
    let x = r.result.unwrap().unwrap();
    assert_eq!(
        r.printed,
        ["@['a: red', 'b: no lid', 'c: no lid', 'HI! ns=optmod']"]
    );
    let lids: BTreeMap<String, Value> = x
        .resources
        .iter()
        .map(|r| (r.id.0.clone(), r.attributes["lid"].clone()))
        .collect();
    assert_eq!(
        lids,
        BTreeMap::from([
            ("optmod::Box[boxes,name=a]".to_string(), json!("red")),
            ("optmod::Box[boxes,name=b]".to_string(), json!("no lid")),
            ("optmod::Box[boxes,name=c]".to_string(), json!("no lid")),
        ])
    );
}
