//! `delete_removed_resources` when a removal meets work on the same resource: a resource
//! removed while its deploy runs is still deleted, and one that comes back while its delete
//! waits or runs ends deployed, its state stored as such. One agent, whose executor works on
//! a slow command and is handed the next action to start after it: the action that waits
//! behind the command is in flight without having started.

use std::path::Path;

use serde_json::json;
use steward::client::Client;
use steward::model::Resource;

use crate::deploy::{deploy_actions, deploying_env, state_of, upload};
use crate::support::{eventually, exec_run, fs_file, wait_deployed};

const AGENT: &str = "localhost";

async fn wait_for_file(path: &str, what: &str) {
    eventually(20, what, || async {
        Path::new(path).exists().then_some(())
    })
    .await;
}

/// The actions of `rid` in the log with this `action` word.
async fn actions_named(c: &Client, env: &str, rid: &str, action: &str) -> usize {
    deploy_actions(c, env, rid)
        .await
        .iter()
        .filter(|a| a.action == action)
        .count()
}

/// An environment that deletes what its versions remove, a file that stays in every version,
/// and a command that runs `secs` seconds (it touches `started` first and `done` last).
async fn with_a_slow_command(
    name: &str,
    secs: u32,
) -> (
    crate::support::TestServer,
    Client,
    String,
    tempfile::TempDir,
    Resource,
    Resource,
) {
    let (srv, c, env, dir) = deploying_env(name, json!({"delete_removed_resources": true})).await;
    let d = dir.path().display().to_string();
    let keep = fs_file(AGENT, &format!("{d}/keep"), "k", &[]);
    let slow = exec_run(
        AGENT,
        &format!("sh -c 'touch {d}/started; sleep {secs}; touch {d}/done'"),
        json!({}),
        &[],
    );
    (srv, c, env, dir, keep, slow)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_removed_while_it_deploys_is_deleted_when_the_deploy_ends() {
    let (_srv, c, env, dir, keep, slow) = with_a_slow_command("removed-running", 3).await;
    let d = dir.path().display().to_string();
    let rid = slow.id.0.clone();
    let v1 = upload(&c, &env, vec![keep.clone(), slow]).await;
    wait_for_file(&format!("{d}/started"), "the slow command to start").await;
    let v2 = upload(&c, &env, vec![keep]).await;
    assert!(
        !Path::new(&format!("{d}/done")).exists(),
        "the test's premise: the command still runs when its removal is released"
    );
    wait_deployed(&c, &env, v2, 30).await;
    assert!(v2 > v1);
    // the delete waited for the deploy, then ran
    eventually(20, "the removed resource's delete", || async {
        (actions_named(&c, &env, &rid, "delete").await == 1).then_some(())
    })
    .await;
    assert!(Path::new(&format!("{d}/done")).exists());
    let deletes: Vec<_> = deploy_actions(&c, &env, &rid)
        .await
        .into_iter()
        .filter(|a| a.action == "delete")
        .collect();
    assert_eq!(deletes[0].status, "deployed", "{deletes:?}");
    assert!(
        deletes[0].version == v2,
        "the delete is of the version that removed it: {deletes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_back_before_its_delete_ran_is_deployed_and_stored_as_deployed() {
    let (_srv, c, env, dir, keep, slow) = with_a_slow_command("back-early", 4).await;
    let d = dir.path().display().to_string();
    // more than an executor is handed at once (LOCAL_DEPTH): some deletes wait in it,
    // others in the scheduler's queue
    let files: Vec<_> = (1..=6)
        .map(|i| fs_file(AGENT, &format!("{d}/f{i}"), &format!("content {i}"), &[]))
        .collect();
    let with = |extra: &[Resource]| {
        let mut all = vec![keep.clone()];
        all.extend(extra.iter().cloned());
        all
    };
    let v1 = upload(&c, &env, with(&files)).await;
    wait_deployed(&c, &env, v1, 30).await;
    // the slow command runs; the files' deletes queue behind it, one of them handed to the
    // executor to start next
    let mut and_slow = files.clone();
    and_slow.push(slow.clone());
    upload(&c, &env, with(&and_slow)).await;
    wait_for_file(&format!("{d}/started"), "the slow command to start").await;
    upload(&c, &env, with(std::slice::from_ref(&slow))).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // back, as they were
    let v4 = upload(&c, &env, with(&and_slow)).await;
    assert!(
        !Path::new(&format!("{d}/done")).exists(),
        "the test's premise: the deletes still wait when the files come back"
    );
    for i in 1..=6 {
        assert!(
            Path::new(&format!("{d}/f{i}")).exists(),
            "the test's premise: f{i} is not deleted before the command ends"
        );
    }
    let p = wait_deployed(&c, &env, v4, 30).await;
    assert_eq!(p["by_status"]["deployed"], 8, "{p}");
    for (i, f) in files.iter().enumerate() {
        let path = format!("{d}/f{}", i + 1);
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some(format!("content {}", i + 1).as_str()),
            "{path} is deployed again"
        );
        let s = state_of(&c, &env, &f.id.0).await;
        assert_eq!(
            (s.status.as_str(), s.compliance.as_str()),
            ("deployed", "compliant"),
            "{s:?}"
        );
    }
    // a delete that had been handed to the executor ran, and its file was made again after
    // it; one still queued was not run at all
    let mut deleted = 0;
    for f in &files {
        let log = deploy_actions(&c, &env, &f.id.0).await;
        let deletes = log.iter().filter(|a| a.action == "delete").count();
        assert!(deletes <= 1, "{log:?}");
        if deletes == 1 {
            // newest first: the file made again after the delete
            assert_eq!(
                (log[0].action.as_str(), log[0].change.as_str()),
                ("deploy", "created"),
                "{log:?}"
            );
            assert_eq!(log[1].action, "delete", "{log:?}");
            assert_eq!(log[0].version, v4, "{log:?}");
        }
        deleted += deletes;
    }
    assert!(
        (1..files.len()).contains(&deleted),
        "the test's premise: some deletes were in flight, some queued ({deleted} ran)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resource_removed_and_back_while_it_deploys_is_never_deleted() {
    let (_srv, c, env, dir, keep, slow) = with_a_slow_command("back-running", 3).await;
    let d = dir.path().display().to_string();
    let rid = slow.id.0.clone();
    upload(&c, &env, vec![keep.clone(), slow.clone()]).await;
    wait_for_file(&format!("{d}/started"), "the slow command to start").await;
    upload(&c, &env, vec![keep.clone()]).await;
    let v3 = upload(&c, &env, vec![keep, slow]).await;
    assert!(
        !Path::new(&format!("{d}/done")).exists(),
        "the test's premise: the command still runs when it is removed and back"
    );
    let p = wait_deployed(&c, &env, v3, 30).await;
    assert_eq!(p["by_status"]["deployed"], 2, "{p}");
    assert_eq!(actions_named(&c, &env, &rid, "delete").await, 0);
    let s = state_of(&c, &env, &rid).await;
    assert_eq!(s.status, "deployed", "{s:?}");
    // nothing more comes after: no delete queued behind the deploy that followed
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(actions_named(&c, &env, &rid, "delete").await, 0);
}
