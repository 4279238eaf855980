//! Every tensor-core state sampled for every `resnet` layer (NHWC) and several matmul
//! shapes, in each tensor-core type, validates, generates CUDA (inline PTX: cp.async,
//! ldmatrix, mma.sync) and compiles with NVRTC for sm_90, almost always with no local
//! memory — the copy-round cap and the register estimate keep the sampled tiles
//! spill-free, except where ptxas's occupancy heuristic caps a one-warp block at 128
//! registers (seen: 2 of 96 fp16 kernels with 8-byte frames), the stem's row-span
//! states among them (and stream-K states are sampled too); sampled `wgmma` states
//! likewise for sm_90a. Needs NVRTC
//! (scripts/setup.sh installs it), not a GPU.

use rayon::prelude::*;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, generate, network};

const STATES_PER_TASK: usize = 6;

fn tasks(dtype: DType) -> Vec<Task> {
    let mut tasks: Vec<Task> = network("resnet", 1)
        .unwrap()
        .into_iter()
        .map(|w| w.task)
        .collect();
    for (op, shape) in [
        ("matmul", "333,777,555"),
        ("matmul", "128,3072,768"),
        ("batch_matmul", "12,128,128,64"),
    ] {
        tasks.push(
            Task::new(
                schedule::parse_shape(op, shape).unwrap(),
                Epilogue::default(),
            )
            .unwrap(),
        );
    }
    tasks
        .into_iter()
        .map(|t| t.with_types(dtype, DType::F32, Layout::Nhwc).unwrap())
        .collect()
}

/// Generates and compiles every job with NVRTC (each for its launch's target on
/// `sm_90`): all compile, and at most one in twenty needs local memory.
fn compile_without_local_memory(dtype: DType, jobs: &[(Task, State)]) {
    let gpu = GpuSpec::h100();
    let results: Vec<(String, Result<gpu::CompiledKernel, gpu::CompileError>)> = jobs
        .par_iter()
        .map(|(t, s)| {
            let k = generate(t, s, &gpu).expect("sampled states validate");
            let arch = k.launch.target.arch("sm_90");
            (
                format!("{t} {}", s.to_json()),
                gpu::compile(&k.source, &k.name, &arch),
            )
        })
        .collect();
    let mut stacks = Vec::new();
    for (what, result) in &results {
        let c = result
            .as_ref()
            .unwrap_or_else(|e| panic!("{dtype}: {what} does not compile: {e}"));
        if c.resources.stack_frame_bytes > 0 {
            stacks.push(format!("{what}: {:?}", c.resources));
        }
    }
    assert!(
        stacks.len() <= results.len() / 20,
        "{dtype}: {} of {} kernels need local memory:\n{}",
        stacks.len(),
        results.len(),
        stacks.join("\n")
    );
}

#[test]
fn sampled_tensor_core_states_compile_for_sm_90_without_local_memory() {
    let gpu = GpuSpec::h100();
    for dtype in [DType::Fp16, DType::Bf16, DType::Tf32] {
        let jobs: Vec<(Task, State)> = tasks(dtype)
            .into_iter()
            .flat_map(|t| {
                let states: Vec<State> = Sampler::new(&t, &gpu, 3)
                    .sample_distinct(3 * STATES_PER_TASK)
                    .into_iter()
                    .filter(|s| s.mma().is_some())
                    .take(STATES_PER_TASK)
                    .collect();
                assert!(states.len() >= STATES_PER_TASK / 2, "{t}: {}", states.len());
                states.into_iter().map(move |s| (t, s))
            })
            .collect();
        // The stem draws row spans (raw input-row runs, 32-bit fragment loads).
        let spans = jobs
            .iter()
            .filter(|(_, s)| s.mma().is_some_and(|t| t.row_span))
            .count();
        assert!(
            dtype == DType::Tf32 || spans > 0,
            "{dtype}: no row-span state sampled"
        );
        // The small layers draw stream-K (each fill's coordinates per K tile).
        let streams = jobs
            .iter()
            .filter(|(_, s)| s.mma().is_some_and(|t| t.stream_k > 0))
            .count();
        assert!(streams > 0, "{dtype}: no stream-K state sampled");
        compile_without_local_memory(dtype, &jobs);
    }
}

/// Sampled `wgmma` states of the matmul shapes, a batch matmul and every
/// `resnet` layer TMA can read (NHWC: the 1×1 stride-1 ones as matrices, the others
/// through im2col walks; all but the stem, whose 3-channel pixels are 6 bytes apart; in
/// fp16 and bf16, and in TF32, whose instruction needs the K-major weights) compile with
/// NVRTC for `sm_90a` (descriptors, TMA, mbarriers, clusters, stream-K, inline PTX), almost always
/// with no local memory.
#[test]
fn sampled_wgmma_states_compile_for_sm_90a_without_local_memory() {
    let gpu = GpuSpec::h100();
    for dtype in [DType::Fp16, DType::Bf16, DType::Tf32] {
        let out = if dtype == DType::Tf32 {
            DType::F32
        } else {
            dtype
        };
        let applies = |t: &Task| schedule::sketch::wgmma::wgmma_applies(&t.contraction(), &gpu);
        let mut tasks: Vec<Task> = network("resnet", 1)
            .unwrap()
            .into_iter()
            .map(|w| w.task.with_types(dtype, out, Layout::Nhwc).unwrap())
            .filter(|t| {
                schedule::sketch::wgmma::TmaGemm::of(&t.contraction()).is_ok() && applies(t)
            })
            .collect();
        for (op, shape) in [
            ("matmul", "4096,4096,4096"),
            ("matmul", "2048,14336,4096"),
            ("matmul", "16,4096,4096"),
            ("matmul", "128,768,3072"),
            ("batch_matmul", "12,128,128,64"),
        ] {
            let task = Task::new(
                schedule::parse_shape(op, shape).unwrap(),
                Epilogue::default(),
            )
            .unwrap();
            let task = task.with_types(dtype, out, Layout::Nhwc).unwrap();
            if applies(&task) {
                tasks.push(task);
            }
        }
        let sampled: Vec<(Task, Vec<State>)> = tasks
            .into_iter()
            .map(|t| {
                let states: Vec<State> = Sampler::new(&t, &gpu, 5)
                    .sample_distinct(6 * STATES_PER_TASK)
                    .into_iter()
                    .filter(|s| s.wgmma().is_some())
                    .take(STATES_PER_TASK / 2)
                    .collect();
                (t, states)
            })
            .filter(|(_, states)| !states.is_empty())
            .collect();
        let least = if dtype == DType::Tf32 { 12 } else { 17 };
        assert!(sampled.len() >= least, "{dtype}: {} tasks", sampled.len());
        let jobs: Vec<(Task, State)> = sampled
            .into_iter()
            .flat_map(|(t, states)| states.into_iter().map(move |s| (t, s)))
            .collect();
        // Clusters (multicast copies, remote arrivals, cluster barriers) among them, pairs
        // and rectangles of a given shape.
        let clustered = jobs
            .iter()
            .filter(|(_, s)| s.wgmma().is_some_and(|t| t.cluster > 1))
            .count();
        assert!(clustered > 0, "{dtype}: no clustered state sampled");
        let rectangles = jobs
            .iter()
            .filter(|(_, s)| s.wgmma().is_some_and(|t| t.cluster_m > 0))
            .count();
        assert!(
            rectangles > 0,
            "{dtype}: no cluster of a given shape sampled"
        );
        // Stream-K (runs of K tiles across tiles, segment results inside the loop).
        let streamed = jobs
            .iter()
            .filter(|(_, s)| s.wgmma().is_some_and(|t| t.stream_k > 0))
            .count();
        assert!(streamed > 0, "{dtype}: no stream-K state sampled");
        compile_without_local_memory(dtype, &jobs);
    }
}
