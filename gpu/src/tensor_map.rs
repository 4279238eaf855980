//! TMA tensor maps: what a `cp.async.bulk.tensor` copy reads. The driver encodes one on
//! the host (`cuTensorMapEncodeTiled`, or `cuTensorMapEncodeIm2col` for a convolution's
//! activations) from a [`TensorBox`] (the tensor's extents and
//! strides, the box one copy moves and the swizzle it lands in, checked against the
//! hardware's rules by the atom first) and the tensor's address; a kernel receives it by
//! value as a 128-byte `__grid_constant__` parameter (`KernelArg::Bytes128`). Copies
//! outside the tensor are filled with zeros, which is how the Hopper path pads tails.

use crate::cuda::{Bytes128, CudaError, err};
use cudarc::driver::sys;
use schedule::DType;
use schedule::atom::tma::{TensorBox, TmaError};
use schedule::atom::wgmma::Swizzle;
use thiserror::Error;

/// Why a tensor map could not be had.
#[derive(Debug, Error)]
pub enum TensorMapError {
    /// The box breaks a rule of the hardware (found before the driver is asked).
    #[error(transparent)]
    Rules(#[from] TmaError),
    #[error(transparent)]
    Driver(#[from] CudaError),
}

/// A map the rules refuse is the launch's error like a driver's.
impl From<TensorMapError> for CudaError {
    fn from(e: TensorMapError) -> CudaError {
        match e {
            TensorMapError::Driver(e) => e,
            TensorMapError::Rules(rule) => CudaError {
                what: format!("tensor map: {rule}"),
                name: "TMA_RULES".to_string(),
            },
        }
    }
}

fn data_type(dtype: DType) -> sys::CUtensorMapDataType {
    use sys::CUtensorMapDataType as T;
    match dtype {
        DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::Tf32 => T::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
        DType::Fp16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::Bf16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    }
}

fn swizzle(s: Swizzle) -> sys::CUtensorMapSwizzle {
    use sys::CUtensorMapSwizzle as S;
    match s {
        Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
        Swizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
        Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
    }
}

/// The encoded map of `tensor` at device address `address` (`cuTensorMapEncodeTiled`,
/// or `cuTensorMapEncodeIm2col` for an im2col box). The map holds the address: it is
/// valid while that allocation lives.
pub fn encode(tensor: &TensorBox, address: u64) -> Result<Bytes128, TensorMapError> {
    tensor.check()?;
    let rank = tensor.dims.len();
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let interleave = sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE;
    let promotion = sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    let fill = sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;
    let result = match &tensor.im2col {
        None => {
            let element_strides = vec![1u32; rank];
            // SAFETY: `check` established that every array has `rank` values (strides:
            // `rank - 1`); they live across the call, `map` is writable, and the driver
            // only encodes the address into the map without touching the memory behind it.
            unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    data_type(tensor.dtype),
                    rank as u32,
                    address as *mut std::ffi::c_void,
                    tensor.dims.as_ptr(),
                    tensor.strides.as_ptr(),
                    tensor.boxed.as_ptr(),
                    element_strides.as_ptr(),
                    interleave,
                    swizzle(tensor.swizzle),
                    promotion,
                    fill,
                )
            }
        }
        Some(im2col) => {
            // The channels' entry is ignored without interleave; the image's is 1.
            let element_strides: Vec<u32> = std::iter::once(1)
                .chain(im2col.traversal.iter().copied())
                .chain(std::iter::once(1))
                .collect();
            // SAFETY: `check` established `rank` dimensions, `rank - 1` strides, `rank -
            // 2` corners of each kind and traversal strides (so `element_strides` has
            // `rank`), and a box of channels and pixels; the arrays live across the call,
            // `map` is writable, and the driver only encodes the address.
            unsafe {
                sys::cuTensorMapEncodeIm2col(
                    &mut map,
                    data_type(tensor.dtype),
                    rank as u32,
                    address as *mut std::ffi::c_void,
                    tensor.dims.as_ptr(),
                    tensor.strides.as_ptr(),
                    im2col.lower.as_ptr(),
                    im2col.upper.as_ptr(),
                    tensor.boxed[0],
                    tensor.boxed[1],
                    element_strides.as_ptr(),
                    interleave,
                    swizzle(tensor.swizzle),
                    promotion,
                    fill,
                )
            }
        }
    };
    result
        .result()
        .map_err(err(format!("cuTensorMapEncode({tensor:?})")))?;
    let mut bytes = Bytes128([0; 128]);
    for (chunk, word) in bytes.0.chunks_exact_mut(8).zip(map.opaque) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_that_breaks_the_rules_is_refused_before_the_driver() {
        let tensor = TensorBox {
            dtype: DType::Fp16,
            dims: vec![555, 333],
            strides: vec![1110],
            boxed: vec![64, 64],
            swizzle: Swizzle::B128,
            im2col: None,
        };
        let e = encode(&tensor, 0).unwrap_err();
        assert!(
            matches!(e, TensorMapError::Rules(TmaError::Stride { .. })),
            "{e}"
        );
    }
}
