//! Helpers the feature tests share: tensor-core states (the schedule crate's sampler
//! draws CUDA-core states only).

// Each test binary that includes this module uses a different subset of it.
#![allow(dead_code)]

use schedule::gemm::GemmView;
use schedule::sketch::mma_sync::MmaTiling;
use schedule::validate::validate;
use schedule::{DType, Epilogue, GpuSpec, Layout, State, Task, parse_shape};

/// A task with element types and layout (NHWC for conv2d, ignored for matmuls).
pub fn typed_task(op: &str, shape: &str, dtype: DType, out: DType, epilogue: Epilogue) -> Task {
    Task::new(parse_shape(op, shape).unwrap(), epilogue)
        .unwrap()
        .with_types(dtype, out, Layout::Nhwc)
        .unwrap()
}

/// The widest copy (16 bytes down to one element) input `input` of `t` can take.
pub fn widest_vector(t: &MmaTiling, input: usize, task: &Task) -> u32 {
    let c = task.contraction();
    let view = GemmView::of(&c).unwrap();
    [8, 4, 2, 1]
        .into_iter()
        .find(|&w| t.vector_feasible(input, w, &view, c.dtype))
        .unwrap_or(1)
}

/// At most `count` (about as many) distinct valid tensor-core states of `task`, spread over a grid of tilings
/// (block tiles, warps, k-steps, stages, swizzle, split-K), each with its widest copies.
pub fn mma_states(task: &Task, gpu: &GpuSpec, count: usize) -> Vec<State> {
    let c = task.contraction();
    let mut all = Vec::new();
    for block_m in [16, 32, 64, 128, 256] {
        for block_n in [8, 16, 32, 64, 128, 256] {
            for (warps_m, warps_n) in [(1, 1), (1, 2), (2, 1), (2, 2), (2, 4), (4, 2)] {
                for k_steps in [1, 2, 4] {
                    for stages in [1, 2, 3, 4] {
                        for swizzle in [false, true] {
                            for split_k in [1, 2, 4] {
                                let mut t = MmaTiling {
                                    block_m,
                                    block_n,
                                    warps_m,
                                    warps_n,
                                    k_steps,
                                    stages,
                                    vector: [1, 1],
                                    swizzle,
                                    row_span: false,
                                    persistent: 0,
                                    stream_k: 0,
                                };
                                t.vector = [0, 1].map(|i| widest_vector(&t, i, task));
                                let s = State::tensor_core(t, split_k);
                                if validate(&c, &s, gpu).is_ok() {
                                    all.push(s);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // Golden-ratio picks: a regular stride would alias with the grid's inner loops
    // (every pick the same swizzle or split).
    let mut picked: Vec<usize> = (0..count.min(all.len()))
        .map(|k| ((0.5 + k as f64 * 0.618_033_988_749_895).fract() * all.len() as f64) as usize)
        .collect();
    picked.sort_unstable();
    picked.dedup();
    picked.into_iter().map(|i| all[i].clone()).collect()
}
