//! Issue 12: a compile reads only files of its project and modules, and its output is bounded.
//! Through `steward compile` on a directory, and through the git-following server.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::gitops_support::{Repo, compiled, follow, git_ok};
use crate::support::TestServer;

/// A line every /etc/passwd has.
const PASSWD: &str = "root:";
const SECRET: &str = "TOP-SECRET-a8f3c1d9";

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

/// A module `m` with a files/ and templates/ directory.
fn module(dir: &Path) -> std::path::PathBuf {
    let m = dir.join("libs/m");
    for d in ["model", "files", "templates"] {
        std::fs::create_dir_all(m.join(d)).unwrap();
    }
    std::fs::write(m.join("module.yml"), "name: m\nversion: 1.0.0\n").unwrap();
    std::fs::write(m.join("model/_init.cf"), "").unwrap();
    std::fs::write(m.join("files/ok.txt"), "fine").unwrap();
    m
}

/// `steward compile --json`: (exit code, stdout, stderr).
fn compile(dir: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(["compile", "--json"])
        .current_dir(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The compile fails at main.cf:`line` with `needle` in the message, and `secret` appears nowhere.
fn refused(dir: &Path, line: u64, needle: &str, secret: &str) {
    let (code, out, err) = compile(dir);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(!out.contains(secret) && !err.contains(secret), "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    let d = &doc["diagnostics"][0];
    assert_eq!(d["primary"]["file"], "main.cf", "{doc:#}");
    assert_eq!(d["primary"]["line"], line, "{doc:#}");
    assert!(d["primary"]["column"].as_u64().unwrap() >= 1, "{doc:#}");
    let msg = d["message"].as_str().unwrap();
    assert!(msg.contains(needle), "{msg}");
}

#[test]
fn absolute_and_parent_paths_are_refused_by_source_file_and_template() {
    for call in [
        "std::source(\"//etc/passwd\")",
        "std::file(\"//etc/passwd\")",
        "std::template(\"//etc/passwd\")",
        "std::source(\"m//etc/passwd\")",
        "std::template(\"m/../../../../../../etc/passwd\")",
        "std::file(\"/../../../../../../../etc/passwd\")",
    ] {
        let p = project(&format!("import m\nx = {call}\nstd::print(x)\n"));
        module(p.path());
        refused(p.path(), 2, "may not leave the module", PASSWD);
    }
}

#[test]
fn symlinks_out_of_the_project_are_refused() {
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), SECRET).unwrap();
    let p = project("");
    let m = module(p.path());
    std::os::unix::fs::symlink(secret.path(), m.join("files/leak")).unwrap();
    std::os::unix::fs::symlink(secret.path(), m.join("templates/leak.j2")).unwrap();
    std::fs::create_dir(p.path().join("files")).unwrap();
    std::os::unix::fs::symlink(secret.path(), p.path().join("files/leak")).unwrap();
    for call in [
        "std::source(\"m/leak\")",
        "std::file(\"m/leak\")",
        "std::template(\"m/leak.j2\")",
        "std::source(\"/leak\")",
    ] {
        std::fs::write(
            p.path().join("main.cf"),
            format!("import m\nx = {call}\nstd::print(x)\n"),
        )
        .unwrap();
        refused(p.path(), 2, "outside the project directory", SECRET);
    }
    // what stays inside still works, through a symlink too
    std::os::unix::fs::symlink("ok.txt", m.join("files/alias")).unwrap();
    std::fs::write(
        p.path().join("main.cf"),
        "import m\nstd::print(std::source(\"m/ok.txt\"))\nstd::print(std::source(\"m/alias\"))\n",
    )
    .unwrap();
    let (code, out, err) = compile(p.path());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "fine\nfine\n");
}

#[test]
fn model_files_and_module_paths_out_of_the_project_are_refused() {
    let secret_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        secret_dir.path().join("s.cf"),
        format!("x = \"{SECRET}\"\nx = 1\n"),
    )
    .unwrap();
    // main.cf itself a symlink out: its text would be quoted in a diagnostic
    let p = project("");
    std::fs::remove_file(p.path().join("main.cf")).unwrap();
    std::os::unix::fs::symlink(secret_dir.path().join("s.cf"), p.path().join("main.cf")).unwrap();
    let (code, out, err) = compile(p.path());
    assert_eq!(code, Some(1));
    assert!(!err.contains(SECRET) && !out.contains(SECRET), "{err}");
    assert!(err.contains("outside the project directory"), "{err}");
    // module paths: absolute, `..`, or a symlink out
    for path in [
        secret_dir.path().display().to_string(),
        "../x".to_string(),
        "out".to_string(),
    ] {
        let p = project("import m\n");
        std::os::unix::fs::symlink(secret_dir.path(), p.path().join("out")).unwrap();
        std::fs::write(
            p.path().join("project.yml"),
            format!("name: t\nmodulepath: {path}\n"),
        )
        .unwrap();
        let (code, _, err) = compile(p.path());
        assert_eq!(code, Some(1), "{path}");
        assert!(
            err.contains("leaves the project directory"),
            "{path}: {err}"
        );
    }
    // a module directory that is a symlink out
    let p = project("import m\n");
    std::fs::create_dir(p.path().join("libs")).unwrap();
    let outside = module(secret_dir.path());
    std::os::unix::fs::symlink(&outside, p.path().join("libs/m")).unwrap();
    let (code, _, err) = compile(p.path());
    assert_eq!(code, Some(1));
    assert!(err.contains("outside the project directory"), "{err}");
    // a model file of a module that is a symlink out: its text would be quoted too
    let p = project("import m::s\n");
    let m = module(p.path());
    std::os::unix::fs::symlink(secret_dir.path().join("s.cf"), m.join("model/s.cf")).unwrap();
    let (code, out, err) = compile(p.path());
    assert_eq!(code, Some(1));
    assert!(!err.contains(SECRET) && !out.contains(SECRET), "{err}");
    assert!(
        err.contains("libs/m/model/s.cf: it resolves outside the project directory"),
        "{err}"
    );
}

/// The real server path: a committed symlink to a file outside the checkout, and models
/// reading /etc/passwd, compiled by the server following the repository.
#[tokio::test(flavor = "multi_thread")]
async fn server_compiles_never_leak_files_of_the_server() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), SECRET).unwrap();
    let repo = Repo::new();
    let m = module(&repo.work);
    std::os::unix::fs::symlink(secret.path(), m.join("files/leak")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../../../etc/passwd", m.join("files/up"))
        .unwrap();
    // lexically inside, but out through another symlink: `here -> .`, then `here/..`
    std::os::unix::fs::symlink(".", repo.work.join("here")).unwrap();
    std::os::unix::fs::symlink("../../../here/..", m.join("files/sneaky")).unwrap();
    // inside: kept
    std::os::unix::fs::symlink("ok.txt", m.join("files/alias")).unwrap();
    let first = repo.commit("import m\nstd::print(std::source(\"m/leak\"))\n", "leak");
    repo.push_ok();
    let env = follow(&c, "leak", &repo, json!({})).await;
    let r = compiled(&c, &env, &first, 60).await;
    let text = r.to_string();
    assert_eq!(r["status"], "failed", "{r:#}");
    assert!(!text.contains(SECRET), "{r:#}");
    let checkout = &r["stages"][1];
    assert_eq!(checkout["name"], "checkout", "{r:#}");
    let detail = checkout["detail"].as_str().unwrap();
    assert!(
        detail.contains("symlinks pointing outside the checkout were not written")
            && detail.contains("libs/m/files/leak")
            && detail.contains("libs/m/files/up")
            && detail.contains("libs/m/files/sneaky -> ../../../here/..")
            && !detail.contains("alias")
            && !detail.contains("here ->"),
        "{detail}"
    );
    assert!(r["error"].as_str().unwrap().contains("main.cf:2:"), "{r:#}");

    for (i, call) in [
        "std::source(\"//etc/passwd\")",
        "std::file(\"//etc/passwd\")",
        "std::template(\"m/../../../../../../../etc/passwd\")",
        "std::source(\"m/up\")",
        "std::source(\"m/sneaky/project/tmp/../../etc/passwd\")",
    ]
    .iter()
    .enumerate()
    {
        let commit = repo.commit(
            &format!("import m\nstd::print({call})\nstd::print(std::source(\"m/alias\"))\n"),
            &format!("attempt {i}"),
        );
        repo.push_ok();
        c.trigger_compile(&env, Some(&commit)).await.unwrap();
        let r = compiled(&c, &env, &commit, 60).await;
        assert_eq!(r["status"], "failed", "{call}: {r:#}");
        let text = r.to_string();
        assert!(!text.contains(PASSWD) && !text.contains(SECRET), "{r:#}");
        let error = r["error"].as_str().unwrap();
        assert!(error.contains("main.cf:2:"), "{call}: {error}");
    }
    // a symlink inside the checkout is read as usual
    let commit = repo.commit("import m\nstd::print(std::source(\"m/alias\"))\n", "inside");
    repo.push_ok();
    c.trigger_compile(&env, Some(&commit)).await.unwrap();
    let r = compiled(&c, &env, &commit, 60).await;
    assert_eq!(r["status"], "success", "{r:#}");
    assert_eq!(r["stdout"], "fine\n");
    git_ok(&repo.work, &["status"]);
}

/// One commit printing far more than a report keeps: the report holds the first and the
/// last part of it and says how much was cut.
#[tokio::test(flavor = "multi_thread")]
async fn server_caps_compile_output() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = repo.commit(
        "for i in std::sequence(60000):\n    std::print(\"line {{i}} of a very long output, padded to make it longer\")\nend\n",
        "loud",
    );
    repo.push_ok();
    let env = follow(&c, "loud", &repo, json!({})).await;
    let r = compiled(&c, &env, &commit, 120).await;
    assert_eq!(r["status"], "success", "{r:#}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.len() < 600 << 10, "{} bytes kept", out.len());
    assert!(out.starts_with("line 0 of"), "{}", &out[..100]);
    assert!(
        out.trim_end()
            .ends_with("line 59999 of a very long output, padded to make it longer"),
        "{}",
        &out[out.len() - 100..]
    );
    assert!(out.contains("output cut:"), "the cut is said");
}

/// Handler code a module exports: a symlink out of the module is refused, not exported.
#[test]
fn handler_code_through_a_symlink_out_is_refused() {
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), SECRET).unwrap();
    let p = project(
        "import h\nhost = std::Host(name=\"localhost\", os=std::linux)\nh::R(host=host, name=\"r\")\n",
    );
    let m = p.path().join("libs/h");
    std::fs::create_dir_all(m.join("model")).unwrap();
    std::fs::create_dir_all(m.join("handler")).unwrap();
    std::fs::write(
        m.join("module.yml"),
        "name: h\nversion: 1.0.0\nresources:\n  h::R:\n    agent: host.name\n    id: name\n    fields: [name, purged, send_event, receive_events]\n    handler: handler/main.sh\n",
    )
    .unwrap();
    std::fs::write(
        m.join("model/_init.cf"),
        "entity R extends std::PurgeableResource:\n    string name\nend\nR.host [1] -- std::Host\nimplement R using std::none\n",
    )
    .unwrap();
    std::fs::write(m.join("handler/main.sh"), "#!/bin/sh\n").unwrap();
    let export = |p: &Path| {
        Command::new(env!("CARGO_BIN_EXE_steward"))
            .args(["export", "-j", "out.json"])
            .current_dir(p)
            .output()
            .unwrap()
    };
    let ok = export(p.path());
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    std::os::unix::fs::symlink(secret.path(), m.join("handler/leak")).unwrap();
    std::fs::remove_file(m.join("handler/main.sh")).unwrap();
    std::os::unix::fs::symlink(secret.path(), m.join("handler/main.sh")).unwrap();
    std::fs::remove_file(p.path().join("out.json")).unwrap();
    let out = export(p.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("outside the project directory"), "{err}");
    let written = std::fs::read_to_string(p.path().join("out.json")).unwrap_or_default();
    assert!(!written.contains(&hex::encode(SECRET)) && !err.contains(SECRET));
}
