//! `tilesched sameness --out FILE` (hidden, for `scripts/sameness`): what a refactoring of
//! the sketches must leave unchanged, as one line per sampled state. For a fixed set of
//! tasks (every operator, element type and layout, with and without an epilogue), it
//! samples states with fixed seeds and writes, per state: its record JSON, the hash of
//! its generated CUDA source (or why it has none), its launch, the hash of its feature
//! vector's bits, the ids of its DGD neighbours, one seeded mutant and its adaptation
//! to another task of the same types. Two builds that write the same file sample,
//! validate, lower, describe and step through the space identically. It ends with the
//! states counted per operator, type, layout and sketch, on stderr.

use crate::cmd::tasks::TypeArgs;
use anyhow::{Context, Result};
use features::FeatureExtractor;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;
use rayon::prelude::*;
use records::source_hash;
use schedule::{DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, adapt, generate};
use schedule::{network, parse_shape};
use search::evolution::TaskSpace;
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Where the lines go.
    #[arg(long)]
    out: PathBuf,
    /// Distinct states sampled per task (fewer where the space is smaller).
    #[arg(long, default_value_t = 1000)]
    states: usize,
    /// Seed of the sampler and of the mutations.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Element types (input, output) and conv2d layout of the tasks.
const CONV_TYPES: [(DType, DType, Layout); 7] = [
    (DType::F32, DType::F32, Layout::Nchw),
    (DType::F32, DType::F32, Layout::Nhwc),
    (DType::Tf32, DType::F32, Layout::Nhwc),
    (DType::Fp16, DType::Fp16, Layout::Nhwc),
    (DType::Fp16, DType::F32, Layout::Nchw),
    (DType::Bf16, DType::Bf16, Layout::Nhwc),
    (DType::Bf16, DType::F32, Layout::Nchw),
];
const MATMUL_TYPES: [(DType, DType); 4] = [
    (DType::F32, DType::F32),
    (DType::Tf32, DType::F32),
    (DType::Fp16, DType::Fp16),
    (DType::Bf16, DType::F32),
];
/// Shapes beside the networks': grouped, depthwise, dilated and asymmetric
/// convolutions, odd extents, a skinny and a batched product.
const CONV_SHAPES: [&str; 4] = [
    "n=1,c=32,h=112,w=112,k=32,r=3,s=3,stride=1,pad=1,groups=32",
    "n=1,c=64,h=28,w=28,k=128,r=3,s=3,stride=1,pad=2,dilation=2",
    "n=2,c=24,h=35,w=35,k=48,r=5,s=5,stride_h=2,stride_w=1,pad_h=2,pad_w=1,pad_bottom=1",
    "n=1,c=128,h=14,w=14,k=256,r=3,s=3,stride=2,pad=1,groups=4",
];
const MATMUL_SHAPES: [&str; 4] = ["333,777,555", "16,4096,4096", "128,768,3072", "8,64,96"];
const BATCH_MATMUL_SHAPES: [&str; 3] = ["12,128,128,64", "8,197,64,197", "4,333,64,50"];

/// The tasks, in a fixed order: resnet's convolutions and the shapes above in every conv
/// type and layout,
/// bert-base's matmuls and the shapes above in every matmul type, the batched products
/// likewise; every other task with a bias and ReLU.
fn tasks() -> Result<Vec<Task>> {
    let mut base: Vec<(Task, bool)> = Vec::new();
    for w in network("resnet", 1)? {
        base.push((w.task, true));
    }
    for shape in CONV_SHAPES {
        base.push((
            Task::new(parse_shape("conv2d", shape)?, Epilogue::default())?,
            true,
        ));
    }
    for w in network("bert-base", 1)? {
        base.push((w.task, false));
    }
    for shape in MATMUL_SHAPES {
        base.push((
            Task::new(parse_shape("matmul", shape)?, Epilogue::default())?,
            false,
        ));
    }
    for shape in BATCH_MATMUL_SHAPES {
        let op = parse_shape("batch_matmul", shape)?;
        base.push((Task::new(op, Epilogue::default())?, false));
    }
    let mut out = Vec::new();
    for (i, (task, conv)) in base.into_iter().enumerate() {
        let epilogue = Epilogue {
            bias: i % 2 == 1,
            relu: i % 2 == 1,
        };
        let task = Task { epilogue, ..task };
        let types: Vec<(DType, DType, Layout)> = if conv {
            CONV_TYPES.to_vec()
        } else {
            MATMUL_TYPES
                .iter()
                .map(|&(i, o)| (i, o, Layout::Nchw))
                .collect()
        };
        for (dtype, out_dtype, layout) in types {
            let typed = TypeArgs {
                dtype,
                out_dtype,
                layout,
            }
            .apply(task)
            .with_context(|| format!("{} as {dtype:?}/{out_dtype:?}", task.key()))?;
            out.push(typed);
        }
    }
    Ok(out)
}

pub fn run(args: Args) -> Result<()> {
    let gpu = GpuSpec::h100();
    let tasks = tasks()?;
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut out = BufWriter::new(file);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for (t, task) in tasks.iter().enumerate() {
        let c = task.contraction();
        let extractor = FeatureExtractor::new(task, &gpu);
        let space = TaskSpace {
            contraction: &c,
            gpu: &gpu,
            extractor: &extractor,
        };
        // The task an adaptation goes to: the next one of the same types.
        let other = tasks[t + 1..].iter().chain(&tasks[..t]).find(|o| {
            o.dtype == task.dtype
                && o.out_dtype == task.out_dtype
                && o.layout == task.layout
                && o.op.name() == task.op.name()
        });
        let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ t as u64);
        let states =
            Sampler::new(task, &gpu, args.seed.wrapping_add(t as u64)).sample_distinct(args.states);
        let lines: Vec<String> = states
            .par_iter()
            .map(|s| describe(task, s, &gpu, &space, other))
            .collect();
        for (s, line) in states.iter().zip(lines) {
            let mutant = search::mutate::mutate(s, &c, &gpu, &mut rng).map(|m| m.id());
            writeln!(out, "{line}\tmutant={}", mutant.unwrap_or_default())?;
            let key = format!(
                "{} {:?}->{:?} {:?} {}",
                task.op.name(),
                task.dtype,
                task.out_dtype,
                task.layout,
                s.sketch().name()
            );
            *counts.entry(key).or_default() += 1;
            total += 1;
        }
    }
    out.flush()?;
    for (key, n) in &counts {
        eprintln!("{n:>7}  {key}");
    }
    eprintln!(
        "{total} states over {} tasks in {}",
        tasks.len(),
        args.out.display()
    );
    Ok(())
}

/// One state's line but its mutant (drawn in order, after the parallel part).
fn describe(
    task: &Task,
    s: &State,
    gpu: &GpuSpec,
    space: &TaskSpace,
    other: Option<&Task>,
) -> String {
    let state = serde_json::to_string(s).expect("a state serializes");
    let (source, launch) = match generate(task, s, gpu) {
        Ok(k) => (
            source_hash(&k.source),
            serde_json::to_string(&k.launch).expect("a launch serializes"),
        ),
        Err(e) => (format!("invalid: {e}"), String::new()),
    };
    let bits: String = space
        .extractor
        .extract(s)
        .iter()
        .map(|f| format!("{:08x}", f.to_bits()))
        .collect();
    let mut neighbours: Vec<String> = search::dgd::neighbours(s, space)
        .iter()
        .map(State::id)
        .collect();
    neighbours.sort();
    let adapted = match other.map(|o| adapt(s, o, gpu)) {
        Some(Ok(a)) => a.id(),
        Some(Err(e)) => format!("refused: {e}"),
        None => String::new(),
    };
    format!(
        "{}\t{state}\t{source}\t{launch}\tfeatures={}\tneighbours={}\tadapted={adapted}",
        task.key(),
        source_hash(&bits),
        source_hash(&neighbours.join(",")),
    )
}
