//! States: the multi-level tiling sketch with every tile size and annotation filled in.
//!
//! The sketch is Ansor's GPU structure "SSSRRSRS": each spatial axis is split into five
//! levels (block, virtual thread, thread, outer register, inner register) and each
//! reduction axis into three (outer, middle, inner). Both inputs are staged in shared
//! memory at the outer reduction level by all threads of the block; each thread
//! accumulates its register tile (virtual thread × outer × inner register factors per
//! spatial axis) and writes it out through the fused epilogue. A state stores only the
//! inner factors: the outermost level is whatever remains, rounded up, so extents need
//! not be divisible (the tail is predicated).
//!
//! A state serializes to JSON and replays into the identical kernel.

use crate::task::Contraction;
use serde::{Deserialize, Serialize};

/// Inner split factors of one spatial axis; the block level is
/// `ceil(extent / (vthread * thread * outer * inner))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpatialSplit {
    pub vthread: u32,
    pub thread: u32,
    /// Outer register level (loop between the middle and inner reduction loops).
    pub outer: u32,
    /// Inner register level (innermost loop).
    pub inner: u32,
}

impl SpatialSplit {
    /// Output elements of this axis per block.
    pub fn block_tile(&self) -> u32 {
        self.vthread * self.thread * self.outer * self.inner
    }

    /// Output elements of this axis per thread (its register tile).
    pub fn register_tile(&self) -> u32 {
        self.vthread * self.outer * self.inner
    }
}

/// Inner split factors of one reduction axis; the outer level (one shared-memory stage
/// per step) is `ceil(extent / (middle * inner))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReductionSplit {
    pub middle: u32,
    pub inner: u32,
}

impl ReductionSplit {
    /// Reduction elements of this axis per shared-memory stage.
    pub fn stage_tile(&self) -> u32 {
        self.middle * self.inner
    }
}

/// Unroll depths the search chooses from (Ansor's `auto_unroll_max_step` values).
pub const UNROLL_STEPS: [u32; 5] = [0, 16, 64, 512, 1024];

/// Vector widths (in floats) of the cooperative global-to-shared fetch.
pub const VECTOR_WIDTHS: [u32; 3] = [1, 2, 4];

/// A concrete schedule of a task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct State {
    /// One split per spatial axis of the task's contraction, in axis order.
    pub spatial: Vec<SpatialSplit>,
    /// One split per reduction axis, in axis order.
    pub reduction: Vec<ReductionSplit>,
    /// Reduction and fetch loops whose total unrolled body is at most this many
    /// iterations are unrolled; register-tile loops are always unrolled.
    pub unroll_max_step: u32,
    /// Floats per global load of each input's cooperative fetch.
    pub vector_width: [u32; 2],
}

impl State {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.spatial.iter().map(|s| s.thread).product()
    }

    /// Product of the virtual-thread factors.
    pub fn vthreads(&self) -> u32 {
        self.spatial.iter().map(|s| s.vthread).product()
    }

    /// Accumulator registers per thread.
    pub fn accumulators(&self) -> u32 {
        self.spatial.iter().map(|s| s.register_tile()).product()
    }

    /// Thread blocks per axis.
    pub fn blocks_per_axis(&self, c: &Contraction) -> Vec<u32> {
        c.spatial
            .iter()
            .zip(&self.spatial)
            .map(|(a, s)| a.extent.div_ceil(s.block_tile()))
            .collect()
    }

    /// Outer reduction steps (shared-memory stages) per reduction axis.
    pub fn stages_per_axis(&self, c: &Contraction) -> Vec<u32> {
        c.reduction
            .iter()
            .zip(&self.reduction)
            .map(|(a, r)| a.extent.div_ceil(r.stage_tile()))
            .collect()
    }

    /// Thread blocks in the grid.
    pub fn blocks(&self, c: &Contraction) -> u64 {
        self.blocks_per_axis(c)
            .iter()
            .map(|&b| u64::from(b))
            .product()
    }

    /// The state as one line of JSON (its replayable form).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a state always serializes")
    }

    /// A short stable identifier: 64-bit FNV-1a of the JSON, in hex.
    pub fn id(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.to_json().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}
