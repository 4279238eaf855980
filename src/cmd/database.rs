//! `tilesched database build --from LOG_OR_DIR... --out FILE`: a kernel database for
//! transfer (`records::database`), from tuning logs; how the one shipped in
//! `records/db/` is made (from `benchmarks/results/`).

use anyhow::{Result, bail};
use records::KernelDb;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Keep each task's fastest states of the logs, compactly, for `tune --from`.
    Build(BuildArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// Tuning logs, databases, or directories searched for them.
    #[arg(long, value_name = "LOG_OR_DIR", num_args = 1.., required = true)]
    from: Vec<PathBuf>,
    /// Leave out the tasks whose key contains one of these.
    #[arg(long, value_name = "TEXT", num_args = 1..)]
    exclude: Vec<String>,
    /// Where to write it (gzipped JSON lines).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(command: Command) -> Result<()> {
    let Command::Build(args) = command;
    if args.out.is_dir() {
        bail!("--out {} is a directory", args.out.display());
    }
    let db = KernelDb::read(&args.from)?;
    let excluded: Vec<String> = db
        .keys()
        .filter(|k| args.exclude.iter().any(|e| k.contains(e.as_str())))
        .collect();
    let db = db.without(&excluded);
    db.write(&args.out)?;
    println!(
        "{}: {} tasks, {} states ({} tasks left out)",
        args.out.display(),
        db.len(),
        db.states(),
        excluded.len()
    );
    Ok(())
}
