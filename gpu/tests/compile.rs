//! Every state sampled for every `resnet` and `yolo` layer and several matmul and batch
//! matmul shapes validates, generates CUDA and compiles with NVRTC for sm_90, with zero
//! failures; the resources read from the cubin agree with ptxas's own report; almost no
//! kernel needs local memory; the reference kernels of fp16, bf16 and TF32 tasks (half
//! data as raw bits converted by inline PTX) compile too. Needs NVRTC (scripts/setup.sh
//! installs it), not a GPU.

use rayon::prelude::*;
use schedule::reference::reference_kernel;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, Task, generate, network, parse_shape};

const STATES_PER_TASK: usize = 20;

fn tasks() -> Vec<Task> {
    let mut tasks: Vec<Task> = ["resnet", "yolo"]
        .iter()
        .flat_map(|n| network(n, 1).unwrap())
        .map(|w| w.task)
        .collect();
    let extra = [
        ("matmul", "333,777,555", Epilogue::default()),
        (
            "matmul",
            "1024,1024,1024",
            Epilogue {
                bias: true,
                relu: true,
            },
        ),
        ("matmul", "128,3072,768", Epilogue::default()),
        ("batch_matmul", "12,128,128,64", Epilogue::default()),
        (
            "batch_matmul",
            "12,128,64,128",
            Epilogue {
                bias: true,
                relu: false,
            },
        ),
    ];
    tasks.extend(
        extra
            .iter()
            .map(|(op, shape, ep)| Task::new(parse_shape(op, shape).unwrap(), *ep).unwrap()),
    );
    // Grouped and depthwise convolutions, and half data in CUDA-core kernels (tasks
    // without a GEMM view: depthwise, NCHW), widened on the fetch, narrowed on the store.
    let both = Epilogue {
        bias: true,
        relu: true,
    };
    let typed = [
        (
            "c=96,h=56,w=56,k=96,r=3,s=3,stride=2,pad=1,groups=96",
            DType::F32,
            DType::F32,
            Layout::Nchw,
            Epilogue::default(),
        ),
        (
            "c=64,h=28,w=28,k=128,r=3,s=3,pad=1,groups=8",
            DType::F32,
            DType::F32,
            Layout::Nchw,
            both,
        ),
        (
            "c=144,h=56,w=56,k=144,r=3,s=3,pad=1,groups=144",
            DType::Fp16,
            DType::Fp16,
            Layout::Nhwc,
            both,
        ),
        (
            "c=32,h=112,w=112,k=32,r=3,s=3,pad=1,groups=32",
            DType::Bf16,
            DType::F32,
            Layout::Nchw,
            Epilogue::default(),
        ),
        (
            "1,64,28,28,96,1,1,1,0",
            DType::Fp16,
            DType::Fp16,
            Layout::Nchw,
            both,
        ),
    ];
    tasks.extend(typed.iter().map(|(shape, dtype, out, layout, ep)| {
        Task::new(parse_shape("conv2d", shape).unwrap(), *ep)
            .unwrap()
            .with_types(*dtype, *out, *layout)
            .unwrap()
    }));
    tasks
}

/// The register count ptxas prints ("Used N registers").
fn ptxas_registers(log: &str) -> Option<u32> {
    let at = log.find("Used ")?;
    log[at + 5..].split_whitespace().next()?.parse().ok()
}

#[test]
fn sampled_states_of_every_workload_compile_for_sm_90() {
    let gpu = GpuSpec::h100();
    let jobs: Vec<(Task, schedule::State)> = tasks()
        .into_iter()
        .flat_map(|t| {
            let states = Sampler::new(&t, &gpu, 1).sample_distinct(STATES_PER_TASK);
            assert_eq!(states.len(), STATES_PER_TASK, "{t}");
            states.into_iter().map(move |s| (t, s))
        })
        .collect();
    let results: Vec<_> = jobs
        .par_iter()
        .map(|(t, s)| {
            let k = generate(t, s, &gpu).expect("sampled states validate");
            (t, s, gpu::compile(&k.source, &k.name, "sm_90"))
        })
        .collect();
    let mut with_stack = Vec::new();
    for (t, s, result) in &results {
        let compiled = result
            .as_ref()
            .unwrap_or_else(|e| panic!("{t} {} does not compile: {e}", s.to_json()));
        let r = compiled.resources;
        assert_eq!(
            Some(r.registers),
            ptxas_registers(&compiled.log),
            "{}",
            compiled.log
        );
        assert!(r.registers <= 255);
        assert_eq!(
            r.static_shared_bytes, 0,
            "tiles live in dynamic shared memory"
        );
        if r.stack_frame_bytes > 0 {
            with_stack.push(format!("{t} {} {r:?}", s.to_json()));
        }
    }
    // The register model keeps spills rare; ptxas's own occupancy heuristic still picks
    // fewer registers than the launch bound allows for a few states (3% when
    // calibrated). A regression of the model shows up here.
    let allowed = results.len() / 20;
    assert!(
        with_stack.len() <= allowed,
        "{} of {} kernels need local memory:\n{}",
        with_stack.len(),
        results.len(),
        with_stack.join("\n")
    );
}

#[test]
fn a_typical_register_tile_uses_no_local_memory() {
    // 8x8 outputs per thread, 256 threads, K staged 16 at a time: the shape of a
    // classic SGEMM tile.
    let t = Task::new(
        parse_shape("matmul", "1024,1024,1024").unwrap(),
        Epilogue::default(),
    )
    .unwrap();
    let state: schedule::State = serde_json::from_str(
        r#"{"spatial":[{"vthread":2,"thread":16,"outer":1,"inner":4},{"vthread":2,"thread":16,"outer":1,"inner":4}],
            "reduction":[{"middle":2,"inner":8}],"unroll_max_step":1024,"vector_width":[4,4]}"#,
    )
    .unwrap();
    let k = generate(&t, &state, &GpuSpec::h100()).unwrap();
    let c = gpu::compile(&k.source, &k.name, "sm_90").unwrap();
    assert_eq!(c.resources.stack_frame_bytes, 0, "{}", c.log);
    assert!(
        c.resources.registers >= 64,
        "64 accumulators live in registers"
    );
}

#[test]
fn source_errors_come_back_with_the_log() {
    let err = gpu::compile(
        "extern \"C\" __global__ void k() { undefined_thing; }",
        "k",
        "sm_90",
    )
    .unwrap_err();
    match err {
        gpu::CompileError::Source { log } => assert!(log.contains("undefined_thing"), "{log}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        gpu::compile("", "k", "compute_90"),
        Err(gpu::CompileError::Arch(_))
    ));
}

#[test]
fn nvrtc_reports_cuda_13() {
    let (major, _) = gpu::nvrtc_lib::version().unwrap();
    assert_eq!(major, 13);
}

#[test]
fn reference_kernels_of_every_element_type_compile_for_sm_90() {
    let bias_relu = Epilogue {
        bias: true,
        relu: true,
    };
    let conv = Task::new(
        parse_shape("conv2d", "1,64,56,56,128,3,3,2,1").unwrap(),
        bias_relu,
    )
    .unwrap();
    let matmul = Task::new(parse_shape("matmul", "333,777,555").unwrap(), bias_relu).unwrap();
    let batch = Task::new(
        parse_shape("batch_matmul", "12,128,64,128").unwrap(),
        Epilogue::default(),
    )
    .unwrap();
    let typed = [
        (conv, DType::Fp16, DType::Fp16),
        (conv, DType::Fp16, DType::F32),
        (conv, DType::Bf16, DType::Bf16),
        (conv, DType::Bf16, DType::F32),
        (conv, DType::Tf32, DType::F32),
        (matmul, DType::Fp16, DType::Fp16),
        (matmul, DType::Fp16, DType::F32),
        (batch, DType::Fp16, DType::Fp16),
    ];
    for (task, dtype, out_dtype) in typed {
        let task = task.with_types(dtype, out_dtype, Layout::Nhwc).unwrap();
        let k = reference_kernel(&task);
        let compiled = gpu::compile(&k.source, &k.name, "sm_90")
            .unwrap_or_else(|e| panic!("{task}: {e}\n{}", k.source));
        assert_eq!(compiled.resources.stack_frame_bytes, 0, "{task}");
    }
}
