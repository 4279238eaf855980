//! `tilesched workloads [--network NAME] [--batch N]`: one task per line with its key,
//! shape, GFLOP and count in the network. Lines starting with `#` are headers.

use crate::cmd::tasks::TypeArgs;
use anyhow::Result;
use schedule::{NETWORKS, Workload, network};

#[derive(clap::Args)]
pub struct Args {
    /// Network to list (resnet, resnet50, resnet18, yolo, bert-base); all when omitted.
    #[arg(long)]
    network: Option<String>,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    #[command(flatten)]
    types: TypeArgs,
}

pub fn run(args: Args) -> Result<()> {
    let names: Vec<&str> = match &args.network {
        Some(name) => vec![name.as_str()],
        None => NETWORKS.to_vec(),
    };
    // Resolve every network first so that a bad name prints nothing but the error.
    let sets = names
        .iter()
        .map(|name| {
            let workloads = network(name, args.batch)?
                .into_iter()
                .map(|w| {
                    Ok(Workload {
                        task: args.types.apply(w.task)?,
                        ..w
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((*name, workloads))
        })
        .collect::<Result<Vec<_>>>()?;
    for (name, workloads) in sets {
        let layers: u32 = workloads.iter().map(|w| w.count).sum();
        let gflop: f64 = workloads
            .iter()
            .map(|w| w.task.flops() as f64 * f64::from(w.count))
            .sum::<f64>()
            / 1e9;
        println!(
            "# {name}, batch {}: {} tasks, {layers} layers, {gflop:.3} GFLOP per pass",
            args.batch,
            workloads.len()
        );
        println!(
            "{:<56} {:<26} {:>9} {:>5}",
            "# key", "shape", "GFLOP", "count"
        );
        for w in &workloads {
            println!(
                "{:<56} {:<26} {:>9.4} {:>5}",
                w.task.key(),
                w.task.shape_spec(),
                w.task.flops() as f64 / 1e9,
                w.count
            );
        }
    }
    Ok(())
}
