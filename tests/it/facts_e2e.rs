//! Facts end to end (issue 29): a git source, the server with its scheduler and real
//! executors, a project-local module whose `@provider` makes something (a file standing for
//! a VM) and reports `ip_address` with `ctx.set_fact`; the model uses
//! `std::getfact(vm, "ip_address")` in another resource. The first version deploys the VM
//! and marks the other resource undefined; the fact arrives; the same commit is compiled
//! again (`trigger: fact`), and that version deploys the other resource with the value.

use serde_json::json;

use crate::gitops_support::{Repo, compiled, follow, git_ok, read, timeline};
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

#[tokio::test(flavor = "multi_thread")]
async fn a_fact_a_handler_reports_recompiles_the_same_commit_and_deploys_what_waited_for_it() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = commit_project(&repo, "localhost");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let env = follow(&c, "facts", &repo, json!({})).await;
    c.trigger_compile(&env, None).await.unwrap();

    let first = compiled(&c, &env, &commit, 60).await;
    assert_eq!(first["status"], "success", "{first:#}");
    let v1 = first["version"].as_i64().unwrap() as i32;
    let export = c.version(&env, v1).await.unwrap();
    assert_ne!(export["provenance"]["trigger"], "fact", "{export:#}");

    // the fact arrives with the deploy of the VM; the same commit is compiled again
    let second = eventually(60, "a recompile for the fact", || async {
        let list = c.compiles(&env, 100).await.ok()?;
        let hit = list.as_array()?.iter().find(|r| {
            r["trigger"] == "fact" && (r["status"] == "success" || r["status"] == "failed")
        })?;
        Some(hit.clone())
    })
    .await;
    assert_eq!(second["commit"], commit.as_str(), "{second:#}");
    assert_eq!(second["status"], "success", "{second:#}");
    let v2 = second["version"].as_i64().unwrap() as i32;
    assert!(v2 > v1);
    wait_deployed(&c, &env, v2, 60).await;
    assert_eq!(
        read(&repo.out.join("web.conf")).as_deref(),
        Some("backend 10.0.0.7\n")
    );
    assert_eq!(read(&repo.out.join("vm1")).as_deref(), Some("10.0.0.7\n"));

    // why it was made, in the provenance and in the commit's timeline
    let version = c.version(&env, v2).await.unwrap();
    assert_eq!(version["provenance"]["trigger"], "fact", "{version:#}");
    assert_eq!(version["provenance"]["commit"], commit.as_str());
    let why = &version["provenance"]["facts"];
    assert_eq!(why["changed"][0]["name"], "ip_address", "{why:#}");
    assert_eq!(
        why["changed"][0]["resource_id"],
        "vm::Host[localhost,name=vm1]"
    );
    assert!(
        why["resolves"].as_array().unwrap().contains(&json!(v1)),
        "{why:#}"
    );
    let events = timeline(&c, &env, &commit).await;
    assert!(events.iter().any(|e| e == "recompile"), "{events:?}");

    // nothing else was compiled: one compile for the push, one for the fact
    let all = c.compiles(&env, 100).await.unwrap();
    let triggers: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["trigger"].as_str().unwrap())
        .collect();
    assert_eq!(triggers.len(), 2, "{all:#}");
    assert!(triggers.contains(&"fact"));
    // and the fact is stored where `steward fact list` shows it
    let facts = steward::store::facts::list(
        &srv.pool,
        env.parse().unwrap(),
        Some("vm::Host[localhost,name=vm1]"),
    )
    .await
    .unwrap();
    assert_eq!(facts.len(), 1, "{facts:?}");
    assert_eq!(facts[0].value, "10.0.0.7");
    assert_eq!(facts[0].source, "fact");
}
