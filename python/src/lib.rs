//! `tilesched._native`: the deploy cache's kernels for Python, over the `runtime` crate.
//!
//! The Python package (`python/tilesched/`) defines PyTorch custom operators; this module
//! is the part they cannot write in Python: opening a deploy cache for one GPU (the
//! GPU name, compute capability and cubin checks are `runtime`'s, as in Rust), loading
//! a task's kernel, owning its split-K workspace, and launching it on the device
//! pointers and the stream PyTorch hands over. Every buffer is checked against the
//! kernel's parameters first (count, size, 16-byte alignment); what is wrong comes back
//! as `TileschedError` with one line that says so, never as a launch on a bad buffer.

use gpu::cuda::Buffer;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use runtime::{Param, Role, Runtime, RuntimeError, check_buffers};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

pyo3::create_exception!(
    _native,
    TileschedError,
    PyRuntimeError,
    "A deploy cache or kernel that cannot be used, or buffers a kernel cannot take."
);

fn error(e: RuntimeError) -> PyErr {
    TileschedError::new_err(e.to_string())
}

/// A deploy cache opened for one GPU.
#[pyclass(frozen, module = "tilesched._native")]
pub struct Cache {
    opened: Mutex<Opened>,
    dir: String,
    device: u32,
    gpu: String,
    compute_capability: (u32, u32),
}

/// The runtime and the workspaces of the kernels that take one: one per kernel, zeroed
/// once, kept as long as the cache (every launch leaves its semaphores zeroed).
struct Opened {
    runtime: Runtime,
    workspaces: HashMap<String, Buffer>,
}

#[pymethods]
impl Cache {
    /// Opens the deploy cache in `dir` for GPU `device` (its entries for that GPU's name
    /// and compute capability).
    #[new]
    fn new(dir: PathBuf, device: u32) -> PyResult<Self> {
        let runtime = Runtime::open(&dir, device).map_err(error)?;
        let (gpu, compute_capability) = runtime.gpu();
        let (gpu, compute_capability) = (gpu.to_string(), compute_capability);
        Ok(Cache {
            opened: Mutex::new(Opened {
                runtime,
                workspaces: HashMap::new(),
            }),
            dir: dir.display().to_string(),
            device,
            gpu,
            compute_capability,
        })
    }

    #[getter]
    fn dir(&self) -> &str {
        &self.dir
    }

    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    /// The GPU's name, as tuning recorded it.
    #[getter]
    fn gpu(&self) -> &str {
        &self.gpu
    }

    #[getter]
    fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// The task keys the cache holds for this GPU, sorted.
    fn tasks(&self) -> Vec<String> {
        let opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        opened
            .runtime
            .tasks()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// The kernel of task `key`, loaded (its cubin's sha256 checked) and, where it
    /// takes one, its workspace allocated and zeroed.
    fn kernel(slf: &Bound<'_, Self>, key: &str) -> PyResult<Kernel> {
        let cache = slf.get();
        let mut opened = cache.opened.lock().unwrap_or_else(|e| e.into_inner());
        let Opened {
            runtime,
            workspaces,
        } = &mut *opened;
        let kernel = runtime.kernel(key).map_err(error)?;
        let entry = kernel.entry().clone();
        let (params, workspace) = split_workspace(kernel.params());
        if let Some(workspace) = workspace
            && !workspaces.contains_key(key)
        {
            let buffer = runtime.zeroed(workspace.bytes()).map_err(error)?;
            workspaces.insert(key.to_string(), buffer);
        }
        Ok(Kernel {
            cache: slf.clone().unbind(),
            key: key.to_string(),
            params,
            task: entry
                .shape
                .map(|t| serde_json::to_string(&t).expect("a task serializes"))
                .unwrap_or_default(),
            name: entry.kernel.clone(),
            final_us: entry.final_us,
            workspace_bytes: entry.launch.workspace_bytes,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Cache({:?}, device={}: {} sm_{}{})",
            self.dir, self.device, self.gpu, self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// The parameters the caller passes, and the workspace the cache owns (the last
/// parameter of a kernel that takes one).
fn split_workspace(params: &[Param]) -> (Vec<Param>, Option<Param>) {
    match params.split_last() {
        Some((last, rest)) if last.role == Role::Workspace => (rest.to_vec(), Some(*last)),
        _ => (params.to_vec(), None),
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Input => "input",
        Role::Weight => "weight",
        Role::Bias => "bias",
        Role::Output => "output",
        Role::Workspace => "workspace",
    }
}

/// One deployed task's kernel.
#[pyclass(frozen, module = "tilesched._native")]
pub struct Kernel {
    cache: Py<Cache>,
    key: String,
    /// What the caller passes, in order (the workspace, the cache's, excluded).
    params: Vec<Param>,
    task: String,
    name: String,
    final_us: f64,
    workspace_bytes: u64,
}

#[pymethods]
impl Kernel {
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The task as tilesched's JSON writes it.
    #[getter]
    fn task(&self) -> &str {
        &self.task
    }

    /// The kernel's name in its cubin.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Its time when tuned, in microseconds.
    #[getter]
    fn final_us(&self) -> f64 {
        self.final_us
    }

    #[getter]
    fn workspace_bytes(&self) -> u64 {
        self.workspace_bytes
    }

    /// The buffers `launch` takes, in order: (role, elements, dtype name).
    #[getter]
    fn params(&self) -> Vec<(&'static str, usize, &'static str)> {
        self.params
            .iter()
            .map(|p| (role_name(p.role), p.elements, p.dtype.name()))
            .collect()
    }

    /// Enqueues the kernel on `stream` (a `CUstream` of the device's primary context, as
    /// an integer; 0 is the legacy default stream) with `buffers`, one
    /// `(device pointer, size in bytes)` per parameter in order. The buffers are checked
    /// first: their count, each one's size and 16-byte alignment.
    ///
    /// The caller (the custom operators) makes the device's primary context current and
    /// passes pointers of live allocations of that device; the sizes it gives are
    /// those of the allocations behind the pointers.
    fn launch(&self, buffers: Vec<(u64, usize)>, stream: usize) -> PyResult<()> {
        let sized: Vec<(u64, Option<usize>)> =
            buffers.iter().map(|&(p, bytes)| (p, Some(bytes))).collect();
        check_buffers(&self.key, &self.params, &sized).map_err(error)?;
        let cache = self.cache.get();
        let mut opened = cache.opened.lock().unwrap_or_else(|e| e.into_inner());
        let mut pointers: Vec<u64> = buffers.iter().map(|&(p, _)| p).collect();
        if let Some(workspace) = opened.workspaces.get(&self.key) {
            pointers.push(workspace.device_ptr());
        }
        let kernel = opened.runtime.kernel(&self.key).map_err(error)?;
        // SAFETY: the buffers were checked against the parameters (count, size,
        // alignment), the caller guarantees they are live allocations of the current
        // context, the device's primary context, as is the workspace, and that `stream`
        // is one of its streams or null.
        unsafe { kernel.launch(&pointers, stream as runtime::RawStream) }.map_err(error)
    }

    fn __repr__(&self) -> String {
        format!("Kernel({:?}, {:.2} us)", self.key, self.final_us)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Cache>()?;
    m.add_class::<Kernel>()?;
    m.add("TileschedError", m.py().get_type::<TileschedError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("TOOL_VERSION", runtime::TOOL_VERSION)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::DType;

    fn param(role: Role, elements: usize) -> Param {
        Param {
            role,
            elements,
            dtype: DType::Fp16,
        }
    }

    #[test]
    fn the_workspace_stays_with_the_cache() {
        let plain = [
            param(Role::Input, 8),
            param(Role::Weight, 8),
            param(Role::Output, 8),
        ];
        assert_eq!(split_workspace(&plain), (plain.to_vec(), None));
        let mut split = plain.to_vec();
        split.push(param(Role::Workspace, 64));
        let (given, workspace) = split_workspace(&split);
        assert_eq!(given, plain);
        assert_eq!(workspace.unwrap().bytes(), 128);
        assert_eq!(split_workspace(&[]), (Vec::new(), None));
    }

    #[test]
    fn roles_have_the_names_python_reads() {
        let names: Vec<&str> = [
            Role::Input,
            Role::Weight,
            Role::Bias,
            Role::Output,
            Role::Workspace,
        ]
        .into_iter()
        .map(role_name)
        .collect();
        assert_eq!(names, ["input", "weight", "bias", "output", "workspace"]);
    }
}
