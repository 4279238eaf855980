//! Per-task summaries of a log (best time, trials, failures by kind) and the tables
//! that `tune` and `best` print.

use crate::record::{LogError, LogSink, Record, Skipped, read_log_into, skipped_warning};
use gpu::ErrorKind;
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::Path;

/// What a log says about one task; `R` is its best record or a reference to it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskTally<R> {
    pub task: String,
    /// Records of the task (measured candidates, failed ones included; a spoiled one
    /// measured again is not counted).
    pub trials: usize,
    /// The fastest correct record.
    pub best: Option<R>,
    pub errors: BTreeMap<ErrorKind, usize>,
}

/// A task's tally borrowing its best record from a log held in memory.
pub type TaskSummary<'a> = TaskTally<&'a Record>;

impl<R: Borrow<Record>> TaskTally<R> {
    pub fn best_us(&self) -> Option<f64> {
        self.best.as_ref().and_then(|b| b.borrow().median_us())
    }

    pub fn failed(&self) -> usize {
        self.errors.values().sum()
    }
}

/// Summaries built one record at a time: what they hold grows with the tasks (and the
/// spoiled records), never with the log, so a day-long campaign's log is summarized in
/// bounded memory. `R` is a record or a reference to one.
pub struct Summarizer<R> {
    keys: Vec<String>,
    tasks: HashMap<String, Tally<R>>,
}

struct Tally<R> {
    trials: usize,
    best: Option<R>,
    errors: BTreeMap<ErrorKind, usize>,
    /// Spoiled records' states, and whether each was measured again since (then the
    /// spoiled record is not a trial of its own: a resumed run re-measures it).
    spoiled: HashMap<String, bool>,
}

impl<R> Default for Tally<R> {
    fn default() -> Self {
        Tally {
            trials: 0,
            best: None,
            errors: BTreeMap::new(),
            spoiled: HashMap::new(),
        }
    }
}

impl<R: Borrow<Record>> Summarizer<R> {
    /// Summaries of the tasks in `order` (tasks without records included), followed by
    /// any other task in order of first appearance.
    pub fn new(order: &[String]) -> Self {
        Summarizer {
            keys: order.to_vec(),
            tasks: HashMap::new(),
        }
    }

    pub fn add(&mut self, record: R) {
        let r = record.borrow();
        if !self.tasks.contains_key(&r.task) {
            if !self.keys.contains(&r.task) {
                self.keys.push(r.task.clone());
            }
            self.tasks.insert(r.task.clone(), Tally::default());
        }
        let tally = self.tasks.get_mut(&r.task).expect("inserted above");
        if r.spoiled() {
            tally.spoiled.insert(r.state.id(), false);
        } else if let Some(again) = tally.spoiled.get_mut(&r.state.id())
            && !*again
        {
            // The spoiled record of this state no longer counts.
            *again = true;
            tally.trials -= 1;
            if let Some(n) = tally.errors.get_mut(&ErrorKind::Environment) {
                *n -= 1;
                if *n == 0 {
                    tally.errors.remove(&ErrorKind::Environment);
                }
            }
        }
        tally.trials += 1;
        if let Some(kind) = r.error_kind() {
            *tally.errors.entry(kind).or_insert(0) += 1;
        }
        if let Some(us) = r.median_us()
            && tally
                .best
                .as_ref()
                .and_then(|b| b.borrow().median_us())
                .is_none_or(|b| us < b)
        {
            tally.best = Some(record);
        }
    }

    /// The tallies, in task order.
    pub fn finish(mut self) -> Vec<TaskTally<R>> {
        self.keys
            .into_iter()
            .map(|task| {
                let t = self.tasks.remove(&task).unwrap_or_default();
                TaskTally {
                    task,
                    trials: t.trials,
                    best: t.best,
                    errors: t.errors,
                }
            })
            .collect()
    }
}

/// Summaries of the tasks in `order` (tasks without records included), followed by any
/// other task of the log in order of first appearance. A spoiled record whose candidate
/// was measured again is not counted.
pub fn summarize<'a>(records: &'a [Record], order: &[String]) -> Vec<TaskSummary<'a>> {
    let mut s = Summarizer::new(order);
    for r in records {
        s.add(r);
    }
    s.finish()
}

/// A log's summaries, read in bounded memory (see [`Summarizer`]): per task (in order of
/// first appearance) its tally with the best record itself, and the lines skipped.
pub struct LogSummary {
    pub tasks: Vec<TaskTally<Record>>,
    pub skipped: usize,
    pub first_skipped: Option<Skipped>,
}

impl LogSummary {
    /// One line for people about skipped lines, if any.
    pub fn warning(&self, path: &Path) -> Option<String> {
        Some(skipped_warning(
            path,
            self.skipped,
            self.first_skipped.as_ref()?,
        ))
    }

    /// The tallies as `TaskSummary`s (for the tables).
    pub fn summaries(&self) -> Vec<TaskSummary<'_>> {
        self.tasks
            .iter()
            .map(|t| TaskSummary {
                task: t.task.clone(),
                trials: t.trials,
                best: t.best.as_ref(),
                errors: t.errors.clone(),
            })
            .collect()
    }
}

/// Reading a log into a [`Summarizer`].
struct SummarySink {
    summarizer: Summarizer<Record>,
    skipped: usize,
    first_skipped: Option<Skipped>,
}

impl LogSink for SummarySink {
    fn record(&mut self, record: Record) {
        self.summarizer.add(record);
    }

    fn skipped(&mut self, skipped: Skipped) {
        self.skipped += 1;
        self.first_skipped.get_or_insert(skipped);
    }
}

/// Summarizes the log at `path` without holding its records (see [`LogSummary`]).
pub fn summarize_log(path: &Path) -> Result<LogSummary, LogError> {
    let mut sink = SummarySink {
        summarizer: Summarizer::new(&[]),
        skipped: 0,
        first_skipped: None,
    };
    read_log_into(path, &mut sink)?;
    Ok(LogSummary {
        tasks: sink.summarizer.finish(),
        skipped: sink.skipped,
        first_skipped: sink.first_skipped,
    })
}

fn errors_text(errors: &BTreeMap<ErrorKind, usize>) -> String {
    if errors.is_empty() {
        return "-".to_string();
    }
    errors
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The end-of-tuning table: task, best µs, TFLOP/s, trials, errors by kind, and a total.
pub fn tune_table(summaries: &[TaskSummary]) -> String {
    let mut out = String::new();
    let found = summaries.iter().filter(|s| s.best.is_some()).count();
    let total_label = format!("total ({found}/{} tasks with a kernel)", summaries.len());
    let width = summaries
        .iter()
        .map(|s| s.task.len())
        .chain([total_label.len()])
        .max()
        .unwrap_or(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:>10}  {:>8}  {:>6}  errors",
        "task", "best µs", "TFLOP/s", "trials"
    );
    for s in summaries {
        let best = s.best_us().map_or("-".to_string(), |us| format!("{us:.2}"));
        let tflops = s
            .best
            .and_then(Record::tflops)
            .map_or("-".to_string(), |t| format!("{t:.2}"));
        let _ = writeln!(
            out,
            "{:<width$}  {:>10}  {:>8}  {:>6}  {}",
            s.task,
            best,
            tflops,
            s.trials,
            errors_text(&s.errors)
        );
    }
    let total: f64 = summaries.iter().filter_map(TaskSummary::best_us).sum();
    let trials: usize = summaries.iter().map(|s| s.trials).sum();
    let mut all_errors = BTreeMap::new();
    for s in summaries {
        for (k, n) in &s.errors {
            *all_errors.entry(*k).or_insert(0) += n;
        }
    }
    let _ = writeln!(
        out,
        "{:<width$}  {:>10}  {:>8}  {:>6}  {}",
        total_label,
        format!("{total:.2}"),
        "",
        trials,
        errors_text(&all_errors)
    );
    // Every task left without a kernel, and why.
    let missing: Vec<String> = summaries
        .iter()
        .filter(|s| s.best.is_none())
        .map(|s| {
            let why = if s.trials == 0 {
                "not measured (the trials or the time budget ran out first)".to_string()
            } else {
                format!(
                    "{} trials, none correct ({})",
                    s.trials,
                    errors_text(&s.errors)
                )
            };
            format!("{}: {why}", s.task)
        })
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(out, "without a kernel: {}", missing.join("; "));
    }
    out
}

/// The `best` table: per task its best record's time, throughput, state id, registers
/// and device.
pub fn best_table(summaries: &[TaskSummary]) -> String {
    let mut out = String::new();
    let width = summaries
        .iter()
        .map(|s| s.task.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:>10}  {:>8}  {:>6}  {:<16}  {:>4}  device",
        "task", "best µs", "TFLOP/s", "trials", "state", "regs"
    );
    for s in summaries {
        match s.best {
            Some(r) => {
                let _ = writeln!(
                    out,
                    "{:<width$}  {:>10.2}  {:>8.2}  {:>6}  {:<16}  {:>4}  {}",
                    s.task,
                    r.median_us().unwrap_or(f64::NAN),
                    r.tflops().unwrap_or(f64::NAN),
                    s.trials,
                    r.state.id(),
                    r.compile.as_ref().map_or(0, |c| c.registers),
                    r.device.name
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "{:<width$}  {:>10}  {:>8}  {:>6}  no correct kernel ({})",
                    s.task,
                    "-",
                    "-",
                    s.trials,
                    errors_text(&s.errors)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{ok, record};
    use gpu::Outcome;

    fn records() -> Vec<Record> {
        vec![
            record("64,64,64", 1, ok(20.0)),
            record("64,64,64", 2, ok(12.5)),
            record("64,64,64", 3, Outcome::error(ErrorKind::Timeout, "late")),
            record("128,64,32", 1, Outcome::error(ErrorKind::WrongAnswer, "x")),
            record("128,64,32", 2, Outcome::error(ErrorKind::WrongAnswer, "y")),
        ]
    }

    #[test]
    fn summaries_pick_the_fastest_correct_record_and_count_errors() {
        let records = records();
        let order = vec!["matmul_m32_n32_k32".to_string()];
        let s = summarize(&records, &order);
        let tasks: Vec<&str> = s.iter().map(|s| s.task.as_str()).collect();
        assert_eq!(
            tasks,
            [
                "matmul_m32_n32_k32",
                "matmul_m64_n64_k64",
                "matmul_m128_n64_k32"
            ]
        );
        assert_eq!((s[0].trials, s[0].best_us()), (0, None));
        assert_eq!(
            (s[1].trials, s[1].best_us(), s[1].failed()),
            (3, Some(12.5), 1)
        );
        assert_eq!(s[2].errors[&ErrorKind::WrongAnswer], 2);
        assert!(s[2].best.is_none());
    }

    /// The streamed summaries of a log file equal the in-memory ones; a spoiled record
    /// counts until its candidate is measured again, then not at all.
    #[test]
    fn a_streamed_log_summarizes_like_one_in_memory() {
        let mut records = records();
        let spoiled = record(
            "64,64,64",
            4,
            Outcome::error(ErrorKind::Environment, "worker lost"),
        );
        records.insert(1, spoiled.clone());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let mut writer = crate::LogWriter::open(&path).unwrap();
        writer.append(&records).unwrap();
        let streamed = summarize_log(&path).unwrap();
        assert_eq!(streamed.summaries(), summarize(&records, &[]));
        let first = &streamed.summaries()[0];
        assert_eq!((first.trials, first.errors.len()), (4, 2), "{first:?}");
        // Measured again, correctly: the spoiled record no longer counts.
        let mut again = record("64,64,64", 4, ok(30.0));
        again.state = spoiled.state.clone();
        records.push(again);
        let s = summarize(&records, &[]);
        assert_eq!(s[0].trials, 4);
        assert!(
            !s[0].errors.contains_key(&ErrorKind::Environment),
            "{:?}",
            s[0]
        );
    }

    #[test]
    fn tables_are_stable() {
        let records = records();
        let s = summarize(&records, &[]);
        insta::assert_snapshot!("tune_table", tune_table(&s));
        let table = best_table(&s);
        // State ids and devices vary with the sampler; check the shape of the table.
        assert!(
            table.contains("no correct kernel (wrong_answer 2)"),
            "{table}"
        );
        assert!(table.contains("12.50"), "{table}");
    }
}
