//! The CPU interpreter of lowered kernels equals the naive definition, for many random
//! states of small shapes of every operator: non-divisible extents, stride 2, padding,
//! dilation, asymmetric kernels and the fused epilogue included. Small tasks have small
//! grids, so the sampler splits their reductions often (split-K); every sampled state is
//! also checked with splits that do not divide its stage count and with one block per
//! stage, where the task allows them. The sampler draws shared-memory layouts too; a
//! focused test runs sampled states under every layout each input admits (each
//! spatial dimension innermost or the tensor's order, each row padding), with tails,
//! vectorized fetches scattered into transposed tiles, and conv2d stride and padding.
//!
//! Register prefetch is a pass over the nest, so the interpreter runs it as compiled:
//! sampled states of every operator run with prefetch forced on (split-K too), and
//! mutation tests show that the interpreter would catch a broken nest — dropping any
//! one barrier of a kernel, prefetching or not, or the predicates of a padded
//! convolution's fetches, makes it fail or compute a wrong output.

use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::interp::{self, Inputs};
use schedule::ir::{Kernel, Stmt};
use schedule::sketch::cuda_core::innermost_choices;
use schedule::state::{ReductionSplit, SHARED_PADS, SharedLayout, SketchTiling, SpatialSplit};
use schedule::task::Conv2d;
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
        pad_bottom: None,
        pad_right: None,
        groups: 1,
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

/// The direct definition of a grouped convolution with end pads, NCHW or NHWC, written
/// from the operator's meaning rather than from its contraction: it checks the
/// contraction itself, which `interp::reference` merely evaluates.
fn naive_conv(task: &Task, data: &[f32], weight: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let Operator::Conv2d(c) = task.op else {
        unreachable!()
    };
    let nhwc = task.layout == schedule::task::Layout::Nhwc;
    let (p, q) = c.output_size().unwrap();
    let (cg, kg) = c.group_channels();
    let (n_, c_, h_, w_, k_) = (c.n as i64, c.c as i64, c.h as i64, c.w as i64, c.k as i64);
    let (r_, s_, cg_, p_, q_) = (c.r as i64, c.s as i64, cg as i64, p as i64, q as i64);
    let mut out = vec![0f32; (n_ * k_ * p_ * q_) as usize];
    for n in 0..n_ {
        for k in 0..k_ {
            let g = k / kg as i64;
            for y in 0..p_ {
                for x in 0..q_ {
                    let mut acc = 0f32;
                    for ci in 0..cg_ {
                        let ch = g * cg_ + ci;
                        for r in 0..r_ {
                            for s in 0..s_ {
                                let h = y * c.stride_h as i64 + r * c.dilation_h as i64
                                    - c.pad_h as i64;
                                let w = x * c.stride_w as i64 + s * c.dilation_w as i64
                                    - c.pad_w as i64;
                                if h < 0 || h >= h_ || w < 0 || w >= w_ {
                                    continue;
                                }
                                let (di, wi) = if nhwc {
                                    (
                                        ((n * h_ + h) * w_ + w) * c_ + ch,
                                        ((k * r_ + r) * s_ + s) * cg_ + ci,
                                    )
                                } else {
                                    (
                                        ((n * c_ + ch) * h_ + h) * w_ + w,
                                        ((k * cg_ + ci) * r_ + r) * s_ + s,
                                    )
                                };
                                acc += data[di as usize] * weight[wi as usize];
                            }
                        }
                    }
                    if let Some(b) = bias {
                        acc += b[k as usize];
                    }
                    if task.epilogue.relu {
                        acc = acc.max(0.0);
                    }
                    let o = if nhwc {
                        ((n * p_ + y) * q_ + x) * k_ + k
                    } else {
                        ((n * k_ + k) * p_ + y) * q_ + x
                    };
                    out[o as usize] = acc;
                }
            }
        }
    }
    out
}

/// Grouped, depthwise (with and without a channel multiplier) and end-padded shapes:
/// their contraction equals the direct definition, in both layouts, and sampled states
/// of each interpret exactly.
#[test]
fn grouped_depthwise_and_end_padded_convolutions() {
    let shapes = [
        "n=2,c=8,h=7,w=6,k=12,r=3,s=3,pad=1,groups=4",
        "c=16,h=9,w=9,k=16,r=3,s=3,stride=2,pad=1,groups=16",
        "c=4,h=6,w=7,k=8,r=3,s=3,pad=1,groups=4",
        "c=6,h=8,w=8,k=6,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,groups=3",
        "c=5,h=6,w=6,k=4,r=2,s=3,pad_h=0,pad_w=1,pad_bottom=1,pad_right=0",
    ];
    for (i, spec) in shapes.iter().enumerate() {
        for (layout, epilogue) in [
            (schedule::task::Layout::Nchw, NONE),
            (schedule::task::Layout::Nhwc, BOTH),
        ] {
            let op = schedule::parse_shape("conv2d", spec).unwrap();
            let task = Task::new(op, epilogue)
                .unwrap()
                .with_types(
                    schedule::task::DType::F32,
                    schedule::task::DType::F32,
                    layout,
                )
                .unwrap();
            let c = task.contraction();
            let (a, b, bias) = data(&task, i as u64);
            let inputs = Inputs {
                inputs: [&a, &b],
                bias: bias.as_deref(),
            };
            assert_eq!(
                interp::reference(&c, &inputs),
                naive_conv(&task, &a, &b, bias.as_deref()),
                "{task}"
            );
            check_task(&task, 12, 50 + i as u64);
        }
    }
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
            split_sums: Default::default(),
            tiling: SketchTiling::CudaCore,
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

/// Rebuilds a nest bottom-up: `f` gets every statement (its bodies already rebuilt) and
/// returns what replaces it, or None to remove it.
fn rewrite(stmts: &[Stmt], f: &mut dyn FnMut(Stmt) -> Option<Stmt>) -> Vec<Stmt> {
    let mut out = Vec::new();
    for stmt in stmts {
        let stmt = match stmt.clone() {
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } => Stmt::For {
                var,
                extent,
                unroll,
                body: rewrite(&body, f),
            },
            Stmt::If { conds, body } => Stmt::If {
                conds,
                body: rewrite(&body, f),
            },
            Stmt::Block { body } => Stmt::Block {
                body: rewrite(&body, f),
            },
            other => other,
        };
        out.extend(f(stmt));
    }
    out
}

/// How many statements of the nest satisfy `is`, wherever they are nested.
fn count(kernel: &Kernel, is: &dyn Fn(&Stmt) -> bool) -> usize {
    let mut n = 0;
    rewrite(&kernel.body, &mut |s| {
        n += usize::from(is(&s));
        Some(s)
    });
    n
}

fn barriers(kernel: &Kernel) -> usize {
    count(kernel, &|s| matches!(s, Stmt::Sync))
}

/// Whether the kernel runs register prefetch (the pass declared register arrays).
fn prefetches(kernel: &Kernel) -> bool {
    count(kernel, &|s| matches!(s, Stmt::Registers { .. })) > 0
        && count(kernel, &|s| matches!(s, Stmt::Fetch { .. })) == 0
}

/// The kernel without its `k`-th barrier (in source order).
fn without_barrier(kernel: &Kernel, k: usize) -> Kernel {
    let mut seen = 0;
    let body = rewrite(&kernel.body, &mut |s| {
        if matches!(s, Stmt::Sync) {
            seen += 1;
            if seen == k + 1 {
                return None;
            }
        }
        Some(s)
    });
    assert_eq!(seen, barriers(kernel));
    Kernel {
        body,
        ..kernel.clone()
    }
}

/// The kernel with no validity condition on any global read (fetch or register
/// load), and how many conditions that removed.
fn without_predicates(kernel: &Kernel) -> (Kernel, usize) {
    let mut removed = 0;
    let body = rewrite(&kernel.body, &mut |mut s| {
        if let Stmt::Fetch { read, .. } | Stmt::RegisterLoad { read, .. } = &mut s {
            removed += read.valid.len();
            read.valid.clear();
        }
        Some(s)
    });
    let kernel = Kernel {
        body,
        ..kernel.clone()
    };
    (kernel, removed)
}

/// Inputs and reference output of `task` for `seed`.
struct Case {
    task: Task,
    a: Vec<f32>,
    b: Vec<f32>,
    bias: Option<Vec<f32>>,
    expected: Vec<f32>,
}

impl Case {
    fn new(task: Task, seed: u64) -> Self {
        let (a, b, bias) = data(&task, seed);
        let inputs = Inputs {
            inputs: [&a, &b],
            bias: bias.as_deref(),
        };
        let expected = interp::reference(&task.contraction(), &inputs);
        Case {
            task,
            a,
            b,
            bias,
            expected,
        }
    }

    fn inputs(&self) -> Inputs<'_> {
        Inputs {
            inputs: [&self.a, &self.b],
            bias: self.bias.as_deref(),
        }
    }

    /// Whether the kernel fails in the interpreter or computes a wrong output.
    fn broken(&self, kernel: &Kernel) -> bool {
        interp::run(kernel, &self.inputs(), self.expected.len())
            .map_or(true, |out| out != self.expected)
    }
}

/// Sampled states of `task` with register prefetch forced on wherever validation
/// accepts it — as drawn, with every fetch loop unrolled (what prefetch needs), and
/// each of those split 2, 3 and one block per stage — run exactly against the
/// reference. Returns how many prefetching kernels ran, and how many split-K ones.
fn check_prefetch(task: &Task, states: usize, seed: u64) -> (usize, usize) {
    let gpu = GpuSpec::h100();
    let c = task.contraction();
    let case = Case::new(*task, seed);
    let mut variants: Vec<State> = Vec::new();
    for state in Sampler::new(task, &gpu, seed).sample_distinct(states) {
        let stages = state.stages(&c).min(64) as u32;
        for unroll_max_step in [state.unroll_max_step, 1024] {
            for split_k in [state.split_k, 1, 2, 3, stages] {
                let s = State {
                    prefetch: true,
                    tiling: SketchTiling::CudaCore,
                    unroll_max_step,
                    split_k,
                    ..state.clone()
                };
                if !variants.contains(&s) && validate(&c, &s, &gpu).is_ok() {
                    variants.push(s);
                }
            }
        }
    }
    for state in &variants {
        let kernel = lower(task, state);
        assert!(
            prefetches(&kernel),
            "{task} {}: not prefetched",
            state.to_json()
        );
    }
    check_states(task, &case.inputs(), &case.expected, &variants);
    let split = variants.iter().filter(|s| s.split_k > 1).count();
    (variants.len(), split)
}

/// Register prefetch computes exactly the definition on every operator: conv2d padded,
/// strided, dilated, asymmetric and with epilogues, matmul with tails in every axis,
/// batch matmul; split-K (short and empty chunks included) with it.
#[test]
fn prefetch_is_exact_on_every_operator() {
    let bias = Epilogue {
        bias: true,
        relu: false,
    };
    let mm = |m, n, k, e| Task::new(Operator::Matmul { m, n, k }, e).unwrap();
    let bmm = |b, m, n, k, e| Task::new(Operator::BatchMatmul { b, m, n, k }, e).unwrap();
    let operators = [
        (
            "conv2d",
            12,
            vec![
                conv(1, 8, (6, 6), 8, (3, 3), (1, 1), (1, 1), (1, 1), NONE),
                conv(1, 5, (11, 9), 6, (3, 3), (2, 2), (1, 1), (1, 1), bias),
                conv(2, 3, (9, 10), 5, (3, 2), (2, 1), (1, 0), (1, 2), BOTH),
                conv(1, 12, (7, 6), 10, (3, 3), (1, 1), (2, 2), (2, 2), bias),
                conv(1, 3, (14, 14), 4, (7, 7), (2, 2), (3, 3), (1, 1), bias),
            ],
        ),
        (
            "matmul",
            30,
            vec![
                mm(13, 19, 7, NONE),
                mm(21, 30, 45, bias),
                mm(32, 24, 16, BOTH),
            ],
        ),
        (
            "batch_matmul",
            40,
            vec![bmm(3, 9, 16, 12, BOTH), bmm(2, 12, 9, 40, bias)],
        ),
    ];
    for (name, states, tasks) in operators {
        let (mut kernels, mut split) = (0, 0);
        for (i, task) in tasks.iter().enumerate() {
            let (k, s) = check_prefetch(task, states, 60 + i as u64);
            kernels += k;
            split += s;
        }
        eprintln!("{name}: {kernels} prefetching kernels, {split} split-K");
        assert!(
            kernels >= 100,
            "{name}: only {kernels} prefetching kernels ran"
        );
        assert!(
            split >= 40,
            "{name}: only {split} prefetching split-K kernels ran"
        );
    }
}

/// Prefetching or not, split or not: every barrier of the stage loop is needed, and the
/// interpreter sees it. Returns how many (kernel, barrier) pairs were checked.
fn check_every_barrier_matters(case: &Case, states: &[State]) -> usize {
    let c = case.task.contraction();
    let mut checked = 0;
    for state in states {
        assert_eq!(validate(&c, state, &GpuSpec::h100()), Ok(()));
        // With one stage per block the last barrier has nothing to order.
        assert!(state.stages_per_block(&c) >= 2 && state.threads() >= 32);
        let kernel = lower(&case.task, state);
        assert_eq!(prefetches(&kernel), state.prefetch);
        assert!(!case.broken(&kernel), "{}: intact kernel", state.to_json());
        let n = barriers(&kernel);
        assert!(n >= 2);
        for k in 0..n {
            assert!(
                case.broken(&without_barrier(&kernel, k)),
                "{} {}: dropping barrier {k} of {n} went unnoticed",
                case.task,
                state.to_json()
            );
            checked += 1;
        }
    }
    checked
}

/// States of `task` (seeded) with at least two stages per block and a warp of
/// threads, each with and without prefetch and with a split of 3 when valid.
fn mutation_states(task: &Task, states: usize, seed: u64) -> Vec<State> {
    let gpu = GpuSpec::h100();
    let c = task.contraction();
    let mut out: Vec<State> = Vec::new();
    for state in Sampler::new(task, &gpu, seed).sample_distinct(states) {
        for (prefetch, split_k) in [(true, 1), (false, 1), (true, 3), (false, 3)] {
            let s = State {
                prefetch,
                split_k,
                unroll_max_step: 1024,
                ..state.clone()
            };
            if validate(&c, &s, &gpu).is_ok()
                && s.stages_per_block(&c) >= 2
                && s.threads() >= 32
                && !out.contains(&s)
            {
                out.push(s);
            }
        }
    }
    out
}

/// Dropping any one barrier of a prefetching kernel (the one that publishes the stored
/// registers, or the one that ends the inner product before the next stores) makes it
/// fail: shared data read before it is stored, or overwritten while others read it.
#[test]
fn every_barrier_of_a_prefetching_kernel_matters() {
    let bias = Epilogue {
        bias: true,
        relu: false,
    };
    let mut checked = 0;
    for (i, task) in [
        conv(1, 8, (6, 6), 8, (3, 3), (1, 1), (1, 1), (1, 1), bias),
        Task::new(
            Operator::Matmul {
                m: 21,
                n: 30,
                k: 45,
            },
            bias,
        )
        .unwrap(),
        Task::new(
            Operator::BatchMatmul {
                b: 2,
                m: 12,
                n: 9,
                k: 40,
            },
            NONE,
        )
        .unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case::new(task, 80 + i as u64);
        let states: Vec<State> = mutation_states(&case.task, 8, 80 + i as u64)
            .into_iter()
            .filter(|s| s.prefetch)
            .collect();
        assert!(states.len() >= 3, "{}: {} states", case.task, states.len());
        assert!(states.iter().any(|s| s.split_k > 1));
        checked += check_every_barrier_matters(&case, &states);
    }
    eprintln!("{checked} barrier removals caught");
    assert!(checked >= 18, "{checked} barriers");
}

/// The same for kernels without prefetch: the fetch's barrier and the stage's last one.
#[test]
fn every_barrier_of_a_plain_kernel_matters() {
    let mut checked = 0;
    for (i, task) in [
        conv(1, 5, (11, 9), 6, (3, 3), (2, 2), (1, 1), (1, 1), NONE),
        Task::new(
            Operator::Matmul {
                m: 13,
                n: 40,
                k: 29,
            },
            NONE,
        )
        .unwrap(),
        Task::new(
            Operator::BatchMatmul {
                b: 3,
                m: 9,
                n: 16,
                k: 24,
            },
            NONE,
        )
        .unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case::new(task, 90 + i as u64);
        let states: Vec<State> = mutation_states(&case.task, 8, 90 + i as u64)
            .into_iter()
            .filter(|s| !s.prefetch)
            .collect();
        assert!(states.len() >= 3, "{}: {} states", case.task, states.len());
        assert!(states.iter().any(|s| s.split_k > 1));
        checked += check_every_barrier_matters(&case, &states);
    }
    eprintln!("{checked} barrier removals caught");
    assert!(checked >= 18, "{checked} barriers");
}

/// The interpreter tracks what the prefetch registers hold: without the loads of stage
/// 0 before the loop (the first top-level block), the first stores read registers that
/// nothing loaded.
#[test]
fn prefetch_registers_must_be_loaded_before_they_are_stored() {
    let case = Case::new(
        Task::new(
            Operator::Matmul {
                m: 21,
                n: 30,
                k: 45,
            },
            NONE,
        )
        .unwrap(),
        110,
    );
    let states: Vec<State> = mutation_states(&case.task, 6, 110)
        .into_iter()
        .filter(|s| s.prefetch)
        .collect();
    assert!(states.len() >= 3);
    for state in &states {
        let kernel = lower(&case.task, state);
        let at = kernel
            .body
            .iter()
            .position(|s| matches!(s, Stmt::Block { .. }));
        let mut body = kernel.body.clone();
        body.remove(at.expect("stage 0's loads"));
        let unloaded = Kernel { body, ..kernel };
        let got = interp::run(&unloaded, &case.inputs(), case.expected.len());
        assert!(
            matches!(got, Err(interp::InterpError::UnsetRegister { .. })),
            "{}: {:?}",
            state.to_json(),
            got.map(|_| "an output")
        );
    }
}

/// A padded convolution's fetches (plain and prefetching) need their predicates:
/// without them the kernel reads outside the data tensor, or reads neighbouring pixels
/// where the padding's zeros belong.
#[test]
fn padded_convolution_needs_its_fetch_predicates() {
    let case = Case::new(
        conv(1, 8, (6, 6), 8, (3, 3), (1, 1), (1, 1), (1, 1), NONE),
        100,
    );
    let states = mutation_states(&case.task, 6, 100);
    let prefetching = states.iter().filter(|s| s.prefetch).count();
    assert!(prefetching >= 3 && states.len() - prefetching >= 3);
    for state in &states {
        let kernel = lower(&case.task, state);
        assert!(!case.broken(&kernel));
        let (unpredicated, removed) = without_predicates(&kernel);
        assert!(removed > 0, "{}: no fetch predicates", state.to_json());
        assert!(
            case.broken(&unpredicated),
            "{}: fetching without predicates went unnoticed",
            state.to_json()
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
            dilation_h: dh, dilation_w: dw, pad_bottom: None, pad_right: None, groups: 1,
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
