//! The `wgmma` sketch's tiling, as its records hold it (`"wgmma"`), and its limits.

use crate::serde_default::is_zero;
use serde::{Deserialize, Serialize};

/// Deepest shared ring of the `wgmma` sketch.
pub const MAX_WGMMA_STAGES: u32 = 8;

/// M tiles per raster band (`WgmmaTiling::raster`) the search may choose, besides 0.
pub const RASTER_GROUPS: [u32; 4] = [2, 4, 8, 16];

/// Tile sizes and annotations of a `wgmma` state (see `wgmma`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WgmmaTiling {
    /// Consumer warpgroups per block, stacked along M: 1 or 2.
    pub consumers: u32,
    /// 64-row warpgroup MMAs per consumer along M: 1 or 2.
    pub m_atoms: u32,
    /// Output columns per block, the instructions' N: a multiple of 8 up to 256.
    pub block_n: u32,
    /// Bytes of K per shared row and stage (32, 64 or 128): the swizzle's span.
    pub k_bytes: u32,
    /// Shared buffers in the mbarrier ring, 1..=`MAX_WGMMA_STAGES`.
    pub stages: u32,
    /// Groups of MMAs left in flight while the next tile's are issued: 0 or 1.
    pub in_flight: u32,
    /// Persistent blocks: this many blocks each work through every `persistent`-th
    /// output tile (0: one block per tile). Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub persistent: u32,
    /// Warp specialization: 1 adds a producer warp that issues the copies while the
    /// consumer warpgroups multiply; 0 leaves the copies to thread 0 between its MMAs.
    /// Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub producer_warp: u32,
    /// The order of the output tiles (grouped rasterization): 0 walks them row by row
    /// (N fastest); `g` walks bands of `g` M tiles column by column (M fastest within
    /// the band), so that the tiles in flight at once share fewer rows of A and columns
    /// of B and their operands stay in L2. `g` divides the M tiles. Left out of the JSON
    /// when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub raster: u32,
    /// Thread-block clusters: 0 for none, or the blocks of one (2, 4 or 8), on a
    /// rectangle of neighbouring tiles (`cluster_m`). With `cluster_m` 0, pairs of
    /// blocks on neighbouring tiles of the raster order, which share an operand (B
    /// where the neighbours are along M, in a raster band; A where they are along N,
    /// row by row). Each block copies its share of a tile it shares with TMA multicast
    /// into every block that shares it. Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cluster: u32,
    /// A cluster's blocks along M (`cluster / cluster_m` along N): the blocks of a
    /// cluster's row share A's tile, those of its column B's, each copying its share
    /// and multicasting it to the others (like cuDNN's Hopper kernels' clusters of 2×4
    /// tiles, which cut what small grids read from L2). 0: a cluster of two laid out as
    /// the raster order puts neighbours (the pairs above). Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cluster_m: u32,
    /// The epilogue's stores: 0 stores each thread's results straight from its
    /// registers; 1 stages each warpgroup's results, 64 rows by one swizzle span of
    /// columns at a time, in shared memory (two buffers per warpgroup) and writes them
    /// with TMA stores, which run behind the next tile's MMAs and clip the tails. Left
    /// out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tma_store: u32,
    /// Stream-K: this many blocks share the reduction's K tiles of every output tile
    /// evenly (each a contiguous run of the tile-major order, which may start and end
    /// inside a tile), where a split only deals whole chunks; 0 for none. A tile that one
    /// block covers whole is stored as it is; the others' blocks add their partial sums
    /// into the tile's in the workspace, and the block that completes its K tiles
    /// (counted on a semaphore) runs the epilogue. Left out of the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stream_k: u32,
}
