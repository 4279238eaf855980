//! Host-side element encoding for the baselines' own device buffers (the GPU tests' and
//! the tensor-core peak's): values are f32 on the host, elements of the task's type on
//! the device (f32 and TF32 data as f32, fp16 and bf16 as 16-bit words, little-endian).
//!
//! This is the one place that encodes; it is to become `gpu::element` (the measuring
//! buffers' encoding) once that lands, so that both sides see the same bits. Buffers
//! are allocated in 4-byte words, as the driver wrapper allocates them today, and carry
//! their elements' bytes packed inside.

use gpu::cuda::{Buffer, Context, CudaError};
use half::{bf16, f16};
use schedule::DType;

/// `values` as the bytes of `dtype` elements (narrowing rounds to nearest even).
pub fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 | DType::Tf32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::Fp16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        DType::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

/// The f32 values of the whole `dtype` elements in `bytes` (widening is exact).
pub fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    let chunks = bytes.chunks_exact(dtype.bytes() as usize);
    match dtype {
        DType::F32 | DType::Tf32 => chunks
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::Fp16 => chunks
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::Bf16 => chunks
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// 4-byte words holding `bytes` (zero-padded), as f32 bit patterns: the driver wrapper
/// uploads f32 words and keeps their bits.
fn words(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

/// An uninitialized device buffer with room for `len` elements of `dtype`.
pub fn alloc(ctx: &Context, len: usize, dtype: DType) -> Result<Buffer, CudaError> {
    ctx.alloc((len * dtype.bytes() as usize).div_ceil(4))
}

/// A device buffer holding `values` as `dtype` elements.
pub fn upload(ctx: &Context, values: &[f32], dtype: DType) -> Result<Buffer, CudaError> {
    let host = words(&encode(values, dtype));
    let buffer = ctx.alloc(host.len())?;
    ctx.upload(&buffer, &host)?;
    Ok(buffer)
}

/// The first `len` `dtype` elements of `buffer`, as f32 values.
pub fn download(
    ctx: &Context,
    buffer: &Buffer,
    len: usize,
    dtype: DType,
) -> Result<Vec<f32>, CudaError> {
    let bytes: Vec<u8> = ctx
        .download(buffer)?
        .iter()
        .flat_map(|w| w.to_bits().to_le_bytes())
        .collect();
    let mut values = decode(&bytes, dtype);
    values.truncate(len);
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_integers_round_trip_in_every_type() {
        let values: Vec<f32> = (-256..=256).map(|v| v as f32).collect();
        for dtype in DType::ALL {
            let bytes = encode(&values, dtype);
            assert_eq!(bytes.len(), values.len() * dtype.bytes() as usize);
            assert_eq!(decode(&bytes, dtype), values, "{dtype}");
        }
        assert_eq!(encode(&[1.0, -2.0], DType::Fp16), [0x00, 0x3c, 0x00, 0xc0]);
        assert_eq!(encode(&[1.0, -2.0], DType::Bf16), [0x80, 0x3f, 0x00, 0xc0]);
    }

    #[test]
    fn packed_words_keep_every_byte() {
        let bytes = encode(&[1.0, 2.0, 3.0], DType::Fp16);
        let w = words(&bytes);
        assert_eq!(w.len(), 2);
        let back: Vec<u8> = w.iter().flat_map(|w| w.to_bits().to_le_bytes()).collect();
        assert_eq!(&back[..6], &bytes[..]);
        assert_eq!(decode(&back, DType::Fp16)[..3], [1.0, 2.0, 3.0]);
    }
}
