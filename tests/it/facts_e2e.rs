//! Facts end to end (issue 29): a git source, the server with its scheduler and real
//! executors, a project-local module whose `@provider` makes something (a file standing for
//! a VM) and reports `ip_address` with `ctx.set_fact`; the model uses
//! `std::getfact(vm, "ip_address")` in another resource. The first version deploys the VM
//! and marks the other resource undefined; the fact arrives; the same commit is compiled
//! again (`trigger: fact`), and that version deploys the other resource with the value.

use serde_json::json;

use steward::client::Client;

use crate::gitops_support::{Repo, compiled, git_ok, read, timeline};
use crate::support::{TestServer, eventually, wait_deployed};

const VM_CF: &str = r#"
entity Host extends std::PurgeableResource:
    """A machine the module makes (a file here), which learns its address when made."""
    string name
    string path
end

Host.host [1] -- std::Host

implement Host using std::none
"#;

const VM_PY: &str = r#"
import os

from inmanta.agent.handler import CRUDHandler, HandlerContext, ResourcePurged, provider
from inmanta.resources import PurgeableResource, resource


@resource("vm::Host", agent="host.name", id_attribute="name")
class Host(PurgeableResource):
    fields = ("name", "path")


@provider("vm::Host", name="vm")
class HostHandler(CRUDHandler[Host]):
    def read_resource(self, ctx: HandlerContext, resource: Host) -> None:
        if not os.path.exists(resource.path):
            raise ResourcePurged()

    def create_resource(self, ctx: HandlerContext, resource: Host) -> None:
        with open(resource.path, "w") as f:
            f.write("10.0.0.7\n")
        ctx.set_created()
        # what the made thing learned: its address
        ctx.set_fact("ip_address", "10.0.0.7")

    def update_resource(self, ctx: HandlerContext, changes: dict, resource: Host) -> None:
        ctx.set_updated()

    def delete_resource(self, ctx: HandlerContext, resource: Host) -> None:
        os.remove(resource.path)
        ctx.set_purged()

    def facts(self, ctx: HandlerContext, resource: Host) -> dict:
        with open(resource.path) as f:
            return {"ip_address": f.read().strip()}
"#;

/// The project: the `vm` module in `libs/`, a VM and a file that names its address.
fn commit_project(repo: &Repo, agent: &str) -> String {
    let lib = repo.work.join("libs/vm");
    std::fs::create_dir_all(lib.join("model")).unwrap();
    std::fs::create_dir_all(lib.join("plugins")).unwrap();
    std::fs::write(lib.join("module.yml"), "name: vm\nversion: 1.0.0\n").unwrap();
    std::fs::write(lib.join("model/_init.cf"), VM_CF).unwrap();
    std::fs::write(lib.join("plugins/__init__.py"), VM_PY).unwrap();
    let out = repo.out.display();
    let main = format!(
        r#"import vm
import fs

host = std::Host(name="{agent}", os=std::linux)
machine = vm::Host(host=host, name="vm1", path="{out}/vm1")
ip = std::getfact(machine, "ip_address")
fs::File(host=host, path="{out}/web.conf", content="backend {{{{ip}}}}\n", mode=644)
"#
    );
    repo.commit(&main, "a vm and a file naming its address")
}

/// An environment with `settings` following `repo`'s main branch (polling off).
async fn follow_with(c: &Client, name: &str, repo: &Repo, settings: serde_json::Value) -> String {
    let env = c
        .create_environment("facts", name, Some(settings))
        .await
        .unwrap()
        .id
        .to_string();
    c.set_source(
        &env,
        &json!({"url": repo.url(), "branch": "main", "webhook_secret": "s3cret", "poll_interval": 0}),
    )
    .await
    .unwrap();
    env
}

/// The whole loop, whatever runs the handlers: the push compiles (the VM deploys, the file
/// naming its address is undefined), the handler's fact arrives, the same commit is compiled
/// again once, and its version deploys the file with the value. `log` is shown on failure.
async fn converges(
    srv: &TestServer,
    c: &Client,
    env: &str,
    repo: &Repo,
    commit: &str,
    agent: &str,
    log: &dyn Fn() -> String,
) {
    c.trigger_compile(env, None).await.unwrap();
    let first = compiled(c, env, commit, 60).await;
    assert_eq!(first["status"], "success", "{first:#}");
    let v1 = first["version"].as_i64().unwrap() as i32;
    let version = c.version(env, v1).await.unwrap();
    assert_ne!(version["provenance"]["trigger"], "fact", "{version:#}");
    let vm_id = format!("vm::Host[{agent},name=vm1]");
    let web_id = format!("fs::File[{agent},path={}/web.conf]", repo.out.display());
    // the file waits for the address: undefined in the first version, not deployed
    let (_, rows) = c.resources(env).await.unwrap();
    if let Some(web) = rows.iter().find(|r| r.resource_id == web_id) {
        assert_eq!(web.compliance, "undefined", "{rows:#?}");
    }

    // the fact arrives with the deploy of the VM; the same commit is compiled again
    let second = eventually(90, "a recompile for the fact", || async {
        let list = c.compiles(env, 100).await.ok()?;
        let hit = list.as_array()?.iter().find(|r| {
            r["trigger"] == "fact" && (r["status"] == "success" || r["status"] == "failed")
        })?;
        Some(hit.clone())
    })
    .await;
    assert_eq!(second["commit"], commit, "{second:#}");
    assert_eq!(second["status"], "success", "{second:#}");
    let v2 = second["version"].as_i64().unwrap() as i32;
    assert!(v2 > v1);
    let p = wait_deployed(c, env, v2, 90).await;
    assert_eq!(p["by_status"]["deployed"], 2, "{p}\n{}", log());
    assert_eq!(
        read(&repo.out.join("web.conf")).as_deref(),
        Some("backend 10.0.0.7\n"),
        "{}",
        log()
    );
    assert_eq!(read(&repo.out.join("vm1")).as_deref(), Some("10.0.0.7\n"));

    // why it was made, in the provenance and in the commit's timeline
    let version = c.version(env, v2).await.unwrap();
    assert_eq!(version["provenance"]["trigger"], "fact", "{version:#}");
    assert_eq!(version["provenance"]["commit"], commit);
    let why = &version["provenance"]["facts"];
    assert_eq!(why["changed"][0]["name"], "ip_address", "{why:#}");
    assert_eq!(why["changed"][0]["resource_id"], vm_id.as_str());
    assert!(
        why["resolves"].as_array().unwrap().contains(&json!(v1)),
        "{why:#}"
    );
    let events = timeline(c, env, commit).await;
    assert!(events.iter().any(|e| e == "recompile"), "{events:?}");

    // nothing else was compiled: one compile for the push, one for the fact
    let all = c.compiles(env, 100).await.unwrap();
    let triggers: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["trigger"].as_str().unwrap())
        .collect();
    assert_eq!(triggers.len(), 2, "{all:#}");
    assert!(triggers.contains(&"fact"));
    // and the fact is stored where `steward fact list` shows it, from the handler
    let facts = steward::store::facts::list(&srv.pool, env.parse().unwrap(), Some(&vm_id))
        .await
        .unwrap();
    assert_eq!(facts.len(), 1, "{facts:?}");
    assert_eq!(facts[0].value, "10.0.0.7");
    assert_eq!(facts[0].source, "fact");
    assert!(facts[0].expires);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fact_a_handler_reports_recompiles_the_same_commit_and_deploys_what_waited_for_it() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "localhost");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = follow_with(&c, "local", &repo, json!({})).await;
    converges(&srv, &c, &env, &repo, &commit, "localhost", &String::new).await;

    // parameters set by people: without --recompile nothing is compiled, with it the same
    // commit is compiled once more (the model may read the value)
    let admin = srv.admin.clone().unwrap();
    let count = || async {
        c.compiles(&env, 100)
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    let (code, _, err) =
        crate::facts_api::cli(&srv, &admin, &env, &["param", "set", "region", "eu"]);
    assert_eq!(code, 0, "{err}");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        count().await,
        2,
        "a parameter set without --recompile compiled"
    );
    let (code, _, err) = crate::facts_api::cli(
        &srv,
        &admin,
        &env,
        &["param", "set", "region", "us", "--recompile"],
    );
    assert_eq!(code, 0, "{err}");
    let third = eventually(60, "a recompile for the parameter", || async {
        let list = c.compiles(&env, 100).await.ok()?;
        let done: Vec<_> = list
            .as_array()?
            .iter()
            .filter(|r| r["trigger"] == "fact" && r["status"] == "success")
            .cloned()
            .collect();
        (done.len() == 2).then(|| done[0].clone())
    })
    .await;
    assert_eq!(third["commit"], commit.as_str());
    let v3 = c
        .version(&env, third["version"].as_i64().unwrap() as i32)
        .await
        .unwrap();
    assert_eq!(v3["provenance"]["facts"]["recompile"], true, "{v3:#}");
    assert_eq!(
        v3["provenance"]["facts"]["changed"][0]["name"], "region",
        "{v3:#}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(count().await, 3, "one recompile, not more");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_loop_through_an_external_agent() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "localhost");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = follow_with(
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
    converges(&srv, &c, &env, &repo, &commit, "localhost", &log).await;
    let _ = agent.kill();
    let _ = agent.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_loop_over_ssh() {
    let sshd = crate::ssh_support::Sshd::start();
    let uri = format!("ssh://{}@127.0.0.1:{}", sshd.user, sshd.port);
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "web1");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = follow_with(
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
    converges(&srv, &c, &env, &repo, &commit, "web1", &log).await;
}

/// Push to server: the server has no source to compile again, so a version whose unknown
/// values became known says it waits for an export (`steward version show`), and
/// `steward export` reads the environment's facts in one call and makes a version that
/// uses them.
#[tokio::test(flavor = "multi_thread")]
async fn in_push_mode_a_version_waits_for_the_next_export_which_uses_the_facts() {
    let srv = TestServer::start(false).await;
    let c = srv.admin_client();
    let admin = srv.admin.clone().unwrap();
    let env = c
        .create_environment("facts", "push", None)
        .await
        .unwrap()
        .id
        .to_string();
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("project.yml"), "name: push\n").unwrap();
    std::fs::write(
        project.path().join("main.cf"),
        r#"import fs
import std::testing
vm = std::testing::NullResource(name="vm")
ip = std::getfact(vm, "ip")
host = std::Host(name="localhost", os=std::linux)
fs::File(host=host, path="/srv/web.conf", content="backend {{ip}}", mode=644)
"#,
    )
    .unwrap();
    let p = project.path().to_str().unwrap();
    let export = || crate::facts_api::cli(&srv, &admin, &env, &["export", "-p", p]);
    let show = |n: &str| crate::facts_api::cli(&srv, &admin, &env, &["version", "show", n]);
    let (code, _, err) = export();
    assert_eq!(code, 0, "{err}");
    let v1 = c.version(&env, 1).await.unwrap();
    assert_eq!(v1["unknowns"]["total"], 1, "{v1:#}");
    assert_eq!(v1["unknowns"]["waiting_for_export"], false);
    let (_, out, _) = show("1");
    assert!(out.contains("unknowns:     1 (0 known now)"), "{out}");
    assert!(!out.contains("waiting for facts"), "{out}");

    c.set_parameter(
        &env,
        "ip",
        Some("std::testing::NullResource[internal,name=vm]"),
        &json!({"value": "10.1.1.1"}),
    )
    .await
    .unwrap();
    let v1 = c.version(&env, 1).await.unwrap();
    assert_eq!(v1["unknowns"]["known_now"], 1, "{v1:#}");
    assert_eq!(v1["unknowns"]["waiting_for_export"], true);
    let (_, out, _) = show("1");
    assert!(
        out.contains(
            "waiting for facts: 1 of its unknown values are known now; run `steward export` again"
        ),
        "{out}"
    );

    let (code, _, err) = export();
    assert_eq!(code, 0, "{err}");
    let v2 = c.version(&env, 2).await.unwrap();
    assert_eq!(v2["unknowns"]["total"], 0, "{v2:#}");
    let x = steward::store::versions::export_of(
        &mut srv.pool.acquire().await.unwrap(),
        env.parse().unwrap(),
        2,
    )
    .await
    .unwrap();
    let file = x
        .resources
        .iter()
        .find(|r| r.type_name == "fs::File")
        .expect("the file is defined now");
    assert_eq!(file.attributes["content"], "backend 10.1.1.1");
    assert!(x.undefined.is_empty(), "{:?}", x.undefined);
}

/// Embedded `steward deploy`: one run converges. Round 1 deploys the VM (its handler reports
/// the address), round 2 compiles again with the facts of the run's own environment and
/// deploys the file; the next run compiles with them at once and changes nothing.
#[test]
fn steward_deploy_compiles_again_when_its_handlers_report_what_the_model_waited_for() {
    let repo = Repo::new();
    commit_project(&repo, "localhost");
    let data = tempfile::tempdir().unwrap();
    let run = || {
        let out = std::process::Command::new(crate::support::steward_bin())
            .arg("deploy")
            .arg("-p")
            .arg(&repo.work)
            .arg("--data-dir")
            .arg(data.path().join("deploy"))
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        text
    };
    let first = run();
    assert!(
        first.contains("facts arrived for 1 unknown values: compiling again"),
        "{first}"
    );
    assert_eq!(
        read(&repo.out.join("web.conf")).as_deref(),
        Some("backend 10.0.0.7\n"),
        "{first}"
    );
    let second = run();
    assert!(!second.contains("compiling again"), "{second}");
    assert!(second.contains("no changes"), "{second}");
}
