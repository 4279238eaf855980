//! The bench report: per task our time, the vendor's, the speedup, TFLOP/s and the
//! fraction of the roofline floor, plus totals and geometric means; written as JSON
//! (everything, for tools) and Markdown (for people). Each row says which comparison it
//! is: the task's element types and layout, and the vendor routine with its library's
//! version, algorithm and math (e.g. `cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM tensor-op fp16
//! NHWC`); the report says which copy of the library ran.
//!
//! Totals weight each task by its count in the network (the time of one forward pass);
//! geometric means are over tasks, unweighted (each distinct shape is one data point),
//! and only over tasks where both sides ran.
//!
//! No silent weak baseline: a row of a tensor-core type (TF32, fp16, bf16) is flagged
//! when its vendor routine does not run on tensor cores, or when the vendor's time is
//! bimodal over our rounds (p90/p10 above [`BIMODAL_RATIO`]) even after the session
//! passed over such routines for runners-up (`run`). Flagged rows stay in the
//! table but out of the headline (totals, geometric mean, slowest), which says how many
//! rows it covers; the flagged rows' own geometric mean is reported beside it.

use crate::peaks::Peaks;
use gpu::DeviceInfo;
use schedule::{DType, Operator, Task};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// One side's timing of a task.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub samples: usize,
}

impl Side {
    /// The summary of timed samples (µs); `None` when there are none.
    pub fn from_samples(samples: &[f32]) -> Option<Side> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted: Vec<f64> = samples.iter().map(|&s| f64::from(s)).collect();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        Some(Side {
            median_us: gpu::timing::median(samples),
            p10_us: at(0.1),
            p90_us: at(0.9),
            samples: samples.len(),
        })
    }

    /// p90/p10: above [`BIMODAL_RATIO`] the times are bimodal.
    pub fn spread(&self) -> f64 {
        if self.p10_us > 0.0 {
            self.p90_us / self.p10_us
        } else {
            1.0
        }
    }

    pub fn is_bimodal(&self) -> bool {
        self.spread() > BIMODAL_RATIO
    }
}

/// What was measured for one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    pub task: String,
    pub count: u32,
    /// The inputs' element type (reports from before types read as f32).
    #[serde(default)]
    pub dtype: DType,
    #[serde(default)]
    pub out_dtype: DType,
    /// `nchw` or `nhwc` for conv2d, `row-major` for matmuls (see [`layout_name`]).
    #[serde(default)]
    pub layout: String,
    pub flops: u64,
    /// Bytes of the inputs and the output, each moved once: the memory floor.
    pub min_bytes: u64,
    /// Our best kernel from the log (its state id) and the log's own time for it.
    pub state_id: Option<String>,
    /// Its sketch: `cuda-core`, `mma.sync` or `wgmma` (absent in reports from before
    /// it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<String>,
    pub tuned_us: Option<f64>,
    /// Records of the task in the log.
    pub trials: usize,
    pub ours: Option<Side>,
    pub vendor: Option<Side>,
    /// The vendor routine that ran: library, version, algorithm or call, math or
    /// compute type, types (and layout), e.g. `cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM
    /// tensor-op fp16 NHWC` or `cuBLAS 13.1.0 cublasGemmEx COMPUTE_32F bf16`.
    pub vendor_algorithm: Option<String>,
    /// Whether the vendor routine runs on tensor cores, as the library says (absent in
    /// reports from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_tensor_cores: Option<bool>,
    /// For a task with a bias or ReLU: whether the vendor's timed call includes them
    /// (a fused graph or cuBLASLt epilogue) or not (a legacy convolution alone: our
    /// speedup is then a lower bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_times_epilogue: Option<bool>,
    /// Vendor alternatives timed by our protocol for this task.
    #[serde(default)]
    pub vendor_timed: usize,
    /// The vendor's alternatives tried for this task (cuDNN: each algorithm its find
    /// returned, with our protocol's time and cuDNN's own), so the choice can be checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vendor_candidates: Vec<String>,
    /// Largest |vendor − exact| over the output (the vendor's rounding; ours is exact).
    pub vendor_max_abs_error: Option<f64>,
    /// Why a side is missing or wrong, when one is.
    pub problem: Option<String>,
}

/// How a row names a task's layout: the conv2d layout, or `row-major` for matmuls.
pub fn layout_name(task: &Task) -> String {
    match task.op {
        Operator::Conv2d(_) => task.layout.name().to_string(),
        _ => "row-major".to_string(),
    }
}

impl Measured {
    /// `fp16`, or `fp16→f32` where the output type differs (TF32 data with a float32
    /// output is stored as float32 throughout: just `tf32`).
    pub fn types(&self) -> String {
        let same = self.out_dtype == self.dtype
            || (self.dtype == DType::Tf32 && self.out_dtype == DType::F32);
        let mut text = if same {
            self.dtype.to_string()
        } else {
            format!("{}→{}", self.dtype, self.out_dtype)
        };
        if !self.layout.is_empty() && self.layout != "row-major" {
            text.push(' ');
            text.push_str(&self.layout.to_uppercase());
        }
        text
    }
}

/// p90/p10 of the vendor's samples above which its time counts as bimodal.
pub const BIMODAL_RATIO: f64 = 1.5;

/// Why a row cannot be trusted for the headline (empty: it can). Rules apply to rows of
/// a tensor-core type: the vendor off tensor cores, or bimodal.
pub fn flags(m: &Measured) -> Vec<String> {
    let mut flags = Vec::new();
    if !matches!(m.dtype, DType::Tf32 | DType::Fp16 | DType::Bf16) {
        return flags;
    }
    if m.vendor_tensor_cores == Some(false) {
        flags.push("vendor not on tensor cores".to_string());
    }
    if let Some(v) = m.vendor
        && v.is_bimodal()
    {
        flags.push(format!("vendor bimodal (p90/p10 {:.2})", v.spread()));
    }
    flags
}

/// A task's row: what was measured and what follows from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    #[serde(flatten)]
    pub measured: Measured,
    pub roofline_us: f64,
    /// vendor µs / our µs (> 1: we are faster).
    pub speedup: Option<f64>,
    pub ours_tflops: Option<f64>,
    pub vendor_tflops: Option<f64>,
    /// roofline µs / our µs (1.0 = at the floor).
    pub ours_roofline_fraction: Option<f64>,
    pub vendor_roofline_fraction: Option<f64>,
    /// Why the row is kept out of the headline (see [`flags`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

impl Row {
    pub fn new(measured: Measured, peaks: &Peaks) -> Row {
        let roofline_us = peaks.floor_us_for(measured.dtype, measured.flops, measured.min_bytes);
        let tflops = |s: &Side| measured.flops as f64 / (s.median_us * 1e6);
        let ours = measured.ours;
        let vendor = measured.vendor;
        Row {
            roofline_us,
            speedup: ours.zip(vendor).map(|(o, v)| v.median_us / o.median_us),
            ours_tflops: ours.as_ref().map(tflops),
            vendor_tflops: vendor.as_ref().map(tflops),
            ours_roofline_fraction: ours.map(|o| roofline_us / o.median_us),
            vendor_roofline_fraction: vendor.map(|v| roofline_us / v.median_us),
            flags: flags(&measured),
            measured,
        }
    }
}

/// Totals and means over the rows: the headline covers the compared rows that are not
/// flagged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub tasks: usize,
    /// Tasks where both sides ran (the rest have a `problem`).
    pub compared: usize,
    /// Compared tasks flagged (see [`flags`]), kept out of everything below but
    /// `flagged_geomean_speedup`.
    #[serde(default)]
    pub flagged: usize,
    /// The flagged tasks' own geometric mean speedup.
    #[serde(default)]
    pub flagged_geomean_speedup: Option<f64>,
    /// Count-weighted sums over the compared, unflagged tasks.
    pub ours_total_us: f64,
    pub vendor_total_us: f64,
    pub roofline_total_us: f64,
    pub total_speedup: Option<f64>,
    pub geomean_speedup: Option<f64>,
    pub min_speedup: Option<f64>,
    pub min_speedup_task: Option<String>,
    /// Compared tasks where the vendor is faster.
    pub slower_than_vendor: usize,
    pub geomean_ours_roofline_fraction: Option<f64>,
    pub geomean_vendor_roofline_fraction: Option<f64>,
}

/// The geometric mean of positive values; `None` for none.
pub fn geomean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values
        .into_iter()
        .fold((0.0, 0usize), |(s, n), v| (s + v.ln(), n + 1));
    (n > 0).then(|| (sum / n as f64).exp())
}

impl Summary {
    pub fn of(rows: &[Row]) -> Summary {
        let (flagged, compared): (Vec<&Row>, Vec<&Row>) = rows
            .iter()
            .filter(|r| r.speedup.is_some())
            .partition(|r| !r.flags.is_empty());
        let weighted = |f: &dyn Fn(&Row) -> f64| {
            compared
                .iter()
                .map(|r| f64::from(r.measured.count) * f(r))
                .sum::<f64>()
        };
        let ours_total_us = weighted(&|r| r.measured.ours.map_or(0.0, |s| s.median_us));
        let vendor_total_us = weighted(&|r| r.measured.vendor.map_or(0.0, |s| s.median_us));
        let min = compared
            .iter()
            .min_by(|a, b| a.speedup.unwrap().total_cmp(&b.speedup.unwrap()));
        Summary {
            tasks: rows.len(),
            compared: compared.len() + flagged.len(),
            flagged: flagged.len(),
            flagged_geomean_speedup: geomean(flagged.iter().filter_map(|r| r.speedup)),
            ours_total_us,
            vendor_total_us,
            roofline_total_us: weighted(&|r| r.roofline_us),
            total_speedup: (!compared.is_empty()).then(|| vendor_total_us / ours_total_us),
            geomean_speedup: geomean(compared.iter().filter_map(|r| r.speedup)),
            min_speedup: min.and_then(|r| r.speedup),
            min_speedup_task: min.map(|r| r.measured.task.clone()),
            slower_than_vendor: compared
                .iter()
                .filter(|r| r.speedup.is_some_and(|s| s < 1.0))
                .count(),
            geomean_ours_roofline_fraction: geomean(
                compared.iter().filter_map(|r| r.ours_roofline_fraction),
            ),
            geomean_vendor_roofline_fraction: geomean(
                compared.iter().filter_map(|r| r.vendor_roofline_fraction),
            ),
        }
    }
}

/// How the two sides were timed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Protocol {
    /// Alternating rounds per task (ours, vendor, vendor, ours, ...).
    pub rounds: u32,
    /// Timed milliseconds per side and round (at least `min_repeats` launches).
    pub min_time_ms_per_round: f64,
    pub min_repeats_per_round: u32,
    /// Buffer copies rotated between launches so that L2 starts cold, as in tuning.
    pub l2_rotation: bool,
}

/// The copy of the vendor library a report's baselines ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VendorLibrary {
    /// `cuDNN` or `cuBLAS`.
    pub name: String,
    /// As the loaded library states it, e.g. `9.19.0`.
    pub version: String,
    /// The directory it was loaded from.
    pub dir: String,
    /// `newest found`, or the option that named the directory.
    pub chosen_by: String,
    /// The other copies found on the machine (`9.14.0 at /usr/lib/...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub others: Vec<String>,
}

/// Everything one `bench` run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub tool_version: String,
    /// RFC 3339, UTC.
    pub date: String,
    pub command: String,
    pub device: DeviceInfo,
    /// e.g. `cuDNN 9.19.0 (FMA math, fastest of 6 algorithms per shape)`.
    pub vendor: String,
    /// Which copy of the library ran (absent in reports from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_library: Option<VendorLibrary>,
    pub log: String,
    pub peaks: Peaks,
    pub protocol: Protocol,
    pub rows: Vec<Row>,
    pub summary: Summary,
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{:.1}%", v * 100.0))
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The Markdown table with a header that says what, where and how.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let d = &self.device;
        let s = &self.summary;
        let _ = writeln!(md, "# `tilesched bench`: {}\n", self.command);
        let _ = writeln!(
            md,
            "{} (sm_{}{}, {} SMs, driver {} / CUDA {}), {}; tilesched {}; baseline {}; log `{}`.\n",
            d.name,
            d.compute_capability.0,
            d.compute_capability.1,
            d.sm_count,
            d.kernel_driver.as_deref().unwrap_or("?"),
            d.cuda_driver,
            self.date,
            self.tool_version,
            self.vendor,
            self.log
        );
        if let Some(l) = &self.vendor_library {
            let _ = writeln!(
                md,
                "{} {} loaded from `{}` ({}){}.\n",
                l.name,
                l.version,
                l.dir,
                l.chosen_by,
                if l.others.is_empty() {
                    String::new()
                } else {
                    format!("; also found: {}", l.others.join(", "))
                }
            );
        }
        let p = &self.protocol;
        let (compute, kernels) = match self.peaks.fastest_tensor() {
            Some(t) => (
                format!(
                    "FLOPs / {:.1} TFLOP/s for {} tasks (`{}` chains; {:.1} TFLOP/s float32 FMA otherwise)",
                    t.tflops, t.dtype, t.instruction, self.peaks.fp32_tflops
                ),
                if self.peaks.wgmma.is_some() {
                    "FMA chains; mma.sync chains; wgmma chains; float4 copy"
                } else {
                    "FMA chains; mma.sync chains; float4 copy"
                },
            ),
            None => (
                format!("FLOPs / {:.1} TFLOP/s", self.peaks.fp32_tflops),
                "FMA chains; float4 copy",
            ),
        };
        let _ = writeln!(
            md,
            "Both sides in one process on the same inputs, alternating {} rounds per task of ≥ {} ms and ≥ {} launches each (CUDA events per launch{}), median of all samples. Roofline floor per task = max({compute}, bytes / {:.0} GB/s), all peaks measured in this run ({kernels}).\n",
            p.rounds,
            p.min_time_ms_per_round,
            p.min_repeats_per_round,
            if p.l2_rotation {
                ", buffers rotated so L2 starts cold"
            } else {
                ""
            },
            self.peaks.bandwidth_gbs
        );
        if self
            .rows
            .iter()
            .any(|r| r.measured.vendor_times_epilogue.is_some())
        {
            let _ = writeln!(
                md,
                "Tasks with a fused epilogue (`_bias`, `_relu`): our time includes it, and so does the vendor's where its routine fuses it (a cuDNN graph with pointwise operations, a cuBLASLt epilogue). Rows noted `epilogue untimed` time the vendor's convolution alone (its bias add and ReLU run for the correctness check only): their speedups are lower bounds.\n"
            );
        }
        let _ = writeln!(
            md,
            "Flagged rows (notes) are kept out of the headline: a TF32, fp16 or bf16 row whose vendor routine does not run on tensor cores, or whose vendor time is bimodal over the rounds (p90/p10 > {BIMODAL_RATIO}).\n"
        );
        let _ = writeln!(
            md,
            "| task | types | × | ours µs | vendor µs | speedup | ours TFLOP/s | vendor TFLOP/s | roofline µs | ours % roofline | vendor % roofline | our sketch | vendor routine | trials | notes |"
        );
        let _ = writeln!(
            md,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|"
        );
        for r in &self.rows {
            let m = &r.measured;
            let mut notes = r.flags.clone();
            if m.vendor_times_epilogue == Some(false) {
                notes.push("epilogue untimed".to_string());
            }
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} |",
                m.task,
                m.types(),
                m.count,
                opt(m.ours.map(|s| s.median_us), 2),
                opt(m.vendor.map(|s| s.median_us), 2),
                r.speedup
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
                opt(r.ours_tflops, 2),
                opt(r.vendor_tflops, 2),
                r.roofline_us,
                pct(r.ours_roofline_fraction),
                pct(r.vendor_roofline_fraction),
                m.sketch.as_deref().unwrap_or("-"),
                m.vendor_algorithm.as_deref().unwrap_or("-"),
                m.trials,
                notes.join("; ")
            );
        }
        let headline = s.compared - s.flagged;
        let _ = writeln!(
            md,
            "| **total** (count-weighted, {headline} of {} tasks{}) | | | **{:.2}** | **{:.2}** | **{}** | | | {:.2} | | | | | | |",
            s.tasks,
            if s.flagged > 0 {
                format!("; {} flagged left out", s.flagged)
            } else {
                String::new()
            },
            s.ours_total_us,
            s.vendor_total_us,
            s.total_speedup
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
            s.roofline_total_us
        );
        let _ = writeln!(
            md,
            "\nGeometric mean speedup {} over {headline} tasks; slowest {} ({}); {} task(s) slower than the vendor. Geometric mean fraction of the roofline: ours {}, vendor {}.",
            s.geomean_speedup
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
            s.min_speedup
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
            s.min_speedup_task.as_deref().unwrap_or("-"),
            s.slower_than_vendor,
            pct(s.geomean_ours_roofline_fraction),
            pct(s.geomean_vendor_roofline_fraction)
        );
        if s.flagged > 0 {
            let _ = writeln!(
                md,
                "\nFlagged, left out of the above: {} task(s), geometric mean speedup {} ({}).",
                s.flagged,
                s.flagged_geomean_speedup
                    .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
                self.rows
                    .iter()
                    .filter(|r| r.speedup.is_some() && !r.flags.is_empty())
                    .map(|r| r.measured.task.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if self
            .rows
            .iter()
            .any(|r| !r.measured.vendor_candidates.is_empty())
        {
            let _ = writeln!(
                md,
                "\nVendor alternatives (our protocol; the fastest is used):\n"
            );
            for r in self
                .rows
                .iter()
                .filter(|r| !r.measured.vendor_candidates.is_empty())
            {
                let _ = writeln!(
                    md,
                    "- {} ({} timed): {}",
                    r.measured.task,
                    r.measured.vendor_timed,
                    r.measured.vendor_candidates.join("; ")
                );
            }
        }
        let problems: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.measured.problem.is_some())
            .collect();
        if !problems.is_empty() {
            let _ = writeln!(md, "\nProblems:\n");
            for r in problems {
                let _ = writeln!(
                    md,
                    "- {}: {}",
                    r.measured.task,
                    r.measured.problem.as_deref().unwrap_or("")
                );
            }
        }
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peaks::TensorPeak;

    fn side(us: f64) -> Side {
        Side {
            median_us: us,
            p10_us: us,
            p90_us: us,
            samples: 10,
        }
    }

    fn measured(task: &str, count: u32, ours: Option<f64>, vendor: Option<f64>) -> Measured {
        Measured {
            task: task.to_string(),
            count,
            dtype: DType::Fp16,
            out_dtype: DType::Fp16,
            layout: "nhwc".to_string(),
            flops: 200_000_000,
            min_bytes: 4_000_000,
            state_id: ours.map(|_| "00000000deadbeef".to_string()),
            sketch: ours.map(|_| "mma.sync".to_string()),
            tuned_us: ours,
            trials: 64,
            ours: ours.map(side),
            vendor: vendor.map(side),
            vendor_algorithm: vendor
                .map(|_| "cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM tensor-op fp16 NHWC".to_string()),
            vendor_tensor_cores: vendor.map(|_| true),
            vendor_times_epilogue: None,
            vendor_timed: 1,
            vendor_candidates: vec![
                "handle 1: IMPLICIT_PRECOMP_GEMM tensor-op 20.00 µs (cuDNN's find: 18.00 µs)"
                    .into(),
            ],
            vendor_max_abs_error: vendor.map(|_| 0.0),
            problem: ours
                .is_none()
                .then(|| "no correct kernel in the log".to_string()),
        }
    }

    /// The fp16 peak is the float32 one, so that the numbers below read simply.
    fn peaks() -> Peaks {
        Peaks {
            fp32_tflops: 25.0,
            bandwidth_gbs: 2000.0,
            tensor: Some(TensorPeak {
                dtype: DType::Fp16,
                instruction: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32".into(),
                tflops: 50.0,
            }),
            wgmma: None,
        }
    }

    fn report() -> Report {
        let rows: Vec<Row> = vec![
            measured("conv_a", 1, Some(10.0), Some(20.0)),
            measured("conv_b", 2, Some(8.0), Some(4.0)),
            measured("conv_c", 1, None, Some(5.0)),
        ]
        .into_iter()
        .map(|m| Row::new(m, &peaks()))
        .collect();
        Report {
            tool_version: "0.1.0".into(),
            date: "2026-11-22T00:00:00Z".into(),
            command: "tilesched bench conv2d --network demo --log demo.jsonl".into(),
            device: gpu::worker::Simulated::device(0),
            vendor: "cuDNN 9.19.0".into(),
            vendor_library: Some(VendorLibrary {
                name: "cuDNN".into(),
                version: "9.19.0".into(),
                dir: "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib".into(),
                chosen_by: "newest found".into(),
                others: vec!["9.14.0 at /usr/lib/x86_64-linux-gnu".into()],
            }),
            log: "demo.jsonl".into(),
            peaks: peaks(),
            protocol: Protocol {
                rounds: 4,
                min_time_ms_per_round: 25.0,
                min_repeats_per_round: 10,
                l2_rotation: true,
            },
            summary: Summary::of(&rows),
            rows,
        }
    }

    #[test]
    fn rows_derive_speedup_throughput_and_roofline() {
        let r = &report().rows[0];
        // 200 MFLOP: 4 µs at 50 TFLOP/s; 4 MB: 2 µs at 2000 GB/s → floor 4 µs.
        assert!((r.roofline_us - 4.0).abs() < 1e-12);
        assert_eq!(r.speedup, Some(2.0));
        assert!((r.ours_tflops.unwrap() - 20.0).abs() < 1e-12);
        assert!((r.vendor_tflops.unwrap() - 10.0).abs() < 1e-12);
        assert!((r.ours_roofline_fraction.unwrap() - 0.4).abs() < 1e-12);
        assert!((r.vendor_roofline_fraction.unwrap() - 0.2).abs() < 1e-12);
    }

    #[test]
    fn summary_weights_totals_and_skips_incomplete_tasks() {
        let s = report().summary;
        assert_eq!((s.tasks, s.compared), (3, 2));
        // conv_a once, conv_b twice; conv_c has no kernel of ours.
        assert!((s.ours_total_us - 26.0).abs() < 1e-12);
        assert!((s.vendor_total_us - 28.0).abs() < 1e-12);
        assert!((s.total_speedup.unwrap() - 28.0 / 26.0).abs() < 1e-12);
        // sqrt(2.0 * 0.5) = 1.
        assert!((s.geomean_speedup.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(s.min_speedup, Some(0.5));
        assert_eq!(s.min_speedup_task.as_deref(), Some("conv_b"));
        assert_eq!(s.slower_than_vendor, 1);
        assert!((s.roofline_total_us - 12.0).abs() < 1e-12);
    }

    #[test]
    fn weak_or_bimodal_vendors_are_flagged_and_left_out_of_the_headline() {
        let mut weak = measured("conv_weak", 1, Some(10.0), Some(100.0));
        weak.vendor_tensor_cores = Some(false);
        let mut bimodal = measured("conv_bimodal", 1, Some(10.0), Some(30.0));
        bimodal.vendor = Some(Side {
            median_us: 30.0,
            p10_us: 10.0,
            p90_us: 40.0,
            samples: 10,
        });
        let mut edge = measured("conv_edge", 1, Some(10.0), Some(20.0));
        edge.vendor = Some(Side {
            median_us: 20.0,
            p10_us: 20.0,
            p90_us: 30.0,
            samples: 10,
        });
        // A float32 row has no tensor-core routine to miss.
        let mut f32_row = measured("conv_f32", 1, Some(10.0), Some(5.0));
        (f32_row.dtype, f32_row.out_dtype) = (DType::F32, DType::F32);
        f32_row.vendor_tensor_cores = Some(false);
        let rows: Vec<Row> = [weak, bimodal, edge, f32_row]
            .into_iter()
            .map(|m| Row::new(m, &peaks()))
            .collect();
        assert_eq!(rows[0].flags, ["vendor not on tensor cores"]);
        assert_eq!(rows[1].flags, ["vendor bimodal (p90/p10 4.00)"]);
        assert!(rows[2].flags.is_empty(), "p90/p10 = 1.5 is not bimodal");
        assert!(rows[3].flags.is_empty());
        let s = Summary::of(&rows);
        assert_eq!((s.compared, s.flagged), (4, 2));
        // The headline: 2x and 0.5x.
        assert!((s.geomean_speedup.unwrap() - 1.0).abs() < 1e-12);
        assert!((s.total_speedup.unwrap() - 25.0 / 20.0).abs() < 1e-12);
        assert_eq!(s.min_speedup_task.as_deref(), Some("conv_f32"));
        assert!((s.flagged_geomean_speedup.unwrap() - 30f64.sqrt()).abs() < 1e-9);
        let report = Report {
            summary: s,
            rows,
            ..report()
        };
        let md = report.to_markdown();
        assert!(md.contains("2 of 4 tasks; 2 flagged left out"), "{md}");
        assert!(
            md.contains("Flagged, left out of the above: 2 task(s), geometric mean speedup 5.48x (conv_weak, conv_bimodal)."),
            "{md}"
        );
    }

    #[test]
    fn geomean_of_nothing_is_none() {
        assert_eq!(geomean([]), None);
        assert!((geomean([1.0, 4.0, 16.0]).unwrap() - 4.0).abs() < 1e-12);
    }

    #[test]
    fn side_quantiles() {
        let s = Side::from_samples(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(
            (s.median_us, s.p10_us, s.p90_us, s.samples),
            (3.0, 1.0, 5.0, 5)
        );
        assert_eq!(Side::from_samples(&[]), None);
    }

    #[test]
    fn markdown_and_json_formats() {
        let report = report();
        insta::assert_snapshot!(report.to_markdown());
        let back: Report = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(back, report);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["rows"][0]["speedup"], 2.0);
        assert_eq!(json["rows"][0]["task"], "conv_a");
        assert_eq!(json["rows"][0]["dtype"], "fp16");
        assert_eq!(json["rows"][0]["layout"], "nhwc");
        assert_eq!(
            json["rows"][0]["vendor_algorithm"],
            "cuDNN 9.19.0 IMPLICIT_PRECOMP_GEMM tensor-op fp16 NHWC"
        );
        assert_eq!(json["vendor_library"]["version"], "9.19.0");
        assert_eq!(json["peaks"]["tensor"]["dtype"], "fp16");
        assert_eq!(json["summary"]["compared"], 2);
    }

    #[test]
    fn reports_from_before_types_read_as_f32() {
        let mut json: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        for row in json["rows"].as_array_mut().unwrap() {
            let row = row.as_object_mut().unwrap();
            for key in ["dtype", "out_dtype", "layout"] {
                row.remove(key);
            }
        }
        json.as_object_mut().unwrap().remove("vendor_library");
        json["peaks"].as_object_mut().unwrap().remove("tensor");
        let old: Report = serde_json::from_value(json).unwrap();
        assert_eq!(old.rows[0].measured.dtype, DType::F32);
        assert_eq!(old.rows[0].measured.types(), "f32");
        assert_eq!(old.vendor_library, None);
    }

    #[test]
    fn types_and_layout_names() {
        let mut m = measured("x", 1, None, None);
        assert_eq!(m.types(), "fp16 NHWC");
        m.out_dtype = DType::F32;
        assert_eq!(m.types(), "fp16→f32 NHWC");
        (m.dtype, m.layout) = (DType::Tf32, "row-major".into());
        assert_eq!(m.types(), "tf32");
        let task = Task {
            op: Operator::Matmul { m: 1, n: 2, k: 3 },
            epilogue: Default::default(),
            dtype: DType::Bf16,
            out_dtype: DType::Bf16,
            layout: schedule::Layout::Nhwc,
        };
        assert_eq!(layout_name(&task), "row-major");
    }
}
