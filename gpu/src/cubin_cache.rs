//! A disk cache of compiled kernels, so that no kernel is compiled twice: not by a later
//! run, a resumed one, another task that generates the same source, `bench` or
//! `deploy add` after `tune`, nor by several processes on one host.
//!
//! Building is the CPU-heavy step of tuning (NVRTC takes 0.25–0.4 s per kernel on the
//! GPU machine's cores, measured in the H100 runs of 2026-11-25), and with more GPUs it
//! is the bottleneck. A cubin is a pure function of NVRTC's version, the options, the
//! kernel's name and its source, so the entry's name is the SHA-256 of exactly those; the
//! compiler's log is kept beside the cubin, since the resource usage (registers, spills)
//! is read from both. The comment lines that open a source (the generator's header: the
//! task, the state, the launch) never reach the cubin and are left out of the key, so
//! that states whose code is the same share an entry: 4-5% of the candidates of a
//! 1536-trial resnet f32 tune (two logs of 2026-11-29), none of a GEMM tune's.
//!
//! Layout: `DIR/<first two hex digits>/<sha256>.cubin` and `.log`. Each file is written
//! to a temporary name and renamed, the log before the cubin, so a reader sees a whole
//! entry or none; an entry that does not read back whole is compiled again and replaced.
//! Nothing is ever evicted: an entry is 10–60 KB (delete the directory to reclaim it).
//!
//! A cache may also have a shared tier (`SharedCubins`, on the queue's Redis server),
//! looked up after the disk and before NVRTC: CPU-only hosts (`tilesched builder`) fill
//! it with the kernels of the jobs waiting on the queue, so that a GPU host's own cores
//! are not all a run's builds.

use crate::compile::{CompileError, CompiledKernel, check_arch, cubin_options, run_compile};
use crate::{cubin, nvrtc_lib};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Entries kept beside the disk, by their key: a store of cubins and logs that other
/// hosts share. A store that cannot answer (unreachable, or an entry that does not
/// check out) answers `None`, and the kernel is compiled here.
pub trait SharedCubins: Send + Sync {
    /// The entry of `key`. While another host says it is compiling it (`claim`), waits
    /// for it rather than compile the same kernel twice.
    fn get(&self, key: &str) -> Option<(Vec<u8>, String)>;
    /// Says that this host compiles `key` now.
    fn claim(&self, key: &str);
    /// Stores the entry of `key`, and ends this host's claim.
    fn put(&self, key: &str, cubin: &[u8], log: &str);
    /// Ends this host's claim on `key` without an entry (the kernel did not compile).
    fn release(&self, key: &str);
}

/// The cache directory, and its shared tier if any.
#[derive(Clone)]
pub struct CubinCache {
    dir: PathBuf,
    shared: Option<Arc<dyn SharedCubins>>,
    /// Whether what NVRTC compiles here, or finds on this disk, is put into the shared
    /// tier too.
    publish: bool,
}

impl std::fmt::Debug for CubinCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CubinCache")
            .field("dir", &self.dir)
            .field("shared", &self.shared.is_some())
            .field("publish", &self.publish)
            .finish()
    }
}

/// Where a compiled kernel came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// NVRTC compiled it now (and it was stored).
    Compiled,
    /// Read from the cache.
    Cached,
    /// Read from the shared tier: another host compiled it.
    Shared,
}

impl CubinCache {
    /// The cache in `dir`, created if missing.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<CubinCache> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(CubinCache {
            dir,
            shared: None,
            publish: false,
        })
    }

    /// This cache with `shared` looked up after the disk; with `publish`, what NVRTC
    /// compiles here (claimed there while it compiles) or this disk holds goes there too.
    pub fn with_shared(mut self, shared: Arc<dyn SharedCubins>, publish: bool) -> CubinCache {
        self.shared = Some(shared);
        self.publish = publish;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `compile::compile`, through the cache: the stored cubin when there is one,
    /// else NVRTC's, stored for next time (a failure to store is not an error: the
    /// kernel is still good). A source NVRTC rejects is not cached.
    pub fn compile(
        &self,
        source: &str,
        kernel: &str,
        arch: &str,
    ) -> Result<(CompiledKernel, Origin), CompileError> {
        check_arch(arch)?;
        let start = Instant::now();
        let options = cubin_options(arch);
        let (major, minor) = nvrtc_lib::version()?;
        let key = entry_key(&format!("{major}.{minor}"), &options, kernel, source);
        let path = self.dir.join(&key[..2]).join(&key);
        let publisher = self.shared.as_ref().filter(|_| self.publish);
        // A stored cubin and its log, if they are this kernel's.
        let stored = |(cubin, log): (Vec<u8>, String)| {
            let resources = cubin::resources(&cubin, kernel, &log).ok()?;
            let compile_ms = start.elapsed().as_secs_f64() * 1e3;
            Some(CompiledKernel {
                cubin,
                resources,
                log,
                compile_ms,
            })
        };
        if let Some(compiled) = read_entry(&path).and_then(stored) {
            if let Some(shared) = publisher {
                shared.put(&key, &compiled.cubin, &compiled.log);
            }
            return Ok((compiled, Origin::Cached));
        }
        if let Some(compiled) = self
            .shared
            .as_ref()
            .and_then(|shared| shared.get(&key))
            .filter(|(cubin, _)| cubin.starts_with(b"\x7fELF"))
            .and_then(stored)
        {
            let _ = write_entry(&path, &compiled.cubin, &compiled.log);
            return Ok((compiled, Origin::Shared));
        }
        if let Some(shared) = publisher {
            shared.claim(&key);
        }
        let compiled = run_compile(source, kernel, &options);
        match (&compiled, publisher) {
            (Ok(compiled), Some(shared)) => shared.put(&key, &compiled.cubin, &compiled.log),
            (Err(_), Some(shared)) => shared.release(&key),
            (_, None) => {}
        }
        let compiled = compiled?;
        let _ = write_entry(&path, &compiled.cubin, &compiled.log);
        Ok((compiled, Origin::Compiled))
    }
}

/// SHA-256 (hex) of everything that determines the cubin, each part length-prefixed so
/// that no two different inputs concatenate alike.
fn entry_key(nvrtc: &str, options: &[String], kernel: &str, source: &str) -> String {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(b"tilesched cubin cache 2");
    part(nvrtc.as_bytes());
    for o in options {
        part(o.as_bytes());
    }
    part(kernel.as_bytes());
    part(code(source).as_bytes());
    let mut hex = String::with_capacity(64);
    for b in h.finalize().iter() {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// `source` from its first line that is not a `//` comment on (the leading comment block
/// is the generator's header).
fn code(source: &str) -> &str {
    let mut rest = source;
    while rest.trim_start_matches([' ', '\t']).starts_with("//") {
        match rest.find('\n') {
            Some(end) => rest = &rest[end + 1..],
            None => return "",
        }
    }
    rest
}

fn read_entry(path: &Path) -> Option<(Vec<u8>, String)> {
    let cubin = std::fs::read(path.with_extension("cubin")).ok()?;
    let log = std::fs::read_to_string(path.with_extension("log")).ok()?;
    cubin.starts_with(b"\x7fELF").then_some((cubin, log))
}

fn write_entry(path: &Path, cubin: &[u8], log: &str) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().expect("entries live in a subdirectory");
    std::fs::create_dir_all(dir)?;
    // The log first: a cubin without its log is never read as an entry.
    for (ext, bytes) in [("log", log.as_bytes()), ("cubin", cubin)] {
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            ext
        ));
        std::fs::write(&tmp, bytes)?;
        if let Err(e) = std::fs::rename(&tmp, path.with_extension(ext)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_separate_every_input() {
        let o = vec!["--gpu-architecture=sm_90".to_string()];
        let k = entry_key("13.0", &o, "k", "src");
        assert_eq!(k.len(), 64);
        assert_eq!(k, entry_key("13.0", &o, "k", "src"));
        for other in [
            entry_key("13.1", &o, "k", "src"),
            entry_key(
                "13.0",
                &["--gpu-architecture=sm_80".to_string()],
                "k",
                "src",
            ),
            entry_key("13.0", &o, "ks", "rc"),
            entry_key("13.0", &o, "k", "src "),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn the_opening_comments_are_not_part_of_the_key() {
        let o = vec!["--gpu-architecture=sm_90".to_string()];
        let key = |src: &str| entry_key("13.0", &o, "k", src);
        let body = "extern \"C\" __global__ void k() {\n  // inside\n}\n";
        let a = key(&format!(
            "// state: {{\"unroll\": 512}}\n// launch: 1\n{body}"
        ));
        assert_eq!(
            a,
            key(&format!("// state: {{\"unroll\": 1024}}\n  // x\n{body}"))
        );
        assert_eq!(a, key(body));
        // A comment after the first line of code is code.
        assert_ne!(a, key(&body.replace("inside", "outside")));
        assert_ne!(a, key(&format!("{body}// tail\n")));
        assert_eq!(code("// only comments"), "");
    }

    /// A shared tier in memory, counting what is put.
    #[derive(Default)]
    struct Memory(std::sync::Mutex<std::collections::HashMap<String, (Vec<u8>, String)>>);

    impl SharedCubins for Memory {
        fn get(&self, key: &str) -> Option<(Vec<u8>, String)> {
            self.0.lock().unwrap().get(key).cloned()
        }
        fn claim(&self, _: &str) {}
        fn put(&self, key: &str, cubin: &[u8], log: &str) {
            let entry = (cubin.to_vec(), log.to_string());
            self.0.lock().unwrap().insert(key.to_string(), entry);
        }
        fn release(&self, _: &str) {}
    }

    #[test]
    fn the_shared_tier_is_read_after_the_disk_and_filled_only_by_publishers() {
        let source = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n";
        let memory = Arc::new(Memory::default());
        let tmp = tempfile::tempdir().unwrap();
        // A reader compiles what the tier lacks, and puts nothing there.
        let reader = CubinCache::open(tmp.path().join("reader"))
            .unwrap()
            .with_shared(Arc::clone(&memory) as _, false);
        let (_, origin) = reader.compile(source, "k", "sm_90").unwrap();
        assert_eq!(origin, Origin::Compiled);
        assert!(memory.0.lock().unwrap().is_empty());
        // A publisher (a builder) puts what it compiles.
        let builder = CubinCache::open(tmp.path().join("builder"))
            .unwrap()
            .with_shared(Arc::clone(&memory) as _, true);
        let (built, origin) = builder.compile(source, "k", "sm_90").unwrap();
        assert_eq!(origin, Origin::Compiled);
        assert_eq!(memory.0.lock().unwrap().len(), 1);
        // What its disk holds goes there too (the tier's entries expire).
        memory.0.lock().unwrap().clear();
        assert_eq!(
            builder.compile(source, "k", "sm_90").unwrap().1,
            Origin::Cached
        );
        assert_eq!(memory.0.lock().unwrap().len(), 1);
        // Another host reads it back from the tier, then from its own disk.
        let other = CubinCache::open(tmp.path().join("other"))
            .unwrap()
            .with_shared(Arc::clone(&memory) as _, false);
        let (read, origin) = other.compile(source, "k", "sm_90").unwrap();
        assert_eq!(origin, Origin::Shared);
        assert_eq!((read.cubin, read.resources), (built.cubin, built.resources));
        assert_eq!(
            other.compile(source, "k", "sm_90").unwrap().1,
            Origin::Cached
        );
        // An entry that is not this kernel's cubin is compiled here instead.
        let key = memory.0.lock().unwrap().keys().next().unwrap().clone();
        memory
            .0
            .lock()
            .unwrap()
            .insert(key, (b"\x7fELF not a cubin".to_vec(), String::new()));
        let fresh = CubinCache::open(tmp.path().join("fresh"))
            .unwrap()
            .with_shared(Arc::clone(&memory) as _, false);
        assert_eq!(
            fresh.compile(source, "k", "sm_90").unwrap().1,
            Origin::Compiled
        );
    }

    #[test]
    fn a_partial_entry_is_no_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("ab").join("abcd");
        assert_eq!(read_entry(&path), None);
        write_entry(&path, b"\x7fELF cubin", "log text").unwrap();
        assert_eq!(
            read_entry(&path),
            Some((b"\x7fELF cubin".to_vec(), "log text".to_string()))
        );
        std::fs::remove_file(path.with_extension("log")).unwrap();
        assert_eq!(read_entry(&path), None);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["abcd.cubin"]);
    }
}
