//! `tilesched sass --log FILE (--task KEY | --all)`: the second stage. Regenerates each
//! task's best stage-1 kernel from the log, reorders its SASS with the chosen agents at
//! a measurement budget each, validates and times on the GPU, and writes per kernel the
//! optimized cubin, the instruction-order diff and a JSON report, plus `sass.md` and
//! `sass.json` over all kernels. Every input is checked (and every kernel decoded and
//! analysed) before a worker starts or a file is written.

use anyhow::{Context, Result, bail};
use gpu::Problem;
use gpu::protocol::KernelImage;
use gpu::{Pool, PoolError, WorkerCommand};
use records::read_log;
use records::summarize;
use sass_stage::analysis::Kernel;
use sass_stage::cubin::{Cubin, KernelText};
use sass_stage::deploy::{DeployCache, NewEntry, Stage};
use sass_stage::measure::Target;
use sass_stage::stage::{AgentKind, KernelResult, StageConfig, optimize, order_diff};
use schedule::{LaunchConfig, Task};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum AgentArg {
    Ppo,
    Greedy,
    Anneal,
}

impl AgentArg {
    fn kind(self) -> AgentKind {
        match self {
            AgentArg::Ppo => AgentKind::Ppo,
            AgentArg::Greedy => AgentKind::Greedy,
            AgentArg::Anneal => AgentKind::Anneal,
        }
    }
}

/// Options of the second stage (shared with `pipeline`).
#[derive(clap::Args, Debug, Clone)]
pub struct StageArgs {
    /// Agents to run, each at the full budget [default: ppo, greedy and anneal].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub agent: Vec<AgentArg>,
    /// Distinct GPU measurements per agent and kernel.
    #[arg(long, default_value_t = 40)]
    pub budget: usize,
    /// Alternating rounds of the final side-by-side timing.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Output directory.
    #[arg(long, default_value = "sass-out")]
    pub out: PathBuf,
    /// Print the most valuable moves of each kernel (which instruction moved where).
    #[arg(long)]
    pub explain: bool,
    /// GPU to measure on.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// Seed of the agents.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(clap::Args)]
pub struct Args {
    /// Tuning log whose best kernels to reorder.
    #[arg(long, required_unless_present = "cubin")]
    log: Option<PathBuf>,
    /// Instead: analyse this cubin (no GPU, nothing written): blocks, pinned
    /// instructions, dependencies, legal moves and the moves the estimate ranks first.
    #[arg(long, conflicts_with_all = ["log", "task", "all", "cache"], requires = "kernel")]
    cubin: Option<PathBuf>,
    /// The kernel of `--cubin` to analyse.
    #[arg(long, requires = "cubin")]
    kernel: Option<String>,
    /// Only this task.
    #[arg(long, conflicts_with = "all")]
    task: Option<String>,
    /// Every task of the log.
    #[arg(long)]
    all: bool,
    /// Also store each final kernel in this deploy cache.
    #[arg(long, value_name = "DIR")]
    cache: Option<PathBuf>,
    #[command(flatten)]
    stage: StageArgs,
}

/// One kernel ready for the stage: decoded and analysed.
pub struct Prepared {
    pub task: Task,
    pub key: String,
    pub name: String,
    pub launch: LaunchConfig,
    pub cubin: Cubin,
    pub text: KernelText,
    pub kernel: Kernel,
}

#[derive(Serialize)]
struct Row<'a> {
    task: &'a str,
    #[serde(flatten)]
    result: &'a KernelResult,
}

#[derive(Serialize)]
struct Report<'a> {
    device: &'a str,
    budget: usize,
    rounds: usize,
    geomean_speedup: f64,
    kernels: Vec<Row<'a>>,
}

pub fn run(args: Args) -> Result<()> {
    if let (Some(cubin), Some(kernel)) = (&args.cubin, &args.kernel) {
        return analyse(cubin, kernel);
    }
    let log = args
        .log
        .as_deref()
        .expect("clap requires --log without --cubin");
    if !args.all && args.task.is_none() {
        bail!("say which kernels: --task KEY or --all");
    }
    let prepared = prepare(log, args.task.as_deref(), None)?;
    run_stage(&prepared, &args.stage, args.cache.as_deref())
}

/// `--cubin FILE --kernel NAME`: what the stage sees in one kernel.
fn analyse(path: &Path, name: &str) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let cubin = Cubin::parse(bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let text = cubin.kernel(name)?;
    let lines = sass_stage::disasm::disassemble(cubin.bytes(), name)?;
    let kernel = Kernel::analyze(&text, &lines)?;
    let order = sass_stage::order::Order::identity(kernel.len());
    print!("{}", kernel.summary());
    let ranked = sass_stage::estimate::ranked(&kernel, &order);
    println!("legal moves: {}", ranked.len());
    println!("moves the cover estimate ranks first (cycles of latency newly hidden):");
    for (action, value) in ranked.iter().take(10) {
        let ins = &kernel.instructions[order.at(action.row)];
        println!(
            "  {:>+5}  /*{:04x}*/ {:?}  {}",
            value,
            action.row * 16,
            action.direction,
            ins.text
        );
    }
    Ok(())
}

/// Reads the log and prepares the best kernel of each selected task (all when `task`
/// is `None`; only those in `keys` when given).
pub fn prepare(
    log_path: &Path,
    task: Option<&str>,
    keys: Option<&[String]>,
) -> Result<Vec<Prepared>> {
    sass_stage::disasm::find_nvdisasm()?;
    let log = read_log(log_path)?;
    if let Some(w) = log.warning(log_path) {
        eprintln!("{w}");
    }
    let mut summaries = summarize(&log.records, keys.unwrap_or(&[]));
    if let Some(task) = task {
        summaries.retain(|s| s.task == task);
        if summaries.is_empty() {
            bail!("task {task} has no records in {}", log_path.display());
        }
    }
    if let Some(keys) = keys {
        summaries.retain(|s| keys.contains(&s.task));
        if let Some(missing) = keys
            .iter()
            .find(|k| !summaries.iter().any(|s| &s.task == *k))
        {
            bail!("task {missing} has no records in {}", log_path.display());
        }
    }
    if summaries.is_empty() {
        bail!("{} holds no records", log_path.display());
    }
    let mut out = Vec::new();
    for s in summaries {
        let Some(best) = s.best else {
            bail!(
                "task {} has no correct kernel in {}",
                s.task,
                log_path.display()
            );
        };
        let generated = schedule::generate(&best.shape, &best.state, &best.device.spec()?)
            .with_context(|| format!("{}: the recorded state is not valid", s.task))?;
        let arch = best
            .compile
            .as_ref()
            .map_or_else(|| best.device.arch(), |c| c.arch.clone());
        let compiled = gpu::compile(&generated.source, &generated.name, &arch)
            .with_context(|| format!("{}: compiling the stage-1 kernel", s.task))?;
        let cubin = Cubin::parse(compiled.cubin).with_context(|| s.task.clone())?;
        let text = cubin.kernel(&generated.name)?;
        let lines = sass_stage::disasm::disassemble(cubin.bytes(), &generated.name)?;
        let kernel = Kernel::analyze(&text, &lines)?;
        out.push(Prepared {
            task: best.shape,
            key: s.task.clone(),
            name: generated.name,
            launch: generated.launch,
            cubin,
            text,
            kernel,
        });
    }
    Ok(out)
}

/// Runs the stage on prepared kernels and writes the results.
pub fn run_stage(prepared: &[Prepared], args: &StageArgs, cache: Option<&Path>) -> Result<()> {
    let mut agents: Vec<AgentKind> = args.agent.iter().map(|a| a.kind()).collect();
    if agents.is_empty() {
        agents = vec![AgentKind::Ppo, AgentKind::Greedy, AgentKind::Anneal];
    }
    agents.dedup();
    if args.budget < 2 {
        bail!("--budget must be at least 2 (the baseline takes one measurement)");
    }
    let mut deploy = cache.map(DeployCache::open).transpose()?;
    let program = std::env::current_exe().context("cannot locate the tilesched executable")?;
    let command = WorkerCommand {
        program,
        args: vec!["worker".to_string()],
    };
    let mut pool = match Pool::start(&command, &[args.device]) {
        Ok(pool) => pool,
        Err(PoolError::Unavailable(message)) => bail!("{message}"),
        Err(e) => return Err(e.into()),
    };
    let device = pool.devices()[0].clone();
    eprintln!(
        "device {}: {} ({})",
        device.ordinal,
        device.name,
        device.arch()
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let workdir = tempfile::Builder::new()
        .prefix("tilesched-sass-")
        .tempdir()
        .context("cannot create a temporary directory for cubins")?;
    let config = StageConfig {
        agents,
        budget: args.budget,
        seed: args.seed,
        rounds: args.rounds,
        validation_seeds: vec![101, 102, 103, 104],
    };
    let mut results = Vec::new();
    for p in prepared {
        let dir = args.out.join(&p.key);
        std::fs::create_dir_all(&dir)?;
        let stage1 = dir.join("stage1.cubin");
        std::fs::write(&stage1, p.cubin.bytes())?;
        let target = Target {
            cubin: &p.cubin,
            text: &p.text,
            reference: KernelImage {
                cubin: stage1.canonicalize()?,
                name: p.name.clone(),
                launch: p.launch,
            },
            problem: Problem::for_task(&p.task, 0),
            workdir: workdir.path().to_path_buf(),
        };
        let result = optimize(&p.kernel, &mut pool, &target, &config)
            .with_context(|| format!("{}: stage 2", p.key))?;
        let optimized = p.cubin.with_text(&p.text, &p.kernel.words(&result.order));
        std::fs::write(dir.join("optimized.cubin"), &optimized)?;
        std::fs::write(dir.join("order.diff"), order_diff(&p.kernel, &result.order))?;
        std::fs::write(
            dir.join("result.json"),
            serde_json::to_string_pretty(&Row {
                task: &p.key,
                result: &result,
            })?,
        )?;
        let agent_times: Vec<String> = result
            .agents
            .iter()
            .map(|a| match a.final_us {
                Some(t) => format!("{} {t:.2}", a.agent.name()),
                None => format!("{} rejected", a.agent.name()),
            })
            .collect();
        println!(
            "{}: stage 1 {:.2} µs → {:.2} µs ({:.3}x, {}; {} instructions, {} legal moves at start, {} validations)",
            p.key,
            result.stage1_us,
            result.final_us,
            result.speedup,
            agent_times.join(", "),
            result.instructions,
            result.legal_at_start,
            result.validations
        );
        if args.explain {
            for m in result.explain.iter().take(10) {
                println!("    {:>5} → {:<5} {}", m.from, m.to, m.text);
            }
        }
        if let Some(cache) = deploy.as_mut() {
            let stored = cache.store(
                NewEntry {
                    gpu: device.name.clone(),
                    compute_capability: device.compute_capability,
                    task: p.key.clone(),
                    kernel: p.name.clone(),
                    launch: p.launch,
                    stage1_us: result.stage1_us,
                    final_us: result.final_us,
                    stage: if result.winner.is_some() {
                        Stage::Sass
                    } else {
                        Stage::Stage1
                    },
                    created_by: sass_stage::deploy::TOOL_VERSION.to_string(),
                },
                &optimized,
            )?;
            eprintln!("    deploy cache: {:?}", stored.action);
        }
        results.push((p.key.clone(), result));
    }
    let geomean = (results.iter().map(|(_, r)| r.speedup.ln()).sum::<f64>()
        / results.len().max(1) as f64)
        .exp();
    let report = Report {
        device: &device.name,
        budget: args.budget,
        rounds: args.rounds,
        geomean_speedup: geomean,
        kernels: results
            .iter()
            .map(|(task, result)| Row { task, result })
            .collect(),
    };
    std::fs::write(
        args.out.join("sass.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(args.out.join("sass.md"), markdown(&report, &config.agents))?;
    println!(
        "geometric-mean stage-2 speedup {geomean:.3}x over {} kernels; wrote {}",
        results.len(),
        args.out.join("sass.md").display()
    );
    Ok(())
}

fn markdown(report: &Report, agents: &[AgentKind]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Stage 2 (SASS reordering) on {}\n", report.device);
    let _ = writeln!(
        s,
        "Budget {} distinct measurements per agent and kernel; final times are medians of {} \
         alternating rounds (stage-1 order and each agent's validated best, same process); \
         a reordering replaces stage 1 only when faster by more than {:.1}%.\n",
        report.budget,
        report.rounds,
        100.0 * sass_stage::stage::MIN_GAIN
    );
    let mut header = "| task | instr. | legal moves | stage 1 µs |".to_string();
    let mut rule = "|---|---:|---:|---:|".to_string();
    for a in agents {
        let _ = write!(header, " {} µs |", a.name());
        rule.push_str("---:|");
    }
    header.push_str(" final µs | speedup | winner | moved | validations |");
    rule.push_str("---:|---:|---|---:|---:|");
    let _ = writeln!(s, "{header}\n{rule}");
    for row in &report.kernels {
        let r = row.result;
        let mut line = format!(
            "| {} | {} | {} | {:.2} |",
            row.task, r.instructions, r.legal_at_start, r.stage1_us
        );
        for a in agents {
            let cell = match r.agents.iter().find(|x| x.agent == *a) {
                Some(x) => match (x.final_us, &x.rejected) {
                    (Some(t), _) => format!("{t:.2}"),
                    (None, Some(_)) => "rejected".to_string(),
                    (None, None) => "–".to_string(),
                },
                None => "–".to_string(),
            };
            let _ = write!(line, " {cell} |");
        }
        let _ = writeln!(
            s,
            "{line} {:.2} | {:.3}x | {} | {} | {} |",
            r.final_us,
            r.speedup,
            r.winner.map_or("stage 1", |w| w.name()),
            r.explain.len(),
            r.validations
        );
    }
    let _ = writeln!(
        s,
        "\nGeometric-mean speedup over stage 1: **{:.3}x**.",
        report.geomean_speedup
    );
    let wins = |a: AgentKind| {
        report
            .kernels
            .iter()
            .filter(|r| r.result.winner == Some(a))
            .count()
    };
    let _ = writeln!(
        s,
        "Wins: {}.",
        agents
            .iter()
            .map(|&a| format!("{} {}", a.name(), wins(a)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}
