//! The `mma.sync` sketch's draws (see `crate::sample` for its streams).

use crate::row_span::COPY_ELEMENTS;
use crate::sample::Sampler;
use crate::sketch::mma_sync::geometry::{MMA_M, MMA_N};
use crate::sketch::mma_sync::tiling::{MAX_K_STEPS, MAX_STAGES, MAX_WARPS, MmaTiling};
use crate::state::State;
use crate::validate::validate;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;

impl Sampler {
    /// An `mma.sync` draw, when the draw is this sketch's: whenever it applies to
    /// half data (fp16, bf16: the CUDA-core sketch computes them too, widened to f32,
    /// but at a fraction of the tensor cores' rate), three draws in four for TF32
    /// (whose f32 data the CUDA-core sketch computes in full f32), never for f32. A
    /// task without a GEMM view (NCHW, depthwise) never draws it.
    pub(crate) fn draw_mma_sync(&mut self) -> Option<State> {
        if self.tensor_core_draw() {
            Some(self.mma_state())
        } else {
            None
        }
    }

    /// Whether the draw is this sketch's (see `draw_mma_sync`), on its stream (3).
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
    fn mma_state(&mut self) -> State {
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
}
