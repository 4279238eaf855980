//! `tilesched`: the command line. One module per subcommand under `cmd/`; everything
//! else lives in the library crates.

mod cmd;
mod lock;
mod scratch;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "tilesched",
    version,
    about = "Auto-scheduler for GPU tensor kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the tasks of a network (or of every known network).
    Workloads(cmd::workloads::Args),
    /// Sample states of one operator shape and write their CUDA sources.
    Codegen(cmd::codegen::Args),
    /// Search for the fastest correct kernel of each task, measuring on the GPU.
    Tune(cmd::tune::Args),
    /// The best correct kernel of each task in a tuning log.
    Best(cmd::best::Args),
    /// Write the best kernel of a task as CUDA source, PTX or cubin.
    Export(cmd::export::Args),
    /// Our best kernels against cuDNN / cuBLAS, side by side on this GPU.
    Bench(cmd::bench::Args),
    /// Second stage: reorder the SASS of each task's best kernel, validated on the GPU.
    Sass(cmd::sass::Args),
    /// Both stages (tune, then sass) and the deploy cache.
    Pipeline(cmd::pipeline::Args),
    /// Write the analytical features of measured or sampled states as CSV.
    Features(cmd::features::Args),
    /// Cost-model tools.
    #[command(subcommand)]
    Model(cmd::model::Command),
    /// The deploy cache: the best cubin of each task per GPU.
    #[command(subcommand)]
    Deploy(cmd::deploy::Command),
    /// Measure for tuners on a queue with this host's GPUs (`--queue`).
    Worker(cmd::worker::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One clear line: clap's message without the usage block that follows it.
            let text = e.render().to_string();
            let message: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
                .collect();
            eprintln!("{}", message.join(" "));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Workloads(args) => cmd::workloads::run(args),
        Command::Codegen(args) => cmd::codegen::run(args),
        Command::Tune(args) => cmd::tune::run(args),
        Command::Best(args) => cmd::best::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Features(args) => cmd::features::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Sass(args) => cmd::sass::run(args),
        Command::Pipeline(args) => cmd::pipeline::run(args),
        Command::Model(command) => cmd::model::run(command),
        Command::Deploy(command) => cmd::deploy::run(command),
        Command::Worker(args) => return cmd::worker::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
