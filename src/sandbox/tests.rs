use super::*;

#[test]
fn the_registry_gives_each_environment_its_own_slot_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("slots");
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let sa = slot_of(&reg, a).unwrap();
    let sb = slot_of(&reg, b).unwrap();
    assert_ne!(sa, sb);
    assert_eq!(slot_of(&reg, a).unwrap(), sa);
    // another process reading the file finds the same slots
    let text = std::fs::read_to_string(&reg).unwrap();
    assert!(text.contains(&format!("{a} {sa}\n")) && text.contains(&format!("{b} {sb}\n")));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&reg).unwrap().permissions().mode() & 0o777,
        0o600
    );
    if is_root() {
        let ca = identity(a, Role::Compile).unwrap().unwrap();
        let xa = identity(a, Role::Executor).unwrap().unwrap();
        let cb = identity(b, Role::Compile).unwrap().unwrap();
        assert!(ca != xa && ca != cb && xa != cb);
        assert!(ca.uid >= DEFAULT_UID_BASE);
    }
}

/// A jailed shell sees only its own processes, and a child it starts in a new session
/// dies with it.
#[test]
fn a_jailed_process_sees_only_its_own_and_takes_them_along() {
    if !namespaces_available() {
        eprintln!(
            "SKIPPED a_jailed_process_sees_only_its_own_and_takes_them_along: this kernel \
             makes no PID namespace for us"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pid");
    // a sleep of this test's own (other tests and programs may run a `sleep 30`)
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let seconds = format!("30.{}{nanos}", std::process::id());
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!(
            "setsid sleep {seconds} & echo $! > {}; ls /proc | grep -c '^[0-9]'",
            marker.display()
        ))
        .stdout(std::process::Stdio::piped());
    Jail {
        namespaces: true,
        die_with_parent: true,
        ..Jail::default()
    }
    .apply_std(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    // init, the shell, sleep, ls, grep: a handful, not the machine's hundreds
    let seen: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(seen <= 6, "the jail saw {seen} processes");
    // the setsid child is gone with the jail (its pid in the namespace is not ours to
    // look up: look for its command line)
    std::thread::sleep(std::time::Duration::from_millis(200));
    let ps = std::process::Command::new("sh")
        .arg("-c")
        .arg("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !text.lines().any(|l| l.trim() == format!("sleep {seconds}")),
        "a setsid child outlived its jail"
    );
}

/// The spawning side gets the program's output as it comes (the go-betweens hold no
/// pipe), so output larger than a pipe's buffer does not stall it.
#[test]
fn a_jailed_program_s_output_streams() {
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c").arg("head -c 1000000 /dev/zero");
    Jail {
        namespaces: namespaces_available(),
        die_with_parent: true,
        ..Jail::default()
    }
    .apply_std(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 1_000_000);
}

/// What a jail with a private /tmp writes there is neither seen by others nor kept.
#[test]
fn a_private_tmp_is_the_jails_alone() {
    if !namespaces_available() {
        eprintln!("SKIPPED a_private_tmp_is_the_jails_alone: no namespaces");
        return;
    }
    let name = format!("steward-private-tmp-{}", uuid::Uuid::new_v4());
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!("echo x > /tmp/{name} && ls /tmp | wc -l"));
    Jail {
        namespaces: true,
        private_tmp: true,
        ..Jail::default()
    }
    .apply_std(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // its /tmp held its own file only
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    assert!(!Path::new("/tmp").join(&name).exists());
}

/// The jail's init is a copy of this process: /proc/1 inside shows none of our command
/// line or environment; a directory under /tmp that must stay visible does.
#[test]
fn the_init_shows_nothing_of_the_server_and_kept_directories_stay() {
    if !namespaces_available() {
        eprintln!(
            "SKIPPED the_init_shows_nothing_of_the_server_and_kept_directories_stay: no namespaces"
        );
        return;
    }
    let kept = tempfile::Builder::new()
        .prefix("steward-kept-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(kept.path().join("f"), "here").unwrap();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c").arg(format!(
        "tr '\\0' ' ' < /proc/1/cmdline; echo; cat {}/f; echo; ls /tmp | wc -l",
        kept.path().display()
    ));
    Jail {
        namespaces: true,
        private_tmp: true,
        keep_visible: vec![kept.path().to_path_buf()],
        ..Jail::default()
    }
    .apply_std(&mut cmd);
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    let me = std::env::args().next().unwrap();
    assert!(
        !lines[0].contains(&me),
        "init shows our command line: {text}"
    );
    assert!(lines[0].trim().starts_with("steward-sandbox"), "{text}");
    assert_eq!(lines[1], "here", "{text}");
    assert_eq!(
        lines[2].trim(),
        "1",
        "only the kept path's top directory: {text}"
    );
}

/// Kill by uid ends a process of the uid that left its session and group, and costs
/// a look at /proc when nothing is left.
#[test]
fn kill_all_ends_every_process_of_the_uid() {
    if !is_root() {
        eprintln!("SKIPPED kill_all_ends_every_process_of_the_uid: needs root");
        return;
    }
    let uid = DEFAULT_UID_BASE - 7;
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $!");
    Jail {
        identity: Some(Identity { uid, gid: uid }),
        ..Jail::default()
    }
    .apply_std(&mut cmd);
    let out = cmd.output().unwrap();
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(any_process_of(uid));
    assert!(kill_all(uid) >= 1);
    std::thread::sleep(std::time::Duration::from_millis(50));
    // gone (reaped by init, or a zombie no longer running as anything)
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(
        status.is_empty() || status.contains("State:\tZ"),
        "{status}"
    );
    assert!(!any_process_of(uid));
    assert_eq!(kill_all(uid), 0);
}

#[test]
fn the_exit_signal_is_passed_through_the_go_betweens() {
    if !namespaces_available() {
        eprintln!("SKIPPED the_exit_signal_is_passed_through_the_go_betweens: no namespaces");
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    for (script, code, signal) in [
        ("exit 3", Some(3), None),
        ("kill -XCPU $$", None, Some(libc::SIGXCPU)),
    ] {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        Jail {
            namespaces: true,
            ..Jail::default()
        }
        .apply_std(&mut cmd);
        let s = cmd.status().unwrap();
        assert_eq!((s.code(), s.signal()), (code, signal), "{script}");
    }
}
