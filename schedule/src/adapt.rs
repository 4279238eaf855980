//! Adapting a state tuned for one task to another task's shape: transfer, where a new
//! task's first round measures the best states of its nearest tuned tasks.
//!
//! Each sketch states how one of its states adapts. What a state's tiling says of one
//! block's work (tile sides, warps, the pipeline's depth, copy widths, the swizzle)
//! carries over as it is: it does not depend on the shape, and it is what made the
//! kernel fast. What depends on the shape is fitted to the new one, field by field, as
//! the validation refuses it:
//! - every sketch: a reduction split across blocks (`split_k`, with its sums) that the
//!   new reduction cannot take is dropped;
//! - CUDA cores: register prefetch, fetch vector widths and shared layouts the new
//!   extents do not allow go back to their defaults;
//! - `mma.sync`: stream-K, persistent blocks and row spans that the new grid or
//!   convolution does not allow are dropped;
//! - `wgmma`: the raster band shrinks to the largest that divides the new M tiles (or
//!   none), and stream-K, persistent blocks, clusters and TMA stores that do not fit the
//!   new grid are dropped; a block taller than the new M by a whole warpgroup MMA loses
//!   its second MMA row, then its second consumer.
//!
//! A state the validation still refuses for a reason about its tiling itself (a tile
//! the new task's types or axes cannot take) is refused with that reason.

use crate::state::{SplitSums, State};
use crate::task::{Contraction, Task};
use crate::{GpuSpec, InvalidState, validate};

/// Most fields one adaptation fits (each repair changes one field, and a field once
/// reset is never refused again for the same reason).
const MAX_REPAIRS: usize = 12;

/// `state`, of some task of the same operator, types and sketch, adapted to `to` on
/// `gpu`: a valid state of `to`, or why none could be made of it.
pub fn adapt(state: &State, to: &Task, gpu: &GpuSpec) -> Result<State, InvalidState> {
    let c = to.contraction();
    let mut s = state.clone();
    for _ in 0..MAX_REPAIRS {
        let why = match validate(&c, &s, gpu) {
            Ok(()) => return Ok(s),
            Err(why) => why,
        };
        if !repair(&mut s, &why, &c) {
            return Err(why);
        }
    }
    validate(&c, &s, gpu).map(|()| s)
}

/// Changes the one field of `s` that `why` refuses, for the new shape `c`; false when
/// no shape-dependent field explains it.
fn repair(s: &mut State, why: &InvalidState, c: &Contraction) -> bool {
    use InvalidState as E;
    match why {
        E::SplitK { .. }
        | E::SplitKRelu { .. }
        | E::SplitSums
        | E::SplitKOutput { .. }
        | E::SplitWorkspace { .. }
            if s.split_k != 1 || !s.split_sums.is_ordered() =>
        {
            s.split_k = 1;
            s.split_sums = SplitSums::Ordered;
            true
        }
        _ => match s.sketch().repair(s, why, c) {
            Some(fitted) => {
                *s = fitted;
                true
            }
            None => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::WgmmaTiling;
    use crate::task::{DType, Epilogue, Operator};
    use crate::{Sampler, parse_shape};
    use proptest::prelude::*;

    fn matmul(m: u32, n: u32, k: u32, dtype: DType) -> Task {
        Task::new(Operator::Matmul { m, n, k }, Epilogue::default())
            .and_then(|t| t.with_types(dtype, dtype, crate::Layout::Nchw))
            .unwrap()
    }

    #[test]
    fn a_valid_state_carries_over_unchanged() {
        let gpu = GpuSpec::h100();
        let from = matmul(4096, 4096, 4096, DType::Fp16);
        let to = matmul(4096, 4096, 2048, DType::Fp16);
        let mut sampler = Sampler::new(&from, &gpu, 3);
        let mut same = 0;
        for s in sampler.sample_distinct(200) {
            if validate(&to.contraction(), &s, &gpu).is_ok() {
                assert_eq!(adapt(&s, &to, &gpu).unwrap(), s);
                same += 1;
            }
        }
        assert!(same > 100, "{same} of 200 states valid on both");
    }

    #[test]
    fn a_raster_band_shrinks_to_the_new_m_tiles() {
        let gpu = GpuSpec::h100();
        let from = matmul(8192, 8192, 8192, DType::Fp16);
        let mut sampler = Sampler::new(&from, &gpu, 5);
        let banded = sampler
            .sample_distinct(2000)
            .into_iter()
            .find(|s| s.wgmma().is_some_and(|t| t.raster == 16 && t.cluster == 0))
            .expect("a state with a band of 16");
        let block_m = banded.wgmma().unwrap().block_m();
        // 12 M tiles: a band of 4 divides them, 8 and 16 do not.
        let to = matmul(12 * block_m, 8192, 8192, DType::Fp16);
        let adapted = adapt(&banded, &to, &gpu).unwrap();
        assert_eq!(adapted.wgmma().unwrap().raster, 4);
        assert_eq!(
            adapted.wgmma().map(|t| WgmmaTiling { raster: 16, ..t }),
            banded.wgmma(),
            "nothing else changed"
        );
    }

    /// Tasks of every operator and type that share sketches, with shapes from tiny to
    /// large.
    fn tasks() -> Vec<Task> {
        let specs = [
            ("matmul", "333,777,555"),
            ("matmul", "16,4096,4096"),
            ("matmul", "4096,4096,4096"),
            ("matmul", "128,768,3072"),
            ("batch_matmul", "12,128,128,64"),
            ("conv2d", "1,64,56,56,64,3,3,1,1"),
            ("conv2d", "8,512,7,7,512,3,3,1,1"),
            ("conv2d", "1,3,224,224,64,7,7,2,3"),
            ("conv2d", "4,256,14,14,1024,1,1,1,0"),
        ];
        let mut out = Vec::new();
        for (op, spec) in specs {
            let op = parse_shape(op, spec).unwrap();
            for dtype in [DType::F32, DType::Fp16] {
                let layout = if dtype == DType::F32 {
                    crate::Layout::Nchw
                } else {
                    crate::Layout::Nhwc
                };
                let task = Task::new(op, Epilogue::default())
                    .and_then(|t| t.with_types(dtype, dtype, layout));
                out.push(task.unwrap());
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Adapting a sampled state of any task to another task of the same operator and
        /// types gives a valid state of the same sketch, or a clear refusal.
        #[test]
        fn an_adapted_state_is_valid_or_refused(from in 0usize..18, to in 0usize..18, seed in 0u64..1000) {
            let gpu = GpuSpec::h100();
            let all = tasks();
            let (from, to) = (all[from], all[to]);
            prop_assume!(from.op.name() == to.op.name() && from.dtype == to.dtype);
            let mut sampler = Sampler::new(&from, &gpu, seed);
            for s in sampler.sample_distinct(24) {
                match adapt(&s, &to, &gpu) {
                    Ok(a) => {
                        prop_assert!(validate(&to.contraction(), &a, &gpu).is_ok());
                        prop_assert_eq!(a.sketch().name(), s.sketch().name());
                    }
                    Err(why) => prop_assert!(!why.to_string().is_empty()),
                }
            }
        }
    }
}
