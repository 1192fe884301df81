//! A git source over SSH with a deploy key, as a user of a private repository sets it up:
//! the server fetches through a real sshd on 127.0.0.1 with the key and known_hosts the
//! source holds, compiles the commit and deploys it; a source whose known_hosts does not
//! know the host is refused with an authentication error, and nothing is compiled.

use serde_json::json;

use crate::gitops_support::{Repo, compiled, git_ok, read};
use crate::support::{TestServer, eventually};

#[tokio::test(flavor = "multi_thread")]
async fn a_source_over_ssh_with_a_deploy_key_compiles_and_a_wrong_host_key_is_refused() {
    let sshd = crate::ssh_support::Sshd::start();
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let out = repo.out.display().to_string();
    let commit = repo.commit(
        &format!(
            "import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\nfs::File(host=host, path=\"{out}/over-ssh\", content=\"fetched over ssh\\n\", mode=644)\n"
        ),
        "a file",
    );
    git_ok(&repo.work, &["push", "-q", "origin", "HEAD:main"]);
    let url = format!(
        "ssh://{}@127.0.0.1:{}{}",
        sshd.user,
        sshd.port,
        repo.origin.display()
    );
    let key = std::fs::read_to_string(&sshd.client_key).unwrap();
    let known = std::fs::read_to_string(&sshd.known_hosts).unwrap();
    let env = c
        .create_environment("git", "ssh", None)
        .await
        .unwrap()
        .id
        .to_string();
    c.set_source(
        &env,
        &json!({"url": url, "branch": "main", "ssh_key": key, "known_hosts": known,
                "webhook_secret": "s", "poll_interval": 0}),
    )
    .await
    .unwrap();
    c.trigger_compile(&env, None).await.unwrap();
    let r = compiled(&c, &env, &commit, 60).await;
    assert_eq!(r["status"], "success", "{r:#}\n{}", sshd.log());
    eventually(60, "the file deployed", || async {
        (read(&repo.out.join("over-ssh"))? == "fetched over ssh\n").then_some(())
    })
    .await;

    // a known_hosts that names another key for this host: the fetch is refused as an
    // authentication failure, and says so
    let other = c
        .create_environment("git", "ssh-wrong-host", None)
        .await
        .unwrap()
        .id
        .to_string();
    let wrong = format!(
        "[127.0.0.1]:{} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n",
        sshd.port
    );
    c.set_source(
        &other,
        &json!({"url": url, "branch": "main", "ssh_key": key, "known_hosts": wrong,
                "webhook_secret": "s", "poll_interval": 0}),
    )
    .await
    .unwrap();
    let refused = c.trigger_compile(&other, None).await;
    let text = match refused {
        Err(e) => e.to_string(),
        Ok(v) => {
            // queued: the fetch's failure shows on the source
            eventually(60, "the fetch refused", || async {
                let s = c.source(&other).await.ok()?;
                let e = s["last_error"].as_str()?.to_string();
                (!e.is_empty()).then_some(e)
            })
            .await
                + &v.to_string()
        }
    };
    assert!(
        text.contains("authentication failed") && text.contains("Host key verification failed"),
        "a wrong host key is an authentication failure: {text}"
    );
    let list = c.compiles(&other, 10).await.unwrap();
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] != "success"),
        "{list:#}"
    );
}
