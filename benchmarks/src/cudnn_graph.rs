//! The cuDNN baseline for conv2d through cuDNN's graph (backend) API: the API that
//! PyTorch and cuDNN's own frontend use, and the only one that reaches cuDNN's newer
//! engines (Hopper's tensor-core kernels, runtime-fused convolution + bias + ReLU, a
//! half input with a float32 output). The legacy `cudnnFindConvolutionForwardAlgorithmEx`
//! of `cudnn.rs` often hands back only non-tensor-core algorithms for half-precision
//! 1x1 convolutions (20-100x slower than an engine: see the project's REFERENCE notes),
//! so a baseline built on it alone overstates every speedup.
//!
//! A task becomes a [`GraphSpec`] (pure data, checked without a GPU): the tensors with
//! their dimensions, strides, types and unique ids, and the operations — the
//! convolution, then the task's bias add and ReLU as pointwise operations on virtual
//! float32 tensors. [`GraphConv`] builds the descriptors from it, asks the heuristics
//! (modes A, B and fallback) for engine configurations, keeps those that compute at the
//! task's precision (see [`admits`]), finalizes an execution plan for each, and executes
//! a plan on the caller's buffers.
//!
//! Functions are resolved from the copy `vendor::load` opened; a cuDNN without the
//! `cudnnBackend*` functions (before 8.0) is one clear error.

use crate::cudnn::{CudnnHandle, check_status};
use crate::vendor::{self, Library, VendorError};
use gpu::cuda::{Buffer, Context};
use schedule::task::Conv2d;
use schedule::{DType, Layout, Operator, Task};
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

type Raw = *mut c_void;
type Status = c_int;

// cudnnBackendDescriptorType_t
const POINTWISE_DESCRIPTOR: c_int = 0;
const CONVOLUTION_DESCRIPTOR: c_int = 1;
const ENGINE_DESCRIPTOR: c_int = 2;
const ENGINECFG_DESCRIPTOR: c_int = 3;
const ENGINEHEUR_DESCRIPTOR: c_int = 4;
const EXECUTION_PLAN_DESCRIPTOR: c_int = 5;
const KNOB_CHOICE_DESCRIPTOR: c_int = 7;
const OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: c_int = 10;
const OPERATION_POINTWISE_DESCRIPTOR: c_int = 13;
const OPERATIONGRAPH_DESCRIPTOR: c_int = 15;
const VARIANT_PACK_DESCRIPTOR: c_int = 16;
const TENSOR_DESCRIPTOR: c_int = 17;

// cudnnBackendAttributeType_t
const TYPE_HANDLE: c_int = 0;
const TYPE_DATA_TYPE: c_int = 1;
const TYPE_BOOLEAN: c_int = 2;
const TYPE_INT64: c_int = 3;
const TYPE_FLOAT: c_int = 4;
const TYPE_VOID_PTR: c_int = 6;
const TYPE_CONVOLUTION_MODE: c_int = 7;
const TYPE_HEUR_MODE: c_int = 8;
const TYPE_KNOB_TYPE: c_int = 9;
const TYPE_NUMERICAL_NOTE: c_int = 11;
const TYPE_POINTWISE_MODE: c_int = 14;
const TYPE_BACKEND_DESCRIPTOR: c_int = 15;
const TYPE_BEHAVIOR_NOTE: c_int = 19;

// cudnnBackendAttributeName_t
const ATTR_POINTWISE_MODE: c_int = 0;
const ATTR_POINTWISE_MATH_PREC: c_int = 1;
const ATTR_CONVOLUTION_COMP_TYPE: c_int = 100;
const ATTR_CONVOLUTION_CONV_MODE: c_int = 101;
const ATTR_CONVOLUTION_DILATIONS: c_int = 102;
const ATTR_CONVOLUTION_FILTER_STRIDES: c_int = 103;
const ATTR_CONVOLUTION_POST_PADDINGS: c_int = 104;
const ATTR_CONVOLUTION_PRE_PADDINGS: c_int = 105;
const ATTR_CONVOLUTION_SPATIAL_DIMS: c_int = 106;
const ATTR_ENGINEHEUR_MODE: c_int = 200;
const ATTR_ENGINEHEUR_OPERATION_GRAPH: c_int = 201;
const ATTR_ENGINEHEUR_RESULTS: c_int = 202;
const ATTR_ENGINECFG_ENGINE: c_int = 300;
const ATTR_ENGINECFG_KNOB_CHOICES: c_int = 302;
const ATTR_EXECUTION_PLAN_HANDLE: c_int = 400;
const ATTR_EXECUTION_PLAN_ENGINE_CONFIG: c_int = 401;
const ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: c_int = 402;
const ATTR_KNOB_CHOICE_KNOB_TYPE: c_int = 600;
const ATTR_KNOB_CHOICE_KNOB_VALUE: c_int = 601;
const ATTR_CONV_FWD_ALPHA: c_int = 700;
const ATTR_CONV_FWD_BETA: c_int = 701;
const ATTR_CONV_FWD_CONV_DESC: c_int = 702;
const ATTR_CONV_FWD_W: c_int = 703;
const ATTR_CONV_FWD_X: c_int = 704;
const ATTR_CONV_FWD_Y: c_int = 705;
const ATTR_POINTWISE_PW_DESCRIPTOR: c_int = 750;
const ATTR_POINTWISE_XDESC: c_int = 751;
const ATTR_POINTWISE_BDESC: c_int = 752;
const ATTR_POINTWISE_YDESC: c_int = 753;
const ATTR_OPERATIONGRAPH_HANDLE: c_int = 800;
const ATTR_OPERATIONGRAPH_OPS: c_int = 801;
const ATTR_TENSOR_BYTE_ALIGNMENT: c_int = 900;
const ATTR_TENSOR_DATA_TYPE: c_int = 901;
const ATTR_TENSOR_DIMENSIONS: c_int = 902;
const ATTR_TENSOR_STRIDES: c_int = 903;
const ATTR_TENSOR_UNIQUE_ID: c_int = 906;
const ATTR_TENSOR_IS_VIRTUAL: c_int = 907;
const ATTR_VARIANT_PACK_UNIQUE_IDS: c_int = 1000;
const ATTR_VARIANT_PACK_DATA_POINTERS: c_int = 1001;
const ATTR_VARIANT_PACK_WORKSPACE: c_int = 1003;
const ATTR_ENGINE_GLOBAL_INDEX: c_int = 1301;
const ATTR_ENGINE_NUMERICAL_NOTE: c_int = 1303;
const ATTR_ENGINE_BEHAVIOR_NOTE: c_int = 1305;

// cudnnDataType_t
const DATA_FLOAT: c_int = 0;
const DATA_HALF: c_int = 2;
const DATA_BFLOAT16: c_int = 9;
const CROSS_CORRELATION: c_int = 1;

// cudnnBackendNumericalNote_t
const NOTE_TENSOR_CORE: c_int = 0;
const NOTE_DOWN_CONVERT_INPUTS: c_int = 1;
const NOTE_REDUCED_PRECISION_REDUCTION: c_int = 2;
// cudnnBackendBehaviorNote_t
const BEHAVIOR_RUNTIME_COMPILATION: c_int = 0;

/// Buffers from the CUDA allocator are 256-byte aligned; cuDNN needs to know at least 16.
const BYTE_ALIGNMENT: i64 = 16;
/// Most numerical notes, behaviour notes and knobs one engine configuration lists.
const MAX_NOTES: usize = 16;
const MAX_KNOBS: usize = 64;

functions! {
    /// The graph API (`cudnn_graph.h`, cuDNN 8 and 9).
    struct GraphApi in None;
    fn cudnnBackendCreateDescriptor(c_int, *mut Raw) -> Status;
    fn cudnnBackendDestroyDescriptor(Raw) -> Status;
    fn cudnnBackendFinalize(Raw) -> Status;
    fn cudnnBackendSetAttribute(Raw, c_int, c_int, i64, *const c_void) -> Status;
    fn cudnnBackendGetAttribute(Raw, c_int, c_int, i64, *mut i64, *mut c_void) -> Status;
    fn cudnnBackendExecute(Raw, Raw, Raw) -> Status;
}

/// The graph API of the loaded cuDNN, resolved once.
fn api() -> Result<&'static GraphApi, VendorError> {
    static API: OnceLock<GraphApi> = OnceLock::new();
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let loaded = vendor::loaded(Library::Cudnn).ok_or(VendorError::NotLoaded {
        lib: Library::Cudnn,
    })?;
    let resolved = GraphApi::resolve(loaded).map_err(|e| VendorError::Unsupported {
        lib: Library::Cudnn,
        what: format!(
            "the graph API at {} ({e}); cuDNN 8 or later is needed: pass --cudnn DIR",
            loaded.dir.display()
        ),
    })?;
    Ok(API.get_or_init(|| resolved))
}

/// Checks that the loaded cuDNN has the graph API: one clear error where it does not.
pub fn require() -> Result<(), VendorError> {
    api().map(|_| ())
}

/// `cudnnDataType_t` of an element type (TF32 is float32 data).
fn data_type(dtype: DType) -> c_int {
    match dtype {
        DType::F32 | DType::Tf32 => DATA_FLOAT,
        DType::Fp16 => DATA_HALF,
        DType::Bf16 => DATA_BFLOAT16,
    }
}

/// One tensor of a graph: cuDNN's dimensions are always N, C, H, W (K, C/G, R, S for
/// the filter); the strides say how it lies in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: &'static str,
    pub uid: i64,
    /// `cudnnDataType_t`.
    pub data_type: c_int,
    pub dims: [i64; 4],
    pub strides: [i64; 4],
    /// An intermediate that never reaches memory (between fused operations).
    pub is_virtual: bool,
}

/// A pointwise operation of the epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pointwise {
    /// `y = x + b` (the bias, broadcast over N, H and W).
    Add,
    Relu,
    /// `y = x`: converts the float32 accumulator to the output type.
    Identity,
}

impl Pointwise {
    /// `cudnnPointwiseMode_t`.
    fn mode(self) -> c_int {
        match self {
            Pointwise::Add => 0,
            Pointwise::Relu => 100,
            Pointwise::Identity => 21,
        }
    }
}

/// One operation of a graph; tensors are indices into [`GraphSpec::tensors`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpSpec {
    Conv {
        x: usize,
        w: usize,
        y: usize,
        pre_paddings: [i64; 2],
        post_paddings: [i64; 2],
        strides: [i64; 2],
        dilations: [i64; 2],
    },
    Pointwise {
        mode: Pointwise,
        x: usize,
        b: Option<usize>,
        y: usize,
    },
}

/// Which form of the graph: the epilogue fused into it or not, and a converting tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphForm {
    /// Bias and ReLU as pointwise operations of the graph (else the convolution alone).
    pub fuse_epilogue: bool,
    /// End with an identity pointwise operation into the output even without an
    /// epilogue (some engines write a float32 output only from a fused tail).
    pub identity_tail: bool,
}

/// A conv2d task as a cuDNN operation graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSpec {
    pub tensors: Vec<TensorSpec>,
    pub ops: Vec<OpSpec>,
    /// `cudnnDataType_t` of the accumulation (float32 for every task type).
    pub compute_type: c_int,
    pub form: GraphForm,
    /// Whether the graph computes the task's whole epilogue.
    pub computes_epilogue: bool,
    pub dtype: DType,
    pub out_dtype: DType,
    pub layout: Layout,
}

/// Unique ids of the tensors a caller passes (see [`GraphSpec::io_uids`]).
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_BIAS: i64 = 3;
const UID_Y: i64 = 4;

fn packed_strides([_, c, h, w]: [i64; 4], layout: Layout) -> [i64; 4] {
    match layout {
        Layout::Nchw => [c * h * w, h * w, w, 1],
        Layout::Nhwc => [h * w * c, 1, w * c, c],
    }
}

impl GraphSpec {
    /// The graph of a conv2d `task` in `form`; `Unsupported` for another operator.
    pub fn for_task(task: &Task, form: GraphForm) -> Result<GraphSpec, VendorError> {
        let Operator::Conv2d(shape) = &task.op else {
            return Err(VendorError::Unsupported {
                lib: Library::Cudnn,
                what: format!("{} (a conv2d baseline)", task.op.name()),
            });
        };
        let (p, q) = shape.output_size().map_err(|e| VendorError::Call {
            call: "output size",
            status: e.to_string(),
        })?;
        let s: &Conv2d = shape;
        let i = |v: u32| i64::from(v);
        let layout = task.layout;
        let tensor = |name, uid, dtype: c_int, dims: [i64; 4], is_virtual| TensorSpec {
            name,
            uid,
            data_type: dtype,
            dims,
            strides: packed_strides(dims, layout),
            is_virtual,
        };
        let input_type = data_type(task.dtype);
        let y_dims = [i(s.n), i(s.k), i64::from(p), i64::from(q)];
        let mut tensors = vec![
            tensor(
                "x",
                UID_X,
                input_type,
                [i(s.n), i(s.c), i(s.h), i(s.w)],
                false,
            ),
            // Grouped convolutions: the filter's C is C/G, and cuDNN infers the groups.
            tensor(
                "w",
                UID_W,
                input_type,
                [i(s.k), i(s.group_channels().0), i(s.r), i(s.s)],
                false,
            ),
        ];
        let epilogue = task.epilogue;
        let mut tail: Vec<(Pointwise, bool)> = Vec::new();
        if form.fuse_epilogue {
            if epilogue.bias {
                tail.push((Pointwise::Add, true));
            }
            if epilogue.relu {
                tail.push((Pointwise::Relu, false));
            }
        }
        if tail.is_empty() && form.identity_tail {
            tail.push((Pointwise::Identity, false));
        }
        let bias = tail.iter().any(|(_, b)| *b).then(|| {
            tensors.push(TensorSpec {
                name: "bias",
                uid: UID_BIAS,
                data_type: input_type,
                dims: [1, i(s.k), 1, 1],
                strides: [i(s.k), 1, 1, 1],
                is_virtual: false,
            });
            tensors.len() - 1
        });
        let output_type = data_type(task.out_dtype);
        let push = |tensors: &mut Vec<TensorSpec>, name, uid, last: bool| {
            let (dtype, is_virtual) = if last {
                (output_type, false)
            } else {
                (DATA_FLOAT, true)
            };
            tensors.push(tensor(name, uid, dtype, y_dims, is_virtual));
            tensors.len() - 1
        };
        let conv_y = if tail.is_empty() {
            push(&mut tensors, "y", UID_Y, true)
        } else {
            push(&mut tensors, "conv", 101, false)
        };
        let mut ops = vec![OpSpec::Conv {
            x: 0,
            w: 1,
            y: conv_y,
            pre_paddings: [i(s.pad_h), i(s.pad_w)],
            post_paddings: [
                i(s.pad_bottom.unwrap_or(s.pad_h)),
                i(s.pad_right.unwrap_or(s.pad_w)),
            ],
            strides: [i(s.stride_h), i(s.stride_w)],
            dilations: [i(s.dilation_h), i(s.dilation_w)],
        }];
        let mut previous = conv_y;
        for (step, (mode, with_bias)) in tail.iter().enumerate() {
            let last = step + 1 == tail.len();
            let y = if last {
                push(&mut tensors, "y", UID_Y, true)
            } else {
                push(&mut tensors, "epilogue", 102 + step as i64, false)
            };
            ops.push(OpSpec::Pointwise {
                mode: *mode,
                x: previous,
                b: if *with_bias { bias } else { None },
                y,
            });
            previous = y;
        }
        let computes_epilogue = form.fuse_epilogue || (!epilogue.bias && !epilogue.relu);
        Ok(GraphSpec {
            tensors,
            ops,
            compute_type: DATA_FLOAT,
            form,
            computes_epilogue,
            dtype: task.dtype,
            out_dtype: task.out_dtype,
            layout,
        })
    }

    /// The unique ids of the tensors a run binds, in the order of its buffers: x, w,
    /// the bias when the graph adds it, y.
    pub fn io_uids(&self) -> Vec<i64> {
        let mut uids = vec![UID_X, UID_W];
        if self.tensors.iter().any(|t| t.uid == UID_BIAS) {
            uids.push(UID_BIAS);
        }
        uids.push(UID_Y);
        uids
    }

    /// What the graph computes, e.g. `conv+bias+relu`.
    pub fn label(&self) -> String {
        let mut label = "conv".to_string();
        for op in &self.ops {
            if let OpSpec::Pointwise { mode, .. } = op {
                label.push_str(match mode {
                    Pointwise::Add => "+bias",
                    Pointwise::Relu => "+relu",
                    Pointwise::Identity => "+convert",
                });
            }
        }
        label
    }
}

/// Whether an engine whose numerical notes are `notes` computes at `dtype`'s precision:
/// no engine may convert its inputs down or reduce in less than float32, and float32
/// (not TF32) tasks exclude tensor cores, which would round their inputs to TF32.
pub fn admits(dtype: DType, notes: &[c_int]) -> Result<(), &'static str> {
    if notes.contains(&NOTE_DOWN_CONVERT_INPUTS) {
        return Err("converts its inputs down");
    }
    if notes.contains(&NOTE_REDUCED_PRECISION_REDUCTION) {
        return Err("reduces in reduced precision");
    }
    if dtype == DType::F32 && notes.contains(&NOTE_TENSOR_CORE) {
        return Err("TF32 tensor cores on a float32 task");
    }
    Ok(())
}

/// `cudnnBackendKnobType_t` names, for reports (cuDNN 9.19's values).
const KNOB_NAMES: [(c_int, &str); 44] = [
    (0, "SPLIT_K"),
    (1, "SWIZZLE"),
    (2, "TILE_SIZE"),
    (3, "USE_TEX"),
    (4, "EDGE"),
    (5, "KBLOCK"),
    (6, "LDGA"),
    (7, "LDGB"),
    (8, "CHUNK_K"),
    (9, "SPLIT_H"),
    (10, "WINO_TILE"),
    (11, "MULTIPLY"),
    (12, "SPLIT_K_BUF"),
    (13, "TILEK"),
    (14, "STAGES"),
    (15, "REDUCTION_MODE"),
    (16, "CTA_SPLIT_K_MODE"),
    (17, "SPLIT_K_SLC"),
    (18, "IDX_MODE"),
    (19, "SLICED"),
    (20, "SPLIT_RS"),
    (21, "SINGLEBUFFER"),
    (22, "LDGC"),
    (23, "SPECFILT"),
    (24, "KERNEL_CFG"),
    (25, "WORKSPACE"),
    (26, "TILE_CGA"),
    (27, "TILE_CGA_M"),
    (28, "TILE_CGA_N"),
    (29, "BLOCK_SIZE"),
    (30, "OCCUPANCY"),
    (31, "ARRAY_SIZE_PER_THREAD"),
    (32, "NUM_C_PER_BLOCK"),
    (33, "SPLIT_COLS"),
    (34, "TILE_ROWS"),
    (35, "TILE_COLS"),
    (36, "LOAD_SIZE"),
    (37, "CTA_COUNT"),
    (38, "STREAM_K"),
    (39, "SPLIT_P_SLC"),
    (40, "TILE_M"),
    (41, "TILE_N"),
    (42, "WARP_SPEC_CFG"),
    (43, "SWAP_AB"),
];

fn knob_name(knob: c_int) -> String {
    KNOB_NAMES
        .iter()
        .find(|(k, _)| *k == knob)
        .map_or_else(|| format!("KNOB_{knob}"), |(_, n)| n.to_string())
}

/// Which heuristic proposed an engine configuration first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heuristic {
    A,
    B,
    Fallback,
}

impl Heuristic {
    /// `cudnnBackendHeurMode_t`.
    fn mode(self) -> c_int {
        match self {
            Heuristic::A => 3,
            Heuristic::B => 1,
            Heuristic::Fallback => 2,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Heuristic::A => "A",
            Heuristic::B => "B",
            Heuristic::Fallback => "fallback",
        }
    }
}

/// An engine configuration's identity and what cuDNN says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// `CUDNN_ATTR_ENGINE_GLOBAL_INDEX`.
    pub index: i64,
    /// (knob type, value) pairs, as chosen by the configuration.
    pub knobs: Vec<(c_int, i64)>,
    pub tensor_cores: bool,
    /// cuDNN compiles the kernel at run time (runtime fusion engines).
    pub runtime_compiled: bool,
    pub heuristic: Heuristic,
}

impl EngineInfo {
    /// e.g. `eng12 {TILE_SIZE=3 STAGES=4}`, like cuDNN's frontend names plans.
    pub fn name(&self) -> String {
        let knobs: Vec<String> = self
            .knobs
            .iter()
            .map(|(k, v)| format!("{}={v}", knob_name(*k)))
            .collect();
        if knobs.is_empty() {
            format!("eng{}", self.index)
        } else {
            format!("eng{} {{{}}}", self.index, knobs.join(" "))
        }
    }

    /// `tensor-core` or `no-tensor-core`, plus how it was found.
    pub fn notes(&self) -> String {
        format!(
            "{}{}, heuristic {}",
            if self.tensor_cores {
                "tensor-core"
            } else {
                "no-tensor-core"
            },
            if self.runtime_compiled {
                ", runtime-compiled"
            } else {
                ""
            },
            self.heuristic.label()
        )
    }
}

/// One backend descriptor, destroyed on drop.
struct Desc {
    api: &'static GraphApi,
    raw: Raw,
}

impl Desc {
    fn new(api: &'static GraphApi, kind: c_int) -> Result<Desc, VendorError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a descriptor of a valid type.
        check_status("cudnnBackendCreateDescriptor", unsafe {
            (api.cudnnBackendCreateDescriptor)(kind, &mut raw)
        })?;
        Ok(Desc { api, raw })
    }

    /// Sets attribute `name` of type `ty` to `values` (whose Rust type is the C type
    /// `ty` names: i64 for INT64, c_int for the enums, bool, f32, raw pointers).
    fn set<T>(
        &self,
        call: &'static str,
        name: c_int,
        ty: c_int,
        values: &[T],
    ) -> Result<(), VendorError> {
        // SAFETY: `values` holds `len` elements of the attribute type's C type (each
        // caller pairs them), read during the call only.
        check_status(call, unsafe {
            (self.api.cudnnBackendSetAttribute)(
                self.raw,
                name,
                ty,
                values.len() as i64,
                values.as_ptr().cast(),
            )
        })
    }

    fn finalize(&self, call: &'static str) -> Result<(), VendorError> {
        // SAFETY: live descriptor.
        check_status(call, unsafe { (self.api.cudnnBackendFinalize)(self.raw) })
    }

    /// Reads up to `requested` elements of attribute `name` into `array`; returns how
    /// many the attribute holds.
    ///
    /// # Safety
    ///
    /// `array` has room for `requested` elements of `ty`'s C type (null when 0).
    unsafe fn get_into(
        &self,
        call: &'static str,
        name: c_int,
        ty: c_int,
        requested: usize,
        array: *mut c_void,
    ) -> Result<usize, VendorError> {
        let mut count = 0i64;
        // SAFETY: as the caller guarantees; `count` is a live out-pointer.
        check_status(call, unsafe {
            (self.api.cudnnBackendGetAttribute)(
                self.raw,
                name,
                ty,
                requested as i64,
                &mut count,
                array,
            )
        })?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// Up to `max` elements of attribute `name` (plain values, not descriptors).
    fn get<T: Copy + Default>(
        &self,
        call: &'static str,
        name: c_int,
        ty: c_int,
        max: usize,
    ) -> Result<Vec<T>, VendorError> {
        let mut values = vec![T::default(); max.max(1)];
        // SAFETY: `values` has room for its length in elements of the attribute's C type.
        let count =
            unsafe { self.get_into(call, name, ty, values.len(), values.as_mut_ptr().cast()) }?;
        values.truncate(count.min(max));
        Ok(values)
    }

    /// The number of elements attribute `name` holds.
    fn count(&self, call: &'static str, name: c_int, ty: c_int) -> Result<usize, VendorError> {
        // SAFETY: a request of zero elements writes only the count.
        unsafe { self.get_into(call, name, ty, 0, std::ptr::null_mut()) }
    }

    /// Up to `max` descriptors of attribute `name`, each of type `kind` (cuDNN fills
    /// descriptors the caller created).
    fn get_descriptors(
        &self,
        call: &'static str,
        name: c_int,
        kind: c_int,
        max: usize,
    ) -> Result<Vec<Desc>, VendorError> {
        let mut descs = (0..max.max(1))
            .map(|_| Desc::new(self.api, kind))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raws: Vec<Raw> = descs.iter().map(|d| d.raw).collect();
        // SAFETY: `raws` are live descriptors of the element type, as many as asked for.
        let count = unsafe {
            self.get_into(
                call,
                name,
                TYPE_BACKEND_DESCRIPTOR,
                raws.len(),
                raws.as_mut_ptr().cast(),
            )
        }?;
        descs.truncate(count.min(max));
        Ok(descs)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `Desc::new`, destroyed once.
        unsafe {
            (self.api.cudnnBackendDestroyDescriptor)(self.raw);
        }
    }
}

/// An engine configuration finalized into an execution plan.
pub struct Engine {
    pub info: EngineInfo,
    pub workspace_bytes: usize,
    plan: Desc,
    /// The configuration the plan was built from, alive as long as the plan.
    _config: Desc,
}

/// A conv2d task described to cuDNN's graph API, ready for heuristics and execution.
pub struct GraphConv {
    api: &'static GraphApi,
    handle: CudnnHandle,
    pub spec: GraphSpec,
    graph: Desc,
    /// Tensors, operation and pointwise descriptors the graph refers to.
    _parts: Vec<Desc>,
    /// Variant packs by (x, w, bias or y, y or 0, workspace): one per rotated buffer set.
    packs: RefCell<HashMap<[u64; 5], Desc>>,
}

impl GraphConv {
    /// Builds and finalizes the operation graph of `task` in `form`; work is enqueued
    /// on `ctx`'s stream.
    pub fn new(ctx: &Context, task: &Task, form: GraphForm) -> Result<GraphConv, VendorError> {
        let spec = GraphSpec::for_task(task, form)?;
        let api = api()?;
        let handle = CudnnHandle::new(ctx)?;
        let mut parts = Vec::new();
        let mut tensors = Vec::new();
        for t in &spec.tensors {
            let d = Desc::new(api, TENSOR_DESCRIPTOR)?;
            d.set(
                "tensor data type",
                ATTR_TENSOR_DATA_TYPE,
                TYPE_DATA_TYPE,
                &[t.data_type],
            )?;
            d.set(
                "tensor dimensions",
                ATTR_TENSOR_DIMENSIONS,
                TYPE_INT64,
                &t.dims,
            )?;
            d.set(
                "tensor strides",
                ATTR_TENSOR_STRIDES,
                TYPE_INT64,
                &t.strides,
            )?;
            d.set("tensor uid", ATTR_TENSOR_UNIQUE_ID, TYPE_INT64, &[t.uid])?;
            d.set(
                "tensor alignment",
                ATTR_TENSOR_BYTE_ALIGNMENT,
                TYPE_INT64,
                &[BYTE_ALIGNMENT],
            )?;
            d.set(
                "tensor is-virtual",
                ATTR_TENSOR_IS_VIRTUAL,
                TYPE_BOOLEAN,
                &[t.is_virtual],
            )?;
            d.finalize("finalizing a tensor descriptor")?;
            tensors.push(d);
        }
        let mut ops = Vec::new();
        for op in &spec.ops {
            match op {
                OpSpec::Conv {
                    x,
                    w,
                    y,
                    pre_paddings,
                    post_paddings,
                    strides,
                    dilations,
                } => {
                    let conv = Desc::new(api, CONVOLUTION_DESCRIPTOR)?;
                    conv.set(
                        "convolution compute type",
                        ATTR_CONVOLUTION_COMP_TYPE,
                        TYPE_DATA_TYPE,
                        &[spec.compute_type],
                    )?;
                    conv.set(
                        "convolution mode",
                        ATTR_CONVOLUTION_CONV_MODE,
                        TYPE_CONVOLUTION_MODE,
                        &[CROSS_CORRELATION],
                    )?;
                    conv.set(
                        "convolution spatial dims",
                        ATTR_CONVOLUTION_SPATIAL_DIMS,
                        TYPE_INT64,
                        &[2i64],
                    )?;
                    conv.set(
                        "convolution dilations",
                        ATTR_CONVOLUTION_DILATIONS,
                        TYPE_INT64,
                        dilations,
                    )?;
                    conv.set(
                        "convolution strides",
                        ATTR_CONVOLUTION_FILTER_STRIDES,
                        TYPE_INT64,
                        strides,
                    )?;
                    conv.set(
                        "convolution pre-paddings",
                        ATTR_CONVOLUTION_PRE_PADDINGS,
                        TYPE_INT64,
                        pre_paddings,
                    )?;
                    conv.set(
                        "convolution post-paddings",
                        ATTR_CONVOLUTION_POST_PADDINGS,
                        TYPE_INT64,
                        post_paddings,
                    )?;
                    conv.finalize("finalizing the convolution descriptor")?;
                    let o = Desc::new(api, OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
                    o.set(
                        "convolution x",
                        ATTR_CONV_FWD_X,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[tensors[*x].raw],
                    )?;
                    o.set(
                        "convolution w",
                        ATTR_CONV_FWD_W,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[tensors[*w].raw],
                    )?;
                    o.set(
                        "convolution y",
                        ATTR_CONV_FWD_Y,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[tensors[*y].raw],
                    )?;
                    o.set(
                        "convolution descriptor",
                        ATTR_CONV_FWD_CONV_DESC,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[conv.raw],
                    )?;
                    o.set(
                        "convolution alpha",
                        ATTR_CONV_FWD_ALPHA,
                        TYPE_FLOAT,
                        &[1.0f32],
                    )?;
                    o.set(
                        "convolution beta",
                        ATTR_CONV_FWD_BETA,
                        TYPE_FLOAT,
                        &[0.0f32],
                    )?;
                    o.finalize("finalizing the convolution operation")?;
                    parts.push(conv);
                    ops.push(o);
                }
                OpSpec::Pointwise { mode, x, b, y } => {
                    let pw = Desc::new(api, POINTWISE_DESCRIPTOR)?;
                    pw.set(
                        "pointwise mode",
                        ATTR_POINTWISE_MODE,
                        TYPE_POINTWISE_MODE,
                        &[mode.mode()],
                    )?;
                    pw.set(
                        "pointwise precision",
                        ATTR_POINTWISE_MATH_PREC,
                        TYPE_DATA_TYPE,
                        &[DATA_FLOAT],
                    )?;
                    pw.finalize("finalizing a pointwise descriptor")?;
                    let o = Desc::new(api, OPERATION_POINTWISE_DESCRIPTOR)?;
                    o.set(
                        "pointwise descriptor",
                        ATTR_POINTWISE_PW_DESCRIPTOR,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[pw.raw],
                    )?;
                    o.set(
                        "pointwise x",
                        ATTR_POINTWISE_XDESC,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[tensors[*x].raw],
                    )?;
                    if let Some(b) = b {
                        o.set(
                            "pointwise b",
                            ATTR_POINTWISE_BDESC,
                            TYPE_BACKEND_DESCRIPTOR,
                            &[tensors[*b].raw],
                        )?;
                    }
                    o.set(
                        "pointwise y",
                        ATTR_POINTWISE_YDESC,
                        TYPE_BACKEND_DESCRIPTOR,
                        &[tensors[*y].raw],
                    )?;
                    o.finalize("finalizing a pointwise operation")?;
                    parts.push(pw);
                    ops.push(o);
                }
            }
        }
        let graph = Desc::new(api, OPERATIONGRAPH_DESCRIPTOR)?;
        let raw_ops: Vec<Raw> = ops.iter().map(|o| o.raw).collect();
        graph.set(
            "graph operations",
            ATTR_OPERATIONGRAPH_OPS,
            TYPE_BACKEND_DESCRIPTOR,
            &raw_ops,
        )?;
        graph.set(
            "graph handle",
            ATTR_OPERATIONGRAPH_HANDLE,
            TYPE_HANDLE,
            &[handle.raw],
        )?;
        graph.finalize("finalizing the operation graph")?;
        parts.extend(tensors);
        parts.extend(ops);
        Ok(GraphConv {
            api,
            handle,
            spec,
            graph,
            _parts: parts,
            packs: RefCell::new(HashMap::new()),
        })
    }

    /// The engine configurations of one heuristic mode, best first.
    fn configurations(&self, heuristic: Heuristic) -> Result<Vec<Desc>, VendorError> {
        let heur = Desc::new(self.api, ENGINEHEUR_DESCRIPTOR)?;
        heur.set(
            "heuristics graph",
            ATTR_ENGINEHEUR_OPERATION_GRAPH,
            TYPE_BACKEND_DESCRIPTOR,
            &[self.graph.raw],
        )?;
        heur.set(
            "heuristics mode",
            ATTR_ENGINEHEUR_MODE,
            TYPE_HEUR_MODE,
            &[heuristic.mode()],
        )?;
        heur.finalize("finalizing the heuristics")?;
        let count = heur.count(
            "counting the heuristics' results",
            ATTR_ENGINEHEUR_RESULTS,
            TYPE_BACKEND_DESCRIPTOR,
        )?;
        if count == 0 {
            return Ok(Vec::new());
        }
        heur.get_descriptors(
            "reading the heuristics' results",
            ATTR_ENGINEHEUR_RESULTS,
            ENGINECFG_DESCRIPTOR,
            count,
        )
    }

    /// What cuDNN says of an engine configuration.
    fn describe_config(
        &self,
        config: &Desc,
        heuristic: Heuristic,
    ) -> Result<(EngineInfo, Vec<c_int>), VendorError> {
        let engine = config
            .get_descriptors(
                "reading a configuration's engine",
                ATTR_ENGINECFG_ENGINE,
                ENGINE_DESCRIPTOR,
                1,
            )?
            .pop()
            .ok_or(VendorError::Call {
                call: "reading a configuration's engine",
                status: "no engine".to_string(),
            })?;
        let index = engine
            .get::<i64>(
                "reading an engine's index",
                ATTR_ENGINE_GLOBAL_INDEX,
                TYPE_INT64,
                1,
            )?
            .first()
            .copied()
            .unwrap_or(-1);
        let notes: Vec<c_int> = engine.get(
            "reading an engine's numerical notes",
            ATTR_ENGINE_NUMERICAL_NOTE,
            TYPE_NUMERICAL_NOTE,
            MAX_NOTES,
        )?;
        // Older libraries lack behaviour notes: none then.
        let behaviour: Vec<c_int> = engine
            .get(
                "reading an engine's behaviour notes",
                ATTR_ENGINE_BEHAVIOR_NOTE,
                TYPE_BEHAVIOR_NOTE,
                MAX_NOTES,
            )
            .unwrap_or_default();
        let mut knobs = Vec::new();
        for choice in config.get_descriptors(
            "reading a configuration's knobs",
            ATTR_ENGINECFG_KNOB_CHOICES,
            KNOB_CHOICE_DESCRIPTOR,
            MAX_KNOBS,
        )? {
            let knob: Vec<c_int> = choice.get(
                "reading a knob's type",
                ATTR_KNOB_CHOICE_KNOB_TYPE,
                TYPE_KNOB_TYPE,
                1,
            )?;
            let value: Vec<i64> = choice.get(
                "reading a knob's value",
                ATTR_KNOB_CHOICE_KNOB_VALUE,
                TYPE_INT64,
                1,
            )?;
            if let (Some(k), Some(v)) = (knob.first(), value.first()) {
                knobs.push((*k, *v));
            }
        }
        knobs.sort_unstable();
        Ok((
            EngineInfo {
                index,
                knobs,
                tensor_cores: notes.contains(&NOTE_TENSOR_CORE),
                runtime_compiled: behaviour.contains(&BEHAVIOR_RUNTIME_COMPILATION),
                heuristic,
            },
            notes,
        ))
    }

    /// Up to `limit` engines the heuristics propose (modes A, then B, then fallback;
    /// each configuration once) that compute at the task's precision and whose plan
    /// finalizes, with a line per configuration passed over (why) for the report.
    pub fn engines(&self, limit: usize) -> (Vec<Engine>, Vec<String>) {
        let mut engines: Vec<Engine> = Vec::new();
        let mut skipped = Vec::new();
        let mut seen: Vec<(i64, Vec<(c_int, i64)>)> = Vec::new();
        for heuristic in [Heuristic::A, Heuristic::B, Heuristic::Fallback] {
            let configs = match self.configurations(heuristic) {
                Ok(c) => c,
                Err(e) => {
                    skipped.push(format!("heuristic {}: {e}", heuristic.label()));
                    continue;
                }
            };
            for config in configs {
                if engines.len() >= limit {
                    return (engines, skipped);
                }
                let (info, notes) = match self.describe_config(&config, heuristic) {
                    Ok(d) => d,
                    Err(e) => {
                        skipped.push(format!("heuristic {}: {e}", heuristic.label()));
                        continue;
                    }
                };
                let key = (info.index, info.knobs.clone());
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                if let Err(why) = admits(self.spec.dtype, &notes) {
                    skipped.push(format!("{}: {why}", info.name()));
                    continue;
                }
                match self.plan(config, info) {
                    Ok(engine) => engines.push(engine),
                    Err((info, e)) => skipped.push(format!("{}: {e}", info.name())),
                }
            }
        }
        (engines, skipped)
    }

    fn plan(&self, config: Desc, info: EngineInfo) -> Result<Engine, (EngineInfo, VendorError)> {
        let build = || -> Result<(Desc, usize), VendorError> {
            let plan = Desc::new(self.api, EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set(
                "plan handle",
                ATTR_EXECUTION_PLAN_HANDLE,
                TYPE_HANDLE,
                &[self.handle.raw],
            )?;
            plan.set(
                "plan configuration",
                ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                TYPE_BACKEND_DESCRIPTOR,
                &[config.raw],
            )?;
            plan.finalize("finalizing an execution plan")?;
            let workspace = plan
                .get::<i64>(
                    "reading a plan's workspace",
                    ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                    TYPE_INT64,
                    1,
                )?
                .first()
                .copied()
                .unwrap_or(0);
            Ok((plan, usize::try_from(workspace).unwrap_or(0)))
        };
        match build() {
            Ok((plan, workspace_bytes)) => Ok(Engine {
                info,
                workspace_bytes,
                plan,
                _config: config,
            }),
            Err(e) => Err((info, e)),
        }
    }

    /// Enqueues the graph with `engine` on `buffers` (x, w, the bias where the graph adds
    /// it, y: as [`GraphSpec::io_uids`]); `workspace` holds at least the engine's need.
    pub fn execute(
        &self,
        engine: &Engine,
        buffers: &[&Buffer],
        workspace: &Buffer,
    ) -> Result<(), VendorError> {
        let uids = self.spec.io_uids();
        if buffers.len() != uids.len() || workspace.bytes() < engine.workspace_bytes {
            return Err(VendorError::Call {
                call: "cudnnBackendExecute",
                status: format!(
                    "{} buffers for {} tensors, or a workspace under the engine's {} bytes",
                    buffers.len(),
                    uids.len(),
                    engine.workspace_bytes
                ),
            });
        }
        // Keyed by the pointers (unused slots 0) and the workspace: once the rotation's
        // packs exist, a launch costs a lookup, not descriptor calls.
        let mut key = [0u64; 5];
        for (k, b) in key.iter_mut().zip(buffers) {
            *k = b.device_ptr();
        }
        key[4] = workspace.device_ptr();
        let mut packs = self.packs.borrow_mut();
        let pack = match packs.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                e.insert(self.variant_pack(&uids, &key[..uids.len()], workspace)?)
            }
        };
        // SAFETY: the plan and the pack are finalized; the pack's pointers are the
        // caller's live buffers, sized by the task the graph was built from.
        check_status("cudnnBackendExecute", unsafe {
            (self.api.cudnnBackendExecute)(self.handle.raw, engine.plan.raw, pack.raw)
        })
    }

    /// A variant pack binding `uids` to `pointers` with `workspace`.
    fn variant_pack(
        &self,
        uids: &[i64],
        pointers: &[u64],
        workspace: &Buffer,
    ) -> Result<Desc, VendorError> {
        let pack = Desc::new(self.api, VARIANT_PACK_DESCRIPTOR)?;
        let pointers: Vec<*mut c_void> = pointers.iter().map(|&p| p as *mut c_void).collect();
        pack.set(
            "variant pack uids",
            ATTR_VARIANT_PACK_UNIQUE_IDS,
            TYPE_INT64,
            uids,
        )?;
        pack.set(
            "variant pack pointers",
            ATTR_VARIANT_PACK_DATA_POINTERS,
            TYPE_VOID_PTR,
            &pointers,
        )?;
        pack.set(
            "variant pack workspace",
            ATTR_VARIANT_PACK_WORKSPACE,
            TYPE_VOID_PTR,
            &[workspace.device_ptr() as *mut c_void],
        )?;
        pack.finalize("finalizing a variant pack")?;
        Ok(pack)
    }

    /// The routine for reports, e.g. `cuDNN 9.19.0 graph eng12 {TILE_SIZE=3}
    /// (tensor-core, heuristic A) conv+bias+relu fp16 NHWC`.
    pub fn describe(&self, engine: &Engine) -> String {
        let types = if self.spec.out_dtype == self.spec.dtype
            || (self.spec.dtype == DType::Tf32 && self.spec.out_dtype == DType::F32)
        {
            self.spec.dtype.to_string()
        } else {
            format!("{}→{}", self.spec.dtype, self.spec.out_dtype)
        };
        format!(
            "cuDNN {} graph {} ({}) {} {types} {}",
            self.handle.version(),
            engine.info.name(),
            engine.info.notes(),
            self.spec.label(),
            self.spec.layout.name().to_uppercase()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use schedule::Epilogue;

    fn conv_task(
        shape: Conv2d,
        epilogue: Epilogue,
        dtype: DType,
        out: DType,
        layout: Layout,
    ) -> Task {
        Task {
            op: Operator::Conv2d(shape),
            epilogue,
            dtype,
            out_dtype: out,
            layout,
        }
    }

    const FUSED: GraphForm = GraphForm {
        fuse_epilogue: true,
        identity_tail: false,
    };
    const ALONE: GraphForm = GraphForm {
        fuse_epilogue: false,
        identity_tail: false,
    };

    #[test]
    fn nhwc_conv_dims_strides_and_types() {
        let shape = Conv2d::new(1, 64, 56, 56, 256, 1, 1, 1, 0);
        let t = conv_task(
            shape,
            Epilogue::default(),
            DType::Fp16,
            DType::Fp16,
            Layout::Nhwc,
        );
        let g = GraphSpec::for_task(&t, FUSED).unwrap();
        assert_eq!(g.ops.len(), 1, "no epilogue: the convolution alone");
        let [x, w, y] = [&g.tensors[0], &g.tensors[1], &g.tensors[2]];
        assert_eq!(
            (x.dims, x.strides),
            ([1, 64, 56, 56], [56 * 56 * 64, 1, 56 * 64, 64])
        );
        // KRSC filters.
        assert_eq!((w.dims, w.strides), ([256, 64, 1, 1], [64, 1, 64, 64]));
        assert_eq!(
            (y.dims, y.uid, y.is_virtual),
            ([1, 256, 56, 56], UID_Y, false)
        );
        assert!(g.tensors.iter().all(|t| t.data_type == DATA_HALF));
        assert_eq!(g.compute_type, DATA_FLOAT);
        assert_eq!(g.io_uids(), vec![UID_X, UID_W, UID_Y]);
        assert_eq!(g.label(), "conv");
        assert!(g.computes_epilogue);
    }

    #[test]
    fn nchw_grouped_dilated_asymmetric() {
        let mut shape = Conv2d::new(2, 32, 20, 30, 64, 3, 3, 2, 1);
        shape.groups = 4;
        shape.dilation_h = 2;
        shape.pad_bottom = Some(2);
        let t = conv_task(
            shape,
            Epilogue::default(),
            DType::F32,
            DType::F32,
            Layout::Nchw,
        );
        let g = GraphSpec::for_task(&t, FUSED).unwrap();
        let w = &g.tensors[1];
        assert_eq!(
            (w.dims, w.strides),
            ([64, 8, 3, 3], [72, 9, 3, 1]),
            "C/G per filter"
        );
        let (p, q) = shape.output_size().unwrap();
        assert_eq!(g.tensors[2].dims, [2, 64, i64::from(p), i64::from(q)]);
        let OpSpec::Conv {
            pre_paddings,
            post_paddings,
            strides,
            dilations,
            ..
        } = &g.ops[0]
        else {
            panic!("the first operation is the convolution");
        };
        assert_eq!((*pre_paddings, *post_paddings), ([1, 1], [2, 1]));
        assert_eq!((*strides, *dilations), ([2, 2], [2, 1]));
        assert!(g.tensors.iter().all(|t| t.data_type == DATA_FLOAT));
    }

    #[test]
    fn fused_bias_relu_chain_through_virtual_float_tensors() {
        let shape = Conv2d::new(1, 64, 28, 28, 128, 3, 3, 1, 1);
        let both = Epilogue {
            bias: true,
            relu: true,
        };
        let t = conv_task(shape, both, DType::Bf16, DType::Bf16, Layout::Nhwc);
        let g = GraphSpec::for_task(&t, FUSED).unwrap();
        assert_eq!(g.label(), "conv+bias+relu");
        assert_eq!(g.io_uids(), vec![UID_X, UID_W, UID_BIAS, UID_Y]);
        let by_uid = |uid| g.tensors.iter().position(|t| t.uid == uid).unwrap();
        let (conv, biased) = (by_uid(101), by_uid(102));
        assert!(g.tensors[conv].is_virtual && g.tensors[biased].is_virtual);
        assert_eq!(g.tensors[conv].data_type, DATA_FLOAT);
        assert_eq!(g.tensors[by_uid(UID_BIAS)].dims, [1, 128, 1, 1]);
        assert_eq!(g.tensors[by_uid(UID_Y)].data_type, DATA_BFLOAT16);
        assert_eq!(
            g.ops[1..],
            [
                OpSpec::Pointwise {
                    mode: Pointwise::Add,
                    x: conv,
                    b: Some(by_uid(UID_BIAS)),
                    y: biased
                },
                OpSpec::Pointwise {
                    mode: Pointwise::Relu,
                    x: biased,
                    b: None,
                    y: by_uid(UID_Y)
                }
            ]
        );
        let alone = GraphSpec::for_task(&t, ALONE).unwrap();
        assert_eq!(alone.label(), "conv");
        assert!(!alone.computes_epilogue, "the bias and ReLU are left out");
        assert_eq!(alone.io_uids(), vec![UID_X, UID_W, UID_Y]);
    }

    #[test]
    fn half_input_float_output() {
        let shape = Conv2d::new(1, 16, 8, 8, 16, 3, 3, 1, 1);
        let t = conv_task(
            shape,
            Epilogue::default(),
            DType::Fp16,
            DType::F32,
            Layout::Nhwc,
        );
        let direct = GraphSpec::for_task(&t, FUSED).unwrap();
        assert_eq!(direct.tensors[0].data_type, DATA_HALF);
        assert_eq!(direct.tensors[2].data_type, DATA_FLOAT);
        let tail = GraphSpec::for_task(
            &t,
            GraphForm {
                fuse_epilogue: true,
                identity_tail: true,
            },
        )
        .unwrap();
        assert_eq!(tail.label(), "conv+convert");
        assert_eq!(tail.ops.len(), 2);
    }

    #[test]
    fn matmul_has_no_graph_here() {
        let t = Task {
            op: Operator::Matmul { m: 1, n: 2, k: 3 },
            epilogue: Epilogue::default(),
            dtype: DType::Fp16,
            out_dtype: DType::Fp16,
            layout: Layout::Nchw,
        };
        assert!(matches!(
            GraphSpec::for_task(&t, FUSED),
            Err(VendorError::Unsupported { .. })
        ));
    }

    #[test]
    fn precision_rules_of_engines() {
        assert!(admits(DType::Fp16, &[NOTE_TENSOR_CORE]).is_ok());
        assert!(admits(DType::Tf32, &[NOTE_TENSOR_CORE]).is_ok());
        assert!(admits(DType::F32, &[]).is_ok());
        assert!(admits(DType::F32, &[NOTE_TENSOR_CORE]).is_err());
        assert!(
            admits(
                DType::Fp16,
                &[NOTE_TENSOR_CORE, NOTE_REDUCED_PRECISION_REDUCTION]
            )
            .is_err()
        );
        assert!(admits(DType::Bf16, &[NOTE_DOWN_CONVERT_INPUTS]).is_err());
    }

    #[test]
    fn engine_names_like_the_frontend() {
        let info = EngineInfo {
            index: 12,
            knobs: vec![(2, 3), (14, 4), (99, 1)],
            tensor_cores: true,
            runtime_compiled: true,
            heuristic: Heuristic::B,
        };
        assert_eq!(info.name(), "eng12 {TILE_SIZE=3 STAGES=4 KNOB_99=1}");
        assert_eq!(info.notes(), "tensor-core, runtime-compiled, heuristic B");
        let plain = EngineInfo {
            knobs: vec![],
            tensor_cores: false,
            runtime_compiled: false,
            heuristic: Heuristic::Fallback,
            ..info
        };
        assert_eq!(plain.name(), "eng12");
        assert_eq!(plain.notes(), "no-tensor-core, heuristic fallback");
    }

    #[test]
    fn knob_table_is_sorted_and_unique() {
        assert!(KNOB_NAMES.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
