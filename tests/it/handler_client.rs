//! A handler's `get_client()` (issue 29): Inmanta handler code calls the server in the middle
//! of its action, unchanged, wherever it runs (the server's executors, an external agent,
//! an SSH target). The handler reads a parameter people set, writes a fact of its own
//! resource through the client (which the model waits for with `std::getfact`, so the same
//! commit is compiled again and the waiting file deploys), and tries what an agent may not
//! do: write a parameter, read another agent's facts, reach another environment, call a
//! method Steward does not offer. Each attempt is refused with Inmanta's codes, and the
//! handler writes what it got to a journal the test reads.

use serde_json::{Value, json};

use steward::client::Client;

use crate::gitops_support::{Repo, compiled, git_ok, read};
use crate::support::{TestServer, eventually, wait_deployed};

const PROBE_CF: &str = r#"
entity Box extends std::PurgeableResource:
    string name
    string path
end

Box.host [1] -- std::Host

implement Box using std::none
"#;

const PROBE_PY: &str = r#"
import json
import os
import uuid

from inmanta.agent.handler import CRUDHandler, HandlerContext, ResourcePurged, provider
from inmanta.resources import PurgeableResource, resource


@resource("probe::Box", agent="host.name", id_attribute="name")
class Box(PurgeableResource):
    fields = ("name", "path")


@provider("probe::Box", name="probe")
class BoxHandler(CRUDHandler[Box]):
    def read_resource(self, ctx: HandlerContext, resource: Box) -> None:
        if not os.path.exists(resource.path):
            raise ResourcePurged()

    def call(self, method, *args, **kwargs):
        result = self.run_sync(lambda: getattr(self.get_client(), method)(*args, **kwargs))
        return result.code, result.result

    def create_resource(self, ctx: HandlerContext, resource: Box) -> None:
        env = self._agent.environment
        me = resource.id.resource_str()
        got = {}
        code, r = self.call("get_param", tid=env, id="region")
        got["region"] = [code, r["parameter"]["value"] if code == 200 else r]
        code, r = self.call(
            "set_param", tid=env, id="serial", source="fact", value="SN-42", resource_id=me
        )
        got["set_fact"] = [code, r["parameter"]["value"] if code == 200 else r]
        code, r = self.call("get_fact", env, me, "serial")
        got["get_fact_v2"] = [code, r["data"]["value"] if code == 200 else r]
        code, r = self.call("list_params", tid=env)
        got["list_params"] = [code, sorted(p["name"] for p in r["parameters"]) if code == 200 else r]
        code, r = self.call("get_environment", id=env)
        got["environment"] = [code, r["environment"]["name"] if code == 200 else r]
        # what an agent may not do
        got["write_parameter"] = list(self.call("set_param", tid=env, id="region", source="fact", value="xx"))
        other = me.replace(f"[{resource.id.agent_name},", "[someone-else,")
        got["other_agents_fact"] = list(self.call("get_param", tid=env, id="serial", resource_id=other))
        got["other_environment"] = list(self.call("list_params", tid=str(uuid.uuid4())))
        got["not_offered"] = list(self.call("delete_param", tid=env, id="region"))
        with open(resource.path, "w") as f:
            json.dump(got, f)
        ctx.set_created()

    def update_resource(self, ctx: HandlerContext, changes: dict, resource: Box) -> None:
        ctx.set_updated()

    def delete_resource(self, ctx: HandlerContext, resource: Box) -> None:
        os.remove(resource.path)
        ctx.set_purged()
"#;

/// The project: the `probe` module in `libs/`, a box, and a file naming the serial its
/// handler reports through the client.
fn commit_project(repo: &Repo, agent: &str) -> String {
    let lib = repo.work.join("libs/probe");
    std::fs::create_dir_all(lib.join("model")).unwrap();
    std::fs::create_dir_all(lib.join("plugins")).unwrap();
    std::fs::write(lib.join("module.yml"), "name: probe\nversion: 1.0.0\n").unwrap();
    std::fs::write(lib.join("model/_init.cf"), PROBE_CF).unwrap();
    std::fs::write(lib.join("plugins/__init__.py"), PROBE_PY).unwrap();
    let out = repo.out.display();
    let main = format!(
        r#"import probe
import fs

host = std::Host(name="{agent}", os=std::linux)
box = probe::Box(host=host, name="box1", path="{out}/box1.json")
serial = std::getfact(box, "serial")
fs::File(host=host, path="{out}/label.txt", content="serial {{{{serial}}}}\n", mode=644)
"#
    );
    repo.commit(&main, "a box and a label naming its serial")
}

/// An environment following `repo` with `settings`, its `region` parameter set.
async fn environment(c: &Client, name: &str, repo: &Repo, settings: Value) -> String {
    let env = c
        .create_environment("client", name, Some(settings))
        .await
        .unwrap()
        .id
        .to_string();
    c.set_parameter(&env, "region", None, &json!({"value": "eu-west"}))
        .await
        .unwrap();
    c.set_source(
        &env,
        &json!({"url": repo.url(), "branch": "main", "webhook_secret": "s3cret", "poll_interval": 0}),
    )
    .await
    .unwrap();
    env
}

/// Push, deploy, and read what the handler got from its client; the fact it wrote makes the
/// label deploy with it.
async fn the_handler_calls_the_server(
    c: &Client,
    env: &str,
    name: &str,
    repo: &Repo,
    commit: &str,
    log: &dyn Fn() -> String,
) {
    c.trigger_compile(env, None).await.unwrap();
    let first = compiled(c, env, commit, 60).await;
    assert_eq!(first["status"], "success", "{first:#}");
    let journal = repo.out.join("box1.json");
    let got: Value = eventually(90, "the box deployed", || async {
        serde_json::from_str(&read(&journal)?).ok()
    })
    .await;
    let env_id = env.to_string();
    assert_eq!(got["region"], json!([200, "eu-west"]), "{got:#}\n{}", log());
    assert_eq!(got["set_fact"], json!([200, "SN-42"]), "{got:#}");
    assert_eq!(got["get_fact_v2"], json!([200, "SN-42"]), "{got:#}");
    // the environment's parameters, and no facts of anyone's
    assert_eq!(got["list_params"], json!([200, ["region"]]), "{got:#}");
    assert_eq!(got["environment"], json!([200, name]), "{got:#}");
    let refused = |key: &str, code: u64, says: &str| {
        let a = &got[key];
        assert_eq!(a[0], code, "{key}: {a}");
        let msg = a[1]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(says), "{key}: {msg}");
    };
    refused("write_parameter", 403, "not the parameter 'region'");
    refused("other_agents_fact", 403, "belong to agent 'someone-else'");
    refused(
        "other_environment",
        403,
        &format!("scoped to its environment {env_id}"),
    );
    refused("not_offered", 501, "does not offer 'delete_param'");

    // the fact it wrote resolves what the model waited for: the same commit again, and the
    // label deploys with the value
    let second = eventually(90, "a recompile for the fact", || async {
        let list = c.compiles(env, 100).await.ok()?;
        list.as_array()?
            .iter()
            .find(|r| r["trigger"] == "fact" && r["status"] == "success")
            .cloned()
    })
    .await;
    assert_eq!(second["commit"], commit);
    let v2 = second["version"].as_i64().unwrap() as i32;
    let p = wait_deployed(c, env, v2, 90).await;
    assert_eq!(p["by_status"]["deployed"], 2, "{p}\n{}", log());
    assert_eq!(
        read(&repo.out.join("label.txt")).as_deref(),
        Some("serial SN-42\n")
    );
    // the parameter is as people set it
    let region = c.get_parameter(env, "region", None).await.unwrap();
    assert_eq!(region.value, "eu-west");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_on_the_server_calls_it_with_an_agents_rights() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "localhost");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = environment(&c, "local", &repo, json!({})).await;
    the_handler_calls_the_server(&c, &env, "local", &repo, &commit, &String::new).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_in_an_external_agent_calls_with_the_agents_token() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "localhost");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = environment(
        &c,
        "external",
        &repo,
        json!({"agent_map": {"localhost": "external"}}),
    )
    .await;
    let token = c
        .create_agent_token("agent", &env, &["localhost".to_string()])
        .await
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = crate::python_handlers_agent::spawn_agent(&srv, &token, &env, dir.path());
    let log_path = dir.path().join("a.log");
    let log = move || std::fs::read_to_string(&log_path).unwrap_or_default();
    the_handler_calls_the_server(&c, &env, "external", &repo, &commit, &log).await;
    let _ = agent.kill();
    let _ = agent.wait();

    // the server holds the token to the same rights, whoever calls with it
    let as_agent = Client::new(&srv.url, Some(token.clone()));
    let mine = "probe::Box[localhost,name=box1]";
    let facts = as_agent.list_facts(&env, Some(mine)).await.unwrap();
    assert_eq!(facts.len(), 1, "{facts:?}");
    let params = as_agent.list_parameters(&env, Some("")).await.unwrap();
    assert_eq!(params.len(), 1, "{params:?}");
    for denied in [
        as_agent.list_parameters(&env, None).await.err(),
        as_agent
            .list_facts(&env, Some("probe::Box[other,name=box1]"))
            .await
            .err(),
        as_agent
            .get_parameter(&env, "serial", Some("probe::Box[other,name=box1]"))
            .await
            .err(),
        as_agent
            .set_parameter(&env, "region", None, &json!({"value": "x"}))
            .await
            .err(),
    ] {
        let e = denied.expect("refused").to_string();
        assert!(e.contains("HTTP 403"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_on_an_ssh_target_calls_through_its_executor() {
    let sshd = crate::ssh_support::Sshd::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "web1");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = environment(
        &c,
        "ssh",
        &repo,
        json!({
            "agent_map": {"web1": uri},
            "ssh": {"known_hosts": sshd.known_hosts, "identity": sshd.client_key},
            "ssh_allowed": sshd.allowed(),
        }),
    )
    .await;
    let log = || sshd.log();
    the_handler_calls_the_server(&c, &env, "ssh", &repo, &commit, &log).await;
}
