//! The cuBLAS baselines for matmul and batch matmul, on the measuring context's stream:
//! the plain call (`cublasSgemm` for float32, `cublasGemmEx` otherwise; the strided
//! batched forms for batch matmul) and cuBLASLt's `cublasLtMatmul` with the algorithms
//! its heuristic proposes (the session times both and keeps the faster). A task with a
//! fused bias or ReLU goes to cuBLASLt alone, with the epilogue in the call
//! (`CUBLASLT_EPILOGUE_BIAS`, `RELU`, `RELU_BIAS`), as PyTorch's `addmm` reaches it.
//!
//! Per element type (see [`GemmTypes::for_types`]): float32 with cuBLAS's default math
//! (no TF32); TF32 as float32 data with `CUBLAS_COMPUTE_32F_FAST_TF32`; fp16 and bf16
//! (`CUDA_R_16F`, `CUDA_R_16BF`) with `CUBLAS_COMPUTE_32F`; the output in the task's
//! output type (f32 or the input's).
//!
//! Our operands are row-major (`C[M,N] = A[M,K]·B[K,N]`); cuBLAS is column-major, so
//! every call computes `Cᵀ = Bᵀ·Aᵀ`, whose column-major form is exactly our row-major C:
//! cuBLAS's (m, n, k) is our (N, M, K), its A is our B (leading dimension N) and its B
//! our A (leading dimension K). A B stored transposed (`N×K`, the KRSC weights of a 1×1
//! convolution run as a GEMM) is cuBLAS's A read with `OP_T` (leading dimension K).
//!
//! The functions are resolved from the copy `vendor::load` opened (cuBLASLt's from the
//! `libcublasLt.so.13` beside it), never by name through the loader.

use crate::vendor::{self, Library, VendorError, Version};
use gpu::cuda::{Buffer, Context};
use schedule::{DType, Epilogue};
use std::ffi::{c_int, c_longlong, c_void};
use std::sync::OnceLock;

type Handle = *mut c_void;
type Status = c_int;

const SUCCESS: Status = 0;
const OP_N: c_int = 0;
const OP_T: c_int = 1;
// cudaDataType_t
const R_32F: c_int = 0;
const R_16F: c_int = 2;
const R_16BF: c_int = 14;
// cublasComputeType_t
const COMPUTE_32F: c_int = 68;
const COMPUTE_32F_FAST_TF32: c_int = 77;
const GEMM_DEFAULT: c_int = -1;
const DEFAULT_MATH: c_int = 0;
// cublasLtMatmulDescAttributes_t
const DESC_TRANSA: c_int = 3;
const DESC_EPILOGUE: c_int = 7;
const DESC_BIAS_POINTER: c_int = 8;
const DESC_BIAS_DATA_TYPE: c_int = 26;
// cublasLtEpilogue_t
const EPILOGUE_RELU: u32 = 2;
const EPILOGUE_BIAS: u32 = 4;
const EPILOGUE_RELU_BIAS: u32 = 6;
// cublasLtMatrixLayoutAttribute_t
const LAYOUT_BATCH_COUNT: c_int = 5;
const LAYOUT_STRIDED_BATCH_OFFSET: c_int = 6;
// cublasLtMatmulPreferenceAttributes_t
const PREF_MAX_WORKSPACE_BYTES: c_int = 1;

/// `cublasLtMatmulAlgo_t`: opaque.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LtAlgo {
    data: [u64; 8],
}

/// `cublasLtMatmulHeuristicResult_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LtHeuristic {
    algo: LtAlgo,
    workspace_size: usize,
    state: Status,
    waves_count: f32,
    reserved: [c_int; 4],
}

functions! {
    /// The cuBLAS functions the baseline calls (`cublas_api.h`, cuBLAS 13).
    struct Api in None;
    fn cublasCreate_v2(*mut Handle) -> Status;
    fn cublasDestroy_v2(Handle) -> Status;
    fn cublasSetStream_v2(Handle, *mut c_void) -> Status;
    fn cublasSetMathMode(Handle, c_int) -> Status;
    fn cublasGetVersion_v2(Handle, *mut c_int) -> Status;
    fn cublasSgemm_v2(
        Handle, c_int, c_int, c_int, c_int, c_int, *const f32, *const f32, c_int,
        *const f32, c_int, *const f32, *mut f32, c_int
    ) -> Status;
    fn cublasSgemmStridedBatched(
        Handle, c_int, c_int, c_int, c_int, c_int, *const f32, *const f32, c_int,
        c_longlong, *const f32, c_int, c_longlong, *const f32, *mut f32, c_int, c_longlong,
        c_int
    ) -> Status;
    fn cublasGemmEx(
        Handle, c_int, c_int, c_int, c_int, c_int, *const c_void, *const c_void, c_int,
        c_int, *const c_void, c_int, c_int, *const c_void, *mut c_void, c_int, c_int,
        c_int, c_int
    ) -> Status;
    fn cublasGemmStridedBatchedEx(
        Handle, c_int, c_int, c_int, c_int, c_int, *const c_void, *const c_void, c_int,
        c_int, c_longlong, *const c_void, c_int, c_int, c_longlong, *const c_void,
        *mut c_void, c_int, c_int, c_longlong, c_int, c_int, c_int
    ) -> Status;
}

functions! {
    /// The cuBLASLt functions the baseline calls (`cublasLt.h`, cuBLAS 13).
    struct LtApi in Some("libcublasLt.so.13");
    fn cublasLtGetVersion() -> usize;
    fn cublasLtCreate(*mut Handle) -> Status;
    fn cublasLtDestroy(Handle) -> Status;
    fn cublasLtMatmulDescCreate(*mut Handle, c_int, c_int) -> Status;
    fn cublasLtMatmulDescDestroy(Handle) -> Status;
    fn cublasLtMatmulDescSetAttribute(Handle, c_int, *const c_void, usize) -> Status;
    fn cublasLtMatrixLayoutCreate(*mut Handle, c_int, u64, u64, i64) -> Status;
    fn cublasLtMatrixLayoutDestroy(Handle) -> Status;
    fn cublasLtMatrixLayoutSetAttribute(Handle, c_int, *const c_void, usize) -> Status;
    fn cublasLtMatmulPreferenceCreate(*mut Handle) -> Status;
    fn cublasLtMatmulPreferenceDestroy(Handle) -> Status;
    fn cublasLtMatmulPreferenceSetAttribute(Handle, c_int, *const c_void, usize) -> Status;
    fn cublasLtMatmulAlgoGetHeuristic(
        Handle, Handle, Handle, Handle, Handle, Handle, Handle, c_int, *mut LtHeuristic,
        *mut c_int
    ) -> Status;
    fn cublasLtMatmul(
        Handle, Handle, *const c_void, *const c_void, Handle, *const c_void, Handle,
        *const c_void, *const c_void, Handle, *mut c_void, Handle, *const LtAlgo,
        *mut c_void, usize, *mut c_void
    ) -> Status;
}

fn api() -> Result<&'static Api, VendorError> {
    static API: OnceLock<Api> = OnceLock::new();
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let loaded = loaded()?;
    let resolved = Api::resolve(loaded)?;
    Ok(API.get_or_init(|| resolved))
}

fn lt_api() -> Result<&'static LtApi, VendorError> {
    static API: OnceLock<LtApi> = OnceLock::new();
    if let Some(api) = API.get() {
        return Ok(api);
    }
    let resolved = LtApi::resolve(loaded()?)?;
    Ok(API.get_or_init(|| resolved))
}

fn loaded() -> Result<&'static vendor::Loaded, VendorError> {
    vendor::loaded(Library::Cublas).ok_or(VendorError::NotLoaded {
        lib: Library::Cublas,
    })
}

/// cuBLAS's status names (`cublasStatus_t`), for messages.
fn status_name(status: Status) -> String {
    match status {
        1 => "CUBLAS_STATUS_NOT_INITIALIZED".into(),
        3 => "CUBLAS_STATUS_ALLOC_FAILED".into(),
        7 => "CUBLAS_STATUS_INVALID_VALUE".into(),
        8 => "CUBLAS_STATUS_ARCH_MISMATCH".into(),
        11 => "CUBLAS_STATUS_MAPPING_ERROR".into(),
        13 => "CUBLAS_STATUS_EXECUTION_FAILED".into(),
        14 => "CUBLAS_STATUS_INTERNAL_ERROR".into(),
        15 => "CUBLAS_STATUS_NOT_SUPPORTED".into(),
        16 => "CUBLAS_STATUS_LICENSE_ERROR".into(),
        other => format!("cuBLAS status {other}"),
    }
}

fn check(call: &'static str, status: Status) -> Result<(), VendorError> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(VendorError::Call {
            call,
            status: status_name(status),
        })
    }
}

/// A (batched) row-major GEMM shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub batch: u32,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// B is stored transposed (`N×K` row-major, as a 1×1 convolution's KRSC weights
    /// are); cuBLAS reads it with `OP_T` (see the module doc).
    pub b_transposed: bool,
}

impl Gemm {
    /// `C[M,N] = A[M,K]·B[K,N]`, each of `batch` matrices row-major and packed.
    pub fn new(batch: u32, m: u32, n: u32, k: u32) -> Gemm {
        Gemm {
            batch,
            m,
            n,
            k,
            b_transposed: false,
        }
    }

    /// cuBLAS's operation on its A (our B) and that operand's leading dimension.
    fn b_operation(&self) -> (c_int, i32) {
        if self.b_transposed {
            (OP_T, self.k as i32)
        } else {
            (OP_N, self.n as i32)
        }
    }
}

/// The cuBLAS types of a task: the inputs' and the output's `cudaDataType_t` and the
/// compute type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmTypes {
    pub dtype: DType,
    pub out_dtype: DType,
    /// `cudaDataType_t` of A and B.
    pub input: c_int,
    /// `cudaDataType_t` of C.
    pub output: c_int,
    /// `cublasComputeType_t`.
    pub compute: c_int,
}

fn data_type(dtype: DType) -> c_int {
    match dtype {
        DType::F32 | DType::Tf32 => R_32F,
        DType::Fp16 => R_16F,
        DType::Bf16 => R_16BF,
    }
}

impl GemmTypes {
    /// The types of a matmul with these element types: products accumulate in float32
    /// (TF32 inputs through `COMPUTE_32F_FAST_TF32`), the scaling factors are float.
    pub fn for_types(dtype: DType, out_dtype: DType) -> GemmTypes {
        GemmTypes {
            dtype,
            out_dtype,
            input: data_type(dtype),
            output: data_type(out_dtype),
            compute: if dtype == DType::Tf32 {
                COMPUTE_32F_FAST_TF32
            } else {
                COMPUTE_32F
            },
        }
    }

    /// Plain float32: the `cublasSgemm` path.
    fn is_sgemm(&self) -> bool {
        self.dtype == DType::F32 && self.out_dtype == DType::F32
    }

    fn compute_label(&self) -> &'static str {
        match self.compute {
            COMPUTE_32F_FAST_TF32 => "COMPUTE_32F_FAST_TF32",
            _ => "COMPUTE_32F",
        }
    }

    /// e.g. `fp16` or `fp16→f32`.
    fn types_label(&self) -> String {
        if self.out_dtype == self.dtype
            || (self.dtype == DType::Tf32 && self.out_dtype == DType::F32)
        {
            self.dtype.to_string()
        } else {
            format!("{}→{}", self.dtype, self.out_dtype)
        }
    }
}

/// Checks that the operand buffers hold the shape's elements of their types.
fn check_sizes(shape: Gemm, types: &GemmTypes, buffers: [&Buffer; 3]) -> Result<(), VendorError> {
    let [a, b, c] = buffers;
    let (batch, m, n, k) = (
        u64::from(shape.batch),
        u64::from(shape.m),
        u64::from(shape.n),
        u64::from(shape.k),
    );
    let fits = |buf: &Buffer, elements: u64, dtype: DType| {
        buf.bytes() as u64 >= elements * u64::from(dtype.bytes())
    };
    if fits(a, batch * m * k, types.dtype)
        && fits(b, batch * k * n, types.dtype)
        && fits(c, batch * m * n, types.out_dtype)
    {
        Ok(())
    } else {
        Err(VendorError::Call {
            call: "gemm",
            status: "buffers smaller than the shape".to_string(),
        })
    }
}

/// A cuBLAS handle bound to a context's stream.
pub struct Cublas {
    api: &'static Api,
    handle: Handle,
}

impl Cublas {
    pub fn new(ctx: &Context) -> Result<Cublas, VendorError> {
        let api = api()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a handle, created on the current context.
        check("cublasCreate", unsafe {
            (api.cublasCreate_v2)(&mut handle)
        })?;
        let this = Cublas { api, handle };
        // SAFETY: live handle; the raw stream belongs to the current context.
        check("cublasSetStream", unsafe {
            (api.cublasSetStream_v2)(this.handle, ctx.raw_stream().cast())
        })?;
        // Default math: float32 stays float32 (TF32 is asked for by compute type only).
        // SAFETY: live handle.
        check("cublasSetMathMode", unsafe {
            (api.cublasSetMathMode)(this.handle, DEFAULT_MATH)
        })?;
        Ok(this)
    }

    /// Enqueues float32 `c = a·b` for `shape` (buffers in our kernels' order: A, B, C).
    pub fn sgemm(&self, shape: Gemm, buffers: [&Buffer; 3]) -> Result<(), VendorError> {
        self.gemm(
            shape,
            &GemmTypes::for_types(DType::F32, DType::F32),
            buffers,
        )
    }

    /// Enqueues `c = a·b` for `shape` in `types`: `cublasSgemm` (strided batched for a
    /// batch) in plain float32, `cublasGemmEx` / `cublasGemmStridedBatchedEx` otherwise.
    pub fn gemm(
        &self,
        shape: Gemm,
        types: &GemmTypes,
        buffers: [&Buffer; 3],
    ) -> Result<(), VendorError> {
        check_sizes(shape, types, buffers)?;
        let api = self.api;
        let [a, b, c] = buffers;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (mi, ni, ki) = (shape.m as i32, shape.n as i32, shape.k as i32);
        let (sa, sb, sc) = (
            i64::from(shape.m) * i64::from(shape.k),
            i64::from(shape.k) * i64::from(shape.n),
            i64::from(shape.m) * i64::from(shape.n),
        );
        let (pa, pb, pc) = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        let (op_b, ldb) = shape.b_operation();
        let h = self.handle;
        if types.is_sgemm() {
            let (pa, pb, pc) = (pa as *const f32, pb as *const f32, pc as *mut f32);
            if shape.batch == 1 {
                // SAFETY: buffer sizes checked above; leading dimensions are the row
                // lengths of the row-major operands (see the module doc).
                return check("cublasSgemm", unsafe {
                    (api.cublasSgemm_v2)(
                        h, op_b, OP_N, ni, mi, ki, &alpha, pb, ldb, pa, ki, &beta, pc, ni,
                    )
                });
            }
            // SAFETY: as above, with each batch's operands packed one after the other.
            return check("cublasSgemmStridedBatched", unsafe {
                (api.cublasSgemmStridedBatched)(
                    h,
                    op_b,
                    OP_N,
                    ni,
                    mi,
                    ki,
                    &alpha,
                    pb,
                    ldb,
                    sb,
                    pa,
                    ki,
                    sa,
                    &beta,
                    pc,
                    ni,
                    sc,
                    shape.batch as i32,
                )
            });
        }
        let (pa, pb, pc) = (pa as *const c_void, pb as *const c_void, pc as *mut c_void);
        let (alpha, beta): (*const c_void, *const c_void) =
            ((&alpha as *const f32).cast(), (&beta as *const f32).cast());
        if shape.batch == 1 {
            // SAFETY: as for sgemm; the scaling factors are float, as the 32F compute
            // types require.
            return check("cublasGemmEx", unsafe {
                (api.cublasGemmEx)(
                    h,
                    op_b,
                    OP_N,
                    ni,
                    mi,
                    ki,
                    alpha,
                    pb,
                    types.input,
                    ldb,
                    pa,
                    types.input,
                    ki,
                    beta,
                    pc,
                    types.output,
                    ni,
                    types.compute,
                    GEMM_DEFAULT,
                )
            });
        }
        // SAFETY: as above, batched.
        check("cublasGemmStridedBatchedEx", unsafe {
            (api.cublasGemmStridedBatchedEx)(
                h,
                op_b,
                OP_N,
                ni,
                mi,
                ki,
                alpha,
                pb,
                types.input,
                ldb,
                sb,
                pa,
                types.input,
                ki,
                sa,
                beta,
                pc,
                types.output,
                ni,
                sc,
                shape.batch as i32,
                types.compute,
                GEMM_DEFAULT,
            )
        })
    }

    /// The name of the plain call for `shape` and `types`, e.g.
    /// `cuBLAS 13.1.0 cublasGemmEx COMPUTE_32F bf16`.
    pub fn describe(&self, shape: Gemm, types: &GemmTypes) -> String {
        let call = match (types.is_sgemm(), shape.batch > 1) {
            (true, false) => "cublasSgemm",
            (true, true) => "cublasSgemmStridedBatched",
            (false, false) => "cublasGemmEx",
            (false, true) => "cublasGemmStridedBatchedEx",
        };
        let compute = if types.is_sgemm() {
            "default-math".to_string()
        } else {
            types.compute_label().to_string()
        };
        format!(
            "cuBLAS {} {call} {compute} {}",
            version(self),
            types.types_label()
        )
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe {
            (self.api.cublasDestroy_v2)(self.handle);
        }
    }
}

/// The cuBLAS version the loaded library reports, e.g. "13.1.0".
pub fn version(handle: &Cublas) -> String {
    let mut v = 0;
    // SAFETY: live handle and out-pointer.
    let status = unsafe { (handle.api.cublasGetVersion_v2)(handle.handle, &mut v) };
    if status != SUCCESS {
        return "unknown".to_string();
    }
    Version::from_code(usize::try_from(v).unwrap_or(0)).to_string()
}

/// The version of the loaded cuBLAS (its cuBLASLt's, which ships with it), e.g.
/// "13.1.0"; "unknown" before `vendor::load`.
pub fn library_version() -> String {
    lt_api().map_or_else(
        |_| "unknown".to_string(),
        // SAFETY: no arguments; callable once the library is loaded.
        |api| Version::from_code(unsafe { (api.cublasLtGetVersion)() }).to_string(),
    )
}

/// One algorithm cuBLASLt's heuristic proposed for a matmul.
#[derive(Debug, Clone, Copy)]
pub struct LtCandidate {
    algo: LtAlgo,
    pub workspace_bytes: usize,
    /// Its rank in the heuristic's answer (0 = its first choice).
    pub rank: usize,
}

/// `cublasLtEpilogue_t` of a task's epilogue; `None` for none.
fn lt_epilogue(epilogue: Epilogue) -> Option<u32> {
    match (epilogue.bias, epilogue.relu) {
        (false, false) => None,
        (true, false) => Some(EPILOGUE_BIAS),
        (false, true) => Some(EPILOGUE_RELU),
        (true, true) => Some(EPILOGUE_RELU_BIAS),
    }
}

/// A matmul described to cuBLASLt: the operation (with its epilogue), the three layouts
/// and a preference bounding the workspace.
pub struct LtMatmul {
    api: &'static LtApi,
    handle: Handle,
    desc: Handle,
    /// cuBLASLt's A (our B), B (our A), C and D (our C).
    layouts: [Handle; 3],
    preference: Handle,
    stream: *mut c_void,
    shape: Gemm,
    types: GemmTypes,
    epilogue: Epilogue,
    version: String,
}

impl LtMatmul {
    /// Describes `shape` in `types` with `epilogue` (a bias per column of the output,
    /// shared by every batch, of type [`LtMatmul::bias_dtype`]); algorithms may use up
    /// to `max_workspace` bytes.
    pub fn new(
        ctx: &Context,
        shape: Gemm,
        types: GemmTypes,
        epilogue: Epilogue,
        max_workspace: usize,
    ) -> Result<LtMatmul, VendorError> {
        let api = lt_api()?;
        let mut this = LtMatmul {
            api,
            handle: std::ptr::null_mut(),
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            preference: std::ptr::null_mut(),
            stream: ctx.raw_stream().cast(),
            shape,
            types,
            epilogue,
            // SAFETY: no arguments; callable once the library is loaded.
            version: Version::from_code(unsafe { (api.cublasLtGetVersion)() }).to_string(),
        };
        let (m, n, k) = (u64::from(shape.m), u64::from(shape.n), u64::from(shape.k));
        // Column-major views of our row-major operands (see the module doc): cuBLASLt's
        // A is our B (N×K, ld N; or, stored transposed, K×N with ld K, read with
        // `OP_T`), its B our A (K×M, ld K), C and D our C (N×M, ld N).
        let a_dims = if shape.b_transposed {
            (types.input, k, n, k, k * n)
        } else {
            (types.input, n, k, n, k * n)
        };
        let dims = [
            a_dims,
            (types.input, k, m, k, m * k),
            (types.output, n, m, n, m * n),
        ];
        // SAFETY: out-pointers to handles and descriptors; the attribute buffers are
        // of the types the attributes take (int32 batch count, int64 stride, uint64
        // workspace size). `Drop` destroys whatever was created if a call fails.
        unsafe {
            check("cublasLtCreate", (api.cublasLtCreate)(&mut this.handle))?;
            check(
                "cublasLtMatmulDescCreate",
                (api.cublasLtMatmulDescCreate)(&mut this.desc, types.compute, R_32F),
            )?;
            if shape.b_transposed {
                check(
                    "cublasLtMatmulDescSetAttribute(TRANSA)",
                    (api.cublasLtMatmulDescSetAttribute)(
                        this.desc,
                        DESC_TRANSA,
                        (&OP_T as *const c_int).cast(),
                        4,
                    ),
                )?;
            }
            if let Some(kind) = lt_epilogue(epilogue) {
                check(
                    "cublasLtMatmulDescSetAttribute(EPILOGUE)",
                    (api.cublasLtMatmulDescSetAttribute)(
                        this.desc,
                        DESC_EPILOGUE,
                        (&kind as *const u32).cast(),
                        4,
                    ),
                )?;
            }
            if epilogue.bias {
                let bias_type = data_type(this.bias_dtype());
                check(
                    "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)",
                    (api.cublasLtMatmulDescSetAttribute)(
                        this.desc,
                        DESC_BIAS_DATA_TYPE,
                        (&bias_type as *const c_int).cast(),
                        4,
                    ),
                )?;
            }
            for (layout, (dtype, rows, cols, ld, stride)) in this.layouts.iter_mut().zip(dims) {
                check(
                    "cublasLtMatrixLayoutCreate",
                    (api.cublasLtMatrixLayoutCreate)(layout, dtype, rows, cols, ld as i64),
                )?;
                if shape.batch > 1 {
                    let count = shape.batch as i32;
                    let stride = stride as i64;
                    check(
                        "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)",
                        (api.cublasLtMatrixLayoutSetAttribute)(
                            *layout,
                            LAYOUT_BATCH_COUNT,
                            (&count as *const i32).cast(),
                            4,
                        ),
                    )?;
                    check(
                        "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)",
                        (api.cublasLtMatrixLayoutSetAttribute)(
                            *layout,
                            LAYOUT_STRIDED_BATCH_OFFSET,
                            (&stride as *const i64).cast(),
                            8,
                        ),
                    )?;
                }
            }
            check(
                "cublasLtMatmulPreferenceCreate",
                (api.cublasLtMatmulPreferenceCreate)(&mut this.preference),
            )?;
            let max = max_workspace as u64;
            check(
                "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
                (api.cublasLtMatmulPreferenceSetAttribute)(
                    this.preference,
                    PREF_MAX_WORKSPACE_BYTES,
                    (&max as *const u64).cast(),
                    8,
                ),
            )?;
        }
        Ok(this)
    }

    /// The bias's element type: the output's where that is float32 (cuBLASLt takes no
    /// half bias with a float32 output: the caller converts it once, as weights are),
    /// else the input's.
    pub fn bias_dtype(&self) -> DType {
        if self.types.output == R_32F {
            DType::F32
        } else {
            self.types.dtype
        }
    }

    /// Up to `count` algorithms from cuBLASLt's heuristic, its best first.
    pub fn heuristics(&self, count: usize) -> Result<Vec<LtCandidate>, VendorError> {
        let api = self.api;
        let mut results = vec![LtHeuristic::default(); count.max(1)];
        let mut returned = 0;
        let [a, b, c] = self.layouts;
        // SAFETY: live descriptors; `results` has room for the count asked for.
        check("cublasLtMatmulAlgoGetHeuristic", unsafe {
            (api.cublasLtMatmulAlgoGetHeuristic)(
                self.handle,
                self.desc,
                a,
                b,
                c,
                c,
                self.preference,
                results.len() as c_int,
                results.as_mut_ptr(),
                &mut returned,
            )
        })?;
        Ok(results
            .iter()
            .take(returned.clamp(0, results.len() as c_int) as usize)
            .enumerate()
            .filter(|(_, r)| r.state == SUCCESS)
            .map(|(rank, r)| LtCandidate {
                algo: r.algo,
                workspace_bytes: r.workspace_size,
                rank,
            })
            .collect())
    }

    /// Enqueues `c = a·b` and the epilogue with `candidate` (buffers A, B, C; the bias
    /// when the epilogue adds one; `workspace` holds at least the candidate's need).
    pub fn run(
        &self,
        candidate: &LtCandidate,
        buffers: [&Buffer; 3],
        bias: Option<&Buffer>,
        workspace: &Buffer,
    ) -> Result<(), VendorError> {
        check_sizes(self.shape, &self.types, buffers)?;
        if self.epilogue.bias {
            let bias = bias.filter(|b| {
                b.bytes() >= self.shape.n as usize * self.bias_dtype().bytes() as usize
            });
            let Some(bias) = bias else {
                return Err(VendorError::Call {
                    call: "cublasLtMatmul",
                    status: "no bias buffer of N elements for a matmul with a bias".to_string(),
                });
            };
            let pointer = bias.device_ptr();
            // SAFETY: live descriptor; the attribute takes a device pointer by value.
            check("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", unsafe {
                (self.api.cublasLtMatmulDescSetAttribute)(
                    self.desc,
                    DESC_BIAS_POINTER,
                    (&pointer as *const u64).cast(),
                    8,
                )
            })?;
        }
        if workspace.bytes() < candidate.workspace_bytes {
            return Err(VendorError::Call {
                call: "cublasLtMatmul",
                status: "workspace smaller than the algorithm needs".to_string(),
            });
        }
        let [pa, pb, pc] = buffers.map(|b| b.device_ptr() as *mut c_void);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [la, lb, lc] = self.layouts;
        // SAFETY: sizes checked above; C is read (beta = 0) and D written in place, as
        // cuBLASLt allows when their layouts are equal.
        check("cublasLtMatmul", unsafe {
            (self.api.cublasLtMatmul)(
                self.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                pb,
                la,
                pa,
                lb,
                (&beta as *const f32).cast(),
                pc,
                lc,
                pc,
                lc,
                &candidate.algo,
                workspace.device_ptr() as *mut c_void,
                candidate.workspace_bytes,
                self.stream,
            )
        })
    }

    /// e.g. `cuBLASLt 13.1.0 cublasLtMatmul heuristic #2 COMPUTE_32F fp16` (with
    /// `EPILOGUE_RELU_BIAS` and the like where the task has one).
    pub fn describe(&self, candidate: &LtCandidate) -> String {
        lt_routine(&self.version, candidate.rank, &self.types, self.epilogue)
    }
}

/// `cuBLASLt <version> cublasLtMatmul heuristic #<rank + 1> [EPILOGUE_…] <compute> <types>`.
fn lt_routine(version: &str, rank: usize, types: &GemmTypes, epilogue: Epilogue) -> String {
    let epilogue = match lt_epilogue(epilogue) {
        Some(EPILOGUE_BIAS) => " EPILOGUE_BIAS",
        Some(EPILOGUE_RELU) => " EPILOGUE_RELU",
        Some(_) => " EPILOGUE_RELU_BIAS",
        None => "",
    };
    format!(
        "cuBLASLt {version} cublasLtMatmul heuristic #{}{epilogue} {} {}",
        rank + 1,
        types.compute_label(),
        types.types_label()
    )
}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        let api = self.api;
        // SAFETY: each object was created by `new` (or is null, which the destroy
        // functions accept) and is destroyed once, the handle last.
        unsafe {
            (api.cublasLtMatmulPreferenceDestroy)(self.preference);
            for layout in self.layouts {
                (api.cublasLtMatrixLayoutDestroy)(layout);
            }
            (api.cublasLtMatmulDescDestroy)(self.desc);
            (api.cublasLtDestroy)(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_per_dtype() {
        let t = |d, o| GemmTypes::for_types(d, o);
        let f32 = t(DType::F32, DType::F32);
        assert!(f32.is_sgemm());
        let tf32 = t(DType::Tf32, DType::Tf32);
        assert_eq!(
            (tf32.input, tf32.output, tf32.compute),
            (R_32F, R_32F, COMPUTE_32F_FAST_TF32)
        );
        assert!(!tf32.is_sgemm());
        let fp16 = t(DType::Fp16, DType::Fp16);
        assert_eq!(
            (fp16.input, fp16.output, fp16.compute),
            (R_16F, R_16F, COMPUTE_32F)
        );
        let fp16_f32 = t(DType::Fp16, DType::F32);
        assert_eq!((fp16_f32.input, fp16_f32.output), (R_16F, R_32F));
        let bf16 = t(DType::Bf16, DType::F32);
        assert_eq!(
            (bf16.input, bf16.output, bf16.compute),
            (R_16BF, R_32F, COMPUTE_32F)
        );
        assert_eq!(bf16.types_label(), "bf16→f32");
        assert_eq!(t(DType::Bf16, DType::Bf16).types_label(), "bf16");
        assert_eq!(t(DType::Tf32, DType::F32).types_label(), "tf32");
        assert_eq!(tf32.compute_label(), "COMPUTE_32F_FAST_TF32");
    }

    #[test]
    fn epilogues_name_the_lt_call() {
        let fp16 = GemmTypes::for_types(DType::Fp16, DType::Fp16);
        let e = |bias, relu| Epilogue { bias, relu };
        assert_eq!(lt_epilogue(e(false, false)), None);
        assert_eq!(lt_epilogue(e(true, false)), Some(EPILOGUE_BIAS));
        assert_eq!(lt_epilogue(e(false, true)), Some(EPILOGUE_RELU));
        assert_eq!(lt_epilogue(e(true, true)), Some(EPILOGUE_RELU_BIAS));
        assert_eq!(
            lt_routine("13.1.0", 1, &fp16, e(true, true)),
            "cuBLASLt 13.1.0 cublasLtMatmul heuristic #2 EPILOGUE_RELU_BIAS COMPUTE_32F fp16"
        );
        assert_eq!(
            lt_routine("13.1.0", 0, &fp16, e(false, false)),
            "cuBLASLt 13.1.0 cublasLtMatmul heuristic #1 COMPUTE_32F fp16"
        );
    }

    #[test]
    fn cublas_status_names() {
        assert_eq!(status_name(15), "CUBLAS_STATUS_NOT_SUPPORTED");
        assert_eq!(status_name(99), "cuBLAS status 99");
        assert!(check("x", SUCCESS).is_ok());
    }
}
