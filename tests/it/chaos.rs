//! The fault/soak harness of `examples/chaos.rs`, short: about a minute of pushes under
//! kill -9 of the server, of executors, of PostgreSQL and of both at once, a PostgreSQL
//! restart, a handler flooding its logs and an agent process naming thousands of agents,
//! then its checks.

#[path = "../../examples/chaos/mod.rs"]
mod harness;

#[tokio::test]
async fn a_minute_of_chaos_converges() {
    let mut cfg = harness::Config::new(env!("CARGO_BIN_EXE_steward").into(), 1.1);
    // the same faults in the same order every run (their timing still varies)
    cfg.seed = 0x5eed_c4a0_5eed_c4a0;
    cfg.max_requests = 5_000;
    cfg.quiet_secs = 90;
    cfg.verbose = std::env::var_os("CHAOS_VERBOSE").is_some();
    let report = harness::run(&cfg).await;
    println!("{}", report.render());
    let f = &report.figures;
    assert!(f.commits >= 5, "too few commits: {}", f.commits);
    assert!(
        f.server_kills >= 1
            && f.pg_restarts >= 1
            && f.pg_kills >= 1
            && f.both_kills >= 1
            && f.executor_kills + f.executor_kills_skipped >= 1,
        "every kind of fault is injected at least once"
    );
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(failed.is_empty(), "checks failed:\n{}", failed.join("\n"));
}
