//! `tilesched tune <op> (--network NAME | --shape SPEC)`: measures candidates on the GPU
//! in worker processes, appends every result to the tuning log, and prints the best
//! kernel per task. Bad input is refused before any worker starts; with no GPU the
//! command says so in one line.

use crate::cmd::tasks::{TaskArgs, TypeArgs, resolve};
use crate::signals::SignalFlag;
use anyhow::{Context, Result, bail};
use costmodel::{CostModel, RandomModel, XgbModel, XgbParams};
use gpu::{Pool, PoolError, TimingConfig, WorkerCommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use measure::Local;
use records::{LogWriter, read_log, summarize, tune_table};
use schedule::{Epilogue, Workload};
use search::dgd::DgdParams;
use search::evolution::EvolutionParams;
use search::scheduler::Objective;
use search::{Progress, RetrainSchedule, Status, Strategy, TuneConfig, TuneStats, tune};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum SearchArg {
    /// Uniform random valid states, a fair share of trials per task (the baseline).
    Random,
    /// Ansor's evolutionary search guided by the cost model, gradient task scheduler.
    Evolution,
    /// Ansor-AF-DS's divisor-lattice walk guided by the cost model, gradient task scheduler.
    Dgd,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ObjectiveArg {
    /// The weighted sum of the tasks' latencies.
    Latency,
    /// The weighted geometric mean of the tasks' latencies.
    Geomean,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ModelArg {
    /// XGBoost on the analytical features.
    Xgboost,
    /// Random scores (for comparison).
    Random,
}

#[derive(clap::Args)]
pub struct Args {
    /// Operator: conv2d, matmul (with --network: matmul and batch_matmul) or batch_matmul.
    op: String,
    #[command(flatten)]
    tasks: TaskArgs,
    #[command(flatten)]
    types: TypeArgs,
    /// Network batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    #[command(flatten)]
    search: SearchArgs,
    /// Tuning log (JSON lines) [default: <op>-<network>.jsonl or <task key>.jsonl].
    #[arg(long)]
    log: Option<PathBuf>,
    /// GPUs to measure on, e.g. 0 or 0,1 (one worker process each).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    device: Vec<u32>,
    /// Seed of the search: the same seed draws the same candidates.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Fuse a bias add into the epilogue (with --shape).
    #[arg(long)]
    bias: bool,
    /// Fuse a ReLU into the epilogue (with --shape).
    #[arg(long)]
    relu: bool,
}

/// How stage 1 searches and measures (shared by `tune` and `pipeline`).
#[derive(clap::Args)]
pub struct SearchArgs {
    /// Search strategy.
    #[arg(long, value_enum, default_value = "evolution")]
    search: SearchArg,
    /// Cost model of the model-guided strategies.
    #[arg(long, value_enum, default_value = "xgboost")]
    model: ModelArg,
    /// Start the XGBoost model from this saved model (e.g. from another network's run).
    #[arg(long, value_name = "FILE")]
    model_in: Option<PathBuf>,
    /// Start the XGBoost model untrained (random scores until it has learnt from this
    /// run) instead of from the model shipped for this GPU's architecture.
    #[arg(long)]
    cold_model: bool,
    /// Save the XGBoost model (with its training data) here at the end.
    #[arg(long, value_name = "FILE")]
    model_out: Option<PathBuf>,
    /// Population of the evolutionary search (Ansor: 2048).
    #[arg(long, default_value_t = 2048)]
    population: usize,
    /// Plan each round with a model this many retrainings old (0 or 1): 1 trains on the
    /// last finished round while the next is proposed, for many GPUs whose rounds go by
    /// faster than a retraining; 0 waits for it (the candidates are the same run after
    /// run either way).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    model_lag: u8,
    /// Retrain the cost model from scratch only every --full-every-th time, and in
    /// between fit this many trees to what that model still gets wrong (0: always
    /// from scratch). Retraining costs 3-5x less, and ranks about as well, in replays
    /// and on the GPU.
    #[arg(long, default_value_t = costmodel::RESIDUAL_ROUNDS)]
    residual_rounds: u32,
    /// With --residual-rounds, every this-many-th retraining is from scratch.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    full_every: u32,
    /// Retrain the cost model once the rows measured since its last retraining reach
    /// this share of those measured up to it; 0 retrains after every round. Above 0, the
    /// tuner waits less for its model (many GPUs) and the model ranks worse.
    #[arg(long, default_value_t = RETRAIN_GROWTH)]
    retrain_growth: f64,
    /// Print one line per round (task, candidates, best, wait for the model, proposal time).
    #[arg(long)]
    verbose: bool,
    /// Measurement trials over all tasks [default: 200 per task].
    #[arg(long)]
    trials: Option<usize>,
    /// Continue the log: count its records as trials done, never re-measure its states.
    #[arg(long)]
    resume: bool,
    /// Start no new batch after this many seconds.
    #[arg(long, value_name = "SECS")]
    time_budget: Option<f64>,
    /// Disk cache of compiled kernels, so that no kernel is compiled twice, in this run
    /// or any other [default: cubins/ in $TILESCHED_CACHE or ~/.cache/tilesched].
    #[arg(long, value_name = "DIR", conflicts_with = "no_cubin_cache")]
    cubin_cache: Option<PathBuf>,
    /// Compile every kernel, reading and writing no cubin cache.
    #[arg(long)]
    no_cubin_cache: bool,
    /// Candidates built and measured per batch (the log is flushed per batch).
    #[arg(long, default_value_t = 64)]
    measure_batch: usize,
    /// Seconds to wait for one candidate before its worker is killed (`timeout`), plus,
    /// per task, as long as preparing its buffers and reference took (checking a
    /// candidate of a multi-GB task reads back as much as the reference run did).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
    /// Timed repeats continue until they add up to this many milliseconds... (20 ms
    /// is hundreds of runs of a layer-sized kernel; on an H100 it measured 7x more
    /// candidates per minute than 100 ms and found faster kernels in the same time)
    #[arg(long, default_value_t = 20.0)]
    min_time_ms: f64,
    /// ...and at least this many were taken.
    #[arg(long, default_value_t = 10)]
    min_repeats: u32,
    /// ...unless the median is known sooner within this share of it (its 95% confidence
    /// interval, after 50 samples): a 10 µs kernel then takes a few hundred runs, not
    /// the 2000 of 20 ms. 0: every kernel runs to the minimum time. `bench` never stops
    /// early.
    #[arg(long, default_value_t = 0.005)]
    precision: f64,
    /// Kernel databases for transfer, besides the one shipped for this GPU: tuning logs
    /// or directories of them (a task the log has no record of starts from the best
    /// states of its nearest tuned tasks, never from its own).
    #[arg(long, value_name = "LOG_OR_DIR", num_args = 1.., conflicts_with = "no_transfer")]
    from: Vec<PathBuf>,
    /// Start every task cold: no transfer from the shipped database or --from.
    #[arg(long)]
    no_transfer: bool,
    /// Time every correct candidate under the full protocol. By default a candidate
    /// whose first samples are all over 1.25x its task's best stops there (after its
    /// exact check, like every candidate), recorded as raced: it cannot win.
    #[arg(long)]
    no_race: bool,
    /// Gradient allocation: a task whose best has not improved by 1% over this many
    /// trials gets no more rounds while other tasks still improve (TVM's per-task early
    /// stopping); 0: never stop a task.
    #[arg(long, value_name = "TRIALS", default_value_t = 512)]
    task_patience: usize,
    /// What the task scheduler minimizes: the network's weighted latency sum (Ansor's),
    /// or the weighted geometric mean of the latencies (relative gains; the measure of
    /// per-layer speedups over a baseline).
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Latency)]
    objective: ObjectiveArg,
    /// Gradient allocation: a task that still improves and has had fewer than this share
    /// of the mean rounds per task gets the next round, so that the objective never
    /// starves a mid-size task beside large ones; 0: no floor.
    #[arg(long, value_name = "SHARE", default_value_t = search::scheduler::DEFAULT_FLOOR)]
    floor: f64,
    /// Measure through a queue of workers on other hosts, redis://HOST[:PORT]/NAME
    /// (`tilesched worker --queue` on each GPU host) instead of on --device.
    #[arg(long, value_name = "URL")]
    queue: Option<String>,
    /// With --queue: measure on the workers whose GPU name contains this [default: the
    /// one model on the queue].
    #[arg(long, value_name = "NAME", requires = "queue")]
    queue_gpu: Option<String>,
    /// With --queue: seconds to wait for a worker to appear.
    #[arg(long, value_name = "SECS", default_value_t = 300.0, requires = "queue")]
    queue_wait: f64,
    /// With --queue: use a Redis on another host without a password or a signing key
    /// (TILESCHED_QUEUE_KEY), which anyone who reaches it could read and write.
    #[arg(long, requires = "queue")]
    insecure: bool,
    /// Developer hook: build faults into candidates, e.g. launch@3,timeout@7,wrong_answer@12.
    #[arg(long, hide = true)]
    inject_fault: Option<String>,
    /// Developer hook: measure with simulated workers (no GPU; tests only).
    #[arg(long, hide = true)]
    simulate: bool,
}

/// Progress on stderr: a bar on a terminal, a line per batch otherwise.
struct Bar {
    bar: ProgressBar,
    verbose: bool,
}

impl Progress for Bar {
    fn start(&self, total: usize, done: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(done as u64);
    }

    fn measured(&self) {
        self.bar.inc(1);
    }

    fn status(&self, s: &Status) {
        let best = match (s.best_us, s.best_tflops) {
            (Some(us), Some(tf)) => format!("best {us:.2} µs, {tf:.2} TFLOP/s"),
            _ => "no correct kernel yet".to_string(),
        };
        let trials = match s.task_trials {
            Some(t) => format!("{}/{t}", s.task_done),
            None => format!("{} trials", s.task_done),
        };
        let line = format!(
            "round {} {} {trials}: {best} (waited {:.0} ms for the model, proposed in {:.0} ms)",
            s.round, s.task, s.wait_ms, s.propose_ms
        );
        if self.bar.is_hidden() || self.verbose {
            self.bar
                .suspend(|| eprintln!("[{}/{}] {line}", s.done, s.total));
        } else {
            self.bar.set_message(line);
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let epilogue = Epilogue {
        bias: args.bias,
        relu: args.relu,
    };
    if args.tasks.network.is_some() && (args.bias || args.relu) {
        bail!("--bias and --relu apply to --shape; a network's layers have their own epilogue");
    }
    let (workloads, name) = resolve(&args.op, &args.tasks, args.batch, epilogue, &args.types)?;
    let log_path = args
        .log
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{name}.jsonl")));
    run_search(&workloads, &log_path, &args.device, args.seed, &args.search)
}

/// Longest `--timeout` and `--time-budget` taken (a week), so that every duration
/// built from them is representable.
const MAX_SECS: f64 = 7.0 * 86400.0;

/// `--retrain-growth`'s default: after every round. Fewer retrainings cost the model
/// ranking quality in every log replayed (see `search::trainer`).
const RETRAIN_GROWTH: f64 = 0.0;

/// Refuses, in one line naming the flag, what would otherwise fail after the log was
/// created or the workers started.
fn check_flags(args: &SearchArgs, log_path: &Path) -> Result<()> {
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= MAX_SECS) {
        bail!("--timeout must be a positive number of seconds up to {MAX_SECS}");
    }
    if !(args.precision.is_finite() && (0.0..1.0).contains(&args.precision)) {
        bail!("--precision must be a share from 0 (off) to below 1, e.g. 0.005");
    }
    if !(args.min_time_ms.is_finite() && args.min_time_ms >= 0.0) {
        bail!("--min-time-ms must be a number of milliseconds, not negative");
    }
    if args.min_time_ms / 1e3 >= args.timeout {
        bail!(
            "--min-time-ms {} does not fit in --timeout {} s: every candidate would time out",
            args.min_time_ms,
            args.timeout
        );
    }
    if !(args.floor.is_finite() && (0.0..=1.0).contains(&args.floor)) {
        bail!("--floor must be a share of the mean rounds per task, from 0 to 1");
    }
    if !(args.retrain_growth.is_finite() && args.retrain_growth >= 0.0) {
        bail!("--retrain-growth must be a share of the rows measured, 0 or more");
    }
    if let Some(b) = args.time_budget
        && !(b.is_finite() && b > 0.0 && b <= MAX_SECS)
    {
        bail!("--time-budget must be a positive number of seconds up to {MAX_SECS}");
    }
    if !(args.queue_wait.is_finite() && args.queue_wait >= 0.0 && args.queue_wait <= MAX_SECS) {
        bail!("--queue-wait must be a number of seconds, not negative, up to {MAX_SECS}");
    }
    if let Some(q) = &args.queue {
        let address = q.parse::<queue::QueueAddress>()?;
        address.check_exposure(queue::Seal::from_env()?.is_some(), args.insecure)?;
    }
    // Before anything opens it: a pipe would block, /dev/zero never end.
    records::record::check_regular(log_path)?;
    if records::is_compressed(log_path) {
        bail!(
            "--log {} is gzip-compressed: tuning appends to a log; decompress it first",
            log_path.display()
        );
    }
    if let Some(out) = &args.model_out {
        // Written at the end: find out now that it can be.
        let dir = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if out.is_dir() {
            bail!("--model-out {} is a directory", out.display());
        }
        tempfile::NamedTempFile::new_in(dir).map_err(|e| {
            anyhow::anyhow!("--model-out {}: cannot write there: {e}", out.display())
        })?;
    }
    Ok(())
}

/// Stage 1 on `workloads`: checks every option, continues or starts the log at
/// `log_path`, measures on `devices`, and prints the best kernel per task and the run's
/// times. Bad input is refused before any worker starts.
pub fn run_search(
    workloads: &[Workload],
    log_path: &Path,
    devices: &[u32],
    seed: u64,
    args: &SearchArgs,
) -> Result<()> {
    let tasks: Vec<schedule::Task> = workloads.iter().map(|w| w.task).collect();
    let weights: Vec<u32> = workloads.iter().map(|w| w.count).collect();
    let strategy = match args.search {
        SearchArg::Random => Strategy::Random,
        SearchArg::Evolution => Strategy::Evolution,
        SearchArg::Dgd => Strategy::Dgd,
    };
    let feature_names: Vec<String> = features::FEATURE_NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    if args.cold_model && args.model_in.is_some() {
        bail!("--cold-model and --model-in both choose the starting model: give one");
    }
    let mut model: Box<dyn CostModel> = match (args.model, &args.model_in) {
        (ModelArg::Random, Some(_)) => bail!("--model-in needs --model xgboost"),
        (ModelArg::Random, None) => Box::new(RandomModel::new(features::FEATURE_COUNT, seed)),
        (ModelArg::Xgboost, Some(path)) => {
            let mut m = XgbModel::load(path, &feature_names, seed)?;
            m.set_residual(args.residual_rounds, args.full_every);
            Box::new(m)
        }
        (ModelArg::Xgboost, None) => {
            let mut m = XgbModel::new(feature_names.clone(), XgbParams::default(), seed);
            m.set_residual(args.residual_rounds, args.full_every);
            Box::new(m)
        }
    };
    // The model shipped for the GPU's architecture replaces the untrained one once the
    // GPU is known.
    let pretrained = matches!(args.model, ModelArg::Xgboost) && args.model_in.is_none();
    let pretrained = pretrained && !args.cold_model;
    if args.model_out.is_some() && !matches!(args.model, ModelArg::Xgboost) {
        bail!("--model-out needs --model xgboost");
    }
    let trials = args.trials.unwrap_or(200 * tasks.len());
    if trials == 0 {
        bail!("--trials must be at least 1");
    }
    if args.measure_batch == 0 {
        bail!("--measure-batch must be at least 1");
    }
    check_flags(args, log_path)?;
    let cubin_cache = cubin_cache(args.cubin_cache.as_deref(), args.no_cubin_cache)?;
    let inject = match &args.inject_fault {
        Some(spec) => measure::inject::parse(spec)?,
        None => Default::default(),
    };
    // The user's logs for transfer, read before the log is opened or any worker starts
    // (the shipped database joins them once the GPU is known).
    let from = match (args.no_transfer, args.from.is_empty()) {
        (true, _) => None,
        (false, true) => Some(records::KernelDb::default()),
        (false, false) => Some(records::KernelDb::read(&args.from)?),
    };
    // One writer per log: locked before it is read, held until the run ends.
    let held = if log_path.exists() {
        Some(crate::lock::exclusive(log_path, "tuning log")?)
    } else {
        None
    };
    let prior = if log_path.exists() {
        let log = read_log(log_path)?;
        if !args.resume && !log.records.is_empty() {
            bail!(
                "tuning log {} already holds {} records: pass --resume to continue it, or choose another --log",
                log_path.display(),
                log.records.len()
            );
        }
        if let Some(w) = log.warning(log_path) {
            eprintln!("{w}");
        }
        log.records
    } else {
        Vec::new()
    };
    // Open the log first (an unwritable path fails before any GPU work); a log created
    // here is removed again if no worker starts.
    let created = !log_path.exists();
    let mut writer = LogWriter::open(log_path)?;
    let _lock = match held {
        Some(lock) => lock,
        None => crate::lock::exclusive(log_path, "tuning log")?,
    };
    let workdir = crate::scratch::create()?;
    let signals = SignalFlag::register(
        "interrupted: logging the measurements in flight, then stopping (again to stop at once)",
    )?;
    let cfg = TuneConfig {
        trials,
        batch: args.measure_batch,
        seed,
        time_budget: args.time_budget.map(Duration::from_secs_f64),
        timing: TimingConfig {
            min_time_ms: args.min_time_ms,
            min_repeats: args.min_repeats,
            precision: (args.precision > 0.0).then_some(args.precision),
            ..TimingConfig::default()
        },
        timeout: Duration::from_secs_f64(args.timeout),
        inject,
        rounds_in_flight: None,
        model_lag: usize::from(args.model_lag),
        retrain: RetrainSchedule {
            growth: args.retrain_growth,
        },
        strategy,
        evolution: EvolutionParams {
            population: args.population.max(1),
            ..EvolutionParams::default()
        },
        dgd: DgdParams::default(),
        task_patience: (args.task_patience > 0).then_some(args.task_patience),
        objective: match args.objective {
            ObjectiveArg::Latency => Objective::Latency,
            ObjectiveArg::Geomean => Objective::LogLatency,
        },
        interrupt: Some(Arc::clone(&signals.flag)),
        race: !args.no_race,
        floor: args.floor,
        database: None,
    };
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let progress = Bar {
        bar,
        verbose: args.verbose,
    };
    // Where the machine's CPU went while tuning (the end table's last line).
    let mut tuning_began = None;
    let mut measured = |measurer: &mut dyn measure::Measurer| {
        if pretrained {
            let cc = measurer.target().compute_capability;
            if let Some(shipped) = XgbModel::shipped(cc, &feature_names, seed) {
                let mut shipped = shipped?;
                shipped.set_residual(args.residual_rounds, args.full_every);
                eprintln!(
                    "model: the one shipped for this GPU's architecture ({} training rows)",
                    shipped.training_rows()
                );
                model = Box::new(shipped);
            }
        }
        let cfg = TuneConfig {
            database: transfer_database(from.as_ref(), measurer.target(), &tasks, &prior),
            ..cfg.clone()
        };
        tuning_began = crate::usage::now();
        tune(
            &tasks,
            &weights,
            measurer,
            &mut writer,
            &prior,
            &cfg,
            model.as_mut(),
            &progress,
        )
    };
    let unavailable = |e: anyhow::Error| {
        if created {
            let _ = std::fs::remove_file(log_path);
        }
        e
    };
    let (new, stats, builders) = match &args.queue {
        Some(address) => {
            let mut remote = queue::Remote::connect(
                address.parse()?,
                args.queue_gpu.as_deref(),
                Duration::from_secs_f64(args.queue_wait),
                queue::Seal::from_env()?,
                Box::new(|line| eprintln!("{line}")),
            )
            .map_err(|e| unavailable(e.into()))?;
            let (new, stats) = measured(&mut remote)?;
            (new, stats, None)
        }
        None => {
            let mut pool = start_pool(devices, args.simulate).map_err(unavailable)?;
            refuse_oversized(&pool, &tasks).map_err(unavailable)?;
            let bar = progress.bar.clone();
            pool.on_progress(Arc::new(move |device, message| {
                bar.suspend(|| eprintln!("GPU {device}: {message}"));
            }));
            let builders = build_threads(devices.len());
            let mut local = Local::new(
                &mut pool,
                builders,
                workdir.path().to_path_buf(),
                cubin_cache,
                String::new(),
            )?;
            let (new, stats) = measured(&mut local)?;
            (new, stats, Some(builders))
        }
    };
    progress.bar.finish_and_clear();
    if let Some(path) = &args.model_out {
        model.save(path)?;
        println!(
            "model saved to {} ({} training rows)",
            path.display(),
            model.training_rows()
        );
    }

    let mut all = prior;
    all.extend(new);
    let keys: Vec<String> = tasks.iter().map(|t| t.key()).collect();
    let summaries: Vec<_> = summarize(&all, &keys)
        .into_iter()
        .filter(|s| keys.contains(&s.task))
        .collect();
    print!("{}", tune_table(&summaries));
    print_stats(&stats, builders, log_path);
    if let (Some(began), Some(now)) = (tuning_began, crate::usage::now()) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        println!("{}", now.since(&began).line(stats.wall, cores));
    }
    Ok(())
}

/// The kernel database a run transfers from: `from` (the user's, None for no transfer)
/// and the one shipped for `device`'s compute capability, without the run's own tasks
/// and their epilogue variants (a task never starts from its own records, nor from
/// another task of the run, whose figures it is judged beside). Says what it holds.
fn transfer_database(
    from: Option<&records::KernelDb>,
    device: &gpu::DeviceInfo,
    tasks: &[schedule::Task],
    prior: &[records::Record],
) -> Option<Arc<records::KernelDb>> {
    let mut db = from?.clone();
    let shipped = records::KernelDb::shipped(device.compute_capability);
    if let Some(shipped) = &shipped {
        db.merge(shipped);
    }
    let keys: Vec<String> = tasks.iter().map(|t| t.key()).collect();
    let db = db.without_tasks(tasks);
    let fresh = keys
        .iter()
        .filter(|k| !prior.iter().any(|r| &r.task == *k))
        .count();
    eprintln!(
        "transfer: {} tuned tasks ({} states; {}) for the {fresh} tasks new to the log",
        db.len(),
        db.states(),
        if shipped.is_some() {
            "the database shipped for this GPU's architecture, and --from"
        } else {
            "--from only: none is shipped for this GPU's architecture"
        }
    );
    Some(Arc::new(db))
}

/// Build threads beside `gpus` measuring processes: every core but one per GPU, which
/// its worker's launches need.
pub(crate) fn build_threads(gpus: usize) -> usize {
    rayon::current_num_threads().saturating_sub(gpus).max(1)
}

/// Refuses, before any work, a task whose buffers do not fit in the memory a device
/// had free (one set of them: the rotated copies are fewer where memory is short).
fn refuse_oversized(pool: &Pool, tasks: &[schedule::Task]) -> Result<()> {
    for (device, free) in pool.devices().iter().zip(pool.free_bytes()) {
        let Some(free) = free else { continue };
        for task in tasks {
            if let Some(why) = gpu::Problem::for_task(task, 0).exceeds(free) {
                bail!(
                    "{}: {why} (device {}); nothing was measured",
                    task.key(),
                    device.ordinal
                );
            }
        }
    }
    Ok(())
}

/// Starts a measurement worker on each of `devices` and says which GPUs they hold.
pub(crate) fn start_pool(devices: &[u32], simulate: bool) -> Result<Pool> {
    let program = std::env::current_exe().context("cannot locate the tilesched executable")?;
    let mut worker_args = vec!["worker".to_string()];
    if simulate {
        worker_args.push("--simulate".to_string());
    }
    let command = WorkerCommand {
        program,
        args: worker_args,
    };
    let mut pool = match Pool::start(&command, devices) {
        Ok(pool) => pool,
        Err(PoolError::Unavailable(message)) => bail!("{message}"),
        Err(e) => return Err(e.into()),
    };
    // A large task's preparation takes long enough to need saying (`tune` draws it
    // beside its progress bar instead).
    pool.on_progress(Arc::new(|device, message| {
        eprintln!("GPU {device}: {message}");
    }));
    for d in pool.devices() {
        eprintln!(
            "device {}: {} ({}, {} SMs, {} MHz, CUDA {})",
            d.ordinal,
            d.name,
            d.arch(),
            d.sm_count,
            d.sm_clock_mhz,
            d.cuda_driver
        );
    }
    Ok(pool)
}

/// The cubin cache: `--cubin-cache DIR`, else `cubins/` in the cache directory
/// (`$TILESCHED_CACHE`, else `$XDG_CACHE_HOME/tilesched` or `~/.cache/tilesched`, as
/// `scripts/setup.sh` uses), none with `--no-cubin-cache` or when no directory can be
/// made (then every kernel is compiled, with a warning).
pub(crate) fn cubin_cache(dir: Option<&Path>, disabled: bool) -> Result<Option<gpu::CubinCache>> {
    if disabled {
        return Ok(None);
    }
    if let Some(dir) = dir {
        return gpu::CubinCache::open(dir)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--cubin-cache {}: {e}", dir.display()));
    }
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let root = var("TILESCHED_CACHE")
        .map(PathBuf::from)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("tilesched")))
        .or_else(|| var("HOME").map(|d| PathBuf::from(d).join(".cache/tilesched")));
    let Some(root) = root else {
        return Ok(None);
    };
    match gpu::CubinCache::open(root.join("cubins")) {
        Ok(cache) => Ok(Some(cache)),
        Err(e) => {
            eprintln!(
                "warning: no cubin cache ({}: {e}); every kernel is compiled",
                root.join("cubins").display()
            );
            Ok(None)
        }
    }
}

/// Where the GPUs' measuring time went, per candidate, and how many candidates they
/// measured per second of it: the figure racing and the on-GPU check raise.
fn measuring_line(stats: &TuneStats, busy: Duration) -> String {
    let n = stats.measured as f64;
    let p = &stats.phases;
    let busy_ms = busy.as_secs_f64() * 1e3;
    let other = (busy_ms - p.total_ms()).max(0.0);
    format!(
        "measuring: {:.1} candidates per GPU-second; per candidate {:.1} ms = preparing the task {:.1}, loading {:.1}, exact check {:.1}, timing {:.1}, messages and the worker's round trip {:.1}; {} of {} raced (stopped after their probe, clearly slower than their task's best), {} timed only until their median was known within --precision",
        n / busy.as_secs_f64().max(1e-9),
        busy_ms / n,
        p.prepare_ms / n,
        p.load_ms / n,
        p.check_ms / n,
        p.time_ms / n,
        other / n,
        stats.raced,
        stats.measured,
        stats.precise
    )
}

/// The end table's times. `builders`: the build threads of this host (None: the
/// queue's workers built the kernels).
fn print_stats(stats: &TuneStats, builders: Option<usize>, log: &std::path::Path) {
    let mut ms = stats.compile_ms.clone();
    ms.sort_by(f64::total_cmp);
    let median = ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN);
    let busy: Duration = stats.device_busy.iter().map(|(_, t)| *t).sum();
    let per_candidate = if stats.measured > 0 {
        busy.as_secs_f64() * 1e3 / stats.measured as f64
    } else {
        f64::NAN
    };
    let wall = stats.wall.as_secs_f64();
    let threads = match builders {
        Some(n) => format!("{n} threads"),
        None => "on the queue's workers".to_string(),
    };
    println!(
        "wall {wall:.1} s; built {} kernels ({} from the cubin cache{}; median {median:.0} ms each, {threads}); measured {} ({per_candidate:.0} ms per candidate); log {}",
        ms.len(),
        stats.cached,
        if stats.shared > 0 {
            format!(", {} from the queue's builders", stats.shared)
        } else {
            String::new()
        },
        stats.measured,
        log.display()
    );
    if stats.measured > 0 {
        println!("{}", measuring_line(stats, busy));
    }
    if wall > 0.0 && !stats.device_busy.is_empty() {
        let shares: Vec<String> = stats
            .device_busy
            .iter()
            .map(|(d, t)| format!("{d} {:.0}%", 100.0 * t.as_secs_f64() / wall))
            .collect();
        let build_cpu: f64 = ms.iter().sum::<f64>() / 1e3;
        let load = match builders {
            Some(n) => format!(
                " ({:.0}% of {n} threads)",
                100.0 * build_cpu / (wall * n as f64)
            ),
            None => String::new(),
        };
        println!(
            "busy measuring (of the wall time): {}; throughput: building {:.1} kernels/s{load}, measuring {:.1} candidates/s",
            shares.join(", "),
            ms.len() as f64 / wall,
            stats.measured as f64 / wall
        );
    }
    if stats.duplicates > 0 {
        println!(
            "{} results for jobs already answered were ignored",
            stats.duplicates
        );
    }
    let sum = |f: fn(&search::tune::RoundStats) -> f64| stats.rounds.iter().map(f).sum::<f64>();
    let (wait, propose, learn) = (
        sum(|r| r.wait_ms) + stats.final_wait.as_secs_f64() * 1e3,
        sum(|r| r.propose_ms),
        sum(|r| r.learn_ms),
    );
    if !stats.rounds.is_empty() {
        println!(
            "search overhead: {} rounds, the tuner's own {:.1} s ({:.0} ms per round: proposing {:.1} s, waiting for the model {:.1} s, learning {:.1} s); training {:.1} s on its own thread ({} retrainings)",
            stats.rounds.len(),
            (wait + propose + learn) / 1e3,
            (wait + propose + learn) / stats.rounds.len() as f64,
            propose / 1e3,
            wait / 1e3,
            learn / 1e3,
            stats.training.as_secs_f64(),
            stats.retrainings
        );
    }
    if stats.transferred > 0 {
        println!(
            "transfer: {} states adapted from the nearest tuned tasks measured first in {} tasks",
            stats.transferred, stats.transferred_tasks
        );
    }
    if stats.stopped_by_budget {
        println!("stopped by --time-budget");
    }
    for task in &stats.exhausted {
        println!("{task}: no new distinct valid state left to draw");
    }
}
