//! The numbers a state implies for its task, as the simulations need them: thread,
//! block and stage counts (output tiles, split-K blocks per tile, stages per tile and
//! per block), and the coordinates lowering gives to a thread, a block and a stage
//! index.
//!
//! It also decides which states are too malformed to describe (wrong arity, a zero
//! factor, products that would overflow the schedule crate's arithmetic): those get a
//! feature vector with only the task's values, rather than a panic.

use crate::warp::{MAX_WIDTH, WARP_LANES};
use schedule::sketch::cuda_core::check_structure;
use schedule::sketch::cuda_core::{ReductionUnroll, Tiling};
use schedule::task::{AxisRef, Contraction};
use schedule::{SketchTiling, State};

/// Most axes or tensor dimensions handled (conv2d has 4 spatial axes and 4-D tensors).
pub(crate) const MAX_AXES: usize = 8;

/// Per-axis (or per-dimension) integers, the first `n` meaningful.
pub(crate) type Coords = [i64; MAX_AXES];

/// Largest factor product accepted: far beyond any launchable kernel, small enough that
/// every count below fits in i64 and the schedule crate's u32 products cannot overflow.
const MAX_PRODUCT: u64 = 1 << 24;
/// Largest shared tile (floats) accepted, for the same reason.
const MAX_TILE_ELEMENTS: f64 = (1u64 << 36) as f64;

/// A state's geometry, for one task.
pub(crate) struct Geometry<'a> {
    pub state: &'a State,
    pub tiling: Tiling,
    pub threads: i64,
    pub warps: i64,
    /// Output tiles: the blocks of one reduction split (the grid without split-K).
    pub tiles: i64,
    /// Blocks sharing one tile's reduction (the state's `split_k`).
    pub split_k: i64,
    /// Thread blocks in the grid: `tiles x split_k`.
    pub grid_blocks: i64,
    /// Shared-memory stages of one tile's whole reduction (outer reduction iterations).
    pub stages: i64,
    /// Stages one block runs at most: `ceil(stages / split_k)`.
    pub block_stages: i64,
    pub steps_per_stage: i64,
    pub unroll: ReductionUnroll,
    /// Reduction steps in one straight-line (unrolled) body of the inner product.
    pub unrolled_steps: i64,
    pub thread_extents: Coords,
}

impl<'a> Geometry<'a> {
    /// The geometry, or None when the state is too malformed to describe.
    pub(crate) fn new(c: &Contraction, state: &'a State) -> Option<Self> {
        // The CUDA-core sketch's geometry: a tensor-core state has none.
        if state.tiling != SketchTiling::CudaCore || !describable(c, state) {
            return None;
        }
        let tiling = Tiling::new(c, state);
        let threads = i64::from(state.threads());
        let unroll = ReductionUnroll::of(state);
        let mut thread_extents = [1; MAX_AXES];
        for (e, s) in thread_extents.iter_mut().zip(&state.spatial) {
            *e = i64::from(s.thread);
        }
        let tiles: i64 = tiling.blocks.iter().product();
        let stages: i64 = tiling.stages.iter().product();
        let split_k = i64::from(state.split_k);
        Some(Geometry {
            state,
            threads,
            warps: (threads + WARP_LANES as i64 - 1) / WARP_LANES as i64,
            tiles,
            split_k,
            grid_blocks: tiles * split_k,
            stages,
            block_stages: (stages + split_k - 1) / split_k,
            steps_per_stage: state
                .reduction
                .iter()
                .map(|r| i64::from(r.stage_tile()))
                .product(),
            unroll,
            unrolled_steps: unroll.unrolled_steps(state) as i64,
            thread_extents,
            tiling,
        })
    }

    pub(crate) fn spatial_axes(&self) -> usize {
        self.state.spatial.len()
    }

    /// Block coordinates of a linear tile index (blockIdx.x without the split
    /// coordinate, last axis fastest).
    pub(crate) fn block_coords(&self, linear: i64) -> Coords {
        row_major(linear, &self.tiling.blocks)
    }

    /// Stage coordinates of a linear stage index (first reduction axis outermost).
    pub(crate) fn stage_coords(&self, linear: i64) -> Coords {
        row_major(linear, &self.tiling.stages)
    }

    /// Thread coordinates of threadIdx.x (last spatial axis fastest).
    pub(crate) fn thread_coords(&self, tid: i64) -> Coords {
        row_major(tid, &self.thread_extents[..self.spatial_axes()])
    }

    /// The coordinates of the next thread.
    pub(crate) fn next_thread(&self, coords: &mut Coords) {
        advance(coords, &self.thread_extents[..self.spatial_axes()], 1);
    }

    /// The tile extent of an axis: the block tile of a spatial axis, the stage tile of a
    /// reduction axis.
    pub(crate) fn tile(&self, axis: AxisRef) -> i64 {
        self.tiling.tile(axis)
    }
}

/// Coordinates of `linear` in a row-major box of `extents` (last fastest).
pub(crate) fn row_major(mut linear: i64, extents: &[i64]) -> Coords {
    let mut coords = [0; MAX_AXES];
    for d in (0..extents.len()).rev() {
        let e = extents[d].max(1);
        coords[d] = linear % e;
        linear /= e;
    }
    coords
}

/// Adds `step` to the last coordinate and carries into the outer ones.
pub(crate) fn advance(coords: &mut Coords, extents: &[i64], step: i64) {
    let Some(last) = extents.len().checked_sub(1) else {
        return;
    };
    coords[last] += step;
    for d in (1..=last).rev() {
        let e = extents[d].max(1);
        if coords[d] < e {
            return;
        }
        // Steps are at most a vector width: subtracting beats dividing.
        while coords[d] >= e {
            coords[d] -= e;
            coords[d - 1] += 1;
        }
    }
}

/// Whether the schedule crate's geometry can be computed for `state` without overflow.
fn describable(c: &Contraction, state: &State) -> bool {
    if check_structure(c, state).is_err()
        || c.spatial.len() > MAX_AXES
        || c.reduction.len() > MAX_AXES
        || c.inputs.iter().any(|a| a.index.len() > MAX_AXES)
    {
        return false;
    }
    if state
        .vector_width
        .iter()
        .any(|&w| w == 0 || i64::from(w) > MAX_WIDTH)
    {
        return false;
    }
    // Each split first, so that the schedule crate's per-split u32 products are safe.
    let spatial_ok = state
        .spatial
        .iter()
        .all(|s| bounded([s.vthread, s.thread, s.outer, s.inner]))
        && bounded(state.spatial.iter().map(|s| s.thread))
        && bounded(state.spatial.iter().map(|s| s.register_tile()))
        && bounded(state.spatial.iter().map(|s| s.vthread));
    let reduction_ok = bounded(state.reduction.iter().flat_map(|r| [r.middle, r.inner]))
        && bounded([state.split_k]);
    if !spatial_ok || !reduction_ok {
        return false;
    }
    // The shared tiles: one box per input over its dimensions.
    let tile = |axis: AxisRef| match axis {
        AxisRef::Spatial(i) => f64::from(state.spatial[i].block_tile()),
        AxisRef::Reduction(i) => f64::from(state.reduction[i].stage_tile()),
    };
    c.inputs.iter().all(|access| {
        let elements: f64 = access
            .index
            .iter()
            .map(|index| {
                1.0 + index
                    .terms
                    .iter()
                    .map(|&(axis, coeff)| coeff as f64 * (tile(axis) - 1.0))
                    .sum::<f64>()
            })
            .product();
        elements <= MAX_TILE_ELEMENTS
    })
}

/// Whether the product of `factors` is at most `MAX_PRODUCT`.
fn bounded(factors: impl IntoIterator<Item = u32>) -> bool {
    factors
        .into_iter()
        .try_fold(1u64, |acc, f| {
            acc.checked_mul(u64::from(f)).filter(|&p| p <= MAX_PRODUCT)
        })
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_and_advance_agree() {
        let extents = [3, 4, 5];
        let mut coords = row_major(0, &extents);
        for linear in 0..60 {
            assert_eq!(coords, row_major(linear, &extents));
            advance(&mut coords, &extents, 1);
        }
        let mut coords = row_major(4, &extents);
        advance(&mut coords, &extents, 4);
        assert_eq!(coords, row_major(8, &extents));
    }
}
