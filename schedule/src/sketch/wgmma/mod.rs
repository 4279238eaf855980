//! The `wgmma` sketch: Hopper's own tensor-core path, warpgroup MMAs fed by TMA through a
//! ring of mbarrier-guarded stages. Its tiling (`tiling`), its geometry, TMA view and
//! refusals (`geometry`), its draws, its neighbours (`steps`) and its lowering
//! (`lower`).

pub mod draw;
pub mod geometry;
pub mod lower;
pub mod steps;
pub mod tiling;

pub use geometry::*;
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
    /// A state of the `wgmma` sketch.
    pub fn hopper(tiling: WgmmaTiling) -> State {
        State::of(SketchTiling::Wgmma(tiling))
    }

    /// The `wgmma` tiling of a state of that sketch.
    pub fn wgmma(&self) -> Option<WgmmaTiling> {
        match self.tiling {
            SketchTiling::Wgmma(t) => Some(t),
            _ => None,
        }
    }

    /// The `wgmma` tiling of a state of that sketch, to change in place.
    pub fn wgmma_mut(&mut self) -> Option<&mut WgmmaTiling> {
        match &mut self.tiling {
            SketchTiling::Wgmma(t) => Some(t),
            _ => None,
        }
    }
}

impl Sketch for WgmmaTiling {
    fn name(&self) -> &'static str {
        "wgmma"
    }

    fn threads(&self, _s: &State) -> u32 {
        WgmmaTiling::threads(self)
    }

    /// The GEMM's K tiles.
    fn stages(&self, c: &Contraction, _s: &State) -> u64 {
        GemmView::of(c).map_or(1, |v| v.k.div_ceil(self.block_k(&v)))
    }

    fn spatial_blocks(&self, c: &Contraction, _s: &State) -> u64 {
        GemmView::of(c).map_or(1, |v| self.grid(&v, 1).1)
    }

    fn blocks(&self, c: &Contraction, s: &State) -> u64 {
        GemmView::of(c).map_or(1, |v| self.grid(&v, s.split_k).1)
    }

    /// The tile's last block runs the epilogue on the whole sum.
    fn may_split(&self, _c: &Contraction, _s: &State) -> bool {
        true
    }

    fn validate(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Result<(), InvalidState> {
        only_sketch_fields(s, State::hopper(*self))?;
        validate_wgmma(c, self, s.split_k, gpu)
    }

    /// 2, then consumers, m_atoms, block_n, k_bytes, stages, in_flight, persistent,
    /// producer_warp, split, raster, cluster, cluster_m, tma_store, atomic split sums
    /// and stream-K's blocks.
    fn tile_vector(&self, s: &State) -> Vec<u32> {
        let t = self;
        vec![
            2,
            t.consumers,
            t.m_atoms,
            t.block_n,
            t.k_bytes,
            t.stages,
            t.in_flight,
            t.persistent,
            t.producer_warp,
            s.split_k,
            t.raster,
            t.cluster,
            t.cluster_m,
            t.tma_store,
            u32::from(!s.split_sums.is_ordered()),
            t.stream_k,
        ]
    }

    fn neighbours(&self, c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
        steps::steps(c, s, gpu)
    }

    /// The raster band shrinks to the largest that divides the new M tiles (or none);
    /// stream-K, persistent blocks, clusters and TMA stores that do not fit the new grid
    /// are dropped; a block taller than the new M by a whole warpgroup MMA loses its
    /// second MMA row, then its second consumer.
    fn repair(&self, s: &State, why: &InvalidState, c: &Contraction) -> Option<State> {
        use InvalidState as E;
        let t = *self;
        let fitted = match why {
            E::WgmmaStreamK { .. } if t.stream_k != 0 => WgmmaTiling { stream_k: 0, ..t },
            E::WgmmaPersistent { .. } if t.persistent != 0 => WgmmaTiling { persistent: 0, ..t },
            E::WgmmaRaster { .. } if t.raster != 0 => WgmmaTiling {
                raster: fitted_raster(&t, c),
                ..t
            },
            E::WgmmaCluster { .. } if t.cluster != 0 || t.cluster_m != 0 => WgmmaTiling {
                cluster: 0,
                cluster_m: 0,
                ..t
            },
            E::WgmmaStore { .. } if t.tma_store != 0 => WgmmaTiling { tma_store: 0, ..t },
            E::WgmmaIdleRows { .. } if t.m_atoms > 1 => WgmmaTiling { m_atoms: 1, ..t },
            E::WgmmaIdleRows { .. } if t.consumers > 1 => WgmmaTiling { consumers: 1, ..t },
            _ => return None,
        };
        Some(State {
            tiling: SketchTiling::Wgmma(fitted),
            ..s.clone()
        })
    }

    fn lower(&self, task: &Task, s: &State) -> Kernel {
        lower::lower(task, self, (s.split_k, s.split_sums))
    }
}

/// The largest raster band no wider than `t`'s that divides the new shape's M tiles
/// (with more than one N tile, as validation asks), or 0 for none.
fn fitted_raster(t: &WgmmaTiling, c: &Contraction) -> u32 {
    let Ok(view) = GemmView::of(c) else {
        return 0;
    };
    let (mtiles, ntiles) = t.tile_grid(&view);
    RASTER_GROUPS
        .iter()
        .rev()
        .copied()
        .find(|&g| g < t.raster && ntiles > 1 && mtiles.is_multiple_of(u64::from(g)))
        .unwrap_or(0)
}
