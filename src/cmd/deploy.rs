//! `tilesched deploy lookup --cache DIR --task KEY [--gpu NAME --cc MAJOR.MINOR] [--json]`:
//! the deployed kernel of a task for this GPU (or the named one) from a deploy cache: its
//! cubin's absolute path and how to launch it. Reads the cache only; never searches or
//! compiles, and refuses a cubin whose hash does not match the index.

use anyhow::{Result, anyhow, bail};
use sass_stage::deploy::{DeployCache, gpu_label};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the cached best kernel of a task for a GPU (path, launch, times).
    Lookup(LookupArgs),
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
    }
}

fn lookup(args: LookupArgs) -> Result<()> {
    let cache = DeployCache::load(&args.cache)?;
    let (gpu, cc) = match (args.gpu, args.cc) {
        (Some(gpu), Some(cc)) => (gpu, cc),
        _ => current_gpu()?,
    };
    let Some(entry) = cache.lookup(&gpu, cc, &args.task) else {
        let tasks = cache.tasks_for(&gpu, cc);
        let has = if tasks.is_empty() {
            "it has no tasks for this GPU".to_string()
        } else {
            format!("its tasks for this GPU: {}", tasks.join(", "))
        };
        bail!(
            "no deployed kernel for task {} on {} in {}; {has}",
            args.task,
            gpu_label(&gpu, cc),
            cache.dir().display()
        );
    };
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
