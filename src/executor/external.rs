//! Handlers shipped by modules, in any language: a long-lived process per handler code digest
//! (an executor serves one agent, so: per agent and code version), spoken to over stdin/stdout
//! in JSON lines (docs/integrations.md). The executor drives the CRUD algorithm of
//! SCHEDULER.md §6.3 and asks the process to read, create, update, delete (and reload); the
//! process answers with state, log records and errors.
//!
//! Every call has a deadline. A process that crashes, hangs past the deadline or answers
//! something that is not the protocol fails the action with a clear message and is stopped;
//! the next action starts a fresh one. The executor itself never waits forever.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::calls::{CallAnswer, ServerCall};
use super::context::{Attrs, Context};
use super::handler::{CrudHandler, HResult, HandlerError, run_crud};
use super::limits::{Line, MAX_PROTOCOL_LINE, human};
use super::protocol::{ExternalHandler, Outcome, WorkItem};
use crate::model::diff::AttributeChange;

/// The protocol version spoken (sent in `hello`).
pub const PROTOCOL: u32 = 1;

/// How long a new handler process may take to answer `hello`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// stderr kept per process, to explain a crash.
const STDERR_TAIL: usize = 4096;

/// Handler processes kept alive by one executor.
const MAX_PROCESSES: usize = 8;

/// Answers a handler's call to the server in the middle of an action ([`super::calls`]).
pub type Calls<'a> = &'a mut dyn FnMut(ServerCall) -> CallAnswer;

/// For steps where no call is answered (the plain protocol, `version_done`).
fn no_calls(c: ServerCall) -> CallAnswer {
    super::calls::refusal(
        c.call_id,
        501,
        "the server can be called only from an Inmanta handler's action (get_client())",
    )
}

/// The Python helper for handler authors (docs/integrations.md), written next to the code.
pub const PYTHON_HELPER: &str = include_str!("../../python/steward_handler.py");

/// Why a call failed: the process is unusable afterwards (it is stopped).
#[derive(Debug)]
enum CallError {
    Timeout(Duration),
    Exited(String),
    Garbage(String),
    Io(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Timeout(d) => write!(
                f,
                "the handler did not answer within {} s and was stopped",
                d.as_secs_f64().ceil()
            ),
            CallError::Exited(why) => write!(f, "the handler process exited: {why}"),
            CallError::Garbage(line) => write!(
                f,
                "the handler answered something that is not the protocol: {line}"
            ),
            CallError::Io(e) => write!(f, "talking to the handler failed: {e}"),
        }
    }
}

/// Why a handler process did not start (an import error carries the Python traceback).
struct StartError {
    message: String,
    traceback: Option<Value>,
}

impl StartError {
    fn plain(message: String) -> StartError {
        StartError {
            message,
            traceback: None,
        }
    }
}

struct HandlerProc {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// The thread collecting stderr: done once the process is gone and the pipe drained.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    next_id: u64,
    can_reload: bool,
    /// Steward's handler host for an Inmanta module (speaks `execute` and `version_done`).
    inmanta: bool,
    last_use: Instant,
    /// Its Python environment, held while it runs (reapers skip it; its code directory is
    /// held during each action, see [`ExternalPool::execute`]).
    _in_use: Vec<crate::pyenv::reap::InUse>,
}

impl HandlerProc {
    fn spawn(h: &ExternalHandler) -> Result<HandlerProc, StartError> {
        let launch = match &h.inmanta {
            Some(code) => super::inmanta::launch(h, code).map_err(StartError::plain)?,
            None => {
                let entry = h.dir.join(&h.entry);
                if !entry.is_file() {
                    return Err(StartError::plain(format!(
                        "the handler entry {} is missing",
                        entry.display()
                    )));
                }
                // the helper library lives beside the code directories
                let lib = h.dir.parent().map(|p| p.join("_lib")).unwrap_or_default();
                let (program, args) = if h.entry.ends_with(".py") {
                    let python =
                        std::env::var("STEWARD_PYTHON").unwrap_or_else(|_| "python3".into());
                    (python.into(), vec!["-u".into(), entry.into_os_string()])
                } else {
                    (entry.into_os_string(), vec![])
                };
                super::inmanta::Launch {
                    program,
                    args,
                    pythonpath: lib.into_os_string(),
                    hello: json!({}),
                    in_use: Vec::new(),
                }
            }
        };
        let in_use = launch.in_use;
        let shown = Path::new(&launch.program).display().to_string();
        let mut cmd = Command::new(&launch.program);
        cmd.args(&launch.args);
        cmd.current_dir(&h.dir)
            .env("PYTHONPATH", &launch.pythonpath)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("STEWARD_HANDLER_DIGEST", &h.digest)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // its own process group, so stopping it stops what it started too; and it dies with
        // the executor (a killed executor must not leave a hung handler behind)
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
            // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().map_err(|e| {
            StartError::plain(format!(
                "can not start the handler {shown} {:?}: {e}",
                launch.args
            ))
        })?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, lines) = channel();
        std::thread::Builder::new()
            .name("handler-stdout".into())
            .spawn(move || {
                let mut reader = BufReader::new(stdout);
                loop {
                    match super::limits::read_line_bounded(&mut reader, MAX_PROTOCOL_LINE) {
                        Ok(Line::End) => return,
                        Ok(Line::Text(line)) => {
                            if tx.send(Ok(line)).is_err() {
                                return;
                            }
                        }
                        Ok(Line::TooLong(n)) => {
                            let _ = tx.send(Err(std::io::Error::other(format!(
                                "it answered a line of {n} bytes, over the {} limit of a protocol line",
                                human(MAX_PROTOCOL_LINE)
                            ))));
                            return;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
            })
            .map_err(|e| StartError::plain(format!("can not start a reader thread: {e}")))?;
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let sink = tail.clone();
        let stderr_reader = std::thread::Builder::new()
            .name("handler-stderr".into())
            .spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let mut t = sink.lock().expect("stderr tail");
                    for &b in &buf[..n] {
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(b);
                    }
                }
            });
        let mut p = HandlerProc {
            child,
            stdin,
            lines,
            stderr: tail,
            stderr_reader: stderr_reader.ok(),
            next_id: 1,
            can_reload: false,
            inmanta: h.inmanta.is_some(),
            last_use: Instant::now(),
            _in_use: in_use,
        };
        let mut hello = json!({"op": "hello", "protocol": PROTOCOL});
        if let (Value::Object(m), Value::Object(x)) = (&mut hello, launch.hello) {
            m.extend(x);
        }
        let hello = match p.call(hello, Instant::now() + START_TIMEOUT, &mut no_calls) {
            Ok(h) => h,
            Err(e) => {
                p.stop();
                return Err(StartError::plain(format!("the handler did not start: {e}")));
            }
        };
        if hello.get("ok") != Some(&Value::Bool(true)) {
            let why = hello
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("it refused the hello")
                .to_string();
            p.stop();
            return Err(StartError {
                message: format!("the handler did not start: {why}"),
                traceback: hello.get("traceback").cloned(),
            });
        }
        p.can_reload = hello
            .get("can_reload")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(p)
    }

    fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().expect("stderr tail");
        let bytes: Vec<u8> = t.iter().copied().collect();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    fn exit_reason(&mut self) -> String {
        // the reader saw EOF: give the process a moment to be reaped
        let deadline = Instant::now() + Duration::from_millis(500);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        // what it said last is still in the pipe: let the reader drain it
        if let Some(reader) = self.stderr_reader.take() {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let status = match status {
            Some(s) => match s.code() {
                Some(c) => format!("exit status {c}"),
                None => "killed by a signal".into(),
            },
            None => "it closed its output".into(),
        };
        let tail = self.stderr_tail();
        if tail.is_empty() {
            status
        } else {
            format!("{status}; it said: {tail}")
        }
    }

    /// One request, one answer (matched by id), before `deadline`. A call the handler makes
    /// to the server meanwhile (`{"call": METHOD, "args": ..., "call_id": N}`) is answered
    /// through `calls` (`{"answer": N, "code": ..., "result": ...}`) and the wait goes on.
    fn call(
        &mut self,
        mut req: Value,
        deadline: Instant,
        calls: Calls<'_>,
    ) -> Result<Value, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        req["id"] = json!(id);
        self.last_use = Instant::now();
        let mut line = serde_json::to_string(&req).expect("json");
        line.push('\n');
        if let Err(e) = self
            .stdin
            .write_all(line.as_bytes())
            .and_then(|_| self.stdin.flush())
        {
            return Err(if e.kind() == std::io::ErrorKind::BrokenPipe {
                CallError::Exited(self.exit_reason())
            } else {
                CallError::Io(e.to_string())
            });
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(Ok(text)) => {
                    let text = text.trim();
                    if text.is_empty() {
                        continue;
                    }
                    let v: Value = match serde_json::from_str(text) {
                        Ok(v @ Value::Object(_)) => v,
                        _ => {
                            let shown: String = text.chars().take(200).collect();
                            return Err(CallError::Garbage(shown));
                        }
                    };
                    if let Some(method) = v.get("call").and_then(Value::as_str) {
                        self.answer_call(method, &v, calls)?;
                        continue;
                    }
                    match v.get("id").and_then(Value::as_u64) {
                        Some(got) if got == id => return Ok(v),
                        // a late answer to a call we gave up on: skip it
                        Some(got) if got < id => continue,
                        _ => {
                            let shown: String = text.chars().take(200).collect();
                            return Err(CallError::Garbage(format!(
                                "an answer without the request's id: {shown}"
                            )));
                        }
                    }
                }
                Ok(Err(e)) => return Err(CallError::Io(e.to_string())),
                Err(RecvTimeoutError::Timeout) => {
                    let waited = self.last_use.elapsed();
                    return Err(CallError::Timeout(waited));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CallError::Exited(self.exit_reason()));
                }
            }
        }
    }

    /// Pass a handler's call up and its answer back down.
    fn answer_call(&mut self, method: &str, v: &Value, calls: Calls<'_>) -> Result<(), CallError> {
        let call_id = v.get("call_id").and_then(Value::as_u64).unwrap_or(0);
        let a = calls(ServerCall {
            action_id: uuid::Uuid::nil(),
            call_id,
            method: method.to_string(),
            args: v.get("args").cloned().unwrap_or(Value::Null),
        });
        let mut line = serde_json::to_string(&json!({
            "answer": call_id, "code": a.code, "result": a.result,
        }))
        .expect("json");
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|_| self.stdin.flush())
            .map_err(|e| CallError::Io(e.to_string()))
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) on the process group created for this handler
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ask it to go, then make sure it went.
    fn shutdown(&mut self) {
        let _ = self.stdin.write_all(b"{\"op\":\"shutdown\"}\n");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop();
    }
}

/// The handler processes of one executor, by code digest.
#[derive(Default)]
pub struct ExternalPool {
    procs: HashMap<String, HandlerProc>,
    /// The newest model version an action was run for.
    newest: Option<i32>,
}

impl ExternalPool {
    fn take(&mut self, h: &ExternalHandler) -> Result<HandlerProc, StartError> {
        if let Some(p) = self.procs.remove(&h.digest) {
            return Ok(p);
        }
        if self.procs.len() >= MAX_PROCESSES {
            // the least recently used code version goes first
            if let Some(old) = self
                .procs
                .iter()
                .min_by_key(|(_, p)| p.last_use)
                .map(|(k, _)| k.clone())
                && let Some(mut p) = self.procs.remove(&old)
            {
                p.shutdown();
            }
        }
        HandlerProc::spawn(h)
    }

    fn put_back(&mut self, digest: &str, p: HandlerProc) {
        self.procs.insert(digest.to_string(), p);
    }

    /// Stop every handler process (the executor is going away).
    pub fn shutdown(&mut self) {
        for (_, mut p) in self.procs.drain() {
            p.shutdown();
        }
    }

    /// Run one action of `item` with its module's handler.
    pub fn execute(
        &mut self,
        ctx: &mut Context,
        item: &WorkItem,
        h: &ExternalHandler,
        calls: Calls<'_>,
    ) -> Outcome {
        // the code directory is not removed during the action (best effort: a directory
        // this executor may not write is the server's, reaped by what stored versions use)
        let _code_in_use = crate::pyenv::reap::hold(&h.dir);
        let mut proc = match self.take(h) {
            Ok(p) => p,
            Err(e) => {
                let mut fields = vec![("handler", json!(h.entry))];
                if let Some(tb) = e.traceback {
                    fields.push(("traceback", tb));
                }
                ctx.error(e.message, &fields);
                return Outcome::Unavailable;
            }
        };
        // leave the scheduler's own timeout a moment to spare: we stop the handler first
        let budget = Duration::from_secs(item.timeout.unwrap_or(300))
            .saturating_sub(Duration::from_millis(500));
        if h.inmanta.is_some() {
            return self.execute_inmanta(ctx, item, h, proc, budget, calls);
        }
        // a handler of the plain protocol has no facts to be asked for (it may report them
        // with its answers, `"facts"`)
        if item.kind == super::protocol::ActionKind::Facts {
            self.put_back(&h.digest, proc);
            return Outcome::Dry;
        }
        let crud = ExternalCrud {
            proc: Mutex::new(&mut proc),
            item,
            deadline: Instant::now() + budget.max(Duration::from_millis(500)),
            broken: Mutex::new(None),
        };
        let outcome = run_crud(&crud, ctx, &item.resource.attributes);
        let broken = crud.broken.into_inner().expect("broken");
        match broken {
            None => self.put_back(&h.digest, proc),
            Some(why) => {
                // it is unusable now: the next action starts a fresh one
                proc.stop();
                ctx.error(why.clone(), &[("handler", json!(h.entry))]);
                return Outcome::Failed;
            }
        }
        outcome
    }
}

impl ExternalPool {
    /// One action of an Inmanta handler: the host runs the handler's own logic, in one call.
    fn execute_inmanta(
        &mut self,
        ctx: &mut Context,
        item: &WorkItem,
        h: &ExternalHandler,
        mut proc: HandlerProc,
        budget: Duration,
        calls: Calls<'_>,
    ) -> Outcome {
        let r = &item.resource;
        let op = if item.kind == super::protocol::ActionKind::Facts {
            "facts"
        } else {
            "execute"
        };
        let req = json!({
            "op": op,
            "resource": {"id": r.id.0, "type": r.type_name, "agent": r.agent,
                         "attributes": r.attributes, "requires": r.requires},
            "dry_run": ctx.dry_run,
            "reload": ctx.reload,
            "version": item.version,
            "action_id": item.action_id,
            "environment": item.environment,
        });
        let action_id = item.action_id;
        let mut in_action = |mut c: ServerCall| {
            c.action_id = action_id;
            calls(c)
        };
        match proc.call(
            req,
            Instant::now() + budget.max(Duration::from_millis(500)),
            &mut in_action,
        ) {
            Ok(answer) => {
                self.put_back(&h.digest, proc);
                super::inmanta::apply_answer(ctx, &answer)
            }
            Err(e) => {
                // it is unusable now: the next action starts a fresh one
                proc.stop();
                ctx.error(e.to_string(), &[("handler", json!(h.entry))]);
                Outcome::Failed
            }
        }
    }

    /// An action of `version` starts: when it is newer than any before, the versions before
    /// are done.
    pub fn newer_version(&mut self, version: i32) {
        match self.newest {
            Some(n) if n >= version => {}
            Some(n) => {
                self.newest = Some(version);
                self.version_done(n);
            }
            None => self.newest = Some(version),
        }
    }

    /// The deploy of `version` is done: Inmanta handler hosts drop the cache entries bound to
    /// it (`@cache(for_version=True)`). Returns how many entries went.
    pub fn version_done(&mut self, version: i32) -> u64 {
        let mut dropped = 0;
        let mut broken = vec![];
        for (digest, p) in &mut self.procs {
            if !p.inmanta {
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            match p.call(
                json!({"op": "version_done", "version": version}),
                deadline,
                &mut no_calls,
            ) {
                Ok(a) => dropped += a.get("dropped").and_then(Value::as_u64).unwrap_or(0),
                Err(_) => broken.push(digest.clone()),
            }
        }
        for d in broken {
            if let Some(mut p) = self.procs.remove(&d) {
                p.stop();
            }
        }
        dropped
    }
}

/// Log records of a handler's answer (`logs`: level, message, fields) into `ctx`.
pub(super) fn log_records(ctx: &mut Context, answer: &Value) {
    for l in answer
        .get("logs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let level = l.get("level").and_then(Value::as_str).unwrap_or("info");
        let level = match level {
            "debug" | "info" | "warning" | "error" => level,
            "warn" => "warning",
            "critical" => "error",
            _ => "info",
        };
        let message = l
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let fields: Vec<(String, Value)> = l
            .get("fields")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let borrowed: Vec<(&str, Value)> = fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        ctx.log(level, message, &borrowed);
    }
}

/// The CRUD steps of one action, each a call to the handler process.
struct ExternalCrud<'a, 'p> {
    proc: Mutex<&'p mut HandlerProc>,
    item: &'a WorkItem,
    deadline: Instant,
    /// Set when the process failed the protocol (crash, hang, nonsense).
    broken: Mutex<Option<String>>,
}

impl ExternalCrud<'_, '_> {
    fn request(&self, ctx: &mut Context, op: &str, extra: Value) -> HResult<Value> {
        let r = &self.item.resource;
        let mut req = json!({
            "op": op,
            "resource": {"id": r.id.0, "type": r.type_name, "agent": r.agent, "attributes": r.attributes},
            "dry_run": ctx.dry_run,
            "reload": ctx.reload,
            "version": self.item.version,
        });
        if let (Value::Object(m), Value::Object(x)) = (&mut req, extra) {
            m.extend(x);
        }
        let answer = {
            let mut p = self.proc.lock().expect("handler process");
            p.call(req, self.deadline, &mut no_calls)
        };
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                let why = e.to_string();
                *self.broken.lock().expect("broken") = Some(why.clone());
                return Err(HandlerError::Failed(why));
            }
        };
        log_records(ctx, &answer);
        super::inmanta::take_facts(ctx, &answer);
        if let Some(reason) = answer.get("skip").and_then(Value::as_str) {
            return Err(HandlerError::Skip(reason.to_string()));
        }
        if let Some(reason) = answer.get("skip_for_dependencies").and_then(Value::as_str) {
            return Err(HandlerError::SkipForDependencies(reason.to_string()));
        }
        if answer.get("ok") != Some(&Value::Bool(true)) {
            let msg = answer
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("the handler reported a failure without a message");
            return Err(HandlerError::Failed(msg.to_string()));
        }
        Ok(answer)
    }
}

impl CrudHandler for ExternalCrud<'_, '_> {
    fn read(&self, ctx: &mut Context, current: &mut Attrs) -> HResult<bool> {
        let a = self.request(ctx, "read", json!({}))?;
        match a.get("state") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Object(state)) => {
                for (k, v) in state {
                    current.insert(k.clone(), v.clone());
                }
                Ok(true)
            }
            Some(other) => Err(HandlerError::Failed(format!(
                "read answered a state that is not an object: {other}"
            ))),
        }
    }

    fn create(&self, ctx: &mut Context, _desired: &Attrs) -> HResult<()> {
        self.request(ctx, "create", json!({})).map(|_| ())
    }

    fn update(
        &self,
        ctx: &mut Context,
        changes: &BTreeMap<String, AttributeChange>,
        _desired: &Attrs,
    ) -> HResult<()> {
        self.request(ctx, "update", json!({"changes": changes}))
            .map(|_| ())
    }

    fn delete(&self, ctx: &mut Context, _desired: &Attrs) -> HResult<()> {
        self.request(ctx, "delete", json!({})).map(|_| ())
    }

    fn reload(&self, ctx: &mut Context, _desired: &Attrs) -> HResult<()> {
        self.request(ctx, "reload", json!({})).map(|_| ())
    }

    fn can_reload(&self) -> bool {
        self.proc.lock().expect("handler process").can_reload
    }
}
