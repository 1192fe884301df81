// The server, its schedulers and the executors allocate and free many small objects per
// action (intents, protocol lines, state rows): with glibc's allocator that was a sixth of
// the scheduler's time at thousands of actions a second (examples/bench_deploy.rs: a
// no-change repair of 10,000 resources 0.51 -> 0.35 s, of 30,000 2.09 -> 1.24 s). Large
// blocks are mappings of their own (see `steward::alloc`).
#[global_allocator]
static ALLOCATOR: steward::alloc::Allocator = steward::alloc::Allocator;

fn main() -> std::process::ExitCode {
    steward::cli::main()
}
