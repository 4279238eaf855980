//! Where candidates are built and measured, behind one interface, so that the tuning
//! loop streams candidates to a local pool of GPUs or to many hosts through a queue
//! alike: it sends `Job`s (a task, a state, how to time it) and receives `Measured`
//! results carrying everything a record needs. A `Measurer` serves a stream of jobs
//! until the stream closes; jobs of several rounds are in flight at once, so every GPU
//! always has work while the tuner plans.
//!
//! `Local` builds on this host's cores and measures on its `gpu::Pool`, streaming: a
//! kernel is measured as soon as it is built, while the next ones compile. The queue's
//! workers (`tilesched worker --queue`) run the same `Local` on their own host.

use crate::build;
use crate::inject::Fault;
use gpu::{
    CubinCache, DeviceInfo, ErrorKind, KernelImage, MeasureRequest, Outcome, Phases, Pool, Problem,
    TimingConfig, Took,
};
use records::CompileInfo;
use schedule::{GpuSpec, State, Task};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One candidate to build, check exactly and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The tuner's number for it (unique within a run).
    pub id: u64,
    pub task: Task,
    pub state: State,
    /// Test hook: the fault built into the candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<Fault>,
    /// Seed of the task's input data (`Problem::for_task`).
    pub seed: u64,
    pub timing: TimingConfig,
    /// Longest wait for the candidate's answer before its worker is killed.
    pub timeout: Duration,
    /// Race the candidate against its task's best (`gpu::timing`): against
    /// `timing.race_us`, the best the tuner knew when it planned the job, or the best
    /// this measurer has timed since, whichever is faster. Left out of the JSON when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub race: bool,
}

/// What came of a job: everything its record needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The job's id.
    pub id: u64,
    /// `records::source_hash` of the generated source (None when generation failed).
    pub source_hash: Option<String>,
    /// The compiled kernel's resources (None when it was not built).
    pub compile: Option<CompileInfo>,
    /// Whether the cubin came from the cubin cache.
    pub cached: bool,
    /// Whether another host compiled it (a queue's builder, through the cubin cache's
    /// shared tier). Left out of the JSON when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// NVRTC's version where it was built, e.g. "13.0".
    pub nvrtc: String,
    pub outcome: Outcome,
    /// The GPU that measured it (for a candidate that was never measured: the GPU it
    /// was built for).
    pub device: DeviceInfo,
    /// Who measured it: empty on this host, the worker's name through a queue.
    #[serde(default)]
    pub worker: String,
    /// The time its GPU spent on it (0 when it was not measured).
    pub measure_ms: f64,
    /// Where that time went (absent from the workers that predate it).
    #[serde(default)]
    pub phases: Phases,
}

impl Measured {
    /// The device that measured it, as the end table names it.
    pub fn device_label(&self) -> String {
        if self.worker.is_empty() {
            format!("GPU {}", self.device.ordinal)
        } else {
            format!("{} GPU {}", self.worker, self.device.ordinal)
        }
    }
}

/// Why a measurer stopped before its jobs ran out.
pub type MeasureError = Box<dyn std::error::Error + Send + Sync>;

/// Builds and measures jobs.
pub trait Measurer: Send {
    /// The GPU the candidates are for: its limits shape the search space.
    fn target(&self) -> &DeviceInfo;
    /// Candidates it can measure at once (GPUs), to size how much is kept in flight.
    fn parallelism(&self) -> usize;
    /// Builds and measures every job `jobs` yields until it closes (or `stop` is set),
    /// sending each result to `results` as soon as it is in. An error stops it early;
    /// jobs not answered by then have no result.
    fn serve(
        &mut self,
        jobs: Receiver<Job>,
        results: Sender<Measured>,
        stop: &AtomicBool,
    ) -> Result<(), MeasureError>;
}

/// Builds with NVRTC on this host's cores and measures on its GPUs.
pub struct Local<'a> {
    pool: &'a mut Pool,
    target: DeviceInfo,
    spec: GpuSpec,
    builders: usize,
    workdir: PathBuf,
    cache: Option<CubinCache>,
    nvrtc: String,
    worker: String,
}

impl<'a> Local<'a> {
    /// Measures on `pool`, building on `builders` threads into `workdir` (through
    /// `cache` when given). `worker` names this host in results (empty for the tuner's
    /// own host).
    pub fn new(
        pool: &'a mut Pool,
        builders: usize,
        workdir: PathBuf,
        cache: Option<CubinCache>,
        worker: String,
    ) -> Result<Local<'a>, LocalError> {
        let target = pool.devices()[0].clone();
        let spec = target.spec()?;
        let nvrtc = gpu::nvrtc_lib::version().map(|(a, b)| format!("{a}.{b}"))?;
        Ok(Local {
            pool,
            target,
            spec,
            builders: builders.max(1),
            workdir,
            cache,
            nvrtc,
            worker,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    UnknownArch(#[from] gpu::UnknownArch),
    #[error("NVRTC: {0}")]
    Nvrtc(#[from] gpu::nvrtc_lib::NvrtcLibError),
}

/// A task's reference kernel once built (or why it was not), filled by one builder
/// while the others of the task wait.
type ReferenceSlot = Mutex<Option<Result<KernelImage, String>>>;

/// A built candidate waiting for a GPU, with what its result needs.
struct Ready {
    job: Job,
    source_hash: Option<String>,
    compile: CompileInfo,
    cached: bool,
    shared: bool,
}

impl Measurer for Local<'_> {
    fn target(&self) -> &DeviceInfo {
        &self.target
    }

    fn parallelism(&self) -> usize {
        self.pool.devices().len()
    }

    fn serve(
        &mut self,
        jobs: Receiver<Job>,
        results: Sender<Measured>,
        stop: &AtomicBool,
    ) -> Result<(), MeasureError> {
        let arch = self.target.arch();
        // Disjoint borrows: the builders read these while the pool measures.
        let (spec, workdir, cache) = (&self.spec, &self.workdir, self.cache.as_ref());
        let (target, nvrtc, worker) = (&self.target, &self.nvrtc, &self.worker);
        let builders = self.builders;
        let pool = &mut *self.pool;
        let jobs = Mutex::new(jobs);
        let (ready_tx, ready_rx) = channel::<(Ready, MeasureRequest)>();
        let ready_rx = Mutex::new(ready_rx);
        // Each task's reference kernel, built once, by the first builder that needs it.
        let references: Mutex<HashMap<String, Arc<ReferenceSlot>>> = Mutex::new(HashMap::new());
        let reference = |task: &Task| -> Result<KernelImage, String> {
            let slot = Arc::clone(
                references
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(task.key())
                    .or_default(),
            );
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| {
                build::build_reference(task, &arch, workdir, cache).map_err(|e| e.to_string())
            })
            .clone()
        };
        let build_loop = |to_measure: Sender<(Ready, MeasureRequest)>| {
            gpu::compile::compile_in_background();
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // Waits in short steps, so that a stop is seen while the tuner has
                // nothing to send.
                let job = match jobs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .recv_timeout(Duration::from_millis(100))
                {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                let c = build::build_candidate(
                    &job.task,
                    job.state.clone(),
                    job.injected,
                    spec,
                    &arch,
                    workdir,
                    cache,
                );
                let failed = match (&c.build, reference(&job.task)) {
                    (Ok((image, info)), Ok(reference)) => {
                        let request = MeasureRequest {
                            id: job.id,
                            problem: Problem::for_task(&job.task, job.seed),
                            reference,
                            candidate: image.clone(),
                            timing: job.timing,
                            injected: c.injected,
                        };
                        let ready = Ready {
                            compile: info.clone(),
                            cached: c.origin == Some(gpu::Origin::Cached),
                            shared: c.origin == Some(gpu::Origin::Shared),
                            source_hash: c.source_hash.clone(),
                            job,
                        };
                        if to_measure.send((ready, request)).is_err() {
                            break;
                        }
                        continue;
                    }
                    (Err(e @ build::BuildError::Write { .. }), _) => {
                        (ErrorKind::Environment, e.to_string())
                    }
                    (Err(e), _) => (ErrorKind::Compile, e.to_string()),
                    (Ok(_), Err(e)) => (ErrorKind::Environment, e),
                };
                let (kind, why) = failed;
                let measured = Measured {
                    id: job.id,
                    source_hash: c.source_hash,
                    compile: None,
                    cached: false,
                    shared: false,
                    nvrtc: nvrtc.clone(),
                    outcome: Outcome::error(kind, why),
                    device: target.clone(),
                    worker: worker.clone(),
                    measure_ms: 0.0,
                    phases: Phases::default(),
                };
                if results.send(measured).is_err() {
                    break;
                }
            }
        };
        let devices: Vec<DeviceInfo> = pool.devices().into_iter().cloned().collect();
        // Per task key: the fastest full-protocol time measured here so far.
        let bests: Mutex<HashMap<String, f64>> = Mutex::new(HashMap::new());
        let served = std::thread::scope(|scope| {
            for _ in 0..builders {
                let ready = ready_tx.clone();
                scope.spawn(|| build_loop(ready));
            }
            drop(ready_tx);
            // Ends (`None`) once the builders are done: the jobs ran out or `stop` is set.
            // A raced job races the best known when a GPU takes it.
            let next = || {
                let (ready, mut request) = ready_rx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .recv()
                    .ok()?;
                if ready.job.race {
                    let timed = bests.lock().unwrap_or_else(|p| p.into_inner());
                    let here = timed.get(&request.problem.key).copied();
                    request.timing.race_us = match (request.timing.race_us, here) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                let timeout = ready.job.timeout;
                Some((ready, request, timeout))
            };
            let done = |ready: Ready, w: usize, outcome: Outcome, took: Took| {
                if let Outcome::Ok(t) = &outcome
                    && !t.raced
                {
                    let mut timed = bests.lock().unwrap_or_else(|p| p.into_inner());
                    let best = timed.entry(ready.job.task.key()).or_insert(t.median_us);
                    *best = best.min(t.median_us);
                }
                let _ = results.send(Measured {
                    id: ready.job.id,
                    source_hash: ready.source_hash,
                    compile: Some(ready.compile),
                    cached: ready.cached,
                    shared: ready.shared,
                    nvrtc: nvrtc.clone(),
                    outcome,
                    device: devices[w].clone(),
                    worker: worker.clone(),
                    measure_ms: took.wall.as_secs_f64() * 1e3,
                    phases: took.phases,
                });
            };
            pool.serve(&next, &done, stop)
        });
        match served.error {
            Some(e) => Err(Box::new(e)),
            None => Ok(()),
        }
    }
}
