//! Building candidates: CUDA C from each state, compiled with NVRTC for the device's
//! architecture (one candidate per call, on the caller's build threads), through the
//! disk cache of cubins when one is given (`gpu::CubinCache`: a kernel compiled by any
//! earlier run is read back, not compiled again), cubins written where the worker reads
//! them. A candidate that does not compile, or whose lowering panics (an assert of the
//! lowering is a bug, but a bug of one candidate), is a result (`compile`), never an
//! abort: the round, and the rounds in flight, go on and are logged.

use crate::inject::{self, Fault};
use gpu::{CompiledKernel, CubinCache, ErrorKind, KernelImage, Origin};
use records::{CompileInfo, source_hash};
use schedule::reference::reference_kernel;
use schedule::{GeneratedKernel, GpuSpec, InvalidState, State, Task, generate};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Once;
use thiserror::Error;

/// Why a candidate (or a task's reference kernel) was not built. For a candidate it is
/// data: its message becomes the record's `compile` error.
#[derive(Debug, Error)]
pub enum BuildError {
    #[error("invalid state: {0}")]
    InvalidState(#[from] InvalidState),
    #[error(transparent)]
    Compile(#[from] gpu::CompileError),
    #[error("the reference kernel of {task} does not compile: {error}")]
    Reference {
        task: String,
        error: gpu::CompileError,
    },
    #[error("generating or compiling it panicked: {0}")]
    Panicked(String),
    #[error("cannot write {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// A candidate ready to measure, or why it is not.
#[derive(Debug)]
pub struct Candidate {
    pub state: State,
    pub injected: Option<ErrorKind>,
    /// `records::source_hash` of the generated source (None when generation failed).
    pub source_hash: Option<String>,
    pub build: Result<(KernelImage, CompileInfo), BuildError>,
    /// Whether the cubin came from the cache (None when nothing was compiled).
    pub origin: Option<Origin>,
}

/// Compiles through `cache` when there is one.
fn compile(
    source: &str,
    name: &str,
    arch: &str,
    cache: Option<&CubinCache>,
) -> Result<(CompiledKernel, Origin), gpu::CompileError> {
    match cache {
        Some(cache) => cache.compile(source, name, arch),
        None => gpu::compile(source, name, arch).map(|k| (k, Origin::Compiled)),
    }
}

/// Where the cubins of `task` are written.
fn task_dir(dir: &Path, task: &Task) -> PathBuf {
    dir.join(task.key())
}

fn write_cubin(path: &Path, cubin: &[u8]) -> Result<(), BuildError> {
    let error = |path: &Path| {
        let path = path.to_path_buf();
        move |error| BuildError::Write { path, error }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(error(parent))?;
    }
    std::fs::write(path, cubin).map_err(error(path))
}

/// Generates one state (with a fault built in when asked).
fn generate_one(
    task: &Task,
    state: &State,
    injected: Option<Fault>,
    gpu: &GpuSpec,
) -> Result<GeneratedKernel, BuildError> {
    Ok(match injected {
        Some(kind) => inject::faulty_kernel(kind, task, state, gpu),
        None => generate(task, state, gpu),
    }?)
}

/// Compiles one generated kernel for its target on a GPU of architecture `arch`, and
/// writes its cubin.
fn build_one(
    task: &Task,
    state: &State,
    kernel: GeneratedKernel,
    arch: &str,
    dir: &Path,
    cache: Option<&CubinCache>,
) -> Result<(KernelImage, CompileInfo, Origin), BuildError> {
    let arch = kernel.launch.target.arch(arch);
    let (compiled, origin) = compile(&kernel.source, &kernel.name, &arch, cache)?;
    let path = task_dir(dir, task).join(format!("{}.cubin", state.id()));
    write_cubin(&path, &compiled.cubin)?;
    let r = compiled.resources;
    let info = CompileInfo {
        arch,
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
    Ok((image, info, origin))
}

/// Builds one state (with the fault `injected` built in, if any).
pub fn build_candidate(
    task: &Task,
    state: State,
    injected: Option<Fault>,
    gpu: &GpuSpec,
    arch: &str,
    dir: &Path,
    cache: Option<&CubinCache>,
) -> Candidate {
    let (source_hash, built) = unpanicked(|| {
        let kernel = generate_one(task, &state, injected, gpu);
        let source_hash = kernel.as_ref().ok().map(|k| source_hash(&k.source));
        (
            source_hash,
            kernel.and_then(|k| build_one(task, &state, k, arch, dir, cache)),
        )
    })
    .unwrap_or_else(|e| (None, Err(e)));
    let origin = built.as_ref().ok().map(|b| b.2);
    Candidate {
        state,
        injected: injected.map(Fault::kind),
        source_hash,
        build: built.map(|(image, info, _)| (image, info)),
        origin,
    }
}

thread_local! {
    /// Set while this thread builds a candidate, whose panic is then its failure, its
    /// message recorded: the panic hook does not print it.
    static BUILDING: Cell<bool> = const { Cell::new(false) };
}

/// Wraps the panic hook once, so that it says nothing of a panic while `BUILDING`.
static QUIET_WHILE_BUILDING: Once = Once::new();

/// `f`'s result, or its panic as `BuildError::Panicked` with the panic's message.
fn unpanicked<T>(f: impl FnOnce() -> T) -> Result<T, BuildError> {
    QUIET_WHILE_BUILDING.call_once(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !BUILDING.with(Cell::get) {
                hook(info)
            }
        }));
    });
    BUILDING.with(|b| b.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    BUILDING.with(|b| b.set(false));
    result.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        BuildError::Panicked(message.lines().next().unwrap_or("").to_string())
    })
}

/// Builds the reference kernel of `task`.
pub fn build_reference(
    task: &Task,
    arch: &str,
    dir: &Path,
    cache: Option<&CubinCache>,
) -> Result<KernelImage, BuildError> {
    let kernel = reference_kernel(task);
    let (compiled, _) = compile(&kernel.source, &kernel.name, arch, cache).map_err(|error| {
        BuildError::Reference {
            task: task.key(),
            error,
        }
    })?;
    let path = task_dir(dir, task).join("reference.cubin");
    write_cubin(&path, &compiled.cubin)?;
    Ok(KernelImage {
        cubin: path,
        name: kernel.name,
        launch: kernel.launch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_building_is_the_candidate_s_failure() {
        let e =
            unpanicked(|| -> u32 { panic!("lowering: a tile of 0 rows\nat line 9") }).unwrap_err();
        assert!(matches!(e, BuildError::Panicked(_)));
        assert_eq!(
            e.to_string(),
            "generating or compiling it panicked: lowering: a tile of 0 rows"
        );
        let formatted = unpanicked(|| -> u32 { panic!("{} asserts", 9) }).unwrap_err();
        assert!(formatted.to_string().ends_with("9 asserts"), "{formatted}");
        assert_eq!(unpanicked(|| 7).unwrap(), 7);
    }
}
