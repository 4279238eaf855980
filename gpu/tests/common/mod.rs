//! What the gpu crate's GPU tests share: a context and the device's attributes on GPU
//! 0, failing plainly where there is no driver.

use gpu::DeviceInfo;
use gpu::cuda::{self, Context};

/// A context on GPU 0 and its device.
pub fn gpu() -> (Context, DeviceInfo) {
    assert!(cuda::driver_present(), "no CUDA driver on this machine");
    let ctx = Context::new(0).expect("a context on GPU 0");
    let device = DeviceInfo::query(&ctx).expect("device attributes");
    (ctx, device)
}

/// Checks each of `states` of `task` exactly against the reference kernel, times it
/// by the measurement protocol (`spin`, `timing`), checks it again (hundreds of
/// launches later, still exact: each left its workspace zeroed) and prints its time
/// (TFLOP/s), ptxas's registers and local memory, and for clusters how many the GPU
/// runs at once. Panics on any failure; returns how many were checked.
#[allow(dead_code)]
pub fn exact_and_timed(
    ctx: &Context,
    device: &DeviceInfo,
    (spin, timing): (&gpu::cuda::Function<'_>, &gpu::timing::TimingConfig),
    task: &schedule::Task,
    states: &[schedule::State],
) -> usize {
    use gpu::Problem;
    use gpu::buffers::BufferSets;
    use gpu::timing::time_kernel;
    use schedule::reference::reference_kernel;
    let problem = Problem::for_task(task, 5);
    let reference = reference_kernel(task);
    let compiled = gpu::compile(&reference.source, &reference.name, &device.arch())
        .unwrap_or_else(|e| panic!("{task}: reference: {e}"));
    let module = ctx.load(&compiled.cubin).expect("load the reference");
    let function = module.function(&reference.name, 0).expect("reference");
    let sets = BufferSets::new(ctx, &problem, device).expect("buffers");
    let expected = sets
        .run_reference(ctx, &function, &reference.launch)
        .unwrap_or_else(|e| panic!("{task}: {e}"));
    for state in states {
        let what = || format!("{task} {}", state.to_json());
        let k = schedule::generate(task, state, &schedule::GpuSpec::h100())
            .unwrap_or_else(|e| panic!("{}: {e}", what()));
        let arch = k.launch.target.arch(&device.arch());
        let built =
            gpu::compile(&k.source, &k.name, &arch).unwrap_or_else(|e| panic!("{}: {e}", what()));
        let module = ctx.load(&built.cubin).expect("load");
        let f = module
            .function(&k.name, k.launch.dynamic_shared_bytes)
            .expect("function");
        let check = |when: &str| {
            let mismatch = sets
                .check(ctx, &f, &k.launch, &expected)
                .unwrap_or_else(|e| panic!("{}: {e}", what()));
            if let Some(m) = mismatch {
                panic!("{}{when}: {m}", what());
            }
        };
        check("");
        let t = time_kernel(ctx, spin, device.sm_clock_mhz, timing, |i| {
            sets.launch(ctx, &f, &k.launch, i)
        })
        .expect("timing");
        check(" after timing");
        let tflops = task.flops() as f64 / (t.median_us * 1e-6) / 1e12;
        let clusters = if k.launch.cluster.is_one() {
            String::new()
        } else {
            let active = f.max_active_clusters(&k.launch).expect("occupancy");
            format!(", {active} clusters at once")
        };
        println!(
            "{}: exact, {:.2} us ({tflops:.0} TFLOP/s), {} registers, {} bytes local{clusters}",
            what(),
            t.median_us,
            built.resources.registers,
            built.resources.stack_frame_bytes + built.resources.spill_store_bytes
        );
    }
    states.len()
}
