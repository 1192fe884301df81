//! The executor's side of Inmanta handlers without a server: `@cache` semantics in the
//! long-lived handler host (timeouts, ignored arguments, per-version entries, `call_on_delete`
//! exactly once, also at shutdown), the virtualenv for the handlers' requirements (made once
//! even when executors ask together), and what one action costs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::json;
use steward::executor::cache::Cache;
use steward::executor::external::ExternalPool;
use steward::executor::protocol::{ActionKind, ExternalHandler, Outcome, WorkItem, WorkResult};
use steward::model::{InmantaCode, Resource, ResourceId};

const CACHING: &str = r#"
import os, time
from inmanta.agent.handler import CRUDHandler, ResourcePurged, cache, provider
from inmanta.resources import PurgeableResource, resource

def note(journal, line):
    with open(journal, "a") as f:
        f.write(line + "\n")

@resource("cm::Thing", agent="host", id_attribute="name")
class Thing(PurgeableResource):
    fields = ("name", "journal")

@provider("cm::Thing", name="thing")
class ThingHandler(CRUDHandler):
    @cache(timeout=1, ignore=["journal"], call_on_delete=lambda v: note(v[0], "deleted short " + v[1]))
    def short(self, journal, key):
        note(journal, "computed short " + key)
        return (journal, key)

    @cache(for_version=True, call_on_delete=lambda v: note(v[0], "deleted versioned " + v[1]))
    def versioned(self, journal):
        tag = "v%d" % self.cache.version
        note(journal, "computed versioned " + tag)
        return (journal, tag)

    @cache(call_on_delete=lambda v: note(v[0], "deleted per-resource " + v[1]))
    def per_resource(self, journal, resource):
        note(journal, "computed per-resource " + resource.name)
        return (journal, resource.name)

    def read_resource(self, ctx, resource):
        self.short(resource.journal, "k")
        self.versioned(resource.journal)
        self.per_resource(resource.journal, resource)
        if resource.name == "sleepy":
            time.sleep(1.2)

    def create_resource(self, ctx, resource):
        ctx.set_created()
"#;

fn write_code(root: &Path, digest: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = root.join(digest);
    for (rel, content) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    std::fs::write(dir.join(".complete"), digest).unwrap();
    dir
}

fn thing(name: &str, journal: &Path) -> Resource {
    let attributes = json!({
        "name": name, "journal": journal.to_str().unwrap(), "purged": false,
        "purge_on_delete": false, "send_event": false, "receive_events": true,
    });
    Resource {
        id: ResourceId::new("cm::Thing", "localhost", "name", name),
        type_name: "cm::Thing".into(),
        agent: "localhost".into(),
        attributes: attributes.as_object().unwrap().clone(),
        requires: vec![],
    }
}

fn work(resource: Resource, version: i32, h: &ExternalHandler, kind: ActionKind) -> WorkItem {
    WorkItem {
        action_id: uuid::Uuid::new_v4(),
        kind,
        resource,
        version,
        reload: false,
        handler: Some(h.clone()),
        timeout: Some(60),
        at_target: false,
        environment: None,
        want_facts: false,
    }
}

fn journal(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn count(p: &Path, line: &str) -> usize {
    journal(p).iter().filter(|l| *l == line).count()
}

fn run(cache: &mut Cache, pool: &mut ExternalPool, item: &WorkItem) -> WorkResult {
    steward::executor::execute(cache, pool, item, &mut |c| {
        steward::executor::calls::refusal(c.call_id, 501, "no server in this test")
    })
}

#[test]
fn cache_entries_expire_per_timeout_version_and_shutdown_calling_on_delete_once() {
    let tmp = tempfile::tempdir().unwrap();
    let code = tmp.path().join("code");
    let dir = write_code(
        &code,
        "cachedigest",
        &[("inmanta_plugins/cm/__init__.py", CACHING)],
    );
    let h = ExternalHandler {
        dir,
        entry: "inmanta_plugins/cm/__init__.py".into(),
        digest: "cachedigest".into(),
        inmanta: Some(InmantaCode {
            requirements: vec![],
            imports: vec!["inmanta_plugins.cm".into()],
        }),
    };
    let j = tmp.path().join("journal");
    let mut cache = Cache::default();
    let mut pool = ExternalPool::default();

    // version 1: two resources share the ignored-argument and per-version entries
    for name in ["a", "b"] {
        let r = run(
            &mut cache,
            &mut pool,
            &work(thing(name, &j), 1, &h, ActionKind::Deploy),
        );
        assert_eq!(r.outcome, Outcome::Deployed, "{:?}", r.messages);
    }
    assert_eq!(count(&j, "computed short k"), 1, "{:?}", journal(&j));
    assert_eq!(count(&j, "computed versioned v1"), 1);
    assert_eq!(count(&j, "computed per-resource a"), 1);
    assert_eq!(count(&j, "computed per-resource b"), 1);

    // the deploy of version 1 is done: its entries go, the others stay
    pool.version_done(1);
    assert_eq!(count(&j, "deleted versioned v1"), 1, "{:?}", journal(&j));
    assert_eq!(count(&j, "deleted short k"), 0);

    // timeout=1: stale after a second (this action sleeps past it), made anew
    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("sleepy", &j), 2, &h, ActionKind::Deploy),
    );
    assert_eq!(r.outcome, Outcome::Deployed, "{:?}", r.messages);
    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("a", &j), 2, &h, ActionKind::Dryrun),
    );
    assert_eq!(r.outcome, Outcome::Dry, "{:?}", r.messages);
    assert_eq!(count(&j, "deleted short k"), 1, "{:?}", journal(&j));
    assert_eq!(count(&j, "computed short k"), 2);
    assert_eq!(count(&j, "computed versioned v2"), 1);
    // the per-resource entry of a was kept (evicted 60 s after its last use)
    assert_eq!(count(&j, "computed per-resource a"), 1);

    // an action of a newer version: version 2 is done on this executor
    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("b", &j), 3, &h, ActionKind::Deploy),
    );
    assert_eq!(r.outcome, Outcome::Deployed);
    assert_eq!(count(&j, "deleted versioned v2"), 1, "{:?}", journal(&j));

    // shutting down runs every remaining call_on_delete, once
    pool.shutdown();
    let after = journal(&j);
    for line in [
        "deleted versioned v3",
        "deleted per-resource a",
        "deleted per-resource b",
        "deleted short k",
    ] {
        assert!(after.contains(&line.to_string()), "{line}: {after:?}");
    }
    assert_eq!(count(&j, "deleted versioned v1"), 1);
    assert_eq!(count(&j, "deleted per-resource a"), 1);
}

/// A wheel of a tiny distribution `stewdep` (importable as `stewdep`), built by hand: pip
/// installs it without the network.
fn tiny_wheel(dir: &Path) -> PathBuf {
    let wheel = dir.join("stewdep-1.0-py3-none-any.whl");
    let script = r#"
import base64, hashlib, sys, zipfile
files = {
    "stewdep/__init__.py": "ANSWER = 42\n",
    "stewdep-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: stewdep\nVersion: 1.0\n",
    "stewdep-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: steward-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        data = text.encode()
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("stewdep-1.0.dist-info/RECORD,,")
    z.writestr("stewdep-1.0.dist-info/RECORD", "\n".join(record) + "\n")
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wheel
}

#[test]
fn requirements_get_one_virtualenv_made_once_for_executors_asking_together() {
    let tmp = tempfile::tempdir().unwrap();
    let wheel = tiny_wheel(tmp.path());
    let code = tmp.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    let reqs = vec![
        wheel.to_str().unwrap().to_string(),
        "inmanta-module-std>=8".to_string(),
    ];
    let started = Instant::now();
    let pythons: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    steward::executor::inmanta::python_for(&code, &reqs)
                        .unwrap()
                        .0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made = started.elapsed();
    assert!(pythons.iter().all(|p| p == &pythons[0]), "{pythons:?}");
    let venvs: Vec<_> = std::fs::read_dir(code.join("_venv"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.ends_with(".lock") && !n.starts_with('.'))
        .collect();
    assert_eq!(venvs.len(), 1, "{venvs:?}");
    let out = std::process::Command::new(&pythons[0])
        .args(["-c", "import stewdep; print(stewdep.ANSWER)"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    // asked again: found at once
    let again = Instant::now();
    assert_eq!(
        steward::executor::inmanta::python_for(&code, &reqs)
            .unwrap()
            .0,
        pythons[0]
    );
    assert!(again.elapsed().as_millis() < 200);
    // no requirement to install: the base interpreter
    assert_eq!(
        steward::executor::inmanta::python_for(&code, &["inmanta-core".to_string()])
            .unwrap()
            .0,
        PathBuf::from(std::env::var("STEWARD_PYTHON").unwrap_or_else(|_| "python3".into()))
    );
    // a requirement pip can not install: a clear error
    let err = steward::executor::inmanta::python_for(
        &code,
        &[tmp.path().join("nope.whl").to_str().unwrap().to_string()],
    )
    .unwrap_err();
    assert!(
        err.contains("installing the handlers' Python requirements") && err.contains("nope.whl"),
        "{err}"
    );
    eprintln!(
        "virtualenv with one requirement, 3 executors asking together: {:.1} s",
        made.as_secs_f64()
    );
}

#[test]
fn one_action_of_an_inmanta_crud_handler_costs_well_under_a_millisecond() {
    let tmp = tempfile::tempdir().unwrap();
    let code = tmp.path().join("code");
    let dir = write_code(
        &code,
        "benchdigest",
        &[("inmanta_plugins/cm/__init__.py", CACHING)],
    );
    let h = ExternalHandler {
        dir,
        entry: "inmanta_plugins/cm/__init__.py".into(),
        digest: "benchdigest".into(),
        inmanta: Some(InmantaCode {
            requirements: vec![],
            imports: vec!["inmanta_plugins.cm".into()],
        }),
    };
    let j = tmp.path().join("journal");
    let mut cache = Cache::default();
    let mut pool = ExternalPool::default();
    let start = Instant::now();
    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("first", &j), 1, &h, ActionKind::Deploy),
    );
    assert_eq!(r.outcome, Outcome::Deployed, "{:?}", r.messages);
    let first = start.elapsed();
    let n = 300;
    let items: Vec<WorkItem> = (0..n)
        .map(|i| work(thing(&format!("r{i}"), &j), 1, &h, ActionKind::Deploy))
        .collect();
    let start = Instant::now();
    for it in &items {
        let r = run(&mut cache, &mut pool, it);
        assert_eq!(r.outcome, Outcome::Deployed);
    }
    let per = start.elapsed().as_secs_f64() / n as f64;
    pool.shutdown();
    eprintln!(
        "Inmanta CRUD handler in the handler host: start (python3 + imports) {:.0} ms, then {:.0} µs per action (read, diff, create, 3 cached lookups, logs)",
        first.as_secs_f64() * 1000.0,
        per * 1e6
    );
    // generous: a debug build on a shared machine
    assert!(per < 0.02, "{per}");
}

const MISBEHAVING: &str = r#"
import os, sys, time
from inmanta.agent.handler import CRUDHandler, ResourcePurged, provider
from inmanta.resources import PurgeableResource, resource

@resource("bad::Thing", agent="host", id_attribute="name")
class Thing(PurgeableResource):
    fields = ("name", "journal")

@provider("bad::Thing", name="bad")
class BadHandler(CRUDHandler):
    def read_resource(self, ctx, resource):
        print("a print goes to stderr, never into the protocol")
        if resource.name == "hang":
            time.sleep(30)
        if resource.name == "crash":
            sys.stderr.write("about to die\n")
            sys.stderr.flush()
            os._exit(7)
        raise ResourcePurged()

    def create_resource(self, ctx, resource):
        ctx.set_created()
"#;

#[test]
fn a_hung_or_crashing_inmanta_handler_fails_its_action_and_the_next_starts_fresh() {
    let tmp = tempfile::tempdir().unwrap();
    let code = tmp.path().join("code");
    let dir = write_code(
        &code,
        "baddigest",
        &[("inmanta_plugins/bad/__init__.py", MISBEHAVING)],
    );
    let h = ExternalHandler {
        dir,
        entry: "inmanta_plugins/bad/__init__.py".into(),
        digest: "baddigest".into(),
        inmanta: Some(InmantaCode {
            requirements: vec![],
            imports: vec!["inmanta_plugins.bad".into()],
        }),
    };
    let j = tmp.path().join("journal");
    let thing = |name: &str| {
        let mut r = thing(name, &j);
        r.type_name = "bad::Thing".into();
        r.id = ResourceId::new("bad::Thing", "localhost", "name", name);
        r
    };
    let mut cache = Cache::default();
    let mut pool = ExternalPool::default();
    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("fine"), 1, &h, ActionKind::Deploy),
    );
    assert_eq!(r.outcome, Outcome::Deployed, "{:?}", r.messages);
    assert_eq!(r.change.as_str(), "created");

    let mut hang = work(thing("hang"), 1, &h, ActionKind::Deploy);
    hang.timeout = Some(1);
    let started = Instant::now();
    let r = run(&mut cache, &mut pool, &hang);
    assert!(started.elapsed().as_secs() < 5);
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(
        r.messages
            .iter()
            .any(|m| m.message.contains("did not answer within")),
        "{:?}",
        r.messages
    );

    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("crash"), 1, &h, ActionKind::Deploy),
    );
    assert_eq!(r.outcome, Outcome::Failed);
    let m = r
        .messages
        .iter()
        .find(|m| m.message.contains("exited"))
        .unwrap_or_else(|| panic!("{:?}", r.messages));
    assert!(
        m.message.contains("exit status 7") && m.message.contains("about to die"),
        "{}",
        m.message
    );

    let r = run(
        &mut cache,
        &mut pool,
        &work(thing("again"), 1, &h, ActionKind::Deploy),
    );
    assert_eq!(r.outcome, Outcome::Deployed, "{:?}", r.messages);
    pool.shutdown();
}
