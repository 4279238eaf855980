//! The deploy cache from the command line (`runtime` does the work):
//!
//! - `tilesched deploy lookup --cache DIR --task KEY [--gpu NAME --cc MAJOR.MINOR]
//!   [--json]`: the deployed kernel of a task for this GPU (or the named one): its
//!   cubin's absolute path, parameters and how to launch it. Reads the cache only; never
//!   searches or compiles, and refuses a cubin whose hash does not match the index.
//! - `tilesched deploy add --log FILE --cache DIR [--task KEY]...`: stores the best
//!   stage-1 kernel of each task of a tuning log (regenerated and compiled for the
//!   architecture it was measured on; no GPU needed), for a deploy cache without running
//!   the second stage. A faster kernel already cached is kept. The log is streamed:
//!   memory holds each task's fastest records (`records::KEEP`), not the log.

use anyhow::{Result, anyhow, bail};
use records::{KEEP, Summarizer, best_kernel, read_summary};
use runtime::{DeployCache, NewEntry, Stage, StoreAction, gpu_label, lookup as find, params_of};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the cached best kernel of a task for a GPU (path, parameters, launch, times).
    Lookup(LookupArgs),
    /// Store the best stage-1 kernel of each task of a tuning log.
    Add(AddArgs),
}

#[derive(clap::Args)]
pub struct AddArgs {
    /// Tuning log to read (.jsonl or .jsonl.gz).
    #[arg(long)]
    log: PathBuf,
    /// Deploy cache directory (created if missing).
    #[arg(long)]
    cache: PathBuf,
    /// Only these tasks (repeatable); every task of the log when omitted.
    #[arg(long)]
    task: Vec<String>,
}

#[derive(clap::Args)]
pub struct LookupArgs {
    /// Deploy cache directory (holds index.json and cubins/).
    #[arg(long)]
    cache: PathBuf,
    /// Task key, as `workloads` prints it.
    #[arg(long)]
    task: String,
    /// GPU name as the driver reports it, e.g. "NVIDIA H100 80GB HBM3" (default: GPU 0).
    #[arg(long, requires = "cc")]
    gpu: Option<String>,
    /// Compute capability of --gpu, e.g. 9.0.
    #[arg(long, requires = "gpu", value_parser = parse_cc)]
    cc: Option<(u32, u32)>,
    /// Print the entry as JSON (with the cubin's absolute path as "path").
    #[arg(long)]
    json: bool,
}

pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Lookup(args) => lookup(args),
        Command::Add(args) => add(args),
    }
}

fn add(args: AddArgs) -> Result<()> {
    let summarizer = if args.task.is_empty() {
        Summarizer::new(&[])
    } else {
        Summarizer::only(&args.task)
    };
    let log = read_summary(&args.log, summarizer.keeping(KEEP))?;
    if let Some(w) = log.warning(&args.log) {
        eprintln!("{w}");
    }
    if let Some(missing) = log.tasks.iter().find(|t| t.trials == 0) {
        bail!(
            "task {} has no records in {}",
            missing.task,
            args.log.display()
        );
    }
    let tasks: Vec<String> = if args.task.is_empty() {
        log.tasks.iter().map(|t| t.task.clone()).collect()
    } else {
        args.task.clone()
    };
    if tasks.is_empty() {
        bail!("{} holds no records", args.log.display());
    }
    std::fs::create_dir_all(&args.cache)
        .map_err(|e| anyhow!("cannot create deploy cache {}: {e}", args.cache.display()))?;
    let _lock = crate::lock::exclusive(&args.cache, "deploy cache")?;
    let mut cache = DeployCache::open(&args.cache)?;
    let mut failed = 0;
    for task in &tasks {
        let tally = log
            .tasks
            .iter()
            .find(|t| &t.task == task)
            .expect("every task was read");
        let (best, compiled) = match best_kernel(tally, &args.log) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("{task}: not stored: {e}");
                failed += 1;
                continue;
            }
        };
        for error in &best.passed_over {
            eprintln!("warning: passed over a faster record: {error}");
        }
        if let Some(stale) = &best.stale {
            eprintln!("warning: {task}: {stale}");
        }
        let record = best.record;
        let us = record.median_us().expect("best records are correct ones");
        let stored = cache.store(
            NewEntry {
                gpu: record.device.name.clone(),
                compute_capability: record.device.compute_capability,
                task: task.clone(),
                shape: record.shape,
                kernel: best.kernel.name.clone(),
                launch: best.kernel.launch,
                stage1_us: us,
                final_us: us,
                stage: Stage::Stage1,
                created_by: runtime::TOOL_VERSION.to_string(),
            },
            &compiled.cubin,
        )?;
        let what = match stored.action {
            StoreAction::Added => "added".to_string(),
            StoreAction::Replaced { previous_final_us } => {
                format!("replaced the {previous_final_us:.2} µs kernel")
            }
            StoreAction::KeptExisting => {
                format!("kept the cached {:.2} µs kernel", stored.entry.final_us)
            }
        };
        println!(
            "{task}: {us:.2} µs on {}: {what}",
            gpu_label(&record.device.name, record.device.compute_capability)
        );
    }
    println!(
        "{} of {} tasks in {}",
        tasks.len() - failed,
        tasks.len(),
        cache.dir().display()
    );
    if failed > 0 {
        bail!("{failed} task(s) have no kernel to store");
    }
    Ok(())
}

fn lookup(args: LookupArgs) -> Result<()> {
    let cache = DeployCache::load(&args.cache)?;
    let (gpu, cc) = match (args.gpu, args.cc) {
        (Some(gpu), Some(cc)) => (gpu, cc),
        _ => current_gpu()?,
    };
    let entry = find(&cache, &gpu, cc, &args.task)?;
    cache.verify(entry)?;
    let path = cache.path_of(entry);
    if args.json {
        let mut value = serde_json::to_value(entry)?;
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "path".to_string(),
                serde_json::Value::String(path.display().to_string()),
            );
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let l = &entry.launch;
        println!("path: {}", path.display());
        println!("kernel: {}", entry.kernel);
        match params_of(entry) {
            Ok(params) => {
                let params: Vec<String> = params.iter().map(|p| p.to_string()).collect();
                println!("params: {}", params.join(", "));
            }
            Err(why) => println!("params: unknown ({why})"),
        }
        println!("grid: {}", l.grid);
        println!("block: {}", l.block);
        println!("dynamic_shared_bytes: {}", l.dynamic_shared_bytes);
        println!("zero_output: {}", l.zero_output);
        println!("stage1_us: {}", entry.stage1_us);
        println!("final_us: {}", entry.final_us);
        println!("stage: {}", entry.stage);
    }
    Ok(())
}

/// Name and compute capability of GPU 0.
fn current_gpu() -> Result<(String, (u32, u32))> {
    const HINT: &str = "pass --gpu NAME --cc MAJOR.MINOR to look up a kernel for a given GPU";
    if !gpu::cuda::driver_present() {
        bail!("no GPU: the CUDA driver (libcuda.so.1) is not installed; {HINT}");
    }
    let ctx = gpu::cuda::Context::new(0).map_err(|e| anyhow!("no GPU: {e}; {HINT}"))?;
    let info = gpu::DeviceInfo::query(&ctx).map_err(|e| anyhow!("no GPU: {e}; {HINT}"))?;
    Ok((info.name, info.compute_capability))
}

/// "9.0" → (9, 0).
fn parse_cc(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("'{s}' is not a compute capability MAJOR.MINOR, e.g. 9.0");
    let (major, minor) = s.trim().split_once('.').ok_or_else(bad)?;
    Ok((
        major.parse().map_err(|_| bad())?,
        minor.parse().map_err(|_| bad())?,
    ))
}
