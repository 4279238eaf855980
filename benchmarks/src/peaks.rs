//! The device's peaks, measured in the same run as the kernels they bound (clocks under
//! load and the memory system differ per card, so a datasheet number would misplace the
//! roofline): a kernel of independent FMA chains that keeps every FP32 pipe busy, a
//! float4 copy over buffers far larger than L2, and, for tasks on tensor cores, a kernel
//! of independent `mma.sync` chains of the task's type (m16n8k16 fp16 or bf16 with f32
//! accumulation, m16n8k8 TF32).
//!
//! On Hopper, tensor-core tasks also get the peak of `wgmma` (the warpgroup MMA that
//! cuDNN and cuBLAS use for large problems, written from `schedule::atom::wgmma`: k16
//! fp16 and bf16, k8 TF32), which is well above `mma.sync`'s; the roofline takes it
//! where it was measured, so that no vendor routine passes 100% of it.

use gpu::DeviceInfo;
use gpu::cuda::{Context, CudaError, Function};
use gpu::timing::{self, SPIN_PTX, TimingConfig};
use schedule::atom::SharedTileLayout;
use schedule::atom::wgmma::{COMMIT_C, FENCE_C, Swizzle, WARPGROUP_THREADS, WgmmaAtom, wait_c};
use schedule::{DType, LaunchConfig, Target};
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use thiserror::Error;

/// What the roofline is drawn from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Float32 FMA throughput, in TFLOP/s (2 FLOPs per FMA).
    pub fp32_tflops: f64,
    /// Device memory copy bandwidth (bytes read plus bytes written), in GB/s.
    pub bandwidth_gbs: f64,
    /// The `mma.sync` peak of the tasks' element type, when they have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorPeak>,
    /// The `wgmma` peak of the tasks' element type, on GPUs that have the instruction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wgmma: Option<TensorPeak>,
}

/// A tensor-core peak (`mma.sync` or `wgmma`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorPeak {
    pub dtype: DType,
    /// The PTX instruction measured.
    pub instruction: String,
    /// In TFLOP/s (2 FLOPs per multiply-add).
    pub tflops: f64,
}

impl Peaks {
    /// The compute peak for `dtype`'s tasks: the highest tensor-core peak measured for
    /// that type, else the float32 FMA peak (float32 tasks, or no tensor peak measured).
    pub fn compute_tflops(&self, dtype: DType) -> f64 {
        self.tensor_peak(dtype)
            .map_or(self.fp32_tflops, |t| t.tflops)
    }

    /// The highest tensor-core peak measured for `dtype` (none for float32).
    pub fn tensor_peak(&self, dtype: DType) -> Option<&TensorPeak> {
        self.fastest(|t| t.dtype == dtype && dtype != DType::F32)
    }

    /// The highest tensor-core peak measured, of whatever type.
    pub fn fastest_tensor(&self) -> Option<&TensorPeak> {
        self.fastest(|_| true)
    }

    fn fastest(&self, keep: impl Fn(&TensorPeak) -> bool) -> Option<&TensorPeak> {
        [&self.tensor, &self.wgmma]
            .into_iter()
            .flatten()
            .filter(|t| keep(t))
            .max_by(|a, b| a.tflops.total_cmp(&b.tflops))
    }

    /// The roofline floor in µs at the float32 peak: the larger of compute time at peak
    /// and the time to move `bytes` at the measured bandwidth.
    pub fn floor_us(&self, flops: u64, bytes: u64) -> f64 {
        self.floor_us_for(DType::F32, flops, bytes)
    }

    /// The roofline floor in µs of a `dtype` task ([`Peaks::compute_tflops`]).
    pub fn floor_us_for(&self, dtype: DType, flops: u64, bytes: u64) -> f64 {
        let compute = flops as f64 / (self.compute_tflops(dtype) * 1e6);
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
    let launch = LaunchConfig::linear(blocks, THREADS, 0);
    let t = timing::time_kernel(ctx, spin, sm_clock_mhz, cfg, |_| {
        ctx.launch(&fma, &launch, &[&out], &[iters])
    })?;
    let flops = 2 * CHAINS * iters * u64::from(blocks) * u64::from(THREADS);
    let fp32_tflops = flops as f64 / (t.median_us * 1e6);
    debug_assert_eq!(iters % UNROLL, 0);

    let floats: usize = 64 << 20; // 256 MiB per buffer, several times any L2
    let src = ctx.alloc(floats)?;
    let dst = ctx.alloc(floats)?;
    ctx.poison(&src)?;
    let copy_launch = LaunchConfig::linear(sm_count * 16, THREADS, 0);
    let n4 = (floats / 4) as u64;
    let t = timing::time_kernel(ctx, spin, sm_clock_mhz, cfg, |_| {
        ctx.launch(&copy, &copy_launch, &[&src, &dst], &[n4])
    })?;
    let bytes = 2 * 4 * floats as u64;
    let bandwidth_gbs = bytes as f64 / (t.median_us * 1e3);
    Ok(Peaks {
        fp32_tflops,
        bandwidth_gbs,
        tensor: None,
        wgmma: None,
    })
}

/// The `mma.sync` kernels, one per tensor-core type, compiled by NVRTC (inline PTX, no
/// header). Each warp runs `CHAINS` independent accumulator chains so that the tensor
/// pipes never wait on one result; the operands come from memory so nothing folds.
const MMA_TEMPLATE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) NAME(const unsigned* in, float* out, unsigned long long iters) {
  const unsigned a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3], b0 = in[4], b1 = in[5];
  float d[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) { d[j][0] = 0.0f; d[j][1] = 0.0f; d[j][2] = 0.0f; d[j][3] = 0.0f; }
#pragma unroll 4
  for (unsigned long long i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("INSTRUCTION {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                   : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  if (s == -1.0f) out[blockIdx.x] = s;
}
"#;

/// Independent accumulator chains per warp in the `mma.sync` kernels.
const MMA_CHAINS: u64 = 8;

/// The `mma.sync` instruction of `dtype`'s tensor-core path, its kernel's name and the
/// multiply-adds one instruction does; `None` for float32 (no tensor cores).
pub fn mma_instruction(dtype: DType) -> Option<(&'static str, &'static str, u64)> {
    match dtype {
        DType::F32 => None,
        DType::Tf32 => Some((
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
            "tilesched_peak_mma_tf32",
            16 * 8 * 8,
        )),
        DType::Fp16 => Some((
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "tilesched_peak_mma_fp16",
            16 * 8 * 16,
        )),
        DType::Bf16 => Some((
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "tilesched_peak_mma_bf16",
            16 * 8 * 16,
        )),
    }
}

/// The CUDA source of `dtype`'s `mma.sync` peak kernel (see [`mma_instruction`]).
pub fn mma_source(dtype: DType) -> Option<String> {
    let (instruction, name, _) = mma_instruction(dtype)?;
    Some(
        MMA_TEMPLATE
            .replace("INSTRUCTION", instruction)
            .replace("NAME", name),
    )
}

#[derive(Debug, Error)]
pub enum PeakError {
    #[error("compiling the {dtype} mma.sync peak kernel: {message}")]
    Compile { dtype: DType, message: String },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// Measures the `mma.sync` peak of `dtype` on `ctx` (compiled for `device`); `None` for
/// float32.
pub fn measure_tensor(
    ctx: &Context,
    device: &DeviceInfo,
    cfg: &TimingConfig,
    dtype: DType,
) -> Result<Option<TensorPeak>, PeakError> {
    let (Some(source), Some((instruction, name, macs))) =
        (mma_source(dtype), mma_instruction(dtype))
    else {
        return Ok(None);
    };
    let compiled = gpu::compile(&source, name, &device.arch()).map_err(|e| PeakError::Compile {
        dtype,
        message: e.to_string(),
    })?;
    let module = ctx.load(&compiled.cubin)?;
    let function = module.function(name, 0)?;
    let spin_module = ctx.load(SPIN_PTX.as_bytes())?;
    let spin = spin_module.function("tilesched_spin", 0)?;
    // Small non-zero operands (zeros can run faster than data): six 32-bit registers of
    // two fp16/bf16 values each, or one TF32 value each.
    let per_word = (4 / dtype.bytes()) as usize;
    let values: Vec<f32> = (0..6 * per_word)
        .map(|i| 0.125 * (i as f32 + 1.0))
        .collect();
    let input = crate::host::upload(ctx, &values, dtype)?;
    let blocks = device.sm_count * 4;
    let out = ctx.alloc(blocks as usize)?;
    let iters: u64 = 512;
    let launch = LaunchConfig::linear(blocks, THREADS, 0);
    let t = timing::time_kernel(ctx, &spin, device.sm_clock_mhz, cfg, |_| {
        ctx.launch(&function, &launch, &[&input, &out], &[iters])
    })?;
    let warps = u64::from(blocks) * u64::from(THREADS / 32);
    let flops = 2 * macs * MMA_CHAINS * iters * warps;
    Ok(Some(TensorPeak {
        dtype,
        instruction: instruction.to_string(),
        tflops: flops as f64 / (t.median_us * 1e6),
    }))
}

/// Warpgroups per block of the `wgmma` peak kernel (one block per SM), the width of its
/// instructions and the k-steps of one shared tile.
const WGMMA_WARPGROUPS: u32 = 2;
const WGMMA_N: i64 = 256;
const WGMMA_STEPS: i64 = 4;

/// The `wgmma` peak kernel of `dtype` and its name (`None` where the atom has no
/// instruction for the type): each warpgroup multiplies the same 64-row A and 256-row B
/// shared tiles of 128 bytes of K (128-byte swizzle, small non-zero values) into its own
/// accumulators,
/// `WGMMA_STEPS` instructions (128 bytes of K) per iteration, one commit group in flight.
pub fn wgmma_source(dtype: DType) -> Option<(String, String)> {
    let atom = WgmmaAtom::for_dtype(dtype)?;
    let name = format!("tilesched_peak_wgmma_{}", dtype.name());
    let k = atom.k * WGMMA_STEPS;
    let bytes = atom.element_bytes;
    let layout = |rows| SharedTileLayout {
        rows,
        row_elements: k,
        chunk_elements: 16 / bytes,
        swizzle: true,
    };
    let swizzle = Swizzle::of(&layout(atom.m), bytes)?;
    let element = dtype.c_type();
    let d = WgmmaAtom::accumulator(WGMMA_N);
    let threads = WGMMA_WARPGROUPS as i64 * WARPGROUP_THREADS;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({threads}, 1) {name}(const {element}* in, float* out, unsigned long long iters) {{"
    );
    for (tile, rows) in [("a_sh", atom.m), ("b_sh", WGMMA_N)] {
        let _ = writeln!(
            s,
            "  __shared__ __align__(1024) {element} {tile}[{}];\n  for (int i = threadIdx.x; i < {}; i += {threads}) {tile}[i] = in[i % 8];",
            rows * k,
            rows * k
        );
    }
    s.push_str(
        "  asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n  __syncthreads();\n",
    );
    let _ = writeln!(s, "  float acc[{}];", d.values);
    let _ = writeln!(
        s,
        "#pragma unroll\n  for (int v = 0; v < {}; ++v) acc[v] = 0.0f;",
        d.values
    );
    s.push_str("  const unsigned a0 = (unsigned)__cvta_generic_to_shared(a_sh);\n");
    s.push_str("  const unsigned b0 = (unsigned)__cvta_generic_to_shared(b_sh);\n");
    let _ = writeln!(s, "  {FENCE_C}");
    s.push_str("  for (unsigned long long i = 0; i < iters; ++i) {\n");
    for issue in atom.k_tile_c(WGMMA_N, "acc", ("a0", "b0"), swizzle) {
        let _ = writeln!(s, "    {issue}");
    }
    let _ = writeln!(s, "    {COMMIT_C}\n    {}\n  }}", wait_c(1));
    let _ = writeln!(s, "  {}", wait_c(0));
    let _ = writeln!(
        s,
        "  float sum = 0.0f;\n#pragma unroll\n  for (int v = 0; v < {}; ++v) sum += acc[v];",
        d.values
    );
    s.push_str("  if (sum == -1.0f) out[blockIdx.x] = sum;\n}\n");
    Some((s, name))
}

/// Measures the `wgmma` peak of `dtype` on `ctx` (compiled for `device`'s
/// arch-specific target); `None` for a type without the instruction or a GPU other
/// than Hopper.
pub fn measure_wgmma(
    ctx: &Context,
    device: &DeviceInfo,
    cfg: &TimingConfig,
    dtype: DType,
) -> Result<Option<TensorPeak>, PeakError> {
    let Some((source, name)) = wgmma_source(dtype) else {
        return Ok(None);
    };
    if device.compute_capability != (9, 0) {
        return Ok(None);
    }
    let arch = Target::ArchSpecific.arch(&device.arch());
    let compiled = gpu::compile(&source, &name, &arch).map_err(|e| PeakError::Compile {
        dtype,
        message: e.to_string(),
    })?;
    let module = ctx.load(&compiled.cubin)?;
    let function = module.function(&name, 0)?;
    let spin_module = ctx.load(SPIN_PTX.as_bytes())?;
    let spin = spin_module.function("tilesched_spin", 0)?;
    let values: Vec<f32> = (0..8).map(|i| 0.125 * (i as f32 + 1.0)).collect();
    let input = crate::host::upload(ctx, &values, dtype)?;
    let blocks = device.sm_count;
    let out = ctx.alloc(blocks as usize)?;
    let iters: u64 = 256;
    let threads = WGMMA_WARPGROUPS * WARPGROUP_THREADS as u32;
    let launch = LaunchConfig {
        target: Target::ArchSpecific,
        ..LaunchConfig::linear(blocks, threads, 0)
    };
    let t = timing::time_kernel(ctx, &spin, device.sm_clock_mhz, cfg, |_| {
        ctx.launch(&function, &launch, &[&input, &out], &[iters])
    })?;
    let atom = WgmmaAtom::for_dtype(dtype).expect("a wgmma type");
    let macs = (atom.m * WGMMA_N * atom.k * WGMMA_STEPS) as u64;
    let flops = 2 * macs * iters * u64::from(blocks) * u64::from(WGMMA_WARPGROUPS);
    Ok(Some(TensorPeak {
        dtype,
        instruction: atom.ptx(WGMMA_N),
        tflops: flops as f64 / (t.median_us * 1e6),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_slower_of_compute_and_memory() {
        let peaks = Peaks {
            fp32_tflops: 50.0,
            bandwidth_gbs: 2000.0,
            tensor: None,
            wgmma: None,
        };
        // 100 MFLOP at 50 TFLOP/s = 2 µs; 1 MB at 2000 GB/s = 0.5 µs.
        assert!((peaks.floor_us(100_000_000, 1_000_000) - 2.0).abs() < 1e-12);
        // 1 MFLOP = 0.02 µs; 8 MB = 4 µs.
        assert!((peaks.floor_us(1_000_000, 8_000_000) - 4.0).abs() < 1e-12);
    }

    #[test]
    fn the_roofline_uses_the_tasks_tensor_peak() {
        let peaks = Peaks {
            fp32_tflops: 50.0,
            bandwidth_gbs: 2000.0,
            tensor: Some(TensorPeak {
                dtype: DType::Fp16,
                instruction: mma_instruction(DType::Fp16).unwrap().0.to_string(),
                tflops: 500.0,
            }),
            wgmma: None,
        };
        assert_eq!(peaks.compute_tflops(DType::Fp16), 500.0);
        // Another type's peak is not this one's: the float32 peak stands in.
        assert_eq!(peaks.compute_tflops(DType::Bf16), 50.0);
        assert_eq!(peaks.compute_tflops(DType::F32), 50.0);
        // 1 GFLOP at 500 TFLOP/s = 2 µs, above 1 MB at 2000 GB/s.
        assert!((peaks.floor_us_for(DType::Fp16, 1_000_000_000, 1_000_000) - 2.0).abs() < 1e-12);
        assert!((peaks.floor_us(1_000_000_000, 1_000_000) - 20.0).abs() < 1e-12);
    }

    #[test]
    fn mma_kernels_per_type() {
        assert!(mma_source(DType::F32).is_none());
        let (instr, _, macs) = mma_instruction(DType::Tf32).unwrap();
        assert!(instr.contains("m16n8k8") && instr.contains(".tf32"));
        assert_eq!(macs, 1024);
        assert_eq!(mma_instruction(DType::Bf16).unwrap().2, 2048);
        for dtype in [DType::Tf32, DType::Fp16, DType::Bf16] {
            let source = mma_source(dtype).unwrap();
            let (instr, name, _) = mma_instruction(dtype).unwrap();
            assert!(source.contains(instr) && source.contains(name));
            // NVRTC runs with no include path: nothing may be included.
            assert!(!source.contains("#include"));
            let compiled = gpu::compile(&source, name, "sm_90").unwrap();
            assert!(compiled.cubin.starts_with(b"\x7fELF"), "{dtype}");
            assert_eq!(compiled.resources.spill_store_bytes, 0, "{dtype}");
        }
    }

    #[test]
    fn wgmma_kernels_compile_for_sm_90a() {
        assert!(wgmma_source(DType::F32).is_none());
        for dtype in [DType::Tf32, DType::Fp16, DType::Bf16] {
            let (source, name) = wgmma_source(dtype).unwrap();
            assert!(!source.contains("#include"));
            let compiled = gpu::compile(&source, &name, &Target::ArchSpecific.arch("sm_90"))
                .unwrap_or_else(|e| panic!("{dtype}: {e}"));
            assert_eq!(compiled.resources.spill_store_bytes, 0, "{dtype}");
        }
    }

    #[test]
    fn the_roofline_takes_the_highest_tensor_peak_of_the_type() {
        let peak = |dtype, tflops| TensorPeak {
            dtype,
            instruction: String::new(),
            tflops,
        };
        let peaks = Peaks {
            fp32_tflops: 60.0,
            bandwidth_gbs: 3000.0,
            tensor: Some(peak(DType::Fp16, 600.0)),
            wgmma: Some(peak(DType::Fp16, 900.0)),
        };
        assert_eq!(peaks.compute_tflops(DType::Fp16), 900.0);
        assert_eq!(peaks.compute_tflops(DType::Bf16), 60.0);
        assert_eq!(peaks.compute_tflops(DType::F32), 60.0);
    }

    #[test]
    fn the_kernels_compile_for_sm_90() {
        // NVRTC comes from the project's setup (a PyPI wheel); no GPU needed.
        let compiled = gpu::compile(SOURCE, "tilesched_peak_fma", "sm_90").unwrap();
        assert!(compiled.cubin.starts_with(b"\x7fELF"));
        assert_eq!(compiled.resources.spill_store_bytes, 0);
    }
}
