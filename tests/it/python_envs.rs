//! Projects' Python environments (`src/pyenv.rs`): `steward project install` makes
//! `.steward/venv` from requirements.txt once, and the git-following server makes one per
//! requirements (wheels only), shared by the commits that name the same ones, and fails a
//! commit whose requirements can not be installed with pip's reason; compiles find the V2
//! modules installed there. The packages are local wheels built by the test (no index
//! needed).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::gitops_support::{Repo, compiled, follow, git_ok};
use crate::support::TestServer;

/// A V2 module package `inmanta-module-demo` (an `inmanta_plugins.demo` package with a model),
/// built as a wheel into `out`; its path.
pub fn demo_wheel(out: &Path, version: &str) -> PathBuf {
    let src = tempfile::tempdir().unwrap();
    let pkg = src.path().join("inmanta_plugins/demo");
    std::fs::create_dir_all(pkg.join("model")).unwrap();
    std::fs::write(pkg.join("__init__.py"), "GREETING = 'hello from demo'\n").unwrap();
    std::fs::write(
        pkg.join("model/_init.cf"),
        "entity Greeter:\n    string name\nend\nimplement Greeter using std::none\n",
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/make_wheel.py");
    let o = Command::new("python3")
        .arg(script)
        .arg(src.path())
        .arg(out)
        .args(["inmanta-module-demo", version])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out.join(format!("inmanta_module_demo-{version}-py3-none-any.whl"))
}

/// A directory of wheels the server's pip may install from, as an operator gives one
/// (`steward server --pip-find-links DIR`): readable by compiles, which run as other users
/// when the server is root. Holds the demo module at `version`.
pub fn wheel_dir(srv: &TestServer, version: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let wheel = demo_wheel(dir.path(), version);
    std::fs::set_permissions(&wheel, std::fs::Permissions::from_mode(0o644)).unwrap();
    srv.sources
        .as_ref()
        .expect("a deploying server")
        .set_pip_sources(steward::sources::compile::PipSources {
            index_url: None,
            find_links: vec![dir.path().display().to_string()],
        });
    dir
}

fn steward(dir: &Path, args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_steward"))
        .args(args)
        .current_dir(dir)
        .env_remove("VIRTUAL_ENV")
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr),
    )
}

#[test]
fn project_install_makes_the_environment_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(p.join("project.yml"), "name: t\n").unwrap();
    std::fs::write(p.join("main.cf"), "").unwrap();
    // no requirements.txt: told what to do
    let (ok, out) = steward(p, &["project", "install"]);
    assert!(
        !ok && out.contains("requirements.txt does not exist"),
        "{out}"
    );

    demo_wheel(&p.join("wheels"), "1.0.0");
    std::fs::write(
        p.join("requirements.txt"),
        "./wheels/inmanta_module_demo-1.0.0-py3-none-any.whl\n",
    )
    .unwrap();
    let (ok, out) = steward(p, &["project", "install", "--only-binary"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("made ") && out.contains(".steward/venv"),
        "{out}"
    );
    let python = p.join(".steward/venv/bin/python3");
    let o = Command::new(&python)
        .args(["-c", "import inmanta_plugins.demo as d; print(d.GREETING)"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "hello from demo");
    // compiles find the V2 module in it (no virtualenv active)
    std::fs::write(
        p.join("main.cf"),
        "import demo\ndemo::Greeter(name=\"x\")\n",
    )
    .unwrap();
    let (ok, out) = steward(p, &["compile"]);
    assert!(ok, "{out}");
    // the same requirements: nothing to do
    let (ok, out) = steward(p, &["project", "install"]);
    assert!(
        ok && out.contains("already holds these requirements"),
        "{out}"
    );
    // a requirement pip can not satisfy: its reason, and no half-made environment used
    std::fs::write(
        p.join("requirements.txt"),
        "./wheels/missing-1.0-py3-none-any.whl\n",
    )
    .unwrap();
    let (ok, out) = steward(p, &["project", "install"]);
    assert!(!ok && out.contains("missing-1.0-py3-none-any.whl"), "{out}");
    assert!(!p.join(".steward/venv/.steward-requirements").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_installs_requirements_once_per_set_and_fails_commits_it_can_not_install() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let _wheels = wheel_dir(&srv, "1.0.0");
    std::fs::write(
        repo.work.join("requirements.txt"),
        "inmanta-module-demo==1.0.0\n",
    )
    .unwrap();
    // the model imports the V2 module the requirements install
    let first = repo.commit(
        "import demo\ndemo::Greeter(name=\"one\")\nstd::print(\"one\")\n",
        "with requirements",
    );
    repo.push_ok();
    let env = follow(&c, "py", &repo, json!({})).await;
    let r = compiled(&c, &env, &first, 120).await;
    assert_eq!(r["status"], "success", "{r:#}");
    let stage = |r: &serde_json::Value| {
        r["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "python environment")
            .cloned()
            .unwrap_or_else(|| panic!("no python environment stage: {r:#}"))
    };
    let made = stage(&r);
    assert!(
        made["ok"] == true && made["detail"].as_str().unwrap().starts_with("made "),
        "{made:#}"
    );

    // another commit with the same requirements shares the environment
    let second = repo.commit("std::print(\"two\")\n", "same requirements");
    repo.push_ok();
    c.trigger_compile(&env, Some(&second)).await.unwrap();
    let r = compiled(&c, &env, &second, 120).await;
    assert_eq!(r["status"], "success", "{r:#}");
    let shared = stage(&r);
    assert!(
        shared["detail"]
            .as_str()
            .unwrap()
            .contains("made before for the same requirements"),
        "{shared:#}"
    );

    // requirements pip can not install: the commit fails with pip's reason, no version
    let versions_before = c.versions(&env).await.unwrap().len();
    std::fs::write(repo.work.join("requirements.txt"), "nothing-here==1.0\n").unwrap();
    let third = repo.commit("std::print(\"three\")\n", "broken requirements");
    repo.push_ok();
    c.trigger_compile(&env, Some(&third)).await.unwrap();
    let r = compiled(&c, &env, &third, 120).await;
    assert_eq!(r["status"], "failed", "{r:#}");
    let error = r["error"].as_str().unwrap();
    assert!(
        error.contains("installing requirements.txt failed") && error.contains("nothing-here==1.0"),
        "{error}"
    );
    assert_eq!(c.versions(&env).await.unwrap().len(), versions_before);
    git_ok(&repo.work, &["status"]);
}

/// A commit's Python plugin is the commit's code: in a server compile (as its environment's
/// compile uid when the server runs as root) it sees the shared environment it runs in, but not the rest of the
/// data directory, nor the server's environment.
#[tokio::test(flavor = "multi_thread")]
async fn a_commits_python_plugin_can_not_read_the_servers_data_or_environment() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: compiles run as another user only when the server runs as root");
        return;
    }
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let _wheels = wheel_dir(&srv, "1.0.0");
    std::fs::write(
        repo.work.join("requirements.txt"),
        "inmanta-module-demo==1.0.0\n",
    )
    .unwrap();
    let m = repo.work.join("libs/probe");
    std::fs::create_dir_all(m.join("model")).unwrap();
    std::fs::create_dir_all(m.join("plugins")).unwrap();
    std::fs::write(m.join("module.yml"), "name: probe\nversion: 1.0.0\n").unwrap();
    std::fs::write(m.join("model/_init.cf"), "").unwrap();
    std::fs::write(
        m.join("plugins/__init__.py"),
        r#"import os
from inmanta.plugins import plugin


def attempt(what, f):
    try:
        return f"{what}: read {f()!r}"
    except OSError as e:
        return f"{what}: refused {type(e).__name__}"


@plugin
def probe() -> "string":
    own = os.path.dirname(os.environ["VIRTUAL_ENV"])
    envs = os.path.dirname(own)
    data = os.path.dirname(envs)
    server = os.getppid()
    with open(f"/proc/{server}/status") as f:
        server = next(int(l.split()[1]) for l in f if l.startswith("PPid:"))
    lines = [
        attempt("data dir", lambda: os.listdir(data)),
        attempt("server environ", lambda: open(f"/proc/{server}/environ").read()[:40]),
        attempt("own", lambda: sorted(os.listdir(own))[:1] and "listed"),
        attempt("envs", lambda: sorted(os.listdir(envs))[:1] and "listed"),
    ]
    for name in ("code", "mirrors", "pg", "secret"):
        lines.append(attempt(name, lambda: os.listdir(os.path.join(data, name))))
    return "\n".join(lines)
"#,
    )
    .unwrap();
    let commit = repo.commit("import probe\nstd::print(probe::probe())\n", "probe");
    repo.push_ok();
    // something of the server's in the data directory (made as its own files are)
    let data = srv.data_dir();
    std::fs::create_dir_all(data.join("secret")).unwrap();
    std::fs::write(data.join("secret/token"), "TOP-SECRET").unwrap();
    let env = follow(&c, "probe", &repo, json!({})).await;
    let r = compiled(&c, &env, &commit, 120).await;
    assert_eq!(r["status"], "success", "{r:#}");
    let out = r["stdout"].as_str().unwrap();
    // the environments of all environments: not listable (each one's own is closed to others)
    // (its own directory: listable where the data directory is; under a private /tmp, as
    // here, only the path to its environment is there, and nothing is listed)
    assert!(out.contains("envs: refused PermissionError"), "{out}");
    for line in out.lines() {
        if !line.starts_with("own:") && !line.contains("FileNotFoundError") {
            assert!(line.contains("refused PermissionError"), "{out}");
        }
    }
    assert!(!out.contains("TOP-SECRET"), "{out}");
}

/// A commit as every Inmanta project has it: `requirements.txt` pins the real std. The
/// server installs it wheels only, which inmanta-core itself can not be (its `crontab`
/// dependency has no wheel): Steward stands in for inmanta-core, pip brings std and the
/// packages module code imports, and the compile runs the real std.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_pinning_the_real_std_compiles_on_the_server() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    std::fs::write(
        repo.work.join("requirements.txt"),
        "inmanta-module-std==8.1.0\n",
    )
    .unwrap();
    let commit = repo.commit(
        "import std::testing\n\
         x = std::json_dumps({\"a\": [1, 2]})\n\
         std::print(x)\n\
         std::testing::NullResource(name=std::upper(\"real\"))\n",
        "real std",
    );
    repo.push_ok();
    let env = follow(&c, "realstd", &repo, json!({})).await;
    let r = compiled(&c, &env, &commit, 300).await;
    assert_eq!(r["status"], "success", "{r:#}");
    let text = r.to_string();
    assert!(text.contains("{\\\"a\\\": [1, 2]}"), "{r:#}");
    let stage = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "python environment")
        .cloned()
        .unwrap_or_else(|| panic!("no python environment stage: {r:#}"));
    let detail = stage["detail"].as_str().unwrap();
    assert!(
        detail.contains("inmanta-module-std-8.1.0")
            && detail.contains("inmanta-core-14.0.0+steward"),
        "{detail}"
    );
    assert!(!detail.contains("crontab"), "{detail}");
}
