//! The timing protocol, shared by candidates and the vendor baselines.
//!
//! Warm-up launches first, then timed repeats, each launch between its own pair of CUDA
//! events, until the timed runs add up to a minimum time and a minimum count; the median
//! is reported and every sample kept. The caller rotates buffer copies between launches
//! so that L2 never serves a working set it would not hold in a real network.
//!
//! Before each batch of timed launches a one-thread "spin" kernel busy-waits on the GPU
//! long enough for the CPU to enqueue the whole batch (the blocking-kernel idea of
//! NVIDIA's nvbench): the GPU then runs the events and kernels back to back, so the
//! launch latency of the CPU never lands inside a sample.
//!
//! A tuner may race a candidate against its task's best (`TimingConfig::race_us`): one
//! warm-up launch and a probe of `RACE_PROBE` samples come first, and a candidate whose
//! fastest sample is over `1 + RACE_MARGIN` times the best stops there (`Timing::raced`),
//! since no more samples could make it the winner; any other goes on under the full
//! protocol. Most of a search's candidates are several times slower than the best, and
//! each used to cost the full minimum count of runs. The benchmark never races.
//!
//! A tuner may also stop a kernel's timing once its median is known closely enough
//! (`TimingConfig::precision`): after `PRECISION_MIN_SAMPLES` samples, when the 95%
//! confidence interval of the median (distribution-free, from order statistics) lies
//! within that share of it. A layer-sized kernel of 10 µs otherwise takes 2000 samples
//! to fill a 20 ms minimum, whose median is no better known than that of a few hundred.
//! The benchmark never stops early.

use crate::cuda::{Context, CudaError, Function};
use crate::protocol::Timing;
use schedule::LaunchConfig;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// How long and how often to time a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingConfig {
    /// Untimed launches before the first sample.
    pub warmup: u32,
    /// Timed runs continue until their sum reaches this many milliseconds...
    pub min_time_ms: f64,
    /// ...and at least this many were taken.
    pub min_repeats: u32,
    /// Never more than this many (bounds the time spent on very fast kernels).
    pub max_repeats: u32,
    /// The task's best time so far (µs): a candidate clearly slower stops after a short
    /// probe (see the module doc). None: the full protocol for every kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race_us: Option<f64>,
    /// Stop before `min_time_ms` once the median's 95% confidence interval lies within
    /// this share of it (see the module doc). None: the minimum time for every kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            warmup: 3,
            min_time_ms: 100.0,
            min_repeats: 10,
            max_repeats: 10_000,
            race_us: None,
            precision: None,
        }
    }
}

/// Launches enqueued per batch at most (bounded by the driver's launch queue).
const MAX_BATCH: usize = 256;
/// Samples a raced candidate's probe takes, after one warm-up launch.
pub const RACE_PROBE: usize = 3;
/// A raced candidate stops when its fastest sample exceeds the best by this share: the
/// run-to-run spread of one kernel's samples on an H100 is a few percent, so a kernel at
/// least as fast as the best never shows all its probe samples 25% above it.
pub const RACE_MARGIN: f64 = 0.25;
/// Samples a kernel takes at least before its precision may stop its timing: enough
/// launches that a GPU busy with tuning runs them at its working clock, and for the
/// median's interval to be narrower than the samples' range.
pub const PRECISION_MIN_SAMPLES: usize = 50;
/// Longest spin before a batch.
const MAX_SPIN_US: f64 = 20_000.0;

/// The busy-wait kernel, as PTX that the driver compiles for any GPU since Volta.
pub const SPIN_PTX: &str = r#".version 7.0
.target sm_70
.address_size 64
.visible .entry tilesched_spin(.param .u64 cycles)
{
  .reg .pred %p<2>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [cycles];
  mov.u64 %rd2, %clock64;
$L_spin:
  mov.u64 %rd3, %clock64;
  sub.s64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p1, %rd4, %rd1;
  @%p1 bra $L_spin;
  ret;
}
"#;

/// The median of `samples` (the mean of the middle two for an even count).
pub fn median(samples: &[f32]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    median_of_sorted(&sorted(samples))
}

/// `samples` in f64, ascending.
fn sorted(samples: &[f32]) -> Vec<f64> {
    let mut sorted: Vec<f64> = samples.iter().map(|&s| f64::from(s)).collect();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The median of non-empty ascending `sorted`.
fn median_of_sorted(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// True when the samples taken so far satisfy `cfg`.
pub fn enough(cfg: &TimingConfig, samples: &[f32]) -> bool {
    on_time_or_count(cfg, samples)
        || (samples.len() >= cfg.min_repeats as usize
            && cfg.precision.is_some_and(|p| precise(samples, p)))
}

/// True when the samples reach the cap, or both the minimum count and time: when the
/// full protocol, without precision, would stop.
fn on_time_or_count(cfg: &TimingConfig, samples: &[f32]) -> bool {
    let total_ms: f64 = samples.iter().map(|&s| f64::from(s)).sum::<f64>() / 1e3;
    samples.len() >= cfg.max_repeats as usize
        || (samples.len() >= cfg.min_repeats as usize && total_ms >= cfg.min_time_ms)
}

/// True when `samples` are at least `PRECISION_MIN_SAMPLES` and the 95% confidence
/// interval of their median lies within `share` of it. The interval is the order
/// statistics at ranks n/2 ± 0.98 √n (the normal approximation to the binomial: the
/// median lies between them with probability 95% whatever the samples' distribution).
pub fn precise(samples: &[f32], share: f64) -> bool {
    let n = samples.len();
    if n < PRECISION_MIN_SAMPLES {
        return false;
    }
    let sorted = sorted(samples);
    let half = 0.98 * (n as f64).sqrt();
    let low = sorted[((n as f64 / 2.0 - half).floor().max(0.0)) as usize];
    let high = sorted[((n as f64 / 2.0 + half).ceil() as usize).min(n - 1)];
    let median = median_of_sorted(&sorted);
    median > 0.0 && median - low <= share * median && high - median <= share * median
}

/// True when a raced kernel's samples so far show it clearly slower than the best
/// (`cfg.race_us`): its fastest sample, a lower bound of what more samples could give,
/// exceeds the best by over `RACE_MARGIN`.
pub fn lost_race(cfg: &TimingConfig, samples: &[f32]) -> bool {
    let Some(best) = cfg.race_us else {
        return false;
    };
    let fastest = samples
        .iter()
        .map(|&s| f64::from(s))
        .fold(f64::INFINITY, f64::min);
    fastest.is_finite() && fastest > best * (1.0 + RACE_MARGIN)
}

/// How many launches the next batch should time, given the samples so far.
pub fn next_batch(cfg: &TimingConfig, samples: &[f32]) -> usize {
    let taken = samples.len();
    if taken == 0 && cfg.race_us.is_some() {
        return RACE_PROBE.min((cfg.max_repeats as usize).max(1));
    }
    let left = (cfg.max_repeats as usize).saturating_sub(taken);
    let wanted = if taken == 0 {
        cfg.min_repeats.max(1) as usize
    } else {
        let total_us: f64 = samples.iter().map(|&s| f64::from(s)).sum();
        let estimate = median(samples).max(0.5);
        let time_left_us = (cfg.min_time_ms * 1e3 - total_us).max(0.0);
        let for_time = ((time_left_us / estimate).ceil() as usize)
            .max((cfg.min_repeats as usize).saturating_sub(taken));
        match cfg.precision {
            // Grows geometrically, so that precision is checked after few samples
            // first, and seldom.
            Some(_) => for_time.min(PRECISION_MIN_SAMPLES.max(2 * taken) - taken),
            None => for_time,
        }
    };
    wanted.clamp(1, MAX_BATCH).min(left.max(1))
}

/// Microseconds the GPU must spin so that a batch of `batch` launches, each taking the
/// CPU `enqueue_us` to issue, is queued before the first one runs (with a quarter more
/// for jitter). The kernels' own time is deliberately not subtracted: an estimate taken
/// from samples that already contain CPU time (a vendor routine whose host side is slower
/// than its kernels) would shorten the spin and keep the contamination going.
pub fn spin_us(batch: usize, enqueue_us: f64) -> f64 {
    (batch as f64 * enqueue_us.max(0.0) * 1.25 + 20.0).min(MAX_SPIN_US)
}

/// Times `launch` (which enqueues one run of the kernel; its argument counts launches,
/// for buffer rotation) by the protocol above.
pub fn time_kernel(
    ctx: &Context,
    spin: &Function,
    sm_clock_mhz: u32,
    cfg: &TimingConfig,
    mut launch: impl FnMut(usize) -> Result<(), CudaError>,
) -> Result<Timing, CudaError> {
    let mut count = 0usize;
    // A raced kernel's probe follows a single warm-up launch; one that goes on keeps its
    // probe's three samples among the many its median is taken over.
    let warmup = if cfg.race_us.is_some() {
        cfg.warmup.min(1)
    } else {
        cfg.warmup
    };
    for _ in 0..warmup {
        launch(count)?;
        count += 1;
    }
    ctx.synchronize()?;
    let starts: Vec<_> = (0..MAX_BATCH)
        .map(|_| ctx.event())
        .collect::<Result<_, _>>()?;
    let ends: Vec<_> = (0..MAX_BATCH)
        .map(|_| ctx.event())
        .collect::<Result<_, _>>()?;
    let mut samples: Vec<f32> = Vec::new();
    // A generous first guess: the first batch is small, and a slow host side (cuDNN's)
    // must not leak into its samples.
    let mut enqueue_us = 50.0;
    while !enough(cfg, &samples) {
        if lost_race(cfg, &samples) {
            return Ok(Timing::raced(samples));
        }
        let batch = next_batch(cfg, &samples);
        let cycles = (spin_us(batch, enqueue_us) * f64::from(sm_clock_mhz)) as u64;
        let one_thread = LaunchConfig::linear(1, 1, 0);
        ctx.launch(spin, &one_thread, &[], &[cycles])?;
        let issued = Instant::now();
        for j in 0..batch {
            ctx.record(&starts[j])?;
            launch(count)?;
            count += 1;
            ctx.record(&ends[j])?;
        }
        enqueue_us = issued.elapsed().as_secs_f64() * 1e6 / batch as f64;
        ctx.synchronize()?;
        for j in 0..batch {
            let us = f64::from(starts[j].elapsed_ms(&ends[j])?) * 1e3;
            // Two decimals: finer than the events' resolution, and the log stays small.
            samples.push(((us * 100.0).round() / 100.0) as f32);
        }
    }
    let precise = !on_time_or_count(cfg, &samples);
    Ok(Timing {
        precise,
        ..Timing::from_samples(samples)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn repeats_run_until_both_the_time_and_the_count_are_reached() {
        let cfg = TimingConfig::default();
        assert!(!enough(&cfg, &[]));
        // 10 runs of 1 ms: count reached, time not.
        assert!(!enough(&cfg, &[1000.0; 10]));
        // 2 runs of 60 ms: time reached, count not.
        assert!(!enough(&cfg, &[60_000.0; 2]));
        assert!(enough(&cfg, &[10_000.0; 10]));
        // A 5 µs kernel stops at the cap.
        assert!(enough(&cfg, &vec![5.0; 10_000]));
    }

    #[test]
    fn batches_aim_at_the_remaining_time_within_bounds() {
        let cfg = TimingConfig::default();
        assert_eq!(next_batch(&cfg, &[]), 10);
        // 1 ms kernels, 10 ms taken: 90 more.
        assert_eq!(next_batch(&cfg, &[1000.0; 10]), 90);
        // Fast kernels: capped at a batch's size, then at max_repeats.
        assert_eq!(next_batch(&cfg, &[5.0; 10]), MAX_BATCH);
        assert_eq!(next_batch(&cfg, &vec![5.0; 9_990]), 10);
        // Slow kernels still reach the minimum count.
        assert_eq!(next_batch(&cfg, &[50_000.0; 3]), 7);
    }

    #[test]
    fn spin_covers_the_whole_enqueue_of_a_batch() {
        assert_eq!(spin_us(100, 4.0), 520.0);
        // Long kernels do not shorten it: their samples may hold host time.
        assert_eq!(spin_us(10, 40.0), 520.0);
        assert_eq!(spin_us(256, 1e6), MAX_SPIN_US);
    }

    /// Tune's protocol (20 ms at least) with `share` of precision.
    fn precise_to(share: f64) -> TimingConfig {
        TimingConfig {
            min_time_ms: 20.0,
            precision: Some(share),
            ..TimingConfig::default()
        }
    }

    #[test]
    fn precision_stops_a_steady_kernel_early_and_a_noisy_one_at_the_minimum_time() {
        let cfg = precise_to(0.005);
        // 10 µs within ±0.3%: known closely after the minimum count of samples for it.
        let steady: Vec<f32> = (0..PRECISION_MIN_SAMPLES)
            .map(|i| 10.0 + 0.03 * ((i % 7) as f32 - 3.0) / 3.0)
            .collect();
        assert!(!enough(&cfg, &steady[..PRECISION_MIN_SAMPLES - 1]));
        assert!(enough(&cfg, &steady));
        // What the timing then records as stopped for precision.
        assert!(!on_time_or_count(&cfg, &steady));
        assert!(!enough(
            &TimingConfig {
                precision: None,
                ..cfg
            },
            &steady
        ));
        // Alternating 10 and 11 µs: the median's interval spans both, 5% each way; it
        // runs to the minimum time (2000 samples of 10.5 µs).
        let noisy: Vec<f32> = (0..2000)
            .map(|i| if i % 2 == 0 { 10.0 } else { 11.0 })
            .collect();
        assert!(!precise(&noisy, 0.005));
        assert!(precise(&noisy, 0.06));
        assert!(!enough(&cfg, &noisy[..1000]));
        assert!(enough(&cfg, &noisy));
        assert!(on_time_or_count(&cfg, &noisy));
    }

    #[test]
    fn with_precision_batches_grow_geometrically_from_its_minimum() {
        let cfg = precise_to(0.005);
        assert_eq!(next_batch(&cfg, &[]), 10);
        assert_eq!(next_batch(&cfg, &[10.0; 10]), 40);
        assert_eq!(next_batch(&cfg, &[10.0; 50]), 50);
        assert_eq!(next_batch(&cfg, &[10.0; 200]), 200);
        assert_eq!(next_batch(&cfg, &[10.0; 400]), MAX_BATCH);
        // A slower kernel's batch is what the minimum time still needs, if fewer.
        assert_eq!(next_batch(&cfg, &[250.0; 10]), 40);
        assert_eq!(next_batch(&cfg, &[1000.0; 10]), 10);
    }

    proptest::proptest! {
        /// Over synthetic timing streams: when precision stops a kernel, its median lies
        /// within twice the precision of the median of the same kernel's whole stream
        /// (what the minimum time would have given), for any spread up to 20%.
        #[test]
        fn precision_stops_near_the_full_median(
            time in 1.0f64..1000.0,
            spread in 0.001f64..0.2,
            noise in proptest::collection::vec(-1.0f64..1.0, 2000),
        ) {
            let samples: Vec<f32> =
                noise.iter().map(|e| (time * (1.0 + spread * e)) as f32).collect();
            let full = median(&samples);
            let cfg = precise_to(0.01);
            // Checked where the protocol's batches end: 50, 100, 200, ...
            let stop = std::iter::successors(Some(PRECISION_MIN_SAMPLES), |n| Some(2 * n))
                .take_while(|&n| n <= samples.len())
                .find(|&n| precise(&samples[..n], 0.01));
            if let Some(n) = stop {
                proptest::prop_assert!(enough(&cfg, &samples[..n]));
                let early = median(&samples[..n]);
                proptest::prop_assert!((early - full).abs() <= 0.02 * full, "{early} vs {full} at {n}");
            }
        }
    }

    fn racing(best: f64) -> TimingConfig {
        TimingConfig {
            race_us: Some(best),
            ..TimingConfig::default()
        }
    }

    #[test]
    fn a_raced_kernel_is_probed_first_and_stops_only_when_clearly_slower() {
        let cfg = racing(100.0);
        assert_eq!(next_batch(&cfg, &[]), RACE_PROBE);
        assert!(lost_race(&cfg, &[300.0, 290.0, 310.0]));
        // One sample within the margin keeps it in the race.
        assert!(!lost_race(&cfg, &[300.0, 124.0, 310.0]));
        assert!(!lost_race(&cfg, &[]));
        assert!(!lost_race(&TimingConfig::default(), &[1e9]));
        // After the probe, the full protocol's batches: up to the minimum count...
        assert_eq!(next_batch(&cfg, &[50_000.0; 3]), 7);
        // ...and the minimum time.
        assert_eq!(next_batch(&cfg, &[100.0; 3]), MAX_BATCH);
    }

    proptest::proptest! {
        /// Over synthetic timing streams: a kernel whose true time is at most the best,
        /// timed with noise under the margin (any order, any spread within it), is never
        /// dropped by the race, whatever prefix of its samples the race looks at.
        #[test]
        fn racing_never_drops_a_kernel_faster_than_the_best(
            best in 1.0f64..10_000.0,
            share in 0.05f64..=1.0,
            noise in proptest::collection::vec(-0.2f64..0.2, 1..64),
        ) {
            let cfg = racing(best);
            let time = best * share;
            let samples: Vec<f32> = noise.iter().map(|e| (time * (1.0 + e)) as f32).collect();
            for taken in 1..=samples.len() {
                proptest::prop_assert!(!lost_race(&cfg, &samples[..taken]));
            }
        }

        /// And a kernel whose every sample is over the margin above the best is dropped
        /// after its probe.
        #[test]
        fn racing_drops_a_clearly_slower_kernel_after_its_probe(
            best in 1.0f64..10_000.0,
            factor in 1.3f64..50.0,
            noise in proptest::collection::vec(0.0f64..0.2, RACE_PROBE),
        ) {
            let cfg = racing(best);
            let samples: Vec<f32> =
                noise.iter().map(|e| (best * factor * (1.0 + e)) as f32).collect();
            proptest::prop_assert!(lost_race(&cfg, &samples));
        }
    }
}
