//! Finding and loading NVRTC (CUDA 13) at run time.
//!
//! cudarc opens `libnvrtc.so.13` by name and panics when it is missing; we instead
//! look for the library in the places this project installs or finds it, open it (and
//! its builtins) by full path with `RTLD_GLOBAL`, and report a clean error otherwise.
//! Once a library with the soname `libnvrtc.so.13` is loaded, cudarc's own `dlopen` by
//! name resolves to it.
//!
//! Search order: `$TILESCHED_NVRTC` (a file), the setup script's wheel in
//! `$TILESCHED_CACHE` (default `$XDG_CACHE_HOME/tilesched` or `~/.cache/tilesched`),
//! the CUDA toolkit under `$CUDA_HOME` or `/usr/local/cuda`, then the system loader.

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const LIBRARY: &str = "libnvrtc.so.13";
const BUILTINS: &str = "libnvrtc-builtins.so.13.0";

/// The directory the setup script installs Python wheels into.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TILESCHED_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("tilesched")
}

/// Candidate full paths of `libnvrtc.so.13`, most specific first.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("TILESCHED_NVRTC") {
        out.push(PathBuf::from(p));
    }
    out.push(cache_dir().join("wheels/nvidia/cu13/lib").join(LIBRARY));
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        out.push(Path::new(&home).join("lib64").join(LIBRARY));
    }
    out.push(Path::new("/usr/local/cuda/lib64").join(LIBRARY));
    out
}

/// Why NVRTC cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcLibError {
    #[error(
        "{LIBRARY} (NVRTC of CUDA 13) not found: run scripts/setup.sh, or set TILESCHED_NVRTC to its path (looked in: {})",
        tried.join(", ")
    )]
    NotFound { tried: Vec<String> },
    #[error("nvrtcVersion failed: {0}")]
    Version(String),
}

/// Loads NVRTC once per process; the error says where it was looked for.
pub fn ensure_loaded() -> Result<(), NvrtcLibError> {
    static LOADED: OnceLock<Result<(), NvrtcLibError>> = OnceLock::new();
    LOADED.get_or_init(load).clone()
}

fn open(path: &Path) -> Option<Library> {
    // SAFETY: loading NVIDIA's NVRTC runs only its library initializers, which have
    // no preconditions on this process.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.ok()
}

fn load() -> Result<(), NvrtcLibError> {
    let tried = candidates();
    for path in &tried {
        if !path.is_file() {
            continue;
        }
        // The builtins live beside the library; load them first so NVRTC finds them
        // however it looks them up.
        if let Some(lib) = path.parent().and_then(|dir| open(&dir.join(BUILTINS))) {
            std::mem::forget(lib);
        }
        if let Some(lib) = open(path) {
            // Kept loaded for the life of the process: cudarc holds symbols from it.
            std::mem::forget(lib);
            return Ok(());
        }
    }
    // Last, the system loader's search path (LD_LIBRARY_PATH, ldconfig).
    if let Some(lib) = open(Path::new(LIBRARY)) {
        std::mem::forget(lib);
        return Ok(());
    }
    Err(NvrtcLibError::NotFound {
        tried: tried.iter().map(|p| p.display().to_string()).collect(),
    })
}

/// NVRTC's version, e.g. (13, 0).
pub fn version() -> Result<(i32, i32), NvrtcLibError> {
    ensure_loaded()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded; both pointers are valid for writes.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| NvrtcLibError::Version(format!("{e:?}")))?;
    Ok((major, minor))
}
