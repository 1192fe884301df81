//! The environments that follow the "site" repository: "site" releases every version as it
//! is compiled (auto release), "manual" waits for the harness to release them through the
//! API. Each deploys files whose contents change with every commit.

use std::path::{Path, PathBuf};

use super::{Api, Pushed, repo};

pub struct Follow {
    /// The environment's name, and its project's directory in the repository.
    pub name: &'static str,
    pub env: String,
    pub out: PathBuf,
    pub files: usize,
    /// Versions are released by the harness (auto_release off).
    pub manual: bool,
}

impl Follow {
    pub fn new(name: &'static str, root: &Path, files: usize, manual: bool) -> Follow {
        Follow {
            name,
            env: String::new(),
            out: root.join(format!("out-{name}")),
            files,
            manual,
        }
    }

    pub fn model(&self, round: u32, broken: bool) -> String {
        repo::files_model(&self.out, self.name, self.files, round, broken)
    }

    /// The files that do not hold `round`'s contents.
    pub fn wrong_files(&self, round: u32) -> Vec<usize> {
        (0..self.files)
            .filter(|i| {
                std::fs::read_to_string(repo::file(&self.out, *i)).ok()
                    != Some(repo::content(self.name, *i, round))
            })
            .collect()
    }

    pub fn converged(&self, round: u32) -> bool {
        self.wrong_files(round).is_empty()
    }

    /// Release the newest version that is still new (newer than the active one); which.
    pub async fn release_newest(&self, api: &Api) -> Result<Option<i32>, String> {
        let list = api.req(api.c.versions(&self.env)).await?;
        let active = list
            .iter()
            .filter(|v| v["active"] == true)
            .filter_map(|v| v["number"].as_i64())
            .max();
        let newest = list
            .iter()
            .filter(|v| v["status"] == "new")
            .filter_map(|v| v["number"].as_i64())
            .filter(|n| active.is_none_or(|a| *n > a))
            .max();
        let Some(n) = newest else {
            return Ok(None);
        };
        api.req(api.c.release(&self.env, n as i32, "chaos harness"))
            .await?;
        Ok(Some(n as i32))
    }

    /// The timeline state of `commit` in this environment.
    pub async fn state(&self, api: &Api, commit: &str) -> Option<String> {
        api.req(api.c.commit_timeline(&self.env, commit))
            .await
            .ok()
            .and_then(|t| t["state"].as_str().map(str::to_string))
    }

    /// Settled: the last commit that compiles is deployed, its files on disk.
    pub async fn settled(&self, api: &Api, pushed: &[Pushed]) -> bool {
        let Some(last) = last_good(pushed) else {
            return true;
        };
        self.converged(last.round)
            && self.state(api, &last.sha).await.as_deref() == Some("deployed")
    }
}

/// Commit round `round` of every follower's project, and push it.
pub fn commit_round(
    site: &repo::Repo,
    follows: &[Follow],
    round: u32,
    broken: bool,
) -> Result<Pushed, String> {
    let models: Vec<(&str, String)> = follows
        .iter()
        .map(|f| (f.name, f.model(round, broken)))
        .collect();
    let projects: Vec<(&str, &str)> = models.iter().map(|(n, m)| (*n, m.as_str())).collect();
    let message = format!("round {round}{}", if broken { " (broken)" } else { "" });
    let sha = site.commit(&projects, &message)?;
    site.push()?;
    Ok(Pushed { sha, round, broken })
}

/// The last commit pushed that compiles.
pub fn last_good(pushed: &[Pushed]) -> Option<&Pushed> {
    pushed.iter().rev().find(|p| !p.broken)
}
