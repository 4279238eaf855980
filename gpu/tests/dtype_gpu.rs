//! On a real GPU (ignored in CI): the reference kernels of half-precision tasks, run on
//! the measurement buffers (inputs encoded in the task's type, output poisoned with the
//! NaN of its type), give exactly the definition evaluated on the CPU and rounded to the
//! output type; the exact check passes the reference against itself; an output that
//! nothing writes reads back as NaN in its own type. Needs NVRTC and a GPU.

mod common;

use gpu::buffers::BufferSets;
use gpu::check::first_mismatch;
use gpu::cuda::CudaError;
use gpu::{Problem, element};
use schedule::reference::reference_kernel;
use schedule::{DType, Epilogue, Layout, Task, interp, parse_shape};

fn task(op: &str, shape: &str, epilogue: Epilogue, types: (DType, DType)) -> Task {
    Task::new(parse_shape(op, shape).expect("shape"), epilogue)
        .expect("task")
        .with_types(types.0, types.1, Layout::Nhwc)
        .expect("types")
}

#[test]
#[ignore = "needs a GPU"]
fn half_reference_kernels_compute_the_definition() {
    let (ctx, device) = common::gpu();
    let bias_relu = Epilogue {
        bias: true,
        relu: true,
    };
    let cases = [
        // Padding, stride 1, bias and ReLU, half output.
        task(
            "conv2d",
            "2,32,9,9,16,3,3,1,1",
            bias_relu,
            (DType::Fp16, DType::Fp16),
        ),
        // A reduction long enough that bf16's inputs are sparse (density 0.63).
        task(
            "matmul",
            "48,40,4608",
            Epilogue::default(),
            (DType::Bf16, DType::Bf16),
        ),
        // bf16 data with an f32 output: dense inputs in -3..=3.
        task(
            "matmul",
            "48,40,300",
            Epilogue::default(),
            (DType::Bf16, DType::F32),
        ),
    ];
    for task in cases {
        let problem = Problem::for_task(&task, 11);
        let k = reference_kernel(&task);
        let compiled = gpu::compile(&k.source, &k.name, &device.arch())
            .unwrap_or_else(|e| panic!("{task}: {e}"));
        let module = ctx.load(&compiled.cubin).expect("load the reference");
        let function = module.function(&k.name, 0).expect("the reference kernel");
        let sets = BufferSets::new(&ctx, &problem, &device).expect("buffers");
        let got = sets
            .run_reference(&ctx, &function, &k.launch)
            .unwrap_or_else(|e| panic!("{task}: {e}"));

        let values = problem.input_values();
        let inputs = interp::Inputs {
            inputs: [&values[0], &values[1]],
            bias: values.get(2).map(Vec::as_slice),
        };
        let exact = interp::reference(&task.contraction(), &inputs);
        // The kernel's last step: round to the output type.
        let expected = element::decode(&element::encode(&exact, task.out_dtype), task.out_dtype);
        assert_eq!(
            expected, exact,
            "{task}: the CPU sums are exact in the output type"
        );
        if let Some(m) = first_mismatch(&expected, &got) {
            panic!("{task}: {m}");
        }
        assert!(got.iter().any(|v| *v != 0.0), "{task}: all zero");

        let again = sets
            .check(&ctx, &function, &k.launch, &got)
            .expect("the check runs");
        assert_eq!(again, None, "{task}: the reference against itself");

        let untouched = sets
            .output_of(&ctx, |_| Ok::<(), CudaError>(()))
            .expect("poison and download");
        assert!(untouched.iter().all(|v| v.is_nan()), "{task}");
        let size = task.out_dtype.bytes() as usize;
        let nan = &element::nan_bits(task.out_dtype).to_le_bytes()[..size];
        let raw = ctx.download_bytes(sets.output(0)).expect("raw output");
        assert_eq!(raw.len(), problem.output * size);
        assert!(raw.chunks_exact(size).all(|c| c == nan), "{task}");
    }
}
