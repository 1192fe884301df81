//! Modules with their own handlers: examples/integration (an INI file managed by a Python
//! handler) through the real server, scheduler and executors; and handlers that crash, hang,
//! or answer nonsense.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use steward::client::Client;
use steward::compiler::{CompileOptions, compile};
use steward::model::ExportFile;

use crate::deploy::state_of;
use crate::support::{TestServer, copy_dir, eventually, wait_deployed};

fn export(project: &Path, env: &[(&str, &str)]) -> ExportFile {
    let opts = CompileOptions {
        project_dir: project.to_path_buf(),
        export: true,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        ..Default::default()
    };
    let outcome = compile(&opts, &mut |_| {});
    match outcome.result {
        Ok(Some(x)) => x,
        other => panic!("compile failed: {:?}", other.err()),
    }
}

async fn upload(c: &Client, env: &str, x: &ExportFile) -> i32 {
    c.upload(env, x, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from} not in {}", path.display());
    std::fs::write(path, text.replace(from, to)).unwrap();
}

pub struct Example {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    ini: PathBuf,
}

pub fn example() -> Example {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("integration");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/integration"),
        &project,
    );
    let ini = tmp.path().join("app.ini");
    Example {
        _tmp: tmp,
        project,
        ini,
    }
}

impl Example {
    pub fn export(&self) -> ExportFile {
        export(
            &self.project,
            &[("INTEGRATION_INI", self.ini.to_str().unwrap())],
        )
    }
    pub fn ini(&self) -> String {
        std::fs::read_to_string(&self.ini).unwrap_or_default()
    }
    fn entry_id(&self, section: &str, key: &str) -> String {
        format!(
            "inifile::Entry[localhost,name={}:{section}.{key}]",
            self.ini.display()
        )
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn module_handler_deploys_dry_runs_repairs_and_purges() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("int", "ini", None)
        .await
        .unwrap()
        .id
        .to_string();
    let ex = example();

    // the export carries the handler and its code
    let x1 = ex.export();
    let h = &x1.handlers["inifile::Entry"];
    assert_eq!(h.entry, "handlers/inifile_handler.py");
    assert!(
        x1.code
            .contains_key(&h.files["handlers/inifile_handler.py"].hash)
    );
    let v1 = upload(&c, &env, &x1).await;
    wait_deployed(&c, &env, v1, 60).await;
    let ini = ex.ini();
    assert!(
        ini.contains("[database]")
            && ini.contains("host = db.internal")
            && ini.contains("size = 256M"),
        "{ini}"
    );
    assert!(
        ini.starts_with("; managed by steward (inifile handler 1)"),
        "{ini}"
    );
    let created = crate::deploy::deploy_actions(&c, &env, &ex.entry_id("database", "port")).await;
    assert_eq!(created[0].change, "created");
    assert!(
        created[0].messages.to_string().contains("entry written"),
        "{:?}",
        created[0].messages
    );

    // a dry-run of a change: reported, not made
    c.update_settings(&env, &json!({"auto_release": false}))
        .await
        .unwrap();
    edit(
        &ex.project.join("main.cf"),
        "value=\"5432\"",
        "value=\"6543\"",
    );
    let v2 = upload(&c, &env, &ex.export()).await;
    let started = c.start_dryrun(&env, Some(v2)).await.unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    let report = eventually(30, "the dry-run", || async {
        let r = c.dryrun(&env, &id).await.unwrap();
        (r["complete"] == true).then_some(r)
    })
    .await;
    assert_eq!(report["changed"], 1, "{report:#}");
    let port = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["resource_id"]
                .as_str()
                .unwrap()
                .ends_with("database.port]")
        })
        .unwrap();
    assert_eq!(
        port["changes"]["value"],
        json!({"current": "5432", "desired": "6543"})
    );
    assert!(ex.ini().contains("port = 5432"));

    c.release(&env, v2, "ok").await.unwrap();
    wait_deployed(&c, &env, v2, 60).await;
    assert!(ex.ini().contains("port = 6543"));

    // drift: restored by a repair
    edit(&ex.ini, "port = 6543", "port = 1");
    c.trigger(&env, true, None, None).await.unwrap();
    eventually(30, "the drift to be repaired", || async {
        ex.ini().contains("port = 6543").then_some(())
    })
    .await;

    // purge: the key goes, and its section with it
    edit(
        &ex.project.join("main.cf"),
        "key=\"size\", value=\"256M\")",
        "key=\"size\", value=\"256M\", purged=true)",
    );
    let v3 = upload(&c, &env, &ex.export()).await;
    c.release(&env, v3, "purge").await.unwrap();
    wait_deployed(&c, &env, v3, 60).await;
    let ini = ex.ini();
    assert!(!ini.contains("[cache]") && !ini.contains("size"), "{ini}");
    assert_eq!(
        state_of(&c, &env, &ex.entry_id("cache", "size"))
            .await
            .status,
        "deployed"
    );

    // new handler code travels with its version; an older version keeps its own
    let handler = ex.project.join("libs/inifile/handlers/inifile_handler.py");
    edit(&handler, "inifile handler 1", "inifile handler 2");
    let x4 = ex.export();
    assert_ne!(
        x4.handlers["inifile::Entry"].digest,
        x1.handlers["inifile::Entry"].digest
    );
    let v4 = upload(&c, &env, &x4).await;
    let shown = c.version(&env, v4).await.unwrap();
    let v3_shown = c.version(&env, v3).await.unwrap();
    assert_ne!(
        shown["content_hash"], v3_shown["content_hash"],
        "an approval must cover the code"
    );
    c.release(&env, v4, "new code").await.unwrap();
    wait_deployed(&c, &env, v4, 60).await;
    // a repair of drift runs the handler's write path: with the code of the active version
    edit(&ex.ini, "port = 6543", "port = 2");
    c.trigger(&env, true, None, None).await.unwrap();
    eventually(30, "the new code to write the file", || async {
        ex.ini()
            .starts_with("; managed by steward (inifile handler 2)")
            .then_some(())
    })
    .await;
    let back = c.rollback(&env, v3, "old code").await.unwrap();
    wait_deployed(&c, &env, back.number, 60).await;
    let exported = c.version(&env, back.number).await.unwrap();
    assert_eq!(exported["content_hash"], v3_shown["content_hash"]);
    edit(&ex.ini, "port = 6543", "port = 3");
    c.trigger(&env, true, None, None).await.unwrap();
    eventually(30, "the old code to write the file again", || async {
        ex.ini()
            .starts_with("; managed by steward (inifile handler 1)")
            .then_some(())
    })
    .await;
}

/// A module whose handlers misbehave, each in its own way, next to a good resource.
fn broken_project(dir: &Path, out: &Path) {
    let module = dir.join("libs/broken");
    std::fs::create_dir_all(module.join("model")).unwrap();
    std::fs::create_dir_all(module.join("handlers")).unwrap();
    std::fs::write(dir.join("project.yml"), "name: broken\nmodulepath: libs\n").unwrap();
    let mut yml = String::from("name: broken\nversion: 1.0.0\nlicense: none\nresources:\n");
    let mut cf = String::new();
    for (ty, script) in [
        // dies at once, saying why
        ("Crash", "#!/bin/sh\necho 'cannot connect to the device API' >&2\nexit 3\n".to_string()),
        // not the protocol at all
        ("Garbage", "#!/bin/sh\necho 'Welcome to my handler!'\nsleep 318\n".to_string()),
        // says hello, then never answers
        ("Hang", "#!/bin/sh\nread line\necho '{\"id\": 1, \"ok\": true}'\nread line\nsleep 317\n".to_string()),
        // says hello, then dies on the first real request
        ("Die", "#!/bin/sh\nread line\necho '{\"id\": 1, \"ok\": true}'\nread line\necho 'segfault, sort of' >&2\nexit 139\n".to_string()),
    ] {
        let path = module.join(format!("handlers/{}.sh", ty.to_lowercase()));
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        yml.push_str(&format!(
            "  broken::{ty}:\n    agent: host.name\n    id: name\n    fields: [name, purged, send_event, receive_events]\n    handler: handlers/{}.sh\n",
            ty.to_lowercase()
        ));
        cf.push_str(&format!("entity {ty} extends std::PurgeableResource:\n    string name\nend\n{ty}.host [1] -- std::Host\nimplement {ty} using std::none\n"));
    }
    // a Python handler with a bug
    std::fs::write(
        module.join("handlers/buggy.py"),
        "from steward_handler import CRUDHandler, serve\n\nclass Buggy(CRUDHandler):\n    def read_resource(self, ctx, resource):\n        return {'x': 1 / 0}\n\nserve(Buggy())\n",
    )
    .unwrap();
    yml.push_str("  broken::Buggy:\n    agent: host.name\n    id: name\n    fields: [name, purged, send_event, receive_events]\n    handler: handlers/buggy.py\n");
    cf.push_str("entity Buggy extends std::PurgeableResource:\n    string name\nend\nBuggy.host [1] -- std::Host\nimplement Buggy using std::none\n");
    std::fs::write(module.join("module.yml"), yml).unwrap();
    std::fs::write(module.join("model/_init.cf"), cf).unwrap();
    std::fs::write(
        dir.join("main.cf"),
        format!(
            "import broken\nimport fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             broken::Crash(host=host, name=\"c\")\nbroken::Garbage(host=host, name=\"g\")\nbroken::Hang(host=host, name=\"h\")\n\
             broken::Die(host=host, name=\"d\")\nbroken::Buggy(host=host, name=\"b\")\n\
             fs::File(host=host, path=\"{}/fine\", content=\"still served\", mode=644)\n",
            out.display()
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn misbehaving_handlers_fail_clearly_and_the_executor_goes_on() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = c
        .create_environment("int", "broken", Some(json!({"handler_timeout": 3, "retry_backoff": {"initial": 600, "factor": 1.0, "max": 600}})))
        .await
        .unwrap()
        .id
        .to_string();
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("p");
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    broken_project(&project, &out);
    let x = export(&project, &[]);
    assert_eq!(x.handlers.len(), 5);
    let v = upload(&c, &env, &x).await;
    let p = wait_deployed(&c, &env, v, 60).await;
    assert_eq!(p["by_status"]["deployed"], 1, "{p}");
    assert_eq!(
        std::fs::read_to_string(out.join("fine")).unwrap(),
        "still served"
    );

    let msg =
        |s: &steward::store::state::ResourceWithState| s.last_message.clone().unwrap_or_default();
    let crash = state_of(&c, &env, "broken::Crash[localhost,name=c]").await;
    assert_eq!(crash.status, "unavailable", "{crash:?}");
    assert!(
        msg(&crash).contains("exit status 3")
            && msg(&crash).contains("cannot connect to the device API"),
        "{}",
        msg(&crash)
    );
    let garbage = state_of(&c, &env, "broken::Garbage[localhost,name=g]").await;
    assert_eq!(garbage.status, "unavailable", "{garbage:?}");
    assert!(
        msg(&garbage).contains("not the protocol")
            && msg(&garbage).contains("Welcome to my handler!"),
        "{}",
        msg(&garbage)
    );
    let hang = state_of(&c, &env, "broken::Hang[localhost,name=h]").await;
    assert_eq!(hang.status, "failed", "{hang:?}");
    assert!(
        msg(&hang).contains("did not answer within"),
        "{}",
        msg(&hang)
    );
    let die = state_of(&c, &env, "broken::Die[localhost,name=d]").await;
    assert_eq!(die.status, "failed", "{die:?}");
    assert!(
        msg(&die).contains("exit status 139") && msg(&die).contains("segfault, sort of"),
        "{}",
        msg(&die)
    );
    let buggy = state_of(&c, &env, "broken::Buggy[localhost,name=b]").await;
    assert_eq!(buggy.status, "failed", "{buggy:?}");
    assert!(msg(&buggy).contains("ZeroDivisionError"), "{}", msg(&buggy));

    // stopped handlers leave nothing running behind them
    for marker in ["sleep 317", "sleep 318"] {
        let out = std::process::Command::new("pgrep")
            .args(["-f", marker])
            .output()
            .unwrap();
        assert!(
            out.stdout.is_empty(),
            "{marker} still runs: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    // the executor is alive and serves the next request at once
    std::fs::remove_file(out.join("fine")).unwrap();
    c.trigger(
        &env,
        true,
        None,
        Some(&format!("fs::File[localhost,path={}/fine]", out.display())),
    )
    .await
    .unwrap();
    eventually(20, "the file to be restored", || async {
        out.join("fine").exists().then_some(())
    })
    .await;
}
