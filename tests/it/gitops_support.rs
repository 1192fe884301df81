//! Real git repositories for the git-driven server tests: a bare "origin" (as on a git host),
//! a working clone to commit and push from, and the hooks of `hooks/` installed for real.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;
use steward::client::Client;

pub fn git(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("run git")
}

pub fn git_ok(dir: &Path, args: &[&str]) -> String {
    let out = git(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare origin, a clone to work in, and a directory the model deploys files into.
pub struct Repo {
    _tmp: tempfile::TempDir,
    pub origin: PathBuf,
    pub work: PathBuf,
    pub out: PathBuf,
}

impl Repo {
    pub fn new() -> Repo {
        let tmp = tempfile::tempdir().unwrap();
        let origin = tmp.path().join("origin.git");
        let work = tmp.path().join("work");
        let out = tmp.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        git_ok(
            tmp.path(),
            &[
                "init",
                "-q",
                "--bare",
                "-b",
                "main",
                origin.to_str().unwrap(),
            ],
        );
        git_ok(
            tmp.path(),
            &[
                "clone",
                "-q",
                origin.to_str().unwrap(),
                work.to_str().unwrap(),
            ],
        );
        git_ok(&work, &["checkout", "-q", "-b", "main"]);
        Repo {
            _tmp: tmp,
            origin,
            work,
            out,
        }
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.origin.display())
    }

    /// A model deploying `files` (name, content) under `out`; `extra` is appended verbatim.
    pub fn model(&self, files: &[(&str, &str)], extra: &str) -> String {
        let mut m =
            String::from("import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
        for (name, content) in files {
            m.push_str(&format!(
                "fs::File(host=host, path=\"{}/{name}\", content=\"{content}\", mode=644)\n",
                self.out.display()
            ));
        }
        m.push_str(extra);
        m
    }

    /// Write the project (in `sub` of the repository) and commit it; returns the commit.
    pub fn commit_in(&self, sub: &str, main_cf: &str, message: &str) -> String {
        let dir = self.work.join(sub);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("project.yml"), "name: site\nmodulepath: libs\n").unwrap();
        std::fs::write(dir.join("main.cf"), main_cf).unwrap();
        git_ok(&self.work, &["add", "-A"]);
        git_ok(
            &self.work,
            &["commit", "-q", "--allow-empty", "-m", message],
        );
        git_ok(&self.work, &["rev-parse", "HEAD"])
    }

    pub fn commit(&self, main_cf: &str, message: &str) -> String {
        self.commit_in("", main_cf, message)
    }

    /// `git push` to origin (runs the installed hooks); the output, for hook messages.
    pub fn push(&self) -> Output {
        git(&self.work, &["push", "-q", "origin", "HEAD:main"])
    }

    pub fn push_ok(&self) {
        let o = self.push();
        assert!(
            o.status.success(),
            "push failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Install hooks/post-receive in origin, notifying `webhook_url` signed with `secret`.
    pub fn install_post_receive(&self, webhook_url: &str, secret: &str) {
        let hook = self.origin.join("hooks/post-receive");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("hooks/post-receive"),
            &hook,
        )
        .unwrap();
        git_ok(&self.origin, &["config", "steward.url", webhook_url]);
        git_ok(&self.origin, &["config", "steward.secret", secret]);
    }
}

/// An environment following `repo`'s main branch (polling off unless asked), webhook secret "s3cret".
pub async fn follow(c: &Client, name: &str, repo: &Repo, extra: serde_json::Value) -> String {
    let env = c
        .create_environment("git", name, None)
        .await
        .unwrap()
        .id
        .to_string();
    let mut body = json!({"url": repo.url(), "branch": "main", "webhook_secret": "s3cret", "poll_interval": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    c.set_source(&env, &body).await.unwrap();
    env
}

pub fn webhook_url(server: &str, env: &str) -> String {
    format!("{server}/api/v1/environments/{env}/source/webhook")
}

/// The compile of `commit`, once it is finished (success or failed). A timeout names the
/// compiles the server had then (a commit never seen, or one still queued, says which).
pub async fn compiled(c: &Client, env: &str, commit: &str, secs: u64) -> serde_json::Value {
    let what = format!("a finished compile of {commit}");
    crate::support::eventually_or(secs, &what, || async {
        let list = c.compiles(env, 100).await.unwrap();
        let hit = list.as_array().and_then(|l| {
            l.iter().find(|r| {
                r["commit"] == commit && (r["status"] == "success" || r["status"] == "failed")
            })
        });
        match hit {
            Some(hit) => Ok(c
                .compile_report(env, hit["id"].as_str().unwrap())
                .await
                .unwrap()),
            // the commit not even queued: the source's last fetch error may say why
            None if !list.to_string().contains(commit) => {
                let source = c.source(env).await.ok();
                Err(format!("the compiles: {list:#}; the source: {source:#?}"))
            }
            None => Err(format!("the compiles: {list:#}")),
        }
    })
    .await
}

pub fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The events of a commit's timeline, in order.
pub async fn timeline(c: &Client, env: &str, commit: &str) -> Vec<String> {
    let t = c.commit_timeline(env, commit).await.unwrap_or_default();
    t["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["event"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The export of the model in the working tree, compiled here in full.
pub fn export_here(repo: &Repo) -> steward::model::ExportFile {
    let opts = steward::compiler::CompileOptions {
        project_dir: repo.work.clone(),
        export: true,
        ..Default::default()
    };
    match steward::compiler::compile(&opts, &mut |_| {}).result {
        Ok(Some(x)) => x,
        other => panic!("the model does not compile here: {:?}", other.err()),
    }
}
