//! The sandbox of an environment's executors on this machine (`local:` agents): who they run
//! as, where their handler code lives, and what is left of the last ones when new ones start
//! (docs/isolation.md).
//!
//! With the server as root, the executors of an environment run as that environment's
//! executor uid (or the operator's `--executor-user`), in a PID namespace of their own where
//! the kernel gives one. Their handler code is written under `<code>/env-<uuid>/`, owned by
//! root and readable by the group of that uid only, so no other environment's executor can
//! read it and they themselves can not change it; what they must write (handler virtualenvs,
//! a home directory) is in `_venv/` and `_home/` inside, theirs alone.
//!
//! A server that is not root runs them as its own user, in user, PID and mount namespaces
//! of their own in which its data directory and home are hidden, this environment's code
//! directory (with `_venv/` and `_home/`) bound back.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::sandbox::{self, ExecutorUser, Jail, Role};

/// Where an environment's executors run and find their code.
pub struct ExecutorSandbox {
    pub jail: Jail,
    /// `<code>/env-<uuid>/`: the environment's handler code.
    pub code_dir: PathBuf,
    /// The executors' `HOME`.
    pub home: PathBuf,
    /// How many rounds of killing it took to end what earlier executors left running.
    pub killed_rounds: usize,
}

/// Prepare the sandbox of the executors of environment `env`, their code under `code_root`.
/// Blocking (file system work, kills).
pub fn prepare(code_root: &Path, env: uuid::Uuid) -> Result<ExecutorSandbox, String> {
    let identity = sandbox::identity(env, Role::Executor).map_err(|e| e.to_string())?;
    // what executors of an earlier run left (a kill -9 of the server leaves the grandchildren
    // of `exec::Run` commands that moved to their own session): gone before new ones start.
    // Only for a uid of this environment's own: a shared --executor-user is other
    // environments' too.
    let killed_rounds = match identity {
        Some(id) if sandbox::config().executor_user == ExecutorUser::PerEnvironment => {
            sandbox::kill_all(id.uid)
        }
        _ => 0,
    };
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let code_dir = code_root.join(format!("env-{env}"));
    std::fs::create_dir_all(&code_dir).map_err(|e| io("creating", &code_dir, e))?;
    let home = code_dir.join("_home");
    let venvs = code_dir.join("_venv");
    match identity {
        Some(id) => {
            // the way in: traversable by others, never listable; the rest of the data
            // directory closed to them
            if let Some(data_dir) = code_root.parent() {
                sandbox::open_data_dir(data_dir).map_err(|e| io("opening", data_dir, e))?;
            }
            std::os::unix::fs::lchown(&code_dir, Some(0), Some(id.gid))
                .map_err(|e| io("handing over", &code_dir, e))?;
            std::fs::set_permissions(&code_dir, std::fs::Permissions::from_mode(0o750))
                .map_err(|e| io("restricting", &code_dir, e))?;
            for own in [&home, &venvs] {
                sandbox::private_dir(own, Some(id)).map_err(|e| e.to_string())?;
            }
        }
        None => {
            for own in [&code_dir, &home, &venvs] {
                sandbox::private_dir(own, None).map_err(|e| e.to_string())?;
            }
        }
    }
    // A server that is not root has no uid to give them: unless the operator chose to run
    // them as the server, they get namespaces of their own in which the server's files
    // are hidden (all but this environment's code directory).
    let namespaced = match identity {
        Some(_) => true,
        None => !sandbox::is_root() && sandbox::config().executor_user != ExecutorUser::Server,
    };
    let mut jail = Jail {
        identity,
        limits: Vec::new(),
        namespaces: namespaced && sandbox::namespaces_available(),
        die_with_parent: true,
        private_tmp: false,
        hide: Vec::new(),
        keep_visible: vec![code_dir.clone()],
    };
    if let Some(data_dir) = code_root.parent() {
        jail = jail.hide_server_files(data_dir);
    }
    Ok(ExecutorSandbox {
        jail,
        code_dir,
        home,
        killed_rounds,
    })
}
