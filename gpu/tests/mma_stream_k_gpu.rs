//! On a real GPU (ignored in CI): stream-K states of the `mma.sync` sketch
//! (`MmaTiling::stream_k`) on `resnet`'s small-grid layers — 3×3 at 7² and 14² and a
//! 1×1 at 7², at batch 1 and 8, into half outputs, with bias and ReLU, in fp16 and bf16
//! — fixed and sampled, beside the same tilings split, pass the exact check against the
//! reference kernel before and after they are timed (each launch leaves its workspace
//! zeroed); each one's time is printed. Needs NVRTC and a GPU.

mod common;

use gpu::timing::{SPIN_PTX, TimingConfig};
use schedule::sketch::mma_sync::MmaTiling;
use schedule::state::SplitSums;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, parse_shape};

fn task(shape: &str, epilogue: Epilogue, dtype: DType) -> Task {
    Task::new(parse_shape("conv2d", shape).expect("shape"), epilogue)
        .expect("task")
        .with_types(dtype, dtype, Layout::Nhwc)
        .expect("types")
}

fn tiling(block_m: u32, block_n: u32, warps: (u32, u32), stages: u32, stream_k: u32) -> MmaTiling {
    MmaTiling {
        block_m,
        block_n,
        warps_m: warps.0,
        warps_n: warps.1,
        k_steps: 2,
        stages,
        vector: [8, 8],
        swizzle: true,
        row_span: false,
        persistent: 0,
        stream_k,
    }
}

#[test]
#[ignore = "needs a GPU"]
fn mma_stream_k_states_pass_the_exact_check() {
    let (ctx, device) = common::gpu();
    let spin_module = ctx.load(SPIN_PTX.as_bytes()).expect("spin");
    let spin = spin_module.function("tilesched_spin", 0).expect("spin");
    let timing = TimingConfig {
        min_time_ms: 30.0,
        ..TimingConfig::default()
    };
    let gpu = GpuSpec::h100();
    let bias_relu = Epilogue {
        bias: true,
        relu: true,
    };
    // Each tiling streamed over one and two blocks per SM, then split as the sampler
    // would (atomic sums), for comparison.
    let mut fixed = Vec::new();
    for (t, split) in [
        (tiling(64, 64, (2, 2), 4, 0), 16),
        (tiling(32, 64, (1, 4), 4, 0), 8),
        (tiling(64, 128, (2, 4), 3, 0), 8),
        (tiling(128, 64, (4, 2), 4, 0), 4),
    ] {
        for blocks in [132, 264] {
            fixed.push(State::tensor_core(
                MmaTiling {
                    stream_k: blocks,
                    ..t
                },
                1,
            ));
        }
        let mut s = State::tensor_core(t, split);
        s.split_sums = SplitSums::Atomic;
        fixed.push(s);
    }
    let cases = [
        task("1,512,7,7,512,3,3,1,1", Epilogue::default(), DType::Fp16),
        task("8,512,7,7,512,3,3,1,1", Epilogue::default(), DType::Fp16),
        task("1,256,14,14,256,3,3,1,1", bias_relu, DType::Fp16),
        task("8,2048,7,7,512,1,1,1,0", Epilogue::default(), DType::Fp16),
        task("1,512,7,7,512,3,3,1,1", bias_relu, DType::Bf16),
    ];
    let mut checked = 0;
    let mut streamed = 0;
    for task in cases {
        let c = task.contraction();
        let mut states: Vec<State> = fixed
            .iter()
            .filter(|s| schedule::validate(&c, s, &gpu).is_ok())
            .cloned()
            .collect();
        states.extend(
            Sampler::new(&task, &gpu, 5)
                .sample_distinct(200)
                .into_iter()
                .filter(|s| s.mma().is_some_and(|t| t.stream_k > 0))
                .take(3),
        );
        streamed += states
            .iter()
            .filter(|s| s.mma().is_some_and(|t| t.stream_k > 0))
            .count();
        checked += common::exact_and_timed(&ctx, &device, (&spin, &timing), &task, &states);
    }
    assert!(streamed >= 40, "{streamed} stream-K states checked");
    assert!(checked >= 55, "{checked} states checked");
}
