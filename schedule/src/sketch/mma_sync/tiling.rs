//! The `mma.sync` sketch's tiling, as its records hold it (`"mma"`), and its limits.

use crate::serde_default::{is_false, is_zero};
use serde::{Deserialize, Serialize};

/// The tensor-core sketch's limits (`MmaTiling`). Deepest pipeline it builds:
pub const MAX_STAGES: u32 = 8;
/// Most warps per block.
pub const MAX_WARPS: u32 = 8;
/// Most k-steps per shared tile.
pub const MAX_K_STEPS: u32 = 8;
/// Most copies per thread per input and stage: each one's row-side coordinates and
/// shared position stay in registers through the reduction loop (hoisted), so more
/// would spill (NVRTC's sm_90 kernels with 32 one-element rounds hit 255 registers
/// and stack frames).
pub const MAX_COPY_ROUNDS: i64 = 8;

/// Tile sizes and annotations of a tensor-core state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MmaTiling {
    /// Output rows (GEMM M) and columns (GEMM N) per thread block.
    pub block_m: u32,
    pub block_n: u32,
    /// Warps along M and N; each warp's tile is `block_m / warps_m × block_n / warps_n`,
    /// a multiple of the 16 × 8 MMA tile.
    pub warps_m: u32,
    pub warps_n: u32,
    /// Reduction elements per shared-memory tile, in MMA k-steps (32 bytes of a row):
    /// 1, 2, 4 or 8, so that every shared row is a power of two of 16-byte chunks.
    pub k_steps: u32,
    /// Shared-memory tiles in flight (the `cp.async` pipeline depth), 1..=`MAX_STAGES`.
    pub stages: u32,
    /// Elements per copy of each input's fill: 16, 8 or 4 bytes through `cp.async`,
    /// or one 2-byte half through an ordinary load and store.
    pub vector: [u32; 2],
    /// XOR-swizzled shared rows (conflict-free `ldmatrix`) or plain ones.
    pub swizzle: bool,
    /// A channels-last convolution's activations staged as raw input-row runs, one
    /// filter row per K tile, and its weights held for the whole reduction
    /// (`row_span`). Left out of the JSON when off.
    #[serde(default, skip_serializing_if = "is_false")]
    pub row_span: bool,
    /// Persistent blocks (row spans only): this many blocks each hold one N tile's
    /// weights and work through every `persistent / N tiles`-th M tile (0: one block
    /// per tile). Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub persistent: u32,
    /// Stream-K over this many blocks (0: none): the output tiles' K tiles dealt in
    /// even runs (`crate::stream_k`), a run's parts of tiles meeting in the workspace.
    /// Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stream_k: u32,
}
