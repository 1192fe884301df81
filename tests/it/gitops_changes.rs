//! A followed branch's compiles stored as their changes (src/sources/compile/memory.rs): the
//! versions they make are the ones a whole store of the same model makes, and they deploy.

use std::collections::BTreeMap;

use serde_json::json;

use crate::gitops_support::{Repo, compiled, export_here, follow, read, webhook_url};
use crate::support::{Rng, TestServer, wait_deployed};

/// A version's resources by id: (attribute hash, requires, undefined).
async fn held(
    c: &steward::client::Client,
    env: &str,
    n: i32,
) -> BTreeMap<String, (String, Vec<String>, bool)> {
    c.version_resources(env, n)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.resource_id, (r.hash, r.requires, r.undefined)))
        .collect()
}

/// The diff of two versions, without their numbers.
async fn diff(c: &steward::client::Client, env: &str, from: i32, to: i32) -> serde_json::Value {
    let mut d = c.diff(env, from, to).await.unwrap();
    if let Some(o) = d.as_object_mut() {
        o.remove("from");
        o.remove("to");
    }
    d
}

fn store_detail(report: &serde_json::Value) -> String {
    report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "store")
        .map(|s| s["detail"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Random pushes (files added, changed, removed; a requirement made and dropped): from the
/// second compile on, each is stored as its changes, and each version has the content hash,
/// the resources and the diff that the same model stored whole (in another environment)
/// has; its files are deployed. A commit that does not compile in between changes nothing. A
/// version made otherwise (a rollback) moves the base: the next compile is stored whole, and
/// the one after it as changes again.
#[tokio::test(flavor = "multi_thread")]
async fn compiles_are_stored_as_their_changes_and_are_what_a_whole_store_makes() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let whole = c
        .create_environment("whole", "whole", None)
        .await
        .unwrap()
        .id
        .to_string();
    let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
    let mut files: BTreeMap<String, String> = (0..8)
        .map(|i| (format!("f{i}"), format!("v0-{i}")))
        .collect();
    let mut next = 8;
    let mut chained = false;
    let mut env: Option<String> = None;
    let mut last: Option<(i32, i32)> = None;
    for step in 0..14 {
        if step > 0 {
            for _ in 0..=rng.below(3) {
                let names: Vec<String> = files.keys().cloned().collect();
                let pick = names[rng.below(names.len())].clone();
                match rng.below(4) {
                    0 if files.len() > 2 => {
                        files.remove(&pick);
                    }
                    1 => {
                        files.insert(format!("f{next}"), format!("new-{next}"));
                        next += 1;
                    }
                    2 => chained = !chained,
                    _ => {
                        files.insert(pick, format!("v{step}"));
                    }
                }
            }
        }
        // a chain: the second file requires the first
        let extra = if chained {
            format!(
                "x = fs::File(host=host, path=\"{out}/x\", content=\"x{step}\", mode=644)\n\
                 fs::File(host=host, path=\"{out}/y\", content=\"y\", mode=644, requires=[x])\n",
                out = repo.out.display()
            )
        } else {
            String::new()
        };
        let list: Vec<(&str, &str)> = files
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if step == 6
            && let Some(env) = &env
        {
            // a commit that does not compile: the next one is still stored as its changes
            let broken = repo.commit(&repo.model(&list, "x = \n"), "broken");
            repo.push_ok();
            let report = compiled(&c, env, &broken, 30).await;
            assert_eq!(report["status"], "failed", "{report:#}");
        }
        let commit = repo.commit(&repo.model(&list, &extra), &format!("step {step}"));
        let env = match &env {
            Some(e) => {
                repo.push_ok();
                e
            }
            None => {
                let e = follow(&c, "changes", &repo, json!({})).await;
                repo.install_post_receive(&webhook_url(&srv.url, &e), "s3cret");
                repo.push_ok();
                env.insert(e)
            }
        };
        let report = compiled(&c, env, &commit, 30).await;
        assert_eq!(report["status"], "success", "{report:#}");
        let detail = store_detail(&report);
        let expected = if step == 0 {
            "stored whole"
        } else {
            "stored as its changes"
        };
        assert!(detail.contains(expected), "step {step}: {detail}");
        let v = report["version"].as_i64().unwrap() as i32;

        // the same model stored whole
        let w = c
            .upload(&whole, &export_here(&repo), json!({}))
            .await
            .unwrap()["number"]
            .as_i64()
            .unwrap() as i32;
        let (gv, wv) = (
            c.version(env, v).await.unwrap(),
            c.version(&whole, w).await.unwrap(),
        );
        assert_eq!(gv["content_hash"], wv["content_hash"], "step {step}");
        assert_eq!(gv["resource_count"], wv["resource_count"]);
        assert_eq!(
            held(&c, env, v).await,
            held(&c, &whole, w).await,
            "step {step}"
        );
        if let Some((pv, pw)) = last {
            assert_eq!(
                diff(&c, env, pv, v).await,
                diff(&c, &whole, pw, w).await,
                "step {step}"
            );
        }
        last = Some((v, w));
        wait_deployed(&c, env, v, 30).await;
        for (name, content) in &files {
            assert_eq!(
                read(&repo.out.join(name)).as_deref(),
                Some(content.as_str()),
                "step {step}: {name}"
            );
        }
    }

    // a rollback is a version the memory does not know: the next compile is stored whole
    let env = env.unwrap();
    let (v, _) = last.unwrap();
    c.rollback(&env, v - 1, "back").await.unwrap();
    for (step, expected) in [(100, "stored whole"), (101, "stored as its changes")] {
        files.insert("f0".into(), format!("v{step}"));
        let list: Vec<(&str, &str)> = files
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let commit = repo.commit(&repo.model(&list, ""), &format!("step {step}"));
        repo.push_ok();
        let report = compiled(&c, &env, &commit, 30).await;
        assert_eq!(report["status"], "success", "{report:#}");
        let detail = store_detail(&report);
        assert!(detail.contains(expected), "step {step}: {detail}");
        let v = report["version"].as_i64().unwrap() as i32;
        let w = c
            .upload(&whole, &export_here(&repo), json!({}))
            .await
            .unwrap()["number"]
            .as_i64()
            .unwrap() as i32;
        assert_eq!(
            c.version(&env, v).await.unwrap()["content_hash"],
            c.version(&whole, w).await.unwrap()["content_hash"]
        );
        // after a rollback, automatic release is held until a version is released by hand
        if c.version(&env, v).await.unwrap()["status"] == "new" {
            c.release(&env, v, "after the rollback").await.unwrap();
        }
        wait_deployed(&c, &env, v, 30).await;
        assert_eq!(
            read(&repo.out.join("f0")).as_deref(),
            Some(format!("v{step}").as_str())
        );
    }
}
