//! The device's float32 peak and memory bandwidth, measured in the same run as the
//! kernels they bound (clocks under load and the memory system differ per card, so a
//! datasheet number would misplace the roofline): a kernel of independent FMA chains
//! that keeps every FP32 pipe busy, and a float4 copy over buffers far larger than L2.

use gpu::cuda::{Context, CudaError, Function};
use gpu::timing::{self, TimingConfig};
use schedule::LaunchConfig;
use serde::{Deserialize, Serialize};

/// What the roofline is drawn from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Float32 FMA throughput, in TFLOP/s (2 FLOPs per FMA).
    pub fp32_tflops: f64,
    /// Device memory copy bandwidth (bytes read plus bytes written), in GB/s.
    pub bandwidth_gbs: f64,
}

impl Peaks {
    /// The roofline floor in µs: the larger of compute time at peak and the time to move
    /// `bytes` at the measured bandwidth.
    pub fn floor_us(&self, flops: u64, bytes: u64) -> f64 {
        let compute = flops as f64 / (self.fp32_tflops * 1e6);
        let memory = bytes as f64 / (self.bandwidth_gbs * 1e3);
        compute.max(memory)
    }
}

/// FMA chains per thread: enough independent work to cover the FMA latency at full
/// occupancy; the outer loop is unrolled so loop overhead stays a few percent.
const CHAINS: u64 = 16;
const UNROLL: u64 = 8;
const THREADS: u32 = 256;

/// The two measuring kernels, compiled by NVRTC.
pub const SOURCE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) tilesched_peak_fma(float* out, unsigned long long iters) {
  // b and c come from memory so that the compiler cannot fold the chains.
  const float b = out[0], c = out[1];
  float a[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) a[j] = (float)(threadIdx.x + j);
#pragma unroll 8
  for (unsigned long long i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 16; ++j) a[j] = fmaf(a[j], b, c);
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j) s += a[j];
  if (s == -1.0f) out[2 + blockIdx.x] = s;
}

extern "C" __global__ void tilesched_peak_copy(const float4* src, float4* dst, unsigned long long n4) {
  const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += step)
    dst[i] = src[i];
}
"#;

/// Measures both peaks on `ctx` (`module` is [`SOURCE`] compiled for the device).
pub fn measure(
    ctx: &Context,
    module: &gpu::cuda::Module,
    spin: &Function,
    sm_clock_mhz: u32,
    sm_count: u32,
    cfg: &TimingConfig,
) -> Result<Peaks, CudaError> {
    let fma = module.function("tilesched_peak_fma", 0)?;
    let copy = module.function("tilesched_peak_copy", 0)?;
    let blocks = sm_count * 8;
    // out[0] = b, out[1] = c: a contraction towards 1.0 that stays finite.
    let out = ctx.alloc(2 + blocks as usize)?;
    let mut init = vec![0.0f32; out.len];
    init[0] = 0.999_999;
    init[1] = 1e-6;
    ctx.upload(&out, &init)?;
    let iters: u64 = 4096;
    let launch = LaunchConfig {
        grid: blocks,
        block: THREADS,
        dynamic_shared_bytes: 0,
        zero_output: false,
    };
    let t = timing::time_kernel(ctx, spin, sm_clock_mhz, cfg, |_| {
        ctx.launch(&fma, launch, &[&out], &[iters])
    })?;
    let flops = 2 * CHAINS * iters * u64::from(blocks) * u64::from(THREADS);
    let fp32_tflops = flops as f64 / (t.median_us * 1e6);
    debug_assert_eq!(iters % UNROLL, 0);

    let floats: usize = 64 << 20; // 256 MiB per buffer, several times any L2
    let src = ctx.alloc(floats)?;
    let dst = ctx.alloc(floats)?;
    ctx.poison(&src)?;
    let copy_launch = LaunchConfig {
        grid: sm_count * 16,
        block: THREADS,
        dynamic_shared_bytes: 0,
        zero_output: false,
    };
    let n4 = (floats / 4) as u64;
    let t = timing::time_kernel(ctx, spin, sm_clock_mhz, cfg, |_| {
        ctx.launch(&copy, copy_launch, &[&src, &dst], &[n4])
    })?;
    let bytes = 2 * 4 * floats as u64;
    let bandwidth_gbs = bytes as f64 / (t.median_us * 1e3);
    Ok(Peaks {
        fp32_tflops,
        bandwidth_gbs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_slower_of_compute_and_memory() {
        let peaks = Peaks {
            fp32_tflops: 50.0,
            bandwidth_gbs: 2000.0,
        };
        // 100 MFLOP at 50 TFLOP/s = 2 µs; 1 MB at 2000 GB/s = 0.5 µs.
        assert!((peaks.floor_us(100_000_000, 1_000_000) - 2.0).abs() < 1e-12);
        // 1 MFLOP = 0.02 µs; 8 MB = 4 µs.
        assert!((peaks.floor_us(1_000_000, 8_000_000) - 4.0).abs() < 1e-12);
    }

    #[test]
    fn the_kernels_compile_for_sm_90() {
        // NVRTC comes from the project's setup (a PyPI wheel); no GPU needed.
        let compiled = gpu::compile(SOURCE, "tilesched_peak_fma", "sm_90").unwrap();
        assert!(compiled.cubin.starts_with(b"\x7fELF"));
        assert_eq!(compiled.resources.spill_store_bytes, 0);
    }
}
