//! The CUDA-core sketch's neighbours: Ansor's mutations (`mutate`) and AF-DS's divisor
//! lattice (`neighbours`), with the tile vector that names a point of it.
//!
//! Mutation, as Ansor's evolutionary search uses it: move a prime factor of one tile
//! level of an axis to another level of the same axis (tile-size mutation), or pick
//! another unroll depth (weight 0.1); beyond Ansor, double or halve the reduction split
//! `split_k` (weight 0.1 where the task can split at all: no ReLU and more than one
//! stage; the tile mutation takes the rest), toggle register prefetch where it is
//! feasible (weight 0.1), or give one input's shared tile another layout — another
//! innermost dimension or row padding, uniformly among the input's layouts (weight
//! 0.1). The outermost level is implicit (what remains of the extent), so moving a
//! factor out of it means growing an inner level while the axis' inner product stays
//! within its extent (+25% for tails, as the sampler allows). Mutants are validated;
//! fetch vector widths are lowered to the widest one still feasible, and a split to
//! the largest one the (changed) stage count still allows.
//!
//! The lattice: one tile factor to the next smaller or larger divisor of its axis'
//! extent, the unroll depth to a neighbouring value, the reduction split doubled or
//! halved, or one input's layout one step away (`layout_steps`).

use crate::gpu_spec::GpuSpec;
use crate::sketch::cuda_core::geometry::{Tiling, canonical_unroll, innermost_choices};
use crate::sketch::cuda_core::validate::{prefetch_feasible, validate};
use crate::sketch::{pick, split_steps};
use crate::state::{
    MAX_SPLIT_K, SHARED_PADS, SharedLayout, SketchTiling, State, UNROLL_STEPS, VECTOR_WIDTHS,
};
use crate::task::Contraction;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;

/// The sorted divisors of `n`.
fn divisors(n: u32) -> Vec<u32> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// The prime factors of `n` (with repetition).
fn prime_factors(mut n: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p = 2;
    while p * p <= n {
        while n.is_multiple_of(p) {
            out.push(p);
            n /= p;
        }
        p += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

/// The explicit levels of axis `axis` (spatial axes first, then reduction axes), mutable.
fn levels(state: &mut State, axis: usize) -> Vec<&mut u32> {
    let spatial = state.spatial.len();
    if axis < spatial {
        let s = &mut state.spatial[axis];
        vec![&mut s.vthread, &mut s.thread, &mut s.outer, &mut s.inner]
    } else {
        let r = &mut state.reduction[axis - spatial];
        vec![&mut r.middle, &mut r.inner]
    }
}

/// Moves one prime factor between two levels of one axis (level `None` = the implicit
/// outermost). Returns false when the drawn move is impossible.
fn mutate_tile(state: &mut State, c: &Contraction, gpu: &GpuSpec, rng: &mut ChaCha8Rng) -> bool {
    let axes = state.spatial.len() + state.reduction.len();
    if axes == 0 {
        return false;
    }
    let axis = pick(rng, axes);
    let extent = if axis < state.spatial.len() {
        c.spatial[axis].extent
    } else {
        c.reduction[axis - state.spatial.len()].extent
    };
    let mut levels = levels(state, axis);
    let n = levels.len();
    // Source and destination among n explicit levels plus the implicit one (index n).
    let src = pick(rng, n + 1);
    let mut dst = pick(rng, n);
    if dst >= src {
        dst += 1;
    }
    let product: u32 = levels.iter().map(|l| **l).product();
    let factor = if src == n {
        let outer = extent.div_ceil(product);
        let primes = prime_factors(outer.max(1));
        if primes.is_empty() {
            return false;
        }
        primes[pick(rng, primes.len())]
    } else {
        let primes = prime_factors(*levels[src]);
        if primes.is_empty() {
            return false;
        }
        primes[pick(rng, primes.len())]
    };
    if src < n {
        *levels[src] /= factor;
    }
    if dst < n {
        *levels[dst] *= factor;
    }
    let product: u32 = levels.iter().map(|l| **l).product();
    let innermost = *levels[n - 1];
    product <= extent + extent / 4 && innermost <= gpu.max_innermost_factor
}

/// Lowers each input's fetch vector width to the widest one the (changed) tiles still
/// allow.
pub fn fit_vector_widths(c: &Contraction, s: &mut State) {
    // The tensor-core sketch's copy widths are its tiling's own.
    if s.tiling == SketchTiling::CudaCore {
        s.vector_width = fitted_vector_widths(c, s);
    }
}

fn fitted_vector_widths(c: &Contraction, s: &State) -> [u32; 2] {
    let tiling = Tiling::new(c, s);
    [0, 1].map(|input| {
        VECTOR_WIDTHS
            .into_iter()
            .filter(|&w| w <= s.vector_width[input] && tiling.vector_feasible(c, input, w))
            .max()
            .unwrap_or(1)
    })
}

/// Halves the reduction split until the state's stage count allows it (a tile change
/// may have lengthened the stages); keeps a power of two a power of two.
pub fn fit_split_k(c: &Contraction, s: &mut State) {
    let stages = s.stages(c);
    while s.split_k > 1 && (u64::from(s.split_k) > stages || s.split_k > MAX_SPLIT_K) {
        s.split_k /= 2;
    }
}

/// Every shared layout input `input` of `c` may take: each innermost choice
/// (`tiling::innermost_choices`) with each row padding.
pub fn layouts(c: &Contraction, input: usize) -> Vec<SharedLayout> {
    innermost_choices(c, input)
        .into_iter()
        .flat_map(|innermost| SHARED_PADS.map(|pad| SharedLayout { innermost, pad }))
        .collect()
}

/// The layouts one step from input `input`'s in `s`: another innermost dimension with
/// the same padding, or the same dimension with another padding.
pub fn layout_steps(c: &Contraction, s: &State, input: usize) -> Vec<SharedLayout> {
    let current = s.shared_layout[input];
    layouts(c, input)
        .into_iter()
        .filter(|l| *l != current && (l.innermost == current.innermost || l.pad == current.pad))
        .collect()
}

/// A valid mutant of CUDA-core state `state`, or None if the drawn mutation gave none.
pub fn mutate(
    state: &State,
    c: &Contraction,
    gpu: &GpuSpec,
    rng: &mut ChaCha8Rng,
) -> Option<State> {
    let mut s = state.clone();
    let draw = rng.next_u64() % 10;
    if draw == 0 {
        let others: Vec<u32> = UNROLL_STEPS
            .into_iter()
            .filter(|&u| u != s.unroll_max_step)
            .collect();
        s.unroll_max_step = others[pick(rng, others.len())];
    } else if draw == 1 && s.may_split(c) {
        let steps = split_steps(c, &s);
        if steps.is_empty() {
            return None;
        }
        s.split_k = steps[pick(rng, steps.len())];
    } else if draw == 3 && (s.prefetch || prefetch_feasible(c, &s)) {
        s.prefetch = !s.prefetch;
    } else if draw == 2 {
        let input = pick(rng, 2);
        let others: Vec<SharedLayout> = layouts(c, input)
            .into_iter()
            .filter(|l| *l != s.shared_layout[input])
            .collect();
        if others.is_empty() {
            return None;
        }
        s.shared_layout[input] = others[pick(rng, others.len())];
    } else if !mutate_tile(&mut s, c, gpu, rng) {
        return None;
    }
    fit_vector_widths(c, &mut s);
    fit_split_k(c, &mut s);
    s.unroll_max_step = canonical_unroll(c, &s);
    // A tile change may roll a fetch loop: prefetch goes with it.
    s.prefetch &= prefetch_feasible(c, &s);
    (s != *state && validate(c, &s, gpu).is_ok()).then_some(s)
}

/// The state's coordinates (see `Sketch::tile_vector`): 0, then every split factor
/// (spatial axes' vthread, thread, outer, inner, then reduction axes' middle, inner),
/// the unroll depth, the vector widths, the split, each input's layout (innermost
/// dimension + 1, or 0 for the natural order, and padding) and prefetch.
pub fn tile_vector(s: &State) -> Vec<u32> {
    let mut v = vec![0];
    for split in &s.spatial {
        v.extend([split.vthread, split.thread, split.outer, split.inner]);
    }
    for split in &s.reduction {
        v.extend([split.middle, split.inner]);
    }
    v.extend([
        s.unroll_max_step,
        s.vector_width[0],
        s.vector_width[1],
        s.split_k,
    ]);
    for layout in &s.shared_layout {
        v.extend([layout.innermost.map_or(0, |d| u32::from(d) + 1), layout.pad]);
    }
    v.push(u32::from(s.prefetch));
    v
}

/// Every valid state one lattice step from `s` (see the module's docs), vector widths
/// lowered to the widest still feasible and the split to the largest the stage count
/// allows.
pub fn neighbours(c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
    let mut out = Vec::new();
    let mut push = |mut n: State| {
        fit_vector_widths(c, &mut n);
        fit_split_k(c, &mut n);
        if validate(c, &n, gpu).is_ok() && n != *s {
            out.push(n);
        }
    };
    let steps = |value: u32, extent: u32| -> Vec<u32> {
        let d = divisors(extent);
        let at = d.partition_point(|&x| x < value);
        let mut v = Vec::new();
        if at > 0 {
            v.push(d[at - 1]);
        }
        let next = if d.get(at) == Some(&value) {
            at + 1
        } else {
            at
        };
        if let Some(&x) = d.get(next) {
            v.push(x);
        }
        v
    };
    for (axis, split) in s.spatial.iter().enumerate() {
        let extent = c.spatial[axis].extent;
        let levels = [split.vthread, split.thread, split.outer, split.inner];
        for level in 0..4 {
            for v in steps(levels[level], extent) {
                let mut n = s.clone();
                let t = &mut n.spatial[axis];
                *[&mut t.vthread, &mut t.thread, &mut t.outer, &mut t.inner][level] = v;
                if t.block_tile() <= extent + extent / 4 && t.inner <= gpu.max_innermost_factor {
                    push(n);
                }
            }
        }
    }
    for (axis, split) in s.reduction.iter().enumerate() {
        let extent = c.reduction[axis].extent;
        for level in 0..2 {
            let value = if level == 0 {
                split.middle
            } else {
                split.inner
            };
            for v in steps(value, extent) {
                let mut n = s.clone();
                let r = &mut n.reduction[axis];
                if level == 0 {
                    r.middle = v;
                } else {
                    r.inner = v;
                }
                if r.stage_tile() <= extent + extent / 4 {
                    push(n);
                }
            }
        }
    }
    if let Some(i) = UNROLL_STEPS.iter().position(|&u| u == s.unroll_max_step) {
        for j in [i.wrapping_sub(1), i + 1] {
            if let Some(&u) = UNROLL_STEPS.get(j) {
                push(State {
                    unroll_max_step: u,
                    ..s.clone()
                });
            }
        }
    }
    for split_k in split_steps(c, s) {
        push(State {
            split_k,
            ..s.clone()
        });
    }
    for input in 0..2 {
        for layout in layout_steps(c, s, input) {
            let mut n = s.clone();
            n.shared_layout[input] = layout;
            push(n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        assert_eq!(prime_factors(1), Vec::<u32>::new());
        assert_eq!(prime_factors(12), vec![2, 2, 3]);
        assert_eq!(prime_factors(49), vec![7, 7]);
    }

    #[test]
    fn divisors_are_sorted() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
    }
}
