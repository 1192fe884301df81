//! The SSH transport for agentless targets (issue 13) against a real OpenSSH server on
//! loopback (`ssh_support`): host keys checked strictly with nothing touched on refusal,
//! unreachable hosts failing within the timeout, the executor and handler code shipped once by
//! hash, and real work items applied by a remote executor over one reused connection.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use steward::executor::protocol::{
    ActionKind, Change, ExternalHandler, Outcome, Reply, Request, WorkItem, WorkResult,
};
use steward::scheduler::ssh::{SshAllowed, SshError, SshLink, SshOptions, SshTarget};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::ssh_support::{Silent, Sshd, alive, closed_port, keygen, pids_with_cmdline};
use super::support::{exec_run, fs_file, steward_bin};

async fn link(sshd: &Sshd) -> SshLink {
    SshLink::connect(&sshd.target(), &sshd.options())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}\nsshd log:\n{}", sshd.log()))
}

/// A remote executor as the scheduler's pool drives it: work lines in, replies out.
struct RemoteExecutor {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    pid: u32,
}

impl RemoteExecutor {
    async fn start(link: &SshLink, remote_binary: &str, agent: &str) -> RemoteExecutor {
        let mut cmd = link.executor_command(remote_binary, agent);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let pid = match Self::reply_of(&mut lines, 30).await {
            Some(Reply::Ready { pid }) => pid,
            other => panic!("expected Ready, got {other:?}"),
        };
        RemoteExecutor {
            child,
            stdin,
            lines,
            pid,
        }
    }

    async fn reply_of(lines: &mut Lines<BufReader<ChildStdout>>, secs: u64) -> Option<Reply> {
        let line = tokio::time::timeout(Duration::from_secs(secs), lines.next_line())
            .await
            .expect("executor answers in time")
            .expect("executor output");
        line.map(|l| serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l}: {e}")))
    }

    async fn send(&mut self, req: &Request) {
        let mut line = serde_json::to_string(req).unwrap();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn work(&mut self, item: WorkItem) -> WorkResult {
        self.send(&Request::Work(Box::new(item))).await;
        match Self::reply_of(&mut self.lines, 60).await {
            Some(Reply::Result(r)) => *r,
            other => panic!("expected a Result, got {other:?}"),
        }
    }
}

fn item(kind: ActionKind, resource: steward::model::Resource) -> WorkItem {
    WorkItem {
        action_id: uuid::Uuid::new_v4(),
        kind,
        resource,
        version: 1,
        reload: false,
        handler: None,
        timeout: Some(60),
        at_target: true,
        environment: None,
        want_facts: false,
    }
}

fn assert_refused_touching_nothing(sshd: &Sshd, known_hosts: &Path, before: &str) {
    assert!(
        sshd.files_in_home().is_empty(),
        "nothing may happen on a host that failed its key check: {:?}",
        sshd.files_in_home()
    );
    assert_eq!(
        std::fs::read_to_string(known_hosts).unwrap(),
        before,
        "known_hosts is only read"
    );
    assert_eq!(sshd.sessions(), 0, "no session was opened");
}

#[tokio::test]
async fn ssh_link_connects_once_and_every_command_reuses_it() {
    let sshd = Sshd::start();
    let l = link(&sshd).await;
    assert!(l.is_alive());
    assert_eq!(l.remote().home, sshd.home.to_str().unwrap());
    assert_eq!(l.remote().os, "Linux");
    assert_eq!(
        l.remote_dir_for_code("abc"),
        format!("{}/.cache/steward/code/abc", sshd.home.display())
    );
    // commands on the link, and a clone of it
    l.kill_remote(999_999).await.unwrap();
    l.clone().kill_remote(999_998).await.unwrap();
    assert_eq!(sshd.logins(), 1, "one connection: {}", sshd.log());
    assert_eq!(sshd.sessions(), 3, "the probe and two commands");
    // pids that can not be an executor's are refused, not sent to kill(1)
    assert!(l.kill_remote(1).await.is_err());
    assert!(l.kill_remote(0).await.is_err());
    assert_eq!(sshd.sessions(), 3);
    // dropping the last clone closes the connection and its socket
    let control = std::fs::read_dir(sshd.dir.path().join("ctl"))
        .unwrap()
        .count();
    assert_eq!(control, 1);
    drop(l);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read_dir(sshd.dir.path().join("ctl"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn ssh_link_whose_connection_died_says_so_and_commands_still_work() {
    let sshd = Sshd::start();
    let l = link(&sshd).await;
    // the master is the ssh process holding the link's control socket
    let ctl = sshd.dir.path().join("ctl");
    let masters = pids_with_cmdline(format!("{}/", ctl.display()).as_bytes());
    let master = *masters
        .iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.windows(4).any(|w| w == b"\0-M\0"))
        })
        .expect("the master process");
    // SAFETY: kill(2) of the ssh master this test started
    unsafe {
        libc::kill(master as libc::pid_t, libc::SIGKILL);
    }
    for _ in 0..100 {
        if !l.is_alive() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!l.is_alive());
    // a command then makes a connection of its own, checked as strictly
    l.kill_remote(999_999).await.unwrap();
    assert_eq!(sshd.logins(), 2);
    drop(l);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read_dir(sshd.dir.path().join("ctl"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn ssh_unknown_host_key_is_refused_and_nothing_is_touched() {
    let sshd = Sshd::start();
    let empty = sshd.known_hosts_file("empty_known_hosts", "");
    let opts = SshOptions {
        known_hosts: Some(empty.clone()),
        ..sshd.options()
    };
    let started = Instant::now();
    let e = SshLink::connect(&sshd.target(), &opts).await.unwrap_err();
    println!("unknown host key refused in {:?}: {e}", started.elapsed());
    assert!(matches!(e, SshError::UnknownHostKey { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "host key of 127.0.0.1:{} is not known (known_hosts: {})",
            sshd.port,
            empty.display()
        )),
        "{e}"
    );
    assert_refused_touching_nothing(&sshd, &empty, "");
    // a known_hosts file that does not exist is no better
    let missing = sshd.dir.path().join("missing_known_hosts");
    let e = SshLink::connect(
        &sshd.target(),
        &SshOptions {
            known_hosts: Some(missing.clone()),
            ..sshd.options()
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("which does not exist"), "{e}");
    assert!(!missing.exists(), "ssh did not create it");
    assert!(sshd.files_in_home().is_empty());
}

#[tokio::test]
async fn ssh_changed_host_key_is_refused_and_nothing_is_touched() {
    let sshd = Sshd::start();
    let other = keygen(&sshd.dir.path().join("impostor"));
    let line = format!("[127.0.0.1]:{} {other}\n", sshd.port);
    let known = sshd.known_hosts_file("changed_known_hosts", &line);
    let opts = SshOptions {
        known_hosts: Some(known.clone()),
        ..sshd.options()
    };
    let e = SshLink::connect(&sshd.target(), &opts).await.unwrap_err();
    println!("changed host key refused: {e}");
    assert!(matches!(e, SshError::ChangedHostKey { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "host key of 127.0.0.1:{} changed (known_hosts: {}; the host now presents SHA256:",
            sshd.port,
            known.display()
        )),
        "{e}"
    );
    assert_refused_touching_nothing(&sshd, &known, &line);
}

#[tokio::test]
async fn ssh_a_key_the_host_does_not_authorise_fails_authentication() {
    let sshd = Sshd::start();
    let stranger = sshd.dir.path().join("stranger");
    keygen(&stranger);
    let opts = SshOptions {
        identity: Some(stranger),
        ..sshd.options()
    };
    let e = SshLink::connect(&sshd.target(), &opts).await.unwrap_err();
    assert!(matches!(e, SshError::Auth { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("authentication failed as "),
        "{e}"
    );
    assert!(sshd.files_in_home().is_empty());
}

#[tokio::test]
async fn ssh_unreachable_hosts_fail_within_the_connect_timeout() {
    // nothing listens: refused at once
    let port = closed_port();
    let target = SshTarget::parse(&format!("ssh://nobody@127.0.0.1:{port}")).unwrap();
    let ctl = tempfile::tempdir().unwrap();
    let opts = SshOptions {
        control_dir: ctl.path().join("c"),
        allowed: SshAllowed {
            targets: vec!["nobody@127.0.0.1:*".into()],
            identities: vec!["default".into()],
        },
        ..SshOptions::default()
    };
    let started = Instant::now();
    let e = SshLink::connect(&target, &opts).await.unwrap_err();
    let refused = started.elapsed();
    println!("closed port: {refused:?}: {e}");
    assert!(
        e.to_string()
            .starts_with(&format!("can not reach 127.0.0.1:{port}")),
        "{e}"
    );
    assert!(refused < Duration::from_secs(5));

    // a host that takes the connection and never answers (a black hole on loopback): the
    // default timeout of 5 s
    let silent = Silent::start();
    let target = SshTarget::parse(&format!("ssh://nobody@127.0.0.1:{}", silent.port)).unwrap();
    let started = Instant::now();
    let e = SshLink::connect(&target, &opts).await.unwrap_err();
    let hung = started.elapsed();
    println!("silent host: {hung:?}: {e}");
    assert_eq!(
        e.to_string(),
        format!("can not reach 127.0.0.1:{} within 5 s", silent.port)
    );
    assert!(
        hung < Duration::from_millis(5500) && hung >= Duration::from_millis(4900),
        "{hung:?}"
    );
    assert_eq!(std::fs::read_dir(ctl.path().join("c")).unwrap().count(), 0);

    // a shorter timeout is honoured too
    let opts = SshOptions {
        connect_timeout: Duration::from_millis(1500),
        ..opts
    };
    let started = Instant::now();
    let e = SshLink::connect(&target, &opts).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(2500), "{e}");
    assert!(e.to_string().ends_with("within 1.5 s"), "{e}");
}

#[tokio::test]
async fn ssh_executor_is_shipped_once_by_hash() {
    let sshd = Sshd::start();
    let bin = steward_bin();
    let size = std::fs::metadata(&bin).unwrap().len();
    let l = link(&sshd).await;
    let started = Instant::now();
    let first = l.ensure_executor(&bin).await.unwrap();
    let took = started.elapsed();
    println!(
        "first ensure_executor: {} bytes in {took:?} to {}",
        first.bytes_uploaded, first.remote_path
    );
    assert_eq!(first.bytes_uploaded, size);
    let remote = Path::new(&first.remote_path);
    assert!(remote.starts_with(sshd.home.join(".cache/steward/bin")));
    assert!(
        remote
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("steward-")
    );
    assert_eq!(std::fs::read(remote).unwrap(), std::fs::read(&bin).unwrap());
    // only the binary: the temporary file is gone
    assert_eq!(
        std::fs::read_dir(remote.parent().unwrap()).unwrap().count(),
        1
    );

    let started = Instant::now();
    let second = l.ensure_executor(&bin).await.unwrap();
    println!(
        "second ensure_executor: {} bytes in {:?}",
        second.bytes_uploaded,
        started.elapsed()
    );
    assert_eq!(second.bytes_uploaded, 0);
    assert_eq!(second.remote_path, first.remote_path);

    // a new connection (a restarted server) finds it too
    drop(l);
    let l = link(&sshd).await;
    let third = l.ensure_executor(&bin).await.unwrap();
    assert_eq!(third.bytes_uploaded, 0);
    assert_eq!(third.remote_path, first.remote_path);

    // another binary is another file; a binary that does not start there is refused and
    // leaves nothing behind
    let script = sshd.dir.path().join("not-steward");
    std::fs::write(&script, "#!/bin/sh\necho broken >&2\nexit 1\n").unwrap();
    let e = l.ensure_executor(&script).await.unwrap_err();
    assert!(matches!(e, SshError::Platform { .. }), "{e:?}");
    assert!(
        e.to_string().contains("it does not start there: broken"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(remote.parent().unwrap()).unwrap().count(),
        1
    );
}

/// Handler code as `scheduler/code.rs` lays it out: `<dir>/<digest>/…` and `<dir>/_lib/`.
fn code_dir(dir: &Path, digest: &str, helper: &str) {
    let code = dir.join(digest);
    std::fs::create_dir_all(&code).unwrap();
    std::fs::create_dir_all(dir.join("_lib")).unwrap();
    std::fs::write(
        code.join("marker.py"),
        "import os\nfrom steward_handler import CRUDHandler, serve\n\n\
         class Marker(CRUDHandler):\n\
         \x20   def read_resource(self, ctx, resource):\n\
         \x20       p = resource['path']\n\
         \x20       if not os.path.exists(p):\n\
         \x20           return None\n\
         \x20       return {'path': p, 'content': open(p).read()}\n\
         \x20   def create_resource(self, ctx, resource):\n\
         \x20       with open(resource['path'], 'w') as f:\n\
         \x20           f.write(resource['content'])\n\
         \x20       ctx.info('written', home=os.environ['HOME'], cwd=os.getcwd())\n\
         \x20   def update_resource(self, ctx, changes, resource):\n\
         \x20       self.create_resource(ctx, resource)\n\
         \x20   def delete_resource(self, ctx, resource):\n\
         \x20       os.remove(resource['path'])\n\n\
         serve(Marker())\n",
    )
    .unwrap();
    std::fs::create_dir_all(code.join("sub")).unwrap();
    std::fs::write(code.join("sub/data.txt"), "data").unwrap();
    std::fs::write(code.join(".complete"), digest).unwrap();
    std::fs::write(dir.join("_lib/steward_handler.py"), helper).unwrap();
}

#[tokio::test]
async fn ssh_handler_code_is_shipped_once_by_digest() {
    let sshd = Sshd::start();
    let local = tempfile::tempdir().unwrap();
    let helper = steward::executor::external::PYTHON_HELPER;
    code_dir(local.path(), "d1", helper);
    let l = link(&sshd).await;
    let first = l.ensure_code(local.path(), "d1").await.unwrap();
    println!("first ensure_code: {} bytes", first.bytes_uploaded);
    assert!(first.bytes_uploaded > 0);
    assert_eq!(first.remote_path, l.remote_dir_for_code("d1"));
    let remote = sshd.home.join(".cache/steward/code");
    assert_eq!(
        std::fs::read_to_string(remote.join("d1/sub/data.txt")).unwrap(),
        "data"
    );
    assert!(remote.join("d1/.complete").is_file());
    assert_eq!(
        std::fs::read_to_string(remote.join("_lib/steward_handler.py")).unwrap(),
        helper
    );
    let second = l.ensure_code(local.path(), "d1").await.unwrap();
    assert_eq!(second.bytes_uploaded, 0);
    drop(l);
    let l = link(&sshd).await;
    assert_eq!(
        l.ensure_code(local.path(), "d1")
            .await
            .unwrap()
            .bytes_uploaded,
        0
    );

    // another digest ships only its code: the helper is there already
    code_dir(local.path(), "d2", helper);
    let d2 = l.ensure_code(local.path(), "d2").await.unwrap();
    assert!(d2.bytes_uploaded > 0);
    // a new helper (another steward version) replaces the old one, and only it is sent
    code_dir(local.path(), "d2", "# helper v2\n");
    let lib = l.ensure_code(local.path(), "d2").await.unwrap();
    assert!(lib.bytes_uploaded > 0);
    assert_eq!(
        std::fs::read_to_string(remote.join("_lib/steward_handler.py")).unwrap(),
        "# helper v2\n"
    );
    assert_eq!(
        l.ensure_code(local.path(), "d2")
            .await
            .unwrap()
            .bytes_uploaded,
        0
    );
    // only complete code is shipped, under a name that is a digest
    std::fs::create_dir_all(local.path().join("half")).unwrap();
    let e = l.ensure_code(local.path(), "half").await.unwrap_err();
    assert!(e.to_string().contains("not complete"), "{e}");
    assert!(l.ensure_code(local.path(), "../etc").await.is_err());
    let leftovers: Vec<_> = std::fs::read_dir(&remote)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    let mut leftovers = leftovers;
    leftovers.sort();
    assert_eq!(
        leftovers,
        ["_lib", "d1", "d2"],
        "no temporary directories left"
    );
}

#[tokio::test]
async fn ssh_remote_executor_applies_work_items_one_round_trip_each() {
    let sshd = Sshd::start();
    let out = tempfile::tempdir().unwrap();
    let l = link(&sshd).await;
    let shipped = l.ensure_executor(&steward_bin()).await.unwrap();
    let mut ex = RemoteExecutor::start(&l, &shipped.remote_path, "web 1 'quoted'").await;
    // the executor is the remote program, leading its own process group
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", ex.pid)).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    assert_eq!(fields[2], ex.pid.to_string(), "pgid == pid: {stat}");
    // the shipped file runs, through the descriptor its hash was checked on
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", ex.pid)).unwrap();
    assert!(
        cmdline.starts_with(b"/proc/self/fd/3\0executor\0--agent\0web 1 'quoted'\0"),
        "{}",
        String::from_utf8_lossy(&cmdline)
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", ex.pid)).unwrap(),
        Path::new(&shipped.remote_path)
    );
    let sessions = sshd.sessions();

    let path = out.path().join("deployed.txt");
    let p = path.to_str().unwrap();
    let r = ex
        .work(item(
            ActionKind::Deploy,
            fs_file("web", p, "over ssh\n", &[]),
        ))
        .await;
    assert_eq!(r.outcome, Outcome::Deployed, "{r:?}");
    assert_eq!(r.change, Change::Created);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "over ssh\n");

    // a dry-run reports and changes nothing
    let dry = out.path().join("dry.txt");
    let r = ex
        .work(item(
            ActionKind::Dryrun,
            fs_file("web", dry.to_str().unwrap(), "x", &[]),
        ))
        .await;
    assert_eq!(r.outcome, Outcome::Dry, "{r:?}");
    assert!(
        !r.changes.is_empty(),
        "a dry-run reports what it would change: {r:?}"
    );
    assert!(!dry.exists(), "a dry-run wrote the file");
    let r = ex
        .work(item(
            ActionKind::Dryrun,
            fs_file("web", p, "changed\n", &[]),
        ))
        .await;
    assert_eq!(r.outcome, Outcome::Dry, "{r:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "over ssh\n");

    // the same again: nothing to change
    let started = Instant::now();
    let r = ex
        .work(item(
            ActionKind::Deploy,
            fs_file("web", p, "over ssh\n", &[]),
        ))
        .await;
    println!("an action over ssh: {:?}", started.elapsed());
    assert_eq!((r.outcome, r.change), (Outcome::Deployed, Change::Nochange));
    // four actions, no new session, no new connection: each action is one line out and one
    // line back on the executor's channel
    assert_eq!(sshd.sessions(), sessions);
    assert_eq!(sshd.logins(), 1);

    ex.send(&Request::Shutdown).await;
    let status = tokio::time::timeout(Duration::from_secs(10), ex.child.wait())
        .await
        .expect("the channel closes after Shutdown")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!alive(ex.pid));
}

#[tokio::test]
async fn ssh_module_handler_code_runs_on_the_target() {
    let sshd = Sshd::start();
    let out = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    code_dir(
        local.path(),
        "cafe01",
        steward::executor::external::PYTHON_HELPER,
    );
    let l = link(&sshd).await;
    let bin = l.ensure_executor(&steward_bin()).await.unwrap();
    let code = l.ensure_code(local.path(), "cafe01").await.unwrap();
    let mut ex = RemoteExecutor::start(&l, &bin.remote_path, "web").await;
    let path = out.path().join("by-python.txt");
    let mut attributes = serde_json::Map::new();
    for (k, v) in [
        ("path", json!(path.to_str().unwrap())),
        ("content", json!("from a module handler")),
        ("purged", json!(false)),
    ] {
        attributes.insert(k.into(), v);
    }
    let resource = steward::model::Resource {
        id: steward::model::ResourceId::new("test::Marker", "web", "path", path.to_str().unwrap()),
        type_name: "test::Marker".into(),
        agent: "web".into(),
        attributes,
        requires: vec![],
    };
    let mut work = item(ActionKind::Deploy, resource);
    // the scheduler rewrites the handler's directory to where the code is on the target
    work.handler = Some(ExternalHandler {
        dir: code.remote_path.clone().into(),
        entry: "marker.py".into(),
        digest: "cafe01".into(),
        inmanta: None,
    });
    let r = ex.work(work).await;
    assert_eq!(r.outcome, Outcome::Deployed, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "from a module handler"
    );
    let written = r
        .messages
        .iter()
        .find(|m| m.message == "written")
        .unwrap_or_else(|| panic!("{r:?}"));
    // it ran in the target's session, in the shipped directory
    assert_eq!(written.fields["home"], json!(sshd.home.to_str().unwrap()));
    assert_eq!(written.fields["cwd"], json!(code.remote_path));
}

#[tokio::test]
async fn ssh_kill_remote_kills_a_hung_executor_and_what_it_started() {
    let sshd = Sshd::start();
    let l = link(&sshd).await;
    let shipped = l.ensure_executor(&steward_bin()).await.unwrap();
    let mut ex = RemoteExecutor::start(&l, &shipped.remote_path, "hung").await;
    // a unique duration finds the sleep among the machine's processes
    let secs = 600 + std::process::id() % 1000;
    let command = format!("sleep {secs}.5");
    ex.send(&Request::Work(Box::new(item(
        ActionKind::Deploy,
        exec_run("hung", &command, json!({"timeout": 900}), &[]),
    ))))
    .await;
    let needle = format!("sleep\0{secs}.5\0");
    let started = Instant::now();
    let sleeper = loop {
        if let Some(p) = pids_with_cmdline(needle.as_bytes()).first() {
            break *p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the handler never started its command"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(alive(ex.pid) && alive(sleeper));

    let started = Instant::now();
    l.kill_remote(ex.pid).await.unwrap();
    // the channel closes: the scheduler sees its executor gone
    let next = tokio::time::timeout(Duration::from_secs(10), ex.lines.next_line())
        .await
        .expect("the channel closes once the executor is killed");
    assert!(matches!(next, Ok(None)), "{next:?}");
    let status = tokio::time::timeout(Duration::from_secs(10), ex.child.wait())
        .await
        .unwrap()
        .unwrap();
    println!("killed in {:?} ({status:?})", started.elapsed());
    for _ in 0..100 {
        if !alive(ex.pid) && !alive(sleeper) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(ex.pid), "the executor survived");
    assert!(!alive(sleeper), "its command survived");
    // killing what is gone is not an error
    l.kill_remote(ex.pid).await.unwrap();
    assert!(l.is_alive(), "the connection outlives its executors");
}

#[tokio::test]
async fn ssh_a_login_shell_that_prints_is_refused_with_a_clear_error() {
    let sshd = Sshd::start();
    let passwd = std::process::Command::new("getent")
        .args(["passwd", &sshd.user])
        .output()
        .unwrap();
    let shell = String::from_utf8_lossy(&passwd.stdout)
        .trim()
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        shell.ends_with("/bash"),
        "this test makes the login shell print through ~/.bashrc: the shell of {} must be bash, not {shell:?}",
        sshd.user
    );
    // bash reads ~/.bashrc for commands run by sshd: text there would corrupt the protocol
    std::fs::write(sshd.home.join(".bashrc"), "echo Welcome to the box\n").unwrap();
    let e = SshLink::connect(&sshd.target(), &sshd.options())
        .await
        .unwrap_err();
    assert!(matches!(e, SshError::NoisyShell { .. }), "{e:?}");
    assert!(e.to_string().contains("Welcome to the box"), "{e}");
}
