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

use crate::compile::{CompileError, CompiledKernel, check_arch, cubin_options, run_compile};
use crate::{cubin, nvrtc_lib};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The cache directory.
#[derive(Debug, Clone)]
pub struct CubinCache {
    dir: PathBuf,
}

/// Where a compiled kernel came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// NVRTC compiled it now (and it was stored).
    Compiled,
    /// Read from the cache.
    Cached,
}

impl CubinCache {
    /// The cache in `dir`, created if missing.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<CubinCache> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(CubinCache { dir })
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
        if let Some((cubin, log)) = read_entry(&path)
            && let Ok(resources) = cubin::resources(&cubin, kernel, &log)
        {
            let compile_ms = start.elapsed().as_secs_f64() * 1e3;
            let compiled = CompiledKernel {
                cubin,
                resources,
                log,
                compile_ms,
            };
            return Ok((compiled, Origin::Cached));
        }
        let compiled = run_compile(source, kernel, &options)?;
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
