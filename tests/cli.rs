//! The command line: the issue's "done when" commands, and bad input getting one clear
//! error line and a non-zero exit, never a panic.

mod common;

use common::{fails, tilesched, tilesched_env};
use std::path::Path;
use std::process::{Command, Output};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn workloads_lists_the_13_resnet_layers() {
    let o = tilesched(&["workloads", "--network", "resnet"]);
    assert!(o.status.success());
    let out = stdout(&o);
    let tasks: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(tasks.len(), 13);
    assert!(tasks[0].starts_with("conv2d_n1_c3_h224_w224_k64_r7_s7_st2_p3 "));
    assert!(tasks[11].contains("1,512,7,7,512,3,3,1,1"));
    // key, shape, GFLOP, count
    assert_eq!(tasks[11].split_whitespace().count(), 4);
}

#[test]
fn workloads_of_every_network_and_batch() {
    let o = tilesched(&["workloads", "--batch", "4"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for name in ["resnet,", "resnet50,", "resnet18,", "yolo,", "bert-base,"] {
        assert!(out.contains(&format!("# {name} batch 4")), "{out}");
    }
    assert!(out.contains("batch_matmul_b48_m128_n128_k64"));
}

fn codegen_compiles(op: &str, shape: &str, dir: &Path) -> serde_json::Value {
    let dir_s = dir.to_str().unwrap();
    let o = tilesched(&[
        "codegen",
        op,
        "--shape",
        shape,
        "--sample",
        "20",
        "--seed",
        "1",
        "--out",
        dir_s,
        "--compile",
        "sm_90",
    ]);
    let out = stdout(&o);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.lines().last(), Some("compiled 20/20"), "{out}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let kernels = manifest["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), 20);
    for k in kernels {
        let source = std::fs::read_to_string(dir.join(k["file"].as_str().unwrap())).unwrap();
        // The source carries the state that produced it.
        let state_line = source
            .lines()
            .find_map(|l| l.strip_prefix("// state: "))
            .unwrap();
        let state: serde_json::Value = serde_json::from_str(state_line).unwrap();
        assert_eq!(state, k["state"]);
        assert_eq!(k["compile"]["ok"], true);
        assert!(k["compile"]["registers"].as_u64().unwrap() > 0);
        assert!(k["launch"]["block"].as_u64().unwrap() >= 32);
    }
    manifest
}

#[test]
fn codegen_compiles_the_done_when_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let m = codegen_compiles("conv2d", "1,512,7,7,512,3,3,1,1", &tmp.path().join("deep"));
    assert_eq!(m["task_key"], "conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1");
    codegen_compiles("conv2d", "1,3,224,224,64,7,7,2,3", &tmp.path().join("stem"));
    codegen_compiles("matmul", "333,777,555", &tmp.path().join("mm"));
    codegen_compiles("batch_matmul", "12,128,128,64", &tmp.path().join("bmm"));
}

#[test]
fn codegen_without_compile_and_same_seed_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |sub: &str| {
        let dir = tmp.path().join(sub);
        let o = tilesched(&[
            "codegen",
            "conv2d",
            "--shape",
            "c=16,h=9,w=12,k=8,r=3,s=1,stride_h=2,pad_w=1,dilation_h=2",
            "--sample",
            "5",
            "--seed",
            "9",
            "--out",
            dir.to_str().unwrap(),
            "--bias",
            "--relu",
        ]);
        assert!(o.status.success());
        assert_eq!(stdout(&o).lines().last(), Some("generated 5/5"));
        let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .collect();
        files.sort();
        files
    };
    let a = run("a");
    assert_eq!(a.len(), 6);
    assert_eq!(a, run("b"));
}

#[test]
fn bad_input_gets_one_line_and_a_nonzero_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    // Each case: the command line (whitespace-separated, OUT = a writable directory)
    // and a fragment its one error line must contain.
    let cases = [
        ("workloads --network vgg", "unknown network 'vgg'"),
        ("workloads --batch 0", "batch"),
        ("codegen conv3d --shape 1 --out OUT", "unknown operator"),
        ("codegen conv2d --shape 1,2,3 --out OUT", "N,C,H,W"),
        (
            "codegen conv2d --shape 1,3,0,8,4,3,3,1,1 --out OUT",
            "h must be at least 1",
        ),
        ("codegen matmul --shape 4,-5,6 --out OUT", "'-5'"),
        (
            "codegen conv2d --shape 1,3,2,2,4,3,3,4,0 --out OUT",
            "output is empty",
        ),
        ("codegen matmul --out OUT", "--shape"),
        (
            "codegen matmul --shape 8,8,8 --out /proc/tilesched",
            "cannot",
        ),
        (
            "codegen matmul --shape 8,8,8 --out OUT --compile compute_90",
            "sm_XY",
        ),
        (
            "codegen matmul --shape 8,8,8 --out OUT --gpu a100",
            "unknown GPU",
        ),
        ("frobnicate", "frobnicate"),
        ("tune conv3d --shape 1 --simulate", "unknown operator"),
        ("tune conv2d --shape 1,2,3 --simulate", "N,C,H,W"),
        ("tune matmul --simulate", "--network"),
        (
            "tune matmul --shape 8,8,8 --network resnet",
            "cannot be used",
        ),
        ("tune matmul --network resnet --simulate", "no matmul tasks"),
        (
            "tune matmul --shape 8,8,8 --trials 0 --simulate",
            "--trials",
        ),
        ("tune matmul --shape 8,8,8 --device x", "'x'"),
        (
            "tune matmul --shape 8,8,8 --simulate --retrain-growth=-1",
            "--retrain-growth",
        ),
        (
            "tune matmul --shape 8,8,8 --simulate --precision 1",
            "--precision",
        ),
        ("model replay --log OUT/none.jsonl --round 0", "--round"),
        (
            "tune matmul --shape 8,8,8 --simulate --inject-fault crash@1",
            "unknown fault kind",
        ),
        (
            "tune matmul --shape 8,8,8 --log /proc/x/y.jsonl --simulate",
            "cannot",
        ),
        (
            "best --log /nonexistent/log.jsonl",
            "/nonexistent/log.jsonl",
        ),
        (
            "export --log /nonexistent/l --task t --format cuda --out OUT/k.cu",
            "cannot read tuning log",
        ),
        ("export --log x --task t --format sass --out y", "sass"),
        ("bench conv3d --shape 1 --log x", "unknown operator"),
        (
            "bench conv2d --network resnet --log /nonexistent/l.jsonl",
            "cannot read tuning log",
        ),
        (
            "bench conv2d --network resnet --log /dev/null --rounds 0",
            "--rounds",
        ),
        (
            "bench matmul --network resnet --log /dev/null",
            "no matmul tasks",
        ),
        // No GPU here: one line, and no report directory left behind.
        (
            "bench conv2d --network resnet --log /dev/null --out OUT/bench",
            "no GPU",
        ),
        (
            "bench conv2d --network resnet --log /dev/null --peer tvm",
            "invalid value 'tvm' for '--peer",
        ),
    ];
    for (command, expected) in cases {
        let args: Vec<&str> = command
            .split_whitespace()
            .map(|a| if a == "OUT" { out } else { a })
            .collect();
        let err = fails(&args);
        assert!(err.contains(expected), "{command}: {err}");
    }
    assert!(!tmp.path().join("bench").exists());
}

/// `--peer torch` needs a python3 with torch on PATH: without one, one line before any
/// GPU work, for each way it can be missing.
#[test]
fn peer_without_torch_is_one_clear_line() {
    use std::os::unix::fs::PermissionsExt;
    let empty = tempfile::tempdir().unwrap();
    let no_torch = tempfile::tempdir().unwrap();
    let python = no_torch.path().join("python3");
    std::fs::write(&python, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (path, expected) in [
        (empty.path(), "no python3 on PATH"),
        (no_torch.path(), "cannot import torch"),
    ] {
        let args = [
            "bench",
            "conv2d",
            "--network",
            "resnet",
            "--log",
            "/dev/null",
            "--peer",
            "torch",
        ];
        let o = tilesched_env(&args, &[("PATH", path.to_str().unwrap())]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{err}");
    }
}

#[test]
fn compiling_without_nvrtc_is_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(["codegen", "matmul", "--shape", "64,64,64", "--out"])
        .arg(tmp.path())
        .args(["--compile", "sm_90"])
        .env("TILESCHED_NVRTC", "/nonexistent/libnvrtc.so.13")
        .env("TILESCHED_CACHE", "/nonexistent")
        .env("CUDA_HOME", "/nonexistent")
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .unwrap();
    // Where a CUDA toolkit is installed system-wide NVRTC is still found; elsewhere the
    // run must fail with one line that says what is missing and how to get it.
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("libnvrtc.so.13") && err.contains("scripts/setup.sh"),
            "{err}"
        );
    }
}

/// A deploy cache with one kernel of `op` `shape`, written through the library as the
/// pipeline would: a kernel of three pointers (NVRTC, no GPU), as the task's A, B and C.
fn deploy_cache_of(dir: &Path, op: &str, shape: &str) -> runtime::DeployEntry {
    use runtime::{DeployCache, NewEntry, Stage, TOOL_VERSION};
    let source = r#"extern "C" __global__ void default_function_kernel(
        const float* a, const float* b, float* c) { c[0] = a[0] * b[0]; }"#;
    let cubin = gpu::compile(source, "default_function_kernel", "sm_90")
        .unwrap()
        .cubin;
    let shape = schedule::Task::new(
        schedule::parse_shape(op, shape).unwrap(),
        schedule::Epilogue::default(),
    )
    .unwrap();
    let mut cache = DeployCache::open(dir).unwrap();
    let new = NewEntry {
        gpu: "NVIDIA H100 80GB HBM3".to_string(),
        compute_capability: (9, 0),
        task: shape.key(),
        shape,
        kernel: "default_function_kernel".to_string(),
        launch: schedule::LaunchConfig::linear(64, 256, 32768),
        stage1_us: 21.5,
        final_us: 19.25,
        stage: Stage::Sass,
        created_by: TOOL_VERSION.to_string(),
    };
    cache.store(new, &cubin).unwrap().entry
}

fn deploy_cache(dir: &Path) -> runtime::DeployEntry {
    deploy_cache_of(dir, "matmul", "512,512,512")
}

#[test]
fn deploy_lookup_prints_the_cached_kernel() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = deploy_cache(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let args = [
        "deploy",
        "lookup",
        "--cache",
        dir,
        "--task",
        "matmul_m512_n512_k512",
        "--gpu",
        "NVIDIA H100 80GB HBM3",
        "--cc",
        "9.0",
    ];
    let o = tilesched(&args);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let path = tmp.path().join(&entry.cubin);
    let expected = [
        format!("path: {}", path.display()),
        "kernel: default_function_kernel".to_string(),
        "params: input: 262144 f32, weight: 262144 f32, output: 262144 f32".to_string(),
        "grid: 64".to_string(),
        "block: 256".to_string(),
        "dynamic_shared_bytes: 32768".to_string(),
        "zero_output: false".to_string(),
        "stage1_us: 21.5".to_string(),
        "final_us: 19.25".to_string(),
        "stage: sass".to_string(),
    ];
    assert_eq!(out.lines().collect::<Vec<_>>(), expected, "{out}");

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let o = tilesched(&json_args);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["path"], path.to_str().unwrap());
    assert_eq!(v["launch"]["dynamic_shared_bytes"], 32768);
    assert_eq!(v["sha256"], entry.sha256.as_str());

    // A modified cubin is refused.
    std::fs::write(&path, b"\x7fELF tampered").unwrap();
    let err = fails(&args);
    assert!(err.contains("does not match its recorded sha256"), "{err}");
}

#[test]
fn deploy_lookup_errors_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    deploy_cache(tmp.path());
    let dir = tmp.path().to_str().unwrap();
    let h100 = "NVIDIA H100 80GB HBM3";
    let lookup = |cache: &str, task: &str, gpu: &str, cc: &str| {
        fails(&[
            "deploy", "lookup", "--cache", cache, "--task", task, "--gpu", gpu, "--cc", cc,
        ])
    };
    let err = lookup(dir, "matmul_m1_n1_k1", h100, "9.0");
    assert!(
        err.contains("no deployed kernel for task matmul_m1_n1_k1")
            && err.contains("matmul_m512_n512_k512"),
        "{err}"
    );
    let err = lookup(dir, "matmul_m512_n512_k512", "NVIDIA H200", "9.0");
    assert!(
        err.contains("tuned for NVIDIA H100 80GB HBM3 (sm_90), not for this GPU, NVIDIA H200"),
        "{err}"
    );
    let err = lookup(dir, "matmul_m1_n1_k1", "NVIDIA H200", "9.0");
    assert!(err.contains("no tasks for NVIDIA H200 (sm_90)"), "{err}");
    let err = lookup("/nonexistent/cache", "t", h100, "9.0");
    assert!(err.contains("does not exist"), "{err}");
    let err = lookup(dir, "t", h100, "90");
    assert!(err.contains("MAJOR.MINOR"), "{err}");
    std::fs::write(tmp.path().join("index.json"), "{").unwrap();
    let err = lookup(dir, "t", h100, "9.0");
    assert!(err.contains("is corrupt"), "{err}");
    // --gpu without --cc.
    let err = fails(&[
        "deploy", "lookup", "--cache", dir, "--task", "t", "--gpu", h100,
    ]);
    assert!(err.contains("--cc"), "{err}");
}

#[test]
fn deploy_lookup_refuses_an_edited_entry_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = deploy_cache_of(tmp.path(), "conv2d", "1,64,56,56,64,3,3,1,1");
    let index = tmp.path().join("index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let dir = tmp.path().to_str().unwrap();
    let lookup = || {
        fails(&[
            "deploy",
            "lookup",
            "--cache",
            dir,
            "--task",
            &entry.task,
            "--gpu",
            "NVIDIA H100 80GB HBM3",
            "--cc",
            "9.0",
        ])
    };
    let named = format!(
        "has a bad entry, of task {} on NVIDIA H100 80GB HBM3 (sm_90): ",
        entry.task
    );
    // A window larger than the padded input (deriving its sizes panicked).
    std::fs::write(&index, text.replace("\"r\": 3", "\"r\": 99")).unwrap();
    let err = lookup();
    assert!(
        err.contains(&format!("{named}its shape is not a valid task")),
        "{err}"
    );
    // A tensor map the kernel does not take, of a buffer it does not have.
    let map = r#""tensor_maps": [{"buffer": 3, "tensor": {"dtype": "f32", "dims": [64, 64],
        "strides": [256], "boxed": [32, 64], "swizzle": "b128"}}],"#;
    std::fs::write(
        &index,
        text.replace("\"zero_output\"", &format!("{map} \"zero_output\"")),
    )
    .unwrap();
    let err = lookup();
    assert!(
        err.contains(&format!(
            "{named}its kernel default_function_kernel takes 3 parameters, but the entry gives 3 pointers and 1 tensor maps"
        )),
        "{err}"
    );
}

#[test]
fn sass_analyses_a_cubin_and_bad_input_is_one_line_with_nothing_written() {
    let tmp = tempfile::tempdir().unwrap();
    let op = schedule::parse_shape("conv2d", "1,64,56,56,64,3,3,1,1").unwrap();
    let task = schedule::Task::new(op, schedule::Epilogue::default()).unwrap();
    let spec = schedule::GpuSpec::h100();
    let state = schedule::Sampler::new(&task, &spec, 1).sample().unwrap();
    let k = schedule::generate(&task, &state, &spec).unwrap();
    let sm90 = tmp.path().join("k90.cubin");
    std::fs::write(
        &sm90,
        gpu::compile(&k.source, &k.name, "sm_90").unwrap().cubin,
    )
    .unwrap();
    let sm90 = sm90.to_str().unwrap();
    let o = tilesched(&["sass", "--cubin", sm90, "--kernel", &k.name]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("basic blocks") && text.contains("legal moves:"),
        "{text}"
    );

    let out = tmp.path().join("out");
    let out_s = out.to_str().unwrap();
    let mut cases: Vec<(Vec<String>, &str)> = Vec::new();
    let case = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    cases.push((
        case(&["sass", "--cubin", sm90, "--kernel", "nope"]),
        "nope is not in the cubin",
    ));
    cases.push((
        case(&["sass", "--cubin", "Cargo.toml", "--kernel", "k"]),
        "not a usable cubin",
    ));
    if let Ok(old) = gpu::compile(&k.source, &k.name, "sm_80") {
        let sm80 = tmp.path().join("k80.cubin");
        std::fs::write(&sm80, old.cubin).unwrap();
        cases.push((
            case(&[
                "sass",
                "--cubin",
                sm80.to_str().unwrap(),
                "--kernel",
                &k.name,
            ]),
            "sm_90 only",
        ));
    }
    cases.push((
        case(&["sass", "--log", "x", "--out", out_s]),
        "--task KEY or --all",
    ));
    cases.push((
        case(&[
            "sass",
            "--log",
            "/nonexistent/l.jsonl",
            "--all",
            "--out",
            out_s,
        ]),
        "cannot read tuning log",
    ));
    cases.push((
        case(&["sass", "--log", "/dev/null", "--all", "--out", out_s]),
        "holds no records",
    ));
    cases.push((
        case(&[
            "pipeline",
            "conv2d",
            "--network",
            "resnet",
            "--log",
            "/nonexistent/l.jsonl",
            "--cache",
            out_s,
            "--skip-tuning",
        ]),
        "needs an existing log",
    ));
    for (args, expected) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = fails(&args);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    // A missing disassembler, named explicitly.
    let o = Command::new(env!("CARGO_BIN_EXE_tilesched"))
        .args(["sass", "--cubin", sm90, "--kernel", &k.name])
        .env("TILESCHED_NVDISASM", "/nonexistent/nvdisasm")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.lines().count() == 1, "{err}");
    assert!(err.contains("nvdisasm not found"), "{err}");
    assert!(!out.exists(), "nothing is written on bad input");
}

/// The graph of torchvision's ResNet-50 (benchmarks/onnx/export.py, weights left out).
const RESNET50_ONNX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/onnx/tests/data/resnet50.onnx");

/// Task lines (key, shape, GFLOP, count) of `workloads` output.
fn task_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn workloads_of_an_onnx_resnet50_are_those_of_the_network() {
    let onnx = stdout(&tilesched(&["workloads", "--onnx", RESNET50_ONNX]));
    let network = stdout(&tilesched(&["workloads", "--network", "resnet50"]));
    let convs: Vec<String> = task_lines(&onnx)
        .into_iter()
        .filter(|l| l.starts_with("conv2d"))
        .collect();
    assert_eq!(convs, task_lines(&network), "{onnx}");
    assert_eq!(convs.len(), 23);
    let count: u32 = convs
        .iter()
        .map(|l| l.split_whitespace().last().unwrap().parse::<u32>().unwrap())
        .sum();
    assert_eq!(count, 53);
    // The classifier is a task too, and what is not tuned is listed, not dropped.
    assert!(onnx.contains("matmul_m1_n1000_k2048_bias"), "{onnx}");
    let last = onnx.lines().last().unwrap();
    assert!(
        last.starts_with("# not tuned: ") && last.contains("53 BatchNormalization"),
        "{last}"
    );
    // A batch for the model's input; types apply as for a network.
    let b8 = stdout(&tilesched(&[
        "workloads",
        "--onnx",
        RESNET50_ONNX,
        "--input",
        "input=8,3,224,224",
        "--dtype",
        "fp16",
        "--layout",
        "nhwc",
    ]));
    assert!(
        b8.contains("conv2d_n8_c3_h224_w224_k64_r7_s7_st2_p3_fp16_nhwc "),
        "{b8}"
    );
}

#[test]
fn onnx_input_errors_are_one_line() {
    let err = fails(&["workloads", "--onnx", "/nonexistent.onnx"]);
    assert!(err.contains("/nonexistent.onnx"), "{err}");
    let err = fails(&[
        "workloads",
        "--onnx",
        RESNET50_ONNX,
        "--input",
        "image=1,3,224,224",
    ]);
    assert!(err.contains("image") && err.contains("input"), "{err}");
    let err = fails(&["workloads", "--onnx", RESNET50_ONNX, "--input", "input=1,x"]);
    assert!(err.contains("not a positive integer"), "{err}");
    // The model's batch is fixed: --batch alone would be ignored, so it is refused.
    let err = fails(&["workloads", "--onnx", RESNET50_ONNX, "--batch", "8"]);
    assert!(err.contains("--input input=8,3,224,224"), "{err}");
    // --input belongs to --onnx; --onnx and --network exclude each other.
    fails(&[
        "workloads",
        "--network",
        "resnet",
        "--input",
        "input=1,3,224,224",
    ]);
    fails(&[
        "tune",
        "conv2d",
        "--network",
        "resnet",
        "--onnx",
        RESNET50_ONNX,
    ]);
    // --input with --onnx reaches every command that takes --onnx (clap once refused the
    // pair on tune, bench and pipeline): here each gets as far as wanting a GPU or a log.
    for command in ["tune", "bench", "pipeline"] {
        let mut args = vec![
            command,
            "conv2d",
            "--onnx",
            RESNET50_ONNX,
            "--input",
            "input=2,3,224,224",
            "--log",
            "/nonexistent/dir/l.jsonl",
        ];
        if command == "pipeline" {
            args.extend(["--cache", "/nonexistent/dir/cache"]);
        }
        let o = tilesched(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{command}");
        assert!(!err.contains("cannot be used with"), "{command}: {err}");
        assert!(
            err.contains("conv2d_n2_") || err.contains("l.jsonl"),
            "{command}: {err}"
        );
    }
    let err = fails(&["bench", "conv2d", "--log", "/dev/null"]);
    assert!(err.contains("give the tasks"), "{err}");
}

/// A reader that goes away (`tilesched workloads | head -1`) ends the command quietly:
/// status 0, nothing on stderr (it once panicked with "failed printing to stdout").
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::process::Stdio;
    for args in [
        &["workloads"][..],
        &["workloads", "--network", "resnet50"][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tilesched"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before the child writes: its first line meets a broken pipe.
        drop(child.stdout.take());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{args:?}: {:?} {err}", o.status);
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

/// Model paths that are not regular files, and sampling without bound, are refused in
/// one line each (a FIFO once hung, `/dev/zero` read until memory ran out, a directory
/// said "Is a directory" twice).
#[test]
fn bad_models_and_samples_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let csv = tmp.path().join("f.csv");
    for (args, expected) in [
        (
            vec!["workloads", "--onnx", "/dev/zero"],
            "/dev/zero is not a regular file",
        ),
        (vec!["workloads", "--onnx", dir], "is not a regular file"),
        (
            vec![
                "codegen",
                "matmul",
                "--shape",
                "64,64,64",
                "--sample",
                "1000000000",
                "--out",
                dir,
            ],
            "--sample must be between 1 and 100000 (got 1000000000)",
        ),
        (
            vec![
                "features",
                "matmul",
                "--shape",
                "64,64,64",
                "--sample",
                "1000000000",
                "--out",
                csv.to_str().unwrap(),
            ],
            "--sample must be between 1 and 100000",
        ),
    ] {
        let err = fails(&args);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// The Python package's key fixture: every key there is the one this side derives from
/// its task (a task list with a wrong key is refused), so the two sides agree.
const TASK_KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/tests/task-keys.jsonl");

#[test]
fn a_task_list_names_its_tasks_as_the_python_package_does() {
    let o = tilesched(&["workloads", "--tasks", TASK_KEYS]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let lines = task_lines(&stdout(&o));
    assert_eq!(lines.len(), 9);
    assert!(
        lines[0]
            .starts_with("conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1_bias_relu_fp16_out_fp16_nhwc ")
    );
    assert!(lines[0].ends_with(" 3"), "{}", lines[0]);
    // A matmul run takes the list's matmuls and batch matmuls, with their own types.
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("t.jsonl");
    let err = fails(&[
        "tune",
        "matmul",
        "--tasks",
        TASK_KEYS,
        "--dtype",
        "fp16",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(err.contains("a task list fixes each task's types"), "{err}");
}

#[test]
fn bad_task_lists_get_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(TASK_KEYS).unwrap();
    let first = good.lines().next().unwrap();
    let cases = [
        ("empty", String::new(), "holds no tasks"),
        ("json", "{not json\n".to_string(), "bad.jsonl:1:"),
        (
            "key",
            first.replace("_relu_fp16", "_fp16"),
            "does not name its task",
        ),
        (
            "twice",
            format!("{first}\n{first}\n"),
            "bad.jsonl:2: task conv2d_n1_c64",
        ),
        (
            "count",
            first.replace("\"count\": 3", "\"count\": 0"),
            "count must be at least 1",
        ),
        (
            "shape",
            first.replace("\"k\": 64", "\"k\": 0"),
            "bad.jsonl:1:",
        ),
    ];
    for (what, text, expect) in cases {
        let path = tmp.path().join("bad.jsonl");
        std::fs::write(&path, text).unwrap();
        let err = fails(&["workloads", "--tasks", path.to_str().unwrap()]);
        assert!(err.contains(expect), "{what}: {err}");
    }
    let err = fails(&["workloads", "--tasks", "/nonexistent/tasks.jsonl"]);
    assert!(err.contains("cannot read task list"), "{err}");
}
