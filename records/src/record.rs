//! Tuning records: one JSON line per measured candidate, appended to a log that is the
//! single source for "best kernel of a task", resuming, model training and feature dumps.
//!
//! A batch's lines are written together, flushed and synced, so an interrupted run loses
//! at most the batch in flight. Readers skip lines that do not parse (a line cut short
//! by a kill, a hand edit), records that do not validate (`validate`) and lines over
//! `MAX_LINE_BYTES`, and count them, so one bad line never costs a log. Readers take
//! regular files only (a device or a pipe could be endless), gzipped or not.

use crate::validate::check_record;
use flate2::bufread::MultiGzDecoder;
use gpu::{DeviceInfo, ErrorKind, Outcome};
use schedule::{State, Task};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
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

    /// The environment spoiled the measurement (a worker lost, a device gone): the
    /// record says nothing of the candidate, so no model learns from it and no summary
    /// counts it once the candidate was measured again.
    pub fn spoiled(&self) -> bool {
        self.error_kind() == Some(ErrorKind::Environment)
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
    /// A device, a pipe or a directory: reading one could block or never end.
    #[error("tuning log {path} is not a regular file (it is {kind})")]
    NotAFile { path: PathBuf, kind: &'static str },
    /// Appending plain lines would corrupt the compressed stream.
    #[error(
        "cannot append to tuning log {path}: it is gzip-compressed (decompress it with gzip -d, or choose another log)"
    )]
    Compressed { path: PathBuf },
}

/// The longest line a reader takes. A record is a few KB; a longer line is damage (or
/// not a log at all), skipped without being held in memory.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The first bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

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
        Some(skipped_warning(
            path,
            self.skipped.len(),
            self.skipped.first()?,
        ))
    }
}

/// One line for people about `count` skipped lines of the log at `path`, the first of
/// them `first`.
pub fn skipped_warning(path: &Path, count: usize, first: &Skipped) -> String {
    format!(
        "warning: {}: skipped {count} malformed line(s) (first: line {}: {})",
        path.display(),
        first.line,
        first.reason
    )
}

/// Where a log's records go as it is read, one at a time: a reader that keeps what it
/// needs (the best record per task, say) reads a log of any length in bounded memory.
pub trait LogSink {
    /// A record that parsed and validated.
    fn record(&mut self, record: Record);
    /// A line that was skipped, and why.
    fn skipped(&mut self, skipped: Skipped);
}

impl LogSink for Log {
    fn record(&mut self, record: Record) {
        self.records.push(record);
    }

    fn skipped(&mut self, skipped: Skipped) {
        self.skipped.push(skipped);
    }
}

/// Takes one line: blank lines are ignored, lines that do not parse and records that do
/// not validate are skipped.
fn push_line(sink: &mut impl LogSink, number: usize, line: &str) {
    if line.trim().is_empty() {
        return;
    }
    let reason = match serde_json::from_str::<Record>(line) {
        Ok(record) => match check_record(&record) {
            Ok(()) => return sink.record(record),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    sink.skipped(Skipped {
        line: number,
        reason,
    });
}

fn skip_long(sink: &mut impl LogSink, line: usize) {
    sink.skipped(Skipped {
        line,
        reason: format!("line longer than {} MiB", MAX_LINE_BYTES >> 20),
    });
}

/// Parses a log's text; blank lines are ignored, bad lines and invalid records skipped
/// and counted.
pub fn parse_log(text: &str) -> Log {
    let mut log = Log::default();
    for (i, line) in text.lines().enumerate() {
        if line.len() > MAX_LINE_BYTES {
            skip_long(&mut log, i + 1);
        } else {
            push_line(&mut log, i + 1, line);
        }
    }
    log
}

/// One line of a stream, read with at most `MAX_LINE_BYTES` of it held.
enum Line {
    /// The line (without its end) is in the buffer.
    Complete,
    /// The line was longer than the bound; it was read to its end and dropped.
    TooLong,
    End,
}

/// Reads the next line into `buf` (cleared first), holding at most `max` bytes of it.
fn read_line_bounded(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buf.clear();
    let (mut any, mut too_long) = (false, false);
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        any = true;
        let newline = available.iter().position(|&b| b == b'\n');
        let chunk = &available[..newline.unwrap_or(available.len())];
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(available.len(), |i| i + 1);
        reader.consume(used);
        if newline.is_some() {
            break;
        }
    }
    Ok(match (any, too_long) {
        (false, _) => Line::End,
        (true, true) => Line::TooLong,
        (true, false) => Line::Complete,
    })
}

/// Whether a read error of a gzip stream is the stream's damage (a cut or corrupt
/// file: what was read before it stands) rather than the file's.
fn damaged_stream(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{InvalidData, InvalidInput, UnexpectedEof};
    matches!(e.kind(), InvalidData | InvalidInput | UnexpectedEof)
}

/// Reads a log from `reader` line by line (see `parse_log`).
fn read_lines(
    mut reader: impl BufRead,
    gzip: bool,
    path: &Path,
    sink: &mut impl LogSink,
) -> Result<(), LogError> {
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        number += 1;
        match read_line_bounded(&mut reader, &mut buf, MAX_LINE_BYTES) {
            Ok(Line::End) => break,
            Ok(Line::TooLong) => skip_long(sink, number),
            Ok(Line::Complete) => {
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
                // Invalid UTF-8 is replaced, so such a line is skipped, not fatal.
                push_line(sink, number, &String::from_utf8_lossy(&buf));
            }
            Err(e) if gzip && damaged_stream(&e) => {
                sink.skipped(Skipped {
                    line: number,
                    reason: format!("the gzip stream is damaged from here: {e}"),
                });
                break;
            }
            Err(error) => {
                return Err(LogError::Read {
                    path: path.to_path_buf(),
                    error,
                });
            }
        }
    }
    Ok(())
}

/// What a path that is not a regular file is, for the message.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

/// Whether `meta` is the null device (under any name). It reads as an empty log:
/// scripts and tests pass it for "no log", and it can neither block nor be endless.
fn is_dev_null(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    meta.file_type().is_char_device()
        && std::fs::metadata("/dev/null").is_ok_and(|null| null.rdev() == meta.rdev())
}

/// Refuses an existing path that is not a regular file (symbolic links are followed;
/// `/dev/null` is an empty log), without opening it: opening a pipe blocks until a
/// writer comes. True when it exists.
pub fn check_regular(path: &Path) -> Result<bool, LogError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() || is_dev_null(&meta) => Ok(true),
        Ok(meta) => Err(LogError::NotAFile {
            path: path.to_path_buf(),
            kind: file_kind(&meta),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(LogError::Read {
            path: path.to_path_buf(),
            error,
        }),
    }
}

/// Whether `path` names a gzipped log: a `.gz` name, or a file that starts with the
/// gzip magic bytes. Writers refuse these (see `LogError::Compressed`); readers
/// decompress by the content, so a plain log with a `.gz` name still reads.
pub fn is_compressed(path: &Path) -> bool {
    let named = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    named || starts_with_gzip_magic(path)
}

fn starts_with_gzip_magic(path: &Path) -> bool {
    let mut magic = [0u8; 2];
    // Only regular files are opened: a pipe would block.
    matches!(check_regular(path), Ok(true))
        && File::open(path).is_ok_and(|mut f| f.read_exact(&mut magic).is_ok())
        && magic == GZIP_MAGIC
}

/// Reads a log file, gzipped or not. Only regular files are read; lines are read one
/// at a time, so a huge line or file never has to fit in memory at once.
pub fn read_log(path: &Path) -> Result<Log, LogError> {
    let mut log = Log::default();
    read_log_into(path, &mut log)?;
    Ok(log)
}

/// Reads a log file (as [`read_log`]) into `sink`, one record at a time.
pub fn read_log_into(path: &Path, sink: &mut impl LogSink) -> Result<(), LogError> {
    let rerr = |error| LogError::Read {
        path: path.to_path_buf(),
        error,
    };
    // A missing file is left to `open`, whose error says so.
    check_regular(path)?;
    let mut reader = BufReader::new(File::open(path).map_err(rerr)?);
    let gzip = reader.fill_buf().map_err(rerr)?.starts_with(&GZIP_MAGIC);
    if gzip {
        read_lines(
            BufReader::new(MultiGzDecoder::new(reader)),
            true,
            path,
            sink,
        )
    } else {
        read_lines(reader, false, path, sink)
    }
}

/// Appends records to a log, a batch at a time.
pub struct LogWriter {
    path: PathBuf,
    file: File,
}

impl LogWriter {
    /// Opens (or creates) `path` for appending. A last line cut short by an earlier
    /// kill is ended first, so that it stays one skipped line instead of corrupting the
    /// next record. A gzipped log (by name or content) and a path that is not a regular
    /// file are refused.
    pub fn open(path: &Path) -> Result<LogWriter, LogError> {
        let werr = |error| LogError::Write {
            path: path.to_path_buf(),
            error,
        };
        if is_compressed(path) {
            return Err(LogError::Compressed {
                path: path.to_path_buf(),
            });
        }
        check_regular(path)?;
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
            device: Simulated::device(0),
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
            raced: false,
            precise: false,
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
        assert!(e.to_string().contains("No such file"), "{e}");
    }

    /// The text of a log: `n` valid records, one a line.
    fn lines(n: u64) -> String {
        (0..n)
            .map(|i| {
                serde_json::to_string(&record("64,64,64", i, ok(10.0 + i as f64))).unwrap() + "\n"
            })
            .collect()
    }

    #[test]
    fn an_overlong_line_is_skipped_without_costing_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let good = lines(2);
        let (first, second) = good.split_at(good.find('\n').unwrap() + 1);
        // A line of 3 MiB (no newline inside), then just over the bound, then exactly
        // at it (a blank line of spaces: taken and ignored).
        let long = "x".repeat(3 << 20);
        let over = " ".repeat(MAX_LINE_BYTES + 1);
        let at = " ".repeat(MAX_LINE_BYTES);
        let text = format!("{first}{long}\n{over}\r\n{at}\n{second}");
        std::fs::write(&path, &text).unwrap();
        let log = read_log(&path).unwrap();
        assert_eq!(log.records.len(), 2);
        let skipped: Vec<(usize, &str)> = log
            .skipped
            .iter()
            .map(|s| (s.line, s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            [(2, "line longer than 1 MiB"), (3, "line longer than 1 MiB")]
        );
        assert_eq!(parse_log(&text), log);
        // A log that ends in an overlong line without a newline.
        std::fs::write(&path, format!("{first}{long}")).unwrap();
        let log = read_log(&path).unwrap();
        assert_eq!((log.records.len(), log.skipped.len()), (1, 1));
    }

    #[test]
    fn the_bounded_line_reader_holds_at_most_the_bound() {
        // A reader that yields 64 KiB chunks of one endless-looking line.
        let text = format!("{}\nab\r\n\nlast", "y".repeat(300_000));
        let mut reader = std::io::BufReader::with_capacity(1 << 16, text.as_bytes());
        let mut buf = Vec::new();
        assert!(matches!(
            read_line_bounded(&mut reader, &mut buf, 100_000),
            Ok(Line::TooLong)
        ));
        assert!(buf.capacity() <= 100_000 + (1 << 16), "{}", buf.capacity());
        let mut next = || {
            let line = read_line_bounded(&mut reader, &mut buf, 100_000).unwrap();
            (matches!(line, Line::Complete), buf.clone())
        };
        assert_eq!(next(), (true, b"ab\r".to_vec()));
        assert_eq!(next(), (true, b"".to_vec()));
        assert_eq!(next(), (true, b"last".to_vec()));
        assert!(matches!(
            read_line_bounded(&mut reader, &mut buf, 100_000),
            Ok(Line::End)
        ));
    }

    #[test]
    fn non_regular_files_are_refused_naming_the_path() {
        let e = read_log(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "tuning log /dev/zero is not a regular file (it is a character device)"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = read_log(dir.path()).unwrap_err().to_string();
        assert!(
            e.ends_with("is not a regular file (it is a directory)"),
            "{e}"
        );
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            // Refused before it is opened: opening a pipe would block.
            let e = read_log(&fifo).unwrap_err().to_string();
            assert!(
                e.contains("fifo is not a regular file (it is a pipe)"),
                "{e}"
            );
            assert!(LogWriter::open(&fifo).is_err());
            assert!(!is_compressed(&fifo));
        }
        // A symbolic link to a log is read.
        let log = dir.path().join("log.jsonl");
        std::fs::write(&log, lines(1)).unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&log, &link).unwrap();
        assert_eq!(read_log(&link).unwrap().records.len(), 1);
        let e = LogWriter::open(Path::new("/dev/zero")).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // The null device is the empty log, under its name or another.
        assert_eq!(read_log(Path::new("/dev/null")).unwrap(), Log::default());
        let null = dir.path().join("null.jsonl");
        std::os::unix::fs::symlink("/dev/null", &null).unwrap();
        assert_eq!(read_log(&null).unwrap(), Log::default());
    }

    fn gzip(text: &str) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(text.as_bytes()).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn gzipped_logs_are_read_transparently() {
        let dir = tempfile::tempdir().unwrap();
        let text = lines(3);
        let plain = parse_log(&text);
        assert_eq!(plain.records.len(), 3);
        // By name, by content alone, and as two concatenated members (`gzip -c >>`).
        let gz = dir.path().join("log.jsonl.gz");
        std::fs::write(&gz, gzip(&text)).unwrap();
        assert_eq!(read_log(&gz).unwrap(), plain);
        let unnamed = dir.path().join("log.jsonl");
        std::fs::write(&unnamed, gzip(&text)).unwrap();
        assert_eq!(read_log(&unnamed).unwrap(), plain);
        assert!(is_compressed(&gz) && is_compressed(&unnamed));
        let (a, b) = text.split_at(text.find('\n').unwrap() + 1);
        let two = dir.path().join("two.gz");
        std::fs::write(&two, [gzip(a), gzip(b)].concat()).unwrap();
        assert_eq!(read_log(&two).unwrap(), plain);
        // A plain log with a .gz name is read as it is.
        let misnamed = dir.path().join("plain.gz");
        std::fs::write(&misnamed, &text).unwrap();
        assert_eq!(read_log(&misnamed).unwrap(), plain);
        // Damaged records inside are skipped as in a plain log.
        let damaged = format!("{text}not json\n");
        std::fs::write(&gz, gzip(&damaged)).unwrap();
        let log = read_log(&gz).unwrap();
        assert_eq!((log.records.len(), log.skipped.len()), (3, 1));
        assert_eq!(log.skipped[0].line, 4);
    }

    #[test]
    fn a_cut_or_corrupt_gzip_keeps_what_was_read_before_the_damage() {
        let dir = tempfile::tempdir().unwrap();
        // Enough records that the cut falls well after the first ones.
        let text = lines(40);
        let bytes = gzip(&text);
        let cut = dir.path().join("cut.jsonl.gz");
        std::fs::write(&cut, &bytes[..bytes.len() * 3 / 4]).unwrap();
        let log = read_log(&cut).unwrap();
        assert!(!log.records.is_empty() && log.records.len() < 40);
        assert_eq!(log.skipped.len(), 1, "{:?}", log.skipped);
        let warning = log.warning(&cut).unwrap();
        assert!(warning.contains("the gzip stream is damaged"), "{warning}");
        // A corrupt body (the header intact).
        let mut corrupt = bytes.clone();
        for b in &mut corrupt[20..60] {
            *b = !*b;
        }
        std::fs::write(&cut, &corrupt).unwrap();
        let log = read_log(&cut).unwrap();
        assert_eq!(log.skipped.len(), 1, "{:?}", log.skipped);
        assert!(log.skipped[0].reason.contains("gzip"), "{:?}", log.skipped);
    }

    #[test]
    fn gzipped_logs_are_never_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        // A new log with a .gz name would be plain text under a gzip name.
        let new = dir.path().join("new.jsonl.gz");
        let e = LogWriter::open(&new).err().unwrap();
        assert!(e.to_string().contains("gzip-compressed"), "{e}");
        assert!(!new.exists());
        // An existing gzipped log under any name is left as it was.
        let log = dir.path().join("log.jsonl");
        let bytes = gzip(&lines(1));
        std::fs::write(&log, &bytes).unwrap();
        assert!(LogWriter::open(&log).is_err());
        assert_eq!(std::fs::read(&log).unwrap(), bytes);
    }
}
