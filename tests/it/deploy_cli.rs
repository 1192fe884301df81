//! The deploy-control CLI against a real server: env deploy/repair/halt/resume, agent
//! list/pause/unpause, dryrun run/list/show, version progress.

use std::process::Output;

use serde_json::json;

use crate::deploy::{deploying_env, upload};
use crate::support::{TestServer, fs_file, steward_bin, wait_deployed};

pub fn cli(srv: &TestServer, env: &str, args: &[&str]) -> Output {
    std::process::Command::new(steward_bin())
        .args(args)
        .env("XDG_CACHE_HOME", srv.client_cache())
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
        .env("STEWARD_ENV", env)
        .output()
        .expect("run steward")
}

pub fn ok(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "failed: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_control_from_the_command_line() {
    let (srv, c, env, dir) = deploying_env("cli", json!({})).await;
    let d = dir.path().display().to_string();
    let v1 = upload(
        &c,
        &env,
        vec![
            fs_file("web", &format!("{d}/a"), "a", &[]),
            fs_file("db", &format!("{d}/b"), "b", &[]),
        ],
    )
    .await;

    let out = ok(&cli(
        &srv,
        &env,
        &["version", "progress", &v1.to_string(), "--wait"],
    ));
    assert!(
        out.contains("deploy done") && out.contains("deployed"),
        "{out}"
    );

    let out = ok(&cli(&srv, &env, &["agent", "list"]));
    assert!(
        out.contains("web") && out.contains("db") && out.contains("idle"),
        "{out}"
    );
    let out = ok(&cli(&srv, &env, &["agent", "pause", "web"]));
    assert!(out.contains("paused"), "{out}");
    let out = ok(&cli(&srv, &env, &["agent", "list"]));
    assert!(
        out.lines()
            .any(|l| l.starts_with("web") && l.contains("paused")),
        "{out}"
    );
    ok(&cli(&srv, &env, &["agent", "unpause", "web"]));

    // drift, then a repair of one agent restores only its file
    std::fs::write(format!("{d}/a"), "x").unwrap();
    std::fs::write(format!("{d}/b"), "x").unwrap();
    let out = ok(&cli(&srv, &env, &["env", "repair", "--agent", "web"]));
    assert!(out.contains("1 resource(s) scheduled"), "{out}");
    crate::support::eventually(20, "a to be repaired", || async {
        (std::fs::read_to_string(format!("{d}/a")).ok().as_deref() == Some("a")).then_some(())
    })
    .await;
    assert_eq!(std::fs::read_to_string(format!("{d}/b")).unwrap(), "x");
    let out = ok(&cli(&srv, &env, &["env", "deploy"]));
    assert!(out.contains("0 resource(s) scheduled"), "{out}");

    // a dry-run shows the drift of b and changes nothing
    let out = ok(&cli(&srv, &env, &["dryrun", "run"]));
    assert!(
        out.contains("1 would change")
            && out.contains(&format!("{d}/b"))
            && out.contains("content"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(format!("{d}/b")).unwrap(), "x");
    let out = ok(&cli(&srv, &env, &["dryrun", "list"]));
    assert!(out.contains("2/2"), "{out}");

    // halt: a new version waits; resume: it deploys
    ok(&cli(&srv, &env, &["env", "halt"]));
    let v2 = upload(
        &c,
        &env,
        vec![
            fs_file("web", &format!("{d}/a"), "a2", &[]),
            fs_file("db", &format!("{d}/b"), "b", &[]),
        ],
    )
    .await;
    let o = cli(&srv, &env, &["version", "progress", &v2.to_string()]);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("deploy halted"), "{said}");
    ok(&cli(&srv, &env, &["env", "resume"]));
    wait_deployed(&c, &env, v2, 30).await;
    assert_eq!(std::fs::read_to_string(format!("{d}/a")).unwrap(), "a2");

    // errors are clear
    let o = cli(&srv, &env, &["agent", "pause", "nobody"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not an agent"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
