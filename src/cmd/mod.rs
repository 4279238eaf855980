//! Subcommands, one per file.

pub mod codegen;
pub mod workloads;
