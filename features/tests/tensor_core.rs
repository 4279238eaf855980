//! Features of tensor-core states: the counts the kernel's structure implies
//! (`mma.sync`, `ldmatrix`, `cp.async` bytes and sectors, K tiles and the pipeline) on
//! an fp16 NHWC ResNet layer and fp16 and TF32 matmuls; the `ldmatrix` bank conflicts
//! with and without the swizzle; the sketch flag and the zeros of the other sketch's
//! features; finiteness on malformed tilings (proptest); the extraction rate.

mod common;

use common::{mma_states, typed_task, widest_vector};
use features::{CUDA_CORE_ONLY, FEATURE_COUNT, FEATURE_NAMES, FeatureExtractor, feature_index};
use proptest::prelude::*;
use schedule::atom::Ldmatrix;
use schedule::atom::mma::{MmaAtom, TF32_M16N8K8};
use schedule::census::Census;
use schedule::gemm::GemmView;
use schedule::lower::lower;
use schedule::sketch::mma_sync::MmaTiling;
use schedule::state::SplitSums;
use schedule::validate::validate;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, network, parse_shape};
use std::time::Instant;

fn tiling(block_m: u32, block_n: u32, warps: [u32; 2], k_steps: u32, stages: u32) -> MmaTiling {
    MmaTiling {
        block_m,
        block_n,
        warps_m: warps[0],
        warps_n: warps[1],
        k_steps,
        stages,
        vector: [8, 8],
        swizzle: true,
        row_span: false,
        persistent: 0,
        stream_k: 0,
    }
}

/// The named features of `state`, checked to be a valid state of `task` on an H100.
fn features(task: &Task, state: &State) -> impl Fn(&str) -> f32 + use<> {
    let gpu = GpuSpec::h100();
    assert_eq!(validate(&task.contraction(), state, &gpu), Ok(()));
    let values = FeatureExtractor::new(task, &gpu).extract(state);
    move |name| values[feature_index(name).unwrap_or_else(|| panic!("no feature {name}"))]
}

/// ResNet's 64-channel 3x3 layer at 56x56, in fp16 NHWC: M = 3136, N = 64, K = 576.
fn resnet_layer() -> Task {
    let layer = network("resnet", 1)
        .unwrap()
        .into_iter()
        .map(|w| w.task)
        .find(|t| t.key() == "conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1")
        .expect("the layer is in the network");
    layer
        .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
        .unwrap()
}

fn matmul(shape: &str, dtype: DType) -> Task {
    typed_task("matmul", shape, dtype, DType::F32, Epilogue::default())
}

#[test]
fn an_fp16_resnet_layer_counts_its_mmas_copies_and_fragment_loads() {
    let task = resnet_layer();
    // 128 x 64 blocks of 2 x 2 warps (64 x 32 each: 4 x 4 MMA tiles), K tiles of
    // 2 k-steps (32 halves): 25 blocks, 18 K tiles.
    let s = State::tensor_core(tiling(128, 64, [2, 2], 2, 3), 1);
    let f = features(&task, &s);
    assert_eq!(f("sketch"), 1.0);
    assert_eq!(f("task_element_bytes"), 2.0);
    assert_eq!(f("task_output_element_bytes"), 4.0);
    assert_eq!(f("valid"), 1.0);
    assert_eq!(f("thread_blocks"), 25.0);
    assert_eq!(f("threads_per_block"), 128.0);
    assert_eq!((f("mma_tiles_m"), f("mma_tiles_n")), (4.0, 4.0));
    assert_eq!(f("mma_block_k"), 32.0);
    assert_eq!(f("mma_ktiles"), 18.0);
    assert_eq!(f("reduction_stages"), 18.0);
    // MMA count = MMA tiles x k-steps x K tiles.
    let per_block = (128 / 16 * (64 / 8) * 2 * 18) as f32;
    assert_eq!(f("mma_per_block"), per_block);
    assert_eq!(f("mma_instructions"), per_block * 25.0);
    assert_eq!(f("mma_per_sm_wave"), f("blocks_per_sm") * per_block);
    assert_eq!(f("mma_per_sm"), per_block);
    // Per warp and k-step: one ldmatrix.x4 per M tile, one per two N tiles.
    assert_eq!(f("mma_input_ldmatrix_per_block"), (4 * 4 * 2 * 18) as f32);
    assert_eq!(f("mma_weight_ldmatrix_per_block"), (4 * 2 * 2 * 18) as f32);
    assert_eq!(
        f("mma_ldmatrix_bytes_per_block"),
        (4 * 2 * 18 * (4 * 512 + 4 * 256)) as f32
    );
    assert_eq!(f("mma_per_ldmatrix"), 16.0 / 6.0);
    // The fill: (128 + 64) rows of 64 bytes per K tile, 16-byte copies, coalesced.
    let stage = ((128 + 64) * 32 * 2) as f32;
    assert_eq!(f("mma_stage_bytes"), stage);
    assert_eq!(f("shared_bytes_per_block"), 3.0 * stage);
    assert_eq!(f("mma_cp_async_bytes_per_block"), 18.0 * stage);
    assert_eq!(f("mma_cp_async_bytes"), 25.0 * 18.0 * stage);
    assert_eq!(f("mma_input_copy_bytes"), 16.0);
    assert_eq!(f("input_fetch_rounds"), 4.0);
    assert_eq!(f("weight_fetch_rounds"), 2.0);
    assert_eq!(f("input_sectors_per_fetch"), 16.0);
    assert_eq!(f("input_fetch_coalescing"), 1.0);
    assert_eq!(f("input_sectors_per_block"), (128 * 64 / 32 * 18) as f32);
    assert_eq!(f("weight_sectors_per_block"), (64 * 64 / 32 * 18) as f32);
    // The implicit GEMM reads each input pixel up to 9 times and the weight per block.
    assert!(f("global_traffic_ratio") > 1.0);
    assert_eq!(f("input_store_bank_conflict"), 1.0);
    // The pipeline: two K tiles copied ahead of the first MMA.
    assert_eq!(f("mma_stages"), 3.0);
    assert_eq!(f("mma_prologue_tiles"), 2.0);
    assert_eq!(f("mma_pipeline_fill"), 2.0 / 18.0);
    // 3136 rows in 25 blocks of 128.
    assert_eq!(f("work_efficiency"), 3136.0 / 3200.0);
    // The epilogue: 8 rows x 2 floats x 4 lanes per store instruction, one sector a row.
    assert_eq!(f("output_sectors_per_store"), 8.0);
    assert_eq!(f("ilp"), 64.0);
    assert!(f("occupancy") > 0.0 && f("occupancy") <= 1.0);
    assert!(f("oi_global") > 0.0 && f("oi_shared") > 0.0);
    for name in CUDA_CORE_ONLY {
        assert_eq!(f(name), 0.0, "{name}");
    }
}

#[test]
fn split_k_multiplies_the_blocks_and_adds_partial_sums_but_not_mmas() {
    let task = resnet_layer();
    let t = tiling(128, 64, [2, 2], 2, 3);
    let (f1, f2) = (
        features(&task, &State::tensor_core(t, 1)),
        features(&task, &State::tensor_core(t, 2)),
    );
    assert_eq!(f2("split_k"), 2.0);
    assert_eq!(f2("thread_blocks"), 50.0);
    assert_eq!(f2("reduction_stages"), 9.0);
    assert_eq!(f2("mma_per_block"), f1("mma_per_block") / 2.0);
    assert_eq!(f2("mma_instructions"), f1("mma_instructions"));
    assert_eq!(f2("mma_cp_async_bytes"), f1("mma_cp_async_bytes"));
    assert_eq!(f2("mma_pipeline_fill"), 2.0 / 9.0);
    // Each of the 50 blocks stores its 128 x 64 f32 partial sums (1024 sectors) and
    // the fixup reads them back; nothing is added atomically or zeroed.
    assert_eq!(
        f2("output_sectors") - f1("output_sectors"),
        50.0 * 2.0 * 1024.0
    );
    assert_eq!(f2("split_atomic"), 0.0);
    assert_eq!(f2("atomic_output_sectors"), 0.0);
    assert_eq!(f2("zeroed_output_sectors"), 0.0);
    // With atomic sums each block adds its partial sums into its tile's, and each of
    // the 25 tiles' fixups reads and clears one tile of them.
    let atomic = State {
        split_sums: SplitSums::Atomic,
        ..State::tensor_core(t, 2)
    };
    let fa = features(&task, &atomic);
    assert_eq!(fa("split_atomic"), 1.0);
    assert_eq!(fa("atomic_output_sectors"), 50.0 * 1024.0);
    assert_eq!(
        fa("output_sectors") - f1("output_sectors"),
        50.0 * 1024.0 + 25.0 * 2.0 * 1024.0
    );
    assert_eq!(fa("zeroed_output_sectors"), 0.0);
}

#[test]
fn an_fp16_matmul_reads_its_n_major_weight_with_ldmatrix_trans() {
    let task = matmul("1024,1024,1024", DType::Fp16);
    // 128 x 128 blocks of 2 x 4 warps (64 x 32: 4 x 4 tiles), K tiles of 64 halves.
    let s = State::tensor_core(tiling(128, 128, [2, 4], 4, 4), 1);
    let f = features(&task, &s);
    assert_eq!(f("mma_weight_n_major"), 1.0);
    assert_eq!(f("thread_blocks"), 64.0);
    assert_eq!(f("mma_ktiles"), 16.0);
    let per_block = (8 * 16 * 4 * 16) as f32;
    assert_eq!(f("mma_per_block"), per_block);
    assert_eq!(f("mma_instructions"), per_block * 64.0);
    assert_eq!(f("mma_input_ldmatrix_per_block"), (8 * 4 * 4 * 16) as f32);
    assert_eq!(f("mma_weight_ldmatrix_per_block"), (8 * 2 * 4 * 16) as f32);
    // B's K tile: 64 rows (k) of 256 bytes (n), copied in 16-byte pieces.
    assert_eq!(f("weight_sectors_per_block"), (64 * 256 / 32 * 16) as f32);
    assert_eq!(f("weight_fetch_coalescing"), 1.0);
    assert_eq!(f("input_bank_conflict"), 1.0);
    assert_eq!(f("weight_bank_conflict"), 1.0);
    assert_eq!(f("work_efficiency"), 1.0);
    // No padding or tails: every byte is read once per block that needs it.
    assert_eq!(
        f("input_sectors"),
        (1024 * 1024 * 2 / 32 * (1024 / 128)) as f32
    );
}

#[test]
fn tf32_with_an_n_major_weight_loads_its_fragments_32_bits_at_a_time() {
    let task = matmul("1024,1024,1024", DType::Tf32);
    let mut t = tiling(128, 64, [2, 2], 2, 3);
    t.vector = [4, 4];
    let f = features(&task, &State::tensor_core(t, 1));
    assert_eq!(f("task_element_bytes"), 4.0);
    assert_eq!(f("mma_block_k"), 16.0);
    assert_eq!(f("mma_ktiles"), 64.0);
    // Per warp and k-step: 4 ldmatrix.x4 for A, 2 32-bit loads per N tile for B.
    assert_eq!(f("mma_input_ldmatrix_per_block"), (4 * 4 * 2 * 64) as f32);
    assert_eq!(
        f("mma_weight_ldmatrix_per_block"),
        (4 * 2 * 2 * 4 * 64) as f32
    );
    assert_eq!(f("mma_per_ldmatrix"), 16.0 / 12.0);
    // Lanes read 4 k rows of 256 bytes, 8 floats each: 4-way plain, 2-way swizzled.
    assert_eq!(f("weight_bank_conflict"), 2.0);
    t.swizzle = false;
    let plain = features(&task, &State::tensor_core(t, 1));
    assert_eq!(plain("weight_bank_conflict"), 4.0);
}

#[test]
fn the_swizzle_removes_ldmatrix_conflicts_of_64_byte_rows() {
    // Two k-steps of fp16: rows of 64 bytes, so rows r and r + 2 of one ldmatrix 8x8
    // matrix are 128 bytes apart, in the same banks: 4 rows per 16-byte bank group.
    let task = resnet_layer();
    let mut t = tiling(128, 64, [2, 2], 2, 3);
    let swizzled = features(&task, &State::tensor_core(t, 1));
    t.swizzle = false;
    let plain = features(&task, &State::tensor_core(t, 1));
    for input in ["input", "weight"] {
        let conflict = format!("{input}_bank_conflict");
        let wavefronts = format!("{input}_shared_load_wavefronts");
        assert_eq!(plain(&conflict), 4.0, "{input}");
        assert_eq!(swizzled(&conflict), 1.0, "{input}");
        assert_eq!(plain(&wavefronts), 4.0 * swizzled(&wavefronts), "{input}");
        // The fill's 16-byte stores are conflict-free either way.
        let stores = format!("{input}_store_bank_conflict");
        assert_eq!((plain(&stores), swizzled(&stores)), (1.0, 1.0));
    }
    assert_eq!((plain("mma_swizzle"), swizzled("mma_swizzle")), (0.0, 1.0));
    assert!(plain("oi_shared") < swizzled("oi_shared"));
    // Everything else is the same kernel.
    assert_eq!(plain("global_sectors"), swizzled("global_sectors"));
    assert_eq!(plain("mma_per_block"), swizzled("mma_per_block"));
    // An N-major weight of 32 columns (64-byte rows) too.
    let task = matmul("1024,1024,1024", DType::Fp16);
    let mut t = tiling(64, 32, [2, 2], 2, 2);
    let swizzled = features(&task, &State::tensor_core(t, 1));
    t.swizzle = false;
    let plain = features(&task, &State::tensor_core(t, 1));
    assert_eq!(plain("weight_bank_conflict"), 4.0);
    assert_eq!(swizzled("weight_bank_conflict"), 1.0);
}

#[test]
fn mma_counts_follow_the_tiling_for_every_state() {
    let gpu = GpuSpec::h100();
    for task in [resnet_layer(), matmul("333,777,555", DType::Bf16)] {
        let c = task.contraction();
        let view = GemmView::of(&c).unwrap();
        let extractor = FeatureExtractor::new(&task, &gpu);
        let states = mma_states(&task, &gpu, 200);
        assert!(states.len() > 100, "{}", states.len());
        for s in &states {
            let t = s.mma().unwrap();
            let values = extractor.extract(s);
            let f = |name: &str| f64::from(values[feature_index(name).unwrap()]);
            let ktiles = view.k.div_ceil(t.block_k(c.dtype)) as f64;
            let tiles = (view.m.div_ceil(u64::from(t.block_m))
                * view.n.div_ceil(u64::from(t.block_n))) as f64;
            let mma_tiles = f64::from(t.block_m / 16 * (t.block_n / 8));
            let k_steps = f64::from(t.k_steps);
            assert_eq!(f("valid"), 1.0);
            assert_eq!(f("mma_ktiles"), ktiles);
            assert_eq!(f("thread_blocks"), tiles * f64::from(s.split_k));
            assert_eq!(
                f("reduction_stages"),
                (ktiles / f64::from(s.split_k)).ceil()
            );
            assert_eq!(f("mma_instructions"), mma_tiles * k_steps * ktiles * tiles);
            assert_eq!(
                f("mma_per_block"),
                mma_tiles * k_steps * f("reduction_stages")
            );
            assert_eq!(f("mma_stages"), f64::from(t.stages));
            let fill = f64::from(t.stages - 1).min(f("reduction_stages")) / f("reduction_stages");
            assert!((f("mma_pipeline_fill") - fill).abs() < 1e-6);
            assert!(f("wave_efficiency") > 0.0 && f("wave_efficiency") <= 1.0);
            assert!(f("global_traffic_ratio") > 0.5);
            assert!(values.iter().all(|v| v.is_finite()));
        }
    }
}

/// The instruction counts the features give are those of the kernel lowering
/// generates: the census of its IR (every loop at its extent, every guard taken) times
/// the block's warps, for sampled states of a K-major and an N-major weight in every
/// tensor-core type, TF32's 32-bit fragment loads included. The `cp.async` copies are
/// counted over the pipeline's fills: one per K tile of the block, and the prologue's
/// `stages - 1` ahead of them (fewer when the block has fewer tiles).
#[test]
fn instruction_counts_are_those_of_the_lowered_kernel() {
    let gpu = GpuSpec::h100();
    let tasks = [
        resnet_layer(),
        matmul("333,777,555", DType::Bf16),
        matmul("96,80,200", DType::Tf32),
        typed_task(
            "conv2d",
            "1,24,9,9,40,3,3,1,1",
            DType::Tf32,
            DType::F32,
            Epilogue::default(),
        ),
    ];
    for task in tasks {
        let c = task.contraction();
        let b_k_major = GemmView::of(&c).unwrap().b_k_major;
        let extractor = FeatureExtractor::new(&task, &gpu);
        let atom = MmaAtom::sizing(c.dtype);
        let states = mma_states(&task, &gpu, 120);
        assert!(states.len() > 60, "{task}: {}", states.len());
        for s in &states {
            let t = s.mma().unwrap();
            let values = extractor.extract(s);
            let f = |name: &str| f64::from(values[feature_index(name).unwrap()]);
            let census = Census::of(&lower(&task, s).body);
            let warps = f64::from(t.warps_m * t.warps_n);
            let n = |count: u64| count as f64 * warps;
            let at = format!("{task}, {s:?}");
            assert_eq!(f("mma_per_block"), n(census.mma), "{at}");
            assert_eq!(
                f("mma_input_ldmatrix_per_block"),
                n(census.fragment_loads[0]),
                "{at}"
            );
            let weight_loads = if c.dtype == DType::Tf32 && !b_k_major {
                census.fragments[1] * TF32_M16N8K8.b_registers as u64
            } else {
                census.fragment_loads[1]
            };
            assert_eq!(f("mma_weight_ldmatrix_per_block"), n(weight_loads), "{at}");
            let fragment_bytes = census.fragments[0] as f64 * Ldmatrix::A.bytes() as f64
                + census.fragments[1] as f64
                    * (atom.n * atom.k * i64::from(c.dtype.bytes())) as f64;
            let bytes = f("mma_ldmatrix_bytes_per_block");
            assert!(
                (bytes - fragment_bytes * warps).abs() <= 1e-6 * bytes,
                "{at}"
            );
            let tiles = f("reduction_stages");
            let fills = match t.stages {
                1 => tiles,
                stages => f64::from(stages - 1).min(tiles) + tiles,
            };
            assert_eq!(
                f("input_fetch_rounds") * fills,
                census.async_copies[0] as f64,
                "{at}"
            );
            assert_eq!(
                f("weight_fetch_rounds") * fills,
                census.async_copies[1] as f64,
                "{at}"
            );
        }
    }
}

#[test]
fn tails_and_padding_are_fetched_and_counted() {
    let gpu = GpuSpec::h100();
    // The stem's 3 channels: 2-byte copies; odd matmul extents: tails in M, N and K.
    for (op, shape) in [
        ("conv2d", "1,3,224,224,64,7,7,2,3"),
        ("matmul", "333,777,555"),
    ] {
        let task = typed_task(op, shape, DType::Fp16, DType::F32, Epilogue::default());
        let mut t = tiling(64, 64, [2, 2], 1, 2);
        t.vector = [0, 1].map(|i| widest_vector(&t, i, &task));
        let f = features(&task, &State::tensor_core(t, 1));
        assert_eq!(f("mma_input_copy_bytes"), 2.0, "{op}");
        assert!(f("work_efficiency") < 1.0, "{op}");
        assert!(f("input_fetch_coalescing") < 1.0, "{op}");
        assert!(
            f("input_sectors") > 0.0 && f("output_sectors") > 0.0,
            "{op}"
        );
        let extractor = FeatureExtractor::new(&task, &gpu);
        assert!(
            extractor
                .extract(&State::tensor_core(t, 1))
                .iter()
                .all(|v| v.is_finite())
        );
    }
}

#[test]
fn each_sketch_leaves_the_others_features_at_zero() {
    let gpu = GpuSpec::h100();
    let f32_task = Task::new(
        parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap(),
        Epilogue::default(),
    )
    .unwrap();
    let extractor = FeatureExtractor::new(&f32_task, &gpu);
    for s in Sampler::new(&f32_task, &gpu, 9).sample_distinct(30) {
        let values = extractor.extract(&s);
        for (name, value) in FEATURE_NAMES.iter().zip(values) {
            if *name == "sketch" || name.starts_with("mma_") {
                assert_eq!(value, 0.0, "{name} of a CUDA-core state");
            }
        }
    }
    let task = resnet_layer();
    let extractor = FeatureExtractor::new(&task, &gpu);
    for s in mma_states(&task, &gpu, 30) {
        let values = extractor.extract(&s);
        assert_eq!(values[feature_index("sketch").unwrap()], 1.0);
        for name in CUDA_CORE_ONLY {
            assert_eq!(values[feature_index(name).unwrap()], 0.0, "{name}");
        }
    }
    // Every name in the list is a feature.
    assert!(CUDA_CORE_ONLY.iter().all(|n| feature_index(n).is_some()));
}

#[test]
fn tensor_core_states_of_tasks_without_a_gemm_view_are_invalid_but_described() {
    // NCHW conv2d has no GEMM view; an f32 task has no tensor-core type.
    let gpu = GpuSpec::h100();
    let nchw = Task::new(
        parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap(),
        Epilogue::default(),
    )
    .unwrap()
    .with_types(DType::Fp16, DType::F32, Layout::Nchw)
    .unwrap();
    let f32_matmul = matmul("256,256,256", DType::F32);
    for task in [nchw, f32_matmul] {
        let values = FeatureExtractor::new(&task, &gpu)
            .extract(&State::tensor_core(tiling(64, 64, [2, 2], 2, 2), 1));
        let f = |name: &str| values[feature_index(name).unwrap()];
        assert_eq!(f("valid"), 0.0, "{}", task.key());
        assert_eq!(f("sketch"), 1.0);
        assert_eq!(f("mma_block_m"), 64.0);
        assert!(values.iter().all(|v| v.is_finite()));
    }
}

fn all_finite(values: &[f32; FEATURE_COUNT]) -> Result<(), TestCaseError> {
    for (name, value) in FEATURE_NAMES.iter().zip(values) {
        prop_assert!(value.is_finite(), "{name} = {value}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn malformed_tensor_core_states_have_finite_features(
        task_index in 0usize..5,
        fields in proptest::collection::vec(
            prop_oneof![0u32..5, 1u32..300, Just(1u32 << 20), Just(u32::MAX)], 9),
        swizzle in any::<bool>(),
        mixed in any::<bool>(),
    ) {
        let tasks = [
            resnet_layer(),
            matmul("333,777,555", DType::Fp16),
            matmul("64,64,64", DType::Tf32),
            typed_task("batch_matmul", "12,128,128,64", DType::Bf16, DType::Bf16, Epilogue::default()),
            typed_task("conv2d", "1,3,224,224,64,7,7,2,3", DType::Fp16, DType::F32, Epilogue { bias: true, relu: true }),
        ];
        let task = &tasks[task_index];
        let t = MmaTiling {
            block_m: fields[0],
            block_n: fields[1],
            warps_m: fields[2],
            warps_n: fields[3],
            k_steps: fields[4],
            stages: fields[5],
            vector: [fields[6], fields[7]],
            swizzle,
            row_span: false,
            persistent: 0,
            stream_k: 0,
        };
        let mut state = State::tensor_core(t, fields[8]);
        if mixed {
            // Both sketches' fields set: invalid, still described.
            state.unroll_max_step = 16;
        }
        let values = FeatureExtractor::new(task, &GpuSpec::h100()).extract(&state);
        all_finite(&values)?;
        prop_assert_eq!(values[feature_index("sketch").unwrap()], 1.0);
        if mixed {
            prop_assert_eq!(values[feature_index("valid").unwrap()], 0.0);
        }
    }
}

#[test]
fn tensor_core_extraction_is_fast() {
    let gpu = GpuSpec::h100();
    let pool: Vec<(FeatureExtractor, Vec<State>)> = [
        resnet_layer(),
        matmul("1024,1024,1024", DType::Fp16),
        matmul("333,777,555", DType::Tf32),
    ]
    .iter()
    .map(|task| {
        (
            FeatureExtractor::new(task, &gpu),
            mma_states(task, &gpu, 40),
        )
    })
    .collect();
    let mut checksum = 0.0f64;
    let states = 20_000;
    let start = Instant::now();
    let mut done = 0;
    'outer: loop {
        for (extractor, task_states) in &pool {
            for state in task_states {
                checksum += f64::from(extractor.extract(state)[0]);
                done += 1;
                if done == states {
                    break 'outer;
                }
            }
        }
    }
    let rate = states as f64 / start.elapsed().as_secs_f64();
    eprintln!("extracted {states} tensor-core states at {rate:.0} states/s ({checksum})");
    assert!(rate > 10_000.0, "only {rate:.0} states/s");
}
