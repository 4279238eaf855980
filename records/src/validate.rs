//! Validation of a record read back from a log. A log is data from outside the process
//! (hand edits, other versions, damage), and every reader trusts what it gets: `best`
//! ranks by the time, `export` regenerates the state, `tune --resume` seeds mutation
//! and trains the model with it. So a record is only taken when its task is a valid
//! task with the recorded key, its state validates against that task on the device
//! that measured it, and a correct result has a finite positive time; anything else is
//! skipped like a line that does not parse.

use crate::record::Record;
use gpu::{Outcome, UnknownArch};
use schedule::sketch::cuda_core::check_structure;
use schedule::sketch::mma_sync::{MAX_WARPS, MmaTiling};
use schedule::state::{SketchTiling, WgmmaTiling};
use schedule::task::{Contraction, TaskError};
use schedule::{InvalidState, State, Task, validate};
use thiserror::Error;

/// Why a record that parsed is not taken.
#[derive(Debug, PartialEq, Error)]
pub enum InvalidRecord {
    #[error("invalid task: {0}")]
    Task(#[from] TaskError),
    #[error("task key {recorded} does not match the recorded shape, whose key is {shape}")]
    Key { recorded: String, shape: String },
    #[error("{0}")]
    UnknownArch(#[from] UnknownArch),
    #[error("invalid state for {task}: {error}")]
    State { task: String, error: InvalidState },
    #[error(
        "state of {task}: a tile of {what} is too large to compute (a product of split factors overflows 32 bits)"
    )]
    Overflow { task: String, what: &'static str },
    #[error("time {median_us} µs is not a finite positive number")]
    Time { median_us: f64 },
}

/// Checks that `task` is a task `Task::new` / `Task::with_types` would build: every
/// dimension positive, a non-empty convolution output, tensors within 32-bit indexing,
/// a layout its operator takes and a valid output type.
pub fn check_task(task: &Task) -> Result<(), InvalidRecord> {
    let rebuilt =
        Task::new(task.op, task.epilogue)?.with_types(task.dtype, task.out_dtype, task.layout)?;
    // `with_types` keeps matmuls NCHW whatever it is given: a recorded matmul with
    // another layout is not a task this tool builds.
    if rebuilt != *task {
        return Err(TaskError::LayoutNotConv {
            layout: task.layout,
            op: task.op.name(),
        }
        .into());
    }
    Ok(())
}

/// Checks the products of split factors that the schedule computes in 32 bits (tiles
/// per block and per thread, accumulators), so that validating a damaged state reports
/// it instead of overflowing. Valid states are far below these bounds.
fn check_products(task: &str, c: &Contraction, state: &State) -> Result<(), InvalidRecord> {
    match &state.tiling {
        SketchTiling::CudaCore => check_cuda_core_products(task, c, state),
        SketchTiling::MmaSync(m) => check_mma_products(task, m),
        SketchTiling::Wgmma(w) => check_wgmma_products(task, w),
    }
}

/// A `wgmma` state's products (rows per block, accumulators, threads) are computed in
/// 32 bits: bound the factors first.
fn check_wgmma_products(task: &str, w: &WgmmaTiling) -> Result<(), InvalidRecord> {
    if !(1..=2).contains(&w.consumers) || !(1..=2).contains(&w.m_atoms) || w.block_n > 256 {
        return Err(InvalidRecord::State {
            task: task.to_string(),
            error: InvalidState::WgmmaTiles {
                consumers: w.consumers,
                m_atoms: w.m_atoms,
                block_n: w.block_n,
                k_bytes: w.k_bytes,
            },
        });
    }
    Ok(())
}

fn overflow(task: &str, what: &'static str) -> InvalidRecord {
    InvalidRecord::Overflow {
        task: task.to_string(),
        what,
    }
}

fn check_mma_products(task: &str, m: &MmaTiling) -> Result<(), InvalidRecord> {
    let overflow = |what| overflow(task, what);
    let invalid = |error| InvalidRecord::State {
        task: task.to_string(),
        error,
    };
    // `validate_mma` multiplies the warp counts and the copy widths (by the element
    // size) before it bounds them: bound them first.
    if !(1..=MAX_WARPS).contains(&m.warps_m) || !(1..=MAX_WARPS).contains(&m.warps_n) {
        return Err(invalid(InvalidState::MmaTiles {
            block_m: m.block_m,
            block_n: m.block_n,
            warps_m: m.warps_m,
            warps_n: m.warps_n,
        }));
    }
    // No copy is wider than 16 bytes, so never more than 16 elements.
    if let Some((input, &width)) = m.vector.iter().enumerate().find(|(_, w)| **w > 16) {
        return Err(invalid(InvalidState::VectorWidth { input, width }));
    }
    if m.block_m.checked_add(m.block_n).is_none() {
        return Err(overflow("the block tile"));
    }
    let accumulators = 4 * u64::from(m.tiles_m()) * u64::from(m.tiles_n());
    match u32::try_from(accumulators) {
        Ok(_) => Ok(()),
        Err(_) => Err(overflow("accumulators per thread")),
    }
}

fn check_cuda_core_products(
    task: &str,
    c: &Contraction,
    state: &State,
) -> Result<(), InvalidRecord> {
    let overflow = |what| overflow(task, what);
    check_structure(c, state).map_err(|error| InvalidRecord::State {
        task: task.to_string(),
        error,
    })?;
    let fits = |factors: &[u32]| {
        factors
            .iter()
            .try_fold(1u32, |acc, &f| acc.checked_mul(f))
            .is_some()
    };
    let mut accumulators = 1u32;
    for s in &state.spatial {
        if !fits(&[s.vthread, s.thread, s.outer, s.inner]) {
            return Err(overflow("a spatial axis per block"));
        }
        accumulators = accumulators
            .checked_mul(s.register_tile())
            .ok_or_else(|| overflow("accumulators per thread"))?;
    }
    let threads: Vec<u32> = state.spatial.iter().map(|s| s.thread).collect();
    let vthreads: Vec<u32> = state.spatial.iter().map(|s| s.vthread).collect();
    if !fits(&threads) || !fits(&vthreads) {
        return Err(overflow("threads per block"));
    }
    for r in &state.reduction {
        if !fits(&[r.middle, r.inner]) {
            return Err(overflow("a reduction axis per stage"));
        }
    }
    Ok(())
}

/// Validates a record read from a log (see the module documentation).
pub fn check_record(record: &Record) -> Result<(), InvalidRecord> {
    check_task(&record.shape)?;
    let key = record.shape.key();
    if record.task != key {
        return Err(InvalidRecord::Key {
            recorded: record.task.clone(),
            shape: key,
        });
    }
    let spec = record.device.spec()?;
    let c = record.shape.contraction();
    check_products(&key, &c, &record.state)?;
    validate(&c, &record.state, &spec)
        .map_err(|error| InvalidRecord::State { task: key, error })?;
    if let Outcome::Ok(t) = &record.result
        && !(t.median_us.is_finite() && t.median_us > 0.0)
    {
        return Err(InvalidRecord::Time {
            median_us: t.median_us,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::{ok, record};
    use crate::record::{Log, parse_log};
    use gpu::{ErrorKind, Timing};
    use schedule::{DType, GpuSpec, Sampler, parse_shape};
    use serde_json::{Value, json};

    /// A valid record of a small conv2d (which has strides) as JSON.
    fn conv_record() -> Value {
        let task = Task::new(
            parse_shape("conv2d", "1,16,8,8,16,3,3,1,1").unwrap(),
            Default::default(),
        )
        .unwrap();
        let mut r = record("64,64,64", 1, ok(10.0));
        r.state = Sampler::new(&task, &GpuSpec::h100(), 3).sample().unwrap();
        r.task = task.key();
        r.shape = task;
        serde_json::to_value(&r).unwrap()
    }

    /// A log of one good record followed by `damaged`, parsed.
    fn parse_after_good(damaged: &Value) -> Log {
        let good = serde_json::to_string(&record("64,64,64", 2, ok(20.0))).unwrap();
        parse_log(&format!("{good}\n{damaged}\n"))
    }

    /// The damaged line is skipped as line 2 with a reason containing `reason`, and the
    /// good record stays.
    fn assert_skipped(damaged: &Value, reason: &str) {
        let log = parse_after_good(damaged);
        assert_eq!(log.records.len(), 1, "{damaged}");
        assert_eq!(log.records[0].median_us(), Some(20.0));
        assert_eq!(log.skipped.len(), 1, "{:?}", log.skipped);
        assert_eq!(log.skipped[0].line, 2);
        assert!(
            log.skipped[0].reason.contains(reason),
            "{:?} lacks {reason:?}",
            log.skipped[0].reason
        );
    }

    #[test]
    fn valid_records_pass() {
        assert_eq!(check_record(&record("64,64,64", 1, ok(10.0))), Ok(()));
        let conv: Record = serde_json::from_value(conv_record()).unwrap();
        assert_eq!(check_record(&conv), Ok(()));
        let failed = Outcome::error(ErrorKind::Timeout, "late");
        assert_eq!(check_record(&record("64,64,64", 1, failed)), Ok(()));
        assert!(parse_log(&conv_record().to_string()).skipped.is_empty());
    }

    #[test]
    fn a_shape_with_stride_0_is_skipped() {
        let mut r = conv_record();
        r["shape"]["stride_h"] = json!(0);
        assert_skipped(&r, "invalid task: stride_h must be at least 1");
        // With a key that matches it, too: the shape itself is refused.
        let mut r = conv_record();
        r["shape"]["stride_w"] = json!(0);
        r["task"] = json!("conv2d_n1_c16_h8_w8_k16_r3_s3_st1x0_p1");
        assert_skipped(&r, "stride_w must be at least 1");
    }

    #[test]
    fn a_matmul_with_a_conv_layout_or_a_bad_output_type_is_skipped() {
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["shape"]["layout"] = json!("nhwc");
        assert_skipped(&r, "applies to conv2d only");
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["shape"]["out_dtype"] = json!("fp16");
        assert_skipped(&r, "output type");
    }

    #[test]
    fn a_task_key_that_does_not_match_the_shape_is_skipped() {
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["task"] = json!("matmul_m128_n64_k64");
        assert_skipped(
            &r,
            "task key matmul_m128_n64_k64 does not match the recorded shape, whose key is matmul_m64_n64_k64",
        );
    }

    #[test]
    fn a_state_with_extra_split_levels_is_skipped() {
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        let extra = r["state"]["spatial"][0].clone();
        r["state"]["spatial"].as_array_mut().unwrap().push(extra);
        assert_skipped(
            &r,
            "state has 3 spatial splits, the task has 2 spatial axes",
        );
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        let extra = r["state"]["reduction"][0].clone();
        r["state"]["reduction"].as_array_mut().unwrap().push(extra);
        assert_skipped(&r, "reduction splits");
    }

    #[test]
    fn a_zero_thread_factor_is_skipped() {
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["state"]["spatial"][0]["thread"] = json!(0);
        assert_skipped(&r, "a split factor is 0");
        // A failed record too: its state would still seed a resumed search.
        let failed = Outcome::error(ErrorKind::Launch, "fault");
        let mut r = serde_json::to_value(record("64,64,64", 1, failed)).unwrap();
        r["state"]["reduction"][0]["middle"] = json!(0);
        assert_skipped(&r, "a split factor is 0");
    }

    #[test]
    fn a_state_the_device_cannot_run_is_skipped() {
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["state"]["spatial"][0]["thread"] = json!(2048);
        assert_skipped(&r, "threads per block");
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["device"]["compute_capability"] = json!([8, 6]);
        assert_skipped(&r, "no hardware table");
    }

    #[test]
    fn negative_zero_and_non_finite_times_are_skipped() {
        for us in [-5.0, 0.0, -0.0] {
            let r = serde_json::to_value(record("64,64,64", 1, ok(us))).unwrap();
            assert_skipped(&r, "is not a finite positive number");
        }
        // JSON has no NaN or infinity (serde_json writes null); a record built in memory
        // can hold them.
        for us in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let r = record(
                "64,64,64",
                1,
                Outcome::Ok(Timing {
                    median_us: us,
                    samples_us: vec![1.0],
                    raced: false,
                    precise: false,
                }),
            );
            assert!(
                matches!(check_record(&r), Err(InvalidRecord::Time { .. })),
                "{us}"
            );
        }
        let mut r = serde_json::to_value(record("64,64,64", 1, ok(10.0))).unwrap();
        r["result"]["ok"]["median_us"] = Value::Null;
        assert_eq!(parse_after_good(&r).skipped.len(), 1);
    }

    /// Extreme split factors are refused, never a panic (an overflow in the schedule's
    /// 32-bit tile products, or a division by a wrapped-around zero tile).
    #[test]
    fn huge_split_factors_are_refused_without_a_panic() {
        let extremes = [u32::MAX, 1 << 31, 1 << 16, 65537];
        let conv: Record = serde_json::from_value(conv_record()).unwrap();
        let base = record("64,64,64", 1, ok(10.0));
        for base in [&base, &conv] {
            for value in extremes {
                for field in 0..4 {
                    let set = |s: &mut schedule::state::SpatialSplit| {
                        *[&mut s.vthread, &mut s.thread, &mut s.outer, &mut s.inner][field] = value;
                    };
                    for axis in 0..base.state.spatial.len() {
                        let mut r = base.clone();
                        set(&mut r.state.spatial[axis]);
                        assert!(
                            check_record(&r).is_err(),
                            "spatial {axis}.{field} = {value}"
                        );
                    }
                    // Every axis at once: the products across axes too.
                    let mut r = base.clone();
                    r.state.spatial.iter_mut().for_each(set);
                    assert!(check_record(&r).is_err(), "spatial *.{field} = {value}");
                }
                for axis in 0..base.state.reduction.len() {
                    for field in 0..2 {
                        let mut r = base.clone();
                        let s = &mut r.state.reduction[axis];
                        *[&mut s.middle, &mut s.inner][field] = value;
                        assert!(check_record(&r).is_err(), "reduction {field} = {value}");
                    }
                }
                let mut r = base.clone();
                r.state.split_k = value;
                r.state.unroll_max_step = value;
                r.state.vector_width = [value, value];
                assert!(check_record(&r).is_err());
            }
        }
        // A tensor-core state.
        let task = Task::new(
            parse_shape("matmul", "64,64,64").unwrap(),
            Default::default(),
        )
        .unwrap()
        .with_types(DType::Fp16, DType::F32, Default::default())
        .unwrap();
        let states = Sampler::new(&task, &GpuSpec::h100(), 1).sample_distinct(16);
        let mut tc = base.clone();
        tc.state = states.iter().find(|s| s.mma().is_some()).unwrap().clone();
        tc.task = task.key();
        tc.shape = task;
        let mut hopper = tc.clone();
        hopper.state = states.iter().find(|s| s.wgmma().is_some()).unwrap().clone();
        assert_eq!(check_record(&hopper), Ok(()));
        for value in extremes {
            for field in 0..6 {
                let mut r = hopper.clone();
                let Some(w) = r.state.wgmma_mut() else {
                    unreachable!()
                };
                *[
                    &mut w.consumers,
                    &mut w.m_atoms,
                    &mut w.block_n,
                    &mut w.k_bytes,
                    &mut w.stages,
                    &mut w.in_flight,
                ][field] = value;
                assert!(check_record(&r).is_err(), "wgmma field {field} = {value}");
            }
        }
        assert_eq!(check_record(&tc), Ok(()));
        for value in extremes.into_iter().chain([0]) {
            for field in 0..7 {
                let mut r = tc.clone();
                let Some(m) = r.state.mma_mut() else {
                    unreachable!()
                };
                *[
                    &mut m.block_m,
                    &mut m.block_n,
                    &mut m.warps_m,
                    &mut m.warps_n,
                    &mut m.k_steps,
                    &mut m.stages,
                    &mut m.vector[0],
                ][field] = value;
                assert!(check_record(&r).is_err(), "mma field {field} = {value}");
            }
            let mut r = tc.clone();
            if let Some(m) = r.state.mma_mut() {
                (m.block_m, m.block_n) = (value & !127, value & !127);
            }
            let _ = check_record(&r);
        }
    }
}
