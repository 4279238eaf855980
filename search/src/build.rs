//! Building candidates: CUDA C from each state, compiled with NVRTC for the device's
//! architecture on all cores (rayon), cubins written where the worker reads them. A
//! candidate that does not compile is a result (`compile`), never an abort.

use crate::inject;
use crate::record::CompileInfo;
use gpu::{ErrorKind, KernelImage};
use rayon::prelude::*;
use schedule::reference::reference_kernel;
use schedule::{GpuSpec, State, Task, generate};
use std::path::{Path, PathBuf};

/// A candidate ready to measure, or why it is not.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub state: State,
    pub injected: Option<ErrorKind>,
    pub build: Result<(KernelImage, CompileInfo), String>,
}

/// Where the cubins of `task` are written.
fn task_dir(dir: &Path, task: &Task) -> PathBuf {
    dir.join(task.key())
}

fn write_cubin(path: &Path, cubin: &[u8]) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(path, cubin).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Generates and compiles one state (with a fault built in when asked).
fn build_one(
    task: &Task,
    state: &State,
    injected: Option<ErrorKind>,
    gpu: &GpuSpec,
    arch: &str,
    dir: &Path,
) -> Result<(KernelImage, CompileInfo), String> {
    let kernel = match injected {
        Some(kind) => inject::faulty_kernel(kind, task, state, gpu),
        None => generate(task, state, gpu),
    }
    .map_err(|e| format!("invalid state: {e}"))?;
    let compiled = gpu::compile(&kernel.source, &kernel.name, arch).map_err(|e| e.to_string())?;
    let path = task_dir(dir, task).join(format!("{}.cubin", state.id()));
    write_cubin(&path, &compiled.cubin)?;
    let r = compiled.resources;
    let info = CompileInfo {
        arch: arch.to_string(),
        registers: r.registers,
        shared_bytes: r.static_shared_bytes + kernel.launch.dynamic_shared_bytes,
        stack_frame_bytes: r.stack_frame_bytes,
        spill_bytes: r.spill_store_bytes,
        compile_ms: (compiled.compile_ms * 10.0).round() / 10.0,
    };
    let image = KernelImage {
        cubin: path,
        name: kernel.name,
        launch: kernel.launch,
    };
    Ok((image, info))
}

/// Builds `states` of `task` in parallel; `injected[i]` is the fault (if any) of state i.
pub fn build(
    task: &Task,
    states: Vec<State>,
    injected: &[Option<ErrorKind>],
    gpu: &GpuSpec,
    arch: &str,
    dir: &Path,
) -> Vec<Candidate> {
    states
        .into_par_iter()
        .enumerate()
        .map(|(i, state)| {
            let fault = injected.get(i).copied().flatten();
            let build = build_one(task, &state, fault, gpu, arch, dir);
            Candidate {
                state,
                injected: fault,
                build,
            }
        })
        .collect()
}

/// Builds the reference kernel of `task`.
pub fn build_reference(task: &Task, arch: &str, dir: &Path) -> Result<KernelImage, String> {
    let kernel = reference_kernel(task);
    let compiled = gpu::compile(&kernel.source, &kernel.name, arch).map_err(|e| {
        format!(
            "the reference kernel of {} does not compile: {e}",
            task.key()
        )
    })?;
    let path = task_dir(dir, task).join("reference.cubin");
    write_cubin(&path, &compiled.cubin)?;
    Ok(KernelImage {
        cubin: path,
        name: kernel.name,
        launch: kernel.launch,
    })
}
