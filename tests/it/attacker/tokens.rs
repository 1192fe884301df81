//! Scoped tokens, agent tokens and the replica secret against what they were not given.

use std::time::Duration;

use serde_json::{Value, json};
use steward::client::encode_segment;

use crate::deploy::{deploy_actions, deploying_env, upload};
use crate::support::{eventually, fs_file};

/// A raw call with `token`: its status and JSON body (every refusal is JSON).
async fn call(
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{status}: a body that is not JSON: {text}"));
    (status, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_token_reads_and_reports_only_its_own_agents_work() {
    let (srv, c, env, dir) = deploying_env(
        "tokens",
        json!({"agent_map": {"web1": "external", "db1": "external"}}),
    )
    .await;
    let d = dir.path().display().to_string();
    let web = fs_file("web1", &format!("{d}/web"), "web content", &[]);
    let db = fs_file("db1", &format!("{d}/db"), "db secret attributes", &[]);
    let db_id = db.id.0.clone();
    let v = upload(&c, &env, vec![web, db]).await;
    let token = c
        .create_agent_token("web1-only", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let base = format!("{}/api/v1/environments/{env}", srv.url);

    // read db1's resource: the list, the resource itself, its action log, the version
    for url in [
        format!("{base}/resources"),
        format!("{base}/resources?agent=db1"),
        format!("{base}/resources/{}", encode_segment(&db_id)),
        format!("{base}/actions?resource_id={}", encode_segment(&db_id)),
        format!("{base}/versions/{v}/resources"),
        format!("{base}/versions/{v}/export"),
    ] {
        let (status, body) = call(reqwest::Method::GET, &url, &token, None).await;
        assert_eq!(status, 403, "{url}: {body}");
        assert_eq!(body["error"], "forbidden", "{url}: {body}");
        assert!(
            !body.to_string().contains("db secret"),
            "{url} leaked db1's attributes: {body}"
        );
    }

    // report "deployed" for db1's resource through the older action endpoint
    let forged = json!({
        "id": uuid::Uuid::new_v4(),
        "environment_id": uuid::Uuid::nil(),
        "version": v,
        "resource_id": db_id,
        "action": "deploy",
        "started_at": chrono::Utc::now(),
        "finished_at": chrono::Utc::now(),
        "status": "deployed",
        "change": "created",
        "changes": {},
        "messages": [{"level": "info", "message": "forged by web1", "fields": {}, "at": chrono::Utc::now()}],
    });
    let (status, body) = call(
        reqwest::Method::POST,
        &format!("{base}/actions"),
        &token,
        Some(&forged),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "forbidden", "{body}");
    let log = deploy_actions(&c, &env, &db_id).await;
    assert!(
        !serde_json::to_string(&log).unwrap().contains("forged"),
        "web1's token wrote db1's action log: {log:?}"
    );

    // its own agent still works: a real `steward agent run` with this token deploys web1
    let mut agent = crate::agents::spawn_agent(&srv, &token, &env, &["web1"], dir.path(), "web1");
    eventually(30, "web1's file, deployed by its agent", || async {
        (std::fs::read_to_string(format!("{d}/web")).ok()? == "web content").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!dir.path().join("db").exists(), "db1's file was deployed");
    let _ = agent.kill();
    let _ = agent.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_and_their_urls_are_for_global_admins_only() {
    let srv = crate::support::TestServer::start(false).await;
    let c = srv.admin_client();
    let env = c
        .create_environment("p", "replicas", None)
        .await
        .unwrap()
        .id
        .to_string();
    let agent = c
        .create_agent_token("a", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let viewer = c.create_token("v", "viewer", Some(&env)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let scoped_admin = c.create_token("ea", "admin", Some(&env)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{}/api/v1/replicas", srv.url);
    for (who, token) in [
        ("an agent token", &agent),
        ("a scoped viewer", &viewer),
        ("a scoped admin", &scoped_admin),
    ] {
        let (status, body) = call(reqwest::Method::GET, &url, token, None).await;
        assert_eq!(status, 403, "{who}: {body}");
        assert_eq!(body["error"], "forbidden", "{who}: {body}");
    }
    let (status, body) = call(
        reqwest::Method::GET,
        &url,
        srv.admin.as_deref().unwrap(),
        None,
    )
    .await;
    assert_eq!(status, 200, "the global admin: {body}");
}

/// The replicas' secret as an attacker who read the database has it.
async fn replica_secret_from_the_database(db: &str) -> String {
    let pool = steward::store::connect(db, 1).await.unwrap();
    sqlx::query_scalar("SELECT secret FROM replica_secrets WHERE retire_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap()
}

/// The processes hosting `agent` in `env`, as the API shows them.
async fn processes(c: &steward::client::Client, env: &str, agent: &str) -> Vec<Value> {
    let a = c.agents(env).await.unwrap();
    a["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == agent)
        .and_then(|x| x["processes"].as_array().cloned())
        .unwrap_or_default()
}

async fn owner_call(url: &str, env: &str, secret: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!(
            "{url}/api/v1/internal/environments/{env}/owner-call"
        ))
        .header("x-steward-replica-secret", secret)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_replica_secret_alone_neither_hosts_an_agent_nor_controls_an_environment() {
    use crate::replicas_support::ReplicaSet;
    let set = ReplicaSet::start(2, 3.0, 0.5).await;
    let c = set.any_client();
    let env = c
        .create_environment(
            "p",
            "secret",
            Some(json!({"agent_map": {"web1": "external"}})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    upload(
        &c,
        &env,
        vec![fs_file("web1", &format!("{d}/web"), "x", &[])],
    )
    .await;
    let (owner, _) = set.owner_of(&env, None, 20).await;
    let owner_i = set.index_of(&owner).await.unwrap();
    let secret = replica_secret_from_the_database(&set.db).await;
    let hello = json!({"instance": uuid::Uuid::new_v4(), "agents": ["web1"], "host": "evil"});

    // the call as replicas sent it before: the token is whatever the sender says (null)
    let (status, body) = owner_call(
        set.url(owner_i),
        &env,
        &secret,
        &json!({"call": "agent_open", "token": null, "allowed": null, "hello": hello}),
    )
    .await;
    assert!(
        status == 400 || status == 401,
        "a call without the caller's credential was answered {status}: {body}"
    );
    // the same with an explicit null caller, and a halt
    for call in [
        json!({"call": "agent_open", "hello": hello}),
        json!({"call": "halt", "halted": true}),
    ] {
        let (status, body) = owner_call(
            set.url(owner_i),
            &env,
            &secret,
            &json!({"caller": null, "call": call}),
        )
        .await;
        assert_eq!(status, 401, "{call}: {body}");
    }
    // with a credential that does not allow it: a viewer's token, a made-up one
    let viewer = c.create_token("v", "viewer", Some(&env)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    for (cred, want) in [(viewer.as_str(), 403), ("stw_made_up", 401)] {
        let (status, body) = owner_call(
            set.url(owner_i),
            &env,
            &secret,
            &json!({"caller": {"kind": "bearer", "secret": cred},
                    "call": {"call": "agent_open", "hello": hello}}),
        )
        .await;
        assert_eq!(status, want, "{body}");
    }
    assert!(
        processes(&c, &env, "web1").await.is_empty(),
        "the secret holder became a process of web1"
    );
    assert_eq!(c.environment(&env).await.unwrap()["halted"], false);

    // an agent token, through the replica that does not own the environment, still gets in:
    // its credential travels with the call and the owner accepts it
    let token = c
        .create_agent_token("web1", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let away = steward::client::Client::new(set.url(1 - owner_i), Some(token));
    let hello: steward::scheduler::agents::Hello = serde_json::from_value(hello).unwrap();
    away.agent_open(&env, &hello).await.unwrap();
    assert_eq!(processes(&c, &env, "web1").await.len(), 1);
    away.agent_close(&env, hello.instance).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_replica_secret_works_during_its_grace_and_is_refused_after() {
    use crate::replicas_support::{ADMIN, ReplicaSet};
    let set = ReplicaSet::start(2, 3.0, 0.5).await;
    let c = set.any_client();
    let env = c
        .create_environment("p", "rotate", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&env, &crate::support::null_export(1, None), json!({}))
        .await
        .unwrap();
    let (owner, _) = set.owner_of(&env, None, 20).await;
    let owner_i = set.index_of(&owner).await.unwrap();
    // a forwarded call (a deploy trigger through the replica that does not own it)
    let away = set.client(1 - owner_i);
    let old = replica_secret_from_the_database(&set.db).await;
    // a call the owner answers for a replica (with the admin's own credential inside)
    let sessions =
        json!({"caller": {"kind": "bearer", "secret": ADMIN}, "call": {"call": "sessions"}});
    let (status, body) = owner_call(set.url(owner_i), &env, &old, &sessions).await;
    assert_eq!(status, 200, "{body}");

    let out = std::process::Command::new(crate::support::steward_bin())
        .args([
            "server",
            "rotate-replica-secret",
            "--grace",
            "3",
            "--database-url",
        ])
        .arg(&set.db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rotated = std::time::Instant::now();
    let new = replica_secret_from_the_database(&set.db).await;
    assert_ne!(old, new);
    // during the grace period both are accepted, and the replicas forward with the new one
    let (status, body) = owner_call(set.url(owner_i), &env, &old, &sessions).await;
    assert_eq!(status, 200, "the old secret within its grace: {body}");
    let (status, body) = owner_call(set.url(owner_i), &env, &new, &sessions).await;
    assert_eq!(status, 200, "the new secret: {body}");
    away.trigger(&env, false, None, None).await.unwrap();
    // after it, the old one is refused and the new one still works
    tokio::time::sleep(
        Duration::from_secs(3).saturating_sub(rotated.elapsed()) + Duration::from_millis(500),
    )
    .await;
    let (status, body) = owner_call(set.url(owner_i), &env, &old, &sessions).await;
    assert_eq!(status, 401, "the old secret after its grace: {body}");
    let (status, body) = owner_call(set.url(owner_i), &env, &new, &sessions).await;
    assert_eq!(status, 200, "the new secret: {body}");
    away.trigger(&env, false, None, None).await.unwrap();
}

/// An address of this machine that is not a loopback one (the one its default route uses).
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_replica_secret_is_not_sent_over_plain_http_to_a_remote_address() {
    use crate::replicas_support::ADMIN;
    use crate::support::{free_port, new_database, spawn_server_with, wait_healthy};
    let Some(ip) = non_loopback_address() else {
        crate::attacker::skipped(
            "the_replica_secret_is_not_sent_over_plain_http_to_a_remote_address",
            "this machine has no address other than loopback to advertise",
        );
        return;
    };
    // where a replica (or someone who wrote its row) says it is: plain http, off this host's
    // loopback; a listener there records whatever arrives
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let fake_url = format!("http://{}", listener.local_addr().unwrap());
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0u8; 16 << 10];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = heard_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    let db = new_database();
    let strict_dir = tempfile::tempdir().unwrap();
    let lax_dir = tempfile::tempdir().unwrap();
    let (strict_port, lax_port) = (free_port(), free_port());
    let timing: [&std::ffi::OsStr; 4] = [
        "--heartbeat".as_ref(),
        "0.5".as_ref(),
        "--lease-time".as_ref(),
        "2".as_ref(),
    ];
    let mut strict = spawn_server_with(&db, strict_port, ADMIN, strict_dir.path(), &timing);
    let mut lax_args = timing.to_vec();
    lax_args.push("--allow-plain-http-replica-links".as_ref());
    let mut lax = spawn_server_with(&db, lax_port, ADMIN, lax_dir.path(), &lax_args);
    let strict_url = format!("http://127.0.0.1:{strict_port}");
    let lax_url = format!("http://127.0.0.1:{lax_port}");
    wait_healthy(&strict_url).await;
    wait_healthy(&lax_url).await;
    let c = steward::client::Client::new(&strict_url, Some(ADMIN.into()));
    let env = c
        .create_environment("p", "plain", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&env, &crate::support::null_export(1, None), json!({}))
        .await
        .unwrap();
    // the environment's owner is now the replica at the plain-http address
    let pool = steward::store::connect(&db, 1).await.unwrap();
    sqlx::query("INSERT INTO replicas (id, advertise_url) VALUES ('far', $1)")
        .bind(&fake_url)
        .execute(&pool)
        .await
        .unwrap();
    eventually(20, "the environment to be owned", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM leases WHERE kind = 'environment' AND key = $1",
        )
        .bind(&env)
        .fetch_one(&pool)
        .await
        .unwrap();
        (n == 1).then_some(())
    })
    .await;
    sqlx::query(
        "UPDATE leases SET holder = 'far', term = term + 1, expires_at = now() + interval '1 hour' \
         WHERE kind = 'environment' AND key = $1",
    )
    .bind(&env)
    .execute(&pool)
    .await
    .unwrap();
    // the replica that held it notices at its next heartbeat
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = std::time::Instant::now();
    let err = c.trigger(&env, false, None, None).await.unwrap_err();
    assert_eq!(err.status(), Some(503), "{err}");
    assert!(
        err.to_string().contains("--allow-plain-http-replica-links"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the refusal waited"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        heard.try_recv().is_err(),
        "the replica sent something to the plain-http address"
    );

    // the same call through the replica started with the flag does reach it, secret and all
    // (so the check above looked at the right place)
    let lax_client = steward::client::Client::new(&lax_url, Some(ADMIN.into()));
    let env2 = env.clone();
    let call = tokio::spawn(async move { lax_client.trigger(&env2, false, None, None).await });
    let request = tokio::time::timeout(Duration::from_secs(10), heard.recv())
        .await
        .expect("the flagged replica sent nothing")
        .unwrap();
    assert!(
        request.to_lowercase().contains("x-steward-replica-secret"),
        "{request}"
    );
    call.abort();
    let _ = strict.kill();
    let _ = lax.kill();
    let _ = strict.wait();
    let _ = lax.wait();
}

/// A local user watching command lines (`ps`, /proc/<pid>/cmdline) while the git host runs
/// `hooks/post-receive`: every program the hook starts is a spy that writes down its
/// command line, and none may hold the webhook secret.
#[tokio::test(flavor = "multi_thread")]
async fn the_post_receive_hook_keeps_its_secret_off_command_lines() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let secret = "hook-secret-that-ps-must-not-show-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("r.git");
    crate::support::run_ok(
        std::process::Command::new("git")
            .args(["init", "-q", "--bare"])
            .arg(&repo),
    );
    // the server, as far as the hook sees it
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/api/v1/environments/x/source/webhook",
        listener.local_addr().unwrap()
    );
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    s.write_all(
                        b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await
                    .unwrap();
                    return (head.to_string(), body.to_string());
                }
            }
            if n == 0 {
                panic!("the hook hung up: {text}");
            }
        }
    });
    for (k, v) in [("steward.url", url.as_str()), ("steward.secret", secret)] {
        crate::support::run_ok(
            std::process::Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["config", k, v]),
        );
    }
    // spies for every program the hook might start, in front of the real ones
    let spies = dir.path().join("spies");
    std::fs::create_dir(&spies).unwrap();
    let log = dir.path().join("argv.log");
    for name in [
        "git", "perl", "curl", "openssl", "sed", "date", "python3", "od", "tr", "cat", "env",
        "printf", "xxd",
    ] {
        let spy = spies.join(name);
        std::fs::write(
            &spy,
            format!("#!/bin/sh\nprintf '%s\\n' \"{name} $*\" >> \"$SPY_LOG\"\nPATH=\"$REAL_PATH\" exec {name} \"$@\"\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let real_path = std::env::var("PATH").unwrap();
    let hook = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/post-receive");
    let old = "1".repeat(40);
    let new = "2".repeat(40);
    let out = tokio::task::spawn_blocking({
        let (repo, spies, log) = (repo.clone(), spies.clone(), log.clone());
        let line = format!("{old} {new} refs/heads/main\n");
        move || {
            use std::io::Write;
            let mut child = std::process::Command::new("sh")
                .arg(hook)
                .current_dir(&repo)
                .env("GIT_DIR", &repo)
                .env("PATH", format!("{}:{real_path}", spies.display()))
                .env("REAL_PATH", &real_path)
                .env("SPY_LOG", &log)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(line.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let (head, body) = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the hook sent nothing")
        .unwrap();
    let argv = std::fs::read_to_string(&log).unwrap();
    for seen in ["git ", "curl "] {
        assert!(
            argv.lines().any(|l| l.starts_with(seen)),
            "the spies missed {seen}: {argv}"
        );
    }
    assert!(
        !argv.contains(secret),
        "the secret was on a command line:\n{argv}"
    );
    // and the notice is signed with it all the same
    let want = format!(
        "sha256={}",
        steward::sources::webhook::sign(secret, body.as_bytes())
    );
    assert!(
        head.lines()
            .any(|l| l.to_ascii_lowercase() == format!("x-steward-signature: {want}")),
        "{head}\n{body}"
    );
    assert!(!stderr.contains("could not notify"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_environment_admin_cannot_follow_a_repository_on_the_servers_disk() {
    use crate::support::{free_port, new_database, steward_bin, wait_healthy};
    const ADMIN: &str = "stw_admin_local_sources_0123456789";
    let db = new_database();
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    // a server as an operator starts it: without --allow-local-git-sources
    let spawn = || {
        std::process::Command::new(steward_bin())
            .args([
                "server",
                "--bind",
                &format!("127.0.0.1:{port}"),
                "--database-url",
                &db,
            ])
            .arg("--data-dir")
            .arg(data.path())
            .env("STEWARD_ADMIN_TOKEN", ADMIN)
            .env_remove("STEWARD_ALLOW_LOCAL_GIT_SOURCES")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut child = spawn();
    wait_healthy(&url).await;
    let c = steward::client::Client::new(&url, Some(ADMIN.into()));
    let env = c
        .create_environment("p", "local", None)
        .await
        .unwrap()
        .id
        .to_string();
    let scoped = c
        .create_token("env-admin", "admin", Some(&env))
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let scoped = steward::client::Client::new(&url, Some(scoped));
    let mirrors = data.path().join("git");
    for target in [
        format!("file://{}", mirrors.display()),
        "file:///etc".to_string(),
        "/srv/git/other-team.git".to_string(),
        "/".to_string(),
    ] {
        for (who, client) in [("an environment admin", &scoped), ("a global admin", &c)] {
            let err = client
                .set_source(&env, &json!({"url": target, "poll_interval": 0}))
                .await
                .unwrap_err();
            assert_eq!(err.status(), Some(400), "{who}, {target}: {err}");
            assert!(
                err.to_string().contains("--allow-local-git-sources"),
                "{who}, {target}: {err}"
            );
        }
    }
    assert_eq!(c.source(&env).await.unwrap_err().status(), Some(404));
    // a remote repository is still fine
    scoped
        .set_source(
            &env,
            &json!({"url": "https://example.invalid/r.git", "poll_interval": 0}),
        )
        .await
        .unwrap();
    // a local source stored before this rule (written here straight into the database, the
    // server restarted) is not fetched either: a compile asked for fails, nothing is copied
    let _ = child.kill();
    let _ = child.wait();
    let listing = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&mirrors)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let before = listing();
    let repo = crate::gitops_support::Repo::new();
    repo.commit(&repo.model(&[("f", "1")], ""), "one");
    repo.push_ok();
    let pool = steward::store::connect(&db, 1).await.unwrap();
    sqlx::query("UPDATE git_sources SET url = $1 WHERE environment_id = $2::uuid")
        .bind(repo.url())
        .bind(&env)
        .execute(&pool)
        .await
        .unwrap();
    let mut child = spawn();
    wait_healthy(&url).await;
    // the restarted server takes up its environments' sources a moment after it answers
    // health checks: until then a trigger finds no source at all
    let mut err = c.trigger_compile(&env, None).await.unwrap_err();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while err.to_string().contains("follows no git repository")
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        err = c.trigger_compile(&env, None).await.unwrap_err();
    }
    assert!(
        err.to_string().contains("--allow-local-git-sources"),
        "{err}"
    );
    assert_eq!(listing(), before, "a local repository was mirrored");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_environments_following_one_url_do_not_share_a_mirror() {
    use crate::gitops_support::{Repo, compiled, follow};
    let srv = crate::support::TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = repo.commit(&repo.model(&[("f", "1")], ""), "one");
    repo.push_ok();
    let mut envs = Vec::new();
    for name in ["mirror-a", "mirror-b"] {
        let env = follow(&c, name, &repo, json!({})).await;
        c.trigger_compile(&env, None).await.unwrap();
        compiled(&c, &env, &commit, 60).await;
        envs.push(env);
    }
    let mirrors: Vec<_> = std::fs::read_dir(srv.data_dir().join("git"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".git"))
        .collect();
    assert_eq!(
        mirrors.len(),
        2,
        "one mirror per environment: {:?}",
        mirrors.iter().map(|e| e.path()).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_token_fetches_only_its_own_agents_handler_code() {
    // examples/integration ships a module handler for resources of agent "localhost"
    let (srv, c, env, _dir) = deploying_env("code", json!({"auto_release": false})).await;
    let x = crate::integration::example().export();
    let digest = x
        .handlers
        .values()
        .next()
        .expect("handler code")
        .digest
        .clone();
    c.upload(&env, &x, json!({})).await.unwrap();
    let url = format!("{}/api/v1/environments/{env}/code/{digest}", srv.url);
    let token = |agents: &[&str]| {
        let c = &c;
        let env = &env;
        let names: Vec<String> = agents.iter().map(|s| s.to_string()).collect();
        async move {
            c.create_agent_token("a", env, &names).await.unwrap()["secret"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let web1 = token(&["web1"]).await;
    let (status, body) = call(reqwest::Method::GET, &url, &web1, None).await;
    assert_eq!(
        status, 403,
        "web1's token got localhost's handler code: {body}"
    );
    assert_eq!(body["error"], "forbidden", "{body}");
    let own = token(&["localhost"]).await;
    let (status, body) = call(reqwest::Method::GET, &url, &own, None).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body["contents"].as_object().unwrap().is_empty(), "{body}");
}
