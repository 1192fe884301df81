//! The scheduler and executors on real files: the server in process with its schedulers,
//! real `steward executor` processes, resources under a temp dir.

use std::path::Path;

use serde_json::json;
use steward::client::Client;
use steward::model::Resource;

use crate::support::{TestServer, eventually, exec_run, export_of, fs_file, wait_deployed};

const AGENT: &str = "localhost";

pub async fn env_with(c: &Client, name: &str, settings: serde_json::Value) -> String {
    c.create_environment("deploy", name, Some(settings))
        .await
        .unwrap()
        .id
        .to_string()
}

/// A deploying server, an admin client, a new environment with `settings`, and a temp dir.
pub async fn deploying_env(
    name: &str,
    settings: serde_json::Value,
) -> (TestServer, Client, String, tempfile::TempDir) {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let env = env_with(&c, name, settings).await;
    (srv, c, env, tempfile::tempdir().unwrap())
}

pub async fn upload(c: &Client, env: &str, resources: Vec<Resource>) -> i32 {
    let v = c
        .upload(env, &export_of(resources), json!({}))
        .await
        .unwrap();
    v["number"].as_i64().unwrap() as i32
}

/// `n` files in `dir`, each requiring the one before.
fn chain(dir: &Path, n: usize, content: impl Fn(usize) -> String) -> Vec<Resource> {
    let ids: Vec<String> = (0..n)
        .map(|i| format!("fs::File[{AGENT},path={}/f{i}]", dir.display()))
        .collect();
    (0..n)
        .map(|i| {
            let req: Vec<&str> = if i > 0 {
                vec![ids[i - 1].as_str()]
            } else {
                vec![]
            };
            fs_file(AGENT, &format!("{}/f{i}", dir.display()), &content(i), &req)
        })
        .collect()
}

/// Deploy actions in the log, per resource.
pub async fn deploy_actions(
    c: &Client,
    env: &str,
    rid: &str,
) -> Vec<steward::store::actions::ActionRecord> {
    c.actions(env, Some(rid), 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action != "dryrun")
        .collect()
}

pub async fn state_of(
    c: &Client,
    env: &str,
    rid: &str,
) -> steward::store::state::ResourceWithState {
    let (_, rows) = c.resources(env).await.unwrap();
    rows.into_iter()
        .find(|r| r.resource_id == rid)
        .unwrap_or_else(|| panic!("{rid} not in the active version"))
}

#[tokio::test(flavor = "multi_thread")]
async fn deploys_only_what_changed() {
    let (_srv, c, env, dir) = deploying_env("basic", json!({})).await;
    let d = dir.path();

    // first deploy: everything, in requires order
    let v1 = upload(&c, &env, chain(d, 5, |i| format!("content {i}\n"))).await;
    let p = wait_deployed(&c, &env, v1, 30).await;
    assert_eq!(p["by_status"]["deployed"], 5, "{p}");
    for i in 0..5 {
        assert_eq!(
            std::fs::read_to_string(d.join(format!("f{i}"))).unwrap(),
            format!("content {i}\n")
        );
    }
    let mut previous_end = None;
    for i in 0..5 {
        let rid = format!("fs::File[{AGENT},path={}/f{i}]", d.display());
        let acts = deploy_actions(&c, &env, &rid).await;
        assert_eq!(acts.len(), 1, "{rid}: {acts:?}");
        assert_eq!(acts[0].status, "deployed");
        assert_eq!(acts[0].change, "created");
        if let Some(end) = previous_end {
            assert!(
                acts[0].started_at >= end,
                "f{i} started before its requirement finished"
            );
        }
        previous_end = acts[0].finished_at;
    }

    // the same model again: nothing runs
    let v2 = upload(&c, &env, chain(d, 5, |i| format!("content {i}\n"))).await;
    wait_deployed(&c, &env, v2, 30).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    for i in 0..5 {
        let rid = format!("fs::File[{AGENT},path={}/f{i}]", d.display());
        assert_eq!(
            deploy_actions(&c, &env, &rid).await.len(),
            1,
            "{rid} ran again"
        );
    }

    // one changed: only it runs, plus its direct dependent because files send events
    // (SCHEDULER.md §5; not transitive beyond what the dependent itself sends)
    let v3 = upload(
        &c,
        &env,
        chain(d, 5, |i| {
            if i == 2 {
                "changed\n".into()
            } else {
                format!("content {i}\n")
            }
        }),
    )
    .await;
    wait_deployed(&c, &env, v3, 30).await;
    assert_eq!(std::fs::read_to_string(d.join("f2")).unwrap(), "changed\n");
    for i in 0..5 {
        let rid = format!("fs::File[{AGENT},path={}/f{i}]", d.display());
        let acts = deploy_actions(&c, &env, &rid).await;
        match i {
            2 => {
                assert_eq!(acts.len(), 2, "{rid}: {acts:?}");
                assert_eq!(acts[0].change, "updated");
                assert!(
                    acts[0].changes.get("content").is_some(),
                    "{:?}",
                    acts[0].changes
                );
            }
            // f3 got the event of f2 and verified itself; its own run changed nothing, and
            // it sends events too, so f4 verified itself as well
            3 | 4 => {
                assert_eq!(acts.len(), 2, "{rid}: {acts:?}");
                assert_eq!(acts[0].change, "nochange");
            }
            _ => assert_eq!(acts.len(), 1, "{rid} ran again: {acts:?}"),
        }
    }
    let s = state_of(
        &c,
        &env,
        &format!("fs::File[{AGENT},path={}/f2]", d.display()),
    )
    .await;
    assert_eq!(s.status, "deployed");
    assert!(s.last_success.is_some() && s.last_attempt.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn requires_order_holds_across_agents() {
    let (_srv, c, env, dir) = deploying_env("agents", json!({})).await;
    let d = dir.path().display().to_string();
    // agent b's command needs the file of agent a: it fails when run too early
    let file = fs_file("a", &format!("{d}/input"), "data\n", &[]);
    let file_id = file.id.0.clone();
    let cmd = format!("cp {d}/input {d}/copied");
    let run = exec_run("b", &cmd, json!({}), &[&file_id]);
    let v = upload(&c, &env, vec![run, file]).await;
    let p = wait_deployed(&c, &env, v, 30).await;
    assert_eq!(p["by_status"]["deployed"], 2, "{p}");
    assert_eq!(
        std::fs::read_to_string(format!("{d}/copied")).unwrap(),
        "data\n"
    );
    let agents = c.agents(&env).await.unwrap();
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn failure_skips_dependents_until_it_recovers() {
    let (_srv, c, env, dir) = deploying_env(
        "fail",
        json!({"retry_backoff": {"initial": 1, "factor": 1.0, "max": 1}}),
    )
    .await;
    let d = dir.path();
    // the parent directory is missing: the file fails, its dependent is skipped
    let missing = d.join("later");
    let f = fs_file(AGENT, &format!("{}/conf", missing.display()), "x\n", &[]);
    let dep = fs_file(AGENT, &format!("{}/after", d.display()), "y\n", &[&f.id.0]);
    let (fid, did) = (f.id.0.clone(), dep.id.0.clone());
    let v = upload(&c, &env, vec![f, dep]).await;
    let p = wait_deployed(&c, &env, v, 30).await;
    assert_eq!(p["by_status"]["failed"], 1, "{p}");
    assert_eq!(p["by_status"]["skipped_for_dependency"], 1, "{p}");
    let s = state_of(&c, &env, &did).await;
    assert!(
        s.blocked_reason.as_deref().unwrap_or("").contains(&fid),
        "{s:?}"
    );
    assert!(!d.join("after").exists());
    let failed = state_of(&c, &env, &fid).await;
    assert!(failed.last_message.is_some(), "{failed:?}");
    assert!(failed.next_retry.is_some());

    // fixed on the target: the retry lane picks it up and the dependent follows
    std::fs::create_dir(&missing).unwrap();
    eventually(
        30,
        "the failed file and its dependent to deploy",
        || async {
            let a = state_of(&c, &env, &fid).await;
            let b = state_of(&c, &env, &did).await;
            (a.status == "deployed" && b.status == "deployed").then_some(())
        },
    )
    .await;
    assert_eq!(std::fs::read_to_string(d.join("after")).unwrap(), "y\n");
    assert_eq!(state_of(&c, &env, &fid).await.failure_count, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn repair_restores_drift() {
    let (_srv, c, env, dir) = deploying_env("drift", json!({})).await;
    let d = dir.path();
    let v = upload(&c, &env, chain(d, 3, |i| format!("c{i}\n"))).await;
    wait_deployed(&c, &env, v, 30).await;

    // a user deploy does nothing: all is deployed
    let r = c.trigger(&env, false, None, None).await.unwrap();
    assert_eq!(r["scheduled"], 0);

    // drift: edited, deleted, permissions changed
    std::fs::write(d.join("f0"), "tampered").unwrap();
    std::fs::remove_file(d.join("f1")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.join("f2"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = c.trigger(&env, true, None, None).await.unwrap();
    assert_eq!(r["scheduled"], 3);
    eventually(30, "drift to be restored", || async {
        let ok = std::fs::read_to_string(d.join("f0")).ok().as_deref() == Some("c0\n")
            && std::fs::read_to_string(d.join("f1")).ok().as_deref() == Some("c1\n")
            && std::fs::metadata(d.join("f2"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
                == 0o644;
        ok.then_some(())
    })
    .await;
    let f0 = format!("fs::File[{AGENT},path={}/f0]", d.display());
    eventually(10, "the repair to be logged", || async {
        let acts = deploy_actions(&c, &env, &f0).await;
        (acts.len() == 2 && acts[0].status == "deployed").then_some(acts)
    })
    .await;

    // periodic repair (self-healing) without anyone asking
    c.update_settings(&env, &json!({"repair_interval": 1}))
        .await
        .unwrap();
    std::fs::remove_file(d.join("f2")).unwrap();
    eventually(30, "periodic repair to restore f2", || async {
        (std::fs::read_to_string(d.join("f2")).ok().as_deref() == Some("c2\n")).then_some(())
    })
    .await;

    // a repair narrowed to one resource
    let only = format!("fs::File[{AGENT},path={}/f1]", d.display());
    c.update_settings(&env, &json!({"repair_interval": 0}))
        .await
        .unwrap();
    let r = c.trigger(&env, true, None, Some(&only)).await.unwrap();
    assert_eq!(r["scheduled"], 1);
    let err = c
        .trigger(&env, true, None, Some("fs::File[x,path=/nope]"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn dryrun_reports_changes_and_changes_nothing() {
    let (_srv, c, env, dir) = deploying_env("dry", json!({})).await;
    let d = dir.path();
    let v1 = upload(&c, &env, chain(d, 3, |i| format!("c{i}\n"))).await;
    wait_deployed(&c, &env, v1, 30).await;
    c.update_settings(&env, &json!({"auto_release": false}))
        .await
        .unwrap();
    let mut next = chain(d, 3, |i| {
        if i == 1 {
            "new content\n".into()
        } else {
            format!("c{i}\n")
        }
    });
    next.push(fs_file(
        AGENT,
        &format!("{}/extra", d.display()),
        "e\n",
        &[],
    ));
    let v2 = upload(&c, &env, next).await;
    std::fs::remove_file(d.join("f2")).unwrap();

    let started = c.start_dryrun(&env, Some(v2)).await.unwrap();
    let id = started["id"].as_str().unwrap().to_string();
    assert_eq!(started["total"], 4);
    let report = eventually(30, "the dry-run to finish", || async {
        let r = c.dryrun(&env, &id).await.unwrap();
        (r["complete"] == true).then_some(r)
    })
    .await;
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{report:#}");
    let by = |suffix: &str| {
        results
            .iter()
            .find(|r| r["resource_id"].as_str().unwrap().ends_with(suffix))
            .unwrap()
            .clone()
    };
    assert_eq!(by("/f0]")["changes"], json!({}));
    assert_eq!(
        by("/f1]")["changes"]["content"]["desired"],
        "new content\n",
        "{report:#}"
    );
    assert_eq!(by("/f1]")["changes"]["content"]["current"], "c1\n");
    assert_eq!(
        by("/f2]")["changes"]["purged"]["current"],
        true,
        "{report:#}"
    );
    assert_eq!(by("/extra]")["changes"]["purged"]["desired"], false);
    assert_eq!(report["changed"], 3);
    // nothing changed on disk, and nothing was deployed
    assert_eq!(std::fs::read_to_string(d.join("f1")).unwrap(), "c1\n");
    assert!(!d.join("f2").exists() && !d.join("extra").exists());
    assert_eq!(c.versions(&env).await.unwrap()[0]["status"], "new");
    let listed = c.dryruns(&env).await.unwrap();
    assert_eq!(listed[0]["id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_halt_stop_new_work() {
    let (_srv, c, env, dir) = deploying_env("pause", json!({})).await;
    let d = dir.path().display().to_string();
    let v1 = upload(
        &c,
        &env,
        vec![
            fs_file("a", &format!("{d}/a1"), "1", &[]),
            fs_file("b", &format!("{d}/b1"), "1", &[]),
        ],
    )
    .await;
    wait_deployed(&c, &env, v1, 30).await;

    c.set_paused(&env, "a", true).await.unwrap();
    let listed = c.agents(&env).await.unwrap();
    assert_eq!(listed["agents"][0]["state"], "paused", "{listed}");
    let v2 = upload(
        &c,
        &env,
        vec![
            fs_file("a", &format!("{d}/a1"), "2", &[]),
            fs_file("b", &format!("{d}/b1"), "2", &[]),
        ],
    )
    .await;
    eventually(30, "agent b to deploy", || async {
        (std::fs::read_to_string(format!("{d}/b1")).ok().as_deref() == Some("2")).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        std::fs::read_to_string(format!("{d}/a1")).unwrap(),
        "1",
        "a paused agent deployed"
    );
    c.set_paused(&env, "a", false).await.unwrap();
    wait_deployed(&c, &env, v2, 30).await;
    assert_eq!(std::fs::read_to_string(format!("{d}/a1")).unwrap(), "2");

    c.set_halted(&env, true).await.unwrap();
    let v3 = upload(
        &c,
        &env,
        vec![
            fs_file("a", &format!("{d}/a1"), "3", &[]),
            fs_file("b", &format!("{d}/b1"), "3", &[]),
        ],
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert_eq!(
        std::fs::read_to_string(format!("{d}/b1")).unwrap(),
        "2",
        "a halted environment deployed"
    );
    let p = c.progress(&env, v3).await.unwrap();
    assert_eq!(p["done"], false);
    c.set_halted(&env, false).await.unwrap();
    wait_deployed(&c, &env, v3, 30).await;
    assert_eq!(std::fs::read_to_string(format!("{d}/b1")).unwrap(), "3");

    let err = c.set_paused(&env, "nobody", true).await.unwrap_err();
    assert_eq!(err.status(), Some(404));
}

#[tokio::test(flavor = "multi_thread")]
async fn events_reach_reload_only_commands() {
    let (_srv, c, env, dir) = deploying_env("events", json!({})).await;
    let d = dir.path().display().to_string();
    let model = |content: &str| {
        let conf = fs_file(AGENT, &format!("{d}/app.conf"), content, &[]);
        let id = conf.id.0.clone();
        let reload = exec_run(
            AGENT,
            &format!("sh -c 'echo reload >> {d}/reloads'"),
            json!({"reload_only": true}),
            &[&id],
        );
        vec![conf, reload]
    };
    let v1 = upload(&c, &env, model("one")).await;
    wait_deployed(&c, &env, v1, 30).await;
    // first deploy of the file is a change: the command reloads once
    let count = || {
        std::fs::read_to_string(format!("{d}/reloads"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    assert_eq!(count(), 1);
    let v2 = upload(&c, &env, model("two")).await;
    wait_deployed(&c, &env, v2, 30).await;
    eventually(10, "a second reload", || async {
        (count() == 2).then_some(())
    })
    .await;
    // a repair that changes nothing sends no event
    c.trigger(&env, true, None, None).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(count(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn removed_resources_are_orphaned_or_deleted_when_asked() {
    let (_srv, c, env, dir) = deploying_env("orphans", json!({})).await;
    let d = dir.path().display().to_string();
    let v1 = upload(
        &c,
        &env,
        vec![
            fs_file(AGENT, &format!("{d}/keep"), "k", &[]),
            fs_file(AGENT, &format!("{d}/old"), "o", &[]),
        ],
    )
    .await;
    wait_deployed(&c, &env, v1, 30).await;
    let v2 = upload(
        &c,
        &env,
        vec![fs_file(AGENT, &format!("{d}/keep"), "k", &[])],
    )
    .await;
    wait_deployed(&c, &env, v2, 30).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        Path::new(&format!("{d}/old")).exists(),
        "an orphan is left alone by default"
    );

    c.update_settings(&env, &json!({"delete_removed_resources": true}))
        .await
        .unwrap();
    let v3 = upload(
        &c,
        &env,
        vec![fs_file(AGENT, &format!("{d}/other"), "x", &[])],
    )
    .await;
    wait_deployed(&c, &env, v3, 30).await;
    eventually(10, "the removed file to be deleted", || async {
        (!Path::new(&format!("{d}/keep")).exists()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn undefined_resources_block_their_dependents() {
    let (_srv, c, env, dir) = deploying_env("undef", json!({})).await;
    let d = dir.path().display().to_string();
    let a = fs_file(AGENT, &format!("{d}/a"), "a", &[]);
    let b = fs_file(AGENT, &format!("{d}/b"), "b", &[&a.id.0]);
    let ok = fs_file(AGENT, &format!("{d}/ok"), "ok", &[]);
    let (aid, bid) = (a.id.0.clone(), b.id.0.clone());
    let mut export = export_of(vec![a, b, ok]);
    export
        .undefined
        .push(steward::model::ResourceId(aid.clone()));
    let v = c.upload(&env, &export, json!({})).await.unwrap()["number"]
        .as_i64()
        .unwrap() as i32;
    let p = wait_deployed(&c, &env, v, 30).await;
    assert_eq!(p["by_status"]["undefined"], 1, "{p}");
    assert_eq!(p["by_status"]["skipped_for_undefined"], 1, "{p}");
    assert_eq!(p["by_status"]["deployed"], 1, "{p}");
    let sb = state_of(&c, &env, &bid).await;
    assert!(sb.blocked_reason.unwrap_or_default().contains(&aid));
    assert!(!Path::new(&format!("{d}/a")).exists() && !Path::new(&format!("{d}/b")).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn new_intent_preempts_a_running_repair() {
    let (_srv, c, env, dir) = deploying_env("preempt", json!({})).await;
    let d = dir.path().display().to_string();
    // 30 slow steps: a repair of all of them takes ~6 s on one agent
    let steps = |marker: &str| {
        let mut r: Vec<Resource> = (0..30)
            .map(|i| {
                exec_run(
                    AGENT,
                    &format!("sh -c 'sleep 0.2; echo {i} >> {d}/runs'"),
                    json!({}),
                    &[],
                )
            })
            .collect();
        r.push(fs_file(AGENT, &format!("{d}/marker"), marker, &[]));
        r
    };
    let v1 = upload(&c, &env, steps("one")).await;
    wait_deployed(&c, &env, v1, 60).await;
    // periodic repair every second: a sweep is soon under way
    c.update_settings(&env, &json!({"repair_interval": 1}))
        .await
        .unwrap();
    let runs = || {
        std::fs::read_to_string(format!("{d}/runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let before = runs();
    eventually(20, "the repair sweep to run", || async {
        (runs() >= before + 3).then_some(())
    })
    .await;
    // new intent goes first, not after the ~6 s sweep
    let started = std::time::Instant::now();
    upload(&c, &env, steps("two")).await;
    eventually(20, "the new marker", || async {
        (std::fs::read_to_string(format!("{d}/marker"))
            .ok()
            .as_deref()
            == Some("two"))
        .then_some(())
    })
    .await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "new intent waited {:?}",
        started.elapsed()
    );
    // and the repair goes on afterwards
    let after = runs();
    eventually(20, "the repair to continue", || async {
        (runs() >= after + 3).then_some(())
    })
    .await;
}

/// A version of more resources than one statement writes (`store::ROWS_PER_STATEMENT`): its
/// attributes, spans, states and action records are written in several statements, and
/// it is stored, read back and deployed whole, with one state and one action per resource.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_larger_than_one_statement_is_stored_and_deployed_whole() {
    let (srv, c, env, dir) = deploying_env("large", json!({})).await;
    let n = 2 * steward::store::ROWS_PER_STATEMENT + 1;
    let files: Vec<Resource> = (0..n)
        .map(|i| {
            let path = format!("{}/f{i:05}", dir.path().display());
            fs_file(AGENT, &path, &format!("content {i}\n"), &[])
        })
        .collect();
    let v = upload(&c, &env, files.clone()).await;
    let stored = c.version_resources(&env, v).await.unwrap();
    assert_eq!(stored.len(), n);
    for (sent, got) in files.iter().zip(&stored) {
        assert_eq!(sent.id.0, got.resource_id);
        assert_eq!(
            serde_json::Value::Object(sent.attributes.clone()),
            got.attributes
        );
    }
    let p = wait_deployed(&c, &env, v, 120).await;
    assert_eq!(p["by_status"]["deployed"], n, "{p}");
    for i in [0, n / 2, n - 1] {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(format!("f{i:05}"))).unwrap(),
            format!("content {i}\n")
        );
    }
    let env_id = uuid::Uuid::parse_str(&env).unwrap();
    let count = |sql: &'static str| {
        let pool = srv.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(env_id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT count(*) FROM resource_state WHERE environment_id = $1 AND last_result = 'deployed'").await,
        n as i64
    );
    // the records are written in batches after the states: wait for the last ones
    eventually(30, "an action record per resource", || async {
        (count(
            "SELECT count(*) FROM resource_actions WHERE environment_id = $1 AND status = 'deployed'",
        )
        .await
            == n as i64)
            .then_some(())
    })
    .await;
}

/// `progress?wait_ms=` answers as soon as the version is done, and when the wait is over
/// if it is not.
#[tokio::test(flavor = "multi_thread")]
async fn progress_waits_until_the_version_is_done() {
    use std::time::{Duration, Instant};
    let (_srv, c, env, dir) = deploying_env("progress-wait", json!({})).await;
    let d = dir.path().display().to_string();
    let slow = exec_run(
        AGENT,
        &format!("sh -c 'sleep 1; touch {d}/slept'"),
        json!({}),
        &[],
    );
    let v = upload(&c, &env, vec![slow]).await;
    let at_once = c.progress(&env, v).await.unwrap();
    assert_eq!(at_once["done"], false, "{at_once}");
    let started = Instant::now();
    let p = c
        .progress_when_done(&env, v, Duration::from_secs(20))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(
        (&p["done"], &p["phase"]),
        (&json!(true), &json!("deployed")),
        "{p}"
    );
    assert!(Path::new(&format!("{d}/slept")).exists());
    assert!(
        waited < Duration::from_secs(10),
        "answered after {waited:?}"
    );

    // its agent paused: not done, answered when the wait is over
    c.set_paused(&env, AGENT, true).await.unwrap();
    let later = exec_run(AGENT, &format!("touch {d}/later"), json!({}), &[]);
    let v2 = upload(&c, &env, vec![later]).await;
    let started = Instant::now();
    let p = c
        .progress_when_done(&env, v2, Duration::from_millis(1500))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(
        (&p["done"], &p["phase"]),
        (&json!(false), &json!("deploying")),
        "{p}"
    );
    assert!(
        waited >= Duration::from_millis(1400) && waited < Duration::from_secs(5),
        "answered after {waited:?}"
    );
    // a wait of more than 30 s is 30 s; unpaused, it is done well before
    c.set_paused(&env, AGENT, false).await.unwrap();
    let p = c
        .progress_when_done(&env, v2, Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(p["done"], true, "{p}");
    assert!(Path::new(&format!("{d}/later")).exists());
}
