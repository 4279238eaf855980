//! The `wgmma` sketch's neighbours: every valid state one move away.

use crate::sketch::split_steps;
use crate::state::{SplitSums, State, WgmmaTiling};
use crate::task::Contraction;
use crate::{GpuSpec, validate};

/// Every valid state one move from `wgmma` state `s`: one coordinate of its tiling to
/// a neighbouring value (consumers and 64-row MMAs 1 ↔ 2, N ± 16, K rows halved or
/// doubled, stages ± 1, the MMA groups in flight 0 ↔ 1, persistent blocks off ↔ one per
/// SM, the producer warp off ↔ on, the raster band halved or doubled, 2 ↔ 0, clusters
/// off ↔ pairs, a cluster's blocks along M or N doubled or halved, TMA stores off ↔ on), then the reduction split doubled or halved
/// (`sketch::split_steps`), then the split's sums ordered ↔ atomic, then stream-K off ↔ one
/// block per SM (unsplit, without what it excludes) and its blocks doubled or halved,
/// nothing else changed, in that order. Empty for the other sketches.
pub fn steps(c: &Contraction, s: &State, gpu: &GpuSpec) -> Vec<State> {
    let Some(t) = s.wgmma() else {
        return Vec::new();
    };
    let other = |x: u32| 3 - x.clamp(1, 2);
    let (cm, cn) = t.cluster_shape();
    let moves = [
        WgmmaTiling {
            consumers: other(t.consumers),
            ..t
        },
        WgmmaTiling {
            m_atoms: other(t.m_atoms),
            ..t
        },
        WgmmaTiling {
            block_n: t.block_n.saturating_sub(16),
            ..t
        },
        WgmmaTiling {
            block_n: t.block_n + 16,
            ..t
        },
        WgmmaTiling {
            k_bytes: t.k_bytes / 2,
            ..t
        },
        WgmmaTiling {
            k_bytes: t.k_bytes * 2,
            ..t
        },
        WgmmaTiling {
            stages: t.stages.saturating_sub(1),
            ..t
        },
        WgmmaTiling {
            stages: t.stages + 1,
            ..t
        },
        WgmmaTiling {
            in_flight: 1 - t.in_flight.min(1),
            ..t
        },
        WgmmaTiling {
            persistent: if t.persistent == 0 { gpu.sm_count } else { 0 },
            ..t
        },
        WgmmaTiling {
            producer_warp: 1 - t.producer_warp.min(1),
            ..t
        },
        WgmmaTiling {
            raster: if t.raster <= 2 { 0 } else { t.raster / 2 },
            ..t
        },
        WgmmaTiling {
            raster: (t.raster * 2).max(2),
            ..t
        },
        WgmmaTiling {
            cluster: if t.cluster == 0 { 2 } else { 0 },
            cluster_m: 0,
            ..t
        },
        t.with_cluster_shape(cm * 2, cn),
        t.with_cluster_shape((cm / 2).max(1), cn),
        t.with_cluster_shape(cm, cn * 2),
        t.with_cluster_shape(cm, (cn / 2).max(1)),
        WgmmaTiling {
            tma_store: 1 - t.tma_store.min(1),
            ..t
        },
    ];
    let (split_k, split_sums) = (s.split_k, s.split_sums);
    let tilings = moves.into_iter().map(|t| State {
        split_k,
        split_sums,
        ..State::hopper(t)
    });
    let splits = split_steps(c, s).into_iter().map(|split_k| State {
        split_k,
        split_sums,
        ..State::hopper(t)
    });
    let sums = State {
        split_k,
        split_sums: match split_sums {
            SplitSums::Ordered => SplitSums::Atomic,
            SplitSums::Atomic => SplitSums::Ordered,
        },
        ..State::hopper(t)
    };
    let streams = if t.stream_k == 0 {
        vec![t.streamed(gpu.sm_count)]
    } else {
        vec![
            t.streamed(0),
            t.streamed(t.stream_k / 2),
            t.streamed(t.stream_k * 2),
        ]
    };
    let streams = streams.into_iter().map(|t| State {
        split_k: 1,
        ..State::hopper(t)
    });
    tilings
        .chain(splits)
        .chain([sums])
        .chain(streams)
        .filter(|n| n != s && validate(c, n, gpu).is_ok())
        .collect()
}
