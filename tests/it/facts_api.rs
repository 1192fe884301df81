//! Parameters and facts (issue 29): the store, the REST API (Steward's routes and Inmanta's,
//! in the shapes inmanta-core's client sends), the `steward param` and `steward fact`
//! commands, the role rules (each test performs the attack it names), the bounds, the
//! resolution of a version's unknowns with the event the recompile trigger follows, and
//! retention of facts whose resource is gone.

use std::time::Duration;

use serde_json::{Value, json};
use steward::client::Client;
use steward::events::Event;
use steward::model::{ExportFile, Resource, ResourceId, UnknownRecord};
use steward::store::facts::{self, NewParam, ParameterItem};
use uuid::Uuid;

use crate::support::{TestServer, export_of, steward_bin};

/// A resource of agent `agent`: `vm::Host[agent,name=name]`.
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

const WEB: &str = "vm::Host[web1,name=web]";
const DB: &str = "vm::Host[db1,name=db]";

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

/// A raw request as any client (Inmanta's among them) sends it: `(status, JSON body)`.
async fn send(
    srv: &TestServer,
    token: &str,
    method: reqwest::Method,
    path: &str,
    tid: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", srv.url))
        .bearer_auth(token);
    if let Some(t) = tid {
        req = req.header("X-Inmanta-tid", t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"))
    };
    (status, v)
}

fn item(name: &str, resource_id: &str, value: &str) -> ParameterItem {
    ParameterItem {
        name: name.into(),
        resource_id: resource_id.into(),
        value: value.into(),
        ..ParameterItem::default()
    }
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

#[tokio::test(flavor = "multi_thread")]
async fn parameters_and_facts_are_set_read_listed_and_deleted() {
    let (srv, c, env) = setup("crud").await;
    // a parameter: source user, never expires
    let p = c
        .set_parameter(&env, "dbpass", None, &json!({"value": "s3cret"}))
        .await
        .unwrap();
    assert_eq!(
        (p.value.as_str(), p.source.as_str(), p.expires),
        ("s3cret", "user", false)
    );
    assert_eq!(p.resource_id, "");
    assert_eq!(
        c.get_parameter(&env, "dbpass", None).await.unwrap().value,
        "s3cret"
    );
    // facts of two resources in one batch; a versioned id is stored without its version
    let out = c
        .set_parameters(
            &env,
            &[
                item("ip", &format!("{WEB},v=1"), "10.0.0.1"),
                item("ip", DB, "10.0.0.2"),
                item("mac", WEB, "aa:bb"),
            ],
            false,
        )
        .await
        .unwrap();
    assert_eq!(out.changed.len(), 3, "{out:?}");
    assert!(out.resolved_versions.is_empty());
    let web = c.get_parameter(&env, "ip", Some(WEB)).await.unwrap();
    assert_eq!(
        (web.value.as_str(), web.expires, web.expired),
        ("10.0.0.1", true, false)
    );
    // lists: everything, one resource's facts, the parameters only, the facts only
    let all = c.list_parameters(&env, None).await.unwrap();
    assert_eq!(
        all.iter()
            .map(|p| (p.resource_id.as_str(), p.name.as_str()))
            .collect::<Vec<_>>(),
        [("", "dbpass"), (DB, "ip"), (WEB, "ip"), (WEB, "mac")]
    );
    assert_eq!(c.list_parameters(&env, Some(WEB)).await.unwrap().len(), 2);
    assert_eq!(c.list_parameters(&env, Some("")).await.unwrap().len(), 1);
    assert_eq!(c.list_facts(&env, None).await.unwrap().len(), 3);
    assert_eq!(c.list_facts(&env, Some(DB)).await.unwrap().len(), 1);
    // the same value again renews it: unchanged, but updated moves on
    tokio::time::sleep(Duration::from_millis(20)).await;
    let out = c
        .set_parameters(&env, &[item("ip", WEB, "10.0.0.1")], false)
        .await
        .unwrap();
    assert!(out.changed.is_empty(), "{out:?}");
    let renewed = c.get_parameter(&env, "ip", Some(WEB)).await.unwrap();
    assert!(renewed.updated > web.updated);
    // a fact older than fact_expire is answered as expired
    c.update_settings(&env, &json!({"fact_expire": 60}))
        .await
        .unwrap();
    sqlx::query("UPDATE parameters SET updated = now() - interval '2 minutes' WHERE name = 'mac'")
        .execute(&srv.pool)
        .await
        .unwrap();
    assert!(
        c.get_parameter(&env, "mac", Some(WEB))
            .await
            .unwrap()
            .expired
    );
    assert!(
        !c.get_parameter(&env, "ip", Some(WEB))
            .await
            .unwrap()
            .expired
    );
    // delete; then it is gone
    c.delete_parameter(&env, "dbpass", None).await.unwrap();
    let gone = c.get_parameter(&env, "dbpass", None).await.unwrap_err();
    assert_eq!(gone.status(), Some(404), "{gone}");
    let again = c.delete_parameter(&env, "dbpass", None).await.unwrap_err();
    assert_eq!(again.status(), Some(404), "{again}");
    // every write is in the audit log: the parameter, the batch; the renewal by an admin too
    assert_eq!(audit_count(&srv, &env, "parameters.set").await, 3);
    assert_eq!(audit_count(&srv, &env, "parameter.delete").await, 1);
    // the environment by name works as elsewhere
    assert_eq!(c.list_facts("facts/crud", None).await.unwrap().len(), 3);
}

/// Run `steward` against the server; `(exit code, stdout, stderr)`.
pub fn cli(srv: &TestServer, token: &str, env: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(steward_bin())
        .args(args)
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", token)
        .env("STEWARD_ENV", env)
        .env("XDG_CACHE_HOME", srv.client_cache())
        .env_remove("STEWARD_CA_CERT")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_sets_gets_lists_and_deletes_parameters_and_lists_facts() {
    let (srv, c, env) = setup("cli").await;
    let admin = srv.admin.clone().unwrap();
    let (code, out, err) = cli(&srv, &admin, &env, &["param", "set", "region", "eu-west"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("parameter region: set"), "{out}");
    let (code, out, _) = cli(&srv, &admin, &env, &["param", "set", "region", "eu-west"]);
    assert_eq!(code, 0);
    assert!(out.contains("unchanged"), "{out}");
    let (code, out, err) = cli(&srv, &admin, &env, &["param", "get", "region"]);
    assert_eq!((code, out.as_str()), (0, "eu-west\n"), "{err}");
    let (code, out, _) = cli(&srv, &admin, &env, &["param", "list"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        out.contains("region") && out.contains("eu-west") && out.contains("never"),
        "{out}"
    );
    let (code, out, _) = cli(&srv, &admin, &env, &["param", "list", "--json"]);
    assert_eq!(code, 0);
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["source"], "user");
    // a fact through the CLI, listed by `fact list`
    let (code, out, err) = cli(
        &srv,
        &admin,
        &env,
        &["param", "set", "ip", "10.1.1.1", "--resource", WEB],
    );
    assert_eq!(code, 0, "{out}{err}");
    c.set_parameters(&env, &[item("ip", DB, "10.1.1.2")], false)
        .await
        .unwrap();
    let (code, out, _) = cli(&srv, &admin, &env, &["fact", "list"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("RESOURCE"), "{out}");
    assert!(
        out.contains(WEB) && out.contains(DB) && out.contains("10.1.1.1"),
        "{out}"
    );
    assert!(!out.contains("region"), "parameters are not facts: {out}");
    let (code, out, _) = cli(&srv, &admin, &env, &["fact", "list", "--resource", DB]);
    assert_eq!(code, 0);
    assert!(out.contains(DB) && !out.contains(WEB), "{out}");
    let (code, out, _) = cli(&srv, &admin, &env, &["fact", "list", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Vec<Value>>(&out).unwrap().len(), 2);
    // delete, then get fails with the server's reason
    let (code, out, _) = cli(&srv, &admin, &env, &["param", "delete", "region"]);
    assert_eq!(code, 0);
    assert!(out.contains("deleted"), "{out}");
    let (code, _, err) = cli(&srv, &admin, &env, &["param", "get", "region"]);
    assert_eq!(code, 2);
    assert!(err.contains("parameter 'region' not found"), "{err}");
    // a viewer is refused a write, with the reason
    let viewer = c.create_token("v", "viewer", Some(&env)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, _, err) = cli(&srv, &viewer, &env, &["param", "set", "region", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("viewer token may not write"), "{err}");
    // the help says what the commands are for
    let (code, out, _) = cli(&srv, &admin, &env, &["param", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("getfact") && out.contains("delete"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn inmanta_clients_set_and_read_facts_through_inmantas_routes() {
    use reqwest::Method as M;
    let (srv, c, env) = setup("inmanta").await;
    let admin = srv.admin.clone().unwrap();
    let agent = c
        .create_agent_token("web1", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    // what an Inmanta agent sends after a deploy with ctx.set_fact (set_parameters)
    let (st, v) = send(
        &srv,
        &agent,
        M::PUT,
        "/api/v1/parameters",
        Some(&env),
        Some(json!({"parameters": [
            {"id": "ip", "value": "10.0.0.7", "resource_id": format!("{WEB},v=1"),
             "source": "fact", "metadata": {"handler": "vm"}, "expires": true},
            {"id": "cores", "value": 4, "resource_id": WEB, "source": "fact"},
        ]})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // get_param (as std::getfact and handlers call it)
    let (st, v) = send(
        &srv,
        &admin,
        M::GET,
        &format!("/api/v1/parameter/ip?resource_id={}", urlencode(WEB)),
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let p = &v["parameter"];
    assert_eq!(p["value"], "10.0.0.7");
    assert_eq!(p["resource_id"], WEB);
    assert_eq!(p["source"], "fact");
    assert_eq!(p["environment"], env.as_str());
    assert_eq!(p["metadata"]["handler"], "vm");
    assert_eq!(p["expires"], true);
    assert!(Uuid::parse_str(p["id"].as_str().unwrap()).is_ok());
    assert!(p["updated"].is_string());
    // a non-text value is stored as Python's str() of it
    assert_eq!(
        c.get_parameter(&env, "cores", Some(WEB))
            .await
            .unwrap()
            .value,
        "4"
    );
    // a fact not known yet of a known resource: 503 (its agent is asked); of an unknown one: 404
    let (st, v) = send(
        &srv,
        &admin,
        M::GET,
        &format!("/api/v1/parameter/disk?resource_id={}", urlencode(DB)),
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 503, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("not known yet"),
        "{v}"
    );
    let (st, _) = send(
        &srv,
        &admin,
        M::GET,
        &format!(
            "/api/v1/parameter/disk?resource_id={}",
            urlencode("vm::Host[x,name=gone]")
        ),
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 404);
    // an expired fact is 503 too
    c.update_settings(&env, &json!({"fact_expire": 60}))
        .await
        .unwrap();
    sqlx::query("UPDATE parameters SET updated = now() - interval '1 hour' WHERE name = 'cores'")
        .execute(&srv.pool)
        .await
        .unwrap();
    let (st, v) = send(
        &srv,
        &admin,
        M::GET,
        &format!("/api/v1/parameter/cores?resource_id={}", urlencode(WEB)),
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 503, "{v}");
    assert!(v["message"].as_str().unwrap().contains("expired"), "{v}");
    // set_param and get_param of an environment parameter
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        "/api/v1/parameter/region",
        Some(&env),
        Some(json!({"source": "user", "value": "eu", "metadata": {"team": "ops"}, "recompile": false})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["parameter"]["value"], "eu");
    assert_eq!(v["parameter"]["resource_id"], "");
    assert_eq!(v["parameter"]["expires"], false);
    let (st, v) = send(
        &srv,
        &admin,
        M::GET,
        "/api/v1/parameter/region",
        Some(&env),
        None,
    )
    .await;
    assert_eq!((st, &v["parameter"]["value"]), (200, &json!("eu")), "{v}");
    // an expiring parameter is refused (Inmanta refuses it too)
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        "/api/v1/parameter/region",
        Some(&env),
        Some(json!({"source": "user", "value": "eu", "expires": true})),
    )
    .await;
    assert_eq!(st, 422, "{v}");
    // list_params: filtered by metadata
    let (st, v) = send(
        &srv,
        &admin,
        M::POST,
        "/api/v1/parameter",
        Some(&env),
        Some(json!({"query": {"team": "ops"}})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["parameters"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["expire"], 60);
    let (st, v) = send(
        &srv,
        &admin,
        M::POST,
        "/api/v1/parameter",
        Some(&env),
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["parameters"].as_array().unwrap().len(), 3, "{v}");
    // v2: set_fact and set_parameter answer {"data": …}, get_facts lists a resource's facts
    let (st, v) = send(
        &srv,
        &agent,
        M::PUT,
        "/api/v2/facts/mem",
        Some(&env),
        Some(json!({"source": "fact", "value": "8G", "resource_id": WEB, "recompile": false})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"]["value"], "8G");
    assert_eq!(v["data"]["expires"], true);
    let fact_id = v["data"]["id"].as_str().unwrap().to_string();
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        "/api/v2/parameters/tier",
        Some(&env),
        Some(json!({"source": "user", "value": "gold"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"]["value"], "gold");
    assert!(v["data"].get("resource_id").is_none(), "{v}");
    let (st, v) = send(
        &srv,
        &admin,
        M::GET,
        &format!("/api/v2/resource/{}/facts", urlencode(WEB)),
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let names: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cores", "ip", "mem"]);
    let (st, v) = send(
        &srv,
        &admin,
        M::GET,
        &format!("/api/v2/resource/{}/facts/{fact_id}", urlencode(WEB)),
        Some(&env),
        None,
    )
    .await;
    assert_eq!((st, &v["data"]["name"]), (200, &json!("mem")), "{v}");
    // delete_param
    let (st, v) = send(
        &srv,
        &admin,
        M::DELETE,
        "/api/v1/parameter/region",
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, _) = send(
        &srv,
        &admin,
        M::GET,
        "/api/v1/parameter/region",
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 404);
    // no X-Inmanta-tid: a clear 400
    let (st, v) = send(&srv, &admin, M::GET, "/api/v1/parameter/region", None, None).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("X-Inmanta-tid"),
        "{v}"
    );
}

fn urlencode(s: &str) -> String {
    steward::client::encode_segment(s)
}

#[tokio::test(flavor = "multi_thread")]
async fn roles_decide_who_reads_and_writes_and_agents_write_only_their_facts() {
    use reqwest::Method as M;
    let (srv, c, env) = setup("roles").await;
    let token = |role: &'static str| {
        let c = c.clone();
        let env = env.clone();
        async move {
            c.create_token(role, role, Some(&env)).await.unwrap()["secret"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    let viewer = token("viewer").await;
    let approver = token("approver").await;
    let compiler = token("compiler").await;
    let web_agent = c
        .create_agent_token("web1", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let any_agent = c.create_token("all", "agent", Some(&env)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    c.set_parameter(&env, "region", None, &json!({"value": "eu"}))
        .await
        .unwrap();
    let params = format!("/api/v1/environments/{env}/parameters");
    let region = format!("{params}/region");
    let batch = |rid: &str| json!({"parameters": [{"name": "ip", "resource_id": rid, "value": "10.9.9.9"}]});

    // a viewer reads, and writing is refused with the reason
    let (st, v) = send(&srv, &viewer, M::GET, &params, None, None).await;
    assert_eq!((st, v.as_array().map(Vec::len)), (200, Some(1)), "{v}");
    for (who, t) in [("viewer", &viewer), ("approver", &approver)] {
        let (st, v) = send(&srv, t, M::PUT, &region, None, Some(json!({"value": "us"}))).await;
        assert_eq!(st, 403, "{who}: {v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains(&format!("a {who} token may not write")),
            "{v}"
        );
        let (st, _) = send(&srv, t, M::PUT, &params, None, Some(batch(WEB))).await;
        assert_eq!(st, 403, "{who}");
        let (st, _) = send(&srv, t, M::DELETE, &region, None, None).await;
        assert_eq!(st, 403, "{who}");
        let (st, _) = send(
            &srv,
            t,
            M::PUT,
            "/api/v1/parameters",
            Some(&env),
            Some(json!({"parameters": [{"id": "x", "value": "y", "source": "user"}]})),
        )
        .await;
        assert_eq!(st, 403, "{who} through Inmanta's route");
    }
    assert_eq!(
        c.get_parameter(&env, "region", None).await.unwrap().value,
        "eu"
    );
    // a compiler writes parameters and facts
    let (st, v) = send(
        &srv,
        &compiler,
        M::PUT,
        &region,
        None,
        Some(json!({"value": "us"})),
    )
    .await;
    assert_eq!(st, 200, "{v}");

    // an agent token for web1 writes a fact of web1's resource, through both routes
    let (st, v) = send(&srv, &web_agent, M::PUT, &params, None, Some(batch(WEB))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        c.get_parameter(&env, "ip", Some(WEB)).await.unwrap().source,
        "fact"
    );
    // … but not one of db1's resource: refused, naming the agent, and nothing written (also
    // when the batch holds one of its own)
    let (st, v) = send(&srv, &web_agent, M::PUT, &params, None, Some(batch(DB))).await;
    assert_eq!(st, 403, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("not agent 'db1'"),
        "{v}"
    );
    let (st, _) = send(
        &srv,
        &web_agent,
        M::PUT,
        "/api/v1/parameters",
        Some(&env),
        Some(json!({"parameters": [
            {"id": "disk", "value": "1", "resource_id": WEB, "source": "fact"},
            {"id": "disk", "value": "1", "resource_id": DB, "source": "fact"}]})),
    )
    .await;
    assert_eq!(st, 403);
    let (st, _) = send(
        &srv,
        &web_agent,
        M::PUT,
        "/api/v2/facts/disk",
        Some(&env),
        Some(json!({"source": "fact", "value": "1", "resource_id": DB})),
    )
    .await;
    assert_eq!(st, 403);
    assert!(c.list_parameters(&env, Some(DB)).await.unwrap().is_empty());
    assert!(c.get_parameter(&env, "disk", Some(WEB)).await.is_err());
    // … nor a parameter
    let (st, v) = send(
        &srv,
        &web_agent,
        M::PUT,
        &region,
        None,
        Some(json!({"value": "mars"})),
    )
    .await;
    assert_eq!(st, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("facts only"), "{v}");
    let (st, _) = send(
        &srv,
        &web_agent,
        M::PUT,
        "/api/v1/parameters",
        Some(&env),
        Some(json!({"parameters": [{"id": "region", "value": "mars", "source": "fact"}]})),
    )
    .await;
    assert_eq!(st, 403);
    let (st, _) = send(
        &srv,
        &web_agent,
        M::PUT,
        "/api/v2/parameters/region",
        Some(&env),
        Some(json!({"source": "fact", "value": "mars"})),
    )
    .await;
    assert_eq!(st, 403, "an agent token reaches no other route");
    assert_eq!(
        c.get_parameter(&env, "region", None).await.unwrap().value,
        "us"
    );
    // … it reads what its handlers' `get_client()` may: the environment's parameters and
    // its own agent's facts, one resource at a time …
    for path in [
        format!("{params}?resource_id="),
        format!("{params}/region"),
        format!("{params}/ip?resource_id={}", urlencode(WEB)),
        format!(
            "/api/v1/environments/{env}/facts?resource_id={}",
            urlencode(WEB)
        ),
    ] {
        let (st, v) = send(&srv, &web_agent, M::GET, &path, None, None).await;
        assert_eq!(st, 200, "GET {path}: {v}");
    }
    // … and nothing else, and deletes nothing
    for (m, path) in [
        (M::GET, params.clone()),
        (M::GET, format!("/api/v1/environments/{env}/facts")),
        (M::GET, format!("{params}/ip?resource_id={}", urlencode(DB))),
        (
            M::GET,
            format!(
                "/api/v1/environments/{env}/facts?resource_id={}",
                urlencode(DB)
            ),
        ),
        (
            M::DELETE,
            format!("{params}/ip?resource_id={}", urlencode(WEB)),
        ),
    ] {
        let (st, v) = send(&srv, &web_agent, m.clone(), &path, None, None).await;
        assert_eq!(st, 403, "{m} {path}: {v}");
    }
    let (st, _) = send(
        &srv,
        &web_agent,
        M::GET,
        "/api/v1/parameter/ip",
        Some(&env),
        None,
    )
    .await;
    assert_eq!(st, 403);
    // an agent token that names no agents writes facts of any resource of its environment
    let (st, v) = send(&srv, &any_agent, M::PUT, &params, None, Some(batch(DB))).await;
    assert_eq!(st, 200, "{v}");

    // a token of another environment is refused, by path and by X-Inmanta-tid
    let other = c
        .create_environment("facts", "other", None)
        .await
        .unwrap()
        .id
        .to_string();
    let other_admin = c.create_token("oa", "admin", Some(&other)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let other_agent = c.create_token("oa", "agent", Some(&other)).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    for t in [&other_admin, &other_agent] {
        let (st, v) = send(&srv, t, M::PUT, &params, None, Some(batch(DB))).await;
        assert_eq!(st, 403, "{v}");
        let (st, v) = send(&srv, t, M::PUT, "/api/v1/parameters", Some(&env), Some(json!({"parameters": [{"id": "ip", "value": "6.6.6.6", "resource_id": DB, "source": "fact"}]}))).await;
        assert_eq!(st, 403, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("another environment"),
            "{v}"
        );
    }
    let (st, _) = send(&srv, &other_admin, M::GET, &params, None, None).await;
    assert_eq!(st, 403);
    assert_eq!(
        c.get_parameter(&env, "ip", Some(DB)).await.unwrap().value,
        "10.9.9.9"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_out_of_bounds_are_refused_with_a_reason() {
    use reqwest::Method as M;
    let (srv, c, env) = setup("bounds").await;
    let admin = srv.admin.clone().unwrap();
    let params = format!("/api/v1/environments/{env}/parameters");
    // 1001 values in one batch
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"name": format!("p{i}"), "value": "x"}))
        .collect();
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        &params,
        None,
        Some(json!({"parameters": many})),
    )
    .await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"], "invalid");
    assert!(
        v["message"].as_str().unwrap().contains("at most 1000"),
        "{v}"
    );
    // and through Inmanta's route
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({"id": format!("p{i}"), "value": "x", "source": "user"}))
        .collect();
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        "/api/v1/parameters",
        Some(&env),
        Some(json!({"parameters": many})),
    )
    .await;
    assert_eq!(st, 422, "{v}");
    // a 1 MB value (the body fits the 1 MiB limit; the value does not fit 64 KiB)
    let big = "x".repeat(1_000_000);
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        &format!("{params}/big"),
        None,
        Some(json!({"value": big})),
    )
    .await;
    assert_eq!(st, 422, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("1000000 bytes"),
        "{v}"
    );
    // a body over the limit: 413 with the JSON error
    let huge = "x".repeat(2_000_000);
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        &format!("{params}/big"),
        None,
        Some(json!({"value": huge})),
    )
    .await;
    assert_eq!(st, 413, "{v}");
    assert_eq!(v["error"], "too_large");
    // a name too long, a resource id that is not one, an unknown source, an expiring parameter
    for (body, says) in [
        (
            json!({"parameters": [{"name": "n".repeat(256), "value": "x"}]}),
            "longer than 255",
        ),
        (
            json!({"parameters": [{"name": "ip", "resource_id": "web", "value": "x"}]}),
            "not a resource id",
        ),
        (
            json!({"parameters": [{"name": "ip", "value": "x", "source": "guess"}]}),
            "source 'guess'",
        ),
        (
            json!({"parameters": [{"name": "ip", "value": "x", "expires": true}]}),
            "never expires",
        ),
        (
            json!({"parameters": [{"name": "ip", "value": "a\u{0}b"}]}),
            "NUL",
        ),
    ] {
        let (st, v) = send(&srv, &admin, M::PUT, &params, None, Some(body)).await;
        assert_eq!(st, 422, "{v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{says}: {v}");
    }
    // a body of the wrong shape
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        &params,
        None,
        Some(json!({"params": []})),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        c.list_parameters(&env, None).await.unwrap().is_empty(),
        "nothing was written"
    );
}

/// The next `Event::Facts` of `env` (other events are skipped), or None within `secs`.
async fn next_facts_event(
    rx: &mut tokio::sync::broadcast::Receiver<Event>,
    env: Uuid,
    secs: u64,
) -> Option<Event> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(e @ Event::Facts { environment, .. })) if environment == env => return Some(e),
            Ok(Ok(_)) => continue,
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_that_resolves_an_unknown_marks_its_versions_and_tells_the_trigger() {
    let (srv, c, env) = setup("unknowns").await;
    let id: Uuid = env.parse().unwrap();
    let unknowns = vec![
        UnknownRecord {
            resource_id: WEB.into(),
            name: "ip".into(),
            source: "fact".into(),
        },
        UnknownRecord {
            resource_id: String::new(),
            name: "dbpass".into(),
            source: "parameter".into(),
        },
        // a duplicate is recorded once
        UnknownRecord {
            resource_id: WEB.into(),
            name: "ip".into(),
            source: "fact".into(),
        },
    ];
    let export = ExportFile {
        unknowns: unknowns.clone(),
        undefined: vec![ResourceId(WEB.into())],
        ..export_of(vec![host("web1", "web"), host("db1", "db")])
    };
    let v2 = c.upload(&env, &export, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let v3 = c.upload(&env, &export, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let recorded = facts::unknowns_of(&srv.pool, id, v2).await.unwrap();
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert!(recorded.iter().all(|(_, resolved)| !resolved));
    // the version's export carries them (a rollback keeps them)
    let exported =
        steward::store::versions::export_of(&mut srv.pool.acquire().await.unwrap(), id, v2)
            .await
            .unwrap();
    assert_eq!(exported.unknowns.len(), 2);

    let mut events = srv.notifier.subscribe();
    // an agent reports the fact: both versions waiting for it are resolved, and the trigger hears
    let agent = c
        .create_agent_token("web1", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, v) = send(
        &srv,
        &agent,
        reqwest::Method::PUT,
        "/api/v1/parameters",
        Some(&env),
        Some(json!({"parameters": [{"id": "ip", "value": "10.0.0.1", "resource_id": format!("{WEB},v={v3}"), "source": "fact"}]})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let e = next_facts_event(&mut events, id, 5)
        .await
        .expect("an Event::Facts");
    assert_eq!(
        e,
        Event::Facts {
            environment: id,
            resolved_versions: vec![v2, v3],
            changed: vec![(WEB.into(), "ip".into())],
            recompile: false,
        }
    );
    for v in [v2, v3] {
        let got = facts::unknowns_of(&srv.pool, id, v).await.unwrap();
        let ip = got.iter().find(|(u, _)| u.name == "ip").unwrap();
        let pass = got.iter().find(|(u, _)| u.name == "dbpass").unwrap();
        assert!(ip.1 && !pass.1, "{got:?}");
    }
    // the agent's renewal (same value) resolves nothing, changes nothing, tells nobody and is
    // not audited
    let audited = audit_count(&srv, &env, "parameters.set").await;
    let (st, _) = send(
        &srv,
        &agent,
        reqwest::Method::PUT,
        "/api/v1/parameters",
        Some(&env),
        Some(json!({"parameters": [{"id": "ip", "value": "10.0.0.1", "resource_id": WEB, "source": "fact"}]})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(next_facts_event(&mut events, id, 1).await, None);
    assert_eq!(audit_count(&srv, &env, "parameters.set").await, audited);
    // a changed value with recompile asked: recompile; the parameter the compile missed: resolved
    let out = c
        .set_parameters(&env, &[item("dbpass", "", "s3cret")], true)
        .await
        .unwrap();
    assert_eq!(out.resolved_versions, vec![v2, v3]);
    let e = next_facts_event(&mut events, id, 5).await.unwrap();
    assert!(
        matches!(&e, Event::Facts { resolved_versions, recompile: true, changed, .. }
            if *resolved_versions == vec![v2, v3] && *changed == vec![(String::new(), "dbpass".to_string())]),
        "{e:?}"
    );
    // recompile asked but nothing changed: no event
    c.set_parameters(&env, &[item("dbpass", "", "s3cret")], true)
        .await
        .unwrap();
    assert_eq!(next_facts_event(&mut events, id, 1).await, None);
    // a deleted parameter asks for a recompile
    c.delete_parameter(&env, "dbpass", None).await.unwrap();
    let e = next_facts_event(&mut events, id, 5).await.unwrap();
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

    // the store function itself, in a transaction: changed and resolved versions
    let v4 = c.upload(&env, &export, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let mut tx = srv.pool.begin().await.unwrap();
    let fact = |name: &str, value: &str| NewParam {
        name: name.into(),
        resource_id: WEB.into(),
        value: value.into(),
        source: "fact".into(),
        metadata: json!({}),
        expires: true,
    };
    let out = facts::set_many(&mut tx, id, &[fact("ip", "10.0.0.1"), fact("mac", "aa")])
        .await
        .unwrap();
    assert_eq!(
        out.changed,
        vec![(WEB.to_string(), "mac".to_string())],
        "ip is the same value"
    );
    assert_eq!(
        out.resolved_versions,
        vec![v4],
        "v2 and v3 were resolved before"
    );
    tx.rollback().await.unwrap();
    assert!(
        facts::unknowns_of(&srv.pool, id, v4)
            .await
            .unwrap()
            .iter()
            .all(|(_, r)| !r),
        "rolled back with the transaction"
    );
    assert!(c.get_parameter(&env, "mac", Some(WEB)).await.is_err());
    // a version stored after its value arrived while its compile ran: resolve_existing
    // tells the trigger; a value older than the compile (it was in its facts file) does not
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let long_ago = chrono::Utc::now() - chrono::Duration::hours(1);
    assert!(
        !facts::resolve_existing(&srv.pool, id, v4, later)
            .await
            .unwrap()
    );
    assert!(
        facts::resolve_existing(&srv.pool, id, v4, long_ago)
            .await
            .unwrap()
    );
    assert!(
        !facts::resolve_existing(&srv.pool, id, v4, long_ago)
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_removes_facts_of_resources_that_are_gone() {
    let (srv, c, env) = setup("retention").await;
    let id: Uuid = env.parse().unwrap();
    // version 2 holds WEB only; version 1 (with DB) is deleted
    c.upload(&env, &export_of(vec![host("web1", "web")]), json!({}))
        .await
        .unwrap();
    c.set_parameters(
        &env,
        &[
            item("ip", WEB, "1"),
            item("ip", DB, "2"),
            item("disk", DB, "3"),
            item("region", "", "eu"),
        ],
        false,
    )
    .await
    .unwrap();
    let r = steward::model::settings::Retention::default();
    // DB is still in version 1: kept
    let p = steward::store::retention::prune_environment(&srv.pool, id, &r, None)
        .await
        .unwrap();
    assert_eq!(p.facts, 0);
    c.delete_version(&env, 1).await.unwrap();
    // gone from every version, but written within the hour: kept (its version may be coming)
    let p = steward::store::retention::prune_environment(&srv.pool, id, &r, None)
        .await
        .unwrap();
    assert_eq!(p.facts, 0);
    sqlx::query("UPDATE parameters SET updated = now() - interval '2 hours'")
        .execute(&srv.pool)
        .await
        .unwrap();
    let p = steward::store::retention::prune_environment(&srv.pool, id, &r, None)
        .await
        .unwrap();
    assert_eq!(p.facts, 2);
    let left: Vec<(String, String)> = c
        .list_parameters(&env, None)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.resource_id, p.name))
        .collect();
    assert_eq!(
        left,
        [
            (String::new(), "region".to_string()),
            (WEB.to_string(), "ip".to_string())
        ],
        "the parameter and the fact of a resource still there stay"
    );
    // the pass over everything counts them too
    let p = steward::store::retention::prune_all(&srv.pool, None)
        .await
        .unwrap();
    assert_eq!(p.facts, 0);
}

/// A value marked secret keeps the mark through new values and renewals that do not say,
/// loses it only when told, and an agent token can not mark one.
#[tokio::test(flavor = "multi_thread")]
async fn the_secret_mark_stays_until_it_is_cleared_and_agents_can_not_set_it() {
    use reqwest::Method as M;
    let (srv, c, env) = setup("secret").await;
    let admin = srv.admin.clone().unwrap();
    let secret = |name: &str| {
        let c = c.clone();
        let (env, name) = (env.clone(), name.to_string());
        async move { c.get_parameter(&env, &name, None).await.unwrap().secret }
    };
    let path = format!("/api/v1/environments/{env}/parameters/dbpass");
    let (st, v) = send(
        &srv,
        &admin,
        M::PUT,
        &path,
        None,
        Some(json!({"value": "a", "secret": true})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["secret"], true);
    // a new value, and a batch write, that do not say: still secret
    send(
        &srv,
        &admin,
        M::PUT,
        &path,
        None,
        Some(json!({"value": "b"})),
    )
    .await;
    assert!(secret("dbpass").await);
    c.set_parameters(&env, &[item("dbpass", "", "c")], false)
        .await
        .unwrap();
    assert!(secret("dbpass").await);
    // cleared when told
    send(
        &srv,
        &admin,
        M::PUT,
        &path,
        None,
        Some(json!({"value": "c", "secret": false})),
    )
    .await;
    assert!(!secret("dbpass").await);
    // an agent token: refused
    let agent = c
        .create_agent_token("web1", &env, &["web1".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, v) = send(
        &srv,
        &agent,
        M::PUT,
        &format!("/api/v1/environments/{env}/parameters"),
        None,
        Some(json!({"parameters": [{"name": "ip", "resource_id": WEB, "value": "1", "secret": false}]})),
    )
    .await;
    assert_eq!(st, 403, "{v}");
}
