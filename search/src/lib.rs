//! Search: how candidates are chosen, built and measured, and what is kept of them.
//!
//! Tuning records (the JSON-lines log), per-task summaries, candidate building (NVRTC in
//! parallel), fault injection for tests, and the tuning loop over the measurement
//! workers, with random search and the cost-model-guided evolutionary search, and the
//! gradient task scheduler that shares a network's trials among its layers.

pub mod build;
pub mod dgd;
pub mod evolution;
pub mod inject;
pub mod mutate;
pub mod record;
pub mod report;
pub mod scheduler;
pub mod tune;

pub use record::{CompileInfo, Log, LogWriter, Record, read_log};
pub use report::{TaskSummary, summarize};
pub use tune::{Progress, Status, TuneConfig, TuneStats, tune};
