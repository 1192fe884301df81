//! Attributes this process has just stored, handed to the scheduler that is about to read
//! them back.
//!
//! A released version's scheduler reads the attributes of every new resource by hash
//! (`resource_blobs`): at 100,000 resources that read and its JSON took 0.6-0.7 s of a first
//! deploy, right after the upload had the same attributes in memory. The upload hands them
//! over here instead (moved, not copied) and the scheduler takes them out. Attributes are
//! content-addressed (the hash covers them and the resource id), so an entry is never
//! stale: whatever is not here is read from the database as before, and nothing depends on
//! an entry being here. Entries nobody takes (the environment's scheduler runs on another
//! replica, or the version is not released) go after [`KEEP`]; the whole is bounded by
//! [`MAX_HELD`] resources.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::model::Resource;

pub type AttributeMap = serde_json::Map<String, serde_json::Value>;

/// How long handed-over attributes wait for their scheduler.
const KEEP: Duration = Duration::from_secs(10);
/// At most this many resources' attributes are held at once (a first version of 100,000
/// resources fits; more is read from the database).
const MAX_HELD: usize = 250_000;

struct Handed {
    at: Instant,
    attributes: HashMap<String, AttributeMap>,
}

static HELD: Mutex<VecDeque<Handed>> = Mutex::new(VecDeque::new());

fn held() -> std::sync::MutexGuard<'static, VecDeque<Handed>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hand over the attributes of `resources` whose hashes `stored` gives (index into
/// `resources`, content hash), moving them out of `resources`.
pub fn hand_over(resources: &mut [Resource], stored: Vec<(usize, String)>) {
    if stored.is_empty() || stored.len() > MAX_HELD {
        return;
    }
    let attributes: HashMap<String, AttributeMap> = stored
        .into_iter()
        .filter_map(|(i, hash)| {
            resources
                .get_mut(i)
                .map(|r| (hash, std::mem::take(&mut r.attributes)))
        })
        .collect();
    {
        let mut h = held();
        expire(&mut h);
        while h.iter().map(|x| x.attributes.len()).sum::<usize>() + attributes.len() > MAX_HELD {
            h.pop_front();
        }
        h.push_back(Handed {
            at: Instant::now(),
            attributes,
        });
    }
    // nobody may ask again: drop them when they are due, not at the next hand-over
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(async {
            tokio::time::sleep(KEEP + Duration::from_millis(100)).await;
            expire(&mut held());
        });
    }
}

/// Take out the attributes of those of `hashes` that were handed over; the hashes not
/// found are left in `hashes`.
pub fn take(hashes: &mut Vec<String>) -> HashMap<String, AttributeMap> {
    let mut found = HashMap::new();
    let mut h = held();
    expire(&mut h);
    if h.is_empty() {
        return found;
    }
    hashes.retain(|hash| {
        for handed in h.iter_mut() {
            if let Some(a) = handed.attributes.remove(hash) {
                found.insert(hash.clone(), a);
                return false;
            }
        }
        true
    });
    h.retain(|x| !x.attributes.is_empty());
    found
}

fn expire(h: &mut VecDeque<Handed>) {
    while h.front().is_some_and(|x| x.at.elapsed() >= KEEP) {
        h.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ResourceId;

    fn resource(n: usize) -> Resource {
        let id = ResourceId::new("t", "a", "n", &n.to_string());
        Resource {
            attributes: serde_json::json!({"n": n}).as_object().unwrap().clone(),
            id,
            type_name: "t".into(),
            agent: "a".into(),
            requires: vec![],
        }
    }

    #[test]
    fn handed_over_attributes_are_taken_once_and_the_rest_is_left_to_read() {
        let mut resources: Vec<Resource> = (0..3).map(resource).collect();
        let hashes: Vec<String> = resources.iter().map(Resource::hash).collect();
        hand_over(
            &mut resources,
            vec![(0, hashes[0].clone()), (2, hashes[2].clone())],
        );
        assert!(resources[0].attributes.is_empty(), "moved, not copied");
        assert_eq!(resources[1].attributes["n"], 1);
        let mut wanted = vec![hashes[0].clone(), hashes[1].clone(), "other".to_string()];
        let got = take(&mut wanted);
        assert_eq!(got.len(), 1);
        assert_eq!(got[&hashes[0]]["n"], 0);
        assert_eq!(wanted, vec![hashes[1].clone(), "other".to_string()]);
        // taken: a second ask reads from the database
        let mut again = vec![hashes[0].clone()];
        assert!(take(&mut again).is_empty());
        assert_eq!(again.len(), 1);
        let mut last = vec![hashes[2].clone()];
        assert_eq!(take(&mut last)[&hashes[2]]["n"], 2);
    }
}
