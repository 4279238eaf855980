//! The CUDA-core sketch's draws: each axis's split uniform over the factorizations of a
//! tiled extent, the unroll depth, the widest feasible copies, the reduction split, the
//! shared layouts and prefetch, each on its stream (see `crate::sample`).

use crate::sample::Sampler;
use crate::sketch::cuda_core::geometry::{Tiling, canonical_unroll};
use crate::sketch::cuda_core::validate::prefetch_feasible;
use crate::state::{
    ReductionSplit, SketchTiling, SpatialSplit, SplitSums, State, UNROLL_STEPS, VECTOR_WIDTHS,
};

impl Sampler {
    /// A CUDA-core draw: every draw the sketches before it in `Sampler::DRAWS` leave.
    pub(crate) fn draw_cuda_core(&mut self) -> Option<State> {
        Some(self.cuda_core_state())
    }

    /// One CUDA-core draw, valid or not.
    fn cuda_core_state(&mut self) -> State {
        let c = &self.contraction;
        let spatial_extents: Vec<u32> = c.spatial.iter().map(|a| a.extent).collect();
        let reduction_extents: Vec<u32> = c.reduction.iter().map(|a| a.extent).collect();
        let spatial = spatial_extents
            .into_iter()
            .map(|e| {
                let f = self.split(e, 4);
                SpatialSplit {
                    vthread: f[0],
                    thread: f[1],
                    outer: f[2],
                    inner: f[3],
                }
            })
            .collect();
        let reduction = reduction_extents
            .into_iter()
            .map(|e| {
                let f = self.split(e, 2);
                ReductionSplit {
                    middle: f[0],
                    inner: f[1],
                }
            })
            .collect();
        let unroll_max_step = UNROLL_STEPS[self.pick(UNROLL_STEPS.len())];
        let mut state = State {
            prefetch: false,
            split_sums: SplitSums::Ordered,
            tiling: SketchTiling::CudaCore,
            spatial,
            reduction,
            unroll_max_step,
            vector_width: [1, 1],
            split_k: 1,
            shared_layout: Default::default(),
        };
        let tiling = Tiling::new(&self.contraction, &state);
        for input in 0..2 {
            let feasible: Vec<u32> = VECTOR_WIDTHS
                .into_iter()
                .filter(|&w| tiling.vector_feasible(&self.contraction, input, w))
                .collect();
            state.vector_width[input] = feasible[self.pick(feasible.len())];
        }
        state.split_k = self.split_k(&state);
        state.shared_layout = [self.layout(0), self.layout(1)];
        state.unroll_max_step = canonical_unroll(&self.contraction, &state);
        state.prefetch = prefetch_feasible(&self.contraction, &state) && self.pick(2) == 1;
        state
    }
}
