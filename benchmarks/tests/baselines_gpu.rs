//! The vendor baselines on a real GPU: library discovery loads the newest copy (and the
//! version it reports is the one its files state), each dtype's cuDNN and cuBLAS /
//! cuBLASLt routine agrees exactly with a CPU reference on small-integer inputs (sums
//! stay far inside every type's exact range), every engine of cuDNN's graph API that the
//! baseline would time does too (fused bias and ReLU, a half input with a float32
//! output, groups, dilation, asymmetric padding), as do cuBLASLt's epilogues and 1×1
//! convolutions run as GEMMs, and the `mma.sync` peaks run.
//!
//! Run on the GPU machine with `--ignored --test-threads 1 --nocapture` (the printed
//! routines, candidates and versions are the record of what ran).

use benchmarks::baseline::{self, Choices, Protocol};
use benchmarks::host;
use benchmarks::peaks;
use benchmarks::vendor::{self, Library};
use gpu::DeviceInfo;
use gpu::cuda::{Buffer, Context};
use gpu::timing::{SPIN_PTX, TimingConfig};
use schedule::task::Conv2d;
use schedule::{DType, Epilogue, Layout, Operator, Task};

/// Integers in `[-range, range]` from a fixed-seed generator.
fn values(len: usize, range: i32, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = ((state >> 33) % (2 * range as u64 + 1)) as i32 - range;
            r as f32
        })
        .collect()
}

fn quick() -> TimingConfig {
    TimingConfig {
        warmup: 1,
        min_time_ms: 1.0,
        min_repeats: 3,
        max_repeats: 50,
        race_us: None,
        precision: None,
    }
}

fn context() -> (Context, DeviceInfo) {
    let ctx = Context::new(0).expect("a GPU");
    let device = DeviceInfo::query(&ctx).expect("device info");
    (ctx, device)
}

fn load(lib: Library) {
    let loaded = vendor::load_library(lib, None).expect("the vendor library loads");
    println!(
        "{} from {} (files say {:?}; chosen from {:?})",
        lib.name(),
        loaded.dir.display(),
        loaded.file_version,
        loaded
            .found
            .iter()
            .map(|c| (c.dir.display().to_string(), c.version, c.on_loader_path))
            .collect::<Vec<_>>()
    );
}

/// Prepares `task`'s baseline on the given operands, runs it once on a poisoned output
/// and returns the output as f32 values, with the routine's description.
fn run_baseline(
    ctx: &Context,
    device: &DeviceInfo,
    task: &Task,
    operands: [&Buffer; 3],
    out_len: usize,
) -> (Vec<f32>, String) {
    run_baseline_with(ctx, device, task, (operands, None), out_len, 1)
}

/// `run_baseline` with a bias and `handles` legacy cuDNN handles (0: the graph API alone).
fn run_baseline_with(
    ctx: &Context,
    device: &DeviceInfo,
    task: &Task,
    (operands, bias): ([&Buffer; 3], Option<&Buffer>),
    out_len: usize,
    handles: usize,
) -> (Vec<f32>, String) {
    let spin_module = ctx.load(SPIN_PTX.as_bytes()).unwrap();
    let spin = spin_module.function("tilesched_spin", 0).unwrap();
    let protocol = Protocol {
        ctx,
        spin: &spin,
        sm_clock_mhz: device.sm_clock_mhz,
        timing: quick(),
    };
    let choices = Choices {
        engines: 8,
        algorithms: 8,
        handles,
        lt_algorithms: 4,
        // The graph-API tests (`handles` 0) check cuDNN alone.
        conv_gemm_algorithms: if handles == 0 { 0 } else { 4 },
    };
    let prepared = baseline::prepare(&protocol, task, &|_| (operands, bias), choices)
        .unwrap_or_else(|e| panic!("{}: {e}", task.key()));
    println!(
        "{}: {} ({} timed)",
        task.key(),
        prepared.baseline.describe(),
        prepared.timed
    );
    for line in &prepared.candidates {
        println!("  {line}");
    }
    ctx.poison(operands[2]).unwrap();
    prepared.baseline.run((operands, bias)).unwrap();
    ctx.synchronize().unwrap();
    let got = host::download(ctx, operands[2], out_len, task.out_dtype).unwrap();
    (got, prepared.baseline.describe())
}

fn conv_task(dtype: DType, layout: Layout) -> (Task, Conv2d) {
    let shape = Conv2d {
        n: 2,
        c: 16,
        h: 9,
        w: 10,
        k: 24,
        r: 3,
        s: 3,
        stride_h: 1,
        stride_w: 2,
        pad_h: 1,
        pad_w: 1,
        dilation_h: 1,
        dilation_w: 1,
        pad_bottom: None,
        pad_right: None,
        groups: 1,
    };
    let task = Task {
        op: Operator::Conv2d(shape),
        epilogue: Epilogue::default(),
        dtype,
        out_dtype: dtype,
        layout,
    };
    (task, shape)
}

/// The convolution on the CPU, in `layout` (NCHW/KCRS/NKPQ or NHWC/KRSC/NPQK).
fn conv_reference(s: &Conv2d, layout: Layout, x: &[f32], w: &[f32]) -> Vec<f32> {
    let (p, q) = s.output_size().unwrap();
    let (n, c, h, wd, k, r, ss) = (s.n, s.c, s.h, s.w, s.k, s.r, s.s);
    let xi = |b: u32, ci: u32, y: u32, xx: u32| match layout {
        Layout::Nchw => (((b * c + ci) * h + y) * wd + xx) as usize,
        Layout::Nhwc => (((b * h + y) * wd + xx) * c + ci) as usize,
    };
    // Grouped: output channel ki reads the C/G input channels of its group.
    let (cg, kg) = (c / s.groups, k / s.groups);
    let wi = |ki: u32, ci: u32, ri: u32, si: u32| match layout {
        Layout::Nchw => (((ki * cg + ci) * r + ri) * ss + si) as usize,
        Layout::Nhwc => (((ki * r + ri) * ss + si) * cg + ci) as usize,
    };
    let yi = |b: u32, ki: u32, pi: u32, qi: u32| match layout {
        Layout::Nchw => (((b * k + ki) * p + pi) * q + qi) as usize,
        Layout::Nhwc => (((b * p + pi) * q + qi) * k + ki) as usize,
    };
    let mut y = vec![0.0f32; (n * k * p * q) as usize];
    for b in 0..n {
        for ki in 0..k {
            for pi in 0..p {
                for qi in 0..q {
                    let mut acc = 0.0f64;
                    let first = (ki / kg) * cg;
                    for cj in 0..cg {
                        let ci = first + cj;
                        for ri in 0..r {
                            for si in 0..ss {
                                let iy = (pi * s.stride_h + ri * s.dilation_h) as i64
                                    - i64::from(s.pad_h);
                                let ix = (qi * s.stride_w + si * s.dilation_w) as i64
                                    - i64::from(s.pad_w);
                                if iy < 0 || ix < 0 || iy >= i64::from(h) || ix >= i64::from(wd) {
                                    continue;
                                }
                                acc += f64::from(x[xi(b, ci, iy as u32, ix as u32)])
                                    * f64::from(w[wi(ki, cj, ri, si)]);
                            }
                        }
                    }
                    y[yi(b, ki, pi, qi)] = acc as f32;
                }
            }
        }
    }
    y
}

fn check_conv(dtype: DType, layout: Layout) {
    let (ctx, device) = context();
    load(Library::Cudnn);
    let (task, s) = conv_task(dtype, layout);
    let (p, q) = s.output_size().unwrap();
    let x = values((s.n * s.c * s.h * s.w) as usize, 2, 1);
    let w = values((s.k * s.c * s.r * s.s) as usize, 2, 2);
    // |sum| <= 16·9·4 = 576: exact in fp16 (2048) and f32; bf16 is not tested here.
    let expected = conv_reference(&s, layout, &x, &w);
    let xb = host::upload(&ctx, &x, dtype).unwrap();
    let wb = host::upload(&ctx, &w, dtype).unwrap();
    let out_len = (s.n * s.k * p * q) as usize;
    let yb = host::alloc(&ctx, out_len, task.out_dtype).unwrap();
    let (got, routine) = run_baseline(&ctx, &device, &task, [&xb, &wb, &yb], out_len);
    assert!(routine.starts_with("cuDNN 9."), "{routine}");
    assert!(
        routine.ends_with(&format!("{dtype} {}", layout.name().to_uppercase())),
        "{routine}"
    );
    let wrong = expected.iter().zip(&got).filter(|(e, g)| e != g).count();
    assert_eq!(
        wrong,
        0,
        "{}: {wrong} of {out_len} differ (first: {:?})",
        task.key(),
        expected.iter().zip(&got).find(|(e, g)| e != g)
    );
}

#[test]
#[ignore = "needs a GPU and cuDNN"]
fn cudnn_fp16_nhwc_conv_is_exact() {
    check_conv(DType::Fp16, Layout::Nhwc);
}

#[test]
#[ignore = "needs a GPU and cuDNN"]
fn cudnn_tf32_and_f32_convs_are_exact() {
    check_conv(DType::Tf32, Layout::Nhwc);
    check_conv(DType::Tf32, Layout::Nchw);
    check_conv(DType::F32, Layout::Nchw);
}

/// The task's bias (per output channel, the last index in NHWC) and ReLU on `y`.
fn apply_epilogue(
    y: &mut [f32],
    epilogue: Epilogue,
    bias: &[f32],
    channel: impl Fn(usize) -> usize,
) {
    for (i, v) in y.iter_mut().enumerate() {
        if epilogue.bias {
            *v += bias[channel(i)];
        }
        if epilogue.relu {
            *v = v.max(0.0);
        }
    }
}

/// Inputs with entries in {-1, 0, 1} and a bias in [-3, 3] (from seeds `seed`, `+1`,
/// `+2`), and the exact output of the convolution with its epilogue: [x, w, bias,
/// expected].
fn conv_case(s: &Conv2d, epilogue: Epilogue, layout: Layout, seed: u64) -> [Vec<f32>; 4] {
    let (p, q) = s.output_size().unwrap();
    let x = values((s.n * s.c * s.h * s.w) as usize, 1, seed);
    let w = values((s.k * (s.c / s.groups) * s.r * s.s) as usize, 1, seed + 1);
    let bias = values(s.k as usize, 3, seed + 2);
    let mut expected = conv_reference(s, layout, &x, &w);
    let (k, pq) = (s.k as usize, (p * q) as usize);
    apply_epilogue(&mut expected, epilogue, &bias, |i| match layout {
        Layout::Nchw => (i / pq) % k,
        Layout::Nhwc => i % k,
    });
    [x, w, bias, expected]
}

/// Uploads the two factors and the bias in the task's input type and runs the task's
/// baseline on them (see `run_baseline_with`, `handles` legacy cuDNN handles).
fn baseline_on(
    task: &Task,
    [a, b, bias]: [&[f32]; 3],
    out_len: usize,
    handles: usize,
) -> (Vec<f32>, String) {
    let (ctx, device) = context();
    let upload = |v: &[f32]| host::upload(&ctx, v, task.dtype).unwrap();
    let (ab, bb, biasb) = (upload(a), upload(b), upload(bias));
    let cb = host::alloc(&ctx, out_len, task.out_dtype).unwrap();
    let operands = ([&ab, &bb, &cb], task.epilogue.bias.then_some(&biasb));
    run_baseline_with(&ctx, &device, task, operands, out_len, handles)
}

/// A conv2d through the baseline's graph-API path alone (no legacy handle), checked
/// exactly against the CPU, with the routine it chose.
fn check_graph_conv(
    shape: Conv2d,
    epilogue: Epilogue,
    dtype: DType,
    out_dtype: DType,
    layout: Layout,
) -> String {
    load(Library::Cudnn);
    let task = Task {
        op: Operator::Conv2d(shape),
        epilogue,
        dtype,
        out_dtype,
        layout,
    };
    let [x, w, bias, expected] = conv_case(&shape, epilogue, layout, 11);
    let out_len = expected.len();
    let (got, routine) = baseline_on(&task, [&x, &w, &bias], out_len, 0);
    assert!(routine.contains(" graph eng"), "{routine}");
    let wrong = expected.iter().zip(&got).filter(|(e, g)| e != g).count();
    assert_eq!(
        wrong,
        0,
        "{} with {routine}: {wrong} of {out_len} differ (first: {:?})",
        task.key(),
        expected.iter().zip(&got).find(|(e, g)| e != g)
    );
    routine
}

#[test]
#[ignore = "needs a GPU and cuDNN 9"]
fn cudnn_graph_engines_are_exact() {
    let plain = Epilogue::default();
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    // A 1x1 fp16 NHWC convolution: the case the legacy find served with non-tensor-core
    // algorithms. The graph must give a tensor-core engine.
    let one = Conv2d::new(1, 64, 14, 14, 128, 1, 1, 1, 0);
    let r = check_graph_conv(one, plain, DType::Fp16, DType::Fp16, Layout::Nhwc);
    assert!(r.contains("(tensor-core"), "{r}");
    // Bias and ReLU fused into the graph on half data.
    // |sum| <= 16·9 + 3: exact in bf16 (256).
    let three = Conv2d::new(2, 16, 12, 10, 48, 3, 3, 1, 1);
    let r = check_graph_conv(three, fused, DType::Bf16, DType::Bf16, Layout::Nhwc);
    println!("bf16 conv+bias+relu: {r}");
    let r = check_graph_conv(three, fused, DType::Fp16, DType::Fp16, Layout::Nhwc);
    println!("fp16 conv+bias+relu: {r}");
    // A half input with a float32 output: no legacy routine exists.
    let r = check_graph_conv(three, plain, DType::Fp16, DType::F32, Layout::Nhwc);
    assert!(r.contains("fp16→f32"), "{r}");
    // Grouped, dilated and asymmetrically padded, in float32 NCHW (no tensor cores).
    let mut odd = Conv2d::new(1, 32, 15, 13, 64, 3, 3, 2, 1);
    odd.groups = 4;
    odd.dilation_w = 2;
    odd.pad_bottom = Some(2);
    let r = check_graph_conv(odd, plain, DType::F32, DType::F32, Layout::Nchw);
    assert!(r.contains("(no-tensor-core"), "float32 stays off TF32: {r}");
    // Depthwise, fp16 NHWC with a bias.
    let mut depthwise = Conv2d::new(1, 32, 14, 14, 32, 3, 3, 1, 1);
    depthwise.groups = 32;
    let bias = Epilogue {
        bias: true,
        relu: false,
    };
    check_graph_conv(depthwise, bias, DType::Fp16, DType::Fp16, Layout::Nhwc);
}

/// A 1×1 convolution through the GEMM route alone (`baseline::prepare_conv_gemm`),
/// checked exactly against the CPU: the NHWC form reads the KRSC weights as B
/// transposed, the NCHW form swaps the inputs and adds its bias after the GEMM.
fn check_conv_gemm(
    shape: Conv2d,
    epilogue: Epilogue,
    dtype: DType,
    out_dtype: DType,
    layout: Layout,
) {
    load(Library::Cudnn);
    load(Library::Cublas);
    let (ctx, device) = context();
    let task = Task {
        op: Operator::Conv2d(shape),
        epilogue,
        dtype,
        out_dtype,
        layout,
    };
    let [x, w, bias, expected] = conv_case(&shape, epilogue, layout, 31);
    let upload = |v: &[f32]| host::upload(&ctx, v, dtype).unwrap();
    let (xb, wb, biasb) = (upload(&x), upload(&w), upload(&bias));
    let out_len = expected.len();
    let yb = host::alloc(&ctx, out_len, out_dtype).unwrap();
    let operands = ([&xb, &wb, &yb], epilogue.bias.then_some(&biasb));
    let spin_module = ctx.load(SPIN_PTX.as_bytes()).unwrap();
    let spin = spin_module.function("tilesched_spin", 0).unwrap();
    let protocol = Protocol {
        ctx: &ctx,
        spin: &spin,
        sm_clock_mhz: device.sm_clock_mhz,
        timing: quick(),
    };
    let prepared = baseline::prepare_conv_gemm(&protocol, &task, &|_| operands, 8)
        .unwrap_or_else(|e| panic!("{}: {e}", task.key()));
    let routine = prepared.baseline.describe();
    println!("{}: {routine} ({} timed)", task.key(), prepared.timed);
    for line in &prepared.candidates {
        println!("  {line}");
        assert!(!line.contains("failed"), "{line}");
    }
    assert!(routine.contains("the 1×1 conv as a GEMM"), "{routine}");
    ctx.poison(&yb).unwrap();
    prepared.baseline.run(operands).unwrap();
    ctx.synchronize().unwrap();
    let got = host::download(&ctx, &yb, out_len, out_dtype).unwrap();
    let wrong = expected.iter().zip(&got).filter(|(e, g)| e != g).count();
    assert_eq!(
        wrong,
        0,
        "{} with {routine}: {wrong} of {out_len} differ (first: {:?})",
        task.key(),
        expected.iter().zip(&got).find(|(e, g)| e != g)
    );
}

#[test]
#[ignore = "needs a GPU, cuDNN and cuBLAS"]
fn pointwise_convolutions_as_gemms_are_exact() {
    let e = |bias, relu| Epilogue { bias, relu };
    // |sum| <= 96 + 3: exact in every type.
    let nhwc = Conv2d::new(2, 96, 7, 9, 40, 1, 1, 1, 0);
    check_conv_gemm(
        nhwc,
        e(false, false),
        DType::Fp16,
        DType::Fp16,
        Layout::Nhwc,
    );
    check_conv_gemm(nhwc, e(true, true), DType::Fp16, DType::Fp16, Layout::Nhwc);
    check_conv_gemm(nhwc, e(true, false), DType::Bf16, DType::Bf16, Layout::Nhwc);
    check_conv_gemm(nhwc, e(true, true), DType::Fp16, DType::F32, Layout::Nhwc);
    // EfficientNet-B0's long reduction over a small image; |sum| <= 1152 + 3.
    let nchw = Conv2d::new(1, 1152, 7, 7, 48, 1, 1, 1, 0);
    check_conv_gemm(nchw, e(true, true), DType::F32, DType::F32, Layout::Nchw);
    check_conv_gemm(nchw, e(false, true), DType::F32, DType::F32, Layout::Nchw);
    check_conv_gemm(nchw, e(false, false), DType::F32, DType::F32, Layout::Nchw);
}

/// A matmul or batch matmul task and its (batch, M, N, K).
fn matmul_task(
    op: Operator,
    epilogue: Epilogue,
    dtype: DType,
    out_dtype: DType,
) -> (Task, [u32; 4]) {
    let dims = match op {
        Operator::Matmul { m, n, k } => [1, m, n, k],
        Operator::BatchMatmul { b, m, n, k } => [b, m, n, k],
        Operator::Conv2d(_) => unreachable!("a matmul"),
    };
    let task = Task {
        op,
        epilogue,
        dtype,
        out_dtype,
        layout: Layout::Nchw,
    };
    (task, dims)
}

/// cuBLASLt with the task's epilogue in the call, exact against the CPU.
fn check_lt_epilogue(op: Operator, epilogue: Epilogue, dtype: DType, out_dtype: DType) {
    load(Library::Cublas);
    let (task, [batch, m, n, k]) = matmul_task(op, epilogue, dtype, out_dtype);
    let a = values((batch * m * k) as usize, 2, 21);
    let b = values((batch * k * n) as usize, 2, 22);
    let bias = values(n as usize, 3, 23);
    let mut expected = matmul_reference(batch, m, n, k, &a, &b);
    apply_epilogue(&mut expected, epilogue, &bias, |i| i % n as usize);
    let out_len = (batch * m * n) as usize;
    let (got, routine) = baseline_on(&task, [&a, &b, &bias], out_len, 1);
    assert!(routine.contains("EPILOGUE_"), "{routine}");
    assert_eq!(expected, got, "{}: {routine}", task.key());
}

#[test]
#[ignore = "needs a GPU and cuBLAS"]
fn cublaslt_epilogues_are_exact() {
    let e = |bias, relu| Epilogue { bias, relu };
    let mm = Operator::Matmul {
        m: 96,
        n: 80,
        k: 64,
    };
    // |sum| <= 64·4 + 3 = 259: exact in fp16 and f32 outputs.
    check_lt_epilogue(mm, e(true, false), DType::Fp16, DType::Fp16);
    check_lt_epilogue(mm, e(true, true), DType::Fp16, DType::Fp16);
    check_lt_epilogue(mm, e(false, true), DType::Fp16, DType::Fp16);
    check_lt_epilogue(mm, e(true, true), DType::Fp16, DType::F32);
    check_lt_epilogue(mm, e(true, true), DType::F32, DType::F32);
    let bmm = Operator::BatchMatmul {
        b: 3,
        m: 32,
        n: 48,
        k: 40,
    };
    check_lt_epilogue(bmm, e(true, true), DType::Fp16, DType::Fp16);
}

fn matmul_reference(batch: u32, m: u32, n: u32, k: u32, a: &[f32], b: &[f32]) -> Vec<f32> {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let mut c = vec![0.0f32; batch as usize * m * n];
    for bi in 0..batch as usize {
        for i in 0..m {
            for j in 0..n {
                let acc: f64 = (0..k)
                    .map(|l| {
                        f64::from(a[bi * m * k + i * k + l]) * f64::from(b[bi * k * n + l * n + j])
                    })
                    .sum();
                c[bi * m * n + i * n + j] = acc as f32;
            }
        }
    }
    c
}

/// Checks the chosen baseline and, separately, cuBLASLt's first heuristic choice (so
/// that the cuBLASLt path is proven whichever wins).
fn check_matmul(op: Operator, dtype: DType, out_dtype: DType, range: i32) {
    let (ctx, device) = context();
    load(Library::Cublas);
    let (task, [batch, m, n, k]) = matmul_task(op, Epilogue::default(), dtype, out_dtype);
    let a = values((batch * m * k) as usize, range, 3);
    let b = values((batch * k * n) as usize, range, 4);
    let expected = matmul_reference(batch, m, n, k, &a, &b);
    let ab = host::upload(&ctx, &a, dtype).unwrap();
    let bb = host::upload(&ctx, &b, dtype).unwrap();
    let out_len = (batch * m * n) as usize;
    let cb = host::alloc(&ctx, out_len, out_dtype).unwrap();
    let (got, routine) = run_baseline(&ctx, &device, &task, [&ab, &bb, &cb], out_len);
    assert!(routine.starts_with("cuBLAS"), "{routine}");
    assert_eq!(expected, got, "{}: {routine}", task.key());

    let shape = benchmarks::cublas::Gemm::new(batch, m, n, k);
    let types = benchmarks::cublas::GemmTypes::for_types(dtype, out_dtype);
    let lt = benchmarks::cublas::LtMatmul::new(&ctx, shape, types, Epilogue::default(), 64 << 20)
        .unwrap();
    let first = lt.heuristics(1).unwrap();
    let first = first.first().expect("cuBLASLt proposes an algorithm");
    let workspace = ctx.alloc(first.workspace_bytes.div_ceil(4).max(1)).unwrap();
    ctx.poison(&cb).unwrap();
    lt.run(first, [&ab, &bb, &cb], None, &workspace).unwrap();
    ctx.synchronize().unwrap();
    let got = host::download(&ctx, &cb, out_len, out_dtype).unwrap();
    assert_eq!(expected, got, "{}: {}", task.key(), lt.describe(first));
}

#[test]
#[ignore = "needs a GPU and cuBLAS"]
fn cublas_bf16_matmul_is_exact() {
    // |sum| <= 40·9 = 360, exact in f32; with a bf16 output (exact to 256) 40·4 = 160.
    let op = Operator::Matmul {
        m: 64,
        n: 48,
        k: 40,
    };
    check_matmul(op, DType::Bf16, DType::F32, 3);
    check_matmul(op, DType::Bf16, DType::Bf16, 2);
}

#[test]
#[ignore = "needs a GPU and cuBLAS"]
fn cublas_tf32_matmul_is_exact() {
    // TF32 keeps 11 significant bits: integers to 2048 are exact inputs; sums <= 64·16.
    check_matmul(
        Operator::Matmul {
            m: 72,
            n: 40,
            k: 64,
        },
        DType::Tf32,
        DType::Tf32,
        4,
    );
    check_matmul(
        Operator::BatchMatmul {
            b: 3,
            m: 32,
            n: 24,
            k: 64,
        },
        DType::Tf32,
        DType::F32,
        4,
    );
}

#[test]
#[ignore = "needs a GPU and cuBLAS"]
fn cublas_fp16_and_f32_matmuls_are_exact() {
    let op = Operator::BatchMatmul {
        b: 2,
        m: 40,
        n: 56,
        k: 48,
    };
    check_matmul(op, DType::Fp16, DType::Fp16, 3);
    check_matmul(op, DType::F32, DType::F32, 3);
}

#[test]
#[ignore = "needs a GPU, cuDNN and cuBLAS"]
fn the_newest_copy_is_loaded_and_reports_its_version() {
    for lib in [Library::Cudnn, Library::Cublas] {
        let found = vendor::candidates(lib);
        for c in &found {
            println!(
                "{}: {} {:?} loader path: {}",
                lib.name(),
                c.dir.display(),
                c.version,
                c.on_loader_path
            );
        }
        load(lib);
        let loaded = vendor::loaded(lib).unwrap();
        assert_eq!(loaded.dir, found[0].dir, "{}", lib.name());
        let info = baseline::library(lib).unwrap();
        println!("{info:?}");
        // What the files said is what the library says, once loaded.
        if let Some(v) = loaded.file_version {
            assert_eq!(info.version, v.to_string(), "{}", lib.name());
        }
    }
}

/// A short timing for the peak kernels: they only need to run and rank.
fn peak_timing() -> TimingConfig {
    TimingConfig {
        warmup: 2,
        min_time_ms: 20.0,
        min_repeats: 5,
        max_repeats: 200,
        race_us: None,
        precision: None,
    }
}

#[test]
#[ignore = "needs a GPU"]
fn mma_sync_peaks_run() {
    let (ctx, device) = context();
    let cfg = peak_timing();
    for dtype in [DType::Tf32, DType::Fp16, DType::Bf16] {
        let peak = peaks::measure_tensor(&ctx, &device, &cfg, dtype)
            .unwrap()
            .unwrap();
        println!(
            "{}: {dtype} {:.1} TFLOP/s ({})",
            device.name, peak.tflops, peak.instruction
        );
        assert!(peak.tflops > 10.0, "{dtype}: {peak:?}");
    }
    assert!(
        peaks::measure_tensor(&ctx, &device, &cfg, DType::F32)
            .unwrap()
            .is_none()
    );
}

/// On Hopper the `wgmma` peak of fp16, bf16 and TF32 runs, is above `mma.sync`'s (the
/// reason the roofline takes it), and is what the roofline uses.
#[test]
#[ignore = "needs a Hopper GPU"]
fn wgmma_peaks_run_above_mma_sync() {
    let (ctx, device) = context();
    let cfg = peak_timing();
    for dtype in [DType::Tf32, DType::Fp16, DType::Bf16] {
        let mma = peaks::measure_tensor(&ctx, &device, &cfg, dtype)
            .unwrap()
            .unwrap();
        let wgmma = peaks::measure_wgmma(&ctx, &device, &cfg, dtype)
            .unwrap()
            .expect("a Hopper GPU");
        println!(
            "{}: {dtype} wgmma {:.1} TFLOP/s ({}), mma.sync {:.1}",
            device.name, wgmma.tflops, wgmma.instruction, mma.tflops
        );
        assert!(wgmma.tflops > mma.tflops, "{dtype}: {wgmma:?} vs {mma:?}");
        let peaks = peaks::Peaks {
            fp32_tflops: 1.0,
            bandwidth_gbs: 1.0,
            tensor: Some(mma),
            wgmma: Some(wgmma.clone()),
        };
        assert_eq!(peaks.compute_tflops(dtype), wgmma.tflops);
    }
    assert!(
        peaks::measure_wgmma(&ctx, &device, &cfg, DType::F32)
            .unwrap()
            .is_none()
    );
}

/// Which of cuDNN's float-data math types give TF32 tensor cores: inputs `1 + 2^-11`
/// (exact in float32, not in TF32's 10-bit mantissa) and weights 1, whose float32 sums
/// are exact; an output that differs from the exact sum means the inputs were rounded
/// to TF32. Prints per math type and algorithm what ran and how fast; asserts only that
/// TF32 shows somewhere.
#[test]
#[ignore = "needs a GPU and cuDNN"]
fn cudnn_float_math_types_and_tf32() {
    use benchmarks::cudnn::{ConvMath, CudnnConv, MathType};
    let (ctx, device) = context();
    load(Library::Cudnn);
    let spin_module = ctx.load(SPIN_PTX.as_bytes()).unwrap();
    let spin = spin_module.function("tilesched_spin", 0).unwrap();
    let cfg = TimingConfig {
        warmup: 2,
        min_time_ms: 5.0,
        min_repeats: 10,
        max_repeats: 2000,
        race_us: None,
        precision: None,
    };
    let mut tf32_seen = false;
    for (c, hw, k, r) in [(128u32, 28u32, 128u32, 3u32), (256, 14, 512, 1)] {
        let shape = Conv2d {
            n: 1,
            c,
            h: hw,
            w: hw,
            k,
            r,
            s: r,
            stride_h: 1,
            stride_w: 1,
            pad_h: r / 2,
            pad_w: r / 2,
            dilation_h: 1,
            dilation_w: 1,
            pad_bottom: None,
            pad_right: None,
            groups: 1,
        };
        let (p, q) = shape.output_size().unwrap();
        let x = vec![1.0f32 + 2f32.powi(-11); (c * hw * hw) as usize];
        let w = vec![1.0f32; (k * c * r * r) as usize];
        let xb = host::upload(&ctx, &x, DType::F32).unwrap();
        let wb = host::upload(&ctx, &w, DType::F32).unwrap();
        let out_len = (k * p * q) as usize;
        let yb = host::alloc(&ctx, out_len, DType::F32).unwrap();
        let find_ws = ctx.alloc(1 << 28).unwrap();
        // Every input is the same, so the layout does not change the expected values.
        let exact = conv_reference(&shape, Layout::Nchw, &x, &w);
        for layout in [Layout::Nhwc, Layout::Nchw] {
            for math in [MathType::Default, MathType::TensorOp, MathType::Fma] {
                let mut m = ConvMath::for_types(DType::Tf32, DType::Tf32, layout).unwrap();
                m.math = math;
                let conv = CudnnConv::with_math(&ctx, &shape, m).unwrap();
                let found = conv.algorithms([&xb, &wb, &yb], &find_ws).unwrap();
                for a in found {
                    ctx.poison(&yb).unwrap();
                    conv.run(&a, [&xb, &wb, &yb], None, &find_ws).unwrap();
                    let y = host::download(&ctx, &yb, out_len, DType::F32).unwrap();
                    let rounded = y.iter().zip(&exact).filter(|(g, e)| g != e).count();
                    let t =
                        gpu::timing::time_kernel(&ctx, &spin, device.sm_clock_mhz, &cfg, |_| {
                            conv.run(&a, [&xb, &wb, &yb], None, &find_ws).unwrap();
                            Ok(())
                        })
                        .unwrap();
                    tf32_seen |= rounded > 0;
                    println!(
                        "c{c} hw{hw} k{k} r{r} {layout} asked {:?}: {} ran {:?} {:.2} µs, {rounded}/{out_len} outputs TF32-rounded",
                        math,
                        a.name(),
                        a.math,
                        t.median_us
                    );
                }
            }
        }
    }
    assert!(tf32_seen, "no cuDNN math type rounded float inputs to TF32");
}

/// `COMPUTE_32F_FAST_TF32` really multiplies at TF32: inputs `1 + 2^-11` (not TF32
/// values) times ones sum exactly to `K·(1 + 2^-11)` in float32 and to something else
/// once the inputs are rounded to TF32.
#[test]
#[ignore = "needs a GPU and cuBLAS"]
fn cublas_fast_tf32_rounds_like_tf32() {
    use benchmarks::cublas::{Cublas, Gemm, GemmTypes};
    let (ctx, _) = context();
    load(Library::Cublas);
    let (m, n, k) = (128u32, 128u32, 256u32);
    let a = vec![1.0f32 + 2f32.powi(-11); (m * k) as usize];
    let exact = k as f32 * (1.0 + 2f32.powi(-11));
    let b = vec![1.0f32; (k * n) as usize];
    let ab = host::upload(&ctx, &a, DType::F32).unwrap();
    let bb = host::upload(&ctx, &b, DType::F32).unwrap();
    let cb = host::alloc(&ctx, (m * n) as usize, DType::F32).unwrap();
    let cublas = Cublas::new(&ctx).unwrap();
    let shape = Gemm::new(1, m, n, k);
    for (dtype, tf32) in [(DType::Tf32, true), (DType::F32, false)] {
        let types = GemmTypes::for_types(dtype, dtype);
        ctx.poison(&cb).unwrap();
        cublas.gemm(shape, &types, [&ab, &bb, &cb]).unwrap();
        let c = host::download(&ctx, &cb, (m * n) as usize, DType::F32).unwrap();
        let rounded = c.iter().filter(|&&v| v != exact).count();
        println!(
            "{}: {rounded}/{} outputs TF32-rounded (first {})",
            cublas.describe(shape, &types),
            c.len(),
            c[0]
        );
        assert_eq!(rounded == c.len(), tf32, "{dtype}");
    }
}

/// `--cudnn DIR`: the copy in `TILESCHED_TEST_CUDNN_DIR` (skipped when unset) is the one
/// loaded and called, its sub-libraries too (a mismatch would fail cudnnCreate with
/// CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH). Run alone: a process holds one copy.
#[test]
#[ignore = "needs a GPU and cuDNN; run alone with TILESCHED_TEST_CUDNN_DIR set"]
fn a_given_cudnn_directory_is_the_copy_called() {
    let Some(dir) = std::env::var_os("TILESCHED_TEST_CUDNN_DIR") else {
        println!("TILESCHED_TEST_CUDNN_DIR is not set: skipped");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    vendor::load(Library::Cudnn, Some(&dir)).expect("the given copy loads");
    let loaded = vendor::loaded(Library::Cudnn).unwrap();
    assert!(loaded.given && loaded.found.is_empty());
    let info = baseline::library(Library::Cudnn).unwrap();
    println!("{info:?} (files say {:?})", loaded.file_version);
    if let Some(v) = loaded.file_version {
        assert_eq!(info.version, v.to_string());
    }
    // The default choice now returns the copy already loaded.
    assert_eq!(vendor::load_library(Library::Cudnn, None).unwrap().dir, dir);
    check_conv(DType::Fp16, Layout::Nhwc);
}
