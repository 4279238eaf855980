//! One bench session on one GPU: per task, our best kernel and the vendor routine on
//! the same inputs, each checked first (ours exactly against the reference kernel, the
//! vendor's to a rounding tolerance, since its FFT and Winograd algorithms round), then
//! timed by the tuner's protocol in alternating rounds so that clock and thermal drift
//! fall on both sides alike.
//!
//! Runs in the calling process: every kernel of ours comes from a log whose worker
//! already checked it, and the vendor libraries are trusted.
//!
//! Buffers, checks and launches are `gpu::buffers`', the worker's own: the same rotated
//! copies and the same split-K zeroing, so that our times here compare with the log's.

use crate::cublas::{Cublas, Gemm};
use crate::cudnn::{Algorithm, CudnnConv};
use crate::peaks::{self, Peaks};
use crate::report::{Measured, Side};
use crate::vendor::{self, Library, Source, VendorError};
use gpu::buffers::{BufferSets, ReferenceError};
use gpu::cuda::{Buffer, Context, CudaError, Module};
use gpu::timing::{self, SPIN_PTX, TimingConfig};
use gpu::{DeviceInfo, Problem};
use schedule::{LaunchConfig, Operator, Task};
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("no GPU: {0}")]
    NoGpu(String),
    #[error(transparent)]
    Vendor(#[from] VendorError),
    #[error("CUDA: {0}")]
    Cuda(#[from] CudaError),
    /// The reference kernel's output cannot be the expected one (a CUDA failure while
    /// running it is a `Cuda` error).
    #[error(transparent)]
    Reference(ReferenceError),
    #[error("compiling {what}: {message}")]
    Compile { what: String, message: String },
}

impl From<ReferenceError> for BenchError {
    fn from(e: ReferenceError) -> BenchError {
        match e {
            ReferenceError::Cuda(e) => BenchError::Cuda(e),
            e => BenchError::Reference(e),
        }
    }
}

/// Our kernel for a task, as built from the log's best state.
pub struct OurKernel {
    pub cubin: Vec<u8>,
    pub name: String,
    pub launch: LaunchConfig,
}

/// How a session times and where it finds the vendor libraries.
#[derive(Debug, Clone)]
pub struct Options {
    pub device: u32,
    /// Per side and task, in total over the rounds.
    pub timing: TimingConfig,
    pub rounds: u32,
    pub cudnn: Option<PathBuf>,
    pub cublas: Option<PathBuf>,
    /// cuDNN algorithms timed by our protocol to pick the fastest (cuDNN's own
    /// benchmark orders them; ours decides).
    pub algorithms: usize,
    pub seed: u64,
}

impl Options {
    /// The protocol of one round of one side.
    pub fn round_timing(&self) -> TimingConfig {
        let rounds = self.rounds.max(1);
        TimingConfig {
            warmup: self.timing.warmup,
            min_time_ms: self.timing.min_time_ms / f64::from(rounds),
            min_repeats: self.timing.min_repeats.div_ceil(rounds),
            max_repeats: self.timing.max_repeats.div_ceil(rounds),
        }
    }
}

/// The vendor side of a session, loaded on first use.
enum Vendor {
    Cudnn,
    Cublas(Cublas),
}

pub struct Session {
    ctx: Context,
    pub device: DeviceInfo,
    spin: Module,
    options: Options,
    vendor: Option<Vendor>,
    /// Where the vendor library came from and its version, once loaded.
    pub vendor_description: Option<String>,
}

/// Workspace cuDNN may use while its algorithms are searched.
const FIND_WORKSPACE_BYTES: usize = 1 << 30;
/// cuDNN handles per task, each with its own find and our timing of what it returns;
/// the fastest (handle, algorithm) is the baseline. cuDNN 9.14 on an H100 sometimes
/// runs an algorithm several times slower in one handle than in another (resnet's
/// 256->128 1x1 stride 2, IMPLICIT_PRECOMP_GEMM: 154 µs in one process, 16 µs in
/// others), which would make the baseline weaker than cuDNN is.
const CUDNN_HANDLES: usize = 2;

fn compile(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, BenchError> {
    gpu::compile(source, name, arch)
        .map(|k| k.cubin)
        .map_err(|e| BenchError::Compile {
            what: name.to_string(),
            message: e.to_string(),
        })
}

impl Session {
    pub fn new(options: Options) -> Result<Session, BenchError> {
        if !gpu::cuda::driver_present() {
            return Err(BenchError::NoGpu(
                "the CUDA driver (libcuda.so.1) is not installed".to_string(),
            ));
        }
        let ctx = Context::new(options.device).map_err(|e| BenchError::NoGpu(e.to_string()))?;
        let device = DeviceInfo::query(&ctx)?;
        let spin = ctx.load(SPIN_PTX.as_bytes())?;
        Ok(Session {
            ctx,
            device,
            spin,
            options,
            vendor: None,
            vendor_description: None,
        })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Loads the library that `op` is compared with (cuDNN for conv2d, cuBLAS
    /// otherwise); says where it came from.
    pub fn load_vendor(&mut self, op: &Operator) -> Result<String, BenchError> {
        let (lib, given) = match op {
            Operator::Conv2d(_) => (Library::Cudnn, &self.options.cudnn),
            _ => (Library::Cublas, &self.options.cublas),
        };
        let source = vendor::load(lib, given.as_deref())?;
        let (vendor, version) = match lib {
            Library::Cudnn => (Vendor::Cudnn, crate::cudnn::version()),
            Library::Cublas => {
                let cublas = Cublas::new(&self.ctx)?;
                let version = crate::cublas::version(&cublas);
                (Vendor::Cublas(cublas), version)
            }
        };
        let from = match source {
            Source::LoaderPath => String::new(),
            Source::Directory(d) => format!(" from {}", d.display()),
        };
        let text = match lib {
            Library::Cudnn => format!(
                "cuDNN {version}{from} (FMA math, no TF32; fastest algorithm by our protocol among those cuDNN's find returns, in each of {CUDNN_HANDLES} handles)"
            ),
            Library::Cublas => {
                format!("cuBLAS {version}{from} (sgemm, default math: no TF32)")
            }
        };
        self.vendor = Some(vendor);
        self.vendor_description = Some(text.clone());
        Ok(text)
    }

    /// The device's FP32 peak and copy bandwidth.
    pub fn peaks(&self) -> Result<Peaks, BenchError> {
        let cubin = compile(peaks::SOURCE, "tilesched_peak_fma", &self.device.arch())?;
        let module = self.ctx.load(&cubin)?;
        let spin = self.spin.function("tilesched_spin", 0)?;
        Ok(peaks::measure(
            &self.ctx,
            &module,
            &spin,
            self.device.sm_clock_mhz,
            self.device.sm_count,
            &self.options.timing,
        )?)
    }

    /// Measures one task: `ours` is the log's best kernel (if any), `reference` the
    /// cubin of the task's reference kernel.
    pub fn task(
        &mut self,
        task: &Task,
        problem: &Problem,
        reference: &OurKernel,
        ours: Option<&OurKernel>,
    ) -> Result<TaskTimes, BenchError> {
        let ctx = &self.ctx;
        let sets = BufferSets::new(ctx, problem, &self.device)?;

        let reference_module = ctx.load(&reference.cubin)?;
        let reference_fn =
            reference_module.function(&reference.name, reference.launch.dynamic_shared_bytes)?;
        let expected = sets.run_reference(ctx, &reference_fn, reference.launch)?;

        let mut problems = Vec::new();
        let ours_module = ours.map(|k| ctx.load(&k.cubin)).transpose()?;
        let ours_fn = match (ours, &ours_module) {
            (Some(k), Some(m)) => {
                let f = m.function(&k.name, k.launch.dynamic_shared_bytes)?;
                match sets.check(ctx, &f, k.launch, &expected)? {
                    None => Some((f, k.launch)),
                    Some(m) => {
                        problems.push(format!("our kernel is wrong: {m}"));
                        None
                    }
                }
            }
            _ => None,
        };

        let vendor = self.prepare_vendor(task, &sets)?;
        let (vendor_max_abs_error, vendor_ok) = {
            let got = sets.output_of(ctx, |set| vendor.run(set).map_err(BenchError::from))?;
            let scale = expected
                .iter()
                .fold(1.0f64, |m, v| m.max(f64::from(v.abs())));
            let err = expected
                .iter()
                .zip(&got)
                .map(|(e, g)| f64::from(e - g).abs())
                .fold(
                    0.0f64,
                    |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
                );
            // FFT/Winograd round; anything beyond 1e-3 of the largest output is an error.
            let ok = err <= 1e-3 * scale;
            if !ok {
                problems.push(format!(
                    "the vendor's output differs from the exact result by up to {err} (largest |output| {scale})"
                ));
            }
            (err, ok)
        };

        let spin = self.spin.function("tilesched_spin", 0)?;
        let round = self.options.round_timing();
        let mut our_samples = Vec::new();
        let mut vendor_samples = Vec::new();
        for r in 0..self.options.rounds.max(1) {
            // ours, vendor, vendor, ours, ...: each side goes first every other round.
            for side in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
                if side == 0 {
                    if let Some((f, launch)) = &ours_fn {
                        let t = timing::time_kernel(
                            ctx,
                            &spin,
                            self.device.sm_clock_mhz,
                            &round,
                            |i| sets.launch(ctx, f, *launch, i),
                        )?;
                        our_samples.extend(t.samples_us);
                    }
                } else if vendor_ok {
                    let mut failure = None;
                    let t =
                        timing::time_kernel(ctx, &spin, self.device.sm_clock_mhz, &round, |i| {
                            if let Err(e) = vendor.run(sets.set(i)) {
                                failure.get_or_insert(e);
                            }
                            Ok(())
                        })?;
                    if let Some(e) = failure {
                        return Err(e.into());
                    }
                    vendor_samples.extend(t.samples_us);
                }
            }
        }
        Ok(TaskTimes {
            ours: Side::from_samples(&our_samples),
            vendor: Side::from_samples(&vendor_samples),
            vendor_algorithm: vendor.describe(),
            vendor_candidates: match &vendor {
                VendorRun::Cudnn { timed, .. } => timed.clone(),
                VendorRun::Cublas { .. } => Vec::new(),
            },
            vendor_max_abs_error: Some(vendor_max_abs_error),
            problems,
        })
    }

    /// Times, by our protocol, the FMA algorithms `cudnn`'s find returns (the first
    /// `--algorithms` of them): the fastest that ran, the workspace they share, and one
    /// line per algorithm.
    fn time_cudnn(&self, cudnn: &CudnnConv, sets: &BufferSets) -> Result<CudnnTimes, BenchError> {
        let ctx = &self.ctx;
        fn three(s: &[Buffer]) -> [&Buffer; 3] {
            [&s[0], &s[1], &s[2]]
        }
        let find_workspace = ctx.alloc(FIND_WORKSPACE_BYTES / 4)?;
        let found = cudnn.algorithms(three(sets.set(0)), &find_workspace)?;
        drop(find_workspace);
        let candidates: Vec<Algorithm> = found
            .into_iter()
            .take(self.options.algorithms.max(1))
            .collect();
        let Some(need) = candidates.iter().map(|a| a.workspace_bytes).max() else {
            return Err(VendorError::Call {
                call: "cudnnFindConvolutionForwardAlgorithmEx",
                status: "no FMA algorithm runs for this shape".to_string(),
            }
            .into());
        };
        let workspace = ctx.alloc(need.div_ceil(4))?;
        let spin = self.spin.function("tilesched_spin", 0)?;
        let quick = TimingConfig {
            min_time_ms: 10.0,
            ..self.options.round_timing()
        };
        let mut best: Option<(f64, Algorithm)> = None;
        let mut timed = Vec::new();
        for algorithm in candidates {
            let mut failure = None;
            let t = timing::time_kernel(ctx, &spin, self.device.sm_clock_mhz, &quick, |i| {
                if let Err(e) = cudnn.run(&algorithm, three(sets.set(i)), &workspace) {
                    failure.get_or_insert(e);
                }
                Ok(())
            })?;
            timed.push(match &failure {
                None => format!(
                    "{} {:.2} µs (cuDNN's find: {:.2} µs)",
                    algorithm.name(),
                    t.median_us,
                    f64::from(algorithm.find_ms) * 1e3
                ),
                Some(e) => format!("{} failed: {e}", algorithm.name()),
            });
            if failure.is_none() && best.is_none_or(|(us, _)| t.median_us < us) {
                best = Some((t.median_us, algorithm));
            }
        }
        Ok(CudnnTimes {
            best,
            workspace,
            lines: timed,
        })
    }

    /// Sets up the vendor routine for `task`; for cuDNN, times the algorithms its find
    /// returns with our protocol, in each of `CUDNN_HANDLES` handles, and keeps the
    /// fastest.
    fn prepare_vendor<'s>(
        &'s self,
        task: &Task,
        sets: &BufferSets,
    ) -> Result<VendorRun<'s>, BenchError> {
        let ctx = &self.ctx;
        match (&task.op, &self.vendor) {
            (Operator::Conv2d(conv), Some(Vendor::Cudnn)) => {
                let mut chosen: Option<(f64, CudnnConv, Algorithm, Buffer)> = None;
                let mut timed = Vec::new();
                for handle in 1..=CUDNN_HANDLES {
                    let cudnn = CudnnConv::new(ctx, conv)?;
                    let times = self.time_cudnn(&cudnn, sets)?;
                    timed.extend(
                        times
                            .lines
                            .into_iter()
                            .map(|l| format!("handle {handle}: {l}")),
                    );
                    if let Some((us, algorithm)) = times.best
                        && chosen.as_ref().is_none_or(|c| us < c.0)
                    {
                        chosen = Some((us, cudnn, algorithm, times.workspace));
                    }
                }
                let (_, cudnn, algorithm, workspace) = chosen.ok_or(VendorError::Call {
                    call: "cudnnConvolutionForward",
                    status: "every algorithm failed".to_string(),
                })?;
                Ok(VendorRun::Cudnn {
                    cudnn,
                    algorithm,
                    workspace,
                    timed,
                })
            }
            (Operator::Matmul { m, n, k }, Some(Vendor::Cublas(cublas))) => Ok(VendorRun::Cublas {
                cublas,
                shape: Gemm {
                    batch: 1,
                    m: *m,
                    n: *n,
                    k: *k,
                },
            }),
            (Operator::BatchMatmul { b, m, n, k }, Some(Vendor::Cublas(cublas))) => {
                Ok(VendorRun::Cublas {
                    cublas,
                    shape: Gemm {
                        batch: *b,
                        m: *m,
                        n: *n,
                        k: *k,
                    },
                })
            }
            _ => Err(VendorError::Call {
                call: "bench",
                status: format!("no vendor library loaded for {}", task.op.name()),
            }
            .into()),
        }
    }
}

/// cuDNN's algorithms in one handle, timed by our protocol.
struct CudnnTimes {
    /// The median µs of the fastest that ran, and that algorithm.
    best: Option<(f64, Algorithm)>,
    /// The workspace they share (the largest any of them needs).
    workspace: Buffer,
    /// One line per algorithm: its time, or its failure.
    lines: Vec<String>,
}

/// The vendor routine of one task, ready to run on a buffer set.
enum VendorRun<'s> {
    Cudnn {
        cudnn: CudnnConv,
        algorithm: Algorithm,
        workspace: Buffer,
        /// Every algorithm tried, with its time by our protocol (or its failure).
        timed: Vec<String>,
    },
    Cublas {
        cublas: &'s Cublas,
        shape: Gemm,
    },
}

impl VendorRun<'_> {
    fn run(&self, set: &[Buffer]) -> Result<(), VendorError> {
        let three = [&set[0], &set[1], &set[2]];
        match self {
            VendorRun::Cudnn {
                cudnn,
                algorithm,
                workspace,
                ..
            } => cudnn.run(algorithm, three, workspace),
            VendorRun::Cublas { cublas, shape } => cublas.sgemm(*shape, three),
        }
    }

    fn describe(&self) -> Option<String> {
        Some(match self {
            VendorRun::Cudnn { algorithm, .. } => format!("cudnn {}", algorithm.name()),
            VendorRun::Cublas { shape, .. } if shape.batch > 1 => {
                "cublasSgemmStridedBatched".to_string()
            }
            VendorRun::Cublas { .. } => "cublasSgemm".to_string(),
        })
    }
}

/// What the session measured for one task.
#[derive(Debug, Clone)]
pub struct TaskTimes {
    pub ours: Option<Side>,
    pub vendor: Option<Side>,
    pub vendor_algorithm: Option<String>,
    pub vendor_candidates: Vec<String>,
    pub vendor_max_abs_error: Option<f64>,
    pub problems: Vec<String>,
}

impl TaskTimes {
    /// The report's row data, with the task's identity from the caller.
    pub fn into_measured(self, base: Measured) -> Measured {
        let mut problems = self.problems;
        if let Some(p) = base.problem.clone() {
            problems.insert(0, p);
        }
        Measured {
            ours: self.ours,
            vendor: self.vendor,
            vendor_algorithm: self.vendor_algorithm,
            vendor_candidates: self.vendor_candidates,
            vendor_max_abs_error: self.vendor_max_abs_error,
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
            ..base
        }
    }
}
