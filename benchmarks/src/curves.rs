//! Tuning curves: how good a network's kernels got as the search went on.
//!
//! A tuning log lists measurements in the order they were made, so replaying it gives
//! the curve that compares search strategies (as in the Ansor and AF-DS papers): after
//! each trial, the network's end-to-end estimate, the sum over its tasks of
//! `count × best median µs found so far`. The sum exists only once every task of the
//! network has at least one correct candidate; before that there is no point. The same
//! curve is also given against wall-clock seconds since the first trial, which charges a
//! strategy for its compile, measure and model time, and per task against that task's
//! own trials.
//!
//! Everything here is a pure function of the records and the workloads: no files, no
//! GPU. Records of tasks outside the workloads are ignored altogether (they neither
//! count as trials nor set the time origin), so one log shared by several networks gives
//! each network its own curve. Failed measurements count as trials but never improve a
//! best; so do "correct" measurements whose time is not a finite positive number.

use records::Record;
use schedule::Workload;
use std::collections::HashMap;
use std::time::UNIX_EPOCH;

/// One measurement, reduced to what the curves need.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    /// The task key.
    pub task: String,
    /// The median time of a correct candidate; `None` for a failure.
    pub median_us: Option<f64>,
    /// When it was recorded, in seconds since the Unix epoch; `None` where the record's
    /// timestamp does not parse.
    pub unix_s: Option<f64>,
}

impl Trial {
    /// The trial of a log record (its RFC 3339 timestamp parsed to Unix seconds).
    pub fn from_record(record: &Record) -> Trial {
        Trial {
            task: record.task.clone(),
            median_us: record.median_us(),
            unix_s: parse_unix_seconds(&record.timestamp),
        }
    }
}

/// Seconds since the Unix epoch of an RFC 3339 timestamp (`2026-11-22T10:00:00Z`,
/// optionally with fractional seconds), or `None` if it does not parse.
pub fn parse_unix_seconds(timestamp: &str) -> Option<f64> {
    let time = humantime::parse_rfc3339_weak(timestamp.trim()).ok()?;
    let since = time.duration_since(UNIX_EPOCH).ok()?;
    Some(since.as_secs_f64())
}

/// The best-so-far curve of one task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskCurve {
    /// The task key.
    pub task: String,
    /// How many times the task occurs in the network (the weight of its time).
    pub count: u32,
    /// Trials of this task, failed ones included.
    pub trials: usize,
    /// `(trial of this task, 1-based; best median µs so far)`, one point per trial from
    /// the task's first correct candidate on. Empty if it never had one.
    pub best: Vec<(usize, f64)>,
}

impl TaskCurve {
    /// The task's best median µs at the end of the log.
    pub fn final_best(&self) -> Option<f64> {
        self.best.last().map(|&(_, us)| us)
    }
}

/// The tuning curve of a network.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NetworkCurve {
    /// `(trial, 1-based over the network's records; Σ count × best µs)`, one point per
    /// trial from the first one after which every task has a correct candidate.
    pub by_trial: Vec<(usize, f64)>,
    /// `(seconds since the first trial; Σ count × best µs)`, for the same trials as
    /// `by_trial`, less those whose timestamp does not parse.
    pub by_seconds: Vec<(f64, f64)>,
    /// One curve per distinct task of the workloads, in the workloads' order.
    pub tasks: Vec<TaskCurve>,
    /// Records of the network's tasks in the log (failed ones included).
    pub trials: usize,
    /// Of those, records whose timestamp did not parse (absent from `by_seconds`).
    pub bad_timestamps: usize,
}

impl NetworkCurve {
    /// The network's weighted sum at the end of the log, if every task succeeded.
    pub fn final_sum(&self) -> Option<f64> {
        self.by_trial.last().map(|&(_, us)| us)
    }

    /// Tasks that never had a correct candidate (why `by_trial` may be empty).
    pub fn unfinished_tasks(&self) -> impl Iterator<Item = &str> {
        self.tasks
            .iter()
            .filter(|t| t.best.is_empty())
            .map(|t| t.task.as_str())
    }
}

/// The tuning curve of the network `workloads` from a log's records, in file order.
pub fn network_curve(records: &[Record], workloads: &[Workload]) -> NetworkCurve {
    let weights: Vec<(String, u32)> = workloads.iter().map(|w| (w.task.key(), w.count)).collect();
    let trials: Vec<Trial> = records.iter().map(Trial::from_record).collect();
    curve_of_trials(&trials, &weights)
}

/// The tuning curve of the network whose tasks are `weights` (`(task key, count)`; a
/// key listed twice has its counts added) from trials in measurement order.
pub fn curve_of_trials(trials: &[Trial], weights: &[(String, u32)]) -> NetworkCurve {
    // Distinct tasks in the workloads' order, with their summed counts.
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut tasks: Vec<TaskCurve> = Vec::new();
    for (key, count) in weights {
        match index.get(key.as_str()) {
            Some(&i) => tasks[i].count += count,
            None => {
                index.insert(key, tasks.len());
                tasks.push(TaskCurve {
                    task: key.clone(),
                    count: *count,
                    trials: 0,
                    best: Vec::new(),
                });
            }
        }
    }

    let mut best: Vec<Option<f64>> = vec![None; tasks.len()];
    let mut solved = 0usize;
    let mut sum: Option<f64> = None;
    let mut origin: Option<f64> = None;
    let mut curve = NetworkCurve::default();

    for trial in trials {
        let Some(&i) = index.get(trial.task.as_str()) else {
            continue;
        };
        curve.trials += 1;
        match trial.unix_s {
            Some(_) if origin.is_none() => origin = trial.unix_s,
            Some(_) => {}
            None => curve.bad_timestamps += 1,
        }

        tasks[i].trials += 1;
        if let Some(us) = trial.median_us.filter(|us| us.is_finite() && *us > 0.0) {
            let improved = match best[i] {
                None => {
                    solved += 1;
                    true
                }
                Some(b) => us < b,
            };
            if improved {
                best[i] = Some(us);
                if solved == tasks.len() {
                    // Recomputed rather than updated, so no rounding drift accumulates.
                    sum = Some(
                        tasks
                            .iter()
                            .zip(&best)
                            .map(|(t, b)| f64::from(t.count) * b.unwrap_or(0.0))
                            .sum(),
                    );
                }
            }
        }
        if let Some(b) = best[i] {
            let task = &mut tasks[i];
            task.best.push((task.trials, b));
        }

        if let Some(s) = sum {
            curve.by_trial.push((curve.trials, s));
            if let (Some(t), Some(t0)) = (trial.unix_s, origin) {
                curve.by_seconds.push((t - t0, s));
            }
        }
    }
    curve.tasks = tasks;
    curve
}

/// One point of a tuning curve's table (`curve_points`).
#[derive(Debug, Clone, PartialEq)]
pub struct CurvePoint {
    /// Trial, 1-based over the network's records.
    pub trial: usize,
    /// Seconds since the first trial.
    pub seconds: f64,
    /// `Σ count × best µs` so far.
    pub sum_us: f64,
    /// The geometric mean over the tasks of `reference / best so far` (None without a
    /// reference for every task).
    pub geomean: Option<f64>,
}

/// The tuning curve as a table, one point per trial with a timestamp from the first one
/// after which every task has a correct candidate: the weighted sum of the best times
/// so far and, where `reference` gives every task a time, the geometric mean of
/// `reference / best` (with `reference` the vendor's time scaled to the tuner's
/// protocol, the speedup over the vendor as the search went).
pub fn curve_points(
    trials: &[Trial],
    weights: &[(String, u32)],
    reference: &HashMap<String, f64>,
) -> Vec<CurvePoint> {
    let mut counts: Vec<(String, u32)> = Vec::new();
    for (key, count) in weights {
        match counts.iter_mut().find(|(k, _)| k == key) {
            Some((_, c)) => *c += count,
            None => counts.push((key.clone(), *count)),
        }
    }
    let mut best: Vec<Option<f64>> = vec![None; counts.len()];
    let (mut origin, mut seen) = (None, 0usize);
    let mut points = Vec::new();
    for trial in trials {
        let Some(i) = counts.iter().position(|(k, _)| *k == trial.task) else {
            continue;
        };
        seen += 1;
        origin = origin.or(trial.unix_s);
        if let Some(us) = trial.median_us.filter(|us| us.is_finite() && *us > 0.0) {
            best[i] = Some(best[i].map_or(us, |b: f64| b.min(us)));
        }
        let (Some(t), Some(t0)) = (trial.unix_s, origin) else {
            continue;
        };
        let Some(all) = best.iter().copied().collect::<Option<Vec<f64>>>() else {
            continue;
        };
        let sum_us = counts
            .iter()
            .zip(&all)
            .map(|((_, c), b)| f64::from(*c) * b)
            .sum();
        let logs: Option<Vec<f64>> = counts
            .iter()
            .zip(&all)
            .map(|((k, _), b)| reference.get(k).map(|r| (r / b).ln()))
            .collect();
        let geomean = logs.map(|l| (l.iter().sum::<f64>() / l.len() as f64).exp());
        points.push(CurvePoint {
            trial: seen,
            seconds: t - t0,
            sum_us,
            geomean,
        });
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu::worker::Simulated;
    use gpu::{ErrorKind, Outcome, Timing};
    use schedule::{GpuSpec, Sampler, Task, parse_shape};

    fn ok(task: &str, us: f64, t: f64) -> Trial {
        Trial {
            task: task.into(),
            median_us: Some(us),
            unix_s: Some(t),
        }
    }

    fn failed(task: &str, t: f64) -> Trial {
        Trial {
            task: task.into(),
            median_us: None,
            unix_s: Some(t),
        }
    }

    fn weights(w: &[(&str, u32)]) -> Vec<(String, u32)> {
        w.iter().map(|&(k, c)| (k.to_string(), c)).collect()
    }

    #[test]
    fn the_sum_starts_once_every_task_has_succeeded_and_only_improves() {
        // Network: a ×2, b ×1.
        let trials = [
            ok("a", 10.0, 100.0), // 1: b unsolved, no point
            failed("b", 101.0),   // 2: still no point
            ok("b", 5.0, 103.0),  // 3: 2·10 + 5 = 25
            ok("a", 12.0, 104.0), // 4: worse, 25
            ok("a", 8.0, 106.0),  // 5: 2·8 + 5 = 21
            failed("a", 107.0),   // 6: failure, 21
            ok("b", 4.0, 110.0),  // 7: 2·8 + 4 = 20
        ];
        let c = curve_of_trials(&trials, &weights(&[("a", 2), ("b", 1)]));
        assert_eq!(
            c.by_trial,
            [(3, 25.0), (4, 25.0), (5, 21.0), (6, 21.0), (7, 20.0)]
        );
        assert_eq!(
            c.by_seconds,
            [
                (3.0, 25.0),
                (4.0, 25.0),
                (6.0, 21.0),
                (7.0, 21.0),
                (10.0, 20.0)
            ]
        );
        assert_eq!(c.trials, 7);
        assert_eq!(c.bad_timestamps, 0);
        assert_eq!(c.final_sum(), Some(20.0));

        assert_eq!(c.tasks.len(), 2);
        let a = &c.tasks[0];
        assert_eq!((a.task.as_str(), a.count, a.trials), ("a", 2, 4));
        assert_eq!(a.best, [(1, 10.0), (2, 10.0), (3, 8.0), (4, 8.0)]);
        let b = &c.tasks[1];
        assert_eq!((b.task.as_str(), b.count, b.trials), ("b", 1, 3));
        // b's first trial failed: its curve starts at its second trial.
        assert_eq!(b.best, [(2, 5.0), (3, 4.0)]);
        assert_eq!(b.final_best(), Some(4.0));
        assert_eq!(c.unfinished_tasks().count(), 0);
    }

    #[test]
    fn a_task_that_never_succeeds_leaves_the_network_curve_empty() {
        let trials = [
            ok("a", 10.0, 0.0),
            failed("b", 1.0),
            ok("a", 9.0, 2.0),
            failed("b", 3.0),
        ];
        let c = curve_of_trials(&trials, &weights(&[("a", 1), ("b", 3)]));
        assert!(c.by_trial.is_empty());
        assert!(c.by_seconds.is_empty());
        assert_eq!(c.final_sum(), None);
        assert_eq!(c.trials, 4);
        assert_eq!(c.tasks[0].best, [(1, 10.0), (2, 9.0)]);
        assert_eq!(c.tasks[1].trials, 2);
        assert!(c.tasks[1].best.is_empty());
        assert_eq!(c.tasks[1].final_best(), None);
        assert_eq!(c.unfinished_tasks().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn other_tasks_are_ignored_and_do_not_set_the_time_origin() {
        let trials = [
            ok("other", 1.0, 50.0),
            ok("a", 4.0, 60.0),
            ok("other", 0.5, 61.0),
            ok("a", 3.0, 62.5),
        ];
        let c = curve_of_trials(&trials, &weights(&[("a", 3)]));
        assert_eq!(c.trials, 2);
        assert_eq!(c.by_trial, [(1, 12.0), (2, 9.0)]);
        assert_eq!(c.by_seconds, [(0.0, 12.0), (2.5, 9.0)]);
        assert_eq!(c.tasks.len(), 1);
    }

    #[test]
    fn repeated_workload_keys_add_their_counts() {
        let trials = [ok("a", 2.0, 0.0), ok("b", 1.0, 1.0)];
        let c = curve_of_trials(&trials, &weights(&[("a", 1), ("b", 1), ("a", 2)]));
        assert_eq!(c.tasks.len(), 2);
        assert_eq!(c.tasks[0].count, 3);
        assert_eq!(c.by_trial, [(2, 7.0)]);
    }

    #[test]
    fn bad_times_and_timestamps_are_not_fatal() {
        let mut no_time = ok("a", 6.0, 0.0);
        no_time.unix_s = None;
        let trials = [
            no_time,                      // 1: sum 6, no time: origin not set
            ok("a", f64::NAN, 10.0),      // 2: NaN never improves; origin = 10
            ok("a", 0.0, 11.0),           // 3: zero is not a time either
            ok("a", f64::INFINITY, 12.0), // 4
            ok("a", 5.0, 14.0),           // 5: 5
        ];
        let c = curve_of_trials(&trials, &weights(&[("a", 1)]));
        assert_eq!(
            c.by_trial,
            [(1, 6.0), (2, 6.0), (3, 6.0), (4, 6.0), (5, 5.0)]
        );
        assert_eq!(
            c.by_seconds,
            [(0.0, 6.0), (1.0, 6.0), (2.0, 6.0), (4.0, 5.0)]
        );
        assert_eq!(c.bad_timestamps, 1);
    }

    #[test]
    fn no_trials_or_no_workloads_give_empty_curves() {
        let c = curve_of_trials(&[], &weights(&[("a", 1)]));
        assert_eq!(c.trials, 0);
        assert!(c.by_trial.is_empty());
        let c = curve_of_trials(&[ok("a", 1.0, 0.0)], &[]);
        assert_eq!(c, NetworkCurve::default());
    }

    #[test]
    fn timestamps_parse_as_written_by_the_log() {
        assert_eq!(parse_unix_seconds("1970-01-01T00:01:40Z"), Some(100.0));
        assert_eq!(parse_unix_seconds("1970-01-01T00:01:40.5Z"), Some(100.5));
        assert_eq!(
            parse_unix_seconds(
                &humantime::format_rfc3339_seconds(
                    UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000)
                )
                .to_string()
            ),
            Some(1_800_000_000.0)
        );
        assert_eq!(parse_unix_seconds("yesterday"), None);
        assert_eq!(parse_unix_seconds(""), None);
    }

    fn record(task: &Task, result: Outcome, timestamp: &str) -> Record {
        let state = Sampler::new(task, &GpuSpec::h100(), 1).sample().unwrap();
        Record {
            version: records::record::RECORD_VERSION,
            task: task.key(),
            shape: *task,
            state,
            result,
            compile: None,
            device: Simulated::device(0),
            nvrtc: "13.0".into(),
            tool_version: "0.1.0".into(),
            timestamp: timestamp.into(),
            injected: None,
            source_hash: None,
        }
    }

    fn timing(us: f64) -> Outcome {
        Outcome::Ok(Timing {
            median_us: us,
            samples_us: vec![us as f32; 3],
            raced: false,
            precise: false,
        })
    }

    #[test]
    fn records_and_workloads_give_the_same_curve() {
        let task = |shape: &str| {
            Task::new(parse_shape("matmul", shape).unwrap(), Default::default()).unwrap()
        };
        let (a, b, other) = (task("64,64,64"), task("128,64,64"), task("64,128,64"));
        let workloads = [
            Workload { task: a, count: 2 },
            Workload { task: b, count: 1 },
        ];
        let records = [
            record(&a, timing(10.0), "2026-11-22T10:00:00Z"),
            record(&other, timing(1.0), "2026-11-22T10:00:01Z"),
            record(
                &b,
                Outcome::error(ErrorKind::WrongAnswer, "output[0] = NaN"),
                "2026-11-22T10:00:02Z",
            ),
            record(&b, timing(5.0), "2026-11-22T10:00:05Z"),
            record(&a, timing(8.0), "not a time"),
            record(&b, timing(4.0), "2026-11-22T10:01:00Z"),
        ];
        let c = network_curve(&records, &workloads);
        assert_eq!(c.trials, 5);
        assert_eq!(c.by_trial, [(3, 25.0), (4, 21.0), (5, 20.0)]);
        assert_eq!(c.by_seconds, [(5.0, 25.0), (60.0, 20.0)]);
        assert_eq!(c.bad_timestamps, 1);
        assert_eq!(c.tasks[0].task, a.key());
        assert_eq!(c.tasks[1].best, [(2, 5.0), (3, 4.0)]);
    }

    #[test]
    fn the_table_gives_the_sum_and_the_geomean_over_the_reference() {
        let trials = vec![
            ok("a", 10.0, 100.0),
            ok("b", 40.0, 101.0),
            ok("a", 5.0, 103.0),
            ok("b", 80.0, 104.0),
        ];
        let weights = vec![("a".to_string(), 2), ("b".to_string(), 1)];
        let reference: HashMap<String, f64> =
            [("a".to_string(), 10.0), ("b".to_string(), 40.0)].into();
        let points = curve_points(&trials, &weights, &reference);
        let got: Vec<(usize, f64, f64)> = points
            .iter()
            .map(|p| (p.trial, p.seconds, p.sum_us))
            .collect();
        // From the second trial (both tasks solved): 2·10 + 40, then 2·5 + 40; a's
        // speedup 1 then 2, b's 1 throughout.
        assert_eq!(got, vec![(2, 1.0, 60.0), (3, 3.0, 50.0), (4, 4.0, 50.0)]);
        let geomeans: Vec<f64> = points.iter().map(|p| p.geomean.unwrap()).collect();
        for (g, want) in geomeans.iter().zip([1.0, 2f64.sqrt(), 2f64.sqrt()]) {
            assert!((g - want).abs() < 1e-12, "{geomeans:?}");
        }
        assert!(
            curve_points(&trials, &weights, &HashMap::new())[0]
                .geomean
                .is_none()
        );
    }
}
