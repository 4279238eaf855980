//! `tilesched`: the command line. One module per subcommand under `cmd/`; everything
//! else lives in the library crates.

mod cmd;
mod lock;
mod malloc;
mod scratch;
mod signals;
mod usage;

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
    /// The tuning curves of several logs of the same tasks, as a plot and a table.
    Curves(cmd::curves::Args),
    /// Second stage: reorder the SASS of each task's best kernel, validated on the GPU.
    Sass(cmd::sass::Args),
    /// Both stages (tune, then sass) and the deploy cache.
    Pipeline(cmd::pipeline::Args),
    /// Write the analytical features of measured or sampled states as CSV.
    Features(cmd::features::Args),
    /// Cost-model tools.
    #[command(subcommand)]
    Model(cmd::model::Command),
    /// Kernel databases for transfer (`tune --from`).
    #[command(subcommand)]
    Database(cmd::database::Command),
    /// The deploy cache: the best cubin of each task per GPU.
    #[command(subcommand)]
    Deploy(cmd::deploy::Command),
    /// Measure for tuners on a queue with this host's GPUs (`--queue`).
    Worker(cmd::worker::Args),
    /// Compile the kernels waiting on a queue on this host's cores, for its GPU workers.
    Builder(cmd::builder::Args),
    /// Developer tool: sampled states and what the build makes of them, one line each
    /// (`scripts/sameness`).
    #[command(hide = true)]
    Sameness(cmd::sameness::Args),
}

/// Exits quietly when stdout's reader has gone (`tilesched workloads | head`): `print!`
/// panics on a broken pipe, and that panic, from any thread, ends the process with
/// status 0 and no text, as other command-line tools do. Every other panic keeps the
/// default report.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // std's text: "failed printing to stdout: Broken pipe (os error 32)".
        if message.starts_with("failed printing to stdout")
            && message.to_lowercase().contains("broken pipe")
        {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// An error and its causes on one line, each cause left out where the message before it
/// already says it (a `thiserror` message that prints its source, an I/O error wrapped
/// twice): "cannot read x: Is a directory (os error 21)", not that twice.
fn one_line(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.contains(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

fn main() -> ExitCode {
    malloc::keep_freed_memory();
    quiet_on_broken_pipe();
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
        Command::Sameness(args) => cmd::sameness::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Curves(args) => cmd::curves::run(args),
        Command::Sass(args) => cmd::sass::run(args),
        Command::Pipeline(args) => cmd::pipeline::run(args),
        Command::Model(command) => cmd::model::run(command),
        Command::Database(command) => cmd::database::run(command),
        Command::Deploy(command) => cmd::deploy::run(command),
        Command::Builder(args) => cmd::builder::run(args),
        Command::Worker(args) => return cmd::worker::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            // An interrupted run ends as an interrupted process does (128 + SIGINT).
            match e.downcast_ref::<search::TuneError>() {
                Some(search::TuneError::Interrupted { .. }) => ExitCode::from(130),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_already_said_are_left_out() {
        let io = std::io::Error::other("Is a directory (os error 21)");
        let e = anyhow::Error::new(io).context("cannot read x: Is a directory (os error 21)");
        assert_eq!(one_line(&e), "cannot read x: Is a directory (os error 21)");
        let e = anyhow::anyhow!("unexpected end of file")
            .context("reading the reply: unexpected end of file")
            .context("queue redis://h/q");
        assert_eq!(
            one_line(&e),
            "queue redis://h/q: reading the reply: unexpected end of file"
        );
    }
}
