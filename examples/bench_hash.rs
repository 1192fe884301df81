//! Hashing benchmark: `cargo run --release --example bench_hash [-- N]`
//!
//! What storing or sending a version costs in hashing (issue 31): the attribute hash of each
//! resource (SHA-256 of its canonical JSON), on one core and on every core (`hash_all`; a
//! server storing a whole export does this, a client sending changes only for the resources
//! whose fingerprint changed), then the version's content hash, whole and after a change to
//! one resource (its kept tree changed). The resources are the fs::File ones `bench_deploy`
//! exports. Best of 5 rounds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use steward::model::*;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let resources: Vec<Resource> = (0..n)
        .map(|i| {
            let path = format!("/dev/shm/.tmpAbCdEf/files/f{i:06}");
            let attributes = json!({
                "path": path, "owner": null, "group": null, "permissions": 644,
                "content": format!("file {i}\n"), "purged": false, "purge_on_delete": false,
                "send_event": true, "receive_events": true,
            });
            Resource {
                id: ResourceId::new("fs::File", "localhost", "path", &path),
                type_name: "fs::File".into(),
                agent: "localhost".into(),
                attributes: attributes.as_object().unwrap().clone(),
                requires: vec![],
            }
        })
        .collect();
    let no_handlers = BTreeMap::new();
    let (mut one, mut all, mut content) = (Duration::MAX, Duration::MAX, Duration::MAX);
    let mut change_one = Duration::MAX;
    let mut version = String::new();
    for _ in 0..5 {
        let t = Instant::now();
        let hashes: Vec<String> = resources.iter().map(Resource::hash).collect();
        one = one.min(t.elapsed());
        let t = Instant::now();
        let parallel = hash_all(&resources);
        all = all.min(t.elapsed());
        assert_eq!(hashes, parallel);
        let t = Instant::now();
        version = content::version_hash(
            resources
                .iter()
                .zip(&hashes)
                .map(|(r, h)| (r.id.0.as_str(), h.as_str(), r.requires.as_slice(), false)),
            &no_handlers,
        );
        content = content.min(t.elapsed());
        // what a store or a client sending changes does for a change to one resource: the
        // kept tree changed, its root hashed again
        let mut tree = content::ContentTree::of(
            resources
                .iter()
                .zip(&hashes)
                .map(|(r, h)| (r.id.0.as_str(), h.as_str(), r.requires.as_slice(), false)),
        );
        tree.root();
        let t = Instant::now();
        tree.insert(&resources[n / 2].id.0, "changed", &[] as &[String], false);
        let changed = tree.root();
        change_one = change_one.min(t.elapsed());
        assert_ne!(changed[..12], version[..12]);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{n} resources: attribute hashes on one core {:.2} ms ({:.0} ns each), on every core {:.2} ms; content hash {:.2} ms ({}); content hash after a change to one {:.3} ms",
        ms(one),
        one.as_nanos() as f64 / n as f64,
        ms(all),
        ms(content),
        &version[..12],
        ms(change_one)
    );
}
