//! The naive definition every lowered kernel must match: the contraction evaluated
//! element by element.

use super::*;

/// The contraction evaluated from its definition: for each output element, the sum over
/// the reduction space of the products (out-of-range input indices read zero), then the
/// epilogue.
pub fn reference(c: &Contraction, inputs: &Inputs) -> Vec<f32> {
    let spatial_ext: Vec<i64> = c.spatial.iter().map(|a| i64::from(a.extent)).collect();
    let red_ext: Vec<i64> = c.reduction.iter().map(|a| i64::from(a.extent)).collect();
    let out_len = c.output_elements() as usize;
    let red_len: i64 = red_ext.iter().product();
    let unflatten = |mut i: i64, ext: &[i64]| {
        let mut idx = vec![0i64; ext.len()];
        for d in (0..ext.len()).rev() {
            idx[d] = i % ext[d];
            i /= ext[d];
        }
        idx
    };
    (0..out_len)
        .map(|o| {
            let s = unflatten(o as i64, &spatial_ext);
            let mut sum = 0.0f32;
            for r in 0..red_len {
                let r = unflatten(r, &red_ext);
                let x = c.inputs[0]
                    .flat_offset(&s, &r)
                    .map_or(0.0, |i| inputs.inputs[0][i]);
                let y = c.inputs[1]
                    .flat_offset(&s, &r)
                    .map_or(0.0, |i| inputs.inputs[1][i]);
                sum = x.mul_add(y, sum);
            }
            if let (Some(access), Some(bias)) = (&c.bias, inputs.bias) {
                sum += bias[access.flat_offset(&s, &[]).expect("bias indexed in range")];
            }
            if c.relu {
                sum = sum.max(0.0);
            }
            sum
        })
        .collect()
}
