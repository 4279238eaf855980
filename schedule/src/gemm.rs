//! The GEMM view of a contraction, which the tensor-core sketch tiles.
//!
//! Tensor cores multiply matrices, so the sketch sees a contraction as a (batched)
//! matrix product: the spatial axes that index only the first input form the rows `M`,
//! those that index only the second input the columns `N`, those that index both a
//! batch, and the reduction axes, flattened in their order (last fastest), the shared
//! dimension `K`. For conv2d in NHWC this is the implicit GEMM (M = N·P·Q, N = K,
//! K = R·S·C); for matmul it is the matmul itself.
//!
//! The fill of shared memory copies runs of consecutive `K` (or, for a second input
//! stored `K × N`, consecutive `N`) elements, so the first input's contiguous dimension
//! must be exactly the innermost reduction axis, and the second input's either that
//! axis ("K-major", conv2d's KRSC weights: `mma`'s `.col` operand as stored) or its
//! only `N` axis ("N-major", matmul's row-major B: loaded with `ldmatrix.trans`).
//! NCHW conv2d fails the first condition and stays with the CUDA-core sketch.

use crate::task::{AxisRef, Contraction};
use thiserror::Error;

/// Why a contraction has no GEMM view.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum GemmError {
    #[error("the tensor-core sketch needs a reduction")]
    NoReduction,
    #[error(
        "input {tensor}'s contiguous dimension is not the innermost reduction axis (conv2d needs --layout nhwc for tensor cores)"
    )]
    ContiguousA { tensor: &'static str },
    #[error(
        "input {tensor}'s contiguous dimension is neither the innermost reduction axis nor its only output column axis"
    )]
    ContiguousB { tensor: &'static str },
    #[error("output axis {axis} indexes neither input")]
    Unused { axis: &'static str },
}

/// A contraction as a batched matrix product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmView {
    /// Spatial axes of the rows, the columns and the batch, each in axis order.
    pub m_axes: Vec<usize>,
    pub n_axes: Vec<usize>,
    pub batch_axes: Vec<usize>,
    pub m: u64,
    pub n: u64,
    /// Length of the flattened reduction.
    pub k: u64,
    /// Positions of the reduction axes other than the innermost (a convolution's filter
    /// taps, `R·S`; 1 for a matmul): `k` is `taps` runs of the innermost axis.
    pub taps: u64,
    pub batch: u64,
    /// Whether the second input is stored with the reduction contiguous (else its `N`).
    pub b_k_major: bool,
    /// Extent of each input's contiguous dimension (copies never straddle it).
    pub contiguous: [u32; 2],
    /// Bytes of an input element.
    pub element_bytes: u32,
}

impl GemmView {
    pub fn of(c: &Contraction) -> Result<GemmView, GemmError> {
        let last_red = c
            .reduction
            .len()
            .checked_sub(1)
            .ok_or(GemmError::NoReduction)?;
        let inner = AxisRef::Reduction(last_red);
        let uses = |input: usize, axis: usize| {
            c.inputs[input]
                .index
                .iter()
                .any(|ix| ix.coeff(AxisRef::Spatial(axis)) != 0)
        };
        let (mut m_axes, mut n_axes, mut batch_axes) = (Vec::new(), Vec::new(), Vec::new());
        for (a, axis) in c.spatial.iter().enumerate() {
            match (uses(0, a), uses(1, a)) {
                (true, true) => batch_axes.push(a),
                (true, false) => m_axes.push(a),
                (false, true) => n_axes.push(a),
                // A lone extent-1 axis (a 1×1 output) indexes nothing; it is a row.
                (false, false) if axis.extent == 1 => m_axes.push(a),
                (false, false) => return Err(GemmError::Unused { axis: axis.name }),
            }
        }
        let [a, b] = &c.inputs;
        let last = |access: &crate::task::Access| access.index.last().cloned();
        // A grouped convolution's channel is `g·C/G + c`: the group is a batch axis,
        // constant within a block, so runs along `c` stay contiguous (C/G long).
        let inner_plus_batch = |ix: &crate::task::AffineIndex| {
            ix.offset == 0 && ix.coeff(inner) == 1 && ix.terms.iter().all(|&(axis, coeff)| {
                axis == inner
                    || matches!(axis, AxisRef::Spatial(s) if batch_axes.contains(&s) && coeff > 0)
            })
        };
        if !last(a).is_some_and(|ix| inner_plus_batch(&ix)) {
            return Err(GemmError::ContiguousA { tensor: a.tensor });
        }
        let b_last = last(b).expect("every access has a dimension");
        let b_k_major = if b_last.is_axis(inner) {
            true
        } else if n_axes.len() == 1 && b_last.is_axis(AxisRef::Spatial(n_axes[0])) {
            false
        } else {
            return Err(GemmError::ContiguousB { tensor: b.tensor });
        };
        let product = |axes: &[usize]| {
            axes.iter()
                .map(|&x| u64::from(c.spatial[x].extent))
                .product::<u64>()
        };
        Ok(GemmView {
            m: product(&m_axes),
            n: product(&n_axes),
            batch: product(&batch_axes),
            k: c.reduction.iter().map(|r| u64::from(r.extent)).product(),
            taps: c.reduction[..last_red]
                .iter()
                .map(|r| u64::from(r.extent))
                .product(),
            m_axes,
            n_axes,
            batch_axes,
            b_k_major,
            element_bytes: c.dtype.bytes(),
            // Copies run along the innermost reduction axis (or B's N): no further
            // than its extent, even where the tensor's dimension is longer (groups).
            contiguous: [
                c.reduction[last_red].extent,
                if b_k_major {
                    c.reduction[last_red].extent
                } else {
                    *b.shape.last().expect("every access has a dimension")
                },
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{DType, Epilogue, Layout, Operator, Task};
    use crate::{network, parse_shape};

    fn view(op: &str, shape: &str, layout: Layout) -> Result<GemmView, GemmError> {
        let task = Task::new(parse_shape(op, shape).unwrap(), Epilogue::default())
            .unwrap()
            .with_types(DType::Fp16, DType::F32, layout)
            .unwrap();
        GemmView::of(&task.contraction())
    }

    #[test]
    fn nhwc_conv_is_an_implicit_gemm() {
        let v = view("conv2d", "2,64,56,56,128,3,3,1,1", Layout::Nhwc).unwrap();
        assert_eq!((v.m, v.n, v.k, v.batch), (2 * 56 * 56, 128, 9 * 64, 1));
        assert_eq!(v.taps, 9);
        assert!(v.b_k_major);
        assert_eq!(v.contiguous, [64, 64]);
        // The stem's three channels: still a GEMM, with short contiguous runs.
        let stem = view("conv2d", "1,3,224,224,64,7,7,2,3", Layout::Nhwc).unwrap();
        assert_eq!((stem.m, stem.n, stem.k), (112 * 112, 64, 147));
        assert_eq!(stem.contiguous, [3, 3]);
    }

    #[test]
    fn grouped_nhwc_conv_is_a_gemm_batched_over_groups_and_depthwise_is_not() {
        let g = view(
            "conv2d",
            "c=64,h=28,w=28,k=128,r=3,s=3,pad=1,groups=4",
            Layout::Nhwc,
        )
        .unwrap();
        assert_eq!((g.m, g.n, g.k, g.batch), (28 * 28, 32, 9 * 16, 4));
        assert_eq!(g.contiguous, [16, 16]);
        assert!(g.b_k_major);
        assert!(matches!(
            view(
                "conv2d",
                "c=64,h=28,w=28,k=64,r=3,s=3,pad=1,groups=64",
                Layout::Nhwc
            ),
            Err(GemmError::ContiguousA { .. })
        ));
    }

    #[test]
    fn nchw_conv_is_not() {
        assert!(matches!(
            view("conv2d", "1,64,56,56,64,3,3,1,1", Layout::Nchw),
            Err(GemmError::ContiguousA { .. })
        ));
    }

    #[test]
    fn matmuls_have_an_n_major_b_and_batches() {
        let v = view("matmul", "333,777,555", Layout::Nchw).unwrap();
        assert_eq!((v.m, v.n, v.k, v.batch), (333, 777, 555, 1));
        assert!(!v.b_k_major);
        let b = view("batch_matmul", "12,128,128,64", Layout::Nchw).unwrap();
        assert_eq!((b.m, b.n, b.k, b.batch), (128, 128, 64, 12));
        assert_eq!(b.batch_axes, [0]);
    }

    #[test]
    fn every_nhwc_network_layer_and_matmul_has_a_view() {
        for name in crate::NETWORKS {
            for w in network(name, 1).unwrap() {
                let t = w.task.with_types(DType::Fp16, DType::F32, Layout::Nhwc);
                let t = t.unwrap();
                // Depthwise convolutions have no reduction over channels: no GEMM.
                let depthwise =
                    matches!(t.op, Operator::Conv2d(c) if c.groups > 1 && c.groups == c.c);
                assert_eq!(
                    GemmView::of(&t.contraction()).is_ok(),
                    !depthwise,
                    "{}",
                    t.key()
                );
            }
        }
    }
}
