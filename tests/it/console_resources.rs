//! The console's resources pages against a real server: the table's filters, sorting, text
//! search and paging return the right rows (done in PostgreSQL, shared with the REST list),
//! and a resource's page shows its attributes, neighbours and, for a resource that really
//! failed (a real executor, a file whose directory is missing), the handler's log line.

use serde_json::json;
use steward::client::Client;

use crate::console_support::{ConsoleSession, http};
use crate::support::{TestServer, export_of, fs_file, wait_deployed};

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// GET a console page with the session; (status, body).
async fn page(session: &ConsoleSession, path: &str) -> (u16, String) {
    let (status, html) = session.page(path).await;
    (status.as_u16(), html)
}

/// Undo the templates' HTML escaping.
fn unescape(s: &str) -> String {
    s.replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The resource ids of the table's rows, in order.
fn row_ids(html: &str) -> Vec<String> {
    html.split("<tr class=\"resource-row\">")
        .skip(1)
        .map(|row| {
            let link = row
                .split("class=\"resource-link mono\"")
                .nth(1)
                .expect("a resource link in the row");
            let text = link.split('>').nth(1).unwrap();
            unescape(text.split("</a").next().unwrap())
        })
        .collect()
}

/// 130 resources over 3 agents and 3 types, and state for some of them: the ids by index.
pub(crate) async fn seeded(s: &TestServer, c: &Client) -> (String, Vec<String>) {
    let env = c
        .create_environment("console", "res", None)
        .await
        .unwrap()
        .id
        .to_string();
    let mut resources = Vec::new();
    for i in 0..130 {
        let agent = format!("a{}", (i / 3) % 3);
        let r = match i % 3 {
            0 => fs_file(&agent, &format!("/srv/site/f{i:03}"), "x", &[]),
            1 => crate::support::exec_run(&agent, &format!("echo run{i:03}"), json!({}), &[]),
            _ => {
                let mut n = steward::model::Resource {
                    id: steward::model::ResourceId::new(
                        "std::testing::NullResource",
                        &agent,
                        "name",
                        &format!("Null{i:03}"),
                    ),
                    type_name: "std::testing::NullResource".into(),
                    agent: agent.clone(),
                    attributes: Default::default(),
                    requires: vec![],
                };
                n.attributes
                    .insert("name".into(), json!(format!("Null{i:03}")));
                n
            }
        };
        resources.push(r);
    }
    // the first file is required by the second one
    let first = resources[0].id.0.clone();
    resources[3]
        .requires
        .push(steward::model::ResourceId(first));
    let ids: Vec<String> = resources.iter().map(|r| r.id.0.clone()).collect();
    c.upload(&env, &export_of(resources), json!({}))
        .await
        .unwrap();
    // deploy state: every 10th failed, every 5th (else) deployed, at increasing times
    let env_id = uuid::Uuid::parse_str(&env).unwrap();
    for (i, id) in ids.iter().enumerate() {
        let result = if i.is_multiple_of(10) {
            "failed"
        } else if i.is_multiple_of(5) {
            "deployed"
        } else {
            continue;
        };
        sqlx::query(
            "INSERT INTO resource_state (environment_id, resource_id, agent, last_result, last_message, \
             last_run_hash, last_deployed) \
             SELECT $1, $2, agent, $3, CASE WHEN $3 = 'failed' THEN 'it broke' END, hash, \
               now() - make_interval(mins => 1000 - $4) \
             FROM resource_spans WHERE environment_id = $1 AND first_version = 1 AND resource_id = $2",
        )
        .bind(env_id)
        .bind(id)
        .bind(result)
        .bind(i as i32)
        .execute(&s.pool)
        .await
        .unwrap();
    }
    (env, ids)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_table_filters_sorts_and_pages_in_the_database() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let (env, ids) = seeded(&s, &c).await;
    let viewer = c.create_token("v", "viewer", Some(&env)).await.unwrap();
    let cookie = ConsoleSession::sign_in(&s.url, viewer["secret"].as_str().unwrap()).await;
    let base = format!("/console/env/{env}/resources");
    let mut sorted = ids.clone();
    sorted.sort();

    // first page: 50 in id order, and the counts of every state
    let (status, html) = page(&cookie, &base).await;
    assert_eq!(status, 200, "{html}");
    assert_eq!(row_ids(&html), sorted[..50]);
    assert!(html.contains("Resources 1–50 of 130"), "{html}");
    assert!(html.contains("failed 13"), "{html}");
    assert!(html.contains("deployed 13"), "{html}");
    assert!(html.contains("available 104"), "{html}");
    assert!(html.contains("Page 1 of 3"));
    // the last page
    let (_, html) = page(&cookie, &format!("{base}?page=3")).await;
    assert_eq!(row_ids(&html), sorted[100..]);
    // a page past the end is empty, not an error
    let (status, html) = page(&cookie, &format!("{base}?page=9")).await;
    assert_eq!((status, row_ids(&html).len()), (200, 0));

    // what each resource is, by its index
    let idx = |id: &str| ids.iter().position(|x| x == id).unwrap();
    let agent_of = |i: usize| format!("a{}", (i / 3) % 3);
    let state_of = |i: usize| match i {
        _ if i.is_multiple_of(10) => "failed",
        _ if i.is_multiple_of(5) => "deployed",
        _ => "available",
    };
    let matching = |keep: &dyn Fn(usize, &str) -> bool| -> Vec<String> {
        sorted
            .iter()
            .filter(|id| keep(idx(id), id))
            .cloned()
            .collect()
    };

    // filters: state, agent, type, all three, and text
    let failed = matching(&|i, _| state_of(i) == "failed");
    let (_, html) = page(&cookie, &format!("{base}?state=failed")).await;
    assert_eq!(row_ids(&html), failed);
    assert!(html.contains("Resources 1–13 of 13"), "{html}");
    // a state filter (on the underlying columns) finds as many as its count (the CASE)
    for (state, n) in [("deployed", 13), ("available", 104), ("undefined", 0)] {
        let (_, html) = page(&cookie, &format!("{base}?state={state}")).await;
        let shown = row_ids(&html);
        assert_eq!(shown.len(), n.min(50), "{state}");
        assert!(shown.iter().all(|id| state_of(idx(id)) == state), "{state}");
        if n > 0 {
            assert!(html.contains(&format!(" of {n}</p>")), "{state}: {html}");
        }
    }
    let (_, html) = page(&cookie, &format!("{base}?agent=a1")).await;
    assert_eq!(row_ids(&html), matching(&|i, _| agent_of(i) == "a1"));
    let (_, html) = page(&cookie, &format!("{base}?type=exec%3A%3ARun&page=1")).await;
    assert_eq!(
        row_ids(&html),
        matching(&|_, id| id.starts_with("exec::Run["))
    );
    let (_, html) = page(
        &cookie,
        &format!("{base}?state=available&agent=a1&type=exec%3A%3ARun"),
    )
    .await;
    let want = matching(&|i, id| {
        state_of(i) == "available" && agent_of(i) == "a1" && id.starts_with("exec::Run[")
    });
    assert!(want.len() > 5);
    assert_eq!(row_ids(&html), want);
    // the counts follow the other filters
    let (_, html) = page(&cookie, &format!("{base}?agent=a2&state=failed")).await;
    let n = matching(&|i, _| agent_of(i) == "a2").len();
    assert!(html.contains(&format!("all {n}<")), "{html}");

    // text search: case-insensitive, wildcards taken literally
    let (_, html) = page(&cookie, &format!("{base}?q=null12")).await;
    assert_eq!(row_ids(&html), matching(&|_, id| id.contains("Null12")));
    assert_eq!(row_ids(&html).len(), 3);
    let (_, html) = page(&cookie, &format!("{base}?q=%25")).await;
    assert!(row_ids(&html).is_empty());
    let (_, html) = page(&cookie, &format!("{base}?q=site%2Ff12")).await;
    assert_eq!(row_ids(&html), matching(&|_, id| id.contains("site/f12")));
    assert_eq!(row_ids(&html).len(), 4);

    // sorting: by agent descending (ids descending within an agent), by last deploy
    let (_, html) = page(&cookie, &format!("{base}?sort=agent&order=desc")).await;
    let mut by_agent = ids.clone();
    by_agent.sort_by(|a, b| (agent_of(idx(b)), b).cmp(&(agent_of(idx(a)), a)));
    assert_eq!(row_ids(&html), by_agent[..50]);
    // the current column's header link flips the order
    assert!(html.contains("aria-sort=\"descending\""), "{html}");
    assert!(unescape(&html).contains(&format!("href=\"{base}?sort=agent\"")));
    let (_, html) = page(&cookie, &format!("{base}?sort=deployed&order=desc")).await;
    // the latest deploy first: 125 (deployed), then 120 (failed), 115
    let got = row_ids(&html);
    assert_eq!(
        got[..3],
        [ids[125].clone(), ids[120].clone(), ids[115].clone()]
    );
    // never deployed after all 26 deployed ones (ids descending too)
    let never: Vec<String> = matching(&|i, _| !i.is_multiple_of(5))
        .into_iter()
        .rev()
        .take(24)
        .collect();
    assert_eq!(got[26..], never);
    let (_, html) = page(&cookie, &format!("{base}?sort=status")).await;
    assert_eq!(
        row_ids(&html),
        matching(&|i, _| state_of(i) == "available")[..50]
    );

    // the REST list uses the same store function: paged, filtered, sorted, with a total
    let api = c.resources(&env).await.unwrap();
    assert_eq!(api.1.len(), 130);
    let r: serde_json::Value = http()
        .get(format!(
            "{}/api/v1/environments/{env}/resources?status=failed&sort=agent&order=desc&limit=5&offset=2",
            s.url
        ))
        .bearer_auth(viewer["secret"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["total"], 13, "{r}");
    let got: Vec<&str> = r["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["resource_id"].as_str().unwrap())
        .collect();
    let mut failed_by_agent: Vec<String> = failed.clone();
    failed_by_agent.sort_by(|a, b| (agent_of(idx(b)), b).cmp(&(agent_of(idx(a)), a)));
    assert_eq!(got, failed_by_agent[2..7]);
    let bad = http()
        .get(format!(
            "{}/api/v1/environments/{env}/resources?sort=colour",
            s.url
        ))
        .bearer_auth(viewer["secret"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    // no session: to the sign-in page, and back here after
    let r = http()
        .get(format!("{}{base}?state=failed", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let to = r.headers()["location"].to_str().unwrap();
    assert!(
        to.starts_with("/console/sign-in?next=%2Fconsole%2Fenv%2F"),
        "{to}"
    );
    let r = http()
        .get(format!("{}/console/env/{env}/resource?id=x", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_page_shows_attributes_neighbours_and_why_it_failed() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment(
            "console",
            "failing",
            // no retry while the test looks
            Some(json!({"retry_backoff": {"initial": 3600, "factor": 1.0, "max": 3600}})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    // its directory is missing: the file fails, and the one requiring it is skipped
    let bad = fs_file(
        "localhost",
        &format!("{d}/missing-dir/conf"),
        "never\n",
        &[],
    );
    let ok = fs_file("localhost", &format!("{d}/base"), "base\n", &[]);
    let dep = fs_file(
        "localhost",
        &format!("{d}/after"),
        "after\n",
        &[&bad.id.0, &ok.id.0],
    );
    let (bad_id, ok_id, dep_id) = (bad.id.0.clone(), ok.id.0.clone(), dep.id.0.clone());
    let v = c
        .upload(&env, &export_of(vec![bad, ok, dep]), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let p = wait_deployed(&c, &env, v, 60).await;
    assert_eq!(p["by_status"]["failed"], 1, "{p}");
    let logged: Vec<String> = c
        .actions(&env, Some(&bad_id), 10)
        .await
        .unwrap()
        .iter()
        .flat_map(|a| a.messages.as_array().cloned().unwrap_or_default())
        .filter_map(|m| m["message"].as_str().map(str::to_string))
        .collect();
    assert!(!logged.is_empty());

    let viewer = c.create_token("v", "viewer", Some(&env)).await.unwrap();
    let cookie = ConsoleSession::sign_in(&srv.url, viewer["secret"].as_str().unwrap()).await;
    // found from the table filtered to failures
    let (_, html) = page(
        &cookie,
        &format!("/console/env/{env}/resources?state=failed"),
    )
    .await;
    assert_eq!(row_ids(&html), std::slice::from_ref(&bad_id));
    let href = unescape(
        html.split("class=\"resource-link mono\" href=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap(),
    );
    let (status, html) = page(&cookie, &href).await;
    assert_eq!(status, 200, "{html}");
    let text = unescape(&html);
    // its state, attributes (the content, pretty), the resource requiring it (a link)
    assert!(text.contains("id=\"resource-state\">failed<"), "{text}");
    assert!(text.contains(&format!("{d}/missing-dir/conf")));
    assert!(text.contains("never\n"), "the content as it is");
    assert!(text.contains("<th scope=\"row\" class=\"mono\">permissions</th>"));
    assert!(
        text.contains(&format!(
            "class=\"mono provides-link\" href=\"/console/env/{env}/resource?id="
        )),
        "{text}"
    );
    assert!(text.contains(&format!(">{dep_id}</a>")));
    // the handler's log line in the action log, with its level
    let log = text
        .split("id=\"action-log\"")
        .nth(1)
        .expect("an action log");
    let lines: Vec<&str> = log.split("class=\"log-line").skip(1).collect();
    assert!(
        logged
            .iter()
            .any(|m| lines.iter().any(|l| l.contains(m.as_str()))),
        "{lines:?} do not show {logged:?}"
    );
    assert!(log.contains("deploy") && log.contains("failed"));

    // the skipped one: why, and links to what it requires
    let (_, html) = page(
        &cookie,
        &format!("/console/env/{env}/resource?id={}", urlencode(&dep_id)),
    )
    .await;
    let text = unescape(&html);
    assert!(text.contains("skipped_for_dependency"), "{text}");
    assert!(text.contains("id=\"blocked-reason\"") || text.contains("id=\"last-message\""));
    assert!(text.contains(&bad_id));
    for r in [&bad_id, &ok_id] {
        let link = format!(
            "class=\"mono requires-link\" href=\"/console/env/{env}/resource?id={}\"",
            urlencode(r)
        );
        assert!(text.contains(&link), "{link} in {text}");
    }
    // an unknown resource is a 404 page; no id a 400
    let (status, _) = page(
        &cookie,
        &format!("/console/env/{env}/resource?id=nope%5Bx%2Cy%3Dz%5D"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = page(&cookie, &format!("/console/env/{env}/resource")).await;
    assert_eq!(status, 400);
    // another environment's viewer sees neither page
    let other = c
        .create_environment("console", "other", None)
        .await
        .unwrap();
    let stranger = c
        .create_token("s", "viewer", Some(&other.id.to_string()))
        .await
        .unwrap();
    let cookie = ConsoleSession::sign_in(&srv.url, stranger["secret"].as_str().unwrap()).await;
    let (status, _) = page(&cookie, &format!("/console/env/{env}/resources")).await;
    assert!(status == 403 || status == 404, "{status}");
    let (status, _) = page(&cookie, &href).await;
    assert!(status == 403 || status == 404, "{status}");
}
