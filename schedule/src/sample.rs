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
use crate::row_span::{COPY_ELEMENTS, RowSpan};
use crate::sketch::cuda_core::geometry::innermost_choices;
use crate::sketch::wgmma::geometry::{TmaGemm, wgmma_applies};
use crate::state::{MAX_SPLIT_K, SHARED_PADS, SharedLayout, SplitSums, State};
use crate::task::{Contraction, Task};
use crate::validate::validate;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

/// Draws before a single sample gives up (valid states are rarely that scarce).
const MAX_DRAWS: usize = 20_000;

/// Draws random valid states of one task.
pub struct Sampler {
    pub(crate) contraction: Contraction,
    pub(crate) gpu: GpuSpec,
    pub(crate) rng: ChaCha8Rng,
    /// The reduction split's own stream (stream 1 of the seed), so that adding it left
    /// the tile draws of every seed as they were.
    pub(crate) split_rng: ChaCha8Rng,
    /// The shared layouts' own stream (stream 2 of the seed).
    pub(crate) layout_rng: ChaCha8Rng,
    /// The tensor-core sketch's stream (stream 3): the sketch choice and its tiles.
    pub(crate) mma_rng: ChaCha8Rng,
    /// The task's GEMM view, when the tensor-core sketch applies to it.
    pub(crate) gemm: Option<GemmView>,
    /// The `wgmma` sketch's stream (stream 4): the sketch choice and its tiles.
    pub(crate) wgmma_rng: ChaCha8Rng,
    /// The task's TMA view, when the `wgmma` sketch applies to it on this GPU.
    pub(crate) tma: Option<TmaGemm>,
    /// The split sums' stream (stream 5): one draw per tensor-core state.
    pub(crate) sums_rng: ChaCha8Rng,
    /// Stream-K's stream (stream 6): one draw per `wgmma` state.
    pub(crate) stream_rng: ChaCha8Rng,
    /// Row spans' stream (stream 7): one draw per tensor-core state.
    pub(crate) span_rng: ChaCha8Rng,
    /// The tensor-core sketch's stream-K draws (stream 8): one per tensor-core state.
    pub(crate) mma_stream_rng: ChaCha8Rng,
    /// The task's row spans, where they apply and pay (`row_span_pays`).
    pub(crate) span: Option<RowSpan>,
    /// Innermost-dimension choices per input (`tiling::innermost_choices`).
    pub(crate) innermost: [Vec<Option<u8>>; 2],
    /// Factorizations per (tiled extent, parts), computed once.
    pub(crate) factorizations: HashMap<(u32, usize), Vec<Vec<u32>>>,
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
    pub(crate) fn split_k(&mut self, state: &State) -> u32 {
        draw_split(&mut self.split_rng, &self.contraction, &self.gpu, state)
    }

    /// How a tensor-core state split `split_k` ways meets its partial sums: atomic half
    /// the time there is a split; always one draw.
    pub(crate) fn split_sums(&mut self, split_k: u32) -> SplitSums {
        let atomic = self.sums_rng.next_u64().is_multiple_of(2);
        if split_k > 1 && atomic {
            SplitSums::Atomic
        } else {
            SplitSums::Ordered
        }
    }

    /// A shared layout for input `input` (see the module docs); always two draws.
    pub(crate) fn layout(&mut self, input: usize) -> SharedLayout {
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

    pub(crate) fn pick(&mut self, n: usize) -> usize {
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
    pub(crate) fn split(&mut self, extent: u32, parts: usize) -> Vec<u32> {
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

    /// A random valid state, or None if none was found in many draws.
    pub fn sample(&mut self) -> Option<State> {
        (0..MAX_DRAWS).find_map(|_| {
            let state = self.draw();
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
pub(crate) fn draw_split(
    rng: &mut ChaCha8Rng,
    c: &Contraction,
    gpu: &GpuSpec,
    state: &State,
) -> u32 {
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
pub(crate) fn unit(bits: u64) -> f64 {
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
