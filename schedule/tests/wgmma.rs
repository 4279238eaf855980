//! The `wgmma` sketch on the CPU interpreter: states of matmul, batch matmul and NHWC
//! 1×1 convolution (a K-major B) in fp16 and bf16, and of the convolution in TF32,
//! equal the definition on small shapes
//! with tails in M, N and K (an odd N too), every swizzle (32-, 64- and 128-byte K rows, and the N-major
//! boxes of 16, 32 and 64 columns), every pipeline depth and both MMA depths in flight.
//! The interpreter reads the operands where the descriptors say the hardware finds them,
//! from what the TMA boxes wrote. Mutation tests show that a missing `expect_tx`, a
//! missing wait for a full buffer, a missing `wgmma.fence`, a missing final
//! `wait_group` and a buffer released before its MMAs completed are each caught.
//!
//! Epilogues of TMA stores equal the definition too, and a missing proxy fence, barrier
//! or `wait_group.read` is caught (`tma_stores_write_every_tile_once`,
//! `broken_tma_stores_are_caught`).
//!
//! Split-K states (chunks short and past K, persistent blocks, bias and ReLU) equal the
//! definition too, and a fixup that is missing, that adds onto a block's own sum, that
//! reads partial sums stored after their warp arrived, or that counts the arrivals
//! wrong is caught.
//!
//! Stream-K states (runs that start and end inside tiles, whole tiles inside a run, a
//! run of one K tile, two consumers, raster bands, im2col convolutions with taps, bias
//! and ReLU) equal the definition, and the same broken fixups, and a segment that
//! counts one K tile where it covered more, are caught
//! (`stream_k_deals_every_k_tile_once`, `broken_stream_k_fixups_are_caught`).

use schedule::ir::{Kernel, Stmt};
use schedule::sketch::mma_sync::MmaTiling;
use schedule::state::{SplitSums, WgmmaTiling};
use schedule::{
    DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, lower::lower, parse_shape, validate,
};

mod support;
use support::wgmma::{check, check_split, check_states, edit_all, run, split_state, task, tiling};

#[test]
fn matmul_with_tails_every_swizzle_and_depth() {
    for dtype in [DType::Fp16, DType::Bf16] {
        // M, N and K all with tails: 72 rows (one full 64-row MMA and a tail), 40
        // columns, a K of 72 (a partial last tile for every K row length).
        let t = task("matmul", "72,40,72", dtype, Epilogue::default());
        let mut tilings = Vec::new();
        for k_bytes in [32, 64, 128] {
            for stages in 1..=3 {
                tilings.push(tiling(1, 1, 48, k_bytes, stages));
            }
        }
        // The N-major boxes of every width: 16, 32 and 64 columns.
        tilings.push(tiling(1, 1, 16, 64, 2));
        tilings.push(tiling(1, 1, 32, 64, 2));
        tilings.push(tiling(1, 1, 64, 128, 2));
        tilings.push(WgmmaTiling {
            in_flight: 0,
            ..tiling(1, 1, 48, 64, 2)
        });
        // Each with a producer warp of its own too.
        let specialized: Vec<WgmmaTiling> = tilings
            .iter()
            .map(|t| WgmmaTiling {
                producer_warp: 1,
                ..*t
            })
            .collect();
        tilings.extend(specialized);
        assert_eq!(check(&t, &tilings), tilings.len(), "{t}");
    }
}

#[test]
fn persistent_blocks_work_through_every_tile_once() {
    // 12 output tiles of 64×48 (tails in M, N and K): two blocks of six rounds, five
    // blocks whose last round is partly empty, eleven of one or two rounds.
    let t = task("matmul", "200,136,264", DType::Fp16, Epilogue::default());
    let mut tilings = Vec::new();
    for persistent in [2, 5, 11] {
        for (stages, in_flight) in [(1, 0), (3, 1), (4, 0)] {
            for producer_warp in [0, 1] {
                tilings.push(WgmmaTiling {
                    persistent,
                    in_flight,
                    producer_warp,
                    ..tiling(1, 1, 48, 64, stages)
                });
            }
        }
    }
    assert_eq!(check(&t, &tilings), tilings.len());
    // As many blocks as tiles is the plain grid, refused in that spelling.
    let state = State::hopper(WgmmaTiling {
        persistent: 12,
        ..tiling(1, 1, 48, 64, 2)
    });
    assert!(validate(&t.contraction(), &state, &GpuSpec::h100()).is_err());
}

/// Grouped rasterization: tiles walk down bands of 2 or 4 M tiles, in plain and
/// persistent grids, split or not, batched; a band that does not divide the M tiles is
/// refused, and a broken tile order (every tile of a band given the band's first row)
/// is caught.
#[test]
fn raster_bands_cover_every_tile_once() {
    // 200 rows of 64-row tiles: 4 M tiles (the last a tail); 136 columns of 48: 3 N tiles.
    let t = task("matmul", "200,136,264", DType::Fp16, Epilogue::default());
    let mut tilings = Vec::new();
    for raster in [2, 4] {
        for persistent in [0, 5] {
            tilings.push((
                WgmmaTiling {
                    raster,
                    persistent,
                    ..tiling(1, 1, 48, 64, 2)
                },
                1,
            ));
        }
        tilings.push((
            WgmmaTiling {
                raster,
                producer_warp: 1,
                ..tiling(1, 1, 48, 64, 3)
            },
            3,
        ));
    }
    assert_eq!(check_split(&t, &tilings), tilings.len());
    let bmm = task(
        "batch_matmul",
        "3,128,80,64",
        DType::Bf16,
        Epilogue::default(),
    );
    let banded = WgmmaTiling {
        raster: 2,
        ..tiling(1, 1, 32, 64, 2)
    };
    assert_eq!(check(&bmm, &[banded]), 1);
    let gpu = GpuSpec::h100();
    for raster in [3, 8] {
        let state = State::hopper(WgmmaTiling {
            raster,
            ..tiling(1, 1, 48, 64, 2)
        });
        assert!(
            validate(&t.contraction(), &state, &gpu).is_err(),
            "{raster}"
        );
    }
    // The broken order: the row within the band dropped.
    let state = State::hopper(WgmmaTiling {
        raster: 2,
        ..tiling(1, 1, 48, 64, 2)
    });
    let mut kernel = lower(&t, &state);
    let band_rows: Vec<usize> = (0..kernel.scope.vars.len())
        .filter(|&v| kernel.scope.vars[v].name.starts_with("b_m_in"))
        .collect();
    assert!(!band_rows.is_empty());
    let zeroed = zero_lets(&mut kernel.body, &band_rows);
    assert!(zeroed > 0);
    assert!(run(&t, &kernel).is_err());
}

/// Clusters of two blocks on neighbouring tiles: pairs along N share A (row-by-row
/// order), pairs along M share B (a raster band; N-major boxes dealt out, or a K-major
/// tile's rows halved), each block's half multicast into both; with a producer warp
/// (each block's threads padded to whole warpgroups), two consumers, persistent pairs
/// and TF32. Each block's consumers release a buffer on every block's empty barrier.
#[test]
fn clusters_share_a_tile_by_multicast() {
    let clustered = |t: WgmmaTiling, raster| WgmmaTiling {
        cluster: 2,
        raster,
        ..t
    };
    // 4 M tiles of 64 rows (a tail), 4 N tiles of 48 columns: pairs along N share A.
    let t = task("matmul", "200,192,264", DType::Fp16, Epilogue::default());
    let tilings = [
        clustered(tiling(1, 1, 48, 64, 2), 0),
        clustered(tiling(1, 1, 48, 128, 3), 0),
        WgmmaTiling {
            producer_warp: 1,
            ..clustered(tiling(1, 1, 48, 32, 3), 0)
        },
        WgmmaTiling {
            persistent: 6,
            ..clustered(tiling(1, 1, 48, 64, 2), 0)
        },
    ];
    assert_eq!(check(&t, &tilings), tilings.len());
    // Pairs along M share an N-major B of two 64-column boxes, one per block.
    let b = task("matmul", "256,256,128", DType::Bf16, Epilogue::default());
    let tilings = [
        clustered(tiling(1, 1, 128, 64, 2), 2),
        clustered(tiling(2, 1, 128, 64, 2), 2),
        WgmmaTiling {
            producer_warp: 1,
            persistent: 2,
            ..clustered(tiling(1, 1, 128, 128, 3), 4)
        },
    ];
    assert_eq!(check(&b, &tilings), tilings.len());
    // A K-major B (NHWC 1×1 convolution, fused) halved by rows, in fp16 and TF32.
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    let conv = task("conv2d", "2,64,8,8,96,1,1,1,0", DType::Fp16, fused);
    let tilings = [
        clustered(tiling(1, 1, 48, 64, 2), 2),
        clustered(tiling(1, 1, 48, 64, 2), 0),
    ];
    assert_eq!(check(&conv, &tilings), tilings.len());
    let tf32 = Task::new(parse_shape("conv2d", "2,64,8,8,96,1,1,1,0").unwrap(), fused)
        .unwrap()
        .with_types(DType::Tf32, DType::F32, Layout::Nhwc)
        .unwrap();
    assert_eq!(check(&tf32, &tilings), tilings.len());
    // Refused: a persistent grid of odd pairs, three blocks, a pair spelled twice (its
    // shape given where the raster order already lays it out), a K-major B's 48 rows
    // dealt out to 4 blocks (12 rows: no whole swizzle atoms), a shape without a
    // cluster.
    let gpu = GpuSpec::h100();
    let odd = State::hopper(WgmmaTiling {
        persistent: 5,
        ..clustered(tiling(1, 1, 48, 64, 2), 0)
    });
    let three = State::hopper(WgmmaTiling {
        cluster: 3,
        ..tiling(1, 1, 48, 64, 2)
    });
    let twice = State::hopper(WgmmaTiling {
        cluster_m: 1,
        ..clustered(tiling(1, 1, 48, 64, 2), 0)
    });
    let rows = State::hopper(tiling(1, 1, 48, 64, 2).with_cluster_shape(4, 1));
    let shapeless = State::hopper(WgmmaTiling {
        cluster_m: 2,
        ..tiling(1, 1, 48, 64, 2)
    });
    for (task, state) in [
        (&t, odd),
        (&t, three),
        (&t, twice),
        (&conv, rows),
        (&t, shapeless),
    ] {
        assert!(
            validate(&task.contraction(), &state, &gpu).is_err(),
            "{}",
            state.to_json()
        );
    }
}

/// Clusters of 2 × 2, 2 × 4, 4 × 2, 1 × 4 and 1 × 8 blocks share both operands: A's
/// tile along each cluster row and B's (N-major boxes) down each column, each block
/// copying its share and multicasting it, each consumer releasing a buffer to every
/// sharer of both; with tile grids padded to whole clusters (the padding tiles store
/// nothing), raster bands of whole clusters, persistent grids, a producer warp, and
/// split-K (ordered and atomic) whose chunks keep a cluster's blocks on one chunk.
#[test]
fn clusters_of_rectangles_share_both_tiles() {
    let split = |t: WgmmaTiling, split_k, sums| State {
        split_k,
        split_sums: sums,
        ..State::hopper(t)
    };
    // 4 M tiles of 64 rows (a tail), 4 N tiles of two 64-column boxes, 17 K tiles.
    let t = task("matmul", "200,512,264", DType::Fp16, Epilogue::default());
    let base = tiling(1, 1, 128, 32, 2);
    let states = [
        State::hopper(base.with_cluster_shape(2, 2)),
        State::hopper(base.with_cluster_shape(2, 4)),
        State::hopper(base.with_cluster_shape(1, 8)),
        State::hopper(tiling(1, 1, 256, 32, 2).with_cluster_shape(4, 2)),
        State::hopper(tiling(1, 1, 128, 64, 3).with_cluster_shape(1, 4)),
        State::hopper(
            WgmmaTiling {
                raster: 4,
                producer_warp: 1,
                ..base
            }
            .with_cluster_shape(2, 2),
        ),
        State::hopper(
            WgmmaTiling {
                persistent: 8,
                ..base
            }
            .with_cluster_shape(2, 2),
        ),
        split(base.with_cluster_shape(2, 2), 3, SplitSums::Ordered),
        split(base.with_cluster_shape(2, 4), 2, SplitSums::Atomic),
    ];
    assert_eq!(check_states(&t, &states), states.len());
}

/// What a broken cluster protocol does is caught: consumers that release a buffer only
/// to their own block (the peer's producer waits forever, or, counting one block's
/// arrivals, overwrites a buffer whose MMAs it does not know retired), barriers used
/// across blocks before a cluster barrier published them, and a shared tile's half
/// copied into one block only.
#[test]
fn broken_cluster_protocols_are_caught() {
    let t = task("matmul", "200,192,264", DType::Fp16, Epilogue::default());
    let state = State::hopper(WgmmaTiling {
        cluster: 2,
        ..tiling(1, 1, 48, 64, 2)
    });
    let kernel = lower(&t, &state);
    assert!(run(&t, &kernel).is_ok());
    let local = |k: &mut Kernel| {
        edit_all(&mut k.body, &|s| match s {
            Stmt::ClusterArrive { barrier, .. } => {
                *s = Stmt::MbarrierArrive {
                    barrier: barrier.clone(),
                };
                true
            }
            _ => false,
        })
    };
    let mut released_locally = kernel.clone();
    assert!(local(&mut released_locally) > 0);
    let err = run(&t, &released_locally).unwrap_err();
    assert!(err.contains("can never complete"), "{err}");
    let mut counted_locally = released_locally.clone();
    assert!(
        edit_all(&mut counted_locally.body, &|s| match s {
            Stmt::MbarrierInit { arrivals, .. } if *arrivals == 2 => {
                *arrivals = 1;
                true
            }
            _ => false,
        }) > 0
    );
    let err = run(&t, &counted_locally).unwrap_err();
    assert!(err.contains("warpgroup"), "{err}");
    let mut unpublished = kernel.clone();
    assert!(replaced(
        &mut unpublished.body,
        &|s| matches!(s, Stmt::ClusterSync),
        &Stmt::Sync
    ));
    let err = run(&t, &unpublished).unwrap_err();
    assert!(err.contains("cluster barrier"), "{err}");
    let mut unicast = kernel.clone();
    assert!(
        edit_all(&mut unicast.body, &|s| match s {
            Stmt::TmaLoad { multicast, .. } if multicast.is_some() => {
                *multicast = None;
                true
            }
            _ => false,
        }) > 0
    );
    assert!(run(&t, &unicast).is_err());
    // In a 2 × 2 cluster a consumer releases a buffer to its row (A's sharers) and its
    // column (B's): without the column's arrivals its producers wait forever; a copy of
    // A that lands only in its own block leaves the row's other block short of bytes.
    let t = task("matmul", "200,512,264", DType::Fp16, Epilogue::default());
    let state = State::hopper(tiling(1, 1, 128, 32, 2).with_cluster_shape(2, 2));
    let kernel = lower(&t, &state);
    assert!(run(&t, &kernel).is_ok());
    let mut row_only = kernel.clone();
    assert!(
        edit_all(&mut row_only.body, &|s| match s {
            Stmt::If { body, .. } => {
                let before = body.len();
                body.retain(
                    |s| !matches!(s, Stmt::ClusterArrive { ranks, .. } if ranks.pattern == 0b11),
                );
                body.len() < before
            }
            _ => false,
        }) > 0
    );
    let err = run(&t, &row_only).unwrap_err();
    assert!(err.contains("can never complete"), "{err}");
    let a_map = kernel
        .params
        .iter()
        .position(|p| matches!(p, schedule::ir::Param::TensorMap { .. }))
        .unwrap();
    let mut own_a = kernel.clone();
    assert!(
        edit_all(&mut own_a.body, &|s| match s {
            Stmt::TmaLoad {
                map,
                multicast: Some(ranks),
                ..
            } if *map == a_map => {
                ranks.pattern = 1;
                true
            }
            _ => false,
        }) > 0
    );
    assert!(run(&t, &own_a).is_err());
}

/// Sets every `Let` of one of `vars` to 0 (nested bodies included); returns how many.
fn zero_lets(body: &mut [Stmt], vars: &[usize]) -> usize {
    let mut zeroed = 0;
    for stmt in body {
        match stmt {
            Stmt::Let { var, value } if vars.contains(&var.0) => {
                *value = schedule::ir::Expr::Const(0);
                zeroed += 1;
            }
            other => {
                if let Some(body) = other.body_mut() {
                    zeroed += zero_lets(body, vars);
                }
            }
        }
    }
    zeroed
}

#[test]
fn two_consumers_two_atoms_and_the_fused_epilogue() {
    let t = task(
        "matmul",
        "200,64,96",
        DType::Fp16,
        Epilogue {
            bias: true,
            relu: true,
        },
    );
    let tilings = [
        tiling(2, 1, 64, 64, 2),
        tiling(1, 2, 32, 128, 1),
        tiling(2, 2, 16, 32, 4),
        WgmmaTiling {
            producer_warp: 1,
            ..tiling(2, 1, 64, 64, 3)
        },
    ];
    assert_eq!(check(&t, &tilings), tilings.len());
    // More than one producer warp is not a state the sketch has.
    let producers = State::hopper(WgmmaTiling {
        producer_warp: 2,
        ..tiling(2, 1, 64, 64, 2)
    });
    assert!(validate(&t.contraction(), &producers, &GpuSpec::h100()).is_err());
    // Two warpgroups of 64 rows over a 16-row GEMM: the second would only idle.
    let decode = task("matmul", "16,64,64", DType::Fp16, Epilogue::default());
    let idle = State::hopper(tiling(2, 1, 64, 64, 2));
    assert!(validate(&decode.contraction(), &idle, &GpuSpec::h100()).is_err());
}

#[test]
fn batch_matmul_and_a_k_major_b() {
    let bmm = task(
        "batch_matmul",
        "3,40,48,32",
        DType::Bf16,
        Epilogue::default(),
    );
    let tilings = [tiling(1, 1, 48, 64, 2), tiling(1, 1, 16, 32, 3)];
    assert_eq!(check(&bmm, &tilings), tilings.len());
    // NHWC 1×1 stride 1: A is the activations (M = N·H·W), B the KRSC weights (K-major).
    let conv = task(
        "conv2d",
        "1,24,6,6,40,1,1,1,0",
        DType::Fp16,
        Epilogue::default(),
    );
    let tilings = [tiling(1, 1, 40, 32, 2), tiling(1, 1, 24, 64, 1)];
    assert_eq!(check(&conv, &tilings), tilings.len());
    // An odd channel count: the epilogue stores one element at a time.
    let odd = task(
        "conv2d",
        "1,24,6,6,39,1,1,1,0",
        DType::Fp16,
        Epilogue::default(),
    );
    assert_eq!(check(&odd, &tilings), tilings.len());
}

/// TF32 (k8 instructions on 4-byte elements, both operands K-major): an NHWC 1×1
/// convolution, the GEMM whose B (the KRSC weights) is K-major, with tails in M, N and
/// K, every K row length (8, 16 and 32 elements), every depth, a producer warp, two
/// consumers and split-K; a matmul's N-major B has no TF32 instruction and is refused.
#[test]
fn tf32_reads_four_byte_k_major_operands() {
    let tf32 = |shape: &str, epilogue| {
        Task::new(parse_shape("conv2d", shape).unwrap(), epilogue)
            .unwrap()
            .with_types(DType::Tf32, DType::F32, Layout::Nhwc)
            .unwrap()
    };
    // M = 2·6·6 = 72, N = 40, K = 44: a partial last K tile for every row length.
    let conv = tf32("2,44,6,6,40,1,1,1,0", Epilogue::default());
    let mut tilings = Vec::new();
    for k_bytes in [32, 64, 128] {
        for stages in 1..=3 {
            tilings.push((tiling(1, 1, 40, k_bytes, stages), 1));
        }
    }
    tilings.push((
        WgmmaTiling {
            producer_warp: 1,
            ..tiling(2, 1, 24, 64, 2)
        },
        1,
    ));
    tilings.push((tiling(1, 2, 40, 32, 2), 2));
    assert_eq!(check_split(&conv, &tilings), tilings.len());
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    let fused_conv = tf32("1,48,6,6,24,1,1,1,0", fused);
    let tilings = [(tiling(1, 1, 24, 64, 2), 1), (tiling(1, 1, 24, 32, 3), 3)];
    assert_eq!(check_split(&fused_conv, &tilings), tilings.len());
    let matmul = Task::new(
        parse_shape("matmul", "64,64,64").unwrap(),
        Epilogue::default(),
    )
    .unwrap()
    .with_types(DType::Tf32, DType::F32, Layout::Nhwc)
    .unwrap();
    let state = State::hopper(tiling(1, 1, 64, 128, 2));
    assert!(validate(&matmul.contraction(), &state, &GpuSpec::h100()).is_err());
    let sampled = Sampler::new(&conv, &GpuSpec::h100(), 3).sample_distinct(40);
    assert!(sampled.iter().any(|s| s.wgmma().is_some()));
    for s in sampled.iter().filter(|s| s.wgmma().is_some()).take(4) {
        if let Err(e) = run(&conv, &lower(&conv, s)) {
            panic!("{}: {e}", s.to_json());
        }
    }
}

#[test]
fn split_k_sums_the_partials_in_the_last_block() {
    // 13 K tiles of 16 (K = 200, a tail): splits of 2, 3 and 4 leave chunks of 7, 5
    // and 4 K tiles, the last chunk short and reading past K; bias and ReLU run once,
    // on the whole sum, in whichever block arrives last.
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    for dtype in [DType::Fp16, DType::Bf16] {
        let t = task("matmul", "200,40,200", dtype, fused);
        let mut tilings = Vec::new();
        for split_k in [2, 3, 4] {
            for (stages, producer_warp) in [(1, 0), (2, 1), (3, 0)] {
                tilings.push((
                    WgmmaTiling {
                        producer_warp,
                        ..tiling(1, 1, 48, 32, stages)
                    },
                    split_k,
                ));
            }
        }
        // Two consumers of two MMAs each, and persistent blocks taking several units
        // (of different tiles, and several of one tile).
        tilings.push((tiling(2, 2, 16, 32, 2), 2));
        for persistent in [1, 3, 5] {
            tilings.push((
                WgmmaTiling {
                    persistent,
                    ..tiling(1, 1, 32, 32, 2)
                },
                4,
            ));
        }
        assert_eq!(check_split(&t, &tilings), tilings.len(), "{t}");
    }
    // A batch matmul and a K-major B.
    let bmm = task(
        "batch_matmul",
        "3,40,48,96",
        DType::Fp16,
        Epilogue::default(),
    );
    let tilings = [(tiling(1, 1, 48, 32, 2), 3)];
    assert_eq!(check_split(&bmm, &tilings), 1);
    let conv = task("conv2d", "1,64,6,6,40,1,1,1,0", DType::Fp16, fused);
    let tilings = [(tiling(1, 1, 40, 32, 2), 2)];
    assert_eq!(check_split(&conv, &tilings), 1);
    // A split with an empty last chunk (13 K tiles, 8 chunks of 2) is refused.
    let t = task("matmul", "72,40,200", DType::Fp16, fused);
    let empty = split_state(tiling(1, 1, 48, 32, 2), 8);
    assert!(validate(&t.contraction(), &empty, &GpuSpec::h100()).is_err());
}

/// Stream-K with `blocks` blocks.
fn stream(t: WgmmaTiling, blocks: u32) -> State {
    State::hopper(WgmmaTiling {
        stream_k: blocks,
        ..t
    })
}

#[test]
fn stream_k_deals_every_k_tile_once() {
    // 4 tiles of 13 K tiles (K = 200, a tail): 52 iterations. 3 blocks take runs of 17
    // or 18 (a whole tile inside, both ends inside tiles); 13 blocks runs of 4 (none
    // whole); 51 blocks runs of 1 or 2; 4 blocks exactly one tile each; 5 and 8 cut
    // tiles in several places. Bias and ReLU run once, on the whole sum.
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    for dtype in [DType::Fp16, DType::Bf16] {
        let t = task("matmul", "200,40,200", dtype, fused);
        let mut states = Vec::new();
        for blocks in [3, 4, 5, 8, 13, 51] {
            for (stages, producer_warp) in [(1, 0), (2, 1), (3, 0)] {
                let t = WgmmaTiling {
                    producer_warp,
                    ..tiling(1, 1, 48, 32, stages)
                };
                states.push(stream(t, blocks));
            }
        }
        // Two consumers of two MMAs each; a raster band over 4 × 3 tiles.
        states.push(stream(tiling(2, 2, 16, 32, 2), 7));
        let banded = WgmmaTiling {
            raster: 2,
            ..tiling(1, 1, 16, 32, 2)
        };
        states.push(stream(banded, 11));
        assert_eq!(check_states(&t, &states), states.len(), "{t}");
    }
    // A batch matmul; an im2col convolution whose K tiles run over the taps, with a
    // padded border and a tail of output rows.
    let bmm = task(
        "batch_matmul",
        "3,40,48,96",
        DType::Fp16,
        Epilogue::default(),
    );
    let states = [stream(tiling(1, 1, 48, 32, 2), 5)];
    assert_eq!(check_states(&bmm, &states), 1);
    let conv = task("conv2d", "1,64,6,6,40,3,3,1,1", DType::Fp16, fused);
    let states = [
        stream(tiling(1, 1, 40, 64, 2), 5),
        stream(tiling(1, 1, 40, 128, 3), 4),
    ];
    assert_eq!(check_states(&conv, &states), 2);
    // Refused: one block, as many blocks as K tiles, and stream-K with a split, a
    // persistent grid, clusters or TMA stores.
    let t = task("matmul", "200,40,200", DType::Fp16, Epilogue::default());
    let (c, gpu) = (t.contraction(), GpuSpec::h100());
    let base = tiling(1, 1, 48, 32, 2);
    let refused = [
        stream(base, 1),
        stream(base, 52),
        State {
            split_k: 2,
            ..stream(base, 5)
        },
        stream(
            WgmmaTiling {
                persistent: 2,
                ..base
            },
            5,
        ),
        stream(base.with_cluster_shape(1, 2), 6),
    ];
    for state in refused {
        assert!(validate(&c, &state, &gpu).is_err(), "{}", state.to_json());
    }
}

/// Stream-K's fixups, as both tensor-core sketches run them, broken each way the
/// split's could be, and a segment weighed as one K tile.
#[test]
fn broken_stream_k_fixups_are_caught() {
    let t = task("matmul", "200,40,200", DType::Fp16, Epilogue::default());
    let mma = |stream_k| {
        State::tensor_core(
            MmaTiling {
                stream_k,
                ..fixup_mma()
            },
            1,
        )
    };
    for state in [
        stream(tiling(1, 1, 48, 32, 2), 5),
        stream(tiling(1, 1, 48, 32, 2), 13),
        // 21 tiles of 13 K tiles: runs of 34 or 35 and of 8 or 9, cutting tiles.
        mma(8),
        mma(31),
    ] {
        broken_split_k_fixup_is_caught(&t, &state);
        // A segment that counts one K tile where it covered more: the semaphore never
        // reaches the tile's count, no block stores the tile, and it is left set.
        let mut k = lower(&t, &state);
        let weights = edit_all(&mut k.body, &|s| match s {
            Stmt::LastArrival { weight, .. } => {
                *weight = schedule::ir::Expr::Const(1);
                true
            }
            _ => false,
        });
        assert!(weights > 0);
        let e = run(&t, &k).unwrap_err();
        assert!(
            e.contains("written 0 times") || e.contains("left at"),
            "{e}"
        );
    }
}

/// The split-K fixup, as both tensor-core sketches run it (`wgmma` and `mma.sync`),
/// broken each way it could be.
#[test]
fn broken_split_k_fixups_are_caught() {
    let t = task("matmul", "64,48,160", DType::Fp16, Epilogue::default());
    for state in [
        split_state(tiling(1, 1, 48, 32, 2), 4),
        State::tensor_core(fixup_mma(), 4),
    ] {
        for split_sums in [SplitSums::Ordered, SplitSums::Atomic] {
            broken_split_k_fixup_is_caught(
                &t,
                &State {
                    split_sums,
                    ..state.clone()
                },
            );
        }
    }
}

/// The `mma.sync` tiling whose split and stream-K fixups the mutation tests break: 32×16
/// tiles of two warps.
fn fixup_mma() -> MmaTiling {
    MmaTiling {
        block_m: 32,
        block_n: 16,
        warps_m: 2,
        warps_n: 1,
        k_steps: 1,
        stages: 2,
        vector: [8, 8],
        swizzle: true,
        row_span: false,
        persistent: 0,
        stream_k: 0,
    }
}

fn broken_split_k_fixup_is_caught(t: &Task, state: &State) {
    assert_eq!(validate(&t.contraction(), state, &GpuSpec::h100()), Ok(()));
    run(t, &lower(t, state)).unwrap();
    let broken = |mutate: &dyn Fn(&mut Vec<Stmt>) -> bool| {
        let mut k = lower(t, state);
        assert!(mutate(&mut k.body), "the mutation applies");
        run(t, &k)
    };
    // No fixup: the epilogue stores zeros, and atomic sums are left in the workspace.
    let e = broken(&|b| without(b, &|s| matches!(s, Stmt::PartialAdd { .. }))).unwrap_err();
    // Stream-K's partial sums always meet atomically.
    let stream_k = state.wgmma().is_some_and(|t| t.stream_k > 0)
        || state.mma().is_some_and(|t| t.stream_k > 0);
    let left = state.split_sums == SplitSums::Atomic || stream_k;
    assert!(
        if left {
            e.contains("left non-zero")
        } else {
            e.starts_with("output ")
        },
        "{e}"
    );
    // A fixup that reads atomic sums without clearing them leaves them for the next
    // launch to add onto.
    if left {
        let e = broken(&|b| keep_sums(b)).unwrap_err();
        assert!(e.contains("left non-zero"), "{e}");
    }
    // The fixup adds onto the last block's own sum instead of from zero.
    let e = broken(&|b| remove_in_fixup(b, &|s| matches!(s, Stmt::ZeroAcc))).unwrap_err();
    assert!(e.starts_with("output "), "{e}");
    // Arrived before adding (the semaphore released early): the fixup takes sums
    // whose additions no arrival published, or (where the early arrival was the last)
    // runs before the block's own additions, which then stay in the workspace, and
    // (`mma.sync` stream-K, whose fixup starts from zeros in the same registers) the
    // tile's output lacks them.
    let e = broken(&|b| store_after_arrival(b)).unwrap_err();
    assert!(
        e.contains("before every partial sum")
            || left && (e.contains("left non-zero") || e.starts_with("output ")),
        "{e}"
    );
    // One arrival too few counted: the fixup runs before the last chunk is stored, and
    // that chunk's arrival leaves the semaphore set for the next launch.
    let e = broken(&|b| arrivals(b, |n| n - 1)).unwrap_err();
    assert!(
        e.contains("before every partial sum") || e.contains("left at"),
        "{e}"
    );
    // One too many: no block runs the epilogue.
    let e = broken(&|b| arrivals(b, |n| n + 1)).unwrap_err();
    assert!(
        e.contains("written 0 times") || e.contains("left at"),
        "{e}"
    );
}

/// Makes every fixup read leave its slot as it was (no clear).
fn keep_sums(body: &mut [Stmt]) -> bool {
    let mut kept = false;
    for s in body.iter_mut() {
        if let Stmt::PartialAdd { clear, .. } = s {
            kept |= std::mem::take(clear);
        } else if let Some(inner) = s.body_mut() {
            kept |= keep_sums(inner);
        }
    }
    kept
}

/// Removes the first statement `hit` selects inside a `LastArrival`'s body.
fn remove_in_fixup(body: &mut [Stmt], hit: &impl Fn(&Stmt) -> bool) -> bool {
    body.iter_mut().any(|s| match s {
        Stmt::LastArrival { body, .. } => without(body, hit),
        other => other
            .body_mut()
            .is_some_and(|body| remove_in_fixup(body, hit)),
    })
}

/// Moves the loop of partial stores after the `LastArrival` that follows it.
fn store_after_arrival(body: &mut Vec<Stmt>) -> bool {
    let stores = body.iter().position(|s| {
        let mut found = false;
        Stmt::walk(std::slice::from_ref(s), &mut |x| {
            found |= matches!(x, Stmt::PartialStore { .. })
        });
        found && matches!(s, Stmt::For { .. })
    });
    let arrival = body
        .iter()
        .position(|s| matches!(s, Stmt::LastArrival { .. }));
    if let (Some(i), Some(j)) = (stores, arrival)
        && i < j
    {
        let loop_ = body.remove(i);
        body.insert(j, loop_);
        return true;
    }
    body.iter_mut()
        .any(|s| s.body_mut().is_some_and(store_after_arrival))
}

/// Changes the arrivals every `LastArrival` counts with `change`.
fn arrivals(body: &mut [Stmt], change: fn(u32) -> u32) -> bool {
    let mut changed = false;
    for s in body.iter_mut() {
        match s {
            Stmt::LastArrival { arrivals, .. } => {
                *arrivals = change(*arrivals);
                changed = true;
            }
            other => {
                if let Some(body) = other.body_mut() {
                    changed |= arrivals(body, change);
                }
            }
        }
    }
    changed
}

#[test]
fn sampled_states_equal_the_definition() {
    let t = task("matmul", "100,80,120", DType::Fp16, Epilogue::default());
    let states: Vec<State> = Sampler::new(&t, &GpuSpec::h100(), 5)
        .sample_distinct(40)
        .into_iter()
        .filter(|s| s.wgmma().is_some())
        .take(6)
        .collect();
    assert!(states.len() >= 4, "{} wgmma states", states.len());
    for s in &states {
        if let Err(e) = run(&t, &lower(&t, s)) {
            panic!("{}: {e}", s.to_json());
        }
    }
}

#[test]
fn what_tma_cannot_copy_is_refused() {
    let gpu = GpuSpec::h100();
    let state = State::hopper(tiling(1, 1, 64, 128, 2));
    // A convolution over 4 fp16 channels has pixels 8 bytes apart (TMA needs 16); an
    // f32 matmul has no wgmma here;
    // 333×777×555 fp16 has rows that are not 16-byte multiples.
    for (op, shape, dtype) in [
        ("conv2d", "1,4,8,8,16,3,3,1,1", DType::Fp16),
        ("matmul", "128,128,128", DType::F32),
        ("matmul", "333,777,555", DType::Fp16),
    ] {
        let t = task(op, shape, dtype, Epilogue::default());
        assert!(
            validate(&t.contraction(), &state, &gpu).is_err(),
            "{op} {shape}"
        );
    }
}

/// Removes the first statement (searching nested bodies) that `hit` selects.
fn without(body: &mut Vec<Stmt>, hit: &impl Fn(&Stmt) -> bool) -> bool {
    if let Some(i) = body.iter().position(hit) {
        body.remove(i);
        return true;
    }
    body.iter_mut()
        .any(|s| s.body_mut().is_some_and(|body| without(body, hit)))
}

/// Replaces the first statement that `hit` selects with `with`.
fn replaced(body: &mut [Stmt], hit: &impl Fn(&Stmt) -> bool, with: &Stmt) -> bool {
    for s in body.iter_mut() {
        if hit(s) {
            *s = with.clone();
            return true;
        }
        let Some(nested) = s.body_mut() else {
            continue;
        };
        if replaced(nested, hit, with) {
            return true;
        }
    }
    false
}

#[test]
fn broken_pipelines_are_caught() {
    let t = task("matmul", "64,48,160", DType::Fp16, Epilogue::default());
    let state = State::hopper(tiling(2, 1, 48, 64, 2));
    let state_one = State::hopper(tiling(1, 1, 48, 64, 2));
    let kernel = lower(&t, &state);
    run(&t, &kernel).unwrap();
    let broken = |state: &State, mutate: &dyn Fn(&mut Vec<Stmt>) -> bool| {
        let mut k = lower(&t, state);
        assert!(mutate(&mut k.body), "the mutation applies");
        run(&t, &k).expect_err("a broken pipeline is caught")
    };
    let e = broken(&state, &|b| {
        without(b, &|s| matches!(s, Stmt::ArriveExpectTx { .. }))
    });
    assert!(
        e.contains("can never complete") || e.contains("read before"),
        "{e}"
    );
    let e = broken(&state, &|b| {
        without(b, &|s| matches!(s, Stmt::MbarrierWait { .. }))
    });
    assert!(e.contains("waited for"), "{e}");
    let e = broken(&state, &|b| without(b, &|s| matches!(s, Stmt::WgmmaFence)));
    assert!(e.contains("missing fence"), "{e}");
    // The tile's last wait_group gone: the epilogue reads pending results.
    let e = broken(&state, &|b| {
        without(b, &|s| matches!(s, Stmt::WgmmaWait { pending: 0 }))
    });
    assert!(e.contains("missing wait_group"), "{e}");
    // Released early: the loop's wait leaves two groups in flight, so the buffer
    // the producer refills may still be read.
    for s in [&state, &state_one] {
        let e = broken(s, &|b| {
            replaced(
                b,
                &|s| matches!(s, Stmt::WgmmaWait { pending: 1 }),
                &Stmt::WgmmaWait { pending: 2 },
            )
        });
        assert!(e.contains("released too early"), "{e}");
    }
    // Persistent blocks (across an output tile's boundary) and a producer warp: the
    // same.
    let t2 = task("matmul", "128,48,128", DType::Fp16, Epilogue::default());
    for (persistent, producer_warp) in [(1, 0), (1, 1), (0, 1)] {
        let state = State::hopper(WgmmaTiling {
            persistent,
            producer_warp,
            ..tiling(1, 1, 48, 64, 2)
        });
        let mut k = lower(&t2, &state);
        run(&t2, &k).unwrap();
        assert!(replaced(
            &mut k.body,
            &|s| matches!(s, Stmt::WgmmaWait { pending: 1 }),
            &Stmt::WgmmaWait { pending: 2 },
        ));
        let e = run(&t2, &k).expect_err("released early");
        assert!(e.contains("released too early"), "{e}");
    }
    // A consumer that does not arrive: the producer's wait can never complete.
    let e = broken(&state, &|b| {
        without(b, &|s| matches!(s, Stmt::MbarrierArrive { .. }))
    });
    assert!(e.contains("can never complete"), "{e}");
    // With a producer warp, the roles run their own code paths concurrently: without a
    // consumer's arrival both end up waiting (a deadlock); a producer that does not
    // wait for the consumers' release overwrites a buffer they may still read.
    let specialized = State::hopper(WgmmaTiling {
        producer_warp: 1,
        ..tiling(2, 1, 48, 64, 2)
    });
    run(&t, &lower(&t, &specialized)).unwrap();
    let e = broken(&specialized, &|b| {
        without(b, &|s| matches!(s, Stmt::MbarrierArrive { .. }))
    });
    assert!(e.contains("can never complete"), "{e}");
    let e = broken(&specialized, &|b| {
        without(b, &|s| matches!(s, Stmt::MbarrierWait { .. }))
    });
    assert!(
        e.contains("released too early") || e.contains("read before the mbarrier phase"),
        "{e}"
    );
}

/// The epilogue of TMA stores: each warpgroup stages 64-row chunks of its results in
/// swizzled shared buffers (the 128-, 64- and 32-byte spans, and a 16-byte unswizzled
/// one) and TMA writes them, clipping the tails; with two 64-row MMAs, two consumers, a
/// producer warp, persistent blocks (an odd chunk count per tile alternates the
/// buffers the other way), raster bands, clusters, bias and ReLU, batches, a K-major B
/// and an f32 output. Refused under a split, and where the output's rows are not
/// 16-byte multiples.
#[test]
fn tma_stores_write_every_tile_once() {
    let stored = |t: WgmmaTiling| WgmmaTiling { tma_store: 1, ..t };
    let fused = Epilogue {
        bias: true,
        relu: true,
    };
    // 200 × 136 (tails in M and N), fp16 and bf16, with and without bias and ReLU.
    for (dtype, epilogue) in [
        (DType::Fp16, Epilogue::default()),
        (DType::Bf16, fused),
        (DType::Fp16, fused),
    ] {
        let t = task("matmul", "200,136,264", dtype, epilogue);
        let tilings: Vec<WgmmaTiling> = [
            tiling(1, 1, 48, 64, 2),
            tiling(1, 1, 32, 128, 3),
            tiling(1, 1, 64, 64, 2),
            tiling(2, 2, 48, 64, 2),
            WgmmaTiling {
                persistent: 5,
                producer_warp: 1,
                ..tiling(1, 1, 48, 64, 3)
            },
            WgmmaTiling {
                persistent: 3,
                ..tiling(1, 2, 64, 64, 2)
            },
            // Pairs along N (two N tiles of 80) sharing A.
            WgmmaTiling {
                persistent: 4,
                cluster: 2,
                ..tiling(1, 1, 80, 64, 2)
            },
        ]
        .into_iter()
        .map(stored)
        .collect();
        assert_eq!(check(&t, &tilings), tilings.len(), "{t}");
    }
    let bmm = task(
        "batch_matmul",
        "3,128,80,64",
        DType::Bf16,
        Epilogue::default(),
    );
    let tilings = [
        stored(tiling(1, 1, 80, 64, 2)),
        stored(WgmmaTiling {
            persistent: 4,
            ..tiling(2, 1, 16, 32, 2)
        }),
    ];
    assert_eq!(check(&bmm, &tilings), tilings.len());
    let conv = task("conv2d", "2,24,6,6,48,1,1,1,0", DType::Fp16, fused);
    let tilings = [
        stored(tiling(1, 1, 48, 64, 2)),
        stored(tiling(1, 2, 16, 32, 1)),
    ];
    assert_eq!(check(&conv, &tilings), tilings.len());
    let tf32 = Task::new(parse_shape("conv2d", "2,64,8,8,96,1,1,1,0").unwrap(), fused)
        .unwrap()
        .with_types(DType::Tf32, DType::F32, Layout::Nhwc)
        .unwrap();
    let tilings = [
        stored(tiling(1, 1, 48, 64, 2)),
        stored(tiling(2, 1, 96, 128, 2)),
    ];
    assert_eq!(check(&tf32, &tilings), tilings.len());
    // Refused: a split tile's partial sums, and output rows of 36 halves (72 bytes)
    // where the inputs' rows are whole 16-byte multiples (the states valid without).
    let gpu = GpuSpec::h100();
    let t = task("matmul", "200,136,264", DType::Fp16, Epilogue::default());
    let split = split_state(tiling(1, 1, 48, 64, 2), 2);
    assert!(validate(&t.contraction(), &split, &gpu).is_ok());
    let split = split_state(stored(tiling(1, 1, 48, 64, 2)), 2);
    assert!(validate(&t.contraction(), &split, &gpu).is_err());
    let odd = task(
        "conv2d",
        "2,24,6,6,36,1,1,1,0",
        DType::Fp16,
        Epilogue::default(),
    );
    let plain = State::hopper(tiling(1, 1, 48, 64, 2));
    assert!(validate(&odd.contraction(), &plain, &gpu).is_ok());
    let state = State::hopper(stored(tiling(1, 1, 48, 64, 2)));
    assert!(validate(&odd.contraction(), &state, &gpu).is_err());
}

/// A missing proxy fence, a missing barrier before the store, a buffer rewritten
/// before its store read it (no `wait_group.read`) and a block that exits before its
/// stores read their buffers are each caught.
#[test]
fn broken_tma_stores_are_caught() {
    let t = task("matmul", "200,136,264", DType::Fp16, Epilogue::default());
    // Two blocks of three tiles, two chunks (64 rows, 64 columns) per tile.
    let state = State::hopper(WgmmaTiling {
        tma_store: 1,
        persistent: 3,
        ..tiling(1, 2, 64, 64, 2)
    });
    run(&t, &lower(&t, &state)).unwrap();
    let broken = |mutate: &dyn Fn(&mut Vec<Stmt>) -> bool| {
        let mut k = lower(&t, &state);
        assert!(mutate(&mut k.body), "the mutation applies");
        run(&t, &k).expect_err("a broken epilogue is caught")
    };
    let e = broken(&|b| without(b, &|s| matches!(s, Stmt::FenceProxyAsync)));
    assert!(e.contains("without a fence.proxy.async"), "{e}");
    // The barrier between the writes and the store.
    let e = broken(&|b| {
        let second = std::cell::Cell::new(0);
        without(b, &|s| {
            matches!(s, Stmt::NamedSync { .. }) && {
                second.set(second.get() + 1);
                second.get() == 2
            }
        })
    });
    assert!(e.contains("without a fence.proxy.async"), "{e}");
    // A tile's first chunk rewrites the buffer of the last tile's first store.
    let e = broken(&|b| {
        replaced(
            b,
            &|s| matches!(s, Stmt::BulkWait { pending: 1 }),
            &Stmt::BulkWait { pending: 2 },
        )
    });
    assert!(e.contains("may still read it"), "{e}");
    let e = broken(&|b| {
        replaced(
            b,
            &|s| matches!(s, Stmt::BulkWait { pending: 0 }),
            &Stmt::BulkWait { pending: 1 },
        )
    });
    assert!(e.contains("exits while"), "{e}");
}
