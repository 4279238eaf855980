//! The stage over a run's kernels: each stage-1 kernel decoded and analysed up front
//! (`Prepared`, so that bad input fails before a worker starts or a file is written),
//! then, per kernel, the agents at their budget on the GPU, the per-kernel files
//! (`stage1.cubin`, `optimized.cubin`, `order.diff`, `result.json`), the deploy cache
//! entry, and at the end the report over all kernels (`sass.json`, `sass.md`). The CLI
//! (`tilesched sass`, `tilesched pipeline`) parses arguments, finds the stage-1 kernels
//! in the log and prints; everything else is here.

use crate::SassError;
use crate::decode::cubin::{Cubin, KernelText};
use crate::deploy::{DeployCache, NewEntry, Stage, Stored};
use crate::legality::analysis::Kernel;
use crate::measure::Target;
use crate::report::{Report, Row};
use crate::stage::{AgentKind, KernelResult, StageConfig, optimize, order_diff};
use gpu::protocol::KernelImage;
use gpu::{DeviceInfo, Pool, PoolError, Problem, WorkerCommand};
use schedule::{LaunchConfig, Task};
use std::path::{Path, PathBuf};

/// One stage-1 kernel ready for the stage: decoded and analysed.
pub struct Prepared {
    pub task: Task,
    pub key: String,
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
    /// Distinct GPU measurements per agent and kernel (at least 2).
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
        agents = vec![AgentKind::Ppo, AgentKind::Greedy, AgentKind::Anneal];
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

fn run_kernels(
    prepared: &[Prepared],
    options: &RunOptions,
    config: &StageConfig,
    pool: &mut Pool,
    workdir: &Path,
    mut deploy: Option<&mut DeployCache>,
    progress: &mut dyn Progress,
) -> Result<Vec<Row>, SassError> {
    let mut rows = Vec::new();
    for p in prepared {
        let dir = options.out.join(&p.key);
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).map_err(|error| SassError::Io { path, error })
        };
        std::fs::create_dir_all(&dir).map_err(|error| SassError::Io {
            path: dir.clone(),
            error,
        })?;
        write("stage1.cubin", p.cubin.bytes())?;
        let stage1 = dir.join("stage1.cubin");
        let target = Target {
            cubin: &p.cubin,
            text: &p.text,
            reference: KernelImage {
                cubin: stage1.canonicalize().map_err(|error| SassError::Io {
                    path: stage1,
                    error,
                })?,
                name: p.name.clone(),
                launch: p.launch,
            },
            problem: Problem::for_task(&p.task, 0),
            workdir: workdir.to_path_buf(),
        };
        let result = optimize(&p.kernel, pool, &target, config)
            .map_err(|e| SassError::Kernel(p.key.clone(), Box::new(e)))?;
        let optimized = p.cubin.with_text(&p.text, &p.kernel.words(&result.order));
        write("optimized.cubin", &optimized)?;
        write(
            "order.diff",
            order_diff(&p.kernel, &result.order).as_bytes(),
        )?;
        let row = Row {
            task: p.key.clone(),
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
                    task: p.key.clone(),
                    kernel: p.name.clone(),
                    launch: p.launch,
                    stage1_us: row.result.stage1_us,
                    final_us: row.result.final_us,
                    stage: if row.result.winner.is_some() {
                        Stage::Sass
                    } else {
                        Stage::Stage1
                    },
                    created_by: crate::deploy::TOOL_VERSION.to_string(),
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
