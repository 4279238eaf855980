//! Tasks: a tensor operator with its shape, and the generic contraction it lowers to.
//!
//! Every operator this tool tunes is a tensor contraction with affine indexing:
//! `out[s] = epilogue( sum_r A[f(s, r)] * B[g(s, r)] )`, where each tensor dimension is
//! indexed by an affine expression of the spatial axes `s` and reduction axes `r`.
//! One tiling engine serves conv2d, matmul and batch matmul through this form; the
//! operator-specific code is only the constructors below.
//!
//! Axes of extent 1 (batch 1, a 1x1 kernel) are dropped when the contraction is built:
//! they change neither the memory layout nor the result, and keeping them would only add
//! degenerate splits to the search space.

use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// A malformed operator shape.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TaskError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error(
        "the convolution output is empty: the kernel spans {span} (size {kernel}, dilation {dilation}) but the padded input is only {padded} ({input} + {pad} + {end})"
    )]
    EmptyOutput {
        input: u32,
        pad: u32,
        end: u32,
        dilation: u32,
        kernel: u32,
        span: i64,
        padded: i64,
    },
    #[error(
        "tensor {tensor} has {elements} elements, over the 2^31 - 1 that 32-bit indexing allows"
    )]
    TooLarge { tensor: &'static str, elements: u64 },
    #[error("the {layout} layout applies to conv2d only ({op} is row-major)")]
    LayoutNotConv { layout: Layout, op: &'static str },
    #[error("the output type must be f32 or the input type {dtype}, not {out}")]
    OutputType { dtype: DType, out: DType },
    #[error("groups {groups} must divide both the input channels {c} and the output channels {k}")]
    Groups { groups: u32, c: u32, k: u32 },
}

/// Element type of a task's inputs. Products accumulate in f32 whatever the type; `Tf32`
/// is f32 data multiplied by tensor cores at TF32 precision (cuDNN's and cuBLAS's TF32
/// math mode), so its kernels may also be plain f32 ones.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    #[default]
    F32,
    Tf32,
    Fp16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 4] = [DType::F32, DType::Tf32, DType::Fp16, DType::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Tf32 => "tf32",
            DType::Fp16 => "fp16",
            DType::Bf16 => "bf16",
        }
    }

    /// Bytes of one element in memory (TF32 data is stored as f32).
    pub fn bytes(self) -> u32 {
        match self {
            DType::F32 | DType::Tf32 => 4,
            DType::Fp16 | DType::Bf16 => 2,
        }
    }

    /// The CUDA C type of an element in memory.
    pub fn c_type(self) -> &'static str {
        match self {
            DType::F32 | DType::Tf32 => "float",
            // Stored as raw bits: generated kernels convert with inline PTX and need
            // no header (NVRTC compiles them without any include path).
            DType::Fp16 | DType::Bf16 => "unsigned short",
        }
    }

    /// Whether the tensor-core sketch applies (every type but plain f32).
    pub fn tensor_cores(self) -> bool {
        self != DType::F32
    }

    /// Whether the CUDA-core sketch competes with the tensor-core one where both apply:
    /// f32 data (TF32 math allows full f32 math). Half data gets CUDA-core kernels only
    /// where tensor cores do not apply (no GEMM view: NCHW, depthwise).
    pub fn cuda_cores(self) -> bool {
        matches!(self, DType::F32 | DType::Tf32)
    }

    pub fn is_f32(&self) -> bool {
        *self == DType::F32
    }

    pub fn parse(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Memory layout of a conv2d's tensors: NCHW data with KCRS (OIHW) weights and NCHW
/// output, or NHWC data with KRSC weights and NHWC output, the layout tensor-core
/// implicit GEMM wants (the reduction's channel axis contiguous in both inputs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    #[default]
    Nchw,
    Nhwc,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        }
    }

    pub fn is_nchw(&self) -> bool {
        *self == Layout::Nchw
    }

    pub fn parse(name: &str) -> Option<Layout> {
        [Layout::Nchw, Layout::Nhwc]
            .into_iter()
            .find(|l| l.name() == name)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A 2-D convolution in NCHW layout with OIHW weights (cross-correlation, as cuDNN computes).
///
/// `pad_h`/`pad_w` pad the top and left; the bottom and right pads are the same unless
/// `pad_bottom`/`pad_right` say otherwise (ONNX's asymmetric `pads`, `auto_pad=SAME_*`).
/// They only decide the output size, since reads past the input are zeros anyway, so a
/// task keeps them only where they change it (see [`Conv2d::canonical`]).
///
/// `groups` splits the channels into independent convolutions: output channel `k` reads
/// input channels `g·C/G .. (g+1)·C/G` of its group `g = k / (K/G)`, and the weights are
/// `K × C/G × R × S`. Depthwise convolution is `groups = C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Conv2d {
    pub n: u32,
    pub c: u32,
    pub h: u32,
    pub w: u32,
    pub k: u32,
    pub r: u32,
    pub s: u32,
    pub stride_h: u32,
    pub stride_w: u32,
    pub pad_h: u32,
    pub pad_w: u32,
    pub dilation_h: u32,
    pub dilation_w: u32,
    /// Bottom padding when it differs from `pad_h` in effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_bottom: Option<u32>,
    /// Right padding when it differs from `pad_w` in effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_right: Option<u32>,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub groups: u32,
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

impl Conv2d {
    /// A plain convolution: symmetric padding, no dilation, one group.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n: u32,
        c: u32,
        h: u32,
        w: u32,
        k: u32,
        r: u32,
        s: u32,
        stride: u32,
        pad: u32,
    ) -> Self {
        Conv2d {
            n,
            c,
            h,
            w,
            k,
            r,
            s,
            stride_h: stride,
            stride_w: stride,
            pad_h: pad,
            pad_w: pad,
            dilation_h: 1,
            dilation_w: 1,
            pad_bottom: None,
            pad_right: None,
            groups: 1,
        }
    }

    /// Bottom and right padding.
    pub fn pad_end(&self) -> (u32, u32) {
        (
            self.pad_bottom.unwrap_or(self.pad_h),
            self.pad_right.unwrap_or(self.pad_w),
        )
    }

    /// Input and output channels of one group.
    pub fn group_channels(&self) -> (u32, u32) {
        let g = self.groups.max(1);
        (self.c / g, self.k / g)
    }

    /// Output height and width, or an error when the output would be empty.
    pub fn output_size(&self) -> Result<(u32, u32), TaskError> {
        let (bottom, right) = self.pad_end();
        let dim = |input: u32, pad: u32, end: u32, dilation: u32, kernel: u32, stride: u32| {
            let span = i64::from(dilation) * (i64::from(kernel) - 1) + 1;
            let padded = i64::from(input) + i64::from(pad) + i64::from(end);
            if padded < span {
                Err(TaskError::EmptyOutput {
                    input,
                    pad,
                    end,
                    dilation,
                    kernel,
                    span,
                    padded,
                })
            } else {
                Ok(((padded - span) / i64::from(stride).max(1) + 1) as u32)
            }
        };
        Ok((
            dim(
                self.h,
                self.pad_h,
                bottom,
                self.dilation_h,
                self.r,
                self.stride_h,
            )?,
            dim(
                self.w,
                self.pad_w,
                right,
                self.dilation_w,
                self.s,
                self.stride_w,
            )?,
        ))
    }

    /// The same convolution with end pads kept only where they change the output size:
    /// two convolutions that compute the same thing get the same key.
    pub fn canonical(self) -> Conv2d {
        let symmetric = Conv2d {
            pad_bottom: None,
            pad_right: None,
            ..self
        };
        let (Ok((p, q)), Ok((sp, sq))) = (self.output_size(), symmetric.output_size()) else {
            return self;
        };
        Conv2d {
            pad_bottom: self.pad_bottom.filter(|&b| b != self.pad_h && p != sp),
            pad_right: self.pad_right.filter(|&r| r != self.pad_w && q != sq),
            ..self
        }
    }
}

/// The operator and its shape: what a user asks to tune.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Operator {
    Conv2d(Conv2d),
    /// `C[M,N] = A[M,K] · B[K,N]`, row-major.
    Matmul {
        m: u32,
        n: u32,
        k: u32,
    },
    /// `C[b,M,N] = A[b,M,K] · B[b,K,N]`, row-major.
    BatchMatmul {
        b: u32,
        m: u32,
        n: u32,
        k: u32,
    },
}

impl Operator {
    /// The operator family name used on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Operator::Conv2d(_) => "conv2d",
            Operator::Matmul { .. } => "matmul",
            Operator::BatchMatmul { .. } => "batch_matmul",
        }
    }

    /// The same operator with its batch dimension set (conv2d N, batch matmul B; matmul
    /// has none and is returned unchanged).
    pub fn with_batch(self, batch: u32) -> Operator {
        match self {
            Operator::Conv2d(c) => Operator::Conv2d(Conv2d { n: batch, ..c }),
            Operator::BatchMatmul { m, n, k, .. } => Operator::BatchMatmul { b: batch, m, n, k },
            other => other,
        }
    }
}

/// Elementwise operations fused after the contraction, applied in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epilogue {
    /// Add a bias per output channel (conv2d K, matmul N).
    pub bias: bool,
    /// Clamp negatives to zero.
    pub relu: bool,
}

/// A tuning task: one operator shape with its epilogue, element types and layout. The
/// types and the layout are left out of the JSON at their defaults (f32, NCHW), so that
/// tasks logged before they existed keep their JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Task {
    #[serde(flatten)]
    pub op: Operator,
    #[serde(default)]
    pub epilogue: Epilogue,
    /// Element type of the inputs (and bias).
    #[serde(default, skip_serializing_if = "DType::is_f32")]
    pub dtype: DType,
    /// Element type of the output: f32, or the input type (the epilogue still runs in
    /// f32; the conversion is the last step).
    #[serde(default, skip_serializing_if = "DType::is_f32")]
    pub out_dtype: DType,
    /// conv2d only.
    #[serde(default, skip_serializing_if = "Layout::is_nchw")]
    pub layout: Layout,
}

/// One loop axis of the contraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axis {
    pub name: &'static str,
    pub extent: u32,
}

/// Which axis a term refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AxisRef {
    Spatial(usize),
    Reduction(usize),
}

/// `sum(coeff * axis) + offset`, the index of one tensor dimension. Coefficients are
/// positive; offsets may be negative (padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffineIndex {
    pub terms: Vec<(AxisRef, i64)>,
    pub offset: i64,
}

impl AffineIndex {
    fn axis(axis: AxisRef) -> Self {
        AffineIndex {
            terms: vec![(axis, 1)],
            offset: 0,
        }
    }

    /// The coefficient of `axis` (0 when absent).
    pub fn coeff(&self, axis: AxisRef) -> i64 {
        self.terms
            .iter()
            .filter(|(a, _)| *a == axis)
            .map(|(_, c)| c)
            .sum()
    }

    /// True when the index is exactly `axis` (coefficient 1, offset 0).
    pub fn is_axis(&self, axis: AxisRef) -> bool {
        self.offset == 0 && self.terms.len() == 1 && self.terms[0] == (axis, 1)
    }

    /// Evaluates the index for the given spatial and reduction axis values.
    pub fn eval(&self, spatial: &[i64], reduction: &[i64]) -> i64 {
        self.offset
            + self
                .terms
                .iter()
                .map(|&(a, c)| match a {
                    AxisRef::Spatial(i) => c * spatial[i],
                    AxisRef::Reduction(i) => c * reduction[i],
                })
                .sum::<i64>()
    }
}

/// A row-major tensor read (or written) through affine indices, one per dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub tensor: &'static str,
    pub shape: Vec<u32>,
    pub index: Vec<AffineIndex>,
}

impl Access {
    /// Number of elements of the whole tensor.
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| u64::from(d)).product()
    }

    /// Row-major strides of the tensor's dimensions.
    pub fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        for d in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * i64::from(self.shape[d + 1]);
        }
        strides
    }

    /// The flat element offset for the given axis values, or None when any dimension
    /// index falls outside the tensor (padding: the element reads as zero).
    pub fn flat_offset(&self, spatial: &[i64], reduction: &[i64]) -> Option<usize> {
        let mut flat = 0i64;
        for ((index, &dim), stride) in self.index.iter().zip(&self.shape).zip(self.strides()) {
            let i = index.eval(spatial, reduction);
            if i < 0 || i >= i64::from(dim) {
                return None;
            }
            flat += i * stride;
        }
        Some(flat as usize)
    }
}

/// The generic form of a task: axes, the two multiplied inputs, and the output
/// (whose dimensions are exactly the spatial axes, row-major).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contraction {
    pub spatial: Vec<Axis>,
    pub reduction: Vec<Axis>,
    /// The two factors of every product: `[data, weight]` for conv2d, `[A, B]` for matmul.
    pub inputs: [Access; 2],
    /// The bias vector, when the epilogue adds one.
    pub bias: Option<Access>,
    pub relu: bool,
    /// Element type of the inputs and the bias, and of the output.
    pub dtype: DType,
    pub out_dtype: DType,
    /// The channels-last convolution this is, for staging that reads its windows
    /// themselves (`row_span`); None for other operators and layouts.
    pub channels_last_conv: Option<Conv2d>,
}

impl Contraction {
    /// Number of output elements.
    pub fn output_elements(&self) -> u64 {
        self.spatial.iter().map(|a| u64::from(a.extent)).product()
    }

    /// Number of multiply-adds.
    pub fn macs(&self) -> u64 {
        self.output_elements()
            * self
                .reduction
                .iter()
                .map(|a| u64::from(a.extent))
                .product::<u64>()
    }

    /// Row-major strides of the output over the spatial axes.
    pub fn output_strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.spatial.len()];
        for d in (0..self.spatial.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * i64::from(self.spatial[d + 1].extent);
        }
        strides
    }
}

/// Builds a contraction from full (unsimplified) axes and accesses, dropping extent-1 axes
/// and the tensor dimensions that become the constant 0.
struct Builder {
    spatial: Vec<Axis>,
    reduction: Vec<Axis>,
    /// Position of each full spatial / reduction axis among the kept ones.
    spatial_map: Vec<Option<usize>>,
    reduction_map: Vec<Option<usize>>,
}

/// Keeps the axes of extent > 1; returns them and each full axis's kept position.
fn keep(list: &[(&'static str, u32)]) -> (Vec<Axis>, Vec<Option<usize>>) {
    let mut kept = Vec::new();
    let map = list
        .iter()
        .map(|&(name, extent)| {
            (extent > 1).then(|| {
                kept.push(Axis { name, extent });
                kept.len() - 1
            })
        })
        .collect();
    (kept, map)
}

impl Builder {
    fn new(spatial: &[(&'static str, u32)], reduction: &[(&'static str, u32)]) -> Self {
        let (spatial, spatial_map) = keep(spatial);
        let (reduction, reduction_map) = keep(reduction);
        Builder {
            spatial,
            reduction,
            spatial_map,
            reduction_map,
        }
    }

    /// `dims` are (tensor extent, index over full axes).
    fn access(&self, tensor: &'static str, dims: Vec<(u32, AffineIndex)>) -> Access {
        let (smap, rmap) = (&self.spatial_map, &self.reduction_map);
        let mut shape = Vec::new();
        let mut index = Vec::new();
        for (extent, full) in dims {
            let terms: Vec<_> = full
                .terms
                .iter()
                .filter_map(|&(a, c)| match a {
                    AxisRef::Spatial(i) => smap[i].map(|j| (AxisRef::Spatial(j), c)),
                    AxisRef::Reduction(i) => rmap[i].map(|j| (AxisRef::Reduction(j), c)),
                })
                .collect();
            // A dimension of extent 1 indexed by a constant is always 0: drop it.
            if extent == 1 && terms.is_empty() && full.offset == 0 {
                continue;
            }
            shape.push(extent);
            index.push(AffineIndex {
                terms,
                offset: full.offset,
            });
        }
        if shape.is_empty() {
            // A scalar tensor keeps one dimension so that every access has an index.
            shape.push(1);
            index.push(AffineIndex {
                terms: vec![],
                offset: 0,
            });
        }
        Access {
            tensor,
            shape,
            index,
        }
    }

    fn finish(self, inputs: [Access; 2], bias: Option<Access>, relu: bool) -> Contraction {
        let Builder {
            mut spatial,
            reduction,
            ..
        } = self;
        if spatial.is_empty() {
            // A single output element still needs one (extent-1) spatial axis to tile.
            spatial.push(Axis {
                name: "x",
                extent: 1,
            });
        }
        Contraction {
            spatial,
            reduction,
            inputs,
            bias,
            relu,
            dtype: DType::F32,
            out_dtype: DType::F32,
            channels_last_conv: None,
        }
    }
}

fn check_positive(values: &[(&'static str, u32)]) -> Result<(), TaskError> {
    match values.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(TaskError::Zero(name)),
        None => Ok(()),
    }
}

fn check_size(tensor: &'static str, elements: u64) -> Result<(), TaskError> {
    if elements > i32::MAX as u64 {
        Err(TaskError::TooLarge { tensor, elements })
    } else {
        Ok(())
    }
}

impl Task {
    /// An f32 task (NCHW for conv2d).
    pub fn new(op: Operator, epilogue: Epilogue) -> Result<Task, TaskError> {
        let op = match op {
            Operator::Conv2d(c) => Operator::Conv2d(c.canonical()),
            other => other,
        };
        let task = Task {
            op,
            epilogue,
            dtype: DType::F32,
            out_dtype: DType::F32,
            layout: Layout::Nchw,
        };
        task.check()?;
        Ok(task)
    }

    /// The same task with other element types and layout; the layout is ignored (kept
    /// NCHW) for the row-major matmuls, so that a network's mixed tasks take one flag.
    pub fn with_types(
        self,
        dtype: DType,
        out_dtype: DType,
        layout: Layout,
    ) -> Result<Task, TaskError> {
        let layout = match self.op {
            Operator::Conv2d(_) => layout,
            _ => Layout::Nchw,
        };
        let task = Task {
            dtype,
            out_dtype,
            layout,
            ..self
        };
        task.check()?;
        Ok(task)
    }

    fn check(&self) -> Result<(), TaskError> {
        if !self.layout.is_nchw() && !matches!(self.op, Operator::Conv2d(_)) {
            return Err(TaskError::LayoutNotConv {
                layout: self.layout,
                op: self.op.name(),
            });
        }
        if self.out_dtype != DType::F32 && self.out_dtype != self.dtype {
            return Err(TaskError::OutputType {
                dtype: self.dtype,
                out: self.out_dtype,
            });
        }
        match self.op {
            Operator::Conv2d(c) => {
                check_positive(&[
                    ("n", c.n),
                    ("c", c.c),
                    ("h", c.h),
                    ("w", c.w),
                    ("k", c.k),
                    ("r", c.r),
                    ("s", c.s),
                    ("stride_h", c.stride_h),
                    ("stride_w", c.stride_w),
                    ("dilation_h", c.dilation_h),
                    ("dilation_w", c.dilation_w),
                    ("groups", c.groups),
                ])?;
                if c.c % c.groups != 0 || c.k % c.groups != 0 {
                    return Err(TaskError::Groups {
                        groups: c.groups,
                        c: c.c,
                        k: c.k,
                    });
                }
                let (p, q) = c.output_size()?;
                let n = u64::from(c.n);
                check_size(
                    "input",
                    n * u64::from(c.c) * u64::from(c.h) * u64::from(c.w),
                )?;
                check_size(
                    "weight",
                    u64::from(c.k)
                        * u64::from(c.group_channels().0)
                        * u64::from(c.r)
                        * u64::from(c.s),
                )?;
                check_size("output", n * u64::from(c.k) * u64::from(p) * u64::from(q))
            }
            Operator::Matmul { m, n, k } => {
                check_positive(&[("m", m), ("n", n), ("k", k)])?;
                check_size("A", u64::from(m) * u64::from(k))?;
                check_size("B", u64::from(k) * u64::from(n))?;
                check_size("C", u64::from(m) * u64::from(n))
            }
            Operator::BatchMatmul { b, m, n, k } => {
                check_positive(&[("b", b), ("m", m), ("n", n), ("k", k)])?;
                let b = u64::from(b);
                check_size("A", b * u64::from(m) * u64::from(k))?;
                check_size("B", b * u64::from(k) * u64::from(n))?;
                check_size("C", b * u64::from(m) * u64::from(n))
            }
        }
    }

    /// A stable, human-readable identifier, e.g. `conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1`.
    /// Asymmetric strides/paddings read `st2x1`, bottom/right pads that differ `_pe1`,
    /// dilation adds `_d2`, groups `_g32`, the epilogue
    /// `_bias` / `_relu`, then a type other than f32 `_fp16` (`_tf32`, `_bf16`), an
    /// output in the input type `_out_fp16`, the NHWC layout `_nhwc`.
    pub fn key(&self) -> String {
        let pair = |a: u32, b: u32| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}x{b}")
            }
        };
        let mut key = match self.op {
            Operator::Conv2d(c) => {
                let mut key = format!(
                    "conv2d_n{}_c{}_h{}_w{}_k{}_r{}_s{}_st{}_p{}",
                    c.n,
                    c.c,
                    c.h,
                    c.w,
                    c.k,
                    c.r,
                    c.s,
                    pair(c.stride_h, c.stride_w),
                    pair(c.pad_h, c.pad_w)
                );
                if c.pad_bottom.is_some() || c.pad_right.is_some() {
                    let (bottom, right) = c.pad_end();
                    key += &format!("_pe{}", pair(bottom, right));
                }
                if (c.dilation_h, c.dilation_w) != (1, 1) {
                    key += &format!("_d{}", pair(c.dilation_h, c.dilation_w));
                }
                if c.groups != 1 {
                    key += &format!("_g{}", c.groups);
                }
                key
            }
            Operator::Matmul { m, n, k } => format!("matmul_m{m}_n{n}_k{k}"),
            Operator::BatchMatmul { b, m, n, k } => format!("batch_matmul_b{b}_m{m}_n{n}_k{k}"),
        };
        if self.epilogue.bias {
            key += "_bias";
        }
        if self.epilogue.relu {
            key += "_relu";
        }
        if !self.dtype.is_f32() {
            key += &format!("_{}", self.dtype);
        }
        if !self.out_dtype.is_f32() {
            key += &format!("_out_{}", self.out_dtype);
        }
        if !self.layout.is_nchw() {
            key += &format!("_{}", self.layout);
        }
        key
    }

    /// The shape in the command line's positional form (`N,C,H,W,K,R,S,stride,pad`,
    /// `M,N,K`, `B,M,N,K`); asymmetric conv2d shapes use the key=value form.
    pub fn shape_spec(&self) -> String {
        match self.op {
            Operator::Conv2d(c) => {
                if c.stride_h == c.stride_w
                    && c.pad_h == c.pad_w
                    && c.dilation_h == 1
                    && c.dilation_w == 1
                    && c.pad_bottom.is_none()
                    && c.pad_right.is_none()
                    && c.groups == 1
                {
                    format!(
                        "{},{},{},{},{},{},{},{},{}",
                        c.n, c.c, c.h, c.w, c.k, c.r, c.s, c.stride_h, c.pad_h
                    )
                } else {
                    format!(
                        "n={},c={},h={},w={},k={},r={},s={},stride_h={},stride_w={},pad_h={},pad_w={},dilation_h={},dilation_w={}",
                        c.n,
                        c.c,
                        c.h,
                        c.w,
                        c.k,
                        c.r,
                        c.s,
                        c.stride_h,
                        c.stride_w,
                        c.pad_h,
                        c.pad_w,
                        c.dilation_h,
                        c.dilation_w
                    ) + &c
                        .pad_bottom
                        .map(|b| format!(",pad_bottom={b}"))
                        .unwrap_or_default()
                        + &c.pad_right
                            .map(|r| format!(",pad_right={r}"))
                            .unwrap_or_default()
                        + &if c.groups != 1 {
                            format!(",groups={}", c.groups)
                        } else {
                            String::new()
                        }
                }
            }
            Operator::Matmul { m, n, k } => format!("{m},{n},{k}"),
            Operator::BatchMatmul { b, m, n, k } => format!("{b},{m},{n},{k}"),
        }
    }

    /// Floating-point operations: two per multiply-add (the epilogue is not counted,
    /// as in cuDNN and TVM reports).
    pub fn flops(&self) -> u64 {
        2 * self.contraction().macs()
    }

    /// The generic contraction this task computes.
    pub fn contraction(&self) -> Contraction {
        Contraction {
            dtype: self.dtype,
            out_dtype: self.out_dtype,
            ..self.untyped_contraction()
        }
    }

    fn untyped_contraction(&self) -> Contraction {
        use AxisRef::{Reduction as R, Spatial as S};
        let ep = self.epilogue;
        match self.op {
            Operator::Conv2d(c) => {
                let (p, q) = c.output_size().expect("tasks are checked when built");
                let (cg, kg) = c.group_channels();
                let groups = c.groups;
                // h = p*stride_h + r*dilation_h - pad_h (and likewise for w).
                let window =
                    |out: usize, kern: usize, stride: u32, dil: u32, pad: u32| AffineIndex {
                        terms: vec![(S(out), i64::from(stride)), (R(kern), i64::from(dil))],
                        offset: -i64::from(pad),
                    };
                // Channel `g·C/G + c` of the data, output channel `g·K/G + k`; with one
                // group the g axis has extent 1 and is dropped, leaving the plain conv.
                let channel = |g: usize, within: AxisRef, per_group: u32| AffineIndex {
                    terms: vec![(S(g), i64::from(per_group)), (within, 1)],
                    offset: 0,
                };
                if self.layout == Layout::Nhwc {
                    // The channel axis innermost in the reduction and in both inputs.
                    let b = Builder::new(
                        &[("n", c.n), ("p", p), ("q", q), ("g", groups), ("k", kg)],
                        &[("r", c.r), ("s", c.s), ("c", cg)],
                    );
                    let data = b.access(
                        "data",
                        vec![
                            (c.n, AffineIndex::axis(S(0))),
                            (c.h, window(1, 0, c.stride_h, c.dilation_h, c.pad_h)),
                            (c.w, window(2, 1, c.stride_w, c.dilation_w, c.pad_w)),
                            (c.c, channel(3, R(2), cg)),
                        ],
                    );
                    let weight = b.access(
                        "weight",
                        vec![
                            (c.k, channel(3, S(4), kg)),
                            (c.r, AffineIndex::axis(R(0))),
                            (c.s, AffineIndex::axis(R(1))),
                            (cg, AffineIndex::axis(R(2))),
                        ],
                    );
                    let bias = ep
                        .bias
                        .then(|| b.access("bias", vec![(c.k, channel(3, S(4), kg))]));
                    Contraction {
                        channels_last_conv: Some(c),
                        ..b.finish([data, weight], bias, ep.relu)
                    }
                } else {
                    let b = Builder::new(
                        &[("n", c.n), ("g", groups), ("k", kg), ("p", p), ("q", q)],
                        &[("c", cg), ("r", c.r), ("s", c.s)],
                    );
                    let data = b.access(
                        "data",
                        vec![
                            (c.n, AffineIndex::axis(S(0))),
                            (c.c, channel(1, R(0), cg)),
                            (c.h, window(3, 1, c.stride_h, c.dilation_h, c.pad_h)),
                            (c.w, window(4, 2, c.stride_w, c.dilation_w, c.pad_w)),
                        ],
                    );
                    let weight = b.access(
                        "weight",
                        vec![
                            (c.k, channel(1, S(2), kg)),
                            (cg, AffineIndex::axis(R(0))),
                            (c.r, AffineIndex::axis(R(1))),
                            (c.s, AffineIndex::axis(R(2))),
                        ],
                    );
                    let bias = ep
                        .bias
                        .then(|| b.access("bias", vec![(c.k, channel(1, S(2), kg))]));
                    b.finish([data, weight], bias, ep.relu)
                }
            }
            Operator::Matmul { m, n, k } => {
                let b = Builder::new(&[("m", m), ("n", n)], &[("k", k)]);
                let a = b.access(
                    "A",
                    vec![(m, AffineIndex::axis(S(0))), (k, AffineIndex::axis(R(0)))],
                );
                let bm = b.access(
                    "B",
                    vec![(k, AffineIndex::axis(R(0))), (n, AffineIndex::axis(S(1)))],
                );
                let bias = ep
                    .bias
                    .then(|| b.access("bias", vec![(n, AffineIndex::axis(S(1)))]));
                b.finish([a, bm], bias, ep.relu)
            }
            Operator::BatchMatmul { b: batch, m, n, k } => {
                let b = Builder::new(&[("b", batch), ("m", m), ("n", n)], &[("k", k)]);
                let a = b.access(
                    "A",
                    vec![
                        (batch, AffineIndex::axis(S(0))),
                        (m, AffineIndex::axis(S(1))),
                        (k, AffineIndex::axis(R(0))),
                    ],
                );
                let bm = b.access(
                    "B",
                    vec![
                        (batch, AffineIndex::axis(S(0))),
                        (k, AffineIndex::axis(R(0))),
                        (n, AffineIndex::axis(S(2))),
                    ],
                );
                let bias = ep
                    .bias
                    .then(|| b.access("bias", vec![(n, AffineIndex::axis(S(2)))]));
                b.finish([a, bm], bias, ep.relu)
            }
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn conv(spec: [u32; 9]) -> Task {
        let [n, c, h, w, k, r, s, st, p] = spec;
        Task::new(
            Operator::Conv2d(Conv2d {
                n,
                c,
                h,
                w,
                k,
                r,
                s,
                stride_h: st,
                stride_w: st,
                pad_h: p,
                pad_w: p,
                dilation_h: 1,
                dilation_w: 1,
                pad_bottom: None,
                pad_right: None,
                groups: 1,
            }),
            Epilogue::default(),
        )
        .unwrap()
    }

    #[test]
    fn key_and_flops_of_a_deep_resnet_layer() {
        let t = conv([1, 512, 7, 7, 512, 3, 3, 1, 1]);
        assert_eq!(t.key(), "conv2d_n1_c512_h7_w7_k512_r3_s3_st1_p1");
        assert_eq!(t.flops(), 2 * 512 * 7 * 7 * 512 * 9);
    }

    #[test]
    fn extent_one_axes_are_dropped() {
        let t = conv([1, 64, 56, 56, 256, 1, 1, 1, 0]);
        let c = t.contraction();
        let names: Vec<_> = c.spatial.iter().map(|a| a.name).collect();
        assert_eq!(names, ["k", "p", "q"]);
        assert_eq!(c.reduction.len(), 1);
        assert_eq!(c.inputs[1].shape, vec![256, 64]);
        assert_eq!(c.inputs[0].shape, vec![64, 56, 56]);
    }

    #[test]
    fn strided_conv_output_size() {
        let t = conv([1, 3, 224, 224, 64, 7, 7, 2, 3]);
        let Operator::Conv2d(c) = t.op else {
            unreachable!()
        };
        assert_eq!(c.output_size().unwrap(), (112, 112));
    }

    #[test]
    fn empty_output_is_an_error() {
        let op = Operator::Conv2d(Conv2d {
            n: 1,
            c: 1,
            h: 2,
            w: 2,
            k: 1,
            r: 3,
            s: 3,
            stride_h: 1,
            stride_w: 1,
            pad_h: 0,
            pad_w: 0,
            dilation_h: 1,
            dilation_w: 1,
            pad_bottom: None,
            pad_right: None,
            groups: 1,
        });
        assert!(matches!(
            Task::new(op, Epilogue::default()),
            Err(TaskError::EmptyOutput { .. })
        ));
    }

    #[test]
    fn nhwc_puts_channels_innermost() {
        let t = conv([2, 64, 56, 56, 128, 3, 3, 1, 1])
            .with_types(DType::Fp16, DType::Fp16, Layout::Nhwc)
            .unwrap();
        assert_eq!(
            t.key(),
            "conv2d_n2_c64_h56_w56_k128_r3_s3_st1_p1_fp16_out_fp16_nhwc"
        );
        let c = t.contraction();
        let names = |axes: &[Axis]| axes.iter().map(|a| a.name).collect::<Vec<_>>();
        assert_eq!(names(&c.spatial), ["n", "p", "q", "k"]);
        assert_eq!(names(&c.reduction), ["r", "s", "c"]);
        assert_eq!(c.inputs[0].shape, vec![2, 56, 56, 64]);
        assert_eq!(c.inputs[1].shape, vec![128, 3, 3, 64]);
        assert!(c.inputs[0].index[3].is_axis(AxisRef::Reduction(2)));
        assert!(c.inputs[1].index[3].is_axis(AxisRef::Reduction(2)));
    }

    #[test]
    fn types_serialize_only_when_not_the_default() {
        let t = conv([1, 64, 56, 56, 64, 1, 1, 1, 0]);
        let json = serde_json::to_string(&t).unwrap();
        assert!(
            !json.contains("dtype") && !json.contains("layout"),
            "{json}"
        );
        let half = t.with_types(DType::Bf16, DType::F32, Layout::Nhwc).unwrap();
        let json = serde_json::to_string(&half).unwrap();
        assert!(json.contains(r#""dtype":"bf16""#) && json.contains(r#""layout":"nhwc""#));
        assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), half);
    }

    #[test]
    fn output_type_is_f32_or_the_input_type() {
        let t = conv([1, 64, 56, 56, 64, 1, 1, 1, 0]);
        assert!(matches!(
            t.with_types(DType::Fp16, DType::Bf16, Layout::Nhwc),
            Err(TaskError::OutputType { .. })
        ));
        let mm = Task::new(Operator::Matmul { m: 8, n: 8, k: 8 }, Epilogue::default()).unwrap();
        // A network-wide --layout leaves the row-major matmuls as they are.
        let mm = mm
            .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
            .unwrap();
        assert_eq!(mm.layout, Layout::Nchw);
        assert_eq!(mm.key(), "matmul_m8_n8_k8_fp16");
    }

    #[test]
    fn matmul_key_with_epilogue() {
        let t = Task::new(
            Operator::Matmul {
                m: 333,
                n: 777,
                k: 555,
            },
            Epilogue {
                bias: true,
                relu: true,
            },
        )
        .unwrap();
        assert_eq!(t.key(), "matmul_m333_n777_k555_bias_relu");
        assert_eq!(t.shape_spec(), "333,777,555");
    }
}
