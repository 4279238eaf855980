//! Why a state is rejected (`InvalidState`): the one error of validation, which the
//! sketch-independent checks (`validate`) and the tensor-core sketch's own (`mma`)
//! both return, so that neither imports the other for it.

use crate::atom::tma::TmaError;
use crate::gemm::GemmError;
use crate::state::{
    MAX_COPY_ROUNDS, MAX_K_STEPS, MAX_SPLIT_K, MAX_STAGES, MAX_WARPS, MAX_WGMMA_STAGES,
    RASTER_GROUPS, SHARED_PADS, UNROLL_STEPS,
};
use crate::task::DType;
use thiserror::Error;

/// Why a state is rejected.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum InvalidState {
    #[error("state has {got} {kind} splits, the task has {expected} {kind} axes")]
    Arity {
        kind: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("a split factor is 0")]
    ZeroFactor,
    #[error("{threads} threads per block, outside {min}..={max}")]
    Threads { threads: u64, min: u64, max: u64 },
    #[error("{vthreads} virtual threads, over the cap of {max}")]
    VirtualThreads { vthreads: u64, max: u64 },
    #[error("innermost split factor {factor} over the bound of {max}")]
    InnermostFactor { factor: u32, max: u32 },
    #[error("{bytes} bytes of shared memory per block, over the limit of {max}")]
    SharedMemory { bytes: u64, max: u64 },
    #[error("about {registers} registers per thread, over the limit of {max}")]
    Registers { registers: u64, max: u64 },
    #[error("register prefetch needs unrolled fetch loops and more than one stage")]
    Prefetch,
    #[error("about {registers} registers x {threads} threads, over {max} registers per block")]
    RegistersPerBlock {
        registers: u64,
        threads: u64,
        max: u64,
    },
    #[error("unroll step {0} is not one of {UNROLL_STEPS:?}")]
    UnrollStep(u32),
    #[error("input {input} cannot be fetched {width} floats at a time")]
    VectorWidth { input: usize, width: u32 },
    #[error("{blocks} thread blocks, over the grid limit")]
    Grid { blocks: u64 },
    #[error(
        "split_k {split_k} outside 1..={max}, or leaving a chunk empty: the reduction has {stages} shared-memory stages (at most {MAX_SPLIT_K} splits)"
    )]
    SplitK { split_k: u32, stages: u64, max: u64 },
    #[error(
        "split_k {split_k} with a ReLU epilogue: split-K blocks add partial sums into the output, and max(0, x) of a partial sum is not the ReLU of the whole; use split_k 1"
    )]
    SplitKRelu { split_k: u32 },
    #[error(
        "atomic split sums without a tensor-core split: use split_k > 1 in the mma.sync or wgmma sketch, or ordered sums"
    )]
    SplitSums,
    #[error(
        "shared layout of input {input}: innermost dimension {innermost} is not one of its first {dims} (the tensor's last dimension is the natural order, written without `innermost`)"
    )]
    LayoutDimension {
        input: usize,
        innermost: u8,
        dims: usize,
    },
    #[error("shared layout of input {input}: row padding {pad} is not one of {SHARED_PADS:?}")]
    LayoutPad { input: usize, pad: u32 },
    #[error("no tensor-core state for this task: {0}")]
    NoGemm(GemmError),
    #[error("tensor cores do not multiply {0} (fp16, bf16 and tf32 only)")]
    MmaType(DType),
    #[error(
        "a tensor-core state leaves the CUDA-core fields (spatial, reduction, unroll, vector widths, layouts, prefetch) at their defaults"
    )]
    MixedSketch,
    #[error(
        "block tile {block_m}x{block_n} over {warps_m}x{warps_n} warps: each warp needs a whole number of 16x8 MMA tiles (at most {MAX_WARPS} warps)"
    )]
    MmaTiles {
        block_m: u32,
        block_n: u32,
        warps_m: u32,
        warps_n: u32,
    },
    #[error(
        "{k_steps} k-steps per shared tile and {stages} stages: k-steps a power of two up to {MAX_K_STEPS}, stages 1..={MAX_STAGES}, shared rows a power of two of 16-byte chunks"
    )]
    MmaPipeline { k_steps: u32, stages: u32 },
    #[error(
        "input {input} needs {rounds} copies per thread and stage, over {MAX_COPY_ROUNDS}: use wider copies, more warps or a smaller tile"
    )]
    MmaCopies { input: usize, rounds: i64 },
    #[error("no row-span staging for this task: {0}")]
    RowSpan(crate::row_span::RowSpanError),
    #[error(
        "a row-span K tile of {block_k} columns cannot hold a filter row's {columns} (taps and zero columns); use more k-steps"
    )]
    RowSpanColumns { block_k: u64, columns: i64 },
    #[error(
        "{blocks} persistent blocks over {tiles} tiles of {n_tiles} N tiles: persistent grids are row spans without a split, a whole number of blocks per N tile, at most one block per tile"
    )]
    MmaPersistent {
        blocks: u32,
        tiles: u64,
        n_tiles: u64,
    },
    #[error(
        "stream-K over {blocks} blocks of {iterations} K tiles (a split of {split_k}, row spans {row_span}, {persistent} persistent blocks): 2 blocks or more, fewer than the K tiles, with no split, row spans or persistent grid, and indices within 32 bits"
    )]
    MmaStreamK {
        blocks: u32,
        iterations: u64,
        split_k: u32,
        row_span: bool,
        persistent: u32,
    },
    #[error(
        "row spans copy A 16 bytes and the weights one element at a time: vector widths [8, 1], not {vector:?}"
    )]
    RowSpanVectors { vector: [u32; 2] },
    #[error(
        "split_k {split_k} with a {out} output: split-K adds partial sums with f32 atomics; use an f32 output or split_k 1"
    )]
    SplitKOutput { split_k: u32, out: DType },
    #[error(
        "no warpgroup MMA for {dtype} on {gpu} (fp16 and bf16 on Hopper, sm_90a, and TF32 with a K-major B)"
    )]
    WgmmaType { dtype: DType, gpu: String },
    #[error("no TMA copy for this task: {0}")]
    NoTma(TmaGemmError),
    #[error(
        "{consumers} consumer warpgroups of {m_atoms} 64-row MMAs, N {block_n}, {k_bytes}-byte K rows: 1 or 2 each, N a multiple of 8 up to 256 (of 16 for an N-major B), rows of 32, 64 or 128 bytes"
    )]
    WgmmaTiles {
        consumers: u32,
        m_atoms: u32,
        block_n: u32,
        k_bytes: u32,
    },
    #[error(
        "{stages} stages with {in_flight} MMA groups in flight and {producer_warp} producer warps: stages 1..={MAX_WGMMA_STAGES}, in flight 0 or 1 and below the stages, producer warps 0 or 1"
    )]
    WgmmaPipeline {
        stages: u32,
        in_flight: u32,
        producer_warp: u32,
    },
    #[error("{blocks} persistent blocks for {tiles} units of work: fewer blocks than units, or 0")]
    WgmmaPersistent { blocks: u32, tiles: u64 },
    #[error(
        "stream-K over {blocks} blocks of {iterations} K tiles (a split of {split_k}, {persistent} persistent blocks, clusters of {cluster}, TMA stores {tma_store}): 2 blocks or more, fewer than the K tiles, with no split, persistent grid, cluster or TMA store, and indices within 32 bits"
    )]
    WgmmaStreamK {
        blocks: u32,
        iterations: u64,
        split_k: u32,
        persistent: u32,
        cluster: u32,
        tma_store: u32,
    },
    #[error("{block_m} block rows over {m} GEMM rows: a whole 64-row MMA would lie outside them")]
    WgmmaIdleRows { block_m: u32, m: u64 },
    #[error(
        "clusters of {cluster} blocks, {cluster_m} along M, with {persistent} persistent blocks and a raster band of {raster}: 0, or 2, 4 or 8 blocks (with no shape, a pair; a pair's shape given only where the raster order does not imply it), a persistent grid and a band of whole clusters, each shared tile dealt out in whole swizzle atoms or boxes"
    )]
    WgmmaCluster {
        cluster: u32,
        cluster_m: u32,
        persistent: u32,
        raster: u32,
    },
    #[error(
        "TMA stores {tma_store} with split {split_k}: 0 or 1, unsplit, and an output TMA can write (its columns contiguous, rows 16-byte aligned)"
    )]
    WgmmaStore { tma_store: u32, split_k: u32 },
    #[error(
        "a raster band of {raster} M tiles over {mtiles} M tiles and {ntiles} N tiles: 0, or one of {RASTER_GROUPS:?} that divides the M tiles, with more than one N tile"
    )]
    WgmmaRaster {
        raster: u32,
        mtiles: u64,
        ntiles: u64,
    },
    #[error(
        "a split-K workspace of {bytes} bytes: its partial sums are indexed in 32 bits; split less"
    )]
    SplitWorkspace { bytes: u64 },
}

/// Why an operand is not a matrix that TMA can copy.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum TmaGemmError {
    #[error("{tensor}: an index has an offset (padding): no plain matrix to copy")]
    Offset { tensor: &'static str },
    #[error("{tensor}: a reduction axis other than the innermost has an extent over 1")]
    Reduction { tensor: &'static str },
    #[error("{tensor}: its {what} axes are not one dense row-major run")]
    NotDense {
        tensor: &'static str,
        what: &'static str,
    },
    #[error("{tensor}: not a convolution's window that TMA's im2col mode can walk ({why})")]
    Im2col {
        tensor: &'static str,
        why: &'static str,
    },
    #[error("{tensor}: {error}")]
    Rules {
        tensor: &'static str,
        #[source]
        error: TmaError,
    },
}

/// Checks a tensor-core sketch's split of `ktiles` K tiles into `split_k` chunks of
/// `ceil(ktiles / split_k)`: at most one chunk per K tile (and `MAX_SPLIT_K`), none of
/// them empty (an empty chunk's block would only add zeros).
pub fn check_tile_split(split_k: u32, ktiles: u64) -> Result<(), InvalidState> {
    let max = ktiles.min(u64::from(MAX_SPLIT_K));
    let split = u64::from(split_k);
    if split == 0 || split > max || (split - 1) * ktiles.div_ceil(split) >= ktiles {
        return Err(InvalidState::SplitK {
            split_k,
            stages: ktiles,
            max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_core_split_leaves_no_chunk_empty() {
        // 13 K tiles: 4 chunks of 4 (the last of 1) are fine, 8 chunks of 2 leave the
        // last one empty, 14 is more chunks than tiles.
        assert!(check_tile_split(4, 13).is_ok());
        assert!(check_tile_split(13, 13).is_ok());
        assert!(check_tile_split(8, 13).is_err());
        assert!(check_tile_split(14, 13).is_err());
        assert!(check_tile_split(0, 13).is_err());
    }
}
