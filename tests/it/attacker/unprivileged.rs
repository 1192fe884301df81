//! A committer against a server that runs as an ordinary user, as an operator without root
//! starts it: its data directory (with its private PostgreSQL and that database's password)
//! and its home (SSH keys) belong to the same uid the compiles and handlers run as, so only
//! namespaces can keep them out. Each attack is performed by a commit's Python plugin and by
//! a handler on a `local:` agent.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::attacker::committer::plugin_module;
use crate::attacker::{is_root, skipped};
use crate::gitops_support::{Repo, compiled, follow};
use crate::support::{Account, Operated, exec_run, export_of, wait_deployed};

const ADMIN: &str = "stw_admin_secret_of_the_unprivileged_attacks_012345678";

/// The account the server runs as: `nobody`, as an operator's own account would be.
pub(crate) const NOBODY: Account = Account {
    uid: 65534,
    gid: 65534,
};

/// A file of the server's user, readable by it alone, holding a fresh secret.
fn secret_file(path: &Path, what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let secret = format!("{what}-{}-{nanos}", std::process::id());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, &secret).unwrap();
    std::os::unix::fs::chown(path, Some(NOBODY.uid), Some(NOBODY.gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    secret
}

/// What a jailed process must not read or list, and the secrets that must not reach it.
struct Targets {
    files: Vec<String>,
    dirs: Vec<String>,
    secrets: Vec<(&'static str, String)>,
}

/// The server's secrets and other environments' files, in `srv`'s data directory and home.
fn targets(srv: &Operated, other_env: &str) -> Targets {
    let data = srv.data.path().to_path_buf();
    let home = srv.base.as_ref().unwrap().path().join("home");
    let data_secret = secret_file(&data.join("operator-secret"), "DATA-SECRET");
    let key = secret_file(&home.join(".ssh/id_ed25519"), "SSH-KEY");
    let pg_secret = std::fs::read_to_string(data.join("pg/secret"))
        .unwrap_or_else(|e| panic!("no private database password in the data dir: {e}"))
        .trim()
        .to_string();
    assert!(!pg_secret.is_empty());
    let pid = srv.pid();
    let other_code = data.join("code").join(format!("env-{other_env}"));
    Targets {
        files: vec![
            format!("/proc/{pid}/environ"),
            format!("/proc/{pid}/cmdline"),
            data.join("pg/secret").display().to_string(),
            data.join("operator-secret").display().to_string(),
            home.join(".ssh/id_ed25519").display().to_string(),
        ],
        dirs: vec![
            data.display().to_string(),
            data.join("compiles").display().to_string(),
            data.join("python-envs").display().to_string(),
            other_code.display().to_string(),
            home.display().to_string(),
        ],
        secrets: vec![
            ("the admin token", ADMIN.to_string()),
            ("the PostgreSQL password", pg_secret),
            ("the data dir's secret", data_secret),
            ("the server user's SSH key", key),
        ],
    }
}

/// The lines of `out` that say something was read, or listed beyond the way to `own` (the
/// jail's own directory, bound back into a hidden one: the directories on the way to it
/// show it alone).
fn reached<'a>(out: &'a str, own: &[PathBuf]) -> Vec<&'a str> {
    out.lines()
        .filter(|l| {
            if l.contains("READ ") {
                return true;
            }
            let Some((dir, entries)) = l
                .split_once("LISTED ")
                .and_then(|(_, rest)| rest.split_once(": "))
            else {
                return false;
            };
            entries.split_whitespace().any(|e| {
                let seen = Path::new(dir).join(e);
                e != "." && e != ".." && !own.iter().any(|o| o.starts_with(&seen))
            })
        })
        .collect()
}

/// Check what a jailed process reported: it tried everything, reached nothing (but the way
/// to `own`), saw no secret and few processes.
fn assert_nothing_reached(who: &str, out: &str, own: &[PathBuf], t: &Targets) {
    let hits = reached(out, own);
    assert!(hits.is_empty(), "{who} reached: {hits:#?}");
    for f in &t.files {
        assert!(
            out.contains(&format!("refused {f}")),
            "{who}: {f} not tried: {out}"
        );
    }
    for d in &t.dirs {
        assert!(
            out.contains(&format!("refused {d}")) || out.contains(&format!("LISTED {d}:")),
            "{who}: {d} not tried: {out}"
        );
    }
    for (what, secret) in &t.secrets {
        assert!(
            !out.contains(secret.as_str()),
            "{what} reached {who}: {out}"
        );
    }
    let procs: usize = out
        .split("procs=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{who}: no process count: {out}"));
    assert!(
        procs <= 10,
        "{who} sees {procs} processes (no PID namespace?): {out}"
    );
}

/// Start the server as `nobody`, or say why the attacks can not be tried here.
pub(crate) async fn unprivileged_server(test: &str) -> Option<Operated> {
    if !is_root() {
        skipped(
            test,
            "starting the server as another, ordinary user needs root (run the tests as root)",
        );
        return None;
    }
    // the operator's wheels are in its home, which jails hide: pip must still find them
    let srv =
        Operated::start_unprivileged(ADMIN, NOBODY, &["--pip-find-links", "{home}/wheels"]).await;
    let wheels = srv.base.as_ref().unwrap().path().join("home/wheels");
    std::fs::create_dir(&wheels).unwrap();
    crate::python_envs::demo_wheel(&wheels, "1.0.0");
    steward::sandbox::chown_tree(
        &wheels,
        steward::sandbox::Identity {
            uid: NOBODY.uid,
            gid: NOBODY.gid,
        },
    )
    .unwrap();
    let isolation = srv.client.replicas().await.unwrap().isolation.unwrap();
    if !isolation.namespaces {
        skipped(
            test,
            &format!("this kernel gives an ordinary user no namespaces: {isolation:?}"),
        );
        return None;
    }
    assert_eq!(isolation.compiles, "namespaced", "{isolation:?}");
    assert_eq!(isolation.executors, "namespaced", "{isolation:?}");
    Some(srv)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_is_not_root_hides_its_secrets_from_compiles_and_handlers() {
    let test = "a_server_that_is_not_root_hides_its_secrets_from_compiles_and_handlers";
    let Some(srv) = unprivileged_server(test).await else {
        return;
    };
    let c = srv.client.clone();

    // environment B deploys first: its executors' handler code is on disk
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
    wait_deployed(&c, &env_b, vb, 90).await;
    let t = targets(&srv, &env_b);

    // A's commit: a Python plugin that looks around during the compile
    let repo = Repo::new();
    let m = repo.work.join("libs/probe");
    std::fs::create_dir_all(m.join("model")).unwrap();
    std::fs::create_dir_all(m.join("plugins")).unwrap();
    std::fs::write(m.join("module.yml"), "name: probe\nversion: 1.0.0\n").unwrap();
    std::fs::write(m.join("model/_init.cf"), "").unwrap();
    std::fs::write(
        m.join("plugins/__init__.py"),
        format!(
            r#"import os, sys
from inmanta.plugins import plugin

FILES = {files:?}
DIRS = {dirs:?}


@plugin
def look() -> "string":
    from inmanta_plugins.demo import GREETING
    out = [
        GREETING,
        f"ui" f"d={{os.getuid()}}",
        "own=" + os.path.dirname(os.getcwd()),
        "own=" + sys.prefix,
    ]
    for f in FILES:
        try:
            with open(f, "rb") as fh:
                out.append("RE" f"AD {{f}}: " + fh.read(4096).decode(errors="replace"))
        except OSError as e:
            out.append(f"refused {{f}}: {{e}}")
    for d in DIRS:
        try:
            out.append("LIS" f"TED {{d}}: " + " ".join(os.listdir(d)))
        except OSError as e:
            out.append(f"refused {{d}}: {{e}}")
    out.append("pro" f"cs=" + str(sum(1 for p in os.listdir("/proc") if p.isdigit())))
    return "\n".join(out)
"#,
            files = t.files,
            dirs = t.dirs,
        ),
    )
    .unwrap();
    // with requirements: pip runs in the jail too, and its environment is the compile's
    std::fs::write(
        repo.work.join("requirements.txt"),
        "inmanta-module-demo==1.0.0\n",
    )
    .unwrap();
    let commit = repo.commit(
        "import demo\nimport probe\nstd::print(probe::look())\n",
        "probe",
    );
    repo.push_ok();
    // the server's user must be able to fetch the repository, as an operator's would
    open_to(&repo, NOBODY);
    let env_a = follow(&c, "attacker", &repo, json!({})).await;
    let report = compiled(&c, &env_a, &commit, 120).await;
    let text = report.to_string().replace("\\n", "\n");
    assert_eq!(
        report["status"], "success",
        "the probe did not compile: {text}"
    );
    assert!(text.contains("uid=65534"), "the plugin did not run: {text}");
    assert!(
        text.contains("hello from demo"),
        "the installed module was not found: {text}"
    );
    // its workdir and its Python environment
    let own: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split("own=").nth(1))
        .map(|o| PathBuf::from(o.split(['"', ' ']).next().unwrap_or_default()))
        .collect();
    assert_eq!(own.len(), 2, "the plugin did not say where it runs: {text}");
    assert!(
        own[0].starts_with(srv.data.path().join("compiles"))
            && own[1].starts_with(srv.data.path().join("python-envs")),
        "the compile ran in {own:?}"
    );
    assert_nothing_reached("a compile's plugin", &text, &own, &t);

    // a handler of A's: a command on a local agent, uploaded with a compiler token of an
    // environment that takes uploads
    let env_a = c
        .create_environment("attacker", "handlers", None)
        .await
        .unwrap()
        .id
        .to_string();
    let compiler = srv.scoped("compiler", &env_a).await;
    let script = format!(
        "echo ui\"\"d=$(id -u); \
         for f in {files}; do if head -c 4096 $f >/dev/null 2>&1; then echo \"RE\"\"AD $f: $(head -c 4096 $f | tr \"\\0\" \" \")\"; else echo \"refused $f\"; fi; done; \
         for d in {dirs}; do if ls -a $d >/dev/null 2>&1; then echo \"LIS\"\"TED $d: $(ls -a $d | tr \"\\n\" \" \")\"; else echo \"refused $d\"; fi; done; \
         echo pro\"\"cs=$(ls /proc | grep -c \"^[0-9]\")",
        files = t.files.join(" "),
        dirs = t.dirs.join(" "),
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
    wait_deployed(&compiler, &env_a, v, 90).await;
    let acts = compiler.actions(&env_a, Some(&rid), 10).await.unwrap();
    let out = serde_json::to_string(&acts).unwrap().replace("\\n", "\n");
    assert!(out.contains("uid=65534"), "the command did not run: {out}");
    let own = [srv.data.path().join("code").join(format!("env-{env_a}"))];
    assert_nothing_reached("a handler", &out, &own, &t);
}

/// Give the repository's origin to `account` and let it reach it (git refuses to serve a
/// repository another user owns).
pub(crate) fn open_to(repo: &Repo, account: Account) {
    let origin = PathBuf::from(repo.url().trim_start_matches("file://"));
    let mut dir = origin.parent().unwrap().to_path_buf();
    loop {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o005)).unwrap();
        match dir.parent() {
            Some(p) if p != Path::new("/") => dir = p.to_path_buf(),
            _ => break,
        }
    }
    steward::sandbox::chown_tree(
        &origin,
        steward::sandbox::Identity {
            uid: account.uid,
            gid: account.gid,
        },
    )
    .unwrap();
}

/// The workdir of the compile running in `data` whose plugin left `started` in it.
fn running_compile(data: &Path) -> Option<PathBuf> {
    std::fs::read_dir(data.join("compiles"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("started").is_file())
}

/// Hole 3 of issue 26 on a server that is not root: every compile runs as its uid, so only
/// the namespaces keep environment A's compile away from B's while both run.
#[tokio::test(flavor = "multi_thread")]
async fn one_environments_compile_can_not_touch_anothers_on_a_server_that_is_not_root() {
    let test = "one_environments_compile_can_not_touch_anothers_on_a_server_that_is_not_root";
    let Some(srv) = unprivileged_server(test).await else {
        return;
    };
    let c = srv.client.clone();
    let tag = format!("301.{}", std::process::id());

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
        f.write("b")
    for _ in range(1200):
        if os.path.exists(os.path.join(workdir, "release")):
            break
        time.sleep(0.1)
    return "b-done"
"#,
    );
    let b_commit = repo_b.commit("import slow\nstd::print(slow::slow())\n", "b");
    repo_b.push_ok();
    open_to(&repo_b, NOBODY);
    let env_b = follow(&c, "b", &repo_b, json!({})).await;
    let data = srv.data.path().to_path_buf();
    let b_workdir = crate::support::eventually(90, "B's compile to reach its plugin", || async {
        running_compile(&data)
    })
    .await;
    let b_main = b_workdir.join("project/main.cf");
    let b_main_before = std::fs::read_to_string(&b_main).unwrap();

    // A goes for B's workdir, and leaves a child in a session of its own
    let repo_a = Repo::new();
    plugin_module(
        &repo_a,
        "probe",
        &format!(
            r#"import os, subprocess
from inmanta.plugins import plugin

B = {b:?}


def attempt(what, f):
    try:
        return f"{{what}}: RE" f"AD {{f()!r}}"[:300]
    except OSError as e:
        return f"{{what}}: refused {{type(e).__name__}}"


def append(path):
    with open(path, "a") as f:
        f.write('\nstd::print("A-WAS-HERE")\n')
    return "appended"


@plugin
def probe() -> "string":
    lines = [attempt(f"list {{B}}", lambda: os.listdir(B))]
    lines.append(attempt("read main.cf", lambda: open(B + "/project/main.cf").read()))
    lines.append(attempt("append main.cf", lambda: append(B + "/project/main.cf")))
    lines.append(attempt("write release", lambda: open(B + "/release", "w").write("x")))
    subprocess.Popen(["setsid", "sleep", "{tag}"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines.append("pro" "cs=" + str(sum(1 for p in os.listdir("/proc") if p.isdigit())))
    return "\n".join(lines)
"#,
            b = b_workdir.display().to_string(),
        ),
    );
    let a_commit = repo_a.commit("import probe\nstd::print(probe::probe())\n", "a");
    repo_a.push_ok();
    open_to(&repo_a, NOBODY);
    let env_a = follow(&c, "a", &repo_a, json!({})).await;
    let ra = compiled(&c, &env_a, &a_commit, 120).await;
    let b_was_running = b_workdir.join("started").is_file() && !b_workdir.join("release").exists();
    std::fs::write(b_workdir.join("release"), "go").unwrap();
    assert_eq!(ra["status"], "success", "{ra:#}");
    let out = ra["stdout"].as_str().unwrap_or_default().to_string();
    let hits: Vec<&str> = out.lines().filter(|l| l.contains(": READ ")).collect();
    assert!(hits.is_empty(), "A's compile reached B: {hits:#?}");
    assert!(
        b_was_running,
        "B's compile ended before A's: nothing was attacked"
    );
    for what in ["list", "read main.cf", "append main.cf", "write release"] {
        assert!(out.contains(what), "{what} not tried: {out}");
    }
    assert_eq!(
        std::fs::read_to_string(&b_main).unwrap(),
        b_main_before,
        "B's main.cf was changed"
    );
    // B finishes with its own model, and nothing A started is left
    let rb = compiled(&c, &env_b, &b_commit, 120).await;
    assert_eq!(rb["status"], "success", "{rb:#}");
    assert!(!rb.to_string().contains("A-WAS-HERE"), "{rb:#}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&tag))
        .collect();
    assert!(left.is_empty(), "A's child outlived its compile: {left:?}");
}
