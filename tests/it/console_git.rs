//! The console's git pages and audit log against a real server, real git repositories (made
//! with the git CLI) and real compiles: the source with its last fetch error, compile reports
//! with their stages, timings and diagnostics shown on the model's line with a caret, the
//! commit timeline, compile-now through a confirmation, and the audit log paged and filtered;
//! what each role is offered and refused.

use reqwest::StatusCode;
use serde_json::json;

use crate::console_support::{ConsoleSession as Session, http};
use crate::gitops_support::{Repo, compiled, follow};
use crate::support::{TestServer, eventually};

/// The page answered 200; its HTML.
async fn ok_page(s: &Session, path: &str) -> String {
    let (status, html) = s.page(path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {html}");
    html
}

#[tokio::test(flavor = "multi_thread")]
async fn compile_reports_show_stages_timeline_and_diagnostics_on_their_source_line() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let admin = Session::sign_in(&srv.url, srv.admin.as_deref().unwrap()).await;
    let repo = Repo::new();
    let good = repo.commit(&repo.model(&[("a", "A1")], ""), "good");
    repo.push_ok();
    let env = follow(&c, "console", &repo, json!({})).await;
    let report = compiled(&c, &env, &good, 60).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let good_id = report["id"].as_str().unwrap().to_string();
    let version = report["version"].as_i64().unwrap();

    // the source page: settings (secrets only as set), no fetch error, the report, the timeline
    let git = ok_page(&admin, &format!("/console/env/{env}/git")).await;
    assert!(git.contains(&html_escape(&repo.url())), "{git}");
    assert!(
        git.contains("webhook secret") && !git.contains("s3cret"),
        "{git}"
    );
    assert!(git.contains("Last fetch: no error."), "{git}");
    assert!(!git.contains("id=\"fetch-error\""), "{git}");
    assert!(git.contains(&format!("id=\"compile-{good_id}\"")), "{git}");
    assert!(
        git.contains(&format!("/console/env/{env}/git/compiles/{good_id}")),
        "{git}"
    );
    assert!(git.contains(&good[..12]), "{git}");
    assert!(git.contains("st-success"), "{git}");
    assert!(
        git.contains(&format!("id=\"timeline-commit-id\">{good}<")),
        "{git}"
    );
    for event in ["received", "compile_started", "compiled", "version"] {
        assert!(git.contains(&format!(">{event}</span>")), "{event}: {git}");
    }
    assert!(git.contains("id=\"trigger-compile\""), "{git}");

    // the good report: its five stages with their timings, the version, the timeline
    let page = ok_page(
        &admin,
        &format!("/console/env/{env}/git/compiles/{good_id}"),
    )
    .await;
    for stage in ["fetch", "checkout", "facts", "compile", "store"] {
        assert!(
            page.contains(&format!("id=\"stage-{stage}\"")),
            "{stage}: {page}"
        );
    }
    assert_eq!(page.matches("class=\"stage-took\">").count(), 5, "{page}");
    assert!(page.matches(" ms</td>").count() + page.matches(" s</td>").count() >= 4);
    assert!(
        page.contains(&format!("versions/{version}\">{version}</a>")),
        "{page}"
    );
    assert!(page.contains("id=\"compile-state\">success<"), "{page}");
    assert!(page.contains("id=\"timeline-events\""), "{page}");
    assert!(!page.contains("Diagnostics"), "{page}");

    // a commit that does not compile: its diagnostic on the model's line, caret under it
    let broken = repo.commit(
        &repo.model(&[("a", "A1")], "y = nope_not_defined\n"),
        "broken",
    );
    repo.push_ok();
    c.trigger_compile(&env, None).await.unwrap();
    let report = compiled(&c, &env, &broken, 60).await;
    assert_eq!(report["status"], "failed", "{report:#}");
    assert_eq!(report["source_lines"][0]["text"], "y = nope_not_defined");
    let broken_id = report["id"].as_str().unwrap();
    let page = ok_page(
        &admin,
        &format!("/console/env/{env}/git/compiles/{broken_id}"),
    )
    .await;
    assert!(page.contains("id=\"compile-state\">failed<"), "{page}");
    assert!(
        page.contains("variable nope_not_defined not found"),
        "{page}"
    );
    assert!(page.contains("main.cf:4:5"), "{page}");
    let snippet = "<pre class=\"snippet\" tabindex=\"0\"><span class=\"gutter\">4 | </span>y = nope_not_defined\n\
                   <span class=\"gutter\">  | </span><span class=\"caret\">    ^^^^^^^^^^^^^^^^</span></pre>";
    assert!(page.contains(snippet), "{page}");
    assert!(page.contains("id=\"compile-error\""), "{page}");
    assert!(page.contains("id=\"compile-stderr\""), "{page}");
    assert!(page.contains("id=\"stage-compile\""), "{page}");
    assert!(!page.contains("id=\"stage-store\""), "{page}");
    assert!(page.contains(">compile_failed</span>"), "{page}");

    // a timeline asked for by an abbreviated commit; an unknown one says so
    let git = ok_page(
        &admin,
        &format!("/console/env/{env}/git?commit={}", &good[..8]),
    )
    .await;
    assert!(
        git.contains(&format!("id=\"timeline-commit-id\">{good}<")),
        "{git}"
    );
    let git = ok_page(&admin, &format!("/console/env/{env}/git?commit=abcdef12")).await;
    assert!(git.contains("id=\"timeline-error\""), "{git}");
    // a report of another environment, or none, is not found
    let (status, _) = admin
        .page(&format!(
            "/console/env/{env}/git/compiles/{}",
            uuid::Uuid::new_v4()
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread")]
async fn compile_now_is_confirmed_and_offered_only_to_those_who_may() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let admin = Session::sign_in(&srv.url, srv.admin.as_deref().unwrap()).await;
    let repo = Repo::new();
    let first = repo.commit(&repo.model(&[("a", "A1")], ""), "first");
    repo.push_ok();
    // no watch: the console's trigger is what compiles the next commit
    let env = follow(&c, "trigger", &repo, json!({"watch": false})).await;
    compiled(&c, &env, &first, 60).await;
    let git = format!("/console/env/{env}/git");
    let trigger = format!("{git}/trigger");

    // no session: pages go to sign-in, changes are refused
    let anon = http();
    for path in [
        git.clone(),
        trigger.clone(),
        format!("/console/env/{env}/audit"),
    ] {
        let r = anon.get(format!("{}{path}", srv.url)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{path}");
        assert!(
            r.headers()["location"]
                .to_str()
                .unwrap()
                .starts_with("/console/sign-in?next="),
            "{path}"
        );
    }
    let r = anon
        .post(format!("{}{trigger}", srv.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("csrf=x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    // a viewer sees the pages but no compile button, and may not compile
    let viewer = c
        .create_token("watcher", "viewer", Some(&env))
        .await
        .unwrap();
    let viewer = Session::sign_in(&srv.url, viewer["secret"].as_str().unwrap()).await;
    let page = ok_page(&viewer, &git).await;
    assert!(page.contains(&first[..12]), "{page}");
    assert!(!page.contains("trigger-compile"), "{page}");
    let (status, _) = viewer.page(&trigger).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let csrf = viewer.csrf().await;
    let r = viewer.post(&trigger, &[("csrf", &csrf)]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // nor read the audit log
    let (status, page) = viewer.page(&format!("/console/env/{env}/audit")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(!page.contains("audit-entry"), "{page}");

    // an admin: the button leads to a confirmation saying what will happen
    let page = ok_page(&admin, &git).await;
    assert!(page.contains("<button id=\"trigger-compile\""), "{page}");
    let confirm = ok_page(&admin, &trigger).await;
    assert!(confirm.contains("id=\"confirm\""), "{confirm}");
    assert!(confirm.contains(&html_escape(&repo.url())), "{confirm}");
    assert!(confirm.contains("the tip of branch main"), "{confirm}");
    assert!(
        confirm.contains(&format!("action=\"{}\"", html_escape(&trigger))),
        "{confirm}"
    );

    // a change without the session's CSRF value is refused, and nothing is compiled
    let before = c
        .compiles(&env, 100)
        .await
        .unwrap()
        .as_array()
        .unwrap()
        .len();
    let r = admin.post(&trigger, &[]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = admin.post(&trigger, &[("csrf", "not-the-value")]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // a new commit, compiled from the console
    let second = repo.commit(&repo.model(&[("a", "A2")], ""), "second");
    repo.push_ok();
    let csrf = admin.csrf().await;
    let r = admin.post(&trigger, &[("csrf", &csrf)]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    assert!(to.starts_with(&format!("{git}?queued=")), "{to}");
    let report = compiled(&c, &env, &second, 60).await;
    assert_eq!(report["status"], "success", "{report:#}");
    assert_eq!(report["trigger"], "api");
    assert_eq!(
        c.compiles(&env, 100)
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        before + 1
    );
    let page = ok_page(&admin, &to).await;
    assert!(page.contains("id=\"trigger-result\""), "{page}");
    assert!(page.contains(&second[..12]), "{page}");
    assert!(
        page.contains(&format!(
            "/console/env/{env}/git/compiles/{}",
            report["id"].as_str().unwrap()
        )),
        "{page}"
    );
    // the compile is in the audit log, by whom
    let audit = ok_page(
        &admin,
        &format!("/console/env/{env}/audit?action=source.trigger"),
    )
    .await;
    assert!(audit.contains("test admin"), "{audit}");
    assert!(audit.contains(&second), "{audit}");

    // the same page with a commit named: the confirmation names it and posts it
    let confirm = ok_page(&admin, &format!("{trigger}?commit={}", &first[..10])).await;
    assert!(
        confirm.contains(&format!("commit {}", &first[..10])),
        "{confirm}"
    );
    assert!(
        confirm.contains(&format!("name=\"commit\" value=\"{}\"", &first[..10])),
        "{confirm}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_source_page_shows_the_last_fetch_error_and_how_to_set_a_source() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let admin = Session::sign_in(&srv.url, srv.admin.as_deref().unwrap()).await;

    // no source: the page says so, and how to set one
    let env = c
        .create_environment("git", "pushed", None)
        .await
        .unwrap()
        .id
        .to_string();
    let page = ok_page(&admin, &format!("/console/env/{env}/git")).await;
    assert!(page.contains("id=\"no-source\""), "{page}");
    assert!(
        page.contains("steward source set URL --branch main --env git/pushed"),
        "{page}"
    );
    assert!(!page.contains("trigger-compile"), "{page}");

    // a repository that is not there: the fetch error, as the server recorded it
    let missing = tempfile::tempdir().unwrap();
    let url = format!("file://{}/nothing-here.git", missing.path().display());
    c.set_source(
        &env,
        &json!({"url": url, "poll_interval": 0, "token": "tok-secret-1"}),
    )
    .await
    .unwrap();
    let page = eventually(30, "the fetch error on the source page", || async {
        let page = ok_page(&admin, &format!("/console/env/{env}/git")).await;
        page.contains("id=\"fetch-error\"").then_some(page)
    })
    .await;
    let recorded = c.source(&env).await.unwrap()["last_fetch_error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        page.contains(&format!("Last fetch failed: {}", html_escape(&recorded))),
        "{recorded}\n{page}"
    );
    assert!(page.contains(&html_escape(&url)), "{page}");
    assert!(page.contains("HTTPS token"), "{page}");
    assert!(!page.contains("tok-secret-1"), "{page}");
    assert!(page.contains("No compiles yet."), "{page}");
}

/// What minijinja's HTML escaping makes of a text.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
        .replace('/', "&#x2f;")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_audit_log_shows_who_changed_what_paged_and_filtered() {
    let srv = TestServer::start(false).await;
    let c = srv.admin_client();
    let env = c
        .create_environment("shop", "prod", None)
        .await
        .unwrap()
        .id
        .to_string();
    // an administrator of the environment changes a setting through the API
    let ops = c
        .create_token("ops-alice", "admin", Some(&env))
        .await
        .unwrap();
    let ops_client = srv.client(ops["secret"].as_str());
    ops_client
        .update_settings(&env, &json!({"agent_parallelism": 7}))
        .await
        .unwrap();
    let admin = Session::sign_in(&srv.url, srv.admin.as_deref().unwrap()).await;
    let audit = format!("/console/env/{env}/audit");
    let page = ok_page(&admin, &audit).await;
    let first = page.find("class=\"audit-entry\"").expect("entries");
    let newest = &page[first..];
    let newest = &newest[..newest.find("</tr>").unwrap()];
    assert!(newest.contains("audit-actor\">ops-alice<"), "{newest}");
    assert!(newest.contains(">environment.settings<"), "{newest}");
    // details as readable (indented) JSON
    assert!(
        newest.contains("&quot;agent_parallelism&quot;: 7"),
        "{newest}"
    );
    // older entries follow: the token's creation, by the global admin
    assert!(page.contains("audit-action\">token.create<"), "{page}");
    assert!(page.contains("audit-actor\">test admin<"), "{page}");
    // the action filter lists the actions there are
    assert!(page.contains("<option value=\"token.create\">"), "{page}");

    // 60 more changes: pages of 50, newest first, older ones a link away
    for n in 0..60 {
        ops_client
            .update_settings(&env, &json!({"agent_parallelism": 10 + n}))
            .await
            .unwrap();
    }
    let page = ok_page(&admin, &format!("{audit}?action=environment.settings")).await;
    assert_eq!(page.matches("class=\"audit-entry\"").count(), 50, "{page}");
    assert!(page.contains("&quot;agent_parallelism&quot;: 69"), "{page}");
    assert!(!page.contains("audit-action\">token.create<"), "{page}");
    assert!(
        page.contains("<option value=\"environment.settings\" selected>"),
        "{page}"
    );
    let marker = "id=\"audit-older\" href=\"";
    let at = page.find(marker).expect("an older page") + marker.len();
    let older = page[at..at + page[at..].find('"').unwrap()].replace("&amp;", "&");
    assert!(older.contains("action=environment.settings"), "{older}");
    let page = ok_page(&admin, &older).await;
    assert_eq!(page.matches("class=\"audit-entry\"").count(), 11, "{page}");
    assert!(
        page.contains("&quot;agent_parallelism&quot;: 7\n"),
        "{page}"
    );
    assert!(!page.contains("audit-older"), "{page}");
    assert!(page.contains("id=\"audit-newest\""), "{page}");

    // the API pages the same way
    let all: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/environments/{env}/audit?action=token.create&limit=5",
            srv.url
        ))
        .bearer_auth(srv.admin.as_deref().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
}
