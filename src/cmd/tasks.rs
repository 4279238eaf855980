//! Resolving the tasks a command is about: one `--shape`, or a network's tasks of one
//! operator.

use anyhow::{Result, bail};
use schedule::{DType, Epilogue, Layout, OPERATORS, Task, Workload, network, parse_shape};

/// `--network NAME` or `--shape SPEC` (exactly one), with the shape's epilogue.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false, id = "tasks")]
pub struct TaskArgs {
    /// Tune every task of this operator in a network (resnet, resnet50, resnet18,
    /// mobilenet_v2, yolo, bert-base).
    #[arg(long)]
    pub network: Option<String>,
    /// A shape: N,C,H,W,K,R,S,stride,pad (or key=value) for conv2d, M,N,K for matmul,
    /// B,M,N,K for batch_matmul; repeat it for several tasks.
    #[arg(long)]
    pub shape: Vec<String>,
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
    let name = args
        .network
        .as_deref()
        .expect("clap requires one of the two");
    let tasks: Vec<Workload> = network(name, batch)?
        .into_iter()
        .filter(|w| {
            let t = w.task.op.name();
            t == op || (op == "matmul" && t == "batch_matmul")
        })
        .map(|w| {
            Ok(Workload {
                task: types.apply(w.task)?,
                ..w
            })
        })
        .collect::<Result<_>>()?;
    if tasks.is_empty() {
        bail!("network '{name}' has no {op} tasks");
    }
    Ok((tasks, format!("{op}-{name}")))
}
