//! Integration tests: one binary, one module per part.

mod compiler_cases;
mod compiler_cli;
