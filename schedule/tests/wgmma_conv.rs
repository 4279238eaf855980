//! The `wgmma` sketch's convolutions on the CPU interpreter (issue 30): TMA's im2col
//! mode reads the activations by output pixel (`atom::tma::Im2col`), the weights come as
//! a tiled map with a dimension per filter tap, and a K tile is one tap's run of
//! channels. States equal the definition on small NHWC shapes with stride 1 and 2,
//! padding (symmetric, asymmetric, and wider than the filter's reach), dilation, groups,
//! a 1×1 strided layer, channel tails (a K tile wider than the channels), one image and
//! several, tails in M and N, every pipeline depth, warp specialization, persistent
//! blocks, clusters that multicast A's rows, and split-K (ordered and atomic), in fp16
//! and bf16 with the fused epilogue. Mutation tests show that a walk without the filter
//! offsets, or from the wrong corner, is caught; the interpreter refuses a copy whose
//! base pixel lies outside the bounding box (the GPU faults on it).

use schedule::ir::{Expr, Stmt};
use schedule::state::{SplitSums, WgmmaTiling};
use schedule::{DType, Epilogue, GpuSpec, State, Task, lower::lower, validate};

mod support;
use support::wgmma::{check, check_split, check_states, edit_all, run, task, tiling};

const FUSED: Epilogue = Epilogue {
    bias: true,
    relu: true,
};

/// Tilings of every K row width (16, 32 and 64 fp16 channels per tap and K tile), depths
/// 1 to 4, one and two consumer warpgroups, narrow and wide N.
fn tilings() -> Vec<WgmmaTiling> {
    vec![
        tiling(1, 1, 32, 32, 1),
        tiling(1, 1, 24, 64, 2),
        tiling(1, 1, 48, 128, 3),
        tiling(2, 1, 16, 32, 4),
        tiling(1, 2, 40, 64, 2),
        WgmmaTiling {
            producer_warp: 1,
            ..tiling(1, 1, 32, 64, 3)
        },
    ]
}

#[test]
fn convolutions_walk_their_windows() {
    for (shape, dtype, epilogue) in [
        // 3×3, padding 1, stride 1, two images: tiles cross rows and images.
        ("2,16,6,6,24,3,3,1,1", DType::Fp16, Epilogue::default()),
        // Stride 2 and an odd input: the walk steps two pixels.
        ("2,16,17,17,32,3,3,2,1", DType::Bf16, FUSED),
        // 24 channels: a 32- or 64-channel K tile's tail is zeros in both operands.
        ("2,24,7,7,40,3,3,1,1", DType::Fp16, FUSED),
        // A 1×1 stride-2 downsample: no taps, a strided walk.
        ("8,32,8,8,40,1,1,2,0", DType::Fp16, Epilogue::default()),
        // 5×5 with padding 2.
        ("2,16,8,8,16,5,5,1,2", DType::Bf16, Epilogue::default()),
    ] {
        let t = task("conv2d", shape, dtype, epilogue);
        let tilings = tilings();
        assert_eq!(check(&t, &tilings), tilings.len(), "{shape}");
    }
}

#[test]
fn every_pipeline_depth() {
    // 9 taps of one 16-channel K tile: rings of 1 to 8 buffers wrap within the filter.
    let t = task("conv2d", "2,16,6,6,24,3,3,1,1", DType::Fp16, FUSED);
    let depths: Vec<WgmmaTiling> = (1..=schedule::state::MAX_WGMMA_STAGES)
        .map(|stages| tiling(1, 1, 24, 32, stages))
        .collect();
    assert_eq!(check(&t, &depths), depths.len());
}

#[test]
fn dilation_asymmetric_padding_and_groups() {
    for shape in [
        // Dilation 2: offsets step two pixels.
        "n=1,c=16,h=9,w=10,k=24,r=3,s=3,pad=2,dilation=2",
        // Asymmetric padding and strides: corners differ per side and dimension.
        "n=2,c=16,h=9,w=8,k=16,r=3,s=2,stride_h=2,stride_w=1,pad_h=1,pad_w=0,pad_bottom=2,pad_right=1",
        // Two groups of 16 channels: the group picks its channels in A, its weights in B.
        "n=2,c=32,h=8,w=8,k=48,r=3,s=3,pad=1,groups=2",
        // Padding wider than the filter reaches: the border outputs read only zeros.
        "n=4,c=16,h=4,w=4,k=16,r=1,s=1,pad=1",
    ] {
        let t = task("conv2d", shape, DType::Fp16, FUSED);
        let tilings = tilings();
        assert_eq!(check(&t, &tilings), tilings.len(), "{shape}");
    }
}

#[test]
fn persistent_clustered_and_split_convolutions() {
    let t = task("conv2d", "2,32,6,6,48,3,3,1,1", DType::Fp16, FUSED);
    let clustered = |t: WgmmaTiling| WgmmaTiling { cluster: 2, ..t };
    let tilings = [
        // Persistent blocks, and pairs along N that multicast halves of A's rows.
        WgmmaTiling {
            persistent: 3,
            ..tiling(1, 1, 24, 64, 2)
        },
        clustered(tiling(1, 1, 24, 64, 2)),
        clustered(tiling(1, 2, 24, 32, 3)),
    ];
    assert_eq!(check(&t, &tilings), tilings.len());
    // One image of 81 output pixels in tiles of 64 rows: the second tile's second half
    // starts past the last pixel, which must stay a base pixel inside the bounding box
    // (an image past the last, zeros), or the copy faults.
    let one = task("conv2d", "1,32,9,9,48,3,3,1,1", DType::Fp16, FUSED);
    let paired = [clustered(tiling(1, 1, 24, 64, 2))];
    assert_eq!(check(&one, &paired), 1);
    // 9 taps of one or two K tiles: splits of 2 to 9 (the last chunk of 2 and 5 runs
    // past the filter).
    let split = [
        (tiling(1, 1, 48, 64, 2), 2),
        (tiling(1, 1, 24, 32, 3), 5),
        (tiling(1, 1, 16, 64, 1), 9),
    ];
    assert_eq!(check_split(&t, &split), split.len());
    let gpu = GpuSpec::h100();
    for (tiling, split_k) in split {
        let state = State {
            split_k,
            split_sums: SplitSums::Atomic,
            ..State::hopper(tiling)
        };
        validate(&t.contraction(), &state, &gpu).unwrap();
        run(&t, &lower(&t, &state)).unwrap();
    }
}

/// Clusters of 2 × 2, 4 × 1, 2 × 4 and 8 × 1 blocks over im2col boxes (A's rows dealt
/// along a cluster row) and a K-major B (its rows dealt down a column): 4 M tiles of
/// 64 output pixels over two images (padded to 8 for 8 × 1: the padding tiles' rows
/// lie in images past the last, zeros), unsplit, split into ordered and atomic sums,
/// and persistent.
#[test]
fn convolutions_in_clusters_of_rectangles() {
    let t = task("conv2d", "2,32,10,10,64,3,3,1,1", DType::Fp16, FUSED);
    let base = tiling(1, 1, 32, 64, 2);
    let split = |t: WgmmaTiling, split_k, split_sums| State {
        split_k,
        split_sums,
        ..State::hopper(t)
    };
    let states = [
        State::hopper(base.with_cluster_shape(2, 2)),
        State::hopper(base.with_cluster_shape(4, 1)),
        State::hopper(tiling(1, 1, 16, 64, 3).with_cluster_shape(2, 4)),
        State::hopper(tiling(1, 1, 64, 64, 2).with_cluster_shape(8, 1)),
        split(base.with_cluster_shape(2, 2), 3, SplitSums::Ordered),
        split(base.with_cluster_shape(4, 1), 2, SplitSums::Atomic),
        State::hopper(
            WgmmaTiling {
                persistent: 4,
                ..base
            }
            .with_cluster_shape(2, 2),
        ),
    ];
    assert_eq!(check_states(&t, &states), states.len());
}

/// A change to a TMA load's coordinates.
type CoordinateEdit = fn(&mut Vec<Expr>);

#[test]
fn broken_walks_are_caught() {
    let t: Task = task(
        "conv2d",
        "1,16,6,6,16,3,3,1,1",
        DType::Fp16,
        Epilogue::default(),
    );
    let state = State::hopper(tiling(1, 1, 16, 32, 2));
    validate(&t.contraction(), &state, &GpuSpec::h100()).unwrap();
    let kernel = lower(&t, &state);
    run(&t, &kernel).unwrap();
    let first_map = kernel
        .params
        .iter()
        .position(|p| matches!(p, schedule::ir::Param::TensorMap { .. }))
        .unwrap();
    // Without the filter offsets every tap reads the base pixel; from the tensor's
    // corner rather than the padding's, every window is shifted.
    let breaks: [(&str, CoordinateEdit); 2] = [
        ("offsets", |c| {
            let n = c.len();
            c[n - 2] = Expr::Const(0);
            c[n - 1] = Expr::Const(0);
        }),
        ("corner", |c| {
            c[1] = Expr::Add(Box::new(c[1].clone()), Box::new(Expr::Const(1)));
        }),
    ];
    for (what, edit) in breaks {
        let mut broken = kernel.clone();
        let edited = edit_all(&mut broken.body, &|s| match s {
            Stmt::TmaLoad { map, coords, .. } if *map == first_map => {
                edit(coords);
                true
            }
            _ => false,
        });
        assert!(edited > 0, "{what}: no im2col load");
        assert!(run(&t, &broken).is_err(), "{what}: not caught");
    }
}
