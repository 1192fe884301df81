//! Security boundaries (issue 12), each tried as an attack: a scoped token reading the
//! server's secrets through a handler and a compile, a NUL byte in handler output, a
//! cross-environment action write, a command outliving its timeout.

use std::time::Duration;

use serde_json::json;
use steward::client::Client;

use crate::deploy::{deploy_actions, deploying_env, state_of, upload};
use crate::gitops_support::{Repo, compiled, follow};
use crate::support::{exec_run, free_port, new_database, wait_deployed, wait_healthy};

const AGENT: &str = "localhost";

#[tokio::test(flavor = "multi_thread")]
async fn a_scoped_token_cannot_read_server_secrets_through_handlers_or_compiles() {
    let db = new_database();
    // not under /tmp: compiles get a /tmp of their own
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let admin = "stw_admin_secret_that_must_not_leak_0123456789";
    // the secrets come in through the environment, as an operator would give them
    let mut child = std::process::Command::new(crate::support::steward_bin())
        .args(["server", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--allow-local-git-sources")
        .arg("--data-dir")
        .arg(data.path())
        .env("STEWARD_ADMIN_TOKEN", admin)
        .env("STEWARD_DATABASE_URL", &db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_healthy(&url).await;
    let c = Client::new(&url, Some(admin.into()));
    let env = c
        .create_environment("sec", "handler", None)
        .await
        .unwrap()
        .id
        .to_string();
    let t = c.create_token("ci", "compiler", Some(&env)).await.unwrap();
    let compiler = Client::new(&url, Some(t["secret"].as_str().unwrap().into()));
    // a compiler token uploads a command that prints its environment
    let run = exec_run(AGENT, "env", json!({}), &[]);
    let rid = run.id.0.clone();
    let v = compiler
        .upload(&env, &crate::support::export_of(vec![run]), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&compiler, &env, v, 30).await;
    let acts = compiler.actions(&env, Some(&rid), 10).await.unwrap();
    let log = serde_json::to_string(&acts).unwrap();
    assert!(log.contains("PATH="), "the command ran: {log}");
    for secret in [
        admin,
        "STEWARD_ADMIN_TOKEN",
        "STEWARD_DATABASE_URL",
        db.as_str(),
    ] {
        assert!(!log.contains(secret), "{secret} reached a handler: {log}");
    }

    // the server's /proc files (it re-executed itself: the same pid) and its data dir. Not
    // root: the handler runs as the server's user, and the server being non-dumpable is what
    // keeps its environ from it; root: another uid in a PID namespace
    let pid = child.id();
    let d = data.path().display();
    let probe = format!(
        "sh -c 'for f in /proc/{pid}/environ /proc/{pid}/cmdline /proc/{pid}/mem; do \
         if head -c 4096 $f >/dev/null 2>&1; then echo \"RE\"\"AD $f: $(tr \"\\0\" \" \" < $f)\"; \
         else echo \"refused $f\"; fi; done; \
         if ls {d} >/dev/null 2>&1; then echo \"LIS\"\"TED data\"; else echo \"refused data\"; fi'"
    );
    let run = exec_run(AGENT, &probe, json!({}), &[]);
    let rid = run.id.0.clone();
    let v = compiler
        .upload(&env, &crate::support::export_of(vec![run]), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    wait_deployed(&compiler, &env, v, 30).await;
    let acts = compiler.actions(&env, Some(&rid), 10).await.unwrap();
    let seen = serde_json::to_string(&acts).unwrap();
    assert!(
        seen.contains(&format!("refused /proc/{pid}/environ")),
        "the handler read the server's environ: {seen}"
    );
    assert!(!seen.contains(&format!("AD /proc/{pid}/mem")), "{seen}");
    for secret in [
        admin,
        "STEWARD_ADMIN_TOKEN",
        "STEWARD_DATABASE_URL",
        db.as_str(),
    ] {
        assert!(!seen.contains(secret), "{secret} reached a handler: {seen}");
    }
    if crate::attacker::is_root() {
        assert!(
            seen.contains("refused data"),
            "the handler listed the data dir: {seen}"
        );
        assert!(
            seen.contains(&format!("refused /proc/{pid}/cmdline")),
            "the handler sees the server's process: {seen}"
        );
    } else {
        crate::attacker::skipped(
            "a_scoped_token_cannot_read_server_secrets_through_handlers_or_compiles (data dir)",
            "not root: handlers run as the server's user, who owns the data dir",
        );
    }

    // and through a compile of a commit
    let repo = Repo::new();
    let genv = follow(&c, "compile", &repo, json!({})).await;
    // a plugin reads the server's /proc files and lists its data dir
    let m = repo.work.join("libs/peek");
    std::fs::create_dir_all(m.join("model")).unwrap();
    std::fs::create_dir_all(m.join("plugins")).unwrap();
    std::fs::write(m.join("module.yml"), "name: peek\nversion: 1.0.0\n").unwrap();
    std::fs::write(m.join("model/_init.cf"), "").unwrap();
    std::fs::write(
        m.join("plugins/__init__.py"),
        format!(
            r#"import os
from inmanta.plugins import plugin


def attempt(what, f):
    try:
        return f"{{what}}: READ {{f()!r}}"
    except OSError as e:
        return f"{{what}}: refused {{type(e).__name__}}"


@plugin
def peek() -> "string":
    return "\n".join([
        attempt("server environ", lambda: open("/proc/{pid}/environ").read()),
        attempt("server cmdline", lambda: open("/proc/{pid}/cmdline").read()),
        attempt("data dir", lambda: os.listdir({d:?})),
    ])
"#,
            d = d.to_string()
        ),
    )
    .unwrap();
    let model = repo.model(
        &[("f", "1")],
        "import peek\nstd::print(peek::peek())\nstd::print(std::get_env(\"STEWARD_ADMIN_TOKEN\", \"none\"))\nstd::print(std::get_env(\"STEWARD_DATABASE_URL\", \"none\"))\n",
    );
    let commit = repo.commit(&model, "peek");
    repo.push_ok();
    c.trigger_compile(&genv, None).await.unwrap();
    let report = compiled(&c, &genv, &commit, 60).await;
    let text = report.to_string();
    assert!(
        !text.contains(admin),
        "the admin token reached a compile: {text}"
    );
    assert!(
        !text.contains(&db),
        "the database URL reached a compile: {text}"
    );
    let out = report["stdout"].as_str().unwrap_or_default();
    assert!(
        out.contains("server environ: refused"),
        "a compile read the server's environ: {report:#}"
    );
    if crate::attacker::is_root() {
        assert!(out.contains("data dir: refused"), "{report:#}");
        assert!(out.contains("server cmdline: refused"), "{report:#}");
    } else {
        crate::attacker::skipped(
            "a_scoped_token_cannot_read_server_secrets_through_handlers_or_compiles (compile: data dir)",
            "not root: compiles run as the server's user, who owns the data dir",
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nul_byte_in_handler_output_does_not_cost_the_state() {
    let (srv, c, env, _dir) = deploying_env("nul", json!({})).await;
    let run = exec_run(AGENT, "printf 'before\\0after'", json!({}), &[]);
    let rid = run.id.0.clone();
    let v = upload(&c, &env, vec![run]).await;
    let p = wait_deployed(&c, &env, v, 30).await;
    assert_eq!(p["by_status"]["deployed"], 1, "{p}");
    let s = state_of(&c, &env, &rid).await;
    assert_eq!(s.status, "deployed");
    let acts = deploy_actions(&c, &env, &rid).await;
    let log = serde_json::to_string(&acts).unwrap();
    assert!(log.contains("before\u{FFFD}after"), "{log}");
    assert!(acts.iter().all(|a| a.finished_at.is_some()));
    let lost: i64 =
        sqlx::query_scalar("SELECT count(*) FROM resource_state WHERE deploying_since IS NOT NULL")
            .fetch_one(&srv.pool)
            .await
            .unwrap();
    assert_eq!(lost, 0, "a resource was left deploying");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_environment_cannot_rewrite_another_ones_action_log() {
    let (srv, c, env_a, dir) = deploying_env("victim", json!({})).await;
    let f = crate::support::fs_file(AGENT, &dir.path().join("a").display().to_string(), "a", &[]);
    let rid = f.id.0.clone();
    let v = upload(&c, &env_a, vec![f]).await;
    wait_deployed(&c, &env_a, v, 30).await;
    let victim = deploy_actions(&c, &env_a, &rid).await.remove(0);
    // environment B's admin reports a record with A's action id (agent tokens may not use
    // this route at all: attacker::tokens)
    let env_b = crate::deploy::env_with(&c, "attacker", json!({})).await;
    let vb = upload(&c, &env_b, vec![]).await;
    let t = c
        .create_token("admin-b", "admin", Some(&env_b))
        .await
        .unwrap();
    let agent_b = Client::new(&srv.url, Some(t["secret"].as_str().unwrap().into()));
    let mut forged = victim.clone();
    forged.version = vb;
    forged.status = "failed".into();
    forged.messages =
        json!([{"level": "error", "message": "forged", "fields": {}, "at": chrono::Utc::now()}]);
    let err = agent_b.report_action(&env_b, &forged).await.unwrap_err();
    assert!(err.to_string().contains("another"), "{err}");
    let after = deploy_actions(&c, &env_a, &rid).await.remove(0);
    assert_eq!(after.status, victim.status);
    assert!(
        !serde_json::to_string(&after.messages)
            .unwrap()
            .contains("forged")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_timeout_kills_what_it_started() {
    let (_srv, c, env, _dir) = deploying_env(
        "timeout",
        json!({"retry_backoff": {"initial": 600, "factor": 1, "max": 600}}),
    )
    .await;
    // the pipe keeps `sleep` holding the output: killing only `sh` would wait 30 s
    let run = exec_run(AGENT, "sh -c 'sleep 30 | cat'", json!({"timeout": 2}), &[]);
    let rid = run.id.0.clone();
    upload(&c, &env, vec![run]).await;
    let acts = crate::support::eventually(20, "the timed-out action", || async {
        let acts = deploy_actions(&c, &env, &rid).await;
        acts.iter().any(|a| a.finished_at.is_some()).then_some(acts)
    })
    .await;
    let a = &acts[0];
    let took = a.finished_at.unwrap() - a.started_at;
    assert!(
        took < chrono::Duration::seconds(8),
        "a 2 s timeout took {took}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_the_model_routes_elsewhere_are_never_applied_here() {
    let (_srv, c, env, dir) = deploying_env("remote", json!({})).await;
    let d = dir.path().display().to_string();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("project.yml"), "name: t\n").unwrap();
    std::fs::write(
        project.path().join("main.cf"),
        format!(
            "import fs\nimport mitogen\n\
             web1 = std::Host(name=\"web1\", os=std::linux, ip=\"10.0.0.5\", remote_agent=true)\n\
             fs::File(host=web1, path=\"{d}/agentconfig\", content=\"x\", mode=644)\n\
             ssh = mitogen::Ssh(name=\"web2\", hostname=\"web2.example\", username=\"deploy\")\n\
             web2 = std::Host(name=\"web2\", os=std::linux, via=ssh)\n\
             fs::File(host=web2, path=\"{d}/via\", content=\"x\", mode=644)\n\
             here = std::Host(name=\"localhost\", os=std::linux)\n\
             fs::File(host=here, path=\"{d}/local\", content=\"x\", mode=644)\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new(crate::support::steward_bin())
        .args(["export", "-j", "out.json"])
        .current_dir(project.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let export: steward::model::ExportFile =
        serde_json::from_str(&std::fs::read_to_string(project.path().join("out.json")).unwrap())
            .unwrap();
    let v = c.upload(&env, &export, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let p = wait_deployed(&c, &env, v, 30).await;
    assert_eq!(
        std::fs::read_to_string(format!("{d}/local")).unwrap(),
        "x",
        "the local file is deployed: {p}"
    );
    for name in ["agentconfig", "via"] {
        assert!(
            !std::path::Path::new(&format!("{d}/{name}")).exists(),
            "a file meant for another machine was written here: {name}"
        );
    }
    let (_, rows) = c.resources(&env).await.unwrap();
    let remote: Vec<_> = rows
        .iter()
        .filter(|r| r.resource_id.contains("web1") || r.resource_id.contains("web2"))
        .collect();
    assert_eq!(
        remote.len(),
        3,
        "two files and web1's AgentConfig: {rows:?}"
    );
    for r in remote {
        let msg = r.last_message.clone().unwrap_or_default();
        // refused, or skipped because the AgentConfig it requires was refused
        match r.status.as_str() {
            "unavailable" => assert!(msg.contains("remote execution is not available"), "{msg}"),
            "skipped_for_dependency" => assert!(msg.contains("AgentConfig"), "{msg}"),
            other => panic!("{} is {other}: {msg}", r.resource_id),
        }
    }
    // each remote resource says where it should have gone
    let routed: Vec<&str> = export
        .resources
        .iter()
        .filter_map(|r| r.attributes.get("remote_target").and_then(|v| v.as_str()))
        .collect();
    assert!(routed.contains(&"ssh://deploy@web2.example"), "{routed:?}");
    assert!(
        routed
            .iter()
            .any(|t| t.starts_with("ssh://root@10.0.0.5:22")),
        "{routed:?}"
    );
    assert!(
        export
            .resources
            .iter()
            .all(|r| !r.agent.eq("localhost") || !r.attributes.contains_key("remote_target")),
        "a local resource got a route"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_server_takes_its_executors_and_their_commands_with_it() {
    let mut srv = crate::support::Spawned::start("stw_test_admin_secret_for_executor_death").await;
    let c = srv.client.clone();
    let env = crate::deploy::env_with(&c, "death", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let cmd = format!(
        "sh -c 'echo start >> {0}; sleep 4; echo end >> {0}'",
        log.display()
    );
    let v = upload(&c, &env, vec![exec_run(AGENT, &cmd, json!({}), &[])]).await;
    let executor = crate::support::eventually(20, "the command to run", || async {
        let started = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("start");
        let a = c.agents(&env).await.ok()?;
        let pid = a["agents"][0]["executors"][0].as_u64()?;
        started.then_some(pid)
    })
    .await;
    srv.kill9();
    // the executor goes with it, and so does the command it was running
    crate::support::eventually(5, "the executor to die", || async {
        let alive = std::fs::read_to_string(format!("/proc/{executor}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false);
        (!alive).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("end"),
        "the old command finished after its server died: {text}"
    );
    // the restarted server runs it once, alone
    srv.restart().await;
    wait_deployed(&c, &env, v, 30).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, "start\nstart\nend\n", "{text}");
}

fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_are_read_only_for_callers_allowed_and_slow_clients_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = "stw_test_admin_secret_for_bodies";
    let srv = crate::support::Spawned::start(admin).await;
    let (c, url, port) = (srv.client.clone(), srv.url.clone(), srv.port);
    let env = crate::deploy::env_with(&c, "bodies", json!({})).await;
    let t = c.create_token("look", "viewer", Some(&env)).await.unwrap();
    let viewer = t["secret"].as_str().unwrap().to_string();
    let http = reqwest::Client::new();
    // a viewer posting a 60 MB "export", three times: refused before it is parsed
    let huge = format!("{{\"resources\": [\"{}\"]}}", "x".repeat(60 << 20));
    for _ in 0..3 {
        let r = http
            .post(format!("{url}/api/v1/environments/{env}/versions"))
            .bearer_auth(&viewer)
            .header("content-type", "application/json")
            .body(huge.clone())
            .send()
            .await;
        if let Ok(r) = r {
            assert_eq!(r.status(), 403);
        }
    }
    let peak = peak_rss_mib(srv.child.id());
    assert!(
        peak < 400,
        "the server peaked at {peak} MiB for refused bodies"
    );
    // routes that need a small body take a small body
    let r = http
        .post(format!("{url}/api/v1/environments/{env}/deploy"))
        .bearer_auth(admin)
        .header("content-type", "application/json")
        .body("x".repeat(2 << 20))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);

    // half-sent headers, and a body that stalls: both cut off
    let half_headers = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 1024];
        let _ = tokio::time::timeout(Duration::from_secs(40), s.read(&mut buf)).await;
        started.elapsed()
    };
    let stalled_body = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let head = format!(
            "POST /api/v1/environments/{env}/deploy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"agent\""
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(40), s.read(&mut buf)).await;
        started.elapsed()
    };
    let (h, b) = tokio::join!(half_headers, stalled_body);
    assert!(
        h < Duration::from_secs(15),
        "half-sent headers held for {h:?}"
    );
    assert!(b < Duration::from_secs(20), "a stalled body held for {b:?}");
    assert!(c.health().await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_in_a_source_url_are_kept_out_of_it() {
    let srv = crate::support::Spawned::start("stw_test_admin_secret_for_url_credentials").await;
    let (c, url) = (srv.client.clone(), srv.url.clone());
    let env = c
        .create_environment("sec", "creds", None)
        .await
        .unwrap()
        .id
        .to_string();
    // nothing listens there: the fetch fails, but the mirror is made
    let dead = free_port();
    let secret = "tok3n_that_must_not_leak";
    let set = c
        .set_source(
            &env,
            &json!({"url": format!("https://robot:{secret}@127.0.0.1:{dead}/o/r.git"), "branch": "main", "poll_interval": 0}),
        )
        .await
        .unwrap();
    assert_eq!(set["url"], format!("https://127.0.0.1:{dead}/o/r.git"));
    assert_eq!(
        set["has_token"], true,
        "the credential became the source's token"
    );
    let t = c.create_token("look", "viewer", Some(&env)).await.unwrap();
    let viewer = Client::new(&url, Some(t["secret"].as_str().unwrap().into()));
    let seen = viewer.source(&env).await.unwrap().to_string();
    assert!(!seen.contains(secret), "{seen}");
    let _ = c.trigger_compile(&env, None).await;
    // nothing the server wrote to disk holds it either (mirror config, logs)
    let found = std::process::Command::new("grep")
        .args(["-r", "-l", secret])
        .arg(srv.data.path())
        .output()
        .unwrap();
    let files = String::from_utf8_lossy(&found.stdout);
    // the database files hold it (as the token): only PostgreSQL's own files may
    for f in files.lines() {
        assert!(f.contains("/pg/"), "{f} holds the credential");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_webhook_under_a_new_delivery_id_triggers_nothing() {
    let srv = crate::support::TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let first = repo.commit(&repo.model(&[("w", "1")], ""), "one");
    repo.push_ok();
    let env = follow(&c, "replay", &repo, json!({"watch": false})).await;
    compiled(&c, &env, &first, 30).await;
    let url = crate::gitops_support::webhook_url(&srv.url, &env);
    let body = json!({"ref": "refs/heads/main", "after": first}).to_string();
    let sig = format!(
        "sha256={}",
        steward::sources::webhook::sign("s3cret", body.as_bytes())
    );
    let mut answers = Vec::new();
    for i in 0..10 {
        let r = reqwest::Client::new()
            .post(&url)
            .header("Content-Type", "application/json")
            .header("X-Hub-Signature-256", &sig)
            .header("X-GitHub-Event", "push")
            .header("X-GitHub-Delivery", format!("replay-{i}"))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        answers.push(v["status"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(answers[0], "accepted", "{answers:?}");
    assert!(
        answers[1..].iter().all(|a| a == "duplicate"),
        "a replay under a new delivery id was accepted: {answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_runs_guards_but_never_the_command() {
    // auto_release off: the version is only dry-run, never deployed
    let (_srv, c, env, dir) = deploying_env("dry", json!({"auto_release": false})).await;
    let d = dir.path().display().to_string();
    let run = exec_run(
        AGENT,
        &format!("touch {d}/command-ran"),
        json!({"unless": format!("sh -c 'touch {d}/guard-ran; exit 1'")}),
        &[],
    );
    let v = upload(&c, &env, vec![run]).await;
    let started = c.start_dryrun(&env, Some(v)).await.unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    let report = crate::support::eventually(30, "the dry-run to finish", || async {
        let r = c.dryrun(&env, &id).await.unwrap();
        (r["complete"] == true).then_some(r)
    })
    .await;
    assert_eq!(report["results"].as_array().unwrap().len(), 1, "{report}");
    assert!(
        !std::path::Path::new(&format!("{d}/command-ran")).exists(),
        "a dry-run ran the command"
    );
    // documented (SECURITY.md, README): the guard is how the handler reads state
    assert!(std::path::Path::new(&format!("{d}/guard-ran")).exists());
}
