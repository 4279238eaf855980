//! The deploy cache: the best cubin of each (GPU, task) the two-level pipeline produced,
//! ready to load and launch without searching or compiling anything.
//!
//! Stage 1 leaves the fastest tiled kernel of a task, stage 2 possibly a faster
//! reordering of its SASS; whichever wins is what an application should run. Tuning takes
//! minutes to hours per task and its result is only valid on the GPU it was measured on,
//! so the result is kept per (device name, compute capability, task key), together with
//! everything needed to launch it (kernel name, grid, block, dynamic shared memory,
//! whether the output must be zeroed first) and the sha256 of the cubin, so that a
//! damaged or swapped file is refused rather than launched.
//!
//! Layout of a cache directory `DIR`:
//!
//! - `DIR/index.json`: every entry (`{"version": 1, "entries": [...]}`);
//! - `DIR/cubins/<gpu>-sm<XY>-<task>-<sha256 prefix>.cubin`: the cubins, named by their
//!   content, so a replaced kernel never overwrites the file the index still points to.
//!
//! An entry is checked before it is written and again whenever the index is read
//! (`entry`), so that a launch never takes parameters its kernel does not.
//!
//! Every file is written to a temporary file in the same directory and then renamed over
//! its final name, and the cubin is in place before the index that names it: an
//! interrupted store leaves either the old index or the new one, never a broken one (at
//! worst an unreferenced cubin). One writer at a time: two processes storing into the same
//! cache concurrently do not corrupt it, but the last index written wins (the command
//! line holds a lock on the directory while it writes).

use crate::RuntimeError;
use crate::entry::{self, EntryError};
use gpu::{LaunchConfig, Task};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Name of the index file inside a cache directory.
pub const INDEX_FILE: &str = "index.json";
/// Folder of the cubins inside a cache directory.
pub const CUBIN_DIR: &str = "cubins";
/// Version of the index format this code reads and writes.
const INDEX_VERSION: u32 = 1;
/// The creation note of entries this build writes.
pub const TOOL_VERSION: &str = concat!("tilesched ", env!("CARGO_PKG_VERSION"));

/// Which stage produced the deployed kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The tiled kernel as NVRTC compiled it (stage 2 found nothing faster or did not run).
    Stage1,
    /// A SASS reordering of it (stage 2).
    Sass,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Stage1 => "stage1",
            Stage::Sass => "sass",
        })
    }
}

/// One deployed kernel: the best of a task on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployEntry {
    /// Device name as the driver reports it, e.g. "NVIDIA H100 80GB HBM3".
    pub gpu: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Task key, as `tilesched workloads` prints it.
    pub task: String,
    /// The task itself (operator, shape, types, epilogue): what the kernel's parameters
    /// are. Absent from entries written before it was recorded; the runtime refuses to
    /// launch those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Task>,
    /// Name of the kernel function inside the cubin.
    pub kernel: String,
    pub launch: LaunchConfig,
    /// The cubin's path relative to the cache directory (`cubins/<name>.cubin`).
    pub cubin: String,
    /// sha256 of the cubin, lowercase hex.
    pub sha256: String,
    /// Time of the stage-1 kernel, µs.
    pub stage1_us: f64,
    /// Time of this kernel, µs (equal to `stage1_us` when `stage` is `Stage1`).
    pub final_us: f64,
    pub stage: Stage,
    /// What wrote the entry (tool and version).
    pub created_by: String,
}

/// Everything of an entry but its cubin's file name and hash, which `store` derives.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    pub gpu: String,
    pub compute_capability: (u32, u32),
    pub task: String,
    /// The task; its key must be `task`.
    pub shape: Task,
    pub kernel: String,
    pub launch: LaunchConfig,
    pub stage1_us: f64,
    pub final_us: f64,
    pub stage: Stage,
    /// Usually [`TOOL_VERSION`].
    pub created_by: String,
}

/// What `store` did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StoreAction {
    /// There was no entry for the (GPU, task); the new one was added.
    Added,
    /// The new kernel is faster than the entry it replaced.
    Replaced { previous_final_us: f64 },
    /// The cached kernel is as fast or faster; it was kept and nothing was written.
    KeptExisting,
}

/// The result of `store`: the entry now in the cache for the (GPU, task), which is the
/// existing one when `action` is `KeptExisting`.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub entry: DeployEntry,
    pub action: StoreAction,
}

#[derive(Serialize, Deserialize)]
struct Index {
    version: u32,
    entries: Vec<DeployEntry>,
}

/// A deploy cache directory and its index, as read when it was opened.
#[derive(Debug)]
pub struct DeployCache {
    dir: PathBuf,
    entries: Vec<DeployEntry>,
}

impl DeployCache {
    /// The cache's directory.
    pub fn root(&self) -> &Path {
        &self.dir
    }

    /// Opens the cache in `dir`, creating the directory (and an empty cache) if missing.
    /// A corrupt `index.json` is an error, never silently replaced.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, RuntimeError> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir.join(CUBIN_DIR)).map_err(|e| {
            RuntimeError::Cache(format!("cannot create deploy cache {}: {e}", dir.display()))
        })?;
        Self::load(dir)
    }

    /// Reads the cache in the existing directory `dir`, writing nothing: a missing
    /// directory is an error, a directory without `index.json` an empty cache. Every
    /// entry is checked (`entry`: its task, its cubin's hash, its kernel's parameters
    /// against its buffers and tensor maps); one that fails fails the whole cache, naming
    /// it: a deploy cache is a build artifact, so a bad entry was edited or damaged.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, RuntimeError> {
        let dir = dir.as_ref();
        let dir = std::path::absolute(dir)
            .map_err(|e| RuntimeError::Cache(format!("deploy cache {}: {e}", dir.display())))?;
        if !dir.is_dir() {
            return Err(RuntimeError::Cache(format!(
                "deploy cache {} does not exist (or is not a directory)",
                dir.display()
            )));
        }
        let index_path = dir.join(INDEX_FILE);
        let text = match fs::read_to_string(&index_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(DeployCache {
                    dir,
                    entries: Vec::new(),
                });
            }
            Err(e) => {
                return Err(RuntimeError::Cache(format!(
                    "cannot read {}: {e}",
                    index_path.display()
                )));
            }
        };
        let corrupt = |why: String| {
            RuntimeError::Cache(format!(
                "deploy cache index {} is corrupt ({why}); move it aside to start an empty cache",
                index_path.display()
            ))
        };
        let index: Index = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if index.version != INDEX_VERSION {
            return Err(corrupt(format!(
                "format version {}, this build reads {INDEX_VERSION}",
                index.version
            )));
        }
        for (i, e) in index.entries.iter().enumerate() {
            if !is_cubin_name(&e.cubin) {
                return Err(corrupt(format!(
                    "entry of task {} names cubin '{}' outside {CUBIN_DIR}/",
                    e.task, e.cubin
                )));
            }
            if index.entries[..i].iter().any(|o| same_key(o, e)) {
                return Err(corrupt(format!(
                    "two entries for task {} on {}",
                    e.task,
                    gpu_label(&e.gpu, e.compute_capability)
                )));
            }
        }
        let cache = DeployCache {
            dir,
            entries: index.entries,
        };
        // An entry written before tasks were recorded loads; `params_of` refuses to
        // launch it, naming it.
        for e in cache.entries.iter().filter(|e| e.shape.is_some()) {
            // The task first: an edited shape is named as such, whatever its cubin.
            entry::task_of(e).map_err(|why| cache.bad_entry(e, why))?;
            let cubin = cache.verify(e)?;
            entry::check(e, &cubin).map_err(|why| cache.bad_entry(e, why))?;
        }
        Ok(cache)
    }

    /// The error of an entry that fails a check of `entry`.
    pub(crate) fn bad_entry(&self, e: &DeployEntry, why: EntryError) -> RuntimeError {
        RuntimeError::BadEntry {
            cache: self.dir.display().to_string(),
            task: e.task.clone(),
            gpu: gpu_label(&e.gpu, e.compute_capability),
            why: Box::new(why),
        }
    }

    /// The cache directory (absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every entry, sorted by GPU, compute capability and task.
    pub fn entries(&self) -> &[DeployEntry] {
        &self.entries
    }

    /// The entry of `task` on the GPU named `gpu_name` with compute capability `cc`.
    pub fn lookup(&self, gpu_name: &str, cc: (u32, u32), task: &str) -> Option<&DeployEntry> {
        self.entries
            .iter()
            .find(|e| e.gpu == gpu_name && e.compute_capability == cc && e.task == task)
    }

    /// The task keys the cache holds for one GPU, sorted.
    pub fn tasks_for(&self, gpu_name: &str, cc: (u32, u32)) -> Vec<&str> {
        let mut tasks: Vec<&str> = self
            .entries
            .iter()
            .filter(|e| e.gpu == gpu_name && e.compute_capability == cc)
            .map(|e| e.task.as_str())
            .collect();
        tasks.sort_unstable();
        tasks
    }

    /// Absolute path of an entry's cubin.
    pub fn path_of(&self, entry: &DeployEntry) -> PathBuf {
        self.dir.join(&entry.cubin)
    }

    /// Checks that the entry's cubin exists and has the recorded sha256; returns its bytes.
    pub fn verify(&self, entry: &DeployEntry) -> Result<Vec<u8>, RuntimeError> {
        let path = self.path_of(entry);
        let bytes = fs::read(&path).map_err(|error| {
            let why = EntryError::CubinUnreadable {
                path: path.display().to_string(),
                error: error.to_string(),
            };
            self.bad_entry(entry, why)
        })?;
        let found = sha256_hex(&bytes);
        if found != entry.sha256 {
            let why = EntryError::CubinAltered {
                path: path.display().to_string(),
                expected: entry.sha256.clone(),
                found,
            };
            return Err(self.bad_entry(entry, why));
        }
        Ok(bytes)
    }

    /// Stores `cubin` as the kernel of (`new.gpu`, `new.compute_capability`, `new.task`)
    /// unless the cache already holds one for it that is as fast or faster (lower or equal
    /// `final_us`): only a strictly faster kernel replaces an entry.
    pub fn store(&mut self, new: NewEntry, cubin: &[u8]) -> Result<Stored, RuntimeError> {
        validate(&new, cubin)?;
        let sha256 = sha256_hex(cubin);
        let cubin_name = format!(
            "{CUBIN_DIR}/{}",
            cubin_file_name(&new.gpu, new.compute_capability, &new.task, &sha256)
        );
        let entry = DeployEntry {
            gpu: new.gpu,
            compute_capability: new.compute_capability,
            task: new.task,
            shape: Some(new.shape),
            kernel: new.kernel,
            launch: new.launch,
            cubin: cubin_name,
            sha256,
            stage1_us: new.stage1_us,
            final_us: new.final_us,
            stage: new.stage,
            created_by: new.created_by,
        };
        // What `load` would refuse is not written.
        entry::check(&entry, cubin).map_err(|why| {
            RuntimeError::Cache(format!(
                "cannot deploy: the entry of task {} on {}: {why}",
                entry.task,
                gpu_label(&entry.gpu, entry.compute_capability)
            ))
        })?;
        let existing = self.entries.iter().position(|e| same_key(e, &entry));
        let previous_final_us = match existing {
            Some(i) if self.entries[i].final_us <= entry.final_us => {
                return Ok(Stored {
                    entry: self.entries[i].clone(),
                    action: StoreAction::KeptExisting,
                });
            }
            Some(i) => Some(self.entries[i].final_us),
            None => None,
        };

        let cubin_dir = self.dir.join(CUBIN_DIR);
        fs::create_dir_all(&cubin_dir).map_err(|e| {
            RuntimeError::Cache(format!("cannot create {}: {e}", cubin_dir.display()))
        })?;
        write_atomic(&self.dir.join(&entry.cubin), cubin)?;

        let mut entries = self.entries.clone();
        let old = match existing {
            Some(i) => Some(std::mem::replace(&mut entries[i], entry.clone())),
            None => {
                entries.push(entry.clone());
                None
            }
        };
        entries.sort_by(|a, b| {
            (&a.gpu, a.compute_capability, &a.task).cmp(&(&b.gpu, b.compute_capability, &b.task))
        });
        let index = Index {
            version: INDEX_VERSION,
            entries,
        };
        let mut text = serde_json::to_string_pretty(&index)
            .map_err(|e| RuntimeError::Cache(format!("cannot encode the deploy index: {e}")))?;
        text.push('\n');
        write_atomic(&self.dir.join(INDEX_FILE), text.as_bytes())?;
        self.entries = index.entries;

        // The replaced cubin is no longer referenced (unless another entry has the same
        // content and name); removing it is housekeeping, so a failure is not an error.
        if let Some(old) = old
            && old.cubin != entry.cubin
            && !self.entries.iter().any(|e| e.cubin == old.cubin)
        {
            let _ = fs::remove_file(self.dir.join(&old.cubin));
        }
        let action = match previous_final_us {
            Some(previous_final_us) => StoreAction::Replaced { previous_final_us },
            None => StoreAction::Added,
        };
        Ok(Stored { entry, action })
    }
}

/// "NVIDIA H100 80GB HBM3 (sm_90)".
pub fn gpu_label(gpu_name: &str, cc: (u32, u32)) -> String {
    format!("{gpu_name} (sm_{}{})", cc.0, cc.1)
}

fn same_key(a: &DeployEntry, b: &DeployEntry) -> bool {
    a.gpu == b.gpu && a.compute_capability == b.compute_capability && a.task == b.task
}

fn validate(new: &NewEntry, cubin: &[u8]) -> Result<(), RuntimeError> {
    let bad = |what: String| Err(RuntimeError::Cache(format!("cannot deploy: {what}")));
    if new.gpu.trim().is_empty() {
        return bad("the GPU name is empty".into());
    }
    if new.task.trim().is_empty() {
        return bad("the task key is empty".into());
    }
    if new.shape.key() != new.task {
        return bad(format!(
            "the task key {} is not the key of its shape, {}",
            new.task,
            new.shape.key()
        ));
    }
    if new.kernel.trim().is_empty() {
        return bad(format!("the kernel name of task {} is empty", new.task));
    }
    for (what, us) in [("stage-1", new.stage1_us), ("final", new.final_us)] {
        if !(us.is_finite() && us > 0.0) {
            return bad(format!(
                "the {what} time of task {} is {us} µs, not a positive number",
                new.task
            ));
        }
    }
    if !cubin.starts_with(b"\x7fELF") {
        return bad(format!("the cubin of task {} is not an ELF file", new.task));
    }
    Ok(())
}

/// Whether an index's cubin name is a plain file directly inside `cubins/`.
fn is_cubin_name(name: &str) -> bool {
    name.strip_prefix(CUBIN_DIR)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|file| {
            !file.is_empty()
                && file != "."
                && file != ".."
                && !file.contains(['/', '\\'])
                && !file.starts_with('.')
        })
}

/// `<gpu>-sm<XY>-<task>-<first 16 hex digits of the sha256>.cubin`, with every character
/// outside `[A-Za-z0-9._-]` replaced by `_` and long parts shortened; the hash keeps
/// different kernels apart whatever the names become.
fn cubin_file_name(gpu: &str, cc: (u32, u32), task: &str, sha256: &str) -> String {
    fn safe(s: &str, max: usize) -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .take(max)
            .collect::<String>()
            .trim_start_matches('.')
            .to_string()
    }
    format!(
        "{}-sm{}{}-{}-{}.cubin",
        safe(gpu, 48),
        cc.0,
        cc.1,
        safe(task, 120),
        &sha256[..16]
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// Writes `bytes` to `path` through a temporary file in the same directory, flushed to
/// disk, then renamed over `path`: readers see the old file or the new one, never part.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RuntimeError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{file_name}.tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // Make the rename itself durable; not every platform can sync a directory.
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok::<(), std::io::Error>(())
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        RuntimeError::Cache(format!("cannot write {}: {e}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: &str = "NVIDIA H100 80GB HBM3";
    const TASK: &str = "conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1";
    const KERNEL: &str = "default_function_kernel";

    /// A kernel of `new`'s task: three pointers (input, weight, output).
    fn cubin(tag: u8) -> Vec<u8> {
        crate::testkit::cubin(KERNEL, &[crate::testkit::POINTER; 3], tag)
    }

    fn shape() -> Task {
        let op = schedule::parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap();
        Task::new(op, Default::default()).unwrap()
    }

    fn new(gpu: &str, task: &str, final_us: f64) -> NewEntry {
        NewEntry {
            gpu: gpu.to_string(),
            compute_capability: (9, 0),
            task: task.to_string(),
            shape: shape(),
            kernel: KERNEL.to_string(),
            launch: LaunchConfig {
                zero_output: true,
                ..LaunchConfig::linear(392, 128, 18432)
            },
            stage1_us: 20.0,
            final_us,
            stage: if final_us < 20.0 {
                Stage::Sass
            } else {
                Stage::Stage1
            },
            created_by: TOOL_VERSION.to_string(),
        }
    }

    #[test]
    fn deploy_store_lookup_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let mut cache = DeployCache::open(&dir).unwrap();
        assert!(cache.entries().is_empty());
        let stored = cache.store(new(H100, TASK, 18.5), &cubin(1)).unwrap();
        assert_eq!(stored.action, StoreAction::Added);
        assert!(stored.entry.cubin.starts_with("cubins/"));
        assert_eq!(stored.entry.sha256, sha256_hex(&cubin(1)));

        // A fresh handle reads the same entry back from disk.
        let cache = DeployCache::load(&dir).unwrap();
        let e = cache.lookup(H100, (9, 0), TASK).unwrap();
        assert_eq!(e, &stored.entry);
        assert_eq!(e.stage, Stage::Sass);
        assert_eq!(e.shape, Some(shape()));
        assert_eq!(e.launch.dynamic_shared_bytes, 18432);
        assert!(e.launch.zero_output);
        let path = cache.path_of(e);
        assert!(path.is_absolute() && path.starts_with(&dir), "{path:?}");
        assert_eq!(cache.verify(e).unwrap(), cubin(1));
        assert_eq!(cache.lookup(H100, (9, 0), "matmul_m1_n1_k1"), None);
        assert_eq!(cache.tasks_for(H100, (9, 0)), vec![TASK]);

        let text = fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
        assert!(text.contains("\"stage\": \"sass\""), "{text}");
        // No temporary file is left behind.
        for d in [dir.clone(), dir.join(CUBIN_DIR)] {
            for f in fs::read_dir(d).unwrap() {
                let name = f.unwrap().file_name();
                assert!(!name.to_string_lossy().contains(".tmp."), "{name:?}");
            }
        }
    }

    #[test]
    fn deploy_replaces_only_if_faster() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let first = cache.store(new(H100, TASK, 18.0), &cubin(1)).unwrap();

        // Slower, then equal: kept, nothing written.
        for us in [19.0, 18.0] {
            let s = cache.store(new(H100, TASK, us), &cubin(2)).unwrap();
            assert_eq!(s.action, StoreAction::KeptExisting);
            assert_eq!(s.entry, first.entry);
        }
        assert_eq!(fs::read_dir(tmp.path().join(CUBIN_DIR)).unwrap().count(), 1);

        // Faster: replaced, and the old cubin removed.
        let s = cache.store(new(H100, TASK, 15.0), &cubin(3)).unwrap();
        assert_eq!(
            s.action,
            StoreAction::Replaced {
                previous_final_us: 18.0
            }
        );
        assert_eq!(cache.entries().len(), 1);
        let cache = DeployCache::load(tmp.path()).unwrap();
        let e = cache.lookup(H100, (9, 0), TASK).unwrap();
        assert_eq!(e.final_us, 15.0);
        assert_eq!(cache.verify(e).unwrap(), cubin(3));
        assert!(!cache.path_of(&first.entry).exists());
        assert_eq!(fs::read_dir(tmp.path().join(CUBIN_DIR)).unwrap().count(), 1);
    }

    #[test]
    fn deploy_different_gpus_do_not_collide() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let h200 = "NVIDIA H200";
        cache.store(new(H100, TASK, 18.0), &cubin(1)).unwrap();
        // Same task, other GPU name; same name, other compute capability.
        let a = cache.store(new(h200, TASK, 25.0), &cubin(2)).unwrap();
        let mut other_cc = new(H100, TASK, 30.0);
        other_cc.compute_capability = (8, 0);
        let b = cache.store(other_cc, &cubin(3)).unwrap();
        assert_eq!(a.action, StoreAction::Added);
        assert_eq!(b.action, StoreAction::Added);

        let cache = DeployCache::load(tmp.path()).unwrap();
        assert_eq!(cache.entries().len(), 3);
        assert_eq!(cache.lookup(H100, (9, 0), TASK).unwrap().final_us, 18.0);
        assert_eq!(cache.lookup(h200, (9, 0), TASK).unwrap().final_us, 25.0);
        assert_eq!(cache.lookup(H100, (8, 0), TASK).unwrap().final_us, 30.0);
        assert_eq!(cache.lookup(h200, (8, 0), TASK), None);
        let files: std::collections::HashSet<_> =
            cache.entries().iter().map(|e| e.cubin.clone()).collect();
        assert_eq!(files.len(), 3);
        for e in cache.entries() {
            cache.verify(e).unwrap();
        }
    }

    #[test]
    fn deploy_corrupt_index_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        cache.store(new(H100, TASK, 18.0), &cubin(1)).unwrap();
        let index = tmp.path().join(INDEX_FILE);
        let text = fs::read_to_string(&index).unwrap();
        fs::write(&index, &text[..text.len() / 2]).unwrap();
        for result in [DeployCache::open(tmp.path()), DeployCache::load(tmp.path())] {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("is corrupt"), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        // Left as it was, for the user to inspect.
        assert_eq!(fs::read_to_string(&index).unwrap(), &text[..text.len() / 2]);

        // A cubin path leading out of the cache is refused too.
        fs::write(&index, text.replace("\"cubins/", "\"../")).unwrap();
        let err = DeployCache::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains("outside cubins/"), "{err}");

        let err = DeployCache::load(tmp.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn deploy_hash_mismatch_is_detected() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let e = cache.store(new(H100, TASK, 18.0), &cubin(1)).unwrap().entry;
        fs::write(cache.path_of(&e), cubin(9)).unwrap();
        let err = cache.verify(&e).unwrap_err().to_string();
        assert!(err.contains("does not match its recorded sha256"), "{err}");
        // Opening the cache checks every entry's cubin, naming the entry.
        let named = format!("has a bad entry, of task {TASK} on {H100} (sm_90): its cubin");
        let err = DeployCache::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains(&named) && err.contains("sha256"), "{err}");
        fs::remove_file(cache.path_of(&e)).unwrap();
        let err = cache.verify(&e).unwrap_err().to_string();
        assert!(err.contains("unreadable"), "{err}");
        let err = DeployCache::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains(&named) && err.contains("unreadable"), "{err}");
    }

    #[test]
    fn deploy_refuses_bad_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = DeployCache::open(tmp.path()).unwrap();
        let err = cache
            .store(new(H100, TASK, f64::NAN), &cubin(1))
            .unwrap_err();
        assert!(err.to_string().contains("final time"), "{err}");
        let err = cache.store(new(H100, TASK, 10.0), b"not elf").unwrap_err();
        assert!(err.to_string().contains("not an ELF"), "{err}");
        // What opening the cache would refuse: a kernel of four parameters, where the
        // task names three buffers and the launch no tensor maps.
        let four = crate::testkit::cubin(KERNEL, &[crate::testkit::POINTER; 4], 1);
        let err = cache.store(new(H100, TASK, 10.0), &four).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot deploy: the entry of task {TASK} on {H100} (sm_90): its kernel \
                 {KERNEL} takes 4 parameters, but the entry gives 3 pointers and 0 tensor maps"
            )
        );
        let err = cache.store(new("", TASK, 10.0), &cubin(1)).unwrap_err();
        assert!(err.to_string().contains("GPU name"), "{err}");
        let err = cache
            .store(new(H100, "matmul_m1_n1_k1", 10.0), &cubin(1))
            .unwrap_err();
        assert!(
            err.to_string().contains("not the key of its shape"),
            "{err}"
        );
        assert!(cache.entries().is_empty());
    }

    #[test]
    fn deploy_file_names_are_safe() {
        let name = cubin_file_name("../NVIDIA H100/x", (9, 0), "a b/c", &"ab".repeat(32));
        assert_eq!(name, "_NVIDIA_H100_x-sm90-a_b_c-abababababababab.cubin");
        assert!(is_cubin_name(&format!("{CUBIN_DIR}/{name}")));
        for bad in [
            "cubins/../x",
            "cubins/",
            "/etc/passwd",
            "cubins/a/b",
            "x.cubin",
        ] {
            assert!(!is_cubin_name(bad), "{bad}");
        }
    }
}
