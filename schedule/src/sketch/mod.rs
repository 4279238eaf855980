//! Sketches: the kinds of kernel the search explores, one folder each behind one
//! interface, [`Sketch`]. A sketch's folder holds its tiling type (`tiling.rs`, the
//! fields its records hold), what the tiling means for a task and what it refuses
//! (`geometry.rs`; the CUDA-core sketch's refusals in `validate.rs`), its draws (`draw.rs`), its neighbours for mutation
//! and DGD (`steps.rs`, one definition both use), its adaptation to another shape
//! (`Sketch::repair`) and its lowering (`lower.rs`). What the sketches share stays in
//! shared modules they use (`stream_k`, `row_span`, `staging`, `lower::common`, the split
//! steps below).
//!
//! Everything outside asks a state's sketch ([`State::sketch`]) and never matches on it.
//! A new sketch is a folder here, its variant in [`SketchTiling`] (`tiling.rs`) with its
//! arm in `State::sketch`, and its draw in `Sampler::DRAWS` (`draw.rs`); its features are
//! a file of the `features` crate.

pub mod cuda_core;
pub mod draw;
pub mod mma_sync;
pub mod tiling;
pub mod wgmma;

use crate::gpu_spec::GpuSpec;
use crate::invalid::InvalidState;
use crate::ir::Kernel;
use crate::sketch::cuda_core::tiling::CudaCore;
use crate::sketch::tiling::SketchTiling;
use crate::state::{MAX_SPLIT_K, State};
use crate::task::{Contraction, Task};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;

/// What the search, validation, transfer, lowering and the features ask of a state's
/// sketch. Each method takes the state whose sketch it is (for the fields every sketch
/// shares: the reduction split and its sums).
pub trait Sketch: Sync {
    /// The sketch's name, as reports print it: `cuda-core`, `mma.sync`, `wgmma`.
    fn name(&self) -> &'static str;

    /// Threads per block.
    fn threads(&self, s: &State) -> u32;

    /// Shared-memory stages of one output tile's whole reduction (the loop a
    /// reduction split cuts into chunks); 1 for a sketch without one.
    fn stages(&self, _c: &Contraction, _s: &State) -> u64 {
        1
    }

    /// Thread blocks that together cover the output once.
    fn spatial_blocks(&self, c: &Contraction, s: &State) -> u64;

    /// Thread blocks in the grid.
    fn blocks(&self, c: &Contraction, s: &State) -> u64 {
        self.spatial_blocks(c, s) * u64::from(s.split_k)
    }

    /// Whether this sketch's state may split its reduction across blocks at all (the
    /// stage count decides the rest, `State::may_split`); no by default.
    fn may_split(&self, _c: &Contraction, _s: &State) -> bool {
        false
    }

    /// Whether `s` can run (and run well) for `c` on `gpu`, or why not.
    fn validate(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Result<(), InvalidState>;

    /// The state's coordinates, canonical: two valid states of one task have the same
    /// vector exactly when they are the same state: by default the bytes of its JSON
    /// (its identity); the built-in sketches lead with a number of their own.
    fn tile_vector(&self, s: &State) -> Vec<u32> {
        s.to_json().bytes().map(u32::from).collect()
    }

    /// Every valid state one step away from `s`, in a fixed order: DGD's lattice.
    fn neighbours(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State>;

    /// A valid mutant of `s`, or None when the drawn mutation gave none; by default one
    /// of its neighbours, uniformly.
    fn mutate(
        &self,
        c: &Contraction,
        s: &State,
        gpu: &GpuSpec,
        rng: &mut ChaCha8Rng,
    ) -> Option<State> {
        pick_one(rng, self.neighbours(c, s, gpu))
    }

    /// Adaptation to another shape (`crate::adapt`): `s` with the one field of this
    /// sketch's tiling that `why` refuses for the new shape `c` fitted to it, or None
    /// when no shape-dependent field of the sketch explains it (none by default).
    fn repair(&self, _s: &State, _why: &InvalidState, _c: &Contraction) -> Option<State> {
        None
    }

    /// Lowers a validated state of `task` to its loop nest.
    fn lower(&self, task: &Task, s: &State) -> Kernel;
}

impl State {
    /// The sketch the state belongs to: the one place that tells them apart.
    pub fn sketch(&self) -> &dyn Sketch {
        match &self.tiling {
            SketchTiling::CudaCore => &CudaCore,
            SketchTiling::MmaSync(t) => t,
            SketchTiling::Wgmma(t) => t,
            #[cfg(test)]
            SketchTiling::OneThread(t) => t,
        }
    }
}

/// `rng`'s index in `0..n`.
pub fn pick(rng: &mut ChaCha8Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// One of `moves`, uniformly, or None when there is none.
pub fn pick_one(rng: &mut ChaCha8Rng, mut moves: Vec<State>) -> Option<State> {
    if moves.is_empty() {
        return None;
    }
    let i = pick(rng, moves.len());
    Some(moves.swap_remove(i))
}

/// The reduction splits one doubling or halving away from `s`'s that `c` allows:
/// at least 1, at most `MAX_SPLIT_K` and the stage count.
pub fn split_steps(c: &Contraction, s: &State) -> Vec<u32> {
    if !s.may_split(c) {
        return Vec::new();
    }
    let max = s.stages(c).min(u64::from(MAX_SPLIT_K));
    [s.split_k / 2, s.split_k.saturating_mul(2)]
        .into_iter()
        .filter(|&k| k >= 1 && k != s.split_k && u64::from(k) <= max)
        .collect()
}

#[cfg(test)]
mod one_thread;
