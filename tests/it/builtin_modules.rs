//! The built-in std, fs, exec and mitogen modules as the reference exports them
//! (inmanta-core 14.0.0, inmanta-module-std 8.1.0, fs 1.1.2, exec 2.1.1, mitogen 0.2.5): what
//! is exported, with which attributes and requires edges, and what a deploy then does. Every
//! expected value was read from `inmanta export -j` of the same model with the reference.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use steward::compiler::{CompileOptions, compile};
use steward::model::{ExportFile, Resource};

/// A project directory with `main.cf` and the given extra files (relative paths).
fn project(main: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("project.yml"),
        "name: builtin\nmodulepath: libs\ndownloadpath: libs\n",
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

fn try_export(dir: &Path) -> Result<ExportFile, String> {
    let opts = CompileOptions {
        project_dir: dir.to_path_buf(),
        export: true,
        ..Default::default()
    };
    let outcome = compile(&opts, &mut |_| {});
    match outcome.result {
        Ok(Some(x)) => Ok(x),
        Ok(None) => Err("no export".into()),
        Err(e) => Err(e
            .iter()
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
            .join("\n")),
    }
}

fn export(dir: &Path) -> ExportFile {
    try_export(dir).unwrap_or_else(|e| panic!("compile failed: {e}"))
}

fn by_id(x: &ExportFile) -> BTreeMap<String, &Resource> {
    x.resources.iter().map(|r| (r.id.0.clone(), r)).collect()
}

fn requires(r: &Resource) -> Vec<String> {
    r.requires.iter().map(|i| i.0.clone()).collect()
}

#[test]
fn unmanaged_resources_are_not_exported() {
    let p = project(
        r#"
import std::testing
a = std::testing::NullResource(name="unmanaged", managed=false)
b = std::testing::NullResource(name="managed")
c = std::testing::NullResource(name="needs-unmanaged", requires=[a, b])
"#,
        &[],
    );
    let x = export(p.path());
    let ids: Vec<&str> = x.resources.iter().map(|r| r.id.0.as_str()).collect();
    // the reference: "Ignoring resource of type std::testing::NullResource because it
    // requested to ignore it", and the edge to it is dropped
    assert_eq!(
        ids,
        [
            "std::testing::NullResource[internal,name=managed]",
            "std::testing::NullResource[internal,name=needs-unmanaged]",
        ]
    );
    assert_eq!(
        requires(by_id(&x)["std::testing::NullResource[internal,name=needs-unmanaged]"]),
        ["std::testing::NullResource[internal,name=managed]"]
    );
    assert_eq!(
        by_id(&x)["std::testing::NullResource[internal,name=managed]"].attributes["managed"],
        json!(true)
    );
}

#[test]
fn an_unknown_managed_is_exported_undefined() {
    let p = project(
        r#"
import std::testing
b = std::testing::NullResource(name="b")
std::testing::NullResource(name="later", managed=std::get_env("STEWARD_SURELY_UNSET_VAR"))
"#,
        &[],
    );
    let x = export(p.path());
    assert_eq!(x.resources.len(), 2);
    let undefined: Vec<&str> = x.undefined.iter().map(|i| i.0.as_str()).collect();
    assert_eq!(
        undefined,
        ["std::testing::NullResource[internal,name=later]"]
    );
}

/// A module `mymod` with `files/robots.txt`.
const MYMOD: [(&str, &str); 3] = [
    (
        "libs/mymod/module.yml",
        "name: mymod\nversion: 1.0.0\nlicense: ASL\n",
    ),
    ("libs/mymod/model/_init.cf", "\n"),
    (
        "libs/mymod/files/robots.txt",
        "User-agent: *\nDisallow: /\n",
    ),
];

#[test]
fn a_file_from_fs_file_exports_the_files_content() {
    let p = project(
        r##"
import fs
import mymod
h = std::Host(name="h", os=std::linux)
fs::File(host=h, path="/etc/robots.txt", content=fs::file("mymod/robots.txt"))
fs::File(host=h, path="/etc/std.txt", content=std::file("mymod/robots.txt"),
         prefix_content=fs::Content(value="# head"))
# a string that only looks like a marker is content like any other
fs::File(host=h, path="/etc/literal.txt", content="imp-module-source:file:///etc/passwd")
"##,
        &MYMOD,
    );
    let x = export(p.path());
    let r = by_id(&x);
    // the reference uploads these bytes and exports their sha1 as `hash`
    // (63657cbb7d7086c56b0cd4e5c6999bb683664868, for fs::file and std::file alike); Steward
    // ships the content itself
    assert_eq!(
        r["fs::File[h,path=/etc/robots.txt]"].attributes["content"],
        json!("User-agent: *\nDisallow: /\n")
    );
    // (the reference fails on this one: it reads the marked file as bytes and adds them to
    // the prefix text, a TypeError)
    assert_eq!(
        r["fs::File[h,path=/etc/std.txt]"].attributes["content"],
        json!("# head\nUser-agent: *\nDisallow: /\n")
    );
    assert_eq!(
        r["fs::File[h,path=/etc/literal.txt]"].attributes["content"],
        json!("imp-module-source:file:///etc/passwd")
    );
}

/// The ssh context the reference builds for a host with an ip and no `via`.
fn ssh_context(name: &str, ip: &str, user: &str, port: u16) -> Value {
    json!({
        "method_name": "ssh",
        "name": name,
        "hostname": ip,
        "username": user,
        "port": port,
        "check_host_keys": "ignore",
        "ssh_args": ["-o", "UserKnownHostsFile=/dev/null", "-o", "PasswordAuthentication=no"],
        "python_path": ["python"],
    })
}

#[test]
fn fs_and_exec_resources_export_via_from_mitogen_contexts() {
    let p = project(
        r#"
import fs
import exec
import mitogen

h1 = std::Host(name="h1", os=std::linux, ip="10.0.0.1")
h2 = std::Host(name="h2", os=std::linux, ip="10.0.0.2", remote_user="bob",
               via=mitogen::Ssh(hostname="x", username="u", via=mitogen::Local(name="loc")))
h3 = std::Host(name="h3", os=std::linux, ip="10.0.0.3", remote_user="bob", remote_port=2222)
h4 = std::Host(name="h4", os=std::linux)

exec::Run(host=h1, command="echo hi")
exec::Run(host=h2, command="ls")
fs::File(host=h3, path="/p", content="q", mode=644)
fs::File(host=h1, path="/tmp/zz", content="x", via=mitogen::Local())
fs::Directory(host=h1, path="/tmp/a")
fs::Symlink(host=h1, src="/tmp/a/x", dst="/tmp/other/y")
fs::File(host=h4, path="/local", content="l")
"#,
        &[],
    );
    let x = export(p.path());
    let r = by_id(&x);
    let via = |id: &str| r[id].attributes["via"].clone();
    let h1 = ssh_context("h1", "10.0.0.1", "root", 22);
    assert_eq!(via("exec::Run[h1,command=echo hi]"), h1);
    assert_eq!(via("fs::Directory[h1,path=/tmp/a]"), h1);
    assert_eq!(via("fs::Symlink[h1,dst=/tmp/other/y]"), h1);
    // the host's own context, null attributes left out, the chain under `via`
    assert_eq!(
        via("exec::Run[h2,command=ls]"),
        json!({"method_name": "ssh", "hostname": "x", "username": "u", "name": "",
               "via": {"method_name": "local", "name": "loc"}})
    );
    // not root: the ssh context under a sudo one
    assert_eq!(
        via("fs::File[h3,path=/p]"),
        json!({"method_name": "sudo", "name": "", "via": ssh_context("h3", "10.0.0.3", "bob", 2222)})
    );
    assert_eq!(
        r["fs::File[h3,path=/p]"].attributes["permissions"],
        json!(644)
    );
    // the resource's own `via` wins over its host's
    assert_eq!(
        via("fs::File[h1,path=/tmp/zz]"),
        json!({"method_name": "local", "name": ""})
    );
    // neither `via` nor `ip`: the reference fails the export ("[No ip] Cannot serialize a
    // mitogen::Context"); Steward deploys on the agent's machine and exports null
    assert_eq!(via("fs::File[h4,path=/local]"), Value::Null);
    assert!(x.undefined.is_empty());
}

#[test]
fn a_via_depending_on_an_unknown_makes_the_resource_undefined() {
    let p = project(
        r#"
import exec
h = std::Host(name="h", os=std::linux, ip=std::get_env("STEWARD_SURELY_UNSET_VAR"))
exec::Run(host=h, command="true")
"#,
        &[],
    );
    let x = export(p.path());
    let undefined: Vec<&str> = x.undefined.iter().map(|i| i.0.as_str()).collect();
    assert_eq!(undefined, ["exec::Run[h,command=true]"]);
}

const DIRS_MODEL: &str = r#"
import fs
h = std::Host(name="h", os=std::linux)
g = std::Host(name="g", os=std::linux)
fs::Directory(host=h, path="/srv/")
fs::Directory(host=h, path="/srv/www/../data")
fs::Directory(host=h, path="/srv/www", purged=true)
fs::File(host=h, path="/srv/www/old.html", content="", purged=PURGED)
fs::File(host=h, path="/srv/data//x", content="")
fs::File(host=h, path="/srvx", content="")
fs::Symlink(host=h, src="/srv/data/x", dst="/opt/link")
fs::Directory(host=h, path="/")
fs::File(host=g, path="/srv/g", content="")
"#;

#[test]
fn everything_in_a_directory_requires_it() {
    let p = project(&DIRS_MODEL.replace("PURGED", "true"), &[]);
    let x = export(p.path());
    let got: BTreeMap<String, Vec<String>> = x
        .resources
        .iter()
        .map(|r| (r.id.0.clone(), requires(r)))
        .collect();
    // as the reference's export of the same model (with a mitogen context on the hosts):
    // paths compared normalized, every ancestor directory required, per host; a purged file
    // in a purged directory goes first; a symlink by its src and by its dst
    let srv = "fs::Directory[h,path=/srv/]";
    let data = "fs::Directory[h,path=/srv/www/../data]";
    let expected: BTreeMap<String, Vec<String>> = [
        ("fs::Directory[h,path=/]", vec![]),
        (srv, vec![]),
        (data, vec![srv]),
        (
            "fs::Directory[h,path=/srv/www]",
            vec![srv, "fs::File[h,path=/srv/www/old.html]"],
        ),
        ("fs::File[g,path=/srv/g]", vec![]),
        ("fs::File[h,path=/srv/data//x]", vec![srv, data]),
        ("fs::File[h,path=/srv/www/old.html]", vec![srv]),
        ("fs::File[h,path=/srvx]", vec![]),
        ("fs::Symlink[h,dst=/opt/link]", vec![srv, data]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
    .collect();
    assert_eq!(got, expected);
}

#[test]
fn a_resource_kept_in_a_purged_directory_is_an_error() {
    let p = project(&DIRS_MODEL.replace("PURGED", "false"), &[]);
    let e = try_export(p.path()).unwrap_err();
    assert_eq!(
        e,
        "Directory fs::Directory[h,path=/srv/www] is purged but a resource is trying to deploy \
         something in it: fs::File[h,path=/srv/www/old.html]"
    );
}

/// A model written for the reference deploys as it means to: the module file's text lands in
/// the file (not the marker), and the directories exist before what is in them.
#[tokio::test(flavor = "multi_thread")]
async fn a_deploy_writes_the_module_file_inside_its_directories() {
    let (_srv, c, env, dir) = crate::deploy::deploying_env("builtin", json!({})).await;
    let root = dir.path().join("site");
    let main = format!(
        r#"
import fs
import mymod
h = std::Host(name="localhost", os=std::linux)
fs::File(host=h, path="{root}/a/b/robots.txt", content=fs::file("mymod/robots.txt"))
fs::Directory(host=h, path="{root}/a/b")
fs::Directory(host=h, path="{root}/a")
fs::Directory(host=h, path="{root}")
"#,
        root = root.display()
    );
    let p = project(&main, &MYMOD);
    let x = export(p.path());
    let file_id = format!("fs::File[localhost,path={}/a/b/robots.txt]", root.display());
    assert_eq!(by_id(&x)[file_id.as_str()].requires.len(), 3);
    let v = c.upload(&env, &x, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    crate::support::wait_deployed(&c, &env, v, 60).await;
    assert_eq!(
        std::fs::read_to_string(root.join("a/b/robots.txt")).unwrap(),
        "User-agent: *\nDisallow: /\n"
    );
    assert_eq!(
        crate::deploy::state_of(&c, &env, &file_id).await.status,
        "deployed"
    );
}

/// std::generate_password keeps what it made in the project's `data/std/passwordfile.txt`
/// (as the reference), so the next compile and std::password see the same password; a
/// password already in the file is used as it is.
#[test]
fn generated_passwords_are_kept_for_the_next_compiles() {
    use std::os::unix::fs::PermissionsExt;
    let p = project(
        r#"
import std::testing
std::testing::NullResource(name=std::generate_password("db", 16))
"#,
        &[],
    );
    let first = export(p.path()).resources[0].id.0.clone();
    let file = p.path().join("data/std/passwordfile.txt");
    let text = std::fs::read_to_string(&file).unwrap();
    let pw = text.strip_prefix("db=").unwrap().trim_end().to_string();
    assert_eq!(pw.len(), 16);
    assert!(pw.chars().all(|c| c.is_ascii_alphanumeric()), "{pw}");
    assert_eq!(
        first,
        format!("std::testing::NullResource[internal,name={pw}]")
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // the next compile gets the same password, from either plugin
    assert_eq!(export(p.path()).resources[0].id.0, first);
    std::fs::write(
        p.path().join("main.cf"),
        "import std::testing\nstd::testing::NullResource(name=std::password(\"db\"))\n",
    )
    .unwrap();
    assert_eq!(export(p.path()).resources[0].id.0, first);
    std::fs::write(&file, "db=chosen\n").unwrap();
    assert_eq!(
        export(p.path()).resources[0].id.0,
        "std::testing::NullResource[internal,name=chosen]"
    );
}

/// The password file stays inside the project: a `data/` that is a symlink out of it is
/// refused before anything is written there.
#[test]
fn the_password_file_is_not_written_through_a_symlink_out_of_the_project() {
    let outside = tempfile::tempdir().unwrap();
    let p = project("std::print(std::generate_password(\"db\"))\n", &[]);
    std::os::unix::fs::symlink(outside.path(), p.path().join("data")).unwrap();
    let e = try_export(p.path()).unwrap_err();
    assert!(e.contains("outside the project directory"), "{e}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}
