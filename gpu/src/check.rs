//! Exact correctness checking: the problem a candidate is checked on (its buffers and
//! input values) and the comparison with the expected output. A candidate must
//! reproduce the reference output bit for bit (up to the sign of zero), with no
//! tolerance that could hide a missing tile. The input values make that possible in
//! every element type:
//!
//! (a) Inputs are integers `|x| <= r`, with `r` the largest of 1..=3 such that
//!     `reduction·r² + r < 2^24`: every product, every partial sum of the f32
//!     accumulation and the bias added to it is an integer below 2^24, exact in any
//!     summation order (products always accumulate in f32). The inputs themselves are
//!     exact in every type: fp16 holds the integers up to 2048, bf16 up to 256, a TF32
//!     multiplier up to 2048.
//! (b) An fp16 or bf16 output is the exact f32 result rounded once, and rounding can
//!     hide an error (2049 rounds to the fp16 2048). So every expected output must be
//!     exact in the output type too: an integer `|y| < L`, with `L` = 2048 for fp16 and
//!     256 for bf16 (strictly below: a rounded output of exactly `L` may be `L + 1`
//!     rounded down). Then `r = 1` and the two factors are sparse: each element is ±1
//!     with probability `d` and 0 otherwise, where `d <= 1` is the largest density with
//!     `reduction·d² <= (L/6)²` — a sum is then a ±1 random walk whose standard
//!     deviation is at most `L/6`, so `L` is six of them away. That bounds the outputs
//!     with high probability only, so the reference kernel's output is verified
//!     (`first_inexact`, applied to f32 outputs too, with `L` = 2^24): an output at or
//!     beyond `L` is an error of the reference, never a silent pass.

use crate::element::exact_integer_limit;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use schedule::{DType, Task};
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
    /// Element type of the inputs (and bias). Absent from the messages of workers that
    /// predate types: f32.
    #[serde(default)]
    pub dtype: DType,
    /// Element type of the output.
    #[serde(default)]
    pub out_dtype: DType,
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
            dtype: c.dtype,
            out_dtype: c.out_dtype,
        }
    }

    /// The bound `L` that rule (b) of the module doc keeps every output below: 2048 for
    /// an fp16 output, 256 for bf16; None for an f32 (or TF32) output, which rule (a)
    /// alone keeps exact.
    pub fn output_limit(&self) -> Option<u32> {
        matches!(self.out_dtype, DType::Fp16 | DType::Bf16)
            .then(|| exact_integer_limit(self.out_dtype))
    }

    /// Largest magnitude of the input values: 1 for a half output (rule (b)); otherwise
    /// the largest that keeps every sum below 2^24 (at most 3; at least 1, which holds
    /// for any reduction shorter than 2^24 products).
    pub fn value_range(&self) -> i32 {
        if self.output_limit().is_some() {
            return 1;
        }
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

    /// For a half output, the probability `d` that an element of either factor is
    /// non-zero (rule (b): the largest `d <= 1` with `reduction·d² <= (L/6)²`); None
    /// for an f32 output, whose inputs are dense.
    pub fn density(&self) -> Option<f64> {
        let limit = f64::from(self.output_limit()?);
        let reduction = self.reduction.max(1) as f64;
        Some((limit / 6.0 / reduction.sqrt()).min(1.0))
    }

    /// The input values, seeded: with an f32 output, integers uniform in `-r..=r`
    /// (`value_range`); with a half output, factors of ±1 at the density `density`
    /// and 0 elsewhere, and a bias uniform in -1..=1. One ChaCha8 stream in element
    /// order, generated in parallel chunks that each jump to their place in it (a
    /// multi-GB task's inputs take a fraction of a second, not a minute).
    pub fn input_values(&self) -> Vec<Vec<f32>> {
        self.input_values_in_chunks(1 << 20)
    }

    fn input_values_in_chunks(&self, chunk: usize) -> Vec<Vec<f32>> {
        use rayon::prelude::*;
        let r = self.value_range();
        let density = self.density();
        let stream = ChaCha8Rng::seed_from_u64(self.seed);
        let mut drawn = 0u128; // 64-bit draws before the current input
        self.inputs
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let mut values = vec![0.0f32; len];
                values
                    .par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(c, out)| {
                        let mut rng = stream.clone();
                        // Each draw takes two 32-bit words of the stream.
                        rng.set_word_pos(2 * (drawn + (c * chunk) as u128));
                        for v in out {
                            *v = match density {
                                // The two factors (the bias, input 2, is dense).
                                Some(d) if i < 2 => {
                                    let u = rng.next_u64();
                                    // The top 53 bits as a uniform fraction; the lowest
                                    // as the sign.
                                    let unit = (u >> 11) as f64 / (1u64 << 53) as f64;
                                    match (unit < d, u & 1) {
                                        (false, _) => 0.0,
                                        (true, 0) => 1.0,
                                        (true, _) => -1.0,
                                    }
                                }
                                _ => (rng.next_u64() % (2 * r as u64 + 1)) as f32 - r as f32,
                            };
                        }
                    });
                drawn += len as u128;
                values
            })
            .collect()
    }

    /// Bytes of one set of buffers (inputs and output), by element size.
    pub fn bytes(&self) -> u64 {
        self.input_bytes() + self.output_bytes()
    }

    fn input_bytes(&self) -> u64 {
        self.inputs.iter().sum::<usize>() as u64 * u64::from(self.dtype.bytes())
    }

    fn output_bytes(&self) -> u64 {
        self.output as u64 * u64::from(self.out_dtype.bytes())
    }

    /// Why one set of this problem's buffers cannot be allocated in `free` bytes of
    /// device memory, if it cannot (the rotated copies are fewer where memory is short,
    /// never fewer than one).
    pub fn exceeds(&self, free: u64) -> Option<String> {
        use crate::buffers::gigabytes;
        (self.bytes() > free).then(|| {
            format!(
                "its buffers take {} (inputs {}, output {}), more than the {} free on the GPU",
                gigabytes(self.bytes()),
                gigabytes(self.input_bytes()),
                gigabytes(self.output_bytes()),
                gigabytes(free)
            )
        })
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

/// The first expected output that rule (b) of the module doc does not allow: NaN, a
/// non-integer, or an integer of magnitude at or beyond what is exact in `out_dtype`
/// (2^24 for f32). Returns its index and the limit.
pub fn first_inexact(expected: &[f32], out_dtype: DType) -> Option<(usize, u32)> {
    let limit = exact_integer_limit(out_dtype);
    expected
        .iter()
        .position(|v| !(v.fract() == 0.0 && v.abs() < limit as f32))
        .map(|i| (i, limit))
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
            dtype: DType::F32,
            out_dtype: DType::F32,
        }
    }

    /// `problem(reduction)` with fp16/bf16 inputs and the given output type.
    fn typed(reduction: u64, dtype: DType, out_dtype: DType) -> Problem {
        Problem {
            dtype,
            out_dtype,
            ..problem(reduction)
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
    fn chunked_inputs_are_the_one_sequential_stream() {
        let task = Task::new(
            schedule::parse_shape("matmul", "33,17,29").unwrap(),
            Default::default(),
        )
        .unwrap();
        let p = Problem::for_task(&task, 7);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let r = p.value_range() as u64;
        let sequential: Vec<Vec<f32>> = p
            .inputs
            .iter()
            .map(|&len| {
                (0..len)
                    .map(|_| (rng.next_u64() % (2 * r + 1)) as f32 - r as f32)
                    .collect()
            })
            .collect();
        assert_eq!(p.input_values_in_chunks(5), sequential);
        assert_eq!(p.input_values_in_chunks(1 << 20), sequential);
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

    #[test]
    fn the_rule_by_reduction_and_output_type() {
        // (reduction, range and density with an f32, an fp16 and a bf16 output).
        type Rule = (i32, Option<f64>);
        let table: [(u64, [Rule; 3]); 5] = [
            (1, [(3, None), (1, Some(1.0)), (1, Some(1.0))]),
            (147, [(3, None), (1, Some(1.0)), (1, Some(1.0))]),
            (576, [(3, None), (1, Some(1.0)), (1, Some(1.0))]),
            // bf16: (256/6) / sqrt(4608) = 0.6285.
            (4608, [(3, None), (1, Some(1.0)), (1, Some(0.628539))]),
            // fp16: (2048/6) / 1024 = 1/3; bf16: (256/6) / 1024 = 1/24.
            (
                1 << 20,
                [(3, None), (1, Some(1.0 / 3.0)), (1, Some(1.0 / 24.0))],
            ),
        ];
        for (reduction, expected) in table {
            for (out, (range, density)) in [DType::F32, DType::Fp16, DType::Bf16]
                .into_iter()
                .zip(expected)
            {
                let dtype = if out == DType::F32 { DType::Fp16 } else { out };
                let p = typed(reduction, dtype, out);
                assert_eq!(p.value_range(), range, "{reduction} {out}");
                match (p.density(), density) {
                    (None, None) => {}
                    (Some(got), Some(want)) => {
                        assert!((got - want).abs() < 1e-6, "{reduction} {out}: {got}");
                        let limit = f64::from(p.output_limit().unwrap());
                        let sigma2 = reduction as f64 * got * got;
                        assert!(sigma2 <= (limit / 6.0).powi(2) * (1.0 + 1e-12));
                    }
                    other => panic!("{reduction} {out}: {other:?}"),
                }
            }
        }
        // Half inputs with an f32 output follow rule (a) alone, as f32 inputs do.
        assert_eq!(typed(4608, DType::Bf16, DType::F32).output_limit(), None);
        assert_eq!(typed(4608, DType::Tf32, DType::Tf32).output_limit(), None);
        assert_eq!(
            typed(4608, DType::Fp16, DType::Fp16).output_limit(),
            Some(2048)
        );
        assert_eq!(
            typed(4608, DType::Bf16, DType::Bf16).output_limit(),
            Some(256)
        );
    }

    #[test]
    fn f32_outputs_keep_the_values_they_always_had() {
        let f32_values = problem(4608).input_values();
        for dtype in [DType::Tf32, DType::Fp16, DType::Bf16] {
            assert_eq!(typed(4608, dtype, DType::F32).input_values(), f32_values);
        }
    }

    #[test]
    fn half_outputs_draw_sparse_unit_factors_and_a_dense_bias() {
        let p = Problem {
            inputs: vec![30_000, 30_000, 500],
            ..typed(1 << 20, DType::Fp16, DType::Fp16)
        };
        let values = p.input_values();
        assert_eq!(values, p.input_values(), "seeded");
        for factor in &values[..2] {
            assert!(factor.iter().all(|v| [-1.0, 0.0, 1.0].contains(v)));
            let nonzero = factor.iter().filter(|v| **v != 0.0).count() as f64;
            let density = nonzero / factor.len() as f64;
            // d = 1/3; the standard error over 30000 draws is 0.003.
            assert!((density - 1.0 / 3.0).abs() < 0.02, "{density}");
            let positive = factor.iter().filter(|v| **v > 0.0).count() as f64;
            assert!(
                (positive / nonzero - 0.5).abs() < 0.03,
                "signs are balanced"
            );
        }
        for v in [-1.0, 0.0, 1.0] {
            assert!(values[2].contains(&v), "bias {v} never drawn");
        }
        // A short reduction: every factor element non-zero.
        let dense = Problem {
            inputs: vec![1000, 1000],
            ..typed(576, DType::Bf16, DType::Bf16)
        };
        assert!(
            dense
                .input_values()
                .iter()
                .flatten()
                .all(|v| v.abs() == 1.0)
        );
    }

    #[test]
    fn bytes_count_element_sizes() {
        assert_eq!(problem(1).bytes(), 4 * 1510);
        assert_eq!(problem(1).exceeds(4 * 1510), None);
        let large = Problem {
            inputs: vec![1 << 30, 1 << 30],
            output: 1 << 28,
            ..problem(1)
        };
        assert_eq!(
            large.exceeds(8_000_000_000).as_deref(),
            Some(
                "its buffers take 9.7 GB (inputs 8.6 GB, output 1.1 GB), more than the 8.0 GB free on the GPU"
            )
        );
        assert_eq!(typed(1, DType::Fp16, DType::Fp16).bytes(), 2 * 1510);
        assert_eq!(typed(1, DType::Bf16, DType::F32).bytes(), 2 * 1500 + 4 * 10);
        assert_eq!(typed(1, DType::Tf32, DType::F32).bytes(), 4 * 1510);
    }

    #[test]
    fn problems_of_typed_tasks_carry_their_types_and_old_messages_read_as_f32() {
        let task = Task::new(
            schedule::parse_shape("matmul", "16,32,64").unwrap(),
            schedule::Epilogue::default(),
        )
        .unwrap()
        .with_types(DType::Bf16, DType::Bf16, schedule::Layout::Nchw)
        .unwrap();
        let p = Problem::for_task(&task, 3);
        assert_eq!((p.dtype, p.out_dtype), (DType::Bf16, DType::Bf16));
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Problem>(&json).unwrap(), p);
        let old = r#"{"key":"t","inputs":[4,4],"output":1,"reduction":4,"seed":0}"#;
        let old: Problem = serde_json::from_str(old).unwrap();
        assert_eq!((old.dtype, old.out_dtype), (DType::F32, DType::F32));
    }

    #[test]
    fn only_integers_exact_in_the_output_type_are_expected_values() {
        assert_eq!(first_inexact(&[0.0, -2047.0, 2047.0], DType::Fp16), None);
        // 2048 may be 2049 rounded down: not provably exact.
        assert_eq!(first_inexact(&[1.0, 2048.0], DType::Fp16), Some((1, 2048)));
        assert_eq!(first_inexact(&[255.0, -256.0], DType::Bf16), Some((1, 256)));
        assert_eq!(first_inexact(&[0.5], DType::F32), Some((0, 1 << 24)));
        assert_eq!(first_inexact(&[f32::NAN], DType::F32), Some((0, 1 << 24)));
        assert_eq!(first_inexact(&[16_777_215.0], DType::F32), None);
        assert_eq!(
            first_inexact(&[16_777_216.0], DType::Tf32),
            Some((0, 1 << 24))
        );
    }

    /// The inputs drawn for small contractions with half outputs, summed exactly on the
    /// CPU from the definition, stay within what the output type holds exactly; the
    /// rule is tight enough that the sums still spread.
    #[test]
    fn drawn_inputs_keep_exact_sums_within_the_output_type() {
        use schedule::{Epilogue, Layout, interp, parse_shape};
        let bias_relu = Epilogue {
            bias: true,
            relu: true,
        };
        let cases = [
            ("conv2d", "1,64,8,8,16,3,3,1,1", bias_relu, DType::Fp16),
            ("conv2d", "1,64,8,8,16,3,3,1,1", bias_relu, DType::Bf16),
            ("matmul", "8,8,4608", Epilogue::default(), DType::Bf16),
            ("matmul", "4,4,65536", Epilogue::default(), DType::Bf16),
            ("matmul", "2,2,1048576", Epilogue::default(), DType::Fp16),
        ];
        for (op, shape, epilogue, dtype) in cases {
            let task = Task::new(parse_shape(op, shape).unwrap(), epilogue)
                .unwrap()
                .with_types(dtype, dtype, Layout::Nhwc)
                .unwrap();
            for seed in 0..3 {
                let p = Problem::for_task(&task, seed);
                let values = p.input_values();
                let inputs = interp::Inputs {
                    inputs: [&values[0], &values[1]],
                    bias: values.get(2).map(Vec::as_slice),
                };
                let sums = interp::reference(&task.contraction(), &inputs);
                assert_eq!(first_inexact(&sums, dtype), None, "{task} seed {seed}");
                let limit = p.output_limit().unwrap() as f32;
                let largest = sums.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert!(largest > 0.0, "{task} seed {seed}: all zero");
                // Long reductions spread to a sizeable fraction of the limit.
                if p.density().unwrap() < 1.0 {
                    assert!(largest >= limit / 40.0, "{task}: {largest}");
                }
            }
        }
    }
}
