//! The `wgmma` sketch's draws (see `crate::sample` for its streams).

use crate::sample::{Sampler, draw_split};
use crate::sketch::wgmma::geometry::CLUSTER_SHAPES;
use crate::sketch::wgmma::tiling::{MAX_WGMMA_STAGES, RASTER_GROUPS, WgmmaTiling};
use crate::state::{SketchTiling, State};
use crate::validate::validate;
use rand_chacha::rand_core::Rng;

impl Sampler {
    /// A `wgmma` draw, when the draw is this sketch's: half the draws of a task it
    /// applies to, decided on its own stream, so that the other draws of a seed are
    /// those drawn before the sketch existed.
    pub(crate) fn draw_wgmma(&mut self) -> Option<State> {
        if self.tma.is_some() && self.wgmma_rng.next_u64().is_multiple_of(2) {
            Some(self.wgmma_state())
        } else {
            None
        }
    }

    /// One `wgmma` draw, valid or not: one or two consumer warpgroups of one or two
    /// 64-row MMAs, N a multiple of 16 up to the GEMM's N (rounded up) and 256, K rows
    /// of 32, 64 or 128 bytes, 1 to 8 stages, 0 or 1 MMA groups in flight and with or
    /// without a producer warp, uniform; a reduction split as the other sketches draw
    /// it (ReLU included); then, half the time, one persistent block per SM where
    /// there are more units of work; then, half the time, a raster band (uniform among
    /// those that divide the M tiles); then, half the time, clusters (uniform among the
    /// valid `CLUSTER_SHAPES`); then, half the time, TMA stores where they are valid.
    /// Last, on its own stream (so that the draws before it are those of earlier
    /// builds), a quarter of the time where the tiles are fewer than twice the SMs:
    /// stream-K over one block per SM instead of the split, persistent grid, clusters
    /// and TMA stores, where it is valid.
    fn wgmma_state(&mut self) -> State {
        let view = &self.tma.as_ref().expect("only drawn with a TMA view").view;
        let rng = &mut self.wgmma_rng;
        let mut pick = |options: &[u32]| options[(rng.next_u64() % options.len() as u64) as usize];
        let n_cap = (view.n.div_ceil(16) * 16).min(256) as u32;
        let ns: Vec<u32> = (1..=16).map(|i| 16 * i).filter(|&n| n <= n_cap).collect();
        let mut tiling = WgmmaTiling {
            consumers: pick(&[1, 2]),
            m_atoms: pick(&[1, 2]),
            block_n: pick(&ns),
            k_bytes: pick(&[32, 64, 128]),
            stages: pick(&(1..=MAX_WGMMA_STAGES).collect::<Vec<_>>()),
            in_flight: pick(&[0, 1]),
            persistent: 0,
            producer_warp: pick(&[0, 1]),
            raster: 0,
            cluster: 0,
            cluster_m: 0,
            tma_store: 0,
            stream_k: 0,
        };
        // Persistent blocks, one per SM, half the time a grid has more units than SMs;
        // the split is drawn for the plain grid.
        let persistent = pick(&[0, 1]) == 1;
        let mut state = State::hopper(tiling);
        let split_k = draw_split(rng, &self.contraction, &self.gpu, &state);
        if persistent && tiling.grid(view, split_k).0 > u64::from(self.gpu.sm_count) {
            tiling.persistent = self.gpu.sm_count;
        }
        // Half the time, a raster band among those that divide the M tiles.
        let (mtiles, ntiles) = tiling.tile_grid(view);
        let bands: Vec<u32> = RASTER_GROUPS
            .into_iter()
            .filter(|&g| mtiles.is_multiple_of(u64::from(g)) && ntiles > 1)
            .collect();
        if rng.next_u64().is_multiple_of(2) && !bands.is_empty() {
            tiling.raster = bands[(rng.next_u64() % bands.len() as u64) as usize];
        }
        // Half the time each, clusters of two, then TMA stores, where the state allows.
        let valid = |tiling: WgmmaTiling| {
            let state = State {
                split_k,
                ..State::hopper(tiling)
            };
            crate::validate::validate(&self.contraction, &state, &self.gpu).is_ok()
        };
        let clusters: Vec<WgmmaTiling> = CLUSTER_SHAPES
            .iter()
            .map(|&(cm, cn)| tiling.with_cluster_shape(cm, cn))
            .filter(|&t| valid(t))
            .collect();
        if rng.next_u64().is_multiple_of(2) && !clusters.is_empty() {
            tiling = clusters[(rng.next_u64() % clusters.len() as u64) as usize];
        }
        if rng.next_u64().is_multiple_of(2)
            && valid(WgmmaTiling {
                tma_store: 1,
                ..tiling
            })
        {
            tiling.tma_store = 1;
        }
        let small = tiling.tiles(view) < 2 * u64::from(self.gpu.sm_count);
        state.tiling = SketchTiling::Wgmma(tiling);
        state.split_k = split_k;
        state.split_sums = self.split_sums(split_k);
        if self.stream_rng.next_u64().is_multiple_of(4) && small {
            let streamed = State::hopper(tiling.streamed(self.gpu.sm_count));
            if validate(&self.contraction, &streamed, &self.gpu).is_ok() {
                return streamed;
            }
        }
        state
    }
}
