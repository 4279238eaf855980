//! On a real GPU (ignored in CI; `scripts/device-check` runs them on the device, with
//! `TILESCHED_BIN` naming the release binary): every sampled state of several tasks
//! passes the exact check against the reference kernel, split-K states of deep
//! layers (zeroed output, atomic adds, bias from one chunk) included; injected
//! faulting, hanging and wrong kernels become `launch`, `timeout` and `wrong_answer`
//! while the run finishes; racing keeps the kernel the full protocol finds fastest;
//! with two GPUs (`TILESCHED_TEST_DEVICES=0,1`) both measure shares of a batch.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

fn bin() -> PathBuf {
    std::env::var_os("TILESCHED_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tilesched")))
}

/// Where the tests write logs and outputs (`$TILESCHED_TEST_OUT`, else the temp dir).
fn out_dir() -> PathBuf {
    std::env::var_os("TILESCHED_TEST_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A command's stdout and stderr, for messages.
fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `tune` with `args` into a fresh log and returns its records.
fn tune(name: &str, args: &[&str]) -> Vec<Value> {
    let dir = out_dir();
    let log = dir.join(format!("gpu-test-{name}.jsonl"));
    let _ = std::fs::remove_file(&log);
    let o = Command::new(bin())
        .arg("tune")
        .args(args)
        .arg("--log")
        .arg(&log)
        .output()
        .expect("tilesched runs");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{name}:\n{out}{err}");
    assert!(o.status.success(), "{name}: {out}\n{err}");
    std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kind(r: &Value) -> Option<&str> {
    r["result"]["error"]["kind"].as_str()
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn every_sampled_state_passes_the_exact_check() {
    let cases: [(&str, &[&str]); 8] = [
        ("matmul-tails", &["matmul", "--shape", "333,777,555"]),
        (
            "conv-stem",
            &["conv2d", "--shape", "1,3,224,224,64,7,7,2,3"],
        ),
        (
            "conv-deep-epilogue",
            &[
                "conv2d",
                "--shape",
                "1,512,7,7,512,3,3,1,1",
                "--bias",
                "--relu",
            ],
        ),
        // Deep layers without ReLU: the sampler splits most of their reductions.
        (
            "conv-deep-split-k",
            &["conv2d", "--shape", "1,512,7,7,512,3,3,1,1", "--bias"],
        ),
        (
            "conv-1x1-c1024-stride2-split-k",
            &["conv2d", "--shape", "1,1024,14,14,512,1,1,2,0"],
        ),
        (
            "conv-asymmetric",
            &[
                "conv2d",
                "--shape",
                "c=16,h=9,w=12,k=8,r=3,s=1,stride_h=2,pad_w=1,dilation_h=2",
            ],
        ),
        (
            "conv-1x1-stride2",
            &["conv2d", "--shape", "1,256,56,56,512,1,1,2,0", "--relu"],
        ),
        (
            "batch-matmul",
            &["batch_matmul", "--shape", "12,128,128,64", "--bias"],
        ),
    ];
    for (name, shape) in cases {
        let args = [
            shape,
            &["--trials", "40", "--min-time-ms", "2", "--min-repeats", "3"],
        ]
        .concat();
        let records = tune(name, &args);
        assert_eq!(records.len(), 40, "{name}");
        let split = records
            .iter()
            .filter(|r| r["state"]["split_k"].as_u64().unwrap_or(1) > 1)
            .count();
        println!("{name}: {split} of 40 states split the reduction");
        if name.ends_with("split-k") {
            assert!(split >= 10, "{name}: only {split} split-K states");
        }
        for r in &records {
            assert_eq!(kind(r), None, "{name}: {}", r["result"]);
            let timing = &r["result"]["ok"];
            assert!(timing["median_us"].as_f64().unwrap() > 0.0);
            assert!(timing["samples_us"].as_array().unwrap().len() >= 3);
            assert!(r["device"]["sm_count"].as_u64().unwrap() > 0);
            assert!(r["device"]["sm_clock_mhz"].as_u64().unwrap() > 0);
        }
    }
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn tensor_core_states_pass_the_exact_check() {
    let cases: [(&str, &[&str]); 7] = [
        (
            "tc-fp16-conv-deep",
            &["conv2d", "--shape", "1,512,7,7,512,3,3,1,1", "--bias"],
        ),
        (
            "tc-fp16-conv-stem",
            &["conv2d", "--shape", "1,3,224,224,64,7,7,2,3"],
        ),
        (
            "tc-fp16-conv-1x1-stride2-half-out",
            &[
                "conv2d",
                "--shape",
                "1,256,56,56,128,1,1,2,0",
                "--relu",
                "--out-dtype",
                "fp16",
            ],
        ),
        (
            "tc-bf16-conv-3x3",
            &[
                "conv2d",
                "--shape",
                "1,64,56,56,64,3,3,1,1",
                "--dtype",
                "bf16",
            ],
        ),
        (
            "tc-fp16-matmul-tails",
            &["matmul", "--shape", "333,777,555"],
        ),
        (
            "tc-tf32-matmul",
            &["matmul", "--shape", "128,768,3072", "--dtype", "tf32"],
        ),
        (
            "tc-bf16-batch-matmul-half-out",
            &[
                "batch_matmul",
                "--shape",
                "12,128,128,64",
                "--dtype",
                "bf16",
                "--out-dtype",
                "bf16",
            ],
        ),
    ];
    for (name, shape) in cases {
        let mut args = shape.to_vec();
        if !args.contains(&"--dtype") {
            args.extend(["--dtype", "fp16"]);
        }
        args.extend([
            "--layout",
            "nhwc",
            "--trials",
            "24",
            "--min-time-ms",
            "2",
            "--min-repeats",
            "3",
        ]);
        let records = tune(name, &args);
        assert_eq!(records.len(), 24, "{name}");
        let tensor_core = records
            .iter()
            .filter(|r| r["state"].get("mma").is_some())
            .count();
        println!("{name}: {tensor_core} of 24 states use tensor cores");
        assert!(tensor_core > 0, "{name}: no tensor-core state measured");
        for r in &records {
            assert_eq!(kind(r), None, "{name}: {} {}", r["state"], r["result"]);
        }
    }
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn injected_faults_become_their_error_kinds_and_the_run_finishes() {
    let records = tune(
        "faults",
        &[
            "matmul",
            "--shape",
            "256,256,256",
            "--trials",
            "14",
            "--measure-batch",
            "7",
            "--min-time-ms",
            "2",
            "--timeout",
            "5",
            "--inject-fault",
            "launch@1,timeout@4,wrong_answer@8,launch@12",
        ],
    );
    assert_eq!(records.len(), 14);
    for (i, r) in records.iter().enumerate() {
        let expected = match i {
            1 | 12 => Some("launch"),
            4 => Some("timeout"),
            8 => Some("wrong_answer"),
            _ => None,
        };
        assert_eq!(kind(r), expected, "record {i}: {}", r["result"]);
    }
    let message = records[8]["result"]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("output["), "{message}");
    let message = records[1]["result"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("CUDA_ERROR"), "{message}");
}

/// The fastest state of `records` (a run's log) with its median.
fn fastest(records: &[Value]) -> (Value, f64) {
    records
        .iter()
        .filter_map(|r| {
            let us = r["result"]["ok"]["median_us"].as_f64()?;
            Some((r["state"].clone(), us))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a correct candidate")
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn racing_and_precision_keep_the_kernel_the_full_protocol_finds_fastest() {
    // Random search draws the same candidates from the same seed whatever is measured,
    // so both runs measure the same states; racing may only cut the slow ones short,
    // and precision (tune's default) only the timing of those whose median is known.
    for shape in ["512,512,512", "333,777,555"] {
        let args = |race: bool| {
            let mut a = vec![
                "matmul",
                "--shape",
                shape,
                "--dtype",
                "fp16",
                "--out-dtype",
                "fp16",
                "--search",
                "random",
                "--trials",
                "96",
                "--seed",
                "7",
                "--no-transfer",
            ];
            if !race {
                a.extend(["--no-race", "--precision", "0"]);
            }
            a
        };
        let full = tune("race-full", &args(false));
        let raced = tune("race-raced", &args(true));
        assert_eq!(full.len(), raced.len());
        let (winner, full_us) = fastest(&full);
        let (_, raced_us) = fastest(&raced);
        let winner_raced = raced
            .iter()
            .find(|r| r["state"] == winner)
            .expect("the same candidates");
        assert_ne!(
            winner_raced["result"]["ok"]["raced"].as_bool(),
            Some(true),
            "{shape}: the full protocol's winner ({full_us} µs) was raced out: {}",
            winner_raced["result"]
        );
        assert!(
            (raced_us - full_us).abs() <= 0.05 * full_us,
            "{shape}: best {raced_us} µs racing, {full_us} µs without"
        );
        let count = raced
            .iter()
            .filter(|r| r["result"]["ok"]["raced"].as_bool() == Some(true))
            .count();
        assert!(count > 0, "{shape}: no candidate raced");
        println!(
            "{shape}: {count} of {} raced; best {raced_us} µs vs {full_us} µs",
            raced.len()
        );
    }
}

#[test]
#[ignore = "needs two GPUs (TILESCHED_TEST_DEVICES=0,1; run by scripts/device-check)"]
fn two_devices_share_a_batch() {
    let devices = std::env::var("TILESCHED_TEST_DEVICES").unwrap_or_else(|_| "0".into());
    let records = tune(
        "devices",
        &[
            "matmul",
            "--shape",
            "512,512,512",
            "--trials",
            "24",
            "--min-time-ms",
            "2",
            "--device",
            &devices,
        ],
    );
    let used: BTreeSet<u64> = records
        .iter()
        .map(|r| r["device"]["ordinal"].as_u64().unwrap())
        .collect();
    assert_eq!(
        used.len(),
        devices.split(',').count(),
        "devices used: {used:?}"
    );
    assert!(records.iter().all(|r| kind(r).is_none()));
}

/// Runs `bench` on a log and returns its bench.json.
fn bench(name: &str, args: &[&str], log_of: &str) -> Value {
    let dir = out_dir();
    let log = dir.join(format!("gpu-test-{log_of}.jsonl"));
    let out = dir.join(format!("gpu-test-bench-{name}"));
    let o = Command::new(bin())
        .arg("bench")
        .args(args)
        .arg("--log")
        .arg(&log)
        .arg("--out")
        .arg(&out)
        .args(["--min-time-ms", "20", "--min-repeats", "8"])
        .output()
        .expect("tilesched runs");
    let text = output_text(&o);
    println!("bench {name}:\n{text}");
    assert!(o.status.success(), "bench {name}: {text}");
    assert!(out.join("bench.md").is_file());
    serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap()
}

#[test]
#[ignore = "needs a GPU, cuDNN and cuBLAS (run by scripts/device-check)"]
fn baselines_run_and_agree_with_our_kernels() {
    // Our kernels are checked exactly against the reference kernel and the vendor's
    // output against the same exact result (to its rounding), on the same inputs.
    let cases: [(&str, &[&str]); 4] = [
        ("conv3x3", &["conv2d", "--shape", "1,128,28,28,128,3,3,1,1"]),
        (
            "conv1x1s2",
            &["conv2d", "--shape", "1,256,56,56,128,1,1,2,0"],
        ),
        ("matmul", &["matmul", "--shape", "333,777,555"]),
        ("bmm", &["batch_matmul", "--shape", "12,128,128,64"]),
    ];
    for (name, shape) in cases {
        let args = [shape, &["--trials", "16", "--min-time-ms", "2"]].concat();
        tune(&format!("for-bench-{name}"), &args);
        let report = bench(name, shape, &format!("for-bench-{name}"));
        let rows = report["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1, "{name}");
        let row = &rows[0];
        assert!(row["problem"].is_null(), "{name}: {}", row["problem"]);
        assert!(row["ours"]["median_us"].as_f64().unwrap() > 0.0, "{name}");
        assert!(row["vendor"]["median_us"].as_f64().unwrap() > 0.0, "{name}");
        assert!(row["speedup"].as_f64().unwrap() > 0.0, "{name}");
        let err = row["vendor_max_abs_error"].as_f64().unwrap();
        // The exact results are integers: the vendor must round to each of them.
        assert!(err < 0.5, "{name}: vendor differs by {err}");
        let peaks = &report["peaks"];
        assert!(peaks["fp32_tflops"].as_f64().unwrap() > 1.0);
        assert!(peaks["bandwidth_gbs"].as_f64().unwrap() > 100.0);
    }
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn sass_random_legal_edits_of_the_tuned_kernels_are_bit_exact() {
    use gpu::protocol::{KernelImage, MeasureRequest, Outcome};
    use gpu::{Pool, TimingConfig, WorkerCommand};
    use sass_stage::decode::cubin::Cubin;
    use sass_stage::legality::analysis::Kernel;
    use sass_stage::legality::moves::Action;
    // The best kernels of the committed ResNet tuning runs: float32 CUDA-core kernels
    // (batch 1) and fp16 NHWC tensor-core kernels (batch 8, the log's 16 fastest records
    // per task, all that the walks rank); on Hopper also the fp16
    // matmul set's, seven of them `wgmma` kernels (HGMMA, UTMALDG, SYNCS, their tensor
    // maps and split-K workspace launched by the worker). With their task counts.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut logs = vec![
        (
            "benchmarks/results/h100-2026-11-22/resnet/tune-log.jsonl.gz",
            13,
        ),
        (
            "benchmarks/results/h100-2026-11-23/resnet-fp16-b8/best-records.jsonl.gz",
            13,
        ),
    ];
    let hopper = {
        let ctx = gpu::cuda::Context::new(0).expect("a GPU");
        gpu::DeviceInfo::query(&ctx)
            .expect("device")
            .compute_capability
            == (9, 0)
    };
    if hopper {
        logs.push((
            "benchmarks/results/h100-2026-11-26/matmul-fp16-hopper-420s/log.jsonl.gz",
            8,
        ));
    }
    let dir = std::env::temp_dir().join(format!("tilesched-sass-walks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let command = WorkerCommand {
        program: bin(),
        args: vec!["worker".into()],
    };
    let mut pool = Pool::start(&command, &[0]).expect("a GPU");
    let once = TimingConfig {
        warmup: 0,
        min_time_ms: 0.0,
        min_repeats: 1,
        max_repeats: 1,
        race_us: None,
        precision: None,
    };
    let (mut checked, mut moved, mut wgmma) = (0, 0, 0);
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    let mut walk_seed = 0;
    for (relative, tasks) in logs {
        let gz = root.join(relative);
        let ranked = records::Summarizer::new(&[]).keeping(records::KEEP);
        let summaries = records::read_summary(&gz, ranked).unwrap().tasks;
        assert_eq!(summaries.len(), tasks, "{relative}");
        for s in &summaries {
            let (best, compiled) = records::best_kernel(s, &gz).unwrap();
            let k = best.kernel;
            wgmma += usize::from(!k.launch.tensor_maps.is_empty());
            let cubin = Cubin::parse(compiled.cubin).unwrap();
            let kt = cubin.kernel(&k.name).unwrap();
            let lines = sass_stage::decode::disasm::disassemble(cubin.bytes(), &k.name).unwrap();
            let kernel = Kernel::analyze(&kt, &lines).unwrap();
            let reference = dir.join(format!("{}-stage1.cubin", s.task));
            std::fs::write(&reference, cubin.bytes()).unwrap();
            let image = |path: PathBuf| KernelImage {
                cubin: path,
                name: k.name.clone(),
                launch: k.launch.clone(),
            };
            // Checks the kernel after the first `n` actions of `walk`.
            let mut check = |walk: &[Action], n: usize, seed: u64| -> Outcome {
                let order = kernel.replay(&walk[..n]);
                assert_eq!(kernel.verify(&order), Ok(()));
                let path = dir.join(format!("{}-{seed}-{n}.cubin", s.task));
                std::fs::write(&path, cubin.with_text(&kt, &kernel.words(&order))).unwrap();
                let request = MeasureRequest {
                    id: 0,
                    problem: gpu::Problem::for_task(&best.record.shape, seed),
                    reference: image(reference.clone()),
                    candidate: image(path),
                    timing: once,
                    injected: None,
                };
                let results = pool
                    .measure_all(
                        &[request],
                        std::time::Duration::from_secs(30),
                        &|_, _, _| {},
                    )
                    .unwrap();
                results[0].0.clone()
            };
            for seed in 0..10u64 {
                let walk = kernel.random_walk(64, walk_seed);
                walk_seed += 1;
                for a in &walk {
                    *kinds.entry(a.kind.name()).or_default() += 1;
                }
                let order = kernel.replay(&walk);
                moved += order.moved().len();
                checked += 1;
                if let outcome @ Outcome::Error { .. } = check(&walk, walk.len(), seed) {
                    // Find the first action after which the kernel fails, for the report.
                    let (mut good, mut bad) = (0, walk.len());
                    while bad - good > 1 {
                        let mid = (good + bad) / 2;
                        if matches!(check(&walk, mid, seed), Outcome::Ok(_)) {
                            good = mid;
                        } else {
                            bad = mid;
                        }
                    }
                    let order = kernel.replay(&walk[..bad - 1]);
                    let a = walk[bad - 1];
                    let lo = a.row.saturating_sub(6);
                    let context: Vec<String> = (lo..(a.row + 7).min(kernel.len()))
                        .map(|p| {
                            let i = order.at(p);
                            let ins = &kernel.instructions[i];
                            format!("{p:>5} {i:>5} {:?} {}", kernel.control(&order, i), ins.text)
                        })
                        .collect();
                    panic!(
                        "{}: walk {seed} differs or faults ({outcome:?}); first bad action #{bad}: {a:?}\n{}",
                        s.task,
                        context.join("\n")
                    );
                }
            }
        }
    }
    println!(
        "{checked} edited kernels checked bit for bit ({wgmma} of the walked kernels wgmma ones), {moved} instructions moved in all; actions by kind: {kinds:?}"
    );
    assert!(moved > 0);
    assert!(!hopper || wgmma >= 7, "{wgmma} wgmma kernels walked");
    assert_eq!(kinds.len(), sass_stage::legality::moves::KINDS, "{kinds:?}");
}

#[test]
#[ignore = "needs a GPU and nvdisasm (run by scripts/device-check)"]
fn pipeline_runs_both_stages_in_one_process_with_tunes_options() {
    let dir = out_dir();
    let log = dir.join("gpu-test-pipeline.jsonl");
    let cache = dir.join("gpu-test-pipeline-cache");
    let out = dir.join("gpu-test-pipeline-sass");
    let _ = std::fs::remove_file(&log);
    let o = Command::new(bin())
        .args(["pipeline", "matmul", "--shape", "256,256,256", "--log"])
        .arg(&log)
        .arg("--cache")
        .arg(&cache)
        .arg("--out")
        .arg(&out)
        // Search options of `tune`, which the pipeline once could not take.
        .args(["--search", "random", "--trials", "12", "--min-time-ms", "2"])
        .args(["--agent", "greedy", "--budget", "4", "--rounds", "2"])
        .output()
        .expect("tilesched runs");
    let text = output_text(&o);
    println!("pipeline:\n{text}");
    assert!(o.status.success(), "{text}");
    let records = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(records, 12, "{text}");
    assert!(text.contains("stage 1: tune") && text.contains("stage 2: sass"));
    assert!(out.join("sass.md").is_file());
    assert!(cache.join("index.json").is_file());
}

/// The PIDs of running (not zombie) processes whose parent is `parent`.
fn running_children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(parent) && fields[0] != "Z" {
            out.push(pid);
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// PIDs holding a compute context on a GPU, by nvidia-smi.
fn gpu_processes() -> Vec<u32> {
    let o = Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid", "--format=csv,noheader"])
        .output()
        .expect("nvidia-smi runs");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn a_tuner_killed_while_its_kernel_hangs_leaves_no_gpu_work() {
    let log = out_dir().join("gpu-test-orphan.jsonl");
    let _ = std::fs::remove_file(&log);
    let mut tune = Command::new(bin())
        .args(["tune", "matmul", "--shape", "256,256,256", "--trials", "8"])
        .args([
            "--search",
            "random",
            "--timeout",
            "600",
            "--inject-fault",
            "timeout@0",
        ])
        .arg("--log")
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the worker holds the GPU with the hanging kernel.
    let started = std::time::Instant::now();
    let worker = loop {
        if let Some(&w) = running_children(tune.id()).first()
            && gpu_processes().contains(&w)
        {
            break w;
        }
        assert!(started.elapsed().as_secs() < 60, "no worker on the GPU");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert!(alive(worker) && gpu_processes().contains(&worker));
    tune.kill().unwrap();
    tune.wait().unwrap();
    let killed = std::time::Instant::now();
    while alive(worker) || gpu_processes().contains(&worker) {
        assert!(
            killed.elapsed().as_secs_f64() < 5.0,
            "worker {worker} still runs or holds the GPU 5 s after its tuner was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!(
        "worker {worker} gone and off the GPU {:.2} s after kill -9 of its tuner",
        killed.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs a GPU (run by scripts/device-check)"]
fn a_multi_gigabyte_task_prepares_outside_the_candidates_timeout() {
    // A is 30000 x 30000 floats (3.6 GB): filling it and running the reference count
    // against no candidate's 5 s (on an H100 host the 4 candidates took 14.3 s in all;
    // two timed runs and the check of a slow random candidate fit in 5 s).
    let started = std::time::Instant::now();
    let records = tune(
        "large",
        &[
            "matmul",
            "--shape",
            "30000,8,30000",
            "--trials",
            "4",
            "--search",
            "random",
            "--timeout",
            "5",
            "--min-time-ms",
            "1",
            "--min-repeats",
            "2",
        ],
    );
    assert_eq!(records.len(), 4);
    for r in &records {
        assert_eq!(kind(r), None, "{}", r["result"]);
    }
    println!(
        "4 candidates of a 3.6 GB task measured in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Every kernel of each deploy cache in `$TILESCHED_RUNTIME_CACHES` (`:`-separated;
/// without it, a cache made here from a short tune of a split-K-prone layer, a matmul
/// and, on Hopper, an fp16 matmul whose best kernel is a `wgmma` one with tensor maps
/// and a decode-sized one, usually split through a workspace)
/// for this GPU, launched through the runtime on the session's stream, must
/// equal the reference kernel's output bit for bit and cuDNN's (cuBLAS's) to its
/// rounding. One line per kernel in `$TILESCHED_TEST_OUT/runtime-test.txt`.
#[test]
#[ignore = "needs a GPU, cuDNN and cuBLAS (run by scripts/device-check)"]
fn runtime_launches_every_cached_kernel_and_matches_the_vendor() {
    use benchmarks::run::{Options, OurKernel, Session};
    use gpu::{Problem, TimingConfig};

    let caches: Vec<PathBuf> = match std::env::var("TILESCHED_RUNTIME_CACHES") {
        Ok(list) => list.split(':').map(PathBuf::from).collect(),
        Err(_) => {
            let cache = out_dir().join("gpu-test-runtime-cache");
            let _ = std::fs::remove_dir_all(&cache);
            // On Hopper the fp16 matmul's best kernel is a `wgmma` one: launched with
            // the tensor maps its entry records.
            let conv: &[&str] = &["conv2d", "--shape", "1,512,7,7,512,3,3,1,1"];
            let matmul: &[&str] = &["matmul", "--shape", "333,777,555"];
            let hopper: &[&str] = &[
                "matmul",
                "--shape",
                "1024,1024,1024",
                "--dtype",
                "fp16",
                "--out-dtype",
                "fp16",
            ];
            // A decode-sized matmul: its best kernel is usually split through a workspace.
            let decode: &[&str] = &[
                "matmul",
                "--shape",
                "16,4096,4096",
                "--dtype",
                "fp16",
                "--out-dtype",
                "fp16",
            ];
            for (name, shape) in [
                ("runtime-conv", conv),
                ("runtime-matmul", matmul),
                ("runtime-wgmma", hopper),
                ("runtime-decode", decode),
            ] {
                tune(
                    name,
                    &[shape, &["--trials", "24", "--min-time-ms", "2"]].concat(),
                );
                let log = out_dir().join(format!("gpu-test-{name}.jsonl"));
                let o = Command::new(bin())
                    .args(["deploy", "add", "--log"])
                    .arg(&log)
                    .arg("--cache")
                    .arg(&cache)
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", output_text(&o));
            }
            vec![cache]
        }
    };
    let options = Options {
        device: 0,
        timing: TimingConfig {
            warmup: 1,
            min_time_ms: 4.0,
            min_repeats: 3,
            max_repeats: 1000,
            race_us: None,
            precision: None,
        },
        rounds: 1,
        cudnn: None,
        cublas: None,
        choices: benchmarks::baseline::Choices {
            engines: 8,
            algorithms: 4,
            handles: 1,
            lt_algorithms: 8,
            conv_gemm_algorithms: 4,
        },
        seed: 1,
    };
    let mut session = Session::new(options).unwrap();
    let arch = session.device.arch();
    let mut lines = vec![format!(
        "# {} ({arch}): every deploy-cache kernel through runtime::Kernel::launch",
        session.device.name
    )];
    let mut failures = Vec::new();
    let (mut kernels, mut mapped) = (0, 0);
    for dir in &caches {
        let mut rt = runtime::Runtime::open(dir, 0).unwrap();
        let tasks: Vec<String> = rt.tasks().iter().map(|t| t.to_string()).collect();
        assert!(
            !tasks.is_empty(),
            "{} has no kernels for this GPU",
            dir.display()
        );
        lines.push(format!("## {} ({} kernels)", dir.display(), tasks.len()));
        for key in tasks {
            let kernel = rt.kernel(&key).unwrap();
            let task = kernel.entry().shape.unwrap();
            session.load_vendor(&task.op).unwrap();
            let reference = schedule::reference::reference_kernel(&task);
            let reference = OurKernel {
                cubin: gpu::compile(&reference.source, &reference.name, &arch)
                    .unwrap()
                    .cubin,
                name: reference.name,
                launch: reference.launch,
            };
            let problem = Problem::for_task(&task, 7);
            let stream = session.context().raw_stream();
            // A split kernel's scratch, zeroed once, as `params()` asks.
            let workspace = kernel
                .params()
                .iter()
                .find(|p| p.role == runtime::Role::Workspace)
                .map(|p| {
                    let ctx = session.context();
                    let w = ctx.alloc_typed(p.elements, p.dtype).unwrap();
                    ctx.zero(&w).unwrap();
                    w
                });
            let outputs = session
                .outputs(&task, &problem, &reference, |set| {
                    let mut pointers: Vec<u64> = set.iter().map(|b| b.device_ptr()).collect();
                    pointers.extend(workspace.as_ref().map(|w| w.device_ptr()));
                    // SAFETY: the set holds the task's buffers (inputs, bias, output) of
                    // exactly the sizes `params()` names, then the workspace it names, on
                    // the session's stream.
                    unsafe { kernel.launch(&pointers, stream) }
                        .map_err(|e| benchmarks::run::BenchError::NoGpu(e.to_string()))
                })
                .unwrap();
            let exact = outputs
                .expected
                .iter()
                .zip(&outputs.ours)
                .all(|(e, o)| e.to_bits() == o.to_bits());
            let scale = outputs
                .expected
                .iter()
                .fold(1.0f64, |m, v| m.max(f64::from(v.abs())));
            let max_diff = |a: &[f32], b: &[f32]| {
                a.iter().zip(b).fold(0.0f64, |m, (x, y)| {
                    let d = f64::from(x - y).abs();
                    if d.is_nan() { f64::INFINITY } else { m.max(d) }
                })
            };
            let vendor_vs_ours = max_diff(&outputs.ours, &outputs.vendor);
            let vendor_ok = max_diff(&outputs.expected, &outputs.vendor) <= 1e-3 * scale;
            let ok = exact && vendor_ok;
            let e = kernel.entry();
            mapped += usize::from(!e.launch.tensor_maps.is_empty());
            lines.push(format!(
                "{} {key}: {} (grid {}, block {}, zero_output {}, workspace {} B, {} tensor maps, {:.2} µs tuned): exact {exact}, \
                 max |ours - vendor| {vendor_vs_ours} (largest |output| {scale}), vendor {}",
                if ok { "ok  " } else { "FAIL" },
                e.kernel,
                e.launch.grid,
                e.launch.block,
                e.launch.zero_output,
                e.launch.workspace_bytes,
                e.launch.tensor_maps.len(),
                e.final_us,
                outputs.vendor_routine
            ));
            if !ok {
                failures.push(key.clone());
            }
            kernels += 1;
        }
    }
    lines.push(format!(
        "{} of {kernels} kernels equal the reference exactly and the vendor to its rounding",
        kernels - failures.len()
    ));
    let text = lines.join("\n") + "\n";
    print!("{text}");
    std::fs::write(out_dir().join("runtime-test.txt"), &text).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    if std::env::var("TILESCHED_RUNTIME_CACHES").is_err() && arch == "sm_90" {
        assert!(
            mapped > 0,
            "no wgmma kernel (with tensor maps) was launched"
        );
    }
}

/// A `wgmma` kernel through the runtime, from a deploy entry: launched with the tensor
/// maps its entry records, its output equals the reference kernel's bit for bit; the same
/// entry with its maps removed is refused when the cache opens, naming it (it used to be
/// launched with too few parameters).
#[test]
#[ignore = "needs a Hopper GPU (run by scripts/device-check)"]
fn runtime_launches_a_wgmma_entry_and_refuses_it_without_its_maps() {
    use gpu::cuda::{Context, KernelArg, LoadedKernel};
    use runtime::{EntryError, RuntimeError};
    use schedule::{DType, Epilogue, Layout};

    let ctx = Context::new(0).unwrap();
    let device = gpu::DeviceInfo::query(&ctx).unwrap();
    let spec = device.spec().unwrap();
    let arch = device.arch();
    let task = schedule::Task::new(
        schedule::parse_shape("matmul", "512,512,512").unwrap(),
        Epilogue {
            bias: true,
            relu: false,
        },
    )
    .unwrap()
    .with_types(DType::Fp16, DType::Fp16, Layout::Nchw)
    .unwrap();
    let kernel = schedule::Sampler::new(&task, &spec, 1)
        .sample_distinct(64)
        .iter()
        .filter_map(|s| schedule::generate(&task, s, &spec).ok())
        .find(|k| !k.launch.tensor_maps.is_empty() && k.launch.workspace_bytes == 0)
        .expect("a wgmma kernel among 64 sampled states");
    let cubin = gpu::compile(
        &kernel.source,
        &kernel.name,
        &kernel.launch.target.arch(&arch),
    )
    .unwrap()
    .cubin;
    let dir = out_dir().join("gpu-test-runtime-wgmma-cache");
    let _ = std::fs::remove_dir_all(&dir);
    let mut cache = runtime::DeployCache::open(&dir).unwrap();
    cache
        .store(
            runtime::NewEntry {
                gpu: device.name.clone(),
                compute_capability: device.compute_capability,
                task: task.key(),
                shape: task,
                kernel: kernel.name.clone(),
                launch: kernel.launch.clone(),
                stage1_us: 1.0,
                final_us: 1.0,
                stage: runtime::Stage::Stage1,
                created_by: runtime::TOOL_VERSION.to_string(),
            },
            &cubin,
        )
        .unwrap();

    // The inputs, and the reference kernel's output of them.
    let problem = gpu::Problem::for_task(&task, 7);
    let inputs: Vec<gpu::cuda::Buffer> = problem
        .input_values()
        .iter()
        .map(|values| {
            let b = ctx.alloc_typed(values.len(), problem.dtype).unwrap();
            ctx.upload(&b, values).unwrap();
            b
        })
        .collect();
    let pointers = |output: &gpu::cuda::Buffer| -> Vec<u64> {
        inputs
            .iter()
            .chain([output])
            .map(|b| b.device_ptr())
            .collect()
    };
    let expected = ctx.alloc_typed(problem.output, problem.out_dtype).unwrap();
    let reference = schedule::reference::reference_kernel(&task);
    let reference_cubin = gpu::compile(&reference.source, &reference.name, &arch)
        .unwrap()
        .cubin;
    let zero = reference
        .launch
        .zero_output
        .then(|| (expected.device_ptr(), expected.bytes()));
    let reference =
        LoadedKernel::load(&reference_cubin, &reference.name, reference.launch).unwrap();
    let args: Vec<KernelArg> = pointers(&expected)
        .into_iter()
        .map(KernelArg::Ptr)
        .collect();
    // SAFETY: the reference kernel takes the task's inputs and output, allocated above
    // at the sizes the problem names, in the current context, on its stream.
    unsafe { reference.launch(&args, zero, ctx.raw_stream()) }.unwrap();

    let mut rt = runtime::Runtime::open(&dir, 0).unwrap();
    let ours = ctx.alloc_typed(problem.output, problem.out_dtype).unwrap();
    let deployed = rt.kernel(&task.key()).unwrap();
    assert_eq!(
        deployed.entry().launch.tensor_maps,
        kernel.launch.tensor_maps
    );
    // SAFETY: the buffers are the task's, of the sizes `params()` names, in the primary
    // context `Runtime::open` made current; the stream is the context's.
    unsafe { deployed.launch(&pointers(&ours), ctx.raw_stream()) }.unwrap();
    ctx.synchronize().unwrap();
    let expected = ctx.download(&expected).unwrap();
    let ours = ctx.download(&ours).unwrap();
    assert!(
        expected.iter().any(|&v| v != 0.0),
        "the reference wrote zeros"
    );
    let exact = expected
        .iter()
        .zip(&ours)
        .all(|(e, o)| e.to_bits() == o.to_bits());
    assert!(
        exact,
        "{}: {:?}",
        kernel.name,
        gpu::check::first_mismatch(&expected, &ours)
    );
    println!(
        "{}: {} tensor maps, launched through the runtime, equal to the reference",
        kernel.name,
        kernel.launch.tensor_maps.len()
    );

    // Without its maps: refused when the cache opens, never launched.
    drop(rt);
    let index = dir.join(runtime::INDEX_FILE);
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    json["entries"][0]["launch"]
        .as_object_mut()
        .unwrap()
        .remove("tensor_maps");
    std::fs::write(&index, json.to_string()).unwrap();
    let err = match runtime::Runtime::open(&dir, 0) {
        Ok(_) => panic!("an entry without its tensor maps was accepted"),
        Err(err) => err,
    };
    let text = err.to_string();
    assert!(
        matches!(
            &err,
            RuntimeError::BadEntry { why, .. } if matches!(**why, EntryError::ParamCount { maps: 0, .. })
        ),
        "{text}"
    );
    assert!(text.contains(&task.key()), "{text}");
    println!("without its maps: {text}");
}
