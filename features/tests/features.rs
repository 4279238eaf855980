//! The feature vector end to end: hand-computed memory transactions, bank conflicts,
//! occupancy limits and waves on constructed states; finiteness on sampled and on
//! malformed states (proptest); the extraction rate; and a snapshot of the names and
//! descriptions, so that any change to the model's inputs shows in review. The
//! tensor-core sketch's own features are tested in `tensor_core.rs`.

mod common;

use features::{FEATURE_COUNT, FEATURE_DOCS, FEATURE_NAMES, FeatureExtractor, feature_index};
use proptest::prelude::*;
use schedule::state::{ReductionSplit, SharedLayout, SketchTiling, SpatialSplit};
use schedule::validate::validate;
use schedule::{DType, Epilogue, GpuSpec, Sampler, State, Task, network, parse_shape};
use std::time::Instant;

fn task(op: &str, shape: &str) -> Task {
    Task::new(parse_shape(op, shape).unwrap(), Epilogue::default()).unwrap()
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

fn state(spatial: Vec<SpatialSplit>, reduction: Vec<ReductionSplit>, widths: [u32; 2]) -> State {
    State {
        prefetch: false,
        split_sums: Default::default(),
        tiling: SketchTiling::CudaCore,
        spatial,
        reduction,
        unroll_max_step: 0,
        vector_width: widths,
        split_k: 1,
        shared_layout: Default::default(),
    }
}

/// The named features of `state`, checked to be a valid state of `task` on an H100.
fn features(task: &Task, state: &State) -> impl Fn(&str) -> f32 + use<> {
    let gpu = GpuSpec::h100();
    assert_eq!(validate(&task.contraction(), state, &gpu), Ok(()));
    let values = FeatureExtractor::new(task, &gpu).extract(state);
    move |name| values[feature_index(name).unwrap_or_else(|| panic!("no feature {name}"))]
}

/// Tasks of every kind: ResNet-50 layers (7x7 stride 2, 1x1 stride 2, 3x3), matmul with
/// tails, batch matmul, and epilogues.
fn tasks() -> Vec<Task> {
    let mut tasks: Vec<Task> = network("resnet", 1)
        .unwrap()
        .into_iter()
        .map(|w| w.task)
        .collect();
    let both = Epilogue {
        bias: true,
        relu: true,
    };
    tasks.push(Task::new(parse_shape("matmul", "333,777,555").unwrap(), both).unwrap());
    tasks.push(task("batch_matmul", "12,128,128,64"));
    tasks.push(
        Task::new(
            parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap(),
            both,
        )
        .unwrap(),
    );
    tasks.push(task(
        "conv2d",
        "n=2,c=32,h=17,w=23,k=48,r=3,s=5,stride_h=2,stride_w=1,pad=2",
    ));
    tasks
}

// --- Global memory --------------------------------------------------------------------

#[test]
fn a_warp_fetching_32_consecutive_floats_loads_4_sectors() {
    // A[m, k] tile of 1 x 32: one warp reads one 128-byte aligned row.
    let t = task("matmul", "64,64,1024");
    let s = state(
        vec![sp(1, 1, 1, 1), sp(1, 32, 1, 1)],
        vec![rd(32, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("input_sectors_per_fetch"), 4.0);
    assert_eq!(f("input_fetch_coalescing"), 1.0);
    // B[k, n] tile of 32 x 32: each warp load is one aligned row of 32 floats too.
    assert_eq!(f("weight_sectors_per_fetch"), 4.0);
    // 32 stages, one load per stage; 64 x 2 blocks.
    assert_eq!(f("input_sectors_per_block"), 4.0 * 32.0);
    assert_eq!(f("input_sectors"), 4.0 * 32.0 * 128.0);
    // Each thread stores one output, 32 consecutive floats per warp.
    assert_eq!(f("output_sectors_per_store"), 4.0);
    assert_eq!(f("output_sectors"), 4.0 * 128.0);
}

#[test]
fn a_strided_warp_fetch_loads_a_sector_per_lane() {
    // A tile of 32 x 1: the lanes walk down a column, 1024 floats apart.
    let t = task("matmul", "64,64,1024");
    let s = state(
        vec![sp(1, 32, 1, 1), sp(1, 1, 1, 1)],
        vec![rd(1, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("input_sectors_per_fetch"), 32.0);
    assert_eq!(f("input_fetch_coalescing"), 4.0 / 32.0);
}

#[test]
fn a_warp_fetching_float4_over_128_floats_loads_16_sectors() {
    let t = task("matmul", "64,64,1024");
    let s = state(
        vec![sp(1, 1, 1, 1), sp(1, 32, 1, 1)],
        vec![rd(32, 4)],
        [4, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("input_fetch_rounds"), 1.0);
    assert_eq!(f("input_sectors_per_fetch"), 16.0);
    assert_eq!(f("input_fetch_coalescing"), 1.0);
    // 128-bit stores to shared memory: four quarter-warp wavefronts, no conflict.
    assert_eq!(f("input_store_bank_conflict"), 1.0);
    assert_eq!(f("input_shared_store_wavefronts"), 4.0 * 8.0 * 128.0);
}

#[test]
fn strided_conv_fetches_rows_with_gaps() {
    // 1x1 stride-2 conv: data tile rows of q_tile * 2 - 1 floats, of which every other
    // one is used; the fetch still loads whole rows, so it is coalesced per row.
    let t = task("conv2d", "1,256,56,56,128,1,1,2,0");
    let s = state(
        vec![sp(1, 1, 1, 1), sp(1, 2, 1, 1), sp(1, 16, 1, 1)],
        vec![rd(4, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    // Data tile: 4 channels x 3 rows x 31 columns; the compulsory traffic counts only
    // the even rows and columns.
    assert_eq!(f("input_tile_elements"), (4 * 3 * 31) as f32);
    assert!(f("global_traffic_ratio") > 1.0);
    assert!(f("input_sectors_per_fetch") >= 4.0);
}

// --- Shared memory --------------------------------------------------------------------

#[test]
fn lanes_two_words_apart_have_a_two_way_bank_conflict() {
    // A_sh[m * 2 + k] with the 32 threads along m.
    let t = task("matmul", "64,64,1024");
    let s = state(
        vec![sp(1, 32, 1, 1), sp(1, 1, 1, 1)],
        vec![rd(2, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("input_shared_loads_per_step"), 1.0);
    assert_eq!(f("input_bank_conflict"), 2.0);
    // B_sh[k]: one word for every lane, a broadcast.
    assert_eq!(f("weight_bank_conflict"), 1.0);
    // One warp, two wavefronts per step, 2 steps per stage, 512 stages, 2 x 64 blocks.
    assert_eq!(f("input_shared_load_wavefronts"), 2.0 * 2.0 * 512.0 * 128.0);
}

#[test]
fn lanes_32_words_apart_have_a_32_way_bank_conflict() {
    let t = task("matmul", "64,64,1024");
    let s = state(
        vec![sp(1, 32, 1, 1), sp(1, 1, 1, 1)],
        vec![rd(32, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("input_bank_conflict"), 32.0);
}

#[test]
fn lanes_reading_one_word_broadcast() {
    // Threads along n: every lane reads the same A_sh word, consecutive B_sh words.
    let t = task("matmul", "64,64,1024");
    let s = state(
        vec![sp(1, 1, 1, 1), sp(1, 32, 1, 1)],
        vec![rd(32, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("input_bank_conflict"), 1.0);
    assert_eq!(f("weight_bank_conflict"), 1.0);
    assert_eq!(f("input_shared_load_wavefronts"), 32.0 * 32.0 * 128.0);
}

#[test]
fn contiguous_register_tiles_are_read_with_128_bit_loads() {
    // B_sh[k * 256 + t_n * 8 + o * 4 + i]: 8 consecutive, 16-byte aligned floats per
    // thread and step, as NVRTC emits them (two LDS.128). A_sh[m * 4 + k] with the
    // reduction rolled: one scalar load per register position along m.
    let t = task("matmul", "512,512,512");
    let s = state(
        vec![sp(2, 4, 1, 1), sp(1, 32, 2, 4)],
        vec![rd(2, 2)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("weight_shared_loads_per_step"), 2.0);
    assert_eq!(f("weight_shared_load_width"), 4.0);
    assert_eq!(f("input_shared_loads_per_step"), 2.0);
    assert_eq!(f("input_shared_load_width"), 1.0);
    // Lanes 8 floats apart reading 4 floats each use every other group of 4 banks:
    // 8 wavefronts for 4 wavefronts' worth of data.
    assert_eq!(f("weight_bank_conflict"), 2.0);
}

/// The 128x128x8 matmul tile of 256 threads (16 x 16, 8 x 8 registers as 2 x 4) with A
/// in each layout; the middle reduction loop is unrolled.
fn matmul_128(layout: SharedLayout) -> (Task, State) {
    let mut s = state(
        vec![sp(1, 16, 2, 4), sp(1, 16, 2, 4)],
        vec![rd(8, 1)],
        [4, 4],
    );
    s.unroll_max_step = 512;
    s.shared_layout[0] = layout;
    (task("matmul", "1024,1024,1024"), s)
}

#[test]
fn a_transposed_and_padded_a_tile_has_no_bank_conflicts() {
    let natural = {
        let (t, s) = matmul_128(SharedLayout::NATURAL);
        features(&t, &s)
    };
    // A_sh[(t_m * 8 + r) * 8 + k]: a warp's two t_m rows are 64 floats apart, in the
    // same banks: 2 wavefronts per 128-bit load. Each thread's 8 k of one row merge
    // into 2 LDS.128 (NVRTC emits 16 LDS.128 for A per 8 steps, as modelled).
    assert_eq!(natural("input_transposed"), 0.0);
    assert_eq!(natural("input_bank_conflict"), 2.0);
    assert_eq!(natural("input_shared_loads_per_step"), 2.0);
    assert_eq!(natural("input_shared_load_width"), 4.0);
    assert_eq!(natural("input_store_bank_conflict"), 1.0);
    assert_eq!(natural("input_fetch_store_width"), 4.0);
    let transposed = |pad: u32| {
        let (t, s) = matmul_128(SharedLayout {
            innermost: Some(0),
            pad,
        });
        features(&t, &s)
    };
    // A_sh[k * (128 + pad) + t_m * 8 + r]: the two rows are 8 floats apart, no conflict,
    // and still 2 LDS.128 per step. The fetch's float4 along k is stored as 4 scalars,
    // rows apart: lane m and lane m + 16 (k + 4) are 4 rows apart, 512 floats without
    // padding (same bank: 2 wavefronts), 528 with 4 (16 banks apart: 1).
    for pad in [0, 4] {
        let f = transposed(pad);
        assert_eq!(f("input_transposed"), 1.0);
        assert_eq!(f("input_row_pad"), pad as f32);
        assert_eq!(f("input_bank_conflict"), 1.0);
        assert_eq!(f("input_shared_loads_per_step"), 2.0);
        assert_eq!(f("input_shared_load_width"), 4.0);
        assert_eq!(f("input_fetch_store_width"), 1.0);
        let conflict = if pad == 0 { 2.0 } else { 1.0 };
        assert_eq!(f("input_store_bank_conflict"), conflict, "pad {pad}");
        assert!(f("input_shared_load_wavefronts") < natural("input_shared_load_wavefronts"));
    }
    assert_eq!(
        transposed(4)("shared_bytes_per_block"),
        4.0 * (8.0 * 132.0 + 8.0 * 128.0)
    );
    // A pad of 1 misaligns every other row: mixed widths, more loads.
    let odd = transposed(1);
    assert!(odd("input_shared_loads_per_step") > 2.0);
    assert!(odd("input_shared_load_width") < 4.0);
}

// --- Occupancy and waves --------------------------------------------------------------

#[test]
fn occupancy_limited_by_threads() {
    let t = task("matmul", "1024,1024,1024");
    let s = state(
        vec![sp(1, 32, 1, 1), sp(1, 32, 1, 1)],
        vec![rd(1, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("blocks_per_sm_by_threads"), 2.0);
    assert_eq!(f("blocks_per_sm"), 2.0);
    assert_eq!(f("limited_by_threads"), 1.0);
    assert_eq!(f("limited_by_shared"), 0.0);
    assert_eq!(f("active_warps_per_sm"), 64.0);
    assert_eq!(f("occupancy"), 1.0);
}

#[test]
fn occupancy_limited_by_shared_memory() {
    // 32 x 512 + 512 x 32 floats = 128 KB per block: one block per SM.
    let t = task("matmul", "1024,1024,1024");
    let s = state(
        vec![sp(1, 8, 4, 1), sp(1, 8, 4, 1)],
        vec![rd(16, 32)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("shared_bytes_per_block"), 131072.0);
    assert_eq!(f("blocks_per_sm_by_shared"), 1.0);
    assert_eq!(f("blocks_per_sm"), 1.0);
    assert_eq!(f("limited_by_shared"), 1.0);
    assert_eq!(f("limited_by_threads"), 0.0);
    assert_eq!(f("limited_by_registers"), 0.0);
    assert_eq!(f("active_warps_per_sm"), 2.0);
    assert_eq!(f("occupancy"), 2.0 / 64.0);
}

#[test]
fn occupancy_limited_by_registers() {
    // 64 accumulators per thread: about 108 registers, 3584 per warp, 4 warps per
    // sub-partition: 16 warps, two blocks of 8.
    let t = task("matmul", "1024,1024,1024");
    let s = state(
        vec![sp(1, 16, 8, 1), sp(1, 16, 1, 8)],
        vec![rd(1, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("registers_estimate"), 108.0);
    assert_eq!(f("registers_over_cap"), 0.0);
    assert_eq!(f("blocks_per_sm_by_registers"), 2.0);
    assert_eq!(f("blocks_per_sm"), 2.0);
    assert_eq!(f("limited_by_registers"), 1.0);
    assert_eq!(f("limited_by_threads"), 0.0);
    assert_eq!(f("ilp"), 64.0);
}

#[test]
fn occupancy_limited_by_the_block_cap() {
    let t = task("matmul", "1024,1024,1024");
    let s = state(
        vec![sp(1, 1, 1, 1), sp(1, 32, 1, 1)],
        vec![rd(1, 1)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("blocks_per_sm"), 32.0);
    assert_eq!(f("limited_by_block_cap"), 1.0);
    assert_eq!(f("active_warps_per_sm"), 32.0);
}

#[test]
fn one_block_past_a_full_wave_halves_the_wave_efficiency() {
    // One block per SM (shared memory), 7 x 19 = 133 blocks on 132 SMs.
    let t = task("matmul", "224,608,1024");
    let s = state(
        vec![sp(1, 8, 4, 1), sp(1, 8, 4, 1)],
        vec![rd(16, 32)],
        [1, 1],
    );
    let f = features(&t, &s);
    assert_eq!(f("thread_blocks"), 133.0);
    assert_eq!(f("blocks_per_sm"), 1.0);
    assert_eq!(f("waves"), (133.0f64 / 132.0) as f32);
    assert_eq!(f("wave_efficiency"), (133.0f64 / 264.0) as f32);
    assert_eq!(f("busiest_sm_blocks"), 2.0);
    assert_eq!(f("sm_utilization"), 1.0);
}

// --- Split-K --------------------------------------------------------------------------

#[test]
fn split_k_multiplies_the_grid_and_adds_atomic_traffic_but_not_loads() {
    // 64 x 2 tiles of one warp, 32 stages; split 4 ways: 8 stages per block.
    let t = task("matmul", "64,64,1024");
    let base = state(
        vec![sp(1, 1, 1, 1), sp(1, 32, 1, 1)],
        vec![rd(32, 1)],
        [1, 1],
    );
    let split = State {
        split_k: 4,
        ..base.clone()
    };
    let (f1, f4) = (features(&t, &base), features(&t, &split));
    assert_eq!((f1("split_k"), f4("split_k")), (1.0, 4.0));
    assert_eq!(f1("thread_blocks"), 128.0);
    assert_eq!(f4("thread_blocks"), 512.0);
    assert_eq!(f4("reduction_stages"), 8.0);
    assert_eq!(f4("barriers_per_block"), 16.0);
    // Loads and shared traffic over the grid do not change; per block they shrink.
    assert_eq!(f4("input_sectors"), f1("input_sectors"));
    assert_eq!(
        f4("input_sectors_per_block"),
        f1("input_sectors_per_block") / 4.0
    );
    assert_eq!(f4("shared_wavefronts"), f1("shared_wavefronts"));
    assert_eq!(f4("work_efficiency"), f1("work_efficiency"));
    // Every block adds its 32 outputs (4 sectors): 4 x the stores, all atomic, plus
    // the 4096 outputs zeroed (512 sectors).
    assert_eq!(f1("atomic_output_sectors"), 0.0);
    assert_eq!(f1("zeroed_output_sectors"), 0.0);
    assert_eq!(f4("output_sectors"), 4.0 * f1("output_sectors"));
    assert_eq!(f4("atomic_output_sectors"), f4("output_sectors"));
    assert_eq!(f4("zeroed_output_sectors"), 512.0);
    assert_eq!(
        f4("global_sectors") - f1("global_sectors"),
        3.0 * f1("output_sectors") + 512.0
    );
    // The grid fills more of the GPU.
    assert!(f4("waves") > f1("waves"));
    assert_eq!(f4("busiest_sm_blocks"), 4.0);
}

#[test]
fn split_k_stages_per_block_round_up() {
    // 5 stages over 4 splits: the longest block runs 2.
    let t = task("matmul", "8,32,40");
    let s = State {
        split_k: 4,
        ..state(
            vec![sp(1, 4, 1, 2), sp(1, 16, 1, 2)],
            vec![rd(2, 4)],
            [1, 1],
        )
    };
    let f = features(&t, &s);
    assert_eq!(f("reduction_stages"), 2.0);
    assert_eq!(f("thread_blocks"), 4.0);
    assert_eq!(f("work_efficiency"), 1.0);
}

// --- Every state gets a finite vector -------------------------------------------------

fn all_finite(values: &[f32; FEATURE_COUNT]) -> Result<(), TestCaseError> {
    for (name, value) in FEATURE_NAMES.iter().zip(values) {
        prop_assert!(value.is_finite(), "{name} = {value}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn sampled_states_have_finite_features(task_index in 0usize..17, seed in any::<u64>()) {
        let tasks = tasks();
        let task = &tasks[task_index % tasks.len()];
        let gpu = GpuSpec::h100();
        let state = Sampler::new(task, &gpu, seed).sample().expect("a valid state");
        let values = FeatureExtractor::new(task, &gpu).extract(&state);
        prop_assert_eq!(values.len(), FEATURE_COUNT);
        all_finite(&values)?;
        prop_assert_eq!(values[feature_index("valid").unwrap()], 1.0);
        // Sampling error aside, no schedule moves less than the compulsory traffic.
        prop_assert!(values[feature_index("global_traffic_ratio").unwrap()] > 0.5);
        prop_assert!(values[feature_index("occupancy").unwrap()] <= 1.0);
    }

    #[test]
    fn malformed_states_have_finite_features(
        task_index in 0usize..17,
        factors in proptest::collection::vec(
            prop_oneof![0u32..5, 1u32..70, Just(1u32 << 20), Just(u32::MAX)], 24),
        spatial_extra in 0usize..2,
        unroll in any::<u32>(),
        widths in [0u32..6, 0u32..6],
    ) {
        let tasks = tasks();
        let task = &tasks[task_index % tasks.len()];
        let c = task.contraction();
        let mut f = factors.into_iter().cycle();
        let mut next = || f.next().unwrap_or(1);
        let state = State {
            prefetch: false,
            split_sums: Default::default(),
            tiling: SketchTiling::CudaCore,
            spatial: (0..c.spatial.len() + spatial_extra)
                .map(|_| sp(next(), next(), next(), next()))
                .collect(),
            reduction: (0..c.reduction.len()).map(|_| rd(next(), next())).collect(),
            unroll_max_step: unroll,
            vector_width: widths,
            split_k: next(),
            // Mostly valid layouts, some naming a dimension the input lacks or a pad
            // outside the set.
            shared_layout: [0, 1].map(|_| SharedLayout {
                innermost: [None, None, Some(0), Some(1), Some(2)][(next() % 5) as usize],
                pad: [0, 1, 2, 4, 3][(next() % 5) as usize],
            }),
        };
        let values = FeatureExtractor::new(task, &GpuSpec::h100()).extract(&state);
        all_finite(&values)?;
    }
}

#[test]
fn degenerate_tasks_have_finite_features() {
    // No reduction axis left, a single output, a conv whose output is one pixel.
    let gpu = GpuSpec::h100();
    for (op, shape) in [
        ("matmul", "64,64,1"),
        ("matmul", "1,1,1"),
        ("matmul", "1,1,4096"),
        ("conv2d", "1,8,3,3,4,3,3,1,0"),
        ("batch_matmul", "3,1,5,7"),
    ] {
        let t = task(op, shape);
        let extractor = FeatureExtractor::new(&t, &gpu);
        let states = Sampler::new(&t, &gpu, 5).sample_distinct(10);
        assert!(!states.is_empty(), "{op} {shape}");
        for state in states {
            let values = extractor.extract(&state);
            assert!(values.iter().all(|v| v.is_finite()), "{op} {shape}");
            assert_eq!(values[feature_index("valid").unwrap()], 1.0);
        }
    }
}

#[test]
fn every_feature_varies_over_states_and_tasks() {
    let gpu = GpuSpec::h200();
    let mut columns: Vec<Vec<f32>> = vec![Vec::new(); FEATURE_COUNT];
    for (i, task) in tasks().iter().enumerate() {
        let extractor = FeatureExtractor::new(task, &gpu);
        let mut states = Sampler::new(task, &gpu, i as u64).sample_distinct(40);
        // Over the register cap (invalid), to show the validity and spill flags.
        let c = task.contraction();
        states.push(State {
            prefetch: false,
            split_sums: Default::default(),
            tiling: SketchTiling::CudaCore,
            spatial: (0..c.spatial.len())
                .map(|a| {
                    if a == 0 {
                        sp(1, 32, 16, 16)
                    } else {
                        sp(1, 1, 1, 1)
                    }
                })
                .collect(),
            reduction: c.reduction.iter().map(|_| rd(1, 1)).collect(),
            unroll_max_step: 0,
            vector_width: [1, 1],
            split_k: 1,
            shared_layout: Default::default(),
        });
        for state in &states {
            for (column, value) in columns.iter_mut().zip(extractor.extract(state)) {
                column.push(value);
            }
        }
    }
    // Tensor-core states of half, bf16 and TF32 tasks, for the sketch's own features
    // and the element sizes.
    for (op, shape, dtype, out) in [
        ("conv2d", "1,64,56,56,64,3,3,1,1", DType::Fp16, DType::F32),
        ("conv2d", "1,512,7,7,512,3,3,1,1", DType::Fp16, DType::F32),
        ("conv2d", "1,3,224,224,64,7,7,2,3", DType::Bf16, DType::F32),
        ("matmul", "1024,1024,1024", DType::Fp16, DType::Fp16),
        ("matmul", "333,777,555", DType::Tf32, DType::F32),
        ("batch_matmul", "12,128,128,64", DType::Bf16, DType::F32),
    ] {
        let bias = Epilogue {
            bias: true,
            relu: false,
        };
        let task = common::typed_task(op, shape, dtype, out, bias);
        let extractor = FeatureExtractor::new(&task, &gpu);
        for state in common::mma_states(&task, &gpu, 40) {
            for (column, value) in columns.iter_mut().zip(extractor.extract(&state)) {
                column.push(value);
            }
        }
    }
    // Row-span states of a stem and stream-K states of a small layer, which the
    // sampler draws.
    let mut drawn = Vec::new();
    for (shape, samples, what) in [
        ("1,3,224,224,64,7,7,2,3", 40, "row span"),
        ("1,512,7,7,512,3,3,1,1", 120, "stream-K"),
    ] {
        let task = common::typed_task(
            "conv2d",
            shape,
            DType::Fp16,
            DType::Fp16,
            Epilogue::default(),
        );
        let states: Vec<State> = Sampler::new(&task, &gpu, 3)
            .sample_distinct(samples)
            .into_iter()
            .filter(|s| {
                s.mma().is_some_and(|t| match what {
                    "row span" => t.row_span,
                    _ => t.stream_k > 0,
                })
            })
            .collect();
        assert!(states.len() >= 5, "{} {what} states", states.len());
        drawn.push((task, states));
    }
    for (task, states) in &drawn {
        let extractor = FeatureExtractor::new(task, &gpu);
        for state in states {
            for (column, value) in columns.iter_mut().zip(extractor.extract(state)) {
                column.push(value);
            }
        }
    }
    // `wgmma` states of a matmul (an N-major weight), a 1×1 convolution (a K-major
    // one), a 3×3 convolution (an im2col walk) and a batch matmul, for the sketch's own
    // features.
    for (op, shape, dtype) in [
        ("matmul", "1024,1024,1024", DType::Fp16),
        ("conv2d", "2,64,28,28,128,1,1,1,0", DType::Fp16),
        ("conv2d", "1,64,56,56,64,3,3,1,1", DType::Fp16),
        ("batch_matmul", "12,128,128,64", DType::Bf16),
    ] {
        let task = common::typed_task(op, shape, dtype, dtype, Epilogue::default());
        let extractor = FeatureExtractor::new(&task, &gpu);
        let states: Vec<State> = Sampler::new(&task, &gpu, 2)
            .sample_distinct(80)
            .into_iter()
            .filter(|s| s.wgmma().is_some())
            .collect();
        assert!(
            states.len() >= 20,
            "{op} {shape}: {} wgmma states",
            states.len()
        );
        for state in states {
            for (column, value) in columns.iter_mut().zip(extractor.extract(&state)) {
                column.push(value);
            }
        }
    }
    // (Shared stores of the fetch conflict only in transposed or padded tiles, which
    // the sampler draws, so every feature varies.)
    let constant: [&str; 0] = [];
    // At 32 registers or more per thread (every real kernel), the register file holds
    // no more threads than the SM does: threads bind only in a tie, which sampled states
    // do not reach (`occupancy_limited_by_threads` constructs one).
    let rare = ["limited_by_threads"];
    for (name, column) in FEATURE_NAMES.iter().zip(&columns) {
        if rare.contains(name) {
            continue;
        }
        let varies = column.iter().any(|v| *v != column[0]);
        if constant.contains(name) {
            assert!(!varies, "{name} was expected to be constant: {column:?}");
        } else {
            assert!(varies, "{name} is {} for every state", column[0]);
        }
    }
}

#[test]
fn names_are_unique_snake_case_and_documented() {
    let mut seen = std::collections::HashSet::new();
    for (name, doc) in FEATURE_NAMES.iter().zip(FEATURE_DOCS) {
        assert!(seen.insert(name), "{name} twice");
        assert!(
            name.starts_with(|c: char| c.is_ascii_lowercase())
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !name.ends_with('_')
                && !name.contains("__"),
            "{name} is not snake_case"
        );
        assert!(!doc.is_empty() && !doc.contains('\n'), "{name}: {doc:?}");
    }
    assert_eq!(feature_index("valid"), Some(6));
    assert_eq!(feature_index("no_such_feature"), None);
}

#[test]
fn the_extractor_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync + Clone>() {}
    shareable::<FeatureExtractor>();
}

#[test]
fn names_and_docs_snapshot() {
    let table: String = FEATURE_NAMES
        .iter()
        .zip(FEATURE_DOCS)
        .map(|(name, doc)| format!("{name}: {doc}\n"))
        .collect();
    insta::assert_snapshot!(table);
}

#[test]
fn extraction_is_fast() {
    let gpu = GpuSpec::h100();
    let pool: Vec<(FeatureExtractor, Vec<State>)> = tasks()
        .iter()
        .enumerate()
        .map(|(i, task)| {
            let states = Sampler::new(task, &gpu, 100 + i as u64).sample_distinct(40);
            (FeatureExtractor::new(task, &gpu), states)
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
    eprintln!("extracted {states} states at {rate:.0} states/s (checksum {checksum})");
    assert!(rate > 10_000.0, "only {rate:.0} states/s");
}
