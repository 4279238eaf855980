//! States: seeded sampling is reproducible, JSON round-trips replay into byte-identical
//! CUDA, fixed states generate reviewed source (insta snapshots), and sampled states
//! satisfy validation's invariants (proptest).

use proptest::prelude::*;
use schedule::sketch::cuda_core::{Tiling, canonical_unroll};
use schedule::state::{ReductionSplit, SharedLayout, SketchTiling, SpatialSplit, UNROLL_STEPS};
use schedule::task::Conv2d;
use schedule::validate::{InvalidState, validate};
use schedule::{
    DType, Epilogue, GpuSpec, Layout, Operator, Sampler, State, Task, generate, network,
    parse_shape,
};

fn task(op: &str, shape: &str, epilogue: Epilogue) -> Task {
    Task::new(parse_shape(op, shape).unwrap(), epilogue).unwrap()
}

fn sp(vthread: u32, thread: u32, outer: u32, inner: u32) -> SpatialSplit {
    SpatialSplit {
        vthread,
        thread,
        outer,
        inner,
    }
}

fn rd(middle: u32, inner: u32) -> ReductionSplit {
    ReductionSplit { middle, inner }
}

#[test]
fn same_seed_same_states_other_seed_other_states() {
    let gpu = GpuSpec::h100();
    let t = task("conv2d", "1,256,14,14,256,3,3,1,1", Epilogue::default());
    let a = Sampler::new(&t, &gpu, 7).sample_distinct(20);
    let b = Sampler::new(&t, &gpu, 7).sample_distinct(20);
    let c = Sampler::new(&t, &gpu, 8).sample_distinct(20);
    assert_eq!(a.len(), 20);
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn json_round_trip_replays_byte_identical_source() {
    let gpu = GpuSpec::h100();
    let mut tasks: Vec<Task> = network("resnet", 1)
        .unwrap()
        .into_iter()
        .map(|w| w.task)
        .collect();
    tasks.push(task(
        "matmul",
        "333,777,555",
        Epilogue {
            bias: true,
            relu: true,
        },
    ));
    tasks.push(task("batch_matmul", "12,128,128,64", Epilogue::default()));
    for t in tasks {
        for state in Sampler::new(&t, &gpu, 3).sample_distinct(10) {
            let original = generate(&t, &state, &gpu).unwrap();
            let json = state.to_json();
            let replayed: State = serde_json::from_str(&json).unwrap();
            assert_eq!(replayed, state);
            let task_json = serde_json::to_string(&t).unwrap();
            let task_back: Task = serde_json::from_str(&task_json).unwrap();
            assert_eq!(task_back, t);
            assert_eq!(generate(&task_back, &replayed, &gpu).unwrap(), original);
        }
    }
}

/// A deep ResNet layer: 3x3 padding, tails in p and q, vthreads, unrolled reduction.
#[test]
fn snapshot_conv2d_deep_layer() {
    let t = task("conv2d", "1,512,7,7,512,3,3,1,1", Epilogue::default());
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(2, 8, 1, 2), sp(1, 1, 4, 1), sp(1, 8, 1, 1)],
        reduction: vec![rd(4, 2), rd(1, 3), rd(1, 3)],
        unroll_max_step: 512,
        vector_width: [1, 1],
        split_k: 1,
        shared_layout: Default::default(),
    };
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    insta::assert_snapshot!("conv2d_deep_layer", k.source);
}

/// A strided 1x1 convolution with bias and ReLU and a vectorized weight fetch.
#[test]
fn snapshot_conv2d_strided_1x1_epilogue() {
    let t = task(
        "conv2d",
        "1,256,56,56,128,1,1,2,0",
        Epilogue {
            bias: true,
            relu: true,
        },
    );
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 16, 2, 2), sp(1, 2, 1, 2), sp(1, 4, 1, 7)],
        reduction: vec![rd(4, 4)],
        unroll_max_step: 64,
        vector_width: [1, 4],
        split_k: 1,
        shared_layout: Default::default(),
    };
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    insta::assert_snapshot!("conv2d_strided_1x1_epilogue", k.source);
}

/// A depthwise convolution on fp16 NHWC data: CUDA-core arithmetic in f32, halves
/// widened by a vector load on the fetch (channels contiguous) and narrowed on the store.
#[test]
fn snapshot_depthwise_fp16_nhwc() {
    let t = task(
        "conv2d",
        "c=144,h=56,w=56,k=144,r=3,s=3,stride=2,pad=1,groups=144",
        Epilogue {
            bias: true,
            relu: false,
        },
    )
    .with_types(DType::Fp16, DType::Fp16, Layout::Nhwc)
    .unwrap();
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 4, 1, 1), sp(1, 4, 1, 1), sp(1, 8, 1, 2)],
        reduction: vec![rd(1, 3), rd(3, 1)],
        unroll_max_step: 512,
        vector_width: [4, 1],
        split_k: 1,
        shared_layout: Default::default(),
    };
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    insta::assert_snapshot!("depthwise_fp16_nhwc", k.source);
}

/// A matmul with non-divisible extents (tails in M, N and K; 555 and 777 admit only
/// scalar fetches).
#[test]
fn snapshot_matmul_tails() {
    let t = task("matmul", "333,777,555", Epilogue::default());
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 16, 2, 2), sp(2, 16, 1, 4)],
        reduction: vec![rd(2, 8)],
        unroll_max_step: 1024,
        vector_width: [1, 1],
        split_k: 1,
        shared_layout: Default::default(),
    };
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    insta::assert_snapshot!("matmul_tails", k.source);
}

/// `wgmma` kernels: a matmul (N-major B in 64-column boxes) with persistent blocks,
/// an NHWC 1×1 convolution (K-major B) with bias and ReLU and a producer warp, a
/// bf16 batch matmul in 32-byte K rows (the 32B swizzle) with tails, a matmul split
/// four ways with bias and ReLU, a clustered matmul multicasting B, a warp-specialized
/// matmul whose epilogue is TMA stores, and a TF32 1×1 convolution.
#[test]
fn snapshot_wgmma_kernels() {
    let tiling = |consumers, m_atoms, block_n, k_bytes| schedule::state::WgmmaTiling {
        consumers,
        m_atoms,
        block_n,
        k_bytes,
        stages: 3,
        in_flight: 1,
        persistent: 0,
        producer_warp: 0,
        raster: 0,
        cluster: 0,
        cluster_m: 0,
        tma_store: 0,
        stream_k: 0,
    };
    let gpu = GpuSpec::h100();
    let typed = |t: Task, dtype| t.with_types(dtype, dtype, Layout::Nhwc).unwrap();
    let matmul = typed(
        task("matmul", "1024,512,256", Epilogue::default()),
        DType::Fp16,
    );
    let persistent = State::hopper(schedule::state::WgmmaTiling {
        persistent: 16,
        ..tiling(2, 1, 128, 128)
    });
    let k = generate(&matmul, &persistent, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_matmul_persistent", k.source);
    let bias_relu = Epilogue {
        bias: true,
        relu: true,
    };
    let conv = typed(
        task("conv2d", "1,64,28,28,96,1,1,1,0", bias_relu),
        DType::Fp16,
    );
    let specialized = State::hopper(schedule::state::WgmmaTiling {
        producer_warp: 1,
        ..tiling(1, 2, 96, 64)
    });
    let k = generate(&conv, &specialized, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_conv2d_1x1_producer_warp", k.source);
    let bmm = typed(
        task("batch_matmul", "4,100,72,40", Epilogue::default()),
        DType::Bf16,
    );
    let k = generate(&bmm, &State::hopper(tiling(1, 1, 48, 32)), &gpu).unwrap();
    insta::assert_snapshot!("wgmma_batch_matmul_bf16", k.source);
    // A decode-sized matmul split four ways: partial sums and the last block's fixup.
    let decode = typed(task("matmul", "16,256,1024", bias_relu), DType::Fp16);
    let split = State {
        split_k: 4,
        ..State::hopper(tiling(1, 1, 64, 128))
    };
    let k = generate(&decode, &split, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_matmul_split_k", k.source);
    // The same with atomic sums: added into the tile's slots, taken once and cleared.
    let atomic = State {
        split_sums: schedule::state::SplitSums::Atomic,
        ..split
    };
    let k = generate(&decode, &atomic, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_matmul_split_k_atomic", k.source);
    // Stream-K over 6 blocks: 4 tiles of 16 K tiles in runs of 10 or 11, each block's
    // segments stored whole or added into their tile's sums.
    let streamed = State::hopper(schedule::state::WgmmaTiling {
        stream_k: 6,
        ..tiling(1, 1, 64, 128)
    });
    let k = generate(&decode, &streamed, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_matmul_stream_k", k.source);
    // A strided, padded 3×3 convolution: A through TMA's im2col walk (a row tile's
    // first output pixel as the walk's base, the tap's filter offsets), B per tap.
    let conv3 = typed(
        task("conv2d", "2,64,28,28,128,3,3,2,1", bias_relu),
        DType::Fp16,
    );
    let k = generate(&conv3, &State::hopper(tiling(2, 1, 128, 128)), &gpu).unwrap();
    insta::assert_snapshot!("wgmma_conv2d_3x3_im2col", k.source);
    // Pairs of blocks down a raster band of 4 M tiles sharing B by TMA multicast, and a
    // TF32 1×1 convolution (k8 instructions, both operands K-major).
    let clustered = State::hopper(schedule::state::WgmmaTiling {
        raster: 4,
        cluster: 2,
        ..tiling(2, 1, 128, 128)
    });
    let k = generate(&matmul, &clustered, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_matmul_cluster_multicast", k.source);
    // The epilogue of TMA stores, warp-specialized and persistent, with bias and ReLU.
    let fused = typed(task("matmul", "1024,512,256", bias_relu), DType::Fp16);
    let stored = State::hopper(schedule::state::WgmmaTiling {
        persistent: 16,
        producer_warp: 1,
        tma_store: 1,
        ..tiling(2, 1, 128, 128)
    });
    let k = generate(&fused, &stored, &gpu).unwrap();
    insta::assert_snapshot!("wgmma_matmul_tma_store", k.source);
    let tf32 = task("conv2d", "1,64,28,28,96,1,1,1,0", Epilogue::default())
        .with_types(DType::Tf32, DType::F32, Layout::Nhwc)
        .unwrap();
    let k = generate(&tf32, &State::hopper(tiling(1, 1, 96, 128)), &gpu).unwrap();
    insta::assert_snapshot!("wgmma_conv2d_1x1_tf32", k.source);
}

/// The 128x128x8 tile of `snapshot_matmul_transposed_padded_a`.
fn cublas_like_tile() -> State {
    State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 16, 2, 4), sp(1, 16, 2, 4)],
        reduction: vec![rd(8, 1)],
        unroll_max_step: 512,
        vector_width: [4, 4],
        split_k: 1,
        shared_layout: [
            SharedLayout {
                innermost: Some(0),
                pad: 4,
            },
            SharedLayout::NATURAL,
        ],
    }
}

/// A cuBLAS-like 128x128x8 matmul tile with A stored transposed (`m` contiguous) and
/// its rows padded by 4 floats: the K-vectorized fetch of A scatters its components
/// across rows, and each thread's A operands along `m` are 4 consecutive, aligned
/// floats (one 128-bit shared load per outer register position).
#[test]
fn snapshot_matmul_transposed_padded_a() {
    let t = task("matmul", "1024,1024,1024", Epilogue::default());
    let state = cublas_like_tile();
    let tiling = Tiling::new(&t.contraction(), &state);
    assert_eq!(tiling.tiles[0].strides(), vec![1, 132]);
    assert_eq!(tiling.tiles[0].allocated(), 8 * 132);
    assert_eq!(tiling.tiles[1].offset, 8 * 132);
    assert_eq!(tiling.shared_bytes(), 4 * (8 * 132 + 8 * 128));
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    assert!(
        k.source.contains("state: {")
            && k.source
                .contains(r#""shared_layout":[{"innermost":0,"pad":4},{}]"#)
    );
    insta::assert_snapshot!("matmul_transposed_padded_a", k.source);
}

#[test]
fn snapshot_batch_matmul() {
    let t = task("batch_matmul", "12,128,128,64", Epilogue::default());
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 1, 1, 1), sp(1, 16, 2, 2), sp(2, 8, 1, 4)],
        reduction: vec![rd(4, 4)],
        unroll_max_step: 16,
        vector_width: [4, 2],
        split_k: 1,
        shared_layout: Default::default(),
    };
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    insta::assert_snapshot!("batch_matmul", k.source);
}

/// Split-K on the deep layer with a bias: 22 stages (a tail in c) over 4 splits of 6,
/// so the last chunk is short and guarded; the bias is added by chunk 0 only and the
/// epilogue adds atomically.
#[test]
fn snapshot_conv2d_deep_layer_split_k() {
    let t = task(
        "conv2d",
        "1,512,7,7,512,3,3,1,1",
        Epilogue {
            bias: true,
            relu: false,
        },
    );
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(2, 8, 1, 2), sp(1, 1, 4, 1), sp(1, 8, 1, 1)],
        reduction: vec![rd(8, 3), rd(1, 3), rd(1, 3)],
        unroll_max_step: 512,
        vector_width: [1, 1],
        split_k: 4,
        shared_layout: Default::default(),
    };
    let c = t.contraction();
    assert_eq!(state.stages(&c), 22);
    assert_eq!(state.blocks(&c), 4 * state.spatial_blocks(&c));
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    assert!(k.launch.zero_output);
    assert_eq!(u64::from(k.launch.grid), state.blocks(&c));
    insta::assert_snapshot!("conv2d_deep_layer_split_k", k.source);
}

/// Only the CUDA-core sketch's split adds into a zeroed output; the tensor-core
/// sketches' splits (and stream-K) go through a workspace that every launch leaves
/// zeroed.
#[test]
fn only_cuda_core_splits_need_a_zeroed_output() {
    let gpu = GpuSpec::h100();
    let f32_task = task("matmul", "333,777,555", Epilogue::default());
    // Half inputs into an f32 output: the tensor-core sketches.
    let half = f32_task
        .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
        .unwrap();
    for (t, cuda_core) in [(f32_task, true), (half, false)] {
        let states = Sampler::new(&t, &gpu, 4).sample_distinct(60);
        assert!(
            states.iter().any(|s| s.split_k > 1),
            "no split state of {t}"
        );
        for state in states {
            let k = generate(&t, &state, &gpu).unwrap();
            let split = state.split_k > 1;
            // Stream-K's segments meet in a workspace too, unsplit.
            let streamed = state.mma().is_some_and(|m| m.stream_k > 0)
                || state.wgmma().is_some_and(|w| w.stream_k > 0);
            assert_eq!(state.mma().is_none() && state.wgmma().is_none(), cuda_core);
            assert_eq!(k.launch.zero_output, split && cuda_core);
            assert_eq!(
                k.launch.workspace_bytes > 0,
                (split || streamed) && !cuda_core
            );
            assert_eq!(u64::from(k.launch.grid), state.blocks(&t.contraction()));
            assert_eq!(k.source.contains("atomicAdd(&out"), split && cuda_core);
        }
    }
}

#[test]
fn validation_rejects_what_the_gpu_cannot_run() {
    let gpu = GpuSpec::h100();
    let t = task("matmul", "1024,1024,1024", Epilogue::default());
    let c = t.contraction();
    let base = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 16, 1, 4), sp(1, 16, 1, 4)],
        reduction: vec![rd(2, 8)],
        unroll_max_step: 64,
        vector_width: [4, 4],
        split_k: 1,
        shared_layout: Default::default(),
    };
    assert_eq!(validate(&c, &base, &gpu), Ok(()));
    let with = |f: &dyn Fn(&mut State)| {
        let mut s = base.clone();
        f(&mut s);
        validate(&c, &s, &gpu)
    };
    assert!(matches!(
        with(&|s| s.spatial[0].thread = 128),
        Err(InvalidState::Threads { .. })
    ));
    assert!(matches!(
        with(&|s| s.spatial[0].thread = 1),
        Err(InvalidState::Threads { .. })
    ));
    assert!(matches!(
        with(&|s| s.spatial[0].vthread = 16),
        Err(InvalidState::VirtualThreads { .. })
    ));
    assert!(matches!(
        with(&|s| s.reduction[0].inner = 128),
        Err(InvalidState::InnermostFactor { .. })
    ));
    assert!(matches!(
        with(&|s| s.reduction[0].middle = 64),
        Err(InvalidState::SharedMemory { .. })
    ));
    assert!(matches!(
        with(&|s| s.spatial[1].outer = 16),
        Err(InvalidState::Registers { .. } | InvalidState::RegistersPerBlock { .. })
    ));
    assert!(matches!(
        with(&|s| s.unroll_max_step = 7),
        Err(InvalidState::UnrollStep(7))
    ));
    assert!(matches!(
        with(&|s| s.reduction[0].inner = 3),
        Err(InvalidState::VectorWidth { .. })
    ));
    assert!(matches!(
        with(&|s| s.spatial.pop().map(drop).unwrap()),
        Err(InvalidState::Arity { .. })
    ));
    assert!(matches!(
        with(&|s| s.spatial[0].inner = 0),
        Err(InvalidState::ZeroFactor)
    ));
    // 64 stages: splits up to 64 are fine, more are not, nor is none.
    assert_eq!(with(&|s| s.split_k = 64), Ok(()));
    assert_eq!(with(&|s| s.split_k = 3), Ok(()));
    assert!(matches!(
        with(&|s| s.split_k = 0),
        Err(InvalidState::ZeroFactor)
    ));
    assert!(matches!(
        with(&|s| {
            s.split_k = 32;
            s.reduction[0].middle = 32;
        }),
        Err(InvalidState::SplitK { stages: 4, .. })
    ));
    assert!(matches!(
        with(&|s| s.split_k = 128),
        Err(InvalidState::SplitK { max: 64, .. })
    ));
    // Layouts: A (m, k) may put m innermost with any pad; k innermost is the natural
    // order spelled twice; pads come from the set.
    let transposed = SharedLayout {
        innermost: Some(0),
        pad: 4,
    };
    assert_eq!(with(&|s| s.shared_layout[0] = transposed), Ok(()));
    assert_eq!(with(&|s| s.shared_layout[1].pad = 1), Ok(()));
    assert!(matches!(
        with(&|s| s.shared_layout[0].innermost = Some(1)),
        Err(InvalidState::LayoutDimension {
            input: 0,
            innermost: 1,
            dims: 1
        })
    ));
    // B's k innermost is allowed (the sampler never draws a reduction-only dimension).
    assert_eq!(with(&|s| s.shared_layout[1] = transposed), Ok(()));
    assert!(matches!(
        with(&|s| s.shared_layout[0].pad = 3),
        Err(InvalidState::LayoutPad { input: 0, pad: 3 })
    ));
    // Padding counts towards the limit of 227 KB (58112 floats): 128x224 tiles of A
    // and B take 57344 floats, padded by 4 (128 x 228 + 224 x 132) 58752.
    let wide = |pad: u32| {
        with(&|s| {
            s.spatial[0] = sp(1, 16, 1, 8);
            s.spatial[1] = sp(1, 16, 1, 8);
            s.reduction[0] = rd(28, 8);
            s.unroll_max_step = 0;
            s.shared_layout[0].pad = pad;
            s.shared_layout[1].pad = pad;
        })
    };
    assert_eq!(wide(0), Ok(()));
    assert!(matches!(wide(4), Err(InvalidState::SharedMemory { .. })));
}

#[test]
fn split_k_with_relu_is_rejected_with_a_reason() {
    let gpu = GpuSpec::h100();
    let relu = Epilogue {
        bias: true,
        relu: true,
    };
    let t = task("matmul", "256,256,1024", relu);
    let state = State {
        split_sums: Default::default(),
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        spatial: vec![sp(1, 16, 1, 4), sp(1, 16, 1, 4)],
        reduction: vec![rd(2, 8)],
        unroll_max_step: 64,
        vector_width: [4, 4],
        split_k: 2,
        shared_layout: Default::default(),
    };
    let err = validate(&t.contraction(), &state, &gpu).unwrap_err();
    assert_eq!(err, InvalidState::SplitKRelu { split_k: 2 });
    assert!(err.to_string().contains("ReLU"), "{err}");
    let bias_only = task(
        "matmul",
        "256,256,1024",
        Epilogue {
            bias: true,
            relu: false,
        },
    );
    assert_eq!(validate(&bias_only.contraction(), &state, &gpu), Ok(()));
}

fn any_task() -> impl Strategy<Value = Task> {
    prop_oneof![
        (
            1u32..3,
            1u32..600,
            5u32..60,
            1u32..600,
            1u32..4,
            1u32..3,
            0u32..3
        )
            .prop_map(|(n, c, hw, k, r, stride, pad)| {
                let op = Operator::Conv2d(Conv2d::new(
                    n,
                    c,
                    hw,
                    hw,
                    k,
                    2 * r - 1,
                    2 * r - 1,
                    stride,
                    pad,
                ));
                Task::new(op, Epilogue::default()).unwrap()
            }),
        (1u32..2000, 1u32..2000, 1u32..2000).prop_map(|(m, n, k)| {
            Task::new(Operator::Matmul { m, n, k }, Epilogue::default()).unwrap()
        }),
        (1u32..16, 1u32..300, 1u32..300, 1u32..300).prop_map(|(b, m, n, k)| {
            Task::new(Operator::BatchMatmul { b, m, n, k }, Epilogue::default()).unwrap()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every sampled state validates, covers every axis with its tiles (and, split or
    /// not, every reduction stage exactly once), and respects the hardware's limits;
    /// sampling is a function of the seed.
    #[test]
    fn sampled_states_are_valid_and_cover_the_task(t in any_task(), seed in any::<u64>()) {
        let gpu = GpuSpec::h100();
        let c = t.contraction();
        let states = Sampler::new(&t, &gpu, seed).sample_distinct(4);
        prop_assert!(!states.is_empty(), "no state for {}", t);
        prop_assert_eq!(&states, &Sampler::new(&t, &gpu, seed).sample_distinct(4));
        for s in &states {
            prop_assert_eq!(validate(&c, s, &gpu), Ok(()));
            let tiling = Tiling::new(&c, s);
            for (a, axis) in c.spatial.iter().enumerate() {
                prop_assert!(tiling.blocks[a] * tiling.block_tile[a] >= i64::from(axis.extent));
                prop_assert!(s.spatial[a].inner <= gpu.max_innermost_factor);
            }
            for (r, axis) in c.reduction.iter().enumerate() {
                prop_assert!(tiling.stages[r] * tiling.stage_tile[r] >= i64::from(axis.extent));
            }
            // The split's chunks cover every stage of the reduction exactly once.
            prop_assert!(s.split_k.is_power_of_two() && s.split_k <= 64);
            prop_assert!(u64::from(s.split_k) <= s.stages(&c));
            let mut next = 0;
            for z in 0..s.split_k {
                let chunk = s.split_chunk(&c, z);
                prop_assert_eq!(chunk.start, next);
                prop_assert!(chunk.end - chunk.start <= s.stages_per_block(&c));
                next = chunk.end;
            }
            prop_assert_eq!(next, s.stages(&c));
            prop_assert!(s.threads() <= gpu.max_threads_per_block);
            prop_assert!(s.vthreads() <= gpu.max_vthread);
            prop_assert!(tiling.shared_bytes() <= u64::from(gpu.shared_bytes_per_block_optin));
        }
    }
}

/// The CUDA source of `s` without the header comments that name its state (None: invalid).
fn code(t: &Task, s: &State, gpu: &GpuSpec) -> Option<String> {
    let source = generate(t, s, gpu).ok()?.source;
    let lines: Vec<&str> = source
        .lines()
        .skip_while(|l| l.trim_start().starts_with("//"))
        .collect();
    Some(lines.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every unroll depth of a valid state gives the kernel of its canonical depth, which
    /// is valid too and its own canonical depth; sampled states hold canonical depths.
    #[test]
    fn unroll_depths_that_unroll_the_same_loops_are_one_kernel(t in any_task(), seed in any::<u64>()) {
        let gpu = GpuSpec::h100();
        let c = t.contraction();
        for s in Sampler::new(&t, &gpu, seed).sample_distinct(3) {
            if s.tiling != SketchTiling::CudaCore {
                continue;
            }
            prop_assert_eq!(canonical_unroll(&c, &s), s.unroll_max_step);
            let at = |depth: u32| State { unroll_max_step: depth, ..s.clone() };
            for depth in UNROLL_STEPS {
                let Some(kernel) = code(&t, &at(depth), &gpu) else { continue };
                let canonical = canonical_unroll(&c, &at(depth));
                prop_assert!(canonical <= depth);
                prop_assert_eq!(code(&t, &at(canonical), &gpu), Some(kernel.clone()));
                prop_assert_eq!(canonical_unroll(&c, &at(canonical)), canonical);
            }
        }
    }
}

/// Of the pairs of unroll depths that give one resnet state the same kernel, the
/// canonical depth merges most (550 of 604 now; it leaves apart those that differ in an
/// unrolled one-round fetch, which register prefetch tells apart).
#[test]
fn canonical_unroll_merges_the_depths_that_give_one_kernel() {
    let gpu = GpuSpec::h100();
    let (mut same_code, mut merged) = (0, 0);
    for w in network("resnet", 1).unwrap() {
        let c = w.task.contraction();
        for s in Sampler::new(&w.task, &gpu, 3).sample_distinct(12) {
            let at = |depth: u32| State {
                unroll_max_step: depth,
                ..s.clone()
            };
            for (i, &a) in UNROLL_STEPS.iter().enumerate() {
                for &b in &UNROLL_STEPS[i + 1..] {
                    let (Some(x), Some(y)) =
                        (code(&w.task, &at(a), &gpu), code(&w.task, &at(b), &gpu))
                    else {
                        continue;
                    };
                    if x == y {
                        same_code += 1;
                        merged += usize::from(
                            canonical_unroll(&c, &at(a)) == canonical_unroll(&c, &at(b)),
                        );
                    }
                }
            }
        }
    }
    assert!(same_code > 100, "{same_code} pairs");
    assert!(
        merged * 5 >= same_code * 4,
        "{merged} of {same_code} merged"
    );
}

/// Register prefetch on the cuBLAS-like matmul tile (vectorized, scattered A stores) and
/// on a split-K deep layer (the stage loop under the split's tail guard): the next
/// stage's loads go to registers after the first barrier and are stored at the top of
/// the next iteration.
#[test]
fn snapshot_prefetch() {
    let t = task("matmul", "1024,1024,1024", Epilogue::default());
    let state = State {
        prefetch: true,
        tiling: SketchTiling::CudaCore,
        ..cublas_like_tile()
    };
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    assert!(k.source.contains("float4 pf0[") && k.source.contains("ro_next"));
    insta::assert_snapshot!("prefetch_matmul", k.source);

    let t = task("conv2d", "1,512,7,7,512,3,3,1,1", Epilogue::default());
    let state: State = serde_json::from_str(
        r#"{"spatial":[{"vthread":1,"thread":32,"outer":2,"inner":1},{"vthread":4,"thread":1,"outer":1,"inner":2},{"vthread":1,"thread":7,"outer":1,"inner":1}],"reduction":[{"middle":2,"inner":1},{"middle":1,"inner":3},{"middle":3,"inner":1}],"unroll_max_step":512,"vector_width":[1,1],"split_k":32,"shared_layout":[{},{"innermost":0,"pad":2}],"prefetch":true}"#,
    )
    .unwrap();
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    insta::assert_snapshot!("prefetch_conv2d_split_k", k.source);
}

#[test]
fn prefetch_needs_unrolled_fetch_loops_and_two_stages() {
    let t = task("matmul", "1024,1024,1024", Epilogue::default());
    let mut state = State {
        prefetch: true,
        tiling: SketchTiling::CudaCore,
        unroll_max_step: 0,
        ..cublas_like_tile()
    };
    let c = t.contraction();
    let gpu = GpuSpec::h100();
    assert!(matches!(
        schedule::validate(&c, &state, &gpu),
        Err(schedule::InvalidState::Prefetch)
    ));
    state.unroll_max_step = 1024;
    assert_eq!(schedule::validate(&c, &state, &gpu), Ok(()));
    // Prefetching keeps the next stage live through the inner product.
    let without = State {
        prefetch: false,
        tiling: SketchTiling::CudaCore,
        ..state.clone()
    };
    assert!(
        schedule::sketch::cuda_core::register_estimate(&c, &state)
            > schedule::sketch::cuda_core::register_estimate(&c, &without)
    );
}
