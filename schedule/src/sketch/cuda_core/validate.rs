//! What the CUDA-core sketch refuses: wrong arity, thread counts outside the hardware's
//! range, too many virtual threads, shared memory over the opt-in limit, an estimated
//! register count that would spill, infeasible fetch vector widths, a reduction split
//! (split-K) over the stage count or combined with ReLU (partial sums cannot be
//! rectified). Shared-memory layouts are all allowed (any dimension but the last
//! innermost, any of `SHARED_PADS`); their padding counts towards the shared-memory
//! limit.

use crate::gpu_spec::GpuSpec;
use crate::invalid::InvalidState;
use crate::sketch::cuda_core::geometry::{ReductionUnroll, Tiling, fetch_unrolled};
use crate::state::{MAX_SPLIT_K, SHARED_PADS, State, UNROLL_STEPS, VECTOR_WIDTHS};
use crate::task::{AxisRef, Contraction, DType};
use crate::validate::register_cap;

/// Registers besides accumulators and operands: indices, addresses, loop counters.
/// Calibrated against NVRTC's register counts for sm_90 (see the compile tests).
const ADDRESSING_REGISTERS: u64 = 28;

/// Unrolled reduction steps whose operands the compiler keeps in flight at once: it
/// hoists shared-memory loads of later steps above earlier multiply-adds. Calibrated on
/// NVRTC 13.0 for sm_90 (see the compile tests).
const STEPS_IN_FLIGHT: u64 = 4;

/// Estimated registers per thread: the accumulators, the operand values of the
/// reduction steps in flight (one value per register-tile position along the axes that
/// index each input), and the addressing overhead.
pub fn register_estimate(c: &Contraction, state: &State) -> u64 {
    let operand = |input: usize| -> u64 {
        state
            .spatial
            .iter()
            .enumerate()
            .filter(|(a, _)| {
                c.inputs[input]
                    .index
                    .iter()
                    .any(|i| i.coeff(AxisRef::Spatial(*a)) != 0)
            })
            .map(|(_, s)| u64::from(s.register_tile()))
            .product()
    };
    let in_flight = ReductionUnroll::of(state)
        .unrolled_steps(state)
        .min(STEPS_IN_FLIGHT);
    // The fetch and the compute are separated by a barrier: their operands are not
    // live at the same time, the accumulators are live throughout.
    let compute = in_flight * (operand(0) + operand(1));
    let tiling = Tiling::new(c, state);
    let fetch = tiling.fetch_floats_in_flight(state) as u64;
    let live = if state.prefetch {
        // The next stage's values stay in registers through the inner product.
        compute + tiling.prefetch_floats(state) as u64
    } else {
        compute.max(fetch)
    };
    u64::from(state.accumulators()) + live + ADDRESSING_REGISTERS
}

/// Whether register prefetch can apply: every fetch loop unrolled (registers need
/// compile-time indices) and at least two stages per block.
pub fn prefetch_feasible(c: &Contraction, state: &State) -> bool {
    let tiling = Tiling::new(c, state);
    let unrolled = (0..2).all(|i| {
        fetch_unrolled(
            tiling.fetch_rounds(i, state),
            i64::from(state.vector_width[i]),
            state,
        )
    });
    let stages: i64 = tiling.stages.iter().product();
    let per_block = (stages + i64::from(state.split_k) - 1) / i64::from(state.split_k);
    unrolled && per_block > 1
}

/// Checks that the state has one nonzero split per axis and shared layouts that name a
/// dimension of their input (needed before any geometry can be computed).
pub fn check_structure(c: &Contraction, state: &State) -> Result<(), InvalidState> {
    if state.spatial.len() != c.spatial.len() {
        return Err(InvalidState::Arity {
            kind: "spatial",
            got: state.spatial.len(),
            expected: c.spatial.len(),
        });
    }
    if state.reduction.len() != c.reduction.len() {
        return Err(InvalidState::Arity {
            kind: "reduction",
            got: state.reduction.len(),
            expected: c.reduction.len(),
        });
    }
    let spatial_zero = state
        .spatial
        .iter()
        .any(|s| s.vthread == 0 || s.thread == 0 || s.outer == 0 || s.inner == 0);
    let reduction_zero = state
        .reduction
        .iter()
        .any(|r| r.middle == 0 || r.inner == 0);
    if spatial_zero || reduction_zero || state.split_k == 0 {
        return Err(InvalidState::ZeroFactor);
    }
    for (input, layout) in state.shared_layout.iter().enumerate() {
        let dims = c.inputs[input].index.len().saturating_sub(1);
        if let Some(innermost) = layout.innermost
            && usize::from(innermost) >= dims
        {
            return Err(InvalidState::LayoutDimension {
                input,
                innermost,
                dims,
            });
        }
        if !SHARED_PADS.contains(&layout.pad) {
            return Err(InvalidState::LayoutPad {
                input,
                pad: layout.pad,
            });
        }
    }
    Ok(())
}

/// Validates CUDA-core state `state` for contraction `c` on `gpu`.
pub fn validate(c: &Contraction, state: &State, gpu: &GpuSpec) -> Result<(), InvalidState> {
    // The CUDA-core sketch adds its partial sums into the output; it has no workspace.
    if !state.split_sums.is_ordered() {
        return Err(InvalidState::SplitSums);
    }
    check_structure(c, state)?;
    let threads: u64 = state.spatial.iter().map(|s| u64::from(s.thread)).product();
    let min_threads = u64::from(gpu.warp_size).min(c.output_elements());
    let max_threads = u64::from(gpu.max_threads_per_block);
    if threads < min_threads || threads > max_threads {
        return Err(InvalidState::Threads {
            threads,
            min: min_threads,
            max: max_threads,
        });
    }
    let vthreads: u64 = state.spatial.iter().map(|s| u64::from(s.vthread)).product();
    if vthreads > u64::from(gpu.max_vthread) {
        return Err(InvalidState::VirtualThreads {
            vthreads,
            max: u64::from(gpu.max_vthread),
        });
    }
    let innermost = state
        .spatial
        .iter()
        .map(|s| s.inner)
        .chain(state.reduction.iter().map(|r| r.inner))
        .max()
        .unwrap_or(1);
    if innermost > gpu.max_innermost_factor {
        return Err(InvalidState::InnermostFactor {
            factor: innermost,
            max: gpu.max_innermost_factor,
        });
    }
    if !UNROLL_STEPS.contains(&state.unroll_max_step) {
        return Err(InvalidState::UnrollStep(state.unroll_max_step));
    }
    // Split-K: no more splits than stages (more would only add empty blocks), and an
    // epilogue that distributes over the partial sums.
    let stages = state.stages(c);
    let max_split = stages.min(u64::from(MAX_SPLIT_K));
    if u64::from(state.split_k) > max_split {
        return Err(InvalidState::SplitK {
            split_k: state.split_k,
            stages,
            max: max_split,
        });
    }
    if state.split_k > 1 && c.relu {
        return Err(InvalidState::SplitKRelu {
            split_k: state.split_k,
        });
    }
    // Partial sums are added in the output's type: only f32 has the atomic add.
    if state.split_k > 1 && c.out_dtype != DType::F32 {
        return Err(InvalidState::SplitKOutput {
            split_k: state.split_k,
            out: c.out_dtype,
        });
    }
    let blocks: u64 = state.blocks(c);
    if blocks > i32::MAX as u64 {
        return Err(InvalidState::Grid { blocks });
    }
    let tiling = Tiling::new(c, state);
    for (input, &width) in state.vector_width.iter().enumerate() {
        if !VECTOR_WIDTHS.contains(&width) || !tiling.vector_feasible(c, input, width) {
            return Err(InvalidState::VectorWidth { input, width });
        }
    }
    let bytes = tiling.shared_bytes();
    if bytes > u64::from(gpu.shared_bytes_per_block_optin) {
        return Err(InvalidState::SharedMemory {
            bytes,
            max: u64::from(gpu.shared_bytes_per_block_optin),
        });
    }
    if state.prefetch && !prefetch_feasible(c, state) {
        return Err(InvalidState::Prefetch);
    }
    let registers = register_estimate(c, state);
    if registers > u64::from(gpu.max_registers_per_thread) {
        return Err(InvalidState::Registers {
            registers,
            max: u64::from(gpu.max_registers_per_thread),
        });
    }
    if registers > register_cap(gpu, threads) {
        return Err(InvalidState::RegistersPerBlock {
            registers,
            threads,
            max: register_cap(gpu, threads),
        });
    }
    Ok(())
}
