//! Search: how candidates are chosen, built and measured.
//!
//! Candidate building (NVRTC in parallel), fault injection for tests, and the tuning
//! loop over the measurement workers, with random search, the cost-model-guided
//! evolutionary search and DGD, and the gradient task scheduler that shares a network's
//! trials among its layers. What is kept of the measurements — the records and the
//! log — is the `records` crate's.

pub mod build;
pub mod dgd;
pub mod evolution;
pub mod inject;
pub mod measure;
pub mod mutate;
pub mod scheduler;
pub mod trainer;
pub mod tune;

pub use measure::{Job, Local, Measured, Measurer};
pub use tune::{Progress, Status, Strategy, TuneConfig, TuneError, TuneStats, tune};
