//! Finding and loading the vendor libraries (cuDNN 9, cuBLAS 13) that the baselines
//! call. cudarc opens them by their sonames on first use and panics when that fails, so
//! this module resolves them first: from a path the user gives, from the loader's usual
//! search path, or from the places Python wheels put them (PyTorch ships both inside its
//! environment, e.g. `site-packages/nvidia/cudnn/lib`). A library found in a directory
//! the loader does not search is opened by absolute path together with its siblings
//! (cuDNN's sub-libraries, cuBLAS's cublasLt); later opens by soname then resolve to the
//! already-loaded objects.

use std::path::{Path, PathBuf};
use thiserror::Error;

/// A vendor library the baselines need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    Cudnn,
    Cublas,
}

impl Library {
    pub fn name(self) -> &'static str {
        match self {
            Library::Cudnn => "cuDNN",
            Library::Cublas => "cuBLAS",
        }
    }

    /// The file cudarc opens.
    pub fn soname(self) -> &'static str {
        match self {
            Library::Cudnn => "libcudnn.so.9",
            Library::Cublas => "libcublas.so.13",
        }
    }

    /// Prefix of the library and its siblings in one directory.
    fn family(self) -> &'static str {
        match self {
            Library::Cudnn => "libcudnn",
            Library::Cublas => "libcublas",
        }
    }

    /// The command-line option that names its location.
    pub fn option(self) -> &'static str {
        match self {
            Library::Cudnn => "--cudnn",
            Library::Cublas => "--cublas",
        }
    }
}

#[derive(Debug, Error)]
pub enum VendorError {
    #[error(
        "{lib} not found: no {soname} on the loader's path or under {searched}; pass {option} DIR (the directory holding {soname}, e.g. a PyTorch environment's site-packages/nvidia/.../lib)",
        lib = .lib.name(), soname = .lib.soname(), option = .lib.option()
    )]
    NotFound { lib: Library, searched: String },
    #[error("{lib}: {path} does not hold {soname}", lib = .lib.name(), soname = .lib.soname())]
    NotInGivenPath { lib: Library, path: PathBuf },
    #[error("{lib}: cannot load {path}: {message}", lib = .lib.name())]
    Load {
        lib: Library,
        path: PathBuf,
        message: String,
    },
    #[error("{call} failed: {status}")]
    Call { call: &'static str, status: String },
    #[error(transparent)]
    Cuda(#[from] gpu::cuda::CudaError),
}

/// Where a library was loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The loader's own search path (LD_LIBRARY_PATH, ldconfig).
    LoaderPath,
    Directory(PathBuf),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::LoaderPath => write!(f, "the loader's search path"),
            Source::Directory(d) => write!(f, "{}", d.display()),
        }
    }
}

/// Roots searched for Python environments and CUDA installs, in order.
const ROOTS: [&str; 5] = [
    "/opt",
    "/usr/local",
    "/usr/lib",
    "/usr/lib64",
    "/root/.local",
];
/// How deep below a root a library directory may be.
const MAX_DEPTH: usize = 8;

/// Makes `lib` loadable by soname: from `given` (a directory or the library file), or
/// else the loader's path, or else the first directory below [`ROOTS`] that holds it.
pub fn load(lib: Library, given: Option<&Path>) -> Result<Source, VendorError> {
    if let Some(path) = given {
        let dir = if path.is_file() {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            path.to_path_buf()
        };
        if !dir.join(lib.soname()).exists() {
            return Err(VendorError::NotInGivenPath {
                lib,
                path: path.to_path_buf(),
            });
        }
        load_family(lib, &dir)?;
        return Ok(Source::Directory(dir));
    }
    if opens(lib.soname()) {
        return Ok(Source::LoaderPath);
    }
    let mut roots: Vec<PathBuf> = ROOTS.iter().map(PathBuf::from).collect();
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local"));
    }
    for root in &roots {
        if let Some(dir) = find_dir(root, lib.soname(), MAX_DEPTH) {
            load_family(lib, &dir)?;
            return Ok(Source::Directory(dir));
        }
    }
    Err(VendorError::NotFound {
        lib,
        searched: roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

fn opens(name: &str) -> bool {
    // SAFETY: opening a vendor library runs its initializers, which have no
    // preconditions; the handle is kept so the library stays loaded.
    match unsafe { libloading::Library::new(name) } {
        Ok(handle) => {
            std::mem::forget(handle);
            true
        }
        Err(_) => false,
    }
}

/// Opens every library of `lib`'s family in `dir` by absolute path, retrying until no
/// more load (so dependencies between siblings resolve in any listing order); the
/// main library must be among them.
fn load_family(lib: Library, dir: &Path) -> Result<(), VendorError> {
    let mut pending: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| VendorError::Load {
            lib,
            path: dir.to_path_buf(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(lib.family()) && n.contains(".so"))
        })
        .collect();
    pending.sort();
    loop {
        let before = pending.len();
        pending.retain(|p| !opens(&p.to_string_lossy()));
        if pending.is_empty() || pending.len() == before {
            break;
        }
    }
    let main = dir.join(lib.soname());
    if pending.contains(&main) {
        // SAFETY: as in `opens`; this call only reports why the load fails.
        let message = match unsafe { libloading::Library::new(&main) } {
            Err(e) => e.to_string(),
            Ok(_) => "loaded only on retry".to_string(),
        };
        return Err(VendorError::Load {
            lib,
            path: main,
            message,
        });
    }
    Ok(())
}

/// The first directory (breadth-first, at most `depth` levels below `root`) that holds
/// `file`. Hidden directories and caches are skipped, and inside a Python
/// `site-packages` only the `nvidia` wheels are searched.
pub fn find_dir(root: &Path, file: &str, depth: usize) -> Option<PathBuf> {
    let mut level = vec![root.to_path_buf()];
    for _ in 0..=depth {
        let mut next = Vec::new();
        for dir in level {
            if dir.join(file).is_file() {
                return Some(dir);
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let in_packages = dir
                .file_name()
                .is_some_and(|n| n == "site-packages" || n == "dist-packages");
            let mut children: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    !name.starts_with('.')
                        && name != "__pycache__"
                        && (!in_packages || name == "nvidia")
                })
                .collect();
            children.sort();
            next.extend(children);
        }
        level = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_wheel_library_and_skips_other_packages() {
        let root = tempfile::tempdir().unwrap();
        let packages = root.path().join("venv/lib/python3.12/site-packages");
        let other = packages.join("torch/lib");
        let wheel = packages.join("nvidia/cudnn/lib");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::create_dir_all(&wheel).unwrap();
        // Outside nvidia/ a copy is ignored; the wheel's is found.
        std::fs::write(other.join("libcudnn.so.9"), b"").unwrap();
        std::fs::write(wheel.join("libcudnn.so.9"), b"").unwrap();
        assert_eq!(find_dir(root.path(), "libcudnn.so.9", 8), Some(wheel));
        assert_eq!(find_dir(root.path(), "libcudnn.so.9", 3), None);
        assert_eq!(find_dir(root.path(), "libcublas.so.13", 8), None);
    }

    #[test]
    fn a_given_directory_without_the_library_is_one_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = load(Library::Cudnn, Some(dir.path())).unwrap_err();
        assert!(e.to_string().contains("does not hold libcudnn.so.9"), "{e}");
        let e = VendorError::NotFound {
            lib: Library::Cublas,
            searched: "/opt".into(),
        };
        assert!(e.to_string().contains("pass --cublas DIR"), "{e}");
    }

    #[test]
    fn a_corrupt_library_reports_the_loader_message() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libcublas.so.13"), b"not an ELF").unwrap();
        let e = load(Library::Cublas, Some(dir.path())).unwrap_err();
        assert!(matches!(e, VendorError::Load { .. }), "{e}");
    }
}
