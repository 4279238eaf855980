//! The vendor side of one task, at the task's precision and layout: every routine the
//! vendor offers for it is timed by our protocol on the same rotated buffers as our
//! kernel, and the fastest is the baseline.
//!
//! - conv2d: cuDNN, in each of several handles (one handle sometimes runs an algorithm
//!   several times slower than another: cuDNN 9.14 on an H100, resnet's 256->128 1x1
//!   stride 2, IMPLICIT_PRECOMP_GEMM: 154 µs in one process, 16 µs in others), every
//!   algorithm its find returns at the task's precision (up to `Choices::algorithms`).
//! - matmul, batch matmul: the plain cuBLAS call (`cublasSgemm` / `cublasGemmEx` and
//!   their strided batched forms) and the first `Choices::lt_algorithms` algorithms of
//!   cuBLASLt's heuristic; cuBLASLt is kept only where it is faster.
//!
//! Each candidate's line (its time, or why it failed) is kept for the report, so that
//! the choice can be checked.

use crate::cublas::{Cublas, Gemm, GemmTypes, LtCandidate, LtMatmul};
use crate::cudnn::{Algorithm, CudnnConv};
use crate::report::VendorLibrary;
use crate::vendor::{self, Library, VendorError};
use gpu::cuda::{Buffer, Context, Function};
use gpu::timing::{self, TimingConfig};
use schedule::{Epilogue, Operator, Task};

/// How candidates are timed: the session's context, its spin kernel and clock, and a
/// (short) timing protocol per candidate.
pub struct Protocol<'a> {
    pub ctx: &'a Context,
    pub spin: &'a Function<'a>,
    pub sm_clock_mhz: u32,
    pub timing: TimingConfig,
}

impl Protocol<'_> {
    /// The median µs of `run` (which enqueues one run on the operands of launch `i`),
    /// or the first error it returned.
    fn time(
        &self,
        mut run: impl FnMut(usize) -> Result<(), VendorError>,
    ) -> Result<f64, VendorError> {
        let mut failure = None;
        let t = timing::time_kernel(self.ctx, self.spin, self.sm_clock_mhz, &self.timing, |i| {
            if failure.is_none()
                && let Err(e) = run(i)
            {
                failure = Some(e);
            }
            Ok(())
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(t.median_us),
        }
    }
}

/// How many vendor alternatives are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// cuDNN algorithms timed per handle, in the order of cuDNN's own benchmark.
    pub algorithms: usize,
    /// cuDNN handles, each with its own find.
    pub handles: usize,
    /// cuBLASLt heuristic algorithms timed beside the plain cuBLAS call.
    pub lt_algorithms: usize,
}

impl Default for Choices {
    fn default() -> Choices {
        Choices {
            algorithms: 8,
            handles: 2,
            lt_algorithms: 4,
        }
    }
}

/// Workspace cuDNN's find may use while it searches.
const FIND_WORKSPACE_BYTES: usize = 1 << 30;
/// Workspace a cuBLASLt algorithm may use (cuBLAS's own default on Hopper is 32 MiB).
const LT_WORKSPACE_BYTES: usize = 64 << 20;

/// The operands of launch `i` of a rotation: A (or x), B (or w), the output, and the
/// bias of a task that adds one.
pub type Operands<'a> = dyn Fn(usize) -> ([&'a Buffer; 3], Option<&'a Buffer>) + 'a;

/// The vendor routine chosen for a task, ready to run.
pub enum Baseline {
    Cudnn {
        conv: CudnnConv,
        algorithm: Algorithm,
        workspace: Buffer,
    },
    Cublas {
        cublas: Cublas,
        shape: Gemm,
        types: GemmTypes,
    },
    CublasLt {
        lt: LtMatmul,
        candidate: LtCandidate,
        workspace: Buffer,
    },
}

/// The baseline of a task, its time by our protocol, and every alternative tried.
pub struct Prepared {
    pub baseline: Baseline,
    pub median_us: f64,
    /// One line per alternative: its time by our protocol (and cuDNN's own), or its
    /// failure.
    pub candidates: Vec<String>,
}

impl Baseline {
    /// Enqueues one run on `operands` (A or x, B or w, output; and the bias).
    pub fn run(
        &self,
        (operands, bias): ([&Buffer; 3], Option<&Buffer>),
    ) -> Result<(), VendorError> {
        match self {
            Baseline::Cudnn {
                conv,
                algorithm,
                workspace,
            } => conv.run(algorithm, operands, bias, workspace),
            Baseline::Cublas {
                cublas,
                shape,
                types,
            } => cublas.gemm(*shape, types, operands),
            Baseline::CublasLt {
                lt,
                candidate,
                workspace,
            } => lt.run(candidate, operands, workspace),
        }
    }

    /// Enqueues what the benchmark times: the convolution or GEMM alone. A task's fused
    /// epilogue is in our kernel's time but not here, so its speedup is a lower bound
    /// whatever way a vendor user adds the bias (a separate `cudnnAddTensor`, or the
    /// fused call restricted to one algorithm).
    pub fn run_timed(&self, operands: [&Buffer; 3]) -> Result<(), VendorError> {
        match self {
            Baseline::Cudnn {
                conv,
                algorithm,
                workspace,
            } => conv.convolve(algorithm, operands, workspace),
            _ => self.run((operands, None)),
        }
    }

    /// The routine, for reports: library, version, algorithm or call, math or compute
    /// type, element types (and layout for cuDNN), e.g.
    /// `cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM tensor-op fp16 NHWC`.
    pub fn describe(&self) -> String {
        match self {
            Baseline::Cudnn {
                conv, algorithm, ..
            } => conv.describe(algorithm),
            Baseline::Cublas {
                cublas,
                shape,
                types,
            } => cublas.describe(*shape, types),
            Baseline::CublasLt { lt, candidate, .. } => lt.describe(candidate),
        }
    }
}

/// The library a task's baseline comes from (cuDNN for conv2d, cuBLAS otherwise).
pub fn library_for(op: &Operator) -> Library {
    match op {
        Operator::Conv2d(_) => Library::Cudnn,
        _ => Library::Cublas,
    }
}

/// Sets up and times every vendor alternative for `task` on `operands` (see the module
/// doc) and returns the fastest. The library must be loaded (`vendor::load`).
pub fn prepare(
    protocol: &Protocol,
    task: &Task,
    operands: &Operands,
    choices: Choices,
) -> Result<Prepared, VendorError> {
    match task.op {
        Operator::Conv2d(_) => prepare_cudnn(protocol, task, operands, choices),
        Operator::Matmul { m, n, k } => {
            let shape = Gemm { batch: 1, m, n, k };
            prepare_cublas(protocol, task, shape, operands, choices)
        }
        Operator::BatchMatmul { b, m, n, k } => {
            let shape = Gemm { batch: b, m, n, k };
            prepare_cublas(protocol, task, shape, operands, choices)
        }
    }
}

fn prepare_cudnn(
    protocol: &Protocol,
    task: &Task,
    operands: &Operands,
    choices: Choices,
) -> Result<Prepared, VendorError> {
    let ctx = protocol.ctx;
    let mut best: Option<(f64, CudnnConv, Algorithm, Buffer)> = None;
    let mut lines = Vec::new();
    for handle in 1..=choices.handles.max(1) {
        let conv = CudnnConv::for_task(ctx, task)?;
        let find_workspace = ctx.alloc(FIND_WORKSPACE_BYTES / 4)?;
        let found = conv.algorithms(operands(0).0, &find_workspace)?;
        drop(find_workspace);
        let found: Vec<Algorithm> = found.into_iter().take(choices.algorithms.max(1)).collect();
        let Some(need) = found.iter().map(|a| a.workspace_bytes).max() else {
            lines.push(format!(
                "handle {handle}: cuDNN's find returned no algorithm at {} precision",
                task.dtype
            ));
            continue;
        };
        let workspace = ctx.alloc(need.div_ceil(4).max(1))?;
        let mut fastest: Option<(f64, Algorithm)> = None;
        for algorithm in found {
            let label = format!("{} {}", algorithm.name(), algorithm.math.label());
            match protocol.time(|i| conv.convolve(&algorithm, operands(i).0, &workspace)) {
                Ok(us) => {
                    lines.push(format!(
                        "handle {handle}: {label} {us:.2} µs (cuDNN's find: {:.2} µs)",
                        f64::from(algorithm.find_ms) * 1e3
                    ));
                    if fastest.is_none_or(|(f, _)| us < f) {
                        fastest = Some((us, algorithm));
                    }
                }
                Err(e) => lines.push(format!("handle {handle}: {label} failed: {e}")),
            }
        }
        if let Some((us, algorithm)) = fastest
            && best.as_ref().is_none_or(|b| us < b.0)
        {
            best = Some((us, conv, algorithm, workspace));
        }
    }
    let (median_us, conv, algorithm, workspace) = best.ok_or_else(|| VendorError::Call {
        call: "cudnnConvolutionForward",
        status: format!("no algorithm ran ({})", lines.join("; ")),
    })?;
    Ok(Prepared {
        baseline: Baseline::Cudnn {
            conv,
            algorithm,
            workspace,
        },
        median_us,
        candidates: lines,
    })
}

fn prepare_cublas(
    protocol: &Protocol,
    task: &Task,
    shape: Gemm,
    operands: &Operands,
    choices: Choices,
) -> Result<Prepared, VendorError> {
    let ctx = protocol.ctx;
    if task.epilogue != Epilogue::default() {
        // cuBLAS's plain GEMM has no epilogue; timing it alone would flatter it and its
        // output would not match.
        return Err(VendorError::Unsupported {
            lib: Library::Cublas,
            what: "a matmul with a fused bias or ReLU".to_string(),
        });
    }
    let types = GemmTypes::for_types(task.dtype, task.out_dtype);
    let cublas = Cublas::new(ctx)?;
    let plain_name = cublas.describe(shape, &types);
    let plain_us = protocol.time(|i| cublas.gemm(shape, &types, operands(i).0))?;
    let mut lines = vec![format!("{plain_name} {plain_us:.2} µs")];
    let mut lt_best: Option<(f64, LtMatmul, LtCandidate, Buffer)> = None;
    if choices.lt_algorithms > 0 {
        match lt_candidates(ctx, shape, types, choices.lt_algorithms) {
            Ok((lt, found)) => {
                let need = found.iter().map(|c| c.workspace_bytes).max().unwrap_or(0);
                let workspace = ctx.alloc(need.div_ceil(4).max(1))?;
                let mut fastest: Option<(f64, LtCandidate)> = None;
                for candidate in found {
                    let name = lt.describe(&candidate);
                    match protocol.time(|i| lt.run(&candidate, operands(i).0, &workspace)) {
                        Ok(us) => {
                            lines.push(format!("{name} {us:.2} µs"));
                            if fastest.is_none_or(|(f, _)| us < f) {
                                fastest = Some((us, candidate));
                            }
                        }
                        Err(e) => lines.push(format!("{name} failed: {e}")),
                    }
                }
                if let Some((us, candidate)) = fastest {
                    lt_best = Some((us, lt, candidate, workspace));
                }
            }
            Err(e) => lines.push(format!("cuBLASLt: {e}")),
        }
    }
    let prepared = match lt_best {
        Some((us, lt, candidate, workspace)) if us < plain_us => Prepared {
            baseline: Baseline::CublasLt {
                lt,
                candidate,
                workspace,
            },
            median_us: us,
            candidates: lines,
        },
        _ => Prepared {
            baseline: Baseline::Cublas {
                cublas,
                shape,
                types,
            },
            median_us: plain_us,
            candidates: lines,
        },
    };
    Ok(prepared)
}

fn lt_candidates(
    ctx: &Context,
    shape: Gemm,
    types: GemmTypes,
    count: usize,
) -> Result<(LtMatmul, Vec<LtCandidate>), VendorError> {
    let lt = LtMatmul::new(ctx, shape, types, LT_WORKSPACE_BYTES)?;
    let found = lt.heuristics(count)?;
    Ok((lt, found))
}

/// The loaded copy of `lib` for the report: its version as the library itself states
/// it, where it was loaded from, and the other copies found.
pub fn library(lib: Library) -> Option<VendorLibrary> {
    let loaded = vendor::loaded(lib)?;
    let version = match lib {
        Library::Cudnn => crate::cudnn::version(),
        Library::Cublas => crate::cublas::library_version(),
    };
    Some(VendorLibrary {
        name: lib.name().to_string(),
        version,
        dir: loaded.dir.display().to_string(),
        chosen_by: if loaded.given {
            format!("{} DIR", lib.option())
        } else {
            "newest found".to_string()
        },
        others: loaded
            .found
            .iter()
            .filter(|c| c.dir != loaded.dir)
            .map(|c| {
                format!(
                    "{} at {}",
                    c.version
                        .map_or_else(|| "unknown version".to_string(), |v| v.to_string()),
                    c.dir.display()
                )
            })
            .collect(),
    })
}

/// The session's baseline in words for the report header, by the tasks' element type,
/// e.g. `cuDNN 9.19.0 from DIR (tensor-op math with f32 accumulation, fp16 NHWC;
/// fastest algorithm by our protocol among those cuDNN's find returns, in each of 2
/// handles)`.
pub fn description(lib: Library, task: &Task, choices: Choices) -> String {
    let (version, from) = library(lib).map_or_else(
        || ("(not loaded)".to_string(), String::new()),
        |l| (l.version, format!(" from {}", l.dir)),
    );
    let dtype = task.dtype;
    match lib {
        Library::Cudnn => {
            let math = match dtype {
                schedule::DType::F32 => "FMA math, no TF32".to_string(),
                schedule::DType::Tf32 => "default math: TF32 tensor cores allowed".to_string(),
                d => format!("tensor-op math with f32 accumulation, {d}"),
            };
            format!(
                "cuDNN {version}{from} ({math}, {}; fastest algorithm by our protocol among those cuDNN's find returns, in each of {} handles)",
                task.layout.name().to_uppercase(),
                choices.handles.max(1)
            )
        }
        Library::Cublas => {
            let call = match dtype {
                schedule::DType::F32 => "sgemm, default math: no TF32".to_string(),
                schedule::DType::Tf32 => "cublasGemmEx COMPUTE_32F_FAST_TF32".to_string(),
                d => format!(
                    "cublasGemmEx {d} inputs, COMPUTE_32F, {} output",
                    task.out_dtype
                ),
            };
            format!(
                "cuBLAS {version}{from} ({call}; or cuBLASLt's heuristic best of {} where faster, by our protocol)",
                choices.lt_algorithms
            )
        }
    }
}
