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

fn round_up(value: i64, multiple: i64) -> i64 {
    (value + multiple - 1) / multiple * multiple
}
