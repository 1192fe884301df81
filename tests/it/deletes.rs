//! `delete_removed_resources` when a removal meets work on the same resource: a resource
//! removed while its deploy runs is still deleted, and one that comes back while its delete
//! waits or runs ends deployed, its state stored as such. A decided delete survives a kill
//! of the server, a failed one is retried on the backoff, and the version it needs is kept. One agent, whose executor works on
//! a slow command and is handed the next action to start after it: the action that waits
//! behind the command is in flight without having started.

use std::path::Path;

use serde_json::json;
use steward::client::Client;
use steward::model::Resource;

use crate::deploy::{deploy_actions, deploying_env, state_of, upload};
use crate::support::{Spawned, eventually, exec_run, fs_file, kill9, wait_deployed};

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

/// An environment that deletes what its versions remove (with `more` settings), a file
/// that stays in every version, and a command that runs `secs` seconds (it touches
/// `started` first and `done` last).
async fn with_a_slow_command(
    name: &str,
    secs: u32,
    more: serde_json::Value,
) -> (
    crate::support::TestServer,
    Client,
    String,
    tempfile::TempDir,
    Resource,
    Resource,
) {
    let mut settings = json!({"delete_removed_resources": true});
    if let (Some(all), Some(more)) = (settings.as_object_mut(), more.as_object()) {
        all.extend(more.clone());
    }
    let (srv, c, env, dir) = deploying_env(name, settings).await;
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
    let (_srv, c, env, dir, keep, slow) =
        with_a_slow_command("removed-running", 3, json!({})).await;
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
    let (_srv, c, env, dir, keep, slow) = with_a_slow_command("back-early", 4, json!({})).await;
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
    let (_srv, c, env, dir, keep, slow) = with_a_slow_command("back-running", 3, json!({})).await;
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

/// A removed resource's state row: (orphaned after, delete pending); None without a row.
async fn delete_mark(pool: &sqlx::PgPool, env: &str, rid: &str) -> Option<(Option<i32>, bool)> {
    sqlx::query_as(
        "SELECT orphaned_after, delete_pending FROM resource_state \
         WHERE environment_id = $1::uuid AND resource_id = $2",
    )
    .bind(env)
    .bind(rid)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn wait_processed(pool: &sqlx::PgPool, env: &str, version: i32) {
    let env_id: uuid::Uuid = env.parse().unwrap();
    eventually(30, &format!("version {version} merged"), || async {
        let p = steward::store::deploy::load_progress(pool, env_id)
            .await
            .unwrap();
        (p >= Some(version)).then_some(())
    })
    .await;
}

/// The attack on durability the in-memory tombstones lost to: a delete is decided (the
/// version that removes two files is merged) but can not run yet (its agent is paused), and
/// the server is killed with -9. The next server must delete the file that is still gone
/// from the model, with the intent of the version it was last in, and must not delete the
/// one that came back meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_decided_before_a_kill_is_made_by_the_next_server() {
    let mut server = Spawned::start("stw_test_admin_secret_deletes_kill").await;
    let pool = steward::store::connect(&server.db, 2).await.unwrap();
    let c = server.client.clone();
    let env = c
        .create_environment(
            "deletes",
            "killed",
            Some(json!({"delete_removed_resources": true})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let keep = fs_file(AGENT, &format!("{d}/keep"), "k", &[]);
    let gone = fs_file(AGENT, &format!("{d}/gone"), "g", &[]);
    let back = |content: &str| fs_file(AGENT, &format!("{d}/back"), content, &[]);
    let v1 = upload(&c, &env, vec![keep.clone(), gone.clone(), back("b")]).await;
    wait_deployed(&c, &env, v1, 30).await;
    assert!(Path::new(&format!("{d}/gone")).exists());

    c.set_paused(&env, AGENT, true).await.unwrap();
    let v2 = upload(&c, &env, vec![keep.clone()]).await;
    wait_processed(&pool, &env, v2).await;
    for rid in [&gone.id.0, &back("b").id.0] {
        eventually(20, "the delete's mark stored", || async {
            (delete_mark(&pool, &env, rid).await == Some((Some(v1), true))).then_some(())
        })
        .await;
    }
    assert!(
        Path::new(&format!("{d}/gone")).exists() && Path::new(&format!("{d}/back")).exists(),
        "the test's premise: the paused agent deleted nothing before the kill"
    );

    server.restart().await;

    // still paused: `back` returns with a new content before anything could run
    let v3 = upload(&c, &env, vec![keep.clone(), back("b again")]).await;
    wait_processed(&pool, &env, v3).await;
    c.set_paused(&env, AGENT, false).await.unwrap();
    wait_deployed(&c, &env, v3, 30).await;
    eventually(20, "the removed file deleted by the new server", || async {
        (!Path::new(&format!("{d}/gone")).exists()).then_some(())
    })
    .await;
    let log = deploy_actions(&c, &env, &gone.id.0).await;
    let deletes: Vec<_> = log.iter().filter(|a| a.action == "delete").collect();
    assert_eq!(deletes.len(), 1, "{log:?}");
    assert_eq!(deletes[0].status, "deployed", "{log:?}");
    eventually(20, "the mark says the delete ran", || async {
        (delete_mark(&pool, &env, &gone.id.0).await == Some((Some(v1), false))).then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(format!("{d}/back")).unwrap(),
        "b again"
    );
    assert_eq!(actions_named(&c, &env, &back("b").id.0, "delete").await, 0);
    assert_eq!(
        delete_mark(&pool, &env, &back("b").id.0).await.map(|m| m.0),
        Some(None),
        "back in the model: not an orphan"
    );
    assert!(Path::new(&format!("{d}/keep")).exists());
}

/// A delete that fails is retried on the environment's backoff (1 s, doubling, at most 4 s),
/// for 20 s: as many attempts as that schedule allows and one action record each, the
/// mark pending all along; once the obstacle is gone the next attempt deletes it, and
/// nothing more is tried.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_delete_is_retried_on_its_backoff_until_it_succeeds() {
    let (srv, c, env, dir) = deploying_env(
        "delete-retried",
        json!({
            "delete_removed_resources": true,
            "retry_backoff": {"initial": 1, "factor": 2.0, "max": 4},
        }),
    )
    .await;
    let d = dir.path().display().to_string();
    let keep = fs_file(AGENT, &format!("{d}/keep"), "k", &[]);
    let path = format!("{d}/stuck");
    let stuck = fs_file(AGENT, &path, "s", &[]);
    let rid = stuck.id.0.clone();
    let v1 = upload(&c, &env, vec![keep.clone(), stuck]).await;
    wait_deployed(&c, &env, v1, 30).await;
    // what its handler can not delete: a directory where the file was
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    std::fs::write(format!("{path}/inside"), "x").unwrap();

    let v2 = upload(&c, &env, vec![keep]).await;
    wait_deployed(&c, &env, v2, 30).await;
    eventually(10, "the first delete failed", || async {
        (actions_named(&c, &env, &rid, "delete").await >= 1).then_some(())
    })
    .await;
    let first = std::time::Instant::now();
    let window = std::time::Duration::from_secs(20);
    tokio::time::sleep(window).await;
    let log = deploy_actions(&c, &env, &rid).await;
    let deletes: Vec<_> = log.iter().filter(|a| a.action == "delete").collect();
    // attempts at 0, then 1, 2, 4, 4, 4 … s apart, each up to 10 % earlier (jitter): 0,
    // 0.9-1, 2.7-3, 6.3-7, 9.9-11, 13.5-15, 17.1-19 s; the next at 20.7 s at the earliest
    assert!(
        (6..=8).contains(&deletes.len()),
        "{} deletes in {:?} (the schedule allows 7): {deletes:#?}",
        deletes.len(),
        first.elapsed()
    );
    assert!(deletes.iter().all(|a| a.status == "failed"), "{deletes:#?}");
    assert!(
        deletes.iter().all(|a| a.version == v2),
        "every attempt is of the version that removed it: {deletes:#?}"
    );
    // the gaps grow, then stay at the cap
    let mut starts: Vec<_> = deletes.iter().map(|a| a.started_at).collect();
    starts.sort();
    let gaps: Vec<f64> = starts
        .windows(2)
        .map(|w| (w[1] - w[0]).num_milliseconds() as f64 / 1e3)
        .collect();
    for (i, g) in gaps.iter().enumerate() {
        let want = [1.0, 2.0, 4.0][i.min(2)];
        assert!(
            *g >= want * 0.9 - 0.05 && *g <= want + 1.0,
            "gap {i} is {g:.2} s, the schedule says {want} s: {gaps:?}"
        );
    }
    assert_eq!(
        delete_mark(&srv.pool, &env, &rid).await,
        Some((Some(v1), true)),
        "the mark stays pending while the delete fails"
    );
    let rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM resource_state WHERE environment_id = $1::uuid AND resource_id = $2",
    )
    .bind(&env)
    .bind(&rid)
    .fetch_one(&srv.pool)
    .await
    .unwrap();
    assert_eq!(rows, 1);

    // the obstacle goes: the next retry finds nothing to delete, and that is the end of it
    std::fs::remove_dir_all(&path).unwrap();
    eventually(10, "a delete that succeeds", || async {
        let log = deploy_actions(&c, &env, &rid).await;
        log.iter()
            .any(|a| a.action == "delete" && a.status == "deployed")
            .then_some(())
    })
    .await;
    eventually(10, "the mark says the delete ran", || async {
        (delete_mark(&srv.pool, &env, &rid).await == Some((Some(v1), false))).then_some(())
    })
    .await;
    let n = actions_named(&c, &env, &rid, "delete").await;
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(
        actions_named(&c, &env, &rid, "delete").await,
        n,
        "no attempt after the delete succeeded"
    );
    assert!(!Path::new(&path).exists());
}

/// The version a pending delete takes its intent from outlives version retention and can
/// not be deleted through the API until the delete ran.
#[tokio::test(flavor = "multi_thread")]
async fn the_version_a_pending_delete_needs_is_kept() {
    let (srv, c, env, dir) = deploying_env(
        "delete-keeps-version",
        json!({"delete_removed_resources": true, "version_retention": 2}),
    )
    .await;
    let d = dir.path().display().to_string();
    let keep = |n: usize| fs_file(AGENT, &format!("{d}/keep"), &format!("k{n}"), &[]);
    let gone = fs_file(AGENT, &format!("{d}/gone"), "g", &[]);
    let v1 = upload(&c, &env, vec![keep(1), gone.clone()]).await;
    wait_deployed(&c, &env, v1, 30).await;
    c.set_paused(&env, AGENT, true).await.unwrap();
    let v2 = upload(&c, &env, vec![keep(2)]).await;
    wait_processed(&srv.pool, &env, v2).await;
    eventually(20, "the delete's mark stored", || async {
        (delete_mark(&srv.pool, &env, &gone.id.0).await == Some((Some(v1), true))).then_some(())
    })
    .await;
    let mut last = v2;
    for n in 3..=5 {
        last = upload(&c, &env, vec![keep(n)]).await;
    }
    let numbers: Vec<i64> = c
        .versions(&env)
        .await
        .unwrap()
        .iter()
        .map(|v| v["number"].as_i64().unwrap())
        .collect();
    assert!(
        numbers.contains(&(v1 as i64)) && !numbers.contains(&(v2 as i64)),
        "retention keeps the newest two and the one the delete needs: {numbers:?}"
    );
    let refused = c.delete_version(&env, v1).await.unwrap_err().to_string();
    assert!(
        refused.contains("409") || refused.contains("still to be deleted"),
        "{refused}"
    );

    c.set_paused(&env, AGENT, false).await.unwrap();
    wait_deployed(&c, &env, last, 30).await;
    eventually(20, "the delete ran", || async {
        (delete_mark(&srv.pool, &env, &gone.id.0).await == Some((Some(v1), false))).then_some(())
    })
    .await;
    assert!(!Path::new(&format!("{d}/gone")).exists());
    c.delete_version(&env, v1).await.unwrap();
}

/// Deletes handed to an executor behind a slow command, for files that came back into the
/// model meanwhile, and the executor dies before it started them: they are not needed any
/// more, and none may run (before, each ran as a "delete" of the file's intent, and the
/// file was deployed again after it).
#[tokio::test(flavor = "multi_thread")]
async fn deletes_an_executor_died_holding_are_dropped_for_resources_back_in_the_model() {
    let (_srv, c, env, dir, keep, slow) = with_a_slow_command(
        "back-executor-died",
        6,
        json!({"retry_backoff": {"initial": 1, "factor": 1.0, "max": 1}}),
    )
    .await;
    let d = dir.path().display().to_string();
    let files: Vec<_> = (1..=3)
        .map(|i| fs_file(AGENT, &format!("{d}/f{i}"), &format!("content {i}"), &[]))
        .collect();
    let with = |extra: &[Resource]| {
        let mut all = vec![keep.clone()];
        all.extend(extra.iter().cloned());
        all
    };
    let v1 = upload(&c, &env, with(&files)).await;
    wait_deployed(&c, &env, v1, 30).await;
    let mut and_slow = files.clone();
    and_slow.push(slow.clone());
    upload(&c, &env, with(&and_slow)).await;
    wait_for_file(&format!("{d}/started"), "the slow command to start").await;
    upload(&c, &env, with(std::slice::from_ref(&slow))).await;
    // the executor runs the command and holds deletes handed to it to start next
    let pid = eventually(10, "deletes handed to the busy executor", || async {
        let a = c.agents(&env).await.unwrap();
        let agent = a["agents"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == AGENT)?
            .clone();
        (agent["running"].as_u64()? >= 2)
            .then(|| agent["executors"][0].as_u64())
            .flatten()
    })
    .await;
    let v4 = upload(&c, &env, with(&and_slow)).await;
    assert!(
        !Path::new(&format!("{d}/done")).exists()
            && (1..=3).all(|i| Path::new(&format!("{d}/f{i}")).exists()),
        "the test's premise: nothing but the command started before the executor dies"
    );
    kill9(pid as u32);
    wait_deployed(&c, &env, v4, 40).await;
    for (i, f) in files.iter().enumerate() {
        let path = format!("{d}/f{}", i + 1);
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some(format!("content {}", i + 1).as_str()),
            "{path}"
        );
        let log = deploy_actions(&c, &env, &f.id.0).await;
        assert!(
            log.iter().all(|a| a.action != "delete"),
            "a delete that was no longer needed ran: {log:?}"
        );
        assert_eq!(state_of(&c, &env, &f.id.0).await.status, "deployed");
    }
}
