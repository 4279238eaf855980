//! Damaged tuning logs end to end without a GPU (issue 16, items 3 and 8): a log
//! written by the real tuner (simulated measurements, the hidden `--simulate`), then
//! copies of its records damaged in each way a reader must survive — a shape with
//! stride 0, a task key that is not its shape's, a state with an extra split level or
//! a zero thread factor, a negative or zero time, a line over 1 MiB — all made faster
//! than any real record. `best`, `export` and `tune --resume` must skip them with the
//! one-line warning, never panic, and never take one as the best kernel, a seed or a
//! trial. Logs that are not regular files are refused in one line; gzipped logs read
//! as they are, and are never appended to.

mod common;

use common::{fails, ok_err, tilesched};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const TASK: &str = "matmul_m64_n64_k32";

/// The tuner's arguments on `log`, for `trials` trials in all with random search.
fn tune_args(log: &Path, trials: &str) -> Vec<String> {
    tune_search(log, trials, "random")
}

/// The tuner's arguments on `log`, for `trials` trials in all with `search`.
fn tune_search(log: &Path, trials: &str, search: &str) -> Vec<String> {
    [
        "tune",
        "matmul",
        "--shape",
        "64,64,32",
        "--trials",
        trials,
        "--simulate",
        "--search",
        search,
        "--log",
        log.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The records of `log` that parse (damaged ones included).
fn parsed(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn median(r: &Value) -> Option<f64> {
    r["result"]["ok"]["median_us"].as_f64()
}

/// The fastest correct record among `records`.
fn fastest(records: &[Value]) -> &Value {
    records
        .iter()
        .filter(|r| median(r).is_some())
        .min_by(|a, b| median(a).unwrap().total_cmp(&median(b).unwrap()))
        .expect("a correct record")
}

/// Damaged copies of `real`, one line each, every one faster than any real record.
fn damaged_lines(real: &Value) -> Vec<String> {
    let copy = |change: &dyn Fn(&mut Value)| {
        let mut r = real.clone();
        r["result"] = json!({"ok": {"median_us": 0.001, "samples_us": [0.001]}});
        change(&mut r);
        r.to_string()
    };
    let conv = json!({
        "op": "conv2d", "n": 1, "c": 16, "h": 8, "w": 8, "k": 16, "r": 3, "s": 3,
        "stride_h": 0, "stride_w": 1, "pad_h": 1, "pad_w": 1,
        "dilation_h": 1, "dilation_w": 1, "epilogue": {"bias": false, "relu": false}
    });
    vec![
        // A shape with stride 0, under the key of the task and under its own.
        copy(&|r| r["shape"] = conv.clone()),
        copy(&|r| {
            r["shape"] = conv.clone();
            r["task"] = json!("conv2d_n1_c16_h8_w8_k16_r3_s3_st0x1_p1");
        }),
        // The key of another (valid) task.
        copy(&|r| r["task"] = json!("matmul_m64_n64_k64")),
        // An extra split level: three spatial splits for two spatial axes.
        copy(&|r| {
            let extra = r["state"]["spatial"][0].clone();
            r["state"]["spatial"].as_array_mut().unwrap().push(extra);
        }),
        copy(&|r| r["state"]["spatial"][0]["thread"] = json!(0)),
        copy(&|r| r["result"]["ok"]["median_us"] = json!(-1.0)),
        copy(&|r| r["result"]["ok"]["median_us"] = json!(0.0)),
        // A valid record on a line over 1 MiB.
        copy(&|r| r["nvrtc"] = json!("9".repeat(2 << 20))),
    ]
}

/// A log tuned for 6 trials with the damaged lines appended; returns its path, the real
/// records and the number of damaged lines.
fn damaged_log(dir: &Path) -> (PathBuf, Vec<Value>, usize) {
    let log = dir.join("L.jsonl");
    ok_err(&strs(&tune_args(&log, "6")));
    let real = parsed(&log);
    assert_eq!(real.len(), 6);
    let lines = damaged_lines(fastest(&real));
    let mut text = std::fs::read_to_string(&log).unwrap();
    for line in &lines {
        text.push_str(line);
        text.push('\n');
    }
    std::fs::write(&log, text).unwrap();
    (log, real, lines.len())
}

/// The warnings of `stderr`: exactly one, the skipped-lines line of `log`, counting
/// `damaged` lines from line 7 (the first damaged one).
fn assert_one_warning(stderr: &str, log: &Path, damaged: usize) {
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    let expected = format!(
        "warning: {}: skipped {damaged} malformed line(s) (first: line 7: invalid task: stride_h must be at least 1)",
        log.display()
    );
    assert_eq!(warnings[0], expected);
}

#[test]
fn damaged_records_are_skipped_by_best_export_and_resume_and_never_best() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, real, damaged) = damaged_log(tmp.path());
    let log_s = log.to_str().unwrap();
    let best_real = fastest(&real);
    let best_us = median(best_real).unwrap();

    // `best`: one row, the real fastest record; the damaged ones counted in the warning.
    let (table, err) = ok_err(&["best", "--log", log_s]);
    assert_one_warning(&err, &log, damaged);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(rows[0].starts_with(TASK), "{table}");
    let cells: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cells[1], format!("{best_us:.2}"), "{table}");
    assert_eq!(cells[3], "6", "damaged records are not trials: {table}");
    let (json, _) = ok_err(&["best", "--log", log_s, "--json"]);
    let best: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(best.as_array().unwrap().len(), 1);
    assert_eq!(best[0]["state"], best_real["state"]);
    assert_eq!(median(&best[0]), Some(best_us));
    // The task named only by a damaged record has no records.
    let o = tilesched(&["best", "--log", log_s, "--task", "matmul_m64_n64_k64"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_one_warning(&err, &log, damaged);
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.starts_with("error: task matmul_m64_n64_k64 has no records")),
        "{err}"
    );

    // `export`: the real fastest kernel, not a damaged faster one.
    let out = tmp.path().join("k.cu");
    let (_, err) = ok_err(&[
        "export",
        "--log",
        log_s,
        "--task",
        TASK,
        "--format",
        "cuda",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_one_warning(&err, &log, damaged);
    let sidecar: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("k.cu.json")).unwrap())
            .unwrap();
    assert_eq!(sidecar["state"], best_real["state"]);
    assert_eq!(sidecar["median_us"].as_f64(), Some(best_us));
    let source = std::fs::read_to_string(&out).unwrap();
    let state_line = source
        .lines()
        .find_map(|l| l.strip_prefix("// state: "))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(state_line).unwrap(),
        best_real["state"]
    );

    // `tune --resume`: the 6 real records are the trials done (3 more to reach 9), no
    // damaged state is re-measured or seeds anything, and the table's best is real.
    let before = std::fs::read_to_string(&log).unwrap().lines().count();
    let (table, err) = ok_err(&strs(
        &[tune_args(&log, "9"), vec!["--resume".to_string()]].concat(),
    ));
    assert_one_warning(&err, &log, damaged);
    let text = std::fs::read_to_string(&log).unwrap();
    let new: Vec<Value> = text
        .lines()
        .skip(before)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(new.len(), 3, "{table}");
    let states: HashSet<String> = real
        .iter()
        .chain(&new)
        .map(|r| r["state"].to_string())
        .collect();
    assert_eq!(states.len(), 9, "no state measured twice");
    for r in &new {
        assert_eq!(r["task"], TASK);
        assert!(median(r).is_some_and(|us| us > 0.0), "{r}");
    }
    let all: Vec<Value> = real.iter().chain(&new).cloned().collect();
    let row = table.lines().find(|l| l.starts_with(TASK)).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], format!("{:.2}", median(fastest(&all)).unwrap()));
    assert_eq!(cells[3], "9", "{table}");
    // The model-guided searches seed mutation (evolution) and the lattice walk (dgd)
    // with the best records and train the model on all of them: still only real ones.
    for (search, trials) in [("evolution", "13"), ("dgd", "17")] {
        let args = [
            tune_search(&log, trials, search),
            ["--resume", "--population", "16"]
                .map(String::from)
                .to_vec(),
        ]
        .concat();
        let (_, err) = ok_err(&strs(&args));
        assert_one_warning(&err, &log, damaged);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6 + damaged + 11, "9 trials, then 13, then 17");
    let valid: Vec<Value> = lines[..6]
        .iter()
        .chain(&lines[6 + damaged..])
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let states: HashSet<String> = valid.iter().map(|r| r["state"].to_string()).collect();
    assert_eq!(states.len(), 17, "no state measured twice");
    // Read again, the log still warns about exactly the damaged lines.
    let (table, err) = ok_err(&["best", "--log", log_s]);
    assert_one_warning(&err, &log, damaged);
    let row = table.lines().find(|l| l.starts_with(TASK)).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], format!("{:.2}", median(fastest(&valid)).unwrap()));
}

#[test]
fn logs_that_are_not_regular_files_are_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    for log in ["/dev/zero", dir] {
        let err = fails(&["best", "--log", log]);
        assert!(
            err.starts_with(&format!("error: tuning log {log} is not a regular file")),
            "{err}"
        );
        let err = fails(&[
            "export", "--log", log, "--task", TASK, "--format", "cuda", "--out", "x.cu",
        ]);
        assert!(err.contains("is not a regular file"), "{err}");
    }
    let err = fails(&strs(&tune_args(Path::new("/dev/zero"), "2")));
    assert_eq!(
        err.trim_end(),
        "error: tuning log /dev/zero is not a regular file (it is a character device)"
    );
}

#[test]
fn gzipped_logs_are_read_as_they_are_and_never_appended_to() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, real, damaged) = damaged_log(tmp.path());
    let gz = tmp.path().join("L.jsonl.gz");
    let compressed = Command::new("gzip")
        .arg("-c")
        .arg(&log)
        .output()
        .expect("gzip runs");
    assert!(compressed.status.success());
    std::fs::write(&gz, &compressed.stdout).unwrap();
    let gz_s = gz.to_str().unwrap();

    let (plain_table, _) = ok_err(&["best", "--log", log.to_str().unwrap()]);
    let (table, err) = ok_err(&["best", "--log", gz_s]);
    assert_eq!(table, plain_table);
    assert_one_warning(&err, &gz, damaged);
    let out = tmp.path().join("k.cu");
    ok_err(&[
        "export",
        "--log",
        gz_s,
        "--task",
        TASK,
        "--format",
        "cuda",
        "--out",
        out.to_str().unwrap(),
    ]);
    let sidecar: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("k.cu.json")).unwrap())
            .unwrap();
    assert_eq!(sidecar["state"], fastest(&real)["state"]);

    // Resuming would append plain lines to the compressed stream: refused, untouched.
    let err = fails(&strs(
        &[tune_args(&gz, "9"), vec!["--resume".to_string()]].concat(),
    ));
    assert!(
        err.contains("gzip-compressed") && err.contains(gz_s),
        "{err}"
    );
    assert_eq!(std::fs::read(&gz).unwrap(), compressed.stdout);
}
