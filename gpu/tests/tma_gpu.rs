//! On a real GPU (ignored in CI): a TMA tensor map (`gpu::tensor_map` of the atom's
//! `TensorBox`) moves a box as the atoms say. A probe kernel takes the map as a 128-byte
//! `__grid_constant__` parameter (and the box's origin packed in a 64-bit scalar),
//! waits on an mbarrier for one `cp.async.bulk.tensor.2d` copy of a 64×64 fp16 box
//! under the 128-byte swizzle, and writes shared memory out as it lies. Every element
//! must sit where the box's `SharedTileLayout` (the wgmma atom's swizzle) puts it, and
//! the parts of the box past the tensor's edges must be zeros: for a box inside a
//! 100×80 tensor and for boxes hanging over its edges. Needs a Hopper GPU.

mod common;

use gpu::cuda::{KernelArg, LoadedKernel};
use gpu::tensor_map;
use schedule::atom::tma::TensorBox;
use schedule::atom::wgmma::Swizzle;
use schedule::codegen::cuda_source;
use schedule::interp::{self, Inputs};
use schedule::ir::{Cond, Expr, Kernel, Param, Role, Scope, SharedPool, Stmt};
use schedule::{DType, LaunchConfig};

const ROWS: u64 = 100;
const COLUMNS: u64 = 80;
const BOX: i64 = 64;

const PROBE: &str = r#"
struct __align__(64) TensorMap { unsigned long long opaque[16]; };
extern "C" __global__ void tma_probe(const __grid_constant__ TensorMap map,
                                     unsigned long long origin,
                                     unsigned short* __restrict__ out) {
  const int column0 = (int)(origin & 0xffffffffull), row0 = (int)(origin >> 32);
  __shared__ __align__(1024) unsigned short tile[64 * 64];
  __shared__ __align__(8) unsigned long long barrier;
  const unsigned bar = (unsigned)__cvta_generic_to_shared(&barrier);
  const unsigned dst = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(bar), "r"(64 * 64 * 2) : "memory");
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"((unsigned long long)&map), "r"(column0), "r"(row0), "r"(bar)
                 : "memory");
  }
  asm volatile("{ .reg .pred done; wait: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;"
               " @!done bra wait; }" :: "r"(bar) : "memory");
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) out[i] = tile[i];
}
"#;

/// The probe is valid PTX for sm_90 (NVRTC only, no GPU).
#[test]
fn the_probe_compiles() {
    gpu::compile(PROBE, "tma_probe", "sm_90").expect("the probe");
}

#[test]
#[ignore = "needs a Hopper GPU"]
fn a_tensor_map_box_lands_in_the_swizzled_layout_with_zeros_past_the_edges() {
    let (ctx, device) = common::gpu();
    let compiled = gpu::compile(PROBE, "tma_probe", &device.arch()).expect("the probe");
    let kernel = LoadedKernel::load(
        &compiled.cubin,
        "tma_probe",
        LaunchConfig::linear(1, 128, 0),
    )
    .expect("load");
    // Element (r, c) holds (r * 7 + c) % 1000 + 1: never zero, so zeros are fill.
    let value = |r: u64, c: u64| ((r * 7 + c) % 1000 + 1) as f32;
    let values: Vec<f32> = (0..ROWS * COLUMNS)
        .map(|i| value(i / COLUMNS, i % COLUMNS))
        .collect();
    let tensor = ctx.alloc_typed(values.len(), DType::Fp16).unwrap();
    ctx.upload(&tensor, &values).unwrap();
    let boxed = TensorBox::matrix(
        DType::Fp16,
        ROWS,
        COLUMNS,
        COLUMNS,
        1,
        0,
        BOX as u32,
        BOX as u32,
        Swizzle::B128,
    )
    .expect("a describable box");
    let map = tensor_map::encode(&boxed, tensor.device_ptr()).expect("encode");
    let layout = boxed.shared_layout();
    assert_eq!(Swizzle::of(&layout, 2), Some(Swizzle::B128));
    for (column0, row0) in [(0u64, 0u64), (16, 36), (64, 64)] {
        let out = ctx.alloc_typed((BOX * BOX) as usize, DType::Fp16).unwrap();
        ctx.poison(&out).unwrap();
        let args = [
            KernelArg::Bytes128(map),
            KernelArg::U64(column0 | row0 << 32),
            out.arg(),
        ];
        // SAFETY: the map names `tensor` and `out` holds the 64×64 box, both live in
        // this context; the stream is the context's own.
        unsafe { kernel.launch(&args, None, ctx.raw_stream()) }.expect("launch");
        let got = ctx.download(&out).unwrap();
        for r in 0..BOX {
            for c in 0..BOX {
                let (gr, gc) = (row0 + r as u64, column0 + c as u64);
                let want = if gr < ROWS && gc < COLUMNS {
                    value(gr, gc)
                } else {
                    0.0
                };
                assert_eq!(
                    got[layout.offset(r, c) as usize],
                    want,
                    "box at ({column0}, {row0}): element ({r}, {c})"
                );
            }
        }
    }
}

/// Rows and columns (row stride: `LOADED_COLUMNS`) of the IR kernel's two inputs; `a`'s
/// map covers `A_COLUMNS` of them, so the box's last columns of `a` are zero-filled.
const LOADED_ROWS: u64 = 2;
const LOADED_COLUMNS: u64 = 32;
const A_COLUMNS: u64 = 30;

/// A kernel in the IR that copies both inputs' 2×32 f32 boxes (128-byte swizzle) with
/// TMA on one mbarrier, waits, and writes `out[t] = a[t] * b[t]` for its 64 threads,
/// reading each element where the box's layout put it.
fn ir_kernel() -> Kernel {
    let threads = (LOADED_ROWS * LOADED_COLUMNS) as i64;
    let scope = Scope::new(1, threads);
    let boxed = |columns| {
        TensorBox::matrix(
            DType::F32,
            LOADED_ROWS,
            columns,
            LOADED_COLUMNS,
            1,
            0,
            LOADED_ROWS as u32,
            LOADED_COLUMNS as u32,
            Swizzle::B128,
        )
        .expect("a describable box")
    };
    let layout = boxed(LOADED_COLUMNS).shared_layout();
    let thread0 = vec![Cond {
        expr: Expr::ThreadIdx,
        lo: None,
        hi: Some(1),
    }];
    let load = |map| Stmt::TmaLoad {
        map,
        coords: vec![Expr::Const(0), Expr::Const(0)],
        at: Expr::Const(0),
        barrier: Expr::Const(0),
        multicast: None,
    };
    let row = scope.div(Expr::ThreadIdx, LOADED_COLUMNS as i64);
    let column = scope.rem(Expr::ThreadIdx, LOADED_COLUMNS as i64);
    let at = layout.expr(&scope, &row, &column);
    let body = vec![
        Stmt::If {
            conds: thread0.clone(),
            body: vec![Stmt::MbarrierInit {
                barrier: Expr::Const(0),
                arrivals: 1,
            }],
        },
        Stmt::Sync,
        Stmt::If {
            conds: thread0,
            body: vec![
                Stmt::ArriveExpectTx {
                    barrier: Expr::Const(0),
                    bytes: 2 * boxed(LOADED_COLUMNS).box_bytes() as i64,
                },
                load(3),
                load(4),
            ],
        },
        Stmt::MbarrierWait {
            barrier: Expr::Const(0),
            parity: Expr::Const(0),
        },
        Stmt::ZeroAcc,
        Stmt::Fma {
            acc: Expr::Const(0),
            a: at.clone(),
            b: at,
        },
        Stmt::Store {
            width: 1,
            acc: Expr::Const(0),
            out: Expr::ThreadIdx,
            bias: None,
            bias_when: Vec::new(),
            valid: Vec::new(),
            atomic: false,
            staged: false,
        },
    ];
    let buffer = |name, role| Param::Buffer {
        name,
        role,
        dtype: DType::F32,
    };
    let tile = layout.elements();
    Kernel {
        name: "tma_ir".to_string(),
        scope,
        params: vec![
            buffer("a", Role::Input(0)),
            buffer("b", Role::Input(1)),
            buffer("out", Role::Output),
            Param::TensorMap {
                name: "a_map",
                input: 0,
                tensor: boxed(A_COLUMNS),
            },
            Param::TensorMap {
                name: "b_map",
                input: 1,
                tensor: boxed(LOADED_COLUMNS),
            },
        ],
        dtype: DType::F32,
        out_dtype: DType::F32,
        relu: false,
        // The second tile starts on a 1024-byte swizzle atom.
        tile_offsets: [0, 256],
        tile_elements: [tile, tile],
        accumulators: 1,
        split_k: 1,
        semaphores: 0,
        body,
        launch: LaunchConfig::linear(1, threads as u32, 2 * 1024),
        shared: SharedPool::FloatTiles,
        staging: None,
    }
}

/// What the interpreter computes from `a` and `b`.
fn interpreted(kernel: &Kernel, a: &[f32], b: &[f32]) -> Vec<f32> {
    let inputs = Inputs {
        inputs: [a, b],
        bias: None,
    };
    interp::run(kernel, &inputs, a.len()).expect("the interpreter")
}

fn ir_inputs() -> (Vec<f32>, Vec<f32>) {
    let n = (LOADED_ROWS * LOADED_COLUMNS) as usize;
    let a = (0..n).map(|i| (i % 7) as f32 + 1.0).collect();
    let b = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
    (a, b)
}

/// The interpreter runs the IR kernel as the definition says (zeros past `a`'s map),
/// and its CUDA compiles for sm_90 (NVRTC only, no GPU).
#[test]
fn the_ir_kernel_interprets_and_compiles() {
    let kernel = ir_kernel();
    let (a, b) = ir_inputs();
    let got = interpreted(&kernel, &a, &b);
    for (i, v) in got.iter().enumerate() {
        let column = i as u64 % LOADED_COLUMNS;
        let want = if column < A_COLUMNS { a[i] * b[i] } else { 0.0 };
        assert_eq!(*v, want, "element {i}");
    }
    let source = cuda_source(&kernel, &[]);
    gpu::compile(&source, &kernel.name, "sm_90").unwrap_or_else(|e| panic!("{e}\n{source}"));
}

/// On the GPU the printed kernel, given the tensor maps its parameters describe,
/// computes exactly what the interpreter does.
#[test]
#[ignore = "needs a Hopper GPU"]
fn the_ir_kernel_runs_as_interpreted() {
    let (ctx, device) = common::gpu();
    let kernel = ir_kernel();
    let source = cuda_source(&kernel, &[]);
    let compiled = gpu::compile(&source, &kernel.name, &device.arch()).expect("compile");
    let loaded =
        LoadedKernel::load(&compiled.cubin, &kernel.name, kernel.launch.clone()).expect("load");
    let (a, b) = ir_inputs();
    let buffers = [&a, &b].map(|v| {
        let buffer = ctx.alloc(v.len()).unwrap();
        ctx.upload(&buffer, v).unwrap();
        buffer
    });
    let out = ctx.alloc(a.len()).unwrap();
    ctx.poison(&out).unwrap();
    let mut args = vec![buffers[0].arg(), buffers[1].arg(), out.arg()];
    for p in &kernel.params {
        if let Param::TensorMap { input, tensor, .. } = p {
            let map = tensor_map::encode(tensor, buffers[*input].device_ptr()).expect("encode");
            args.push(KernelArg::Bytes128(map));
        }
    }
    // SAFETY: the buffers and the maps' tensors are live allocations of this context,
    // as large as the kernel reads and writes; the stream is the context's own.
    unsafe { loaded.launch(&args, None, ctx.raw_stream()) }.expect("launch");
    let got = ctx.download(&out).unwrap();
    assert_eq!(got, interpreted(&kernel, &a, &b));
}
