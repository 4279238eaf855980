//! Search: how candidates are chosen.
//!
//! The tuning loop over a `measure::Measurer` (which builds and measures), with random
//! search, the cost-model-guided
//! evolutionary search and DGD, and the gradient task scheduler that shares a network's
//! trials among its layers; transfer, which starts a new task from the best states of
//! its nearest tuned tasks in a kernel database. What is kept of the measurements — the records and the
//! log — is the `records` crate's.

pub mod dgd;
pub mod evolution;
pub mod mutate;
pub mod scheduler;
pub mod trainer;
pub mod transfer;
pub mod tune;

pub use trainer::RetrainSchedule;
pub use tune::{Progress, Status, Strategy, TuneConfig, TuneError, TuneStats, tune};
