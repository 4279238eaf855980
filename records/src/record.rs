//! Tuning records: one JSON line per measured candidate, appended to a log that is the
//! single source for "best kernel of a task", resuming, model training and feature dumps.
//!
//! A batch's lines are written together, flushed and synced, so an interrupted run loses
//! at most the batch in flight. Readers skip lines that do not parse (a line cut short
//! by a kill, a hand edit) and count them, so one bad line never costs a log.

use gpu::{DeviceInfo, ErrorKind, Outcome};
use schedule::{State, Task};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The version of the record format written by this build.
pub const RECORD_VERSION: u32 = 1;

/// What the compiler reported for a candidate that compiled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileInfo {
    pub arch: String,
    pub registers: u32,
    /// Static plus dynamic shared memory per block.
    pub shared_bytes: u32,
    pub stack_frame_bytes: u32,
    pub spill_bytes: u32,
    pub compile_ms: f64,
}

/// One measured (or failed) candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    /// The task key, e.g. `conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1`.
    pub task: String,
    /// The task itself (operator, shape, epilogue).
    pub shape: Task,
    /// The full, replayable state.
    pub state: State,
    pub result: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileInfo>,
    pub device: DeviceInfo,
    /// NVRTC version that built the kernel, e.g. "13.0".
    pub nvrtc: String,
    pub tool_version: String,
    /// RFC 3339, UTC.
    pub timestamp: String,
    /// Set when a developer's fault injection deliberately broke this candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injected: Option<ErrorKind>,
    /// `source_hash` of the CUDA source that was compiled and measured, so that a kernel
    /// regenerated from the state later can be proven the same (absent in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_hash: Option<String>,
}

/// The first 64 bits of the SHA-256 of a kernel's CUDA source, in hex: what records
/// keep to tell whether a regenerated kernel is the one that was measured.
pub fn source_hash(source: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(source.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

impl Record {
    /// The median time of a correct candidate.
    pub fn median_us(&self) -> Option<f64> {
        match &self.result {
            Outcome::Ok(t) => Some(t.median_us),
            Outcome::Error { .. } => None,
        }
    }

    pub fn error_kind(&self) -> Option<ErrorKind> {
        match &self.result {
            Outcome::Ok(_) => None,
            Outcome::Error { kind, .. } => Some(*kind),
        }
    }

    /// Achieved TFLOP/s of a correct candidate.
    pub fn tflops(&self) -> Option<f64> {
        self.median_us()
            .map(|us| self.shape.flops() as f64 / (us * 1e-6) / 1e12)
    }
}

/// The current time as RFC 3339 (UTC, seconds).
pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

#[derive(Debug, Error)]
pub enum LogError {
    #[error("cannot read tuning log {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot write tuning log {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// A line of a log that was not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// 1-based line number.
    pub line: usize,
    pub reason: String,
}

/// The records of a log and the lines skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Log {
    pub records: Vec<Record>,
    pub skipped: Vec<Skipped>,
}

impl Log {
    /// One line for people about skipped lines, if any.
    pub fn warning(&self, path: &Path) -> Option<String> {
        let first = self.skipped.first()?;
        Some(format!(
            "warning: {}: skipped {} malformed line(s) (first: line {}: {})",
            path.display(),
            self.skipped.len(),
            first.line,
            first.reason
        ))
    }
}

/// Parses a log's text; blank lines are ignored, bad lines skipped and counted.
pub fn parse_log(text: &str) -> Log {
    let mut log = Log::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(record) => log.records.push(record),
            Err(e) => log.skipped.push(Skipped {
                line: i + 1,
                reason: e.to_string(),
            }),
        }
    }
    log
}

/// Reads a log file (invalid UTF-8 is replaced, so such lines are skipped, not fatal).
pub fn read_log(path: &Path) -> Result<Log, LogError> {
    let bytes = std::fs::read(path).map_err(|error| LogError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(parse_log(&String::from_utf8_lossy(&bytes)))
}

/// Appends records to a log, a batch at a time.
pub struct LogWriter {
    path: PathBuf,
    file: File,
}

impl LogWriter {
    /// Opens (or creates) `path` for appending. A last line cut short by an earlier
    /// kill is ended first, so that it stays one skipped line instead of corrupting the
    /// next record.
    pub fn open(path: &Path) -> Result<LogWriter, LogError> {
        let werr = |error| LogError::Write {
            path: path.to_path_buf(),
            error,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(werr)?;
        let len = file.metadata().map_err(werr)?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1)).map_err(werr)?;
            file.read_exact(&mut last).map_err(werr)?;
            if last[0] != b'\n' {
                file.write_all(b"\n").map_err(werr)?;
            }
        }
        Ok(LogWriter {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Writes `records` as one write, then flushes them to disk.
    pub fn append(&mut self, records: &[Record]) -> Result<(), LogError> {
        let mut text = String::new();
        for r in records {
            text.push_str(&serde_json::to_string(r).expect("records always serialize"));
            text.push('\n');
        }
        let werr = |error| LogError::Write {
            path: self.path.clone(),
            error,
        };
        self.file.write_all(text.as_bytes()).map_err(werr)?;
        self.file.flush().map_err(werr)?;
        self.file.sync_data().map_err(werr)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpu::Timing;
    use gpu::worker::Simulated;
    use schedule::{GpuSpec, Sampler, parse_shape};

    /// A record of `task` (a matmul shape) with the given outcome, for tests.
    pub(crate) fn record(shape: &str, seed: u64, result: Outcome) -> Record {
        let task = Task::new(parse_shape("matmul", shape).unwrap(), Default::default()).unwrap();
        let state = Sampler::new(&task, &GpuSpec::h100(), seed)
            .sample()
            .unwrap();
        Record {
            version: RECORD_VERSION,
            task: task.key(),
            shape: task,
            state,
            result,
            compile: Some(CompileInfo {
                arch: "sm_90".into(),
                registers: 64,
                shared_bytes: 8192,
                stack_frame_bytes: 0,
                spill_bytes: 0,
                compile_ms: 120.5,
            }),
            device: Simulated::device(),
            nvrtc: "13.0".into(),
            tool_version: "0.1.0".into(),
            timestamp: "2026-11-22T10:00:00Z".into(),
            injected: None,
            source_hash: None,
        }
    }

    pub(crate) fn ok(us: f64) -> Outcome {
        Outcome::Ok(Timing {
            median_us: us,
            samples_us: vec![us as f32; 3],
        })
    }

    #[test]
    fn records_round_trip_through_a_log_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let records = vec![
            record("64,64,64", 1, ok(12.5)),
            record(
                "64,64,64",
                2,
                Outcome::error(ErrorKind::WrongAnswer, "output[3] = NaN, expected 1"),
            ),
        ];
        let mut writer = LogWriter::open(&path).unwrap();
        writer.append(&records[..1]).unwrap();
        writer.append(&records[1..]).unwrap();
        let log = read_log(&path).unwrap();
        assert_eq!(log.records, records);
        assert!(log.skipped.is_empty());
        assert_eq!(log.records[0].median_us(), Some(12.5));
        assert_eq!(log.records[1].error_kind(), Some(ErrorKind::WrongAnswer));
        // The format's field names are part of the contract.
        let line = std::fs::read_to_string(&path).unwrap();
        let first: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
        for field in [
            "version",
            "task",
            "shape",
            "state",
            "result",
            "compile",
            "device",
            "nvrtc",
            "tool_version",
            "timestamp",
        ] {
            assert!(first.get(field).is_some(), "{field} missing");
        }
        assert_eq!(first["result"]["ok"]["median_us"], 12.5);
        assert_eq!(first["shape"]["op"], "matmul");
    }

    #[test]
    fn truncated_and_malformed_lines_are_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let good = serde_json::to_string(&record("64,64,64", 1, ok(10.0))).unwrap();
        // A record, garbage, a blank line, a record cut short by a kill.
        let text = format!("{good}\nnot json\n\n{}", &good[..good.len() / 2]);
        std::fs::write(&path, text).unwrap();
        let log = read_log(&path).unwrap();
        assert_eq!(log.records.len(), 1);
        let lines: Vec<usize> = log.skipped.iter().map(|s| s.line).collect();
        assert_eq!(lines, [2, 4]);
        assert!(
            log.warning(&path)
                .unwrap()
                .contains("skipped 2 malformed line(s)")
        );
        // Appending after the cut line starts a new line: the new record survives.
        let mut writer = LogWriter::open(&path).unwrap();
        writer.append(&[record("64,64,64", 2, ok(9.0))]).unwrap();
        let log = read_log(&path).unwrap();
        assert_eq!(log.records.len(), 2);
        assert_eq!(log.skipped.len(), 2);
    }

    #[test]
    fn source_hashes_are_stable_and_tell_sources_apart() {
        assert_eq!(source_hash("a"), source_hash("a"));
        assert_ne!(source_hash("a"), source_hash("b"));
        // SHA-256("abc") starts ba7816bf 8f01cfea.
        assert_eq!(source_hash("abc"), "ba7816bf8f01cfea");
    }

    #[test]
    fn an_unreadable_log_is_an_error_naming_the_file() {
        let e = read_log(Path::new("/nonexistent/log.jsonl")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/log.jsonl"));
    }
}
