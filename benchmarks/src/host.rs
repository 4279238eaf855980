//! Device buffers of the baselines' own (the GPU tests' and the tensor-core peak's):
//! values are f32 on the host, elements of the task's type on the device, encoded by
//! `gpu::element` — the measuring buffers' encoding, so both sides see the same bits.

use gpu::cuda::{Buffer, Context, CudaError};
use gpu::element;
use schedule::DType;

/// An uninitialized device buffer of `len` elements of `dtype`.
pub fn alloc(ctx: &Context, len: usize, dtype: DType) -> Result<Buffer, CudaError> {
    ctx.alloc_typed(len, dtype)
}

/// A device buffer holding `values` as `dtype` elements.
pub fn upload(ctx: &Context, values: &[f32], dtype: DType) -> Result<Buffer, CudaError> {
    let buffer = ctx.alloc_typed(values.len(), dtype)?;
    ctx.upload(&buffer, values)?;
    Ok(buffer)
}

/// The first `len` `dtype` elements of `buffer`, as f32 values.
pub fn download(
    ctx: &Context,
    buffer: &Buffer,
    len: usize,
    dtype: DType,
) -> Result<Vec<f32>, CudaError> {
    let mut values = element::decode(&ctx.download_bytes(buffer)?, dtype);
    values.truncate(len);
    Ok(values)
}
