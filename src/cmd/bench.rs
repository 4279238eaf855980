//! `tilesched bench <op> (--network NAME | --shape SPEC) --log FILE [--out DIR]`: the
//! best kernel of each task from a tuning log against cuDNN (conv2d) or cuBLAS (matmul)
//! side by side on this GPU; prints the table and writes `DIR/bench.json`,
//! `DIR/bench.md` and the plots. `--peer torch` then runs the PyTorch peer
//! (`benchmarks/peer/torch_peer.py`, built into the binary) on the same kernels, from a
//! deploy cache written to `DIR/peer-kernels`, into `DIR/peer`, and sets both side by
//! side per task in `DIR/strongest.md` (ours against the faster baseline).

use crate::cmd::peer;
use crate::cmd::tasks::{TaskArgs, TypeArgs, resolve};
use anyhow::{Context as _, Result, bail};
use benchmarks::baseline::{self, Choices};
use benchmarks::curves::network_curve;
use benchmarks::peaks;
use benchmarks::plot;
use benchmarks::report::{Measured, Protocol, Report, Row, Summary, layout_name};
use benchmarks::run::{BenchError, Options, OurKernel, Session};
use gpu::TimingConfig;
use gpu::{DeviceInfo, Problem};
use rayon::prelude::*;
use records::{BestKernel, Record, now, read_log, summarize};
use schedule::{Epilogue, reference::reference_kernel};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Operator: conv2d (against cuDNN), matmul or batch_matmul (against cuBLAS).
    op: String,
    #[command(flatten)]
    tasks: TaskArgs,
    #[command(flatten)]
    types: TypeArgs,
    /// Network batch size.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Tuning log whose best kernels are compared.
    #[arg(long)]
    log: PathBuf,
    /// Where bench.json, bench.md and the plots go (default: bench-<op>-<network>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory holding libcudnn.so.9 and its sub-libraries (default: the newest copy
    /// found on the loader's path, in the site-packages of each python3 on PATH, or
    /// under /opt, /usr/local, /usr/lib and ~/.local).
    #[arg(long)]
    cudnn: Option<PathBuf>,
    /// Directory holding libcublas.so.13 and libcublasLt.so.13 (default: the newest
    /// copy found, searched like --cudnn).
    #[arg(long)]
    cublas: Option<PathBuf>,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Alternating rounds per task (ours, vendor, vendor, ours, ...).
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Timed milliseconds per side and task, over all rounds.
    #[arg(long, default_value_t = 200.0)]
    min_time_ms: f64,
    /// Timed launches per side and task at least, over all rounds.
    #[arg(long, default_value_t = 40)]
    min_repeats: u32,
    /// cuDNN graph-API engine configurations (heuristics A, B, fallback) timed by our
    /// protocol per task.
    #[arg(long, default_value_t = Choices::default().engines)]
    engines: usize,
    /// Legacy cuDNN algorithms (in the order of cuDNN's own benchmark) timed by our
    /// protocol per handle.
    #[arg(long, default_value_t = Choices::default().algorithms)]
    algorithms: usize,
    /// Legacy cuDNN handles, each with its own find (0: the graph API alone).
    #[arg(long, default_value_t = Choices::default().handles)]
    handles: usize,
    /// cuBLASLt heuristic algorithms timed by our protocol per matmul.
    #[arg(long, default_value_t = Choices::default().lt_algorithms)]
    lt_algorithms: usize,
    /// cuBLASLt heuristic algorithms timed by our protocol per 1×1 convolution that is
    /// one GEMM, beside the plain cuBLAS call (0: convolutions get cuDNN alone).
    #[arg(long, default_value_t = Choices::default().conv_gemm_algorithms)]
    conv_gemm_algorithms: usize,
    /// Also time the same kernels beside PyTorch eager and torch.compile, in a python3
    /// with torch (writes DIR/peer/peer.json and peer.md).
    #[arg(long, value_enum)]
    peer: Option<peer::Peer>,
    /// One more argument for the peer script (repeatable), e.g. `--peer-arg=--no-compile`
    /// or `--peer-arg=--rounds=2`.
    #[arg(long = "peer-arg", allow_hyphen_values = true)]
    peer_args: Vec<String>,
    /// Seed of the input values.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A task with its best log record and the kernels built for it.
struct Prepared {
    count: u32,
    task: schedule::Task,
    best: Option<Record>,
    trials: usize,
    reference: OurKernel,
    ours: Option<OurKernel>,
    problem: Option<String>,
}

/// The reference kernel of `task` and, from its best record, our kernel (or why there
/// is none), both for `device`.
fn build(
    task: &schedule::Task,
    best: Option<&Record>,
    device: &DeviceInfo,
) -> Result<(OurKernel, Option<OurKernel>, Option<String>)> {
    let kernel = reference_kernel(task);
    let cubin = gpu::compile(&kernel.source, &kernel.name, &device.arch())
        .with_context(|| format!("the reference kernel of {} does not compile", task.key()))?
        .cubin;
    let reference = OurKernel {
        cubin,
        name: kernel.name,
        launch: kernel.launch,
    };
    let Some(best) = best else {
        return Ok((
            reference,
            None,
            Some("no correct kernel in the log".to_string()),
        ));
    };
    let ours = BestKernel::regenerate(best).and_then(|k| {
        if let Some(stale) = &k.stale {
            eprintln!("warning: {}: {stale}", best.task);
        }
        k.runs_on(device)?;
        let compiled = k.compile()?;
        Ok(OurKernel {
            cubin: compiled.cubin,
            name: k.kernel.name,
            launch: k.kernel.launch,
        })
    });
    Ok(match ours {
        Ok(ours) => (reference, Some(ours), None),
        Err(e) => (
            reference,
            None,
            Some(format!("the best state does not build: {e}")),
        ),
    })
}

/// "cuDNN" or "cuBLAS" from the vendor description.
fn vendor_name(description: &str) -> &str {
    description.split_whitespace().next().unwrap_or("vendor")
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

pub fn run(args: Args) -> Result<()> {
    let (workloads, name) = resolve(
        &args.op,
        &args.tasks,
        args.batch,
        Epilogue::default(),
        &args.types,
    )?;
    if args.rounds == 0 || args.min_time_ms.is_nan() || args.min_time_ms < 0.0 {
        bail!("--rounds must be at least 1 and --min-time-ms not negative");
    }
    if args.peer == Some(peer::Peer::Torch) {
        peer::check_torch()?;
    }
    let log = read_log(&args.log)?;
    if let Some(w) = log.warning(&args.log) {
        eprintln!("{w}");
    }
    let keys: Vec<String> = workloads.iter().map(|w| w.task.key()).collect();
    let summaries = summarize(&log.records, &keys);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-{name}")));

    let options = Options {
        device: args.device,
        timing: TimingConfig {
            warmup: 3,
            min_time_ms: args.min_time_ms,
            min_repeats: args.min_repeats,
            max_repeats: 20_000,
            race_us: None,
            precision: None,
        },
        rounds: args.rounds,
        cudnn: args.cudnn.clone(),
        cublas: args.cublas.clone(),
        choices: Choices {
            engines: args.engines,
            algorithms: args.algorithms,
            handles: args.handles,
            lt_algorithms: args.lt_algorithms,
            conv_gemm_algorithms: args.conv_gemm_algorithms,
        },
        seed: args.seed,
    };
    let mut session = Session::new(options.clone())?;
    let device = session.device.clone();
    let first = workloads[0].task;
    session.load_vendor(&first.op)?;
    let library = baseline::library_for(&first.op);
    let vendor = baseline::description(library, &first, options.choices);
    let vendor_library = baseline::library(library);
    eprintln!(
        "{} ({} SMs); baseline {vendor}",
        device.name, device.sm_count
    );
    if let Some(other) = log
        .records
        .iter()
        .find(|r| r.device.name != device.name)
        .map(|r| r.device.name.clone())
    {
        eprintln!(
            "warning: the log was measured on {other}; this GPU is {}",
            device.name
        );
    }

    let prepared: Vec<Prepared> = workloads
        .par_iter()
        .zip(summaries.par_iter())
        .map(|(w, s)| {
            let best = s.best().cloned();
            let (reference, ours, problem) = build(&w.task, best.as_ref(), &device)?;
            Ok(Prepared {
                count: w.count,
                task: w.task,
                best,
                trials: s.trials,
                reference,
                ours,
                problem,
            })
        })
        .collect::<Result<_>>()?;

    let mut peaks = session.peaks()?;
    peaks.tensor = peaks::measure_tensor(session.context(), &device, &options.timing, first.dtype)?;
    peaks.wgmma = peaks::measure_wgmma(session.context(), &device, &options.timing, first.dtype)?;
    let tensor = |peak: &Option<peaks::TensorPeak>, what: &str| {
        peak.as_ref().map_or(String::new(), |t| {
            format!(", {:.1} TFLOP/s {} {what}", t.tflops, t.dtype)
        })
    };
    eprintln!(
        "peaks: {:.1} TFLOP/s float32 FMA{}{}, {:.0} GB/s copy",
        peaks.fp32_tflops,
        tensor(&peaks.tensor, "mma.sync"),
        tensor(&peaks.wgmma, "wgmma"),
        peaks.bandwidth_gbs
    );
    let mut rows = Vec::new();
    let bar = indicatif::ProgressBar::new(prepared.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} tasks {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let started = std::time::Instant::now();
    for p in &prepared {
        bar.set_message(p.task.key());
        let prob = Problem::for_task(&p.task, options.seed);
        let base = Measured {
            task: p.task.key(),
            count: p.count,
            dtype: p.task.dtype,
            out_dtype: p.task.out_dtype,
            layout: layout_name(&p.task),
            flops: p.task.flops(),
            min_bytes: prob.bytes(),
            state_id: p.best.as_ref().map(|b| b.state.id()),
            sketch: p.best.as_ref().map(|b| b.state.sketch().name().to_string()),
            tuned_us: p.best.as_ref().and_then(Record::median_us),
            trials: p.trials,
            ours: None,
            vendor: None,
            vendor_algorithm: None,
            vendor_tensor_cores: None,
            vendor_times_epilogue: None,
            vendor_timed: 0,
            vendor_candidates: Vec::new(),
            vendor_max_abs_error: None,
            problem: p.problem.clone(),
        };
        let measured = match session.task(&p.task, &prob, &p.reference, p.ours.as_ref()) {
            Ok(times) => times.into_measured(base),
            // A vendor routine that cannot run this shape is a row's problem, not the run's.
            Err(BenchError::Vendor(e)) => Measured {
                problem: Some(format!("vendor: {e}")),
                ..base
            },
            Err(e) => return Err(e.into()),
        };
        let row = Row::new(measured, &peaks);
        let line = format!(
            "{}: ours {} µs, vendor {} µs{} ({} vendor alternatives timed){}",
            row.measured.task,
            row.measured
                .ours
                .map_or("-".to_string(), |s| format!("{:.2}", s.median_us)),
            row.measured
                .vendor
                .map_or("-".to_string(), |s| format!("{:.2}", s.median_us)),
            row.speedup.map_or(String::new(), |s| format!(" ({s:.2}x)")),
            row.measured.vendor_timed,
            if row.flags.is_empty() {
                String::new()
            } else {
                format!(" [flagged: {}]", row.flags.join("; "))
            }
        );
        // One line per task whether or not stderr shows the bar.
        bar.suspend(|| eprintln!("{line}"));
        bar.inc(1);
        rows.push(row);
    }
    bar.finish_and_clear();
    eprintln!(
        "benched {} tasks in {:.1} s",
        prepared.len(),
        started.elapsed().as_secs_f64()
    );
    let round = options.round_timing();
    let report = Report {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        date: now(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        device,
        vendor,
        vendor_library,
        log: args.log.display().to_string(),
        peaks,
        protocol: Protocol {
            rounds: options.rounds,
            min_time_ms_per_round: round.min_time_ms,
            min_repeats_per_round: round.min_repeats,
            l2_rotation: true,
        },
        summary: Summary::of(&rows),
        rows,
    };
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let markdown = report.to_markdown();
    write(&out.join("bench.json"), &report.to_json())?;
    write(&out.join("bench.md"), &markdown)?;
    print!("{markdown}");
    let bars: Vec<(String, f64)> = report
        .rows
        .iter()
        .map(|r| (r.measured.task.clone(), r.speedup.unwrap_or(f64::NAN)))
        .collect();
    let title = format!(
        "{name}: speedup over {} on {}",
        vendor_name(&report.vendor),
        report.device.name
    );
    plot::speedup_bars(&out.join("speedup.png"), &title, &bars)?;
    let curve = network_curve(&log.records, &workloads);
    let title = format!(
        "{name}: tuning (sum of count × best µs), {}",
        report.device.name
    );
    let label = args
        .log
        .file_name()
        .map_or_else(|| "log".to_string(), |n| n.to_string_lossy().into_owned());
    let plotted = plot::tuning_curves(&out.join("tuning.png"), &title, &[(label, curve)]);
    match plotted {
        Ok(()) => eprintln!(
            "wrote {0}/bench.json, bench.md, speedup.png and tuning.png",
            out.display()
        ),
        // A log with a task that never succeeded has no network curve; the rest stands.
        Err(e @ plot::PlotError::NoData { .. }) => {
            eprintln!(
                "wrote {}/bench.json, bench.md and speedup.png; no tuning curve: {e}",
                out.display()
            )
        }
        Err(e) => return Err(e.into()),
    }
    if args.peer == Some(peer::Peer::Torch) {
        let kernels = out.join("peer-kernels");
        let ours = prepared.iter().filter_map(|p| {
            let us = p.best.as_ref()?.median_us()?;
            Some((p.task, p.count, p.ours.as_ref()?, us))
        });
        let counts = peer::write_cache(&kernels, ours, &report.device)?;
        peer::run(&kernels, &counts, &out.join("peer"), &args.peer_args)?;
        peer::strongest(&kernels, &out)?;
    }
    let problems = report
        .rows
        .iter()
        .filter(|r| r.measured.problem.is_some())
        .count();
    if problems > 0 {
        bail!("{problems} task(s) could not be compared (see Problems in bench.md)");
    }
    Ok(())
}
