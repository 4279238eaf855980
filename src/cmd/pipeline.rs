//! `tilesched pipeline <op> (--network NAME | --shape SPEC) --log FILE --cache DIR`:
//! both stages. Stage 1 is `tilesched tune` on the tasks (continuing the log with
//! `--resume`), stage 2 is `tilesched sass` on each task's best kernel, and every final
//! kernel goes into the deploy cache for `tilesched deploy lookup`.

use crate::cmd::sass::{StageArgs, prepare, run_stage};
use crate::cmd::tasks::{TaskArgs, resolve};
use anyhow::{Context, Result, bail};
use schedule::Epilogue;
use std::path::PathBuf;
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// Operator: conv2d, matmul or batch_matmul.
    op: String,
    #[command(flatten)]
    tasks: TaskArgs,
    /// Network batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Tuning log of stage 1.
    #[arg(long)]
    log: PathBuf,
    /// Deploy cache receiving the final kernels.
    #[arg(long, value_name = "DIR")]
    cache: PathBuf,
    /// Stage 1: measurement trials over all tasks [default: tune's].
    #[arg(long)]
    trials: Option<usize>,
    /// Stage 1: continue the log (its records count as trials done).
    #[arg(long)]
    resume: bool,
    /// Stage 1: start no new batch after this many seconds.
    #[arg(long, value_name = "SECS")]
    time_budget: Option<f64>,
    /// Skip stage 1 and take the best kernels of the log as they are.
    #[arg(long)]
    skip_tuning: bool,
    #[command(flatten)]
    stage: StageArgs,
}

pub fn run(args: Args) -> Result<()> {
    let (tasks, _) = resolve(&args.op, &args.tasks, args.batch, Epilogue::default())?;
    let keys: Vec<String> = tasks.iter().map(|w| w.task.key()).collect();
    if args.skip_tuning && !args.log.exists() {
        bail!(
            "--skip-tuning needs an existing log; {} does not exist",
            args.log.display()
        );
    }
    if !args.skip_tuning {
        let exe = std::env::current_exe().context("cannot locate the tilesched executable")?;
        let mut tune = Command::new(exe);
        tune.arg("tune").arg(&args.op);
        match &args.tasks.network {
            Some(n) => {
                tune.args(["--network", n]);
            }
            None => {
                for s in &args.tasks.shape {
                    tune.args(["--shape", s]);
                }
            }
        }
        tune.args(["--batch", &args.batch.to_string()]);
        tune.arg("--log").arg(&args.log);
        tune.args(["--device", &args.stage.device.to_string()]);
        if let Some(t) = args.trials {
            tune.args(["--trials", &t.to_string()]);
        }
        if args.resume {
            tune.arg("--resume");
        }
        if let Some(t) = args.time_budget {
            tune.args(["--time-budget", &t.to_string()]);
        }
        eprintln!("stage 1: tune");
        let status = tune.status().context("cannot run stage 1")?;
        if !status.success() {
            bail!("stage 1 (tune) failed");
        }
    }
    eprintln!("stage 2: sass");
    let prepared = prepare(&args.log, None, Some(&keys))?;
    run_stage(&prepared, &args.stage, Some(&args.cache))
}
