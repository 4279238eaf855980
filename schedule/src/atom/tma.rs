//! The TMA tiled copy (`cp.async.bulk.tensor`) as data: the box of a tensor that one
//! copy moves into shared memory, and the rules the hardware sets on it. The driver
//! checks the same rules when it encodes a tensor map (`gpu::tensor_map`), but the
//! search needs them before any GPU is involved: a state whose operands TMA cannot
//! describe is refused in validation, as data, rather than failing at encode time.
//!
//! The rules (CUDA driver API, `cuTensorMapEncodeTiled`): 1 to 5 dimensions; the
//! innermost is contiguous and every other stride is a multiple of 16 bytes below 2^40;
//! extents are at most 2^32; a box is at most 256 elements per dimension, its inner
//! extent a multiple of 16 bytes and, under a swizzle, at most the swizzle's span (32,
//! 64 or 128 bytes). The box lands in shared memory as rows of its inner extent, one row
//! per combination of the outer coordinates, in the swizzle's layout
//! ([`SharedTileLayout`]). Elements outside the tensor are filled with zeros.
//!
//! The im2col mode (`cuTensorMapEncodeIm2col`, [`Im2col`]) reads a convolution's
//! activations as the rows of its implicit GEMM: a channels-last tensor (C, W, H[, D], N,
//! innermost first) whose box is `pixels` rows of `channels` channels. The copy's
//! coordinates name the first row's filter base pixel (`c, w, h, n`, the padding's shift
//! included) and its filter offsets (`offW, offH`); the rows walk the bounding box of base
//! pixels at the convolution's stride, wrapping to the box's first column, then row, then
//! the next image, as the output pixels of a GEMM row tile follow one another. The pixel
//! read is the base plus the offsets; outside the tensor it is zeros, which pads the
//! convolution (PTX ISA 8.x, "Tensor im2col mode"; the corner and coordinate formulas are
//! those CUTLASS 3's SM90 convolutions and Triton's im2col tests use).

use super::swizzle::SharedTileLayout;
use super::wgmma::Swizzle;
use crate::task::DType;
use thiserror::Error;

/// The most dimensions a tensor map has.
pub const MAX_RANK: usize = 5;
/// The most elements of a box along one dimension.
pub const MAX_BOX: u32 = 256;
/// Global addresses and strides are multiples of this.
pub const ALIGNMENT_BYTES: u64 = 16;

/// Why TMA cannot describe a copy.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TmaError {
    #[error("a tensor map has 1 to {MAX_RANK} dimensions, not {0}")]
    Rank(usize),
    #[error(
        "stride {stride} bytes of dimension {dim} is not a multiple of 16 (or is 2^40 or more)"
    )]
    Stride { dim: usize, stride: u64 },
    #[error("extent {extent} of dimension {dim} is 0 or above 2^32")]
    Extent { dim: usize, extent: u64 },
    #[error("box extent {extent} of dimension {dim} is 0 or above {MAX_BOX}")]
    Box { dim: usize, extent: u32 },
    #[error(
        "the box's inner extent is {bytes} bytes: not a multiple of 16, or wider than its swizzle"
    )]
    InnerBytes { bytes: u64 },
    #[error(
        "im2col: a corner, traversal stride or pixel count is out of the hardware's range ({what})"
    )]
    Im2col { what: &'static str },
}

/// The most rows (pixels) of an im2col box this project uses: the GEMM tiles are at
/// most 256 rows (the driver takes up to 1024 on recent toolkits, 256 on older ones).
pub const MAX_IM2COL_PIXELS: u32 = 256;

/// The im2col mode of a tensor map: per spatial dimension, innermost first (W, H[, D]),
/// the bounding box of the filter's base pixel, its `lower` corner counted from
/// coordinate 0 and its `upper` corner from the dimension's last coordinate (the box
/// covers `lower ..= extent - 1 + upper`), and the `traversal` stride of the walk (the
/// convolution's stride).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Im2col {
    pub lower: Vec<i32>,
    pub upper: Vec<i32>,
    pub traversal: Vec<u32>,
}

impl Im2col {
    /// The corners' range for a tensor of `rank` dimensions (16 bits shared by its
    /// spatial dimensions), and the filter offsets' (unsigned, as many bits).
    pub fn ranges(rank: usize) -> (std::ops::RangeInclusive<i32>, std::ops::RangeInclusive<i32>) {
        match rank {
            3 => (-(1 << 15)..=(1 << 15) - 1, 0..=(1 << 16) - 1),
            4 => (-(1 << 7)..=(1 << 7) - 1, 0..=(1 << 8) - 1),
            _ => (-(1 << 4)..=(1 << 4) - 1, 0..=(1 << 5) - 1),
        }
    }
}

/// A tiled tensor map's description: the tensor, innermost dimension first, and the
/// box one copy moves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TensorBox {
    pub dtype: DType,
    /// Extent of each dimension, in elements.
    pub dims: Vec<u64>,
    /// Byte stride of each dimension but the innermost (which is contiguous).
    pub strides: Vec<u64>,
    /// Elements of each dimension one copy moves.
    pub boxed: Vec<u32>,
    pub swizzle: Swizzle,
    /// The im2col mode; `boxed` is then `[channels, pixels]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub im2col: Option<Im2col>,
}

impl TensorBox {
    /// A row-major matrix of `rows` rows of `columns` elements, `row_stride` elements
    /// apart, under `batches` copies `batch_stride` elements apart (a third dimension
    /// when more than one), copied in boxes of `box_rows` rows of `box_columns`.
    #[allow(clippy::too_many_arguments)]
    pub fn matrix(
        dtype: DType,
        rows: u64,
        columns: u64,
        row_stride: u64,
        batches: u64,
        batch_stride: u64,
        box_rows: u32,
        box_columns: u32,
        swizzle: Swizzle,
    ) -> Result<TensorBox, TmaError> {
        let bytes = u64::from(dtype.bytes());
        let mut tensor = TensorBox {
            dtype,
            dims: vec![columns, rows],
            strides: vec![row_stride * bytes],
            boxed: vec![box_columns, box_rows],
            swizzle,
            im2col: None,
        };
        if batches > 1 {
            tensor.dims.push(batches);
            tensor.strides.push(batch_stride * bytes);
            tensor.boxed.push(1);
        }
        tensor.check()?;
        Ok(tensor)
    }

    /// The hardware's rules (see the module's documentation).
    pub fn check(&self) -> Result<(), TmaError> {
        let rank = self.dims.len();
        let (ranks, boxed) = match &self.im2col {
            None => (1..=MAX_RANK, rank),
            Some(_) => (3..=MAX_RANK, 2),
        };
        if !ranks.contains(&rank) || self.strides.len() + 1 != rank || self.boxed.len() != boxed {
            return Err(TmaError::Rank(rank));
        }
        if let Some(im2col) = &self.im2col {
            let spatial = rank - 2;
            let (corners, _) = Im2col::ranges(rank);
            let what = if [&im2col.lower, &im2col.upper]
                .iter()
                .any(|c| c.len() != spatial || !c.iter().all(|x| corners.contains(x)))
            {
                Some("corners")
            } else if im2col.traversal.len() != spatial
                || !im2col.traversal.iter().all(|s| (1..=8).contains(s))
            {
                Some("traversal strides")
            } else if self.boxed[1] > MAX_IM2COL_PIXELS {
                Some("pixels")
            } else {
                None
            };
            if let Some(what) = what {
                return Err(TmaError::Im2col { what });
            }
        }
        for (dim, &extent) in self.dims.iter().enumerate() {
            if extent == 0 || extent > 1 << 32 {
                return Err(TmaError::Extent { dim, extent });
            }
        }
        for (i, &stride) in self.strides.iter().enumerate() {
            if stride % ALIGNMENT_BYTES != 0 || stride >= 1 << 40 {
                return Err(TmaError::Stride { dim: i + 1, stride });
            }
        }
        for (dim, &extent) in self.boxed.iter().enumerate() {
            if extent == 0 || extent > MAX_BOX {
                return Err(TmaError::Box { dim, extent });
            }
        }
        let inner = u64::from(self.boxed[0]) * u64::from(self.dtype.bytes());
        let span = self.swizzle.row_bytes().map_or(u64::MAX, |b| b as u64);
        if inner % ALIGNMENT_BYTES != 0 || inner > span {
            return Err(TmaError::InnerBytes { bytes: inner });
        }
        Ok(())
    }

    /// Bytes one copy moves (and completes on its mbarrier), out-of-bounds zeros
    /// included.
    pub fn box_bytes(&self) -> u64 {
        self.boxed.iter().map(|&b| u64::from(b)).product::<u64>() * u64::from(self.dtype.bytes())
    }

    /// Why a copy of an im2col box at `origin` (its coordinates, then its filter
    /// offsets) would fault, None where it is legal: the walk's first base pixel must lie
    /// in the bounding box, and the offsets in their range. (A tiled box may start
    /// anywhere; what lies outside the tensor is zeros.)
    pub fn origin_error(&self, origin: &[i64]) -> Option<&'static str> {
        let im2col = self.im2col.as_ref()?;
        let rank = self.dims.len();
        let (_, offsets) = Im2col::ranges(rank);
        let spatial = rank - 2;
        for d in 0..spatial {
            let last = self.dims[d + 1] as i64 - 1 + i64::from(im2col.upper[d]);
            if !(i64::from(im2col.lower[d])..=last).contains(&origin[d + 1]) {
                return Some("the base pixel lies outside the bounding box");
            }
            let offset = origin[rank + d];
            if !(i64::from(*offsets.start())..=i64::from(*offsets.end())).contains(&offset) {
                return Some("a filter offset is out of range");
            }
        }
        None
    }

    /// Every element of the box at `origin` (tensor coordinates, innermost first, then
    /// an im2col box's filter offsets): its element offset in shared memory from the
    /// box's start (as `shared_layout` lays it out) and its element offset in the tensor,
    /// None outside the tensor (a load fills zeros there, a store skips it).
    pub fn elements(&self, origin: &[i64]) -> Vec<(i64, Option<i64>)> {
        let bytes = i64::from(self.dtype.bytes());
        // Element strides: the innermost dimension is contiguous.
        let strides: Vec<i64> = std::iter::once(1)
            .chain(self.strides.iter().map(move |&s| s as i64 / bytes))
            .collect();
        let layout = self.shared_layout();
        let inner = i64::from(self.boxed[0]);
        let within = |d: usize, x: i64| (0..self.dims[d] as i64).contains(&x);
        let Some(im2col) = &self.im2col else {
            let count: i64 = self.boxed.iter().map(|&b| i64::from(b)).product();
            return (0..count)
                .map(|e| {
                    // Box coordinates, innermost first; the row is the outer ones flattened.
                    let (mut rest, mut global, mut inside) = (e, 0, true);
                    for (d, &extent) in self.boxed.iter().enumerate() {
                        let x = origin[d] + rest % i64::from(extent);
                        rest /= i64::from(extent);
                        inside &= within(d, x);
                        global += x * strides[d];
                    }
                    (
                        layout.offset(e / inner, e % inner),
                        inside.then_some(global),
                    )
                })
                .collect();
        };
        let rank = self.dims.len();
        let spatial = rank - 2;
        let offsets = &origin[rank..rank + spatial];
        // The walk of base pixels: spatial coordinates innermost first, then the image.
        let mut base: Vec<i64> = origin[1..rank].to_vec();
        let last = |d: usize| self.dims[d + 1] as i64 - 1 + i64::from(im2col.upper[d]);
        let mut out = Vec::with_capacity((inner * i64::from(self.boxed[1])) as usize);
        for row in 0..i64::from(self.boxed[1]) {
            let mut pixel = base[spatial] * strides[rank - 1];
            let mut inside = within(rank - 1, base[spatial]);
            for d in 0..spatial {
                let x = base[d] + offsets[d];
                inside &= within(d + 1, x);
                pixel += x * strides[d + 1];
            }
            for ch in 0..inner {
                let c = origin[0] + ch;
                let global = (inside && within(0, c)).then_some(pixel + c);
                out.push((layout.offset(row, ch), global));
            }
            // The next base pixel: a traversal step, wrapping at the box's far corner
            // into the next row, and past the last row into the next image.
            let mut d = 0;
            while d < spatial {
                base[d] += i64::from(im2col.traversal[d]);
                if base[d] <= last(d) {
                    break;
                }
                base[d] = i64::from(im2col.lower[d]);
                d += 1;
            }
            if d == spatial {
                base[spatial] += 1;
            }
        }
        out
    }

    /// Where the box lands in shared memory: rows of its inner extent, swizzled as the
    /// tensor map says.
    pub fn shared_layout(&self) -> SharedTileLayout {
        let row_elements = i64::from(self.boxed[0]);
        SharedTileLayout {
            rows: self.boxed[1..].iter().map(|&b| i64::from(b)).product(),
            row_elements,
            chunk_elements: 16 / i64::from(self.dtype.bytes()),
            swizzle: self.swizzle != Swizzle::None,
        }
    }
}

/// The C type a kernel receives a tensor map as (`const __grid_constant__`): the
/// driver's 128 opaque bytes, without the driver's header.
pub const MAP_TYPE_C: &str = "struct __align__(64) TmaMap { unsigned long long opaque[16]; };";

/// `mbarrier.init` of the barrier at 32-bit shared address `bar` for `arrivals`
/// arrivals per phase.
pub fn mbarrier_init_c(bar: &str, arrivals: u32) -> String {
    format!(
        "asm volatile(\"mbarrier.init.shared::cta.b64 [%0], {arrivals};\" :: \"r\"({bar}) : \"memory\");"
    )
}

/// One arrival on the barrier at `bar` that also expects `bytes` from copies.
pub fn arrive_expect_tx_c(bar: &str, bytes: i64) -> String {
    format!(
        "asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], {bytes};\" :: \"r\"({bar}) : \"memory\");"
    )
}

/// One arrival on the barrier at `bar` (a consumer releasing a buffer).
pub fn arrive_c(bar: &str) -> String {
    format!(
        "asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"({bar}) : \"memory\");"
    )
}

/// The copy of the box of the tensor map named `map` at `coords` (innermost first,
/// 32-bit C expressions; an im2col map's filter `offsets` after them, 16-bit) to 32-bit
/// shared address `dst`, completing on `bar`; with a `multicast` mask (a C
/// expression), into the blocks of the cluster whose ranks are its bits, at `dst` and
/// on `bar` in each.
pub fn load_c(
    map: &str,
    (coords, offsets): (&[String], &[String]),
    dst: &str,
    bar: &str,
    multicast: Option<&str>,
) -> String {
    let first = if multicast.is_some() { 4 } else { 3 };
    let slots = |from: usize, n: usize| -> Vec<String> {
        (from..from + n).map(|i| format!("%{i}")).collect()
    };
    let mut operands: Vec<String> = coords.iter().map(|c| format!("\"r\"({c})")).collect();
    operands.extend(
        offsets
            .iter()
            .map(|o| format!("\"h\"((unsigned short)({o}))")),
    );
    let (mode, offsets) = if offsets.is_empty() {
        ("", String::new())
    } else {
        (
            ".im2col",
            format!(
                ", {{{}}}",
                slots(first + coords.len(), offsets.len()).join(", ")
            ),
        )
    };
    let (cast, mask, mask_operand) = match multicast {
        Some(mask) => (
            ".multicast::cluster",
            ", %3",
            format!("\"h\"((unsigned short){mask}), "),
        ),
        None => ("", "", String::new()),
    };
    format!(
        "asm volatile(\"cp.async.bulk.tensor.{}d.shared::cluster.global{mode}.mbarrier::complete_tx::bytes{cast} [%0], [%1, {{{}}}], [%2]{offsets}{mask};\" \
         :: \"r\"({dst}), \"l\"((unsigned long long)&{map}), \"r\"({bar}), {mask_operand}{} : \"memory\");",
        coords.len(),
        slots(first, coords.len()).join(", "),
        operands.join(", ")
    )
}

/// The TMA store of the box of the tensor map named `map` at `coords` (innermost
/// first, 32-bit C expressions) from 32-bit shared address `src`, as one bulk group of
/// the thread's.
pub fn store_c(map: &str, coords: &[String], src: &str) -> String {
    let slots: Vec<String> = (0..coords.len()).map(|i| format!("%{}", i + 2)).collect();
    let operands: Vec<String> = coords.iter().map(|c| format!("\"r\"({c})")).collect();
    format!(
        "asm volatile(\"cp.async.bulk.tensor.{}d.global.shared::cta.bulk_group [%0, {{{}}}], [%1];\" \
         :: \"l\"((unsigned long long)&{map}), \"r\"({src}), {} : \"memory\"); \
         asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");",
        coords.len(),
        slots.join(", "),
        operands.join(", ")
    )
}

/// Waits until all but the thread's `pending` newest TMA stores have read their shared
/// memory.
pub fn store_wait_read_c(pending: u32) -> String {
    format!("asm volatile(\"cp.async.bulk.wait_group.read {pending};\" ::: \"memory\");")
}

/// Makes the thread's generic-proxy writes of shared memory visible to TMA.
pub const FENCE_PROXY_ASYNC_C: &str =
    "asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");";

/// One arrival on the barrier at `bar` (this block's 32-bit shared address) of the
/// cluster's block of rank `rank` (a C expression): `mapa` finds it in the cluster's
/// shared window. The arrival keeps the default `.release.cta` semantics, as CUTLASS's
/// cluster barriers do: it orders this thread's reads of the buffer (its warpgroup's
/// retired MMAs) before the refill it lets through. A `.release.cluster` arrival made
/// clustered 4096³ kernels 2.1x slower on an H100 (`benchmarks/results/h100-2026-11-26`).
pub fn cluster_arrive_c(bar: &str, rank: &str) -> String {
    format!(
        "{{ unsigned remote; asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(remote) : \"r\"({bar}), \"r\"({rank})); \
         asm volatile(\"mbarrier.arrive.shared::cluster.b64 _, [%0];\" :: \"r\"(remote) : \"memory\"); }}"
    )
}

/// Publishes the block's initialized mbarriers to its cluster, then waits for every
/// thread of the cluster.
pub const CLUSTER_SYNC_C: &str = "asm volatile(\"fence.mbarrier_init.release.cluster;\\n\\tbarrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;\" ::: \"memory\");";

/// Waits until the phase of parity `parity` (a C expression) of the barrier at `bar`
/// has completed.
pub fn wait_parity_c(bar: &str, parity: &str) -> String {
    format!(
        "asm volatile(\"{{ .reg .pred done; wait: mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1; @!done bra wait; }}\" :: \"r\"({bar}), \"r\"({parity}) : \"memory\");"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_operand_with_aligned_rows_is_a_box() {
        // A of a 4096³ fp16 matmul, 128 rows by 64 of K (one 128-byte swizzled row).
        let a =
            TensorBox::matrix(DType::Fp16, 4096, 4096, 4096, 1, 0, 128, 64, Swizzle::B128).unwrap();
        assert_eq!(
            (a.dims.clone(), a.strides.clone()),
            (vec![4096, 4096], vec![8192])
        );
        assert_eq!(a.box_bytes(), 128 * 64 * 2);
        let layout = a.shared_layout();
        assert_eq!(
            (layout.rows, layout.row_elements, layout.swizzle),
            (128, 64, true)
        );
        assert_eq!(Swizzle::of(&layout, 2), Some(Swizzle::B128));
        // A batch becomes a third dimension, one matrix per box.
        let b = TensorBox::matrix(DType::Bf16, 197, 64, 64, 8, 197 * 64, 64, 64, Swizzle::B128)
            .unwrap();
        assert_eq!((b.dims.len(), b.boxed[2]), (3, 1));
    }

    #[test]
    fn rows_of_an_odd_length_cannot_be_described() {
        // 333×777×555 in fp16: A's rows are 1110 bytes apart, B's 1554.
        let e =
            TensorBox::matrix(DType::Fp16, 333, 555, 555, 1, 0, 64, 64, Swizzle::B128).unwrap_err();
        assert_eq!(
            e,
            TmaError::Stride {
                dim: 1,
                stride: 1110
            }
        );
        // The same shape in f32 is aligned only where the row length is a multiple of 4.
        assert!(TensorBox::matrix(DType::F32, 333, 556, 556, 1, 0, 64, 32, Swizzle::B128).is_ok());
    }

    #[test]
    fn boxes_are_bounded_by_the_swizzle_and_the_hardware() {
        let m = |rows, columns, swizzle| {
            TensorBox::matrix(DType::Fp16, 1024, 1024, 1024, 1, 0, rows, columns, swizzle)
        };
        assert_eq!(
            m(64, 128, Swizzle::B128).unwrap_err(),
            TmaError::InnerBytes { bytes: 256 }
        );
        assert_eq!(
            m(64, 32, Swizzle::B64).map(|b| b.box_bytes()),
            Ok(64 * 32 * 2)
        );
        assert_eq!(
            m(64, 4, Swizzle::None).unwrap_err(),
            TmaError::InnerBytes { bytes: 8 }
        );
        assert_eq!(
            m(512, 64, Swizzle::B128).unwrap_err(),
            TmaError::Box {
                dim: 1,
                extent: 512
            }
        );
        assert!(
            m(256, 128, Swizzle::None).is_ok(),
            "no swizzle: any 16-byte multiple"
        );
    }

    /// A 3×3 padding-1 walk over one 8×8 image of 16 channels: its bounding box of base
    /// pixels is -1..=6 each way (the Triton and CUTLASS formulas), rows wrap at its
    /// right edge into the next row and past its last row into the next image, and a
    /// base outside it, or an offset past 8 bits, would fault.
    #[test]
    fn im2col_walks_wrap_at_the_bounding_box() {
        let tensor = TensorBox {
            dtype: DType::Fp16,
            dims: vec![16, 8, 8, 1],
            strides: vec![32, 256, 2048],
            boxed: vec![16, 4],
            swizzle: Swizzle::B32,
            im2col: Some(Im2col {
                lower: vec![-1, -1],
                upper: vec![-1, -1],
                traversal: vec![1, 1],
            }),
        };
        tensor.check().unwrap();
        // From the last base of row 0 (w 6, h -1) with offsets (1, 1): pixel (7, 0), then
        // the next row's first base (-1, 0) reads (0, 1), then (1, 1), (2, 1).
        let first_channel = |row: usize| tensor.elements(&[0, 6, -1, 0, 1, 1])[row * 16].1;
        let pixel = |w: i64, h: i64| Some((h * 8 + w) * 16);
        assert_eq!(
            (0..4).map(first_channel).collect::<Vec<_>>(),
            vec![pixel(7, 0), pixel(0, 1), pixel(1, 1), pixel(2, 1)]
        );
        // The last base of the image wraps into image 1: outside the tensor, zeros.
        assert_eq!(tensor.elements(&[0, 6, 6, 0, 0, 0])[16].1, None);
        assert_eq!(tensor.origin_error(&[0, 6, 6, 0, 0, 0]), None);
        assert!(tensor.origin_error(&[0, 7, 0, 0, 0, 0]).is_some());
        assert!(tensor.origin_error(&[0, 0, -2, 0, 0, 0]).is_some());
        assert!(tensor.origin_error(&[0, 0, 0, 0, 256, 0]).is_some());
        // Corners past the rank's 8 bits, or a traversal stride past 8, are refused.
        let mut wide = tensor.clone();
        wide.im2col.as_mut().unwrap().lower[0] = -129;
        assert!(matches!(wide.check(), Err(TmaError::Im2col { .. })));
        let mut long = tensor;
        long.im2col.as_mut().unwrap().traversal[1] = 9;
        assert!(matches!(long.check(), Err(TmaError::Im2col { .. })));
    }
}
