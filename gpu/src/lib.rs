//! Everything that touches CUDA: compiling generated CUDA C to a cubin with NVRTC (no
//! GPU needed), reading the compiled kernel's resource usage, and measuring kernels on a
//! GPU in isolated worker processes (exact correctness check against a reference kernel,
//! then timing), with the client side that starts, feeds, times out and restarts them.
//! Compiled kernels are kept in a disk cache by what determines them (`cubin_cache`).
//! Buffers hold the task's element type (`element` encodes and decodes); checks compare
//! in f32.

pub mod buffers;
pub mod check;
pub mod compare;
pub mod compile;
pub mod cubin;
pub mod cubin_cache;
pub mod cuda;
pub mod device;
pub mod element;
pub mod nvrtc_lib;
pub mod pool;
pub mod protocol;
pub mod tensor_map;
pub mod timing;
pub mod worker;

pub use buffers::{BufferSets, ReferenceError};
pub use check::Problem;
pub use compile::{CompileError, CompiledKernel, compile};
pub use cubin::Resources;
pub use cubin_cache::{CubinCache, Origin, SharedCubins};
pub use device::{DeviceInfo, UnknownArch};
pub use pool::{Pool, PoolError, ProgressSink, Served, Took, WorkerCommand};
// The task and launch types of gpu's API, for crates that depend on gpu alone (runtime).
pub use protocol::{ErrorKind, KernelImage, MeasureRequest, Outcome, Phases, Timing};
pub use schedule::{DType, LaunchConfig, Task};
pub use timing::TimingConfig;
