//! The cuBLAS baseline for matmul and batch matmul: `cublasSgemm` / strided batched
//! sgemm in float32 with the default math mode (TF32 is used only when a caller asks
//! for `CUBLAS_TF32_TENSOR_OP_MATH`), on the measuring context's stream.
//!
//! Our operands are row-major (`C[M,N] = A[M,K]·B[K,N]`); cuBLAS is column-major, so
//! the call computes `Cᵀ = Bᵀ·Aᵀ`, whose column-major form is exactly our row-major C.

use crate::vendor::VendorError;
use cudarc::cublas::sys::{self, cublasOperation_t::CUBLAS_OP_N, cublasStatus_t};
use gpu::cuda::{Buffer, Context};

fn check(call: &'static str, status: cublasStatus_t) -> Result<(), VendorError> {
    if status == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(VendorError::Call {
            call,
            status: format!("{status:?}"),
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
}

/// A cuBLAS handle bound to a context's stream.
pub struct Cublas {
    handle: sys::cublasHandle_t,
}

impl Cublas {
    pub fn new(ctx: &Context) -> Result<Cublas, VendorError> {
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a handle, created on the current context.
        check("cublasCreate", unsafe { sys::cublasCreate_v2(&mut handle) })?;
        let this = Cublas { handle };
        // SAFETY: live handle; the raw stream belongs to the current context.
        check("cublasSetStream", unsafe {
            sys::cublasSetStream_v2(this.handle, ctx.raw_stream().cast())
        })?;
        // SAFETY: live handle.
        check("cublasSetMathMode", unsafe {
            sys::cublasSetMathMode(this.handle, sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
        })?;
        Ok(this)
    }

    /// Enqueues `c = a·b` for `shape` (buffers in our kernels' order: A, B, C).
    pub fn sgemm(&self, shape: Gemm, buffers: [&Buffer; 3]) -> Result<(), VendorError> {
        let [a, b, c] = buffers;
        let expect = |buf: &Buffer, len: u64| buf.len as u64 >= len;
        let (batch, m, n, k) = (
            u64::from(shape.batch),
            u64::from(shape.m),
            u64::from(shape.n),
            u64::from(shape.k),
        );
        if !(expect(a, batch * m * k) && expect(b, batch * k * n) && expect(c, batch * m * n)) {
            return Err(VendorError::Call {
                call: "sgemm",
                status: "buffers smaller than the shape".to_string(),
            });
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (mi, ni, ki) = (shape.m as i32, shape.n as i32, shape.k as i32);
        let (pa, pb, pc) = (
            a.device_ptr() as *const f32,
            b.device_ptr() as *const f32,
            c.device_ptr() as *mut f32,
        );
        if shape.batch == 1 {
            // SAFETY: buffer sizes checked above; leading dimensions are the row
            // lengths of the row-major operands.
            return check("cublasSgemm", unsafe {
                sys::cublasSgemm_v2(
                    self.handle,
                    CUBLAS_OP_N,
                    CUBLAS_OP_N,
                    ni,
                    mi,
                    ki,
                    &alpha,
                    pb,
                    ni,
                    pa,
                    ki,
                    &beta,
                    pc,
                    ni,
                )
            });
        }
        // SAFETY: as above, with each batch's operands packed one after the other.
        check("cublasSgemmStridedBatched", unsafe {
            sys::cublasSgemmStridedBatched(
                self.handle,
                CUBLAS_OP_N,
                CUBLAS_OP_N,
                ni,
                mi,
                ki,
                &alpha,
                pb,
                ni,
                (k * n) as i64,
                pa,
                ki,
                (m * k) as i64,
                &beta,
                pc,
                ni,
                (m * n) as i64,
                shape.batch as i32,
            )
        })
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe {
            sys::cublasDestroy_v2(self.handle);
        }
    }
}

/// The cuBLAS version the loaded library reports, e.g. "13.0.2".
pub fn version(handle: &Cublas) -> String {
    let mut v = 0;
    // SAFETY: live handle and out-pointer.
    unsafe { sys::cublasGetVersion_v2(handle.handle, &mut v) };
    format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
}
