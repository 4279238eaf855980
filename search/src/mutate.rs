//! Mutations of a state, as Ansor's evolutionary search uses them: move a prime factor
//! of one tile level of an axis to another level of the same axis (tile-size mutation),
//! or pick another unroll depth (weight 0.1); beyond Ansor, double or halve the
//! reduction split `split_k` (weight 0.1 where the task can split at all: no ReLU and
//! more than one stage; the tile mutation takes the rest), or give one input's shared
//! tile another layout — another innermost dimension or row padding, uniformly among
//! the input's layouts (weight 0.1). The outermost level is
//! implicit (what remains of the extent), so moving a factor out of it means growing an
//! inner level while the axis' inner product stays within its extent (+25% for tails,
//! as the sampler allows). Mutants are validated; fetch vector widths are lowered to
//! the widest one still feasible, and a split to the largest one the (changed) stage
//! count still allows.
//!
//! Tensor-core states (`State::mma`) have no factor lattice: their coordinates are the
//! block tile's sides, the warps along each, the k-steps per K tile, the pipeline's
//! stages, each input's copy width, the swizzle, the split and its sums. A mutation
//! moves one of them to a neighbouring value (`schedule::sketch::mma_sync::steps`: sides, warps, copy widths
//! and split doubled or halved, k-steps and stages one up or down, the swizzle and the
//! split sums toggled), drawn
//! uniformly among the moves that give a valid state. Nothing is refitted afterwards,
//! so a mutant differs from its parent in exactly one coordinate; the CUDA-core
//! mutations above are untouched (the same seed draws the same CUDA-core mutants).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::Rng;
use schedule::sketch::{mma_sync, split_steps, wgmma};
use schedule::state::{MAX_SPLIT_K, SHARED_PADS, SharedLayout, UNROLL_STEPS, VECTOR_WIDTHS};
use schedule::task::Contraction;
use schedule::tiling::{Tiling, innermost_choices};
use schedule::{GpuSpec, State, prefetch_feasible, validate};

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
    // The tensor-core sketch's copy widths are its tiling's own.
    if let Some(widths) = s.sketch(|| Some(fitted_vector_widths(c, s)), |_| None, |_| None) {
        s.vector_width = widths;
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

/// A valid mutant of `state`, or None if the drawn mutation gave none.
pub fn mutate(
    state: &State,
    c: &Contraction,
    gpu: &GpuSpec,
    rng: &mut ChaCha8Rng,
) -> Option<State> {
    state.sketch_with(
        rng,
        |rng| mutate_cuda_core(state, c, gpu, rng),
        |rng, _| pick_one(rng, mma_sync::steps(c, state, gpu)),
        |rng, _| pick_one(rng, wgmma::steps(c, state, gpu)),
    )
}

/// One of `moves`, uniformly, or None when there is none.
fn pick_one(rng: &mut ChaCha8Rng, mut moves: Vec<State>) -> Option<State> {
    if moves.is_empty() {
        return None;
    }
    let i = pick(rng, moves.len());
    Some(moves.swap_remove(i))
}

fn mutate_cuda_core(
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
    // A tile change may roll a fetch loop: prefetch goes with it.
    s.prefetch &= prefetch_feasible(c, &s);
    (s != *state && validate(c, &s, gpu).is_ok()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use schedule::mma::MmaTiling;
    use schedule::sketch::mma_sync::MmaCoordinate;
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

    #[test]
    fn split_mutations_double_or_halve_within_the_stages() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("conv2d", "1,512,7,7,512,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let mut sampler = Sampler::new(&task, &gpu, 8);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (mut doubled, mut halved) = (0, 0);
        for _ in 0..400 {
            let s = sampler.sample().unwrap();
            let Some(m) = mutate(&s, &c, &gpu, &mut rng) else {
                continue;
            };
            assert!(m.split_k.is_power_of_two() && u64::from(m.split_k) <= m.stages(&c));
            let same_tiles = m.spatial == s.spatial && m.reduction == s.reduction;
            if same_tiles && m.split_k == 2 * s.split_k {
                doubled += 1;
            } else if same_tiles && 2 * m.split_k == s.split_k {
                halved += 1;
            }
        }
        assert!(
            doubled > 5 && halved > 5,
            "doubled {doubled}, halved {halved}"
        );
    }

    #[test]
    fn layout_mutations_change_one_input_and_nothing_else() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("matmul", "1024,1024,1024").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let mut sampler = Sampler::new(&task, &gpu, 4);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut changed = [0; 2];
        for _ in 0..400 {
            let s = sampler.sample().unwrap();
            let Some(m) = mutate(&s, &c, &gpu, &mut rng) else {
                continue;
            };
            let same_rest = State {
                shared_layout: s.shared_layout,
                ..m.clone()
            } == s;
            if same_rest {
                let inputs: Vec<usize> = (0..2)
                    .filter(|&i| m.shared_layout[i] != s.shared_layout[i])
                    .collect();
                assert_eq!(inputs.len(), 1, "{m:?} vs {s:?}");
                assert!(layouts(&c, inputs[0]).contains(&m.shared_layout[inputs[0]]));
                changed[inputs[0]] += 1;
            }
        }
        assert!(changed[0] > 5 && changed[1] > 5, "changed {changed:?}");
        // A: m innermost or not, 4 pads; B: 4 pads only. One step changes one of them.
        assert_eq!(layouts(&c, 0).len(), 8);
        assert_eq!(layouts(&c, 1).len(), 4);
        let s = sampler.sample().unwrap();
        assert_eq!(layout_steps(&c, &s, 0).len(), 4);
        assert_eq!(layout_steps(&c, &s, 1).len(), 3);
    }

    /// An fp16 NHWC ResNet layer and an fp16 matmul, each with a valid tensor-core
    /// state in the middle of every coordinate's range.
    fn tensor_core_cases() -> Vec<(Task, State)> {
        use schedule::{DType, Layout};
        let tiling = MmaTiling {
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
        };
        [
            ("conv2d", "1,64,56,56,64,3,3,1,1"),
            ("matmul", "512,512,512"),
        ]
        .into_iter()
        .map(|(op, shape)| {
            let task = Task::new(parse_shape(op, shape).unwrap(), Default::default())
                .unwrap()
                .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
                .unwrap();
            let state = State::tensor_core(tiling, 2);
            assert_eq!(
                validate(&task.contraction(), &state, &GpuSpec::h100()),
                Ok(())
            );
            (task, state)
        })
        .collect()
    }

    /// The coordinates in which two tensor-core states differ: a row-span toggle alone
    /// for one, which carries its copy widths and k-steps along.
    fn changed(a: &State, b: &State) -> Vec<MmaCoordinate> {
        let moved: Vec<MmaCoordinate> = MmaCoordinate::ALL
            .into_iter()
            .filter(|k| k.get(a) != k.get(b))
            .collect();
        if moved.contains(&MmaCoordinate::RowSpan) {
            return vec![MmaCoordinate::RowSpan];
        }
        moved
    }

    #[test]
    fn tensor_core_mutants_move_one_coordinate_to_a_neighbouring_value() {
        let gpu = GpuSpec::h100();
        for (task, start) in tensor_core_cases() {
            let c = task.contraction();
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let mut seen = std::collections::HashSet::new();
            let mut s = start.clone();
            for i in 0..400 {
                let m = mutate(&s, &c, &gpu, &mut rng).expect("a valid move exists");
                assert!(validate(&c, &m, &gpu).is_ok());
                assert!(m.mma().is_some() && m.spatial.is_empty());
                let moved = changed(&s, &m);
                assert_eq!(moved.len(), 1, "{s:?} -> {m:?}");
                let k = moved[0];
                let (from, to) = (k.get(&s), k.get(&m));
                let neighbouring = match k {
                    MmaCoordinate::Stages => from.abs_diff(to) == 1,
                    MmaCoordinate::Swizzle
                    | MmaCoordinate::SplitSums
                    | MmaCoordinate::RowSpan
                    | MmaCoordinate::Persistent
                    | MmaCoordinate::StreamK => true,
                    _ => to == 2 * from || 2 * to == from,
                };
                assert!(neighbouring, "{k:?}: {from} -> {to}");
                seen.insert(k);
                // Walk on, back to the start every few moves so that the walk stays
                // where every coordinate can move.
                s = if i % 5 == 4 { start.clone() } else { m };
            }
            // Neither task has row spans (64 channels; a matmul), nor persistent grids.
            assert_eq!(
                seen.len(),
                MmaCoordinate::ALL.len() - 2,
                "{}: {seen:?}",
                task.key()
            );
        }
    }

    /// A stem's state turns row spans on with their copy widths and the least k-steps
    /// that hold a 7-tap filter row, and off again to one-element copies.
    #[test]
    fn row_spans_toggle_with_their_copy_widths() {
        use schedule::{DType, Layout};
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("conv2d", "1,3,224,224,64,7,7,2,3").unwrap(),
            Default::default(),
        )
        .unwrap()
        .with_types(DType::Fp16, DType::Fp16, Layout::Nhwc)
        .unwrap();
        let c = task.contraction();
        let plain = State::tensor_core(
            MmaTiling {
                block_m: 64,
                block_n: 64,
                warps_m: 4,
                warps_n: 2,
                k_steps: 2,
                stages: 3,
                vector: [1, 1],
                swizzle: true,
                row_span: false,
                persistent: 0,
                stream_k: 0,
            },
            1,
        );
        assert!(validate(&c, &plain, &gpu).is_ok());
        let spans: Vec<State> = mma_sync::steps(&c, &plain, &gpu)
            .into_iter()
            .filter(|s| s.mma().is_some_and(|t| t.row_span))
            .collect();
        assert_eq!(spans.len(), 1);
        let t = spans[0].mma().unwrap();
        assert_eq!((t.vector, t.k_steps), ([8, 1], 2));
        let back: Vec<State> = mma_sync::steps(&c, &spans[0], &gpu)
            .into_iter()
            .filter(|s| s.mma().is_some_and(|t| !t.row_span))
            .collect();
        assert_eq!(back, vec![plain]);
    }

    #[test]
    fn tensor_core_steps_are_every_valid_single_move() {
        let gpu = GpuSpec::h100();
        for (task, s) in tensor_core_cases() {
            let c = task.contraction();
            let steps = mma_sync::steps(&c, &s, &gpu);
            // 11 coordinates, two directions each but the swizzle's and the split
            // sums' one.
            assert!(steps.len() >= 12 && steps.len() <= 20, "{}", steps.len());
            for n in &steps {
                assert_eq!(changed(&s, n).len(), 1);
                assert!(validate(&c, n, &gpu).is_ok());
            }
            // A CUDA-core state has none.
            let f32_task = Task::new(
                parse_shape("matmul", "512,512,512").unwrap(),
                Default::default(),
            )
            .unwrap();
            let cuda = Sampler::new(&f32_task, &gpu, 1).sample().unwrap();
            assert!(mma_sync::steps(&f32_task.contraction(), &cuda, &gpu).is_empty());
        }
    }

    #[test]
    fn relu_tasks_never_split_and_tile_changes_refit_the_split() {
        let gpu = GpuSpec::h100();
        let relu = schedule::Epilogue {
            bias: true,
            relu: true,
        };
        let task = Task::new(parse_shape("matmul", "64,64,1024").unwrap(), relu).unwrap();
        let c = task.contraction();
        let mut sampler = Sampler::new(&task, &gpu, 1);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let s = sampler.sample().unwrap();
            if let Some(m) = mutate(&s, &c, &gpu, &mut rng) {
                assert_eq!(m.split_k, 1);
            }
        }
        // 64 stages split 64 ways; a stage 4x as long leaves 16 stages: split 16.
        let plain = Task::new(
            parse_shape("matmul", "64,64,1024").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = plain.contraction();
        let mut s = sampler.sample().unwrap();
        s.reduction[0] = schedule::state::ReductionSplit {
            middle: 4,
            inner: 4,
        };
        s.split_k = 64;
        fit_split_k(&c, &mut s);
        assert_eq!(s.split_k, 64);
        s.reduction[0].middle = 16;
        fit_split_k(&c, &mut s);
        assert_eq!(s.split_k, 16);
    }

    #[test]
    fn mutating_tensor_core_states_never_panics() {
        use schedule::{DType, Layout, Sampler};
        let gpu = GpuSpec::h100();
        for (op, shape) in [
            ("conv2d", "1,512,7,7,512,3,3,1,1"),
            ("matmul", "333,777,555"),
        ] {
            let task = schedule::Task::new(
                schedule::parse_shape(op, shape).unwrap(),
                Default::default(),
            )
            .unwrap()
            .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
            .unwrap();
            let c = task.contraction();
            let states = Sampler::new(&task, &gpu, 1).sample_distinct(20);
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            for s in &states {
                for _ in 0..50 {
                    if let Some(m) = mutate(s, &c, &gpu, &mut rng) {
                        assert_eq!(validate(&c, &m, &gpu), Ok(()));
                    }
                }
            }
        }
    }
}
