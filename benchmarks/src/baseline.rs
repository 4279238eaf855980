//! The vendor side of one task, at the task's precision and layout: every routine the
//! vendor offers for it is timed by our protocol on the same rotated buffers as our
//! kernel, and the fastest is the baseline.
//!
//! - conv2d: cuDNN's graph API first (`cudnn_graph`: the engine configurations of the
//!   heuristics A, B and fallback, up to `Choices::engines`, with the task's bias and
//!   ReLU fused into the graph where an engine takes them), then the legacy API as
//!   further candidates, so that no task gets a weaker vendor than it had before: in
//!   each of several handles (one handle sometimes runs an algorithm several times
//!   slower than another: cuDNN 9.14 on an H100, resnet's 256->128 1x1 stride 2,
//!   IMPLICIT_PRECOMP_GEMM: 154 µs in one process, 16 µs in others), every algorithm its
//!   find returns at the task's precision (up to `Choices::algorithms`).
//! - matmul, batch matmul: the plain cuBLAS call (`cublasSgemm` / `cublasGemmEx` and
//!   their strided batched forms) and the first `Choices::lt_algorithms` algorithms of
//!   cuBLASLt's heuristic; cuBLASLt is kept only where it is faster. A task with a bias or
//!   ReLU runs cuBLASLt alone, the epilogue in the call.
//!
//! Each candidate is timed on what it computes: a fused graph or cuBLASLt epilogue with
//! the epilogue, a legacy convolution without it (its bias add and ReLU would be extra
//! launches); the fastest wins, so a row whose baseline leaves the epilogue out is a
//! lower bound of our speedup, and says so.
//!
//! Each candidate's line (its time, or why it failed) is kept for the report, so that
//! the choice can be checked.

use crate::cublas::{Cublas, Gemm, GemmTypes, LtCandidate, LtMatmul};
use crate::cudnn::{Algorithm, CudnnConv, MathType};
use crate::cudnn_graph::{Engine, GraphConv, GraphForm};
use crate::report::VendorLibrary;
use crate::vendor::{self, Library, VendorError};
use gpu::cuda::{Buffer, Context, Function};
use gpu::timing::{self, TimingConfig};
use schedule::{DType, Epilogue, Operator, Task};

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

impl Protocol<'_> {
    /// Times each candidate (`run(c, i)` enqueues candidate `c` on the operands of launch
    /// `i`), adding a line per candidate to `lines` (its `label` and time, or why it
    /// failed); returns the fastest with its time.
    fn fastest<C>(
        &self,
        candidates: impl IntoIterator<Item = C>,
        label: impl Fn(&C) -> String,
        run: impl Fn(&C, usize) -> Result<(), VendorError>,
        lines: &mut Vec<String>,
    ) -> Option<(f64, C)> {
        let mut fastest: Option<(f64, C)> = None;
        for candidate in candidates {
            match self.time(|i| run(&candidate, i)) {
                Ok(us) => {
                    lines.push(format!("{} {us:.2} µs", label(&candidate)));
                    if fastest.as_ref().is_none_or(|(f, _)| us < *f) {
                        fastest = Some((us, candidate));
                    }
                }
                Err(e) => lines.push(format!("{} failed: {e}", label(&candidate))),
            }
        }
        fastest
    }
}

/// How many vendor alternatives are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// cuDNN graph-API engine configurations timed (heuristics A, B, fallback).
    pub engines: usize,
    /// Legacy cuDNN algorithms timed per handle, in the order of cuDNN's own benchmark.
    pub algorithms: usize,
    /// Legacy cuDNN handles, each with its own find.
    pub handles: usize,
    /// cuBLASLt heuristic algorithms timed beside the plain cuBLAS call.
    pub lt_algorithms: usize,
}

impl Default for Choices {
    fn default() -> Choices {
        Choices {
            engines: 24,
            algorithms: 8,
            handles: 2,
            lt_algorithms: 32,
        }
    }
}

/// Workspace cuDNN's find may use while it searches.
const FIND_WORKSPACE_BYTES: usize = 1 << 30;
/// Workspace a cuBLASLt algorithm may use (cuBLAS's own default on Hopper is 32 MiB).
const LT_WORKSPACE_BYTES: usize = 64 << 20;
/// Workspace a cuDNN engine may use; engines that need more are passed over.
const GRAPH_WORKSPACE_BYTES: usize = 1 << 30;

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
    /// A graph-API engine; `epilogue` adds the task's bias and ReLU after a graph that
    /// computes the convolution alone (for the correctness run only).
    CudnnGraph {
        graph: GraphConv,
        engine: Engine,
        workspace: Buffer,
        epilogue: Option<CudnnConv>,
    },
    Cublas {
        cublas: Cublas,
        shape: Gemm,
        types: GemmTypes,
    },
    /// `bias`: the task's bias converted to the type cuBLASLt takes, where it differs.
    CublasLt {
        lt: LtMatmul,
        candidate: LtCandidate,
        workspace: Buffer,
        bias: Option<Buffer>,
    },
}

/// The baseline of a task, its time by our protocol, and every alternative tried.
pub struct Prepared {
    pub baseline: Baseline,
    pub median_us: f64,
    /// One line per alternative: its time by our protocol (and cuDNN's own), or its
    /// failure or why it was passed over.
    pub candidates: Vec<String>,
    /// Alternatives timed.
    pub timed: usize,
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
            Baseline::CudnnGraph {
                graph,
                engine,
                workspace,
                epilogue,
            } => {
                graph.execute(engine, &graph_buffers(graph, operands, bias), workspace)?;
                match epilogue {
                    Some(conv) if !graph.spec.computes_epilogue => conv.epilogue(operands[2], bias),
                    None if !graph.spec.computes_epilogue => Err(VendorError::Unsupported {
                        lib: Library::Cudnn,
                        what: "this task's bias or ReLU after a graph without them".to_string(),
                    }),
                    _ => Ok(()),
                }
            }
            Baseline::Cublas {
                cublas,
                shape,
                types,
            } => cublas.gemm(*shape, types, operands),
            Baseline::CublasLt {
                lt,
                candidate,
                workspace,
                bias: converted,
            } => lt.run(candidate, operands, converted.as_ref().or(bias), workspace),
        }
    }

    /// Enqueues what the benchmark times: the routine's own call, with the task's
    /// epilogue where that call fuses it (a graph with pointwise operations, a cuBLASLt
    /// epilogue) and without it for a legacy convolution (see [`Baseline::times_epilogue`]).
    pub fn run_timed(
        &self,
        (operands, bias): ([&Buffer; 3], Option<&Buffer>),
    ) -> Result<(), VendorError> {
        match self {
            Baseline::Cudnn {
                conv,
                algorithm,
                workspace,
            } => conv.convolve(algorithm, operands, workspace),
            Baseline::CudnnGraph {
                graph,
                engine,
                workspace,
                ..
            } => graph.execute(engine, &graph_buffers(graph, operands, bias), workspace),
            _ => self.run((operands, bias)),
        }
    }

    /// Whether the timed call includes `task`'s bias and ReLU: `None` for a task without
    /// them.
    pub fn times_epilogue(&self, task: &Task) -> Option<bool> {
        if task.epilogue == Epilogue::default() {
            return None;
        }
        Some(match self {
            Baseline::Cudnn { .. } | Baseline::Cublas { .. } => false,
            Baseline::CudnnGraph { graph, .. } => graph.spec.computes_epilogue,
            Baseline::CublasLt { .. } => true,
        })
    }

    /// Whether the routine runs on tensor cores, as far as the library says: a graph
    /// engine's numerical notes; for a legacy cuDNN algorithm, the tensor-op math its
    /// find ran it with (which permits tensor cores, not proves them); for cuBLAS, the
    /// element type (its half and TF32 routines are tensor-core GEMMs on Hopper).
    pub fn tensor_cores(&self, task: &Task) -> bool {
        match self {
            Baseline::Cudnn { algorithm, .. } => {
                algorithm.math == MathType::TensorOp
                    || (task.dtype == DType::Tf32 && algorithm.math == MathType::Default)
            }
            Baseline::CudnnGraph { engine, .. } => engine.info.tensor_cores,
            Baseline::Cublas { .. } | Baseline::CublasLt { .. } => task.dtype != DType::F32,
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
            Baseline::CudnnGraph { graph, engine, .. } => graph.describe(engine),
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

/// The buffers of a graph run: x, w, the bias where the graph adds it, y.
fn graph_buffers<'a>(
    graph: &GraphConv,
    [x, w, y]: [&'a Buffer; 3],
    bias: Option<&'a Buffer>,
) -> Vec<&'a Buffer> {
    let with_bias = graph.spec.io_uids().len() == 4;
    match bias {
        Some(b) if with_bias => vec![x, w, b, y],
        _ => vec![x, w, y],
    }
}

/// The forms of a task's graph to try, in order, until one has engines: the epilogue
/// fused (or, for a half input with a float32 output, the direct form and then one
/// with a converting tail), else the convolution alone.
fn graph_forms(task: &Task) -> Vec<GraphForm> {
    let form = |fuse_epilogue, identity_tail| GraphForm {
        fuse_epilogue,
        identity_tail,
    };
    if task.epilogue != Epilogue::default() {
        vec![form(true, false), form(false, false)]
    } else if task.out_dtype.bytes() != task.dtype.bytes() {
        vec![form(true, false), form(true, true)]
    } else {
        vec![form(true, false)]
    }
}

/// The fastest candidate so far: its time and the baseline it is.
type Best = Option<(f64, Baseline)>;

fn keep(best: &mut Best, us: f64, make: impl FnOnce() -> Baseline) {
    if best.as_ref().is_none_or(|(b, _)| us < *b) {
        *best = Some((us, make()));
    }
}

/// Times the graph-API engines of `task` (the first form with any), keeping the
/// fastest in `best`; returns the candidates timed.
fn time_graph_engines(
    protocol: &Protocol,
    task: &Task,
    operands: &Operands,
    choices: Choices,
    best: &mut Best,
    lines: &mut Vec<String>,
) -> Result<usize, VendorError> {
    let ctx = protocol.ctx;
    for form in graph_forms(task) {
        let graph = match GraphConv::new(ctx, task, form) {
            Ok(g) => g,
            Err(e) => {
                lines.push(format!("graph (fused: {}): {e}", form.fuse_epilogue));
                continue;
            }
        };
        let (engines, skipped) = graph.engines(choices.engines.max(1));
        let label = graph.spec.label();
        lines.extend(
            skipped
                .into_iter()
                .map(|s| format!("graph {label} {s}: passed over")),
        );
        let engines: Vec<Engine> = engines
            .into_iter()
            .filter(|e| {
                let fits = e.workspace_bytes <= GRAPH_WORKSPACE_BYTES;
                if !fits {
                    lines.push(format!(
                        "graph {label} {}: workspace {} MiB: passed over",
                        e.info.name(),
                        e.workspace_bytes >> 20
                    ));
                }
                fits
            })
            .collect();
        if engines.is_empty() {
            lines.push(format!("graph {label}: no engine"));
            continue;
        }
        let need = engines.iter().map(|e| e.workspace_bytes).max().unwrap_or(0);
        let workspace = ctx.alloc(need.div_ceil(4).max(1))?;
        let timed = engines.len();
        let fastest = protocol.fastest(
            engines,
            |e| format!("graph {label} {} ({})", e.info.name(), e.info.notes()),
            |e, i| {
                let (ops, bias) = operands(i);
                graph.execute(e, &graph_buffers(&graph, ops, bias), &workspace)
            },
            lines,
        );
        if let Some((us, engine)) = fastest {
            let epilogue = if graph.spec.computes_epilogue {
                None
            } else {
                CudnnConv::for_task(ctx, task).ok()
            };
            keep(best, us, || Baseline::CudnnGraph {
                graph,
                engine,
                workspace,
                epilogue,
            });
        }
        return Ok(timed);
    }
    Ok(0)
}

fn prepare_cudnn(
    protocol: &Protocol,
    task: &Task,
    operands: &Operands,
    choices: Choices,
) -> Result<Prepared, VendorError> {
    let ctx = protocol.ctx;
    let mut best: Best = None;
    let mut lines = Vec::new();
    let mut timed = time_graph_engines(protocol, task, operands, choices, &mut best, &mut lines)?;
    for handle in 1..=choices.handles {
        let conv = match CudnnConv::for_task(ctx, task) {
            Ok(conv) => conv,
            // A half input with a float32 output: the legacy API has no routine.
            Err(e @ VendorError::Unsupported { .. }) => {
                lines.push(format!("legacy: {e}"));
                break;
            }
            Err(e) => return Err(e),
        };
        let find_workspace = ctx.alloc(FIND_WORKSPACE_BYTES / 4)?;
        let found = conv.algorithms(operands(0).0, &find_workspace)?;
        drop(find_workspace);
        let found: Vec<Algorithm> = found.into_iter().take(choices.algorithms).collect();
        let Some(need) = found.iter().map(|a| a.workspace_bytes).max() else {
            lines.push(format!(
                "legacy handle {handle}: cuDNN's find returned no algorithm at {} precision",
                task.dtype
            ));
            continue;
        };
        let workspace = ctx.alloc(need.div_ceil(4).max(1))?;
        timed += found.len();
        let fastest = protocol.fastest(
            found,
            |a| {
                format!(
                    "legacy handle {handle}: {} {} (cuDNN's find: {:.2} µs)",
                    a.name(),
                    a.math.label(),
                    f64::from(a.find_ms) * 1e3
                )
            },
            |a, i| conv.convolve(a, operands(i).0, &workspace),
            &mut lines,
        );
        if let Some((us, algorithm)) = fastest {
            keep(&mut best, us, || Baseline::Cudnn {
                conv,
                algorithm,
                workspace,
            });
        }
    }
    let (median_us, baseline) = best.ok_or_else(|| VendorError::Call {
        call: "cuDNN convolution",
        status: format!("no engine or algorithm ran ({})", lines.join("; ")),
    })?;
    Ok(Prepared {
        baseline,
        median_us,
        candidates: lines,
        timed,
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
    let types = GemmTypes::for_types(task.dtype, task.out_dtype);
    let mut best: Best = None;
    let mut lines = Vec::new();
    let mut timed = 0;
    // cuBLAS's plain GEMM has no epilogue: a task with one goes to cuBLASLt alone.
    if task.epilogue == Epilogue::default() {
        let cublas = Cublas::new(ctx)?;
        let plain_name = cublas.describe(shape, &types);
        let plain_us = protocol.time(|i| cublas.gemm(shape, &types, operands(i).0))?;
        lines.push(format!("{plain_name} {plain_us:.2} µs"));
        timed += 1;
        best = Some((
            plain_us,
            Baseline::Cublas {
                cublas,
                shape,
                types,
            },
        ));
    }
    if choices.lt_algorithms > 0 {
        match lt_candidates(ctx, shape, types, task.epilogue, choices.lt_algorithms) {
            Ok((lt, found)) => {
                let need = found.iter().map(|c| c.workspace_bytes).max().unwrap_or(0);
                let workspace = ctx.alloc(need.div_ceil(4).max(1))?;
                // Every rotated set holds the same bias: one converted copy serves all.
                let converted = match operands(0).1 {
                    Some(b) if task.epilogue.bias && lt.bias_dtype() != task.dtype => {
                        let n = shape.n as usize;
                        let values = crate::host::download(ctx, b, n, task.dtype)?;
                        Some(crate::host::upload(ctx, &values, lt.bias_dtype())?)
                    }
                    _ => None,
                };
                timed += found.len();
                let fastest = protocol.fastest(
                    found,
                    |c| lt.describe(c),
                    |c, i| {
                        let (ops, bias) = operands(i);
                        lt.run(c, ops, converted.as_ref().or(bias), &workspace)
                    },
                    &mut lines,
                );
                if let Some((us, candidate)) = fastest {
                    keep(&mut best, us, || Baseline::CublasLt {
                        lt,
                        candidate,
                        workspace,
                        bias: converted,
                    });
                }
            }
            Err(e) => lines.push(format!("cuBLASLt: {e}")),
        }
    }
    let (median_us, baseline) = best.ok_or_else(|| VendorError::Unsupported {
        lib: Library::Cublas,
        what: format!(
            "this matmul: no cuBLAS or cuBLASLt routine ran ({})",
            lines.join("; ")
        ),
    })?;
    Ok(Prepared {
        baseline,
        median_us,
        candidates: lines,
        timed,
    })
}

fn lt_candidates(
    ctx: &Context,
    shape: Gemm,
    types: GemmTypes,
    epilogue: Epilogue,
    count: usize,
) -> Result<(LtMatmul, Vec<LtCandidate>), VendorError> {
    let lt = LtMatmul::new(ctx, shape, types, epilogue, LT_WORKSPACE_BYTES)?;
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
                "cuDNN {version}{from} ({math}, {}; the fastest by our protocol of up to {} graph-API engine configurations from heuristics A, B and fallback, the task's bias and ReLU fused where an engine takes them, and of the legacy algorithms cuDNN's find returns, up to {} in each of {} handles)",
                task.layout.name().to_uppercase(),
                choices.engines,
                choices.algorithms,
                choices.handles
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
                "cuBLAS {version}{from} ({call}; or the fastest by our protocol of cuBLASLt's first {} heuristic algorithms where faster, with the bias and ReLU as cuBLASLt epilogues on tasks that have them)",
                choices.lt_algorithms
            )
        }
    }
}
