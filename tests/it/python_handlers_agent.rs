//! Inmanta handler code in an external agent process (`steward agent run`): fetched from the
//! server by digest (checked with its requirements and imports), run by the agent's executors
//! in their handler host; version-bound cache entries go when an action of a newer version
//! starts there.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::json;

use crate::deploy::deploying_env;
use crate::python_handlers::{demo_code, journal, resource, upload, with_code};
use crate::support::{AgentProc, TestServer, eventually, steward_bin, wait_deployed};

pub fn spawn_agent(srv: &TestServer, token: &str, env: &str, dir: &Path) -> AgentProc {
    AgentProc(spawn_agent_child(srv, token, env, dir))
}

fn spawn_agent_child(srv: &TestServer, token: &str, env: &str, dir: &Path) -> Child {
    Command::new(steward_bin())
        .args(["agent", "run", "--name", "localhost"])
        .env("STEWARD_SERVER", &srv.url)
        .env("STEWARD_TOKEN", token)
        .env("STEWARD_ENV", env)
        .env("STEWARD_AGENT_DIR", dir.join("a.work"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("a.log")).unwrap())
        .spawn()
        .expect("spawn steward agent run")
}

#[tokio::test(flavor = "multi_thread")]
async fn inmanta_handler_code_runs_in_an_external_agent() {
    let (srv, c, env, dir) = deploying_env(
        "ext-inmanta",
        json!({"agent_map": {"localhost": "external"}}),
    )
    .await;
    let d = dir.path();
    let jpath = d.join("journal");
    let j = jpath.to_str().unwrap();
    let target = d.join("agent.conf");
    let file = |content: &str| {
        resource(
            "demo::File",
            "path",
            target.to_str().unwrap(),
            json!({"content": content, "journal": j}),
            &[],
        )
    };
    let code = demo_code();
    let v1 = upload(&c, &env, &with_code(vec![file("one\n")], &code)).await;
    let names = vec!["localhost".to_string()];
    let token = c.create_agent_token("agent", &env, &names).await.unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let mut agent = spawn_agent(&srv, &token, &env, d);
    let p = wait_deployed(&c, &env, v1, 60).await;
    assert_eq!(
        p["by_status"]["deployed"],
        1,
        "{p}\n{}",
        std::fs::read_to_string(d.join("a.log")).unwrap_or_default()
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "one\n");
    // cached by digest under the agent's work dir, next to Steward's Python package
    let codes = d.join("a.work/code");
    assert!(codes.join(&code.0.digest).join(".complete").is_file());
    assert!(std::fs::read_dir(&codes).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("steward-python-")
    }));

    let v2 = upload(&c, &env, &with_code(vec![file("two\n")], &code)).await;
    wait_deployed(&c, &env, v2, 60).await;
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "two\n");
    eventually(20, "the v1 entry to go once v2 runs there", || async {
        journal(&jpath)
            .contains(&"dropped v1".to_string())
            .then_some(())
    })
    .await;
    agent.kill().unwrap();
    agent.wait().unwrap();
}
