//! Validation: rejects states that cannot run (or cannot run well) on a GPU before
//! anything is compiled. Each sketch says what it refuses (`Sketch::validate`, in its
//! folder: for the CUDA-core sketch wrong arity, thread counts outside the hardware's
//! range, too many virtual threads, shared memory over the opt-in limit, an estimated
//! register count that would spill, infeasible fetch vector widths, a reduction split
//! over the stage count or combined with ReLU); this module is the entry point and
//! what the sketches' checks share.

use crate::gpu_spec::GpuSpec;
pub use crate::invalid::InvalidState;
use crate::state::State;
use crate::task::Contraction;

/// Validates `state` for contraction `c` on `gpu`.
pub fn validate(c: &Contraction, state: &State, gpu: &GpuSpec) -> Result<(), InvalidState> {
    state.sketch().validate(c, state, gpu)
}

/// Registers per thread that ptxas may use under `__launch_bounds__(threads)`: the
/// block's register file split over its threads, in the allocation unit of 8.
pub fn register_cap(gpu: &GpuSpec, threads: u64) -> u64 {
    let per_thread =
        u64::from(gpu.registers_per_block) / threads.next_multiple_of(u64::from(gpu.warp_size));
    (per_thread / 8 * 8).min(u64::from(gpu.max_registers_per_thread))
}

/// Atomic sums only where there is a split to sum (one spelling per kernel).
pub fn validate_split_sums(state: &State) -> Result<(), InvalidState> {
    if state.split_k <= 1 && !state.split_sums.is_ordered() {
        return Err(InvalidState::SplitSums);
    }
    Ok(())
}

/// That `state` holds nothing but `sketch_fields` (the sketch's tiling with the split
/// and its sums): a state of a tensor-core sketch with CUDA-core fields is refused.
pub fn only_sketch_fields(state: &State, sketch_fields: State) -> Result<(), InvalidState> {
    let own = State {
        split_k: state.split_k,
        split_sums: state.split_sums,
        ..sketch_fields
    };
    if *state != own {
        return Err(InvalidState::MixedSketch);
    }
    validate_split_sums(state)
}
