//! What the sandbox costs a process: `cargo run --release --example bench_sandbox [-- N]`
//!
//! Starts `/bin/true` N times (default 200) four ways and prints the median and 90th
//! percentile of each: plainly (`fork`+`exec`, as before the sandbox), jailed as a compile is
//! (limits, and when the kernel allows, a PID and mount namespace with a fresh /proc; as root
//! also the environment's uid) as an executor is, the same with a private /tmp and a kept
//! workdir as a compile is (a server that is not root also hides its data directory and
//! home: run it as an ordinary user to see that), and the kill by uid that follows every
//! compile. The
//! difference between the first two is the isolation overhead of a compile or an executor
//! start.

use std::process::Command;
use std::time::{Duration, Instant};

use steward::sandbox::{self, Jail, Role};

fn stats(name: &str, mut times: Vec<Duration>) -> Duration {
    times.sort();
    let median = times[times.len() / 2];
    let p90 = times[times.len() * 9 / 10];
    println!(
        "{name:<34} median {:>7.2} ms   p90 {:>7.2} ms",
        median.as_secs_f64() * 1e3,
        p90.as_secs_f64() * 1e3
    );
    median
}

fn time(n: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let registry = tempfile::tempdir().unwrap();
    sandbox::configure(sandbox::Config {
        registry: registry.path().join("slots"),
        ..Default::default()
    });
    let env = uuid::Uuid::new_v4();
    let jail =
        Jail::for_environment(env, Role::Compile)
            .unwrap()
            .limit(libc::RLIMIT_NOFILE, 256, 256);
    println!(
        "{n} runs; root: {}; namespaces: {}; identity: {:?}",
        sandbox::is_root(),
        jail.namespaces,
        jail.identity
    );
    let plain = stats(
        "plain spawn of /bin/true",
        time(n, || {
            assert!(Command::new("/bin/true").status().unwrap().success());
        }),
    );
    let jailed = stats(
        "jailed spawn of /bin/true",
        time(n, || {
            let mut c = Command::new("/bin/true");
            jail.apply_std(&mut c);
            assert!(c.status().unwrap().success());
        }),
    );
    // as the server sets up a compile: a workdir under the data directory, which a server
    // that is not root also hides (with its home), the workdir bound back
    let data_dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let workdir = tempfile::tempdir_in(data_dir.path()).unwrap();
    let mut compile_jail = jail.clone().hide_server_files(data_dir.path());
    compile_jail.private_tmp = true;
    compile_jail
        .keep_visible
        .insert(0, workdir.path().to_path_buf());
    println!("hidden: {:?}", compile_jail.hide);
    let compile_like = stats(
        "jailed, private /tmp (a compile)",
        time(n, || {
            let mut c = Command::new("/bin/true");
            compile_jail.apply_std(&mut c);
            assert!(c.status().unwrap().success());
        }),
    );
    let kill = match jail.identity {
        Some(id) => stats(
            "kill by uid (nothing left)",
            time(n, || {
                sandbox::kill_all(id.uid);
            }),
        ),
        None => Duration::ZERO,
    };
    println!(
        "isolation overhead per compile: {:.2} ms (jail with private /tmp {:.2} ms + kill {:.2} ms); per executor start: {:.2} ms",
        (compile_like + kill).saturating_sub(plain).as_secs_f64() * 1e3,
        compile_like.saturating_sub(plain).as_secs_f64() * 1e3,
        kill.as_secs_f64() * 1e3,
        jailed.saturating_sub(plain).as_secs_f64() * 1e3,
    );
}
