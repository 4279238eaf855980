//! Resolving the tasks a command is about: one `--shape`, a network's tasks of one
//! operator, or those of an ONNX model.

use anyhow::{Result, bail};
use onnx::{InputShape, OnnxModel, import as import_onnx, parse_input};
use schedule::{DType, Epilogue, Layout, OPERATORS, Task, Workload, network, parse_shape};
use std::path::{Path, PathBuf};

/// `--network NAME`, `--shape SPEC` or `--onnx FILE` (exactly one: the group "tasks",
/// whose presence `resolve` checks), and `--input` for the model (outside the group, so
/// that it goes with `--onnx`).
#[derive(clap::Args, Debug)]
#[group(skip)]
pub struct TaskArgs {
    /// Tune every task of this operator in a network (resnet, resnet50, resnet18,
    /// mobilenet_v2, yolo, bert-base).
    #[arg(long, group = "tasks")]
    pub network: Option<String>,
    /// A shape: N,C,H,W,K,R,S,stride,pad (or key=value) for conv2d, M,N,K for matmul,
    /// B,M,N,K for batch_matmul; repeat it for several tasks.
    #[arg(long, group = "tasks")]
    pub shape: Vec<String>,
    /// The tasks of an ONNX model: every Conv, MatMul and Gemm (with a following bias
    /// add and Relu fused), counted; nodes it does not tune are listed.
    #[arg(long, value_name = "FILE", group = "tasks")]
    pub onnx: Option<PathBuf>,
    /// A task list: JSON lines of `{"key": ..., "task": {...}, "count": N}`, as the
    /// Python package's `tilesched.torch.tasks` writes for a PyTorch model; the tasks
    /// keep their own types and layout.
    #[arg(long = "tasks", id = "task_list", value_name = "FILE", group = "tasks")]
    pub task_list: Option<PathBuf>,
    /// Fix an ONNX input's shape, NAME=N,C,H,W (repeatable); inputs not named keep the
    /// model's shape, a symbolic batch taking --batch.
    #[arg(long = "input", value_name = "NAME=DIMS", value_parser = parse_input_arg)]
    pub inputs: Vec<InputShape>,
}

/// `--input NAME=DIMS`.
pub fn parse_input_arg(spec: &str) -> Result<InputShape, String> {
    parse_input(spec).map_err(|e| e.to_string())
}

/// The model's tasks (every operator), with the batch applied where it can be: a
/// `--batch` other than 1 that no input takes (every batch is fixed in the model) is an
/// error naming the `--input` to give instead, not silently ignored.
pub fn onnx_model(path: &Path, inputs: &[InputShape], batch: u32) -> Result<OnnxModel> {
    let model = import_onnx(path, inputs, batch)?;
    if batch != 1
        && inputs.is_empty()
        && !model.inputs.iter().any(|i| i.shape.first() == Some(&batch))
    {
        let hint = model
            .inputs
            .iter()
            .map(|i| {
                let mut dims: Vec<String> = i.shape.iter().map(u32::to_string).collect();
                if let Some(first) = dims.first_mut() {
                    *first = batch.to_string();
                }
                format!("--input {}={}", i.name, dims.join(","))
            })
            .collect::<Vec<_>>()
            .join(" ");
        bail!(
            "--batch {batch} does not apply to {}: its inputs have a fixed batch; give {hint}",
            path.display()
        );
    }
    Ok(model)
}

/// Element types and layout of the tasks (`--dtype`, `--out-dtype`, `--layout`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct TypeArgs {
    /// Input element type: f32, tf32 (f32 data, TF32 tensor-core math), fp16 or bf16;
    /// products accumulate in f32.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: DType,
    /// Output element type: f32 or the input type.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub out_dtype: DType,
    /// conv2d tensor layout: nchw (KCRS weights) or nhwc (KRSC weights); matmuls are
    /// row-major whatever this says.
    #[arg(long, default_value = "nchw", value_parser = parse_layout)]
    pub layout: Layout,
}

fn parse_dtype(name: &str) -> Result<DType, String> {
    DType::parse(name).ok_or_else(|| format!("unknown dtype '{name}' (f32, tf32, fp16, bf16)"))
}

fn parse_layout(name: &str) -> Result<Layout, String> {
    Layout::parse(name).ok_or_else(|| format!("unknown layout '{name}' (nchw, nhwc)"))
}

impl TypeArgs {
    /// `task` with these types.
    pub fn apply(&self, task: Task) -> Result<Task> {
        Ok(task.with_types(self.dtype, self.out_dtype, self.layout)?)
    }

    /// Every workload's task with these types, counts kept.
    pub fn apply_all(
        &self,
        workloads: impl IntoIterator<Item = Workload>,
    ) -> Result<Vec<Workload>> {
        workloads
            .into_iter()
            .map(|w| {
                Ok(Workload {
                    task: self.apply(w.task)?,
                    ..w
                })
            })
            .collect()
    }
}

/// Checks the operator name.
pub fn check_op(op: &str) -> Result<()> {
    if !OPERATORS.contains(&op) {
        bail!(
            "unknown operator '{op}' (expected {})",
            OPERATORS.join(", ")
        );
    }
    Ok(())
}

/// The tasks named by the arguments with their counts in the network (1 for a
/// shape; a shape given twice is one task); `name` is a short label for file names.
pub fn resolve(
    op: &str,
    args: &TaskArgs,
    batch: u32,
    epilogue: Epilogue,
    types: &TypeArgs,
) -> Result<(Vec<Workload>, String)> {
    check_op(op)?;
    if !args.inputs.is_empty() && args.onnx.is_none() {
        bail!("--input fixes an input of an --onnx model; give --onnx FILE");
    }
    if !args.shape.is_empty() {
        let mut tasks: Vec<Workload> = Vec::new();
        for shape in &args.shape {
            let task = types.apply(Task::new(parse_shape(op, shape)?, epilogue)?)?;
            if !tasks.iter().any(|w| w.task == task) {
                tasks.push(Workload { task, count: 1 });
            }
        }
        let name = match tasks.as_slice() {
            [one] => one.task.key(),
            _ => format!("{op}-shapes"),
        };
        return Ok((tasks, name));
    }
    if let Some(path) = &args.onnx {
        let model = onnx_model(path, &args.inputs, batch)?;
        let (mine, others): (Vec<Workload>, Vec<Workload>) = model
            .workloads
            .iter()
            .cloned()
            .partition(|w| of_op(&w.task, op));
        if let Some(line) = model.not_tuned_line() {
            eprintln!("{}: {line}", path.display());
        }
        if !others.is_empty() {
            eprintln!(
                "{}: also {} task(s) of other operators ({}), not part of this {op} run",
                path.display(),
                others.len(),
                others
                    .iter()
                    .map(|w| w.task.op.name())
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let tasks = types.apply_all(mine)?;
        if tasks.is_empty() {
            bail!("{} has no {op} tasks", path.display());
        }
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string());
        return Ok((tasks, format!("{op}-{stem}")));
    }
    if let Some(path) = &args.task_list {
        if (types.dtype, types.out_dtype, types.layout) != Default::default() {
            bail!(
                "{}: a task list fixes each task's types and layout; leave out --dtype, --out-dtype and --layout",
                path.display()
            );
        }
        let all = read_task_list(path)?;
        let total = all.len();
        let tasks: Vec<Workload> = all.into_iter().filter(|w| of_op(&w.task, op)).collect();
        if tasks.is_empty() {
            bail!("{} has no {op} tasks", path.display());
        }
        if tasks.len() < total {
            eprintln!(
                "{}: {} of its {total} task(s) are of other operators, not part of this {op} run",
                path.display(),
                total - tasks.len()
            );
        }
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tasks".to_string());
        return Ok((tasks, format!("{op}-{stem}")));
    }
    let Some(name) = args.network.as_deref() else {
        bail!("give the tasks: --network NAME, --shape SPEC, --onnx FILE or --tasks FILE");
    };
    let tasks = types.apply_all(
        network(name, batch)?
            .into_iter()
            .filter(|w| of_op(&w.task, op)),
    )?;
    if tasks.is_empty() {
        bail!("network '{name}' has no {op} tasks");
    }
    Ok((tasks, format!("{op}-{name}")))
}

/// One line of a task list.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskLine {
    /// The task's key, as the writer derived it: checked against ours, so that a list
    /// whose keys would not find their kernels is refused.
    key: String,
    task: Task,
    count: u32,
}

/// The workloads of a task list (JSON lines; blank lines skipped), each task validated
/// as a `--shape` would be; a task listed twice is refused.
pub fn read_task_list(path: &Path) -> Result<Vec<Workload>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read task list {}: {e}", path.display()))?;
    let mut workloads: Vec<Workload> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), i + 1);
        let parsed: TaskLine =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        let task = Task::new(parsed.task.op, parsed.task.epilogue)
            .and_then(|t| {
                t.with_types(parsed.task.dtype, parsed.task.out_dtype, parsed.task.layout)
            })
            .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        if task.key() != parsed.key {
            bail!(
                "{}: key {} does not name its task, {}",
                at(),
                parsed.key,
                task.key()
            );
        }
        if parsed.count == 0 {
            bail!("{}: count must be at least 1", at());
        }
        if workloads.iter().any(|w| w.task == task) {
            bail!("{}: task {} is listed twice", at(), task.key());
        }
        workloads.push(Workload {
            task,
            count: parsed.count,
        });
    }
    if workloads.is_empty() {
        bail!("task list {} holds no tasks", path.display());
    }
    Ok(workloads)
}

/// Whether `task` belongs to a run of operator `op` (`matmul` runs take batch matmuls).
fn of_op(task: &Task, op: &str) -> bool {
    let t = task.op.name();
    t == op || (op == "matmul" && t == "batch_matmul")
}

/// The most states `codegen` and `features` sample in one run: a bound on the work
/// (each state is generated, and for `codegen` written and compiled).
pub const MAX_SAMPLE: usize = 100_000;

/// Refuses a `--sample` count of 0 or over [`MAX_SAMPLE`], in one line.
pub fn check_sample(n: usize) -> Result<()> {
    if n == 0 || n > MAX_SAMPLE {
        bail!("--sample must be between 1 and {MAX_SAMPLE} (got {n})");
    }
    Ok(())
}
