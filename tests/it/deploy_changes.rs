//! The scheduler takes each released version in place, by what changed (issue 31): over a
//! random sequence of versions sent as changes, with files added, changed and removed,
//! requirements moved and unknown values coming and going, what lands on disk and the state
//! of every resource are what the model says. A slip in the in-place bookkeeping (an index
//! left pointing at the resource that took a removed one's slot, an edge not made when a
//! required resource came back) writes the wrong file or blocks the wrong one here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::json;
use steward::client::{Client, LastUpload};
use steward::model::*;

use crate::deploy::deploying_env;
use crate::support::*;

const AGENT: &str = "localhost";

/// resource number -> (content, the lower-numbered resources it requires, undefined)
type World = BTreeMap<usize, (String, BTreeSet<usize>, bool)>;

fn path_of(dir: &Path, n: usize) -> String {
    format!("{}/f{n:03}", dir.display())
}

fn id_of(dir: &Path, n: usize) -> String {
    format!("fs::File[{AGENT},path={}]", path_of(dir, n))
}

fn export(dir: &Path, world: &World) -> ExportFile {
    let mut e = export_of(
        world
            .iter()
            .map(|(&n, (content, requires, _))| {
                let requires: Vec<String> = requires.iter().map(|&q| id_of(dir, q)).collect();
                let requires: Vec<&str> = requires.iter().map(String::as_str).collect();
                fs_file(AGENT, &path_of(dir, n), content, &requires)
            })
            .collect(),
    );
    e.undefined = world
        .iter()
        .filter(|(_, (_, _, undefined))| *undefined)
        .map(|(&n, _)| ResourceId(id_of(dir, n)))
        .collect();
    e
}

/// Blocked by an unknown value: undefined itself, or requiring one that is blocked.
fn blocked(world: &World, n: usize) -> bool {
    let (_, requires, undefined) = &world[&n];
    *undefined || requires.iter().any(|&q| blocked(world, q))
}

/// One version's changes: contents, additions (requiring older ones), removals (what
/// required them no longer does), a requirement moved, an unknown value come or gone.
fn mutate(world: &mut World, rng: &mut Rng, next: &mut usize, step: usize) {
    let keys: Vec<usize> = world.keys().copied().collect();
    for _ in 0..1 + rng.below(3) {
        let k = keys[rng.below(keys.len())];
        world.get_mut(&k).unwrap().0 = format!("content {k} at {step}\n");
    }
    for _ in 0..rng.below(3) {
        if world.len() > 4 {
            let gone = keys[rng.below(keys.len())];
            if world.remove(&gone).is_some() {
                for (_, requires, _) in world.values_mut() {
                    requires.remove(&gone);
                }
            }
        }
    }
    for _ in 0..rng.below(3) {
        let n = *next;
        *next += 1;
        let held: Vec<usize> = world.keys().copied().collect();
        let requires: BTreeSet<usize> = (0..rng.below(3))
            .map(|_| held[rng.below(held.len())])
            .collect();
        world.insert(n, (format!("content {n} at {step}\n"), requires, false));
    }
    let keys: Vec<usize> = world.keys().copied().collect();
    let k = keys[rng.below(keys.len())];
    if rng.below(3) == 0 {
        let older: Vec<usize> = keys.iter().copied().filter(|&q| q < k).collect();
        if !older.is_empty() {
            let entry = world.get_mut(&k).unwrap();
            entry.1 = BTreeSet::from([older[rng.below(older.len())]]);
        }
    }
    if rng.below(4) == 0 {
        let entry = world.get_mut(&k).unwrap();
        entry.2 = !entry.2;
    }
}

/// The random sequence, and what each file should hold.
struct Sequence {
    dir: tempfile::TempDir,
    rng: Rng,
    world: World,
    next: usize,
    last: Option<LastUpload>,
    /// what each file holds: a blocked resource keeps what it last deployed
    on_disk: BTreeMap<usize, String>,
    /// every resource that ever was (removed ones must be gone from disk)
    ever: BTreeSet<usize>,
    as_changes: usize,
    blocked_seen: usize,
}

impl Sequence {
    fn new(dir: tempfile::TempDir, seed: u64) -> Sequence {
        let world = (0..10)
            .map(|n| {
                let requires = if n > 0 {
                    BTreeSet::from([n - 1])
                } else {
                    BTreeSet::new()
                };
                (n, (format!("content {n}\n"), requires, false))
            })
            .collect();
        Sequence {
            dir,
            rng: Rng(seed),
            world,
            next: 10,
            last: None,
            on_disk: BTreeMap::new(),
            ever: BTreeSet::new(),
            as_changes: 0,
            blocked_seen: 0,
        }
    }

    /// Send the next version (the first as it is), wait for its deploy, and check the disk
    /// and every resource's state.
    async fn step(&mut self, c: &Client, env: &str, step: usize) {
        let d = self.dir.path().to_path_buf();
        if step > 0 {
            mutate(&mut self.world, &mut self.rng, &mut self.next, step);
        }
        let sent = c
            .upload_changes(env, &export(&d, &self.world), json!({}), self.last.take())
            .await
            .unwrap();
        self.as_changes += usize::from(sent.as_changes);
        self.last = sent.last;
        let v = sent.answer["number"].as_i64().unwrap() as i32;
        wait_deployed(c, env, v, 60).await;
        let world = &self.world;
        self.ever.extend(world.keys());
        self.on_disk.retain(|n, _| world.contains_key(n));
        for (&n, (content, _, _)) in world {
            if !blocked(world, n) {
                self.on_disk.insert(n, content.clone());
            }
        }
        // removed files are deleted on their target (tombstones run after the version)
        let (ever, on_disk) = (&self.ever, &self.on_disk);
        eventually(
            20,
            &format!("step {step}: the disk as the model says"),
            || {
                let ok = ever.iter().all(|&n| {
                    let file = std::fs::read_to_string(path_of(&d, n)).ok();
                    file.as_ref() == on_disk.get(&n)
                });
                async move { ok.then_some(()) }
            },
        )
        .await;
        // the progress endpoint's counts come from the scheduler's model (no join of every
        // resource with its state), and are those of the database's list
        let progress = c.progress(env, v).await.unwrap();
        let (_, rows) = c.resources(env).await.unwrap();
        assert_eq!(rows.len(), world.len(), "step {step}");
        assert_eq!(
            progress["counted_by"], "scheduler",
            "step {step}: {progress}"
        );
        let mut listed: BTreeMap<&str, i64> = BTreeMap::new();
        for r in &rows {
            *listed.entry(r.status.as_str()).or_default() += 1;
        }
        assert_eq!(progress["by_status"], json!(listed), "step {step}");
        let rows: BTreeMap<String, _> = rows
            .into_iter()
            .map(|r| (r.resource_id.clone(), r))
            .collect();
        for &n in world.keys() {
            let s = &rows[&id_of(&d, n)];
            if blocked(world, n) {
                self.blocked_seen += 1;
                assert_eq!(s.blocked, "blocked", "step {step}: {n} {s:?}");
            } else {
                assert_eq!(
                    (s.compliance.as_str(), s.blocked.as_str()),
                    ("compliant", "not_blocked"),
                    "step {step}: {n} {s:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn versions_taken_in_place_deploy_what_the_model_says() {
    let (_srv, c, env, dir) =
        deploying_env("in-place", json!({"delete_removed_resources": true})).await;
    let mut seq = Sequence::new(dir, 0x31_5eed);
    for step in 0..30 {
        seq.step(&c, &env, step).await;
    }
    assert!(
        seq.as_changes >= 25,
        "most versions went as changes: {}",
        seq.as_changes
    );
    assert!(seq.blocked_seen > 0, "the sequence blocked something");
    assert!(
        seq.ever.len() > seq.world.len() + 5,
        "resources came and went"
    );
}

/// The states a server wrote while it took versions in place are those a server starting
/// on them (its model restored whole from the store) agrees with: after a kill -9 and a
/// start, nothing is deployed again, the states read the same, and the next versions deploy
/// as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_server_agrees_with_the_states_written_in_place() {
    let mut server = Spawned::start("stw_test_admin_secret_in_place_restart").await;
    let c = server.client.clone();
    let env = c
        .create_environment(
            "deploy",
            "restart",
            Some(json!({"delete_removed_resources": true})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    let mut seq = Sequence::new(tempfile::tempdir().unwrap(), 0x45_5eed);
    for step in 0..15 {
        seq.step(&c, &env, step).await;
    }
    assert!(seq.blocked_seen > 0, "the sequence blocked something");
    // what a user sees of each resource, without the times a restart may touch
    let states = |rows: Vec<steward::store::state::ResourceWithState>| -> BTreeMap<String, String> {
        rows.into_iter()
            .map(|r| {
                let seen = format!(
                    "{} {} {} {} {:?} {:?} {:?} {}",
                    r.hash,
                    r.status,
                    r.compliance,
                    r.blocked,
                    r.blocked_reason,
                    r.last_result,
                    r.last_deployed,
                    r.failure_count
                );
                (r.resource_id, seen)
            })
            .collect()
    };
    let before = states(c.resources(&env).await.unwrap().1);
    let actions = c.actions(&env, None, 10_000).await.unwrap().len();
    server.restart().await;
    // the agents' live figures come from the environment's scheduler (started by then)
    eventually(20, "the scheduler to answer", || async {
        c.agents(&env).await.ok().map(|_| ())
    })
    .await;
    // time for anything the restored model believed undone to start
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let agents = c.agents(&env).await.unwrap();
    for a in agents["agents"].as_array().unwrap() {
        assert_eq!(
            (&a["queued"], &a["running"]),
            (&json!(0), &json!(0)),
            "{agents}"
        );
    }
    assert_eq!(
        c.actions(&env, None, 10_000).await.unwrap().len(),
        actions,
        "nothing deployed again after the start"
    );
    assert_eq!(states(c.resources(&env).await.unwrap().1), before);
    // the started scheduler read its resources' attributes after it started (not before):
    // a repair then rewrites every file that drifted with what its attributes say
    let d = seq.dir.path().to_path_buf();
    // (a blocked resource is not deployed: it keeps what it had)
    let drifted: Vec<usize> = seq
        .on_disk
        .keys()
        .copied()
        .filter(|&n| !blocked(&seq.world, n))
        .collect();
    assert!(drifted.len() >= 5, "{drifted:?}");
    for &n in &drifted {
        std::fs::write(path_of(&d, n), "drift\n").unwrap();
    }
    c.trigger(&env, true, None, None).await.unwrap();
    let on_disk = &seq.on_disk;
    eventually(
        30,
        "the repair after the start to restore every file",
        || {
            let ok = drifted
                .iter()
                .all(|&n| std::fs::read_to_string(path_of(&d, n)).ok().as_ref() == on_disk.get(&n));
            async move { ok.then_some(()) }
        },
    )
    .await;
    for step in 15..22 {
        seq.step(&c, &env, step).await;
    }
}

/// The digests a scheduler takes from the manifest the store holds in memory are the rows
/// the database has, for the newest version and (read from the database again) for those
/// the store no longer holds; a number no version has reads the database.
#[tokio::test(flavor = "multi_thread")]
async fn the_digests_from_the_stores_memory_are_the_databases() {
    use steward::store::versions;
    let pool = migrated_pool(2).await;
    let env = environment_in(&pool, "held", "digests", &Default::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x0d16_e575);
    let mut world = World::new();
    let mut next = 0;
    for _ in 0..20 {
        world.insert(next, (format!("c{next}"), BTreeSet::new(), false));
        next += 1;
    }
    let mut numbers = Vec::new();
    for step in 0..6 {
        mutate(&mut world, &mut rng, &mut next, step);
        let export = export(dir.path(), &world);
        let mut c = pool.acquire().await.unwrap();
        let n = versions::store(
            &mut c,
            env,
            versions::NewVersion {
                export: &export,
                uploader: "test",
                origin: "push",
                provenance: json!({}),
                attributes_beside: None,
            },
        )
        .await
        .unwrap()
        .info
        .number;
        numbers.push(n);
        for &v in &numbers {
            let from_db = versions::resource_digests(&pool, env, v).await.unwrap();
            let held = versions::resource_digests_held_or_read(&pool, env, v)
                .await
                .unwrap();
            assert_eq!(held, from_db, "version {v} after storing {n}");
            assert!(!held.is_empty());
        }
    }
    // the newest came from memory: a row changed behind the store's back shows only in
    // what the database reads
    let newest = *numbers.last().unwrap();
    sqlx::query(
        "UPDATE resource_spans SET undefined = NOT undefined WHERE environment_id = $1 \
         AND first_version <= $2 AND last_version >= $2",
    )
    .bind(env)
    .bind(newest)
    .execute(&pool)
    .await
    .unwrap();
    assert_ne!(
        versions::resource_digests_held_or_read(&pool, env, newest)
            .await
            .unwrap(),
        versions::resource_digests(&pool, env, newest)
            .await
            .unwrap()
    );
    assert_eq!(
        versions::resource_digests_held_or_read(&pool, env, 999)
            .await
            .unwrap(),
        versions::resource_digests(&pool, env, 999).await.unwrap()
    );
}
