//! Which sketch draws: the sampler asks the sketches in `Sampler::DRAWS`'s order, and the
//! first that takes a draw makes it. Each decides on a stream of its own, so the
//! draws of a seed stay what they were when a sketch is added before the others; the
//! CUDA-core sketch takes every draw left.

use crate::sample::Sampler;
use crate::state::State;

/// A sketch's draw: a state, valid or not, or None when the draw is not this sketch's.
type Draw = fn(&mut Sampler) -> Option<State>;

impl Sampler {
    /// The sketches, in the order a draw asks them.
    const DRAWS: &[Draw] = &[
        #[cfg(test)]
        Sampler::draw_one_thread,
        Sampler::draw_wgmma,
        Sampler::draw_mma_sync,
        Sampler::draw_cuda_core,
    ];

    /// One draw, valid or not, of the first sketch that takes it (the CUDA-core sketch
    /// takes every draw it is asked for, so never the empty state, which is invalid).
    pub(crate) fn draw(&mut self) -> State {
        Self::DRAWS
            .iter()
            .find_map(|draw| draw(self))
            .unwrap_or_else(State::empty)
    }
}
