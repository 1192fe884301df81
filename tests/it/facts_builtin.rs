//! Facts of Steward's built-in handlers (issue 29): an `fs::File` reports the `sha256` and
//! `size` of what it wrote, and an `exec::Run` the `exit_code` and `stdout` of its run; a
//! model reads them with `std::getfact`. With `steward deploy` one run converges; on the
//! server, a fact that is gone is asked of the built-in handler again (its `facts()`), which
//! reads it from the file without changing anything. Only facts the model waits for are
//! reported with a deploy, so files nobody asks about cost no writes.

use serde_json::json;
use sha2::Digest;

use crate::gitops_support::{Repo, compiled, git_ok, read};
use crate::support::{TestServer, eventually, wait_deployed};

const CONF: &str = "port 8080\n";

fn main_cf(repo: &Repo) -> String {
    let out = repo.out.display();
    format!(
        r#"import fs
import exec

host = std::Host(name="localhost", os=std::linux)
conf = fs::File(host=host, path="{out}/app.conf", content="port 8080\n", mode=644)
build = exec::Run(host=host, command="/bin/sh -c 'echo build-17; touch {out}/ran'", creates="{out}/ran")
sum = std::getfact(conf, "sha256")
size = std::getfact(conf, "size")
said = std::getfact(build, "stdout")
fs::File(host=host, path="{out}/report.txt", content="sum {{{{sum}}}} size {{{{size}}}} build {{{{said}}}}\n", mode=644)
"#
    )
}

fn expected_report() -> String {
    let sum = hex::encode(sha2::Sha256::digest(CONF.as_bytes()));
    format!("sum {sum} size {} build build-17\n", CONF.len())
}

#[test]
fn steward_deploy_reads_the_facts_of_built_in_handlers_in_one_run() {
    let repo = Repo::new();
    repo.commit(
        &main_cf(&repo),
        "a file, a command, and a report of their facts",
    );
    let data = tempfile::tempdir().unwrap();
    let run = || {
        let out = std::process::Command::new(crate::support::steward_bin())
            .arg("deploy")
            .arg("-p")
            .arg(&repo.work)
            .arg("--data-dir")
            .arg(data.path().join("deploy"))
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        text
    };
    let first = run();
    assert!(
        first.contains("facts arrived for 3 unknown values: compiling again"),
        "{first}"
    );
    assert_eq!(
        read(&repo.out.join("report.txt")),
        Some(expected_report()),
        "{first}"
    );
    // the command ran once; the next run has every value at once and changes nothing
    let second = run();
    assert!(!second.contains("compiling again"), "{second}");
    assert!(second.contains("no changes"), "{second}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_fact_of_a_built_in_resource_is_read_again_by_its_handler() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let commit = repo.commit(&main_cf(&repo), "a file, a command, and their facts");
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    // facts looked at every second, each resource asked at most every 2 s
    let env = c
        .create_environment(
            "facts",
            "builtin",
            Some(json!({"fact_renew": 3, "fact_resource_block": 2})),
        )
        .await
        .unwrap()
        .id
        .to_string();
    c.set_source(
        &env,
        &json!({"url": repo.url(), "branch": "main", "webhook_secret": "s", "poll_interval": 0}),
    )
    .await
    .unwrap();
    c.trigger_compile(&env, None).await.unwrap();
    assert_eq!(compiled(&c, &env, &commit, 60).await["status"], "success");
    let report = repo.out.join("report.txt");
    eventually(90, "the report with every fact", || async {
        (read(&report)? == expected_report()).then_some(())
    })
    .await;

    // the file's hash is gone: the model is compiled again without it, and the scheduler
    // asks the file's handler, which reads it from the file (the file is not written again)
    let conf = repo.out.join("app.conf");
    let written = std::fs::metadata(&conf).unwrap().modified().unwrap();
    let conf_id = format!("fs::File[localhost,path={}]", conf.display());
    let fact_compiles = || async {
        let list = c.compiles(&env, 100).await.unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["trigger"] == "fact" && r["status"] == "success")
            .cloned()
            .collect::<Vec<_>>()
    };
    let before = fact_compiles().await.len();
    c.delete_parameter(&env, "sha256", Some(&conf_id))
        .await
        .unwrap();
    let asked = eventually(60, "the hash read again", || async {
        let f = c.get_parameter(&env, "sha256", Some(&conf_id)).await.ok()?;
        Some(f)
    })
    .await;
    assert_eq!(
        asked.value,
        hex::encode(sha2::Sha256::digest(CONF.as_bytes()))
    );
    // the version made for it deploys, with the report unchanged: after the deletion's
    // recompile (the hash unknown, the report undefined), the one for its return
    let p = eventually(
        60,
        "a version made with the hash again, deployed",
        || async {
            let done = fact_compiles().await;
            if done.len() < before + 2 {
                return None;
            }
            let v = done[0]["version"].as_i64()? as i32;
            let p = wait_deployed(&c, &env, v, 60).await;
            (p["by_status"]["deployed"] == 3).then_some(p)
        },
    )
    .await;
    assert_eq!(p["total"], 3, "{p}");
    assert_eq!(read(&report), Some(expected_report()));
    assert_eq!(
        std::fs::metadata(&conf).unwrap().modified().unwrap(),
        written,
        "asking for facts wrote the file"
    );
    // the command's output is kept (it never expires) and it did not run again
    let facts = c.list_facts(&env, None).await.unwrap();
    let said = facts
        .iter()
        .find(|f| f.name == "stdout" && f.resource_id.starts_with("exec::Run["))
        .expect("the command's stdout is a fact");
    assert_eq!(said.value, "build-17");
    // a file whose facts no model reads reports none: they would cost a write per deploy
    assert!(
        !facts.iter().any(|f| f.resource_id.contains("report.txt")),
        "{facts:?}"
    );
    assert!(!said.expires);
}
