//! Element encoding: host values are f32 whatever the task's type, device buffers hold
//! elements of the task's type (f32 and TF32 data as f32, fp16 and bf16 as 16-bit
//! words, little-endian as the GPU stores them). Inputs are encoded on upload, outputs
//! decoded to f32 for the exact comparison. The measurement buffers and the benchmarks
//! both encode through here, so they see the same bits.
//!
//! Narrowing rounds to nearest even, as the kernels' `cvt.rn` does; the check's values
//! are small integers, exact in every type, so no input is ever rounded in practice.

use half::{bf16, f16};
use schedule::DType;

/// `values` as the bytes of a device buffer of `dtype` elements.
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

/// The f32 values of the `dtype` elements in `bytes` (widening is exact).
///
/// # Panics
/// When `bytes` is not a whole number of elements: buffers are allocated in elements,
/// so a ragged length is a bug of the caller.
pub fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    let size = dtype.bytes() as usize;
    assert_eq!(
        bytes.len() % size,
        0,
        "{} bytes are not a whole number of {dtype} elements",
        bytes.len()
    );
    let chunks = bytes.chunks_exact(size);
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

/// The quiet NaN of `dtype` that poisons an output before a kernel runs, in the low
/// `dtype.bytes()` bytes: f32 0x7fc00000, fp16 0x7e00, bf16 0x7fc0. Any element a kernel
/// leaves unwritten decodes to NaN, which equals nothing.
pub fn nan_bits(dtype: DType) -> u32 {
    match dtype {
        DType::F32 | DType::Tf32 => f32::NAN.to_bits(),
        DType::Fp16 => u32::from(f16::NAN.to_bits()),
        DType::Bf16 => u32::from(bf16::NAN.to_bits()),
    }
}

/// The largest magnitude up to which every integer is exact in a stored `dtype`
/// element: 2^24 in f32 (24 significant bits; TF32 data and outputs are stored as f32),
/// 2048 in fp16 (11), 256 in bf16 (8). (A TF32 multiplier keeps 11 bits of its inputs,
/// exact up to 2048, far above the check's input values.)
pub fn exact_integer_limit(dtype: DType) -> u32 {
    match dtype {
        DType::F32 | DType::Tf32 => 1 << 24,
        DType::Fp16 => 2048,
        DType::Bf16 => 256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_integers_survive_a_round_trip_in_every_type() {
        let values: Vec<f32> = (-300..=300).map(|v| v as f32).collect();
        for dtype in DType::ALL {
            let bytes = encode(&values, dtype);
            assert_eq!(bytes.len(), values.len() * dtype.bytes() as usize);
            let limit = exact_integer_limit(dtype) as f32;
            for (v, back) in values.iter().zip(decode(&bytes, dtype)) {
                if v.abs() <= limit {
                    assert_eq!(back, *v, "{dtype}");
                }
            }
        }
    }

    #[test]
    fn halves_are_little_endian_ieee_and_bfloat_bits() {
        assert_eq!(encode(&[1.0, -2.0], DType::Fp16), [0x00, 0x3c, 0x00, 0xc0]);
        assert_eq!(encode(&[1.0, -2.0], DType::Bf16), [0x80, 0x3f, 0x00, 0xc0]);
        assert_eq!(encode(&[1.0], DType::F32), 1.0f32.to_le_bytes());
        assert_eq!(encode(&[1.0], DType::Tf32), 1.0f32.to_le_bytes());
        assert_eq!(decode(&[0x00, 0x3c, 0x00, 0xbc], DType::Fp16), [1.0, -1.0]);
        assert_eq!(decode(&[0x80, 0x3f, 0x80, 0xbf], DType::Bf16), [1.0, -1.0]);
    }

    #[test]
    fn narrowing_rounds_to_nearest_even_like_cvt_rn() {
        // 2049 lies halfway between 2048 and 2050: the even significand (2048) wins.
        let fp16 = |v: f32| decode(&encode(&[v], DType::Fp16), DType::Fp16)[0];
        assert_eq!(fp16(2049.0), 2048.0);
        assert_eq!(fp16(2051.0), 2052.0);
        assert_eq!(fp16(-2049.0), -2048.0);
        let bf16 = |v: f32| decode(&encode(&[v], DType::Bf16), DType::Bf16)[0];
        assert_eq!(bf16(257.0), 256.0);
        assert_eq!(bf16(259.0), 260.0);
        assert_eq!(bf16(255.0), 255.0);
    }

    #[test]
    fn poison_decodes_to_nan_in_its_own_type() {
        assert_eq!(nan_bits(DType::F32), 0x7fc0_0000);
        assert_eq!(nan_bits(DType::Fp16), 0x7e00);
        assert_eq!(nan_bits(DType::Bf16), 0x7fc0);
        for dtype in DType::ALL {
            let size = dtype.bytes() as usize;
            let bytes = &nan_bits(dtype).to_le_bytes()[..size];
            let v = decode(bytes, dtype);
            assert!(v.len() == 1 && v[0].is_nan(), "{dtype}");
        }
    }

    #[test]
    #[should_panic(expected = "not a whole number of fp16 elements")]
    fn a_ragged_buffer_is_a_bug() {
        decode(&[0, 0, 0], DType::Fp16);
    }
}
