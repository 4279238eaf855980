//! Cost-model tools.
//!
//! `tilesched model eval --log FILE`: how well the XGBoost model ranks unseen
//! candidates. Per task, a seeded share of the records is held out; the model trains on
//! the rest of every task and is scored on the held-out records by Spearman rank
//! correlation (predicted score vs measured throughput) and top-k recall.
//!
//! `tilesched model train --from LOG_OR_DIR... --out FILE`: a model trained on the
//! records of many tasks (a seeded sample of each task's), as the one shipped for
//! Hopper is made; `--exclude` leaves tasks out, so that the tasks a model is judged
//! on were never seen.
//!
//! `tilesched model rank --from LOG_OR_DIR... [--model FILE]`: how well a model (the
//! shipped one by default) ranks every record of the tasks of the logs, against a cold
//! model's random scores: pairwise accuracy, and how many of a task's ten fastest
//! candidates are among the 64 it scores highest (a round's worth).
//!
//! `tilesched model replay --log FILE --growth G...`: the log's rounds in order, each
//! scored (pairwise accuracy per task) by the model trained on the rounds before it,
//! under each retraining schedule of `tune --retrain-growth`: what fewer retrainings
//! save in training time and cost in ranking, without a GPU.

use anyhow::{Result, bail};
use costmodel::eval::{pairwise_accuracy, recall_among, spearman, top_k_recall};
use costmodel::{CostModel, Dataset, RandomModel, XgbModel, XgbParams};
use features::{FEATURE_COUNT, FEATURE_NAMES, FeatureExtractor};
use records::read_log;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Train on part of a log, report ranking quality per task on the rest.
    Eval(EvalArgs),
    /// Train a model on the records of many tasks (how the shipped one is made).
    Train(TrainArgs),
    /// Ranking quality of a model on the tasks of some logs, against a cold model.
    Rank(RankArgs),
    /// A log's rounds replayed in order under retraining schedules: how well each round
    /// is ranked by the model trained on the rounds before it, and what training cost.
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// A tuning log, replayed in its order (a round's records are written together).
    #[arg(long)]
    log: PathBuf,
    /// Records per round.
    #[arg(long, default_value_t = 64)]
    round: usize,
    /// The schedules compared (`tune --retrain-growth`; 0: after every round).
    #[arg(long, num_args = 1.., default_values_t = [0.0])]
    growth: Vec<f64>,
    /// The model to start from [default: the one shipped for Hopper].
    #[arg(long, conflicts_with = "cold")]
    model: Option<PathBuf>,
    /// Start from an untrained model instead.
    #[arg(long)]
    cold: bool,
    /// Residual retrainings of this many trees between retrainings from scratch
    /// (`tune --residual-rounds`; 0: every retraining from scratch).
    #[arg(long, default_value_t = costmodel::RESIDUAL_ROUNDS)]
    residual_rounds: u32,
    /// With residual retrainings, every this-many-th retraining is from scratch.
    #[arg(long, default_value_t = 8)]
    full_every: u32,
    /// Histogram bins per feature in training (XGBoost's `max_bin`).
    #[arg(long, default_value_t = costmodel::XgbParams::default().max_bin)]
    max_bin: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(clap::Args)]
pub struct TrainArgs {
    /// Tuning logs, `best --json` files, or directories searched for them.
    #[arg(long, value_name = "LOG_OR_DIR", num_args = 1.., required = true)]
    from: Vec<PathBuf>,
    /// Leave out every task whose key contains one of these.
    #[arg(long, value_name = "TEXT", num_args = 1..)]
    exclude: Vec<String>,
    /// Records kept per task (a seeded sample), so that no task's log outweighs the rest.
    #[arg(long, default_value_t = 160)]
    per_task: usize,
    /// Where to save the model (gzipped when the name ends in .gz).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(clap::Args)]
pub struct RankArgs {
    /// Tuning logs (or directories of them) whose tasks the model is scored on.
    #[arg(long, value_name = "LOG_OR_DIR", num_args = 1.., required = true)]
    from: Vec<PathBuf>,
    /// Only the tasks whose key contains one of these.
    #[arg(long, value_name = "TEXT", num_args = 1..)]
    only: Vec<String>,
    /// The model [default: the one shipped for Hopper].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Records scored per task at most (a seeded sample).
    #[arg(long, default_value_t = 2000)]
    per_task: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Per task: a seeded sample of its records' feature rows and times (a reservoir), so
/// that a log of any length takes bounded memory.
struct Sample {
    keep: usize,
    seed: u64,
    wanted: Box<dyn Fn(&str) -> bool>,
    tasks: BTreeMap<String, TaskSample>,
    extractors: BTreeMap<(String, String), FeatureExtractor>,
    unusable: usize,
}

#[derive(Default)]
struct TaskSample {
    seen: u64,
    rows: Vec<([f32; FEATURE_COUNT], Option<f64>)>,
}

impl records::LogSink for Sample {
    fn record(&mut self, r: records::Record) {
        if r.spoiled() || r.injected.is_some() || !(self.wanted)(&r.task) {
            return;
        }
        let extractor = match self
            .extractors
            .entry((r.task.clone(), r.device.name.clone()))
        {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => match r.device.spec() {
                Ok(spec) => e.insert(FeatureExtractor::new(&r.shape, &spec)),
                Err(_) => {
                    self.unusable += 1;
                    return;
                }
            },
        };
        let t = self.tasks.entry(r.task.clone()).or_default();
        t.seen += 1;
        let slot = if t.rows.len() < self.keep {
            None
        } else {
            // Reservoir sampling with a seeded draw per (task, position).
            let j = shuffle_key(self.seed ^ t.seen, t.rows.len()) % t.seen;
            match usize::try_from(j) {
                Ok(j) if j < self.keep => Some(j),
                _ => return,
            }
        };
        let row = (extractor.extract(&r.state), r.median_us());
        match slot {
            None => t.rows.push(row),
            Some(j) => t.rows[j] = row,
        }
    }

    fn skipped(&mut self, _: records::Skipped) {}
}

impl Sample {
    fn read(
        paths: &[PathBuf],
        keep: usize,
        seed: u64,
        wanted: Box<dyn Fn(&str) -> bool>,
    ) -> Result<Sample> {
        let mut sample = Sample {
            keep,
            seed,
            wanted,
            tasks: BTreeMap::new(),
            extractors: BTreeMap::new(),
            unusable: 0,
        };
        records::read_records(paths, &mut sample)?;
        Ok(sample)
    }

    /// One task's rows as a dataset.
    fn dataset(task: &str, sample: &TaskSample) -> Dataset {
        let mut d = Dataset::new(FEATURE_COUNT);
        for (row, us) in &sample.rows {
            d.push(row, task, *us);
        }
        d
    }
}

fn feature_names() -> Vec<String> {
    FEATURE_NAMES.iter().map(|s| s.to_string()).collect()
}

fn train(args: TrainArgs) -> Result<()> {
    let exclude = args.exclude.clone();
    let sample = Sample::read(
        &args.from,
        args.per_task,
        args.seed,
        Box::new(move |task| !exclude.iter().any(|e| task.contains(e.as_str()))),
    )?;
    let mut data = Dataset::new(FEATURE_COUNT);
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for (task, t) in &sample.tasks {
        data.extend(&Sample::dataset(task, t));
        let kind = task.split('_').next().unwrap_or(task).to_string();
        let types = if task.contains("_fp16") {
            "fp16"
        } else if task.contains("_bf16") {
            "bf16"
        } else if task.contains("_tf32") {
            "tf32"
        } else {
            "f32"
        };
        *by_kind.entry(format!("{kind} {types}")).or_default() += 1;
    }
    if data.is_empty() {
        bail!("no records to train on in the logs given");
    }
    let params = XgbParams {
        min_rows: 0,
        ..XgbParams::default()
    };
    let mut model = XgbModel::new(feature_names(), params, args.seed);
    let started = std::time::Instant::now();
    model.update(&data)?;
    model.save(&args.out)?;
    let seen: u64 = sample.tasks.values().map(|t| t.seen).sum();
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "{}: trained in {:.1} s on {} rows of {} tasks ({}), sampled from {seen} records",
        args.out.display(),
        started.elapsed().as_secs_f64(),
        data.len(),
        sample.tasks.len(),
        kinds.join(", ")
    );
    Ok(())
}

fn rank(args: RankArgs) -> Result<()> {
    let only = args.only.clone();
    let sample = Sample::read(
        &args.from,
        args.per_task,
        args.seed,
        Box::new(move |task| only.is_empty() || only.iter().any(|o| task.contains(o.as_str()))),
    )?;
    let names = feature_names();
    let mut model = match &args.model {
        Some(path) => XgbModel::load(path, &names, args.seed)?,
        None => {
            XgbModel::shipped((9, 0), &names, args.seed).expect("a model is shipped for Hopper")?
        }
    };
    let mut cold = RandomModel::new(FEATURE_COUNT, args.seed);
    println!(
        "{:<60} {:>6} {:>9} {:>9} {:>11} {:>11}",
        "task", "rows", "pairwise", "(cold)", "top10/64", "(cold)"
    );
    let mut sums = [0.0f64; 4];
    let mut n = 0usize;
    for (task, t) in &sample.tasks {
        let d = Sample::dataset(task, t);
        let truth: Vec<f64> = d.labels().into_iter().map(f64::from).collect();
        let scored: Vec<f64> = model.predict(&d.rows).into_iter().map(f64::from).collect();
        let random: Vec<f64> = cold.predict(&d.rows).into_iter().map(f64::from).collect();
        let (Some(p), Some(pc), Some(r), Some(rc)) = (
            pairwise_accuracy(&truth, &scored),
            pairwise_accuracy(&truth, &random),
            recall_among(&truth, &scored, 10, 64),
            recall_among(&truth, &random, 10, 64),
        ) else {
            continue;
        };
        println!(
            "{task:<60} {:>6} {p:>9.3} {pc:>9.3} {r:>11.3} {rc:>11.3}",
            d.len()
        );
        for (s, v) in sums.iter_mut().zip([p, pc, r, rc]) {
            *s += v;
        }
        n += 1;
    }
    if n == 0 {
        bail!("no task with records to rank in the logs given");
    }
    let m = |i: usize| sums[i] / n as f64;
    println!(
        "{:<60} {:>6} {:>9.3} {:>9.3} {:>11.3} {:>11.3}",
        format!("mean over {n} tasks"),
        "",
        m(0),
        m(1),
        m(2),
        m(3)
    );
    Ok(())
}

fn replay(args: ReplayArgs) -> Result<()> {
    if args.round == 0 {
        bail!("--round must be at least 1");
    }
    if let Some(g) = args.growth.iter().find(|g| !(g.is_finite() && **g >= 0.0)) {
        bail!("--growth {g}: a schedule is a share of the rows measured, 0 or more");
    }
    let log = read_log(&args.log)?;
    if let Some(w) = log.warning(&args.log) {
        eprintln!("{w}");
    }
    // Every usable record's row, in the log's order.
    let mut extractors: BTreeMap<(String, String), FeatureExtractor> = BTreeMap::new();
    let mut rows: Vec<(&str, [f32; FEATURE_COUNT], Option<f64>)> = Vec::new();
    for r in log
        .records
        .iter()
        .filter(|r| !r.spoiled() && r.injected.is_none())
    {
        let key = (r.task.clone(), r.device.name.clone());
        let ex = match extractors.entry(key) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(FeatureExtractor::new(&r.shape, &r.device.spec()?))
            }
        };
        rows.push((&r.task, ex.extract(&r.state), r.median_us()));
    }
    let rounds: Vec<Dataset> = rows
        .chunks(args.round)
        .map(|chunk| {
            let mut d = Dataset::new(FEATURE_COUNT);
            for (task, row, us) in chunk {
                d.push(row, task, *us);
            }
            d
        })
        .collect();
    println!(
        "{}: {} records in {} rounds of {}",
        args.log.display(),
        rows.len(),
        rounds.len(),
        args.round
    );
    println!(
        "{:>7} {:>11} {:>10} {:>15} {:>16}",
        "growth", "retrainings", "training", "pairwise (mean)", "second half"
    );
    let names = feature_names();
    for &growth in &args.growth {
        let mut model = if args.cold {
            XgbModel::new(names.clone(), XgbParams::default(), args.seed)
        } else if let Some(path) = &args.model {
            XgbModel::load(path, &names, args.seed)?
        } else {
            XgbModel::shipped((9, 0), &names, args.seed).expect("a model is shipped for Hopper")?
        };
        model.set_residual(args.residual_rounds, args.full_every);
        model.set_max_bin(args.max_bin);
        let schedule = search::RetrainSchedule { growth };
        let (mut learnt, mut trained_on, mut retrainings) = (0usize, 0usize, 0usize);
        let mut training = std::time::Duration::ZERO;
        let mut trained = !args.cold;
        // Per round after the first with a model: its mean pairwise accuracy over tasks.
        let mut scores: Vec<f64> = Vec::new();
        for round in &rounds {
            if trained {
                let predicted: Vec<f32> = model.predict(&round.rows);
                let labels = round.labels();
                let mut by_task: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
                for (i, task) in round.tasks.iter().enumerate() {
                    let e = by_task.entry(task).or_default();
                    e.0.push(f64::from(labels[i]));
                    e.1.push(f64::from(predicted[i]));
                }
                let accs: Vec<f64> = by_task
                    .values()
                    .filter_map(|(t, p)| pairwise_accuracy(t, p))
                    .collect();
                if !accs.is_empty() {
                    scores.push(accs.iter().sum::<f64>() / accs.len() as f64);
                }
            }
            learnt += round.len();
            if let Some(fit) = model.learn(round)
                && schedule.due(learnt, trained_on)
            {
                let started = std::time::Instant::now();
                model.install(fit.run()?);
                training += started.elapsed();
                retrainings += 1;
                trained_on = learnt;
                trained = true;
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        println!(
            "{growth:>7.2} {retrainings:>11} {:>9.1}s {:>15.3} {:>16.3}",
            training.as_secs_f64(),
            mean(&scores),
            mean(&scores[scores.len() / 2..])
        );
    }
    Ok(())
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
    let args = match command {
        Command::Eval(args) => args,
        Command::Train(args) => return train(args),
        Command::Rank(args) => return rank(args),
        Command::Replay(args) => return replay(args),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_model_loads_with_this_builds_features_and_ranks() {
        let model = XgbModel::shipped((9, 0), &feature_names(), 0)
            .expect("a model is shipped for Hopper")
            .expect("it matches this build's features");
        assert!(model.training_rows() > 1000, "{}", model.training_rows());
        assert!(XgbModel::shipped((8, 0), &feature_names(), 0).is_none());
    }

    #[test]
    fn a_shipped_model_of_other_features_is_refused_in_one_line() {
        let mut names = feature_names();
        names.pop();
        let e = XgbModel::shipped((9, 0), &names, 0)
            .expect("a model is shipped for Hopper")
            .err()
            .expect("refused");
        let message = e.to_string();
        assert!(message.contains("other features"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
}
