//! `tilesched builder --queue redis://HOST:PORT/NAME [--threads N] [--insecure]`: compiles
//! the kernels of the jobs waiting on a queue on this host's cores (no GPU needed), into
//! the queue's store, where the GPU workers find them instead of compiling them (see
//! the `queue` crate's `builder`).

use crate::signals::SignalFlag;
use anyhow::{Result, bail};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The queue to build for, redis://HOST[:PORT]/NAME.
    #[arg(long, value_name = "URL")]
    queue: String,
    /// Name on the queue [default: HOST-PID].
    #[arg(long)]
    name: Option<String>,
    /// Build threads [default: every core].
    #[arg(long)]
    threads: Option<usize>,
    /// Disk cache of compiled kernels (as `tune`'s).
    #[arg(long, value_name = "DIR")]
    cubin_cache: Option<PathBuf>,
    /// Build for a queue on another host without a password or a signing key
    /// (TILESCHED_QUEUE_KEY): anyone who reaches it could give the GPU workers kernels of
    /// their own.
    #[arg(long)]
    insecure: bool,
}

pub fn run(args: Args) -> Result<()> {
    let queue: queue::QueueAddress = args.queue.parse()?;
    let seal = queue::Seal::from_env()?;
    queue.check_exposure(seal.is_some(), args.insecure)?;
    queue.reach()?;
    let threads = args.threads.unwrap_or_else(rayon::current_num_threads);
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    gpu::nvrtc_lib::ensure_loaded()?;
    let workdir = crate::scratch::create()?;
    let cache = match crate::cmd::tune::cubin_cache(args.cubin_cache.as_deref(), false)? {
        Some(cache) => cache,
        // No cache directory of its own: one for this run only.
        None => gpu::CubinCache::open(workdir.path().join("cubins"))?,
    };
    let name = args
        .name
        .unwrap_or_else(|| format!("{}-{}", queue::host_name(), std::process::id()));
    let cfg = queue::BuilderConfig {
        queue,
        name,
        threads,
        workdir: workdir.path().join("build"),
        cache,
        seal,
    };
    let signals =
        SignalFlag::register("stopping after the builds under way (again to stop at once)")?;
    queue::build_for(cfg, &signals.flag, &|line| eprintln!("{line}"))?;
    Ok(())
}
