//! The epilogue's global traffic: output stores and bias loads.
//!
//! Each thread writes its register tile one element per instruction: for register
//! position (v, o, i) of axis `a` its output coordinate is `block * block_tile +
//! ((v * threads + t) * outer + o) * inner + i`, so the lanes of a warp differ only in
//! their thread coordinates `t`, and a register factor above 1 on the fastest axis
//! spreads the lanes apart (uncoalesced stores). Tails are predicated off. The bias (one
//! value per output channel) is read once per distinct bias position of the tile.

use crate::fetch::{Weighted, ratio_or_one};
use crate::geometry::{Coords, Geometry, MAX_AXES, row_major};
use crate::indexing::Indexing;
use crate::sample::{R2, scattered, warp_instructions};
use crate::warp::{WARP_LANES, WarpAccess, sectors};
use schedule::task::{AxisRef, Contraction};

/// Warp store instructions simulated per state.
const SAMPLES: usize = 8;

/// The output of a task: extents and row-major strides over the spatial axes, and the
/// bias access when the epilogue has one.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    extents: Coords,
    strides: Coords,
    bias: Option<Indexing>,
}

impl Output {
    pub(crate) fn new(c: &Contraction) -> Self {
        let mut extents = [1; MAX_AXES];
        let mut strides = [0; MAX_AXES];
        for (a, stride) in c.output_strides().into_iter().enumerate().take(MAX_AXES) {
            extents[a] = i64::from(c.spatial[a].extent);
            strides[a] = stride;
        }
        Output {
            extents,
            strides,
            bias: c.bias.as_ref().map(Indexing::new),
        }
    }
}

/// The epilogue's traffic per block.
#[derive(Debug, Clone, Default)]
pub(crate) struct StoreCost {
    pub sectors_per_block: f64,
    /// Mean sectors of a warp store with at least one lane inside the output.
    pub sectors_per_instruction: f64,
    pub coalescing: f64,
    pub bias_sectors_per_block: f64,
}

/// Simulates the stores (and bias loads) of `geo`'s state.
pub(crate) fn store_cost(output: &Output, geo: &Geometry) -> StoreCost {
    let state = geo.state;
    let axes = geo.spatial_axes();
    let accumulators = i64::from(state.accumulators());
    let mut register_tiles = [1; MAX_AXES];
    for (r, s) in register_tiles.iter_mut().zip(&state.spatial) {
        *r = i64::from(s.register_tile());
    }

    let mut out = WarpAccess::new();
    let mut bias = WarpAccess::new();
    let mut storing = 0.0;
    let (mut store, mut bias_cost) = (Weighted::default(), Weighted::default());
    let sampled = warp_instructions(accumulators, geo.threads, SAMPLES, R2[0]);
    for (k, (j, weight)) in sampled.enumerate() {
        let (position, warp) = (j / geo.warps, j % geo.warps);
        let position = row_major(position, &register_tiles[..axes]);
        let block = geo.block_coords(scattered(k, geo.tiles, R2[1]));
        // Output coordinate of thread coordinate 0 at this register position, and what
        // one step of the thread coordinate adds, per axis.
        let mut origin = [0; MAX_AXES];
        let mut thread_step = [0; MAX_AXES];
        for (a, s) in state.spatial.iter().enumerate() {
            let (t, o, i) = (i64::from(s.thread), i64::from(s.outer), i64::from(s.inner));
            let p = position[a];
            let (v, oo, ii) = (p / (o * i), (p / i) % o, p % i);
            origin[a] = block[a] * i64::from(s.block_tile()) + (v * t * o + oo) * i + ii;
            thread_step[a] = o * i;
        }
        out.clear();
        bias.clear();
        let first = warp * WARP_LANES as i64;
        let mut t = geo.thread_coords(first);
        for tid in first..(first + WARP_LANES as i64).min(geo.threads) {
            if tid > first {
                geo.next_thread(&mut t);
            }
            let mut coord: Coords = [0; MAX_AXES];
            let mut inside = true;
            let mut flat = 0;
            for a in 0..axes {
                coord[a] = origin[a] + t[a] * thread_step[a];
                inside &= coord[a] < output.extents[a];
                flat += coord[a] * output.strides[a];
            }
            if !inside {
                continue;
            }
            out.push(flat);
            if let Some(b) = output.bias.as_ref().and_then(|b| bias_offset(b, &coord)) {
                bias.push(b);
            }
        }
        if out.lanes() > 0 {
            storing += weight;
            store.add(sectors(&out, 1), weight);
            bias_cost.add(sectors(&bias, 1), weight);
        }
    }
    // Bias loads: one per distinct bias position of the thread's register tile.
    let bias_loads_per_thread: i64 = match &output.bias {
        Some(b) => state
            .spatial
            .iter()
            .enumerate()
            .filter(|(a, _)| {
                b.terms
                    .iter()
                    .flatten()
                    .any(|&(axis, _)| axis == AxisRef::Spatial(*a))
            })
            .map(|(_, s)| i64::from(s.register_tile()))
            .product(),
        None => 0,
    };
    StoreCost {
        sectors_per_block: store.actual,
        sectors_per_instruction: if storing == 0.0 {
            0.0
        } else {
            store.actual / storing
        },
        coalescing: ratio_or_one(store.ideal, store.actual),
        // The bias is loaded at fewer register positions than the output is stored.
        bias_sectors_per_block: bias_cost.actual * bias_loads_per_thread as f64
            / accumulators as f64,
    }
}

/// Flat bias offset of an output coordinate (a bias is indexed by output axes only).
fn bias_offset(bias: &Indexing, coord: &Coords) -> Option<i64> {
    let mut index = bias.offsets;
    for (i, terms) in index.iter_mut().zip(&bias.terms) {
        for &(axis, coeff) in terms {
            if let AxisRef::Spatial(a) = axis {
                *i += coeff * coord[a];
            }
        }
    }
    bias.flat(&index)
}
