//! Finding and loading the vendor libraries (cuDNN 9, cuBLAS 13 with cuBLASLt) that the
//! baselines call, and the one rule for which copy is used.
//!
//! A machine may hold several copies: the GPU machines carry cuDNN 9.14 on the loader's
//! path and 9.19 inside PyTorch's environment (`site-packages/nvidia/cudnn/lib`). The
//! baseline should be the best the vendor offers, so the newest copy found is used
//! unless the user names a directory. Versions are read without loading anything (the
//! real file's name, the wheel's `.dist-info`, or the header beside the library), since
//! a library once loaded cannot be replaced in the process.
//!
//! Loading one copy must not pull in pieces of another. cuDNN 9 is a small front library
//! that opens its sub-libraries (`libcudnn_graph.so.9`, `_ops`, `_cnn`, `_adv`,
//! `_engines_*`, `_heuristic`) by soname at run time, and the sub-libraries name each
//! other as ELF dependencies; the dynamic loader resolves both through its search path,
//! where the other copy lives (cuDNN then fails with
//! `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`). So every library of the family is opened
//! first, by absolute path, dependencies before dependents (read from each file's
//! `DT_NEEDED`), with `RTLD_GLOBAL`: a later lookup by soname then finds the copy already
//! loaded. The vendor functions are then resolved from these very handles (see
//! [`Loaded::function`]) rather than through a second lookup by name, so the version
//! reported is the version called.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

/// A vendor library the baselines need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

    /// The main library's file name (its soname).
    pub fn soname(self) -> &'static str {
        match self {
            Library::Cudnn => "libcudnn.so.9",
            Library::Cublas => "libcublas.so.13",
        }
    }

    /// Prefix of the library and its siblings in one directory (cuBLAS's includes
    /// `libcublasLt`).
    fn family(self) -> &'static str {
        match self {
            Library::Cudnn => "libcudnn",
            Library::Cublas => "libcublas",
        }
    }

    /// The soname suffix every library of the family carries, e.g. `.so.9`.
    fn suffix(self) -> &'static str {
        match self {
            Library::Cudnn => ".so.9",
            Library::Cublas => ".so.13",
        }
    }

    /// The header that states the version, and its three macro names.
    fn version_header(self) -> (&'static str, [&'static str; 3]) {
        match self {
            Library::Cudnn => (
                "cudnn_version.h",
                ["CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL"],
            ),
            Library::Cublas => (
                "cublas_api.h",
                ["CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH"],
            ),
        }
    }

    /// How the Python wheels that ship the library begin their `.dist-info` name
    /// (`nvidia_cudnn_cu13-9.19.0.56.dist-info`, `nvidia_cublas-13.1.0.3.dist-info`).
    fn wheel_prefix(self) -> &'static str {
        match self {
            Library::Cudnn => "nvidia_cudnn",
            Library::Cublas => "nvidia_cublas",
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
    #[error(
        "{lib} from {loaded} is already loaded in this process; {asked} cannot be loaded beside it",
        lib = .lib.name(), loaded = .loaded.display(), asked = .asked.display()
    )]
    AlreadyLoaded {
        lib: Library,
        loaded: PathBuf,
        asked: PathBuf,
    },
    #[error("{lib} is not loaded (call vendor::load first)", lib = .lib.name())]
    NotLoaded { lib: Library },
    #[error("{lib}: no function {name} in {path}: {message}", lib = .lib.name(), path = .path.display())]
    Symbol {
        lib: Library,
        name: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{call} failed: {status}")]
    Call { call: &'static str, status: String },
    /// The task's types or layout have no routine in the vendor library.
    #[error("{lib} has no routine for {what}", lib = .lib.name())]
    Unsupported { lib: Library, what: String },
    #[error(transparent)]
    Cuda(#[from] gpu::cuda::CudaError),
}

/// A library version, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// Parses `9.19.0`, `9.19.0.56` (a wheel's fourth component is dropped) or `13.1`.
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().unwrap_or(Some(0))?;
        Some(Version(major, minor, patch))
    }

    /// cuDNN's and cuBLAS's integer form: `major * 10000 + minor * 100 + patch` (cuDNN
    /// 9.19.0 = 91900, cuBLAS 13.1.0 = 130100).
    pub fn from_code(code: usize) -> Version {
        let code = u32::try_from(code).unwrap_or(u32::MAX);
        Version(code / 10000, (code % 10000) / 100, code % 100)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
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

/// A directory holding a copy of the library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub dir: PathBuf,
    /// Read from the files (see the module doc); `None` when nothing states it.
    pub version: Option<Version>,
    /// Whether the loader's search path (LD_LIBRARY_PATH, ld.so.cache) leads here.
    pub on_loader_path: bool,
}

/// Roots searched for Python environments and CUDA installs, in order.
const ROOTS: [&str; 5] = [
    "/opt",
    "/usr/local",
    "/usr/lib",
    "/usr/lib64",
    "/root/.local",
];
/// How deep below a root a library directory may be
/// (`/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib` is 8 below `/opt`).
const MAX_DEPTH: usize = 8;

/// Every copy of `lib` found on this machine, the one to use first: newest version,
/// then the loader's path, then search order (see [`order`]).
pub fn candidates(lib: Library) -> Vec<Candidate> {
    let loader = loader_dirs(lib.soname());
    let mut roots = python_roots();
    roots.extend(ROOTS.iter().map(PathBuf::from));
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local"));
    }
    let searched = roots
        .iter()
        .flat_map(|root| find_dirs(root, lib.soname(), MAX_DEPTH));
    let mut found: Vec<Candidate> = Vec::new();
    let mut seen = Vec::new();
    for (dir, on_loader_path) in loader
        .into_iter()
        .map(|d| (d, true))
        .chain(searched.map(|d| (d, false)))
    {
        let canonical = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        if seen.contains(&canonical) {
            continue;
        }
        seen.push(canonical);
        found.push(Candidate {
            version: file_version(lib, &dir),
            dir,
            on_loader_path,
        });
    }
    order(found)
}

/// Sorts candidates: the newest known version first; on a tie (or with no version
/// known) the loader's path before the rest; otherwise the order given.
pub fn order(mut candidates: Vec<Candidate>) -> Vec<Candidate> {
    // A stable sort keeps the search order among equals.
    candidates.sort_by(|a, b| {
        b.version
            .cmp(&a.version)
            .then(b.on_loader_path.cmp(&a.on_loader_path))
    });
    candidates
}

/// The directories the dynamic loader would find `soname` in: LD_LIBRARY_PATH's, then
/// ld.so.cache's (through `ldconfig -p`).
fn loader_dirs(soname: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.join(soname).is_file());
    let listing = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|exe| std::process::Command::new(exe).arg("-p").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    dirs.extend(ldconfig_dirs(&listing, soname));
    dirs
}

/// The directories of `soname` in `ldconfig -p`'s listing
/// (`\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9`), for
/// this process's word size.
pub fn ldconfig_dirs(listing: &str, soname: &str) -> Vec<PathBuf> {
    let wide = cfg!(target_pointer_width = "64");
    listing
        .lines()
        .filter_map(|line| {
            let (left, path) = line.trim().split_once(" => ")?;
            let (name, tags) = left.split_once(' ')?;
            // 64-bit entries say so ("x86-64", "AArch64", "64bit"); 32-bit ones do not.
            let is64 = tags.contains("64");
            (name == soname && is64 == wide)
                .then(|| Path::new(path.trim()).parent().map(Path::to_path_buf))
                .flatten()
        })
        .collect()
}

/// The `site-packages` of the Python environments whose `python3` is on PATH (a
/// virtual environment such as PyTorch's `/opt/torch/.venv` among them).
fn python_roots() -> Vec<PathBuf> {
    let Some(path) = std::env::var_os("PATH") else {
        return Vec::new();
    };
    let mut roots = Vec::new();
    for bin in std::env::split_paths(&path) {
        if !bin.join("python3").exists() {
            continue;
        }
        let Some(prefix) = bin.parent() else { continue };
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .map(|p| p.join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        roots.extend(found);
    }
    roots
}

/// The version the files of `dir` state for `lib`, without loading anything: the real
/// file's name (`libcudnn.so.9 -> libcudnn.so.9.14.0`), else the wheel's `.dist-info`
/// that lists the library, else the header in `dir/../include`.
pub fn file_version(lib: Library, dir: &Path) -> Option<Version> {
    let main = dir.join(lib.soname());
    let from_name = std::fs::canonicalize(&main).ok().and_then(|real| {
        let name = real.file_name()?.to_str()?.to_string();
        let rest = name.strip_prefix(&format!("{}.", lib.soname()))?;
        Version::parse(&format!("{}.{rest}", &lib.suffix()[4..]))
    });
    from_name
        .or_else(|| wheel_version(lib, dir))
        .or_else(|| header_version(lib, &dir.join("../include")))
}

/// The version of the wheel whose RECORD lists `dir`'s library.
fn wheel_version(lib: Library, dir: &Path) -> Option<Version> {
    let packages = dir
        .ancestors()
        .find(|a| {
            a.file_name()
                .is_some_and(|n| n == "site-packages" || n == "dist-packages")
        })?
        .to_path_buf();
    let relative = dir.strip_prefix(&packages).ok()?.join(lib.soname());
    let relative = relative.to_str()?.to_string();
    let mut infos: Vec<PathBuf> = std::fs::read_dir(&packages)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(lib.wheel_prefix()) && n.ends_with(".dist-info"))
        })
        .collect();
    infos.sort();
    infos.into_iter().find_map(|info| {
        let record = std::fs::read_to_string(info.join("RECORD")).ok()?;
        if !record
            .lines()
            .any(|l| l.split(',').next() == Some(&relative))
        {
            return None;
        }
        let name = info.file_name()?.to_str()?;
        let version = name.strip_suffix(".dist-info")?.split_once('-')?.1;
        Version::parse(version)
    })
}

/// The version a header in `include` states (`#define CUDNN_MAJOR 9` ...).
fn header_version(lib: Library, include: &Path) -> Option<Version> {
    let (file, names) = lib.version_header();
    let text = std::fs::read_to_string(include.join(file)).ok()?;
    parse_header_version(&text, names)
}

/// The three `#define NAME value` of `names` in `text`.
pub fn parse_header_version(text: &str, names: [&str; 3]) -> Option<Version> {
    let value = |name: &str| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(name))
                .then(|| words.next()?.parse::<u32>().ok())
                .flatten()
        })
    };
    Some(Version(
        value(names[0])?,
        value(names[1])?,
        value(names[2])?,
    ))
}

/// A library loaded for the baselines: its directory, its version and the open handles
/// of every library of its family, kept for the life of the process.
pub struct Loaded {
    pub lib: Library,
    pub dir: PathBuf,
    /// What the files state (see [`file_version`]); the library's own answer once
    /// loaded is what reports use (`cudnn::version`, `cublas::version`).
    pub file_version: Option<Version>,
    pub on_loader_path: bool,
    /// Whether the user named the directory (else it is the newest found).
    pub given: bool,
    /// Every copy found when choosing (none when the user named one), newest first.
    pub found: Vec<Candidate>,
    /// (file name, handle), dependencies first.
    handles: Vec<(String, libloading::os::unix::Library)>,
}

impl Loaded {
    /// The function `name` of the loaded family member `file` (e.g. `libcublasLt.so.13`;
    /// `None`: the main library), looked up in that handle and its dependencies only.
    ///
    /// # Safety
    /// `T` must be the function's exact C signature.
    pub unsafe fn function<T: Copy>(
        &self,
        file: Option<&str>,
        name: &'static str,
    ) -> Result<T, VendorError> {
        let file = file.unwrap_or(self.lib.soname());
        let path = self.dir.join(file);
        let handle = self
            .handles
            .iter()
            .find(|(f, _)| f == file)
            .map(|(_, h)| h)
            .ok_or_else(|| VendorError::Symbol {
                lib: self.lib,
                name,
                path: path.clone(),
                message: "that library was not loaded".to_string(),
            })?;
        // SAFETY: the caller guarantees `T` is the symbol's type; the handle stays open
        // for the life of the process, so the pointer never dangles.
        unsafe { handle.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| VendorError::Symbol {
                lib: self.lib,
                name,
                path,
                message: e.to_string(),
            })
    }
}

/// The libraries loaded so far (at most one copy of each: a second could not be
/// loaded beside the first, see the module doc). Leaked, so references are `'static`.
static LOADED: Mutex<Vec<&'static Loaded>> = Mutex::new(Vec::new());

/// The copy of `lib` loaded in this process, if any.
pub fn loaded(lib: Library) -> Option<&'static Loaded> {
    LOADED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|l| l.lib == lib)
        .copied()
}

/// Loads `lib`: from `given` (a directory, or the library file), else the newest copy
/// found (see [`candidates`]). Loading twice returns the first copy, unless `given`
/// names another directory.
pub fn load_library(lib: Library, given: Option<&Path>) -> Result<&'static Loaded, VendorError> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let asked = match given {
        Some(path) => {
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
            Some(dir)
        }
        None => None,
    };
    if let Some(existing) = loaded.iter().find(|l| l.lib == lib) {
        return match &asked {
            Some(dir) if !same_dir(dir, &existing.dir) => Err(VendorError::AlreadyLoaded {
                lib,
                loaded: existing.dir.clone(),
                asked: dir.clone(),
            }),
            _ => Ok(existing),
        };
    }
    let given = asked.is_some();
    let (candidate, found) = match asked {
        Some(dir) => (
            Candidate {
                version: file_version(lib, &dir),
                on_loader_path: loader_dirs(lib.soname()).iter().any(|d| same_dir(d, &dir)),
                dir,
            },
            Vec::new(),
        ),
        None => {
            let found = candidates(lib);
            let first = found
                .first()
                .cloned()
                .ok_or_else(|| VendorError::NotFound {
                    lib,
                    searched: searched_description(),
                })?;
            (first, found)
        }
    };
    let handles = open_family(lib, &candidate.dir)?;
    let entry: &'static Loaded = Box::leak(Box::new(Loaded {
        lib,
        dir: candidate.dir,
        file_version: candidate.version,
        on_loader_path: candidate.on_loader_path,
        given,
        found,
        handles,
    }));
    loaded.push(entry);
    Ok(entry)
}

/// Makes `lib` callable ([`load_library`]) and says where it came from.
pub fn load(lib: Library, given: Option<&Path>) -> Result<Source, VendorError> {
    load_library(lib, given).map(|l| Source::Directory(l.dir.clone()))
}

fn same_dir(a: &Path, b: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    canonical(a) == canonical(b)
}

fn searched_description() -> String {
    let mut places = vec![
        "LD_LIBRARY_PATH".to_string(),
        "ld.so.cache".to_string(),
        "the site-packages of each python3 on PATH".to_string(),
    ];
    places.extend(ROOTS.iter().map(|r| r.to_string()));
    places.push("~/.local".to_string());
    places.join(", ")
}

/// The libraries of `lib`'s family in `dir` (file names ending in the family's soname
/// suffix, so development symlinks and fully versioned duplicates are left out), in an
/// order that opens every dependency before its dependents.
pub fn family_files(lib: Library, dir: &Path) -> Result<Vec<String>, VendorError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| VendorError::Load {
            lib,
            path: dir.to_path_buf(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(lib.family()) && n.ends_with(lib.suffix()))
        .collect();
    names.sort();
    let needs: Vec<(String, Vec<String>)> = names
        .into_iter()
        .map(|n| {
            let needed = needed(&dir.join(&n)).unwrap_or_else(|| fallback_needs(lib, &n));
            (n, needed)
        })
        .collect();
    Ok(dependency_order(needs, lib.soname()))
}

/// Orders `(file, files it needs)` so that each file comes after what it needs among
/// the given ones; `last` (the main library, which opens the others at run time) goes
/// last. A cycle (none is known) is broken in name order.
pub fn dependency_order(mut pending: Vec<(String, Vec<String>)>, last: &str) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    while !pending.is_empty() {
        let names: Vec<String> = pending.iter().map(|(n, _)| n.clone()).collect();
        let ready = pending.iter().position(|(name, needs)| {
            (name != last || pending.len() == 1)
                && needs
                    .iter()
                    .all(|d| !names.contains(d) || order.contains(d) || d == name)
        });
        let (name, _) = pending.remove(ready.unwrap_or(0));
        order.push(name);
    }
    order
}

/// What cuDNN 9's sub-libraries are known to need, for a file whose ELF cannot be read:
/// everything needs the graph library, and cnn and adv need ops.
fn fallback_needs(lib: Library, name: &str) -> Vec<String> {
    match lib {
        Library::Cudnn if name != "libcudnn_graph.so.9" => {
            let mut needs = vec!["libcudnn_graph.so.9".to_string()];
            if name.starts_with("libcudnn_cnn") || name.starts_with("libcudnn_adv") {
                needs.push("libcudnn_ops.so.9".to_string());
            }
            needs
        }
        Library::Cublas if name == "libcublas.so.13" => vec!["libcublasLt.so.13".to_string()],
        _ => Vec::new(),
    }
}

/// The `DT_NEEDED` entries of an ELF shared library, reading only the headers and the
/// dynamic section (cuDNN's engine libraries are hundreds of megabytes).
fn needed(path: &Path) -> Option<Vec<String>> {
    use object::read::elf::FileHeader;
    let file = std::fs::File::open(path).ok()?;
    let cache = object::ReadCache::new(file);
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&cache).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, &cache).ok()?;
    let table = sections.dynamic_table(endian, &cache).ok()?;
    Some(
        table
            .iter()
            .filter(|d| d.tag == object::elf::DT_NEEDED)
            .filter_map(|d| table.string(d).ok())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// Opens every library of `lib`'s family in `dir` by absolute path, in dependency order,
/// with `RTLD_NOW | RTLD_GLOBAL` (see the module doc).
fn open_family(
    lib: Library,
    dir: &Path,
) -> Result<Vec<(String, libloading::os::unix::Library)>, VendorError> {
    use libloading::os::unix::{Library as Handle, RTLD_GLOBAL, RTLD_NOW};
    let files = family_files(lib, dir)?;
    if !files.iter().any(|f| f == lib.soname()) {
        return Err(VendorError::NotInGivenPath {
            lib,
            path: dir.to_path_buf(),
        });
    }
    let mut handles = Vec::new();
    for file in files {
        let path = dir.join(&file);
        // SAFETY: opening a vendor library runs its initializers, which have no
        // preconditions; the handle is kept for the life of the process.
        let handle = unsafe { Handle::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
            VendorError::Load {
                lib,
                path: path.clone(),
                message: e.to_string(),
            }
        })?;
        handles.push((file, handle));
    }
    Ok(handles)
}

/// Every directory (breadth-first, at most `depth` levels below `root`) that holds
/// `file`. Hidden directories and caches are skipped (but a virtual environment's
/// `.venv` is searched), and inside a Python `site-packages` only the `nvidia` wheels.
pub fn find_dirs(root: &Path, file: &str, depth: usize) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut level = vec![root.to_path_buf()];
    for _ in 0..=depth {
        let mut next = Vec::new();
        for dir in level {
            if dir.join(file).is_file() {
                found.push(dir.clone());
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
                    (!name.starts_with('.') || name == ".venv")
                        && name != "__pycache__"
                        && (!in_packages || name == "nvidia")
                })
                .collect();
            children.sort();
            next.extend(children);
        }
        level = next;
    }
    found
}

/// The first directory [`find_dirs`] finds.
pub fn find_dir(root: &Path, file: &str, depth: usize) -> Option<PathBuf> {
    find_dirs(root, file, depth).into_iter().next()
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
    fn a_virtual_environment_is_searched_and_every_copy_found() {
        let root = tempfile::tempdir().unwrap();
        let venv = root
            .path()
            .join("torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib");
        let system = root.path().join("cuda/lib64");
        let hidden = root.path().join(".cache/lib");
        for d in [&venv, &system, &hidden] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("libcudnn.so.9"), b"").unwrap();
        }
        // Breadth-first: the shallower directory first; `.cache` is not searched.
        assert_eq!(
            find_dirs(root.path(), "libcudnn.so.9", 8),
            vec![system, venv]
        );
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

    fn candidate(dir: &str, version: Option<Version>, on_loader_path: bool) -> Candidate {
        Candidate {
            dir: dir.into(),
            version,
            on_loader_path,
        }
    }

    #[test]
    fn the_newest_copy_comes_first_then_the_loader_path() {
        let found = vec![
            candidate("/usr/lib/x86_64-linux-gnu", Some(Version(9, 14, 0)), true),
            candidate("/opt/unknown", None, false),
            candidate(
                "/opt/torch/nvidia/cudnn/lib",
                Some(Version(9, 19, 0)),
                false,
            ),
            candidate("/opt/other", Some(Version(9, 14, 0)), false),
            candidate("/opt/old", Some(Version(9, 2, 1)), false),
        ];
        let dirs: Vec<PathBuf> = order(found).into_iter().map(|c| c.dir).collect();
        let expect: Vec<PathBuf> = [
            "/opt/torch/nvidia/cudnn/lib",
            "/usr/lib/x86_64-linux-gnu",
            "/opt/other",
            "/opt/old",
            "/opt/unknown",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, expect);
        // 9.19 is newer than 9.2 (numeric, not textual, comparison).
        assert!(Version(9, 19, 0) > Version(9, 2, 9));
        // Nothing known: the loader's path first, as before versions were read.
        let unknown = vec![candidate("/a", None, false), candidate("/b", None, true)];
        assert_eq!(order(unknown)[0].dir, PathBuf::from("/b"));
    }

    #[test]
    fn versions_parse_from_names_codes_and_headers() {
        assert_eq!(Version::parse("9.19.0.56"), Some(Version(9, 19, 0)));
        assert_eq!(Version::parse("13.1"), Some(Version(13, 1, 0)));
        assert_eq!(Version::parse("9.x"), None);
        assert_eq!(Version::from_code(91900), Version(9, 19, 0));
        assert_eq!(Version::from_code(130100), Version(13, 1, 0));
        assert_eq!(Version(9, 14, 0).to_string(), "9.14.0");
        let header = "#ifndef CUDNN_VERSION_H_\n#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 19\n#define CUDNN_PATCHLEVEL 0\n#define CUDNN_VERSION (CUDNN_MAJOR * 10000)\n";
        assert_eq!(
            parse_header_version(header, Library::Cudnn.version_header().1),
            Some(Version(9, 19, 0))
        );
    }

    #[test]
    fn file_versions_come_from_the_real_name_the_wheel_or_the_header() {
        let root = tempfile::tempdir().unwrap();
        // A system install: libcudnn.so.9 -> libcudnn.so.9.14.0.
        let system = root.path().join("system");
        std::fs::create_dir_all(&system).unwrap();
        std::fs::write(system.join("libcudnn.so.9.14.0"), b"").unwrap();
        std::os::unix::fs::symlink("libcudnn.so.9.14.0", system.join("libcudnn.so.9")).unwrap();
        assert_eq!(
            file_version(Library::Cudnn, &system),
            Some(Version(9, 14, 0))
        );
        // A wheel: the dist-info whose RECORD lists the library.
        let packages = root.path().join("lib/python3.12/site-packages");
        let wheel = packages.join("nvidia/cudnn/lib");
        std::fs::create_dir_all(&wheel).unwrap();
        std::fs::write(wheel.join("libcudnn.so.9"), b"").unwrap();
        let info = packages.join("nvidia_cudnn_cu13-9.19.0.56.dist-info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::write(
            info.join("RECORD"),
            "nvidia/cudnn/lib/libcudnn.so.9,sha256=x,1\nnvidia/cudnn/lib/libcudnn_ops.so.9,sha256=y,2\n",
        )
        .unwrap();
        let unrelated = packages.join("nvidia_cudnn_cu12-9.1.0.70.dist-info");
        std::fs::create_dir_all(&unrelated).unwrap();
        std::fs::write(unrelated.join("RECORD"), "nvidia/cudnn12/lib/x,,\n").unwrap();
        assert_eq!(
            file_version(Library::Cudnn, &wheel),
            Some(Version(9, 19, 0))
        );
        // A tarball: the header beside the library.
        let tarball = root.path().join("cudnn/lib");
        std::fs::create_dir_all(&tarball).unwrap();
        std::fs::create_dir_all(root.path().join("cudnn/include")).unwrap();
        std::fs::write(tarball.join("libcublas.so.13"), b"").unwrap();
        std::fs::write(
            root.path().join("cudnn/include/cublas_api.h"),
            "#define CUBLAS_VER_MAJOR 13\n#define CUBLAS_VER_MINOR 1\n#define CUBLAS_VER_PATCH 0\n",
        )
        .unwrap();
        assert_eq!(
            file_version(Library::Cublas, &tarball),
            Some(Version(13, 1, 0))
        );
        assert_eq!(file_version(Library::Cudnn, &tarball), None);
    }

    #[test]
    fn ldconfig_listing_gives_the_loader_directories() {
        let listing = "1234 libs found in cache `/etc/ld.so.cache'\n\tlibcudnn_ops.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn_ops.so.9\n\tlibcudnn.so.9 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so.9\n\tlibcudnn.so.9 (libc6) => /usr/lib/i386-linux-gnu/libcudnn.so.9\n\tlibcudnn.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudnn.so\n";
        assert_eq!(
            ldconfig_dirs(listing, "libcudnn.so.9"),
            vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")]
        );
    }

    #[test]
    fn sub_libraries_open_before_what_needs_them_and_the_main_library_last() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let needs = vec![
            ("libcudnn.so.9".to_string(), s(&[])),
            (
                "libcudnn_adv.so.9".to_string(),
                s(&["libcudnn_ops.so.9", "libcudnn_graph.so.9", "libz.so.1"]),
            ),
            (
                "libcudnn_cnn.so.9".to_string(),
                s(&["libcudnn_ops.so.9", "libcudnn_graph.so.9"]),
            ),
            (
                "libcudnn_engines_precompiled.so.9".to_string(),
                s(&["libcudnn_graph.so.9"]),
            ),
            ("libcudnn_graph.so.9".to_string(), s(&["libc.so.6"])),
            ("libcudnn_ops.so.9".to_string(), s(&["libcudnn_graph.so.9"])),
        ];
        let order = dependency_order(needs, "libcudnn.so.9");
        let at = |n: &str| order.iter().position(|o| o == n).unwrap();
        assert_eq!(order.len(), 6);
        assert_eq!(order.last().unwrap(), "libcudnn.so.9");
        assert_eq!(order[0], "libcudnn_graph.so.9");
        assert!(at("libcudnn_ops.so.9") < at("libcudnn_adv.so.9"));
        assert!(at("libcudnn_ops.so.9") < at("libcudnn_cnn.so.9"));
        // Without ELF to read, the known needs give the same shape.
        let fallback: Vec<(String, Vec<String>)> = [
            "libcudnn.so.9",
            "libcudnn_adv.so.9",
            "libcudnn_graph.so.9",
            "libcudnn_ops.so.9",
        ]
        .iter()
        .map(|n| (n.to_string(), fallback_needs(Library::Cudnn, n)))
        .collect();
        assert_eq!(
            dependency_order(fallback, "libcudnn.so.9"),
            s(&[
                "libcudnn_graph.so.9",
                "libcudnn_ops.so.9",
                "libcudnn_adv.so.9",
                "libcudnn.so.9"
            ])
        );
    }

    #[test]
    fn family_files_leave_out_symlinks_of_other_names_and_read_dt_needed() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "libcublas.so",
            "libcublas.so.13",
            "libcublas.so.13.1.0.3",
            "libcublasLt.so.13",
            "libcudnn.so.9",
        ] {
            std::fs::write(dir.path().join(name), b"not an ELF").unwrap();
        }
        // Not ELF: the known needs put cublasLt first.
        assert_eq!(
            family_files(Library::Cublas, dir.path()).unwrap(),
            vec!["libcublasLt.so.13", "libcublas.so.13"]
        );
        // A real ELF: this test binary's own DT_NEEDED includes the C library.
        let exe = std::env::current_exe().unwrap();
        let needs = needed(&exe).unwrap();
        assert!(needs.iter().any(|n| n.starts_with("libc.so")), "{needs:?}");
    }
}
