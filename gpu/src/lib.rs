//! Everything that touches CUDA. For now: compiling generated CUDA C to a cubin with
//! NVRTC (loaded at run time, no GPU or driver needed) and reading the compiled
//! kernel's resource usage (registers, stack, spills, shared memory) out of the cubin.

pub mod compile;
pub mod cubin;
pub mod nvrtc_lib;

pub use compile::{CompileError, CompiledKernel, compile};
pub use cubin::Resources;
