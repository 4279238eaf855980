//! Mutations of a state, as Ansor's evolutionary search uses them: move a prime factor
//! of one tile level of an axis to another level of the same axis (tile-size mutation,
//! weight 0.9), or pick another unroll depth (weight 0.1). The outermost level is
//! implicit (what remains of the extent), so moving a factor out of it means growing an
//! inner level while the axis' inner product stays within its extent (+25% for tails,
//! as the sampler allows). Mutants are validated; fetch vector widths are lowered to
//! the widest one still feasible.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;
use schedule::state::{UNROLL_STEPS, VECTOR_WIDTHS};
use schedule::task::Contraction;
use schedule::tiling::Tiling;
use schedule::{GpuSpec, State, validate};

fn pick(rng: &mut ChaCha8Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
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
    let tiling = Tiling::new(c, s);
    for input in 0..2 {
        s.vector_width[input] = VECTOR_WIDTHS
            .into_iter()
            .filter(|&w| w <= s.vector_width[input] && tiling.vector_feasible(c, input, w))
            .max()
            .unwrap_or(1);
    }
}

/// A valid mutant of `state`, or None if the drawn mutation gave none.
pub fn mutate(
    state: &State,
    c: &Contraction,
    gpu: &GpuSpec,
    rng: &mut ChaCha8Rng,
) -> Option<State> {
    let mut s = state.clone();
    if rng.next_u64().is_multiple_of(10) {
        let others: Vec<u32> = UNROLL_STEPS
            .into_iter()
            .filter(|&u| u != s.unroll_max_step)
            .collect();
        s.unroll_max_step = others[pick(rng, others.len())];
    } else if !mutate_tile(&mut s, c, gpu, rng) {
        return None;
    }
    fit_vector_widths(c, &mut s);
    (s != *state && validate(c, &s, gpu).is_ok()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use schedule::{Sampler, Task, parse_shape};

    #[test]
    fn primes() {
        assert_eq!(prime_factors(1), Vec::<u32>::new());
        assert_eq!(prime_factors(12), vec![2, 2, 3]);
        assert_eq!(prime_factors(49), vec![7, 7]);
    }

    #[test]
    fn mutants_are_valid_different_and_keep_the_extent_covered() {
        let gpu = GpuSpec::h100();
        for (op, shape) in [
            ("conv2d", "1,64,56,56,64,3,3,1,1"),
            ("matmul", "333,777,555"),
        ] {
            let task = Task::new(parse_shape(op, shape).unwrap(), Default::default()).unwrap();
            let c = task.contraction();
            let mut sampler = Sampler::new(&task, &gpu, 3);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let mut made = 0;
            for _ in 0..200 {
                let s = sampler.sample().unwrap();
                if let Some(m) = mutate(&s, &c, &gpu, &mut rng) {
                    made += 1;
                    assert_ne!(m, s);
                    assert!(validate(&c, &m, &gpu).is_ok());
                    for (split, axis) in m.spatial.iter().zip(&c.spatial) {
                        assert!(split.block_tile() <= axis.extent + axis.extent / 4);
                    }
                }
            }
            assert!(made > 50, "{op}: only {made} of 200 mutations succeeded");
        }
    }
}
