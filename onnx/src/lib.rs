//! ONNX import: the tunable tasks of a real model, with their counts.
//!
//! The model is read as ONNX protobuf (the prost types `tract-onnx` generates), its input
//! shapes are fixed, and `tract-onnx` infers the shape of every intermediate tensor on
//! its inference graph (never the optimised one, which rewrites and fuses nodes). Node
//! types and attributes come from the protobuf itself; only the shapes come from tract,
//! looked up by tensor name. Weights are never needed: large float initializers are
//! handed to tract as typed inputs of their declared shape instead of as data, so a
//! 100 MB model's weights are not copied into tract's graph.
//!
//! External data (a tensor with `data_location = EXTERNAL`, its bytes at `offset`,
//! `length` in the file `location` names) is read here, never by tract, which is given no
//! directory. A location must be relative and resolve inside the model's directory, or
//! the model is refused, whether that tensor is read or not. Every external tensor but a
//! weight is read, bounds-checked, and inlined as raw data. Where its data is unavailable
//! (the file missing, unreadable or too short, or the model given as bytes), the graph
//! alone is imported: such an initializer or `Constant` node value becomes a typed input
//! of its declared shape, as a weight does, so convolutions and matmuls keep their
//! shapes. A shape computed from the missing values (a `Reshape` to a shape initializer)
//! cannot be inferred; the error then names the tensor, the node reading it and the data
//! file. In a subgraph, or another attribute, unavailable data is an error.
//!
//! Extracted, per the ONNX operator definitions (onnx.ai, `Operators.md`, opset ≤ 18):
//! - `Conv` of 2-D data (`X` N×C×H×W, `W` M×C/group×kH×kW, optional `B` of M): `strides`,
//!   `dilations`, `group`, `pads` as `[top, left, bottom, right]` (x1_begin, x2_begin,
//!   x1_end, x2_end), or `auto_pad`: `VALID` pads nothing, `SAME_UPPER`/`SAME_LOWER` pad
//!   so that the output is `ceil(in / stride)`, an odd total putting the extra row at
//!   the end (`SAME_UPPER`) or at the beginning (`SAME_LOWER`).
//! - `MatMul` (numpy `matmul` semantics): `A[.., M, K] · B[K, N]` is one `M'×N×K` matmul
//!   with `M'` the product of A's leading dimensions (a Linear on a sequence);
//!   `A[b.., M, K] · B[b.., K, N]` with equal batch dimensions is a batch matmul. Other
//!   broadcasts are not tuned.
//! - `Gemm`: `Y = alpha·A'·B' + beta·C`, `A'`/`B'` transposed by `transA`/`transB`. The
//!   task's operands are row-major `M×K` and `K×N`, so a transposed operand is one to
//!   store transposed for deployment (for a constant `B`, pre-transpose the weight once);
//!   `C` of shape `[N]` or `[1, N]` with `beta = 1` is the task's bias. `alpha ≠ 1`, or
//!   `beta ∉ {0, 1}` with a `C`, or another `C` shape, is not tuned.
//!
//! Epilogue fusion: a task without its own bias takes a directly following `Add` of a
//! constant (initializer or `Constant` node) that is a per-channel bias — `[K,1,1]` or
//! `[1,K,1,1]` after a conv (a `[K]` constant broadcasts along the width under ONNX's
//! numpy-style broadcasting, so it is not a channel bias), `[N]` or `[1,..,1,N]` after a
//! matmul — and then a directly following `Relu`, each only when it is the sole consumer
//! of the tensor before it (and that tensor is no graph output), since a fused tensor is
//! never written.
//!
//! Every other node is listed by type with its count in [`OnnxModel::not_tuned`], never
//! dropped silently. Tasks are f32 and NCHW, ONNX's layout; the caller applies other
//! element types and layouts.

mod external;

use external::{
    ExternalFiles, Unavailable, blame_missing, lift_constants, resolve_external, restore_constants,
};
use schedule::Workload;
use schedule::task::{Conv2d, Epilogue, Operator, Task, TaskError};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::str::FromStr;
use thiserror::Error;
use tract_onnx::pb::{
    self, attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto::dimension,
    type_proto,
};
use tract_onnx::prelude::{InferenceModelExt, OutletId};
use tract_onnx::tract_hir::infer::InferenceModel;

/// Why a model could not be imported. Every message is one line.
#[derive(Debug, Error)]
pub enum OnnxError {
    #[error("cannot read ONNX model {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a regular file (a FIFO, device or directory): give the model file")]
    NotAFile { path: String },
    #[error(
        "{path} is {bytes} bytes, over ONNX's 2 GiB protobuf limit: a model that large keeps its weights as external data"
    )]
    TooLarge { path: String, bytes: u64 },
    #[error("{model} is not an ONNX model: {reason}")]
    Decode { model: String, reason: String },
    #[error("{model} has no graph")]
    NoGraph { model: String },
    #[error("bad --input '{spec}': {reason} (expected NAME=D1,D2,..., e.g. input=1,3,224,224)")]
    BadInputSpec { spec: String, reason: String },
    #[error("--input '{name}' is given twice")]
    DuplicateInput { name: String },
    #[error("the model has no input '{name}' (its inputs: {known})")]
    UnknownInput { name: String, known: String },
    #[error("--input {name} gives {given} dimensions but the model declares {declared}")]
    InputRank {
        name: String,
        given: usize,
        declared: usize,
    },
    #[error(
        "input '{name}' dimension {dim} is not fixed by the model ({what}): give its shape with --input {name}=D1,D2,..."
    )]
    UnknownDim {
        name: String,
        dim: usize,
        what: String,
    },
    #[error(
        "input '{name}' dimension {dim} is {value}, not a size tilesched takes (1 to 4294967295): give its shape with --input {name}=D1,D2,..."
    )]
    DimRange {
        name: String,
        dim: usize,
        value: i64,
    },
    #[error("input '{name}' is not a tensor with a known element type")]
    NotATensor { name: String },
    #[error("batch size must be at least 1")]
    ZeroBatch,
    #[error("malformed model: {0}")]
    Malformed(String),
    #[error("tract cannot read the model: {0}")]
    Tract(String),
    #[error(
        "external data '{location}' of tensor '{tensor}' {reason}: it must be a relative path inside the model's directory"
    )]
    ExternalPath {
        tensor: String,
        location: String,
        reason: &'static str,
    },
    /// A shape (or the whole graph) needed a tensor whose external data is unavailable.
    #[error("{needed} without '{tensor}' ({reader}), whose external data {file} {why}")]
    ExternalMissing {
        needed: String,
        tensor: String,
        reader: String,
        file: String,
        why: String,
    },
    #[error("{place} needs tensor '{tensor}', whose external data {file} {why}")]
    ExternalNeeded {
        place: String,
        tensor: String,
        file: String,
        why: String,
    },
    #[error("cannot infer the shape of '{tensor}' ({role} of {op} node '{node}'): {reason}")]
    Shape {
        node: String,
        op: String,
        tensor: String,
        role: &'static str,
        reason: String,
    },
    #[error("{op} node '{node}': {reason}")]
    Node {
        node: String,
        op: String,
        reason: String,
    },
    #[error("{op} node '{node}': {source}")]
    Task {
        node: String,
        op: String,
        source: TaskError,
    },
}

/// A `--input NAME=D1,D2,...`: the shape an input of the model takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputShape {
    pub name: String,
    pub shape: Vec<u32>,
}

impl FromStr for InputShape {
    type Err = OnnxError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        parse_input(spec)
    }
}

impl fmt::Display for InputShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(u32::to_string).collect();
        write!(f, "{}={}", self.name, dims.join(","))
    }
}

/// Parses `NAME=D1,D2,...` (the name is everything before the last `=`, since ONNX
/// names may contain any character; every dimension a positive integer).
pub fn parse_input(spec: &str) -> Result<InputShape, OnnxError> {
    let bad = |reason: String| OnnxError::BadInputSpec {
        spec: spec.to_string(),
        reason,
    };
    let (name, dims) = spec
        .rsplit_once('=')
        .ok_or_else(|| bad("no '='".to_string()))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(bad("the name is empty".to_string()));
    }
    let shape = dims
        .split(',')
        .map(|d| match d.trim().parse::<u32>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(bad(format!("'{}' is not a positive integer", d.trim()))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(InputShape {
        name: name.to_string(),
        shape,
    })
}

/// The tasks of a model and what it could not tune.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnnxModel {
    /// Tasks merged by equality with their counts, in order of first appearance.
    pub workloads: Vec<Workload>,
    /// Op type and count of every node that is not part of a task, by count
    /// (descending) then name.
    pub not_tuned: Vec<(String, u32)>,
    /// The shape each graph input took (from `--input`, the batch or the model).
    pub inputs: Vec<InputShape>,
}

impl OnnxModel {
    /// `not tuned: 53 BatchNormalization, 49 Relu, ...`, or None when every node is in a
    /// task.
    pub fn not_tuned_line(&self) -> Option<String> {
        if self.not_tuned.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .not_tuned
            .iter()
            .map(|(op, n)| format!("{n} {op}"))
            .collect();
        Some(format!("not tuned: {}", parts.join(", ")))
    }
}

/// Imports the model at `path`. `inputs` fix input shapes by name; an input not named
/// keeps its declared shape, a symbolic first dimension taking `batch`. External data is
/// looked for beside the model file.
pub fn import(path: &Path, inputs: &[InputShape], batch: u32) -> Result<OnnxModel, OnnxError> {
    let label = path.display().to_string();
    let bytes = read_model(path, &label)?;
    // External data is resolved beside the model file.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let proto = decode(&bytes, &label)?;
    drop(bytes);
    import_proto(proto, Some(dir), &label, inputs, batch)
}

/// The largest model file read: protobuf cannot encode a message over 2 GiB.
const MAX_MODEL_BYTES: u64 = 2 << 30;

/// A model file's bytes: a regular file only (a FIFO would block, a device never end),
/// of at most [`MAX_MODEL_BYTES`], however it grows while being read.
fn read_model(path: &Path, label: &str) -> Result<Vec<u8>, OnnxError> {
    use std::io::Read;
    let read_error = |source| OnnxError::Read {
        path: label.to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_error)?;
    if !meta.is_file() {
        return Err(OnnxError::NotAFile {
            path: label.to_string(),
        });
    }
    let too_large = |bytes| OnnxError::TooLarge {
        path: label.to_string(),
        bytes,
    };
    if meta.len() > MAX_MODEL_BYTES {
        return Err(too_large(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MODEL_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_MODEL_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Imports a model from its protobuf bytes (see [`import`]). External data has no
/// directory to be found in: the model imports as with its data file missing.
pub fn import_bytes(
    bytes: &[u8],
    inputs: &[InputShape],
    batch: u32,
) -> Result<OnnxModel, OnnxError> {
    let label = "the model";
    import_proto(decode(bytes, label)?, None, label, inputs, batch)
}

fn decode(bytes: &[u8], label: &str) -> Result<pb::ModelProto, OnnxError> {
    <pb::ModelProto as prost::Message>::decode(bytes).map_err(|e| OnnxError::Decode {
        model: label.to_string(),
        reason: one_line(&e.to_string()),
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Float initializers with more elements than this reach tract as typed inputs, not
/// data: weights only need a shape. Small ones stay constants, as they may feed shape
/// computations (`Resize` scales).
const WEIGHT_ELEMENTS: i64 = 64;

fn is_float(data_type: i32) -> bool {
    [
        DataType::Float,
        DataType::Float16,
        DataType::Double,
        DataType::Bfloat16,
    ]
    .iter()
    .any(|&t| t as i32 == data_type)
}

/// A float initializer over [`WEIGHT_ELEMENTS`]: a typed input for tract, never read.
fn is_weight(t: &pb::TensorProto) -> bool {
    is_float(t.data_type)
        && t.dims
            .iter()
            .try_fold(1i64, |acc, &d| acc.checked_mul(d))
            .is_none_or(|n| n > WEIGHT_ELEMENTS)
}

fn valid_type(data_type: i32) -> bool {
    data_type != DataType::Undefined as i32 && DataType::from_i32(data_type).is_some()
}

fn tensor_type(dims: &[u64], elem_type: i32) -> pb::TypeProto {
    pb::TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type,
            shape: Some(pb::TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| pb::tensor_shape_proto::Dimension {
                        value: Some(dimension::Value::DimValue(d as i64)),
                        ..Default::default()
                    })
                    .collect(),
            }),
        })),
        ..Default::default()
    }
}

fn import_proto(
    mut model: pb::ModelProto,
    dir: Option<&Path>,
    label: &str,
    given: &[InputShape],
    batch: u32,
) -> Result<OnnxModel, OnnxError> {
    if batch == 0 {
        return Err(OnnxError::ZeroBatch);
    }
    let graph = model.graph.as_mut().ok_or_else(|| OnnxError::NoGraph {
        model: label.to_string(),
    })?;
    let initializers: HashSet<String> = graph.initializer.iter().map(|t| t.name.clone()).collect();
    let inputs = fix_inputs(graph, &initializers, given, batch)?;
    let missing = prepare_for_tract(graph, &mut ExternalFiles::new(dir))?;
    let lifted = lift_constants(graph, &missing);
    let shapes = Shapes::infer(&model);
    let graph = model.graph.as_mut().expect("checked above");
    restore_constants(graph, lifted);
    let graph: &pb::GraphProto = graph;
    let (workloads, not_tuned) = shapes
        .and_then(|shapes| Graph::new(graph, &shapes, &inputs).extract())
        .map_err(|e| blame_missing(e, graph, &missing))?;
    Ok(OnnxModel {
        workloads,
        not_tuned,
        inputs,
    })
}

/// Resolves every graph input's shape and writes it into the graph.
fn fix_inputs(
    graph: &mut pb::GraphProto,
    initializers: &HashSet<String>,
    given: &[InputShape],
    batch: u32,
) -> Result<Vec<InputShape>, OnnxError> {
    let names: Vec<String> = graph
        .input
        .iter()
        .filter(|i| !initializers.contains(&i.name))
        .map(|i| i.name.clone())
        .collect();
    let mut seen = HashSet::new();
    for g in given {
        if !seen.insert(&g.name) {
            return Err(OnnxError::DuplicateInput {
                name: g.name.clone(),
            });
        }
        if !names.contains(&g.name) {
            return Err(OnnxError::UnknownInput {
                name: g.name.clone(),
                known: if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                },
            });
        }
    }
    let mut resolved = Vec::new();
    for input in graph
        .input
        .iter_mut()
        .filter(|i| !initializers.contains(&i.name))
    {
        let not_tensor = || OnnxError::NotATensor {
            name: input.name.clone(),
        };
        let Some(pb::TypeProto {
            value: Some(type_proto::Value::TensorType(tensor)),
            ..
        }) = &input.r#type
        else {
            return Err(not_tensor());
        };
        if !valid_type(tensor.elem_type) {
            return Err(not_tensor());
        }
        let declared = tensor.shape.as_ref().map(|s| &s.dim);
        let shape: Vec<u32> = if let Some(g) = given.iter().find(|g| g.name == input.name) {
            if let Some(dims) = declared
                && dims.len() != g.shape.len()
            {
                return Err(OnnxError::InputRank {
                    name: input.name.clone(),
                    given: g.shape.len(),
                    declared: dims.len(),
                });
            }
            g.shape.clone()
        } else {
            let Some(dims) = declared else {
                return Err(OnnxError::UnknownDim {
                    name: input.name.clone(),
                    dim: 0,
                    what: "it declares no shape".to_string(),
                });
            };
            dims.iter()
                .enumerate()
                .map(|(i, d)| match &d.value {
                    Some(dimension::Value::DimValue(v)) if *v > 0 && *v <= i64::from(u32::MAX) => {
                        Ok(*v as u32)
                    }
                    // A fixed size out of range is the model's, not to be replaced.
                    Some(dimension::Value::DimValue(v)) => Err(OnnxError::DimRange {
                        name: input.name.clone(),
                        dim: i,
                        value: *v,
                    }),
                    // Only a symbolic (or unnamed) batch takes --batch.
                    _ if i == 0 => Ok(batch),
                    other => Err(OnnxError::UnknownDim {
                        name: input.name.clone(),
                        dim: i,
                        what: match other {
                            Some(dimension::Value::DimParam(p)) => format!("'{p}'"),
                            Some(dimension::Value::DimValue(v)) => format!("{v}"),
                            None => "unknown".to_string(),
                        },
                    }),
                })
                .collect::<Result<_, _>>()?
        };
        let dims: Vec<u64> = shape.iter().map(|&d| u64::from(d)).collect();
        let elem_type = tensor.elem_type;
        input.r#type = Some(tensor_type(&dims, elem_type));
        resolved.push(InputShape {
            name: input.name.clone(),
            shape,
        });
    }
    Ok(resolved)
}

/// Operators with a sliding window (`strides`, `dilations`, `pads`, `kernel_shape`).
const WINDOWED: [&str; 7] = [
    "Conv",
    "ConvTranspose",
    "ConvInteger",
    "QLinearConv",
    "MaxPool",
    "AveragePool",
    "LpPool",
];

/// Turns weights into typed inputs, drops declared intermediate shapes (they may name
/// the symbolic batch that the inputs no longer have) and checks what tract would
/// otherwise unwrap. Inlines the external data of every other tensor where it can be
/// read ([`resolve_external`]) and returns those whose data is unavailable: an
/// initializer among them becomes a typed input like a weight, a `Constant` node is left
/// to [`lift_constants`].
fn prepare_for_tract(
    graph: &mut pb::GraphProto,
    files: &mut ExternalFiles,
) -> Result<Vec<Unavailable>, OnnxError> {
    for t in &graph.initializer {
        if !valid_type(t.data_type) {
            return Err(OnnxError::Malformed(format!(
                "initializer '{}' has element type {}, which ONNX does not define",
                t.name, t.data_type
            )));
        }
        if t.dims.iter().any(|&d| d < 0) {
            return Err(OnnxError::Malformed(format!(
                "initializer '{}' has a negative dimension {:?}",
                t.name, t.dims
            )));
        }
    }
    graph.value_info.clear();
    for node in &graph.node {
        for attr in &node.attribute {
            let bad = |what: &str| {
                Err(OnnxError::Malformed(format!(
                    "attribute '{}' of node '{}' {what}",
                    attr.name,
                    node_name(node)
                )))
            };
            match AttributeType::from_i32(attr.r#type) {
                None => {
                    return bad(&format!(
                        "has type {}, which ONNX does not define",
                        attr.r#type
                    ));
                }
                Some(AttributeType::Tensor) if attr.t.is_none() => return bad("holds no tensor"),
                Some(AttributeType::Graph) if attr.g.is_none() => return bad("holds no graph"),
                _ => {}
            }
            // Window attributes tract divides by or allocates from (a zero stride once
            // made it divide by zero), on the windowed operators (an old `Pad`'s pads may
            // be negative: they crop).
            let windowed = WINDOWED.contains(&node.op_type.as_str());
            let least = match attr.name.as_str() {
                "strides" | "dilations" | "kernel_shape" if windowed => Some(1),
                "pads" if windowed => Some(0),
                _ => None,
            };
            if let Some(least) = least
                && let Some(v) = attr.ints.iter().find(|&&v| v < least)
            {
                return bad(&format!("is {v}; each value must be at least {least}"));
            }
            if windowed && attr.name == "group" && attr.i < 1 {
                return bad(&format!("is {}; it must be at least 1", attr.i));
            }
            for t in attr.t.iter().chain(&attr.tensors) {
                if !valid_type(t.data_type) {
                    return Err(OnnxError::Malformed(format!(
                        "attribute '{}' of node '{}' holds a tensor of element type {}, which ONNX does not define",
                        attr.name,
                        node_name(node),
                        t.data_type
                    )));
                }
            }
        }
    }
    // After the checks above: external data is read only from a well-formed graph.
    let mut missing = Vec::new();
    resolve_external(graph, files, None, &mut missing)?;
    let weights: Vec<pb::TensorProto> = {
        let (weights, kept) = std::mem::take(&mut graph.initializer)
            .into_iter()
            .partition(|t: &pb::TensorProto| {
                is_weight(t) || missing.iter().any(|m| m.is_initializer(&t.name))
            });
        graph.initializer = kept;
        weights
    };
    for w in weights {
        let dims: Vec<u64> = w.dims.iter().map(|&d| d as u64).collect();
        let r#type = Some(tensor_type(&dims, w.data_type));
        match graph.input.iter_mut().find(|i| i.name == w.name) {
            Some(input) => input.r#type = r#type,
            None => graph.input.push(pb::ValueInfoProto {
                name: w.name.clone(),
                r#type,
                ..Default::default()
            }),
        }
    }
    let mut produced: HashSet<&str> = graph.input.iter().map(|i| i.name.as_str()).collect();
    produced.extend(graph.initializer.iter().map(|t| t.name.as_str()));
    for node in &graph.node {
        produced.extend(node.output.iter().map(String::as_str));
    }
    for node in &graph.node {
        if let Some(unknown) = node
            .input
            .iter()
            .find(|i| !i.is_empty() && !produced.contains(i.as_str()))
        {
            return Err(OnnxError::Malformed(format!(
                "node '{}' ({}) reads '{unknown}', which no node, input or initializer produces",
                node_name(node),
                node.op_type
            )));
        }
    }
    if let Some(out) = graph
        .output
        .iter()
        .find(|o| !produced.contains(o.name.as_str()))
    {
        return Err(OnnxError::Malformed(format!(
            "graph output '{}' is produced by nothing",
            out.name
        )));
    }
    Ok(missing)
}

fn node_name(node: &pb::NodeProto) -> String {
    if !node.name.is_empty() {
        node.name.clone()
    } else {
        node.output.first().cloned().unwrap_or_default()
    }
}

/// Shapes of the graph's tensors as tract infers them.
struct Shapes {
    model: InferenceModel,
    outlets: HashMap<String, OutletId>,
    /// The first error of the analysis: it explains any shape left unknown.
    error: Option<String>,
}

impl Shapes {
    fn infer(proto: &pb::ModelProto) -> Result<Shapes, OnnxError> {
        // tract unwraps on a few malformed inputs that the checks above may not cover: a
        // malformed model must be an error, never a crash of the caller, and the panic's
        // own text (and Rust's backtrace note) must not reach the user, so the panic
        // hook is silenced while tract runs (an import runs before any other thread).
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let parsed = catch_unwind(AssertUnwindSafe(|| {
            // No directory: every external tensor was inlined or taken out of the graph
            // (`prepare_for_tract`), so tract must never open a file itself.
            tract_onnx::onnx().parse(proto, None).map(|parsed| {
                let mut model = parsed.model;
                let error = model.analyse(true).err().map(|e| format!("{e:#}"));
                (model, parsed.outlets_by_name, error)
            })
        }));
        std::panic::set_hook(hook);
        match parsed {
            Ok(Ok((model, outlets, error))) => Ok(Shapes {
                model,
                outlets,
                error: error.map(|e| one_line(&e)),
            }),
            Ok(Err(e)) => Err(OnnxError::Tract(one_line(&format!("{e:#}")))),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(OnnxError::Tract(format!(
                    "it failed on the model: {}",
                    one_line(&what)
                )))
            }
        }
    }

    /// The concrete shape of tensor `name`, or why it is unknown.
    fn get(&self, name: &str) -> Result<Vec<u64>, String> {
        let outlet = self
            .outlets
            .get(name)
            .ok_or_else(|| "no such tensor".to_string())?;
        let fact = self
            .model
            .outlet_fact(*outlet)
            .map_err(|e| one_line(&format!("{e:#}")))?;
        match fact.shape.as_concrete_finite() {
            Ok(Some(dims)) => Ok(dims.into_iter().map(|d| d as u64).collect()),
            _ => Err(self
                .error
                .clone()
                .unwrap_or_else(|| format!("tract inferred only {:?}", fact.shape))),
        }
    }
}

/// Op types with their node counts.
type OpCounts = Vec<(String, u32)>;

/// A node's use of a tensor: a node index, or the graph's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Node(usize),
    Output,
}

/// What extraction of one node found.
enum Found {
    Task(Task, Vec<usize>),
    NotTuned,
}

struct Graph<'a> {
    graph: &'a pb::GraphProto,
    shapes: &'a Shapes,
    /// Dimensions of every constant: initializers and `Constant` node outputs.
    constants: HashMap<&'a str, Vec<i64>>,
    uses: HashMap<&'a str, Vec<Use>>,
    /// The node that produces each tensor.
    producers: HashMap<&'a str, usize>,
}

fn standard(node: &pb::NodeProto) -> bool {
    node.domain.is_empty() || node.domain == "ai.onnx"
}

fn attr<'n>(node: &'n pb::NodeProto, name: &str) -> Option<&'n pb::AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

impl<'a> Graph<'a> {
    fn new(graph: &'a pb::GraphProto, shapes: &'a Shapes, model_inputs: &[InputShape]) -> Self {
        let mut constants: HashMap<&str, Vec<i64>> = graph
            .initializer
            .iter()
            .map(|t| (t.name.as_str(), t.dims.clone()))
            .collect();
        // Weights handed to tract as inputs are constants all the same: every graph input
        // that is not a model input came from an initializer (see `prepare_for_tract`).
        for input in graph
            .input
            .iter()
            .filter(|i| !model_inputs.iter().any(|m| m.name == i.name))
        {
            if let Some(type_proto::Value::TensorType(t)) =
                input.r#type.as_ref().and_then(|t| t.value.as_ref())
            {
                let dims = t
                    .shape
                    .iter()
                    .flat_map(|s| &s.dim)
                    .map(|d| match d.value {
                        Some(dimension::Value::DimValue(v)) => v,
                        _ => -1,
                    })
                    .collect();
                constants.insert(input.name.as_str(), dims);
            }
        }
        for node in graph.node.iter().filter(|n| standard(n)) {
            if node.op_type != "Constant" {
                continue;
            }
            let dims = if let Some(t) = attr(node, "value").and_then(|a| a.t.as_ref()) {
                Some(t.dims.clone())
            } else if attr(node, "value_float").is_some() || attr(node, "value_int").is_some() {
                Some(vec![])
            } else if let Some(a) = attr(node, "value_floats") {
                Some(vec![a.floats.len() as i64])
            } else {
                attr(node, "value_ints").map(|a| vec![a.ints.len() as i64])
            };
            if let (Some(dims), Some(out)) = (dims, node.output.first()) {
                constants.insert(out.as_str(), dims);
            }
        }
        let mut uses: HashMap<&str, Vec<Use>> = HashMap::new();
        for (i, node) in graph.node.iter().enumerate() {
            for input in node.input.iter().filter(|s| !s.is_empty()) {
                uses.entry(input.as_str()).or_default().push(Use::Node(i));
            }
        }
        for out in &graph.output {
            uses.entry(out.name.as_str()).or_default().push(Use::Output);
        }
        let producers = graph
            .node
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
            .collect();
        Graph {
            graph,
            shapes,
            constants,
            uses,
            producers,
        }
    }

    fn extract(&self) -> Result<(Vec<Workload>, OpCounts), OnnxError> {
        let nodes = &self.graph.node;
        let mut in_task = vec![false; nodes.len()];
        let mut workloads: Vec<Workload> = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            if in_task[i] || !standard(node) {
                continue;
            }
            let found = match node.op_type.as_str() {
                "Conv" => self.conv(node)?,
                "MatMul" => self.matmul(node)?,
                "Gemm" => self.gemm(node)?,
                _ => continue,
            };
            if let Found::Task(task, mut fused) = found {
                fused.push(i);
                fused.extend(self.own_constants(&fused));
                for f in fused {
                    in_task[f] = true;
                }
                match workloads.iter_mut().find(|w| w.task == task) {
                    Some(w) => w.count += 1,
                    None => workloads.push(Workload { task, count: 1 }),
                }
            }
        }
        let mut counts: OpCounts = Vec::new();
        for (node, _) in nodes.iter().zip(&in_task).filter(|(_, t)| !**t) {
            let op = if standard(node) {
                node.op_type.clone()
            } else {
                format!("{}.{}", node.domain, node.op_type)
            };
            match counts.iter_mut().find(|(o, _)| *o == op) {
                Some((_, n)) => *n += 1,
                None => counts.push((op, 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok((workloads, counts))
    }

    /// The `Constant` nodes that feed only `nodes` (a weight or bias given as a node
    /// rather than an initializer): they are part of the task.
    fn own_constants(&self, nodes: &[usize]) -> Vec<usize> {
        let mut found = Vec::new();
        for &i in nodes {
            for input in &self.graph.node[i].input {
                if let Some(&p) = self.producers.get(input.as_str())
                    && let Some(producer) = self.graph.node.get(p)
                    && standard(producer)
                    && producer.op_type == "Constant"
                    && !found.contains(&p)
                    && self.uses.get(input.as_str()).is_some_and(|uses| {
                        uses.iter()
                            .all(|u| matches!(u, Use::Node(c) if nodes.contains(c)))
                    })
                {
                    found.push(p);
                }
            }
        }
        found
    }

    fn node_error(&self, node: &pb::NodeProto, reason: impl Into<String>) -> OnnxError {
        OnnxError::Node {
            node: node_name(node),
            op: node.op_type.clone(),
            reason: reason.into(),
        }
    }

    /// Input `slot` of `node` by name, or a malformed-node error.
    fn input<'n>(&self, node: &'n pb::NodeProto, slot: usize) -> Result<&'n str, OnnxError> {
        node.input
            .get(slot)
            .filter(|s| !s.is_empty())
            .map(String::as_str)
            .ok_or_else(|| self.node_error(node, format!("input {slot} is missing")))
    }

    fn optional_input<'n>(&self, node: &'n pb::NodeProto, slot: usize) -> Option<&'n str> {
        node.input
            .get(slot)
            .filter(|s| !s.is_empty())
            .map(String::as_str)
    }

    fn shape(
        &self,
        node: &pb::NodeProto,
        tensor: &str,
        role: &'static str,
    ) -> Result<Vec<u64>, OnnxError> {
        self.shapes.get(tensor).map_err(|reason| {
            // Name where the tensor comes from: usually an op tract does not know.
            let from = match self.producers.get(tensor).map(|&p| &self.graph.node[p]) {
                Some(p) if standard(p) => format!(" (from {} node '{}')", p.op_type, node_name(p)),
                Some(p) => format!(" (from {}.{} node '{}')", p.domain, p.op_type, node_name(p)),
                None => String::new(),
            };
            OnnxError::Shape {
                node: node_name(node),
                op: node.op_type.clone(),
                tensor: tensor.to_string(),
                role,
                reason: reason + &from,
            }
        })
    }

    fn task(&self, node: &pb::NodeProto, op: Operator, ep: Epilogue) -> Result<Task, OnnxError> {
        Task::new(op, ep).map_err(|source| OnnxError::Task {
            node: node_name(node),
            op: node.op_type.clone(),
            source,
        })
    }

    fn dim(&self, node: &pb::NodeProto, what: &str, v: u64) -> Result<u32, OnnxError> {
        u32::try_from(v).map_err(|_| self.node_error(node, format!("{what} {v} exceeds 32 bits")))
    }

    /// The node that alone consumes `tensor` (the tensor being no graph output).
    fn sole_consumer(&self, tensor: &str) -> Option<(usize, &'a pb::NodeProto)> {
        match self.uses.get(tensor).map(Vec::as_slice) {
            Some([Use::Node(i)]) => self
                .graph
                .node
                .get(*i)
                .filter(|n| standard(n))
                .map(|n| (*i, n)),
            _ => None,
        }
    }

    /// The fused bias `Add` and `Relu` after `out`: `bias_dims` says which constant
    /// shapes are a bias. Returns the epilogue and the fused nodes.
    fn epilogue(
        &self,
        out: &str,
        has_bias: bool,
        bias_dims: impl Fn(&[i64]) -> bool,
    ) -> (Epilogue, Vec<usize>) {
        let mut ep = Epilogue {
            bias: has_bias,
            relu: false,
        };
        let mut fused = Vec::new();
        let mut tail = out;
        if !has_bias
            && let Some((i, add)) = self.sole_consumer(tail)
            && add.op_type == "Add"
            && add.input.len() == 2
            && let Some(y) = add.output.first()
        {
            let other = if add.input[0] == tail {
                &add.input[1]
            } else {
                &add.input[0]
            };
            if other != tail
                && let Some(dims) = self.constants.get(other.as_str())
                && bias_dims(dims)
            {
                ep.bias = true;
                fused.push(i);
                tail = y;
            }
        }
        if let Some((i, relu)) = self.sole_consumer(tail)
            && relu.op_type == "Relu"
        {
            ep.relu = true;
            fused.push(i);
        }
        (ep, fused)
    }

    fn ints(&self, node: &pb::NodeProto, name: &str, default: &[i64]) -> Vec<i64> {
        attr(node, name).map_or_else(|| default.to_vec(), |a| a.ints.clone())
    }

    fn conv(&self, node: &pb::NodeProto) -> Result<Found, OnnxError> {
        let x = self.input(node, 0)?;
        let w = self.input(node, 1)?;
        let wshape = self.shape(node, w, "weight")?;
        if wshape.len() != 4 {
            // 1-D and 3-D convolutions: no such task.
            return Ok(Found::NotTuned);
        }
        let xshape = self.shape(node, x, "data")?;
        let [n, c, h, wd] = xshape[..] else {
            return Err(self.node_error(
                node,
                format!("data {xshape:?} is not 4-D like the weight {wshape:?}"),
            ));
        };
        let [k, cg, r, s] = wshape[..] else {
            unreachable!("checked 4-D")
        };
        let bad = |reason: String| Err(self.node_error(node, reason));
        let group = attr(node, "group").map_or(1, |a| a.i);
        if group < 1 {
            return bad(format!("group {group} is not positive"));
        }
        if cg.checked_mul(group as u64) != Some(c) {
            return bad(format!(
                "data has {c} channels but the weight {wshape:?} with group {group} takes {}",
                cg.saturating_mul(group as u64)
            ));
        }
        if let Some(ks) = attr(node, "kernel_shape")
            && ks.ints.iter().map(|&v| v as u64).ne([r, s])
        {
            return bad(format!(
                "kernel_shape {:?} disagrees with the weight {wshape:?}",
                ks.ints
            ));
        }
        let strides = self.ints(node, "strides", &[1, 1]);
        let dilations = self.ints(node, "dilations", &[1, 1]);
        let [sh, sw] = strides[..] else {
            return bad(format!("strides {strides:?} are not 2"));
        };
        let [dh, dw] = dilations[..] else {
            return bad(format!("dilations {dilations:?} are not 2"));
        };
        if sh < 1 || sw < 1 || dh < 1 || dw < 1 {
            return bad(format!(
                "strides {strides:?} and dilations {dilations:?} must be positive"
            ));
        }
        let auto_pad = attr(node, "auto_pad")
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
            .unwrap_or_default();
        // [top, left, bottom, right]
        let pads: [i64; 4] = match auto_pad.as_str() {
            "" | "NOTSET" => {
                let pads = self.ints(node, "pads", &[0, 0, 0, 0]);
                match pads[..] {
                    [t, l, b, r] if pads.iter().all(|&p| p >= 0) => [t, l, b, r],
                    _ => return bad(format!("pads {pads:?} are not 4 non-negative values")),
                }
            }
            "VALID" => [0; 4],
            "SAME_UPPER" | "SAME_LOWER" => {
                let total = |input: u64, stride: i64, dil: i64, kernel: u64| {
                    let input = input as i64;
                    let out = (input + stride - 1) / stride;
                    ((out - 1) * stride + (kernel as i64 - 1) * dil + 1 - input).max(0)
                };
                let (th, tw) = (total(h, sh, dh, r), total(wd, sw, dw, s));
                if auto_pad == "SAME_UPPER" {
                    [th / 2, tw / 2, th - th / 2, tw - tw / 2]
                } else {
                    [th - th / 2, tw - tw / 2, th / 2, tw / 2]
                }
            }
            other => return bad(format!("auto_pad '{other}' is not an ONNX value")),
        };
        let u = |what: &str, v: i64| self.dim(node, what, v as u64);
        let conv = Conv2d {
            n: self.dim(node, "batch", n)?,
            c: self.dim(node, "channels", c)?,
            h: self.dim(node, "height", h)?,
            w: self.dim(node, "width", wd)?,
            k: self.dim(node, "output channels", k)?,
            r: self.dim(node, "kernel height", r)?,
            s: self.dim(node, "kernel width", s)?,
            stride_h: u("stride", sh)?,
            stride_w: u("stride", sw)?,
            pad_h: u("pad", pads[0])?,
            pad_w: u("pad", pads[1])?,
            dilation_h: u("dilation", dh)?,
            dilation_w: u("dilation", dw)?,
            pad_bottom: Some(u("pad", pads[2])?),
            pad_right: Some(u("pad", pads[3])?),
            groups: u("group", group)?,
        };
        let out = node
            .output
            .first()
            .ok_or_else(|| self.node_error(node, "it has no output"))?;
        let kk = k as i64;
        let (ep, fused) = self.epilogue(
            out,
            self.optional_input(node, 2).is_some(),
            |d| matches!(d, [kd, 1, 1] | [1, kd, 1, 1] if *kd == kk),
        );
        let task = self.task(node, Operator::Conv2d(conv), ep)?;
        Ok(Found::Task(task, fused))
    }

    /// A matmul's epilogue: a constant `[N]` or `[1,..,1,N]` of rank at most the output's.
    fn matmul_epilogue(
        &self,
        out: &str,
        has_bias: bool,
        n: u64,
        rank: usize,
    ) -> (Epilogue, Vec<usize>) {
        let n = n as i64;
        self.epilogue(out, has_bias, |d| {
            d.len() <= rank
                && d.split_last()
                    .is_some_and(|(&last, lead)| last == n && lead.iter().all(|&v| v == 1))
        })
    }

    fn matmul(&self, node: &pb::NodeProto) -> Result<Found, OnnxError> {
        let a = self.input(node, 0)?;
        let b = self.input(node, 1)?;
        let ashape = self.shape(node, a, "A")?;
        let bshape = self.shape(node, b, "B")?;
        if ashape.len() < 2 || bshape.len() < 2 {
            // Matrix-vector products: no such task.
            return Ok(Found::NotTuned);
        }
        let (a_batch, a_mk) = ashape.split_at(ashape.len() - 2);
        let (b_batch, b_kn) = bshape.split_at(bshape.len() - 2);
        let ([m, ka], [kb, n]) = (a_mk, b_kn) else {
            unreachable!("split at rank - 2")
        };
        if ka != kb {
            return Err(
                self.node_error(node, format!("A {ashape:?} and B {bshape:?} disagree on K"))
            );
        }
        let product = |dims: &[u64]| dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let op = if b_batch.is_empty() {
            // A Linear: the leading dimensions of A are rows of one matmul.
            let rows = product(a_batch)
                .and_then(|p| p.checked_mul(*m))
                .unwrap_or(u64::MAX);
            Operator::Matmul {
                m: self.dim(node, "M", rows)?,
                n: self.dim(node, "N", *n)?,
                k: self.dim(node, "K", *ka)?,
            }
        } else if a_batch == b_batch {
            let batch = product(a_batch).unwrap_or(u64::MAX);
            let op = Operator::BatchMatmul {
                b: self.dim(node, "batch", batch)?,
                m: self.dim(node, "M", *m)?,
                n: self.dim(node, "N", *n)?,
                k: self.dim(node, "K", *ka)?,
            };
            // A batch of one is a plain matmul (the same key as its --shape).
            if batch == 1 {
                Operator::Matmul {
                    m: self.dim(node, "M", *m)?,
                    n: self.dim(node, "N", *n)?,
                    k: self.dim(node, "K", *ka)?,
                }
            } else {
                op
            }
        } else {
            // Broadcast batch dimensions: the task's B is not shared across a batch.
            return Ok(Found::NotTuned);
        };
        let out = node
            .output
            .first()
            .ok_or_else(|| self.node_error(node, "it has no output"))?;
        let rank = ashape.len().max(bshape.len());
        let (ep, fused) = self.matmul_epilogue(out, false, *n, rank);
        Ok(Found::Task(self.task(node, op, ep)?, fused))
    }

    fn gemm(&self, node: &pb::NodeProto) -> Result<Found, OnnxError> {
        let a = self.input(node, 0)?;
        let b = self.input(node, 1)?;
        let ashape = self.shape(node, a, "A")?;
        let bshape = self.shape(node, b, "B")?;
        let (&[a0, a1], &[b0, b1]) = (&ashape[..], &bshape[..]) else {
            return Err(self.node_error(node, format!("A {ashape:?} and B {bshape:?} must be 2-D")));
        };
        let flag = |name: &str| attr(node, name).is_some_and(|a| a.i != 0);
        let (m, ka) = if flag("transA") { (a1, a0) } else { (a0, a1) };
        let (kb, n) = if flag("transB") { (b1, b0) } else { (b0, b1) };
        if ka != kb {
            return Err(self.node_error(
                node,
                format!("A {ashape:?} and B {bshape:?} disagree on K after transA/transB"),
            ));
        }
        let alpha = attr(node, "alpha").map_or(1.0, |a| a.f);
        let beta = attr(node, "beta").map_or(1.0, |a| a.f);
        if alpha != 1.0 {
            return Ok(Found::NotTuned);
        }
        let mut bias = false;
        if let Some(c) = self.optional_input(node, 2)
            && beta != 0.0
        {
            let cshape = self.shape(node, c, "C")?;
            let per_column = matches!(cshape[..], [cn] | [1, cn] if cn == n);
            if beta != 1.0 || !per_column {
                return Ok(Found::NotTuned);
            }
            bias = true;
        }
        let op = Operator::Matmul {
            m: self.dim(node, "M", m)?,
            n: self.dim(node, "N", n)?,
            k: self.dim(node, "K", ka)?,
        };
        let out = node
            .output
            .first()
            .ok_or_else(|| self.node_error(node, "it has no output"))?;
        let (ep, fused) = self.matmul_epilogue(out, bias, n, 2);
        Ok(Found::Task(self.task(node, op, ep)?, fused))
    }
}
