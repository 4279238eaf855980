//! `tilesched model eval --log FILE`: how well the XGBoost model ranks unseen
//! candidates. Per task, a seeded share of the records is held out; the model trains on
//! the rest of every task and is scored on the held-out records by Spearman rank
//! correlation (predicted score vs measured throughput) and top-k recall.

use anyhow::{Result, bail};
use costmodel::eval::{spearman, top_k_recall};
use costmodel::{CostModel, Dataset, XgbModel, XgbParams};
use features::{FEATURE_COUNT, FEATURE_NAMES, FeatureExtractor};
use records::read_log;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Train on part of a log, report ranking quality per task on the rest.
    Eval(EvalArgs),
}

#[derive(clap::Args)]
pub struct EvalArgs {
    /// Tuning log (its correct and failed records).
    #[arg(long)]
    log: PathBuf,
    /// Share of each task's records held out for testing.
    #[arg(long, default_value_t = 0.3)]
    holdout: f64,
    /// k of the top-k recall.
    #[arg(long, default_value_t = 10)]
    top_k: usize,
    /// Seed of the split.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Seeded pseudo-random order key of record `i`.
fn shuffle_key(seed: u64, i: usize) -> u64 {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 33)
}

pub fn run(command: Command) -> Result<()> {
    let Command::Eval(args) = command;
    if !(0.0..1.0).contains(&args.holdout) || args.holdout == 0.0 {
        bail!("--holdout must be between 0 and 1");
    }
    let log = read_log(&args.log)?;
    if let Some(w) = log.warning(&args.log) {
        eprintln!("{w}");
    }
    // Per task: record indices in a seeded order; the first share is held out.
    let mut by_task: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    // A spoiled measurement says nothing of its candidate: neither trained on nor scored.
    for (i, r) in log.records.iter().enumerate().filter(|(_, r)| !r.spoiled()) {
        by_task.entry(r.task.as_str()).or_default().push(i);
    }
    let mut train = Dataset::new(FEATURE_COUNT);
    let mut tests: Vec<(&str, Dataset)> = Vec::new();
    for (task, mut idx) in by_task {
        idx.sort_by_key(|&i| shuffle_key(args.seed, i));
        let first = &log.records[idx[0]];
        let ex = FeatureExtractor::new(&first.shape, &first.device.spec()?);
        let held = ((idx.len() as f64) * args.holdout).round() as usize;
        let mut test = Dataset::new(FEATURE_COUNT);
        for (k, &i) in idx.iter().enumerate() {
            let r = &log.records[i];
            let target = if k < held { &mut test } else { &mut train };
            target.push(&ex.extract(&r.state), &r.task, r.median_us());
        }
        tests.push((task, test));
    }
    if train.is_empty() {
        bail!("{} holds no records to train on", args.log.display());
    }
    let names: Vec<String> = FEATURE_NAMES.iter().map(|s| s.to_string()).collect();
    let params = XgbParams {
        min_rows: 0,
        ..XgbParams::default()
    };
    let mut model = XgbModel::new(names, params, args.seed);
    let started = std::time::Instant::now();
    model.update(&train)?;
    println!(
        "trained on {} records in {:.1} s; held out {:.0}% of each task",
        train.len(),
        started.elapsed().as_secs_f64(),
        args.holdout * 100.0
    );
    let width = tests.iter().map(|(t, _)| t.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:>5}  {:>8}  {:>12}",
        "task",
        "test",
        "spearman",
        format!("top-{} recall", args.top_k)
    );
    let (mut rhos, mut recalls) = (Vec::new(), Vec::new());
    for (task, test) in &tests {
        let predicted: Vec<f64> = model
            .predict(&test.rows)
            .into_iter()
            .map(f64::from)
            .collect();
        let truth: Vec<f64> = test.labels().into_iter().map(f64::from).collect();
        let rho = spearman(&truth, &predicted);
        let recall = top_k_recall(&truth, &predicted, args.top_k);
        rhos.extend(rho);
        recalls.extend(recall);
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!(
            "{task:<width$}  {:>5}  {:>8}  {:>12}",
            test.len(),
            fmt(rho),
            fmt(recall)
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "{:<width$}  {:>5}  {:>8.3}  {:>12.3}",
        "mean",
        "",
        mean(&rhos),
        mean(&recalls)
    );
    Ok(())
}
