//! The extractor: everything that depends only on the task and the GPU is computed
//! once in `new`; `extract` combines the per-state simulations (fetch, inner-product
//! reads, stores) with occupancy and the structural values into the named row.
//!
//! Split-K changes the counts, not the simulations: the grid (blocks, waves, occupancy
//! of the SMs) is `split_k` times the output tiles, each block runs its chunk of the
//! stages, every block adds its tile into the output with atomics, and the output is
//! zeroed before the launch.
//!
//! Shared layouts change the simulations, not the counts: the fetch's stores and the
//! inner product's reads address the tiles through their layout strides (see `fetch`
//! and `shared_reads`); the layout itself (transposed, row padding, store width) is in
//! the row too, and the padding in the shared bytes that bound occupancy.
//!
//! Tensor-core states (`State::mma`) are described by `mma`, into the same row: the
//! features both sketches share are filled by the same helpers (`common`: registers,
//! occupancy, waves), the CUDA-core-only ones stay 0 (see `table`).

use crate::common::{SECTOR_BYTES, fill_occupancy, fill_registers, flag, log2_1p, ratio};
use crate::fetch::{FetchCost, fetch_cost};
use crate::geometry::Geometry;
use crate::indexing::{Indexing, touched_elements};
use crate::mma::MmaTask;
use crate::shared_reads::{ReadCost, read_cost};
use crate::store::{Output, StoreCost, store_cost};
use crate::table::{FEATURE_COUNT, FeatureRow};
use schedule::sketch::cuda_core::fetch_unrolled;
use schedule::sketch::cuda_core::register_estimate;
use schedule::sketch::wgmma::TmaGemm;
use schedule::task::Contraction;
use schedule::validate::validate;
use schedule::{GpuSpec, SketchTiling, State, Task};

/// Bytes per float and per shared-memory wavefront (per sector: `SECTOR_BYTES`).
const FLOAT_BYTES: f64 = 4.0;
const WAVEFRONT_BYTES: f64 = 128.0;

/// FP32 multiply-add lanes per SM (sm_86 and later, Hopper included; 64 on sm_80).
fn fma_lanes_per_sm(gpu: &GpuSpec) -> f64 {
    if gpu.compute_capability == (8, 0) || gpu.compute_capability.0 < 8 {
        64.0
    } else {
        128.0
    }
}

/// Computes the analytical features of states of one task on one GPU.
#[derive(Debug, Clone)]
pub struct FeatureExtractor {
    pub(crate) contraction: Contraction,
    pub(crate) gpu: GpuSpec,
    pub(crate) inputs: [Indexing; 2],
    output: Output,
    /// The task as the tensor-core features see it (None: no GEMM view).
    pub(crate) mma: Option<MmaTask>,
    /// The task's operands as TMA copies them (None: the `wgmma` sketch cannot).
    pub(crate) tma: Option<TmaGemm>,
    /// The row's task-level features, shared by every state.
    pub(crate) task_row: FeatureRow,
}

impl FeatureExtractor {
    pub fn new(task: &Task, gpu: &GpuSpec) -> Self {
        let c = task.contraction();
        let flops = task.flops() as f64;
        let touched_inputs: f64 = c.inputs.iter().map(|a| touched_elements(a, &c)).sum();
        let bias_elements = c.bias.as_ref().map_or(0.0, |b| b.elements() as f64);
        let output_elements = c.output_elements() as f64;
        let task_row = FeatureRow {
            task_flops: flops,
            task_flops_log2: log2_1p(flops),
            task_output_elements: output_elements,
            task_reduction_elements: c.reduction.iter().map(|a| f64::from(a.extent)).product(),
            task_bias: flag(task.epilogue.bias),
            task_relu: flag(task.epilogue.relu),
            task_element_bytes: f64::from(c.dtype.bytes()),
            task_output_element_bytes: f64::from(c.out_dtype.bytes()),
            // The CUDA-core sketch moves floats (the tensor-core features use the
            // task's element sizes instead).
            ideal_global_bytes: (touched_inputs + bias_elements + output_elements) * FLOAT_BYTES,
            ..FeatureRow::default()
        };
        FeatureExtractor {
            mma: MmaTask::new(&c, touched_inputs, bias_elements),
            tma: TmaGemm::of(&c).ok(),
            inputs: [Indexing::new(&c.inputs[0]), Indexing::new(&c.inputs[1])],
            output: Output::new(&c),
            contraction: c,
            gpu: gpu.clone(),
            task_row,
        }
    }

    /// Features of one state of either sketch; every value finite, also for states
    /// that fail validation. A state too malformed to describe (wrong number of
    /// splits, a zero factor, absurd products) gets the task's features (and its
    /// sketch) and zeros.
    pub fn extract(&self, state: &State) -> [f32; FEATURE_COUNT] {
        let mut row = self.task_row.clone();
        match &state.tiling {
            SketchTiling::CudaCore => {
                if let Some(geo) = Geometry::new(&self.contraction, state) {
                    self.fill(&mut row, &geo);
                }
            }
            SketchTiling::MmaSync(tiling) => crate::mma::fill(
                &mut row,
                &self.contraction,
                &self.gpu,
                self.mma.as_ref(),
                state,
                tiling,
            ),
            SketchTiling::Wgmma(tiling) => {
                row.ideal_global_bytes = self.mma.as_ref().map_or(0.0, |m| m.ideal_global_bytes());
                let tma = self.tma.as_ref();
                crate::wgmma::fill(&mut row, &self.contraction, &self.gpu, (state, tiling), tma)
            }
        }
        row.to_array()
    }

    fn fill(&self, row: &mut FeatureRow, geo: &Geometry) {
        let c = &self.contraction;
        let gpu = &self.gpu;
        let state = geo.state;
        let banks = gpu.shared_banks;
        row.valid = flag(validate(c, state, gpu).is_ok());

        let threads = geo.threads as f64;
        let warps = geo.warps as f64;
        // Per-block values follow one block (under split-K, over its chunk of the
        // stages: the longest one); totals count what the whole grid executes, each
        // (tile, stage) once however the stages are split.
        let blocks = geo.grid_blocks as f64;
        let stages = geo.block_stages as f64;
        let tile_stages = (geo.tiles * geo.stages) as f64;
        let split_k = geo.split_k as f64;
        let steps_per_stage = geo.steps_per_stage as f64;
        let accumulators = f64::from(state.accumulators());
        let block_tile: f64 = geo.tiling.block_tile.iter().map(|&t| t as f64).product();

        // Structure.
        row.thread_blocks = blocks;
        row.split_k = split_k;
        row.prefetch = flag(state.prefetch);
        if state.prefetch {
            row.prefetch_floats = geo.tiling.prefetch_floats(state) as f64;
        }
        row.threads_per_block = threads;
        row.warps_per_block = warps;
        row.vthreads = f64::from(state.vthreads());
        row.block_tile_elements = block_tile;
        row.register_outer_product = state.spatial.iter().map(|s| f64::from(s.outer)).product();
        row.register_inner_product = state.spatial.iter().map(|s| f64::from(s.inner)).product();
        if let Some(fast) = state.spatial.last() {
            row.fast_axis_threads = f64::from(fast.thread);
            row.fast_axis_register_tile = f64::from(fast.register_tile());
        }
        row.reduction_middle_product = state
            .reduction
            .iter()
            .map(|r| f64::from(r.middle))
            .product();
        row.reduction_inner_product = state.reduction.iter().map(|r| f64::from(r.inner)).product();
        row.reduction_stages = stages;
        row.reduction_steps_per_stage = steps_per_stage;
        row.reduction_steps = stages * steps_per_stage;
        row.unroll_max_step = f64::from(state.unroll_max_step);
        row.inner_reduction_unrolled = flag(geo.unroll.inner);
        row.middle_reduction_unrolled = flag(geo.unroll.middle);
        row.unrolled_steps = geo.unrolled_steps as f64;
        row.input_vector_width = f64::from(state.vector_width[0]);
        row.weight_vector_width = f64::from(state.vector_width[1]);
        let tile_elements = geo.tiling.tiles.each_ref().map(|t| t.elements() as f64);
        row.input_tile_elements = tile_elements[0];
        row.weight_tile_elements = tile_elements[1];
        let tiles = &geo.tiling.tiles;
        let transposed = tiles
            .each_ref()
            .map(|t| flag(t.innermost + 1 < t.shape.len()));
        row.input_transposed = transposed[0];
        row.weight_transposed = transposed[1];
        row.input_row_pad = tiles[0].pad as f64;
        row.weight_row_pad = tiles[1].pad as f64;
        let store_width = [0, 1].map(|i| {
            let width = i64::from(state.vector_width[i]);
            if tiles[i].vector_store(width) {
                width as f64
            } else {
                1.0
            }
        });
        row.input_fetch_store_width = store_width[0];
        row.weight_fetch_store_width = store_width[1];
        let rounds = [0, 1].map(|i| geo.tiling.fetch_rounds(i, state));
        row.input_fetch_rounds = rounds[0] as f64;
        row.weight_fetch_rounds = rounds[1] as f64;
        let unrolled_fetch =
            [0, 1].map(|i| fetch_unrolled(rounds[i], i64::from(state.vector_width[i]), state));
        row.input_fetch_unrolled = flag(unrolled_fetch[0]);
        row.weight_fetch_unrolled = flag(unrolled_fetch[1]);
        let shared_bytes = geo.tiling.shared_bytes();
        row.shared_bytes_per_block = shared_bytes as f64;
        row.barriers_per_block = 2.0 * stages;
        // Multiply-adds executed per block, tile padding included.
        let fma_per_stage = threads * accumulators * steps_per_stage;
        let fma_per_block = fma_per_stage * stages;
        let executed = fma_per_stage * tile_stages;
        row.work_efficiency = ratio(self.task_row.task_flops / 2.0, executed);

        // Global memory.
        let fetch: [FetchCost; 2] = [0, 1].map(|i| fetch_cost(&self.inputs[i], i, geo, banks));
        let store: StoreCost = store_cost(&self.output, geo);
        let fetch_sectors_per_block = fetch.each_ref().map(|f| f.sectors_per_stage * stages);
        row.input_sectors_per_fetch = fetch[0].sectors_per_instruction;
        row.input_fetch_coalescing = fetch[0].coalescing;
        row.input_sectors_per_block = fetch_sectors_per_block[0];
        row.input_sectors = fetch[0].sectors_per_stage * tile_stages;
        row.weight_sectors_per_fetch = fetch[1].sectors_per_instruction;
        row.weight_fetch_coalescing = fetch[1].coalescing;
        row.weight_sectors_per_block = fetch_sectors_per_block[1];
        row.weight_sectors = fetch[1].sectors_per_stage * tile_stages;
        row.output_sectors_per_store = store.sectors_per_instruction;
        row.output_store_coalescing = store.coalescing;
        row.output_sectors_per_block = store.sectors_per_block;
        // Under split-K every block of a tile adds its partial tile into the output
        // (atomics resolved in L2), the bias is loaded by chunk 0 only, and the output
        // is zeroed (a timed memset) before the launch.
        row.output_sectors = store.sectors_per_block * blocks;
        row.bias_sectors = store.bias_sectors_per_block * geo.tiles as f64;
        let split = geo.split_k > 1;
        row.atomic_output_sectors = if split { row.output_sectors } else { 0.0 };
        row.zeroed_output_sectors = if split {
            (self.task_row.task_output_elements * FLOAT_BYTES / SECTOR_BYTES).ceil()
        } else {
            0.0
        };
        let global_sectors_per_block = fetch_sectors_per_block[0]
            + fetch_sectors_per_block[1]
            + store.sectors_per_block
            + store.bias_sectors_per_block;
        row.global_sectors = row.input_sectors
            + row.weight_sectors
            + row.output_sectors
            + row.bias_sectors
            + row.zeroed_output_sectors;
        row.global_sectors_log2 = log2_1p(row.global_sectors);
        row.global_bytes = row.global_sectors * SECTOR_BYTES;
        row.global_traffic_ratio = ratio(row.global_bytes, row.ideal_global_bytes);

        // Shared memory.
        let reads: [ReadCost; 2] = [0, 1].map(|i| read_cost(&self.inputs[i], i, geo, banks));
        let store_wavefronts_per_block = fetch
            .each_ref()
            .map(|f| f.store_wavefronts_per_stage * stages);
        let load_wavefronts_per_block = reads
            .each_ref()
            .map(|r| r.wavefronts_per_step * warps * stages * steps_per_stage);
        row.input_store_bank_conflict = fetch[0].store_conflict;
        row.weight_store_bank_conflict = fetch[1].store_conflict;
        row.input_shared_store_wavefronts = fetch[0].store_wavefronts_per_stage * tile_stages;
        row.weight_shared_store_wavefronts = fetch[1].store_wavefronts_per_stage * tile_stages;
        row.input_shared_loads_per_step = reads[0].loads_per_step;
        row.weight_shared_loads_per_step = reads[1].loads_per_step;
        row.input_shared_load_width = ratio(reads[0].floats_per_step, reads[0].loads_per_step);
        row.weight_shared_load_width = ratio(reads[1].floats_per_step, reads[1].loads_per_step);
        row.input_bank_conflict = reads[0].conflict;
        row.weight_bank_conflict = reads[1].conflict;
        let load_wavefronts_per_stage = reads
            .each_ref()
            .map(|r| r.wavefronts_per_step * warps * steps_per_stage);
        row.input_shared_load_wavefronts = load_wavefronts_per_stage[0] * tile_stages;
        row.weight_shared_load_wavefronts = load_wavefronts_per_stage[1] * tile_stages;
        let shared_wavefronts_per_block = store_wavefronts_per_block.iter().sum::<f64>()
            + load_wavefronts_per_block.iter().sum::<f64>();
        row.shared_wavefronts_per_block = shared_wavefronts_per_block;
        row.shared_wavefronts = row.input_shared_store_wavefronts
            + row.weight_shared_store_wavefronts
            + row.input_shared_load_wavefronts
            + row.weight_shared_load_wavefronts;
        row.shared_wavefronts_log2 = log2_1p(row.shared_wavefronts);
        row.shared_transfer_bytes = row.shared_wavefronts * WAVEFRONT_BYTES;
        row.fma_per_shared_load = ratio(
            accumulators,
            reads[0].loads_per_step + reads[1].loads_per_step,
        );

        // Registers.
        let estimate = register_estimate(c, state);
        let allocated = fill_registers(gpu, row, estimate, geo.threads as u64);

        // Occupancy, waves and parallelism.
        let (_, busiest_sm_blocks) = fill_occupancy(
            gpu,
            row,
            geo.threads as u64,
            warps,
            shared_bytes,
            allocated,
            geo.grid_blocks as u64,
            accumulators,
        );

        // Intensity and per-SM cost estimates.
        row.oi_global = ratio(self.task_row.task_flops, row.global_bytes);
        row.oi_shared = ratio(self.task_row.task_flops, row.shared_transfer_bytes);
        row.fma_cycles_per_sm = busiest_sm_blocks * fma_per_block / fma_lanes_per_sm(gpu);
        row.shared_cycles_per_sm = busiest_sm_blocks * shared_wavefronts_per_block;
        row.global_sectors_per_sm = busiest_sm_blocks * global_sectors_per_block;
        row.fma_to_shared_cycles = ratio(row.fma_cycles_per_sm, row.shared_cycles_per_sm);
    }
}
