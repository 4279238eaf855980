//! A cost model of SASS edits: predicts a candidate's gain over the stage-1 kernel
//! before it is measured, so that the guided agents spend measurements on the edits
//! most likely to pay (CuAsmRL names measuring every step as its main cost).
//!
//! Features describe what the candidate changed in the hot loop relative to stage 1:
//! stall cycles per iteration, stall edits, yields, reuse flags gained and lost, moved
//! instructions, load-latency cover and the distance of memory instructions from the
//! arithmetic before them (LDSM/HMMA interleave). The label is `ln(stage-1 µs /
//! candidate µs)`. The model is ridge regression (closed form, refit after every
//! measurement): with the tens of rows a kernel's stage provides, a linear model is
//! what the data can support. Rows persist as JSON (`sass-model.json` beside the deploy
//! cache or in the output directory), so a later run starts trained.

use crate::agents::candidates::{Candidate, Generator};
use crate::agents::estimate::cover;
use crate::agents::objective::Evaluation;
use crate::legality::analysis::Kernel;
use crate::legality::order::Order;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Feature names, in vector order.
pub const FEATURES: [&str; 12] = [
    "hot_stall_delta",
    "stall_down",
    "stall_up",
    "yield_math",
    "yield_other",
    "unyield",
    "reuse_lost",
    "reuse_gained",
    "moved",
    "cover_delta",
    "interleave_delta",
    "outside_hot",
];

/// Rows before the model's predictions are used (fewer: it ranks by nothing).
pub const MIN_ROWS: usize = 6;
/// Ridge penalty.
const LAMBDA: f64 = 1e-3;

/// One measured candidate.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub features: Vec<f64>,
    pub gain: f64,
}

/// The model: its rows and the weights fitted to them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EditModel {
    pub rows: Vec<Row>,
    #[serde(skip)]
    weights: Option<Vec<f64>>,
}

fn is_math(base: &str) -> bool {
    matches!(
        base,
        "HMMA" | "IMMA" | "FFMA" | "HFMA2" | "FMUL" | "FADD" | "IMAD"
    )
}

/// Features of `order` relative to the stage-1 kernel.
pub fn features(kernel: &Kernel, order: &Order) -> Vec<f64> {
    let identity = Order::identity(kernel.len());
    let hot = kernel.blocks[kernel.hot_block()].clone();
    let size = hot.len().max(1) as f64;
    let stall_sum =
        |o: &Order| -> f64 { hot.clone().map(|p| kernel.stall(o, o.at(p)) as f64).sum() };
    let base_stalls = stall_sum(&identity).max(1.0);
    let (mut down, mut up, mut y_math, mut y_other, mut unyield, mut outside) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (i, c) in order.edits() {
        let original = kernel.instructions[i].control;
        if !hot.contains(&order.position(i)) {
            outside += 1.0;
        }
        if c.stall < original.stall {
            down += 1.0;
        }
        if c.stall > original.stall {
            up += 1.0;
        }
        if c.yield_bit != original.yield_bit {
            if kernel.rules.yields(&c) {
                if is_math(&kernel.instructions[i].base) {
                    y_math += 1.0;
                } else {
                    y_other += 1.0;
                }
            } else {
                unyield += 1.0;
            }
        }
    }
    let reuse_bits = |o: &Order| -> (u32, Vec<u8>) {
        let bits: Vec<u8> = hot
            .clone()
            .map(|p| kernel.effective_control(o, p).reuse)
            .collect();
        (bits.iter().map(|b| b.count_ones()).sum(), bits)
    };
    let (before, _) = reuse_bits(&identity);
    let (after, _) = reuse_bits(order);
    let lost = before.saturating_sub(after) as f64 / f64::from(before.max(1));
    let gained = after.saturating_sub(before) as f64 / size;
    let moved = hot.clone().filter(|&p| order.at(p) != p).count() as f64 / size;
    let cover_sum = |o: &Order| -> f64 { hot.clone().map(|p| cover(kernel, o, p) as f64).sum() };
    let cover_delta = (cover_sum(order) - cover_sum(&identity)) / cover_sum(&identity).max(1.0);
    let interleave_delta = (interleave(kernel, order) - interleave(kernel, &identity)) / 10.0;
    vec![
        (stall_sum(order) - base_stalls) / base_stalls,
        down / size,
        up / size,
        y_math / size,
        y_other / size,
        unyield / size,
        lost,
        gained,
        moved,
        cover_delta,
        interleave_delta,
        outside / 10.0,
    ]
}

/// Mean stall cycles from each memory instruction of the hot block back to the
/// nearest arithmetic instruction issued before it (how far loads sit from the MMAs).
fn interleave(kernel: &Kernel, order: &Order) -> f64 {
    let hot = kernel.blocks[kernel.hot_block()].clone();
    let (mut sum, mut n) = (0.0, 0.0);
    for p in hot.clone() {
        if !kernel.instructions[order.at(p)].movable() {
            continue;
        }
        let mut cycles = 0;
        for q in (hot.start..p).rev() {
            let i = order.at(q);
            cycles += kernel.stall(order, i);
            if is_math(&kernel.instructions[i].base) {
                sum += f64::from(cycles);
                n += 1.0;
                break;
            }
        }
    }
    if n > 0.0 { sum / n } else { 0.0 }
}

impl EditModel {
    /// Rows saved by an earlier run (none when the file does not exist; rows of another
    /// feature width are dropped).
    pub fn load(path: &Path) -> EditModel {
        let mut model: EditModel = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        model
            .rows
            .retain(|r| r.features.len() == FEATURES.len() && r.gain.is_finite());
        model.fit();
        model
    }

    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, serde_json::to_string(self).expect("rows serialize"))
    }

    /// Adds a measured candidate and refits.
    pub fn observe(&mut self, features: Vec<f64>, gain: f64) {
        if gain.is_finite() {
            self.rows.push(Row { features, gain });
            self.fit();
        }
    }

    pub fn trained(&self) -> bool {
        self.weights.is_some()
    }

    /// Predicted gain (`ln` of the speedup over stage 1); 0 while untrained.
    pub fn predict(&self, features: &[f64]) -> f64 {
        match &self.weights {
            Some(w) => w[0] + w[1..].iter().zip(features).map(|(a, b)| a * b).sum::<f64>(),
            None => 0.0,
        }
    }

    /// Ridge regression with an unpenalised intercept, by Gaussian elimination.
    fn fit(&mut self) {
        if self.rows.len() < MIN_ROWS {
            self.weights = None;
            return;
        }
        let d = FEATURES.len() + 1;
        let mut a = vec![vec![0.0; d + 1]; d];
        for r in &self.rows {
            let x: Vec<f64> = std::iter::once(1.0)
                .chain(r.features.iter().copied())
                .collect();
            for i in 0..d {
                for j in 0..d {
                    a[i][j] += x[i] * x[j];
                }
                a[i][d] += x[i] * r.gain;
            }
        }
        for (i, row) in a.iter_mut().enumerate().skip(1) {
            row[i] += LAMBDA * self.rows.len() as f64;
        }
        for col in 0..d {
            let pivot = (col..d)
                .max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))
                .unwrap_or(col);
            a.swap(col, pivot);
            if a[col][col].abs() < 1e-12 {
                self.weights = None;
                return;
            }
            let pivot_row = a[col].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / pivot_row[col];
                    for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                        *x -= f * p;
                    }
                }
            }
        }
        self.weights = Some((0..d).map(|i| a[i][d] / a[i][i]).collect());
    }
}

/// How an agent uses the model: every agent teaches it; a guided one also ranks its
/// candidates by it and skips those it predicts to lose.
pub struct Guide<'m> {
    pub model: &'m mut EditModel,
    pub guided: bool,
    /// The stage-1 time the gains are relative to.
    pub baseline_us: f64,
    /// Candidates not measured because the model predicted a loss.
    pub skipped: usize,
}

/// A guided agent skips a candidate predicted this much (in `ln` of the speedup)
/// worse than the current one.
pub const SKIP_BELOW: f64 = 0.003;

impl<'m> Guide<'m> {
    pub fn new(model: &'m mut EditModel, guided: bool, baseline_us: f64) -> Guide<'m> {
        Guide {
            model,
            guided,
            baseline_us,
            skipped: 0,
        }
    }

    /// Learns from a measurement of `order`.
    pub fn observe(&mut self, kernel: &Kernel, order: &Order, evaluation: &Evaluation) {
        if let Evaluation::Time(t) = evaluation
            && *t > 0.0
        {
            self.model
                .observe(features(kernel, order), (self.baseline_us / t).ln());
        }
    }

    /// Predicted gain of `order` over stage 1.
    pub fn predict(&self, kernel: &Kernel, order: &Order) -> f64 {
        self.model.predict(&features(kernel, order))
    }

    /// Whether the guidance is in force (guided and trained).
    pub fn active(&self) -> bool {
        self.guided && self.model.trained()
    }

    /// Orders candidates for measurement: by predicted gain when active; otherwise
    /// slides and control patterns alternate, each in their generator's order.
    pub fn rank(&self, kernel: &Kernel, candidates: Vec<Candidate>) -> Vec<(Candidate, f64)> {
        if self.active() {
            let mut scored: Vec<(Candidate, f64)> = candidates
                .into_iter()
                .map(|c| {
                    let p = self.predict(kernel, &c.order);
                    (c, p)
                })
                .collect();
            scored.sort_by(|a, b| b.1.total_cmp(&a.1));
            return scored;
        }
        let (slides, patterns): (Vec<Candidate>, Vec<Candidate>) = candidates
            .into_iter()
            .partition(|c| c.generator == Generator::Slide);
        let mut out = Vec::new();
        let (mut s, mut p) = (slides.into_iter(), patterns.into_iter());
        loop {
            let (a, b) = (p.next(), s.next());
            if a.is_none() && b.is_none() {
                break;
            }
            out.extend(a.into_iter().chain(b).map(|c| (c, 0.0)));
        }
        out
    }

    /// Whether an active guide skips a candidate predicted at `predicted` while the
    /// current candidate is predicted at `current` (and counts it).
    pub fn skip(&mut self, predicted: f64, current: f64) -> bool {
        let skip = self.active() && predicted < current - SKIP_BELOW;
        self.skipped += usize::from(skip);
        skip
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::legality::moves::{Action, Kind};
    use crate::legality::testkit::kernel_of;

    #[test]
    fn learns_a_linear_effect_and_round_trips() {
        // Synthetic rows: gain = 0.05 · stall delta − 0.02 · yields on math.
        let mut m = EditModel::default();
        for k in 0..20 {
            let mut f = vec![0.0; FEATURES.len()];
            f[0] = (k % 5) as f64 * -0.1;
            f[3] = (k % 3) as f64 * 0.2;
            let gain = -0.05 * f[0] - 0.02 * f[3];
            m.observe(f, gain);
        }
        assert!(m.trained());
        let mut f = vec![0.0; FEATURES.len()];
        f[0] = -0.3;
        assert!((m.predict(&f) - 0.015).abs() < 2e-3, "{}", m.predict(&f));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        m.save(&path).unwrap();
        let back = EditModel::load(&path);
        assert_eq!(back.rows.len(), m.rows.len());
        assert!((back.predict(&f) - m.predict(&f)).abs() < 1e-12);
        assert!(!EditModel::load(&dir.path().join("missing.json")).trained());
    }

    #[test]
    fn features_see_the_edits() {
        let k = kernel_of(&[
            ("FFMA R20, R21, R22, R20", 4, 0b0011),
            ("FFMA R24, R21, R22, R24", 4, 0b0011),
            ("FFMA R26, R21, R22, R26", 4, 0),
            ("EXIT", 5, 0),
        ]);
        let mut order = Order::identity(k.len());
        assert!(features(&k, &order).iter().all(|&f| f == 0.0));
        let stall_up = Action {
            row: 2,
            kind: Kind::StallUp,
        };
        k.apply(&mut order, stall_up);
        let yield_first = Action {
            row: 0,
            kind: Kind::Yield,
        };
        k.apply(&mut order, yield_first);
        let f = features(&k, &order);
        let at = |name: &str| f[FEATURES.iter().position(|&n| n == name).unwrap()];
        assert!(at("hot_stall_delta") > 0.0);
        assert!(at("stall_up") > 0.0 && at("yield_math") > 0.0);
        assert!(at("reuse_lost") > 0.0, "the yielding FFMA lost its flags");
    }

    /// Greedy climbs on a synthetic kernel and objective (`testkit::Formula`: yielding
    /// FFMAs pay, added stalls cost): with the rows of an earlier unguided run, the
    /// guided climb reaches the same time in at most half the measurements.
    #[test]
    fn an_earlier_runs_rows_halve_the_measurements_to_the_same_gain() {
        use crate::agents::greedy::climb;
        use crate::agents::objective::{Objective, Tracker};
        use crate::legality::testkit::Formula;
        let mut code = vec![("LDS R4, [R2]", 2, 0)];
        for r in 0..24 {
            code.push(("FFMA R20, R21, R22, R20", 4, 0));
            code.push(if r % 3 == 0 {
                ("IMAD R30, R31, R32, R30", 2, 0)
            } else {
                ("FADD R40, R41, R42", 3, 0)
            });
        }
        code.push(("EXIT", 5, 0));
        let k = kernel_of(&code);
        let run = |model: &mut EditModel, guided: bool| -> (f64, usize, usize) {
            let mut formula = Formula::new(60);
            let mut tracker = Tracker::start(&mut formula, &k).unwrap();
            let start = tracker.baseline_us;
            let mut guide = Guide::new(model, guided, start);
            climb(&k, &mut tracker, start, &mut guide, 3).unwrap();
            let best = tracker.best_us;
            let to_best = tracker
                .curve
                .iter()
                .position(|&t| t <= best * 1.005)
                .unwrap();
            (best, to_best, tracker.used())
        };
        let mut model = EditModel::default();
        let (unguided_us, unguided_to_best, _) = run(&mut model, false);
        assert!(unguided_us < 100.0 * 0.9, "{unguided_us}");
        assert!(model.trained(), "the unguided run taught the model");
        assert!(
            unguided_to_best >= 4,
            "{unguided_to_best}: too easy to show anything"
        );
        let (guided_us, guided_to_best, _) = run(&mut model, true);
        assert!(
            guided_us <= unguided_us * 1.005,
            "{guided_us} vs {unguided_us}"
        );
        assert!(
            2 * guided_to_best <= unguided_to_best,
            "guided {guided_to_best} vs unguided {unguided_to_best} measurements"
        );
    }
}
