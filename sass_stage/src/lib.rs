//! Second stage: SASS instruction reordering of the best kernel's cubin.
//!
//! The tile search leaves one compiled kernel per task; this stage permutes its
//! machine instructions inside basic blocks to hide memory latency (after CuAsmRL,
//! CGO'25), keeping every dependency ptxas encoded, validates every candidate bit for
//! bit on the GPU, and keeps the fastest. See `shared/DESIGN.md`, "Stage 2".
//!
//! The modules follow the stage's flow: `decode` reads a kernel out of its cubin,
//! `legality` says which reorderings keep every dependency, `agents` search among
//! them, `measure` validates and times candidates on the GPU, `stage` runs the agents
//! on one kernel and keeps the fastest, `run` runs the stage over a log's kernels and
//! writes their files (and stores final kernels in the `runtime` crate's deploy cache),
//! and `report` renders the run's table.

pub mod agents;
pub mod decode;
pub mod legality;
pub mod measure;
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
    #[error(transparent)]
    Deploy(#[from] runtime::RuntimeError),
}
