//! Search: how candidates are chosen, built and measured, and what is kept of them.
//!
//! Tuning records (the JSON-lines log), per-task summaries, candidate building (NVRTC in
//! parallel), fault injection for tests, and the tuning loop over the measurement
//! workers. Random search only, for now; the cost-model-guided strategies and the task
//! scheduler build on this loop.

pub mod build;
pub mod inject;
pub mod record;
pub mod report;
pub mod tune;

pub use record::{CompileInfo, Log, LogWriter, Record, read_log};
pub use report::{TaskSummary, summarize};
pub use tune::{Progress, Status, TuneConfig, TuneStats, tune};
