//! One bench session on one GPU: per task, our best kernel and the vendor routine on
//! the same inputs, each checked first (ours exactly against the reference kernel, the
//! vendor's to a rounding tolerance, since its FFT and Winograd algorithms round), then
//! timed by the tuner's protocol in alternating rounds so that clock and thermal drift
//! fall on both sides alike. A vendor routine whose times come out bimodal over the
//! rounds (`Side::is_bimodal`) is passed over for the fastest routine of the next family
//! (`Prepared::runners_up`), checked first, and the rounds run again; the row keeps the
//! flag only when no stable routine is left.
//!
//! Runs in the calling process: every kernel of ours comes from a log whose worker
//! already checked it, and the vendor libraries are trusted.
//!
//! Buffers, checks and launches are `gpu::buffers`', the worker's own: the same rotated
//! copies and the same split-K zeroing, so that our times here compare with the log's.

use crate::baseline::{self, Choices};
use crate::peaks::{self, Peaks};
use crate::report::{Measured, Side};
use crate::vendor;
use crate::vendor::VendorError;
use gpu::buffers::{BufferSets, ReferenceError};
use gpu::cuda::{Context, CudaError, Module};
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
    /// How many vendor alternatives are timed per task.
    pub choices: Choices,
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
            race_us: None,
            precision: None,
        }
    }
}

pub struct Session {
    ctx: Context,
    pub device: DeviceInfo,
    spin: Module,
    options: Options,
}

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
        })
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Loads the library that `op` is compared with (cuDNN for conv2d, cuBLAS
    /// otherwise): the newest copy found, or the one in the given directory, with its
    /// sub-libraries (`vendor::load`); `baseline::prepare` then sets up each task. A
    /// conv2d also loads cuBLAS where it can, for its 1×1 layers.
    pub fn load_vendor(&mut self, op: &Operator) -> Result<(), BenchError> {
        let given = match op {
            Operator::Conv2d(_) => &self.options.cudnn,
            _ => &self.options.cublas,
        };
        let lib = baseline::library_for(op);
        vendor::load(lib, given.as_deref())?;
        if lib == vendor::Library::Cudnn {
            // The graph API is the baseline's first source: without it, stop here.
            crate::cudnn_graph::require()?;
            // cuBLAS for 1×1 convolutions that are one GEMM (`baseline::conv_gemm`):
            // optional unless named, each such task's candidate lines say when it is
            // missing.
            let given = self.options.cublas.as_deref();
            if self.options.choices.conv_gemm_algorithms > 0
                && let Err(e) = vendor::load(vendor::Library::Cublas, given)
                && given.is_some()
            {
                return Err(e.into());
            }
        }
        Ok(())
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
        let (expected, prepared) = self.expected_and_baseline(task, &sets, reference, 10.0)?;

        let mut problems = Vec::new();
        let ours_module = ours.map(|k| ctx.load(&k.cubin)).transpose()?;
        let ours_fn = match (ours, &ours_module) {
            (Some(k), Some(m)) => {
                let f = m.function(&k.name, k.launch.dynamic_shared_bytes)?;
                match sets.check(ctx, &f, &k.launch, &expected)? {
                    None => Some((f, k.launch.clone())),
                    Some(m) => {
                        problems.push(format!("our kernel is wrong: {m}"));
                        None
                    }
                }
            }
            _ => None,
        };
        let checked = |vendor: &baseline::Baseline| -> Result<(f64, Option<String>), BenchError> {
            let got = vendor_output(ctx, &sets, task, vendor)?;
            Ok(vendor_error(&expected, &got))
        };
        let (mut vendor_max_abs_error, wrong) = checked(&prepared.baseline)?;
        let mut vendor_ok = wrong.is_none();
        problems.extend(wrong);
        let mut candidates = prepared.candidates;
        let mut vendor = prepared.baseline;
        let mut runners_up = prepared.runners_up.into_iter();
        let (our_samples, vendor_samples) = loop {
            let (ours_t, vendor_t) =
                self.rounds(task, &sets, ours_fn.as_ref(), vendor_ok.then_some(&vendor))?;
            // A bimodal vendor time is no baseline: the next family's fastest routine
            // that is exact takes its place (the row keeps the flag when none is left).
            let bimodal = Side::from_samples(&vendor_t).filter(Side::is_bimodal);
            let Some(side) = bimodal else {
                break (ours_t, vendor_t);
            };
            // The next runner-up whose output is exact.
            let mut next = None;
            for (_, candidate) in runners_up.by_ref() {
                match checked(&candidate)? {
                    (error, None) => {
                        next = Some((candidate, error));
                        break;
                    }
                    (_, Some(wrong)) => {
                        candidates.push(format!("{}: {wrong}: passed over", candidate.describe()))
                    }
                }
            }
            let Some((next, error)) = next else {
                break (ours_t, vendor_t);
            };
            candidates.push(format!(
                "{}: bimodal over the rounds (p10 {:.2}, median {:.2}, p90 {:.2} µs): passed over for {}",
                vendor.describe(),
                side.p10_us,
                side.median_us,
                side.p90_us,
                next.describe()
            ));
            vendor_max_abs_error = error;
            vendor = next;
            vendor_ok = true;
        };
        Ok(TaskTimes {
            ours: Side::from_samples(&our_samples),
            vendor: Side::from_samples(&vendor_samples),
            vendor_algorithm: Some(vendor.describe()),
            vendor_tensor_cores: Some(vendor.tensor_cores(task)),
            vendor_times_epilogue: vendor.times_epilogue(task),
            vendor_timed: prepared.timed,
            vendor_candidates: candidates,
            vendor_max_abs_error: Some(vendor_max_abs_error),
            problems,
        })
    }

    /// Times our kernel and `vendor` (each where given) in alternating rounds; returns
    /// their samples.
    fn rounds(
        &self,
        task: &Task,
        sets: &BufferSets,
        ours: Option<&(gpu::cuda::Function, LaunchConfig)>,
        vendor: Option<&baseline::Baseline>,
    ) -> Result<(Vec<f32>, Vec<f32>), BenchError> {
        let ctx = &self.ctx;
        let spin = self.spin.function("tilesched_spin", 0)?;
        let round = self.options.round_timing();
        let mut our_samples = Vec::new();
        let mut vendor_samples = Vec::new();
        for r in 0..self.options.rounds.max(1) {
            // ours, vendor, vendor, ours, ...: each side goes first every other round.
            for side in if r % 2 == 0 { [0, 1] } else { [1, 0] } {
                if side == 0 {
                    if let Some((f, launch)) = ours {
                        let t = timing::time_kernel(
                            ctx,
                            &spin,
                            self.device.sm_clock_mhz,
                            &round,
                            |i| sets.launch(ctx, f, launch, i),
                        )?;
                        our_samples.extend(t.samples_us);
                    }
                } else if let Some(vendor) = vendor {
                    let mut failure = None;
                    let t =
                        timing::time_kernel(ctx, &spin, self.device.sm_clock_mhz, &round, |i| {
                            if let Err(e) = vendor.run_timed(operands(sets, task, i)) {
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
        Ok((our_samples, vendor_samples))
    }
}

/// The vendor's largest error against the exact output, and what is wrong if it is
/// beyond rounding: FFT and Winograd round, but anything beyond 1e-3 of the largest
/// output is an error.
fn vendor_error(expected: &[f32], got: &[f32]) -> (f64, Option<String>) {
    let scale = expected
        .iter()
        .fold(1.0f64, |m, v| m.max(f64::from(v.abs())));
    let err = expected
        .iter()
        .zip(got)
        .map(|(e, g)| f64::from(e - g).abs())
        .fold(
            0.0f64,
            |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
        );
    let wrong = (err > 1e-3 * scale).then(|| {
        format!(
            "the vendor's output differs from the exact result by up to {err} (largest |output| {scale})"
        )
    });
    (err, wrong)
}

/// The three outputs of one task on the same inputs (`Session::outputs`), decoded to f32.
pub struct Outputs {
    /// The reference kernel's: exact.
    pub expected: Vec<f32>,
    /// The caller's routine's.
    pub ours: Vec<f32>,
    /// The vendor's (cuDNN or cuBLAS, at the task's precision).
    pub vendor: Vec<f32>,
    /// The vendor routine, as `Baseline::describe` names it.
    pub vendor_routine: String,
}

impl Session {
    /// Runs `run` (which enqueues the task on set 0's buffers: the inputs, the bias if
    /// any, then the output, on this session's stream, `Context::raw_stream`), the
    /// reference kernel and the vendor's fastest routine on the same inputs, and returns
    /// their outputs: for kernels launched by something other than the session, such as
    /// the runtime.
    pub fn outputs(
        &mut self,
        task: &Task,
        problem: &Problem,
        reference: &OurKernel,
        run: impl FnOnce(&[gpu::cuda::Buffer]) -> Result<(), BenchError>,
    ) -> Result<Outputs, BenchError> {
        let sets = BufferSets::new(&self.ctx, problem, &self.device)?;
        let (expected, prepared) = self.expected_and_baseline(task, &sets, reference, 2.0)?;
        let ours = sets.output_of(&self.ctx, run)?;
        let vendor = vendor_output(&self.ctx, &sets, task, &prepared.baseline)?;
        Ok(Outputs {
            expected,
            ours,
            vendor,
            vendor_routine: prepared.baseline.describe(),
        })
    }

    /// The reference kernel's output on set 0 of `sets` (exact), and the vendor's
    /// fastest routine for `task` on the same buffers, each alternative timed for
    /// `min_time_ms`.
    fn expected_and_baseline(
        &self,
        task: &Task,
        sets: &BufferSets,
        reference: &OurKernel,
        min_time_ms: f64,
    ) -> Result<(Vec<f32>, baseline::Prepared), BenchError> {
        let ctx = &self.ctx;
        let reference_module = ctx.load(&reference.cubin)?;
        let reference_fn =
            reference_module.function(&reference.name, reference.launch.dynamic_shared_bytes)?;
        let expected = sets.run_reference(ctx, &reference_fn, &reference.launch)?;
        let spin = self.spin.function("tilesched_spin", 0)?;
        let protocol = baseline::Protocol {
            ctx,
            spin: &spin,
            sm_clock_mhz: self.device.sm_clock_mhz,
            timing: TimingConfig {
                min_time_ms,
                ..self.options.round_timing()
            },
        };
        let prepared = baseline::prepare(
            &protocol,
            task,
            &|i| operands(sets, task, i),
            self.options.choices,
        )?;
        Ok((expected, prepared))
    }
}

/// The vendor's operands of launch `i`: the inputs, the output and, when the task adds
/// one, the bias (a set is the inputs, the bias, then the output).
fn operands<'a>(
    sets: &'a BufferSets,
    task: &Task,
    i: usize,
) -> ([&'a gpu::cuda::Buffer; 3], Option<&'a gpu::cuda::Buffer>) {
    let s = sets.set(i);
    let bias = task.epilogue.bias.then(|| &s[2]);
    ([&s[0], &s[1], sets.output(i)], bias)
}

/// The vendor routine's output on set 0 (poisoned first), decoded to f32.
fn vendor_output(
    ctx: &Context,
    sets: &BufferSets,
    task: &Task,
    vendor: &baseline::Baseline,
) -> Result<Vec<f32>, BenchError> {
    sets.output_of(ctx, |_| {
        vendor
            .run(operands(sets, task, 0))
            .map_err(BenchError::from)
    })
}

/// What the session measured for one task.
#[derive(Debug, Clone)]
pub struct TaskTimes {
    pub ours: Option<Side>,
    pub vendor: Option<Side>,
    pub vendor_algorithm: Option<String>,
    pub vendor_tensor_cores: Option<bool>,
    pub vendor_times_epilogue: Option<bool>,
    pub vendor_timed: usize,
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
            vendor_tensor_cores: self.vendor_tensor_cores,
            vendor_times_epilogue: self.vendor_times_epilogue,
            vendor_timed: self.vendor_timed,
            vendor_candidates: self.vendor_candidates,
            vendor_max_abs_error: self.vendor_max_abs_error,
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
            ..base
        }
    }
}
