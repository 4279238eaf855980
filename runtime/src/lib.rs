//! The runtime: tuned kernels out of a deploy cache and into an application.
//!
//! Tuning (`tilesched tune`, `sass`, `pipeline`) leaves the best cubin of each task per
//! GPU in a deploy cache (`cache`); this crate is all an application needs to use them:
//! it opens the cache, picks the entries of the GPU it runs on (device name and compute
//! capability, as tuning recorded them: a kernel is only ever launched on the GPU model
//! it was measured on), checks every entry when it opens the cache (its task, its
//! cubin's sha256, the kernel's parameters against the entry's buffers and tensor maps)
//! and the cubin's sha256 again before loading it, and launches a task's kernel on
//! device buffers and a stream the caller owns, zeroing the output first where the
//! kernel adds into it (split-K with atomics); a kernel that splits through scratch
//! takes a workspace the caller zeroes once (`Role::Workspace`). It depends on `gpu`
//! alone: no search, no compiler, no cost model.
//!
//! ```no_run
//! # fn main() -> Result<(), runtime::RuntimeError> {
//! # let (x, w, y): (u64, u64, u64) = (0, 0, 0);
//! # let stream = std::ptr::null_mut();
//! let mut rt = runtime::Runtime::open("deploy-cache", 0)?; // GPU 0's entries
//! let conv = rt.kernel("conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1")?;
//! for p in conv.params() {
//!     println!("{p}"); // input: 200704 f32, weight: 36864 f32, output: 200704 f32
//! }
//! // x, w, y: device allocations of those sizes in GPU 0's primary context (cudarc,
//! // PyTorch, cudaMalloc...); stream: a CUstream of that context, or null.
//! // SAFETY: the pointers are live and at least as large as `params()` says.
//! unsafe { conv.launch(&[x, w, y], stream)? };
//! # Ok(())
//! # }
//! ```

pub mod cache;
mod entry;
#[cfg(test)]
mod testkit;

pub use cache::{
    CUBIN_DIR, DeployCache, DeployEntry, INDEX_FILE, NewEntry, Stage, StoreAction, Stored,
    TOOL_VERSION, gpu_label,
};
pub use entry::EntryError;
pub use gpu::cuda::RawStream;

use gpu::cuda::{Context, CudaError, KernelArg, LoadedKernel};
use gpu::tensor_map;
use gpu::{DType, DeviceInfo, Problem};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;
use thiserror::Error;

/// Why a kernel could not be had or launched.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// The cache directory or its index: missing, unreadable, corrupt or unwritable.
    #[error("{0}")]
    Cache(String),
    /// The cache has no kernel of the task for any GPU.
    #[error("no deployed kernel for task {task} in {cache}; {available}")]
    MissingTask {
        task: String,
        cache: String,
        /// What the cache holds for this GPU, in words.
        available: String,
    },
    /// The cache has kernels of the task, but only for other GPUs.
    #[error(
        "task {task} was tuned for {tuned_for}, not for this GPU, {gpu}: a kernel runs only on the GPU model it was measured on; tune it here"
    )]
    ForeignGpu {
        task: String,
        gpu: String,
        tuned_for: String,
    },
    /// An entry the cache's checks refuse (`EntryError`): its task, its cubin, its
    /// kernel's parameters or its tensor maps are not what a launch needs; the index or
    /// the cubin was edited or damaged.
    #[error("deploy cache {cache} has a bad entry, of task {task} on {gpu}: {why}")]
    BadEntry {
        cache: String,
        task: String,
        gpu: String,
        why: Box<EntryError>,
    },
    /// The entry's cubin does not load, or a launch finds the entry lacking.
    #[error("deploy cache entry of task {task} is corrupt: {why}")]
    CorruptEntry { task: String, why: String },
    /// The caller passed the wrong number of device pointers.
    #[error("task {task}: its kernel takes {expected} device pointers ({params}), {given} given")]
    Arguments {
        task: String,
        expected: usize,
        given: usize,
        params: String,
    },
    /// A device pointer that is not 16-byte aligned: the kernels load 16 bytes at a time
    /// and TMA requires it (a view into the middle of a tensor can be misaligned).
    #[error(
        "task {task}: its {param} pointer {address:#x} is not aligned to {ALIGNMENT} bytes; pass a tensor whose storage starts aligned (a fresh or .contiguous() copy)"
    )]
    Misaligned {
        task: String,
        param: String,
        address: u64,
    },
    /// A buffer smaller than its parameter.
    #[error("task {task}: its {param} buffer holds only {bytes} bytes")]
    TooSmall {
        task: String,
        param: String,
        bytes: usize,
    },
    #[error("CUDA: {0}")]
    Cuda(#[from] CudaError),
}

/// The alignment every pointer a kernel takes must have, in bytes.
pub const ALIGNMENT: u64 = 16;

/// What a kernel parameter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// conv2d's input (NCHW or NHWC), a matmul's A.
    Input,
    /// conv2d's weights (KCRS or KRSC), a matmul's B.
    Weight,
    /// The epilogue's bias, one value per output channel or column.
    Bias,
    /// The result; written entirely by the launch.
    Output,
    /// Scratch of a split-K kernel (its semaphores and partial sums), last: the caller
    /// zeroes it once before the kernel's first launch, and every launch leaves its
    /// semaphores zeroed. One per kernel: another kernel's partial sums may lie where
    /// this one keeps its semaphores. Launches that may run at the same time (on
    /// different streams) need one each.
    Workspace,
}

/// One device pointer a kernel takes, in parameter order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub role: Role,
    /// Elements (not bytes).
    pub elements: usize,
    pub dtype: DType,
}

impl Param {
    /// The buffer's minimal size in bytes.
    pub fn bytes(&self) -> usize {
        self.elements * self.dtype.bytes() as usize
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.role {
            Role::Input => "input",
            Role::Weight => "weight",
            Role::Bias => "bias",
            Role::Output => "output",
            Role::Workspace => "workspace",
        };
        write!(f, "{role}: {} {}", self.elements, self.dtype.name())
    }
}

/// A deployed kernel, loaded and ready to launch.
pub struct Kernel {
    entry: DeployEntry,
    params: Vec<Param>,
    loaded: LoadedKernel,
    /// The tensor maps last encoded, and the pointers they were encoded for: a caller
    /// that launches on the same buffers again reuses them.
    maps: Mutex<(Vec<u64>, Vec<KernelArg>)>,
}

impl Kernel {
    /// The cache entry (kernel name, launch configuration, measured times).
    pub fn entry(&self) -> &DeployEntry {
        &self.entry
    }

    /// The device pointers `launch` takes, in order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Enqueues the task on `stream` with `pointers` (one device pointer per
    /// `params()`, in that order, followed by the tensor maps its entry records, encoded
    /// for those pointers), zeroing the output first on the same stream when the
    /// kernel adds into it. Returns once enqueued; synchronize the stream for the
    /// result.
    ///
    /// # Safety
    ///
    /// Each pointer must be a live device allocation of the current context (GPU
    /// `ordinal`'s primary context, which `Runtime::open` made current on this thread)
    /// holding at least `params()[i].bytes()` bytes, and `stream` a live stream of that
    /// context or null (the default stream).
    pub unsafe fn launch(&self, pointers: &[u64], stream: RawStream) -> Result<(), RuntimeError> {
        let buffers: Vec<(u64, Option<usize>)> = pointers.iter().map(|&p| (p, None)).collect();
        check_buffers(&self.entry.task, &self.params, &buffers)?;
        let zero = self.entry.launch.zero_output.then(|| {
            let at = self
                .params
                .iter()
                .position(|p| p.role == Role::Output)
                .expect("a kernel has an output");
            (pointers[at], self.params[at].bytes())
        });
        let mut args: Vec<KernelArg> = pointers.iter().map(|&p| KernelArg::Ptr(p)).collect();
        // The TMA tensor maps the entry records, encoded for the caller's buffers.
        let maps = &self.entry.launch.tensor_maps;
        if !maps.is_empty() {
            let mut cached = self.maps.lock().unwrap_or_else(|e| e.into_inner());
            if cached.0 != pointers {
                let encoded = maps
                    .iter()
                    .map(|map| {
                        let address = *pointers.get(map.buffer).ok_or_else(|| {
                            RuntimeError::CorruptEntry {
                                task: self.entry.task.clone(),
                                why: format!(
                                    "a tensor map of buffer {} of its {} parameters",
                                    map.buffer,
                                    pointers.len()
                                ),
                            }
                        })?;
                        tensor_map::encode(&map.tensor, address)
                            .map(KernelArg::Bytes128)
                            .map_err(|e| RuntimeError::Cuda(e.into()))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                *cached = (pointers.to_vec(), encoded);
            }
            args.extend_from_slice(&cached.1);
        }
        // SAFETY: the caller guarantees the pointers and the stream; `Runtime::load`
        // checked the entry against the cubin (`entry`): the kernel takes exactly these
        // pointers, then these maps, which lie within the caller's buffers.
        unsafe { self.loaded.launch(&args, zero, stream) }?;
        Ok(())
    }
}

/// A deploy cache opened for one GPU: its entries for that GPU, loaded on first use.
pub struct Runtime {
    cache: DeployCache,
    gpu: String,
    compute_capability: (u32, u32),
    loaded: HashMap<String, Kernel>,
    ctx: Context,
}

impl Runtime {
    /// Opens the deploy cache in `dir` (read only) for GPU `ordinal`, making the GPU's
    /// primary context current on this thread: the context that the CUDA runtime API,
    /// cudarc and PyTorch allocate in.
    pub fn open(dir: impl AsRef<Path>, ordinal: u32) -> Result<Runtime, RuntimeError> {
        let cache = DeployCache::load(dir)?;
        if !gpu::cuda::driver_present() {
            return Err(RuntimeError::Cuda(CudaError {
                what: "loading the CUDA driver".to_string(),
                name: "libcuda.so.1 is not installed".to_string(),
            }));
        }
        let ctx = Context::new(ordinal)?;
        let info = DeviceInfo::query(&ctx)?;
        Ok(Runtime {
            cache,
            gpu: info.name,
            compute_capability: info.compute_capability,
            loaded: HashMap::new(),
            ctx,
        })
    }

    /// A device buffer of at least `bytes` bytes, zeroed before this returns: a kernel's
    /// `Role::Workspace`, which the caller keeps for as long as it launches the kernel.
    pub fn zeroed(&self, bytes: usize) -> Result<gpu::cuda::Buffer, RuntimeError> {
        let buffer = self.ctx.alloc_typed(bytes.div_ceil(4), DType::F32)?;
        self.ctx.zero(&buffer)?;
        self.ctx.synchronize()?;
        Ok(buffer)
    }

    /// The GPU's name and compute capability, as the cache's entries are keyed.
    pub fn gpu(&self) -> (&str, (u32, u32)) {
        (&self.gpu, self.compute_capability)
    }

    /// The task keys the cache holds for this GPU, sorted.
    pub fn tasks(&self) -> Vec<&str> {
        self.cache.tasks_for(&self.gpu, self.compute_capability)
    }

    /// The cache as read.
    pub fn cache(&self) -> &DeployCache {
        &self.cache
    }

    /// The kernel of `task` for this GPU, loaded (after its cubin's sha256 is checked)
    /// on first use.
    pub fn kernel(&mut self, task: &str) -> Result<&Kernel, RuntimeError> {
        if !self.loaded.contains_key(task) {
            let kernel = self.load(task)?;
            self.loaded.insert(task.to_string(), kernel);
        }
        Ok(&self.loaded[task])
    }

    fn load(&self, task: &str) -> Result<Kernel, RuntimeError> {
        let entry = lookup(&self.cache, &self.gpu, self.compute_capability, task)?.clone();
        let bad = |why| self.cache.bad_entry(&entry, why);
        let params = params_of(&entry).map_err(bad)?;
        let cubin = self.cache.verify(&entry)?;
        // Again on the bytes loaded: what `launch` relies on.
        crate::entry::check(&entry, &cubin).map_err(bad)?;
        let loaded =
            LoadedKernel::load(&cubin, &entry.kernel, entry.launch.clone()).map_err(|e| {
                RuntimeError::CorruptEntry {
                    task: task.to_string(),
                    why: format!(
                        "its cubin {} does not load: {e}",
                        self.cache.path_of(&entry).display()
                    ),
                }
            })?;
        Ok(Kernel {
            entry,
            params,
            loaded,
            maps: Mutex::new((Vec::new(), Vec::new())),
        })
    }
}

/// Checks device buffers against a kernel's parameters before a launch: their count,
/// each one's alignment and, where the caller knows it (`Some(bytes)`), its size.
pub fn check_buffers(
    task: &str,
    params: &[Param],
    buffers: &[(u64, Option<usize>)],
) -> Result<(), RuntimeError> {
    if buffers.len() != params.len() {
        return Err(RuntimeError::Arguments {
            task: task.to_string(),
            expected: params.len(),
            given: buffers.len(),
            params: params
                .iter()
                .map(Param::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    for (param, &(address, bytes)) in params.iter().zip(buffers) {
        if address % ALIGNMENT != 0 {
            return Err(RuntimeError::Misaligned {
                task: task.to_string(),
                param: param.to_string(),
                address,
            });
        }
        if let Some(bytes) = bytes.filter(|&b| b < param.bytes()) {
            return Err(RuntimeError::TooSmall {
                task: task.to_string(),
                param: param.to_string(),
                bytes,
            });
        }
    }
    Ok(())
}

/// The entry of `task` for (`gpu`, `cc`), or why there is none: missing from the cache,
/// or tuned for other GPUs only.
pub fn lookup<'c>(
    cache: &'c DeployCache,
    gpu: &str,
    cc: (u32, u32),
    task: &str,
) -> Result<&'c DeployEntry, RuntimeError> {
    if let Some(entry) = cache.lookup(gpu, cc, task) {
        return Ok(entry);
    }
    let others: Vec<String> = cache
        .entries()
        .iter()
        .filter(|e| e.task == task)
        .map(|e| gpu_label(&e.gpu, e.compute_capability))
        .collect();
    if !others.is_empty() {
        return Err(RuntimeError::ForeignGpu {
            task: task.to_string(),
            gpu: gpu_label(gpu, cc),
            tuned_for: others.join(", "),
        });
    }
    let tasks = cache.tasks_for(gpu, cc);
    let available = if tasks.is_empty() {
        format!("it has no tasks for {}", gpu_label(gpu, cc))
    } else {
        format!(
            "its {} task(s) for {}: {}",
            tasks.len(),
            gpu_label(gpu, cc),
            tasks.join(", ")
        )
    };
    Err(RuntimeError::MissingTask {
        task: task.to_string(),
        cache: cache.dir().display().to_string(),
        available,
    })
}

/// The parameters of an entry's kernel, from its recorded task (checked first): the two
/// factors, the bias if the epilogue adds one, the output (the order every generated
/// kernel takes), then the workspace if its launch takes one.
pub fn params_of(entry: &DeployEntry) -> Result<Vec<Param>, EntryError> {
    let task = entry::task_of(entry)?;
    let problem = Problem::for_task(task, 0);
    let mut params: Vec<Param> = problem
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &elements)| Param {
            role: [Role::Input, Role::Weight, Role::Bias][i.min(2)],
            elements,
            dtype: problem.dtype,
        })
        .collect();
    params.push(Param {
        role: Role::Output,
        elements: problem.output,
        dtype: problem.out_dtype,
    });
    let workspace = entry.launch.workspace_bytes;
    if workspace > 0 {
        params.push(Param {
            role: Role::Workspace,
            elements: workspace.div_ceil(4) as usize,
            dtype: DType::F32,
        });
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::{LaunchConfig, Task};

    const H100: &str = "NVIDIA H100 80GB HBM3";

    fn task(spec: &str, bias: bool) -> Task {
        let op = schedule::parse_shape("conv2d", spec).unwrap();
        Task::new(op, schedule::Epilogue { bias, relu: false }).unwrap()
    }

    /// A kernel "k" of `pointers` pointer parameters.
    fn cubin(pointers: usize, tag: u8) -> Vec<u8> {
        crate::testkit::cubin("k", &vec![crate::testkit::POINTER; pointers], tag)
    }

    fn entry(gpu: &str, task: &Task) -> NewEntry {
        NewEntry {
            gpu: gpu.to_string(),
            compute_capability: (9, 0),
            task: task.key(),
            shape: *task,
            kernel: "k".to_string(),
            launch: LaunchConfig::linear(1, 32, 0),
            stage1_us: 2.0,
            final_us: 2.0,
            stage: Stage::Stage1,
            created_by: TOOL_VERSION.to_string(),
        }
    }

    #[test]
    fn params_follow_the_task() {
        let t = task("1,64,56,56,128,3,3,2,1", true);
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let e = cache.store(entry(H100, &t), &cubin(4, 0)).unwrap().entry;
        let params = params_of(&e).unwrap();
        let shown: Vec<String> = params.iter().map(Param::to_string).collect();
        assert_eq!(
            shown,
            [
                "input: 200704 f32",
                "weight: 73728 f32",
                "bias: 128 f32",
                "output: 100352 f32"
            ]
        );
        assert_eq!(params[3].bytes(), 100352 * 4);

        // A split-K kernel's scratch comes last.
        let mut split = e.clone();
        split.launch.workspace_bytes = 4096;
        let last = params_of(&split).unwrap().pop().unwrap();
        assert_eq!(last.to_string(), "workspace: 1024 f32");
        assert_eq!(last.bytes(), 4096);

        let mut old = e.clone();
        old.shape = None;
        let err = params_of(&old).unwrap_err();
        assert!(err.to_string().contains("no task shape"), "{err}");
        old.shape = Some(task("1,64,56,56,64,3,3,1,1", false));
        let err = params_of(&old).unwrap_err();
        assert!(err.to_string().contains("not conv2d_n1_c64"), "{err}");
    }

    #[test]
    fn buffers_are_checked_before_a_launch() {
        let t = task("1,8,4,4,16,1,1,1,0", true);
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let params = params_of(&cache.store(entry(H100, &t), &cubin(4, 0)).unwrap().entry).unwrap();
        let sizes: Vec<usize> = params.iter().map(Param::bytes).collect();
        let good: Vec<(u64, Option<usize>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &b)| (0x1000 * (i as u64 + 1), Some(b)))
            .collect();
        check_buffers(&t.key(), &params, &good).unwrap();
        // Sizes unknown (Rust callers): only count and alignment.
        let unsized_: Vec<_> = good.iter().map(|&(p, _)| (p, None)).collect();
        check_buffers(&t.key(), &params, &unsized_).unwrap();

        let err = check_buffers(&t.key(), &params, &good[..3]).unwrap_err();
        assert!(err.to_string().contains("takes 4 device pointers"), "{err}");
        let mut misaligned = good.clone();
        misaligned[1].0 += 8;
        let err = check_buffers(&t.key(), &params, &misaligned).unwrap_err();
        assert!(matches!(err, RuntimeError::Misaligned { .. }), "{err}");
        assert!(
            err.to_string().contains("weight: 128 f32 pointer 0x2008"),
            "{err}"
        );
        let mut small = good.clone();
        small[3].1 = Some(sizes[3] - 1);
        let err = check_buffers(&t.key(), &params, &small).unwrap_err();
        assert!(
            err.to_string()
                .contains("output: 256 f32 buffer holds only 1023 bytes"),
            "{err}"
        );
    }

    #[test]
    fn lookup_tells_a_missing_task_from_a_foreign_gpu() {
        let a = task("1,64,56,56,64,3,3,1,1", false);
        let b = task("1,64,56,56,64,1,1,1,0", false);
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        cache.store(entry(H100, &a), &cubin(3, 0)).unwrap();
        cache.store(entry("NVIDIA H200", &b), &cubin(3, 1)).unwrap();

        assert_eq!(
            lookup(&cache, H100, (9, 0), &a.key()).unwrap().task,
            a.key()
        );
        let err = lookup(&cache, H100, (9, 0), &b.key()).unwrap_err();
        assert!(matches!(err, RuntimeError::ForeignGpu { .. }), "{err}");
        assert!(err.to_string().contains("NVIDIA H200 (sm_90)"), "{err}");
        let err = lookup(&cache, H100, (9, 0), "matmul_m8_n8_k8").unwrap_err();
        assert!(matches!(err, RuntimeError::MissingTask { .. }), "{err}");
        assert!(err.to_string().contains(&a.key()), "{err}");
        // Same name, other compute capability: foreign too.
        let err = lookup(&cache, H100, (8, 0), &a.key()).unwrap_err();
        assert!(matches!(err, RuntimeError::ForeignGpu { .. }), "{err}");
        assert_eq!(err.to_string().lines().count(), 1);
    }
}
