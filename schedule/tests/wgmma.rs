//! The `wgmma` sketch on the CPU interpreter: states of matmul, batch matmul and NHWC
//! 1×1 convolution (a K-major B) in fp16 and bf16 equal the definition on small shapes
//! with tails in M, N and K (an odd N too), every swizzle (32-, 64- and 128-byte K rows, and the N-major
//! boxes of 16, 32 and 64 columns), every pipeline depth and both MMA depths in flight.
//! The interpreter reads the operands where the descriptors say the hardware finds them,
//! from what the TMA boxes wrote. Mutation tests show that a missing `expect_tx`, a
//! missing wait for a full buffer, a missing `wgmma.fence`, a missing final
//! `wait_group` and a buffer released before its MMAs completed are each caught.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::interp::{self, Inputs};
use schedule::ir::{Kernel, Stmt};
use schedule::state::WgmmaTiling;
use schedule::{
    DType, Epilogue, GpuSpec, Layout, Sampler, State, Task, lower::lower, parse_shape, validate,
};

fn task(op: &str, shape: &str, dtype: DType, epilogue: Epilogue) -> Task {
    Task::new(parse_shape(op, shape).unwrap(), epilogue)
        .unwrap()
        .with_types(dtype, dtype, Layout::Nhwc)
        .unwrap()
}

/// Runs `kernel` on small integers and returns the interpreter's error or the first
/// wrong output element.
fn run(task: &Task, kernel: &Kernel) -> Result<(), String> {
    let c = task.contraction();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut ints =
        |n: u64| -> Vec<f32> { (0..n).map(|_| (rng.next_u32() % 5) as f32 - 2.0).collect() };
    let (a, b) = (ints(c.inputs[0].elements()), ints(c.inputs[1].elements()));
    let bias = c.bias.as_ref().map(|x| ints(x.elements()));
    let inputs = Inputs {
        inputs: [&a, &b],
        bias: bias.as_deref(),
    };
    let expected = interp::reference(&c, &inputs);
    let got = interp::run(kernel, &inputs, expected.len()).map_err(|e| e.to_string())?;
    match (0..got.len()).find(|&i| got[i] != expected[i]) {
        Some(i) => Err(format!("output {i} is {} not {}", got[i], expected[i])),
        None => Ok(()),
    }
}

fn tiling(consumers: u32, m_atoms: u32, block_n: u32, k_bytes: u32, stages: u32) -> WgmmaTiling {
    WgmmaTiling {
        consumers,
        m_atoms,
        block_n,
        k_bytes,
        stages,
        in_flight: u32::from(stages > 1),
        persistent: 0,
        producer_warp: 0,
    }
}

/// Checks `tilings` (those valid for the task) and returns how many ran.
fn check(task: &Task, tilings: &[WgmmaTiling]) -> usize {
    let (c, gpu) = (task.contraction(), GpuSpec::h100());
    let mut ran = 0;
    for t in tilings {
        let state = State::hopper(*t);
        if validate(&c, &state, &gpu).is_err() {
            continue;
        }
        let kernel = lower(task, &state);
        if let Err(e) = run(task, &kernel) {
            panic!("{task} {}: {e}", state.to_json());
        }
        ran += 1;
    }
    ran
}

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

#[test]
fn two_consumers_two_atoms_and_the_fused_epilogue() {
    let t = task(
        "matmul",
        "136,64,96",
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

#[test]
fn sampled_states_equal_the_definition() {
    let t = task("matmul", "100,80,120", DType::Fp16, Epilogue::default());
    let states: Vec<State> = Sampler::new(&t, &GpuSpec::h100(), 5)
        .sample_distinct(40)
        .into_iter()
        .filter(|s| s.wgmma.is_some())
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
    // A padded 3×3 convolution is not a plain matrix; an f32 matmul has no wgmma here;
    // 333×777×555 fp16 has rows that are not 16-byte multiples.
    for (op, shape, dtype) in [
        ("conv2d", "1,16,8,8,16,3,1,1,1", DType::Fp16),
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
    body.iter_mut().any(|s| match s {
        Stmt::For { body, .. } | Stmt::If { body, .. } | Stmt::Block { body } => without(body, hit),
        _ => false,
    })
}

/// Replaces the first statement that `hit` selects with `with`.
fn replaced(body: &mut [Stmt], hit: &impl Fn(&Stmt) -> bool, with: &Stmt) -> bool {
    for s in body.iter_mut() {
        if hit(s) {
            *s = with.clone();
            return true;
        }
        let nested = match s {
            Stmt::For { body, .. } | Stmt::If { body, .. } | Stmt::Block { body } => body,
            _ => continue,
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
}
