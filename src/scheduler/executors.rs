//! The executor processes of one environment: `steward executor` children, each running one
//! action at a time, reused across actions, per agent, with a cap on their number. Their
//! replies and their deaths arrive on one channel; a process that dies is simply forgotten
//! (the next action for its agent starts a new one).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use tokio::io::{AsyncWriteExt, BufReader};

use super::lines::Line;
use crate::executor::limits::{MAX_PROTOCOL_LINE, human};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::agents::AgentHub;
use super::ssh::{SshLink, SshOptions, SshTarget};
use crate::executor::protocol::{Reply, Request, WorkItem};
use crate::model::placement::Placement;

pub type ProcId = u64;

/// How many actions an executor on an SSH target is given at once: one it works on, the
/// others wait in its input (see [`Pool::max_out`]).
pub const SSH_DEPTH: usize = 4;

/// How many actions an executor on this machine is given at once: the one it works on
/// and the next ones, so that it starts the next as soon as it has sent a result, without
/// waiting for the scheduler to take that result and answer (a round trip through two
/// processes that, at thousands of actions a second, was a third of each action's time).
/// Four rather than two: with two, the scheduler's answer to one result still came late for
/// the action after next (examples/bench_deploy.rs, interleaved runs: a no-change repair of
/// 10,000 0.58-0.60 -> 0.42-0.43 s, a first deploy 1.32-1.43 -> 1.23 s). What waits in an
/// executor's input does not start once its agent is paused or the environment halted:
/// the scheduler withdraws it ([`Pool::withdraw`]).
pub const LOCAL_DEPTH: usize = 4;

#[derive(Debug)]
pub enum PoolEvent {
    Reply(ProcId, Reply),
    /// The process closed its output: it exited or crashed.
    Exited(ProcId, String),
    /// Connecting to an SSH target (and shipping the executor there) ended; its agents'
    /// actions may start (or fail with the error).
    SshConnected(String, Result<(SshLink, String), String>),
    /// The answer to a handler's call ([`Reply::Call`]), made in a task of its own: it goes
    /// to the executor that asked ([`Pool::queue_answer`]).
    Answer(ProcId, crate::executor::calls::CallAnswer),
}

/// A request as one line of an executor's input.
fn request_line(r: &Request) -> String {
    let mut line = serde_json::to_string(r).expect("json");
    line.push('\n');
    line
}

/// Write `line` to an executor's input; false if it is closed (the executor exited).
async fn write_line(stdin: &mut ChildStdin, line: &str) -> bool {
    stdin.write_all(line.as_bytes()).await.is_ok() && stdin.flush().await.is_ok()
}

/// An SSH target as the pool knows it. Connecting runs in a task of its own, so a host
/// that takes its time holds up only its own agents' actions.
enum SshState {
    Connecting,
    /// the connection and the path of the executor shipped there
    Ready(SshLink, String),
    /// the last attempt failed: the next action reports it, the one after tries again
    Failed(String),
}

struct Proc {
    agent: String,
    child: Child,
    stdin: ChildStdin,
    /// actions sent to it and not finished: at most [`LOCAL_DEPTH`], and [`SSH_DEPTH`]
    /// over SSH (the others wait in its input while it works on the first: see
    /// [`Pool::max_out`])
    out: usize,
    last_used: Instant,
    /// An executor on a target over SSH: the connection, and its pid there (from its
    /// `Ready`), to kill its process group there (killing the local ssh only closes the
    /// channel).
    ssh: Option<(SshLink, Arc<AtomicU32>)>,
}

/// An action handed to an external agent process (through the [`AgentHub`]): a slot that
/// stands for an executor, so the scheduler treats both alike.
struct RemoteSlot {
    agent: String,
    action: Option<Uuid>,
}

pub struct Pool {
    binary: PathBuf,
    max: usize,
    procs: HashMap<ProcId, Proc>,
    next: ProcId,
    tx: mpsc::UnboundedSender<PoolEvent>,
    /// where each agent's executor runs (absent: on this machine)
    placements: HashMap<String, Placement>,
    /// external agents: the hub and the environment they belong to
    hub: Option<(AgentHub, Uuid)>,
    remote: HashMap<ProcId, RemoteSlot>,
    /// SSH: how to connect, and each target's connection (with the executor shipped there)
    ssh_options: SshOptions,
    ssh_targets: HashMap<String, SshState>,
    /// the environment's agent_parallelism, which an external agent process enforces
    parallelism: usize,
    /// how many actions one local executor is given at once ([`LOCAL_DEPTH`])
    local_depth: usize,
    /// how executors on this machine are confined, and their HOME
    jail: crate::sandbox::Jail,
    home: Option<PathBuf>,
    /// More variables for local executors (an agent's cache policy).
    extra_env: Vec<(String, String)>,
    /// Answers to handlers' calls, to write to their executors ([`Pool::send_answers`]).
    answers: Vec<(ProcId, crate::executor::calls::CallAnswer)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("can not start an executor ({binary}): {detail}")]
    Spawn { binary: String, detail: String },
    #[error("all {0} executors are busy")]
    Full(usize),
    #[error("executor {0} is gone")]
    Gone(ProcId),
    #[error("agent {0} runs in an external process, and none is connected")]
    AgentDown(String),
    #[error("agent {agent} at {target}: {detail}")]
    Ssh {
        agent: String,
        target: String,
        detail: String,
    },
}

impl Pool {
    pub fn new(binary: PathBuf, max: usize) -> (Pool, mpsc::UnboundedReceiver<PoolEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Pool {
                binary,
                max: max.max(1),
                procs: HashMap::new(),
                next: 1,
                tx,
                placements: HashMap::new(),
                hub: None,
                remote: HashMap::new(),
                ssh_options: SshOptions::default(),
                ssh_targets: HashMap::new(),
                parallelism: 1,
                local_depth: LOCAL_DEPTH,
                jail: crate::sandbox::Jail {
                    die_with_parent: true,
                    ..Default::default()
                },
                home: None,
                extra_env: Vec::new(),
                answers: Vec::new(),
            },
            rx,
        )
    }

    /// Give local executors these variables too (on top of the passed environment).
    pub fn set_extra_env(&mut self, vars: Vec<(String, String)>) {
        self.extra_env = vars;
    }

    /// Let this pool hand actions of `external` agents to processes connected to `hub`.
    pub fn with_hub(mut self, env: Uuid, hub: AgentHub) -> Pool {
        hub.attach(env, self.tx.clone());
        self.hub = Some((hub, env));
        self
    }

    /// Run the executors started on this machine from now on in `jail`, with `home` as their
    /// HOME (the environment's sandbox, see `env/isolation.rs`).
    pub fn set_sandbox(&mut self, jail: crate::sandbox::Jail, home: PathBuf) {
        self.jail = jail;
        self.home = Some(home);
    }

    /// How many actions of one agent run at once (the environment's `agent_parallelism`).
    pub fn set_parallelism(&mut self, n: usize) {
        self.parallelism = n.max(1);
    }

    /// How many actions of `agent` the scheduler may have out at once: its parallelism, and
    /// for an external agent [`super::agents::AHEAD`] more, handed out ahead so that the
    /// process starts the next as soon as a slot frees, without waiting for a round trip to
    /// the server.
    /// Each executor gets its next actions while it works on one (it reads each when done
    /// with the one before; [`LOCAL_DEPTH`] at most, [`SSH_DEPTH`] over SSH): round trips
    /// overlap the work, and still at most `agent_parallelism` actions run at once.
    pub fn max_out(&self, agent: &str) -> usize {
        match self.placement(agent) {
            Placement::External => self.parallelism + super::agents::AHEAD,
            placement => self.parallelism * self.depth(&placement),
        }
    }

    /// How many actions one executor at `placement` is given at once.
    fn depth(&self, placement: &Placement) -> usize {
        match placement {
            Placement::Ssh(_) => SSH_DEPTH,
            Placement::Local => self.local_depth,
            Placement::External => 1,
        }
    }

    /// Give each executor on this machine one action at a time (an agent process, which
    /// counts its own slots and runs each action's timeout from when it sends it).
    pub fn one_action_per_executor(&mut self) {
        self.local_depth = 1;
    }

    /// The parallelism set by [`Pool::set_parallelism`].
    pub fn parallelism(&self) -> usize {
        self.parallelism
    }

    /// Tell external agent processes about the actions handed to them since the last call
    /// (one wake-up for all that one dispatch handed out).
    pub fn wake_agents(&self) {
        if let Some((hub, env)) = &self.hub
            && !self.remote.is_empty()
        {
            hub.wake(*env);
        }
    }

    /// Where each agent's executor runs, from the settings and the model.
    pub fn set_placements(&mut self, placements: HashMap<String, Placement>) {
        self.placements = placements;
    }

    /// How SSH targets are reached (known_hosts, key, timeout); a change drops the
    /// connections, so the next action connects with the new options.
    pub fn set_ssh_options(&mut self, opts: SshOptions) {
        let same = self.ssh_options.known_hosts == opts.known_hosts
            && self.ssh_options.identity == opts.identity
            && self.ssh_options.connect_timeout == opts.connect_timeout
            && self.ssh_options.allowed == opts.allowed;
        if !same {
            self.ssh_targets.clear();
            self.ssh_options = opts;
        }
    }

    pub fn placement(&self, agent: &str) -> Placement {
        self.placements
            .get(agent)
            .cloned()
            .unwrap_or(Placement::Local)
    }

    /// Can an action of `agent` start now? An external agent needs a connected primary,
    /// an SSH one its connection (or the error it ended in); until then its actions wait
    /// in the queue.
    pub fn is_ready(&self, agent: &str) -> bool {
        match self.placement(agent) {
            Placement::External => self
                .hub
                .as_ref()
                .is_some_and(|(hub, env)| hub.is_up(*env, agent)),
            Placement::Ssh(uri) => matches!(
                self.ssh_targets.get(&uri),
                Some(SshState::Ready(..) | SshState::Failed(_))
            ),
            Placement::Local => true,
        }
    }

    /// [`Pool::is_ready`], starting to connect to an SSH target that needs it.
    pub fn make_ready(&mut self, agent: &str) -> bool {
        if let Placement::Ssh(uri) = self.placement(agent) {
            let usable = match self.ssh_targets.get(&uri) {
                Some(SshState::Ready(link, _)) => link.is_alive(),
                Some(_) => true,
                None => false,
            };
            if !usable {
                self.connect(uri);
            }
        }
        self.is_ready(agent)
    }

    /// Connect to an SSH target and ship the executor there, in a task; the outcome comes
    /// back as [`PoolEvent::SshConnected`].
    fn connect(&mut self, uri: String) {
        self.ssh_targets.insert(uri.clone(), SshState::Connecting);
        let (opts, binary, tx) = (
            self.ssh_options.clone(),
            self.binary.clone(),
            self.tx.clone(),
        );
        tokio::spawn(async move {
            let outcome = async {
                let target = SshTarget::parse(&uri).map_err(|e| e.to_string())?;
                let link = SshLink::connect(&target, &opts)
                    .await
                    .map_err(|e| e.to_string())?;
                let shipped = link
                    .ensure_executor(&binary)
                    .await
                    .map_err(|e| e.to_string())?;
                if shipped.bytes_uploaded > 0 {
                    tracing::info!(target = %uri, bytes = shipped.bytes_uploaded, path = %shipped.remote_path, "executor shipped over SSH");
                }
                Ok((link, shipped.remote_path))
            }
            .await;
            let _ = tx.send(PoolEvent::SshConnected(uri, outcome));
        });
    }

    /// The outcome of [`Pool::connect`].
    pub fn ssh_connected(&mut self, uri: String, outcome: Result<(SshLink, String), String>) {
        // options changed meanwhile: this connection used the old ones
        if !matches!(self.ssh_targets.get(&uri), Some(SshState::Connecting)) {
            return;
        }
        let state = match outcome {
            Ok((link, path)) => SshState::Ready(link, path),
            Err(e) => {
                tracing::warn!(target = %uri, "SSH: {e}");
                SshState::Failed(e)
            }
        };
        self.ssh_targets.insert(uri, state);
    }

    /// An action in flight whose agent is down: it waits for the agent, and its handler
    /// timeout does not run meanwhile.
    pub fn is_waiting(&self, id: ProcId) -> bool {
        self.remote
            .get(&id)
            .is_some_and(|slot| !self.is_ready(&slot.agent))
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    pub fn pids(&self, agent: &str) -> Vec<u32> {
        self.procs
            .values()
            .filter(|p| p.agent == agent)
            .filter_map(|p| p.child.id())
            .collect()
    }

    /// Start an executor for `agent` now, left idle for its first action, when the agent's
    /// executors are local ones, it has none, and the pool has room: a start that will
    /// almost surely deploy next (`steward deploy`'s, from its snapshot) starts its process
    /// (exec, loading, handshake: ~10 ms) while it waits for the version, not after.
    /// The same spawn as [`Pool::acquire`]'s, with the sandbox it has.
    pub async fn prestart(&mut self, agent: &str) -> Result<(), PoolError> {
        if self.placement(agent) != Placement::Local
            || self.procs.values().any(|p| p.agent == agent)
            || self.procs.len() >= self.max
        {
            return Ok(());
        }
        let id = self.acquire(agent).await?;
        self.release(id);
        Ok(())
    }

    /// An idle executor of `agent`, started if needed (an idle one of another agent may be
    /// stopped to stay under the cap).
    pub async fn acquire(&mut self, agent: &str) -> Result<ProcId, PoolError> {
        let placement = self.placement(agent);
        match &placement {
            Placement::Local | Placement::Ssh(_) => {}
            Placement::External => {
                if !self.is_ready(agent) {
                    return Err(PoolError::AgentDown(agent.to_string()));
                }
                let id = self.next;
                self.next += 1;
                self.remote.insert(
                    id,
                    RemoteSlot {
                        agent: agent.to_string(),
                        action: None,
                    },
                );
                return Ok(id);
            }
        }
        if let Some((id, p)) = self
            .procs
            .iter_mut()
            .find(|(_, p)| p.agent == agent && p.out == 0)
        {
            p.out = 1;
            p.last_used = Instant::now();
            return Ok(*id);
        }
        // with `agent_parallelism` executors at work: the next action waits in the input of
        // one of them (see max_out)
        let depth = self.depth(&placement);
        if self.procs.values().filter(|p| p.agent == agent).count() >= self.parallelism
            && let Some((id, p)) = self
                .procs
                .iter_mut()
                .filter(|(_, p)| p.agent == agent && p.out < depth)
                .min_by_key(|(id, p)| (p.out, **id))
        {
            p.out += 1;
            p.last_used = Instant::now();
            return Ok(*id);
        }
        if self.procs.len() >= self.max {
            let lru = self
                .procs
                .iter()
                .filter(|(_, p)| p.out == 0)
                .min_by_key(|(_, p)| p.last_used)
                .map(|(id, _)| *id);
            match lru {
                Some(id) => self.stop(id),
                None => return Err(PoolError::Full(self.max)),
            }
        }
        match placement {
            Placement::Ssh(uri) => {
                let ssh_error = |detail: String| PoolError::Ssh {
                    agent: agent.to_string(),
                    target: uri.clone(),
                    detail,
                };
                let (link, remote_binary) = match self.ssh_targets.get(&uri) {
                    Some(SshState::Ready(link, path)) => (link.clone(), path.clone()),
                    Some(SshState::Failed(_)) => {
                        // reported once; the next action connects again
                        let Some(SshState::Failed(e)) = self.ssh_targets.remove(&uri) else {
                            unreachable!("matched above")
                        };
                        return Err(ssh_error(e));
                    }
                    _ => return Err(ssh_error("not connected yet".into())),
                };
                // its environment is the SSH client's own (SSH_ENVIRONMENT): not cleared
                let command = link.executor_command(&remote_binary, agent);
                self.spawn(agent, command, Some(link))
            }
            _ => {
                let mut command = Command::new(&self.binary);
                command
                    .arg("executor")
                    .arg("--agent")
                    .arg(agent)
                    // handlers run model-controlled code: none of the server's secrets
                    .env_clear()
                    .envs(crate::executor::passed_environment())
                    .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit());
                if let Some(home) = &self.home {
                    command.env("HOME", home).current_dir(home);
                }
                if let Some(id) = self.jail.identity {
                    let name = format!("steward-{}", id.uid);
                    command.env("USER", &name).env("LOGNAME", &name);
                }
                // who it runs as, what it sees, and that it dies with the server
                self.jail.apply(&mut command);
                self.spawn(agent, command, None)
            }
        }
    }

    fn spawn(
        &mut self,
        agent: &str,
        mut command: Command,
        link: Option<SshLink>,
    ) -> Result<ProcId, PoolError> {
        command
            .kill_on_drop(true)
            // its own process group: a kill reaches the commands its handlers started too
            .process_group(0);
        // it dies with the server: after a kill -9 of the server, a restarted one must not
        // find the old executor still applying a resource it is about to apply again.
        // (The death signal follows the thread that spawned it: schedulers spawn from
        // runtime worker threads, which live as long as the server.)
        // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|e| PoolError::Spawn {
            binary: self.binary.display().to_string(),
            detail: e.to_string(),
        })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let id = self.next;
        self.next += 1;
        let tx = self.tx.clone();
        let remote_pid = Arc::new(AtomicU32::new(0));
        let seen_pid = remote_pid.clone();
        tokio::spawn(async move {
            let mut out = BufReader::new(stdout);
            loop {
                match super::lines::next_line(&mut out, MAX_PROTOCOL_LINE).await {
                    Ok(Line::TooLong(n)) => {
                        let _ = tx.send(PoolEvent::Exited(
                            id,
                            format!(
                                "executor sent a line of {n} bytes, over the {} limit of a protocol line (stopped)",
                                human(MAX_PROTOCOL_LINE)
                            ),
                        ));
                        return;
                    }
                    Ok(Line::Text(line)) => match serde_json::from_str::<Reply>(&line) {
                        Ok(r) => {
                            if let Reply::Ready { pid } = &r {
                                seen_pid.store(*pid, Ordering::Relaxed);
                            }
                            if tx.send(PoolEvent::Reply(id, r)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            // an SSH target that refused to start it says why in that line
                            let why = match line.strip_prefix("steward-refused ") {
                                Some(why) => why.chars().take(500).collect(),
                                None => format!("executor sent an unreadable line: {e}"),
                            };
                            let _ = tx.send(PoolEvent::Exited(id, why));
                            return;
                        }
                    },
                    Ok(Line::End) => {
                        let _ = tx.send(PoolEvent::Exited(id, "executor exited".into()));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(PoolEvent::Exited(
                            id,
                            format!("executor output failed: {e}"),
                        ));
                        return;
                    }
                }
            }
        });
        self.procs.insert(
            id,
            Proc {
                agent: agent.to_string(),
                child,
                stdin,
                out: 1,
                last_used: Instant::now(),
                ssh: link.map(|l| (l, remote_pid)),
            },
        );
        Ok(id)
    }

    /// Hand a work item to an acquired executor.
    pub async fn send(&mut self, id: ProcId, mut item: WorkItem) -> Result<(), PoolError> {
        // over SSH: the module's handler code goes to the target too (by digest, once)
        if let Some(Some((link, _))) = self.procs.get(&id).map(|p| p.ssh.clone()) {
            item.at_target = true;
            if let Some(h) = &mut item.handler {
                let code_dir = h.dir.parent().map(PathBuf::from).unwrap_or_default();
                match link.ensure_code(&code_dir, &h.digest).await {
                    Ok(_) => h.dir = PathBuf::from(link.remote_dir_for_code(&h.digest)),
                    Err(e) => {
                        self.kill(id);
                        return Err(PoolError::Ssh {
                            agent: self.remote_agent(id),
                            target: link.target().to_string(),
                            detail: format!("shipping handler code {}: {e}", h.digest),
                        });
                    }
                }
            }
        }
        if let Some(slot) = self.remote.get_mut(&id) {
            let (hub, env) = self.hub.as_ref().ok_or(PoolError::Gone(id))?;
            slot.action = Some(item.action_id);
            // it runs where the model routes its agent
            item.at_target = true;
            hub.assign(*env, &slot.agent, id, item, self.parallelism);
            return Ok(());
        }
        let p = self.procs.get_mut(&id).ok_or(PoolError::Gone(id))?;
        if !write_line(&mut p.stdin, &request_line(&Request::Work(Box::new(item)))).await {
            self.kill(id);
            return Err(PoolError::Gone(id));
        }
        Ok(())
    }

    /// Ask the executor `id` not to start `action_id` if it has not started it yet: it
    /// answers [`Reply::Withdrawn`] if so, and otherwise runs it (or ran it) as usual. For an
    /// external agent, the process that holds the action does the same
    /// ([`AgentHub::withdraw`]). False when the request could not be made (an executor that
    /// is gone: its exit is reported on its own).
    pub async fn withdraw(&mut self, id: ProcId, action_id: Uuid) -> bool {
        if self.remote.contains_key(&id) {
            return self
                .hub
                .as_ref()
                .is_some_and(|(hub, _)| hub.withdraw(action_id));
        }
        let Some(p) = self.procs.get_mut(&id) else {
            return false;
        };
        // a closed input means it exited, which its output reports
        write_line(
            &mut p.stdin,
            &request_line(&Request::Withdraw { action_id }),
        )
        .await
    }

    /// The deploy of `version` is done: every executor of this machine or an SSH target
    /// hears of it (handlers drop what they cached for it). External agent processes do not:
    /// their executors drop it when an action of a newer version starts.
    pub async fn version_done(&mut self, version: i32) {
        let line = request_line(&Request::VersionDone { version });
        for p in self.procs.values_mut() {
            // a closed input means it exited, which its output reports
            write_line(&mut p.stdin, &line).await;
        }
    }

    /// Where events for this pool go (a task answering a handler's call sends its
    /// [`PoolEvent::Answer`] there).
    pub fn events(&self) -> mpsc::UnboundedSender<PoolEvent> {
        self.tx.clone()
    }

    /// An answer to a handler's call, written by the next [`Pool::send_answers`].
    pub fn queue_answer(&mut self, id: ProcId, a: crate::executor::calls::CallAnswer) {
        self.answers.push((id, a));
    }

    /// Write the queued answers to their executors (one that exited meanwhile gets none; its
    /// exit is reported on its own).
    pub async fn send_answers(&mut self) {
        for (id, a) in std::mem::take(&mut self.answers) {
            let Some(p) = self.procs.get_mut(&id) else {
                continue;
            };
            write_line(&mut p.stdin, &request_line(&Request::Answer(a))).await;
        }
    }

    /// The executor finished its action: it is idle again.
    pub fn release(&mut self, id: ProcId) {
        if self.remote.remove(&id).is_some() {
            return;
        }
        if let Some(p) = self.procs.get_mut(&id) {
            p.out = p.out.saturating_sub(1);
            p.last_used = Instant::now();
        }
    }

    fn remote_agent(&self, id: ProcId) -> String {
        self.procs
            .get(&id)
            .map(|p| p.agent.clone())
            .unwrap_or_default()
    }

    /// Kill an executor and whatever its handler started (a hung handler).
    pub fn kill(&mut self, id: ProcId) {
        if let Some(slot) = self.remote.remove(&id) {
            if let (Some((hub, _)), Some(action)) = (&self.hub, slot.action) {
                hub.cancel(action);
            }
            return;
        }
        if let Some(mut p) = self.procs.remove(&id) {
            // on an SSH target: its process group there
            if let Some((link, pid)) = p.ssh.take() {
                let pid = pid.load(Ordering::Relaxed);
                if pid > 1 {
                    tokio::spawn(async move {
                        if let Err(e) = link.kill_remote(pid).await {
                            tracing::warn!(target = %link.target(), pid, "killing a remote executor: {e}");
                        }
                    });
                }
            }
            if let Some(pid) = p.child.id() {
                // SAFETY: kill(2) on a process group we created; no memory is involved
                unsafe {
                    libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
                }
            }
            let _ = p.child.start_kill();
        }
    }

    /// Forget an executor that exited on its own.
    pub fn forget(&mut self, id: ProcId) {
        self.remote.remove(&id);
        self.procs.remove(&id);
    }

    fn stop(&mut self, id: ProcId) {
        // closing stdin ends its loop; kill_on_drop covers a stuck one
        if let Some(p) = self.procs.remove(&id) {
            drop(p.stdin);
            let mut child = p.child;
            tokio::spawn(async move {
                if tokio::time::timeout(std::time::Duration::from_secs(3), child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.start_kill();
                }
            });
        }
    }

    /// Stop idle executors unused for `idle` (reaping).
    pub fn reap(&mut self, idle: std::time::Duration) {
        let old: Vec<ProcId> = self
            .procs
            .iter()
            .filter(|(_, p)| p.out == 0 && p.last_used.elapsed() > idle)
            .map(|(id, _)| *id)
            .collect();
        for id in old {
            self.stop(id);
        }
    }

    /// Stop every executor and wait until they are gone: an executor busy with an action
    /// gets `grace` to finish it, then its process group is killed. Used when the
    /// environment moves to another replica, which must not find an action of ours still
    /// running when it starts its own.
    pub async fn shutdown_and_wait(&mut self, grace: std::time::Duration) {
        let ids: Vec<ProcId> = self.remote.keys().copied().collect();
        for id in ids {
            self.kill(id);
        }
        let procs: Vec<Proc> = self.procs.drain().map(|(_, p)| p).collect();
        let waits = procs.into_iter().map(|p| async move {
            let Proc {
                stdin,
                mut child,
                ssh,
                ..
            } = p;
            drop(stdin);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                if let Some((link, pid)) = ssh {
                    let pid = pid.load(Ordering::Relaxed);
                    if pid > 1 {
                        let _ = link.kill_remote(pid).await;
                    }
                }
                if let Some(pid) = child.id() {
                    // SAFETY: kill(2) on a process group we created; no memory is involved
                    unsafe {
                        libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
                    }
                }
                let _ = child.kill().await;
            }
        });
        futures_util::future::join_all(waits).await;
    }

    pub fn shutdown(&mut self) {
        let ids: Vec<ProcId> = self.procs.keys().copied().collect();
        for id in ids {
            self.stop(id);
        }
    }
}
