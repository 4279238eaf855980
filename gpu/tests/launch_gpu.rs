//! On a real GPU (ignored in CI): the launch path's typed arguments and shapes. A probe
//! kernel takes a 128-byte `__grid_constant__` parameter (the form of a TMA tensor
//! map), a 64-bit scalar and a pointer, and writes, per block, its cluster rank, its
//! cluster size and one byte of the 128 scaled by the scalar, at its linear block
//! index: launched on a 3-D grid, once without clusters (`cuLaunchKernelEx` not used)
//! and once in clusters of two along x. Needs NVRTC and a Hopper GPU.

mod common;

use gpu::cuda::{Bytes128, KernelArg, LoadedKernel};
use schedule::{Dim3, LaunchConfig};

const PROBE: &str = r#"
struct __align__(64) Blob { unsigned char b[128]; };
extern "C" __global__ void launch_probe(const __grid_constant__ Blob blob,
                                        unsigned long long scale, unsigned* out) {
  unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned rank, ranks;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ranks));
  if (threadIdx.x == 0) {
    out[3 * block] = rank;
    out[3 * block + 1] = ranks;
    out[3 * block + 2] = (unsigned)(blob.b[block % 128] * scale);
  }
}
"#;

#[test]
#[ignore = "needs a Hopper GPU"]
fn three_dimensional_grids_clusters_and_128_byte_parameters_launch() {
    let (ctx, device) = common::gpu();
    let compiled = gpu::compile(PROBE, "launch_probe", &device.arch()).expect("the probe");
    let mut blob = Bytes128([0; 128]);
    for (i, b) in blob.0.iter_mut().enumerate() {
        *b = (2 * i + 1) as u8;
    }
    let grid = Dim3 { x: 4, y: 2, z: 2 };
    for cluster in [Dim3::ONE, Dim3 { x: 2, y: 1, z: 1 }] {
        let launch = LaunchConfig {
            grid,
            cluster,
            ..LaunchConfig::linear(1, 64, 0)
        };
        let kernel = LoadedKernel::load(&compiled.cubin, "launch_probe", launch).expect("load");
        let blocks = grid.count() as usize;
        let out = ctx.alloc(3 * blocks).expect("output");
        ctx.poison(&out).expect("poison");
        let args = [KernelArg::Bytes128(blob), KernelArg::U64(3), out.arg()];
        // SAFETY: `out` is a live allocation of this context holding 3 words per block,
        // and the stream is the context's own.
        unsafe { kernel.launch(&args, None, ctx.raw_stream()) }.expect("launch");
        let bytes = ctx.download_bytes(&out).expect("download");
        let words: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
            .collect();
        for b in 0..blocks {
            let x = (b % grid.x as usize) as u32;
            let expected = [x % cluster.x, cluster.x, 3 * (2 * b as u32 + 1)];
            assert_eq!(
                words[3 * b..3 * b + 3],
                expected,
                "block {b} of grid {grid}, cluster {cluster:?}"
            );
        }
    }
}
