//! The CPU interpreter of lowered kernels equals the naive definition, for many random
//! states of small shapes of every operator: non-divisible extents, stride 2, padding,
//! dilation, asymmetric kernels and the fused epilogue included. Small tasks have small
//! grids, so the sampler splits their reductions often (split-K); every sampled state is
//! also checked with splits that do not divide its stage count and with one block per
//! stage, where the task allows them. The sampler draws shared-memory layouts too; a
//! focused test runs sampled states under every layout each input admits (each
//! spatial dimension innermost or the tensor's order, each row padding), with tails,
//! vectorized fetches scattered into transposed tiles, and conv2d stride and padding.

use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::interp::{self, Inputs};
use schedule::state::{ReductionSplit, SHARED_PADS, SharedLayout, SpatialSplit};
use schedule::task::Conv2d;
use schedule::tiling::innermost_choices;
use schedule::{Epilogue, GpuSpec, Operator, Sampler, State, Task, lower::lower, validate};

/// Small integers in -3..=3: float32 sums of their products are exact in any order, so
/// the comparison can be exact.
fn small_ints(len: usize, rng: &mut ChaCha8Rng) -> Vec<f32> {
    (0..len)
        .map(|_| (rng.next_u32() % 7) as f32 - 3.0)
        .collect()
}

/// Runs `states` sampled states of `task` through the interpreter, each also with a
/// split of 3 and of its stage count (when valid), and compares each output with the
/// reference, exactly. Returns how many split-K kernels were checked.
fn check_task(task: &Task, states: usize, seed: u64) -> usize {
    let gpu = GpuSpec::h100();
    let c = task.contraction();
    let (a, b, bias) = data(task, seed);
    let inputs = Inputs {
        inputs: [&a, &b],
        bias: bias.as_deref(),
    };
    let expected = interp::reference(&c, &inputs);
    let sampled = Sampler::new(task, &gpu, seed).sample_distinct(states);
    assert!(!sampled.is_empty(), "no valid state for {task}");
    let mut split_kernels = 0;
    let mut variants = Vec::new();
    for state in sampled {
        let stages = state.stages(&c).min(64) as u32;
        for split_k in [3, stages] {
            let forced = State {
                split_k,
                ..state.clone()
            };
            if split_k != state.split_k
                && !variants.contains(&forced)
                && validate(&c, &forced, &gpu).is_ok()
            {
                variants.push(forced);
            }
        }
        variants.push(state);
    }
    for state in &variants {
        split_kernels += usize::from(state.split_k > 1);
    }
    check_states(task, &inputs, &expected, &variants);
    split_kernels
}

/// The task's random inputs (bias included) and the reference output.
fn data(task: &Task, seed: u64) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let c = task.contraction();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let a = small_ints(c.inputs[0].elements() as usize, &mut rng);
    let b = small_ints(c.inputs[1].elements() as usize, &mut rng);
    let bias = c
        .bias
        .as_ref()
        .map(|x| small_ints(x.elements() as usize, &mut rng));
    (a, b, bias)
}

/// Interprets every state's kernel and compares its output with `expected`, exactly.
fn check_states(task: &Task, inputs: &Inputs, expected: &[f32], states: &[State]) {
    for state in states {
        let kernel = lower(task, state);
        let got = interp::run(&kernel, inputs, expected.len())
            .unwrap_or_else(|e| panic!("{task} {}: {e}", state.to_json()));
        if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            panic!(
                "{task} {}: output {i} is {} but should be {}",
                state.to_json(),
                got[i],
                expected[i]
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn conv(
    n: u32,
    c: u32,
    hw: (u32, u32),
    k: u32,
    rs: (u32, u32),
    stride: (u32, u32),
    pad: (u32, u32),
    dilation: (u32, u32),
    epilogue: Epilogue,
) -> Task {
    let op = Operator::Conv2d(Conv2d {
        n,
        c,
        h: hw.0,
        w: hw.1,
        k,
        r: rs.0,
        s: rs.1,
        stride_h: stride.0,
        stride_w: stride.1,
        pad_h: pad.0,
        pad_w: pad.1,
        dilation_h: dilation.0,
        dilation_w: dilation.1,
    });
    Task::new(op, epilogue).unwrap()
}

const BOTH: Epilogue = Epilogue {
    bias: true,
    relu: true,
};
const NONE: Epilogue = Epilogue {
    bias: false,
    relu: false,
};

#[test]
fn conv2d_3x3_padded() {
    check_task(
        &conv(1, 8, (6, 6), 8, (3, 3), (1, 1), (1, 1), (1, 1), NONE),
        40,
        1,
    );
}

#[test]
fn conv2d_stride_two_non_divisible() {
    check_task(
        &conv(1, 5, (11, 9), 6, (3, 3), (2, 2), (1, 1), (1, 1), NONE),
        40,
        2,
    );
}

#[test]
fn conv2d_asymmetric_dilated_batched_with_epilogue() {
    check_task(
        &conv(2, 3, (9, 10), 5, (3, 2), (2, 1), (1, 0), (1, 2), BOTH),
        40,
        3,
    );
}

#[test]
fn conv2d_1x1_strided() {
    check_task(
        &conv(1, 12, (8, 8), 16, (1, 1), (2, 2), (0, 0), (1, 1), BOTH),
        40,
        4,
    );
}

#[test]
fn conv2d_7x7_stem_like() {
    check_task(
        &conv(1, 3, (14, 14), 4, (7, 7), (2, 2), (3, 3), (1, 1), NONE),
        20,
        5,
    );
}

#[test]
fn matmul_non_divisible() {
    let t = Task::new(Operator::Matmul { m: 13, n: 19, k: 7 }, NONE).unwrap();
    check_task(&t, 60, 6);
}

#[test]
fn matmul_with_epilogue() {
    let t = Task::new(
        Operator::Matmul {
            m: 32,
            n: 24,
            k: 16,
        },
        BOTH,
    )
    .unwrap();
    check_task(&t, 60, 7);
}

#[test]
fn batch_matmul() {
    let t = Task::new(
        Operator::BatchMatmul {
            b: 3,
            m: 9,
            n: 16,
            k: 12,
        },
        BOTH,
    )
    .unwrap();
    check_task(&t, 60, 8);
}

/// Split-K kernels ran in the fixed cases (the sampler splits these small grids often).
#[test]
fn sampled_states_include_split_k_ones() {
    let t = conv(1, 64, (4, 4), 8, (3, 3), (1, 1), (1, 1), (1, 1), NONE);
    let gpu = GpuSpec::h100();
    let sampled = Sampler::new(&t, &gpu, 11).sample_distinct(40);
    let split = sampled.iter().filter(|s| s.split_k > 1).count();
    assert!(
        split >= 10,
        "only {split} of 40 sampled states split the reduction"
    );
    assert!(check_task(&t, 12, 11) >= 12);
}

/// 5 stages over 4 blocks: chunks of 2, 2, 1 and an empty one, with a bias that only
/// chunk 0 adds; and one block per stage.
#[test]
fn split_k_with_short_and_empty_chunks() {
    let bias = Epilogue {
        bias: true,
        relu: false,
    };
    let t = Task::new(Operator::Matmul { m: 8, n: 32, k: 40 }, bias).unwrap();
    let c = t.contraction();
    let gpu = GpuSpec::h100();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let a = small_ints(c.inputs[0].elements() as usize, &mut rng);
    let b = small_ints(c.inputs[1].elements() as usize, &mut rng);
    let bias_values = small_ints(c.bias.as_ref().unwrap().elements() as usize, &mut rng);
    let inputs = Inputs {
        inputs: [&a, &b],
        bias: Some(&bias_values),
    };
    let expected = interp::reference(&c, &inputs);
    for split_k in [1, 2, 3, 4, 5] {
        let state = State {
            prefetch: false,
            spatial: vec![
                SpatialSplit {
                    vthread: 1,
                    thread: 4,
                    outer: 1,
                    inner: 2,
                },
                SpatialSplit {
                    vthread: 1,
                    thread: 16,
                    outer: 1,
                    inner: 2,
                },
            ],
            reduction: vec![ReductionSplit {
                middle: 2,
                inner: 4,
            }],
            unroll_max_step: 0,
            vector_width: [1, 1],
            split_k,
            shared_layout: Default::default(),
        };
        assert_eq!(validate(&c, &state, &gpu), Ok(()));
        assert_eq!(state.stages(&c), 5);
        let kernel = lower(&t, &state);
        assert_eq!(kernel.launch.zero_output, split_k > 1);
        let got = interp::run(&kernel, &inputs, expected.len())
            .unwrap_or_else(|e| panic!("split_k {split_k}: {e}"));
        assert_eq!(got, expected, "split_k {split_k}");
    }
}

/// Every layout input `input` of `task` admits: each innermost choice with each pad.
fn layouts(task: &Task, input: usize) -> Vec<SharedLayout> {
    innermost_choices(&task.contraction(), input)
        .into_iter()
        .flat_map(|innermost| SHARED_PADS.map(|pad| SharedLayout { innermost, pad }))
        .collect()
}

/// Sampled states of `task`, each run under every layout of one input with the other
/// input's layout cycling through its own, against the reference. Returns how many
/// kernels ran, and how many of those stored a vector fetch component by component
/// into a tile whose contiguous dimension is not the vector's.
fn check_layouts(task: &Task, states: usize, seed: u64) -> (usize, usize) {
    let gpu = GpuSpec::h100();
    let c = task.contraction();
    let (a, b, bias) = data(task, seed);
    let inputs = Inputs {
        inputs: [&a, &b],
        bias: bias.as_deref(),
    };
    let expected = interp::reference(&c, &inputs);
    let choices = [layouts(task, 0), layouts(task, 1)];
    let mut variants = Vec::new();
    for state in Sampler::new(task, &gpu, seed).sample_distinct(states) {
        for input in 0..2 {
            for (i, &layout) in choices[input].iter().enumerate() {
                let other = &choices[1 - input];
                let mut s = state.clone();
                s.shared_layout[input] = layout;
                s.shared_layout[1 - input] = other[(i * 5 + 1) % other.len()];
                if !variants.contains(&s) && validate(&c, &s, &gpu).is_ok() {
                    variants.push(s);
                }
            }
        }
    }
    let scattered = variants
        .iter()
        .filter(|s| (0..2).any(|i| s.vector_width[i] > 1 && s.shared_layout[i].innermost.is_some()))
        .count();
    check_states(task, &inputs, &expected, &variants);
    (variants.len(), scattered)
}

/// Transposed and padded shared tiles compute exactly the definition: matmul A with `m`
/// contiguous (tails in M and N, vectorized K fetches scattered across rows), batch
/// matmul, conv2d weight with `k` contiguous and data with `h` or `n` contiguous, under
/// stride 2, padding, dilation and split-K.
#[test]
fn every_shared_layout_is_exact() {
    let bias = Epilogue {
        bias: true,
        relu: false,
    };
    let cases = [
        (
            Task::new(
                Operator::Matmul {
                    m: 13,
                    n: 20,
                    k: 16,
                },
                bias,
            )
            .unwrap(),
            6,
        ),
        (
            Task::new(
                Operator::BatchMatmul {
                    b: 2,
                    m: 12,
                    n: 9,
                    k: 8,
                },
                BOTH,
            )
            .unwrap(),
            3,
        ),
        (
            conv(2, 8, (9, 8), 6, (3, 3), (2, 2), (1, 1), (1, 1), NONE),
            3,
        ),
        (
            conv(1, 8, (8, 7), 12, (1, 1), (2, 2), (0, 0), (1, 1), bias),
            4,
        ),
        (
            conv(1, 3, (9, 10), 5, (3, 2), (2, 1), (1, 0), (1, 2), BOTH),
            2,
        ),
    ];
    let (mut kernels, mut scattered) = (0, 0);
    for (i, (task, states)) in cases.iter().enumerate() {
        let (k, s) = check_layouts(task, *states, 40 + i as u64);
        assert!(k >= 4 * states, "{task}: only {k} layout variants ran");
        kernels += k;
        scattered += s;
    }
    eprintln!("{kernels} kernels, {scattered} with scattered vector stores");
    assert!(scattered >= 10, "only {scattered} scattered vector fetches");
}

/// The sampler gives the inputs that can move a dimension every layout kind.
#[test]
fn sampled_states_include_transposed_and_padded_tiles() {
    let gpu = GpuSpec::h100();
    for task in [
        Task::new(
            Operator::Matmul {
                m: 64,
                n: 64,
                k: 64,
            },
            NONE,
        )
        .unwrap(),
        conv(1, 16, (8, 8), 32, (3, 3), (1, 1), (1, 1), (1, 1), NONE),
    ] {
        let states = Sampler::new(&task, &gpu, 3).sample_distinct(80);
        let count = |f: &dyn Fn(&State) -> bool| states.iter().filter(|s| f(s)).count();
        let natural = count(&|s| s.shared_layout.iter().all(SharedLayout::is_natural));
        let moved = |i: usize| count(&|s| s.shared_layout[i].innermost.is_some());
        let padded = count(&|s| s.shared_layout.iter().any(|l| l.pad > 0));
        eprintln!(
            "{task}: natural {natural}, A/data moved {}, B/weight moved {}, padded {padded}",
            moved(0),
            moved(1)
        );
        assert!(natural >= 4, "{task}: {natural} natural of 80");
        assert!(padded >= 20, "{task}: {padded} padded of 80");
        // Matmul's A (m) and conv2d's weight (k) can move a dimension.
        let spatial_input = usize::from(matches!(task.op, Operator::Conv2d(_)));
        assert!(
            moved(spatial_input) >= 20,
            "{task}: {} moved",
            moved(spatial_input)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any small conv2d, any sampled state: the interpreter equals the definition.
    #[test]
    fn any_small_conv2d(
        n in 1u32..3, c in 1u32..6, h in 3u32..10, w in 3u32..10, k in 1u32..7,
        r in 1u32..4, s in 1u32..4, sh in 1u32..3, sw in 1u32..3,
        ph in 0u32..2, pw in 0u32..2, dh in 1u32..3, dw in 1u32..3,
        bias in any::<bool>(), relu in any::<bool>(), seed in any::<u64>(),
    ) {
        let op = Operator::Conv2d(Conv2d {
            n, c, h, w, k, r, s, stride_h: sh, stride_w: sw, pad_h: ph, pad_w: pw,
            dilation_h: dh, dilation_w: dw,
        });
        // Shapes whose output would be empty are rejected when the task is built.
        if let Ok(task) = Task::new(op, Epilogue { bias, relu }) {
            check_task(&task, 3, seed);
        }
    }

    /// Any small matmul or batch matmul, any sampled state.
    #[test]
    fn any_small_matmul(
        b in 0u32..4, m in 1u32..20, n in 1u32..20, k in 1u32..20,
        bias in any::<bool>(), relu in any::<bool>(), seed in any::<u64>(),
    ) {
        let op = if b == 0 {
            Operator::Matmul { m, n, k }
        } else {
            Operator::BatchMatmul { b, m, n, k }
        };
        check_task(&Task::new(op, Epilogue { bias, relu }).unwrap(), 3, seed);
    }
}
