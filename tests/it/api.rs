//! The REST API over real HTTP and a real PostgreSQL: every endpoint, bad inputs, restarts.

use serde_json::json;
use steward::client::Client;

use crate::support::{TestServer, metrics_text, null_export};

async fn raw(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
    content_type: Option<&str>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", server.url));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.body(b.to_string());
    }
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(json!({ "raw": text })),
    )
}

async fn setup_env(c: &Client, name: &str, auto_release: bool) -> String {
    let env = c
        .create_environment("proj", name, Some(json!({ "auto_release": auto_release })))
        .await
        .unwrap();
    env.id.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn projects_and_environments() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = c.create_environment("acme", "dev", None).await.unwrap();
    assert_eq!(env.project, "acme");
    assert!(env.settings.auto_release);
    let prod = c
        .create_environment(
            "acme",
            "prod",
            Some(json!({"protected": true, "agent_parallelism": 4})),
        )
        .await
        .unwrap();
    assert_eq!(prod.settings.agent_parallelism, 4);
    // duplicate name
    assert_eq!(
        c.create_environment("acme", "dev", None)
            .await
            .unwrap_err()
            .status(),
        Some(409)
    );
    // by id, by name, by project/name
    for key in [env.id.to_string(), "dev".into(), "acme/dev".into()] {
        let got = c.environment(&key).await.unwrap();
        assert_eq!(got["id"], json!(env.id));
    }
    assert_eq!(c.environments().await.unwrap().len(), 2);
    let projects = c.projects().await.unwrap();
    assert_eq!(projects.len(), 1);
    // settings: read, change, reject invalid ones
    let s1 = c
        .update_settings(
            "acme/dev",
            &json!({"deploy_interval": "*/5 * * * *", "auto_release": false}),
        )
        .await
        .unwrap();
    assert_eq!(s1["deploy_interval"], "*/5 * * * *");
    assert_eq!(c.settings("acme/dev").await.unwrap()["auto_release"], false);
    for bad in [
        json!({"nope": 1}),
        json!({"agent_parallelism": 0}),
        json!({"deploy_interval": "every now and then"}),
        json!({"deploy_interval": "*/0 * * * *"}),
        json!({"repair_interval": "0 3 * * 8"}),
        json!({"repair_interval": "0 0 3 * * *"}),
        json!({"source": "svn"}),
        json!([1, 2]),
    ] {
        let e = c.update_settings("acme/dev", &bad).await.unwrap_err();
        assert_eq!(e.status(), Some(400), "{bad}: {e}");
    }
    // rename
    let (st, v) = raw(
        &s,
        reqwest::Method::PATCH,
        &format!("/api/v1/environments/{}", env.id),
        s.admin.as_deref(),
        Some(r#"{"name":"development"}"#),
        Some("application/json"),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["name"], "development");
    // protected environments refuse deletion
    assert_eq!(
        c.delete_environment("acme/prod")
            .await
            .unwrap_err()
            .status(),
        Some(409)
    );
    c.update_settings("acme/prod", &json!({"protected": false}))
        .await
        .unwrap();
    c.delete_environment("acme/prod").await.unwrap();
    assert_eq!(
        c.environment("acme/prod").await.unwrap_err().status(),
        Some(404)
    );
    // project endpoints
    let (st, v) = raw(
        &s,
        reqwest::Method::GET,
        "/api/v1/projects/acme",
        s.admin.as_deref(),
        None,
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(v["environments"].as_array().unwrap().len(), 1);
    let (st, _) = raw(
        &s,
        reqwest::Method::PATCH,
        "/api/v1/projects/acme",
        s.admin.as_deref(),
        Some(r#"{"name":"acme2"}"#),
        Some("application/json"),
    )
    .await;
    assert_eq!(st, 200);
    let (st, _) = raw(
        &s,
        reqwest::Method::DELETE,
        "/api/v1/projects/acme2",
        s.admin.as_deref(),
        None,
        None,
    )
    .await;
    assert_eq!(st, 204);
    assert!(c.environments().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn version_lifecycle() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "v", false).await;
    let v1 = c
        .upload(&env, &null_export(5, None), json!({"commit": "abc"}))
        .await
        .unwrap();
    assert_eq!(v1["number"], 1);
    assert_eq!(v1["status"], "new");
    assert_eq!(v1["auto_released"], false);
    assert_eq!(v1["diff_summary"]["new"], 5);
    assert_eq!(v1["provenance"]["commit"], "abc");
    let v2 = c
        .upload(&env, &null_export(5, Some(3)), json!({}))
        .await
        .unwrap();
    assert_eq!(
        v2["diff_summary"],
        json!({"new": 0, "updated": 1, "deleted": 0, "unchanged": 4})
    );
    let shown = c.version(&env, 2).await.unwrap();
    let d = &shown["diff"][0];
    assert_eq!(d["change"], "updated");
    assert_eq!(
        d["attributes"]["fail"],
        json!({"current": false, "desired": true})
    );
    let between = c.diff(&env, 2, 1).await.unwrap();
    assert_eq!(between["summary"]["updated"], 1);
    assert_eq!(
        between["changes"][0]["attributes"]["fail"]["desired"],
        false
    );
    // a release is bound to the content hash the approver saw
    let (st, v) = raw(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/versions/2/release"),
        s.admin.as_deref(),
        Some(r#"{"comment":"looks good","content_hash":"deadbeef"}"#),
        Some("application/json"),
    )
    .await;
    assert_eq!(st, 409, "{v}");
    let r = c.release(&env, 2, "looks good").await.unwrap();
    assert_eq!(r.status, "released");
    let approvals = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/2/approvals"),
        s.admin.as_deref(),
        None,
        None,
    )
    .await
    .1;
    assert_eq!(approvals[0]["content_hash"], json!(r.content_hash));
    assert_eq!(approvals[0]["approver"], "test admin");
    assert_eq!(approvals[0]["comment"], "looks good");
    // older than the active version: use a rollback
    assert_eq!(
        c.release(&env, 1, "").await.unwrap_err().status(),
        Some(409)
    );
    assert_eq!(c.reject(&env, 1, "no").await.unwrap().status, "rejected");
    assert_eq!(
        c.reject(&env, 1, "no").await.unwrap_err().status(),
        Some(409)
    );
    // rollback: a new version with old content, released, holding auto-release
    c.update_settings(&env, &json!({"auto_release": true}))
        .await
        .unwrap();
    let rb = c.rollback(&env, 1, "back").await.unwrap();
    assert_eq!(rb.number, 3);
    assert_eq!(rb.status, "released");
    assert_eq!(rb.origin, "rollback");
    let v4 = c
        .upload(&env, &null_export(6, None), json!({}))
        .await
        .unwrap();
    assert_eq!(
        v4["auto_released"], false,
        "auto-release is held after a rollback"
    );
    c.release(&env, 4, "").await.unwrap();
    let v5 = c
        .upload(&env, &null_export(7, None), json!({}))
        .await
        .unwrap();
    assert_eq!(
        v5["auto_released"], true,
        "an explicit release ends the hold"
    );
    // the active version can not be deleted; others can
    assert_eq!(
        c.delete_version(&env, 5).await.unwrap_err().status(),
        Some(409)
    );
    c.delete_version(&env, 1).await.unwrap();
    assert_eq!(c.version(&env, 1).await.unwrap_err().status(), Some(404));
    let list = c.versions(&env).await.unwrap();
    assert_eq!(list.len(), 4);
    assert_eq!(list[0]["number"], 5);
    assert_eq!(list[0]["active"], true);
    // the stored export round-trips
    let (st, exp) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/5/export"),
        s.admin.as_deref(),
        None,
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(exp["resources"].as_array().unwrap().len(), 7);
    // retention keeps the newest N and the active one
    c.update_settings(
        &env,
        &json!({"version_retention": 2, "auto_release": false}),
    )
    .await
    .unwrap();
    c.upload(&env, &null_export(2, None), json!({}))
        .await
        .unwrap();
    let numbers: Vec<i64> = c
        .versions(&env)
        .await
        .unwrap()
        .iter()
        .map(|v| v["number"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, vec![6, 5]);
}

#[tokio::test(flavor = "multi_thread")]
async fn git_environments_refuse_uploads() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = c
        .create_environment("p", "git", Some(json!({"source": "git"})))
        .await
        .unwrap();
    let e = c
        .upload(&env.id.to_string(), &null_export(1, None), json!({}))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(409));
    assert!(e.to_string().contains("git"), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_history_and_action_log() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "r", true).await;
    assert!(c.resources(&env).await.unwrap().1.is_empty());
    c.upload(&env, &null_export(3, None), json!({}))
        .await
        .unwrap();
    c.upload(&env, &null_export(3, Some(2)), json!({}))
        .await
        .unwrap();
    let (version, rows) = c.resources(&env).await.unwrap();
    assert_eq!(version, Some(2));
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.status == "available"));
    let id = "std::testing::NullResource[internal,name=r2]";
    let detail = c.resource(&env, id).await.unwrap();
    assert_eq!(detail["resource"]["attributes"]["fail"], true);
    assert_eq!(detail["versions"], json!([2, 1]));
    assert_eq!(detail["changes"].as_array().unwrap().len(), 2);
    // an executor reports an action: at start, then complete
    let mut rec = steward::store::actions::ActionRecord {
        id: uuid::Uuid::new_v4(),
        environment_id: uuid::Uuid::nil(),
        version: 2,
        resource_id: id.into(),
        action: "deploy".into(),
        started_at: chrono::Utc::now(),
        finished_at: None,
        status: "deploying".into(),
        change: "nochange".into(),
        changes: json!({}),
        messages: json!([]),
    };
    c.report_action(&env, &rec).await.unwrap();
    rec.finished_at = Some(chrono::Utc::now());
    rec.status = "deployed".into();
    rec.change = "created".into();
    rec.changes = json!({"purged": {"current": true, "desired": false}});
    rec.messages = json!([{"level": "info", "message": "created it", "fields": {"path": "/x"}, "at": chrono::Utc::now()}]);
    c.report_action(&env, &rec).await.unwrap();
    let log = c.actions(&env, Some(id), 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].status, "deployed");
    assert_eq!(log[0].messages[0]["fields"]["path"], "/x");
    // bad records are refused
    rec.action = "explode".into();
    assert_eq!(
        c.report_action(&env, &rec).await.unwrap_err().status(),
        Some(400)
    );
    assert_eq!(
        c.resource(&env, "nope[x,y=z]").await.unwrap_err().status(),
        Some(404)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_inputs_get_json_errors() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "bad", false).await;
    let a = s.admin.as_deref();
    let json_ct = Some("application/json");
    let versions = format!("/api/v1/environments/{env}/versions");
    // (method, path, content type, body, expected status)
    type Case<'a> = (
        reqwest::Method,
        String,
        Option<&'a str>,
        Option<&'a str>,
        u16,
    );
    let cases: Vec<Case> = vec![
        (
            reqwest::Method::POST,
            versions.clone(),
            Some("{not json"),
            json_ct,
            400,
        ),
        (
            reqwest::Method::POST,
            versions.clone(),
            Some("{}"),
            json_ct,
            400,
        ),
        (
            reqwest::Method::POST,
            versions.clone(),
            Some(r#"{"format":1}"#),
            Some("text/plain"),
            415,
        ),
        (
            reqwest::Method::GET,
            "/api/v1/environments/no-such-env".into(),
            None,
            None,
            404,
        ),
        (
            reqwest::Method::GET,
            format!("/api/v1/environments/{}", uuid::Uuid::new_v4()),
            None,
            None,
            404,
        ),
        (
            reqwest::Method::GET,
            format!("{versions}/abc"),
            None,
            None,
            400,
        ),
        (
            reqwest::Method::GET,
            format!("{versions}/999"),
            None,
            None,
            404,
        ),
        (
            reqwest::Method::POST,
            format!("{versions}/999/release"),
            None,
            None,
            404,
        ),
        (
            reqwest::Method::GET,
            "/api/v1/nothing-here".into(),
            None,
            None,
            404,
        ),
        (reqwest::Method::PUT, versions.clone(), None, None, 405),
        (
            reqwest::Method::POST,
            "/api/v1/tokens".into(),
            Some(r#"{"name":"x","role":"god"}"#),
            json_ct,
            400,
        ),
        (
            reqwest::Method::DELETE,
            "/api/v1/tokens/not-a-uuid".into(),
            None,
            None,
            400,
        ),
        (
            reqwest::Method::POST,
            "/api/v1/environments".into(),
            Some(r#"{"project":"p","name":"bad name!"}"#),
            json_ct,
            404,
        ),
    ];
    for (m, path, body, ct, want) in cases {
        let (st, v) = raw(&s, m.clone(), &path, a, body, ct).await;
        assert_eq!(st, want, "{m} {path}: {v}");
        assert!(
            v["error"].is_string() && v["message"].is_string(),
            "{m} {path}: not a JSON error: {v}"
        );
    }
    // an export that contradicts itself
    let mut e = null_export(3, None);
    e.resources[2].id = e.resources[1].id.clone();
    let err = c.upload(&env, &e, json!({})).await.unwrap_err();
    assert_eq!(err.status(), Some(422), "{err}");
    let mut e = null_export(3, None);
    e.resources[1]
        .requires
        .push(steward::model::ResourceId("x::Y[a,b=c]".into()));
    assert_eq!(
        c.upload(&env, &e, json!({})).await.unwrap_err().status(),
        Some(422)
    );
    // oversized bodies
    let huge = "x".repeat(steward::server::UPLOAD_BODY + 1);
    let (st, v) = raw(
        &s,
        reqwest::Method::POST,
        &versions,
        a,
        Some(&huge),
        json_ct,
    )
    .await;
    assert_eq!(st, 413, "{v}");
    // a body over 1 MiB under the limit: an export of 6,000 resources is stored, and the
    // same text cut short is a bad request with a JSON body
    let big = serde_json::to_string(&null_export(6_000, None)).unwrap();
    assert!(big.len() > 1 << 20, "{} bytes", big.len());
    let (st, v) = raw(&s, reqwest::Method::POST, &versions, a, Some(&big), json_ct).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["resource_count"], 6_000, "{v}");
    let cut = &big[..big.len() - 10];
    let (st, v) = raw(&s, reqwest::Method::POST, &versions, a, Some(cut), json_ct).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"], "bad_request", "{v}");
    // the server is still fine
    assert!(c.health().await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_audit() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "t", true).await;
    let t = c.create_token("ci", "compiler", Some(&env)).await.unwrap();
    let secret = t["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("stw_"));
    let ci = s.client(Some(&secret));
    ci.upload(&env, &null_export(1, None), json!({}))
        .await
        .unwrap();
    // secrets are stored hashed
    let stored: Vec<(String,)> = sqlx::query_as("SELECT secret_hash FROM tokens")
        .fetch_all(&s.pool)
        .await
        .unwrap();
    assert!(
        stored
            .iter()
            .all(|(h,)| !h.contains(&secret) && h.len() == 64)
    );
    let tokens = c.tokens(Some(&env), false).await.unwrap();
    assert_eq!(tokens.len(), 1);
    assert!(tokens[0].last_used_at.is_some());
    c.revoke_token(t["id"].as_str().unwrap()).await.unwrap();
    assert_eq!(
        ci.upload(&env, &null_export(1, None), json!({}))
            .await
            .unwrap_err()
            .status(),
        Some(401)
    );
    // a global token needs the admin role
    let e = c.create_token("g", "viewer", None).await.unwrap_err();
    assert_eq!(e.status(), Some(422), "{e}");
    // every mutation is in the audit log
    let (st, audit) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/audit"),
        s.admin.as_deref(),
        None,
        None,
    )
    .await;
    assert_eq!(st, 200);
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for want in [
        "environment.create",
        "token.create",
        "version.upload",
        "token.revoke",
    ] {
        assert!(actions.contains(&want), "{want} missing from {actions:?}");
    }
    let upload = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "version.upload")
        .unwrap();
    assert_eq!(upload["actor"], "ci");
    // no token at all
    assert_eq!(
        s.client(None).environments().await.unwrap_err().status(),
        Some(401)
    );
    assert_eq!(
        s.client(Some("stw_wrong"))
            .environments()
            .await
            .unwrap_err()
            .status(),
        Some(401)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_auth_mode_accepts_everything() {
    let s = TestServer::start(true).await;
    let c = s.client(None);
    let env = c.create_environment("p", "dev", None).await.unwrap();
    c.upload(&env.id.to_string(), &null_export(2, None), json!({}))
        .await
        .unwrap();
    let (st, audit) = raw(&s, reqwest::Method::GET, "/api/v1/audit", None, None, None).await;
    assert_eq!(st, 200);
    assert!(audit[0]["actor"].as_str().unwrap().contains("no-auth"));
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_metrics() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "m", true).await;
    c.upload(&env, &null_export(4, None), json!({}))
        .await
        .unwrap();
    let h = c.health().await.unwrap();
    assert_eq!(h["database"], "ok");
    // metrics name environments: no token, no metrics
    let anonymous = reqwest::get(format!("{}/metrics", s.url)).await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let text = metrics_text(&s.url, s.admin.as_deref().unwrap()).await;
    assert!(
        text.contains("steward_http_requests_total{method=\"POST\",status=\"201\"}"),
        "{text}"
    );
    assert!(
        text.contains("steward_versions{environment=\"proj/m\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("steward_resources{environment=\"proj/m\",status=\"available\"} 4"),
        "{text}"
    );
    assert!(text.contains("steward_database_up 1"));
    assert!(
        text.contains("steward_deploy_state_unstored_rows_total 0"),
        "{text}"
    );
    // made-up methods do not grow the label set; a scoped token sees its environment only
    let client = reqwest::Client::new();
    for i in 0..20 {
        let m = reqwest::Method::from_bytes(format!("BREW{i}").as_bytes()).unwrap();
        client
            .request(m, format!("{}/health", s.url))
            .send()
            .await
            .unwrap();
    }
    setup_env(&c, "other", true).await;
    let scoped = c
        .create_token("metrics-viewer", "viewer", Some(&env))
        .await
        .unwrap();
    let text = metrics_text(&s.url, scoped["secret"].as_str().unwrap()).await;
    assert!(!text.contains("BREW"), "{text}");
    assert!(text.contains("method=\"OTHER\""), "{text}");
    assert!(text.contains("proj/m"), "{text}");
    assert!(
        !text.contains("proj/other"),
        "a scoped token sees another environment: {text}"
    );
}

/// What deploying a version changed is counted in the database from its actions since its
/// release, each resource once, by its last change: past 10,000 actions too (the `steward deploy` summary asked for 10,000
/// actions and reported "10000 created" after creating 100,000 resources).
#[tokio::test(flavor = "multi_thread")]
async fn a_version_report_counts_every_resource_it_changed() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "report", false).await;
    c.upload(&env, &null_export(3, None), json!({}))
        .await
        .unwrap();
    let env_id: uuid::Uuid = env.parse().unwrap();
    // a version not released made no change
    let none = c.changes_made(&env, 1, 20).await.unwrap();
    assert_eq!(none, Default::default());
    c.release(&env, 1, "test").await.unwrap();
    // version 1: 10,050 resources created, each by one deploy action
    sqlx::query(
        "INSERT INTO resource_actions (id, environment_id, version, resource_id, action, started_at, status, change) \
         SELECT gen_random_uuid(), $1, 1, 'test::R[a,k=' || lpad(i::text, 6, '0') || ']', 'deploy', \
                clock_timestamp(), 'deployed', 'created' \
         FROM generate_series(1, 10050) i",
    )
    .bind(env_id)
    .execute(&s.pool)
    .await
    .unwrap();
    let later = |rid: &str, action: &str, change: &str, version: i32| {
        sqlx::query(
            "INSERT INTO resource_actions (id, environment_id, version, resource_id, action, started_at, status, change) \
             VALUES (gen_random_uuid(), $1, $2, $3, $4, clock_timestamp(), 'deployed', $5)",
        )
        .bind(env_id)
        .bind(version)
        .bind(rid.to_string())
        .bind(action.to_string())
        .bind(change.to_string())
    };
    // one of them repaired later in the same version: counted once, as updated
    later("test::R[a,k=000007]", "repair", "updated", 1)
        .execute(&s.pool)
        .await
        .unwrap();
    c.upload(&env, &null_export(3, Some(1)), json!({}))
        .await
        .unwrap();
    c.release(&env, 2, "test").await.unwrap();
    // a no-change run, a dry-run and another version's action change nothing here
    for (rid, action, change, version) in [
        ("test::R[a,k=000008]", "repair", "nochange", 1),
        ("test::R[a,k=dry]", "dryrun", "updated", 1),
        ("test::R[a,k=000009]", "deploy", "purged", 2),
    ] {
        later(rid, action, change, version)
            .execute(&s.pool)
            .await
            .unwrap();
    }

    let made = c.changes_made(&env, 1, 20).await.unwrap();
    assert_eq!(
        (made.created, made.updated, made.purged),
        (10_049, 1, 0),
        "{made:?}"
    );
    let named: Vec<(&str, &str)> = made
        .first
        .iter()
        .map(|(id, change)| (id.as_str(), change.as_str()))
        .collect();
    assert_eq!(named.len(), 20);
    assert_eq!(named[0], ("test::R[a,k=000001]", "created"));
    assert_eq!(named[6], ("test::R[a,k=000007]", "updated"));
    assert_eq!(named[19], ("test::R[a,k=000020]", "created"));
    let other = c.changes_made(&env, 2, 1000).await.unwrap();
    assert_eq!((other.created, other.updated, other.purged), (0, 0, 1));
    assert_eq!(
        other.first,
        vec![("test::R[a,k=000009]".to_string(), "purged".to_string())]
    );
    // at most 1,000 named; an unknown version is a 404 with a JSON body
    let (st, body) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/1/report?limit=5000"),
        s.admin.as_deref(),
        None,
        None,
    )
    .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["first"].as_array().unwrap().len(), 1000);
    assert_eq!(body["created"], 10_049);
    let (st, body) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/9/report"),
        s.admin.as_deref(),
        None,
        None,
    )
    .await;
    assert_eq!(st, 404, "{body}");
    assert_eq!(body["error"], "not_found", "{body}");
}

/// A version's diff is stored in statements of a bounded size (PostgreSQL keeps a
/// statement's parameters until it ends): one changing more resources than a statement
/// holds is stored whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_diff_larger_than_one_statement_is_stored_whole() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "bigdiff", false).await;
    let n = steward::store::ROWS_PER_STATEMENT * 2 + 50;
    let first = null_export(n, None);
    c.upload(&env, &first, json!({})).await.unwrap();
    let mut every = first.clone();
    for r in &mut every.resources {
        r.attributes.insert("fail".into(), true.into());
    }
    let v2 = c.upload(&env, &every, json!({})).await.unwrap();
    assert_eq!(v2["diff_summary"]["updated"], n);
    let (stored, updated): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE change = 'updated' \
           AND attributes -> 'fail' = '{\"current\": false, \"desired\": true}'::jsonb) \
         FROM version_diffs WHERE environment_id = $1 AND version = 2",
    )
    .bind(env.parse::<uuid::Uuid>().unwrap())
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!((stored, updated), (n as i64, n as i64));
}

/// A progress wait that never ends done (no scheduler here to deploy the version) runs for
/// its whole wait, counting the version's states less and less often: about twenty counts
/// in 20 s, not one every few milliseconds.
#[tokio::test(flavor = "multi_thread")]
async fn a_progress_wait_that_is_never_done_keeps_to_its_schedule() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "waiting", true).await;
    let v = c
        .upload(&env, &null_export(50, None), json!({}))
        .await
        .unwrap();
    assert_eq!(v["auto_released"], true, "{v}");
    // every count of the states by status reads the version's spans once
    let scans = || async {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let n: i64 = sqlx::query_scalar(
            "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'resource_spans'",
        )
        .fetch_one(&s.pool)
        .await
        .unwrap();
        n
    };
    let before = scans().await;
    let started = std::time::Instant::now();
    let p = c
        .progress_when_done(&env, 1, std::time::Duration::from_secs(20))
        .await
        .unwrap();
    let waited = started.elapsed();
    let counted = scans().await - before;
    assert_eq!(
        (&p["done"], &p["phase"]),
        (&json!(false), &json!("deploying")),
        "{p}"
    );
    assert!(
        waited >= std::time::Duration::from_millis(19_900)
            && waited < std::time::Duration::from_secs(25),
        "answered after {waited:?}"
    );
    assert!(
        (5..=60).contains(&counted),
        "{counted} scans of the spans in a 20 s wait"
    );
}

/// Held progress requests are bounded per environment: past the bound a wait is refused at
/// once (429, JSON, Retry-After) instead of being held, another environment's waits are not
/// affected, a wait the client gives up frees its slot, and over a held period the states are
/// counted within what the held waits may count (the refused ones count nothing).
#[tokio::test(flavor = "multi_thread")]
async fn progress_waits_are_bounded_per_environment() {
    use std::time::{Duration, Instant};
    use steward::server::waits::Waits;
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = setup_env(&c, "crowded", true).await;
    let other = setup_env(&c, "quiet", true).await;
    for e in [&env, &other] {
        c.upload(e, &null_export(50, None), json!({}))
            .await
            .unwrap();
    }
    let http = reqwest::Client::new();
    let ask = |env: &str, wait_ms: u64| {
        http.get(format!(
            "{}/api/v1/environments/{env}/versions/1/progress?wait_ms={wait_ms}",
            s.url
        ))
        .bearer_auth(s.admin.as_deref().unwrap())
        .send()
    };
    let scans = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'resource_spans'",
        )
        .fetch_one(&s.pool)
        .await
        .unwrap();
        n
    };

    // a crowd that gives up after a second: its slots come back
    let crowd: Vec<_> = (0..Waits::PER_ENVIRONMENT)
        .map(|_| tokio::spawn(ask(&env, 30_000)))
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let refused = ask(&env, 30_000).await.unwrap();
    assert_eq!(
        refused.status(),
        429,
        "a wait past the bound while the crowd waits"
    );
    for w in crowd {
        w.abort();
    }
    let freed = Instant::now();
    loop {
        let r = ask(&env, 200).await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(5),
            "slots of waits given up still held after {:?}",
            freed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // the bound held for 15 s
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = scans().await;
    let started = Instant::now();
    let held: Vec<_> = (0..Waits::PER_ENVIRONMENT)
        .map(|_| tokio::spawn(ask(&env, 15_000)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut refusals = 0;
    while started.elapsed() < Duration::from_secs(13) {
        let asked = Instant::now();
        let r = ask(&env, 15_000).await.unwrap();
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "a refusal is at once"
        );
        assert_eq!(r.status(), 429);
        assert_eq!(
            r.headers().get("retry-after").map(|v| v.to_str().unwrap()),
            Some("1")
        );
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "too_many_waits", "{body}");
        refusals += 1;
        if refusals == 1 {
            // another environment is not held back by this one's crowd
            let t = Instant::now();
            let r = ask(&other, 2_000).await.unwrap();
            assert_eq!(r.status(), 200);
            assert!(
                t.elapsed() >= Duration::from_millis(1_900),
                "{:?}",
                t.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the client library waits out a refusal instead of failing
    let p = c
        .progress_when_done(&env, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(p["done"], false, "{p}");
    for w in held {
        let r = w.await.unwrap().unwrap();
        assert_eq!(r.status(), 200);
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(14_900), "held {waited:?}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let counted = scans().await - before;
    // each held wait counts about a dozen times in 15 s (see the test above); the refused
    // ones and the other environment's (a handful) add nothing past that
    eprintln!("{refusals} refusals, {counted} scans of the spans in {waited:?}");
    assert!(refusals >= 50, "{refusals} refusals in 13 s");
    assert!(
        counted <= (Waits::PER_ENVIRONMENT as i64 + 2) * 50,
        "{counted} scans of the spans with {} waits held for 15 s",
        Waits::PER_ENVIRONMENT
    );
    assert_eq!(ask(&env, 100).await.unwrap().status(), 200);
}
