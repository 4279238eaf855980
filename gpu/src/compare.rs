//! The exact comparison of a candidate's output with the expected one, on the GPU.
//!
//! The rule is `check::first_mismatch`'s: every element equal, up to the sign of zero.
//! Both outputs are in the output's element type, and two elements of the same type
//! decode to equal f32 values exactly when their bits are equal or both are zeros (the
//! expected output is finite, so NaN never has to equal anything). Comparing the bits
//! where they are saves copying a task-sized output back and decoding it for every
//! candidate (32 MB for a 4096² fp16 GEMM, 128 MB for 8192²): only the index of the
//! first difference comes back. A candidate that differs is compared again on the host,
//! so that its message names the values as before.

use crate::cuda::{Buffer, Context, CudaError, Module};
use schedule::LaunchConfig;

/// `first[0] = min(i)` over the elements `i < n` of `got` that differ from `expected`
/// beyond the sign of zero; elements of `width` bytes (2 or 4). PTX that the driver
/// compiles for any GPU since Volta, like the timing's spin kernel.
pub const COMPARE_PTX: &str = r#".version 7.0
.target sm_70
.address_size 64
.visible .entry tilesched_compare(.param .u64 expected, .param .u64 got, .param .u64 first,
    .param .u64 n, .param .u64 width)
{
  .reg .pred %p<4>;
  .reg .b16 %h<3>;
  .reg .b32 %r<10>;
  .reg .b64 %rd<16>;
  ld.param.u64 %rd1, [expected];
  ld.param.u64 %rd2, [got];
  ld.param.u64 %rd3, [first];
  ld.param.u64 %rd4, [n];
  ld.param.u64 %rd5, [width];
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  cvta.to.global.u64 %rd3, %rd3;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  mul.wide.u32 %rd6, %r1, %r2;
  cvt.u64.u32 %rd7, %r3;
  add.u64 %rd6, %rd6, %rd7;
  mul.wide.u32 %rd8, %r4, %r2;
  setp.eq.u64 %p1, %rd5, 4;
  selp.b32 %r5, 2147483647, 32767, %p1;
$L_loop:
  setp.ge.u64 %p2, %rd6, %rd4;
  @%p2 bra $L_done;
  mul.lo.u64 %rd9, %rd6, %rd5;
  add.u64 %rd10, %rd1, %rd9;
  add.u64 %rd11, %rd2, %rd9;
  @%p1 bra $L_wide;
  ld.global.u16 %h1, [%rd10];
  ld.global.u16 %h2, [%rd11];
  cvt.u32.u16 %r6, %h1;
  cvt.u32.u16 %r7, %h2;
  bra $L_compare;
$L_wide:
  ld.global.u32 %r6, [%rd10];
  ld.global.u32 %r7, [%rd11];
$L_compare:
  setp.eq.u32 %p3, %r6, %r7;
  or.b32 %r8, %r6, %r7;
  and.b32 %r8, %r8, %r5;
  setp.eq.or.u32 %p3, %r8, 0, %p3;
  @%p3 bra $L_next;
  atom.global.min.u64 %rd12, [%rd3], %rd6;
$L_next:
  add.u64 %rd6, %rd6, %rd8;
  bra $L_loop;
$L_done:
  ret;
}
"#;

/// Threads per block of the comparison, and most blocks (a grid-stride loop covers the
/// rest): enough to stream a task-sized output at memory bandwidth.
const THREADS: u32 = 256;
const MAX_BLOCKS: u64 = 4096;

/// The comparison kernel, loaded in a context, with its one-word result buffer.
pub struct Comparer {
    module: Module,
    first: Buffer,
}

impl Comparer {
    pub fn new(ctx: &Context) -> Result<Comparer, CudaError> {
        let module = ctx.load(COMPARE_PTX.as_bytes())?;
        // Two 4-byte words: the 64-bit index of the first difference.
        let first = ctx.alloc_typed(2, schedule::DType::F32)?;
        Ok(Comparer { module, first })
    }

    /// The index of the first element of `got` that differs from `expected` (same
    /// length and element type) beyond the sign of zero, once the stream's work before
    /// it is done; None when they are equal.
    pub fn first_difference(
        &self,
        ctx: &Context,
        expected: &Buffer,
        got: &Buffer,
    ) -> Result<Option<usize>, CudaError> {
        if expected.len != got.len || expected.dtype != got.dtype {
            return Ok(Some(expected.len.min(got.len)));
        }
        let none = u64::MAX.to_le_bytes();
        ctx.upload_bytes(&self.first, &none)?;
        let n = expected.len as u64;
        let blocks = n.div_ceil(u64::from(THREADS)).clamp(1, MAX_BLOCKS) as u32;
        let function = self.module.function("tilesched_compare", 0)?;
        let width = u64::from(expected.dtype.bytes());
        ctx.launch(
            &function,
            &LaunchConfig::linear(blocks, THREADS, 0),
            &[expected, got, &self.first],
            &[n, width],
        )?;
        let bytes = ctx.download_bytes(&self.first)?;
        let index = u64::from_le_bytes(bytes[..8].try_into().expect("an 8-byte result"));
        Ok((index != u64::MAX).then_some(index as usize))
    }
}
