//! The in-place path against the whole merge: random versions that add, replace and remove
//! resources (with requires on absent ids, edges to themselves, undefined flags and agents
//! that come and go), and between them deploys that succeed, fail or are skipped.

use std::collections::{BTreeMap, BTreeSet};

use chrono::Utc;
use serde_json::Value;

use crate::executor::protocol::{Change, Outcome};
use crate::scheduler::model::{Attrs, Blocked, Intent, Merged, Model};

fn intent(id: &str, hash: &str, requires: &[&str], undefined: bool, agent: &str) -> Intent {
    let mut attributes = Attrs::new();
    attributes.insert("send_event".into(), Value::Bool(true));
    Intent {
        id: id.into(),
        type_name: "t".into(),
        agent: agent.into(),
        hash: hash.into(),
        attributes: attributes.into(),
        requires: requires.iter().map(|s| s.to_string()).collect(),
        undefined,
    }
}

/// A small deterministic generator (xorshift64*): the test must replay the same sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// The model as seen from outside, by id: intents, states, dirty set, edges, agents.
fn picture(m: &Model) -> impl PartialEq + std::fmt::Debug {
    let ids = |list: &[usize]| -> Vec<String> {
        let mut v: Vec<String> = list.iter().map(|&q| m.intents[q].id.clone()).collect();
        v.sort();
        v
    };
    let by_id: BTreeMap<String, _> = (0..m.len())
        .map(|r| {
            let i = &m.intents[r];
            (
                i.id.clone(),
                (
                    i.hash.clone(),
                    i.requires.clone(),
                    i.undefined,
                    i.agent.clone(),
                    m.states[r].clone(),
                    m.dirty.contains(&r),
                    ids(&m.requires[r]),
                    ids(&m.provides[r]),
                ),
            )
        })
        .collect();
    (by_id, m.agents.clone(), m.version)
}

/// What a merge reported, by id.
fn report(m: &Model, merged: &Merged) -> Vec<BTreeSet<String>> {
    let ids = |list: &[usize]| list.iter().map(|&r| m.intents[r].id.clone()).collect();
    vec![
        ids(&merged.new),
        ids(&merged.updated),
        ids(&merged.newly_blocked),
        ids(&merged.unblocked),
        merged.deleted.iter().map(|i| i.id.clone()).collect(),
    ]
}

/// The model's own bookkeeping is consistent: the index points at each intent, every
/// requirement is an edge or a wait, and nothing else is.
fn check_bookkeeping(m: &Model) {
    assert_eq!(m.index.len(), m.len());
    let mut waits = 0;
    for r in 0..m.len() {
        assert_eq!(m.index.get(&m.intents, &m.intents[r].id), Some(r));
        let mut resolved = Vec::new();
        for id in &m.intents[r].requires {
            match m.index.get(&m.intents, id) {
                Some(q) => resolved.push(q),
                None => {
                    assert!(
                        m.dangling[id].contains(&r),
                        "{} waits for {id}",
                        m.intents[r].id
                    );
                    waits += 1;
                }
            }
        }
        let (mut a, mut b) = (m.requires[r].clone(), resolved);
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "edges of {}", m.intents[r].id);
        for &q in &m.requires[r] {
            assert!(m.provides[q].contains(&r));
        }
    }
    assert_eq!(m.dangling.values().map(Vec::len).sum::<usize>(), waits);
    assert!(
        m.dangling
            .keys()
            .all(|id| !m.index.contains(&m.intents, id))
    );
    assert!(m.dirty.iter().all(|&r| r < m.len()));
}

/// Deploy outcomes on both models, by id, so that states differ between resources.
fn finish_some(rng: &mut Rng, models: [&mut Model; 2], ids: &[String]) {
    let now = Utc::now();
    let runs: Vec<(String, Outcome)> = (0..rng.below(4))
        .map(|_| {
            let outcome = match rng.below(4) {
                0 => Outcome::Failed,
                1 => Outcome::SkippedForDependency,
                _ => Outcome::Deployed,
            };
            (ids[rng.below(ids.len())].clone(), outcome)
        })
        .collect();
    for m in models {
        for (id, outcome) in &runs {
            // the scheduler never runs a resource blocked by unknown values
            if let Some(r) = m
                .get(id)
                .filter(|&r| m.states[r].blocked != Blocked::Blocked)
            {
                m.finish(r, *outcome, Change::Updated, None, now, now);
            }
        }
    }
}

/// Over random versions, taking the changes in place gives what merging the whole version
/// gives.
#[test]
fn in_place_is_a_whole_merge() {
    let pool: Vec<String> = (0..14).map(|n| format!("r{n}")).collect();
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (mut full, mut fast) = (Model::default(), Model::default());
        let mut whole: BTreeMap<String, Intent> = BTreeMap::new();
        let mut counter = 0u32;
        for step in 0..60 {
            let version = step + 1;
            let mut upserts = Vec::new();
            let mut removed = Vec::new();
            for id in &pool {
                // held: removed 12 %, replaced 18 %; absent: added 30 %
                let roll = rng.below(100);
                match whole.get(id) {
                    Some(_) if roll < 12 => {
                        removed.push(id.clone());
                        continue;
                    }
                    _ if roll >= 30 => continue,
                    _ => {}
                }
                let held = whole.get(id);
                // added, or replaced: a new hash, maybe new requires, flag or agent
                counter += 1;
                let requires: Vec<&str> = (0..rng.below(3))
                    .map(|_| pool[rng.below(pool.len())].as_str())
                    .collect();
                let requires = match held {
                    Some(h) if rng.chance(50) => h.requires.iter().map(String::as_str).collect(),
                    _ => requires,
                };
                let agent = if rng.chance(20) { "b" } else { "a" };
                // sometimes the same hash: only requires, flag or agent changed
                let hash = match held {
                    Some(h) if rng.chance(20) => h.hash.clone(),
                    _ => counter.to_string(),
                };
                upserts.push(intent(id, &hash, &requires, rng.chance(15), agent));
            }
            for id in &removed {
                whole.remove(id);
            }
            for i in &upserts {
                whole.insert(i.id.clone(), i.clone());
            }
            let a = full.merge(version, whole.values().cloned().collect());
            let b = fast
                .apply_in_place(version, upserts, removed)
                .expect("changes made against this model");
            assert_eq!(
                report(&full, &a),
                report(&fast, &b),
                "seed {seed} step {step}"
            );
            assert_eq!(picture(&full), picture(&fast), "seed {seed} step {step}");
            check_bookkeeping(&fast);
            if b.blocking_unchanged {
                // a skipped walk must not have been needed
                let mut walked = fast.clone();
                let (newly, freed) = walked.recompute_blocked();
                assert!(
                    newly.is_empty() && freed.is_empty(),
                    "seed {seed} step {step}"
                );
            }
            finish_some(&mut rng, [&mut full, &mut fast], &pool);
        }
    }
}

/// Changes not made against this model are refused, and the model is left as it was.
#[test]
fn changes_against_another_model_are_refused() {
    let mut m = Model::default();
    m.merge(
        1,
        vec![
            intent("a", "1", &[], false, "x"),
            intent("b", "1", &["a"], false, "x"),
        ],
    );
    let before = format!("{:?}", picture(&m));
    assert!(m.apply_in_place(2, vec![], vec!["gone".into()]).is_none());
    assert!(
        m.apply_in_place(2, vec![intent("a", "2", &[], false, "x")], vec!["a".into()])
            .is_none()
    );
    assert!(
        m.apply_in_place(
            2,
            vec![
                intent("c", "1", &[], false, "x"),
                intent("c", "2", &[], false, "x")
            ],
            vec![]
        )
        .is_none()
    );
    assert_eq!(format!("{:?}", picture(&m)), before);
}

/// Removing the undefined resource others were blocked by frees them; adding it back
/// blocks them again, through the edge made from the wait.
#[test]
fn removal_and_return_of_a_blocker() {
    let mut m = Model::default();
    m.merge(
        1,
        vec![
            intent("u", "1", &[], true, "x"),
            intent("d", "1", &["u"], false, "x"),
            intent("e", "1", &["d"], false, "y"),
        ],
    );
    assert_eq!(m.states[m.get("e").unwrap()].blocked, Blocked::Blocked);
    let merged = m.apply_in_place(2, vec![], vec!["u".into()]).unwrap();
    assert!(!merged.blocking_unchanged);
    let (d2, e2) = (m.get("d").unwrap(), m.get("e").unwrap());
    assert_eq!(
        (m.states[d2].blocked, m.states[e2].blocked),
        (Blocked::NotBlocked, Blocked::NotBlocked)
    );
    assert!(m.dirty.contains(&d2) && m.dirty.contains(&e2));
    assert_eq!(m.dangling["u"], vec![d2]);
    let merged = m
        .apply_in_place(3, vec![intent("u", "2", &[], true, "z")], vec![])
        .unwrap();
    let u = m.get("u").unwrap();
    assert_eq!(merged.new, vec![u]);
    assert_eq!(m.requires[m.get("d").unwrap()], vec![u]);
    assert!(m.states.iter().all(|s| s.blocked == Blocked::Blocked));
    assert!(m.dirty.is_empty());
    assert_eq!(m.agents.keys().collect::<Vec<_>>(), ["x", "y", "z"]);
    check_bookkeeping(&m);
    // the last intent of an agent takes the agent with it
    m.apply_in_place(4, vec![], vec!["e".into()]).unwrap();
    assert_eq!(m.agents.keys().collect::<Vec<_>>(), ["x", "z"]);
    check_bookkeeping(&m);
}
