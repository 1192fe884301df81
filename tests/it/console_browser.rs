//! The web console in a real browser (headless Chromium through `browser.rs`), against a real
//! server with its schedulers and PostgreSQL: sign-in per role and what each role is
//! offered, the session cookie, approving a version and watching its deploy live, a failed
//! resource's log, settings validation, CSRF, and live updates without polling.
//! (`console_pages.rs` walks every page for axe-core and the screenshots.)

use std::time::{Duration, Instant};

use serde_json::json;
use steward::client::Client;
use steward::model::Resource;

use crate::browser::{Browser, WAIT};
use crate::console_support::encode_form;
use crate::support::{Spawned, exec_run, export_of, fs_file, wait_deployed};

pub const AGENT: &str = "localhost";

/// A real `steward server` process (its own database, schedulers, executors, the console),
/// its admin client, and a temp dir for the resources it deploys.
pub struct Fixture {
    pub srv: Spawned,
    pub admin: Client,
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub async fn start() -> Fixture {
        let secret = format!("stw_console_admin_{}", uuid::Uuid::new_v4().simple());
        let srv = Spawned::start(&secret).await;
        let admin = srv.client.clone();
        Fixture {
            srv,
            admin,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.srv.url)
    }

    pub fn admin_token(&self) -> String {
        self.srv.admin.clone()
    }

    /// A new environment of project "shop" with `settings`; its id.
    pub async fn env(&self, name: &str, settings: serde_json::Value) -> String {
        self.admin
            .create_environment("shop", name, Some(settings))
            .await
            .unwrap()
            .id
            .to_string()
    }

    /// The secret of a new token with `role` in `env`.
    pub async fn token(&self, role: &str, env: &str) -> String {
        let t = self
            .admin
            .create_token(&format!("{role} of the console test"), role, Some(env))
            .await
            .unwrap();
        t["secret"].as_str().unwrap().to_string()
    }

    /// Upload these resources as a new version; its number.
    pub async fn upload(&self, env: &str, resources: Vec<Resource>) -> i32 {
        let v = self
            .admin
            .upload(env, &export_of(resources), json!({}))
            .await
            .unwrap();
        v["number"].as_i64().unwrap() as i32
    }

    /// A file under the fixture's dir.
    pub fn file(&self, name: &str, content: &str) -> Resource {
        fs_file(
            AGENT,
            &format!("{}/{name}", self.dir.path().display()),
            content,
            &[],
        )
    }

    /// A file that fails: its parent directory does not exist.
    pub fn failing_file(&self, name: &str) -> Resource {
        fs_file(
            AGENT,
            &format!("{}/missing-dir/{name}", self.dir.path().display()),
            "never written\n",
            &[],
        )
    }

    /// `n` commands in a chain, each taking `secs`: a deploy that lasts a while.
    pub fn slow_chain(&self, n: usize, secs: f64) -> Vec<Resource> {
        let d = self.dir.path().display().to_string();
        let mut out: Vec<Resource> = vec![];
        for i in 0..n {
            let req: Vec<String> = out.last().map(|r| r.id.0.clone()).into_iter().collect();
            let req: Vec<&str> = req.iter().map(String::as_str).collect();
            out.push(exec_run(
                AGENT,
                &format!("sh -c 'sleep {secs}; echo {i} >> {d}/slow-{i}'"),
                json!({}),
                &req,
            ));
        }
        out
    }
}

/// Sign in through the sign-in page with `token`; waits until the console's home page shows.
pub async fn sign_in(b: &Browser, base: &str, token: &str) {
    b.goto(&format!("{base}/console/sign-in")).await;
    b.fill("#token", token).await;
    b.click("#sign-in").await;
    b.wait_path("/console/").await;
}

/// The session cookie's value, as the browser holds it.
pub async fn session_cookie(b: &Browser) -> String {
    b.cookies()
        .await
        .into_iter()
        .find(|c| c.name() == "steward_session")
        .map(|c| c.value().to_string())
        .expect("a steward_session cookie after sign-in")
}

/// The CSRF value of the page's forms.
pub async fn csrf_of_page(b: &Browser) -> String {
    b.find("input[type=hidden][name=csrf]")
        .await
        .prop("value")
        .await
        .unwrap()
        .expect("a csrf value")
}

/// What a role may not be offered: every control that changes something.
const CHANGE_CONTROLS: &str = "[id^=release-], [id^=reject-], [id^=rollback-], [id^=dryrun-], \
    #confirm, #deploy-now, #repair-now, #halt, #resume, #save-settings, \
    form[method=post]:not([action='/console/sign-out'])";

/// Buttons and links on the page whose text or target speaks of approving or releasing.
async fn approve_controls(b: &Browser) -> Vec<String> {
    let v = b
        .js(
            r#"return [...document.querySelectorAll('button, a, input[type=submit]')]
                 .map(e => (e.textContent || e.value || '') + ' ' + (e.getAttribute('href') || '')
                          + ' ' + ((e.form && e.form.getAttribute('action')) || ''))
                 .filter(t => /approve|release|reject|roll ?back/i.test(t)
                              && !/released/i.test(t));"#,
            vec![],
        )
        .await;
    serde_json::from_value(v).unwrap()
}

/// A viewer sees everything and is offered nothing that changes it; the session cookie is
/// HttpOnly and SameSite=Strict, scripts cannot read it, no token is in a URL; signing out
/// ends the session on the server too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewer_is_offered_no_change_and_the_cookie_is_safe() {
    let fx = Fixture::start().await;
    let env = fx.env("viewer", json!({"auto_release": false})).await;
    // a version waiting for approval: the very thing a viewer must not be offered to release
    let v = fx
        .upload(&env, vec![fx.file("a", "a\n"), fx.file("b", "b\n")])
        .await;
    let viewer = fx.token("viewer", &env).await;
    let b = Browser::start().await;

    // not signed in: every page leads to the sign-in page
    b.goto(&fx.url("/")).await;
    b.wait_path("/console/sign-in").await;
    sign_in(&b, &fx.srv.url, &viewer).await;
    assert!(
        !b.current_url().await.contains(&viewer),
        "the token is in a URL"
    );
    assert!(b.exists("#sign-out").await);

    let pages = [
        "/console/".to_string(),
        format!("/console/env/{env}"),
        format!("/console/env/{env}/versions"),
        format!("/console/env/{env}/versions/{v}"),
        format!("/console/env/{env}/resources"),
        format!("/console/env/{env}/dryruns"),
        format!("/console/env/{env}/git"),
        format!("/console/env/{env}/settings"),
    ];
    for page in &pages {
        b.goto(&fx.url(page)).await;
        assert_eq!(b.client.current_url().await.unwrap().path(), page.as_str());
        assert_eq!(b.status().await, 200, "{page}: {}", b.text("main").await);
        let offered: Vec<String> = {
            let mut ids = vec![];
            for e in b.find_all(CHANGE_CONTROLS).await {
                ids.push(e.html(false).await.unwrap_or_default());
            }
            ids
        };
        assert!(offered.is_empty(), "{page} offers a viewer: {offered:?}");
        let approve = approve_controls(&b).await;
        assert!(approve.is_empty(), "{page} offers a viewer: {approve:?}");
    }
    // the audit log is for administrators, as in the API
    b.goto(&fx.url(&format!("/console/env/{env}/audit"))).await;
    assert_eq!(b.status().await, 403, "{}", b.text("main").await);

    // the versions page lists the waiting version all the same
    b.goto(&fx.url(&format!("/console/env/{env}/versions")))
        .await;
    assert!(b.exists(&format!("#version-{v}")).await);

    // nor does the server let a viewer do it by hand: the confirm page is refused, and so is
    // the change posted with the session's own cookie and CSRF value
    b.goto(&fx.url(&format!("/console/env/{env}/versions/{v}/confirm/release")))
        .await;
    assert_eq!(b.status().await, 403, "{}", b.text("main").await);
    assert!(!b.exists("#confirm").await);
    b.goto(&fx.url(&format!("/console/env/{env}/versions")))
        .await;
    let csrf = csrf_of_page(&b).await;
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(fx.url(&format!("/console/env/{env}/versions/{v}/release")))
        .header(
            "cookie",
            format!("steward_session={}", session_cookie(&b).await),
        )
        .header("origin", fx.srv.url.clone())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode_form(&[("csrf", &csrf), ("comment", "by hand")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a viewer released a version");
    assert!(fx.admin.version(&env, v).await.unwrap()["released_at"].is_null());

    // the cookie: HttpOnly, SameSite=Strict, not visible to scripts
    let cookies = b.cookies().await;
    let session = cookies
        .iter()
        .find(|c| c.name() == "steward_session")
        .unwrap_or_else(|| panic!("no steward_session cookie: {cookies:?}"));
    assert_eq!(session.http_only(), Some(true), "{session:?}");
    assert!(
        session.same_site().is_some_and(|s| s.is_strict()),
        "{session:?}"
    );
    assert!(
        !b.document_cookie().await.contains("steward_session"),
        "scripts can read the session cookie"
    );
    assert!(
        !session.value().contains(&viewer),
        "the cookie holds the token itself"
    );
    let secret = session.value().to_string();

    // sign out: back to the sign-in page, the console closed to this browser …
    b.click("#sign-out").await;
    b.wait_path("/console/sign-in").await;
    b.goto(&fx.url(&format!("/console/env/{env}"))).await;
    b.wait_path("/console/sign-in").await;
    // … and the old cookie dead on the server (a copy of it opens nothing)
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = http
        .get(fx.url(&format!("/console/env/{env}")))
        .header("cookie", format!("steward_session={secret}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_redirection(), "{}", r.status());
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/console/sign-in"),
        "{:?}",
        r.headers()
    );
    b.close().await;
}

/// An approver releases a version waiting for approval on the confirm page, and the
/// environment page's progress bar climbs to 100 % by itself: the page is never reloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approver_releases_and_watches_the_deploy_live() {
    let fx = Fixture::start().await;
    let env = fx.env("approve", json!({"auto_release": false})).await;
    // four commands of 0.7 s in a chain: a deploy of about three seconds to watch
    let v = fx.upload(&env, fx.slow_chain(4, 0.7)).await;
    let approver = fx.token("approver", &env).await;
    let b = Browser::start().await;
    sign_in(&b, &fx.srv.url, &approver).await;

    // the home page links the environment
    let link = b.find("a.env-link").await;
    link.click().await.unwrap();
    b.wait_path(&format!("/console/env/{env}")).await;

    // the versions page offers the release; it asks first, then does it
    b.goto(&fx.url(&format!("/console/env/{env}/versions")))
        .await;
    b.click(&format!("a#release-{v}")).await;
    let confirm = b.wait_for("#confirm").await;
    let asked = b.text("main").await;
    assert!(
        asked.contains(&v.to_string()),
        "the confirm page does not say which version: {asked}"
    );
    assert!(
        fx.admin.version(&env, v).await.unwrap()["released_at"].is_null(),
        "released before confirming"
    );
    confirm.click().await.unwrap();
    crate::support::eventually(10, "the version to be released", || async {
        let info = fx.admin.version(&env, v).await.unwrap();
        (!info["released_at"].is_null()).then_some(())
    })
    .await;

    // the environment page, opened while the deploy runs, follows it to the end
    b.goto(&fx.url(&format!("/console/env/{env}"))).await;
    let mark = b.mark_document().await;
    let first = b.text("#progress-text").await;
    let started = Instant::now();
    b.wait_until(
        "the progress bar at 100 %",
        Duration::from_secs(30),
        || async {
            let v = b
                .client
                .execute(
                    "return [document.getElementById('deploy-progress').value, \
                     document.getElementById('progress-text').textContent.trim()];",
                    vec![],
                )
                .await
                .map_err(|e| e.to_string())?;
            if v == json!([100, "100 %"]) {
                Ok(())
            } else {
                Err(v.to_string())
            }
        },
    )
    .await;
    assert!(
        b.same_document(&mark).await,
        "the page was reloaded or left to show the progress"
    );
    assert_ne!(
        first, "100 %",
        "the deploy was over before the page showed it: nothing live was watched"
    );
    let p = wait_deployed(&fx.admin, &env, v, 30).await;
    assert_eq!(p["by_status"]["deployed"], 4, "{p}");
    let counts = b.text("#state-counts").await;
    assert!(counts.contains("deployed 4"), "{counts}");
    eprintln!(
        "progress went from {first} to 100 % live in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    b.close().await;
}

/// A failed resource, found from the resources page (filtered to failures), shows the
/// handler's log line saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_resource_shows_its_log_line() {
    let fx = Fixture::start().await;
    let env = fx
        .env(
            "failing",
            // no retries during the test
            json!({"retry_backoff": {"initial": 3600, "factor": 1.0, "max": 3600}}),
        )
        .await;
    let bad = fx.failing_file("conf");
    let bad_id = bad.id.0.clone();
    let v = fx.upload(&env, vec![fx.file("ok", "ok\n"), bad]).await;
    let p = wait_deployed(&fx.admin, &env, v, 30).await;
    assert_eq!(p["by_status"]["failed"], 1, "{p}");
    // what the API says the handler logged
    let actions = fx.admin.actions(&env, Some(&bad_id), 10).await.unwrap();
    let logged: Vec<String> = actions
        .iter()
        .flat_map(|a| a.messages.as_array().cloned().unwrap_or_default())
        .filter_map(|m| m["message"].as_str().map(str::to_string))
        .collect();
    assert!(!logged.is_empty(), "{actions:?}");

    let viewer = fx.token("viewer", &env).await;
    let b = Browser::start().await;
    sign_in(&b, &fx.srv.url, &viewer).await;
    b.goto(&fx.url(&format!("/console/env/{env}/resources?state=failed")))
        .await;
    let rows = b.find_all("tr.resource-row").await;
    assert_eq!(
        rows.len(),
        1,
        "one failed resource: {}",
        b.text("main").await
    );
    let link = b.find("tr.resource-row a.resource-link").await;
    assert!(
        link.text().await.unwrap().contains("missing-dir/conf"),
        "{}",
        link.text().await.unwrap()
    );
    link.click().await.unwrap();
    b.wait_for("#action-log .log-line").await;
    let lines: Vec<String> = {
        let mut t = vec![];
        for e in b.find_all("#action-log .log-line").await {
            t.push(e.text().await.unwrap());
        }
        t
    };
    assert!(
        logged.iter().any(|m| lines.iter().any(|l| l.contains(m))),
        "the page's log lines {lines:?} do not show what the handler logged: {logged:?}"
    );
    let page = b.text("main").await;
    assert!(page.contains("failed"), "{page}");
    b.close().await;
}

/// An admin types a bad value into the settings form: the page says what is wrong (an
/// alert), keeps what was typed, and nothing is changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_setting_is_refused_on_the_page() {
    let fx = Fixture::start().await;
    let env = fx.env("settings", json!({})).await;
    let b = Browser::start().await;
    sign_in(&b, &fx.srv.url, &fx.admin_token()).await;
    let settings_url = fx.url(&format!("/console/env/{env}/settings"));

    for (bad, says) in [("0", "agent_parallelism"), ("many", "not a number")] {
        b.goto(&settings_url).await;
        b.fill("[name=agent_parallelism]", bad).await;
        b.click("#save-settings").await;
        let error = b.wait_for("#form-error").await;
        let text = error.text().await.unwrap();
        assert!(text.contains(says), "{bad}: the error says {text:?}");
        assert_eq!(
            error.attr("role").await.unwrap().as_deref(),
            Some("alert"),
            "the error is announced"
        );
        let kept = b
            .find("[name=agent_parallelism]")
            .await
            .prop("value")
            .await
            .unwrap();
        assert_eq!(kept.as_deref(), Some(bad), "what was typed is kept");
        let now = fx.admin.settings(&env).await.unwrap();
        assert_eq!(now["agent_parallelism"], 1, "{now}");
    }

    // a good value goes through
    b.goto(&settings_url).await;
    b.fill("[name=agent_parallelism]", "4").await;
    b.click("#save-settings").await;
    b.wait_until("the setting saved", WAIT, || async {
        let s = fx.admin.settings(&env).await.map_err(|e| e.to_string())?;
        if s["agent_parallelism"] == 4 {
            Ok(())
        } else {
            Err(s["agent_parallelism"].to_string())
        }
    })
    .await;
    assert!(!b.exists("#form-error").await);
    b.close().await;
}

/// A change posted with the session cookie but without the form's CSRF value (as another
/// site could make a browser send it) is refused with 403 and changes nothing; the same post
/// with the value goes through, so it was the value that was missing. The cookie alone does
/// not open the REST API either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_without_the_csrf_value_is_refused() {
    let fx = Fixture::start().await;
    let env = fx.env("csrf", json!({})).await;
    let b = Browser::start().await;
    sign_in(&b, &fx.srv.url, &fx.admin_token()).await;
    b.goto(&fx.url(&format!("/console/env/{env}/settings")))
        .await;
    let cookie = format!("steward_session={}", session_cookie(&b).await);
    let csrf = csrf_of_page(&b).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let post = |path: String, form: Vec<(&'static str, String)>| {
        http.post(fx.url(&path))
            .header("cookie", cookie.clone())
            .header("origin", fx.srv.url.clone())
            .header("content-type", "application/x-www-form-urlencoded")
            .body(encode_form(
                &form
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect::<Vec<_>>(),
            ))
            .send()
    };
    let settings = format!("/console/env/{env}/settings");
    let halt = format!("/console/env/{env}/control/halt");

    for (what, form) in [
        ("no csrf", vec![("agent_parallelism", "7".to_string())]),
        (
            "a wrong csrf",
            vec![
                ("csrf", "0".repeat(csrf.len())),
                ("agent_parallelism", "7".into()),
            ],
        ),
        (
            "an empty csrf",
            vec![("csrf", String::new()), ("agent_parallelism", "7".into())],
        ),
    ] {
        let r = post(settings.clone(), form.clone()).await.unwrap();
        assert_eq!(r.status(), 403, "settings with {what}");
        let r = post(halt.clone(), form).await.unwrap();
        assert_eq!(r.status(), 403, "halt with {what}");
    }
    assert_eq!(
        fx.admin.settings(&env).await.unwrap()["agent_parallelism"],
        1
    );
    assert_eq!(fx.admin.environment(&env).await.unwrap()["halted"], false);

    // the cookie is no API credential
    let r = http
        .post(fx.url(&format!("/api/v1/environments/{env}/halt")))
        .header("cookie", cookie.clone())
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the API took the session cookie");

    // with the page's value the same post goes through
    let r = post(
        settings.clone(),
        vec![("csrf", csrf.clone()), ("agent_parallelism", "7".into())],
    )
    .await
    .unwrap();
    assert!(r.status().is_redirection(), "{}", r.status());
    assert_eq!(
        fx.admin.settings(&env).await.unwrap()["agent_parallelism"],
        7
    );
    b.close().await;
}

/// The environment page follows the server: a change (a new version released through the
/// API) shows within a second without a reload; an idle page requests nothing (the event
/// stream is one long request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_page_is_pushed_to_and_idles_quietly() {
    let fx = Fixture::start().await;
    let env = fx.env("live", json!({})).await;
    let v1 = fx.upload(&env, vec![fx.file("one", "1\n")]).await;
    wait_deployed(&fx.admin, &env, v1, 30).await;
    let b = Browser::start().await;
    sign_in(&b, &fx.srv.url, &fx.admin_token()).await;
    b.goto(&fx.url(&format!("/console/env/{env}"))).await;
    let mark = b.mark_document().await;
    assert_eq!(b.text("#progress-text").await, "100 %");

    // idle: no request at all for three seconds
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = b.resource_requests().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = b.resource_requests().await;
    assert_eq!(
        before, after,
        "an idle page made requests (polling?): before {before:?}, after {after:?}"
    );

    // a change reaches the open page within a second
    let mut lags = vec![];
    for (i, resources) in [
        vec![fx.file("one", "1\n"), fx.file("two", "2\n")],
        vec![
            fx.file("one", "1\n"),
            fx.file("two", "2\n"),
            fx.file("three", "3\n"),
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let v = fx.upload(&env, resources).await;
        let sent = Instant::now();
        b.wait_until(
            &format!("version {v} shown live"),
            Duration::from_secs(5),
            || async {
                let t = b
                    .client
                    .execute(
                        "return document.getElementById('live-version').textContent.trim();",
                        vec![],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if t == json!(v.to_string()) {
                    Ok(())
                } else {
                    Err(t.to_string())
                }
            },
        )
        .await;
        let lag = sent.elapsed();
        lags.push(lag);
        assert!(
            lag < Duration::from_secs(1),
            "change {i}: version {v} reached the page after {lag:?}"
        );
        wait_deployed(&fx.admin, &env, v, 30).await;
        b.wait_text("#progress-text", "100 %").await;
    }
    assert!(b.same_document(&mark).await, "the page was reloaded");
    eprintln!("changes reached the page after {lags:?}");

    // and a halt through the API shows as well
    fx.admin.set_halted(&env, true).await.unwrap();
    let sent = Instant::now();
    b.wait_text("#live", "halted").await;
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "the halt reached the page after {:?}",
        sent.elapsed()
    );
    assert!(b.same_document(&mark).await, "the page was reloaded");
    b.close().await;
}
