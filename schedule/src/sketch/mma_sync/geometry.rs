//! The tensor-core sketch's tile sizes (`MmaTiling`) and the geometry derived from them.
//!
//! The sketch tiles the contraction's GEMM view (`gemm`): each thread block computes a
//! `block_m × block_n` output tile with `warps_m × warps_n` warps, each warp a
//! `warp_m × warp_n` sub-tile of `mma.sync` tiles (m16n8k16 for fp16/bf16, m16n8k8 for
//! TF32, accumulating in f32). The reduction advances one shared-memory tile of
//! `block_k` elements at a time; `stages` such tiles are in flight, filled by
//! `cp.async` (a pipeline: the copy of tile `t + stages - 1` overlaps the products of
//! tile `t`). Fragments are read from shared memory with `ldmatrix`. With `row_span` a
//! few-channel convolution's A comes as raw input-row runs instead, one filter row per
//! K tile, and the weights stay in shared memory (`SpanStaging`, `crate::row_span`).
//! With `stream_k` a grid of its own deals the output tiles' K tiles in even runs
//! (`crate::stream_k`), their parts of tiles meeting in the workspace.
//!
//! Every shared row is a whole number of 16-byte chunks (one MMA k-step is always 32
//! bytes of a row: 16 halves or 8 floats), laid out as `atom::SharedTileLayout` says
//! (XOR-swizzled with `swizzle`). The instructions themselves (shapes, fragment
//! layouts, copies) are `atom`'s.

use crate::atom::mma::{C_M16N8, FP16_M16N8K16};
use crate::atom::{CHUNK_BYTES, FillCopy, MmaAtom, SharedTileLayout, SpanLayout};
use crate::gemm::GemmView;
use crate::gpu_spec::GpuSpec;
use crate::invalid::InvalidState;
use crate::invalid::check_tile_split;
use crate::row_span::{COPY_ELEMENTS, RowSpan};
use crate::sketch::mma_sync::tiling::{
    MAX_COPY_ROUNDS, MAX_K_STEPS, MAX_STAGES, MAX_WARPS, MmaTiling,
};
use crate::stream_k::StreamK;
use crate::task::{Contraction, DType};

/// Registers besides accumulators and fragments (addresses, loop counters, predicates),
/// a conservative estimate for the register check.
const MMA_ADDRESSING_REGISTERS: u64 = 40;

/// Rows and columns of one MMA tile (every instruction the sketch uses has the same).
pub const MMA_M: u32 = crate::atom::mma::M as u32;
pub const MMA_N: u32 = crate::atom::mma::N as u32;

/// A row-span state's staging: the convolution's geometry, A's stage, and the filter
/// rows of weights each block holds (its split chunk's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanStaging {
    pub span: RowSpan,
    pub a: SpanLayout,
    pub held_rows: i64,
}

impl MmaTiling {
    /// Row-span staging of `c` split `split_k` ways; None without `row_span`.
    pub fn span_staging(
        &self,
        c: &Contraction,
        split_k: u32,
    ) -> Result<Option<SpanStaging>, InvalidState> {
        if !self.row_span {
            return Ok(None);
        }
        let span = RowSpan::of(c).map_err(InvalidState::RowSpan)?;
        let block_k = self.block_k(c.dtype) as i64;
        Ok(Some(SpanStaging {
            span,
            a: span.layout(i64::from(self.block_m), block_k),
            held_rows: (span.filter_rows + i64::from(split_k.max(1)) - 1)
                / i64::from(split_k.max(1)),
        }))
    }

    /// The least k-steps whose K tile holds a filter row of `span` (its taps and zero
    /// columns), a power of two.
    pub fn span_k_steps(span: &RowSpan, dtype: DType) -> u32 {
        let step = Self::k_step(dtype) as i64;
        (((span.columns() + step - 1) / step) as u32).next_power_of_two()
    }

    /// The GEMM view the grid tiles: under row spans, M is the padded pixels.
    pub fn tiled_view(view: &GemmView, span: Option<&SpanStaging>) -> GemmView {
        let mut tiled = view.clone();
        if let Some(s) = span {
            tiled.m = s.span.pixels();
        }
        tiled
    }

    /// K tiles of the reduction: one per filter row under row spans.
    pub fn ktiles(&self, view: &GemmView, dtype: DType, span: Option<&SpanStaging>) -> u64 {
        match span {
            Some(s) => s.span.filter_rows as u64,
            None => view.k.div_ceil(self.block_k(dtype)),
        }
    }

    pub fn threads(&self) -> u32 {
        32 * self.warps_m * self.warps_n
    }

    pub fn warp_m(&self) -> u32 {
        self.block_m / self.warps_m.max(1)
    }

    pub fn warp_n(&self) -> u32 {
        self.block_n / self.warps_n.max(1)
    }

    /// MMA tiles per warp along M (16 rows each) and N (8 columns each).
    pub fn tiles_m(&self) -> u32 {
        self.warp_m() / MMA_M
    }

    pub fn tiles_n(&self) -> u32 {
        self.warp_n() / MMA_N
    }

    /// f32 accumulators per thread: four per MMA tile of the warp.
    pub fn accumulators(&self) -> u32 {
        C_M16N8.values as u32 * self.tiles_m() * self.tiles_n()
    }

    /// Reduction elements of one MMA instruction for `dtype` (16 halves, 8 TF32): the
    /// instruction's K (`MmaAtom::sizing`).
    pub fn k_step(dtype: DType) -> u64 {
        MmaAtom::sizing(dtype).k as u64
    }

    /// Reduction elements per shared tile.
    pub fn block_k(&self, dtype: DType) -> u64 {
        u64::from(self.k_steps) * Self::k_step(dtype)
    }

    /// The shared layout of input `input`'s tile (one pipeline stage).
    pub fn tile_layout(&self, input: usize, view: &GemmView, dtype: DType) -> SharedTileLayout {
        let bk = self.block_k(dtype) as i64;
        let (rows, row_elements) = match input {
            0 => (i64::from(self.block_m), bk),
            _ if view.b_k_major => (i64::from(self.block_n), bk),
            _ => (bk, i64::from(self.block_n)),
        };
        SharedTileLayout {
            rows,
            row_elements,
            chunk_elements: i64::from(CHUNK_BYTES / dtype.bytes()),
            swizzle: self.swizzle,
        }
    }

    /// Copies per thread of input `input`'s tile per stage (row spans: A's runs, and
    /// none of the held weights).
    pub fn copy_rounds(
        &self,
        input: usize,
        view: &GemmView,
        dtype: DType,
        span: Option<&SpanStaging>,
    ) -> i64 {
        let copies = match (span, input) {
            (Some(s), 0) => s.a.elements() / COPY_ELEMENTS,
            (Some(_), _) => 0,
            (None, _) => {
                let layout = self.tile_layout(input, view, dtype);
                layout.elements() / i64::from(self.vector[input].max(1))
            }
        };
        (copies + i64::from(self.threads()) - 1) / i64::from(self.threads())
    }

    /// Bytes of dynamic shared memory: every stage holds both inputs' tiles; under row
    /// spans a stage holds A's runs, and the held weights come once.
    pub fn shared_bytes(&self, dtype: DType, span: Option<&SpanStaging>) -> u64 {
        let b_tile = u64::from(self.block_n) * self.block_k(dtype);
        let elements = match span {
            None => {
                u64::from(self.stages) * (u64::from(self.block_m) * self.block_k(dtype) + b_tile)
            }
            Some(s) => u64::from(self.stages) * s.a.elements() as u64 + s.held_rows as u64 * b_tile,
        };
        elements * u64::from(dtype.bytes())
    }

    /// Estimated registers per thread: accumulators, one k-step's fragments (4 per
    /// M tile, 2 per N tile: every shape's register counts are m16n8k16's), addressing.
    pub fn register_estimate(&self) -> u64 {
        u64::from(self.accumulators())
            + (FP16_M16N8K16.a_registers as u64 * u64::from(self.tiles_m())
                + FP16_M16N8K16.b_registers as u64 * u64::from(self.tiles_n()))
            + MMA_ADDRESSING_REGISTERS
    }

    /// Output tiles of `view`: `batch × M tiles × N tiles`.
    pub fn tiles(&self, view: &GemmView) -> u64 {
        view.batch
            * view.m.div_ceil(u64::from(self.block_m))
            * view.n.div_ceil(u64::from(self.block_n))
    }

    /// The workspace of a `split_k` reduction (none without a split or stream-K): one
    /// semaphore per output tile and warp, then every block's partial sums (each
    /// thread's accumulators), in f32; stream-K's segments add into one tile of sums
    /// per output tile. Semaphores and bytes.
    pub fn workspace(&self, view: &GemmView, split_k: u32) -> (u64, u64) {
        if split_k <= 1 && self.stream_k == 0 {
            return (0, 0);
        }
        let tiles = self.tiles(view);
        let semaphores = tiles * u64::from(self.warps_m * self.warps_n);
        let units = tiles * u64::from(split_k.max(1));
        let partials = units * u64::from(self.accumulators()) * u64::from(self.threads());
        (semaphores, crate::ir::workspace_bytes(semaphores, partials))
    }

    /// Blocks of the grid over `tiled` (`tiled_view`) with the reduction split
    /// `split_k` ways: one per output tile and chunk, or a persistent or stream-K
    /// grid's own count.
    pub fn grid_blocks(&self, tiled: &GemmView, split_k: u32) -> u64 {
        match (self.persistent, self.stream_k) {
            (0, 0) => self.tiles(tiled) * u64::from(split_k.max(1)),
            (0, blocks) | (blocks, _) => u64::from(blocks),
        }
    }

    /// Stream-K's deal of the K tiles of `view`'s output tiles to this tiling's blocks
    /// (`crate::stream_k`).
    pub fn stream(&self, view: &GemmView, dtype: DType) -> StreamK {
        StreamK {
            blocks: u64::from(self.stream_k),
            tiles: self.tiles(view),
            ktiles: self.ktiles(view, dtype, None),
        }
    }

    /// Whether input `input` can be filled `width` elements at a time: a supported copy
    /// size that divides both the contiguous dimension in memory (so that no copy
    /// straddles it and every copy is aligned) and the shared row.
    pub fn vector_feasible(&self, input: usize, width: u32, view: &GemmView, dtype: DType) -> bool {
        let bytes = width * dtype.bytes();
        let layout = self.tile_layout(input, view, dtype);
        FillCopy::of(bytes, dtype.bytes()).is_some()
            && width > 0
            && view.contiguous[input].is_multiple_of(width)
            && layout.row_elements % i64::from(width) == 0
    }
}

/// Validates a tensor-core state (`SketchTiling::MmaSync(tiling)`).
pub fn validate_mma(
    c: &Contraction,
    tiling: &MmaTiling,
    split_k: u32,
    gpu: &GpuSpec,
) -> Result<(), InvalidState> {
    let view = GemmView::of(c).map_err(InvalidState::NoGemm)?;
    if !c.dtype.tensor_cores() {
        return Err(InvalidState::MmaType(c.dtype));
    }
    let t = tiling;
    let warps = t.warps_m * t.warps_n;
    if warps == 0
        || warps > MAX_WARPS
        || t.block_m == 0
        || t.block_n == 0
        || !t.block_m.is_multiple_of(MMA_M * t.warps_m)
        || !t.block_n.is_multiple_of(MMA_N * t.warps_n)
    {
        return Err(InvalidState::MmaTiles {
            block_m: t.block_m,
            block_n: t.block_n,
            warps_m: t.warps_m,
            warps_n: t.warps_n,
        });
    }
    // Power-of-two rows keep the swizzle's XOR inside the row.
    let rows_pow2 = [0, 1].iter().all(|&i| {
        let chunks = t.tile_layout(i, &view, c.dtype).chunks();
        chunks > 0 && (chunks as u64).is_power_of_two()
    });
    if !(1..=MAX_K_STEPS).contains(&t.k_steps)
        || !t.k_steps.is_power_of_two()
        || !(1..=MAX_STAGES).contains(&t.stages)
        || !rows_pow2
    {
        return Err(InvalidState::MmaPipeline {
            k_steps: t.k_steps,
            stages: t.stages,
        });
    }
    let span = t.span_staging(c, split_k)?;
    if let Some(s) = &span {
        // Row spans copy A in whole 16-byte runs and the weights element by element.
        if t.vector != [COPY_ELEMENTS as u32, 1] {
            return Err(InvalidState::RowSpanVectors { vector: t.vector });
        }
        if (t.block_k(c.dtype) as i64) < s.span.columns() {
            return Err(InvalidState::RowSpanColumns {
                block_k: t.block_k(c.dtype),
                columns: s.span.columns(),
            });
        }
    } else {
        for (input, &width) in t.vector.iter().enumerate() {
            if !t.vector_feasible(input, width, &view, c.dtype) {
                return Err(InvalidState::VectorWidth { input, width });
            }
        }
    }
    for input in 0..2 {
        let rounds = t.copy_rounds(input, &view, c.dtype, span.as_ref());
        if rounds > MAX_COPY_ROUNDS {
            return Err(InvalidState::MmaCopies { input, rounds });
        }
    }
    check_tile_split(split_k, t.ktiles(&view, c.dtype, span.as_ref()))?;
    let tiled = MmaTiling::tiled_view(&view, span.as_ref());
    // Partial sums are indexed in 32-bit arithmetic.
    let (_, bytes) = t.workspace(&tiled, split_k);
    if bytes / 4 > i32::MAX as u64 {
        return Err(InvalidState::SplitWorkspace { bytes });
    }
    if t.persistent > 0 {
        let tiles = t.tiles(&tiled) * u64::from(split_k);
        let n_tiles = tiled.n.div_ceil(u64::from(t.block_n));
        let p = u64::from(t.persistent);
        if span.is_none() || split_k != 1 || !p.is_multiple_of(n_tiles) || p > tiles {
            return Err(InvalidState::MmaPersistent {
                blocks: t.persistent,
                tiles,
                n_tiles,
            });
        }
    }
    // Stream-K deals the K tiles itself (no split), of im2col tiles: row spans hold a
    // block's filter rows, and a persistent grid is one of its own.
    if t.stream_k > 0 {
        let stream = t.stream(&view, c.dtype);
        if !stream.valid() || split_k != 1 || span.is_some() || t.persistent != 0 {
            return Err(InvalidState::MmaStreamK {
                blocks: t.stream_k,
                iterations: stream.iterations(),
                split_k,
                row_span: t.row_span,
                persistent: t.persistent,
            });
        }
    }
    gpu.check_block(
        t.grid_blocks(&tiled, split_k),
        t.shared_bytes(c.dtype, span.as_ref()),
        t.register_estimate(),
    )?;
    Ok(())
}
