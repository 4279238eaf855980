//! The kernel database: what earlier tunes measured, kept as a starting point for new
//! tasks (transfer). Per task and GPU it holds the fastest correct states of the logs it
//! was read from (`PER_TASK` of them, with their times), and it answers which tuned
//! tasks are nearest to a new one: the same operator, element types, layout and kind of
//! convolution, on a GPU of the same compute capability (a state carries over between
//! chips of one architecture; its time does not), nearest by shape.
//!
//! It is read from tuning logs (files, or directories searched for `*.jsonl` and
//! `*.jsonl.gz`; `best --json`'s arrays of records too), and written in a compact form of its own (one entry per line, without
//! a record's samples and compile details), which `read` takes as well. The project
//! ships one for Hopper (`shipped`), built from the committed results of its tunes.
//! The database is read-only to a search, and `without` drops the tasks being tuned,
//! so a task never starts from its own records.

use crate::record::{LogError, LogSink, Record, Skipped, read_log_into};
use crate::validate::check_record;
use flate2::bufread::MultiGzDecoder;
use schedule::{Operator, State, Task};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// States kept per task and GPU: the fastest ones.
pub const PER_TASK: usize = 8;

/// One kept state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub task: Task,
    /// The GPU's name and compute capability.
    pub gpu: String,
    pub cc: (u32, u32),
    /// Its median time.
    pub us: f64,
    pub state: State,
}

/// A task's kept states on one GPU, fastest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuned {
    pub task: Task,
    pub gpu: String,
    pub cc: (u32, u32),
    pub states: Vec<(f64, State)>,
}

#[derive(Debug, Error)]
pub enum DbError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("kernel database {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("kernel database {path}: no tuning log or database found there")]
    Empty { path: PathBuf },
}

/// See the module doc.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelDb {
    /// By task key, then GPU name.
    tasks: BTreeMap<(String, String), Tuned>,
}

/// The database the project ships for Hopper GPUs (compute capability 9.0).
const HOPPER: &[u8] = include_bytes!("../db/hopper.jsonl.gz");

impl KernelDb {
    /// The database shipped for GPUs of compute capability `cc`, if there is one.
    pub fn shipped(cc: (u32, u32)) -> Option<KernelDb> {
        if cc != (9, 0) {
            return None;
        }
        let mut db = KernelDb::default();
        let text = BufReader::new(MultiGzDecoder::new(HOPPER));
        for line in text.lines() {
            let line = line.expect("the shipped database decompresses");
            let entry: Entry = serde_json::from_str(&line).expect("the shipped database parses");
            db.offer(entry);
        }
        Some(db)
    }

    /// Reads each of `paths`: a tuning log, a database `write` wrote, or a directory
    /// searched for both. A path with nothing to read is an error.
    pub fn read(paths: &[PathBuf]) -> Result<KernelDb, DbError> {
        let mut db = KernelDb::default();
        let mut entries = Vec::new();
        read_paths(paths, &mut db, &mut |e| entries.push(e))?;
        for entry in entries {
            db.offer(entry);
        }
        Ok(db)
    }

    /// Keeps `entry` if it is among its task's fastest on its GPU.
    pub fn offer(&mut self, entry: Entry) {
        let key = (entry.task.key(), entry.gpu.clone());
        let tuned = self.tasks.entry(key).or_insert_with(|| Tuned {
            task: entry.task,
            gpu: entry.gpu.clone(),
            cc: entry.cc,
            states: Vec::new(),
        });
        // A state measured again keeps its fastest time.
        if let Some(at) = tuned.states.iter().position(|(_, s)| *s == entry.state) {
            if tuned.states[at].0 <= entry.us {
                return;
            }
            tuned.states.remove(at);
        }
        let at = tuned.states.partition_point(|(us, _)| *us <= entry.us);
        if at < PER_TASK {
            tuned.states.insert(at, (entry.us, entry.state));
            tuned.states.truncate(PER_TASK);
        }
    }

    /// Adds `other`'s states.
    pub fn merge(&mut self, other: &KernelDb) {
        for tuned in other.tasks.values() {
            for (us, state) in &tuned.states {
                self.offer(Entry {
                    task: tuned.task,
                    gpu: tuned.gpu.clone(),
                    cc: tuned.cc,
                    us: *us,
                    state: state.clone(),
                });
            }
        }
    }

    /// The database without the tasks whose keys are in `keys`.
    pub fn without(mut self, keys: &[String]) -> KernelDb {
        self.tasks.retain(|(key, _), _| !keys.contains(key));
        self
    }

    /// The database without any task of `tasks`, nor one that differs from such a task
    /// only in its epilogue (the same convolution or product with a bias or a ReLU
    /// fused, as an ONNX model's): the tasks being tuned, which must never start from
    /// their own records.
    pub fn without_tasks(mut self, tasks: &[Task]) -> KernelDb {
        let bare = |t: &Task| Task {
            epilogue: Default::default(),
            ..*t
        };
        let tuned: Vec<Task> = tasks.iter().map(bare).collect();
        self.tasks.retain(|_, t| !tuned.contains(&bare(&t.task)));
        self
    }

    /// The keys of the tasks it holds.
    pub fn keys(&self) -> impl Iterator<Item = String> + '_ {
        self.tasks.keys().map(|(k, _)| k.clone())
    }

    /// Tasks (on some GPU) the database holds.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// States kept, over all tasks.
    pub fn states(&self) -> usize {
        self.tasks.values().map(|t| t.states.len()).sum()
    }

    /// Up to `k` tuned tasks nearest to `task` (never `task` itself) on a GPU of
    /// compute capability `cc`, nearest first; of a task tuned on several such GPUs,
    /// the one named `gpu` if any.
    pub fn nearest(&self, task: &Task, cc: (u32, u32), gpu: &str, k: usize) -> Vec<&Tuned> {
        let key = task.key();
        let mut near: BTreeMap<String, (f64, &Tuned)> = BTreeMap::new();
        for ((other, name), tuned) in &self.tasks {
            if *other == key || tuned.cc != cc {
                continue;
            }
            let Some(d) = distance(task, &tuned.task) else {
                continue;
            };
            // Another chip of the same architecture is a little further.
            let d = d + if name == gpu { 0.0 } else { 0.01 };
            match near.get(other) {
                Some((e, _)) if *e <= d => {}
                _ => {
                    near.insert(other.clone(), (d, tuned));
                }
            }
        }
        let mut near: Vec<(f64, &Tuned)> = near.into_values().collect();
        near.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then_with(|| a.1.task.key().cmp(&b.1.task.key()))
        });
        near.into_iter().take(k).map(|(_, t)| t).collect()
    }

    /// Writes the database in its own form, gzipped: one entry per line, by task key,
    /// GPU and time.
    pub fn write(&self, path: &Path) -> Result<(), DbError> {
        let io = |error| DbError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut out = flate2::write::GzEncoder::new(file, flate2::Compression::best());
        for tuned in self.tasks.values() {
            for (us, state) in &tuned.states {
                let entry = Entry {
                    task: tuned.task,
                    gpu: tuned.gpu.clone(),
                    cc: tuned.cc,
                    us: *us,
                    state: state.clone(),
                };
                let line = serde_json::to_string(&entry).expect("entries serialize");
                writeln!(out, "{line}").map_err(io)?;
            }
        }
        out.finish().map_err(io)?;
        Ok(())
    }
}

impl LogSink for KernelDb {
    fn record(&mut self, record: Record) {
        // A raced time is a probe's, not the full protocol's.
        let us = match &record.result {
            gpu::Outcome::Ok(t) if !t.raced && record.injected.is_none() => t.median_us,
            _ => return,
        };
        self.offer(Entry {
            task: record.shape,
            gpu: record.device.name.clone(),
            cc: record.device.compute_capability,
            us,
            state: record.state,
        });
    }

    fn skipped(&mut self, _: Skipped) {}
}

/// Reads every record of `paths` (tuning logs, `best --json` arrays, or directories
/// searched for `*.jsonl` and `*.jsonl.gz` files) into `sink`, each validated as a
/// log's reader validates it. A path with nothing to read is an error. Kernel databases
/// among them (`KernelDb::write`'s form) are skipped.
pub fn read_records(paths: &[PathBuf], sink: &mut impl LogSink) -> Result<(), DbError> {
    read_paths(paths, sink, &mut |_| {})
}

/// `read_records`, handing the entries of kernel databases to `entries`.
fn read_paths(
    paths: &[PathBuf],
    sink: &mut impl LogSink,
    entries: &mut dyn FnMut(Entry),
) -> Result<(), DbError> {
    for path in paths {
        let files = if path.is_dir() {
            let mut files = Vec::new();
            find_logs(path, &mut files).map_err(|error| DbError::Io {
                path: path.clone(),
                error,
            })?;
            files.sort();
            files
        } else {
            vec![path.clone()]
        };
        if files.is_empty() {
            return Err(DbError::Empty { path: path.clone() });
        }
        for file in files {
            read_file(&file, sink, entries)?;
        }
    }
    Ok(())
}

/// One file of `read_paths`: a database's entries, a JSON array of records, or a log.
fn read_file(
    path: &Path,
    sink: &mut impl LogSink,
    entries: &mut dyn FnMut(Entry),
) -> Result<(), DbError> {
    let io = |error| DbError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut first = String::new();
    let file = std::fs::File::open(path).map_err(io)?;
    let mut reader = BufReader::new(file);
    let gzip = reader.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    let mut text: Box<dyn BufRead> = if gzip {
        Box::new(BufReader::new(MultiGzDecoder::new(reader)))
    } else {
        Box::new(reader)
    };
    text.read_line(&mut first).map_err(io)?;
    // `best --json`'s array of records.
    if first.trim() == "[" {
        let mut rest = String::new();
        text.read_to_string(&mut rest).map_err(io)?;
        let records: Vec<Record> = serde_json::from_str(&(first + &rest))
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        for r in records.into_iter().filter(|r| check_record(r).is_ok()) {
            sink.record(r);
        }
        return Ok(());
    }
    if serde_json::from_str::<Entry>(&first).is_ok() {
        let mut rest = String::new();
        text.read_to_string(&mut rest).map_err(io)?;
        for line in std::iter::once(first.as_str()).chain(rest.lines()) {
            if let Ok(entry) = serde_json::from_str::<Entry>(line) {
                entries(entry);
            }
        }
        return Ok(());
    }
    read_log_into(path, sink)?;
    Ok(())
}

/// Every `*.jsonl` and `*.jsonl.gz` file under `dir`.
fn find_logs(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            find_logs(&path, out)?;
        } else if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.gz"))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// How far apart two tasks' shapes are, for transfer: None when a state of one cannot
/// be a state of the other (another operator, element type, layout, epilogue's
/// presence of a bias... or a convolution of another kind: grouped, strided, another
/// filter size), else the sum of the absolute log-ratios of their GEMM dimensions
/// (rows, columns, reduction, batch), plus half a unit for another epilogue.
pub fn distance(a: &Task, b: &Task) -> Option<f64> {
    if a.op.name() != b.op.name()
        || a.dtype != b.dtype
        || a.out_dtype != b.out_dtype
        || a.layout != b.layout
    {
        return None;
    }
    if let (Operator::Conv2d(x), Operator::Conv2d(y)) = (a.op, b.op) {
        let kind = |c: &schedule::task::Conv2d| {
            (
                c.r,
                c.s,
                c.stride_h,
                c.stride_w,
                c.dilation_h,
                c.dilation_w,
                c.groups > 1,
                c.groups == c.c,
            )
        };
        if kind(&x) != kind(&y) {
            return None;
        }
    }
    let (ga, gb) = (gemm_dims(a), gemm_dims(b));
    let shape: f64 = ga
        .iter()
        .zip(&gb)
        .map(|(&x, &y)| (x.max(1) as f64 / y.max(1) as f64).ln().abs())
        .sum();
    let epilogue = if a.epilogue == b.epilogue { 0.0 } else { 0.5 };
    Some(shape + epilogue)
}

/// A task's GEMM dimensions: rows, columns, reduction and batch (a convolution's
/// implicit GEMM: N·P·Q, K, R·S·C/groups, and its groups).
fn gemm_dims(t: &Task) -> [u64; 4] {
    let c = t.contraction();
    match schedule::gemm::GemmView::of(&c) {
        Ok(v) => [v.m, v.n, v.k, v.batch],
        // No GEMM view (NCHW): outputs and the reduction.
        Err(_) => [
            c.output_elements(),
            1,
            c.reduction.iter().map(|a| u64::from(a.extent)).product(),
            1,
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{ok, record};

    fn matmul(m: u32, n: u32, k: u32) -> Task {
        Task::new(Operator::Matmul { m, n, k }, Default::default())
            .and_then(|t| {
                t.with_types(
                    schedule::DType::Fp16,
                    schedule::DType::Fp16,
                    schedule::Layout::Nchw,
                )
            })
            .unwrap()
    }

    fn entry(task: Task, us: f64, seed: u64) -> Entry {
        let gpu = schedule::GpuSpec::h100();
        let state = schedule::Sampler::new(&task, &gpu, seed).sample().unwrap();
        Entry {
            task,
            gpu: "NVIDIA H100 80GB HBM3".into(),
            cc: (9, 0),
            us,
            state,
        }
    }

    #[test]
    fn a_task_keeps_its_fastest_distinct_states() {
        let mut db = KernelDb::default();
        let t = matmul(256, 256, 256);
        for i in 0..20 {
            db.offer(entry(t, 100.0 - i as f64, i));
        }
        // The same state measured slower again changes nothing.
        db.offer(entry(t, 200.0, 19));
        assert_eq!(db.len(), 1);
        let times = |db: &KernelDb| -> Vec<f64> {
            let near = db.nearest(&matmul(512, 256, 256), (9, 0), "x", 4);
            near[0].states.iter().map(|(us, _)| *us).collect()
        };
        assert_eq!(
            times(&db),
            vec![81.0, 82.0, 83.0, 84.0, 85.0, 86.0, 87.0, 88.0]
        );
        // Measured faster, it keeps the faster time.
        db.offer(entry(t, 1.0, 19));
        assert_eq!(
            times(&db),
            vec![1.0, 82.0, 83.0, 84.0, 85.0, 86.0, 87.0, 88.0]
        );
    }

    #[test]
    fn the_task_being_tuned_never_comes_from_the_database() {
        let mut db = KernelDb::default();
        let (a, b) = (matmul(256, 256, 256), matmul(512, 512, 512));
        db.offer(entry(a, 10.0, 1));
        db.offer(entry(b, 20.0, 2));
        // Its own records are never its nearest, however near.
        let near = db.nearest(&a, (9, 0), "NVIDIA H100 80GB HBM3", 4);
        assert_eq!(near.len(), 1);
        assert_eq!(near[0].task, b);
        // And `without` drops them altogether.
        let db = db.without(&[b.key()]);
        assert!(db.nearest(&a, (9, 0), "x", 4).is_empty());
        assert_eq!(db.len(), 1);
    }

    #[test]
    fn the_tasks_being_tuned_leave_with_their_epilogue_variants() {
        let mut db = KernelDb::default();
        let plain = matmul(256, 256, 256);
        let biased = Task {
            epilogue: schedule::Epilogue {
                bias: true,
                relu: true,
            },
            ..plain
        };
        let other = matmul(512, 256, 256);
        for (t, seed) in [(plain, 1), (biased, 2), (other, 3)] {
            db.offer(entry(t, 1.0, seed));
        }
        let db = db.without_tasks(&[plain]);
        assert_eq!(db.keys().collect::<Vec<_>>(), vec![other.key()]);
    }

    #[test]
    fn nearness_is_by_shape_within_one_operator_type_and_architecture() {
        let mut db = KernelDb::default();
        for (m, seed) in [(128, 1), (1024, 2), (4096, 3)] {
            db.offer(entry(matmul(m, 1024, 1024), 1.0, seed));
        }
        let near = db.nearest(&matmul(900, 1024, 1024), (9, 0), "x", 2);
        let ms: Vec<u32> = near
            .iter()
            .map(|t| match t.task.op {
                Operator::Matmul { m, .. } => m,
                _ => 0,
            })
            .collect();
        // 1024 is 13% away, 4096 4.6x, 128 7x.
        assert_eq!(ms, vec![1024, 4096]);
        assert!(
            db.nearest(&matmul(900, 1024, 1024), (8, 0), "x", 2)
                .is_empty()
        );
        let f32_task = Task::new(
            Operator::Matmul {
                m: 900,
                n: 1024,
                k: 1024,
            },
            Default::default(),
        )
        .unwrap();
        assert!(db.nearest(&f32_task, (9, 0), "x", 2).is_empty());
    }

    #[test]
    fn the_database_reads_logs_and_its_own_form_alike() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.jsonl");
        let mut writer = crate::record::LogWriter::open(&log).unwrap();
        let (slow, fast) = (
            record("64,64,64", 1, ok(12.0)),
            record("64,64,64", 1, ok(11.0)),
        );
        writer.append(&[slow, fast]).unwrap();
        drop(writer);
        let db = KernelDb::read(std::slice::from_ref(&log)).unwrap();
        assert_eq!(db.states(), 1, "one state, its fastest time");
        assert_eq!(db.tasks.values().next().unwrap().states[0].0, 11.0);
        let out = dir.path().join("db.jsonl.gz");
        db.write(&out).unwrap();
        assert_eq!(KernelDb::read(&[out]).unwrap(), db);
        // A directory is searched; an empty one is refused.
        assert_eq!(KernelDb::read(&[dir.path().to_path_buf()]).unwrap(), db);
        let empty = tempfile::tempdir().unwrap();
        let e = KernelDb::read(&[empty.path().to_path_buf()]).unwrap_err();
        assert!(e.to_string().contains("no tuning log or database"), "{e}");
    }

    #[test]
    fn the_shipped_database_is_for_hopper() {
        let db = KernelDb::shipped((9, 0)).unwrap();
        assert!(db.len() > 50, "{} tasks", db.len());
        assert!(KernelDb::shipped((8, 0)).is_none());
    }
}
