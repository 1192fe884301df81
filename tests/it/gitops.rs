//! The git-driven server end to end: real bare repositories with the hooks of `hooks/`,
//! `git push`, the server in process with its scheduler and real executors, files on disk.

use std::time::Duration;

use serde_json::json;

use crate::deploy::deploy_actions;
use crate::gitops_support::{Repo, compiled, follow, read, webhook_url};
use crate::support::{TestServer, eventually};

#[tokio::test(flavor = "multi_thread")]
async fn push_compiles_releases_and_deploys_only_committed_models() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let first = repo.commit(
        &repo.model(&[("a", "A1"), ("b", "B1"), ("c", "C1")], ""),
        "first",
    );
    let env = follow(&c, "push", &repo, json!({})).await;
    repo.install_post_receive(&webhook_url(&srv.url, &env), "s3cret");
    repo.push_ok();

    let report = compiled(&c, &env, &first, 30).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let stages: Vec<&str> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["fetch", "checkout", "facts", "compile", "store"]);
    let v1 = report["version"].as_i64().unwrap() as i32;
    let version = c.version(&env, v1).await.unwrap();
    assert_eq!(version["provenance"]["commit"], first.as_str());
    assert_eq!(version["provenance"]["branch"], "main");
    assert_eq!(version["provenance"]["compile"], report["id"]);
    crate::support::wait_deployed(&c, &env, v1, 30).await;
    assert_eq!(read(&repo.out.join("a")).as_deref(), Some("A1"));

    // the timeline of the commit, in order
    let t = eventually(10, "the deploy in the timeline", || async {
        let t = c.commit_timeline(&env, &first[..8]).await.unwrap();
        (t["state"] == "deployed").then_some(t)
    })
    .await;
    let events: Vec<&str> = t["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        [
            "received",
            "compile_started",
            "compiled",
            "version",
            "released",
            "deployed"
        ],
        "{t:#}"
    );

    // uncommitted edits never reach the environment: only what is pushed
    std::fs::write(repo.work.join("main.cf"), repo.model(&[("a", "DIRTY")], "")).unwrap();
    c.trigger_compile(&env, None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read(&repo.out.join("a")).as_deref(), Some("A1"));

    // a second push changing one file: only it redeploys
    let second = repo.commit(
        &repo.model(&[("a", "A1"), ("b", "B2"), ("c", "C1")], ""),
        "change b",
    );
    repo.push_ok();
    let report = compiled(&c, &env, &second, 30).await;
    let v2 = report["version"].as_i64().unwrap() as i32;
    crate::support::wait_deployed(&c, &env, v2, 30).await;
    assert_eq!(read(&repo.out.join("b")).as_deref(), Some("B2"));
    let id = |n: &str| format!("fs::File[localhost,path={}/{n}]", repo.out.display());
    assert_eq!(deploy_actions(&c, &env, &id("a")).await.len(), 1);
    assert_eq!(deploy_actions(&c, &env, &id("b")).await.len(), 2);

    // a broken push: a failed report with the diagnostic, nothing changes, v2 stays active
    let broken = repo.commit(&repo.model(&[("a", "A3"), ("b", "B3")], "x = \n"), "broken");
    repo.push_ok();
    let report = compiled(&c, &env, &broken, 30).await;
    assert_eq!(report["status"], "failed", "{report:#}");
    assert!(report["version"].is_null());
    let diag = &report["diagnostics"][0];
    assert_eq!(
        diag["primary"]["file"]
            .as_str()
            .map(|f| f.ends_with("main.cf")),
        Some(true),
        "{report:#}"
    );
    assert!(diag["primary"]["line"].as_i64().unwrap() >= 4, "{report:#}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("does not compile")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(read(&repo.out.join("a")).as_deref(), Some("A1"));
    let versions = c.versions(&env).await.unwrap();
    assert_eq!(versions[0]["number"], v2, "no version from a broken commit");
    assert_eq!(versions[0]["active"], true);
    let t = c.commit_timeline(&env, &broken).await.unwrap();
    assert_eq!(t["state"], "compile_failed");
    // pushes are the only way in
    let err = c
        .upload(&env, &crate::support::null_export(1, None), json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409));
}

#[tokio::test(flavor = "multi_thread")]
async fn approval_mode_deploys_nothing_until_an_approver_releases() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let env = c
        .create_environment("git", "approve", Some(json!({"auto_release": false})))
        .await
        .unwrap()
        .id
        .to_string();
    c.set_source(
        &env,
        &json!({"url": repo.url(), "webhook_secret": "s3cret", "poll_interval": 0}),
    )
    .await
    .unwrap();
    repo.install_post_receive(&webhook_url(&srv.url, &env), "s3cret");
    let commit = repo.commit(&repo.model(&[("x", "X1")], ""), "first");
    repo.push_ok();
    let report = compiled(&c, &env, &commit, 30).await;
    let v = report["version"].as_i64().unwrap() as i32;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        read(&repo.out.join("x")).is_none(),
        "deployed without approval"
    );
    assert_eq!(
        c.commit_timeline(&env, &commit).await.unwrap()["state"],
        "waiting_for_approval"
    );

    // a viewer may not release; an approver may
    let viewer = c
        .create_token("viewer", "viewer", Some(&env))
        .await
        .unwrap();
    let vc = srv.client(viewer["secret"].as_str());
    assert_eq!(
        vc.release(&env, v, "no").await.unwrap_err().status(),
        Some(403)
    );
    let approver = c
        .create_token("alice", "approver", Some(&env))
        .await
        .unwrap();
    let ac = srv.client(approver["secret"].as_str());
    ac.release(&env, v, "looks good").await.unwrap();
    crate::support::wait_deployed(&c, &env, v, 30).await;
    assert_eq!(read(&repo.out.join("x")).as_deref(), Some("X1"));
    let shown = c.version(&env, v).await.unwrap();
    assert_eq!(shown["approvals"][0]["approver"], "alice");
    assert_eq!(shown["approvals"][0]["comment"], "looks good");
    assert_eq!(shown["approvals"][0]["content_hash"], shown["content_hash"]);
}

async fn post_webhook(
    url: &str,
    headers: &[(&str, String)],
    body: &str,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new()
        .post(url)
        .body(body.to_string())
        .header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_are_verified_deduplicated_and_only_hints() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let c1 = repo.commit(&repo.model(&[("w", "1")], ""), "one");
    repo.push_ok();
    // no filesystem watch: a push is seen only through the webhooks below
    let env = follow(&c, "hooks", &repo, json!({"watch": false})).await;
    // following starts with the branch as it is
    assert_eq!(compiled(&c, &env, &c1, 30).await["status"], "success");
    let url = webhook_url(&srv.url, &env);

    let c2 = repo.commit(&repo.model(&[("w", "2")], ""), "two");
    repo.push_ok();
    // the payload lies about the commit: it is only a hint, the server resolves the branch
    let body =
        json!({"ref": "refs/heads/main", "after": "0000000000000000000000000000000000000000"})
            .to_string();
    let good = format!(
        "sha256={}",
        steward::sources::webhook::sign("s3cret", body.as_bytes())
    );
    let bad = format!(
        "sha256={}",
        steward::sources::webhook::sign("wrong", body.as_bytes())
    );

    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Hub-Signature-256", bad),
            ("X-GitHub-Delivery", "d1".into()),
            ("X-GitHub-Event", "push".into()),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 401, "{answer}");
    assert_eq!(answer["error"], "unauthorized");
    let (status, _) = post_webhook(&url, &[("X-GitHub-Event", "push".into())], &body).await;
    assert_eq!(status, 401, "unsigned");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let list = c.compiles(&env, 100).await.unwrap();
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "a rejected webhook compiled something: {list:#}"
    );

    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Hub-Signature-256", good.clone()),
            ("X-GitHub-Delivery", "d1".into()),
            ("X-GitHub-Event", "push".into()),
        ],
        &body,
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["provider"], "github");
    let r = compiled(&c, &env, &c2, 30).await;
    assert_eq!(r["trigger"], "webhook");

    // a replayed delivery is ignored, even when there is something new to compile
    let c3 = repo.commit(&repo.model(&[("w", "3")], ""), "three");
    repo.push_ok();
    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Hub-Signature-256", good),
            ("X-GitHub-Delivery", "d1".into()),
            ("X-GitHub-Event", "push".into()),
        ],
        &body,
    )
    .await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("duplicate"))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !c.compiles(&env, 100)
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["commit"] == c3.as_str())
    );

    // other branches, and pings, are not pushes to follow
    let other = json!({"ref": "refs/heads/feature"}).to_string();
    let sig = steward::sources::webhook::sign("s3cret", other.as_bytes());
    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Gitea-Signature", sig),
            ("X-Gitea-Delivery", "g1".into()),
            ("X-Gitea-Event", "push".into()),
        ],
        &other,
    )
    .await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("ignored")));

    // Gitea, Forgejo and GitLab styles (each a body of its own: the same signed body under
    // a new delivery id is a replay, and answered as a duplicate)
    let body_for = |sender: &str| {
        json!({"ref": "refs/heads/main", "after": "0000000000000000000000000000000000000000", "sender": sender})
            .to_string()
    };
    let body = body_for("gitea");
    let sig = steward::sources::webhook::sign("s3cret", body.as_bytes());
    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Gitea-Signature", sig.clone()),
            ("X-Gitea-Delivery", "g2".into()),
            ("X-Gitea-Event", "push".into()),
        ],
        &body,
    )
    .await;
    assert_eq!((status, answer["provider"].as_str()), (202, Some("gitea")));
    compiled(&c, &env, &c3, 30).await;
    let body = body_for("forgejo");
    let sig = steward::sources::webhook::sign("s3cret", body.as_bytes());
    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Forgejo-Signature", sig),
            ("X-Forgejo-Delivery", "f1".into()),
        ],
        &body,
    )
    .await;
    assert_eq!(
        (status, answer["provider"].as_str()),
        (202, Some("forgejo"))
    );
    let body = body_for("gitlab");
    let (status, _) = post_webhook(&url, &[("X-Gitlab-Token", "nope".into())], &body).await;
    assert_eq!(status, 401);
    let (status, answer) = post_webhook(
        &url,
        &[
            ("X-Gitlab-Token", "s3cret".into()),
            ("X-Gitlab-Event", "Push Hook".into()),
        ],
        &body,
    )
    .await;
    assert_eq!((status, answer["provider"].as_str()), (202, Some("gitlab")));
    // an environment id that takes no webhooks answers like a bad signature
    let (status, _) = post_webhook(
        &webhook_url(&srv.url, &uuid::Uuid::new_v4().to_string()),
        &[],
        &body,
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn polling_picks_up_a_commit_without_any_trigger() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let first = repo.commit(&repo.model(&[("p", "1")], ""), "one");
    repo.push_ok();
    // no hook installed, no filesystem watch: only polling can see the push
    let env = follow(
        &c,
        "poll",
        &repo,
        json!({"poll_interval": 1, "watch": false}),
    )
    .await;
    // following starts with the branch as it is; the push below comes after that look
    compiled(&c, &env, &first, 30).await;
    let later = repo.commit(&repo.model(&[("p", "2")], ""), "two");
    repo.push_ok();
    let r = compiled(&c, &env, &later, 30).await;
    assert_eq!(r["status"], "success");
    assert!(
        matches!(r["trigger"].as_str(), Some("poll") | Some("watch")),
        "{r:#}"
    );
    let v = r["version"].as_i64().unwrap() as i32;
    crate::support::wait_deployed(&c, &env, v, 30).await;
    assert_eq!(read(&repo.out.join("p")).as_deref(), Some("2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn quick_pushes_supersede_the_older_queued_compile() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let c1 = repo.commit(&repo.model(&[("q", "1")], ""), "one");
    repo.push_ok();
    let env = follow(&c, "queue", &repo, json!({})).await;
    compiled(&c, &env, &c1, 30).await;
    // halted: compiles queue up without starting
    c.set_halted(&env, true).await.unwrap();
    let c2 = repo.commit(&repo.model(&[("q", "2")], ""), "two");
    repo.push_ok();
    let t2 = c.trigger_compile(&env, None).await.unwrap();
    assert_eq!(
        (t2["commit"].as_str(), t2["status"].as_str()),
        (Some(c2.as_str()), Some("queued"))
    );
    let c3 = repo.commit(&repo.model(&[("q", "3")], ""), "three");
    repo.push_ok();
    let t3 = c.trigger_compile(&env, None).await.unwrap();
    assert_eq!(t3["superseded"][0], t2["compile"], "{t3}");
    c.set_halted(&env, false).await.unwrap();
    let r3 = compiled(&c, &env, &c3, 30).await;
    assert_eq!(r3["status"], "success");
    let r2 = c
        .compile_report(&env, t2["compile"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(r2["status"], "superseded");
    assert_eq!(r2["superseded_by"], t3["compile"]);
    assert!(
        r2["version"].is_null() && r2["started_at"].is_null(),
        "{r2:#}"
    );
    assert_eq!(
        c.commit_timeline(&env, &c2).await.unwrap()["state"],
        "superseded"
    );
    // compiled commits are not compiled again
    let again = c.trigger_compile(&env, Some(&c3)).await.unwrap();
    assert_eq!(again["status"], "already_compiled");
}

#[tokio::test(flavor = "multi_thread")]
async fn api_trigger_compiles_a_named_commit_of_the_branch_only() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let old = repo.commit(&repo.model(&[("n", "old")], ""), "old");
    let tip = repo.commit(&repo.model(&[("n", "tip")], ""), "tip");
    repo.push_ok();
    let env = follow(&c, "named", &repo, json!({})).await;
    compiled(&c, &env, &tip, 30).await;
    let t = c.trigger_compile(&env, Some(&old[..10])).await.unwrap();
    assert_eq!(
        t["commit"],
        old.as_str(),
        "an abbreviated commit is resolved"
    );
    let r = compiled(&c, &env, &old, 30).await;
    assert_eq!(r["trigger"], "api");
    // a commit on another branch is refused
    crate::gitops_support::git_ok(&repo.work, &["checkout", "-q", "-b", "side"]);
    let side = repo.commit(&repo.model(&[("n", "side")], ""), "side");
    crate::gitops_support::git_ok(&repo.work, &["push", "-q", "origin", "side"]);
    let err = c.trigger_compile(&env, Some(&side)).await.unwrap_err();
    assert_eq!(err.status(), Some(422), "{err}");
    assert!(err.to_string().contains("not on branch 'main'"), "{err}");
    let err = c.trigger_compile(&env, Some("xyz")).await.unwrap_err();
    assert_eq!(err.status(), Some(400));
}

#[tokio::test(flavor = "multi_thread")]
async fn monorepo_sub_path_and_repository_errors() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = repo.commit_in("infra/site", &repo.model(&[("m", "mono")], ""), "mono");
    std::fs::write(repo.work.join("README"), "not a project").unwrap();
    crate::gitops_support::git_ok(&repo.work, &["add", "-A"]);
    crate::gitops_support::git_ok(&repo.work, &["commit", "-q", "--amend", "--no-edit"]);
    let commit = {
        let _ = commit;
        crate::gitops_support::git_ok(&repo.work, &["rev-parse", "HEAD"])
    };
    repo.push_ok();
    let env = follow(&c, "mono", &repo, json!({"path": "infra/site"})).await;
    let r = compiled(&c, &env, &commit, 30).await;
    assert_eq!(r["status"], "success", "{r:#}");
    crate::support::wait_deployed(&c, &env, r["version"].as_i64().unwrap() as i32, 30).await;
    assert_eq!(read(&repo.out.join("m")).as_deref(), Some("mono"));

    // a repository that does not exist: a clear error, recorded on the source
    let missing = c
        .create_environment("git", "missing", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.set_source(
        &missing,
        &json!({"url": "file:///nonexistent/repo.git", "poll_interval": 0}),
    )
    .await
    .unwrap();
    let err = c.trigger_compile(&missing, None).await.unwrap_err();
    assert_eq!(err.status(), Some(502), "{err}");
    assert!(
        err.to_string().contains("not_found") || err.to_string().contains("does not exist"),
        "{err}"
    );
    let shown = c.source(&missing).await.unwrap();
    assert!(shown["last_fetch_error"].as_str().is_some(), "{shown}");
    // secrets are never shown
    let s = c.set_source(&missing, &json!({"url": "https://example.invalid/r.git", "token": "tok-secret", "webhook_secret": "whs", "poll_interval": 0})).await.unwrap();
    assert_eq!(
        (s["has_token"].as_bool(), s["has_webhook_secret"].as_bool()),
        (Some(true), Some(true))
    );
    assert!(
        !s.to_string().contains("tok-secret")
            && !c
                .source(&missing)
                .await
                .unwrap()
                .to_string()
                .contains("whs")
    );
    // bad sources are refused
    for bad in [
        json!({"url": "ftp://x/y"}),
        json!({"url": "/srv/r", "branch": "a b"}),
        json!({"url": "ssh://h/r", "ssh_key": "k"}),
        json!({"url": "/r", "path": "../etc"}),
    ] {
        let e = c.set_source(&missing, &bad).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{bad}: {e}");
    }
}

#[test]
fn pre_receive_hook_rejects_a_model_that_does_not_compile() {
    let repo = Repo::new();
    let hook = repo.origin.join("hooks/pre-receive");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/pre-receive"),
        &hook,
    )
    .unwrap();
    crate::gitops_support::git_ok(
        &repo.origin,
        &["config", "steward.bin", env!("CARGO_BIN_EXE_steward")],
    );
    repo.commit(
        &repo.model(&[("h", "1")], "y = undefined_thing\n"),
        "broken",
    );
    let o = repo.push();
    assert!(!o.status.success(), "a broken model was accepted");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("does not compile; push rejected") && err.contains("undefined_thing"),
        "{err}"
    );
    assert!(err.contains("main.cf:4"), "{err}");
    repo.commit(&repo.model(&[("h", "1")], ""), "fixed");
    repo.push_ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn source_and_compile_reports_from_the_command_line() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let good = repo.commit(&repo.model(&[("cli", "1")], ""), "one");
    repo.push_ok();
    let env = c
        .create_environment("git", "cli", None)
        .await
        .unwrap()
        .id
        .to_string();
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_steward"))
            .args(args)
            .env("XDG_CACHE_HOME", srv.client_cache())
            .env("STEWARD_SERVER", &srv.url)
            .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
            .env("STEWARD_ENV", &env)
            .output()
            .unwrap()
    };
    let text = crate::support::output_text;
    let o = cli(&[
        "source",
        "set",
        &repo.url(),
        "--branch",
        "main",
        "--poll-interval",
        "0",
        "--webhook-secret",
        "cli-secret",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("/source/webhook"), "{}", text(&o));
    let o = cli(&["source", "show"]);
    assert!(
        text(&o).contains("has_webhook_secret") && !text(&o).contains("cli-secret"),
        "{}",
        text(&o)
    );
    compiled(&c, &env, &good, 30).await;
    let o = cli(&["source", "trigger"]);
    assert!(text(&o).contains("was compiled before"), "{}", text(&o));

    let broken = repo.commit(&repo.model(&[("cli", "2")], "q = \n"), "broken");
    repo.push_ok();
    let o = cli(&["source", "trigger", &broken[..12]]);
    assert!(o.status.success(), "{}", text(&o));
    let report = compiled(&c, &env, &broken, 30).await;
    let o = cli(&["compile-report", "list"]);
    assert!(
        text(&o).contains("failed")
            && text(&o).contains("success")
            && text(&o).contains(&broken[..10]),
        "{}",
        text(&o)
    );
    let o = cli(&["compile-report", "show", report["id"].as_str().unwrap()]);
    let shown = text(&o);
    assert!(
        shown.contains("checkout") && shown.contains("FAILED") && shown.contains("main.cf:"),
        "{shown}"
    );
    let o = cli(&["source", "timeline", &good[..8]]);
    assert!(
        text(&o).contains("received") && text(&o).contains("compiled"),
        "{}",
        text(&o)
    );
    let o = cli(&["source", "remove"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(c.source(&env).await.unwrap_err().status(), Some(404));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_module_with_its_own_handler_deploys_from_a_push() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    // the integration example, committed: its module carries the handler
    crate::support::copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/integration"),
        &repo.work,
    );
    let ini = repo.out.join("app.ini");
    let main = std::fs::read_to_string(repo.work.join("main.cf")).unwrap();
    let main = main.replace(
        "ini = std::get_env(\"INTEGRATION_INI\", \"{{project_dir}}/data/app.ini\")",
        &format!("ini = \"{}\"", ini.display()),
    );
    std::fs::write(repo.work.join("main.cf"), main).unwrap();
    crate::gitops_support::git_ok(&repo.work, &["add", "-A"]);
    crate::gitops_support::git_ok(&repo.work, &["commit", "-q", "-m", "ini settings"]);
    let commit = crate::gitops_support::git_ok(&repo.work, &["rev-parse", "HEAD"]);
    repo.push_ok();
    let env = follow(&c, "module", &repo, json!({})).await;
    let r = compiled(&c, &env, &commit, 30).await;
    assert_eq!(r["status"], "success", "{r:#}");
    crate::support::wait_deployed(&c, &env, r["version"].as_i64().unwrap() as i32, 60).await;
    let text = read(&ini).unwrap_or_default();
    assert!(
        text.contains("host = db.internal") && text.contains("(inifile handler 1)"),
        "{text}"
    );
}
