//! The console's facts and parameters (issue 29) against a real server over HTTP: a resource's
//! page lists the facts set through the API; an environment's Parameters page lists its
//! parameters and the facts per resource, bounded; an admin sets and deletes a parameter with
//! the page's form (CSRF, audit and the recompile event as through the API); a viewer sees no
//! form and its POSTs are refused; values carrying HTML are escaped.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use steward::client::Client;
use steward::events::Event;
use steward::model::{Resource, ResourceId};
use steward::store::facts::{self, ParameterItem};
use uuid::Uuid;

use crate::console_support::{ConsoleSession, csrf_in};
use crate::support::{TestServer, export_of};

const WEB: &str = "vm::Host[web1,name=web]";
const DB: &str = "vm::Host[db1,name=db]";

fn host(agent: &str, name: &str) -> Resource {
    let attributes = json!({"name": name, "purged": false});
    Resource {
        id: ResourceId::new("vm::Host", agent, "name", name),
        type_name: "vm::Host".into(),
        agent: agent.into(),
        attributes: attributes.as_object().unwrap().clone(),
        requires: vec![],
    }
}

/// A server, an environment holding WEB and DB in version 1, and the admin client.
async fn setup(name: &str) -> (TestServer, Client, String) {
    let srv = TestServer::start(false).await;
    let c = srv.admin_client();
    let env = c
        .create_environment("facts", name, None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(
        &env,
        &export_of(vec![host("web1", "web"), host("db1", "db")]),
        json!({}),
    )
    .await
    .unwrap();
    (srv, c, env)
}

/// A console session of a new token with `role` in `env`.
async fn session(srv: &TestServer, c: &Client, env: &str, role: &str) -> ConsoleSession {
    let t = c.create_token(role, role, Some(env)).await.unwrap();
    ConsoleSession::sign_in(&srv.url, t["secret"].as_str().unwrap()).await
}

fn urlencode(s: &str) -> String {
    steward::model::urls::encode_component(s)
}

/// Undo the templates' HTML escaping (of an attribute, say).
fn unescape(s: &str) -> String {
    s.replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

fn resource_page(env: &str, rid: &str) -> String {
    format!("/console/env/{env}/resource?id={}", urlencode(rid))
}

/// The body of the table `id` of a page (panics when there is none).
fn table<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<table id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id}: {html}"));
    let end = html[start..].find("</table>").unwrap() + start;
    &html[start..end]
}

async fn stored(srv: &TestServer, env: &str, name: &str) -> Option<facts::Param> {
    facts::get(&srv.pool, Uuid::parse_str(env).unwrap(), "", name)
        .await
        .unwrap()
}

async fn audit_count(srv: &TestServer, env: &str, action: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE environment_id = $1::uuid AND action = $2",
    )
    .bind(env)
    .bind(action)
    .fetch_one(&srv.pool)
    .await
    .unwrap()
}

/// The next `Event::Facts` of `env` within a few seconds.
async fn next_facts_event(rx: &mut tokio::sync::broadcast::Receiver<Event>, env: &str) -> Event {
    let env = Uuid::parse_str(env).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(e @ Event::Facts { environment, .. })) if environment == env => return e,
            Ok(Ok(_)) => continue,
            other => panic!("no Event::Facts: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_resource_page_shows_the_facts_set_through_the_api() {
    let (srv, c, env) = setup("tab").await;
    c.set_parameter(&env, "ip_address", Some(WEB), &json!({"value": "10.0.0.7"}))
        .await
        .unwrap();
    c.set_parameter(
        &env,
        "key",
        Some(WEB),
        &json!({"value": format!("ssh-ed25519 {}\nsecond line", "A".repeat(200)), "expires": false}),
    )
    .await
    .unwrap();
    // a fact last written two hours ago, past the default fact_expire of an hour
    c.set_parameter(&env, "old", Some(WEB), &json!({"value": "stale"}))
        .await
        .unwrap();
    sqlx::query("UPDATE parameters SET updated = now() - interval '2 hours' WHERE name = 'old'")
        .execute(&srv.pool)
        .await
        .unwrap();
    let viewer = session(&srv, &c, &env, "viewer").await;

    let (status, html) = viewer.page(&resource_page(&env, WEB)).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("Facts (3)"), "{html}");
    let facts = table(&html, "resource-facts");
    let rows: Vec<&str> = facts.split("<tr class=\"fact-row\">").skip(1).collect();
    assert_eq!(rows.len(), 3, "{facts}");
    // by name: ip_address, key, old
    assert!(rows[0].contains("ip_address") && rows[0].contains("10.0.0.7"));
    assert!(rows[0].contains("<td>user</td>") && rows[0].contains(" UTC</td>"));
    assert!(
        rows[0].contains("class=\"fact-expiry\">yes<"),
        "{}",
        rows[0]
    );
    assert!(!rows[0].contains("whole value"));
    // a long value is shortened to its first line's start, with a link to all of it
    assert!(
        rows[1].contains("class=\"fact-expiry\">never<"),
        "{}",
        rows[1]
    );
    assert!(!rows[1].contains("second line") && !rows[1].contains(&"A".repeat(100)));
    assert!(rows[2].contains(">expired<"), "{}", rows[2]);
    let href = unescape(
        rows[1]
            .split("class=\"full-value\" href=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap(),
    );
    let (status, whole) = viewer.page(&href).await;
    assert_eq!(status, StatusCode::OK, "{href}: {whole}");
    assert!(
        whole.contains(&format!("ssh-ed25519 {}\nsecond line", "A".repeat(200))),
        "{whole}"
    );

    // a resource without facts says so
    let (_, html) = viewer.page(&resource_page(&env, DB)).await;
    assert!(html.contains("id=\"no-facts\""), "{html}");
    assert!(html.contains("Facts (0)"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_parameters_page_lists_parameters_and_facts_per_resource() {
    let (srv, c, env) = setup("list").await;
    c.set_parameters(
        &env,
        &[
            item("region", "", "eu-west"),
            item("dbpass", "", "s3cret"),
            item("ip", WEB, "10.0.0.1"),
            item("mac", WEB, "aa:bb"),
            item("ip", DB, "10.0.0.2"),
        ],
        false,
    )
    .await
    .unwrap();
    let viewer = session(&srv, &c, &env, "viewer").await;
    let path = format!("/console/env/{env}/parameters");
    // the environment's navigation leads there
    let (_, overview) = viewer.page(&format!("/console/env/{env}")).await;
    assert!(overview.contains(&format!("href=\"/console/env/{env}/parameters\"")));

    let (status, html) = viewer.page(&path).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let params = table(&html, "parameters");
    let names: Vec<&str> = params
        .split("class=\"mono parameter-name\">")
        .skip(1)
        .map(|r| r.split('<').next().unwrap())
        .collect();
    assert_eq!(names, ["dbpass", "region"]);
    assert!(params.contains("eu-west") && params.contains("s3cret"));
    assert!(
        html.contains("Parameters (2)") && html.contains("(3 facts)"),
        "{html}"
    );
    let per_resource = table(&html, "facts-by-resource");
    let rows: Vec<&str> = per_resource
        .split("<tr class=\"fact-resource-row\">")
        .skip(1)
        .collect();
    assert_eq!(rows.len(), 2);
    // by resource id: db1's one fact, then web1's two, each linking to the resource's page
    assert!(unescape(rows[0]).contains(&format!("href=\"{}#facts\"", resource_page(&env, DB))));
    assert!(rows[0].contains("<td class=\"fact-count\">1</td>"));
    assert!(
        rows[1].contains("<td class=\"fact-count\">2</td>"),
        "{}",
        rows[1]
    );
    // a viewer reads only
    assert!(!html.contains("id=\"set-parameter\"") && !html.contains("delete-parameter"));
    assert!(html.contains("id=\"read-only\""));

    // more parameters than a page shows: the first 1000 and a note
    let many: Vec<ParameterItem> = (0..1000)
        .map(|i| item(&format!("p{i:04}"), "", "v"))
        .collect();
    c.set_parameters(&env, &many, false).await.unwrap();
    let (status, html) = viewer.page(&path).await;
    assert_eq!(status, StatusCode::OK);
    let shown = table(&html, "parameters")
        .matches("<tr class=\"parameter-row\">")
        .count();
    assert_eq!(shown, 1000);
    assert!(html.contains("id=\"params-capped\"") && html.contains("Parameters (1002)"));
}

fn item(name: &str, resource_id: &str, value: &str) -> ParameterItem {
    ParameterItem {
        name: name.into(),
        resource_id: resource_id.into(),
        value: value.into(),
        ..ParameterItem::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_admin_sets_and_deletes_a_parameter_with_the_form() {
    let (srv, c, env) = setup("form").await;
    let admin = session(&srv, &c, &env, "admin").await;
    let path = format!("/console/env/{env}/parameters");
    let (_, html) = admin.page(&path).await;
    assert!(html.contains("id=\"set-parameter\""), "{html}");
    let csrf = csrf_in(&html).unwrap();
    let mut events = srv.notifier.subscribe();

    // set, with a recompile asked for and a value typed over two lines
    let r = admin
        .post(
            &path,
            &[
                ("csrf", csrf.as_str()),
                ("name", " region "),
                ("value", "eu-west\r\nzone b"),
                ("recompile", "true"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], format!("{path}?done=set"));
    let p = stored(&srv, &env, "region").await.expect("stored");
    assert_eq!(
        (p.value.as_str(), p.source.as_str(), p.expires),
        ("eu-west\nzone b", "user", false)
    );
    let e = next_facts_event(&mut events, &env).await;
    assert!(
        matches!(&e, Event::Facts { recompile: true, changed, .. }
            if *changed == vec![(String::new(), "region".to_string())]),
        "{e:?}"
    );
    assert_eq!(audit_count(&srv, &env, "parameters.set").await, 1);
    let (_, html) = admin.page(&format!("{path}?done=set")).await;
    assert!(html.contains("Parameter saved.") && html.contains(">region<"));
    // the API sees what the console wrote
    assert_eq!(
        c.get_parameter(&env, "region", None).await.unwrap().value,
        "eu-west\nzone b"
    );

    // a value the store refuses: the form again with the API's reason and what was typed
    let r = admin
        .post(
            &path,
            &[("csrf", csrf.as_str()), ("name", ""), ("value", "kept")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("id=\"form-error\"") && html.contains("needs a name"),
        "{html}"
    );
    assert!(html.contains(">kept</textarea>"));

    // delete: gone from the store, audited, and a recompile asked for
    let r = admin
        .post(
            &format!("{path}/delete"),
            &[("csrf", csrf.as_str()), ("name", "region")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], format!("{path}?done=deleted"));
    assert!(stored(&srv, &env, "region").await.is_none());
    assert_eq!(audit_count(&srv, &env, "parameter.delete").await, 1);
    let e = next_facts_event(&mut events, &env).await;
    assert!(
        matches!(
            e,
            Event::Facts {
                recompile: true,
                ..
            }
        ),
        "{e:?}"
    );
    // deleting what is not there is a not-found page
    let r = admin
        .post(
            &format!("{path}/delete"),
            &[("csrf", csrf.as_str()), ("name", "region")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // without this session's CSRF value nothing is written
    let r = admin
        .post(
            &path,
            &[("csrf", "stw_guess"), ("name", "x"), ("value", "1")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = admin.post(&path, &[("name", "x"), ("value", "1")]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(stored(&srv, &env, "x").await.is_none());

    // a compiler writes parameters too
    let compiler = session(&srv, &c, &env, "compiler").await;
    let r = compiler
        .post_with_csrf(&path, &[("name", "by_ci"), ("value", "1")])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(stored(&srv, &env, "by_ci").await.unwrap().value, "1");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_viewer_gets_no_form_and_its_posts_are_refused() {
    let (srv, c, env) = setup("viewer").await;
    c.set_parameter(&env, "dbpass", None, &json!({"value": "s3cret"}))
        .await
        .unwrap();
    for role in ["viewer", "approver"] {
        let s = session(&srv, &c, &env, role).await;
        let path = format!("/console/env/{env}/parameters");
        let (status, html) = s.page(&path).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!html.contains("id=\"set-parameter\""), "{role}: {html}");
        assert!(!html.contains("delete-parameter"), "{role}");
        // the attack: posting the forms anyway, with a valid CSRF value
        let r = s
            .post_with_csrf(&path, &[("name", "dbpass"), ("value", "mine")])
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{role}");
        let r = s
            .post_with_csrf(&format!("{path}/delete"), &[("name", "dbpass")])
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{role}");
        assert_eq!(stored(&srv, &env, "dbpass").await.unwrap().value, "s3cret");
    }
    assert_eq!(audit_count(&srv, &env, "parameter.delete").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn html_in_values_and_names_is_escaped() {
    let (srv, c, env) = setup("escape").await;
    let attack = "<script>alert(1)</script>";
    c.set_parameter(&env, "ip_address", Some(WEB), &json!({"value": attack}))
        .await
        .unwrap();
    c.set_parameter(&env, attack, Some(WEB), &json!({"value": "v"}))
        .await
        .unwrap();
    c.set_parameter(&env, "banner", None, &json!({"value": attack}))
        .await
        .unwrap();
    let viewer = session(&srv, &c, &env, "viewer").await;
    let pages = [
        resource_page(&env, WEB),
        format!("/console/env/{env}/parameters"),
        format!("/console/env/{env}/parameters/value?name=banner"),
        format!(
            "/console/env/{env}/parameters/value?name={}&resource_id={}",
            urlencode(attack),
            urlencode(WEB)
        ),
    ];
    for path in pages {
        let (status, html) = viewer.page(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {html}");
        assert!(!html.contains("<script>alert"), "{path}: {html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;"),
            "{path}: {html}"
        );
    }
}
