//! Analytical features of a schedule for a given GPU.
//!
//! A cost model cannot afford to compile and run ~10^5 candidate kernels per search
//! round, but it can afford to look at what each kernel will do to the hardware: how
//! many global-memory sectors and shared-memory wavefronts it costs (with coalescing and
//! bank conflicts simulated on the lanes of representative warps, following exactly the
//! loop nest `schedule::lower` generates), how many registers it needs and how many of
//! its blocks an SM holds, how well the grid fills the GPU, and the raw tile structure.
//! `FeatureExtractor::extract` turns a state into a fixed-length vector of such named
//! values (`FEATURE_NAMES`, documented in `FEATURE_DOCS`): the input rows of the
//! XGBoost cost model and the columns of feature dumps. States of the tensor-core
//! sketch (`mma.sync` tiles, a `cp.async` pipeline, `ldmatrix` fragments) get the same
//! vector: the features both sketches share, their own `mma_` ones, and zeros for the
//! CUDA-core sketch's own (`CUDA_CORE_ONLY`).

mod common;
mod extract;
mod fetch;
mod geometry;
mod indexing;
mod mma;
mod occupancy;
mod sample;
mod shared_reads;
mod store;
mod table;
mod warp;
mod wgmma;

pub use extract::FeatureExtractor;
pub use table::{CUDA_CORE_ONLY, FEATURE_COUNT, FEATURE_DOCS, FEATURE_NAMES};

/// The index of a feature in the vector, by name.
pub fn feature_index(name: &str) -> Option<usize> {
    FEATURE_NAMES.iter().position(|&n| n == name)
}
