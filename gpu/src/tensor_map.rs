//! TMA tensor maps: what a `cp.async.bulk.tensor` copy reads. The driver encodes one on
//! the host (`cuTensorMapEncodeTiled`) from a tensor's address, extents and strides,
//! the box one copy moves and the swizzle it lands in; a kernel receives it by value as
//! a 128-byte `__grid_constant__` parameter (`KernelArg::Bytes128`). Copies outside the
//! tensor are filled with zeros, which is how the Hopper path pads tails.
//!
//! The swizzle is the one the wgmma descriptors name (`schedule::atom::wgmma::Swizzle`),
//! so that a box lands in shared memory exactly as `SharedTileLayout` lays it out.

use crate::cuda::{Bytes128, CudaError, err};
use cudarc::driver::sys;
use schedule::DType;
use schedule::atom::wgmma::Swizzle;

/// A tiled tensor map's description, innermost dimension first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiled {
    pub dtype: DType,
    /// Extent of each dimension, in elements.
    pub dims: Vec<u64>,
    /// Byte stride of each dimension but the innermost (which is contiguous).
    pub strides: Vec<u64>,
    /// Elements of each dimension one copy moves.
    pub boxed: Vec<u32>,
    pub swizzle: Swizzle,
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

impl Tiled {
    /// The encoded map of the tensor at device address `address`. The driver checks
    /// what the hardware requires (address and strides 16-byte aligned, a box of at
    /// most 256 per dimension whose innermost bytes fit the swizzle) and its refusal is
    /// the error. The map holds the address: it is valid while that allocation lives.
    pub fn encode(&self, address: u64) -> Result<Bytes128, CudaError> {
        let rank = self.dims.len();
        if rank == 0 || self.strides.len() + 1 != rank || self.boxed.len() != rank {
            return Err(CudaError {
                what: format!("tensor map of {rank} dimensions"),
                name: format!(
                    "needs {} strides and {rank} box extents, got {} and {}",
                    rank.saturating_sub(1),
                    self.strides.len(),
                    self.boxed.len()
                ),
            });
        }
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let element_strides = vec![1u32; rank];
        // SAFETY: every pointer names an array of `rank` (strides: `rank - 1`) values
        // that lives across the call, `map` is writable, and the driver only encodes
        // the address into the map without touching the memory behind it.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                data_type(self.dtype),
                rank as u32,
                address as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.boxed.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle(self.swizzle),
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(err(format!("cuTensorMapEncodeTiled({self:?})")))?;
        let mut bytes = Bytes128([0; 128]);
        for (chunk, word) in bytes.0.chunks_exact_mut(8).zip(map.opaque) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_of_mismatched_ranks_is_refused_before_the_driver() {
        let map = Tiled {
            dtype: DType::Fp16,
            dims: vec![80, 100],
            strides: vec![],
            boxed: vec![64, 64],
            swizzle: Swizzle::B128,
        };
        let e = map.encode(0).unwrap_err();
        assert!(e.name.contains("needs 1 strides and 2 box extents"), "{e}");
    }
}
