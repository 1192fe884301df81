//! Versions kept as spans and sent as changes (issue 31): a version sent whole and the same
//! version sent as its changes are stored identically (content hash, diff, resources), every
//! kept version reads back as it was sent after deletions and retention, a memory that is
//! stale or wrong costs a whole upload and never a wrong version, and versions stored in the
//! old one-row-per-version layout read the same after the migration.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;
use steward::client::{Client, LastUpload};
use steward::model::*;

use crate::support::*;

/// The model the sequence mutates: resource number -> (content, requires, undefined).
type World = BTreeMap<usize, (String, BTreeSet<usize>, bool)>;

fn id_of(n: usize) -> ResourceId {
    ResourceId::new(
        "fs::File",
        if n.is_multiple_of(3) { "a" } else { "b" },
        "path",
        &format!("/f/{n:04}"),
    )
}

fn world_export(world: &World) -> ExportFile {
    ExportFile {
        format: EXPORT_FORMAT,
        resources: world
            .iter()
            .map(|(&n, (content, requires, _))| {
                let id = id_of(n);
                let (_, agent, _, _) = id.parse().unwrap();
                Resource {
                    type_name: "fs::File".into(),
                    agent: agent.to_string(),
                    attributes:
                        json!({"path": format!("/f/{n:04}"), "content": content, "mode": 644})
                            .as_object()
                            .unwrap()
                            .clone(),
                    requires: requires.iter().map(|&q| id_of(q)).collect(),
                    id,
                }
            })
            .collect(),
        undefined: world
            .iter()
            .filter(|(_, (_, _, u))| *u)
            .map(|(&n, _)| id_of(n))
            .collect(),
        metadata: ExportMetadata::default(),
        ..Default::default()
    }
}

/// One step of changes: a few contents, requires, undefined flags; additions and removals.
fn mutate(world: &mut World, rng: &mut Rng, next_id: &mut usize) {
    let keys: Vec<usize> = world.keys().copied().collect();
    for _ in 0..rng.below(6) {
        let k = keys[rng.below(keys.len())];
        world.get_mut(&k).unwrap().0 = format!("content {}", rng.next() % 1000);
    }
    for _ in 0..rng.below(3) {
        let k = keys[rng.below(keys.len())];
        // requires point to lower numbers only: never a cycle
        let lower: Vec<usize> = keys.iter().copied().filter(|&q| q < k).collect();
        if let Some(&q) = lower.get(rng.below(lower.len().max(1))) {
            let r = &mut world.get_mut(&k).unwrap().1;
            if !r.remove(&q) {
                r.insert(q);
            }
        }
    }
    if rng.below(3) == 0 {
        let k = keys[rng.below(keys.len())];
        let u = &mut world.get_mut(&k).unwrap().2;
        *u = !*u;
    }
    for _ in 0..rng.below(3) {
        world.insert(*next_id, (format!("new {next_id}"), BTreeSet::new(), false));
        *next_id += 1;
    }
    for _ in 0..rng.below(3) {
        let k = keys[rng.below(keys.len())];
        // a removed resource takes the requires on it along
        world.remove(&k);
        for (_, (_, r, _)) in world.iter_mut() {
            r.remove(&k);
        }
    }
}

fn canonical(v: &serde_json::Value) -> String {
    let mut out = String::new();
    steward::model::canonical_json(v, &mut out);
    out
}

/// Where two versions' resource sets differ (a short message, not two whole sets).
fn same(got: &BTreeSet<String>, want: &BTreeSet<String>, what: &str) {
    if got != want {
        let extra: Vec<&String> = got.difference(want).take(3).collect();
        let missing: Vec<&String> = want.difference(got).take(3).collect();
        panic!(
            "{what}: {} stored, {} sent; stored only: {extra:?}; sent only: {missing:?}",
            got.len(),
            want.len()
        );
    }
}

/// A version's resources as (id, type, agent, attributes, sorted requires, undefined).
fn as_sent(e: &ExportFile) -> BTreeSet<String> {
    let undefined: BTreeSet<&str> = e.undefined.iter().map(|u| u.0.as_str()).collect();
    e.resources
        .iter()
        .map(|r| {
            let mut req: Vec<&str> = r.requires.iter().map(|q| q.0.as_str()).collect();
            req.sort();
            canonical(&json!([
                r.id.0,
                r.type_name,
                r.agent,
                r.attributes,
                req,
                undefined.contains(r.id.0.as_str())
            ]))
        })
        .collect()
}

async fn as_stored(c: &Client, env: &str, n: i32) -> BTreeSet<String> {
    c.version_resources(env, n)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let mut req: Vec<&str> = r.requires.iter().map(String::as_str).collect();
            req.sort();
            canonical(&json!([
                r.resource_id,
                r.resource_type,
                r.agent,
                r.attributes,
                req,
                r.undefined
            ]))
        })
        .collect()
}

/// A call with the admin token, as (status, JSON body).
async fn raw(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{}{path}", s.url))
        .bearer_auth(s.admin.as_deref().unwrap());
    if let Some(b) = body {
        req = req.json(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

async fn new_env(c: &Client, name: &str, retention: u32) -> String {
    let env = c
        .create_environment("spans", name, None)
        .await
        .unwrap()
        .id
        .to_string();
    c.update_settings(
        &env,
        &json!({"version_retention": retention, "auto_release": false}),
    )
    .await
    .unwrap();
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_and_changes_store_identical_versions_over_a_random_sequence() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let whole = new_env(&c, "whole", 12).await;
    let changes = new_env(&c, "changes", 12).await;
    let seed = std::env::var("SPANS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0031_u64);
    eprintln!("seed {seed:#x} (SPANS_SEED replays it)");
    let mut rng = Rng(seed);
    let mut world: World = (0..120)
        .map(|n| (n, (format!("content {n}"), BTreeSet::new(), false)))
        .collect();
    let mut next_id = 120;
    let mut last: Option<LastUpload> = None;
    let memory_dir = tempfile::tempdir().unwrap();
    let memory_file = memory_dir.path().join("last");
    // every version sent, by number (the same in both environments)
    let mut sent: BTreeMap<i32, BTreeSet<String>> = BTreeMap::new();
    let (mut as_changes, mut fell_back) = (0, 0);
    for step in 0..60 {
        if step > 0 {
            mutate(&mut world, &mut rng, &mut next_id);
        }
        let export = world_export(&world);
        // now and then the client's export lists some resources' attributes in another
        // order: the same resources (their fingerprints differ, their hashes do not)
        let mut reordered = export.clone();
        if step % 4 == 2 {
            for r in reordered.resources.iter_mut().step_by(5) {
                r.attributes = r.attributes.clone().into_iter().rev().collect();
            }
        }
        let a = c.upload(&whole, &export, json!({})).await.unwrap();
        let b = c
            .upload_changes(&changes, &reordered, json!({}), last.take())
            .await
            .unwrap();
        last = b.last.clone();
        assert!(
            last.is_some(),
            "step {step}: the client's content hash is the server's"
        );
        // every other step the memory goes through its file (its base, or the changes
        // since), and the next upload starts from what the file says
        if step % 2 == 1 {
            last.as_ref().unwrap().save(&memory_file).unwrap();
            let read = LastUpload::load(&memory_file);
            assert_eq!(read, last, "step {step}: the memory read back");
            last = read;
        }
        let b_answer = &b.answer;
        if b.as_changes {
            as_changes += 1;
        } else if step > 0 {
            fell_back += 1;
        }
        let n = a["number"].as_i64().unwrap() as i32;
        assert_eq!(b_answer["number"], a["number"], "step {step}");
        assert_eq!(b_answer["content_hash"], a["content_hash"], "step {step}");
        // both servers kept their content tree from version to version: its root is the
        // content hash of the version computed whole
        let hashes: Vec<String> = export.resources.iter().map(Resource::hash).collect();
        let whole_hash = content::version_hash(
            export.resources.iter().zip(&hashes).map(|(r, h)| {
                (
                    r.id.0.as_str(),
                    h.as_str(),
                    r.requires.as_slice(),
                    export.undefined.contains(&r.id),
                )
            }),
            &export.handlers,
        );
        assert_eq!(a["content_hash"], whole_hash, "step {step}");
        assert_eq!(b_answer["diff_summary"], a["diff_summary"], "step {step}");
        assert_eq!(
            b_answer["resource_count"],
            export.resources.len(),
            "step {step}"
        );
        let (_, da) = raw(
            &s,
            reqwest::Method::GET,
            &format!("/api/v1/environments/{whole}/versions/{n}/diff"),
            None,
        )
        .await;
        let (_, db) = raw(
            &s,
            reqwest::Method::GET,
            &format!("/api/v1/environments/{changes}/versions/{n}/diff"),
            None,
        )
        .await;
        assert_eq!(da, db, "step {step}: the stored diffs differ");
        let wanted = as_sent(&export);
        same(
            &as_stored(&c, &whole, n).await,
            &wanted,
            &format!("step {step}: whole"),
        );
        same(
            &as_stored(&c, &changes, n).await,
            &wanted,
            &format!("step {step}: changes"),
        );
        sent.insert(n, wanted);
        // now and then a version goes: an older one, or the newest (its memory is then stale)
        if step % 9 == 4 {
            let older = n - 2;
            if older >= 1 && sent.contains_key(&older) {
                for env in [&whole, &changes] {
                    c.delete_version(env, older).await.unwrap();
                }
                sent.remove(&older);
            }
        }
        if step % 13 == 7 {
            for env in [&whole, &changes] {
                c.delete_version(env, n).await.unwrap();
            }
            sent.remove(&n);
        }
        // another client stores in between: the memory's base is no longer the newest
        if step % 17 == 11 {
            let n2 = c.upload(&changes, &export, json!({})).await.unwrap();
            let n1 = c.upload(&whole, &export, json!({})).await.unwrap();
            assert_eq!(n1["number"], n2["number"]);
            assert_eq!(n1["content_hash"], n2["content_hash"]);
            sent.insert(n1["number"].as_i64().unwrap() as i32, as_sent(&export));
        }
    }
    assert!(
        as_changes > 40,
        "most uploads went as changes: {as_changes}"
    );
    assert!(
        fell_back >= 4,
        "a deleted newest version or another client's upload makes the next go whole: {fell_back}"
    );
    // every version still kept reads back as it was sent, in both (spans after deletions
    // and retention)
    let kept: Vec<i32> = c
        .versions(&changes)
        .await
        .unwrap()
        .iter()
        .map(|v| v["number"].as_i64().unwrap() as i32)
        .collect();
    assert!(kept.len() >= 10, "{kept:?}");
    for n in &kept {
        same(
            &as_stored(&c, &changes, *n).await,
            &sent[n],
            &format!("version {n}"),
        );
        same(
            &as_stored(&c, &whole, *n).await,
            &sent[n],
            &format!("version {n}"),
        );
    }
    // the diff between any two kept versions is the same in both
    let (first, newest) = (kept[kept.len() - 1], kept[0]);
    assert_eq!(
        c.diff(&whole, first, newest).await.unwrap(),
        c.diff(&changes, first, newest).await.unwrap()
    );
    // nothing outlives its versions: spans only for kept versions, blobs only for spans
    let env_id: uuid::Uuid = changes.parse().unwrap();
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM resource_spans s WHERE s.environment_id = $1 AND NOT EXISTS \
         (SELECT 1 FROM versions v WHERE v.environment_id = s.environment_id \
          AND v.number BETWEEN s.first_version AND s.last_version)",
    )
    .bind(env_id)
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(orphans, 0, "spans of no kept version");
    let unused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM resource_blobs b WHERE NOT EXISTS (SELECT 1 FROM resource_spans s WHERE s.hash = b.hash)",
    )
    .fetch_one(&s.pool)
    .await
    .unwrap();
    assert_eq!(unused, 0, "attributes of no kept version");
    // a change costs rows for the change: the spans are far fewer than versions × resources
    let spans: i64 =
        sqlx::query_scalar("SELECT count(*) FROM resource_spans WHERE environment_id = $1")
            .bind(env_id)
            .fetch_one(&s.pool)
            .await
            .unwrap();
    let rows_per_version: usize = kept.iter().map(|n| sent[n].len()).sum();
    assert!(
        (spans as usize) * 3 < rows_per_version,
        "{spans} spans for {rows_per_version} version rows"
    );
}

/// A memory file's text with the hash of its lines (in its header) made again: a file
/// written wrong, rather than changed after it was written.
fn rehash(text: &str) -> String {
    use sha2::Digest;
    let mut parts = text.splitn(3, '\n');
    let (magic, header, body) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let mut header: serde_json::Value = serde_json::from_str(header).unwrap();
    header["body"] = hex::encode(sha2::Sha256::digest(body.as_bytes())).into();
    format!("{magic}\n{header}\n{body}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_memory_costs_a_whole_upload_never_a_wrong_version() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = new_env(&c, "memory", 10).await;
    let mut world: World = (0..20)
        .map(|n| (n, (format!("content {n}"), BTreeSet::new(), false)))
        .collect();
    let first = c
        .upload_changes(&env, &world_export(&world), json!({}), None)
        .await
        .unwrap();
    assert!(!first.as_changes);
    let memory = tempfile::tempdir().unwrap();
    let path = memory.path().join("last");
    first.last.as_ref().unwrap().save(&path).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the memory holds a key: its owner's only"
        );
    }
    assert_eq!(LastUpload::load(&path).as_ref(), first.last.as_ref());
    // the memory lies about one resource (its base version and content hash are right): a
    // change sent against it would leave that resource wrong, so the server refuses it
    let text = std::fs::read_to_string(&path).unwrap();
    let lied = text.replacen(&format!("\t{}", id_of(3)), &format!("\t{}", id_of(999)), 1);
    assert_ne!(lied, text);
    std::fs::write(&path, &lied).unwrap();
    assert!(
        LastUpload::load(&path).is_none(),
        "a file changed after it was written does not read"
    );
    // as if written so (its lines' hash made again)
    std::fs::write(&path, rehash(&lied)).unwrap();
    assert!(LastUpload::load(&path).is_some());
    world.get_mut(&5).unwrap().0 = "changed".into();
    let export = world_export(&world);
    let sent = c
        .upload_changes(&env, &export, json!({}), LastUpload::load(&path))
        .await
        .unwrap();
    assert!(
        !sent.as_changes,
        "the server refused the changes and the whole went"
    );
    let n = sent.answer["number"].as_i64().unwrap() as i32;
    same(
        &as_stored(&c, &env, n).await,
        &as_sent(&export),
        "after a wrong memory",
    );
    assert_eq!(sent.answer["diff_summary"]["updated"], 1);
    // the memory claims the server holds resource 8 as it is about to be (its base version
    // and content hash are right): the changes would leave 8 as it was, so the content hash
    // the client expects does not come out, and the server refuses them
    sent.last.as_ref().unwrap().save(&path).unwrap();
    let old8 = export
        .resources
        .iter()
        .find(|r| r.id == id_of(8))
        .unwrap()
        .hash();
    world.get_mut(&8).unwrap().0 = "eight changed".into();
    let export = world_export(&world);
    let new8 = export
        .resources
        .iter()
        .find(|r| r.id == id_of(8))
        .unwrap()
        .hash();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(&old8));
    std::fs::write(&path, rehash(&text.replace(&old8, &new8))).unwrap();
    let sent = c
        .upload_changes(&env, &export, json!({}), LastUpload::load(&path))
        .await
        .unwrap();
    assert!(
        !sent.as_changes,
        "the server refused the changes and the whole went"
    );
    let n = sent.answer["number"].as_i64().unwrap() as i32;
    same(
        &as_stored(&c, &env, n).await,
        &as_sent(&export),
        "after a lying memory",
    );
    assert_eq!(sent.answer["diff_summary"]["updated"], 1);
    // the refused changes took the server's content tree of the newest version: it made
    // this version's whole, and the hash is still the one the client computed
    assert!(
        sent.last.is_some(),
        "the server's content hash is the client's"
    );
    // an export naming a resource twice, and without another one, is refused as a whole
    // export is: the duplicate must not stand in for the removed resource's place in the
    // memory (the changes would then store a version that still has it)
    let mut doubled = export.clone();
    let first = doubled.resources[0].clone();
    doubled.resources[1] = first;
    let newest = c.versions(&env).await.unwrap()[0]["number"].clone();
    let refused = c
        .upload_changes(&env, &doubled, json!({}), sent.last.clone())
        .await;
    assert!(
        refused.is_err(),
        "a duplicate id is refused, not stored: {:?}",
        refused.map(|s| s.answer)
    );
    assert_eq!(c.versions(&env).await.unwrap()[0]["number"], newest);
    // a memory of another environment is not used
    let other = new_env(&c, "other", 10).await;
    let sent = c
        .upload_changes(&other, &export, json!({}), sent.last.clone())
        .await
        .unwrap();
    assert!(!sent.as_changes);
    // a file that is not a memory reads as none
    std::fs::write(&path, "garbage\n").unwrap();
    assert!(LastUpload::load(&path).is_none());
    // changes against a base that moved, sent by hand: 409 base_moved with a JSON body
    let body = json!({"format": 1, "resources": [], "undefined": [], "metadata": {"project": "", "compiler": ""},
        "base": {"version": 1, "content_hash": "x"}, "removed": []});
    let (status, err) = raw(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/versions"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"], "base_moved", "{err}");
    // removed without base is a bad request; removing what is not there is invalid
    let body = json!({"format": 1, "resources": [], "undefined": [], "metadata": {"project": "", "compiler": ""},
        "removed": [id_of(1).0]});
    let (status, err) = raw(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/versions"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    let newest = c.versions(&env).await.unwrap()[0].clone();
    let body = json!({"format": 1, "resources": [], "undefined": [], "metadata": {"project": "", "compiler": ""},
        "base": {"version": newest["number"], "content_hash": newest["content_hash"]},
        "removed": [id_of(777).0]});
    let (status, err) = raw(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/versions"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"], "base_moved", "{err}");
    // removing a resource another one still requires is refused, as in a whole export
    world.get_mut(&7).unwrap().1.insert(6);
    let base = c
        .upload_changes(&env, &world_export(&world), json!({}), None)
        .await
        .unwrap();
    let body = json!({"format": 1, "resources": [], "undefined": [], "metadata": {"project": "", "compiler": ""},
        "base": {"version": base.answer["number"], "content_hash": base.answer["content_hash"]},
        "removed": [id_of(6).0]});
    let (status, err) = raw(
        &s,
        reqwest::Method::POST,
        &format!("/api/v1/environments/{env}/versions"),
        Some(&body),
    )
    .await;
    assert_eq!(status, 422, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("requires"),
        "{err}"
    );
}

/// Changes that close a dependency cycle are refused as a whole export closing it is: the
/// server checks around the resources that gained a requirement, not the whole version.
/// A memory that changed a few resources since its file was written saves them beside the
/// file, which stays as it was; what it reads back is the memory. Changes of another base, or
/// cut short, are not used (the next upload is whole, and right); resources that come or go
/// write the whole file again.
#[tokio::test(flavor = "multi_thread")]
async fn a_memory_saves_its_changes_beside_its_file() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = new_env(&c, "journal", 10).await;
    let mut world: World = (0..30)
        .map(|n| (n, (format!("content {n}"), BTreeSet::new(), false)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("last");
    let changes_file = dir.path().join("last.changes");
    let first = c
        .upload_changes(&env, &world_export(&world), json!({}), None)
        .await
        .unwrap();
    first.last.as_ref().unwrap().save(&path).unwrap();
    assert!(!changes_file.exists());
    let base = std::fs::read(&path).unwrap();
    let upload = async |world: &World| {
        let export = world_export(world);
        let sent = c
            .upload_changes(&env, &export, json!({}), LastUpload::load(&path))
            .await
            .unwrap();
        let n = sent.answer["number"].as_i64().unwrap() as i32;
        same(&as_stored(&c, &env, n).await, &as_sent(&export), "stored");
        let last = sent.last.clone().expect("the content hash agreed");
        last.save(&path).unwrap();
        assert_eq!(LastUpload::load(&path).as_ref(), Some(&last), "read back");
        sent
    };
    for n in [5, 6, 5] {
        world.get_mut(&n).unwrap().0 = format!("changed {}", world[&n].0);
        let sent = upload(&world).await;
        assert!(sent.as_changes);
        assert_eq!(std::fs::read(&path).unwrap(), base, "the base file is kept");
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(&changes_file)
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(
            mode & 0o777,
            0o600,
            "the changes hold the key's fingerprints"
        );
    }
    let changes = std::fs::read_to_string(&changes_file).unwrap();
    assert_eq!(
        changes.lines().count(),
        2 + 2,
        "two resources changed, each once: {changes}"
    );
    // changes of another base (left by a crash between writing a base and removing them)
    world.insert(30, ("new".into(), BTreeSet::new(), false));
    let sent = upload(&world).await;
    assert!(sent.as_changes);
    assert!(
        !changes_file.exists(),
        "a resource came: the base is written whole"
    );
    assert_ne!(std::fs::read(&path).unwrap(), base);
    std::fs::write(&changes_file, &changes).unwrap();
    assert_eq!(
        LastUpload::load(&path).as_ref(),
        sent.last.as_ref(),
        "changes of another base are not used"
    );
    // changes cut short: the base alone is read, which the server moved past, so the next
    // upload goes whole, and is stored right
    world.get_mut(&7).unwrap().0 = "seven".into();
    assert!(upload(&world).await.as_changes);
    let full = std::fs::read_to_string(&changes_file).unwrap();
    let cut: String = full.lines().take(2).map(|l| format!("{l}\n")).collect();
    std::fs::write(&changes_file, cut).unwrap();
    world.get_mut(&8).unwrap().0 = "eight".into();
    let sent = upload(&world).await;
    assert!(
        !sent.as_changes,
        "the memory read was stale: the whole went"
    );
    assert!(!changes_file.exists());
    // a resource going writes the base whole too
    world.remove(&2);
    assert!(upload(&world).await.as_changes);
    assert!(!changes_file.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_that_close_a_dependency_cycle_are_refused() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = new_env(&c, "cycles", 10).await;
    // 2 requires 1 requires 0
    let mut world: World = (0..6)
        .map(|n| (n, (format!("content {n}"), BTreeSet::new(), false)))
        .collect();
    world.get_mut(&1).unwrap().1.insert(0);
    world.get_mut(&2).unwrap().1.insert(1);
    c.upload_changes(&env, &world_export(&world), json!({}), None)
        .await
        .unwrap();
    // the given resources of `world` (by number), as changes against the newest version
    let send = |world: World, given: Vec<usize>| {
        let (s, c, env) = (&s, &c, &env);
        async move {
            let newest = c.versions(env).await.unwrap()[0].clone();
            let export = world_export(&world);
            let resources: Vec<&Resource> = export
                .resources
                .iter()
                .filter(|r| given.iter().any(|&n| id_of(n) == r.id))
                .collect();
            let body = json!({"format": 1, "resources": resources, "undefined": [],
                "metadata": {"project": "", "compiler": ""},
                "base": {"version": newest["number"], "content_hash": newest["content_hash"]},
                "removed": []});
            raw(
                s,
                reqwest::Method::POST,
                &format!("/api/v1/environments/{env}/versions"),
                Some(&body),
            )
            .await
        }
    };
    let versions = c.versions(&env).await.unwrap().len();
    // 0 now requires 2: 0 -> 2 -> 1 -> 0
    let mut closed = world.clone();
    closed.get_mut(&0).unwrap().1.insert(2);
    let (status, err) = send(closed, vec![0]).await;
    assert_eq!(status, 422, "{err}");
    let message = err["message"].as_str().unwrap();
    assert!(message.contains("dependency cycle"), "{err}");
    for n in [0, 1, 2] {
        assert!(message.contains(&id_of(n).0), "{err}");
    }
    // through a resource the changes add: 0 requires the new 9, which requires 2
    let mut closed = world.clone();
    closed.insert(9, ("nine".into(), BTreeSet::from([2]), false));
    closed.get_mut(&0).unwrap().1.insert(9);
    let (status, err) = send(closed, vec![0, 9]).await;
    assert_eq!(status, 422, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains(&id_of(9).0),
        "{err}"
    );
    assert_eq!(
        c.versions(&env).await.unwrap().len(),
        versions,
        "nothing stored"
    );
    // the same new resource without the edge back is a version
    world.insert(9, ("nine".into(), BTreeSet::from([2]), false));
    world.insert(10, ("ten".into(), BTreeSet::from([9, 3]), false));
    let (status, stored) = send(world.clone(), vec![9, 10]).await;
    assert_eq!(status, 201, "{stored}");
    same(
        &as_stored(&c, &env, stored["number"].as_i64().unwrap() as i32).await,
        &as_sent(&world_export(&world)),
        "after the changes",
    );
}

/// Versions stored before the spans (one row per resource and version) read the same after
/// migration 0019, including deleted versions in between and an older active version.
#[tokio::test(flavor = "multi_thread")]
async fn versions_in_the_old_layout_read_the_same_after_the_migration() {
    let db = new_database();
    let pool = steward::store::connect(&db, 4).await.unwrap();
    let mut migrator = sqlx::migrate::Migrator::new(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations"
    )))
    .await
    .unwrap();
    let all = migrator.migrations.to_vec();
    migrator.migrations = all.iter().filter(|m| m.version < 19).cloned().collect();
    migrator.run(&pool).await.unwrap();
    let env = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO projects (id, name) VALUES ($1, 'p')")
        .bind(env)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO environments (id, project_id, name) VALUES ($1, $1, 'e')")
        .bind(env)
        .execute(&pool)
        .await
        .unwrap();
    // versions 1, 2, 4, 5 (3 was deleted); x changes in 2, y is gone in 4 and back in 5, z
    // is undefined in 5 only
    // (version, [(resource, attribute hash, undefined)])
    type Rows<'a> = &'a [(&'a str, &'a str, bool)];
    let layout: [(i32, Rows); 4] = [
        (
            1,
            &[("x", "x1", false), ("y", "y1", false), ("z", "z1", false)],
        ),
        (
            2,
            &[("x", "x2", false), ("y", "y1", false), ("z", "z1", false)],
        ),
        (4, &[("x", "x2", false), ("z", "z1", false)]),
        (
            5,
            &[("x", "x2", false), ("y", "y1", false), ("z", "z1", true)],
        ),
    ];
    for (n, rows) in &layout {
        sqlx::query(
            "INSERT INTO versions (environment_id, number, uploader, origin, content_hash, resource_count) \
             VALUES ($1, $2, 't', 'push', $3, $4)",
        )
        .bind(env)
        .bind(n)
        .bind(format!("h{n}"))
        .bind(rows.len() as i32)
        .execute(&pool)
        .await
        .unwrap();
        for (name, hash, undefined) in rows.iter() {
            sqlx::query("INSERT INTO resource_blobs (hash, attributes) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(hash)
                .bind(json!({"v": hash}))
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO version_resources (environment_id, version, resource_id, resource_type, agent, hash, requires, undefined) \
                 VALUES ($1, $2, $3, 't', 'a', $4, $5, $6)",
            )
            .bind(env)
            .bind(n)
            .bind(format!("t[a,n={name}]"))
            .bind(hash)
            .bind(if *name == "x" { vec!["t[a,n=z]".to_string()] } else { vec![] })
            .bind(undefined)
            .execute(&pool)
            .await
            .unwrap();
        }
    }
    migrator.migrations = all.into();
    migrator.run(&pool).await.unwrap();
    for (n, rows) in &layout {
        let stored = steward::store::versions::resources(&pool, env, *n)
            .await
            .unwrap();
        let got: Vec<(String, String, bool)> = stored
            .iter()
            .map(|r| (r.resource_id.clone(), r.hash.clone(), r.undefined))
            .collect();
        let want: Vec<(String, String, bool)> = rows
            .iter()
            .map(|(name, hash, u)| (format!("t[a,n={name}]"), hash.to_string(), *u))
            .collect();
        assert_eq!(got, want, "version {n}");
        let x = stored.iter().find(|r| r.resource_id == "t[a,n=x]").unwrap();
        assert_eq!(x.requires, vec!["t[a,n=z]".to_string()]);
    }
    // 6 spans: x1 [1,1], x2 [2,open], y1 [1,2], y1 [5,open], z1 [1,4], z1 undefined [5,open]
    let spans: Vec<(String, i32, i32)> = sqlx::query_as(
        "SELECT hash, first_version, last_version FROM resource_spans WHERE environment_id = $1 \
         ORDER BY resource_id, first_version",
    )
    .bind(env)
    .fetch_all(&pool)
    .await
    .unwrap();
    let open = i32::MAX;
    assert_eq!(
        spans,
        vec![
            ("x1".into(), 1, 1),
            ("x2".into(), 2, open),
            ("y1".into(), 1, 2),
            ("y1".into(), 5, open),
            ("z1".into(), 1, 4),
            ("z1".into(), 5, open),
        ]
    );
    // the next version is stored on top of the migrated ones
    let mut c = pool.acquire().await.unwrap();
    let export = ExportFile {
        format: EXPORT_FORMAT,
        resources: vec![Resource {
            id: ResourceId("t[a,n=x]".into()),
            type_name: "t".into(),
            agent: "a".into(),
            attributes: serde_json::Map::new(),
            requires: vec![],
        }],
        ..Default::default()
    };
    let stored = steward::store::versions::store(
        &mut c,
        env,
        steward::store::versions::NewVersion {
            export: &export,
            uploader: "t",
            origin: "push",
            provenance: json!({}),
            attributes_beside: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(stored.info.number, 6);
    assert_eq!(
        stored.info.diff_summary,
        json!({"new": 0, "updated": 1, "deleted": 2, "unchanged": 0})
    );
    let five = steward::store::versions::resources(&pool, env, 5)
        .await
        .unwrap();
    assert_eq!(five.len(), 3, "version 5 is unchanged by storing 6");
}

fn model(dir: &std::path::Path, out: &std::path::Path, changed: Option<usize>) {
    let mut m = String::from("import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
    for i in 0..40 {
        let content = if Some(i) == changed {
            format!("file {i} changed")
        } else {
            format!("file {i}")
        };
        m.push_str(&format!(
            "fs::File(host=host, path=\"{}/f{i}\", content=\"{content}\", mode=644, owner=null, group=null)\n",
            out.display()
        ));
    }
    std::fs::write(dir.join("main.cf"), m).unwrap();
}

/// The command line sends changes for real: `steward export` a second time sends the one
/// changed resource and stores the same version a whole upload of the same project stores;
/// `steward deploy` a second time too, and the file on disk changes.
#[tokio::test(flavor = "multi_thread")]
async fn steward_export_and_deploy_send_only_what_changed() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = new_env(&c, "cli", 10).await;
    let elsewhere = new_env(&c, "cli-whole", 10).await;
    let project = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("project.yml"), "name: changes\n").unwrap();
    let out = project.path().join("out");
    let export = |args: &[&str]| {
        let o = std::process::Command::new(steward_bin())
            .args(args)
            .current_dir(project.path())
            .env("STEWARD_SERVER", &s.url)
            .env("STEWARD_TOKEN", s.admin.as_deref().unwrap())
            .env("STEWARD_ENV", &env)
            .env("XDG_CACHE_HOME", cache.path())
            .env_remove("STEWARD_CA_CERT")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        err
    };
    model(project.path(), &out, None);
    let first = export(&["export"]);
    assert!(first.contains("uploaded version 1"), "{first}");
    assert!(!first.contains("sent as its changes"), "{first}");
    model(project.path(), &out, Some(7));
    let second = export(&["export"]);
    assert!(second.contains("uploaded version 2"), "{second}");
    assert!(
        second.contains("(+0 ~1 -0), sent as its changes"),
        "{second}"
    );
    // one memory: its file, and the one change since beside it
    let mut remembered: Vec<String> = std::fs::read_dir(cache.path().join("steward/uploads"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    remembered.sort();
    assert_eq!(remembered.len(), 2, "{remembered:?}");
    assert_eq!(
        remembered[1],
        format!("{}.changes", remembered[0]),
        "{remembered:?}"
    );
    // the same project uploaded whole elsewhere: the same version
    export(&["export", "-j", "whole.json"]);
    let whole: ExportFile =
        serde_json::from_slice(&std::fs::read(project.path().join("whole.json")).unwrap()).unwrap();
    let w = c.upload(&elsewhere, &whole, json!({})).await.unwrap();
    let v2 = c.version(&env, 2).await.unwrap();
    assert_eq!(v2["content_hash"], w["content_hash"]);
    same(
        &as_stored(&c, &env, 2).await,
        &as_sent(&whole),
        "steward export sent as changes",
    );

    // steward deploy: its own private server; the second run sends the change
    let deploy = || {
        let o = std::process::Command::new(steward_bin())
            .args(["deploy", "-p"])
            .arg(project.path())
            .output()
            .unwrap();
        let text = crate::support::output_text(&o);
        assert!(o.status.success(), "{text}");
        text
    };
    std::fs::create_dir_all(&out).unwrap();
    let first = deploy();
    assert!(!first.contains("sent as its changes"), "{first}");
    model(project.path(), &out, Some(9));
    let second = deploy();
    assert!(
        second.contains("0 new, 2 changed, 0 removed, 38 unchanged (sent as its changes)"),
        "{second}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("f9")).unwrap(),
        "file 9 changed"
    );
    // without its memory the next run sends the whole version and still works
    std::fs::remove_file(project.path().join("data/deploy/last-upload")).unwrap();
    model(project.path(), &out, Some(3));
    let third = deploy();
    assert!(!third.contains("sent as its changes"), "{third}");
    assert_eq!(
        std::fs::read_to_string(out.join("f3")).unwrap(),
        "file 3 changed"
    );
}

/// A version with no version before it is all new. Its diff is read from its resources, not
/// stored as a row per resource. It reads as every resource "new" (undefined ones too), in
/// id order, and the next version's diff is stored and read as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_version_diff_is_every_resource_new_and_not_stored_row_by_row() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = new_env(&c, "first", 10).await;
    let env_id = uuid::Uuid::parse_str(&env).unwrap();
    let mut world: World = (0..5)
        .map(|n| (n, (format!("c{n}"), BTreeSet::new(), n == 3)))
        .collect();
    let v1 = c
        .upload(&env, &world_export(&world), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let diff_rows = |v: i32| {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM version_diffs WHERE environment_id = $1 AND version = $2",
        )
        .bind(env_id)
        .bind(v)
        .fetch_one(&s.pool)
    };
    assert_eq!(
        diff_rows(v1).await.unwrap(),
        0,
        "a first version's diff is not stored"
    );
    let (status, d) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/{v1}/diff"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{d}");
    let entries = d["changes"].as_array().expect("changes");
    let mut want: Vec<String> = (0..5).map(|n| id_of(n).0).collect();
    want.sort();
    assert_eq!(
        entries
            .iter()
            .map(|e| e["resource_id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        want,
        "{d}"
    );
    assert!(
        entries
            .iter()
            .all(|e| e["change"] == "new" && e["attributes"] == json!({})),
        "{d}"
    );
    // the detail page carries the same diff
    let (_, detail) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/{v1}"),
        None,
    )
    .await;
    assert_eq!(detail["diff"], d["changes"], "{detail}");
    // the next version: stored as before, one row per change
    world.get_mut(&1).unwrap().0 = "changed".into();
    world.remove(&4);
    let v2 = c
        .upload(&env, &world_export(&world), json!({}))
        .await
        .unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    assert_eq!(diff_rows(v2).await.unwrap(), 2);
    let (_, d2) = raw(
        &s,
        reqwest::Method::GET,
        &format!("/api/v1/environments/{env}/versions/{v2}/diff"),
        None,
    )
    .await;
    let changes: Vec<(String, String)> = d2["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["resource_id"].as_str().unwrap().to_string(),
                e["change"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            (id_of(1).0, "updated".to_string()),
            (id_of(4).0, "deleted".to_string())
        ],
        "{d2}"
    );
}

/// A version that opens thousands of span rows refreshes the planner's statistics of
/// `resource_spans` right after its commit (with the statistics of a nearly empty table, the
/// next version's changed rows were closed by scanning every open row), and a small one
/// does not. `last_analyze` is set by an explicit ANALYZE only, never by autovacuum.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_version_refreshes_the_statistics_of_the_spans() {
    let s = TestServer::start(false).await;
    let c = s.admin_client();
    let env = new_env(&c, "analyze", 10).await;
    let analyzed = || async {
        sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
            "SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'resource_spans'",
        )
        .fetch_one(&s.pool)
        .await
        .unwrap()
    };
    let small: World = (0..50)
        .map(|n| (n, (format!("c{n}"), BTreeSet::new(), false)))
        .collect();
    c.upload(&env, &world_export(&small), json!({}))
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        analyzed().await,
        None,
        "50 rows do not call for new statistics"
    );
    let large: World = (0..6000)
        .map(|n| (n, (format!("d{n}"), BTreeSet::new(), false)))
        .collect();
    c.upload(&env, &world_export(&large), json!({}))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while analyzed().await.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no ANALYZE of resource_spans 20 s after a 6,000-resource version"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
