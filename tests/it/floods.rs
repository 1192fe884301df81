//! Floods from handlers (issue 28, defect 2): a module handler logging a 300 MB value, a
//! handler process answering a 300 MB line, and an `exec::Run` command printing 300 MB, all
//! on a real `steward server` child. The server's memory stays bounded (its peak RSS is read
//! from /proc), each action ends once with what it logged cut to the documented limits and
//! a marker saying so, and another environment on the same server deploys meanwhile and
//! never loses its lease.

use std::collections::BTreeMap;

use serde_json::json;
use sha2::{Digest, Sha256};
use steward::model::{CodeFile, HandlerCode};

use crate::deploy::{deploy_actions, state_of};
use crate::python_handlers::{inmanta_code, resource, upload, with_code};
use crate::support::{Spawned, exec_run, null_export, wait_deployed};

/// 300 MB, as in the report.
const FLOOD: usize = 300 * 1000 * 1000;

const LOGGER: &str = r#"
from inmanta.agent.handler import CRUDHandler, provider
from inmanta.resources import PurgeableResource, resource


@resource("flood::Logger", agent="host", id_attribute="name")
class Logger(PurgeableResource):
    fields = ("name", "size")


@provider("flood::Logger", name="logger")
class LoggerHandler(CRUDHandler[Logger]):
    def read_resource(self, ctx, resource):
        ctx.info("%(blob)s", blob="x" * resource.size)
        for i in range(30000):
            ctx.debug("chatty %(i)s", i=i, pad="p" * 100)

    def create_resource(self, ctx, resource):
        ctx.set_created()
"#;

/// A handler process (any language) that says hello, then answers with one endless line.
fn raw_flood_code() -> (HandlerCode, BTreeMap<String, String>) {
    let script = format!(
        "#!/bin/sh\nread line\necho '{{\"id\": 1, \"ok\": true}}'\nread line\nhead -c {FLOOD} /dev/zero | tr '\\0' x\necho\nsleep 60\n"
    );
    let hash = hex::encode(Sha256::digest(script.as_bytes()));
    let mut files = BTreeMap::new();
    files.insert(
        "handler.sh".to_string(),
        CodeFile {
            hash: hash.clone(),
            executable: true,
        },
    );
    let mut code = HandlerCode {
        module: "rawflood".into(),
        entry: "handler.sh".into(),
        files,
        digest: String::new(),
        inmanta: None,
    };
    code.digest = code.expected_digest();
    let mut blobs = BTreeMap::new();
    blobs.insert(hash, hex::encode(script.as_bytes()));
    (code, blobs)
}

/// VmHWM (peak resident memory) of a process, in MiB.
fn peak_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    kib / 1024.0
}

/// The `steward executor` children of `pid`.
fn executors_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|x| x.parse::<u32>().ok());
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        if ppid == Some(pid) && String::from_utf8_lossy(&cmd).contains("executor") {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn handler_floods_are_cut_and_cost_the_server_neither_memory_nor_leases() {
    let mut srv = Spawned::start("stw_test_admin_floods").await;
    let c = srv.client.clone();
    let calm = c
        .create_environment("floods", "calm", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.upload(&calm, &null_export(5, None), json!({}))
        .await
        .unwrap();
    wait_deployed(&c, &calm, 1, 60).await;
    let before = peak_mib(srv.child.id());

    let flood = c
        .create_environment(
            "floods",
            "flood",
            Some(json!({"retry_backoff": {"initial": 600, "factor": 1.0, "max": 600}})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    let logger = inmanta_code(
        "flood",
        &[("inmanta_plugins/flood/__init__.py", LOGGER)],
        &[],
        &["inmanta_plugins.flood"],
    );
    let mut x = with_code(
        vec![resource(
            "flood::Logger",
            "name",
            "big",
            json!({"size": FLOOD}),
            &[],
        )],
        &logger,
    );
    let raw = raw_flood_code();
    let mut r = resource("rawflood::Thing", "name", "line", json!({}), &[]);
    r.attributes.insert("name".into(), json!("line"));
    x.resources.push(r);
    x.handlers.insert("rawflood::Thing".into(), raw.0.clone());
    x.code.extend(raw.1.clone());
    let command = format!("sh -c 'head -c {FLOOD} /dev/zero | tr \"\\0\" y; echo done >&2'");
    x.resources
        .push(exec_run("localhost", &command, json!({}), &[]));
    let v = upload(&c, &flood, &x).await;

    // meanwhile the calm environment deploys new versions
    let mut calm_version = 1;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let p = c.progress(&flood, v).await.unwrap();
        if p["done"] == true {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the flood did not end: {p}"
        );
        calm_version += 1;
        c.upload(
            &calm,
            &null_export(5 + calm_version as usize, None),
            json!({}),
        )
        .await
        .unwrap();
        wait_deployed(&c, &calm, calm_version, 60).await;
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let peak = peak_mib(srv.child.id());
    eprintln!("server peak RSS: {before:.0} MiB before the flood, {peak:.0} MiB after");
    assert!(
        peak < before + 150.0,
        "the server's memory grew with the flood: {before:.0} MiB -> {peak:.0} MiB"
    );
    for pid in executors_of(srv.child.id()) {
        let p = peak_mib(pid);
        assert!(p < 150.0, "executor {pid} peaked at {p:.0} MiB");
    }

    // the module handler's record: cut, with a marker; the chatty debug lines: the first and
    // the last kept, the rest counted
    let id = "flood::Logger[localhost,name=big]";
    let s = state_of(&c, &flood, id).await;
    assert_eq!(s.status, "deployed", "{s:?}");
    let actions = deploy_actions(&c, &flood, id).await;
    assert_eq!(actions.len(), 1, "the action ran again: {actions:?}");
    let messages = actions[0].messages.as_array().unwrap();
    let text = serde_json::to_string(messages).unwrap();
    assert!(
        text.len() <= 1024 * 1024 + 4096,
        "{} bytes of logs",
        text.len()
    );
    let blob = messages
        .iter()
        .find(|m| m["message"].as_str().unwrap_or("").starts_with("xxx"))
        .expect("the big record");
    let m = blob["message"].as_str().unwrap();
    assert!(m.len() <= 64 * 1024, "{}", m.len());
    assert!(m.contains("[cut: ") && m.contains("a log message keeps at most 64 KiB"));
    assert!(
        blob["fields"]["blob"]
            .as_str()
            .unwrap()
            .starts_with("[cut: "),
        "{}",
        blob["fields"]
    );
    assert!(text.contains("chatty 0\""), "the first records are kept");
    assert!(text.contains("chatty 29999"), "the last records are kept");
    assert!(text.contains("dropped here: an action keeps at most 1 MiB of logs"));

    // the handler process that answered an endless line: failed, saying so
    let id = "rawflood::Thing[localhost,name=line]";
    let s = state_of(&c, &flood, id).await;
    assert_ne!(s.status, "deployed");
    let msg = s.last_message.clone().unwrap_or_default();
    assert!(
        msg.contains("over the 16 MiB limit of a protocol line"),
        "{s:?}"
    );
    assert_eq!(deploy_actions(&c, &flood, id).await.len(), 1);

    // the command: deployed, its output's head and tail kept
    let id = format!("exec::Run[localhost,command={command}]");
    let s = state_of(&c, &flood, &id).await;
    assert_eq!(s.status, "deployed", "{s:?}");
    let actions = deploy_actions(&c, &flood, &id).await;
    let text = serde_json::to_string(&actions[0].messages).unwrap();
    assert!(text.contains("bytes of output dropped"), "{text:.2000}");
    assert!(text.contains("done"), "stderr kept: {text:.2000}");
    assert!(text.len() < 64 * 1024, "{}", text.len());

    let log = std::fs::read_to_string(srv.data.path().join("server.log")).unwrap();
    assert!(
        !log.contains("lease of environment lost"),
        "a lease was lost:\n{log}"
    );
    assert!(!log.contains("too long"), "{log}");
    srv.kill9();
}
