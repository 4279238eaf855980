//! The schedule crate: what is tuned and how a candidate kernel is described.
//!
//! Tasks (operators and their generic affine contraction form) and the built-in
//! networks that group them (ONNX models are imported above this crate, by
//! `onnx`); states (the multi-level tiling sketch with every factor filled in),
//! their sampling and validation against a GPU description; lowering of a state to a
//! loop nest (`lower`: each sketch's lowering, and the transform passes it applies to
//! the nest, `lower::prefetch`: register prefetch); the tensor-core sketch (`gemm`: a
//! contraction's GEMM view, `mma`: its tiles, lowered by `lower::mma_sync` to its
//! cp.async / ldmatrix / mma.sync nest through `lower::pipeline`'s ring of stages;
//! `row_span`: its staging of a few-channel convolution's input rows);
//! the instructions themselves as data (`atom`: shared layouts, MMA and copy atoms,
//! read by lowering, code generation, the interpreter and the features); CUDA C generation
//! that only prints the finished nest (`codegen`), and a CPU interpreter that proves
//! the same nest computes the task's definition (`interp`).
//! Nothing here needs a GPU.

pub mod adapt;
pub mod atom;
pub mod census;
pub mod codegen;
pub mod expr;
pub mod gemm;
pub mod gpu_spec;
pub mod interp;
pub mod invalid;
pub mod ir;
pub mod launch;
pub mod lower;
pub mod mbarrier;
pub mod network;
pub mod reference;
pub mod row_span;
pub mod sample;
mod serde_default;
pub mod shape;
pub mod sketch;
pub mod staging;
pub mod state;
pub mod stream_k;
pub mod task;
pub mod validate;

pub use adapt::adapt;
pub use gpu_spec::GpuSpec;
pub use invalid::InvalidState;
pub use ir::Kernel;
pub use launch::{Dim3, LaunchConfig, Target, TensorMapArg};
pub use network::{NETWORKS, Workload, network};
pub use sample::Sampler;
pub use shape::{OPERATORS, parse_shape};
pub use state::{SketchTiling, State};
pub use task::{DType, Epilogue, Layout, Operator, Task};
pub use validate::validate;

/// A state of a task lowered and printed as CUDA C, with what is needed to launch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedKernel {
    pub name: String,
    pub source: String,
    pub launch: LaunchConfig,
}

/// Validates, lowers and generates the CUDA source of `state` for `task` on `gpu`.
pub fn generate(
    task: &Task,
    state: &State,
    gpu: &GpuSpec,
) -> Result<GeneratedKernel, InvalidState> {
    validate(&task.contraction(), state, gpu)?;
    let kernel = lower::lower(task, state);
    let header = vec![
        format!(
            "tilesched kernel for {} ({} GFLOP)",
            task.key(),
            task.flops() as f64 / 1e9
        ),
        format!(
            "task: {}",
            serde_json::to_string(task).expect("a task always serializes")
        ),
        format!("state: {}", state.to_json()),
    ];
    Ok(GeneratedKernel {
        name: kernel.name.clone(),
        source: codegen::cuda_source(&kernel, &header),
        launch: kernel.launch,
    })
}
