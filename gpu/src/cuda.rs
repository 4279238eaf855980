//! A thin owned layer over the CUDA driver API (cudarc's `result` functions): one
//! context, device buffers, modules, events and launches on one stream. The worker needs
//! exact control of what is enqueued between two timing events, which cudarc's safe
//! layer (with per-buffer event tracking and synchronizing drops) does not give.
//!
//! The measurement worker uses it (a faulting kernel poisons the context, and the
//! process is then ended rather than recovered), as do the benchmarks and the runtime,
//! which launches deployed kernels on its caller's pointers and streams
//! (`LoadedKernel`).
//!
//! Launches take typed arguments (`KernelArg`: device pointers, 64-bit scalars, and
//! the 128-byte tensor maps that TMA copies read) and a `LaunchConfig` with a 3-D grid
//! and, where a kernel runs in thread block clusters, the cluster's shape (launched
//! through `cuLaunchKernelEx`).
//!
//! A buffer knows its element type: uploads and downloads take and give f32 values and
//! encode or decode them (`element`), so that callers compare in f32 whatever the type.

use crate::element;
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use schedule::{DType, LaunchConfig};
use std::ffi::{CString, c_void};
use thiserror::Error;

/// A failed driver call, with what was being done.
#[derive(Debug, Clone, Error)]
#[error("{what}: {name}")]
pub struct CudaError {
    pub what: String,
    /// The driver's error name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub name: String,
}

pub(crate) fn err(what: impl Into<String>) -> impl FnOnce(DriverError) -> CudaError {
    let what = what.into();
    move |e| CudaError {
        what,
        name: e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("CUresult {}", e.0 as i32)),
    }
}

/// True when the driver library can be opened (cudarc would panic on first use if not).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    unsafe { sys::is_culib_present() }
}

/// The current context of device `ordinal` (its primary context) and a stream on it.
pub struct Context {
    pub device: sys::CUdevice,
    pub ordinal: u32,
    stream: sys::CUstream,
}

// SAFETY: the device handle and the stream are process-wide driver handles; the driver
// API is thread-safe, and a stream of the primary context may be used from any thread
// where that context is current (every user makes it current first, as PyTorch does).
unsafe impl Send for Context {}

impl Context {
    /// Initializes the driver and makes device `ordinal`'s primary context current.
    pub fn new(ordinal: u32) -> Result<Context, CudaError> {
        result::init().map_err(err("cuInit"))?;
        let count = result::device::get_count().map_err(err("cuDeviceGetCount"))?;
        if ordinal as i32 >= count {
            return Err(CudaError {
                what: format!("device {ordinal}"),
                name: format!("only {count} device(s) present"),
            });
        }
        let device = result::device::get(ordinal as i32).map_err(err("cuDeviceGet"))?;
        // SAFETY: `device` is a valid device handle; the retained context is released
        // by the driver when the process ends.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(err("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `ctx` was just retained and stays alive for the process.
        unsafe { result::ctx::set_current(ctx) }.map_err(err("cuCtxSetCurrent"))?;
        // A blocking stream: the driver's synchronous copies order with it.
        let stream = result::stream::create(result::stream::StreamKind::Default)
            .map_err(err("cuStreamCreate"))?;
        Ok(Context {
            device,
            ordinal,
            stream,
        })
    }

    pub fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<i32, CudaError> {
        // SAFETY: `self.device` is a valid device handle.
        unsafe { result::device::get_attribute(self.device, attribute) }
            .map_err(err(format!("cuDeviceGetAttribute({attribute:?})")))
    }

    pub fn name(&self) -> Result<String, CudaError> {
        result::device::get_name(self.device).map_err(err("cuDeviceGetName"))
    }

    pub fn total_memory(&self) -> Result<usize, CudaError> {
        // SAFETY: `self.device` is a valid device handle.
        unsafe { result::device::total_mem(self.device) }.map_err(err("cuDeviceTotalMem"))
    }

    /// Device memory free now, in bytes.
    pub fn free_memory(&self) -> Result<u64, CudaError> {
        let (free, _total) = result::mem_get_info().map_err(err("cuMemGetInfo"))?;
        Ok(free as u64)
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: the stream belongs to the current context.
        unsafe { result::stream::synchronize(self.stream) }.map_err(err("cuStreamSynchronize"))
    }

    /// Waits for everything queued in the context (streams and copies).
    pub fn synchronize_all(&self) -> Result<(), CudaError> {
        result::ctx::synchronize().map_err(err("cuCtxSynchronize"))
    }

    /// A device buffer of `len` floats (uninitialized).
    pub fn alloc(&self, len: usize) -> Result<Buffer, CudaError> {
        self.alloc_typed(len, DType::F32)
    }

    /// A device buffer of `len` elements of `dtype` (uninitialized).
    pub fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Buffer, CudaError> {
        let bytes = len.max(1) * dtype.bytes() as usize;
        // SAFETY: a plain allocation in the current context.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(err("cuMemAlloc"))?;
        Ok(Buffer { ptr, len, dtype })
    }

    /// Uploads `src`, encoded in `dst`'s element type.
    pub fn upload(&self, dst: &Buffer, src: &[f32]) -> Result<(), CudaError> {
        assert_eq!(dst.len, src.len(), "upload size");
        self.upload_bytes(dst, &element::encode(src, dst.dtype))
    }

    /// Uploads raw element bytes (exactly the buffer's size).
    pub fn upload_bytes(&self, dst: &Buffer, src: &[u8]) -> Result<(), CudaError> {
        assert_eq!(dst.bytes(), src.len(), "upload size in bytes");
        // SAFETY: `dst` holds exactly `src.len()` bytes.
        unsafe { result::memcpy_htod_sync(dst.ptr, src) }.map_err(err("cuMemcpyHtoD"))
    }

    /// The buffer's elements as f32 values (decoded from its element type), once the
    /// stream's work is done.
    pub fn download(&self, src: &Buffer) -> Result<Vec<f32>, CudaError> {
        Ok(element::decode(&self.download_bytes(src)?, src.dtype))
    }

    /// The buffer's raw element bytes, once the stream's work is done.
    pub fn download_bytes(&self, src: &Buffer) -> Result<Vec<u8>, CudaError> {
        self.synchronize()?;
        let mut out = vec![0u8; src.bytes()];
        // SAFETY: `src` holds exactly `out.len()` bytes.
        unsafe { result::memcpy_dtoh_sync(&mut out, src.ptr) }.map_err(err("cuMemcpyDtoH"))?;
        Ok(out)
    }

    pub fn copy(&self, dst: &Buffer, src: &Buffer) -> Result<(), CudaError> {
        assert_eq!(dst.bytes(), src.bytes(), "copy size");
        // SAFETY: both buffers are live and of the same size in bytes.
        unsafe { result::memcpy_dtod_sync(dst.ptr, src.ptr, src.bytes()) }
            .map_err(err("cuMemcpyDtoD"))
    }

    /// Fills `buffer` with the quiet NaN of its element type (`element::nan_bits`), so
    /// that every element a kernel leaves unwritten decodes to NaN.
    pub fn poison(&self, buffer: &Buffer) -> Result<(), CudaError> {
        let bits = element::nan_bits(buffer.dtype);
        let (call, result) = match buffer.dtype.bytes() {
            // SAFETY: the buffer is live and holds `len` 16-bit elements; the stream
            // belongs to the current context.
            2 => ("cuMemsetD16Async", unsafe {
                sys::cuMemsetD16Async(buffer.ptr, bits as u16, buffer.len, self.stream)
            }),
            // SAFETY: as above, with `len` 32-bit elements.
            _ => ("cuMemsetD32Async", unsafe {
                sys::cuMemsetD32Async(buffer.ptr, bits, buffer.len, self.stream)
            }),
        };
        result.result().map_err(err(call))
    }

    /// Enqueues the zeroing of `buffer` (every element +0.0, in any type) on the
    /// context's stream, so that it runs right before the next launch and between the
    /// same timing events: split-K kernels add into their output, and zeroing it is part
    /// of the operation.
    pub fn zero(&self, buffer: &Buffer) -> Result<(), CudaError> {
        // SAFETY: the buffer is live; all-zero bytes are +0.0 in every element type.
        unsafe { result::memset_d8_async(buffer.ptr, 0, buffer.bytes(), self.stream) }
            .map_err(err("cuMemsetD8"))
    }

    /// Loads a cubin (or NUL-terminated PTX) image.
    pub fn load(&self, image: &[u8]) -> Result<Module, CudaError> {
        load_module(image)
    }

    /// Enqueues `function` with the given buffers (and trailing 64-bit scalars) as its
    /// parameters.
    pub fn launch(
        &self,
        function: &Function,
        launch: &LaunchConfig,
        buffers: &[&Buffer],
        scalars: &[u64],
    ) -> Result<(), CudaError> {
        let mut args: Vec<KernelArg> = buffers.iter().map(|b| b.arg()).collect();
        args.extend(scalars.iter().map(|&v| KernelArg::U64(v)));
        // SAFETY: the function comes from a live module (the borrow keeps it); the
        // buffers are live allocations of this context and the stream is its own.
        unsafe { launch_raw(function.function, launch, &args, self.stream) }
    }

    /// Enqueues `function` with `buffers` as its first parameters, then the tensor map
    /// of each of them that `launch.tensor_maps` asks for, encoded for that buffer.
    pub fn launch_mapped(
        &self,
        function: &Function,
        launch: &LaunchConfig,
        buffers: &[&Buffer],
    ) -> Result<(), CudaError> {
        let mut args: Vec<KernelArg> = buffers.iter().map(|b| b.arg()).collect();
        for map in &launch.tensor_maps {
            let buffer = buffers.get(map.buffer).ok_or_else(|| CudaError {
                what: format!("a tensor map of buffer {} of {}", map.buffer, buffers.len()),
                name: "TENSOR_MAP_BUFFER".to_string(),
            })?;
            args.push(KernelArg::Bytes128(crate::tensor_map::encode(
                &map.tensor,
                buffer.ptr,
            )?));
        }
        // SAFETY: as `launch`; the maps describe live buffers of this context.
        unsafe { launch_raw(function.function, launch, &args, self.stream) }
    }

    pub fn event(&self) -> Result<Event, CudaError> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(err("cuEventCreate"))?;
        Ok(Event { event })
    }

    pub fn record(&self, event: &Event) -> Result<(), CudaError> {
        // SAFETY: the event and stream are live and belong to this context.
        unsafe { result::event::record(event.event, self.stream) }.map_err(err("cuEventRecord"))
    }

    /// The stream every call of this context enqueues on, for vendor libraries (cuDNN,
    /// cuBLAS) whose work must be timed between the same events.
    pub fn raw_stream(&self) -> sys::CUstream {
        self.stream
    }
}

/// Loads a cubin (or PTX) image into the current context.
fn load_module(image: &[u8]) -> Result<Module, CudaError> {
    let mut owned = image.to_vec();
    owned.push(0); // PTX text must be NUL-terminated; a cubin ignores the extra byte.
    // SAFETY: `owned` is a complete image that outlives the call.
    let module = unsafe { result::module::load_data(owned.as_ptr().cast()) }
        .map_err(err("cuModuleLoadData"))?;
    Ok(Module { module })
}

/// Device memory holding `len` elements of `dtype`, freed on drop.
pub struct Buffer {
    ptr: sys::CUdeviceptr,
    /// Elements, not bytes.
    pub len: usize,
    pub dtype: DType,
}

// SAFETY: a device address is valid from any thread where its context is current, and
// the buffer is freed once, by whichever thread drops it.
unsafe impl Send for Buffer {}

impl Buffer {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len * self.dtype.bytes() as usize
    }

    /// The device address, for vendor libraries that take raw pointers.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The buffer as a kernel parameter.
    pub fn arg(&self) -> KernelArg {
        KernelArg::Ptr(self.ptr)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `Context::alloc` and freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A loaded module, unloaded on drop.
pub struct Module {
    module: sys::CUmodule,
}

impl Module {
    /// The kernel `name`, allowed `shared_bytes` of dynamic shared memory (opting in
    /// above the 48 KB default).
    pub fn function(&self, name: &str, shared_bytes: u32) -> Result<Function<'_>, CudaError> {
        Ok(Function {
            function: self.raw_function(name, shared_bytes)?,
            _module: std::marker::PhantomData,
        })
    }

    fn raw_function(&self, name: &str, shared_bytes: u32) -> Result<sys::CUfunction, CudaError> {
        let cname = CString::new(name).map_err(|_| CudaError {
            what: format!("kernel name {name:?}"),
            name: "contains a NUL byte".to_string(),
        })?;
        // SAFETY: the module is live.
        let function = unsafe { result::module::get_function(self.module, cname) }
            .map_err(err(format!("cuModuleGetFunction({name})")))?;
        // The opt-in is asked for whatever the size: the default 48 KiB limit counts
        // static shared memory (a kernel's mbarriers) too, which the launch does not know.
        if shared_bytes > 0 {
            // SAFETY: `function` is valid while the module lives.
            unsafe {
                result::function::set_function_attribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes as i32,
                )
            }
            .map_err(err("cuFuncSetAttribute(max dynamic shared memory)"))?;
        }
        Ok(function)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `Context::load` and unloaded once.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// A kernel of a module; borrows the module so it cannot outlive it.
pub struct Function<'m> {
    function: sys::CUfunction,
    _module: std::marker::PhantomData<&'m Module>,
}

/// A raw CUDA stream handle (`CUstream`) of the current context; null is the legacy
/// default stream. What callers of `LoadedKernel::launch` pass, from whatever library
/// created it (cudarc's `CudaStream::cu_stream`, PyTorch's `cuda_stream`, ...).
pub type RawStream = sys::CUstream;

/// One kernel of a cubin, owning its module: what the runtime keeps per deployed task
/// and launches on pointers and streams it does not own.
pub struct LoadedKernel {
    function: sys::CUfunction,
    launch: LaunchConfig,
    _module: Module,
}

// SAFETY: the module and function handles are process-wide and the driver API is
// thread-safe: a kernel may be launched from any thread where its context is current,
// from several at once (`launch` takes `&self` and mutates nothing).
unsafe impl Send for LoadedKernel {}
// SAFETY: as for `Send`: launching through a shared reference mutates nothing.
unsafe impl Sync for LoadedKernel {}

impl LoadedKernel {
    /// Loads `image` into the current context and looks up kernel `name`, allowing it
    /// `launch`'s dynamic shared memory.
    pub fn load(image: &[u8], name: &str, launch: LaunchConfig) -> Result<Self, CudaError> {
        let module = load_module(image)?;
        let function = module.raw_function(name, launch.dynamic_shared_bytes)?;
        Ok(LoadedKernel {
            function,
            launch,
            _module: module,
        })
    }

    /// Enqueues the kernel on `stream` with `params` (in the kernel's parameter order),
    /// after zeroing `zero` (a device pointer and a size in bytes) on the same stream
    /// when given.
    ///
    /// # Safety
    ///
    /// Every pointer in `params` and `zero` must be a live device allocation of the
    /// current context, at least as large as the kernel reads or writes through it (a
    /// tensor map's too), and `stream` a live stream of that context (or null).
    pub unsafe fn launch(
        &self,
        params: &[KernelArg],
        zero: Option<(u64, usize)>,
        stream: RawStream,
    ) -> Result<(), CudaError> {
        if let Some((ptr, bytes)) = zero {
            // SAFETY: the caller guarantees `ptr` holds `bytes` bytes and `stream` is live.
            unsafe { result::memset_d8_async(ptr, 0, bytes, stream) }
                .map_err(err("cuMemsetD8Async"))?;
        }
        // SAFETY: the function lives as long as its module, which `self` owns; the caller
        // guarantees the parameters and the stream.
        unsafe { launch_raw(self.function, &self.launch, params, stream) }
    }
}

/// One kernel parameter, in the form the driver copies it from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelArg {
    /// A device pointer.
    Ptr(u64),
    /// A 64-bit scalar.
    U64(u64),
    /// 128 opaque bytes: a `CUtensorMap`, passed as a `const __grid_constant__`
    /// parameter of that size and alignment.
    Bytes128(Bytes128),
}

/// 128 bytes aligned to 64, as the driver requires of a tensor map.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes128(pub [u8; 128]);

impl KernelArg {
    /// Where the driver reads the parameter's bytes from.
    fn address(&self) -> *mut c_void {
        match self {
            KernelArg::Ptr(v) | KernelArg::U64(v) => (v as *const u64).cast_mut().cast(),
            KernelArg::Bytes128(b) => (b as *const Bytes128).cast_mut().cast(),
        }
    }
}

/// Enqueues `function` with `args` on `stream`: `cuLaunchKernel`, or `cuLaunchKernelEx`
/// with the cluster dimension as a launch attribute when the launch has clusters.
///
/// # Safety
///
/// `function` must belong to a loaded module, the arguments must be what its
/// parameters expect, and `stream` a live stream of the current context (or null).
unsafe fn launch_raw(
    function: sys::CUfunction,
    launch: &LaunchConfig,
    args: &[KernelArg],
    stream: sys::CUstream,
) -> Result<(), CudaError> {
    // The driver only reads through these pointers (`void**` is its C signature).
    let mut params: Vec<*mut c_void> = args.iter().map(KernelArg::address).collect();
    let grid = (launch.grid.x, launch.grid.y, launch.grid.z);
    if launch.cluster.is_one() {
        // SAFETY: each parameter points into `args`, which lives until the call returns,
        // which is when the driver has copied the parameters; the caller guarantees the
        // function and the stream.
        return unsafe {
            result::launch_kernel(
                function,
                grid,
                (launch.block, 1, 1),
                launch.dynamic_shared_bytes,
                stream,
                &mut params,
            )
        }
        .map_err(err("cuLaunchKernel"));
    }
    let mut cluster = cluster_attribute(launch);
    let config = cluster_config(launch, stream, &mut cluster);
    // SAFETY: `config` and its one attribute, and the parameters (pointing into `args`),
    // live until the call returns, when the driver has copied them; the caller
    // guarantees the function and the stream.
    unsafe { sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(err("cuLaunchKernelEx"))
}

/// The launch attribute of `launch`'s cluster dimension.
fn cluster_attribute(launch: &LaunchConfig) -> sys::CUlaunchAttribute {
    let mut cluster = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    };
    cluster.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: launch.cluster.x,
        y: launch.cluster.y,
        z: launch.cluster.z,
    };
    cluster
}

/// `cuLaunchKernelEx`'s description of `launch` on `stream`, with `cluster` (which it
/// points to) as its one attribute.
fn cluster_config(
    launch: &LaunchConfig,
    stream: sys::CUstream,
    cluster: &mut sys::CUlaunchAttribute,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: launch.grid.x,
        gridDimY: launch.grid.y,
        gridDimZ: launch.grid.z,
        blockDimX: launch.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: launch.dynamic_shared_bytes,
        hStream: stream,
        attrs: cluster,
        numAttrs: 1,
    }
}

impl Function<'_> {
    /// How many of `launch`'s clusters the GPU can run at once
    /// (`cuOccupancyMaxActiveClusters`): what bounds a persistent grid of clusters.
    pub fn max_active_clusters(&self, launch: &LaunchConfig) -> Result<u32, CudaError> {
        let mut cluster = cluster_attribute(launch);
        let config = cluster_config(launch, std::ptr::null_mut(), &mut cluster);
        let mut clusters: std::ffi::c_int = 0;
        // SAFETY: `config` and its attribute live across the call, which only reads
        // them and writes `clusters`; the function belongs to a loaded module.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, self.function, &config) }
            .result()
            .map_err(err("cuOccupancyMaxActiveClusters"))?;
        Ok(u32::try_from(clusters).unwrap_or(0))
    }
}

/// A timing event, destroyed on drop.
pub struct Event {
    event: sys::CUevent,
}

impl Event {
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        // SAFETY: both events were created in this context and recorded on one stream.
        unsafe { result::event::elapsed(self.event, end.event) }.map_err(err("cuEventElapsedTime"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `Context::event` and destroyed once.
        let _ = unsafe { result::event::destroy(self.event) };
    }
}

/// The CUDA version the driver supports, e.g. "13.0".
pub fn driver_cuda_version() -> Result<String, CudaError> {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(err("cuDriverGetVersion"))?;
    Ok(format!("{}.{}", version / 1000, (version % 1000) / 10))
}
