//! The OpenAPI reference (`/api/v1/openapi.json`): served without a token, OpenAPI 3, and
//! describing exactly the routes the router serves. Also: every error, even axum's own
//! rejections (bodies over the limit, query strings that do not parse), is the JSON error body.

use serde_json::Value;

use crate::support::TestServer;

async fn get_doc(s: &TestServer) -> Value {
    // no token: the reference is public
    let resp = reqwest::get(format!("{}/api/v1/openapi.json", s.url))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    serde_json::from_str(&resp.text().await.unwrap()).expect("the document is JSON")
}

/// A value for a path parameter: real enough for the router to match.
fn sample(param: &str) -> &'static str {
    match param {
        "number" => "1",
        "commit" => "abcd",
        "agent" => "a1",
        "project" => "nosuchproject",
        _ => "00000000-0000-4000-8000-000000000000",
    }
}

fn fill(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').unwrap() + open;
        let name = &rest[open + 1..close];
        if path.contains("/resources/{") && name == "id" {
            // a resource id holds slashes: the catch-all must take them
            out.push_str("file[a1,path=/etc/motd]");
        } else {
            out.push_str(sample(name));
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_describes_every_route() {
    let s = TestServer::start(false).await;
    let doc = get_doc(&s).await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let paths = doc["paths"].as_object().unwrap();
    // the router and the document are built from one list (server::api), so every served
    // route is described; here the other way round: every described operation is served
    // (a path typo in an annotation would answer the router's 404 or 405)
    let http = reqwest::Client::new();
    let mut operations = 0;
    for (path, item) in paths {
        for method in ["get", "put", "post", "patch", "delete"] {
            let Some(op) = item.get(method) else {
                continue;
            };
            operations += 1;
            let url = format!("{}{}", s.url, fill(path));
            let resp = http
                .request(method.to_uppercase().parse().unwrap(), &url)
                .bearer_auth(s.admin.as_deref().unwrap())
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            assert_ne!(status, 405, "{method} {path} is not served: {body}");
            assert!(
                !(status == 404
                    && body["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains("no such endpoint")),
                "{method} {path} is not served: {body}"
            );
            // every answer is documented, by its status or by the error default
            assert!(
                op["responses"].get(status.to_string()).is_some()
                    || op["responses"].get("default").is_some(),
                "{method} {path} answered {status}, not in the document"
            );
        }
    }
    assert!(operations >= 55, "only {operations} operations");
    // the public endpoints are documented as public, the rest need the bearer token
    assert_eq!(paths["/health"]["get"]["security"], serde_json::json!([{}]));
    assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
}

async fn send(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<String>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", s.url))
        .bearer_auth(s.admin.as_deref().unwrap())
        .header("content-type", "application/json");
    if let Some(b) = body {
        req = req.body(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    assert!(
        ct.starts_with("application/json"),
        "{path}: {status} answered {ct}: {text}"
    );
    (status, serde_json::from_str(&text).expect("a JSON body"))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_is_the_json_error_body() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = c.create_environment("p", "limits", None).await.unwrap();
    let env = env.id.to_string();
    // a body over the webhook's limit (1 MiB), before any signature is looked at
    let big = "x".repeat(steward::sources::webhook::MAX_WEBHOOK_BODY + 1);
    let (st, v) = send(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/source/webhook"),
        Some(big),
    )
    .await;
    assert_eq!(st, 413, "{v}");
    assert_eq!(v["error"], "too_large", "{v}");
    assert!(v["message"].is_string(), "{v}");
    // a body over the API's limit, on an endpoint whose body is optional
    let huge = "x".repeat(steward::server::MAX_BODY + 1);
    let (st, v) = send(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/deploy"),
        Some(huge),
    )
    .await;
    assert_eq!(st, 413, "{v}");
    assert_eq!(v["error"], "too_large", "{v}");
    // a query string that does not parse
    let (st, v) = send(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions?limit=many"),
        None,
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"], "bad_request", "{v}");
    // a NUL character (PostgreSQL stores none) in a query value and in a JSON body: the
    // client's mistake, not a server error (found by scripts/fuzz-api)
    let (st, v) = send(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/actions?resource_id=a%00b"),
        None,
    )
    .await;
    assert_eq!(st, 422, "{v}");
    let mut export = serde_json::to_value(crate::support::null_export(1, None)).unwrap();
    export["provenance"] = serde_json::json!({"message": "nul \u{0} here"});
    let (st, v) = send(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/versions"),
        Some(export.to_string()),
    )
    .await;
    assert_eq!(st, 422, "{v}");
    assert_eq!(v["error"], "invalid", "{v}");
    // a method the path does not take
    let (st, v) = send(&s, reqwest::Method::PUT, "/api/v1/projects", None).await;
    assert_eq!(st, 405, "{v}");
    assert_eq!(v["error"], "method_not_allowed", "{v}");
    // the server is still fine
    assert!(c.health().await.is_ok());
}
