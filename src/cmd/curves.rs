//! `tilesched curves <op> (--network NAME | --shape SPEC... | --onnx FILE) --log
//! LABEL=FILE... --out DIR [--bench LABEL=bench.json...]`: the tuning curves of several
//! logs of the same tasks (a cold run, one with transfer, one with a pretrained model...)
//! in one plot (`tuning.png`, as `bench` draws one log's) and one table (`tuning.csv`):
//! per log, at each trial where the curve moves and at its last, the seconds since its
//! first trial, `Σ count × best µs` so far and,
//! for a log given its `bench` report, the geometric mean speedup over the vendor so far.
//! Needs no GPU.
//!
//! The speedup so far of a task is its bench speedup scaled by how far its best was from
//! its final best at that trial: `vendor / ours` of the bench report, times `final best
//! / best so far` of the log (both tune times), so that the curve ends at the report's
//! figure while every point uses the log's own protocol.

use crate::cmd::tasks::{TaskArgs, TypeArgs, resolve};
use anyhow::{Context, Result, bail};
use benchmarks::curves::{Trial, curve_points, network_curve};
use benchmarks::plot;
use records::read_log;
use schedule::Epilogue;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Operator: conv2d, matmul or batch_matmul.
    op: String,
    #[command(flatten)]
    tasks: TaskArgs,
    #[command(flatten)]
    types: TypeArgs,
    /// Network batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// A labelled tuning log, LABEL=FILE (repeatable).
    #[arg(long = "log", value_name = "LABEL=FILE", required = true)]
    logs: Vec<String>,
    /// The bench report of a labelled log, LABEL=bench.json (repeatable).
    #[arg(long = "bench", value_name = "LABEL=FILE")]
    benches: Vec<String>,
    /// Title of the plot.
    #[arg(long, default_value = "tuning")]
    title: String,
    /// Where tuning.png and tuning.csv go.
    #[arg(long)]
    out: PathBuf,
}

/// `LABEL=FILE`, split.
fn labelled(spec: &str, flag: &str) -> Result<(String, PathBuf)> {
    match spec.split_once('=') {
        Some((label, file)) if !label.is_empty() && !file.is_empty() => {
            Ok((label.to_string(), PathBuf::from(file)))
        }
        _ => bail!("--{flag} {spec}: expected LABEL=FILE"),
    }
}

/// Per task of a bench report: `vendor / ours × final tune best`, the reference whose
/// ratio to a best so far is the speedup so far (see the module doc).
fn reference(path: &PathBuf) -> Result<HashMap<String, f64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let report: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let rows = report["rows"]
        .as_array()
        .with_context(|| format!("{}: no rows", path.display()))?;
    let mut out = HashMap::new();
    for row in rows {
        let (Some(task), Some(vendor), Some(ours), Some(tuned)) = (
            row["task"].as_str(),
            row["vendor"]["median_us"].as_f64(),
            row["ours"]["median_us"].as_f64(),
            row["tuned_us"].as_f64(),
        ) else {
            continue;
        };
        out.insert(task.to_string(), vendor / ours * tuned);
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<()> {
    let (workloads, _) = resolve(
        &args.op,
        &args.tasks,
        args.batch,
        Epilogue::default(),
        &args.types,
    )?;
    let weights: Vec<(String, u32)> = workloads.iter().map(|w| (w.task.key(), w.count)).collect();
    let mut benches = HashMap::new();
    for spec in &args.benches {
        let (label, file) = labelled(spec, "bench")?;
        benches.insert(label, reference(&file)?);
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("--out {}", args.out.display()))?;
    let mut curves = Vec::new();
    let mut csv = String::from("label,trial,seconds,sum_us,geomean_speedup\n");
    let none = HashMap::new();
    for spec in &args.logs {
        let (label, file) = labelled(spec, "log")?;
        let log = read_log(&file)?;
        if let Some(w) = log.warning(&file) {
            eprintln!("{w}");
        }
        let trials: Vec<Trial> = log.records.iter().map(Trial::from_record).collect();
        let reference = benches.get(&label).unwrap_or(&none);
        // A row where the curve moves (and the last): a flat stretch adds nothing.
        let points = curve_points(&trials, &weights, reference);
        for (i, p) in points.iter().enumerate() {
            let moved = i == 0 || {
                let q = &points[i - 1];
                (q.sum_us, q.geomean) != (p.sum_us, p.geomean)
            };
            if !moved && i + 1 != points.len() {
                continue;
            }
            let geomean = p.geomean.map_or(String::new(), |g| format!("{g:.4}"));
            writeln!(
                csv,
                "{label},{},{:.0},{:.3},{geomean}",
                p.trial, p.seconds, p.sum_us
            )?;
        }
        curves.push((label, network_curve(&log.records, &workloads)));
    }
    let csv_path = args.out.join("tuning.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("{}", csv_path.display()))?;
    plot::tuning_curves(&args.out.join("tuning.png"), &args.title, &curves)?;
    println!(
        "wrote {0}/tuning.png and {0}/tuning.csv",
        args.out.display()
    );
    Ok(())
}
