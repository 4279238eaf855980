//! What both sketches' features share: the register and occupancy features of a block's
//! resources (one model of the SM for CUDA-core and tensor-core states), the
//! tensor-core sketches' split-K workspace traffic, and how raw quantities become row
//! values (flags, log scales, ratios that are 0 over 0).

use crate::occupancy::{Occupancy, SCHEDULERS_PER_SM, waves};
use crate::table::FeatureRow;
use schedule::state::SplitSums;
use schedule::stream_k::StreamK;
use schedule::validate::register_cap;
use schedule::{GpuSpec, State};

/// Bytes of a global-memory sector, the unit the traffic features count in.
pub(crate) const SECTOR_BYTES: f64 = 32.0;

/// A tensor-core split's workspace traffic, in 32-byte sectors.
pub(crate) struct SplitTraffic {
    /// Of the unit that also runs the fixup.
    pub per_unit: f64,
    /// Over the grid.
    pub total: f64,
}

/// The workspace traffic of tensor-core state `state` (its block tile's f32 partial
/// sums, none unsplit) over `tiles` output tiles; sets the `split_atomic` flag and, for
/// atomic sums, the atomics' sectors.
pub(crate) fn split_traffic(row: &mut FeatureRow, state: &State, tiles: f64) -> SplitTraffic {
    let split = f64::from(state.split_k.max(1));
    let partial = if state.split_k > 1 {
        row.block_tile_elements * 4.0 / SECTOR_BYTES
    } else {
        0.0
    };
    let atomic = state.split_sums == SplitSums::Atomic;
    row.split_atomic = flag(atomic);
    if atomic {
        // Every chunk adds its tile atomically; the last arrival reads and clears one.
        row.atomic_output_sectors = partial * split * tiles;
        SplitTraffic {
            per_unit: 3.0 * partial,
            total: row.atomic_output_sectors + 2.0 * partial * tiles,
        }
    } else {
        // Every chunk stores its tile; the last arrival reads back every chunk's.
        SplitTraffic {
            per_unit: 2.0 * partial,
            total: 2.0 * partial * split * tiles,
        }
    }
}

/// Stream-K's workspace traffic (`stream`): each partial segment adds its block tile's
/// f32 sums atomically into its tile's, and each cut tile's last block reads and
/// clears them.
pub(crate) fn stream_traffic(row: &mut FeatureRow, stream: &StreamK) -> SplitTraffic {
    let (partial, cut) = stream.segments();
    let sectors = row.block_tile_elements * 4.0 / SECTOR_BYTES;
    row.split_atomic = 1.0;
    row.atomic_output_sectors = sectors * partial as f64;
    SplitTraffic {
        per_unit: 3.0 * sectors * (partial as f64 / stream.blocks.max(1) as f64).ceil(),
        total: row.atomic_output_sectors + 2.0 * sectors * cut as f64,
    }
}

/// The register features from the estimate for blocks of `threads`; returns the
/// registers per thread assumed for occupancy.
pub(crate) fn fill_registers(
    gpu: &GpuSpec,
    row: &mut FeatureRow,
    estimate: u64,
    threads: u64,
) -> u64 {
    let cap = register_cap(gpu, threads);
    let allocated = estimate
        .min(cap)
        .min(u64::from(gpu.max_registers_per_thread));
    row.registers_estimate = estimate as f64;
    row.register_cap = cap as f64;
    row.registers_over_cap = flag(estimate > cap);
    row.registers_allocated = allocated as f64;
    allocated
}

/// The occupancy, wave and parallelism features of a grid of `grid_blocks` blocks
/// of `threads` (`warps` warps), `shared_bytes` and `registers` per thread, with
/// `accumulators` per thread; returns the blocks per SM and the busiest SM's blocks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fill_occupancy(
    gpu: &GpuSpec,
    row: &mut FeatureRow,
    threads: u64,
    warps: f64,
    shared_bytes: u64,
    registers: u64,
    grid_blocks: u64,
    accumulators: f64,
) -> (f64, f64) {
    let occupancy = Occupancy::new(gpu, threads, shared_bytes, registers);
    let bps = occupancy.blocks_per_sm;
    row.blocks_per_sm_by_threads = occupancy.by_threads as f64;
    row.blocks_per_sm_by_shared = occupancy.by_shared as f64;
    row.blocks_per_sm_by_registers = occupancy.by_registers as f64;
    row.blocks_per_sm = bps as f64;
    row.limited_by_threads = flag(occupancy.by_threads == bps);
    row.limited_by_shared = flag(occupancy.by_shared == bps);
    row.limited_by_registers = flag(occupancy.by_registers == bps);
    row.limited_by_block_cap = flag(occupancy.block_cap == bps);
    row.active_warps_per_sm = occupancy.active_warps as f64;
    row.occupancy = occupancy.fraction();
    let sm_count = u64::from(gpu.sm_count.max(1));
    let (wave_count, wave_efficiency) = waves(grid_blocks, bps * sm_count);
    row.waves = wave_count;
    row.wave_efficiency = wave_efficiency;
    let busiest_sm_blocks = grid_blocks.div_ceil(sm_count) as f64;
    row.busiest_sm_blocks = busiest_sm_blocks;
    row.sm_utilization = (grid_blocks as f64 / sm_count as f64).min(1.0);

    // Parallelism: a small grid leaves SMs with fewer blocks than they could hold.
    let resident_blocks = (bps as f64).min(busiest_sm_blocks);
    row.ilp = accumulators;
    row.wlp = resident_blocks * warps;
    row.warps_per_scheduler = row.wlp / SCHEDULERS_PER_SM as f64;
    row.concurrency = row.ilp * row.warps_per_scheduler;
    (bps as f64, busiest_sm_blocks)
}

/// 1 for true, 0 for false.
pub(crate) fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// `log2(1 + x)` of `x` clamped at 0: counts over many magnitudes on one scale.
pub(crate) fn log2_1p(x: f64) -> f64 {
    (1.0 + x.max(0.0)).log2()
}

/// `a / b`, 0 when `b` is 0.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 { 0.0 } else { a / b }
}
