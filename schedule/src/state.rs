//! States: the multi-level tiling sketch with every tile size and annotation filled in.
//!
//! Checklist for adding a state option (a new field of `State`), in pipeline order:
//!
//! 1. The field, here, with a serde default and `skip_serializing_if` at that default,
//!    so that logged states keep their JSON, hence their ids (extend the serialization
//!    test at the bottom of this file).
//! 2. Validation: `schedule/src/validate.rs` (a reason in `InvalidState`; the register
//!    estimate too if the option changes what stays live).
//! 3. Sampling: `schedule/src/sample.rs`, drawn so that the earlier draws of a seed
//!    stay what they were.
//! 4. Mutation: `search/src/mutate.rs`.
//! 5. The DGD lattice: `search/src/dgd.rs` (the neighbours along the new dimension).
//! 6. Lowering: `schedule/src/lower/cuda_core.rs`, or a transform pass over the loop nest
//!    in a file of its own that it applies (as `schedule/src/lower/prefetch.rs` does).
//! 7. Interpreter: `schedule/src/interp/` runs any new IR statement faithfully, and
//!    `schedule/tests/interpreter.rs` runs states with the option against the
//!    reference.
//! 8. Features: `features/src/extract.rs` (described in `features/src/table.rs`).
//! 9. A snapshot test: `schedule/tests/states.rs`.
//!
//! A state belongs to one sketch, its `tiling` ([`SketchTiling`]): a state whose tiling
//! is `MmaSync` belongs to the tensor-core sketch (`mma`, `lower::mma_sync`), one whose
//! tiling is `Wgmma` to Hopper's (`wgmma`), and their per-axis fields below keep their
//! defaults. Code that treats the sketches differently asks [`State::sketch`];
//! everything that treats the sketches differently (validation, sampling's drawing of
//! each sketch's fields, mutation, the DGD lattice, lowering, features, the log's
//! checks) gives it one arm per sketch. Adding a sketch is implementing that interface:
//! one more arm, which the compiler then asks of every caller. What follows describes the
//! CUDA-core sketch.
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
//! Beyond Ansor, the reduction may also be split across thread blocks ("split-K"):
//! `split_k` blocks share one output tile, each running a contiguous chunk of the
//! shared-memory stage loop and adding its partial sums into the (zeroed) output with
//! atomics. Deep layers with few output pixels and long reductions (ResNet's 512→512
//! 3x3 at 7x7: 25k outputs, 4608-long sums) otherwise launch too few blocks to fill
//! the GPU.
//!
//! Each input's shared-memory tile also has a layout (`SharedLayout`): the tensor's own
//! dimension order (the default), or one dimension moved innermost — for matmul's `A[m][k]`
//! the `m` dimension, as cuBLAS-class kernels store A transposed — and optionally padded
//! rows. In the tensor's order the inner product's lanes that differ in a spatial thread
//! coordinate read addresses `stage tile × register tile` floats apart (often a multiple
//! of 32: every lane in one bank), and one thread's register-tile operands along that
//! axis are not contiguous, so the compiler cannot merge them into 64- or 128-bit loads.
//! With that axis's dimension innermost they are contiguous, and padding the rows moves
//! the fetch's stores (and any remaining strided reads) off a single bank.
//!
//! A state serializes to JSON and replays into the identical kernel. Annotations added
//! after the first logs were written (`split_k`, `shared_layout`) are left out of the
//! JSON at their default, so that older states keep their JSON, hence their ids.

use crate::gemm::GemmView;
use crate::task::Contraction;
use serde::{Deserialize, Serialize};
use std::ops::Range;

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

/// Largest reduction split (`State::split_k`) of the search space. Beyond 64 blocks per
/// output tile the atomic traffic (output elements × split) outgrows any layer's gain in
/// parallelism on a GPU of ~132 SMs.
pub const MAX_SPLIT_K: u32 = 64;

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

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn natural_layouts(layouts: &[SharedLayout; 2]) -> bool {
    layouts.iter().all(SharedLayout::is_natural)
}

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// How the blocks of a split tile meet their partial sums in the workspace (the
/// tensor-core sketches; `lower::common`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitSums {
    /// Each chunk stores its own partial sums and the tile's last arrival adds them up
    /// in chunk order: the same bits every launch, but the last arrival reads
    /// `split_k` tiles of sums.
    #[default]
    Ordered,
    /// Each chunk adds its partial sums into one tile of sums in L2 (`red.global.add`)
    /// and the last arrival takes that one tile: cheap however deep the split, but a
    /// sum of non-integer values may differ in its last bits between launches.
    Atomic,
}

impl SplitSums {
    pub fn is_ordered(&self) -> bool {
        *self == SplitSums::Ordered
    }
}

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
    /// Thread blocks that share one output tile's reduction (split-K; 1 = no split).
    /// The flattened shared-memory stage loop is cut into `split_k` contiguous chunks of
    /// `ceil(stages / split_k)` stages (see `stage_chunk`); each block adds its partial
    /// sums into the zeroed output with `atomicAdd`. Left out of the JSON when 1, so
    /// that states written before split-K existed keep their JSON, hence their ids.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub split_k: u32,
    /// Shared-memory layout of each input's tile (see `SharedLayout`). Left out of the
    /// JSON when both are natural, so that states written before layouts existed keep
    /// their JSON, hence their ids.
    #[serde(default, skip_serializing_if = "natural_layouts")]
    pub shared_layout: [SharedLayout; 2],
    /// Register prefetch (double buffering through registers): the next stage's global
    /// loads are issued right after the barrier that publishes this stage, into
    /// registers, so that their latency hides behind this stage's inner product; they
    /// are stored to shared memory at the top of the next iteration (the pass in
    /// `prefetch`). Needs the fetch loops unrolled. Left out of the JSON when off (older
    /// states keep their ids).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prefetch: bool,
    /// How the tensor-core sketches' split-K meets its partial sums (`SplitSums`);
    /// ordered unless `split_k` > 1 in the `mma.sync` or `wgmma` sketch. Left out of
    /// the JSON when ordered (older states keep their ids).
    #[serde(default, skip_serializing_if = "SplitSums::is_ordered")]
    pub split_sums: SplitSums,
    /// The sketch the state belongs to, with that sketch's own tiling: the CUDA-core
    /// sketch (`spatial`, `reduction` and their annotations), `mma.sync` (see `mma`:
    /// `spatial` and `reduction` empty, `unroll_max_step`, `vector_width`,
    /// `shared_layout` and `prefetch` at their defaults, `split_k` splitting the GEMM's
    /// reduction as it does the CUDA-core sketch's) or `wgmma` (see `wgmma`: every other
    /// field at its default). In the JSON, `"mma"` or `"wgmma"` after the other fields,
    /// or neither.
    #[serde(flatten)]
    pub tiling: SketchTiling,
}

/// Which sketch a state belongs to, with its tiling: one sketch, never two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum SketchTiling {
    /// Ansor's `SSSRRSRS` tiling, in the state's own fields.
    #[default]
    CudaCore,
    MmaSync(MmaTiling),
    Wgmma(WgmmaTiling),
}

/// Written as the fields states had before sketches were one value: `"mma"` or
/// `"wgmma"`, or nothing for the CUDA-core sketch, so that every state keeps its JSON,
/// hence its id.
impl Serialize for SketchTiling {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        match self {
            SketchTiling::CudaCore => {}
            SketchTiling::MmaSync(t) => map.serialize_entry("mma", t)?,
            SketchTiling::Wgmma(t) => map.serialize_entry("wgmma", t)?,
        }
        map.end()
    }
}

/// Read from those fields; a state with both is refused.
impl<'de> Deserialize<'de> for SketchTiling {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Sketches {
            #[serde(default)]
            mma: Option<MmaTiling>,
            #[serde(default)]
            wgmma: Option<WgmmaTiling>,
        }
        let Sketches { mma, wgmma } = Sketches::deserialize(deserializer)?;
        match (mma, wgmma) {
            (None, None) => Ok(SketchTiling::CudaCore),
            (Some(t), None) => Ok(SketchTiling::MmaSync(t)),
            (None, Some(t)) => Ok(SketchTiling::Wgmma(t)),
            (Some(_), Some(_)) => Err(serde::de::Error::custom(
                "a state of two sketches (both \"mma\" and \"wgmma\")",
            )),
        }
    }
}

impl State {
    /// Which sketch the state belongs to, decided here and nowhere else: a caller that
    /// treats the sketches differently gives one arm per sketch, the CUDA-core sketch's
    /// (`SSSRRSRS` tiling: `spatial`, `reduction` and their annotations), the
    /// `mma.sync` sketch's (its `MmaTiling`) and the `wgmma` sketch's (its
    /// `WgmmaTiling`). A new sketch is one more arm, which the compiler then asks of
    /// every caller: the interface to implement.
    pub fn sketch<'a, R>(
        &'a self,
        cuda_core: impl FnOnce() -> R,
        mma_sync: impl FnOnce(&'a MmaTiling) -> R,
        wgmma: impl FnOnce(&'a WgmmaTiling) -> R,
    ) -> R {
        self.sketch_with(
            (),
            |()| cuda_core(),
            |(), tiling| mma_sync(tiling),
            |(), tiling| wgmma(tiling),
        )
    }

    /// The `mma.sync` tiling of a state of that sketch.
    pub fn mma(&self) -> Option<MmaTiling> {
        self.sketch(|| None, |t| Some(*t), |_| None)
    }

    /// The `wgmma` tiling of a state of that sketch.
    pub fn wgmma(&self) -> Option<WgmmaTiling> {
        self.sketch(|| None, |_| None, |t| Some(*t))
    }

    /// The `mma.sync` tiling of a state of that sketch, to change in place.
    pub fn mma_mut(&mut self) -> Option<&mut MmaTiling> {
        match &mut self.tiling {
            SketchTiling::MmaSync(t) => Some(t),
            _ => None,
        }
    }

    /// The `wgmma` tiling of a state of that sketch, to change in place.
    pub fn wgmma_mut(&mut self) -> Option<&mut WgmmaTiling> {
        match &mut self.tiling {
            SketchTiling::Wgmma(t) => Some(t),
            _ => None,
        }
    }

    /// The sketch's name, as reports print it: `cuda-core`, `mma.sync` or `wgmma`.
    pub fn sketch_name(&self) -> &'static str {
        self.sketch(|| "cuda-core", |_| "mma.sync", |_| "wgmma")
    }

    /// [`State::sketch`] with a context that the arm that runs takes (such as a `&mut`
    /// borrow every arm needs).
    pub fn sketch_with<'a, C, R>(
        &'a self,
        context: C,
        cuda_core: impl FnOnce(C) -> R,
        mma_sync: impl FnOnce(C, &'a MmaTiling) -> R,
        wgmma: impl FnOnce(C, &'a WgmmaTiling) -> R,
    ) -> R {
        match &self.tiling {
            SketchTiling::CudaCore => cuda_core(context),
            SketchTiling::MmaSync(tiling) => mma_sync(context, tiling),
            SketchTiling::Wgmma(tiling) => wgmma(context, tiling),
        }
    }

    /// A state of the tensor-core sketch.
    pub fn tensor_core(mma: MmaTiling, split_k: u32) -> State {
        State {
            tiling: SketchTiling::MmaSync(mma),
            split_k,
            ..State::empty()
        }
    }

    /// A state of the `wgmma` sketch.
    pub fn hopper(tiling: WgmmaTiling) -> State {
        State {
            tiling: SketchTiling::Wgmma(tiling),
            ..State::empty()
        }
    }

    /// No tiling at all: every field at its default.
    fn empty() -> State {
        State {
            spatial: Vec::new(),
            reduction: Vec::new(),
            unroll_max_step: 0,
            vector_width: [1, 1],
            split_k: 1,
            shared_layout: Default::default(),
            prefetch: false,
            split_sums: SplitSums::Ordered,
            tiling: SketchTiling::CudaCore,
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.sketch(
            || self.spatial.iter().map(|s| s.thread).product(),
            MmaTiling::threads,
            WgmmaTiling::threads,
        )
    }

    /// Product of the virtual-thread factors.
    pub fn vthreads(&self) -> u32 {
        self.spatial.iter().map(|s| s.vthread).product()
    }

    /// Accumulator registers per thread.
    pub fn accumulators(&self) -> u32 {
        self.sketch(
            || self.spatial.iter().map(|s| s.register_tile()).product(),
            MmaTiling::accumulators,
            WgmmaTiling::accumulators,
        )
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

    /// Shared-memory stages of one output tile's whole reduction: the product of the
    /// stages per reduction axis (the flattened outer reduction loop); for the
    /// tensor-core sketch the GEMM's reduction tiles.
    pub fn stages(&self, c: &Contraction) -> u64 {
        self.sketch(
            || {
                self.stages_per_axis(c)
                    .iter()
                    .map(|&s| u64::from(s))
                    .product()
            },
            |m| {
                GemmView::of(c).map_or(1, |v| {
                    let span = m.span_staging(c, 1).ok().flatten();
                    m.ktiles(&v, c.dtype, span.as_ref())
                })
            },
            |w| GemmView::of(c).map_or(1, |v| v.k.div_ceil(w.block_k(&v))),
        )
    }

    /// Whether the reduction may be split at all: over at least two stages, not in a
    /// persistent or stream-K `mma.sync` grid, and in the CUDA-core sketch, which adds
    /// partial sums atomically into the output, only into an f32 output (the type with
    /// the atomic add) without a ReLU (which does not distribute over partial sums).
    /// The tensor-core sketches' last block of a tile runs the epilogue on the whole
    /// sum.
    pub fn may_split(&self, c: &Contraction) -> bool {
        // A persistent `mma.sync` grid holds one tile's weights per block, and stream-K
        // deals the reduction itself: no split.
        if let SketchTiling::MmaSync(m) = &self.tiling
            && (m.persistent > 0 || m.stream_k > 0)
        {
            return false;
        }
        let atomic = self.tiling == SketchTiling::CudaCore;
        let into_output = !c.relu && c.out_dtype == crate::task::DType::F32;
        (!atomic || into_output) && self.stages(c) > 1
    }

    /// Stages one block runs at most: `ceil(stages / split_k)`.
    pub fn stages_per_block(&self, c: &Contraction) -> u64 {
        self.stages(c).div_ceil(u64::from(self.split_k.max(1)))
    }

    /// The flattened stages that the blocks with split coordinate `z` run (see
    /// `stage_chunk`).
    pub fn split_chunk(&self, c: &Contraction, z: u32) -> Range<u64> {
        stage_chunk(self.stages(c), self.split_k, z)
    }

    /// Thread blocks that together cover the output once: one per output tile.
    pub fn spatial_blocks(&self, c: &Contraction) -> u64 {
        self.sketch(
            || {
                self.blocks_per_axis(c)
                    .iter()
                    .map(|&b| u64::from(b))
                    .product()
            },
            |m| {
                GemmView::of(c).map_or(1, |v| {
                    let span = m.span_staging(c, 1).ok().flatten();
                    m.tiles(&MmaTiling::tiled_view(&v, span.as_ref()))
                })
            },
            |w| GemmView::of(c).map_or(1, |v| w.grid(&v, 1).1),
        )
    }

    /// Thread blocks in the grid: one per output tile and reduction chunk (a
    /// persistent or stream-K grid's own count).
    pub fn blocks(&self, c: &Contraction) -> u64 {
        let split = || self.spatial_blocks(c) * u64::from(self.split_k);
        self.sketch(
            split,
            |m| {
                GemmView::of(c).map_or(1, |v| {
                    let span = m.span_staging(c, 1).ok().flatten();
                    m.grid_blocks(&MmaTiling::tiled_view(&v, span.as_ref()), self.split_k)
                })
            },
            |w| GemmView::of(c).map_or(1, |v| w.grid(&v, self.split_k).1),
        )
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

/// The flattened stages `0..stages` that split coordinate `z` of `split_k` runs: chunk
/// `z` of length `ceil(stages / split_k)`, cut short (or empty) at the end so that the
/// chunks cover every stage exactly once. Lowering generates exactly this loop.
pub fn stage_chunk(stages: u64, split_k: u32, z: u32) -> Range<u64> {
    let chunk = stages.div_ceil(u64::from(split_k.max(1)));
    let start = (u64::from(z) * chunk).min(stages);
    start..(start + chunk).min(stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_stage_once_even_when_the_split_does_not_divide() {
        // 5 stages over 4 blocks: chunks of 2, the last one empty.
        let chunks: Vec<Range<u64>> = (0..4).map(|z| stage_chunk(5, 4, z)).collect();
        assert_eq!(chunks, [0..2, 2..4, 4..5, 5..5]);
        assert_eq!(stage_chunk(8, 1, 0), 0..8);
        for stages in 1..200u64 {
            for split_k in [1, 2, 3, 4, 8, 16, 64] {
                let mut covered = vec![0u32; stages as usize];
                for z in 0..split_k {
                    for s in stage_chunk(stages, split_k, z) {
                        covered[s as usize] += 1;
                    }
                }
                assert!(covered.iter().all(|&n| n == 1), "{stages} / {split_k}");
            }
        }
    }

    #[test]
    fn no_split_serializes_as_before_split_k_existed() {
        let state = State {
            prefetch: false,
            spatial: vec![SpatialSplit {
                vthread: 1,
                thread: 32,
                outer: 1,
                inner: 2,
            }],
            reduction: vec![ReductionSplit {
                middle: 4,
                inner: 2,
            }],
            unroll_max_step: 16,
            vector_width: [1, 2],
            split_k: 1,
            shared_layout: Default::default(),
            split_sums: SplitSums::Ordered,
            tiling: SketchTiling::CudaCore,
        };
        let old = r#"{"spatial":[{"vthread":1,"thread":32,"outer":1,"inner":2}],"reduction":[{"middle":4,"inner":2}],"unroll_max_step":16,"vector_width":[1,2]}"#;
        assert_eq!(state.to_json(), old);
        let read: State = serde_json::from_str(old).unwrap();
        assert_eq!(read, state);
        let split = State {
            split_k: 8,
            ..state.clone()
        };
        assert!(split.to_json().ends_with(r#","split_k":8}"#));
        assert_ne!(split.id(), state.id());
        assert_eq!(
            serde_json::from_str::<State>(&split.to_json()).unwrap(),
            split
        );
        // A layout is written only when not natural, and only its non-default fields.
        let mut transposed = state.clone();
        transposed.shared_layout[0] = SharedLayout {
            innermost: Some(0),
            pad: 4,
        };
        transposed.shared_layout[1].pad = 1;
        assert!(
            transposed
                .to_json()
                .ends_with(r#","shared_layout":[{"innermost":0,"pad":4},{"pad":1}]}"#)
        );
        assert_ne!(transposed.id(), state.id());
        assert_eq!(
            serde_json::from_str::<State>(&transposed.to_json()).unwrap(),
            transposed
        );
        // Atomic split sums are written, ordered ones are not.
        let atomic = State {
            split_sums: SplitSums::Atomic,
            ..split.clone()
        };
        assert!(
            atomic
                .to_json()
                .ends_with(r#","split_k":8,"split_sums":"atomic"}"#)
        );
        assert_ne!(atomic.id(), split.id());
        assert_eq!(
            serde_json::from_str::<State>(&atomic.to_json()).unwrap(),
            atomic
        );
    }

    #[test]
    fn a_state_is_of_one_sketch_written_as_before_and_two_are_refused() {
        let task = crate::Task::new(
            crate::parse_shape("matmul", "512,512,512").unwrap(),
            Default::default(),
        )
        .unwrap()
        .with_types(crate::DType::Fp16, crate::DType::Fp16, crate::Layout::Nchw)
        .unwrap();
        let states = crate::Sampler::new(&task, &crate::GpuSpec::h100(), 3).sample_distinct(400);
        let of = |name: &str| {
            states
                .iter()
                .find(|s| s.sketch_name() == name)
                .unwrap()
                .clone()
        };
        let (mma, wgmma) = (of("mma.sync"), of("wgmma"));
        for (state, key) in [(&mma, r#","mma":{"#), (&wgmma, r#","wgmma":{"#)] {
            let json = state.to_json();
            assert!(json.contains(key) && json.ends_with("}}"), "{json}");
            assert_eq!(&serde_json::from_str::<State>(&json).unwrap(), state);
        }
        // Both sketches' fields in one state: refused, not one of them chosen.
        let wgmma_json = wgmma.to_json();
        let tiling = &wgmma_json[wgmma_json.find(r#""wgmma":"#).unwrap()..wgmma_json.len() - 1];
        let both = format!("{},{tiling}}}", &mma.to_json()[..mma.to_json().len() - 1]);
        let err = serde_json::from_str::<State>(&both)
            .unwrap_err()
            .to_string();
        assert!(err.contains("two sketches"), "{err}");
    }
}
