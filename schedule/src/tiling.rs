//! The geometry a state implies for its task: tile extents, block and stage counts, and
//! the shared-memory tile of each input (the box its affine indices touch).
//!
//! Lowering, validation and (later) the analytical features all read these numbers, so
//! they are computed in one place.

use crate::state::State;
use crate::task::{Access, AxisRef, Contraction};

/// The shared-memory copy of one input for one stage: a row-major box over the input's
/// dimensions starting at the stage's base index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedTile {
    /// Extent of the box per input dimension.
    pub shape: Vec<i64>,
    /// Offset of the tile in the kernel's shared pool, in floats (16-byte aligned).
    pub offset: i64,
}

impl SharedTile {
    pub fn elements(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Row-major strides of the box.
    pub fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        for d in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * self.shape[d + 1];
        }
        strides
    }
}

/// Tile extents and shared-memory layout of a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiling {
    /// Output elements per block, per spatial axis.
    pub block_tile: Vec<i64>,
    /// Reduction elements per stage, per reduction axis.
    pub stage_tile: Vec<i64>,
    /// Blocks per spatial axis.
    pub blocks: Vec<i64>,
    /// Stages per reduction axis.
    pub stages: Vec<i64>,
    pub tiles: [SharedTile; 2],
}

/// Floats per 16 bytes: shared tiles start on 16-byte boundaries so that vector
/// accesses to them are aligned.
const ALIGN_FLOATS: i64 = 4;

impl Tiling {
    /// The geometry of `state` for contraction `c`. The state must have one split per
    /// axis (see `validate::check_structure`).
    pub fn new(c: &Contraction, state: &State) -> Tiling {
        let block_tile: Vec<i64> = state
            .spatial
            .iter()
            .map(|s| i64::from(s.block_tile()))
            .collect();
        let stage_tile: Vec<i64> = state
            .reduction
            .iter()
            .map(|r| i64::from(r.stage_tile()))
            .collect();
        let blocks = state
            .blocks_per_axis(c)
            .into_iter()
            .map(i64::from)
            .collect();
        let stages = state
            .stages_per_axis(c)
            .into_iter()
            .map(i64::from)
            .collect();
        let tile_of = |axis: AxisRef| match axis {
            AxisRef::Spatial(i) => block_tile[i],
            AxisRef::Reduction(i) => stage_tile[i],
        };
        let box_shape = |access: &Access| -> Vec<i64> {
            access
                .index
                .iter()
                .map(|index| {
                    1 + index
                        .terms
                        .iter()
                        .map(|&(axis, coeff)| coeff * (tile_of(axis) - 1))
                        .sum::<i64>()
                })
                .collect()
        };
        let first = SharedTile {
            shape: box_shape(&c.inputs[0]),
            offset: 0,
        };
        let second_offset = round_up(first.elements(), ALIGN_FLOATS);
        let second = SharedTile {
            shape: box_shape(&c.inputs[1]),
            offset: second_offset,
        };
        Tiling {
            block_tile,
            stage_tile,
            blocks,
            stages,
            tiles: [first, second],
        }
    }

    /// Dynamic shared memory of the kernel in bytes.
    pub fn shared_bytes(&self) -> u64 {
        let floats = self.tiles[1].offset + self.tiles[1].elements();
        (round_up(floats, ALIGN_FLOATS) * 4) as u64
    }

    /// Tile extent of an axis: the block tile of a spatial axis, the stage tile of a
    /// reduction axis.
    pub fn tile(&self, axis: AxisRef) -> i64 {
        match axis {
            AxisRef::Spatial(i) => self.block_tile[i],
            AxisRef::Reduction(i) => self.stage_tile[i],
        }
    }

    /// Whether input `input` can be fetched `width` floats at a time: its innermost
    /// dimension must be one axis with unit stride, and the tensor row, the axis extent,
    /// the tile and the offset all multiples of `width`, so that every vector is aligned
    /// and lies wholly inside or wholly outside the tensor.
    pub fn vector_feasible(&self, c: &Contraction, input: usize, width: u32) -> bool {
        if width == 1 {
            return true;
        }
        let width = i64::from(width);
        let access = &c.inputs[input];
        let last = access.index.len() - 1;
        let index = &access.index[last];
        let [(axis, 1)] = index.terms[..] else {
            return false;
        };
        let extent = match axis {
            AxisRef::Spatial(i) => c.spatial[i].extent,
            AxisRef::Reduction(i) => c.reduction[i].extent,
        };
        index.offset % width == 0
            && i64::from(access.shape[last]) % width == 0
            && i64::from(extent) % width == 0
            && self.tile(axis) % width == 0
    }
}

/// Which reduction loops are unrolled: a loop is unrolled when the multiply-adds it
/// would replicate (its iterations, the loops inside it, and the whole register tile)
/// are at most `unroll_max_step`. Shared by lowering and the register estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReductionUnroll {
    pub inner: bool,
    pub middle: bool,
}

impl ReductionUnroll {
    pub fn of(state: &State) -> Self {
        let step = u64::from(state.unroll_max_step);
        let product = |f: fn(&crate::state::ReductionSplit) -> u32| {
            state
                .reduction
                .iter()
                .map(|r| u64::from(f(r)))
                .product::<u64>()
        };
        let inner_total = u64::from(state.accumulators()) * product(|r| r.inner);
        let middle_total = inner_total * product(|r| r.middle);
        ReductionUnroll {
            inner: inner_total <= step,
            middle: middle_total <= step,
        }
    }

    /// Reduction steps laid out straight-line by the unrolling (at least 1).
    pub fn unrolled_steps(&self, state: &State) -> u64 {
        let mut steps = 1;
        for r in &state.reduction {
            if self.inner {
                steps *= u64::from(r.inner);
            }
            if self.middle {
                steps *= u64::from(r.middle);
            }
        }
        steps
    }
}

/// Multiply-adds' worth of unroll budget that one fetched float in flight costs: an
/// unrolled fetch issues all its loads before any store, so every float of every round
/// holds a register until the stores.
const FETCH_FLOAT_COST: i64 = 32;

/// Whether a cooperative fetch of `rounds` rounds of `width` floats is unrolled.
pub fn fetch_unrolled(rounds: i64, width: i64, state: &State) -> bool {
    rounds * width * FETCH_FLOAT_COST <= i64::from(state.unroll_max_step)
}

impl Tiling {
    /// Fetch rounds of input `input` per stage with `threads` threads.
    pub fn fetch_rounds(&self, input: usize, state: &State) -> i64 {
        let width = i64::from(state.vector_width[input]);
        let threads = i64::from(state.threads());
        let vectors = self.tiles[input].elements() / width;
        (vectors + threads - 1) / threads
    }

    /// Floats the unrolled fetches hold in registers at once (0 when none is unrolled).
    pub fn fetch_floats_in_flight(&self, state: &State) -> i64 {
        (0..2)
            .map(|i| {
                let rounds = self.fetch_rounds(i, state);
                let width = i64::from(state.vector_width[i]);
                if fetch_unrolled(rounds, width, state) {
                    rounds * width
                } else {
                    width
                }
            })
            .sum()
    }
}

fn round_up(value: i64, multiple: i64) -> i64 {
    (value + multiple - 1) / multiple * multiple
}
