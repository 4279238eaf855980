//! `tilesched worker --queue redis://HOST:PORT/NAME [--device 0,1] [--insecure]`: measures for any
//! tuner on the queue with this host's GPUs, building the kernels on this host's cores
//! (see the `queue` crate). Without `--queue` it is the measurement process that `tune`
//! starts per GPU and talks to over stdin/stdout (`--device N`, one device).
//! `--simulate` answers without a GPU (tests of the tuner's side only).

use crate::signals::SignalFlag;
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// The queue to serve, redis://HOST[:PORT]/NAME.
    #[arg(long, value_name = "URL")]
    queue: Option<String>,
    /// CUDA devices (one without --queue).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    device: Vec<u32>,
    /// Name on the queue [default: HOST-PID].
    #[arg(long, requires = "queue")]
    name: Option<String>,
    /// Seconds a job may go unrenewed before another worker takes it over (use one
    /// value for every worker of a queue).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, requires = "queue")]
    lease: f64,
    /// Disk cache of compiled kernels (as `tune`'s).
    #[arg(long, value_name = "DIR", conflicts_with = "no_cubin_cache")]
    cubin_cache: Option<PathBuf>,
    /// Compile every kernel, reading and writing no cubin cache.
    #[arg(long)]
    no_cubin_cache: bool,
    /// Serve a queue on another host without a password or a signing key
    /// (TILESCHED_QUEUE_KEY): anyone who reaches it could have this host build and run
    /// kernels of their own.
    #[arg(long, requires = "queue")]
    insecure: bool,
    /// Answer with simulated measurements (no GPU; tests only).
    #[arg(long, hide = true)]
    simulate: bool,
}

pub fn run(args: Args) -> ExitCode {
    let Some(queue) = args.queue.clone() else {
        let [device] = args.device[..] else {
            eprintln!("error: the measurement process takes one --device (or pass --queue)");
            return ExitCode::from(2);
        };
        let status = gpu::worker::run(device, args.simulate);
        return ExitCode::from(u8::try_from(status).unwrap_or(1));
    };
    match serve(&queue, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(queue: &str, args: &Args) -> Result<()> {
    let queue: queue::QueueAddress = queue.parse()?;
    let seal = queue::Seal::from_env()?;
    queue.check_exposure(seal.is_some(), args.insecure)?;
    queue.reach()?;
    if !(args.lease.is_finite() && args.lease > 0.0 && args.lease <= 86400.0) {
        bail!("--lease must be a positive number of seconds up to a day");
    }
    let cache = crate::cmd::tune::cubin_cache(args.cubin_cache.as_deref(), args.no_cubin_cache)?;
    let mut pool = crate::cmd::tune::start_pool(&args.device, args.simulate)?;
    let workdir = crate::scratch::create()?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}-{}", queue::host_name(), std::process::id()));
    let cfg = queue::WorkerConfig {
        queue,
        name,
        lease: Duration::from_secs_f64(args.lease),
        builders: crate::cmd::tune::build_threads(args.device.len()),
        workdir: workdir.path().to_path_buf(),
        cache,
        seal,
    };
    // Runs until a GPU fails for good, or a signal: then it answers the jobs being
    // measured, hands back the others and leaves the queue. Killed, its jobs are taken
    // over once their lease runs out.
    let signals = SignalFlag::register(
        "stopping: answering the jobs being measured, handing back the others (again to stop at once)",
    )?;
    queue::serve(&mut pool, cfg, &signals.flag, &|line| eprintln!("{line}"))?;
    Ok(())
}
