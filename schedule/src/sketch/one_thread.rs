//! A fourth sketch, written by a test to show what adding one takes: this file, its
//! variant and arm (`tiling.rs`, `State::sketch`) and its draw (`Sampler::DRAWS`). One
//! thread per output element, lowered as the CUDA-core loop nest of those threads.

use crate::sketch::Sketch;
use crate::state::{ReductionSplit, SketchTiling::OneThread as Tiling, SpatialSplit, State};
use crate::validate::{only_sketch_fields, validate};
use crate::{GpuSpec, InvalidState, Kernel, Sampler, Task, lower::lower, task::Contraction};

thread_local!(static DRAWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OneThread(pub u32);

/// The CUDA-core state of `threads` threads along the last axis, one output each.
fn cuda_core(threads: u32, c: &Contraction) -> State {
    let mut s = State {
        spatial: vec![SpatialSplit::UNIT; c.spatial.len()],
        reduction: vec![ReductionSplit::UNIT; c.reduction.len()],
        ..State::empty()
    };
    if let Some(last) = s.spatial.last_mut() {
        last.thread = threads;
    }
    s
}

impl Sketch for OneThread {
    fn name(&self) -> &'static str {
        "one-thread"
    }
    fn threads(&self, _: &State) -> u32 {
        self.0
    }
    fn spatial_blocks(&self, c: &Contraction, _: &State) -> u64 {
        cuda_core(self.0, c).spatial_blocks(c)
    }
    fn validate(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Result<(), InvalidState> {
        only_sketch_fields(s, State::of(Tiling(*self)))?;
        validate(c, &cuda_core(self.0, c), gpu)
    }
    fn neighbours(&self, c: &Contraction, _: &State, gpu: &GpuSpec) -> Vec<State> {
        let moved = [self.0 / 2, self.0 * 2].map(|n| State::of(Tiling(OneThread(n))));
        let valid = |n: &State| n.sketch().validate(c, n, gpu).is_ok();
        moved.into_iter().filter(valid).collect()
    }
    fn lower(&self, task: &Task, _: &State) -> Kernel {
        lower(task, &cuda_core(self.0, &task.contraction()))
    }
}

impl Sampler {
    /// Every draw while a test sets `DRAWN`: 32 to 256 threads per block.
    pub(crate) fn draw_one_thread(&mut self) -> Option<State> {
        DRAWN
            .get()
            .then(|| State::of(Tiling(OneThread(32 << self.pick(4)))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::{self, Inputs};
    use crate::parse_shape;

    #[test]
    fn a_fourth_sketch_is_sampled_validated_lowered_and_interpreted() {
        DRAWN.set(true);
        let gpu = GpuSpec::h100();
        for (op, shape) in [
            ("matmul", "m=5,n=70,k=9"),
            ("conv2d", "c=3,h=7,w=9,k=5,r=3,s=3"),
        ] {
            let task = Task::new(parse_shape(op, shape).unwrap(), Default::default()).unwrap();
            let c = task.contraction();
            let data = |i: usize| -> Vec<f32> {
                (0..c.inputs[i].elements())
                    .map(|x| (x % 7) as f32 - 3.0)
                    .collect()
            };
            let (a, b) = (data(0), data(1));
            let inputs = Inputs {
                inputs: [&a, &b],
                bias: None,
            };
            let expected = interp::reference(&c, &inputs);
            let states = Sampler::new(&task, &gpu, 7).sample_distinct(4);
            assert_eq!(states.len(), 4, "{task}");
            for s in &states {
                assert_eq!(s.sketch().name(), "one-thread");
                assert!(!s.sketch().neighbours(&c, s, &gpu).is_empty());
                let got = interp::run(&crate::lower::lower(&task, s), &inputs, expected.len());
                assert_eq!(got.unwrap(), expected, "{task} {}", s.to_json());
            }
        }
        DRAWN.set(false);
    }
}
