//! Subcommands, one per file.

pub mod bench;
pub mod best;
pub mod builder;
pub mod codegen;
pub mod curves;
pub mod database;
pub mod deploy;
pub mod export;
pub mod features;
pub mod model;
pub mod peer;
pub mod pipeline;
pub mod sameness;
pub mod sass;
pub mod tasks;
pub mod tune;
pub mod worker;
pub mod workloads;
