//! Every console page in a real browser, from a seeded server (two environments: one pushed
//! to, with several versions, failed and skipped resources, a version waiting for approval
//! and a dry-run; one following a git repository, with a good and a broken commit): each page
//! answers, has no serious or critical axe-core violation, does not overflow a phone's width,
//! and is photographed (into `docs/console/`, which the README and docs/console.md show, when
//! run with `STEWARD_SCREENSHOTS=1`).

use std::time::Duration;

use serde_json::json;

use crate::browser::{Browser, Violation, describe};
use crate::console_browser::{Fixture, sign_in};
use crate::gitops_support::{Repo, compiled, follow};
use crate::support::wait_deployed;

/// What a walk over the pages found wrong, page by page; reported all at once at the end.
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
    pages: Vec<String>,
}

impl Findings {
    fn report(&self) -> String {
        format!(
            "{} problem(s) on the {} pages checked ({}):\n\n{}",
            self.problems.len(),
            self.pages.len(),
            self.pages.join(", "),
            self.problems.join("\n")
        )
    }
}

/// Check the page the browser shows now as `name`: its HTTP status is `status`, axe finds
/// nothing serious, and take its picture.
async fn check(b: &Browser, name: &str, status: u16, found: &mut Findings) {
    found.pages.push(name.to_string());
    let url = b.current_url().await;
    let got = b.status().await;
    if got != status {
        found.problems.push(format!(
            "{name} ({url}): HTTP {got}, expected {status}: {}",
            b.text("main").await.chars().take(200).collect::<String>()
        ));
        // no picture of a page that is not there
        return;
    }
    let violations: Vec<Violation> = b.axe().await;
    if !violations.is_empty() {
        found.problems.push(format!(
            "{name} ({url}): axe-core finds\n{}",
            describe(&violations)
        ));
    }
    b.screenshot(name).await;
}

/// Follow the first link `css` of the page (a problem when there is none) and check where
/// it leads as `name`.
async fn follow_link(b: &Browser, css: &str, name: &str, found: &mut Findings) {
    let from = b.current_url().await;
    let Some(link) = b.find_all(css).await.into_iter().next() else {
        found.pages.push(name.to_string());
        found
            .problems
            .push(format!("{name}: no link `{css}` on {from}"));
        return;
    };
    link.click().await.unwrap();
    b.wait_until(
        &format!("{name} to open"),
        Duration::from_secs(10),
        || async {
            let u = b.client.current_url().await.map_err(|e| e.to_string())?;
            if u.as_str() == from {
                Err(u.to_string())
            } else {
                Ok(())
            }
        },
    )
    .await;
    check(b, name, 200, found).await;
}

/// Go to `path` and check it.
async fn visit(b: &Browser, fx: &Fixture, path: &str, name: &str, found: &mut Findings) {
    b.goto(&fx.url(path)).await;
    check(b, name, 200, found).await;
}

/// The seeded server: environment ids (pushed, git) and the waiting version.
async fn seed(fx: &Fixture, repo: &Repo) -> (String, String, i32) {
    let env = fx
        .env(
            "production",
            json!({"retry_backoff": {"initial": 3600, "factor": 1.0, "max": 3600}}),
        )
        .await;
    let site = |i: usize| fx.file(&format!("site{i}.conf"), &format!("port = {}\n", 8000 + i));
    // v1: five files; v2: one changed, one added, one failing and one that needs it
    let v1 = fx.upload(&env, (0..5).map(site).collect()).await;
    wait_deployed(&fx.admin, &env, v1, 60).await;
    let bad = fx.failing_file("cache.conf");
    let bad_id = bad.id.0.clone();
    let after = crate::support::fs_file(
        crate::console_browser::AGENT,
        &format!("{}/after-cache.conf", fx.dir.path().display()),
        "needs the cache\n",
        &[&bad.id.0],
    );
    let mut two: Vec<_> = (0..6).map(site).collect();
    two[1] = fx.file("site1.conf", "port = 9001\n");
    two.push(bad);
    two.push(after);
    let v2 = fx.upload(&env, two.clone()).await;
    wait_deployed(&fx.admin, &env, v2, 60).await;
    // a parameter, and facts of the failing file (the resource page shown)
    fx.admin
        .set_parameter(&env, "region", None, &json!({"value": "eu-west"}))
        .await
        .unwrap();
    for (name, value) in [
        (
            "checksum",
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        ),
        ("owner", "www-data"),
    ] {
        fx.admin
            .set_parameter(&env, name, Some(&bad_id), &json!({"value": value}))
            .await
            .unwrap();
    }
    // v3 waits for an approver
    fx.admin
        .update_settings(&env, &json!({"auto_release": false}))
        .await
        .unwrap();
    two[0] = fx.file("site0.conf", "port = 9000\n");
    let v3 = fx.upload(&env, two).await;
    let dryrun = fx.admin.start_dryrun(&env, Some(v3)).await.unwrap();
    let dryrun_id = dryrun["id"].as_str().unwrap().to_string();
    crate::support::eventually(30, "the dry-run to finish", || async {
        let d = fx.admin.dryrun(&env, &dryrun_id).await.ok()?;
        (d["complete"] == true).then_some(())
    })
    .await;

    // a git environment: a good commit, then one that does not compile
    let git_env = follow(&fx.admin, "staging", repo, json!({})).await;
    let good = repo.commit(&repo.model(&[("index.html", "hello")], ""), "first site");
    repo.push_ok();
    fx.admin.trigger_compile(&git_env, None).await.unwrap();
    compiled(&fx.admin, &git_env, &good, 60).await;
    // a pull request's preview, run by hand
    crate::gitops_support::git_ok(&repo.work, &["checkout", "-q", "-b", "feature"]);
    repo.commit(
        &repo.model(&[("index.html", "hello, world")], ""),
        "a longer greeting",
    );
    crate::gitops_support::git_ok(&repo.work, &["push", "-q", "origin", "HEAD:feature"]);
    crate::gitops_support::git_ok(&repo.work, &["checkout", "-q", "main"]);
    let q = fx
        .admin
        .preview_run(&git_env, "refs/heads/feature", None)
        .await
        .unwrap();
    let preview = q["preview"].as_str().unwrap().to_string();
    crate::support::eventually(60, "the preview", || async {
        let p = fx.admin.preview(&git_env, &preview).await.ok()?;
        (p["run"]["status"] == "success").then_some(())
    })
    .await;
    let broken = repo.commit(
        &repo.model(&[("index.html", "hello")], "fs::File(host=host, path=1)\n"),
        "a typo",
    );
    repo.push_ok();
    fx.admin.trigger_compile(&git_env, None).await.unwrap();
    compiled(&fx.admin, &git_env, &broken, 60).await;
    (env, git_env, v3)
}

/// Every page: axe-core finds no serious or critical violation, each answers as it should,
/// none overflows a phone's width; the pictures land in docs/console/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_is_accessible_and_photographed() {
    let fx = Fixture::start().await;
    let repo = Repo::new();
    let (env, git_env, waiting) = seed(&fx, &repo).await;
    let b = Browser::start().await;
    let mut found = Findings::default();

    b.goto(&fx.url("/console/sign-in")).await;
    check(&b, "sign-in", 200, &mut found).await;
    b.fill("#token", "stw_not_a_token").await;
    b.click("#sign-in").await;
    b.wait_for("#form-error").await;
    check(&b, "sign-in-refused", 401, &mut found).await;
    sign_in(&b, &fx.srv.url, &fx.admin_token()).await;

    visit(&b, &fx, "/console/", "environments", &mut found).await;
    let e = format!("/console/env/{env}");
    visit(&b, &fx, &e, "environment", &mut found).await;
    visit(&b, &fx, &format!("{e}/versions"), "versions", &mut found).await;
    // a version's page, the diff of two versions, and the confirm page of a release
    let versions = format!("{e}/versions");
    let version_link = format!("#version-{waiting} a[href$='/versions/{waiting}']");
    let release_link = format!("a#release-{waiting}");
    for (css, name) in [
        (version_link.as_str(), "version"),
        (release_link.as_str(), "confirm-release"),
    ] {
        b.goto(&fx.url(&versions)).await;
        follow_link(&b, css, name, &mut found).await;
    }
    visit(
        &b,
        &fx,
        &format!("{e}/diff?from=1&to={waiting}"),
        "version-diff",
        &mut found,
    )
    .await;

    visit(&b, &fx, &format!("{e}/resources"), "resources", &mut found).await;
    visit(
        &b,
        &fx,
        &format!("{e}/resources?state=failed"),
        "resources-failed",
        &mut found,
    )
    .await;
    follow_link(
        &b,
        "tr.resource-row a.resource-link",
        "resource",
        &mut found,
    )
    .await;
    visit(&b, &fx, &format!("{e}/dryruns"), "dryruns", &mut found).await;
    follow_link(&b, "main a[href*='/dryruns/']", "dryrun", &mut found).await;
    visit(&b, &fx, &format!("{e}/audit"), "audit", &mut found).await;
    visit(&b, &fx, &format!("{e}/settings"), "settings", &mut found).await;
    b.fill("[name=agent_parallelism]", "0").await;
    b.click("#save-settings").await;
    b.wait_for("#form-error").await;
    check(&b, "settings-refused", 400, &mut found).await;
    visit(
        &b,
        &fx,
        &format!("{e}/parameters"),
        "parameters",
        &mut found,
    )
    .await;
    visit(
        &b,
        &fx,
        &format!("{e}/parameters/value?name=region"),
        "parameter-value",
        &mut found,
    )
    .await;

    let g = format!("/console/env/{git_env}");
    visit(&b, &fx, &g, "environment-git", &mut found).await;
    visit(&b, &fx, &format!("{g}/git"), "git", &mut found).await;
    follow_link(
        &b,
        "main a[href*='/compiles/']",
        "compile-report",
        &mut found,
    )
    .await;
    visit(&b, &fx, &format!("{g}/previews"), "previews", &mut found).await;
    follow_link(&b, "main a[href*='/previews/']", "preview", &mut found).await;

    b.goto(&fx.url("/console/no/such/page")).await;
    check(&b, "not-found", 404, &mut found).await;

    // a phone's width: nothing wider than the screen (tables scroll inside their wrapper)
    b.client.set_window_size(390, 844).await.unwrap();
    for (path, name) in [
        ("/console/".to_string(), "environments"),
        (e.clone(), "environment"),
        (format!("{e}/versions"), "versions"),
        (format!("{e}/resources"), "resources"),
        (format!("{e}/settings"), "settings"),
        (format!("{e}/parameters"), "parameters"),
    ] {
        b.goto(&fx.url(&path)).await;
        let (doc, win) = widths(&b).await;
        if doc > win {
            let wide = b
                .js(
                    r#"const w = document.documentElement.clientWidth;
                       const scrolls = e => ['auto', 'scroll', 'hidden']
                         .includes(getComputedStyle(e).overflowX);
                       // an absolutely positioned element escapes a scroller that is not its
                       // containing block (position: static)
                       const inScroller = e => {
                         const abs = ['absolute', 'fixed'].includes(getComputedStyle(e).position);
                         for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
                           const st = getComputedStyle(p).position;
                           if (scrolls(p) && (!abs || st !== 'static')) return true;
                           if (abs && st !== 'static') return false;
                         }
                         return false;
                       };
                       return [...document.querySelectorAll('body *')]
                         .filter(e => e.getBoundingClientRect().right > w + 1 && !inScroller(e))
                         .slice(-5)
                         .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')
                                   + (e.className ? '.' + String(e.className).split(' ').join('.') : '')
                                   + ' ' + Math.round(e.getBoundingClientRect().right) + 'px');"#,
                    vec![],
                )
                .await;
            found.problems.push(format!(
                "{name} at phone width: the page is {doc} px wide in a {win} px window; \
                 too wide: {wide}"
            ));
        }
        if name == "environment" {
            b.screenshot("environment-phone").await;
        }
    }

    assert!(found.problems.is_empty(), "{}", found.report());
    b.close().await;
}

async fn widths(b: &Browser) -> (u64, u64) {
    let v = b
        .js(
            // clientWidth: the window without its scroll bar
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];",
            vec![],
        )
        .await;
    (v[0].as_u64().unwrap(), v[1].as_u64().unwrap())
}
