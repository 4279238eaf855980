//! The tensor-core sketch on the CPU interpreter: sampled states of every operator and
//! tensor-core type equal the definition on small shapes — tails of M, N and K, stride
//! 2, padding, channel counts that are not a multiple of 8 (a stem's 3), split-K, every
//! pipeline depth, swizzled and plain tiles, every copy width. The interpreter runs
//! the `cp.async` pipeline as issued (a copy is readable only after its thread waited
//! for its group and a barrier followed) and an MMA by its semantics on the fragments
//! loaded from shared memory; mutation tests show that a missing wait, a missing
//! barrier or a wrong pipeline depth in the wait is caught.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::interp::{self, Inputs};
use schedule::ir::{Kernel, Stmt};
use schedule::sketch::mma_sync::{MAX_STAGES, MmaTiling};
use schedule::{
    DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, lower::lower, parse_shape, validate,
};

fn task(op: &str, shape: &str, dtype: DType, epilogue: Epilogue) -> Task {
    Task::new(parse_shape(op, shape).unwrap(), epilogue)
        .unwrap()
        .with_types(dtype, DType::F32, Layout::Nhwc)
        .unwrap()
}

fn data(task: &Task, seed: u64) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
    let c = task.contraction();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ints =
        |n: u64| -> Vec<f32> { (0..n).map(|_| (rng.next_u32() % 7) as f32 - 3.0).collect() };
    let a = ints(c.inputs[0].elements());
    let b = ints(c.inputs[1].elements());
    let bias = c.bias.as_ref().map(|x| ints(x.elements()));
    (a, b, bias)
}

/// Runs `kernel` and returns the interpreter's error or the index of the first wrong
/// output element.
fn run(task: &Task, kernel: &Kernel) -> Result<(), String> {
    let (a, b, bias) = data(task, 7);
    let inputs = Inputs {
        inputs: [&a, &b],
        bias: bias.as_deref(),
    };
    let expected = interp::reference(&task.contraction(), &inputs);
    let got = interp::run(kernel, &inputs, expected.len()).map_err(|e| e.to_string())?;
    match (0..got.len()).find(|&i| got[i] != expected[i]) {
        Some(i) => Err(format!("output {i} is {} not {}", got[i], expected[i])),
        None => Ok(()),
    }
}

/// Variants of a sampled state: every pipeline depth, swizzle flipped, split-K 1 and
/// 3 (where valid).
fn variants(task: &Task, state: &State) -> Vec<State> {
    let c = task.contraction();
    let gpu = GpuSpec::h100();
    let mma = state.mma().expect("a tensor-core state");
    let mut out = vec![state.clone()];
    for stages in 1..=MAX_STAGES {
        for swizzle in [true, false] {
            for split_k in [1, 3] {
                let s = State::tensor_core(
                    MmaTiling {
                        stages,
                        swizzle,
                        ..mma
                    },
                    split_k,
                );
                if validate(&c, &s, &gpu).is_ok() && !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
    out
}

fn check(task: &Task, samples: usize, seed: u64) -> usize {
    let gpu = GpuSpec::h100();
    let states = Sampler::new(task, &gpu, seed).sample_distinct(samples);
    assert!(!states.is_empty(), "no state for {task}");
    let mut checked = 0;
    for state in states.iter().filter(|s| s.mma().is_some()) {
        for s in variants(task, state).into_iter().take(6) {
            let kernel = lower(task, &s);
            if let Err(e) = run(task, &kernel) {
                panic!("{task} {}: {e}", s.to_json());
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn conv2d_nhwc_padded_strided_and_stem_like() {
    for dtype in [DType::Fp16, DType::Bf16, DType::Tf32] {
        let mut n = 0;
        n += check(
            &task("conv2d", "1,16,6,6,24,3,3,1,1", dtype, Epilogue::default()),
            3,
            1,
        );
        n += check(
            &task("conv2d", "2,8,7,5,16,3,3,2,1", dtype, Epilogue::default()),
            3,
            2,
        );
        n += check(
            &task("conv2d", "1,3,9,9,8,3,3,2,1", dtype, Epilogue::default()),
            3,
            3,
        );
        let both = Epilogue {
            bias: true,
            relu: true,
        };
        n += check(&task("conv2d", "1,24,5,5,40,1,1,1,0", dtype, both), 3, 4);
        assert!(n >= 12, "{dtype}: only {n} kernels checked");
    }
}

/// Grouped convolutions are GEMMs batched over the groups (each group's channels a
/// contiguous run of C/G); depthwise ones have no GEMM view and draw CUDA-core states,
/// half data widened on the fetch.
#[test]
fn grouped_conv2d_batches_over_groups_and_depthwise_falls_back() {
    let both = Epilogue {
        bias: true,
        relu: true,
    };
    for dtype in [DType::Fp16, DType::Bf16, DType::Tf32] {
        let mut n = 0;
        n += check(
            &task(
                "conv2d",
                "c=32,h=6,w=5,k=48,r=3,s=3,pad=1,groups=2",
                dtype,
                both,
            ),
            3,
            11,
        );
        n += check(
            &task(
                "conv2d",
                "n=2,c=64,h=5,w=5,k=32,r=1,s=1,stride=2,groups=4",
                dtype,
                Epilogue::default(),
            ),
            3,
            12,
        );
        assert!(n >= 6, "{dtype}: only {n} kernels checked");
    }
    let gpu = GpuSpec::h100();
    let dw = task(
        "conv2d",
        "c=24,h=7,w=7,k=24,r=3,s=3,stride=2,pad=1,groups=24",
        DType::Fp16,
        both,
    );
    let states = Sampler::new(&dw, &gpu, 13).sample_distinct(8);
    assert_eq!(states.len(), 8);
    for s in &states {
        assert!(s.mma().is_none(), "depthwise has no GEMM view");
        run(&dw, &lower(&dw, s)).unwrap_or_else(|e| panic!("{dw} {}: {e}", s.to_json()));
    }
}

#[test]
fn matmuls_with_tails_and_batches() {
    for dtype in [DType::Fp16, DType::Bf16, DType::Tf32] {
        let bias = Epilogue {
            bias: true,
            relu: false,
        };
        let mut n = 0;
        n += check(&task("matmul", "33,40,24", dtype, bias), 3, 5);
        n += check(
            &task("matmul", "17,24,50", dtype, Epilogue::default()),
            3,
            6,
        );
        n += check(
            &task("batch_matmul", "3,20,16,32", dtype, Epilogue::default()),
            3,
            7,
        );
        assert!(n >= 9, "{dtype}: only {n} kernels checked");
    }
}

#[test]
fn half_output_and_every_copy_width() {
    let t = Task::new(
        parse_shape("matmul", "32,64,64").unwrap(),
        Epilogue::default(),
    )
    .unwrap()
    .with_types(DType::Fp16, DType::Fp16, Layout::Nchw)
    .unwrap();
    let gpu = GpuSpec::h100();
    for vector in [[8, 8], [4, 2], [1, 1], [2, 8]] {
        let s = State::tensor_core(
            MmaTiling {
                block_m: 32,
                block_n: 32,
                warps_m: 2,
                warps_n: 2,
                k_steps: 2,
                stages: 3,
                vector,
                swizzle: true,
                row_span: false,
                persistent: 0,
                stream_k: 0,
            },
            1,
        );
        assert_eq!(validate(&t.contraction(), &s, &gpu), Ok(()), "{vector:?}");
        run(&t, &lower(&t, &s)).unwrap_or_else(|e| panic!("{vector:?}: {e}"));
    }
}

/// Split-K into a half output, with a bias and a ReLU: each block stores its partial
/// sums and the last warps of a tile add them up and run the epilogue once. K = 200 in
/// K tiles of 32 (7 tiles, the last short): splits of 2, 3, 4 and 7 leave chunks of 4,
/// 3, 2 and 1 tiles, a last chunk short or empty.
#[test]
fn split_k_into_a_half_output_with_relu() {
    let gpu = GpuSpec::h100();
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    let mut ran = 0;
    for dtype in [DType::Fp16, DType::Bf16] {
        let t = Task::new(parse_shape("matmul", "40,24,200").unwrap(), fused)
            .unwrap()
            .with_types(dtype, dtype, Layout::Nchw)
            .unwrap();
        for (block_m, warps) in [(32, [2, 1]), (16, [1, 1]), (48, [1, 3])] {
            for split_k in [2, 3, 4, 7] {
                let s = State::tensor_core(
                    MmaTiling {
                        block_m,
                        block_n: 16,
                        warps_m: warps[0],
                        warps_n: warps[1],
                        k_steps: 2,
                        stages: 2,
                        vector: [8, 8],
                        swizzle: true,
                        row_span: false,
                        persistent: 0,
                        stream_k: 0,
                    },
                    split_k,
                );
                if validate(&t.contraction(), &s, &gpu).is_err() {
                    continue;
                }
                run(&t, &lower(&t, &s)).unwrap_or_else(|e| panic!("{}: {e}", s.to_json()));
                ran += 1;
            }
        }
    }
    assert!(ran >= 16, "only {ran} split kernels ran");
}

/// Stream-K in the `mma.sync` sketch: every K tile of every output tile dealt once,
/// whatever the runs' cuts, into a half output with bias and ReLU (run once, on the
/// whole sum), at every pipeline depth, over a batch and over convolutions' im2col
/// tiles with padding, stride and tails; and validation's refusals.
#[test]
fn mma_stream_k_deals_every_k_tile_once() {
    let gpu = GpuSpec::h100();
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    let tiling = |block_m, block_n, warps: [u32; 2], stages, stream_k| MmaTiling {
        block_m,
        block_n,
        warps_m: warps[0],
        warps_n: warps[1],
        k_steps: 2,
        stages,
        vector: [8, 8],
        swizzle: true,
        row_span: false,
        persistent: 0,
        stream_k,
    };
    let typed = |op: &str, shape: &str, dtype: DType, epilogue: Epilogue| {
        Task::new(parse_shape(op, shape).unwrap(), epilogue)
            .unwrap()
            .with_types(dtype, dtype, Layout::Nhwc)
            .unwrap()
    };
    let mut ran = 0;
    let mut check = |t: &Task, s: MmaTiling| {
        let state = State::tensor_core(s, 1);
        assert_eq!(validate(&t.contraction(), &state, &gpu), Ok(()), "{t}");
        run(t, &lower(t, &state)).unwrap_or_else(|e| panic!("{t} {}: {e}", state.to_json()));
        ran += 1;
    };
    for dtype in [DType::Fp16, DType::Bf16] {
        // 3 × 2 tiles of 7 K tiles (K = 200, a tail): 42 iterations. 4 blocks take runs
        // of 10 or 11 (whole tiles inside, both ends inside tiles), 6 exactly one tile
        // each, 5 and 11 cut tiles in several places, 41 runs of one or two.
        let t = typed("matmul", "40,24,200", dtype, fused);
        for blocks in [2, 4, 5, 6, 11, 41] {
            for stages in [1, 2, 3, 5] {
                check(&t, tiling(16, 16, [1, 2], stages, blocks));
            }
        }
        // More warps than one, along both axes.
        check(&t, tiling(32, 16, [2, 1], 3, 7));
    }
    let bmm = typed(
        "batch_matmul",
        "3,40,24,96",
        DType::Fp16,
        Epilogue::default(),
    );
    check(&bmm, tiling(32, 16, [2, 1], 2, 5));
    // 3×3 convolutions: padding and a tail of output pixels; stride 2 and 12 channels.
    let conv = typed("conv2d", "1,32,6,6,24,3,3,1,1", DType::Fp16, fused);
    check(&conv, tiling(16, 16, [1, 2], 3, 9));
    check(&conv, tiling(32, 8, [2, 1], 2, 4));
    let strided = typed("conv2d", "2,16,9,9,16,3,3,2,1", DType::Bf16, fused);
    check(&strided, tiling(16, 16, [1, 1], 2, 7));
    assert_eq!(ran, 2 * 25 + 4);
    // Refused: one block, as many blocks as iterations, a split, row spans.
    let t = typed("matmul", "40,24,200", DType::Fp16, Epilogue::default());
    let c = t.contraction();
    let base = tiling(16, 16, [1, 2], 2, 4);
    for (s, split_k) in [
        (tiling(16, 16, [1, 2], 2, 1), 1),
        (tiling(16, 16, [1, 2], 2, 42), 1),
        (base, 2),
    ] {
        assert!(
            validate(&c, &State::tensor_core(s, split_k), &gpu).is_err(),
            "{s:?} split {split_k}"
        );
    }
    let stem = typed(
        "conv2d",
        "1,3,16,16,8,7,7,2,3",
        DType::Fp16,
        Epilogue::default(),
    );
    let spans = MmaTiling {
        row_span: true,
        vector: [8, 1],
        ..base
    };
    assert!(validate(&stem.contraction(), &State::tensor_core(spans, 1), &gpu).is_err());
    // The sampler draws stream-K for a small layer: sampled states equal the definition.
    let small = typed(
        "conv2d",
        "1,64,7,7,64,3,3,1,1",
        DType::Fp16,
        Epilogue::default(),
    );
    let states = Sampler::new(&small, &gpu, 11).sample_distinct(200);
    let streamed: Vec<&State> = states
        .iter()
        .filter(|s| s.mma().is_some_and(|m| m.stream_k > 0))
        .collect();
    assert!(streamed.len() >= 5, "{} stream-K states", streamed.len());
    for s in streamed.into_iter().take(5) {
        run(&small, &lower(&small, s)).unwrap_or_else(|e| panic!("{}: {e}", s.to_json()));
    }
}

fn rewrite(stmts: &[Stmt], f: &mut dyn FnMut(&Stmt) -> Option<Stmt>) -> Vec<Stmt> {
    stmts
        .iter()
        .filter_map(|s| match s {
            Stmt::For {
                var,
                extent,
                unroll,
                body,
            } => Some(Stmt::For {
                var: *var,
                extent: *extent,
                unroll: *unroll,
                body: rewrite(body, f),
            }),
            Stmt::If { conds, body } => Some(Stmt::If {
                conds: conds.clone(),
                body: rewrite(body, f),
            }),
            Stmt::Block { body } => Some(Stmt::Block {
                body: rewrite(body, f),
            }),
            other => f(other),
        })
        .collect()
}

#[test]
fn a_broken_pipeline_is_caught() {
    let t = task(
        "conv2d",
        "1,16,6,6,16,3,3,1,1",
        DType::Fp16,
        Epilogue::default(),
    );
    for stages in [2, 3, 4] {
        let s = State::tensor_core(
            MmaTiling {
                block_m: 16,
                block_n: 16,
                warps_m: 1,
                warps_n: 2,
                k_steps: 1,
                stages,
                vector: [8, 8],
                swizzle: true,
                row_span: false,
                persistent: 0,
                stream_k: 0,
            },
            1,
        );
        let kernel = lower(&t, &s);
        run(&t, &kernel).unwrap();
        // Waiting for one group fewer than the pipeline needs.
        let mut loose = kernel.clone();
        loose.body = rewrite(&kernel.body, &mut |s| match s {
            Stmt::WaitGroup { pending } => Some(Stmt::WaitGroup {
                pending: pending + 1,
            }),
            other => Some(other.clone()),
        });
        assert!(
            run(&t, &loose).is_err(),
            "stages {stages}: loose wait passed"
        );
        // No barrier at all.
        let mut unsynced = kernel.clone();
        unsynced.body = rewrite(&kernel.body, &mut |s| match s {
            Stmt::Sync => None,
            other => Some(other.clone()),
        });
        assert!(
            run(&t, &unsynced).is_err(),
            "stages {stages}: no barrier passed"
        );
    }
}

/// The printed kernels of three fixed states: an fp16 NHWC convolution (K-major B,
/// padding predicates, a 3-stage pipeline), a bf16 matmul with a bias and a bf16
/// output (`ldmatrix.trans` for its N-major B), a TF32 matmul under split-K (32-bit
/// shared loads for its N-major B).
#[test]
fn generated_tensor_core_kernels_are_stable() {
    let gpu = GpuSpec::h100();
    let tiling = MmaTiling {
        block_m: 32,
        block_n: 32,
        warps_m: 2,
        warps_n: 1,
        k_steps: 2,
        stages: 3,
        vector: [8, 8],
        swizzle: true,
        row_span: false,
        persistent: 0,
        stream_k: 0,
    };
    let conv = task(
        "conv2d",
        "1,32,8,8,32,3,3,1,1",
        DType::Fp16,
        Epilogue::default(),
    );
    let k = schedule::generate(&conv, &State::tensor_core(tiling, 1), &gpu).unwrap();
    insta::assert_snapshot!("fp16_conv2d_nhwc", k.source);
    let bias = Epilogue {
        bias: true,
        relu: false,
    };
    let mm = Task::new(parse_shape("matmul", "64,64,64").unwrap(), bias)
        .unwrap()
        .with_types(DType::Bf16, DType::Bf16, Layout::Nchw)
        .unwrap();
    let k = schedule::generate(&mm, &State::tensor_core(tiling, 1), &gpu).unwrap();
    insta::assert_snapshot!("bf16_matmul_bias_bf16_out", k.source);
    let tf = task("matmul", "64,64,64", DType::Tf32, Epilogue::default());
    let tiling = MmaTiling {
        vector: [4, 4],
        stages: 2,
        ..tiling
    };
    let k = schedule::generate(&tf, &State::tensor_core(tiling, 2), &gpu).unwrap();
    insta::assert_snapshot!("tf32_matmul_split_k", k.source);
    // Stream-K over 5 blocks of the convolution's 2 tiles of 9 K tiles.
    let streamed = MmaTiling {
        stream_k: 5,
        vector: [8, 8],
        stages: 3,
        ..tiling
    };
    let k = schedule::generate(&conv, &State::tensor_core(streamed, 1), &gpu).unwrap();
    insta::assert_snapshot!("fp16_conv2d_nhwc_stream_k", k.source);
}
