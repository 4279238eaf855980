//! The stage over a run's kernels: each stage-1 kernel decoded and analysed up front
//! (`Prepared`, so that bad input fails before a worker starts or a file is written),
//! then, per kernel, the agents at their budget on the GPU, the per-kernel files
//! (`stage1.cubin`, `optimized.cubin`, `order.diff`, `result.json`), the deploy cache
//! entry, and at the end the report over all kernels (`sass.json`, `sass.md`). The CLI
//! (`tilesched sass`, `tilesched pipeline`) parses arguments, finds the stage-1 kernels
//! in the log and prints; everything else is here.

use crate::SassError;
use crate::agents::model::EditModel;
use crate::agents::objective::Evaluation;
use crate::decode::cubin::{Cubin, KernelText};
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use crate::measure::GpuObjective;
use crate::measure::Target;
use crate::report::{Report, Row};
use crate::stage::{
    AgentKind, KernelResult, MIN_GAIN, RankTimes, StageConfig, optimize, order_diff,
};
use gpu::protocol::KernelImage;
use gpu::{DeviceInfo, Pool, PoolError, Problem, WorkerCommand};
use runtime::{DeployCache, NewEntry, Stage, Stored};
use schedule::{LaunchConfig, Task};
use std::path::{Path, PathBuf};

/// One stage-1 kernel ready for the stage: decoded and analysed.
pub struct Prepared {
    pub task: Task,
    pub key: String,
    /// Its place among the task's stage-1 kernels (0: the fastest).
    pub rank: usize,
    pub name: String,
    pub launch: LaunchConfig,
    pub cubin: Cubin,
    pub text: KernelText,
    pub kernel: Kernel,
}

impl Prepared {
    /// Decodes kernel `name` of `cubin` (disassembled with nvdisasm) and analyses it.
    pub fn new(
        task: Task,
        key: String,
        rank: usize,
        name: String,
        launch: LaunchConfig,
        cubin: Vec<u8>,
    ) -> Result<Prepared, SassError> {
        let cubin = Cubin::parse(cubin)?;
        let text = cubin.kernel(&name)?;
        let lines = crate::decode::disasm::disassemble(cubin.bytes(), &name)?;
        let kernel = Kernel::analyze(&text, &lines)?;
        Ok(Prepared {
            task,
            key,
            rank,
            name,
            launch,
            cubin,
            text,
            kernel,
        })
    }
}

/// How the stage runs over the kernels.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Agents, each at the full budget (none: PPO, greedy and annealing).
    pub agents: Vec<AgentKind>,
    /// Distinct GPU measurements per agent and task (at least 2), shared among the
    /// task's stage-1 kernels.
    pub budget: usize,
    /// Alternating rounds of the final side-by-side timing.
    pub rounds: usize,
    /// Where the per-kernel directories and the report go.
    pub out: PathBuf,
    /// GPU to measure on.
    pub device: u32,
    /// Seed of the agents.
    pub seed: u64,
}

/// What a run reports as it goes (the CLI prints it).
pub trait Progress {
    /// The pool is up on `device`.
    fn device(&mut self, device: &DeviceInfo);
    /// A kernel is done (and stored in the deploy cache, when one is given).
    fn kernel(&mut self, prepared: &Prepared, result: &KernelResult, stored: Option<&Stored>);
}

/// Runs the stage on `prepared` with workers started by `worker`, writes the files and
/// returns the report; each final kernel also goes into the deploy cache at `cache`.
pub fn run(
    prepared: &[Prepared],
    options: &RunOptions,
    worker: &WorkerCommand,
    cache: Option<&Path>,
    progress: &mut dyn Progress,
) -> Result<Report, SassError> {
    let mut agents = options.agents.clone();
    if agents.is_empty() {
        agents = vec![
            AgentKind::Ppo,
            AgentKind::Greedy,
            AgentKind::Anneal,
            AgentKind::GreedyModel,
            AgentKind::AnnealModel,
        ];
    }
    agents.dedup();
    if options.budget < 2 {
        return Err(SassError::Input(
            "--budget must be at least 2 (the baseline takes one measurement)".into(),
        ));
    }
    let mut deploy = cache.map(DeployCache::open).transpose()?;
    let mut pool = match Pool::start(worker, &[options.device]) {
        Ok(pool) => pool,
        Err(PoolError::Unavailable(message)) => return Err(SassError::Gpu(message)),
        Err(e) => return Err(SassError::Gpu(e.to_string())),
    };
    let device = pool.devices()[0].clone();
    progress.device(&device);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| SassError::Io { path, error }
    };
    std::fs::create_dir_all(&options.out).map_err(io(&options.out))?;
    let workdir = std::env::temp_dir().join(format!("tilesched-sass-{}", std::process::id()));
    std::fs::create_dir_all(&workdir).map_err(io(&workdir))?;
    let config = StageConfig {
        agents: agents.clone(),
        budget: options.budget,
        seed: options.seed,
        rounds: options.rounds,
        validation_seeds: vec![101, 102, 103, 104],
    };
    let result = run_kernels(
        prepared,
        options,
        &config,
        &mut pool,
        &workdir,
        deploy.as_mut(),
        progress,
    );
    let _ = std::fs::remove_dir_all(&workdir);
    let rows = result?;
    let report = Report::new(
        device.name.clone(),
        options.budget,
        options.rounds,
        agents,
        rows,
    );
    let json = options.out.join("sass.json");
    std::fs::write(&json, report.to_json()).map_err(io(&json))?;
    let md = options.out.join("sass.md");
    std::fs::write(&md, report.to_markdown()).map_err(io(&md))?;
    Ok(report)
}

/// The kernels of one task, in `prepared` order.
fn tasks(prepared: &[Prepared]) -> Vec<Vec<&Prepared>> {
    let mut out: Vec<Vec<&Prepared>> = Vec::new();
    for p in prepared {
        match out.iter_mut().find(|g| g[0].key == p.key) {
            Some(group) => group.push(p),
            None => out.push(vec![p]),
        }
    }
    out
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SassError + '_ {
    move |error| SassError::Io {
        path: path.to_path_buf(),
        error,
    }
}

fn run_kernels(
    prepared: &[Prepared],
    options: &RunOptions,
    config: &StageConfig,
    pool: &mut Pool,
    workdir: &Path,
    mut deploy: Option<&mut DeployCache>,
    progress: &mut dyn Progress,
) -> Result<Vec<Row>, SassError> {
    let model_path = match &deploy {
        Some(cache) => cache.root().join(MODEL_FILE),
        None => options.out.join(MODEL_FILE),
    };
    let mut model = EditModel::load(&model_path);
    let mut rows = Vec::new();
    for group in tasks(prepared) {
        let key = group[0].key.clone();
        let dir = options.out.join(&key);
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        // The task's budget is shared among its stage-1 kernels.
        let per_kernel = StageConfig {
            budget: (config.budget / group.len()).max(2),
            ..config.clone()
        };
        let mut targets = Vec::new();
        for p in &group {
            let rank_dir = if group.len() > 1 {
                dir.join(format!("rank-{}", p.rank))
            } else {
                dir.clone()
            };
            std::fs::create_dir_all(&rank_dir).map_err(io_error(&rank_dir))?;
            let stage1 = rank_dir.join("stage1.cubin");
            std::fs::write(&stage1, p.cubin.bytes()).map_err(io_error(&stage1))?;
            targets.push(Target {
                cubin: &p.cubin,
                text: &p.text,
                reference: KernelImage {
                    cubin: stage1.canonicalize().map_err(io_error(&stage1))?,
                    name: p.name.clone(),
                    launch: p.launch.clone(),
                },
                problem: Problem::for_task(&p.task, 0),
                workdir: workdir.to_path_buf(),
            });
        }
        let mut results = Vec::new();
        for (p, target) in group.iter().zip(&targets) {
            let result = optimize(&p.kernel, pool, target, &per_kernel, &mut model)
                .map_err(|e| SassError::Kernel(p.key.clone(), Box::new(e)))?;
            model.save(&model_path).map_err(io_error(&model_path))?;
            results.push(result);
        }
        let (winner, mut result, ranks) = choose(&group, &targets, results, pool, config.rounds)?;
        let p = group[winner];
        result.stage1_rank = p.rank;
        result.ranks = ranks;
        let optimized = p.cubin.with_text(&p.text, &p.kernel.words(&result.order));
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).map_err(io_error(&path))
        };
        write("stage1.cubin", group[0].cubin.bytes())?;
        write("optimized.cubin", &optimized)?;
        write(
            "order.diff",
            order_diff(&p.kernel, &result.order).as_bytes(),
        )?;
        let row = Row {
            task: key.clone(),
            result,
        };
        write(
            "result.json",
            serde_json::to_string_pretty(&row)
                .expect("results always serialize")
                .as_bytes(),
        )?;
        let stored = match deploy.as_deref_mut() {
            Some(cache) => Some(cache.store(
                NewEntry {
                    gpu: pool.devices()[0].name.clone(),
                    compute_capability: pool.devices()[0].compute_capability,
                    task: key.clone(),
                    shape: p.task,
                    kernel: p.name.clone(),
                    launch: p.launch.clone(),
                    stage1_us: row.result.stage1_us,
                    final_us: row.result.final_us,
                    stage: if row.result.winner.is_some() || p.rank > 0 {
                        Stage::Sass
                    } else {
                        Stage::Stage1
                    },
                    created_by: runtime::TOOL_VERSION.to_string(),
                },
                &optimized,
            )?),
            None => None,
        };
        progress.kernel(p, &row.result, stored.as_ref());
        rows.push(row);
    }
    Ok(rows)
}

/// The file of the edit model's rows, beside the deploy cache (or in the output
/// directory without one).
pub const MODEL_FILE: &str = "sass-model.json";

/// Picks the task's final kernel among its stage-1 kernels' stage-2 results: with one
/// kernel, its result; with several, the stage-1 best and each kernel's final candidate
/// are timed side by side in alternating rounds, and the fastest is kept if it beats
/// the stage-1 best by more than `MIN_GAIN`. Returns the winner's index, its result
/// (times from the side-by-side rounds) and every kernel's times.
fn choose(
    group: &[&Prepared],
    targets: &[Target],
    mut results: Vec<KernelResult>,
    pool: &mut Pool,
    rounds: usize,
) -> Result<(usize, KernelResult, Vec<RankTimes>), SassError> {
    if results.len() == 1 {
        let r = results.remove(0);
        let ranks = vec![RankTimes {
            rank: group[0].rank,
            stage1_us: r.stage1_us,
            final_us: r.final_us,
        }];
        return Ok((0, r, ranks));
    }
    // Entry 0: the stage-1 best as it is; then each kernel's final candidate.
    let mut entries: Vec<(usize, Order)> = vec![(0, Order::identity(group[0].kernel.len()))];
    entries.extend(
        results
            .iter()
            .enumerate()
            .map(|(k, r)| (k, r.order.clone())),
    );
    let mut samples: Vec<Vec<f32>> = vec![Vec::new(); entries.len()];
    for _ in 0..rounds.max(1) {
        for (e, (k, order)) in entries.iter().enumerate() {
            let mut objective = GpuObjective::new(pool, &targets[*k], 0);
            match objective.time_fresh(&group[*k].kernel, order)? {
                Evaluation::Time(t) => samples[e].push(t as f32),
                Evaluation::Failed(why) => {
                    return Err(SassError::Gpu(format!(
                        "a validated kernel failed when timed again: {why}"
                    )));
                }
            }
        }
    }
    let medians: Vec<f64> = samples.iter().map(|s| gpu::timing::median(s)).collect();
    let stage1_us = medians[0];
    let mut best = 0;
    for e in 1..entries.len() {
        if medians[e] < medians[best] && medians[e] < stage1_us * (1.0 - MIN_GAIN) {
            best = e;
        }
    }
    let ranks = results
        .iter()
        .enumerate()
        .map(|(k, r)| RankTimes {
            rank: group[k].rank,
            stage1_us: r.stage1_us,
            final_us: medians[k + 1],
        })
        .collect();
    let winner = if best == 0 { 0 } else { entries[best].0 };
    let mut result = results.swap_remove(winner);
    // What the other ranks spent counts too: measurements, checks and failures are
    // reported per task, over all its stage-1 kernels.
    for other in &results {
        result.validations += other.validations;
        for (mine, theirs) in result.agents.iter_mut().zip(&other.agents) {
            mine.measurements += theirs.measurements;
            mine.skipped_by_model += theirs.skipped_by_model;
            mine.failures.extend(theirs.failures.iter().cloned());
        }
    }
    if best == 0 {
        // The stage-1 best as it was: nothing of stage 2 is kept.
        result.order = Order::identity(group[0].kernel.len());
        result.winner = None;
        result.explain.clear();
        result.control_edits.clear();
        result.actions.clear();
    }
    result.stage1_us = stage1_us;
    result.final_us = medians[best];
    result.speedup = stage1_us / medians[best];
    Ok((winner, result, ranks))
}
