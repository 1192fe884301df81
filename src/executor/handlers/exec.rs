//! exec::Run: run a command (not through a shell) when its guards say so, and again when a
//! requirement changes (reload).
//!
//! Guards: `creates` (skip when that file exists), `unless` (skip when that command
//! succeeds; a missing command counts as failing), `onlyif` (run only when it succeeds).
//! `reload_only` runs only on an event from a requirement. `returns` lists the exit codes
//! that count as success; `timeout` kills the command and everything it started (its
//! process group); `skip_on_fail` reports a failure as skipped.
//!
//! Dry-run: the command itself never runs, but the `unless` and `onlyif` guards do, as in
//! the reference implementation: they are how the handler reads the current state (whether
//! the command would run). Guards must therefore be read-only checks.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::executor::context::{Attrs, Context};
use crate::executor::handler::Handler;
use crate::executor::limits::{HeadTail, MAX_COMMAND_OUTPUT};
use crate::executor::protocol::Outcome;

/// At most this much of a command's output is kept as its `stdout` fact (a fact's value
/// holds at most 64 KiB).
const STDOUT_FACT: usize = 60 * 1024;

/// A command's output as a fact: without its last newline, cut (at a character) to
/// [`STDOUT_FACT`].
fn fact_text(out: &str) -> String {
    let out = out.strip_suffix('\n').unwrap_or(out);
    if out.len() <= STDOUT_FACT {
        return out.to_string();
    }
    let mut end = STDOUT_FACT;
    while !out.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}[cut: {} bytes]", &out[..end], out.len() - end)
}

/// POSIX shell-like word splitting (quotes and backslashes), no expansion.
pub fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(x) => cur.push(x),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(x @ ('"' | '\\' | '$' | '`')) => cur.push(x),
                            Some('\n') => {}
                            Some(x) => {
                                cur.push('\\');
                                cur.push(x);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(x) => cur.push(x),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(x) = chars.next()
                    && x != '\n'
                {
                    cur.push(x);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

fn run(cmd: &str, a: &Attrs, timeout: Duration) -> Result<Ran, String> {
    let words = split_words(cmd)?;
    let Some((prog, args)) = words.split_first() else {
        return Err("empty command".into());
    };
    let mut c = Command::new(prog);
    // its own process group: a timeout kills what it started too (a `sh -c` whose child
    // holds the output pipes would otherwise outlive it)
    std::os::unix::process::CommandExt::process_group(&mut c, 0);
    // and it dies with its executor (the executor runs handlers on its main thread)
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut c, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(cwd) = a
        .get("cwd")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        c.current_dir(cwd);
    }
    if let Some(path) = a
        .get("path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        c.env("PATH", path);
    }
    if let Some(env) = a.get("environment").and_then(Value::as_object) {
        for (k, v) in env {
            c.env(
                k,
                v.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| v.to_string()),
            );
        }
    }
    let mut child = c.spawn().map_err(|e| format!("can not run {prog}: {e}"))?;
    // read output in threads so a chatty command can not block on a full pipe
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    // read as it comes, keeping only the first and last part: a command printing
    // gigabytes costs no more memory than one printing a line
    let t_out = std::thread::spawn(move || HeadTail::read_all(MAX_COMMAND_OUTPUT, &mut out));
    let t_err = std::thread::spawn(move || HeadTail::read_all(MAX_COMMAND_OUTPUT, &mut err));
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() >= deadline => {
                // SAFETY: signals the process group we created for it, nothing else
                unsafe {
                    libc::kill(-(child.id() as i32), libc::SIGKILL);
                }
                let _ = child.kill();
                timed_out = true;
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    };
    Ok(Ran {
        code: status.and_then(|s| s.code()),
        stdout: t_out.join().map(|o| o.text()).unwrap_or_default(),
        stderr: t_err.join().map(|o| o.text()).unwrap_or_default(),
        timed_out,
    })
}

pub struct RunHandler;

impl RunHandler {
    fn timeout(a: &Attrs) -> Duration {
        Duration::from_secs(
            a.get("timeout")
                .and_then(Value::as_u64)
                .unwrap_or(300)
                .max(1),
        )
    }

    /// Do the guards allow running the command?
    fn allowed(ctx: &mut Context, a: &Attrs) -> Result<bool, String> {
        let s = |k: &str| {
            a.get(k)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        if let Some(creates) = s("creates")
            && std::path::Path::new(&creates).exists()
        {
            ctx.debug(
                "not running: the file it creates exists",
                &[("creates", json!(creates))],
            );
            return Ok(false);
        }
        if let Some(unless) = s("unless") {
            let ok = run(&unless, a, Self::timeout(a))
                .map(|r| r.code == Some(0))
                .unwrap_or(false);
            ctx.debug(
                "unless guard",
                &[("cmd", json!(unless)), ("succeeded", json!(ok))],
            );
            if ok {
                return Ok(false);
            }
        }
        if let Some(onlyif) = s("onlyif") {
            let ok = run(&onlyif, a, Self::timeout(a))
                .map(|r| r.code == Some(0))
                .unwrap_or(false);
            ctx.debug(
                "onlyif guard",
                &[("cmd", json!(onlyif)), ("succeeded", json!(ok))],
            );
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn execute_cmd(ctx: &mut Context, a: &Attrs, cmd: &str) -> Result<(), Outcome> {
        let returns: Vec<i64> = a
            .get("returns")
            .and_then(Value::as_array)
            .map(|l| l.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_else(|| vec![0]);
        let skip = a
            .get("skip_on_fail")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let fail = |ctx: &mut Context, msg: String| {
            ctx.error(msg, &[("cmd", json!(cmd))]);
            Err(if skip {
                Outcome::Skipped
            } else {
                Outcome::Failed
            })
        };
        match run(cmd, a, Self::timeout(a)) {
            Err(e) => fail(ctx, e),
            Ok(r) => {
                let fields = [
                    ("cmd", json!(cmd)),
                    ("exit_code", json!(r.code)),
                    ("stdout", json!(r.stdout)),
                    ("stderr", json!(r.stderr)),
                ];
                if r.timed_out {
                    return fail(
                        ctx,
                        format!("command killed after {} s", Self::timeout(a).as_secs()),
                    );
                }
                if r.code.is_some_and(|c| returns.contains(&(c as i64))) {
                    ctx.info("command ran", &fields);
                    // what the run said, for a model that waits for it
                    // (`std::getfact(run, "stdout")`); kept until the next run, which is the
                    // only one that can tell anew
                    if ctx.want_facts {
                        ctx.set_fact("exit_code", r.code.unwrap_or(0).to_string(), false);
                        ctx.set_fact("stdout", fact_text(&r.stdout), false);
                    }
                    Ok(())
                } else {
                    ctx.log("error", "command failed", &fields);
                    Err(if skip {
                        Outcome::Skipped
                    } else {
                        Outcome::Failed
                    })
                }
            }
        }
    }
}

impl Handler for RunHandler {
    fn execute(&self, ctx: &mut Context, a: &Attrs) -> Outcome {
        let command = a
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let reload_only = a
            .get("reload_only")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if a.get("purged").and_then(Value::as_bool).unwrap_or(false) {
            // nothing to undo for a command
            return if ctx.dry_run {
                Outcome::Dry
            } else {
                Outcome::Deployed
            };
        }
        let allowed = match Self::allowed(ctx, a) {
            Ok(x) => x,
            Err(e) => {
                ctx.error(e, &[]);
                return Outcome::Failed;
            }
        };
        let will_run = allowed && !reload_only;
        let will_reload = ctx.reload && !will_run;
        if ctx.dry_run {
            if will_run || will_reload {
                ctx.add_change("command", Value::Null, json!(command));
                ctx.info("a deploy would run the command", &[("cmd", json!(command))]);
            }
            return Outcome::Dry;
        }
        if will_run {
            ctx.add_change("command", Value::Null, json!(command));
            if let Err(o) = Self::execute_cmd(ctx, a, &command) {
                return o;
            }
            ctx.set_created();
        }
        if will_reload {
            let reload = a
                .get("reload")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or(&command)
                .to_string();
            ctx.add_change("reload", Value::Null, json!(reload));
            ctx.info(
                "a requirement changed: running the reload command",
                &[("cmd", json!(reload))],
            );
            if let Err(o) = Self::execute_cmd(ctx, a, &reload) {
                return o;
            }
            ctx.set_updated();
        }
        Outcome::Deployed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        assert_eq!(
            split_words("touch '/a b' \"c\\\"d\" e\\ f").unwrap(),
            vec!["touch", "/a b", "c\"d", "e f"]
        );
        assert!(split_words("echo 'x").is_err());
        assert_eq!(split_words("  ").unwrap(), Vec::<String>::new());
    }
}
