//! The `wgmma` sketch's tile sizes (`WgmmaTiling`), the TMA view of its operands
//! (`TmaGemm`) and its validation: Hopper's own tensor-core path (issue 29).
//!
//! A block computes a `block_m × block_n` output tile with `consumers` warpgroups
//! stacked along M, each issuing `m_atoms` warpgroup MMAs (`wgmma.mma_async`
//! m64n{block_n}k16) per k-step, accumulating in f32 registers. Both operands are read
//! from shared memory through matrix descriptors (`atom::wgmma`); they are copied there
//! by TMA (`atom::tma`) in boxes whose swizzle is the descriptors': A (and a K-major B)
//! as rows of `k_bytes` of K (32, 64 or 128 bytes: the 32B, 64B or 128B swizzle), an
//! N-major B (matmul's row-major `K × N`) as K rows of one swizzle span of N per box.
//! Out-of-bounds boxes are zero-filled by the copy engine, which pads every tail.
//!
//! The reduction streams through a ring of `stages` shared buffers, handed over by
//! mbarriers: a "full" barrier per buffer that the producer arms with the tile's bytes
//! (`arrive.expect_tx`) and the copies complete, and an "empty" barrier per buffer on
//! which each consumer warpgroup arrives once its MMAs that read the buffer have
//! completed (`wgmma.wait_group in_flight`), before the producer refills it.
//!
//! Grouped rasterization (`raster`) orders the tiles down bands of M tiles, and
//! clusters of 2 to 8 blocks on a rectangle of tiles (`cluster`, `cluster_m`) share
//! A's tile along each row and B's down each column by TMA multicast
//! (`lower::wgmma`).
//!
//! Split-K (`State::split_k`) cuts the K tiles into chunks, one per block of a tile (a
//! unit of work), in any output type: each block stores its partial sums to a
//! workspace, and the last of a tile's blocks to arrive on its semaphore adds them up
//! and runs the epilogue (`lower::wgmma`). Stream-K (`stream_k`) instead deals every
//! tile's K tiles out in even runs to a grid of its own, a run's parts of tiles meeting
//! in the workspace the same way (`crate::stream_k`).
//!
//! TMA needs each operand to be a strided matrix (at most a batch of them) with rows
//! 16-byte aligned: a matmul, a batch matmul, an NHWC 1×1 stride-1 unpadded
//! convolution; or, for a convolution's activations, TMA's im2col view (issue 30): the
//! copy engine walks the output pixels of a row tile at the stride and reads each one's
//! pixel under the filter tap (`Im2colView`), zeros in the padding, while the weights
//! are a strided matrix with a dimension per tap axis (`MatrixView::taps`). A K tile is
//! then one filter tap's run of `block_k` channels. Anything else is refused here
//! (`InvalidState::NoTma`) and left to the other sketches.

use crate::atom::tma::{Im2col, TensorBox};
use crate::atom::wgmma::{Major, OperandLayout, Swizzle, WARPGROUP_THREADS, WgmmaAtom};
use crate::gemm::GemmView;
use crate::gpu_spec::GpuSpec;
use crate::invalid::check_tile_split;
use crate::invalid::{InvalidState, TmaGemmError};
use crate::sketch::wgmma::tiling::{MAX_WGMMA_STAGES, WgmmaTiling};
use crate::stream_k::StreamK;
use crate::task::{Access, AxisRef, Contraction};

/// Registers besides the accumulators: descriptors, coordinates, loop counters,
/// barrier addresses and the epilogue's. Calibrated on NVRTC 13.0 for sm_90a: 128
/// accumulators took 154 to 178 registers, and 208 spilled at the cap of 255.
const WGMMA_ADDRESSING_REGISTERS: u64 = 56;

/// Rows of one warpgroup MMA.
pub const ATOM_M: u32 = 64;

/// Bytes of the mbarriers a block declares statically (two per stage), counted
/// against the shared-memory limit with the ring.
const BARRIER_BYTES: u64 = 16;

/// Staging buffers per consumer warpgroup of an epilogue of TMA stores.
pub const STAGING_BUFFERS: u64 = 2;

/// Cluster shapes (blocks along M, along N) the search may choose, besides none: up
/// to 8 blocks, the portable cluster size.
pub const CLUSTER_SHAPES: [(u32, u32); 9] = [
    (1, 2),
    (2, 1),
    (2, 2),
    (1, 4),
    (4, 1),
    (2, 4),
    (4, 2),
    (1, 8),
    (8, 1),
];

use crate::sketch::wgmma::tiling::RASTER_GROUPS;

/// One operand as TMA sees it: `batches` matrices of `rows` rows of `columns` contiguous
/// elements, in elements; a K-major operand of a reduction with taps (a convolution's
/// weights) also has a dimension per tap axis between its columns and its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixView {
    pub rows: u64,
    pub columns: u64,
    pub row_stride: u64,
    pub batches: u64,
    pub batch_stride: u64,
    /// Extent and element stride of each tap axis's dimension, innermost first (the
    /// reverse of the reduction's order).
    pub taps: Vec<(u64, u64)>,
}

/// A convolution's activations as TMA's im2col mode reads them (`atom::tma::Im2col`): a
/// channels-last tensor walked by output pixel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Im2colView {
    /// Extents, innermost first: the channels, the spatial dimensions, the images.
    pub dims: Vec<u64>,
    /// Element strides of every dimension but the channels.
    pub strides: Vec<u64>,
    /// The walk: base pixels from the padding's corner on, at the stride.
    pub im2col: Im2col,
    /// Per spatial dimension (innermost first): the reduction axis of its filter tap and
    /// that axis's step in the offsets (the dilation), None without a tap.
    pub taps: Vec<Option<(usize, i64)>>,
    /// Per spatial dimension (innermost first): its output position's place in
    /// `m_extents`, None where the output has one position.
    pub positions: Vec<Option<usize>>,
    /// Extents of the M axes, outer first: the image (1 where the task has one), then
    /// the spatial dimensions' output positions. A row's index decomposes into them,
    /// the image unbounded: a row past the last output pixel lies in an image past the
    /// last, which TMA fills with zeros, while its base pixel stays inside the bounding
    /// box, as the copy requires.
    pub m_extents: Vec<i64>,
    /// A grouped convolution's channels per group: group `g` starts at channel
    /// `g · group_channels` (0 with one group).
    pub group_channels: u64,
}

/// How TMA reads A: a matrix, or a convolution's activations in im2col mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperandView {
    Matrix(MatrixView),
    Im2col(Im2colView),
}

/// Both operands of a GEMM-shaped contraction as TMA sees them: A is `M × K` (or an
/// im2col walk), B is `N × K` when K-major, `K × N` when N-major; and the `M × N`
/// output, where TMA can write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmaGemm {
    pub view: GemmView,
    pub a: OperandView,
    pub b: MatrixView,
    pub out: Option<MatrixView>,
}

/// The element offset coefficient of every axis in `access`'s tensor.
fn coefficient(access: &Access, axis: AxisRef) -> i64 {
    access
        .index
        .iter()
        .zip(access.strides())
        .map(|(ix, stride)| ix.coeff(axis) * stride)
        .sum()
}

/// The stride of the row-major flattening of `axes` (extent-1 axes dropped) whose
/// element coefficients `coeff` gives, if the axes are one dense run: the innermost's
/// coefficient, each outer one the next's times its extent. Some(0) when no axis is
/// left.
fn dense_run(c: &Contraction, axes: &[usize], coeff: impl Fn(usize) -> i64) -> Option<u64> {
    let live: Vec<usize> = axes
        .iter()
        .copied()
        .filter(|&a| c.spatial[a].extent > 1)
        .collect();
    let Some(&last) = live.last() else {
        return Some(0);
    };
    let stride = coeff(last);
    let mut expected = stride;
    for pair in live.windows(2).rev() {
        expected *= i64::from(c.spatial[pair[1]].extent);
        if coeff(pair[0]) != expected {
            return None;
        }
    }
    u64::try_from(stride).ok().filter(|&s| s > 0)
}

/// `dense_run` over `access`'s coefficients, or why not.
fn dense_stride(
    c: &Contraction,
    access: &Access,
    axes: &[usize],
    what: &'static str,
) -> Result<u64, TmaGemmError> {
    dense_run(c, axes, |a| coefficient(access, AxisRef::Spatial(a))).ok_or(TmaGemmError::NotDense {
        tensor: access.tensor,
        what,
    })
}

/// The output as a TMA matrix, where TMA stores can write it: its N axes the
/// innermost, contiguous run, its M and batch axes dense runs outside them.
fn output_matrix(c: &Contraction, view: &GemmView) -> Option<MatrixView> {
    let strides = c.output_strides();
    let stride = |axes: &[usize]| dense_run(c, axes, |a| strides[a]);
    if !matches!(stride(&view.n_axes)?, 0 | 1) {
        return None;
    }
    let row_stride = stride(&view.m_axes)?;
    let batch_stride = stride(&view.batch_axes)?;
    Some(MatrixView {
        rows: view.m,
        columns: view.n,
        row_stride: row_stride.max(view.n),
        batches: view.batch,
        batch_stride: batch_stride.max(1),
        taps: Vec::new(),
    })
}

/// Input 0 of `c` as TMA's im2col view: a channels-last tensor whose outermost
/// dimension is indexed by the first M axis (the image; absent for one image), each
/// spatial one by `stride·(an M axis) + dilation·(a tap axis) - padding` (either term
/// absent where its axis has extent 1), the M axes in the dimensions' order, and the
/// channels by the innermost reduction axis (plus a group's first channel).
fn im2col_view(c: &Contraction, view: &GemmView) -> Result<Im2colView, TmaGemmError> {
    let access = &c.inputs[0];
    let tensor = access.tensor;
    let refuse = |why| TmaGemmError::Im2col { tensor, why };
    let inner = c.reduction.len() - 1;
    let strides = access.strides();
    let dims = access.shape.len();
    let image = access.index[0].offset == 0
        && dims > 1
        && matches!(access.index[0].terms[..], [(AxisRef::Spatial(a), 1)] if view.m_axes.first() == Some(&a));
    let first_spatial = usize::from(image);
    let spatial = dims - 1 - first_spatial;
    // The tensor map always has an image dimension: rank 3 (one spatial dimension) to 5.
    let rank = spatial + 2;
    if !(3..=crate::atom::tma::MAX_RANK).contains(&rank) {
        return Err(refuse("rank"));
    }
    let (_, offsets) = Im2col::ranges(rank);
    let corner = |x: i64| i32::try_from(x).unwrap_or(i32::MAX);
    let mut m_axes = Vec::new();
    if image {
        m_axes.push(view.m_axes[0]);
    }
    let mut out = Im2colView {
        dims: vec![u64::from(access.shape[dims - 1])],
        strides: Vec::new(),
        im2col: Im2col {
            lower: Vec::new(),
            upper: Vec::new(),
            traversal: Vec::new(),
        },
        taps: Vec::new(),
        positions: Vec::new(),
        m_extents: Vec::new(),
        group_channels: 0,
    };
    // Spatial dimensions, outermost first as the tensor stores them; each is inserted
    // innermost first.
    for (d, ix) in access
        .index
        .iter()
        .enumerate()
        .take(dims - 1)
        .skip(first_spatial)
    {
        let (mut position, mut tap) = (None, None);
        for &(axis, coeff) in &ix.terms {
            match axis {
                AxisRef::Spatial(a) if coeff > 0 && position.is_none() => {
                    position = Some((a, coeff))
                }
                AxisRef::Reduction(r) if r != inner && coeff > 0 && tap.is_none() => {
                    tap = Some((r, coeff))
                }
                _ => return Err(refuse("a spatial index")),
            }
        }
        let extent = i64::from(access.shape[d]);
        let (positions, stride) = position.map_or((1, 1), |(a, stride)| {
            (i64::from(c.spatial[a].extent), stride)
        });
        let span = tap.map_or(0, |(r, dil)| dil * (i64::from(c.reduction[r].extent) - 1));
        if !offsets.contains(&corner(span)) {
            return Err(refuse("the filter's span"));
        }
        // The box ends at the last output position's base: `extent - 1 + upper`.
        let last = ix.offset + (positions - 1) * stride;
        out.im2col.lower.insert(0, corner(ix.offset));
        out.im2col.upper.insert(0, corner(last - (extent - 1)));
        out.im2col
            .traversal
            .insert(0, u32::try_from(stride).unwrap_or(u32::MAX));
        out.taps.insert(0, tap);
        out.positions.insert(
            0,
            position.map(|(a, _)| {
                m_axes.push(a);
                m_axes.len() - 1
            }),
        );
        out.dims.insert(1, extent as u64);
        out.strides
            .insert(0, u64::try_from(strides[d]).unwrap_or(0));
    }
    if image {
        out.dims.push(u64::from(access.shape[0]));
        out.strides.push(u64::try_from(strides[0]).unwrap_or(0));
    } else {
        // One image: a dimension of extent 1 past the last pixel.
        let outer = *out.strides.last().expect("a spatial dimension") * out.dims[rank - 2];
        out.dims.push(1);
        out.strides.push(outer);
    }
    if m_axes != view.m_axes {
        return Err(refuse("the rows are not the output pixels in order"));
    }
    // Every tap axis reaches the tensor through exactly one spatial dimension.
    let mut used: Vec<usize> = out.taps.iter().flatten().map(|&(r, _)| r).collect();
    used.sort_unstable();
    used.dedup();
    if used.len() != inner || used.len() != out.taps.iter().flatten().count() {
        return Err(refuse("a tap axis"));
    }
    let channel = access.index.last().expect("a dimension");
    let mut groups = channel
        .terms
        .iter()
        .filter_map(|&(axis, coeff)| matches!(axis, AxisRef::Spatial(_)).then_some(coeff));
    out.group_channels = groups.next().map_or(0, |g| g as u64);
    if groups.next().is_some() {
        return Err(refuse("channels"));
    }
    out.m_extents = m_axes
        .iter()
        .map(|&a| i64::from(c.spatial[a].extent))
        .collect();
    if !image {
        out.m_extents.insert(0, 1);
        for p in out.positions.iter_mut().flatten() {
            *p += 1;
        }
    }
    Ok(out)
}

impl TmaGemm {
    pub fn of(c: &Contraction) -> Result<TmaGemm, InvalidState> {
        let view = GemmView::of(c).map_err(InvalidState::NoGemm)?;
        let inner = c.reduction.len() - 1;
        let product = |axes: &[usize]| -> u64 {
            axes.iter()
                .map(|&a| u64::from(c.spatial[a].extent))
                .product()
        };
        let matrix = |input: usize| -> Result<MatrixView, TmaGemmError> {
            let access = &c.inputs[input];
            let tensor = access.tensor;
            if access.index.iter().any(|ix| ix.offset != 0) {
                return Err(TmaGemmError::Offset { tensor });
            }
            // Taps: a dimension per reduction axis but the innermost, in a K-major B.
            let taps: Vec<(u64, u64)> = c.reduction[..inner]
                .iter()
                .enumerate()
                .rev()
                .map(|(r, axis)| {
                    let stride = coefficient(access, AxisRef::Reduction(r));
                    (u64::from(axis.extent), u64::try_from(stride).unwrap_or(0))
                })
                .collect();
            if !taps.is_empty() && (input == 0 || !view.b_k_major || taps.iter().any(|t| t.1 == 0))
            {
                return Err(TmaGemmError::Reduction { tensor });
            }
            // Every index within its dimension for every axis value.
            let fits = access.index.iter().zip(&access.shape).all(|(ix, &dim)| {
                let max: i64 = ix
                    .terms
                    .iter()
                    .map(|&(axis, coeff)| {
                        let extent = match axis {
                            AxisRef::Spatial(a) => c.spatial[a].extent,
                            AxisRef::Reduction(r) => c.reduction[r].extent,
                        };
                        coeff.max(0) * (i64::from(extent) - 1)
                    })
                    .sum();
                ix.terms.iter().all(|&(_, coeff)| coeff >= 0) && max < i64::from(dim)
            });
            let k = AxisRef::Reduction(inner);
            let (rows, columns, row_stride) = if input == 1 && !view.b_k_major {
                let n = AxisRef::Spatial(view.n_axes[0]);
                if coefficient(access, n) != 1 {
                    return Err(TmaGemmError::NotDense { tensor, what: "N" });
                }
                let stride = u64::try_from(coefficient(access, k)).unwrap_or(0);
                (view.k, view.n, stride)
            } else {
                if coefficient(access, k) != 1 {
                    return Err(TmaGemmError::NotDense { tensor, what: "K" });
                }
                let (axes, what) = if input == 0 {
                    (&view.m_axes, "M")
                } else {
                    (&view.n_axes, "N")
                };
                let stride = dense_stride(c, access, axes, what)?;
                (product(axes), u64::from(view.contiguous[0]), stride)
            };
            let batch_stride = dense_stride(c, access, &view.batch_axes, "batch")?;
            if !fits || (rows > 1 && row_stride == 0) {
                return Err(TmaGemmError::NotDense {
                    tensor,
                    what: "row",
                });
            }
            Ok(MatrixView {
                rows,
                columns,
                row_stride: row_stride.max(columns),
                batches: view.batch,
                batch_stride: batch_stride.max(1),
                taps,
            })
        };
        // A matrix where it is one, else (a convolution's window) an im2col walk.
        let a = match matrix(0) {
            Ok(a) => OperandView::Matrix(a),
            Err(matrix) => OperandView::Im2col(im2col_view(c, &view).map_err(|im2col| {
                InvalidState::NoTma(
                    if c.reduction.len() > 1 || matches!(matrix, TmaGemmError::Offset { .. }) {
                        im2col
                    } else {
                        matrix
                    },
                )
            })?),
        };
        let b = matrix(1).map_err(InvalidState::NoTma)?;
        let out = output_matrix(c, &view);
        Ok(TmaGemm { view, a, b, out })
    }

    /// Input `input`'s matrix view (None for A read in im2col mode).
    pub fn matrix(&self, input: usize) -> Option<&MatrixView> {
        match (input, &self.a) {
            (0, OperandView::Matrix(a)) => Some(a),
            (0, OperandView::Im2col(_)) => None,
            _ => Some(&self.b),
        }
    }

    /// The tensor map of input `input` for `tiling`'s boxes.
    pub fn tensor_box(
        &self,
        c: &Contraction,
        tiling: &WgmmaTiling,
        input: usize,
    ) -> Result<TensorBox, InvalidState> {
        let (box_rows, box_columns, swizzle) = tiling.box_shape(input, &self.view);
        let bytes = u64::from(c.dtype.bytes());
        let tensor = match (input, &self.a) {
            (0, OperandView::Im2col(v)) => {
                let tensor = TensorBox {
                    dtype: c.dtype,
                    dims: v.dims.clone(),
                    strides: v.strides.iter().map(|s| s * bytes).collect(),
                    boxed: vec![box_columns, box_rows],
                    swizzle,
                    im2col: Some(v.im2col.clone()),
                };
                tensor.check().map(|()| tensor)
            }
            _ => {
                let m = self.matrix(input).expect("B and a matrix A");
                TensorBox::matrix(
                    c.dtype,
                    m.rows,
                    m.columns,
                    m.row_stride,
                    m.batches,
                    m.batch_stride,
                    box_rows,
                    box_columns,
                    swizzle,
                )
                .and_then(|mut tensor| {
                    // Tap dimensions between the columns and the rows, one position each.
                    for (i, &(extent, stride)) in m.taps.iter().enumerate() {
                        tensor.dims.insert(1 + i, extent);
                        tensor.strides.insert(i, stride * bytes);
                        tensor.boxed.insert(1 + i, 1);
                    }
                    tensor.check().map(|()| tensor)
                })
            }
        };
        tensor.map_err(|error| {
            InvalidState::NoTma(TmaGemmError::Rules {
                tensor: c.inputs[input].tensor,
                error,
            })
        })
    }

    /// The tensor map of the output for `tiling`'s TMA stores: boxes of 64 rows of a
    /// staged chunk's columns. None where TMA cannot write the output.
    pub fn output_box(&self, c: &Contraction, tiling: &WgmmaTiling) -> Option<TensorBox> {
        let m = self.out.as_ref()?;
        let out_bytes = c.out_dtype.bytes();
        TensorBox::matrix(
            c.out_dtype,
            m.rows,
            m.columns,
            m.row_stride,
            m.batches,
            m.batch_stride,
            ATOM_M,
            tiling.store_columns(out_bytes),
            tiling.store_swizzle(out_bytes),
        )
        .ok()
    }
}

impl WgmmaTiling {
    pub fn threads(&self) -> u32 {
        self.consumer_threads() + 32 * self.producer_warp
    }

    /// Threads of the consumer warpgroups (the first ones of the block).
    pub fn consumer_threads(&self) -> u32 {
        WARPGROUP_THREADS as u32 * self.consumers
    }

    /// Output rows per consumer warpgroup.
    pub fn consumer_m(&self) -> u32 {
        ATOM_M * self.m_atoms
    }

    pub fn block_m(&self) -> u32 {
        self.consumer_m() * self.consumers
    }

    /// f32 accumulators per thread: `block_n / 2` per 64-row instruction.
    pub fn accumulators(&self) -> u32 {
        self.m_atoms * self.block_n / 2
    }

    /// Reduction elements per shared tile of `view`'s type.
    pub fn block_k(&self, view: &GemmView) -> u64 {
        u64::from(self.k_bytes / view.element_bytes.max(1))
    }

    /// The swizzle of K-major rows of `k_bytes`.
    pub fn k_swizzle(&self) -> Swizzle {
        Swizzle::spanning(i64::from(self.k_bytes)).unwrap_or(Swizzle::B128)
    }

    /// Columns of N per box of an N-major B (16-bit types only): the widest swizzle span
    /// (64, 32 or 16 elements) that divides `block_n`.
    pub fn n_box(&self) -> u32 {
        [64, 32, 16]
            .into_iter()
            .find(|w| self.block_n.is_multiple_of(*w))
            .unwrap_or(16)
    }

    /// Blocks per cluster (1 without clusters).
    pub fn cluster_blocks(&self) -> u32 {
        self.cluster.max(1)
    }

    /// A cluster's blocks along M and along N ((1, 1) without clusters): a pair
    /// (`cluster_m` 0) lies along M in a raster band (sharing B), along N otherwise
    /// (sharing A).
    pub fn cluster_shape(&self) -> (u32, u32) {
        let blocks = self.cluster_blocks();
        match self.cluster_m {
            _ if blocks == 1 => (1, 1),
            0 if self.raster > 0 => (blocks, 1),
            0 => (1, blocks),
            m => (m, blocks / m.max(1)),
        }
    }

    /// The tiling with clusters of `cm × cn` blocks (none for 1 × 1), spelled as
    /// validation takes it: a pair where the raster order puts neighbours, with
    /// `cluster_m` 0.
    pub fn with_cluster_shape(self, cm: u32, cn: u32) -> WgmmaTiling {
        let blocks = cm * cn;
        let pair = (if self.raster > 0 { (2, 1) } else { (1, 2) }) == (cm, cn);
        WgmmaTiling {
            cluster: if blocks > 1 { blocks } else { 0 },
            cluster_m: if blocks > 1 && !pair { cm } else { 0 },
            ..self
        }
    }

    /// The blocks of a cluster that share input `input`'s tile, each copying its
    /// share and multicasting it: A's along the cluster's row (its N blocks), B's down
    /// its column (its M blocks); 1 where nothing is shared.
    pub fn sharers(&self, input: usize) -> u32 {
        let (m, n) = self.cluster_shape();
        if input == 0 { n } else { m }
    }

    /// Arrivals per consumer warpgroup that release a buffer: one, or in a cluster one
    /// from each sharer of each shared tile (a block's own consumers arrive once per
    /// shared tile).
    pub fn empty_arrivals(&self) -> u32 {
        let shared = |k: u32| if k > 1 { k } else { 0 };
        (shared(self.sharers(0)) + shared(self.sharers(1))).max(1)
    }

    /// Rows and columns of input `input`'s TMA box, and its swizzle: a block's share
    /// of the tile, the rows of a K-major tile the cluster shares split between its
    /// blocks.
    pub fn box_shape(&self, input: usize, view: &GemmView) -> (u32, u32, Swizzle) {
        let k = self.block_k(view) as u32;
        let share = |rows: u32| rows / self.sharers(input);
        match input {
            0 => (share(self.block_m()), k, self.k_swizzle()),
            _ if view.b_k_major => (share(self.block_n), k, self.k_swizzle()),
            _ => {
                // 16-bit elements: rows of 2 bytes per column.
                let n_box = self.n_box();
                let swizzle = Swizzle::spanning(2 * i64::from(n_box)).unwrap_or(Swizzle::B32);
                (k, n_box, swizzle)
            }
        }
    }

    /// TMA copies of input `input` per stage (an N-major B is `block_n / n_box` boxes).
    pub fn boxes(&self, input: usize, view: &GemmView) -> u32 {
        if input == 1 && !view.b_k_major {
            self.block_n / self.n_box()
        } else {
            1
        }
    }

    /// How input `input`'s stage lies for `atom`'s descriptors.
    pub fn operand_layout(&self, atom: &WgmmaAtom, input: usize, view: &GemmView) -> OperandLayout {
        let (rows, columns, swizzle) = self.box_shape(input, view);
        if input == 1 && !view.b_k_major {
            let box_bytes = rows * columns * view.element_bytes;
            OperandLayout::mn_major(atom, swizzle, box_bytes)
        } else {
            OperandLayout::k_major(atom, swizzle)
        }
    }

    /// Bytes of input `input`'s tile per stage: its rows of `k_bytes`.
    pub fn tile_bytes(&self, input: usize) -> u64 {
        let rows = if input == 0 {
            self.block_m()
        } else {
            self.block_n
        };
        u64::from(rows) * u64::from(self.k_bytes)
    }

    /// Elements of input `input`'s tile per stage, of `view`'s type.
    pub fn tile_elements(&self, input: usize, view: &GemmView) -> u64 {
        self.tile_bytes(input) / u64::from(view.element_bytes.max(1))
    }

    /// Bytes of the ring: every stage holds both inputs' tiles.
    pub fn ring_bytes(&self) -> u64 {
        u64::from(self.stages) * (self.tile_bytes(0) + self.tile_bytes(1))
    }

    /// Output columns of one staged chunk (one TMA store's box) of `out_bytes`-byte
    /// elements: the widest swizzle span (128, 64 or 32 bytes, or 16 unswizzled) that
    /// divides `block_n` and holds whole groups of 8 columns (a thread's accumulator
    /// pairs).
    pub fn store_columns(&self, out_bytes: u32) -> u32 {
        let out_bytes = out_bytes.max(1);
        [128, 64, 32, 16]
            .into_iter()
            .map(|bytes| bytes / out_bytes)
            .find(|&w| w >= 8 && self.block_n.is_multiple_of(w))
            .unwrap_or(8)
    }

    /// The swizzle of a staged chunk's rows (the TMA store's).
    pub fn store_swizzle(&self, out_bytes: u32) -> Swizzle {
        Swizzle::spanning(i64::from(self.store_columns(out_bytes) * out_bytes))
            .unwrap_or(Swizzle::None)
    }

    /// Elements of one staging buffer: 64 rows of a chunk's columns.
    pub fn staging_elements(&self, out_bytes: u32) -> u64 {
        u64::from(ATOM_M) * u64::from(self.store_columns(out_bytes))
    }

    /// Byte offset of the staging buffers in the pool: after the ring, aligned to the
    /// 128-byte swizzle's 1024-byte atom.
    pub fn staging_offset(&self) -> u64 {
        self.ring_bytes().div_ceil(1024) * 1024
    }

    /// Bytes of the epilogue's staging buffers: two per consumer warpgroup (one being
    /// written while the other's TMA store reads it); none without TMA stores.
    pub fn staging_bytes(&self, out_bytes: u32) -> u64 {
        if self.tma_store == 0 {
            return 0;
        }
        STAGING_BUFFERS
            * u64::from(self.consumers)
            * self.staging_elements(out_bytes)
            * u64::from(out_bytes)
    }

    /// Bytes of dynamic shared memory for `out_bytes`-byte outputs: the ring, then the
    /// staging buffers.
    pub fn shared_bytes(&self, out_bytes: u32) -> u64 {
        match self.staging_bytes(out_bytes) {
            0 => self.ring_bytes(),
            staging => self.staging_offset() + staging,
        }
    }

    /// Output tiles of `view`.
    pub fn tiles(&self, view: &GemmView) -> u64 {
        let (m, n) = self.tile_grid(view);
        view.batch * m * n
    }

    /// Output tiles of one of `view`'s matrices along M and along N, rounded up to
    /// whole clusters (a tile past the output's end computes zeros and stores nothing,
    /// but copies its share of the tiles its cluster shares).
    pub fn tile_grid(&self, view: &GemmView) -> (u64, u64) {
        let (cm, cn) = self.cluster_shape();
        (
            view.m
                .div_ceil(u64::from(self.block_m().max(1)))
                .next_multiple_of(u64::from(cm)),
            view.n
                .div_ceil(u64::from(self.block_n.max(1)))
                .next_multiple_of(u64::from(cn)),
        )
    }

    /// K tiles of `view`'s reduction: per tap, the innermost axis in runs of `block_k`
    /// (the last one's tail read as zeros).
    pub fn ktiles(&self, view: &GemmView) -> u64 {
        view.taps * self.kblocks(view)
    }

    /// K tiles of one tap: `block_k` runs of the innermost reduction axis.
    pub fn kblocks(&self, view: &GemmView) -> u64 {
        u64::from(view.contiguous[0]).div_ceil(self.block_k(view).max(1))
    }

    /// K tiles of each of `split_k` reduction chunks: the last may run past K, where
    /// TMA reads zeros.
    pub fn chunk_ktiles(&self, view: &GemmView, split_k: u32) -> u64 {
        self.ktiles(view).div_ceil(u64::from(split_k.max(1)))
    }

    /// Units of work (an output tile's reduction chunk: `tiles × split_k`) and the
    /// blocks of the grid: one per unit, or `persistent` blocks taking every
    /// grid-th unit.
    /// With stream-K, the units are the output tiles and the grid its blocks.
    pub fn grid(&self, view: &GemmView, split_k: u32) -> (u64, u64) {
        let units = self.tiles(view) * u64::from(split_k.max(1));
        if self.stream_k > 0 {
            return (units, u64::from(self.stream_k));
        }
        match self.persistent {
            0 => (units, units),
            blocks => (units, u64::from(blocks).min(units)),
        }
    }

    /// This tiling as stream-K over `blocks` blocks (0: none): with no persistent grid,
    /// cluster or TMA store, which it excludes (the state's split must be 1).
    pub fn streamed(&self, blocks: u32) -> WgmmaTiling {
        WgmmaTiling {
            stream_k: blocks,
            persistent: 0,
            cluster: 0,
            cluster_m: 0,
            tma_store: 0,
            ..*self
        }
    }

    /// Stream-K's deal of the iterations to this tiling's blocks (`crate::stream_k`).
    pub fn stream(&self, view: &GemmView) -> StreamK {
        StreamK {
            blocks: u64::from(self.stream_k),
            tiles: self.tiles(view),
            ktiles: self.ktiles(view),
        }
    }

    /// Consumer warps of a block: a split tile's semaphores count arrivals per warp.
    pub fn consumer_warps(&self) -> u32 {
        self.consumer_threads() / 32
    }

    /// The workspace of a `split_k` reduction (none without a split): one semaphore
    /// per output tile and consumer warp, then every unit's partial sums (each
    /// consumer thread's accumulators), in f32. Semaphores and bytes.
    /// Stream-K's blocks add into one tile of sums per output tile.
    pub fn workspace(&self, view: &GemmView, split_k: u32) -> (u64, u64) {
        if split_k <= 1 && self.stream_k == 0 {
            return (0, 0);
        }
        let semaphores = self.tiles(view) * u64::from(self.consumer_warps());
        let partials = self.grid(view, split_k).0
            * u64::from(self.accumulators())
            * u64::from(self.consumer_threads());
        (semaphores, crate::ir::workspace_bytes(semaphores, partials))
    }

    pub fn register_estimate(&self) -> u64 {
        u64::from(self.accumulators()) + WGMMA_ADDRESSING_REGISTERS
    }
}

/// Whether the sketch can run `c` on `gpu`: tensor-core data on a Hopper GPU
/// (`sm_90a`), with B K-major where the type's instruction has no transpose (TF32).
pub fn wgmma_applies(c: &Contraction, gpu: &GpuSpec) -> bool {
    let Some(atom) = WgmmaAtom::for_dtype(c.dtype) else {
        return false;
    };
    let b_k_major = GemmView::of(c).is_ok_and(|v| v.b_k_major);
    gpu.compute_capability == (9, 0) && (atom.transposes || b_k_major)
}

/// The major-ness of B in the instruction.
pub fn b_major(view: &GemmView) -> Major {
    if view.b_k_major { Major::K } else { Major::MN }
}

/// Validates a `wgmma` state (`SketchTiling::Wgmma(t)`).
pub fn validate_wgmma(
    c: &Contraction,
    t: &WgmmaTiling,
    split_k: u32,
    gpu: &GpuSpec,
) -> Result<(), InvalidState> {
    if !wgmma_applies(c, gpu) {
        return Err(InvalidState::WgmmaType {
            dtype: c.dtype,
            gpu: gpu.name.clone(),
        });
    }
    let gemm = TmaGemm::of(c)?;
    let n_ok = WgmmaAtom::n_valid(i64::from(t.block_n))
        && (gemm.view.b_k_major || t.block_n.is_multiple_of(16));
    if !(1..=2).contains(&t.consumers)
        || !(1..=2).contains(&t.m_atoms)
        || !n_ok
        || ![32, 64, 128].contains(&t.k_bytes)
    {
        return Err(InvalidState::WgmmaTiles {
            consumers: t.consumers,
            m_atoms: t.m_atoms,
            block_n: t.block_n,
            k_bytes: t.k_bytes,
        });
    }
    // A tile taller than the GEMM by a whole 64-row MMA only adds zero fill and idle
    // MMAs (or a whole idle warpgroup).
    let view = &gemm.view;
    if u64::from(t.block_m()) >= view.m + u64::from(ATOM_M) {
        return Err(InvalidState::WgmmaIdleRows {
            block_m: t.block_m(),
            m: view.m,
        });
    }
    if !(1..=MAX_WGMMA_STAGES).contains(&t.stages)
        || t.in_flight > 1
        || t.in_flight >= t.stages
        || t.producer_warp > 1
    {
        return Err(InvalidState::WgmmaPipeline {
            stages: t.stages,
            in_flight: t.in_flight,
            producer_warp: t.producer_warp,
        });
    }
    check_tile_split(split_k, t.ktiles(&gemm.view))?;
    let (mtiles, ntiles) = t.tile_grid(&gemm.view);
    if t.raster != 0
        && (!RASTER_GROUPS.contains(&t.raster)
            || !mtiles.is_multiple_of(u64::from(t.raster))
            || ntiles == 1)
    {
        return Err(InvalidState::WgmmaRaster {
            raster: t.raster,
            mtiles,
            ntiles,
        });
    }
    // A cluster is a rectangle of neighbouring tiles of one K chunk each, whole in a
    // raster band and in a persistent grid; each tile it shares is dealt out between
    // its sharers in whole swizzle atoms (8 rows) of a K-major tile, or whole boxes of
    // an N-major B. A pair keeps its one spelling (`cluster_m` 0), and no shape is
    // given without a cluster.
    if t.cluster != 0 || t.cluster_m != 0 {
        let (cm, cn) = t.cluster_shape();
        let dealt = |input: usize| {
            let k = t.sharers(input);
            let rows = if input == 0 { t.block_m() } else { t.block_n };
            k == 1
                || if input == 1 && !view.b_k_major {
                    t.boxes(1, view).is_multiple_of(k)
                } else {
                    rows.is_multiple_of(8 * k)
                }
        };
        // The one spelling `with_cluster_shape` gives its shape.
        let spelled = cm * cn == t.cluster && t.with_cluster_shape(cm, cn) == *t;
        if ![2, 4, 8].contains(&t.cluster)
            || !spelled
            || !dealt(0)
            || !dealt(1)
            || !t.persistent.is_multiple_of(t.cluster)
            || !t.raster.is_multiple_of(cm)
        {
            return Err(InvalidState::WgmmaCluster {
                cluster: t.cluster,
                cluster_m: t.cluster_m,
                persistent: t.persistent,
                raster: t.raster,
            });
        }
    }
    // Stream-K deals the K tiles out itself, to blocks of a grid of its own, and its
    // partial tiles meet in the workspace.
    if t.stream_k != 0 {
        let stream = t.stream(view);
        let iterations = stream.iterations();
        if !stream.valid()
            || split_k != 1
            || t.persistent != 0
            || t.cluster != 0
            || t.tma_store != 0
        {
            return Err(InvalidState::WgmmaStreamK {
                blocks: t.stream_k,
                iterations,
                split_k,
                persistent: t.persistent,
                cluster: t.cluster,
                tma_store: t.tma_store,
            });
        }
    }
    let (units, _) = t.grid(&gemm.view, split_k);
    // Persistent blocks fewer than the units, else the plain grid says the same.
    if t.persistent != 0 && u64::from(t.persistent) >= units {
        return Err(InvalidState::WgmmaPersistent {
            blocks: t.persistent,
            tiles: units,
        });
    }
    // Partial sums are indexed in 32-bit arithmetic.
    let (_, bytes) = t.workspace(&gemm.view, split_k);
    if bytes / 4 > i32::MAX as u64 {
        return Err(InvalidState::SplitWorkspace { bytes });
    }
    for input in 0..2 {
        gemm.tensor_box(c, t, input)?;
    }
    // TMA stores write whole tiles: not a split tile's partial sums, and only an output
    // TMA can describe.
    if t.tma_store > 1 || t.tma_store == 1 && (split_k > 1 || gemm.output_box(c, t).is_none()) {
        return Err(InvalidState::WgmmaStore {
            tma_store: t.tma_store,
            split_k,
        });
    }
    let bytes = t.shared_bytes(c.out_dtype.bytes()) + BARRIER_BYTES * u64::from(t.stages);
    let registers = t.register_estimate();
    gpu.check_block(units, bytes, registers)?;
    let threads = u64::from(t.threads());
    if registers * threads > u64::from(gpu.registers_per_block) {
        return Err(InvalidState::RegistersPerBlock {
            registers,
            threads,
            max: u64::from(gpu.registers_per_block),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atom::tma::TmaError;
    use crate::{DType, Epilogue, Layout, Task, parse_shape};

    fn contraction(op: &str, shape: &str) -> Contraction {
        Task::new(parse_shape(op, shape).unwrap(), Epilogue::default())
            .unwrap()
            .with_types(DType::Fp16, DType::Fp16, Layout::Nhwc)
            .unwrap()
            .contraction()
    }

    fn matrix(
        rows: u64,
        columns: u64,
        row_stride: u64,
        batches: u64,
        batch_stride: u64,
    ) -> MatrixView {
        MatrixView {
            rows,
            columns,
            row_stride,
            batches,
            batch_stride,
            taps: Vec::new(),
        }
    }

    /// `consumers` warpgroups of one 64-row MMA by `block_n`, K rows of `k_bytes`, two
    /// stages, nothing else.
    fn plain(consumers: u32, block_n: u32, k_bytes: u32) -> WgmmaTiling {
        WgmmaTiling {
            consumers,
            m_atoms: 1,
            block_n,
            k_bytes,
            stages: 2,
            in_flight: 1,
            persistent: 0,
            producer_warp: 0,
            raster: 0,
            cluster: 0,
            cluster_m: 0,
            tma_store: 0,
            stream_k: 0,
        }
    }

    /// The TMA views of each operator's inputs are the tensors as they lie in memory,
    /// and the maps' boxes are the tiling's.
    #[test]
    fn operands_are_the_tasks_tensors() {
        // matmul: A is M × K, B is K × N (N-major).
        let c = contraction("matmul", "100,80,120");
        let g = TmaGemm::of(&c).unwrap();
        assert_eq!(g.a, OperandView::Matrix(matrix(100, 120, 120, 1, 1)));
        assert_eq!(g.b, matrix(120, 80, 80, 1, 1));
        let t = plain(2, 80, 128);
        let a = g.tensor_box(&c, &t, 0).unwrap();
        assert_eq!(
            (a.dims, a.strides, a.boxed),
            (vec![120, 100], vec![240], vec![64, 128])
        );
        assert_eq!(a.swizzle, Swizzle::B128);
        // B in boxes of 16 columns (80 is no multiple of 32) by a K tile of rows.
        let b = g.tensor_box(&c, &t, 1).unwrap();
        assert_eq!(
            (b.dims, b.strides, b.boxed),
            (vec![80, 120], vec![160], vec![16, 64])
        );
        assert_eq!((b.swizzle, t.boxes(1, &g.view)), (Swizzle::B32, 5));
        // batch matmul: a third dimension per operand.
        let c = contraction("batch_matmul", "3,40,48,32");
        let g = TmaGemm::of(&c).unwrap();
        assert_eq!(g.a, OperandView::Matrix(matrix(40, 32, 32, 3, 40 * 32)));
        assert_eq!(g.b, matrix(32, 48, 48, 3, 32 * 48));
        let a = g.tensor_box(&c, &t, 0).unwrap();
        assert_eq!(a.dims, vec![32, 40, 3]);
        assert_eq!(a.strides, vec![64, 40 * 32 * 2]);
        // NHWC 1×1 stride 1: A is the N·H·W × C activations, B the K × C weights
        // (K-major).
        let c = contraction("conv2d", "2,24,6,6,40,1,1,1,0");
        let g = TmaGemm::of(&c).unwrap();
        assert!(g.view.b_k_major);
        assert_eq!(g.a, OperandView::Matrix(matrix(72, 24, 24, 1, 1)));
        assert_eq!(g.b, matrix(40, 24, 24, 1, 1));
        assert_eq!(g.out, Some(matrix(72, 40, 40, 1, 1)));
    }

    /// The output's map for TMA stores: the `M × N` output (a third dimension per
    /// batch), boxes of 64 rows of the widest swizzle span that divides the tile's N.
    #[test]
    fn the_output_map_is_the_tasks_output() {
        let stored = |block_n| WgmmaTiling {
            tma_store: 1,
            ..plain(1, block_n, 64)
        };
        let c = contraction("matmul", "100,80,120");
        let g = TmaGemm::of(&c).unwrap();
        assert_eq!(g.out, Some(matrix(100, 80, 80, 1, 1)));
        let out = g.output_box(&c, &stored(128)).unwrap();
        assert_eq!(
            (out.dims, out.strides, out.boxed, out.swizzle),
            (vec![80, 100], vec![160], vec![64, 64], Swizzle::B128)
        );
        // 48 columns: chunks of 16 (32 bytes), the 32-byte swizzle.
        let t = stored(48);
        assert_eq!((t.store_columns(2), t.store_swizzle(2)), (16, Swizzle::B32));
        assert_eq!(t.staging_bytes(2), 2 * 64 * 16 * 2);
        // f32: 32 columns span 128 bytes.
        assert_eq!(stored(96).store_columns(4), 32);
        let c = contraction("batch_matmul", "3,40,48,32");
        let g = TmaGemm::of(&c).unwrap();
        let out = g.output_box(&c, &stored(48)).unwrap();
        assert_eq!(
            (out.dims, out.strides, out.boxed),
            (vec![48, 40, 3], vec![96, 40 * 48 * 2], vec![16, 64, 1])
        );
        // Output rows of 36 halves (72 bytes) are no TMA matrix.
        let c = contraction("conv2d", "2,24,6,6,36,1,1,1,0");
        let g = TmaGemm::of(&c).unwrap();
        assert!(g.output_box(&c, &stored(48)).is_none());
    }

    /// A convolution that is no plain matrix is an im2col walk of its activations, and
    /// its weights a matrix with a dimension per filter tap; what the walk cannot
    /// express says why.
    #[test]
    fn convolutions_are_im2col_walks() {
        let padded = contraction("conv2d", "1,16,8,8,16,3,3,1,1");
        let g = TmaGemm::of(&padded).unwrap();
        let OperandView::Im2col(a) = &g.a else {
            panic!("{:?}", g.a)
        };
        // One image (a dimension of 1 past the pixels); the box of base pixels from the
        // padding's corner to the last output's base, -1..=6 each way.
        assert_eq!(
            (a.dims.clone(), a.strides.clone()),
            (vec![16, 8, 8, 1], vec![16, 128, 1024])
        );
        assert_eq!(
            a.im2col,
            Im2col {
                lower: vec![-1, -1],
                upper: vec![-1, -1],
                traversal: vec![1, 1]
            }
        );
        assert_eq!(
            (a.taps.clone(), a.m_extents.clone()),
            (vec![Some((1, 1)), Some((0, 1))], vec![1, 8, 8])
        );
        assert_eq!(g.view.taps, 9);
        let mut b = matrix(16, 16, 144, 1, 1);
        b.taps = vec![(3, 16), (3, 48)];
        assert_eq!(g.b, b);
        let t = plain(1, 16, 32);
        let boxed = g.tensor_box(&padded, &t, 1).unwrap();
        assert_eq!(
            (boxed.dims, boxed.boxed),
            (vec![16, 3, 3, 16], vec![16, 1, 1, 16])
        );
        assert_eq!(t.ktiles(&g.view), 9);
        // A 1×1 stride-2 downsample: no taps, a walk two pixels at a time.
        let strided = contraction("conv2d", "2,16,8,8,16,1,1,2,0");
        let g = TmaGemm::of(&strided).unwrap();
        let OperandView::Im2col(a) = &g.a else {
            panic!("{:?}", g.a)
        };
        assert_eq!(
            (a.im2col.upper.clone(), a.im2col.traversal.clone()),
            (vec![-1, -1], vec![2, 2])
        );
        assert_eq!(
            (a.taps.clone(), a.m_extents.clone()),
            (vec![None, None], vec![2, 4, 4])
        );
        // Pixels 8 bytes apart (4 fp16 channels): TMA needs 16.
        let narrow = contraction("conv2d", "1,4,8,8,16,3,3,1,1");
        assert!(matches!(
            TmaGemm::of(&narrow).unwrap().tensor_box(&narrow, &t, 0),
            Err(InvalidState::NoTma(TmaGemmError::Rules {
                error: TmaError::Stride { .. },
                ..
            }))
        ));
        // A filter reaching 256 pixels: its offsets need more than 8 bits.
        let wide = contraction("conv2d", "n=1,c=16,h=300,w=8,k=16,r=3,s=1,dilation_h=128");
        assert!(matches!(
            TmaGemm::of(&wide),
            Err(InvalidState::NoTma(TmaGemmError::Im2col {
                why: "the filter's span",
                ..
            }))
        ));
    }

    /// Every row of every im2col box of a strided, dilated, asymmetrically padded
    /// convolution over two images, at the coordinates the lowering gives each row tile,
    /// tap and channel block, is the implicit GEMM's row: the pixel under the tap, zeros
    /// in the padding, past the channels and past the last output pixel.
    #[test]
    fn im2col_boxes_are_the_implicit_gemms_rows() {
        let shape = "n=2,c=24,h=9,w=8,k=16,r=3,s=2,stride_h=2,stride_w=1,pad_h=1,pad_w=0,pad_bottom=2,pad_right=1,dilation_w=2";
        let c = contraction("conv2d", shape);
        let (n, h, w, ch) = (2i64, 9i64, 8i64, 24i64);
        let g = TmaGemm::of(&c).unwrap();
        let OperandView::Im2col(a) = &g.a else {
            panic!("{:?}", g.a)
        };
        let [_, p, q] = a.m_extents[..] else {
            panic!("{:?}", a.m_extents)
        };
        // A box of 64 rows of 16 channels (32 bytes): 24 channels are one and a half.
        let t = plain(1, 16, 32);
        let tensor = g.tensor_box(&c, &t, 0).unwrap();
        let layout = tensor.shared_layout();
        let m = n * p * q;
        for m0 in (0..m).step_by(64) {
            let (image, row, column) = (m0 / (p * q), m0 / q % p, m0 % q);
            for (r, s, cb) in (0..3i64)
                .flat_map(|r| (0..2i64).flat_map(move |s| (0..2i64).map(move |cb| (r, s, cb))))
            {
                let lower: Vec<i64> = a.im2col.lower.iter().map(|&x| i64::from(x)).collect();
                let origin: [i64; 6] = [
                    cb * 16,
                    lower[0] + column,
                    lower[1] + 2 * row,
                    image,
                    2 * s,
                    r,
                ];
                let mut expected = Vec::new();
                for i in 0..64 {
                    let m = m0 + i;
                    let (ni, pi, qi) = (m / (p * q), m / q % p, m % q);
                    let (hi, wi) = (pi * 2 - 1 + r, qi + 2 * s);
                    for j in 0..16 {
                        let cj = cb * 16 + j;
                        let inside = m < n * p * q
                            && (0..h).contains(&hi)
                            && (0..w).contains(&wi)
                            && cj < ch;
                        let global = ((ni * h + hi) * w + wi) * ch + cj;
                        expected.push((layout.offset(i, j), inside.then_some(global)));
                    }
                }
                assert_eq!(
                    tensor.elements(&origin),
                    expected,
                    "m0 {m0} tap ({r}, {s}) block {cb}"
                );
            }
        }
    }
}
