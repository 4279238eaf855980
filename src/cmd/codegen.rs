//! `tilesched codegen <op> --shape SPEC [--sample N] [--seed S] --out DIR
//! [--compile sm_90]`: writes N distinct sampled states as `.cu` files and a
//! `manifest.json` (state, launch configuration, and with `--compile` the compile result,
//! registers, stack frame, spills and shared memory of each kernel).

use crate::cmd::tasks::TypeArgs;
use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use schedule::{
    Epilogue, GeneratedKernel, GpuSpec, OPERATORS, Sampler, State, Task, generate, parse_shape,
};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Operator: conv2d, matmul or batch_matmul.
    op: String,
    /// Shape: N,C,H,W,K,R,S,stride,pad (or key=value) for conv2d, M,N,K for matmul,
    /// B,M,N,K for batch_matmul.
    #[arg(long)]
    shape: String,
    /// Number of distinct states to sample.
    #[arg(long, default_value_t = 1)]
    sample: usize,
    /// Seed of the sampler: the same seed gives the same states.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output directory (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Also compile each kernel with NVRTC for this architecture, e.g. sm_90.
    #[arg(long, value_name = "ARCH")]
    compile: Option<String>,
    /// GPU whose limits states are validated against (h100, h200).
    #[arg(long, default_value = "h100")]
    gpu: String,
    /// Fuse a bias add into the epilogue.
    #[arg(long)]
    bias: bool,
    /// Fuse a ReLU into the epilogue.
    #[arg(long)]
    relu: bool,
    #[command(flatten)]
    types: TypeArgs,
}

#[derive(Serialize)]
struct Manifest<'a> {
    tool_version: &'static str,
    task_key: String,
    task: &'a Task,
    gpu: &'a str,
    seed: u64,
    requested: usize,
    kernels: Vec<Entry<'a>>,
}

#[derive(Serialize)]
struct Entry<'a> {
    file: String,
    kernel: &'a str,
    state_id: String,
    state: &'a State,
    launch: schedule::LaunchConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    compile: Option<CompileRecord>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum CompileRecord {
    Ok {
        ok: bool,
        arch: String,
        #[serde(flatten)]
        resources: gpu::Resources,
        compile_ms: f64,
    },
    Failed {
        ok: bool,
        arch: String,
        error: String,
    },
}

pub fn run(args: Args) -> Result<()> {
    if !OPERATORS.contains(&args.op.as_str()) {
        bail!(
            "unknown operator '{}' (expected {})",
            args.op,
            OPERATORS.join(", ")
        );
    }
    crate::cmd::tasks::check_sample(args.sample)?;
    if let Some(arch) = &args.compile {
        gpu::compile::check_arch(arch)?;
    }
    let gpu = GpuSpec::builtin(&args.gpu)
        .with_context(|| format!("unknown GPU '{}' (expected h100 or h200)", args.gpu))?;
    let op = parse_shape(&args.op, &args.shape)?;
    let task = args.types.apply(Task::new(
        op,
        Epilogue {
            bias: args.bias,
            relu: args.relu,
        },
    )?)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create output directory {}", args.out.display()))?;

    let states = Sampler::new(&task, &gpu, args.seed).sample_distinct(args.sample);
    if states.len() < args.sample {
        eprintln!(
            "warning: only {} distinct valid states of {} exist or were found",
            states.len(),
            task.key()
        );
    }
    let kernels: Vec<GeneratedKernel> = states
        .iter()
        .map(|s| generate(&task, s, &gpu))
        .collect::<Result<_, _>>()
        .context("a sampled state failed validation")?;

    let compiled: Option<Vec<CompileRecord>> = args.compile.as_ref().map(|arch| {
        kernels
            .par_iter()
            .map(
                |k| match gpu::compile(&k.source, &k.name, &k.launch.target.arch(arch)) {
                    Ok(c) => CompileRecord::Ok {
                        ok: true,
                        arch: k.launch.target.arch(arch),
                        resources: c.resources,
                        compile_ms: (c.compile_ms * 10.0).round() / 10.0,
                    },
                    Err(e) => CompileRecord::Failed {
                        ok: false,
                        arch: arch.clone(),
                        error: e.to_string(),
                    },
                },
            )
            .collect()
    });
    if let Some(records) = &compiled {
        // When nothing compiles (no NVRTC, an architecture NVRTC does not know), say so
        // once and fail, rather than N times in the manifest.
        if let Some(CompileRecord::Failed { error, .. }) = records.first()
            && records
                .iter()
                .all(|r| matches!(r, CompileRecord::Failed { .. }))
        {
            bail!("no kernel compiled: {}", error.lines().next().unwrap_or(""));
        }
    }
    let mut entries = Vec::new();
    let mut compile_iter = compiled.into_iter().flatten();
    for (i, (state, kernel)) in states.iter().zip(&kernels).enumerate() {
        let file = format!("{i:03}_{}.cu", state.id());
        write(&args.out.join(&file), &kernel.source)?;
        entries.push(Entry {
            file,
            kernel: &kernel.name,
            state_id: state.id(),
            state,
            launch: kernel.launch.clone(),
            compile: compile_iter.next(),
        });
    }
    let summary = summarize(&entries);
    let manifest = Manifest {
        tool_version: env!("CARGO_PKG_VERSION"),
        task_key: task.key(),
        task: &task,
        gpu: &gpu.name,
        seed: args.seed,
        requested: args.sample,
        kernels: entries,
    };
    let json = serde_json::to_string_pretty(&manifest)?;
    write(&args.out.join("manifest.json"), &json)?;
    println!(
        "{}: wrote {} kernels and manifest.json to {}",
        task.key(),
        kernels.len(),
        args.out.display()
    );
    match summary {
        Some(s) => {
            println!("{}", s.detail);
            for failure in &s.failures {
                println!("failed: {failure}");
            }
            println!("compiled {}/{}", s.ok, kernels.len());
        }
        None => println!("generated {}/{}", kernels.len(), args.sample),
    }
    Ok(())
}

struct Summary {
    ok: usize,
    detail: String,
    failures: Vec<String>,
}

fn summarize(entries: &[Entry]) -> Option<Summary> {
    let records: Vec<(&Entry, &CompileRecord)> = entries
        .iter()
        .filter_map(|e| e.compile.as_ref().map(|c| (e, c)))
        .collect();
    if records.is_empty() {
        return None;
    }
    let mut ok = 0;
    let mut with_stack = 0;
    let (mut min_regs, mut max_regs, mut max_ms) = (u32::MAX, 0, 0.0f64);
    let mut failures = Vec::new();
    for (entry, record) in records {
        match record {
            CompileRecord::Ok {
                resources,
                compile_ms,
                ..
            } => {
                ok += 1;
                min_regs = min_regs.min(resources.registers);
                max_regs = max_regs.max(resources.registers);
                max_ms = max_ms.max(*compile_ms);
                if resources.stack_frame_bytes > 0 {
                    with_stack += 1;
                }
            }
            CompileRecord::Failed { error, .. } => failures.push(format!(
                "{}: {}",
                entry.file,
                error.lines().next().unwrap_or("")
            )),
        }
    }
    let detail = if ok > 0 {
        format!(
            "registers {min_regs}..{max_regs}, {with_stack} with a stack frame, slowest compile {max_ms:.0} ms"
        )
    } else {
        "no kernel compiled".to_string()
    };
    Some(Summary {
        ok,
        detail,
        failures,
    })
}

/// Writes a file whole: to a temporary name first, then renamed into place, so that an
/// interrupted run never leaves a truncated file.
fn write(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
