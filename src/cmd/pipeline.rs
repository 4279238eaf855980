//! `tilesched pipeline <op> (--network NAME | --shape SPEC) --log FILE --cache DIR`:
//! both stages in one process. Stage 1 is the search `tune` runs, with the same search
//! options (continuing the log with `--resume`), stage 2 is `sass` on each task's best
//! kernel, and every final kernel goes into the deploy cache for `tilesched deploy
//! lookup`.

use crate::cmd::sass::{StageArgs, prepare, run_stage};
use crate::cmd::tasks::{TaskArgs, TypeArgs, resolve};
use crate::cmd::tune::{SearchArgs, run_search};
use anyhow::{Result, bail};
use schedule::Epilogue;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Operator: conv2d, matmul or batch_matmul.
    op: String,
    #[command(flatten)]
    tasks: TaskArgs,
    #[command(flatten)]
    types: TypeArgs,
    /// Network batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Tuning log of stage 1.
    #[arg(long)]
    log: PathBuf,
    /// Deploy cache receiving the final kernels.
    #[arg(long, value_name = "DIR")]
    cache: PathBuf,
    /// Skip stage 1 and take the best kernels of the log as they are.
    #[arg(long)]
    skip_tuning: bool,
    /// Stage 1: how to search (as for `tune`; `--device` and `--seed` serve both stages).
    #[command(flatten)]
    search: SearchArgs,
    #[command(flatten)]
    stage: StageArgs,
}

pub fn run(args: Args) -> Result<()> {
    let (tasks, _) = resolve(
        &args.op,
        &args.tasks,
        args.batch,
        Epilogue::default(),
        &args.types,
    )?;
    let keys: Vec<String> = tasks.iter().map(|w| w.task.key()).collect();
    if args.skip_tuning && !args.log.exists() {
        bail!(
            "--skip-tuning needs an existing log; {} does not exist",
            args.log.display()
        );
    }
    if !args.skip_tuning {
        eprintln!("stage 1: tune");
        run_search(
            &tasks,
            &args.log,
            &[args.stage.device],
            args.stage.seed,
            &args.search,
        )?;
    }
    eprintln!("stage 2: sass");
    let prepared = prepare(&args.log, None, Some(&keys), args.stage.top_k as usize)?;
    run_stage(&prepared, &args.stage, Some(&args.cache))
}
