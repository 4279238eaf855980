//! `bench --peer torch`: our kernels timed beside PyTorch by `benchmarks/peer/torch_peer.py`
//! (built into the binary, so that an installed `tilesched` needs no checkout): the
//! kernels go into a deploy cache the script reads, and it runs with the `python3` on
//! PATH, which must import torch and see a GPU (checked first, in one line). Then
//! `benchmarks/peer/strongest.py` sets each task's speedup over bench's vendor beside
//! the one over PyTorch eager and keeps the smaller: our kernels against the strongest
//! baseline a user has (`DIR/strongest.md`).

use anyhow::{Context as _, Result, bail};
use benchmarks::run::OurKernel;
use gpu::DeviceInfo;
use schedule::Task;
use std::path::{Path, PathBuf};

/// A peer framework `--peer` runs our kernels beside.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Torch,
}

/// The PyTorch peer script, run with the python3 on PATH.
const TORCH_PEER: &str = include_str!("../../benchmarks/peer/torch_peer.py");

/// The merge of bench's report and the peer's into the strongest baseline per task.
const STRONGEST: &str = include_str!("../../benchmarks/peer/strongest.py");

/// Fails in one line unless `python3` on PATH imports torch with CUDA.
pub fn check_torch() -> Result<()> {
    let probe = std::process::Command::new("python3")
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match probe {
        Ok(s) if s.success() => Ok(()),
        Ok(s) if s.code() == Some(3) => {
            bail!("--peer torch: the python3 on PATH has torch, but torch sees no CUDA GPU")
        }
        Ok(_) => bail!("--peer torch: the python3 on PATH cannot import torch"),
        Err(e) => bail!("--peer torch: no python3 on PATH ({e})"),
    }
}

/// Our kernels (task, count in the network, kernel, its tuned µs) into a deploy cache at
/// `dir` for the peer, as this GPU's entries (they were built here), and the counts into
/// `dir/counts.json`, whose path is returned.
pub fn write_cache<'a>(
    dir: &Path,
    ours: impl Iterator<Item = (Task, u32, &'a OurKernel, f64)>,
    device: &DeviceInfo,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cache = runtime::DeployCache::open(dir)?;
    let mut counts = serde_json::Map::new();
    for (task, count, kernel, us) in ours {
        cache.store(
            runtime::NewEntry {
                gpu: device.name.clone(),
                compute_capability: device.compute_capability,
                task: task.key(),
                shape: task,
                kernel: kernel.name.clone(),
                launch: kernel.launch.clone(),
                stage1_us: us,
                final_us: us,
                stage: runtime::Stage::Stage1,
                created_by: runtime::TOOL_VERSION.to_string(),
            },
            &kernel.cubin,
        )?;
        counts.insert(task.key(), count.into());
    }
    let counts_path = dir.join("counts.json");
    let text = serde_json::Value::Object(counts).to_string();
    std::fs::write(&counts_path, text)
        .with_context(|| format!("cannot write {}", counts_path.display()))?;
    Ok(counts_path)
}

/// Runs the PyTorch peer on the deploy cache `kernels` into `out`, with `extra` arguments.
pub fn run(kernels: &Path, counts: &Path, out: &Path, extra: &[String]) -> Result<()> {
    let script = kernels.join("torch_peer.py");
    std::fs::write(&script, TORCH_PEER)
        .with_context(|| format!("cannot write {}", script.display()))?;
    eprintln!(
        "peer: PyTorch eager and torch.compile beside our kernels (into {})",
        out.display()
    );
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg("--deploy")
        .arg(kernels)
        .arg("--counts")
        .arg(counts)
        .arg("--out")
        .arg(out)
        .args(extra)
        .status()
        .context("cannot run python3")?;
    if !status.success() {
        bail!("the PyTorch peer failed ({status}); its bench report is written");
    }
    Ok(())
}

/// Writes `out/strongest.{json,md}` from `out/bench.json` and `out/peer/peer.json`:
/// per task the smaller of our speedups over bench's vendor and over PyTorch eager.
pub fn strongest(kernels: &Path, out: &Path) -> Result<()> {
    let script = kernels.join("strongest.py");
    std::fs::write(&script, STRONGEST)
        .with_context(|| format!("cannot write {}", script.display()))?;
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg(out.join("bench.json"))
        .arg(out.join("peer").join("peer.json"))
        .arg("--out")
        .arg(out)
        .status()
        .context("cannot run python3")?;
    if !status.success() {
        bail!("merging the bench and peer reports failed ({status}); both are written");
    }
    Ok(())
}
