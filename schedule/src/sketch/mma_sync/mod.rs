//! The `mma.sync` sketch: a block tile of warps, each a grid of 16×8 MMA tiles, fed by a
//! `cp.async` pipeline of shared stages. Its tiling (`tiling`), what the tiling means for
//! a task and what it refuses (`geometry`), its draws, its neighbours (`steps`) and its
//! lowering (`lower`).

pub mod draw;
pub mod geometry;
pub mod lower;
pub mod steps;
pub mod tiling;

pub use geometry::*;
pub use steps::MmaCoordinate;
pub use tiling::*;

use crate::gemm::GemmView;
use crate::gpu_spec::GpuSpec;
use crate::invalid::InvalidState;
use crate::ir::Kernel;
use crate::sketch::Sketch;
use crate::state::{SketchTiling, State};
use crate::task::{Contraction, Task};
use crate::validate::only_sketch_fields;

impl State {
    /// A state of the `mma.sync` sketch.
    pub fn tensor_core(mma: MmaTiling, split_k: u32) -> State {
        State {
            split_k,
            ..State::of(SketchTiling::MmaSync(mma))
        }
    }

    /// The `mma.sync` tiling of a state of that sketch.
    pub fn mma(&self) -> Option<MmaTiling> {
        match self.tiling {
            SketchTiling::MmaSync(t) => Some(t),
            _ => None,
        }
    }

    /// The `mma.sync` tiling of a state of that sketch, to change in place.
    pub fn mma_mut(&mut self) -> Option<&mut MmaTiling> {
        match &mut self.tiling {
            SketchTiling::MmaSync(t) => Some(t),
            _ => None,
        }
    }
}

impl MmaTiling {
    /// The GEMM view as this tiling tiles it (row spans' own where it stages them).
    fn tiled(&self, c: &Contraction) -> Option<(GemmView, Option<SpanStaging>)> {
        let view = GemmView::of(c).ok()?;
        let span = self.span_staging(c, 1).ok().flatten();
        Some((view, span))
    }
}

impl Sketch for MmaTiling {
    fn name(&self) -> &'static str {
        "mma.sync"
    }

    fn threads(&self, _s: &State) -> u32 {
        MmaTiling::threads(self)
    }

    /// The GEMM's K tiles.
    fn stages(&self, c: &Contraction, _s: &State) -> u64 {
        self.tiled(c)
            .map_or(1, |(v, span)| self.ktiles(&v, c.dtype, span.as_ref()))
    }

    fn spatial_blocks(&self, c: &Contraction, _s: &State) -> u64 {
        self.tiled(c).map_or(1, |(v, span)| {
            self.tiles(&MmaTiling::tiled_view(&v, span.as_ref()))
        })
    }

    fn blocks(&self, c: &Contraction, s: &State) -> u64 {
        self.tiled(c).map_or(1, |(v, span)| {
            self.grid_blocks(&MmaTiling::tiled_view(&v, span.as_ref()), s.split_k)
        })
    }

    /// Not in a persistent grid (each block holds one tile's weights) or stream-K's
    /// (which deals the reduction itself); the tile's last block runs the epilogue on
    /// the whole sum.
    fn may_split(&self, _c: &Contraction, _s: &State) -> bool {
        self.persistent == 0 && self.stream_k == 0
    }

    fn validate(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Result<(), InvalidState> {
        only_sketch_fields(s, State::tensor_core(*self, 1))?;
        validate_mma(c, self, s.split_k, gpu)
    }

    /// 1, then block_m, block_n, warps_m, warps_n, k_steps, stages, both copy widths,
    /// swizzle, split, atomic split sums, row spans, persistent and stream-K blocks.
    fn tile_vector(&self, s: &State) -> Vec<u32> {
        let t = self;
        vec![
            1,
            t.block_m,
            t.block_n,
            t.warps_m,
            t.warps_n,
            t.k_steps,
            t.stages,
            t.vector[0],
            t.vector[1],
            u32::from(t.swizzle),
            s.split_k,
            u32::from(!s.split_sums.is_ordered()),
            u32::from(t.row_span),
            t.persistent,
            t.stream_k,
        ]
    }

    fn neighbours(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
        steps::steps(c, s, gpu)
    }

    /// Stream-K, persistent blocks and row spans that the new grid or convolution does
    /// not allow are dropped.
    fn repair(&self, s: &State, why: &InvalidState, _c: &Contraction) -> Option<State> {
        use InvalidState as E;
        let mut t = *self;
        match why {
            E::MmaStreamK { .. } if t.stream_k != 0 => t.stream_k = 0,
            E::MmaPersistent { .. } if t.persistent != 0 => t.persistent = 0,
            E::RowSpan(_) | E::RowSpanColumns { .. } | E::RowSpanVectors { .. } if t.row_span => {
                t.row_span = false;
                t.persistent = 0;
            }
            _ => return None,
        }
        Some(State {
            tiling: SketchTiling::MmaSync(t),
            ..s.clone()
        })
    }

    fn lower(&self, task: &Task, s: &State) -> Kernel {
        lower::lower(task, self, (s.split_k, s.split_sums))
    }
}
