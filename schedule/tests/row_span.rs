//! Row-span staging (`MmaTiling::row_span`) on the CPU interpreter: few-channel
//! channels-last convolutions whose activations are staged as raw input-row runs and
//! whose weights are held for the whole reduction equal the definition — C = 2 to 4,
//! stride 1 and 2, padding that needs a zero column and padding that does not, none,
//! asymmetric end padding, a dilated filter height, output rows that are not whole
//! 16-pixel groups, a last block past the last pixel, N tails, split-K (ordered and
//! atomic, into a half output with a bias and ReLU), every pipeline depth, fp16 and bf16.
//! Mutation tests show that a shifted or odd skew, weights read one tap off and a
//! missing run copy are caught, and validation refuses what row spans cannot read.

mod support;

use schedule::atom::{OperandLayout, SpanLayout};
use schedule::ir::{Expr, Kernel, Stmt};
use schedule::sketch::mma_sync::MmaTiling;
use schedule::state::SplitSums;
use schedule::task::Conv2d;
use schedule::{
    DType, Epilogue, GpuSpec, InvalidState, Layout, Operator, Sampler, State, Task, lower::lower,
    validate,
};
use support::wgmma::{edit_all, run};

const BIAS_RELU: Epilogue = Epilogue {
    bias: true,
    relu: true,
};

fn conv(spec: [u32; 9], dtype: DType, out: DType, epilogue: Epilogue) -> Task {
    let [n, c, h, w, k, r, s, stride, pad] = spec;
    conv_with(
        Conv2d::new(n, c, h, w, k, r, s, stride, pad),
        dtype,
        out,
        epilogue,
    )
}

fn conv_with(conv: Conv2d, dtype: DType, out: DType, epilogue: Epilogue) -> Task {
    Task::new(Operator::Conv2d(conv), epilogue)
        .unwrap()
        .with_types(dtype, out, Layout::Nhwc)
        .unwrap()
}

/// A row-span tiling: `block_m` pixels over `warps` warps along M, `block_n` channels
/// over two warps where they divide, the least k-steps that hold a filter row.
fn tiling(task: &Task, block_m: u32, block_n: u32, stages: u32) -> MmaTiling {
    let c = task.contraction();
    let span = schedule::row_span::RowSpan::of(&c).unwrap();
    let warps_m = (block_m / 16).min(4);
    let warps_n = if block_n.is_multiple_of(16) { 2 } else { 1 };
    MmaTiling {
        block_m,
        block_n,
        warps_m,
        warps_n,
        k_steps: MmaTiling::span_k_steps(&span, c.dtype),
        stages,
        vector: [8, 1],
        swizzle: true,
        row_span: true,
        persistent: 0,
        stream_k: 0,
    }
}

fn check(task: &Task, state: &State) {
    let gpu = GpuSpec::h100();
    validate(&task.contraction(), state, &gpu)
        .unwrap_or_else(|e| panic!("{task} {}: {e}", state.to_json()));
    let kernel = lower(task, state);
    if let Err(e) = run(task, &kernel) {
        panic!("{task} {}: {e}", state.to_json());
    }
}

#[test]
fn row_spans_equal_the_definition() {
    let plain = Epilogue::default();
    let f16 = DType::Fp16;
    // (task, block_m, block_n)
    let cases = [
        // A stem: C = 3, stride 2, pad 3 (one zero column), 8-pixel rows padded to 16,
        // two images.
        (
            conv([2, 3, 20, 16, 16, 7, 7, 2, 3], f16, DType::F32, plain),
            32,
            16,
        ),
        // C = 4 at stride 1 (no zero column), a tail of N.
        (
            conv([1, 4, 9, 10, 24, 3, 3, 1, 1], f16, DType::F32, BIAS_RELU),
            16,
            16,
        ),
        // C = 2, a 5×5 filter, pad 2; bf16 into a bf16 output.
        (
            conv(
                [1, 2, 8, 12, 8, 5, 5, 1, 2],
                DType::Bf16,
                DType::Bf16,
                BIAS_RELU,
            ),
            64,
            8,
        ),
        // C = 2, stride 2, pad 1, rows of exactly one group.
        (conv([1, 2, 31, 32, 8, 3, 3, 2, 1], f16, f16, plain), 32, 8),
        // No padding.
        (
            conv([1, 3, 12, 16, 16, 3, 3, 2, 0], f16, DType::F32, plain),
            16,
            16,
        ),
    ];
    for (task, block_m, block_n) in &cases {
        for stages in 1..=4 {
            let s = State::tensor_core(tiling(task, *block_m, *block_n, stages), 1);
            check(task, &s);
        }
    }
    // Dilated filter height, asymmetric end padding.
    let mut odd = Conv2d::new(1, 3, 11, 16, 8, 3, 5, 2, 2);
    odd.dilation_h = 2;
    odd.pad_bottom = Some(3);
    odd.pad_right = Some(0);
    let task = conv_with(odd, f16, DType::F32, BIAS_RELU);
    check(&task, &State::tensor_core(tiling(&task, 32, 8, 3), 1));
}

#[test]
fn row_spans_split_the_filter_rows() {
    let task = conv(
        [1, 3, 20, 16, 16, 7, 7, 2, 3],
        DType::Fp16,
        DType::Fp16,
        BIAS_RELU,
    );
    for split in [2, 3, 4, 7] {
        for sums in [SplitSums::Ordered, SplitSums::Atomic] {
            for stages in [1, 2, 3] {
                let mut s = State::tensor_core(tiling(&task, 32, 16, stages), split);
                s.split_sums = sums;
                check(&task, &s);
            }
        }
    }
}

/// The sampler draws row spans for a stem (half its tensor-core draws), and every one
/// it draws is exact.
#[test]
fn sampled_row_spans_are_exact() {
    let gpu = GpuSpec::h100();
    let task = conv(
        [2, 3, 20, 16, 16, 7, 7, 2, 3],
        DType::Fp16,
        DType::Fp16,
        Epilogue::default(),
    );
    let spans: Vec<State> = Sampler::new(&task, &gpu, 9)
        .sample_distinct(40)
        .into_iter()
        .filter(|s| s.mma().is_some_and(|t| t.row_span))
        .collect();
    assert!(spans.len() >= 4, "only {} row-span states", spans.len());
    for s in spans.iter().take(8) {
        check(&task, s);
    }
}

/// `kernel` with every row-span fragment layout changed by `f`.
fn respan(kernel: &Kernel, f: impl Fn(SpanLayout) -> SpanLayout) -> Kernel {
    let mut k = kernel.clone();
    edit_all(&mut k.body, &|s| match s {
        Stmt::LoadFragment {
            layout: OperandLayout::Span(span),
            ..
        } => {
            *span = f(*span);
            true
        }
        _ => false,
    });
    k
}

#[test]
fn broken_row_spans_are_caught() {
    let task = conv(
        [1, 3, 20, 16, 16, 7, 7, 2, 3],
        DType::Fp16,
        DType::F32,
        Epilogue::default(),
    );
    let s = State::tensor_core(tiling(&task, 32, 16, 2), 1);
    let kernel = lower(&task, &s);
    run(&task, &kernel).unwrap();
    // Windows read one pixel's channel pair off.
    let shifted = respan(&kernel, |l| SpanLayout {
        skew: l.skew + 2,
        ..l
    });
    assert!(run(&task, &shifted).is_err(), "a shifted skew passed");
    // An odd skew: a register's 32-bit load would be misaligned.
    let odd = respan(&kernel, |l| SpanLayout {
        skew: l.skew + 1,
        ..l
    });
    let e = run(&task, &odd).unwrap_err();
    assert!(e.contains("odd element"), "{e}");
    // Weights held one tap off (the zero column forgotten).
    let mut off = kernel.clone();
    let edited = edit_all(&mut off.body, &|s| match s {
        Stmt::AsyncCopy { read, .. } if read.input == 1 => {
            read.at = Expr::Add(Box::new(read.at.clone()), Box::new(Expr::Const(1)));
            true
        }
        _ => false,
    });
    assert_eq!(edited, 1);
    assert!(run(&task, &off).is_err(), "weights a tap off passed");
    // A run's copies dropped.
    let mut dropped = kernel.clone();
    edit_all(&mut dropped.body, &|s| match s {
        Stmt::AsyncCopy { read, .. } if read.input == 0 => {
            *s = Stmt::Block { body: Vec::new() };
            true
        }
        _ => false,
    });
    assert!(run(&task, &dropped).is_err(), "missing run copies passed");
}

#[test]
fn validation_refuses_what_row_spans_cannot_read() {
    let gpu = GpuSpec::h100();
    let f16 = DType::Fp16;
    let plain = Epilogue::default();
    let refused = |task: &Task, t: MmaTiling| {
        validate(&task.contraction(), &State::tensor_core(t, 1), &gpu).unwrap_err()
    };
    let stem = conv([1, 3, 20, 16, 16, 7, 7, 2, 3], f16, f16, plain);
    let good = tiling(&stem, 32, 16, 2);
    // Vector widths other than [8, 1], and a K tile shorter than a filter row.
    assert!(matches!(
        refused(
            &stem,
            MmaTiling {
                vector: [8, 8],
                ..good
            }
        ),
        InvalidState::RowSpanVectors { .. }
    ));
    assert!(matches!(
        refused(&stem, MmaTiling { k_steps: 1, ..good }),
        InvalidState::RowSpanColumns { .. }
    ));
    // C = 3 at stride 1: windows an odd number of elements apart.
    let odd = conv([1, 3, 20, 16, 16, 3, 3, 1, 1], f16, f16, plain);
    assert!(matches!(
        refused(&odd, MmaTiling { k_steps: 1, ..good }),
        InvalidState::RowSpan(_)
    ));
    // Rows of 3 × 10 elements: not whole 16-byte copies.
    let ragged = conv([1, 3, 20, 10, 16, 3, 3, 2, 1], f16, f16, plain);
    assert!(matches!(
        refused(&ragged, MmaTiling { k_steps: 1, ..good }),
        InvalidState::RowSpan(_)
    ));
    // NCHW, TF32, groups and a dilated filter width.
    let nchw = Task::new(
        Operator::Conv2d(Conv2d::new(1, 4, 8, 8, 16, 3, 3, 1, 1)),
        plain,
    )
    .unwrap()
    .with_types(f16, f16, Layout::Nchw)
    .unwrap();
    assert!(validate(&nchw.contraction(), &State::tensor_core(good, 1), &gpu).is_err());
    let tf32 = conv([1, 4, 8, 8, 16, 3, 3, 1, 1], DType::Tf32, DType::F32, plain);
    assert!(matches!(refused(&tf32, good), InvalidState::RowSpan(_)));
    let mut grouped = Conv2d::new(1, 4, 8, 8, 16, 3, 3, 1, 1);
    grouped.groups = 2;
    let grouped = conv_with(grouped, f16, f16, plain);
    assert!(validate(&grouped.contraction(), &State::tensor_core(good, 1), &gpu).is_err());
    let mut dilated = Conv2d::new(1, 4, 8, 8, 16, 3, 3, 1, 2);
    dilated.dilation_w = 2;
    let dilated = conv_with(dilated, f16, f16, plain);
    assert!(matches!(
        refused(&dilated, MmaTiling { k_steps: 1, ..good }),
        InvalidState::RowSpan(_)
    ));
}

/// The printed kernel of a stem's row-span state: 16-byte run copies per filter row,
/// the held weights' element loop, 32-bit fragment loads, padded pixels unstored.
#[test]
fn generated_row_span_kernel_is_stable() {
    let gpu = GpuSpec::h100();
    let task = conv(
        [1, 3, 224, 224, 64, 7, 7, 2, 3],
        DType::Fp16,
        DType::Fp16,
        Epilogue::default(),
    );
    let t = MmaTiling {
        block_m: 128,
        block_n: 64,
        warps_m: 4,
        warps_n: 2,
        k_steps: 2,
        stages: 3,
        vector: [8, 1],
        swizzle: true,
        row_span: true,
        persistent: 0,
        stream_k: 0,
    };
    let k = schedule::generate(&task, &State::tensor_core(t, 1), &gpu).unwrap();
    insta::assert_snapshot!("row_span_stem", k.source);
    // Persistent: weights read once, then a loop over M tiles.
    let persistent = MmaTiling {
        persistent: 66,
        ..t
    };
    let k = schedule::generate(&task, &State::tensor_core(persistent, 1), &gpu).unwrap();
    insta::assert_snapshot!("row_span_stem_persistent", k.source);
}

/// Seven warps over three filter rows' weights: the last round of the held weights is
/// short of threads, and those past the end copy nothing (they once wrote past the
/// weights' tiles).
#[test]
fn a_short_last_round_of_held_weights_copies_nothing() {
    let task = conv(
        [1, 4, 56, 56, 32, 3, 3, 1, 1],
        DType::Fp16,
        DType::Fp16,
        BIAS_RELU,
    );
    let t = MmaTiling {
        block_m: 112,
        block_n: 64,
        warps_m: 7,
        warps_n: 1,
        k_steps: 2,
        stages: 3,
        vector: [8, 1],
        swizzle: true,
        row_span: true,
        persistent: 0,
        stream_k: 0,
    };
    check(&task, &State::tensor_core(t, 1));
}

/// Persistent row-span grids: blocks that keep their N tile's weights and work through
/// M tiles in turn (one to all of them per block, two N tiles, a last round short of
/// tiles), exact; and what validation refuses of them.
#[test]
fn persistent_row_spans_equal_the_definition() {
    let gpu = GpuSpec::h100();
    let task = conv(
        [2, 3, 20, 16, 16, 7, 7, 2, 3],
        DType::Fp16,
        DType::Fp16,
        BIAS_RELU,
    );
    // 320 padded pixels: 10 M tiles of 32.
    for (block_n, blocks) in [(16, 1), (16, 3), (16, 4), (16, 10), (8, 2), (8, 6)] {
        for stages in [1, 2, 3] {
            let t = MmaTiling {
                persistent: blocks,
                ..tiling(&task, 32, block_n, stages)
            };
            check(&task, &State::tensor_core(t, 1));
        }
    }
    // Without the barrier after each tile, the next tile's prologue overwrites a stage
    // a slower warp may still read (3 stages: the last filter row's stage is stage 0).
    let t = MmaTiling {
        persistent: 3,
        ..tiling(&task, 32, 16, 3)
    };
    let kernel = lower(&task, &State::tensor_core(t, 1));
    let mut unsynced = kernel.clone();
    let dropped = edit_all(&mut unsynced.body, &|s| match s {
        Stmt::If { body, .. } if body.last() == Some(&Stmt::Sync) => {
            body.pop();
            true
        }
        _ => false,
    });
    assert_eq!(dropped, 1);
    assert!(
        run(&task, &unsynced).is_err(),
        "no barrier between tiles passed"
    );
    let refused = |t: MmaTiling, split| {
        let s = State::tensor_core(t, split);
        matches!(
            validate(&task.contraction(), &s, &gpu),
            Err(InvalidState::MmaPersistent { .. })
        )
    };
    let t = tiling(&task, 32, 8, 2);
    assert!(
        refused(MmaTiling { persistent: 3, ..t }, 1),
        "odd per N tile"
    );
    assert!(
        refused(
            MmaTiling {
                persistent: 22,
                ..t
            },
            1
        ),
        "past the tiles"
    );
    assert!(refused(MmaTiling { persistent: 4, ..t }, 2), "split");
    let plain = conv(
        [1, 16, 8, 8, 16, 3, 3, 1, 1],
        DType::Fp16,
        DType::Fp16,
        Epilogue::default(),
    );
    let s = State::tensor_core(
        MmaTiling {
            block_m: 32,
            block_n: 16,
            warps_m: 2,
            warps_n: 1,
            k_steps: 1,
            stages: 2,
            vector: [8, 8],
            swizzle: true,
            row_span: false,
            persistent: 2,
            stream_k: 0,
        },
        1,
    );
    assert!(matches!(
        validate(&plain.contraction(), &s, &gpu),
        Err(InvalidState::MmaPersistent { .. })
    ));
}
