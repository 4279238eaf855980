//! The tuning loop, in rounds: choose a task, propose a batch of candidates for it,
//! build them, measure them on the worker pool, append their records, retrain the cost
//! model. While a round is measured, the CPU trains the model on the round before and
//! plans and builds the next round (so a proposal sees the model and the measurements
//! up to the round before the one in flight).
//!
//! `random` gives each task a fair share of the trials, round-robin; the model-guided
//! strategies let the gradient task scheduler spend the total. Resuming counts what the
//! log already holds, trains the model on it, and never re-measures a state it has.

use crate::build::{self, Candidate};
use crate::dgd::{Dgd, DgdParams};
use crate::evolution::{self, EvolutionParams, TaskSpace};
use crate::scheduler::{Objective, SchedTask, TaskScheduler};
use costmodel::{CostModel, Dataset, ModelError};
use features::FeatureExtractor;
use gpu::KernelImage;
use gpu::{DeviceInfo, ErrorKind, MeasureRequest, Outcome, Pool, PoolError, Problem, TimingConfig};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use records::record::{LogError, LogWriter, RECORD_VERSION, Record, now};
use schedule::task::Contraction;
use schedule::{GpuSpec, Sampler, State, Task};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TuneError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(
        "stopped: {error}; the log holds all {recorded} measurements so far (`--resume` continues)"
    )]
    Stopped { error: PoolError, recorded: usize },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Reference(#[from] build::BuildError),
    #[error("NVRTC: {0}")]
    Nvrtc(#[from] gpu::nvrtc_lib::NvrtcLibError),
    #[error("cannot start build threads: {0}")]
    Threads(#[from] rayon::ThreadPoolBuildError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    UnknownArch(#[from] gpu::UnknownArch),
}

/// How candidates are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Uniform random valid states; a fair share of trials per task.
    Random,
    /// Ansor's evolutionary search guided by the cost model.
    Evolution,
    /// Ansor-AF-DS's walk over the divisor lattice guided by the cost model.
    Dgd,
}

/// How a tuning run proceeds.
#[derive(Debug, Clone)]
pub struct TuneConfig {
    /// Trials over all tasks (including those the log already holds when resuming).
    pub trials: usize,
    /// Candidates built and measured together (and flushed to the log together).
    pub batch: usize,
    pub seed: u64,
    /// No new batch starts after this much time.
    pub time_budget: Option<Duration>,
    pub timing: TimingConfig,
    /// Longest wait for one candidate's answer before its worker is killed.
    pub timeout: Duration,
    /// Developer hook: candidate number (in build order, from 0) -> fault built in.
    pub inject: BTreeMap<usize, ErrorKind>,
    /// Where cubins are written for the workers.
    pub workdir: PathBuf,
    /// The disk cache of compiled kernels (None: compile everything).
    pub cubin_cache: Option<gpu::CubinCache>,
    pub strategy: Strategy,
    pub evolution: EvolutionParams,
    pub dgd: DgdParams,
    /// Gradient allocation: a task that went this many trials without a 1% gain gets
    /// no more rounds while others can use them (see `scheduler`); None: never.
    pub task_patience: Option<usize>,
    /// What the gradient allocation minimizes over the tasks.
    pub objective: Objective,
}

/// Where tuning stands, for a progress display.
#[derive(Debug, Clone)]
pub struct Status {
    pub task: String,
    pub task_done: usize,
    /// The task's share (fair-share allocation only).
    pub task_trials: Option<usize>,
    pub round: usize,
    /// Time the last round spent proposing (sampling, features, prediction) and training.
    pub propose_ms: f64,
    pub train_ms: f64,
    pub best_us: Option<f64>,
    pub best_tflops: Option<f64>,
    pub done: usize,
    pub total: usize,
}

/// Receives progress; `measured` is called from the measuring threads.
pub trait Progress: Sync {
    fn start(&self, total: usize, done: usize);
    fn measured(&self);
    fn status(&self, status: &Status);
}

/// What a run did, beyond its records.
#[derive(Debug, Clone, Default)]
pub struct TuneStats {
    pub wall: Duration,
    /// Compile time of each kernel built (ms; a cached one's is the time to read it).
    pub compile_ms: Vec<f64>,
    /// Kernels read from the cubin cache instead of compiled.
    pub cached: usize,
    /// Candidates sent to the workers and the time the workers took for them.
    pub measured: usize,
    pub measure_time: Duration,
    /// Per device (ordinal, by the pool's order): the time its worker spent measuring.
    pub device_busy: Vec<(u32, Duration)>,
    pub build_time: Duration,
    /// Tasks with no new distinct valid state left to draw.
    pub exhausted: Vec<String>,
    pub stopped_by_budget: bool,
    /// Per round: proposal and training time (the tuner's own CPU work).
    pub rounds: Vec<RoundStats>,
}

/// The tuner's own work in one round.
#[derive(Debug, Clone)]
pub struct RoundStats {
    pub task: String,
    pub candidates: usize,
    pub propose_ms: f64,
    pub train_ms: f64,
}

/// Splits `total` trials over `n` tasks as evenly as possible (earlier tasks get the
/// remainder).
pub fn fair_shares(total: usize, n: usize) -> Vec<usize> {
    (0..n)
        .map(|i| total / n + usize::from(i < total % n))
        .collect()
}

/// A seed per task from the run's seed and the task key, so that adding a task to a run
/// does not change the candidates of the others.
fn task_seed(seed: u64, key: &str) -> u64 {
    key.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Per-task search state.
struct TaskRun {
    task: Task,
    contraction: Contraction,
    extractor: FeatureExtractor,
    rng: ChaCha8Rng,
    /// The best measured states, fastest first (seeds of the evolution, DGD's starts).
    best_states: Vec<(f64, State)>,
    dgd: Dgd,
    trials: usize,
    done: usize,
    /// Done plus in flight.
    planned: usize,
    measured: HashSet<String>,
    sampler: Sampler,
    best_us: Option<f64>,
    exhausted: bool,
    /// States of the log whose measurement failed for the environment's sake, to be
    /// measured again first.
    retry: Vec<State>,
}

impl TaskRun {
    /// Keeps `state` among the best measured if it is fast enough.
    fn remember(&mut self, us: f64, state: &State, keep: usize) {
        let at = self.best_states.partition_point(|(u, _)| *u <= us);
        if at < keep {
            self.best_states.insert(at, (us, state.clone()));
            self.best_states.truncate(keep);
        }
    }

    /// Up to `n` valid states not measured before, in the sampler's order.
    fn draw(&mut self, n: usize) -> Vec<State> {
        let mut out = Vec::new();
        let mut misses = 0;
        while out.len() < n && misses < 50 * n.max(1) {
            match self.sampler.sample() {
                Some(s) if self.measured.insert(s.id()) => out.push(s),
                Some(_) => misses += 1,
                None => break,
            }
        }
        if out.len() < n {
            self.exhausted = true;
        }
        out
    }
}

/// States of one task to build and measure together.
struct Batch {
    run: usize,
    task: Task,
    states: Vec<State>,
    injected: Vec<Option<ErrorKind>>,
    propose_ms: f64,
}

/// Chooses the batches: the task (round-robin fair share for `random`, the gradient
/// scheduler otherwise) and its candidates.
struct Planner {
    cursor: usize,
    scheduler: TaskScheduler,
    /// Trials planned so far over all tasks (gradient allocation).
    planned: usize,
    /// Candidates planned so far (numbers the fault injections).
    next_candidate: usize,
    references: BTreeMap<String, KernelImage>,
}

impl Planner {
    /// The next task with trials left under the configured allocation.
    fn next_task(&mut self, runs: &[TaskRun], cfg: &TuneConfig) -> Option<usize> {
        match cfg.strategy {
            Strategy::Random => {
                for _ in 0..runs.len() {
                    let i = self.cursor;
                    self.cursor = (self.cursor + 1) % runs.len();
                    if !runs[i].exhausted && runs[i].planned < runs[i].trials {
                        return Some(i);
                    }
                }
                None
            }
            _ => {
                if self.planned >= cfg.trials {
                    return None;
                }
                // A DGD walk moves on results: never plan a task whose round is in flight.
                let eligible: Vec<bool> = runs
                    .iter()
                    .map(|r| !r.exhausted && (cfg.strategy != Strategy::Dgd || r.planned == r.done))
                    .collect();
                self.scheduler.next(&eligible)
            }
        }
    }

    fn plan(
        &mut self,
        runs: &mut [TaskRun],
        cfg: &TuneConfig,
        spec: &GpuSpec,
        arch: &str,
        model: &mut dyn CostModel,
        stats: &mut TuneStats,
    ) -> Result<Option<Batch>, TuneError> {
        while let Some(i) = self.next_task(runs, cfg) {
            let started = Instant::now();
            let run = &mut runs[i];
            let n = match cfg.strategy {
                Strategy::Random => cfg.batch.min(run.trials - run.planned),
                _ => cfg.batch.min(cfg.trials - self.planned),
            };
            // Candidates whose measurement the environment spoiled in an earlier run
            // go first.
            let retried: Vec<State> = run.retry.drain(..n.min(run.retry.len())).collect();
            for s in &retried {
                run.measured.insert(s.id());
            }
            let n = n - retried.len();
            let states = match cfg.strategy {
                _ if n == 0 => Vec::new(),
                Strategy::Random => run.draw(n),
                Strategy::Dgd => {
                    let space = TaskSpace {
                        contraction: &run.contraction,
                        gpu: spec,
                        extractor: &run.extractor,
                    };
                    let states = run.dgd.propose(
                        n,
                        &cfg.dgd,
                        &space,
                        &mut run.sampler,
                        &run.measured,
                        &run.best_states,
                        model,
                    );
                    for s in &states {
                        run.measured.insert(s.id());
                    }
                    if states.is_empty() {
                        run.exhausted = true;
                    }
                    states
                }
                Strategy::Evolution => {
                    let space = TaskSpace {
                        contraction: &run.contraction,
                        gpu: spec,
                        extractor: &run.extractor,
                    };
                    let seeds: Vec<State> =
                        run.best_states.iter().map(|(_, s)| s.clone()).collect();
                    let states = evolution::propose(
                        n,
                        &cfg.evolution,
                        &space,
                        &mut run.sampler,
                        &mut run.rng,
                        &run.measured,
                        &seeds,
                        model,
                    );
                    for s in &states {
                        run.measured.insert(s.id());
                    }
                    if states.len() < n {
                        run.exhausted = true;
                    }
                    states
                }
            };
            let states: Vec<State> = retried.into_iter().chain(states).collect();
            let key = run.task.key();
            if run.exhausted {
                stats.exhausted.push(key.clone());
            }
            if states.is_empty() {
                continue;
            }
            if let std::collections::btree_map::Entry::Vacant(slot) = self.references.entry(key) {
                let image = build::build_reference(
                    &run.task,
                    arch,
                    &cfg.workdir,
                    cfg.cubin_cache.as_ref(),
                )?;
                slot.insert(image);
            }
            run.planned += states.len();
            self.planned += states.len();
            let injected = (0..states.len())
                .map(|k| cfg.inject.get(&(self.next_candidate + k)).copied())
                .collect();
            self.next_candidate += states.len();
            return Ok(Some(Batch {
                run: i,
                task: run.task,
                states,
                injected,
                propose_ms: started.elapsed().as_secs_f64() * 1e3,
            }));
        }
        Ok(None)
    }
}

/// How many best measured states each task keeps as evolution seeds.
fn seeds_kept(cfg: &TuneConfig) -> usize {
    (cfg.evolution.population as f64 * cfg.evolution.measured_share) as usize
}

/// The model's training rows for records of `run`'s task.
fn dataset(run: &TaskRun, records: &[Record]) -> Dataset {
    let mut d = Dataset::new(features::FEATURE_COUNT);
    for r in records {
        d.push(&run.extractor.extract(&r.state), &r.task, r.median_us());
    }
    d
}

/// Tunes `tasks` (weighted by `weights`, their counts in the network), appending to
/// `log`. `prior` is what the log held (when resuming); `model` ranks candidates for the
/// model-guided strategies and learns from every measurement. Returns the new records.
#[allow(clippy::too_many_arguments)]
pub fn tune(
    tasks: &[Task],
    weights: &[u32],
    pool: &mut Pool,
    log: &mut LogWriter,
    prior: &[Record],
    cfg: &TuneConfig,
    model: &mut dyn CostModel,
    progress: &dyn Progress,
) -> Result<(Vec<Record>, TuneStats), TuneError> {
    let started = Instant::now();
    let device = pool.devices()[0].clone();
    let spec = device.spec()?;
    let arch = device.arch();
    let nvrtc = gpu::nvrtc_lib::version().map(|(a, b)| format!("{a}.{b}"))?;
    let keep = seeds_kept(cfg);
    let mut runs: Vec<TaskRun> = tasks
        .iter()
        .zip(fair_shares(cfg.trials, tasks.len()))
        .map(|(task, trials)| {
            let key = task.key();
            let spoiled = |r: &Record| r.error_kind() == Some(ErrorKind::Environment);
            let mine: Vec<&Record> = prior
                .iter()
                .filter(|r| r.task == key && !spoiled(r))
                .collect();
            let mut retry: Vec<State> = Vec::new();
            for r in prior.iter().filter(|r| r.task == key && spoiled(r)) {
                let measured_since = mine.iter().any(|m| m.state.id() == r.state.id());
                if !measured_since && !retry.iter().any(|s| s.id() == r.state.id()) {
                    retry.push(r.state.clone());
                }
            }
            let mut run = TaskRun {
                task: *task,
                contraction: task.contraction(),
                extractor: FeatureExtractor::new(task, &spec),
                rng: ChaCha8Rng::seed_from_u64(task_seed(cfg.seed ^ 0x5eed, &key)),
                best_states: Vec::new(),
                dgd: Dgd::default(),
                trials,
                done: mine.len(),
                planned: mine.len(),
                measured: mine.iter().map(|r| r.state.id()).collect(),
                sampler: Sampler::new(task, &spec, task_seed(cfg.seed, &key)),
                best_us: mine
                    .iter()
                    .filter_map(|r| r.median_us())
                    .min_by(f64::total_cmp),
                exhausted: false,
                retry,
            };
            for r in &mine {
                if let Some(us) = r.median_us() {
                    run.remember(us, &r.state, keep);
                }
            }
            run
        })
        .collect();
    let prior_done: usize = runs.iter().map(|r| r.done).sum();
    let (total, mut done) = match cfg.strategy {
        Strategy::Random => (
            runs.iter().map(|r| r.trials.max(r.done)).sum(),
            runs.iter().map(|r| r.done.min(r.trials)).sum(),
        ),
        _ => (cfg.trials.max(prior_done), prior_done),
    };
    // The model learns from what the log already holds (random search needs none).
    let mut known = Dataset::new(features::FEATURE_COUNT);
    for run in &runs {
        let key = run.task.key();
        let mine: Vec<Record> = prior
            .iter()
            .filter(|r| r.task == key && r.error_kind() != Some(ErrorKind::Environment))
            .cloned()
            .collect();
        known.extend(&dataset(run, &mine));
    }
    if !known.is_empty() && cfg.strategy != Strategy::Random {
        model.update(&known)?;
    }
    let mut scheduler = TaskScheduler::new(
        tasks
            .iter()
            .zip(weights)
            .map(|(t, &w)| SchedTask {
                weight: f64::from(w),
                flops: t.flops() as f64,
                op: t.op.name(),
            })
            .collect(),
    )
    .with_patience(cfg.task_patience)
    .with_objective(cfg.objective);
    for (i, run) in runs.iter().enumerate() {
        if run.done > 0 {
            let key = run.task.key();
            let mine = prior
                .iter()
                .filter(|r| r.task == key && r.error_kind() != Some(ErrorKind::Environment));
            scheduler.replay(i, mine.map(Record::median_us));
        }
    }
    progress.start(total, done);
    let mut stats = TuneStats::default();
    let mut new_records = Vec::new();
    let mut planner = Planner {
        cursor: 0,
        scheduler,
        planned: prior_done,
        next_candidate: 0,
        references: BTreeMap::new(),
    };
    // Builds run on all cores but two, which stay free for the workers' launches.
    let builders = rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads().saturating_sub(2).max(1))
        .build()?;
    let build_batch = |batch: Batch| {
        let t = Instant::now();
        let candidates = builders.install(|| {
            build::build(
                &batch.task,
                batch.states.clone(),
                &batch.injected,
                &spec,
                &arch,
                &cfg.workdir,
                cfg.cubin_cache.as_ref(),
            )
        });
        (batch, candidates, t.elapsed())
    };
    let first = planner.plan(&mut runs, cfg, &spec, &arch, model, &mut stats)?;
    let mut pending = first.map(build_batch);
    let mut next_id = 0u64;
    let mut unlearned = Dataset::new(features::FEATURE_COUNT);
    while let Some((batch, candidates, build_time)) = pending.take() {
        stats.build_time += build_time;
        let key = batch.task.key();
        // Compile failures are records now; the rest go to the workers.
        let mut outcomes: Vec<Option<(Outcome, usize)>> = Vec::new();
        let mut requests = Vec::new();
        for c in &candidates {
            match &c.build {
                Ok((image, info)) => {
                    stats.compile_ms.push(info.compile_ms);
                    stats.cached += usize::from(c.origin == Some(gpu::Origin::Cached));
                    outcomes.push(None);
                    requests.push(MeasureRequest {
                        id: next_id,
                        problem: Problem::for_task(&batch.task, cfg.seed),
                        reference: planner.references[&key].clone(),
                        candidate: image.clone(),
                        timing: cfg.timing,
                        injected: c.injected,
                    });
                    next_id += 1;
                }
                Err(message) => {
                    progress.measured();
                    outcomes.push(Some((
                        Outcome::error(ErrorKind::Compile, message.to_string()),
                        0,
                    )));
                }
            }
        }
        // Measure this batch while the CPU learns from the last one, then plans and
        // builds the next: the GPU waits for neither. (Measured on an H100, resnet:
        // training alone took 146 of a 359 s run when it ran between measurements.)
        let (measured, overlapped) = std::thread::scope(|scope| {
            let measuring = scope.spawn(|| {
                let t = Instant::now();
                let measured =
                    pool.measure_batch(&requests, cfg.timeout, &|_, _, _| progress.measured());
                (measured, t.elapsed())
            });
            let overlapped = (|| -> Result<_, TuneError> {
                let t = Instant::now();
                if unlearned.len() >= cfg.batch {
                    model.update(&unlearned)?;
                    unlearned = Dataset::new(features::FEATURE_COUNT);
                }
                let train = t.elapsed();
                if cfg.time_budget.is_some_and(|b| started.elapsed() >= b) {
                    stats.stopped_by_budget = true;
                    return Ok((train, None));
                }
                let next = planner.plan(&mut runs, cfg, &spec, &arch, model, &mut stats)?;
                Ok((train, next.map(build_batch)))
            })();
            let measured = measuring
                .join()
                .expect("the measuring thread does not panic");
            (measured, overlapped)
        });
        let (batch_measured, measure_time) = measured;
        let stopped = batch_measured.error;
        stats.measure_time += measure_time;
        stats.measured += batch_measured.outcomes.iter().flatten().count();
        for (d, busy) in pool.devices().iter().zip(&batch_measured.busy) {
            match stats.device_busy.iter_mut().find(|(o, _)| *o == d.ordinal) {
                Some((_, total)) => *total += *busy,
                None => stats.device_busy.push((d.ordinal, *busy)),
            }
        }
        let mut measured = batch_measured.outcomes.into_iter();
        let devices = pool.devices();
        // A candidate never handed out (the batch stopped early) is not recorded: a
        // resumed run plans it afresh.
        let records: Vec<Record> = candidates
            .into_iter()
            .zip(outcomes)
            .filter_map(|(c, outcome)| {
                let (result, worker) = match outcome {
                    Some(o) => o,
                    None => measured.next().flatten()?,
                };
                Some(record(&batch.task, c, result, devices[worker], &nvrtc))
            })
            .collect();
        log.append(&records)?;
        if let Some(error) = stopped {
            return Err(TuneError::Stopped {
                error,
                recorded: done + records.len(),
            });
        }
        let (train, next_built) = overlapped?;
        pending = next_built;
        let run = &mut runs[batch.run];
        for r in &records {
            if let Some(us) = r.median_us() {
                run.best_us = Some(run.best_us.map_or(us, |b| b.min(us)));
                run.remember(us, &r.state, keep);
            }
        }
        run.done += records.len();
        done += records.len();
        planner
            .scheduler
            .observe(batch.run, run.best_us, records.len());
        let t = Instant::now();
        if cfg.strategy != Strategy::Random {
            // Learnt during the next round's measurement once a batch's worth of rows
            // has come in (every round for evolution; every few windows for DGD, whose
            // rounds are small).
            unlearned.extend(&dataset(run, &records));
        }
        if cfg.strategy == Strategy::Dgd {
            let space = TaskSpace {
                contraction: &run.contraction,
                gpu: &spec,
                extractor: &run.extractor,
            };
            let results: Vec<(State, Option<f64>)> = records
                .iter()
                .map(|r| (r.state.clone(), r.median_us()))
                .collect();
            run.dgd.observe(&results, &space, &run.measured, model);
        }
        let train_ms = (train + t.elapsed()).as_secs_f64() * 1e3;
        stats.rounds.push(RoundStats {
            task: key.clone(),
            candidates: records.len(),
            propose_ms: batch.propose_ms,
            train_ms,
        });
        progress.status(&Status {
            task: key,
            task_done: run.done,
            task_trials: (cfg.strategy == Strategy::Random).then_some(run.trials),
            round: stats.rounds.len(),
            propose_ms: batch.propose_ms,
            train_ms,
            best_us: run.best_us,
            best_tflops: run
                .best_us
                .map(|us| run.task.flops() as f64 / (us * 1e-6) / 1e12),
            done,
            total,
        });
        new_records.extend(records);
        // Nothing was plannable while this round was in flight (a DGD task waiting for
        // its results): plan now that they are in.
        if pending.is_none() && !stats.stopped_by_budget {
            pending = planner
                .plan(&mut runs, cfg, &spec, &arch, model, &mut stats)?
                .map(build_batch);
        }
    }
    if !unlearned.is_empty() {
        model.update(&unlearned)?;
    }
    stats.wall = started.elapsed();
    Ok((new_records, stats))
}

fn record(task: &Task, c: Candidate, result: Outcome, device: &DeviceInfo, nvrtc: &str) -> Record {
    Record {
        version: RECORD_VERSION,
        task: task.key(),
        shape: *task,
        state: c.state,
        result,
        compile: c.build.ok().map(|(_, info)| info),
        device: device.clone(),
        nvrtc: nvrtc.to_string(),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        timestamp: now(),
        injected: c.injected,
        source_hash: c.source_hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_fair_and_sum_to_the_total() {
        assert_eq!(fair_shares(2600, 13), vec![200; 13]);
        assert_eq!(fair_shares(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(fair_shares(2, 3), vec![1, 1, 0]);
    }

    #[test]
    fn task_seeds_differ_by_task_and_run_seed() {
        assert_ne!(task_seed(0, "a"), task_seed(0, "b"));
        assert_ne!(task_seed(0, "a"), task_seed(1, "a"));
        assert_eq!(task_seed(3, "a"), task_seed(3, "a"));
    }
}
