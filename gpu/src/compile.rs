//! Compiling CUDA C to a cubin with NVRTC, for a given `sm_XY`.

use crate::cubin::{self, Resources};
use crate::nvrtc_lib;
use cudarc::nvrtc::{result, sys};
use std::ffi::CString;
use std::time::Instant;
use thiserror::Error;

/// Why a kernel did not compile.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum CompileError {
    #[error(transparent)]
    Unavailable(#[from] nvrtc_lib::NvrtcLibError),
    #[error("invalid architecture '{0}' (expected sm_XY, e.g. sm_90)")]
    Arch(String),
    #[error("NVRTC rejected the source: {log}")]
    Source { log: String },
    #[error("NVRTC failed: {0}")]
    Nvrtc(String),
    #[error("the cubin is malformed: {0}")]
    Cubin(#[from] cubin::CubinError),
}

/// Lets the calling thread's compiles give way to the rest of the machine (nice +10 for
/// this thread alone, which is how Linux keeps nice values). Build threads fill every
/// core but have slack, while the tuner's proposal and the model's training decide when
/// the next round is ready: on an H100 host whose 14 build threads were all busy, at
/// the same priority, a retraining took up to 7 s instead of 0.2 s and the tuner
/// waited 11.5 s of a 45 s run for the model.
pub fn compile_in_background() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority only reads its plain integer arguments; `who` 0 is the calling
    // thread. Failing leaves the priority as it was, which is harmless.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

/// A compiled kernel: the cubin and what the compiler says it uses.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledKernel {
    pub cubin: Vec<u8>,
    pub resources: Resources,
    /// The compiler's messages (warnings, ptxas statistics).
    pub log: String,
    pub compile_ms: f64,
}

/// Destroys the NVRTC program when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn nvrtc_err(what: &str, e: impl std::fmt::Debug) -> CompileError {
    CompileError::Nvrtc(format!("{what}: {e:?}"))
}

/// Checks that `arch` names a real architecture (`sm_` and digits, optionally a
/// suffix letter as in `sm_90a`).
pub fn check_arch(arch: &str) -> Result<(), CompileError> {
    let valid = arch.strip_prefix("sm_").is_some_and(|v| {
        let digits = v.trim_end_matches(|c: char| c.is_ascii_lowercase());
        digits.len() >= 2 && digits.chars().all(|c| c.is_ascii_digit())
    });
    if valid {
        Ok(())
    } else {
        Err(CompileError::Arch(arch.to_string()))
    }
}

/// Runs NVRTC on `source` with `options`; the program (for fetching the output) and the
/// compiler's log.
fn run_nvrtc(
    source: &str,
    kernel: &str,
    options: &[String],
) -> Result<(Program, String), CompileError> {
    nvrtc_lib::ensure_loaded()?;
    let src = CString::new(source).map_err(|_| CompileError::Source {
        log: "source contains a NUL byte".to_string(),
    })?;
    let name = CString::new(format!("{kernel}.cu")).map_err(|e| nvrtc_err("name", e))?;
    let program =
        Program(result::create_program(&src, Some(&name)).map_err(|e| nvrtc_err("create", e))?);
    // SAFETY: `program` is a live program created above.
    let compiled = unsafe { result::compile_program(program.0, options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(program.0) }
        .map(|raw| {
            let bytes: Vec<u8> = raw
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        })
        .unwrap_or_default();
    if compiled.is_err() {
        return Err(CompileError::Source { log });
    }
    Ok((program, log))
}

/// One output of a compiled program (cubin or PTX) through NVRTC's size/get pair.
fn output(
    program: &Program,
    what: &str,
    size_of: unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult,
    get: unsafe fn(sys::nvrtcProgram, *mut std::ffi::c_char) -> sys::nvrtcResult,
) -> Result<Vec<u8>, CompileError> {
    let mut size = 0usize;
    // SAFETY: `program` compiled successfully; `size` is a valid out-pointer.
    unsafe { size_of(program.0, &mut size) }
        .result()
        .map_err(|e| nvrtc_err(&format!("{what} size"), e))?;
    let mut bytes = vec![0u8; size];
    // SAFETY: `bytes` has exactly the size NVRTC reported.
    unsafe { get(program.0, bytes.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| nvrtc_err(what, e))?;
    Ok(bytes)
}

/// Compiles `source`, which defines `extern "C"` kernel `kernel`, to a cubin for `arch`.
/// (`CubinCache::compile` does the same through a disk cache.)
pub fn compile(source: &str, kernel: &str, arch: &str) -> Result<CompiledKernel, CompileError> {
    check_arch(arch)?;
    run_compile(source, kernel, &cubin_options(arch))
}

/// NVRTC's options for a cubin of `arch`: everything besides the source and the kernel
/// name that decides what it produces.
pub(crate) fn cubin_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        // Leaves out the builtin declarations our kernels never use (textures,
        // surfaces, device-side launch): 5% less compile time, byte-identical cubins
        // (measured on 120 sampled f32, fp16 and matmul kernels; see the README).
        "--minimal".to_string(),
        "--ptxas-options=--verbose".to_string(),
    ]
}

/// Compiles to a cubin with `options` (`cubin_options`) and reads its resource usage.
pub(crate) fn run_compile(
    source: &str,
    kernel: &str,
    options: &[String],
) -> Result<CompiledKernel, CompileError> {
    // Loading the library (once per process, about 0.2 s) is not this kernel's compile.
    nvrtc_lib::ensure_loaded()?;
    let start = Instant::now();
    let (program, log) = run_nvrtc(source, kernel, options)?;
    let cubin = output(
        &program,
        "cubin",
        sys::nvrtcGetCUBINSize,
        sys::nvrtcGetCUBIN,
    )?;
    let compile_ms = start.elapsed().as_secs_f64() * 1e3;
    let resources = cubin::resources(&cubin, kernel, &log)?;
    Ok(CompiledKernel {
        cubin,
        resources,
        log,
        compile_ms,
    })
}

/// Compiles `source` to PTX for the virtual architecture of `arch` (`compute_XY`).
pub fn compile_ptx(source: &str, kernel: &str, arch: &str) -> Result<String, CompileError> {
    check_arch(arch)?;
    let virtual_arch = arch.replacen("sm_", "compute_", 1);
    let options = [
        format!("--gpu-architecture={virtual_arch}"),
        "--std=c++17".to_string(),
    ];
    let (program, _log) = run_nvrtc(source, kernel, &options)?;
    let ptx = output(&program, "ptx", sys::nvrtcGetPTXSize, sys::nvrtcGetPTX)?;
    let text: Vec<u8> = ptx.into_iter().take_while(|&c| c != 0).collect();
    String::from_utf8(text).map_err(|e| nvrtc_err("ptx text", e))
}

#[cfg(test)]
mod tests {
    /// The nice value of the calling thread, from /proc (field 19 of its stat line).
    #[cfg(target_os = "linux")]
    fn nice() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // The command name (field 2) may hold spaces; the fields after it do not.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn background_compiles_lower_only_their_own_thread() {
        let before = nice();
        let lowered = std::thread::spawn(|| {
            super::compile_in_background();
            nice()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, (before + 10).min(19));
        assert_eq!(nice(), before, "the calling thread keeps its priority");
    }
}
