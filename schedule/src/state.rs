//! States: the multi-level tiling sketch with every tile size and annotation filled in.
//!
//! A state belongs to one sketch, its `tiling` ([`SketchTiling`]): the CUDA-core sketch
//! (its tiling is the per-axis fields below), `MmaSync` (`sketch/mma_sync/`) or `Wgmma`
//! (`sketch/wgmma/`), whose states keep the per-axis fields at their defaults. Code that
//! treats the sketches differently asks the state's sketch ([`State::sketch`], the
//! `Sketch` interface of `crate::sketch`); a new sketch is a folder there.
//!
//! Checklist for adding an option to a sketch, in pipeline order:
//!
//! 1. The field, in the sketch's tiling (`sketch/<sketch>/tiling.rs`; the CUDA-core
//!    sketch's are here), with a serde default and `skip_serializing_if` at that
//!    default, so that logged states keep their JSON, hence their ids (extend the
//!    serialization test at the bottom of this file).
//! 2. Validation: the sketch's refusals (a reason in `InvalidState`; the register
//!    estimate too if the option changes what stays live).
//! 3. Sampling: the sketch's `draw.rs`, drawn so that the earlier draws of a seed stay
//!    what they were.
//! 4. Mutation and the DGD lattice: the sketch's `steps.rs` (the neighbours along the
//!    new dimension).
//! 5. Adaptation to another shape: the sketch's `Sketch::repair`, where the option
//!    depends on the shape.
//! 6. Lowering: the sketch's `lower.rs`, or a transform pass over the loop nest in a
//!    file of its own that it applies (as `schedule/src/lower/prefetch.rs` does).
//! 7. Interpreter: `schedule/src/interp/` runs any new IR statement faithfully, and
//!    `schedule/tests/interpreter.rs` runs states with the option against the
//!    reference.
//! 8. Features: the sketch's file in `features/src/` (described in
//!    `features/src/table.rs`).
//! 9. A snapshot test: `schedule/tests/states.rs`.
//!
//! The sketch is Ansor's GPU structure "SSSRRSRS": each spatial axis is split into five
//! levels (block, virtual thread, thread, outer register, inner register) and each
//! reduction axis into three (outer, middle, inner). Both inputs are staged in shared
//! memory at the outer reduction level by all threads of the block; each thread
//! accumulates its register tile (virtual thread × outer × inner register factors per
//! spatial axis) and writes it out through the fused epilogue. A state stores only the
//! inner factors: the outermost level is whatever remains, rounded up, so extents need
//! not be divisible (the tail is predicated).
//!
//! Beyond Ansor, the reduction may also be split across thread blocks ("split-K"):
//! `split_k` blocks share one output tile, each running a contiguous chunk of the
//! shared-memory stage loop and adding its partial sums into the (zeroed) output with
//! atomics. Deep layers with few output pixels and long reductions (ResNet's 512→512
//! 3x3 at 7x7: 25k outputs, 4608-long sums) otherwise launch too few blocks to fill
//! the GPU.
//!
//! Each input's shared-memory tile also has a layout (`SharedLayout`): the tensor's own
//! dimension order (the default), or one dimension moved innermost — for matmul's `A[m][k]`
//! the `m` dimension, as cuBLAS-class kernels store A transposed — and optionally padded
//! rows. In the tensor's order the inner product's lanes that differ in a spatial thread
//! coordinate read addresses `stage tile × register tile` floats apart (often a multiple
//! of 32: every lane in one bank), and one thread's register-tile operands along that
//! axis are not contiguous, so the compiler cannot merge them into 64- or 128-bit loads.
//! With that axis's dimension innermost they are contiguous, and padding the rows moves
//! the fetch's stores (and any remaining strided reads) off a single bank.
//!
//! A state serializes to JSON and replays into the identical kernel. Annotations added
//! after the first logs were written (`split_k`, `shared_layout`) are left out of the
//! JSON at their default, so that older states keep their JSON, hence their ids.

use crate::serde_default::is_false;
pub use crate::sketch::cuda_core::tiling::{
    ReductionSplit, SHARED_PADS, SharedLayout, SpatialSplit, UNROLL_STEPS, VECTOR_WIDTHS,
};
pub use crate::sketch::mma_sync::tiling::{
    MAX_COPY_ROUNDS, MAX_K_STEPS, MAX_STAGES, MAX_WARPS, MmaTiling,
};
pub use crate::sketch::tiling::SketchTiling;
pub use crate::sketch::wgmma::tiling::{MAX_WGMMA_STAGES, RASTER_GROUPS, WgmmaTiling};
use crate::task::Contraction;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Largest reduction split (`State::split_k`) of the search space. Beyond 64 blocks per
/// output tile the atomic traffic (output elements × split) outgrows any layer's gain in
/// parallelism on a GPU of ~132 SMs.
pub const MAX_SPLIT_K: u32 = 64;

fn natural_layouts(layouts: &[SharedLayout; 2]) -> bool {
    layouts.iter().all(SharedLayout::is_natural)
}

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

/// How the blocks of a split tile meet their partial sums in the workspace (the
/// tensor-core sketches; `lower::common`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitSums {
    /// Each chunk stores its own partial sums and the tile's last arrival adds them up
    /// in chunk order: the same bits every launch, but the last arrival reads
    /// `split_k` tiles of sums.
    #[default]
    Ordered,
    /// Each chunk adds its partial sums into one tile of sums in L2 (`red.global.add`)
    /// and the last arrival takes that one tile: cheap however deep the split, but a
    /// sum of non-integer values may differ in its last bits between launches.
    Atomic,
}

impl SplitSums {
    pub fn is_ordered(&self) -> bool {
        *self == SplitSums::Ordered
    }
}

/// A concrete schedule of a task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct State {
    /// One split per spatial axis of the task's contraction, in axis order.
    pub spatial: Vec<SpatialSplit>,
    /// One split per reduction axis, in axis order.
    pub reduction: Vec<ReductionSplit>,
    /// Reduction and fetch loops whose total unrolled body is at most this many
    /// iterations are unrolled; register-tile loops are always unrolled.
    pub unroll_max_step: u32,
    /// Floats per global load of each input's cooperative fetch.
    pub vector_width: [u32; 2],
    /// Thread blocks that share one output tile's reduction (split-K; 1 = no split).
    /// The flattened shared-memory stage loop is cut into `split_k` contiguous chunks of
    /// `ceil(stages / split_k)` stages (see `stage_chunk`); each block adds its partial
    /// sums into the zeroed output with `atomicAdd`. Left out of the JSON when 1, so
    /// that states written before split-K existed keep their JSON, hence their ids.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub split_k: u32,
    /// Shared-memory layout of each input's tile (see `SharedLayout`). Left out of the
    /// JSON when both are natural, so that states written before layouts existed keep
    /// their JSON, hence their ids.
    #[serde(default, skip_serializing_if = "natural_layouts")]
    pub shared_layout: [SharedLayout; 2],
    /// Register prefetch (double buffering through registers): the next stage's global
    /// loads are issued right after the barrier that publishes this stage, into
    /// registers, so that their latency hides behind this stage's inner product; they
    /// are stored to shared memory at the top of the next iteration (the pass in
    /// `prefetch`). Needs the fetch loops unrolled. Left out of the JSON when off (older
    /// states keep their ids).
    #[serde(default, skip_serializing_if = "is_false")]
    pub prefetch: bool,
    /// How the tensor-core sketches' split-K meets its partial sums (`SplitSums`);
    /// ordered unless `split_k` > 1 in the `mma.sync` or `wgmma` sketch. Left out of
    /// the JSON when ordered (older states keep their ids).
    #[serde(default, skip_serializing_if = "SplitSums::is_ordered")]
    pub split_sums: SplitSums,
    /// The sketch the state belongs to, with that sketch's own tiling: the CUDA-core
    /// sketch (`spatial`, `reduction` and their annotations), `mma.sync` (see `mma`:
    /// `spatial` and `reduction` empty, `unroll_max_step`, `vector_width`,
    /// `shared_layout` and `prefetch` at their defaults, `split_k` splitting the GEMM's
    /// reduction as it does the CUDA-core sketch's) or `wgmma` (see `wgmma`: every other
    /// field at its default). In the JSON, `"mma"` or `"wgmma"` after the other fields,
    /// or neither.
    #[serde(flatten)]
    pub tiling: SketchTiling,
}

impl State {
    /// A state of the sketch of `tiling`, every other field at its default.
    pub fn of(tiling: SketchTiling) -> State {
        State {
            tiling,
            ..State::empty()
        }
    }

    /// No tiling at all: every field at its default, the CUDA-core sketch's.
    pub(crate) fn empty() -> State {
        State {
            spatial: Vec::new(),
            reduction: Vec::new(),
            unroll_max_step: 0,
            vector_width: [1, 1],
            split_k: 1,
            shared_layout: Default::default(),
            prefetch: false,
            split_sums: SplitSums::Ordered,
            tiling: SketchTiling::CudaCore,
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.sketch().threads(self)
    }

    /// Product of the virtual-thread factors.
    pub fn vthreads(&self) -> u32 {
        self.spatial.iter().map(|s| s.vthread).product()
    }

    /// Accumulator registers per thread of the CUDA-core sketch's register tile (each
    /// tensor-core tiling counts its own: `MmaTiling::accumulators`).
    pub fn accumulators(&self) -> u32 {
        self.spatial.iter().map(|s| s.register_tile()).product()
    }

    /// Thread blocks per axis.
    pub fn blocks_per_axis(&self, c: &Contraction) -> Vec<u32> {
        c.spatial
            .iter()
            .zip(&self.spatial)
            .map(|(a, s)| a.extent.div_ceil(s.block_tile()))
            .collect()
    }

    /// Outer reduction steps (shared-memory stages) per reduction axis.
    pub fn stages_per_axis(&self, c: &Contraction) -> Vec<u32> {
        c.reduction
            .iter()
            .zip(&self.reduction)
            .map(|(a, r)| a.extent.div_ceil(r.stage_tile()))
            .collect()
    }

    /// Shared-memory stages of one output tile's whole reduction: for the CUDA-core
    /// sketch the product of the stages per reduction axis (the flattened outer
    /// reduction loop); for the tensor-core sketches the GEMM's reduction tiles.
    pub fn stages(&self, c: &Contraction) -> u64 {
        self.sketch().stages(c, self)
    }

    /// Whether the reduction may be split at all: where the sketch allows it
    /// (`Sketch::may_split`), over at least two stages.
    pub fn may_split(&self, c: &Contraction) -> bool {
        self.sketch().may_split(c, self) && self.stages(c) > 1
    }

    /// Stages one block runs at most: `ceil(stages / split_k)`.
    pub fn stages_per_block(&self, c: &Contraction) -> u64 {
        self.stages(c).div_ceil(u64::from(self.split_k.max(1)))
    }

    /// The flattened stages that the blocks with split coordinate `z` run (see
    /// `stage_chunk`).
    pub fn split_chunk(&self, c: &Contraction, z: u32) -> Range<u64> {
        stage_chunk(self.stages(c), self.split_k, z)
    }

    /// Thread blocks that together cover the output once: one per output tile.
    pub fn spatial_blocks(&self, c: &Contraction) -> u64 {
        self.sketch().spatial_blocks(c, self)
    }

    /// Thread blocks in the grid: one per output tile and reduction chunk (a
    /// persistent or stream-K grid's own count).
    pub fn blocks(&self, c: &Contraction) -> u64 {
        self.sketch().blocks(c, self)
    }

    /// The state as one line of JSON (its replayable form).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a state always serializes")
    }

    /// A short stable identifier: 64-bit FNV-1a of the JSON, in hex.
    pub fn id(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.to_json().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{hash:016x}")
    }
}

/// The flattened stages `0..stages` that split coordinate `z` of `split_k` runs: chunk
/// `z` of length `ceil(stages / split_k)`, cut short (or empty) at the end so that the
/// chunks cover every stage exactly once. Lowering generates exactly this loop.
pub fn stage_chunk(stages: u64, split_k: u32, z: u32) -> Range<u64> {
    let chunk = stages.div_ceil(u64::from(split_k.max(1)));
    let start = (u64::from(z) * chunk).min(stages);
    start..(start + chunk).min(stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_stage_once_even_when_the_split_does_not_divide() {
        // 5 stages over 4 blocks: chunks of 2, the last one empty.
        let chunks: Vec<Range<u64>> = (0..4).map(|z| stage_chunk(5, 4, z)).collect();
        assert_eq!(chunks, [0..2, 2..4, 4..5, 5..5]);
        assert_eq!(stage_chunk(8, 1, 0), 0..8);
        for stages in 1..200u64 {
            for split_k in [1, 2, 3, 4, 8, 16, 64] {
                let mut covered = vec![0u32; stages as usize];
                for z in 0..split_k {
                    for s in stage_chunk(stages, split_k, z) {
                        covered[s as usize] += 1;
                    }
                }
                assert!(covered.iter().all(|&n| n == 1), "{stages} / {split_k}");
            }
        }
    }

    #[test]
    fn no_split_serializes_as_before_split_k_existed() {
        let state = State {
            prefetch: false,
            spatial: vec![SpatialSplit {
                vthread: 1,
                thread: 32,
                outer: 1,
                inner: 2,
            }],
            reduction: vec![ReductionSplit {
                middle: 4,
                inner: 2,
            }],
            unroll_max_step: 16,
            vector_width: [1, 2],
            split_k: 1,
            shared_layout: Default::default(),
            split_sums: SplitSums::Ordered,
            tiling: SketchTiling::CudaCore,
        };
        let old = r#"{"spatial":[{"vthread":1,"thread":32,"outer":1,"inner":2}],"reduction":[{"middle":4,"inner":2}],"unroll_max_step":16,"vector_width":[1,2]}"#;
        assert_eq!(state.to_json(), old);
        let read: State = serde_json::from_str(old).unwrap();
        assert_eq!(read, state);
        let split = State {
            split_k: 8,
            ..state.clone()
        };
        assert!(split.to_json().ends_with(r#","split_k":8}"#));
        assert_ne!(split.id(), state.id());
        assert_eq!(
            serde_json::from_str::<State>(&split.to_json()).unwrap(),
            split
        );
        // A layout is written only when not natural, and only its non-default fields.
        let mut transposed = state.clone();
        transposed.shared_layout[0] = SharedLayout {
            innermost: Some(0),
            pad: 4,
        };
        transposed.shared_layout[1].pad = 1;
        assert!(
            transposed
                .to_json()
                .ends_with(r#","shared_layout":[{"innermost":0,"pad":4},{"pad":1}]}"#)
        );
        assert_ne!(transposed.id(), state.id());
        assert_eq!(
            serde_json::from_str::<State>(&transposed.to_json()).unwrap(),
            transposed
        );
        // Atomic split sums are written, ordered ones are not.
        let atomic = State {
            split_sums: SplitSums::Atomic,
            ..split.clone()
        };
        assert!(
            atomic
                .to_json()
                .ends_with(r#","split_k":8,"split_sums":"atomic"}"#)
        );
        assert_ne!(atomic.id(), split.id());
        assert_eq!(
            serde_json::from_str::<State>(&atomic.to_json()).unwrap(),
            atomic
        );
    }

    #[test]
    fn a_state_is_of_one_sketch_written_as_before_and_two_are_refused() {
        let task = crate::Task::new(
            crate::parse_shape("matmul", "512,512,512").unwrap(),
            Default::default(),
        )
        .unwrap()
        .with_types(crate::DType::Fp16, crate::DType::Fp16, crate::Layout::Nchw)
        .unwrap();
        let states = crate::Sampler::new(&task, &crate::GpuSpec::h100(), 3).sample_distinct(400);
        let of = |name: &str| {
            states
                .iter()
                .find(|s| s.sketch().name() == name)
                .unwrap()
                .clone()
        };
        let (mma, wgmma) = (of("mma.sync"), of("wgmma"));
        for (state, key) in [(&mma, r#","mma":{"#), (&wgmma, r#","wgmma":{"#)] {
            let json = state.to_json();
            assert!(json.contains(key) && json.ends_with("}}"), "{json}");
            assert_eq!(&serde_json::from_str::<State>(&json).unwrap(), state);
        }
        // Both sketches' fields in one state: refused, not one of them chosen.
        let wgmma_json = wgmma.to_json();
        let tiling = &wgmma_json[wgmma_json.find(r#""wgmma":"#).unwrap()..wgmma_json.len() - 1];
        let both = format!("{},{tiling}}}", &mma.to_json()[..mma.to_json().len() - 1]);
        let err = serde_json::from_str::<State>(&both)
            .unwrap_err()
            .to_string();
        assert!(err.contains("two sketches"), "{err}");
    }
}
