//! Mutations of a state, as the evolutionary search uses them: each sketch mutates its
//! own states (`Sketch::mutate`). The CUDA-core sketch's are Ansor's, with the split,
//! prefetch and layout moves beyond it (`schedule::sketch::cuda_core::steps`). A
//! tensor-core state has no factor lattice: its coordinates are its tiling's fields,
//! and a mutation moves one of them to a neighbouring value
//! (`schedule::sketch::mma_sync::steps`, `schedule::sketch::wgmma::steps`), drawn
//! uniformly among the moves that give a valid state. Nothing is refitted afterwards,
//! so a mutant differs from its parent in exactly one coordinate.

use rand_chacha::ChaCha8Rng;
use schedule::task::Contraction;
use schedule::{GpuSpec, State};

/// A valid mutant of `state`, or None if the drawn mutation gave none.
pub fn mutate(
    state: &State,
    c: &Contraction,
    gpu: &GpuSpec,
    rng: &mut ChaCha8Rng,
) -> Option<State> {
    state.sketch().mutate(c, state, gpu, rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use schedule::sketch::cuda_core::steps::{fit_split_k, layout_steps, layouts};
    use schedule::sketch::mma_sync;
    use schedule::sketch::mma_sync::MmaCoordinate;
    use schedule::sketch::mma_sync::MmaTiling;
    use schedule::validate;
    use schedule::{Sampler, Task, parse_shape};

    #[test]
    fn mutants_are_valid_different_and_keep_the_extent_covered() {
        let gpu = GpuSpec::h100();
        for (op, shape) in [
            ("conv2d", "1,64,56,56,64,3,3,1,1"),
            ("matmul", "333,777,555"),
        ] {
            let task = Task::new(parse_shape(op, shape).unwrap(), Default::default()).unwrap();
            let c = task.contraction();
            let mut sampler = Sampler::new(&task, &gpu, 3);
            let mut rng = ChaCha8Rng::seed_from_u64(5);
            let mut made = 0;
            for _ in 0..200 {
                let s = sampler.sample().unwrap();
                if let Some(m) = mutate(&s, &c, &gpu, &mut rng) {
                    made += 1;
                    assert_ne!(m, s);
                    assert!(validate(&c, &m, &gpu).is_ok());
                    for (split, axis) in m.spatial.iter().zip(&c.spatial) {
                        assert!(split.block_tile() <= axis.extent + axis.extent / 4);
                    }
                }
            }
            assert!(made > 50, "{op}: only {made} of 200 mutations succeeded");
        }
    }

    #[test]
    fn split_mutations_double_or_halve_within_the_stages() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("conv2d", "1,512,7,7,512,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let mut sampler = Sampler::new(&task, &gpu, 8);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (mut doubled, mut halved) = (0, 0);
        for _ in 0..400 {
            let s = sampler.sample().unwrap();
            let Some(m) = mutate(&s, &c, &gpu, &mut rng) else {
                continue;
            };
            assert!(m.split_k.is_power_of_two() && u64::from(m.split_k) <= m.stages(&c));
            let same_tiles = m.spatial == s.spatial && m.reduction == s.reduction;
            if same_tiles && m.split_k == 2 * s.split_k {
                doubled += 1;
            } else if same_tiles && 2 * m.split_k == s.split_k {
                halved += 1;
            }
        }
        assert!(
            doubled > 5 && halved > 5,
            "doubled {doubled}, halved {halved}"
        );
    }

    #[test]
    fn layout_mutations_change_one_input_and_nothing_else() {
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("matmul", "1024,1024,1024").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = task.contraction();
        let mut sampler = Sampler::new(&task, &gpu, 4);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut changed = [0; 2];
        for _ in 0..400 {
            let s = sampler.sample().unwrap();
            let Some(m) = mutate(&s, &c, &gpu, &mut rng) else {
                continue;
            };
            let same_rest = State {
                shared_layout: s.shared_layout,
                ..m.clone()
            } == s;
            if same_rest {
                let inputs: Vec<usize> = (0..2)
                    .filter(|&i| m.shared_layout[i] != s.shared_layout[i])
                    .collect();
                assert_eq!(inputs.len(), 1, "{m:?} vs {s:?}");
                assert!(layouts(&c, inputs[0]).contains(&m.shared_layout[inputs[0]]));
                changed[inputs[0]] += 1;
            }
        }
        assert!(changed[0] > 5 && changed[1] > 5, "changed {changed:?}");
        // A: m innermost or not, 4 pads; B: 4 pads only. One step changes one of them.
        assert_eq!(layouts(&c, 0).len(), 8);
        assert_eq!(layouts(&c, 1).len(), 4);
        let s = sampler.sample().unwrap();
        assert_eq!(layout_steps(&c, &s, 0).len(), 4);
        assert_eq!(layout_steps(&c, &s, 1).len(), 3);
    }

    /// An fp16 NHWC ResNet layer and an fp16 matmul, each with a valid tensor-core
    /// state in the middle of every coordinate's range.
    fn tensor_core_cases() -> Vec<(Task, State)> {
        use schedule::{DType, Layout};
        let tiling = MmaTiling {
            block_m: 64,
            block_n: 64,
            warps_m: 2,
            warps_n: 2,
            k_steps: 2,
            stages: 2,
            vector: [4, 4],
            swizzle: true,
            row_span: false,
            persistent: 0,
            stream_k: 0,
        };
        [
            ("conv2d", "1,64,56,56,64,3,3,1,1"),
            ("matmul", "512,512,512"),
        ]
        .into_iter()
        .map(|(op, shape)| {
            let task = Task::new(parse_shape(op, shape).unwrap(), Default::default())
                .unwrap()
                .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
                .unwrap();
            let state = State::tensor_core(tiling, 2);
            assert_eq!(
                validate(&task.contraction(), &state, &GpuSpec::h100()),
                Ok(())
            );
            (task, state)
        })
        .collect()
    }

    /// The coordinates in which two tensor-core states differ: a row-span toggle alone
    /// for one, which carries its copy widths and k-steps along.
    fn changed(a: &State, b: &State) -> Vec<MmaCoordinate> {
        let moved: Vec<MmaCoordinate> = MmaCoordinate::ALL
            .into_iter()
            .filter(|k| k.get(a) != k.get(b))
            .collect();
        if moved.contains(&MmaCoordinate::RowSpan) {
            return vec![MmaCoordinate::RowSpan];
        }
        moved
    }

    #[test]
    fn tensor_core_mutants_move_one_coordinate_to_a_neighbouring_value() {
        let gpu = GpuSpec::h100();
        for (task, start) in tensor_core_cases() {
            let c = task.contraction();
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let mut seen = std::collections::HashSet::new();
            let mut s = start.clone();
            for i in 0..400 {
                let m = mutate(&s, &c, &gpu, &mut rng).expect("a valid move exists");
                assert!(validate(&c, &m, &gpu).is_ok());
                assert!(m.mma().is_some() && m.spatial.is_empty());
                let moved = changed(&s, &m);
                assert_eq!(moved.len(), 1, "{s:?} -> {m:?}");
                let k = moved[0];
                let (from, to) = (k.get(&s), k.get(&m));
                let neighbouring = match k {
                    MmaCoordinate::Stages => from.abs_diff(to) == 1,
                    MmaCoordinate::Swizzle
                    | MmaCoordinate::SplitSums
                    | MmaCoordinate::RowSpan
                    | MmaCoordinate::Persistent
                    | MmaCoordinate::StreamK => true,
                    _ => to == 2 * from || 2 * to == from,
                };
                assert!(neighbouring, "{k:?}: {from} -> {to}");
                seen.insert(k);
                // Walk on, back to the start every few moves so that the walk stays
                // where every coordinate can move.
                s = if i % 5 == 4 { start.clone() } else { m };
            }
            // Neither task has row spans (64 channels; a matmul), nor persistent grids.
            assert_eq!(
                seen.len(),
                MmaCoordinate::ALL.len() - 2,
                "{}: {seen:?}",
                task.key()
            );
        }
    }

    /// A stem's state turns row spans on with their copy widths and the least k-steps
    /// that hold a 7-tap filter row, and off again to one-element copies.
    #[test]
    fn row_spans_toggle_with_their_copy_widths() {
        use schedule::{DType, Layout};
        let gpu = GpuSpec::h100();
        let task = Task::new(
            parse_shape("conv2d", "1,3,224,224,64,7,7,2,3").unwrap(),
            Default::default(),
        )
        .unwrap()
        .with_types(DType::Fp16, DType::Fp16, Layout::Nhwc)
        .unwrap();
        let c = task.contraction();
        let plain = State::tensor_core(
            MmaTiling {
                block_m: 64,
                block_n: 64,
                warps_m: 4,
                warps_n: 2,
                k_steps: 2,
                stages: 3,
                vector: [1, 1],
                swizzle: true,
                row_span: false,
                persistent: 0,
                stream_k: 0,
            },
            1,
        );
        assert!(validate(&c, &plain, &gpu).is_ok());
        let spans: Vec<State> = mma_sync::steps::steps(&c, &plain, &gpu)
            .into_iter()
            .filter(|s| s.mma().is_some_and(|t| t.row_span))
            .collect();
        assert_eq!(spans.len(), 1);
        let t = spans[0].mma().unwrap();
        assert_eq!((t.vector, t.k_steps), ([8, 1], 2));
        let back: Vec<State> = mma_sync::steps::steps(&c, &spans[0], &gpu)
            .into_iter()
            .filter(|s| s.mma().is_some_and(|t| !t.row_span))
            .collect();
        assert_eq!(back, vec![plain]);
    }

    #[test]
    fn tensor_core_steps_are_every_valid_single_move() {
        let gpu = GpuSpec::h100();
        for (task, s) in tensor_core_cases() {
            let c = task.contraction();
            let steps = mma_sync::steps::steps(&c, &s, &gpu);
            // 11 coordinates, two directions each but the swizzle's and the split
            // sums' one.
            assert!(steps.len() >= 12 && steps.len() <= 20, "{}", steps.len());
            for n in &steps {
                assert_eq!(changed(&s, n).len(), 1);
                assert!(validate(&c, n, &gpu).is_ok());
            }
            // A CUDA-core state has none.
            let f32_task = Task::new(
                parse_shape("matmul", "512,512,512").unwrap(),
                Default::default(),
            )
            .unwrap();
            let cuda = Sampler::new(&f32_task, &gpu, 1).sample().unwrap();
            assert!(mma_sync::steps::steps(&f32_task.contraction(), &cuda, &gpu).is_empty());
        }
    }

    #[test]
    fn relu_tasks_never_split_and_tile_changes_refit_the_split() {
        let gpu = GpuSpec::h100();
        let relu = schedule::Epilogue {
            bias: true,
            relu: true,
        };
        let task = Task::new(parse_shape("matmul", "64,64,1024").unwrap(), relu).unwrap();
        let c = task.contraction();
        let mut sampler = Sampler::new(&task, &gpu, 1);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let s = sampler.sample().unwrap();
            if let Some(m) = mutate(&s, &c, &gpu, &mut rng) {
                assert_eq!(m.split_k, 1);
            }
        }
        // 64 stages split 64 ways; a stage 4x as long leaves 16 stages: split 16.
        let plain = Task::new(
            parse_shape("matmul", "64,64,1024").unwrap(),
            Default::default(),
        )
        .unwrap();
        let c = plain.contraction();
        let mut s = sampler.sample().unwrap();
        s.reduction[0] = schedule::state::ReductionSplit {
            middle: 4,
            inner: 4,
        };
        s.split_k = 64;
        fit_split_k(&c, &mut s);
        assert_eq!(s.split_k, 64);
        s.reduction[0].middle = 16;
        fit_split_k(&c, &mut s);
        assert_eq!(s.split_k, 16);
    }

    #[test]
    fn mutating_tensor_core_states_never_panics() {
        use schedule::{DType, Layout, Sampler};
        let gpu = GpuSpec::h100();
        for (op, shape) in [
            ("conv2d", "1,512,7,7,512,3,3,1,1"),
            ("matmul", "333,777,555"),
        ] {
            let task = schedule::Task::new(
                schedule::parse_shape(op, shape).unwrap(),
                Default::default(),
            )
            .unwrap()
            .with_types(DType::Fp16, DType::F32, Layout::Nhwc)
            .unwrap();
            let c = task.contraction();
            let states = Sampler::new(&task, &gpu, 1).sample_distinct(20);
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            for s in &states {
                for _ in 0..50 {
                    if let Some(m) = mutate(s, &c, &gpu, &mut rng) {
                        assert_eq!(validate(&c, &m, &gpu), Ok(()));
                    }
                }
            }
        }
    }
}
