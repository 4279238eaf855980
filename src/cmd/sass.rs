//! `tilesched sass --log FILE (--task KEY | --all)`: the second stage. Regenerates each
//! task's best stage-1 kernel from the log, reorders its SASS with the chosen agents at
//! a measurement budget each, validates and times on the GPU, and writes per kernel the
//! optimized cubin, the instruction-order diff and a JSON report, plus `sass.md` and
//! `sass.json` over all kernels. Every input is checked (and every kernel decoded and
//! analysed) before a worker starts or a file is written.

use anyhow::{Context, Result, bail};
use gpu::{DeviceInfo, WorkerCommand};
use records::record::Record;
use records::{BestKernel, KernelError, read_log, summarize};
use runtime::Stored;
use sass_stage::decode::cubin::Cubin;
use sass_stage::legality::analysis::Kernel;
use sass_stage::run::{Prepared, Progress, RunOptions};
use sass_stage::stage::{AgentKind, KernelResult};
use std::path::{Path, PathBuf};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum AgentArg {
    Ppo,
    Greedy,
    Anneal,
    /// Greedy ranking its candidates by the edit model.
    GreedyModel,
    /// Annealing drawing from the candidates the edit model ranks best.
    AnnealModel,
}

impl AgentArg {
    fn kind(self) -> AgentKind {
        match self {
            AgentArg::Ppo => AgentKind::Ppo,
            AgentArg::Greedy => AgentKind::Greedy,
            AgentArg::Anneal => AgentKind::Anneal,
            AgentArg::GreedyModel => AgentKind::GreedyModel,
            AgentArg::AnnealModel => AgentKind::AnnealModel,
        }
    }
}

/// Options of the second stage (shared with `pipeline`).
#[derive(clap::Args, Debug, Clone)]
pub struct StageArgs {
    /// Agents to run, each at the full budget [default: ppo, greedy, anneal,
    /// greedy-model and anneal-model].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub agent: Vec<AgentArg>,
    /// Distinct GPU measurements per agent and task (shared among its `--top-k`
    /// stage-1 kernels).
    #[arg(long, default_value_t = 40)]
    pub budget: usize,
    /// Stage-1 kernels per task the stage works on: the fastest distinct ones of the
    /// log; the fastest final kernel among them is kept.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub top_k: u32,
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
    let prepared = prepare(log, args.task.as_deref(), None, args.stage.top_k as usize)?;
    run_stage(&prepared, &args.stage, args.cache.as_deref())
}

/// `--cubin FILE --kernel NAME`: what the stage sees in one kernel.
fn analyse(path: &Path, name: &str) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let cubin = Cubin::parse(bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let text = cubin.kernel(name)?;
    let lines = sass_stage::decode::disasm::disassemble(cubin.bytes(), name)?;
    let kernel = Kernel::analyze(&text, &lines)?;
    let order = sass_stage::legality::order::Order::identity(kernel.len());
    print!("{}", kernel.summary());
    let ranked = sass_stage::agents::estimate::ranked(&kernel, &order);
    println!("legal moves: {}", ranked.len());
    println!("moves the cover estimate ranks first (cycles of latency newly hidden):");
    for (action, value) in ranked.iter().take(10) {
        let ins = &kernel.instructions[order.at(action.row)];
        println!(
            "  {:>+5}  /*{:04x}*/ {:?}  {}",
            value,
            action.row * 16,
            action.kind.name(),
            ins.text
        );
    }
    Ok(())
}

/// Reads the log and prepares the best kernel of each selected task (all when `task`
/// is `None`; only those in `keys` when given): the record → kernel path of `records`,
/// then decoded and analysed.
pub fn prepare(
    log_path: &Path,
    task: Option<&str>,
    keys: Option<&[String]>,
    top_k: usize,
) -> Result<Vec<Prepared>> {
    sass_stage::decode::disasm::find_nvdisasm()?;
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
        // The summary already holds the best record: no second pass over the log.
        let best = s.best().ok_or_else(|| KernelError::NoCorrectKernel {
            task: s.task.clone(),
            log: log_path.display().to_string(),
            trials: s.trials,
        })?;
        for (rank, record) in top_records(&log.records, best, top_k)
            .into_iter()
            .enumerate()
        {
            let kernel = BestKernel::regenerate(record)?;
            let compiled = kernel.compile()?;
            if let Some(stale) = &kernel.stale {
                eprintln!("warning: {}: {stale}", s.task);
            }
            let k = kernel.kernel;
            let prepared = Prepared::new(
                kernel.record.shape,
                s.task.clone(),
                rank,
                k.name,
                k.launch,
                compiled.cubin,
            )
            .with_context(|| s.task.clone())?;
            out.push(prepared);
        }
    }
    Ok(out)
}

/// The `k` fastest correct records of `best`'s task with distinct kernels (by source
/// hash, else by state), `best` first: the stage-1 candidates of `--top-k`.
fn top_records<'a>(records: &'a [Record], best: &'a Record, k: usize) -> Vec<&'a Record> {
    let mut same: Vec<(&Record, f64)> = records
        .iter()
        .filter(|r| r.task == best.task && r.device.name == best.device.name)
        .filter_map(|r| r.median_us().map(|t| (r, t)))
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .collect();
    same.sort_by(|a, b| a.1.total_cmp(&b.1));
    let identity = |r: &Record| {
        r.source_hash
            .clone()
            .unwrap_or_else(|| serde_json::to_string(&r.state).unwrap_or_default())
    };
    let mut seen = vec![identity(best)];
    let mut out = vec![best];
    for (r, _) in same {
        if out.len() >= k {
            break;
        }
        let id = identity(r);
        if !seen.contains(&id) {
            seen.push(id);
            out.push(r);
        }
    }
    out
}

/// Prints what the stage reports as it goes.
struct Printer {
    explain: bool,
}

impl Progress for Printer {
    fn device(&mut self, device: &DeviceInfo) {
        eprintln!(
            "device {}: {} ({})",
            device.ordinal,
            device.name,
            device.arch()
        );
    }

    fn kernel(&mut self, p: &Prepared, result: &KernelResult, stored: Option<&Stored>) {
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
        if self.explain {
            for m in result.explain.iter().take(10) {
                println!("    {:>5} → {:<5} {}", m.from, m.to, m.text);
            }
        }
        if let Some(stored) = stored {
            eprintln!("    deploy cache: {:?}", stored.action);
        }
    }
}

/// Runs the stage on prepared kernels and writes the results.
pub fn run_stage(prepared: &[Prepared], args: &StageArgs, cache: Option<&Path>) -> Result<()> {
    let program = std::env::current_exe().context("cannot locate the tilesched executable")?;
    let worker = WorkerCommand {
        program,
        args: vec!["worker".to_string()],
    };
    let options = RunOptions {
        agents: args.agent.iter().map(|a| a.kind()).collect(),
        budget: args.budget,
        rounds: args.rounds,
        out: args.out.clone(),
        device: args.device,
        seed: args.seed,
    };
    let mut printer = Printer {
        explain: args.explain,
    };
    // One writer per deploy cache, for the whole stage.
    let _lock = match cache {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create deploy cache {}", dir.display()))?;
            Some(crate::lock::exclusive(dir, "deploy cache")?)
        }
        None => None,
    };
    let report = sass_stage::run::run(prepared, &options, &worker, cache, &mut printer)?;
    println!(
        "geometric-mean stage-2 speedup {:.3}x over {} kernels; wrote {}",
        report.geomean_speedup,
        report.kernels.len(),
        args.out.join("sass.md").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::Timing;
    use gpu::protocol::{ErrorKind, Outcome};
    use records::record::RECORD_VERSION;
    use schedule::{GpuSpec, Sampler, Task, parse_shape};

    /// A record of a matmul `shape` sampled with `seed`, timed at `us` (failed when
    /// `None`), with source hash `hash`.
    fn record(shape: &str, seed: u64, us: Option<f64>, hash: &str) -> Record {
        let task = Task::new(parse_shape("matmul", shape).unwrap(), Default::default()).unwrap();
        let state = Sampler::new(&task, &GpuSpec::h100(), seed)
            .sample()
            .unwrap();
        let result = match us {
            Some(us) => Outcome::Ok(Timing {
                median_us: us,
                samples_us: vec![us as f32],
                raced: false,
                precise: false,
            }),
            None => Outcome::Error {
                kind: ErrorKind::WrongAnswer,
                message: "differs".into(),
            },
        };
        Record {
            version: RECORD_VERSION,
            task: task.key(),
            shape: task,
            state,
            result,
            compile: None,
            device: gpu::worker::Simulated::device(0),
            nvrtc: "13.0".into(),
            tool_version: "0.1.0".into(),
            timestamp: "2026-11-24T10:00:00Z".into(),
            injected: None,
            source_hash: Some(hash.into()),
        }
    }

    #[test]
    fn top_k_takes_the_fastest_distinct_correct_kernels_of_the_task() {
        let records = vec![
            record("64,64,64", 1, Some(9.0), "c"),
            record("64,64,64", 2, Some(5.0), "a"),
            record("64,64,64", 3, Some(5.5), "a"), // the same kernel again
            record("64,64,64", 4, None, "x"),      // failed
            record("64,64,64", 5, Some(7.0), "b"),
            record("128,64,64", 6, Some(1.0), "y"), // another task
            record("64,64,64", 7, Some(0.0), "z"),  // no valid time
        ];
        let best = &records[1];
        let top = |k| -> Vec<f64> {
            top_records(&records, best, k)
                .iter()
                .map(|r| r.median_us().unwrap())
                .collect()
        };
        assert_eq!(top(1), [5.0]);
        assert_eq!(top(3), [5.0, 7.0, 9.0]);
        assert_eq!(
            top(16),
            [5.0, 7.0, 9.0],
            "only three distinct correct kernels"
        );
    }
}
