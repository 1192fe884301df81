//! SSH targets: a model or an environment admin choosing targets and keys, a replaced
//! executor binary on a target. Against a real sshd on loopback (`ssh_support`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use steward::scheduler::ssh::{SshError, SshLink};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::ssh_support::Sshd;
use crate::support::steward_bin;

async fn link(sshd: &Sshd) -> SshLink {
    SshLink::connect(&sshd.target(), &sshd.options())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\nsshd log:\n{}", sshd.log()))
}

/// Start the executor `remote` over `l` as the scheduler does; its first line on stdout
/// (`{"Ready":…}` when it runs) and whether it is still running after that line.
async fn first_line(l: &SshLink, remote: &str) -> String {
    let mut cmd = l.executor_command(remote, "web");
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("an answer in time")
        .unwrap()
        .unwrap_or_default();
    let _ = child.kill().await;
    line
}

/// A shell script standing in for the executor: it leaves `marker` when it runs.
fn trojan(path: &Path, marker: &Path) {
    std::fs::remove_file(path).unwrap();
    std::fs::write(
        path,
        format!("#!/bin/sh\necho pwned > '{}'\nexit 0\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o500)).unwrap();
}

/// Code on the target (another environment's handler running as the same user, or whoever
/// could write there) swaps the shipped executor for its own program: the next executor
/// started there must not run it, and the next shipment replaces it.
#[tokio::test]
async fn ssh_a_replaced_executor_on_the_target_is_never_run() {
    let sshd = Sshd::start();
    let marker = sshd.dir.path().join("pwned");
    let l = link(&sshd).await;
    let shipped = l.ensure_executor(&steward_bin()).await.unwrap();
    assert!(shipped.bytes_uploaded > 0);
    let ready = first_line(&l, &shipped.remote_path).await;
    assert!(ready.contains("\"ready\""), "{ready}");

    trojan(Path::new(&shipped.remote_path), &marker);
    let line = first_line(&l, &shipped.remote_path).await;
    assert!(
        line.starts_with("steward-refused ") && line.contains("is not the executor shipped there"),
        "{line}"
    );
    assert!(!marker.exists(), "the replaced binary ran");

    // the next connection (a restarted server, another environment) checks the content,
    // not the name: it ships the executor again and runs that
    let l2 = link(&sshd).await;
    let again = l2.ensure_executor(&steward_bin()).await.unwrap();
    assert_eq!(again.remote_path, shipped.remote_path);
    assert!(again.bytes_uploaded > 0, "re-shipped, not trusted by name");
    assert!(
        first_line(&l2, &again.remote_path)
            .await
            .contains("\"ready\"")
    );
    assert!(!marker.exists(), "the replaced binary ran");
}

/// The directory the executor is kept in must be writable by the SSH user only: one that
/// others can write to (or a file someone else owns) is refused, nothing is run from it.
#[tokio::test]
async fn ssh_shipped_files_in_a_directory_others_can_write_are_refused() {
    let sshd = Sshd::start();
    let l = link(&sshd).await;
    let shipped = l.ensure_executor(&steward_bin()).await.unwrap();
    let bin = Path::new(&shipped.remote_path)
        .parent()
        .unwrap()
        .to_path_buf();
    let cache = bin.parent().unwrap().to_path_buf();
    for d in [&cache, &bin] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{} is made private", d.display());
    }
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o777)).unwrap();
    let line = first_line(&l, &shipped.remote_path).await;
    assert!(
        line.starts_with("steward-refused ") && line.contains("others can write to it"),
        "{line}"
    );
    let e = l.ensure_executor(&steward_bin()).await.unwrap_err();
    assert!(matches!(e, SshError::Untrusted { .. }), "{e:?}");
    assert!(e.to_string().contains("others can write to it"), "{e}");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o700)).unwrap();

    if !crate::attacker::is_root() {
        crate::attacker::skipped(
            "ssh_shipped_files_in_a_directory_others_can_write_are_refused (a file of another user)",
            "giving the executor to another user needs root",
        );
        return;
    }
    std::os::unix::fs::chown(&shipped.remote_path, Some(65534), None).unwrap();
    let line = first_line(&l, &shipped.remote_path).await;
    assert!(
        line.starts_with("steward-refused ") && line.contains("is owned by uid 65534"),
        "{line}"
    );
    let e = l.ensure_executor(&steward_bin()).await.unwrap_err();
    assert!(e.to_string().contains("is owned by uid 65534"), "{e}");
}

/// A directory with every program of the system but the hash tools.
fn path_without_hash_tools(dir: &Path) -> PathBuf {
    let p = dir.join("path");
    std::fs::create_dir(&p).unwrap();
    for from in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        for e in std::fs::read_dir(from).into_iter().flatten().flatten() {
            let name = e.file_name();
            let _ = std::os::unix::fs::symlink(e.path(), p.join(&name));
        }
    }
    p
}

const HASH_TOOLS: [&str; 3] = ["sha256sum", "shasum", "openssl"];

/// A target without sha256sum, shasum or openssl can not verify the executor: it is refused,
/// not trusted; both when shipping and when starting one shipped before the tools went away.
#[tokio::test]
async fn ssh_a_target_without_hash_tools_is_refused_not_trusted() {
    let tools = tempfile::tempdir().unwrap();
    let path = path_without_hash_tools(tools.path());
    let sshd = Sshd::start_with_path(Some(&path));
    let l = link(&sshd).await;
    // with the tools: shipped and verified
    let shipped = l.ensure_executor(&steward_bin()).await.unwrap();
    let ready = first_line(&l, &shipped.remote_path).await;
    assert!(ready.contains("\"ready\""), "{ready}");
    for t in HASH_TOOLS {
        let _ = std::fs::remove_file(path.join(t));
    }
    let line = first_line(&l, &shipped.remote_path).await;
    assert!(
        line.starts_with("steward-refused ")
            && line.contains("none of sha256sum, shasum or openssl"),
        "{line}"
    );
    let e = l.ensure_executor(&steward_bin()).await.unwrap_err();
    assert!(matches!(e, SshError::Untrusted { .. }), "{e:?}");
    assert!(e.to_string().contains("can not be verified"), "{e}");

    // a target that never had them gets nothing
    let bare = Sshd::start_with_path(Some(&path));
    let l = link(&bare).await;
    let e = l.ensure_executor(&steward_bin()).await.unwrap_err();
    assert!(e.to_string().contains("can not be verified"), "{e}");
    assert!(
        bare.files_in_home().is_empty(),
        "{:?}",
        bare.files_in_home()
    );
}

const WEB: &str = "web1";

/// Connections the sshd saw (refused or not).
fn connections(sshd: &Sshd) -> usize {
    sshd.log().matches("Connection from").count()
}

/// [`connections`] once the one `Sshd::start` made to see it is up is in the log.
async fn connections_at_start(sshd: &Sshd) -> usize {
    for _ in 0..250 {
        if connections(sshd) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    connections(sshd)
}

/// The first failed action of `rid`, once there is one; its messages as text.
async fn refusal(c: &steward::client::Client, env: &str, rid: &str) -> String {
    let acts = crate::support::eventually(60, "the action to be refused", || async {
        let acts = crate::deploy::deploy_actions(c, env, rid).await;
        acts.into_iter().find(|a| a.status == "unavailable")
    })
    .await;
    serde_json::to_string(&acts.messages).unwrap()
}

/// A committer's model places its agent on any host with `std::AgentConfig(uri="ssh://…")`,
/// to be reached with the server's keys. An environment whose `ssh_allowed` a server
/// administrator never set (the default) reaches no SSH target at all: the action fails
/// naming the allow-list, and not even a TCP connection reaches the sshd.
#[tokio::test(flavor = "multi_thread")]
async fn ssh_a_model_can_not_send_its_agent_to_a_target_nobody_allowed() {
    let sshd = Sshd::start();
    let before = connections_at_start(&sshd).await;
    let (srv, c, env, dir) = crate::deploy::deploying_env(
        "ssh-model-target",
        serde_json::json!({
            "ssh": {"known_hosts": sshd.known_hosts, "identity": sshd.client_key},
            "retry_backoff": {"initial": 60, "factor": 1.0, "max": 60},
        }),
    )
    .await;
    // the committer's token and model
    let t = c.create_token("ci", "compiler", Some(&env)).await.unwrap();
    let d = dir.path().display().to_string();
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("project.yml"), "name: placed\n").unwrap();
    std::fs::write(
        project.join("main.cf"),
        format!(
            "import fs\n\
             std::AgentConfig(agentname=\"{WEB}\", uri=\"ssh://{user}@127.0.0.1:{port}\", autostart=true)\n\
             web = std::Host(name=\"{WEB}\", os=std::linux)\n\
             fs::File(host=web, path=\"{d}/reached\", content=\"x\", mode=644, owner=null, group=null)\n",
            user = sshd.user,
            port = sshd.port,
        ),
    )
    .unwrap();
    let out = std::process::Command::new(steward_bin())
        .args(["export", "-d"])
        .current_dir(&project)
        .env("XDG_CACHE_HOME", srv.client_cache())
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", t["secret"].as_str().unwrap())
        .env("STEWARD_ENV", &env)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = refusal(&c, &env, &format!("fs::File[{WEB},path={d}/reached]")).await;
    assert!(
        text.contains("refusing to connect") && text.contains("ssh_allowed.targets (empty)"),
        "{text}"
    );
    assert!(!Path::new(&format!("{d}/reached")).exists());
    assert_eq!(connections(&sshd), before, "{}", sshd.log());
    assert!(sshd.files_in_home().is_empty());
}

/// An environment's own admin may not widen what its environment reaches: not the
/// allow-list, not a key file outside it (another environment's key), not an agent outside
/// it (403). What a global admin set outside the list anyway is refused when connecting,
/// and nothing reaches the sshd.
#[tokio::test(flavor = "multi_thread")]
async fn ssh_an_environment_admin_can_not_choose_targets_or_keys_outside_the_allow_list() {
    let sshd = Sshd::start();
    // the server's key for another environment, authorised on the target too
    let other_key = sshd.dir.path().join("other-env").join("id_ed25519");
    std::fs::create_dir(other_key.parent().unwrap()).unwrap();
    let other_public = crate::ssh_support::keygen(&other_key);
    let mut authorised = std::fs::read_to_string(sshd.dir.path().join("authorized_keys")).unwrap();
    authorised.push_str(&format!("{other_public}\n"));
    std::fs::write(sshd.dir.path().join("authorized_keys"), authorised).unwrap();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let before = connections_at_start(&sshd).await;

    // the operator allows this environment one other host and its own key
    let (srv, c, env, dir) = crate::deploy::deploying_env(
        "ssh-admin-target",
        serde_json::json!({
            "ssh": {"known_hosts": sshd.known_hosts, "identity": sshd.client_key},
            "ssh_allowed": {
                "targets": [format!("{}@127.0.0.2:22", sshd.user)],
                "identities": [sshd.client_key],
            },
            "retry_backoff": {"initial": 60, "factor": 1.0, "max": 60},
        }),
    )
    .await;
    let t = c
        .create_token("env-admin", "admin", Some(&env))
        .await
        .unwrap();
    let admin = srv.client(t["secret"].as_str());
    let forbidden = |r: Result<serde_json::Value, steward::client::ClientError>, what: &str| match r
    {
        Err(steward::client::ClientError::Api {
            status: 403,
            message,
            ..
        }) => message,
        other => panic!("{what}: expected 403, got {other:?}"),
    };
    let m = forbidden(
        admin
            .update_settings(
                &env,
                &serde_json::json!({"ssh_allowed": {"targets": ["*@*:*"], "identities": ["/*"]}}),
            )
            .await,
        "widening the allow-list",
    );
    assert!(m.contains("global admin"), "{m}");
    let m = forbidden(
        admin
            .update_settings(&env, &serde_json::json!({"ssh": {"identity": other_key}}))
            .await,
        "another environment's key",
    );
    assert!(m.contains("ssh_allowed.identities"), "{m}");
    let m = forbidden(
        admin
            .update_settings(&env, &serde_json::json!({"ssh": {"identity": null}}))
            .await,
        "the server's default keys",
    );
    assert!(m.contains("ssh_allowed.identities"), "{m}");
    let m = forbidden(
        admin
            .update_settings(&env, &serde_json::json!({"agent_map": {WEB: uri}}))
            .await,
        "a target outside the allow-list",
    );
    assert!(m.contains("ssh_allowed.targets"), "{m}");
    let s = c.settings(&env).await.unwrap();
    assert_eq!(s["ssh"]["identity"], serde_json::json!(sshd.client_key));
    assert_eq!(s["agent_map"], serde_json::json!({}));
    // what is inside the list is the environment admin's to choose
    admin
        .update_settings(&env, &serde_json::json!({"ssh": {"connect_timeout": 7}}))
        .await
        .unwrap();

    // set outside the list by a global admin: refused when connecting, nothing connects
    c.update_settings(&env, &serde_json::json!({"agent_map": {WEB: uri}}))
        .await
        .unwrap();
    let d = dir.path().display().to_string();
    let f = crate::support::fs_file(WEB, &format!("{d}/a"), "x", &[]);
    let rid = f.id.0.clone();
    crate::deploy::upload(&c, &env, vec![f]).await;
    let text = refusal(&c, &env, &rid).await;
    assert!(text.contains("ssh_allowed.targets"), "{text}");
    assert!(!Path::new(&format!("{d}/a")).exists());
    // the target allowed, the key not
    c.update_settings(
        &env,
        &serde_json::json!({
            "ssh": {"identity": other_key},
            "ssh_allowed": {"targets": [format!("{}@127.0.0.1:{}", sshd.user, sshd.port)]},
        }),
    )
    .await
    .unwrap();
    let f = crate::support::fs_file(WEB, &format!("{d}/b"), "x", &[]);
    let rid = f.id.0.clone();
    crate::deploy::upload(&c, &env, vec![f]).await;
    let text = refusal(&c, &env, &rid).await;
    assert!(
        text.contains(&format!("the key file {}", other_key.display()))
            && text.contains("ssh_allowed.identities"),
        "{text}"
    );
    assert!(!Path::new(&format!("{d}/b")).exists());
    assert_eq!(connections(&sshd), before, "{}", sshd.log());
    assert!(sshd.files_in_home().is_empty());
}
