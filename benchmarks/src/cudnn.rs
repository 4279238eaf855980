//! The cuDNN baseline for conv2d: `cudnnConvolutionForward` in NCHW float32 with FMA
//! math only (no TF32 tensor-core conversion), on the measuring context's stream, with
//! the algorithm chosen by benchmarking every one cuDNN offers for the shape.

use crate::vendor::VendorError;
use cudarc::cudnn::sys::{self, cudnnStatus_t};
use gpu::cuda::{Buffer, Context};
use schedule::task::Conv2d;
use std::ffi::{CStr, c_void};

fn check(call: &'static str, status: cudnnStatus_t) -> Result<(), VendorError> {
    if status == cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr(sys::cudnnGetErrorString(status)) };
    Err(VendorError::Call {
        call,
        status: text.to_string_lossy().into_owned(),
    })
}

/// An algorithm cuDNN can run for the shape, with what its own benchmark measured.
#[derive(Debug, Clone, Copy)]
pub struct Algorithm {
    pub algo: sys::cudnnConvolutionFwdAlgo_t,
    pub workspace_bytes: usize,
    /// cuDNN's own time (ms) from `cudnnFindConvolutionForwardAlgorithmEx`.
    pub find_ms: f32,
}

impl Algorithm {
    /// The algorithm's name without the enum prefix, e.g. `IMPLICIT_PRECOMP_GEMM`.
    pub fn name(&self) -> String {
        format!("{:?}", self.algo).replace("CUDNN_CONVOLUTION_FWD_ALGO_", "")
    }
}

/// One convolution shape set up in cuDNN.
pub struct CudnnConv {
    handle: sys::cudnnHandle_t,
    x: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
}

fn int(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

impl CudnnConv {
    /// Describes `shape` to cuDNN; work is enqueued on `ctx`'s stream.
    pub fn new(ctx: &Context, shape: &Conv2d) -> Result<CudnnConv, VendorError> {
        use sys::cudnnDataType_t::CUDNN_DATA_FLOAT as F32;
        use sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW as NCHW;
        let (p, q) = shape.output_size().map_err(|e| VendorError::Call {
            call: "output size",
            status: e.to_string(),
        })?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a handle; cuDNN initializes it on the current context.
        check("cudnnCreate", unsafe { sys::cudnnCreate(&mut handle) })?;
        let mut this = CudnnConv {
            handle,
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
        };
        // SAFETY: each call gets a live handle or a descriptor created just
        // before; the raw stream belongs to the current context.
        unsafe {
            check(
                "cudnnSetStream",
                sys::cudnnSetStream(this.handle, ctx.raw_stream().cast()),
            )?;
            check(
                "cudnnCreateTensorDescriptor",
                sys::cudnnCreateTensorDescriptor(&mut this.x),
            )?;
            check(
                "cudnnCreateTensorDescriptor",
                sys::cudnnCreateTensorDescriptor(&mut this.y),
            )?;
            check(
                "cudnnCreateFilterDescriptor",
                sys::cudnnCreateFilterDescriptor(&mut this.w),
            )?;
            check(
                "cudnnCreateConvolutionDescriptor",
                sys::cudnnCreateConvolutionDescriptor(&mut this.conv),
            )?;
            let s = shape;
            check(
                "cudnnSetTensor4dDescriptor(x)",
                sys::cudnnSetTensor4dDescriptor(
                    this.x,
                    NCHW,
                    F32,
                    int(s.n),
                    int(s.c),
                    int(s.h),
                    int(s.w),
                ),
            )?;
            check(
                "cudnnSetFilter4dDescriptor",
                sys::cudnnSetFilter4dDescriptor(
                    this.w,
                    F32,
                    NCHW,
                    int(s.k),
                    int(s.c),
                    int(s.r),
                    int(s.s),
                ),
            )?;
            check(
                "cudnnSetTensor4dDescriptor(y)",
                sys::cudnnSetTensor4dDescriptor(
                    this.y,
                    NCHW,
                    F32,
                    int(s.n),
                    int(s.k),
                    int(p),
                    int(q),
                ),
            )?;
            check(
                "cudnnSetConvolution2dDescriptor",
                sys::cudnnSetConvolution2dDescriptor(
                    this.conv,
                    int(s.pad_h),
                    int(s.pad_w),
                    int(s.stride_h),
                    int(s.stride_w),
                    int(s.dilation_h),
                    int(s.dilation_w),
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    F32,
                ),
            )?;
            // FMA math: no TF32 (which DEFAULT_MATH permits on Ampere and later).
            check(
                "cudnnSetConvolutionMathType",
                sys::cudnnSetConvolutionMathType(this.conv, sys::cudnnMathType_t::CUDNN_FMA_MATH),
            )?;
        }
        Ok(this)
    }

    /// Every algorithm that runs for this shape with FMA math, fastest first by cuDNN's
    /// own benchmark on the given buffers (`[x, w, y]`); `workspace` bounds the
    /// workspace an algorithm may use.
    pub fn algorithms(
        &self,
        buffers: [&Buffer; 3],
        workspace: &Buffer,
    ) -> Result<Vec<Algorithm>, VendorError> {
        let mut max = 0;
        // SAFETY: live handle and out-pointer.
        check("cudnnGetConvolutionForwardAlgorithmMaxCount", unsafe {
            sys::cudnnGetConvolutionForwardAlgorithmMaxCount(self.handle, &mut max)
        })?;
        // SAFETY: the perf struct is plain C data; zeroed is a valid value.
        let mut perf: Vec<sys::cudnnConvolutionFwdAlgoPerf_t> =
            vec![unsafe { std::mem::zeroed() }; max.max(1) as usize];
        let mut returned = 0;
        let [x, w, y] = buffers;
        // SAFETY: descriptors match the buffers' sizes (the caller allocates them from
        // the same shape); `perf` has room for `max` results.
        check("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
            sys::cudnnFindConvolutionForwardAlgorithmEx(
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
                workspace.len * 4,
            )
        })?;
        Ok(perf
            .iter()
            .take(returned.max(0) as usize)
            .filter(|p| {
                p.status == cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && p.mathType != sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                    && p.mathType != sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
            })
            .map(|p| Algorithm {
                algo: p.algo,
                workspace_bytes: p.memory,
                find_ms: p.time,
            })
            .collect())
    }

    /// Enqueues `y = conv(x, w)` with `algorithm`.
    pub fn run(
        &self,
        algorithm: &Algorithm,
        buffers: [&Buffer; 3],
        workspace: &Buffer,
    ) -> Result<(), VendorError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [x, w, y] = buffers;
        // SAFETY: as in `algorithms`; the workspace holds at least the algorithm's need
        // (checked by the caller, which sizes it from `Algorithm::workspace_bytes`).
        check("cudnnConvolutionForward", unsafe {
            sys::cudnnConvolutionForward(
                self.handle,
                (&alpha as *const f32).cast(),
                self.x,
                x.device_ptr() as *const c_void,
                self.w,
                w.device_ptr() as *const c_void,
                self.conv,
                algorithm.algo,
                workspace.device_ptr() as *mut c_void,
                workspace.len * 4,
                (&beta as *const f32).cast(),
                self.y,
                y.device_ptr() as *mut c_void,
            )
        })
    }
}

impl Drop for CudnnConv {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `new` (or is null, which cuDNN's destroy
        // functions accept) and is destroyed once, before the handle.
        unsafe {
            sys::cudnnDestroyTensorDescriptor(self.x);
            sys::cudnnDestroyTensorDescriptor(self.y);
            sys::cudnnDestroyFilterDescriptor(self.w);
            sys::cudnnDestroyConvolutionDescriptor(self.conv);
            sys::cudnnDestroy(self.handle);
        }
    }
}

/// The cuDNN version the loaded library reports, e.g. "9.19.0".
pub fn version() -> String {
    // SAFETY: no arguments; callable once the library is loaded.
    let v = unsafe { sys::cudnnGetVersion() };
    format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
}
