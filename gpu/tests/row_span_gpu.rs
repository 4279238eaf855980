//! On a real GPU (ignored in CI): row-span states (`MmaTiling::row_span`) of few-channel
//! convolutions — the ResNet stem at batch 1 and 8 in fp16 and bf16, C = 4 at stride 1,
//! output rows that are not whole 16-pixel groups, split-K into a half output,
//! persistent grids — fixed and sampled, compiled for the GPU, pass the exact check
//! against the reference kernel before and after they are timed; each one's time is
//! printed. Needs NVRTC and a GPU.

mod common;

use gpu::timing::{SPIN_PTX, TimingConfig};
use schedule::sketch::mma_sync::MmaTiling;
use schedule::state::SplitSums;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, parse_shape};

fn task(shape: &str, epilogue: Epilogue, types: (DType, DType)) -> Task {
    Task::new(parse_shape("conv2d", shape).expect("shape"), epilogue)
        .expect("task")
        .with_types(types.0, types.1, Layout::Nhwc)
        .expect("types")
}

fn span(block_m: u32, block_n: u32, warps: (u32, u32), k_steps: u32, stages: u32) -> MmaTiling {
    MmaTiling {
        block_m,
        block_n,
        warps_m: warps.0,
        warps_n: warps.1,
        k_steps,
        stages,
        vector: [8, 1],
        swizzle: true,
        row_span: true,
        persistent: 0,
        stream_k: 0,
    }
}

#[test]
#[ignore = "needs a GPU"]
fn row_span_states_pass_the_exact_check() {
    let (ctx, device) = common::gpu();
    let spin_module = ctx.load(SPIN_PTX.as_bytes()).expect("spin");
    let spin = spin_module.function("tilesched_spin", 0).expect("spin");
    let timing = TimingConfig {
        min_time_ms: 30.0,
        ..TimingConfig::default()
    };
    let gpu = GpuSpec::h100();
    let fp16 = (DType::Fp16, DType::Fp16);
    let bias_relu = Epilogue {
        bias: true,
        relu: true,
    };
    let tilings = [
        span(64, 64, (4, 1), 2, 2),
        span(64, 64, (2, 2), 2, 3),
        span(128, 64, (4, 2), 2, 3),
        span(128, 64, (8, 1), 2, 4),
        span(128, 32, (4, 1), 2, 3),
        span(256, 64, (8, 1), 2, 3),
        span(256, 64, (4, 2), 2, 2),
        span(128, 64, (4, 2), 4, 3),
        span(112, 64, (7, 1), 2, 3),
    ];
    let mut fixed: Vec<State> = tilings.iter().map(|t| State::tensor_core(*t, 1)).collect();
    // Persistent grids: weights read once per block, 1 to 3 blocks per SM.
    for (t, blocks) in [
        (span(128, 64, (4, 2), 2, 3), 132),
        (span(128, 64, (4, 2), 2, 3), 264),
        (span(128, 64, (8, 1), 2, 4), 396),
        (span(128, 32, (4, 1), 2, 3), 264),
        (span(256, 64, (8, 1), 2, 3), 132),
        (span(128, 64, (4, 2), 2, 3), 66),
    ] {
        fixed.push(State::tensor_core(
            MmaTiling {
                persistent: blocks,
                ..t
            },
            1,
        ));
    }
    for split in [2, 7] {
        let mut s = State::tensor_core(span(128, 64, (4, 2), 2, 3), split);
        s.split_sums = SplitSums::Atomic;
        fixed.push(s);
    }
    let cases = [
        (task("1,3,224,224,64,7,7,2,3", Epilogue::default(), fp16), 4),
        (task("8,3,224,224,64,7,7,2,3", Epilogue::default(), fp16), 4),
        (
            task(
                "1,3,224,224,64,7,7,2,3",
                bias_relu,
                (DType::Bf16, DType::Bf16),
            ),
            2,
        ),
        (task("1,4,56,56,32,3,3,1,1", bias_relu, fp16), 2),
        (task("2,3,30,40,24,7,7,2,3", bias_relu, fp16), 2),
    ];
    let mut checked = 0;
    for (task, sampled) in cases {
        let c = task.contraction();
        let mut states: Vec<State> = fixed
            .iter()
            .filter(|s| schedule::validate(&c, s, &gpu).is_ok())
            .cloned()
            .collect();
        states.extend(
            Sampler::new(&task, &gpu, 3)
                .sample_distinct(30)
                .into_iter()
                .filter(|s| s.mma().is_some_and(|t| t.row_span))
                .take(sampled),
        );
        assert!(states.len() > sampled, "{task}: {} states", states.len());
        checked += common::exact_and_timed(&ctx, &device, (&spin, &timing), &task, &states);
    }
    assert!(checked >= 45, "{checked} states checked");
}
