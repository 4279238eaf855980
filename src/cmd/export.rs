//! `tilesched export --log FILE --task KEY --format cuda|ptx|cubin --out PATH`: the best
//! kernel of a task, regenerated from its recorded state (generation is deterministic),
//! as CUDA source, PTX or a cubin for the architecture it was measured on, with its
//! launch configuration in `PATH.json` (and, for source, in a comment too). A split-K
//! kernel adds into its output: the launch configuration says so (`zero_output`), and
//! the caller must zero the output before every launch; one that splits through
//! scratch takes a workspace after its buffers (`workspace_bytes`), zeroed once; a
//! `wgmma` kernel takes its TMA tensor maps after that (`tensor_maps`). When the fastest record's
//! kernel cannot be regenerated, the next fastest correct one is exported (with a
//! warning naming why), so one bad record never costs a task its kernel. The log is
//! streamed: memory holds the task's fastest records (`records::KEEP`), not the log.

use anyhow::{Context, Result};
use records::{KEEP, Summarizer, best_regenerated, read_summary};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(clap::ValueEnum, Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Format {
    Cuda,
    Ptx,
    Cubin,
}

#[derive(clap::Args)]
pub struct Args {
    /// Tuning log to read.
    #[arg(long)]
    log: PathBuf,
    /// Task key.
    #[arg(long)]
    task: String,
    /// What to write.
    #[arg(long, value_enum)]
    format: Format,
    /// Output file; the launch configuration goes to the same path plus `.json`.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Serialize)]
struct Sidecar<'a> {
    task: &'a str,
    /// The task itself (operator, shape, epilogue, types, layout): what the kernel's
    /// parameters are, for a launcher such as the PyTorch peer.
    shape: &'a schedule::Task,
    kernel: &'a str,
    format: Format,
    /// Element types of the inputs and of the output, and the conv2d layout.
    dtype: schedule::DType,
    out_dtype: schedule::DType,
    layout: schedule::Layout,
    arch: String,
    grid: [u32; 3],
    block: [u32; 3],
    /// Blocks per cluster; `[1, 1, 1]` launches without clusters.
    cluster: [u32; 3],
    dynamic_shared_bytes: u32,
    /// Zero the output before every launch (split-K: the kernel adds into it).
    zero_output: bool,
    /// Bytes of scratch the kernel takes after its buffers (split-K through partial
    /// sums), this kernel's alone: zeroed once before its first launch, left zeroed by
    /// every launch.
    workspace_bytes: u64,
    /// The TMA tensor maps it takes after that (`cuTensorMapEncodeTiled` arguments
    /// per buffer), in parameter order.
    tensor_maps: &'a [schedule::TensorMapArg],
    median_us: Option<f64>,
    device: &'a str,
    state: &'a schedule::State,
    tool_version: &'a str,
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

pub fn run(args: Args) -> Result<()> {
    let only = Summarizer::only(std::slice::from_ref(&args.task)).keeping(KEEP);
    let log = read_summary(&args.log, only)?;
    if let Some(w) = log.warning(&args.log) {
        eprintln!("{w}");
    }
    let best = best_regenerated(&log.tasks[0], &args.log)?;
    for error in &best.passed_over {
        eprintln!("warning: passed over a faster record: {error}");
    }
    if let Some(stale) = &best.stale {
        eprintln!("warning: {stale}");
    }
    match args.format {
        Format::Cuda => write(&args.out, best.kernel.source.as_bytes())?,
        Format::Ptx => write(&args.out, best.ptx()?.as_bytes())?,
        Format::Cubin => write(&args.out, &best.compile()?.cubin)?,
    }
    let (kernel, record) = (&best.kernel, best.record);
    let sidecar = Sidecar {
        task: &args.task,
        shape: &record.shape,
        kernel: &kernel.name,
        format: args.format,
        dtype: record.shape.dtype,
        out_dtype: record.shape.out_dtype,
        layout: record.shape.layout,
        arch: best.target_arch(),
        grid: kernel.launch.grid.as_array(),
        block: [kernel.launch.block, 1, 1],
        cluster: kernel.launch.cluster.as_array(),
        dynamic_shared_bytes: kernel.launch.dynamic_shared_bytes,
        zero_output: kernel.launch.zero_output,
        workspace_bytes: kernel.launch.workspace_bytes,
        tensor_maps: &kernel.launch.tensor_maps,
        median_us: record.median_us(),
        device: &record.device.name,
        state: &record.state,
        tool_version: records::kernel::TOOL_VERSION,
    };
    let mut json_path = args.out.clone().into_os_string();
    json_path.push(".json");
    let json_path = PathBuf::from(json_path);
    write(
        &json_path,
        serde_json::to_string_pretty(&sidecar)?.as_bytes(),
    )?;
    let mut zero = if kernel.launch.zero_output {
        "; zero the output before every launch".to_string()
    } else {
        String::new()
    };
    if kernel.launch.workspace_bytes > 0 {
        zero += &format!(
            "; pass a workspace of {} B, zeroed once, after the buffers",
            kernel.launch.workspace_bytes
        );
    }
    println!(
        "{}: wrote {} and {} (grid {}, block {}, {} B dynamic shared memory{zero}; {:.2} µs on {})",
        args.task,
        args.out.display(),
        json_path.display(),
        kernel.launch.grid,
        kernel.launch.block,
        kernel.launch.dynamic_shared_bytes,
        record.median_us().unwrap_or(f64::NAN),
        record.device.name
    );
    Ok(())
}
