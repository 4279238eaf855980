//! The one path from a tuning log to a task's kernel: the best valid record of the task,
//! its kernel regenerated from the recorded state (generation is deterministic), and the
//! kernel compiled. `best`, `export`, `bench`, `sass`, `pipeline` and the GPU tests all
//! come through here, so that they agree on three rules:
//!
//! - **which hardware table** regenerates a state: the one of the device that measured
//!   it (`DeviceInfo::spec`), since the state was validated against that device;
//! - **which architecture** a kernel is compiled for: the one it was measured on (the
//!   record's compile architecture). A caller that runs it on a GPU asks
//!   `BestKernel::runs_on` first; a kernel is never silently rebuilt for another
//!   architecture, where it would be a kernel nobody measured;
//! - **when a regenerated kernel may not be the measured one**: a record that carries
//!   the source hash is proven the same or not; an older one without it is doubted when
//!   another version of the tool wrote it.
//!
//! A record whose kernel cannot be regenerated never costs the task its kernel: the next
//! fastest correct record is taken instead (`best_regenerated`).

use crate::record::{Record, source_hash};
use gpu::{CompileError, CompiledKernel, DeviceInfo, UnknownArch};
use schedule::{GeneratedKernel, InvalidState, generate};
use std::fmt;
use std::path::Path;
use thiserror::Error;

/// The version of this build, compared with the version that wrote a record.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why a task's kernel cannot be had from a log.
#[derive(Debug, Clone, Error)]
pub enum KernelError {
    #[error("task {task} has no records in {log}")]
    NoRecords { task: String, log: String },
    #[error("task {task} has no correct kernel in {log} ({trials} records, all failed)")]
    NoCorrectKernel {
        task: String,
        log: String,
        trials: usize,
    },
    #[error("{task}: the recorded state is not valid for its device: {error}")]
    InvalidState { task: String, error: InvalidState },
    #[error("{task}: {error}")]
    UnknownArch { task: String, error: UnknownArch },
    #[error("{task}: compiling the kernel for {arch}: {error}")]
    Compile {
        task: String,
        arch: String,
        error: CompileError,
    },
    #[error("{task}: the kernel was tuned for {tuned}; this GPU, {device}, is {arch}")]
    ForeignArch {
        task: String,
        tuned: String,
        device: String,
        arch: String,
    },
}

/// The correct records of `task`, fastest first (ties in log order).
fn ranked<'a>(records: &'a [Record], task: &str) -> Vec<&'a Record> {
    let mut ranked: Vec<(&Record, f64)> = records
        .iter()
        .filter(|r| r.task == task)
        .filter_map(|r| r.median_us().map(|us| (r, us)))
        .collect();
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
    ranked.into_iter().map(|(r, _)| r).collect()
}

/// Why `task` has no correct record in `records`.
fn no_kernel(records: &[Record], task: &str, log: &Path) -> KernelError {
    let log = log.display().to_string();
    let task = task.to_string();
    match records.iter().filter(|r| r.task == task).count() {
        0 => KernelError::NoRecords { task, log },
        trials => KernelError::NoCorrectKernel { task, log, trials },
    }
}

/// The fastest correct record of `task` among `records` (read from `log`, named in the
/// errors); the same record `summarize` reports as the task's best.
pub fn best_record<'a>(
    records: &'a [Record],
    task: &str,
    log: &Path,
) -> Result<&'a Record, KernelError> {
    ranked(records, task)
        .first()
        .copied()
        .ok_or_else(|| no_kernel(records, task, log))
}

/// The fastest correct record of `task` whose kernel regenerates. Faster records that
/// do not (a device without a hardware table, a state this build refuses) are passed
/// over, kept with their reasons in `BestKernel::passed_over` for the caller to warn
/// about; when none regenerates, the fastest one's reason is the error.
pub fn best_regenerated<'a>(
    records: &'a [Record],
    task: &str,
    log: &Path,
) -> Result<BestKernel<'a>, KernelError> {
    let mut passed_over = Vec::new();
    for record in ranked(records, task) {
        match BestKernel::regenerate(record) {
            Ok(kernel) => {
                return Ok(BestKernel {
                    passed_over,
                    ..kernel
                });
            }
            Err(e) => passed_over.push(e),
        }
    }
    Err(passed_over
        .into_iter()
        .next()
        .unwrap_or_else(|| no_kernel(records, task, log)))
}

/// The best kernel of `task` in `records` (`best_regenerated`), compiled for the
/// architecture it was measured on: the whole path in one call.
pub fn best_kernel<'a>(
    records: &'a [Record],
    task: &str,
    log: &Path,
) -> Result<(BestKernel<'a>, CompiledKernel), KernelError> {
    let kernel = best_regenerated(records, task, log)?;
    let compiled = kernel.compile()?;
    Ok((kernel, compiled))
}

/// Why a regenerated kernel may differ from the one that was measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staleness {
    /// The record's source hash differs from the regenerated source's.
    SourceHash { recorded: String, now: String },
    /// The record has no source hash and another version of the tool wrote it.
    ToolVersion { recorded: String },
}

impl fmt::Display for Staleness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Staleness::SourceHash { recorded, now } => write!(
                f,
                "the regenerated kernel differs from the one measured (source hash {now}, recorded {recorded})"
            ),
            Staleness::ToolVersion { recorded } => write!(
                f,
                "the record was measured with tilesched {recorded}, this is {TOOL_VERSION}: the regenerated kernel may differ"
            ),
        }
    }
}

/// A record's kernel, regenerated from its state.
#[derive(Debug, Clone)]
pub struct BestKernel<'a> {
    pub record: &'a Record,
    pub kernel: GeneratedKernel,
    /// The architecture it is compiled for: the one it was measured on.
    pub arch: String,
    /// Set when the regenerated kernel may not be the measured one (see `Staleness`).
    pub stale: Option<Staleness>,
    /// Faster correct records of the task whose kernels could not be regenerated, and
    /// why (`best_regenerated`; empty from `regenerate`).
    pub passed_over: Vec<KernelError>,
}

impl<'a> BestKernel<'a> {
    /// Regenerates `record`'s kernel with the hardware table of the device that
    /// measured it.
    pub fn regenerate(record: &'a Record) -> Result<BestKernel<'a>, KernelError> {
        let task = || record.task.clone();
        let spec = record
            .device
            .spec()
            .map_err(|error| KernelError::UnknownArch {
                task: task(),
                error,
            })?;
        let kernel = generate(&record.shape, &record.state, &spec).map_err(|error| {
            KernelError::InvalidState {
                task: task(),
                error,
            }
        })?;
        let stale = staleness(record, &kernel.source);
        Ok(BestKernel {
            record,
            arch: recorded_arch(record),
            kernel,
            stale,
            passed_over: Vec::new(),
        })
    }

    /// Compiles the kernel to a cubin.
    pub fn compile(&self) -> Result<CompiledKernel, KernelError> {
        gpu::compile(&self.kernel.source, &self.kernel.name, &self.arch)
            .map_err(|error| self.compile_error(error))
    }

    /// Compiles the kernel to PTX.
    pub fn ptx(&self) -> Result<String, KernelError> {
        gpu::compile::compile_ptx(&self.kernel.source, &self.kernel.name, &self.arch)
            .map_err(|error| self.compile_error(error))
    }

    /// Whether the kernel can run on `device`: it must have the architecture the
    /// kernel was measured on.
    pub fn runs_on(&self, device: &DeviceInfo) -> Result<(), KernelError> {
        let arch = device.arch();
        if arch == self.arch {
            return Ok(());
        }
        Err(KernelError::ForeignArch {
            task: self.record.task.clone(),
            tuned: self.arch.clone(),
            device: device.name.clone(),
            arch,
        })
    }

    fn compile_error(&self, error: CompileError) -> KernelError {
        KernelError::Compile {
            task: self.record.task.clone(),
            arch: self.arch.clone(),
            error,
        }
    }
}

/// The architecture a record's kernel was compiled for when it was measured.
pub fn recorded_arch(record: &Record) -> String {
    record
        .compile
        .as_ref()
        .map_or_else(|| record.device.arch(), |c| c.arch.clone())
}

fn staleness(record: &Record, source: &str) -> Option<Staleness> {
    match &record.source_hash {
        Some(recorded) => {
            let now = source_hash(source);
            (*recorded != now).then(|| Staleness::SourceHash {
                recorded: recorded.clone(),
                now,
            })
        }
        None => (record.tool_version != TOOL_VERSION).then(|| Staleness::ToolVersion {
            recorded: record.tool_version.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{ok, record};
    use gpu::{ErrorKind, Outcome};

    fn log() -> Vec<Record> {
        vec![
            record("64,64,64", 1, ok(20.0)),
            record("64,64,64", 2, ok(12.5)),
            record("128,64,32", 1, Outcome::error(ErrorKind::Timeout, "late")),
        ]
    }

    #[test]
    fn the_best_record_is_the_fastest_correct_one_and_misses_are_named() {
        let records = log();
        let path = Path::new("l.jsonl");
        let best = best_record(&records, "matmul_m64_n64_k64", path).unwrap();
        assert_eq!(best.median_us(), Some(12.5));
        let e = best_record(&records, "matmul_m128_n64_k32", path).unwrap_err();
        assert_eq!(
            e.to_string(),
            "task matmul_m128_n64_k32 has no correct kernel in l.jsonl (1 records, all failed)"
        );
        let e = best_record(&records, "nope", path).unwrap_err();
        assert_eq!(e.to_string(), "task nope has no records in l.jsonl");
    }

    #[test]
    fn a_kernel_is_regenerated_for_its_recorded_architecture_and_checked_by_hash() {
        let mut r = record("64,64,64", 2, ok(12.5));
        let k = BestKernel::regenerate(&r).unwrap();
        assert_eq!(k.arch, "sm_90");
        assert!(k.kernel.source.contains(&r.state.to_json()));
        // Same version, no hash: no reason to doubt.
        assert_eq!(k.stale, None);
        // A matching hash proves it the same whatever version wrote it.
        let hash = source_hash(&k.kernel.source);
        r.source_hash = Some(hash.clone());
        r.tool_version = "0.0.1".into();
        assert_eq!(BestKernel::regenerate(&r).unwrap().stale, None);
        r.source_hash = Some("0123456789abcdef".into());
        let stale = BestKernel::regenerate(&r).unwrap().stale.unwrap();
        assert_eq!(
            stale,
            Staleness::SourceHash {
                recorded: "0123456789abcdef".into(),
                now: hash
            }
        );
        r.source_hash = None;
        assert!(
            BestKernel::regenerate(&r)
                .unwrap()
                .stale
                .unwrap()
                .to_string()
                .contains("measured with tilesched 0.0.1")
        );
    }

    #[test]
    fn a_kernel_runs_only_on_its_architecture() {
        let r = record("64,64,64", 2, ok(12.5));
        let k = BestKernel::regenerate(&r).unwrap();
        let mut device = r.device.clone();
        assert!(k.runs_on(&device).is_ok());
        device.compute_capability = (8, 0);
        device.name = "NVIDIA A100".into();
        assert_eq!(
            k.runs_on(&device).unwrap_err().to_string(),
            "matmul_m64_n64_k64: the kernel was tuned for sm_90; this GPU, NVIDIA A100, is sm_80"
        );
    }

    #[test]
    fn a_record_that_does_not_regenerate_is_passed_over_for_the_next_fastest() {
        let mut foreign = record("64,64,64", 3, ok(5.0));
        foreign.device.compute_capability = (8, 6);
        let mut records = log();
        records.push(foreign.clone());
        let path = Path::new("l.jsonl");
        // The fastest record is the foreign one; its kernel cannot be regenerated.
        assert_eq!(
            best_record(&records, "matmul_m64_n64_k64", path)
                .unwrap()
                .median_us(),
            Some(5.0)
        );
        let k = best_regenerated(&records, "matmul_m64_n64_k64", path).unwrap();
        assert_eq!(k.record.median_us(), Some(12.5));
        assert_eq!(k.passed_over.len(), 1);
        assert!(matches!(k.passed_over[0], KernelError::UnknownArch { .. }));
        // None regenerates: the fastest one's reason.
        let only = [foreign];
        let e = best_regenerated(&only, "matmul_m64_n64_k64", path).unwrap_err();
        assert!(e.to_string().contains("no hardware table"), "{e}");
        // No correct record, no record: as `best_record` says.
        let e = best_regenerated(&records, "matmul_m128_n64_k32", path).unwrap_err();
        assert!(matches!(e, KernelError::NoCorrectKernel { trials: 1, .. }));
        let e = best_regenerated(&records, "nope", path).unwrap_err();
        assert!(matches!(e, KernelError::NoRecords { .. }));
    }

    #[test]
    fn a_record_from_an_unknown_architecture_is_a_clear_error() {
        let mut r = record("64,64,64", 2, ok(12.5));
        r.device.compute_capability = (8, 6);
        let e = BestKernel::regenerate(&r).unwrap_err();
        assert!(e.to_string().contains("no hardware table"), "{e}");
    }
}
