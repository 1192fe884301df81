//! The web console's boundaries, over real HTTP against a real server: sessions, CSRF, the
//! role of the token deciding what a page offers and what a change may do, security headers,
//! every console route behind a session, and live updates pushed to an open page.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::console_support::{ConsoleSession, csrf_in, encode_form, http, sign_in_raw};
use crate::support::{TestServer, exec_run, export_of, fs_file};

/// An environment and a token of each role in it.
struct Setup {
    server: TestServer,
    env: String,
    tokens: Vec<(&'static str, String)>,
}

async fn setup(server: TestServer, settings: serde_json::Value) -> Setup {
    let admin = server.admin_client();
    let env = admin
        .create_environment("shop", "prod", Some(settings))
        .await
        .unwrap();
    let env_id = env.id.to_string();
    let mut tokens = Vec::new();
    for role in ["viewer", "compiler", "approver", "admin", "agent"] {
        let t = admin
            .create_token(&format!("{role} of prod"), role, Some(&env_id))
            .await
            .unwrap();
        tokens.push((role, t["secret"].as_str().unwrap().to_string()));
    }
    Setup {
        server,
        env: env_id,
        tokens,
    }
}

impl Setup {
    fn token(&self, role: &str) -> &str {
        &self.tokens.iter().find(|(r, _)| *r == role).unwrap().1
    }

    async fn session(&self, role: &str) -> ConsoleSession {
        ConsoleSession::sign_in(&self.server.url, self.token(role)).await
    }

    async fn halted(&self) -> bool {
        let e = self
            .server
            .admin_client()
            .environment(&self.env)
            .await
            .unwrap();
        e["halted"].as_bool().unwrap()
    }
}

#[tokio::test]
async fn signing_in_and_out() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let base = &s.server.url;

    // the cookie: HttpOnly (scripts can not read it), SameSite=Strict, for the whole site
    let viewer = s.session("viewer").await;
    let flags: Vec<&str> = viewer.set_cookie.split(';').map(str::trim).collect();
    assert!(flags.contains(&"HttpOnly"), "{}", viewer.set_cookie);
    assert!(flags.contains(&"SameSite=Strict"), "{}", viewer.set_cookie);
    assert!(flags.contains(&"Path=/"), "{}", viewer.set_cookie);
    assert!(
        !viewer.set_cookie.contains(s.token("viewer")),
        "the token is not the cookie"
    );
    let (status, html) = viewer.page("/console/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("shop / prod"), "{html}");
    assert!(
        html.contains("viewer of prod"),
        "the page says who is signed in"
    );

    // refusals say why, on the sign-in page
    let r = sign_in_raw(base, "stw_not_a_token").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let html = r.text().await.unwrap();
    assert!(html.contains("unknown or revoked"), "{html}");
    assert!(html.contains("id=\"form-error\""), "{html}");
    let r = sign_in_raw(base, s.token("agent")).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("Agent tokens"));
    let r = sign_in_raw(base, "").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // a sign-in posted from another site is refused (login CSRF)
    let r = http()
        .post(format!("{base}/console/sign-in"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode_form(&[("token", s.token("viewer"))]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.headers().get("set-cookie").is_none());

    // after sign-in the browser goes back where it was, never off-site
    let r = http()
        .post(format!("{base}/console/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode_form(&[
            ("token", s.token("viewer")),
            ("next", "https://evil.example/"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["location"], "/console/");
    // nor to a "next" that could not be a Location header (a control character): the
    // sign-in still works, to the console's start
    for next in [
        "/console/env/x\n",
        "/console/\u{1}",
        "/console/\r\nSet-Cookie: a=b",
    ] {
        let r = http()
            .post(format!("{base}/console/sign-in"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(encode_form(&[("token", s.token("viewer")), ("next", next)]))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "next {next:?}");
        assert_eq!(r.headers()["location"], "/console/", "next {next:?}");
    }

    // sign-out ends the session on the server, not only in the browser
    let r = viewer.post_with_csrf("/console/sign-out", &[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0"),
        "the cookie is cleared"
    );
    let r = viewer.get("/console/").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        r.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/console/sign-in")
    );
}

#[tokio::test]
async fn revoking_the_token_ends_its_sessions() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let admin = s.server.admin_client();
    let approver = s.session("approver").await;
    assert_eq!(approver.page("/console/").await.0, StatusCode::OK);
    let mut live = approver
        .get(&format!("/console/env/{}/events", s.env))
        .await;
    assert_eq!(live.status(), StatusCode::OK);
    // the page's first document, computed while the session was good
    let mut first = String::new();
    while !first.contains("\n\n") {
        let b = tokio::time::timeout(Duration::from_secs(5), live.chunk())
            .await
            .expect("a first document")
            .unwrap()
            .unwrap();
        first.push_str(&String::from_utf8_lossy(&b));
    }
    assert!(first.contains("\"halted\":false"), "{first}");
    let tokens = admin.tokens(Some(&s.env), false).await.unwrap();
    let id = tokens
        .iter()
        .find(|t| t.name == "approver of prod")
        .unwrap()
        .id;
    admin.revoke_token(&id.to_string()).await.unwrap();
    // an open live page hears nothing more of the environment once something changes
    admin.set_halted(&s.env, true).await.unwrap();
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !text.contains("event: signed-out") && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), live.chunk()).await {
            Ok(Ok(Some(b))) => text.push_str(&String::from_utf8_lossy(&b)),
            _ => break,
        }
    }
    assert!(text.contains("event: signed-out"), "{text}");
    assert!(
        !text.contains("\"halted\":true"),
        "a revoked session saw the change: {text}"
    );
    let r = approver.get("/console/").await;
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "a revoked token's session is over"
    );
    let r = approver.post("/console/sign-out", &[("csrf", "x")]).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// The routes the console declares, read from its sources, so that a route added later is
/// checked too.
fn console_routes() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/server");
    let mut files = vec![dir.join("console.rs")];
    for e in std::fs::read_dir(dir.join("console")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    let re = regex::Regex::new(r#"\.route\(\s*"([^"]+)""#).unwrap();
    let mut routes = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for c in re.captures_iter(&text) {
            routes.push(c[1].to_string());
        }
    }
    assert!(
        routes.len() >= 8,
        "the console's routes were not found: {routes:?}"
    );
    routes
}

/// Paths that need no session: the way in, its assets, and redirects to it.
const PUBLIC: &[&str] = &[
    "/",
    "/console",
    "/console/sign-in",
    "/console/static/{name}",
    // any other address under /console/: a not-found page, nothing else
    "/console/{*rest}",
];

#[tokio::test]
async fn every_console_route_needs_a_session() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let client = http();
    let mut checked = 0;
    let re = regex::Regex::new(r"\{[^}]+\}").unwrap();
    for route in console_routes() {
        if PUBLIC.contains(&route.as_str()) {
            continue;
        }
        let path = re
            .replace_all(&route, |c: &regex::Captures| match &c[0] {
                "{env}" => s.env.clone(),
                "{*rest}" => "anything/here".into(),
                p if p.contains("id") => uuid::Uuid::new_v4().to_string(),
                "{n}" | "{number}" | "{version}" => "1".into(),
                _ => "deploy".into(),
            })
            .to_string();
        let url = format!("{}{path}", s.server.url);
        let get = client.get(&url).send().await.unwrap();
        match get.status() {
            StatusCode::SEE_OTHER => {
                let to = get.headers()["location"].to_str().unwrap().to_string();
                assert!(to.starts_with("/console/sign-in"), "GET {path} → {to}");
            }
            StatusCode::METHOD_NOT_ALLOWED => {}
            other => panic!("GET {path} without a session answered {other}"),
        }
        // a change without a session changes nothing and says so
        let post = client
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(encode_form(&[("csrf", "x")]))
            .send()
            .await
            .unwrap();
        assert!(
            matches!(
                post.status(),
                StatusCode::UNAUTHORIZED | StatusCode::METHOD_NOT_ALLOWED
            ),
            "POST {path} without a session answered {}",
            post.status()
        );
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} routes checked");
    assert!(!s.halted().await);
    // a session cookie that is not one is no session
    let r = client
        .get(format!("{}/console/", s.server.url))
        .header("cookie", "steward_session=stw_forged")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn the_role_decides_what_a_page_offers_and_what_a_change_may_do() {
    let s = setup(TestServer::start_deploying().await, json!({})).await;
    let path = format!("/console/env/{}", s.env);
    for role in ["viewer", "compiler", "approver", "admin"] {
        let session = s.session(role).await;
        let (status, html) = session.page(&path).await;
        assert_eq!(status, StatusCode::OK, "{role}: {html}");
        let manage = role == "admin";
        assert_eq!(html.contains("id=\"halt\""), manage, "{role}: halt button");
        assert_eq!(
            html.contains("id=\"deploy-now\""),
            manage,
            "{role}: deploy button"
        );
        let (_, settings) = session.page(&format!("{path}/settings")).await;
        assert_eq!(
            settings.contains("id=\"save-settings\""),
            manage,
            "{role}: settings form"
        );
        // the change itself, with a valid CSRF value: only the admin may
        let r = session
            .post_with_csrf(&format!("{path}/control/halt"), &[])
            .await;
        if manage {
            assert_eq!(r.status(), StatusCode::SEE_OTHER, "{role}");
            assert!(s.halted().await);
            let r = session
                .post_with_csrf(&format!("{path}/control/resume"), &[])
                .await;
            assert_eq!(r.status(), StatusCode::SEE_OTHER);
            assert!(!s.halted().await);
        } else {
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{role}");
            let html = r.text().await.unwrap();
            assert!(html.contains(&format!("a {role} token may not")), "{html}");
            assert!(!s.halted().await, "{role} halted the environment");
        }
        let r = session
            .post_with_csrf(&format!("{path}/settings"), &[("agent_parallelism", "3")])
            .await;
        assert_eq!(
            r.status(),
            if manage {
                StatusCode::SEE_OTHER
            } else {
                StatusCode::FORBIDDEN
            },
            "{role}: settings"
        );
    }
    // a token of another environment sees nothing of this one
    let admin = s.server.admin_client();
    let other = admin
        .create_environment("shop", "test", Some(json!({})))
        .await
        .unwrap();
    let t = admin
        .create_token("viewer of test", "viewer", Some(&other.id.to_string()))
        .await
        .unwrap();
    let outsider = ConsoleSession::sign_in(&s.server.url, t["secret"].as_str().unwrap()).await;
    let (_, list) = outsider.page("/console/").await;
    assert!(
        list.contains("shop / test") && !list.contains("shop / prod"),
        "{list}"
    );
    let (status, _) = outsider.page(&path).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_change_without_this_sessions_csrf_value_is_refused() {
    let s = setup(TestServer::start_deploying().await, json!({})).await;
    let admin = s.session("admin").await;
    let other = s.session("admin").await;
    let halt = format!("/console/env/{}/control/halt", s.env);
    let r = admin.post(&halt, &[]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("CSRF"));
    let r = admin.post(&halt, &[("csrf", "stw_guess")]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // another session's value is not this one's
    let theirs = other.csrf().await;
    assert_ne!(theirs, admin.csrf().await);
    let r = admin.post(&halt, &[("csrf", theirs.as_str())]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!s.halted().await, "nothing changed");
    let r = admin.post_with_csrf(&halt, &[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(s.halted().await);
}

#[tokio::test]
async fn a_bad_setting_is_shown_with_the_apis_reason_and_changes_nothing() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let admin = s.session("admin").await;
    let path = format!("/console/env/{}/settings", s.env);
    let (_, html) = admin.page(&path).await;
    let csrf = csrf_in(&html).unwrap();
    // the real form sends every field; send them all, one changed to a bad value
    let before = s.server.admin_client().settings(&s.env).await.unwrap();
    let mut form: Vec<(String, String)> = vec![("csrf".into(), csrf.clone())];
    for (k, v) in before.as_object().unwrap() {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Bool(true) => "true".into(),
            serde_json::Value::Bool(false) => continue,
            other => other.to_string(),
        };
        form.push((k.clone(), text));
    }
    let set = |form: &mut Vec<(String, String)>, key: &str, value: &str| {
        form.iter_mut().find(|(k, _)| k == key).unwrap().1 = value.to_string();
    };
    set(&mut form, "agent_parallelism", "0");
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = admin.post(&path, &pairs).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let html = r.text().await.unwrap();
    assert!(html.contains("id=\"form-error\""), "{html}");
    assert!(
        html.contains("agent_parallelism must be between 1 and 256"),
        "{html}"
    );
    assert!(
        html.contains("value=\"0\""),
        "what was typed is kept: {html}"
    );
    assert_eq!(
        s.server.admin_client().settings(&s.env).await.unwrap(),
        before
    );

    set(&mut form, "agent_parallelism", "many");
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = admin.post(&path, &pairs).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("agent_parallelism: &#x27;many&#x27; is not a number")
    );

    set(&mut form, "agent_parallelism", "4");
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = admin.post(&path, &pairs).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let after = s.server.admin_client().settings(&s.env).await.unwrap();
    assert_eq!(after["agent_parallelism"], 4);
    let mut expected = before.clone();
    expected["agent_parallelism"] = json!(4);
    assert_eq!(after, expected, "only the changed field changed");
    let (_, html) = admin.page(&format!("{path}?saved=1")).await;
    assert!(html.contains("Settings saved."));
}

#[tokio::test]
async fn pages_carry_no_inline_script_and_a_strict_policy() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let admin = s.session("admin").await;
    let inline = regex::Regex::new(r"<script(?:\s[^>]*)?>").unwrap();
    let handlers = regex::Regex::new(r#"\son[a-z]+\s*=|\sstyle\s*="#).unwrap();
    for path in [
        "/console/sign-in".to_string(),
        "/console/".to_string(),
        format!("/console/env/{}", s.env),
        format!("/console/env/{}/settings", s.env),
        "/console/no/such/page".to_string(),
    ] {
        let r = admin.get(&path).await;
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        let html = r.text().await.unwrap();
        for tag in inline.find_iter(&html) {
            assert!(
                tag.as_str().contains(" src="),
                "{path}: inline script {}",
                tag.as_str()
            );
        }
        assert!(!handlers.is_match(&html), "{path}: inline handler or style");
    }
    let r = admin.get("/console/static/console.js").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
}

/// Read server-sent events from `resp` until `want` holds for a `progress` document, or
/// `secs` pass.
async fn next_progress(
    resp: &mut reqwest::Response,
    buf: &mut String,
    secs: u64,
    want: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if event.contains("event: progress")
                && let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: "))
            {
                let doc: serde_json::Value = serde_json::from_str(data).unwrap();
                if want(&doc) {
                    return Some(doc);
                }
            }
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            _ => return None,
        }
    }
}

#[tokio::test]
async fn a_deploy_reaches_an_open_page_as_it_happens() {
    let s = setup(TestServer::start_deploying().await, json!({})).await;
    let viewer = s.session("viewer").await;
    let dir = tempfile::tempdir().unwrap();
    let mut resp = viewer.get(&format!("/console/env/{}/events", s.env)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut buf = String::new();
    let first = next_progress(&mut resp, &mut buf, 5, |_| true)
        .await
        .unwrap();
    assert_eq!(first["version"], serde_json::Value::Null);

    // a deploy that takes a while: 20 files and 10 commands of 0.2 s, one action at a time
    let mut resources: Vec<_> = (0..20)
        .map(|i| {
            let p = dir.path().join(format!("f{i}"));
            fs_file("web", p.to_str().unwrap(), "x\n", &[])
        })
        .collect();
    for i in 0..10 {
        resources.push(exec_run(
            "web",
            &format!("sh -c 'sleep 0.2; echo {i}'"),
            json!({}),
            &[],
        ));
    }
    let admin = s.server.admin_client();
    let uploaded = Instant::now();
    admin
        .upload(&s.env, &export_of(resources), json!({}))
        .await
        .unwrap();
    let seen = next_progress(&mut resp, &mut buf, 5, |d| d["version"] == 1)
        .await
        .expect("the release reached the page");
    let lag = uploaded.elapsed();
    assert!(
        lag < Duration::from_secs(1),
        "the release took {lag:?} to reach the page"
    );
    assert_eq!(seen["total"], 30);
    // the page hears the deploy advance, not only its end
    let first_seen = seen.clone();
    let mut percents = vec![seen["percent"].as_i64().unwrap()];
    let mut done = seen;
    while !(done["percent"] == 100 && done["pending"] == 0) {
        done = next_progress(&mut resp, &mut buf, 60, |_| true)
            .await
            .expect("the page saw the deploy finish");
        percents.push(done["percent"].as_i64().unwrap());
    }
    assert!(
        percents.iter().filter(|p| **p > 0 && **p < 100).count() >= 2,
        "updates while it deployed: {percents:?} (first: {first_seen})"
    );
    assert!(percents.windows(2).all(|w| w[0] <= w[1]), "{percents:?}");
    assert_eq!(done["by_status"]["deployed"], 30, "{done}");
    assert_eq!(done["health"], "healthy");
    // and the files are there
    assert!(dir.path().join("f19").exists());

    // an idle page hears nothing (no change, no event) but keeps its one connection
    let quiet = next_progress(&mut resp, &mut buf, 2, |_| true).await;
    assert!(quiet.is_none(), "an event without a change: {quiet:?}");
}

#[tokio::test]
async fn expired_sessions_end_and_are_pruned() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let old = s.session("viewer").await;
    let current = s.session("viewer").await;
    let secret = old.cookie.trim_start_matches("steward_session=");
    sqlx::query(
        "UPDATE console_sessions SET expires_at = now() - interval '1 second' \
         WHERE secret_hash = $1",
    )
    .bind(steward::store::tokens::hash_secret(secret))
    .execute(&s.server.pool)
    .await
    .unwrap();
    assert_eq!(old.get("/console/").await.status(), StatusCode::SEE_OTHER);
    assert_eq!(current.page("/console/").await.0, StatusCode::OK);
    let pruned = steward::store::retention::prune_all(&s.server.pool, None)
        .await
        .unwrap();
    assert_eq!(pruned.console_sessions, 1, "{pruned:?}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM console_sessions")
        .fetch_one(&s.server.pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "the live session stays");
    assert_eq!(current.page("/console/").await.0, StatusCode::OK);
}

/// The server's listening connection (LISTEN steward_changes) in this test's database.
pub(crate) async fn listener_pid(pool: &sqlx::PgPool) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND query ILIKE 'LISTEN%steward_changes%' ORDER BY backend_start DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn live_updates_carry_on_while_the_listening_connection_is_cut_again_and_again() {
    let s = setup(TestServer::start(false).await, json!({})).await;
    let viewer = s.session("viewer").await;
    let mut resp = viewer.get(&format!("/console/env/{}/events", s.env)).await;
    let mut buf = String::new();
    next_progress(&mut resp, &mut buf, 5, |_| true)
        .await
        .unwrap();
    let admin = s.server.admin_client();
    let started = Instant::now();
    let (mut rounds, mut halted) = (0, false);
    // 20 s of a connection that keeps being cut (a failover, a proxy restart): each time the
    // listener comes back by itself, and the next change reaches the page at once
    while started.elapsed() < Duration::from_secs(20) {
        // (a round may begin while the listener reconnects after the last change)
        let pid =
            crate::support::eventually(10, "a listener", || listener_pid(&s.server.pool)).await;
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&s.server.pool)
            .await
            .unwrap();
        let back = Instant::now();
        loop {
            match listener_pid(&s.server.pool).await {
                Some(p) if p != pid => break,
                _ if back.elapsed() > Duration::from_secs(10) => {
                    panic!("the listener did not come back within 10 s (round {rounds})")
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        halted = !halted;
        admin.set_halted(&s.env, halted).await.unwrap();
        let changed = Instant::now();
        next_progress(&mut resp, &mut buf, 10, |d| d["halted"] == halted)
            .await
            .unwrap_or_else(|| panic!("round {rounds}: the change never reached the page"));
        assert!(
            changed.elapsed() < Duration::from_secs(2),
            "round {rounds}: the change took {:?} (the slow tick, not the listener)",
            changed.elapsed()
        );
        rounds += 1;
    }
    assert!(rounds >= 5, "only {rounds} rounds in 20 s");
}
