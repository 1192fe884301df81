//! Real git repositories (a bare origin and a working clone, made with the `git` CLI) and the
//! models the harness commits to them.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Chaos")
        .env("GIT_AUTHOR_EMAIL", "chaos@example.com")
        .env("GIT_COMMITTER_NAME", "Chaos")
        .env("GIT_COMMITTER_EMAIL", "chaos@example.com")
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .map_err(|e| format!("git {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A bare origin (as on a git host) and a clone to commit and push from.
pub struct Repo {
    pub origin: PathBuf,
    pub work: PathBuf,
}

impl Repo {
    pub fn create(root: &Path, name: &str) -> Result<Repo, String> {
        let origin = root.join(format!("{name}.git"));
        let work = root.join(format!("{name}-work"));
        let o = origin.to_string_lossy().to_string();
        let w = work.to_string_lossy().to_string();
        git(root, &["init", "-q", "--bare", "-b", "main", &o])?;
        git(root, &["clone", "-q", &o, &w])?;
        git(&work, &["checkout", "-q", "-b", "main"])?;
        Ok(Repo { origin, work })
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.origin.display())
    }

    /// Write the projects (`main.cf` of each, in its subdirectory, "" for the top) and
    /// commit them; the commit id.
    pub fn commit(&self, projects: &[(&str, &str)], message: &str) -> Result<String, String> {
        for (sub, main_cf) in projects {
            let dir = self.work.join(sub);
            let write = |name: &str, text: &str| {
                std::fs::create_dir_all(&dir)
                    .and_then(|_| std::fs::write(dir.join(name), text))
                    .map_err(|e| format!("{sub}/{name}: {e}"))
            };
            write("project.yml", "name: chaos\nmodulepath: libs\n")?;
            write("main.cf", main_cf)?;
        }
        git(&self.work, &["add", "-A"])?;
        git(
            &self.work,
            &["commit", "-q", "--allow-empty", "-m", message],
        )?;
        git(&self.work, &["rev-parse", "HEAD"])
    }

    pub fn push(&self) -> Result<(), String> {
        git(&self.work, &["push", "-q", "origin", "HEAD:main"]).map(|_| ())
    }
}

/// What file `i` of `kind` holds after commit `round`.
pub fn content(kind: &str, i: usize, round: u32) -> String {
    format!("{kind} file {i} of round {round}")
}

pub fn file(out: &Path, i: usize) -> PathBuf {
    out.join(format!("f{i:03}"))
}

/// `files` files under `out`, every one of them changed by every commit; a `broken` model
/// does not compile.
pub fn files_model(out: &Path, kind: &str, files: usize, round: u32, broken: bool) -> String {
    let mut m = String::from("import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
    for i in 0..files {
        m.push_str(&format!(
            "fs::File(host=host, path=\"{}\", content=\"{}\", mode=644)\n",
            file(out, i).display(),
            content(kind, i, round)
        ));
    }
    if broken {
        m.push_str("fs::File(host=host, path=\"unterminated\n");
    }
    m
}

const HEADER: &str =
    "import fs\nimport exec\nhost = std::Host(name=\"localhost\", os=std::linux)\n";

/// A good file and a file whose directory does not exist (it fails on every attempt).
pub fn failing_model(good: &Path, failing: &Path) -> String {
    format!(
        "{HEADER}fs::File(host=host, path=\"{}\", content=\"good\", mode=644)\n\
         fs::File(host=host, path=\"{}\", content=\"never written\", mode=644)\n",
        good.display(),
        failing.display()
    )
}

/// A good file and a command that sleeps past the handler timeout (killed on every attempt).
pub fn hanging_model(good: &Path, hang_secs: u64) -> String {
    format!(
        "{HEADER}fs::File(host=host, path=\"{}\", content=\"good\", mode=644)\n\
         exec::Run(host=host, command=\"sleep {hang_secs}\")\n",
        good.display()
    )
}
