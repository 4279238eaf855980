//! `tilesched workloads [--network NAME | --onnx FILE [--input NAME=DIMS] | --tasks FILE] [--batch N]`:
//! one task per line with its key, shape, GFLOP and count in the network or model.
//! Lines starting with `#` are headers; for a model, a last `#` line lists the nodes it
//! does not tune.

use crate::cmd::tasks::{TypeArgs, onnx_model, parse_input_arg, read_task_list};
use anyhow::Result;
use onnx::InputShape;
use schedule::{NETWORKS, Workload, network};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Network to list (resnet, resnet50, resnet18, mobilenet_v2, yolo, bert-base); all
    /// when omitted.
    #[arg(long, conflicts_with_all = ["onnx", "tasks"])]
    network: Option<String>,
    /// The tasks of an ONNX model instead (every Conv, MatMul and Gemm).
    #[arg(long, value_name = "FILE", conflicts_with = "tasks")]
    onnx: Option<PathBuf>,
    /// The tasks of a task list (JSON lines, as `tilesched.torch.tasks` writes them).
    #[arg(long, value_name = "FILE")]
    tasks: Option<PathBuf>,
    /// Fix an ONNX input's shape, NAME=N,C,H,W (repeatable).
    #[arg(long = "input", value_name = "NAME=DIMS", value_parser = parse_input_arg)]
    inputs: Vec<InputShape>,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    #[command(flatten)]
    types: TypeArgs,
}

pub fn run(args: Args) -> Result<()> {
    if !args.inputs.is_empty() && args.onnx.is_none() {
        anyhow::bail!("--input fixes an input of an --onnx model; give --onnx FILE");
    }
    if let Some(path) = &args.onnx {
        let model = onnx_model(path, &args.inputs, args.batch)?;
        let workloads = args.types.apply_all(model.workloads.iter().cloned())?;
        let inputs: Vec<String> = model.inputs.iter().map(|i| i.to_string()).collect();
        let label = format!("{} ({})", path.display(), inputs.join(" "));
        print_set(&label, None, &workloads);
        if let Some(line) = model.not_tuned_line() {
            println!("# {line}");
        }
        return Ok(());
    }
    if let Some(path) = &args.tasks {
        print_set(&path.display().to_string(), None, &read_task_list(path)?);
        return Ok(());
    }
    let names: Vec<&str> = match &args.network {
        Some(name) => vec![name.as_str()],
        None => NETWORKS.to_vec(),
    };
    // Resolve every network first so that a bad name prints nothing but the error.
    let sets = names
        .iter()
        .map(|name| Ok((*name, args.types.apply_all(network(name, args.batch)?)?)))
        .collect::<Result<Vec<_>>>()?;
    for (name, workloads) in sets {
        print_set(name, Some(args.batch), &workloads);
    }
    Ok(())
}

/// The set's header line: its totals, or that it has no task.
fn header(name: &str, batch: Option<u32>, workloads: &[Workload]) -> String {
    let batch = batch.map(|b| format!(", batch {b}")).unwrap_or_default();
    if workloads.is_empty() {
        return format!("# {name}{batch}: no tunable node (Conv, MatMul, Gemm): nothing to tune");
    }
    let layers: u32 = workloads.iter().map(|w| w.count).sum();
    let gflop = workloads
        .iter()
        .map(|w| w.task.flops() as f64 * f64::from(w.count))
        .sum::<f64>()
        / 1e9;
    format!(
        "# {name}{batch}: {} tasks, {layers} layers, {gflop:.3} GFLOP per pass",
        workloads.len()
    )
}

/// A header with the set's totals, then one line per task.
fn print_set(name: &str, batch: Option<u32>, workloads: &[Workload]) {
    println!("{}", header(name, batch, workloads));
    if workloads.is_empty() {
        return;
    }
    println!(
        "{:<56} {:<26} {:>9} {:>5}",
        "# key", "shape", "GFLOP", "count"
    );
    for w in workloads {
        println!(
            "{:<56} {:<26} {:>9.4} {:>5}",
            w.task.key(),
            w.task.shape_spec(),
            w.task.flops() as f64 / 1e9,
            w.count
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_model_says_so() {
        assert_eq!(
            header("m.onnx", Some(1), &[]),
            "# m.onnx, batch 1: no tunable node (Conv, MatMul, Gemm): nothing to tune"
        );
        let w = schedule::network::network("resnet", 1).unwrap();
        let h = header("resnet", None, &w);
        assert!(h.starts_with("# resnet: 13 tasks, 13 layers, "), "{h}");
    }
}
