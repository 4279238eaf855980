//! The CUDA-core sketch's tiling: the split factors of each spatial and reduction axis
//! and each input's shared layout, kept in `State`'s own fields (the sketch's JSON is
//! the first records' JSON), and the values the search draws them from.

use crate::serde_default::is_zero;
use serde::{Deserialize, Serialize};

/// The CUDA-core sketch (Ansor's "SSSRRSRS" multi-level tiling, `crate::state`): its
/// tiling is the state's per-axis fields, so the sketch itself holds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CudaCore;

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
    /// No split: the whole axis in blocks of one element, one thread each.
    pub const UNIT: SpatialSplit = SpatialSplit {
        vthread: 1,
        thread: 1,
        outer: 1,
        inner: 1,
    };

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
    /// No split: one element of the axis per stage.
    pub const UNIT: ReductionSplit = ReductionSplit {
        middle: 1,
        inner: 1,
    };

    /// Reduction elements of this axis per shared-memory stage.
    pub fn stage_tile(&self) -> u32 {
        self.middle * self.inner
    }
}

/// Unroll depths the search chooses from (Ansor's `auto_unroll_max_step` values).
pub const UNROLL_STEPS: [u32; 5] = [0, 16, 64, 512, 1024];

/// Vector widths (in floats) of the cooperative global-to-shared fetch.
pub const VECTOR_WIDTHS: [u32; 3] = [1, 2, 4];

/// Row paddings (floats added to each row of a shared tile's contiguous dimension) the
/// search chooses from. 0 and 4 keep rows 16-byte aligned when the row length is a
/// multiple of 4; 1 and 2 shift consecutive rows by one or two banks.
pub const SHARED_PADS: [u32; 4] = [0, 1, 2, 4];

/// How one input's shared-memory tile is laid out. The default is the tensor's own
/// dimension order, unpadded: the row-major box every state had before layouts existed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SharedLayout {
    /// The tile dimension (an index into the input tensor's dimensions) stored
    /// contiguously in shared memory, the others keeping their order outside it; None:
    /// the tensor's own order (its last dimension contiguous). Never the tensor's last
    /// dimension (that is None; validation refuses the duplicate spelling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub innermost: Option<u8>,
    /// Floats added after each row of the contiguous dimension (one of `SHARED_PADS`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pad: u32,
}

impl SharedLayout {
    /// The tensor's own order, unpadded.
    pub const NATURAL: SharedLayout = SharedLayout {
        innermost: None,
        pad: 0,
    };

    pub fn is_natural(&self) -> bool {
        *self == Self::NATURAL
    }
}
