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
//! - conv2d that is one GEMM (a 1×1 filter, stride 1, no padding, one group; NHWC at any
//!   batch, NCHW at batch 1): also cuBLAS, as below, with the first
//!   `Choices::conv_gemm_algorithms` of cuBLASLt's heuristic. cuDNN offers no float32
//!   routine without TF32 that splits the reduction, so on a long reduction over a small
//!   image (EfficientNet-B0's 1152→320 at 7×7) its engines run one serial loop of 1152
//!   steps (45 µs on an H100) where a GEMM library splits K; and in half precision the
//!   GEMM gives a second tensor-core route where cuDNN's pick runs bimodally. NHWC is
//!   `y[NPQ, K] = x[NPQ, C]·wᵀ` (the KRSC weights are B stored transposed), with the bias
//!   and ReLU as cuBLASLt epilogues; NCHW is `y[K, PQ] = w[K, C]·x[C, PQ]`, whose bias
//!   runs along the rows, which cuBLASLt's epilogue cannot add: its epilogue is left out
//!   of the timed call as a legacy convolution's is.
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
use schedule::{DType, Epilogue, Layout, Operator, Task};

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
    /// cuBLASLt heuristic algorithms timed for a conv2d that is one GEMM, beside the
    /// plain cuBLAS call (0: no GEMM route for convolutions). Fewer than for a matmul:
    /// a model has dozens of 1×1 layers and a bench must stay within minutes.
    pub conv_gemm_algorithms: usize,
}

impl Default for Choices {
    fn default() -> Choices {
        Choices {
            engines: 24,
            algorithms: 8,
            handles: 2,
            lt_algorithms: 32,
            conv_gemm_algorithms: 8,
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
    /// `epilogue`: the task's bias and ReLU after the GEMM where the call leaves them
    /// out (a conv2d's, for the correctness run only), as for `CudnnGraph`.
    Cublas {
        cublas: Cublas,
        shape: Gemm,
        types: GemmTypes,
        inputs: GemmInputs,
        epilogue: Option<CudnnConv>,
    },
    /// `bias`: the task's bias converted to the type cuBLASLt takes, where it differs.
    CublasLt {
        lt: LtMatmul,
        candidate: LtCandidate,
        workspace: Buffer,
        bias: Option<Buffer>,
        inputs: GemmInputs,
        epilogue: Option<CudnnConv>,
    },
}

/// What a GEMM baseline computes: a matmul, or a conv2d that is one GEMM (see the
/// module doc), which says how the task's operands (x, w, y) become the GEMM's A, B, C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmInputs {
    Matmul,
    /// `y[NPQ, K] = x[NPQ, C]·wᵀ`: A is x, B is w stored transposed.
    ConvNhwc,
    /// `y[K, PQ] = w[K, C]·x[C, PQ]`: A is w, B is x.
    ConvNchw,
}

impl GemmInputs {
    /// The GEMM's A, B, C from the task's operands.
    pub fn order(self, [x, w, y]: [&Buffer; 3]) -> [&Buffer; 3] {
        match self {
            GemmInputs::Matmul | GemmInputs::ConvNhwc => [x, w, y],
            GemmInputs::ConvNchw => [w, x, y],
        }
    }

    /// Whether cuBLASLt's epilogue adds the task's bias as the task does: a bias per
    /// output column (a matmul's N, an NHWC convolution's channels).
    pub fn fuses_bias(self) -> bool {
        self != GemmInputs::ConvNchw
    }

    /// The routine's name suffix in reports.
    fn suffix(self) -> &'static str {
        match self {
            GemmInputs::Matmul => "",
            GemmInputs::ConvNhwc => ", the 1×1 conv as a GEMM (x·wᵀ, NHWC)",
            GemmInputs::ConvNchw => ", the 1×1 conv as a GEMM (w·x, NCHW)",
        }
    }
}

/// The GEMM a conv2d is, if it is one (see the module doc).
pub fn conv_gemm(task: &Task) -> Option<(Gemm, GemmInputs)> {
    let Operator::Conv2d(s) = task.op else {
        return None;
    };
    let pointwise = s.r == 1
        && s.s == 1
        && s.stride_h == 1
        && s.stride_w == 1
        && s.pad_h == 0
        && s.pad_w == 0
        && s.pad_end() == (0, 0)
        && s.groups == 1;
    if !pointwise {
        return None;
    }
    let pixels = s.h.checked_mul(s.w)?;
    match task.layout {
        Layout::Nhwc => Some((
            Gemm {
                b_transposed: true,
                ..Gemm::new(1, s.n.checked_mul(pixels)?, s.k, s.c)
            },
            GemmInputs::ConvNhwc,
        )),
        Layout::Nchw if s.n == 1 => Some((Gemm::new(1, s.k, pixels, s.c), GemmInputs::ConvNchw)),
        // A batch of NCHW images is a batched GEMM whose A (the weights) is shared: a
        // zero batch stride, which this route does not describe.
        Layout::Nchw => None,
    }
}

/// Adds a task's bias and ReLU after a GEMM that left them out.
fn after_gemm(
    epilogue: &Option<CudnnConv>,
    y: &Buffer,
    bias: Option<&Buffer>,
) -> Result<(), VendorError> {
    match epilogue {
        Some(conv) => conv.epilogue(y, bias),
        None => Ok(()),
    }
}

/// The baseline of a task, its time by our protocol, and every alternative tried.
pub struct Prepared {
    pub baseline: Baseline,
    pub median_us: f64,
    /// The next fastest routines of other families (another graph, legacy handle or
    /// GEMM call), fastest first, with their times: a bench passes over a baseline
    /// whose times turn out bimodal for the next of these.
    pub runners_up: Vec<(f64, Baseline)>,
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
            Baseline::Cublas { epilogue, .. } | Baseline::CublasLt { epilogue, .. } => {
                self.run_timed((operands, bias))?;
                after_gemm(epilogue, operands[2], bias)
            }
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
            Baseline::Cublas {
                cublas,
                shape,
                types,
                inputs,
                ..
            } => cublas.gemm(*shape, types, inputs.order(operands)),
            Baseline::CublasLt {
                lt,
                candidate,
                workspace,
                bias: converted,
                inputs,
                epilogue,
            } => {
                // A bias the call does not add is not passed to it.
                let bias = if epilogue.is_some() {
                    None
                } else {
                    converted.as_ref().or(bias)
                };
                lt.run(candidate, inputs.order(operands), bias, workspace)
            }
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
            Baseline::CublasLt { epilogue, .. } => epilogue.is_none(),
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
                inputs,
                ..
            } => format!("{}{}", cublas.describe(*shape, types), inputs.suffix()),
            Baseline::CublasLt {
                lt,
                candidate,
                inputs,
                ..
            } => format!("{}{}", lt.describe(candidate), inputs.suffix()),
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
            prepare_cublas(protocol, task, Gemm::new(1, m, n, k), operands, choices)
        }
        Operator::BatchMatmul { b, m, n, k } => {
            prepare_cublas(protocol, task, Gemm::new(b, m, n, k), operands, choices)
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

/// Runners-up kept beside the fastest routine.
const RUNNERS_UP: usize = 2;

/// The fastest candidates so far (each the fastest of its family), fastest first.
struct Best<T = Baseline>(Vec<(f64, T)>);

impl<T> Default for Best<T> {
    fn default() -> Best<T> {
        Best(Vec::new())
    }
}

impl<T> Best<T> {
    /// Keeps the family's fastest (`make` builds it) if it ranks among the kept.
    fn keep(&mut self, us: f64, make: impl FnOnce() -> T) {
        let at = self.0.partition_point(|(b, _)| *b <= us);
        if at <= RUNNERS_UP {
            self.0.insert(at, (us, make()));
            self.0.truncate(RUNNERS_UP + 1);
        }
    }
}

impl Best {
    /// The fastest with its time, and the runners-up.
    fn into_prepared(self, candidates: Vec<String>, timed: usize) -> Option<Prepared> {
        let mut kept = self.0.into_iter();
        let (median_us, baseline) = kept.next()?;
        Some(Prepared {
            baseline,
            median_us,
            runners_up: kept.collect(),
            candidates,
            timed,
        })
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
            best.keep(us, || Baseline::CudnnGraph {
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
    let mut best = Best::default();
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
            best.keep(us, || Baseline::Cudnn {
                conv,
                algorithm,
                workspace,
            });
        }
    }
    if choices.conv_gemm_algorithms > 0
        && let Some((shape, inputs)) = conv_gemm(task)
    {
        let gemm = GemmRoute {
            shape,
            inputs,
            lt_algorithms: choices.conv_gemm_algorithms,
        };
        timed += time_gemm(protocol, task, gemm, operands, &mut best, &mut lines)?;
    }
    let tried = lines.join("; ");
    best.into_prepared(lines, timed)
        .ok_or_else(|| VendorError::Call {
            call: "cuDNN convolution",
            status: format!("no engine or algorithm ran ({tried})"),
        })
}

fn prepare_cublas(
    protocol: &Protocol,
    task: &Task,
    shape: Gemm,
    operands: &Operands,
    choices: Choices,
) -> Result<Prepared, VendorError> {
    let mut best = Best::default();
    let mut lines = Vec::new();
    let gemm = GemmRoute {
        shape,
        inputs: GemmInputs::Matmul,
        lt_algorithms: choices.lt_algorithms,
    };
    let timed = time_gemm(protocol, task, gemm, operands, &mut best, &mut lines)?;
    let tried = lines.join("; ");
    best.into_prepared(lines, timed)
        .ok_or_else(|| VendorError::Unsupported {
            lib: Library::Cublas,
            what: format!("this matmul: no cuBLAS or cuBLASLt routine ran ({tried})"),
        })
}

/// The GEMM route alone for a conv2d that is one GEMM (`conv_gemm`; cuBLAS must be
/// loaded): what `prepare` adds to cuDNN's candidates, to check it on its own.
pub fn prepare_conv_gemm(
    protocol: &Protocol,
    task: &Task,
    operands: &Operands,
    lt_algorithms: usize,
) -> Result<Prepared, VendorError> {
    let unsupported = |what: String| VendorError::Unsupported {
        lib: Library::Cublas,
        what,
    };
    let (shape, inputs) =
        conv_gemm(task).ok_or_else(|| unsupported(format!("{} as one GEMM", task.key())))?;
    let mut best = Best::default();
    let mut lines = Vec::new();
    let gemm = GemmRoute {
        shape,
        inputs,
        lt_algorithms,
    };
    let timed = time_gemm(protocol, task, gemm, operands, &mut best, &mut lines)?;
    let tried = format!("{}: {}", task.key(), lines.join("; "));
    best.into_prepared(lines, timed)
        .ok_or_else(|| unsupported(tried))
}

/// A GEMM to time: its shape, what it computes, and how many of cuBLASLt's algorithms.
#[derive(Debug, Clone, Copy)]
struct GemmRoute {
    shape: Gemm,
    inputs: GemmInputs,
    lt_algorithms: usize,
}

/// Times the plain cuBLAS call and cuBLASLt's first algorithms for `gemm`, keeping the
/// fastest in `best`; returns the candidates timed. cuBLASLt adds the task's bias and
/// ReLU where it can add them as the task does (`GemmInputs::fuses_bias`), and the plain
/// call, which has no epilogue, is then not timed; otherwise both leave the epilogue to
/// cuDNN after the call (for the correctness run only).
fn time_gemm(
    protocol: &Protocol,
    task: &Task,
    gemm: GemmRoute,
    operands: &Operands,
    best: &mut Best,
    lines: &mut Vec<String>,
) -> Result<usize, VendorError> {
    let ctx = protocol.ctx;
    let GemmRoute {
        shape,
        inputs,
        lt_algorithms,
    } = gemm;
    let types = GemmTypes::for_types(task.dtype, task.out_dtype);
    let has_epilogue = task.epilogue != Epilogue::default();
    let fused = !has_epilogue || inputs.fuses_bias() || !task.epilogue.bias;
    // The task's epilogue after a call without it: cuDNN's bias add and activation.
    let after = || -> Result<Option<CudnnConv>, VendorError> {
        if fused {
            Ok(None)
        } else {
            CudnnConv::for_task(ctx, task).map(Some)
        }
    };
    if !fused && let Err(e) = after() {
        lines.push(format!(
            "cuBLAS{}: the epilogue after it: {e}",
            inputs.suffix()
        ));
        return Ok(0);
    }
    let lt_epilogue = if fused {
        task.epilogue
    } else {
        Epilogue::default()
    };
    let order = |i: usize| {
        let (ops, bias) = operands(i);
        (inputs.order(ops), bias)
    };
    let mut timed = 0;
    // cuBLAS's plain GEMM has no epilogue: a task that cuBLASLt fuses goes to it alone.
    if !has_epilogue || !fused {
        let cublas = match Cublas::new(ctx) {
            Ok(c) => c,
            Err(e) if inputs != GemmInputs::Matmul => {
                lines.push(format!("cuBLAS{}: {e}", inputs.suffix()));
                return Ok(0);
            }
            Err(e) => return Err(e),
        };
        let plain_name = format!("{}{}", cublas.describe(shape, &types), inputs.suffix());
        timed += 1;
        match protocol.time(|i| cublas.gemm(shape, &types, order(i).0)) {
            Ok(us) => {
                lines.push(format!("{plain_name} {us:.2} µs"));
                best.keep(us, || Baseline::Cublas {
                    cublas,
                    shape,
                    types,
                    inputs,
                    epilogue: after().ok().flatten(),
                });
            }
            Err(e) if inputs != GemmInputs::Matmul => {
                lines.push(format!("{plain_name} failed: {e}"))
            }
            Err(e) => return Err(e),
        }
    }
    if lt_algorithms == 0 {
        return Ok(timed);
    }
    match lt_candidates(ctx, shape, types, lt_epilogue, lt_algorithms) {
        Ok((lt, found)) => {
            let need = found.iter().map(|c| c.workspace_bytes).max().unwrap_or(0);
            let workspace = ctx.alloc(need.div_ceil(4).max(1))?;
            // Every rotated set holds the same bias: one converted copy serves all.
            let converted = match operands(0).1 {
                Some(b) if lt_epilogue.bias && lt.bias_dtype() != task.dtype => {
                    let n = shape.n as usize;
                    let values = crate::host::download(ctx, b, n, task.dtype)?;
                    Some(crate::host::upload(ctx, &values, lt.bias_dtype())?)
                }
                _ => None,
            };
            timed += found.len();
            let fastest = protocol.fastest(
                found,
                |c| format!("{}{}", lt.describe(c), inputs.suffix()),
                |c, i| {
                    let (ops, bias) = order(i);
                    let bias = if lt_epilogue.bias {
                        converted.as_ref().or(bias)
                    } else {
                        None
                    };
                    lt.run(c, ops, bias, &workspace)
                },
                lines,
            );
            if let Some((us, candidate)) = fastest {
                best.keep(us, || Baseline::CublasLt {
                    lt,
                    candidate,
                    workspace,
                    bias: converted,
                    inputs,
                    epilogue: after().ok().flatten(),
                });
            }
        }
        Err(e) => lines.push(format!("cuBLASLt{}: {e}", inputs.suffix())),
    }
    Ok(timed)
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
                "cuDNN {version}{from} ({math}, {}; the fastest by our protocol of up to {} graph-API engine configurations from heuristics A, B and fallback, the task's bias and ReLU fused where an engine takes them, and of the legacy algorithms cuDNN's find returns, up to {} in each of {} handles{})",
                task.layout.name().to_uppercase(),
                choices.engines,
                choices.algorithms,
                choices.handles,
                conv_gemm_description(choices),
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

/// The GEMM route of conv2d baselines in words, for the report header (empty when off).
fn conv_gemm_description(choices: Choices) -> String {
    if choices.conv_gemm_algorithms == 0 {
        return String::new();
    }
    format!(
        "; a 1×1 convolution that is one GEMM also through cuBLAS and the first {} algorithms of cuBLASLt's heuristic",
        choices.conv_gemm_algorithms
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use schedule::task::Conv2d;

    fn conv(shape: Conv2d, layout: Layout, dtype: DType) -> Task {
        Task {
            op: Operator::Conv2d(shape),
            epilogue: Epilogue::default(),
            dtype,
            out_dtype: dtype,
            layout,
        }
    }

    #[test]
    fn the_fastest_and_two_runners_up_are_kept_in_order() {
        let mut best = Best::<&str>::default();
        let mut built = Vec::new();
        for (us, name) in [
            (5.0, "e"),
            (3.0, "c"),
            (9.0, "i"),
            (1.0, "a"),
            (4.0, "d"),
            (7.0, "g"),
        ] {
            best.keep(us, || {
                built.push(name);
                name
            });
        }
        assert_eq!(best.0, [(1.0, "a"), (3.0, "c"), (4.0, "d")]);
        assert_eq!(
            built,
            ["e", "c", "i", "a", "d"],
            "a candidate ranked out is never built"
        );
    }

    #[test]
    fn a_pointwise_convolution_is_one_gemm_in_either_layout() {
        // EfficientNet-B0's 1152→320 at 7×7.
        let one = Conv2d::new(1, 1152, 7, 7, 320, 1, 1, 1, 0);
        let (shape, inputs) = conv_gemm(&conv(one, Layout::Nhwc, DType::Fp16)).unwrap();
        assert_eq!(inputs, GemmInputs::ConvNhwc);
        assert_eq!((shape.batch, shape.m, shape.n, shape.k), (1, 49, 320, 1152));
        assert!(shape.b_transposed, "KRSC weights are B stored transposed");
        let (shape, inputs) = conv_gemm(&conv(one, Layout::Nchw, DType::F32)).unwrap();
        assert_eq!(inputs, GemmInputs::ConvNchw);
        assert_eq!((shape.batch, shape.m, shape.n, shape.k), (1, 320, 49, 1152));
        assert!(!shape.b_transposed);
        // NHWC folds the batch into M.
        let eight = Conv2d::new(8, 64, 56, 56, 256, 1, 1, 1, 0);
        let (shape, _) = conv_gemm(&conv(eight, Layout::Nhwc, DType::Fp16)).unwrap();
        assert_eq!((shape.m, shape.n, shape.k), (8 * 56 * 56, 256, 64));
    }

    #[test]
    fn only_convolutions_that_are_one_gemm_take_the_route() {
        let nhwc = |s: Conv2d| conv_gemm(&conv(s, Layout::Nhwc, DType::Fp16));
        let one = Conv2d::new(1, 64, 14, 14, 128, 1, 1, 1, 0);
        assert!(nhwc(one).is_some());
        // A batch of NCHW images would share A across the batch.
        let batched = Conv2d::new(2, 64, 14, 14, 128, 1, 1, 1, 0);
        assert!(conv_gemm(&conv(batched, Layout::Nchw, DType::F32)).is_none());
        assert!(
            nhwc(Conv2d::new(1, 64, 14, 14, 128, 1, 1, 2, 0)).is_none(),
            "strided"
        );
        assert!(
            nhwc(Conv2d::new(1, 64, 14, 14, 128, 1, 1, 1, 1)).is_none(),
            "padded"
        );
        assert!(
            nhwc(Conv2d::new(1, 64, 14, 14, 128, 3, 3, 1, 1)).is_none(),
            "3×3"
        );
        let mut grouped = one;
        grouped.groups = 2;
        assert!(nhwc(grouped).is_none(), "grouped");
        let mut end_padded = one;
        end_padded.pad_bottom = Some(1);
        assert!(nhwc(end_padded).is_none(), "padded at the end");
        let matmul = Task::new(Operator::Matmul { m: 4, n: 4, k: 4 }, Epilogue::default());
        assert!(conv_gemm(&matmul.unwrap()).is_none());
    }

    #[test]
    fn a_conv_gemm_says_which_bias_it_adds_and_the_header_names_the_route() {
        assert!(GemmInputs::Matmul.fuses_bias());
        assert!(
            GemmInputs::ConvNhwc.fuses_bias(),
            "a bias per column: the channels"
        );
        assert!(
            !GemmInputs::ConvNchw.fuses_bias(),
            "NCHW's bias runs along the rows"
        );
        let one = conv(
            Conv2d::new(1, 8, 4, 4, 8, 1, 1, 1, 0),
            Layout::Nhwc,
            DType::Fp16,
        );
        let described = description(Library::Cudnn, &one, Choices::default());
        assert!(
            described.ends_with(
                "also through cuBLAS and the first 8 algorithms of cuBLASLt's heuristic)"
            ),
            "{described}"
        );
        let off = Choices {
            conv_gemm_algorithms: 0,
            ..Choices::default()
        };
        let described = description(Library::Cudnn, &one, off);
        assert!(described.ends_with("in each of 2 handles)"), "{described}");
    }
}
