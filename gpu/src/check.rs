//! Exact correctness checking. Inputs are small integers, so every product and every
//! partial sum of a float32 contraction is an integer below 2^24 and therefore exact in
//! any summation order: a candidate must reproduce the reference output bit for bit
//! (up to the sign of zero), with no tolerance that could hide a missing tile.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::Task;
use serde::{Deserialize, Serialize};

/// The buffers of one task, in kernel parameter order (inputs, then the output).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Problem {
    /// Identifies the task; buffers and the expected output are reused while it repeats.
    pub key: String,
    /// Element counts of the input parameters (the two factors, then the bias if any).
    pub inputs: Vec<usize>,
    /// Element count of the output.
    pub output: usize,
    /// Products summed into each output element (sizes the value range).
    pub reduction: u64,
    /// Seed of the input values.
    pub seed: u64,
}

impl Problem {
    /// The buffers `task`'s kernels take (the two factors, the bias if the epilogue adds
    /// one, the output), with input values drawn from `seed`.
    pub fn for_task(task: &Task, seed: u64) -> Problem {
        let c = task.contraction();
        let mut inputs: Vec<usize> = c.inputs.iter().map(|a| a.elements() as usize).collect();
        if let Some(bias) = &c.bias {
            inputs.push(bias.elements() as usize);
        }
        Problem {
            key: task.key(),
            inputs,
            output: c.output_elements() as usize,
            reduction: c.reduction.iter().map(|a| u64::from(a.extent)).product(),
            seed,
        }
    }

    /// Largest magnitude of the input values that keeps every sum below 2^24 (at most 3;
    /// at least 1, which holds for any reduction shorter than 2^24 products).
    pub fn value_range(&self) -> i32 {
        (1..=3)
            .rev()
            .find(|&r| {
                let r = i64::from(r);
                (self.reduction as i64)
                    .saturating_mul(r * r)
                    .saturating_add(r)
                    < 1 << 24
            })
            .unwrap_or(1)
    }

    /// The input values: integers uniform in `-r..=r`, seeded.
    pub fn input_values(&self) -> Vec<Vec<f32>> {
        let r = self.value_range();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        self.inputs
            .iter()
            .map(|&len| {
                (0..len)
                    .map(|_| (rng.next_u64() % (2 * r as u64 + 1)) as f32 - r as f32)
                    .collect()
            })
            .collect()
    }

    /// Bytes of one set of buffers (inputs and output).
    pub fn bytes(&self) -> u64 {
        4 * (self.inputs.iter().sum::<usize>() + self.output) as u64
    }
}

/// Where a candidate's output first differs from the expected one.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub index: usize,
    pub expected: f32,
    pub got: f32,
    pub differing: usize,
    pub total: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "output[{}] = {}, expected {} ({} of {} elements differ)",
            self.index, self.got, self.expected, self.differing, self.total
        )
    }
}

/// The first element where `got` differs from `expected` (NaN never matches).
pub fn first_mismatch(expected: &[f32], got: &[f32]) -> Option<Mismatch> {
    if expected.len() != got.len() {
        return Some(Mismatch {
            index: expected.len().min(got.len()),
            expected: f32::NAN,
            got: f32::NAN,
            differing: expected.len().abs_diff(got.len()),
            total: expected.len(),
        });
    }
    let differs = |(e, g): (&f32, &f32)| e != g;
    let index = expected.iter().zip(got).position(differs)?;
    Some(Mismatch {
        index,
        expected: expected[index],
        got: got[index],
        differing: expected.iter().zip(got).filter(|&p| differs(p)).count(),
        total: expected.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(reduction: u64) -> Problem {
        Problem {
            key: "t".into(),
            inputs: vec![1000, 500],
            output: 10,
            reduction,
            seed: 7,
        }
    }

    #[test]
    fn problems_list_the_kernel_parameters_in_order() {
        let task = Task::new(
            schedule::parse_shape("conv2d", "1,64,56,56,128,3,3,2,1").unwrap(),
            schedule::Epilogue {
                bias: true,
                relu: true,
            },
        )
        .unwrap();
        let p = Problem::for_task(&task, 0);
        assert_eq!(p.inputs, vec![64 * 56 * 56, 128 * 64 * 9, 128]);
        assert_eq!(p.output, 128 * 28 * 28);
        assert_eq!(p.reduction, 64 * 9);
    }

    #[test]
    fn inputs_are_small_integers_seeded_and_cover_the_range() {
        let p = problem(4608);
        let values = p.input_values();
        assert_eq!(values, p.input_values());
        assert_eq!(values[0].len(), 1000);
        assert!(
            values
                .iter()
                .flatten()
                .all(|v| v.fract() == 0.0 && v.abs() <= 3.0)
        );
        for v in -3..=3 {
            assert!(values[0].contains(&(v as f32)), "{v} never drawn");
        }
        assert_ne!(values, Problem { seed: 8, ..p }.input_values());
    }

    #[test]
    fn the_range_shrinks_for_long_reductions_so_sums_stay_exact() {
        assert_eq!(problem(4608).value_range(), 3);
        assert_eq!(problem(1 << 21).value_range(), 2);
        assert_eq!(problem(1 << 23).value_range(), 1);
    }

    #[test]
    fn mismatch_names_the_first_differing_index_and_poison_never_matches() {
        let expected = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(first_mismatch(&expected, &[1.0, 2.0, 3.0, 4.0]), None);
        assert_eq!(first_mismatch(&[0.0], &[-0.0]), None);
        let m = first_mismatch(&expected, &[1.0, f32::NAN, 3.0, 5.0]).unwrap();
        assert_eq!((m.index, m.differing, m.total), (1, 2, 4));
        assert_eq!(
            m.to_string(),
            "output[1] = NaN, expected 2 (2 of 4 elements differ)"
        );
        assert!(first_mismatch(&expected, &[1.0]).is_some());
    }
}
