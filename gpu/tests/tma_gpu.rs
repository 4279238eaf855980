//! On a real GPU (ignored in CI): a TMA tensor map (`gpu::tensor_map` of the atom's
//! `TensorBox`) moves a box as the atoms say. A probe kernel takes the map as a 128-byte
//! `__grid_constant__` parameter (and the box's origin packed in a 64-bit scalar),
//! waits on an mbarrier for one `cp.async.bulk.tensor.2d` copy of a 64×64 fp16 box
//! under the 128-byte swizzle, and writes shared memory out as it lies. Every element
//! must sit where the box's `SharedTileLayout` (the wgmma atom's swizzle) puts it, and
//! the parts of the box past the tensor's edges must be zeros: for a box inside a
//! 100×80 tensor and for boxes hanging over its edges. Needs a Hopper GPU.

use gpu::DeviceInfo;
use gpu::cuda::{self, Context, KernelArg, LoadedKernel};
use gpu::tensor_map;
use schedule::atom::tma::TensorBox;
use schedule::atom::wgmma::Swizzle;
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
    assert!(cuda::driver_present(), "no CUDA driver on this machine");
    let ctx = Context::new(0).expect("a context on GPU 0");
    let device = DeviceInfo::query(&ctx).expect("device attributes");
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
