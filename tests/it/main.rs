//! Integration tests: one binary, one module per part.

mod api;
mod api_auth;
mod api_durability;
mod chaos;
mod compile_isolation;
mod compiler_cases;
mod compiler_cli;
mod deploy;
mod deploy_cli;
mod deploy_faults;
mod embedded;
mod fault_regressions;
mod gitops;
mod gitops_faults;
mod gitops_feedback;
mod gitops_support;
mod integration;
mod layout;
mod openapi;
mod pg_security;
mod retention;
mod security;
mod ssh;
mod ssh_support;
mod support;
