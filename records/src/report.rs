//! Per-task summaries of a log (best time, trials, failures by kind), read in memory
//! bounded by the tasks, and the tables that `tune` and `best` print. A summary keeps
//! the task's fastest records (`ranking`): the best for `best` and the tables, a few
//! more for `export` and `deploy add` to fall back on (`kernel::best_regenerated`).

use crate::ranking::Fastest;
use crate::record::{LogError, LogSink, Record, Skipped, read_log_into, skipped_warning};
use gpu::ErrorKind;
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::Path;

/// What a log says about one task; `R` is a record or a reference to one.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskTally<R> {
    pub task: String,
    /// Records of the task (measured candidates, failed ones included; a spoiled one
    /// measured again is not counted).
    pub trials: usize,
    /// The fastest correct records, fastest first (`ranking`): as many as the
    /// summarizer kept (see [`Summarizer::keeping`]).
    pub fastest: Vec<R>,
    pub errors: BTreeMap<ErrorKind, usize>,
}

/// A task's tally borrowing its records from a log held in memory.
pub type TaskSummary<'a> = TaskTally<&'a Record>;

impl<R: Borrow<Record>> TaskTally<R> {
    /// The fastest correct record.
    pub fn best(&self) -> Option<&Record> {
        self.fastest.first().map(Borrow::borrow)
    }

    pub fn best_us(&self) -> Option<f64> {
        self.best().and_then(Record::median_us)
    }

    pub fn failed(&self) -> usize {
        self.errors.values().sum()
    }

    /// Correct records of the task, kept or not.
    pub fn correct(&self) -> usize {
        self.trials.saturating_sub(self.failed())
    }
}

/// Summaries built one record at a time: what they hold grows with the tasks (times the
/// records kept for each, and the spoiled records), never with the log, so a day-long
/// campaign's log is summarized in bounded memory. `R` is a record or a reference to one.
pub struct Summarizer<R> {
    keys: Vec<String>,
    /// Only the tasks in `keys`; records of others are passed over.
    only: bool,
    /// How many of each task's fastest correct records to keep.
    keep: usize,
    tasks: HashMap<String, Tally<R>>,
}

struct Tally<R> {
    trials: usize,
    fastest: Fastest<R>,
    errors: BTreeMap<ErrorKind, usize>,
    /// Spoiled records' states, and whether each was measured again since (then the
    /// spoiled record is not a trial of its own: a resumed run re-measures it).
    spoiled: HashMap<String, bool>,
}

impl<R: Borrow<Record>> Tally<R> {
    fn new(keep: usize) -> Self {
        Tally {
            trials: 0,
            fastest: Fastest::new(keep),
            errors: BTreeMap::new(),
            spoiled: HashMap::new(),
        }
    }
}

impl<R: Borrow<Record>> Summarizer<R> {
    /// Summaries of the tasks in `order` (tasks without records included), followed by
    /// any other task in order of first appearance; each keeps its best record.
    pub fn new(order: &[String]) -> Self {
        let mut keys: Vec<String> = Vec::with_capacity(order.len());
        for key in order {
            if !keys.contains(key) {
                keys.push(key.clone());
            }
        }
        Summarizer {
            keys,
            only: false,
            keep: 1,
            tasks: HashMap::new(),
        }
    }

    /// Summaries of the tasks in `keys` only (tasks without records included).
    pub fn only(keys: &[String]) -> Self {
        Summarizer {
            only: true,
            ..Summarizer::new(keys)
        }
    }

    /// Keeps each task's `keep` fastest correct records (at least the best).
    pub fn keeping(self, keep: usize) -> Self {
        Summarizer {
            keep: keep.max(1),
            ..self
        }
    }

    pub fn add(&mut self, record: R) {
        let r = record.borrow();
        if !self.tasks.contains_key(&r.task) {
            if !self.keys.contains(&r.task) {
                if self.only {
                    return;
                }
                self.keys.push(r.task.clone());
            }
            self.tasks.insert(r.task.clone(), Tally::new(self.keep));
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
        tally.fastest.offer(record);
    }

    /// The tallies, in task order.
    pub fn finish(mut self) -> Vec<TaskTally<R>> {
        let keep = self.keep;
        self.keys
            .into_iter()
            .map(|task| {
                let t = self.tasks.remove(&task).unwrap_or_else(|| Tally::new(keep));
                TaskTally {
                    task,
                    trials: t.trials,
                    fastest: t.fastest.into_ranked(),
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

/// A log's summaries, read in bounded memory (see [`Summarizer`]): per task its tally
/// with the records themselves, and the lines skipped.
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
                fastest: t.fastest.iter().collect(),
                errors: t.errors.clone(),
            })
            .collect()
    }
}

/// Reading a log into a [`Summarizer`]: of the skipped lines, the count and the first.
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

/// Summarizes the log at `path`, every task in order of first appearance with its best
/// record, without holding the log (see [`LogSummary`]).
pub fn summarize_log(path: &Path) -> Result<LogSummary, LogError> {
    read_summary(path, Summarizer::new(&[]))
}

/// Reads the log at `path` into `summarizer`, one record at a time: memory holds what
/// it keeps per task, not the log.
pub fn read_summary(path: &Path, summarizer: Summarizer<Record>) -> Result<LogSummary, LogError> {
    let mut sink = SummarySink {
        summarizer,
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
    let found = summaries.iter().filter(|s| s.best().is_some()).count();
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
            .best()
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
        .filter(|s| s.best().is_none())
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
        match s.best() {
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
    use crate::ranking::KEEP;
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
        assert!(s[2].best().is_none());
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

    /// `record` tagged `tag` (in its timestamp) with the time `us` (None: failed).
    fn tagged(shape: &str, tag: usize, us: Option<f64>) -> Record {
        let result = us.map_or_else(|| Outcome::error(ErrorKind::WrongAnswer, "x"), ok);
        let mut r = record(shape, 1, result);
        r.timestamp = tag.to_string();
        r
    }

    fn tags(records: &[impl Borrow<Record>]) -> Vec<String> {
        records
            .iter()
            .map(|r| r.borrow().timestamp.clone())
            .collect()
    }

    #[test]
    fn a_summarizer_keeps_each_tasks_fastest_records_in_order_and_counts_all() {
        let (a, b) = ("64,64,64", "128,64,32");
        let times = [
            (a, Some(30.0)),
            (b, None),
            (a, Some(10.0)),
            (a, None),
            (a, Some(20.0)),
            (b, Some(8.0)),
            (a, Some(10.0)),
            (a, Some(40.0)),
            (a, Some(5.0)),
        ];
        let records: Vec<Record> = times
            .iter()
            .enumerate()
            .map(|(i, &(shape, us))| tagged(shape, i, us))
            .collect();
        let mut s = Summarizer::new(&[]).keeping(3);
        for r in &records {
            s.add(r);
        }
        let s = s.finish();
        assert_eq!(
            s.iter().map(|t| t.task.as_str()).collect::<Vec<_>>(),
            ["matmul_m64_n64_k64", "matmul_m128_n64_k32"]
        );
        // 5 µs, then the two 10 µs records in log order; 20, 30 and 40 dropped.
        assert_eq!(tags(&s[0].fastest), ["8", "2", "6"]);
        assert_eq!((s[0].trials, s[0].failed(), s[0].correct()), (7, 1, 6));
        assert_eq!(tags(&s[1].fastest), ["5"]);
        assert_eq!((s[1].trials, s[1].correct()), (2, 1));
        // The best is the same record whatever is kept: `best`'s summary keeps one.
        let one = summarize(&records, &[]);
        assert_eq!(tags(&one[0].fastest), ["8"]);
        assert_eq!(one[0].trials, 7);
    }

    #[test]
    fn spoiled_records_are_never_ranked_and_counted_as_in_the_summary() {
        let spoiled = record(
            "64,64,64",
            4,
            Outcome::error(ErrorKind::Environment, "worker lost"),
        );
        let mut again = tagged("64,64,64", 1, Some(9.0));
        again.state = spoiled.state.clone();
        let records = [tagged("64,64,64", 0, Some(12.0)), spoiled, again];
        let mut s = Summarizer::new(&[]).keeping(KEEP);
        for r in &records {
            s.add(r);
        }
        let t = &s.finish()[0];
        // The spoiled record is no trial once measured again, and never a kernel.
        assert_eq!(tags(&t.fastest), ["1", "0"]);
        assert_eq!((t.trials, t.failed(), t.correct()), (2, 0, 2));
        let one = &summarize(&records, &[])[0];
        assert_eq!((one.trials, &one.errors), (t.trials, &t.errors));
        assert_eq!(tags(&one.fastest), ["1"]);
    }

    #[test]
    fn a_summarizer_for_some_tasks_reads_only_those() {
        let records = records();
        let keys = [
            "matmul_m128_n64_k32".to_string(),
            "matmul_m1_n1_k1".to_string(),
            "matmul_m128_n64_k32".to_string(),
        ];
        let mut s = Summarizer::only(&keys).keeping(KEEP);
        for r in &records {
            s.add(r);
        }
        let s = s.finish();
        // In the order asked, once each; a task without records has none.
        let got: Vec<(&str, usize)> = s.iter().map(|t| (t.task.as_str(), t.trials)).collect();
        assert_eq!(got, [("matmul_m128_n64_k32", 2), ("matmul_m1_n1_k1", 0)]);
        assert!(s.iter().all(|t| t.fastest.is_empty()));
    }

    /// A log read into a summarizer keeping `KEEP` records warns as `read_log` does.
    #[test]
    fn a_summary_read_from_a_file_keeps_the_logs_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let lines: Vec<String> = records()
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        let text = format!(
            "{}\nnot json\n{}\n{{}}\n",
            lines[..2].join("\n"),
            lines[2..].join("\n")
        );
        std::fs::write(&path, text).unwrap();
        let log = crate::read_log(&path).unwrap();
        let keys = ["matmul_m64_n64_k64".to_string()];
        let summary = read_summary(&path, Summarizer::only(&keys).keeping(KEEP)).unwrap();
        assert_eq!(summary.warning(&path), log.warning(&path));
        assert!(
            summary
                .warning(&path)
                .unwrap()
                .contains("skipped 2 malformed line(s) (first: line 3:")
        );
        assert_eq!(summary.tasks.len(), 1);
        assert_eq!(summary.tasks[0].trials, 3);
        assert_eq!(summary.tasks[0].best_us(), Some(12.5));
        assert_eq!(summary.tasks[0].fastest.len(), 2);
    }

    /// A tiny deterministic generator (xorshift64*) for the randomized test below.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// Over random logs (few distinct times, so ties abound; failed and spoiled
    /// records), a summarizer keeping `keep` records per task holds exactly the head
    /// of a full in-memory ranking: correct records stably sorted by time.
    #[test]
    fn kept_records_are_the_head_of_the_full_ranking_over_random_logs() {
        let shapes = ["64,64,64", "128,64,32", "32,32,32"];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            let len = rng.below(40) as usize;
            let records: Vec<Record> = (0..len)
                .map(|i| {
                    let shape = shapes[rng.below(3) as usize];
                    let mut r = match rng.below(6) {
                        0 => tagged(shape, i, None),
                        1 => tagged(shape, i, None),
                        _ => tagged(shape, i, Some(1.0 + rng.below(5) as f64)),
                    };
                    if rng.below(8) == 0 {
                        r.result = Outcome::error(ErrorKind::Environment, "lost");
                    }
                    r
                })
                .collect();
            for keep in [1, 2, 5, KEEP] {
                let mut s = Summarizer::new(&[]).keeping(keep);
                for r in &records {
                    s.add(r);
                }
                for t in s.finish() {
                    let mut full: Vec<&Record> = records
                        .iter()
                        .filter(|r| r.task == t.task && r.median_us().is_some())
                        .collect();
                    full.sort_by(|a, b| a.median_us().unwrap().total_cmp(&b.median_us().unwrap()));
                    full.truncate(keep);
                    assert_eq!(tags(&t.fastest), tags(&full), "keep {keep}");
                    let all = records.iter().filter(|r| r.task == t.task).count();
                    assert!(t.trials <= all && t.correct() >= full.len());
                }
            }
        }
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
