//! The measurement worker: the process that owns a CUDA context on one GPU and answers
//! `Measure` requests on stdin with `Result`s on stdout (see `protocol`). A kernel that
//! faults takes the context with it, so after any CUDA error the worker answers and
//! exits; the tuner starts a fresh one. A hung kernel is the tuner's to notice: it kills
//! the worker when an answer is late.
//!
//! Per task the worker keeps the buffers (`buffers::BufferSets`: the inputs, small
//! integers in the task's element type, in copies rotated between timed launches) and
//! the reference kernel's output, decoded to f32. Candidates are launched by
//! `BufferSets::launch`, as the benchmark launches them: a launch with `zero_output`
//! (split-K: the kernel adds into its output) gets its output zeroed on the same stream
//! right before every run, the check's and each timed one's, so the memset is timed as
//! part of the operation. A simulated backend speaks the same protocol without a GPU,
//! for tests of the tuner's side.
//!
//! A worker never outlives its tuner: a watchdog thread checks every 100 ms that the
//! process that started it (named in `PARENT_ENV`) is still its parent, and ends the
//! worker at once when it is not — even while a hung kernel holds the main thread, so
//! that a tuner killed with `kill -9` leaves no GPU work running.

use crate::buffers::{BufferSets, ReferenceError};
use crate::check::Problem;
use crate::compare::Comparer;
use crate::cuda::{self, Context, CudaError, Module};
use crate::device::DeviceInfo;
use crate::protocol::{
    ErrorKind, KernelImage, MeasureRequest, Outcome, Phases, Request, Response, Timing,
};
use crate::timing::{self, SPIN_PTX};
use std::io::{BufRead, Write};

/// Exit status of a worker that lost its context after answering.
pub const EXIT_FATAL: i32 = 3;
/// Exit status of a worker that found no GPU.
pub const EXIT_UNAVAILABLE: i32 = 4;

/// Environment variable through which the tuner names itself (its PID) to its workers.
pub const PARENT_ENV: &str = "TILESCHED_TUNER_PID";
/// Exit status of a worker whose tuner is gone.
pub const EXIT_ORPHANED: i32 = 5;
/// How often the watchdog looks for the tuner.
const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// Starts the watchdog: the process ends (without exit handlers, which could wait on a
/// hung kernel; the driver frees the context with the process) as soon as its parent
/// is no longer the tuner that started it. Without `PARENT_ENV` the parent at start is
/// taken.
fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    let tuner = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(parent);
    std::thread::spawn(move || {
        loop {
            if std::os::unix::process::parent_id() != tuner {
                // Not `eprintln!`: with the tuner gone the pipe is closed, and a failed
                // write must not end this thread instead of the process.
                let _ = writeln!(
                    std::io::stderr(),
                    "worker: the tuner (PID {tuner}) is gone; stopping"
                );
                // SAFETY: `_exit` only ends the process; it takes no pointers and runs
                // no handlers, so no state of this process can be observed afterwards.
                unsafe { libc::_exit(EXIT_ORPHANED) };
            }
            std::thread::sleep(WATCH_PERIOD);
        }
    });
}

/// Problems of at least this many bytes report their preparation's stages: drawing and
/// uploading a few GB takes seconds, and a silent minute looks like a hang.
pub const REPORTED_BYTES: u64 = 1 << 30;

/// What measuring a request gave: the outcome, whether the context is lost, and where
/// the time went.
pub type Answer = (Outcome, bool, Phases);

/// Measures requests.
pub trait Backend {
    fn measure(&mut self, request: &MeasureRequest) -> Answer;

    /// Readies `problem` and `reference` for the measurements that follow, saying how it
    /// goes through `progress` (large problems only); an error comes with whether the
    /// context is lost.
    fn prepare(
        &mut self,
        _problem: &Problem,
        _reference: &KernelImage,
        _progress: &mut dyn FnMut(String),
    ) -> Result<(), (String, bool)> {
        Ok(())
    }

    /// Device memory free now, when known.
    fn free_bytes(&self) -> Option<u64> {
        None
    }
}

/// Runs the worker on stdin/stdout; returns the process exit status.
pub fn run(device: u32, simulate: bool) -> i32 {
    watch_parent();
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    if simulate {
        let backend = match Simulated::start() {
            Ok(()) => Ok((Simulated, Simulated::device(device))),
            Err(message) => Err(message),
        };
        return serve(backend, stdin, stdout);
    }
    serve(CudaBackend::new(device), stdin, stdout)
}

fn send(out: &mut impl Write, response: &Response) -> bool {
    let line = serde_json::to_string(response).expect("responses always serialize");
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

/// The request loop, generic over the backend (and its start-up failure).
pub fn serve<B: Backend>(
    backend: Result<(B, DeviceInfo), String>,
    input: impl BufRead,
    mut output: impl Write,
) -> i32 {
    let mut backend = match backend {
        Ok((backend, device)) => {
            let free_bytes = backend.free_bytes();
            if !send(&mut output, &Response::Ready { device, free_bytes }) {
                return 1;
            }
            backend
        }
        Err(message) => {
            send(&mut output, &Response::Unavailable { message });
            return EXIT_UNAVAILABLE;
        }
    };
    for line in input.lines() {
        let Ok(line) = line else { return 1 };
        if line.trim().is_empty() {
            continue;
        }
        let request: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("worker: malformed request ({e}): {line}");
                return 2;
            }
        };
        let request = match request {
            Request::Measure(request) => request,
            Request::Prepare {
                id,
                problem,
                reference,
            } => {
                let key = problem.key.clone();
                let mut progress = |stage: String| {
                    let message = format!("preparing {key}: {stage}");
                    // A lost tuner shows at the answer's send below.
                    send(&mut output, &Response::Progress { id, message });
                };
                let prepared = backend.prepare(&problem, &reference, &mut progress);
                let (error, fatal) = match prepared {
                    Ok(()) => (None, false),
                    Err((e, fatal)) => (Some(e), fatal),
                };
                if !send(&mut output, &Response::Prepared { id, error, fatal }) {
                    return 1;
                }
                if fatal {
                    return EXIT_FATAL;
                }
                continue;
            }
        };
        let (outcome, fatal, phases) = backend.measure(&request);
        let response = Response::Result {
            id: request.id,
            outcome,
            fatal,
            phases,
        };
        if !send(&mut output, &response) {
            return 1;
        }
        if fatal {
            return EXIT_FATAL;
        }
    }
    0
}

/// The buffers and expected output of a prepared problem: decoded on the host (for a
/// mismatch's message) and as the reference left it on the device (what the check
/// compares against).
struct Buffers {
    problem: Problem,
    reference: KernelImage,
    sets: BufferSets,
    expected: Vec<f32>,
    expected_device: crate::cuda::Buffer,
}

impl Buffers {
    /// Device memory held.
    fn bytes(&self) -> u64 {
        self.problem.bytes() * self.sets.count() as u64 + self.expected_device.bytes() as u64
    }
}

/// Most problems a worker keeps prepared at once, and the share of the device's memory
/// they may hold together. A tuner keeps several rounds of different tasks in flight,
/// so one GPU's candidates alternate between tasks: with a single prepared problem,
/// every switch paid for the inputs and the reference run again, 34 ms per candidate on
/// the fp16 GEMM set (an 8192³ reference run alone takes a large part of a second).
const KEPT_PROBLEMS: usize = 16;
const KEPT_MEMORY_SHARE: u64 = 4;

/// Measures on a real GPU.
pub struct CudaBackend {
    ctx: Context,
    device: DeviceInfo,
    spin: Module,
    comparer: Comparer,
    /// Prepared problems, the most recently used first.
    prepared: Vec<Buffers>,
}

fn launch_error(e: CudaError, phases: Phases) -> Answer {
    (
        Outcome::error(ErrorKind::Launch, e.to_string()),
        true,
        phases,
    )
}

/// Milliseconds since `t`.
fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl CudaBackend {
    pub fn new(ordinal: u32) -> Result<(CudaBackend, DeviceInfo), String> {
        if !cuda::driver_present() {
            return Err("no GPU: the CUDA driver (libcuda.so.1) is not installed".to_string());
        }
        let ctx = Context::new(ordinal).map_err(|e| format!("no GPU: {e}"))?;
        let device = DeviceInfo::query(&ctx).map_err(|e| e.to_string())?;
        let spin = ctx.load(SPIN_PTX.as_bytes()).map_err(|e| e.to_string())?;
        let comparer = Comparer::new(&ctx).map_err(|e| e.to_string())?;
        let backend = CudaBackend {
            ctx,
            device: device.clone(),
            spin,
            comparer,
            prepared: Vec::new(),
        };
        Ok((backend, device))
    }

    /// Allocates and fills the buffers of `problem` and runs the reference kernel. An
    /// error comes with whether the context is lost: a reference output that cannot be
    /// the expected one (`ReferenceError::NotFinite`, `Inexact`) leaves it intact.
    fn load_problem(
        &mut self,
        problem: &Problem,
        reference: &KernelImage,
        progress: &mut dyn FnMut(String),
    ) -> Result<(), (String, bool)> {
        // The least recently used problems make room: within the count and memory share
        // kept, and for a new problem that would not fit otherwise.
        let budget = self.device.memory_bytes / KEPT_MEMORY_SHARE;
        let copies = crate::buffers::copy_count(problem.bytes(), &self.device) as u64;
        let wanted = problem.bytes() * (copies + 1);
        while !self.prepared.is_empty() {
            let held: u64 = self.prepared.iter().map(Buffers::bytes).sum();
            let fits = self
                .ctx
                .free_memory()
                .is_ok_and(|free| problem.exceeds(free).is_none());
            if self.prepared.len() < KEPT_PROBLEMS && held + wanted <= budget && fits {
                break;
            }
            self.prepared.pop();
        }
        let ctx = &self.ctx;
        let cuda = |e: CudaError| (e.to_string(), true);
        // Refused before anything is allocated, the context intact: the tuner checks
        // the same up front, but another process may have taken memory since.
        let free = ctx.free_memory().map_err(cuda)?;
        if let Some(why) = problem.exceeds(free) {
            return Err((why, false));
        }
        let mut silent = |_: String| {};
        let progress: &mut dyn FnMut(String) = if problem.bytes() >= REPORTED_BYTES {
            progress
        } else {
            &mut silent
        };
        let sets = BufferSets::new_reporting(ctx, problem, &self.device, progress).map_err(cuda)?;
        let started = std::time::Instant::now();
        let image = std::fs::read(&reference.cubin).map_err(|e| {
            let message = format!("reference cubin {}: {e}", reference.cubin.display());
            (message, true)
        })?;
        let module = ctx.load(&image).map_err(cuda)?;
        let function = module
            .function(&reference.name, reference.launch.dynamic_shared_bytes)
            .map_err(cuda)?;
        // Zeroed first when the reference adds into its output (a split-K kernel as the
        // reference of its own SASS reorderings).
        let expected = sets
            .run_reference(ctx, &function, &reference.launch)
            .map_err(|e| {
                let fatal = matches!(e, ReferenceError::Cuda(_));
                (e.to_string(), fatal)
            })?;
        let expected_device = sets.copy_output(ctx).map_err(cuda)?;
        progress(format!(
            "reference run and its output read back ({:.1} s)",
            started.elapsed().as_secs_f64()
        ));
        self.prepared.insert(
            0,
            Buffers {
                problem: problem.clone(),
                reference: reference.clone(),
                sets,
                expected,
                expected_device,
            },
        );
        Ok(())
    }
}

impl CudaBackend {
    /// Whether `problem` with `reference` is prepared; it becomes the most recent.
    fn find(&mut self, problem: &Problem, reference: &KernelImage) -> bool {
        let Some(at) = self
            .prepared
            .iter()
            .position(|b| b.problem == *problem && b.reference == *reference)
        else {
            return false;
        };
        self.prepared[..=at].rotate_right(1);
        true
    }
}

impl Backend for CudaBackend {
    fn prepare(
        &mut self,
        problem: &Problem,
        reference: &KernelImage,
        progress: &mut dyn FnMut(String),
    ) -> Result<(), (String, bool)> {
        if self.find(problem, reference) {
            return Ok(());
        }
        self.load_problem(problem, reference, progress)
    }

    fn free_bytes(&self) -> Option<u64> {
        self.ctx.free_memory().ok()
    }

    fn measure(&mut self, request: &MeasureRequest) -> Answer {
        let mut phases = Phases::default();
        let reusable = self.find(&request.problem, &request.reference);
        if request.injected == Some(ErrorKind::Environment) {
            killed_from_outside();
        }
        // The reference is the tool's, not the candidate's: its failure is the
        // environment's (a resumed run measures the candidate again).
        if !reusable {
            let started = std::time::Instant::now();
            let loaded = self.load_problem(&request.problem, &request.reference, &mut |_| {});
            phases.prepare_ms = ms_since(started);
            if let Err((e, fatal)) = loaded {
                let message = format!("reference kernel failed: {e}");
                return (
                    Outcome::error(ErrorKind::Environment, message),
                    fatal,
                    phases,
                );
            }
        }
        let buffers = &self.prepared[0];
        let candidate = &request.candidate;
        let started = std::time::Instant::now();
        let image = match std::fs::read(&candidate.cubin) {
            Ok(image) => image,
            Err(e) => {
                let message = format!("cannot read {}: {e}", candidate.cubin.display());
                return (
                    Outcome::error(ErrorKind::Environment, message),
                    false,
                    phases,
                );
            }
        };
        let ctx = &self.ctx;
        let module = match ctx.load(&image) {
            Ok(m) => m,
            Err(e) => return launch_error(e, phases),
        };
        let function = match module.function(&candidate.name, candidate.launch.dynamic_shared_bytes)
        {
            Ok(f) => f,
            Err(e) => return launch_error(e, phases),
        };
        phases.load_ms = ms_since(started);
        // Exact check on copy 0, output poisoned first (zeroed instead for a kernel
        // that adds into it), compared on the GPU.
        let started = std::time::Instant::now();
        let sets = &buffers.sets;
        let checked = sets.check_on_device(
            ctx,
            &self.comparer,
            &function,
            &candidate.launch,
            &buffers.expected_device,
            &buffers.expected,
        );
        phases.check_ms = ms_since(started);
        match checked {
            Ok(None) => {}
            Ok(Some(m)) => {
                return (
                    Outcome::error(ErrorKind::WrongAnswer, m.to_string()),
                    false,
                    phases,
                );
            }
            Err(e) => return launch_error(e, phases),
        }
        let spin = match self.spin.function("tilesched_spin", 0) {
            Ok(f) => f,
            Err(e) => return launch_error(e, phases),
        };
        let started = std::time::Instant::now();
        let timed =
            timing::time_kernel(ctx, &spin, self.device.sm_clock_mhz, &request.timing, |i| {
                sets.launch(ctx, &function, &candidate.launch, i)
            });
        phases.time_ms = ms_since(started);
        match timed {
            Ok(t) => (Outcome::Ok(t), false, phases),
            Err(e) => launch_error(e, phases),
        }
    }
}

/// Acts out an injected `environment` fault: the worker is killed from outside.
fn killed_from_outside() -> ! {
    // SAFETY: `kill` takes no pointers; SIGKILL to this process ends it here.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL ends the process")
}

/// A stand-in for tests of the tuner on machines without a GPU: answers like a worker,
/// with times derived from the cubin's bytes, and acts out injected faults (a crash for
/// `launch`, a hang for `timeout`, a wrong answer). Never used for real measurements;
/// its device name says so.
pub struct Simulated;

/// Environment variable naming a file that scripts the simulated worker's starts, one
/// letter per start: `o` starts, `f` fails as a driver refusing a context would (tests
/// of the tuner's restart retries).
pub const SIMULATED_STARTS_ENV: &str = "TILESCHED_SIMULATED_STARTS";

impl Simulated {
    /// Consumes the next scripted start, if any: `Err` for a scripted failure.
    fn start() -> Result<(), String> {
        let Some(path) = std::env::var_os(SIMULATED_STARTS_ENV) else {
            return Ok(());
        };
        let script = std::fs::read_to_string(&path).unwrap_or_default();
        let mut letters = script.trim().chars();
        let next = letters.next();
        let _ = std::fs::write(&path, letters.as_str());
        match next {
            Some('f') => Err("simulated: the driver refused a context".to_string()),
            _ => Ok(()),
        }
    }

    /// The simulated GPU with ordinal `ordinal`.
    pub fn device(ordinal: u32) -> DeviceInfo {
        DeviceInfo {
            ordinal,
            name: "simulated (no GPU)".to_string(),
            compute_capability: (9, 0),
            sm_count: 132,
            sm_clock_mhz: 1980,
            memory_clock_mhz: 2619,
            memory_bus_bits: 5120,
            memory_bytes: 80 << 30,
            l2_bytes: 50 << 20,
            shared_bytes_per_block_optin: 227 * 1024,
            cuda_driver: "13.0".to_string(),
            kernel_driver: None,
        }
    }
}

/// Environment variable: milliseconds the simulated worker takes to prepare a task
/// (as filling multi-GB inputs would; tests of the separate deadline).
pub const SIMULATED_PREPARE_ENV: &str = "TILESCHED_SIMULATED_PREPARE_MS";
/// Environment variable: milliseconds the simulated worker takes per candidate, as a
/// GPU's check and timed runs would (tests of throughput over several devices and of
/// workers killed mid-job).
pub const SIMULATED_MEASURE_ENV: &str = "TILESCHED_SIMULATED_MEASURE_MS";

/// Environment variable naming a file the simulated worker appends each measured
/// request's id to, as it answers (tests that act while a round is under way).
pub const SIMULATED_MEASURED_ENV: &str = "TILESCHED_SIMULATED_MEASURED";

/// Sleeps for the milliseconds `var` names, if it is set.
fn simulated_delay(var: &str) {
    if let Some(ms) = std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Environment variable: the device memory (bytes) the simulated worker says is free
/// (tests of the refusal of tasks too large for the GPU); unset, it says nothing.
pub const SIMULATED_FREE_ENV: &str = "TILESCHED_SIMULATED_FREE_BYTES";

impl Backend for Simulated {
    fn prepare(
        &mut self,
        _problem: &Problem,
        _reference: &KernelImage,
        _progress: &mut dyn FnMut(String),
    ) -> Result<(), (String, bool)> {
        simulated_delay(SIMULATED_PREPARE_ENV);
        Ok(())
    }

    fn free_bytes(&self) -> Option<u64> {
        std::env::var(SIMULATED_FREE_ENV).ok()?.parse().ok()
    }

    fn measure(&mut self, request: &MeasureRequest) -> Answer {
        let (outcome, fatal) = self.simulate(request);
        (outcome, fatal, Phases::default())
    }
}

impl Simulated {
    fn simulate(&mut self, request: &MeasureRequest) -> (Outcome, bool) {
        let image = match std::fs::read(&request.candidate.cubin) {
            Ok(image) if image.starts_with(b"\x7fELF") => image,
            Ok(_) => return (Outcome::error(ErrorKind::Launch, "not a cubin"), false),
            Err(e) => return (Outcome::error(ErrorKind::Environment, e.to_string()), false),
        };
        match request.injected {
            Some(ErrorKind::Environment) => killed_from_outside(),
            Some(ErrorKind::Launch) => {
                eprintln!("simulated worker: crashing as a faulting kernel would");
                std::process::exit(101);
            }
            Some(ErrorKind::Timeout) => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            Some(ErrorKind::WrongAnswer) => {
                return (
                    Outcome::error(
                        ErrorKind::WrongAnswer,
                        "output[0] = NaN, expected 0 (simulated)",
                    ),
                    false,
                );
            }
            Some(ErrorKind::Compile) | None => {}
        }
        simulated_delay(SIMULATED_MEASURE_ENV);
        if let Some(path) = std::env::var_os(SIMULATED_MEASURED_ENV) {
            let line = format!("{}\n", request.id);
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
        // FNV-1a of the image: a stable pseudo time per kernel.
        let hash = image.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let median_us = 10.0 + (hash % 100_000) as f64 / 100.0;
        // Raced as a GPU worker races: a probe, and no more when it is clearly slower.
        let probe = vec![median_us as f32; timing::RACE_PROBE];
        if timing::lost_race(&request.timing, &probe) {
            return (Outcome::Ok(Timing::raced(probe)), false);
        }
        let samples_us = vec![median_us as f32; request.timing.min_repeats.max(1) as usize];
        (Outcome::Ok(Timing::from_samples(samples_us)), false)
    }
}
