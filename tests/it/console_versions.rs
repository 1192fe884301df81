//! The console's versions pages over HTTP against a real server and PostgreSQL: the list with
//! each role's action links, releasing on the confirmation page (CSRF and role checked, the
//! version active after), the attribute-level diffs, and a dry-run started from the console.

use serde_json::json;
use steward::client::Client;
use steward::model::Resource;

use crate::support::{TestServer, eventually, export_of, fs_file, wait_deployed};

const AGENT: &str = "localhost";

/// A browser without one: no redirects followed, the session cookie sent by hand.
struct Console {
    http: reqwest::Client,
    base: String,
    cookie: String,
}

struct Answer {
    status: u16,
    location: Option<String>,
    body: String,
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

impl Console {
    /// Sign in with `token` through the sign-in form; keeps the session cookie.
    async fn sign_in(base: &str, token: &str) -> Console {
        let http = http();
        let r = http
            .post(format!("{base}/console/sign-in"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={}", encode(token)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 303, "sign-in");
        let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
        let cookie = set.split(';').next().unwrap().to_string();
        assert!(cookie.starts_with("steward_session="), "{set}");
        Console {
            http,
            base: base.to_string(),
            cookie,
        }
    }

    async fn answer(r: reqwest::Response) -> Answer {
        Answer {
            status: r.status().as_u16(),
            location: r
                .headers()
                .get("location")
                .map(|l| l.to_str().unwrap().to_string()),
            body: r.text().await.unwrap(),
        }
    }

    async fn get(&self, path: &str) -> Answer {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        Self::answer(r).await
    }

    /// A page that must answer 200; its HTML.
    async fn page(&self, path: &str) -> String {
        let a = self.get(path).await;
        assert_eq!(a.status, 200, "GET {path}: {}", a.body);
        a.body
    }

    /// A page that must answer 200; its HTML with the entities decoded.
    async fn text(&self, path: &str) -> String {
        unescape(&self.page(path).await)
    }

    async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Answer {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.join("&"))
            .send()
            .await
            .unwrap();
        Self::answer(r).await
    }

    /// Submit the form of a confirmation page as a browser would: every hidden field of it.
    async fn confirm(&self, page: &str) -> Answer {
        let html = self.page(page).await;
        assert!(
            html.contains(r#"id="confirm""#),
            "{page}: no confirm button\n{html}"
        );
        let action = unescape(&capture(&html, r#"<form method="post" action="([^"]+)""#));
        let hidden =
            regex::Regex::new(r#"<input type="hidden" name="([^"]+)" value="([^"]*)">"#).unwrap();
        let fields: Vec<(String, String)> = hidden
            .captures_iter(&html)
            .map(|c| (c[1].to_string(), unescape(&c[2])))
            .collect();
        // the sign-out form of the header carries the csrf value too; keep one of each name
        let mut unique: Vec<(&str, &str)> = vec![];
        for (k, v) in &fields {
            if !unique.iter().any(|(uk, _)| uk == k) {
                unique.push((k, v));
            }
        }
        unique.push(("comment", "looks good"));
        self.post(&action, &unique).await
    }

    fn csrf(html: &str) -> String {
        unescape(&capture(html, r#"name="csrf" value="([^"]+)""#))
    }
}

/// The text of HTML as a reader sees it (minijinja escapes `/` too).
fn unescape(html: &str) -> String {
    html.replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

fn capture(html: &str, pattern: &str) -> String {
    regex::Regex::new(pattern)
        .unwrap()
        .captures(html)
        .unwrap_or_else(|| panic!("{pattern} not in\n{html}"))[1]
        .to_string()
}

struct Fixture {
    srv: TestServer,
    admin: Client,
    env: String,
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A deploying server with environment `name` that waits for approval.
    async fn start(name: &str) -> Fixture {
        let srv = TestServer::start_deploying().await;
        let admin = srv.admin_client();
        let env = admin
            .create_environment("shop", name, Some(json!({"auto_release": false})))
            .await
            .unwrap()
            .id
            .to_string();
        Fixture {
            srv,
            admin,
            env,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, name: &str, content: &str) -> Resource {
        let path = format!("{}/{name}", self.dir.path().display());
        fs_file(AGENT, &path, content, &[])
    }

    async fn upload(&self, resources: Vec<Resource>, provenance: serde_json::Value) -> i32 {
        let v = self
            .admin
            .upload(&self.env, &export_of(resources), provenance)
            .await
            .unwrap();
        v["number"].as_i64().unwrap() as i32
    }

    async fn console(&self, role: &str) -> Console {
        let secret = if role == "admin" {
            self.srv.admin.clone().unwrap()
        } else {
            let t = self
                .admin
                .create_token(
                    &format!("{role} of the versions test"),
                    role,
                    Some(&self.env),
                )
                .await
                .unwrap();
            t["secret"].as_str().unwrap().to_string()
        };
        Console::sign_in(&self.srv.url, &secret).await
    }

    async fn status(&self, n: i32) -> String {
        self.admin.version(&self.env, n).await.unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// The list offers each role what it may do; the approver releases on the confirmation
/// page and the version becomes active; a viewer's POST and a POST without CSRF change
/// nothing.
#[tokio::test(flavor = "multi_thread")]
async fn the_list_offers_by_role_and_release_goes_through_the_confirm_page() {
    let fx = Fixture::start("versions").await;
    let env = fx.env.clone();
    let v1 = fx
        .upload(
            vec![fx.file("a", "one\n"), fx.file("b", "b\n")],
            json!({"commit": "0123456789abcdef0123", "message": "first cut\nand the rest of it"}),
        )
        .await;
    let v2 = fx
        .upload(vec![fx.file("a", "two\n"), fx.file("c", "c\n")], json!({}))
        .await;

    // without a session: the sign-in page, and back here after
    let anon = http()
        .get(format!("{}/console/env/{env}/versions", fx.srv.url))
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status().as_u16(), 303);
    let to = anon.headers()["location"].to_str().unwrap();
    assert!(to.starts_with("/console/sign-in?next="), "{to}");

    // the approver's list: both versions, newest first, with what may be done
    let approver = fx.console("approver").await;
    let list = approver.page(&format!("/console/env/{env}/versions")).await;
    let (p1, p2) = (
        list.find(&format!(r#"id="version-{v1}""#)).expect("row 1"),
        list.find(&format!(r#"id="version-{v2}""#)).expect("row 2"),
    );
    assert!(p2 < p1, "not newest first");
    assert!(list.contains("0123456789"), "the commit's short sha");
    assert!(list.contains("first cut"), "the commit's message");
    assert!(
        !list.contains("the rest of it"),
        "only the message's first line"
    );
    for n in [v1, v2] {
        for a in ["release", "reject"] {
            let link =
                format!(r#"<a id="{a}-{n}" href="/console/env/{env}/versions/{n}/confirm/{a}">"#);
            assert!(list.contains(&link), "no {link}\n{list}");
        }
        assert!(!list.contains(&format!(r#"id="rollback-{n}""#)));
        // dry-runs are for administrators
        assert!(!list.contains(&format!(r#"id="dryrun-{n}""#)));
    }
    assert!(list.contains("Approve and release"), "{list}");

    // the confirmation page says exactly what will happen, and nothing happened yet
    let confirm_path = format!("/console/env/{env}/versions/{v2}/confirm/release");
    let asked = approver.text(&confirm_path).await;
    assert!(
        asked.contains(&format!(
            "Release version {v2} of shop/versions: 2 resources change (+2 ~0 -0)"
        )),
        "{asked}"
    );
    assert!(
        asked.contains("the scheduler starts deploying at once"),
        "{asked}"
    );
    assert_eq!(fx.status(v2).await, "new");

    // a POST without the CSRF value is refused, and nothing is released
    let action = format!("/console/env/{env}/versions/{v2}/release");
    let r = approver.post(&action, &[("comment", "x")]).await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r = approver
        .post(&action, &[("csrf", "not-the-value"), ("comment", "x")])
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(fx.status(v2).await, "new");

    // a viewer sees the versions, is offered nothing, and is refused a change
    let viewer = fx.console("viewer").await;
    let seen = viewer.page(&format!("/console/env/{env}/versions")).await;
    assert!(seen.contains(&format!(r#"id="version-{v2}""#)));
    for a in ["release-", "reject-", "rollback-", "dryrun-", "/confirm/"] {
        assert!(!seen.contains(a), "a viewer is offered {a}\n{seen}");
    }
    let page = viewer
        .page(&format!("/console/env/{env}/versions/{v2}"))
        .await;
    assert!(!page.contains("/confirm/"), "{page}");
    let r = viewer.get(&confirm_path).await;
    assert_eq!(r.status, 403, "{}", r.body);
    let r = viewer
        .post(
            &action,
            &[("csrf", &Console::csrf(&seen)), ("comment", "x")],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(fx.status(v2).await, "new");

    // the approver confirms: released, active, deploying; back to the environment
    let r = approver.confirm(&confirm_path).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.location.as_deref(),
        Some(format!("/console/env/{env}").as_str())
    );
    let d = fx.admin.version(&fx.env, v2).await.unwrap();
    assert_eq!(d["status"], "released");
    assert_eq!(d["active"], true);
    assert_eq!(
        d["approvals"][0]["approver"],
        "approver of the versions test"
    );
    assert_eq!(d["approvals"][0]["comment"], "looks good");
    wait_deployed(&fx.admin, &env, v2, 30).await;
    assert_eq!(
        std::fs::read_to_string(fx.dir.path().join("a")).unwrap(),
        "two\n"
    );

    // the list now: v2 active with its decision; v1 older than it, so it can no longer be
    // released (only rejected)
    let list = approver.page(&format!("/console/env/{env}/versions")).await;
    let row2 = row(&list, v2);
    assert!(
        row2.contains("active") && row2.contains("released"),
        "{row2}"
    );
    assert!(
        !row2.contains("release-") && !row2.contains("reject-"),
        "{row2}"
    );
    let row1 = row(&list, v1);
    assert!(!row1.contains(&format!("release-{v1}")), "{row1}");
    assert!(row1.contains(&format!("reject-{v1}")), "{row1}");

    // the version page: provenance and the decision with who and the comment
    let page = approver
        .page(&format!("/console/env/{env}/versions/{v2}"))
        .await;
    assert!(page.contains("approver of the versions test"), "{page}");
    assert!(page.contains("looks good"), "{page}");

    // reject v1 from the console: back to the list, which says so
    let r = approver
        .confirm(&format!("/console/env/{env}/versions/{v1}/confirm/reject"))
        .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let back = r.location.unwrap();
    assert!(
        back.starts_with(&format!("/console/env/{env}/versions")),
        "{back}"
    );
    assert_eq!(fx.status(v1).await, "rejected");
    let list = approver.page(&back).await;
    assert!(
        list.contains(&format!("Version {v1} was rejected.")),
        "{list}"
    );
    // what can not be done is refused on the confirmation page already
    let r = approver.get(&confirm_path).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("released already"), "{}", r.body);

    // a newer version released: v2 may be rolled back to, which makes and releases v4
    let v3 = fx.upload(vec![fx.file("a", "three\n")], json!({})).await;
    fx.admin.release(&env, v3, "").await.unwrap();
    let list = approver.page(&format!("/console/env/{env}/versions")).await;
    assert!(
        row(&list, v2).contains(&format!(r#"id="rollback-{v2}""#)),
        "{list}"
    );
    let rollback = format!("/console/env/{env}/versions/{v2}/confirm/rollback");
    let asked = approver.text(&rollback).await;
    let v4 = v3 + 1;
    assert!(
        asked.contains(&format!(
            "Roll shop/versions back to version {v2}: a new version {v4} with version {v2}'s content (2 resources)"
        )),
        "{asked}"
    );
    assert!(
        asked.contains(&format!("against the active version {v3}")),
        "{asked}"
    );
    let r = approver.confirm(&rollback).await;
    assert_eq!(r.status, 303, "{}", r.body);
    let back = r.location.unwrap();
    assert!(back.ends_with(&format!("done=rollback&n={v4}")), "{back}");
    let d = fx.admin.version(&env, v4).await.unwrap();
    assert_eq!(
        (d["active"].clone(), d["origin"].clone()),
        (json!(true), json!("rollback"))
    );
    let list = approver.text(&back).await;
    assert!(
        row(&list, v4).contains(&format!(
            r#"rollback of <a href="/console/env/{env}/versions/{v2}">version {v2}</a>"#
        )),
        "{list}"
    );
}

async fn upload(c: &Client, env: &str, resources: Vec<Resource>) -> i32 {
    let v = c
        .upload(env, &export_of(resources), json!({}))
        .await
        .unwrap();
    v["number"].as_i64().unwrap() as i32
}

/// One row of the versions table.
fn row(html: &str, n: i32) -> String {
    let start = html
        .find(&format!(r#"<tr id="version-{n}""#))
        .unwrap_or_else(|| panic!("no row {n}"));
    let end = html[start..].find("</tr>").unwrap() + start;
    html[start..end].to_string()
}

/// The diff of a version against its predecessor, and of any two versions, show each changed
/// attribute's old and new value, and the added and removed resources.
#[tokio::test(flavor = "multi_thread")]
async fn diffs_show_old_and_new_values() {
    let srv = TestServer::start(false).await;
    let admin = srv.admin_client();
    let env = admin
        .create_environment("shop", "diffs", Some(json!({"auto_release": false})))
        .await
        .unwrap()
        .id
        .to_string();
    let dir = "/srv/console-diff";
    let f = |name: &str, content: &str| fs_file(AGENT, &format!("{dir}/{name}"), content, &[]);
    let v1 = upload(
        &admin,
        &env,
        vec![f("a", "old <content>\n"), f("gone", "g\n")],
    )
    .await;
    let v2 = upload(
        &admin,
        &env,
        vec![f("a", "new <content>\n"), f("added", "n\n")],
    )
    .await;
    let v3 = upload(&admin, &env, vec![f("a", "third\n"), f("added", "n\n")]).await;

    let c = Console::sign_in(&srv.url, srv.admin.as_deref().unwrap()).await;
    let raw = c.page(&format!("/console/env/{env}/versions/{v2}")).await;
    // values are escaped
    assert!(
        raw.contains("old &lt;content&gt;") && !raw.contains("<content>"),
        "{raw}"
    );
    let page = unescape(&raw);
    assert!(
        page.contains(&format!("Changes against version {v1}")),
        "{page}"
    );
    assert!(page.contains("+1 ~1 -1"), "{page}");
    let a = format!("fs::File[{AGENT},path={dir}/a]");
    assert!(page.contains(&a), "{page}");
    // the content's old and new value
    assert!(page.contains("old <content>\n</code>"), "{page}");
    assert!(page.contains("new <content>\n</code>"), "{page}");
    assert!(page.contains(&format!("{dir}/added")) && page.contains(&format!("{dir}/gone")));
    // the compare form
    assert!(page.contains(r#"id="compare-form""#));

    // any two versions
    let d = c
        .text(&format!("/console/env/{env}/diff?from={v1}&to={v3}"))
        .await;
    assert!(
        d.contains(&format!("Version {v3} against version {v1}")),
        "{d}"
    );
    assert!(
        d.contains("old <content>") && d.contains("third\n</code>"),
        "{d}"
    );
    assert!(!d.contains("new <content>"), "{d}");
    // a version that does not exist: the API's answer
    let r = c
        .get(&format!("/console/env/{env}/diff?from={v1}&to=99"))
        .await;
    assert_eq!(r.status, 404, "{}", r.body);
    // the form alone
    let empty = c.page(&format!("/console/env/{env}/diff")).await;
    assert!(empty.contains(r#"id="compare""#));
}

/// An administrator starts a dry-run from the console; it is listed, and its report shows
/// what a deploy would change, attribute by attribute.
#[tokio::test(flavor = "multi_thread")]
async fn a_dryrun_started_from_the_console_reports_its_change() {
    let fx = Fixture::start("dry").await;
    let env = fx.env.clone();
    let v1 = fx.upload(vec![fx.file("a", "one\n")], json!({})).await;
    fx.admin.release(&env, v1, "").await.unwrap();
    wait_deployed(&fx.admin, &env, v1, 30).await;
    let v2 = fx.upload(vec![fx.file("a", "two\n")], json!({})).await;

    let admin = fx.console("admin").await;
    let list = admin.page(&format!("/console/env/{env}/versions")).await;
    assert!(list.contains(&format!(r#"id="dryrun-{v2}""#)), "{list}");
    assert!(list.contains(&format!(r#"id="dryrun-{v1}""#)), "{list}");
    let confirm = format!("/console/env/{env}/versions/{v2}/confirm/dryrun");
    let asked = admin.text(&confirm).await;
    assert!(asked.contains("nothing is changed"), "{asked}");
    let r = admin.confirm(&confirm).await;
    assert_eq!(r.status, 303, "{}", r.body);
    let report_path = r.location.unwrap();
    let prefix = format!("/console/env/{env}/dryruns/");
    assert!(report_path.starts_with(&prefix), "{report_path}");
    let id = report_path[prefix.len()..].to_string();

    let report = eventually(30, "the dry-run to finish", || async {
        let html = admin.text(&report_path).await;
        html.contains("complete at").then_some(html)
    })
    .await;
    assert!(
        report.contains(&format!("Dry run of version {v2}")),
        "{report}"
    );
    let a = format!("fs::File[{AGENT},path={}/a]", fx.dir.path().display());
    assert!(report.contains(&a), "{report}");
    assert!(report.contains(">content<"), "{report}");
    assert!(
        report.contains("one\n") && report.contains("two\n"),
        "{report}"
    );
    // nothing changed on disk, nothing released
    assert_eq!(
        std::fs::read_to_string(fx.dir.path().join("a")).unwrap(),
        "one\n"
    );
    assert_eq!(fx.status(v2).await, "new");

    let listed = admin.page(&format!("/console/env/{env}/dryruns")).await;
    assert!(listed.contains(&format!(r#"id="report-{id}""#)), "{listed}");
    assert!(listed.contains("complete"), "{listed}");

    // a viewer reads the report but may not start one
    let viewer = fx.console("viewer").await;
    assert!(viewer.text(&report_path).await.contains(">content<"));
    let r = viewer.get(&confirm).await;
    assert_eq!(r.status, 403);
    let html = viewer.page(&format!("/console/env/{env}/versions")).await;
    let r = viewer
        .post(
            &format!("/console/env/{env}/versions/{v2}/dryrun"),
            &[("csrf", &Console::csrf(&html))],
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
}
