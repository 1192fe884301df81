//! The real public `fs`, `exec` and `mitogen` Inmanta modules, unchanged, from start to end:
//! a project pins them in its `requirements.txt`, they are installed with pip (and their
//! dependencies: the real `std`, inmanta-core, mitogen) into a virtualenv, Steward compiles the
//! project with their `.cf` files, Python plugins and `@resource` classes, and the export is
//! what the reference exports (`tests/python/real_fs/expected.json`, written by `inmanta
//! export -j` of inmanta-core 14.0.0 with `REAL_FS_ROOT=/srv/real-fs`). Then `steward deploy`
//! deploys it through the modules' own handlers (mitogen's local context) in executors.
//!
//! The same for the public `files` module with `mitogen` and `std` left built in
//! (`tests/python/real_files`): its `@resource` classes live in submodules its package does not
//! import, name their type by keyword, a typedef checks hostnames with a lookaround regex,
//! and its handlers import the installed mitogen package's Python, `yaml` (which inmanta-core
//! brings) and `inmanta.util.dict_path`.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use steward::compiler::{CompileOptions, compile};
use steward::model::ExportFile;

use crate::support::{copy_dir, run_ok, steward_bin};

/// The root the expected export was made with.
const REFERENCE_ROOT: &str = "/srv/real-fs";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/real_fs")
}

/// A reference export (`inmanta export -j`) by resource id without version: each resource's
/// fields plus `requires`, sorted (the reference writes them in the order of a Python set,
/// which changes from run to run).
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
            if let Some(Value::Array(requires)) = m.get_mut("requires") {
                requires.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            }
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
            let mut requires: Vec<&str> = r.requires.iter().map(|x| x.0.as_str()).collect();
            requires.sort();
            m.insert("requires".into(), serde_json::json!(requires));
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

/// The Python environment an Inmanta user makes for `project`: a virtualenv and
/// `pip install -r requirements.txt`, every dependency included (inmanta-core and what it
/// brings, the real std). One per requirements text for the test process; pip's own cache
/// (`~/.cache/pip`) keeps the downloads between runs. Its interpreter.
pub(crate) fn user_env(project: &Path) -> PathBuf {
    type Slot = std::sync::Arc<OnceLock<PathBuf>>;
    static ENVS: OnceLock<Mutex<HashMap<String, Slot>>> = OnceLock::new();
    let requirements = std::fs::read_to_string(project.join("requirements.txt")).unwrap();
    // one slot per requirements text: two tests wanting the same environment make it once,
    // different environments are made at the same time
    let slot = ENVS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(requirements)
        .or_default()
        .clone();
    slot.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("steward-user-env-")
            .tempdir()
            .unwrap()
            .keep();
        crate::support::remove_when_tests_exit(&dir);
        let env = dir.join("venv");
        run_ok(Command::new("python3").arg("-m").arg("venv").arg(&env));
        let started = std::time::Instant::now();
        run_ok(
            Command::new(env.join("bin/pip"))
                .args(["install", "-q", "--disable-pip-version-check", "-r"])
                .arg(project.join("requirements.txt")),
        );
        eprintln!(
            "pip install -r {}: {:?}",
            project.join("requirements.txt").display(),
            started.elapsed()
        );
        env.join("bin/python3")
    })
    .clone()
}

/// Remove `dir` once this test process has exited: the environments live as long as the
/// process (tests share them), and each is 100 to 300 MB.
/// `steward deploy` of `project` with `options`, with `root` in the environment variable
/// `root_var`, in the project's user environment.
fn steward_deploy(project: &Path, root_var: &str, root: &Path, options: &[&str]) -> String {
    let python = user_env(project);
    run_ok(
        Command::new(steward_bin())
            .arg("deploy")
            .args(options)
            .arg("-p")
            .arg(project)
            .env("VIRTUAL_ENV", python.parent().unwrap().parent().unwrap())
            .env(root_var, root),
    )
}

/// Assert that the handler code ships each of `files`.
fn assert_shipped(h: &steward::model::HandlerCode, files: &[&str]) {
    for f in files {
        assert!(
            h.files.contains_key(*f),
            "{f} not shipped: {:?}",
            h.files.keys()
        );
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Compile and export `project` with the test virtualenv and `var=value` in its environment.
fn export(project: &Path, var: &str, value: &str) -> ExportFile {
    export_with(project, &[(var, value)])
}

/// Compile and export `project` in its user environment with `vars` in its environment.
pub(crate) fn export_with(project: &Path, vars: &[(&str, &str)]) -> ExportFile {
    let opts = CompileOptions {
        project_dir: project.to_path_buf(),
        export: true,
        python: Some(user_env(project)),
        env: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
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
        "{}: compile + export in {:?}",
        project.display(),
        started.elapsed()
    );
    x
}

#[test]
fn real_fs_exec_and_mitogen_modules_export_as_the_reference_and_deploy() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&fixture().join("project"), &project);

    // the export, made where the reference made it
    let x = export(&project, "REAL_FS_ROOT", REFERENCE_ROOT);
    assert_eq!(as_the_reference_writes(&x), expected(REFERENCE_ROOT));
    assert_eq!(x.metadata.modules["fs"], "1.1.2");
    assert_eq!(x.metadata.modules["exec"], "2.1.1");
    assert_eq!(x.metadata.modules["mitogen"], "0.2.5");
    // the handler code: the modules' Python, what the mitogen distribution installs beside
    // it, and the files the hash mappers uploaded
    let h = &x.handlers["fs::File"];
    let inm = h.inmanta.as_ref().unwrap();
    // fs imports yaml, which inmanta-core would have installed; the real std (pinned) ships
    // with its own requirements
    assert_eq!(
        inm.requirements,
        [
            "Jinja2<4,>=3.1",
            "email_validator<3,>=1.3",
            "mitogen",
            "pydantic<3,>=1.10",
            "pyyaml~=6.0"
        ]
    );
    assert_shipped(
        h,
        &[
            "inmanta_plugins/fs/resources.py",
            "inmanta_plugins/exec/__init__.py",
            "inmanta_plugins/mitogen/abc.py",
            "inmanta_mitogen/__init__.py",
            // sha1 of files/etc/motd, which fs::file names
            "_files/a8b5339efd1cf927f2bc8042d4f66f2a7655ceaa",
        ],
    );
    assert_eq!(x.handlers["exec::Run"].digest, h.digest);

    // deployed by the modules' own handlers
    let root = tmp.path().join("out");
    let first = steward_deploy(&project, "REAL_FS_ROOT", &root, &[]);
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
    let second = steward_deploy(&project, "REAL_FS_ROOT", &root, &[]);
    assert!(second.contains("8 deployed (no changes)"), "{second}");

    // the file fs::file names changes: its hash changes and the real handler rewrites it
    std::fs::write(project.join("files/etc/motd"), "a new motd\n").unwrap();
    std::fs::set_permissions(root.join("motd"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let third = steward_deploy(&project, "REAL_FS_ROOT", &root, &[]);
    assert!(third.contains("1 updated"), "{third}");
    assert_eq!(read("motd"), "a new motd\n");
    assert_eq!(mode(&root.join("motd")), 0o600);
}

#[test]
fn real_files_module_exports_as_the_reference_and_deploys_with_mitogen_built_in() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/real_files");
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&fixture.join("project"), &project);

    let reference_root = "/srv/real-files";
    let x = export(&project, "REAL_FILES_ROOT", reference_root);
    let expected = std::fs::read_to_string(fixture.join("expected.json")).unwrap();
    assert_eq!(as_the_reference_writes(&x), reference_export(&expected));
    assert_eq!(x.metadata.modules["files"], "2.1.1");
    // mitogen and std are Steward's own here; the files module's Python imports the installed
    // mitogen package's, which ships with the handler code, as do the submodules its package
    // does not import and the package its distribution installs beside it
    let h = &x.handlers["files::TextFile"];
    let inm = h.inmanta.as_ref().unwrap();
    for module in ["inmanta_plugins.files", "inmanta_plugins.files.text"] {
        assert!(inm.imports.iter().any(|i| i == module), "{:?}", inm.imports);
    }
    for r in ["mitogen", "pyyaml~=6.0"] {
        assert!(
            inm.requirements.iter().any(|x| x == r),
            "{:?}",
            inm.requirements
        );
    }
    assert_shipped(
        h,
        &[
            "inmanta_plugins/files/text.py",
            "inmanta_plugins/mitogen/abc.py",
            "inmanta_files/__init__.py",
        ],
    );

    // deployed by the files module's own handlers
    let root = tmp.path().join("out");
    std::fs::create_dir(&root).unwrap();
    let first = steward_deploy(&project, "REAL_FILES_ROOT", &root, &[]);
    assert!(first.contains("6 deployed (6 created"), "{first}");
    let hello = root.join("conf.d/hello.txt");
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "hello from files\n"
    );
    assert_eq!(mode(&hello), 0o640);
    assert_eq!(mode(&root.join("conf.d")), 0o755);
    assert_eq!(
        std::fs::read_to_string(root.join("motd")).unwrap(),
        "welcome\n"
    );
    assert_eq!(std::fs::read_link(root.join("link")).unwrap(), hello);
    // the JSON file's values placed by their dict paths (`peers[name=db]` merged into a list)
    let app: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("conf.d/app.json")).unwrap())
            .unwrap();
    assert_eq!(
        app,
        serde_json::json!({
            "settings": {"port": 8080, "tags": ["a", "b"]},
            "peers": [{"name": "db", "port": 5432}],
        })
    );
    assert_eq!(
        std::fs::read_to_string(root.join("hosts")).unwrap(),
        "10.0.0.5 db.example.com\n"
    );

    // a drifted file: a dry-run (the handlers' read side) sees it and changes nothing, a
    // repair puts it back and leaves the rest as it is
    std::fs::write(&hello, "changed by hand\n").unwrap();
    let dry = steward_deploy(&project, "REAL_FILES_ROOT", &root, &["--dry-run"]);
    assert!(dry.contains("1 would change"), "{dry}");
    assert!(
        dry.contains(r#"content: "changed by hand\n" -> "hello from files\n""#),
        "{dry}"
    );
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "changed by hand\n"
    );
    let repair = steward_deploy(&project, "REAL_FILES_ROOT", &root, &["--repair"]);
    assert!(repair.contains("1 updated"), "{repair}");
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "hello from files\n"
    );
}

/// A project as every Inmanta project template makes it: `requirements.txt` pins the real
/// `std` (8.1.0), installed by pip with inmanta-core and all it brings. Its `.cf` files and
/// Python are loaded (a project-local V1 module's plugin calls into std's Python), the
/// plugins give what the reference gives (`tests/python/real_std/expected.json`, from
/// `inmanta export -j` of inmanta-core 14.0.0), and the resources deploy through std's own
/// handler.
#[test]
fn a_project_pinning_the_real_std_exports_as_the_reference_and_deploys() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/real_std");
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&fixture.join("project"), &project);

    let x = export(&project, "STEWARD_REAL_STD_UNSET_OTHER", "");
    let expected = std::fs::read_to_string(fixture.join("expected.json")).unwrap();
    assert_eq!(as_the_reference_writes(&x), reference_export(&expected));
    assert_eq!(x.metadata.modules["std"], "8.1.0");
    let h = &x.handlers["std::testing::NullResource"];
    assert_shipped(h, &["inmanta_plugins/std/resources.py"]);

    let root = tmp.path().join("out");
    let first = steward_deploy(&project, "STEWARD_REAL_STD_UNSET_OTHER", &root, &[]);
    assert!(first.contains("3 deployed"), "{first}");
    let second = steward_deploy(&project, "STEWARD_REAL_STD_UNSET_OTHER", &root, &[]);
    assert!(second.contains("3 deployed (no changes)"), "{second}");
}

/// The accounts the user module's project makes for a name prefix; removed when dropped, also
/// when the test fails half-way.
struct TestAccounts {
    prefix: String,
}

impl TestAccounts {
    fn users(&self) -> [String; 2] {
        [format!("{}u", self.prefix), format!("{}s", self.prefix)]
    }

    fn groups(&self) -> [String; 2] {
        [format!("{}g", self.prefix), format!("{}t", self.prefix)]
    }

    /// The account database's line for `name` (`getent DATABASE NAME`), if there is one.
    fn entry(database: &str, name: &str) -> Option<String> {
        let out = Command::new("getent")
            .arg(database)
            .arg(name)
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for TestAccounts {
    fn drop(&mut self) {
        for user in self.users() {
            let _ = Command::new("userdel").arg(&user).output();
        }
        for group in self.groups() {
            let _ = Command::new("groupdel").arg(&group).output();
        }
    }
}

/// The real public user module (pinned in the project's `requirements.txt`) makes users and
/// groups through `steward deploy`, the user's way (`VIRTUAL_ENV` of the environment pip made
/// from the requirements): its model turns each into an `exec::Run` of `useradd`/`groupadd`
/// from its templates, guarded by an `unless` that looks the name up (the module has no
/// handler of its own; what it detects as drift is an account that is gone, not a changed
/// shell). A second deploy changes nothing, a dry-run after an account was removed shows the
/// command that would run again, `--repair` makes it again. Needs root.
#[test]
fn real_user_module_creates_users_and_groups_and_repairs_a_removed_one() {
    // SAFETY: geteuid(2) can not fail
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "skipped real_user_module_creates_users_and_groups_and_repairs_a_removed_one: \
             making users and groups needs root"
        );
        return;
    }
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/real_user");
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&fixture.join("project"), &project);

    // a name no account has: letters only (useradd's rules), from the process id and time
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let letters: String = format!("{}{stamp}", std::process::id())
        .bytes()
        .rev()
        .take(8)
        .map(|d| (b'a' + (d - b'0')) as char)
        .collect();
    let accounts = TestAccounts {
        prefix: format!("stw{letters}"),
    };
    for name in accounts.users() {
        assert_eq!(TestAccounts::entry("passwd", &name), None, "{name} exists");
    }
    let prefix = Path::new(&accounts.prefix);

    let first = steward_deploy(&project, "REAL_USER_NAME", prefix, &[]);
    assert!(first.contains("4 deployed (4 created"), "{first}");
    let [user, system_user] = accounts.users();
    let [staff, tools] = accounts.groups();
    let passwd = TestAccounts::entry("passwd", &user).expect("the user was made");
    let staff_entry = TestAccounts::entry("group", &staff).expect("the group was made");
    let staff_gid = staff_entry.split(':').nth(2).unwrap();
    // name:x:uid:gid:gecos:home:shell
    let fields: Vec<&str> = passwd.split(':').collect();
    assert_eq!(fields[3], staff_gid, "{passwd}");
    assert_eq!(fields[5], format!("/home/{user}"), "{passwd}");
    assert_eq!(fields[6], "/bin/bash", "{passwd}");
    let tools_entry = TestAccounts::entry("group", &tools).expect("the system group was made");
    assert!(tools_entry.ends_with(&format!(":{user}")), "{tools_entry}");
    let system = TestAccounts::entry("passwd", &system_user).expect("the system user was made");
    assert!(system.ends_with(":/usr/sbin/nologin"), "{system}");

    // everything is there: nothing to do
    let second = steward_deploy(&project, "REAL_USER_NAME", prefix, &[]);
    assert!(second.contains("4 deployed (no changes)"), "{second}");

    // drift: the system user is removed by hand; a dry-run shows it and changes nothing
    run_ok(Command::new("userdel").arg(&system_user));
    let dry = steward_deploy(&project, "REAL_USER_NAME", prefix, &["--dry-run"]);
    assert!(dry.contains("1 would change"), "{dry}");
    assert!(dry.contains(&system_user), "{dry}");
    assert_eq!(TestAccounts::entry("passwd", &system_user), None);

    let repair = steward_deploy(&project, "REAL_USER_NAME", prefix, &["--repair"]);
    assert!(repair.contains("1 created"), "{repair}");
    let system = TestAccounts::entry("passwd", &system_user).expect("the system user is back");
    assert!(system.ends_with(":/usr/sbin/nologin"), "{system}");
}

/// A project-local V1 module with its own CRUD handler (examples/inmanta-v1-module), in a
/// project as its user has it: `requirements.txt` pins the real std, installed by pip with
/// every dependency. It deploys through the module's handler, a second run changes nothing,
/// a dry-run shows a drifted file and `--repair` puts it back.
#[test]
fn a_project_local_v1_module_with_a_crud_handler_deploys_with_the_real_std_pinned() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    // as root, the embedded cluster stays in the project when its user can enter the dir
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let project = tmp.path().join("motd");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/inmanta-v1-module"),
        &project,
    );
    std::fs::write(
        project.join("requirements.txt"),
        "inmanta-module-std==8.1.0\n",
    )
    .unwrap();
    let out = tmp.path().join("out/motd");
    let deploy = |options: &[&str]| steward_deploy(&project, "MOTD_PATH", &out, options);
    let first = deploy(&[]);
    assert!(first.contains("1 deployed (1 created"), "{first}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("Welcome to localhost\n"), "{text}");
    assert_eq!(mode(&out), 0o644);
    let second = deploy(&[]);
    assert!(second.contains("no changes"), "{second}");
    // drift: the file's content and mode changed behind Steward's back
    std::fs::write(&out, "tampered\n").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).unwrap();
    let dry = deploy(&["--dry-run", "--repair"]);
    assert!(dry.contains("1 would change"), "{dry}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "tampered\n");
    let repaired = deploy(&["--repair"]);
    assert!(repaired.contains("1 updated"), "{repaired}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    assert_eq!(mode(&out), 0o644);
}

/// A real public module that uses facts, unchanged: files (`JsonFile` reports what it finds
/// at a `DiscoveredValue`'s path with `ctx.set_fact`; the model reads it back with
/// `std::getfact`). One `steward deploy` converges: the first round writes the JSON file and
/// marks the file that needs the discovered value undefined, the fact arrives, the second
/// round writes it; the next run changes nothing.
#[test]
fn real_files_module_discovers_values_through_facts_and_one_deploy_converges() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/real_files_facts");
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    copy_dir(&fixture.join("project"), &project);
    let root = tmp.path().join("out");
    std::fs::create_dir(&root).unwrap();
    let first = steward_deploy(&project, "REAL_FILES_ROOT", &root, &[]);
    assert!(
        first.contains("facts arrived for 1 unknown values: compiling again"),
        "{first}"
    );
    let app: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("app.json")).unwrap()).unwrap();
    assert_eq!(app["settings"]["port"], 8080);
    let port: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("port.txt")).unwrap()).unwrap();
    assert_eq!(port, serde_json::json!({"settings.port": 8080}), "{first}");
    let second = steward_deploy(&project, "REAL_FILES_ROOT", &root, &[]);
    assert!(!second.contains("compiling again"), "{second}");
    assert!(second.contains("no changes"), "{second}");
}
