//! The `mma.sync` sketch's neighbours: its coordinates (`MmaCoordinate`), the lattice
//! dimensions of mutation and of DGD's walk, and every valid state one move away.

use crate::row_span::{COPY_ELEMENTS, RowSpan};
use crate::sketch::mma_sync::tiling::MmaTiling;
use crate::state::{SketchTiling, SplitSums, State};
use crate::task::Contraction;
use crate::{GpuSpec, validate};

/// A coordinate of a tensor-core state, the lattice dimensions of its mutations and of
/// DGD's walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MmaCoordinate {
    BlockM,
    BlockN,
    WarpsM,
    WarpsN,
    KSteps,
    Stages,
    /// Elements per copy of input 0 or 1.
    Vector(usize),
    Swizzle,
    SplitK,
    /// The split's partial sums: 0 ordered, 1 atomic (`SplitSums`).
    SplitSums,
    /// Row-span staging, 0 or 1: turning it on also sets its copy widths ([8, 1]) and
    /// the least k-steps that hold a filter row; off, copies of one element. Either
    /// way a persistent grid and stream-K are dropped.
    RowSpan,
    /// Persistent blocks: off to one per SM of an H100 (132), on to off, or doubled
    /// or halved.
    Persistent,
    /// Stream-K's blocks, as persistent blocks move (valid only unsplit).
    StreamK,
}

impl MmaCoordinate {
    pub const ALL: [MmaCoordinate; 14] = [
        MmaCoordinate::BlockM,
        MmaCoordinate::BlockN,
        MmaCoordinate::WarpsM,
        MmaCoordinate::WarpsN,
        MmaCoordinate::KSteps,
        MmaCoordinate::Stages,
        MmaCoordinate::Vector(0),
        MmaCoordinate::Vector(1),
        MmaCoordinate::Swizzle,
        MmaCoordinate::SplitK,
        MmaCoordinate::SplitSums,
        MmaCoordinate::RowSpan,
        MmaCoordinate::Persistent,
        MmaCoordinate::StreamK,
    ];

    /// The coordinate's value in tensor-core state `s` (0 for another sketch's); the
    /// swizzle and the split sums as 0 or 1.
    pub fn get(self, s: &State) -> u32 {
        let Some(t) = s.mma() else {
            return 0;
        };
        match self {
            MmaCoordinate::BlockM => t.block_m,
            MmaCoordinate::BlockN => t.block_n,
            MmaCoordinate::WarpsM => t.warps_m,
            MmaCoordinate::WarpsN => t.warps_n,
            MmaCoordinate::KSteps => t.k_steps,
            MmaCoordinate::Stages => t.stages,
            MmaCoordinate::Vector(i) => t.vector[i],
            MmaCoordinate::Swizzle => u32::from(t.swizzle),
            MmaCoordinate::SplitK => s.split_k,
            MmaCoordinate::SplitSums => u32::from(s.split_sums == SplitSums::Atomic),
            MmaCoordinate::RowSpan => u32::from(t.row_span),
            MmaCoordinate::Persistent => t.persistent,
            MmaCoordinate::StreamK => t.stream_k,
        }
    }

    /// The neighbouring values of `value`: sizes (tile sides, warps, copy widths, the
    /// split) double or halve (an odd one only doubles); k-steps and stages, small
    /// counts (1 to 4), go one up or down; the swizzle toggles. Validation decides
    /// which of them give a state.
    fn steps(self, value: u32) -> Vec<u32> {
        if matches!(self, MmaCoordinate::Persistent | MmaCoordinate::StreamK) {
            return match value {
                0 => vec![GRID_START],
                v if v.is_multiple_of(2) => vec![0, v / 2, v * 2],
                v => vec![0, v * 2],
            };
        }
        let candidates = match self {
            // Shared rows are a power of two of chunks: k-steps double or halve.
            MmaCoordinate::Stages => [value.checked_sub(1), value.checked_add(1)],
            MmaCoordinate::Swizzle | MmaCoordinate::SplitSums | MmaCoordinate::RowSpan => {
                [Some(1 - value.min(1)), None]
            }
            _ => [
                value.is_multiple_of(2).then_some(value / 2),
                value.checked_mul(2),
            ],
        };
        candidates
            .into_iter()
            .flatten()
            .filter(|&v| {
                v != value
                    && (v > 0
                        || matches!(
                            self,
                            MmaCoordinate::Swizzle
                                | MmaCoordinate::SplitSums
                                | MmaCoordinate::RowSpan
                        ))
            })
            .collect()
    }

    /// `s` with this coordinate set to `value` (unchanged for a CUDA-core state).
    fn set(self, c: &Contraction, s: &State, value: u32) -> State {
        let mut n = s.clone();
        let State {
            tiling,
            split_k,
            split_sums,
            ..
        } = &mut n;
        if let SketchTiling::MmaSync(t) = tiling {
            match self {
                MmaCoordinate::BlockM => t.block_m = value,
                MmaCoordinate::BlockN => t.block_n = value,
                MmaCoordinate::WarpsM => t.warps_m = value,
                MmaCoordinate::WarpsN => t.warps_n = value,
                MmaCoordinate::KSteps => t.k_steps = value,
                MmaCoordinate::Stages => t.stages = value,
                MmaCoordinate::Vector(i) => t.vector[i] = value,
                MmaCoordinate::Swizzle => t.swizzle = value != 0,
                MmaCoordinate::SplitK => *split_k = value,
                MmaCoordinate::SplitSums => {
                    *split_sums = if value == 0 {
                        SplitSums::Ordered
                    } else {
                        SplitSums::Atomic
                    }
                }
                MmaCoordinate::Persistent => t.persistent = value,
                MmaCoordinate::StreamK => t.stream_k = value,
                MmaCoordinate::RowSpan => {
                    t.row_span = value != 0;
                    // Persistent grids need row spans, and stream-K excludes them.
                    t.persistent = 0;
                    t.stream_k = 0;
                    t.vector = [1, 1];
                    if let Some(span) = RowSpan::of(c).ok().filter(|_| t.row_span) {
                        t.vector = [COPY_ELEMENTS as u32, 1];
                        t.k_steps = MmaTiling::span_k_steps(&span, c.dtype);
                    }
                }
            }
        }
        n
    }
}

/// Persistent or stream-K blocks a state turning them on starts from: one per SM of an
/// H100.
const GRID_START: u32 = 132;

/// Every valid state one move from tensor-core state `s`: one coordinate
/// (`MmaCoordinate`) to a neighbouring value, nothing else changed, in the order of
/// `MmaCoordinate::ALL` (smaller value first). Empty for a CUDA-core state.
pub fn steps(c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
    match s.tiling {
        SketchTiling::MmaSync(_) => mma_moves(c, s, gpu),
        _ => Vec::new(),
    }
}

fn mma_moves(c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
    let mut out = Vec::new();
    for coordinate in MmaCoordinate::ALL {
        for value in coordinate.steps(coordinate.get(s)) {
            let n = coordinate.set(c, s, value);
            if n != *s && validate(c, &n, gpu).is_ok() {
                out.push(n);
            }
        }
    }
    out
}
