//! The device buffers a problem is measured on, and the one rule by which kernels are
//! launched on them. The tuner's measurement worker and the benchmark both use this
//! module, so that a kernel's time in a tuning log and in a benchmark report come from
//! the same buffers (the same number of rotated copies, the same input values) and the
//! same launch (the same zeroing of a split-K output inside the timed run): otherwise
//! their figures would not compare.
//!
//! A `BufferSets` holds several copies of a problem's buffers (its inputs, then its
//! output, in kernel parameter order). Copy 0 is filled with the problem's input values
//! and is the one checked; the others are device-to-device copies of its inputs, rotated
//! between timed launches so that L2 does not serve a working set it would not hold in
//! a real network (see `copy_count` for how many). Checks poison the output of copy 0
//! (every element the NaN of its type) before the kernel runs, so an element it never
//! writes cannot pass.
//!
//! Buffers hold the problem's element types (inputs and bias in `Problem::dtype`, the
//! output in `Problem::out_dtype`), sized in bytes by them; inputs are encoded on upload
//! and outputs decoded to f32, so that expected and candidate outputs compare as f32
//! values (exactly: fp16 and bf16 widen to f32 without rounding).

use crate::check::{Mismatch, Problem, first_inexact, first_mismatch};
use crate::compare::Comparer;
use crate::cuda::{Buffer, Context, CudaError, Function};
use crate::device::DeviceInfo;
use schedule::{DType, LaunchConfig};
use std::sync::Mutex;
use thiserror::Error;

/// Most buffer copies kept for rotation.
pub const MAX_COPIES: usize = 256;

/// How many copies of a problem's buffers (`problem_bytes` for one set) to rotate
/// through on `device`: enough that a rotation touches over twice the L2 before it comes
/// back to a copy, but at most `MAX_COPIES`, and no more than fit in a quarter of the
/// device's memory; always at least one. With the cap, a problem smaller than
/// `2 * L2 / MAX_COPIES` bytes (400 KiB with an H100's 50 MiB of L2) rotates through
/// less than twice the L2.
pub fn copy_count(problem_bytes: u64, device: &DeviceInfo) -> usize {
    let bytes = problem_bytes.max(1);
    let budget = device.memory_bytes / 4;
    let copies = (2 * device.l2_bytes)
        .div_ceil(bytes)
        .clamp(1, MAX_COPIES as u64)
        .min((budget / bytes).max(1));
    copies as usize
}

/// `bytes` for a person: GB with one decimal.
pub fn gigabytes(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

/// A reference kernel whose output cannot serve as the expected one.
#[derive(Debug, Clone, Error)]
pub enum ReferenceError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// It left an element NaN or infinite (unwritten, or a broken reference).
    #[error("the reference kernel left output[{index}] = {value}")]
    NotFinite { index: usize, value: f32 },
    /// It left an element that is not an integer of magnitude below `limit`, so not
    /// provably exact in the output type: the input values failed to bound the sums
    /// (see `check`), and a rounded expected value could hide a candidate's error.
    #[error(
        "the reference kernel left output[{index}] = {value}, not an integer of magnitude below {limit} (exact in {dtype}): the check's inputs do not bound this problem's sums"
    )]
    Inexact {
        index: usize,
        value: f32,
        dtype: DType,
        limit: u32,
    },
}

/// The rotated copies of one problem's buffers; see the module doc.
pub struct BufferSets {
    /// Each set holds the inputs, then the output; set 0 is the one checked.
    sets: Vec<Vec<Buffer>>,
    /// The scratch of kernels that take one (split-K), shared by every set: zeroed
    /// when allocated and before each check, grown for a kernel that needs more. A
    /// launch leaves its own semaphores zeroed, not another layout's.
    workspace: Mutex<Option<Buffer>>,
}

impl BufferSets {
    /// Allocates `copy_count` sets of `problem`'s buffers on `ctx` in its element types,
    /// uploads the problem's input values (encoded) to set 0 and copies them to the
    /// others; returns once the copies are complete. Outputs are left uninitialized.
    pub fn new(
        ctx: &Context,
        problem: &Problem,
        device: &DeviceInfo,
    ) -> Result<BufferSets, CudaError> {
        BufferSets::new_reporting(ctx, problem, device, &mut |_| {})
    }

    /// `new`, saying as each stage ends how long it took (`progress`): drawing the
    /// inputs, uploading them, copying the rotated sets. A multi-GB task spends seconds
    /// to minutes here.
    pub fn new_reporting(
        ctx: &Context,
        problem: &Problem,
        device: &DeviceInfo,
        progress: &mut dyn FnMut(String),
    ) -> Result<BufferSets, CudaError> {
        let started = std::time::Instant::now();
        let mut stage = |what: String| {
            progress(format!("{what} ({:.1} s)", started.elapsed().as_secs_f64()));
        };
        let alloc_set = || -> Result<Vec<Buffer>, CudaError> {
            let inputs = problem.inputs.iter().map(|&len| (len, problem.dtype));
            inputs
                .chain([(problem.output, problem.out_dtype)])
                .map(|(len, dtype)| ctx.alloc_typed(len, dtype))
                .collect()
        };
        let first = alloc_set()?;
        let values = problem.input_values();
        stage(format!("inputs drawn, {}", gigabytes(problem.bytes())));
        for (buffer, host) in first.iter().zip(values) {
            ctx.upload(buffer, &host)?;
        }
        stage("inputs uploaded".to_string());
        let copies = copy_count(problem.bytes(), device);
        let mut sets = Vec::with_capacity(copies);
        sets.push(first);
        for _ in 1..copies {
            let set = alloc_set()?;
            for (dst, src) in set.iter().zip(&sets[0]).take(problem.inputs.len()) {
                ctx.copy(dst, src)?;
            }
            sets.push(set);
        }
        ctx.synchronize_all()?;
        if copies > 1 {
            stage(format!("{copies} rotated copies made"));
        }
        Ok(BufferSets {
            sets,
            workspace: Mutex::new(None),
        })
    }

    /// The number of sets rotated through.
    pub fn count(&self) -> usize {
        self.sets.len()
    }

    /// The set of the `i`-th launch of a rotation (`i` modulo `count`): the inputs,
    /// then the output, in kernel parameter order. Set 0 is the checked one.
    pub fn set(&self, i: usize) -> &[Buffer] {
        &self.sets[i % self.sets.len()]
    }

    /// The output buffer of set `i` (modulo `count`).
    pub fn output(&self, i: usize) -> &Buffer {
        self.set(i).last().expect("a set ends with its output")
    }

    /// Enqueues one run of `function` on set `i` (modulo `count`), with the workspace
    /// its launch asks for after the buffers and the tensor maps it asks for encoded
    /// for that set's buffers, zeroing its output first, on the same stream, when
    /// `config.zero_output` asks for it (a split-K kernel adds into its output): the
    /// zeroing is part of the operation, so it falls inside every timed run, as it
    /// would in a network. The workspace is not: it is zeroed when allocated and
    /// before a check (`check`), and each launch leaves it as it found it.
    pub fn launch(
        &self,
        ctx: &Context,
        function: &Function,
        config: &LaunchConfig,
        i: usize,
    ) -> Result<(), CudaError> {
        self.launch_zeroing(ctx, function, config, i, false)
    }

    /// `launch`, zeroing the workspace first when `fresh`.
    fn launch_zeroing(
        &self,
        ctx: &Context,
        function: &Function,
        config: &LaunchConfig,
        i: usize,
        fresh: bool,
    ) -> Result<(), CudaError> {
        if config.zero_output {
            ctx.zero(self.output(i))?;
        }
        let mut params: Vec<&Buffer> = self.set(i).iter().collect();
        if config.workspace_bytes == 0 {
            return ctx.launch_mapped(function, config, &params);
        }
        let mut workspace = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let words = config.workspace_bytes.div_ceil(4) as usize;
        match workspace.as_ref() {
            Some(w) if w.len >= words => {
                if fresh {
                    ctx.zero(w)?;
                }
            }
            _ => {
                let w = ctx.alloc_typed(words, DType::F32)?;
                ctx.zero(&w)?;
                *workspace = Some(w);
            }
        }
        params.extend(workspace.as_ref());
        ctx.launch_mapped(function, config, &params)
    }

    /// The output that `run` leaves in set 0, decoded to f32: poisons the output first,
    /// then runs `run` on set 0 and downloads the output. For routines that launch
    /// themselves (vendor libraries); kernels go through `run_reference` and `check`.
    pub fn output_of<E: From<CudaError>>(
        &self,
        ctx: &Context,
        run: impl FnOnce(&[Buffer]) -> Result<(), E>,
    ) -> Result<Vec<f32>, E> {
        ctx.poison(self.output(0))?;
        run(self.set(0))?;
        Ok(ctx.download(self.output(0))?)
    }

    /// Runs the reference kernel on set 0 (output poisoned, then zeroed if the launch
    /// asks for it) and returns its output decoded to f32, the expected one of every
    /// candidate. An element left NaN or infinite is an error, since no candidate could
    /// match it; so is one not provably exact in the output type (`check`'s rule).
    pub fn run_reference(
        &self,
        ctx: &Context,
        function: &Function,
        config: &LaunchConfig,
    ) -> Result<Vec<f32>, ReferenceError> {
        let expected = self.output_of(ctx, |_| self.launch(ctx, function, config, 0))?;
        exact(expected, self.output(0).dtype)
    }

    /// Runs a candidate on set 0 like the reference and compares its output with
    /// `expected` exactly: the first mismatch, if any. Its workspace starts zeroed:
    /// another kernel may have left partial sums where this one keeps its semaphores,
    /// and every kernel is checked before it is timed.
    pub fn check(
        &self,
        ctx: &Context,
        function: &Function,
        config: &LaunchConfig,
        expected: &[f32],
    ) -> Result<Option<Mismatch>, CudaError> {
        let got = self.output_of(ctx, |_| self.launch_zeroing(ctx, function, config, 0, true))?;
        Ok(first_mismatch(expected, &got))
    }

    /// A device copy of set 0's output (in its element type): taken right after the
    /// reference run, it is the expected output `check_on_device` compares against.
    pub fn copy_output(&self, ctx: &Context) -> Result<Buffer, CudaError> {
        let out = self.output(0);
        let copy = ctx.alloc_typed(out.len, out.dtype)?;
        ctx.copy(&copy, out)?;
        Ok(copy)
    }

    /// `check` with the comparison on the GPU (`compare`), against `expected_device`
    /// (`copy_output` of the reference run): only a candidate that differs has its
    /// output copied back, and compared with `expected` on the host for the message.
    pub fn check_on_device(
        &self,
        ctx: &Context,
        comparer: &Comparer,
        function: &Function,
        config: &LaunchConfig,
        expected_device: &Buffer,
        expected: &[f32],
    ) -> Result<Option<Mismatch>, CudaError> {
        ctx.poison(self.output(0))?;
        self.launch_zeroing(ctx, function, config, 0, true)?;
        if comparer
            .first_difference(ctx, expected_device, self.output(0))?
            .is_none()
        {
            return Ok(None);
        }
        let got = ctx.download(self.output(0))?;
        Ok(first_mismatch(expected, &got))
    }
}

/// `output`, unless an element is NaN or infinite, or not an integer exact in
/// `dtype` (`check::first_inexact`).
fn exact(output: Vec<f32>, dtype: DType) -> Result<Vec<f32>, ReferenceError> {
    if let Some(index) = output.iter().position(|v| !v.is_finite()) {
        return Err(ReferenceError::NotFinite {
            index,
            value: output[index],
        });
    }
    match first_inexact(&output, dtype) {
        Some((index, limit)) => Err(ReferenceError::Inexact {
            index,
            value: output[index],
            dtype,
            limit,
        }),
        None => Ok(output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Simulated;

    /// A device with `l2` bytes of L2 and `memory` bytes of memory.
    fn device(l2: u64, memory: u64) -> DeviceInfo {
        DeviceInfo {
            l2_bytes: l2,
            memory_bytes: memory,
            ..Simulated::device(0)
        }
    }

    #[test]
    fn a_rotation_touches_over_twice_the_l2() {
        let d = device(50 << 20, 80 << 30);
        // 1 MB sets: 100 copies make 100 MB = 2 x L2.
        assert_eq!(copy_count(1 << 20, &d), 100);
        // One byte more per set still needs ceil(100 MB / set) copies.
        assert_eq!(copy_count((1 << 20) + 1, &d), 100);
        assert_eq!(copy_count(3 << 20, &d), 34);
        assert!(34 * (3u64 << 20) > 2 * d.l2_bytes);
    }

    #[test]
    fn tiny_problems_are_capped_at_max_copies() {
        let d = device(50 << 20, 80 << 30);
        assert_eq!(copy_count(4096, &d), MAX_COPIES);
        assert_eq!(copy_count(0, &d), MAX_COPIES);
        // The bench's old cap (64) would have stopped short of 2 x L2 here.
        assert!(copy_count(1 << 19, &d) > 64);
    }

    #[test]
    fn problems_over_twice_the_l2_get_one_copy() {
        let d = device(50 << 20, 80 << 30);
        assert_eq!(copy_count(200 << 20, &d), 1);
        // Even one that exceeds the memory budget: at least one set.
        assert_eq!(copy_count(100 << 30, &d), 1);
    }

    #[test]
    fn copies_fit_in_a_quarter_of_the_memory() {
        // 1 GB of memory, 256 MB budget; 2 x L2 = 1 GB would ask for 16 copies of 64 MB.
        let d = device(512 << 20, 1 << 30);
        assert_eq!(copy_count(64 << 20, &d), 4);
        assert_eq!(copy_count(100 << 20, &d), 2);
        assert_eq!(copy_count(300 << 20, &d), 1);
    }

    #[test]
    fn a_reference_output_must_be_finite() {
        let f32 = DType::F32;
        assert_eq!(exact(vec![1.0, -2.0], f32).unwrap(), vec![1.0, -2.0]);
        let e = exact(vec![1.0, f32::NAN, f32::INFINITY], f32).unwrap_err();
        assert!(matches!(e, ReferenceError::NotFinite { index: 1, .. }));
        assert_eq!(e.to_string(), "the reference kernel left output[1] = NaN");
        let e = exact(vec![f32::NEG_INFINITY], DType::Fp16).unwrap_err();
        assert_eq!(e.to_string(), "the reference kernel left output[0] = -inf");
    }

    #[test]
    fn a_reference_output_must_be_exact_in_its_type() {
        assert!(exact(vec![2047.0, -2047.0, 255.0], DType::Fp16).is_ok());
        let e = exact(vec![3.0, 256.0], DType::Bf16).unwrap_err();
        assert!(matches!(
            e,
            ReferenceError::Inexact {
                index: 1,
                limit: 256,
                dtype: DType::Bf16,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "the reference kernel left output[1] = 256, not an integer of magnitude below 256 (exact in bf16): the check's inputs do not bound this problem's sums"
        );
        assert!(matches!(
            exact(vec![0.5], DType::F32),
            Err(ReferenceError::Inexact { index: 0, .. })
        ));
    }
}
