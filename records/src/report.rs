//! Per-task summaries of a log (best time, trials, failures by kind) and the tables
//! that `tune` and `best` print.

use crate::record::Record;
use gpu::ErrorKind;
use std::collections::BTreeMap;
use std::fmt::Write;

/// What a log says about one task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSummary<'a> {
    pub task: String,
    /// Records of the task (measured candidates, failed ones included).
    pub trials: usize,
    /// The fastest correct record.
    pub best: Option<&'a Record>,
    pub errors: BTreeMap<ErrorKind, usize>,
}

impl TaskSummary<'_> {
    pub fn best_us(&self) -> Option<f64> {
        self.best.and_then(Record::median_us)
    }

    pub fn failed(&self) -> usize {
        self.errors.values().sum()
    }
}

/// Summaries of the tasks in `order` (tasks without records included), followed by any
/// other task of the log in order of first appearance.
pub fn summarize<'a>(records: &'a [Record], order: &[String]) -> Vec<TaskSummary<'a>> {
    let mut keys: Vec<String> = order.to_vec();
    for r in records {
        if !keys.contains(&r.task) {
            keys.push(r.task.clone());
        }
    }
    keys.into_iter()
        .map(|task| {
            // A spoiled record whose candidate was measured again (a resumed run) is
            // not a trial of its own.
            let remeasured: std::collections::HashSet<String> = records
                .iter()
                .filter(|r| r.task == task && !r.spoiled())
                .map(|r| r.state.id())
                .collect();
            let mine: Vec<&Record> = records
                .iter()
                .filter(|r| r.task == task && !(r.spoiled() && remeasured.contains(&r.state.id())))
                .collect();
            let mut errors = BTreeMap::new();
            for kind in mine.iter().filter_map(|r| r.error_kind()) {
                *errors.entry(kind).or_insert(0) += 1;
            }
            let best = mine
                .iter()
                .copied()
                .filter(|r| r.median_us().is_some())
                .min_by(|a, b| a.median_us().unwrap().total_cmp(&b.median_us().unwrap()));
            TaskSummary {
                task,
                trials: mine.len(),
                best,
                errors,
            }
        })
        .collect()
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
