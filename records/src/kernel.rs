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
//! fastest correct record is taken instead (`best_regenerated`), from those a task's
//! summary kept (`ranking::KEEP`), so the log is read once and never held.

use crate::record::{Record, source_hash};
use crate::report::TaskTally;
use gpu::{CompileError, CompiledKernel, DeviceInfo, UnknownArch};
use schedule::{GeneratedKernel, InvalidState, generate};
use std::borrow::Borrow;
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
    /// Every kept record failed to regenerate, and slower correct ones were not kept.
    #[error(
        "{task}: none of the {kept} fastest correct records in {log} regenerates (of {correct}; slower ones are not kept); the fastest: {first}"
    )]
    NoneRegenerates {
        task: String,
        log: String,
        kept: usize,
        correct: usize,
        first: Box<KernelError>,
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

/// Why the task of `tally` (read from `log`, named in the errors) has no correct record.
fn no_kernel<R>(tally: &TaskTally<R>, log: &Path) -> KernelError {
    let log = log.display().to_string();
    let task = tally.task.clone();
    match tally.trials {
        0 => KernelError::NoRecords { task, log },
        trials => KernelError::NoCorrectKernel { task, log, trials },
    }
}

/// The fastest correct record of a task whose kernel regenerates, among those its
/// `tally` kept (read from `log`, named in the errors; the first is the record `best`
/// reports). Faster records that do not regenerate (a device without a hardware table,
/// a state this build refuses) are passed over, kept with their reasons in
/// `BestKernel::passed_over` for the caller to warn about. When none regenerates, the
/// fastest one's reason is the error, or, when slower correct records were not kept,
/// [`KernelError::NoneRegenerates`].
pub fn best_regenerated<'a, R: Borrow<Record>>(
    tally: &'a TaskTally<R>,
    log: &Path,
) -> Result<BestKernel<'a>, KernelError> {
    let mut passed_over = Vec::new();
    for record in &tally.fastest {
        match BestKernel::regenerate(record.borrow()) {
            Ok(kernel) => {
                return Ok(BestKernel {
                    passed_over,
                    ..kernel
                });
            }
            Err(e) => passed_over.push(e),
        }
    }
    let (kept, correct) = (passed_over.len(), tally.correct());
    let Some(first) = passed_over.into_iter().next() else {
        return Err(no_kernel(tally, log));
    };
    if correct <= kept {
        return Err(first);
    }
    Err(KernelError::NoneRegenerates {
        task: tally.task.clone(),
        log: log.display().to_string(),
        kept,
        correct,
        first: Box::new(first),
    })
}

/// The best kernel of a task (`best_regenerated`), compiled for the architecture it was
/// measured on: the whole path in one call.
pub fn best_kernel<'a, R: Borrow<Record>>(
    tally: &'a TaskTally<R>,
    log: &Path,
) -> Result<(BestKernel<'a>, CompiledKernel), KernelError> {
    let kernel = best_regenerated(tally, log)?;
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

    /// The architecture the kernel is compiled for: the GPU's, or its arch-specific
    /// variant when the kernel's target asks for it.
    pub fn target_arch(&self) -> String {
        self.kernel.launch.target.arch(&self.arch)
    }

    /// Compiles the kernel to a cubin.
    pub fn compile(&self) -> Result<CompiledKernel, KernelError> {
        gpu::compile(&self.kernel.source, &self.kernel.name, &self.target_arch())
            .map_err(|error| self.compile_error(error))
    }

    /// Compiles the kernel to PTX.
    pub fn ptx(&self) -> Result<String, KernelError> {
        gpu::compile::compile_ptx(&self.kernel.source, &self.kernel.name, &self.target_arch())
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

/// The architecture of the GPU a record's kernel was measured on, as its compilation
/// names it (`sm_90` for a kernel compiled for `sm_90a`).
pub fn recorded_arch(record: &Record) -> String {
    record.compile.as_ref().map_or_else(
        || record.device.arch(),
        |c| schedule::Target::base_arch(&c.arch).to_string(),
    )
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
    use crate::ranking::KEEP;
    use crate::record::tests::{ok, record};
    use crate::report::{Summarizer, TaskSummary};
    use gpu::{ErrorKind, Outcome};

    /// The tally of `task` in `records` keeping `keep` records (`export` keeps `KEEP`).
    fn tally<'a>(records: &'a [Record], task: &str, keep: usize) -> TaskSummary<'a> {
        let mut s = Summarizer::only(&[task.to_string()]).keeping(keep);
        for r in records {
            s.add(r);
        }
        s.finish().remove(0)
    }

    /// The time of `task`'s best kernel in `records` and the records passed over.
    fn best(records: &[Record], task: &str) -> Result<(f64, Vec<KernelError>), KernelError> {
        let t = tally(records, task, KEEP);
        let k = best_regenerated(&t, Path::new("l.jsonl"))?;
        Ok((k.record.median_us().unwrap(), k.passed_over))
    }

    fn log() -> Vec<Record> {
        vec![
            record("64,64,64", 1, ok(20.0)),
            record("64,64,64", 2, ok(12.5)),
            record("128,64,32", 1, Outcome::error(ErrorKind::Timeout, "late")),
        ]
    }

    #[test]
    fn the_best_kernel_is_the_fastest_correct_record_and_misses_are_named() {
        let records = log();
        let (us, passed_over) = best(&records, "matmul_m64_n64_k64").unwrap();
        assert_eq!((us, passed_over.len()), (12.5, 0));
        let e = best(&records, "matmul_m128_n64_k32").unwrap_err();
        assert_eq!(
            e.to_string(),
            "task matmul_m128_n64_k32 has no correct kernel in l.jsonl (1 records, all failed)"
        );
        let e = best(&records, "nope").unwrap_err();
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
        // The fastest record is the foreign one; its kernel cannot be regenerated.
        let task = "matmul_m64_n64_k64";
        assert_eq!(tally(&records, task, 1).best_us(), Some(5.0));
        let (us, passed_over) = best(&records, task).unwrap();
        assert_eq!(us, 12.5);
        assert_eq!(passed_over.len(), 1);
        assert!(matches!(passed_over[0], KernelError::UnknownArch { .. }));
        // None regenerates, and none was left unkept: the fastest one's reason.
        let mut slower = foreign.clone();
        slower.result = ok(6.0);
        let only = [foreign, slower];
        let e = best(&only, task).unwrap_err();
        assert!(matches!(e, KernelError::UnknownArch { .. }), "{e}");
        assert!(e.to_string().contains("no hardware table"), "{e}");
        // Every kept record fails and slower correct ones were not kept: said so.
        let t = tally(&only, task, 1);
        let e = best_regenerated(&t, Path::new("l.jsonl")).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "matmul_m64_n64_k64: none of the 1 fastest correct records in l.jsonl regenerates (of 2; slower ones are not kept); the fastest: matmul_m64_n64_k64: "
            ),
            "{e}"
        );
        assert!(e.to_string().contains("no hardware table"), "{e}");
        // No correct record, no record.
        let e = best(&records, "matmul_m128_n64_k32").unwrap_err();
        assert!(matches!(e, KernelError::NoCorrectKernel { trials: 1, .. }));
        let e = best(&records, "nope").unwrap_err();
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
