//! The geometry a state implies for its task: tile extents, block and stage counts, and
//! the shared-memory tile of each input (the box its affine indices touch).
//!
//! Lowering, validation and the analytical features all read these numbers, so they are
//! computed in one place.
//!
//! A shared tile is a box over the input's dimensions; its memory order follows the
//! state's `SharedLayout`: the dimensions in the tensor's order with the layout's
//! innermost one moved last, and each row of that contiguous dimension padded by `pad`
//! floats. Everything that addresses the tile (the fetch's stores, the inner product's
//! reads, the features' simulations) goes through `SharedTile::strides`; the box's own
//! row-major order (`elements`, the fetch's vector numbering) stays the tensor's, so the
//! global reads stay coalesced whatever the layout.

use crate::state::{SharedLayout, State, UNROLL_STEPS};
use crate::task::{Access, AxisRef, Contraction};

/// The shared-memory copy of one input for one stage: a box over the input's dimensions
/// starting at the stage's base index, laid out with `innermost` contiguous and rows
/// padded by `pad` floats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedTile {
    /// Extent of the box per input dimension.
    pub shape: Vec<i64>,
    /// Offset of the tile in the kernel's shared pool, in floats (16-byte aligned).
    pub offset: i64,
    /// The dimension stored contiguously (the last one in the tensor's own order).
    pub innermost: usize,
    /// Floats after each row of the contiguous dimension.
    pub pad: i64,
}

impl SharedTile {
    /// A tile of `shape` with `layout` (whose innermost dimension must be one of the
    /// shape's; see `validate::check_structure`).
    pub fn new(shape: Vec<i64>, offset: i64, layout: SharedLayout) -> Self {
        let last = shape.len().saturating_sub(1);
        SharedTile {
            innermost: layout.innermost.map_or(last, usize::from),
            pad: i64::from(layout.pad),
            shape,
            offset,
        }
    }

    /// Elements of the box (what the fetch loads), padding excluded.
    pub fn elements(&self) -> i64 {
        self.shape.iter().product()
    }

    /// Floats of one row of the contiguous dimension, padding included.
    pub fn row(&self) -> i64 {
        self.shape.get(self.innermost).copied().unwrap_or(1) + self.pad
    }

    /// Floats the tile occupies in shared memory: rows x padded row length.
    pub fn allocated(&self) -> i64 {
        let rows: i64 = self
            .shape
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != self.innermost)
            .map(|(_, &e)| e)
            .product();
        rows * self.row()
    }

    /// Whether the layout is the tensor's own order without padding (the row-major
    /// box, as before layouts existed).
    pub fn is_natural(&self) -> bool {
        self.pad == 0 && self.innermost + 1 >= self.shape.len()
    }

    /// Shared-memory strides of the box's dimensions, in floats: the innermost
    /// dimension 1, the padded row length for the next one out, and so on outwards in
    /// the tensor's order.
    pub fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        let mut stride = self.row();
        for d in (0..self.shape.len()).rev() {
            if d != self.innermost {
                strides[d] = stride;
                stride *= self.shape[d];
            }
        }
        strides
    }

    /// Whether the fetch may store `width` consecutive floats of the tensor's last
    /// dimension as one aligned vector: that dimension is contiguous in shared memory and
    /// every row starts on a multiple of `width` (the tile offset is 16-byte aligned).
    /// Otherwise the vector's components are stored one by one.
    pub fn vector_store(&self, width: i64) -> bool {
        width == 1 || (self.innermost + 1 == self.shape.len() && self.row() % width == 0)
    }
}

/// The tile dimensions of input `input` that a layout may make innermost besides the
/// tensor's own order (None, listed first): every dimension but the last whose index
/// involves a spatial axis — matmul A's `m`, conv2d weight's `k`, conv2d data's `h`.
/// Along those, the inner product's lanes (thread coordinates) and a thread's register
/// tile read different elements; along a reduction-only dimension every lane reads the
/// same element.
pub fn innermost_choices(c: &Contraction, input: usize) -> Vec<Option<u8>> {
    let access = &c.inputs[input];
    let last = access.index.len().saturating_sub(1);
    std::iter::once(None)
        .chain(
            access.index[..last]
                .iter()
                .enumerate()
                .filter(|(_, index)| {
                    index
                        .terms
                        .iter()
                        .any(|(axis, _)| matches!(axis, AxisRef::Spatial(_)))
                })
                .filter_map(|(d, _)| u8::try_from(d).ok().map(Some)),
        )
        .collect()
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
        let first = SharedTile::new(box_shape(&c.inputs[0]), 0, state.shared_layout[0]);
        let second_offset = round_up(first.allocated(), ALIGN_FLOATS);
        let second = SharedTile::new(
            box_shape(&c.inputs[1]),
            second_offset,
            state.shared_layout[1],
        );
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
        let floats = self.tiles[1].offset + self.tiles[1].allocated();
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

/// The smallest of `UNROLL_STEPS` that unrolls exactly the loops `s`'s depth does (a
/// reduction loop of one iteration is no loop: whether it would be unrolled does not
/// count; a fetch's decision counts even then, since register prefetch requires it). Depths
/// between two of a state's thresholds give the same kernel, byte for byte: in two
/// 1536-trial resnet f32 tunes, 4-5% of the candidates differed from an earlier one only
/// there (mostly 512 against 1024). States hold this depth, so that the search does not
/// spend trials on a kernel it has measured.
pub fn canonical_unroll(c: &Contraction, s: &State) -> u32 {
    let tiling = Tiling::new(c, s);
    let loops = |f: fn(&crate::state::ReductionSplit) -> u32| {
        s.reduction.iter().map(f).product::<u32>() > 1
    };
    let (inner_loops, middle_loops) = (loops(|r| r.inner), loops(|r| r.middle));
    let mut t = s.clone();
    let mut unrolled = |depth: u32| {
        t.unroll_max_step = depth;
        let reduction = ReductionUnroll::of(&t);
        let fetch = [0, 1].map(|input| {
            let width = i64::from(t.vector_width[input]);
            fetch_unrolled(tiling.fetch_rounds(input, &t), width, &t)
        });
        (
            reduction.inner && inner_loops,
            reduction.middle && middle_loops,
            fetch,
        )
    };
    let own = unrolled(s.unroll_max_step);
    UNROLL_STEPS
        .into_iter()
        .find(|&depth| unrolled(depth) == own)
        .unwrap_or(s.unroll_max_step)
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

    /// Floats one stage's fetch holds per thread (all rounds of both inputs): the
    /// registers that register prefetch keeps live.
    pub fn prefetch_floats(&self, state: &State) -> i64 {
        (0..2)
            .map(|i| self.fetch_rounds(i, state) * i64::from(state.vector_width[i]))
            .sum()
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
