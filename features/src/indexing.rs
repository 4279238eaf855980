//! A tensor access's affine indexing, flattened once per task into the fixed-size form
//! the per-lane simulations evaluate, plus the compulsory traffic of the access.

use crate::geometry::{Coords, Geometry, MAX_AXES};
use schedule::task::{Access, AffineIndex, AxisRef, Contraction};

/// Largest enumeration done to count the distinct indices of one tensor dimension.
const MAX_ENUMERATION: i64 = 1 << 22;

/// One tensor access: `tensor[d] = sum(coeff * axis) + offset` per dimension `d`.
#[derive(Debug, Clone)]
pub(crate) struct Indexing {
    pub rank: usize,
    /// Tensor extent per dimension.
    pub shape: Coords,
    /// Row-major strides of the tensor, in floats.
    pub strides: Coords,
    pub offsets: Coords,
    pub terms: Vec<Vec<(AxisRef, i64)>>,
}

impl Indexing {
    /// The indexing of `access`; tensors of more than `MAX_AXES` dimensions keep only
    /// their first ones (no operator has them).
    pub(crate) fn new(access: &Access) -> Self {
        let rank = access.index.len().min(MAX_AXES);
        let mut shape = [1; MAX_AXES];
        let mut strides = [0; MAX_AXES];
        let mut offsets = [0; MAX_AXES];
        for (d, stride) in access.strides().into_iter().enumerate().take(rank) {
            shape[d] = i64::from(access.shape[d]);
            strides[d] = stride;
            offsets[d] = access.index[d].offset;
        }
        Indexing {
            rank,
            shape,
            strides,
            offsets,
            terms: access
                .index
                .iter()
                .take(rank)
                .map(|i| i.terms.clone())
                .collect(),
        }
    }

    /// Tensor index of each dimension at the origin of the tile of the given block and
    /// stage (spatial axes take the block's coordinate, reduction axes the stage's).
    pub(crate) fn tile_base(&self, geo: &Geometry, block: &Coords, stage: &Coords) -> Coords {
        let mut base = self.offsets;
        for (b, terms) in base.iter_mut().zip(&self.terms) {
            for &(axis, coeff) in terms {
                let coord = match axis {
                    AxisRef::Spatial(a) => block[a],
                    AxisRef::Reduction(r) => stage[r],
                };
                *b += coeff * coord * geo.tile(axis);
            }
        }
        base
    }

    /// Flat tensor offset of the given per-dimension indices, or None when one falls
    /// outside the tensor (padding: no load is issued).
    pub(crate) fn flat(&self, index: &Coords) -> Option<i64> {
        let mut flat = 0;
        for ((&i, &extent), &stride) in index
            .iter()
            .zip(&self.shape)
            .zip(&self.strides)
            .take(self.rank)
        {
            if i < 0 || i >= extent {
                return None;
            }
            flat += i * stride;
        }
        Some(flat)
    }
}

/// Distinct tensor elements the contraction reads through `access`: the product over
/// dimensions of the distinct in-range indices (axes are not shared between dimensions
/// in any operator; a shared one would only make this an upper bound).
pub(crate) fn touched_elements(access: &Access, c: &Contraction) -> f64 {
    access
        .index
        .iter()
        .zip(&access.shape)
        .map(|(index, &dim)| distinct_indices(index, i64::from(dim), c) as f64)
        .product()
}

/// Distinct values of `index` over the axes' ranges that fall in `0..dim`.
fn distinct_indices(index: &AffineIndex, dim: i64, c: &Contraction) -> i64 {
    let extent = |axis: AxisRef| match axis {
        AxisRef::Spatial(a) => i64::from(c.spatial[a].extent),
        AxisRef::Reduction(r) => i64::from(c.reduction[r].extent),
    };
    let combinations: i64 = index
        .terms
        .iter()
        .map(|&(a, _)| extent(a))
        .fold(1, |acc: i64, e| acc.saturating_mul(e));
    if combinations > MAX_ENUMERATION || dim > MAX_ENUMERATION {
        // Too many to enumerate: at most every combination, at most the dimension.
        return combinations.min(dim);
    }
    let mut hit = vec![false; dim as usize];
    let mut values = vec![index.offset];
    for &(axis, coeff) in &index.terms {
        values = values
            .iter()
            .flat_map(|&v| (0..extent(axis)).map(move |x| v + coeff * x))
            .collect();
    }
    for v in values {
        if (0..dim).contains(&v) {
            hit[v as usize] = true;
        }
    }
    hit.iter().filter(|&&h| h).count() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use schedule::{Epilogue, Task, parse_shape};

    fn contraction(op: &str, shape: &str) -> Contraction {
        Task::new(parse_shape(op, shape).unwrap(), Epilogue::default())
            .unwrap()
            .contraction()
    }

    #[test]
    fn strided_one_by_one_conv_touches_a_quarter_of_its_input() {
        let c = contraction("conv2d", "1,256,56,56,128,1,1,2,0");
        assert_eq!(touched_elements(&c.inputs[0], &c), (256 * 28 * 28) as f64);
        assert_eq!(touched_elements(&c.inputs[1], &c), (128 * 256) as f64);
    }

    #[test]
    fn padded_conv_touches_its_whole_input() {
        let c = contraction("conv2d", "1,64,56,56,64,3,3,1,1");
        assert_eq!(touched_elements(&c.inputs[0], &c), (64 * 56 * 56) as f64);
    }
}
