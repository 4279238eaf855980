//! The feature table: every feature's stable name and one-line description, declared
//! once, in vector order.
//!
//! One macro invocation generates the public name and doc arrays and the named row the
//! extractor fills, so a feature cannot get a name without a slot or a slot without a
//! name, and the extractor assigns features by name rather than by index. The names are
//! column headers of feature dumps and the cost model's inputs: renaming or reordering
//! them invalidates saved models, which is why a snapshot test shows every change.
//!
//! "input" is the contraction's first operand (conv2d data, matmul A), "weight" the
//! second (conv2d weight, matmul B). Totals are over the whole grid; "per block" values
//! cover the whole kernel for one thread block (under split-K, one block's chunk of the
//! reduction stages); "log2" values are `log2(1 + x)`.
//!
//! Both sketches share one vector of one fixed length, so that one model scores both
//! and sees `sketch` to tell them apart. A feature whose meaning holds for both
//! (the task's, the grid and waves, occupancy and registers, global sectors of the fill
//! and the epilogue, shared wavefronts and bank conflicts, intensities) is filled for
//! both; the features listed in `CUDA_CORE_ONLY` describe structure the tensor-core
//! sketch does not have (virtual threads, register and reduction factors, unrolling,
//! float vector widths, layouts, prefetch, FP32-lane cycles) and are 0 for its states;
//! every `mma_` feature describes the tensor-core sketch's structure and is 0 for
//! CUDA-core states. For tensor-core states the "fetch" is the `cp.async` fill of a K
//! tile, a "stage" one K tile, and the inner product's shared loads are `ldmatrix`.

/// Declares the features: `name: "doc",` in vector order.
macro_rules! feature_table {
    ($($name:ident: $doc:literal,)*) => {
        /// One value per feature, by name, in f64 until it is written out.
        #[derive(Debug, Clone, Default)]
        pub(crate) struct FeatureRow {
            $(pub $name: f64,)*
        }

        /// Number of features in a vector.
        pub const FEATURE_COUNT: usize = [$(stringify!($name)),*].len();

        /// Stable snake_case names, in vector order.
        pub const FEATURE_NAMES: [&str; FEATURE_COUNT] = [$(stringify!($name)),*];

        /// One-line description per feature (what it measures, unit), in vector order.
        pub const FEATURE_DOCS: [&str; FEATURE_COUNT] = [$($doc),*];

        impl FeatureRow {
            /// The row as a vector, every value a finite f32.
            pub(crate) fn to_array(&self) -> [f32; FEATURE_COUNT] {
                [$(finite_f32(self.$name)),*]
            }
        }
    };
}

/// NaN becomes 0 and anything beyond f32's range its largest finite value, so that a
/// pathological state can never hand the cost model a non-finite number.
fn finite_f32(value: f64) -> f32 {
    if value.is_nan() {
        0.0
    } else {
        value.clamp(f64::from(f32::MIN), f64::from(f32::MAX)) as f32
    }
}

feature_table! {
    // The task (constant per task; lets one model serve several tasks).
    task_flops: "floating-point operations of the task, 2 per multiply-add (count)",
    task_flops_log2: "log2(1 + task_flops)",
    task_output_elements: "output elements of the task (count)",
    task_reduction_elements: "product of the reduction extents: multiply-adds per output (count)",
    task_bias: "1 when the epilogue adds a bias, else 0",
    task_relu: "1 when the epilogue applies ReLU, else 0",
    valid: "1 when the state passes schedule validation for this GPU, else 0",

    // Structure of the schedule.
    thread_blocks: "thread blocks in the grid: output tiles x split_k (count)",
    split_k: "blocks sharing one output tile's reduction (split-K; 1 = none): added into the output with atomics, or in the tensor-core sketches stored to the workspace and summed by the last arrival (count)",
    split_atomic: "1 when a tensor-core split adds its partial sums atomically into one tile of sums in the workspace, which the last arrival reads once, else 0 (each chunk stores its own and the last arrival reads every chunk's)",
    prefetch: "1 when the next stage's global loads are prefetched into registers during this stage's inner product, else 0",
    prefetch_floats: "floats per thread held in registers by the prefetch through the inner product (0 without prefetch)",
    threads_per_block: "threads per block: product of the thread factors (count)",
    warps_per_block: "warps per block: ceil(threads / 32) (count)",
    vthreads: "product of the virtual-thread factors (count)",
    block_tile_elements: "output elements one block computes: product of the block tiles; tensor-core: block_m x block_n (count)",
    register_outer_product: "product of the outer register factors (count)",
    register_inner_product: "product of the inner register factors (count)",
    fast_axis_threads: "thread factor of the innermost (fastest-varying) output axis (count)",
    fast_axis_register_tile: "register tile (vthread x outer x inner) of the innermost output axis (elements)",
    reduction_middle_product: "product of the middle reduction factors (count)",
    reduction_inner_product: "product of the inner reduction factors (count)",
    reduction_stages: "outer reduction iterations: shared-memory stages per block, ceil(stages / split_k) under split-K; tensor-core: K tiles per block (count)",
    reduction_steps_per_stage: "reduction steps (outer products) per stage: middle x inner (count)",
    reduction_steps: "reduction steps per thread over the kernel: stages x steps per stage (count)",
    unroll_max_step: "the state's auto-unroll limit (multiply-adds)",
    inner_reduction_unrolled: "1 when the inner reduction loops are unrolled, else 0",
    middle_reduction_unrolled: "1 when the middle reduction loops are unrolled too, else 0",
    unrolled_steps: "reduction steps laid out straight-line by unrolling (count)",
    input_vector_width: "floats per global load of the input fetch",
    weight_vector_width: "floats per global load of the weight fetch",
    input_tile_elements: "floats of the input's shared-memory tile per stage, row padding excluded (count)",
    weight_tile_elements: "floats of the weight's shared-memory tile per stage, row padding excluded (count)",
    input_transposed: "1 when the input's shared tile stores another dimension than the tensor's last contiguously (e.g. matmul A with m innermost), else 0",
    weight_transposed: "1 when the weight's shared tile stores another dimension than the tensor's last contiguously (e.g. conv2d weight with k innermost), else 0",
    input_row_pad: "floats of padding after each row of the input's shared tile (0, 1, 2 or 4)",
    weight_row_pad: "floats of padding after each row of the weight's shared tile (0, 1, 2 or 4)",
    input_fetch_rounds: "fetch loop iterations per thread per stage for the input; tensor-core: copies per thread per K tile (count)",
    weight_fetch_rounds: "fetch loop iterations per thread per stage for the weight; tensor-core: copies per thread per K tile (count)",
    input_fetch_unrolled: "1 when the input's fetch loop is unrolled, else 0",
    weight_fetch_unrolled: "1 when the weight's fetch loop is unrolled, else 0",
    shared_bytes_per_block: "dynamic shared memory per block (bytes)",
    barriers_per_block: "__syncthreads per block: two per stage (count)",
    work_efficiency: "useful multiply-adds / multiply-adds executed including tile padding (ratio)",

    // Global memory: 32-byte sectors per warp instruction, summed.
    input_sectors_per_fetch: "32-byte sectors one warp's input fetch load touches, mean over warp loads (count)",
    input_fetch_coalescing: "ideal / actual sectors of the input fetch loads (1 = fully coalesced)",
    input_sectors_per_block: "32-byte sectors the input fetch loads per block over the kernel (count)",
    input_sectors: "32-byte sectors the input fetch loads over the grid (count)",
    weight_sectors_per_fetch: "32-byte sectors one warp's weight fetch load touches, mean over warp loads (count)",
    weight_fetch_coalescing: "ideal / actual sectors of the weight fetch loads (1 = fully coalesced)",
    weight_sectors_per_block: "32-byte sectors the weight fetch loads per block over the kernel (count)",
    weight_sectors: "32-byte sectors the weight fetch loads over the grid (count)",
    output_sectors_per_store: "32-byte sectors one warp's output store touches, mean over warp stores (count)",
    output_store_coalescing: "ideal / actual sectors of the output stores (1 = fully coalesced)",
    output_sectors_per_block: "32-byte sectors the output stores write per block (count)",
    output_sectors: "32-byte sectors the output stores (split-K: atomic adds) write over the grid (count)",
    atomic_output_sectors: "32-byte sectors of the split-K blocks' atomic adds over the grid, into the output (CUDA cores: output_sectors) or the workspace's tile sums (tensor cores), else 0 (count)",
    zeroed_output_sectors: "32-byte sectors of the output zeroed (timed memset) before a split-K launch, else 0 (count)",
    bias_sectors: "32-byte sectors the epilogue's bias loads touch over the grid, by chunk 0 only under split-K (count; 0 without bias)",
    global_sectors: "all global-memory sectors: input, weight and bias loads, output stores or atomic adds, and the output's zeroing under split-K (count)",
    global_sectors_log2: "log2(1 + global_sectors)",
    global_bytes: "bytes moved by all global accesses: 32 x global_sectors (bytes)",
    ideal_global_bytes: "compulsory bytes: every touched input, weight and bias element read once, every output written once (bytes)",
    global_traffic_ratio: "global_bytes / ideal_global_bytes (ratio, >= 1 up to sampling)",

    // Shared memory: wavefronts (shared-memory cycles) per warp instruction, summed.
    input_store_bank_conflict: "wavefronts / conflict-free wavefronts of the input's shared stores in the fetch (1 = none)",
    weight_store_bank_conflict: "wavefronts / conflict-free wavefronts of the weight's shared stores in the fetch (1 = none)",
    input_fetch_store_width: "floats per shared store instruction of the input fetch: its vector width, or 1 when a transposed or misaligned tile takes the vector's components one by one",
    weight_fetch_store_width: "floats per shared store instruction of the weight fetch: its vector width, or 1 when a transposed or misaligned tile takes the vector's components one by one",
    input_shared_store_wavefronts: "shared-memory wavefronts of the input's fetch stores over the grid (count)",
    weight_shared_store_wavefronts: "shared-memory wavefronts of the weight's fetch stores over the grid (count)",
    input_shared_loads_per_step: "shared load instructions per thread per reduction step for the input (count)",
    weight_shared_loads_per_step: "shared load instructions per thread per reduction step for the weight (count)",
    input_shared_load_width: "floats per input shared load instruction (1, 2 or 4, mean)",
    weight_shared_load_width: "floats per weight shared load instruction (1, 2 or 4, mean)",
    input_bank_conflict: "bank-conflict degree of the input's shared loads: wavefronts / conflict-free wavefronts (1 = none); tensor-core: of the ldmatrix 8x8 matrices",
    weight_bank_conflict: "bank-conflict degree of the weight's shared loads: wavefronts / conflict-free wavefronts (1 = none); tensor-core: of the ldmatrix 8x8 matrices (or tf32 32-bit loads)",
    input_shared_load_wavefronts: "shared-memory wavefronts of the input's loads in the inner product over the grid (count)",
    weight_shared_load_wavefronts: "shared-memory wavefronts of the weight's loads in the inner product over the grid (count)",
    shared_wavefronts_per_block: "shared-memory wavefronts of all shared loads and stores per block (count)",
    shared_wavefronts: "shared-memory wavefronts of all shared loads and stores over the grid (count)",
    shared_wavefronts_log2: "log2(1 + shared_wavefronts)",
    shared_transfer_bytes: "shared-memory bandwidth used: 128 bytes per wavefront (bytes)",
    fma_per_shared_load: "multiply-adds per shared load instruction in the inner product (ratio)",

    // Registers.
    registers_estimate: "estimated registers per thread (schedule's register_estimate)",
    register_cap: "registers per thread ptxas may use under __launch_bounds__(threads)",
    registers_over_cap: "1 when the estimate exceeds the cap (the kernel would spill), else 0",
    registers_allocated: "registers per thread assumed for occupancy: min(estimate, cap)",

    // Occupancy and waves.
    blocks_per_sm_by_threads: "resident blocks per SM allowed by the SM's threads (count)",
    blocks_per_sm_by_shared: "resident blocks per SM allowed by shared memory incl. 1 KB reserved per block (count)",
    blocks_per_sm_by_registers: "resident blocks per SM allowed by registers (256 per warp allocation unit) (count)",
    blocks_per_sm: "resident blocks per SM: min of the limits and the SM's block cap (count)",
    limited_by_threads: "1 when the thread limit is the binding one (ties count), else 0",
    limited_by_shared: "1 when the shared-memory limit is the binding one (ties count), else 0",
    limited_by_registers: "1 when the register limit is the binding one (ties count), else 0",
    limited_by_block_cap: "1 when the SM's blocks-per-SM cap is the binding one (ties count), else 0",
    active_warps_per_sm: "resident warps per SM at full occupancy: blocks_per_sm x warps_per_block (count, max 64)",
    occupancy: "active_warps_per_sm / the SM's maximum warps (fraction)",
    waves: "thread_blocks / (blocks_per_sm x SMs): waves of blocks over the GPU (count)",
    wave_efficiency: "thread_blocks / (ceil(waves) x blocks_per_sm x SMs): busy fraction of the block slots (fraction)",
    busiest_sm_blocks: "blocks the busiest SM runs: ceil(thread_blocks / SMs) (count)",
    sm_utilization: "fraction of the SMs that get at least one block (fraction)",

    // Parallelism.
    ilp: "accumulators per thread: independent multiply-adds per reduction step; tensor-core: 4 per MMA tile of the warp (count)",
    wlp: "warps resident per SM, limited by the grid when it is small (count)",
    warps_per_scheduler: "wlp / 4 warp schedulers per SM (count)",
    concurrency: "ilp x warps_per_scheduler: independent multiply-adds in flight per scheduler (count)",

    // Intensity and per-SM cost estimates.
    oi_global: "task_flops / global_bytes (FLOP per byte)",
    oi_shared: "task_flops / shared_transfer_bytes (FLOP per byte)",
    fma_cycles_per_sm: "busiest SM's multiply-adds (incl. padding) / 128 FP32 lanes (cycles)",
    shared_cycles_per_sm: "busiest SM's shared-memory wavefronts, one per cycle (cycles)",
    global_sectors_per_sm: "busiest SM's global sectors (count)",
    fma_to_shared_cycles: "fma_cycles_per_sm / shared_cycles_per_sm (ratio; > 1: FMA-bound)",

    // Both sketches: which one, and the task's element sizes.
    sketch: "0 for a CUDA-core state, 1 for a tensor-core (mma.sync) state, 2 for a warpgroup-MMA (wgmma) state",
    task_element_bytes: "bytes per input (and bias) element: 4 for f32 and tf32, 2 for fp16 and bf16",
    task_output_element_bytes: "bytes per output element: 4 for f32, 2 for fp16 and bf16",

    // Tensor-core sketch only (0 for CUDA-core states): the raw tiling.
    mma_block_m: "GEMM rows (M) per block (count)",
    mma_block_n: "GEMM columns (N) per block (count)",
    mma_warps_m: "warps along M per block (count)",
    mma_warps_n: "warps along N per block (count)",
    mma_warp_m: "rows of one warp's tile: block_m / warps_m (count)",
    mma_warp_n: "columns of one warp's tile: block_n / warps_n (count)",
    mma_tiles_m: "16-row MMA tiles per warp along M (count)",
    mma_tiles_n: "8-column MMA tiles per warp along N (count)",
    mma_k_steps: "MMA k-steps (32 bytes of a shared row each) per K tile (count)",
    mma_block_k: "reduction elements per K tile: k_steps x 16 (fp16, bf16) or x 8 (tf32) (count)",
    mma_input_vector: "elements per copy of the input's fill (cp.async of 16, 8 or 4 bytes, or a 2-byte load and store)",
    mma_weight_vector: "elements per copy of the weight's fill (cp.async of 16, 8 or 4 bytes, or a 2-byte load and store)",
    mma_input_copy_bytes: "bytes per copy of the input's fill: 16, 8, 4 (cp.async) or 2 (plain load and store)",
    mma_weight_copy_bytes: "bytes per copy of the weight's fill: 16, 8, 4 (cp.async) or 2 (plain load and store)",
    mma_swizzle: "1 when shared rows are XOR-swizzled in 16-byte chunks, else 0",
    mma_weight_n_major: "1 when the weight is stored N-major (matmul's row-major B: ldmatrix.trans, or 32-bit loads for tf32), else 0",
    mma_row_span: "1 when the input is staged as raw input-row runs (one filter row per K tile, 32-bit fragment loads) and the weights held for the whole reduction, else 0",
    mma_persistent: "persistent blocks working through the tiles in turn, each holding its weights once (0: one block per tile) (count)",
    mma_stream_k: "stream-K blocks sharing every tile's K tiles in even contiguous runs (0: none) (count)",

    // Tensor-core sketch only: the cp.async pipeline.
    mma_stages: "K tiles in flight in shared memory (cp.async pipeline depth) (count)",
    mma_ktiles: "K tiles of the whole reduction: ceil(K / block_k) (count)",
    mma_prologue_tiles: "K tiles copied before the first MMA: min(stages - 1, K tiles per block) (count)",
    mma_pipeline_fill: "mma_prologue_tiles / K tiles per block: share of the block's K tiles copied before its first MMA (ratio; near 1 the pipeline never reaches its steady state, 0 without one)",
    mma_stage_bytes: "shared memory of one stage: both inputs' K tiles (bytes)",

    // Tensor-core sketch only: instruction counts.
    mma_per_block: "mma.sync instructions per block: MMA tiles per block x k-steps x K tiles per block (count)",
    mma_instructions: "mma.sync instructions over the grid: MMA tiles per block x k-steps x K tiles x output tiles (count)",
    mma_per_sm_wave: "mma.sync instructions of the blocks one SM holds at once: blocks_per_sm x mma_per_block (count)",
    mma_per_sm: "mma.sync instructions of the busiest SM: busiest_sm_blocks x mma_per_block (count)",
    mma_input_ldmatrix_per_block: "ldmatrix.x4 instructions reading the input's fragments per block (count)",
    mma_weight_ldmatrix_per_block: "instructions reading the weight's fragments per block: ldmatrix (x4 per two N tiles), or two 32-bit shared loads per N tile for tf32 with an N-major weight (count)",
    mma_ldmatrix_bytes_per_block: "fragment bytes both inputs' ldmatrix (or 32-bit) loads read from shared memory per block (bytes)",
    mma_per_ldmatrix: "mma.sync instructions per fragment load instruction (ratio: register reuse of the fragments)",
    mma_cp_async_bytes_per_block: "bytes the block's fill copies from global to shared memory over its K tiles, zero-filled padding and tails included (bytes)",
    mma_cp_async_bytes: "bytes the fill copies from global to shared memory over the grid, zero-filled padding and tails included (bytes)",

    // Warpgroup-MMA sketch only (0 for the other sketches).
    wgmma_block_m: "GEMM rows (M) per block: 64 x m_atoms x consumers (count)",
    wgmma_block_n: "GEMM columns (N) per block: the instructions' N (count)",
    wgmma_consumers: "consumer warpgroups per block (count)",
    wgmma_m_atoms: "64-row warpgroup MMAs per consumer along M (count)",
    wgmma_k_row_bytes: "bytes of K per shared row and stage: the swizzle's span, 32, 64 or 128 (bytes)",
    wgmma_stages: "shared buffers in the mbarrier ring (count)",
    wgmma_in_flight: "groups of MMAs left in flight while the next tile's are issued (count)",
    wgmma_persistent: "persistent blocks, each working through every n-th unit of work (0: one block per unit) (count)",
    wgmma_producer_warp: "1 when a producer warp of its own issues the copies (warp specialization), else 0",
    wgmma_raster: "M tiles per raster band: consecutive tiles walk down a band of this many M tiles before the next N column (0: row by row, N fastest) (count)",
    wgmma_cluster: "blocks per thread-block cluster sharing an operand tile by TMA multicast (0: no clusters) (count)",
    wgmma_cluster_m: "a cluster's blocks along M, sharing B's tile; the others along N share A's (1 without clusters) (count)",
    wgmma_tma_store: "1 when the epilogue stages its results in shared memory and writes them by TMA stores, else 0 (each thread stores its own)",
    wgmma_stream_k: "stream-K blocks sharing every tile's K tiles in even contiguous runs (0: none) (count)",
    wgmma_tiles_per_block: "units of work (an output tile's chunk of K tiles) the busiest block computes (count)",
    wgmma_weight_n_major: "1 when the weight is N-major in shared memory (transposed descriptor), else 0",
    wgmma_im2col: "1 when TMA reads the activations in im2col mode (a convolution's window, walked by output pixel, a K tile per filter tap), else 0",
    wgmma_ktiles: "K tiles of the whole reduction (count)",
    wgmma_per_block: "wgmma instructions per block: k-steps x m_atoms x consumers per K tile, over the K tiles (count)",
    wgmma_tma_boxes_per_block: "TMA copies the producer issues per block (count)",
    wgmma_tma_bytes: "bytes TMA copies into shared memory over the grid, zero-filled tails included (bytes)",
    wgmma_stage_bytes: "shared memory of one stage: both inputs' K tiles (bytes)",
    wgmma_flops_per_sm: "busiest SM's tensor-core work: busiest_sm_blocks x 2 x block_m x block_n x K tiles x block_k (FLOP)",
}

/// Features that only the CUDA-core sketch has: always 0 for tensor-core states.
pub const CUDA_CORE_ONLY: [&str; 35] = [
    "prefetch",
    "prefetch_floats",
    "vthreads",
    "register_outer_product",
    "register_inner_product",
    "fast_axis_threads",
    "fast_axis_register_tile",
    "reduction_middle_product",
    "reduction_inner_product",
    "reduction_steps_per_stage",
    "reduction_steps",
    "unroll_max_step",
    "inner_reduction_unrolled",
    "middle_reduction_unrolled",
    "unrolled_steps",
    "input_vector_width",
    "weight_vector_width",
    "input_tile_elements",
    "weight_tile_elements",
    "input_transposed",
    "weight_transposed",
    "input_row_pad",
    "weight_row_pad",
    "input_fetch_unrolled",
    "weight_fetch_unrolled",
    "barriers_per_block",
    "input_fetch_store_width",
    "weight_fetch_store_width",
    "input_shared_loads_per_step",
    "weight_shared_loads_per_step",
    "input_shared_load_width",
    "weight_shared_load_width",
    "fma_per_shared_load",
    "fma_cycles_per_sm",
    "fma_to_shared_cycles",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_become_finite() {
        assert_eq!(finite_f32(f64::NAN), 0.0);
        assert_eq!(finite_f32(f64::INFINITY), f32::MAX);
        assert_eq!(finite_f32(-1e300), f32::MIN);
        assert_eq!(finite_f32(2.5), 2.5);
    }
}
