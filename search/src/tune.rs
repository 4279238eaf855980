//! The tuning loop, in rounds: choose a task, propose a batch of candidates for it,
//! hand them to the measurer (which builds and measures them), append their records,
//! retrain the cost model. Several rounds are in flight, enough to keep every GPU busy;
//! a round is planned when the oldest one finishes, with the measurements of every
//! finished round, and the model retrained on them on a thread of its own (see
//! `trainer`): waited for, or with `model_lag` 1 trained on all but the last while the
//! round is proposed.
//!
//! `random` gives each task a fair share of the trials, round-robin; the model-guided
//! strategies let the gradient task scheduler spend the total. Resuming counts what the
//! log already holds, trains the model on it, and never re-measures a state it has.

use crate::dgd::{Dgd, DgdParams};
use crate::evolution::{self, EvolutionParams, TaskSpace};
use crate::scheduler::{Objective, SchedTask, TaskScheduler};
use crate::trainer::{RetrainSchedule, Trainer};
use costmodel::{CostModel, Dataset, ModelError};
use features::FeatureExtractor;
use gpu::{ErrorKind, TimingConfig};
use measure::inject::Fault;
use measure::{Job, MeasureError, Measured, Measurer};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use records::record::{LogError, LogWriter, RECORD_VERSION, Record, now};
use schedule::task::Contraction;
use schedule::{GpuSpec, Sampler, State, Task};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TuneError {
    #[error(
        "stopped: {error}; the log holds all {recorded} measurements so far (`--resume` continues)"
    )]
    Stopped {
        error: MeasureError,
        recorded: usize,
    },
    /// `TuneConfig::interrupt` was set (a signal): the measurements finished before it
    /// are in the log.
    #[error(
        "interrupted: the log holds all {recorded} measurements finished so far (`--resume` continues)"
    )]
    Interrupted { recorded: usize },
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    UnknownArch(#[from] gpu::UnknownArch),
}

/// How often a tuner waiting for results looks at `TuneConfig::interrupt`.
const INTERRUPT_POLL: Duration = Duration::from_millis(100);

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
    pub inject: BTreeMap<usize, Fault>,
    /// Rounds handed to the measurer at once [default: one per GPU, plus one].
    pub rounds_in_flight: Option<usize>,
    /// Retrainings a round's model may lag behind the rounds finished when it is
    /// planned: 0 waits for the retraining on the last one; 1 proposes while it runs.
    pub model_lag: usize,
    /// Which batches start a retraining (`trainer`).
    pub retrain: RetrainSchedule,
    pub strategy: Strategy,
    pub evolution: EvolutionParams,
    pub dgd: DgdParams,
    /// Gradient allocation: a task that went this many trials without a 1% gain gets
    /// no more rounds while others can use them (see `scheduler`); None: never.
    pub task_patience: Option<usize>,
    /// What the gradient allocation minimizes over the tasks.
    pub objective: Objective,
    /// Gradient allocation: a task that still improves and has fewer than this share of
    /// the mean rounds per task gets the next round (`scheduler`); 0: none.
    pub floor: f64,
    /// Set from outside (a signal handler): no new candidate is handed out, those being
    /// measured finish and are logged, and `tune` returns `Interrupted`.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Race candidates against their task's best (`gpu::timing`): one clearly slower
    /// stops after a short probe, checked exactly like every other.
    pub race: bool,
    /// Transfer (`transfer`): a task the log has no record of starts from the best
    /// states of its nearest tasks in this database, adapted to its shape.
    pub database: Option<Arc<records::KernelDb>>,
}

/// Where tuning stands, for a progress display.
#[derive(Debug, Clone)]
pub struct Status {
    pub task: String,
    pub task_done: usize,
    /// The task's share (fair-share allocation only).
    pub task_trials: Option<usize>,
    pub round: usize,
    /// Time the last round spent proposing (sampling, features, prediction) and, before
    /// that, waiting for the model to finish training.
    pub propose_ms: f64,
    pub wait_ms: f64,
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
    /// Kernels another host compiled (a queue's builder).
    pub shared: usize,
    /// Candidates measured on a GPU.
    pub measured: usize,
    /// Of those, the ones stopped after their probe, clearly slower than their task's
    /// best (`gpu::timing`'s race).
    pub raced: usize,
    /// And the ones whose timing stopped before the minimum time, their median known
    /// within the precision asked (`gpu::timing`'s precision rule).
    pub precise: usize,
    /// Where the measuring time went, summed over the candidates.
    pub phases: gpu::Phases,
    /// States transferred from the kernel database, and the tasks they went to.
    pub transferred: usize,
    pub transferred_tasks: usize,
    /// Per device (`Measured::device_label`, in the order first seen): the time it
    /// spent measuring.
    pub device_busy: Vec<(String, Duration)>,
    /// Results for a job already answered (a queue's job measured twice), ignored.
    pub duplicates: usize,
    /// Tasks with no new distinct valid state left to draw.
    pub exhausted: Vec<String>,
    pub stopped_by_budget: bool,
    /// Per round: the tuner's own time.
    pub rounds: Vec<RoundStats>,
    /// Time spent retraining the model (on its own thread), and how many times.
    pub training: Duration,
    pub retrainings: usize,
    /// Time the tuner waited for a retraining at the end of the run.
    pub final_wait: Duration,
}

/// The tuner's own time in one round.
#[derive(Debug, Clone)]
pub struct RoundStats {
    pub task: String,
    pub candidates: usize,
    /// Waiting for the model's retraining before proposing.
    pub wait_ms: f64,
    /// Sampling, features, prediction.
    pub propose_ms: f64,
    /// Learning from the finished round (training rows, DGD's observations).
    pub learn_ms: f64,
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
    /// States transferred from the nearest tuned tasks (`transfer`), measured in the
    /// task's first round; they seed the evolution until a state of its own is measured.
    transferred: Vec<State>,
    /// Of those, the ones not yet planned.
    to_transfer: Vec<State>,
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
    injected: Vec<Option<Fault>>,
    wait_ms: f64,
    propose_ms: f64,
}

/// Candidates per second one GPU measures, nominally (20-33 on an H100 in this project's
/// runs, resnet and ONNX models alike): sizes first rounds without depending on how fast
/// this run happens to go, so that the candidates drawn stay a function of the seed.
const NOMINAL_RATE: f64 = 20.0;
/// The share of a time budget the first rounds of all tasks may take at that rate, for a
/// model that learns to rank from them.
const FIRST_PASS_SHARE: f64 = 0.5;
/// The same for a model trained before the run (shipped, or on the log's records): it
/// ranks from the first round, which then only has to give every task its transferred
/// states and a kernel. With half the budget, DenseNet-121's 66 tasks waited 118-131 s
/// for their last first kernel (`benchmarks/results/h200-2026-11-28/time-to-quality/curves`).
const FIRST_PASS_SHARE_TRAINED: f64 = 0.1;
/// The smallest first round worth a model's training data.
const MIN_FIRST_ROUND: usize = 8;

/// The size of each task's first round under the gradient allocation: the batch, or
/// under a time budget, what lets every task be measured in about half the budget at
/// the nominal rate (EfficientNet-B0's 46 tasks in 150 s on one GPU: 32), or a tenth of
/// it when the model is `trained` already, so that every task has a kernel early and the
/// scheduler spends the rest where it helps most.
pub fn first_round(
    budget: Option<Duration>,
    tasks: usize,
    devices: usize,
    batch: usize,
    trained: bool,
) -> usize {
    let Some(budget) = budget else {
        return batch;
    };
    let share = if trained {
        FIRST_PASS_SHARE_TRAINED
    } else {
        FIRST_PASS_SHARE
    };
    let affordable = budget.as_secs_f64() * NOMINAL_RATE * devices.max(1) as f64 * share;
    ((affordable / tasks.max(1) as f64) as usize).clamp(MIN_FIRST_ROUND.min(batch), batch)
}

/// Chooses the batches: the task (round-robin fair share for `random`, the gradient
/// scheduler otherwise) and its candidates.
struct Planner {
    cursor: usize,
    scheduler: TaskScheduler,
    /// Candidates of a task's first round under the gradient allocation.
    first_round: usize,
    /// Trials planned so far over all tasks (gradient allocation).
    planned: usize,
    /// Candidates planned so far (numbers the fault injections).
    next_candidate: usize,
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
        model: &mut dyn CostModel,
        stats: &mut TuneStats,
    ) -> Option<Batch> {
        while let Some(i) = self.next_task(runs, cfg) {
            let started = Instant::now();
            let run = &mut runs[i];
            let n = match cfg.strategy {
                Strategy::Random => cfg.batch.min(run.trials - run.planned),
                _ if run.planned == 0 => self.first_round.min(cfg.trials - self.planned),
                _ => cfg.batch.min(cfg.trials - self.planned),
            };
            // Candidates whose measurement the environment spoiled in an earlier run
            // go first, then the states transferred from the nearest tuned tasks.
            let mut first: Vec<State> = run.retry.drain(..n.min(run.retry.len())).collect();
            let room = n - first.len();
            first.extend(
                run.to_transfer
                    .drain(..room.min(run.to_transfer.len()))
                    .filter(|s| !run.measured.contains(&s.id())),
            );
            for s in &first {
                run.measured.insert(s.id());
            }
            let n = n - first.len();
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
                    // Until a state of its own is measured, the transferred ones.
                    let seeds: Vec<State> = if run.best_states.is_empty() {
                        run.transferred.clone()
                    } else {
                        run.best_states.iter().map(|(_, s)| s.clone()).collect()
                    };
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
            let states: Vec<State> = first.into_iter().chain(states).collect();
            let key = run.task.key();
            if run.exhausted {
                stats.exhausted.push(key.clone());
            }
            if states.is_empty() {
                continue;
            }
            run.planned += states.len();
            self.planned += states.len();
            let injected = (0..states.len())
                .map(|k| cfg.inject.get(&(self.next_candidate + k)).copied())
                .collect();
            self.next_candidate += states.len();
            return Some(Batch {
                run: i,
                task: run.task,
                states,
                injected,
                wait_ms: 0.0,
                propose_ms: started.elapsed().as_secs_f64() * 1e3,
            });
        }
        None
    }
}

/// How many best measured states each task keeps as evolution seeds.
fn seeds_kept(cfg: &TuneConfig) -> usize {
    (cfg.evolution.population as f64 * cfg.evolution.measured_share) as usize
}

/// The model's training rows for records of `run`'s task.
fn dataset(run: &TaskRun, records: &[Record]) -> Dataset {
    let mut d = Dataset::new(features::FEATURE_COUNT);
    for r in records.iter().filter(|r| !r.spoiled()) {
        d.push(&run.extractor.extract(&r.state), &r.task, r.median_us());
    }
    d
}

/// Tunes `tasks` (weighted by `weights`, their counts in the network), appending to
/// `log`, with candidates built and measured by `measurer`. `prior` is what the log held
/// (when resuming); `model` ranks candidates for the model-guided strategies and learns
/// from every measurement. Returns the new records.
#[allow(clippy::too_many_arguments)]
pub fn tune(
    tasks: &[Task],
    weights: &[u32],
    measurer: &mut dyn Measurer,
    log: &mut LogWriter,
    prior: &[Record],
    cfg: &TuneConfig,
    model: &mut dyn CostModel,
    progress: &dyn Progress,
) -> Result<(Vec<Record>, TuneStats), TuneError> {
    let started = Instant::now();
    let spec = measurer.target().spec()?;
    let keep = seeds_kept(cfg);
    let mut runs: Vec<TaskRun> = tasks
        .iter()
        .zip(fair_shares(cfg.trials, tasks.len()))
        .map(|(task, trials)| {
            let key = task.key();
            let mine: Vec<&Record> = prior
                .iter()
                .filter(|r| r.task == key && !r.spoiled())
                .collect();
            let mut retry: Vec<State> = Vec::new();
            for r in prior.iter().filter(|r| r.task == key && r.spoiled()) {
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
                transferred: Vec::new(),
                to_transfer: Vec::new(),
            };
            // A task new to the log starts from its nearest tuned tasks (random search,
            // the baseline, draws from the space alone).
            let fresh = mine.is_empty() && cfg.strategy != Strategy::Random;
            if let (Some(db), true) = (&cfg.database, fresh) {
                let target = measurer.target();
                run.transferred = crate::transfer::starting_states(
                    db,
                    task,
                    &spec,
                    target.compute_capability,
                    &target.name,
                );
                run.to_transfer = run.transferred.clone();
            }
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
        let mine: Vec<Record> = prior.iter().filter(|r| r.task == key).cloned().collect();
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
    .with_objective(cfg.objective)
    .with_floor(cfg.floor);
    for (i, run) in runs.iter().enumerate() {
        if run.done > 0 {
            let key = run.task.key();
            let mine = prior.iter().filter(|r| r.task == key && !r.spoiled());
            scheduler.replay(i, mine.map(Record::median_us));
        }
    }
    progress.start(total, done);
    let mut stats = TuneStats {
        transferred: runs.iter().map(|r| r.transferred.len()).sum(),
        transferred_tasks: runs.iter().filter(|r| !r.transferred.is_empty()).count(),
        ..TuneStats::default()
    };
    let mut new_records = Vec::new();
    let mut planner = Planner {
        cursor: 0,
        scheduler,
        first_round: first_round(
            cfg.time_budget,
            runs.len(),
            measurer.parallelism(),
            cfg.batch,
            model.training_rows() > 0,
        ),
        planned: prior_done,
        next_candidate: 0,
    };
    // Rounds in flight: enough that every GPU has queued work while the tuner plans the
    // next round and trains the model.
    let depth = cfg
        .rounds_in_flight
        .unwrap_or(measurer.parallelism() + 1)
        .max(1);
    let (job_tx, job_rx) = channel::<Job>();
    let (result_tx, result_rx) = channel::<Measured>();
    let stop = AtomicBool::new(false);
    let mut next_id = 0u64;
    let mut unlearned = Dataset::new(features::FEATURE_COUNT);
    let mut rounds: VecDeque<InFlight> = VecDeque::new();
    let interrupted = || {
        cfg.interrupt
            .as_ref()
            .is_some_and(|i| i.load(Ordering::Relaxed))
    };
    let mut planning = true;
    let mut rounds_planned = 0usize;
    let (failure, served) = std::thread::scope(|scope| {
        let server = scope.spawn(|| measurer.serve(job_rx, result_tx, &stop));
        let mut trainer = Trainer::spawn(scope, cfg.retrain);
        let failure = (|| -> Result<(), TuneError> {
            loop {
                if interrupted() {
                    // No more candidates; those being measured finish (below).
                    stop.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                while planning && rounds.len() < depth {
                    if cfg.time_budget.is_some_and(|b| started.elapsed() >= b) {
                        stats.stopped_by_budget = true;
                        planning = false;
                        break;
                    }
                    // Round p is planned when round p - depth has finished (p - depth + 1
                    // rounds finished): with the retrainings asked for up to then, less
                    // the lag.
                    let through = (rounds_planned + 1).saturating_sub(depth + cfg.model_lag);
                    let waited = trainer.catch_up(model, through)?;
                    // None: nothing to plan now (a DGD task waits for its round).
                    let Some(mut batch) = planner.plan(&mut runs, cfg, &spec, model, &mut stats)
                    else {
                        break;
                    };
                    batch.wait_ms = waited.as_secs_f64() * 1e3;
                    rounds_planned += 1;
                    let timing = TimingConfig {
                        race_us: runs[batch.run].best_us.filter(|_| cfg.race),
                        ..cfg.timing
                    };
                    let round = InFlight::new(batch, next_id);
                    for (k, state) in round.batch.states.iter().enumerate() {
                        let job = Job {
                            id: next_id + k as u64,
                            task: round.batch.task,
                            state: state.clone(),
                            injected: round.batch.injected[k],
                            seed: cfg.seed,
                            timing,
                            timeout: cfg.timeout,
                            race: cfg.race,
                        };
                        if job_tx.send(job).is_err() {
                            // The measurer stopped; its error is reported below.
                            return Ok(());
                        }
                    }
                    next_id += round.results.len() as u64;
                    rounds.push_back(round);
                }
                if rounds.is_empty() {
                    return Ok(());
                }
                // Rounds end in the order they were planned, and one at a time, each
                // followed by planning the next: round p is always planned having seen
                // exactly the rounds up to p - depth, so that what the model and the task
                // scheduler learn, and so the candidates drawn, depend neither on which
                // GPU finished first nor on how many rounds completed together.
                if rounds.front().is_some_and(InFlight::complete) {
                    let round = rounds.pop_front().expect("a front round");
                    let (batch, records) = round.into_records();
                    log.append(&records)?;
                    done += records.len();
                    finish_round(
                        &batch,
                        &records,
                        &mut runs,
                        &mut planner,
                        &mut unlearned,
                        &mut trainer,
                        &mut stats,
                        cfg,
                        &spec,
                        keep,
                        model,
                        progress,
                        done,
                        total,
                    )?;
                    new_records.extend(records);
                    continue;
                }
                let m = match result_rx.recv_timeout(INTERRUPT_POLL) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return Ok(()), // the measurer stopped
                };
                if attach(&mut rounds, m, &mut stats) {
                    progress.measured();
                }
            }
        })();
        // The model learns everything asked of it before the run ends (an interrupted
        // run ends without waiting for it).
        let failure = failure.and_then(|()| {
            if interrupted() {
                return Ok(());
            }
            stats.final_wait = trainer.finish(model)?;
            stats.training = trainer.training;
            stats.retrainings = trainer.installed;
            Ok(())
        });
        drop(trainer);
        // Whatever ended the loop, the measurer ends too: no more jobs, and on an
        // error of the tuner's own, no more measurements.
        if failure.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        drop(job_tx);
        // Results still coming in while the measurer winds down are kept for the log.
        let late: Vec<Measured> = result_rx.iter().collect();
        let served = server.join().expect("the measuring thread does not panic");
        (failure.map(|()| late), served)
    });
    let late = failure?;
    if served.is_err() || interrupted() {
        // Keep every measurement that came in: the rounds in flight, in order, with the
        // candidates never measured left out (a resumed run plans them afresh).
        for m in late {
            attach(&mut rounds, m, &mut stats);
        }
        let mut recorded = done;
        for round in rounds {
            let (_, records) = round.into_records();
            log.append(&records)?;
            recorded += records.len();
        }
        return Err(match served {
            Err(error) => TuneError::Stopped { error, recorded },
            Ok(()) => TuneError::Interrupted { recorded },
        });
    }
    if !unlearned.is_empty() {
        model.update(&unlearned)?;
    }
    stats.wall = started.elapsed();
    Ok((new_records, stats))
}

/// A round handed to the measurer: its jobs are numbered from `first_id`.
struct InFlight {
    batch: Batch,
    first_id: u64,
    results: Vec<Option<Measured>>,
}

impl InFlight {
    fn new(batch: Batch, first_id: u64) -> InFlight {
        let results = vec![None; batch.states.len()];
        InFlight {
            batch,
            first_id,
            results,
        }
    }

    fn holds(&self, id: u64) -> bool {
        (self.first_id..self.first_id + self.results.len() as u64).contains(&id)
    }

    fn complete(&self) -> bool {
        self.results.iter().all(Option::is_some)
    }

    /// The round's batch and the records of its candidates with a result, in order.
    fn into_records(self) -> (Batch, Vec<Record>) {
        let b = &self.batch;
        let records = self
            .results
            .into_iter()
            .enumerate()
            .filter_map(|(k, m)| {
                Some(record(
                    &b.task,
                    b.states[k].clone(),
                    b.injected[k].map(Fault::kind),
                    m?,
                ))
            })
            .collect();
        (self.batch, records)
    }
}

/// Puts a result into its round and counts it: false (and counted as a duplicate) when
/// its job is not in flight or already has one.
fn attach(rounds: &mut VecDeque<InFlight>, m: Measured, stats: &mut TuneStats) -> bool {
    let slot = rounds
        .iter_mut()
        .find(|r| r.holds(m.id))
        .map(|r| &mut r.results[(m.id - r.first_id) as usize]);
    match slot {
        Some(slot @ None) => {
            stats.count(&m);
            *slot = Some(m);
            true
        }
        _ => {
            stats.duplicates += 1;
            false
        }
    }
}

impl TuneStats {
    /// Counts one result in.
    fn count(&mut self, m: &Measured) {
        if let Some(info) = &m.compile {
            self.compile_ms.push(info.compile_ms);
        }
        self.cached += usize::from(m.cached);
        self.shared += usize::from(m.shared);
        if m.measure_ms > 0.0 {
            self.measured += 1;
            self.phases.add(&m.phases);
            self.raced += usize::from(matches!(&m.outcome, gpu::Outcome::Ok(t) if t.raced));
            self.precise += usize::from(matches!(&m.outcome, gpu::Outcome::Ok(t) if t.precise));
            let busy = Duration::from_secs_f64(m.measure_ms / 1e3);
            let label = m.device_label();
            match self.device_busy.iter_mut().find(|(d, _)| *d == label) {
                Some((_, total)) => *total += busy,
                None => self.device_busy.push((label, busy)),
            }
        }
    }
}

/// What the tuner learns from a finished round: each task's best, the task
/// scheduler's and DGD's observations, the model's training rows (trained on once a
/// batch's worth is in); and the progress line.
#[allow(clippy::too_many_arguments)]
fn finish_round(
    batch: &Batch,
    records: &[Record],
    runs: &mut [TaskRun],
    planner: &mut Planner,
    unlearned: &mut Dataset,
    trainer: &mut Trainer,
    stats: &mut TuneStats,
    cfg: &TuneConfig,
    spec: &GpuSpec,
    keep: usize,
    model: &mut dyn CostModel,
    progress: &dyn Progress,
    done: usize,
    total: usize,
) -> Result<(), TuneError> {
    let t = Instant::now();
    let run = &mut runs[batch.run];
    for r in records {
        if let Some(us) = r.median_us() {
            run.best_us = Some(run.best_us.map_or(us, |b| b.min(us)));
            run.remember(us, &r.state, keep);
        }
    }
    run.done += records.len();
    planner
        .scheduler
        .observe(batch.run, run.best_us, records.len());
    if cfg.strategy != Strategy::Random {
        // Learnt once a batch's worth of rows has come in (every round for evolution;
        // every few windows for DGD, whose rounds are small), while the GPUs measure
        // the rounds still in flight and the tuner proposes the next. The retraining
        // is tagged with the rounds finished, this one included.
        unlearned.extend(&dataset(run, records));
        if unlearned.len() >= cfg.batch {
            trainer.learn(model, unlearned, stats.rounds.len() + 1);
            *unlearned = Dataset::new(features::FEATURE_COUNT);
        }
    }
    if cfg.strategy == Strategy::Dgd {
        // DGD ranks its next steps with the model: at lag 0, the one trained on this
        // round too (retrainings are tagged with the rounds finished).
        trainer.catch_up(
            model,
            (stats.rounds.len() + 1).saturating_sub(cfg.model_lag),
        )?;
        let space = TaskSpace {
            contraction: &run.contraction,
            gpu: spec,
            extractor: &run.extractor,
        };
        let results: Vec<(State, Option<f64>)> = records
            .iter()
            .map(|r| (r.state.clone(), r.median_us()))
            .collect();
        run.dgd.observe(&results, &space, &run.measured, model);
    }
    let key = batch.task.key();
    stats.rounds.push(RoundStats {
        task: key.clone(),
        candidates: records.len(),
        wait_ms: batch.wait_ms,
        propose_ms: batch.propose_ms,
        learn_ms: t.elapsed().as_secs_f64() * 1e3,
    });
    progress.status(&Status {
        task: key,
        task_done: run.done,
        task_trials: (cfg.strategy == Strategy::Random).then_some(run.trials),
        round: stats.rounds.len(),
        propose_ms: batch.propose_ms,
        wait_ms: batch.wait_ms,
        best_us: run.best_us,
        best_tflops: run
            .best_us
            .map(|us| run.task.flops() as f64 / (us * 1e-6) / 1e12),
        done,
        total,
    });
    Ok(())
}

fn record(task: &Task, state: State, injected: Option<ErrorKind>, m: Measured) -> Record {
    Record {
        version: RECORD_VERSION,
        task: task.key(),
        shape: *task,
        state,
        result: m.outcome,
        compile: m.compile,
        device: m.device,
        nvrtc: m.nvrtc,
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        timestamp: now(),
        injected,
        source_hash: m.source_hash,
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
    fn first_rounds_fit_every_task_into_half_the_budget() {
        let s = |secs| Some(Duration::from_secs(secs));
        // EfficientNet-B0: 46 tasks, 150 s, one GPU: 0.5 · 150 · 20 / 46.
        assert_eq!(first_round(s(150), 46, 1, 64, false), 32);
        assert_eq!(
            first_round(s(150), 46, 2, 64, false),
            64,
            "capped at the batch"
        );
        assert_eq!(
            first_round(s(10), 46, 1, 64, false),
            8,
            "never under a useful round"
        );
        assert_eq!(first_round(s(10), 46, 1, 4, false), 4, "nor over the batch");
        assert_eq!(
            first_round(None, 46, 1, 64, false),
            64,
            "no budget: the batch"
        );
    }

    #[test]
    fn a_trained_model_takes_a_tenth_of_the_budget_for_first_rounds() {
        let s = |secs| Some(Duration::from_secs(secs));
        // DenseNet-121's 66 conv tasks in 280 s: 0.1 · 280 · 20 / 66, not 42.
        assert_eq!(first_round(s(280), 66, 1, 64, true), 8);
        assert_eq!(first_round(s(280), 66, 1, 64, false), 42);
        // resnet's 13 tasks in 120 s: 18 instead of the batch.
        assert_eq!(first_round(s(120), 13, 1, 64, true), 18);
        assert_eq!(
            first_round(None, 13, 1, 64, true),
            64,
            "no budget: the batch"
        );
    }

    #[test]
    fn task_seeds_differ_by_task_and_run_seed() {
        assert_ne!(task_seed(0, "a"), task_seed(0, "b"));
        assert_ne!(task_seed(0, "a"), task_seed(1, "a"));
        assert_eq!(task_seed(3, "a"), task_seed(3, "a"));
    }
}
