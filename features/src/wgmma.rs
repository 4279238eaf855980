//! Features of a warpgroup-MMA (`wgmma`) state: its raw tiling, the TMA copies and
//! instruction counts its lowering issues (from the same geometry, `schedule::wgmma`),
//! and the features every sketch shares (grid, occupancy, registers, global traffic,
//! intensities). Shared-memory wavefronts stay 0: TMA writes and the MMAs read shared
//! memory through the async proxy, not through load and store instructions.

use crate::common::{
    SECTOR_BYTES, fill_occupancy, fill_registers, flag, log2_1p, ratio, split_traffic,
    stream_traffic,
};
use crate::table::FeatureRow;
use schedule::atom::wgmma::K_STEP_BYTES;
use schedule::sketch::wgmma::{OperandView, TmaGemm};
use schedule::state::WgmmaTiling;
use schedule::task::Contraction;
use schedule::validate;
use schedule::{GpuSpec, State};

/// Fills `row` for `state` (whose tiling is `t`); `gemm` is the task's TMA view,
/// computed once per task (None: no state of the sketch is valid for it).
pub(crate) fn fill(
    row: &mut FeatureRow,
    c: &Contraction,
    gpu: &GpuSpec,
    (state, t): (&State, &WgmmaTiling),
    gemm: Option<&TmaGemm>,
) {
    row.sketch = 2.0;
    row.valid = flag(validate(c, state, gpu).is_ok());
    let threads = t.threads();
    row.wgmma_block_m = f64::from(t.block_m());
    row.wgmma_block_n = f64::from(t.block_n);
    row.wgmma_consumers = f64::from(t.consumers);
    row.wgmma_m_atoms = f64::from(t.m_atoms);
    row.wgmma_k_row_bytes = f64::from(t.k_bytes);
    row.wgmma_stages = f64::from(t.stages);
    row.wgmma_in_flight = f64::from(t.in_flight);
    row.threads_per_block = f64::from(threads);
    row.warps_per_block = f64::from(threads.div_ceil(32));
    row.block_tile_elements = row.wgmma_block_m * row.wgmma_block_n;
    let shared_bytes = t.shared_bytes(c.out_dtype.bytes());
    row.shared_bytes_per_block = shared_bytes as f64;
    row.wgmma_stage_bytes = t.ring_bytes() as f64 / f64::from(t.stages.max(1));
    let allocated = fill_registers(gpu, row, t.register_estimate(), u64::from(threads));
    let Some(gemm) = gemm else {
        return;
    };
    let view = &gemm.view;
    row.wgmma_weight_n_major = flag(!view.b_k_major);
    row.wgmma_im2col = flag(matches!(gemm.a, OperandView::Im2col(_)));
    // Units of work: an output tile's chunk of K tiles (the whole reduction unsplit);
    // with stream-K, a block's run of K tiles (the longest, as a unit).
    let split_k = state.split_k.max(1);
    let (units, grid) = t.grid(view, split_k);
    let tiles = t.tiles(view);
    let tiles_f = tiles as f64;
    let (chunk, units_f, units_per_block) = if t.stream_k > 0 {
        let total = t.stream(view).iterations();
        let longest = total.div_ceil(grid.max(1)) as f64;
        (longest, total as f64 / longest, 1.0)
    } else {
        let chunk = t.chunk_ktiles(view, split_k) as f64;
        (chunk, units as f64, units.div_ceil(grid.max(1)) as f64)
    };
    row.thread_blocks = grid as f64;
    row.split_k = f64::from(split_k);
    row.wgmma_persistent = f64::from(t.persistent);
    row.wgmma_producer_warp = f64::from(t.producer_warp);
    row.wgmma_raster = f64::from(t.raster);
    row.wgmma_cluster = f64::from(t.cluster);
    row.wgmma_cluster_m = f64::from(t.cluster_shape().0);
    row.wgmma_tma_store = f64::from(t.tma_store);
    row.wgmma_stream_k = f64::from(t.stream_k);
    row.wgmma_tiles_per_block = units_per_block;
    row.reduction_stages = chunk;
    row.wgmma_ktiles = t.ktiles(view) as f64;
    let k_steps = f64::from(t.k_bytes) / K_STEP_BYTES as f64;
    row.wgmma_per_block = k_steps * f64::from(t.m_atoms * t.consumers) * chunk * units_per_block;
    let boxes = 1.0 + f64::from(t.boxes(1, view));
    row.wgmma_tma_boxes_per_block = boxes * chunk * units_per_block;
    row.wgmma_tma_bytes = row.wgmma_stage_bytes * chunk * units_f;
    let executed = units_f * chunk * row.block_tile_elements * t.block_k(view) as f64;
    row.work_efficiency = ratio(row.task_flops / 2.0, executed);

    // Global traffic: every box's bytes (tails included) and the epilogue's stores, a
    // warp's store of one value per lane covering 8 rows of 4 elements (a sector each),
    // or with TMA stores the tile's bytes;
    // split, each unit also stores its f32 partial sums (or adds them atomically into
    // its tile's) and the fixup reads them back (`split_traffic`).
    let element_bytes = f64::from(c.dtype.bytes());
    // A tile the cluster shares is read from L2 once per cluster.
    let stage_sectors =
        |input: usize| t.tile_bytes(input) as f64 / SECTOR_BYTES / f64::from(t.sharers(input));
    row.input_sectors_per_block = stage_sectors(0) * chunk * units_per_block;
    row.weight_sectors_per_block = stage_sectors(1) * chunk * units_per_block;
    row.input_sectors = stage_sectors(0) * chunk * units_f;
    row.weight_sectors = stage_sectors(1) * chunk * units_f;
    // TMA stores write whole sectors.
    let tile_sectors = if t.tma_store > 0 {
        row.block_tile_elements * f64::from(c.out_dtype.bytes()) / SECTOR_BYTES
    } else {
        row.block_tile_elements / 4.0
    };
    let split = if t.stream_k > 0 {
        stream_traffic(row, &t.stream(view))
    } else {
        split_traffic(row, state, tiles_f)
    };
    row.output_sectors_per_block = (tile_sectors + split.per_unit) * units_per_block;
    row.output_sectors = tile_sectors * tiles_f + split.total;
    row.bias_sectors = if c.bias.is_some() {
        tiles_f * row.wgmma_block_n * element_bytes / SECTOR_BYTES
    } else {
        0.0
    };
    row.global_sectors =
        row.input_sectors + row.weight_sectors + row.output_sectors + row.bias_sectors;
    row.global_sectors_log2 = log2_1p(row.global_sectors);
    row.global_bytes = row.global_sectors * SECTOR_BYTES;
    row.global_traffic_ratio = ratio(row.global_bytes, row.ideal_global_bytes);

    let (_, busiest_sm_blocks) = fill_occupancy(
        gpu,
        row,
        u64::from(threads),
        f64::from(threads.div_ceil(32)),
        shared_bytes,
        allocated,
        grid,
        f64::from(t.accumulators()),
    );
    row.wgmma_flops_per_sm = busiest_sm_blocks
        * units_per_block
        * 2.0
        * row.block_tile_elements
        * chunk
        * t.block_k(view) as f64;
    row.oi_global = ratio(row.task_flops, row.global_bytes);
    row.global_sectors_per_sm = busiest_sm_blocks
        * (row.input_sectors_per_block
            + row.weight_sectors_per_block
            + row.output_sectors_per_block);
}
