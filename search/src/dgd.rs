//! DGD search (Ansor-AF-DS, ICS'24): a walk over the divisor lattice of tile sizes.
//!
//! Measure a random initial sample, take its best states as starting points, and from
//! the current point rank every 1- and 2-hop neighbour (one tile factor moved one step
//! along the sorted divisors of its axis' extent, the unroll depth one step, or the
//! reduction split `split_k` doubled or halved — one more lattice dimension, of powers
//! of two — or one input's shared layout changed: another innermost dimension, or
//! another row padding) with the cost model. Neighbours are measured in windows of 3, best predicted first; a window
//! stops at the first neighbour predicted under 0.6 × the current point's score. The walk
//! moves to the best measured neighbour that beats the current point; when the ranked
//! neighbours run out it falls back to 3-hop neighbours, then restarts from the next
//! starting point. Measured states are never proposed again (the tuner's measured set,
//! keyed by the canonical state id, is the cache); within the walk, neighbourhoods and
//! the points stood on are keyed by the canonical tile vector (`tile_vector`).
//!
//! Each sketch has its own lattice (`Sketch::neighbours`): tensor-core states move one
//! coordinate of the tiling (block tile sides, warps, k-steps, stages, copy widths,
//! swizzle, split) to a neighbouring value; 2- and 3-hop neighbourhoods compose those
//! moves as they do the CUDA-core ones.
//!
//! Left out from the paper: its "stop after 9 measured when the window's best is under
//! 0.6 × the global best" rule.

use crate::evolution::{TaskSpace, score};
use costmodel::CostModel;
use schedule::{Sampler, State};
use std::collections::HashSet;

/// AF-DS's parameters.
#[derive(Debug, Clone, Copy)]
pub struct DgdParams {
    /// Random states measured before the walk.
    pub initial: usize,
    /// Starting points taken from the best measured states.
    pub starts: usize,
    pub window: usize,
    /// A window stops under this fraction of the current point's predicted score.
    pub stop_ratio: f32,
}

impl Default for DgdParams {
    fn default() -> Self {
        DgdParams {
            initial: 64,
            starts: 5,
            window: 3,
            stop_ratio: 0.6,
        }
    }
}

/// The walk of one task.
#[derive(Debug, Default)]
pub struct Dgd {
    /// Starting points not used yet, best first.
    starts: Vec<State>,
    started: bool,
    /// The current point and its measured time.
    current: Option<(State, f64)>,
    /// Ranked unmeasured neighbours of the current point, best first, and its score.
    queue: Vec<(State, f32)>,
    current_score: f32,
    hops: usize,
    /// Points the walk has stood on, by tile vector.
    visited: HashSet<Vec<u32>>,
}

/// A state's coordinates in the lattice, canonical (`Sketch::tile_vector`): two valid
/// states of one task have the same vector exactly when they are the same state.
pub fn tile_vector(s: &State) -> Vec<u32> {
    s.sketch().tile_vector(s)
}

/// Every valid state one step away from `s` (`Sketch::neighbours`): for the CUDA-core
/// sketch one tile factor to the next divisor, the unroll depth, the split or a layout one
/// step away (`schedule::sketch::cuda_core::steps`); for a tensor-core state one
/// coordinate of its tiling to a neighbouring value (`schedule::sketch::mma_sync::steps`,
/// `schedule::sketch::wgmma::steps`).
pub fn neighbours(s: &State, space: &TaskSpace) -> Vec<State> {
    s.sketch().neighbours(space.contraction, s, space.gpu)
}

/// The states within `hops` steps of `s` (excluding `s`), deduplicated.
pub fn within(s: &State, hops: usize, space: &TaskSpace) -> Vec<State> {
    let mut seen: HashSet<Vec<u32>> = HashSet::from([tile_vector(s)]);
    let mut frontier = vec![s.clone()];
    let mut out = Vec::new();
    for _ in 0..hops {
        let mut next = Vec::new();
        for f in &frontier {
            for n in neighbours(f, space) {
                if seen.insert(tile_vector(&n)) {
                    next.push(n.clone());
                    out.push(n);
                }
            }
        }
        frontier = next;
    }
    out
}

impl Dgd {
    /// Ranks the unmeasured states within `hops` of the current point.
    fn rank(
        &mut self,
        hops: usize,
        space: &TaskSpace,
        measured: &HashSet<String>,
        model: &mut dyn CostModel,
    ) {
        let Some((center, _)) = &self.current else {
            return;
        };
        let center = center.clone();
        let candidates: Vec<State> = within(&center, hops, space)
            .into_iter()
            .filter(|n| !measured.contains(&n.id()))
            .collect();
        let mut all = candidates.clone();
        all.push(center);
        let scores = score(space, model, &all);
        self.current_score = *scores.last().unwrap_or(&0.0);
        let mut ranked: Vec<(State, f32)> = candidates.into_iter().zip(scores).collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.id().cmp(&b.0.id())));
        self.queue = ranked;
        self.hops = hops;
    }

    /// Up to `n` states to measure next.
    #[allow(clippy::too_many_arguments)]
    pub fn propose(
        &mut self,
        n: usize,
        params: &DgdParams,
        space: &TaskSpace,
        sampler: &mut Sampler,
        measured: &HashSet<String>,
        best_measured: &[(f64, State)],
        model: &mut dyn CostModel,
    ) -> Vec<State> {
        let random = |sampler: &mut Sampler, k: usize| {
            let mut out: Vec<State> = Vec::new();
            let mut misses = 0;
            while out.len() < k && misses < 50 * k.max(1) {
                match sampler.sample() {
                    Some(s) if !measured.contains(&s.id()) && !out.contains(&s) => out.push(s),
                    Some(_) => misses += 1,
                    None => break,
                }
            }
            out
        };
        if measured.len() < params.initial && !self.started {
            return random(sampler, n.min(params.initial - measured.len()));
        }
        if !self.started {
            self.started = true;
            self.starts = best_measured
                .iter()
                .take(params.starts)
                .map(|(_, s)| s.clone())
                .collect();
        }
        for _ in 0..params.starts + 2 {
            if self.current.is_none() {
                if self.starts.is_empty() {
                    break;
                }
                let start = self.starts.remove(0);
                let us = best_measured
                    .iter()
                    .find(|(_, s)| *s == start)
                    .map_or(f64::INFINITY, |(u, _)| *u);
                self.visited.insert(tile_vector(&start));
                self.current = Some((start, us));
                self.rank(2, space, measured, model);
            }
            let threshold = params.stop_ratio * self.current_score.max(0.0);
            let window: Vec<State> = self
                .queue
                .iter()
                .filter(|(s, _)| !measured.contains(&s.id()))
                .take_while(|(_, sc)| *sc >= threshold)
                .take(params.window.min(n))
                .map(|(s, _)| s.clone())
                .collect();
            if !window.is_empty() {
                let ids: HashSet<String> = window.iter().map(State::id).collect();
                self.queue.retain(|(s, _)| !ids.contains(&s.id()));
                return window;
            }
            // This neighbourhood is spent: widen once, then restart elsewhere.
            if self.hops < 3 {
                self.rank(3, space, measured, model);
            } else {
                self.current = None;
            }
        }
        // Every starting point is spent: more random states feed new starts.
        self.started = false;
        random(sampler, n.min(params.initial))
    }

    /// Moves to the best measured state that beats the current point.
    pub fn observe(
        &mut self,
        results: &[(State, Option<f64>)],
        space: &TaskSpace,
        measured: &HashSet<String>,
        model: &mut dyn CostModel,
    ) {
        let Some((_, current_us)) = &self.current else {
            return;
        };
        let best = results
            .iter()
            .filter_map(|(s, us)| us.map(|u| (u, s)))
            .filter(|(u, s)| *u < *current_us && !self.visited.contains(&tile_vector(s)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((us, s)) = best {
            self.visited.insert(tile_vector(s));
            self.current = Some((s.clone(), us));
            self.rank(2, space, measured, model);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use features::FeatureExtractor;
    use schedule::validate;
    use schedule::{GpuSpec, Task, parse_shape};

    #[test]
    fn split_k_is_a_lattice_dimension() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("conv2d", "1,512,7,7,512,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let ex = FeatureExtractor::new(&task, &gpu);
        let space = TaskSpace {
            contraction: &c,
            gpu: &gpu,
            extractor: &ex,
        };
        let mut s = Sampler::new(&task, &gpu, 2).sample().unwrap();
        s.split_k = 1;
        while u64::from(s.split_k) * 4 <= s.stages(&c) && s.split_k < 8 {
            s.split_k *= 2;
        }
        assert!(s.split_k > 1, "{s:?}");
        let splits: Vec<u32> = neighbours(&s, &space)
            .into_iter()
            .filter(|n| n.spatial == s.spatial && n.reduction == s.reduction)
            .filter(|n| n.unroll_max_step == s.unroll_max_step)
            .filter(|n| n.shared_layout == s.shared_layout)
            .map(|n| n.split_k)
            .collect();
        assert_eq!(splits, vec![s.split_k / 2, s.split_k * 2]);
        // Two hops reach a quarter and four times the split.
        let two: HashSet<u32> = within(&s, 2, &space).iter().map(|n| n.split_k).collect();
        assert!(two.contains(&(s.split_k / 4).max(1)) && two.contains(&(s.split_k * 4)));
    }

    #[test]
    fn shared_layouts_are_a_lattice_dimension() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("conv2d", "1,256,14,14,256,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let ex = FeatureExtractor::new(&task, &gpu);
        let space = TaskSpace {
            contraction: &c,
            gpu: &gpu,
            extractor: &ex,
        };
        let mut s = Sampler::new(&task, &gpu, 5).sample().unwrap();
        s.shared_layout = Default::default();
        let moved: Vec<State> = neighbours(&s, &space)
            .into_iter()
            .filter(|n| n.shared_layout != s.shared_layout)
            .collect();
        // Conv weight (k, c, r, s): k innermost or 3 other pads; data (c, h, w): h
        // innermost or 3 other pads; each neighbour changes one input's layout once.
        for n in &moved {
            let rest = State {
                shared_layout: s.shared_layout,
                ..n.clone()
            };
            assert_eq!(rest, s);
            let changed: Vec<usize> = (0..2)
                .filter(|&i| n.shared_layout[i] != s.shared_layout[i])
                .collect();
            assert_eq!(changed.len(), 1);
            let l = n.shared_layout[changed[0]];
            assert!(l.innermost.is_none() != (l.pad == 0), "{l:?}");
        }
        assert!(moved.len() >= 6, "{} layout neighbours", moved.len());
        assert!(
            moved
                .iter()
                .any(|n| n.shared_layout[1].innermost == Some(0))
        );
    }

    #[test]
    fn tensor_core_neighbours_move_one_coordinate_and_compose_over_hops() {
        use schedule::sketch::mma_sync::MmaCoordinate;
        use schedule::sketch::mma_sync::MmaTiling;
        use schedule::{DType, Layout};
        let gpu = GpuSpec::h100();
        for (op, shape) in [
            ("conv2d", "1,64,56,56,64,3,3,1,1"),
            ("matmul", "512,512,512"),
        ] {
            let task = Task::new(parse_shape(op, shape).unwrap(), Default::default())
                .unwrap()
                .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
                .unwrap();
            let c = task.contraction();
            let ex = FeatureExtractor::new(&task, &gpu);
            let space = TaskSpace {
                contraction: &c,
                gpu: &gpu,
                extractor: &ex,
            };
            let t = MmaTiling {
                block_m: 64,
                block_n: 64,
                warps_m: 2,
                warps_n: 2,
                k_steps: 2,
                stages: 2,
                vector: [4, 4],
                swizzle: false,
                row_span: false,
                persistent: 0,
                stream_k: 0,
            };
            let s = State::tensor_core(t, 2);
            assert!(validate(&c, &s, &gpu).is_ok());
            let distance = |n: &State| {
                MmaCoordinate::ALL
                    .into_iter()
                    .filter(|k| k.get(&s) != k.get(n))
                    .count()
            };
            let n1 = neighbours(&s, &space);
            assert!(n1.len() >= 12, "{} neighbours", n1.len());
            for n in &n1 {
                assert!(validate(&c, n, &gpu).is_ok());
                assert_eq!(distance(n), 1, "{n:?}");
            }
            // Two and three hops: deduplicated by tile vector, every state valid, up to
            // two and three coordinates moved, and more of them each time.
            let n2 = within(&s, 2, &space);
            let n3 = within(&s, 3, &space);
            assert!(n3.len() > n2.len() && n2.len() > n1.len());
            for (hops, states) in [(2, &n2), (3, &n3)] {
                let vectors: HashSet<Vec<u32>> = states.iter().map(tile_vector).collect();
                let ids: HashSet<String> = states.iter().map(State::id).collect();
                assert_eq!(vectors.len(), states.len(), "deduplicated");
                assert_eq!(ids.len(), states.len(), "one vector per state");
                assert!(!vectors.contains(&tile_vector(&s)));
                assert!(states.iter().all(|n| validate(&c, n, &gpu).is_ok()));
                assert!(states.iter().all(|n| distance(n) <= hops));
                assert!(states.iter().any(|n| distance(n) == hops), "{hops} hops");
            }
        }
    }

    #[test]
    fn tile_vectors_tell_the_sketches_and_states_apart() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("matmul", "256,256,256").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let ex = FeatureExtractor::new(&task, &gpu);
        let space = TaskSpace {
            contraction: &c,
            gpu: &gpu,
            extractor: &ex,
        };
        let s = Sampler::new(&task, &gpu, 4).sample().unwrap();
        let states = within(&s, 2, &space);
        let vectors: HashSet<Vec<u32>> = states.iter().map(tile_vector).collect();
        assert_eq!(vectors.len(), states.len());
        assert!(vectors.iter().all(|v| v[0] == 0));
        let mma = State::tensor_core(
            schedule::sketch::mma_sync::MmaTiling {
                block_m: 64,
                block_n: 64,
                warps_m: 2,
                warps_n: 2,
                k_steps: 2,
                stages: 2,
                vector: [4, 4],
                swizzle: true,
                row_span: false,
                persistent: 0,
                stream_k: 0,
            },
            1,
        );
        assert_eq!(
            tile_vector(&mma),
            vec![1, 64, 64, 2, 2, 2, 2, 4, 4, 1, 1, 0, 0, 0, 0]
        );
    }

    #[test]
    fn neighbours_move_one_factor_one_divisor_step() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("matmul", "256,256,256").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let ex = FeatureExtractor::new(&task, &gpu);
        let space = TaskSpace {
            contraction: &c,
            gpu: &gpu,
            extractor: &ex,
        };
        let s = Sampler::new(&task, &gpu, 2).sample().unwrap();
        let n1 = neighbours(&s, &space);
        assert!(!n1.is_empty());
        for n in &n1 {
            assert_ne!(*n, s);
            assert!(validate(&c, n, &gpu).is_ok());
            // Exactly one tile factor or the unroll depth differs.
            let mut diffs = 0;
            for (a, b) in n.spatial.iter().zip(&s.spatial) {
                diffs += [
                    a.vthread != b.vthread,
                    a.thread != b.thread,
                    a.outer != b.outer,
                    a.inner != b.inner,
                ]
                .iter()
                .filter(|&&d| d)
                .count();
            }
            for (a, b) in n.reduction.iter().zip(&s.reduction) {
                diffs += usize::from(a.middle != b.middle) + usize::from(a.inner != b.inner);
            }
            diffs += usize::from(n.unroll_max_step != s.unroll_max_step);
            diffs += (0..2)
                .filter(|&i| n.shared_layout[i] != s.shared_layout[i])
                .count();
            // A split move changes nothing else; a tile move may refit the split.
            if diffs == 0 {
                assert!(n.split_k == 2 * s.split_k || 2 * n.split_k == s.split_k);
                diffs += 1;
            }
            assert_eq!(diffs, 1, "{n:?} vs {s:?}");
        }
        let n2 = within(&s, 2, &space);
        assert!(n2.len() > n1.len());
        let ids: HashSet<String> = n2.iter().map(State::id).collect();
        assert_eq!(ids.len(), n2.len(), "deduplicated");
        assert!(!ids.contains(&s.id()));
    }
}
