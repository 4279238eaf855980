//! `tune`, `best` and `export` end to end without a GPU: the real tuner, NVRTC builds and
//! worker processes speaking the real protocol, with simulated measurements (the
//! hidden `--simulate`). Proves the isolation logic: a crashing worker, a hanging
//! worker, a wrong answer and a panicking lowering each become a record of the right kind
//! while the run goes on; resuming never re-measures; a log is never overwritten.

mod common;

use common::{fails, ok, ok_env, ok_env_err, records, states, tilesched, tilesched_env};
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Output};

fn error_kind(r: &Value) -> Option<&str> {
    r["result"]["error"]["kind"].as_str()
}

#[test]
fn faults_become_records_of_their_kind_and_tuning_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("faults.jsonl");
    let out = ok(&[
        "tune",
        "matmul",
        "--shape",
        "96,80,64",
        "--trials",
        "16",
        "--measure-batch",
        "6",
        "--simulate",
        "--search",
        "random",
        "--timeout",
        "2",
        "--log",
        log.to_str().unwrap(),
        "--inject-fault",
        "launch@1,timeout@4,wrong_answer@8,panic@11,compile@13",
    ]);
    let records = records(&log);
    assert_eq!(records.len(), 16);
    for (i, r) in records.iter().enumerate() {
        let expected = match i {
            1 => Some("launch"),
            4 => Some("timeout"),
            8 => Some("wrong_answer"),
            // A panic while generating it (as a lowering's assert would) fails its build.
            11 | 13 => Some("compile"),
            _ => None,
        };
        assert_eq!(error_kind(r), expected, "record {i}: {r}");
        assert_eq!(r["injected"].as_str(), expected, "record {i}");
        if expected.is_none() {
            assert!(r["result"]["ok"]["median_us"].as_f64().unwrap() > 0.0);
            assert!(r["compile"]["registers"].as_u64().unwrap() > 0);
        }
        assert_eq!(r["version"], 1);
        assert_eq!(r["task"], "matmul_m96_n80_k64");
        assert_eq!(r["device"]["name"], "simulated (no GPU)");
    }
    assert!(error_kind(&records[1]).is_some());
    let msg = records[1]["result"]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("worker died"), "{msg}");
    let msg = records[4]["result"]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("killed and restarted"), "{msg}");
    let msg = records[11]["result"]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("panicked: injected fault"), "{msg}");
    // The end table counts the errors by kind.
    let row = out
        .lines()
        .find(|l| l.starts_with("matmul_m96_n80_k64"))
        .unwrap();
    assert!(
        row.ends_with("compile 2, launch 1, timeout 1, wrong_answer 1"),
        "{out}"
    );
}

#[test]
fn resume_continues_without_remeasuring_and_logs_are_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("mm.jsonl");
    let log_s = log.to_str().unwrap();
    let base = [
        "tune",
        "matmul",
        "--shape",
        "64,64,32",
        "--simulate",
        "--search",
        "random",
        "--log",
        log_s,
    ];
    ok(&[&base[..], &["--trials", "5"]].concat());
    assert_eq!(records(&log).len(), 5);

    // Without --resume the log is refused and left as it was.
    let before = std::fs::read(&log).unwrap();
    let o = tilesched(&[&base[..], &["--trials", "9"]].concat());
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--resume"));
    assert_eq!(std::fs::read(&log).unwrap(), before);

    // A kill mid-write leaves a cut line: it is skipped with a warning.
    let mut text = String::from_utf8(before).unwrap();
    let cut = text.lines().next().unwrap()[..40].to_string();
    text.push_str(&cut);
    std::fs::write(&log, text).unwrap();

    let o = tilesched(&[&base[..], &["--trials", "9", "--resume"]].concat());
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("skipped 1 malformed line"));
    let lines = std::fs::read_to_string(&log).unwrap();
    let records: Vec<Value> = lines
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(records.len(), 9, "4 more to reach 9 trials");
    let ids: HashSet<String> = records.iter().map(|r| r["state"].to_string()).collect();
    assert_eq!(ids.len(), 9, "no state measured twice");

    // The same seed from scratch draws the same 9 states.
    let fresh = tmp.path().join("fresh.jsonl");
    ok(&[
        "tune",
        "matmul",
        "--shape",
        "64,64,32",
        "--simulate",
        "--search",
        "random",
        "--trials",
        "9",
        "--log",
        fresh.to_str().unwrap(),
    ]);
    let fresh_ids: HashSet<String> = states(&fresh).into_iter().collect();
    assert_eq!(ids, fresh_ids);
}

#[test]
fn network_trials_are_shared_and_best_and_export_read_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("bert.jsonl");
    let log_s = log.to_str().unwrap();
    let out = ok(&[
        "tune",
        "matmul",
        "--network",
        "bert-base",
        "--trials",
        "11",
        "--simulate",
        "--search",
        "random",
        "--log",
        log_s,
        "--min-repeats",
        "3",
    ]);
    let records = records(&log);
    assert_eq!(records.len(), 11);
    let tasks: HashSet<&str> = records
        .iter()
        .map(|r| r["task"].as_str().unwrap())
        .collect();
    assert_eq!(tasks.len(), 5, "every bert-base task gets trials: {out}");
    assert!(out.contains("total (5/5 tasks with a kernel)"), "{out}");

    let table = ok(&["best", "--log", log_s]);
    assert_eq!(table.lines().count(), 6, "{table}");
    let json: Value = serde_json::from_str(&ok(&["best", "--log", log_s, "--json"])).unwrap();
    let best = json.as_array().unwrap();
    assert_eq!(best.len(), 5);
    let task = best[0]["task"].as_str().unwrap();
    let one: Value =
        serde_json::from_str(&ok(&["best", "--log", log_s, "--task", task, "--json"])).unwrap();
    assert_eq!(one.as_array().unwrap().len(), 1);
    // The chosen record is the fastest of its task.
    let fastest = records
        .iter()
        .filter(|r| r["task"] == task)
        .filter_map(|r| r["result"]["ok"]["median_us"].as_f64())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(one[0]["result"]["ok"]["median_us"].as_f64(), Some(fastest));

    for format in ["cuda", "ptx", "cubin"] {
        let path = tmp.path().join(format!("k.{format}"));
        ok(&[
            "export",
            "--log",
            log_s,
            "--task",
            task,
            "--format",
            format,
            "--out",
            path.to_str().unwrap(),
        ]);
        let bytes = std::fs::read(&path).unwrap();
        let sidecar: Value = serde_json::from_str(
            &std::fs::read_to_string(tmp.path().join(format!("k.{format}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(sidecar["state"], one[0]["state"]);
        assert!(sidecar["block"][0].as_u64().unwrap() >= 32);
        match format {
            "cuda" => {
                let src = String::from_utf8(bytes).unwrap();
                assert!(src.contains("// launch: grid"), "{src}");
                let line = src
                    .lines()
                    .find_map(|l| l.strip_prefix("// state: "))
                    .unwrap();
                let state: Value = serde_json::from_str(line).unwrap();
                assert_eq!(state, one[0]["state"]);
            }
            "ptx" => assert!(String::from_utf8(bytes).unwrap().contains(".entry")),
            _ => assert!(bytes.starts_with(b"\x7fELF")),
        }
    }
    let o = tilesched(&[
        "export", "--log", log_s, "--task", "nope", "--format", "cuda", "--out", "x",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("task nope has no records"));

    // The log's best kernels into a deploy cache, without a GPU; each one is the task's
    // best record, looked up with its parameters.
    let cache = tmp.path().join("cache");
    let cache_s = cache.to_str().unwrap();
    let out = ok(&["deploy", "add", "--log", log_s, "--cache", cache_s]);
    assert!(out.contains("5 of 5 tasks"), "{out}");
    assert_eq!(out.matches(": added").count(), 5, "{out}");
    let gpu = records[0]["device"]["name"].as_str().unwrap();
    let cc = &records[0]["device"]["compute_capability"];
    let cc = format!("{}.{}", cc[0], cc[1]);
    let entry: Value = serde_json::from_str(&ok(&[
        "deploy", "lookup", "--cache", cache_s, "--task", task, "--gpu", gpu, "--cc", &cc, "--json",
    ]))
    .unwrap();
    assert_eq!(entry["final_us"].as_f64(), Some(fastest));
    assert_eq!(entry["stage"], "stage1");
    assert_eq!(entry["shape"], one[0]["shape"]);
    assert!(
        std::fs::read(entry["path"].as_str().unwrap())
            .unwrap()
            .starts_with(b"\x7fELF")
    );
    // Again: every kernel kept, nothing replaced.
    let out = ok(&[
        "deploy", "add", "--log", log_s, "--cache", cache_s, "--task", task,
    ]);
    assert!(out.contains("kept the cached"), "{out}");
    let o = tilesched(&[
        "deploy", "add", "--log", log_s, "--cache", cache_s, "--task", "nope",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("task nope has no records"));
}

/// Tunes `shape` for `trials` simulated trials into `log`; returns its records.
fn tuned(log: &Path, shape: &str, trials: &str) -> Vec<Value> {
    ok(&[
        "tune",
        "matmul",
        "--shape",
        shape,
        "--trials",
        trials,
        "--simulate",
        "--search",
        "random",
        "--log",
        log.to_str().unwrap(),
    ]);
    records(log)
}

fn median(r: &Value) -> Option<f64> {
    r["result"]["ok"]["median_us"].as_f64()
}

/// `best`, `export` and `deploy add` rank a task's records alike (of equal times, the
/// first in the log is the best, whichever record that is), and name a task whose
/// records all failed with its trials.
#[test]
fn best_export_and_deploy_add_pick_the_same_record_and_name_tasks_without_a_kernel() {
    let tmp = tempfile::tempdir().unwrap();
    let mut real = tuned(&tmp.path().join("a.jsonl"), "64,64,32", "6");
    real.sort_by(|a, b| {
        let us = |r: &Value| median(r).unwrap_or(f64::INFINITY);
        us(a).total_cmp(&us(b))
    });
    let (fastest, second) = (&real[0], &real[1]);
    let best_us = median(fastest).unwrap();
    let task = fastest["task"].as_str().unwrap();
    let mut tie = second.clone();
    tie["result"]["ok"]["median_us"] = best_us.into();
    assert_ne!(tie["state"], fastest["state"]);
    let mut failed = tuned(&tmp.path().join("b.jsonl"), "64,64,64", "3");
    for r in &mut failed {
        r["result"] = serde_json::json!({"error": {"kind": "wrong_answer", "message": "x"}});
    }
    let failed_task = failed[0]["task"].as_str().unwrap();
    let (gpu, cc) = (
        &fastest["device"]["name"],
        &fastest["device"]["compute_capability"],
    );
    let (gpu, cc) = (gpu.as_str().unwrap(), format!("{}.{}", cc[0], cc[1]));

    for (name, expected) in [("tie-last", fastest), ("tie-first", &tie)] {
        let mut lines: Vec<&Value> = real.iter().chain(&failed).collect();
        if name == "tie-last" {
            lines.push(&tie);
        } else {
            lines.insert(0, &tie);
        }
        let text: String = lines.iter().map(|r| format!("{r}\n")).collect();
        let log = tmp.path().join(format!("{name}.jsonl"));
        std::fs::write(&log, text).unwrap();
        let log_s = log.to_str().unwrap();

        let best: Value =
            serde_json::from_str(&ok(&["best", "--log", log_s, "--task", task, "--json"])).unwrap();
        assert_eq!(best[0]["state"], expected["state"], "{name}");
        let cubin = tmp.path().join(format!("{name}.cubin"));
        let cubin_s = cubin.to_str().unwrap();
        ok(&[
            "export", "--log", log_s, "--task", task, "--format", "cubin", "--out", cubin_s,
        ]);
        let sidecar: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{cubin_s}.json")).unwrap())
                .unwrap();
        assert_eq!(sidecar["state"], expected["state"], "{name}");

        // Every task: the one without a kernel is named, the other stored.
        let cache = tmp.path().join(format!("{name}-cache"));
        let cache_s = cache.to_str().unwrap();
        let o = tilesched(&["deploy", "add", "--log", log_s, "--cache", cache_s]);
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(!o.status.success());
        assert!(out.contains("1 of 2 tasks"), "{out}");
        let why =
            format!("task {failed_task} has no correct kernel in {log_s} (3 records, all failed)");
        assert!(
            err.contains(&format!("{failed_task}: not stored: {why}")),
            "{err}"
        );
        assert!(
            err.ends_with("error: 1 task(s) have no kernel to store\n"),
            "{err}"
        );
        let entry: Value = serde_json::from_str(&ok(&[
            "deploy", "lookup", "--cache", cache_s, "--task", task, "--gpu", gpu, "--cc", &cc,
            "--json",
        ]))
        .unwrap();
        assert_eq!(entry["final_us"].as_f64(), Some(best_us));
        let deployed = std::fs::read(entry["path"].as_str().unwrap()).unwrap();
        assert_eq!(deployed, std::fs::read(&cubin).unwrap(), "{name}");

        let err = fails(&[
            "export",
            "--log",
            log_s,
            "--task",
            failed_task,
            "--format",
            "cuda",
            "--out",
            "x",
        ]);
        assert_eq!(err, format!("error: {why}\n"));
    }
}

#[test]
fn tune_without_a_gpu_says_so_in_one_line() {
    if Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine: nothing to prove here.
    }
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("x.jsonl");
    let o = tilesched(&[
        "tune",
        "matmul",
        "--shape",
        "64,64,64",
        "--log",
        log.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no GPU"), "{err}");
    assert!(
        !log.exists(),
        "no log is created when nothing can be measured"
    );
}

#[test]
fn evolution_with_the_model_and_the_task_scheduler_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("evo.jsonl");
    let model = tmp.path().join("model.json");
    let out = ok(&[
        "tune",
        "conv2d",
        "--network",
        "resnet",
        "--trials",
        "150",
        "--measure-batch",
        "10",
        "--population",
        "128",
        "--simulate",
        "--min-repeats",
        "2",
        "--log",
        log.to_str().unwrap(),
        "--model-out",
        model.to_str().unwrap(),
    ]);
    let records = records(&log);
    assert_eq!(records.len(), 150);
    let ids: HashSet<String> = records
        .iter()
        .map(|r| format!("{}{}", r["task"], r["state"]))
        .collect();
    assert_eq!(ids.len(), 150, "no state measured twice");
    // Warm-up: every layer got a round before any got a second.
    let first: HashSet<&str> = records[..130]
        .iter()
        .map(|r| r["task"].as_str().unwrap())
        .collect();
    assert_eq!(first.len(), 13, "{out}");
    assert!(out.contains("search overhead: 15 rounds"), "{out}");
    assert!(out.contains("model saved"), "{out}");
    // The saved model warm-starts another run.
    let log2 = tmp.path().join("evo2.jsonl");
    ok(&[
        "tune",
        "conv2d",
        "--shape",
        "1,64,56,56,64,3,3,1,1",
        "--trials",
        "20",
        "--population",
        "64",
        "--simulate",
        "--min-repeats",
        "2",
        "--log",
        log2.to_str().unwrap(),
        "--model-in",
        model.to_str().unwrap(),
    ]);
    assert_eq!(self::records(&log2).len(), 20);
}

#[test]
fn features_and_model_eval_read_logs_and_sample_states() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("r.jsonl");
    ok(&[
        "tune",
        "matmul",
        "--shape",
        "256,128,64",
        "--trials",
        "60",
        "--search",
        "random",
        "--simulate",
        "--min-repeats",
        "2",
        "--log",
        log.to_str().unwrap(),
    ]);
    let csv_path = tmp.path().join("f.csv");
    ok(&[
        "features",
        "--log",
        log.to_str().unwrap(),
        "--out",
        csv_path.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&csv_path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(header[..2], ["task", "state_id"]);
    assert_eq!(header[header.len() - 2..], ["measured_us", "error"]);
    assert_eq!(lines.clone().count(), 60);
    assert!(lines.all(|l| l.split(',').count() == header.len()));

    let sampled = tmp.path().join("s.csv");
    ok(&[
        "features",
        "conv2d",
        "--shape",
        "1,64,56,56,64,3,3,1,1",
        "--sample",
        "25",
        "--out",
        sampled.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&sampled).unwrap();
    assert_eq!(text.lines().count(), 26);
    assert_eq!(
        text.lines().next().unwrap().split(',').count(),
        header.len()
    );

    let out = ok(&["model", "eval", "--log", log.to_str().unwrap()]);
    assert!(out.contains("matmul_m256_n128_k64"), "{out}");
    assert!(out.lines().last().unwrap().starts_with("mean"), "{out}");

    // Three rounds of 20 from the shipped model, one schedule per row: (retrainings,
    // pairwise accuracy).
    let replay = |schedule: &[&str]| -> Vec<(String, f64)> {
        let mut args = vec![
            "model",
            "replay",
            "--log",
            log.to_str().unwrap(),
            "--round",
            "20",
        ];
        args.extend_from_slice(schedule);
        let out = ok(&args);
        out.lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| {
                let v: Vec<&str> = l.split_whitespace().collect();
                (v[1].to_string(), v[3].parse().unwrap())
            })
            .collect()
    };
    // Retrained after each round, or once the rows measured since the last retraining
    // match those before it (20, 40; not 60).
    let rows = replay(&["--growth", "0", "1"]);
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        ["3", "2"]
    );
    // Residual retrainings: as many, each round scored the same way.
    let rows = replay(&["--residual-rounds", "5", "--full-every", "2"]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "3");
    assert!((0.0..=1.0).contains(&rows[0].1), "{rows:?}");
}

#[test]
fn dgd_walks_after_its_random_start_and_never_remeasures() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("dgd.jsonl");
    let out = ok(&[
        "tune",
        "conv2d",
        "--shape",
        "1,64,28,28,64,3,3,1,1",
        "--search",
        "dgd",
        "--trials",
        "82",
        "--simulate",
        "--min-repeats",
        "2",
        "--log",
        log.to_str().unwrap(),
    ]);
    let records = records(&log);
    assert_eq!(records.len(), 82);
    let ids: HashSet<String> = records.iter().map(|r| r["state"].to_string()).collect();
    assert_eq!(ids.len(), 82, "no state measured twice");
    // One round of 64 random states, then windows of 3.
    assert!(out.contains("search overhead: 7 rounds"), "{out}");
}

/// The PIDs of the processes whose parent is `parent` (from /proc), with their state
/// letter.
fn children(parent: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.to_string()) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) {
            out.push((pid, fields[0].chars().next().unwrap_or('?')));
        }
    }
    out
}

/// Whether process `pid` still runs (a zombie does not: it waits only to be reaped).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with(|c| c != 'Z'))
        })
        .unwrap_or(false)
}

#[test]
fn a_tuner_killed_while_its_worker_hangs_leaves_no_worker_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("orphan.jsonl");
    let mut tune = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(["tune", "matmul", "--shape", "64,64,32", "--trials", "4"])
        .args(["--simulate", "--search", "random", "--timeout", "600"])
        .args(["--inject-fault", "timeout@0", "--log"])
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The worker starts with the tuner; the first candidate then hangs it.
    let started = std::time::Instant::now();
    let worker = loop {
        if let Some(&(pid, _)) = children(tune.id()).first() {
            break pid;
        }
        assert!(started.elapsed().as_secs() < 30, "no worker started");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(running(worker), "the worker hangs, it has not exited");
    tune.kill().unwrap(); // SIGKILL: no handler of the tuner runs
    tune.wait().unwrap();
    let killed = std::time::Instant::now();
    while running(worker) {
        assert!(
            killed.elapsed().as_secs_f64() < 5.0,
            "worker {worker} still runs 5 s after its tuner was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `tune` with the simulated worker, its starts scripted by `starts` (see
/// `gpu::worker::SIMULATED_STARTS_ENV`; empty: every start succeeds).
fn tune_scripted(dir: &Path, starts: &str, args: &[&str]) -> Output {
    let script = dir.join("starts");
    std::fs::write(&script, starts).unwrap();
    Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(["tune", "matmul", "--shape", "64,64,32", "--simulate"])
        .args(["--search", "random", "--measure-batch", "6"])
        .args(args)
        .env(gpu::worker::SIMULATED_STARTS_ENV, &script)
        .output()
        .unwrap()
}

#[test]
fn failed_worker_restarts_are_retried_then_the_run_stops_resumable() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("restarts.jsonl");
    let log_s = log.to_str().unwrap();
    // The crash of candidate 1 needs three starts: two refused contexts, then one.
    let o = tune_scripted(
        tmp.path(),
        "offo",
        &[
            "--trials",
            "6",
            "--inject-fault",
            "launch@1",
            "--log",
            log_s,
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let kinds: Vec<Option<String>> = records(&log)
        .iter()
        .map(|r| error_kind(r).map(str::to_string))
        .collect();
    assert_eq!(kinds.len(), 6);
    assert_eq!(kinds[1].as_deref(), Some("launch"));

    // Four refusals in a row: the run stops after recording what it measured.
    let log = tmp.path().join("stops.jsonl");
    let log_s = log.to_str().unwrap();
    let o = tune_scripted(
        tmp.path(),
        "offff",
        &[
            "--trials",
            "12",
            "--inject-fault",
            "launch@1",
            "--log",
            log_s,
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(!err.contains("panicked"), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("could not be restarted (4 tries)") && last.contains("--resume"),
        "{err}"
    );
    let kept = records(&log);
    assert_eq!(kept.len(), 2, "candidates 0 (measured) and 1 (the crash)");
    assert_eq!(error_kind(&kept[0]), None);
    assert_eq!(error_kind(&kept[1]), Some("launch"));
    // And it resumes to the end.
    let o = tune_scripted(
        tmp.path(),
        "",
        &["--trials", "12", "--resume", "--log", log_s],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(records(&log).len(), 12);
}

#[test]
fn a_worker_killed_from_outside_is_the_environments_fault_and_resume_measures_again() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("env.jsonl");
    let log_s = log.to_str().unwrap();
    let o = tune_scripted(
        tmp.path(),
        "",
        &[
            "--trials",
            "6",
            "--inject-fault",
            "environment@2",
            "--log",
            log_s,
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = records(&log);
    assert_eq!(first.len(), 6);
    assert_eq!(error_kind(&first[2]), Some("environment"), "{}", first[2]);
    let msg = first[2]["result"]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("signal: 9"), "{msg}");
    // Resuming at the same trial count measures exactly that candidate again.
    let o = tune_scripted(
        tmp.path(),
        "",
        &["--trials", "6", "--resume", "--log", log_s],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let after = records(&log);
    assert_eq!(after.len(), 7);
    assert_eq!(after[6]["state"], first[2]["state"]);
    assert_eq!(error_kind(&after[6]), None, "{}", after[6]);
    // The end table counts the candidate once, as measured: 6 trials, no environment
    // failure (it once said "7 ... environment 1").
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.starts_with("matmul_m64_n64_k32"))
        .unwrap_or_else(|| panic!("{out}"));
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(fields[3], "6", "{row}");
    assert!(!row.contains("environment"), "{row}");
}

/// `model eval` neither trains on nor scores spoiled records, as `tune` does not learn
/// from them: 16 records, 2 spoiled, a quarter of the 14 held out, 10 trained on.
#[test]
fn model_eval_leaves_spoiled_records_out() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("spoiled.jsonl");
    let log_s = log.to_str().unwrap();
    let o = tune_scripted(
        tmp.path(),
        "",
        &[
            "--trials",
            "16",
            "--inject-fault",
            "environment@1,environment@5",
            "--log",
            log_s,
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let spoiled = records(&log)
        .iter()
        .filter(|r| error_kind(r) == Some("environment"))
        .count();
    assert_eq!(spoiled, 2);
    let out = ok(&["model", "eval", "--log", log_s, "--holdout", "0.25"]);
    assert!(out.starts_with("trained on 10 records"), "{out}");
}

#[test]
fn a_second_writer_of_a_log_is_refused_naming_the_first() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("locked.jsonl");
    let log_s = log.to_str().unwrap();
    // The first run hangs on its first candidate, holding the log.
    let mut first = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(["tune", "matmul", "--shape", "64,64,32", "--trials", "4"])
        .args(["--simulate", "--search", "random", "--timeout", "600"])
        .args(["--inject-fault", "timeout@0", "--log", log_s])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while children(first.id()).is_empty() {
        assert!(
            started.elapsed().as_secs() < 30,
            "the first run never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = tilesched(&[
        "tune",
        "matmul",
        "--shape",
        "64,64,32",
        "--trials",
        "4",
        "--simulate",
        "--search",
        "random",
        "--resume",
        "--log",
        log_s,
    ]);
    first.kill().unwrap();
    first.wait().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    let pid = format!("PID {}", first.id());
    assert!(err.contains("in use by") && err.contains(&pid), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn bad_flags_are_refused_up_front_in_one_line_and_nothing_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let log = dir.join("flags.jsonl");
    let log_s = log.to_str().unwrap();
    // A saved model whose training rows are of the wrong width.
    let model = dir.join("model.json");
    ok(&[
        "tune",
        "matmul",
        "--shape",
        "64,64,32",
        "--simulate",
        "--trials",
        "4",
        "--measure-batch",
        "4",
        "--population",
        "16",
        "--log",
        dir.join("for-model.jsonl").to_str().unwrap(),
        "--model-out",
        model.to_str().unwrap(),
    ]);
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&model).unwrap()).unwrap();
    m["data"]["width"] = Value::from(3);
    let bad_model = dir.join("bad-model.json");
    std::fs::write(&bad_model, m.to_string()).unwrap();
    let gz = dir.join("old.jsonl.gz");
    std::fs::write(&gz, [0x1f, 0x8b, 8, 0]).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--timeout", "inf"], "--timeout"),
        (vec!["--timeout=-3"], "--timeout"),
        (vec!["--time-budget=-1"], "--time-budget"),
        (
            vec!["--min-time-ms", "20000", "--timeout", "10"],
            "--min-time-ms",
        ),
        (
            vec!["--model-out", "/nonexistent/dir/m.json"],
            "--model-out",
        ),
        (
            vec!["--model-in", bad_model.to_str().unwrap()],
            "bad-model.json",
        ),
        (
            vec!["--cold-model", "--model-in", bad_model.to_str().unwrap()],
            "--cold-model",
        ),
        (vec!["--floor", "2"], "--floor"),
        (vec!["--from", "/nonexistent/logs"], "/nonexistent/logs"),
    ];
    for (flags, named) in cases {
        let o = tilesched(
            &[
                &[
                    "tune",
                    "matmul",
                    "--shape",
                    "64,64,32",
                    "--simulate",
                    "--log",
                    log_s,
                ][..],
                &flags,
            ]
            .concat(),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{flags:?}");
        assert_eq!(err.trim().lines().count(), 1, "{flags:?}: {err}");
        assert!(err.contains(named), "{flags:?}: {err}");
        assert!(!log.exists(), "{flags:?} created the log");
    }
    let o = tilesched(&[
        "tune",
        "matmul",
        "--shape",
        "64,64,32",
        "--simulate",
        "--log",
        gz.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("gzip"), "{err}");
    assert_eq!(
        std::fs::read(&gz).unwrap(),
        [0x1f, 0x8b, 8, 0],
        "the gzipped log is untouched"
    );
}

/// Tunes a small task whose simulated worker takes `env`'s times, `--timeout 1`, and
/// requires every one of `trials` candidates measured correctly.
fn tune_slow_task(name: &str, trials: usize, env: &[(&str, &str)]) {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join(name);
    let trials = trials.to_string();
    ok_env(
        &[
            "tune",
            "matmul",
            "--shape",
            "64,64,32",
            "--simulate",
            "--trials",
            &trials,
            "--search",
            "random",
            "--timeout",
            "1",
            "--min-time-ms",
            "1",
            "--log",
            log.to_str().unwrap(),
        ],
        env,
    );
    let kept = records(&log);
    assert_eq!(kept.len().to_string(), trials);
    for r in kept {
        assert_eq!(error_kind(&r), None, "{r}");
    }
}

#[test]
fn a_task_slow_to_prepare_does_not_time_out_its_candidates() {
    // Preparing the task (inputs, reference) takes 2.5 s; each candidate may take 1 s.
    tune_slow_task(
        "slow.jsonl",
        4,
        &[(gpu::worker::SIMULATED_PREPARE_ENV, "2500")],
    );
}

#[test]
fn a_task_too_large_for_the_gpus_free_memory_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("big.jsonl");
    // 26 GB of f32 buffers; the (simulated) GPU says 10 GB are free.
    let o = tilesched_env(
        &[
            "tune",
            "batch_matmul",
            "--shape",
            "524287,64,64,64",
            "--simulate",
            "--log",
            log.to_str().unwrap(),
        ],
        &[(gpu::worker::SIMULATED_FREE_ENV, "10000000000")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        "error: batch_matmul_b524287_m64_n64_k64: its buffers take 25.8 GB (inputs 17.2 GB, output 8.6 GB), more than the 10.0 GB free on the GPU (device 0); nothing was measured"
    );
    assert!(!log.exists(), "no log is left behind");
}

#[test]
fn a_task_slow_to_prepare_gives_its_candidates_time_to_be_checked() {
    // Preparing takes 2.5 s, as reading back a large reference output does; so does
    // each candidate's check (1.5 s here), which --timeout 1 alone would not allow.
    tune_slow_task(
        "slow-check.jsonl",
        2,
        &[
            (gpu::worker::SIMULATED_PREPARE_ENV, "2500"),
            (gpu::worker::SIMULATED_MEASURE_ENV, "1500"),
        ],
    );
}

#[test]
fn an_interrupted_run_logs_every_measurement_finished_before_it_stops() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("interrupted.jsonl");
    let measured = tmp.path().join("measured.txt");
    // One round of 64 candidates at 200 ms each: interrupted a few candidates in.
    let child = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args([
            "tune",
            "matmul",
            "--shape",
            "64,64,32",
            "--simulate",
            "--trials",
            "64",
            "--search",
            "random",
            "--min-time-ms",
            "1",
            "--log",
            log.to_str().unwrap(),
        ])
        .env(gpu::worker::SIMULATED_MEASURE_ENV, "200")
        .env(gpu::worker::SIMULATED_MEASURED_ENV, &measured)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = || {
        std::fs::read_to_string(&measured)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let started = std::time::Instant::now();
    while lines() < 3 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "nothing measured"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let before = lines();
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let kept = records(&log);
    // Everything answered before the signal, and what was being measured when it came.
    assert!(kept.len() >= before, "{} of {before}: {err}", kept.len());
    assert!(kept.len() < 64, "the round was cut short");
    for r in &kept {
        assert_eq!(error_kind(r), None, "{r}");
    }
    let last = err.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "error: interrupted: the log holds all {} measurements finished so far (`--resume` continues)",
            kept.len()
        )
    );
}

#[test]
fn a_second_run_reads_its_kernels_from_the_cubin_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    let run = |name: &str, extra: &[&str]| {
        let log = tmp.path().join(name);
        let out = ok(&[
            &[
                "tune",
                "matmul",
                "--shape",
                "96,80,64",
                "--trials",
                "8",
                "--simulate",
                "--search",
                "random",
                "--log",
                log.to_str().unwrap(),
            ][..],
            extra,
        ]
        .concat());
        (out, records(&log))
    };
    let cache_flag = ["--cubin-cache", cache.to_str().unwrap()];
    let (first, a) = run("a.jsonl", &cache_flag);
    assert!(
        first.contains("built 8 kernels") && first.contains("(0 from the cubin cache"),
        "{first}"
    );
    // The same seed draws the same states: every kernel (and the reference) is read back.
    let (second, b) = run("b.jsonl", &cache_flag);
    assert!(second.contains("(8 from the cubin cache"), "{second}");
    // The end table says how busy each device was and how fast building went.
    let busy = second
        .lines()
        .find(|l| l.starts_with("busy measuring (of the wall time): GPU 0 "))
        .unwrap_or_else(|| panic!("{second}"));
    assert!(
        busy.contains("kernels/s") && busy.contains("candidates/s"),
        "{busy}"
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["source_hash"], y["source_hash"]);
        assert_eq!(x["compile"]["registers"], y["compile"]["registers"]);
        assert_eq!(x["compile"]["spill_bytes"], y["compile"]["spill_bytes"]);
    }
    // Without the cache everything is compiled again.
    let (third, _) = run("c.jsonl", &["--no-cubin-cache"]);
    assert!(third.contains("(0 from the cubin cache"), "{third}");
    let o = tilesched(&[
        "tune",
        "matmul",
        "--shape",
        "96,80,64",
        "--simulate",
        "--cubin-cache",
        "/proc/x",
        "--log",
        tmp.path().join("d.jsonl").to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--cubin-cache /proc/x"), "{err}");
    assert!(!tmp.path().join("d.jsonl").exists());
}

/// The wall time `tune` reports in its end table.
fn reported_wall(out: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with("wall "))
        .unwrap_or_else(|| panic!("{out}"));
    line["wall ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_second_device_halves_the_wall_time_and_candidates_do_not_depend_on_timing() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    // Each candidate takes a simulated GPU 150 ms; the kernels come from a warm cubin
    // cache, so that this 2-core machine's builds do not hide what the GPUs do.
    let run = |name: &str, devices: &str| {
        let log = tmp.path().join(name);
        let out = ok_env(
            &[
                "tune",
                "matmul",
                "--shape",
                "96,80,64",
                "--simulate",
                "--trials",
                "32",
                "--measure-batch",
                "4",
                "--population",
                "64",
                "--device",
                devices,
                "--cubin-cache",
                cache.to_str().unwrap(),
                // An untrained model: retraining the shipped one's rows each round takes
                // seconds on two cores, which would hide what the devices do.
                "--cold-model",
                "--log",
                log.to_str().unwrap(),
            ],
            &[(gpu::worker::SIMULATED_MEASURE_ENV, "150")],
        );
        (out, states(&log))
    };
    // Rounds in flight follow the number of devices, so the two runs draw different
    // candidates: warm the cache with both.
    run("warm-1.jsonl", "0");
    run("warm-2.jsonl", "0,1");
    let (one, _) = run("one.jsonl", "0");
    let (two, states) = run("two.jsonl", "0,1");
    let (one_s, two_s) = (reported_wall(&one), reported_wall(&two));
    // 32 x 150 ms is 4.8 s of measuring on one device, 2.4 s on each of two.
    assert!(one_s >= 4.8, "{one}");
    assert!(
        two_s < 0.7 * one_s,
        "one device {one_s} s, two {two_s} s\n{two}"
    );
    let busy = two
        .lines()
        .find(|l| l.starts_with("busy measuring"))
        .unwrap_or_else(|| panic!("{two}"));
    assert!(busy.contains("GPU 0 ") && busy.contains("GPU 1 "), "{busy}");
    // Rounds end in the order they were planned: the model-guided search draws the
    // same candidates whichever device answers first.
    let (_, again) = run("again.jsonl", "0,1");
    assert_eq!(states.len(), 32);
    assert_eq!(states, again);
}

#[test]
fn a_model_retrained_while_the_next_round_is_proposed_draws_the_same_candidates() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cubins");
    // 240 trials in rounds of 8 with three rounds in flight (two simulated devices):
    // XGBoost retrains from the 13th round on (over 100 rows), on its own thread, and
    // rounds 17 to 30 are planned with what it learnt.
    let run = |name: &str, train_delay_ms: &str| {
        let log = tmp.path().join(name);
        let out = ok_env(
            &[
                "tune",
                "matmul",
                "--shape",
                "96,80,64",
                "--simulate",
                "--trials",
                "240",
                "--measure-batch",
                "8",
                "--population",
                "64",
                "--device",
                "0,1",
                "--model-lag",
                "1",
                "--cubin-cache",
                cache.to_str().unwrap(),
                "--log",
                log.to_str().unwrap(),
            ],
            &[(search::trainer::SIMULATED_TRAIN_ENV, train_delay_ms)],
        );
        (out, states(&log))
    };
    let (out, first) = run("first.jsonl", "0");
    // Every retraining a second late, while the second run's rounds, built from the
    // cache, go by in a few milliseconds: a round planned with whatever model happened
    // to be ready would see an older one than in the first run.
    let (slow, second) = run("second.jsonl", "1000");
    assert!(out.contains("on its own thread ("), "{out}");
    assert!(!out.contains("(0 retrainings)"), "{out}");
    assert!(slow.contains("waiting for the model"), "{slow}");
    assert_eq!(first.len(), 240);
    let differing = first.iter().zip(&second).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 0, "candidates differ between the runs");
}

/// Under `--time-budget`, every task's first round is sized from the budget and the task
/// count (`search::tune::first_round`: 5 tasks, 5 s, one device: 10 candidates for an
/// untrained model, the least round of 8 for the shipped one), so that a model's tasks
/// all get measured early; then the gradient allocation takes over with full rounds.
/// Rounds end in plan order, so the log shows each task's first round as one block.
#[test]
fn a_time_budget_sizes_first_rounds_to_reach_every_task() {
    for (model, round) in [(&["--cold-model"][..], 10), (&[][..], 8)] {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("budget.jsonl");
        let mut args = vec![
            "tune",
            "matmul",
            "--network",
            "bert-base",
            "--simulate",
            "--trials",
            "100000",
            "--time-budget",
            "5",
            "--population",
            "64",
            "--log",
            log.to_str().unwrap(),
        ];
        args.extend_from_slice(model);
        ok(&args);
        let records = records(&log);
        let tasks: Vec<&str> = records
            .iter()
            .map(|r| r["task"].as_str().unwrap())
            .collect();
        // The first pass: blocks of `round` records of one task each, each task once.
        // (With full first rounds, the first 20 records would all be one task's; with
        // rounds of 10, blocks of 8 would mix two tasks, and the other way round.)
        let mut first_pass: Vec<&str> = Vec::new();
        for block in tasks.chunks(round) {
            if block.len() < round
                || block.iter().any(|t| *t != block[0])
                || first_pass.contains(&block[0])
            {
                break;
            }
            first_pass.push(block[0]);
        }
        assert!(first_pass.len() >= 2, "{model:?}: {tasks:?}");
    }
}

#[test]
fn a_new_task_starts_from_the_database_and_the_shipped_model_unless_told_not_to() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let log = tmp.path().join(name);
        let args = [
            &[
                "tune",
                "matmul",
                "--shape",
                "96,80,64",
                "--simulate",
                "--trials",
                "16",
                "--measure-batch",
                "16",
                "--population",
                "32",
                "--log",
                log.to_str().unwrap(),
            ][..],
            extra,
        ]
        .concat();
        ok_env_err(&args, &[])
    };
    // A log of another shape (and of this one, which a run never takes from the
    // database), given with --from, joins the shipped database.
    run("other.jsonl", &["--shape", "128,64,64", "--no-transfer"]);
    let other = tmp.path().join("other.jsonl");
    let (out, err) = run("warm.jsonl", &["--from", other.to_str().unwrap()]);
    assert!(err.contains("model: the one shipped"), "{err}");
    assert!(err.contains("transfer: "), "{err}");
    assert!(
        out.contains("states adapted from the nearest tuned tasks"),
        "{out}"
    );
    let (out, err) = run("cold.jsonl", &["--no-transfer", "--cold-model"]);
    assert!(!err.contains("model: the one shipped"), "{err}");
    assert!(!out.contains("states adapted"), "{out}");
}
