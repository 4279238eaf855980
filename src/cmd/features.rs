//! `tilesched features --log FILE --out FILE.csv` (one row per measured record) and
//! `tilesched features <op> --shape SPEC --sample N --out FILE.csv` (sampled states, no
//! GPU): every analytical feature by name, for analysis in pandas or R.

use crate::cmd::tasks::TypeArgs;
use crate::cmd::tasks::check_op;
use anyhow::{Context, Result, bail};
use features::{FEATURE_NAMES, FeatureExtractor};
use records::read_log;
use schedule::{Epilogue, GpuSpec, Sampler, State, Task, parse_shape};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Operator of the sampled states (with --shape).
    op: Option<String>,
    /// Rows from the measured records of this tuning log.
    #[arg(long, conflicts_with_all = ["op", "shape"])]
    log: Option<PathBuf>,
    /// Shape of the sampled states (with an operator).
    #[arg(long, requires = "op")]
    shape: Option<String>,
    /// Number of distinct sampled states.
    #[arg(long, default_value_t = 100)]
    sample: usize,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// GPU whose limits and sizes the features use (sampled states; h100, h200).
    #[arg(long, default_value = "h100")]
    gpu: String,
    /// Output CSV file.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    types: TypeArgs,
}

fn header() -> Vec<String> {
    let mut h = vec!["task".to_string(), "state_id".to_string()];
    h.extend(FEATURE_NAMES.iter().map(|s| s.to_string()));
    h.extend(["measured_us".to_string(), "error".to_string()]);
    h
}

fn row(task: &str, state: &State, f: &[f32], us: Option<f64>, error: &str) -> Vec<String> {
    let mut r = vec![task.to_string(), state.id()];
    r.extend(f.iter().map(|v| v.to_string()));
    r.push(us.map(|u| u.to_string()).unwrap_or_default());
    r.push(error.to_string());
    r
}

pub fn run(args: Args) -> Result<()> {
    let rows: Vec<Vec<String>> = if let Some(log_path) = &args.log {
        let log = read_log(log_path)?;
        if let Some(w) = log.warning(log_path) {
            eprintln!("{w}");
        }
        let mut extractors: HashMap<(String, String), FeatureExtractor> = HashMap::new();
        log.records
            .iter()
            .map(|r| {
                let ex = match extractors.entry((r.task.clone(), r.device.name.clone())) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => {
                        e.insert(FeatureExtractor::new(&r.shape, &r.device.spec()?))
                    }
                };
                let error = r.error_kind().map_or("", |k| k.name());
                Ok(row(
                    &r.task,
                    &r.state,
                    &ex.extract(&r.state),
                    r.median_us(),
                    error,
                ))
            })
            .collect::<Result<_>>()?
    } else {
        let (Some(op), Some(shape)) = (&args.op, &args.shape) else {
            bail!("give --log FILE, or an operator with --shape SPEC");
        };
        check_op(op)?;
        crate::cmd::tasks::check_sample(args.sample)?;
        let gpu = GpuSpec::builtin(&args.gpu)
            .with_context(|| format!("unknown GPU '{}' (expected h100 or h200)", args.gpu))?;
        let task = args
            .types
            .apply(Task::new(parse_shape(op, shape)?, Epilogue::default())?)?;
        let ex = FeatureExtractor::new(&task, &gpu);
        Sampler::new(&task, &gpu, args.seed)
            .sample_distinct(args.sample)
            .iter()
            .map(|s| row(&task.key(), s, &ex.extract(s), None, ""))
            .collect()
    };
    let mut w = csv::Writer::from_path(&args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    w.write_record(header())?;
    for r in &rows {
        w.write_record(r)?;
    }
    w.flush()?;
    println!(
        "wrote {} rows x {} features to {}",
        rows.len(),
        FEATURE_NAMES.len(),
        args.out.display()
    );
    Ok(())
}
