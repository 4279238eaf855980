//! The cuDNN baseline for conv2d: `cudnnConvolutionForward` at the task's precision and
//! layout, on the measuring context's stream, with every algorithm that cuDNN's own
//! search (`cudnnFindConvolutionForwardAlgorithmEx`) returns available for timing.
//!
//! Per element type (see [`ConvMath::for_types`]): float32 runs with FMA math only (no
//! TF32, which cuDNN's default math allows on Ampere and later); TF32 is float32 data
//! with cuDNN's default math, which permits TF32 tensor cores (as PyTorch asks for it:
//! on an H100 with cuDNN 9.19, inputs `1 + 2^-11` came out TF32-rounded from
//! IMPLICIT_PRECOMP_GEMM under default math, 3.6x faster than under FMA math for a
//! 128-channel 3x3 layer, and tensor-op math offered nothing faster); fp16 and bf16 use
//! tensor-op math with float accumulation (cuDNN's "pseudo half" configurations). Tensors are NCHW (KCRS weights) or NHWC (KRSC weights) as the task
//! says. cuDNN's legacy API stores the output in the input's type, so a half-precision
//! task with a float32 output has no cuDNN routine: that is reported, not approximated.
//!
//! The functions are resolved from the copy `vendor::load` opened, never by name through
//! the loader (which could reach another copy).

use crate::vendor::{self, Library, VendorError, Version};
use gpu::cuda::{Buffer, Context};
use schedule::task::Conv2d;
use schedule::{DType, Epilogue, Layout, Operator, Task};
use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

type Handle = *mut c_void;
type Descriptor = *mut c_void;
type Status = c_int;

const SUCCESS: Status = 0;
// cudnnDataType_t
const DATA_FLOAT: c_int = 0;
const DATA_HALF: c_int = 2;
const DATA_BFLOAT16: c_int = 9;
// cudnnTensorFormat_t
const TENSOR_NCHW: c_int = 0;
const TENSOR_NHWC: c_int = 1;
const CROSS_CORRELATION: c_int = 1;

/// `cudnnMathType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MathType {
    Default = 0,
    TensorOp = 1,
    TensorOpAllowConversion = 2,
    Fma = 3,
}

impl MathType {
    fn from_raw(raw: c_int) -> Option<MathType> {
        [
            MathType::Default,
            MathType::TensorOp,
            MathType::TensorOpAllowConversion,
            MathType::Fma,
        ]
        .into_iter()
        .find(|m| *m as c_int == raw)
    }

    /// How reports name it.
    pub fn label(self) -> &'static str {
        match self {
            MathType::Default => "default-math",
            MathType::TensorOp => "tensor-op",
            MathType::TensorOpAllowConversion => "tensor-op-conversion",
            MathType::Fma => "fma",
        }
    }
}

/// `cudnnConvolutionFwdAlgoPerf_t`, with its enums as plain integers: a value this
/// build does not know (a newer cuDNN's) must not be read into a Rust enum.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwdPerf {
    algo: c_int,
    status: Status,
    time: f32,
    memory: usize,
    determinism: c_int,
    math_type: c_int,
    reserved: [c_int; 3],
}

functions! {
    /// The cuDNN functions the baseline calls (`cudnn.h`, cuDNN 9).
    struct Api in None;
    fn cudnnGetVersion() -> usize;
    fn cudnnGetErrorString(Status) -> *const c_char;
    fn cudnnCreate(*mut Handle) -> Status;
    fn cudnnDestroy(Handle) -> Status;
    fn cudnnSetStream(Handle, *mut c_void) -> Status;
    fn cudnnCreateTensorDescriptor(*mut Descriptor) -> Status;
    fn cudnnDestroyTensorDescriptor(Descriptor) -> Status;
    fn cudnnCreateFilterDescriptor(*mut Descriptor) -> Status;
    fn cudnnDestroyFilterDescriptor(Descriptor) -> Status;
    fn cudnnCreateConvolutionDescriptor(*mut Descriptor) -> Status;
    fn cudnnDestroyConvolutionDescriptor(Descriptor) -> Status;
    fn cudnnSetTensor4dDescriptor(Descriptor, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
    fn cudnnSetFilter4dDescriptor(Descriptor, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
    fn cudnnSetConvolution2dDescriptor(
        Descriptor, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int
    ) -> Status;
    fn cudnnSetConvolutionMathType(Descriptor, c_int) -> Status;
    fn cudnnSetConvolutionGroupCount(Descriptor, c_int) -> Status;
    fn cudnnGetConvolutionForwardAlgorithmMaxCount(Handle, *mut c_int) -> Status;
    fn cudnnFindConvolutionForwardAlgorithmEx(
        Handle, Descriptor, *const c_void, Descriptor, *const c_void, Descriptor, Descriptor,
        *mut c_void, c_int, *mut c_int, *mut FwdPerf, *mut c_void, usize
    ) -> Status;
    fn cudnnConvolutionForward(
        Handle, *const c_void, Descriptor, *const c_void, Descriptor, *const c_void,
        Descriptor, c_int, *mut c_void, usize, *const c_void, Descriptor, *mut c_void
    ) -> Status;
    fn cudnnAddTensor(
        Handle, *const c_void, Descriptor, *const c_void, *const c_void, Descriptor, *mut c_void
    ) -> Status;
    fn cudnnCreateActivationDescriptor(*mut Descriptor) -> Status;
    fn cudnnDestroyActivationDescriptor(Descriptor) -> Status;
    fn cudnnSetActivationDescriptor(Descriptor, c_int, c_int, f64) -> Status;
    fn cudnnActivationForward(
        Handle, Descriptor, *const c_void, Descriptor, *const c_void, *const c_void,
        Descriptor, *mut c_void
    ) -> Status;
}

/// `CUDNN_ACTIVATION_RELU`, `CUDNN_NOT_PROPAGATE_NAN`.
const ACTIVATION_RELU: c_int = 1;
const NOT_PROPAGATE_NAN: c_int = 0;

/// The functions of the loaded cuDNN, resolved once.
fn api() -> Result<&'static Api, VendorError> {
    static API: OnceLock<Api> = OnceLock::new();
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let loaded = vendor::loaded(Library::Cudnn).ok_or(VendorError::NotLoaded {
        lib: Library::Cudnn,
    })?;
    let resolved = Api::resolve(loaded)?;
    Ok(API.get_or_init(|| resolved))
}

/// `Ok` for success, else the call's name with cuDNN's text for the status (shared with
/// the graph API, whose calls return the same `cudnnStatus_t`).
pub(crate) fn check_status(call: &'static str, status: Status) -> Result<(), VendorError> {
    check(api()?, call, status)
}

/// A cuDNN handle bound to a context's stream, destroyed on drop (the graph API's
/// plans and executions take one).
pub(crate) struct CudnnHandle {
    api: &'static Api,
    pub(crate) raw: Handle,
}

impl CudnnHandle {
    pub(crate) fn new(ctx: &Context) -> Result<CudnnHandle, VendorError> {
        let api = api()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a handle; cuDNN initializes it on the current context.
        check(api, "cudnnCreate", unsafe { (api.cudnnCreate)(&mut raw) })?;
        let this = CudnnHandle { api, raw };
        // SAFETY: live handle; the raw stream belongs to the current context.
        check(api, "cudnnSetStream", unsafe {
            (api.cudnnSetStream)(this.raw, ctx.raw_stream().cast())
        })?;
        Ok(this)
    }

    /// The loaded cuDNN's version, e.g. "9.19.0".
    pub(crate) fn version(&self) -> String {
        version_of(self.api)
    }
}

impl Drop for CudnnHandle {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe {
            (self.api.cudnnDestroy)(self.raw);
        }
    }
}

fn check(api: &Api, call: &'static str, status: Status) -> Result<(), VendorError> {
    if status == SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status,
    // known or not.
    let text = unsafe { CStr::from_ptr((api.cudnnGetErrorString)(status)) };
    Err(VendorError::Call {
        call,
        status: text.to_string_lossy().into_owned(),
    })
}

/// How cuDNN is asked to compute a task: the descriptors' element types, the math type
/// and the tensor format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvMath {
    /// The task's input type (TF32 is stored as float).
    pub dtype: DType,
    pub layout: Layout,
    /// `cudnnDataType_t` of x, w and y.
    pub data_type: c_int,
    /// `cudnnDataType_t` of the accumulation (the convolution descriptor's).
    pub compute_type: c_int,
    /// The math type the descriptor starts with (each algorithm runs with the one
    /// cuDNN's find reports for it).
    pub math: MathType,
    /// `cudnnTensorFormat_t` of x, w and y.
    pub format: c_int,
}

impl ConvMath {
    /// The cuDNN configuration of a conv2d with these types; `Unsupported` where the
    /// legacy API has none (an output type other than the input's).
    pub fn for_types(
        dtype: DType,
        out_dtype: DType,
        layout: Layout,
    ) -> Result<ConvMath, VendorError> {
        let (data_type, math) = match dtype {
            DType::F32 => (DATA_FLOAT, MathType::Fma),
            // cuDNN permits TF32 on float data under its default math (the mode
            // PyTorch's allow_tf32 selects); FMA math would forbid it.
            DType::Tf32 => (DATA_FLOAT, MathType::Default),
            DType::Fp16 => (DATA_HALF, MathType::TensorOp),
            DType::Bf16 => (DATA_BFLOAT16, MathType::TensorOp),
        };
        if out_dtype.bytes() != dtype.bytes() {
            return Err(VendorError::Unsupported {
                lib: Library::Cudnn,
                what: format!(
                    "a {dtype} convolution with a {out_dtype} output (cudnnConvolutionForward writes the input's type; bench with --out-dtype {dtype})"
                ),
            });
        }
        Ok(ConvMath {
            dtype,
            layout,
            data_type,
            compute_type: DATA_FLOAT,
            math,
            format: match layout {
                Layout::Nchw => TENSOR_NCHW,
                Layout::Nhwc => TENSOR_NHWC,
            },
        })
    }

    /// Whether an algorithm cuDNN's find returns with `math` computes at the task's
    /// precision: float32 excludes tensor ops (TF32 would round its inputs), and no type
    /// allows converting the data down to a narrower type.
    pub fn accepts(&self, math: MathType) -> bool {
        !matches!(
            (self.dtype, math),
            (_, MathType::TensorOpAllowConversion) | (DType::F32, MathType::TensorOp)
        )
    }
}

/// An algorithm cuDNN can run for the shape, with what its own benchmark measured.
#[derive(Debug, Clone, Copy)]
pub struct Algorithm {
    /// `cudnnConvolutionFwdAlgo_t`.
    pub algo: c_int,
    /// The math type cuDNN's find ran it with, which it must run with again.
    pub math: MathType,
    pub workspace_bytes: usize,
    /// cuDNN's own time (ms) from `cudnnFindConvolutionForwardAlgorithmEx`.
    pub find_ms: f32,
}

/// `cudnnConvolutionFwdAlgo_t` names, by value.
const ALGORITHMS: [&str; 8] = [
    "IMPLICIT_GEMM",
    "IMPLICIT_PRECOMP_GEMM",
    "GEMM",
    "DIRECT",
    "FFT",
    "FFT_TILING",
    "WINOGRAD",
    "WINOGRAD_NONFUSED",
];

impl Algorithm {
    /// The algorithm's name without the enum prefix, e.g. `IMPLICIT_PRECOMP_GEMM`.
    pub fn name(&self) -> String {
        usize::try_from(self.algo)
            .ok()
            .and_then(|i| ALGORITHMS.get(i))
            .map_or_else(|| format!("ALGO_{}", self.algo), |n| n.to_string())
    }
}

/// One convolution shape set up in cuDNN.
pub struct CudnnConv {
    api: &'static Api,
    handle: Handle,
    x: Descriptor,
    w: Descriptor,
    y: Descriptor,
    conv: Descriptor,
    /// The task's fused epilogue, run after the convolution as a cuDNN user without
    /// fusion would: `cudnnAddTensor` of a `1×K×1×1` bias (null: no bias), then an
    /// in-place `cudnnActivationForward` ReLU (null: none).
    bias: Descriptor,
    relu: Descriptor,
    math: ConvMath,
    /// The convolution descriptor's current math type (set per algorithm).
    current_math: Cell<MathType>,
}

fn int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

impl CudnnConv {
    /// Describes `shape` to cuDNN in float32 NCHW with FMA math; work is enqueued on
    /// `ctx`'s stream.
    pub fn new(ctx: &Context, shape: &Conv2d) -> Result<CudnnConv, VendorError> {
        let math = ConvMath::for_types(DType::F32, DType::F32, Layout::Nchw)?;
        CudnnConv::with_math(ctx, shape, math)
    }

    /// Describes a conv2d `task` (its shape, types and layout) to cuDNN.
    pub fn for_task(ctx: &Context, task: &Task) -> Result<CudnnConv, VendorError> {
        let Operator::Conv2d(shape) = &task.op else {
            return Err(VendorError::Unsupported {
                lib: Library::Cudnn,
                what: format!("{} (a conv2d baseline)", task.op.name()),
            });
        };
        let math = ConvMath::for_types(task.dtype, task.out_dtype, task.layout)?;
        let mut conv = CudnnConv::with_math(ctx, shape, math)?;
        conv.set_epilogue(shape.k, task.epilogue)?;
        Ok(conv)
    }

    /// Describes the bias tensor (in the data's type and format) and the ReLU.
    fn set_epilogue(&mut self, k: u32, epilogue: Epilogue) -> Result<(), VendorError> {
        let api = self.api;
        // SAFETY: out-pointers to descriptors owned by `self` (destroyed in `Drop`);
        // each set call gets the descriptor created just before it.
        unsafe {
            if epilogue.bias {
                check(
                    api,
                    "cudnnCreateTensorDescriptor(bias)",
                    (api.cudnnCreateTensorDescriptor)(&mut self.bias),
                )?;
                check(
                    api,
                    "cudnnSetTensor4dDescriptor(bias)",
                    (api.cudnnSetTensor4dDescriptor)(
                        self.bias,
                        self.math.format,
                        self.math.data_type,
                        1,
                        int(k),
                        1,
                        1,
                    ),
                )?;
            }
            if epilogue.relu {
                check(
                    api,
                    "cudnnCreateActivationDescriptor",
                    (api.cudnnCreateActivationDescriptor)(&mut self.relu),
                )?;
                check(
                    api,
                    "cudnnSetActivationDescriptor",
                    (api.cudnnSetActivationDescriptor)(
                        self.relu,
                        ACTIVATION_RELU,
                        NOT_PROPAGATE_NAN,
                        0.0,
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// Whether the convolution adds a bias (its run needs the bias buffer).
    pub fn has_bias(&self) -> bool {
        !self.bias.is_null()
    }

    /// Describes `shape` to cuDNN with `math`; work is enqueued on `ctx`'s stream.
    pub fn with_math(
        ctx: &Context,
        shape: &Conv2d,
        math: ConvMath,
    ) -> Result<CudnnConv, VendorError> {
        let api = api()?;
        if shape.pad_bottom.is_some() || shape.pad_right.is_some() {
            // cuDNN pads both sides alike and derives the output size from that.
            return Err(VendorError::Unsupported {
                lib: Library::Cudnn,
                what: "a convolution whose bottom/right padding differs from its top/left"
                    .to_string(),
            });
        }
        let (p, q) = shape.output_size().map_err(|e| VendorError::Call {
            call: "output size",
            status: e.to_string(),
        })?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a handle; cuDNN initializes it on the current context.
        check(api, "cudnnCreate", unsafe {
            (api.cudnnCreate)(&mut handle)
        })?;
        let mut this = CudnnConv {
            api,
            handle,
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            bias: std::ptr::null_mut(),
            relu: std::ptr::null_mut(),
            math,
            current_math: Cell::new(math.math),
        };
        let s = shape;
        let (data, format) = (math.data_type, math.format);
        // SAFETY: each call gets a live handle or a descriptor created just before; the
        // raw stream belongs to the current context. `Drop` destroys what was created
        // if a later call fails.
        unsafe {
            check(
                api,
                "cudnnSetStream",
                (api.cudnnSetStream)(this.handle, ctx.raw_stream().cast()),
            )?;
            check(
                api,
                "cudnnCreateTensorDescriptor",
                (api.cudnnCreateTensorDescriptor)(&mut this.x),
            )?;
            check(
                api,
                "cudnnCreateTensorDescriptor",
                (api.cudnnCreateTensorDescriptor)(&mut this.y),
            )?;
            check(
                api,
                "cudnnCreateFilterDescriptor",
                (api.cudnnCreateFilterDescriptor)(&mut this.w),
            )?;
            check(
                api,
                "cudnnCreateConvolutionDescriptor",
                (api.cudnnCreateConvolutionDescriptor)(&mut this.conv),
            )?;
            // The 4-d descriptors take N, C, H, W whatever the format; the format says
            // how they lie in memory (NHWC filters: K, R, S, C).
            check(
                api,
                "cudnnSetTensor4dDescriptor(x)",
                (api.cudnnSetTensor4dDescriptor)(
                    this.x,
                    format,
                    data,
                    int(s.n),
                    int(s.c),
                    int(s.h),
                    int(s.w),
                ),
            )?;
            check(
                api,
                "cudnnSetFilter4dDescriptor",
                (api.cudnnSetFilter4dDescriptor)(
                    this.w,
                    data,
                    format,
                    int(s.k),
                    int(s.group_channels().0),
                    int(s.r),
                    int(s.s),
                ),
            )?;
            check(
                api,
                "cudnnSetTensor4dDescriptor(y)",
                (api.cudnnSetTensor4dDescriptor)(
                    this.y,
                    format,
                    data,
                    int(s.n),
                    int(s.k),
                    int(p),
                    int(q),
                ),
            )?;
            check(
                api,
                "cudnnSetConvolution2dDescriptor",
                (api.cudnnSetConvolution2dDescriptor)(
                    this.conv,
                    int(s.pad_h),
                    int(s.pad_w),
                    int(s.stride_h),
                    int(s.stride_w),
                    int(s.dilation_h),
                    int(s.dilation_w),
                    CROSS_CORRELATION,
                    math.compute_type,
                ),
            )?;
            check(
                api,
                "cudnnSetConvolutionMathType",
                (api.cudnnSetConvolutionMathType)(this.conv, math.math as c_int),
            )?;
            // Grouped and depthwise convolutions: the filter holds C/G input channels.
            check(
                api,
                "cudnnSetConvolutionGroupCount",
                (api.cudnnSetConvolutionGroupCount)(this.conv, int(s.groups)),
            )?;
        }
        Ok(this)
    }

    /// The configuration this convolution was described with.
    pub fn math(&self) -> &ConvMath {
        &self.math
    }

    fn set_math(&self, math: MathType) -> Result<(), VendorError> {
        if self.current_math.get() == math {
            return Ok(());
        }
        // SAFETY: live descriptor; the value is a valid cudnnMathType_t.
        check(self.api, "cudnnSetConvolutionMathType", unsafe {
            (self.api.cudnnSetConvolutionMathType)(self.conv, math as c_int)
        })?;
        self.current_math.set(math);
        Ok(())
    }

    /// Every algorithm that ran for this shape at the task's precision (see
    /// [`ConvMath::accepts`]), fastest first by cuDNN's own benchmark on the given
    /// buffers (`[x, w, y]`); `workspace` bounds the workspace an algorithm may use.
    pub fn algorithms(
        &self,
        buffers: [&Buffer; 3],
        workspace: &Buffer,
    ) -> Result<Vec<Algorithm>, VendorError> {
        let api = self.api;
        self.set_math(self.math.math)?;
        let mut max = 0;
        // SAFETY: live handle and out-pointer.
        check(api, "cudnnGetConvolutionForwardAlgorithmMaxCount", unsafe {
            (api.cudnnGetConvolutionForwardAlgorithmMaxCount)(self.handle, &mut max)
        })?;
        let mut perf = vec![FwdPerf::default(); max.max(1) as usize];
        let mut returned = 0;
        let [x, w, y] = buffers;
        // SAFETY: descriptors match the buffers' sizes (the caller allocates them from
        // the same task); `perf` has room for `max` results.
        check(api, "cudnnFindConvolutionForwardAlgorithmEx", unsafe {
            (api.cudnnFindConvolutionForwardAlgorithmEx)(
                self.handle,
                self.x,
                x.device_ptr() as *const c_void,
                self.w,
                w.device_ptr() as *const c_void,
                self.conv,
                self.y,
                y.device_ptr() as *mut c_void,
                max,
                &mut returned,
                perf.as_mut_ptr(),
                workspace.device_ptr() as *mut c_void,
                workspace.bytes(),
            )
        })?;
        Ok(perf
            .iter()
            .take(returned.clamp(0, max) as usize)
            .filter(|p| p.status == SUCCESS)
            .filter_map(|p| {
                let math = MathType::from_raw(p.math_type)?;
                self.math.accepts(math).then_some(Algorithm {
                    algo: p.algo,
                    math,
                    workspace_bytes: p.memory,
                    find_ms: p.time,
                })
            })
            .collect())
    }

    /// Enqueues `y = conv(x, w)` with `algorithm`, then the epilogue the convolution
    /// was described with (`bias` must be given when it adds one).
    pub fn run(
        &self,
        algorithm: &Algorithm,
        buffers: [&Buffer; 3],
        bias: Option<&Buffer>,
        workspace: &Buffer,
    ) -> Result<(), VendorError> {
        self.convolve(algorithm, buffers, workspace)?;
        self.epilogue(buffers[2], bias)
    }

    pub(crate) fn epilogue(&self, y: &Buffer, bias: Option<&Buffer>) -> Result<(), VendorError> {
        let api = self.api;
        let (one, zero) = (1.0f32, 0.0f32);
        if self.has_bias() {
            let bias = bias.ok_or_else(|| VendorError::Call {
                call: "cudnnAddTensor",
                status: "no bias buffer for a convolution with a bias".to_string(),
            })?;
            // SAFETY: live handle and descriptors; `bias` holds K elements and `y` the
            // output, both of the described type (the caller allocates them per task).
            check(api, "cudnnAddTensor", unsafe {
                (api.cudnnAddTensor)(
                    self.handle,
                    (&one as *const f32).cast(),
                    self.bias,
                    bias.device_ptr() as *const c_void,
                    (&one as *const f32).cast(),
                    self.y,
                    y.device_ptr() as *mut c_void,
                )
            })?;
        }
        if !self.relu.is_null() {
            // SAFETY: in-place activation over `y` as described by `self.y`.
            check(api, "cudnnActivationForward", unsafe {
                (api.cudnnActivationForward)(
                    self.handle,
                    self.relu,
                    (&one as *const f32).cast(),
                    self.y,
                    y.device_ptr() as *const c_void,
                    (&zero as *const f32).cast(),
                    self.y,
                    y.device_ptr() as *mut c_void,
                )
            })?;
        }
        Ok(())
    }

    /// Enqueues `y = conv(x, w)` with `algorithm`, without the epilogue (what the
    /// benchmark times: see `Baseline::run_timed`).
    pub fn convolve(
        &self,
        algorithm: &Algorithm,
        buffers: [&Buffer; 3],
        workspace: &Buffer,
    ) -> Result<(), VendorError> {
        let api = self.api;
        self.set_math(algorithm.math)?;
        // Float scaling factors for every configuration here (the compute type is float).
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [x, w, y] = buffers;
        // SAFETY: as in `algorithms`; the workspace holds at least the algorithm's need
        // (checked by the caller, which sizes it from `Algorithm::workspace_bytes`).
        check(api, "cudnnConvolutionForward", unsafe {
            (api.cudnnConvolutionForward)(
                self.handle,
                (&alpha as *const f32).cast(),
                self.x,
                x.device_ptr() as *const c_void,
                self.w,
                w.device_ptr() as *const c_void,
                self.conv,
                algorithm.algo,
                workspace.device_ptr() as *mut c_void,
                workspace.bytes(),
                (&beta as *const f32).cast(),
                self.y,
                y.device_ptr() as *mut c_void,
            )
        })
    }

    /// The routine for reports: library, version, algorithm, math, type and layout,
    /// e.g. `cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM tensor-op fp16 NHWC`.
    pub fn describe(&self, algorithm: &Algorithm) -> String {
        routine(
            &version_of(self.api),
            &algorithm.name(),
            algorithm.math,
            self.math.dtype,
            self.math.layout,
        )
    }
}

/// `cuDNN <version> <algorithm> <math> <dtype> <LAYOUT>`.
pub fn routine(
    version: &str,
    algorithm: &str,
    math: MathType,
    dtype: DType,
    layout: Layout,
) -> String {
    format!(
        "cuDNN {version} {algorithm} {} {dtype} {}",
        math.label(),
        layout.name().to_uppercase()
    )
}

impl Drop for CudnnConv {
    fn drop(&mut self) {
        let api = self.api;
        // SAFETY: each descriptor was created by `with_math` (or is null, which cuDNN's
        // destroy functions accept) and is destroyed once, before the handle.
        unsafe {
            (api.cudnnDestroyTensorDescriptor)(self.x);
            (api.cudnnDestroyTensorDescriptor)(self.y);
            (api.cudnnDestroyTensorDescriptor)(self.bias);
            (api.cudnnDestroyActivationDescriptor)(self.relu);
            (api.cudnnDestroyFilterDescriptor)(self.w);
            (api.cudnnDestroyConvolutionDescriptor)(self.conv);
            (api.cudnnDestroy)(self.handle);
        }
    }
}

fn version_of(api: &Api) -> String {
    // SAFETY: no arguments; callable once the library is loaded.
    Version::from_code(unsafe { (api.cudnnGetVersion)() }).to_string()
}

/// The cuDNN version the loaded library reports, e.g. "9.19.0" ("unknown" before
/// `vendor::load`).
pub fn version() -> String {
    api().map_or_else(|_| "unknown".to_string(), version_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_per_type() {
        let f32 = ConvMath::for_types(DType::F32, DType::F32, Layout::Nchw).unwrap();
        assert_eq!(
            (f32.data_type, f32.compute_type, f32.math, f32.format),
            (DATA_FLOAT, DATA_FLOAT, MathType::Fma, TENSOR_NCHW)
        );
        let tf32 = ConvMath::for_types(DType::Tf32, DType::Tf32, Layout::Nhwc).unwrap();
        assert_eq!(
            (tf32.data_type, tf32.math, tf32.format),
            (DATA_FLOAT, MathType::Default, TENSOR_NHWC)
        );
        // TF32 data with a float32 output is the same storage: allowed.
        assert!(ConvMath::for_types(DType::Tf32, DType::F32, Layout::Nchw).is_ok());
        let fp16 = ConvMath::for_types(DType::Fp16, DType::Fp16, Layout::Nhwc).unwrap();
        assert_eq!(
            (fp16.data_type, fp16.compute_type, fp16.math, fp16.format),
            (DATA_HALF, DATA_FLOAT, MathType::TensorOp, TENSOR_NHWC)
        );
        let bf16 = ConvMath::for_types(DType::Bf16, DType::Bf16, Layout::Nhwc).unwrap();
        assert_eq!(
            (bf16.data_type, bf16.math),
            (DATA_BFLOAT16, MathType::TensorOp)
        );
        let e = ConvMath::for_types(DType::Fp16, DType::F32, Layout::Nhwc).unwrap_err();
        assert!(matches!(e, VendorError::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains("--out-dtype fp16"), "{e}");
    }

    #[test]
    fn found_algorithms_are_kept_at_the_task_precision() {
        let f32 = ConvMath::for_types(DType::F32, DType::F32, Layout::Nchw).unwrap();
        assert!(f32.accepts(MathType::Fma) && f32.accepts(MathType::Default));
        assert!(!f32.accepts(MathType::TensorOp));
        for dtype in [DType::Tf32, DType::Fp16, DType::Bf16] {
            let m = ConvMath::for_types(dtype, dtype, Layout::Nhwc).unwrap();
            assert!(m.accepts(MathType::TensorOp) && m.accepts(MathType::Fma));
            assert!(!m.accepts(MathType::TensorOpAllowConversion), "{dtype}");
        }
    }

    #[test]
    fn routines_name_library_algorithm_math_type_and_layout() {
        let a = Algorithm {
            algo: 1,
            math: MathType::TensorOp,
            workspace_bytes: 0,
            find_ms: 0.0,
        };
        assert_eq!(a.name(), "IMPLICIT_PRECOMP_GEMM");
        assert_eq!(
            Algorithm { algo: 42, ..a }.name(),
            "ALGO_42",
            "a newer cuDNN's algorithm still gets a name"
        );
        assert_eq!(
            routine("9.19.0", &a.name(), a.math, DType::Fp16, Layout::Nhwc),
            "cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM tensor-op fp16 NHWC"
        );
        assert_eq!(MathType::from_raw(3), Some(MathType::Fma));
        assert_eq!(MathType::from_raw(7), None);
    }
}
