//! `tilesched best --log FILE [--task KEY] [--json]`: the fastest correct record of each
//! task in a tuning log, as a table or as the full records in JSON. Only records that
//! validate count (the others are skipped with a warning). The log is streamed: memory
//! holds a tally per task, not the log.

use anyhow::{Result, bail};
use records::{best_table, summarize_log};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Tuning log to read.
    #[arg(long)]
    log: PathBuf,
    /// Only this task (its key, as `workloads` prints it).
    #[arg(long)]
    task: Option<String>,
    /// Print the best records as a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let log = summarize_log(&args.log)?;
    if let Some(w) = log.warning(&args.log) {
        eprintln!("{w}");
    }
    let mut summaries = log.summaries();
    if let Some(task) = &args.task {
        summaries.retain(|s| &s.task == task);
        if summaries.is_empty() {
            bail!("task {task} has no records in {}", args.log.display());
        }
    }
    if summaries.is_empty() {
        bail!("{} holds no records", args.log.display());
    }
    if args.json {
        let best: Vec<_> = summaries.iter().filter_map(|s| s.best()).collect();
        println!("{}", serde_json::to_string_pretty(&best)?);
    } else {
        print!("{}", best_table(&summaries));
    }
    Ok(())
}
