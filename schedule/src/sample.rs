//! Sampling: uniformly random valid states of a task, reproducible from a seed.
//!
//! Each axis's split is drawn uniformly from all ordered factorizations of a "tiled
//! extent": the extent itself (perfect splits, as Ansor draws them) or the extent
//! rounded up to a multiple of a small power of two when that costs at most a quarter
//! more work — so that awkward extents (7, 333, 555) get useful tiles and the tail is
//! predicated. Innermost factors are bounded. Invalid draws are rejected and redrawn.
//! Random choices come straight from the ChaCha8 stream, so the same seed gives the same
//! states whatever version of a distribution library is in use.

use crate::gpu_spec::GpuSpec;
use crate::state::{ReductionSplit, SpatialSplit, State, UNROLL_STEPS, VECTOR_WIDTHS};
use crate::task::{Contraction, Task};
use crate::tiling::Tiling;
use crate::validate::validate;
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
    /// Factorizations per (tiled extent, parts), computed once.
    factorizations: HashMap<(u32, usize), Vec<Vec<u32>>>,
}

impl Sampler {
    pub fn new(task: &Task, gpu: &GpuSpec, seed: u64) -> Self {
        Sampler {
            contraction: task.contraction(),
            gpu: gpu.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            factorizations: HashMap::new(),
        }
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
            spatial,
            reduction,
            unroll_max_step,
            vector_width: [1, 1],
        };
        let tiling = Tiling::new(&self.contraction, &state);
        for input in 0..2 {
            let feasible: Vec<u32> = VECTOR_WIDTHS
                .into_iter()
                .filter(|&w| tiling.vector_feasible(&self.contraction, input, w))
                .collect();
            state.vector_width[input] = feasible[self.pick(feasible.len())];
        }
        state
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
    fn tiled_extents_stay_within_a_quarter() {
        assert_eq!(Sampler::tiled_extents(7), vec![7, 8]);
        assert_eq!(Sampler::tiled_extents(512), vec![512]);
        assert_eq!(Sampler::tiled_extents(333), vec![333, 334, 336, 352]);
    }
}
