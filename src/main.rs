fn main() -> std::process::ExitCode {
    steward::cli::main()
}
