//! Inmanta modules' `@provider` handlers, run by Steward's handler host in executors: a small
//! V1-style module written as the Inmanta handler guide describes (a `CRUDHandler` on real
//! files, kwargs logging, a version-bound `@cache`, a handler overriding `execute`, one that
//! reloads), shipped with versions whose export carries `HandlerCode.inmanta`, deployed by the
//! real server, scheduler and executors; and handlers that fail.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use steward::client::Client;
use steward::model::{CodeFile, ExportFile, HandlerCode, InmantaCode, Resource, ResourceId};

use crate::deploy::{deploy_actions, state_of};
use crate::support::{TestServer, eventually, export_of, wait_deployed};

/// The module's Python, as a V1 module has it in `plugins/__init__.py` (installed as
/// `inmanta_plugins.demo`).
pub const DEMO: &str = r#"
import os

from inmanta import const
from inmanta.agent import handler
from inmanta.agent.handler import CRUDHandler, HandlerContext, ResourceHandler, ResourcePurged, cache, provider
from inmanta.resources import PurgeableResource, Resource, resource


def _note(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


@resource("demo::File", agent="host", id_attribute="path")
class File(PurgeableResource):
    fields = ("path", "content", "journal")


@provider("demo::File", name="posix")
class FileHandler(CRUDHandler[File]):
    @cache(for_version=True, ignore=["journal"], call_on_delete=lambda v: _note(v["journal"], "dropped " + v["tag"]))
    def settings(self, journal, directory):
        # computed once per version (whatever the resource), dropped when the deploy is done
        tag = "v%d" % self.cache.version
        _note(journal, "computed " + tag)
        return {"journal": journal, "tag": tag}

    def read_resource(self, ctx: HandlerContext, resource: File) -> None:
        s = self.settings(resource.journal, os.path.dirname(resource.path))
        ctx.debug("read %(path)s", path=resource.path, cached=s["tag"])
        if not os.path.exists(resource.path):
            raise ResourcePurged()
        with open(resource.path) as f:
            resource.content = f.read()

    def create_resource(self, ctx: HandlerContext, resource: File) -> None:
        with open(resource.path, "w") as f:
            f.write(resource.content)
        ctx.info("wrote %(path)s", path=resource.path, size=len(resource.content), mode=[4, 2, 0])
        ctx.set_created()

    def update_resource(self, ctx: HandlerContext, changes: dict, resource: File) -> None:
        with open(resource.path, "w") as f:
            f.write(resource.content)
        ctx.info("rewrote %(path)s", path=resource.path, before=changes["content"]["current"])
        ctx.set_updated()

    def delete_resource(self, ctx: HandlerContext, resource: File) -> None:
        os.remove(resource.path)
        ctx.set_purged()


@resource("demo::Stamp", agent="host", id_attribute="path")
class Stamp(Resource):
    fields = ("path", "text")


@provider("demo::Stamp", name="stamp")
class StampHandler(ResourceHandler[Stamp]):
    """Overrides execute: its own action logic, its own status."""

    def pre(self, ctx, resource):
        ctx.debug("pre", step=1)

    def post(self, ctx, resource):
        ctx.debug("post", step=3)

    def execute(self, ctx, resource, dry_run=False):
        self.pre(ctx, resource)
        try:
            if os.path.exists(resource.path):
                ctx.set_status(const.ResourceState.deployed)
                return
            ctx.add_change("path", desired=resource.path, current=None)
            if dry_run:
                ctx.set_status(const.ResourceState.dry)
                return
            with open(resource.path, "w") as f:
                f.write(resource.text)
            ctx.set_created()
            ctx.info("stamped", step=2)
            ctx.set_status(const.ResourceState.deployed)
        finally:
            self.post(ctx, resource)


@resource("demo::Service", agent="host", id_attribute="name")
class Service(PurgeableResource):
    fields = ("name", "journal")


@provider("demo::Service", name="service")
class ServiceHandler(CRUDHandler[Service]):
    def read_resource(self, ctx, resource):
        pass

    def can_reload(self) -> bool:
        return True

    def do_reload(self, ctx, resource):
        _note(resource.journal, "reloaded " + resource.name)
        ctx.info("reloaded %(name)s", name=resource.name)


@resource("demo::Broken", agent="host", id_attribute="name")
class Broken(PurgeableResource):
    fields = ("name",)


@provider("demo::Broken", name="broken")
class BrokenHandler(CRUDHandler[Broken]):
    def read_resource(self, ctx, resource):
        raise ResourcePurged()

    def create_resource(self, ctx, resource):
        helper_that_fails(resource.name)


def helper_that_fails(name):
    raise RuntimeError("cannot create " + name)
"#;

/// Handler code of Python files (path -> content) for these imports, and its blobs.
pub fn inmanta_code(
    module: &str,
    files: &[(&str, &str)],
    requirements: &[&str],
    imports: &[&str],
) -> (HandlerCode, BTreeMap<String, String>) {
    let mut map = BTreeMap::new();
    let mut blobs = BTreeMap::new();
    for (path, content) in files {
        let hash = hex::encode(Sha256::digest(content.as_bytes()));
        map.insert(
            path.to_string(),
            CodeFile {
                hash: hash.clone(),
                executable: false,
            },
        );
        blobs.insert(hash, hex::encode(content.as_bytes()));
    }
    let mut code = HandlerCode {
        module: module.into(),
        entry: files[0].0.into(),
        files: map,
        digest: String::new(),
        inmanta: Some(InmantaCode {
            requirements: requirements.iter().map(|s| s.to_string()).collect(),
            imports: imports.iter().map(|s| s.to_string()).collect(),
        }),
    };
    code.digest = code.expected_digest();
    (code, blobs)
}

/// An export of `resources` whose types are handled by `code`.
pub fn with_code(
    resources: Vec<Resource>,
    code: &(HandlerCode, BTreeMap<String, String>),
) -> ExportFile {
    let mut x = export_of(resources);
    for r in &x.resources {
        x.handlers.insert(r.type_name.clone(), code.0.clone());
    }
    x.code = code.1.clone();
    x
}

pub fn resource(ty: &str, key: &str, value: &str, attrs: Value, requires: &[&str]) -> Resource {
    let mut attributes = json!({
        "purged": false, "purge_on_delete": false, "send_event": true, "receive_events": true,
    });
    for (k, v) in attrs.as_object().unwrap() {
        attributes[k] = v.clone();
    }
    attributes[key] = json!(value);
    Resource {
        id: ResourceId::new(ty, "localhost", key, value),
        type_name: ty.into(),
        agent: "localhost".into(),
        attributes: attributes.as_object().unwrap().clone(),
        requires: requires.iter().map(|r| ResourceId(r.to_string())).collect(),
    }
}

pub async fn upload(c: &Client, env: &str, x: &ExportFile) -> i32 {
    c.upload(env, x, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32
}

pub fn journal(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

pub fn demo_code() -> (HandlerCode, BTreeMap<String, String>) {
    inmanta_code(
        "demo",
        &[("inmanta_plugins/demo/__init__.py", DEMO)],
        &["inmanta-module-std"],
        &["inmanta_plugins.demo"],
    )
}

/// The messages of an action with this message, and its fields.
fn message<'a>(a: &'a steward::store::actions::ActionRecord, text: &str) -> &'a Value {
    a.messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message"].as_str().unwrap_or("").contains(text))
        .unwrap_or_else(|| panic!("no message '{text}' in {:#}", a.messages))
}

#[tokio::test(flavor = "multi_thread")]
async fn inmanta_crud_handler_deploys_logs_caches_reloads_and_dry_runs() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("pyh", "demo", None)
        .await
        .unwrap()
        .id
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let jpath = d.join("journal");
    let j = jpath.to_str().unwrap();
    let code = demo_code();
    let path = |n: &str| d.join(n).to_str().unwrap().to_string();
    let file = |n: &str, content: &str, purged: bool| {
        resource(
            "demo::File",
            "path",
            &path(n),
            json!({"content": content, "journal": j, "purged": purged}),
            &[],
        )
    };
    let a_id = format!("demo::File[localhost,path={}]", path("a.conf"));
    let service =
        |reqs: &[&str]| resource("demo::Service", "name", "web", json!({"journal": j}), reqs);
    let stamp = resource(
        "demo::Stamp",
        "path",
        &path("stamp"),
        json!({"text": "hello"}),
        &[],
    );
    let v1_resources = vec![
        file("a.conf", "a=1\n", false),
        file("b.conf", "b=1\n", false),
        stamp.clone(),
        service(&[&a_id]),
    ];
    let v1 = upload(&c, &env, &with_code(v1_resources, &code)).await;
    let p = wait_deployed(&c, &env, v1, 60).await;
    assert_eq!(
        p["by_status"]["deployed"],
        4,
        "{p} {:#}",
        deploy_actions(&c, &env, &a_id).await[0].messages
    );
    assert_eq!(std::fs::read_to_string(d.join("a.conf")).unwrap(), "a=1\n");
    assert_eq!(std::fs::read_to_string(d.join("b.conf")).unwrap(), "b=1\n");
    assert_eq!(std::fs::read_to_string(d.join("stamp")).unwrap(), "hello");

    // created, with the handler's log records and their kwargs as fields
    let a = &deploy_actions(&c, &env, &a_id).await[0];
    assert_eq!(
        (a.status.as_str(), a.change.as_str()),
        ("deployed", "created")
    );
    let wrote = message(a, "wrote ");
    assert_eq!(wrote["level"], "info");
    assert_eq!(wrote["message"], format!("wrote {}", path("a.conf")));
    assert_eq!(wrote["fields"]["size"], 4);
    assert_eq!(wrote["fields"]["mode"], json!([4, 2, 0]));
    assert_eq!(wrote["fields"]["path"], path("a.conf"));
    assert_eq!(message(a, "Calling read_resource")["level"], "debug");
    // and through the CLI: the last action's records with their fields
    let shown = crate::deploy_cli::ok(&crate::deploy_cli::cli(
        &srv,
        &env,
        &["resource", "show", &a_id],
    ));
    let line = shown
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with(&format!("info wrote {} {{", path("a.conf")))
        })
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        line.contains("\"mode\":[4,2,0]") && line.contains("\"size\":4"),
        "{line}"
    );
    assert_eq!(
        a.changes["purged"],
        json!({"current": true, "desired": false})
    );
    // the handler overriding execute: its own status, change and pre/post
    let s = &deploy_actions(
        &c,
        &env,
        &format!("demo::Stamp[localhost,path={}]", path("stamp")),
    )
    .await[0];
    assert_eq!(
        (s.status.as_str(), s.change.as_str()),
        ("deployed", "created")
    );
    let steps: Vec<i64> = s
        .messages
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["fields"]["step"].as_i64())
        .collect();
    assert_eq!(steps, vec![1, 2, 3]);

    // the version-bound cache: computed once for both files, dropped once v1's deploy is done
    eventually(20, "the v1 cache entry to be dropped", || async {
        journal(&jpath)
            .contains(&"dropped v1".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(
        journal(&jpath)
            .iter()
            .filter(|l| l.starts_with("computed"))
            .count(),
        1,
        "{:?}",
        journal(&jpath)
    );
    let reloads = || {
        journal(&jpath)
            .iter()
            .filter(|l| *l == "reloaded web")
            .count()
    };
    let reloaded_v1 = reloads();

    // a dry-run calls the read side only
    c.update_settings(&env, &json!({"auto_release": false}))
        .await
        .unwrap();
    let v2_resources = vec![
        file("a.conf", "a=2\n", false),
        file("b.conf", "b=1\n", true),
        stamp.clone(),
        service(&[&a_id]),
    ];
    let v2 = upload(&c, &env, &with_code(v2_resources, &code)).await;
    let started = c.start_dryrun(&env, Some(v2)).await.unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    let report = eventually(30, "the dry-run", || async {
        let r = c.dryrun(&env, &id).await.unwrap();
        (r["complete"] == true).then_some(r)
    })
    .await;
    let of = |rid: &str| {
        report["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource_id"] == rid)
            .cloned()
            .unwrap_or_else(|| panic!("{rid} not in {report:#}"))
    };
    assert_eq!(
        of(&a_id)["changes"]["content"],
        json!({"current": "a=1\n", "desired": "a=2\n"})
    );
    let b_id = format!("demo::File[localhost,path={}]", path("b.conf"));
    assert_eq!(
        of(&b_id)["changes"]["purged"],
        json!({"current": false, "desired": true})
    );
    assert_eq!(std::fs::read_to_string(d.join("a.conf")).unwrap(), "a=1\n");
    assert!(d.join("b.conf").exists());

    // the deploy: updated, purged, and the service reloads (its requirement changed)
    c.release(&env, v2, "go").await.unwrap();
    wait_deployed(&c, &env, v2, 60).await;
    assert_eq!(std::fs::read_to_string(d.join("a.conf")).unwrap(), "a=2\n");
    assert!(!d.join("b.conf").exists());
    let a = &deploy_actions(&c, &env, &a_id).await[0];
    assert_eq!(a.change, "updated");
    assert_eq!(message(a, "rewrote")["fields"]["before"], "a=1\n");
    assert_eq!(deploy_actions(&c, &env, &b_id).await[0].change, "purged");
    eventually(20, "the service to reload", || async {
        (reloads() > reloaded_v1).then_some(())
    })
    .await;
    let svc = &deploy_actions(&c, &env, "demo::Service[localhost,name=web]").await[0];
    assert_eq!(message(svc, "reloaded web")["fields"]["name"], "web");
    eventually(20, "the v2 cache entry to be dropped", || async {
        journal(&jpath)
            .contains(&"dropped v2".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(state_of(&c, &env, &a_id).await.status, "deployed");
}

#[tokio::test(flavor = "multi_thread")]
async fn inmanta_handler_errors_are_failed_or_unavailable_actions_with_tracebacks() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("pyh", "errors", None)
        .await
        .unwrap()
        .id
        .to_string();
    // an exception in the handler: a failed action, its traceback in the log
    let code = demo_code();
    let broken = resource("demo::Broken", "name", "thing", json!({}), &[]);
    let v1 = upload(&c, &env, &with_code(vec![broken], &code)).await;
    wait_deployed(&c, &env, v1, 60).await;
    let a = &deploy_actions(&c, &env, "demo::Broken[localhost,name=thing]").await[0];
    assert_eq!(a.status, "failed", "{:#}", a.messages);
    let m = message(a, "An error occurred during deployment");
    assert_eq!(m["level"], "error");
    assert!(
        m["message"]
            .as_str()
            .unwrap()
            .contains("RuntimeError('cannot create thing')"),
        "{m:#}"
    );
    let tb = m["fields"]["traceback"].as_str().unwrap();
    assert!(
        tb.contains("Traceback")
            && tb.contains("in helper_that_fails")
            && tb.contains("inmanta_plugins/demo/__init__.py"),
        "{tb}"
    );

    // a module that does not import: the handler is unavailable, with the reason
    let bad = inmanta_code(
        "bad",
        &[(
            "inmanta_plugins/bad/__init__.py",
            "import inmanta.agent.handler\nimport no_such_dependency\n",
        )],
        &[],
        &["inmanta_plugins.bad"],
    );
    let r = resource("bad::Thing", "name", "x", json!({}), &[]);
    let v2 = upload(&c, &env, &with_code(vec![r], &bad)).await;
    wait_deployed(&c, &env, v2, 60).await;
    let a = &deploy_actions(&c, &env, "bad::Thing[localhost,name=x]").await[0];
    assert_eq!(a.status, "unavailable", "{:#}", a.messages);
    let m = message(a, "did not start");
    assert!(
        m["message"].as_str().unwrap().contains(
            "importing inmanta_plugins.bad failed: ModuleNotFoundError: No module named 'no_such_dependency'"
        ),
        "{m:#}"
    );
    assert!(
        m["fields"]["traceback"]
            .as_str()
            .unwrap()
            .contains("inmanta_plugins/bad/__init__.py\", line 2"),
        "{m:#}"
    );

    // a type with no @provider among what was imported
    let r = resource("demo::Nothing", "name", "y", json!({}), &[]);
    let v3 = upload(&c, &env, &with_code(vec![r], &code)).await;
    wait_deployed(&c, &env, v3, 60).await;
    let a = &deploy_actions(&c, &env, "demo::Nothing[localhost,name=y]").await[0];
    assert_eq!(a.status, "unavailable", "{:#}", a.messages);
    message(a, "no @provider handler is registered for demo::Nothing");
}

/// examples/inmanta-v1-module, copied into a temp dir; the message goes to `out/motd` there.
fn v1_example() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    // as root, the embedded cluster stays in the project when its user can enter the dir
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let project = tmp.path().join("motd");
    crate::support::copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/inmanta-v1-module"),
        &project,
    );
    let out = tmp.path().join("out/motd");
    (tmp, project, out)
}

fn steward_deploy(project: &Path, out: &Path, extra: &[&str]) -> String {
    crate::support::run_ok(
        std::process::Command::new(crate::support::steward_bin())
            .arg("deploy")
            .arg("-p")
            .arg(project)
            .args(extra)
            .env("MOTD_PATH", out),
    )
}

#[test]
fn the_v1_module_example_deploys_with_steward_deploy() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, project, out) = v1_example();
    let first = steward_deploy(&project, &out, &[]);
    assert!(first.contains("1 deployed (1 created"), "{first}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("Welcome to localhost\n-- {}\n", host.trim())
    );
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // a change: the dry-run reports it and touches nothing, the deploy makes it
    let main = project.join("main.cf");
    let model = std::fs::read_to_string(&main).unwrap();
    std::fs::write(&main, model.replace("mode=644", "mode=600")).unwrap();
    let dry = steward_deploy(&project, &out, &["--dry-run"]);
    assert!(
        dry.contains("mode") && dry.contains("420") && dry.contains("384"),
        "{dry}"
    );
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o644
    );
    let second = steward_deploy(&project, &out, &[]);
    assert!(second.contains("1 updated"), "{second}");
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_v1_module_example_logs_its_kwargs_for_steward_resource_show() {
    let (_tmp, project, out) = v1_example();
    let opts = steward::compiler::CompileOptions {
        project_dir: project.clone(),
        export: true,
        env: [("MOTD_PATH".to_string(), out.to_str().unwrap().to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let x = match steward::compiler::compile(&opts, &mut |_| {}).result {
        Ok(Some(x)) => x,
        other => panic!("compile failed: {:?}", other.err()),
    };
    let h = &x.handlers["motd::Message"];
    assert_eq!(
        h.inmanta.as_ref().unwrap().imports,
        ["inmanta_plugins.motd"]
    );
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("pyh", "motd", None)
        .await
        .unwrap()
        .id
        .to_string();
    let v = upload(&c, &env, &x).await;
    let p = wait_deployed(&c, &env, v, 60).await;
    assert_eq!(p["by_status"]["deployed"], 1, "{p}");
    let id = format!("motd::Message[localhost,path={}]", out.display());
    let shown = crate::deploy_cli::ok(&crate::deploy_cli::cli(
        &srv,
        &env,
        &["resource", "show", &id],
    ));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let bytes = format!("Welcome to localhost\n-- {}\n", host.trim()).len();
    let line = shown
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with(&format!("info wrote {} {{", out.display()))
        })
        .unwrap_or_else(|| panic!("{shown}"));
    for field in [
        format!("\"bytes\":{bytes}"),
        "\"mode\":\"0o644\"".to_string(),
        format!("\"path\":\"{}\"", out.display()),
    ] {
        assert!(line.contains(&field), "{field} not in {line}");
    }
}
