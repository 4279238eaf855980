//! Second stage: SASS instruction reordering of the best kernel's cubin.
//!
//! The tile search leaves one compiled kernel per task; this stage permutes its
//! machine instructions inside basic blocks to hide memory latency (after CuAsmRL,
//! CGO'25), keeping every dependency ptxas encoded, validates every candidate bit for
//! bit on the GPU, and keeps the fastest. See `shared/DESIGN.md`, "Stage 2".

pub mod analysis;
pub mod anneal;
pub mod control;
pub mod cubin;
pub mod deploy;
pub mod disasm;
pub mod embed;
pub mod env;
pub mod estimate;
pub mod game;
pub mod greedy;
pub mod instr;
pub mod latency;
pub mod measure;
pub mod objective;
pub mod order;
pub mod ppo;
pub mod report;
pub mod run;
pub mod stage;

/// Why the stage could not work on a kernel (bad input or missing tools); failures of
/// individual candidates are data, never errors.
#[derive(Debug, thiserror::Error)]
pub enum SassError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Tool(String),
    #[error("{0}")]
    Gpu(String),
    #[error("cannot write {path}: {error}")]
    Io {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("{0}: stage 2: {1}")]
    Kernel(String, Box<SassError>),
}
