//! Sampling: random valid states of a task, reproducible from a seed.
//!
//! Each axis's split is drawn uniformly from all ordered factorizations of a "tiled
//! extent": the extent itself (perfect splits, as Ansor draws them) or the extent
//! rounded up to a multiple of a small power of two when that costs at most a quarter
//! more work — so that awkward extents (7, 333, 555) get useful tiles and the tail is
//! predicated. Innermost factors are bounded. Invalid draws are rejected and redrawn.
//! Random choices come straight from the ChaCha8 stream, so the same seed gives the same
//! states whatever version of a distribution library is in use.
//!
//! The reduction split (`split_k`) is a power of two up to 64 and the stage count, not
//! uniform: it pays when the tiles leave too few blocks for the GPU and the reduction
//! is long enough to share. Uniformly drawn tiles are large (median grids of 10–100
//! blocks even for ResNet's big layers), so the state's grid alone would split nearly
//! everything; the task's shape tempers it. With `g` blocks per split (the drawn
//! tiles' grid) on `sm` SMs, and `depth` = reduction length / (output elements / sm)
//! (24 for ResNet's 512→512 3x3 at 7x7, 0.4 for its 64→64 3x3 at 56x56, 0.02 for the
//! stem), a split is drawn with probability `min(1, depth) × (1 - g / (4 sm))`, clamped
//! to 0.05..=0.9. Its size then favours the split that brings the grid to about two
//! blocks per SM (weight halving per factor of two away). ReLU tasks split only in the
//! tensor-core sketches, whose fixup runs the epilogue on the whole sum (the CUDA-core
//! sketch adds partial sums atomically, and validation forbids it). The split comes from a second
//! ChaCha8 stream of the same seed, so the tiles drawn for a seed are those drawn
//! before split-K existed; a `wgmma` draw takes it from the sketch's own stream. A
//! tensor-core split's partial sums are atomic (`SplitSums`) half the time, drawn from
//! a stream of their own (stream 5, one draw per tensor-core state). Row spans (stream
//! 7) and the tensor-core sketch's stream-K (stream 8) are drawn on streams of their
//! own too, one draw each per tensor-core state.
//!
//! Shared layouts come from a third stream (stream 2), two draws per input and state:
//! the tensor's own order with probability 1/2, else one of the input's spatial
//! dimensions innermost (`tiling::innermost_choices`: matmul A's `m`, conv2d weight's
//! `k`), uniformly; then a row padding, uniform over `SHARED_PADS` for a moved
//! dimension and 0 with probability 3/4 in the tensor's order (padding there only
//! spreads strided reads). Inputs without a spatial dimension to move (matmul B) draw
//! only the padding. So about 3/8 of the inputs that can move a dimension keep the
//! default layout, and the tiles and splits drawn for a seed are unchanged (only
//! validation's verdict may change, through the padding's shared memory).

use crate::gemm::GemmView;
use crate::gpu_spec::GpuSpec;
use crate::mma::{MAX_K_STEPS, MAX_STAGES, MAX_WARPS, MMA_M, MMA_N, MmaTiling};
use crate::row_span::{COPY_ELEMENTS, RowSpan};
use crate::state::{
    MAX_SPLIT_K, ReductionSplit, SHARED_PADS, SharedLayout, SketchTiling, SpatialSplit, SplitSums,
    State, UNROLL_STEPS, VECTOR_WIDTHS,
};
use crate::task::{Contraction, Task};
use crate::tiling::{Tiling, innermost_choices};
use crate::validate::{prefetch_feasible, validate};
use crate::wgmma::{
    CLUSTER_SHAPES, MAX_WGMMA_STAGES, RASTER_GROUPS, TmaGemm, WgmmaTiling, wgmma_applies,
};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

/// Draws before a single sample gives up (valid states are rarely that scarce).
const MAX_DRAWS: usize = 20_000;

/// Draws random valid states of one task.
pub struct Sampler {
    contraction: Contraction,
    gpu: GpuSpec,
    rng: ChaCha8Rng,
    /// The reduction split's own stream (stream 1 of the seed), so that adding it left
    /// the tile draws of every seed as they were.
    split_rng: ChaCha8Rng,
    /// The shared layouts' own stream (stream 2 of the seed).
    layout_rng: ChaCha8Rng,
    /// The tensor-core sketch's stream (stream 3): the sketch choice and its tiles.
    mma_rng: ChaCha8Rng,
    /// The task's GEMM view, when the tensor-core sketch applies to it.
    gemm: Option<GemmView>,
    /// The `wgmma` sketch's stream (stream 4): the sketch choice and its tiles.
    wgmma_rng: ChaCha8Rng,
    /// The task's TMA view, when the `wgmma` sketch applies to it on this GPU.
    tma: Option<TmaGemm>,
    /// The split sums' stream (stream 5): one draw per tensor-core state.
    sums_rng: ChaCha8Rng,
    /// Stream-K's stream (stream 6): one draw per `wgmma` state.
    stream_rng: ChaCha8Rng,
    /// Row spans' stream (stream 7): one draw per tensor-core state.
    span_rng: ChaCha8Rng,
    /// The tensor-core sketch's stream-K draws (stream 8): one per tensor-core state.
    mma_stream_rng: ChaCha8Rng,
    /// The task's row spans, where they apply and pay (`row_span_pays`).
    span: Option<RowSpan>,
    /// Innermost-dimension choices per input (`tiling::innermost_choices`).
    innermost: [Vec<Option<u8>>; 2],
    /// Factorizations per (tiled extent, parts), computed once.
    factorizations: HashMap<(u32, usize), Vec<Vec<u32>>>,
}

impl Sampler {
    pub fn new(task: &Task, gpu: &GpuSpec, seed: u64) -> Self {
        let mut split_rng = ChaCha8Rng::seed_from_u64(seed);
        split_rng.set_stream(1);
        let mut layout_rng = ChaCha8Rng::seed_from_u64(seed);
        layout_rng.set_stream(2);
        let contraction = task.contraction();
        let mut mma_rng = ChaCha8Rng::seed_from_u64(seed);
        mma_rng.set_stream(3);
        let gemm = GemmView::of(&contraction)
            .ok()
            .filter(|_| contraction.dtype.tensor_cores());
        let mut wgmma_rng = ChaCha8Rng::seed_from_u64(seed);
        wgmma_rng.set_stream(4);
        let tma = TmaGemm::of(&contraction)
            .ok()
            .filter(|_| wgmma_applies(&contraction, gpu));
        let mut sums_rng = ChaCha8Rng::seed_from_u64(seed);
        sums_rng.set_stream(5);
        let mut stream_rng = ChaCha8Rng::seed_from_u64(seed);
        stream_rng.set_stream(6);
        let mut span_rng = ChaCha8Rng::seed_from_u64(seed);
        span_rng.set_stream(7);
        let mut mma_stream_rng = ChaCha8Rng::seed_from_u64(seed);
        mma_stream_rng.set_stream(8);
        let span = RowSpan::of(&contraction)
            .ok()
            .filter(|s| gemm.is_some() && row_span_pays(s));
        Sampler {
            sums_rng,
            stream_rng,
            span_rng,
            mma_stream_rng,
            span,
            mma_rng,
            gemm,
            wgmma_rng,
            tma,
            innermost: [0, 1].map(|i| innermost_choices(&contraction, i)),
            contraction,
            gpu: gpu.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            split_rng,
            layout_rng,
            factorizations: HashMap::new(),
        }
    }

    /// A reduction split for the drawn tiles of `state` (see the module docs), from
    /// the split stream.
    fn split_k(&mut self, state: &State) -> u32 {
        draw_split(&mut self.split_rng, &self.contraction, &self.gpu, state)
    }

    /// How a tensor-core state split `split_k` ways meets its partial sums: atomic half
    /// the time there is a split; always one draw.
    fn split_sums(&mut self, split_k: u32) -> SplitSums {
        let atomic = self.sums_rng.next_u64().is_multiple_of(2);
        if split_k > 1 && atomic {
            SplitSums::Atomic
        } else {
            SplitSums::Ordered
        }
    }

    /// A shared layout for input `input` (see the module docs); always two draws.
    fn layout(&mut self, input: usize) -> SharedLayout {
        let order = unit(self.layout_rng.next_u64());
        let pad = unit(self.layout_rng.next_u64());
        let choices = &self.innermost[input];
        let innermost = if order < 0.5 || choices.len() < 2 {
            None
        } else {
            let moved = &choices[1..];
            let at = ((order - 0.5) * 2.0 * moved.len() as f64) as usize;
            moved[at.min(moved.len() - 1)]
        };
        let pad = match innermost {
            None if pad < 0.75 => 0,
            None => SHARED_PADS[1 + ((pad - 0.75) * 4.0 * 3.0) as usize % 3],
            Some(_) => SHARED_PADS[(pad * 4.0) as usize % 4],
        };
        SharedLayout { innermost, pad }
    }

    fn pick(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    /// Tiled extents an axis may be split over.
    fn tiled_extents(extent: u32) -> Vec<u32> {
        let mut out = vec![extent];
        for shift in 1..=5 {
            let m = 1u32 << shift;
            let rounded = extent.div_ceil(m) * m;
            if rounded <= extent + extent / 4 && !out.contains(&rounded) {
                out.push(rounded);
            }
        }
        out
    }

    /// A uniformly random factorization of a tiled extent of `extent` into `parts`
    /// inner factors (the outer level takes the rest), last factor bounded.
    fn split(&mut self, extent: u32, parts: usize) -> Vec<u32> {
        let candidates = Self::tiled_extents(extent);
        let tiled = candidates[self.pick(candidates.len())];
        let max_inner = self.gpu.max_innermost_factor;
        let options = self
            .factorizations
            .entry((tiled, parts))
            .or_insert_with(|| factorizations(tiled, parts, max_inner));
        let n = options.len();
        let i = (self.rng.next_u64() % n as u64) as usize;
        self.factorizations[&(tiled, parts)][i].clone()
    }

    /// One draw, valid or not.
    fn draw(&mut self) -> State {
        let c = &self.contraction;
        let spatial_extents: Vec<u32> = c.spatial.iter().map(|a| a.extent).collect();
        let reduction_extents: Vec<u32> = c.reduction.iter().map(|a| a.extent).collect();
        let spatial = spatial_extents
            .into_iter()
            .map(|e| {
                let f = self.split(e, 4);
                SpatialSplit {
                    vthread: f[0],
                    thread: f[1],
                    outer: f[2],
                    inner: f[3],
                }
            })
            .collect();
        let reduction = reduction_extents
            .into_iter()
            .map(|e| {
                let f = self.split(e, 2);
                ReductionSplit {
                    middle: f[0],
                    inner: f[1],
                }
            })
            .collect();
        let unroll_max_step = UNROLL_STEPS[self.pick(UNROLL_STEPS.len())];
        let mut state = State {
            prefetch: false,
            split_sums: SplitSums::Ordered,
            tiling: SketchTiling::CudaCore,
            spatial,
            reduction,
            unroll_max_step,
            vector_width: [1, 1],
            split_k: 1,
            shared_layout: Default::default(),
        };
        let tiling = Tiling::new(&self.contraction, &state);
        for input in 0..2 {
            let feasible: Vec<u32> = VECTOR_WIDTHS
                .into_iter()
                .filter(|&w| tiling.vector_feasible(&self.contraction, input, w))
                .collect();
            state.vector_width[input] = feasible[self.pick(feasible.len())];
        }
        state.split_k = self.split_k(&state);
        state.shared_layout = [self.layout(0), self.layout(1)];
        state.prefetch = prefetch_feasible(&self.contraction, &state) && self.pick(2) == 1;
        state
    }

    /// Which sketch the next draw uses: the tensor-core one whenever it applies to
    /// half data (fp16, bf16: the CUDA-core sketch computes them too, widened to f32,
    /// but at a fraction of the tensor cores' rate), three draws in four for TF32
    /// (whose f32 data the CUDA-core sketch computes in full f32), never for f32. A
    /// task without a GEMM view (NCHW, depthwise) always draws CUDA-core states.
    fn tensor_core_draw(&mut self) -> bool {
        match (&self.gemm, self.contraction.dtype.cuda_cores()) {
            (None, _) => false,
            (Some(_), false) => true,
            (Some(_), true) => !self.mma_rng.next_u64().is_multiple_of(4),
        }
    }

    /// One tensor-core draw, valid or not: block tiles up to the GEMM's size (rounded
    /// up to a power of two), warps that divide them into whole MMA tiles, k-steps and
    /// pipeline depth uniform, the widest feasible copies three times in four,
    /// swizzled three times in four, and split-K as for the CUDA-core sketch; row
    /// spans and persistent grids on their stream (7), then stream-K on its own (8).
    fn draw_mma(&mut self) -> State {
        let view = self.gemm.clone().expect("only drawn with a GEMM view");
        let dtype = self.contraction.dtype;
        let pick = |rng: &mut ChaCha8Rng, options: &[u32]| {
            options[(rng.next_u64() % options.len() as u64) as usize]
        };
        let cap = |extent: u64, lo: u32| (extent.next_power_of_two() as u32).max(lo);
        let ms: Vec<u32> = [16, 32, 64, 128, 256]
            .into_iter()
            .filter(|&b| b <= cap(view.m, 16))
            .collect();
        let ns: Vec<u32> = [8, 16, 32, 64, 128, 256]
            .into_iter()
            .filter(|&b| b <= cap(view.n, 8))
            .collect();
        let block_m = pick(&mut self.mma_rng, &ms);
        let block_n = pick(&mut self.mma_rng, &ns);
        let warps: Vec<(u32, u32)> = [1, 2, 4, 8]
            .into_iter()
            .flat_map(|wm| [1, 2, 4, 8].map(|wn| (wm, wn)))
            .filter(|&(wm, wn)| {
                wm * wn <= MAX_WARPS && block_m % (MMA_M * wm) == 0 && block_n % (MMA_N * wn) == 0
            })
            .collect();
        let (warps_m, warps_n) = warps[(self.mma_rng.next_u64() % warps.len() as u64) as usize];
        let k_step = MmaTiling::k_step(dtype);
        let ks: Vec<u32> = (1..=MAX_K_STEPS)
            .filter(|&k| k.is_power_of_two() && (k == 1 || u64::from(k / 2) * k_step < view.k))
            .collect();
        let k_steps = pick(&mut self.mma_rng, &ks);
        let stages = pick(&mut self.mma_rng, &(1..=MAX_STAGES).collect::<Vec<_>>());
        let mut tiling = MmaTiling {
            block_m,
            block_n,
            warps_m,
            warps_n,
            k_steps,
            stages,
            vector: [1, 1],
            swizzle: !self.mma_rng.next_u64().is_multiple_of(4),
            row_span: false,
            persistent: 0,
            stream_k: 0,
        };
        for input in 0..2 {
            let feasible: Vec<u32> = [8, 4, 2, 1]
                .into_iter()
                .filter(|&w| tiling.vector_feasible(input, w, &view, dtype))
                .collect();
            let widest = !self.mma_rng.next_u64().is_multiple_of(4);
            tiling.vector[input] = match feasible.as_slice() {
                [] => 1,
                [first, ..] if widest => *first,
                all => pick(&mut self.mma_rng, all),
            };
        }
        // Row spans half the time where they apply: A in 16-byte runs, the weights
        // element by element, the least K tile that holds a filter row, or twice it;
        // persistent half of those times.
        let span_draw = self.span_rng.next_u64();
        if let Some(span) = self.span.filter(|_| span_draw.is_multiple_of(2)) {
            let least = MmaTiling::span_k_steps(&span, dtype).min(MAX_K_STEPS);
            let twice = (span_draw >> 1).is_multiple_of(4) && least < MAX_K_STEPS;
            tiling.row_span = true;
            tiling.vector = [COPY_ELEMENTS as u32, 1];
            tiling.k_steps = if twice { least * 2 } else { least };
            // Persistent half the time: 1 to 4 blocks per SM, a whole number per N
            // tile, no more than the tiles.
            if (span_draw >> 3).is_multiple_of(2) {
                let tiles = State::tensor_core(tiling, 1).spatial_blocks(&self.contraction);
                let n_tiles = view.n.div_ceil(u64::from(block_n));
                let per_sm = 1 + (span_draw >> 4) % 4;
                let blocks = (u64::from(self.gpu.sm_count) * per_sm).div_ceil(n_tiles) * n_tiles;
                tiling.persistent = blocks.min(tiles / n_tiles * n_tiles) as u32;
            }
        }
        let mut state = State::tensor_core(tiling, 1);
        state.split_k = self.split_k(&state);
        state.split_sums = self.split_sums(state.split_k);
        // A quarter of the time where the tiles are fewer than twice the SMs: stream-K
        // over one or two blocks per SM instead of the split, where it is valid.
        let stream_draw = self.mma_stream_rng.next_u64();
        let tiles = state.spatial_blocks(&self.contraction);
        if stream_draw.is_multiple_of(4) && tiles < 2 * u64::from(self.gpu.sm_count) {
            let per_sm = 1 + (stream_draw >> 2) % 2;
            let streamed = State::tensor_core(
                MmaTiling {
                    stream_k: self.gpu.sm_count * per_sm as u32,
                    ..tiling
                },
                1,
            );
            if validate(&self.contraction, &streamed, &self.gpu).is_ok() {
                return streamed;
            }
        }
        state
    }

    /// Whether the next draw is a `wgmma` one: half the draws of a task it applies to,
    /// decided on its own stream, so that the other draws of a seed are those drawn
    /// before the sketch existed.
    fn wgmma_draw(&mut self) -> bool {
        self.tma.is_some() && self.wgmma_rng.next_u64().is_multiple_of(2)
    }

    /// One `wgmma` draw, valid or not: one or two consumer warpgroups of one or two
    /// 64-row MMAs, N a multiple of 16 up to the GEMM's N (rounded up) and 256, K rows
    /// of 32, 64 or 128 bytes, 1 to 8 stages, 0 or 1 MMA groups in flight and with or
    /// without a producer warp, uniform; a reduction split as the other sketches draw
    /// it (ReLU included); then, half the time, one persistent block per SM where
    /// there are more units of work; then, half the time, a raster band (uniform among
    /// those that divide the M tiles); then, half the time, clusters (uniform among the
    /// valid `CLUSTER_SHAPES`); then, half the time, TMA stores where they are valid.
    /// Last, on its own stream (so that the draws before it are those of earlier
    /// builds), a quarter of the time where the tiles are fewer than twice the SMs:
    /// stream-K over one block per SM instead of the split, persistent grid, clusters
    /// and TMA stores, where it is valid.
    fn draw_wgmma(&mut self) -> State {
        let view = &self.tma.as_ref().expect("only drawn with a TMA view").view;
        let rng = &mut self.wgmma_rng;
        let mut pick = |options: &[u32]| options[(rng.next_u64() % options.len() as u64) as usize];
        let n_cap = (view.n.div_ceil(16) * 16).min(256) as u32;
        let ns: Vec<u32> = (1..=16).map(|i| 16 * i).filter(|&n| n <= n_cap).collect();
        let mut tiling = WgmmaTiling {
            consumers: pick(&[1, 2]),
            m_atoms: pick(&[1, 2]),
            block_n: pick(&ns),
            k_bytes: pick(&[32, 64, 128]),
            stages: pick(&(1..=MAX_WGMMA_STAGES).collect::<Vec<_>>()),
            in_flight: pick(&[0, 1]),
            persistent: 0,
            producer_warp: pick(&[0, 1]),
            raster: 0,
            cluster: 0,
            cluster_m: 0,
            tma_store: 0,
            stream_k: 0,
        };
        // Persistent blocks, one per SM, half the time a grid has more units than SMs;
        // the split is drawn for the plain grid.
        let persistent = pick(&[0, 1]) == 1;
        let mut state = State::hopper(tiling);
        let split_k = draw_split(rng, &self.contraction, &self.gpu, &state);
        if persistent && tiling.grid(view, split_k).0 > u64::from(self.gpu.sm_count) {
            tiling.persistent = self.gpu.sm_count;
        }
        // Half the time, a raster band among those that divide the M tiles.
        let (mtiles, ntiles) = tiling.tile_grid(view);
        let bands: Vec<u32> = RASTER_GROUPS
            .into_iter()
            .filter(|&g| mtiles.is_multiple_of(u64::from(g)) && ntiles > 1)
            .collect();
        if rng.next_u64().is_multiple_of(2) && !bands.is_empty() {
            tiling.raster = bands[(rng.next_u64() % bands.len() as u64) as usize];
        }
        // Half the time each, clusters of two, then TMA stores, where the state allows.
        let valid = |tiling: WgmmaTiling| {
            let state = State {
                split_k,
                ..State::hopper(tiling)
            };
            crate::validate::validate(&self.contraction, &state, &self.gpu).is_ok()
        };
        let clusters: Vec<WgmmaTiling> = CLUSTER_SHAPES
            .iter()
            .map(|&(cm, cn)| tiling.with_cluster_shape(cm, cn))
            .filter(|&t| valid(t))
            .collect();
        if rng.next_u64().is_multiple_of(2) && !clusters.is_empty() {
            tiling = clusters[(rng.next_u64() % clusters.len() as u64) as usize];
        }
        if rng.next_u64().is_multiple_of(2)
            && valid(WgmmaTiling {
                tma_store: 1,
                ..tiling
            })
        {
            tiling.tma_store = 1;
        }
        let small = tiling.tiles(view) < 2 * u64::from(self.gpu.sm_count);
        state.tiling = SketchTiling::Wgmma(tiling);
        state.split_k = split_k;
        state.split_sums = self.split_sums(split_k);
        if self.stream_rng.next_u64().is_multiple_of(4) && small {
            let streamed = State::hopper(tiling.streamed(self.gpu.sm_count));
            if validate(&self.contraction, &streamed, &self.gpu).is_ok() {
                return streamed;
            }
        }
        state
    }

    /// A random valid state, or None if none was found in many draws.
    pub fn sample(&mut self) -> Option<State> {
        (0..MAX_DRAWS).find_map(|_| {
            let state = if self.wgmma_draw() {
                self.draw_wgmma()
            } else if self.tensor_core_draw() {
                self.draw_mma()
            } else {
                self.draw()
            };
            validate(&self.contraction, &state, &self.gpu)
                .is_ok()
                .then_some(state)
        })
    }

    /// Up to `n` distinct valid states, in the order drawn.
    pub fn sample_distinct(&mut self, n: usize) -> Vec<State> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut misses = 0;
        while out.len() < n && misses < 64 + 4 * n {
            match self.sample() {
                Some(s) if seen.insert(s.clone()) => out.push(s),
                Some(_) => misses += 1,
                None => break,
            }
        }
        out
    }
}

/// A reduction split for the drawn tiles of `state` from `rng` (see the module docs):
/// two draws.
fn draw_split(rng: &mut ChaCha8Rng, c: &Contraction, gpu: &GpuSpec, state: &State) -> u32 {
    let choices = split_k_choices(state.stages(c));
    // Drawn even when there is no choice, so that the stream advances once per draw.
    let split = unit(rng.next_u64());
    let size = unit(rng.next_u64());
    if !state.may_split(c) || choices.len() < 2 {
        return 1;
    }
    let sm = f64::from(gpu.sm_count.max(1));
    let grid = state.spatial_blocks(c) as f64;
    let reduction: f64 = c.reduction.iter().map(|a| f64::from(a.extent)).product();
    let depth = reduction * sm / c.output_elements().max(1) as f64;
    let small_grid = (1.0 - grid / (4.0 * sm)).max(0.0);
    if split >= (depth.min(1.0) * small_grid).clamp(0.05, 0.9) {
        return 1;
    }
    let target = (2.0 * sm / grid).log2();
    let weights: Vec<f64> = choices[1..]
        .iter()
        .map(|&k| 0.5f64.powf((f64::from(k).log2() - target).abs()))
        .collect();
    let mut left = size * weights.iter().sum::<f64>();
    for (&k, w) in choices[1..].iter().zip(&weights) {
        if left < *w {
            return k;
        }
        left -= w;
    }
    choices[choices.len() - 1]
}

/// The reduction splits the search uses for a reduction of `stages` shared-memory
/// stages: the powers of two up to `MAX_SPLIT_K` and `stages`, in increasing order.
pub fn split_k_choices(stages: u64) -> Vec<u32> {
    (0..=MAX_SPLIT_K.ilog2())
        .map(|e| 1u32 << e)
        .filter(|&k| u64::from(k) <= stages.max(1))
        .collect()
}

/// Whether row spans are worth drawing for a convolution: where its channels are too
/// few for 16-byte im2col copies (fewer than 8), as in a C = 3 stem.
fn row_span_pays(span: &RowSpan) -> bool {
    span.channels < COPY_ELEMENTS
}

/// A uniform value in `[0, 1)` from 53 random bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// All ordered tuples of `parts` factors whose product divides `n`, with the last
/// factor at most `max_last`.
pub fn factorizations(n: u32, parts: usize, max_last: u32) -> Vec<Vec<u32>> {
    fn go(
        divisors: &[u32],
        rest: u32,
        parts: usize,
        max_last: u32,
        prefix: &mut Vec<u32>,
        out: &mut Vec<Vec<u32>>,
    ) {
        if parts == 0 {
            out.push(prefix.clone());
            return;
        }
        for &d in divisors.iter().take_while(|&&d| d <= rest) {
            if !rest.is_multiple_of(d) || (parts == 1 && d > max_last) {
                continue;
            }
            prefix.push(d);
            go(divisors, rest / d, parts - 1, max_last, prefix, out);
            prefix.pop();
        }
    }
    let divisors: Vec<u32> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
    let mut out = Vec::new();
    go(&divisors, n, parts, max_last, &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factorizations_of_eight_into_two() {
        let f = factorizations(8, 2, 64);
        // (a, b) with a*b | 8: 1x{1,2,4,8}, 2x{1,2,4}, 4x{1,2}, 8x1 = 10
        assert_eq!(f.len(), 10);
        assert!(f.iter().all(|v| 8 % (v[0] * v[1]) == 0));
    }

    #[test]
    fn split_choices_are_powers_of_two_within_the_stages() {
        assert_eq!(split_k_choices(1), vec![1]);
        assert_eq!(split_k_choices(5), vec![1, 2, 4]);
        assert_eq!(split_k_choices(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(split_k_choices(100_000), vec![1, 2, 4, 8, 16, 32, 64]);
    }

    /// Fraction of sampled states with a split, and the mean split, over `n` states.
    fn split_stats(op: &str, shape: &str, relu: bool, n: usize) -> (f64, f64) {
        use crate::shape::parse_shape;
        use crate::task::Epilogue;
        let epilogue = Epilogue { bias: false, relu };
        let task = Task::new(parse_shape(op, shape).unwrap(), epilogue).unwrap();
        let mut sampler = Sampler::new(&task, &GpuSpec::h100(), 1);
        let states: Vec<State> = (0..n).map(|_| sampler.sample().unwrap()).collect();
        let split = states.iter().filter(|s| s.split_k > 1).count() as f64 / n as f64;
        let mean = states.iter().map(|s| f64::from(s.split_k)).sum::<f64>() / n as f64;
        (split, mean)
    }

    #[test]
    fn small_grids_often_split_big_grids_rarely() {
        // ResNet's deepest 3x3 layer: 25k outputs over a 4608-long reduction.
        let (deep, deep_mean) = split_stats("conv2d", "1,512,7,7,512,3,3,1,1", false, 300);
        // A strided 1x1 with C=1024: 25k outputs over a 1024-long reduction.
        let (strided, _) = split_stats("conv2d", "1,1024,14,14,512,1,1,2,0", false, 300);
        // Its first 3x3 layer: 200k outputs over a 576-long reduction.
        let (wide, _) = split_stats("conv2d", "1,64,56,56,64,3,3,1,1", false, 300);
        // The stem: 800k outputs over a 147-long reduction.
        let (stem, _) = split_stats("conv2d", "1,3,224,224,64,7,7,2,3", false, 300);
        let (relu, _) = split_stats("conv2d", "1,512,7,7,512,3,3,1,1", true, 100);
        eprintln!("split fractions: deep {deep}, strided {strided}, wide {wide}, stem {stem}");
        assert!(deep > 0.6, "deep layer: {deep} split");
        assert!(strided > 0.6, "strided 1x1: {strided} split");
        assert!(deep_mean > 4.0, "deep layer: mean split {deep_mean}");
        assert!(wide < 0.45, "wide layer: {wide} split");
        assert!(stem < 0.15, "stem: {stem} split");
        assert_eq!(relu, 0.0);
    }

    #[test]
    fn drawn_splits_are_reproducible_choices() {
        use crate::shape::parse_shape;
        let task = Task::new(
            parse_shape("conv2d", "1,512,7,7,512,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let gpu = GpuSpec::h100();
        let mut a = Sampler::new(&task, &gpu, 9);
        let mut b = Sampler::new(&task, &gpu, 9);
        for _ in 0..50 {
            let (x, y) = (a.draw(), b.draw());
            assert_eq!(x, y);
            assert!(split_k_choices(x.stages(&task.contraction())).contains(&x.split_k));
        }
    }

    #[test]
    fn tiled_extents_stay_within_a_quarter() {
        assert_eq!(Sampler::tiled_extents(7), vec![7, 8]);
        assert_eq!(Sampler::tiled_extents(512), vec![512]);
        assert_eq!(Sampler::tiled_extents(333), vec![333, 334, 336, 352]);
    }
}
