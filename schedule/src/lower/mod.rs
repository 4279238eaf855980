//! Lowering: a validated state becomes a loop nest (`ir`), by its sketch's lowering
//! (`Sketch::lower`, each sketch's `lower.rs`), all built from the same helpers
//! (`common`), a pipelined fill through `pipeline`'s ring of stages; transform passes
//! rewrite the finished nest (`prefetch`: register prefetch).

pub(crate) mod common;
pub(crate) mod pipeline;
pub mod prefetch;

use crate::ir::Kernel;
use crate::state::State;
use crate::task::Task;

/// Lowers a validated state of `task`, applying the state's transform passes.
pub fn lower(task: &Task, state: &State) -> Kernel {
    state.sketch().lower(task, state)
}
