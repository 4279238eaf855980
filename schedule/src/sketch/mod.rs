//! The sketches' own knowledge, one module each, on the way to one folder per sketch
//! behind one interface (issue 52): so far the neighbours of a state, one definition
//! that mutation and DGD both use (`search`'s `mutate` and `dgd`), and the reduction
//! split's steps they share.

pub mod mma_sync;
pub mod wgmma;

use crate::state::{MAX_SPLIT_K, State};
use crate::task::Contraction;

/// The reduction splits one doubling or halving away from `s`'s that `c` allows:
/// at least 1, at most `MAX_SPLIT_K` and the stage count.
pub fn split_steps(c: &Contraction, s: &State) -> Vec<u32> {
    if !s.may_split(c) {
        return Vec::new();
    }
    let max = s.stages(c).min(u64::from(MAX_SPLIT_K));
    [s.split_k / 2, s.split_k.saturating_mul(2)]
        .into_iter()
        .filter(|&k| k >= 1 && k != s.split_k && u64::from(k) <= max)
        .collect()
}
