//! On a real Hopper GPU (ignored in CI): `wgmma` states of odd, batched, fused,
//! bf16, TF32 and convolution tasks (1×1, and im2col walks with stride, dilation,
//! groups and split-K; clusters (pairs and rectangles), raster bands and stream-K among
//! them),
//! compiled for `sm_90a`, launched with their tensor maps through the one launch rule (`BufferSets::launch`), pass the exact check against
//! the reference kernel, and again after they were timed (split-K and stream-K states
//! take a workspace that every launch must leave zeroed). Each state's time by the measurement protocol is printed
//! (TFLOP/s), with ptxas's registers and local memory. Needs NVRTC and an sm_90 GPU.

mod common;

use gpu::timing::{SPIN_PTX, TimingConfig};
use schedule::state::WgmmaTiling;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, parse_shape};

fn task(op: &str, shape: &str, epilogue: Epilogue, types: (DType, DType)) -> Task {
    Task::new(parse_shape(op, shape).expect("shape"), epilogue)
        .expect("task")
        .with_types(types.0, types.1, Layout::Nhwc)
        .expect("types")
}

/// States to run on `task`: `sampled` wgmma states drawn for it, then the `fixed`
/// ones that validate.
fn states(task: &Task, sampled: usize, fixed: &[State]) -> Vec<State> {
    let gpu = GpuSpec::h100();
    let mut out: Vec<State> = Sampler::new(task, &gpu, 3)
        .sample_distinct(8 * sampled)
        .into_iter()
        .filter(|s| s.wgmma().is_some())
        .take(sampled)
        .collect();
    let c = task.contraction();
    out.extend(
        fixed
            .iter()
            .filter(|s| schedule::validate(&c, s, &gpu).is_ok())
            .cloned(),
    );
    out
}

fn tiling(consumers: u32, m_atoms: u32, block_n: u32, stages: u32) -> WgmmaTiling {
    WgmmaTiling {
        consumers,
        m_atoms,
        block_n,
        k_bytes: 128,
        stages,
        in_flight: 1,
        persistent: 0,
        producer_warp: 0,
        raster: 0,
        cluster: 0,
        cluster_m: 0,
        tma_store: 0,
        stream_k: 0,
    }
}

#[test]
#[ignore = "needs a Hopper GPU"]
fn sampled_wgmma_states_pass_the_exact_check() {
    let (ctx, device) = common::gpu();
    let spin_module = ctx.load(SPIN_PTX.as_bytes()).expect("spin");
    let spin = spin_module.function("tilesched_spin", 0).expect("spin");
    let fp16 = (DType::Fp16, DType::Fp16);
    let tf32 = (DType::Tf32, DType::F32);
    let bias_relu = Epilogue {
        bias: true,
        relu: true,
    };
    let persistent = |t: WgmmaTiling| WgmmaTiling {
        persistent: 132,
        ..t
    };
    let specialized = |t: WgmmaTiling| WgmmaTiling {
        producer_warp: 1,
        ..t
    };
    let banded = |t: WgmmaTiling, raster| WgmmaTiling { raster, ..t };
    let stored = |t: WgmmaTiling| WgmmaTiling { tma_store: 1, ..t };
    let paired = |t: WgmmaTiling, raster| WgmmaTiling {
        cluster: 2,
        raster,
        ..t
    };
    let big = [
        tiling(2, 1, 256, 4),
        tiling(2, 1, 128, 5),
        tiling(2, 2, 128, 4),
        tiling(2, 1, 192, 4),
        tiling(1, 2, 256, 3),
        persistent(tiling(2, 1, 256, 4)),
        persistent(tiling(2, 2, 128, 4)),
        persistent(tiling(2, 1, 192, 4)),
        specialized(tiling(2, 1, 256, 4)),
        specialized(tiling(2, 2, 128, 4)),
        specialized(persistent(tiling(2, 1, 256, 4))),
        specialized(persistent(tiling(2, 2, 128, 4))),
        // The epilogue of TMA stores.
        stored(tiling(2, 1, 256, 4)),
        stored(specialized(persistent(tiling(2, 1, 256, 4)))),
        stored(specialized(persistent(tiling(2, 2, 128, 4)))),
        // Grouped rasterization, plain and persistent.
        banded(tiling(2, 2, 128, 4), 4),
        banded(persistent(tiling(2, 2, 128, 4)), 8),
        banded(persistent(tiling(2, 1, 256, 4)), 16),
        // Clusters of two: pairs along N sharing A, down a band sharing B.
        paired(tiling(2, 2, 128, 4), 0),
        paired(persistent(tiling(2, 2, 128, 4)), 0),
        paired(banded(persistent(tiling(2, 1, 256, 4)), 16), 16),
        paired(specialized(banded(tiling(2, 1, 256, 4), 8)), 8),
    ];
    // Split-K through the workspace: decode-sized and small GEMMs, chunks short and
    // past K, persistent blocks over units.
    let split = |t: WgmmaTiling, split_k| State {
        split_k,
        ..State::hopper(t)
    };
    let mut fixed: Vec<State> = big.iter().map(|t| State::hopper(*t)).collect();
    fixed.extend([
        split(tiling(1, 1, 64, 4), 4),
        split(tiling(1, 1, 64, 6), 8),
        split(specialized(tiling(1, 1, 128, 4)), 4),
        split(tiling(1, 1, 32, 8), 2),
        split(persistent(tiling(1, 1, 64, 4)), 8),
        split(tiling(2, 1, 64, 4), 3),
        // Clusters of rectangles sharing both tiles (grids padded to whole clusters),
        // unsplit and split.
        State::hopper(tiling(1, 1, 64, 4).with_cluster_shape(2, 4)),
        State::hopper(tiling(1, 1, 128, 4).with_cluster_shape(2, 2)),
        State::hopper(persistent(tiling(1, 1, 64, 4)).with_cluster_shape(4, 2)),
        State::hopper(tiling(2, 1, 128, 4).with_cluster_shape(1, 4)),
        split(tiling(1, 1, 64, 4).with_cluster_shape(2, 4), 2),
        split(tiling(1, 1, 64, 6).with_cluster_shape(2, 2), 4),
        // Stream-K over one block per SM, two, and an odd count; two consumers; a
        // producer warp.
        State::hopper(tiling(1, 1, 64, 8).streamed(132)),
        State::hopper(tiling(1, 1, 64, 4).streamed(264)),
        State::hopper(tiling(1, 1, 128, 4).streamed(97)),
        State::hopper(tiling(2, 1, 64, 4).streamed(132)),
        State::hopper(specialized(tiling(1, 1, 64, 8)).streamed(132)),
    ]);
    let cases = [
        (task("matmul", "200,136,264", Epilogue::default(), fp16), 6),
        (task("matmul", "256,512,128", bias_relu, fp16), 4),
        (
            task(
                "matmul",
                "96,160,320",
                Epilogue::default(),
                (DType::Bf16, DType::Bf16),
            ),
            4,
        ),
        (
            task(
                "matmul",
                "128,64,256",
                Epilogue::default(),
                (DType::Fp16, DType::F32),
            ),
            3,
        ),
        (
            task("batch_matmul", "3,96,80,64", Epilogue::default(), fp16),
            4,
        ),
        (task("conv2d", "2,64,14,14,96,1,1,1,0", bias_relu, fp16), 4),
        (
            task("matmul", "4096,4096,4096", Epilogue::default(), fp16),
            2,
        ),
        (
            task("matmul", "2048,14336,4096", Epilogue::default(), fp16),
            0,
        ),
        (task("matmul", "16,4096,4096", Epilogue::default(), fp16), 2),
        (task("matmul", "128,768,3072", bias_relu, fp16), 2),
        // Convolutions through TMA's im2col mode (issue 30): 3×3 at batch 1 and 8,
        // stride 2, the deep 7×7 layer (split-K states among the fixed ones, into a half
        // output), groups, dilation, a 1×1 stride-2 downsample.
        (
            task("conv2d", "1,64,56,56,64,3,3,1,1", Epilogue::default(), fp16),
            3,
        ),
        (
            task("conv2d", "1,128,56,56,128,3,3,2,1", bias_relu, fp16),
            3,
        ),
        (task("conv2d", "1,512,7,7,512,3,3,1,1", bias_relu, fp16), 3),
        (
            task(
                "conv2d",
                "8,256,14,14,256,3,3,1,1",
                Epilogue::default(),
                fp16,
            ),
            3,
        ),
        (
            task(
                "conv2d",
                "n=1,c=256,h=14,w=14,k=256,r=3,s=3,pad=1,groups=32",
                Epilogue::default(),
                (DType::Bf16, DType::Bf16),
            ),
            3,
        ),
        (
            task(
                "conv2d",
                "n=1,c=64,h=28,w=28,k=64,r=3,s=3,pad=2,dilation=2",
                Epilogue::default(),
                fp16,
            ),
            2,
        ),
        (
            task(
                "conv2d",
                "1,256,56,56,512,1,1,2,0",
                Epilogue::default(),
                fp16,
            ),
            2,
        ),
        // TF32 (k8 on f32 data): 1×1 convolutions, whose weights are K-major.
        (task("conv2d", "2,72,14,14,96,1,1,1,0", bias_relu, tf32), 4),
        (
            task(
                "conv2d",
                "8,256,28,28,512,1,1,1,0",
                Epilogue::default(),
                tf32,
            ),
            2,
        ),
    ];
    let timing = TimingConfig {
        min_time_ms: 30.0,
        ..TimingConfig::default()
    };
    let mut checked = 0;
    // TILESCHED_SKETCH_TASKS: only the tasks whose key contains one of these
    // comma-separated substrings (for focused experiments).
    let only = std::env::var("TILESCHED_SKETCH_TASKS").ok();
    let wanted = |task: &Task| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|s| task.key().contains(s)))
    };
    for (task, sampled) in cases.into_iter().filter(|(t, _)| wanted(t)) {
        let states = states(&task, sampled, &fixed);
        checked += common::exact_and_timed(&ctx, &device, (&spin, &timing), &task, &states);
    }
    assert!(only.is_some() || checked >= 35, "{checked} states checked");
}
