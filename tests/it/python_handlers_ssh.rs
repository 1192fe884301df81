//! Inmanta handler code on an agentless target (SSH, against a real OpenSSH server on
//! loopback): shipped by digest like any handler code, run there by the shipped executor in
//! its handler host with Steward's Python package written on the target, and told over the
//! executor's channel when a version's deploy is done.

use std::time::Duration;

use serde_json::json;
use steward::executor::protocol::{
    ActionKind, ExternalHandler, Outcome, Reply, Request, WorkItem, WorkResult,
};
use steward::model::{InmantaCode, Resource, ResourceId};
use steward::scheduler::ssh::SshLink;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::ssh_support::Sshd;
use super::support::steward_bin;

const MODULE: &str = r#"
import os
from inmanta.agent.handler import CRUDHandler, ResourcePurged, cache, provider
from inmanta.resources import PurgeableResource, resource

@resource("sshmod::Note", agent="host", id_attribute="path")
class Note(PurgeableResource):
    fields = ("path", "text")

def closed(v):
    with open(v, "a") as f:
        f.write("version done\n")

@provider("sshmod::Note", name="note")
class NoteHandler(CRUDHandler):
    @cache(for_version=True, call_on_delete=closed)
    def journal(self, path):
        return path + ".journal"

    def read_resource(self, ctx, resource):
        self.journal(resource.path)
        if not os.path.exists(resource.path):
            raise ResourcePurged()
        resource.text = open(resource.path).read()

    def create_resource(self, ctx, resource):
        with open(resource.path, "w") as f:
            f.write(resource.text)
        ctx.info("noted", home=os.environ.get("HOME"), cwd=os.getcwd())
        ctx.set_created()
"#;

#[tokio::test]
async fn inmanta_handler_code_runs_on_an_ssh_target() {
    let sshd = Sshd::start();
    let local = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let digest = "inmanta01";
    let code = local.path().join(digest);
    std::fs::create_dir_all(code.join("inmanta_plugins/sshmod")).unwrap();
    std::fs::write(code.join("inmanta_plugins/sshmod/__init__.py"), MODULE).unwrap();
    std::fs::write(code.join(".complete"), digest).unwrap();
    std::fs::create_dir_all(local.path().join("_lib")).unwrap();
    std::fs::write(
        local.path().join("_lib/steward_handler.py"),
        steward::executor::external::PYTHON_HELPER,
    )
    .unwrap();

    let link = SshLink::connect(&sshd.target(), &sshd.options())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", sshd.log()));
    let bin = link.ensure_executor(&steward_bin()).await.unwrap();
    let shipped = link.ensure_code(local.path(), digest).await.unwrap();
    let mut cmd = link.executor_command(&bin.remote_path, "web");
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || -> Reply {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the executor answers in time")
            .unwrap()
            .expect("a line");
        serde_json::from_str(&line).unwrap()
    };
    assert!(matches!(next().await, Reply::Ready { .. }));

    let path = out.path().join("note.txt");
    let p = path.to_str().unwrap();
    let attributes = json!({"path": p, "text": "over ssh", "purged": false, "purge_on_delete": false,
                            "send_event": false, "receive_events": true});
    let item = WorkItem {
        action_id: uuid::Uuid::new_v4(),
        kind: ActionKind::Deploy,
        resource: Resource {
            id: ResourceId::new("sshmod::Note", "web", "path", p),
            type_name: "sshmod::Note".into(),
            agent: "web".into(),
            attributes: attributes.as_object().unwrap().clone(),
            requires: vec![],
        },
        version: 4,
        reload: false,
        // the scheduler rewrites the directory to where the code is on the target
        handler: Some(ExternalHandler {
            dir: shipped.remote_path.clone().into(),
            entry: "inmanta_plugins/sshmod/__init__.py".into(),
            digest: digest.into(),
            inmanta: Some(InmantaCode {
                requirements: vec!["inmanta-module-std".into()],
                imports: vec!["inmanta_plugins.sshmod".into()],
            }),
        }),
        timeout: Some(60),
        at_target: true,
        environment: None,
        want_facts: false,
    };
    let mut send = async |req: Request| {
        let mut line = serde_json::to_string(&req).unwrap();
        line.push('\n');
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    };
    send(Request::Work(Box::new(item))).await;
    let r: WorkResult = match next().await {
        Reply::Result(r) => *r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.outcome, Outcome::Deployed, "{:?}", r.messages);
    assert_eq!(r.change.as_str(), "created");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "over ssh");
    let noted = r
        .messages
        .iter()
        .find(|m| m.message == "noted")
        .unwrap_or_else(|| panic!("{:?}", r.messages));
    // in the target's session, in the shipped directory; the Python package written there
    assert_eq!(noted.fields["home"], json!(sshd.home.to_str().unwrap()));
    assert_eq!(noted.fields["cwd"], json!(shipped.remote_path));
    let code_root = std::path::Path::new(&shipped.remote_path).parent().unwrap();
    assert!(
        std::fs::read_dir(code_root).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("steward-python-")),
        "no Python package under {}",
        code_root.display()
    );

    // the deploy of version 4 is done: the host on the target drops its entries
    send(Request::VersionDone { version: 4 }).await;
    let journal = format!("{p}.journal");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&journal).unwrap_or_default() != "version done\n" {
        assert!(
            std::time::Instant::now() < deadline,
            "the cache entry was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    send(Request::Shutdown).await;
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
}
