//! The CUDA-core sketch: Ansor's "SSSRRSRS" multi-level tiling (`crate::state`), its
//! geometry (`geometry`: tiles, fetches, staging), what it refuses (`validate`), its
//! draws, its neighbours (`steps`) and its lowering (`lower`).

pub mod draw;
pub mod geometry;
pub mod lower;
pub mod steps;
pub mod tiling;
pub mod validate;

pub use geometry::*;
pub use validate::{check_structure, prefetch_feasible, register_estimate};

use crate::gpu_spec::GpuSpec;
use crate::invalid::InvalidState;
use crate::ir::Kernel;
use crate::sketch::Sketch;
use crate::sketch::cuda_core::tiling::CudaCore;
use crate::state::{SharedLayout, State};
use crate::task::{Contraction, DType, Task};
use rand_chacha::ChaCha8Rng;

impl Sketch for CudaCore {
    fn name(&self) -> &'static str {
        "cuda-core"
    }

    fn threads(&self, s: &State) -> u32 {
        s.spatial.iter().map(|a| a.thread).product()
    }

    /// The product of the stages per reduction axis (the flattened outer reduction loop).
    fn stages(&self, c: &Contraction, s: &State) -> u64 {
        s.stages_per_axis(c).iter().map(|&n| u64::from(n)).product()
    }

    fn spatial_blocks(&self, c: &Contraction, s: &State) -> u64 {
        s.blocks_per_axis(c).iter().map(|&b| u64::from(b)).product()
    }

    /// The partial sums are added atomically into the output: only into an f32 output
    /// (the type with the atomic add) and without a ReLU (which does not distribute over
    /// partial sums).
    fn may_split(&self, c: &Contraction, _s: &State) -> bool {
        !c.relu && c.out_dtype == DType::F32
    }

    fn validate(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Result<(), InvalidState> {
        validate::validate(c, s, gpu)
    }

    fn tile_vector(&self, s: &State) -> Vec<u32> {
        steps::tile_vector(s)
    }

    fn neighbours(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
        steps::neighbours(c, s, gpu)
    }

    fn mutate(
        &self,
        c: &Contraction,
        s: &State,
        gpu: &GpuSpec,
        rng: &mut ChaCha8Rng,
    ) -> Option<State> {
        steps::mutate(s, c, gpu, rng)
    }

    /// Register prefetch, fetch vector widths and shared layouts the new extents do not
    /// allow go back to their defaults.
    fn repair(&self, s: &State, why: &InvalidState, _c: &Contraction) -> Option<State> {
        use InvalidState as E;
        let mut n = s.clone();
        match why {
            E::Prefetch if s.prefetch => n.prefetch = false,
            E::VectorWidth { input, .. } if s.vector_width[*input] != 1 => {
                n.vector_width[*input] = 1;
            }
            E::LayoutDimension { .. } | E::LayoutPad { .. }
                if s.shared_layout != [SharedLayout::NATURAL; 2] =>
            {
                n.shared_layout = [SharedLayout::NATURAL; 2];
            }
            _ => return None,
        }
        Some(n)
    }

    fn lower(&self, task: &Task, s: &State) -> Kernel {
        lower::lower(task, s)
    }
}
