//! Tuning records: the record of one measured candidate, the JSON-lines log (appended a
//! batch at a time, read back, gzipped or not, skipping damaged lines and records that
//! do not validate), per-task summaries and the tables `tune` and `best` print, and the
//! one path from a log to a task's best kernel (`kernel`). Below `search` and beside
//! `gpu`: everything that reads logs — the CLI, the benchmarks, the second stage —
//! depends on this crate, not on the search and its cost model.

pub mod database;
pub mod kernel;
pub mod ranking;
pub mod record;
pub mod report;
pub mod validate;

pub use database::{DbError, KernelDb, read_records};
pub use kernel::{BestKernel, KernelError, Staleness, best_kernel, best_regenerated};
pub use ranking::KEEP;
pub use record::{
    CompileInfo, Log, LogError, LogSink, LogWriter, Record, Skipped, is_compressed, now, read_log,
    read_log_into, source_hash,
};
pub use report::{
    LogSummary, Summarizer, TaskSummary, TaskTally, best_table, read_summary, summarize,
    summarize_log, tune_table,
};
pub use validate::{InvalidRecord, check_record};
