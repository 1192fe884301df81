//! Protocol overhead of module handlers: `cargo run --release --example bench_handler [-- N]`
//!
//! Runs N actions (default 10,000) through the executor's code path for module handlers,
//! against a minimal Python handler written with steward's helper (read answers the desired
//! state, so nothing changes: one round trip per resource), and the same N actions with the
//! built-in null handler. The difference is what the handler protocol costs per resource:
//! JSON encoding, the pipe both ways, and the helper's dispatch in Python.

use std::time::Instant;

use serde_json::json;
use steward::executor::cache::Cache;
use steward::executor::execute;
use steward::executor::external::{ExternalPool, PYTHON_HELPER};
use steward::executor::protocol::{ActionKind, ExternalHandler, WorkItem};
use steward::model::{Resource, ResourceId};

const HANDLER: &str = r#"
from steward_handler import CRUDHandler, serve

class Null(CRUDHandler):
    def read_resource(self, ctx, resource):
        return {"value": resource.value}

serve(Null())
"#;

/// Handlers here call no server.
fn no_server(c: steward::executor::calls::ServerCall) -> steward::executor::calls::CallAnswer {
    steward::executor::calls::refusal(c.call_id, 501, "no server in this benchmark")
}

fn item(i: usize, type_name: &str, handler: Option<ExternalHandler>) -> WorkItem {
    let name = format!("r{i}");
    let attributes = json!({"name": name, "value": format!("v{i}"), "purged": false, "send_event": false, "receive_events": true});
    WorkItem {
        action_id: uuid::Uuid::new_v4(),
        kind: ActionKind::Deploy,
        resource: Resource {
            id: ResourceId::new(type_name, "bench", "name", &name),
            type_name: type_name.into(),
            agent: "bench".into(),
            attributes: attributes.as_object().unwrap().clone(),
            requires: vec![],
        },
        version: 1,
        reload: false,
        handler,
        timeout: Some(300),
        at_target: false,
        environment: None,
        want_facts: false,
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bench-digest");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(tmp.path().join("_lib")).unwrap();
    std::fs::write(tmp.path().join("_lib/steward_handler.py"), PYTHON_HELPER).unwrap();
    std::fs::write(dir.join("handler.py"), HANDLER).unwrap();
    let handler = ExternalHandler {
        dir,
        entry: "handler.py".into(),
        digest: "bench-digest".into(),
        inmanta: None,
    };
    let mut cache = Cache::default();
    let mut pool = ExternalPool::default();

    // start the handler process once (as an executor does for the first resource)
    let started = Instant::now();
    let r = execute(
        &mut cache,
        &mut pool,
        &item(0, "bench::Null", Some(handler.clone())),
        &mut no_server,
    );
    assert_eq!(r.outcome.as_str(), "deployed", "{:?}", r.messages);
    println!(
        "handler process start (python3 + hello): {:.1} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );

    let items: Vec<WorkItem> = (0..n)
        .map(|i| item(i, "bench::Null", Some(handler.clone())))
        .collect();
    let start = Instant::now();
    for it in &items {
        let r = execute(&mut cache, &mut pool, it, &mut no_server);
        assert_eq!(r.outcome.as_str(), "deployed");
    }
    let external = start.elapsed().as_secs_f64() / n as f64;

    let items: Vec<WorkItem> = (0..n)
        .map(|i| item(i, "std::testing::NullResource", None))
        .collect();
    let start = Instant::now();
    for it in &items {
        let r = execute(&mut cache, &mut pool, it, &mut no_server);
        assert_eq!(r.outcome.as_str(), "deployed");
    }
    let builtin = start.elapsed().as_secs_f64() / n as f64;
    pool.shutdown();

    println!(
        "{n} actions, module handler (Python, one read round trip each): {:.1} µs per resource",
        external * 1e6
    );
    println!(
        "{n} actions, built-in null handler: {:.1} µs per resource",
        builtin * 1e6
    );
    println!("---");
    println!(
        "protocol overhead: {:.1} µs per resource (target < 1000 µs)",
        (external - builtin) * 1e6
    );
}
