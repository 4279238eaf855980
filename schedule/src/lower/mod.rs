//! Lowering: a validated state becomes a loop nest (`ir`), by its sketch's lowering
//! (`cuda_core`, `mma_sync`, `wgmma`), both built from the same helpers (`common`), a pipelined
//! fill through `pipeline`'s ring of stages; transform passes rewrite the finished nest
//! (`prefetch`: register prefetch).

mod common;
mod cuda_core;
mod mma_sync;
mod pipeline;
pub mod prefetch;
mod wgmma;

use crate::ir::Kernel;
use crate::state::State;
use crate::task::Task;

/// Lowers a validated state of `task`, applying the state's transform passes.
pub fn lower(task: &Task, state: &State) -> Kernel {
    state.sketch(
        || cuda_core::lower(task, state),
        |mma| mma_sync::lower(task, mma, (state.split_k, state.split_sums)),
        |tiling| wgmma::lower(task, tiling, (state.split_k, state.split_sums)),
    )
}
