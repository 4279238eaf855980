//! `tilesched worker --device N` (hidden): the measurement worker process that `tune`
//! starts per GPU and talks to over stdin/stdout. `--simulate` answers without a GPU
//! (for tests of the tuner's side only).

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Answer with simulated measurements (no GPU; tests only).
    #[arg(long)]
    simulate: bool,
}

pub fn run(args: Args) -> ExitCode {
    let status = gpu::worker::run(args.device, args.simulate);
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}
