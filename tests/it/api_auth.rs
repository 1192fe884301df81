//! The auth matrix: each role × each action × its own and another environment.

use serde_json::json;
use steward::model::Role;

use crate::support::{TestServer, null_export};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Needs {
    Read,
    Upload,
    Release,
    Report,
    Manage,
    Global,
}

fn role_may(role: Role, needs: Needs) -> bool {
    match needs {
        // agent tokens reach only their agent sessions and handler code (attacker::tokens)
        Needs::Read => role != Role::Agent,
        Needs::Upload => matches!(role, Role::Admin | Role::Compiler),
        Needs::Release => matches!(role, Role::Admin | Role::Approver),
        // the action report route; agents report through their sessions
        Needs::Report => role == Role::Admin,
        Needs::Manage => role == Role::Admin,
        Needs::Global => false, // environment tokens never may
    }
}

struct Action {
    name: &'static str,
    needs: Needs,
    method: reqwest::Method,
    /// `{env}` and `{v}` are filled in.
    path: &'static str,
    body: Option<serde_json::Value>,
}

fn actions() -> Vec<Action> {
    use reqwest::Method as M;
    let export = serde_json::to_value(null_export(2, None)).unwrap();
    let action = json!({
        "id": "00000000-0000-0000-0000-000000000000", "environment_id": "00000000-0000-0000-0000-000000000000",
        "version": 1, "resource_id": "std::testing::NullResource[internal,name=r0]", "action": "deploy",
        "started_at": "2026-01-01T00:00:00Z", "finished_at": null, "status": "deployed", "change": "nochange",
        "changes": {}, "messages": []
    });
    vec![
        Action {
            name: "get environment",
            needs: Needs::Read,
            method: M::GET,
            path: "/api/v1/environments/{env}",
            body: None,
        },
        Action {
            name: "list versions",
            needs: Needs::Read,
            method: M::GET,
            path: "/api/v1/environments/{env}/versions",
            body: None,
        },
        Action {
            name: "list resources",
            needs: Needs::Read,
            method: M::GET,
            path: "/api/v1/environments/{env}/resources",
            body: None,
        },
        Action {
            name: "read settings",
            needs: Needs::Read,
            method: M::GET,
            path: "/api/v1/environments/{env}/settings",
            body: None,
        },
        Action {
            name: "read action log",
            needs: Needs::Read,
            method: M::GET,
            path: "/api/v1/environments/{env}/actions",
            body: None,
        },
        Action {
            name: "upload version",
            needs: Needs::Upload,
            method: M::POST,
            path: "/api/v1/environments/{env}/versions",
            body: Some(export),
        },
        Action {
            name: "release",
            needs: Needs::Release,
            method: M::POST,
            path: "/api/v1/environments/{env}/versions/{v}/release",
            body: None,
        },
        Action {
            name: "reject",
            needs: Needs::Release,
            method: M::POST,
            path: "/api/v1/environments/{env}/versions/{v}/reject",
            body: None,
        },
        Action {
            name: "rollback",
            needs: Needs::Release,
            method: M::POST,
            path: "/api/v1/environments/{env}/versions/1/rollback",
            body: None,
        },
        Action {
            name: "report action",
            needs: Needs::Report,
            method: M::POST,
            path: "/api/v1/environments/{env}/actions",
            body: Some(action),
        },
        Action {
            name: "change settings",
            needs: Needs::Manage,
            method: M::PATCH,
            path: "/api/v1/environments/{env}/settings",
            body: Some(json!({"handler_timeout": 60})),
        },
        Action {
            name: "delete version",
            needs: Needs::Manage,
            method: M::DELETE,
            path: "/api/v1/environments/{env}/versions/{v}",
            body: None,
        },
        Action {
            name: "read audit",
            needs: Needs::Manage,
            method: M::GET,
            path: "/api/v1/environments/{env}/audit",
            body: None,
        },
        Action {
            name: "create token",
            needs: Needs::Manage,
            method: M::POST,
            path: "/api/v1/tokens",
            body: Some(json!({"name": "x", "role": "viewer", "environment": "{env}"})),
        },
        Action {
            name: "rename environment",
            needs: Needs::Manage,
            method: M::PATCH,
            path: "/api/v1/environments/{env}",
            body: Some(json!({"name": "{name}"})),
        },
        Action {
            name: "create environment",
            needs: Needs::Global,
            method: M::POST,
            path: "/api/v1/environments",
            body: Some(json!({"project": "p", "name": "new-{n}"})),
        },
        Action {
            name: "delete environment",
            needs: Needs::Global,
            method: M::DELETE,
            path: "/api/v1/environments/{env}",
            body: None,
        },
        Action {
            name: "global audit",
            needs: Needs::Global,
            method: M::GET,
            path: "/api/v1/audit",
            body: None,
        },
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_matrix() {
    let s = TestServer::start(false).await;
    let admin = s.admin_client();
    let a = admin
        .create_environment("p", "a", Some(json!({"auto_release": false})))
        .await
        .unwrap();
    let b = admin
        .create_environment("p", "b", Some(json!({"auto_release": false})))
        .await
        .unwrap();
    // a released version 1 in both, so that rollbacks have a target
    for env in [&a, &b] {
        let id = env.id.to_string();
        admin
            .upload(&id, &null_export(2, None), json!({}))
            .await
            .unwrap();
        admin.release(&id, 1, "").await.unwrap();
    }
    let mut tokens = Vec::new();
    for role in Role::ALL {
        let t = admin
            .create_token(
                &format!("{}-a", role.as_str()),
                role.as_str(),
                Some(&a.id.to_string()),
            )
            .await
            .unwrap();
        tokens.push((role, t["secret"].as_str().unwrap().to_string()));
    }
    let http = reqwest::Client::new();
    let mut n = 0;
    let mut failures = Vec::new();
    for action in actions() {
        for (role, secret) in &tokens {
            for (target, own) in [(&a, true), (&b, false)] {
                n += 1;
                // fresh, unreleased version to act on
                let fresh = admin
                    .upload(
                        &target.id.to_string(),
                        &null_export(2, Some(n % 2)),
                        json!({}),
                    )
                    .await
                    .unwrap();
                let v = fresh["number"].to_string();
                let fill = |x: &str| {
                    x.replace("{env}", &target.id.to_string())
                        .replace("{v}", &v)
                        .replace("{n}", &n.to_string())
                        .replace("{name}", if own { "a" } else { "b" })
                };
                let mut req = http
                    .request(
                        action.method.clone(),
                        format!("{}{}", s.url, fill(action.path)),
                    )
                    .bearer_auth(secret);
                if let Some(body) = &action.body {
                    req = req
                        .header("content-type", "application/json")
                        .body(fill(&body.to_string()));
                }
                let resp = req.send().await.unwrap();
                let status = resp.status().as_u16();
                let expect_allowed = own && role_may(*role, action.needs);
                let denied = status == 403;
                if expect_allowed == denied || status == 401 || status >= 500 {
                    failures.push(format!(
                        "{} as {} on {} env: HTTP {status} (expected {})",
                        action.name,
                        role.as_str(),
                        if own { "own" } else { "other" },
                        if expect_allowed { "allowed" } else { "403" }
                    ));
                }
            }
        }
    }
    // the global admin may do everything everywhere
    for action in actions() {
        let fresh = admin
            .upload(&b.id.to_string(), &null_export(2, None), json!({}))
            .await
            .unwrap();
        n += 1;
        let path = action
            .path
            .replace("{env}", &b.id.to_string())
            .replace("{v}", &fresh["number"].to_string());
        if action.name == "delete environment" {
            continue;
        }
        let mut req = http
            .request(action.method.clone(), format!("{}{}", s.url, path))
            .bearer_auth(s.admin.as_deref().unwrap());
        if let Some(body) = &action.body {
            let body = body
                .to_string()
                .replace("{env}", &b.id.to_string())
                .replace("{n}", &n.to_string())
                .replace("{name}", "b");
            req = req.header("content-type", "application/json").body(body);
        }
        let status = req.send().await.unwrap().status().as_u16();
        if status == 401 || status == 403 || status >= 500 {
            failures.push(format!("{} as global admin: HTTP {status}", action.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} checks failed:\n{}",
        failures.len(),
        n,
        failures.join("\n")
    );
}

/// Names that are no names: a NUL (which PostgreSQL can not store), another control
/// character, a bidirectional override, an empty or oversized agent list. Each answers 422
/// with a JSON body saying what is wrong, never a 404 or a 500, and nothing is created.
#[tokio::test(flavor = "multi_thread")]
async fn bad_token_and_agent_names_are_422_with_a_reason() {
    let srv = TestServer::start(false).await;
    let admin = srv.admin_client();
    let env = admin
        .create_environment("names", "prod", None)
        .await
        .unwrap()
        .id
        .to_string();
    let http = reqwest::Client::new();
    let post = |body: serde_json::Value| {
        let (http, url, token) = (http.clone(), srv.url.clone(), srv.admin.clone().unwrap());
        async move {
            let r = http
                .post(format!("{url}/api/v1/tokens"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap();
            (status, body)
        }
    };
    let many: Vec<String> = (0..1001).map(|i| format!("agent-{i}")).collect();
    let cases = [
        (
            json!({"name": "a\u{0}b", "role": "viewer", "environment": env}),
            "U+0000",
        ),
        (
            json!({"name": "a\u{0}b", "role": "viewer", "environment": "no-such-env"}),
            "U+0000",
        ),
        (
            json!({"name": "ops\u{1b}[31m", "role": "viewer", "environment": env}),
            "U+001B",
        ),
        (
            json!({"name": "txt.exe\u{202e}fdp", "role": "viewer", "environment": env}),
            "U+202E",
        ),
        (
            json!({"name": "   ", "role": "viewer", "environment": env}),
            "not blank",
        ),
        (
            json!({"name": "x".repeat(201), "role": "viewer", "environment": env}),
            "1 to 200",
        ),
        (
            json!({"name": "a", "role": "agent", "environment": env, "agents": many}),
            "1 to 1000 agents",
        ),
        (
            json!({"name": "a", "role": "agent", "environment": env, "agents": ["x".repeat(256)]}),
            "agent name",
        ),
        (
            json!({"name": "a", "role": "agent", "environment": env, "agents": ["web\u{0}1"]}),
            "U+0000",
        ),
    ];
    for (body, says) in cases {
        let (status, answer) = post(body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {answer}");
    }
    let list = admin.tokens(Some(&env), true).await.unwrap();
    assert!(
        list.is_empty(),
        "nothing was created: {} tokens",
        list.len()
    );
}
